//! Claims: one request for the oldest open item of a queue, then the lease is
//! locked (Web Lock), journalled, and heartbeated.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use agentstore_protocol::lease::ClaimedRef;
use agentstore_protocol::lease_client::HeartbeatPlan;
use futures::future::select;
use wasm_bindgen::JsValue;
use wasm_bindgen_futures::JsFuture;
use web_sys::AbortSignal;

use super::client::ClientInner;
use super::error::{LeaseError, LossReason, Result};
use super::heartbeat::deferred;
use super::http::{jumps, now_ms, parse};
use super::journal::Entry;
use super::lease::{LeaseInner, Status};
use super::lifecycle;

/// What a claim gave.
pub enum Claimed {
    /// A lease, heartbeated from now on.
    Lease(Rc<LeaseInner>),
    /// Nothing open; the server suggests waiting this long (ms).
    Empty(Option<f64>),
}

impl ClientInner {
    /// Claims the oldest open item of `queue`.
    ///
    /// The lease's local deadline counts from when THIS request was sent. The
    /// lease is locked, then journalled, before it is returned.
    ///
    /// Each claim carries an `Idempotency-Key`. A claim that got no answer
    /// (a network error, a timeout, a 5xx: the server may have granted it;
    /// or a grant whose body cannot be read) leaves its key to the queue's
    /// next claim from this client, also when its caller stopped waiting
    /// (aborted), which then gets back the lease the lost answer carried (a
    /// new token and the next epoch) if the server still holds it for this worker
    /// (see the server's `Store::claim_once`), instead of a second item
    /// while the first waits out its TTL with an attempt spent. A `204` to
    /// such a key keeps it too: the unanswered copy may still reach the
    /// server late and take an item then.
    ///
    /// `close()` ends a claim awaiting its answer at once (`ClosedError`);
    /// the request runs on, and a lease it brings is released (see
    /// `claim_request`). `close()` waits for that, and for a claim between
    /// its answer and its return (whose lease it gives back), so no lease of
    /// this client is left running on the server once `close()` resolved
    /// (but one whose release got no answer).
    ///
    /// # Errors
    /// `NetworkError`, `RateLimitedError` (with `retryAfterMs`),
    /// `UnauthorizedError`, `AbortError` (the signal fired; a claim the server
    /// granted anyway is released, see `claim_request`), `ClosedError`
    /// (`close()` ran before or during the claim), `ValidationError`.
    pub async fn claim(
        self: &Rc<Self>,
        queue: &str,
        signal: Option<&AbortSignal>,
    ) -> Result<Claimed> {
        self.check_open()?;
        // `close()` waits for this call to return: a lease it brings after
        // `close()` began is given back below, before `close()` resolves.
        let _claiming = self.ending_call();
        let mut path = String::from("/v1/queues/");
        path.push_str(&String::from(js_sys::encode_uri_component(queue)));
        path.push_str("/claims");
        let sent_at = now_ms();
        let jumps = jumps();
        let timeout = self.config.request_timeout_ms;
        let answer = self.claim_request(queue, path, timeout, signal).await?;
        if answer.status == 204 {
            return Ok(Claimed::Empty(answer.retry_after_ms));
        }
        let resp: ClaimedRef = parse(&answer.body)?;
        let item = crate::value::get(&answer.body, &"item".into()).unwrap_or(JsValue::NULL);
        let mut plan = HeartbeatPlan::new(
            sent_at,
            resp.lease.ttl_ms as f64,
            resp.lease.heartbeat_ms as f64,
        );
        // A jump while the claim was out is checked at the first look.
        plan.jumps = jumps;
        let lease = Rc::new(LeaseInner::new(
            self,
            queue.to_owned(),
            resp.lease.token.clone(),
            resp.item,
            item,
            plan,
        )?);
        self.adopt(&lease, resp.lease.ttl_ms, resp.lease.heartbeat_ms)
            .await;
        if let Some(reason) = signal.and_then(crate::options::abort_reason) {
            self.give_back(&lease).await;
            return Err(LeaseError::Aborted(reason));
        }
        if self.closed.get() {
            self.give_back(&lease).await;
            return Err(LeaseError::Closed);
        }
        // Granted after the page's `pagehide`, whose beacon went out before
        // this lease existed: given back the same way now (else it stayed
        // `running` until its TTL, one attempt lost).
        if self.hidden.get() {
            lease.release_beacon(&self.base);
        }
        Ok(Claimed::Lease(lease))
    }

    /// The claim request under `signal` and `close()`. Either abandons the
    /// request rather than aborting it: aborting the fetch would only drop
    /// the answer, and a claim the server granted would stay `running` under
    /// a token no one holds until it expired (an attempt lost). The request
    /// runs on, and a claim granted after the caller stopped waiting is
    /// released at once; `close()` waits for that (the request and the
    /// release are each bounded by the request timeout).
    ///
    /// # Errors
    /// `AbortError` when the signal fired first; `ClosedError` when
    /// `close()` ran first; as [`ClientInner::authed`].
    async fn claim_request(
        self: &Rc<Self>,
        queue: &str,
        path: String,
        timeout: f64,
        signal: Option<&AbortSignal>,
    ) -> Result<super::http::Answer> {
        if let Some(reason) = signal.and_then(crate::options::abort_reason) {
            return Err(LeaseError::Aborted(reason));
        }
        // Taken once the claim is sure to be sent.
        let key = claim_key(&self.unanswered_claims, queue);
        let queue = queue.to_owned();
        let slot: Rc<RefCell<Option<Result<super::http::Answer>>>> = Rc::default();
        let abandoned = Rc::new(Cell::new(false));
        let (done, resolve) = deferred();
        {
            let (me, slot, abandoned) = (self.clone(), slot.clone(), abandoned.clone());
            // Counted until answered (and a grant no one waits for released).
            let on_wire = self.ending_call();
            crate::options::spawn(async move {
                let _on_wire = on_wire;
                let r = me
                    .authed_while("POST", &path, None, timeout, None, &|| Ok(None), Some(&key))
                    .await;
                // Also when the caller no longer waits (abandoned).
                me.keep_if_unanswered(&queue, &key, &r);
                match r {
                    Ok(a) if abandoned.get() && a.status == 201 => {
                        if let Ok(c) = parse::<ClaimedRef>(&a.body) {
                            me.release_until_answered(c.item.id, &c.lease.token).await;
                        }
                    }
                    r => *slot.borrow_mut() = Some(r),
                }
                let _ = crate::value::call0(&resolve, &JsValue::UNDEFINED);
            });
        }
        let (fired, on_abort) = deferred();
        let closing = self.closing.as_ref().map(|c| c.signal());
        let signals = [signal, closing.as_ref()];
        for s in signals.iter().flatten() {
            let _ = s.add_event_listener_with_callback("abort", &on_abort);
        }
        // (Nothing was awaited since `check_open()`: `close()` cannot have
        // fired its abort before the listener was added.)
        let _ = select(JsFuture::from(done), JsFuture::from(fired)).await;
        for s in signals.iter().flatten() {
            let _ = s.remove_event_listener_with_callback("abort", &on_abort);
        }
        // `fired` settled either way, so its JsFuture's callbacks are freed
        // (a signal that never aborts left them in wasm memory per claim).
        let _ = crate::value::call0(&on_abort, &JsValue::UNDEFINED);
        let answer = slot.borrow_mut().take();
        match answer {
            Some(r) => r,
            None => {
                abandoned.set(true);
                // Not closed: the caller's signal fired (a synthetic `abort`
                // event counts too, as for the store's writes).
                if self.closed.get() {
                    Err(LeaseError::Closed)
                } else {
                    Err(LeaseError::Aborted(
                        signal
                            .and_then(crate::options::abort_reason)
                            .unwrap_or(JsValue::UNDEFINED),
                    ))
                }
            }
        }
    }

    /// Gives back `lease`, granted to a caller that no longer takes it (its
    /// signal fired, or `close()` ran, while the answer was read). Its
    /// release goes on as [`ClientInner::release_until_answered`] when the
    /// first attempt gets no answer. However the release ends, the lease is
    /// no longer held here (not listed by `held()`, its signal aborted with
    /// `released`); its journal entry goes only once the server answered.
    pub(crate) async fn give_back(self: &Rc<Self>, lease: &LeaseInner) {
        let confirmed = match lease.release().await {
            Ok(()) => true,
            Err(e) if e.is_transient() => {
                self.release_until_answered(lease.item_id, &lease.token)
                    .await
            }
            Err(e) => e.proves_lease_over(),
        };
        // The message of the lease's own `release()` (one copy of it).
        const WHY: &str = "released by this client";
        match confirmed {
            true => lease.lose(LossReason::Released, WHY),
            false => lease.lose_unconfirmed(LossReason::Released, WHY),
        }
    }

    /// Releases `token`'s lease of `item_id`, which no one holds, and sends
    /// the release again (up to 4 more times, full jitter from 100 ms to 2 s,
    /// not once `close()` ran) while it gets no answer that is the lease
    /// server's own (a release is replayed by its token). One lost release
    /// would leave the item running under a token no one holds until its
    /// TTL, spending an attempt. The journal entry goes once the release is
    /// answered. Returns whether it was (the lease is over on the server).
    pub(crate) async fn release_until_answered(self: &Rc<Self>, item_id: i64, token: &str) -> bool {
        let mut attempt = 0u32;
        loop {
            match self.release_token(item_id, token, false).await {
                Err(e) if e.is_transient() && attempt < 4 && !self.closed.get() => {}
                Err(e) if !e.proves_lease_over() => return false,
                _ => {
                    self.forget_journal(item_id, token);
                    return true;
                }
            }
            attempt += 1;
            super::http::sleep_ms(agentstore_protocol::backoff::full_jitter_ms(
                attempt,
                100.0,
                2_000.0,
                super::http::random(),
            ))
            .await;
        }
    }

    /// Keeps `key` for the next claim of `queue` when its claim got no
    /// answer that settles it: a transient error (no answer, a timeout, a
    /// 5xx: the server may have granted it), a grant whose body cannot be
    /// read, or a `204` to a key reused from such a claim: an earlier copy
    /// of it may still be held up in the network and claim an item when it
    /// arrives, and the next claim sent with the key then gets that lease
    /// back (a replay) instead of leaving it running under a token nobody
    /// received until its TTL, an attempt spent. A refusal, or a `204` to a
    /// key sent once, spends it.
    fn keep_if_unanswered(&self, queue: &str, key: &str, r: &Result<super::http::Answer>) {
        let how = match r {
            Err(e) => u8::from(e.is_transient()),
            Ok(a) if a.status == 204 => 2,
            Ok(a) => u8::from(parse::<ClaimedRef>(&a.body).is_err()),
        };
        keep_claim_key(&self.unanswered_claims, queue, key, how);
    }

    /// Locks, then journals a lease, and heartbeats it.
    ///
    /// The item's Web Lock is taken, or queued for, BEFORE the journal entry is
    /// written: another page's `recover()` that reads the entry always finds
    /// the lock taken and leaves the live lease alone. The lock can still be
    /// held by an earlier holder of the item: a page frozen past the TTL whose
    /// claim has not ended locally yet. This lease then queues for the lock
    /// without a bound; Web Locks grant in request order, so when that holder
    /// lets go this page is the next holder, and no `recover()` elsewhere
    /// (which only takes a free lock) can take it in between and release the
    /// live lease.
    async fn adopt(self: &Rc<Self>, lease: &Rc<LeaseInner>, ttl_ms: u64, heartbeat_ms: u64) {
        // Registered first, so heartbeats (and the deadline) cover the lock and
        // journal work.
        let replaced = self
            .leases
            .borrow_mut()
            .insert(lease.item_id, lease.clone());
        // This client held the item already: the server granted a new claim, so
        // it reopened the item and the earlier claim is gone even if no
        // heartbeat has said so yet (a throttled timer). Lost now, so its
        // signal aborts and it lets go of the item's Web Lock (CASES C-F2).
        if let Some(old) = replaced.filter(|o| !Rc::ptr_eq(o, lease)) {
            old.lose(
                LossReason::ClaimLost,
                "claim lost: the item was claimed again by this client",
            );
        }
        self.ensure_heartbeats();
        let mut locked = false;
        if self.config.use_locks {
            let name = self.lock_name(lease.item_id);
            match lifecycle::lock(&name, 0.0).await {
                lifecycle::LockOutcome::Acquired(unlock) => {
                    hold_lock(lease, unlock);
                    locked = true;
                }
                lifecycle::LockOutcome::Busy => {
                    let queued = lifecycle::lock(&name, f64::INFINITY); // issued now
                    let lease = lease.clone();
                    crate::options::spawn(async move {
                        if let lifecycle::LockOutcome::Acquired(unlock) = queued.await {
                            hold_lock(&lease, unlock);
                        }
                    });
                    locked = true;
                }
                lifecycle::LockOutcome::Unsupported => {}
            }
        }
        lease.locking.set(locked);
        if !lease.is_active() {
            return; // ended already (lost or settled): nothing to journal
        }
        let entry = Entry {
            base: self.base.clone(),
            item_id: lease.item_id,
            token: lease.token().to_owned(),
            epoch: lease.epoch,
            queue: lease.queue.clone(),
            ttl_ms,
            heartbeat_ms,
            locked,
        };
        if self.journal.put(&entry).await.is_err() {
            lifecycle::warn("agentstore: lease journal write failed");
        }
        // It ended while the entry was being written: the end's own removal
        // may have run first, so remove it again (an expired lease keeps its
        // entry until its release is confirmed).
        if matches!(
            lease.status(),
            Status::Settled(_) | Status::Lost(LossReason::ClaimLost | LossReason::Released)
        ) {
            self.forget_journal(lease.item_id, lease.token());
        }
    }
}

#[wasm_bindgen::prelude::wasm_bindgen(module = "/js/lease.js")]
extern "C" {
    /// The `Idempotency-Key` for the next claim of `queue`: one a claim of
    /// it left unanswered (kept in `kept`, and marked reused), else a new
    /// one (js/lease.js `claimKey`).
    #[wasm_bindgen(js_name = claimKey)]
    fn claim_key(kept: &js_sys::Object, queue: &str) -> String;
    /// Settles `key` of a claim of `queue` in `kept`: `how` 1 keeps it for
    /// the queue's next claim, 2 keeps it if it was reused, 0 spends it
    /// (js/lease.js `keepClaimKey`).
    #[wasm_bindgen(js_name = keepClaimKey)]
    fn keep_claim_key(kept: &js_sys::Object, queue: &str, key: &str, how: u8);
}

/// Keeps `unlock` (the item's Web Lock) with `lease` while it is active, or
/// while a settle or release of it is on the wire (the call's return lets
/// it go); a lease that already ended lets the lock go at once.
fn hold_lock(lease: &LeaseInner, unlock: js_sys::Function) {
    if (lease.is_active() || lease.call_on_wire()) && lease.unlock.borrow().is_none() {
        *lease.unlock.borrow_mut() = Some(unlock);
    } else {
        let _ = crate::value::call0(&unlock, &JsValue::UNDEFINED);
    }
}
