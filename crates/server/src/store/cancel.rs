//! An operator's cancel (`POST /v1/items/{id}/cancel`): the way to stop one
//! item that has not ended, whatever holds it.

use agentstore_protocol::lease::{ItemState, CANCELLED_REASON};

use super::item::{Ended, ITEM_COLS};
use super::{detached, get, FetchDone, Store, StoreError};

impl Store {
    /// Operator path: fails an `open`, `running`, `paused` or `blocked` item
    /// with `last_error` [`CANCELLED_REASON`], no attempt counted, its epoch
    /// kept (the lease state machine's `LeaseEvent::Cancel`). A holder's
    /// token stays the item's current one, so its next heartbeat, settle or
    /// release is `state_conflict` and the SDK cancels its work (as after a
    /// pause); its claim key is forgotten, so a keyed claim sent again
    /// claims afresh. A paused item's record of the resume that last took
    /// it out of `paused` (`resumed_epoch`) goes: the cancel took it out
    /// this time, so a resume sent afterwards is `409 conflict`, not
    /// answered as a replay of that earlier resume. A `requeue` brings the
    /// item back. Answers the item as the cancel left it ([`Ended::Unreadable`] when its row does not
    /// decode: the cancel was applied), with `false`.
    ///
    /// Idempotent: a cancel of an item that a cancel already failed, with
    /// no claim since (its epoch is still the one it had then), changes
    /// nothing and is answered the item as it is, with `true` (a cancel sent
    /// again after its answer was lost, or two operators at once: one is
    /// counted). The conditional update is the only writer, so a cancel
    /// racing a claim, a settle or the reaper has one winner: whichever
    /// commits first decides the state the other one meets. Runs detached,
    /// as every counted write.
    ///
    /// # Errors
    /// `conflict` naming the state when the item is `done` or was failed
    /// otherwise, `not_found`.
    pub async fn cancel(&self, id: i64) -> Result<(Ended, bool), StoreError> {
        let store = self.clone();
        detached(async move { store.cancel_now(id).await }).await
    }

    /// The body of [`Store::cancel`].
    async fn cancel_now(&self, id: i64) -> Result<(Ended, bool), StoreError> {
        let sql = self.sql(&format!(
            "UPDATE items SET state = 'failed', last_error = $2, claim_key = NULL,
                 cancelled_epoch = epoch, updated_at = {{now}},
                 resumed_epoch = CASE WHEN state = 'paused' THEN NULL ELSE resumed_epoch END
             WHERE id = $1 AND state IN ('open', 'running', 'paused', 'blocked')
             RETURNING {ITEM_COLS}"
        ));
        if let Some(row) = sqlx::query(&sql)
            .bind(id)
            .bind(CANCELLED_REASON)
            .fetch_optional_done(&self.pool)
            .await?
        {
            self.metrics.operator_action("cancel");
            return Ok((
                self.ended(&row, id, Some(ItemState::Failed), "cancel", true),
                false,
            ));
        }
        let left_so = |row: &sqlx::any::AnyRow| {
            get::<Option<String>>(row, "last_error")
                .ok()
                .flatten()
                .as_deref()
                == Some(CANCELLED_REASON)
        };
        self.operator_call_again(id, "cancel", "cancelled_epoch", ItemState::Failed, left_so)
            .await
            .map_err(|e| e.or_not("open, running, paused or blocked"))
    }
}
