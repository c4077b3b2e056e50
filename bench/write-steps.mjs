#!/usr/bin/env node
// Where a write's time goes in IndexedDB itself: one workload in plain JS,
// built up step by step towards the request pattern agentstore issues (each
// step's variant is labelled in the output; the page is bench/write-steps.html).
//   --workload cas     2,000 sequential read-check-write transactions of one record
//   --workload batch   10,000 new records in one transaction
// Each variant runs 5 times, interleaved; prints the median and every run (ms).
//
//   node bench/write-steps.mjs [--browser chromium|firefox] [--workload cas|batch]
import { createServer } from 'node:http';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { launchBrowser } from './webdriver.mjs';

const arg = (k, d) => {
  const i = process.argv.indexOf(`--${k}`);
  return i > 0 ? process.argv[i + 1] : d;
};
const BROWSER = arg('browser', 'chromium');
const WORKLOAD = arg('workload', 'cas');
const PAGE = await readFile(new URL('./write-steps.html', import.meta.url));
const srv = createServer((q, r) => {
  r.setHeader('content-type', 'text/html');
  r.end(PAGE);
}).listen(0, '127.0.0.1');
await new Promise((r) => srv.once('listening', r));
const profile = await mkdtemp(join(tmpdir(), 'agentstore-write-steps-'));
const ctx = await launchBrowser(BROWSER, profile, ['--disable-gpu', '--disable-background-timer-throttling']);
try {
  const page = await ctx.newPage();
  await page.goto(`http://127.0.0.1:${srv.address().port}/?w=${WORKLOAD}`);
  await page.waitForFunction(() => window.result !== undefined, null, { timeout: 900_000 });
  const res = await page.evaluate(() => window.result);
  const med = (a) => [...a].sort((x, y) => x - y)[Math.floor(a.length / 2)];
  console.log(`${BROWSER}, ${WORKLOAD}\n| variant | median ms | runs |\n|---|---:|---|`);
  for (const [k, v] of Object.entries(res)) console.log(`| ${k} | ${med(v).toFixed(0)} | ${v.map((x) => x.toFixed(0)).join(', ')} |`);
} finally {
  await ctx.close();
  srv.close();
  await rm(profile, { recursive: true, force: true });
}
