//! What every handler shares (its own module so that the router, the handlers
//! and the extractors all import it without a cycle).

use std::net::IpAddr;
use std::sync::Arc;

use crate::authcache::AuthCache;
use crate::metrics::Metrics;
use crate::ratelimit::RateLimiter;
use crate::store::Store;

/// The state behind every `/v1` handler.
#[derive(Debug, Clone)]
pub struct AppState {
    /// The database.
    pub store: Store,
    /// SHA-256 of the admin token; `None` disables admin access.
    pub admin_hash: Option<String>,
    /// Access tokens verified in the last seconds (saves a query per request).
    pub auth_cache: Arc<AuthCache>,
    /// Claim polling limit, per worker (per instance).
    pub claim_limiter: Arc<RateLimiter<i64>>,
    /// Enroll/refresh limit, per client address (per instance).
    pub auth_limiter: Arc<RateLimiter<IpAddr>>,
    /// Tokenless release (beacon) limit, per client address (per instance):
    /// `--auth-rate` too, in a bucket of its own, so that the beacons of a
    /// page being closed never hold back the next page's enroll or refresh.
    pub beacon_limiter: Arc<RateLimiter<IpAddr>>,
    /// `Retry-After` of an empty claim (ms).
    pub idle_retry_ms: u64,
    /// This instance's metrics (its own registry).
    pub metrics: Arc<Metrics>,
    /// How long a scrape waits for the queue gauges' database read
    /// (`--metrics-read-timeout-ms`).
    pub metrics_read_timeout: std::time::Duration,
}
