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
//! own can do the same check — only to the lease server's origin and the
//! origins the app lists in `leaseHeaderOrigins` (the token alone can release
//! the lease, so it never goes to a third party unless named).
//!
//! # When a lease is lost locally
//!
//! A lease is held at instant `now` (`http::now_ms`: `performance.now()`)
//! exactly while
//! `now < sent_at(last successful heartbeat, or the claim) + ttl − margin`
//! (margin: a tenth of the TTL, at most 5 s), and, after the wall clock was
//! seen to jump ahead of that clock (a suspend, or a clock set forward),
//! `now < (when the jump was seen) + 5 s` until a heartbeat sent after it
//! succeeds (`HeartbeatPlan::observe`). Every reader — `signal`,
//! `status`, `throwIfLost()`, `lease.fetch`, and each fenced call — checks this
//! first and, past it, loses the lease (`expired_locally`) synchronously, so
//! they agree at every instant, including the first one after a frozen page
//! resumes. A signal kept from earlier (`const { signal } = lease`, or the
//! one a `fetch` holds) is aborted by the heartbeat loop's timer, which a
//! browser throttles in a background tab (Chrome: once a minute), so it can
//! read "not aborted" past the deadline: read `lease.signal` again or call
//! `throwIfLost()` right before each write. A heartbeat that the server
//! accepts after that does not revive the lease: it is released instead.

use std::cell::{Cell, RefCell};
use std::rc::{Rc, Weak};

use agentstore_protocol::lease::{
    HeartbeatResponse, ItemRef, ItemState, SettleState, TokenRequest,
};
use agentstore_protocol::lease_client::HeartbeatPlan;
use agentstore_protocol::ErrorCode;
use js_sys::{Function, JsString, Object, Promise};
use wasm_bindgen::JsValue;
use web_sys::{AbortController, AbortSignal};

use super::client::{item_path, ClientInner};
use super::error::{LeaseError, LossReason, Result};
use super::http::{describe, jumps, now_ms, parse, to_js};
use crate::store::lines::json_parse;

/// Where a lease is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Ours; heartbeated.
    Held,
    /// A settle or release is in flight: not heartbeated (a heartbeat racing
    /// the settle would read `claim_lost` after the settle landed), but its
    /// local deadline still applies.
    Ending,
    /// Settled by us, into this state.
    Settled(SettleState),
    /// Lost, or released by us (the signal is aborted).
    Lost(LossReason),
}

/// An ending call: a settle (state, result, error) or a release.
#[derive(Clone)]
pub enum Ending {
    /// `settle(state, result, error)`.
    Settle(SettleState, Option<JsValue>, Option<String>),
    /// `release()`.
    Release,
}

/// The shared state of one lease (the JS `Lease` wraps an `Rc` of this).
pub struct LeaseInner {
    /// The client, weakly: a lease never keeps its client alive.
    client: Weak<ClientInner>,
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
    controller: AbortController,
    status: Cell<Status>,
    /// Local deadline and heartbeat schedule.
    pub(crate) plan: RefCell<HeartbeatPlan>,
    /// Test hook: heartbeats suspended (the local deadline still applies).
    pub(crate) paused: Cell<bool>,
    /// A settle or release of this lease went out and its outcome is unknown
    /// (no answer, or a 5xx): the server may have applied it, and then a
    /// heartbeat would be told `claim_lost`. No heartbeat goes out meanwhile
    /// (the local deadline still applies); the same call sent again is
    /// answered by the server as a replay when the first one landed.
    pub(crate) ending_unanswered: Cell<bool>,
    /// Of the calls whose outcome is unknown (`ending_unanswered`), one was
    /// a settle: only then may a settle go out on a lease lost meanwhile, to
    /// learn whether it landed ([`LeaseInner::settle_unresolved`]). After an
    /// unanswered release alone, nothing a settle could learn is pending.
    settle_unanswered: Cell<bool>,
    /// `work()` is waiting to send this lease's settle again (the last one
    /// was refused without landing, e.g. a 429): the `pagehide` beacon
    /// leaves the lease alone (see [`LeaseInner::release_beacon`]).
    pub(crate) settle_retry_due: Cell<bool>,
    /// Released by the `pagehide` beacon, not by a call of the app's: a
    /// `work()` handler running then did not end its lease itself.
    pub(crate) beaconed: Cell<bool>,
    /// The message of a heartbeat answered `claim_lost`, `state_conflict` or
    /// `not_found` while a settle or release was on the wire: that call may
    /// have caused it (it landed first), so its own answer decides. Applied
    /// (the lease lost) unless that answer says the call landed: the
    /// heartbeat went out before the call, so either way the server holds
    /// no lease under this token any more. When the call's outcome is
    /// unknown, the same settle may still be sent to learn it
    /// ([`LeaseInner::settle_unresolved`]).
    pub(crate) loss_while_ending: RefCell<Option<String>>,
    /// Settles and releases of this lease on the wire now. Unlike the
    /// `Ending` status, which a local expiry replaces while the call is out,
    /// this says whether an answer is still to come.
    in_flight: Cell<u32>,
    /// Resolves the waits of [`LeaseInner::until_not_ending`] when
    /// `in_flight` drops to 0 (a Promise, not a timer: timers crawl in a
    /// hidden tab).
    idle: RefCell<Vec<Function>>,
    /// The ending call that landed: its path, its body as JSON text and the
    /// server's answer. The same call made again (an app's double settle)
    /// gets that answer, as the server would answer a replay.
    landed: RefCell<Option<(String, JsString, JsValue)>>,
    /// A release was owed when the lease was lost locally while an ending
    /// call was out (see `release_after_loss`): sent if that call turns out
    /// not to have been applied.
    release_owed: Cell<bool>,
    /// The last ending call the app made on this lease (the JS `settle` /
    /// `release`), so that `work()` can repeat exactly what a handler asked
    /// for when its call failed; a release does not replace a settle that
    /// may land (unanswered, or on the wire and then answered without
    /// saying it did not land), which is sent again instead.
    pub(crate) asked: RefCell<Option<Ending>>,
    /// The app's release was made while a settle was on the wire: once that
    /// settle is answered, the release becomes what the app asked for
    /// ([`LeaseInner::asked`]) if the answer says the settle did not land
    /// (any refusal but no answer or a 5xx: a 400, a 413, a 429, a proxy's
    /// page), not if its outcome is unknown. Cleared by a later settle of
    /// the app's (the app's last call decides).
    pub(crate) release_behind: Cell<bool>,
    /// A release of this lease went on the wire (with no settle of unknown
    /// outcome before it), or one sent behind such a settle got no answer
    /// itself: the server may release the item at any moment and another
    /// worker claim it, so fenced use (`fetch`, `prepareRequest`,
    /// `throwIfLost`) is refused and the signal aborted (`released`) from
    /// the send (or from that unknown outcome), not from the answer.
    given_back: Cell<bool>,
    /// Resolves the Web Lock held for this lease, when one is held.
    pub(crate) unlock: RefCell<Option<Function>>,
    /// Whether this lease took (or queued for) its item's Web Lock. Its
    /// token is then released only while that lock is held: once the lock
    /// is free, another context's `recover({resume: true})` may carry on the
    /// journalled lease under the same token, and a release would end it.
    pub(crate) locking: Cell<bool>,
    /// Resolves `ended` (loss, settle or release).
    end_resolve: RefCell<Option<Function>>,
    /// Settles when the lease ends for any reason.
    pub(crate) ended: Promise,
}

impl LeaseInner {
    pub(crate) fn new(
        client: &Rc<ClientInner>,
        queue: String,
        token: String,
        view: ItemRef,
        item: JsValue,
        plan: HeartbeatPlan,
    ) -> Result<LeaseInner> {
        let controller = AbortController::new().map_err(|e| LeaseError::Network(describe(&e)))?;
        let (ended, end_resolve) = super::heartbeat::deferred();
        Ok(LeaseInner {
            client: Rc::downgrade(client),
            item_id: view.id,
            epoch: view.epoch,
            queue,
            token,
            item,
            controller,
            status: Cell::new(Status::Held),
            plan: RefCell::new(plan),
            paused: Cell::new(false),
            ending_unanswered: Cell::new(false),
            settle_unanswered: Cell::new(false),
            settle_retry_due: Cell::new(false),
            beaconed: Cell::new(false),
            loss_while_ending: RefCell::new(None),
            in_flight: Cell::new(0),
            idle: RefCell::new(Vec::new()),
            landed: RefCell::new(None),
            release_owed: Cell::new(false),
            release_behind: Cell::new(false),
            given_back: Cell::new(false),
            asked: RefCell::new(None),
            unlock: RefCell::new(None),
            locking: Cell::new(false),
            end_resolve: RefCell::new(Some(end_resolve)),
            ended,
        })
    }

    /// The client, while it lives.
    ///
    /// # Errors
    /// `Closed` once it is freed.
    pub(crate) fn client(&self) -> Result<Rc<ClientInner>> {
        self.client.upgrade().ok_or(LeaseError::Closed)
    }

    /// Whether `lease.fetch` may send the lease headers to `url` (the lease
    /// server's origin, or one the app listed in `leaseHeaderOrigins`).
    pub fn may_send_headers_to(&self, url: &str) -> bool {
        self.client
            .upgrade()
            .is_some_and(|c| c.may_receive_headers(url))
    }

    /// The lease's token (for `X-Lease-Token`).
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The signal aborted (with a `ClaimLostError`) when the lease is lost or
    /// released. Past the local deadline it is aborted before it is returned.
    pub fn signal(&self) -> AbortSignal {
        self.check_deadline();
        self.controller.signal()
    }

    /// Where the lease is (past the local deadline: lost, `expired_locally`).
    pub fn status(&self) -> Status {
        self.check_deadline();
        self.status.get()
    }

    /// Held or ending, without looking at the clock (for the heartbeat loop).
    pub(crate) fn is_active(&self) -> bool {
        matches!(self.status.get(), Status::Held | Status::Ending)
    }

    /// The local deadline on the [`now_ms`] clock (ms).
    pub fn deadline(&self) -> f64 {
        self.plan.borrow().deadline()
    }

    /// Past the local deadline: lose the lease now, synchronously.
    pub(crate) fn check_deadline(&self) {
        if self.is_active() && !self.live_now() {
            self.expire_locally();
        }
    }

    /// Whether the lease is within its local deadline now, after taking in
    /// a jump of the wall clock the lease clock saw since the last look
    /// ([`HeartbeatPlan::observe`]): a jump wakes the heartbeat loop, which
    /// then asks the server at once.
    pub(crate) fn live_now(&self) -> bool {
        let now = now_ms();
        if self.observe_clock(now) {
            if let Some(c) = self.client.upgrade() {
                c.wake();
            }
        }
        self.plan.borrow().is_live(now)
    }

    /// [`HeartbeatPlan::observe`] with the lease clock's jump count. Also
    /// while a settle or release is out or unanswered: no heartbeat goes out
    /// then (it would read `claim_lost` after a landed settle), so such a
    /// lease is lost locally 5 s after the jump unless that call is answered
    /// first; its answer still decides what became of the item. (Left
    /// unobserved, a lease whose settle failed on waking read as held for
    /// the rest of a TTL the server had long counted down.)
    pub(crate) fn observe_clock(&self, now: f64) -> bool {
        self.plan.borrow_mut().observe(now, jumps())
    }

    /// Suspends (true) or resumes (false) this lease's automatic heartbeats
    /// (test hook for a stalled worker). The local deadline still applies: a
    /// lease suspended past it is lost (`expired_locally`).
    pub fn set_heartbeats_paused(&self, paused: bool) {
        self.paused.set(paused);
        if let Some(c) = self.client.upgrade() {
            c.wake();
        }
    }

    /// The error for a call on a lease that is no longer held (checking the
    /// local deadline first).
    pub fn lost_error(&self) -> Option<LeaseError> {
        match self.status() {
            Status::Held | Status::Ending => None,
            Status::Lost(reason) => Some(self.claim_lost(reason, "the lease is no longer held")),
            Status::Settled(_) => {
                Some(self.claim_lost(LossReason::Released, "the lease was settled"))
            }
        }
    }

    /// [`LeaseInner::lost_error`], or `released` once a release of the
    /// lease was sent (it may have landed: see `given_back`): what the
    /// fenced uses (`fetch`, `prepareRequest`, `throwIfLost`) check.
    pub fn fenced_error(&self) -> Option<LeaseError> {
        self.lost_error().or_else(|| {
            self.given_back.get().then(|| {
                self.claim_lost(
                    LossReason::Released,
                    "a release of this lease was sent; it may have landed",
                )
            })
        })
    }

    /// Fences the lease once a release of it may have landed (see
    /// `given_back`): the signal aborts with `released`, once.
    fn give_back_now(&self) {
        if !self.given_back.replace(true) {
            let err = self.claim_lost(LossReason::Released, "released by this client");
            self.controller.abort_with_reason(&err.to_js());
        }
    }

    /// [`LeaseInner::lost_error`], or `expired_locally` once the local
    /// deadline has passed though the heartbeat loop has not yet marked it.
    pub(crate) fn gone(&self) -> Option<LeaseError> {
        self.lost_error().or_else(|| {
            (!self.live_now()).then(|| {
                self.claim_lost(
                    LossReason::ExpiredLocally,
                    "the lease's local deadline passed",
                )
            })
        })
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
        // Only a claim the server confirmed gone leaves the journal here; after
        // `expired_locally` the entry stays until its release is confirmed.
        self.lose_as(reason, message, reason != LossReason::ExpiredLocally);
    }

    /// [`LeaseInner::lose`] for a lease whose end the server has NOT
    /// confirmed (a release that failed or was only beaconed): its journal
    /// entry stays, so a later `recover()` releases it or sees it over.
    pub(crate) fn lose_unconfirmed(&self, reason: LossReason, message: &str) {
        self.lose_as(reason, message, false);
    }

    fn lose_as(&self, reason: LossReason, message: &str, forget: bool) {
        if !self.is_active() {
            return;
        }
        self.status.set(Status::Lost(reason));
        let err = self.claim_lost(reason, message);
        self.controller.abort_with_reason(&err.to_js());
        self.finish(forget);
    }

    /// The local deadline passed: lost (`expired_locally`), and the token is
    /// released at once, best effort (unless a settle or release of it is
    /// out: that call's answer decides), so that the item goes back to the
    /// queue now instead of after the server's TTL and reaper (a throttled
    /// timer that fired late, a frozen page). The journal entry stays until
    /// the server confirms the claim gone; a heartbeat the server accepts
    /// afterwards releases it again while this context still holds the
    /// item's Web Lock (or never took one).
    pub(crate) fn expire_locally(&self) {
        if !self.is_active() {
            return;
        }
        // First, so the release takes the item's Web Lock with it before
        // the loss would let it go.
        self.release_after_loss();
        self.lose(
            LossReason::ExpiredLocally,
            "no heartbeat succeeded before the local deadline",
        );
    }

    /// Releases the token of a lease lost locally, best effort; removes the
    /// journal entry once the server confirmed the claim is gone. The item's
    /// Web Lock goes with the release and is let go when it is answered; a
    /// lease that took a lock and holds it no more sends nothing (its entry
    /// is `recover()`'s, or the TTL's, to end).
    fn release_token_now(&self) {
        let Some(client) = self.client.upgrade() else {
            return;
        };
        let unlock = self.unlock.borrow_mut().take();
        if unlock.is_none() && self.locking.get() {
            return;
        }
        let item_id = self.item_id;
        let token = self.token.clone();
        // Counted as on the wire from now: `close()` waits for it.
        let on_wire = client.ending_call();
        crate::options::spawn(async move {
            let _on_wire = on_wire;
            match client.release_token(item_id, &token, false).await {
                // Kept for a later recover(): the release may not have landed.
                Err(e) if !e.proves_lease_over() => {}
                _ => client.forget_journal(item_id, &token),
            }
            if let Some(unlock) = unlock {
                let _ = crate::value::call0(&unlock, &JsValue::UNDEFINED);
            }
        });
    }

    /// A heartbeat sent at `sent_at` succeeded; its answer arrived at `now`
    /// (`late`: not the loop's outstanding heartbeat, whose `in_flight` mark
    /// stays: one already counted as failed, or a manual `heartbeat()`).
    pub(crate) fn on_heartbeat_ok(&self, sent_at: f64, now: f64, late: bool) {
        let renewed = |p: &mut HeartbeatPlan| {
            if late {
                p.on_late_success(sent_at, now)
            } else {
                p.on_success(sent_at, now)
            }
        };
        match self.status.get() {
            // Answered past the deadline: never revived.
            Status::Held | Status::Ending if !renewed(&mut self.plan.borrow_mut()) => {
                self.expire_locally();
            }
            // Lost locally, yet the server still took the heartbeat: give it
            // back (not once the lock is let go: see `release_token_now`).
            Status::Lost(LossReason::ExpiredLocally) => self.release_after_loss(),
            _ => {}
        }
    }

    /// Releases the token of a lease lost locally, unless a settle or
    /// release of it is on the wire or unanswered: that call ends it (a
    /// release racing a settle could undo finished work).
    fn release_after_loss(&self) {
        if self.ending_pending() {
            self.release_owed.set(true);
        } else {
            self.release_token_now();
        }
    }

    fn finish(&self, forget: bool) {
        if let Some(c) = self.client.upgrade() {
            c.forget_lease(self.item_id, &self.token, forget);
        }
        // The item's Web Lock stays while a settle or release is on the wire
        // (let go when it returns): another context's recover() would
        // otherwise find the lock free and release the lease under it.
        if self.in_flight.get() == 0 {
            self.let_go_of_lock();
        }
        if let Some(resolve) = self.end_resolve.borrow_mut().take() {
            let _ = crate::value::call0(&resolve, &JsValue::UNDEFINED);
        }
    }

    /// A settle or release of this lease is on the wire now.
    pub(crate) fn call_on_wire(&self) -> bool {
        self.in_flight.get() > 0
    }

    fn let_go_of_lock(&self) {
        if let Some(unlock) = self.unlock.borrow_mut().take() {
            let _ = crate::value::call0(&unlock, &JsValue::UNDEFINED);
        }
    }

    /// Maps a server rejection of a fenced call and ends the lease for it
    /// when it proves the lease over ([`LeaseError::proves_lease_over`]): an
    /// answer without the server's error body (a proxy's 404 or 409 page,
    /// during a deploy) proves nothing, and the lease stays held.
    fn on_rejection(&self, e: LeaseError) -> LeaseError {
        if !e.proves_lease_over() {
            return e;
        }
        match &e {
            // A settle of ours landed before (its answer was lost): the
            // lease ended settled by it, as a release told so does (see
            // `release`); this call wrote nothing.
            LeaseError::AlreadySettled { state, message, .. } => {
                self.settled_by_own(*state);
                LeaseError::AlreadySettled {
                    item_id: self.item_id,
                    state: *state,
                    message: message.clone(),
                }
            }
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
    /// gone, or the answer came past the local deadline; `NetworkError` when it
    /// cannot be reached (the lease is kept until its local deadline);
    /// `StateConflictError`, without sending anything, while a settle or
    /// release of the lease is on the wire or went unanswered (its own answer,
    /// or its retry, decides how the lease ends; a heartbeat's `claim_lost`
    /// could only be a race with it). A heartbeat sent just before this
    /// lease's own settle or release and refused because that call landed
    /// first rejects with `ClaimLostError` (item and reason) while the lease
    /// ends as that call says, its signal not aborted for it.
    pub async fn heartbeat(&self) -> Result<u64> {
        if let Some(e) = self.lost_error() {
            return Err(e);
        }
        if self.ending_pending() {
            return Err(LeaseError::Server {
                code: ErrorCode::StateConflict,
                status: ErrorCode::StateConflict.status(),
                message:
                    "a settle or release of this lease is out or unanswered: no heartbeat is sent"
                        .into(),
                retry_after_ms: None,
            });
        }
        let client = self.client()?;
        let body = to_js(&TokenRequest {
            token: self.token.clone(),
        });
        let sent_at = now_ms();
        let path = item_path(self.item_id, "/heartbeat");
        let timeout = client.config.request_timeout_ms;
        match client
            .authed_while(
                "POST",
                &path,
                Some(&body),
                timeout,
                None,
                &|| self.gone().map_or(Ok(None), Err),
                None,
            )
            .await
        {
            Ok(a) => {
                let r: HeartbeatResponse = parse(&a.body)?;
                // Not the loop's request: a loop heartbeat still out stays
                // counted as out (else the loop sent a second one meanwhile).
                self.on_heartbeat_ok(sent_at, now_ms(), true);
                match self.lost_error() {
                    Some(e) => Err(e),
                    None => Ok(r.ttl_ms),
                }
            }
            // A settle or release went out meanwhile: its answer decides
            // (`loss_while_ending`: applied if it is refused unlanded).
            Err(e) if self.ending_pending() => {
                if !e.proves_lease_over() {
                    return Err(e);
                }
                // Kept for the ending call's answer to apply while it is
                // on the wire, else lost now (`verdict_while_ending`). A
                // claim_lost comes back as this lease's ClaimLostError
                // (`itemId`, `reason`), as every other one.
                match e {
                    LeaseError::Server {
                        code: ErrorCode::ClaimLost | ErrorCode::NotFound,
                        message,
                        ..
                    } => {
                        let lost = self.claim_lost(LossReason::ClaimLost, &message);
                        self.verdict_while_ending(message);
                        Err(lost)
                    }
                    LeaseError::StateConflict(message) => {
                        self.verdict_while_ending(message.clone());
                        Err(LeaseError::StateConflict(message))
                    }
                    e => Err(e),
                }
            }
            Err(e) => Err(self.on_rejection(e)),
        }
    }

    /// A settle or release is in flight, or went out and its outcome is
    /// unknown: a heartbeat refused now may have raced it (sent before the
    /// ending call, answered after it landed), so only the ending call's own
    /// answer (or its retry) may end the lease.
    pub(crate) fn ending_pending(&self) -> bool {
        self.in_flight.get() > 0 || self.ending_unanswered.get()
    }

    /// Lost by a heartbeat's verdict that came while a settle of unknown
    /// outcome was out (alone or followed by a release of unknown outcome),
    /// and within the local deadline: that settle may have landed and
    /// caused the verdict, so a settle may still go out, only to learn it
    /// (the server answers the same body as a replay, and any other
    /// `already_settled`; a takeover, `claim_lost`). Not after a release of
    /// unknown outcome alone: a settle then could learn nothing, and is
    /// refused here with the loss, as on any lost lease.
    pub(crate) fn settle_unresolved(&self) -> bool {
        self.settle_unanswered.get()
            && self.status.get() == Status::Lost(LossReason::ClaimLost)
            && self.live_now()
    }

    /// A heartbeat sent before a settle or release was refused
    /// (`claim_lost`, `state_conflict`, `not_found`): the server holds no
    /// lease under this token any more, whichever came first. While that
    /// call is on the wire, kept for its answer to decide (it may land and
    /// end the lease as settled); once its outcome is unknown (it failed
    /// before this answer came), lost at once, and
    /// [`LeaseInner::settle_unresolved`] still lets the same settle learn
    /// whether it landed. (Kept then, the verdict was dropped by the next
    /// ending call, and the lease read as held until its local deadline.)
    pub(crate) fn verdict_while_ending(&self, message: String) {
        if self.in_flight.get() > 0 {
            *self.loss_while_ending.borrow_mut() = Some(message);
        } else {
            self.lose(LossReason::ClaimLost, &message);
        }
    }

    /// Waits until no settle or release of this lease is on the wire, even
    /// one whose lease expired locally meanwhile (its answer still decides
    /// how the lease ended). Bounded: an ending call ends by its request
    /// timeout.
    pub(crate) async fn until_not_ending(&self) {
        while self.in_flight.get() > 0 {
            let (idle, resolve) = super::heartbeat::deferred();
            self.idle.borrow_mut().push(resolve);
            let _ = wasm_bindgen_futures::JsFuture::from(idle).await;
        }
    }

    /// Settles the item into `state` with `result` (any JSON value) and an
    /// optional error message. On success the lease is over (its signal is NOT
    /// aborted). The local deadline keeps running while the settle is in
    /// flight: past it the signal aborts (`expired_locally`), but a settle the
    /// server then applies still ends the lease as settled. A heartbeat
    /// answered `claim_lost` meanwhile (sent before the settle, answered after
    /// it landed) does not end it: the settle's own answer decides. Unless
    /// that answer says it landed, such a verdict (also `state_conflict`,
    /// `not_found`: a takeover, an operator's pause) loses the lease at once
    /// (`claim_lost`, signal aborted): the server holds no lease under its
    /// token. After an unknown outcome (`NetworkError`, a 5xx) the same
    /// settle may still be sent within the local deadline, only to learn
    /// it: answered as the replay of one that landed, the lease ends
    /// settled; refused, it stays lost.
    ///
    /// # Errors
    /// `ClaimLostError` without sending anything when the lease is already lost
    /// (but for the settle that learns what became of one of unknown
    /// outcome, above); `ClaimLostError` / `StateConflictError` from the
    /// server (the signal aborts, nothing was written); `NetworkError` (the
    /// lease is kept, unless a refused heartbeat lost it; retry);
    /// `AlreadySettledError` when an earlier settle of this lease landed (its
    /// answer lost, or this one asks for something else after it): nothing
    /// was written by this one, and the lease is settled into the state that
    /// settle set (the error's `settledState`; the signal is not aborted).
    pub async fn settle(
        &self,
        state: SettleState,
        result: Option<JsValue>,
        error: Option<String>,
    ) -> Result<JsValue> {
        let body = Object::new();
        crate::error::set(&body, "token", &self.token.as_str().into());
        crate::error::set(&body, "state", &ItemState::from(state).as_str().into());
        if let Some(r) = result {
            crate::error::set(&body, "result", &r);
        }
        if let Some(e) = &error {
            crate::error::set(&body, "error", &e.as_str().into());
        }
        let path = item_path(self.item_id, "/settle");
        let answer = self.ending_call(&path, &body).await?;
        // The server applied it: settled, even if the local deadline passed
        // while the call was in flight (the signal then aborted already).
        self.status.set(Status::Settled(state));
        self.finish(true);
        Ok(answer)
    }

    /// Gives the item back to the queue now (one attempt is counted); the
    /// signal aborts with reason `released`.
    ///
    /// # Errors
    /// As [`LeaseInner::settle`].
    pub async fn release(&self) -> Result<()> {
        let body = to_js(&TokenRequest {
            token: self.token.clone(),
        });
        let path = item_path(self.item_id, "/release");
        let answer = self.ending_call(&path, &body).await?;
        // This lease's own settle landed before (its answer was lost, so
        // its outcome was unknown here): the server says the lease ended by
        // it, to the state `settled`, and released nothing.
        if let Some(state) = crate::error::get_str(&answer, "settled")
            .as_deref()
            .and_then(SettleState::parse)
        {
            self.settled_by_own(state);
            return Ok(());
        }
        self.lose(LossReason::Released, "released by this client");
        // Lost locally (the deadline) while the release was in flight: the
        // server released it, which is what the status says.
        self.status.set(Status::Lost(LossReason::Released));
        // Lost locally while the release was in flight: the entry still goes.
        if let Some(c) = self.client.upgrade() {
            c.forget_journal(self.item_id, &self.token);
        }
        Ok(())
    }

    /// The server says a settle of this lease into `state` landed (its
    /// answer lost): the lease is settled, its signal not aborted by it.
    fn settled_by_own(&self, state: SettleState) {
        self.status.set(Status::Settled(state));
        self.finish(true);
    }

    /// A fenced call that ends the lease (settle or release): no heartbeat of
    /// it runs meanwhile.
    ///
    /// Its answer can be lost after the server applied it (the call cleared
    /// the token). Sending the same call again is then answered by the server
    /// with the item (a replay of this token's own settle, same state, result
    /// and error; or of its release), not `claim_lost`, so a retried call that
    /// landed the first time is reported as done. Until an answer comes, no
    /// heartbeat goes out (`ending_unanswered`).
    async fn ending_call(&self, path: &str, body: &JsValue) -> Result<JsValue> {
        // One ending call on the wire at a time: a second (a release sent
        // while a settle is out, from close() or the app) waits for the first
        // and is then refused if that one ended the lease.
        self.until_not_ending().await;
        let state = crate::error::get_str(body, "state");
        if state.is_none()
            && self.release_behind.replace(false)
            && !self.ending_unanswered.get()
            && self.status.get() == Status::Held
        {
            *self.asked.borrow_mut() = Some(Ending::Release);
        }
        // Kept as a JS string: a large result is never copied into wasm
        // memory (which never shrinks). Sent as asked: after an unknown
        // outcome, the server answers the same body as a replay when the
        // first attempt landed, and another one `already_settled` (never
        // the first attempt's body in its place, which would report a
        // result written that was not asked for).
        let text = js_sys::JSON::stringify(body).unwrap_or_else(|_| JsString::from(""));
        // What goes on the wire is `text` itself (parsed back), never the
        // caller's object: one changed while the request waits for a
        // credential refresh would otherwise differ from the `text` a retry
        // resends, and the server would not answer that retry as a replay.
        let sent = json_parse(&text).unwrap_or_else(|_| body.clone());
        let body = &sent;
        if let Some((p, b, answer)) = self.landed.borrow().as_ref() {
            if p == path && *b == text {
                return Ok(answer.clone());
            }
        }
        // Another settle of a lease settled already: refused here as the
        // server would refuse it (nothing is sent).
        if let (Status::Settled(landed), true) = (self.status.get(), state.is_some()) {
            return Err(LeaseError::AlreadySettled {
                item_id: self.item_id,
                state: landed,
                message: "this lease was settled already; nothing was written".into(),
            });
        }
        // Sent on a lease lost meanwhile only to learn what became of an
        // earlier settle (see `settle_unresolved`): the status stays lost
        // unless the server says a settle of ours landed.
        let probe = state.is_some() && self.settle_unresolved();
        if !probe {
            if let Some(e) = self.lost_error() {
                return Err(e);
            }
        }
        let client = self.client()?;
        if !probe {
            self.status.set(Status::Ending);
        }
        let give_back = state.is_none() && !probe && !self.settle_unanswered.get();
        self.plan.borrow_mut().ending = true;
        let timeout = client.config.request_timeout_ms;
        // A heartbeat verdict kept before this call is not about it; and if
        // an earlier attempt's outcome is unknown, that attempt may have
        // landed and caused any verdict, whatever this one's answer.
        if self.in_flight.get() == 0 {
            self.loss_while_ending.take();
        }
        let after_unknown = self.ending_unanswered.get();
        self.in_flight.set(self.in_flight.get() + 1);
        let on_wire = client.ending_call();
        // A release the server may apply at once, whatever its answer's
        // fate: the local work stops and the fenced uses (`fetch`,
        // `prepareRequest`, `throwIfLost`) refuse from now on; the lease's
        // own calls (settle, release, heartbeats) still go out and the
        // server decides. Only now that this call counts as on the wire:
        // the signal's `abort` listeners run during `give_back_now`, and
        // one that ends the lease itself (`lease.release()`, `close()`)
        // then waits behind this call (`until_not_ending`) instead of
        // sending a second one beside it.
        if give_back {
            self.give_back_now();
        }
        // A release (its body has no `state`) may still go out past the
        // local deadline (it only gives the item back sooner); a settle may
        // not, unless it only asks what became of an earlier one.
        let fenced = state.is_some() && !probe;
        let r = client
            .authed_while(
                "POST",
                path,
                Some(body),
                timeout,
                None,
                &|| fenced.then(|| self.gone()).flatten().map_or(Ok(None), Err),
                None,
            )
            .await
            .and_then(|a| confirmed(a, self.item_id, state.as_deref()));
        drop(on_wire);
        self.in_flight.set(self.in_flight.get() - 1);
        self.plan.borrow_mut().ending = false;
        // Whether the server may have applied the call: no answer, or a 5xx
        // (a 429 or any 4xx says this one was not applied). After an
        // attempt whose outcome was unknown, only the server's verdict on
        // the lease says what became of that attempt (it may have landed);
        // any other refusal of this one (a 429, a 401, a proxy's 4xx, the
        // local deadline passing) leaves it unknown: heartbeats stay off
        // (else they took a landed settle for a lost claim) and no owed
        // release goes out (it could reopen finished work).
        let own_unknown = match &r {
            Err(LeaseError::Network(_)) => true,
            Err(LeaseError::Server { status, .. }) => *status >= 500,
            _ => false,
        };
        // A release sent while a settle of unknown outcome was pending is
        // not fenced at its send (that settle may have landed). Once the
        // release's own outcome is unknown as well, the server may have
        // released the item and another worker claimed it: fenced from now
        // (the lease is over either way, settled or released). Fenced at
        // the end, once this call's bookkeeping is done: the signal's
        // `abort` listeners run during `give_back_now`, and one that calls
        // back into the lease (`release()`, `settle()`, `close()`) must
        // find it as this call leaves it (else, with `in_flight` at 0, its
        // call took this one's `loss_while_ending` verdict and dropped it).
        let fence = state.is_none() && !probe && own_unknown;
        let unknown = own_unknown
            || r.as_ref()
                .is_err_and(|e| after_unknown && !e.is_servers_verdict());
        self.ending_unanswered.set(unknown);
        // A settle whose OWN outcome is unknown may have landed; it stays
        // pending through later calls of unknown outcome (a release or
        // settle after it refused unlanded, a 429). A settle refused
        // unlanded after a release of unknown outcome is none.
        let settle_pending = (state.is_some() && own_unknown) || self.settle_unanswered.get();
        self.settle_unanswered.set(unknown && settle_pending);
        // A release owed since a local loss: due once this call is known not
        // to have ended the lease (after an unknown outcome the journal
        // keeps it for recover()). Sent before the lock below is let go, so
        // it takes the lock with it.
        if r.is_ok() || unknown {
            self.release_owed.set(r.is_err() && self.release_owed.get());
        } else if self.release_owed.replace(false) {
            self.release_token_now();
        }
        if self.in_flight.get() == 0 {
            for resolve in self.idle.take() {
                let _ = crate::value::call0(&resolve, &JsValue::UNDEFINED);
            }
            // Ended (lost locally) while the call was out: the lock goes now.
            if !self.is_active() {
                self.let_go_of_lock();
            }
        }
        let verdict = self.loss_while_ending.take();
        match r {
            Ok(a) => {
                *self.landed.borrow_mut() = Some((path.to_owned(), text, a.body.clone()));
                Ok(a.body)
            }
            Err(e) => {
                let e = self.on_rejection(e);
                if self.status.get() == Status::Ending {
                    self.status.set(Status::Held);
                }
                // A heartbeat refused meanwhile was sent before this call:
                // the server holds no lease under this token any more,
                // whether this call was refused without landing (a 413, a
                // 400: the verdict was about the lease), or its outcome is
                // unknown (a takeover or an operator's pause came first, or
                // it landed and caused the verdict: `settle_unresolved`).
                // Dropped, the lease read as held with its signal live until
                // the local deadline, and `lease.fetch` stamped a token the
                // server had already refused.
                if let (Some(message), Status::Held) = (verdict, self.status.get()) {
                    self.lose(LossReason::ClaimLost, &message);
                }
                if fence {
                    self.give_back_now();
                }
                client.wake();
                Err(e)
            }
        }
    }

    /// Release through `navigator.sendBeacon` (the token in a text/plain body,
    /// which the server accepts without headers), for `pagehide` and a client
    /// dropped without `close()`. Falls back to a `keepalive` fetch. Ends the
    /// lease locally with reason `released`.
    pub(crate) fn release_beacon(&self, base: &str) {
        // A settle in flight, or one that got no answer (its outcome is
        // unknown, and close() would send it again), may land: a release
        // racing it could undo finished work (the item reopened, the settle
        // refused). A `work()` settle refused without landing (a 429) and
        // waiting for its retry is finished work too: a page restored from
        // the back/forward cache retries it, where a release handed the item
        // to another worker to do again. (An app's own refused settle is not
        // retried by the SDK: its lease is released.) If none lands, the
        // lease runs out at its TTL (as a closed page's does) and the
        // journal keeps it for recover().
        if self.status.get() != Status::Held
            || self.ending_unanswered.get()
            || self.settle_retry_due.get()
        {
            return;
        }
        let mut url = String::from(base);
        url.push_str(&item_path(self.item_id, "/release"));
        let body = to_js(&TokenRequest {
            token: self.token.clone(),
        });
        if let Some(text) = js_sys::JSON::stringify(&body)
            .ok()
            .and_then(|s| s.as_string())
        {
            super::lifecycle::beacon(&url, &text);
        }
        // A beacon is never answered: the journal keeps the entry until a
        // later recover() sees the lease over.
        self.beaconed.set(true);
        self.lose_unconfirmed(LossReason::Released, "released on pagehide");
    }
}

/// `answer` when it is the lease server's confirmation of the ending call
/// on item `item_id` (a settle into `state`, or a release): `{id, …}` naming
/// the item, for a settle also its `state` (or `unreadable_row: true`).
/// Any other 2xx (a service worker queueing POSTs offline, a captive
/// portal) says nothing about the lease: an unknown outcome, as a 5xx is,
/// so the identical call is sent again instead of the lease being taken
/// for settled while the server still holds it running.
///
/// # Errors
/// `Server` (`internal`, status 502) for an answer that does not confirm.
pub(crate) fn confirmed(
    answer: super::http::Answer,
    item_id: i64,
    state: Option<&str>,
) -> Result<super::http::Answer> {
    let field = |k: &str| crate::value::get(&answer.body, &k.into()).unwrap_or(JsValue::UNDEFINED);
    let same_item = field("id").as_f64() == Some(item_id as f64);
    let same_state = state.is_none_or(|s| {
        field("state").as_string().as_deref() == Some(s)
            || field("unreadable_row").as_bool() == Some(true)
    });
    if same_item && same_state {
        Ok(answer)
    } else {
        Err(LeaseError::Server {
            code: ErrorCode::Internal,
            status: 502,
            message: "a 2xx that is not the lease server's answer: outcome unknown".into(),
            retry_after_ms: None,
        })
    }
}
