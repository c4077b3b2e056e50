// The README's JavaScript quickstart runs as written: its first ```js block
// (under "## Quickstart") is executed, unchanged, in a page of the server that
// `bash scripts/demo.sh` starts, twice (it must be re-runnable), and what it did
// is checked in IndexedDB and through the server's API.

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ROOT, SERVER_TIMEOUT_MS, launchBrowser, startDemo } from './helpers.mjs';

const ADMIN = randomBytes(24).toString('hex');

let demo;
let browser;
let tmp;

before(async () => {
  tmp = mkdtempSync(join(tmpdir(), 'agentstore-readme-e2e-'));
  demo = await startDemo({ AGENTSTORE_ADMIN_TOKEN: ADMIN, DATABASE: join(tmp, 'demo.sqlite') });
  browser = await launchBrowser();
}, { timeout: SERVER_TIMEOUT_MS + 120_000 });

after(async () => {
  await browser?.close().catch(() => {});
  await demo?.stop();
  if (tmp) rmSync(tmp, { recursive: true, force: true });
}, { timeout: 30_000 });

/** The first ```js block after the "## Quickstart" heading. */
function quickstart() {
  const readme = readFileSync(join(ROOT, 'README.md'), 'utf8');
  const from = readme.indexOf('\n## Quickstart');
  assert.ok(from >= 0, 'README has a Quickstart section');
  const m = /```js\n([\s\S]*?)```/.exec(readme.slice(from));
  assert.ok(m, 'the Quickstart section has a js block');
  return m[1];
}

async function adminGet(path) {
  const res = await fetch(`${demo.url}${path}`, { headers: { Authorization: `Bearer ${ADMIN}` } });
  assert.ok(res.ok, `${path}: ${res.status}`);
  return res.json();
}

test('the README quickstart is at most 20 lines and runs as written against the demo server', { timeout: 120_000 }, async () => {
  const code = quickstart();
  assert.ok(code.trimEnd().split('\n').length <= 20, `the quickstart has ${code.trimEnd().split('\n').length} lines`);

  const ctx = await browser.newContext();
  try {
    // A blank page of the demo server's origin (no demo app, so no other workers).
    await ctx.route(`${demo.url}/__quickstart__`, (route) => route.fulfill({
      contentType: 'text/html', body: '<!doctype html><title>quickstart</title>',
    }));
    const runs = [];
    for (let run = 1; run <= 2; run++) {
      const page = await ctx.newPage();
      const errors = [];
      const logs = [];
      page.on('pageerror', (e) => errors.push(e));
      page.on('console', (m) => logs.push(m.text()));
      await page.goto(`${demo.url}/__quickstart__`);
      // Run the block as the console would: top-level await, as an async function body.
      await page.evaluate(async (src) => {
        const AsyncFunction = (async () => {}).constructor;
        await new AsyncFunction(src)();
      }, code);
      assert.deepEqual(errors, []);
      runs.push(logs);
      // IndexedDB holds the first write, not the stale one.
      const stored = await page.evaluate(async () => {
        const { default: init, AgentStore } = await import('/pkg/agentstore.js');
        await init();
        const store = await AgentStore.open('quickstart');
        const r = await store.get('agent:1');
        store.close?.();
        return r;
      });
      assert.equal(stored.name, 'Triage bot');
      assert.equal(stored.recordType, 'agent');
      assert.match(stored._rev, new RegExp(`^${run}-`), `run ${run} wrote generation ${run}`);
      await page.close();
    }
    for (const logs of runs) {
      assert.ok(logs.includes('ConflictError true'), `the stale write was refused: ${JSON.stringify(logs)}`);
      assert.ok(logs.some((l) => /^1 record\(s\); settled item \d+$/.test(l)), `a lease was settled: ${JSON.stringify(logs)}`);
    }

    // Through the server: the two items the runs settled are done, with their results.
    const ids = runs.map((logs) => Number(/settled item (\d+)/.exec(logs.find((l) => l.includes('settled item')))[1]));
    assert.notEqual(ids[0], ids[1]);
    for (const id of ids) {
      const it = await adminGet(`/v1/items/${id}`);
      assert.equal(it.state, 'done');
      assert.equal(it.result.summary, `did ${it.payload.task}`);
      assert.equal(it.result.epoch, it.epoch);
    }
  } finally {
    await ctx.close();
  }
});
