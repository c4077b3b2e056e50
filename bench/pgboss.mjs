// pg-boss on the same PostgreSQL as agentstore-server: `--items` jobs inserted
// (not timed), then `--workers` concurrent loops doing fetch → complete until
// the queue is empty or `--max-secs` passes. Prints one JSON line shaped like
// agentstore-loadgen's report. Pool: `--pool` connections (default 10, pg-boss's
// default and one agentstore-server instance's; run-server.mjs passes the same
// number to both). pg-boss 12 (bench/package-lock.json) runs on Node 20 although
// its `engines` field asks for 22.
//
//   node bench/pgboss.mjs --url postgres://… [--items 4000] [--workers 64] [--pool 10] [--max-secs 60]
import { PgBoss } from 'pg-boss';
import { arg } from './args.mjs';

const url = arg('url');
const items = Number(arg('items', 4000));
const workers = Number(arg('workers', 64));
const maxMs = Number(arg('max-secs', 60)) * 1000;
const pool = Number(arg('pool', 10));
if (!url || !/@(127\.0\.0\.1|localhost|\[::1\])[:/]/.test(url)) {
  console.error('pgboss.mjs: --url must be a loopback postgres:// URL');
  process.exit(2);
}

const boss = new PgBoss({ connectionString: url, max: pool, supervise: false, schedule: false });
boss.on('error', (e) => console.error('pg-boss:', e.message));
await boss.start();
const queue = `bench_${Date.now()}`;
await boss.createQueue(queue);
for (let i = 0; i < items; i += 1000) {
  await boss.insert(queue, Array.from({ length: Math.min(1000, items - i) }, () => ({ data: { n: 1 } })));
}

const lat = { fetch: [], complete: [] };
let done = 0;
let errors = 0;
const t0 = performance.now();
const deadline = t0 + maxMs;
await Promise.all(Array.from({ length: workers }, async () => {
  while (performance.now() < deadline) {
    let t = performance.now();
    let jobs;
    try {
      jobs = await boss.fetch(queue);
    } catch {
      errors++;
      continue;
    } finally {
      lat.fetch.push(performance.now() - t);
    }
    if (!jobs || jobs.length === 0) break;
    t = performance.now();
    try {
      await boss.complete(queue, jobs[0].id, { ok: true });
      done++;
    } catch {
      errors++;
    }
    lat.complete.push(performance.now() - t);
  }
}));
const elapsed = (performance.now() - t0) / 1000;
const pct = (xs, p) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length ? s[Math.min(s.length, Math.max(1, Math.ceil((p / 100) * s.length))) - 1] : 0;
};
const summary = (xs) => ({ count: xs.length, p50_ms: pct(xs, 50), p99_ms: pct(xs, 99), max_ms: pct(xs, 100) });
const all = [...lat.fetch, ...lat.complete];
console.log(JSON.stringify({
  workers, items, pool, settled: done, errors, timed_out: performance.now() >= deadline, elapsed_s: elapsed,
  items_per_s: done / elapsed, requests_per_s: all.length / elapsed,
  all: summary(all), fetch: summary(lat.fetch), complete: summary(lat.complete),
}));
await boss.deleteQueue(queue).catch(() => {});
await boss.stop({ graceful: false, wait: false }).catch(() => {});
process.exit(0);
