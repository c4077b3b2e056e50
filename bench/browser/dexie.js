// Dexie 4: explicit rw transactions for CAS, bulkAdd for the batch,
// where().between() for prefixes, a native compound index for workload 7.
import Dexie from 'dexie';
import { register, timed } from './harness.js';
import * as D from './data.js';

const rev = (g) => `${g}-${((g * 2654435761) >>> 0).toString(16).padStart(8, '0')}`;
const gen = (r) => parseInt(r, 10);
const BIG_NAME = 'bench-dexie-big';

function open(name, version = 1, schema = '_id') {
  const db = new Dexie(name);
  db.version(version).stores({ records: schema });
  return db.open().then(() => db);
}

function casPut(db, record) {
  return db.transaction('rw', db.records, async () => {
    const cur = await db.records.get(record._id);
    if ((cur ? cur._rev : undefined) !== record._rev) throw new Error('conflict');
    const out = rev(cur ? gen(cur._rev) + 1 : 1);
    await db.records.put({ ...record, _rev: out });
    return out;
  });
}

let big;
let bigVersion = 1;

register({
  name: 'Dexie 4',
  async seed() {
    big = await open(BIG_NAME);
    if ((await big.records.count()) === D.BIG) return;
    for (let start = 0; start < D.BIG; start += 10_000) {
      const recs = Array.from({ length: 10_000 }, (_, k) => ({ ...D.record(start + k), _rev: rev(1) }));
      await big.transaction('rw', big.records, () => big.records.bulkPut(recs));
    }
  },
  async w1(run) {
    const name = `bench-dexie-w1-${run}`;
    await Dexie.delete(name);
    const db = await open(name);
    let r = await casPut(db, { ...D.casBase });
    const { ms } = await timed(async () => {
      for (let i = 1; i <= D.W1_OPS; i++) r = await casPut(db, { ...D.casBase, n: i, _rev: r });
    });
    const last = await db.records.get('cas');
    await db.delete();
    return { ms, ok: last.n === D.W1_OPS };
  },
  async w2(run) {
    const ids = D.randomIds(run);
    let found = 0;
    const { ms } = await timed(async () => {
      for (const id of ids) if (await big.records.get(id)) found++;
    });
    return { ms, ok: found === ids.length };
  },
  async w8(run) {
    let found = 0;
    const { ms } = await timed(async () => {
      for (const ids of D.idBatches(run)) for (const r of await big.records.bulkGet(ids)) if (r) found++;
    });
    return { ms, ok: found === D.W8_BATCHES * D.W8_SIZE };
  },
  async w3(run) {
    const name = `bench-dexie-w3-${run}`;
    await Dexie.delete(name);
    const db = await open(name);
    const recs = Array.from({ length: D.W3_COUNT }, (_, i) => D.batchRecord(i));
    const { ms } = await timed(() => db.transaction('rw', db.records, () => {
      const r1 = rev(1);
      return db.records.bulkAdd(recs.map((r) => ({ ...r, _rev: r1 })));
    }));
    const n = await db.records.count();
    await db.delete();
    return { ms, ok: n === D.W3_COUNT };
  },
  async w4(run) {
    const prefixes = D.randomPrefixes(run);
    let ok = true;
    const { ms } = await timed(async () => {
      for (const p of prefixes) {
        const rows = await big.records.where('_id').between(p, D.successor(p), true, false).toArray();
        ok &&= rows.length === D.W4_SIZE;
      }
    });
    return { ms, ok };
  },
  async w5() {
    let total = 0;
    const { ms } = await timed(async () => {
      let last = null;
      for (;;) {
        const coll = last === null ? big.records.orderBy('_id') : big.records.where('_id').above(last);
        const rows = await coll.limit(D.PAGE + 1).toArray();
        const page = rows.slice(0, D.PAGE);
        total += page.length;
        if (rows.length <= D.PAGE) break;
        last = page[page.length - 1]._id;
      }
    });
    return { ms, ok: total === D.BIG };
  },
  async w6(run) {
    const name = `bench-dexie-w6-${run}`;
    await Dexie.delete(name);
    const db = await open(name);
    await casPut(db, { ...D.counterBase });
    const { ms } = await timed(() => Promise.all(Array.from({ length: D.W6_WRITERS }, async () => {
      for (let i = 0; i < D.W6_EACH; i++) {
        await db.transaction('rw', db.records, async () => {
          const cur = await db.records.get('counter');
          await db.records.put({ ...cur, count: cur.count + 1, _rev: rev(gen(cur._rev) + 1) });
        });
      }
    })));
    const last = await db.records.get('counter');
    await db.delete();
    return { ms, ok: last.count === D.W6_WRITERS * D.W6_EACH };
  },
  // Dexie's way: a schema version adding a compound index; IndexedDB builds
  // it natively during the upgrade. Dropped again (untimed) for the next run.
  async w7() {
    big.close();
    const { ms, out } = await timed(() => open(BIG_NAME, ++bigVersion, '_id, [recordType+updatedAt]'));
    const n = await out.records.where('[recordType+updatedAt]').between([Dexie.minKey, Dexie.minKey], [Dexie.maxKey, Dexie.maxKey]).count();
    out.close();
    big = await open(BIG_NAME, ++bigVersion, '_id');
    return { ms, ok: n === D.BIG, note: 'native index (schema upgrade)' };
  },
});
