// Analysis contender (not in the default run): plain JS issuing exactly the
// IndexedDB requests agentstore issues (src/store/mod.rs, list.rs, io.rs) —
// the same schema (the records store's native `byType` index included),
// 4-store write transactions, the index state's generation and the live
// record (its tombstone only when it is missing) read before every
// write, readonly transactions awaited to `complete`, a BroadcastChannel post
// after each write, mutate as a read transaction then a CAS write transaction.
// agentstore minus this = time spent in wasm, glue and crossings.
//
// `run-browser.mjs --pattern-drop gen,post,scope,bytype` adds one copy of this
// contender per listed part with that part of the pattern left out (DROP
// below), to show what each part of the pattern costs against raw.
import { register, timed, deleteDb } from './harness.js';
import * as D from './data.js';

const req = (r) => new Promise((res, rej) => { r.onsuccess = () => res(r.result); r.onerror = () => rej(r.error); });
const done = (tx) => new Promise((res, rej) => {
  tx.oncomplete = () => res();
  tx.onerror = () => rej(tx.error);
  tx.onabort = () => rej(tx.error || new DOMException('aborted', 'AbortError'));
});
// Parts of the pattern left out (set in the generated copies only): `gen`
// the generation read, `post` the BroadcastChannel post, `scope` META and
// DERIVED in the write scope (records and tombstones only; the generation
// read, which needs META, goes with them), `derived` DERIVED only in the write
// scope, `bytype` the native `byType` index.
const DROP = new Set([]);
if (DROP.has('scope')) DROP.add('gen');
const SCOPE = ['records', 'tombstones', 'meta', 'derived'].filter(
  (s) => !(DROP.has('scope') && (s === 'meta' || s === 'derived')) && !(DROP.has('derived') && s === 'derived'),
);
function open(name) {
  return new Promise((res, rej) => {
    const r = indexedDB.open(name, 1);
    r.onupgradeneeded = () => {
      // The native index agentstore's records store has (`count`/`list` by type).
      const records = r.result.createObjectStore('records', { keyPath: '_id' });
      if (!DROP.has('bytype')) records.createIndex('byType', ['recordType', '_id']);
      r.result.createObjectStore('tombstones', { keyPath: '_id' });
      r.result.createObjectStore('meta');
      r.result.createObjectStore('derived');
    };
    r.onsuccess = () => res(r.result);
    r.onerror = () => rej(r.error);
  });
}
const rev = (g) => `${g}-${((g * 2654435761) >>> 0).toString(16).padStart(8, '0')}`;
const gen = (r) => parseInt(r, 10);
const channels = new Map();
const post = (name, changes) => {
  if (DROP.has('post')) return;
  if (!channels.has(name)) channels.set(name, new BroadcastChannel(`agentstore:${name}`));
  channels.get(name).postMessage(changes);
};

async function casPut(db, name, record) {
  const tx = db.transaction(SCOPE, 'readwrite');
  const [, live] = await Promise.all([
    DROP.has('gen') ? undefined : req(tx.objectStore('meta').get('indexes-gen')),
    req(tx.objectStore('records').get(record._id)),
  ]);
  // The tombstone is read only when nothing live is stored.
  const tomb = live ? undefined : await req(tx.objectStore('tombstones').get(record._id));
  const cur = live || tomb;
  if ((live ? live._rev : undefined) !== record._rev) {
    tx.abort();
    throw Object.assign(new Error('conflict'), { conflict: true });
  }
  const out = rev(cur ? gen(cur._rev) + 1 : 1);
  tx.objectStore('records').put({ ...record, _rev: out });
  await done(tx);
  post(name, [{ id: record._id, rev: out, deleted: false }]);
  return out;
}
async function get(db, id) {
  const tx = db.transaction('records', 'readonly');
  const v = await req(tx.objectStore('records').get(id));
  await done(tx);
  return v;
}

let big;
register({
  name: 'raw, agentstore pattern',
  async seed() {
    big = await open('bench-rawp-big');
    const n = await req(big.transaction('records').objectStore('records').count());
    if (n === D.BIG) return;
    for (let start = 0; start < D.BIG; start += 10_000) {
      const tx = big.transaction('records', 'readwrite');
      for (let i = start; i < start + 10_000; i++) tx.objectStore('records').put({ ...D.record(i), _rev: rev(1) });
      await done(tx);
    }
  },
  async w1(run) {
    const name = `bench-rawp-w1-${run}`;
    await deleteDb(name);
    const db = await open(name);
    let r = await casPut(db, name, { ...D.casBase });
    const { ms } = await timed(async () => {
      for (let i = 1; i <= D.W1_OPS; i++) r = await casPut(db, name, { ...D.casBase, n: i, _rev: r });
    });
    const last = await get(db, 'cas');
    db.close();
    await deleteDb(name);
    return { ms, ok: last.n === D.W1_OPS };
  },
  async w2(run) {
    const ids = D.randomIds(run);
    let found = 0;
    const { ms } = await timed(async () => {
      for (const id of ids) if (await get(big, id)) found++;
    });
    return { ms, ok: found === ids.length };
  },
  async w3(run) {
    const name = `bench-rawp-w3-${run}`;
    await deleteDb(name);
    const db = await open(name);
    const recs = Array.from({ length: D.W3_COUNT }, (_, i) => D.batchRecord(i));
    const { ms } = await timed(async () => {
      const tx = db.transaction(SCOPE, 'readwrite');
      const rs = tx.objectStore('records');
      const ts = tx.objectStore('tombstones');
      // As putMany of new ids (src/store/mod.rs read_batch): the index
      // state's generation, then one count per store over the ids' span,
      // then an add per record.
      const ids = recs.map((r) => r._id).sort();
      const span = IDBKeyRange.bound(ids[0], ids[ids.length - 1]);
      const got = await Promise.all([DROP.has('gen') ? undefined : req(tx.objectStore('meta').get('indexes-gen')), req(rs.count(span)), req(ts.count(span))]);
      if (got[1] !== 0 || got[2] !== 0) throw new Error('conflict');
      const r1 = rev(1);
      for (const r of recs) rs.add({ ...r, _rev: r1 });
      await done(tx);
      post(name, recs.map((r) => ({ id: r._id, rev: r1, deleted: false })));
    });
    const n = await req(db.transaction('records').objectStore('records').count());
    db.close();
    await deleteDb(name);
    return { ms, ok: n === D.W3_COUNT };
  },
  async w5() {
    let total = 0;
    const { ms } = await timed(async () => {
      let last = null;
      for (;;) {
        const tx = big.transaction('records', 'readonly');
        const range = last === null ? null : IDBKeyRange.lowerBound(last, true);
        const rows = await req(tx.objectStore('records').getAll(range, D.PAGE + 1));
        await done(tx);
        const page = rows.slice(0, D.PAGE);
        total += page.length;
        if (rows.length <= D.PAGE) break;
        last = page[page.length - 1]._id;
      }
    });
    return { ms, ok: total === D.BIG };
  },
  // mutate's shape: a readonly get transaction, the function, then a CAS write
  // transaction; a conflict re-reads at once (agentstore sleeps a jittered backoff).
  async w6(run) {
    const name = `bench-rawp-w6-${run}`;
    await deleteDb(name);
    const db = await open(name);
    await casPut(db, name, { ...D.counterBase });
    let conflicts = 0;
    const { ms } = await timed(() => Promise.all(Array.from({ length: D.W6_WRITERS }, async () => {
      for (let i = 0; i < D.W6_EACH; i++) {
        for (;;) {
          const cur = await get(db, 'counter');
          try {
            await casPut(db, name, { ...cur, count: cur.count + 1 });
            break;
          } catch (e) {
            if (!e.conflict) throw e;
            conflicts++;
          }
        }
      }
    })));
    const last = await get(db, 'counter');
    db.close();
    await deleteDb(name);
    return { ms, ok: last.count === D.W6_WRITERS * D.W6_EACH, note: `${conflicts} conflicts retried` };
  },
});
