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

use super::{StoreError, Unavailable, PG_LOCK_TIMEOUT_MS};
use std::future::Future;
use std::time::Duration;
use tokio::sync::Semaphore;

/// See the module's documentation.
#[derive(Debug)]
pub(super) struct LoneWaits {
    permits: Semaphore,
    wait: Duration,
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
}

#[cfg(test)]
mod tests {
    use super::*;

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
