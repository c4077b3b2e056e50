// Promises and event handlers made in JS rather than from Rust: IndexedDB
// request and transaction outcomes, timers, adoption of a caller's value,
// opening and deleting a database (schema upgrade, blocked timeout,
// `versionchange`) and `watch`'s BroadcastChannel listener. Each then costs
// JS arrow functions instead of a Rust closure per callback (each a wasm
// allocation, a JS wrapper and a call back into the module) and an executor
// call into the module; the wasm is smaller by the closures' code.
// Inlined into the glue by scripts/package.mjs, like js/walk.js.
//
// The object store names are those of src/store/db.rs (RECORDS, TOMBSTONES,
// META, DERIVED, BY_TYPE) and src/lease/journal.rs (STORE).

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
 * A read's answer, for the reads answered without the module's executor
 * (`get`, `getMany`, `count`, `list`): a Promise resolved with
 * `request.result` (`null` for `undefined`, a key with no record), or
 * rejected with `toError(e)`, `e` being the request's DOMException or,
 * when the request only failed because its transaction aborted
 * (AbortError), the transaction's own `error` (the cause), as
 * src/store/db.rs's `request_error` names it. `toError` is the module's one conversion to a
 * typed agentstore Error (for the JS methods); without it the exception is
 * rejected as it is (for Rust callers, which type it themselves).
 */
export function answer(request, toError) {
  return new Promise((resolve, reject) => {
    request.onsuccess = () => resolve(request.result ?? null);
    request.onerror = () => reject(typed(toError, failure(request)));
  });
}

/** `e` as the module's typed Error (`toError` given), else as it is. */
const typed = (toError, e) => (toError ? toError(e) : e);

/**
 * Makes `value` the own, enumerable, writable data property `key` of `o`,
 * as an object literal would (the module's `set` for every object it
 * builds: errors, `{id, rev}` answers, change messages, fetch options,
 * index definitions). Never through `[[Set]]`: an accessor without a
 * setter, or a read-only property, of that name on `Object.prototype` (a
 * page's polyfill or pollution) swallowed such a write, and the object
 * went out without the field. The descriptor has no prototype, so an
 * inherited `get`, `set` or `value` cannot change it. `Reflect`'s form
 * answers `false` instead of throwing (a non-extensible object, which the
 * module never passes).
 */
export function own(o, key, value) {
  Reflect.defineProperty(o, key, { __proto__: null, value, writable: true, enumerable: true, configurable: true });
}

/** What a failed request failed of: its error, or its aborted transaction's. */
function failure(request) {
  const e = request.error;
  return (e && e.name === 'AbortError' && request.transaction && request.transaction.error) || e;
}

/**
 * Up to `max` rows of the cursor `request` opened (a value cursor's values,
 * a key cursor's keys), walked in JS; rejects as `answer` does.
 */
export function cursorRows(request, max, toError) {
  const rows = [];
  return new Promise((resolve, reject) => {
    request.onsuccess = () => {
      const c = request.result;
      if (c && rows.length < max) rows.push('value' in c ? c.value : c.key);
      if (!c || rows.length >= max) resolve(rows);
      else c.continue();
    };
    request.onerror = () => reject(typed(toError, failure(request)));
  });
}

/**
 * One listing page `{records, next}` from the rows a read answered (it asks
 * for `limit + 1`): `records` the first `limit`, `next` the cursor after
 * the last of them (`cursorOf(row)`, the module's encoding) when there were
 * more, else `null`.
 */
export function listPage(rows, limit, cursorOf) {
  return rows.then((all) =>
    all.length > limit
      ? { records: all.slice(0, limit), next: cursorOf(all[limit - 1]) }
      : { records: all, next: null },
  );
}

/**
 * One `listBy` page `{records, next}`, read in the transaction of
 * `stateRequest` (the `get` of the shared index state, in a read-only
 * transaction over META, DERIVED and RECORDS). The entry keys of index
 * `tag` in `range` (an IDBKeyRange), at most `limit + 1`, descending when
 * asked, come from the DERIVED store when the state lists `tag` as active;
 * otherwise (the index is being built) from every record, by
 * `entryKeys(records, tag, paths)` (the module's entry keys of the index
 * over key paths `paths`), kept when in `range` and sorted by
 * `indexedDB.cmp`. The page's records are then read by each entry's last
 * component (the id); `next` is `cursorOf(key)` of the page's last entry
 * when there were more, else `null`. Rejects as `answer` does.
 */
export function byPage(stateRequest, tag, paths, range, descending, limit, entryKeys, cursorOf, toError) {
  const tx = stateRequest.transaction;
  const fetch = limit + 1;
  // A request that throws as it is made (the transaction no longer active)
  // is typed as a failed one is.
  const guard = (f) => (v) => {
    try {
      return f(v);
    } catch (e) {
      throw typed(toError, e);
    }
  };
  const keys = answer(stateRequest, toError).then(guard((state) => {
    const active = state !== null && typeof state === 'object' ? state.active : undefined;
    // As the module reads the state: an array of strings only (a hole or
    // another value makes the whole list unreadable, nothing active).
    if (Array.isArray(active) && Array.from(active).every((t) => typeof t === 'string') && active.includes(tag)) {
      const derived = tx.objectStore('derived');
      return descending
        ? cursorRows(derived.openKeyCursor(range, 'prev'), fetch, toError)
        : answer(derived.getAllKeys(range, fetch), toError);
    }
    return answer(tx.objectStore('records').getAll(), toError).then((rows) => {
      const sign = descending ? -1 : 1;
      return entryKeys(rows, tag, paths)
        .filter((k) => range.includes(k))
        .sort((a, b) => sign * indexedDB.cmp(a, b))
        .slice(0, fetch);
    });
  }));
  return listPage(keys, limit, cursorOf).then(guard((page) => {
    if (page.records.length === 0) return page;
    const records = tx.objectStore('records');
    const gets = page.records.map((k) => records.get(k[k.length - 1]));
    return answers(gets, toError).then((found) => ({
      records: found.filter((r) => r !== null),
      next: page.next,
    }));
  }));
}

/**
 * The results of `requests` (one transaction's, in order: IndexedDB fires
 * their `success` events in the order they were placed, so the last one's
 * is the end of all), `null` for `undefined`; rejects as `answer` does.
 */
export function answers(requests, toError) {
  return answer(requests[requests.length - 1], toError).then(() =>
    requests.map((r) => r.result ?? null),
  );
}

/**
 * A Promise settled by `tx`'s `complete` (resolves) or `abort` event
 * (rejects; the cause is on `tx.error`). The transaction commits by itself
 * once its last request has succeeded (auto-commit): it is not asked to
 * commit early with `tx.commit()`, because Firefox then commits the
 * requests that succeeded even when a later one fails (a ConstraintError of
 * an `add`), where Chromium aborts (BENCHMARKS.md, thirty-first round).
 */
export function transactionPromise(tx) {
  return new Promise((resolve, reject) => {
    tx.oncomplete = () => resolve();
    tx.onabort = () => reject();
  });
}

/**
 * Watches `tx`, a readwrite transaction just created (Rust src/store/db.rs
 * `Db::tx`, every one the module creates): if it aborts for quota,
 * `afterQuota` runs, whatever else handles its end (a commit waited for,
 * or none: an error that dropped it before its commit was asked for).
 */
export function quotaWatch(tx) {
  tx.addEventListener('abort', () => afterQuota(tx));
}

/**
 * After `tx` aborted for quota: Firefox makes the first readwrite
 * transaction its connection creates next a "cleanup" one, whose `put`
 * and `add` throw InvalidStateError (only deletes pass, to free space).
 * Every agentstore write puts (a delete writes a tombstone), so that
 * transaction is made here, empty, before anything else can be: the
 * connection's next write is a normal one (CASES C-E2: the store keeps
 * working for small writes after a quota error).
 */
function afterQuota(tx) {
  if (tx.error?.name === 'QuotaExceededError') {
    try {
      tx.db.transaction(tx.objectStoreNames[0], 'readwrite');
    } catch {
      // The connection closed meanwhile.
    }
  }
}

/**
 * Marks a database as watched (Rust src/store/index.rs
 * `Store::mark_watched`) in `tx`, a readwrite transaction over `meta`: when
 * the index state carries `watched: false`, stores it with `watched: true`
 * and bumps the generation, as the Rust `write_state` does for every state
 * change, so every connection reads the state again at its next write.
 * Resolves once `tx` committed; rejects with `toError(tx.error)` when it
 * aborted, or `toError(e)` when a `put` threw `e` (the transaction is
 * then aborted): never an uncaught exception in this handler.
 */
export function markWatched(tx, toError) {
  const meta = tx.objectStore('meta');
  const state = meta.get('indexes');
  const gen = meta.get('indexes-gen');
  let thrown;
  gen.onsuccess = () => {
    const s = state.result;
    if (s?.watched !== false) return;
    try {
      meta.put({ ...s, watched: true }, 'indexes');
      meta.put((+gen.result || 0) + 1, 'indexes-gen');
    } catch (e) {
      thrown = e;
      tx.abort();
    }
  };
  return transactionPromise(tx).catch(() => {
    throw toError(thrown ?? tx.error);
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

/**
 * How much longer (ms) than the blocked timeout an open or delete that never
 * received `blocked` may take before it counts as blocked: one queued behind
 * another connection's pending upgrade or delete never gets the event, yet
 * must not hang.
 */
const QUEUED_GRACE_MS = 3000;
/** Browsers run a timer longer than 2^31 - 1 ms at once. */
const MAX_TIMER_MS = 2147483647;

/**
 * `Promise.race` of an open or delete `request` and its blocked timeout:
 * resolves with the request's result, or with `timedOut` once the request
 * has been `blocked` for `ms`, or has had no answer for `ms` +
 * QUEUED_GRACE_MS since it was made. Until then, the time an open or delete
 * takes when nothing blocks it does not count (with `blockedTimeoutMs: 0`,
 * an open nothing blocks has 3 s); one slower than that is taken as queued
 * behind another connection, which no event tells apart.
 */
function raceBlocked(request, ms, timedOut) {
  const timers = [];
  return Promise.race([
    requestPromise(request),
    new Promise((resolve) => {
      request.onblocked = () => timers.push(setTimeout(resolve, ms, timedOut));
      timers.push(setTimeout(resolve, Math.min(ms + QUEUED_GRACE_MS, MAX_TIMER_MS), timedOut));
    }),
  ]).finally(() => timers.forEach(clearTimeout));
}

/**
 * Creates what `schema` needs and is missing, in `upgradeneeded`; returns a
 * string to refuse the upgrade. Schemas: 0 the record store; 1 the record
 * store of a second connection (the io module's), which must exist (a
 * database with no object store was deleted: refused); 2 the lease journal.
 */
function createSchema(db, schema) {
  const names = db.objectStoreNames;
  if (schema === 2) {
    if (!names.contains('leases')) db.createObjectStore('leases');
    return undefined;
  }
  if (schema === 1 && names.length === 0) return 'the store was deleted';
  // A database this release creates starts unwatched (Rust index.rs
  // `IndexState::quiet`): its writes post no change until a `watch()`.
  // One an earlier release made has no such mark, and keeps posting.
  const fresh = names.length === 0;
  if (!names.contains('records')) {
    db.createObjectStore('records', { keyPath: '_id' }).createIndex('byType', ['recordType', '_id']);
  }
  if (!names.contains('tombstones')) db.createObjectStore('tombstones', { keyPath: '_id' });
  if (!names.contains('meta')) {
    const meta = db.createObjectStore('meta');
    // `db`: this database's own number, posted with its changes (see
    // watchChannel): another database of the same name has another.
    if (fresh) meta.put({ watched: false, db: Math.random() }, 'indexes');
  }
  if (!names.contains('derived')) db.createObjectStore('derived');
  return undefined;
}

/** Transactions started so far, by database name (`txSeq`). */
const txSeqs = new Map();

/**
 * Adds `add` to the count of transactions started on database `name` by
 * every connection of this module instance and returns it (src/store/db.rs
 * `tx_seq`; read as a u32, wrapping). One count per name, exactly: a hash
 * into a few shared slots made two databases (a store and the lease
 * journal) share one, and a transaction on either stopped the other's
 * failed group being run again.
 */
export function txSeq(name, add) {
  const n = (txSeqs.get(name) | 0) + add;
  txSeqs.set(name, n);
  return n;
}

/**
 * Opens database `name` at `version` through `factory` (an IDBFactory),
 * creating what `schema` (see createSchema) needs.
 *
 * Resolves with the IDBDatabase, or with `null` when the open stayed blocked
 * for `blockedMs` (the request cannot be cancelled: if it runs later, its
 * upgrade is aborted and its connection closed at once, so it creates or
 * upgrades nothing and never blocks anyone in turn).
 * Rejects with a string when the upgrade refused (the database was
 * deleted), with a NotFoundError when the database exists at `version`
 * without the object stores `schema` needs (another library made it), else
 * with the request's DOMException (an upgrade that throws aborts:
 * AbortError; a VersionError names the database as another's). Throws
 * what `factory.open` throws.
 *
 * On `versionchange` (another tab upgrades or deletes the database) the
 * connection closes itself, sets its `onversionchange` back to null (how
 * the module tells a connection closed this way) and calls `onClose` (what
 * it throws is dropped).
 */
export function openDatabase(factory, name, version, blockedMs, schema, onClose) {
  const request = factory.open(name, version);
  let upgrading = false;
  let refused;
  request.onupgradeneeded = () => {
    upgrading = true;
    try {
      refused = createSchema(request.result, schema);
    } catch (e) {
      refused = undefined;
      request.transaction.abort();
      return;
    }
    if (refused !== undefined) request.transaction.abort();
  };
  const timedOut = {};
  return raceBlocked(request, blockedMs, timedOut)
    // A blocked timeout that fires during the upgrade does not count.
    .then((out) => (out === timedOut && upgrading ? requestPromise(request) : out))
    .then(
      (db) => {
        request.onblocked = null;
        if (db === timedOut) {
          // Given up: an upgrade that would run once the blocker closes is
          // aborted (a database this call would create, after a deletion
          // it queued behind, is not created; one at an older version
          // stays as it was), and a connection that opens is closed, so it
          // blocks nobody in turn.
          request.onupgradeneeded = () => request.transaction.abort();
          request.onsuccess = () => request.result.close();
          request.onerror = (e) => e.preventDefault();
          return null;
        }
        request.onupgradeneeded = null;
        // A database of this name that another library created at this
        // version (any `indexedDB.open(name)` makes one with no store)
        // opens without an upgrade: refused here, or every later call
        // would fail with a missing object store.
        const needed = schema === 2 ? ['leases'] : ['records', 'tombstones', 'meta', 'derived'];
        const missing = needed.filter((n) => !db.objectStoreNames.contains(n));
        if (missing.length) {
          db.close();
          throw new DOMException(
            `database "${name}" is not an agentstore database (it has no ${missing.join(', ')} store: another library made it); open another name, or destroy it first`,
            'NotFoundError',
          );
        }
        db.onversionchange = () => {
          db.onversionchange = null;
          db.close();
          try {
            if (onClose) onClose();
          } catch (e) {
            // The caller's callback: its error is its own.
          }
        };
        return db;
      },
      (e) => {
        if (refused !== undefined) throw refused;
        // Above this release's schema version: not a database it made.
        if (e && e.name === 'VersionError') {
          throw new DOMException(
            `${e.message} (database "${name}" was made by another library or by a newer release of agentstore)`,
            'VersionError',
          );
        }
        throw e;
      },
    );
}

/**
 * `promise` settled into `f(value, true)` when it resolves or `f(reason,
 * false)` when it rejects: what `f` returns (a value or a thenable to
 * adopt) or throws settles the result. `f` is called exactly once.
 */
export function settleWith(promise, f) {
  return promise.then(
    (v) => f(v, true),
    (e) => f(e, false),
  );
}

/**
 * Deletes database `name` through `factory`. Resolves with `true` when it
 * is gone, `false` when a connection that does not close on `versionchange`
 * kept the deletion blocked for `blockedMs` (the request stays queued and
 * completes once that connection closes); rejects with the request's
 * DOMException; throws what `factory.deleteDatabase` throws (an
 * InvalidStateError where IndexedDB refuses in this context, e.g. Firefox
 * before 115 in a private window: a TransactionError, Rust error.rs
 * `from_dom`).
 */
export function deleteDatabase(factory, name, blockedMs) {
  const request = factory.deleteDatabase(name);
  const timedOut = {};
  return raceBlocked(request, blockedMs, timedOut).then((out) => {
    request.onblocked = null;
    return out !== timedOut;
  });
}

/**
 * `destroy`'s answer (a read answered without the executor, as `answer`):
 * resolves with `undefined` once the database is gone, rejects with
 * `blocked` (the module's BlockedError, made for this call) when the
 * deletion stayed blocked for `blockedMs`, or with `toError(DOMException)`.
 */
export function deletion(factory, name, blockedMs, blocked, toError) {
  return deleteDatabase(factory, name, blockedMs).then(
    (gone) => {
      if (!gone) throw blocked;
    },
    (e) => {
      throw typed(toError, e);
    },
  );
}

/**
 * Listens on BroadcastChannel `name` (throws where there is none) and calls
 * `callback(change)` for every `{id, rev, deleted}` of a posted change
 * array whose string `id` starts with `prefix` (UTF-16 code units, as
 * `startsWith`); what the callback throws is dropped. Returns the
 * subscription's handle `{close(), ready, [Symbol.dispose]()}` (frozen;
 * `ready` is the Promise given, the database's watched mark): `close()`
 * stops it, also for the rest of a message being handled (a callback that
 * stops its own subscription gets no further change); a second `close()`
 * does nothing. The handle holds nothing the subscription needs: like an
 * event listener, the subscription lasts until `close()`, also when the
 * handle is garbage-collected (an open BroadcastChannel with a message
 * listener is kept alive: HTML, "Broadcasting to other browsing contexts").
 *
 * One id's changes are delivered in commit order: every context posts its
 * own after its commit, so a post from one tab or worker can arrive after a
 * later commit's post from another; a change whose order key (the message's
 * `p`, the purge count its transaction read, then the revision's generation,
 * then its hash: Rust `Rev`'s order) is not above the last delivered for
 * its id was superseded before it arrived, and is dropped. Kept for the
 * 10,000 ids heard last (a change of another build, without `p`, is
 * delivered as it comes). A change of another database of this name (the
 * message's `d`, the number `createSchema` gave the database: one made
 * after a `destroy`) is delivered and starts its id's order afresh,
 * whatever order its posts and the destroyed database's arrive in.
 */
export function watchChannel(name, prefix, callback, ready) {
  const channel = new BroadcastChannel(name);
  const last = new Map();
  const superseded = (id, p, d, rev) => {
    const dash = typeof rev === 'string' && typeof p === 'number' ? rev.indexOf('-') : -1;
    if (dash < 1) return false;
    const key = [p, +rev.slice(0, dash), rev.slice(dash + 1), d];
    const seen = last.get(id);
    if (seen && seen[3] === d && (seen[0] - key[0] || seen[1] - key[1] || (seen[2] > key[2]) - (seen[2] < key[2])) >= 0) return true;
    last.delete(id);
    last.set(id, key);
    if (last.size > 10000) last.delete(last.keys().next().value);
    return false;
  };
  let stopped = false;
  channel.onmessage = (event) => {
    const data = event.data;
    if (!Array.isArray(data)) return;
    for (const change of data) {
      if (stopped) return;
      const id = change !== null && typeof change === 'object' ? change.id : undefined;
      if (typeof id === 'string' && id.startsWith(prefix) && !superseded(id, data.p, data.d, change.rev)) {
        try {
          callback.call(null, change);
        } catch (e) {
          // The caller's callback: its error is its own.
        }
      }
    }
  };
  const close = () => {
    if (stopped) return;
    stopped = true;
    channel.onmessage = null;
    channel.close();
  };
  // `ready` is the caller's to await; a rejection nobody awaits is not an
  // unhandled one (the subscription itself keeps running).
  ready.catch(() => {});
  const handle = { close, ready };
  if (typeof Symbol.dispose === 'symbol') handle[Symbol.dispose] = close;
  return Object.freeze(handle);
}

/**
 * `Promise.race` of `promise` and `signal`'s `abort` event: settles as
 * `promise` does, or resolves with `marker` once `signal` aborts. The abort
 * listener is removed when the race settles. (A signal whose listener
 * methods throw races `promise` alone.)
 */
export function raceAbort(promise, signal, marker) {
  const [aborted, stop] = abortWatch(signal);
  const out = Promise.race([promise, aborted.then(() => marker)]);
  out.then(stop, stop);
  return out;
}

/**
 * `[aborted, stop]`: `aborted` a Promise resolved once `signal` fires
 * `abort` (never rejected), `stop()` removes the listener (call it when the
 * wait it bounds ended, so a long-lived signal does not collect one
 * listener per call) and resolves `aborted` too, so that nothing awaiting it
 * waits forever (a Rust JsFuture of it would keep its callbacks for good). A signal whose listener methods throw is never seen
 * to abort here.
 */
export function abortWatch(signal) {
  let listener;
  let settle;
  const aborted = new Promise((resolve) => {
    settle = resolve;
    listener = () => resolve();
    try {
      signal.addEventListener('abort', listener);
    } catch (e) {
      // Never seen to abort.
    }
  });
  const stop = () => {
    try {
      signal.removeEventListener('abort', listener);
    } catch (e) {
      // Nothing was added.
    }
    // Settled either way, once no one waits on it: a Rust JsFuture of a
    // Promise that never settles keeps its two callbacks (and their table
    // slots) in wasm memory for good (src/store/group.rs `until_started`
    // stops the watch after its wait; the wait no longer looks at it).
    settle();
  };
  return [aborted, stop];
}

// The signals calls in progress watch (`{n, listener}`: how many calls, and
// the `abort` listener), and those that fired `abort` while watched. Shared
// by every copy of this module in the global scope (each entry point's glue
// and the io module's inline one): a call the entry point watches runs its
// body in the io module.
const abortKey = Symbol.for('agentstore.abortWatch');
const aborts = globalThis[abortKey] || (globalThis[abortKey] = { calls: new WeakMap(), fired: new WeakSet() });

/**
 * Watches `signal` for a call, until `untrackAbort(signal)` (Rust
 * `options::track`, a guard held for the call): its `abort` event counts
 * from now on, whatever `signal.aborted` reads (a synthetic event; a getter
 * redefined), also at a look made after the event by a wait that was not
 * listening yet. One listener per signal while calls watch it, removed by
 * the last one (a listener left on an `AbortSignal.any()` signal would keep
 * it alive). A signal whose listener methods throw is never seen to fire.
 */
export function trackAbort(signal) {
  const watch = aborts.calls.get(signal);
  if (watch) {
    watch.n += 1;
    return;
  }
  const listener = () => aborts.fired.add(signal);
  aborts.calls.set(signal, { n: 1, listener });
  try {
    signal.addEventListener('abort', listener, { once: true });
  } catch (e) {
    // Never seen to fire.
  }
}

/** Ends one call's `trackAbort(signal)`. */
export function untrackAbort(signal) {
  const watch = aborts.calls.get(signal);
  if (!watch || --watch.n > 0) return;
  aborts.calls.delete(signal);
  try {
    signal.removeEventListener('abort', watch.listener);
  } catch (e) {
    // Nothing was added.
  }
}

/** Whether `signal` fired `abort` while a call watched it. */
export function abortFired(signal) {
  return aborts.fired.has(signal);
}

/** Tombstones `purgeOlder` reads at a time. */
const PURGE_BATCH = 1000;

/**
 * `purgeTombstones`, in the readwrite transaction of `store` (the tombstone
 * store; the transaction also holds `meta`): deletes every tombstone whose
 * `deletedAt` (ms) is at most `cutoff`, or is not a number (written by an
 * earlier release: older than any bound), or every one when `olderThanMs`
 * is 0 (also those dated ahead of this clock). Reads PURGE_BATCH
 * tombstones at a time in `_id` order, each batch's read issued from the
 * last one's answer (so the transaction stays active and memory stays
 * bounded however many there are; one `getAll` of the whole store held
 * them all at once). When any was deleted, counts the purge in the shared
 * index state as Rust src/store/index.rs `write_state` would (its
 * `purges`, read as `IndexState::from_js` reads it, plus one, and the next
 * generation): a record created afresh after a purge takes the count into
 * its first revision, so it never gets back a revision the purged history
 * issued.
 *
 * After each batch, `onProgress(done, total)` (when given) is called:
 * tombstones looked at, of those stored when the scan began; then `signal`
 * (when given) is looked at. A throw there, or an abort, aborts the
 * transaction (nothing is purged) and rejects with what was thrown, or
 * with `toError` itself for the abort (a value no callback can throw, as
 * it can throw `undefined`). A thenable `onProgress` returns is not
 * waited for there (the transaction cannot wait for a foreign Promise):
 * once the transaction has committed, resolves with how many were purged
 * after every one fulfilled, or rejects with the first rejection. An
 * abort after the last batch's look (also one while those thenables are
 * awaited, a synthetic `abort` event with `signal.aborted` still false
 * too) only ends that wait: the purge committed, and resolves with its
 * count (AbortError always means nothing was purged). Each thenable is
 * handled as soon as it is returned, so its rejection is never an
 * unhandledrejection. Rejects with `toError(e)` (the module's typed
 * Error) for a failed read or request, or the transaction's abort
 * (`tx.error`: quota).
 */
export function purgeOlder(store, olderThanMs, cutoff, onProgress, signal, toError) {
  const tx = store.transaction;
  const total = onProgress && store.count();
  const returned = [];
  let purged = 0;
  let done = 0;
  // Watched by the call (Rust `options::track`): an `abort` event
  // (`signal.aborted` still false) is seen after any batch and at the
  // commit, whenever it fired.
  const over = () => {
    try {
      return !!signal && (aborts.fired.has(signal) || signal.aborted);
    } catch (e) {
      // A getter that throws: aborted.
      return true;
    }
  };
  return new Promise((resolve, reject) => {
    const fail = (e) => {
      reject(e);
      try {
        tx.abort();
      } catch (x) {
        // Ended already.
      }
    };
    // The module has no handler on this transaction (it left it to this).
    tx.onabort = () => reject(toError(tx.error));
    // Committed: an abort now (or one whose event fired already, or a
    // signal whose `aborted` getter throws) only ends the wait for
    // onProgress's Promises, and the call resolves with its count, as a
    // complete import or rebuild does: AbortError always means nothing was
    // purged.
    // (Without a signal, raceAbort races nothing.)
    tx.oncomplete = () =>
      resolve(returned.length && !over() ? raceAbort(Promise.all(returned), signal, toError).then(() => purged) : purged);
    const batch = (range) => {
      const read = store.getAll(range, PURGE_BATCH);
      read.onerror = () => fail(toError(read.error));
      read.onsuccess = () => {
        try {
          const rows = read.result;
          for (const t of rows) {
            const at = t.deletedAt;
            if (olderThanMs === 0 || typeof at !== 'number' || at <= cutoff) {
              store.delete(t._id);
              purged += 1;
            }
          }
          done += rows.length;
          try {
            const r = onProgress && rows.length && onProgress(done, total.result);
            if (r?.then) {
              // Handled now (the transaction may still fail, and Promise.all
              // only looks once it committed): never an unhandledrejection.
              const p = Promise.resolve(r);
              p.catch(() => {});
              returned.push(p);
            }
            if (signal && (aborts.fired.has(signal) || signal.aborted)) return fail(toError);
          } catch (e) {
            return fail(e);
          }
          if (rows.length === PURGE_BATCH) return batch(IDBKeyRange.lowerBound(rows[rows.length - 1]._id, true));
          if (purged) {
            const meta = tx.objectStore('meta');
            const state = meta.get('indexes');
            const gen = meta.get('indexes-gen');
            const num = (v) => (typeof v === 'number' ? v : 0);
            gen.onsuccess = () => {
              try {
                const s = state.result;
                const o = s !== null && typeof s === 'object' ? s : {};
                meta.put({ ...o, purges: num(o.purges) + 1 }, 'indexes');
                meta.put(num(gen.result) + 1, 'indexes-gen');
              } catch (e) {
                fail(toError(e));
              }
            };
          }
        } catch (e) {
          fail(toError(e));
        }
      };
    };
    batch(undefined);
  });
}

/**
 * Whether `v` is a `name` (a class of this global scope with internal
 * slots: Blob, Response, ReadableStream, AbortSignal) of any realm: this
 * page's, an iframe's, another same-origin window's. `instanceof` follows
 * the prototype chain, and every realm has prototypes of its own, so it
 * refuses another realm's objects; the getter `key` of this realm's
 * `name.prototype` checks the object's internal slots instead (a brand
 * check, the same in every realm) and throws for anything else: a plain
 * object, one that only claims the prototype (`Object.create(Blob.prototype)`)
 * or a Proxy of a real one.
 */
export function isA(v, name, key) {
  try {
    Object.getOwnPropertyDescriptor(globalThis[name].prototype, key).get.call(v);
    return true;
  } catch (e) {
    return false;
  }
}

/**
 * Whether `v` is a string of at most `max` characters, all ASCII (what a
 * `listBy` cursor is): checked before the string is copied into wasm
 * memory, where a non-ASCII string would take up to 3 bytes per unit.
 */
export function isAsciiUpTo(v, max) {
  return typeof v === 'string' && v.length <= max && /^[\x00-\x7f]*$/.test(v);
}

/**
 * The first own enumerable string key of `options` that is not a word of
 * `known` (space-separated) and holds a value (`null` and `undefined` mean
 * "not given" in every option), or `undefined` when there is none or
 * `options` is not an object. An unknown key whose getter (or Proxy
 * `get` trap) throws counts as holding a value, so the error names it.
 * `null` when listing the keys throws (a Proxy's `ownKeys` trap): never a
 * throw through the binding (see `callInto1` below).
 */
export function unknownOption(options, known) {
  if (options !== null && typeof options === "object") {
    const words = known.split(" ");
    let keys;
    try {
      keys = Object.keys(options);
    } catch {
      return null;
    }
    return keys.find((k) => {
      if (!words.includes(k)) try { return options[k] != null; } catch { return 1; }
    });
  }
}

// Calls into a function of the page (a callback, `fetch`) that may throw.
// Not a `catch` import returning the value (js-sys `Function::call1`):
// with reference types, wasm-bindgen's shim stores the import's return
// value in the externref table before the Rust side sees the exception,
// and the generated `take_last_exception()?` returns early without
// dropping it, so every throw left one slot (holding `undefined`) for good:
// the table and the module's free list doubled without bound (one slot and
// about 8 bytes of wasm heap per throwing `mutate` function, `onChunk`,
// `onProgress`, `work()` handler; helper-230). `callInto1`/`callInto2` are
// `catch` imports returning nothing; the value is taken at once with
// `takeCalled` (a nested call made by `f` has taken its own before `f`
// returns, so one variable serves).
let called;
export function callInto1(f, thisArg, a) {
  called = f.call(thisArg, a);
}
export function callInto2(f, thisArg, a, b) {
  called = f.call(thisArg, a, b);
}
export function callInto0(f, thisArg) {
  called = f.call(thisArg);
}
// The same for what may run the page's code or refuse its arguments: a
// getter or Proxy trap (`Reflect.get`), `new Request(input, init)`.
export function getInto(o, k) {
  called = Reflect.get(o, k);
}
export function requestInto(input, init) {
  called = new Request(input, init);
}
export function takeCalled() {
  const v = called;
  called = undefined;
  return v;
}
