//! The lease client: credentials (enrollment, refresh on `401`), claims, the
//! batched heartbeat loop, and the registry of held leases.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::rc::{Rc, Weak};

use agentstore_protocol::lease::{
    BatchHeartbeatEntry, BatchHeartbeatRequest, BatchHeartbeatResponse, ClaimResponse,
    EnrollRequest, RefreshRequest, WorkerCredentials,
};
use agentstore_protocol::lease_client::{plan_batch, HeartbeatPlan};
use agentstore_protocol::ErrorCode;
use futures::channel::mpsc;
use futures::future::{select, Either, FutureExt, LocalBoxFuture, Shared};
use futures::StreamExt;
use js_sys::Function;
use wasm_bindgen::closure::Closure;
use wasm_bindgen::JsValue;
use web_sys::AbortSignal;

use super::error::{LeaseError, LossReason, Result};
use super::http::{self, now_ms, random, sleep_ms, Answer, Call};
use super::journal::{Entry, Journal};
use super::lease::{parse, to_json, LeaseInner, Status};
use super::lifecycle;

/// Most leases per batched heartbeat request (the server's limit).
const MAX_BATCH: usize = 500;

/// How the client authenticates.
#[derive(Debug, Clone, Default)]
pub struct Credentials {
    /// Current access token (`Authorization: Bearer`); may be the admin token.
    pub access_token: Option<String>,
    /// Single-use refresh token, rotated by every refresh.
    pub refresh_token: Option<String>,
    /// Single-use enrollment token, used once when no access token is held.
    pub enrollment_token: Option<String>,
    /// Worker name sent with the enrollment.
    pub name: Option<String>,
}

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
            timer_delay: None,
            on_credentials: None,
        }
    }
}

type AuthFlight = Shared<LocalBoxFuture<'static, std::result::Result<(), LeaseError>>>;

/// What a claim gave.
pub enum Claimed {
    /// A lease, heartbeated from now on.
    Lease(Rc<LeaseInner>),
    /// Nothing open; the server suggests waiting this long (ms).
    Empty(Option<f64>),
}

/// What `recover()` did with the journal of an earlier page.
#[derive(Default)]
pub struct Recovery {
    /// Released on the server (back in the queue now, not after the TTL).
    pub released: Vec<i64>,
    /// Still valid and now heartbeated by this client again.
    pub resumed: Vec<Rc<LeaseInner>>,
    /// Already gone on the server (taken over, settled or released).
    pub lost: Vec<i64>,
    /// Held by another live page (its Web Lock is taken): left alone.
    pub busy: Vec<i64>,
    /// Not touched: no Web Locks here, so a live page's lease cannot be told apart.
    pub skipped: Vec<i64>,
}

/// The state shared by a `LeaseClient`, its leases and its loops.
pub struct ClientInner {
    /// Server base URL without a trailing slash.
    pub base: String,
    pub(crate) config: ClientConfig,
    creds: RefCell<Credentials>,
    /// Bumped on every credential change, so concurrent `401`s refresh once.
    generation: Cell<u32>,
    auth_flight: RefCell<Option<AuthFlight>>,
    /// Held leases by item id.
    leases: RefCell<BTreeMap<i64, Rc<LeaseInner>>>,
    /// Set while the heartbeat loop runs: wakes it to re-plan.
    wake: RefCell<Option<mpsc::UnboundedSender<()>>>,
    closed: Cell<bool>,
    pub(crate) journal: Journal,
    /// Keeps the `pagehide` listener alive (removed on close).
    pagehide: RefCell<Option<Closure<dyn FnMut()>>>,
}

impl ClientInner {
    /// A client for `base` (e.g. `http://127.0.0.1:8787`).
    ///
    /// # Errors
    /// `ValidationError` for a base URL that is not `http(s)://…`.
    pub fn new(base: &str, creds: Credentials, config: ClientConfig) -> Result<Rc<ClientInner>> {
        let base = base.trim().trim_end_matches('/').to_owned();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(LeaseError::Validation(format!(
                "baseUrl must start with http:// or https://, got {base:?}"
            )));
        }
        let journal = Journal::new(config.journal_name.clone());
        let pagehide_wanted = config.release_on_pagehide;
        let inner = Rc::new(ClientInner {
            base,
            config,
            creds: RefCell::new(creds),
            generation: Cell::new(0),
            auth_flight: RefCell::new(None),
            leases: RefCell::new(BTreeMap::new()),
            wake: RefCell::new(None),
            closed: Cell::new(false),
            journal,
            pagehide: RefCell::new(None),
        });
        if pagehide_wanted {
            let weak: Weak<ClientInner> = Rc::downgrade(&inner);
            *inner.pagehide.borrow_mut() = lifecycle::on_pagehide(move || {
                if let Some(c) = weak.upgrade() {
                    c.release_all_beacon();
                }
            });
        }
        Ok(inner)
    }

    /// The worker credentials currently held (for persisting the rotated refresh token).
    pub fn credentials(&self) -> Credentials {
        self.creds.borrow().clone()
    }

    /// Held leases, by item id.
    pub fn held(&self) -> Vec<Rc<LeaseInner>> {
        self.leases.borrow().values().cloned().collect()
    }

    fn check_open(&self) -> Result<()> {
        if self.closed.get() {
            Err(LeaseError::Closed)
        } else {
            Ok(())
        }
    }

    // -----------------------------------------------------------------------
    // Requests and credentials
    // -----------------------------------------------------------------------

    /// An authenticated request: enrolls first when only an enrollment token is
    /// held, and refreshes once on `401` when a refresh token is held.
    pub(crate) async fn authed(
        self: &Rc<Self>,
        method: &str,
        path: &str,
        body: Option<&str>,
        timeout_ms: f64,
        signal: Option<&AbortSignal>,
    ) -> Result<Answer> {
        if self.creds.borrow().access_token.is_none() {
            self.renew(self.generation.get()).await?;
        }
        let mut retried = false;
        loop {
            let generation = self.generation.get();
            let token = self.creds.borrow().access_token.clone();
            let url = format!("{}{path}", self.base);
            let r = http::send(Call {
                method,
                url: &url,
                bearer: token.as_deref(),
                body,
                timeout_ms,
                signal,
            })
            .await;
            match r {
                Err(LeaseError::Unauthorized(m)) if !retried => {
                    let can = self.creds.borrow().refresh_token.is_some()
                        || generation != self.generation.get();
                    if !can {
                        return Err(LeaseError::Unauthorized(m));
                    }
                    self.renew(generation).await?;
                    retried = true;
                }
                other => return other,
            }
        }
    }

    /// Gets new credentials (enroll or refresh) unless someone already did since
    /// `stale`; concurrent callers share one request (a refresh token is single-use).
    async fn renew(self: &Rc<Self>, stale: u32) -> Result<()> {
        if self.generation.get() != stale {
            return Ok(());
        }
        let flight = self.auth_flight.borrow().clone();
        let flight = match flight {
            Some(f) => f,
            None => {
                let me = self.clone();
                let f = async move {
                    let r = me.renew_now().await;
                    *me.auth_flight.borrow_mut() = None;
                    r
                }
                .boxed_local()
                .shared();
                *self.auth_flight.borrow_mut() = Some(f.clone());
                f
            }
        };
        flight.await
    }

    async fn renew_now(self: &Rc<Self>) -> Result<()> {
        let (refresh, enroll, name) = {
            let c = self.creds.borrow();
            (
                c.refresh_token.clone(),
                c.enrollment_token.clone(),
                c.name.clone(),
            )
        };
        let (path, body) = if let Some(refresh_token) = refresh {
            (
                "/v1/workers/refresh",
                to_json(&RefreshRequest { refresh_token })?,
            )
        } else if let Some(token) = enroll {
            // Single-use: never sent twice, whatever the answer.
            self.creds.borrow_mut().enrollment_token = None;
            (
                "/v1/workers/enroll",
                to_json(&EnrollRequest { token, name })?,
            )
        } else {
            return Err(LeaseError::Unauthorized(
                "no access token, refresh token or enrollment token".into(),
            ));
        };
        let url = format!("{}{path}", self.base);
        let answer = http::send(Call {
            method: "POST",
            url: &url,
            bearer: None,
            body: Some(&body),
            timeout_ms: self.config.request_timeout_ms,
            signal: None,
        })
        .await?;
        let wc: WorkerCredentials = parse(&answer.text)?;
        {
            let mut c = self.creds.borrow_mut();
            c.access_token = Some(wc.access_token.clone());
            c.refresh_token = Some(wc.refresh_token.clone());
        }
        self.generation.set(self.generation.get().wrapping_add(1));
        if let Some(cb) = &self.config.on_credentials {
            let o = js_sys::Object::new();
            crate::error::set(&o, "workerId", &JsValue::from(wc.worker_id as f64));
            crate::error::set(&o, "accessToken", &wc.access_token.as_str().into());
            crate::error::set(&o, "refreshToken", &wc.refresh_token.as_str().into());
            crate::error::set(
                &o,
                "accessExpiresInMs",
                &JsValue::from(wc.access_expires_in_ms as f64),
            );
            let _ = cb.call1(&JsValue::UNDEFINED, &o);
        }
        Ok(())
    }

    // -----------------------------------------------------------------------
    // Claims
    // -----------------------------------------------------------------------

    /// Claims the oldest open item of `queue`.
    ///
    /// The lease's local deadline counts from when THIS request was sent. The
    /// lease is journalled and locked before it is returned.
    ///
    /// # Errors
    /// `NetworkError`, `RateLimitedError` (with `retryAfterMs`),
    /// `UnauthorizedError`, `AbortError` (the signal fired; if the server had
    /// already granted the claim it is released), `ValidationError`.
    pub async fn claim(
        self: &Rc<Self>,
        queue: &str,
        signal: Option<&AbortSignal>,
    ) -> Result<Claimed> {
        self.check_open()?;
        let path = format!(
            "/v1/queues/{}/claims",
            String::from(js_sys::encode_uri_component(queue))
        );
        let sent_at = now_ms();
        let timeout = self.config.request_timeout_ms;
        let answer = self.authed("POST", &path, None, timeout, signal).await?;
        if answer.status == 204 {
            return Ok(Claimed::Empty(answer.retry_after_ms));
        }
        let resp: ClaimResponse = parse(&answer.text)?;
        let item = js_sys::JSON::parse(&answer.text)
            .ok()
            .and_then(|v| js_sys::Reflect::get(&v, &"item".into()).ok())
            .unwrap_or(JsValue::NULL);
        let plan = HeartbeatPlan::new(
            sent_at,
            resp.lease.ttl_ms as f64,
            resp.lease.heartbeat_ms as f64,
        );
        let lease = Rc::new(LeaseInner::new(
            self.clone(),
            queue.to_owned(),
            resp.lease.token.clone(),
            resp.item,
            item,
            plan,
        )?);
        self.adopt(&lease, resp.lease.ttl_ms, resp.lease.heartbeat_ms)
            .await;
        if let Some(s) = signal {
            if s.aborted() {
                let _ = lease.release().await;
                return Err(LeaseError::Aborted(s.reason()));
            }
        }
        if self.closed.get() {
            let _ = lease.release().await;
            return Err(LeaseError::Closed);
        }
        Ok(Claimed::Lease(lease))
    }

    /// Journals and locks a lease, then heartbeats it.
    async fn adopt(self: &Rc<Self>, lease: &Rc<LeaseInner>, ttl_ms: u64, heartbeat_ms: u64) {
        // Registered first, so heartbeats cover the (short) journal and lock work.
        self.leases
            .borrow_mut()
            .insert(lease.item_id, lease.clone());
        self.ensure_heartbeats();
        let entry = Entry {
            base: self.base.clone(),
            item_id: lease.item_id,
            token: lease.token().to_owned(),
            epoch: lease.epoch,
            queue: lease.queue.clone(),
            ttl_ms,
            heartbeat_ms,
        };
        if let Err(e) = self.journal.put(&entry).await {
            lifecycle::warn(&format!("agentstore: lease journal write failed: {e}"));
        }
        if self.config.use_locks {
            if let lifecycle::LockOutcome::Acquired(unlock) =
                lifecycle::lock(&self.lock_name(lease.item_id), 0.0).await
            {
                if lease.status() == Status::Held || lease.status() == Status::Ending {
                    *lease.unlock.borrow_mut() = Some(unlock);
                } else {
                    let _ = unlock.call0(&JsValue::UNDEFINED);
                }
            }
        }
    }

    fn lock_name(&self, item_id: i64) -> String {
        format!("agentstore-lease {} {item_id}", self.base)
    }

    /// Drops a lease from the registry (and, when `journal`, from the journal).
    pub(crate) fn forget_lease(&self, item_id: i64, journal: bool) {
        self.leases.borrow_mut().remove(&item_id);
        if journal {
            let j = self.journal.clone();
            let base = self.base.clone();
            wasm_bindgen_futures::spawn_local(async move {
                let _ = j.delete(&base, item_id).await;
            });
        }
    }

    // -----------------------------------------------------------------------
    // Heartbeats
    // -----------------------------------------------------------------------

    /// Wakes the heartbeat loop to re-plan (a lease was added or resumed).
    pub(crate) fn wake(&self) {
        if let Some(tx) = self.wake.borrow().as_ref() {
            let _ = tx.unbounded_send(());
        }
    }

    fn ensure_heartbeats(self: &Rc<Self>) {
        if self.wake.borrow().is_some() {
            self.wake();
            return;
        }
        let (tx, rx) = mpsc::unbounded();
        *self.wake.borrow_mut() = Some(tx);
        wasm_bindgen_futures::spawn_local(heartbeat_loop(self.clone(), rx));
    }

    fn timer_delay(&self, ms: f64) -> f64 {
        match &self.config.timer_delay {
            Some(f) => f
                .call1(&JsValue::UNDEFINED, &JsValue::from(ms))
                .ok()
                .and_then(|v| v.as_f64())
                .filter(|d| d.is_finite())
                .unwrap_or(ms),
            None => ms,
        }
    }

    /// One batched heartbeat request for `leases`, sent at `sent_at`.
    async fn heartbeat_batch(
        self: &Rc<Self>,
        leases: &[Rc<LeaseInner>],
        sent_at: f64,
        timeout_ms: f64,
    ) {
        for chunk in leases.chunks(MAX_BATCH) {
            let req = BatchHeartbeatRequest {
                leases: chunk
                    .iter()
                    .map(|l| BatchHeartbeatEntry {
                        item_id: l.item_id,
                        token: l.token().to_owned(),
                    })
                    .collect(),
            };
            let outcome = match to_json(&req) {
                Ok(body) => self
                    .authed("POST", "/v1/heartbeats", Some(&body), timeout_ms, None)
                    .await
                    .and_then(|a| parse::<BatchHeartbeatResponse>(&a.text)),
                Err(e) => Err(e),
            };
            match outcome {
                Ok(resp) => {
                    for lease in chunk {
                        let result = resp.results.iter().find(|r| r.item_id == lease.item_id);
                        match result {
                            Some(r) if r.ok => {
                                if lease.status() == Status::Held {
                                    lease.plan.borrow_mut().on_success(sent_at);
                                }
                            }
                            Some(r) => {
                                let (code, message) = r.error.as_ref().map_or(
                                    (ErrorCode::ClaimLost, String::from("claim lost")),
                                    |e| (e.code, e.message.clone()),
                                );
                                match code {
                                    ErrorCode::ClaimLost
                                    | ErrorCode::StateConflict
                                    | ErrorCode::NotFound
                                        if lease.status() == Status::Held =>
                                    {
                                        lease.lose(LossReason::ClaimLost, &message)
                                    }
                                    _ => lease.plan.borrow_mut().on_failure(now_ms(), random()),
                                }
                            }
                            None => lease.plan.borrow_mut().on_failure(now_ms(), random()),
                        }
                    }
                }
                Err(_) => {
                    let now = now_ms();
                    for lease in chunk {
                        lease.plan.borrow_mut().on_failure(now, random());
                    }
                }
            }
        }
    }

    /// On `pagehide`: every held lease is released with a beacon.
    fn release_all_beacon(&self) {
        for lease in self.held() {
            lease.release_beacon();
        }
    }

    // -----------------------------------------------------------------------
    // Journal reconciliation and shutdown
    // -----------------------------------------------------------------------

    /// Reconciles the journal of earlier pages for this base URL: each lease not
    /// held by a live page (its Web Lock is free) is released — or, with
    /// `resume`, heartbeated and handed back if still valid.
    ///
    /// # Errors
    /// `ClosedError`; journal failures are reported as `TransactionError`-like
    /// `ServerError`s only when the journal cannot be read at all.
    pub async fn recover(self: &Rc<Self>, resume: bool) -> Result<Recovery> {
        self.check_open()?;
        let mut report = Recovery::default();
        let entries = self
            .journal
            .list(&self.base)
            .await
            .map_err(|e| LeaseError::Server {
                code: ErrorCode::Transaction,
                status: ErrorCode::Transaction.status(),
                message: e,
            })?;
        for entry in entries {
            if self.leases.borrow().contains_key(&entry.item_id) {
                continue;
            }
            let unlock =
                match lifecycle::lock(&self.lock_name(entry.item_id), self.config.lock_wait_ms)
                    .await
                {
                    lifecycle::LockOutcome::Acquired(f) => Some(f),
                    lifecycle::LockOutcome::Busy => {
                        report.busy.push(entry.item_id);
                        continue;
                    }
                    lifecycle::LockOutcome::Unsupported if !self.config.use_locks => None,
                    lifecycle::LockOutcome::Unsupported => {
                        report.skipped.push(entry.item_id);
                        continue;
                    }
                };
            let unlock_now = |f: &Option<Function>| {
                if let Some(f) = f {
                    let _ = f.call0(&JsValue::UNDEFINED);
                }
            };
            if resume {
                match self.resume_entry(&entry).await {
                    Ok(Some(lease)) => {
                        *lease.unlock.borrow_mut() = unlock;
                        report.resumed.push(lease);
                        continue;
                    }
                    Ok(None) => {
                        let _ = self.journal.delete(&self.base, entry.item_id).await;
                        report.lost.push(entry.item_id);
                        unlock_now(&unlock);
                        continue;
                    }
                    Err(_) => {
                        unlock_now(&unlock);
                        continue;
                    }
                }
            }
            let body = to_json(&agentstore_protocol::lease::TokenRequest {
                token: entry.token.clone(),
            })?;
            let path = format!("/v1/items/{}/release", entry.item_id);
            match self
                .authed(
                    "POST",
                    &path,
                    Some(&body),
                    self.config.request_timeout_ms,
                    None,
                )
                .await
            {
                Ok(_) => {
                    let _ = self.journal.delete(&self.base, entry.item_id).await;
                    report.released.push(entry.item_id);
                }
                Err(e) if !e.is_transient() && !matches!(e, LeaseError::Unauthorized(_)) => {
                    // claim_lost / state_conflict / not_found: nothing left to release.
                    let _ = self.journal.delete(&self.base, entry.item_id).await;
                    report.lost.push(entry.item_id);
                }
                Err(_) => {} // kept for the next recover
            }
            unlock_now(&unlock);
        }
        Ok(report)
    }

    /// Heartbeats a journalled lease; `Some` (heartbeated from now on) if valid.
    async fn resume_entry(self: &Rc<Self>, entry: &Entry) -> Result<Option<Rc<LeaseInner>>> {
        let body = to_json(&agentstore_protocol::lease::TokenRequest {
            token: entry.token.clone(),
        })?;
        let sent_at = now_ms();
        let timeout = self.config.request_timeout_ms;
        let path = format!("/v1/items/{}/heartbeat", entry.item_id);
        match self.authed("POST", &path, Some(&body), timeout, None).await {
            Ok(_) => {}
            Err(e) if e.is_transient() => return Err(e),
            Err(LeaseError::Unauthorized(m)) => return Err(LeaseError::Unauthorized(m)),
            Err(_) => return Ok(None),
        }
        let answer = self
            .authed(
                "GET",
                &format!("/v1/items/{}", entry.item_id),
                None,
                timeout,
                None,
            )
            .await?;
        let view = parse(&answer.text)?;
        let item = js_sys::JSON::parse(&answer.text).unwrap_or(JsValue::NULL);
        let plan = HeartbeatPlan::new(sent_at, entry.ttl_ms as f64, entry.heartbeat_ms as f64);
        let lease = Rc::new(LeaseInner::new(
            self.clone(),
            entry.queue.clone(),
            entry.token.clone(),
            view,
            item,
            plan,
        )?);
        self.leases
            .borrow_mut()
            .insert(lease.item_id, lease.clone());
        self.ensure_heartbeats();
        Ok(Some(lease))
    }

    /// Stops heartbeating and releases every held lease (signals abort with
    /// `released`); later calls fail with `ClosedError`.
    pub async fn close(self: &Rc<Self>) {
        self.closed.set(true);
        if let Some(cb) = self.pagehide.borrow_mut().take() {
            lifecycle::off_pagehide(&cb);
        }
        let held = self.held();
        futures::future::join_all(held.iter().map(|l| l.release())).await;
        for l in held {
            l.lose(LossReason::Released, "the client was closed");
        }
        self.wake();
    }
}

/// The heartbeat loop: plans with [`plan_batch`], renews due leases in one
/// request, expires leases past their local deadline, sleeps until the next
/// due time (through the test hook `timer_delay`), and exits when no lease is
/// held. A timer that fires late finds its heartbeat overdue and sends it at
/// once.
async fn heartbeat_loop(client: Rc<ClientInner>, mut wake: mpsc::UnboundedReceiver<()>) {
    loop {
        let all = client.held();
        if all.is_empty() || client.closed.get() {
            *client.wake.borrow_mut() = None;
            return;
        }
        let active: Vec<Rc<LeaseInner>> = all
            .iter()
            .filter(|l| l.status() == Status::Held && !l.paused.get())
            .cloned()
            .collect();
        let now = now_ms();
        let plans: Vec<HeartbeatPlan> = active.iter().map(|l| l.plan.borrow().clone()).collect();
        let batch = plan_batch(&plans, now);
        for &i in &batch.expire {
            if let Some(l) = active.get(i) {
                l.lose(
                    LossReason::ExpiredLocally,
                    "no heartbeat succeeded before the local deadline",
                );
            }
        }
        if !batch.heartbeat.is_empty() {
            let due: Vec<Rc<LeaseInner>> = batch
                .heartbeat
                .iter()
                .filter_map(|&i| active.get(i).cloned())
                .collect();
            client
                .heartbeat_batch(&due, now, batch.timeout_ms.max(1.0))
                .await;
            continue;
        }
        // Nothing due: sleep (paused or ending leases are looked at again soon).
        let sleep = batch.sleep_ms.unwrap_or(100.0).max(1.0);
        let delay = client.timer_delay(sleep);
        match select(Box::pin(sleep_ms(delay)), wake.next()).await {
            Either::Left(_) | Either::Right((Some(()), _)) => {}
            Either::Right((None, _)) => return,
        }
    }
}
