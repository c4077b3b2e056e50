// A work() page restored from the back/forward cache is not "being left":
// a handler's failure after the restore settles `failed` at once. In
// headless Chromium (Playwright turns the cache off by default; this test
// turns it back on) against a real agentstore-server this test starts on
// loopback (it serves the page, same origin; the SDK comes from pkg/,
// AGENTSTORE_PKG_DIR overrides it). Firefox keeps a page whose work() listens
// for `beforeunload` (or that holds a Web Lock) out of the cache, so only
// Chromium restores one.
//
// Leaving the page fires the browser's own `beforeunload`, which marks the
// page as being left: a handler's failure is then held back 3 s
// (LEAVE_GRACE_MS) for the `pagehide` beacon. Before, the mark outlived the
// restore, and the first failure after it waited those 3 s (helper-249; with
// `releaseOnPagehide: false` until helper-253: the mark was cleared only with
// the `pagehide` mark, which that option never sets).

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { chromium } from 'playwright-core';
import { ROOT, adminRequest, leaseServerBin, startLeaseServer, until } from './helpers.mjs';

const PKG = process.env.AGENTSTORE_PKG_DIR ?? join(ROOT, 'pkg');
const ADMIN = 'lease-bfcache-admin';
// LEAVE_GRACE_MS (src/lease/work.rs): how long a failure is held back once
// the page began to be left.
const LEAVE_GRACE_MS = 3000;

// The page: work() on the queue in `?q=` (`releaseOnPagehide: false` with
// `&rp=0`), whose handler throws; `shows`
// lists the `pageshow` events' `persisted` heard, `threw` when the handler
// threw (Date.now()).
const PAGE = `<!doctype html><meta charset="utf-8"><title>work</title><script type="module">
import init, { LeaseClient } from '/pkg/agentstore.js';
await init();
window.shows = [];
addEventListener('pageshow', (e) => shows.push(e.persisted));
const params = new URLSearchParams(location.search);
const client = new LeaseClient(location.origin, { accessToken: '${ADMIN}', releaseOnPagehide: params.get('rp') !== '0' });
window.worker = client.work(params.get('q'), () => {
  window.threw = Date.now();
  throw new Error('the handler failed');
}, { pollIntervalMs: 100 });
window.started = true;
</script>`;

let dir;
let server;

before(async () => {
  assert.ok(existsSync(join(PKG, 'agentstore.js')), `${PKG} must hold the built SDK (scripts/build-pkg.sh)`);
  dir = mkdtempSync(join(tmpdir(), 'agentstore-lease-bfcache-'));
  mkdirSync(join(dir, 'www'));
  writeFileSync(join(dir, 'www', 'index.html'), '<!doctype html><title>left</title>');
  writeFileSync(join(dir, 'www', 'work.html'), PAGE);
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

async function failsAtOnceAfterRestore(query) {
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
    headless: true,
    timeout: 60_000,
    ignoreDefaultArgs: ['--disable-back-forward-cache'],
    args: ['--no-sandbox', '--disable-gpu', '--no-first-run'],
  });
  try {
    const page = await (await browser.newContext()).newPage();
    const queue = `bfcache-${Date.now()}`;
    await page.goto(`${server.base}/work.html?q=${queue}${query}`);
    await page.waitForFunction(() => window.started);
    await page.goto(`${server.base}/index.html`);
    await page.goBack({ waitUntil: 'commit' });
    // A page loaded anew would have no `pageshow` with `persisted` (its
    // script may even start after its first `pageshow`).
    await page.waitForFunction(() => window.shows?.includes(true));
    const { status, body } = await adminRequest(server.base, ADMIN, 'POST', `/v1/queues/${queue}/items`, { payload: {} });
    assert.equal(status, 201);
    const item = await until(`item ${body.id} settles`, 30_000, async () => {
      const r = await adminRequest(server.base, ADMIN, 'GET', `/v1/items/${body.id}`);
      return !['open', 'running'].includes(r.body.state) && { ...r.body, seen: Date.now() };
    }, 20);
    assert.equal(item.state, 'failed', `item ${body.id} is settled by the handler's outcome (${item.last_error})`);
    const threw = await page.evaluate(() => window.threw);
    assert.ok(item.seen - threw < LEAVE_GRACE_MS, `settled ${item.seen - threw} ms after the handler threw: not held back for a leaving that is over`);
  } finally {
    await browser.close();
  }
}

test('chromium: a handler failing after a back/forward cache restore is settled failed at once, not held back', { timeout: 120_000 }, () =>
  failsAtOnceAfterRestore(''));

test('chromium: the same without releaseOnPagehide (no pagehide mark to clear)', { timeout: 120_000 }, () =>
  failsAtOnceAfterRestore('&rp=0'));
