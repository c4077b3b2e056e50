// The demo page outlives its server: restarted on a fresh database, the
// server knows none of the page's credentials. The panel's renewal backs off
// (with jitter) instead of spending a refresh and a dozen enrollments of the
// credential rate (`--auth-rate`, per client address) at every poll, and
// once the new run's tokens are served the panel and its workers enroll
// again, with no request refused for the rate.
//
// The server is run here (not by demo.sh) so that the restart can keep the
// old run's /runtime/demo.json in place for as long as the test looks.
//
//   node --test tests/e2e/demo_restart.test.mjs

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ROOT, adminCall, buildPkgIfMissing, launchBrowser, leaseServerBin, openDemo, startLeaseServer, until } from './helpers.mjs';

const PKG = join(ROOT, 'pkg');
// The lease server's binary, built if missing (helpers.mjs `leaseServerBin`).
let BIN;
const ADMIN = 'restart-e2e-admin';
const QUEUE = 'demo';

let dir;
let browser;
let server;

before(async () => {
  buildPkgIfMissing();
  BIN = leaseServerBin();
  dir = mkdtempSync(join(tmpdir(), 'agentstore-restart-e2e-'));
  // The served www/: the repository's files plus runtime/, as demo.sh makes it.
  mkdirSync(join(dir, 'www', 'runtime'), { recursive: true });
  for (const entry of readdirSync(join(ROOT, 'www'))) {
    if (entry !== 'runtime') symlinkSync(join(ROOT, 'www', entry), join(dir, 'www', entry));
  }
  browser = await launchBrowser();
}, { timeout: 900_000 });

after(async () => {
  await browser?.close().catch(() => {});
  await server?.stop();
  if (dir) rmSync(dir, { recursive: true, force: true });
}, { timeout: 30_000 });

function start(db, port = 0) {
  return startLeaseServer(BIN, [
    '--database', join(dir, db), '--admin-token', ADMIN, '--www', join(dir, 'www'), '--pkg', PKG,
    '--ttl-ms', '6000', '--heartbeat-ms', '1000', '--reaper-ms', '1000', '--idle-retry-ms', '1000', '--claim-rate', '20/s',
  ], port);
}

/** Enrollment tokens of `role` for the demo queue, from the server at `base`. */
async function tokens(base, role, n) {
  const out = [];
  for (let i = 0; i < n; i++) {
    out.push((await adminCall(base, ADMIN, 'POST', '/v1/admin/enrollment-tokens', { role, queues: [QUEUE] })).token);
  }
  return out;
}

/** The page's runtime file, as demo.sh writes it, with tokens from `base`. */
async function writeRuntime(base, runId) {
  const runtime = {
    runId, queue: QUEUE, ttlMs: 6000, heartbeatMs: 1000, reaperMs: 1000, maxRedeliveries: 5,
    enrollmentTokens: await tokens(base, 'worker', 6),
    // As many as demo.sh makes: a pool the old loop could walk for a while.
    producerTokens: await tokens(base, 'producer', 100),
  };
  writeFileSync(join(dir, 'www', 'runtime', 'demo.json'), JSON.stringify(runtime));
}

async function scrape(base, name) {
  const res = await fetch(`${base}/metrics`, { headers: { Authorization: `Bearer ${ADMIN}` } });
  assert.equal(res.status, 200);
  return (await res.text()).split('\n').filter((l) => l.startsWith(name))
    .reduce((sum, l) => sum + Number(l.split(' ').at(-1)), 0);
}

test('after a server restart the panel renews its credentials with backoff, not at every poll', { timeout: 240_000 }, async (t) => {
  server = await start('a.sqlite');
  await writeRuntime(server.base, 'run-a');
  const { page } = await openDemo(browser, server.base);
  await page.waitForSelector('body[data-workers-ready="true"]', { state: 'attached', timeout: 60_000 });

  let polls = 0;
  const panelCredentialCalls = [];
  page.on('request', (req) => {
    const url = req.url();
    // Every poll that fails looks for a new run (a request or two; none
    // sent for the queue while the renewal backs off).
    if (url.endsWith('/runtime/demo.json')) polls += 1;
    // The panel's own: its enrollments name it, and only it refreshes
    // through the page's fetch (the workers' SDK clients refresh too, once
    // each, and then stop: their cards say why).
    if (url.endsWith('/v1/workers/enroll') && (req.postData() ?? '').includes('"demo panel"')) panelCredentialCalls.push(url);
  });

  // Restarted on a fresh database, on the same port; the old run's
  // runtime file stays, so there is no new run to move to yet.
  const port = server.port;
  await server.stop();
  server = await start('b.sqlite', port);
  const p0 = polls;
  await until('eight looks for a new run (four polls at least)', 60_000, () => polls >= p0 + 8, 200);
  t.diagnostic(`${panelCredentialCalls.length} panel enrollments, ${polls - p0} looks for a new run`);
  assert.ok(panelCredentialCalls.length <= 10,
    `the panel sent ${panelCredentialCalls.length} enrollments while it looked for a new run ${polls - p0} times (a renewal sends two, backing off)`);
  assert.match(await page.textContent('[data-testid=workers-state]'), /Could not read the queue: .*(renewing them again in|unused enrollment token|missing or invalid credentials)/);

  // The new run's tokens served: the panel and the workers move to it.
  await writeRuntime(server.base, 'run-b');
  const item = await adminCall(server.base, ADMIN, 'POST', `/v1/queues/${QUEUE}/items`, { payload: { task: 'after-restart', ms: 200 } });
  await until('the item enqueued after the restart to be done', 90_000, async () =>
    (await adminCall(server.base, ADMIN, 'GET', `/v1/items/${item.id}`)).state === 'done');
  await page.waitForFunction(() => /item\(s\) in queue/.test(document.querySelector('[data-testid=workers-state]').textContent), null, { timeout: 60_000 });
  await until('every worker card to poll again', 60_000, async () => {
    const states = await page.$$eval('.worker .badge', (b) => b.map((x) => x.dataset.state));
    return states.length === 3 && states.every((s) => s === 'polling' || s === 'working');
  });
  assert.equal(await scrape(server.base, 'agentstore_rate_limited_total'), 0, 'no request refused for the rate');
});
