// The demo as a new user meets it: the workers panel in front of a big
// queue, a store another tab closed, and the server reached under a host
// name that is not loopback (a DNS-rebinding page).
//
//   node --test tests/e2e/demo_panel.test.mjs

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { chromium } from 'playwright-core';
import { demoForTests, openDemo, until } from './helpers.mjs';

const QUEUE = 'demo';
const t = demoForTests('panel', { DEMO_TOKENS: '12', DEMO_PRODUCER_TOKENS: '4', DEMO_WORKLOAD: '0' });
const { api } = t;

test('a poll of the workers panel reads a few small pages, not the whole queue', { timeout: 240_000 }, async () => {
  // 1,500 items of about 2 KB: the whole listing is over 3 MB.
  const N = 1500;
  const note = 'x'.repeat(2000);
  let newest = 0;
  for (let i = 0; i < N; i += 25) {
    const batch = await Promise.all(Array.from({ length: Math.min(25, N - i) }, (_, k) =>
      api('POST', `/v1/queues/${QUEUE}/items`, { payload: { task: 'bulk', n: i + k, ms: 100, note } })));
    newest = Math.max(newest, ...batch.map((it) => it.id));
  }
  const { ctx, page } = await openDemo(t.browser, t.demo.url);
  try {
    let polls = 0;
    const listings = [];
    page.on('request', (req) => { if (req.url().includes(`/v1/queues/${QUEUE}/stats`)) polls += 1; });
    page.on('response', (res) => {
      if (!res.url().includes(`/v1/queues/${QUEUE}/items?`)) return;
      listings.push(Number(res.headers()['content-length']));
    });
    // The newest item heads "Latest items", and the count is the queue's.
    await page.waitForSelector(`#items-body tr[data-item="${newest}"]`, { timeout: 60_000 });
    assert.equal(await page.getAttribute('#items-body tr:first-child', 'data-item'), String(newest));
    await page.waitForFunction((n) => document.querySelector('[data-testid=workers-state]').textContent.startsWith(`${n} item(s) in queue`), N);

    // Three polls from here: each reads one page of the newest items.
    const [from, p0] = [listings.length, polls];
    await until('three more polls', 30_000, () => polls >= p0 + 3 && listings.length > from + 2, 200);
    const seen = listings.slice(from);
    assert.ok(seen.every((n) => Number.isFinite(n)), `every listing answer has a Content-Length: ${seen}`);
    const bytes = seen.reduce((a, b) => a + b, 0);
    assert.ok(bytes / (polls - p0) < 64 * 1024, `a poll read ${Math.round(bytes / (polls - p0))} B of listing (${seen.length} answers: ${seen})`);
    assert.equal(await page.getAttribute('#items-body tr:first-child', 'data-item'), String(newest));
  } finally {
    await ctx.close();
  }
});

test('an action on a store another tab closed says it is closed and to reload', { timeout: 120_000 }, async () => {
  const name = `e2e-closed-${randomBytes(4).toString('hex')}`;
  const { ctx, page } = await openDemo(t.browser, `${t.demo.url}/?db=${name}`);
  try {
    // Another tab's upgrade of the store's database: the SDK closes this
    // tab's connection and the page says so.
    await page.evaluate(async (name) => {
      const info = (await indexedDB.databases()).find((d) => d.name.includes(name));
      await new Promise((resolve, reject) => {
        const r = indexedDB.open(info.name, info.version + 1);
        r.onsuccess = () => { r.result.close(); resolve(); };
        r.onerror = () => reject(r.error);
      });
    }, name);
    await page.waitForFunction(() => document.querySelector('[data-testid=sdk-state]').textContent === 'closed');
    assert.match(await page.textContent('[data-testid=error]'), /^Store closed: .*another tab upgraded.*reload the page/);

    // An action after the message was dismissed: not "the SDK is not loaded".
    await page.click('#error-dismiss');
    await page.click('#counts-refresh');
    await page.waitForSelector('#error-bar:not([hidden])');
    const message = await page.textContent('[data-testid=error]');
    assert.match(message, new RegExp(`^Counting: the store “${name}” is closed in this tab \\(another tab upgraded or deleted its database\\), so nothing was read or written; reload the page to open it again \\[ClosedError · closed · 410\\]$`));
    assert.doesNotMatch(message, /SDK is not loaded/);
  } finally {
    await ctx.close();
  }
});

test('a page under another host name (DNS rebinding) gets nothing from the loopback server', { timeout: 120_000 }, async () => {
  // This browser resolves rebind.example to 127.0.0.1, as a rebound DNS
  // name would: same-origin for the page, so CORS does not stop it.
  const rebinding = await chromium.launch({
    executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
    headless: true,
    args: ['--no-sandbox', '--disable-gpu', `--host-resolver-rules=MAP rebind.example 127.0.0.1`],
  });
  try {
    const page = await rebinding.newPage();
    const res = await page.goto(`http://rebind.example:${t.demo.port}/`);
    assert.equal(res.status(), 403);
    assert.match(await page.textContent('body'), /"code":"forbidden".*--allowed-host rebind\.example/);
    const tokens = await page.evaluate(async () => {
      const r = await fetch('/runtime/demo.json');
      return { status: r.status, text: await r.text() };
    });
    assert.equal(tokens.status, 403);
    assert.doesNotMatch(tokens.text, /enrollmentTokens/);
    // The loopback names a user types still reach it.
    for (const host of ['localhost', '127.0.0.1']) {
      const ok = await page.goto(`http://${host}:${t.demo.port}/runtime/demo.json`);
      assert.equal(ok.status(), 200, host);
    }
  } finally {
    await rebinding.close();
  }
});
