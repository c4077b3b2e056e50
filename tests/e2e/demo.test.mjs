// End-to-end test of the demo page, served by scripts/demo.sh, in headless Chromium.
//
//   npm run test:e2e            (expects pkg/ built; builds it when missing)
//
// Environment: CHROMIUM (default /usr/bin/chromium), E2E_SERVER_TIMEOUT_MS
// (default 900000: demo.sh may have to compile agentstore-server first).

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  ROOT, SERVER_TIMEOUT_MS, VIEWPORTS, assertNoError, assertNothingOverflows, launchBrowser,
  openDemo as openDemoAt, shot, startDemo, text,
} from './helpers.mjs';

// ------------------------------------------------------- expected values

/** Counts computed from PouchDB's own answers, independently of the page. */
function expectedFromFile() {
  const expected = JSON.parse(readFileSync(join(ROOT, 'www/data/agent-records.expected.json'), 'utf8'));
  const perType = new Map();
  let untyped = 0;
  for (const doc of Object.values(expected.live)) {
    if (typeof doc.recordType === 'string') perType.set(doc.recordType, (perType.get(doc.recordType) ?? 0) + 1);
    else untyped += 1; // the old `agent-index` document has no recordType
  }
  const liveIds = Object.keys(expected.live);
  return { expected, perType, untyped, total: liveIds.length, deleted: expected.deleted.length, liveIds };
}
const EXPECTED = expectedFromFile();

// --------------------------------------------------------- server + browser

let demo; // the scripts/demo.sh run: {url, log(), stop()}
let baseUrl;
let browser;
let tmp;

before(async () => {
  tmp = mkdtempSync(join(tmpdir(), 'agentstore-e2e-'));
  demo = await startDemo({ DATABASE: join(tmp, 'demo.sqlite') });
  baseUrl = demo.url;
  const how = /\[demo\] starting: (\S+)/.exec(demo.log())?.[1] ?? '?';
  console.log(`demo.sh serves ${baseUrl} with ${how.includes('agentstore-server') ? 'agentstore-server' : 'the static fallback server'}`);
  browser = await launchBrowser();
}, { timeout: SERVER_TIMEOUT_MS + 120_000 });

after(async () => {
  await browser?.close().catch(() => {});
  await demo?.stop();
  if (tmp) rmSync(tmp, { recursive: true, force: true });
}, { timeout: 30_000 });

// ------------------------------------------------------------------ helpers

/** A fresh browser context (so a fresh IndexedDB) with the page loaded and ready. */
function openDemo(viewport = VIEWPORTS.desktop, context = null) {
  return openDemoAt(browser, baseUrl, viewport, context);
}

async function importDump(page, { afterClick } = {}) {
  await page.click('[data-testid=import-button]');
  afterClick?.();
  await page.waitForSelector('[data-testid=summary-documentsRead]');
  await page.waitForFunction(() => !document.querySelector('[data-testid=import-button]').disabled);
  await page.waitForFunction((n) => document.querySelector('[data-testid=count-total]').textContent === String(n), EXPECTED.total);
}

/** Lists with the browse form and pages forward; returns every id seen, in order. */
async function listAll(page, { prefix = '', type = '', limit = '10' }) {
  await page.fill('#browse-prefix', prefix);
  await page.fill('#browse-type', type);
  await page.selectOption('#browse-limit', limit);
  await page.click('[data-testid=browse-submit]');
  const ids = [];
  for (let pageNo = 1; ; pageNo++) {
    await page.waitForFunction((n) => document.querySelector('[data-testid=page-info]').textContent.startsWith(`Page ${n} `)
      || document.querySelector('[data-testid=page-info]').textContent.startsWith('No records'), pageNo);
    ids.push(...await page.$$eval('#records-body button[data-id]', (bs) => bs.map((b) => b.dataset.id)));
    if (await page.isDisabled('[data-testid=page-next]')) break;
    assert.ok(pageNo < 1000, 'paging does not end');
    await page.click('[data-testid=page-next]');
  }
  return ids;
}

/** Edits the open record's JSON in the textarea. */
async function editRecord(page, change) {
  const record = JSON.parse(await page.inputValue('[data-testid=editor-text]'));
  change(record);
  await page.fill('[data-testid=editor-text]', JSON.stringify(record, null, 2));
}

async function openById(page, id) {
  await page.fill('#open-id', id);
  await page.click('[data-testid=open-submit]');
  await page.waitForFunction((i) => document.querySelector('[data-testid=editor-id]').textContent === i, id);
}

// -------------------------------------------------------------------- tests

test('import shows the expected live count per recordType and in total', { timeout: 180_000 }, async () => {
  const { ctx, page } = await openDemo(VIEWPORTS.desktop);
  try {
    assert.equal(await text(page, 'count-total'), '0');
    await importDump(page);
    await assertNoError(page);

    for (const [type, n] of EXPECTED.perType) {
      assert.equal(await text(page, `count-${type}`), String(n), `count for recordType ${type}`);
    }
    assert.equal(await text(page, 'count-untyped'), String(EXPECTED.untyped), 'records without recordType');
    assert.equal(await text(page, 'count-total'), String(EXPECTED.total), 'total live records');
    const shown = await page.$$eval('#counts-body td[data-testid]', (tds) => tds.map((td) => td.dataset.testid).sort());
    const wanted = [...EXPECTED.perType.keys()].map((t) => `count-${t}`).concat(EXPECTED.untyped ? ['count-untyped'] : []).sort();
    assert.deepEqual(shown, wanted, 'exactly one count row per recordType');

    assert.equal(await text(page, 'summary-live'), String(EXPECTED.total));
    assert.equal(await text(page, 'summary-tombstones'), String(EXPECTED.deleted));

    // Something in every panel, then both viewports.
    await page.click('[aria-label="List records of type run"]');
    await page.waitForFunction(() => document.querySelector('[data-testid=page-info]').textContent.startsWith('Page 1 '));
    await page.click('#records-body button[data-id]');
    await page.waitForSelector('[data-testid=editor]', { state: 'visible' });
    await assertNoError(page);
    await page.evaluate(() => window.scrollTo(0, 0));
    for (const viewport of [VIEWPORTS.desktop, VIEWPORTS.phone]) {
      await page.setViewportSize(viewport);
      await shot(page, 'demo');
      await shot(page, 'demo', true);
      await assertNothingOverflows(page);
    }
  } finally {
    await ctx.close();
  }
});

test('an import clicked while the SDK still loads waits for it instead of failing', { timeout: 180_000 }, async () => {
  // A slow link: the SDK arrives only after the user clicked. Held until the
  // click instead of for a fixed 2 s (on a busy machine loading the page and
  // reading data-ready took longer than that, and the SDK was there first).
  const ctx = await browser.newContext({ viewport: VIEWPORTS.desktop });
  let sdkArrives;
  const clicked = new Promise((r) => { sdkArrives = r; });
  await ctx.route('**/pkg/**', async (route) => {
    await clicked;
    await route.continue();
  });
  const page = await ctx.newPage();
  page.setDefaultTimeout(60_000);
  page.errors = [];
  page.on('pageerror', (e) => page.errors.push(e));
  await page.goto(baseUrl, { waitUntil: 'domcontentloaded' });
  assert.notEqual(await page.getAttribute('body', 'data-ready'), 'true', 'the SDK was not late');
  await importDump(page, { afterClick: sdkArrives });
  await assertNoError(page);
  await ctx.close();
});

test('browse pages by prefix and by type with next/previous cursors', { timeout: 180_000 }, async () => {
  const { ctx, page } = await openDemo(VIEWPORTS.desktop);
  try {
    await importDump(page);

    // A prefix with neighbours (`agent-system-legacy:` vs `agent-system:`, `agent-systems:`, …).
    const prefix = 'agent-system-legacy:';
    const want = EXPECTED.liveIds.filter((id) => id.startsWith(prefix)).sort();
    const got = await listAll(page, { prefix, limit: '10' });
    assert.deepEqual(got, want, `ids listed for prefix ${prefix}`);

    // Previous goes back through the same pages.
    const lastPage = await page.$$eval('#records-body button[data-id]', (bs) => bs.map((b) => b.dataset.id));
    await page.click('[data-testid=page-prev]');
    await page.waitForFunction(() => document.querySelector('[data-testid=page-info]').textContent.startsWith('Page 3 '));
    assert.deepEqual(await page.$$eval('#records-body button[data-id]', (bs) => bs.map((b) => b.dataset.id)), want.slice(20, 30));
    await page.click('[data-testid=page-next]');
    await page.waitForFunction(() => document.querySelector('[data-testid=page-info]').textContent.startsWith('Page 4 '));
    assert.deepEqual(await page.$$eval('#records-body button[data-id]', (bs) => bs.map((b) => b.dataset.id)), lastPage);

    // By type, larger pages.
    const memoryIds = EXPECTED.liveIds.filter((id) => EXPECTED.expected.live[id].recordType === 'memory').sort();
    assert.deepEqual(await listAll(page, { type: 'memory', limit: '100' }), memoryIds, 'ids listed for type memory');

    // Prefix and type together, descending.
    await page.check('#browse-desc');
    const both = EXPECTED.liveIds.filter((id) => id.startsWith('agent-system:') && EXPECTED.expected.live[id].recordType === 'agent').sort().reverse();
    assert.deepEqual(await listAll(page, { prefix: 'agent-system:', type: 'agent', limit: '100' }), both, 'prefix + type, descending');
    await page.uncheck('#browse-desc');

    // Opening a listed record shows its JSON with the revision PouchDB chose.
    const id = memoryIds[0];
    await page.fill('#browse-prefix', '');
    await page.fill('#browse-type', 'memory');
    await page.selectOption('#browse-limit', '10');
    await page.click('[data-testid=browse-submit]');
    await page.waitForFunction(() => document.querySelector('[data-testid=page-info]').textContent.startsWith('Page 1 '));
    await page.click(`#records-body button[data-id="${id}"]`);
    await page.waitForFunction((i) => document.querySelector('[data-testid=editor-id]').textContent === i, id);
    const shown = JSON.parse(await page.inputValue('[data-testid=editor-text]'));
    assert.equal(shown._id, id);
    assert.equal(shown._rev, EXPECTED.expected.live[id].rev);
    assert.equal(await text(page, 'editor-rev'), EXPECTED.expected.live[id].rev);
    await assertNoError(page);
  } finally {
    await ctx.close();
  }
});

test('an edit conflict between two tabs is shown with both versions and resolved', { timeout: 180_000 }, async () => {
  const ctx = await browser.newContext({ viewport: VIEWPORTS.desktop });
  try {
    // Two tabs of one origin share the IndexedDB database.
    const { page: a } = await openDemo(VIEWPORTS.desktop, ctx);
    await importDump(a);
    const { page: b } = await openDemo(VIEWPORTS.desktop, ctx);
    assert.equal(await text(b, 'count-total'), String(EXPECTED.total));

    const id = EXPECTED.liveIds.find((i) => i.startsWith('agent-system:agent:'));
    const loadedRev = EXPECTED.expected.live[id].rev;
    await openById(a, id);
    await openById(b, id);
    assert.equal(await text(a, 'editor-rev'), loadedRev);

    // B saves first.
    await editRecord(b, (r) => { r.name = 'Edited in tab B'; });
    await b.click('[data-testid=editor-save]');
    await b.waitForFunction((rev) => document.querySelector('[data-testid=editor-rev]').textContent !== rev, loadedRev);
    const revB = await text(b, 'editor-rev');
    assert.match(revB, /^2-[0-9a-f]+$/);
    await assertNoError(b);

    // A saves against the revision it loaded: conflict, both versions shown.
    await editRecord(a, (r) => { r.name = 'Edited in tab A'; });
    await a.click('[data-testid=editor-save]');
    await a.waitForSelector('[data-testid=conflict]', { state: 'visible' });
    await assertNoError(a);
    const mine = JSON.parse(await text(a, 'conflict-mine'));
    const theirs = JSON.parse(await text(a, 'conflict-theirs'));
    assert.equal(mine.name, 'Edited in tab A');
    assert.equal(mine._rev, loadedRev);
    assert.equal(theirs.name, 'Edited in tab B');
    assert.equal(theirs._rev, revB);
    assert.match(await text(a, 'conflict-theirs-rev'), new RegExp(revB));
    assert.match(await text(a, 'conflict-diff'), /name/);
    assert.equal(await text(a, 'editor-rev'), loadedRev, 'nothing was written by the conflicting save');

    await shot(a, 'conflict');
    await assertNothingOverflows(a);
    await a.setViewportSize(VIEWPORTS.phone);
    await a.locator('[data-testid=conflict]').scrollIntoViewIfNeeded();
    await shot(a, 'conflict');
    await shot(a, 'conflict', true);
    await assertNothingOverflows(a);
    await a.setViewportSize(VIEWPORTS.desktop);

    // A resolves by overwriting on B's revision.
    await a.click('[data-testid=overwrite-mine]');
    await a.waitForSelector('[data-testid=conflict]', { state: 'hidden' });
    const revA = await text(a, 'editor-rev');
    assert.match(revA, /^3-[0-9a-f]+$/);
    assert.equal(JSON.parse(await a.inputValue('[data-testid=editor-text]')).name, 'Edited in tab A');
    await assertNoError(a);

    // B, still on revision 2, conflicts in turn and takes theirs (A's version).
    await editRecord(b, (r) => { r.name = 'Second edit in tab B'; });
    await b.click('[data-testid=editor-save]');
    await b.waitForSelector('[data-testid=conflict]', { state: 'visible' });
    assert.equal(JSON.parse(await text(b, 'conflict-theirs'))._rev, revA);
    await b.click('[data-testid=take-theirs]');
    await b.waitForSelector('[data-testid=conflict]', { state: 'hidden' });
    assert.equal(await text(b, 'editor-rev'), revA);
    assert.equal(JSON.parse(await b.inputValue('[data-testid=editor-text]')).name, 'Edited in tab A');

    // The stored record is A's, and the counts did not change.
    await b.click('[data-testid=editor-reload]');
    await b.waitForFunction(() => document.querySelector('[data-testid=status]').textContent.startsWith('Opened'));
    assert.equal(await text(b, 'editor-rev'), revA);
    await b.click('[data-testid=counts-refresh]');
    await b.waitForFunction(() => document.querySelector('[data-testid=counts-state]').textContent.startsWith('4 record type'));
    assert.equal(await text(b, 'count-total'), String(EXPECTED.total));
    await assertNoError(a);
    await assertNoError(b);
  } finally {
    await ctx.close();
  }
});

test('user errors are shown as messages, never a blank page', { timeout: 120_000 }, async () => {
  const { ctx, page } = await openDemo(VIEWPORTS.phone);
  try {
    await shot(page, 'empty');

    // Opening an id that does not exist, from the keyboard (Enter submits).
    await page.fill('#open-id', 'no-such-record');
    await page.press('#open-id', 'Enter');
    await page.waitForSelector('[data-testid=error]', { state: 'visible' });
    assert.match(await text(page, 'error'), /NotFoundError/);
    await page.click('#error-dismiss');
    await page.waitForSelector('[data-testid=error]', { state: 'hidden' });

    // Invalid JSON, then a change of _id, in the editor.
    await importDump(page);
    assert.equal(await page.isVisible('[data-testid=error]'), false, 'the next action clears the old error');
    const id = EXPECTED.liveIds.find((i) => i.startsWith('agent-system:run:'));
    await openById(page, id);
    await page.fill('[data-testid=editor-text]', '{ "_id": ');
    await page.click('[data-testid=editor-save]');
    await page.waitForSelector('[data-testid=error]', { state: 'visible' });
    assert.match(await text(page, 'error'), /not valid JSON/);
    await page.fill('[data-testid=editor-text]', JSON.stringify({ _id: 'other-id', recordType: 'run' }));
    await page.click('[data-testid=editor-save]');
    await page.waitForFunction(() => /can't be changed/.test(document.querySelector('[data-testid=error]').textContent));

    // A record the SDK refuses (reserved `_` field): its ValidationError is shown.
    await page.fill('[data-testid=editor-text]', JSON.stringify({ _id: id, recordType: 'run', _secret: 1 }));
    await page.click('[data-testid=editor-save]');
    await page.waitForFunction(() => /ValidationError/.test(document.querySelector('[data-testid=error]').textContent));
    assert.equal(await text(page, 'editor-rev'), EXPECTED.expected.live[id].rev, 'nothing was written');

    // A bad page size typed into the list options cannot blank the page either.
    await page.evaluate(() => { document.querySelector('#browse-limit').append(new Option('0', '0')); });
    await page.selectOption('#browse-limit', '0');
    await page.click('[data-testid=browse-submit]');
    await page.waitForFunction(() => /ValidationError/.test(document.querySelector('[data-testid=error]').textContent));
    // The error bar is sticky: still in view at the bottom of the page.
    await page.evaluate(() => window.scrollTo(0, document.documentElement.scrollHeight));
    const bar = await page.locator('#error-bar').boundingBox();
    assert.ok(bar && bar.y >= 0 && bar.y < 5, `error bar in view at the top, got ${JSON.stringify(bar)}`);

    assert.deepEqual(page.errors, []);
    await shot(page, 'errors');
    await shot(page, 'errors', true);
    await assertNothingOverflows(page);
  } finally {
    await ctx.close();
  }
});
