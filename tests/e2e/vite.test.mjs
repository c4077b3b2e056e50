// The Vite example (examples/vite) built with `vite build`, served with
// `vite preview` and driven in headless Chromium: three agent records written
// with mutate() and listed, then a work item claimed and settled against an
// agentstore-server this test starts on loopback (enqueued through the admin
// API; the page enrolls with a single-use enrollment token).
//
//   node --test tests/e2e/vite.test.mjs
//
// Needs pkg/ (scripts/test.sh builds it and runs scripts/package.mjs). Installs
// the example's npm packages from its lock when node_modules is missing.

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ROOT, launchBrowser, spawnListening, startLeaseServer } from './helpers.mjs';

const EXAMPLE = join(ROOT, 'examples', 'vite');
const PKG = join(ROOT, 'pkg');
const TARGET = process.env.CARGO_TARGET_DIR ?? join(ROOT, 'target');
const BIN = process.env.AGENTSTORE_SERVER_BIN ?? join(TARGET, 'debug', 'agentstore-server');
const ADMIN = 'vite-e2e-admin';

let dir;
let server;
let preview;
let base;
let site;
let browser;

function run(cmd, args, cwd) {
  const r = spawnSync(cmd, args, { cwd, stdio: 'inherit', timeout: 300_000 });
  assert.equal(r.status, 0, `${cmd} ${args.join(' ')} (in ${cwd})`);
}

async function admin(method, path, body) {
  const resp = await fetch(`${base}${path}`, {
    method,
    headers: { authorization: `Bearer ${ADMIN}`, 'content-type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  return { status: resp.status, body: resp.status === 204 ? null : await resp.json() };
}

async function enrollmentToken() {
  const { status, body } = await admin('POST', '/v1/admin/enrollment-tokens', {});
  assert.equal(status, 201);
  return body.token;
}


before(async () => {
  assert.ok(existsSync(join(PKG, 'agentstore.js')), 'pkg/ must hold the built SDK (scripts/test.sh builds it)');
  if (!existsSync(join(EXAMPLE, 'node_modules', 'vite'))) run('npm', ['ci', '--no-audit', '--no-fund'], EXAMPLE);
  run(process.execPath, [join(EXAMPLE, 'node_modules', 'vite', 'bin', 'vite.js'), 'build', '--logLevel', 'warn'], EXAMPLE);
  if (!existsSync(BIN)) run('cargo', ['build', '-q', '-p', 'agentstore-server'], ROOT);

  dir = mkdtempSync(join(tmpdir(), 'agentstore-vite-e2e-'));
  // Both servers bind a port of their own choosing and print it: a port
  // picked free and closed first could be taken by another process.
  server = await startLeaseServer(BIN, [
    '--database', join(dir, 'leases.sqlite'), '--admin-token', ADMIN,
    '--allow-origin', 'http://127.0.0.1:*', '--www', dir, '--pkg', dir,
  ]);
  base = server.base;
  preview = await spawnListening(process.execPath, [
    join(EXAMPLE, 'node_modules', 'vite', 'bin', 'vite.js'), 'preview', '--host', '127.0.0.1', '--port', '0', '--strictPort',
  ], { cwd: EXAMPLE, detached: true, listening: /Local:\s+http:\/\/127\.0\.0\.1:(\d+)\// });
  site = preview.base;
  assert.ok((await fetch(`${site}/`)).ok, 'vite preview serves the built page');

  browser = await launchBrowser();
});

after(async () => {
  await browser?.close();
  await preview?.stop();
  await server?.stop();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

test('vite build emits the wasm as a hashed asset next to the bundle', () => {
  const assets = readdirSync(join(EXAMPLE, 'dist', 'assets'));
  assert.equal(assets.filter((f) => /^agentstore_bg-.*\.wasm$/.test(f)).length, 1, `assets: ${assets}`);
  // The import/export module (pkg/io/), split off: its own chunk and wasm.
  assert.ok(assets.some((f) => /^agentstore_io-.*\.js$/.test(f)), `assets: ${assets}`);
  assert.ok(assets.some((f) => /^agentstore_io_bg-.*\.wasm$/.test(f)), `assets: ${assets}`);
  assert.ok(assets.some((f) => f.endsWith('.js')), `assets: ${assets}`);
});

test('the built page writes and lists records, then claims and settles a lease', async () => {
  const queue = `vite-${Date.now()}`;
  const { status, body } = await admin('POST', `/v1/queues/${queue}/items`, { payload: { task: 'greet' } });
  assert.equal(status, 201);
  const id = body.id;

  const context = await browser.newContext();
  const page = await context.newPage();
  const errors = [];
  page.on('pageerror', (e) => errors.push(String(e)));
  const wasm = page.waitForResponse((r) => r.url().endsWith('.wasm'));
  const fetched = [];
  page.on('request', (r) => fetched.push(r.url()));
  // When the import/export chunk is requested, the records must already be
  // listed: the first read never waits for it.
  const listedWhenIoRequested = [];
  await page.route(/\/assets\/agentstore_io-[^/]*\.js$/, async (route) => {
    listedWhenIoRequested.push(await page.$$eval('#records li', (lis) => lis.length));
    await route.continue();
  });
  const url = (enroll) => `${site}/?${new URLSearchParams({ server: base, enroll, queue })}`;

  await page.goto(url(await enrollmentToken()));
  assert.deepEqual(fetched.filter((u) => u.endsWith('.wasm')), [], 'no wasm before Run');
  await page.click('#run');
  await page.waitForSelector('body[data-runs="1"]', { timeout: 30_000 });
  const wasmResp = await wasm;
  assert.equal(wasmResp.headers()['content-type'], 'application/wasm');
  assert.equal(await page.textContent('#error'), '');
  assert.equal(await page.textContent('#exported'), '3 records exported');
  assert.equal(fetched.filter((u) => u.endsWith('.wasm')).length, 2, 'the entry wasm, then the import/export one');
  assert.deepEqual(listedWhenIoRequested, [3], 'the io chunk is requested once, after the records were listed');
  const records = await page.$$eval('#records li', (lis) => lis.map((li) => li.textContent));
  assert.deepEqual(records.map((t) => t.split(' — ')[0]), ['agent:reply', 'agent:summarise', 'agent:triage']);
  assert.ok(records.every((t) => /runs 1 \(rev 1-[0-9a-f]{32}\)/.test(t)), records.join('\n'));
  assert.equal(await page.textContent('#lease'), `settled item ${id}: done`);
  const seen = (await admin('GET', `/v1/items/${id}`)).body;
  assert.equal(seen.state, 'done');
  assert.deepEqual(seen.result, { handledBy: 'vite-example' });
  assert.equal(seen.epoch, 1);

  // A reload keeps the records (IndexedDB) and finds the queue empty.
  await page.goto(url(await enrollmentToken()));
  await page.click('#run');
  await page.waitForSelector('body[data-runs="1"]', { timeout: 30_000 });
  assert.equal(await page.textContent('#error'), '');
  const again = await page.$$eval('#records li', (lis) => lis.map((li) => li.textContent));
  assert.ok(again.every((t) => t.includes('runs 2 (rev 2-')), again.join('\n'));
  assert.equal(await page.textContent('#lease'), 'queue empty');
  assert.deepEqual(errors, []);
  await context.close();
});
