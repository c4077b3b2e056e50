// Time to first read: from navigation start to the first `get` answered, one
// library per page, a fresh browser profile per run, files served gzipped,
// on a slow profile: Chromium's CDP Network.emulateNetworkConditions
// (1.6 Mbps down, 750 kbps up, 150 ms round trip) and
// Emulation.setCPUThrottlingRate 4. Prints a Markdown table of medians.
//
//   node bench/first-read.mjs [--runs 3] [--fast] [--before DIR]
//
// --fast: no throttling. --before DIR: one more row, the store-only entry of
// an earlier build's pkg/ (e.g. `git worktree add /tmp/old <commit>` and
// scripts/build-pkg.sh there) loaded as the bundled row is, in the same runs.
import { createServer } from 'node:http';
import { readFile, mkdtemp, mkdir, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, dirname, extname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { gzipSync } from 'node:zlib';
import * as esbuild from 'esbuild';
import { chromium } from 'playwright-core';
import { arg } from './args.mjs';

const HERE = dirname(fileURLToPath(import.meta.url));
const ROOT = resolve(HERE, '..');
const RUNS = Number(arg('runs', 3));
const FAST = process.argv.includes('--fast');
const LIBS = [
  ['raw', 'raw IndexedDB'],
  ['dexie', 'Dexie 4'],
  ['agentstore', 'agentstore (agentstore/store)'],
  ['agentstore-bundled', 'agentstore (agentstore/store), glue bundled, wasm preloaded'],
];
// What a page adds to its <head> for one library: agentstore-bundled preloads
// the wasm (README, Package) so that it downloads beside the script.
const HEAD = {
  'agentstore-bundled':
    '<link rel="preload" href="/pkg/store/agentstore_bg.wasm" as="fetch" type="application/wasm" crossorigin>',
};
const DIST = join(HERE, 'dist', 'first-read');
const BEFORE = arg('before', null) && resolve(arg('before', null));
const entry = (k) => join(HERE, 'first-read', `${k}.js`);
if (BEFORE) {
  const k = 'agentstore-bundled-before';
  LIBS.push([k, `agentstore (agentstore/store), glue bundled, wasm preloaded — before (${BEFORE})`]);
  HEAD[k] = HEAD['agentstore-bundled'].replace('/pkg/', '/pkg-before/');
  await mkdir(join(HERE, 'dist', 'first-read-src'), { recursive: true });
  const src = (await readFile(entry('agentstore-bundled'), 'utf8'))
    .replace('../../pkg/store/agentstore.js', join(BEFORE, 'store', 'agentstore.js'))
    .replace("'/pkg/store/agentstore_bg.wasm'", "'/pkg-before/store/agentstore_bg.wasm'");
  await writeFile(join(HERE, 'dist', 'first-read-src', `${k}.js`), src);
}
const entryOf = (k) => (k.endsWith('-before') ? join(HERE, 'dist', 'first-read-src', `${k}.js`) : entry(k));
// One build per page, so no page shares a chunk with another (a shared chunk
// is one more request on the page's critical path).
await rm(DIST, { recursive: true, force: true });
for (const [k] of LIBS) {
  await esbuild.build({
    entryPoints: [entryOf(k)],
    outdir: DIST,
    bundle: true,
    // agentstore loads its import/export module with import(): split it into
    // a chunk of its own, as an app's bundler does, so the page does not pull
    // it in before its first read.
    splitting: true,
    minify: true,
    format: 'esm',
    target: 'chrome120',
    external: ['/pkg/*'],
    logLevel: 'warning',
  });
}

const MIME = { '.html': 'text/html', '.js': 'text/javascript', '.wasm': 'application/wasm' };
const sent = {};
const server = createServer(async (req, res) => {
  const url = new URL(req.url, 'http://x');
  const path = decodeURIComponent(url.pathname);
  let file = null;
  let body;
  if (path === '/page.html') {
    body = Buffer.from(`<!doctype html><meta charset="utf-8"><title>first read</title>
${HEAD[url.searchParams.get('lib')] ?? ''}
<script type="module" src="/dist/${url.searchParams.get('lib')}.js"></script>`);
  } else if (path.startsWith('/dist/')) file = join(DIST, path.slice('/dist/'.length));
  else if (path.startsWith('/pkg/')) file = join(ROOT, 'pkg', path.slice('/pkg/'.length));
  else if (BEFORE && path.startsWith('/pkg-before/')) file = join(BEFORE, path.slice('/pkg-before/'.length));
  else {
    res.writeHead(404).end();
    return;
  }
  try {
    if (file) {
      if (file.includes('..')) throw new Error('path');
      body = await readFile(file);
    }
    const gz = gzipSync(body, { level: 9 });
    sent[path] = gz.length;
    res.writeHead(200, {
      'content-type': file ? MIME[extname(file)] || 'application/octet-stream' : 'text/html',
      'content-encoding': 'gzip',
      'cache-control': 'no-store',
    }).end(gz);
  } catch {
    res.writeHead(404).end();
  }
});
await new Promise((r) => server.listen(0, '127.0.0.1', r));
const base = `http://127.0.0.1:${server.address().port}`;

const times = {};
try {
  for (let run = 0; run < RUNS; run++) {
    for (const [lib, name] of LIBS) {
      const profile = await mkdtemp(join(tmpdir(), 'agentstore-first-read-'));
      const ctx = await chromium.launchPersistentContext(profile, {
        executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
        headless: true,
        args: ['--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update',
          '--disable-sync', '--no-first-run'],
      });
      try {
        const page = ctx.pages()[0] ?? (await ctx.newPage());
        const cdp = await ctx.newCDPSession(page);
        await cdp.send('Network.enable');
        await cdp.send('Network.setCacheDisabled', { cacheDisabled: true });
        if (!FAST) {
          await cdp.send('Network.emulateNetworkConditions', {
            offline: false,
            latency: 150,
            downloadThroughput: (1.6e6 / 8) | 0,
            uploadThroughput: (750e3 / 8) | 0,
          });
          await cdp.send('Emulation.setCPUThrottlingRate', { rate: 4 });
        }
        await page.goto(`${base}/page.html?lib=${lib}`);
        await page.waitForFunction(() => typeof window.firstRead === 'number', null, { timeout: 120_000 });
        const ms = await page.evaluate(() => window.firstRead);
        (times[name] ||= []).push(ms);
        console.error(`[first-read] run ${run + 1} ${name}: ${ms.toFixed(0)} ms`);
      } finally {
        await ctx.close();
        await rm(profile, { recursive: true, force: true });
      }
    }
  }
} finally {
  server.close();
}
const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
};
const dexie = median(times['Dexie 4']);
const bytes = (lib) =>
  Object.entries(sent)
    .filter(
      ([p]) =>
        p.includes(`/${lib}.js`) ||
        (lib === 'agentstore' && p.startsWith('/pkg/')) ||
        (lib === 'agentstore-bundled' && p === '/pkg/store/agentstore_bg.wasm') ||
        (lib === 'agentstore-bundled-before' && p === '/pkg-before/store/agentstore_bg.wasm'),
    )
    .reduce((a, [, n]) => a + n, 0);
let md = `Time to first read (${FAST ? 'loopback, no throttling' : '1.6 Mbps / 150 ms RTT, CPU ×4'}), median of ${RUNS} runs, fresh profile each, gzip -9 transfer:\n\n`;
md += `| library | ms (median) | runs | × Dexie 4 | bytes transferred (gzip) |\n|---|---:|---|---:|---:|\n`;
for (const [lib, name] of LIBS) {
  const m = median(times[name]);
  md += `| ${name} | ${m.toFixed(0)} | ${times[name].map((x) => x.toFixed(0)).join(', ')} | ${(m / dexie).toFixed(2)} | ${bytes(lib).toLocaleString('en')} |\n`;
}
console.log(md);
