//! Bulk paths: PouchDB dump import, NDJSON snapshot export/import, `mutate`.

use super::db::TransactionMode;
use super::db::{RECORDS, TOMBSTONES};
use super::index;
use super::{read_many, tombstone, Prepared, Store, Written};
use crate::error::{set, Result, StoreError};
use agentstore_protocol::backoff::{full_jitter_ms, MUTATE_BASE_MS, MUTATE_CAP_MS};
use agentstore_protocol::pouch::{
    legacy_index_report, resolve_dump, DumpSummary, LegacyIndexReport,
};
use agentstore_protocol::rev::{Current, Rev};
use js_sys::{Function, JsString, Object, Promise};
use std::future::IntoFuture;
use wasm_bindgen::{JsCast, JsValue};
use web_sys::AbortSignal;

/// One record or tombstone to import with the revision it already has.
pub(crate) struct Imported {
    id: JsString,
    rev: Rev,
    deleted: bool,
    object: JsValue,
}

/// What an import wrote.
#[derive(Debug, Default, Clone, Copy)]
pub struct ImportCounts {
    /// Records and tombstones written.
    pub written: u32,
    /// Ids skipped because the store already held an equal or newer revision.
    pub kept_newer: u32,
}

/// Progress callbacks fire every this many items (and at the end).
const PROGRESS_EVERY: usize = 250;

impl Store {
    /// Imports a pouchdb-replication-stream dump: each id's PouchDB winner,
    /// tombstones kept, `_local/` documents skipped, in one transaction.
    ///
    /// # Errors
    /// ValidationError naming the first bad line (nothing written);
    /// QuotaExceededError / TransactionError (nothing written).
    pub async fn import_pouch_dump(
        &self,
        text: &str,
        legacy_index_id: &str,
        on_progress: Option<&Function>,
    ) -> Result<(DumpSummary, ImportCounts, Option<LegacyIndexReport>)> {
        let (summary, winners) =
            resolve_dump(text).map_err(|e| StoreError::validation(e.to_string()))?;
        // The derived indexes are maintained from the records as they are
        // written; the legacy document is only compared, never trusted.
        let legacy = legacy_index_report(&winners, legacy_index_id);
        let mut items = Vec::with_capacity(winners.len());
        for w in winners {
            let id = JsString::from(w.id.as_str());
            let rev = w.rev.to_string();
            let object = if w.deleted {
                tombstone(&id, &rev).into()
            } else {
                let json = serde_json::Value::Object(w.body).to_string();
                js_sys::JSON::parse(&json).map_err(|_| {
                    StoreError::validation(format!("document {:?} is not valid JSON", w.id))
                })?
            };
            items.push(Imported {
                id,
                rev: w.rev,
                deleted: w.deleted,
                object,
            });
        }
        let counts = self.write_imported(items, on_progress).await?;
        Ok((summary, counts, legacy))
    }

    /// Exports every record and tombstone as NDJSON: a header line
    /// `{"agentstore":"snapshot","version":1,"records":N,"tombstones":M}`, then
    /// one stored object per line in key order (records, then tombstones).
    ///
    /// # Errors
    /// TransactionError / ClosedError.
    pub async fn export_snapshot(&self) -> Result<String> {
        let tx = self
            .db
            .tx(&[RECORDS, TOMBSTONES], TransactionMode::ReadOnly)?;
        let records = tx.store(RECORDS)?.get_all(None, None)?.into_future();
        let tombs = tx.store(TOMBSTONES)?.get_all(None, None)?.into_future();
        let (records, tombs) = futures::join!(records, tombs);
        let (records, tombs) = (records?, tombs?);
        tx.end_read();
        let header = serde_json::json!({"agentstore": "snapshot", "version": 1, "records": records.len(), "tombstones": tombs.len()});
        let mut out = header.to_string();
        for v in records.iter().chain(&tombs) {
            let line = js_sys::JSON::stringify(v)
                .map_err(|_| StoreError::Transaction("a stored record is not JSON".into()))?;
            out.push('\n');
            out.push_str(&String::from(line));
        }
        out.push('\n');
        Ok(out)
    }

    /// Imports a snapshot made by [`Store::export_snapshot`]; each record keeps
    /// its revision and replaces only an older local revision.
    ///
    /// # Errors
    /// ValidationError naming the first bad line (nothing written).
    pub async fn import_snapshot(
        &self,
        text: &str,
        on_progress: Option<&Function>,
    ) -> Result<ImportCounts> {
        let mut items = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let bad =
                |why: String| StoreError::validation(format!("snapshot line {}: {why}", i + 1));
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            let value = js_sys::JSON::parse(line).map_err(|_| bad("not JSON".into()))?;
            if i == 0 {
                if js_sys::Reflect::get(&value, &"agentstore".into())
                    .ok()
                    .and_then(|v| v.as_string())
                    .as_deref()
                    != Some("snapshot")
                {
                    return Err(bad("missing the agentstore snapshot header".into()));
                }
                continue;
            }
            let deleted = js_sys::Reflect::get(&value, &"_deleted".into())
                .ok()
                .and_then(|v| v.as_bool())
                == Some(true);
            if deleted {
                let id = super::check_id_value(
                    &js_sys::Reflect::get(&value, &"_id".into()).unwrap_or_default(),
                )
                .map_err(|e| bad(e.to_string()))?;
                let rev = crate::error::get_str(&value, "_rev")
                    .ok_or_else(|| bad("tombstone without _rev".into()))?;
                let rev = Rev::parse(&rev).map_err(|e| bad(e.0))?;
                let object = tombstone(&id, &rev.to_string());
                // A snapshot keeps when the record was deleted (purgeTombstones' clock).
                if let Some(at) = js_sys::Reflect::get(&value, &"deletedAt".into())
                    .ok()
                    .and_then(|v| v.as_f64())
                    .filter(|at| at.is_finite())
                {
                    set(&object, "deletedAt", &at.into());
                }
                items.push(Imported {
                    object: object.into(),
                    id,
                    rev,
                    deleted: true,
                });
            } else {
                let p: Prepared = Store::prepare(&value).map_err(|e| bad(e.to_string()))?;
                if p.updated_at.is_none() {
                    set(&p.object, "updatedAt", &super::now_iso().into());
                }
                let rev = p
                    .expected
                    .clone()
                    .ok_or_else(|| bad("record without _rev".into()))?;
                items.push(Imported {
                    id: p.id,
                    rev,
                    deleted: false,
                    object: p.object.into(),
                });
            }
        }
        self.write_imported(items, on_progress).await
    }

    async fn write_imported(
        &self,
        items: Vec<Imported>,
        on_progress: Option<&Function>,
    ) -> Result<ImportCounts> {
        let tx = self.write_tx()?;
        let (currents, state) = futures::join!(
            read_many(&tx, items.iter().map(|i| &i.id)),
            self.write_indexes(&tx)
        );
        let (currents, state) = (currents?, state?);
        let mut changes = Vec::new();
        let records = tx.store(RECORDS)?;
        let tombs = tx.store(TOMBSTONES)?;
        let mut counts = ImportCounts::default();
        let total = items.len();
        let mut last = None;
        for (n, (item, (current, stored))) in items.iter().zip(&currents).enumerate() {
            if current.rev().is_some_and(|r| *r >= item.rev) {
                counts.kept_newer += 1;
            } else {
                let key = JsValue::from(item.id.clone());
                if item.deleted {
                    tombs.put(&item.object, None)?;
                    if matches!(current, Current::Live(_)) {
                        records.delete(key)?;
                    }
                } else {
                    last = Some(records.put(&item.object, None)?);
                    if matches!(current, Current::Deleted(_)) {
                        tombs.delete(key)?;
                    }
                }
                index::maintain(
                    &tx,
                    &state,
                    stored.as_ref(),
                    (!item.deleted).then_some(&item.object),
                )?;
                changes.push((
                    JsValue::from(item.id.clone()),
                    item.rev.to_string(),
                    item.deleted,
                ));
                counts.written += 1;
            }
            if let Some(cb) = on_progress {
                if (n + 1) % PROGRESS_EVERY == 0 || n + 1 == total {
                    // A synchronous callback keeps the transaction active.
                    let _ = cb.call2(
                        &JsValue::NULL,
                        &JsValue::from(n as u32 + 1),
                        &JsValue::from(total as u32),
                    );
                }
            }
        }
        if let Some(req) = last {
            req.await?;
        }
        self.finish(tx).await?;
        self.changes.post(&changes);
        Ok(counts)
    }

    /// Read-modify-write of one record with `f(current | null)`; `f`
    /// returning `undefined` writes nothing (`Ok(None)`).
    ///
    /// A synchronous `f` is called inside the write transaction, between the
    /// read and the write (only IndexedDB is awaited there), so it cannot
    /// conflict. An async `f` (it returns a thenable) is awaited OUTSIDE any
    /// transaction — awaiting a foreign promise inside one would auto-commit
    /// it — and its result is written with the revision it was given; on a
    /// conflict the whole read-apply-write is retried after a full-jitter
    /// backoff, at most `retries` more times.
    ///
    /// # Errors
    /// ConflictError with `attempts` when retries run out; AbortError when
    /// `signal` aborts; whatever `f` throws, unchanged; ValidationError when
    /// `f` returns something that is not a valid record.
    pub async fn mutate(
        &self,
        id: &JsValue,
        f: &Function,
        retries: u32,
        signal: Option<&AbortSignal>,
    ) -> Result<Option<Written>> {
        let id = super::check_id_value(id)?;
        let mut attempt = 0u32;
        loop {
            check_abort(signal)?;
            let tx = self.write_tx()?;
            let (cur, state) =
                futures::join!(super::read_current(&tx, &id), self.write_indexes(&tx));
            let ((current, stored), state) = (cur?, state?);
            let out = f
                .call1(&JsValue::NULL, stored.as_ref().unwrap_or(&JsValue::NULL))
                .map_err(StoreError::Thrown)?;
            let live_rev = match &current {
                Current::Live(r) => Some(r.to_string()),
                _ => None,
            };
            if !(out.has_type::<Promise>() || is_thenable(&out)) {
                // A synchronous function ran inside the write transaction:
                // nothing can change between its read and its write, so this
                // attempt cannot conflict (only IndexedDB was awaited).
                let Some(p) = mutate_result(&id, out, live_rev.as_deref())? else {
                    return Ok(None);
                };
                return self
                    .cas_write(tx, &state, &current, stored, p)
                    .await
                    .map(Some);
            }
            // An async function: end the (unwritten) transaction, await it
            // outside, then compare-and-swap against the revision it saw.
            tx.end_read();
            let out = wasm_bindgen_futures::JsFuture::from(Promise::resolve(&out))
                .await
                .map_err(StoreError::Thrown)?;
            check_abort(signal)?;
            let Some(prepared) = mutate_result(&id, out, live_rev.as_deref())? else {
                return Ok(None);
            };
            match self.put_prepared(prepared).await {
                Ok(w) => return Ok(Some(w)),
                Err(StoreError::Conflict {
                    id,
                    id_text,
                    expected_rev,
                    current_rev,
                    current,
                    ..
                }) if attempt >= retries => {
                    return Err(StoreError::Conflict {
                        id,
                        id_text,
                        expected_rev,
                        current_rev,
                        current,
                        attempts: Some(attempt + 1),
                    })
                }
                Err(StoreError::Conflict { .. }) => {
                    let delay = full_jitter_ms(
                        attempt,
                        MUTATE_BASE_MS,
                        MUTATE_CAP_MS,
                        js_sys::Math::random(),
                    );
                    super::db::sleep(delay as u32).await;
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// The record `mutate` writes for the function's result `out`: `None` for
/// `undefined`; `_id` forced to `id`, `_rev` set to the revision read.
fn mutate_result(id: &JsString, out: JsValue, read_rev: Option<&str>) -> Result<Option<Prepared>> {
    if out.is_undefined() {
        return Ok(None);
    }
    if !out.is_object() || js_sys::Array::is_array(&out) {
        return Err(StoreError::validation(
            "the mutate function must return a record object or undefined",
        ));
    }
    let next = Object::assign(&Object::new(), out.unchecked_ref());
    set(&next, "_id", id);
    match read_rev {
        Some(r) => set(&next, "_rev", &r.into()),
        None => {
            let _ = js_sys::Reflect::delete_property(&next, &"_rev".into());
        }
    }
    Store::prepare(&next).map(Some)
}

fn is_thenable(v: &JsValue) -> bool {
    v.is_object() && js_sys::Reflect::get(v, &"then".into()).is_ok_and(|t| t.is_function())
}

/// Fails with AbortError (carrying `signal.reason`) once `signal` is aborted.
pub(crate) fn check_abort(signal: Option<&AbortSignal>) -> Result<()> {
    match signal {
        Some(s) if s.aborted() => Err(StoreError::Aborted(s.reason())),
        _ => Ok(()),
    }
}
