// agentstore: the import/export module, loaded on first use. The two
// shipped entry points ("agentstore", "agentstore/store") are built without
// the crate's `io` feature; their importPouchDump, importSnapshot and
// exportSnapshot* check their arguments and then call in here (src/api.rs).
// scripts/package.mjs inlines this file into each entry's glue and rewrites
// the `import()` path below relative to that glue.
//
// io/agentstore_io.js is the crate built with `--features io`: the whole
// store API plus those five bodies. A call opens its own connection to the
// store's (existing) database there, with the caller's index definitions and
// blockedTimeoutMs, runs the method and closes the connection; IndexedDB
// orders that connection's transactions with the caller's as it orders
// another tab's.

let io;
let source;
// The build this loader belongs to: scripts/package.mjs writes one id (a
// digest of the package's wasm files) here and into the io module's glue
// (`AGENTSTORE_RELEASE`). An io module of another build (a stale cached
// chunk, a mismatched CDN path) is refused before its wasm is fetched: its
// record, revision or index rules may differ even where the schema version
// does not. Left as is (unpackaged builds), nothing is compared.
const RELEASE = '__AGENTSTORE_RELEASE__';

/** `AgentStore.setIoModule(source)`: the module, or a function returning a Promise of it. */
export function ioUse(s) {
  source = s;
  io = undefined;
}

// `e` with the typed fields of an agentstore Error, defined as own
// properties (not assigned: an accessor without a setter of the same name
// on `Object.prototype` made an assignment throw a TypeError in its place).
const typed = (e, name, code, status) => {
  for (const [k, value] of [['name', name], ['code', code], ['status', status]]) {
    Reflect.defineProperty(e, k, { __proto__: null, value, writable: true, enumerable: true, configurable: true });
  }
  return e;
};

// Thrown for a module handed to setIoModule that is not the io module.
const notTheModule = () =>
  typed(new Error('agentstore: setIoModule: the module has no default() and AgentStore.__openForIo (is it "agentstore/io"?)'), 'ValidationError', 'validation', 400);

// Thrown for an io module of another build of agentstore.
const otherRelease = (theirs) =>
  typed(new Error(`agentstore: the io module is from another build (${String(theirs)}, not ${RELEASE})`), 'ValidationError', 'validation', 400);

const load = () => {
  if (!io) {
    const s = source ?? (() => import('./io/agentstore_io.js'));
    // default() fetches the module's wasm from beside its glue
    // (new URL(..., import.meta.url)), or returns at once when the app has
    // initialised the module itself.
    const p = Promise.resolve(typeof s === 'function' ? s() : s).then(async (m) => {
      if (typeof m?.default !== 'function' || typeof m.AgentStore?.__openForIo !== 'function') throw notTheModule();
      if (!RELEASE.startsWith('__') && m.AGENTSTORE_RELEASE !== RELEASE) throw otherRelease(m.AGENTSTORE_RELEASE);
      await m.default();
      return m;
    });
    io = p;
    // A failed load is not kept: the next call tries again (unless
    // setIoModule started another meanwhile). A failed fetch of
    // io/agentstore_io.js itself stays failed in Firefox, whose module map
    // keeps it as HTML specifies, until the page reloads; its wasm is
    // fetched again.
    p.catch(() => {
      if (io === p) io = undefined;
    });
  }
  return io;
};

/**
 * The initialised io module. A fetch that fails (offline, a CORS refusal: a
 * TypeError; an HTTP error status: wasm-bindgen's "failed to fetch Wasm"
 * Error) rejects with a NetworkError (code "network", status 503, the
 * failure in `cause`). A module that arrived but does not compile, link or
 * start (a CompileError, e.g. a CSP without 'wasm-unsafe-eval'; a LinkError;
 * a RuntimeError) or does not parse (a SyntaxError) rejects as thrown, and a
 * setIoModule source that is not the io module with a ValidationError.
 */
export async function ioLoad() {
  try {
    return await load();
  } catch (cause) {
    const W = globalThis.WebAssembly;
    if (
      cause?.name === 'ValidationError' ||
      cause instanceof SyntaxError ||
      (W && (cause instanceof W.CompileError || cause instanceof W.LinkError || cause instanceof W.RuntimeError))
    ) {
      throw cause;
    }
    const e = new Error(
      `agentstore: the import/export module (io/agentstore_io.js) could not be loaded: ${cause?.message ?? String(cause)}` +
        (source === undefined &&
        typeof ServiceWorkerGlobalScope === 'function' &&
        globalThis instanceof ServiceWorkerGlobalScope
          ? ' (a service worker cannot import() it: hand it over with AgentStore.setIoModule)'
          : ''),
      { cause },
    );
    throw typed(e, 'NetworkError', 'network', 503);
  }
}

// Per store token: the calls in ioRun, the io connections they opened, and
// whether the store was closed while one was in ioRun (close() then closes
// their connections too, including one whose open is still in flight). A
// token is forgotten when its last call ends.
const calls = new Map();

/** Closes the io connections of the store with `token` (its close()). */
export function ioClose(token) {
  const c = calls.get(token);
  if (!c) return;
  c.closed = true;
  for (const s of c.open) s.close();
}

/** Runs `method(a, b)` on a connection of module `m` to store `name`. */
export async function ioRun(m, token, name, indexes, timeoutMs, schema, method, a, b) {
  let c = calls.get(token);
  if (!c) calls.set(token, (c = { n: 0, open: new Set(), closed: false }));
  c.n++;
  try {
    const s = await m.AgentStore.__openForIo(name, indexes, timeoutMs, schema);
    c.open.add(s);
    try {
      if (c.closed) s.close();
      return await s[method](a, b);
    } finally {
      c.open.delete(s);
      s.close();
      s.free();
    }
  } finally {
    if (--c.n === 0) calls.delete(token);
  }
}
