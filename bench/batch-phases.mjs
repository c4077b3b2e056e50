#!/usr/bin/env node
// Where one `putMany` of 10,000 new records spends its time, by phase, in
// the shipped package (pkg/, or --pkg DIR): IndexedDB's prototypes are
// wrapped in the page to timestamp the write transaction's creation, the
// first `count` and the first and last `add`:
//   prepare  call → readwrite transaction created (the record walk, body
//            digests; nothing asked of IndexedDB yet)
//   reads    → first add (the two `count`s over the batch's key span, the
//            revisions decided and stamped)
//   issue    first → last add (one `add` per record; raw IndexedDB's own
//            loop is this phase alone)
//   commit   last add → the call's Promise resolved (IndexedDB's commit)
// Each round then writes the same records from plain JS into the same schema
// (records store with the native byType index): its issue and commit
// phases, for comparison in the same run. Prints the median and every
// round (ms), one fresh database per round.
//
//   node bench/batch-phases.mjs [--browser chromium|firefox] [--rounds 15] [--pkg DIR]
import { createServer } from 'node:http';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, normalize } from 'node:path';
import { launchBrowser } from './webdriver.mjs';

const arg = (k, d) => {
  const i = process.argv.indexOf(`--${k}`);
  return i > 0 ? process.argv[i + 1] : d;
};
const BROWSER = arg('browser', 'chromium');
const ROUNDS = Number(arg('rounds', '15'));
const PKG = arg('pkg', new URL('../pkg', import.meta.url).pathname);
const PAGE = `<script type="module">
import init, { AgentStore } from '/pkg/agentstore.js';
import { batchRecord } from '/data.js';
await init();
const marks = {};
const wrap = (proto, name, mark) => {
  const real = proto[name];
  proto[name] = function (...a) { mark(a); return real.apply(this, a); };
};
wrap(IDBDatabase.prototype, 'transaction', (a) => { if (a[1] === 'readwrite') marks.tx ??= performance.now(); });
wrap(IDBObjectStore.prototype, 'count', () => { marks.count ??= performance.now(); });
wrap(IDBObjectStore.prototype, 'add', () => { const t = performance.now(); marks.first ??= t; marks.last = t; });
const out = [];
for (let round = 0; round < ${ROUNDS}; round++) {
  const s = await AgentStore.open('phases-' + round);
  const recs = Array.from({ length: 10000 }, (_, i) => batchRecord(i));
  for (const k of Object.keys(marks)) delete marks[k];
  const t0 = performance.now();
  const written = await s.putMany(recs);
  const t1 = performance.now();
  if (written.length !== recs.length) throw new Error('putMany wrote ' + written.length);
  out.push({ prepare: marks.tx - t0, reads: marks.first - marks.tx, issue: marks.last - marks.first, commit: t1 - marks.last, total: t1 - t0 });
  s.close();
  await AgentStore.destroy('phases-' + round);
  // The same records written by plain JS into the same schema (records with
  // the native byType index): its issue and commit phases, same round.
  const db = await new Promise((res, rej) => {
    const r = indexedDB.open('phases-raw-' + round, 1);
    r.onupgradeneeded = () => r.result.createObjectStore('records', { keyPath: '_id' }).createIndex('byType', ['recordType', '_id']);
    r.onsuccess = () => res(r.result);
    r.onerror = () => rej(r.error);
  });
  const raw = Array.from({ length: 10000 }, (_, i) => batchRecord(i));
  const r0 = performance.now();
  const tx = db.transaction('records', 'readwrite');
  const st = tx.objectStore('records');
  for (const r of raw) st.add({ ...r, _rev: '1-0123456789abcdef0123456789abcdef' });
  const r1 = performance.now();
  await new Promise((res, rej) => { tx.oncomplete = res; tx.onabort = () => rej(tx.error); });
  const r2 = performance.now();
  Object.assign(out[out.length - 1], { 'raw issue': r1 - r0, 'raw commit': r2 - r1, 'raw total': r2 - r0 });
  db.close();
  await new Promise((res) => { const d = indexedDB.deleteDatabase('phases-raw-' + round); d.onsuccess = d.onerror = res; });
}
window.result = out;
</script>`;
const types = { '.js': 'text/javascript', '.wasm': 'application/wasm' };
const srv = createServer(async (q, r) => {
  try {
    const url = new URL(q.url, 'http://x').pathname;
    let file;
    if (url.startsWith('/pkg/')) file = join(PKG, normalize(url.slice(5)));
    else if (url === '/data.js') file = new URL('./browser/data.js', import.meta.url).pathname;
    if (!file) {
      r.setHeader('content-type', 'text/html');
      return r.end(PAGE);
    }
    r.setHeader('content-type', types[file.slice(file.lastIndexOf('.'))] ?? 'application/octet-stream');
    r.end(await readFile(file));
  } catch {
    r.statusCode = 404;
    r.end();
  }
}).listen(0, '127.0.0.1');
await new Promise((r) => srv.once('listening', r));
const profile = await mkdtemp(join(tmpdir(), 'agentstore-batch-phases-'));
const ctx = await launchBrowser(BROWSER, profile, ['--disable-gpu']);
try {
  const page = await ctx.newPage();
  page.on?.('pageerror', (e) => console.error('page error:', e.message));
  await page.goto(`http://127.0.0.1:${srv.address().port}/`);
  await page.waitForFunction(() => window.result !== undefined, null, { timeout: 900_000 });
  const res = await page.evaluate(() => window.result);
  const med = (a) => [...a].sort((x, y) => x - y)[Math.floor(a.length / 2)];
  console.log(`${BROWSER}, putMany of 10,000 new records, ${PKG}\n| phase | median ms | rounds |\n|---|---:|---|`);
  for (const k of Object.keys(res[0])) {
    const v = res.map((x) => x[k]);
    console.log(`| ${k} | ${med(v).toFixed(0)} | ${v.map((x) => x.toFixed(0)).join(', ')} |`);
  }
} finally {
  await ctx.close();
  srv.close();
  await rm(profile, { recursive: true, force: true });
}
