// Server benchmarks, loopback only, each `--runs` times with a fresh
// database/queue; prints a Markdown table of medians (by items/s) and writes the
// raw reports as JSON. Two shapes per item:
// - claim → 3 heartbeats → settle (the lease protocol's working shape), and
// - claim → settle (like for like with pg-boss's fetch → complete),
// on SQLite and on PostgreSQL (1 instance; 2 with `--two-instances`), and
// pg-boss on the same PostgreSQL. agentstore-server's PostgreSQL pool and
// pg-boss's pool are both `--pool` connections.
//
//   node bench/run-server.mjs --pg-admin-url postgres://postgres@127.0.0.1:55432/postgres \
//     [--runs 3] [--items 4000] [--workers 64] [--pool 20] [--max-secs 60] [--two-instances]
import { spawn, execFileSync } from 'node:child_process';
import { mkdtemp, rm, writeFile, mkdir } from 'node:fs/promises';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join, dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { arg } from './args.mjs';

const HERE = dirname(fileURLToPath(import.meta.url));
const ROOT = resolve(HERE, '..');
const RUNS = Number(arg('runs', 3));
const ITEMS = Number(arg('items', 4000));
const WORKERS = Number(arg('workers', 64));
const MAX_SECS = Number(arg('max-secs', 60));
const POOL = Number(arg('pool', 20));
const TWO = process.argv.includes('--two-instances');
const PG_ADMIN = arg('pg-admin-url');
const OUT = arg('out', join(HERE, 'results', 'server.json'));
const SERVER = join(ROOT, 'target/release/agentstore-server');
const LOADGEN = join(ROOT, 'target/release/agentstore-loadgen');
const ADMIN = 'bench-admin-token';
const BENCH_DB = 'agentstore_bench';
const log = (...a) => console.error('[bench:server]', ...a);

const freePort = () => new Promise((res) => {
  const s = createServer();
  s.listen(0, '127.0.0.1', () => { const p = s.address().port; s.close(() => res(p)); });
});

async function startServer(database, dir) {
  const port = await freePort();
  // The per-worker claim limit and the per-address enroll limit would throttle
  // the generator (all its workers share one address), not measure the server.
  const pool = database.startsWith('postgres') ? ['--db-pool', String(POOL)] : [];
  const child = spawn(SERVER, ['--listen', `127.0.0.1:${port}`, '--database', database, '--admin-token', ADMIN,
    '--claim-rate', '100000/s', '--auth-rate', '100000/s', ...pool, '--www', dir, '--pkg', dir],
  { stdio: ['ignore', 'ignore', 'pipe'], env: { ...process.env, RUST_LOG: 'warn' } });
  let stderr = '';
  child.stderr.on('data', (d) => { stderr += d; });
  const url = `http://127.0.0.1:${port}`;
  for (let i = 0; i < 200; i++) {
    try {
      if ((await fetch(`${url}/v1/health`)).ok) return { url, child };
    } catch { /* not up yet */ }
    if (child.exitCode !== null) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  child.kill('SIGTERM');
  throw new Error(`agentstore-server did not start: ${stderr}`);
}
const stop = (s) => new Promise((res) => {
  if (s.child.exitCode !== null) return res();
  s.child.once('exit', res);
  s.child.kill('SIGTERM');
});

function loadgen(urls, heartbeats) {
  const out = execFileSync(LOADGEN, [...urls.flatMap((u) => ['--server', u]), '--admin-token', ADMIN,
    '--items', String(ITEMS), '--workers', String(WORKERS), '--heartbeats', String(heartbeats),
    '--max-secs', String(MAX_SECS), '--json'],
  { encoding: 'utf8', timeout: (MAX_SECS + 120) * 1000 });
  return JSON.parse(out.trim().split('\n').pop());
}

async function freshPgDb() {
  const c = new pg.Client({ connectionString: PG_ADMIN });
  await c.connect();
  await c.query(`DROP DATABASE IF EXISTS ${BENCH_DB} WITH (FORCE)`);
  await c.query(`CREATE DATABASE ${BENCH_DB}`);
  await c.end();
  const u = new URL(PG_ADMIN);
  u.pathname = `/${BENCH_DB}`;
  return u.toString();
}

const HB = 'claim → 3 heartbeats → settle';
const LIKE = 'claim → settle';
const sqlite = (heartbeats) => async (dir) => {
  const s = await startServer(join(dir, 'bench.sqlite'), dir);
  try { return loadgen([s.url], heartbeats); } finally { await stop(s); }
};
const postgres = (instances, heartbeats) => async (dir) => {
  const db = await freshPgDb();
  const servers = [];
  try {
    // One at a time: the first runs the migrations.
    for (let i = 0; i < instances; i++) servers.push(await startServer(db, dir));
    return loadgen(servers.map((s) => s.url), heartbeats);
  } finally {
    for (const s of servers) await stop(s);
  }
};
const scenarios = [
  [`agentstore-server, SQLite, ${HB}`, sqlite(3)],
  [`agentstore-server, SQLite, ${LIKE}`, sqlite(0)],
];
if (PG_ADMIN) {
  scenarios.push(
    [`agentstore-server, PostgreSQL (pool ${POOL}), ${HB}`, postgres(1, 3)],
    [`agentstore-server, PostgreSQL (pool ${POOL}), ${LIKE}`, postgres(1, 0)],
    ...(TWO ? [[`agentstore-server ×2, PostgreSQL (pool ${POOL} each), ${HB}`, postgres(2, 3)]] : []),
    [`pg-boss 12 fetch → complete, PostgreSQL (pool ${POOL})`, async () => {
      const db = await freshPgDb();
      const out = execFileSync(process.execPath, [join(HERE, 'pgboss.mjs'), '--url', db, '--items', String(ITEMS),
        '--workers', String(WORKERS), '--pool', String(POOL), '--max-secs', String(MAX_SECS)],
      { encoding: 'utf8', timeout: (MAX_SECS + 120) * 1000 });
      return JSON.parse(out.trim().split('\n').pop());
    }],
  );
} else {
  log('no --pg-admin-url: PostgreSQL scenarios skipped');
}

const reports = {};
for (let run = 0; run < RUNS; run++) {
  for (const [name, fn] of scenarios) {
    const dir = await mkdtemp(join(tmpdir(), 'agentstore-bench-srv-'));
    try {
      const r = await fn(dir);
      (reports[name] ||= []).push(r);
      log(`run ${run + 1} ${name}: ${r.settled}/${r.items} items, ${r.items_per_s.toFixed(0)} items/s, p99 ${r.all.p99_ms.toFixed(1)} ms`);
    } catch (e) {
      log(`run ${run + 1} ${name}: FAILED ${e.message}`);
      (reports[name] ||= []).push(null);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  }
}

const medianBy = (rs) => {
  const ok = rs.filter(Boolean).sort((a, b) => a.items_per_s - b.items_per_s);
  return ok.length ? ok[(ok.length - 1) >> 1] : null;
};
const f0 = (x) => (x === undefined ? '—' : x.toFixed(0));
const f1 = (x) => (x === undefined ? '—' : x.toFixed(1));
let md = `${WORKERS} concurrent workers, ${ITEMS.toLocaleString('en')} items per run, ${RUNS} runs; the run with the median items/s is shown (all its columns from that run). agentstore: one HTTP request per step; pg-boss: fetch → complete per item, in-process (no HTTP). Like for like: "claim → settle" against pg-boss, same pool.\n\n`;
md += '| scenario | items/s | heartbeats/s | requests/s | p50 ms | p99 ms | claim p99 | heartbeat p99 | settle p99 | settled | errors |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n';
for (const [name] of scenarios) {
  const r = medianBy(reports[name] || []);
  if (!r) { md += `| ${name} | failed | | | | | | | | | |\n`; continue; }
  const claim = r.claim || r.fetch;
  const settle = r.settle || r.complete;
  md += `| ${name} | ${f0(r.items_per_s)} | ${r.heartbeats_per_s === undefined ? 'n/a' : f0(r.heartbeats_per_s)} | ${f0(r.requests_per_s)} | ${f1(r.all.p50_ms)} | ${f1(r.all.p99_ms)} | ${f1(claim.p99_ms)} | ${r.heartbeat ? f1(r.heartbeat.p99_ms) : 'n/a'} | ${f1(settle.p99_ms)} | ${r.settled}/${r.items}${r.timed_out ? ' (time bound)' : ''} | ${r.errors} |\n`;
}
md += '\nAll runs, items/s: ' + scenarios.map(([n]) => `${n}: ${(reports[n] || []).map((r) => (r ? r.items_per_s.toFixed(0) : 'failed')).join(', ')}`).join('; ') + '.\n';
console.log(md);
await mkdir(dirname(OUT), { recursive: true });
await writeFile(OUT, JSON.stringify({ runs: RUNS, items: ITEMS, workers: WORKERS, reports, markdown: md }, null, 1));
