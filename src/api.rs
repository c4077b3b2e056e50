//! The JavaScript API (`#[wasm_bindgen]` exports). Thin: parse options, call
//! [`crate::store::Store`], turn results into plain JS objects and errors
//! into JS `Error`s. Every method returns a Promise and never panics.

use crate::error::{set, StoreError};
use crate::options::{issue, known, opt_bool, opt_fn, opt_num, opt_signal, read, string_arg};
use crate::store::db::{Db, Schema};
#[cfg(feature = "io")]
use crate::store::index::verification_js;
use crate::store::{
    ByQuery, ImportOptions, ListQuery, Store, Watcher, Written, DEFAULT_BATCH, LIST_KEYS,
    MAX_IMPORT_BATCH,
};
use agentstore_protocol::index::IndexDef;
use js_sys::{Array, Function, Object, Promise};
use std::rc::Rc;
use wasm_bindgen::prelude::*;

#[wasm_bindgen(typescript_custom_section)]
const TS_TYPES: &str = r#"
/** The fields the store reads of a record: what an app's own record type (`interface Agent { _id: string; name: string }`) must have for `put`, `putMany`, `get<Agent>` and `getMany<Agent>` (the type parameter, as PouchDB's `db.get<T>()`; given, or inferred from where the result goes; not checked at runtime: a read gives what is stored). A page of `list` is `ListPage` (of AgentRecord); `ListPage<Agent>` names the same page for a cast through `unknown`. */
export interface RecordInput {
  _id: string;
  /** `"<generation>-<hex>"`; give it back to update (compare-and-swap). `undefined` = absent (create). */
  _rev?: string | undefined;
  recordType?: string | undefined;
  /** ISO-8601 UTC with milliseconds; set to now when absent (or `undefined`). */
  updatedAt?: string | undefined;
  /** PouchDB's bookkeeping fields are not record fields: a write giving one (any field starting with `_` but `_id` and `_rev`) is a ValidationError. Delete with `delete(id, rev)`, not `_deleted: true`. */
  _deleted?: undefined; _attachments?: undefined; _conflicts?: undefined; _revisions?: undefined;
  _revs_info?: undefined; _deleted_conflicts?: undefined; _local_seq?: undefined;
}
/** A stored record: a JSON object with a string `_id` and a store-assigned `_rev` (the record methods' type when none is given). */
export interface AgentRecord extends RecordInput {
  [field: string]: unknown;
}
/** A record as a read gives it back (`get`, `getMany`, `list`, `listBy`, `ConflictError.current`, a `mutate` function's `current`): the app's type with the `_rev` every stored record has, so `store.delete(r._id, r._rev)` needs no `!` (as PouchDB types `_rev` on what `get` answers), and the `updatedAt` the store sets on every write (absent only on a record imported without one). */
export type Stored<T extends RecordInput = AgentRecord> = T & { _rev: string; updatedAt?: string };
export interface OpenOptions {
  /** Reject with BlockedError when another tab blocks the open this long (ms, 0..=2147483647), or when the open has no answer this long + 3000 ms after it was made (one queued behind another tab's upgrade gets no `blocked` event; a very slow open counts too). Default 5000. */
  blockedTimeoutMs?: number | null | undefined;
  /** Called after another tab's upgrade closed this connection. */
  onVersionChange?: (() => void) | null | undefined;
  /** Derived indexes, e.g. [{name: "byType", keys: ["recordType", "updatedAt"]}]. */
  indexes?: readonly IndexDefinition[] | null | undefined;
}
export interface PutResult { id: string; rev: string; }
export interface ListOptions {
  /** Exact prefix on `_id` (UTF-16 code-unit order, as IndexedDB compares). */
  prefix?: string | null | undefined;
  /** Only records whose `recordType` equals this. */
  type?: string | null | undefined;
  /** Page size, 1..=10000; default 100. */
  limit?: number | null | undefined;
  /** The `next` cursor of the previous page (`null`, as the last page's `next` is: from the start). */
  after?: string | null | undefined;
  descending?: boolean | null | undefined;
}
export interface ListPage<T extends RecordInput = AgentRecord> { records: Stored<T>[]; next: string | null; }
export interface MutateOptions {
  /** Extra attempts after a conflict (an integer in 0..=1000); default 8. */
  retries?: number | null | undefined;
  /** Rejects with AbortError (`cause`: the signal's reason) before an attempt, while the attempt waits for its transaction, while `fn` runs, or during the backoff sleep; nothing is written (an attempt whose write was already issued keeps its outcome). */
  signal?: AbortSignal | null | undefined;
}
/** What a `mutate` function returns: the new record. Its `_id` may be left out (it is the id mutated); another `_id` is a ValidationError. */
export interface MutateResult {
  _id?: string | undefined;
  _rev?: string | undefined;
  recordType?: string | undefined;
  updatedAt?: string | undefined;
  /** Refused as in `RecordInput` (a ValidationError). */
  _deleted?: undefined; _attachments?: undefined; _conflicts?: undefined; _revisions?: undefined;
  _revs_info?: undefined; _deleted_conflicts?: undefined; _local_seq?: undefined;
  [field: string]: unknown;
}
/** What `importPouchDump` / `importSnapshot` read: NDJSON text as a string, or streamed from a Blob (File), Response or ReadableStream of bytes. */
export type ImportSource = string | Blob | Response | ReadableStream<Uint8Array>;
export interface ImportOptions {
  /** Called with (done, total) ids after each committed batch; a returned Promise is awaited before the next batch, and its rejection is taken as a throw. */
  onProgress?: ((done: number, total: number) => unknown) | null | undefined;
  /** Stops the import with AbortError (`cause`: the signal's reason) between batches, while the source is read, and while the io module loads; committed batches stay. Once every record is written an abort only ends the wait for the last `onProgress` Promise: the import resolves. */
  signal?: AbortSignal | null | undefined;
  /** Records per transaction, 1..=10000; default 1000. */
  batchSize?: number | null | undefined;
}
/** `importPouchDump`'s options: `ImportOptions` and the legacy index document to audit. */
export interface PouchImportOptions extends ImportOptions {
  /** Id of a legacy index document to audit (default "agent-index"); `importSnapshot` refuses it. */
  legacyIndexId?: string | null | undefined;
}
export interface ExportOptions {
  /** Stored objects read per request (and per `exportSnapshotChunks` chunk), 1..=10000; default 1000. */
  batchSize?: number | null | undefined;
  /** Called with (done, total) records and tombstones after each batch read (after its chunk went to `onChunk`); takes its turn with the chunks: a returned Promise is awaited before the next chunk or call (the reads go on meanwhile), and the export resolves after it; a throw or rejection before the last call (done === total) rejects the export with it. No call for an empty store. */
  onProgress?: ((done: number, total: number) => unknown) | null | undefined;
  /** Stops the export with AbortError (`cause`: the signal's reason) before each read and each chunk or progress call, while one's Promise is awaited, and while the io module loads: no chunk follows the abort and the read transaction is dropped. Once every row is read and every chunk collected or handed to `onChunk` (its Promise settled), an abort only stops the progress calls left and ends the wait for a pending one: the export resolves. */
  signal?: AbortSignal | null | undefined;
}
export interface VerifyOptions {
  /** Called with (done, total) records read, after each 1000; a returned Promise is awaited before the next call and the result (the reads go on meanwhile: one read-only transaction cannot wait); a throw or rejection before the last call (done === total) rejects with it. No call for an empty store. */
  onProgress?: ((done: number, total: number) => unknown) | null | undefined;
  /** Stops the verification with AbortError (`cause`: the signal's reason) before each read and each progress call, while one's Promise is awaited, and while the io module loads. Once every read is done, an abort only stops the progress calls left and ends the wait for a pending one: the verification resolves. */
  signal?: AbortSignal | null | undefined;
}
export interface DropIndexOptions {
  /** AbortError (`cause`: the signal's reason; nothing dropped) when aborted before the drop's one transaction starts (also while the io module loads); once it has started the drop completes. */
  signal?: AbortSignal | null | undefined;
}
export interface PouchImportSummary {
  documentsRead: number; live: number; tombstones: number; localSkipped: number;
  conflictsResolved: number; lastSeq: number | null; written: number; keptNewer: number;
  /** The legacy index document's drift: live records it lost, deleted/absent ids it still listed. */
  legacyIndex: { id: string; listed: number; lost: number; stale: number } | null;
}
export interface WatchOptions {
  /** Only changes whose `_id` starts with this (default: every change). */
  prefix?: string | null | undefined;
}
/** One committed change, delivered to `watch` callbacks in every tab and worker of the origin. */
export interface WatchChange { id: string; rev: string; deleted: boolean; }
/**
 * A `watch()` subscription's handle. `close()` stops the subscription (a
 * second call does nothing); `[Symbol.dispose]` is the same, for `using`.
 * Like an event listener, the subscription lasts until closed: dropping the
 * handle does not stop it.
 */
export interface Watch {
  close(): void;
  [Symbol.dispose](): void;
  /**
   * Resolves once the database is marked as watched: from then on every
   * write committed in any tab or worker is announced. Writes to a database
   * that was never watched post no change message (each post costs a write
   * in Chromium about a tenth of its time), so another context's write that
   * commits before `ready` may go unheard; this store's own calls made after
   * `watch()` returned are always heard. Rejects (QuotaExceededError,
   * TransactionError) when the mark could not be written.
   */
  readonly ready: Promise<void>;
}
export interface SnapshotImportSummary { written: number; keptNewer: number; }
export interface IndexDefinition { name: string; keys: readonly string[]; }
export interface CountOptions {
  /** Exact prefix on `_id` (UTF-16 code-unit order). */
  prefix?: string | null | undefined;
  /** Only records whose `recordType` equals this. */
  type?: string | null | undefined;
}
/** One `deleteMany` position: the id and the live revision it deletes (compare-and-swap). */
export interface DeleteItem { id: string; rev: string; }
export interface DestroyOptions {
  /** Reject with BlockedError when a connection that ignores `versionchange` still blocks after this long (ms, 0..=2147483647). Default 5000. */
  blockedTimeoutMs?: number | null | undefined;
}
export interface PurgeOptions {
  /** Remove tombstones written more than this long ago (ms, an integer in [0, 2^53 - 1]; 0 = every tombstone). Required. */
  olderThanMs: number;
  /** Called with (done, total) tombstones looked at, of those stored when the purge began, after each 1000, inside the purge's one transaction: a throw aborts the purge (nothing purged) and rejects with it. A returned Promise cannot hold the transaction: it is awaited after the commit, before the call resolves, and its rejection rejects the call (the purge stays committed). */
  onProgress?: ((done: number, total: number) => unknown) | null | undefined;
  /** Looked at before the purge and after each batch of 1000: aborted there, the purge's one transaction is aborted (nothing purged) and the call rejects with AbortError (`cause`: the signal's reason). Once the last batch is read the purge commits; an abort after that only ends the wait for `onProgress`'s Promises, and the call resolves with the count: AbortError means nothing was purged. An `abort` event counts as the abort even where `signal.aborted` reads false. */
  signal?: AbortSignal | null | undefined;
}
export interface ListByOptions {
  /** Leading components equal these values exactly (one value or an array). */
  eq?: string | number | readonly (string | number)[] | null | undefined;
  /** The first component is a string starting with this. */
  prefix?: string | null | undefined;
  /** Bounds of the first component (numbers sort before strings); a `lower` above `upper` is a ValidationError. */
  range?: {
    lower?: string | number | null | undefined; upper?: string | number | null | undefined;
    lowerOpen?: boolean | null | undefined; upperOpen?: boolean | null | undefined;
  } | null | undefined;
  /** Page size, 1..=10000; default 100. */
  limit?: number | null | undefined;
  /** The `next` cursor of the previous page (`null`, as the last page's `next` is: from the start). */
  after?: string | null | undefined;
  descending?: boolean | null | undefined;
}
export interface IndexVerification { checked: number; missing: string[]; orphaned: string[]; stale: string[]; building: string[]; }
export interface RebuildOptions {
  /** Records per transaction, 1..=10000; default 500. */
  batchSize?: number | null | undefined;
  /** Called with (done, total) records after each committed batch; a returned Promise is awaited before the next batch; a throw or rejection before the last batch rejects the call with that error (committed batches stay). */
  onProgress?: ((done: number, total: number) => unknown) | null | undefined;
  /** Stops the rebuild with AbortError (`cause`: the signal's reason) between batches and while the io module loads; committed batches stay (`restart: false` resumes). After the last batch an abort only ends the wait for the last `onProgress` Promise: the rebuild resolves. */
  signal?: AbortSignal | null | undefined;
  /** false = resume an interrupted rebuild from its checkpoint (default true = start over). */
  restart?: boolean | null | undefined;
}
/** Every `code` an agentstore error (store or lease client) can carry. */
export type ErrorCode =
  | "conflict" | "validation" | "not_found" | "quota_exceeded" | "transaction" | "blocked" | "closed" | "aborted"
  | "claim_lost" | "state_conflict" | "already_settled" | "unauthorized" | "forbidden" | "rate_limited"
  | "payload_too_large" | "bad_request" | "method_not_allowed" | "network" | "internal";
/** The `name` of each error, one per code. */
export type ErrorName =
  | "ConflictError" | "ValidationError" | "NotFoundError" | "QuotaExceededError" | "TransactionError"
  | "BlockedError" | "ClosedError" | "AbortError" | "ClaimLostError" | "StateConflictError"
  | "AlreadySettledError" | "UnauthorizedError" | "ForbiddenError" | "RateLimitedError"
  | "PayloadTooLargeError" | "BadRequestError" | "MethodNotAllowedError" | "NetworkError" | "InternalError";
/** One failing position of a `putMany` / `deleteMany` batch; `code` is what `put` / `delete` of that position alone would reject with ("not_found": a deletion with nothing live to delete). */
export interface BatchFailure { index: number; id: unknown; message: string; code: "validation" | "conflict" | "not_found"; expectedRev?: string | null; currentRev?: string | null; }
/** `ConflictError` (409): the compare-and-swap failed; nothing was written. */
export interface ConflictError extends Error {
  name: "ConflictError"; code: "conflict"; status: 409;
  id?: string; expectedRev?: string | null; currentRev?: string | null; current?: Stored | null;
  /** From `mutate`: attempts made before giving up. */
  attempts?: number;
  /** From `putMany` / `deleteMany`: every failing position. */
  failures?: BatchFailure[];
}
/** Errors thrown by agentstore: `name` is e.g. "ConflictError", `code` e.g. "conflict". */
export interface AgentStoreError extends Error {
  name:
    | "ConflictError" | "ValidationError" | "NotFoundError" | "QuotaExceededError" | "TransactionError"
    | "BlockedError" | "ClosedError" | "AbortError" | "NetworkError";
  /** "network": an import or export could not fetch the import/export module. */
  code: "conflict" | "validation" | "not_found" | "quota_exceeded" | "transaction" | "blocked" | "closed" | "aborted" | "network";
  status: number;
  id?: string; expectedRev?: string | null; currentRev?: string | null; current?: Stored | null;
  attempts?: number;
  failures?: BatchFailure[];
  /** AbortError: the signal's reason. */
  cause?: unknown;
}
"#;

/// An agent-record store over one IndexedDB database.
///
/// Open with `await AgentStore.open(name, options)`. Every method but
/// `close()`, `watch()` and `setIoModule()` returns a Promise, and fails by
/// rejecting it (also after `free()`), never by throwing; errors are
/// `Error`s with `name`, `code` and `status`.
#[wasm_bindgen]
pub struct AgentStore {
    inner: Rc<Store>,
    /// Names this store to the io loader, which closes the store's io
    /// connections when it is closed (unique per store, never reused).
    #[cfg(not(feature = "io"))]
    io_token: u32,
}

/// Runs `f` as a Promise rejecting with the error's JS `Error`.
fn run<F>(f: F) -> Promise
where
    F: std::future::Future<Output = Result<JsValue, StoreError>> + 'static,
{
    crate::options::run(f)
}

fn parse_index_defs(v: &JsValue) -> Result<Vec<IndexDef>, StoreError> {
    if v.is_undefined() || v.is_null() {
        return Ok(Vec::new());
    }
    let bad =
        || StoreError::validation("indexes must be an array of {name: string, keys: string[]}");
    if !crate::value::is_array(v)? {
        return Err(bad());
    }
    use agentstore_protocol::index::{MAX_INDEXES, MAX_INDEX_KEYS};
    let mut defs = Vec::new();
    for d in crate::value::items(v.unchecked_ref(), MAX_INDEXES, "at most 16 indexes")? {
        // A key a definition does not take (Dexie's `unique`, `multiEntry`)
        // is refused: ignored, it would promise what no index does.
        known(&d, "name keys").map_err(StoreError::validation)?;
        let name = crate::value::get(&d, &"name".into())
            .ok()
            .and_then(|n| crate::value::exact_string(&n));
        let keys = crate::value::get(&d, &"keys".into()).unwrap_or_default();
        if !crate::value::is_array(&keys)? {
            return Err(bad());
        }
        let mut names = Vec::new();
        for k in crate::value::items(
            keys.unchecked_ref(),
            MAX_INDEX_KEYS,
            "an index needs 1..=8 keys",
        )? {
            names.push(crate::value::exact_string(&k).ok_or_else(bad)?);
        }
        defs.push(IndexDef {
            name: name.ok_or_else(bad)?,
            keys: names,
        });
    }
    Ok(defs)
}

/// `mutate`'s function and options: `retries` (default 8) and `signal`.
///
/// # Errors
/// ValidationError for a non-function or a bad option.
fn mutate_args(
    f: JsValue,
    options: &JsValue,
) -> Result<(Function, u32, Option<web_sys::AbortSignal>), StoreError> {
    let f: Function = f
        .dyn_into()
        .map_err(|_| StoreError::validation("mutate(id, fn): fn must be a function"))?;
    known(options, "retries signal")?;
    let retries =
        opt_num(options, "retries", 0, 1000, "an integer in [0, 1000]")?.map_or(8, |n| n as u32);
    Ok((f, retries, opt_signal(options)?))
}

/// `purgeTombstones`' options: `olderThanMs`, an integer number of ms, as
/// every ms option is (never coerced), up to 2^53 - 1 (past which an f64 no
/// longer counts each ms); `onProgress` and `signal`.
///
/// # Errors
/// ValidationError otherwise.
fn purge_options(options: &JsValue) -> Result<Purge, StoreError> {
    known(options, "olderThanMs onProgress signal")?;
    let age = read(options, "olderThanMs")?
        .as_f64()
        .filter(|n| (0.0..=9_007_199_254_740_991.0).contains(n) && n.fract() == 0.0)
        .ok_or_else(|| {
            StoreError::validation(
                "purgeTombstones({olderThanMs}): olderThanMs must be an integer number of ms in [0, 2^53 - 1]",
            )
        })?;
    Ok((age, opt_fn(options, "onProgress")?, opt_signal(options)?))
}

/// `purgeTombstones`' `(olderThanMs, onProgress, signal)`.
type Purge = (f64, Option<Function>, Option<web_sys::AbortSignal>);

/// The database name (a non-empty string) and `options.blockedTimeoutMs`
/// (default 5000 ms) of `open` / `destroy`.
fn name_and_timeout(
    name: &JsValue,
    options: &JsValue,
    keys: &'static str,
) -> Result<(String, u32), StoreError> {
    let name = string_arg(name, "the store name").map_err(StoreError::Thrown)?;
    if name.is_empty() {
        return Err(StoreError::validation(
            "the store name must be a non-empty string",
        ));
    }
    if !options.is_undefined() && !options.is_null() && !options.is_object() {
        return Err(StoreError::validation("options must be an object"));
    }
    known(options, keys)?;
    // Browsers run a timer longer than 2^31 - 1 ms (HTML's timer limit,
    // ~24.8 days) at once, so the open would fail at once.
    let timeout = opt_num(
        options,
        "blockedTimeoutMs",
        0,
        2_147_483_647,
        "an integer number of ms in [0, 2147483647]",
    )
    .map_err(StoreError::validation)?
    .map_or(5000, |ms| ms as u32);
    Ok((name, timeout))
}

fn written_js(w: &Written) -> JsValue {
    let o = Object::new();
    set(&o, "id", &w.id);
    set(&o, "rev", &w.rev.as_str().into());
    o.into()
}

/// The arguments of one of the write methods, which share one exported
/// async body ([`AgentStore::write`]): one state machine in the module
/// instead of one per method (−1.6 kB gzip in the store module).
enum Write {
    /// `put(record)`.
    Put(JsValue),
    /// `delete(id, rev)`.
    Delete(JsValue, JsValue),
    /// `putMany(records)`.
    PutMany(JsValue),
    /// `deleteMany(items)`.
    DeleteMany(JsValue),
    /// `mutate(id, fn, options)`.
    Mutate(JsValue, JsValue, JsValue),
    /// `purgeTombstones(options)`.
    Purge(JsValue),
}

impl AgentStore {
    /// Runs one write method: its input is checked during the call (the
    /// first poll, within [`crate::options::nested`]), then the write runs
    /// in a group commit (`put`, `delete`, `mutate`) or one transaction of
    /// its own. Resolves to `{id, rev}` (`put`; `mutate`, or `null`), the
    /// tombstone's revision (`delete`), arrays of those (`putMany`,
    /// `deleteMany`), or how many tombstones were purged.
    fn write(&self, call: Write) -> Promise {
        let s = self.inner.clone();
        run(async move {
            // `Ok`: one record (group commit); `Err`: a batch.
            let (plan, deleted) = match call {
                Write::Put(r) => (Ok(Store::put_job(&r)?), false),
                Write::Delete(id, rev) => (Ok(Store::delete_job(&id, &rev)?), true),
                Write::PutMany(r) => (Err(Store::put_ops(&r)?), false),
                Write::DeleteMany(items) => (Err(Store::delete_ops(&items)?), true),
                Write::Mutate(id, f, options) => {
                    let (f, retries, signal) = mutate_args(f, &options)?;
                    let _watch = crate::options::track(signal.as_ref());
                    return Ok(match s.mutate(&id, &f, retries, signal.as_ref()).await? {
                        Some(w) => written_js(&w),
                        None => JsValue::NULL,
                    });
                }
                Write::Purge(options) => {
                    let (age, cb, signal) = purge_options(&options)?;
                    let _watch = crate::options::track(signal.as_ref());
                    return Ok(s
                        .purge_tombstones(age, cb.as_ref(), signal.as_ref())
                        .await?
                        .into());
                }
            };
            let ops = match plan {
                Ok(job) => {
                    let w = s.write_one(job, None).await?.written()?;
                    return Ok(if deleted {
                        w.rev.into()
                    } else {
                        written_js(&w)
                    });
                }
                Err(ops) => ops,
            };
            let revs = s.write_ops(&ops).await?;
            let out = Array::new();
            for (op, rev) in ops.iter().zip(revs) {
                out.push(&if deleted {
                    rev.into()
                } else {
                    written_js(&Written {
                        id: op.id().clone(),
                        rev,
                    })
                });
            }
            Ok(out.into())
        })
    }

    /// Wraps a store opened from Rust (tests, embedding crates).
    pub fn from_store(store: Store) -> AgentStore {
        Self::wrap(Rc::new(store))
    }

    fn wrap(inner: Rc<Store>) -> AgentStore {
        #[cfg(not(feature = "io"))]
        static NEXT_TOKEN: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);
        AgentStore {
            inner,
            #[cfg(not(feature = "io"))]
            io_token: NEXT_TOKEN.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        }
    }
}

#[wasm_bindgen]
impl AgentStore {
    /// Opens (creating if needed) the store `name`.
    ///
    /// # Errors
    /// BlockedError after `blockedTimeoutMs` (default 5000 ms) when another
    /// tab keeps the upgrade blocked, or when the open has no answer
    /// `blockedTimeoutMs` + 3000 ms after it was made; ValidationError for
    /// bad options.
    #[wasm_bindgen(unchecked_return_type = "Promise<AgentStore>")]
    pub fn open(
        #[wasm_bindgen(unchecked_param_type = "string")] name: JsValue,
        #[wasm_bindgen(unchecked_optional_param_type = "OpenOptions | null")] options: JsValue,
    ) -> Promise {
        issue(|_| {
            let (name, timeout) =
                name_and_timeout(&name, &options, "blockedTimeoutMs onVersionChange indexes")?;
            let on_vc = opt_fn(&options, "onVersionChange")?;
            let indexes = parse_index_defs(&read(&options, "indexes")?)?;
            agentstore_protocol::index::check_defs(&indexes).map_err(StoreError::validation)?;
            let opening = Db::start_open(
                &name,
                crate::store::db::SCHEMA_VERSION,
                timeout,
                Schema::Records,
                on_vc.as_ref(),
            )?;
            // Entered again once the open settles (always, exactly once).
            let opened = Closure::once_into_js(move |out: JsValue, ok: bool| {
                let db = Db::opened(if ok { Ok(out) } else { Err(out) }, &name, timeout)
                    .map_err(|e| e.to_js())?;
                let store = Rc::new(Store::with_db(db, &name, timeout, indexes));
                let agent = AgentStore::wrap(store.clone());
                if store.indexes().is_empty() {
                    return Ok::<JsValue, JsValue>(agent.into());
                }
                Ok(run(async move {
                    // Built in the background when needed; listBy answers
                    // from the records meanwhile.
                    if !store.prepare_indexes().await? {
                        agent.rebuild_in_background();
                    }
                    Ok(agent.into())
                })
                .into())
            });
            Ok(settle_with(&opening, &opened))
        })
    }

    /// Deletes the database `name` (every record, tombstone and index).
    /// Open connections to it in other tabs and workers are closed first
    /// through `versionchange`: their `onVersionChange` runs and their later
    /// calls reject with ClosedError. Resolves to `undefined`.
    ///
    /// # Errors
    /// BlockedError after `blockedTimeoutMs` (default 5000 ms) when a
    /// connection that is not agentstore's keeps the deletion blocked (it
    /// stays queued in IndexedDB and completes once that connection closes);
    /// ValidationError for a bad name or option.
    #[wasm_bindgen(unchecked_return_type = "Promise<void>")]
    pub fn destroy(
        #[wasm_bindgen(unchecked_param_type = "string")] name: JsValue,
        #[wasm_bindgen(unchecked_optional_param_type = "DestroyOptions | null")] options: JsValue,
    ) -> Promise {
        issue(|to_error| {
            let (name, timeout) = name_and_timeout(&name, &options, "blockedTimeoutMs")?;
            crate::store::destroy_promise(&name, timeout, to_error)
        })
    }

    /// Closes the connection; later calls reject with ClosedError. An import
    /// or export in progress stops as it would on this connection: its
    /// connection (the io module's) is closed too. A second call, or one
    /// after `free()` (or a `using` block's end), does nothing.
    pub fn close(&self) {
        self.inner.close();
        #[cfg(not(feature = "io"))]
        io_close(self.io_token);
    }

    /// The record stored under `id`, or `null` (never stored, or deleted).
    #[wasm_bindgen(unchecked_return_type = "Promise<Stored | null>")]
    pub fn get(&self, #[wasm_bindgen(unchecked_param_type = "string")] id: JsValue) -> Promise {
        issue(|to_error| self.inner.get_promise(&id, to_error))
    }

    /// The records stored under `ids`, in the order of `ids`: a record, or
    /// `null` for an id never stored or deleted. One read-only transaction.
    ///
    /// # Errors
    /// ValidationError for a non-array, an array whose elements cannot be
    /// read, or more than 100,000 ids; for non-id elements, with `failures`
    /// naming every bad position.
    #[wasm_bindgen(js_name = getMany, unchecked_return_type = "Promise<(Stored | null)[]>")]
    pub fn get_many(
        &self,
        #[wasm_bindgen(unchecked_param_type = "readonly string[]")] ids: JsValue,
    ) -> Promise {
        issue(|to_error| self.inner.get_many_promise(&ids, to_error))
    }

    /// How many live records match `{prefix, type}` (both optional),
    /// counted by IndexedDB on the key range without loading any record (by
    /// type through the native `["recordType", "_id"]` index).
    ///
    /// # Errors
    /// ValidationError for a non-string prefix or type.
    #[wasm_bindgen(unchecked_return_type = "Promise<number>")]
    pub fn count(
        &self,
        #[wasm_bindgen(unchecked_optional_param_type = "CountOptions | null")] options: JsValue,
    ) -> Promise {
        issue(|to_error| {
            // Listing options mean nothing to a count: refused, not ignored
            // (`count({prefix, after})` would count the whole prefix).
            let q = ListQuery::from_js(&options, "prefix type")?;
            self.inner
                .count_promise(&q.prefix, q.record_type.as_ref(), to_error)
        })
    }

    /// Deletes every `{id, rev}` with compare-and-swap in one transaction,
    /// all or none, leaving tombstones; resolves to their revisions in input
    /// order. `watch` announces each delete.
    ///
    /// # Errors
    /// ValidationError listing every malformed position or repeated id;
    /// else, `failures` listing every position whose `rev` is stale (`code`
    /// "conflict") or that has nothing live to delete (`code` "not_found",
    /// `currentRev: null`, what `delete` rejects with): NotFoundError (404)
    /// when every failing position is not_found, as `delete` of each would
    /// be, else ConflictError (409). Nothing is written on any error.
    #[wasm_bindgen(js_name = deleteMany, unchecked_return_type = "Promise<string[]>")]
    pub fn delete_many(
        &self,
        #[wasm_bindgen(unchecked_param_type = "readonly DeleteItem[]")] items: JsValue,
    ) -> Promise {
        self.write(Write::DeleteMany(items))
    }

    /// Removes tombstones written more than `olderThanMs` ago; resolves to
    /// how many were removed. Afterwards a writer holding a revision of a
    /// purged id gets ConflictError from `put` and NotFoundError from
    /// `delete` (nothing stored has that revision), so a stale writer still
    /// never overwrites a newer record; a `put` without `_rev` creates the
    /// id anew at generation 1.
    ///
    /// The purge is one readwrite transaction reading 1,000 tombstones at a
    /// time, all or nothing: after each batch `onProgress(done, total)`
    /// (tombstones looked at, of those stored when it began) runs inside
    /// it, then `signal` is looked at; a throw there or an abort aborts the
    /// transaction (nothing is purged). A Promise `onProgress` returns is
    /// awaited after the commit, before the call resolves (the transaction
    /// cannot wait for it); its rejection rejects the call, the purge
    /// staying committed.
    ///
    /// # Errors
    /// ValidationError unless `olderThanMs` is an integer number of ms in
    /// [0, 2^53 − 1], `onProgress` a function and `signal` an AbortSignal
    /// (when given); AbortError (`cause`: the signal's reason); what
    /// `onProgress` threw or rejected with; TransactionError /
    /// QuotaExceededError / ClosedError.
    #[wasm_bindgen(js_name = purgeTombstones, unchecked_return_type = "Promise<number>")]
    pub fn purge_tombstones(
        &self,
        #[wasm_bindgen(unchecked_param_type = "PurgeOptions")] options: JsValue,
    ) -> Promise {
        self.write(Write::Purge(options))
    }

    /// Creates (no `_rev`) or updates with compare-and-swap (with `_rev`).
    /// Resolves to `{id, rev}`; rejects with ConflictError (409) carrying
    /// `id`, `expectedRev`, `currentRev` and `current`.
    #[wasm_bindgen(unchecked_return_type = "Promise<PutResult>")]
    pub fn put(
        &self,
        #[wasm_bindgen(unchecked_param_type = "AgentRecord")] record: JsValue,
    ) -> Promise {
        self.write(Write::Put(record))
    }

    /// Deletes with compare-and-swap, leaving a tombstone; resolves to its revision.
    #[wasm_bindgen(unchecked_return_type = "Promise<string>")]
    pub fn delete(
        &self,
        #[wasm_bindgen(unchecked_param_type = "string")] id: JsValue,
        #[wasm_bindgen(unchecked_param_type = "string")] rev: JsValue,
    ) -> Promise {
        self.write(Write::Delete(id, rev))
    }

    /// Read → `fn(current | null)` (may be async) → compare-and-swap write,
    /// retried on conflict with full-jitter backoff. Resolves to `{id, rev}`,
    /// or `null` when `fn` returned `undefined`.
    #[wasm_bindgen(unchecked_return_type = "Promise<PutResult | null>")]
    pub fn mutate(
        &self,
        #[wasm_bindgen(unchecked_param_type = "string")] id: JsValue,
        #[wasm_bindgen(
            unchecked_param_type = "(current: Stored | null) => MutateResult | undefined | PromiseLike<MutateResult | undefined>"
        )]
        f: JsValue,
        #[wasm_bindgen(unchecked_optional_param_type = "MutateOptions | null")] options: JsValue,
    ) -> Promise {
        self.write(Write::Mutate(id, f, options))
    }

    /// Writes all records in one transaction or none; resolves to `[{id, rev}]`.
    /// Rejects with ValidationError or ConflictError whose `failures` lists
    /// every failing position.
    #[wasm_bindgen(js_name = putMany, unchecked_return_type = "Promise<PutResult[]>")]
    pub fn put_many(
        &self,
        #[wasm_bindgen(unchecked_param_type = "readonly AgentRecord[]")] records: JsValue,
    ) -> Promise {
        self.write(Write::PutMany(records))
    }

    /// One page of live records: `{records, next}`; pass `next` as `after`.
    #[wasm_bindgen(unchecked_return_type = "Promise<ListPage>")]
    pub fn list(
        &self,
        #[wasm_bindgen(unchecked_optional_param_type = "ListOptions | null")] options: JsValue,
    ) -> Promise {
        issue(|to_error| {
            self.inner
                .list_promise(&ListQuery::from_js(&options, LIST_KEYS)?, to_error)
        })
    }

    /// One page of records in the order of derived index `name`:
    /// `{records, next}`. `eq` matches whole components (never as a prefix).
    #[wasm_bindgen(js_name = listBy, unchecked_return_type = "Promise<ListPage>")]
    pub fn list_by(
        &self,
        #[wasm_bindgen(unchecked_param_type = "string")] name: JsValue,
        #[wasm_bindgen(unchecked_optional_param_type = "ListByOptions | null")] options: JsValue,
    ) -> Promise {
        issue(|to_error| {
            let name = string_arg(&name, "the index name").map_err(StoreError::Thrown)?;
            let q = ByQuery::from_js(&options)?;
            self.inner.list_by_promise(&name, &q, to_error)
        })
    }

    /// Calls `callback({id, rev, deleted})` for every change committed in any
    /// tab whose id starts with `prefix`; returns a handle (`Watch`) whose
    /// `close()` (or `[Symbol.dispose]()`, so `using` works) stops it. Like
    /// an event listener, the subscription lasts until `close()`: a handle
    /// the page drops (garbage-collected) does not stop it.
    ///
    /// # Errors
    /// ValidationError for a non-string prefix or a non-function callback;
    /// ClosedError after `close()` or a `versionchange`; TransactionError
    /// where `BroadcastChannel` does not exist.
    #[wasm_bindgen(unchecked_return_type = "Watch")]
    pub fn watch(
        &self,
        #[wasm_bindgen(unchecked_param_type = "WatchOptions | null | undefined")] options: JsValue,
        #[wasm_bindgen(unchecked_param_type = "(change: WatchChange) => void")] callback: JsValue,
    ) -> Result<JsValue, JsValue> {
        crate::options::nested(|| self.watch_with(options, callback))?
    }
}

impl AgentStore {
    /// [`AgentStore::watch`] within one level of nesting.
    fn watch_with(&self, options: JsValue, callback: JsValue) -> Result<JsValue, JsValue> {
        self.inner.check_open().map_err(|e| e.to_js())?;
        crate::options::check_object(&options, "watch options")
            .map_err(|m| StoreError::validation(m).to_js())?;
        known(&options, "prefix").map_err(|m| StoreError::validation(m).to_js())?;
        let prefix = match read(&options, "prefix").map_err(|e| e.to_js())? {
            v if v.is_undefined() || v.is_null() => js_sys::JsString::from(""),
            v => v
                .dyn_into()
                .map_err(|_| StoreError::validation("prefix must be a string").to_js())?,
        };
        let callback: Function = callback.dyn_into().map_err(|_| {
            StoreError::validation("watch(options, callback): callback must be a function").to_js()
        })?;
        if !self.inner.can_post() {
            return Err(StoreError::Transaction(
                "watch() needs BroadcastChannel, which this context does not have".into(),
            )
            .to_js());
        }
        let inner = Watcher::new(&self.inner, prefix, callback)?;
        Ok(inner.handle().clone())
    }
}

// Import and export (cargo feature `io`, on by default). The shipped entry
// points are built without it: their methods below check the arguments here,
// then load the `io` build of this crate (`pkg/io/`: the same store API plus
// these bodies) on first use through js/io-loader.js, open a second
// connection to the same (existing) database there, with this store's index
// definitions and blockedTimeoutMs, run the call and close it. IndexedDB
// orders that connection's transactions with this one's as it orders another
// tab's, and `watch` subscribers hear its writes through the same
// BroadcastChannel. An app that never imports or exports downloads none of
// it. scripts/package.mjs inlines the loader into each entry's glue (a
// snippet file would be two more module requests before `init` can start).

#[wasm_bindgen(module = "/js/promise.js")]
extern "C" {
    /// `promise` settled into `f(value, true)` or `f(reason, false)`
    /// (js/promise.js `settleWith`).
    #[wasm_bindgen(js_name = settleWith)]
    fn settle_with(promise: &Promise, f: &JsValue) -> Promise;
}

#[cfg(not(feature = "io"))]
#[wasm_bindgen(module = "/js/io-loader.js")]
extern "C" {
    #[wasm_bindgen(js_name = ioUse)]
    fn io_use(source: &JsValue);
    #[wasm_bindgen(js_name = ioLoad)]
    fn io_load() -> Promise;
    #[wasm_bindgen(js_name = ioRun)]
    #[allow(clippy::too_many_arguments)]
    fn io_run(
        module: &JsValue,
        token: u32,
        name: &str,
        indexes: JsValue,
        blocked_timeout_ms: u32,
        schema: u32,
        method: &str,
        a: &JsValue,
        b: &JsValue,
    ) -> Promise;
    #[wasm_bindgen(js_name = ioClose)]
    fn io_close(token: u32);
}

#[cfg(not(feature = "io"))]
impl AgentStore {
    /// Runs `method(a, b)` of the io module on a second connection to this
    /// store, once `check(a, b)` (the arguments' checks, made first so that
    /// bad input is refused without a download; in the call's first poll,
    /// so as one level of [`crate::options::nested`] calls) is `Ok` with the
    /// call's `signal`, if it has one.
    ///
    /// Rejects with AbortError when `signal` has aborted (before the
    /// download) or aborts (also while the module loads, which a slow network can make long), ClosedError when this
    /// store is closed (looked at before and after the load), NetworkError
    /// when the module cannot be fetched, and with the io method's own
    /// errors unchanged.
    fn io(
        &self,
        method: &'static str,
        a: JsValue,
        b: JsValue,
        check: fn(&Store, &JsValue, &JsValue) -> Result<Option<web_sys::AbortSignal>, StoreError>,
    ) -> Promise {
        let s = self.inner.clone();
        let token = self.io_token;
        run(async move {
            let signal = check(&s, &a, &b)?;
            let _watch = crate::options::track(signal.as_ref());
            // An aborted signal is refused before the download, also on a
            // closed store (docs/api.md, "Arguments are checked first").
            crate::store::check_abort(signal.as_ref())?;
            s.check_open()?;
            let module = crate::store::race_abort(io_load(), signal.as_ref())
                .await?
                .map_err(StoreError::Thrown)?;
            s.check_open()?;
            let defs = Array::new();
            for d in s.indexes() {
                defs.push(&crate::store::index::def_js(d));
            }
            let p = io_run(
                &module,
                token,
                s.name(),
                defs.into(),
                s.blocked_timeout_ms(),
                crate::store::db::SCHEMA_VERSION,
                method,
                &a,
                &b,
            );
            wasm_bindgen_futures::JsFuture::from(p)
                .await
                .map_err(StoreError::Thrown)
        })
    }
}

/// The checks an import makes before it reads its source, in every build
/// (the entry points make them before they load the io module, which makes
/// them again): option names, `legacyIndexId` (PouchDB dumps), the other
/// options (the signal last), then the source's type, then the signal's
/// state.
/// Returns the options read (and, with `pouch`, `legacyIndexId`), so that
/// each option is read once.
fn import_checks(
    source: &JsValue,
    options: &JsValue,
    pouch: bool,
) -> Result<(ImportOptions, String), StoreError> {
    let keys = if pouch {
        "onProgress signal batchSize legacyIndexId"
    } else {
        "onProgress signal batchSize"
    };
    known(options, keys)?;
    // Before `steered` reads the signal (last): see `rebuild_options`.
    let legacy = if pouch {
        legacy_id(options)?
    } else {
        String::new()
    };
    let opts = steered_known(options)?;
    crate::store::lines::check_source(source)?;
    crate::store::check_abort(opts.signal.as_ref())?;
    Ok((opts, legacy))
}

#[cfg(not(feature = "io"))]
#[wasm_bindgen]
impl AgentStore {
    /// Where the import/export module comes from, for pages and workers that
    /// cannot load it from beside the package: a service worker (where
    /// `import()` is not allowed), a worker started from a blob URL, an app
    /// that hosts the files elsewhere. `source` is the module itself
    /// (`import * as io from "agentstore/io"`) or a function returning a
    /// Promise of it (`() => import("/static/agentstore_io.js")`). The module
    /// is initialised with its `default()` (its wasm beside it) unless the
    /// app already did. Call it before the first import or export; by
    /// default the package loads `io/agentstore_io.js` with `import()`.
    ///
    /// # Errors
    /// ValidationError (thrown) when `source` is neither an object nor a function.
    #[wasm_bindgen(js_name = setIoModule)]
    pub fn set_io_module(
        #[wasm_bindgen(unchecked_param_type = "object | (() => Promise<object>)")] source: JsValue,
    ) -> Result<(), JsValue> {
        if !source.is_object() && !source.is_function() {
            return Err(StoreError::validation(
                "setIoModule(source): source must be the io module or a function returning a Promise of it",
            )
            .to_js());
        }
        io_use(&source);
        Ok(())
    }

    /// Imports a PouchDB dump (pouchdb-replication-stream NDJSON) from a
    /// string, `Blob`, `Response` or `ReadableStream`, streamed in batches.
    ///
    /// The first import or export loads `io/agentstore_io.js` and its wasm
    /// (about 99 kB gzipped) from beside the package's entry point (see
    /// `setIoModule`); a load that fails for want of the network rejects
    /// with NetworkError (code "network") and the next call tries again.
    /// Arguments are checked before: bad ones are refused without a download.
    #[wasm_bindgen(js_name = importPouchDump, unchecked_return_type = "Promise<PouchImportSummary>")]
    pub fn import_pouch_dump(
        &self,
        #[wasm_bindgen(unchecked_param_type = "ImportSource")] source: JsValue,
        #[wasm_bindgen(unchecked_optional_param_type = "PouchImportOptions | null")]
        options: JsValue,
    ) -> Promise {
        self.io("importPouchDump", source, options, |_, s, o| {
            import_checks(s, o, true).map(|(o, _)| o.signal)
        })
    }

    /// Every record and tombstone as NDJSON (header line first), as a string
    /// assembled in JavaScript. Loads the io module as `importPouchDump` does
    /// (options are checked before: an aborted `signal` is an AbortError
    /// without a download). Options (`ExportOptions`): `batchSize`,
    /// `onProgress(done, total)` (objects exported of the records and
    /// tombstones stored), `signal`.
    ///
    /// # Errors
    /// ValidationError for a bad option; AbortError (`cause`: the signal's
    /// reason); ClosedError; NetworkError when the io module cannot load;
    /// what `onProgress` throws or rejects with before its last call.
    #[wasm_bindgen(js_name = exportSnapshot, unchecked_return_type = "Promise<string>")]
    pub fn export_snapshot(
        &self,
        #[wasm_bindgen(unchecked_optional_param_type = "ExportOptions | null")] options: JsValue,
    ) -> Promise {
        self.io("exportSnapshot", options, JsValue::UNDEFINED, |_, o, _| {
            entry_signal(o, EXPORT_KEYS)
        })
    }

    /// The same NDJSON as `exportSnapshot`, as a `Blob`.
    #[wasm_bindgen(js_name = exportSnapshotBlob, unchecked_return_type = "Promise<Blob>")]
    pub fn export_snapshot_blob(
        &self,
        #[wasm_bindgen(unchecked_optional_param_type = "ExportOptions | null")] options: JsValue,
    ) -> Promise {
        self.io(
            "exportSnapshotBlob",
            options,
            JsValue::UNDEFINED,
            |_, o, _| entry_signal(o, EXPORT_KEYS),
        )
    }

    /// The same NDJSON as `exportSnapshot`, handed to `onChunk` in chunks of
    /// whole lines, in order, from one read-only transaction. An async
    /// `onChunk` (one returning a Promise or thenable) is awaited before the
    /// next chunk, and the export resolves after the last one settled; its
    /// rejection (or a throw) rejects the export with that error and no
    /// chunk follows. Chunks not taken yet wait in memory meanwhile.
    #[wasm_bindgen(js_name = exportSnapshotChunks, unchecked_return_type = "Promise<void>")]
    pub fn export_snapshot_chunks(
        &self,
        #[wasm_bindgen(js_name = onChunk, unchecked_param_type = "(chunk: string) => unknown")]
        on_chunk: JsValue,
        #[wasm_bindgen(unchecked_optional_param_type = "ExportOptions | null")] options: JsValue,
    ) -> Promise {
        self.io("exportSnapshotChunks", on_chunk, options, |_, f, o| {
            chunk_fn(f)?;
            entry_signal(o, EXPORT_KEYS)
        })
    }

    /// Imports an `exportSnapshot()` text (string, `Blob`, `Response` or
    /// `ReadableStream`); newer local revisions are kept.
    #[wasm_bindgen(js_name = importSnapshot, unchecked_return_type = "Promise<SnapshotImportSummary>")]
    pub fn import_snapshot(
        &self,
        #[wasm_bindgen(unchecked_param_type = "ImportSource")] source: JsValue,
        #[wasm_bindgen(unchecked_optional_param_type = "ImportOptions | null")] options: JsValue,
    ) -> Promise {
        self.io("importSnapshot", source, options, |_, s, o| {
            import_checks(s, o, false).map(|(o, _)| o.signal)
        })
    }

    /// Compares every derived index with the records:
    /// `{checked, missing, orphaned, stale, building}` (ids). Index
    /// maintenance ships in the io module with import and export: the
    /// first call loads it as `importPouchDump` does (options are checked
    /// before). Options (`VerifyOptions`): `onProgress(done, total)` after
    /// each 1,000 records read, `signal`.
    ///
    /// # Errors
    /// ValidationError for a bad option; AbortError (`cause`: the signal's
    /// reason); ClosedError; NetworkError when the io module cannot load;
    /// what `onProgress` throws or rejects with before its last call.
    #[wasm_bindgen(js_name = verifyIndexes, unchecked_return_type = "Promise<IndexVerification>")]
    pub fn verify_indexes(
        &self,
        #[wasm_bindgen(unchecked_optional_param_type = "VerifyOptions | null")] options: JsValue,
    ) -> Promise {
        self.io("verifyIndexes", options, JsValue::UNDEFINED, |_, o, _| {
            entry_signal(o, VERIFY_KEYS)
        })
    }

    /// Rebuilds the derived indexes from the records, `batchSize` records per
    /// transaction (default 500); with `restart: false` an interrupted
    /// rebuild resumes from its checkpoint. Resolves to the number of records
    /// processed. Loads the io module as `verifyIndexes` does (options are
    /// checked before).
    #[wasm_bindgen(js_name = rebuildIndexes, unchecked_return_type = "Promise<number>")]
    pub fn rebuild_indexes(
        &self,
        #[wasm_bindgen(unchecked_optional_param_type = "RebuildOptions | null")] options: JsValue,
    ) -> Promise {
        // An aborted signal is refused too, as the imports' is: an
        // AbortError without a download (`io`; docs/api.md, "Arguments are
        // checked first").
        self.io("rebuildIndexes", options, JsValue::UNDEFINED, |_, o, _| {
            rebuild_options(o).map(|(_, _, signal, _)| signal)
        })
    }

    /// Drops the derived index `name` (one this store was not opened
    /// declaring): its definitions and entries, so no tab's writes maintain
    /// it any more. Resolves to whether it existed. Loads the io module as
    /// `verifyIndexes` does. Options (`DropIndexOptions`): `signal`, looked
    /// at until the drop's one transaction starts (an abort after that
    /// leaves the drop to complete).
    ///
    /// # Errors
    /// ValidationError for a non-string or declared `name` or a bad
    /// option; AbortError (`cause`: the signal's reason; nothing dropped);
    /// ClosedError; NetworkError when the io module cannot load.
    #[wasm_bindgen(js_name = dropIndex, unchecked_return_type = "Promise<boolean>")]
    pub fn drop_index(
        &self,
        #[wasm_bindgen(unchecked_param_type = "string")] name: JsValue,
        #[wasm_bindgen(unchecked_optional_param_type = "DropIndexOptions | null")] options: JsValue,
    ) -> Promise {
        // An index this store declares is refused before the download too
        // (docs/api.md, "Arguments are checked first").
        self.io("dropIndex", name, options, |s, n, o| {
            let name = string_arg(n, "the index name").map_err(StoreError::Thrown)?;
            if s.indexes().iter().any(|d| d.name == name) {
                return Err(StoreError::validation(crate::store::index::DECLARED));
            }
            entry_signal(o, "signal")
        })
    }
}

#[cfg(not(feature = "io"))]
impl AgentStore {
    /// `open()`'s rebuild of indexes whose definitions changed, in the io
    /// module (loaded in the background; its result is not awaited).
    fn rebuild_in_background(&self) {
        let o = Object::new();
        set(&o, "restart", &JsValue::FALSE);
        let p = self.io("rebuildIndexes", o.into(), JsValue::UNDEFINED, |_, _, _| {
            Ok(None)
        });
        wasm_bindgen_futures::spawn_local(async move {
            if let Err(e) = wasm_bindgen_futures::JsFuture::from(p).await {
                background_rebuild_failed(&e);
            }
        });
    }
}

#[cfg(feature = "io")]
impl AgentStore {
    /// `open()`'s rebuild of indexes whose definitions changed, in the
    /// background (its result is not awaited).
    fn rebuild_in_background(&self) {
        let s = self.inner.clone();
        wasm_bindgen_futures::spawn_local(async move {
            if let Err(e) = s.rebuild_indexes(500, false, None, None).await {
                background_rebuild_failed(&e.to_js());
            }
        });
    }
}

/// Reports a failed background rebuild (`open()` does not wait for it):
/// `listBy` keeps answering from the records, and the next `open()` or
/// `rebuildIndexes()` tries again. A rebuild stopped by `close()` is not
/// reported.
fn background_rebuild_failed(e: &JsValue) {
    if crate::error::get_str(e, "code").as_deref() != Some("closed") {
        web_sys::console::warn_2(
            &"agentstore: background index rebuild failed (listBy scans records meanwhile):".into(),
            e,
        );
    }
}

/// `rebuildIndexes` options: `(batchSize, onProgress, signal, restart)`.
fn rebuild_options(
    options: &JsValue,
) -> Result<(u32, Option<Function>, Option<web_sys::AbortSignal>, bool), StoreError> {
    known(options, "batchSize onProgress signal restart")?;
    let batch = opt_num(options, "batchSize", 1, 10_000, "an integer in [1, 10000]")?
        .map_or(500, |n| n as u32);
    let cb = opt_fn(options, "onProgress")?;
    let restart = opt_bool(options, "restart")?.unwrap_or(true);
    // The signal last (every options reader does): the call watches it from
    // here on, with no other option's getter run between its read and the
    // watch (an event such a getter fires comes before the watch).
    Ok((batch, cb, opt_signal(options)?, restart))
}

/// The bodies of the methods above, in the `io` build (and the Rust tests).
#[cfg(feature = "io")]
#[wasm_bindgen]
impl AgentStore {
    /// Opens the existing store `name` for io-loader.js (ClosedError when
    /// it was deleted), without the background index rebuild (the
    /// connection that asked runs it). Not public API.
    #[wasm_bindgen(js_name = __openForIo, skip_typescript)]
    pub fn open_for_io(
        name: JsValue,
        indexes: JsValue,
        blocked_timeout_ms: u32,
        schema: u32,
    ) -> Promise {
        run(async move {
            // An io module of another release (a cached file) must not open
            // the database at another schema version: a newer one would
            // upgrade it under the caller's connection.
            if schema != crate::store::db::SCHEMA_VERSION {
                return Err(StoreError::validation(
                    "the import/export module is from another release of agentstore (schema version differs)",
                ));
            }
            let name = string_arg(&name, "the store name").map_err(StoreError::Thrown)?;
            let indexes = parse_index_defs(&indexes)?;
            let store = Store::open_existing(&name, blocked_timeout_ms, indexes).await?;
            Ok(AgentStore::from_store(store).into())
        })
    }

    /// Compares every derived index with the records:
    /// `{checked, missing, orphaned, stale, building}` (ids); options
    /// `onProgress`, `signal` ([`Store::verify_indexes_with`]).
    #[wasm_bindgen(js_name = verifyIndexes, unchecked_return_type = "Promise<IndexVerification>")]
    pub fn verify_indexes(
        &self,
        #[wasm_bindgen(unchecked_optional_param_type = "VerifyOptions | null")] options: JsValue,
    ) -> Promise {
        let s = self.inner.clone();
        run(async move {
            let o = steered(&options, VERIFY_KEYS)?;
            let _watch = crate::options::track(o.signal.as_ref());
            let v = s
                .verify_indexes_with(o.on_progress.as_ref(), o.signal.as_ref())
                .await?;
            Ok(verification_js(&v))
        })
    }

    /// Rebuilds the derived indexes from the records, `batchSize` records per
    /// transaction (default 500); with `restart: false` an interrupted
    /// rebuild resumes from its checkpoint. Resolves to the number of records
    /// processed.
    #[wasm_bindgen(js_name = rebuildIndexes, unchecked_return_type = "Promise<number>")]
    pub fn rebuild_indexes(
        &self,
        #[wasm_bindgen(unchecked_optional_param_type = "RebuildOptions | null")] options: JsValue,
    ) -> Promise {
        let s = self.inner.clone();
        run(async move {
            let (batch, cb, signal, restart) = rebuild_options(&options)?;
            let _watch = crate::options::track(signal.as_ref());
            Ok(
                s.rebuild_indexes(batch, restart, cb.as_ref(), signal.as_ref())
                    .await?
                    .into(),
            )
        })
    }

    /// Drops the derived index `name` (one this store was not opened
    /// declaring): its definitions and entries. Resolves to whether it
    /// existed. Option `signal` ([`Store::drop_index`]).
    #[wasm_bindgen(js_name = dropIndex, unchecked_return_type = "Promise<boolean>")]
    pub fn drop_index(
        &self,
        #[wasm_bindgen(unchecked_param_type = "string")] name: JsValue,
        #[wasm_bindgen(unchecked_optional_param_type = "DropIndexOptions | null")] options: JsValue,
    ) -> Promise {
        let s = self.inner.clone();
        run(async move {
            let name = string_arg(&name, "the index name").map_err(StoreError::Thrown)?;
            let o = steered(&options, "signal")?;
            let _watch = crate::options::track(o.signal.as_ref());
            Ok(s.drop_index(&name, o.signal.as_ref()).await?.into())
        })
    }

    /// Imports a PouchDB dump (pouchdb-replication-stream NDJSON) from a
    /// string, `Blob`, `Response` or `ReadableStream`, streamed in batches.
    #[wasm_bindgen(js_name = importPouchDump, unchecked_return_type = "Promise<PouchImportSummary>")]
    pub fn import_pouch_dump(
        &self,
        #[wasm_bindgen(unchecked_param_type = "ImportSource")] source: JsValue,
        #[wasm_bindgen(unchecked_optional_param_type = "PouchImportOptions | null")]
        options: JsValue,
    ) -> Promise {
        let s = self.inner.clone();
        run(async move {
            let (opts, legacy_id) = import_checks(&source, &options, true)?;
            let _watch = crate::options::track(opts.signal.as_ref());
            // A closed store is refused before its source is read, as the
            // entry points refuse it before they load the io module.
            s.check_open()?;
            let (sum, counts, legacy) =
                s.import_pouch_dump_with(&source, &legacy_id, &opts).await?;
            let o = Object::new();
            for (k, v) in [
                ("documentsRead", sum.documents_read),
                ("live", sum.live),
                ("tombstones", sum.tombstones),
                ("localSkipped", sum.local_skipped),
                ("conflictsResolved", sum.conflicts_resolved),
                ("written", u64::from(counts.written)),
                ("keptNewer", u64::from(counts.kept_newer)),
            ] {
                set(&o, k, &JsValue::from(v as f64));
            }
            set(
                &o,
                "lastSeq",
                &sum.last_seq
                    .map_or(JsValue::NULL, |n| JsValue::from(n as f64)),
            );
            let legacy_js = match legacy {
                None => JsValue::NULL,
                Some(r) => {
                    let l = Object::new();
                    set(&l, "id", &r.id.as_str().into());
                    set(&l, "listed", &JsValue::from(r.listed as f64));
                    set(&l, "lost", &JsValue::from(r.lost as f64));
                    set(&l, "stale", &JsValue::from(r.stale as f64));
                    l.into()
                }
            };
            set(&o, "legacyIndex", &legacy_js);
            Ok(o.into())
        })
    }

    /// Every record and tombstone as NDJSON (header line first), as a string
    /// assembled in JavaScript.
    #[wasm_bindgen(js_name = exportSnapshot, unchecked_return_type = "Promise<string>")]
    pub fn export_snapshot(
        &self,
        #[wasm_bindgen(unchecked_optional_param_type = "ExportOptions | null")] options: JsValue,
    ) -> Promise {
        let s = self.inner.clone();
        run(async move {
            let o = steered(&options, EXPORT_KEYS)?;
            let _watch = crate::options::track(o.signal.as_ref());
            Ok(s.export_snapshot_with(None, &o).await?.join("").into())
        })
    }

    /// The same NDJSON as `exportSnapshot`, as a `Blob`.
    #[wasm_bindgen(js_name = exportSnapshotBlob, unchecked_return_type = "Promise<Blob>")]
    pub fn export_snapshot_blob(
        &self,
        #[wasm_bindgen(unchecked_optional_param_type = "ExportOptions | null")] options: JsValue,
    ) -> Promise {
        let s = self.inner.clone();
        run(async move {
            let o = steered(&options, EXPORT_KEYS)?;
            let _watch = crate::options::track(o.signal.as_ref());
            s.export_snapshot_blob_with(&o).await
        })
    }

    /// The same NDJSON as `exportSnapshot`, handed to `onChunk` in chunks of
    /// whole lines, in order, from one read-only transaction. An async
    /// `onChunk` (one returning a Promise or thenable) is awaited before the
    /// next chunk, and the export resolves after the last one settled; its
    /// rejection (or a throw) rejects the export with that error and no
    /// chunk follows. Chunks not taken yet wait in memory meanwhile.
    #[wasm_bindgen(js_name = exportSnapshotChunks, unchecked_return_type = "Promise<void>")]
    pub fn export_snapshot_chunks(
        &self,
        #[wasm_bindgen(js_name = onChunk, unchecked_param_type = "(chunk: string) => unknown")]
        on_chunk: JsValue,
        #[wasm_bindgen(unchecked_optional_param_type = "ExportOptions | null")] options: JsValue,
    ) -> Promise {
        let s = self.inner.clone();
        run(async move {
            let on_chunk = chunk_fn(&on_chunk)?;
            let o = steered(&options, EXPORT_KEYS)?;
            let _watch = crate::options::track(o.signal.as_ref());
            s.export_snapshot_with(Some(&on_chunk), &o).await?;
            Ok(JsValue::UNDEFINED)
        })
    }

    /// Imports an `exportSnapshot()` text (string, `Blob`, `Response` or
    /// `ReadableStream`); newer local revisions are kept.
    #[wasm_bindgen(js_name = importSnapshot, unchecked_return_type = "Promise<SnapshotImportSummary>")]
    pub fn import_snapshot(
        &self,
        #[wasm_bindgen(unchecked_param_type = "ImportSource")] source: JsValue,
        #[wasm_bindgen(unchecked_optional_param_type = "ImportOptions | null")] options: JsValue,
    ) -> Promise {
        let s = self.inner.clone();
        run(async move {
            let (opts, _) = import_checks(&source, &options, false)?;
            let _watch = crate::options::track(opts.signal.as_ref());
            // A closed store is refused before its source is read, as the
            // entry points refuse it before they load the io module.
            s.check_open()?;
            let c = s.import_snapshot_with(&source, &opts).await?;
            let o = Object::new();
            set(&o, "written", &c.written.into());
            set(&o, "keptNewer", &c.kept_newer.into());
            Ok(o.into())
        })
    }
}

/// `legacyIndexId` of `importPouchDump` (default `"agent-index"`).
fn legacy_id(options: &JsValue) -> Result<String, StoreError> {
    match read(options, "legacyIndexId")? {
        v if v.is_undefined() || v.is_null() => Ok("agent-index".to_owned()),
        v => crate::value::exact_string(&v).ok_or_else(|| {
            StoreError::validation(agentstore_protocol::cat(&[
                "legacyIndexId",
                crate::value::STRING_ARG,
            ]))
        }),
    }
}

/// `onChunk` of `exportSnapshotChunks`: a function.
fn chunk_fn(on_chunk: &JsValue) -> Result<Function, StoreError> {
    on_chunk.clone().dyn_into().map_err(|_| {
        StoreError::validation("exportSnapshotChunks(onChunk): onChunk must be a function")
    })
}

/// The `batchSize` option: 1..=10000, default 1000.
fn batch_option(options: &JsValue) -> Result<u32, StoreError> {
    Ok(opt_num(
        options,
        "batchSize",
        1,
        MAX_IMPORT_BATCH,
        "an integer in [1, 10000]",
    )?
    .map_or(DEFAULT_BATCH, |n| n as u32))
}

/// The options an export takes (`ExportOptions`).
const EXPORT_KEYS: &str = "batchSize onProgress signal";

/// The options `verifyIndexes` takes (`VerifyOptions`).
const VERIFY_KEYS: &str = "onProgress signal";

/// The options of a call that takes some of `batchSize` (1..=10000,
/// default 1000), `onProgress` and `signal`: `keys` (space-separated) are
/// those it takes, and any other is refused. An option not in `keys` reads
/// as not given.
///
/// # Errors
/// ValidationError for an option not in `keys` or of the wrong type.
fn steered(options: &JsValue, keys: &'static str) -> Result<ImportOptions, StoreError> {
    known(options, keys)?;
    steered_known(options)
}

/// [`steered`] once the option names were checked.
fn steered_known(options: &JsValue) -> Result<ImportOptions, StoreError> {
    let on_progress = opt_fn(options, "onProgress")?;
    let batch = batch_option(options)?;
    Ok(ImportOptions {
        on_progress,
        batch,
        // Read last: see `rebuild_options`.
        signal: opt_signal(options)?,
    })
}

/// What an entry point checks of the options of a call it runs in the io
/// module ([`steered`]) before the download; the call's signal, which
/// [`AgentStore::io`] refuses when aborted and which ends the wait for the
/// download.
///
/// # Errors
/// As [`steered`].
#[cfg(not(feature = "io"))]
fn entry_signal(
    options: &JsValue,
    keys: &'static str,
) -> Result<Option<web_sys::AbortSignal>, StoreError> {
    steered(options, keys).map(|o| o.signal)
}
