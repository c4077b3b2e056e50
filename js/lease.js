// The lease client's browser glue made in JS rather than from Rust
// closures: the Web Lock request and the release beacon. Only the full
// entry point (with the lease client) imports it; scripts/package.mjs
// inlines it into that glue, like js/promise.js.

/** Browsers run a timer longer than 2^31 - 1 ms at once: a longer wait is cut to that (24.8 days). */
const lockWaitTimer = (ms) => Math.min(Math.ceil(ms), 2147483647);

/**
 * Requests the exclusive Web Lock `name` (navigator.locks.request), waiting
 * at most `waitMs` (0 or less: only if free now; Infinity: until granted).
 * Returns `undefined` where Web Locks do not exist (or the request throws),
 * else `[granted, unlock]`: `granted` resolves with true once the lock is
 * held, false when it is busy, the wait ran out or the request failed; the
 * lock is held until `unlock()` is called (or the page goes away). A lock
 * granted in the instant the wait ran out (its callback not run yet, which
 * the abort cannot stop) is let go at once instead of held for the page's
 * life by a caller told "busy".
 * <https://developer.mozilla.org/docs/Web/API/LockManager/request>
 */
export function requestLock(name, waitMs) {
  let grant;
  let unlock;
  const granted = new Promise((resolve) => {
    grant = resolve;
  });
  const hold = new Promise((resolve) => {
    unlock = resolve;
  });
  let gaveUp = false;
  const controller = new AbortController();
  // A literal (fields defined, not assigned: an accessor without a setter
  // of that name on `Object.prototype` made an assignment throw, which
  // read as "no Web Locks").
  const options = waitMs <= 0 ? { ifAvailable: true } : Number.isFinite(waitMs) ? { signal: controller.signal } : {};
  let locks;
  try {
    locks = navigator.locks;
  } catch (e) {
    return undefined;
  }
  if (!locks) return undefined;
  // Armed before the request is issued: once it is, nothing below may throw
  // (Rust would read "no Web Locks", and a lock granted later would be held
  // for the page's life).
  let timer;
  if (waitMs > 0 && Number.isFinite(waitMs)) {
    timer = setTimeout(() => {
      gaveUp = true;
      // Aborting a granted request does nothing; a pending one rejects.
      controller.abort();
      grant(false);
    }, lockWaitTimer(waitMs));
  }
  let p;
  try {
    p = locks.request(name, options, (lock) => {
      // Granted (or refused at once): the wait's timer is not needed now.
      clearTimeout(timer);
      const held = lock != null && !gaveUp;
      grant(held);
      return held ? hold : undefined;
    });
  } catch (e) {
    // Not issued.
    return undefined;
  }
  try {
    if (p && typeof p.catch === 'function') p.catch(() => grant(false));
  } catch (e) {
    // A polyfill's odd Promise: the wait armed above still ends the request.
  }
  return [granted, unlock];
}

/**
 * The names of the Web Locks held now in this origin, from
 * `navigator.locks.query()`; `undefined` where that does not exist or fails.
 * <https://developer.mozilla.org/docs/Web/API/LockManager/query>
 */
export async function heldLocks() {
  try {
    return (await navigator.locks.query()).held.map((l) => l.name);
  } catch (e) {
    return undefined;
  }
}

/**
 * Sends `body` (text/plain, so no CORS preflight) to `url` with
 * navigator.sendBeacon, falling back to `fetch(url, {method: "POST",
 * keepalive: true})` (whose outcome nobody waits for).
 * <https://developer.mozilla.org/docs/Web/API/Navigator/sendBeacon>
 */
export function beacon(url, body) {
  try {
    if (navigator.sendBeacon(url, body) === true) return;
  } catch (e) {
    // No sendBeacon (a worker): fetch below.
  }
  try {
    fetch(url, { method: 'POST', body, keepalive: true }).catch(() => {});
  } catch (e) {
    // Nothing more to try while the page goes away.
  }
}

/**
 * Marks the Promise `p` handled: its rejection, if no one reads it, is not
 * reported as unhandled; whoever awaits `p` still gets it.
 */
export function markHandled(p) {
  p.catch(() => {});
}

/** A pending Promise and the function that resolves it: `[promise, resolve]`. */
export function deferred() {
  let resolve;
  const promise = new Promise((r) => {
    resolve = r;
  });
  return [promise, resolve];
}

/**
 * A Promise resolved after `ms` milliseconds (`setTimeout` of this global
 * scope: window or worker) and the function that ends the wait at once
 * (clears the timer and resolves the Promise): `[promise, end]`.
 * src/lease/http.rs `sleep_ms` calls `end` when its future is dropped, so no
 * timer outlives its wait and no Promise stays pending.
 */
export function timer(ms) {
  let end;
  const promise = new Promise((resolve) => {
    const id = setTimeout(resolve, ms);
    end = () => {
      clearTimeout(id);
      resolve();
    };
  });
  return [promise, end];
}

/**
 * `signal.reason` once `signal` has aborted, else `undefined`; what a
 * redefined `aborted` or `reason` getter throws is the reason (as
 * src/options.rs `abort_reason` reads it).
 */
function abortReason(signal) {
  try {
    if (!signal.aborted) return undefined;
  } catch (e) {
    return e;
  }
  try {
    return signal.reason;
  } catch (e) {
    return e;
  }
}

/**
 * Aborts `controller` (with the signal's reason) when `signal` aborts.
 * Returns the function that stops following it. (A signal whose listener
 * methods throw is not followed.)
 */
export function followSignal(signal, controller) {
  const follow = () => controller.abort(abortReason(signal));
  try {
    signal.addEventListener('abort', follow);
  } catch (e) {
    // Not followed.
  }
  return () => {
    try {
      signal.removeEventListener('abort', follow);
    } catch (e) {
      // Nothing was added.
    }
  };
}

/**
 * The `href` of a `URL` object, read through `URL.prototype`'s getter (so
 * an own `href` or `toString` of the object never runs), else `undefined`.
 */
export function urlHref(v) {
  try {
    return Object.getOwnPropertyDescriptor(URL.prototype, 'href').get.call(v);
  } catch {
    return undefined;
  }
}

/**
 * A signal aborted when `a` or `b` aborts: one of them when it already
 * has, else `AbortSignal.any([a, b])`, else (no `any`, or a replaced one
 * that throws or answers a non-signal) a controller's signal following
 * both. Throws what a signal's `addEventListener` throws there.
 */
export function followBoth(a, b) {
  for (const s of [a, b]) {
    try {
      if (s.aborted) return s;
    } catch (e) {
      return s;
    }
  }
  try {
    const any = AbortSignal.any([a, b]);
    if (any instanceof AbortSignal) return any;
  } catch (e) {
    // The listeners below do the same job.
  }
  const c = new AbortController();
  for (const s of [a, b]) s.addEventListener('abort', () => c.abort(abortReason(s)), { once: true });
  return c.signal;
}

/**
 * `headers.get(name)` when it is a string of at most 256 UTF-16 units, else
 * null: whatever a page's own `fetch` wrapper answered with as `headers`,
 * nothing throws and no long string reaches the module.
 */
export function header(headers, name) {
  try {
    const v = headers.get(name);
    return typeof v === 'string' && v.length <= 256 ? v : null;
  } catch (e) {
    return null;
  }
}

let requestsSent = 0;
/** This realm's sender id for `Request-Attempt` (about 100 random bits). */
const sender = 's' + Math.random().toString(36).slice(2, 12) + Math.random().toString(36).slice(2, 12);

/**
 * Sets a claim's, enrollment's or refresh's `Request-Attempt` on `headers`:
 * `<sender>.<n>`, this realm's sender id and a number raised with every
 * such request it sends, so that of two copies of one request (the same
 * `Idempotency-Key`, or the same single-use token) the later one carries
 * the higher number. The server then refuses (409) a copy that arrives
 * after a later one by its sender was answered (held up in the network
 * while the request was sent again), instead of answering it as a replay:
 * rotating the lease token, or revoking the credentials, that the later
 * copy handed out. A reloaded page is another sender: its copy of a saved
 * token is a replay, as without the header. Also sets the claim's
 * `Idempotency-Key` to `key` unless it is empty. Throws nothing.
 */
export function numberRequest(headers, key) {
  try {
    if (key) headers.set('Idempotency-Key', key);
    headers.set('Request-Attempt', sender + '.' + ++requestsSent);
  } catch (e) {}
}

/**
 * The `Idempotency-Key` for the next claim of `queue` by the client whose
 * unanswered claims `kept` holds: the key of one of them (its answer lost:
 * the server may hold its lease, and answers the same key with it again;
 * marked as reused in `kept.r`), else a new one of about 100 random bits
 * (`Math.random()`: keys need only differ among one worker's claims of one
 * queue).
 */
export function claimKey(kept, queue) {
  const key = keysOf(kept, queue).shift();
  if (key === undefined) return Math.random().toString(36).slice(2) + Math.random().toString(36).slice(2);
  (kept.r ??= new Set()).add(key);
  return key;
}

/**
 * Settles `key`, whose claim of `queue` was answered (or not), and unmarks
 * it as reused: `how` 1 keeps it for the queue's next claim (the newest 64
 * per queue), 2 keeps it only if it was reused (a `204`: an earlier copy of
 * it may still be held up in the network), 0 spends it.
 */
export function keepClaimKey(kept, queue, key, how) {
  const reused = kept.r?.delete(key);
  if (how === 1 || (how === 2 && reused)) {
    const keys = keysOf(kept, queue);
    if (keys.push(key) > 64) keys.shift();
  }
}

function keysOf(kept, queue) {
  const byQueue = (kept.m ??= new Map());
  let keys = byQueue.get(queue);
  if (!keys) byQueue.set(queue, (keys = []));
  return keys;
}

// A lone surrogate (one half of a UTF-16 pair). IndexedDB stores one, but
// JSON text for another program cannot carry it (RFC 8259 §8.2), and
// serde_json, the lease server's parser, refuses its escape.
const LONE = /\p{Cs}/u;

/**
 * The path (keys and indexes, outermost first) to the first string or key
 * holding a lone surrogate in `v`, a settle result as the record walk
 * copied it (plain data, at most 64 levels), else `undefined`.
 */
export function loneSurrogateAt(v) {
  if (typeof v === 'string') return LONE.test(v) ? [] : undefined;
  if (v === null || typeof v !== 'object') return undefined;
  // The path is built only on the way back from a hit: nothing is
  // allocated per element of a result that holds none.
  const arr = Array.isArray(v);
  const keys = arr ? v : Object.keys(v);
  for (let i = 0; i < keys.length; i++) {
    const k = arr ? i : keys[i];
    if (!arr && LONE.test(k)) return [k];
    const found = loneSurrogateAt(v[k]);
    if (found) {
      found.unshift(k);
      return found;
    }
  }
  return undefined;
}
