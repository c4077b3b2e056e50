//! The record store: revisions, compare-and-swap writes, listing, import/export.
//!
//! Every write is ONE readwrite transaction that reads the current revision
//! (live store, then tombstones), decides with the protocol crate's CAS rules
//! and writes — awaiting only IndexedDB requests in between, so IndexedDB's
//! transaction scheduling makes the compare-and-swap atomic across tabs.

pub mod db;
pub mod index;
mod io;
mod lines;
mod list;
pub mod watch;

pub use index::{ByQuery, Verification};
pub use io::{ImportCounts, ImportOptions, DEFAULT_BATCH, MAX_IMPORT_BATCH};
pub use list::{ListQuery, Page};
pub use watch::Watcher;

use crate::error::{get_str, set, BatchFailure, Result, StoreError};
use crate::value;
use agentstore_protocol::index::IndexDef;
use agentstore_protocol::record::{self, check_id, check_record, MAX_BATCH};
use agentstore_protocol::rev::{decide_delete, decide_put, CasError, Current, Rev};
use db::{Db, Tx, DERIVED, META, RECORDS, TOMBSTONES};
use futures::future::join_all;
use idb::TransactionMode;
use js_sys::{JsString, Object};
use serde_json::{Map, Value};
use std::cell::Cell;
use std::future::IntoFuture;
use wasm_bindgen::{JsCast, JsValue};

/// A validated write, ready for the transaction.
pub(crate) struct Prepared {
    /// `_id` as the caller gave it (a JS string).
    pub id: JsString,
    /// `_id` for messages and hashing (lossy for lone surrogates).
    pub id_text: String,
    /// `_rev` the caller wrote against.
    pub expected: Option<Rev>,
    /// The JSON body (validated), for hashing.
    pub body: Map<String, Value>,
    /// The object to store (a shallow copy; `_rev` is set at write time).
    pub object: Object,
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
    /// Derived indexes declared at open.
    indexes: Vec<IndexDef>,
    /// Posts committed changes to `watch` subscribers in every tab.
    changes: watch::Notifier,
    /// Test hook: abort the next write transaction after its writes are issued.
    fault_abort_next: Cell<bool>,
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
        Ok(Store {
            db,
            indexes,
            changes: watch::Notifier::new(name),
            fault_abort_next: Cell::new(false),
        })
    }

    /// The database name.
    pub fn name(&self) -> &str {
        self.changes.name()
    }

    /// The derived indexes declared at open.
    pub fn indexes(&self) -> &[IndexDef] {
        &self.indexes
    }

    /// Test hook: the next write transaction issues its writes, then aborts
    /// (as a crash or a failing request would) and the call fails.
    #[doc(hidden)]
    pub fn inject_abort_next_write(&self) {
        self.fault_abort_next.set(true);
    }

    /// Commits a write transaction (or aborts it when a fault is injected).
    async fn finish(&self, tx: Tx) -> Result<()> {
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
    /// ValidationError for an id that is not a non-empty string.
    pub async fn get(&self, id: &JsValue) -> Result<Option<JsValue>> {
        let id = check_id_value(id)?;
        let tx = self.db.tx(&[RECORDS], TransactionMode::ReadOnly)?;
        let got = tx.store(RECORDS)?.get(JsValue::from(id))?.await?;
        tx.end_read();
        Ok(got)
    }

    /// Validates a record for `put` without touching the database.
    ///
    /// # Errors
    /// ValidationError naming the problem.
    pub(crate) fn prepare(record: &JsValue) -> Result<Prepared> {
        if !record.is_object() || js_sys::Array::is_array(record) {
            return Err(StoreError::validation("a record must be a plain object"));
        }
        let json = value::to_json(record).map_err(StoreError::validation)?;
        let Value::Object(mut body) = json else {
            return Err(StoreError::validation("a record must be a plain object"));
        };
        let id = check_id_value(
            &js_sys::Reflect::get(record, &"_id".into()).unwrap_or(JsValue::UNDEFINED),
        )?;
        let meta = check_record(&body).map_err(StoreError::validation)?;
        let object = Object::assign(&Object::new(), record.unchecked_ref());
        if !meta.has_updated_at {
            let now = js_sys::Date::new_0().to_iso_string();
            body.insert("updatedAt".into(), Value::String(now.clone().into()));
            set(&object, "updatedAt", &now);
        }
        let canonical_len = record::canonical_body(&body).len();
        if canonical_len > record::MAX_RECORD_BYTES {
            return Err(StoreError::validation(format!(
                "record is {canonical_len} bytes as JSON; the limit is {} bytes",
                record::MAX_RECORD_BYTES
            )));
        }
        let id_text = String::from(&id);
        Ok(Prepared {
            id,
            id_text,
            expected: meta.rev,
            body,
            object,
        })
    }

    /// Creates (no `_rev`) or compare-and-swaps (with `_rev`) one record.
    ///
    /// # Errors
    /// ValidationError, ConflictError (with the stored record), QuotaExceededError,
    /// TransactionError, ClosedError.
    pub async fn put(&self, record: &JsValue) -> Result<Written> {
        let p = Self::prepare(record)?;
        self.put_prepared(p).await
    }

    pub(crate) async fn put_prepared(&self, p: Prepared) -> Result<Written> {
        let tx = self.db.tx(&WRITE_SCOPE, TransactionMode::ReadWrite)?;
        let (cur, state) = futures::join!(read_current(&tx, &p.id), index::read_state(&tx));
        let ((current, stored), state) = (cur?, state?);
        self.cas_write(tx, &state, &current, stored, p).await
    }

    /// Decides `p` against what `tx` read (`current`, `stored`), writes the
    /// record and its index entries in `tx`, commits and notifies watchers.
    pub(crate) async fn cas_write(
        &self,
        tx: Tx,
        state: &index::IndexState,
        current: &Current,
        stored: Option<JsValue>,
        p: Prepared,
    ) -> Result<Written> {
        let rev = match decide_put(current, p.expected.as_ref()) {
            Ok(base) => next_rev(base, &p.body)?,
            Err(_) => return Err(conflict(&p, current, stored)),
        };
        write_record(&tx, &p, &rev, current)?;
        index::maintain(&tx, state, stored.as_ref(), Some(&p.object))?;
        self.finish(tx).await?;
        self.changes
            .post(&[(p.id.clone().into(), rev.clone(), false)]);
        Ok(Written { id: p.id, rev })
    }

    /// Deletes with CAS, leaving a tombstone; returns the tombstone's revision.
    ///
    /// # Errors
    /// NotFoundError (nothing live), ConflictError (stale `rev`), ValidationError.
    pub async fn delete(&self, id: &JsValue, rev: &JsValue) -> Result<String> {
        let id = check_id_value(id)?;
        let expected = rev
            .as_string()
            .ok_or_else(|| StoreError::validation("delete(id, rev): rev must be a revision string"))
            .and_then(|s| Rev::parse(&s).map_err(|e| StoreError::validation(e.0)))?;
        let id_text = String::from(&id);
        let tx = self.db.tx(&WRITE_SCOPE, TransactionMode::ReadWrite)?;
        let (cur, state) = futures::join!(read_current(&tx, &id), index::read_state(&tx));
        let ((current, stored), state) = (cur?, state?);
        let base = match decide_delete(&current, &expected) {
            Ok(base) => base,
            Err(CasError::NotFound) => return Err(StoreError::NotFound(id_text)),
            Err(CasError::Conflict) => {
                return Err(StoreError::Conflict {
                    id: id.into(),
                    id_text,
                    expected_rev: Some(expected.to_string()),
                    current_rev: current.rev().map(Rev::to_string),
                    current: stored.unwrap_or(JsValue::NULL),
                    attempts: None,
                })
            }
        };
        let tomb_body = serde_json::json!({"_id": id_text, "_deleted": true});
        let rev = Rev::next(Some(base), &tomb_body.to_string())
            .map_err(|e| StoreError::validation(e.0))?
            .to_string();
        let tomb = tombstone(&id, &rev);
        tx.store(TOMBSTONES)?.put(&tomb, None)?;
        tx.store(RECORDS)?.delete(JsValue::from(id.clone()))?;
        index::maintain(&tx, &state, stored.as_ref(), None)?;
        self.finish(tx).await?;
        self.changes.post(&[(id.into(), rev.clone(), true)]);
        Ok(rev)
    }

    /// Writes every record or none, in one transaction.
    ///
    /// # Errors
    /// ValidationError listing every invalid position (nothing read or
    /// written); ConflictError with `failures` listing every conflicting
    /// position (nothing written); QuotaExceededError/TransactionError.
    pub async fn put_many(&self, records: &JsValue) -> Result<Vec<Written>> {
        let arr = records
            .dyn_ref::<js_sys::Array>()
            .ok_or_else(|| StoreError::validation("putMany expects an array of records"))?;
        if arr.length() as usize > MAX_BATCH {
            return Err(StoreError::validation(format!(
                "putMany takes at most {MAX_BATCH} records"
            )));
        }
        let mut prepared = Vec::with_capacity(arr.length() as usize);
        let mut failures = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for (index, r) in arr.iter().enumerate() {
            match Self::prepare(&r) {
                Ok(p) if !seen.insert(dedup_key(&p)) => failures.push(BatchFailure {
                    index,
                    id: p.id.into(),
                    message: "the same _id appears twice in one batch".into(),
                    expected_rev: None,
                    current_rev: None,
                }),
                Ok(p) => prepared.push(p),
                Err(e) => failures.push(BatchFailure {
                    index,
                    id: js_sys::Reflect::get(&r, &"_id".into()).unwrap_or(JsValue::UNDEFINED),
                    message: e.to_string(),
                    expected_rev: None,
                    current_rev: None,
                }),
            }
        }
        if !failures.is_empty() {
            return Err(StoreError::Validation {
                message: format!(
                    "{} of the batch's records are invalid; nothing was written",
                    failures.len()
                ),
                failures,
            });
        }
        let tx = self.db.tx(&WRITE_SCOPE, TransactionMode::ReadWrite)?;
        let (currents, state) = futures::join!(
            read_many(&tx, prepared.iter().map(|p| &p.id)),
            index::read_state(&tx)
        );
        let (currents, state) = (currents?, state?);
        let mut revs = Vec::with_capacity(prepared.len());
        for (index, (p, (current, _))) in prepared.iter().zip(&currents).enumerate() {
            match decide_put(current, p.expected.as_ref()) {
                Ok(base) => revs.push(next_rev(base, &p.body)?),
                Err(_) => failures.push(BatchFailure {
                    index,
                    id: p.id.clone().into(),
                    message: "revision conflict".into(),
                    expected_rev: p.expected.as_ref().map(Rev::to_string),
                    current_rev: current.rev().map(Rev::to_string),
                }),
            }
        }
        if !failures.is_empty() {
            // Nothing was written yet; the transaction ends empty.
            return Err(StoreError::BatchConflict { failures });
        }
        for ((p, (current, stored)), rev) in prepared.iter().zip(&currents).zip(&revs) {
            write_record(&tx, p, rev, current)?;
            index::maintain(&tx, &state, stored.as_ref(), Some(&p.object))?;
        }
        self.finish(tx).await?;
        let changes: Vec<_> = prepared
            .iter()
            .zip(&revs)
            .map(|(p, r)| (p.id.clone().into(), r.clone(), false))
            .collect();
        self.changes.post(&changes);
        Ok(prepared
            .into_iter()
            .zip(revs)
            .map(|(p, rev)| Written { id: p.id, rev })
            .collect())
    }
}

/// Reads what is stored for `id`: the live record, else its tombstone.
pub(crate) async fn read_current(tx: &Tx, id: &JsString) -> Result<(Current, Option<JsValue>)> {
    let key = JsValue::from(id.clone());
    let live = tx.store(RECORDS)?.get(key.clone())?.into_future();
    let tomb = tx.store(TOMBSTONES)?.get(key)?.into_future();
    let (live, tomb) = futures::join!(live, tomb);
    classify(live?, tomb?)
}

/// Reads many ids at once: every request is issued before the first is awaited.
pub(crate) async fn read_many<'a>(
    tx: &Tx,
    ids: impl Iterator<Item = &'a JsString>,
) -> Result<Vec<(Current, Option<JsValue>)>> {
    let records = tx.store(RECORDS)?;
    let tombs = tx.store(TOMBSTONES)?;
    let mut live = Vec::new();
    let mut dead = Vec::new();
    for id in ids {
        let key = JsValue::from(id.clone());
        live.push(records.get(key.clone())?.into_future());
        dead.push(tombs.get(key)?.into_future());
    }
    let (live, dead) = futures::join!(join_all(live), join_all(dead));
    live.into_iter()
        .zip(dead)
        .map(|(l, d)| classify(l?, d?))
        .collect()
}

fn classify(live: Option<JsValue>, tomb: Option<JsValue>) -> Result<(Current, Option<JsValue>)> {
    if let Some(v) = live {
        return Ok((Current::Live(stored_rev(&v)?), Some(v)));
    }
    if let Some(t) = tomb {
        return Ok((Current::Deleted(stored_rev(&t)?), None));
    }
    Ok((Current::Missing, None))
}

fn stored_rev(v: &JsValue) -> Result<Rev> {
    let s = get_str(v, "_rev")
        .ok_or_else(|| StoreError::Transaction("a stored record has no _rev".into()))?;
    Rev::parse(&s).map_err(|e| StoreError::Transaction(format!("stored record: {e}")))
}

fn next_rev(base: Option<&Rev>, body: &Map<String, Value>) -> Result<String> {
    Rev::next(base, &record::canonical_body(body))
        .map(|r| r.to_string())
        .map_err(|e| StoreError::validation(e.0))
}

/// Issues the writes of one record (no await: the caller commits).
pub(crate) fn write_record(tx: &Tx, p: &Prepared, rev: &str, current: &Current) -> Result<()> {
    set(&p.object, "_rev", &rev.into());
    tx.store(RECORDS)?.put(&p.object, None)?;
    if matches!(current, Current::Deleted(_)) {
        tx.store(TOMBSTONES)?.delete(JsValue::from(p.id.clone()))?;
    }
    Ok(())
}

pub(crate) fn tombstone(id: &JsString, rev: &str) -> Object {
    let t = Object::new();
    set(&t, "_id", id);
    set(&t, "_rev", &rev.into());
    set(&t, "_deleted", &JsValue::TRUE);
    t
}

fn conflict(p: &Prepared, current: &Current, stored: Option<JsValue>) -> StoreError {
    StoreError::Conflict {
        id: p.id.clone().into(),
        id_text: p.id_text.clone(),
        expected_rev: p.expected.as_ref().map(Rev::to_string),
        current_rev: current.rev().map(Rev::to_string),
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

/// A key that tells batch ids apart: the string itself, or its UTF-16 units
/// when the lossy Rust string hides lone surrogates (U+FFFD).
fn dedup_key(p: &Prepared) -> Vec<u16> {
    if p.id_text.contains('\u{FFFD}') {
        value::units(&p.id)
    } else {
        p.id_text.encode_utf16().collect()
    }
}
