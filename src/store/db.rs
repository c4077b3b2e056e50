//! The IndexedDB connection: opening (with a blocked timeout and
//! `versionchange` handling) and running transactions.
//!
//! The open path uses web-sys directly because it needs the open request's
//! `blocked` event and the connection's `versionchange` event; transactions go
//! through the `idb` crate, keeping a handle on the raw `IDBTransaction` so an
//! abort reports the transaction's own `error` (a `QuotaExceededError` often
//! arrives only there, with the request's error null — case C-E2).

use crate::error::{Result, StoreError};
use futures::future::{select, Either};
use idb::{Transaction, TransactionMode, TransactionResult};
use js_sys::{Array, Function, Reflect};
use std::cell::RefCell;
use std::rc::Rc;
use wasm_bindgen::prelude::Closure;
use wasm_bindgen::{JsCast, JsValue};
use web_sys::{IdbDatabase, IdbFactory, IdbOpenDbRequest, IdbTransaction};

/// Object store of live records, keyed by `_id`.
pub const RECORDS: &str = "records";
/// Object store of tombstones `{_id, _rev, _deleted: true}`, keyed by `_id`.
/// Kept apart from live records so listings are plain `getAll` ranges.
pub const TOMBSTONES: &str = "tombstones";
/// Object store for store metadata (out-of-line keys).
pub const META: &str = "meta";
/// Object store for derived index entries (out-of-line keys).
pub const DERIVED: &str = "derived";
/// Native index on `records` over `["recordType", "_id"]`, for `list({type})`.
pub const BY_TYPE: &str = "byType";
/// Schema version of the IndexedDB database.
pub const SCHEMA_VERSION: u32 = 1;

/// An open connection plus the closures that must live as long as it does.
pub struct Db {
    raw: IdbDatabase,
    /// Set when the connection was closed, with the reason, so later calls
    /// fail with ClosedError instead of an opaque InvalidStateError.
    closed: Rc<RefCell<Option<String>>>,
    /// Keeps the `versionchange` handler alive.
    _on_version_change: Closure<dyn FnMut(web_sys::IdbVersionChangeEvent)>,
}

impl Db {
    /// Opens (creating or upgrading) database `name`.
    ///
    /// `on_version_change` is called (with no arguments) after another tab's
    /// upgrade made this connection close itself.
    ///
    /// # Errors
    /// BlockedError when another connection keeps the upgrade blocked longer
    /// than `blocked_timeout_ms`; TransactionError for other open failures.
    pub async fn open(
        name: &str,
        version: u32,
        blocked_timeout_ms: u32,
        on_version_change: Option<Function>,
    ) -> Result<Db> {
        let factory: IdbFactory = Reflect::get(&js_sys::global(), &"indexedDB".into())
            .ok()
            .and_then(|f| f.dyn_into().ok())
            .ok_or_else(|| {
                StoreError::Transaction("IndexedDB is not available in this context".into())
            })?;
        let request = factory
            .open_with_u32(name, version.max(SCHEMA_VERSION))
            .map_err(|e| StoreError::from_dom(&e))?;

        let upgrade = Closure::<dyn FnMut(web_sys::Event)>::new(|event: web_sys::Event| {
            if let Some(req) = event
                .target()
                .and_then(|t| t.dyn_into::<IdbOpenDbRequest>().ok())
            {
                if let Ok(db) = req.result().and_then(|d| d.dyn_into::<IdbDatabase>()) {
                    let _ = create_schema(&db);
                }
            }
        });
        request.set_onupgradeneeded(Some(upgrade.as_ref().unchecked_ref()));

        let done = request_promise(&request);
        let opened = wasm_bindgen_futures::JsFuture::from(done);
        // The timeout runs from the start of the open, not from the
        // `blocked` event: an open queued behind another tab's pending
        // upgrade never receives `blocked` and would otherwise hang.
        let timeout = gloo_timers::future::TimeoutFuture::new(blocked_timeout_ms);
        let raw = match select(Box::pin(opened), Box::pin(timeout)).await {
            Either::Left((Ok(db), _)) => db.unchecked_into::<IdbDatabase>(),
            Either::Left((Err(e), _)) => return Err(StoreError::from_dom(&e)),
            Either::Right(_) => {
                // Give up, but close the connection if the open completes later
                // so this abandoned request never blocks anyone in turn.
                let closer = Closure::once_into_js(move |event: web_sys::Event| {
                    if let Some(req) = event
                        .target()
                        .and_then(|t| t.dyn_into::<IdbOpenDbRequest>().ok())
                    {
                        if let Ok(db) = req.result().and_then(|d| d.dyn_into::<IdbDatabase>()) {
                            db.close();
                        }
                    }
                });
                request.set_onsuccess(Some(closer.unchecked_ref()));
                return Err(StoreError::Blocked(name.to_owned(), blocked_timeout_ms));
            }
        };
        request.set_onupgradeneeded(None);
        drop(upgrade);

        let closed = Rc::new(RefCell::new(None));
        let closed2 = closed.clone();
        let raw2 = raw.clone();
        let on_vc = Closure::<dyn FnMut(web_sys::IdbVersionChangeEvent)>::new(move |_| {
            raw2.close();
            *closed2.borrow_mut() = Some("another tab upgraded or deleted the database".to_owned());
            if let Some(cb) = &on_version_change {
                let _ = cb.call0(&JsValue::NULL);
            }
        });
        raw.set_onversionchange(Some(on_vc.as_ref().unchecked_ref()));
        Ok(Db {
            raw,
            closed,
            _on_version_change: on_vc,
        })
    }

    /// Closes the connection (after running transactions finish).
    pub fn close(&self) {
        self.raw.close();
        self.closed
            .borrow_mut()
            .get_or_insert_with(|| "close() was called".to_owned());
    }

    /// Starts a transaction over `stores`.
    ///
    /// # Errors
    /// ClosedError after `close()` or a `versionchange`.
    pub fn tx(&self, stores: &[&str], mode: TransactionMode) -> Result<Tx> {
        if let Some(why) = self.closed.borrow().as_ref() {
            return Err(StoreError::Closed(why.clone()));
        }
        let names: Array = stores.iter().map(|s| JsValue::from_str(s)).collect();
        let mode = match mode {
            TransactionMode::ReadOnly => web_sys::IdbTransactionMode::Readonly,
            _ => web_sys::IdbTransactionMode::Readwrite,
        };
        let raw = self
            .raw
            .transaction_with_str_sequence_and_mode(&names, mode)
            .map_err(|e| StoreError::from_dom(&e))?;
        Ok(Tx {
            tx: Transaction::from(raw.clone()),
            raw,
        })
    }
}

impl Drop for Db {
    /// A dropped store closes its connection, so it never blocks another
    /// tab's upgrade.
    fn drop(&mut self) {
        self.raw.set_onversionchange(None);
        self.raw.close();
    }
}

/// A transaction and its raw handle (to read `error` after an abort).
pub struct Tx {
    /// The idb wrapper used for requests.
    pub tx: Transaction,
    raw: IdbTransaction,
}

impl Tx {
    /// An object store of this transaction.
    pub fn store(&self, name: &str) -> Result<idb::ObjectStore> {
        Ok(self.tx.object_store(name)?)
    }

    /// Waits for the transaction to commit.
    ///
    /// # Errors
    /// QuotaExceededError when the browser aborted it for quota (reported on
    /// the transaction, not the request); TransactionError for other aborts.
    pub async fn commit(self) -> Result<()> {
        let raw = self.raw;
        match self.tx.await {
            Ok(TransactionResult::Committed) => Ok(()),
            Ok(TransactionResult::Aborted) => Err(abort_error(&raw)),
            Err(e) => Err(raw
                .error()
                .map_or_else(|| StoreError::from(e), |d| StoreError::from_dom(d.as_ref()))),
        }
    }

    /// Ends a read-only transaction without waiting for its `complete` event:
    /// its reads are final once their requests succeeded, and waiting for the
    /// commit of a transaction that wrote nothing only adds latency.
    pub fn end_read(self) {}

    /// Aborts the transaction: nothing it wrote is kept.
    pub fn abort(&self) {
        let _ = self.raw.abort();
    }
}

fn abort_error(raw: &IdbTransaction) -> StoreError {
    match raw.error() {
        Some(d) => StoreError::from_dom(d.as_ref()),
        None => StoreError::Transaction("the transaction was aborted".into()),
    }
}

fn create_schema(db: &IdbDatabase) -> std::result::Result<(), JsValue> {
    let names = db.object_store_names();
    let key_id = web_sys::IdbObjectStoreParameters::new();
    key_id.set_key_path(&JsValue::from_str("_id"));
    if !names.contains(RECORDS) {
        let records = db.create_object_store_with_optional_parameters(RECORDS, &key_id)?;
        let path: Array = ["recordType", "_id"]
            .iter()
            .map(|s| JsValue::from_str(s))
            .collect();
        records.create_index_with_str_sequence(BY_TYPE, &path)?;
    }
    if !names.contains(TOMBSTONES) {
        db.create_object_store_with_optional_parameters(TOMBSTONES, &key_id)?;
    }
    for name in [META, DERIVED] {
        if !names.contains(name) {
            db.create_object_store(name)?;
        }
    }
    Ok(())
}

/// A Promise settled by an IDB request's `success` / `error` events
/// (resolves with `result`, rejects with the request's DOMException).
pub(crate) fn request_promise(request: &web_sys::IdbRequest) -> js_sys::Promise {
    let request = request.clone();
    js_sys::Promise::new(&mut move |resolve: Function, reject: Function| {
        let r = request.clone();
        let ok = Closure::once_into_js(move |_e: web_sys::Event| {
            let _ = resolve.call1(&JsValue::NULL, &r.result().unwrap_or(JsValue::NULL));
        });
        let r = request.clone();
        let err = Closure::once_into_js(move |_e: web_sys::Event| {
            let e = r
                .error()
                .ok()
                .flatten()
                .map_or(JsValue::NULL, JsValue::from);
            let _ = reject.call1(&JsValue::NULL, &e);
        });
        request.set_onsuccess(Some(ok.unchecked_ref()));
        request.set_onerror(Some(err.unchecked_ref()));
    })
}
