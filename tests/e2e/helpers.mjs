// Shared pieces of the demo's end-to-end tests: start scripts/demo.sh on a free
// loopback port, launch Chromium, open the page, check layout, take screenshots.
//
// Environment: CHROMIUM (default /usr/bin/chromium), E2E_SERVER_TIMEOUT_MS
// (default 900000: demo.sh may have to compile agentstore-server first).

import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { homedir, tmpdir } from 'node:os';
import { dirname, extname, join, normalize } from 'node:path';
import { createServer } from 'node:http';
import { readFile } from 'node:fs/promises';
import { fileURLToPath } from 'node:url';
import { after, before } from 'node:test';
import { spawnListening } from '../../scripts/listening.mjs';
import { chromium } from 'playwright-core';

export const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
export const ARTIFACTS = join(ROOT, 'artifacts');
export const SERVER_TIMEOUT_MS = Number(process.env.E2E_SERVER_TIMEOUT_MS ?? 900_000);
export const VIEWPORTS = { desktop: { width: 1280, height: 800 }, phone: { width: 390, height: 844 } };

export { spawnListening };

/**
 * Serves the built SDK `pkg` at `/pkg/` and a temporary directory holding
 * `files` (name → text) at `/`, with tests/e2e/static-server.mjs on a loopback
 * port it picks, for the life of the test file (registers node:test `before`
 * and `after`, which remove the directory). Returns `{ base }`, set once the
 * server listens.
 */
export function servePages(tag, pkg, files) {
  const site = { base: undefined };
  let dir;
  let server;
  before(async () => {
    assert.ok(existsSync(join(pkg, 'agentstore.js')), `${pkg} must hold the built SDK (scripts/build-pkg.sh)`);
    dir = mkdtempSync(join(tmpdir(), `agentstore-${tag}-`));
    for (const [name, text] of Object.entries(files)) writeFileSync(join(dir, name), text);
    server = await spawnListening(process.execPath, [join(ROOT, 'tests', 'e2e', 'static-server.mjs'), '--listen', '127.0.0.1:0', '--www', dir, '--pkg', pkg], {
      listening: /static server: http:\/\/127\.0\.0\.1:(\d+)\//,
    });
    site.base = server.base;
  });
  after(async () => {
    await server?.stop();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });
  return site;
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/**
 * Polls `check()` until it returns a truthy value (that value), every
 * `everyMs`; fails naming `what` after `ms`.
 */
export async function until(what, ms, check, everyMs = 500) {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    const last = await check();
    if (last) return last;
    await sleep(everyMs);
  }
  assert.fail(`timed out after ${ms} ms waiting for ${what}`);
}

/**
 * A call to the lease server at `url` with the bearer token `admin` (a
 * test's ground truth): the answer's JSON (null for an empty body); fails on
 * an answer that is not 2xx.
 */
export async function adminCall(url, admin, method, path, body) {
  const res = await fetch(`${url}${path}`, {
    method,
    headers: { Authorization: `Bearer ${admin}`, ...(body ? { 'Content-Type': 'application/json' } : {}) },
    body: body ? JSON.stringify(body) : undefined,
  });
  const text = await res.text();
  assert.ok(res.ok, `${method} ${path}: ${res.status} ${text}`);
  return text ? JSON.parse(text) : null;
}

/**
 * A call to the lease server at `url` with the bearer token `admin`, whatever
 * its status: `{status, body}` (body: the answer's JSON, null for a 204).
 */
export async function adminRequest(url, admin, method, path, body) {
  const resp = await fetch(`${url}${path}`, {
    method,
    headers: { authorization: `Bearer ${admin}`, 'content-type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  return { status: resp.status, body: resp.status === 204 ? null : await resp.json() };
}

/**
 * agentstore-server (`bin`) with `args` added, listening on 127.0.0.1:`port`
 * (0: a port it picks itself), as [`spawnListening`] resolves it. Its
 * "listening" log line is at info level, so RUST_LOG is info.
 */
export function startLeaseServer(bin, args, port = 0) {
  return spawnListening(bin, ['--listen', `127.0.0.1:${port}`, ...args], {
    listening: /agentstore-server listening addr=127\.0\.0\.1:(\d+)/,
    env: { RUST_LOG: 'info' },
  });
}

export function buildPkgIfMissing() {
  if (existsSync(join(ROOT, 'pkg/agentstore.js'))) return;
  const r = spawnSync('bash', ['scripts/build-pkg.sh', '--quiet'], {
    cwd: ROOT, stdio: 'inherit', timeout: 900_000,
    env: { ...process.env, PATH: `${join(homedir(), '.cargo', 'bin')}:${process.env.PATH}` },
  });
  assert.equal(r.status, 0, 'scripts/build-pkg.sh failed');
}

/**
 * Starts `bash scripts/demo.sh` (its own process group) with `env` added, and
 * resolves once it prints its URL: `{url, port, log(), stop()}`. The server
 * binds a port itself (PORT=0) and demo.sh waits for its own "listening" line,
 * so no other process can take the port between a probe and the bind.
 */
export function startDemo(env = {}) {
  mkdirSync(ARTIFACTS, { recursive: true });
  buildPkgIfMissing();
  return new Promise((resolve, reject) => {
    let log = '';
    const child = spawn('bash', ['scripts/demo.sh'], {
      cwd: ROOT,
      detached: true, // own process group: stopped as a whole
      // PORT 0: the server binds a port itself and demo.sh prints the URL it got.
      env: { ...process.env, PORT: '0', DEMO_SKIP_BUILD: '1', ...env },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    const stop = async () => {
      if (child.exitCode !== null || child.signalCode !== null) return;
      const exited = new Promise((r) => child.once('exit', r));
      try { process.kill(-child.pid, 'SIGTERM'); } catch { /* already gone */ }
      const done = await Promise.race([exited.then(() => true), sleep(10_000).then(() => false)]);
      if (!done) { try { process.kill(-child.pid, 'SIGKILL'); } catch { /* gone */ } }
    };
    const timer = setTimeout(() => { stop(); reject(new Error(`demo.sh printed no URL within ${SERVER_TIMEOUT_MS} ms:\n${log}`)); }, SERVER_TIMEOUT_MS);
    child.stderr.on('data', (d) => { log += d; });
    child.stdout.on('data', (d) => {
      log += d;
      const m = /agentstore demo: (http:\/\/\S+)/.exec(log);
      if (m) { clearTimeout(timer); const url = m[1].replace(/\/$/, ''); resolve({ url, port: Number(new URL(url).port), log: () => log, stop, child }); }
    });
    child.on('exit', (code) => { clearTimeout(timer); reject(new Error(`demo.sh exited (${code}):\n${log}`)); });
  });
}

/**
 * The lease server's debug binary (`AGENTSTORE_SERVER_BIN`, else
 * `debug/agentstore-server` under `CARGO_TARGET_DIR` or target/), built with
 * `cargo build -p agentstore-server` when it is not there yet.
 */
export function leaseServerBin() {
  const bin = process.env.AGENTSTORE_SERVER_BIN
    ?? join(process.env.CARGO_TARGET_DIR ?? join(ROOT, 'target'), 'debug', 'agentstore-server');
  if (!existsSync(bin)) {
    const built = spawnSync('cargo', ['build', '-q', '-p', 'agentstore-server'], { cwd: ROOT, stdio: 'inherit' });
    assert.equal(built.status, 0, 'cargo build -p agentstore-server');
  }
  return bin;
}

/** Headless Chromium. */
export function launchBrowser() {
  return chromium.launch({
    executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
    headless: true,
    timeout: 60_000,
    args: ['--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update', '--disable-sync', '--no-first-run'],
  });
}

/**
 * A page of the demo, loaded and ready (in a fresh context unless one is
 * given). `page.errors` collects uncaught page errors.
 */
export async function openDemo(browser, url, viewport = VIEWPORTS.desktop, context = null) {
  const ctx = context ?? await browser.newContext({ viewport });
  const page = await ctx.newPage();
  page.setDefaultTimeout(30_000);
  page.errors = [];
  page.on('pageerror', (e) => page.errors.push(e));
  await page.goto(url);
  await page.waitForSelector('body[data-ready="true"], #error-bar:not([hidden])', { state: 'attached' });
  assert.equal(await page.textContent('[data-testid=sdk-state]'), 'ready', await page.textContent('[data-testid=error]'));
  return { ctx, page };
}

export async function text(page, testid) {
  return (await page.textContent(`[data-testid="${testid}"]`)).trim();
}

export async function assertNoError(page) {
  assert.equal(await page.isVisible('[data-testid=error]'), false, `unexpected error: ${await page.textContent('[data-testid=error]')}`);
  assert.deepEqual(page.errors, []);
}

/**
 * Nothing sticks out: the page is no wider than the viewport, and no block
 * element's content is wider than its box (outside the scroll containers
 * meant for it: tables, <pre>, <textarea>).
 */
export async function assertNothingOverflows(page) {
  const problems = await page.evaluate(() => {
    const out = [];
    const doc = document.documentElement;
    if (doc.scrollWidth > doc.clientWidth) out.push(`page ${doc.scrollWidth} > viewport ${doc.clientWidth}`);
    for (const el of document.querySelectorAll('body *')) {
      if (el.closest('.table-wrap, pre, textarea, input, select, .visually-hidden, [hidden]')) continue;
      const style = getComputedStyle(el);
      if (style.display === 'inline' || style.display === 'none' || el.clientWidth === 0) continue;
      if (el.scrollWidth > el.clientWidth + 1) {
        out.push(`${el.tagName.toLowerCase()}#${el.id}.${el.className}: content ${el.scrollWidth} > box ${el.clientWidth}`);
      }
      const r = el.getBoundingClientRect();
      if (r.width && (r.right > doc.clientWidth + 1 || r.left < -1)) out.push(`${el.tagName.toLowerCase()}#${el.id} outside the viewport`);
    }
    return out;
  });
  assert.deepEqual(problems, [], `layout overflows at ${JSON.stringify(page.viewportSize())}`);
}

/** artifacts/<name>-<w>x<h>[-full].png; returns the path. */
export async function shot(page, name, fullPage = false) {
  const { width, height } = page.viewportSize();
  const path = join(ARTIFACTS, `${name}-${width}x${height}${fullPage ? '-full' : ''}.png`);
  await page.screenshot({ path, fullPage });
  return path;
}

/**
 * One demo for a test file: registers `before`/`after` hooks that start
 * scripts/demo.sh (`startDemo`) on a fresh SQLite file with a random admin
 * token and `env`, and launch Chromium, and stop both. Returns `{admin, demo,
 * browser, api}`: `demo` and `browser` are set once `before` ran, `api(method,
 * path, body)` calls the lease server as the admin (`adminCall`).
 */
export function demoForTests(tag, env = {}) {
  const t = { admin: randomBytes(24).toString('hex'), demo: null, browser: null };
  let tmp;
  before(async () => {
    tmp = mkdtempSync(join(tmpdir(), `agentstore-${tag}-e2e-`));
    t.demo = await startDemo({ AGENTSTORE_ADMIN_TOKEN: t.admin, DATABASE: join(tmp, 'demo.sqlite'), ...env });
    t.browser = await launchBrowser();
  }, { timeout: SERVER_TIMEOUT_MS + 120_000 });
  after(async () => {
    await t.browser?.close().catch(() => {});
    await t.demo?.stop();
    if (tmp) rmSync(tmp, { recursive: true, force: true });
  }, { timeout: 30_000 });
  t.api = (method, path, body) => adminCall(t.demo.url, t.admin, method, path, body);
  return t;
}

/**
 * Serves the built SDK (`AGENTSTORE_PKG_DIR`, else pkg/) at `/pkg/`, the
 * page `/page.html` (a module script `/page.js`), and the scripts `files`
 * (path → text, `/page.js` among them) from an in-process HTTP server on a
 * loopback port, for the life of the test file (registers node:test
 * `before`, which builds pkg/ if it is missing, and `after`). Returns
 * `{ origin }`, set once the server listens.
 */
export function servePkgPage(files) {
  const pkg = process.env.AGENTSTORE_PKG_DIR ?? join(ROOT, 'pkg');
  const mime = { '.js': 'text/javascript', '.wasm': 'application/wasm', '.html': 'text/html' };
  const site = { origin: undefined };
  let server;
  before(async () => {
    buildPkgIfMissing();
    server = createServer(async (req, res) => {
      const path = decodeURIComponent(new URL(req.url, 'http://x').pathname);
      let body = files[path];
      if (path === '/page.html') body = '<!doctype html><meta charset="utf-8"><script type="module" src="/page.js"></script>';
      else if (body === undefined && path.startsWith('/pkg/')) body = await readFile(join(pkg, normalize(path.slice(5)))).catch(() => null);
      if (body == null) return res.writeHead(404).end();
      res.writeHead(200, { 'content-type': mime[extname(path)] ?? 'application/octet-stream', 'cache-control': 'no-store' }).end(body);
    });
    await new Promise((r) => server.listen(0, '127.0.0.1', r));
    site.origin = `http://127.0.0.1:${server.address().port}`;
  });
  after(() => server?.close());
  return site;
}
