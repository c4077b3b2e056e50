//! PostgreSQL: the bound on calls run alone that may wait for a row lock.
//!
//! A coalesced settle or batched heartbeat passes over a row another
//! session keeps locked (`FOR UPDATE SKIP LOCKED`), and a keyed claim that
//! finds only locked open items is claimed again; each such call then runs
//! alone, in a task of its own, and waits for its row on a pool connection
//! of its own (at most `lock_timeout`). Unbounded, a session keeping more
//! rows locked than the pool has connections took the whole pool in waves
//! of one `lock_timeout` each: a batched heartbeat was answered after all
//! its waves, and every other call of the instance (claims, enqueues,
//! authentication on unrelated rows) queued behind them for a connection.
//!
//! So at most [`LoneWaits::permits`] such calls (a quarter of the pool, at
//! least one) hold a connection at once; the others wait for a permit, in
//! arrival order, at most the effective `lock_timeout`, and a call that gets
//! none by then is answered `503` ([`Unavailable::NotApplied`], nothing
//! written), as an uncoalesced call refused by `lock_timeout` is. A call
//! that gets a permit waits for its row as before: it holds the permit
//! from before it takes a connection until its statements are done. Calls
//! queue on one row lock in the order they reach it: a settle that waits
//! for its permit (all of them taken by waits on other rows) can be passed
//! by a later release of the same lease from another client, which waits
//! on the row at once (the SDK never sends a release while a settle of the
//! lease is on the wire). Where the operator set no bound
//! (`lock_timeout` 0), the permit wait is still bounded, by
//! [`PG_LOCK_TIMEOUT_MS`]: a call whose row is free must not wait for good
//! behind calls waiting for good on other rows; refused, it is retried by
//! its client, and its row is no longer passed over once free. SQLite has
//! one writer and no lone waits: it takes no permit.
//!
//! Enqueues into one queue wait for that queue's advisory lock
//! (`Store::queue_lock`), each on a pool connection: unbounded, a burst of
//! enqueues into one busy queue took every connection of the instance
//! while they waited their turn, and heartbeats, settles and claims of
//! every other queue queued for a connection behind them (their leases
//! could run out). So an enqueue first takes its queue's gate in memory
//! ([`LoneWaits::enqueue`]: one of [`ENQUEUE_GATES`] stripes by the queue
//! name's hash), and only then a connection: at most one enqueue per
//! stripe and instance holds a connection while it waits for the lock
//! (which other instances' enqueues into the queue hold only while they
//! insert). A gate not free within the same wait as a permit's is a `503`
//! (nothing written).

use super::{StoreError, Unavailable, PG_LOCK_TIMEOUT_MS};
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::time::Duration;
use tokio::sync::{Mutex, Semaphore};

/// Stripes of the enqueue gate ([`LoneWaits::enqueue`]): queues hashing to
/// one stripe share it, which only makes them take turns.
pub(super) const ENQUEUE_GATES: usize = 64;

/// See the module's documentation.
#[derive(Debug)]
pub(super) struct LoneWaits {
    permits: Semaphore,
    wait: Duration,
    /// The enqueue gates, by stripe.
    enqueues: Vec<Mutex<()>>,
}

impl LoneWaits {
    /// The bound for a pool of `max_connections` whose sessions wait
    /// `lock_timeout_ms` for a lock (0: no bound).
    pub(super) fn new(max_connections: u32, lock_timeout_ms: u64) -> LoneWaits {
        let wait = match lock_timeout_ms {
            0 => PG_LOCK_TIMEOUT_MS,
            ms => ms,
        };
        LoneWaits {
            permits: Semaphore::new(LoneWaits::permits(max_connections)),
            wait: Duration::from_millis(wait),
            enqueues: (0..ENQUEUE_GATES).map(|_| Mutex::new(())).collect(),
        }
    }

    /// How many calls run alone may hold a pool connection at once: a
    /// quarter of the pool, at least one.
    pub(super) fn permits(max_connections: u32) -> usize {
        (max_connections as usize / 4).max(1)
    }

    /// Runs `call` holding a permit, or answers `503` (nothing run) when
    /// none comes within the permit wait.
    pub(super) async fn run<T>(
        &self,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let _permit = match tokio::time::timeout(self.wait, self.permits.acquire()).await {
            Ok(Ok(permit)) => permit,
            _ => {
                return Err(StoreError::Unavailable(
                    Unavailable::NotApplied,
                    format!(
                        "no lone lock wait free within {} ms: other calls of this \
                         instance wait for rows another session keeps locked",
                        self.wait.as_millis()
                    ),
                ))
            }
        };
        call.await
    }

    /// Runs `call`, an enqueue into `queue`, holding that queue's gate (see
    /// the module's documentation), or answers `503` (nothing run) when the
    /// gate is not free within the permit wait.
    pub(super) async fn enqueue<T>(
        &self,
        queue: &str,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let mut h = std::hash::DefaultHasher::new();
        queue.hash(&mut h);
        let gate = &self.enqueues[(h.finish() % ENQUEUE_GATES as u64) as usize];
        let Ok(_gate) = tokio::time::timeout(self.wait, gate.lock()).await else {
            return Err(StoreError::Unavailable(
                Unavailable::NotApplied,
                format!(
                    "no turn to enqueue into this queue within {} ms: other enqueues \
                     into it wait for its lock",
                    self.wait.as_millis()
                ),
            ));
        };
        call.await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Enqueues into one queue take turns at its gate before they run (so
    /// before they take a pool connection): a second one does not run
    /// while the first holds the gate, and one that gets no turn within
    /// the wait is refused `503`, nothing of it run; once the gate is free,
    /// the next runs. Before, each waited for the queue's lock on a pool
    /// connection of its own, and a burst into one queue took the pool.
    #[tokio::test]
    async fn enqueues_into_one_queue_take_turns_before_they_take_a_connection() {
        let lone = std::sync::Arc::new(LoneWaits::new(10, 50));
        let (hold, held) = tokio::sync::oneshot::channel::<()>();
        let (started, running) = tokio::sync::oneshot::channel::<()>();
        let first = {
            let lone = lone.clone();
            tokio::spawn(async move {
                lone.enqueue("jobs", async {
                    let _ = started.send(());
                    let _ = held.await;
                    Ok(1)
                })
                .await
            })
        };
        running.await.unwrap();
        let mut ran = false;
        let out = lone
            .enqueue("jobs", async {
                ran = true;
                Ok(2)
            })
            .await;
        assert!(!ran, "the second enqueue ran while the first held the gate");
        assert!(matches!(
            out,
            Err(StoreError::Unavailable(Unavailable::NotApplied, _))
        ));
        hold.send(()).unwrap();
        assert_eq!(first.await.unwrap().unwrap(), 1);
        let next = lone.enqueue("jobs", async { Ok(3) }).await;
        assert_eq!(next.unwrap(), 3);
    }

    #[test]
    fn a_quarter_of_the_pool_waits_alone_at_least_one() {
        assert_eq!(LoneWaits::permits(1), 1);
        assert_eq!(LoneWaits::permits(2), 1);
        assert_eq!(LoneWaits::permits(10), 2);
        assert_eq!(LoneWaits::permits(40), 10);
    }

    /// A call that gets no permit within the wait is refused `503`, nothing
    /// of it run; one that gets a permit runs.
    #[tokio::test]
    async fn a_call_without_a_permit_in_time_is_refused() {
        let lone = std::sync::Arc::new(LoneWaits::new(2, 50));
        let (hold, held) = tokio::sync::oneshot::channel::<()>();
        let first = {
            let lone = lone.clone();
            tokio::spawn(async move {
                lone.run(async {
                    let _ = held.await;
                    Ok(1)
                })
                .await
            })
        };
        tokio::task::yield_now().await;
        let mut ran = false;
        let out = lone
            .run(async {
                ran = true;
                Ok(2)
            })
            .await;
        assert!(!ran);
        assert_eq!(
            out.unwrap_err().unavailable(),
            Some(Unavailable::NotApplied)
        );
        hold.send(()).unwrap();
        assert_eq!(first.await.unwrap().unwrap(), 1);
        assert_eq!(lone.run(async { Ok(3) }).await.unwrap(), 3);
        assert_eq!(
            LoneWaits::new(2, 0).wait,
            Duration::from_millis(PG_LOCK_TIMEOUT_MS)
        );
    }
}
