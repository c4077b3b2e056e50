// A dedicated Web Worker's leases when its page is left (docs/browser-worker-leases.md,
// "No `pagehide` in workers"), in headless Chromium and Firefox against a real
// agentstore-server this test starts on loopback (the page is served by it, same
// origin; the SDK comes from pkg/, AGENTSTORE_PKG_DIR overrides it).
//
// The worker is terminated with its page before it runs what the page's `pagehide`
// posted to it, so the guide's earlier advice (post a message, `client.close()` in the
// worker) released no lease of 9 in Firefox, and in Chromium 1 of 9 in one run and all
// in another (helper-255). The
// page sending the beacons itself, with the tokens the worker posted, releases each.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ROOT, adminRequest, launchBrowser, leaseServerBin, sleep, startLeaseServer } from './helpers.mjs';
import { launchFirefox } from '../../bench/webdriver.mjs';

const PKG = process.env.AGENTSTORE_PKG_DIR ?? join(ROOT, 'pkg');
const ADMIN = 'worker-leave-admin';

// The worker: work() whose handlers hold their leases; each lease's id and
// token go to the page while its handler runs.
const WORKER = `
import init, { LeaseClient } from "/pkg/agentstore.js";
await init();
self.onmessage = ({ data: { queue, admin } }) => {
  const client = new LeaseClient(self.location.origin, { accessToken: admin });
  client.work(queue, async (lease) => {
    self.postMessage({ held: { id: lease.itemId, token: lease.token } });
    await new Promise((_, no) => lease.signal.addEventListener("abort", () => no(lease.signal.reason)));
  }, { concurrency: 3, pollIntervalMs: 50 });
};
self.postMessage({ ready: true });
`;

// The page: starts the worker, keeps the posted tokens, and on pagehide
// releases each by beacon (the guide's way).
const PAGE = `<!doctype html><script type="module">
const held = new Map();
const worker = new Worker("/worker.js", { type: "module" });
worker.onmessage = ({ data }) => {
  if (data.held) held.set(data.held.id, data.held.token);
  // Messages sent before the worker's module has run would find no listener.
  if (data.ready) window.start = (queue, admin) => worker.postMessage({ queue, admin });
};
window.held = () => held.size;
addEventListener("pagehide", () => {
  for (const [id, token] of held) navigator.sendBeacon("/v1/items/" + id + "/release", JSON.stringify({ token }));
});
</script>`;

let dir;
let server;

before(async () => {
  assert.ok(existsSync(join(PKG, 'agentstore.js')), `${PKG} must hold the built SDK (scripts/build-pkg.sh)`);
  dir = mkdtempSync(join(tmpdir(), 'agentstore-worker-leave-'));
  mkdirSync(join(dir, 'www'));
  writeFileSync(join(dir, 'www', 'index.html'), '<!doctype html><title>left</title>');
  writeFileSync(join(dir, 'www', 'leave.html'), PAGE);
  writeFileSync(join(dir, 'www', 'worker.js'), WORKER);
  server = await startLeaseServer(leaseServerBin(), [
    '--database', join(dir, 'leases.sqlite'), '--admin-token', ADMIN,
    '--ttl-ms', '60000', '--heartbeat-ms', '1000', '--reaper-ms', '200',
    '--www', join(dir, 'www'), '--pkg', PKG,
  ]);
});

after(async () => {
  await server?.stop();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

const admin = (method, path, body) => adminRequest(server.base, ADMIN, method, path, body);

for (const engine of ['chromium', 'firefox']) {
  test(`${engine}: a dedicated worker's leases are released at once when its page is left, by the page's beacons`, { timeout: 180_000 }, async () => {
    const browser = engine === 'chromium' ? await launchBrowser() : await launchFirefox();
    try {
      const bad = [];
      for (let round = 0; round < 3; round++) {
        const page = await browser.newPage();
        const queue = `leave-${engine}-${round}-${Date.now()}`;
        const ids = [];
        for (let n = 0; n < 3; n++) ids.push((await admin('POST', `/v1/queues/${queue}/items`, { payload: { n } })).body.id);
        await page.goto(`${server.base}/leave.html`);
        await page.waitForFunction(() => typeof window.start === 'function', null, { timeout: 30_000 });
        await page.evaluate(([q, a]) => window.start(q, a), [queue, ADMIN]);
        await page.waitForFunction(() => window.held() === 3, null, { timeout: 30_000 });
        await page.goto(`${server.base}/index.html`);
        // Until all three are open again, for at most 20 s: well within the
        // 60 s TTL, so only a release reopens them.
        let states = [];
        for (const end = Date.now() + 20_000; Date.now() < end; await sleep(100)) {
          states = await Promise.all(ids.map(async (id) => (await admin('GET', `/v1/items/${id}`)).body.state));
          if (states.every((s) => s === 'open')) break;
        }
        ids.forEach((id, i) => {
          if (states[i] !== 'open') bad.push(`round ${round}: item ${id} ${states[i]}`);
        });
      }
      assert.deepEqual(bad, [], `${engine}:\n  ${bad.join('\n  ')}`);
    } finally {
      await browser.close();
    }
  });
}
