//! Per-worker token buckets for claim polling.
//!
//! Limits are per server instance and measured with this process's monotonic
//! clock: that is a duration, never compared with lease times.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A rate: `count` requests per `per`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    /// Bucket size (burst).
    pub count: u32,
    /// Refill period for `count` tokens.
    pub per: Duration,
}

impl std::str::FromStr for Rate {
    type Err = String;

    /// `"20/s"`, `"600/min"`, `"5/100ms"` or a bare number (per second).
    fn from_str(s: &str) -> Result<Rate, String> {
        let (count, unit) = s.split_once('/').unwrap_or((s, "s"));
        let count: u32 = count
            .trim()
            .parse()
            .map_err(|_| format!("bad count in rate {s:?}"))?;
        let per = match unit.trim() {
            "s" | "sec" => Duration::from_secs(1),
            "m" | "min" => Duration::from_secs(60),
            other => match other.strip_suffix("ms").map(str::parse::<u64>) {
                Some(Ok(n)) if n > 0 => Duration::from_millis(n),
                _ => return Err(format!("bad unit in rate {s:?} (use s, min or <n>ms)")),
            },
        };
        if count == 0 {
            return Err("rate count must be at least 1".into());
        }
        Ok(Rate { count, per })
    }
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// Token buckets keyed by worker id.
#[derive(Debug)]
pub struct RateLimiter {
    rate: Rate,
    buckets: Mutex<HashMap<i64, Bucket>>,
}

impl RateLimiter {
    /// A limiter allowing `rate` per key.
    pub fn new(rate: Rate) -> RateLimiter {
        RateLimiter {
            rate,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Takes one token for `key` at `now`; `Err(wait)` when the bucket is empty.
    pub fn check_at(&self, key: i64, now: Instant) -> Result<(), Duration> {
        let per_token = self.rate.per.as_secs_f64() / f64::from(self.rate.count);
        let cap = f64::from(self.rate.count);
        // A poisoned lock only means another request panicked mid-update; the
        // bucket numbers are still usable.
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        let b = buckets.entry(key).or_insert(Bucket {
            tokens: cap,
            at: now,
        });
        let refill = now.saturating_duration_since(b.at).as_secs_f64() / per_token;
        b.tokens = (b.tokens + refill).min(cap);
        b.at = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - b.tokens) * per_token))
        }
    }

    /// [`RateLimiter::check_at`] now.
    pub fn check(&self, key: i64) -> Result<(), Duration> {
        self.check_at(key, Instant::now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse() {
        let r: Rate = "20/s".parse().unwrap();
        assert_eq!((r.count, r.per), (20, Duration::from_secs(1)));
        let r: Rate = "5/100ms".parse().unwrap();
        assert_eq!(r.per, Duration::from_millis(100));
        assert!("0/s".parse::<Rate>().is_err());
        assert!("3/fortnight".parse::<Rate>().is_err());
    }

    #[test]
    fn a_bucket_allows_its_burst_then_refills_per_key() {
        let l = RateLimiter::new("2/s".parse().unwrap());
        let t0 = Instant::now();
        assert!(l.check_at(1, t0).is_ok());
        assert!(l.check_at(1, t0).is_ok());
        let wait = l.check_at(1, t0).unwrap_err();
        assert!(wait > Duration::from_millis(400) && wait <= Duration::from_millis(500));
        assert!(
            l.check_at(2, t0).is_ok(),
            "other workers have their own bucket"
        );
        assert!(l.check_at(1, t0 + Duration::from_millis(500)).is_ok());
    }
}
