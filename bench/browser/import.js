// Import/export memory and time (bench/import.mjs): agentstore's streaming
// importPouchDump / exportSnapshot / rebuildIndexes next to raw IndexedDB doing
// the same writes (same object stores and native index, same batch size).
// Served as is (no bundling); `wasmBytes()` reads the linear memory of the
// module each phase runs in: imports and exports run in the package's
// import/export module (pkg/io/, which the store loads on their first call;
// init() loads it up front so its download is not timed), and so does
// rebuildIndexes (index maintenance ships in the same module).
import init, { AgentStore } from '/pkg/agentstore.js';

let wasm;
let ioWasm;
const BATCH = 1000;
const BOOKKEEPING = ['_revisions', '_conflicts', '_deleted', '_attachments', '_revs_info', '_deleted_conflicts'];

const req = (r) => new Promise((res, rej) => { r.onsuccess = () => res(r.result); r.onerror = () => rej(r.error); });
const done = (tx) => new Promise((res, rej) => { tx.oncomplete = res; tx.onabort = tx.onerror = () => rej(tx.error); });
const deleteDb = (name) => new Promise((res) => { const r = indexedDB.deleteDatabase(name); r.onsuccess = r.onerror = r.onblocked = res; });

async function openRaw(name) {
  await deleteDb(name);
  const r = indexedDB.open(name, 1);
  r.onupgradeneeded = () => {
    const db = r.result;
    db.createObjectStore('records', { keyPath: '_id' }).createIndex('byType', ['recordType', '_id']);
    db.createObjectStore('tombstones', { keyPath: '_id' });
    db.createObjectStore('derived');
  };
  return req(r);
}

async function* lines(blob) {
  const reader = blob.stream().pipeThrough(new TextDecoderStream()).getReader();
  let carry = '';
  for (;;) {
    const { done: end, value } = await reader.read();
    if (end) break;
    const parts = (carry + value).split('\n');
    carry = parts.pop();
    yield* parts;
  }
  if (carry) yield carry;
}

async function dumpBlob() {
  return (await fetch('/dump.ndjson')).blob();
}

window.bench = {
  async init() {
    wasm = await init();
    // The same module instance the store's loader imports (one URL, one module).
    ioWasm = await (await import('/pkg/io/agentstore_io.js')).default();
  },
  wasmBytes: (io = false) => (io ? ioWasm : wasm).memory.buffer.byteLength,

  // Raw IndexedDB: stream the same dump, JSON.parse each line, write every
  // doc (last row of an id wins: the generated dump's ids are unique) in
  // transactions of BATCH records.
  async rawImport() {
    const blob = await dumpBlob();
    const db = await openRaw('bench-imp-raw');
    const t0 = performance.now();
    let batch = [];
    let n = 0;
    const flush = async () => {
      const tx = db.transaction(['records', 'tombstones'], 'readwrite');
      const rs = tx.objectStore('records');
      const ts = tx.objectStore('tombstones');
      for (const d of batch) {
        if (d._deleted) ts.put({ _id: d._id, _rev: d._rev, _deleted: true });
        else { for (const f of BOOKKEEPING) delete d[f]; rs.put(d); }
      }
      await done(tx);
      n += batch.length;
      batch = [];
    };
    for await (const line of lines(blob)) {
      if (!line.trim()) continue;
      const v = JSON.parse(line);
      if (!v.docs) continue;
      for (const d of v.docs) {
        batch.push(d);
        if (batch.length >= BATCH) await flush();
      }
    }
    if (batch.length) await flush();
    const ms = performance.now() - t0;
    db.close();
    return { ms, n };
  },

  async rawExport() {
    const r = indexedDB.open('bench-imp-raw');
    const db = await req(r);
    const t0 = performance.now();
    const tx = db.transaction(['records', 'tombstones'], 'readonly');
    const parts = [];
    let n = 0;
    for (const name of ['records', 'tombstones']) {
      const s = tx.objectStore(name);
      let after;
      for (;;) {
        const rows = await req(s.getAll(after === undefined ? null : IDBKeyRange.lowerBound(after, true), BATCH));
        if (!rows.length) break;
        parts.push(rows.map((x) => JSON.stringify(x)).join('\n') + '\n');
        n += rows.length;
        after = rows[rows.length - 1]._id;
        if (rows.length < BATCH) break;
      }
    }
    const blob = new Blob(parts);
    const ms = performance.now() - t0;
    db.close();
    return { ms, n, bytes: blob.size };
  },

  // Raw index build: every record's [tag, recordType, updatedAt, _id] entry,
  // BATCH records per readwrite transaction.
  async rawRebuild() {
    const db = await req(indexedDB.open('bench-imp-raw'));
    const t0 = performance.now();
    let after;
    let n = 0;
    for (;;) {
      const tx = db.transaction(['records', 'derived'], 'readwrite');
      const rows = await req(tx.objectStore('records').getAll(after === undefined ? null : IDBKeyRange.lowerBound(after, true), BATCH));
      const der = tx.objectStore('derived');
      for (const x of rows) {
        if (typeof x.recordType === 'string' && typeof x.updatedAt === 'string') der.put(x._id, ['t', x.recordType, x.updatedAt, x._id]);
      }
      await done(tx);
      n += rows.length;
      if (rows.length < BATCH) break;
      after = rows[rows.length - 1]._id;
    }
    const ms = performance.now() - t0;
    db.close();
    return { ms, n };
  },

  async agentImport() {
    const blob = await dumpBlob();
    await deleteDb('bench-imp-as');
    const s = await AgentStore.open('bench-imp-as');
    const before = ioWasm.memory.buffer.byteLength;
    let peak = before;
    const t0 = performance.now();
    const sum = await s.importPouchDump(blob, {
      batchSize: BATCH,
      onProgress: () => { peak = Math.max(peak, ioWasm.memory.buffer.byteLength); },
    });
    const ms = performance.now() - t0;
    peak = Math.max(peak, ioWasm.memory.buffer.byteLength);
    s.close();
    return { ms, n: sum.written, before, peak, after: ioWasm.memory.buffer.byteLength, documentsRead: sum.documentsRead };
  },

  async agentExport() {
    const s = await AgentStore.open('bench-imp-as');
    const t0 = performance.now();
    const blob = await s.exportSnapshotBlob({ batchSize: BATCH });
    const ms = performance.now() - t0;
    s.close();
    return { ms, bytes: blob.size, after: ioWasm.memory.buffer.byteLength };
  },

  async agentRebuild() {
    const s = await AgentStore.open('bench-imp-as', { indexes: [{ name: 'byType', keys: ['recordType', 'updatedAt'] }] });
    const t0 = performance.now();
    const n = await s.rebuildIndexes({ batchSize: BATCH });
    const ms = performance.now() - t0;
    s.close();
    return { ms, n, after: ioWasm.memory.buffer.byteLength };
  },

  async cleanup() {
    await deleteDb('bench-imp-raw');
    await deleteDb('bench-imp-as');
  },
};
