// Import and export load on first use (issue 17): both entry points
// ("agentstore" and "agentstore/store") ship without the import/export code
// and fetch pkg/io/ (through pkg/io-loader.js) on the first importPouchDump,
// importSnapshot or exportSnapshot*. This drives the built pkg/ in headless
// Chromium (Playwright) and headless Firefox (geckodriver): two IndexedDB
// engines, since the io module writes through a second connection.
//
// Each page must:
// - fetch nothing under /pkg/io/ while it only opens, writes, reads and lists;
// - export, import a snapshot into a second store and import the shared
//   PouchDB dump (as a Response) through the io module, with the same counts
//   as the demo's, the derived index kept in step (verifyIndexes clean) and a
//   `watch` subscriber of the first connection hearing the imported ids;
// - get the io module's errors unchanged (ValidationError, AbortError with
//   nothing written, ClosedError on a closed store);
// - reject with NetworkError (code "network") while pkg/io/'s wasm cannot be
//   fetched, and succeed on the next call once it can. (A failed fetch of the
//   io glue itself is kept by Firefox's module map, as HTML specifies, so
//   there only a reload retries it; Chromium fetches it again.)
//
//   node --test tests/e2e/io_module.test.mjs      (needs pkg/)

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import { readFile } from 'node:fs/promises';
import { existsSync } from 'node:fs';
import { extname, join, normalize } from 'node:path';
import { ROOT, buildPkgIfMissing, launchBrowser } from './helpers.mjs';
import { launchFirefox } from '../../bench/webdriver.mjs';

const PKG = process.env.AGENTSTORE_PKG_DIR ?? join(ROOT, 'pkg');
const MIME = { '.js': 'text/javascript', '.wasm': 'application/wasm', '.html': 'text/html', '.ndjson': 'application/x-ndjson' };

// The page's scenario; `entry` picks the entry point. Each phase returns
// plain data for the test to check.
const SCENARIO = `
const entry = new URLSearchParams(location.search).get('entry');
const mod = await import(entry === 'full' ? '/pkg/agentstore.js' : '/pkg/store/agentstore.js');
await mod.default();
const { AgentStore } = mod;
const INDEXES = [{ name: 'byType', keys: ['recordType', 'updatedAt'] }];
const fail = async (p) => {
  try { await p; return null; } catch (e) { return { isError: e instanceof Error, name: e.name, code: e.code }; }
};
const until = async (cond, ms = 20000) => {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) return false;
    await new Promise((r) => setTimeout(r, 20));
  }
  return true;
};
window.phases = {
  async local(name) {
    await AgentStore.destroy(name);
    await AgentStore.destroy(name + '-copy');
    const s = await AgentStore.open(name, { indexes: INDEXES });
    await s.putMany([1, 2, 3].map((n) => ({ _id: 'local:' + n, recordType: 'note', updatedAt: '2026-01-0' + n + 'T00:00:00.000Z', n })));
    window.store = s;
    return { count: await s.count(), got: (await s.get('local:2')).n, listed: (await s.list({ prefix: 'local:' })).records.length };
  },
  async io(name) {
    const s = window.store;
    const heard = new Set();
    const w = s.watch({ prefix: 'agent-system-legacy:' }, (c) => heard.add(c.id));
    const text = await s.exportSnapshot();
    const chunks = [];
    await s.exportSnapshotChunks((c) => chunks.push(c), { batchSize: 1 });
    const blob = await (await s.exportSnapshotBlob()).text();
    const copy = await AgentStore.open(name + '-copy', { indexes: INDEXES });
    const snap = await copy.importSnapshot(text);
    const ids = ['local:1', 'local:2', 'local:3'];
    const same = JSON.stringify(await copy.getMany(ids)) === JSON.stringify(await s.getMany(ids));
    const progress = [];
    const dump = await s.importPouchDump(await fetch('/data/agent-records.pouchdump.ndjson'), {
      onProgress: (done, total) => progress.push([done, total]),
    });
    const heardAll = await until(() => heard.has('agent-system-legacy:0439b1b3') && heard.has('agent-system-legacy:05e442af'));
    w.close();
    const verify = await s.verifyIndexes();
    const byType = await s.listBy('byType', { eq: 'note' });
    const before = await copy.count();
    const dumpText = await (await fetch('/data/agent-records.pouchdump.ndjson')).text();
    const bad = await fail(copy.importPouchDump('{"not": "a dump"\\n'));
    const ac = new AbortController();
    ac.abort();
    const aborted = await fail(copy.importPouchDump(dumpText, { signal: ac.signal }));
    const afterAbort = await copy.count();
    copy.close();
    const closed = await fail(copy.exportSnapshot());
    return {
      lines: text.trim().split('\\n').length,
      chunksMatch: chunks.join('') === text && chunks.length > 1,
      blobMatch: blob === text,
      snap, same, dump,
      progressLast: progress[progress.length - 1],
      count: await s.count(),
      heardAll,
      verify: { missing: verify.missing.length, orphaned: verify.orphaned.length, stale: verify.stale.length },
      byType: byType.records.map((r) => r._id),
      bad, aborted, unchanged: before === afterAbort, closed,
    };
  },
  // A dedicated (module) worker imports through the io module too.
  async worker(name) {
    await AgentStore.destroy(name);
    const w = new Worker('/worker.js?entry=' + entry, { type: 'module' });
    // The worker says 'ready' once its module is initialised, then answers.
    const out = await new Promise((resolve, reject) => {
      w.onmessage = (e) => (e.data === 'ready' ? w.postMessage(name) : resolve(e.data));
      w.onerror = (e) => reject(new Error(e.message));
    });
    w.terminate();
    const s = await AgentStore.open(name);
    out.seenByPage = (await s.get('w:2'))?.n ?? null;
    s.close();
    return out;
  },
  async unreachable(name) {
    await AgentStore.destroy(name);
    const s = await AgentStore.open(name);
    const first = await fail(s.importSnapshot(''));
    window.retry = () => s.exportSnapshot().then((t) => t.split('\\n')[0].length > 0);
    return first;
  },
};
window.ready = true;
`;

const WORKER = `
const entry = new URLSearchParams(location.search).get('entry');
const mod = await import(entry === 'full' ? '/pkg/agentstore.js' : '/pkg/store/agentstore.js');
await mod.default();
onmessage = async (e) => {
  const s = await mod.AgentStore.open(e.data);
  const header = JSON.stringify({ agentstore: 'snapshot', records: 2, tombstones: 0, version: 1 });
  const line = (id, n) => JSON.stringify({ _id: id, _rev: '1-' + String(n).repeat(32), n, updatedAt: '2026-01-01T00:00:00.000Z' });
  const sum = await s.importSnapshot([header, line('w:1', 1), line('w:2', 2)].join('\\n'));
  const text = await s.exportSnapshot();
  s.close();
  postMessage({ written: sum.written, lines: text.trim().split('\\n').length });
};
postMessage('ready');
`;

let server;
let origin;
let ioBlocked = false;
const requests = [];

before(async () => {
  buildPkgIfMissing();
  assert.ok(existsSync(join(PKG, 'io', 'agentstore_bg.wasm')), 'pkg/io/ must be built (scripts/build-pkg.sh)');
  server = createServer(async (req, res) => {
    const path = decodeURIComponent(new URL(req.url, 'http://x').pathname);
    requests.push(path);
    let body;
    let type = MIME[extname(path)] ?? 'application/octet-stream';
    if (path === '/page.html') {
      body = '<!doctype html><meta charset="utf-8"><script type="module" src="/scenario.js"></script>';
      type = MIME['.html'];
    } else if (path === '/scenario.js') body = SCENARIO;
    else if (path === '/worker.js') body = WORKER;
    else if (path.startsWith('/pkg/') || path.startsWith('/data/')) {
      if (ioBlocked && path === '/pkg/io/agentstore_bg.wasm') return res.writeHead(503).end();
      const file = path.startsWith('/pkg/')
        ? join(PKG, normalize(path.slice(5)))
        : join(ROOT, 'www', 'data', normalize(path.slice(6)));
      body = await readFile(file).catch(() => null);
    }
    if (body == null) return res.writeHead(404).end();
    res.writeHead(200, { 'content-type': type, 'cache-control': 'no-store' }).end(body);
  });
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  origin = `http://127.0.0.1:${server.address().port}`;
});

after(() => server?.close());

const ioRequests = () => requests.filter((p) => p.startsWith('/pkg/io/') || p === '/pkg/io-loader.js');

async function scenario(page, engine, entry) {
  const name = `io-e2e-${engine}-${entry}`;
  requests.length = 0;
  await page.goto(`${origin}/page.html?entry=${entry}`);
  await page.waitForFunction(() => window.ready === true, null, { timeout: 60_000 });

  const local = await page.evaluate((n) => window.phases.local(n), name);
  assert.deepEqual(local, { count: 3, got: 2, listed: 3 });
  assert.deepEqual(
    ioRequests().filter((p) => p.startsWith('/pkg/io/')),
    [],
    `${engine} ${entry}: nothing under /pkg/io/ is fetched before an import or export`,
  );

  const r = await page.evaluate((n) => window.phases.io(n), name);
  const loaded = ioRequests();
  assert.ok(loaded.includes('/pkg/io/agentstore.js') && loaded.includes('/pkg/io/agentstore_bg.wasm'), loaded.join());
  assert.equal(loaded.filter((p) => p === '/pkg/io/agentstore_bg.wasm').length, 1, 'the io module loads once per page');
  assert.equal(r.lines, 4, 'a header and three records');
  assert.ok(r.chunksMatch, 'exportSnapshotChunks gives the same text, in several chunks');
  assert.ok(r.blobMatch, 'exportSnapshotBlob gives the same text');
  assert.deepEqual(r.snap, { written: 3, keptNewer: 0 });
  assert.ok(r.same, 'the snapshot copy holds the same records and revisions');
  assert.equal(r.dump.documentsRead, 3011);
  assert.equal(r.dump.live, 2894);
  assert.equal(r.dump.tombstones, 112);
  assert.equal(r.dump.conflictsResolved, 2);
  assert.equal(r.dump.written, 3006);
  assert.deepEqual(r.progressLast, [3006, 3006]);
  assert.equal(r.count, 3 + 2894);
  assert.ok(r.heardAll, 'the first connection watch() heard the io connection writes');
  assert.deepEqual(r.verify, { missing: 0, orphaned: 0, stale: 0 }, 'indexes kept in step by the io connection');
  assert.deepEqual(r.byType, ['local:1', 'local:2', 'local:3']);
  assert.deepEqual(r.bad, { isError: true, name: 'ValidationError', code: 'validation' });
  assert.deepEqual(r.aborted, { isError: true, name: 'AbortError', code: 'aborted' });
  assert.ok(r.unchanged, 'an aborted import writes nothing');
  assert.deepEqual(r.closed, { isError: true, name: 'ClosedError', code: 'closed' });

  const w = await page.evaluate((n) => window.phases.worker(n), `${name}-worker`);
  assert.deepEqual(w, { written: 2, lines: 3, seenByPage: 2 }, `${engine} ${entry}: import and export in a worker`);
}

async function unreachable(page, engine) {
  ioBlocked = true;
  try {
    await page.goto(`${origin}/page.html?entry=store`);
    await page.waitForFunction(() => window.ready === true, null, { timeout: 60_000 });
    const first = await page.evaluate((n) => window.phases.unreachable(n), `io-e2e-${engine}-unreachable`);
    assert.deepEqual(first, { isError: true, name: 'NetworkError', code: 'network' });
  } finally {
    ioBlocked = false;
  }
  assert.equal(await page.evaluate(() => window.retry()), true, 'the next call loads the module');
}

test('chromium: import and export load pkg/io/ on first use, from both entry points', async () => {
  const browser = await launchBrowser();
  try {
    for (const entry of ['store', 'full']) {
      const context = await browser.newContext();
      const page = await context.newPage();
      const errors = [];
      page.on('pageerror', (e) => errors.push(String(e)));
      await scenario(page, 'chromium', entry);
      assert.deepEqual(errors, []);
      await context.close();
    }
    const context = await browser.newContext();
    await unreachable(await context.newPage(), 'chromium');
    await context.close();
  } finally {
    await browser.close();
  }
});

test('firefox: import and export load pkg/io/ on first use, from both entry points', async () => {
  const firefox = await launchFirefox();
  try {
    for (const entry of ['store', 'full']) await scenario(await firefox.newPage(), 'firefox', entry);
    await unreachable(await firefox.newPage(), 'firefox');
  } finally {
    await firefox.close();
  }
});
