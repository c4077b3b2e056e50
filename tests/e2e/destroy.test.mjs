// AgentStore.destroy across two pages (two browsing contexts of one origin,
// each with its own connection), in headless Chromium against pkg/:
// the other page's connection is closed through `versionchange` (its
// onVersionChange runs, its later calls reject with ClosedError) and the
// database is deleted; a connection that ignores `versionchange` gives
// BlockedError after blockedTimeoutMs instead of a hang, and the deletion,
// queued in IndexedDB, completes once that connection closes.

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { ROOT, freePort, launchBrowser, sleep } from './helpers.mjs';

let server;
let browser;
let base;

async function waitFor(url, ms) {
  const until = Date.now() + ms;
  while (Date.now() < until) {
    try {
      if ((await fetch(url)).ok) return;
    } catch {}
    await sleep(100);
  }
  throw new Error(`${url} did not answer within ${ms} ms`);
}

/** Two pages of one origin with the SDK loaded (`window.mod`). */
async function twoPages() {
  const context = await browser.newContext();
  const pages = [await context.newPage(), await context.newPage()];
  for (const page of pages) {
    await page.goto(`${base}/data/agent-records.expected.json`);
    await page.evaluate(async () => {
      window.mod = await import('/pkg/agentstore.js');
      await window.mod.default();
    });
  }
  return { context, pages };
}

const errorOf = (page, fn, arg) => page.evaluate(async ({ src, arg }) => {
  try {
    await (0, eval)(src)(arg);
    return null;
  } catch (e) {
    return { name: e.name, code: e.code, isError: e instanceof Error };
  }
}, { src: fn.toString(), arg });

before(async () => {
  assert.ok(existsSync(join(ROOT, 'pkg/agentstore.js')), 'pkg/ must be built first (scripts/test.sh does)');
  const port = await freePort();
  server = spawn(process.execPath, ['tests/e2e/static-server.mjs', '--listen', `127.0.0.1:${port}`, '--www', 'www', '--pkg', 'pkg'], {
    cwd: ROOT,
    stdio: 'ignore',
  });
  base = `http://127.0.0.1:${port}`;
  await waitFor(`${base}/pkg/agentstore.js`, 20_000);
  browser = await launchBrowser();
});

after(async () => {
  await browser?.close();
  server?.kill();
});

test('destroy from one page closes the other page\'s store (onVersionChange, then ClosedError) and deletes the data', { timeout: 120_000 }, async () => {
  const { context, pages: [a, b] } = await twoPages();
  const name = `destroy-two-pages-${Date.now()}`;
  await a.evaluate(async (name) => {
    window.versionChanges = 0;
    window.store = await window.mod.AgentStore.open(name, { onVersionChange: () => { window.versionChanges++; } });
    await window.store.put({ _id: 'kept?', v: 1 });
  }, name);
  await b.evaluate((name) => window.mod.AgentStore.destroy(name, { blockedTimeoutMs: 10_000 }), name);
  await a.waitForFunction(() => window.versionChanges === 1, null, { timeout: 10_000 });
  assert.deepEqual(
    await errorOf(a, () => window.store.get('kept?')),
    { name: 'ClosedError', code: 'closed', isError: true },
  );
  assert.deepEqual(
    await errorOf(a, () => window.store.put({ _id: 'late' })),
    { name: 'ClosedError', code: 'closed', isError: true },
  );
  // The data is gone: a new connection (in either page) finds an empty store.
  const after = await b.evaluate(async (name) => {
    const s = await window.mod.AgentStore.open(name);
    const got = await s.get('kept?');
    const n = await s.count();
    s.close();
    return { got, n };
  }, name);
  assert.deepEqual(after, { got: null, n: 0 });
  await context.close();
});

test('a connection that ignores versionchange: BlockedError after the timeout, then the queued deletion completes', { timeout: 120_000 }, async () => {
  const { context, pages: [a, b] } = await twoPages();
  const name = `destroy-blocked-${Date.now()}`;
  await b.evaluate(async (name) => {
    const s = await window.mod.AgentStore.open(name);
    await s.put({ _id: 'x' });
    s.close();
  }, name);
  // Page A holds a raw connection without an onversionchange handler.
  await a.evaluate((name) => new Promise((ok, fail) => {
    const r = indexedDB.open(name);
    r.onsuccess = () => { window.raw = r.result; ok(); };
    r.onerror = () => fail(r.error);
  }), name);
  const started = Date.now();
  const e = await errorOf(b, (name) => window.mod.AgentStore.destroy(name, { blockedTimeoutMs: 300 }), name);
  assert.deepEqual(e, { name: 'BlockedError', code: 'blocked', isError: true });
  assert.ok(Date.now() - started < 60_000, 'rejected instead of hanging');
  await a.evaluate(() => window.raw.close());
  // IndexedDB kept the delete request queued: it completes now.
  await b.waitForFunction(async (name) => !(await indexedDB.databases()).some((d) => d.name === name), name, { timeout: 10_000, polling: 50 });
  await context.close();
});
