//! Coalescing of concurrent single-row writes into one statement.
//!
//! On PostgreSQL every statement pays a fixed cost (snapshot, executor start,
//! commit, a network round trip) that dwarfs its one row. Calls that arrive
//! while a statement of their kind is in flight wait in a *lane* and go out
//! together as the next statement, one row per call: River's batch completer
//! and its batched fetch do the same for job completions and fetches. Nothing
//! waits for a timer; a call that finds its lane idle starts the lane's runner
//! at once, so a lone call costs what it did before.
//!
//! Every call keeps its own outcome (its own item, CAS result and error): the
//! statements name the expected state per row exactly as the single-row ones
//! do, so a stale call in a batch changes nothing and is told why alone.
//!
//! A queued call runs even if its caller goes away meanwhile (the runner is a
//! task of its own, so one caller's disconnect never cancels the others). A
//! claim nobody receives then expires unheld after its TTL and the reaper
//! counts the attempt, as for a client that vanished after a single-row
//! claim ran.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;

use sqlx::any::AnyRow;

use super::{get, StoreError};

/// Most calls one statement carries (7 bind parameters each for a settle:
/// far below PostgreSQL's 65,535).
pub const MAX_BATCH: usize = 64;

struct Lane<T> {
    pending: Vec<T>,
    running: bool,
}

/// Calls waiting per key (a queue name for claims, `()` for settles).
pub struct Lanes<K, T> {
    lanes: Mutex<HashMap<K, Lane<T>>>,
}

impl<K, T> std::fmt::Debug for Lanes<K, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Lanes")
    }
}

impl<K: Eq + Hash + Clone, T> Default for Lanes<K, T> {
    fn default() -> Self {
        Lanes {
            lanes: Mutex::new(HashMap::new()),
        }
    }
}

impl<K: Eq + Hash + Clone, T> Lanes<K, T> {
    /// Queues `job` on `key`'s lane. Returns true when the lane was idle: the
    /// caller must then start a runner that drains it with [`Lanes::next`].
    pub fn push(&self, key: &K, job: T) -> bool {
        let mut lanes = self.lanes.lock().unwrap_or_else(|p| p.into_inner());
        let lane = lanes.entry(key.clone()).or_insert_with(|| Lane {
            pending: Vec::new(),
            running: false,
        });
        lane.pending.push(job);
        !std::mem::replace(&mut lane.running, true)
    }

    /// Held by a lane's runner for its whole run: if the runner panics, the
    /// lane is dropped with the calls still waiting in it (each caller's
    /// reply channel closes, an error for it), so the next call starts a
    /// new runner. Otherwise the lane would stay marked running with no
    /// runner, and every later call on it would wait for good.
    pub fn runner<'a>(&'a self, key: &K) -> Runner<'a, K, T> {
        Runner {
            lanes: self,
            key: key.clone(),
        }
    }

    /// How many jobs wait on `key`'s lane for its runner (a batch the runner
    /// took is no longer counted).
    pub fn waiting(&self, key: &K) -> usize {
        let lanes = self.lanes.lock().unwrap_or_else(|p| p.into_inner());
        lanes.get(key).map_or(0, |lane| lane.pending.len())
    }

    /// The runner's next batch: up to `max` jobs in arrival order. `None` when
    /// the lane is empty, which also marks it idle (the next push starts a new
    /// runner), so no job is ever left without one.
    pub fn next(&self, key: &K, max: usize) -> Option<Vec<T>> {
        let mut lanes = self.lanes.lock().unwrap_or_else(|p| p.into_inner());
        let lane = lanes.get_mut(key)?;
        if lane.pending.is_empty() {
            lanes.remove(key);
            return None;
        }
        let take = lane.pending.len().min(max);
        Some(lane.pending.drain(..take).collect())
    }
}

/// See [`Lanes::runner`].
pub struct Runner<'a, K: Eq + Hash + Clone, T> {
    lanes: &'a Lanes<K, T>,
    key: K,
}

impl<K: Eq + Hash + Clone, T> Drop for Runner<'_, K, T> {
    fn drop(&mut self) {
        // Only while unwinding: a runner that ended normally saw its lane
        // emptied and removed (by `next`), and a new lane of the same key
        // may belong to a new runner by now.
        if std::thread::panicking() {
            let mut lanes = self.lanes.lanes.lock().unwrap_or_else(|p| p.into_inner());
            lanes.remove(&self.key);
        }
    }
}

/// A batch statement's rows put back in call order, each made into a `T` by
/// `each(k, row)` for the 0-based call `k` it names (by the 1-based `n` it
/// was bound with); a call with no row gets `None`.
///
/// # Errors
/// A row names no call of the batch (then no row can be trusted).
pub(super) fn by_call<T>(
    rows: &[AnyRow],
    calls: usize,
    mut each: impl FnMut(usize, &AnyRow) -> T,
) -> Result<Vec<Option<T>>, StoreError> {
    let mut out: Vec<Option<T>> = (0..calls).map(|_| None).collect();
    for row in rows {
        let n: i64 = get(row, "n")?;
        let k = usize::try_from(n - 1)
            .ok()
            .filter(|&k| k < calls)
            .ok_or_else(|| StoreError::Corrupt(format!("batch row {n}")))?;
        out[k] = Some(each(k, row));
    }
    Ok(out)
}

/// Whether a coalesced statement's batch is run again call by call: the
/// database refused the statement (and rolled it back), so it changed
/// nothing, and one call of the batch may be what it refused. Not when no
/// pool connection was had (none within the pool's 30 s acquire timeout, or
/// the pool closed): nothing was applied either, but each call run alone
/// would wait that long again, one after another (the k-th claim of a batch
/// was answered after 30 × (k + 1) s during a database outage, and every
/// settle after 60 s; helper-243), so every call is answered `503` at once
/// ([`for_each_call`]). Any other failure (the connection lost while the
/// answer was read, the backend terminated under it — `57P01`, `57P02`,
/// `08…`, which [`StoreError::unavailable`] calls `Unknown` —, a row that
/// does not decode) may come after the commit: a claim batch run again
/// would hand out more items.
pub(super) fn rerun_call_by_call(e: &StoreError) -> bool {
    matches!(e, StoreError::Database(sqlx::Error::Database(_)))
        && e.unavailable() != Some(super::Unavailable::Unknown)
}

/// The failure of a coalesced statement, once more for another call of its
/// batch (sqlx errors do not clone): a database failure stays one, a row that
/// did not decode stays a corrupt row.
pub(super) fn for_each_call(e: &StoreError) -> StoreError {
    if let Some(u) = e.unavailable() {
        // Still answered 503 to each call, as it is to one alone.
        return StoreError::Unavailable(u, e.to_string());
    }
    match e {
        StoreError::Database(_) => StoreError::Database(sqlx::Error::Protocol(e.to_string())),
        _ => StoreError::Corrupt(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_push_on_an_idle_lane_starts_a_runner_and_later_ones_join_it() {
        let lanes: Lanes<&str, u32> = Lanes::default();
        assert!(lanes.push(&"q", 1));
        assert!(!lanes.push(&"q", 2));
        assert!(lanes.push(&"other", 3), "lanes are per key");
        assert_eq!(lanes.next(&"q", 64), Some(vec![1, 2]));
        assert!(!lanes.push(&"q", 4), "the runner is still draining");
        assert_eq!(lanes.next(&"q", 64), Some(vec![4]));
        assert_eq!(lanes.next(&"q", 64), None);
        assert!(lanes.push(&"q", 5), "an emptied lane is idle again");
    }

    #[test]
    fn a_runner_that_panics_leaves_its_lane_idle_so_the_next_call_starts_one() {
        let lanes: Lanes<&str, u32> = Lanes::default();
        assert!(lanes.push(&"q", 1));
        assert!(!lanes.push(&"q", 2));
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _runner = lanes.runner(&"q");
            let _ = lanes.next(&"q", 1);
            panic!("a statement's code panicked");
        }));
        assert!(run.is_err());
        assert!(lanes.push(&"q", 3), "a new runner starts");
        assert_eq!(
            lanes.next(&"q", 64),
            Some(vec![3]),
            "the dead runner's calls were dropped"
        );
        // A runner that ends normally leaves a newer lane of its key alone.
        let newer = lanes.runner(&"q");
        assert_eq!(lanes.next(&"q", 64), None);
        assert!(lanes.push(&"q", 4));
        drop(newer);
        assert!(!lanes.push(&"q", 5), "the new lane is still running");
    }

    /// A batch whose statement got no pool connection is answered `503`
    /// call by call at once, never run again call by call (each call would
    /// wait the pool's acquire timeout again); one the database refused is
    /// run again call by call; one whose connection broke mid-answer is not
    /// (it may have committed).
    #[test]
    fn a_batch_without_a_pool_connection_is_answered_at_once_not_run_again() {
        for e in [sqlx::Error::PoolTimedOut, sqlx::Error::PoolClosed] {
            let e = StoreError::Database(e);
            assert!(!rerun_call_by_call(&e), "{e}");
            let each = for_each_call(&e);
            assert_eq!(
                each.unavailable(),
                Some(crate::store::Unavailable::NotApplied),
                "each call is answered 503 (not applied): {each}"
            );
        }
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        assert!(!rerun_call_by_call(&StoreError::Database(sqlx::Error::Io(
            io
        ))));
    }

    #[test]
    fn a_batch_takes_at_most_max_jobs_in_arrival_order() {
        let lanes: Lanes<(), u32> = Lanes::default();
        for i in 0..10 {
            lanes.push(&(), i);
        }
        assert_eq!(lanes.next(&(), 4), Some(vec![0, 1, 2, 3]));
        assert_eq!(lanes.next(&(), 4), Some(vec![4, 5, 6, 7]));
        assert_eq!(lanes.next(&(), 4), Some(vec![8, 9]));
        assert_eq!(lanes.next(&(), 4), None);
    }
}
