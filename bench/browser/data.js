// Deterministic data shared by every contender: the same records, the same
// random ids, the same prefixes in every page.

export const BIG = 100_000; // records in the shared listing/paging/rebuild set
export const PREFIXES = 100; // BIG / PREFIXES records under each prefix
export const TYPES = ['task', 'note', 'event', 'message', 'artifact'];
const BASE = Date.UTC(2025, 0, 1);
const pad = (n, w) => String(n).padStart(w, '0');

/** Record `i` of the 100,000-record set: ids `agent-042/rec-0017`. */
export function record(i) {
  const p = Math.floor(i / (BIG / PREFIXES));
  const k = i % (BIG / PREFIXES);
  return {
    _id: `agent-${pad(p, 3)}/rec-${pad(k, 4)}`,
    recordType: TYPES[i % TYPES.length],
    updatedAt: new Date(BASE + i * 1000).toISOString(),
    title: `Record ${i}`,
    status: i % 3 === 0 ? 'open' : 'done',
    n: i,
    tags: ['bench', TYPES[i % TYPES.length]],
    payload: { score: i % 97, note: 'lorem ipsum dolor sit amet' },
  };
}

/** Record `i` of the 10,000-record batch of workload 3. */
export function batchRecord(i) {
  return { ...record(i), _id: `batch/${pad(i, 5)}` };
}

export const prefixOf = (p) => `agent-${pad(p, 3)}/`;

/** The exclusive upper bound of an ASCII prefix ('/' → '0'). */
export function successor(prefix) {
  return prefix.slice(0, -1) + String.fromCharCode(prefix.charCodeAt(prefix.length - 1) + 1);
}

/** mulberry32: the same sequence in every page for the same seed. */
export function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** The 10,000 ids read by workload 2 in run `run`. */
export function randomIds(run, count = 10_000) {
  const r = rng(1000 + run);
  return Array.from({ length: count }, () => record(Math.floor(r() * BIG))._id);
}

export const W8_BATCHES = 10;
export const W8_SIZE = 1_000;

/** Workload 8: 10 batches of 1,000 random ids of the 100,000 (one getMany / bulkGet each). */
export function idBatches(run) {
  const ids = randomIds(500 + run, W8_BATCHES * W8_SIZE);
  return Array.from({ length: W8_BATCHES }, (_, b) => ids.slice(b * W8_SIZE, (b + 1) * W8_SIZE));
}

/** The 10 prefixes listed by workload 4 in run `run`. */
export function randomPrefixes(run, count = 10) {
  const r = rng(2000 + run);
  return Array.from({ length: count }, () => prefixOf(Math.floor(r() * PREFIXES)));
}

export const W1_OPS = 2_000;
export const W3_COUNT = 10_000;
export const W4_LISTINGS = 10;
export const W4_SIZE = BIG / PREFIXES;
export const PAGE = 500;
export const W6_WRITERS = 4;
export const W6_EACH = 250;

/** The body of the single record updated by workload 1 (plus `n`). */
export const casBase = { _id: 'cas', recordType: 'task', updatedAt: '2025-01-01T00:00:00.000Z', title: 'CAS target', n: 0 };
export const counterBase = { _id: 'counter', recordType: 'task', updatedAt: '2025-01-01T00:00:00.000Z', count: 0 };
