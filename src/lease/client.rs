//! The state of one lease client: its configuration, credentials, the
//! registry of held leases and the heartbeat loop's wake-up. The concerns
//! live in their own files: [`super::credentials`] (enrollment, refresh),
//! [`super::claims`], [`super::heartbeat`] (the loop) and [`super::recovery`].
//!
//! Ownership: the JS `LeaseClient` (and a running `work()` loop) own the
//! `Rc<ClientInner>`; leases, the heartbeat loop and the `pagehide` listener
//! hold only a `Weak` back-reference. A `LeaseClient` freed without `close()`
//! (its `free()`, or the garbage collector through wasm-bindgen's
//! FinalizationRegistry) drops the client: its loop stops, and every held lease
//! is released with a beacon and ends with reason `released`.

use std::cell::{Cell, RefCell};
use std::rc::{Rc, Weak};

use js_sys::{Function, Promise};
use wasm_bindgen::JsValue;

use super::credentials::Credentials;
use super::error::{LeaseError, LossReason, Result};
use super::journal::Journal;
use super::lease::LeaseInner;
use super::lifecycle;

/// Tuning and test hooks of a client.
#[derive(Clone)]
pub struct ClientConfig {
    /// Bound of one request (ms). Default 30 s.
    pub request_timeout_ms: f64,
    /// IndexedDB database of the lease journal; `None` disables the journal.
    pub journal_name: Option<String>,
    /// Hold a Web Lock per lease (when `navigator.locks` exists).
    pub use_locks: bool,
    /// Release held leases with a beacon on `pagehide` (windows only).
    pub release_on_pagehide: bool,
    /// How long `recover()` waits for another page's lock to be freed (ms).
    pub lock_wait_ms: f64,
    /// Origins (`scheme://host:port`) besides the lease server's own that
    /// `lease.fetch` sends the lease headers to. Empty by default: the token
    /// alone can release the lease, so it never goes to a third party unless
    /// the app names it.
    pub header_origins: Vec<String>,
    /// Test hook: maps every heartbeat timer's delay (ms) to the delay actually
    /// used, simulating throttled or frozen timers (case C-T2).
    pub timer_delay: Option<Function>,
    /// Called with the new credentials after each enrollment or refresh.
    pub on_credentials: Option<Function>,
}

impl Default for ClientConfig {
    fn default() -> ClientConfig {
        ClientConfig {
            request_timeout_ms: 30_000.0,
            journal_name: Some(super::journal::DEFAULT_NAME.to_owned()),
            use_locks: true,
            release_on_pagehide: true,
            lock_wait_ms: 1_000.0,
            header_origins: Vec::new(),
            timer_delay: None,
            on_credentials: None,
        }
    }
}

/// The state shared by a `LeaseClient`, its leases and its loops.
pub struct ClientInner {
    /// Server base URL without a trailing slash.
    pub base: String,
    /// The lease server's origin (`scheme://host:port`).
    pub(crate) origin: String,
    pub(crate) config: ClientConfig,
    pub(crate) creds: RefCell<Credentials>,
    /// Bumped on every credential change, so concurrent `401`s refresh once.
    pub(crate) generation: Cell<u32>,
    /// The enrollment or refresh in flight (resolves `true` on success), shared
    /// by concurrent callers: a refresh token is single-use.
    pub(crate) auth_flight: RefCell<Option<Promise>>,
    /// The error of the last failed enrollment or refresh.
    pub(crate) auth_error: RefCell<Option<LeaseError>>,
    /// Held leases by item id.
    pub(crate) leases: RefCell<agentstore_protocol::vecmap::VecMap<i64, Rc<LeaseInner>>>,
    /// Set while the heartbeat loop runs: `Some(None)` busy, `Some(Some(f))`
    /// waiting (calling `f` wakes it to re-plan).
    pub(crate) wake: RefCell<Option<Option<Function>>>,
    pub(crate) closed: Cell<bool>,
    /// Aborted by `close()`: ends the waits of `work()` slots between
    /// claims at once (they would otherwise notice only when their timer
    /// fires, up to `pollIntervalMs` or a backoff window later).
    pub(crate) closing: Option<web_sys::AbortController>,
    /// Calls `close()` waits for, in progress now (see
    /// [`ClientInner::ending_call`]).
    pub(crate) ending_calls: Cell<u32>,
    /// Resolved (and emptied) when `ending_calls` drops to 0.
    ending_idle: RefCell<Vec<Function>>,
    pub(crate) journal: Journal,
    /// Keeps the `pagehide` listener alive (removed on close).
    pagehide: RefCell<Option<lifecycle::Listener>>,
    /// Whether the page's `pagehide` came (with `release_on_pagehide`) and
    /// it has not been shown again since: the beacon went out, so `work()`
    /// claims nothing and a claim granted meanwhile is given back by beacon
    /// at once (see [`ClientInner::claim`]). A page keeps running for a
    /// moment after `pagehide` (its fetches answered, its loops going on):
    /// before, `work()` claimed the item the beacon had just released, and
    /// that lease stayed `running` until its TTL, one attempt lost
    /// (helper-241's navigation probe, Chromium).
    pub(crate) hidden: Cell<bool>,
    /// Until when (the [`super::http::now_ms`] clock, ms) a handler's
    /// failure is held back for the page's leaving: [`super::work::LEAVE_WINDOW_MS`]
    /// after the window's own `beforeunload` (heard while a `work()` loop
    /// runs, windows only); 0 (never) until then, once the page is shown
    /// again (its `pageshow`: restored from the back/forward cache, which
    /// Chromium does with a `work()` page, with or without
    /// `releaseOnPagehide`), and once a failure held back outlived the
    /// page's leaving. A time, not a flag: a `beforeunload` no navigation
    /// followed (a download, a navigation cancelled or answered 204, a
    /// prompt the user dismissed) goes stale by itself, and a failure
    /// after it is settled at once. Before, a restored page kept the mark
    /// and held its first failure back 3 s (helper-249; helper-253 without
    /// `releaseOnPagehide`), and so did a page that stayed after such a
    /// `beforeunload`, however much later (helper-258).
    pub(crate) leaving: Cell<f64>,
    /// Keeps the [`lifecycle::RESUME_EVENTS`] listener alive (removed on
    /// close): it wakes the heartbeat loop, whose pass sees a jump of the
    /// wall clock (a suspend) and asks the server about every held lease.
    resume: RefCell<Option<lifecycle::Listener>>,
    /// The `Idempotency-Key`s of claims that got no answer (the server may
    /// have granted them), by queue, sent again by the queue's next claims
    /// (see [`ClientInner::claim`]; kept by js/lease.js `keepClaimKey`).
    pub(crate) unanswered_claims: js_sys::Object,
    weak: Weak<ClientInner>,
}

impl ClientInner {
    /// A client for `base` (e.g. `http://127.0.0.1:8787`).
    ///
    /// # Errors
    /// `ValidationError` for a base URL that is not an absolute `http(s)://` URL.
    pub fn new(base: &str, creds: Credentials, config: ClientConfig) -> Result<Rc<ClientInner>> {
        // Trimmed by JS `String.prototype.trim` (ECMAScript white space and
        // line terminators: what `str::trim` strips but U+0085, plus U+FEFF),
        // whose table is the engine's, not ~500 bytes of wasm.
        let base = String::from(js_sys::JsString::from(base).trim());
        let base = base.trim_end_matches('/').to_owned();
        let origin = origin_of(&base)
            .filter(|_| base.starts_with("http://") || base.starts_with("https://"))
            .ok_or_else(|| {
                LeaseError::Validation("baseUrl must be an absolute http:// or https:// URL".into())
            })?;
        let journal = Journal::new(config.journal_name.clone());
        let pagehide_wanted = config.release_on_pagehide;
        let inner = Rc::new_cyclic(|weak| ClientInner {
            base,
            origin,
            config,
            creds: RefCell::new(creds),
            generation: Cell::new(0),
            auth_flight: RefCell::new(None),
            auth_error: RefCell::new(None),
            leases: RefCell::default(),
            wake: RefCell::new(None),
            closed: Cell::new(false),
            closing: web_sys::AbortController::new().ok(),
            ending_calls: Cell::new(0),
            ending_idle: RefCell::new(Vec::new()),
            journal,
            pagehide: RefCell::new(None),
            hidden: Cell::new(false),
            leaving: Cell::new(0.0),
            resume: RefCell::new(None),
            unanswered_claims: js_sys::Object::new(),
            weak: weak.clone(),
        });
        if pagehide_wanted {
            let weak = Rc::downgrade(&inner);
            *inner.pagehide.borrow_mut() = lifecycle::listen(
                &lifecycle::PAGEHIDE,
                true,
                Box::new(move |e| {
                    if let Some(c) = weak.upgrade() {
                        // Only the browser's own `pagehide`: one an app or
                        // a test dispatches on a page that stays visible is
                        // followed by no `pageshow`, and `work()` stalled
                        // (and `claim()` gave every lease back) for good.
                        if lifecycle::trusted(&e) {
                            c.hidden.set(true);
                        }
                        c.release_all_beacon();
                    }
                }),
            );
        }
        let weak = Rc::downgrade(&inner);
        *inner.resume.borrow_mut() = lifecycle::listen(
            &lifecycle::RESUME_EVENTS,
            false,
            Box::new(move |e| {
                if let Some(c) = weak.upgrade() {
                    // Shown again (a page restored from the back/forward
                    // cache fires `pageshow`). Not any event: the page
                    // being left fires `visibilitychange` after `pagehide`.
                    if c.hidden.get() && lifecycle::visible() {
                        c.hidden.set(false);
                    }
                    // Restored from the back/forward cache (the browser's
                    // own `pageshow`, `persisted`): the page is not being
                    // left, also when its `pagehide` was not heard (without
                    // `releaseOnPagehide`, `hidden` is never set: a
                    // restored page held its first failure back 3 s).
                    if lifecycle::trusted(&e) && lifecycle::restored(&e) {
                        c.leaving.set(0.0);
                    }
                    c.wake();
                }
            }),
        );
        Ok(inner)
    }

    /// Removes the page's `pagehide` and resume listeners.
    fn unlisten(&self) {
        if let Some(cb) = self.pagehide.borrow_mut().take() {
            lifecycle::unlisten(&lifecycle::PAGEHIDE, &cb);
        }
        if let Some(cb) = self.resume.borrow_mut().take() {
            lifecycle::unlisten(&lifecycle::RESUME_EVENTS, &cb);
        }
    }

    /// A `Weak` back-reference for leases and loops.
    pub(crate) fn weak(&self) -> Weak<ClientInner> {
        self.weak.clone()
    }

    /// The worker credentials currently held (for persisting the rotated refresh token).
    pub fn credentials(&self) -> Credentials {
        self.creds.borrow().clone()
    }

    /// Held leases, by item id. Leases past their local deadline are lost
    /// (`expired_locally`) here first, so the list never shows one.
    pub fn held(&self) -> Vec<Rc<LeaseInner>> {
        let mut held = self.all();
        held.retain(|l| l.lost_error().is_none());
        held
    }

    /// Every lease in the map (held or not), copied out so that no borrow
    /// of the map is kept across what is done with them.
    pub(super) fn all(&self) -> Vec<Rc<LeaseInner>> {
        let leases = self.leases.borrow();
        let mut all = Vec::with_capacity(leases.len());
        for l in leases.values() {
            all.push(l.clone());
        }
        all
    }

    /// Whether `url`'s origin may receive the lease headers: the lease
    /// server's own, or one listed in [`ClientConfig::header_origins`].
    pub fn may_receive_headers(&self, url: &str) -> bool {
        origin_of(url).is_some_and(|o| o == self.origin || self.config.header_origins.contains(&o))
    }

    pub(crate) fn check_open(&self) -> Result<()> {
        if self.closed.get() {
            Err(LeaseError::Closed)
        } else {
            Ok(())
        }
    }

    /// `base` + `path`.
    pub(crate) fn url(&self, path: &str) -> String {
        let mut u = String::with_capacity(self.base.len() + path.len());
        u.push_str(&self.base);
        u.push_str(path);
        u
    }

    /// The Web Lock name of a lease of this server.
    #[doc(hidden)]
    pub fn lock_name(&self, item_id: i64) -> String {
        let mut s = String::from("agentstore-lease ");
        s.push_str(&self.base);
        s.push(' ');
        s.push_str(&item_path(item_id, ""));
        s
    }

    /// Drops a lease from the registry and, when `journal`, from the journal
    /// (only ever called once the lease has ended).
    ///
    /// Both are keyed by item id, and the same item can be claimed again (by
    /// this page or another) once the lease ended: only the entries that
    /// still carry this lease's `token` are removed.
    pub(crate) fn forget_lease(&self, item_id: i64, token: &str, journal: bool) {
        let mut leases = self.leases.borrow_mut();
        if leases.get(&item_id).is_some_and(|l| l.token() == token) {
            leases.remove(&item_id);
        }
        drop(leases);
        if journal {
            self.forget_journal(item_id, token);
        }
    }

    /// Removes a lease's journal entry in the background.
    pub(crate) fn forget_journal(&self, item_id: i64, token: &str) {
        let j = self.journal.clone();
        let base = self.base.clone();
        let token = token.to_owned();
        crate::options::spawn(async move {
            let _ = j.delete(&base, item_id, &token).await;
        });
    }

    /// On `pagehide`: every held lease is released with a beacon.
    fn release_all_beacon(&self) {
        for lease in self.all() {
            lease.release_beacon(&self.base);
        }
    }

    /// Test hook: this client's page dies. Nothing more is sent for it (no
    /// heartbeat, release or beacon), its leases stop being held locally and
    /// their Web Locks go, and the journal keeps their entries: what a
    /// crashed or killed tab leaves for another page's `recover()`.
    #[cfg(feature = "test-hooks")]
    pub fn vanish(self: &Rc<Self>) {
        self.closed.set(true);
        self.unlisten();
        // Not `held()`: its deadline check would release an expired lease.
        for l in self.all() {
            l.lose_unconfirmed(LossReason::Released, "the page is gone (test hook)");
        }
        self.wake();
    }

    /// Stops heartbeating and releases every held lease (signals abort with
    /// `released`); later calls fail with `ClosedError`, and so do, at once,
    /// the `claim()`s and `recover()`s waiting for an answer: their requests
    /// run on, and a lease they bring is released (see
    /// [`ClientInner::claim`]) before `close()` resolves (each request, and
    /// each release, bounded by the request timeout). A lease whose settle
    /// (or release) is in flight is not raced by a release: its call finishes
    /// first (bounded by the request timeout), and only a lease it left held
    /// is released. A held lease whose settle failed (asked by the app, or by
    /// `work()` with its handler's outcome, and not yet retried) is settled
    /// once more with the same body first: releasing it would give finished
    /// work back to the queue.
    pub async fn close(self: &Rc<Self>) {
        self.closed.set(true);
        if let Some(c) = &self.closing {
            c.abort();
        }
        self.unlisten();
        let held = self.held();
        let releases = js_sys::Array::new();
        for l in &held {
            let l = l.clone();
            releases.push(&crate::options::spawn_promise(async move {
                l.until_not_ending().await;
                // A settle asked for (by the app, or by `work()` with a
                // handler's outcome) that failed: sent once more (the
                // same body) instead of releasing, which would hand
                // finished work back to the queue.
                let asked = l.asked.borrow().clone();
                if let Some(super::lease::Ending::Settle(state, result, error)) = asked {
                    if l.status() == super::lease::Status::Held {
                        let _ = l.settle(state, result, error).await;
                    }
                }
                if l.status() == super::lease::Status::Held {
                    let _ = l.release().await;
                }
                Ok(JsValue::UNDEFINED)
            }));
        }
        let _ = wasm_bindgen_futures::JsFuture::from(Promise::all(&releases)).await;
        // Also the settles of leases that expired locally while on the wire
        // (no longer held, but their answer decides how they ended), and the
        // claims and recoveries that were in progress (a lease they bring is
        // given back).
        while self.ending_calls.get() > 0 {
            let (idle, resolve) = super::heartbeat::deferred();
            self.ending_idle.borrow_mut().push(resolve);
            let _ = wasm_bindgen_futures::JsFuture::from(idle).await;
        }
        for l in held {
            // Still held here = its release failed (no answer): the journal
            // keeps the entry for a later recover().
            l.lose_unconfirmed(LossReason::Released, "the client was closed");
        }
        self.wake();
    }
}

impl ClientInner {
    /// Counts a call `close()` waits for until the guard is dropped: a
    /// settle or release of one of this client's leases on the wire
    /// (answered, failed or abandoned), a `claim()` or `recover()` in
    /// progress, and the request of a claim or the reconciling of a
    /// `recover()` their caller no longer waits for (a lease either brings
    /// after `close()` is released); `close()` wakes when the last one ends.
    pub(crate) fn ending_call(self: &Rc<Self>) -> EndingCall {
        self.ending_calls.set(self.ending_calls.get() + 1);
        EndingCall(self.clone())
    }
}

/// See [`ClientInner::ending_call`].
pub(crate) struct EndingCall(Rc<ClientInner>);

impl Drop for EndingCall {
    fn drop(&mut self) {
        let c = &self.0;
        let n = c.ending_calls.get().saturating_sub(1);
        c.ending_calls.set(n);
        if n == 0 {
            for resolve in c.ending_idle.take() {
                let _ = crate::value::call0(&resolve, &JsValue::UNDEFINED);
            }
        }
    }
}

impl Drop for ClientInner {
    /// Freed without `close()`: release what is still held with a beacon (the
    /// journal entry stays until a later `recover()` confirms it) and wake the
    /// heartbeat loop, which then finds no client and ends.
    fn drop(&mut self) {
        self.unlisten();
        let leases = std::mem::take(self.leases.get_mut());
        for lease in leases.values() {
            lease.release_beacon(&self.base);
        }
        if let Some(Some(f)) = self.wake.get_mut().take() {
            let _ = crate::value::call0(&f, &JsValue::UNDEFINED);
        }
    }
}

/// `/v1/items/{id}{rest}`.
pub(crate) fn item_path(item_id: i64, rest: &str) -> String {
    let mut p = String::from("/v1/items/");
    p.push_str(&String::from(
        js_sys::Number::from(item_id as f64)
            .to_string_with_radix(10)
            .unwrap_or_default(),
    ));
    p.push_str(rest);
    p
}

/// The origin (`scheme://host:port`) of an absolute URL, or `None`.
pub(crate) fn origin_of(url: &str) -> Option<String> {
    web_sys::Url::new(url)
        .ok()
        .map(|u| u.origin())
        .filter(|o| o != "null")
}
