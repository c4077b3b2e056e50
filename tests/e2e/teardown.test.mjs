// Teardown calls of every handle the SDK gives out — `close()`, `free()`,
// `[Symbol.dispose]()` of AgentStore and LeaseClient, `stop()`, `free()` and
// `[Symbol.dispose]()` of a work() handle (LeaseWorker) — run in any order,
// any number of times, in both entry points ("agentstore" and
// "agentstore/store"), in headless Chromium and Firefox: none throws, and a
// Promise-returning one resolves. Before, `store.close()` after `free()` (or
// after a `using` block's dispose) threw a ClosedError, and `client.close()`
// or `worker.stop()` after `free()` rejected with one.
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
const ENTRIES = ['/pkg/agentstore.js', ...(existsSync(join(PKG, 'store', 'agentstore.js')) ? ['/pkg/store/agentstore.js'] : [])];

const site = servePages('teardown', PKG, { 'index.html': '<!doctype html><title>teardown</title>' });

// Runs in the page: every order of teardown calls tried; returns the calls
// that threw or rejected, and those that returned something else than
// `undefined` (sync) or a Promise of `undefined`.
async function scenario({ entry }) {
  const mod = await import(entry);
  await mod.default();
  const bad = [];
  const step = async (label, call) => {
    let r;
    try {
      r = call();
    } catch (e) {
      bad.push(`${label}: threw ${e && e.name}: ${e && e.message}`);
      return;
    }
    if (r instanceof Promise) {
      await r.then(
        (v) => v === undefined || bad.push(`${label}: resolved ${String(v)}`),
        (e) => bad.push(`${label}: rejected ${e && e.name}: ${e && e.message}`),
      );
    } else if (r !== undefined) {
      bad.push(`${label}: returned ${String(r)}`);
    }
  };
  const run = async (what, obj, order, names) => {
    for (const k of order) {
      const label = `${what} ${order.join(' > ')}: ${k}`;
      await step(label, () => (k === 'dispose' ? obj[Symbol.dispose]() : obj[names[k] ?? k]()));
    }
  };
  const teardowns = (a) => [
    [a, 'free'], ['free', a], ['dispose', a], [a, 'dispose'], [a, a], ['free', 'free', a, a],
    ['dispose', 'free', a, 'dispose'], [a, 'free', a, 'dispose', 'free', a],
  ];
  const db = `teardown-${Math.random().toString(36).slice(2)}`;
  let n = 0;
  for (const order of teardowns('close')) {
    const store = await mod.AgentStore.open(db);
    await store.put({ _id: `x${n++}` });
    await run('AgentStore', store, order, {});
  }
  // The store still opens and works afterwards.
  const again = await mod.AgentStore.open(db);
  const still = (await again.get('x0'))?._id === 'x0';
  again.close();
  if (mod.LeaseClient) {
    // Nothing listens on port 9: no lease is ever held, every request fails fast.
    const options = () => ({ accessToken: 't', journal: false, releaseOnPagehide: false });
    for (const order of teardowns('close')) {
      const client = new mod.LeaseClient('http://127.0.0.1:9', options());
      await run('LeaseClient', client, order, {});
    }
    // A work() handle, also after its client's close() or free().
    const worker = [
      ...teardowns('stop'),
      ['clientClose', 'stop', 'free', 'stop'],
      ['clientFree', 'stop', 'dispose', 'stop'],
      ['clientClose', 'clientFree', 'clientClose', 'free', 'stop'],
    ];
    for (const order of worker) {
      const client = new mod.LeaseClient('http://127.0.0.1:9', options());
      const w = client.work('q', () => {}, { pollIntervalMs: 60_000, reconnectBaseMs: 60_000, reconnectCapMs: 60_000 });
      const handle = {
        stop: () => w.stop(),
        free: () => w.free(),
        [Symbol.dispose]: () => w[Symbol.dispose](),
        clientClose: () => client.close(),
        clientFree: () => client.free(),
      };
      await run('LeaseWorker', handle, order, {});
      await step(`LeaseWorker ${order.join(' > ')}: client teardown`, () => client.close());
    }
  }
  return { bad, still };
}

for (const engine of ['chromium', 'firefox']) {
  test(`${engine}: teardown calls run in any order, any number of times, never throwing, in both entry points`, { timeout: 300_000 }, async () => {
    const browser = engine === 'chromium' ? await launchBrowser() : await launchFirefox();
    try {
      for (const entry of ENTRIES) {
        const page = engine === 'chromium' ? await (await browser.newContext()).newPage() : await browser.newPage();
        await page.goto(`${site.base}/index.html`);
        const r = await page.evaluate(scenario, { entry });
        assert.deepEqual(r.bad, [], `${entry}:\n  ${r.bad.join('\n  ')}`);
        assert.equal(r.still, true, `${entry}: the store works afterwards`);
      }
    } finally {
      await browser.close();
    }
  });
}
