// End-to-end tests of the demo's Workers panel, in headless Chromium, against
// the server `bash scripts/demo.sh` starts (on a free loopback port, with a known
// admin token so that the test can check every item through the server's API).
//
//   node --test tests/e2e/workers.test.mjs
//
// Screenshots go to artifacts/. With UPDATE_DOCS_PNG=1 the 1280×800 picture of
// both panels is also written to docs/demo.png (the README's picture).

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { copyFileSync, mkdirSync, statSync } from 'node:fs';
import { join } from 'node:path';
import {
  ROOT, VIEWPORTS, assertNoError, assertNothingOverflows, demoForTests,
  openDemo, shot, text, until,
} from './helpers.mjs';

const QUEUE = 'demo';
const MAX_REDELIVERIES = 5;
/** The first delivery plus every re-delivery. */
const DELIVERIES = 1 + MAX_REDELIVERIES;

/** The demo, and the lease server's API with the admin token (the test's ground truth). */
const t = demoForTests('workers', { DEMO_MAX_REDELIVERIES: String(MAX_REDELIVERIES) });
const { api } = t;

// ------------------------------------------------------------------ helpers

const items = async () => (await api('GET', `/v1/queues/${QUEUE}/items?limit=10000`)).items;
const item = (id) => api('GET', `/v1/items/${id}`);

/** `GET /metrics` with the admin token, parsed: `[{name, labels, value}]`. */
async function scrape() {
  const res = await fetch(`${t.demo.url}/metrics`, { headers: { Authorization: `Bearer ${t.admin}` } });
  assert.equal(res.status, 200, 'GET /metrics with the admin token');
  const samples = [];
  for (const line of (await res.text()).split('\n')) {
    const m = /^(\w+)(?:\{(.*)\})? (\S+)$/.exec(line);
    if (!m) continue;
    const labels = Object.fromEntries([...(m[2] ?? '').matchAll(/(\w+)="([^"]*)"/g)].map((x) => [x[1], x[2]]));
    samples.push({ name: m[1], labels, value: Number(m[3]) });
  }
  return samples;
}

/** Sum of the samples of `name` whose labels include `labels`. */
function metric(samples, name, labels = {}) {
  return samples
    .filter((x) => x.name === name && Object.entries(labels).every(([k, v]) => x.labels[k] === v))
    .reduce((sum, x) => sum + x.value, 0);
}

const GAUGE_STATES = ['open', 'running', 'paused', 'done', 'failed'];

/**
 * Waits until the panel's queue gauges equal `agentstore_queue_items` of a
 * scrape taken in the same round; returns the panel's numbers.
 */
async function untilPanelMatchesMetrics(page, ms = 30_000) {
  return until('the panel\'s queue gauges to equal /metrics', ms, async () => {
    const panel = await page.evaluate((states) => Object.fromEntries(states.map(
      (k) => [k, Number(document.querySelector(`[data-testid=queue-${k}]`).textContent)])), GAUGE_STATES);
    const samples = await scrape();
    const same = GAUGE_STATES.every((k) => panel[k] === metric(samples, 'agentstore_queue_items', { queue: QUEUE, state: k }));
    return same ? panel : null;
  });
}

/** A page of the demo with its workers enrolled and polling. */
async function openWorkers(ctx, viewport = VIEWPORTS.desktop) {
  const { page } = await openDemo(t.browser, t.demo.url, viewport, ctx);
  await page.waitForSelector('body[data-workers-ready="true"]', { state: 'attached', timeout: 30_000 });
  return page;
}

/** `{name, claimed, done, lost}` of every worker card of a page. */
async function workerStats(page) {
  return page.$$eval('.worker', (cards) => cards.map((c) => {
    const t = c.querySelector('.counters').textContent;
    const n = (label) => Number(new RegExp(`${label} (\\d+)`).exec(t)?.[1] ?? NaN);
    return { name: c.dataset.workerName, claimed: n('claimed'), done: n('done'), lost: n('lost') };
  }));
}

/**
 * Waits until a card of one of `pages` holds `itemId`: `{page, card, name}`,
 * `card` being a locator of that worker's card (whatever it holds later).
 */
async function holderOf(pages, itemId, ms = 30_000) {
  return until(`a worker to claim item #${itemId}`, ms, async () => {
    for (const page of pages) {
      const holding = page.locator(`.worker[data-item-id="${itemId}"]`);
      if (await holding.count()) {
        const name = await holding.getAttribute('data-worker-name');
        return { page, name, card: page.locator(`.worker[data-worker-name="${name}"]`) };
      }
    }
    return null;
  });
}

// -------------------------------------------------------------------- tests

test('the worker panel settles 100 enqueued items with two pages open, none settled twice', { timeout: 300_000 }, async () => {
  const ctx = await t.browser.newContext({ viewport: VIEWPORTS.desktop });
  try {
    const a = await openWorkers(ctx);
    const b = await openWorkers(ctx);
    const before = await items();

    await a.fill('#enqueue-count', '100');
    await a.click('[data-testid=enqueue-submit]');
    await a.waitForFunction(() => /^Enqueued 100 item/.test(document.querySelector('[data-testid=status]').textContent));
    const ours = (await items()).filter((it) => !before.some((o) => o.id === it.id));
    assert.equal(ours.length, 100, 'the page enqueued 100 items');

    // Everything in the queue (the sample workload too) ends done.
    const all = await until('every item to be done', 240_000, async () => {
      const now = await items();
      return now.every((it) => it.state === 'done') ? now : null;
    });

    const names = new Set([...await workerStats(a), ...await workerStats(b)].map((w) => w.name));
    assert.equal(names.size, 6, 'three workers per page');
    // Claims replayed by the server so far (an answer lost and the claim sent again):
    // each takes an epoch without ending an attempt.
    const replays = metric(await scrape(), 'agentstore_claim_replays_total');
    for (const it of all.filter((x) => ours.some((o) => o.id === x.id))) {
      assert.equal(it.state, 'done', `#${it.id} done`);
      assert.ok(names.has(it.result?.by), `#${it.id} settled by a worker of the two pages, got ${JSON.stringify(it.result)}`);
      assert.equal(it.result.epoch, it.epoch, `#${it.id} settled under its last claim`);
      // Every earlier claim ended without a settle (an attempt); a replayed claim took
      // an epoch of its own.
      const extra = it.epoch - 1 - it.attempts;
      assert.ok(extra >= 0 && extra <= replays, `#${it.id}: attempts ${it.attempts} at epoch ${it.epoch}, ${replays} replays`);
      assert.equal(it.worker_id, null, `#${it.id} holds no lease any more`);
    }

    // None settled twice: the pages' own count of accepted settles equals the
    // server's count of done items, and both pages took part. The cards show a
    // settle on their next display tick: wait until they show at least as many
    // (the counts only grow, so a double settle still shows as a mismatch).
    const doneOf = (stats) => stats.reduce((s, w) => s + w.done, 0);
    const [statsA, statsB] = await until('the cards to show every settle', 30_000, async () => {
      const sa = await workerStats(a);
      const sb = await workerStats(b);
      return doneOf(sa) + doneOf(sb) >= all.length ? [sa, sb] : null;
    });
    const doneA = doneOf(statsA);
    const doneB = doneOf(statsB);
    assert.equal(doneA + doneB, all.length, `settles accepted by the pages (${doneA} + ${doneB}) = items done (${all.length})`);
    assert.ok(doneA > 0 && doneB > 0, 'both pages settled items');

    // The panel's gauges come from the same query as /metrics: all done, none waiting.
    const gauges = await untilPanelMatchesMetrics(a);
    assert.deepEqual(gauges, { open: 0, running: 0, paused: 0, done: all.length, failed: 0 });
    assert.equal(await text(a, 'queue-oldest-open'), '–', 'no open item, no age');
    await assertNoError(a);
    await assertNoError(b);
    await shot(a, 'workers-settled');
  } finally {
    await ctx.close();
  }
});

test('pausing a worker\'s heartbeats: its lease is lost at the local deadline, its work stops, the item is finished under the next claim', { timeout: 180_000 }, async () => {
  const ctx = await t.browser.newContext({ viewport: VIEWPORTS.desktop });
  try {
    const pages = [await openWorkers(ctx), await openWorkers(ctx)];
    // Work long enough (15 s) that the pause lands while it runs, however
    // slowly this process gets to the click on a busy machine (with 4 s, a
    // ~3 s stall let the work settle at epoch 1 before the click).
    // The server's replay counter is shared by the whole file: count from here.
    const replaysBefore = metric(await scrape(), 'agentstore_claim_replays_total');
    const { id } = await api('POST', `/v1/queues/${QUEUE}/items`, { payload: { task: 'long', ms: 15_000 } });
    const { page, card, name: stalled } = await holderOf(pages, id);
    assert.equal(await card.getAttribute('data-epoch'), '1');

    await card.locator('button[data-testid$=-pause]').click();
    assert.equal(await card.locator('button[data-testid$=-pause]').getAttribute('aria-pressed'), 'true');
    await page.waitForFunction((n) => document.querySelector(`.worker[data-worker-name="${n}"] .badge`).textContent === 'heartbeats paused', stalled);
    await shot(page, 'workers-paused');

    // At the local deadline the lease is lost locally and the frozen work stops.
    const expired = card.locator(`li[data-kind=expired][data-item="${id}"]`);
    await expired.waitFor({ timeout: 30_000 });
    assert.match(await expired.textContent(), /expired_locally/);
    assert.equal(await expired.getAttribute('data-epoch'), '1');
    // The stall ends with the lease: the card shows it on its next display tick.
    await card.locator('button[data-testid$=-pause][aria-pressed="false"]').waitFor({ timeout: 10_000 });

    // Another worker finished it under the next epoch.
    // (The next claim's work takes its 15 s again.)
    const done = await until(`item #${id} done`, 60_000, async () => {
      const it = await item(id);
      return it.state === 'done' ? it : null;
    });
    // Any worker may take the next claim, the stalled one too once its stall
    // ended with the lease (seen on a loaded machine): what matters is that the
    // epoch-1 work never settled and the item was finished under the next
    // claim, epoch 2, or later by as many epochs as claims were replayed (an
    // answer lost on a busy machine and the claim sent again takes an epoch
    // of its own without an attempt, as in the poison test).
    const replayed = metric(await scrape(), 'agentstore_claim_replays_total') - replaysBefore;
    assert.ok(done.epoch >= 2 && done.epoch <= 2 + replayed,
      `epoch ${done.epoch}: the next claim's (2) plus at most ${replayed} replays`);
    assert.equal(done.result.epoch, done.epoch, 'settled under its last claim');
    assert.equal(done.attempts, 1, 'the expiry counted one attempt');
    const settledBy = await until('the other worker to show the settle', 10_000, async () => {
      for (const p of pages) {
        const li = p.locator(`li[data-kind=settled][data-item="${id}"][data-epoch="${done.epoch}"]`);
        if (await li.count()) return li.first().evaluate((n) => n.closest('.worker').dataset.workerName);
      }
      return null;
    });
    assert.equal(settledBy, done.result.by);
    for (const p of pages) {
      assert.equal(await p.locator(`li[data-kind=settled][data-item="${id}"][data-epoch="1"]`).count(), 0,
        'no settle under the lost epoch-1 claim');
    }
    await shot(page, 'workers-taken-over');
    for (const p of pages) await assertNoError(p);
  } finally {
    await ctx.close();
  }
});

test('a poison item ends failed at the retry cap (retry_limit)', { timeout: 120_000 }, async () => {
  const ctx = await t.browser.newContext({ viewport: VIEWPORTS.desktop });
  try {
    const page = await openWorkers(ctx);
    await page.click('[data-testid=poison-button]');
    await page.waitForSelector('[data-testid=poison-status][data-item]');
    const id = Number(await page.getAttribute('[data-testid=poison-status]', 'data-item'));
    await page.waitForSelector('[data-testid=poison-status][data-state=failed]', { timeout: 90_000 });
    assert.match(await text(page, 'poison-status'), new RegExp(`#${id} stopped at the retry cap: failed \\(retry_limit\\) after ${DELIVERIES} of ${DELIVERIES} deliveries`));

    const it = await item(id);
    assert.equal(it.state, 'failed');
    assert.equal(it.last_error, 'retry_limit');
    assert.equal(it.attempts, DELIVERIES);
    assert.equal(it.max_redeliveries, MAX_REDELIVERIES);
    // Claimed once per delivery, never again after the cap; a replayed claim (its answer
    // lost, sent again) takes an epoch of its own.
    const replayed = metric(await scrape(), 'agentstore_claim_replays_total');
    assert.ok(it.epoch >= DELIVERIES && it.epoch <= DELIVERIES + replayed,
      `epoch ${it.epoch}: one per delivery (${DELIVERIES}) plus at most ${replayed} replays`);
    await page.waitForSelector(`#items-body tr[data-item="${id}"][data-state=failed]`);
    // /metrics counts every item the retry cap failed; the panel shows the failed gauge.
    const failedAtCap = (await items()).filter((x) => x.state === 'failed' && x.last_error === 'retry_limit').length;
    assert.equal(metric(await scrape(), 'agentstore_retry_limit_failures_total'), failedAtCap);
    assert.ok((await untilPanelMatchesMetrics(page)).failed >= 1);
    await assertNoError(page);
    await shot(page, 'workers-poison');
  } finally {
    await ctx.close();
  }
});

test('a worker cut off from the server loses its lease at the local deadline, and picks up again after Reconnect', { timeout: 180_000 }, async () => {
  const ctx = await t.browser.newContext({ viewport: VIEWPORTS.desktop });
  try {
    const page = await openWorkers(ctx);
    // Work long enough (15 s, as in the pause test) that the cut lands while
    // it runs, however slowly this process gets to the click on a busy
    // machine (with 8 s, a slow click let the work settle at epoch 1 first).
    // The server's replay counter is shared by the whole file: count from here.
    const replaysBefore = metric(await scrape(), 'agentstore_claim_replays_total');
    const { id } = await api('POST', `/v1/queues/${QUEUE}/items`, { payload: { task: 'long', ms: 15_000 } });
    const { card, name } = await holderOf([page], id);
    await card.locator('button[data-testid$=-cut]').click();
    assert.equal(await card.locator('.badge').textContent(), 'cut off');

    const expired = card.locator(`li[data-kind=expired][data-item="${id}"]`);
    await expired.waitFor({ timeout: 20_000 });
    assert.match(await expired.textContent(), /expired_locally/);
    // (The next claim's work takes its 15 s again.)
    const done = await until(`item #${id} done by another worker`, 60_000, async () => {
      const it = await item(id);
      return it.state === 'done' ? it : null;
    });
    assert.notEqual(done.result.by, name);
    // Finished under the next claim, epoch 2, or later by as many epochs as
    // claims were replayed (see the pause test); never under the cut-off
    // worker's epoch 1.
    const replayed = metric(await scrape(), 'agentstore_claim_replays_total') - replaysBefore;
    assert.ok(done.epoch >= 2 && done.epoch <= 2 + replayed,
      `epoch ${done.epoch}: the next claim's (2) plus at most ${replayed} replays`);
    assert.equal(done.result.epoch, done.epoch, 'settled under its last claim');
    assert.equal(done.attempts, 1, 'the expiry counted one attempt');

    // Reconnect: the worker's next claim goes through (after its backoff).
    const claimedBefore = (await workerStats(page)).find((w) => w.name === name).claimed;
    await card.locator('button[data-testid$=-cut]').click();
    assert.equal(await card.locator('button[data-testid$=-cut]').textContent(), 'Cut off from server');
    // The page's other workers compete for the same items, so keep work open
    // until this one's backoff ends and its claim lands (a fixed number of items
    // can all go to the others first on a busy machine).
    await until(`${name} to claim again`, 60_000, async () => {
      if ((await workerStats(page)).find((w) => w.name === name).claimed > claimedBefore) return true;
      const { open } = await api('GET', `/v1/queues/${QUEUE}/stats`);
      if (open < 2) await api('POST', `/v1/queues/${QUEUE}/items`, { payload: { task: 'after-reconnect', ms: 3000 } });
      return false;
    });
    await assertNoError(page);
  } finally {
    await ctx.close();
  }
});

test('both panels side by side at 1280×800, stacked at 390×844; user errors are messages', { timeout: 120_000 }, async () => {
  const ctx = await t.browser.newContext({ viewport: VIEWPORTS.desktop });
  try {
    const page = await openWorkers(ctx);
    // Records: the sample dump imported.
    await page.click('[data-testid=import-button]');
    await page.waitForSelector('[data-testid=summary-documentsRead]');
    await page.waitForFunction(() => /record type/.test(document.querySelector('[data-testid=counts-state]').textContent));
    // Workers: a poison item (first in line) then a batch; the picture shows
    // the poison item stopped at the cap while the workers are busy.
    await page.click('[data-testid=poison-button]');
    await page.waitForSelector('[data-testid=poison-status][data-item]');
    await page.fill('#enqueue-count', '60');
    await page.click('[data-testid=enqueue-submit]');
    await page.waitForFunction(() => /^Enqueued 60 item/.test(document.querySelector('[data-testid=status]').textContent));
    await page.waitForSelector('[data-testid=poison-status][data-state=failed]', { timeout: 60_000 });
    await page.waitForFunction(() => document.querySelectorAll('.worker[data-item-id]:not([data-item-id=""])').length >= 2);
    await page.evaluate(() => window.scrollTo(0, 0));
    await page.waitForFunction(() => window.scrollY === 0);
    await assertNoError(page);

    // Side by side: the workers panel starts right of the records panel.
    const records = await page.locator('.panel-records').boundingBox();
    const workersBox = await page.locator('[data-testid=workers-panel]').boundingBox();
    assert.ok(workersBox.x >= records.x + records.width, `panels side by side: ${JSON.stringify({ records, workersBox })}`);
    assert.ok(workersBox.y < 200, 'the workers panel starts on the first screen');
    const picture = await shot(page, 'readme-demo');
    await assertNothingOverflows(page);
    assert.ok(statSync(picture).size < 200_000, `the demo picture is small (${statSync(picture).size} bytes)`);
    if (process.env.UPDATE_DOCS_PNG === '1') {
      mkdirSync(join(ROOT, 'docs'), { recursive: true });
      copyFileSync(picture, join(ROOT, 'docs', 'demo.png'));
    }
    await shot(page, 'workers', true);

    // Phone: stacked, nothing sticks out; the workers panel scrolled into view.
    await page.setViewportSize(VIEWPORTS.phone);
    await page.locator('[data-testid=workers-panel]').scrollIntoViewIfNeeded();
    // No smooth scrolling in style.css: scrollIntoView has scrolled when it returns.
    await page.evaluate(() => document.getElementById('workers-title').scrollIntoView({ block: 'start' }));
    await shot(page, 'workers');
    await shot(page, 'workers', true);
    await assertNothingOverflows(page);

    // Keyboard: the worker buttons are reachable and work with Enter/Space.
    const pause = page.locator('[data-testid=worker-1-pause]');
    await pause.focus();
    await page.keyboard.press('Space');
    assert.equal(await pause.getAttribute('aria-pressed'), 'true');
    await page.keyboard.press('Enter');
    assert.equal(await pause.getAttribute('aria-pressed'), 'false');

    // Errors a user can make are shown as messages.
    await page.fill('#enqueue-count', '0');
    await page.press('#enqueue-count', 'Enter');
    await page.waitForSelector('[data-testid=error]', { state: 'visible' });
    assert.match(await text(page, 'error'), /Enqueue: enter a whole number of items from 1 to 500 .*ValidationError/);
    await page.fill('#enqueue-count', '12.5');
    await page.click('[data-testid=enqueue-submit]');
    await page.waitForFunction(() => /got “12.5”/.test(document.querySelector('[data-testid=error]').textContent));
    await shot(page, 'workers-error');
    await assertNothingOverflows(page);
    assert.deepEqual(page.errors, []);
  } finally {
    await ctx.close();
  }
});
