//! The one IndexedDB layer of the SDK: opening (with a blocked timeout and
//! `versionchange` handling), transactions, and requests as futures — a thin
//! wrapper over web-sys (the `idb` crate it replaced cost ~12 kB of wasm for
//! one monomorphised future type per request kind).
//!
//! A request is issued synchronously ([`ObjectStore::put`] …) and becomes a
//! future only when awaited: an unawaited `put` costs no Promise and no
//! closure, and awaiting a request that already finished reads its result
//! directly. A transaction's abort reports the transaction's own `error` (a
//! `QuotaExceededError` often arrives only there, with the request's error
//! null — case C-E2).
//!
//! **All or nothing.** A readwrite [`Tx`] that is dropped without
//! [`Tx::commit`] or [`Tx::end_read`] aborts: any failure after a write
//! transaction's first request (an error returned with `?`, a request that
//! throws synchronously such as a `DataCloneError`, a panic-free early
//! return) leaves nothing of it behind.

use crate::error::{Result, StoreError};
use js_sys::{Array, Function, Reflect};
use std::cell::{Cell, RefCell};
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use wasm_bindgen::prelude::Closure;
use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_futures::JsFuture;
use web_sys::{
    IdbCursorDirection, IdbCursorWithValue, IdbDatabase, IdbFactory, IdbKeyRange, IdbObjectStore,
    IdbOpenDbRequest, IdbRequest, IdbRequestReadyState, IdbTransaction,
};

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
    /// Transactions started on this connection so far (group commit joins
    /// a group only while no other transaction started after it).
    seq: Cell<u32>,
    /// Keeps the `versionchange` handler alive.
    _on_version_change: Closure<dyn FnMut(web_sys::IdbVersionChangeEvent)>,
}

impl Db {
    /// Opens (creating or upgrading) the record store's database `name`.
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
        Self::open_with(
            name,
            version.max(SCHEMA_VERSION),
            blocked_timeout_ms,
            create_schema,
            on_version_change,
        )
        .await
    }

    /// Opens database `name` at `version`, running `upgrade` on the
    /// connection in `upgradeneeded` (it must create what is missing and
    /// leave what exists). For other databases than the record store (the
    /// lease journal).
    ///
    /// # Errors
    /// As [`Db::open`].
    pub async fn open_with(
        name: &str,
        version: u32,
        blocked_timeout_ms: u32,
        upgrade: fn(&IdbDatabase) -> std::result::Result<(), JsValue>,
        on_version_change: Option<Function>,
    ) -> Result<Db> {
        let request = factory()?
            .open_with_u32(name, version)
            .map_err(|e| StoreError::from_dom(&e))?;

        // An upgrade that refuses with a string (see [`existing_only`]) aborts
        // the versionchange transaction; the open then fails with ClosedError
        // carrying that string.
        let refused: Rc<RefCell<Option<String>>> = Rc::new(RefCell::new(None));
        let refused2 = refused.clone();
        // Set once `upgradeneeded` fired: the open is no longer blocked, and
        // a blocked timeout that fires during its upgrade does not count.
        let upgrading = Rc::new(Cell::new(false));
        let upgrading2 = upgrading.clone();
        let upgrade = Closure::<dyn FnMut(web_sys::Event)>::new(move |event: web_sys::Event| {
            upgrading2.set(true);
            if let Some(req) = event
                .target()
                .and_then(|t| t.dyn_into::<IdbOpenDbRequest>().ok())
            {
                if let Ok(db) = req.result().and_then(|d| d.dyn_into::<IdbDatabase>()) {
                    if let Err(why) = upgrade(&db) {
                        if let Some(why) = why.as_string() {
                            *refused2.borrow_mut() = Some(why);
                            if let Some(tx) = req.transaction() {
                                let _ = tx.abort();
                            }
                        }
                    }
                }
            }
        });
        request.set_onupgradeneeded(Some(upgrade.as_ref().unchecked_ref()));

        let timed_out = JsValue::from(js_sys::Object::new());
        let race = race_blocked(&request, blocked_timeout_ms, &timed_out);
        let mut out = JsFuture::from(race).await;
        if matches!(&out, Ok(v) if *v == timed_out) && upgrading.get() {
            out = JsFuture::from(request_promise(&request)).await;
        }
        let raw = match out {
            Ok(db) if db != timed_out => db.unchecked_into::<IdbDatabase>(),
            Err(e) => {
                return Err(match refused.take() {
                    Some(why) => StoreError::Closed(why),
                    None => StoreError::from_dom(&e),
                })
            }
            Ok(_) => {
                // Give up, but close the connection if the open completes later
                // so this abandoned request never blocks anyone in turn. The
                // upgrade handler stays alive until then: `upgradeneeded` may
                // still fire (once the blocker closes), and calling a dropped
                // closure would throw an uncaught error into the page.
                let keep_upgrade = upgrade;
                let closer = Closure::once_into_js(move |event: web_sys::Event| {
                    drop(keep_upgrade);
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
        request.set_onblocked(None);
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
            seq: Cell::new(0),
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

    /// `Ok` while the connection is open.
    ///
    /// # Errors
    /// ClosedError after `close()` or a `versionchange`.
    pub fn check_open(&self) -> Result<()> {
        match self.closed.borrow().as_ref() {
            Some(why) => Err(StoreError::Closed(why.clone())),
            None => Ok(()),
        }
    }

    /// Starts a transaction over `stores`.
    ///
    /// # Errors
    /// ClosedError after `close()` or a `versionchange`.
    pub fn tx(&self, stores: &[&str], mode: TransactionMode) -> Result<Tx> {
        self.check_open()?;
        self.seq.set(self.seq.get().wrapping_add(1));
        let names: Array = stores.iter().map(|s| JsValue::from_str(s)).collect();
        let write = mode == TransactionMode::ReadWrite;
        let mode = if write {
            web_sys::IdbTransactionMode::Readwrite
        } else {
            web_sys::IdbTransactionMode::Readonly
        };
        let raw = self
            .raw
            .transaction_with_str_sequence_and_mode(&names, mode)
            .map_err(|e| StoreError::from_dom(&e))?;
        Ok(Tx {
            raw,
            open_write: Cell::new(write),
            #[cfg(feature = "test-hooks")]
            fault: Rc::new(Cell::new(None)),
        })
    }
}

impl Db {
    /// How many transactions were started on this connection (wrapping).
    pub fn seq(&self) -> u32 {
        self.seq.get()
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

/// Transaction mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransactionMode {
    /// `"readonly"`.
    ReadOnly,
    /// `"readwrite"`.
    ReadWrite,
}

/// Cursor direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CursorDirection {
    /// Ascending keys.
    Next,
    /// Descending keys.
    Prev,
}

/// An `IDBKeyRange`.
#[derive(Debug, Clone)]
pub struct KeyRange(IdbKeyRange);

impl KeyRange {
    /// `IDBKeyRange.bound(lower, upper, lowerOpen, upperOpen)`.
    ///
    /// # Errors
    /// ValidationError (DataError) for keys IndexedDB refuses or lower > upper.
    pub fn bound(
        lower: &JsValue,
        upper: &JsValue,
        lower_open: Option<bool>,
        upper_open: Option<bool>,
    ) -> Result<KeyRange> {
        IdbKeyRange::bound_with_lower_open_and_upper_open(
            lower,
            upper,
            lower_open.unwrap_or(false),
            upper_open.unwrap_or(false),
        )
        .map(KeyRange)
        .map_err(|e| StoreError::from_dom(&e))
    }

    /// `IDBKeyRange.lowerBound(lower, open)`.
    ///
    /// # Errors
    /// As [`KeyRange::bound`].
    pub fn lower_bound(lower: &JsValue, open: Option<bool>) -> Result<KeyRange> {
        IdbKeyRange::lower_bound_with_open(lower, open.unwrap_or(false))
            .map(KeyRange)
            .map_err(|e| StoreError::from_dom(&e))
    }

    /// `IDBKeyRange.upperBound(upper, open)`.
    ///
    /// # Errors
    /// As [`KeyRange::bound`].
    pub fn upper_bound(upper: &JsValue, open: Option<bool>) -> Result<KeyRange> {
        IdbKeyRange::upper_bound_with_open(upper, open.unwrap_or(false))
            .map(KeyRange)
            .map_err(|e| StoreError::from_dom(&e))
    }
}

/// What a request addresses: one key or a key range.
#[derive(Debug, Clone)]
pub enum Query {
    /// A single key.
    Key(JsValue),
    /// A key range.
    KeyRange(KeyRange),
}

impl From<JsValue> for Query {
    fn from(key: JsValue) -> Query {
        Query::Key(key)
    }
}

impl From<KeyRange> for Query {
    fn from(range: KeyRange) -> Query {
        Query::KeyRange(range)
    }
}

impl From<Query> for JsValue {
    fn from(q: Query) -> JsValue {
        match q {
            Query::Key(k) => k,
            Query::KeyRange(r) => r.0.into(),
        }
    }
}

fn query_js(q: Option<Query>) -> JsValue {
    q.map_or(JsValue::UNDEFINED, JsValue::from)
}

/// A transaction. A readwrite one aborts when dropped before
/// [`Tx::commit`] / [`Tx::end_read`] (see the module docs).
pub struct Tx {
    raw: IdbTransaction,
    /// A readwrite transaction not yet committed or ended: Drop aborts it.
    open_write: Cell<bool>,
    /// Test hook: make the n-th write request of this transaction fail.
    #[cfg(feature = "test-hooks")]
    fault: Rc<Cell<Option<(u32, Fault)>>>,
}

/// How an injected request fault fails (test hook).
#[cfg(feature = "test-hooks")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The request's value cannot be cloned (a function inside it): the
    /// request throws `DataCloneError` synchronously.
    Clone,
    /// The request is an `add()` of a key that exists: it fails
    /// asynchronously with `ConstraintError` and aborts the transaction.
    Constraint,
}

impl Tx {
    /// An object store of this transaction.
    ///
    /// # Errors
    /// TransactionError when `name` is not in the transaction's scope.
    pub fn store(&self, name: &str) -> Result<ObjectStore> {
        Ok(ObjectStore {
            raw: self
                .raw
                .object_store(name)
                .map_err(|e| StoreError::from_dom(&e))?,
            #[cfg(feature = "test-hooks")]
            fault: self.fault.clone(),
        })
    }

    /// Test hook: the `n`-th write request (0-based) issued in this
    /// transaction fails the way `kind` says.
    #[cfg(feature = "test-hooks")]
    pub fn inject_fault(&self, n: u32, kind: Fault) {
        self.fault.set(Some((n, kind)));
    }

    /// Waits for the transaction to commit.
    ///
    /// # Errors
    /// QuotaExceededError when the browser aborted it for quota (reported on
    /// the transaction, not the request); TransactionError for other aborts.
    pub async fn commit(self) -> Result<()> {
        let done = tx_promise(&self.raw);
        self.open_write.set(false);
        let raw = self.raw.clone();
        drop(self);
        JsFuture::from(done)
            .await
            .map(|_| ())
            .map_err(|_| abort_error(&raw))
    }

    /// Ends a transaction without waiting for its `complete` event (a
    /// read-only one, or a readwrite one that wrote nothing): its reads are
    /// final once their requests succeeded, and waiting for the commit of a
    /// transaction that wrote nothing only adds latency.
    pub fn end_read(self) {
        self.open_write.set(false);
    }

    /// Aborts the transaction: nothing it wrote is kept.
    pub fn abort(&self) {
        self.open_write.set(false);
        let _ = self.raw.abort();
    }
}

impl Drop for Tx {
    /// The abort-on-drop guard: a readwrite transaction left behind by an
    /// error keeps nothing of what it wrote.
    fn drop(&mut self) {
        if self.open_write.get() {
            let _ = self.raw.abort();
        }
    }
}

/// An object store inside a [`Tx`]. Requests are issued at once; await the
/// returned [`Req`] for the result.
pub struct ObjectStore {
    raw: IdbObjectStore,
    #[cfg(feature = "test-hooks")]
    fault: Rc<Cell<Option<(u32, Fault)>>>,
}

impl From<ObjectStore> for IdbObjectStore {
    fn from(s: ObjectStore) -> IdbObjectStore {
        s.raw
    }
}

/// An index of an object store inside a [`Tx`].
pub struct Index(web_sys::IdbIndex);

impl From<Index> for web_sys::IdbIndex {
    fn from(i: Index) -> web_sys::IdbIndex {
        i.0
    }
}

fn issued<T>(r: std::result::Result<IdbRequest, JsValue>, map: fn(JsValue) -> T) -> Result<Req<T>> {
    r.map(|req| Req { req, map })
        .map_err(|e| StoreError::from_dom(&e))
}

fn as_option(v: JsValue) -> Option<JsValue> {
    (!v.is_undefined()).then_some(v)
}

fn as_vec(v: JsValue) -> Vec<JsValue> {
    v.dyn_into::<Array>()
        .map(|a| a.to_vec())
        .unwrap_or_default()
}

fn as_u32(v: JsValue) -> u32 {
    v.as_f64().unwrap_or(0.0) as u32
}

fn as_cursor(v: JsValue) -> Option<IdbCursorWithValue> {
    v.dyn_into().ok()
}

fn direction(d: Option<CursorDirection>) -> IdbCursorDirection {
    match d {
        Some(CursorDirection::Prev) => IdbCursorDirection::Prev,
        _ => IdbCursorDirection::Next,
    }
}

impl ObjectStore {
    /// `get(key)`: the stored value, or `None`.
    ///
    /// # Errors
    /// As IndexedDB's request (DataError for an invalid key, ...).
    pub fn get(&self, key: impl Into<Query>) -> Result<Req<Option<JsValue>>> {
        issued(self.raw.get(&key.into().into()), as_option)
    }

    /// `put(value, key?)`.
    ///
    /// # Errors
    /// ValidationError for a value IndexedDB cannot clone (DataCloneError)
    /// or a bad key (DataError); ClosedError after the transaction ended.
    pub fn put(&self, value: &JsValue, key: Option<&JsValue>) -> Result<Req<JsValue>> {
        self.write(value, key, false)
    }

    /// `add(value, key?)`: like [`ObjectStore::put`], but the request fails
    /// with ConstraintError (aborting the transaction) when the key exists.
    ///
    /// # Errors
    /// As [`ObjectStore::put`].
    pub fn add(&self, value: &JsValue, key: Option<&JsValue>) -> Result<Req<JsValue>> {
        self.write(value, key, true)
    }

    /// The one body of [`ObjectStore::put`] and [`ObjectStore::add`]: the
    /// test hooks' injected faults, then the request.
    fn write(&self, value: &JsValue, key: Option<&JsValue>, add: bool) -> Result<Req<JsValue>> {
        #[cfg(feature = "test-hooks")]
        if let Some(r) = self.faulty(value, key) {
            return r;
        }
        issued(
            match (key, add) {
                (Some(k), true) => self.raw.add_with_key(value, k),
                (None, true) => self.raw.add(value),
                (Some(k), false) => self.raw.put_with_key(value, k),
                (None, false) => self.raw.put(value),
            },
            |v| v,
        )
    }

    /// `delete(key or range)`.
    ///
    /// # Errors
    /// As IndexedDB's request.
    pub fn delete(&self, query: impl Into<Query>) -> Result<Req<JsValue>> {
        issued(self.raw.delete(&query.into().into()), |v| v)
    }

    /// `getAll(query?, count?)`.
    ///
    /// # Errors
    /// As IndexedDB's request.
    pub fn get_all(&self, query: Option<Query>, count: Option<u32>) -> Result<Req<Vec<JsValue>>> {
        let q = query_js(query);
        issued(
            match count {
                Some(n) => self.raw.get_all_with_key_and_limit(&q, n),
                None => self.raw.get_all_with_key(&q),
            },
            as_vec,
        )
    }

    /// `getAllKeys(query?, count?)`.
    ///
    /// # Errors
    /// As IndexedDB's request.
    pub fn get_all_keys(
        &self,
        query: Option<Query>,
        count: Option<u32>,
    ) -> Result<Req<Vec<JsValue>>> {
        let q = query_js(query);
        issued(
            match count {
                Some(n) => self.raw.get_all_keys_with_key_and_limit(&q, n),
                None => self.raw.get_all_keys_with_key(&q),
            },
            as_vec,
        )
    }

    /// `count(query?)`.
    ///
    /// # Errors
    /// As IndexedDB's request.
    pub fn count(&self, query: Option<Query>) -> Result<Req<u32>> {
        issued(self.raw.count_with_key(&query_js(query)), as_u32)
    }

    /// `openCursor(query?, direction?)`: resolves to the first position, or
    /// `None`; walk it with [`collect_cursor`].
    ///
    /// # Errors
    /// As IndexedDB's request.
    pub fn open_cursor(
        &self,
        query: Option<Query>,
        dir: Option<CursorDirection>,
    ) -> Result<Req<Option<IdbCursorWithValue>>> {
        issued(
            self.raw
                .open_cursor_with_range_and_direction(&query_js(query), direction(dir)),
            as_cursor,
        )
    }

    /// The store's index `name`.
    ///
    /// # Errors
    /// TransactionError when there is no such index.
    pub fn index(&self, name: &str) -> Result<Index> {
        self.raw
            .index(name)
            .map(Index)
            .map_err(|e| StoreError::from_dom(&e))
    }

    #[cfg(feature = "test-hooks")]
    fn faulty(&self, value: &JsValue, key: Option<&JsValue>) -> Option<Result<Req<JsValue>>> {
        let (n, kind) = self.fault.get()?;
        if n > 0 {
            self.fault.set(Some((n - 1, kind)));
            return None;
        }
        self.fault.set(None);
        let put = |v: &JsValue| match key {
            Some(k) => self.raw.put_with_key(v, k),
            None => self.raw.put(v),
        };
        Some(match kind {
            Fault::Clone => {
                let bad = js_sys::Object::new();
                let _ = Reflect::set(&bad, &"fn".into(), &Function::new_no_args(""));
                issued(put(&bad), |v| v)
            }
            Fault::Constraint => {
                let _ = put(value);
                issued(
                    match key {
                        Some(k) => self.raw.add_with_key(value, k),
                        None => self.raw.add(value),
                    },
                    |v| v,
                )
            }
        })
    }
}

impl Index {
    /// `openCursor(query?, direction?)` on the index.
    ///
    /// # Errors
    /// As IndexedDB's request.
    pub fn open_cursor(
        &self,
        query: Option<Query>,
        dir: Option<CursorDirection>,
    ) -> Result<Req<Option<IdbCursorWithValue>>> {
        issued(
            self.0
                .open_cursor_with_range_and_direction(&query_js(query), direction(dir)),
            as_cursor,
        )
    }
}

/// Up to `max` values from a cursor, in its direction.
///
/// # Errors
/// As IndexedDB's request.
pub async fn collect_cursor(cursor: Option<IdbCursorWithValue>, max: u32) -> Result<Vec<JsValue>> {
    let mut out = Vec::new();
    let mut cursor = cursor;
    while let Some(c) = cursor {
        if out.len() as u32 >= max {
            break;
        }
        out.push(c.value().map_err(|e| StoreError::from_dom(&e))?);
        if out.len() as u32 >= max {
            break;
        }
        // `IDBCursor.request` is standard; web-sys marks it deprecated only
        // because its WebIDL source does.
        #[allow(deprecated)]
        let req = c.request();
        c.continue_().map_err(|e| StoreError::from_dom(&e))?;
        cursor = Req {
            req,
            map: as_cursor,
        }
        .await?;
    }
    Ok(out)
}

/// The results of requests issued in order in one transaction, read after
/// awaiting only the last: IndexedDB runs a transaction's requests in the
/// order they were made, so when the last has settled every earlier one has
/// too. One Promise for the whole batch instead of one per request.
///
/// # Errors
/// The first failed request's error.
pub async fn all<T>(reqs: Vec<Req<T>>) -> Result<Vec<T>> {
    if let Some(last) = reqs.last() {
        let last = Req {
            req: last.req.clone(),
            map: |v| v,
        };
        // A failure of the last request is reported in order below.
        let _ = last.await;
    }
    reqs.into_iter()
        .map(|r| settled(&r.req).map(r.map))
        .collect()
}

/// An issued request; `.await` it for the result.
pub struct Req<T> {
    req: IdbRequest,
    map: fn(JsValue) -> T,
}

impl<T> IntoFuture for Req<T> {
    type Output = Result<T>;
    type IntoFuture = ReqFuture<T>;

    fn into_future(self) -> ReqFuture<T> {
        ReqFuture {
            req: self.req,
            map: self.map,
            pending: None,
        }
    }
}

/// The future of a [`Req`]: settled from the request's `success`/`error`
/// events through one Promise, or at once when the request is already done.
pub struct ReqFuture<T> {
    req: IdbRequest,
    map: fn(JsValue) -> T,
    pending: Option<JsFuture>,
}

impl<T> Future for ReqFuture<T> {
    type Output = Result<T>;

    // Not inlined into every `.await` of every async method (size).
    #[inline(never)]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<T>> {
        let this = self.get_mut();
        let map = this.map;
        let pending = match &mut this.pending {
            Some(p) => p,
            None => {
                if this.req.ready_state() == IdbRequestReadyState::Done {
                    return Poll::Ready(settled(&this.req).map(map));
                }
                this.pending
                    .insert(JsFuture::from(request_promise(&this.req)))
            }
        };
        match Pin::new(pending).poll(cx) {
            Poll::Ready(Ok(v)) => Poll::Ready(Ok(map(v))),
            Poll::Ready(Err(e)) => Poll::Ready(Err(request_error(&this.req, &e))),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// The outcome of a finished request.
fn settled(req: &IdbRequest) -> Result<JsValue> {
    match req.error() {
        Ok(Some(e)) => Err(request_error(req, &e)),
        Ok(None) => req.result().map_err(|e| StoreError::from_dom(&e)),
        Err(e) => Err(StoreError::from_dom(&e)),
    }
}

/// A request's error, named after what failed: a request that only failed
/// because an earlier one aborted the transaction reports AbortError; the
/// transaction's own `error` names the cause (ConstraintError, quota, …).
fn request_error(req: &IdbRequest, e: &JsValue) -> StoreError {
    let aborted = e
        .dyn_ref::<web_sys::DomException>()
        .is_some_and(|d| d.name() == "AbortError");
    match req.transaction().and_then(|t| t.error()) {
        Some(cause) if aborted => StoreError::from_dom(cause.as_ref()),
        _ => StoreError::from_dom(e),
    }
}

fn abort_error(raw: &IdbTransaction) -> StoreError {
    match raw.error() {
        Some(d) => StoreError::from_dom(d.as_ref()),
        None => StoreError::Transaction("the transaction was aborted".into()),
    }
}

#[wasm_bindgen::prelude::wasm_bindgen(module = "/js/promise.js")]
extern "C" {
    /// A Promise settled by a transaction's `complete` (resolves) or
    /// `abort` (rejects) event (js/promise.js).
    #[wasm_bindgen(js_name = transactionPromise)]
    fn tx_promise(tx: &IdbTransaction) -> js_sys::Promise;
    /// A Promise settled by an IDB request's `success` / `error` events
    /// (resolves with `result`, rejects with the request's DOMException;
    /// js/promise.js).
    #[wasm_bindgen(js_name = requestPromise)]
    pub(crate) fn request_promise(request: &web_sys::IdbRequest) -> js_sys::Promise;
    /// A Promise resolved with `value` after `ms` milliseconds (this global
    /// scope's `setTimeout`, window or worker; js/promise.js).
    #[wasm_bindgen(js_name = timerPromise)]
    pub fn timer_promise(ms: u32, value: &JsValue) -> js_sys::Promise;
}

/// A Promise resolved with `undefined` after `ms` milliseconds
/// (`setTimeout` of this global scope: window or worker).
pub fn sleep_promise(ms: u32) -> js_sys::Promise {
    timer_promise(ms, &JsValue::UNDEFINED)
}

/// How much longer (ms) than `blockedTimeoutMs` an open or delete that
/// never received `blocked` may take before it counts as blocked: one
/// queued behind another connection's pending upgrade or delete never gets
/// the event, yet must not hang.
pub const QUEUED_GRACE_MS: u32 = 3_000;

/// Browsers run a timer longer than 2^31 - 1 ms at once.
const MAX_TIMER_MS: u32 = 2_147_483_647;

/// `Promise.race` of an open or delete `request` and its blocked timeout:
/// resolves with the request's result, or with `timed_out` once the
/// request has been `blocked` for `ms`, or has had no answer for
/// `ms` + [`QUEUED_GRACE_MS`] since it was made. The time an open or delete
/// takes when nothing blocks it never counts as blocked (with
/// `blockedTimeoutMs: 0`, an open nothing blocks still succeeds).
pub(crate) fn race_blocked(
    request: &IdbOpenDbRequest,
    ms: u32,
    timed_out: &JsValue,
) -> js_sys::Promise {
    let from_blocked = js_sys::Promise::new(&mut |resolve: Function, _reject: Function| {
        if let Ok(set_timeout) = Reflect::get(&js_sys::global(), &"setTimeout".into())
            .and_then(|f| f.dyn_into::<Function>())
        {
            // `blocked` calls setTimeout(resolve, ms, timed_out).
            let arm: Function = JsValue::from(set_timeout.bind3(
                &JsValue::UNDEFINED,
                &resolve,
                &JsValue::from(ms),
                timed_out,
            ))
            .unchecked_into();
            request.set_onblocked(Some(&arm));
        }
    });
    let limit = ms.saturating_add(QUEUED_GRACE_MS).min(MAX_TIMER_MS);
    js_sys::Promise::race(&Array::of3(
        &request_promise(request),
        &from_blocked,
        &timer_promise(limit, timed_out),
    ))
}

/// Sleeps `ms` milliseconds (a JS timer; no Rust timer machinery).
pub async fn sleep(ms: u32) {
    let _ = JsFuture::from(sleep_promise(ms)).await;
}

/// `indexedDB` of this global scope (window or worker).
///
/// # Errors
/// TransactionError where IndexedDB is not available.
pub fn factory() -> Result<IdbFactory> {
    Reflect::get(&js_sys::global(), &"indexedDB".into())
        .ok()
        .and_then(|f| f.dyn_into().ok())
        .ok_or_else(|| StoreError::Transaction("IndexedDB is not available in this context".into()))
}

/// The upgrade of a second connection to a store that must already exist
/// (the io module's): a database that is not there (it was deleted) is
/// refused, so the open fails with ClosedError instead of creating an empty
/// one; an existing one gets what [`create_schema`] adds.
pub fn existing_only(db: &IdbDatabase) -> std::result::Result<(), JsValue> {
    if db.object_store_names().length() == 0 {
        return Err(JsValue::from_str("the store was deleted"));
    }
    create_schema(db)
}

/// Creates the record store's object stores and index where missing.
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
