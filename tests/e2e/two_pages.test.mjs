// Races across two pages (two IndexedDB connections in two browsing contexts
// of one origin), in headless Chromium: same-tick creates (case C-S2) and
// concurrent `mutate` increments. The SDK is loaded from pkg/ (built by the
// test command) through the static server that mirrors the demo server's layout.

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
let server;
let browser;
let base;
let userDir;

function freePort() {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

async function waitFor(url, ms) {
  const until = Date.now() + ms;
  while (Date.now() < until) {
    try {
      if ((await fetch(url)).ok) return;
    } catch {}
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`${url} did not answer within ${ms} ms`);
}

/** Two pages of one origin, each with the SDK loaded and a store open. */
async function twoPages(dbName) {
  const context = await browser.newContext();
  const pages = [await context.newPage(), await context.newPage()];
  for (const page of pages) {
    await page.goto(`${base}/data/agent-records.expected.json`);
    await page.evaluate(async (name) => {
      const mod = await import('/pkg/agentstore.js');
      await mod.default();
      window.store = await mod.AgentStore.open(name);
    }, dbName);
  }
  return { context, pages };
}

before(async () => {
  assert.ok(existsSync(join(ROOT, 'pkg/agentstore.js')), 'pkg/ must be built first (scripts/test.sh does)');
  const port = await freePort();
  server = spawn(process.execPath, ['tests/e2e/static-server.mjs', '--listen', `127.0.0.1:${port}`, '--www', 'www', '--pkg', 'pkg'], {
    cwd: ROOT,
    stdio: 'ignore',
  });
  base = `http://127.0.0.1:${port}`;
  await waitFor(`${base}/pkg/agentstore.js`, 20_000);
  userDir = mkdtempSync(join(tmpdir(), 'agentstore-2p-'));
  browser = await chromium.launch({
    executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
    headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update', '--disable-sync', '--no-first-run'],
    timeout: 60_000,
  });
});

after(async () => {
  await browser?.close();
  server?.kill();
  if (userDir) rmSync(userDir, { recursive: true, force: true });
});

test('two creates of one id from two pages in the same tick: exactly one wins, over 40 rounds', { timeout: 120_000 }, async () => {
  const { context, pages } = await twoPages('race-two-pages');
  for (let round = 0; round < 40; round++) {
    const at = Date.now() + 40; // both pages spin to this instant, then write
    const outcomes = await Promise.all(pages.map((page, i) => page.evaluate(async ({ round, at, who }) => {
      while (Date.now() < at) { /* barrier: spin to the shared instant */ }
      try {
        const r = await window.store.put({ _id: `same-${round}`, who });
        return { ok: true, rev: r.rev, who };
      } catch (e) {
        return { ok: false, name: e.name, code: e.code, status: e.status, who };
      }
    }, { round, at, who: i === 0 ? 'A' : 'B' })));
    const wins = outcomes.filter((o) => o.ok);
    const losses = outcomes.filter((o) => !o.ok);
    assert.equal(wins.length, 1, `round ${round}: ${JSON.stringify(outcomes)}`);
    assert.match(wins[0].rev, /^1-[0-9a-f]{32}$/);
    assert.deepEqual([losses[0].name, losses[0].code, losses[0].status], ['ConflictError', 'conflict', 409]);
    const stored = await pages[1].evaluate((id) => window.store.get(id), `same-${round}`);
    assert.equal(stored.who, wins[0].who, 'the stored body is the winner\'s');
  }
  await context.close();
});

test('2 pages x 250 mutate increments on one record = exactly 500', { timeout: 120_000 }, async () => {
  const { context, pages } = await twoPages('mutate-two-pages');
  await pages[0].evaluate(() => window.store.put({ _id: 'counter', n: 0 }));
  const at = Date.now() + 200;
  await Promise.all(pages.map((page) => page.evaluate(async (at) => {
    while (Date.now() < at) { /* start together */ }
    const inc = async (cur) => ({ ...cur, n: cur.n + 1 });
    const all = [];
    for (let i = 0; i < 250; i++) all.push(window.store.mutate('counter', inc, { retries: 1000 }));
    await Promise.all(all);
  }, at)));
  const got = await pages[1].evaluate(() => window.store.get('counter'));
  assert.equal(got.n, 500);
  assert.match(got._rev, /^501-/);
  await context.close();
});
