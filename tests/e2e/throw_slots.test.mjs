// A callback of the page that throws keeps no slot of the module's
// externref table (helper-230): against the built pkg/.
//
// With reference types, a js-sys `Function::call1`/`call2` (a `catch`
// import returning a value) that throws left its return value's table slot
// (holding `undefined`) for good: wasm-bindgen's shim stores the return
// value before the Rust side sees the exception, and the generated
// `take_last_exception()?` returns without dropping it. One slot (and ~8 B
// of the module's free list) per throwing `mutate` function, `onChunk`,
// `onProgress` and `work()` handler, two per `purgeTombstones` aborted from
// its `onProgress` (`Reflect.get(null, "name")` on the aborted
// transaction's `error`). The table doubled without bound: 132,100 slots
// after 70,000 throwing mutates.
//
//   node --test tests/e2e/throw_slots.test.mjs      (needs pkg/)

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { launchBrowser, servePkgPage } from './helpers.mjs';
import { launchFirefox } from '../../bench/webdriver.mjs';

const CALLS = 1000;

const PAGE = `
const mod = await import('/pkg/agentstore.js');
const wasm = await mod.default();
const io = await import('/pkg/io/agentstore_io.js');
const ioWasm = await io.default();
mod.AgentStore.setIoModule(io);
const slots = (w) => Object.values(w).filter((v) => v instanceof WebAssembly.Table).reduce((n, t) => n + t.length, 0);
const caught = (p) => p.then(() => 'resolved', (e) => e?.name ?? String(e));
window.throwSlots = async (name, n) => {
  await mod.AgentStore.destroy(name);
  const s = await mod.AgentStore.open(name);
  for (let i = 0; i < 50; i++) await s.put({ _id: 'r' + i });
  const t = await s.put({ _id: 'tomb' });
  await s.delete(t.id, t.rev);
  const out = {};
  const measure = async (key, w, f) => {
    for (let i = 0; i < 10; i++) await f(i);
    const before = slots(w);
    const seen = new Set();
    for (let i = 0; i < n; i++) seen.add(await f(i));
    out[key] = { added: slots(w) - before, outcomes: [...seen] };
  };
  await measure('mutate', wasm, () => caught(s.mutate('r1', () => { throw new Error('boom'); })));
  await measure('purge', wasm, () => caught(s.purgeTombstones({ olderThanMs: 0, onProgress: () => { throw new Error('p'); } })));
  await measure('onChunk', ioWasm, () => caught(s.exportSnapshotChunks(() => { throw new Error('c'); }, { batchSize: 10 })));
  await measure('onProgress', ioWasm, () => caught(s.verifyIndexes({ onProgress: () => { throw new Error('v'); } })));
  s.close();
  return out;
};
window.ready = true;
`;

const site = servePkgPage({ '/page.js': PAGE });

async function check(page, engine) {
  await page.goto(`${site.origin}/page.html`);
  await page.waitForFunction(() => window.ready === true, null, { timeout: 60_000 });
  const out = await page.evaluate(([n, c]) => window.throwSlots(n, c), [`throw-slots-${engine}`, CALLS]);
  assert.deepEqual(out.mutate.outcomes, ['Error'], `${engine}: the mutates rejected with what the function threw`);
  assert.deepEqual(out.purge.outcomes, ['Error'], `${engine}: the purges rejected with what onProgress threw`);
  assert.deepEqual(out.onChunk.outcomes, ['Error'], `${engine}: the exports rejected with what onChunk threw`);
  for (const [k, { added }] of Object.entries(out)) {
    assert.ok(added < CALLS / 10, `${engine}: ${added} table slots kept after ${CALLS} calls whose ${k} callback threw`);
  }
}

test('chromium: callbacks that throw keep no table slots', async () => {
  const browser = await launchBrowser();
  try {
    await check(await (await browser.newContext()).newPage(), 'chromium');
  } finally {
    await browser.close();
  }
});

test('firefox: callbacks that throw keep no table slots', async () => {
  const firefox = await launchFirefox();
  try {
    await check(await firefox.newPage(), 'firefox');
  } finally {
    await firefox.close();
  }
});
