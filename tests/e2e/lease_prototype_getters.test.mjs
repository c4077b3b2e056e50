// The lease client under accessors without a setter on `Object.prototype` (a
// page's polyfill or pollution) named like a field the SDK writes, in headless
// Chromium and Firefox against a real agentstore-server this test starts on
// loopback (the page is served by it; the SDK comes from pkg/,
// AGENTSTORE_PKG_DIR overrides it). abad3d6 made the store's objects define
// their fields; the lease client's fetch options were still assigned
// (web-sys's RequestInit setters), so with a getter-only `signal`, `headers`,
// `method` or `body` every lease call threw a TypeError past the module and
// never settled; js/lease.js's Web Lock options were assigned too (a
// getter-only `ifAvailable` read as "no Web Locks": leases went unlocked),
// and the package's guard built its ClosedError with Object.assign (a TypeError
// in its place).
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ROOT, adminRequest, launchBrowser, leaseServerBin, startLeaseServer } from './helpers.mjs';
import { launchFirefox } from '../../bench/webdriver.mjs';

const PKG = process.env.AGENTSTORE_PKG_DIR ?? join(ROOT, 'pkg');
const ADMIN = 'proto-getters-admin';

// Runs in the page's own realm (WebDriver's scripts may run in a sandbox of
// their own in Firefox, whose Object.prototype is not the page's). Each call
// is raced against 20 s (a lease call's own timeout is 30 s, so a call that
// threw past the module shows as "hung").
const PAGE = `<!doctype html><script type="module">
import init, { LeaseClient } from "/pkg/agentstore.js";
await init();
const bounded = (p) => Promise.race([
  Promise.resolve(p).then((v) => ({ v }), (e) => ({ e })),
  new Promise((r) => setTimeout(() => r({ hung: true }), 20000)),
]);
const own = (o, k) => { const d = o !== null && typeof o === "object" ? Object.getOwnPropertyDescriptor(o, k) : undefined; return d && d.value; };
window.run = async ([queue, admin]) => {
  const names = ["signal", "headers", "method", "body", "ifAvailable", "code", "status"];
  const out = { uncaught: [] };
  addEventListener("error", (e) => out.uncaught.push(String(e.error ?? e.message)));
  for (const k of names) Object.defineProperty(Object.prototype, k, { get() { return undefined; }, configurable: true });
  try {
    const client = new LeaseClient(location.origin, { accessToken: admin });
    const claimed = await bounded(client.claim(queue));
    out.claim = claimed.hung ? "hung" : claimed.e ? String(claimed.e) : "ok";
    const lease = claimed.v;
    if (lease) {
      const held = (await navigator.locks.query()).held.map((l) => l.name);
      out.locked = held.some((n) => n.startsWith("agentstore-lease ") && n.endsWith("/" + lease.itemId));
      let req;
      try { req = lease.prepareRequest(location.origin + "/x"); } catch (e) { out.prepare = String(e); }
      if (req) out.prepare = req.headers.get("X-Lease-Token") === lease.token ? "ok" : "no token header";
      const hb = await bounded(lease.heartbeat());
      out.heartbeat = hb.hung ? "hung" : hb.e ? String(hb.e) : "ok";
      const st = await bounded(lease.settle("done", { done: true }));
      out.settle = st.hung ? "hung" : st.e ? String(st.e) : "ok";
    }
    await bounded(client.close());
    client.free();
    let closed;
    try { closed = await client.claim(queue); } catch (e) { closed = e; }
    out.freed = [own(closed, "name"), own(closed, "code"), own(closed, "status")];
  } finally {
    for (const k of names) delete Object.prototype[k];
  }
  return out;
};
window.ready = true;
</script>`;

let dir;
let server;

before(async () => {
  assert.ok(existsSync(join(PKG, 'agentstore.js')), `${PKG} must hold the built SDK (scripts/build-pkg.sh)`);
  dir = mkdtempSync(join(tmpdir(), 'agentstore-proto-getters-'));
  mkdirSync(join(dir, 'www'));
  writeFileSync(join(dir, 'www', 'getters.html'), PAGE);
  server = await startLeaseServer(leaseServerBin(), [
    '--database', join(dir, 'leases.sqlite'), '--admin-token', ADMIN,
    '--www', join(dir, 'www'), '--pkg', PKG,
  ]);
});

after(async () => {
  await server?.stop();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

for (const engine of ['chromium', 'firefox']) {
  test(`${engine}: lease calls keep their fetch options, Web Lock and typed errors under prototype getters`, { timeout: 180_000 }, async () => {
    const browser = engine === 'chromium' ? await launchBrowser() : await launchFirefox();
    try {
      const page = await browser.newPage();
      const queue = `getters-${engine}-${Date.now()}`;
      const id = (await adminRequest(server.base, ADMIN, 'POST', `/v1/queues/${queue}/items`, { payload: {} })).body.id;
      await page.goto(`${server.base}/getters.html`);
      await page.waitForFunction(() => window.ready === true, null, { timeout: 30_000 });
      const out = await page.evaluate((a) => window.run(a), [queue, ADMIN]);
      assert.deepEqual(out, {
        uncaught: [], claim: 'ok', locked: true, prepare: 'ok', heartbeat: 'ok', settle: 'ok',
        freed: ['ClosedError', 'closed', 410],
      }, `${engine}: ${JSON.stringify(out)}`);
      const item = (await adminRequest(server.base, ADMIN, 'GET', `/v1/items/${id}`)).body;
      assert.equal(item.state, 'done');
    } finally {
      await browser.close();
    }
  });
}
