//! Keyed rate limits (per worker for claim polling, per client address, an
//! IPv6 one by its /64 ([`client_key`]), for the unauthenticated endpoints),
//! on `governor`'s GCRA limiter.
//!
//! Limits are per server instance and measured with this process's monotonic
//! clock: that is a duration, never compared with lease times.

use std::hash::Hash;
use std::net::{IpAddr, Ipv6Addr};
use std::num::NonZeroU32;
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota};

/// A rate: `count` requests per `per`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    /// Bucket size (burst).
    pub count: u32,
    /// Refill period for `count` tokens.
    pub per: Duration,
}

/// The requests a [`Rate`] may allow per period.
pub const RATE_COUNT: std::ops::RangeInclusive<u32> = 1..=10_000_000;

/// The longest period of a [`Rate`] (the shortest is 1 ms).
pub const MAX_RATE_PERIOD: Duration = Duration::from_secs(3600);

impl std::str::FromStr for Rate {
    type Err = String;

    /// `"20/s"`, `"600/min"`, `"5/100ms"` or a bare number (per second); the
    /// count is 1..=10,000,000 and the period 1 ms to one hour.
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
        if !RATE_COUNT.contains(&count) {
            return Err(format!(
                "rate count must be {}..={}",
                RATE_COUNT.start(),
                RATE_COUNT.end()
            ));
        }
        if per > MAX_RATE_PERIOD {
            return Err(format!("rate period {per:?} is longer than one hour"));
        }
        Ok(Rate { count, per })
    }
}

/// Keys above which idle entries are dropped (each entry is a few dozen bytes).
const RETAIN_ABOVE: usize = 10_000;

/// A rate limit per key: bursts of up to `count`, refilled evenly over `per`.
#[derive(Debug)]
pub struct RateLimiter<K: Hash + Eq + Clone> {
    limiter: DefaultKeyedRateLimiter<K>,
    clock: DefaultClock,
}

impl<K: Hash + Eq + Clone> RateLimiter<K> {
    /// A limiter allowing `rate` per key.
    pub fn new(rate: Rate) -> RateLimiter<K> {
        let burst = NonZeroU32::new(rate.count).unwrap_or(NonZeroU32::MIN);
        let period = (rate.per / rate.count.max(1)).max(Duration::from_nanos(1));
        let quota = Quota::with_period(period)
            .unwrap_or_else(|| Quota::per_second(burst))
            .allow_burst(burst);
        RateLimiter {
            limiter: DefaultKeyedRateLimiter::keyed(quota),
            clock: DefaultClock::default(),
        }
    }

    /// Takes one request for `key` now; `Err(wait)` when it must wait that long.
    pub fn check(&self, key: &K) -> Result<(), Duration> {
        if self.limiter.len() > RETAIN_ABOVE {
            self.limiter.retain_recent();
        }
        self.limiter
            .check_key(key)
            .map_err(|not_until| not_until.wait_time_from(self.clock.now()))
    }
}

/// The key a client address is limited under: an IPv4 address (an
/// IPv4-mapped IPv6 one included) as it is; an IPv6 address by its /64
/// prefix, the interface identifier zeroed. A /64 is one network (one LAN,
/// RFC 4291's interface identifiers), and a host on it may send from any of
/// its 2^64 addresses (temporary addresses, RFC 8981): keyed by the full
/// address, each request could take a fresh bucket and no limit would hold.
/// The trade, both ways: the hosts of one LAN share a bucket (as hosts
/// behind one IPv4 NAT do), and a site given a shorter prefix (a /56 or /48,
/// as RFC 6177 recommends for end sites) has that many /64s, each with its
/// own bucket.
pub fn client_key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !u128::from(u64::MAX))),
        v4 => v4,
    }
}

/// Whole seconds for a `Retry-After` header: `wait` rounded up, at least 1.
pub fn retry_after_secs(wait: Duration) -> u64 {
    wait.as_millis().div_ceil(1000).max(1) as u64
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
    fn a_key_gets_its_burst_then_waits_while_other_keys_are_unaffected() {
        let l = RateLimiter::new("2/s".parse().unwrap());
        assert!(l.check(&1).is_ok());
        assert!(l.check(&1).is_ok());
        let wait = l.check(&1).unwrap_err();
        assert!(wait > Duration::ZERO && wait <= Duration::from_millis(500));
        assert!(l.check(&2).is_ok(), "other keys have their own allowance");
        assert_eq!(retry_after_secs(wait), 1);
    }

    #[test]
    fn ipv6_clients_of_one_64_prefix_share_one_auth_and_beacon_bucket() {
        let ip = |s: &str| client_key(s.parse().unwrap());
        let l = RateLimiter::new("1/min".parse().unwrap());
        assert!(l.check(&ip("2001:db8:1:2:aaaa::1")).is_ok());
        // Another address of the same /64: the same bucket, now empty.
        assert!(l.check(&ip("2001:db8:1:2:ffff:1:2:3")).is_err());
        assert!(l.check(&ip("2001:db8:1:2::")).is_err());
        // The next /64 is another client.
        assert!(l.check(&ip("2001:db8:1:3::1")).is_ok());
        // IPv4 keeps one bucket per address, mapped into IPv6 or not.
        assert!(l.check(&ip("192.0.2.1")).is_ok());
        assert!(l.check(&ip("::ffff:192.0.2.1")).is_err());
        assert!(l.check(&ip("192.0.2.2")).is_ok());
    }
}
