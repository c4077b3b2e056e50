// A page left while a work() handler awaits `lease.fetch` hands the item back
// for another worker; it never settles it `failed`. In headless Chromium and
// Firefox against a real agentstore-server this test starts on loopback (it
// serves the page, same origin; the SDK comes from pkg/, AGENTSTORE_PKG_DIR
// overrides it). The handler's `lease.fetch` goes to a second loopback server
// of this test that never answers, so the handler is still waiting when the
// page navigates away.
//
// Firefox fails the page's fetches when it unloads, before `pagehide`, and
// runs timers in between; Chromium fires `pagehide` first (helper-241). So in
// Firefox the handler threw a NetworkError, work() settled the item `failed`
// for good with the browser's message, and the `pagehide` beacon skipped the
// lease whose settle was out. Now work() holds a handler's failure back once
// the browser's own `beforeunload` came, and the beacon releases the lease.

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ROOT, adminRequest, launchBrowser, leaseServerBin, startLeaseServer, until } from './helpers.mjs';
import { launchFirefox } from '../../bench/webdriver.mjs';

const PKG = process.env.AGENTSTORE_PKG_DIR ?? join(ROOT, 'pkg');
const ADMIN = 'lease-navigation-admin';
// Odd rounds: the page forwards the browser's `beforeunload` as an event of
// its own after work() started (as SPA routers and wrappers do); before,
// that untrusted copy cleared the mark the browser's had set (helper-247).
const ROUNDS = 4;

// The page: work() on the queue in `?q=`, whose handler awaits `lease.fetch`
// of the never-answering server in `?api=`.
const PAGE = `<!doctype html><meta charset="utf-8"><title>work</title><script type="module">
import init, { LeaseClient } from '/pkg/agentstore.js';
await init();
const params = new URLSearchParams(location.search);
const client = new LeaseClient(location.origin, { accessToken: '${ADMIN}' });
window.worker = client.work(params.get('q'), async (lease) => {
  const r = await lease.fetch(params.get('api') + '/work?item=' + lease.itemId);
  return { status: r.status };
}, { pollIntervalMs: 200 });
if (params.get('forward')) {
  addEventListener('beforeunload', (e) => { if (e.isTrusted) dispatchEvent(new Event('beforeunload')); });
}
</script>`;

let dir;
let server;
let api;
let apiBase;
// Item ids whose `lease.fetch` reached the API server (and waits there).
const reached = new Set();
const waiting = new Set();

before(async () => {
  assert.ok(existsSync(join(PKG, 'agentstore.js')), `${PKG} must hold the built SDK (scripts/build-pkg.sh)`);
  dir = mkdtempSync(join(tmpdir(), 'agentstore-lease-navigation-'));
  mkdirSync(join(dir, 'www'));
  writeFileSync(join(dir, 'www', 'index.html'), '<!doctype html><title>left</title>');
  writeFileSync(join(dir, 'www', 'work.html'), PAGE);
  server = await startLeaseServer(leaseServerBin(), [
    '--database', join(dir, 'leases.sqlite'), '--admin-token', ADMIN,
    '--ttl-ms', '3000', '--heartbeat-ms', '500', '--reaper-ms', '200',
    '--claim-rate', '1000/s', '--auth-rate', '1000/s', '--idle-retry-ms', '100', '--www', join(dir, 'www'), '--pkg', PKG,
  ]);
  // CORS open (lease.fetch adds the fencing headers: a preflight); the
  // work request is never answered while the test runs.
  api = http.createServer((req, res) => {
    res.setHeader('Access-Control-Allow-Origin', '*');
    if (req.method === 'OPTIONS') {
      res.setHeader('Access-Control-Allow-Headers', '*');
      res.setHeader('Access-Control-Allow-Methods', '*');
      res.writeHead(204).end();
      return;
    }
    const item = new URL(req.url, 'http://x').searchParams.get('item');
    if (item) reached.add(Number(item));
    waiting.add(res);
  });
  await new Promise((r) => api.listen(0, '127.0.0.1', r));
  apiBase = `http://127.0.0.1:${api.address().port}`;
});

after(async () => {
  for (const res of waiting) res.destroy();
  api?.close();
  await server?.stop();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

function admin(method, path, body) {
  return adminRequest(server.base, ADMIN, method, path, body);
}

for (const engine of ['chromium', 'firefox']) {
  test(`${engine}: leaving the page while a handler awaits lease.fetch hands the item back, never fails it`, { timeout: 300_000 }, async () => {
    const browser = engine === 'chromium' ? await launchBrowser() : await launchFirefox();
    try {
      const page = engine === 'chromium' ? await (await browser.newContext()).newPage() : await browser.newPage();
      for (let round = 0; round < ROUNDS; round++) {
        const queue = `navigation-${engine}-${round}-${Date.now()}`;
        const { status, body } = await admin('POST', `/v1/queues/${queue}/items`, { payload: { round } });
        assert.equal(status, 201);
        const id = body.id;
        const forward = round % 2 ? '&forward=1' : '';
        await page.goto(`${server.base}/work.html?q=${queue}&api=${encodeURIComponent(apiBase)}${forward}`);
        // The handler is waiting on its lease.fetch.
        await until(`round ${round}: the handler's lease.fetch reaches the API`, 60_000, () => reached.has(id), 50);
        await page.goto(`${server.base}/index.html`);
        // The lease ends: released by the beacon or, when the browser drops it
        // (helper-244 saw Firefox drop beacons during WebDriver navigations),
        // at its 3 s TTL. Either way one attempt is counted and the item is
        // open; what this test proves is that it is never settled failed.
        const item = await until(`round ${round}: item ${id} stops running`, 60_000, async () => {
          const r = await admin('GET', `/v1/items/${id}`);
          return r.body.state !== 'running' && r.body;
        }, 100);
        assert.equal(item.state, 'open', `${engine} round ${round}: item ${id} is handed back, not ${item.state} (${item.last_error})`);
        assert.equal(item.attempts, 1, `${engine} round ${round}: the left lease counts one attempt`);
      }
    } finally {
      await browser.close();
    }
  });
}
