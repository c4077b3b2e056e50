// The demo hands each worker of each tab its own enrollment token: two tabs of
// one browser never take the same one. A token used twice is not merely
// refused: within a minute the server takes the second use for a retry of the
// first and revokes what the first holder got, and later for a stolen token,
// revoking the worker it enrolled. With exactly as many worker tokens as the
// two pages have workers, any repeat pick leaves a worker refused.
//
//   node --test tests/e2e/demo_tokens.test.mjs

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { VIEWPORTS, assertNoError, demoForTests, openDemo, until } from './helpers.mjs';

const QUEUE = 'demo';
const t = demoForTests('tokens', { DEMO_TOKENS: '6', DEMO_PRODUCER_TOKENS: '2', DEMO_WORKLOAD: '0' });
const { api } = t;

/** `agentstore_auth_rejected_total` (every credential the server refused), summed. */
async function refusedCredentials() {
  const res = await fetch(`${t.demo.url}/metrics`, { headers: { Authorization: `Bearer ${t.admin}` } });
  assert.equal(res.status, 200);
  return (await res.text()).split('\n')
    .filter((l) => l.startsWith('agentstore_auth_rejected_total'))
    .reduce((sum, l) => sum + Number(l.split(' ').at(-1)), 0);
}

test('two tabs of one browser never enroll with the same token, so no worker is refused', { timeout: 180_000 }, async () => {
  const ctx = await t.browser.newContext({ viewport: VIEWPORTS.desktop });
  try {
    const pages = [];
    for (let i = 0; i < 2; i++) {
      const { page } = await openDemo(t.browser, t.demo.url, VIEWPORTS.desktop, ctx);
      await page.waitForSelector('body[data-workers-ready="true"]', { state: 'attached', timeout: 60_000 });
      pages.push(page);
    }
    const taken = await pages[0].evaluate(() => JSON.parse(localStorage.getItem('agentstore-demo-tokens-worker')).used);
    assert.equal(new Set(taken).size, 6, 'six distinct worker tokens taken');

    // Every worker keeps working: 18 short items all end done under their
    // first claim, and the server refused no credential on the way.
    const ids = [];
    for (let n = 0; n < 18; n++) ids.push((await api('POST', `/v1/queues/${QUEUE}/items`, { payload: { task: 'e2e', n, ms: 200 } })).id);
    const done = await until('every item to be done', 120_000, async () => {
      const all = await Promise.all(ids.map((id) => api('GET', `/v1/items/${id}`)));
      return all.every((it) => it.state === 'done') ? all : null;
    });
    for (const it of done) assert.equal(it.epoch, 1, `#${it.id} claimed once`);
    assert.equal(await refusedCredentials(), 0, 'no credential refused');
    for (const page of pages) {
      const states = await page.$$eval('.worker .badge', (b) => b.map((x) => x.dataset.state));
      assert.equal(states.length, 3);
      for (const s of states) assert.ok(s === 'polling' || s === 'working', `card state ${s}`);
      await assertNoError(page);
    }
  } finally {
    await ctx.close();
  }
});
