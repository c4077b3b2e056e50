// agentstore (the wasm SDK from pkg/), through its public JS API only.
import init, { AgentStore } from '/pkg/agentstore.js';
import { register, timed, deleteDb } from './harness.js';
import * as D from './data.js';

const INDEXES = [{ name: 'byType', keys: ['recordType', 'updatedAt'] }];
let big;

async function fresh(name, options) {
  await deleteDb(name);
  return AgentStore.open(name, options);
}
async function drop(s, name) {
  s.close();
  await deleteDb(name);
}

register({
  name: 'agentstore',
  async init() {
    await init();
  },
  async seed() {
    big = await AgentStore.open('bench-as-big', { indexes: INDEXES });
    const page = await big.list({ prefix: D.prefixOf(D.PREFIXES - 1), limit: 10_000 });
    if (page.records.length === D.BIG / D.PREFIXES) return;
    for (let start = 0; start < D.BIG; start += 10_000) {
      await big.putMany(Array.from({ length: 10_000 }, (_, k) => D.record(start + k)));
    }
  },
  async w1(run) {
    const name = `bench-as-w1-${run}`;
    const s = await fresh(name);
    let { rev } = await s.put({ ...D.casBase });
    const { ms } = await timed(async () => {
      for (let i = 1; i <= D.W1_OPS; i++) ({ rev } = await s.put({ ...D.casBase, n: i, _rev: rev }));
    });
    const last = await s.get('cas');
    await drop(s, name);
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
      for (const ids of D.idBatches(run)) for (const r of await big.getMany(ids)) if (r) found++;
    });
    return { ms, ok: found === D.W8_BATCHES * D.W8_SIZE };
  },
  async w3(run) {
    const name = `bench-as-w3-${run}`;
    const s = await fresh(name);
    const recs = Array.from({ length: D.W3_COUNT }, (_, i) => D.batchRecord(i));
    const { ms, out } = await timed(() => s.putMany(recs));
    const page = await s.list({ limit: 10_000 });
    await drop(s, name);
    return { ms, ok: out.length === D.W3_COUNT && page.records.length === D.W3_COUNT };
  },
  async w4(run) {
    const prefixes = D.randomPrefixes(run);
    let ok = true;
    const { ms } = await timed(async () => {
      for (const prefix of prefixes) {
        const page = await big.list({ prefix, limit: D.W4_SIZE });
        ok &&= page.records.length === D.W4_SIZE && page.next === null;
      }
    });
    return { ms, ok };
  },
  async w5() {
    let total = 0;
    const { ms } = await timed(async () => {
      let after;
      do {
        const page = await big.list({ limit: D.PAGE, after });
        total += page.records.length;
        after = page.next ?? undefined;
      } while (after !== undefined);
    });
    return { ms, ok: total === D.BIG };
  },
  async w6(run) {
    const name = `bench-as-w6-${run}`;
    const s = await fresh(name);
    await s.put({ ...D.counterBase });
    const { ms } = await timed(() => Promise.all(Array.from({ length: D.W6_WRITERS }, async () => {
      for (let i = 0; i < D.W6_EACH; i++) {
        await s.mutate('counter', (c) => ({ ...c, count: c.count + 1 }), { retries: 1000 });
      }
    })));
    const last = await s.get('counter');
    await drop(s, name);
    return { ms, ok: last.count === D.W6_WRITERS * D.W6_EACH };
  },
  async w7() {
    const { ms, out } = await timed(() => big.rebuildIndexes({ batchSize: D.PAGE }));
    const v = await big.verifyIndexes();
    const clean = v.missing.length + v.orphaned.length + v.stale.length === 0;
    return { ms, ok: out === D.BIG && clean };
  },
});
