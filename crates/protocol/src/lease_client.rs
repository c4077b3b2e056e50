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

/// What the heartbeat scheduler should do for one lease at a given moment.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Step {
    /// Heartbeat now. `timeout_ms` bounds the request: the time left to the local
    /// deadline, or, for a late timer already past it, one interval.
    Heartbeat {
        /// Give up on the request after this long (ms).
        timeout_ms: f64,
    },
    /// Abort the lease locally (`expired_locally`): heartbeats kept failing until
    /// the local deadline passed.
    Expire,
    /// Nothing to do for this long (ms).
    Sleep(f64),
}

/// The heartbeat state of one lease.
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
        }
    }

    /// `last_ok_sent_at + ttl − margin`: past this, the server may be about to
    /// take the claim over, so the client must stop the work.
    pub fn deadline(&self) -> f64 {
        self.last_ok_sent_at + self.ttl_ms - self.margin_ms
    }

    /// When the next heartbeat is due.
    pub fn next_due(&self) -> f64 {
        if self.failures == 0 {
            self.last_ok_sent_at + self.interval_ms
        } else {
            self.retry_at
        }
    }

    /// The step at `now`.
    ///
    /// Past the deadline, a lease whose heartbeats were failing expires; a lease
    /// with no failure recorded was simply not looked at in time (a throttled or
    /// frozen page fired the timer late), so it heartbeats at once and the
    /// server's answer decides (`claim_lost` aborts; success renews). Otherwise
    /// a due heartbeat runs at once however late its timer fired.
    pub fn step(&self, now: f64) -> Step {
        let deadline = self.deadline();
        if now >= deadline {
            return if self.failures > 0 {
                Step::Expire
            } else {
                Step::Heartbeat {
                    timeout_ms: self.interval_ms,
                }
            };
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

    /// A heartbeat sent at `sent_at` succeeded. A success older than the last
    /// one recorded never moves the deadline back.
    pub fn on_success(&mut self, sent_at: f64) {
        self.last_ok_sent_at = self.last_ok_sent_at.max(sent_at);
        self.failures = 0;
    }

    /// A heartbeat failed without a server answer at `now`: retry after a
    /// full-jitter delay (base a quarter interval, cap one interval), but
    /// always before the deadline when there is still room.
    pub fn on_failure(&mut self, now: f64, r: f64) {
        self.failures = self.failures.saturating_add(1);
        let base = (self.interval_ms / 4.0).max(1.0);
        let delay = full_jitter_ms(self.failures - 1, base, self.interval_ms, r).max(base / 2.0);
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

/// The decision for all leases of one client at `now`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Batch {
    /// Indexes of the leases to renew in ONE request.
    pub heartbeat: Vec<usize>,
    /// Indexes of the leases to abort with `expired_locally`.
    pub expire: Vec<usize>,
    /// Bound for the batch request (ms): the smallest timeout of the leases in it.
    pub timeout_ms: f64,
    /// How long to sleep when nothing is due (ms); `None` without leases.
    pub sleep_ms: Option<f64>,
}

/// Plans one scheduler pass over `plans` at `now`.
///
/// Leases that are due go into one request; so do leases without failures
/// whose heartbeat is due within half an interval, so one request serves
/// leases claimed at slightly different times (renewing early is harmless).
pub fn plan_batch(plans: &[HeartbeatPlan], now: f64) -> Batch {
    let mut batch = Batch {
        timeout_ms: f64::INFINITY,
        ..Batch::default()
    };
    let steps: Vec<Step> = plans.iter().map(|p| p.step(now)).collect();
    for (i, step) in steps.iter().enumerate() {
        match *step {
            Step::Expire => batch.expire.push(i),
            Step::Heartbeat { timeout_ms } => {
                batch.heartbeat.push(i);
                batch.timeout_ms = batch.timeout_ms.min(timeout_ms);
            }
            Step::Sleep(_) => {}
        }
    }
    if !batch.heartbeat.is_empty() {
        for (i, plan) in plans.iter().enumerate() {
            let early = plan.failures == 0 && plan.next_due() - now <= plan.interval_ms / 2.0;
            if early && !batch.heartbeat.contains(&i) && !batch.expire.contains(&i) {
                batch.heartbeat.push(i);
                batch.timeout_ms = batch.timeout_ms.min(plan.deadline() - now);
            }
        }
        batch.heartbeat.sort_unstable();
    }
    if batch.timeout_ms.is_infinite() {
        batch.timeout_ms = 0.0;
    }
    let sleep = steps
        .iter()
        .enumerate()
        .filter(|(i, _)| !batch.heartbeat.contains(i))
        .filter_map(|(_, s)| match s {
            Step::Sleep(ms) => Some(*ms),
            _ => None,
        })
        .fold(f64::INFINITY, f64::min);
    batch.sleep_ms = sleep.is_finite().then_some(sleep.max(0.0));
    batch
}

/// Reconnect backoff of a work loop: `random(base, min(cap, base·2^n))` after
/// the n-th consecutive connection failure (n from 0), reset by any answer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reconnect {
    /// Base delay (ms); default 10 s.
    pub base_ms: f64,
    /// Cap (ms); default 5 min.
    pub cap_ms: f64,
    /// Consecutive failures so far.
    pub failures: u32,
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
        }
    }

    /// A connection failed: the delay before the next try (ms).
    pub fn on_failure(&mut self, r: f64) -> f64 {
        let d = reconnect_delay_ms(self.failures, self.base_ms, self.cap_ms, r);
        self.failures = self.failures.saturating_add(1);
        d
    }

    /// The server answered: the next failure starts from the base again.
    pub fn on_success(&mut self) {
        self.failures = 0;
    }
}

/// Delay before the next claim poll after an empty answer: the interval plus
/// jitter in `[0, min(interval/2, 30 s)]`, and at least the server's
/// `Retry-After` when it sent one.
pub fn poll_delay_ms(interval_ms: f64, retry_after_ms: Option<f64>, r: f64) -> f64 {
    let interval_ms = if interval_ms.is_finite() {
        interval_ms.max(0.0)
    } else {
        0.0
    };
    let d = interval_ms + poll_jitter_ms(interval_ms, r);
    match retry_after_ms {
        Some(ra) if ra.is_finite() => d.max(ra),
        _ => d,
    }
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
        p.on_success(16_000.0);
        assert_eq!(p.deadline(), 16_000.0 + 85_000.0);
        // An older success (a slow earlier request answering late) never moves it back.
        p.on_success(2_000.0);
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
    fn a_late_timer_inside_the_ttl_heartbeats_at_once() {
        // Chrome's once-a-minute throttling: the timer for 15 s fires at 60 s.
        let p = HeartbeatPlan::new(0.0, TTL, HB);
        assert!(matches!(p.step(60_000.0), Step::Heartbeat { .. }));
    }

    #[test]
    fn a_late_timer_past_the_deadline_heartbeats_at_once_instead_of_expiring() {
        // The page slept through the whole TTL: ask the server (it decides:
        // success renews, claim_lost aborts) rather than guessing.
        let p = HeartbeatPlan::new(0.0, TTL, HB);
        assert_eq!(p.step(200_000.0), Step::Heartbeat { timeout_ms: HB });
    }

    #[test]
    fn failing_heartbeats_retry_before_the_deadline_then_expire_at_it() {
        let mut p = HeartbeatPlan::new(0.0, TTL, HB);
        let mut now = 15_000.0;
        let mut attempts = 0;
        loop {
            match p.step(now) {
                Step::Heartbeat { timeout_ms } => {
                    assert!(
                        now + timeout_ms <= p.deadline() + 1e-9,
                        "request bounded by deadline"
                    );
                    attempts += 1;
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
        assert_eq!(
            now,
            p.deadline(),
            "expires exactly at the deadline, not later"
        );
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
        p.on_success(18_000.0);
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
    fn delayed_timers_scaled_to_the_test_ttl_keep_or_lose_the_lease() {
        // TTL 3 s, heartbeat 0.5 s: every timer fires `delay` late.
        let simulate = |delay: f64| -> bool {
            let mut p = HeartbeatPlan::new(0.0, 3_000.0, 500.0);
            let mut now = 0.0;
            for _ in 0..20 {
                match p.step(now) {
                    Step::Sleep(ms) => now += ms + delay,
                    Step::Heartbeat { .. } if now >= p.last_ok_sent_at + 3_000.0 => return false,
                    Step::Heartbeat { .. } => p.on_success(now),
                    Step::Expire => return false,
                }
            }
            true
        };
        assert!(
            simulate(1_500.0),
            "a delay shorter than the TTL keeps it alive"
        );
        assert!(
            !simulate(3_500.0),
            "a delay past the TTL heartbeats too late"
        );
    }

    #[test]
    fn one_request_renews_every_lease_due_or_nearly_due() {
        let a = HeartbeatPlan::new(0.0, TTL, HB);
        let b = HeartbeatPlan::new(4_000.0, TTL, HB);
        let c = HeartbeatPlan::new(12_000.0, TTL, HB);
        let batch = plan_batch(&[a.clone(), b, c], 15_000.0);
        assert_eq!(batch.heartbeat, vec![0, 1], "b is within half an interval");
        assert!(batch.expire.is_empty());
        assert_eq!(batch.sleep_ms, Some(12_000.0));
        let idle = plan_batch(&[a], 1_000.0);
        assert!(idle.heartbeat.is_empty());
        assert_eq!(idle.sleep_ms, Some(14_000.0));
        assert_eq!(plan_batch(&[], 0.0).sleep_ms, None);
    }

    #[test]
    fn a_batch_expires_failing_leases_and_renews_the_others() {
        let mut failing = HeartbeatPlan::new(0.0, TTL, HB);
        failing.on_failure(80_000.0, 0.0);
        let fresh = HeartbeatPlan::new(70_000.0, TTL, HB);
        let batch = plan_batch(&[failing, fresh], 85_000.0);
        assert_eq!(batch.expire, vec![0]);
        assert_eq!(batch.heartbeat, vec![1]);
    }

    #[test]
    fn reconnect_backoff_grows_within_base_and_cap_and_resets() {
        let mut b = Reconnect::default();
        assert_eq!(b.on_failure(0.99), 10_000.0, "first failure waits the base");
        let d = b.on_failure(1.0);
        assert_eq!(d, 20_000.0);
        for _ in 0..30 {
            let d = b.on_failure(0.7);
            assert!((10_000.0..=300_000.0).contains(&d));
        }
        assert_eq!(b.on_failure(1.0), 300_000.0);
        assert_eq!(
            b.on_failure(0.0),
            10_000.0,
            "random(base, …) never below base"
        );
        b.on_success();
        assert_eq!(b.on_failure(1.0), 10_000.0);
        let t = Reconnect::new(100.0, 50.0);
        assert_eq!(t.cap_ms, 100.0);
    }

    #[test]
    fn poll_delay_adds_bounded_jitter_and_honours_retry_after() {
        assert_eq!(poll_delay_ms(1_000.0, None, 1.0), 1_500.0);
        assert_eq!(poll_delay_ms(1_000.0, None, 0.0), 1_000.0);
        assert_eq!(poll_delay_ms(600_000.0, None, 1.0), 630_000.0);
        assert_eq!(poll_delay_ms(1_000.0, Some(5_000.0), 0.5), 5_000.0);
        assert_eq!(poll_delay_ms(f64::NAN, None, 0.5), 0.0);
    }
}
