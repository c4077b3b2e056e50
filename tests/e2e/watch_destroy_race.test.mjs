// A watch made before AgentStore.destroy hears the new database's first
// change of an id, written by another context, though the id was heard at a
// higher generation in the destroyed database: posts carry the database's own
// number (`d`), so the order keys start afresh. Forced in Chromium: the page
// that makes the new database's first watch is kept busy (a 1.5 s long task
// in the mark's 'complete' listener) while a worker writes. An earlier fix
// cleared the keys on a message the marking page posted after its commit,
// which the worker's post overtook: the change of `a` was dropped (found by
// helper-223's review, which wrote this test).
//
//   node --test tests/e2e/watch_destroy_race.test.mjs      (needs pkg/)

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { launchBrowser, servePkgPage } from './helpers.mjs';


const PAGE = `
const mod = await import('/pkg/store/agentstore.js');
await mod.default();
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
window.run = async (name, busyMs) => {
  await mod.AgentStore.destroy(name);
  const old = await mod.AgentStore.open(name);
  const heard = [];
  const w = old.watch({ prefix: 'a' }, (c) => heard.push(c.rev));
  await w.ready;
  let r = await old.put({ _id: 'a', n: 1 });
  r = await old.put({ _id: 'a', n: 2, _rev: r.rev });
  r = await old.put({ _id: 'a', n: 3, _rev: r.rev });
  for (let i = 0; i < 100 && heard.length < 3; i++) await sleep(20);
  const heardOld = heard.slice();
  old.close();
  await mod.AgentStore.destroy(name);
  const fresh = await mod.AgentStore.open(name);
  const worker = new Worker('/worker.js', { type: 'module' });
  await new Promise((res) => { worker.onmessage = (e) => e.data === 'ready' && res(); });
  worker.postMessage({ open: name });
  await new Promise((res) => { worker.onmessage = (e) => e.data === 'opened' && res(); });
  const wrote = new Promise((res) => { worker.onmessage = (e) => res(e.data); });
  // The first watch of the new database: its mark's transaction gets a
  // 'complete' listener ahead of the store's that tells the worker to write,
  // then keeps this page busy (any long task would do).
  const orig = IDBDatabase.prototype.transaction;
  IDBDatabase.prototype.transaction = function (...args) {
    const tx = orig.apply(this, args);
    if (busyMs > 0) tx.addEventListener('complete', () => {
      worker.postMessage({ write: true });
      const end = performance.now() + busyMs;
      while (performance.now() < end);
    });
    return tx;
  };
  let w2;
  try {
    w2 = fresh.watch({ prefix: 'zzz' }, () => {});
  } finally {
    IDBDatabase.prototype.transaction = orig;
  }
  await w2.ready;
  if (busyMs === 0) worker.postMessage({ write: true });
  const rev = await wrote;
  for (let i = 0; i < 50 && !heard.includes(rev[0]); i++) await sleep(20);
  w.close();
  w2.close();
  worker.terminate();
  fresh.close();
  return { heardOld, written: rev, heardAfter: heard.slice(heardOld.length) };
};
window.ready = true;
`;

const WORKER = `
const mod = await import('/pkg/store/agentstore.js');
await mod.default();
let s;
onmessage = async (e) => {
  if (e.data.open) { s = await mod.AgentStore.open(e.data.open); postMessage('opened'); return; }
  // One transaction, one post: 'a' (heard at 3- in the old database) and
  // 'ab' (never heard before).
  const r = await s.putMany([{ _id: 'a', n: 100 }, { _id: 'ab', n: 1 }]);
  postMessage(r.map((x) => x.rev));
};
postMessage('ready');
`;

const site = servePkgPage({ '/page.js': PAGE, '/worker.js': WORKER });

test('chromium: a watch made before a destroy hears the new database\'s first change of an id written by another context', async () => {
  const browser = await launchBrowser();
  try {
    const page = await (await browser.newContext()).newPage();
    await page.goto(`${site.origin}/page.html`);
    await page.waitForFunction(() => window.ready === true, null, { timeout: 60_000 });
    const control = await page.evaluate(([n, b]) => window.run(n, b), ['race-control', 0]);
    const r = await page.evaluate(([n, b]) => window.run(n, b), ['race-busy', 1500]);
    assert.deepEqual(control.heardAfter, control.written, 'control');
    assert.deepEqual(r.heardAfter, r.written, 'both changes of the worker\'s one post are heard (a at 1-, ab at 1-)');
  } finally {
    await browser.close();
  }
});
