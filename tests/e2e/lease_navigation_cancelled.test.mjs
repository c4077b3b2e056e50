// A `beforeunload` that no navigation follows (a link answered 204 No
// Content, as a download or a navigation the page cancels) does not hold a
// work() handler's failure back for good: one several seconds after it is
// settled `failed` at once. In headless Chromium and Firefox against a real
// agentstore-server this test starts on loopback (it serves the page, same
// origin; the SDK comes from pkg/, AGENTSTORE_PKG_DIR overrides it); the link
// goes to a second loopback server of this test that answers 204.
//
// The browser's own `beforeunload` marks the page as being left, and a
// handler's failure is then held back 3 s (LEAVE_GRACE_MS) for the
// `pagehide` beacon. Before, a `beforeunload` without a navigation left the
// mark set, and the next failure, however much later, waited those 3 s for
// nothing (helper-258). Now only a failure within LEAVE_WINDOW_MS of the
// `beforeunload` is held.

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ROOT, adminRequest, launchBrowser, leaseServerBin, sleep, startLeaseServer, until } from './helpers.mjs';
import { launchFirefox } from '../../bench/webdriver.mjs';

const PKG = process.env.AGENTSTORE_PKG_DIR ?? join(ROOT, 'pkg');
const ADMIN = 'lease-navigation-cancelled-admin';
// LEAVE_GRACE_MS and LEAVE_WINDOW_MS (src/lease/work.rs): how long a failure
// is held back once the page began to be left, and how long after the
// `beforeunload` a failure counts as the leaving's.
const LEAVE_GRACE_MS = 3000;
const LEAVE_WINDOW_MS = 10000;

// The page: work() on the queue in `?q=`, whose handler throws (`threw`:
// when, Date.now()); `unloads` counts the `beforeunload` events heard, and
// the link `#away` goes to `?to=` (answered 204: the page stays).
const PAGE = `<!doctype html><meta charset="utf-8"><title>work</title>
<a id="away" href="">away</a><script type="module">
import init, { LeaseClient } from '/pkg/agentstore.js';
await init();
const params = new URLSearchParams(location.search);
document.getElementById('away').href = params.get('to');
window.unloads = 0;
addEventListener('beforeunload', () => { window.unloads += 1; });
const client = new LeaseClient(location.origin, { accessToken: '${ADMIN}' });
window.worker = client.work(params.get('q'), () => {
  window.threw = Date.now();
  throw new Error('the handler failed');
}, { pollIntervalMs: 100 });
window.started = true;
</script>`;

let dir;
let server;
let nowhere;
let nowhereBase;
let asked = 0;

before(async () => {
  assert.ok(existsSync(join(PKG, 'agentstore.js')), `${PKG} must hold the built SDK (scripts/build-pkg.sh)`);
  dir = mkdtempSync(join(tmpdir(), 'agentstore-lease-navigation-cancelled-'));
  mkdirSync(join(dir, 'www'));
  writeFileSync(join(dir, 'www', 'work.html'), PAGE);
  server = await startLeaseServer(leaseServerBin(), [
    '--database', join(dir, 'leases.sqlite'), '--admin-token', ADMIN,
    '--ttl-ms', '3000', '--heartbeat-ms', '500', '--reaper-ms', '200',
    '--claim-rate', '1000/s', '--auth-rate', '1000/s', '--idle-retry-ms', '100', '--www', join(dir, 'www'), '--pkg', PKG,
  ]);
  // 204 No Content: the browser starts the navigation (its `beforeunload`
  // fires) and then stays on the page.
  nowhere = http.createServer((req, res) => {
    asked += 1;
    res.writeHead(204).end();
  });
  await new Promise((r) => nowhere.listen(0, '127.0.0.1', r));
  nowhereBase = `http://127.0.0.1:${nowhere.address().port}`;
});

after(async () => {
  nowhere?.close();
  await server?.stop();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

for (const engine of ['chromium', 'firefox']) {
  test(`${engine}: a handler failing seconds after a beforeunload that led nowhere is settled failed at once`, { timeout: 180_000 }, async () => {
    const browser = engine === 'chromium' ? await launchBrowser() : await launchFirefox();
    try {
      const page = engine === 'chromium' ? await (await browser.newContext()).newPage() : await browser.newPage();
      const queue = `navigation-cancelled-${engine}-${Date.now()}`;
      await page.goto(`${server.base}/work.html?q=${queue}&to=${encodeURIComponent(`${nowhereBase}/file`)}`);
      await page.waitForFunction(() => window.started);
      const before = asked;
      await page.evaluate(() => { document.getElementById('away').click(); });
      await until(`${engine}: the link's request reaches the 204 server`, 30_000, () => asked > before, 50);
      assert.equal(await page.evaluate(() => window.unloads), 1, 'the browser fired its beforeunload');
      // Time passing is the point: past the window, the page stayed.
      await sleep(LEAVE_WINDOW_MS + 2000);
      assert.equal(await page.evaluate(() => window.started), true, 'the page is still there');
      const { status, body } = await adminRequest(server.base, ADMIN, 'POST', `/v1/queues/${queue}/items`, { payload: {} });
      assert.equal(status, 201);
      const item = await until(`${engine}: item ${body.id} settles`, 30_000, async () => {
        const r = await adminRequest(server.base, ADMIN, 'GET', `/v1/items/${body.id}`);
        return !['open', 'running'].includes(r.body.state) && { ...r.body, seen: Date.now() };
      }, 20);
      assert.equal(item.state, 'failed', `item ${body.id} is settled by the handler's outcome (${item.last_error})`);
      const threw = await page.evaluate(() => window.threw);
      assert.ok(item.seen - threw < LEAVE_GRACE_MS, `${engine}: settled ${item.seen - threw} ms after the handler threw: held back for a beforeunload ${LEAVE_WINDOW_MS + 2000} ms before`);
    } finally {
      await browser.close();
    }
  });
}
