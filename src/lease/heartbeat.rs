//! The heartbeat loop: one per client, owned by its own task, holding only a
//! `Weak` reference to the client (it ends when the client is dropped, or
//! holds no active lease; once the client is closed it sends nothing and
//! only loses leases at their local deadline).
//!
//! Each pass asks [`plan_pass`] (the pure model in
//! `agentstore_protocol::lease_client`, property-tested natively against a
//! simulated clock): leases past their local deadline are lost first
//! (`expired_locally`, before anything is sent), due leases are renewed in ONE
//! batched request that the loop does NOT await, and the loop then waits at
//! most until the earliest deadline of any lease it holds — or until an
//! answer, a new lease or a settle wakes it.

use std::rc::{Rc, Weak};

use agentstore_protocol::lease::{
    BatchHeartbeatEntry, BatchHeartbeatRequest, BatchHeartbeatResponse,
};
use agentstore_protocol::lease_client::{plan_pass, HeartbeatPlan};
use agentstore_protocol::ErrorCode;
use futures::future::{select, Either};
use js_sys::{Function, Promise};
use wasm_bindgen::JsValue;
use wasm_bindgen_futures::JsFuture;

use super::client::ClientInner;
use super::error::{LeaseError, LossReason};
use super::http::{now_ms, parse, random, sleep_ms, to_js};
use super::lease::LeaseInner;

/// Most leases per batched heartbeat request (the server's limit).
const MAX_BATCH: usize = 500;

impl ClientInner {
    /// Wakes the heartbeat loop to re-plan (a lease was added, resumed, paused
    /// or answered).
    pub(crate) fn wake(&self) {
        let f = match self.wake.borrow_mut().as_mut() {
            Some(slot) => slot.take(),
            None => None,
        };
        if let Some(f) = f {
            let _ = crate::value::call0(&f, &JsValue::UNDEFINED);
        }
    }

    /// Starts the loop unless it runs; wakes it otherwise.
    pub(crate) fn ensure_heartbeats(self: &Rc<Self>) {
        if self.wake.borrow().is_some() {
            self.wake();
            return;
        }
        *self.wake.borrow_mut() = Some(None);
        crate::options::spawn(heartbeat_loop(self.weak()));
    }

    fn timer_delay(&self, ms: f64) -> f64 {
        match &self.config.timer_delay {
            Some(f) => crate::value::call1(f, &JsValue::UNDEFINED, &JsValue::from(ms))
                .ok()
                .and_then(|v| v.as_f64())
                .filter(|d| d.is_finite())
                .unwrap_or(ms),
            None => ms,
        }
    }

    /// One pass: expire, send, and say how long to wait (ms); `None` = stop.
    ///
    /// Once `close()` ran nothing is sent, but the pass goes on while a lease
    /// is still active (its settle or release on the wire, which may hang up
    /// to the request timeout): a lease past its local deadline is lost then
    /// as at any other time, and its signal aborts at the deadline, not when
    /// the call gives up.
    fn heartbeat_pass(self: &Rc<Self>) -> Option<f64> {
        let closed = self.closed.get();
        let mut active = self.all();
        active.retain(|l| l.is_active());
        if active.is_empty() {
            return None;
        }
        let now = now_ms();
        let mut plans: Vec<HeartbeatPlan> = Vec::with_capacity(active.len());
        for l in &active {
            // A jump of the wall clock since the last look: a heartbeat is
            // due at once (see `HeartbeatPlan::observe`).
            l.observe_clock(now);
            let mut p = l.plan.borrow().clone();
            // No heartbeat while a settle's or release's answer is missing
            // (it may have landed: see `LeaseInner::ending_unanswered`), nor while the
            // test hook suspends them; the deadline still applies.
            p.ending |= closed || l.paused.get() || l.ending_unanswered.get();
            plans.push(p);
        }
        let pass = plan_pass(&plans, now);
        for &i in &pass.expire {
            active[i].expire_locally();
        }
        if !pass.heartbeat.is_empty() {
            let mut due: Vec<Rc<LeaseInner>> = Vec::with_capacity(pass.heartbeat.len());
            for &i in &pass.heartbeat {
                due.push(active[i].clone());
            }
            for l in &due {
                l.plan.borrow_mut().on_sent();
            }
            let timeout = pass.timeout_ms.max(1.0);
            // One request per chunk, all at once: a chunk never waits for
            // an earlier one's (slow) answer while its leases, marked sent,
            // get no other heartbeat.
            for chunk in due.chunks(MAX_BATCH) {
                let (me, chunk) = (self.clone(), chunk.to_vec());
                crate::options::spawn(async move {
                    me.heartbeat_batch(&chunk, now, timeout).await;
                    me.wake();
                });
            }
        }
        Some(pass.wake_in_ms.unwrap_or(0.0))
    }

    /// One batched heartbeat request for `chunk` (at most [`MAX_BATCH`]
    /// leases), sent at `sent_at`. After `timeout_ms` (the least time left
    /// to a deadline in the pass) it counts as a failure, so a retry can go
    /// out in time; the request itself runs on to the client's request
    /// timeout, and a late answer is still read (a success renews a lease
    /// still held, and releases one already lost).
    async fn heartbeat_batch(
        self: &Rc<Self>,
        chunk: &[Rc<LeaseInner>],
        sent_at: f64,
        timeout_ms: f64,
    ) {
        // Planned at `sent_at` but sent after the microtasks queued
        // meanwhile (the abort listeners of leases the pass expired among
        // them): a lease past its deadline by now is lost here and left out,
        // never heartbeated after its local deadline. The same again before
        // the request is sent a second time, after a `401` and a credential
        // refresh that may have outlasted a deadline: the body is built
        // again from the leases still held (sent as it was, it renewed on
        // the server a lease lost here, given up and being released).
        let body = || {
            let mut leases = Vec::with_capacity(chunk.len());
            for l in chunk {
                l.check_deadline();
                if l.is_active() {
                    leases.push(BatchHeartbeatEntry {
                        item_id: l.item_id,
                        token: l.token().to_owned(),
                    });
                }
            }
            // None left: not sent (the error is only counted as a failure).
            match leases.is_empty() {
                true => Err(LeaseError::Closed),
                false => Ok(Some(to_js(&BatchHeartbeatRequest { leases }))),
            }
        };
        let Ok(Some(first)) = body() else {
            return;
        };
        let request_timeout = self.config.request_timeout_ms;
        let mut request = Box::pin(self.authed_while(
            "POST",
            "/v1/heartbeats",
            Some(&first),
            request_timeout,
            None,
            &body,
            None,
        ));
        let mut late = false;
        let outcome = match select(request.as_mut(), Box::pin(sleep_ms(timeout_ms))).await {
            Either::Left((r, _)) => r,
            Either::Right(((), _)) => {
                let now = now_ms();
                for lease in chunk {
                    lease.plan.borrow_mut().on_failure(now, random());
                }
                self.wake();
                late = true;
                request.await
            }
        };
        let outcome = outcome.and_then(|a| parse::<BatchHeartbeatResponse>(&a.body));
        let now = now_ms();
        let Ok(resp) = outcome else {
            if !late {
                for lease in chunk {
                    lease.plan.borrow_mut().on_failure(now, random());
                }
            }
            return;
        };
        for lease in chunk {
            match resp.results.iter().find(|r| r.item_id == lease.item_id) {
                Some(r) if r.ok => lease.on_heartbeat_ok(sent_at, now, late),
                Some(r) => {
                    let code = r.error.as_ref().map_or(ErrorCode::ClaimLost, |e| e.code);
                    let message = r
                        .error
                        .as_ref()
                        .map_or("claim lost", |e| e.message.as_str());
                    match code {
                        // Sent before a settle or release that may have
                        // landed first: that call's own answer decides
                        // while it is on the wire; once its outcome is
                        // unknown, lost now
                        // (`LeaseInner::verdict_while_ending`). The
                        // heartbeat is no longer in flight either way.
                        ErrorCode::ClaimLost | ErrorCode::StateConflict | ErrorCode::NotFound
                            if lease.ending_pending() =>
                        {
                            lease.verdict_while_ending(message.into());
                            if !late {
                                lease.plan.borrow_mut().on_failure(now, random());
                            }
                        }
                        ErrorCode::ClaimLost | ErrorCode::StateConflict | ErrorCode::NotFound => {
                            lease.lose(LossReason::ClaimLost, message);
                        }
                        _ if late => {}
                        _ => lease.plan.borrow_mut().on_failure(now, random()),
                    }
                }
                None if late => {}
                None => lease.plan.borrow_mut().on_failure(now, random()),
            }
        }
    }
}

#[wasm_bindgen::prelude::wasm_bindgen(module = "/js/lease.js")]
extern "C" {
    /// `[promise, resolve]` (js/lease.js `deferred`).
    #[wasm_bindgen(js_name = deferred)]
    fn deferred_js() -> js_sys::Array;
}

/// A pending Promise and the function that resolves it.
pub(crate) fn deferred() -> (Promise, Function) {
    let pair = deferred_js();
    use wasm_bindgen::JsCast;
    (pair.get(0).unchecked_into(), pair.get(1).unchecked_into())
}

#[wasm_bindgen::prelude::wasm_bindgen(module = "/js/lease.js")]
extern "C" {
    /// Marks `p` handled (a no-op handler of its rejection): a Promise the
    /// app may never read rejects without an unhandled-rejection report,
    /// and whoever awaits it still gets the rejection (js/lease.js
    /// `markHandled`).
    #[wasm_bindgen(js_name = markHandled)]
    pub(crate) fn mark_handled(p: &Promise);
}

/// The loop (see the module docs). Holds the client only during a pass, never
/// while it waits.
async fn heartbeat_loop(weak: Weak<ClientInner>) {
    loop {
        let (woken, resolve) = deferred();
        let wait = {
            let Some(client) = weak.upgrade() else {
                return;
            };
            let Some(ms) = client.heartbeat_pass() else {
                *client.wake.borrow_mut() = None;
                return;
            };
            *client.wake.borrow_mut() = Some(Some(resolve.clone()));
            client.timer_delay(ms)
        };
        let _ = select(Box::pin(sleep_ms(wait)), JsFuture::from(woken)).await;
        // Settled either way: a JsFuture of a Promise that never settles
        // keeps its callbacks in wasm memory for good (one per pass).
        let _ = crate::value::call0(&resolve, &JsValue::UNDEFINED);
    }
}
