//! Rows that do not decode (a payload or result that is not JSON, a counter
//! out of range, an unknown state), met by a call that has just committed a
//! change to them.
//!
//! The rule: a call never answers 500 for a change it committed, and never
//! leaves work committed for an answer it cannot give.
//!
//! - A claim whose claimed row does not decode fails it at once, fenced on
//!   the new token (which nobody received), with reason
//!   [`UNREADABLE_REASON`] as the reaper does, and claims the next item:
//!   its answer is the next readable item or nothing (`204`).
//! - A resume does the same with the paused row it put back to `running`:
//!   fails it, fenced on the new token, and answers [`Resumed::Unreadable`]
//!   (`{id, state: "failed", unreadable_row: true}`, no lease); nothing
//!   holds the item afterwards.
//! - A settle, release or pause (and the same settle or release sent again,
//!   a replay) is answered with what the call decided: [`Ended::Unreadable`],
//!   the item's id and state without its texts. The row keeps the state the
//!   call gave it: a released row reopens and the next claim fails it; a
//!   paused row stays paused and a resume fails it; a settled one stays
//!   settled. A release whose row's lease columns do not decode (an epoch
//!   or counter out of range: no next attempt can be computed) fails the
//!   row instead, with reason [`UNREADABLE_REASON`] and its counters
//!   clamped, fenced on the lease's token and holder; sent again, it is a
//!   replay.
//! - A read (`GET /v1/items/{id}`, [`Store::view_item`]) answers
//!   [`Viewed::Unreadable`](super::Viewed::Unreadable): `{id, state,
//!   unreadable_row: true}`, to whoever may read the item as judged on the
//!   columns that decode (its queue, the worker holding it).
//! - A heartbeat answers no item column but the lease's TTL; a TTL that
//!   does not decode (on SQLite, a text) is answered with this instance's,
//!   alone as in a batch (not counted: the lease itself is renewed).
//! - A call refused because the item is not in the state it needs (a
//!   resume of an item that is not paused, a pause of one not running)
//!   reads only the state to say so, so a retry of one of the calls above
//!   is answered `409 conflict` as for any other item.
//!
//! Each row failed or answered this way is counted in
//! `agentstore_unreadable_rows_total{by}` and logged with the item id.
//!
//! An enqueue decodes the row it has just inserted, which holds the payload
//! text checked as JSON before the write and constants otherwise, so it
//! always decodes; the replay of a keyed enqueue (`Idempotency-Key`) reads
//! the item as it is now and answers `{id, state, unreadable_row: true}`
//! when that row does not decode (a replay: logged, not counted).
//! Enrolment and the credential calls answer only what they generated.

use agentstore_protocol::lease::ItemState;
use sqlx::any::AnyRow;

use super::item::{item_from_row, Ended, Resumed};
use super::{Store, StoreError};

/// `last_error` of an item failed because its row could not be read.
pub const UNREADABLE_REASON: &str = "unreadable_row";

/// Clamps an integer column into `0..=max` (SQL shared by both backends).
fn clamped(col: &str, max: i64) -> String {
    format!("{col} = CASE WHEN {col} < 0 THEN 0 WHEN {col} > {max} THEN {max} ELSE {col} END")
}

/// The `SET` list that fails a row as unreadable (`last_error` bound as
/// `$2`): no lease left, counters clamped into range so the lease columns
/// read again.
pub(super) fn fail_set() -> String {
    format!(
        "state = 'failed', last_error = $2, token_hash = NULL, lease_ttl_ms = NULL, claim_key = NULL,
         worker_id = NULL, heartbeat_at = NULL, updated_at = {{now}}, {}, {}, {}, {}",
        clamped("attempts", i64::from(u32::MAX)),
        clamped("max_redeliveries", i64::from(u32::MAX)),
        clamped("epoch", super::MAX_SAFE_INTEGER),
        // With the epoch: a resume sent again compares the two.
        clamped("resumed_epoch", super::MAX_SAFE_INTEGER),
    )
}

impl Store {
    /// Fails the row that a claim or a resume (`by`) just put under the
    /// lease whose token hash is `hash`, and which does not decode (see the
    /// module docs): fenced on that token, so it changes nothing if the row
    /// left the lease meanwhile (an operator's pause). Counted and logged
    /// with `why`; whether it was failed.
    ///
    /// # Errors
    /// The database failed (the row then stays running under a token
    /// nobody holds, until the reaper takes it over).
    pub(super) async fn fail_unreadable_lease(
        &self,
        id: i64,
        hash: &str,
        why: &StoreError,
        by: &'static str,
    ) -> Result<bool, StoreError> {
        let sql = self.sql(&format!(
            "UPDATE items SET {}
             WHERE id = $1 AND state = 'running' AND token_hash = $3",
            fail_set()
        ));
        let done = sqlx::query(&sql)
            .bind(id)
            .bind(UNREADABLE_REASON)
            .bind(hash)
            .execute(&self.pool)
            .await?;
        let failed = done.rows_affected() == 1;
        if failed {
            self.metrics.unreadable_row(by);
        }
        tracing::warn!(
            item_id = id,
            error = %why,
            failed,
            "{by}: the row it leased cannot be read; it is failed with reason \
             {UNREADABLE_REASON} instead of handed out"
        );
        Ok(failed)
    }

    /// The answer of a resume whose row (item `id`, leased with the token
    /// hash `hash`) does not decode: the row failed (see
    /// [`Store::fail_unreadable_lease`]).
    ///
    /// # Errors
    /// The database failed.
    pub(super) async fn unreadable_resume(
        &self,
        id: i64,
        hash: &str,
        why: &StoreError,
    ) -> Result<Resumed, StoreError> {
        let failed = self.fail_unreadable_lease(id, hash, why, "resume").await?;
        Ok(Resumed::Unreadable {
            id,
            state: failed.then_some(ItemState::Failed),
        })
    }

    /// The answer of an ending call (settle, release or pause, `by`) on item
    /// `id` that left it in `state`: the item from `row`, or, when the row does
    /// not decode, [`Ended::Unreadable`]. `committed`: this call made the
    /// change (counted and logged), not a replay of it.
    pub(super) fn ended(
        &self,
        row: &AnyRow,
        id: i64,
        state: Option<ItemState>,
        by: &'static str,
        committed: bool,
    ) -> Ended {
        match item_from_row(row) {
            Ok(item) => Ended::Item(item),
            Err(e) => {
                if committed {
                    self.metrics.unreadable_row(by);
                }
                tracing::warn!(
                    item_id = id,
                    error = %e,
                    replay = !committed,
                    "{by}: the item's row cannot be read; answered with its id and state"
                );
                Ended::Unreadable { id, state }
            }
        }
    }
}
