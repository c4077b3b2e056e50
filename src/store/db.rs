//! The one IndexedDB layer of the SDK: opening (with a blocked timeout and
//! `versionchange` handling, whose event handlers are JS: js/promise.js
//! `openDatabase`), transactions, and requests as futures — a thin wrapper
//! over web-sys (the `idb` crate it replaced cost ~12 kB of wasm for one
//! monomorphised future type per request kind).
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
use js_sys::{Array, Function};
use std::cell::{Cell, RefCell};
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::task::{Context, Poll};
use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_futures::JsFuture;
use web_sys::{
    IdbDatabase, IdbFactory, IdbKeyRange, IdbObjectStore, IdbRequest, IdbRequestReadyState,
    IdbTransaction,
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

/// An open connection.
pub struct Db {
    raw: IdbDatabase,
    /// Set by `close()`, with the reason, so later calls fail with
    /// ClosedError instead of an opaque InvalidStateError (a connection
    /// closed by `versionchange` has no `onversionchange` handler left).
    closed: RefCell<Option<String>>,
    /// Aborted when the connection closes ([`Db::closing`], made on first
    /// use): waits on something other than IndexedDB (an import's source)
    /// race it, since `close()` ends only IndexedDB's own requests. (The
    /// io module's only: the entry points never wait on a source.)
    #[cfg(feature = "io")]
    closing: RefCell<Option<web_sys::AbortController>>,
    /// The database's name, the key of its transaction count ([`tx_seq`]).
    name: JsValue,
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
            Schema::Records,
            on_version_change,
        )
        .await
    }

    /// Opens database `name` at `version` with `schema` (js/promise.js
    /// `openDatabase`: the upgrade, the blocked timeout and the
    /// `versionchange` handler are JS event handlers).
    ///
    /// # Errors
    /// As [`Db::open`]; ClosedError carrying the reason when the upgrade
    /// refused ([`Schema::Existing`] of a deleted database).
    pub async fn open_with(
        name: &str,
        version: u32,
        blocked_timeout_ms: u32,
        schema: Schema,
        on_version_change: Option<Function>,
    ) -> Result<Db> {
        let opening = Self::start_open(
            name,
            version,
            blocked_timeout_ms,
            schema,
            on_version_change.as_ref(),
        )?;
        Self::opened(JsFuture::from(opening).await, name, blocked_timeout_ms)
    }

    /// Requests the open of [`Db::open_with`]: its outcome is the Promise's,
    /// for [`Db::opened`].
    ///
    /// # Errors
    /// TransactionError when IndexedDB is unavailable or refuses at once.
    pub(crate) fn start_open(
        name: &str,
        version: u32,
        blocked_timeout_ms: u32,
        schema: Schema,
        on_version_change: Option<&Function>,
    ) -> Result<js_sys::Promise> {
        open_database(
            &factory()?,
            name,
            version,
            blocked_timeout_ms,
            schema as u8,
            on_version_change,
        )
        .map_err(|e| StoreError::from_dom(&e))
    }

    /// The connection a [`Db::start_open`] Promise settled with (`Ok`:
    /// resolved, `Err`: rejected).
    ///
    /// # Errors
    /// As [`Db::open_with`].
    pub(crate) fn opened(
        out: std::result::Result<JsValue, JsValue>,
        name: &str,
        blocked_timeout_ms: u32,
    ) -> Result<Db> {
        match out {
            Ok(db) if db.is_null() => Err(StoreError::Blocked(name.to_owned(), blocked_timeout_ms)),
            Ok(db) => Ok(Db {
                raw: db.unchecked_into(),
                closed: RefCell::new(None),
                #[cfg(feature = "io")]
                closing: RefCell::new(None),
                name: name.into(),
            }),
            Err(e) => Err(match e.as_string() {
                Some(why) => StoreError::Closed(why),
                None => StoreError::from_dom(&e),
            }),
        }
    }

    /// Closes the connection (after running transactions finish) and
    /// aborts [`Db::closing`]'s signal.
    pub fn close(&self) {
        self.raw.close();
        self.closed
            .borrow_mut()
            .get_or_insert_with(|| "close() was called".to_owned());
        // After `closed` is set: what the abort wakes finds check_open failing.
        #[cfg(feature = "io")]
        if let Some(c) = self.closing.borrow().as_ref() {
            c.abort();
        }
    }

    /// A signal aborted when this connection closes: by `close()`, or by
    /// another tab's upgrade or deletion (`versionchange`); already aborted
    /// when it is closed. A wait that is not an IndexedDB request races it
    /// (`mutate::race_abort_or_close`), so that a closed store stops
    /// waiting.
    ///
    /// # Errors
    /// TransactionError when no AbortController can be made.
    #[cfg(feature = "io")]
    pub(crate) fn closing(&self) -> Result<web_sys::AbortSignal> {
        if let Some(c) = self.closing.borrow().as_ref() {
            return Ok(c.signal());
        }
        let c = web_sys::AbortController::new().map_err(|e| StoreError::from_dom(&e))?;
        // `abort()` as the `versionchange` listener. js/promise.js's own
        // handler was added at open, so it runs first: the connection is
        // closed and check_open says why before anything the abort wakes.
        let abort = crate::value::get(&c, &"abort".into())
            .ok()
            .and_then(|f| f.dyn_into::<Function<fn(JsValue) -> JsValue>>().ok());
        if let Some(abort) = abort {
            // `abort(undefined)`: the event is not the reason.
            let listener: Function = abort.bind1(&c, &JsValue::UNDEFINED).unchecked_into();
            let _ = self
                .raw
                .add_event_listener_with_callback("versionchange", &listener);
        }
        if self.check_open().is_err() {
            c.abort();
        }
        let signal = c.signal();
        *self.closing.borrow_mut() = Some(c);
        Ok(signal)
    }

    /// `Ok` while the connection is open.
    ///
    /// # Errors
    /// ClosedError after `close()` or a `versionchange`.
    pub fn check_open(&self) -> Result<()> {
        // js/promise.js's `versionchange` handler closes the connection and
        // sets the handler back to null. Looked at first: a `close()` after
        // it (an `onVersionChange` that closes the store) keeps its reason.
        if self.raw.onversionchange().is_none() {
            return Err(StoreError::Closed(
                "another tab upgraded or deleted the database".into(),
            ));
        }
        if let Some(why) = self.closed.borrow().as_ref() {
            return Err(StoreError::Closed(why.clone()));
        }
        Ok(())
    }

    /// Starts a transaction over `stores`.
    ///
    /// # Errors
    /// ClosedError after `close()` or a `versionchange`.
    pub fn tx(&self, stores: &[&str], mode: TransactionMode) -> Result<Tx> {
        self.check_open()?;
        tx_seq(&self.name, 1);
        let write = mode == TransactionMode::ReadWrite;
        let mode = if write {
            web_sys::IdbTransactionMode::Readwrite
        } else {
            web_sys::IdbTransactionMode::Readonly
        };
        // One store by its name, several as a sequence.
        let raw = match stores {
            [one] => self.raw.transaction_with_str_and_mode(one, mode),
            _ => {
                let names = Array::new();
                for s in stores {
                    names.push(&(*s).into());
                }
                self.raw
                    .transaction_with_str_sequence_and_mode(&names, mode)
            }
        }
        .map_err(|e| match StoreError::from_dom(&e) {
            // `transaction()` throws InvalidStateError when the connection
            // is closed (also by the browser: the origin's data cleared); a
            // request's is no closed store ([`StoreError::from_dom`]).
            StoreError::Transaction(m) if m.starts_with("InvalidStateError") => {
                StoreError::Closed(m)
            }
            e => e,
        })?;
        if write {
            // Whatever ends it (a commit waited for, or an error that drops
            // it before its commit is asked for, as a group's).
            quota_watch(&raw);
        }
        Ok(Tx {
            raw,
            open_write: Cell::new(write),
            #[cfg(feature = "test-hooks")]
            fault: std::rc::Rc::new(Cell::new(None)),
        })
    }
}

impl Db {
    /// How many transactions were started on this database by every
    /// connection of this module (wrapping; see [`tx_seq`]).
    pub fn seq(&self) -> u32 {
        tx_seq(&self.name, 0)
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
    fault: std::rc::Rc<Cell<Option<(u32, Fault)>>>,
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
    /// The request throws InvalidStateError synchronously, as every `put`
    /// does in Firefox's first readwrite transaction of a connection after
    /// a QuotaExceededError abort (js/promise.js `afterQuota`).
    Refused,
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

    /// Waits for the transaction to commit (IndexedDB's auto-commit, never
    /// an early `IDBTransaction.commit()`: js/promise.js `transactionPromise`
    /// says why).
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

    /// The `IDBTransaction` (for requests issued and answered in JS).
    pub fn raw(&self) -> &IdbTransaction {
        &self.raw
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

#[wasm_bindgen::prelude::wasm_bindgen]
extern "C" {
    /// An `IDBObjectStore` or an `IDBIndex`, for the requests the store
    /// issues (by method name, on either). web-sys binds each method once
    /// per receiver type and per argument count (`put`, `put_with_key`,
    /// `getAll`, `getAll` with a key, with a key and a limit, on a store and
    /// on an index...), each binding with its own wasm wrapper, import and
    /// glue; these take every argument, `undefined` for one not given,
    /// which IndexedDB takes as absent (an optional WebIDL argument that is
    /// `undefined` is "missing": <https://webidl.spec.whatwg.org/#es-overloads>).
    #[wasm_bindgen(extends = js_sys::Object)]
    pub type Source;
    #[wasm_bindgen(method, catch, js_name = put)]
    fn put_req(
        this: &Source,
        value: &JsValue,
        key: &JsValue,
    ) -> std::result::Result<IdbRequest, JsValue>;
    #[wasm_bindgen(method, catch, js_name = add)]
    fn add_req(
        this: &Source,
        value: &JsValue,
        key: &JsValue,
    ) -> std::result::Result<IdbRequest, JsValue>;
    /// `getAll(query, count)`.
    #[wasm_bindgen(method, catch, js_name = getAll)]
    pub fn get_all_req(
        this: &Source,
        query: &JsValue,
        count: &JsValue,
    ) -> std::result::Result<IdbRequest, JsValue>;
    #[wasm_bindgen(method, catch, js_name = getAllKeys)]
    fn get_all_keys_req(
        this: &Source,
        query: &JsValue,
        count: &JsValue,
    ) -> std::result::Result<IdbRequest, JsValue>;
    /// `count(query)`.
    #[wasm_bindgen(method, catch, js_name = count)]
    pub fn count_req(this: &Source, query: &JsValue) -> std::result::Result<IdbRequest, JsValue>;
}

/// `n` as the `count` argument of `getAll`/`getAllKeys` (`undefined`: all).
fn limit_js(count: Option<u32>) -> JsValue {
    count.map_or(JsValue::UNDEFINED, JsValue::from)
}

/// An object store inside a [`Tx`]. Requests are issued at once; await the
/// returned [`Req`] for the result.
pub struct ObjectStore {
    raw: IdbObjectStore,
    #[cfg(feature = "test-hooks")]
    fault: std::rc::Rc<Cell<Option<(u32, Fault)>>>,
}

impl ObjectStore {
    /// The store as a [`Source`] of requests.
    pub fn source(&self) -> &Source {
        self.raw.unchecked_ref()
    }
}

impl From<ObjectStore> for IdbObjectStore {
    fn from(s: ObjectStore) -> IdbObjectStore {
        s.raw
    }
}

/// An index of an object store inside a [`Tx`].
pub struct Index(web_sys::IdbIndex);

impl Index {
    /// The index as a [`Source`] of requests.
    pub fn source(&self) -> &Source {
        self.0.unchecked_ref()
    }
}

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
    /// or a bad key (DataError); TransactionError after the transaction
    /// ended, or when the browser refuses it (js/promise.js `afterQuota`).
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
        let absent = JsValue::UNDEFINED;
        let (s, key) = (self.source(), key.unwrap_or(&absent));
        issued(
            if add {
                s.add_req(value, key)
            } else {
                s.put_req(value, key)
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
        issued(
            self.source()
                .get_all_req(&query_js(query), &limit_js(count)),
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
        issued(
            self.source()
                .get_all_keys_req(&query_js(query), &limit_js(count)),
            as_vec,
        )
    }

    /// `count(query?)`.
    ///
    /// # Errors
    /// As IndexedDB's request.
    pub fn count(&self, query: Option<Query>) -> Result<Req<u32>> {
        issued(self.source().count_req(&query_js(query)), as_u32)
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
        let absent = JsValue::UNDEFINED;
        let k = key.unwrap_or(&absent);
        let put = |v: &JsValue| self.source().put_req(v, k);
        Some(match kind {
            Fault::Clone => {
                let bad = js_sys::Object::new();
                let _ = js_sys::Reflect::set(&bad, &"fn".into(), &Function::new_no_args(""));
                issued(put(&bad), |v| v)
            }
            Fault::Constraint => {
                let _ = put(value);
                issued(self.source().add_req(value, k), |v| v)
            }
            Fault::Refused => {
                let e = js_sys::Error::new(
                    "A mutation operation was attempted on a database that did not allow mutations.",
                );
                e.set_name("InvalidStateError");
                issued(Err(e.into()), |v| v)
            }
        })
    }
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
    let mut out = Vec::with_capacity(reqs.len());
    for r in reqs {
        out.push((r.map)(settled(&r.req)?));
    }
    Ok(out)
}

/// An issued request; `.await` it for the result.
pub struct Req<T> {
    req: IdbRequest,
    map: fn(JsValue) -> T,
}

impl<T> Req<T> {
    /// The request's answer as a Promise made in JS, for a read answered
    /// without the executor (js/promise.js `answer`): its result (`null`
    /// for `undefined`), or its failure, named as [`request_error`] names
    /// it: `to_error(DOMException)` ([`crate::error::dom_error_fn`], for the
    /// JS methods), or the DOMException itself when `to_error` is
    /// `undefined` (Rust callers, [`super::answered`]).
    pub(crate) fn answer(&self, to_error: &JsValue) -> js_sys::Promise {
        answer(&self.req, to_error)
    }
}

/// [`Req::answer`] of a request issued through web-sys directly.
pub(crate) fn answer_of(request: &IdbRequest, to_error: &JsValue) -> js_sys::Promise {
    answer(request, to_error)
}

/// The results of one transaction's `requests` (IDBRequests), in order,
/// `null` for `undefined`, as a Promise made in JS (js/promise.js
/// `answers`); rejects as [`Req::answer`] does.
pub(crate) fn answers_of(requests: &js_sys::Array, to_error: &JsValue) -> js_sys::Promise {
    answers(requests, to_error)
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
    /// Watches readwrite transaction `tx` for an abort for quota, after
    /// which Firefox's cleanup transaction is used up (js/promise.js
    /// `quotaWatch`, `afterQuota`).
    #[wasm_bindgen(js_name = quotaWatch)]
    fn quota_watch(tx: &IdbTransaction);
    /// A Promise settled by an IDB request's `success` / `error` events
    /// (resolves with `result`, rejects with the request's DOMException;
    /// js/promise.js).
    #[wasm_bindgen(js_name = requestPromise)]
    pub(crate) fn request_promise(request: &web_sys::IdbRequest) -> js_sys::Promise;
    /// A read's answer (js/promise.js `answer`): resolves with the
    /// request's `result` (`null` for `undefined`), rejects with
    /// `to_error(DOMException)`.
    fn answer(request: &IdbRequest, to_error: &JsValue) -> js_sys::Promise;
    /// The results of one transaction's `requests`, in order (`null` for
    /// `undefined`), once the last succeeded (js/promise.js `answers`);
    /// rejects as [`answer`] does.
    fn answers(requests: &js_sys::Array, to_error: &JsValue) -> js_sys::Promise;
    /// A Promise resolved with `value` after `ms` milliseconds (this global
    /// scope's `setTimeout`, window or worker; js/promise.js).
    #[wasm_bindgen(js_name = timerPromise)]
    pub fn timer_promise(ms: u32, value: &JsValue) -> js_sys::Promise;
    /// Opens a database (js/promise.js `openDatabase`): resolves with the
    /// IDBDatabase, or `null` when the open stayed blocked for
    /// `blocked_ms`; rejects with a string when the upgrade refused, else
    /// with the DOMException.
    #[wasm_bindgen(js_name = openDatabase, catch)]
    fn open_database(
        factory: &IdbFactory,
        name: &str,
        version: u32,
        blocked_ms: u32,
        schema: u8,
        on_close: Option<&Function>,
    ) -> std::result::Result<js_sys::Promise, JsValue>;
    /// Adds `add` to the count of transactions started on database `name`
    /// by every connection of this module, and returns it (wrapping;
    /// js/promise.js `txSeq`, one count per name). Group commit joins a
    /// group only while no other transaction on that database started
    /// after its own, on this connection or on another one (a `get` issued
    /// on a second `AgentStore` after a write must not see a later write
    /// that joined that write's group). By database, so another database's
    /// transactions (the lease journal's, another store's) neither close a
    /// group nor stop a failed group's members being run again.
    #[wasm_bindgen(js_name = txSeq)]
    fn tx_seq(name: &JsValue, add: u32) -> u32;
    /// `destroy`'s answer (js/promise.js `deletion`): resolves once the
    /// database is gone; rejects with `blocked` when the deletion stayed
    /// blocked for `blocked_ms`, else with `to_error(DOMException)`.
    #[wasm_bindgen(catch)]
    pub(crate) fn deletion(
        factory: &IdbFactory,
        name: &str,
        blocked_ms: u32,
        blocked: &JsValue,
        to_error: &JsValue,
    ) -> std::result::Result<js_sys::Promise, JsValue>;
}

/// What an open creates in `upgradeneeded` (js/promise.js `createSchema`).
#[derive(Clone, Copy)]
pub enum Schema {
    /// The record store: [`RECORDS`] (with [`BY_TYPE`]), [`TOMBSTONES`],
    /// [`META`], [`DERIVED`], each where missing.
    Records = 0,
    /// The record store of a second connection (the io module's, opened
    /// for one call of the entry point's store): a database that is not
    /// there (it was deleted) is refused, so the open fails with
    /// ClosedError instead of creating an empty one.
    Existing = 1,
    /// The lease journal's one object store.
    Journal = 2,
}

/// A Promise resolved with `undefined` after `ms` milliseconds
/// (`setTimeout` of this global scope: window or worker).
pub fn sleep_promise(ms: u32) -> js_sys::Promise {
    timer_promise(ms, &JsValue::UNDEFINED)
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
    crate::value::get(&js_sys::global(), &"indexedDB".into())
        .ok()
        .and_then(|f| f.dyn_into().ok())
        .ok_or_else(|| StoreError::Transaction("IndexedDB is not available in this context".into()))
}
