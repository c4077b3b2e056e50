// A call's `signal` is watched for the call and no longer (docs/api.md,
// "Every `signal` option"): against the built pkg/.
//
// - Chromium (CDP): after 2,000 `mutate` calls each given its own
//   `AbortSignal.any([root.signal])`, the signals are garbage once the calls
//   ended. A listener left on such a dependent signal keeps it alive while
//   its source can still abort (helper-221 counted 6,401 live signals after
//   6,400 calls when every signal kept one).
// - Chromium and Firefox: an `abort` event (with `signal.aborted` still
//   false) fired while an io-module call runs, before the io module read
//   its own copy of the options, counts: `dropIndex` rejects with AbortError
//   and drops nothing, `importSnapshot` rejects and writes nothing. Before,
//   the io module's copy of the watch registry did not know the entry
//   point's, and both went on.
//
// - Chromium and Firefox: 2,000 `mutate` calls given one signal that never
//   aborts keep no JS values in the module's tables (helper-228 counted 2 to
//   4 kept per call).
//
//   node --test tests/e2e/signals.test.mjs      (needs pkg/)

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { launchBrowser, servePkgPage } from './helpers.mjs';
import { launchFirefox } from '../../bench/webdriver.mjs';

const CALLS = 2000;

const PAGE = `
const mod = await import('/pkg/store/agentstore.js');
const wasm = await mod.default();
// Slots of the module's tables: the JS values Rust holds (wasm-bindgen's
// externref table) grow them; a slot never freed is never reused.
const tableSlots = () => Object.values(wasm).filter((v) => v instanceof WebAssembly.Table).reduce((n, t) => n + t.length, 0);
// Table slots added by n mutates (sync and async functions, each writing)
// given one long-lived signal that never aborts.
window.mutateSlots = async (name, n) => {
  await mod.AgentStore.destroy(name);
  const c = new AbortController();
  const s = await mod.AgentStore.open(name);
  await s.put({ _id: 'k', n: 0 });
  const bump = (r) => ({ ...r, n: r.n + 1 });
  for (let i = 0; i < 20; i++) await s.mutate('k', bump, { signal: c.signal });
  const before = tableSlots();
  for (let i = 0; i < n; i += 2) {
    await s.mutate('k', bump, { signal: c.signal });
    await s.mutate('k', async (r) => bump(r), { signal: c.signal });
  }
  const added = tableSlots() - before;
  const { n: writes } = await s.get('k');
  s.close();
  return { added, writes };
};
window.mutates = async (name, n) => {
  await mod.AgentStore.destroy(name);
  window.root = new AbortController();
  const s = await mod.AgentStore.open(name);
  await s.put({ _id: 'k', n: 0 });
  for (let i = 0; i < n; i += 50) {
    const calls = [];
    for (let j = 0; j < 50; j++) calls.push(s.mutate('k', () => undefined, { signal: AbortSignal.any([root.signal]) }));
    await Promise.all(calls);
  }
  s.close();
  return n;
};
// The event fires once the io module has loaded, before the io call reads
// its options (a timer queued as the module resolves).
const eventOnLoad = (c) => mod.AgentStore.setIoModule(() => import('/pkg/io/agentstore_io.js').then((m) => {
  setTimeout(() => c.signal.dispatchEvent(new Event('abort')), 0);
  return m;
}));
const outcome = (p) => p.then((v) => 'resolved ' + JSON.stringify(v), (e) => 'rejected ' + e.name);
window.dropWithEvent = async (name) => {
  await mod.AgentStore.destroy(name);
  const old = await mod.AgentStore.open(name, { indexes: [{ name: 'byOwner', keys: ['owner'] }] });
  await old.put({ _id: 'a', owner: 'x' });
  await old.rebuildIndexes();
  old.close();
  const s = await mod.AgentStore.open(name);
  const c = new AbortController();
  eventOnLoad(c);
  const out = await outcome(s.dropIndex('byOwner', { signal: c.signal }));
  const again = await outcome(s.dropIndex('byOwner'));
  s.close();
  return { out, again };
};
window.importWithEvent = async (name) => {
  await mod.AgentStore.destroy(name);
  const s = await mod.AgentStore.open(name);
  const text = '{"agentstore":"snapshot","records":2,"tombstones":0,"version":1}\\n' +
    '{"_id":"a","_rev":"1-aa","updatedAt":"2026-01-01T00:00:00.000Z"}\\n{"_id":"b","_rev":"1-bb","updatedAt":"2026-01-01T00:00:00.000Z"}\\n';
  const c = new AbortController();
  eventOnLoad(c);
  const out = await outcome(s.importSnapshot(text, { signal: c.signal }));
  const count = await s.count();
  s.close();
  return { out, count };
};
window.ready = true;
`;

const site = servePkgPage({ '/page.js': PAGE });

async function open(page) {
  await page.goto(`${site.origin}/page.html`);
  await page.waitForFunction(() => window.ready === true, null, { timeout: 60_000 });
}

// helper-228: each mutate given a signal kept 2 (sync function) or 4 (async)
// JS callbacks in the table for good: the JsFuture of the abort watch's
// Promise, which never settled when the signal did not abort.
async function mutateSlots(page, engine) {
  const { added, writes } = await page.evaluate(([n, c]) => window.mutateSlots(n, c), [`signals-slots-${engine}`, CALLS]);
  assert.equal(writes, CALLS + 20, `${engine}: every mutate wrote`);
  assert.ok(added < CALLS / 10, `${engine}: ${added} table slots kept after ${CALLS} mutates with a signal`);
}

async function ioCalls(page, engine) {
  const drop = await page.evaluate((n) => window.dropWithEvent(n), `signals-drop-${engine}`);
  assert.deepEqual(drop, { out: 'rejected AbortError', again: 'resolved true' }, `${engine}: nothing dropped by the aborted call`);
  const imp = await page.evaluate((n) => window.importWithEvent(n), `signals-import-${engine}`);
  assert.deepEqual(imp, { out: 'rejected AbortError', count: 0 }, `${engine}: nothing imported by the aborted call`);
}

test('chromium: a call\'s signal is not kept alive after it, mutates keep no table slots, and an abort event counts in the io module', async () => {
  const browser = await launchBrowser();
  try {
    const page = await (await browser.newContext()).newPage();
    await open(page);
    const cdp = await page.context().newCDPSession(page);
    // Live AbortSignals after a full garbage collection (DevTools protocol:
    // Runtime.queryObjects counts the objects of a prototype).
    const liveSignals = async () => {
      await cdp.send('HeapProfiler.collectGarbage');
      await cdp.send('HeapProfiler.collectGarbage');
      const { result: proto } = await cdp.send('Runtime.evaluate', { expression: 'AbortSignal.prototype' });
      const { objects } = await cdp.send('Runtime.queryObjects', { prototypeObjectId: proto.objectId, objectGroup: 'q' });
      const { result } = await cdp.send('Runtime.callFunctionOn', { objectId: objects.objectId, functionDeclaration: 'function () { return this.length; }', returnByValue: true });
      await cdp.send('Runtime.releaseObjectGroup', { objectGroup: 'q' });
      await cdp.send('Runtime.releaseObject', { objectId: proto.objectId });
      return result.value;
    };
    const before = await liveSignals();
    assert.equal(await page.evaluate(([n, c]) => window.mutates(n, c), ['signals-leak', CALLS]), CALLS);
    const live = await liveSignals();
    assert.ok(live - before < CALLS / 10, `${live - before} of ${CALLS} call signals still alive after the calls`);
    await mutateSlots(page, 'chromium');
    await ioCalls(page, 'chromium');
  } finally {
    await browser.close();
  }
});

test('firefox: mutates keep no table slots, and an abort event counts in the io module', async () => {
  const firefox = await launchFirefox();
  try {
    const page = await firefox.newPage();
    await open(page);
    await mutateSlots(page, 'firefox');
    await ioCalls(page, 'firefox');
  } finally {
    await firefox.close();
  }
});
