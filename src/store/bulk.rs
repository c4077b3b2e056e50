//! Calls over many records at once: `getMany`, `count`, `deleteMany`,
//! `purgeTombstones`, and dropping a whole database (`destroy`).
//!
//! Reads issue every request before awaiting: IndexedDB runs the requests of
//! one transaction in the order they were placed and fires their `success`
//! events in that order (<https://w3c.github.io/IndexedDB/#request-construct>),
//! so waiting for the LAST request is waiting for all of them — one Promise
//! instead of one future per id.

use super::db::TransactionMode;
use super::db::{answer_of, answers_of, request_promise, BY_TYPE, META, RECORDS, TOMBSTONES};
use super::{check_id_value, read_many, tombstone, tombstone_digest, tombstone_rev, Store};
use crate::error::{BatchFailure, Result, StoreError};
use agentstore_protocol::keys::page_range;
use agentstore_protocol::record::MAX_BATCH;
use agentstore_protocol::rev::{decide_delete, CasError, Current, Rev};
use js_sys::{Array, JsString, Reflect};
use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_futures::JsFuture;

/// One validated `deleteMany` position.
struct Deletion {
    id: JsString,
    /// The tombstone's body digest (computed before the transaction).
    digest: String,
    expected: Rev,
}

/// Awaits an IndexedDB request (resolving with its `result`); its handlers
/// are attached at once, not at the first poll.
fn settle(request: &web_sys::IdbRequest) -> impl std::future::Future<Output = Result<JsValue>> {
    let done = JsFuture::from(request_promise(request));
    async move { done.await.map_err(|e| StoreError::from_dom(&e)) }
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
        return Err(StoreError::validation(
            [call, " expects an array of ", of].concat(),
        ));
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
    /// ValidationError (with `failures` naming every bad position) when `ids`
    /// is not an array of ids or holds more than 100,000; ClosedError.
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
            return Ok(js_sys::Promise::resolve(&JsValue::from(0)));
        };
        let query = super::list::key_range(&range, record_type)?;
        let query: JsValue = query.map_or(JsValue::UNDEFINED, JsValue::from);
        let tx = self.db.tx(&[RECORDS], TransactionMode::ReadOnly)?;
        let store = tx.store(RECORDS)?;
        let request = if record_type.is_some() {
            let index: web_sys::IdbIndex = store.index(BY_TYPE)?.into();
            dom(index.count_with_key(&query))?
        } else {
            let raw: web_sys::IdbObjectStore = store.into();
            dom(raw.count_with_key(&query))?
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
                let rev = crate::value::short_string(&field("rev"), crate::value::MAX_REV_TEXT)
                    .ok_or_else(|| StoreError::validation("rev must be a revision string"))?;
                let expected = Rev::parse(&rev).map_err(|e| StoreError::validation(e.0))?;
                Ok((id, expected))
            });
            match checked {
                Ok((id, expected)) => {
                    if !seen.first(&id) {
                        failures.push(failure(
                            index,
                            id.into(),
                            "the same id appears twice in one batch".into(),
                        ));
                    } else {
                        let digest = tombstone_digest(&String::from(&id));
                        dels.push(Deletion {
                            id,
                            digest,
                            expected,
                        });
                    }
                }
                Err(e) => failures.push(failure(index, id, e.message())),
            }
        }
        if !failures.is_empty() {
            return Err(invalid(failures));
        }
        if dels.is_empty() {
            return Ok(Vec::new());
        }
        let tx = self.write_tx()?;
        let (currents, indexes) = self
            .with_indexes(&tx, read_many(&tx, dels.iter().map(|d| &d.id)))
            .await?;
        let mut revs = Vec::with_capacity(dels.len());
        let mut exhausted = false;
        for (index, (d, (current, _))) in dels.iter().zip(&currents).enumerate() {
            match decide_delete(current, &d.expected) {
                Ok(base) => match tombstone_rev(base, &d.digest) {
                    Ok(rev) => revs.push(rev),
                    // At the last generation (2^53-1, an imported revision).
                    Err(e) => {
                        exhausted = true;
                        failures.push(BatchFailure {
                            index,
                            id: d.id.clone().into(),
                            message: e.message(),
                            expected_rev: Some(d.expected.text()),
                            current_rev: Some(base.text()),
                        })
                    }
                },
                Err(e) => failures.push(BatchFailure {
                    index,
                    id: d.id.clone().into(),
                    message: match e {
                        CasError::NotFound => "nothing live to delete".into(),
                        CasError::Conflict => "revision conflict".into(),
                    },
                    expected_rev: Some(d.expected.text()),
                    // Only a live revision: a tombstone's is not one to
                    // delete at (docs: `currentRev: null`, as `delete`).
                    current_rev: match current {
                        Current::Live(r) => Some(r.to_string()),
                        _ => None,
                    },
                }),
            }
        }
        if !failures.is_empty() {
            // Nothing was written; the transaction ends empty.
            return Err(super::batch_refused(failures, exhausted));
        }
        let tombs = tx.store(TOMBSTONES)?;
        let records = tx.store(RECORDS)?;
        for ((d, (_, stored)), rev) in dels.iter().zip(&currents).zip(&revs) {
            tombs.put(&tombstone(&d.id, rev), None)?;
            records.delete(JsValue::from(d.id.clone()))?;
            super::index::maintain(&tx, &indexes, stored.as_ref(), None)?;
        }
        self.finish(tx).await?;
        let changes: Vec<_> = dels
            .iter()
            .zip(&revs)
            .map(|(d, r)| (d.id.clone().into(), r.clone(), true))
            .collect();
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
    /// # Errors
    /// TransactionError / QuotaExceededError / ClosedError.
    pub async fn purge_tombstones(&self, older_than_ms: f64) -> Result<u32> {
        let cutoff = js_sys::Date::now() - older_than_ms;
        let tx = self.write_tx_in(&[TOMBSTONES, META])?;
        let store: web_sys::IdbObjectStore = tx.store(TOMBSTONES)?.into();
        let all: Array = settle(&dom(store.get_all())?).await?.unchecked_into();
        let mut purged = 0;
        for t in all.iter() {
            let at = Reflect::get(&t, &"deletedAt".into())
                .ok()
                .and_then(|v| v.as_f64());
            // `0` is every tombstone, also one dated ahead of this clock
            // (imported from a device whose clock runs ahead).
            if older_than_ms == 0.0 || at.is_none_or(|at| at <= cutoff) {
                let id = Reflect::get(&t, &"_id".into()).unwrap_or(JsValue::UNDEFINED);
                dom(store.delete(&id))?;
                purged += 1;
            }
        }
        if purged > 0 {
            // A purged id can be created afresh at generation 1: the count
            // keeps that revision apart from the purged one's first.
            super::index::note_purge(&tx).await?;
        }
        self.finish(tx).await?;
        Ok(purged)
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
