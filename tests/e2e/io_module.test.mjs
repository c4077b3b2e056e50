// Import and export load on first use (issue 17): both entry points
// ("agentstore" and "agentstore/store") ship without the import/export code
// and fetch pkg/io/ (agentstore_io.js and its wasm) on the first
// importPouchDump, importSnapshot or exportSnapshot*. This drives the built pkg/ in headless
// Chromium (Playwright) and headless Firefox (geckodriver): two IndexedDB
// engines, since the io module writes through a second connection.
//
// Each page must:
// - fetch nothing under /pkg/io/ while it only opens, writes, reads and lists,
//   nor for calls with bad arguments (ValidationError, AbortError at once);
// - load the module once for two first calls made at once;
// - export, import a snapshot into a second store and import the shared
//   PouchDB dump (as a Response) through the io module, with the same counts
//   as the demo's, the derived index kept in step (verifyIndexes clean) and a
//   `watch` subscriber of the first connection hearing the imported ids;
// - get the io module's errors unchanged (ValidationError, AbortError with
//   nothing written, ClosedError on a closed store);
// - stop an import when the store is closed during it, and reject with
//   ClosedError, without re-creating the database, when the store is closed
//   or destroyed while the module is still downloading (the test holds the
//   module's wasm back until then), and with AbortError at once when the
//   call's signal aborts meanwhile;
// - load the module from where AgentStore.setIoModule says;
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
  async checks() {
    const s = window.store;
    const ac = new AbortController();
    ac.abort();
    return [
      await fail(s.exportSnapshotChunks(42)),
      await fail(s.importSnapshot('x', { batchSize: 0 })),
      await fail(s.importPouchDump(42)),
      await fail(s.importPouchDump('x', { legacyIndexId: 7 })),
      await fail(s.exportSnapshot('fast')),
      await (async () => {
        const locked = new Blob(['x']).stream();
        locked.getReader();
        return fail(s.importSnapshot(locked));
      })(),
      await fail(s.rebuildIndexes({ batchSize: 0 })),
      await fail(s.dropIndex(42)),
      // What fetch() resolves with for a wrong URL: refused, not an empty source.
      await fail(s.importSnapshot(new Response('', { status: 404 }))),
      await fail(s.importSnapshot('x', { signal: ac.signal })),
      await fail(s.importPouchDump('x', { signal: ac.signal })),
      await fail(s.rebuildIndexes({ signal: ac.signal })),
      await fail(s.exportSnapshot({ signal: ac.signal })),
      await fail(s.exportSnapshotBlob({ signal: ac.signal })),
      await fail(s.exportSnapshotChunks(() => {}, { signal: ac.signal })),
      await fail(s.verifyIndexes({ signal: ac.signal })),
      await fail(s.dropIndex('old', { signal: ac.signal })),
      // An index this connection declares: refused before a download too.
      await fail(s.dropIndex('byType')),
    ];
  },
  async io(name) {
    const s = window.store;
    // Two first calls at once share one load.
    const [t1, t2] = await Promise.all([s.exportSnapshot(), s.exportSnapshot()]);
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
    const rebuilt = await s.rebuildIndexes({ batchSize: 500 });
    const byType = await s.listBy('byType', { eq: 'note' });
    // dropIndex runs in the io module; this connection declares byType.
    const dropDeclared = await fail(s.dropIndex('byType'));
    const plain = await AgentStore.open(name + '-copy');
    const dropped = [await plain.dropIndex('byType'), await plain.dropIndex('byType')];
    plain.close();
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
      twice: t1 === t2 && t1 === text,
      lines: text.trim().split('\\n').length,
      chunksMatch: chunks.join('') === text && chunks.length > 1,
      blobMatch: blob === text,
      snap, same, dump,
      progressLast: progress[progress.length - 1],
      count: await s.count(),
      heardAll,
      verify: { missing: verify.missing.length, orphaned: verify.orphaned.length, stale: verify.stale.length },
      rebuilt,
      byType: byType.records.map((r) => r._id),
      dropDeclared, dropped,
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
  // Starts an export while the test holds the module's wasm back; end()
  // closes or destroys the store before the test lets it through.
  async held(name) {
    await AgentStore.destroy(name);
    const s = await AgentStore.open(name);
    await s.put({ _id: 'h:1', n: 1 });
    window.store = s;
    window.storeName = name;
    window.heldCall = fail(s.exportSnapshot());
  },
  async end(how) {
    if (how === 'close') window.store.close();
    else await AgentStore.destroy(window.storeName);
    return true;
  },
  // An import with a signal, started while the test holds the module's
  // wasm back; abortHeld() aborts it and reports how the call ended (or
  // 'pending' after 30 s), before the test lets the wasm through.
  async heldWithSignal(name) {
    await AgentStore.destroy(name);
    const s = await AgentStore.open(name);
    window.store = s;
    window.ctl = new AbortController();
    window.reason = new Error('stop');
    const dump = await (await fetch('/data/agent-records.pouchdump.ndjson')).text();
    window.heldCall = s.importPouchDump(dump, { signal: window.ctl.signal }).then(
      () => ({ ok: true }),
      (e) => ({ isError: e instanceof Error, name: e.name, code: e.code, cause: e.cause === window.reason }),
    );
  },
  async abortHeld() {
    window.ctl.abort(window.reason);
    return Promise.race([window.heldCall, new Promise((r) => setTimeout(() => r('pending'), 30000))]);
  },
  async heldCount() {
    const n = await window.store.count();
    window.store.close();
    return n;
  },
  async heldResult() {
    const r = await window.heldCall;
    const names = (await indexedDB.databases()).map((d) => d.name);
    return { r, recreated: names.includes(window.storeName) };
  },
  // close() while an import runs: it stops at the next batch; while an
  // export runs: no chunk after it.
  async closeDuring(name) {
    await AgentStore.destroy(name);
    const s = await AgentStore.open(name);
    const dump = await (await fetch('/data/agent-records.pouchdump.ndjson')).text();
    let batches = 0;
    const r = await fail(s.importPouchDump(dump, { batchSize: 100, onProgress: () => { if (++batches === 1) s.close(); } }));
    const again = await AgentStore.open(name);
    const count = await again.count();
    await again.putMany(Array.from({ length: 50 }, (_, i) => ({ _id: 'x' + i })));
    let chunks = 0;
    const exp = await fail(again.exportSnapshotChunks(() => { if (++chunks === 1) again.close(); }, { batchSize: 5 }));
    return { r, batches, partial: count > 0 && count < 2894, exp, chunks };
  },
  async custom(name) {
    const bad = (() => { try { AgentStore.setIoModule(42); return null; } catch (e) { return { isError: e instanceof Error, name: e.name, code: e.code }; } })();
    await AgentStore.destroy(name);
    const s = await AgentStore.open(name);
    // An io module of another build: refused before its wasm is fetched.
    AgentStore.setIoModule(async () => ({ ...(await import('/alt/agentstore_io.js')), AGENTSTORE_RELEASE: '0123456789abcdef' }));
    const other = await s.exportSnapshot().then(() => null, (e) => ({ isError: e instanceof Error, name: e.name, code: e.code, says: /another build \\(0123456789abcdef, not [0-9a-f]{16}\\)/.test(e.message) }));
    const wasmBefore = performance.getEntriesByType('resource').some((r) => r.name.endsWith('/alt/agentstore_io_bg.wasm'));
    AgentStore.setIoModule(() => import('/alt/agentstore_io.js'));
    const sum = await s.importSnapshot([JSON.stringify({ agentstore: 'snapshot', records: 1, tombstones: 0, version: 1 }), JSON.stringify({ _id: 'c:1', _rev: '1-' + 'a'.repeat(32), n: 1, updatedAt: '2026-01-01T00:00:00.000Z' })].join('\\n'));
    // Not the io module: a ValidationError, not a NetworkError.
    AgentStore.setIoModule({});
    const notIo = await fail(s.exportSnapshot());
    // The module object itself (as a service worker hands it over).
    AgentStore.setIoModule(await import('/alt/agentstore_io.js'));
    const lines = (await s.exportSnapshot()).trim().split('\\n').length;
    s.close();
    return { bad, written: sum.written, notIo, lines, other, wasmBefore };
  },
  async unreachable(name) {
    await AgentStore.destroy(name);
    const s = await AgentStore.open(name);
    const first = await s.importSnapshot('').then(() => null, (e) => ({ isError: e instanceof Error, name: e.name, code: e.code, status: e.status }));
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
// While set, the io wasm is answered only once `release()` is called.
let hold = null;
const requests = [];
const IO_WASM = '/pkg/io/agentstore_io_bg.wasm';

before(async () => {
  buildPkgIfMissing();
  assert.ok(existsSync(join(PKG, 'io', 'agentstore_io_bg.wasm')), 'pkg/io/ must be built (scripts/build-pkg.sh)');
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
    else if (path.startsWith('/pkg/') || path.startsWith('/data/') || path.startsWith('/alt/')) {
      if (ioBlocked && path === IO_WASM) return res.writeHead(503).end();
      if (hold && path === IO_WASM) await hold.promise;
      const file = path.startsWith('/pkg/')
        ? join(PKG, normalize(path.slice(5)))
        : path.startsWith('/alt/')
          ? join(PKG, 'io', normalize(path.slice(5)))
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

const ioRequests = () => requests.filter((p) => p.startsWith('/pkg/io/'));

/** Resolves once `cond()` holds (polled every 20 ms), failing after `ms`. */
async function until(cond, what, ms = 30_000) {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

async function open(page, entry) {
  requests.length = 0;
  await page.goto(`${origin}/page.html?entry=${entry}`);
  await page.waitForFunction(() => window.ready === true, null, { timeout: 60_000 });
}

const VALIDATION = { isError: true, name: 'ValidationError', code: 'validation' };

async function scenario(page, engine, entry) {
  const name = `io-e2e-${engine}-${entry}`;
  await open(page, entry);

  const local = await page.evaluate((n) => window.phases.local(n), name);
  assert.deepEqual(local, { count: 3, got: 2, listed: 3 });
  const checks = await page.evaluate(() => window.phases.checks());
  assert.deepEqual(checks, [
    VALIDATION, VALIDATION, VALIDATION, VALIDATION, VALIDATION, VALIDATION, VALIDATION, VALIDATION, VALIDATION,
    ...Array(8).fill({ isError: true, name: 'AbortError', code: 'aborted' }),
    VALIDATION,
  ]);
  assert.deepEqual(
    ioRequests(),
    [],
    `${engine} ${entry}: nothing under /pkg/io/ is fetched for an open with indexes on a new store, reads, writes or calls with bad arguments, an aborted signal or a declared index to drop`,
  );

  const r = await page.evaluate((n) => window.phases.io(n), name);
  const loaded = ioRequests();
  assert.ok(loaded.includes('/pkg/io/agentstore_io.js') && loaded.includes(IO_WASM), loaded.join());
  assert.equal(loaded.filter((p) => p === IO_WASM).length, 1, 'the io module loads once per page');
  assert.ok(r.twice, 'two first calls at once both answer');
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
  assert.equal(r.rebuilt, 3 + 2894, 'rebuildIndexes runs in the io module over every record');
  assert.deepEqual(r.byType, ['local:1', 'local:2', 'local:3']);
  assert.deepEqual(r.dropDeclared, VALIDATION, 'dropIndex refuses an index this connection declares');
  assert.deepEqual(r.dropped, [true, false], 'dropIndex drops an index another connection declared, once');
  assert.deepEqual(r.bad, VALIDATION);
  assert.deepEqual(r.aborted, { isError: true, name: 'AbortError', code: 'aborted' });
  assert.ok(r.unchanged, 'an aborted import writes nothing');
  assert.deepEqual(r.closed, { isError: true, name: 'ClosedError', code: 'closed' });

  const c = await page.evaluate((n) => window.phases.closeDuring(n), `${name}-close`);
  assert.deepEqual(c.r, { isError: true, name: 'ClosedError', code: 'closed' }, 'close() stops an import in progress');
  assert.ok(c.partial, `batches before the close stay, the rest is not written (${c.batches} batches)`);
  assert.deepEqual(c.exp, { isError: true, name: 'ClosedError', code: 'closed' }, 'close() stops an export in progress');
  assert.equal(c.chunks, 1, 'no chunk after close()');

  const w = await page.evaluate((n) => window.phases.worker(n), `${name}-worker`);
  assert.deepEqual(w, { written: 2, lines: 3, seenByPage: 2 }, `${engine} ${entry}: import and export in a worker`);
}

/** close() or destroy() while the module's wasm is still on its way. */
async function endedWhileLoading(page, engine, how) {
  const name = `io-e2e-${engine}-held-${how}`;
  await open(page, 'store');
  let release;
  hold = { promise: new Promise((r) => (release = r)) };
  try {
    await page.evaluate((n) => window.phases.held(n), name);
    await until(() => requests.includes(IO_WASM), 'the io wasm request');
    assert.equal(await page.evaluate((h) => window.phases.end(h), how), true);
  } finally {
    hold = null;
    release();
  }
  const out = await page.evaluate(() => window.phases.heldResult());
  assert.deepEqual(out.r, { isError: true, name: 'ClosedError', code: 'closed' }, `${how} during the load`);
  assert.equal(out.recreated, how === 'close', `${how}: the database is ${how === 'close' ? 'kept' : 'not re-created'}`);
}

/** An import's signal aborted while the module's wasm is still on its way. */
async function abortedWhileLoading(page, engine) {
  const name = `io-e2e-${engine}-held-abort`;
  await open(page, 'store');
  let release;
  hold = { promise: new Promise((r) => (release = r)) };
  let r;
  try {
    await page.evaluate((n) => window.phases.heldWithSignal(n), name);
    await until(() => requests.includes(IO_WASM), 'the io wasm request');
    r = await page.evaluate(() => window.phases.abortHeld());
  } finally {
    hold = null;
    release();
  }
  assert.deepEqual(r, { isError: true, name: 'AbortError', code: 'aborted', cause: true }, `${engine}: the abort ends the call while the module loads`);
  assert.equal(await page.evaluate(() => window.phases.heldCount()), 0, 'nothing imported');
}

async function custom(page, engine) {
  await open(page, 'store');
  const out = await page.evaluate((n) => window.phases.custom(n), `io-e2e-${engine}-custom`);
  assert.deepEqual(out, {
    bad: VALIDATION,
    written: 1,
    notIo: VALIDATION,
    lines: 2,
    other: { ...VALIDATION, says: true },
    wasmBefore: false,
  });
  assert.ok(requests.includes('/alt/agentstore_io_bg.wasm'), requests.join());
  assert.deepEqual(ioRequests(), [], 'nothing fetched from the default place');
}

async function unreachable(page, engine) {
  ioBlocked = true;
  try {
    await open(page, 'store');
    const first = await page.evaluate((n) => window.phases.unreachable(n), `io-e2e-${engine}-unreachable`);
    assert.deepEqual(first, { isError: true, name: 'NetworkError', code: 'network', status: 503 });
  } finally {
    ioBlocked = false;
  }
  assert.equal(await page.evaluate(() => window.retry()), true, 'the next call loads the module');
}

async function all(newPage, engine) {
  for (const entry of ['store', 'full']) await scenario(await newPage(), engine, entry);
  await endedWhileLoading(await newPage(), engine, 'close');
  await endedWhileLoading(await newPage(), engine, 'destroy');
  await abortedWhileLoading(await newPage(), engine);
  await custom(await newPage(), engine);
  await unreachable(await newPage(), engine);
}

test('chromium: import and export load pkg/io/ on first use, from both entry points', async () => {
  const browser = await launchBrowser();
  const errors = [];
  try {
    await all(async () => {
      const page = await (await browser.newContext()).newPage();
      page.on('pageerror', (e) => errors.push(String(e)));
      return page;
    }, 'chromium');
    assert.deepEqual(errors, []);
  } finally {
    await browser.close();
  }
});

test('firefox: import and export load pkg/io/ on first use, from both entry points', async () => {
  const firefox = await launchFirefox();
  try {
    await all(() => firefox.newPage(), 'firefox');
  } finally {
    await firefox.close();
  }
});
