//! The reaper's takeover of expired claims (the loop that runs it is
//! `crate::reaper`).
//!
//! A pass reads the expired running rows page by page in id order and takes
//! each one over with a conditional update, so a concurrent change (a
//! heartbeat, a settle, another instance's takeover) wins and nothing is
//! written. A row the pass cannot decode (a counter out of range, such as the
//! negative `max_redeliveries` that migration 4 made of items enqueued with a
//! cap of 0) stops nothing: it is logged with its id, counted, and failed with
//! reason [`UNREADABLE_REASON`] (its counters clamped into range, so it reads
//! again), since the reaper cannot tell whether its cap allows another
//! delivery. It leaves `running` for a terminal state an operator sees, and
//! every other expired lease, of every queue, is still taken over.

use agentstore_protocol::lease::{end_attempt, ItemState, LeaseEvent, LeaseItem, RetryBackoff};

use sqlx::any::AnyRow;

use super::item::{backoff_from_row, lease_item_from_row, redelivery_delay};
use super::unreadable::{fail_set, UNREADABLE_REASON};
use super::{get, lease_ttl_sql, ms, to_u64, Store, StoreError};

/// Expired claims read per statement of a pass.
const PAGE: u32 = 500;

/// Settled items deleted per statement of [`Store::delete_settled`].
pub(crate) const DELETE_PAGE: u32 = 1000;
/// Statements per [`Store::delete_settled`] call: a backlog (the retention
/// just switched on) goes over several passes, never in one long one.
pub(crate) const DELETE_PAGES: u32 = 20;
/// The most one [`Store::delete_settled`] call deletes: a call that
/// deleted this many may have left more.
pub const DELETE_MAX: u64 = DELETE_PAGE as u64 * DELETE_PAGES as u64;

/// A running claim the reaper found expired, as it read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpiredClaim {
    /// The item.
    pub id: i64,
    /// The lease-relevant state read.
    pub item: LeaseItem,
    /// The database clock when it was read (ms).
    pub now_ms: i64,
    /// The TTL (ms) the lease was granted with.
    pub ttl_ms: u64,
    /// The item's redelivery backoff, if any: a takeover that reopens it
    /// makes it claimable only after a draw of it.
    pub backoff: Option<RetryBackoff>,
}

/// An expired running row the reaper could not decode.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Unreadable {
    id: i64,
    why: String,
}

/// Decodes a row of [`Store::expired_after`].
fn expired_from_row(id: i64, row: &AnyRow) -> Result<ExpiredClaim, StoreError> {
    Ok(ExpiredClaim {
        id,
        item: lease_item_from_row(row)?,
        now_ms: get(row, "now_ms")?,
        ttl_ms: to_u64(get(row, "ttl_ms")?, "lease_ttl_ms")?,
        backoff: backoff_from_row(row),
    })
}

impl Store {
    /// Running claims that are expired now on the database clock (last
    /// heartbeat older than the TTL, or never recorded), oldest first. Rows
    /// that cannot be decoded are left out (the reaper fails them, see the
    /// module docs).
    ///
    /// # Errors
    /// The database failed.
    pub async fn expired_claims(&self, limit: u32) -> Result<Vec<ExpiredClaim>, StoreError> {
        let page = self.expired_after(0, limit).await?;
        Ok(page.into_iter().filter_map(Result::ok).collect())
    }

    /// Up to `limit` expired claims with ids above `after`, in id order, each
    /// decoded on its own.
    async fn expired_after(
        &self,
        after: i64,
        limit: u32,
    ) -> Result<Vec<Result<ExpiredClaim, Unreadable>>, StoreError> {
        let sql = self.sql(&format!(
            "SELECT * FROM (
                 SELECT id, state, epoch, attempts, max_redeliveries, heartbeat_at, token_hash,
                        retry_backoff_base_ms, retry_backoff_max_ms, {} AS ttl_ms, {{now}} AS now_ms
                 FROM items WHERE state = 'running' AND id > $3) AS r
             WHERE heartbeat_at IS NULL OR heartbeat_at <= now_ms - ttl_ms
             ORDER BY id LIMIT $2",
            lease_ttl_sql("$1")
        ));
        let rows = sqlx::query(&sql)
            .bind(ms(self.settings.ttl_ms))
            .bind(i64::from(limit))
            .bind(after)
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|row| {
                let id: i64 = get(row, "id")?;
                Ok(expired_from_row(id, row).map_err(|e| Unreadable {
                    id,
                    why: e.to_string(),
                }))
            })
            .collect()
    }

    /// Takes over one claim found by [`Store::expired_claims`]: reopens it (one
    /// attempt counted) or fails it with `retry_limit` at the cap. Returns the new
    /// state, or `None` when the item changed since it was read (settled,
    /// heartbeated, claimed again): then nothing is written (case C-F1).
    ///
    /// # Errors
    /// The database failed.
    pub async fn take_over(&self, claim: &ExpiredClaim) -> Result<Option<ItemState>, StoreError> {
        let Ok(next) = claim
            .item
            .apply(LeaseEvent::Expire, false, claim.now_ms, claim.ttl_ms)
        else {
            return Ok(None);
        };
        let (_, _, reason) = end_attempt(claim.item.attempts, claim.item.max_redeliveries);
        let delay = redelivery_delay(claim.backoff, next.state, next.attempts);
        let sql = self.sql(&format!(
            "UPDATE items SET state = $3, attempts = $4, last_error = $5, token_hash = NULL, lease_ttl_ms = NULL, claim_key = NULL,
                 worker_id = NULL, heartbeat_at = NULL, updated_at = {{now}},
                 available_at = {{now}} + CAST($7 AS BIGINT)
             WHERE id = $1 AND state = 'running' AND epoch = $2
               AND (heartbeat_at IS NULL
                    OR heartbeat_at <= {{now}} - {})",
            lease_ttl_sql("$6")
        ));
        let done = sqlx::query(&sql)
            .bind(claim.id)
            .bind(ms(claim.item.epoch))
            .bind(next.state.as_str())
            .bind(i64::from(next.attempts))
            .bind(reason)
            .bind(ms(self.settings.ttl_ms))
            .bind(delay)
            .execute(&self.pool)
            .await?;
        Ok((done.rows_affected() == 1).then_some(next.state))
    }

    /// Fails an expired running row that could not be decoded, with reason
    /// [`UNREADABLE_REASON`], clamping its counters into range; fenced like a
    /// takeover on its state and expiry (its epoch may be what could not be
    /// read), so a heartbeat or settle that came meanwhile wins. Whether it
    /// was failed.
    async fn fail_unreadable(&self, id: i64) -> Result<bool, StoreError> {
        let sql = self.sql(&format!(
            "UPDATE items SET {}
             WHERE id = $1 AND state = 'running'
               AND (heartbeat_at IS NULL
                    OR heartbeat_at <= {{now}} - {})",
            fail_set(),
            lease_ttl_sql("$3")
        ));
        let done = sqlx::query(&sql)
            .bind(id)
            .bind(UNREADABLE_REASON)
            .bind(ms(self.settings.ttl_ms))
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// One reaper pass: takes over every expired claim; returns how many were
    /// reopened and how many failed by the retry cap (rows failed as
    /// unreadable are counted apart, see [`Store::metrics`]).
    ///
    /// # Errors
    /// The database failed.
    pub async fn reap(&self) -> Result<(usize, usize), StoreError> {
        let mut taken = (0, 0);
        self.reap_into(&mut taken).await.map(|()| taken)
    }

    /// [`Store::reap`], adding each takeover to `taken` (`(reopened,
    /// failed)`) as it commits: a pass that fails partway still reports the
    /// takeovers it made (the metrics count them). The pass walks the
    /// expired claims once in id order, so no row is read twice in a pass.
    ///
    /// # Errors
    /// The database failed.
    pub async fn reap_into(&self, taken: &mut (usize, usize)) -> Result<(), StoreError> {
        let mut after = 0;
        loop {
            let page = self.expired_after(after, PAGE).await?;
            for entry in &page {
                match entry {
                    Ok(claim) => {
                        after = claim.id;
                        match skip_locked(claim.id, self.take_over(claim).await)? {
                            Some(Some(ItemState::Failed)) => taken.1 += 1,
                            Some(Some(_)) => taken.0 += 1,
                            Some(None) | None => {}
                        }
                    }
                    Err(bad) => {
                        after = bad.id;
                        let Some(failed) = skip_locked(bad.id, self.fail_unreadable(bad.id).await)?
                        else {
                            continue;
                        };
                        if failed {
                            self.metrics.unreadable_row("reaper");
                        }
                        tracing::warn!(
                            item_id = bad.id,
                            error = %bad.why,
                            failed,
                            "reaper: an expired running row cannot be read; it is failed \
                             with reason {UNREADABLE_REASON}"
                        );
                    }
                }
            }
            if page.len() < PAGE as usize {
                return Ok(());
            }
        }
    }
}

/// A takeover's outcome, or `None` when the row stayed locked by another
/// session past `lock_timeout` (nothing written; [`StoreError::row_locked`]):
/// the pass goes on with the next row and a later pass tries this one again.
/// Before, the first such row ended every pass, so no expired lease after it
/// was ever taken over while a session (an admin's `psql` left in a
/// transaction) held it. Any other failure ends the pass: with the database
/// gone, each further row would wait out the pool's timeout.
fn skip_locked<T>(id: i64, outcome: Result<T, StoreError>) -> Result<Option<T>, StoreError> {
    match outcome {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.row_locked() => {
            tracing::warn!(item_id = id, error = %e, "reaper: row locked by another session; skipped this pass");
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

impl Store {
    /// Deletes the `done` and `failed` items whose settle (`updated_at`, the
    /// database clock) is older than [`super::Settings::retention_ms`], at
    /// most [`DELETE_MAX`] (20,000) per call in statements of 1,000, oldest first; returns
    /// how many went. A no-op with retention 0. Items in any other state
    /// (open, running, paused, blocked) are never deleted. Each statement
    /// picks its page once, whatever the plan, and on PostgreSQL locks it,
    /// the lock checking state and age again on the row's latest version, so
    /// a row that changed after it was read stays. On PostgreSQL a row another
    /// session holds locked is left for a later sweep (`FOR UPDATE SKIP
    /// LOCKED`): it would otherwise hold each sweep for `lock_timeout` and
    /// fail it, so that nothing was deleted while the lock lasted. With the item go its result and
    /// its enqueue `Idempotency-Key` (an enqueue with that key adds a new
    /// item afterwards), as River's `CompletedJobRetentionPeriod` and
    /// pg-boss's `deleteAfter` do.
    ///
    /// # Errors
    /// The database failed (what was deleted before stays deleted; see
    /// [`Store::delete_settled_into`] to learn how much).
    pub async fn delete_settled(&self) -> Result<u64, StoreError> {
        let mut deleted = 0;
        self.delete_settled_into(&mut deleted)
            .await
            .map(|()| deleted)
    }

    /// [`Store::delete_settled`], adding each page's deletions to `deleted`
    /// as it commits: a sweep that fails partway still reports the pages it
    /// deleted (the metrics count them, as [`Store::reap_into`]'s takeovers).
    ///
    /// # Errors
    /// The database failed; `deleted` holds what the committed pages deleted.
    pub async fn delete_settled_into(&self, deleted: &mut u64) -> Result<(), StoreError> {
        let retention = self.settings.retention_ms;
        if retention == 0 {
            return Ok(());
        }
        // The page is picked (and, on PostgreSQL, locked) once, in a
        // MATERIALIZED CTE, whatever the plan. Written as `id IN (SELECT …
        // LIMIT $2 FOR UPDATE SKIP LOCKED)`, the planner, misled by stale
        // statistics (a backlog inserted since the last ANALYZE), ran it as
        // a nested loop that picked and locked the page again for every
        // due row: two instances' sweeps of 45,000 rows each stalled on the
        // lock manager until `statement_timeout`, and the reaper with them.
        // The rows are locked until the DELETE commits, and the lock rechecks
        // the state and age on the row's latest version, so a row that
        // changed after it was picked stays (SQLite runs the statement alone).
        let sql = self.sql(
            "WITH doomed AS MATERIALIZED (
                 SELECT id FROM items
                 WHERE state IN ('done', 'failed') AND updated_at <= {now} - $1
                 ORDER BY updated_at LIMIT $2 {skip_locked})
             DELETE FROM items WHERE id IN (SELECT id FROM doomed)",
        );
        for _ in 0..DELETE_PAGES {
            let n = sqlx::query(&sql)
                .bind(ms(retention))
                .bind(i64::from(DELETE_PAGE))
                .execute(&self.pool)
                .await?
                .rows_affected();
            *deleted += n;
            if n < u64::from(DELETE_PAGE) {
                break;
            }
        }
        Ok(())
    }
}
