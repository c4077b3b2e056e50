// Promises made in JS rather than from Rust: IndexedDB request and
// transaction outcomes, timers, adoption of a caller's value. Each then
// costs JS arrow functions instead of a Rust closure per callback (each a
// wasm allocation, a JS wrapper and a call back into the module) and an
// executor call into the module; the wasm is smaller by the closures' code.
// Inlined into the glue by scripts/package.mjs, like js/walk.js.

/**
 * A Promise settled by `request`'s `success` (resolves with its `result`)
 * or `error` event (rejects with its `error`, a DOMException). An `error`
 * left unhandled aborts the request's transaction, as IndexedDB specifies.
 */
export function requestPromise(request) {
  return new Promise((resolve, reject) => {
    request.onsuccess = () => resolve(request.result);
    request.onerror = () => reject(request.error);
  });
}

/**
 * A Promise settled by `tx`'s `complete` (resolves) or `abort` event
 * (rejects; the cause is on `tx.error`).
 */
export function transactionPromise(tx) {
  return new Promise((resolve, reject) => {
    tx.oncomplete = () => resolve();
    tx.onabort = () => reject();
  });
}

/**
 * A Promise resolved with `value` after `ms` milliseconds (this global
 * scope's `setTimeout`, window or worker, which passes its extra argument to
 * the callback per the HTML timers spec).
 */
export function timerPromise(ms, value) {
  return new Promise((resolve) => setTimeout(resolve, ms, value));
}

/**
 * `v` adopted by a new Promise (`new Promise((r) => r(v))`): `resolve(v)`
 * reads `v.then` at once (a getter that throws there rejects the new
 * Promise) and calls it in a later job (what it throws rejects it too), so
 * nothing of `v` throws to the caller.
 */
export function adopt(v) {
  return new Promise((resolve) => resolve(v));
}
