// No argument of any type may trap the module (issue 15): every export of the
// built package — enumerated from the module itself, so a new class, method,
// getter or static is covered without editing this file — is called with
// every JS type in every argument position, in headless Chromium against
// pkg/ and a real agentstore-server (same origin: it serves the page and pkg/).
//
// A call passes when it returns/resolves, or throws/rejects a real `Error`
// that is not a `WebAssembly.RuntimeError` and is either an agentstore error
// (known `name`, string `code`), a `TypeError` JavaScript itself raised, or
// the exception a throwing Proxy argument raised itself.
// It may also stay pending (a long poll is not a trap); those are counted.
// After each method's calls the same page must still open a store, write
// and read, and a lease client must still claim and settle an item — a trap
// would have killed the module instance.
//
// Each method runs in its own page (a fresh module instance), on a fresh
// instance per call, so one trap is reported once and poisons nothing else.
// Skipped on purpose: `default`/`initSync` (they (re)initialise the module)
// and names starting with `__` (wasm-bindgen internals such as `__wrap(ptr)`,
// which adopt raw pointers by design).
//
//   node --test tests/e2e/no_trap.test.mjs     (needs pkg/ and the server built)
//
// Environment: AGENTSTORE_PKG_DIR (default pkg/), AGENTSTORE_SERVER_BIN
// (default target/debug/agentstore-server), NO_TRAP_PORT (default: a port the server picks itself).

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, rmSync, writeFileSync, mkdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ROOT, launchBrowser, leaseServerBin, startLeaseServer } from './helpers.mjs';

const PKG = process.env.AGENTSTORE_PKG_DIR ?? join(ROOT, 'pkg');
const ADMIN = 'no-trap-e2e-admin';

/**
 * Exports whose failures are reported but not fatal, for a fix that lands on
 * another branch (the lease client's argument fixes were listed here until
 * they were merged). Empty: the test is strict for every export.
 */
const LEASE_PENDING_FIX = [];

let dir;
let server;
let base;
let browser;

before(async () => {
  assert.ok(existsSync(join(PKG, 'agentstore.js')), `${PKG} must hold the built SDK (scripts/test.sh builds it)`);
  dir = mkdtempSync(join(tmpdir(), 'agentstore-no-trap-'));
  mkdirSync(join(dir, 'www'));
  writeFileSync(join(dir, 'www', 'index.html'), '<!doctype html><title>no trap</title><p>no trap</p>');
  server = await startLeaseServer(leaseServerBin(), [
    '--database', join(dir, 'leases.sqlite'), '--admin-token', ADMIN,
    '--www', join(dir, 'www'), '--pkg', PKG, '--claim-rate', '1000/s',
  ], Number(process.env.NO_TRAP_PORT ?? 0));
  base = server.base;
  browser = await launchBrowser();
});

after(async () => {
  await browser?.close();
  await server?.stop();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

/** In the page: the export's surface, as `[{owner, kind, name, arity}]`. */
async function surface(page, entry) {
  return page.evaluate(async (entry) => {
    const mod = await import(entry);
    await mod.default();
    const out = [];
    for (const [owner, v] of Object.entries(mod)) {
      if (owner === 'default' || owner === 'initSync' || owner.startsWith('__') || typeof v !== 'function') continue;
      // Every class is exported as a Proxy (scripts/package.mjs), whose
      // source text is "[native code]": its prototype's constructor is
      // the class itself.
      const source = Function.prototype.toString.call(v.prototype?.constructor ?? v);
      const isClass = /^class\b/.test(source);
      if (!isClass) {
        out.push({ owner, kind: 'function', name: owner, arity: v.length });
        continue;
      }
      if (/\bconstructor\s*\(/.test(source)) {
        out.push({ owner, kind: 'constructor', name: 'constructor', arity: v.length });
      }
      for (const name of Object.getOwnPropertyNames(v)) {
        if (['length', 'name', 'prototype'].includes(name) || name.startsWith('__')) continue;
        if (typeof v[name] === 'function') out.push({ owner, kind: 'static', name, arity: v[name].length });
      }
      for (const key of Reflect.ownKeys(v.prototype)) {
        const name = typeof key === 'symbol' ? key.description : key;
        if (name === 'constructor' || name.startsWith('__')) continue;
        const d = Object.getOwnPropertyDescriptor(v.prototype, key);
        if (d.get) out.push({ owner, kind: 'getter', name, arity: 0 });
        if (d.set) out.push({ owner, kind: 'setter', name, arity: 1 });
        if (typeof d.value === 'function') out.push({ owner, kind: 'method', name, arity: d.value.length, symbol: typeof key === 'symbol' });
      }
    }
    return out;
  }, entry);
}

/**
 * In the page: calls one member with every bad value in every position (and
 * in all positions at once), each on a fresh instance; then checks that the
 * store and the lease client still work. Resolves to `{calls, pending, bad, stillWorks}`.
 */
async function exercise(page, { entry, member, origin, admin }) {
  return page.evaluate(async ({ entry, member, origin, admin }) => {
    // `mod` is the entry point under test; `full` (the whole package) drives the lease server.
    const mod = await import(entry);
    await mod.default();
    const full = await import('/pkg/agentstore.js');
    await full.default();
    const NAMES = ['ConflictError', 'ValidationError', 'NotFoundError', 'QuotaExceededError', 'TransactionError',
      'BlockedError', 'ClosedError', 'AbortError', 'ClaimLostError', 'StateConflictError', 'UnauthorizedError',
      'ForbiddenError', 'RateLimitedError', 'PayloadTooLargeError', 'BadRequestError', 'NetworkError', 'InternalError'];
    const adminCall = async (method, path, body) => {
      const r = await fetch(origin + path, {
        method, headers: { authorization: `Bearer ${admin}`, 'content-type': 'application/json' },
        body: body === undefined ? undefined : JSON.stringify(body),
      });
      if (!r.ok) throw new Error(`${method} ${path}: ${r.status}`);
      return r.status === 204 ? null : r.json();
    };
    const token = async () => (await adminCall('POST', '/v1/admin/enrollment-tokens', {})).token;
    const enqueue = (queue) => adminCall('POST', `/v1/queues/${queue}/items`, { payload: { n: 1 } });
    const db = `no-trap-${Math.random().toString(36).slice(2)}`;
    // One enrolled identity for every client of this page.
    const seed = new full.LeaseClient(origin, { enrollmentToken: await token(), journal: false });
    await seed.claim('no-trap-seed');
    const { accessToken } = seed.credentials;
    const client = () => new (mod.LeaseClient ?? full.LeaseClient)(origin, { accessToken, journal: false });
    const q = `nt${Math.random().toString(36).slice(2, 8)}`;
    const FACTORIES = {
      AgentStore: () => mod.AgentStore.open(db),
      LeaseClient: client,
      Lease: async () => {
        await enqueue(q);
        const lease = await client().claim(q);
        if (!lease) throw new Error('no lease to test with');
        return lease;
      },
      LeaseWorker: () => client().work(`${q}-w`, async () => {}, { pollIntervalMs: 50 }),
    };
    const VALUES = {
      undefined: () => undefined,
      null: () => null,
      number: () => 42,
      NaN: () => NaN,
      bigint: () => 10n,
      symbol: () => Symbol('s'),
      boolean: () => true,
      'plain object': () => ({ a: 1 }),
      array: () => [1, 'x', null],
      function: () => () => 'f',
      Proxy: () => new Proxy({ k: 1 }, {}),
      'throwing Proxy': () => new Proxy({}, { get() { throw OWN; }, has() { throw OWN; }, ownKeys() { throw OWN; } }),
      Blob: () => new Blob(['{"x":1}\n']),
      'string (where an object is expected)': () => 'not-an-object',
      // Objects that only claim a platform prototype: instanceof says
      // Request/Response, but every getter of the real class throws on them
      // ("Illegal invocation"), past the module unless it reads them safely.
      'fake Request': () => Object.create(Request.prototype),
      'fake Response': () => Object.create(Response.prototype),
      'options with a fake signal': () => ({ signal: Object.create(AbortSignal.prototype) }),
      // Multi-byte and lone-surrogate text, where Rust code that splits or
      // slices by byte index would panic (a cursor starting with 'é' did).
      'non-ASCII string': () => 'i1.\u00e9.s\u{1F600}\uD800',
      'object of non-ASCII strings': () => ({
        after: 'i1.\u00e9', prefix: '\u00e9', eq: '\u{1F600}', gte: '\u00e9', lte: '\uD800', id: '\u00e9', _id: '\u00e9x',
      }),
    };
    // What the throwing Proxy throws: the argument's own exception, which may
    // pass through unchanged (JavaScript itself raised it, not the module).
    const OWN = new Error('thrown by the argument itself');
    const PENDING_MS = 3000;
    const cleanup = async (x) => {
      try { if (x && typeof x.stop === 'function') await x.stop(); } catch {}
      try { if (x && typeof x.close === 'function') await x.close(); } catch {}
    };
    const classify = (e) => {
      if (e instanceof WebAssembly.RuntimeError) return `WebAssembly.RuntimeError: ${e.message}`;
      if (e === OWN) return null;
      if (!(e instanceof Error)) return `threw a non-Error: ${String(e)}`;
      // JavaScript's own TypeError, or one the module raises where JavaScript would
      // (a non-function callback); if it carries a code, the code is a string.
      if (e instanceof TypeError) return 'code' in e && typeof e.code !== 'string' ? `TypeError with code ${String(e.code)}` : null;
      if (!NAMES.includes(e.name)) return `unexpected error name ${e.name}: ${e.message}`;
      if (typeof e.code !== 'string' || !e.code) return `${e.name} without a code: ${e.message}`;
      return null;
    };
    const invoke = async (args) => {
      const { owner, kind, name } = member;
      let target = null;
      try {
        if (kind === 'method' || kind === 'getter' || kind === 'setter') {
          if (!FACTORIES[owner]) return `no factory for class ${owner}: add one to FACTORIES in this test`;
          try {
            target = await FACTORIES[owner]();
          } catch (e) {
            return `making a ${owner} to call it on failed: ${e?.name}: ${e?.message}`;
          }
        }
        let r;
        if (kind === 'function') r = mod[owner](...args);
        else if (kind === 'constructor') r = new mod[owner](...args);
        else if (kind === 'static') r = mod[owner][name](...args);
        else if (kind === 'getter') r = target[name];
        else if (kind === 'setter') { target[name] = args[0]; r = undefined; }
        else {
          const fn = member.symbol ? target[Symbol[name.replace(/^Symbol\./, '')]] : target[name];
          r = fn.apply(target, args);
        }
        if (r && typeof r.then === 'function') {
          const t = await Promise.race([
            r.then((v) => ({ v }), (e) => ({ e })),
            new Promise((res) => setTimeout(res, PENDING_MS, { pending: true })),
          ]);
          if (t.pending) return 'pending';
          if ('e' in t) return classify(t.e);
          await cleanup(t.v);
          return null;
        }
        await cleanup(r);
        return null;
      } catch (e) {
        return classify(e);
      } finally {
        await cleanup(target);
        try { target?.free?.(); } catch {}
      }
    };
    const positions = Math.max(member.arity, 1);
    const bad = [];
    let calls = 0;
    let pending = 0;
    for (const [label, make] of Object.entries(VALUES)) {
      const plans = [];
      for (let i = 0; i < positions; i++) plans.push([`argument ${i}`, Array.from({ length: positions }, (_, j) => (j === i ? make() : undefined))]);
      if (positions > 1) plans.push(['every argument', Array.from({ length: positions }, () => make())]);
      if (member.kind === 'getter') plans.splice(1);
      for (const [where, args] of plans) {
        calls++;
        const r = await invoke(args);
        if (r === 'pending') pending++;
        else if (r) bad.push(`${label} as ${where}: ${r}`);
        if (member.kind === 'getter') break;
      }
      if (member.kind === 'getter') break;
    }
    // Still alive: the store and the lease client work in this module instance.
    let stillWorks = '';
    try {
      const s = await mod.AgentStore.open(`${db}-after`);
      await s.put({ _id: 'alive', v: 1 });
      if ((await s.get('alive'))?.v !== 1) throw new Error('store read back wrong');
      s.close();
      await enqueue(`${q}-after`);
      const c = client();
      const lease = await c.claim(`${q}-after`);
      if (!lease) throw new Error('lease client claimed nothing');
      await lease.settle('done', { ok: true });
      await c.close();
    } catch (e) {
      stillWorks = `${e?.name}: ${e?.message}`;
    }
    try { await seed.close(); } catch {}
    return { calls, pending, bad, stillWorks };
  }, { entry, member, origin, admin });
}

/** The package's entry points: the whole package, and the store-only one when built. */
const ENTRIES = [
  ['/pkg/agentstore.js', ['AgentStore', 'LeaseClient', 'Lease', 'LeaseWorker']],
  ...(existsSync(join(PKG, 'store', 'agentstore.js')) ? [['/pkg/store/agentstore.js', ['AgentStore']]] : []),
];

for (const [entry, expected] of ENTRIES) {
  test(`every export of ${entry} × every JS type: a typed Error or a result, never a trap`, { timeout: 1_200_000 }, async () => {
    const context = await browser.newContext();
    const page = await context.newPage();
    await page.goto(`${base}/index.html`);
    const members = await surface(page, entry);
    await context.close();
    const owners = new Set(members.map((m) => m.owner));
    for (const must of expected) assert.ok(owners.has(must), `${entry} exports ${must}`);
    assert.ok(members.some((m) => m.owner === 'AgentStore' && m.name === 'getMany'), 'enumeration sees instance methods');
    assert.ok(members.some((m) => m.owner === 'AgentStore' && m.kind === 'static' && m.name === 'open'), 'and statics');
    const fatal = [];
    const leasePending = [];
    let calls = 0;
    let pending = 0;
    for (const member of members) {
      const ctx = await browser.newContext();
      const p = await ctx.newPage();
      const errors = [];
      p.on('pageerror', (e) => errors.push(String(e)));
      try {
        await p.goto(`${base}/index.html`);
        const r = await exercise(p, { entry, member, origin: base, admin: ADMIN });
        calls += r.calls;
        pending += r.pending;
        const problems = [...r.bad];
        if (r.stillWorks) problems.push(`afterwards the store / lease client no longer work: ${r.stillWorks}`);
        for (const e of errors.filter((x) => /RuntimeError/.test(x))) problems.push(`uncaught in the page: ${e}`);
        const label = `${member.owner}${member.kind === 'static' ? '.' : member.kind === 'constructor' ? ' ' : '#'}${member.name} (${member.kind})`;
        for (const msg of problems) (LEASE_PENDING_FIX.includes(member.owner) ? leasePending : fatal).push(`${label}: ${msg}`);
      } finally {
        await ctx.close();
      }
    }
    console.log(`no-trap ${entry}: ${members.length} members, ${calls} calls, ${pending} left pending after 3 s`);
    if (leasePending.length) {
      console.log(`LEASE-SIDE FAILURES (not fatal until the lease_api.rs argument fixes are merged; then empty LEASE_PENDING_FIX):\n  ${leasePending.join('\n  ')}`);
    }
    assert.deepEqual(fatal, [], `calls that trapped or threw something other than a typed Error:\n  ${fatal.join('\n  ')}`);
  });
}

// Runs \`fn(arg)\` in a fresh page of the demo origin (its own context),
// closed afterwards.
async function inFreshPage(fn, arg) {
  const context = await browser.newContext();
  try {
    const page = await context.newPage();
    await page.goto(`${base}/index.html`);
    return await page.evaluate(fn, arg);
  } finally {
    await context.close();
  }
}

// A method called on an object after its free() (or a `using` block's end)
// fails with a typed ClosedError (before: wasm-bindgen's bare
// `Error("null pointer passed to rust")`, no name or code): a method typed
// `Promise<…>` returns a rejected Promise, as it does for every other error
// (before: it threw, so `store.get(id).catch(f)` never reached `f`), a
// synchronous one and a getter throw. The module keeps working; a `watch()`
// handle is a plain object whose close() may be called twice.
for (const entry of ENTRIES.map(([e]) => e)) {
  test(`${entry}: a freed object's async methods reject with ClosedError and its sync ones throw it, a detached one ValidationError, and a watch handle closes twice`, { timeout: 120_000 }, async () => {
    const r = await inFreshPage(async ({ entry, origin }) => {
      const mod = await import(entry);
      await mod.default();
      const db = `freed-${Math.random().toString(36).slice(2)}`;
      const store = await mod.AgentStore.open(db);
      const watch = store.watch({}, () => {});
      watch.close();
      watch.close();
      const isPlainHandle = Object.isFrozen(watch) && typeof watch.close === 'function';
      store.free();
      store.free(); // a second free() is harmless
      // How a call failed: a method typed `Promise<…>` rejects (it does
      // not throw), a synchronous one and a getter throw.
      const failure = async (call) => {
        let p;
        try {
          p = call();
        } catch (e) {
          return `threw:${e instanceof Error}:${e.name}:${e.code}:${e.status}`;
        }
        if (!(p instanceof Promise)) return 'no error';
        return p.then(() => 'no error', (e) => `rejected:${e instanceof Error}:${e.name}:${e.code}:${e.status}`);
      };
      const caught = [];
      const calls = [() => store.get('x'), () => store.put({ _id: 'x' }), () => store.close()];
      if (mod.LeaseClient) {
        const client = new mod.LeaseClient(origin, { journal: false });
        client.free();
        calls.push(() => client.claim('q'), () => client.credentials);
      }
      for (const call of calls) caught.push(await failure(call));
      // Many more: each used to leave part of the module's stack behind,
      // and about 8,000 of them broke every later call.
      for (let i = 0; i < 20_000; i++) {
        try { calls[i % calls.length]()?.catch?.(() => {}); } catch {}
      }
      const again = await mod.AgentStore.open(db);
      const { rev } = await again.put({ _id: 'after' });
      // A method taken off its object, or called on another object: a
      // typed ValidationError naming it (before: a TypeError reading
      // `__wbg_ptr` of undefined, or "freed" for a never-made object).
      const detached = [];
      const { get } = again;
      for (const call of [() => get('after'), () => mod.AgentStore.prototype.put.call({}, { _id: 'y' })]) {
        try {
          const p = call();
          detached.push(p instanceof Promise ? await p.then(() => 'no error', (e) => `rejected:${e instanceof Error}:${e.name}:${e.code}:${e.status}:${/^AgentStore\.(get|put) was called on something that is not an AgentStore /.test(e.message)}`) : 'no error');
        } catch (e) {
          detached.push(`threw:${e.name}`);
        }
      }
      again.close();
      return { isPlainHandle, caught, rev, detached };
    }, { entry, origin: base });
    assert.ok(r.isPlainHandle, 'watch() returns a frozen handle');
    const closed = 'true:ClosedError:closed:410';
    // get, put: Promises; close(): a teardown call, which never throws
    // (tests/e2e/teardown.test.mjs); then claim: a Promise, credentials: a getter.
    const how = ['rejected', 'rejected', null, 'rejected', 'threw'].slice(0, r.caught.length);
    assert.deepEqual(r.caught, how.map((h) => (h ? `${h}:${closed}` : 'no error')));
    assert.deepEqual(r.detached, ['rejected:true:ValidationError:validation:400:true', 'rejected:true:ValidationError:validation:400:true']);
    assert.match(r.rev, /^1-/, 'the module still works');
  });
}

// free() (or dispose) called while one of the object's own calls is reading
// its argument (a getter, a Proxy trap: docs allow such code to call the
// SDK) takes effect when that call returns: no error from free(), the call
// completes, later calls throw ClosedError, and then it is freed. Before, free() threw
// a plain Error ("attempted to take ownership of Rust value while it was
// borrowed", no name or code) and left the object neither usable nor
// dropped, its connection open for good.
for (const entry of ENTRIES.map(([e]) => e)) {
  test(`${entry}: free() during the object's own call takes effect when the call returns`, { timeout: 120_000 }, async () => {
    const r = await inFreshPage(async ({ entry }) => {
      const mod = await import(entry);
      await mod.default();
      const out = [];
      const db = `free-in-call-${Math.random().toString(36).slice(2)}`;
      for (const how of ['free', 'dispose']) {
        const store = await mod.AgentStore.open(db);
        let freeError = 'none';
        let inner = 'none';
        const record = {
          _id: 'k-' + how,
          get n() {
            try {
              how === 'free' ? store.free() : store[Symbol.dispose]();
            } catch (e) {
              freeError = `${e.name}:${e.code}`;
            }
            // A Promise method: rejects (a throw is recorded as such).
            try {
              inner = store.get('x').then(() => 'no error', (e) => `${e.name}:${e.code}`);
            } catch (e) {
              inner = `threw ${e.name}:${e.code}`;
            }
            return 1;
          },
        };
        let put;
        try {
          put = await store.put(record).then((w) => `written ${w.id}`, (e) => `rejected ${e.name}:${e.code}`);
        } catch (e) {
          put = `threw ${e.name}:${e.code}`;
        }
        let after;
        try {
          await store.get('x');
          after = 'no error';
        } catch (e) {
          after = `${e.name}:${e.code}`;
        }
        out.push({ how, freeError, inner: await inner, put, after });
      }
      await mod.AgentStore.destroy(db);
      return { out };
    }, { entry });
    for (const o of r.out) {
      assert.deepEqual(o, { how: o.how, freeError: 'none', inner: 'ClosedError:closed', put: `written k-${o.how}`, after: 'ClosedError:closed' });
    }
  });
}

// A method or static given more arguments than it takes is refused with a
// ValidationError naming it, and nothing is done: before, the glue dropped
// them, so `putMany(docs, {signal})` with an aborted signal wrote the
// records, and PouchDB habits (`put(doc, {force: true})`, `get(id, {revs:
// true})`) passed silently. A Promise method rejects; a synchronous one
// throws, as does `new LeaseClient(...)`. Trailing `undefined`s count as
// absent.
for (const entry of ENTRIES.map(([e]) => e)) {
  test(`${entry}: an argument a method does not take is refused and nothing is done`, { timeout: 120_000 }, async () => {
    const r = await inFreshPage(async ({ entry, origin }) => {
      const mod = await import(entry);
      await mod.default();
      const db = `arity-${Math.random().toString(36).slice(2)}`;
      const s = await mod.AgentStore.open(db);
      const { rev } = await s.put({ _id: 'kept', n: 1 });
      const ac = new AbortController();
      ac.abort();
      const outcome = async (call) => {
        let p;
        try {
          p = call();
        } catch (e) {
          return `threw ${e.name}:${e.code}:${/takes \d arguments?, not \d/.test(e.message)}`;
        }
        if (!(p instanceof Promise)) return 'not a Promise';
        return p.then((v) => (v === true ? 'true' : 'resolved'), (e) => `rejected ${e.name}:${e.code}:${/takes \d arguments?, not \d/.test(e.message)}`);
      };
      const calls = {
        putMany: () => s.putMany([{ _id: 'a' }, { _id: 'b' }], { signal: ac.signal }),
        put: () => s.put({ _id: 'c' }, { force: true }),
        delete: () => s.delete('kept', rev, { signal: ac.signal }),
        deleteMany: () => s.deleteMany([{ id: 'kept', rev }], {}),
        get: () => s.get('kept', { revs: true }),
        getMany: () => s.getMany(['kept'], { signal: ac.signal }),
        list: () => s.list({}, { x: 1 }),
        dropIndex: () => s.dropIndex('byType', {}, 'extra'),
        open: () => mod.AgentStore.open(db, {}, 'extra'),
        watch: () => s.watch({}, () => {}, { x: 1 }),
      };
      if (mod.LeaseClient) {
        const client = new mod.LeaseClient(origin, { journal: false });
        calls.claim = () => client.claim('q', undefined, { x: 1 });
        calls.work = () => client.work('q', async () => {}, {}, 'extra');
        calls.constructor = () => new mod.LeaseClient(origin, { journal: false }, 'extra');
        // What \`new\` makes is still the exported class's instance.
        const made = new mod.LeaseClient(origin, { journal: false }, undefined);
        calls.instance = () => Promise.resolve(made instanceof mod.LeaseClient && mod.LeaseClient.name === 'LeaseClient' && typeof made.claim === 'function');
      }
      const out = {};
      for (const [k, call] of Object.entries(calls)) out[k] = await outcome(call);
      const ids = (await s.list()).records.map((x) => x._id);
      const trailing = (await s.get('kept', undefined, undefined))?.n;
      s.close();
      return { out, ids, trailing };
    }, { entry, origin: base });
    if (r.out.instance !== undefined) assert.equal(r.out.instance, 'true', 'new LeaseClient makes a LeaseClient');
    delete r.out.instance;
    for (const [k, v] of Object.entries(r.out)) {
      const sync = k === 'watch' || k === 'work' || k === 'constructor';
      assert.equal(v, `${sync ? 'threw' : 'rejected'} ValidationError:validation:true`, k);
    }
    assert.deepEqual(r.ids, ['kept'], 'nothing written or deleted');
    assert.equal(r.trailing, 1, 'trailing undefineds are no arguments');
  });
}
