// A watch hears one record's changes in commit order when they are written
// from several contexts: two dedicated Web Workers increment one record with
// `mutate` (started together by one message), and a `watch` in the page
// collects the generation of every change it hears. Every context posts its
// changes after its own commit, so one worker's post of an earlier commit can
// arrive after the other's post of a later one (helper-220 saw 11 such
// inversions in 600 changes in Chromium, 8 in Firefox); the watcher drops a
// change a later one overtook, so the generations heard only go up and end
// at the record's last. Runs the built pkg/ in headless Chromium
// (Playwright) and headless Firefox (geckodriver).
//
//   node --test tests/e2e/watch_order.test.mjs      (needs pkg/)

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { launchBrowser, servePkgPage } from './helpers.mjs';
import { launchFirefox } from '../../bench/webdriver.mjs';

/** Increments per worker, per round. */
const N = 300;
const ROUNDS = 2;

const PAGE = `
const mod = await import('/pkg/store/agentstore.js');
await mod.default();
const spawn = () => new Promise((resolve, reject) => {
  const w = new Worker('/worker.js', { type: 'module' });
  w.onmessage = (e) => e.data === 'ready' && resolve(w);
  w.onerror = (e) => reject(new Error(e.message));
});
window.run = async (name, n) => {
  await mod.AgentStore.destroy(name);
  const s = await mod.AgentStore.open(name);
  const gens = [];
  const w = s.watch({ prefix: 'c' }, (c) => gens.push(Number(c.rev.split('-')[0])));
  await w.ready;
  const workers = [await spawn(), await spawn()];
  const done = workers.map((wk) => new Promise((resolve) => { wk.onmessage = (e) => resolve(e.data); }));
  // One message each, posted together: both start writing at once.
  for (const wk of workers) wk.postMessage({ name, n });
  const results = await Promise.all(done);
  workers.forEach((wk) => wk.terminate());
  const last = Number((await s.get('c'))._rev.split('-')[0]);
  // Bounded wait for the last change itself, not for a time.
  const end = Date.now() + 30000;
  while (gens[gens.length - 1] !== last && Date.now() < end) await new Promise((r) => setTimeout(r, 20));
  w.close();
  s.close();
  const inversions = [];
  for (let i = 1; i < gens.length; i++) if (gens[i] <= gens[i - 1]) inversions.push([gens[i - 1], gens[i]]);
  return { results, last, heardLast: gens[gens.length - 1], heard: gens.length, inversions: inversions.slice(0, 5) };
};
window.ready = true;
`;

const WORKER = `
const mod = await import('/pkg/store/agentstore.js');
await mod.default();
onmessage = async (e) => {
  const s = await mod.AgentStore.open(e.data.name);
  try {
    for (let i = 0; i < e.data.n; i++) await s.mutate('c', (cur) => ({ _id: 'c', n: (cur?.n ?? 0) + 1 }), { retries: 1000 });
    postMessage('ok');
  } catch (err) {
    postMessage(String(err?.name) + ': ' + String(err?.message));
  } finally {
    s.close();
  }
};
postMessage('ready');
`;

const site = servePkgPage({ '/page.js': PAGE, '/worker.js': WORKER });

async function rounds(page, engine) {
  await page.goto(`${site.origin}/page.html`);
  await page.waitForFunction(() => window.ready === true, null, { timeout: 60_000 });
  for (let round = 0; round < ROUNDS; round++) {
    const r = await page.evaluate(([name, n]) => window.run(name, n), [`watch-order-${engine}-${round}`, N]);
    const what = `${engine} round ${round}: ${JSON.stringify(r)}`;
    assert.deepEqual(r.results, ['ok', 'ok'], what);
    assert.equal(r.last, 2 * N, what);
    assert.deepEqual(r.inversions, [], `${what}: generations heard only go up`);
    assert.equal(r.heardLast, r.last, `${what}: the last change heard is the record's last`);
  }
}

test('chromium: a watch hears one record\'s changes from two workers in commit order', async () => {
  const browser = await launchBrowser();
  try {
    await rounds(await (await browser.newContext()).newPage(), 'chromium');
  } finally {
    await browser.close();
  }
});

test('firefox: a watch hears one record\'s changes from two workers in commit order', async () => {
  const firefox = await launchFirefox();
  try {
    await rounds(await firefox.newPage(), 'firefox');
  } finally {
    await firefox.close();
  }
});
