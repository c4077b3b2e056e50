//! `work(queue, handler, {concurrency, pollIntervalMs})`: slots that claim,
//! run the handler under the lease's signal, and settle by its outcome.
//!
//! - Empty queue: wait `pollIntervalMs` plus jitter in `[0, min(interval/2, 30 s)]`
//!   (at least the server's `Retry-After`).
//! - No connection: back off `random(base, min(cap, base·2^n))` after the
//!   n-th failure in a row (n from 1), base 10 s, cap 5 min, reset by any
//!   answer (one schedule shared by the slots: n grows once per outage
//!   round, not once per failing slot).
//! - Handler result → `settle("done", result)`; throw → `settle("failed")` with
//!   the error's message; lease lost meanwhile → the lease's signal aborts,
//!   the result is discarded and nothing is settled; the slot claims again
//!   once the handler has returned (a slot runs one handler at a time).
//! - Before the first claim, the journal of earlier pages is reconciled
//!   (`recover()` without resume: their leases are released).
//! - `stop()` stops claiming, lets running handlers finish and settle, and
//!   resolves when every slot is idle.
//! - A claim refused for a reason retrying cannot fix (credentials refused
//!   after a refresh, or revoked; a queue out of the worker's scope; a
//!   request the server finds invalid: [`LeaseError::stops_work`]) stops the
//!   loop as `stop()` does, and `finished` rejects with that error. It is not
//!   a connection failure and is not retried.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use agentstore_protocol::lease::SettleState;
use agentstore_protocol::lease_client::{poll_delay_ms, Reconnect};
use futures::future::{select, Either};
use js_sys::{Function, Promise};
use wasm_bindgen::JsValue;
use wasm_bindgen_futures::JsFuture;
use web_sys::AbortController;

use super::claims::Claimed;
use super::client::ClientInner;
use super::error::LeaseError;
use super::http::{describe, now_ms, random};
use super::lease::{Ending, LeaseInner, Status};
use super::LossReason;

/// Options of a work loop.
#[derive(Debug, Clone)]
pub struct WorkOptions {
    /// Slots claiming and running in parallel (1..=64).
    pub concurrency: u32,
    /// Wait after an empty claim (ms), before jitter. Default 5 s.
    pub poll_interval_ms: f64,
    /// Reconnect backoff base (ms). Default 10 s.
    pub reconnect_base_ms: f64,
    /// Reconnect backoff cap (ms), at least `reconnect_base_ms` (`work()`
    /// refuses a smaller one; [`Reconnect`] would raise it to the base).
    /// Default 5 min.
    pub reconnect_cap_ms: f64,
}

impl Default for WorkOptions {
    fn default() -> WorkOptions {
        WorkOptions {
            concurrency: 1,
            poll_interval_ms: 5_000.0,
            reconnect_base_ms: agentstore_protocol::backoff::RECONNECT_BASE_MS,
            reconnect_cap_ms: agentstore_protocol::backoff::RECONNECT_CAP_MS,
        }
    }
}

/// Counters of a work loop.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Leases claimed.
    pub claimed: u32,
    /// Settled `done` (the handler returned, or settled `done` itself).
    pub done: u32,
    /// Settled `failed` (the handler threw, or settled `failed` itself).
    pub failed: u32,
    /// Lost before settling: result discarded, nothing settled.
    pub lost: u32,
    /// Ended by the handler itself without finishing the item: it released
    /// the lease, or settled it `blocked` or `paused`.
    pub released: u32,
    /// Connection failures (each followed by a backoff).
    pub connection_failures: u32,
    /// The most recent reconnect delay (ms).
    pub last_backoff_ms: u32,
}

/// A running work loop.
pub struct WorkerInner {
    client: Rc<ClientInner>,
    queue: String,
    handler: Function,
    options: WorkOptions,
    backoff: RefCell<Reconnect>,
    stopping: Cell<bool>,
    /// Aborted by `stop()`; every wait races its signal. Each wait awaits a
    /// Promise of its own that always settles (a timer raced with the
    /// signal, js/promise.js `raceAbort`): a `JsFuture` of a Promise that
    /// never settles keeps its callbacks in wasm memory for good, and one
    /// shared "stopped" Promise raced by every poll leaked that much per poll.
    stop: Option<AbortController>,
    /// Counters.
    pub stats: RefCell<Stats>,
    /// Backoff delays waited (ms), for tests of the schedule (last 32).
    pub backoffs: RefCell<Vec<f64>>,
    /// Delays waited after an empty or rate-limited claim (ms, last 32).
    pub polls: RefCell<Vec<f64>>,
    /// Resolves when every slot has ended; rejects with the error that
    /// stopped the loop (see [`LeaseError::stops_work`]), if one did.
    /// Marked handled: an app that does not read it gets the console
    /// warning, not an unhandled rejection.
    pub finished: RefCell<Option<Promise>>,
    /// The error that stopped the loop (its JS `Error`), until `finished`
    /// rejects with it.
    fatal: Cell<Option<JsValue>>,
}

/// How long (ms) a handler's failure is held back, once the page began to
/// be left (`beforeunload`), before it is settled `failed`. Firefox fails
/// the page's fetches when it unloads, before `pagehide`, and runs timers
/// in between (helper-241 measured `beforeunload` → fetch rejected →
/// `pagehide` about 20 ms later; Chromium fires `pagehide` first), so a
/// handler awaiting `lease.fetch` throws although its work was only cut
/// off: settled `failed` at once, the item was failed for good and the
/// beacon skipped it. Held back, the `pagehide` beacon releases the lease
/// (the item is redone, one attempt counted); a navigation that did not
/// happen (cancelled, a download) only delays a failure within
/// [`LEAVE_WINDOW_MS`] of its `beforeunload`, by this long, once.
pub const LEAVE_GRACE_MS: f64 = 3_000.0;

/// How long (ms) after the browser's own `beforeunload` a handler's failure
/// counts as the page's leaving (and is held [`LEAVE_GRACE_MS`]). The old
/// page runs until the new one's answer arrives, and Firefox fails its
/// fetches only then: a navigation to a slow server fails the handler
/// seconds after the `beforeunload`. A failure later than this belongs to
/// a page that stayed (the `beforeunload` led nowhere: a download, a
/// navigation cancelled or answered 204) and is settled at once; before,
/// such a mark held the next failure back however much later it came.
pub const LEAVE_WINDOW_MS: f64 = 10_000.0;

impl WorkerInner {
    /// Starts `options.concurrency` slots; `wrap` builds the JS `Lease` handed
    /// to the handler.
    pub fn start(
        client: Rc<ClientInner>,
        queue: String,
        handler: Function,
        options: WorkOptions,
        wrap: fn(Rc<LeaseInner>) -> JsValue,
    ) -> Rc<WorkerInner> {
        let w = Rc::new(WorkerInner {
            client,
            queue,
            handler,
            backoff: RefCell::new(Reconnect::new(
                options.reconnect_base_ms,
                options.reconnect_cap_ms,
            )),
            options,
            stopping: Cell::new(false),
            stop: AbortController::new().ok(),
            stats: RefCell::new(Stats::default()),
            backoffs: RefCell::new(Vec::new()),
            polls: RefCell::new(Vec::new()),
            finished: RefCell::new(None),
            fatal: Cell::new(None),
        });
        let n = w.options.concurrency.clamp(1, 64);
        let me = w.clone();
        // Only while the loop runs: in Firefox a `beforeunload` listener
        // may keep the page out of the back/forward cache. The client
        // weakly: its `leaving` is a plain `Cell` (no `Rc` of its own).
        let heard = Rc::downgrade(&w.client);
        let leave = super::lifecycle::listen(
            &super::lifecycle::BEFOREUNLOAD,
            true,
            // Only the browser's own (see `ClientInner::hidden`); one a
            // script dispatches after it (an app forwarding it) changes
            // nothing.
            Box::new(move |e| {
                if let (true, Some(c)) = (super::lifecycle::trusted(&e), heard.upgrade()) {
                    c.leaving.set(now_ms() + LEAVE_WINDOW_MS);
                }
            }),
        );
        let all = crate::options::spawn_promise(async move {
            // Reconcile what earlier pages left in the journal before
            // claiming; `stop()` or `client.close()` leaves the entries not
            // reached yet. After a `client.close()` (before or while it
            // ran) no warning: a refusal then (ClosedError) is the close's
            // doing, and nothing is claimed.
            if me
                .client
                .recover_until(false, &|| me.stopping.get() || me.client.closed.get())
                .await
                .is_err()
                && !me.client.closed.get()
            {
                super::lifecycle::warn("agentstore work(): journal reconcile failed");
            }
            let slots = js_sys::Array::new();
            for _ in 0..n {
                let w = me.clone();
                slots.push(&crate::options::spawn_promise(async move {
                    slot_loop(w, wrap).await;
                    Ok(JsValue::UNDEFINED)
                }));
            }
            let _ = JsFuture::from(Promise::all(&slots)).await;
            if let Some(cb) = leave {
                super::lifecycle::unlisten(&super::lifecycle::BEFOREUNLOAD, &cb);
            }
            me.fatal.take().map_or(Ok(JsValue::UNDEFINED), Err)
        });
        super::heartbeat::mark_handled(&all);
        *w.finished.borrow_mut() = Some(all);
        w
    }

    /// Stops claiming and ends the slots' waits.
    fn halt(&self) {
        self.stopping.set(true);
        if let Some(c) = &self.stop {
            c.abort();
        }
    }

    /// Stops claiming; resolves when running handlers have finished and settled.
    pub async fn stop(&self) {
        self.halt();
        let f = self.finished.borrow().clone();
        if let Some(f) = f {
            let _ = JsFuture::from(f).await;
        }
    }

    fn record_poll(&self, d: f64) {
        let mut p = self.polls.borrow_mut();
        if p.len() >= 32 {
            p.remove(0);
        }
        p.push(d);
    }

    /// Whether `stop()` was called, or an error stopped the loop.
    pub fn is_stopping(&self) -> bool {
        self.stopping.get()
    }

    /// Waits `ms`, or less if `stop()` is called or the client is closed.
    async fn wait(&self, ms: f64) {
        self.sleep(ms, true).await;
    }

    /// Waits `ms`, or less once the client is closed (or, with `or_stop`,
    /// once `stop()` is called). Every wait of a slot is one of these: a
    /// bare timer kept the worker's `finished` pending after `close()` had
    /// resolved, up to the timer's end (a settle retry's, until the lease's
    /// local deadline).
    async fn sleep(&self, ms: f64, or_stop: bool) {
        if self.client.closed.get() || (or_stop && self.stopping.get()) {
            return;
        }
        // Cleared when the wait ends early (`stop()`, `close()`): no timer
        // of up to an hour runs on after it. Infinity waits as long as a timer
        // can, never the 0 ms a non-finite delay is to `setTimeout`.
        let (mut wait, _end) = super::http::timer(ms);
        let stop = if or_stop { self.stop.as_ref() } else { None };
        for c in [stop, self.client.closing.as_ref()].into_iter().flatten() {
            wait = crate::store::race_abort_js(&wait, &c.signal(), &JsValue::UNDEFINED);
        }
        let _ = JsFuture::from(wait).await;
    }
}

async fn slot_loop(w: Rc<WorkerInner>, wrap: fn(Rc<LeaseInner>) -> JsValue) {
    // The backoff round this slot's next try belongs to: read before the
    // first try and after each answer, and kept across a backoff wait (the
    // retry belongs to the window it waited out; see `Reconnect`).
    let mut round = w.backoff.borrow().round();
    while !w.stopping.get() {
        // The page is being left (or sits in the back/forward cache): no
        // claim until it is shown again (see `ClientInner::hidden`); the
        // loop waits as after an empty claim, with the backoff schedule and
        // the poll delays of `stats()` as they were: nothing was asked.
        let hidden = w.client.hidden.get();
        let claimed = if hidden {
            Ok(Claimed::Empty(None))
        } else {
            w.client.claim(&w.queue, None).await
        };
        if !hidden && matches!(claimed, Ok(_) | Err(LeaseError::RateLimited { .. })) {
            // An answer: the schedule starts from the base again.
            w.backoff.borrow_mut().on_success();
            round = w.backoff.borrow().round();
        }
        // The `Retry-After` of what waits as an empty claim does.
        let retry_after = match claimed {
            Ok(Claimed::Lease(lease)) => {
                w.stats.borrow_mut().claimed += 1;
                if w.stopping.get() {
                    // Given back at once (one attempt: stop() does not wait
                    // out retries); a release that fails stops holding it
                    // locally, and it is counted as it ended.
                    end_or_drop(&w, &lease, false).await;
                    count(&w, &lease);
                    break;
                }
                if lease.status() == Status::Held {
                    run_one(&w, &lease, wrap).await;
                    continue;
                }
                // A claim answered past its local deadline (the answer took
                // longer than the TTL less the safety margin): the lease is
                // lost before the handler could run, so it never starts
                // (`status()` marks it `expired_locally` and gives it back).
                // The next claim waits as after an empty one: a TTL shorter
                // than the round trip would otherwise claim and give back
                // without pause.
                count(&w, &lease);
                None
            }
            Ok(Claimed::Empty(retry_after)) => retry_after,
            Err(LeaseError::RateLimited { retry_after_ms }) => Some(retry_after_ms),
            Err(LeaseError::Closed) => break,
            Err(e) => {
                // (A refusal by a proxy's page too: no outage, and no
                // retry fixes a misconfigured one.)
                if !e.is_transient() || e.is_foreign_refusal() {
                    let js = e.to_js();
                    web_sys::console::warn_2(&"agentstore work(): claim failed".into(), &js);
                    // Retrying cannot fix it: the loop stops (the running
                    // handlers finish and settle, as after `stop()`) and
                    // `finished` rejects with it. Not a connection
                    // failure, and no backoff.
                    if e.stops_work() {
                        w.fatal.set(Some(js));
                        w.halt();
                        break;
                    }
                }
                // No answer (or an error that retrying may fix): back off.
                // Slots failing in the same round share its window.
                let d = w.backoff.borrow_mut().on_failure(
                    round,
                    now_ms(),
                    random(),
                    e.retry_after_ms(),
                );
                round = w.backoff.borrow().round();
                {
                    let mut st = w.stats.borrow_mut();
                    st.connection_failures += 1;
                    st.last_backoff_ms = d.round() as u32;
                }
                {
                    let mut b = w.backoffs.borrow_mut();
                    if b.len() >= 32 {
                        b.remove(0);
                    }
                    b.push(d);
                }
                w.wait(d).await;
                continue;
            }
        };
        let d = poll_delay_ms(w.options.poll_interval_ms, retry_after, random());
        if !hidden {
            w.record_poll(d);
        }
        w.wait(d).await;
    }
}

/// Runs the handler for one lease and settles by its outcome.
async fn run_one(w: &Rc<WorkerInner>, lease: &Rc<LeaseInner>, wrap: fn(Rc<LeaseInner>) -> JsValue) {
    let js_lease = wrap(lease.clone());
    let outcome = match crate::value::call1(&w.handler, &JsValue::UNDEFINED, &js_lease) {
        Err(thrown) => Err(thrown),
        // A Promise of another realm or a library's thenable is awaited too.
        Ok(v) => match crate::value::as_promise(&v) {
            None => Ok(v),
            Some(p) => {
                let run = JsFuture::from(p);
                let ended = JsFuture::from(lease.ended.clone());
                match select(Box::pin(run), Box::pin(ended)).await {
                    Either::Left((r, _)) => r,
                    // The handler settled or released its lease itself and
                    // runs on: wait for it, so that a slot runs one handler
                    // at a time and `stop()` waits for it. (After
                    // `client.close()` nothing is waited for; a release by
                    // the `pagehide` beacon is a loss, below.)
                    Either::Right((_, run))
                        if !w.client.closed.get() && ended_by_handler(lease) =>
                    {
                        until_closed(w, run, false).await
                    }
                    // The lease ended first (lost): whatever the handler
                    // returns is discarded, but the slot stays taken until
                    // it returns (a handler that ignores its signal still
                    // runs, and `concurrency` bounds running handlers, as a
                    // Temporal or River worker's slots do). After `stop()`
                    // (no claim follows) or `client.close()` nothing is
                    // waited for: a handler that never returns must not
                    // hold up shutdown.
                    Either::Right((_, run)) => {
                        let _ = until_closed(w, run, true).await;
                        Err(JsValue::UNDEFINED)
                    }
                }
            }
        },
    };
    // The handler's own settle or release may still be in flight; its
    // outcome decides what follows. It ends by the lease's local deadline at
    // the latest (no heartbeat renews a lease while it is ending).
    // A settle or release the handler called without awaiting has gone out
    // during its call (or waits behind another ending call); one more
    // microtask lets a thenable's own settle start before looking.
    let _ = JsFuture::from(Promise::resolve(&JsValue::UNDEFINED)).await;
    lease.until_not_ending().await;
    if lease.status() != Status::Held && !lease.settle_unresolved() {
        // The handler ended the lease itself, or it was lost (not while
        // its settle's outcome is unknown: sent again below, it may be
        // answered as the replay of one that landed).
        count(w, lease);
        return;
    }
    // The page is being left and the handler threw (maybe only because
    // the navigation failed its fetches): its failure waits for the
    // `pagehide` beacon (see `LEAVE_GRACE_MS`). Only a failure close to the
    // `beforeunload`: one long after it belongs to a page that stayed.
    if outcome.is_err() && lease.asked.borrow().is_none() && now_ms() < w.client.leaving.get() {
        w.sleep(LEAVE_GRACE_MS, false).await;
        if lease.status() != Status::Held {
            count(w, lease);
            return;
        }
        // Still here: the page was not left after all.
        w.client.leaving.set(0.0);
    }
    // Held: repeat what the handler asked for if its call failed (the very
    // same settle, so that one whose answer was lost is recognised by the
    // server as a replay), else settle by the handler's outcome.
    let asked = lease.asked.borrow().clone();
    let (state, result, error) = match (asked, outcome) {
        (Some(Ending::Release), _) => {
            end_or_drop(w, lease, true).await;
            count(w, lease);
            return;
        }
        (Some(Ending::Settle(state, result, error)), _) => (state, result, error),
        (None, Ok(v)) if v.is_undefined() => (SettleState::Done, None, None),
        // A result JSON cannot carry (NaN, a BigInt, a cycle, a Date) is
        // never stored changed: the work failed, with the reason, as a
        // Temporal activity whose result cannot be serialised does.
        (None, Ok(v)) => match crate::value::json_value(&v) {
            Ok(copy) => (SettleState::Done, Some(copy), None),
            Err(e) => (
                SettleState::Failed,
                None,
                Some(agentstore_protocol::cat(&[
                    "the handler's result cannot be stored as JSON: ",
                    &e.message(),
                ])),
            ),
        },
        (None, Err(e)) => (SettleState::Failed, None, Some(describe(&e))),
    };
    // Recorded as asked: a `client.close()` during the retries below sends
    // this settle again instead of releasing the finished work.
    *lease.asked.borrow_mut() = Some(Ending::Settle(state, result.clone(), error.clone()));
    let mut attempt = 0u32;
    // Whether `client.close()` took this lease over: it ends it (the settle
    // recorded as asked, sent again; else a release), and nothing more is
    // sent from here. A transient failure is retried for as long as the
    // lease is held, never given up for a release while the settle's
    // outcome is unknown: it may have landed, or may still (a 504 whose
    // upstream commits later), and a release would hand the finished work
    // back; the local deadline ends that wait (no heartbeat goes out while
    // the outcome is unknown). Also once a heartbeat's verdict lost the
    // lease meanwhile (`settle_unresolved`): answered as the replay, the
    // item counts done; refused (a takeover), lost. Refusals that say it
    // did not land (429s from a gateway, a proxy's page without the
    // server's error body at any status, while heartbeats renew the
    // lease) are retried until `stop()`, which then releases the lease; a
    // 4xx page, until it refused the settle for good
    // (`Refusals::for_good`): the item is then settled `failed` with the
    // reason.
    let mut refusals = Refusals::default();
    let closed = loop {
        let outcome = lease.settle(state, result.clone(), error.clone()).await;
        // A page that is not the server's refused it: counted (see
        // `Refusals::for_good`).
        let for_good = outcome
            .as_ref()
            .err()
            .is_some_and(|e| refusals.for_good(lease, e));
        match outcome {
            Ok(_) => break false,
            // After an attempt whose outcome is unknown, any refusal but
            // the server's verdict on the lease (a proxy's 400 or 413 page)
            // says nothing about that attempt either: retried the same way,
            // never answered with a `failed` settle or a release, which
            // could reach the server before it (a 504 whose upstream
            // commits later) and undo the finished work.
            Err(e)
                if (e.is_transient()
                    || (lease.ending_unanswered.get() && !e.is_servers_verdict()))
                    && (lease.status() == Status::Held || lease.settle_unresolved())
                    && !w.client.closed.get()
                    && (lease.ending_unanswered.get() || !w.stopping.get())
                    && !for_good =>
            {
                // A 429's or 503's `Retry-After` (RFC 9110 §10.2.3).
                let retry_after = e.retry_after_ms().unwrap_or(0.0);
                // `stop()` ends a wait for a refused settle at once (it is
                // then released); one whose outcome is unknown waits on.
                let d = pause_ms(&mut attempt, retry_after);
                // Finished work waiting for its settle: no pagehide beacon
                // releases it meanwhile.
                lease.settle_retry_due.set(true);
                // The settle's outcome is unknown: it may be sent again
                // after a `close()` during the wait below (see there).
                let resend = lease.ending_unanswered.get();
                if resend {
                    // Never past the local deadline, which ends the wait
                    // (a `Retry-After: 3600` must not hold the slot and
                    // `stop()` for an hour after the lease is gone); nor
                    // past `client.close()`, which sends the settle itself.
                    let until_deadline = (lease.deadline() - now_ms()).max(0.0);
                    w.sleep(d.min(until_deadline), false).await;
                } else {
                    w.wait(d).await;
                }
                lease.settle_retry_due.set(false);
                // close() came during the pause: it sends the settle of a
                // held lease. One lost meanwhile with its settle's outcome
                // unknown it no longer knows of: that settle is sent once
                // more from here, to learn whether it landed (answered as
                // the replay: counted done; `close()` waits for it if it is
                // out before `close()` looks, which the wake-up order makes
                // likely, not certain). Before, the item counted lost even
                // when the settle had landed.
                if w.client.closed.get() {
                    if resend && lease.settle_unresolved() {
                        continue;
                    }
                    break true;
                }
            }
            // close() came while this settle was out, and it failed without
            // being applied for sure: close() sends it again. A release from
            // here would reach the wire first and hand the finished work
            // back to the queue.
            Err(e) if e.is_transient() && w.client.closed.get() => break true,
            // Refused for good (by the server, or by a page that is not
            // its own, again and again), or by a page once more after
            // `stop()` (given back, as before such pages were counted).
            Err(e) => {
                let ask = (state, result.is_some(), error.as_deref());
                settle_failed_or_drop(w, lease, &e, for_good, ask).await;
                if !matches!(lease.status(), Status::Settled(_)) {
                    // Given back or dropped: the outcome was discarded.
                    w.stats.borrow_mut().lost += 1;
                    return;
                }
                break false;
            }
        }
    };
    if closed {
        // Counted as close() ended it.
        let _ = JsFuture::from(lease.ended.clone()).await;
    }
    count(w, lease);
}

/// How many times a settle refused by a page that is not the server's (a
/// 4xx without its error body) is sent before it counts as refused for
/// good, once heartbeats renewed the lease meanwhile.
const FOREIGN_REFUSALS: u32 = 8;

/// The refusals of one settle by a page that is not the server's (a 4xx
/// without its error body).
#[derive(Default)]
struct Refusals {
    /// How many so far.
    count: u32,
    /// The lease's local deadline at the first.
    deadline: f64,
}

impl Refusals {
    /// Counts `e` when it is such a refusal, and says whether the settle
    /// is refused for good although `e` is transient: refused
    /// [`FOREIGN_REFUSALS`] times, and a heartbeat renewed the lease since
    /// the first (its local deadline moved), so the server is reachable
    /// and the page refuses this request (a proxy's 413 for a body it never
    /// passes, a WAF's 403), not everything. Retried for as long as the
    /// lease was held, it held the slot and kept the item running for good.
    /// An outage refusing every request (heartbeats too) is not bounded
    /// here: the lease's local deadline ends it. Never after an attempt of
    /// unknown outcome (it may have landed).
    fn for_good(&mut self, lease: &LeaseInner, e: &LeaseError) -> bool {
        if !e.is_foreign_refusal() || lease.ending_unanswered.get() {
            return false;
        }
        if self.count == 0 {
            self.deadline = lease.deadline();
        }
        self.count += 1;
        self.count >= FOREIGN_REFUSALS && lease.deadline() > self.deadline
    }
}

/// Ends a lease whose settle `ask` (state, with a result, error message)
/// was refused with `e` (not to be sent again). When it was refused for
/// good (by the server itself: a 4xx with its error body, such as 413 for a
/// result above its limit; or `for_good`: by a page that is not the
/// server's, see [`Refusals::for_good`]) and was not already a bare
/// `failed` settle (no result, a message no longer than the refusal's
/// reason), the item is settled
/// `failed` with the reason, so that it neither stays leased nor loops
/// through redeliveries. Otherwise, or if that fails too, the lease is
/// released or dropped ([`end_or_drop`]): a refusal by such a page after
/// `stop()` gives the item back (the same settle may pass later).
async fn settle_failed_or_drop(
    w: &WorkerInner,
    lease: &LeaseInner,
    e: &LeaseError,
    for_good: bool,
    (state, with_result, error): (SettleState, bool, Option<&str>),
) {
    // A page's refusal names its status (the message alone does not).
    let why = match e {
        LeaseError::Server { status, .. } if for_good => {
            let n = agentstore_protocol::canonical::decimal(u64::from(*status));
            agentstore_protocol::cat(&[e.message(), " (HTTP ", &n, ")"])
        }
        _ => e.message().to_owned(),
    };
    // (A `failed` settle is retried bare, once, unless it was: no result,
    // and a message no longer than the reason. A thrown error's message of
    // up to 8 KiB is above a server's `--max-body-bytes` of a few KiB: its
    // 413 settles the item `failed` with the reason, not released.)
    let bare =
        state == SettleState::Failed && !with_result && error.is_none_or(|m| m.len() <= why.len());
    if lease.status() == Status::Held && (!e.is_transient() || for_good) && !bare {
        let why = Some(why);
        let _ = lease.settle(SettleState::Failed, None, why).await;
    }
    end_or_drop(w, lease, false).await;
}

/// Releases a lease that is still held (`handed_back`: the handler asked
/// for it, so transient failures are retried like a settle's); if that
/// fails, stops holding it locally (`expired_locally`: no more heartbeats,
/// the journal keeps it for `recover()`), so that its server lease runs out
/// and the item is delivered again. A `client.close()` during a pause
/// between retries ends it: `close()` releases the lease itself.
async fn end_or_drop(w: &WorkerInner, lease: &LeaseInner, handed_back: bool) {
    let mut attempt = 0u32;
    while lease.status() == Status::Held {
        match lease.release().await {
            // close() came meanwhile: it releases the lease (it was held
            // when close() began, so close() ends it either way).
            Err(e) if handed_back && e.is_transient() && w.client.closed.get() => return,
            Err(e) if handed_back && e.is_transient() && attempt < 8 => {
                w.sleep(pause_ms(&mut attempt, 0.0), false).await;
                if w.client.closed.get() {
                    return;
                }
            }
            Err(_) if lease.status() == Status::Held => {
                lease.lose(
                    LossReason::ExpiredLocally,
                    "the lease could be neither settled nor released",
                );
            }
            _ => {}
        }
    }
}

/// The handler's outcome, or an error once `client.close()` was called (the
/// slot then stops waiting for a handler whose lease already ended), or,
/// with `or_stop`, once `stop()` was called.
async fn until_closed(
    w: &WorkerInner,
    mut run: std::pin::Pin<Box<JsFuture>>,
    or_stop: bool,
) -> Result<JsValue, JsValue> {
    loop {
        if w.client.closed.get() || (or_stop && w.stopping.get()) {
            return Err(JsValue::UNDEFINED);
        }
        match select(run, Box::pin(w.sleep(100.0, or_stop))).await {
            Either::Left((r, _)) => return r,
            Either::Right((_, pending)) => run = pending,
        }
    }
}

/// The wait before retrying an ending call, at least the server's
/// `Retry-After`: full jitter over 100 ms doubling up to 5 s (`attempt`
/// counts the retries).
fn pause_ms(attempt: &mut u32, retry_after_ms: f64) -> f64 {
    *attempt = attempt.saturating_add(1);
    agentstore_protocol::backoff::full_jitter_ms(*attempt, 100.0, 5_000.0, random())
        .max(retry_after_ms)
}

/// Whether the lease ended by a settle or release of the app's (or of this
/// loop at its request), not by a loss or the `pagehide` beacon.
fn ended_by_handler(lease: &LeaseInner) -> bool {
    match lease.status() {
        Status::Settled(_) => true,
        Status::Lost(LossReason::Released) => !lease.beaconed.get(),
        _ => false,
    }
}

/// Counts how a lease of this loop ended.
fn count(w: &WorkerInner, lease: &LeaseInner) {
    // Read before `stats` is borrowed: a lease past its deadline expires in
    // `status()`, whose abort event runs the app's listeners synchronously,
    // and one that reads `worker.stats` would find it borrowed (a panic,
    // which traps the module).
    // (`ended_by_handler` reads it again: a lease already lost or settled
    // by then, which no read changes.)
    let status = lease.status();
    let mut st = w.stats.borrow_mut();
    match status {
        Status::Settled(SettleState::Done) => st.done += 1,
        Status::Settled(SettleState::Failed) => st.failed += 1,
        Status::Settled(_) => st.released += 1,
        // Released by the handler (or by this loop at its request), not by
        // `client.close()` or the `pagehide` beacon (the handler's result
        // was discarded).
        Status::Lost(LossReason::Released) if !w.client.closed.get() && ended_by_handler(lease) => {
            st.released += 1
        }
        _ => st.lost += 1,
    }
}
