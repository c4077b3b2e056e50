//! The reaper: every `--reaper-ms` on every instance, take over expired claims;
//! every tenth pass, delete settled items past `--retention-ms`.
//!
//! Instances need no coordination: each takeover is a conditional update on the
//! state, epoch and expiry it read, so two reapers (or a reaper and a settling
//! worker) racing for one item change it at most once.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::metrics::Metrics;

/// Purge runs of remembered claim attempts per reaper pass while a backlog
/// lasts (each at most [`crate::store::DELETE_MAX`] rows): 100,000 rows a
/// pass, about 6,700 a second at the default 15 s interval, above what one
/// instance claims.
const KEY_PURGE_RUNS: u32 = 5;
use crate::store::Store;

/// Spawns the reaper loop; it ends when `shutdown` changes or its sender drops.
#[must_use = "the task handle should be awaited on shutdown"]
pub fn spawn(
    store: Store,
    every: Duration,
    mut shutdown: watch::Receiver<bool>,
    metrics: Arc<Metrics>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every.max(Duration::from_millis(1)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut passes: u64 = 0;
        // The last retention sweep deleted as many as one sweep may: more wait.
        let mut backlog = false;
        // The same for the remembered claim attempts (one row per keyed
        // claim: a busy server adds them faster than one bounded purge per
        // 100 passes deletes).
        let mut keys_backlog = false;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = shutdown.changed() => return,
            }
            // A stop ends a pass in progress: a takeover waiting on a row
            // another session keeps locked (`lock_timeout` 0), or on a pool
            // whose database went away, held the stop (README, Stopping)
            // for as long as that lasted. Each takeover is a transaction of
            // its own, so one cut off is rolled back whole.
            let work = async {
                match metrics.reaper_pass(&store).await {
                    Ok((0, 0)) => {}
                    Ok((reopened, failed)) => {
                        tracing::info!(reopened, failed, "reaper took over expired claims");
                    }
                    Err(e) => tracing::warn!(error = %e, "reaper pass failed"),
                }
                // This pass's number from 0: the first pass after a start
                // sweeps too, so a server restarted more often than ten
                // (or a hundred) passes still sweeps.
                let pass = passes;
                passes += 1;
                // Settled items past `--retention-ms`: every 10th pass, or the
                // next one while a backlog lasts (one sweep deletes a bounded
                // number, so takeovers never wait long behind it).
                if pass % 10 == 0 || backlog {
                    backlog = match metrics.delete_settled(&store).await {
                        Ok(n) => {
                            if n > 0 {
                                tracing::info!(deleted = n, "retention: settled items deleted");
                            }
                            n >= crate::store::DELETE_MAX
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "retention sweep failed");
                            false
                        }
                    };
                }
                // Expired credentials are swept far less often than leases.
                if pass % 100 == 0 {
                    if let Err(e) = store.purge_credentials().await {
                        tracing::warn!(error = %e, "credential purge failed");
                    }
                }
                // And so are the claim attempts remembered past their
                // leases (`Store::claim_attempt`), past their hour, or on the
                // next pass while a backlog lasts.
                // While a run deletes as many as one run may, up to
                // `KEY_PURGE_RUNS` runs follow in this pass (a busy server
                // writes more than one run's rows per pass).
                if pass % 100 == 0 || keys_backlog {
                    keys_backlog = false;
                    for _ in 0..KEY_PURGE_RUNS {
                        match store.forget_claim_keys().await {
                            Ok(n) if n >= crate::store::DELETE_MAX => keys_backlog = true,
                            Ok(_) => {
                                keys_backlog = false;
                                break;
                            }
                            Err(e) => {
                                tracing::warn!(error = %e, "claim key purge failed");
                                keys_backlog = false;
                                break;
                            }
                        }
                    }
                }
            };
            tokio::select! {
                () = work => {}
                _ = shutdown.changed() => return,
            }
        }
    })
}
