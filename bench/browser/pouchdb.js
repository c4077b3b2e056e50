// PouchDB 9 with its IndexedDB adapter ("indexeddb", pouchdb-adapter-indexeddb).
import PouchDB from 'pouchdb-core';
import idbAdapter from 'pouchdb-adapter-indexeddb';
import { register, timed } from './harness.js';
import * as D from './data.js';

PouchDB.plugin(idbAdapter);
const open = (name) => new PouchDB(name, { adapter: 'indexeddb', auto_compaction: false });
let big;

register({
  name: 'PouchDB 9',
  async seed() {
    big = open('bench-pouch-big');
    const info = await big.info();
    if (info.doc_count === D.BIG) return;
    for (let start = 0; start < D.BIG; start += 5_000) {
      const res = await big.bulkDocs(Array.from({ length: 5_000 }, (_, k) => D.record(start + k)));
      if (res.some((r) => r.error)) throw new Error('seed failed');
    }
  },
  async w1(run) {
    const db = open(`bench-pouch-w1-${run}`);
    let { rev } = await db.put({ ...D.casBase });
    const { ms } = await timed(async () => {
      for (let i = 1; i <= D.W1_OPS; i++) ({ rev } = await db.put({ ...D.casBase, n: i, _rev: rev }));
    });
    const last = await db.get('cas');
    await db.destroy();
    return { ms, ok: last.n === D.W1_OPS };
  },
  async w2(run) {
    const ids = D.randomIds(run);
    let found = 0;
    const { ms } = await timed(async () => {
      for (const id of ids) if (await big.get(id)) found++;
    });
    return { ms, ok: found === ids.length };
  },
  async w8(run) {
    let found = 0;
    const { ms } = await timed(async () => {
      for (const ids of D.idBatches(run)) {
        const res = await big.allDocs({ keys: ids, include_docs: true });
        for (const row of res.rows) if (row.doc) found++;
      }
    });
    return { ms, ok: found === D.W8_BATCHES * D.W8_SIZE };
  },
  async w3(run) {
    const db = open(`bench-pouch-w3-${run}`);
    const recs = Array.from({ length: D.W3_COUNT }, (_, i) => D.batchRecord(i));
    const { ms, out } = await timed(() => db.bulkDocs(recs));
    const info = await db.info();
    await db.destroy();
    return { ms, ok: !out.some((r) => r.error) && info.doc_count === D.W3_COUNT, note: 'bulkDocs is not all-or-nothing' };
  },
  async w4(run) {
    const prefixes = D.randomPrefixes(run);
    let ok = true;
    const { ms } = await timed(async () => {
      for (const p of prefixes) {
        const res = await big.allDocs({ startkey: p, endkey: D.successor(p), inclusive_end: false, include_docs: true });
        ok &&= res.rows.length === D.W4_SIZE;
      }
    });
    return { ms, ok };
  },
  async w5() {
    let total = 0;
    const { ms } = await timed(async () => {
      let start;
      for (;;) {
        const opts = { include_docs: true, limit: D.PAGE + 1 };
        if (start !== undefined) opts.startkey = start;
        const res = await big.allDocs(opts);
        const page = res.rows.slice(0, D.PAGE);
        total += page.length;
        if (res.rows.length <= D.PAGE) break;
        start = res.rows[D.PAGE].id; // the 501st row starts the next page
      }
    });
    return { ms, ok: total === D.BIG };
  },
  // get → put with the read _rev; a 409 re-reads and retries at once.
  async w6(run) {
    const db = open(`bench-pouch-w6-${run}`);
    await db.put({ ...D.counterBase });
    let conflicts = 0;
    const { ms } = await timed(() => Promise.all(Array.from({ length: D.W6_WRITERS }, async () => {
      for (let i = 0; i < D.W6_EACH; i++) {
        for (;;) {
          const cur = await db.get('counter');
          try {
            await db.put({ ...cur, count: cur.count + 1 });
            break;
          } catch (e) {
            if (e.status !== 409) throw e;
            conflicts++;
          }
        }
      }
    })));
    const last = await db.get('counter');
    await db.destroy();
    return { ms, ok: last.count === D.W6_WRITERS * D.W6_EACH, note: `${conflicts} conflicts retried` };
  },
});
