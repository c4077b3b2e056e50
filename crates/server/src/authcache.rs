//! Access tokens this instance verified recently, so that a worker's steady
//! stream of heartbeats costs one statement each instead of two.
//!
//! An entry is kept for at most [`MAX_AGE`] and never past the token's own
//! expiry as the database reported it (both are durations measured on this
//! process's monotonic clock; no lease time is involved). Keys are the SHA-256
//! of the whole token, so the map holds no secret. A token that was never
//! verified, or whose entry aged out, is checked against the database.
//!
//! Each entry is filed under its worker's revocation count on this instance
//! ([`crate::store::Store::revocations`]); once this instance commits a
//! revocation of that worker the count moves and the entry is not trusted
//! again, so a revoked worker's access tokens stop working here at once
//! (other instances: within [`MAX_AGE`]), and other workers' entries stay.
//! An answer read while any revocation committed is not cached at all.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::store::{Principal, Revocations};

/// Longest time a verified token is trusted without asking the database again.
pub const MAX_AGE: Duration = Duration::from_secs(5);
/// Entries above which the map is emptied (a bound, not a working size).
const MAX_ENTRIES: usize = 50_000;

/// Verified access tokens (see the module docs).
#[derive(Debug, Default)]
pub struct AuthCache {
    entries: Mutex<HashMap<String, (Principal, Instant, u64)>>,
}

impl AuthCache {
    /// The principal of the token with hash `key`, if verified, still fresh
    /// and filed under its worker's current revocation count.
    pub fn get(&self, key: &str, revocations: &Revocations) -> Option<Principal> {
        let mut map = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        match map.get(key) {
            Some((p, until, seen))
                if Instant::now() < *until && *seen == revocations.of(p.worker_id) =>
            {
                Some(p.clone())
            }
            Some(_) => {
                map.remove(key);
                None
            }
            None => None,
        }
    }

    /// Remembers a verified token for `MAX_AGE` or `valid_ms`, whichever is
    /// shorter, filed under `revocations` (its worker's count, read after
    /// verifying, by a caller that saw no revocation meanwhile).
    pub fn put(&self, key: String, principal: Principal, valid_ms: u64, revocations: u64) {
        let age = MAX_AGE.min(Duration::from_millis(valid_ms));
        let mut map = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() >= MAX_ENTRIES {
            map.clear();
        }
        map.insert(key, (principal, Instant::now() + age, revocations));
    }
}
