// `free()`, `[Symbol.dispose]()` and `[Symbol.asyncDispose]()` of a work()
// handle (LeaseWorker) and of a LeaseClient end what they stand for, in
// headless Chromium and Firefox against a real agentstore-server this test
// starts on loopback (the page is served by it, same origin; the SDK comes
// from pkg/, AGENTSTORE_PKG_DIR overrides it):
//
// - `using worker = client.work(…)` (or `worker[Symbol.dispose]()`, or
//   `worker.free()`) right after work() started: the worker stops, nothing
//   is claimed, the queue's items stay open;
// - `await using worker` (`[Symbol.asyncDispose]()`) resolves once it has
//   stopped;
// - `using client = new LeaseClient(…)` (`[Symbol.dispose]()`, `free()`,
//   `[Symbol.asyncDispose]()`) closes the client, which ends its workers.
//
// Before, dispose was wasm-bindgen's free() for every class: it dropped the
// JS wrapper only, the work loop kept its own reference and claimed on, and
// `stop()` or `close()` on the freed object resolved doing nothing: a
// disposed worker claimed for good and could not be stopped.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ROOT, adminRequest, launchBrowser, leaseServerBin, startLeaseServer } from './helpers.mjs';
import { launchFirefox } from '../../bench/webdriver.mjs';

const PKG = process.env.AGENTSTORE_PKG_DIR ?? join(ROOT, 'pkg');
const ADMIN = 'lease-dispose-admin';

let dir;
let server;

before(async () => {
  assert.ok(existsSync(join(PKG, 'agentstore.js')), `${PKG} must hold the built SDK (scripts/build-pkg.sh)`);
  dir = mkdtempSync(join(tmpdir(), 'agentstore-lease-dispose-'));
  mkdirSync(join(dir, 'www'));
  writeFileSync(join(dir, 'www', 'index.html'), '<!doctype html><title>lease dispose</title>');
  server = await startLeaseServer(leaseServerBin(), [
    '--database', join(dir, 'leases.sqlite'), '--admin-token', ADMIN,
    '--ttl-ms', '3000', '--heartbeat-ms', '500', '--reaper-ms', '200',
    '--claim-rate', '1000/s', '--auth-rate', '1000/s', '--idle-retry-ms', '100', '--www', join(dir, 'www'), '--pkg', PKG,
  ]);
});

after(async () => {
  await server?.stop();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

function admin(method, path, body) {
  return adminRequest(server.base, ADMIN, method, path, body);
}

// Runs in the page, for one way of ending a worker right after work()
// started on a queue of open items: how many claims the page sent and how
// many handlers ran (a claim, if the worker still claimed, goes out within
// milliseconds; up to POLL_MS * 20 is waited for one, a bound, not a
// sleep), and whether what the ending returned settled (a worker's
// `finished`, read before the ending, or an asyncDispose's Promise). The
// server's item states are the check that holds in every browser (in
// Firefox, the WebDriver script's fetch wrapper need not be the fetch the
// module calls).
async function scenario({ admin, queue, how }) {
  const POLL_MS = 50;
  const mod = await import('/pkg/agentstore.js');
  await mod.default();
  const real = globalThis.fetch;
  let claims = 0;
  globalThis.fetch = (url, init) => {
    if (String(url).endsWith(`/queues/${queue}/claims`)) claims += 1;
    return real(url, init);
  };
  let handled = 0;
  const handler = async () => {
    handled += 1;
  };
  const options = { pollIntervalMs: POLL_MS };
  const bounded = (p) => Promise.race([p.then(() => 'settled', (e) => `rejected ${e && e.name}`),
    new Promise((r) => setTimeout(() => r('pending after 10 s'), 10_000))]);
  const client = new mod.LeaseClient(location.origin, { accessToken: admin, journal: false, releaseOnPagehide: false });
  let ended;
  try {
    try {
      ended = end(how);
    } catch (e) {
      if (e.skipped) return { skipped: e.message };
      // (A method the build does not have: the way fails, the others run.)
      ended = Promise.reject(e);
    }
    const outcome = await bounded(Promise.resolve(ended));
    const until = performance.now() + POLL_MS * 20;
    while (claims === 0 && handled === 0 && performance.now() < until) await new Promise((r) => setTimeout(r, 10));
    return { outcome, claims, handled };
  } finally {
    globalThis.fetch = real;
    // (After a client's dispose or free, close() resolves doing nothing.)
    await client.close();
  }
  // Ends the worker `how`; returns what settles once it has stopped.
  function end(how) {
    let ended;
    if (how === 'using') {
      // The syntax itself, where the engine has it (a string: the test
      // file is parsed by a Node that may not).
      let run;
      try {
        run = new Function('client', 'handler', 'options', '{ using worker = client.work(handler.queue, handler, options); return worker.finished; }');
      } catch (e) {
        throw Object.assign(new Error(`no using declarations here: ${e.message}`), { skipped: true });
      }
      handler.queue = queue;
      ended = run(client, handler, options);
    } else if (how === 'await using') {
      let run;
      try {
        run = new (async () => {}).constructor('client', 'handler', 'options', '{ await using worker = client.work(handler.queue, handler, options); } return "settled";');
      } catch (e) {
        throw Object.assign(new Error(`no await using declarations here: ${e.message}`), { skipped: true });
      }
      handler.queue = queue;
      ended = run(client, handler, options);
    } else if (how.startsWith('worker')) {
      const worker = client.work(queue, handler, options);
      const finished = worker.finished;
      if (how === 'worker dispose') worker[Symbol.dispose]();
      else if (how === 'worker free') worker.free();
      else if (how === 'worker asyncDispose') ended = worker[Symbol.asyncDispose]();
      ended ??= finished;
    } else {
      const worker = client.work(queue, handler, options);
      const finished = worker.finished;
      if (how === 'client dispose') client[Symbol.dispose]();
      else if (how === 'client free') client.free();
      else if (how === 'client asyncDispose') ended = client[Symbol.asyncDispose]();
      ended ??= finished;
    }
    return ended;
  }
}

const WAYS = [
  'worker dispose', 'worker free', 'worker asyncDispose', 'using', 'await using',
  'client dispose', 'client free', 'client asyncDispose',
];

for (const engine of ['chromium', 'firefox']) {
  test(`${engine}: a disposed or freed worker or client stops: nothing is claimed after it`, { timeout: 300_000 }, async () => {
    const browser = engine === 'chromium' ? await launchBrowser() : await launchFirefox();
    try {
      const page = engine === 'chromium' ? await (await browser.newContext()).newPage() : await browser.newPage();
      await page.goto(`${server.base}/index.html`);
      const bad = [];
      for (const how of WAYS) {
        const queue = `dispose-${engine}-${how.replace(/ /g, '-')}-${Date.now()}`;
        const ids = [];
        for (let n = 0; n < 3; n++) {
          const { status, body } = await admin('POST', `/v1/queues/${queue}/items`, { payload: { n } });
          assert.equal(status, 201);
          ids.push(body.id);
        }
        const r = await page.evaluate(scenario, { admin: ADMIN, queue, how });
        if (r.skipped) {
          console.log(`${engine} ${how}: skipped (${r.skipped})`);
          continue;
        }
        // Every way is tried; the failures are listed together.
        if (r.outcome !== 'settled') bad.push(`${how}: the worker did not stop (${r.outcome})`);
        if (r.claims || r.handled) bad.push(`${how}: ${r.claims} claim(s) sent and ${r.handled} handler(s) run after it`);
        for (const id of ids) {
          const { body } = await admin('GET', `/v1/items/${id}`);
          if (body.state !== 'open' || body.epoch !== 0) bad.push(`${how}: item ${id} claimed (${body.state}, epoch ${body.epoch})`);
        }
      }
      assert.deepEqual(bad, [], `${engine}:\n  ${bad.join('\n  ')}`);
    } finally {
      await browser.close();
    }
  });
}

// Runs in the page: a worker whose handler holds its lease until released
// is ended `how` while the handler runs; the handler is released 300 ms
// later (an order, not a wait for a condition: a teardown Promise that did
// not wait settles within microtasks). Returns the order in which the
// handler finished and the teardown's Promise settled, and the item's
// state on the server when it settled. A worker's stop() waits for the
// handler and its settle; a client's close() releases the lease under it
// (its handler's signal aborts) and resolves once released.
async function holding({ admin, queue, how, id }) {
  const mod = await import('/pkg/agentstore.js');
  await mod.default();
  const order = [];
  let release;
  const running = new Promise((started) => {
    globalThis.__handler = async () => {
      started();
      await new Promise((r) => { release = r; });
      order.push('handler done');
    };
  });
  const client = new mod.LeaseClient(location.origin, { accessToken: admin, journal: false, releaseOnPagehide: false });
  const worker = client.work(queue, (...a) => globalThis.__handler(...a), { pollIntervalMs: 50 });
  const bound = (p, what) => Promise.race([p, new Promise((_, no) => setTimeout(() => no(new Error(`${what} within 20 s`)), 20_000))]);
  await bound(running, 'no handler ran');
  let ended;
  if (how === 'worker free, then stop()') { worker.free(); ended = worker.stop(); }
  else if (how === 'worker dispose, then stop()') { worker[Symbol.dispose](); ended = worker.stop(); }
  else if (how === 'worker free, then asyncDispose()') { worker.free(); ended = worker[Symbol.asyncDispose](); }
  else if (how === 'worker asyncDispose') ended = worker[Symbol.asyncDispose]();
  else if (how === 'client free, then close()') { client.free(); ended = client.close(); }
  else if (how === 'client asyncDispose') ended = client[Symbol.asyncDispose]();
  let state;
  const itemState = async () => (await (await fetch(`/v1/items/${id}`, { headers: { authorization: `Bearer ${admin}` } })).json()).state;
  const settled = ended.then(async () => { order.push('teardown settled'); state = await itemState(); },
    (e) => order.push(`teardown rejected ${e && e.name}`));
  setTimeout(() => release(), 300);
  await bound(settled, 'the teardown did not settle');
  await client.close();
  return { order, state };
}

for (const engine of ['chromium', 'firefox']) {
  test(`${engine}: the teardown a free() or dispose started is what a later stop() or close() waits for`, { timeout: 300_000 }, async () => {
    const browser = engine === 'chromium' ? await launchBrowser() : await launchFirefox();
    try {
      const page = engine === 'chromium' ? await (await browser.newContext()).newPage() : await browser.newPage();
      await page.goto(`${server.base}/index.html`);
      const bad = [];
      for (const how of ['worker free, then stop()', 'worker dispose, then stop()', 'worker free, then asyncDispose()',
        'worker asyncDispose', 'client free, then close()', 'client asyncDispose']) {
        const queue = `dispose-wait-${engine}-${how.replace(/[^a-z]+/g, '-')}-${Date.now()}`;
        const { status, body } = await admin('POST', `/v1/queues/${queue}/items`, { payload: {} });
        assert.equal(status, 201);
        const { order, state } = await page.evaluate(holding, { admin: ADMIN, queue, how, id: body.id });
        const [want, wantState] = how.startsWith('worker') ? ['handler done,teardown settled', 'done'] : [null, 'open'];
        if (want ? order.join() !== want : !order.includes('teardown settled')) bad.push(`${how}: ${order.join(' → ')}`);
        if (state !== wantState) bad.push(`${how}: the item was ${state} when the teardown settled, not ${wantState}`);
      }
      assert.deepEqual(bad, [], `${engine}:\n  ${bad.join('\n  ')}`);
    } finally {
      await browser.close();
    }
  });
}
