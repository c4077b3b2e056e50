// Runs every JavaScript sample in docs/*.md in headless Chromium.
//
// Every fenced block whose language is js / javascript / mjs is a sample;
// `js worker` blocks run inside a dedicated module Web Worker, the rest in a
// page. Each sample gets a fresh browser context (empty IndexedDB) and a fresh
// agentstore-server on loopback that also serves the page and pkg/ (same
// origin). `from "agentstore"` is resolved to that server's /pkg/agentstore.js.
// The documented prelude (docs/api.md, "Running the samples") defines:
//   SERVER                 the lease server's base URL
//   enrollmentToken        a fresh single-use enrollment token
//   newEnrollmentToken()   another one
//   enqueue(queue, payload) → item id   (the admin API: stands in for your backend)
//   item(id) → the item as the server sees it (admin API)
//   assert(condition, message)          throws when condition is falsy
// A sample passes when it finishes without throwing (within 60 s).
//
//   node --test tests/e2e/docs.test.mjs      (needs pkg/ built)

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ROOT, launchBrowser, leaseServerBin, startLeaseServer } from './helpers.mjs';

const DOCS = join(ROOT, 'docs');
const PKG = process.env.AGENTSTORE_PKG_DIR ?? join(ROOT, 'pkg');
// The lease server's binary, built if missing (helpers.mjs `leaseServerBin`).
let BIN;
const ADMIN = 'docs-e2e-admin';
const SAMPLE_TIMEOUT_MS = 60_000;

/** Every JS sample: {file, line, worker, code}. Unknown JS-ish info strings fail. */
function samples() {
  const out = [];
  for (const file of readdirSync(DOCS).filter((f) => f.endsWith('.md')).sort()) {
    const lines = readFileSync(join(DOCS, file), 'utf8').split('\n');
    for (let i = 0; i < lines.length; i++) {
      const open = lines[i].match(/^```\s*(\S*)\s*(.*)$/);
      if (!open) continue;
      let end = i + 1;
      while (end < lines.length && !/^```\s*$/.test(lines[end])) end++;
      const [lang, rest] = [open[1].toLowerCase(), open[2].trim()];
      if (['js', 'javascript', 'mjs'].includes(lang)) {
        assert.ok(rest === '' || rest === 'worker', `${file}:${i + 1}: unknown sample kind "${rest}"`);
        out.push({ file, line: i + 1, worker: rest === 'worker', code: lines.slice(i + 1, end).join('\n') });
      }
      i = end;
    }
  }
  return out;
}

// The prelude, as module source; `ORIGIN` and `ADMIN` are filled in.
const PRELUDE = `
const origin = ORIGIN;
const adminCall = async (method, path, body) => {
  const r = await fetch(origin + path, {
    method,
    headers: { authorization: "Bearer " + ADMIN, "content-type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (!r.ok) throw new Error(method + " " + path + ": " + r.status + " " + await r.text());
  return r.status === 204 ? null : r.json();
};
globalThis.SERVER = origin;
globalThis.assert = (cond, message = "assertion failed") => { if (!cond) throw new Error(message); };
globalThis.newEnrollmentToken = async () => (await adminCall("POST", "/v1/admin/enrollment-tokens", {})).token;
globalThis.enqueue = async (queue, payload) => (await adminCall("POST", "/v1/queues/" + queue + "/items", { payload })).id;
globalThis.item = (id) => adminCall("GET", "/v1/items/" + id);
globalThis.enrollmentToken = await globalThis.newEnrollmentToken();
`;

/** Runs in the page: the prelude, then the sample (in the page or in a worker). */
async function runInPage({ prelude, code, worker }) {
  const url = (src) => URL.createObjectURL(new Blob([src], { type: 'text/javascript' }));
  const preludeUrl = url(prelude);
  const sampleUrl = url(code);
  try {
    if (!worker) {
      await import(preludeUrl);
      await import(sampleUrl);
      return 'ok';
    }
    const boot = url(`
      try {
        await import(${JSON.stringify(preludeUrl)});
        await import(${JSON.stringify(sampleUrl)});
        postMessage({ __docsSample: { ok: true, isWorker: typeof document === "undefined" } });
      } catch (e) {
        postMessage({ __docsSample: { ok: false, error: (e && e.name) + ": " + (e && e.message) + "\\n" + (e && e.stack) } });
      }`);
    const w = new Worker(boot, { type: 'module' });
    const msg = await new Promise((resolve) => {
      // The sample may post its own messages; only the bootstrap's answer counts.
      w.onmessage = (e) => e.data && e.data.__docsSample && resolve(e.data.__docsSample);
      w.onerror = (e) => resolve({ ok: false, error: `worker error: ${e.message}` });
    });
    w.terminate();
    if (!msg.ok) throw new Error(msg.error);
    if (!msg.isWorker) throw new Error('the worker sample did not run in a worker');
    return 'ok';
  } catch (e) {
    return `${e?.name}: ${e?.message}\n${e?.stack ?? ''}`;
  }
}



let dir;
let browser;

let servers = 0;

// Each sample's server picks its own port (--listen :0, helpers.mjs
// startLeaseServer): a port picked free, closed and passed on could be bound
// by another process first on a busy machine.
async function withServer(fn) {
  servers += 1;
  const db = join(dir, `leases-${servers}.sqlite`);
  const server = await startLeaseServer(BIN, ['--database', db, '--admin-token', ADMIN, '--www', join(dir, 'www'), '--pkg', PKG]);
  try {
    assert.ok((await fetch(`${server.base}/v1/health`)).ok, 'agentstore-server answers its health check');
    return await fn(server.base);
  } finally {
    await server.stop();
  }
}

const ALL = samples();

before(async () => {
  assert.ok(existsSync(join(PKG, 'agentstore.js')), `${PKG} must hold the built SDK (scripts/test.sh builds it)`);
  BIN = leaseServerBin();
  dir = mkdtempSync(join(tmpdir(), 'agentstore-docs-e2e-'));
  spawnSync('mkdir', ['-p', join(dir, 'www')]);
  writeFileSync(join(dir, 'www', 'index.html'), '<!doctype html><title>docs samples</title><p>docs samples</p>');
  browser = await launchBrowser();
});

after(async () => {
  await browser?.close();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

test('the docs have JavaScript samples, in every guide', () => {
  const files = new Set(ALL.map((s) => s.file));
  for (const f of ['api.md', 'migrating-from-pouchdb.md', 'browser-worker-leases.md', 'hidden-tabs.md']) {
    assert.ok(files.has(f), `${f} has no js sample`);
  }
});

for (const s of ALL) {
  test(`${s.file}:${s.line}${s.worker ? ' (in a worker)' : ''}`, { timeout: SAMPLE_TIMEOUT_MS + 30_000 }, async () => {
    await withServer(async (base) => {
      const context = await browser.newContext();
      const page = await context.newPage();
      const logs = [];
      page.on('console', (m) => logs.push(`${m.type()}: ${m.text()}`));
      page.on('pageerror', (e) => logs.push(`pageerror: ${e}`));
      try {
        await page.goto(`${base}/index.html`);
        const code = s.code.replace(/from\s+(["'])agentstore\1/g, `from "${base}/pkg/agentstore.js"`);
        const prelude = PRELUDE.replace('ORIGIN', JSON.stringify(base)).replace('ADMIN', JSON.stringify(ADMIN));
        let timer;
        const result = await Promise.race([
          page.evaluate(runInPage, { prelude, code, worker: s.worker }),
          new Promise((r) => { timer = setTimeout(r, SAMPLE_TIMEOUT_MS, `timed out after ${SAMPLE_TIMEOUT_MS} ms`); }),
        ]).finally(() => clearTimeout(timer));
        assert.equal(result, 'ok', `${s.file}:${s.line} failed:\n${result}\nconsole:\n${logs.join('\n')}`);
      } finally {
        await context.close();
      }
    });
  });
}
