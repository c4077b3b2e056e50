//! One held lease: its token, epoch and item, its heartbeat plan, its
//! `AbortSignal`, and the fenced calls made with its token.
//!
//! # Fencing writes with the epoch
//!
//! The token fences calls to the lease server; writes elsewhere (your own API,
//! records in an [`crate::AgentStore`]) are fenced by the lease's `epoch`, which
//! grows on every claim of the item. Store the epoch with what you write and
//! refuse a write whose epoch is lower than the stored one:
//!
//! ```js
//! await store.mutate(`result:${lease.item.id}`, (cur) => {
//!   lease.throwIfLost();                      // the signal already aborted: stop
//!   if (cur && cur.leaseEpoch > lease.epoch) return undefined; // a newer attempt wrote
//!   return { ...cur, _id: `result:${lease.item.id}`, leaseEpoch: lease.epoch, value };
//! });
//! ```
//!
//! `lease.fetch()` sends `X-Lease-Token` and `X-Lease-Epoch` so a server of your
//! own can do the same check (or ask the lease server whether the token is still
//! current by heartbeating it).

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use agentstore_protocol::lease::{
    HeartbeatResponse, ItemView, SettleRequest, SettleState, TokenRequest,
};
use agentstore_protocol::lease_client::HeartbeatPlan;
use agentstore_protocol::ErrorCode;
use js_sys::{Function, Promise};
use wasm_bindgen::JsValue;
use web_sys::{AbortController, AbortSignal};

use super::client::ClientInner;
use super::error::{LeaseError, LossReason, Result};
use super::http::now_ms;

/// Where a lease is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Ours; heartbeated.
    Held,
    /// A settle or release is in flight: not heartbeated (a heartbeat racing
    /// the settle would read `claim_lost` after the settle landed).
    Ending,
    /// Settled by us.
    Settled,
    /// Lost, or released by us (the signal is aborted).
    Lost(LossReason),
}

/// The shared state of one lease (the JS `Lease` wraps an `Rc` of this).
pub struct LeaseInner {
    pub(crate) client: Rc<ClientInner>,
    /// The work item id.
    pub item_id: i64,
    /// The queue it was claimed from.
    pub queue: String,
    /// The fence for every call about this claim. Never logged.
    pub(crate) token: String,
    /// Grows on every claim of the item (exact below 2^53).
    pub epoch: u64,
    /// The item as the server sent it (a plain JS object).
    pub item: JsValue,
    /// Parsed item.
    pub view: ItemView,
    controller: AbortController,
    status: Cell<Status>,
    /// Local deadline and heartbeat schedule.
    pub(crate) plan: RefCell<HeartbeatPlan>,
    /// Test hook: heartbeats suspended (the lease is neither renewed nor
    /// expired locally while set).
    pub(crate) paused: Cell<bool>,
    /// Resolves the Web Lock held for this lease, when one is held.
    pub(crate) unlock: RefCell<Option<Function>>,
    /// Resolves `ended` (loss, settle or release).
    end_resolve: RefCell<Option<Function>>,
    /// Settles when the lease ends for any reason.
    pub(crate) ended: Promise,
}

impl LeaseInner {
    pub(crate) fn new(
        client: Rc<ClientInner>,
        queue: String,
        token: String,
        view: ItemView,
        item: JsValue,
        plan: HeartbeatPlan,
    ) -> Result<LeaseInner> {
        let controller =
            AbortController::new().map_err(|e| LeaseError::Network(super::http::describe(&e)))?;
        let slot: Rc<RefCell<Option<Function>>> = Rc::new(RefCell::new(None));
        let s2 = slot.clone();
        let ended = Promise::new(&mut |resolve, _| {
            *s2.borrow_mut() = Some(resolve);
        });
        let end_resolve = slot.borrow_mut().take();
        Ok(LeaseInner {
            client,
            item_id: view.id,
            epoch: view.epoch,
            queue,
            token,
            item,
            view,
            controller,
            status: Cell::new(Status::Held),
            plan: RefCell::new(plan),
            paused: Cell::new(false),
            unlock: RefCell::new(None),
            end_resolve: RefCell::new(end_resolve),
            ended,
        })
    }

    /// The lease's token (for `X-Lease-Token`).
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The signal aborted (with a `ClaimLostError`) when the lease is lost or released.
    pub fn signal(&self) -> AbortSignal {
        self.controller.signal()
    }

    /// Where the lease is.
    pub fn status(&self) -> Status {
        self.status.get()
    }

    /// The local deadline on the `performance.now()` clock (ms).
    pub fn deadline(&self) -> f64 {
        self.plan.borrow().deadline()
    }

    /// Suspends (true) or resumes (false) this lease's automatic heartbeats.
    /// For tests that simulate a stalled worker; while suspended the lease is
    /// neither renewed nor expired locally.
    pub fn set_heartbeats_paused(&self, paused: bool) {
        self.paused.set(paused);
        self.client.wake();
    }

    /// The error for a call on a lease that is no longer held.
    pub fn lost_error(&self) -> Option<LeaseError> {
        match self.status.get() {
            Status::Held | Status::Ending => None,
            Status::Lost(reason) => Some(self.claim_lost(reason, "the lease is no longer held")),
            Status::Settled => Some(self.claim_lost(LossReason::Released, "the lease was settled")),
        }
    }

    fn claim_lost(&self, reason: LossReason, message: &str) -> LeaseError {
        LeaseError::ClaimLost {
            item_id: self.item_id,
            reason,
            message: message.to_owned(),
        }
    }

    /// Ends the lease: aborts the signal with a `ClaimLostError` of `reason`,
    /// stops heartbeating it and releases its Web Lock. Idempotent.
    pub(crate) fn lose(&self, reason: LossReason, message: &str) {
        if !matches!(self.status.get(), Status::Held | Status::Ending) {
            return;
        }
        self.status.set(Status::Lost(reason));
        let err = self.claim_lost(reason, message);
        self.controller.abort_with_reason(&err.to_js());
        // Only a claim the server confirmed gone leaves the journal here; after
        // `expired_locally` the entry stays, so `recover()` releases it later.
        self.finish(reason != LossReason::ExpiredLocally);
    }

    fn finish(&self, forget: bool) {
        self.client.forget_lease(self.item_id, forget);
        if let Some(unlock) = self.unlock.borrow_mut().take() {
            let _ = unlock.call0(&JsValue::UNDEFINED);
        }
        if let Some(resolve) = self.end_resolve.borrow_mut().take() {
            let _ = resolve.call0(&JsValue::UNDEFINED);
        }
    }

    /// Maps a server rejection of a fenced call and ends the lease for it.
    fn on_rejection(&self, e: LeaseError) -> LeaseError {
        match &e {
            LeaseError::Server {
                code: ErrorCode::ClaimLost | ErrorCode::NotFound,
                message,
                ..
            } => {
                self.lose(LossReason::ClaimLost, message);
                self.claim_lost(LossReason::ClaimLost, message)
            }
            LeaseError::StateConflict(message) => {
                self.lose(LossReason::ClaimLost, message);
                e
            }
            _ => e,
        }
    }

    /// Renews the lease now (the automatic heartbeats do this already).
    /// Returns the TTL (ms).
    ///
    /// # Errors
    /// `ClaimLostError` (and the signal aborts) when the server says the claim is
    /// gone; `NetworkError` when it cannot be reached (the lease is kept until
    /// its local deadline).
    pub async fn heartbeat(&self) -> Result<u64> {
        if let Some(e) = self.lost_error() {
            return Err(e);
        }
        let body = to_json(&TokenRequest {
            token: self.token.clone(),
        })?;
        let sent_at = now_ms();
        let path = format!("/v1/items/{}/heartbeat", self.item_id);
        let timeout = self.client.config.request_timeout_ms;
        match self
            .client
            .authed("POST", &path, Some(&body), timeout, None)
            .await
        {
            Ok(a) => {
                let r: HeartbeatResponse = parse(&a.text)?;
                if self.status.get() == Status::Held {
                    self.plan.borrow_mut().on_success(sent_at);
                }
                Ok(r.ttl_ms)
            }
            Err(e) => Err(self.on_rejection(e)),
        }
    }

    /// Settles the item into `state` with `result` (JSON) and an optional
    /// error message. On success the lease is over (its signal is NOT aborted).
    ///
    /// # Errors
    /// `ClaimLostError` without sending anything when the lease is already lost;
    /// `ClaimLostError` / `StateConflictError` from the server (the signal
    /// aborts, nothing was written); `NetworkError` (the lease is kept; retry).
    pub async fn settle(
        &self,
        state: SettleState,
        result: Option<serde_json::Value>,
        error: Option<String>,
    ) -> Result<JsValue> {
        let body = to_json(&SettleRequest {
            token: self.token.clone(),
            state,
            result,
            error,
        })?;
        let path = format!("/v1/items/{}/settle", self.item_id);
        let answer = self.ending_call(&path, &body).await?;
        self.status.set(Status::Settled);
        self.finish(true);
        Ok(js_sys::JSON::parse(&answer).unwrap_or(JsValue::NULL))
    }

    /// Gives the item back to the queue now (one attempt is counted); the
    /// signal aborts with reason `released`.
    ///
    /// # Errors
    /// As [`LeaseInner::settle`].
    pub async fn release(&self) -> Result<()> {
        let body = to_json(&TokenRequest {
            token: self.token.clone(),
        })?;
        let path = format!("/v1/items/{}/release", self.item_id);
        self.ending_call(&path, &body).await?;
        self.lose(LossReason::Released, "released by this client");
        Ok(())
    }

    /// A fenced call that ends the lease: no heartbeat of it runs meanwhile.
    async fn ending_call(&self, path: &str, body: &str) -> Result<String> {
        if let Some(e) = self.lost_error() {
            return Err(e);
        }
        self.status.set(Status::Ending);
        let timeout = self.client.config.request_timeout_ms;
        match self
            .client
            .authed("POST", path, Some(body), timeout, None)
            .await
        {
            Ok(a) => Ok(a.text),
            Err(e) => {
                let e = self.on_rejection(e);
                if self.status.get() == Status::Ending {
                    self.status.set(Status::Held);
                }
                Err(e)
            }
        }
    }

    /// Release through `navigator.sendBeacon` (the token in a text/plain body,
    /// which the server accepts without headers), for `pagehide`. Falls back to
    /// a `keepalive` fetch. Ends the lease locally with reason `released`.
    pub(crate) fn release_beacon(&self) {
        if !matches!(self.status.get(), Status::Held | Status::Ending) {
            return;
        }
        let url = format!("{}/v1/items/{}/release", self.client.base, self.item_id);
        if let Ok(body) = to_json(&TokenRequest {
            token: self.token.clone(),
        }) {
            super::lifecycle::beacon(&url, &body);
        }
        self.lose(LossReason::Released, "released on pagehide");
    }
}

pub(crate) fn to_json<T: serde::Serialize>(v: &T) -> Result<String> {
    serde_json::to_string(v).map_err(|e| LeaseError::Validation(e.to_string()))
}

pub(crate) fn parse<T: serde::de::DeserializeOwned>(text: &str) -> Result<T> {
    serde_json::from_str(text).map_err(|e| LeaseError::Server {
        code: ErrorCode::Internal,
        status: 200,
        message: format!("unexpected answer: {e}"),
    })
}
