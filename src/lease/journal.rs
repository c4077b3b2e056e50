//! The lease journal: every held lease is written to its own IndexedDB
//! database (default `"agentstore-leases"`, apart from the record store) when
//! claimed and removed when it ends, so the next page can release (or resume)
//! leases a closed or reloaded page still held, instead of leaving them to
//! expire after the TTL.
//!
//! Each call is one short transaction through the crate's one IndexedDB layer
//! ([`crate::store::db`]); entries are stored as structured-clone objects.

use std::cell::RefCell;
use std::rc::Rc;

use super::wire::FromWire;
use js_sys::Array;
use wasm_bindgen::closure::Closure;
use wasm_bindgen::{JsCast, JsValue};

use crate::store::db::{Db, TransactionMode};

/// Default database name of the journal.
pub const DEFAULT_NAME: &str = "agentstore-leases";
const STORE: &str = "leases";
/// How long opening the journal may wait behind another context's upgrade (ms).
const OPEN_TIMEOUT_MS: u32 = 10_000;

/// One journalled lease, stored as `{base, itemId, token, epoch, queue, ttlMs, heartbeatMs, locked}`
/// ([`super::wire`]).
#[derive(Clone, PartialEq, Eq)]
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
    /// Whether the claiming context holds (or queued for) the item's Web Lock.
    /// An entry without one (`webLocks: false`, or no `navigator.locks`)
    /// cannot be told apart from a live context's lease, so `recover()` leaves
    /// it alone. Entries written before the field existed count as locked.
    pub locked: bool,
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
    db: Rc<RefCell<Option<Rc<Db>>>>,
}

impl Journal {
    /// A journal in database `name` (`None` disables it).
    pub fn new(name: Option<String>) -> Journal {
        Journal {
            name,
            db: Rc::new(RefCell::new(None)),
        }
    }

    async fn open(&self) -> Result<Option<Rc<Db>>, String> {
        let Some(name) = &self.name else {
            return Ok(None);
        };
        if let Some(db) = self.db.borrow().as_ref() {
            return Ok(Some(db.clone()));
        }
        // Another context upgrading the journal closes this connection (the
        // layer does that); the next call opens a new one.
        let slot = self.db.clone();
        let on_vc = Closure::once_into_js(move || {
            slot.borrow_mut().take();
        });
        let db = Db::open_with(
            name,
            1,
            OPEN_TIMEOUT_MS,
            crate::store::db::Schema::Journal,
            Some(on_vc.unchecked_into()),
        )
        .await
        .map_err(|e| e.message())?;
        let db = Rc::new(db);
        *self.db.borrow_mut() = Some(db.clone());
        Ok(Some(db))
    }

    /// Writes (or overwrites) an entry.
    ///
    /// # Errors
    /// The database could not be opened or the transaction failed.
    pub async fn put(&self, e: &Entry) -> Result<(), String> {
        let Some(db) = self.open().await? else {
            return Ok(());
        };
        let value = super::http::to_js(e);
        let tx = db
            .tx(&[STORE], TransactionMode::ReadWrite)
            .map_err(|e| e.message())?;
        let store = tx.store(STORE).map_err(|e| e.message())?;
        store
            .put(&value, Some(&key(&e.base, e.item_id)))
            .map_err(|e| e.message())?;
        tx.commit().await.map_err(|e| e.message())
    }

    /// Removes the entry of `item_id` if it still holds `token` (absent is
    /// fine). Read and delete are one transaction: an entry another claim of
    /// the same item wrote meanwhile (a new token) stays.
    ///
    /// # Errors
    /// As [`Journal::put`].
    pub async fn delete(&self, base: &str, item_id: i64, token: &str) -> Result<(), String> {
        let Some(db) = self.open().await? else {
            return Ok(());
        };
        let tx = db
            .tx(&[STORE], TransactionMode::ReadWrite)
            .map_err(|e| e.message())?;
        let store = tx.store(STORE).map_err(|e| e.message())?;
        let k = key(base, item_id);
        let held = store
            .get(k.clone())
            .map_err(|e| e.message())?
            .await
            .map_err(|e| e.message())?
            .and_then(|v| crate::value::get(&v, &"token".into()).ok())
            // Bounded: another script of the origin may have written a
            // huge one (a real token is 43 characters).
            .and_then(|t| crate::value::short_string(&t, 8192));
        if held.as_deref() == Some(token) {
            store.delete(k).map_err(|e| e.message())?;
        }
        tx.commit().await.map_err(|e| e.message())
    }

    /// Every entry for `base`, in item id order.
    ///
    /// # Errors
    /// As [`Journal::put`].
    pub async fn list(&self, base: &str) -> Result<Vec<Entry>, String> {
        let Some(db) = self.open().await? else {
            return Ok(Vec::new());
        };
        let tx = db
            .tx(&[STORE], TransactionMode::ReadOnly)
            .map_err(|e| e.message())?;
        let store = tx.store(STORE).map_err(|e| e.message())?;
        let all = store
            .get_all(None, None)
            .map_err(|e| e.message())?
            .await
            .map_err(|e| e.message())?;
        tx.end_read();
        // Entries of other servers, or unreadable ones, are left alone;
        // each field is bounded before it is copied (another script of the
        // origin may have written anything into the database).
        let mut out = Vec::new();
        for v in &all {
            if let Some(e) = Entry::from_wire(v) {
                if e.base == base {
                    out.push(e);
                }
            }
        }
        Ok(out)
    }
}
