// Import / export / index-rebuild benchmark: time next to raw IndexedDB doing
// the same writes, and the wasm module's linear memory (WebAssembly.Memory
// buffer byteLength, read from the page) before, at its peak and after: for
// imports, exports and the rebuild the package's import/export module's
// (pkg/io/, where they run: index maintenance ships in it too).
//
// The dump is generated here, never committed: the shared PouchDB dump's
// documents copied COPIES times under new ids (`c<k>:<id>`), ~120,000 docs.
// Each phase runs in a fresh page (wasm memory never shrinks, so a fresh
// module shows what that phase alone needs); headless Chromium, on-disk
// profile. Needs pkg/ (wasm-pack --release) and playwright-core.
//
//   node bench/import.mjs [--runs 3] [--copies 40]
import { createServer } from 'node:http';
import { readFile, writeFile, mkdtemp, rm, stat } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, dirname, resolve, extname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createRequire } from 'node:module';
import { arg } from './args.mjs';

const HERE = dirname(fileURLToPath(import.meta.url));
const ROOT = resolve(HERE, '..');
const RUNS = Number(arg('runs', 3));
const COPIES = Number(arg('copies', 40));
const log = (...a) => console.error('[bench:import]', ...a);
// playwright-core from bench/ (scripts/bench.sh installs it) or the root (npm ci).
const require = createRequire(import.meta.url);
let chromium;
for (const from of [join(HERE, 'package.json'), join(ROOT, 'package.json')]) {
  try { ({ chromium } = createRequire(from)('playwright-core')); break; } catch { /* next */ }
}
if (!chromium) ({ chromium } = require('playwright-core'));

// ---- the dump --------------------------------------------------------------
const shared = (await readFile(join(ROOT, 'www/data/agent-records.pouchdump.ndjson'), 'utf8')).split('\n').filter((l) => l.trim());
const out = [shared[0]];
let docs = 0;
for (let k = 0; k < COPIES; k++) {
  for (const line of shared.slice(1)) {
    const v = JSON.parse(line);
    if (v.docs) {
      for (const d of v.docs) d._id = `c${k}:${d._id}`;
      docs += v.docs.length;
    }
    out.push(JSON.stringify(v));
  }
}
const dumpFile = join(tmpdir(), `agentstore-bench-dump-${process.pid}.ndjson`);
await writeFile(dumpFile, out.join('\n') + '\n');
const dumpBytes = (await stat(dumpFile)).size;
log(`dump: ${docs.toLocaleString('en')} docs, ${(dumpBytes / 2 ** 20).toFixed(1)} MiB (${COPIES} copies of the shared dump)`);

// ---- static server (loopback) ------------------------------------------------
const MIME = { '.html': 'text/html', '.js': 'text/javascript', '.wasm': 'application/wasm', '.ndjson': 'application/x-ndjson' };
const PAGE = '<!doctype html><meta charset="utf-8"><title>import bench</title><script type="module">import("/bench/browser/import.js").then(() => window.bench.init()).then(() => { document.title = "ready"; }, (e) => { document.title = "error: " + e; });</script>';
const server = createServer(async (req, res) => {
  const path = decodeURIComponent(new URL(req.url, 'http://x').pathname);
  if (path === '/import.html') { res.writeHead(200, { 'content-type': 'text/html' }).end(PAGE); return; }
  let file = null;
  if (path === '/dump.ndjson') file = dumpFile;
  else if (path === '/bench/browser/import.js') file = join(HERE, 'browser/import.js');
  else if (path.startsWith('/pkg/')) file = join(ROOT, 'pkg', path.slice('/pkg/'.length));
  if (!file || path.includes('..')) { res.writeHead(404).end(); return; }
  try {
    const body = await readFile(file);
    res.writeHead(200, { 'content-type': MIME[extname(file)] || 'application/octet-stream', 'cache-control': 'no-store' }).end(body);
  } catch {
    res.writeHead(404).end();
  }
});
await new Promise((r) => server.listen(0, '127.0.0.1', r));
const base = `http://127.0.0.1:${server.address().port}`;

const profile = await mkdtemp(join(tmpdir(), 'agentstore-bench-import-'));
const ctx = await chromium.launchPersistentContext(profile, {
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  headless: true,
  args: ['--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update',
    '--disable-sync', '--no-first-run', '--disable-background-timer-throttling', '--disable-renderer-backgrounding'],
});
const version = ctx.browser()?.version() ?? 'unknown';

// --profile: print where agentstore's phases spend their time (self time, top 15).
const PROFILE = process.argv.includes('--profile');
function topSelf(label, profile) {
  const byId = new Map(profile.nodes.map((n) => [n.id, n]));
  const self = {};
  profile.samples.forEach((id, i) => {
    const { functionName, url } = byId.get(id).callFrame;
    const k = `${functionName || '(anon)'} ${url.split('/').pop()}`;
    self[k] = (self[k] || 0) + (profile.timeDeltas[i] || 0) / 1000;
  });
  const top = Object.entries(self).sort((a, b) => b[1] - a[1]).slice(0, 15);
  log(`${label} self time (ms): ${top.map(([k, v]) => `${k}: ${v.toFixed(0)}`).join('; ')}`);
}

/** Runs `fns` (names of window.bench functions) in one fresh page. */
async function inPage(fns) {
  const page = await ctx.newPage();
  page.on('pageerror', (e) => log('page error:', e.message));
  await page.goto(`${base}/import.html`);
  await page.waitForFunction(() => document.title !== 'import bench', null, { timeout: 60_000 });
  if ((await page.title()) !== 'ready') throw new Error(await page.title());
  // Fresh memory of the entry point's module and of the import/export one.
  const out = {
    fresh: await page.evaluate(() => window.bench.wasmBytes()),
    freshIo: await page.evaluate(() => window.bench.wasmBytes(true)),
  };
  for (const f of fns) {
    const cdp = PROFILE && f.startsWith('agent') ? await ctx.newCDPSession(page) : null;
    if (cdp) {
      await cdp.send('Profiler.enable');
      await cdp.send('Profiler.start');
    }
    out[f] = await page.evaluate((f) => window.bench[f](), f);
    if (cdp) topSelf(f, (await cdp.send('Profiler.stop')).profile);
  }
  await page.close();
  return out;
}

const samples = [];
try {
  for (let run = 0; run < RUNS; run++) {
    const imp = await inPage(run % 2 ? ['agentImport', 'rawImport'] : ['rawImport', 'agentImport']);
    const exp = await inPage(['rawExport', 'agentExport']);
    const reb = await inPage(['rawRebuild', 'agentRebuild']);
    const cleanup = await inPage(['cleanup']);
    void cleanup;
    samples.push({ imp, exp, reb });
    log(`run ${run + 1}/${RUNS}: import raw ${imp.rawImport.ms.toFixed(0)} ms, agentstore ${imp.agentImport.ms.toFixed(0)} ms (${imp.agentImport.n} written); export raw ${exp.rawExport.ms.toFixed(0)} / ${exp.agentExport.ms.toFixed(0)} ms; rebuild raw ${reb.rawRebuild.ms.toFixed(0)} / ${reb.agentRebuild.ms.toFixed(0)} ms`);
    if (imp.agentImport.n !== imp.rawImport.n) log(`WARNING: agentstore wrote ${imp.agentImport.n}, raw ${imp.rawImport.n}`);
  }
} finally {
  await ctx.close();
  server.close();
  await rm(profile, { recursive: true, force: true });
  await rm(dumpFile, { force: true });
}

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
};
const mib = (b) => (b / 2 ** 20).toFixed(1);
const row = (label, raw, as, mem) => {
  const r = median(raw);
  const a = median(as);
  return `| ${label} | ${r.toFixed(0)} | ${a.toFixed(0)} | ${(a / r).toFixed(2)}× | ${mem} |\n`;
};
const max = (xs) => Math.max(...xs);
let md = `${docs.toLocaleString('en')} documents, ${mib(dumpBytes)} MiB dump (${COPIES} copies of the shared dump under new ids), batches of 1,000; headless Chromium ${version}; median ms of ${samples.length} runs, each phase in a fresh page.\n\n`;
md += '| phase | raw IndexedDB ms | agentstore ms | agentstore ÷ raw | wasm memory: fresh → peak → after (MiB, max over runs) |\n|---|---:|---:|---:|---|\n';
md += row('importPouchDump(Blob) vs raw stream + JSON.parse + put', samples.map((s) => s.imp.rawImport.ms), samples.map((s) => s.imp.agentImport.ms),
  `${mib(max(samples.map((s) => s.imp.freshIo)))} → ${mib(max(samples.map((s) => s.imp.agentImport.peak)))} → ${mib(max(samples.map((s) => s.imp.agentImport.after)))}`);
md += row('exportSnapshotBlob() vs raw getAll + stringify + Blob', samples.map((s) => s.exp.rawExport.ms), samples.map((s) => s.exp.agentExport.ms),
  `${mib(max(samples.map((s) => s.exp.freshIo)))} → ${mib(max(samples.map((s) => s.exp.agentExport.after)))} (after)`);
md += row('rebuildIndexes (1 index) vs raw entry puts', samples.map((s) => s.reb.rawRebuild.ms), samples.map((s) => s.reb.agentRebuild.ms),
  `${mib(max(samples.map((s) => s.reb.freshIo)))} → ${mib(max(samples.map((s) => s.reb.agentRebuild.after)))} (after)`);
console.log(md);
