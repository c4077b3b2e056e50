//! The lease journal: every held lease is written to its own IndexedDB
//! database (default `"agentstore-leases"`, apart from the record store) when
//! claimed and removed when it ends, so the next page can release (or resume)
//! leases a closed or reloaded page still held, instead of leaving them to
//! expire after the TTL.
//!
//! Each call is one short transaction that awaits only its IndexedDB requests.

use std::cell::RefCell;
use std::rc::Rc;

use js_sys::{Array, Function, Promise, Reflect};
use serde::{Deserialize, Serialize};
use wasm_bindgen::closure::Closure;
use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_futures::JsFuture;

use crate::store::db::request_promise;
use web_sys::{IdbDatabase, IdbFactory, IdbOpenDbRequest, IdbTransaction, IdbTransactionMode};

use super::http::describe;

/// Default database name of the journal.
pub const DEFAULT_NAME: &str = "agentstore-leases";
const STORE: &str = "leases";

/// One journalled lease.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Entry {
    /// The server's base URL.
    pub base: String,
    /// The item.
    pub item_id: i64,
    /// The lease token (the credential for release).
    pub token: String,
    /// The claim's epoch.
    pub epoch: u64,
    /// The queue it came from.
    pub queue: String,
    /// TTL (ms).
    pub ttl_ms: u64,
    /// Heartbeat interval (ms).
    pub heartbeat_ms: u64,
}

fn key(base: &str, item_id: i64) -> JsValue {
    let k = Array::new();
    k.push(&base.into());
    k.push(&JsValue::from(item_id as f64));
    k.into()
}

/// A lazily opened journal; `None` name = disabled (every call is a no-op).
#[derive(Clone)]
pub struct Journal {
    name: Option<String>,
    db: Rc<RefCell<Option<IdbDatabase>>>,
}

impl Journal {
    /// A journal in database `name` (`None` disables it).
    pub fn new(name: Option<String>) -> Journal {
        Journal {
            name,
            db: Rc::new(RefCell::new(None)),
        }
    }

    async fn open(&self) -> Result<Option<IdbDatabase>, String> {
        let Some(name) = &self.name else {
            return Ok(None);
        };
        if let Some(db) = self.db.borrow().as_ref() {
            return Ok(Some(db.clone()));
        }
        let factory: IdbFactory = Reflect::get(&js_sys::global(), &"indexedDB".into())
            .ok()
            .and_then(|f| f.dyn_into().ok())
            .ok_or_else(|| String::from("IndexedDB is not available in this context"))?;
        let req = factory.open_with_u32(name, 1).map_err(|e| describe(&e))?;
        let upgrade = Closure::<dyn FnMut(web_sys::Event)>::new(|ev: web_sys::Event| {
            let db = ev
                .target()
                .and_then(|t| t.dyn_into::<IdbOpenDbRequest>().ok())
                .and_then(|r| r.result().ok())
                .and_then(|d| d.dyn_into::<IdbDatabase>().ok());
            if let Some(db) = db {
                if !db.object_store_names().contains(STORE) {
                    let _ = db.create_object_store(STORE);
                }
            }
        });
        req.set_onupgradeneeded(Some(upgrade.as_ref().unchecked_ref()));
        let result = JsFuture::from(request_promise(req.as_ref())).await;
        req.set_onupgradeneeded(None);
        let db: IdbDatabase = result.map_err(|e| describe(&e))?.unchecked_into();
        // Never block another page's upgrade of the journal.
        let d2 = db.clone();
        let slot = self.db.clone();
        let on_vc = Closure::<dyn FnMut()>::new(move || {
            d2.close();
            *slot.borrow_mut() = None;
        });
        db.set_onversionchange(Some(on_vc.as_ref().unchecked_ref()));
        on_vc.forget();
        *self.db.borrow_mut() = Some(db.clone());
        Ok(Some(db))
    }

    fn tx(db: &IdbDatabase, mode: IdbTransactionMode) -> Result<IdbTransaction, String> {
        db.transaction_with_str_and_mode(STORE, mode)
            .map_err(|e| describe(&e))
    }

    /// Writes (or overwrites) an entry.
    ///
    /// # Errors
    /// The database could not be opened or the transaction failed.
    pub async fn put(&self, e: &Entry) -> Result<(), String> {
        let Some(db) = self.open().await? else {
            return Ok(());
        };
        // Stored as a structured-clone object, not JSON text.
        let value = super::http::to_js(e);
        let tx = Self::tx(&db, IdbTransactionMode::Readwrite)?;
        let done = tx_promise(&tx);
        let store = tx.object_store(STORE).map_err(|e| describe(&e))?;
        store
            .put_with_key(&value, &key(&e.base, e.item_id))
            .map_err(|e| describe(&e))?;
        JsFuture::from(done)
            .await
            .map(|_| ())
            .map_err(|e| describe(&e))
    }

    /// Removes an entry (absent is fine).
    ///
    /// # Errors
    /// As [`Journal::put`].
    pub async fn delete(&self, base: &str, item_id: i64) -> Result<(), String> {
        let Some(db) = self.open().await? else {
            return Ok(());
        };
        let tx = Self::tx(&db, IdbTransactionMode::Readwrite)?;
        let done = tx_promise(&tx);
        let store = tx.object_store(STORE).map_err(|e| describe(&e))?;
        store
            .delete(&key(base, item_id))
            .map_err(|e| describe(&e))?;
        JsFuture::from(done)
            .await
            .map(|_| ())
            .map_err(|e| describe(&e))
    }

    /// Every entry for `base`, in item id order.
    ///
    /// # Errors
    /// As [`Journal::put`].
    pub async fn list(&self, base: &str) -> Result<Vec<Entry>, String> {
        let Some(db) = self.open().await? else {
            return Ok(Vec::new());
        };
        let tx = Self::tx(&db, IdbTransactionMode::Readonly)?;
        let store = tx.object_store(STORE).map_err(|e| describe(&e))?;
        let req = store.get_all().map_err(|e| describe(&e))?;
        let all = JsFuture::from(request_promise(&req))
            .await
            .map_err(|e| describe(&e))?;
        let mut out = Vec::new();
        for v in Array::from(&all).iter() {
            let parsed = serde_wasm_bindgen::from_value::<Entry>(v).ok();
            // Entries of other servers, or unreadable ones, are left alone.
            if let Some(e) = parsed.filter(|e| e.base == base) {
                out.push(e);
            }
        }
        Ok(out)
    }
}

/// A Promise resolved when the transaction commits, rejected when it aborts.
fn tx_promise(tx: &IdbTransaction) -> Promise {
    let tx = tx.clone();
    Promise::new(&mut move |resolve: Function, reject: Function| {
        let ok = Closure::once_into_js(move || {
            let _ = resolve.call0(&JsValue::NULL);
        });
        let t = tx.clone();
        let reject2 = reject.clone();
        let err = Closure::once_into_js(move || {
            let e = t.error().map_or(JsValue::NULL, JsValue::from);
            let _ = reject2.call1(&JsValue::NULL, &e);
        });
        tx.set_oncomplete(Some(ok.unchecked_ref()));
        tx.set_onabort(Some(err.unchecked_ref()));
    })
}
