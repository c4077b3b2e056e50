//! The record store: revisions, compare-and-swap writes, listing, import/export.
//!
//! Every write is ONE readwrite transaction that reads the current revision
//! (live store, then tombstones), decides with the protocol crate's CAS rules
//! and writes — awaiting only IndexedDB requests in between, so IndexedDB's
//! transaction scheduling makes the compare-and-swap atomic across tabs.

mod bulk;
#[cfg(feature = "io")]
mod calls;
pub mod db;
mod group;
pub mod index;
#[cfg(feature = "io")]
mod io;
pub(crate) mod lines;
mod list;
mod mutate;
pub(crate) use mutate::check_abort;
#[cfg(not(feature = "io"))]
pub(crate) use mutate::race_abort;
#[cfg(feature = "lease")]
pub(crate) use mutate::race_abort_js;
pub mod watch;

pub use bulk::destroy;
pub(crate) use bulk::destroy_promise;
pub use index::{ByQuery, Verification};
#[cfg(feature = "io")]
pub use io::ImportCounts;
pub use lines::{ExportOptions, ImportOptions, DEFAULT_BATCH, MAX_IMPORT_BATCH};
pub use list::{ListQuery, Page, LIST_KEYS};
pub use watch::Watcher;

use crate::error::{get_str, set, BatchFailure, Result, StoreError};
use crate::value;
use agentstore_protocol::canonical::BodyDigest;
use agentstore_protocol::index::IndexDef;
use agentstore_protocol::record::check_id;
use agentstore_protocol::rev::{Current, Rev};
use agentstore_protocol::ErrorCode;
use db::{Db, TransactionMode, Tx, DERIVED, META, RECORDS, TOMBSTONES};
use js_sys::{JsString, Object};
use wasm_bindgen::{JsCast, JsValue};

/// A validated write, ready for the transaction: everything that does not
/// depend on what is stored (the body digest included) is computed before
/// the transaction starts.
pub(crate) struct Prepared {
    /// `_id` as the caller gave it (a JS string).
    pub id: JsString,
    /// `_id` for messages (lossy for lone surrogates).
    pub id_text: String,
    /// `_rev` the caller wrote against.
    pub expected: Option<Rev>,
    /// md5 hex of the canonical body without `_rev` and `updatedAt`.
    pub digest: String,
    /// The caller's `updatedAt`, when given.
    pub updated_at: Option<String>,
    /// `updated_at` names no real day (see `value::Walked`): refused unless
    /// it is the stored record's.
    pub updated_at_unreal: bool,
    /// The object to store (a plain copy; `_rev` and `updatedAt` are set at
    /// write time).
    pub object: Object,
}

impl Prepared {
    /// Applies the `updatedAt` rule against the stored record and returns
    /// the new revision, setting both on the object to store.
    ///
    /// Rule (README "Records"): a write whose `updatedAt` is absent or equal
    /// to the stored record's gets `now`; a different value given by the
    /// caller is kept, and must name a real day (ValidationError: a stored
    /// `2026-02-30…` written by an earlier release is replaced when copied
    /// back, never refused). The revision is `Rev::next(base, [digest, updatedAt])`;
    /// a first revision (no `base`) also takes the store's count of
    /// tombstone `purges` when there were any, so an id purged and created
    /// again with the same body and `updatedAt` never gets back the revision
    /// a stale writer may hold (the ABA case compare-and-swap exists to
    /// refuse). A store never purged keeps PouchDB-like deterministic first
    /// revisions.
    pub(crate) fn stamp(
        &self,
        base: Option<&Rev>,
        stored: Option<&JsValue>,
        now: &str,
        purges: f64,
    ) -> Result<String> {
        let stored_at = stored.and_then(|s| get_str(s, "updatedAt"));
        let updated_at = match &self.updated_at {
            Some(given) if stored_at.as_ref() != Some(given) => {
                if self.updated_at_unreal {
                    return Err(crate::value::bad_updated_at());
                }
                given.as_str()
            }
            _ => now,
        };
        let epoch = agentstore_protocol::canonical::decimal(purges as u64);
        let parts: &[&str] = if base.is_none() && purges > 0.0 {
            &[&self.digest, updated_at, &epoch]
        } else {
            &[&self.digest, updated_at]
        };
        let rev = Rev::next(base, parts)
            .map_err(|e| StoreError::validation(e.0))?
            .text();
        set(&self.object, "updatedAt", &JsValue::from_str(updated_at));
        set(&self.object, "_rev", &JsValue::from_str(&rev));
        Ok(rev)
    }
}

/// The current time as `updatedAt` text (ISO-8601 UTC with milliseconds).
pub(crate) fn now_iso() -> String {
    js_sys::Date::new_0().to_iso_string().into()
}

/// Result of a successful write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    /// The record id.
    pub id: JsString,
    /// Its new revision.
    pub rev: String,
}

/// Stores a write transaction touches: records, tombstones, and the derived
/// index entries with their shared state.
const WRITE_SCOPE: [&str; 4] = [RECORDS, TOMBSTONES, META, DERIVED];

/// The record store over one IndexedDB database.
pub struct Store {
    db: Db,
    /// `blockedTimeoutMs` given at open (ms); a second connection (the io
    /// module's) opens with it too.
    blocked_timeout_ms: u32,
    /// Derived indexes declared at open.
    indexes: Vec<IndexDef>,
    /// Posts committed changes to `watch` subscribers in every tab.
    changes: watch::Notifier,
    /// Test hook: abort the next write transaction after its writes are issued.
    #[cfg(feature = "test-hooks")]
    fault_abort_next: std::cell::Cell<bool>,
    /// Test hook: fail the n-th write request of the next write transaction.
    #[cfg(feature = "test-hooks")]
    fault_request_next: std::cell::Cell<Option<(u32, db::Fault)>>,
    /// The maintained index definitions, by state generation.
    index_cache: index::IndexCache,
    /// The write group open for joining (group commit, `group.rs`).
    group: std::cell::RefCell<Option<std::rc::Rc<group::Group>>>,
}

impl Store {
    /// Opens the store; see [`Db::open`].
    ///
    /// # Errors
    /// As [`Db::open`].
    ///
    /// `indexes` are the derived indexes to keep; when they differ from the
    /// ones the database holds, call [`Store::rebuild_indexes`] (the JS
    /// `open` starts it in the background).
    pub async fn open(
        name: &str,
        blocked_timeout_ms: u32,
        on_version_change: Option<js_sys::Function>,
        indexes: Vec<IndexDef>,
    ) -> Result<Store> {
        Self::open_versioned(
            name,
            db::SCHEMA_VERSION,
            blocked_timeout_ms,
            on_version_change,
            indexes,
        )
        .await
    }

    /// [`Store::open`] at an explicit IndexedDB version (≥ the schema
    /// version): how a newer release's upgrade looks to older tabs. For tests.
    ///
    /// # Errors
    /// As [`Store::open`].
    #[doc(hidden)]
    pub async fn open_versioned(
        name: &str,
        version: u32,
        blocked_timeout_ms: u32,
        on_version_change: Option<js_sys::Function>,
        indexes: Vec<IndexDef>,
    ) -> Result<Store> {
        agentstore_protocol::index::check_defs(&indexes).map_err(StoreError::validation)?;
        let db = Db::open(name, version, blocked_timeout_ms, on_version_change).await?;
        Ok(Self::with_db(db, name, blocked_timeout_ms, indexes))
    }

    /// A second connection to the existing store `name` (the io module's,
    /// opened for one call of the entry point's store): it never creates
    /// the database.
    ///
    /// # Errors
    /// ClosedError when the database does not exist (it was deleted);
    /// otherwise as [`Store::open`].
    #[cfg(feature = "io")]
    pub async fn open_existing(
        name: &str,
        blocked_timeout_ms: u32,
        indexes: Vec<IndexDef>,
    ) -> Result<Store> {
        agentstore_protocol::index::check_defs(&indexes).map_err(StoreError::validation)?;
        let db = Db::open_with(
            name,
            db::SCHEMA_VERSION,
            blocked_timeout_ms,
            db::Schema::Existing,
            None,
        )
        .await?;
        Ok(Self::with_db(db, name, blocked_timeout_ms, indexes))
    }

    /// The store over connection `db` to database `name` (opened with
    /// `blocked_timeout_ms`), keeping `indexes` (checked by
    /// [`agentstore_protocol::index::check_defs`]).
    pub(crate) fn with_db(
        db: Db,
        name: &str,
        blocked_timeout_ms: u32,
        indexes: Vec<IndexDef>,
    ) -> Store {
        Store {
            db,
            blocked_timeout_ms,
            indexes,
            changes: watch::Notifier::new(name),
            #[cfg(feature = "test-hooks")]
            fault_abort_next: std::cell::Cell::new(false),
            #[cfg(feature = "test-hooks")]
            fault_request_next: std::cell::Cell::new(None),
            index_cache: index::IndexCache::default(),
            group: Default::default(),
        }
    }

    /// `blockedTimeoutMs` given at open (ms).
    pub fn blocked_timeout_ms(&self) -> u32 {
        self.blocked_timeout_ms
    }

    /// The database name.
    pub fn name(&self) -> &str {
        self.changes.name()
    }

    /// The derived indexes declared at open.
    pub fn indexes(&self) -> &[IndexDef] {
        &self.indexes
    }

    /// Whether this context can post and hear changes (it has
    /// `BroadcastChannel`): `watch()` needs it.
    pub fn can_post(&self) -> bool {
        self.changes.can_post()
    }

    /// `Ok` while the connection is open.
    ///
    /// # Errors
    /// ClosedError after `close()` or a `versionchange`.
    pub fn check_open(&self) -> Result<()> {
        self.db.check_open()
    }

    /// Test hook: the next write transaction issues its writes, then aborts
    /// (as a crash or a failing request would) and the call fails. (Writes
    /// grouped in that transaction are run again alone and succeed unless a
    /// later transaction of the connection started meanwhile, a 65th grouped
    /// write's included, see `group.rs`; a write alone in it fails.)
    #[cfg(feature = "test-hooks")]
    pub fn inject_abort_next_write(&self) {
        self.fault_abort_next.set(true);
    }

    /// Test hook: the `n`-th write request (0-based: record puts/adds,
    /// tombstones, index entries, in the order issued) of the next write
    /// transaction fails as `kind` says.
    #[cfg(feature = "test-hooks")]
    pub fn inject_request_fault(&self, n: u32, kind: db::Fault) {
        self.fault_request_next.set(Some((n, kind)));
    }

    /// Starts a readwrite transaction over every store a write touches.
    pub(crate) fn write_tx(&self) -> Result<Tx> {
        self.write_tx_in(&WRITE_SCOPE)
    }

    /// Starts a readwrite transaction over `scope`. Every write of the store
    /// starts here, so the test hooks reach each one.
    pub(crate) fn write_tx_in(&self, scope: &[&str]) -> Result<Tx> {
        let tx = self.db.tx(scope, TransactionMode::ReadWrite)?;
        #[cfg(feature = "test-hooks")]
        if let Some((n, kind)) = self.fault_request_next.take() {
            tx.inject_fault(n, kind);
        }
        Ok(tx)
    }

    /// Commits a write transaction (or aborts it when a fault is injected).
    async fn finish(&self, tx: Tx) -> Result<()> {
        #[cfg(feature = "test-hooks")]
        if self.fault_abort_next.replace(false) {
            tx.abort();
            let _ = tx.commit().await;
            return Err(StoreError::Transaction(
                "injected fault: the transaction was aborted after its writes".into(),
            ));
        }
        tx.commit().await
    }

    /// Closes the connection; later calls fail with ClosedError.
    pub fn close(&self) {
        self.db.close();
    }

    /// The stored record for `id`, or `None` (missing or deleted).
    ///
    /// # Errors
    /// ValidationError for an id that is not a non-empty string; as
    /// [`Store::get_promise`].
    pub async fn get(&self, id: &JsValue) -> Result<Option<JsValue>> {
        let got = answered(self.get_promise(id, &JsValue::UNDEFINED)?).await?;
        Ok((!got.is_null()).then_some(got))
    }

    /// `get` as the JS method answers it: the request is issued during the
    /// call and answered by a Promise made in JS (the record, or `null`), no
    /// executor in between; a failure is rejected as [`db::Req::answer`]
    /// says for `to_error`.
    ///
    /// # Errors
    /// ValidationError for an id that is not a non-empty string, ClosedError
    /// (thrown); the Promise rejects with TransactionError and the like.
    pub(crate) fn get_promise(&self, id: &JsValue, to_error: &JsValue) -> Result<js_sys::Promise> {
        let id = check_id_value(id)?;
        let tx = self.db.tx(&[RECORDS], TransactionMode::ReadOnly)?;
        let got = tx.store(RECORDS)?.get(JsValue::from(id))?;
        tx.end_read();
        Ok(got.answer(to_error))
    }

    /// Validates a record for `put` without touching the database: one walk
    /// that checks it, copies it and computes its body digest.
    ///
    /// # Errors
    /// ValidationError naming the problem.
    pub(crate) fn prepare(record: &JsValue) -> Result<Prepared> {
        let w = value::walk_record(record)?;
        Ok(Prepared {
            id_text: String::from(&w.id),
            id: w.id,
            expected: w.rev,
            digest: w.digest,
            updated_at: w.updated_at,
            updated_at_unreal: w.updated_at_unreal,
            object: w.object,
        })
    }

    /// Creates (no `_rev`) or compare-and-swaps (with `_rev`) one record.
    ///
    /// # Errors
    /// ValidationError, ConflictError (with the stored record), QuotaExceededError,
    /// TransactionError, ClosedError.
    pub async fn put(&self, record: &JsValue) -> Result<Written> {
        self.write_one(Self::put_job(record)?, None)
            .await?
            .written()
    }

    /// `put(record)`'s write, validated (no IndexedDB request yet).
    ///
    /// # Errors
    /// ValidationError.
    pub(crate) fn put_job(record: &JsValue) -> Result<group::Job> {
        Ok(group::Job::Put(Self::prepare(record)?))
    }

    /// Deletes with CAS, leaving a tombstone; returns the tombstone's
    /// revision. Shares a transaction with other single-record writes
    /// issued at the same time (group commit, see `group.rs`).
    ///
    /// # Errors
    /// NotFoundError (nothing live), ConflictError (stale `rev`), ValidationError.
    pub async fn delete(&self, id: &JsValue, rev: &JsValue) -> Result<String> {
        Ok(self
            .write_one(Self::delete_job(id, rev)?, None)
            .await?
            .written()?
            .rev)
    }

    /// `delete(id, rev)`'s write, validated (no IndexedDB request yet).
    ///
    /// # Errors
    /// ValidationError.
    pub(crate) fn delete_job(id: &JsValue, rev: &JsValue) -> Result<group::Job> {
        let id = check_id_value(id)?;
        let expected = value::short_string(rev, value::MAX_REV_TEXT)
            .ok_or_else(|| StoreError::validation("delete(id, rev): rev must be a revision string"))
            .and_then(|s| Rev::parse(&s).map_err(|e| StoreError::validation(e.0)))?;
        let digest = tombstone_digest(&String::from(&id));
        Ok(group::Job::Delete {
            id,
            expected,
            digest,
        })
    }

    /// Writes every record or none, in one transaction.
    ///
    /// # Errors
    /// ValidationError listing every invalid position (nothing read or
    /// written); ConflictError with `failures` listing every conflicting
    /// position (nothing written); QuotaExceededError/TransactionError
    /// (nothing written: the transaction is aborted).
    pub async fn put_many(&self, records: &JsValue) -> Result<Vec<Written>> {
        let ops = Self::put_ops(records)?;
        let revs = self.write_ops(&ops).await?;
        Ok(ops
            .into_iter()
            .zip(revs)
            .map(|(op, rev)| Written {
                id: op.id().clone(),
                rev,
            })
            .collect())
    }

    /// `putMany(records)`'s writes, validated (no IndexedDB request yet).
    ///
    /// # Errors
    /// ValidationError listing every invalid position or repeated id.
    pub(crate) fn put_ops(records: &JsValue) -> Result<Vec<bulk::Op>> {
        let arr = bulk::batch_array(
            records,
            "putMany",
            "records",
            "putMany takes at most 100000 records",
        )?;
        let mut prepared = Vec::with_capacity(arr.len());
        let mut failures = Vec::new();
        let seen = SeenIds::new();
        for (index, r) in arr.iter().enumerate() {
            match Self::prepare(r) {
                Ok(p) if !seen.first(&p.id) => failures.push(BatchFailure {
                    index,
                    id: p.id.into(),
                    message: "the same _id appears twice in one batch".into(),
                    expected_rev: None,
                    current_rev: None,
                    code: ErrorCode::Validation,
                }),
                Ok(p) => prepared.push(p),
                // Named by the `_id` the walk read: read again, a getter
                // could name another record, or throw. It counts as seen
                // (whatever it is): a later position repeating it is
                // reported too; one that is no valid id matches none.
                Err(e) => {
                    let id = value::walked_id();
                    seen.first(&id);
                    failures.push(BatchFailure {
                        index,
                        id,
                        message: e.message(),
                        expected_rev: None,
                        current_rev: None,
                        code: ErrorCode::Validation,
                    })
                }
            }
        }
        if !failures.is_empty() {
            return Err(StoreError::Validation {
                message:
                    "some of the batch's records are invalid (see failures); nothing was written"
                        .into(),
                failures,
            });
        }
        let mut ops = Vec::with_capacity(prepared.len());
        for p in prepared {
            ops.push(bulk::Op::Put(p));
        }
        Ok(ops)
    }
}

/// Awaits a Promise made by a read answered in JS with no `to_error`
/// ([`db::Req::answer`]): its rejection, the DOMException, is typed here as
/// every other IndexedDB failure is.
pub(crate) async fn answered(p: js_sys::Promise) -> Result<JsValue> {
    wasm_bindgen_futures::JsFuture::from(p)
        .await
        .map_err(|e| StoreError::from_dom(&e))
}

/// The error of a batch refused at `failures` (nothing written): a
/// ValidationError when some member cannot be written as given (`invalid`:
/// no retry can succeed; its failure says why: a record at the last
/// revision generation, an `updatedAt` naming no real day), else a
/// NotFoundError when every failure is a deletion with nothing live to
/// delete (as `delete` of each), else a ConflictError.
pub(crate) fn batch_refused(failures: Vec<BatchFailure>, invalid: bool) -> StoreError {
    if invalid {
        StoreError::Validation {
            message: "a record cannot be written as given (see failures: at the last revision generation, 2^53-1, or an updatedAt naming no real day); nothing was written".into(),
            failures,
        }
    } else if failures.iter().all(|f| f.code == ErrorCode::NotFound) {
        // What `delete` says of each: NotFoundError.
        StoreError::BatchNotFound { failures }
    } else {
        StoreError::BatchConflict { failures }
    }
}

/// Reads what is stored for `id`: the live record, else (only then) its
/// tombstone (`Err`: a request failed, the transaction is over). What they
/// hold is read by [`current_of`].
pub(crate) async fn read_current(tx: &Tx, id: &JsString) -> Result<Stored> {
    let key = JsValue::from(id.clone());
    if let Some(v) = tx.store(RECORDS)?.get(key.clone())?.await? {
        return Ok(Stored::Live(v));
    }
    Ok(match tx.store(TOMBSTONES)?.get(key)?.await? {
        Some(t) => Stored::Tombstone(t),
        None => Stored::Missing,
    })
}

/// What [`read_current`] found for an id.
pub(crate) enum Stored {
    /// The live record.
    Live(JsValue),
    /// No live record; this tombstone.
    Tombstone(JsValue),
    /// Neither.
    Missing,
}

/// The revision state of what was read, and the live record.
///
/// # Errors
/// TransactionError when the stored `_rev` does not parse (this id's error
/// alone: the transaction goes on).
pub(crate) fn current_of(s: Stored) -> Result<(Current, Option<JsValue>)> {
    Ok(match s {
        Stored::Live(v) => (Current::Live(stored_rev(&v)?), Some(v)),
        Stored::Tombstone(t) => (Current::Deleted(stored_rev(&t)?), None),
        Stored::Missing => (Current::Missing, None),
    })
}

/// Reads many ids at once: every live-record request is issued before the
/// first is awaited; tombstones are read only for the ids with no record.
pub(crate) async fn read_many(
    tx: &Tx,
    ids: &[&JsString],
) -> Result<Vec<(Current, Option<JsValue>)>> {
    let records = tx.store(RECORDS)?;
    // Loops rather than iterator chains (`collect::<Result<_>>`, a generic
    // id iterator): one body each instead of the adapters' monomorphs.
    let mut live = Vec::with_capacity(ids.len());
    for &id in ids {
        live.push(records.get(JsValue::from(id))?);
    }
    let mut out = Vec::with_capacity(ids.len());
    let mut missing = Vec::new();
    for (i, got) in db::all(live).await?.into_iter().enumerate() {
        match got {
            Some(v) => out.push((Current::Live(stored_rev(&v)?), Some(v))),
            None => {
                missing.push(i);
                out.push((Current::Missing, None));
            }
        }
    }
    if missing.is_empty() {
        return Ok(out);
    }
    let tombs = tx.store(TOMBSTONES)?;
    let mut dead = Vec::with_capacity(missing.len());
    for &i in &missing {
        dead.push(tombs.get(JsValue::from(ids[i]))?);
    }
    for (i, got) in missing.into_iter().zip(db::all(dead).await?) {
        if let Some(t) = got {
            out[i].0 = Current::Deleted(stored_rev(&t)?);
        }
    }
    Ok(out)
}

/// What is stored for a batch's ids. For a batch of creates (`creates`: no
/// `_rev` anywhere) whose spanning key range holds neither a live record
/// nor a tombstone (two `count` requests), every id is new and nothing is
/// read per id; otherwise [`read_many`]. Writing new ids into an empty or
/// disjoint key range (a bulk load, time-ordered ids) then costs what a raw
/// IndexedDB batch of `add`s costs, plus the two counts.
pub(crate) async fn read_batch(
    tx: &Tx,
    ids: &[&JsString],
    creates: bool,
) -> Result<Vec<(Current, Option<JsValue>)>> {
    if creates && ids.len() > 1 {
        // JS's default sort compares strings by UTF-16 code units, as
        // IndexedDB compares string keys.
        let sorted = js_sys::Array::new();
        for id in ids {
            sorted.push(id);
        }
        sorted.sort();
        let span = db::KeyRange::bound(&sorted.get(0), &sorted.at(-1), None, None)?;
        let live = tx.store(RECORDS)?.count(Some(span.clone().into()))?;
        let dead = tx.store(TOMBSTONES)?.count(Some(span.into()))?;
        if (live.await?, dead.await?) == (0, 0) {
            let mut out = Vec::with_capacity(ids.len());
            for _ in ids {
                out.push((Current::Missing, None));
            }
            return Ok(out);
        }
    }
    read_many(tx, ids).await
}

fn stored_rev(v: &JsValue) -> Result<Rev> {
    let s = get_str(v, "_rev")
        .ok_or_else(|| StoreError::Transaction("a stored record has no _rev".into()))?;
    Rev::parse(&s).map_err(|e| StoreError::Transaction(e.0))
}

/// Issues the writes of one record whose `_rev` is already set (no await:
/// the caller commits), replacing `stored` (the live record, if any) in the
/// indexes of `state`. `add` = the id is known to be new.
///
/// The record goes last, after its index upkeep and the tombstone's
/// removal: Firefox, refusing a request for quota inside a transaction,
/// keeps the writes issued after that request though it aborts the
/// transaction (README, "A failed write leaves nothing behind"), so the
/// request most likely to cross the limit must have none of its own
/// write's requests after it.
pub(crate) fn write_record(
    tx: &Tx,
    state: &index::Maintained,
    stored: Option<&JsValue>,
    p: &Prepared,
    current: &Current,
    add: bool,
) -> Result<()> {
    index::maintain(tx, state, stored, Some(&p.object))?;
    if matches!(current, Current::Deleted(_)) {
        tx.store(TOMBSTONES)?.delete(JsValue::from(p.id.clone()))?;
    }
    let records = tx.store(RECORDS)?;
    if add {
        records.add(&p.object, None)?;
    } else {
        records.put(&p.object, None)?;
    }
    Ok(())
}

/// Issues the writes of one deletion whose tombstone revision is `rev` (no
/// await: the caller commits): the tombstone replaces the live record
/// `stored` and its entries in the indexes of `state`. The tombstone, the
/// one request that takes space, goes last (as the record in
/// [`write_record`]).
pub(crate) fn write_tombstone(
    tx: &Tx,
    state: &index::Maintained,
    stored: Option<&JsValue>,
    id: &JsString,
    rev: &str,
) -> Result<()> {
    index::maintain(tx, state, stored, None)?;
    tx.store(RECORDS)?.delete(JsValue::from(id.clone()))?;
    tx.store(TOMBSTONES)?.put(&tombstone(id, rev), None)?;
    Ok(())
}

/// The body digest of the tombstone of `id_text`: canonical
/// `{"_deleted":true,"_id":…}`. Computed before the write transaction.
pub(crate) fn tombstone_digest(id_text: &str) -> String {
    let mut body = BodyDigest::new();
    body.raw(b"{\"_deleted\":true,\"_id\":");
    body.string(id_text);
    body.raw(b"}");
    body.finish()
}

/// The revision of the tombstone that follows `base`, from its body `digest`.
pub(crate) fn tombstone_rev(base: &Rev, digest: &str) -> Result<String> {
    Rev::next(Some(base), &[digest])
        .map(|r| r.text())
        .map_err(|e| StoreError::validation(e.0))
}

/// A tombstone `{_id, _rev, _deleted: true, deletedAt}`; `deletedAt` (ms
/// since the epoch, when it was written here) is what `purgeTombstones`
/// compares with `olderThanMs`.
pub(crate) fn tombstone(id: &JsString, rev: &str) -> Object {
    let t = Object::new();
    set(&t, "_id", id);
    set(&t, "_rev", &rev.into());
    set(&t, "_deleted", &JsValue::TRUE);
    set(&t, "deletedAt", &JsValue::from_f64(js_sys::Date::now()));
    t
}

fn conflict(p: &Prepared, current: &Current, stored: Option<JsValue>) -> StoreError {
    StoreError::Conflict {
        id: p.id.clone().into(),
        id_text: p.id_text.clone(),
        expected_rev: p.expected.as_ref().map(Rev::text),
        current_rev: current.rev().map(Rev::text),
        current: stored.unwrap_or(JsValue::NULL),
        attempts: None,
    }
}

/// Checks that `id` is a string of 1..=1024 UTF-16 units.
///
/// # Errors
/// ValidationError.
pub(crate) fn check_id_value(id: &JsValue) -> Result<JsString> {
    let s = id
        .dyn_ref::<JsString>()
        .ok_or_else(|| StoreError::validation("_id must be a non-empty string"))?;
    check_id(s.length() as usize).map_err(StoreError::validation)?;
    Ok(s.clone())
}

/// The ids of one batch seen so far: a JS `Set` of the id strings, so ids
/// are told apart exactly as IndexedDB keys are (by UTF-16 code units, lone
/// surrogates included), with no Rust set code in the wasm.
pub(crate) struct SeenIds(js_sys::Set);

impl SeenIds {
    pub(crate) fn new() -> Self {
        SeenIds(js_sys::Set::new(&JsValue::UNDEFINED))
    }

    /// Whether `id` is new to the batch (and remembers it).
    pub(crate) fn first(&self, id: &JsValue) -> bool {
        !self.0.has(id) && {
            self.0.add(id);
            true
        }
    }
}
