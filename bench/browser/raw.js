// The floor: hand-written IndexedDB doing the same work in the same
// transactions as agentstore (one readwrite transaction per CAS write, one
// readonly transaction per get/page/listing, one for the whole batch).
import { register, timed, deleteDb } from './harness.js';
import * as D from './data.js';

const req = (r) => new Promise((res, rej) => { r.onsuccess = () => res(r.result); r.onerror = () => rej(r.error); });
const done = (tx) => new Promise((res, rej) => {
  tx.oncomplete = () => res();
  tx.onerror = () => rej(tx.error);
  tx.onabort = () => rej(tx.error || new DOMException('aborted', 'AbortError'));
});

function open(name) {
  return new Promise((res, rej) => {
    const r = indexedDB.open(name, 1);
    r.onupgradeneeded = () => {
      r.result.createObjectStore('records', { keyPath: '_id' });
      r.result.createObjectStore('derived');
    };
    r.onsuccess = () => res(r.result);
    r.onerror = () => rej(r.error);
  });
}

const rev = (g) => `${g}-${((g * 2654435761) >>> 0).toString(16).padStart(8, '0')}`;
const gen = (r) => parseInt(r, 10);

/** One readwrite transaction: read, compare the revision, write. */
function casPut(db, record) {
  const tx = db.transaction('records', 'readwrite');
  const s = tx.objectStore('records');
  let out;
  const g = s.get(record._id);
  g.onsuccess = () => {
    const cur = g.result;
    if ((cur ? cur._rev : undefined) !== record._rev) {
      tx.abort();
      return;
    }
    out = rev(cur ? gen(cur._rev) + 1 : 1);
    s.put({ ...record, _rev: out });
  };
  return done(tx).then(() => out);
}

function increment(db, id) {
  const tx = db.transaction('records', 'readwrite');
  const s = tx.objectStore('records');
  const g = s.get(id);
  g.onsuccess = () => {
    const cur = g.result;
    s.put({ ...cur, count: cur.count + 1, _rev: rev(gen(cur._rev) + 1) });
  };
  return done(tx);
}

function getAll(db, range, count) {
  const tx = db.transaction('records', 'readonly');
  return req(tx.objectStore('records').getAll(range, count));
}

let big;

register({
  name: 'raw IndexedDB',
  async seed() {
    big = await open('bench-raw-big');
    const n = await req(big.transaction('records').objectStore('records').count());
    if (n === D.BIG) return;
    for (let start = 0; start < D.BIG; start += 10_000) {
      const tx = big.transaction('records', 'readwrite');
      const s = tx.objectStore('records');
      for (let i = start; i < start + 10_000; i++) s.put({ ...D.record(i), _rev: rev(1) });
      await done(tx);
    }
  },
  async w1(run) {
    const name = `bench-raw-w1-${run}`;
    await deleteDb(name);
    const db = await open(name);
    let r = await casPut(db, { ...D.casBase });
    const { ms } = await timed(async () => {
      for (let i = 1; i <= D.W1_OPS; i++) r = await casPut(db, { ...D.casBase, n: i, _rev: r });
    });
    const last = await req(db.transaction('records').objectStore('records').get('cas'));
    db.close();
    await deleteDb(name);
    return { ms, ok: last.n === D.W1_OPS };
  },
  async w2(run) {
    const ids = D.randomIds(run);
    let found = 0;
    const { ms } = await timed(async () => {
      for (const id of ids) {
        const tx = big.transaction('records', 'readonly');
        if (await req(tx.objectStore('records').get(id))) found++;
      }
    });
    return { ms, ok: found === ids.length };
  },
  async w8(run) {
    let found = 0;
    const { ms } = await timed(async () => {
      for (const ids of D.idBatches(run)) {
        const s = big.transaction('records', 'readonly').objectStore('records');
        for (const r of await Promise.all(ids.map((id) => req(s.get(id))))) if (r) found++;
      }
    });
    return { ms, ok: found === D.W8_BATCHES * D.W8_SIZE };
  },
  async w3(run) {
    const name = `bench-raw-w3-${run}`;
    await deleteDb(name);
    const db = await open(name);
    const recs = Array.from({ length: D.W3_COUNT }, (_, i) => D.batchRecord(i));
    const { ms } = await timed(async () => {
      const tx = db.transaction('records', 'readwrite');
      const s = tx.objectStore('records');
      const r1 = rev(1);
      for (const r of recs) s.add({ ...r, _rev: r1 }); // add: fails (and aborts) if the id exists
      await done(tx);
    });
    const n = await req(db.transaction('records').objectStore('records').count());
    db.close();
    await deleteDb(name);
    return { ms, ok: n === D.W3_COUNT };
  },
  async w4(run) {
    const prefixes = D.randomPrefixes(run);
    let ok = true;
    const { ms } = await timed(async () => {
      for (const p of prefixes) {
        const rows = await getAll(big, IDBKeyRange.bound(p, D.successor(p), false, true), D.W4_SIZE + 1);
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
        const rows = await getAll(big, range, D.PAGE + 1);
        const page = rows.slice(0, D.PAGE);
        total += page.length;
        if (rows.length <= D.PAGE) break;
        last = page[page.length - 1]._id;
      }
    });
    return { ms, ok: total === D.BIG };
  },
  async w6(run) {
    const name = `bench-raw-w6-${run}`;
    await deleteDb(name);
    const db = await open(name);
    await casPut(db, { ...D.counterBase });
    const { ms } = await timed(() => Promise.all(Array.from({ length: D.W6_WRITERS }, async () => {
      for (let i = 0; i < D.W6_EACH; i++) await increment(db, 'counter');
    })));
    const last = await req(db.transaction('records').objectStore('records').get('counter'));
    db.close();
    await deleteDb(name);
    return { ms, ok: last.count === D.W6_WRITERS * D.W6_EACH };
  },
  // Derived index kept by hand in its own store, rebuilt in batches of 500
  // records per readwrite transaction (what agentstore's rebuildIndexes does).
  async w7() {
    let n = 0;
    const { ms } = await timed(async () => {
      const c = big.transaction('derived', 'readwrite');
      c.objectStore('derived').clear();
      await done(c);
      let last = null;
      for (;;) {
        const tx = big.transaction(['records', 'derived'], 'readwrite');
        const range = last === null ? null : IDBKeyRange.lowerBound(last, true);
        const rows = await req(tx.objectStore('records').getAll(range, D.PAGE));
        const d = tx.objectStore('derived');
        for (const r of rows) d.put(r._id, [r.recordType, r.updatedAt, r._id]);
        await done(tx);
        n += rows.length;
        if (rows.length < D.PAGE) break;
        last = rows[rows.length - 1]._id;
      }
    });
    const entries = await req(big.transaction('derived').objectStore('derived').count());
    return { ms, ok: n === D.BIG && entries === D.BIG };
  },
});
