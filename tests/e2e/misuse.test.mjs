// Calls made the wrong way get the typed errors (or the teardown) the docs
// promise, in every entry point ("agentstore", "agentstore/store" and the io
// module "agentstore/io"), in headless Chromium and Firefox:
//
// - before `await init()`, a static (`AgentStore.open`, `destroy`) rejects
//   and `setIoModule` or `new LeaseClient(…)` throws a ClosedError saying to
//   call and await init() first; before, each threw a bare TypeError
//   reading a minified export of `undefined`;
// - a class called without `new` (`LeaseClient(url)`) throws a
//   ValidationError naming the class; before, V8's "Class constructor St
//   cannot be invoked without 'new'" (the minified name);
// - a teardown called with an argument (`button.onclick =
//   store.close.bind(store)`, `client.close(event)`, `worker.stop(event)`)
//   tears down; before, the extra-argument refusal threw or rejected a
//   ValidationError and nothing was closed or stopped;
// - `LeaseWorker.finished` read after `free()` or dispose is the same
//   Promise as before it; before, a new Promise rejected with ClosedError;
// - an unknown option whose getter throws is a ValidationError naming it;
//   before, "the options' keys could not be listed (ownKeys threw)";
// - what a LeaseClient's `onCredentials` throws is logged with
//   `console.error`; before, it was swallowed without a trace.
//
// Needs the built pkg/ (scripts/build-pkg.sh); serves it with
// tests/e2e/static-server.mjs. Environment: CHROMIUM, GECKODRIVER.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { ROOT, launchBrowser, servePages } from './helpers.mjs';
import { launchFirefox } from '../../bench/webdriver.mjs';

const PKG = process.env.AGENTSTORE_PKG_DIR ?? join(ROOT, 'pkg');
const ENTRIES = [
  '/pkg/agentstore.js',
  ...(existsSync(join(PKG, 'store', 'agentstore.js')) ? ['/pkg/store/agentstore.js'] : []),
  ...(existsSync(join(PKG, 'io', 'agentstore_io.js')) ? ['/pkg/io/agentstore_io.js'] : []),
];

const site = servePages('misuse', PKG, {
  'index.html': '<!doctype html><title>misuse</title>',
  'misuse-credentials.js': `export default ${throwingOnCredentials};\n`,
  'credentials.html':
    '<!doctype html><title>credentials</title><script type="module">import run from "/misuse-credentials.js";\n' +
    'const done = (r) => { document.body.dataset.result = JSON.stringify(r); };\n' +
    'run("/pkg/agentstore.js").then(done, (e) => done({ bad: [`threw ${e}`] }));</script>',
});

// Each scenario runs in the page and returns what went wrong (empty: all
// as documented). `outcome` describes what a call did (within 5 s).
const HELPERS = `
  const outcome = async (call) => {
    let r;
    try { r = call(); } catch (e) { return { how: 'threw', e }; }
    if (!(r instanceof Promise)) return { how: 'returned', v: r };
    const settled = r.then((v) => ({ how: 'resolved', v }), (e) => ({ how: 'rejected', e }));
    return Promise.race([settled, new Promise((ok) => setTimeout(() => ok({ how: 'pending after 5 s' }), 5000))]);
  };
  const typed = (o, how, name, code, status, text) => o.how === how && o.e instanceof Error && o.e.name === name && o.e.code === code && o.e.status === status && String(o.e.message).includes(text);
  const show = (o) => o.how + ' ' + (o.e ? o.e.name + ': ' + o.e.message : String(o.v));
`;

async function beforeInit({ entry, helpers }) {
  const { outcome, typed, show } = new Function(`${helpers}; return { outcome, typed, show };`)();
  const mod = await import(entry);
  const bad = [];
  const early = async (label, how, call) => {
    const o = await outcome(call);
    if (!typed(o, how, 'ClosedError', 'closed', 410, 'init()')) bad.push(`${label}: ${show(o)}`);
  };
  const classes = Object.keys(mod).filter((k) => /^[A-Z][a-z]/.test(k) && typeof mod[k] === 'function');
  const withoutNew = async (when) => {
    for (const k of classes) {
      const o = await outcome(() => mod[k]('http://127.0.0.1:9'));
      if (!typed(o, 'threw', 'ValidationError', 'validation', 400, `${k} cannot be called without new`)) bad.push(`${k}() without new ${when}: ${show(o)}`);
    }
  };
  await early('AgentStore.open', 'rejected', () => mod.AgentStore.open('misuse-early'));
  await early('AgentStore.destroy', 'rejected', () => mod.AgentStore.destroy('misuse-early'));
  if (mod.AgentStore.setIoModule) await early('AgentStore.setIoModule', 'threw', () => mod.AgentStore.setIoModule({}));
  if (mod.LeaseClient) await early('new LeaseClient', 'threw', () => new mod.LeaseClient('http://127.0.0.1:9', { accessToken: 't', journal: false }));
  await withoutNew('before init()');
  await mod.default();
  await withoutNew('after init()');
  const store = await mod.AgentStore.open(`misuse-early-${Math.random().toString(36).slice(2)}`);
  await store.put({ _id: 'a' });
  store.close();
  return { bad, classes };
}

async function teardownArgs({ entry, helpers }) {
  const { outcome, typed, show } = new Function(`${helpers}; return { outcome, typed, show };`)();
  const mod = await import(entry);
  await mod.default();
  const bad = [];
  const closed = async (label, call) => {
    const o = await outcome(call);
    if (!typed(o, 'rejected', 'ClosedError', 'closed', 410, '')) bad.push(`${label}: ${show(o)}, not a ClosedError`);
  };
  const db = `misuse-teardown-${Math.random().toString(36).slice(2)}`;
  // As an event handler: the click's event is its argument.
  const button = document.createElement('button');
  const s1 = await mod.AgentStore.open(db);
  button.onclick = s1.close.bind(s1);
  button.click();
  await closed('a store closed by a click handler: put', () => s1.put({ _id: 'a' }));
  const s2 = await mod.AgentStore.open(db);
  const o = await outcome(() => s2.close(new Event('click'), 1));
  if (o.how !== 'returned' || o.v !== undefined) bad.push(`store.close(event, 1): ${show(o)}`);
  await closed('store.close(event, 1): get', () => s2.get('a'));
  if (mod.LeaseClient) {
    const options = () => ({ accessToken: 't', journal: false, releaseOnPagehide: false });
    const client = new mod.LeaseClient('http://127.0.0.1:9', options());
    const c = await outcome(() => client.close(new Event('click')));
    if (c.how !== 'resolved') bad.push(`client.close(event): ${show(c)}`);
    await closed('client.close(event): claim', () => client.claim('q'));
    const client2 = new mod.LeaseClient('http://127.0.0.1:9', options());
    const w = client2.work('q', () => {}, { pollIntervalMs: 60_000, reconnectBaseMs: 60_000, reconnectCapMs: 60_000 });
    const s = await outcome(() => w.stop(new Event('click')));
    if (s.how !== 'resolved') bad.push(`worker.stop(event): ${show(s)}`);
    if (w.stopping !== true) bad.push(`worker.stop(event): stopping is ${w.stopping}`);
    const f = await outcome(() => w.finished);
    if (f.how !== 'resolved') bad.push(`worker.stop(event): finished ${show(f)}`);
    await client2.close();
  }
  return { bad };
}

async function finishedAfterFree({ entry, helpers }) {
  const { outcome, show } = new Function(`${helpers}; return { outcome, show };`)();
  const mod = await import(entry);
  await mod.default();
  const bad = [];
  const client = new mod.LeaseClient('http://127.0.0.1:9', { accessToken: 't', journal: false, releaseOnPagehide: false });
  const work = () => client.work('q', () => {}, { pollIntervalMs: 60_000, reconnectBaseMs: 60_000, reconnectCapMs: 60_000 });
  for (const end of ['free', 'dispose', 'asyncDispose', 'stop then free']) {
    const w = work();
    const first = w.finished;
    if (end === 'free') w.free();
    else if (end === 'dispose') w[Symbol.dispose]();
    else if (end === 'asyncDispose') await w[Symbol.asyncDispose]();
    else {
      await w.stop();
      w.free();
    }
    let again;
    try {
      again = w.finished;
    } catch (e) {
      bad.push(`${end}: reading finished threw ${e.name}: ${e.message}`);
      continue;
    }
    if (again !== first) bad.push(`${end}: finished is another ${again && again.constructor.name} after it`);
    if (w.finished !== again) bad.push(`${end}: finished differs between two reads after it`);
    const o = await outcome(() => again);
    if (o.how !== 'resolved') bad.push(`${end}: finished ${show(o)}`);
  }
  // Never read before free(): the first read after it is the worker's.
  const w = work();
  w.free();
  const f = w.finished;
  if (!(f instanceof Promise) || w.finished !== f) bad.push('finished first read after free(): not one Promise');
  else {
    const o = await outcome(() => f);
    if (o.how !== 'resolved') bad.push(`finished first read after free(): ${show(o)}`);
  }
  await client.close();
  return { bad };
}

async function unknownThrowingOption({ entry, helpers }) {
  const { outcome, typed, show } = new Function(`${helpers}; return { outcome, typed, show };`)();
  const mod = await import(entry);
  await mod.default();
  const bad = [];
  const store = await mod.AgentStore.open(`misuse-options-${Math.random().toString(36).slice(2)}`);
  const thrower = { get lmt() { throw new Error('g'); } };
  const trap = new Proxy({ lmt: 1 }, { get() { throw new Error('trap'); } });
  for (const [label, call] of [
    ['list({get lmt() {throw}})', () => store.list(thrower)],
    ['count({get lmt() {throw}})', () => store.count(thrower)],
    ['list(Proxy whose get trap throws, key lmt)', () => store.list(trap)],
  ]) {
    const o = await outcome(call);
    if (!typed(o, 'rejected', 'ValidationError', 'validation', 400, '"lmt"')) bad.push(`${label}: ${show(o)}`);
  }
  store.close();
  return { bad };
}

// The page's own `fetch` stands in for the lease server: it enrolls
// (`POST /v1/workers/enroll`) and answers every other request with `204`
// (no item to claim). This runs as a module of its own page (written
// beside index.html), not as evaluated script: Firefox's WebDriver runs
// that in a sandbox whose `fetch` and `console` the page's modules do not
// see. The page puts its result in `document.body.dataset.result`.
async function throwingOnCredentials(entry) {
  const mod = await import(entry);
  await mod.default();
  const bad = [];
  const logged = [];
  const error = console.error;
  console.error = (...args) => logged.push(args);
  const fetch = globalThis.fetch;
  globalThis.fetch = async (input) => {
    const url = typeof input === 'string' ? input : input.url;
    if (url.endsWith('/v1/workers/enroll')) {
      const body = { worker_id: 7, access_token: 'acc', access_expires_in_ms: 900000, refresh_token: 'ref' };
      return new Response(JSON.stringify(body), { status: 200, headers: { 'content-type': 'application/json' } });
    }
    return new Response(null, { status: 204 });
  };
  const thrown = new Error('could not save the refresh token');
  let calls = 0;
  const client = new mod.LeaseClient(location.origin, {
    enrollmentToken: 'enroll-me',
    journal: false,
    releaseOnPagehide: false,
    onCredentials: () => {
      calls++;
      throw thrown;
    },
  });
  try {
    const got = await client.claim('q').then((v) => `resolved ${v}`, (e) => `rejected ${e.name}: ${e.message}`);
    if (got !== 'resolved null') bad.push(`claim: ${got}, not null`);
    if (calls !== 1) bad.push(`onCredentials called ${calls} times`);
    if (client.credentials.refreshToken !== 'ref') bad.push(`credentials.refreshToken is ${client.credentials.refreshToken}`);
    const ours = logged.filter((args) => args.includes(thrown));
    if (ours.length !== 1) bad.push(`console.error got the thrown value ${ours.length} times (logged: ${logged.map((a) => a.map(String).join(' ')).join(' | ')})`);
    else if (!String(ours[0][0]).includes('onCredentials')) bad.push(`console.error's message does not name onCredentials: ${ours[0][0]}`);
  } finally {
    console.error = error;
    globalThis.fetch = fetch;
    await client.close();
  }
  return { bad };
}

for (const engine of ['chromium', 'firefox']) {
  test(`${engine}: calls made the wrong way get the documented typed errors or teardown`, { timeout: 300_000 }, async (t) => {
    const browser = engine === 'chromium' ? await launchBrowser() : await launchFirefox();
    // A fresh page (so a fresh, uninitialised module instance) per run.
    const run = async (scenario, entry) => {
      const page = engine === 'chromium' ? await (await browser.newContext()).newPage() : await browser.newPage();
      try {
        await page.goto(`${site.base}/index.html`);
        return await page.evaluate(scenario, { entry, helpers: HELPERS });
      } finally {
        await page.close?.(); // (the Firefox driver's pages have no close(): browser.close() ends them)
      }
    };
    try {
      await t.test('a call before init() is a ClosedError saying to await init(), a class called without new a ValidationError naming it', async () => {
        for (const entry of ENTRIES) {
          const r = await run(beforeInit, entry);
          assert.ok(r.classes.includes('AgentStore'), `${entry}: exports ${r.classes}`);
          assert.deepEqual(r.bad, [], `${entry}:\n  ${r.bad.join('\n  ')}`);
        }
      });
      await t.test('a teardown given arguments (an event handler) tears down, never refusing them', async () => {
        for (const entry of ENTRIES.filter((e) => !e.includes('/io/'))) {
          const r = await run(teardownArgs, entry);
          assert.deepEqual(r.bad, [], `${entry}:\n  ${r.bad.join('\n  ')}`);
        }
      });
      await t.test("a LeaseWorker's finished is the same Promise after free() or dispose", async () => {
        const r = await run(finishedAfterFree, '/pkg/agentstore.js');
        assert.deepEqual(r.bad, [], r.bad.join('\n'));
      });
      await t.test('an unknown option whose getter throws is a ValidationError naming it', async () => {
        for (const entry of ENTRIES.filter((e) => !e.includes('/io/'))) {
          const r = await run(unknownThrowingOption, entry);
          assert.deepEqual(r.bad, [], `${entry}:\n  ${r.bad.join('\n  ')}`);
        }
      });
      await t.test('what onCredentials throws is logged with console.error, and the call goes on', async () => {
        const page = engine === 'chromium' ? await (await browser.newContext()).newPage() : await browser.newPage();
        await page.goto(`${site.base}/credentials.html`);
        const r = JSON.parse(
          await page.evaluate(async () => {
            for (let i = 0; i < 200 && !document.body.dataset.result; i++) await new Promise((ok) => setTimeout(ok, 100));
            return document.body.dataset.result ?? '{"bad":["no result within 20 s"]}';
          }),
        );
        assert.deepEqual(r.bad, [], r.bad.join('\n'));
      });
    } finally {
      await browser.close();
    }
  });
}
