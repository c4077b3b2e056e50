// agentstore: loads the import/export module on first use and runs one call
// there. Shipped as pkg/io-loader.js; both entry points ("agentstore" and
// "agentstore/store") reach it through a one-line wasm-bindgen snippet (see
// src/api.rs, "Import and export").
//
// pkg/io/ is the crate built with its `io` feature: the whole store API plus
// importPouchDump, importSnapshot and the exportSnapshot* bodies. A call
// opens its own connection to the store's database there, with the same
// index definitions, runs the method and closes the connection; IndexedDB
// orders that connection's transactions with the caller's as it orders
// another tab's.
let io;

const load = () => {
  if (!io) {
    // The glue finds its wasm beside itself (new URL(..., import.meta.url)).
    io = import('./io/agentstore.js').then(async (m) => {
      await m.default();
      return m;
    });
    // A failed load is not kept: the next call tries again. (A failed fetch
    // of io/agentstore.js itself stays failed in Firefox, whose module map
    // keeps it as HTML specifies, until the page reloads; its wasm is
    // fetched again.)
    io.catch(() => {
      io = undefined;
    });
  }
  return io;
};

/**
 * Runs `method(a, b)` of the io module's AgentStore on store `name`.
 * @param {string} name the database name
 * @param {{name: string, keys: string[]}[]} indexes the caller's index definitions
 * @param {string} method e.g. "importPouchDump"
 * @returns {Promise<unknown>} the method's answer; its errors unchanged; a
 *   NetworkError (code "network") when the module cannot be loaded.
 */
export async function ioCall(name, indexes, method, a, b) {
  let m;
  try {
    m = await load();
  } catch (cause) {
    const e = new Error(
      `agentstore: the import/export module (io/agentstore.js) could not be loaded: ${cause?.message ?? cause}`,
      { cause },
    );
    e.name = 'NetworkError';
    e.code = 'network';
    e.status = 0;
    throw e;
  }
  const s = await m.AgentStore.__openForIo(name, indexes);
  try {
    return await s[method](a, b);
  } finally {
    s.close();
    s.free();
  }
}
