// Browser benchmarks: one headless Chromium (on-disk profile), one page per
// contender, every workload of a run executed for every contender before the
// next run starts (contender order rotated per run). Prints Markdown tables of
// medians and ratios to raw IndexedDB; writes the raw samples as JSON.
//
//   node bench/run-browser.mjs [--runs 5] [--budget-s 1200] [--out file.json] [--only a,b]
import { createServer } from 'node:http';
import { readFile, mkdtemp, rm, writeFile, mkdir } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, dirname, extname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { gzipSync } from 'node:zlib';
import * as esbuild from 'esbuild';
import { chromium } from 'playwright-core';

const HERE = dirname(fileURLToPath(import.meta.url));
const ROOT = resolve(HERE, '..');
const arg = (k, d) => {
  const i = process.argv.indexOf(`--${k}`);
  return i > 0 ? process.argv[i + 1] : d;
};
const RUNS = Number(arg('runs', 5));
const BUDGET_MS = Number(arg('budget-s', 1200)) * 1000;
const OUT = arg('out', join(HERE, 'results', 'browser.json'));
const CONTENDERS = [
  ['raw', 'raw IndexedDB'],
  ['agentstore', 'agentstore'],
  ['dexie', 'Dexie 4'],
  ['pouchdb', 'PouchDB 9'],
  ['idb', 'idb 8'],
  // Analysis only (--only …,rawpattern): agentstore's IndexedDB requests in plain JS.
  ['rawpattern', 'raw, agentstore pattern'],
].filter(([k]) => (arg('only') ? arg('only').split(',').includes(k) : k !== 'rawpattern'));
const PROFILE = process.argv.includes('--profile'); // CPU-profile agentstore's last run
const WORKLOADS = [
  [1, 'CAS update, 2,000 ops, 1 tx each'],
  [2, 'get by id, 10,000 random'],
  [3, 'batch insert 10,000, one tx'],
  [4, 'prefix list 1,000 of 100,000 (×10)'],
  [5, 'page 100,000 by 500'],
  [6, '4 writers × 250 increments'],
  [7, 'derived-index rebuild, 100,000'],
  [8, 'getMany 1,000 of 100,000 (×10)'],
].filter(([w]) => !arg('workloads') || arg('workloads').split(',').includes(String(w)));
const log = (...a) => console.error('[bench:browser]', ...a);
const started = Date.now();

// ---- bundles -------------------------------------------------------------
const DIST = join(HERE, 'dist');
await esbuild.build({
  entryPoints: CONTENDERS.map(([k]) => join(HERE, 'browser', `${k}.js`)),
  outdir: DIST,
  bundle: true,
  format: 'esm',
  target: 'chrome120',
  external: ['/pkg/*'],
  logLevel: 'warning',
  define: { global: 'globalThis' },
});

// ---- sizes: what each contender ships, gzipped (level 9) -----------------
const gz = (buf) => gzipSync(buf, { level: 9 }).length;
async function libSize(code) {
  const r = await esbuild.build({
    stdin: { contents: code, resolveDir: HERE, loader: 'js' },
    bundle: true, minify: true, format: 'esm', write: false, target: 'chrome120',
    define: { global: 'globalThis' }, logLevel: 'silent',
  });
  const b = r.outputFiles[0].contents;
  return { raw: b.length, gzip: gz(b) };
}
const wasm = await readFile(join(ROOT, 'pkg/agentstore_bg.wasm'));
const glue = await readFile(join(ROOT, 'pkg/agentstore.js'));
const glueMin = (await esbuild.transform(glue.toString(), { minify: true, format: 'esm' })).code;
const sizes = {
  agentstore: {
    files: 'pkg/agentstore_bg.wasm + pkg/agentstore.js (as wasm-pack emits it)',
    raw: wasm.length + glue.length,
    gzip: gz(wasm) + gz(glue),
    detail: `wasm ${gz(wasm)} B + glue ${gz(glue)} B gz (glue minified: ${gz(Buffer.from(glueMin))} B gz)`,
  },
  'Dexie 4': { files: 'esbuild --bundle --minify of `dexie`', ...(await libSize("import D from 'dexie'; globalThis.D = D;")) },
  'PouchDB 9': { files: 'esbuild --bundle --minify of pouchdb-core + pouchdb-adapter-indexeddb', ...(await libSize("import P from 'pouchdb-core'; import A from 'pouchdb-adapter-indexeddb'; P.plugin(A); globalThis.P = P;")) },
  'idb 8': { files: 'esbuild --bundle --minify of `idb`', ...(await libSize("import * as I from 'idb'; globalThis.I = I;")) },
  'raw IndexedDB': { files: 'none (the browser API)', raw: 0, gzip: 0 },
};

// ---- static server (loopback) ---------------------------------------------
const MIME = { '.html': 'text/html', '.js': 'text/javascript', '.wasm': 'application/wasm', '.json': 'application/json' };
const server = createServer(async (req, res) => {
  const path = decodeURIComponent(new URL(req.url, 'http://x').pathname);
  let file = null;
  if (path === '/favicon.ico') { res.writeHead(204).end(); return; }
  if (path === '/page.html') file = join(HERE, 'browser/page.html');
  else if (path.startsWith('/bench/dist/')) file = join(DIST, path.slice('/bench/dist/'.length));
  else if (path.startsWith('/pkg/')) file = join(ROOT, 'pkg', path.slice('/pkg/'.length));
  if (!file || file.includes('..')) { res.writeHead(404).end(); return; }
  try {
    const body = await readFile(file);
    res.writeHead(200, { 'content-type': MIME[extname(file)] || 'application/octet-stream', 'cache-control': 'no-store' }).end(body);
  } catch {
    res.writeHead(404).end();
  }
});
// One listening port per contender: a separate origin, so each has its own
// IndexedDB backing store and one contender's compaction cannot stall another's.
const origins = {};
for (const [key] of CONTENDERS) {
  const s = createServer((req, res) => server.emit('request', req, res));
  await new Promise((r) => s.listen(0, '127.0.0.1', r));
  origins[key] = { base: `http://127.0.0.1:${s.address().port}`, server: s };
}

// ---- browser: a persistent (on-disk) profile, so IndexedDB hits the disk ---
const profile = await mkdtemp(join(tmpdir(), 'agentstore-bench-'));
const ctx = await chromium.launchPersistentContext(profile, {
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  headless: true,
  args: ['--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update',
    '--disable-sync', '--no-first-run', '--disable-background-timer-throttling',
    '--disable-renderer-backgrounding', '--disable-backgrounding-occluded-windows'],
});
const browserVersion = ctx.browser()?.version() ?? 'unknown';
const pages = {};
const seedMs = {};
const has = {};
try {
  for (const [key, name] of CONTENDERS) {
    const page = await ctx.newPage();
    page.on('console', (m) => { if (m.type() === 'error') log(`${name} console:`, m.text()); });
    page.on('pageerror', (e) => log(`${name} page error:`, e.message));
    await page.goto(`${origins[key].base}/page.html?c=${key}`);
    await page.waitForFunction(() => document.title !== 'agentstore bench', null, { timeout: 60_000 });
    const title = await page.title();
    if (title !== 'ready') throw new Error(`${name}: ${title}`);
    pages[name] = page;
    has[name] = await page.evaluate(() => [1, 2, 3, 4, 5, 6, 7, 8].filter((w) => window.bench.has(w)));
    await page.bringToFront();
    seedMs[name] = await page.evaluate(() => window.bench.seed());
    log(`${name}: seeded 100,000 records in ${(seedMs[name] / 1000).toFixed(1)} s`);
  }

  // ---- let the disk settle: seeding leaves the backing stores compacting, which
  // stalls the first writes for tens of seconds on this machine.
  for (const [, name] of CONTENDERS) {
    const page = pages[name];
    await page.bringToFront();
    const t0 = Date.now();
    let best = Infinity;
    let calm = 0; // consecutive probes under 500 ms (100 tx at ≤ 5 ms each)
    while (calm < 2 && Date.now() - t0 < 120_000) {
      const ms = await page.evaluate(() => window.bench.probe());
      best = Math.min(best, ms);
      calm = ms < 500 ? calm + 1 : 0;
    }
    log(`${name}: disk settled after ${((Date.now() - t0) / 1000).toFixed(0)} s (100 tx in ${best.toFixed(0)} ms)`);
  }

  // ---- CPU profiles (--profile): self time of agentstore's page by category --
  const profiles = {};
  const cdps = new Map();
  async function startProfile(page) {
    if (!cdps.has(page)) cdps.set(page, await ctx.newCDPSession(page));
    const cdp = cdps.get(page);
    await cdp.send('Profiler.enable');
    await cdp.send('Profiler.setSamplingInterval', { interval: 200 });
    await cdp.send('Profiler.start');
  }
  async function stopProfile(page) {
    const { profile } = await cdps.get(page).send('Profiler.stop');
    const byId = new Map(profile.nodes.map((n) => [n.id, n]));
    const cat = {};
    const glue = {};
    profile.samples.forEach((id, i) => {
      const { url, functionName } = byId.get(id).callFrame;
      const dt = (profile.timeDeltas[i] || 0) / 1000;
      let c;
      if (url.endsWith('.wasm') || url.startsWith('wasm:')) c = 'wasm code';
      else if (url.includes('/pkg/')) { c = 'wasm-bindgen glue (JS)'; glue[functionName] = (glue[functionName] || 0) + dt; }
      else if (url.includes('/bench/')) c = 'bench harness';
      else if (functionName === '(idle)') c = 'idle (waiting on IndexedDB)';
      else if (functionName === '(garbage collector)') c = 'GC';
      else if (functionName === '(program)') c = 'browser native (program)';
      else c = `JS builtins/other`;
      cat[c] = (cat[c] || 0) + dt;
    });
    const topGlue = Object.entries(glue).sort((a, b) => b[1] - a[1]).slice(0, 6);
    return { cat, topGlue };
  }

  // ---- runs ---------------------------------------------------------------
  const samples = {}; // samples[name][w] = [{ms, ok, note}]
  for (const [, name] of CONTENDERS) samples[name] = {};
  let runsDone = 0;
  for (let run = 0; run < RUNS; run++) {
    if (run > 0 && Date.now() - started > BUDGET_MS * (run / (run + 1))) {
      log(`time budget: stopping after ${run} runs`);
      break;
    }
    const order = CONTENDERS.map((c) => c[1]);
    for (let i = 0; i < run; i++) order.push(order.shift());
    for (const [w] of WORKLOADS) {
      for (const name of order) {
        if (!has[name].includes(w)) continue;
        const page = pages[name];
        await page.bringToFront();
        const profiling = PROFILE && name === 'agentstore' && run === RUNS - 1;
        if (profiling) await startProfile(page);
        const r = await Promise.race([
          page.evaluate(([w, run]) => window.bench.run(w, run), [w, run]),
          new Promise((res) => setTimeout(() => res({ ms: NaN, ok: false, note: 'timeout 180 s' }), 180_000)),
        ]);
        if (profiling) profiles[w] = await stopProfile(page);
        (samples[name][w] ||= []).push(r);
        if (!r.ok) log(`run ${run + 1} w${w} ${name}: NOT OK ${r.note || ''}`);
      }
    }
    runsDone = run + 1;
    log(`run ${runsDone}/${RUNS} done at ${((Date.now() - started) / 1000).toFixed(0)} s`);
  }

  // ---- tables ---------------------------------------------------------------
  const median = (xs) => {
    const s = xs.filter(Number.isFinite).sort((a, b) => a - b);
    if (!s.length) return NaN;
    const m = s.length >> 1;
    return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
  };
  const med = {};
  for (const [, name] of CONTENDERS) {
    med[name] = {};
    for (const [w] of WORKLOADS) {
      const xs = samples[name][w];
      if (!xs) continue;
      med[name][w] = { ms: median(xs.map((x) => x.ms)), ok: xs.every((x) => x.ok), notes: [...new Set(xs.map((x) => x.note).filter(Boolean))] };
    }
  }
  const names = CONTENDERS.map((c) => c[1]);
  const fmt = (ms) => (ms >= 100 ? ms.toFixed(0) : ms.toFixed(1));
  let md = `Median ms over ${runsDone} runs (lower is better); in brackets: speed relative to raw IndexedDB in the same run (raw ms ÷ contender ms; 1.00 = as fast as the floor, higher = faster).\n\n`;
  md += `| workload | ${names.join(' | ')} |\n|---|${names.map(() => '---:').join('|')}|\n`;
  for (const [w, label] of WORKLOADS) {
    const raw = med['raw IndexedDB']?.[w]?.ms;
    const cells = names.map((n) => {
      const m = med[n][w];
      if (!m) return 'n/a';
      if (!Number.isFinite(m.ms)) return 'failed';
      const ratio = Number.isFinite(raw) && n !== 'raw IndexedDB' ? ` (${(raw / m.ms).toFixed(2)})` : '';
      return `${fmt(m.ms)}${ratio}${m.ok ? '' : ' ✗'}`;
    });
    md += `| ${w}. ${label} | ${cells.join(' | ')} |\n`;
  }
  md += `\n✗ = a run's correctness check failed. Seeding 100,000 records (untimed setup): ${names.map((n) => `${n} ${(seedMs[n] / 1000).toFixed(1)} s`).join(', ')}.\n`;
  const notes = names.flatMap((n) => Object.entries(med[n]).flatMap(([w, m]) => m.notes.map((x) => `${n} w${w}: ${x}`)));
  if (notes.length) md += `\nNotes: ${notes.join('; ')}.\n`;
  md += `\n| contender | shipped files | bytes | gzipped |\n|---|---|---:|---:|\n`;
  for (const n of names) {
    const s = sizes[n];
    if (!s) continue;
    md += `| ${n} | ${s.files}${s.detail ? ` — ${s.detail}` : ''} | ${s.raw.toLocaleString('en')} | ${s.gzip.toLocaleString('en')} |\n`;
  }
  if (PROFILE && Object.keys(profiles).length) {
    const cats = [...new Set(Object.values(profiles).flatMap((p) => Object.keys(p.cat)))].sort();
    md += `\n### Where agentstore's time goes (CPU profile of its last run, self time in ms)\n\n| workload | ${cats.join(' | ')} | top glue functions |\n|---|${cats.map(() => '---:').join('|')}|---|\n`;
    for (const [w, p] of Object.entries(profiles)) {
      md += `| ${w} | ${cats.map((c) => (p.cat[c] || 0).toFixed(0)).join(' | ')} | ${p.topGlue.map(([f, t]) => `${f || '(anon)'} ${t.toFixed(0)}`).join(', ')} |\n`;
    }
  }
  console.log(md);
  await mkdir(dirname(OUT), { recursive: true });
  await writeFile(OUT, JSON.stringify({ browserVersion, runs: runsDone, seedMs, samples, medians: med, sizes, markdown: md }, null, 1));
  log(`browser ${browserVersion}; samples in ${OUT}; ${((Date.now() - started) / 1000).toFixed(0)} s`);
} finally {
  await ctx.close();
  for (const o of Object.values(origins)) o.server.close();
  await rm(profile, { recursive: true, force: true });
}
