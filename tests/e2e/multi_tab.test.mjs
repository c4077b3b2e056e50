// Races across two pages (two IndexedDB connections in two browsing contexts
// of one origin), in headless Chromium: same-tick creates (case C-S2),
// concurrent `mutate` increments, and `AgentStore.destroy` closing the other
// page's connections. The SDK is loaded from pkg/ (built by the test command)
// through the static server that mirrors the demo server's layout.

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { ROOT, launchBrowser, spawnListening } from './helpers.mjs';

let server;
let browser;
let base;

/** Two pages of one origin, each with the SDK loaded and a store open. */
async function twoPages(dbName) {
  const context = await browser.newContext();
  const pages = [await context.newPage(), await context.newPage()];
  for (const page of pages) {
    await page.goto(`${base}/data/agent-records.expected.json`);
    await page.evaluate(async (name) => {
      const mod = await import('/pkg/agentstore.js');
      await mod.default();
      window.store = await mod.AgentStore.open(name);
    }, dbName);
  }
  return { context, pages };
}

before(async () => {
  assert.ok(existsSync(join(ROOT, 'pkg/agentstore.js')), 'pkg/ must be built first (scripts/test.sh does)');
  // The static server binds a port of its own choosing and prints it.
  server = await spawnListening(process.execPath, ['tests/e2e/static-server.mjs', '--listen', '127.0.0.1:0', '--www', 'www', '--pkg', 'pkg'], {
    listening: /static server: http:\/\/127\.0\.0\.1:(\d+)\//,
  });
  base = server.base;
  assert.ok((await fetch(`${base}/pkg/agentstore.js`)).ok, 'the static server serves pkg/');
  browser = await launchBrowser();
});

after(async () => {
  await browser?.close();
  await server?.stop();
});

test('two creates of one id from two pages in the same tick: exactly one wins, over 40 rounds', { timeout: 120_000 }, async () => {
  const { context, pages } = await twoPages('race-two-pages');
  for (let round = 0; round < 40; round++) {
    const at = Date.now() + 40; // both pages spin to this instant, then write
    const outcomes = await Promise.all(pages.map((page, i) => page.evaluate(async ({ round, at, who }) => {
      while (Date.now() < at) { /* barrier: spin to the shared instant */ }
      try {
        const r = await window.store.put({ _id: `same-${round}`, who });
        return { ok: true, rev: r.rev, who };
      } catch (e) {
        return { ok: false, name: e.name, code: e.code, status: e.status, who };
      }
    }, { round, at, who: i === 0 ? 'A' : 'B' })));
    const wins = outcomes.filter((o) => o.ok);
    const losses = outcomes.filter((o) => !o.ok);
    assert.equal(wins.length, 1, `round ${round}: ${JSON.stringify(outcomes)}`);
    assert.match(wins[0].rev, /^1-[0-9a-f]{32}$/);
    assert.deepEqual([losses[0].name, losses[0].code, losses[0].status], ['ConflictError', 'conflict', 409]);
    const stored = await pages[1].evaluate((id) => window.store.get(id), `same-${round}`);
    assert.equal(stored.who, wins[0].who, 'the stored body is the winner\'s');
  }
  await context.close();
});

test('2 pages x 250 mutate increments on one record = exactly 500', { timeout: 120_000 }, async () => {
  const { context, pages } = await twoPages('mutate-two-pages');
  await pages[0].evaluate(() => window.store.put({ _id: 'counter', n: 0 }));
  const at = Date.now() + 200;
  await Promise.all(pages.map((page) => page.evaluate(async (at) => {
    while (Date.now() < at) { /* start together */ }
    const inc = async (cur) => ({ ...cur, n: cur.n + 1 });
    const all = [];
    for (let i = 0; i < 250; i++) all.push(window.store.mutate('counter', inc, { retries: 1000 }));
    await Promise.all(all);
  }, at)));
  const got = await pages[1].evaluate(() => window.store.get('counter'));
  assert.equal(got.n, 500);
  assert.match(got._rev, /^501-/);
  await context.close();
});

test('a watch in page B sees page A\'s committed writes, and only those under its prefix', { timeout: 60_000 }, async () => {
  const { context, pages } = await twoPages('watch-two-pages');
  const [a, b] = pages;
  await b.evaluate(() => {
    window.seen = [];
    window.w = window.store.watch({ prefix: 'job:' }, (c) => window.seen.push(`${c.id}:${c.deleted}`));
  });
  await a.evaluate(async () => {
    const { rev } = await window.store.put({ _id: 'job:1', recordType: 'run' });
    await window.store.put({ _id: 'other:1' });
    await window.store.delete('job:1', rev);
    await window.store.putMany([{ _id: 'job:2' }, { _id: 'job:3' }]);
  });
  await b.waitForFunction(() => window.seen.length >= 4, null, { timeout: 10_000 });
  assert.deepEqual(await b.evaluate(() => window.seen), ['job:1:false', 'job:1:true', 'job:2:false', 'job:3:false']);
  // A control watch opened after `w`: a BroadcastChannel delivers to a page's
  // channels in creation order, so once the control has seen job:4, `w` would
  // have seen it too had close() not stopped it.
  await b.evaluate(() => {
    window.control = [];
    window.c = window.store.watch({ prefix: 'job:' }, (c) => window.control.push(c.id));
    window.w.close();
  });
  await a.evaluate(() => window.store.put({ _id: 'job:4' }));
  await b.waitForFunction(() => window.control.includes('job:4'), null, { timeout: 10_000 });
  assert.equal(await b.evaluate(() => window.seen.length), 4, 'nothing after close()');
  await b.evaluate(() => window.c.close());
  await context.close();
});

// A database this release creates posts no change message until something
// watches it. Page A writes first (its connection reads and caches the
// unwatched state), then page B watches and awaits `ready`: A's next write
// must be posted, and A's earlier ones never were. B's raw listener on the
// store's channel (not a watch: it marks nothing), made before A's first
// write, hears every post from A's connection in the order posted, so its
// first message is A's first post.
test('page A\'s writes are posted once page B watched, not before', { timeout: 60_000 }, async () => {
  for (let round = 0; round < 3; round++) {
    const { context, pages } = await twoPages(`watch-mark-two-pages-${round}`);
    const [a, b] = pages;
    await b.evaluate((name) => {
      window.raw = [];
      window.rawChannel = new BroadcastChannel(`agentstore:${name}`);
      window.rawChannel.onmessage = (e) => window.raw.push(e.data.map((c) => c.id));
    }, `watch-mark-two-pages-${round}`);
    await a.evaluate(async () => {
      await window.store.put({ _id: 'job:0' });
      await window.store.putMany([{ _id: 'job:00' }]);
    });
    await b.evaluate(async () => {
      window.seen = [];
      window.w = window.store.watch({ prefix: 'job:' }, (c) => window.seen.push(c.id));
      await window.w.ready;
    });
    await a.evaluate(() => window.store.put({ _id: 'job:1' }));
    await b.waitForFunction(() => window.seen.length >= 1 && window.raw.length >= 1, null, { timeout: 10_000 });
    assert.deepEqual(await b.evaluate(() => window.raw[0]), ['job:1'], `round ${round}`);
    assert.deepEqual(await b.evaluate(() => window.seen), ['job:1'], `round ${round}`);
    await b.evaluate(() => {
      window.w.close();
      window.rawChannel.close();
    });
    await context.close();
  }
});

test('an upgrade in page B closes page A\'s connection and tells it (C-E1)', { timeout: 60_000 }, async () => {
  const { context, pages } = await twoPages('upgrade-two-pages');
  const [a, b] = pages;
  await a.evaluate(async () => {
    window.told = 0;
    window.store.close();
    const mod = await import('/pkg/agentstore.js');
    window.store = await mod.AgentStore.open('upgrade-two-pages-x', { onVersionChange: () => { window.told += 1; } });
    await window.store.put({ _id: 'kept' });
  });
  // Page B is a newer release: it opens the database at version 2.
  const version = await b.evaluate(() => new Promise((ok, err) => {
    const r = indexedDB.open('upgrade-two-pages-x', 2);
    r.onsuccess = () => { const v = r.result.version; r.result.close(); ok(v); };
    r.onerror = () => err(r.error);
    r.onblocked = () => {};
  }));
  assert.equal(version, 2, 'page B was not left blocked');
  assert.equal(await a.evaluate(() => window.told), 1);
  const err = await a.evaluate(() => window.store.get('kept').then(() => null, (e) => ({ name: e.name, code: e.code })));
  assert.deepEqual(err, { name: 'ClosedError', code: 'closed' });
  await context.close();
});

test('quota exceeded on a big write rejects with QuotaExceededError and keeps the store whole (C-E2)', { timeout: 120_000 }, async () => {
  const context = await browser.newContext();
  const page = await context.newPage();
  await page.goto(`${base}/data/agent-records.expected.json`);
  const cdp = await context.newCDPSession(page);
  await cdp.send('Storage.overrideQuotaForOrigin', { origin: base, quotaSize: 1024 * 1024 });
  const result = await page.evaluate(async () => {
    const mod = await import('/pkg/agentstore.js');
    await mod.default();
    const store = await mod.AgentStore.open('quota', { indexes: [{ name: 'byType', keys: ['recordType', 'updatedAt'] }] });
    await store.rebuildIndexes();
    await store.put({ _id: 'small-before', recordType: 'run' });
    const big = 'x'.repeat(50 * 1024 * 1024);
    let error = null;
    try {
      await store.put({ _id: 'big', recordType: 'run', blob: big });
    } catch (e) {
      error = { name: e.name, code: e.code, status: e.status, isError: e instanceof Error };
    }
    const bigAfter = await store.get('big');
    const runs = (await store.listBy('byType', { eq: 'run' })).records.map((r) => r._id);
    const after = await store.put({ _id: 'small-after', recordType: 'run' });
    const verify = await store.verifyIndexes();
    return { error, bigAfter, runs, afterRev: after.rev, verify };
  });
  assert.deepEqual(result.error, { name: 'QuotaExceededError', code: 'quota_exceeded', status: 507, isError: true });
  assert.equal(result.bigAfter, null, 'nothing of the write is visible');
  assert.deepEqual(result.runs, ['small-before'], 'index unchanged');
  assert.match(result.afterRev, /^1-/, 'small writes still work');
  assert.deepEqual([result.verify.missing, result.verify.orphaned, result.verify.stale], [[], [], []]);
  await context.close();
});

test('a rebuild interrupted by closing the page resumes from its checkpoint on reopen and finishes clean', { timeout: 300_000 }, async () => {
  // A round is conclusive when the page closed while its rebuild was still
  // running (the reopened page has batches left to report). On a busy
  // machine the first page's rebuild may finish before its close lands, or
  // the reopened page's background resume may finish first: such a round
  // proves nothing and another is run (bounded), with smaller batches so
  // the close has more time to land mid-way.
  let conclusive = 0;
  for (let round = 0; round < 4 && conclusive === 0; round++) {
    const name = `rebuild-close-${round}`;
    const batchSize = [100, 20, 10, 5][round];
    const context = await browser.newContext();
    const load = async (page) => {
      await page.goto(`${base}/data/agent-records.expected.json`);
      await page.evaluate(async () => { const mod = await import('/pkg/agentstore.js'); await mod.default(); window.mod = mod; });
    };
    const first = await context.newPage();
    await load(first);
    await first.evaluate(async ({ name, batchSize }) => {
      const plain = await window.mod.AgentStore.open(name);
      const recs = [];
      for (let i = 0; i < 6000; i++) recs.push({ _id: `r${String(i).padStart(5, '0')}`, recordType: i % 3 ? 'toolCall' : 'run' });
      await plain.putMany(recs);
      plain.close();
      window.progress = [];
      const store = await window.mod.AgentStore.open(name, { indexes: [{ name: 'byType', keys: ['recordType', 'updatedAt'] }] });
      store.rebuildIndexes({ batchSize, restart: false, onProgress: (d) => window.progress.push(d) }).catch(() => {});
    }, { name, batchSize });
    await first.waitForFunction(() => window.progress.length >= 5, null, { timeout: 60_000 });
    await first.close(); // the page goes away mid-rebuild
    const second = await context.newPage();
    await load(second);
    // The same batch size: a rebuild started from zero would report
    // `batchSize` first, one resumed from the checkpoint more than 5 batches.
    const out = await second.evaluate(async ({ name, batchSize }) => {
      const store = await window.mod.AgentStore.open(name, { indexes: [{ name: 'byType', keys: ['recordType', 'updatedAt'] }] });
      const seen = [];
      await store.rebuildIndexes({ batchSize, restart: false, onProgress: (d) => seen.push(d) });
      const verify = await store.verifyIndexes();
      let runs = 0;
      let page = await store.listBy('byType', { eq: 'run', limit: 1000 });
      runs += page.records.length;
      while (page.next) { page = await store.listBy('byType', { eq: 'run', limit: 1000, after: page.next }); runs += page.records.length; }
      return { firstResumed: seen[0], verify, runs };
    }, { name, batchSize });
    // Whatever the timing, the index ends complete and clean.
    assert.deepEqual([out.verify.missing.length, out.verify.orphaned.length, out.verify.stale.length, out.verify.building.length], [0, 0, 0, 0]);
    assert.equal(out.verify.checked, 6000);
    assert.equal(out.runs, 2000);
    if (out.firstResumed !== undefined) {
      assert.ok(out.firstResumed > 5 * batchSize, `resumed from the checkpoint, not from zero (first progress ${out.firstResumed})`);
      conclusive += 1;
    }
    await context.close();
  }
  assert.equal(conclusive, 1, 'a page closed while its rebuild was running');
});

// AgentStore.destroy across two pages: the other page's connections are
// closed through `versionchange` (onVersionChange runs, later calls reject
// with ClosedError) and the database is deleted; a connection that ignores
// `versionchange` gives BlockedError after blockedTimeoutMs instead of a hang,
// and the deletion, queued in IndexedDB, completes once it closes.

/** `{name, code, isError}` of what `fn(arg)` rejects with in `page`, or null. */
const errorOf = (page, fn, arg) => page.evaluate(async ({ src, arg }) => {
  try {
    await (0, eval)(src)(arg);
    return null;
  } catch (e) {
    return { name: e.name, code: e.code, isError: e instanceof Error };
  }
}, { src: fn.toString(), arg });

test('destroy from one page closes the other page\'s store (onVersionChange, then ClosedError) and deletes the data', { timeout: 120_000 }, async () => {
  const name = `destroy-two-pages-${Date.now()}`;
  const { context, pages: [a, b] } = await twoPages(name);
  await a.evaluate(async (name) => {
    const mod = await import('/pkg/agentstore.js');
    window.versionChanges = 0;
    window.watched = await mod.AgentStore.open(name, { onVersionChange: () => { window.versionChanges++; } });
    await window.watched.put({ _id: 'kept?', v: 1 });
  }, name);
  await b.evaluate(async (name) => {
    const mod = await import('/pkg/agentstore.js');
    await mod.AgentStore.destroy(name, { blockedTimeoutMs: 10_000 });
  }, name);
  await a.waitForFunction(() => window.versionChanges === 1, null, { timeout: 10_000 });
  for (const call of [() => window.watched.get('kept?'), () => window.watched.put({ _id: 'late' }), () => window.store.get('kept?')]) {
    assert.deepEqual(await errorOf(a, call), { name: 'ClosedError', code: 'closed', isError: true });
  }
  assert.deepEqual(await errorOf(b, () => window.store.count()), { name: 'ClosedError', code: 'closed', isError: true });
  // The data is gone: a new connection finds an empty store.
  const after = await b.evaluate(async (name) => {
    const mod = await import('/pkg/agentstore.js');
    const s = await mod.AgentStore.open(name);
    const out = { got: await s.get('kept?'), n: await s.count() };
    s.close();
    return out;
  }, name);
  assert.deepEqual(after, { got: null, n: 0 });
  await context.close();
});

test('destroy while a connection ignores versionchange: BlockedError after the timeout, then the queued deletion completes', { timeout: 120_000 }, async () => {
  const name = `destroy-blocked-${Date.now()}`;
  const { context, pages: [a, b] } = await twoPages(name);
  await b.evaluate(() => window.store.put({ _id: 'x' }));
  // Page A also holds a raw connection without an onversionchange handler.
  await a.evaluate((name) => new Promise((ok, fail) => {
    const r = indexedDB.open(name);
    r.onsuccess = () => { window.raw = r.result; ok(); };
    r.onerror = () => fail(r.error);
  }), name);
  const e = await errorOf(b, async (name) => {
    const mod = await import('/pkg/agentstore.js');
    await mod.AgentStore.destroy(name, { blockedTimeoutMs: 300 });
  }, name);
  assert.deepEqual(e, { name: 'BlockedError', code: 'blocked', isError: true });
  await a.evaluate(() => window.raw.close());
  // IndexedDB kept the delete request queued: it completes now.
  await b.waitForFunction(async (name) => !(await indexedDB.databases()).some((d) => d.name === name), name, { timeout: 10_000, polling: 50 });
  await context.close();
});
