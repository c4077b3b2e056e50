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

/** `AgentStore.setIoModule(source)`: the module, or a function returning a Promise of it. */
export function ioUse(s) {
  source = s;
  io = undefined;
}

const load = () => {
  if (!io) {
    const s = source ?? (() => import('./io/agentstore_io.js'));
    // default() fetches the module's wasm from beside its glue
    // (new URL(..., import.meta.url)), or returns at once when the app has
    // initialised the module itself.
    io = Promise.resolve(typeof s === 'function' ? s() : s).then(async (m) => {
      await m.default();
      return m;
    });
    // A failed load is not kept: the next call tries again. (A failed fetch
    // of io/agentstore_io.js itself stays failed in Firefox, whose module map
    // keeps it as HTML specifies, until the page reloads; its wasm is
    // fetched again.)
    io.catch(() => {
      io = undefined;
    });
  }
  return io;
};

/**
 * The initialised io module. A fetch that fails (offline, a CORS refusal: a
 * TypeError; an HTTP error status: wasm-bindgen's "failed to fetch Wasm"
 * Error) rejects with a NetworkError (code "network", status 503, the
 * failure in `cause`). A module that arrived but does not compile or link
 * (a CompileError, e.g. a CSP without 'wasm-unsafe-eval'; a LinkError) or
 * does not parse (a SyntaxError) rejects as thrown.
 */
export async function ioLoad() {
  try {
    return await load();
  } catch (cause) {
    const W = globalThis.WebAssembly;
    if (cause instanceof SyntaxError || (W && (cause instanceof W.CompileError || cause instanceof W.LinkError))) {
      throw cause;
    }
    const e = new Error(
      `agentstore: the import/export module (io/agentstore_io.js) could not be loaded: ${cause.message}`,
      { cause },
    );
    e.name = 'NetworkError';
    e.code = 'network';
    e.status = 503;
    throw e;
  }
}

// The io connections of each store now open (by the store's token), and the
// tokens of stores closed since: close() closes their io connections too,
// including one whose open is still in flight.
const running = new Map();
const closed = new Set();

/** Closes the io connections of the store with `token` (its close()). */
export function ioClose(token) {
  closed.add(token);
  for (const s of running.get(token) ?? []) s.close();
}

/** Runs `method(a, b)` on a connection of module `m` to store `name`. */
export async function ioRun(m, token, name, indexes, timeoutMs, method, a, b) {
  const s = await m.AgentStore.__openForIo(name, indexes, timeoutMs);
  let open = running.get(token);
  if (!open) running.set(token, (open = new Set()));
  open.add(s);
  try {
    if (closed.has(token)) s.close();
    return await s[method](a, b);
  } finally {
    open.delete(s);
    if (!open.size) running.delete(token);
    s.close();
    s.free();
  }
}
