//! The lease CLIENT's pure rules: the local deadline, when to heartbeat (also
//! after a late timer), how heartbeats of many leases are batched, and the
//! reconnect backoff state of a work loop.
//!
//! Every time here is a `performance.now()`-style reading in milliseconds on
//! ONE monotonic clock of the client: only differences are ever used, never
//! a wall clock, and never a comparison with the server's clock (case C-T1).
//! The server's TTL is measured on the database clock from when the server
//! APPLIED a heartbeat, which is never earlier than when the client SENT it; so
//! `sent_at + ttl` is a point at which the server cannot yet have taken the claim
//! over, and the local deadline keeps a safety margin before it.
//!
//! Randomness comes in as `r ∈ [0, 1)`.

use crate::backoff::{full_jitter_ms, poll_jitter_ms, reconnect_delay_ms};
use crate::backoff::{RECONNECT_BASE_MS, RECONNECT_CAP_MS};

/// The safety margin kept before `sent_at + ttl`: a tenth of the TTL, at most 5 s
/// (9 s → 0.9 s; 90 s → 5 s). It absorbs a timer that fires a little late and the
/// time between noticing the deadline and the work observing its abort signal.
pub fn safety_margin_ms(ttl_ms: f64) -> f64 {
    (ttl_ms / 10.0).clamp(0.0, 5_000.0)
}

/// The heartbeat interval actually used: the server's suggestion, but never more
/// than half the time to the local deadline, so one failed heartbeat still leaves
/// room for a retry before the deadline.
pub fn effective_interval_ms(ttl_ms: f64, heartbeat_ms: f64, margin_ms: f64) -> f64 {
    let room = ((ttl_ms - margin_ms) / 2.0).max(1.0);
    if heartbeat_ms.is_finite() && heartbeat_ms > 0.0 {
        heartbeat_ms.min(room)
    } else {
        room
    }
}

/// How long (ms) a lease may go on reading as held after its clock saw the
/// wall clock jump ahead of it ([`HeartbeatPlan::observe`]) without a
/// heartbeat sent after the jump being answered.
///
/// Such a jump is either a suspend (the monotonic clock stops while the
/// machine sleeps, and the server may have reaped the lease meanwhile) or a
/// wall clock set forward (nothing happened to the lease; case C-T1): the
/// client cannot tell them apart, so it asks the server at once and holds
/// the lease for at most this long meanwhile.
pub const CONFIRM_WINDOW_MS: f64 = 5_000.0;

/// What the heartbeat scheduler should do for one lease at a given moment.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Step {
    /// Heartbeat now. `timeout_ms` bounds the request: the time left to the
    /// local deadline (an answer after it cannot keep the lease any more).
    Heartbeat {
        /// Give up on the request after this long (ms).
        timeout_ms: f64,
    },
    /// The local deadline has passed: the lease is lost (`expired_locally`),
    /// whatever its heartbeats did. Never a heartbeat past the deadline: the
    /// server may already have handed the item to another worker.
    Expire,
    /// Nothing to send for this long (ms); never longer than the time left to
    /// the deadline.
    Sleep(f64),
}

/// The heartbeat state of one lease.
///
/// The lease is held at instant `now` exactly when `now < deadline()`, where
/// `deadline() = last_ok_sent_at + ttl − margin`: a pure function of the clock
/// and of when the last SUCCESSFUL heartbeat (or the claim) was SENT. Every
/// reader (the `signal`, `throwIfLost()`, `lease.fetch`, the heartbeat loop)
/// asks [`HeartbeatPlan::is_live`], so they agree at every instant.
#[derive(Debug, Clone, PartialEq)]
pub struct HeartbeatPlan {
    /// Server TTL (ms).
    pub ttl_ms: f64,
    /// Interval between heartbeats (ms), after [`effective_interval_ms`].
    pub interval_ms: f64,
    /// Kept before `sent_at + ttl` (ms).
    pub margin_ms: f64,
    /// When the last SUCCESSFUL heartbeat (or the claim) was SENT.
    pub last_ok_sent_at: f64,
    /// Consecutive heartbeat attempts that failed without an answer from the
    /// server (network error, timeout, 5xx) since the last success.
    pub failures: u32,
    /// When the next retry after a failure is due (only meaningful when
    /// `failures > 0`).
    pub retry_at: f64,
    /// A heartbeat of this lease is in flight: no second one is sent until it
    /// ends, but the deadline still applies.
    pub in_flight: bool,
    /// A settle or release of this lease is in flight: it is not heartbeated (a
    /// heartbeat racing the settle would read `claim_lost` after the settle
    /// landed), but the deadline still applies.
    pub ending: bool,
    /// The clock's jump count this plan saw last (see [`HeartbeatPlan::observe`]).
    pub jumps: u32,
    /// After a jump: when it was seen and the instant (ms) by which a
    /// heartbeat sent at or after that must have succeeded, or the lease is
    /// lost locally. `None` when no jump awaits confirmation.
    pub confirm: Option<(f64, f64)>,
}

impl HeartbeatPlan {
    /// The plan of a lease whose claim request was sent at `claim_sent_at`.
    pub fn new(claim_sent_at: f64, ttl_ms: f64, heartbeat_ms: f64) -> HeartbeatPlan {
        let ttl_ms = if ttl_ms.is_finite() && ttl_ms > 0.0 {
            ttl_ms
        } else {
            1.0
        };
        let margin_ms = safety_margin_ms(ttl_ms);
        HeartbeatPlan {
            ttl_ms,
            interval_ms: effective_interval_ms(ttl_ms, heartbeat_ms, margin_ms),
            margin_ms,
            last_ok_sent_at: claim_sent_at,
            failures: 0,
            retry_at: claim_sent_at,
            in_flight: false,
            ending: false,
            jumps: 0,
            confirm: None,
        }
    }

    /// `last_ok_sent_at + ttl − margin`: from this instant on the lease is lost
    /// locally (`expired_locally`); the server cannot take the claim over
    /// before `last_ok_sent_at + ttl`. While a jump awaits confirmation, the
    /// earlier of that and the confirmation's own deadline.
    pub fn deadline(&self) -> f64 {
        let deadline = self.last_ok_sent_at + self.ttl_ms - self.margin_ms;
        match self.confirm {
            Some((_, by)) => deadline.min(by),
            None => deadline,
        }
    }

    /// Takes in the lease clock's jump count `jumps` at `now` (the number of
    /// times the wall clock was seen to jump ahead of the monotonic clock).
    /// A count not seen before makes a heartbeat due at once (also while one
    /// sent before the jump is still out, or a retry after a failure is
    /// waiting) and bounds the lease to [`CONFIRM_WINDOW_MS`] from the first
    /// jump not yet confirmed until a heartbeat sent from now on succeeds: a
    /// suspend the server noticed loses the lease when that heartbeat is
    /// answered `claim_lost` (or when the window ends without an answer),
    /// and a wall clock merely set forward changes nothing (C-T1: the client
    /// measures durations only). Only a heartbeat sent after the LAST jump
    /// confirms, and a later jump never extends the window. Returns whether
    /// a heartbeat became due.
    pub fn observe(&mut self, now: f64, jumps: u32) -> bool {
        if jumps == self.jumps {
            return false;
        }
        self.jumps = jumps;
        let by = self.confirm.map_or(now + CONFIRM_WINDOW_MS, |(_, by)| by);
        self.confirm = Some((now, by));
        // A heartbeat out since before the jump cannot confirm it: the
        // confirming one goes out beside it, and a retry waits no longer.
        self.in_flight = false;
        self.retry_at = self.retry_at.min(now);
        true
    }

    /// Whether the lease is still ours at `now` (`now < deadline()`).
    pub fn is_live(&self, now: f64) -> bool {
        now < self.deadline()
    }

    /// When the next heartbeat is due.
    pub fn next_due(&self) -> f64 {
        if self.failures == 0 {
            if let Some((seen, _)) = self.confirm {
                return seen;
            }
            self.last_ok_sent_at + self.interval_ms
        } else {
            self.retry_at
        }
    }

    /// The step at `now`. Past the deadline: [`Step::Expire`], always (also for
    /// a timer that fired late because the page was throttled or frozen, and
    /// for a lease with a heartbeat or settle in flight). Otherwise a due
    /// heartbeat runs at once however late its timer fired.
    pub fn step(&self, now: f64) -> Step {
        let deadline = self.deadline();
        if now >= deadline {
            return Step::Expire;
        }
        if self.in_flight || self.ending {
            return Step::Sleep(deadline - now);
        }
        let due = self.next_due();
        if now >= due {
            Step::Heartbeat {
                timeout_ms: deadline - now,
            }
        } else {
            Step::Sleep(due.min(deadline) - now)
        }
    }

    /// A heartbeat of this lease was sent at `now`.
    pub fn on_sent(&mut self) {
        self.in_flight = true;
    }

    /// A heartbeat sent at `sent_at` succeeded; its answer arrived at `now`.
    /// Returns whether the lease is (still) held. An answer that arrives at or
    /// after the deadline does not revive the lease (the caller releases it
    /// instead); a success older than the last one never moves the deadline back.
    /// A success sent at or after a jump was seen ends its confirmation.
    pub fn on_success(&mut self, sent_at: f64, now: f64) -> bool {
        self.in_flight = false;
        self.on_late_success(sent_at, now)
    }

    /// The answer of a heartbeat already given up on (its timeout counted as a
    /// failure and a retry may be in flight) arrived after all, a success: as
    /// [`HeartbeatPlan::on_success`], leaving the retry's `in_flight` alone.
    pub fn on_late_success(&mut self, sent_at: f64, now: f64) -> bool {
        if !self.is_live(now) {
            return false;
        }
        self.last_ok_sent_at = self.last_ok_sent_at.max(sent_at);
        self.failures = 0;
        if self.confirm.is_some_and(|(seen, _)| sent_at >= seen) {
            self.confirm = None;
        }
        true
    }

    /// A heartbeat failed without a server answer at `now`: retry after a
    /// full-jitter delay (base a quarter interval, cap one interval), but
    /// always before the deadline when there is still room.
    pub fn on_failure(&mut self, now: f64, r: f64) {
        self.in_flight = false;
        self.failures = self.failures.saturating_add(1);
        let base = (self.interval_ms / 4.0).max(1.0);
        let mut delay =
            full_jitter_ms(self.failures - 1, base, self.interval_ms, r).max(base / 2.0);
        // While a jump awaits confirmation (this may be the answer of a
        // heartbeat sent before it), the retry goes out within a tenth of
        // the window, not an interval later.
        if self.confirm.is_some() {
            delay = delay.min(CONFIRM_WINDOW_MS / 10.0);
        }
        // Leave a tenth of the margin for the retry itself.
        let latest = self.deadline() - self.margin_ms / 10.0;
        self.retry_at = if now < latest {
            (now + delay).min(latest)
        } else {
            // No room left for another try: the next step is the deadline.
            self.deadline()
        };
    }
}

/// The decision of one pass of the heartbeat loop over all leases of a client.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Pass {
    /// Indexes of the leases lost now (`expired_locally`). Applied BEFORE
    /// anything is sent.
    pub expire: Vec<usize>,
    /// Indexes of the leases to renew in ONE request (none past its deadline).
    pub heartbeat: Vec<usize>,
    /// When to give up waiting for that request (ms): the least time left to
    /// a deadline in it. It then counts as a failure (so a retry can go out
    /// before the deadline), but its answer is still read if it comes: a late
    /// success renews a lease still held and releases one already lost.
    pub timeout_ms: f64,
    /// How long the loop may wait before the next pass (ms): never past the
    /// earliest deadline of any lease still held, including leases with a
    /// heartbeat or settle in flight. `None` when no lease is held.
    pub wake_in_ms: Option<f64>,
}

/// Plans one pass of the heartbeat loop over `plans` at `now`.
///
/// The loop never awaits a heartbeat request: it sends the batch, then waits
/// at most `wake_in_ms` (or until an answer, a new lease or a settle wakes
/// it), so a slow request cannot delay another lease's deadline. Leases that
/// are due go into one request; so do idle leases whose heartbeat is due within
/// half an interval (renewing early is harmless).
pub fn plan_pass(plans: &[HeartbeatPlan], now: f64) -> Pass {
    let mut pass = Pass {
        timeout_ms: f64::INFINITY,
        ..Pass::default()
    };
    let mut steps = Vec::with_capacity(plans.len());
    for p in plans {
        steps.push(p.step(now));
    }
    // Whether a request goes out at all: only then do idle leases join it.
    let mut sending = false;
    for step in &steps {
        sending |= matches!(step, Step::Heartbeat { .. });
    }
    // One pass in index order: `heartbeat` comes out sorted without a sort.
    for (i, step) in steps.iter().enumerate() {
        match *step {
            Step::Expire => pass.expire.push(i),
            Step::Heartbeat { timeout_ms } => {
                pass.heartbeat.push(i);
                pass.timeout_ms = pass.timeout_ms.min(timeout_ms);
            }
            Step::Sleep(_) if sending => {
                let plan = &plans[i];
                let idle = plan.failures == 0 && !plan.in_flight && !plan.ending;
                if idle && plan.next_due() - now <= plan.interval_ms / 2.0 {
                    pass.heartbeat.push(i);
                    pass.timeout_ms = pass.timeout_ms.min(plan.deadline() - now);
                }
            }
            Step::Sleep(_) => {}
        }
    }
    if pass.timeout_ms.is_infinite() {
        pass.timeout_ms = 0.0;
    }
    let wake = plans
        .iter()
        .enumerate()
        .filter_map(|(i, p)| match steps[i] {
            Step::Expire => None,
            // Sent now: in flight until its answer wakes the loop.
            _ if pass.heartbeat.contains(&i) => Some(p.deadline() - now),
            Step::Sleep(ms) => Some(ms),
            Step::Heartbeat { .. } => Some(p.deadline() - now),
        })
        .fold(f64::INFINITY, f64::min);
    pass.wake_in_ms = wake.is_finite().then_some(wake.max(0.0));
    pass
}

/// Reconnect backoff of a work loop: `random(base, min(cap, base·2^n))` after
/// the n-th consecutive connection failure (n from 1), reset by any answer.
///
/// One schedule serves all of a loop's slots, and an outage advances it once
/// per round, not once per slot: the first failure of a round draws the
/// window and moves to the next round; a slot whose try began in an earlier
/// round (it was in flight when another slot's failure was recorded, or it
/// waited out that same window) waits until the end of the window already
/// drawn, without advancing n. Without this, `concurrency` slots failing
/// together pushed n up by `concurrency` per round: 8 slots reached the 5 min
/// cap after the first outage round instead of the fifth.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reconnect {
    /// Base delay (ms); default 10 s.
    pub base_ms: f64,
    /// Cap (ms); default 5 min.
    pub cap_ms: f64,
    /// Consecutive failures so far (rounds of the outage that drew a window).
    pub failures: u32,
    /// Bumped whenever a window is drawn or an answer resets the schedule.
    round: u32,
    /// End of the window drawn last (ms, the caller's clock).
    not_before_ms: f64,
}

impl Default for Reconnect {
    fn default() -> Reconnect {
        Reconnect::new(RECONNECT_BASE_MS, RECONNECT_CAP_MS)
    }
}

impl Reconnect {
    /// A schedule with the given base and cap (ms); a cap below the base is raised to it.
    pub fn new(base_ms: f64, cap_ms: f64) -> Reconnect {
        let base_ms = if base_ms.is_finite() && base_ms >= 0.0 {
            base_ms
        } else {
            RECONNECT_BASE_MS
        };
        let cap_ms = if cap_ms.is_finite() {
            cap_ms.max(base_ms)
        } else {
            RECONNECT_CAP_MS.max(base_ms)
        };
        Reconnect {
            base_ms,
            cap_ms,
            failures: 0,
            round: 0,
            not_before_ms: 0.0,
        }
    }

    /// The round a try starting now belongs to; pass it to [`Reconnect::on_failure`].
    /// A slot that waited out a window should keep the round it read when
    /// it began waiting (its retry belongs to that window's round).
    pub fn round(&self) -> u32 {
        self.round
    }

    /// A connection failed for a try that began in round `started_in`; `now_ms`
    /// is the caller's monotonic clock (it must never decrease: the SDK
    /// passes `now_ms()`, which does not). Returns the delay before the next
    /// try (ms):
    ///
    /// - the first failure of the current round (or the first since an
    ///   answer reset the schedule) draws `random(lo, lo + min(cap, base·2^n) − base)`
    ///   with `lo = max(base, Retry-After)` and advances n and the round: the
    ///   server's `Retry-After` (when it sent one) moves the window, it does
    ///   not remove the jitter (otherwise every worker would retry in lockstep);
    /// - a failure of a try from an earlier round, while the window drawn
    ///   last is still running, waits until its end (at least the
    ///   `Retry-After`) and advances nothing; after that window's end it
    ///   counts as the first failure of a new round (a try that hung past
    ///   the whole window gets a window of its own, not a 0 ms retry).
    pub fn on_failure(
        &mut self,
        started_in: u32,
        now_ms: f64,
        r: f64,
        retry_after_ms: Option<f64>,
    ) -> f64 {
        let retry_after = match retry_after_ms {
            Some(ra) if ra.is_finite() => ra.max(0.0),
            _ => 0.0,
        };
        // Another slot's window, still running: wait for its end. Once it
        // has ended, this failure is a round of its own (never a 0 ms retry).
        if started_in != self.round && self.failures > 0 && now_ms < self.not_before_ms {
            return (self.not_before_ms - now_ms).max(retry_after);
        }
        let d = reconnect_delay_ms(self.failures, self.base_ms, self.cap_ms, r)
            + (retry_after - self.base_ms).max(0.0);
        self.failures = self.failures.saturating_add(1);
        self.round = self.round.wrapping_add(1);
        self.not_before_ms = now_ms + d;
        d
    }

    /// The server answered: the next failure starts from the base again.
    pub fn on_success(&mut self) {
        if self.failures > 0 {
            self.failures = 0;
            self.round = self.round.wrapping_add(1);
        }
    }
}

/// Delay before the next claim poll after an empty answer: `base + jitter`
/// with `base = max(interval, Retry-After)` and jitter in
/// `[0, min(base/2, 30 s)]`. The jitter is added AFTER the maximum, so workers
/// told the same long `Retry-After` still spread out.
pub fn poll_delay_ms(interval_ms: f64, retry_after_ms: Option<f64>, r: f64) -> f64 {
    let interval_ms = if interval_ms.is_finite() {
        interval_ms.max(0.0)
    } else {
        0.0
    };
    let base = match retry_after_ms {
        Some(ra) if ra.is_finite() => interval_ms.max(ra),
        _ => interval_ms,
    };
    base + poll_jitter_ms(base, r)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: f64 = 90_000.0;
    const HB: f64 = 15_000.0;

    #[test]
    fn the_deadline_counts_from_the_last_successful_send_minus_the_margin() {
        let mut p = HeartbeatPlan::new(1_000.0, TTL, HB);
        assert_eq!(p.margin_ms, 5_000.0);
        assert_eq!(p.deadline(), 1_000.0 + 90_000.0 - 5_000.0);
        // A success sent at 16 s moves it; the answer's arrival time does not matter.
        assert!(p.on_success(16_000.0, 17_000.0));
        assert_eq!(p.deadline(), 16_000.0 + 85_000.0);
        // An older success (a slow earlier request answering late) never moves it back.
        assert!(p.on_success(2_000.0, 30_000.0));
        assert_eq!(p.deadline(), 101_000.0);
        assert_eq!(safety_margin_ms(3_000.0), 300.0);
    }

    #[test]
    fn a_timer_on_time_sleeps_until_the_interval_then_heartbeats() {
        let p = HeartbeatPlan::new(0.0, TTL, HB);
        assert_eq!(p.step(1_000.0), Step::Sleep(14_000.0));
        assert_eq!(
            p.step(15_000.0),
            Step::Heartbeat {
                timeout_ms: 85_000.0 - 15_000.0
            }
        );
    }

    #[test]
    fn a_late_timer_inside_the_deadline_heartbeats_at_once() {
        // Chrome's once-a-minute throttling: the timer for 15 s fires at 60 s.
        let p = HeartbeatPlan::new(0.0, TTL, HB);
        assert!(matches!(p.step(60_000.0), Step::Heartbeat { .. }));
    }

    #[test]
    fn a_late_timer_past_the_deadline_expires_without_sending() {
        // The page was frozen through the whole TTL: the server may already
        // have handed the item to another worker, so nothing is sent under it.
        let p = HeartbeatPlan::new(0.0, TTL, HB);
        assert_eq!(p.step(200_000.0), Step::Expire);
        assert_eq!(
            p.step(p.deadline()),
            Step::Expire,
            "the deadline itself is lost"
        );
        assert!(!p.is_live(p.deadline()) && p.is_live(p.deadline() - 0.001));
    }

    #[test]
    fn an_answer_after_the_deadline_does_not_revive_the_lease() {
        let mut p = HeartbeatPlan::new(0.0, TTL, HB);
        p.on_sent();
        // Sent at 80 s (before the 85 s deadline), answered at 86 s.
        assert!(!p.on_success(80_000.0, 86_000.0));
        assert_eq!(p.deadline(), 85_000.0);
        assert!(!p.is_live(86_000.0));
    }

    #[test]
    fn a_clock_jump_makes_a_heartbeat_due_at_once_and_a_success_sent_after_it_changes_nothing() {
        let mut p = HeartbeatPlan::new(0.0, TTL, HB);
        // Nothing new: no confirmation.
        assert!(!p.observe(10_000.0, 0));
        assert_eq!(p.step(10_000.0), Step::Sleep(5_000.0));
        // The wall clock jumped (set forward 10 minutes, or a suspend).
        assert!(p.observe(10_000.0, 1));
        assert_eq!(p.deadline(), 10_000.0 + CONFIRM_WINDOW_MS);
        assert_eq!(
            p.step(10_000.0),
            Step::Heartbeat {
                timeout_ms: CONFIRM_WINDOW_MS
            }
        );
        p.on_sent();
        assert!(p.on_success(10_000.0, 10_050.0));
        // Confirmed: the deadline is the plain one again, from that send.
        assert_eq!(p.confirm, None);
        assert_eq!(p.deadline(), 10_000.0 + TTL - p.margin_ms);
        assert_eq!(p.step(10_050.0), Step::Sleep(14_950.0));
        // The same count again is not a new jump.
        assert!(!p.observe(11_000.0, 1));
    }

    #[test]
    fn after_a_clock_jump_only_a_heartbeat_sent_after_it_confirms_the_lease() {
        let mut p = HeartbeatPlan::new(0.0, TTL, HB);
        p.on_sent();
        // A heartbeat sent at 1 s; the jump is seen at 2 s; its answer at 3 s.
        assert!(p.observe(2_000.0, 1));
        assert!(p.on_success(1_000.0, 3_000.0));
        assert_eq!(p.confirm, Some((2_000.0, 2_000.0 + CONFIRM_WINDOW_MS)));
        // Due at once again; a failure retries before the window ends.
        assert!(matches!(p.step(3_000.0), Step::Heartbeat { .. }));
        p.on_sent();
        p.on_failure(3_100.0, 0.99);
        assert!(p.retry_at < 2_000.0 + CONFIRM_WINDOW_MS);
        // A second jump does not extend the window.
        assert!(p.observe(4_000.0, 2));
        assert_eq!(p.deadline(), 2_000.0 + CONFIRM_WINDOW_MS);
        // No success in the window: lost locally at its end, and an answer
        // after it does not revive the lease.
        assert_eq!(p.step(2_000.0 + CONFIRM_WINDOW_MS), Step::Expire);
        assert!(!p.on_success(4_000.0, 2_000.0 + CONFIRM_WINDOW_MS));
    }

    #[test]
    fn a_heartbeat_sent_before_a_second_jump_does_not_confirm_it() {
        let mut p = HeartbeatPlan::new(0.0, TTL, HB);
        // Jump 1 seen at 20 s; its confirming heartbeat goes out then.
        assert!(p.observe(20_000.0, 1));
        assert!(matches!(p.step(20_000.0), Step::Heartbeat { .. }));
        p.on_sent();
        // Jump 2 (the machine slept again) before that answer is read.
        assert!(p.observe(20_100.0, 2));
        assert!(p.on_success(20_000.0, 20_200.0));
        // Still unconfirmed, within the first window, and due at once.
        assert_eq!(p.confirm, Some((20_100.0, 20_000.0 + CONFIRM_WINDOW_MS)));
        assert!(matches!(p.step(20_200.0), Step::Heartbeat { .. }));
        p.on_sent();
        assert!(p.on_success(20_200.0, 20_300.0));
        assert_eq!(p.confirm, None);
    }

    #[test]
    fn a_clock_jump_sends_a_heartbeat_at_once_while_a_retry_waits_or_one_is_out() {
        // Two failures before the jump: the retry waits up to an interval.
        let mut p = HeartbeatPlan::new(0.0, TTL, HB);
        p.on_sent();
        p.on_failure(15_000.0, 0.99);
        p.on_sent();
        p.on_failure(16_000.0, 0.99);
        assert!(p.retry_at > 19_000.0 + 1_000.0);
        assert!(p.observe(19_000.0, 1));
        assert!(matches!(p.step(19_000.0), Step::Heartbeat { .. }));
        // A heartbeat sent before the jump and still out.
        let mut q = HeartbeatPlan::new(0.0, TTL, HB);
        q.on_sent();
        assert!(matches!(q.step(16_000.0), Step::Sleep(_)));
        assert!(q.observe(16_000.0, 1));
        assert!(matches!(q.step(16_000.0), Step::Heartbeat { .. }));
        // Its late answer does not confirm; the one sent after the jump does.
        q.on_sent();
        assert!(q.on_late_success(15_000.0, 16_500.0));
        assert!(q.confirm.is_some());
        assert!(q.on_success(16_000.0, 16_600.0));
        assert_eq!(q.confirm, None);
    }

    #[test]
    fn a_failure_read_after_a_clock_jump_retries_within_a_tenth_of_the_window() {
        let mut p = HeartbeatPlan::new(0.0, TTL, HB);
        p.on_sent();
        // The jump is seen (by a reader) before the failure of the
        // heartbeat sent before it is read.
        assert!(p.observe(16_000.0, 1));
        p.on_failure(16_001.0, 0.99);
        assert!(p.retry_at <= 16_001.0 + CONFIRM_WINDOW_MS / 10.0);
        assert!(matches!(
            p.step(16_001.0 + CONFIRM_WINDOW_MS / 10.0),
            Step::Heartbeat { .. }
        ));
    }

    #[test]
    fn a_clock_jump_never_moves_a_deadline_later() {
        let mut p = HeartbeatPlan::new(0.0, TTL, HB);
        // 1 s before the plain deadline (85 s): the window cannot add 5 s.
        assert!(p.observe(84_000.0, 1));
        assert_eq!(p.deadline(), 85_000.0);
        assert_eq!(p.step(85_000.0), Step::Expire);
    }

    #[test]
    fn leases_with_a_heartbeat_or_settle_in_flight_are_not_resent_but_still_expire() {
        let mut p = HeartbeatPlan::new(0.0, TTL, HB);
        p.on_sent();
        assert_eq!(p.step(20_000.0), Step::Sleep(65_000.0));
        assert_eq!(p.step(85_000.0), Step::Expire);
        let mut q = HeartbeatPlan::new(0.0, TTL, HB);
        q.ending = true;
        assert_eq!(q.step(20_000.0), Step::Sleep(65_000.0));
        assert_eq!(q.step(90_000.0), Step::Expire);
    }

    #[test]
    fn failing_heartbeats_retry_before_the_deadline_then_expire_at_it() {
        let mut p = HeartbeatPlan::new(0.0, TTL, HB);
        let mut now = 15_000.0;
        let mut attempts = 0;
        loop {
            match p.step(now) {
                Step::Heartbeat { timeout_ms } => {
                    assert!(now + timeout_ms <= p.deadline() + 1e-9);
                    attempts += 1;
                    p.on_sent();
                    p.on_failure(now, 0.999);
                }
                Step::Sleep(ms) => {
                    assert!(ms > 0.0);
                    now += ms;
                }
                Step::Expire => break,
            }
            assert!(attempts < 100);
        }
        assert!(attempts >= 2, "retried inside the deadline ({attempts})");
        assert_eq!(now, p.deadline(), "expires exactly at the deadline");
    }

    #[test]
    fn retries_follow_a_jittered_schedule_within_bounds() {
        for r in [0.0, 0.5, 0.999] {
            let mut p = HeartbeatPlan::new(0.0, TTL, HB);
            p.on_failure(15_000.0, r);
            let d = p.retry_at - 15_000.0;
            assert!((HB / 8.0..=HB / 4.0).contains(&d), "first retry {d}");
            p.on_failure(20_000.0, r);
            assert!(p.retry_at - 20_000.0 <= HB / 2.0);
        }
    }

    #[test]
    fn a_success_after_failures_resets_the_schedule() {
        let mut p = HeartbeatPlan::new(0.0, TTL, HB);
        p.on_failure(15_000.0, 0.5);
        assert!(p.on_success(18_000.0, 18_500.0));
        assert_eq!(p.failures, 0);
        assert_eq!(p.next_due(), 33_000.0);
    }

    #[test]
    fn the_interval_leaves_room_for_a_retry_before_the_deadline() {
        // A server suggesting a heartbeat interval close to its TTL.
        let p = HeartbeatPlan::new(0.0, 3_000.0, 2_900.0);
        assert_eq!(p.interval_ms, (3_000.0 - 300.0) / 2.0);
        assert_eq!(effective_interval_ms(3_000.0, f64::NAN, 300.0), 1_350.0);
    }

    #[test]
    fn one_request_renews_every_lease_due_or_nearly_due() {
        let a = HeartbeatPlan::new(0.0, TTL, HB);
        let b = HeartbeatPlan::new(4_000.0, TTL, HB);
        let c = HeartbeatPlan::new(12_000.0, TTL, HB);
        let pass = plan_pass(&[a.clone(), b.clone(), c], 15_000.0);
        assert_eq!(pass.heartbeat, vec![0, 1], "b is within half an interval");
        assert!(pass.expire.is_empty());
        // c is due at 27 s; a and b are in flight until their deadlines (85 s, 89 s).
        assert_eq!(pass.wake_in_ms, Some(12_000.0));
        let idle = plan_pass(&[a], 1_000.0);
        assert!(idle.heartbeat.is_empty());
        assert_eq!(idle.wake_in_ms, Some(14_000.0));
        assert_eq!(plan_pass(&[], 0.0).wake_in_ms, None);
    }

    #[test]
    fn heartbeat_indexes_come_in_lease_order_with_the_nearly_due_first() {
        // The nearly due lease (b) before the due one (a) in the list.
        let a = HeartbeatPlan::new(0.0, TTL, HB);
        let b = HeartbeatPlan::new(4_000.0, TTL, HB);
        let pass = plan_pass(&[b.clone(), a.clone()], 15_000.0);
        assert_eq!(pass.heartbeat, vec![0, 1]);
        let due = plan_pass(std::slice::from_ref(&a), 15_000.0).timeout_ms;
        assert_eq!(pass.timeout_ms, due.min(b.deadline() - 15_000.0));
        // No request goes out: the nearly due lease is not sent alone.
        assert!(plan_pass(&[b], 15_000.0).heartbeat.is_empty());
    }

    #[test]
    fn a_slow_request_of_one_lease_never_hides_another_leases_deadline() {
        // Case 1 of issue 11: a is in flight (the server answers slowly), b's
        // heartbeats keep failing. The loop wakes at b's deadline, not a's timeout.
        let mut a = HeartbeatPlan::new(0.0, TTL, HB);
        a.on_sent();
        let mut b = HeartbeatPlan::new(-40_000.0, TTL, HB);
        b.on_failure(30_000.0, 0.0);
        b.on_sent();
        let pass = plan_pass(&[a.clone(), b.clone()], 30_000.0);
        assert!(pass.heartbeat.is_empty());
        assert_eq!(pass.wake_in_ms, Some(b.deadline() - 30_000.0));
        let later = plan_pass(&[a, b.clone()], b.deadline());
        assert_eq!(later.expire, vec![1]);
    }

    /// One slot's failures in a row: each is its own round.
    fn fail(b: &mut Reconnect, r: f64, retry_after: Option<f64>) -> f64 {
        b.on_failure(b.round(), 0.0, r, retry_after)
    }

    #[test]
    fn reconnect_backoff_grows_within_base_and_cap_and_resets() {
        let mut b = Reconnect::default();
        assert_eq!(
            fail(&mut b, 0.9, None),
            19_000.0,
            "first failure: [base, 2·base], jittered"
        );
        assert_eq!(fail(&mut b, 1.0, None), 40_000.0);
        for _ in 0..30 {
            let d = fail(&mut b, 0.7, None);
            assert!((10_000.0..=300_000.0).contains(&d));
        }
        assert_eq!(fail(&mut b, 1.0, None), 300_000.0);
        assert_eq!(fail(&mut b, 0.0, None), 10_000.0, "never below base");
        b.on_success();
        assert_eq!(
            fail(&mut b, 1.0, None),
            20_000.0,
            "reset to the first window"
        );
        let t = Reconnect::new(100.0, 50.0);
        assert_eq!(t.cap_ms, 100.0);
    }

    #[test]
    fn retry_after_moves_the_reconnect_window_and_keeps_its_jitter() {
        let mut lo = Reconnect::default();
        let mut hi = Reconnect::default();
        fail(&mut lo, 0.0, None);
        fail(&mut hi, 0.0, None);
        // Third failure: window [10 s, 80 s]; Retry-After 60 s moves it to [60 s, 130 s].
        fail(&mut lo, 0.0, None);
        fail(&mut hi, 0.0, None);
        assert_eq!(fail(&mut lo, 0.0, Some(60_000.0)), 60_000.0);
        assert_eq!(fail(&mut hi, 1.0, Some(60_000.0)), 130_000.0);
    }

    /// Slots failing in the same outage share one window per round: n grows
    /// by one per round whatever the number of slots (before, by one per
    /// slot: 8 slots were at the cap after one round).
    #[test]
    fn slots_failing_together_advance_the_reconnect_schedule_once_per_round() {
        let mut b = Reconnect::new(100.0, 100_000.0);
        let mut now = 0.0;
        for n in 0..5 {
            // Eight slots begin their tries in the same round...
            let round = b.round();
            let first = b.on_failure(round, now, 1.0, None);
            assert_eq!(
                first,
                100.0 * 2f64.powi(n + 1),
                "round {n}: the first failure draws 2^(n+1)"
            );
            for slot in 1..8 {
                // ...and fail a little later, one after another: they wait
                // for the end of the same window, never longer.
                let d = b.on_failure(round, now + slot as f64, 1.0, None);
                assert_eq!(d, first - slot as f64, "round {n}, slot {slot}");
            }
            assert_eq!(b.failures, n as u32 + 1, "one step per round");
            now += first;
        }
        // An answer resets it; a try of the round before the answer that
        // fails after it draws the base window again.
        let stale = b.round();
        b.on_success();
        assert_eq!(b.on_failure(stale, now, 1.0, None), 200.0);
        assert_eq!(b.on_failure(stale, now + 10.0, 1.0, None), 190.0);
        // A Retry-After longer than the window's rest is still honoured.
        assert_eq!(b.on_failure(stale, now + 10.0, 1.0, Some(500.0)), 500.0);
        // A try of an old round that fails after the window has ended (it
        // hung past it) draws a new window: never a 0 ms retry.
        let (failures, old_round) = (b.failures, b.round() - 1);
        let d = b.on_failure(old_round, now + 1_000.0, 0.0, None);
        assert_eq!((d, b.failures), (100.0, failures + 1));
    }

    #[test]
    fn poll_jitter_is_added_after_the_maximum_with_retry_after() {
        assert_eq!(poll_delay_ms(1_000.0, None, 1.0), 1_500.0);
        assert_eq!(poll_delay_ms(1_000.0, None, 0.0), 1_000.0);
        assert_eq!(poll_delay_ms(600_000.0, None, 1.0), 630_000.0);
        // Retry-After 5 s over an interval of 1 s: 5 s plus up to 2.5 s.
        assert_eq!(poll_delay_ms(1_000.0, Some(5_000.0), 0.0), 5_000.0);
        assert_eq!(poll_delay_ms(1_000.0, Some(5_000.0), 1.0), 7_500.0);
        assert_ne!(
            poll_delay_ms(1_000.0, Some(5_000.0), 0.2),
            poll_delay_ms(1_000.0, Some(5_000.0), 0.7),
            "two workers told the same Retry-After do not poll in lockstep"
        );
        assert_eq!(poll_delay_ms(f64::NAN, None, 0.5), 0.0);
    }

    /// The heartbeat loop of one client, driven by a simulated clock, against
    /// arbitrary timer delays, request latencies, failures and settles.
    mod simulated {
        use super::super::*;
        use proptest::prelude::*;

        #[derive(Debug, Clone, Copy)]
        enum Outcome {
            Ok,
            NoAnswer,
            ClaimLost,
        }

        #[derive(Debug, Clone, Copy, PartialEq)]
        enum State {
            Held,
            Ending { done_at: f64 },
            Gone,
        }

        struct Request {
            sent_at: f64,
            arrives_at: f64,
            leases: Vec<usize>,
            answer: Outcome,
            /// Given up on at its timeout already (a failure was counted).
            late: bool,
        }

        #[derive(Debug, Clone)]
        struct Script {
            ttl_ms: f64,
            heartbeat_ms: f64,
            claims: Vec<f64>,
            settles: Vec<Option<(f64, f64)>>,
            timer_late: Vec<f64>,
            latencies: Vec<f64>,
            answers: Vec<Outcome>,
            probes: Vec<f64>,
        }

        fn answer() -> impl Strategy<Value = Outcome> {
            prop_oneof![
                6 => Just(Outcome::Ok),
                3 => Just(Outcome::NoAnswer),
                1 => Just(Outcome::ClaimLost),
            ]
        }

        fn script() -> impl Strategy<Value = Script> {
            (1_000.0..120_000.0f64, 0.05..1.2f64, 1usize..6).prop_flat_map(|(ttl, hb, n)| {
                (
                    Just(ttl),
                    Just(ttl * hb),
                    prop::collection::vec(0.0..ttl, n),
                    prop::collection::vec(
                        prop::option::weighted(0.4, (0.0..4.0 * ttl, 0.0..ttl)),
                        n,
                    ),
                    // Timers on time, a little late, or frozen well past the TTL.
                    prop::collection::vec(
                        prop_oneof![
                            4 => Just(0.0),
                            3 => 0.0..ttl / 2.0,
                            1 => 0.0..3.0 * ttl,
                        ],
                        1..40,
                    ),
                    prop::collection::vec(
                        prop_oneof![3 => 0.0..ttl / 10.0, 1 => 0.0..2.0 * ttl],
                        1..40,
                    ),
                    prop::collection::vec(answer(), 1..40),
                    prop::collection::vec(0.0..6.0 * ttl, 0..20),
                )
                    .prop_map(
                        |(
                            ttl_ms,
                            heartbeat_ms,
                            claims,
                            settles,
                            timer_late,
                            latencies,
                            answers,
                            probes,
                        )| {
                            Script {
                                ttl_ms,
                                heartbeat_ms,
                                claims,
                                settles,
                                timer_late,
                                latencies,
                                answers,
                                probes,
                            }
                        },
                    )
            })
        }

        /// Runs the loop; panics on a broken invariant.
        fn run(s: &Script) {
            let n = s.claims.len();
            let mut plans: Vec<HeartbeatPlan> = s
                .claims
                .iter()
                .map(|&t| HeartbeatPlan::new(t, s.ttl_ms, s.heartbeat_ms))
                .collect();
            // Ground truth: the send time of the last heartbeat the server
            // accepted (it applied it no earlier), so it cannot hand the item
            // over before `truth + ttl`.
            let mut truth: Vec<f64> = s.claims.clone();
            let mut state = vec![State::Held; n];
            let mut started = vec![false; n];
            let mut requests: Vec<Request> = Vec::new();
            let mut timer_at: Option<f64> = Some(0.0);
            let mut probes = s.probes.clone();
            let (mut t_i, mut l_i, mut a_i) = (0usize, 0usize, 0usize);
            let mut now: f64 = 0.0;
            // What a reader (signal, throwIfLost, lease.fetch) sees at `t`.
            let held = |plans: &[HeartbeatPlan], state: &[State], i: usize, t: f64| {
                state[i] != State::Gone && t >= s.claims[i] && plans[i].is_live(t)
            };
            let check = |plans: &[HeartbeatPlan], state: &[State], truth: &[f64], t: f64| {
                for i in 0..n {
                    if held(plans, state, i, t) {
                        assert!(
                            t < truth[i] + s.ttl_ms - plans[i].margin_ms,
                            "lease {i} reported held at {t} past its local deadline"
                        );
                    }
                }
            };
            let mut was_lost = vec![false; n];
            for _ in 0..400 {
                // The next event.
                let mut next = f64::INFINITY;
                if let Some(t) = timer_at {
                    next = next.min(t);
                }
                for r in &requests {
                    next = next.min(r.arrives_at);
                }
                for (i, st) in state.iter().enumerate() {
                    if let State::Ending { done_at } = st {
                        next = next.min(*done_at);
                    }
                    if let (Some((at, _)), false, State::Held) = (s.settles[i], started[i], st) {
                        next = next.min(s.claims[i] + at);
                    }
                }
                if !next.is_finite() {
                    break;
                }
                // Probe the readers at arbitrary instants before the event.
                probes.retain(|&p| {
                    if p < next {
                        check(&plans, &state, &truth, p.max(now));
                        false
                    } else {
                        true
                    }
                });
                now = next.max(now);
                check(&plans, &state, &truth, now);
                let mut run_pass = false;
                if timer_at.is_some_and(|t| t <= now) {
                    timer_at = None;
                    run_pass = true;
                }
                // Answers that arrived.
                let (arrived, rest): (Vec<Request>, Vec<Request>) =
                    requests.drain(..).partition(|r| r.arrives_at <= now);
                requests = rest;
                for r in arrived {
                    for &i in &r.leases {
                        if state[i] == State::Gone {
                            continue; // a late answer never revives a lost lease
                        }
                        match (r.answer, r.late) {
                            (Outcome::Ok, late) => {
                                let held = if late {
                                    plans[i].on_late_success(r.sent_at, now)
                                } else {
                                    plans[i].on_success(r.sent_at, now)
                                };
                                if held {
                                    truth[i] = truth[i].max(r.sent_at);
                                } else {
                                    state[i] = State::Gone;
                                }
                            }
                            (Outcome::NoAnswer, false) => plans[i].on_failure(now, 0.5),
                            (Outcome::NoAnswer, true) => {}
                            (Outcome::ClaimLost, _) => state[i] = State::Gone,
                        }
                    }
                    run_pass = true; // an answer wakes the loop
                }
                // Settles: a fenced call starts only while the lease is held.
                for i in 0..n {
                    match (state[i], s.settles[i]) {
                        (State::Ending { done_at }, _) if done_at <= now => {
                            state[i] = State::Gone;
                        }
                        (State::Held, Some((at, lat)))
                            if !started[i] && s.claims[i] + at <= now =>
                        {
                            started[i] = true;
                            if held(&plans, &state, i, now) {
                                plans[i].ending = true;
                                state[i] = State::Ending { done_at: now + lat };
                            }
                        }
                        _ => {}
                    }
                }
                if !run_pass {
                    continue;
                }
                // One pass of the loop over the leases it holds.
                let live: Vec<usize> = (0..n)
                    .filter(|&i| state[i] != State::Gone && s.claims[i] <= now)
                    .collect();
                let view: Vec<HeartbeatPlan> = live.iter().map(|&i| plans[i].clone()).collect();
                let pass = plan_pass(&view, now);
                // A late timer checks every deadline before it sends anything.
                for (k, &i) in live.iter().enumerate() {
                    if !plans[i].is_live(now) {
                        assert!(
                            pass.expire.contains(&k),
                            "lease {i} past its deadline not expired"
                        );
                    }
                }
                for &k in &pass.expire {
                    state[live[k]] = State::Gone;
                }
                let mut batch = Vec::new();
                for &k in &pass.heartbeat {
                    let i = live[k];
                    assert!(plans[i].is_live(now), "heartbeat sent past the deadline");
                    assert!(!plans[i].ending && !plans[i].in_flight);
                    plans[i].on_sent();
                    batch.push(i);
                }
                if !batch.is_empty() {
                    let lat = s.latencies[l_i % s.latencies.len()];
                    l_i += 1;
                    let answer = s.answers[a_i % s.answers.len()];
                    a_i += 1;
                    // Past its timeout the request counts as failed; its answer
                    // may still come later.
                    if lat > pass.timeout_ms {
                        requests.push(Request {
                            sent_at: now,
                            arrives_at: now + pass.timeout_ms,
                            leases: batch.clone(),
                            answer: Outcome::NoAnswer,
                            late: false,
                        });
                    }
                    requests.push(Request {
                        sent_at: now,
                        arrives_at: now + lat,
                        leases: batch,
                        answer,
                        late: lat > pass.timeout_ms,
                    });
                }
                // The loop never waits past the earliest deadline it holds.
                let earliest = live
                    .iter()
                    .filter(|&&i| state[i] != State::Gone)
                    .map(|&i| plans[i].deadline())
                    .fold(f64::INFINITY, f64::min);
                let pending_claim = s
                    .claims
                    .iter()
                    .copied()
                    .filter(|&c| c > now)
                    .fold(f64::INFINITY, f64::min);
                match pass.wake_in_ms {
                    Some(w) => {
                        assert!(now + w <= earliest + 1e-6, "waits past a deadline");
                    }
                    None => assert!(earliest.is_infinite()),
                }
                let wake = pass
                    .wake_in_ms
                    .map_or(pending_claim, |w| (now + w).min(pending_claim));
                if wake.is_finite() {
                    let late = s.timer_late[t_i % s.timer_late.len()];
                    t_i += 1;
                    timer_at = Some(wake + late);
                }
                for i in 0..n {
                    let lost_now = state[i] == State::Gone;
                    assert!(!was_lost[i] || lost_now, "lease {i} revived");
                    was_lost[i] = lost_now;
                }
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(2_000))]
            #[test]
            fn no_lease_is_held_past_its_deadline_whatever_the_timers_and_network_do(s in script()) {
                run(&s);
            }
        }
    }
}
