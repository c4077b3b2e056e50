#!/usr/bin/env node
// Where a compare-and-swap write's time goes in IndexedDB itself (Chromium):
// 2,000 sequential read-check-write transactions of one record, in plain JS,
// built up step by step towards the request pattern agentstore issues:
//   A  one-store readwrite transaction: get, compare _rev, put
//   B  the same over agentstore's four-store scope (records, tombstones,
//      meta, derived)
//   C  B plus the read of the index state generation (meta)
//   D  C plus a BroadcastChannel post after the commit (change notification)
// Each variant runs 5 times, interleaved; prints the median and every run (ms).
// The page is bench/cas-steps.html.
//
//   node bench/cas-steps.mjs
import { createServer } from 'node:http';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { chromium } from 'playwright-core';

const PAGE = await readFile(new URL('./cas-steps.html', import.meta.url));
const srv = createServer((q, r) => {
  r.setHeader('content-type', 'text/html');
  r.end(PAGE);
}).listen(0, '127.0.0.1');
await new Promise((r) => srv.once('listening', r));
const profile = await mkdtemp(join(tmpdir(), 'agentstore-cas-steps-'));
const ctx = await chromium.launchPersistentContext(profile, {
  executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
  headless: true,
  args: ['--no-sandbox', '--disable-gpu', '--disable-background-timer-throttling'],
});
try {
  const page = await ctx.newPage();
  await page.goto(`http://127.0.0.1:${srv.address().port}/`);
  await page.waitForFunction(() => window.result, null, { timeout: 900_000, polling: 500 });
  const res = await page.evaluate(() => window.result);
  const med = (a) => [...a].sort((x, y) => x - y)[Math.floor(a.length / 2)];
  console.log('| variant | median ms | runs |\n|---|---:|---|');
  for (const [k, v] of Object.entries(res)) console.log(`| ${k} | ${med(v).toFixed(0)} | ${v.map((x) => x.toFixed(0)).join(', ')} |`);
} finally {
  await ctx.close();
  srv.close();
  await rm(profile, { recursive: true, force: true });
}
