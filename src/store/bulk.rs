//! Calls over many records at once: `getMany`, `count`, `deleteMany`,
//! `purgeTombstones`, and dropping a whole database (`destroy`).
//!
//! Reads issue every request before awaiting: IndexedDB runs the requests of
//! one transaction in the order they were placed and fires their `success`
//! events in that order (<https://w3c.github.io/IndexedDB/#request-construct>),
//! so waiting for the LAST request is waiting for all of them — one Promise
//! instead of one future per id.

use super::db::TransactionMode;
use super::db::{answer_of, answers_of, BY_TYPE, META, RECORDS, TOMBSTONES};
use super::{check_id_value, tombstone_digest, tombstone_rev, Store};
use crate::error::{BatchFailure, Result, StoreError};
use agentstore_protocol::keys::page_range;
use agentstore_protocol::record::MAX_BATCH;
use agentstore_protocol::rev::{decide_delete, decide_put, CasError, Current, Rev};
use agentstore_protocol::ErrorCode;
use js_sys::{Array, Function, JsString};
use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_futures::JsFuture;
use web_sys::AbortSignal;

/// One validated position of a batch write (`putMany`, `deleteMany`).
pub(crate) enum Op {
    /// A record to write.
    Put(super::Prepared),
    /// A deletion of `id` at `expected`, whose tombstone's body digest is
    /// `digest` (computed before the transaction).
    Delete {
        id: JsString,
        digest: String,
        expected: Rev,
    },
}

impl Op {
    pub(crate) fn id(&self) -> &JsString {
        match self {
            Op::Put(p) => &p.id,
            Op::Delete { id, .. } => id,
        }
    }
}

fn dom<T>(r: std::result::Result<T, JsValue>) -> Result<T> {
    r.map_err(|e| StoreError::from_dom(&e))
}

/// `v` as an array of at most [`MAX_BATCH`] items, or a ValidationError
/// saying what `call` expects.
pub(super) fn batch_array(
    v: &JsValue,
    call: &'static str,
    of: &'static str,
    too_many: &'static str,
) -> Result<Vec<JsValue>> {
    if !crate::value::is_array(v)? {
        return Err(StoreError::validation(agentstore_protocol::cat(&[
            call,
            " expects an array of ",
            of,
        ])));
    }
    crate::value::items(v.unchecked_ref(), MAX_BATCH, too_many)
}

fn failure(index: usize, id: JsValue, message: String) -> BatchFailure {
    BatchFailure {
        index,
        id,
        message,
        expected_rev: None,
        current_rev: None,
        code: ErrorCode::Validation,
    }
}

/// Turns per-position validation failures into one ValidationError.
fn invalid(failures: Vec<BatchFailure>) -> StoreError {
    StoreError::Validation {
        message: "some positions are invalid; nothing was read or written (see failures)".into(),
        failures,
    }
}

impl Store {
    /// The records stored under `ids`, in the order of `ids`: each a record
    /// or `null` (never stored, or deleted). One read-only transaction.
    ///
    /// # Errors
    /// ValidationError when `ids` is not an array, cannot be read or holds
    /// more than 100,000 ids, and with `failures` naming every bad position
    /// when elements are not ids; ClosedError.
    pub async fn get_many(&self, ids: &JsValue) -> Result<Array> {
        let none = JsValue::UNDEFINED;
        Ok(super::answered(self.get_many_promise(ids, &none)?)
            .await?
            .into())
    }

    /// `getMany` as the JS method answers it: every request issued during
    /// the call, the records (or `null`s) answered by a Promise made in JS.
    ///
    /// # Errors
    /// As [`Store::get_many`], thrown; the Promise rejects with
    /// TransactionError and the like.
    pub(crate) fn get_many_promise(
        &self,
        ids: &JsValue,
        to_error: &JsValue,
    ) -> Result<js_sys::Promise> {
        let arr = batch_array(ids, "getMany", "ids", "getMany takes at most 100000 items")?;
        let mut failures = Vec::new();
        for (index, id) in arr.iter().enumerate() {
            if let Err(e) = check_id_value(id) {
                failures.push(failure(index, id.clone(), e.message()));
            }
        }
        if !failures.is_empty() {
            return Err(invalid(failures));
        }
        if arr.is_empty() {
            // A closed store answers ClosedError, even with nothing to read.
            self.db.check_open()?;
            return Ok(js_sys::Promise::resolve(&JsValue::from(Array::new())));
        }
        let tx = self.db.tx(&[RECORDS], TransactionMode::ReadOnly)?;
        let store: web_sys::IdbObjectStore = tx.store(RECORDS)?.into();
        let requests = Array::new();
        for id in &arr {
            requests.push(dom(store.get(id))?.as_ref());
        }
        tx.end_read();
        Ok(answers_of(&requests, to_error))
    }

    /// How many live records match `{prefix, type}`, counted by IndexedDB on
    /// the key range without loading a record: the `_id` range of `prefix`,
    /// or with `type` the `[type, prefix…]` range of the native `byType`
    /// index over `["recordType", "_id"]` (so both are O(log n + matches)
    /// inside IndexedDB).
    ///
    /// # Errors
    /// ClosedError / TransactionError.
    pub async fn count(&self, prefix: &[u16], record_type: Option<&JsString>) -> Result<u32> {
        let none = JsValue::UNDEFINED;
        let n = super::answered(self.count_promise(prefix, record_type, &none)?).await?;
        Ok(n.as_f64().unwrap_or(0.0) as u32)
    }

    /// `count` as the JS method answers it: the request issued during the
    /// call, the number answered by a Promise made in JS.
    ///
    /// # Errors
    /// As [`Store::count`], thrown; the Promise rejects with
    /// TransactionError and the like.
    pub(crate) fn count_promise(
        &self,
        prefix: &[u16],
        record_type: Option<&JsString>,
        to_error: &JsValue,
    ) -> Result<js_sys::Promise> {
        let Some(range) = page_range(prefix, None, false) else {
            self.db.check_open()?;
            return Ok(js_sys::Promise::resolve(&JsValue::from(0)));
        };
        let query = super::list::key_range(&range, record_type)?;
        let query: JsValue = query.map_or(JsValue::UNDEFINED, JsValue::from);
        let tx = self.db.tx(&[RECORDS], TransactionMode::ReadOnly)?;
        let store = tx.store(RECORDS)?;
        let request = if record_type.is_some() {
            dom(store.index(BY_TYPE)?.source().count_req(&query))?
        } else {
            dom(store.source().count_req(&query))?
        };
        tx.end_read();
        Ok(answer_of(&request, to_error))
    }

    /// Deletes every `{id, rev}` with compare-and-swap, in one transaction,
    /// all or none; returns the tombstone revisions in input order.
    ///
    /// # Errors
    /// ValidationError (nothing read or written) listing every malformed
    /// position or repeated id; ConflictError whose `failures` list every
    /// position whose `rev` is not the live revision or that has nothing live
    /// to delete (`currentRev: null`) — nothing is written then;
    /// QuotaExceededError / TransactionError / ClosedError.
    pub async fn delete_many(&self, items: &JsValue) -> Result<Vec<String>> {
        self.write_ops(&Self::delete_ops(items)?).await
    }

    /// `deleteMany(items)`'s deletions, validated (no IndexedDB request yet).
    ///
    /// # Errors
    /// ValidationError listing every malformed position or repeated id.
    pub(crate) fn delete_ops(items: &JsValue) -> Result<Vec<Op>> {
        let arr = batch_array(
            items,
            "deleteMany",
            "{id, rev} objects",
            "deleteMany takes at most 100000 items",
        )?;
        let mut dels = Vec::with_capacity(arr.len());
        let mut failures = Vec::new();
        let seen = super::SeenIds::new();
        for (index, item) in arr.iter().enumerate() {
            // A throwing getter reads as a value no check accepts (the
            // position is then reported as malformed), never as the
            // string it did not give.
            let field = |k: &str| crate::options::opt(item, k).unwrap_or(JsValue::UNDEFINED);
            let id = field("id");
            let checked = check_id_value(&id).and_then(|id| {
                // Seen once its id is valid, whatever else is wrong with
                // it (a key it does not take, its rev): a later position
                // repeating it is reported too.
                let first = seen.first(&id);
                // A key a deletion does not take (PouchDB's `_deleted`,
                // a `force`) is refused, never ignored.
                crate::options::known(item, "id rev").map_err(StoreError::validation)?;
                let rev = crate::value::short_string(&field("rev"), crate::value::MAX_REV_TEXT)
                    .ok_or_else(|| StoreError::validation("rev must be a revision string"))?;
                let expected = Rev::parse(&rev).map_err(|e| StoreError::validation(e.0))?;
                if !first {
                    return Err(StoreError::validation(
                        "the same id appears twice in one batch",
                    ));
                }
                Ok((id, expected))
            });
            match checked {
                Ok((id, expected)) => {
                    let digest = tombstone_digest(&String::from(&id));
                    dels.push(Op::Delete {
                        id,
                        digest,
                        expected,
                    });
                }
                Err(e) => failures.push(failure(index, id, e.message())),
            }
        }
        if !failures.is_empty() {
            return Err(invalid(failures));
        }
        Ok(dels)
    }

    /// Writes every op of a validated batch in one transaction, all or
    /// none, and returns their revisions in order: what is stored for every
    /// id is read first ([`super::read_batch`]), every op is decided with
    /// compare-and-swap, and only when all win are the writes issued.
    ///
    /// # Errors
    /// ConflictError whose `failures` list every losing position (a put's
    /// `currentRev` is any stored revision, a tombstone's included; a
    /// deletion's only a live one: `null` when nothing live is stored);
    /// ValidationError when a position is at the last revision generation;
    /// QuotaExceededError / TransactionError / ClosedError. Nothing is
    /// written on any error.
    pub(crate) async fn write_ops(&self, ops: &[Op]) -> Result<Vec<String>> {
        if ops.is_empty() {
            self.db.check_open()?;
            return Ok(Vec::new());
        }
        let tx = self.write_tx()?;
        let mut ids: Vec<&JsString> = Vec::with_capacity(ops.len());
        for op in ops {
            ids.push(op.id());
        }
        let creates = ops
            .iter()
            .all(|op| matches!(op, Op::Put(p) if p.expected.is_none()));
        let (currents, state) = self
            .with_indexes(&tx, super::read_batch(&tx, &ids, creates))
            .await?;
        let mut revs = Vec::with_capacity(ops.len());
        let mut failures = Vec::new();
        let now = super::now_iso();
        // A member cannot be written as given: a ValidationError.
        let mut invalid = false;
        for (index, (op, (current, stored))) in ops.iter().zip(&currents).enumerate() {
            let (decided, expected, current_rev) = match op {
                Op::Put(p) => (
                    decide_put(current, p.expected.as_ref())
                        .map_err(|_| ("revision conflict", ErrorCode::Conflict))
                        .map(|base| p.stamp(base, stored.as_ref(), &now, state.purges())),
                    p.expected.as_ref().map(Rev::text),
                    current.rev().map(Rev::text),
                ),
                Op::Delete {
                    digest, expected, ..
                } => (
                    decide_delete(current, expected)
                        // Each with the code `delete` gives the same case.
                        .map_err(|e| match e {
                            CasError::NotFound => ("nothing live to delete", ErrorCode::NotFound),
                            CasError::Conflict => ("revision conflict", ErrorCode::Conflict),
                        })
                        .map(|base| tombstone_rev(base, digest)),
                    Some(expected.text()),
                    // Only a live revision: a tombstone's is not one to
                    // delete at (docs: `currentRev: null`, as `delete`).
                    match current {
                        Current::Live(r) => Some(r.text()),
                        _ => None,
                    },
                ),
            };
            let (message, code) = match decided {
                Ok(Ok(rev)) => {
                    revs.push(rev);
                    continue;
                }
                // At the last generation (2^53-1, an imported revision): no
                // next revision exists; or an `updatedAt` naming no real day.
                Ok(Err(e)) => {
                    invalid = true;
                    (e.message(), ErrorCode::Validation)
                }
                Err((why, code)) => (why.into(), code),
            };
            failures.push(BatchFailure {
                index,
                id: op.id().clone().into(),
                message,
                expected_rev: expected,
                current_rev,
                code,
            });
        }
        if !failures.is_empty() {
            // Nothing was written; dropping `tx` ends it empty.
            return Err(super::batch_refused(failures, invalid));
        }
        for ((op, (current, stored)), rev) in ops.iter().zip(&currents).zip(&revs) {
            let stored = stored.as_ref();
            match op {
                // An id with neither a record nor a tombstone is new: `add()`.
                Op::Put(p) => {
                    let add = matches!(current, Current::Missing);
                    super::write_record(&tx, &state, stored, p, current, add)?
                }
                Op::Delete { id, .. } => super::write_tombstone(&tx, &state, stored, id, rev)?,
            }
        }
        // A request failing asynchronously (a ConstraintError from `add`)
        // aborts the transaction; the commit reports the transaction's
        // `error`, which names it.
        self.finish(tx).await?;
        let changes = Array::new();
        for (op, r) in ops.iter().zip(&revs) {
            self.changes
                .change(&changes, op.id(), r, matches!(op, Op::Delete { .. }));
        }
        self.changes.post(&changes);
        Ok(revs)
    }

    /// Removes the tombstones written more than `older_than_ms` ago (by
    /// their `deletedAt`; tombstones without one — written by an earlier
    /// release — count as older than any bound). Returns how many were removed.
    ///
    /// After a purge the id is unknown to the store: a `put` without `_rev`
    /// creates it anew at generation 1, and a `put` or `delete` carrying any
    /// revision of it is refused (ConflictError / NotFoundError) because
    /// nothing stored has that revision — a stale writer still never
    /// overwrites a newer record. Live records, derived index entries and
    /// `watch` are untouched (a tombstone has no entries and purging is not
    /// a change of any record).
    ///
    /// The purge is ONE readwrite transaction that reads 1,000 tombstones
    /// at a time, so it is all or nothing. After each batch, inside the
    /// transaction, `on_progress(done, total)` is called (tombstones looked
    /// at, of those stored when the purge began; none stored: no call),
    /// then `signal` is looked at: a throw there, or an abort (also one
    /// before the call), aborts the transaction (nothing is purged) and
    /// rejects with what was thrown or AbortError. Once the last batch has
    /// been read the transaction commits. It cannot wait for a Promise
    /// `on_progress` returns: those are awaited after the commit, before
    /// the call resolves; a rejection then rejects the call with that error
    /// (the purge stays committed, as the committed batches of a rebuild
    /// do). An abort after the last batch's look (also an `abort` event
    /// whose `signal.aborted` is still false, while those Promises are
    /// awaited) only ends that wait: the purge committed, and the call
    /// resolves with its count, as a complete import or rebuild does. So
    /// AbortError always means nothing was purged.
    ///
    /// # Errors
    /// AbortError (`cause`: the signal's reason; nothing purged); what `on_progress` threw
    /// or its Promise rejected with; TransactionError / QuotaExceededError
    /// / ClosedError (from the scan: as typed Errors, passed through).
    pub async fn purge_tombstones(
        &self,
        older_than_ms: f64,
        on_progress: Option<&Function>,
        signal: Option<&AbortSignal>,
    ) -> Result<u32> {
        super::check_abort(signal)?;
        let cutoff = js_sys::Date::now() - older_than_ms;
        let tx = self.write_tx_in(&[TOMBSTONES, META])?;
        let purge = purge_older(
            tx.store(TOMBSTONES)?.source(),
            older_than_ms,
            cutoff,
            on_progress,
            signal,
            &crate::error::dom_error_fn(),
        );
        // The scan, the purge's count in the index state and the wait for
        // the commit run in JS, which aborts the transaction itself when
        // the purge fails.
        tx.end_read();
        // Rejected with the `dom_error_fn()` function itself (a value no
        // callback can throw; one can throw `undefined`) once `signal`
        // aborted before the commit (the transaction is then aborted);
        // else with what `on_progress` threw or rejected with, or a typed
        // Error: as it is, also when the signal aborted meanwhile.
        let purged =
            JsFuture::from(purge)
                .await
                .map_err(|e| match e == crate::error::dom_error_fn() {
                    true => StoreError::Aborted(
                        signal
                            .and_then(crate::options::abort_reason)
                            .unwrap_or(JsValue::UNDEFINED),
                    ),
                    false => StoreError::Thrown(e),
                })?;
        Ok(purged.as_f64().unwrap_or(0.0) as u32)
    }
}

/// Deletes database `name`: every open connection to it (in any tab or
/// worker of the origin) receives `versionchange`; agentstore connections
/// close themselves there (their `onVersionChange` runs and their later
/// calls reject with ClosedError), then the database is deleted.
///
/// # Errors
/// BlockedError when a connection that does not close on `versionchange`
/// (not an agentstore one) still blocks the deletion after
/// `blocked_timeout_ms`. IndexedDB cannot cancel a delete request: it stays
/// queued and completes once that connection closes. TransactionError when
/// IndexedDB is unavailable or refuses.
pub async fn destroy(name: &str, blocked_timeout_ms: u32) -> Result<()> {
    let deleting = destroy_promise(name, blocked_timeout_ms, &JsValue::UNDEFINED)?;
    match JsFuture::from(deleting).await {
        Ok(_) => Ok(()),
        Err(e) if e.is_undefined() => Err(StoreError::Blocked(name.to_owned(), blocked_timeout_ms)),
        Err(e) => Err(StoreError::from_dom(&e)),
    }
}

/// `destroy` as the JS method answers it: the deletion requested during
/// the call, its outcome a Promise made in JS (js/promise.js `deletion`):
/// `undefined` once gone, a BlockedError, or the failure as `to_error`
/// types it (`undefined`: bare, and blocked rejects with `undefined`).
///
/// # Errors
/// TransactionError when IndexedDB is unavailable or refuses at once.
pub(crate) fn destroy_promise(
    name: &str,
    blocked_timeout_ms: u32,
    to_error: &JsValue,
) -> Result<js_sys::Promise> {
    let blocked = if to_error.is_undefined() {
        JsValue::UNDEFINED
    } else {
        StoreError::Blocked(name.to_owned(), blocked_timeout_ms).to_js()
    };
    dom(super::db::deletion(
        &super::db::factory()?,
        name,
        blocked_timeout_ms,
        &blocked,
        to_error,
    ))
}

#[wasm_bindgen::prelude::wasm_bindgen(module = "/js/promise.js")]
extern "C" {
    /// `purgeTombstones` in the transaction of `store`: the scan (a batch of
    /// tombstones at a time) and deletes, with `on_progress` and `signal`
    /// looked at after each batch, and the purge's count in the index
    /// state; resolves with how many once committed and what `on_progress`
    /// returned fulfilled; failures typed by `to_error` (js/promise.js
    /// `purgeOlder`).
    #[wasm_bindgen(js_name = purgeOlder)]
    fn purge_older(
        store: &super::db::Source,
        older_than_ms: f64,
        cutoff: f64,
        on_progress: Option<&Function>,
        signal: Option<&AbortSignal>,
        to_error: &JsValue,
    ) -> js_sys::Promise;
}
