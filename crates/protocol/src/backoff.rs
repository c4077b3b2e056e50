//! Backoff and jitter math. Randomness comes in as `r ∈ [0, 1)` so the bounds
//! are tested natively; the SDK passes `Math.random()`.

/// Full-jitter backoff ("Exponential Backoff and Jitter", AWS Architecture
/// Blog, 2015): `r · min(cap, base · 2^attempt)` milliseconds. Used between
/// `mutate` attempts.
pub fn full_jitter_ms(attempt: u32, base_ms: f64, cap_ms: f64, r: f64) -> f64 {
    r.clamp(0.0, 1.0) * ceiling_ms(attempt, base_ms, cap_ms)
}

/// Redelivery backoff of a work item enqueued with a `retry_backoff_ms`
/// (`lease::RetryBackoff`): after its `attempts`-th ended delivery (an
/// expiry or a release, counted from 1) it is claimable again only after
/// this many ms, full jitter over an exponential ceiling: uniform in
/// `[0, min(max, base · 2^(attempts − 1))]` (the rule of [`full_jitter_ms`],
/// AWS Architecture Blog "Exponential Backoff and Jitter"; River's default
/// retry policy delays a failed job too, by `attempt⁴` s ± 10 %). Whole ms,
/// rounded down.
pub fn redelivery_delay_ms(attempts: u32, base_ms: u64, max_ms: u64, r: f64) -> u64 {
    // Both are at most a day (`RETRY_BACKOFF_LIMIT_MS`): exact as f64.
    full_jitter_ms(attempts.saturating_sub(1), base_ms as f64, max_ms as f64, r).floor() as u64
}

/// Reconnect backoff for the lease client after the n-th consecutive
/// connection failure (n from 1; `failures` = n − 1 came before it):
/// `random(base, min(cap, base · 2^n))` ms. Defaults: base 10 s, cap 5 min
/// (DESIGN.md "Lease client"). The first window is `[base, 2·base]`, never
/// zero-wide: workers whose claims failed together (a server restart) do
/// not all retry at exactly `base`.
pub fn reconnect_delay_ms(failures: u32, base_ms: f64, cap_ms: f64, r: f64) -> f64 {
    let hi = ceiling_ms(failures.saturating_add(1), base_ms, cap_ms).max(base_ms);
    base_ms + r.clamp(0.0, 1.0) * (hi - base_ms)
}

/// Claim-poll jitter: `r · min(interval / 2, 30 s)` ms, added to the poll interval.
pub fn poll_jitter_ms(interval_ms: f64, r: f64) -> f64 {
    r.clamp(0.0, 1.0) * (interval_ms / 2.0).min(30_000.0)
}

/// Default base of [`reconnect_delay_ms`]: 10 s.
pub const RECONNECT_BASE_MS: f64 = 10_000.0;
/// Default cap of [`reconnect_delay_ms`]: 5 min.
pub const RECONNECT_CAP_MS: f64 = 300_000.0;
/// Default base of `mutate`'s full-jitter backoff: 5 ms.
pub const MUTATE_BASE_MS: f64 = 5.0;
/// Default cap of `mutate`'s full-jitter backoff: 1 s.
pub const MUTATE_CAP_MS: f64 = 1_000.0;

/// The longest `Retry-After` a client honours: 1 hour, the longest the
/// reference server's `--idle-retry-ms` can ask of an empty claim (a lower
/// cap would poll a server told to let idle workers sleep an hour).
pub const RETRY_AFTER_CAP_MS: f64 = 3_600_000.0;

/// A `Retry-After` header's delay-seconds (RFC 9110 §10.2.3), as the
/// number the header parsed to (`Number(value)` in the SDK), in ms:
/// `None` for anything that is not a non-negative number (an HTTP-date,
/// garbage, NaN), and at most [`RETRY_AFTER_CAP_MS`]. The cap is what keeps
/// a gateway's `Retry-After: 1e306` (finite, but infinite once in ms) or
/// `999999999` from becoming a wait of `Infinity` (which a timer takes as
/// 0 ms: a retry storm) or of weeks (a worker parked for good).
pub fn retry_after_ms(seconds: f64) -> Option<f64> {
    if seconds.is_nan() || seconds < 0.0 {
        return None;
    }
    Some((seconds * 1000.0).min(RETRY_AFTER_CAP_MS))
}

fn ceiling_ms(attempt: u32, base_ms: f64, cap_ms: f64) -> f64 {
    // 2^attempt overflows f64 only far past any cap; clamp the exponent anyway.
    (base_ms * 2f64.powi(attempt.min(1000) as i32)).min(cap_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retry_after_is_read_in_ms_and_capped_never_infinite() {
        assert_eq!(retry_after_ms(0.0), Some(0.0));
        assert_eq!(retry_after_ms(1.5), Some(1500.0));
        assert_eq!(retry_after_ms(300.0), Some(300_000.0));
        assert_eq!(retry_after_ms(3600.0), Some(RETRY_AFTER_CAP_MS));
        assert_eq!(retry_after_ms(3601.0), Some(RETRY_AFTER_CAP_MS));
        // Finite as seconds, infinite once multiplied: the cap, not Infinity.
        assert_eq!(retry_after_ms(1e306), Some(RETRY_AFTER_CAP_MS));
        assert_eq!(retry_after_ms(f64::INFINITY), Some(RETRY_AFTER_CAP_MS));
        assert_eq!(retry_after_ms(999_999_999.0), Some(RETRY_AFTER_CAP_MS));
        for bad in [-1.0, -0.001, f64::NAN, f64::NEG_INFINITY] {
            assert_eq!(retry_after_ms(bad), None, "{bad}");
        }
    }

    #[test]
    fn full_jitter_stays_within_zero_and_the_capped_ceiling() {
        for attempt in 0..40 {
            for r in [0.0, 0.25, 0.5, 0.999_999] {
                let d = full_jitter_ms(attempt, 5.0, 1000.0, r);
                assert!(d >= 0.0 && d <= (5.0 * 2f64.powi(attempt as i32)).min(1000.0));
            }
        }
        assert_eq!(full_jitter_ms(3, 5.0, 1000.0, 0.5), 20.0);
        assert_eq!(full_jitter_ms(30, 5.0, 1000.0, 1.0), 1000.0);
    }

    #[test]
    fn a_redelivery_delay_is_full_jitter_under_a_doubling_ceiling_capped_at_max() {
        // The ceiling: base after the first ended delivery, doubling, then max.
        assert_eq!(redelivery_delay_ms(1, 1000, 60_000, 1.0), 1000);
        assert_eq!(redelivery_delay_ms(2, 1000, 60_000, 1.0), 2000);
        assert_eq!(redelivery_delay_ms(4, 1000, 60_000, 1.0), 8000);
        assert_eq!(redelivery_delay_ms(7, 1000, 60_000, 1.0), 60_000);
        assert_eq!(redelivery_delay_ms(1001, 1000, 60_000, 1.0), 60_000);
        // Uniform from 0: r scales the ceiling, rounded down to whole ms.
        assert_eq!(redelivery_delay_ms(3, 1000, 60_000, 0.0), 0);
        assert_eq!(redelivery_delay_ms(3, 1000, 60_000, 0.5), 2000);
        assert_eq!(redelivery_delay_ms(1, 3, 3, 0.999_999), 2);
        // attempts 0 (no ended delivery) reads as the first.
        assert_eq!(redelivery_delay_ms(0, 1000, 60_000, 1.0), 1000);
        // r outside [0, 1] is clamped, never a negative or a larger delay.
        assert_eq!(redelivery_delay_ms(2, 1000, 60_000, -3.0), 0);
        assert_eq!(redelivery_delay_ms(2, 1000, 60_000, 7.0), 2000);
        for attempts in 0..=1001 {
            for r in [0.0, 0.1, 0.5, 0.999_999] {
                let d = redelivery_delay_ms(attempts, 250, 86_400_000, r);
                let ceiling = 250f64 * 2f64.powi(attempts.saturating_sub(1).min(1000) as i32);
                assert!(d as f64 <= ceiling.min(86_400_000.0), "{attempts} {r} {d}");
            }
        }
    }

    #[test]
    fn reconnect_delay_is_between_base_and_capped_exponential() {
        // The first failure's window is [base, 2·base], not one point.
        assert_eq!(
            reconnect_delay_ms(0, RECONNECT_BASE_MS, RECONNECT_CAP_MS, 0.0),
            10_000.0
        );
        assert_eq!(
            reconnect_delay_ms(0, RECONNECT_BASE_MS, RECONNECT_CAP_MS, 0.9),
            19_000.0
        );
        assert_eq!(
            reconnect_delay_ms(2, RECONNECT_BASE_MS, RECONNECT_CAP_MS, 0.0),
            10_000.0
        );
        assert_eq!(
            reconnect_delay_ms(2, RECONNECT_BASE_MS, RECONNECT_CAP_MS, 1.0),
            80_000.0
        );
        assert_eq!(
            reconnect_delay_ms(20, RECONNECT_BASE_MS, RECONNECT_CAP_MS, 1.0),
            300_000.0
        );
        for n in 0..64 {
            let d = reconnect_delay_ms(n, RECONNECT_BASE_MS, RECONNECT_CAP_MS, 0.7);
            assert!((10_000.0..=300_000.0).contains(&d));
        }
    }

    #[test]
    fn poll_jitter_is_at_most_half_the_interval_and_30s() {
        assert_eq!(poll_jitter_ms(1000.0, 1.0), 500.0);
        assert_eq!(poll_jitter_ms(600_000.0, 1.0), 30_000.0);
        assert_eq!(poll_jitter_ms(1000.0, 0.0), 0.0);
    }
}
