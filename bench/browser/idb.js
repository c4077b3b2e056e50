// idb 8 (Jake Archibald's promise wrapper): the same transactions as raw.
import { openDB, deleteDB } from 'idb';
import { register, timed } from './harness.js';
import * as D from './data.js';

const open = (name) => openDB(name, 1, {
  upgrade(db) {
    db.createObjectStore('records', { keyPath: '_id' });
    db.createObjectStore('derived');
  },
});
const rev = (g) => `${g}-${((g * 2654435761) >>> 0).toString(16).padStart(8, '0')}`;
const gen = (r) => parseInt(r, 10);

async function casPut(db, record) {
  const tx = db.transaction('records', 'readwrite');
  const cur = await tx.store.get(record._id);
  if ((cur ? cur._rev : undefined) !== record._rev) {
    tx.abort();
    throw new Error('conflict');
  }
  const out = rev(cur ? gen(cur._rev) + 1 : 1);
  tx.store.put({ ...record, _rev: out });
  await tx.done;
  return out;
}

let big;

register({
  name: 'idb 8',
  async seed() {
    big = await open('bench-idb-big');
    if ((await big.count('records')) === D.BIG) return;
    for (let start = 0; start < D.BIG; start += 10_000) {
      const tx = big.transaction('records', 'readwrite');
      for (let i = start; i < start + 10_000; i++) tx.store.put({ ...D.record(i), _rev: rev(1) });
      await tx.done;
    }
  },
  async w1(run) {
    const name = `bench-idb-w1-${run}`;
    await deleteDB(name);
    const db = await open(name);
    let r = await casPut(db, { ...D.casBase });
    const { ms } = await timed(async () => {
      for (let i = 1; i <= D.W1_OPS; i++) r = await casPut(db, { ...D.casBase, n: i, _rev: r });
    });
    const last = await db.get('records', 'cas');
    db.close();
    await deleteDB(name);
    return { ms, ok: last.n === D.W1_OPS };
  },
  async w2(run) {
    const ids = D.randomIds(run);
    let found = 0;
    const { ms } = await timed(async () => {
      for (const id of ids) if (await big.get('records', id)) found++;
    });
    return { ms, ok: found === ids.length };
  },
  async w8(run) {
    let found = 0;
    const { ms } = await timed(async () => {
      for (const ids of D.idBatches(run)) {
        const tx = big.transaction('records');
        for (const r of await Promise.all(ids.map((id) => tx.store.get(id)))) if (r) found++;
      }
    });
    return { ms, ok: found === D.W8_BATCHES * D.W8_SIZE };
  },
  async w3(run) {
    const name = `bench-idb-w3-${run}`;
    await deleteDB(name);
    const db = await open(name);
    const recs = Array.from({ length: D.W3_COUNT }, (_, i) => D.batchRecord(i));
    const { ms } = await timed(async () => {
      const tx = db.transaction('records', 'readwrite');
      const r1 = rev(1);
      for (const r of recs) tx.store.add({ ...r, _rev: r1 });
      await tx.done;
    });
    const n = await db.count('records');
    db.close();
    await deleteDB(name);
    return { ms, ok: n === D.W3_COUNT };
  },
  async w4(run) {
    const prefixes = D.randomPrefixes(run);
    let ok = true;
    const { ms } = await timed(async () => {
      for (const p of prefixes) {
        const rows = await big.getAll('records', IDBKeyRange.bound(p, D.successor(p), false, true), D.W4_SIZE + 1);
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
        const range = last === null ? null : IDBKeyRange.lowerBound(last, true);
        const rows = await big.getAll('records', range, D.PAGE + 1);
        const page = rows.slice(0, D.PAGE);
        total += page.length;
        if (rows.length <= D.PAGE) break;
        last = page[page.length - 1]._id;
      }
    });
    return { ms, ok: total === D.BIG };
  },
  async w6(run) {
    const name = `bench-idb-w6-${run}`;
    await deleteDB(name);
    const db = await open(name);
    await casPut(db, { ...D.counterBase });
    const { ms } = await timed(() => Promise.all(Array.from({ length: D.W6_WRITERS }, async () => {
      for (let i = 0; i < D.W6_EACH; i++) {
        const tx = db.transaction('records', 'readwrite');
        const cur = await tx.store.get('counter');
        tx.store.put({ ...cur, count: cur.count + 1, _rev: rev(gen(cur._rev) + 1) });
        await tx.done;
      }
    })));
    const last = await db.get('records', 'counter');
    db.close();
    await deleteDB(name);
    return { ms, ok: last.count === D.W6_WRITERS * D.W6_EACH };
  },
  async w7() {
    let n = 0;
    const { ms } = await timed(async () => {
      await big.clear('derived');
      let last = null;
      for (;;) {
        const tx = big.transaction(['records', 'derived'], 'readwrite');
        const range = last === null ? null : IDBKeyRange.lowerBound(last, true);
        const rows = await tx.objectStore('records').getAll(range, D.PAGE);
        const d = tx.objectStore('derived');
        for (const r of rows) d.put(r._id, [r.recordType, r.updatedAt, r._id]);
        await tx.done;
        n += rows.length;
        if (rows.length < D.PAGE) break;
        last = rows[rows.length - 1]._id;
      }
    });
    return { ms, ok: n === D.BIG && (await big.count('derived')) === D.BIG };
  },
});
