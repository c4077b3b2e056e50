// A getter or Proxy trap of the page that throws while a call reads its
// arguments keeps no slot of the module's externref table: against the
// built pkg/.
//
// With reference types, a js-sys `Reflect::get` (a `catch` import returning
// a value) that throws left its return value's table slot for good (see
// throw_slots.test.mjs): one slot per `list`/`listBy` whose options' getter
// threw, per `putMany`/`getMany` given a Proxy, per `open` whose index
// definition's getter threw (1,920 slots after 2,000 such calls). The
// module now reads the page's values through imports that return nothing
// (src/value.rs `get`; clippy.toml refuses js-sys's), and an import's line
// that is not JSON no longer throws through its binding.
//
// Each case runs in a fresh page, where the table is small: 2,000 leaked
// slots must grow it.
//
//   node --test tests/e2e/getter_slots.test.mjs      (needs pkg/)

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { launchBrowser, servePkgPage } from './helpers.mjs';
import { launchFirefox } from '../../bench/webdriver.mjs';

const CALLS = 2000;

const PAGE = `
const mod = await import('/pkg/agentstore.js');
const wasm = await mod.default();
const io = await import('/pkg/io/agentstore_io.js');
const ioWasm = await io.default();
mod.AgentStore.setIoModule(io);
const slots = (w) => Object.values(w).filter((v) => v instanceof WebAssembly.Table).reduce((n, t) => n + t.length, 0);
const caught = (f) => Promise.resolve().then(f).then(() => 'resolved', (e) => e?.name ?? String(e));
const boom = () => { throw new Error('getter'); };
const throwing = new Proxy([], { get: boom });
const cases = {
  listOption: [wasm, (s) => s.list({ get limit() { boom(); } })],
  listByOption: [wasm, (s) => s.listBy('byType', { get prefix() { boom(); } })],
  optionKeys: [wasm, (s) => s.list(new Proxy({}, { ownKeys: boom }))],
  putManyProxy: [wasm, (s) => s.putMany(throwing)],
  getManyProxy: [wasm, (s) => s.getMany(throwing)],
  getManyItem: [wasm, (s) => s.getMany(Object.defineProperty([], 0, { get: boom, enumerable: true }))],
  putProxy: [wasm, (s) => s.put(new Proxy({ _id: 'p' }, { get: boom }))],
  openOption: [wasm, () => mod.AgentStore.open('getter-slots-2', { get indexes() { boom(); } })],
  openIndex: [wasm, () => mod.AgentStore.open('getter-slots-2', { indexes: [{ get name() { boom(); } }] })],
  importLine: [ioWasm, (s) => s.importPouchDump('{"docs":[{"_id":"a"}]}\\n{not json\\n')],
  lockedStream: [ioWasm, (s) => { const r = new ReadableStream(); r.getReader(); return s.importPouchDump(r); }],
  chunkTag: [ioWasm, (s) => {
    const chunk = new TextEncoder().encode('{}\\n');
    Object.defineProperty(chunk, Symbol.toStringTag, { get: boom });
    return s.importPouchDump(new ReadableStream({ start(c) { c.enqueue(chunk); c.close(); } }));
  }],
  throwingRead: [ioWasm, (s) => {
    const r = new ReadableStream();
    r.getReader = () => ({ read: boom, cancel() {} });
    return s.importPouchDump(r);
  }],
};
window.caseNames = Object.keys(cases);
window.getterSlots = async (name, key, n) => {
  await mod.AgentStore.destroy(name);
  const s = await mod.AgentStore.open(name, { indexes: [{ name: 'byType', keys: ['type'] }] });
  await s.put({ _id: 'r1', type: 't' });
  const [w, f] = cases[key];
  for (let i = 0; i < 10; i++) await caught(() => f(s));
  const before = slots(w);
  const seen = new Set();
  for (let i = 0; i < n; i++) seen.add(await caught(() => f(s)));
  const out = { added: slots(w) - before, outcomes: [...seen], records: (await s.list()).records.length };
  s.close();
  return out;
};
window.ready = true;
`;

const site = servePkgPage({ '/page.js': PAGE });

async function check(page, engine) {
  const load = async () => {
    await page.goto(`${site.origin}/page.html`);
    await page.waitForFunction(() => window.ready === true, null, { timeout: 60_000 });
  };
  await load();
  const kept = [];
  for (const key of await page.evaluate(() => window.caseNames)) {
    await load(); // a fresh module instance: its table is small
    const out = await page.evaluate(([n, k, c]) => window.getterSlots(n, k, c), [`getter-slots-${engine}`, key, CALLS]);
    assert.equal(out.outcomes.length, 1, `${engine} ${key}: every call rejected alike: ${out.outcomes}`);
    assert.match(out.outcomes[0], /^(ValidationError|UnreadableError)$/, `${engine} ${key}: the call's rejection`);
    assert.equal(out.records, 1, `${engine} ${key}: nothing was written`);
    if (out.added >= CALLS / 10) kept.push(`${key}: ${out.added}`);
  }
  assert.deepEqual(kept, [], `${engine}: table slots kept after ${CALLS} calls each`);
}

test('chromium: getters and traps that throw keep no table slots', async () => {
  const browser = await launchBrowser();
  try {
    await check(await (await browser.newContext()).newPage(), 'chromium');
  } finally {
    await browser.close();
  }
});

test('firefox: getters and traps that throw keep no table slots', async () => {
  const firefox = await launchFirefox();
  try {
    await check(await firefox.newPage(), 'firefox');
  } finally {
    await firefox.close();
  }
});
