//! Work items and their leases: enqueue, list, claim, heartbeat, release,
//! resume and pause (settles are in `settle`, the reaper's takeover in
//! `reap`).
//!
//! Every write that a lease fences is ONE conditional statement: it names the
//! state (and token or epoch) it expects, so a stale caller changes nothing. When
//! it matches no row, the row is read to tell why (`fence`).

use super::FetchDone;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;

use agentstore_protocol::lease::{
    end_attempt, ItemState, Lease, LeaseEvent, LeaseItem, RetryBackoff,
};
use agentstore_protocol::ErrorCode;
use sqlx::any::AnyRow;
use tokio::sync::oneshot;

use super::coalesce::{self, by_call, for_each_call, rerun_call_by_call};
use super::fence::{forbidden, not_found, placeholders, rejection};
use super::item::{
    backoff_from_row, item_from_row, landed_state, lease_item_from_row, qualified_item_cols,
    redelivery_delay, Claimed, Ended, Item, ItemPage, Released, Resumed, Viewed, AVAILABLE_IN,
    AVAILABLE_NOW, ITEM_COLS,
};
use super::{detached, get, lease_ttl_sql, ms, to_u64, Attempt, Backend, Store, StoreError};
use crate::tokens::{self, ct_eq};

/// The first key of an enqueue's queue lock (see `Store::queue_lock`), the
/// bytes "agEQ": PostgreSQL's two-key advisory locks are a key space apart
/// from the one-key lock the migrator takes (`PG_MIGRATION_LOCK`), and this
/// class keeps them apart from another application's two-key locks keyed
/// by small numbers.
const ENQUEUE_LOCK_CLASS: i32 = 0x6167_4551;

/// Fixed bytes counted per item against a page's budget (its id, state,
/// counters and field names in the answer), besides its texts.
const ITEM_OVERHEAD_BYTES: u64 = 256;

/// What `item` counts against a listing page's budget as answered: its JSON
/// texts (payload and result are stored as answered), its queue name, its
/// error as serde_json escapes it (a quote, a backslash, backspace, form
/// feed, newline, carriage return and tab 2 bytes each, any other control
/// character 6, as `\u00XX`; the rest as stored), and
/// [`ITEM_OVERHEAD_BYTES`].
fn answered_bytes(item: &Item) -> u64 {
    let escaped = item.last_error.as_deref().map_or(0, |e| {
        e.bytes()
            .map(|b| match b {
                b'"' | b'\\' | 0x08 | 0x0c | b'\n' | b'\r' | b'\t' => 2,
                0..=0x1f => 6,
                _ => 1,
            })
            .sum::<u64>()
    });
    let texts = item.payload.get().len()
        + item.queue.len()
        + item.result.as_ref().map_or(0, |r| r.get().len());
    texts as u64 + escaped + ITEM_OVERHEAD_BYTES
}

/// How many times a keyed claim whose key another copy of it holds looks
/// for that copy's lease (see [`Store::claim_once`]). Each look that finds
/// none means the lease ended between the claim statement and the look.
const KEY_TAKEN_TRIES: usize = 8;

/// How long the highest `Request-Attempt` number seen for a claim key and
/// sender is remembered after it was written (see [`Store::claim_attempt`]):
/// an older copy held up in the network for longer than this, arriving
/// after its lease ended, is not recognised and claims afresh. An hour: far beyond any proxy's or
/// browser's timeout for a request in flight.
pub const CLAIM_KEY_MEMORY_MS: u64 = 3_600_000;

/// A claim's answer: the item, and whether it is a replay (the lease another
/// copy of the claim took).
type ClaimAnswer = Result<Option<(Item, bool)>, StoreError>;

/// What a release reads first (see [`Store::read_lease`]).
struct LeaseRead {
    item: LeaseItem,
    token_hash: Option<String>,
    holder: Option<i64>,
    /// The token hash of the lease that last released the item, and its holder.
    released_hash: Option<String>,
    released_by: Option<i64>,
    /// The token hash of the lease that last settled the item, and its holder.
    settled_hash: Option<String>,
    settled_by: Option<i64>,
    now_ms: i64,
    ttl_ms: u64,
    /// The item's redelivery backoff, if any.
    backoff: Option<RetryBackoff>,
}

/// A claim's outcome in a coalesced claim statement.
enum ClaimSlot {
    /// Its answer: an item, none, or an error.
    Answer(Result<Option<Item>, StoreError>),
    /// It claims again, alone: its row did not decode and was failed (see
    /// `unreadable`), or it is a keyed claim that got no item and a copy
    /// may hold its item (see `Store::settle_empty_keyed`).
    Again,
    /// A keyed claim that got no item, before `Store::settle_empty_keyed`
    /// decides it.
    Empty,
}

/// A claim waiting in its queue's lane (PostgreSQL; see `coalesce`).
pub(super) struct ClaimJob {
    worker_id: Option<i64>,
    token_hash: String,
    /// The claim's idempotency key, stored on the item it gets.
    key: Option<String>,
    /// The copy's `Request-Attempt`, stored with the key.
    attempt: Option<Attempt>,
    reply: oneshot::Sender<ClaimAnswer>,
}

/// Splits a lane's batch into the claims to run together and the copies of
/// one of them (the same key and caller, later in the batch), in order.
fn split_copies(batch: Vec<ClaimJob>) -> (Vec<ClaimJob>, Vec<ClaimJob>) {
    let mut seen = HashSet::new();
    batch.into_iter().partition(|job| match &job.key {
        Some(key) => seen.insert((key.clone(), job.worker_id)),
        None => true,
    })
}

impl Store {
    /// Adds an item to `queue` in state `open`. `payload` is stored as its
    /// JSON text: a [`RawValue`](serde_json::value::RawValue) (what the HTTP path passes) exactly as
    /// written, a `Value` as compact JSON.
    ///
    /// # Errors
    /// `validation` if `payload` does not serialise to JSON; the database failed.
    pub async fn enqueue<P: serde::Serialize + ?Sized>(
        &self,
        queue: &str,
        payload: &P,
        max_redeliveries: Option<u32>,
    ) -> Result<Item, StoreError> {
        self.enqueue_once(queue, payload, max_redeliveries, None, None)
            .await
            .and_then(|(ended, _)| ended.into_item())
    }

    /// [`Store::enqueue`] under a producer's idempotency key (the
    /// `Idempotency-Key` header, as Stripe and the IETF httpapi draft
    /// "The Idempotency-Key HTTP Header Field" use it): the first request
    /// with `key` in `queue` by `producer` adds the item; the same request
    /// sent again by that producer (same payload text and
    /// `max_redeliveries`: its answer was lost) adds nothing and answers
    /// that item as it is now, with `true` (replayed).
    ///
    /// A key is its producer's own, as Stripe scopes keys per API key:
    /// `producer` is the enqueuing caller's id (`Some(workers.id)`, which
    /// the credentials a refresh issues keep; `None` for the admin token,
    /// stored as 0), and another producer's use of the same key in the same
    /// queue is a request of its own (its own item, its own replays), never
    /// the first one's replay or a `conflict`. A key stored before keys
    /// were scoped (migration 20, `idempotency_scope` NULL) still answers
    /// every producer of its queue, as it did then, so a retry across the
    /// upgrade finds its item. The unique `(queue, idempotency_scope,
    /// idempotency_key)` index decides, so concurrent requests with one
    /// key add one item on either backend. Keys are kept
    /// as long as their item (the retention sweep deletes settled items with
    /// their keys, `--retention-ms`; the key then adds a new item). A replay
    /// whose item's row no longer decodes is answered [`Ended::Unreadable`]
    /// (logged), never an error: the enqueue it repeats was applied.
    ///
    /// # Errors
    /// `conflict` when `key` was used in `queue` by `producer` (or before
    /// keys were scoped, by anyone) for another request (another payload
    /// text or `max_redeliveries`); as [`Store::enqueue`]; `Corrupt` (500)
    /// when the key's item was deleted again and again (by the retention
    /// sweep) while this enqueue tried to add or read it.
    pub async fn enqueue_once<P: serde::Serialize + ?Sized>(
        &self,
        queue: &str,
        payload: &P,
        max_redeliveries: Option<u32>,
        producer: Option<i64>,
        key: Option<&str>,
    ) -> Result<(Ended, bool), StoreError> {
        self.enqueue_with(queue, payload, max_redeliveries, None, producer, key)
            .await
    }

    /// [`Store::enqueue_once`] of an item with a redelivery backoff
    /// (`backoff`; `None`: reopened at once, as [`Store::enqueue_once`]).
    /// The backoff is part of what a keyed enqueue sent again must repeat
    /// (another one is `conflict`).
    ///
    /// # Errors
    /// As [`Store::enqueue_once`]; `validation` for a backoff
    /// [`RetryBackoff::check`] refuses.
    pub async fn enqueue_with<P: serde::Serialize + ?Sized>(
        &self,
        queue: &str,
        payload: &P,
        max_redeliveries: Option<u32>,
        backoff: Option<RetryBackoff>,
        producer: Option<i64>,
        key: Option<&str>,
    ) -> Result<(Ended, bool), StoreError> {
        let backoff = backoff
            .map(RetryBackoff::check)
            .transpose()
            .map_err(|e| StoreError::rejected(ErrorCode::Validation, e.to_string()))?;
        let payload = serde_json::to_string(payload)
            .map_err(|e| StoreError::rejected(ErrorCode::Validation, format!("payload: {e}")))?;
        let (store, queue, key) = (self.clone(), queue.to_owned(), key.map(str::to_owned));
        // In a task of its own: an enqueue whose client goes away while its
        // statement waits still commits, and is counted once it has.
        // On PostgreSQL its queue's gate first, before a connection (see
        // `lone`: enqueues waiting for the queue's lock took the pool).
        detached(async move {
            let call = store.enqueue_text(
                &queue,
                payload,
                max_redeliveries,
                backoff,
                producer,
                key.as_deref(),
            );
            match &store.lone {
                Some(lone) => lone.enqueue(&queue, call).await,
                None => call.await,
            }
        })
        .await
    }

    /// [`Store::enqueue_once`] of a payload serialised to `payload`.
    ///
    /// Within a queue, items become visible in id order ([`Store::list`]
    /// relies on it): on PostgreSQL the `INSERT` takes the queue's enqueue
    /// lock before its id is drawn and holds it until it commits
    /// ([`Store::queue_lock`]), so enqueues into one queue are serialised on
    /// their insert and commit (other queues' run in parallel); on SQLite
    /// its one writer does the same. These two `INSERT`s are the only
    /// statements that add item rows, and nothing changes an item's id or
    /// queue.
    async fn enqueue_text(
        &self,
        queue: &str,
        payload: String,
        max_redeliveries: Option<u32>,
        backoff: Option<RetryBackoff>,
        producer: Option<i64>,
        key: Option<&str>,
    ) -> Result<(Ended, bool), StoreError> {
        let max = max_redeliveries.unwrap_or(self.settings.max_redeliveries);
        let (backoff_base, backoff_max) = (backoff.map(|b| ms(b.base)), backoff.map(|b| ms(b.max)));
        let Some(key) = key else {
            let sql = self.sql(&format!(
                "{lock}INSERT INTO items (queue, state, payload, attempts, max_redeliveries, epoch, created_at, updated_at,
                     retry_backoff_base_ms, retry_backoff_max_ms)
                 SELECT $1, 'open', $2, 0, $3, 0, {{now}}, {{now}}, CAST($4 AS BIGINT), CAST($5 AS BIGINT){from}
                 WHERE {room}
                 RETURNING {ITEM_COLS}",
                lock = self.queue_lock(),
                from = self.queue_lock_from(),
                room = self.id_room(),
            ));
            let row = sqlx::query(&sql)
                .bind(queue)
                .bind(&payload)
                .bind(i64::from(max))
                .bind(backoff_base)
                .bind(backoff_max)
                .fetch_optional_done(&self.pool)
                .await?
                .ok_or_else(ids_exhausted)?;
            self.undo_past_safe_id(&row).await?;
            self.metrics.enqueued(queue);
            // The payload was checked as JSON, the rest are constants: it decodes.
            return Ok((Ended::Item(item_from_row(&row)?), false));
        };
        let scope = producer.unwrap_or(0);
        // What the request asked for: the payload text and the cap as given
        // (an absent cap is not the server's default, which may change),
        // and the backoff when one is given (a request without one hashes
        // as before backoffs existed, so its keys stored then still replay).
        let request_hash = {
            let mut cap = max_redeliveries.map_or(String::from("-"), |m| m.to_string());
            if let Some(b) = backoff {
                cap = format!("{cap};backoff={},{}", b.base, b.max);
            }
            tokens::hash(&[cap.as_str(), ":", payload.as_str()].concat())
        };
        // A plain INSERT: the unique partial index on `(queue,
        // idempotency_scope, idempotency_key)` refuses a second row for a
        // producer's key (on PostgreSQL a racing copy waits for the first to
        // commit, on the queue's enqueue lock, then fails), and that refusal
        // is the replay. It adds
        // nothing either (no row back) when the key was stored unscoped,
        // before keys were scoped: that item is the key's in this queue.
        // (`ON CONFLICT … DO NOTHING` names the index when the statement is
        // prepared: a pooled SQLite connection that had read the schema
        // before the index existed refused to prepare it.)
        let sql = self.sql(&format!(
            "{lock}INSERT INTO items (queue, state, payload, attempts, max_redeliveries, epoch, created_at, updated_at,
                 idempotency_key, request_hash, idempotency_scope, retry_backoff_base_ms, retry_backoff_max_ms)
             SELECT $1, 'open', $2, 0, $3, 0, {{now}}, {{now}}, $4, $5, $6,
                 CAST($7 AS BIGINT), CAST($8 AS BIGINT){from}
             WHERE NOT EXISTS (SELECT 1 FROM items
                 WHERE queue = $1 AND idempotency_key = $4 AND idempotency_scope IS NULL)
               AND {room}
             RETURNING {ITEM_COLS}",
            lock = self.queue_lock(),
            from = self.queue_lock_from(),
            room = self.id_room(),
        ));
        // Only a key can conflict: the item that key added before. That item
        // can be deleted between the INSERT's refusal and this read (the
        // reaper's retention deletes settled items with their keys): the key
        // is free again, and the INSERT is sent again (a few times: each
        // round needs another item with this key added and deleted). An
        // unscoped item of the key comes first: while it is there, the
        // INSERT adds nothing for anyone.
        // Two branches, each matched by its own partial index: with one `OR`
        // SQLite used neither and read every item of the queue (a replay's
        // cost grew with the queue: ~0.3 s at 1,000,000 items).
        let select = format!(
            "SELECT * FROM (
                 SELECT {ITEM_COLS}, request_hash, 0 AS scoped FROM items
                 WHERE queue = $1 AND idempotency_key = $2 AND idempotency_scope IS NULL
                 UNION ALL
                 SELECT {ITEM_COLS}, request_hash, 1 AS scoped FROM items
                 WHERE queue = $1 AND idempotency_key = $2 AND idempotency_scope = $3
             ) AS keyed ORDER BY scoped LIMIT 1"
        );
        let mut rounds = 0;
        let row = loop {
            let inserted = sqlx::query(&sql)
                .bind(queue)
                .bind(&payload)
                .bind(i64::from(max))
                .bind(key)
                .bind(&request_hash)
                .bind(scope)
                .bind(backoff_base)
                .bind(backoff_max)
                .fetch_optional_done(&self.pool)
                .await;
            match inserted {
                // The row just inserted: the payload was checked as JSON, the
                // rest are constants, so it decodes.
                Ok(Some(row)) => {
                    self.undo_past_safe_id(&row).await?;
                    self.metrics.enqueued(queue);
                    return Ok((Ended::Item(item_from_row(&row)?), false));
                }
                Ok(None) => {}
                Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {}
                Err(e) => return Err(e.into()),
            }
            let found = sqlx::query(&select)
                .bind(queue)
                .bind(key)
                .bind(scope)
                .fetch_optional_done(&self.pool)
                .await?;
            match found {
                Some(row) => {
                    // A copy's item added past the bound and not yet deleted
                    // again (or left by a delete that failed): no replay.
                    self.undo_past_safe_id(&row).await?;
                    break row;
                }
                // Added nothing, and no item holds the key: no id is left.
                None if !self.has_id_room().await? => return Err(ids_exhausted()),
                None if rounds < 3 => rounds += 1,
                None => {
                    return Err(StoreError::Corrupt(format!(
                        "the item of an Idempotency-Key in queue {queue:?} was deleted {} times while this enqueue ran", rounds + 1
                    )))
                }
            }
        };
        let stored: Option<String> = get(&row, "request_hash").ok().flatten();
        if stored.as_deref() != Some(request_hash.as_str()) {
            return Err(StoreError::rejected(
                ErrorCode::Conflict,
                "this Idempotency-Key was used for another request in this queue (another payload, max_redeliveries or retry_backoff_ms)",
            ));
        }
        let id: i64 = get(&row, "id")?;
        let state = get::<String>(&row, "state")
            .ok()
            .and_then(|s| ItemState::parse(&s));
        Ok((self.ended(&row, id, state, "enqueue", false), true))
    }

    /// On PostgreSQL, the head of an enqueue's `INSERT`: a CTE taking the
    /// queue's enqueue lock (`pg_advisory_xact_lock(`[`ENQUEUE_LOCK_CLASS`]`,
    /// hashtext(queue))`, `queue` being `$1`), which the `INSERT` reads
    /// ([`Store::queue_lock_from`]) so the lock is held before the row's id
    /// is drawn from the identity sequence, and until the `INSERT` commits
    /// (it runs alone, outside any transaction). Enqueues into one queue then
    /// commit in id order, so a listing that shows an id has shown, or will
    /// show, every lower id of that queue: without it, an id was drawn when
    /// the `INSERT` ran and a lower one could commit after a higher one had
    /// been listed, and a tail reading `after = <last id seen>` skipped it
    /// for good. Queues hashing apart enqueue in parallel; two that collide
    /// only share a lock. Within this instance an enqueue takes its queue's
    /// gate in memory before its connection (`lone::LoneWaits::enqueue`),
    /// so enqueues waiting for this lock never take the pool from other
    /// calls. Waiting for it is bounded by `lock_timeout`
    /// ([`super::PG_LOCK_TIMEOUT_MS`], a 503 that added nothing). `""` on
    /// SQLite, whose one writer commits every `INSERT` in id order already.
    fn queue_lock(&self) -> String {
        match self.backend {
            Backend::Sqlite => String::new(),
            Backend::Postgres => format!(
                "WITH enqueue_lock AS (SELECT pg_advisory_xact_lock({ENQUEUE_LOCK_CLASS}, hashtext($1)))\n"
            ),
        }
    }

    /// The `FROM` of an enqueue's `SELECT` that makes it wait for
    /// [`Store::queue_lock`]'s lock before its row (and its id) is made;
    /// `""` on SQLite.
    fn queue_lock_from(&self) -> &'static str {
        match self.backend {
            Backend::Sqlite => "",
            Backend::Postgres => " FROM enqueue_lock",
        }
    }

    /// An SQL condition true while the next item id is at most
    /// [`super::MAX_SAFE_INTEGER`]. On SQLite: the highest id handed out so
    /// far (the `AUTOINCREMENT` counter) is below it. On PostgreSQL `TRUE`:
    /// reading the identity sequence needs a grant on it that inserting
    /// does not, so an item added past the bound is deleted again instead
    /// ([`Store::undo_past_safe_id`]).
    fn id_room(&self) -> &'static str {
        const _: () = assert!(super::MAX_SAFE_INTEGER == 9_007_199_254_740_991);
        match self.backend {
            Backend::Sqlite => {
                "COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'items'), 0) < 9007199254740991"
            }
            Backend::Postgres => "TRUE",
        }
    }

    /// Deletes the item an enqueue just added when its id is past
    /// [`super::MAX_SAFE_INTEGER`], and refuses the enqueue (nothing left
    /// added; a claim that met the row meanwhile failed it as unreadable).
    ///
    /// # Errors
    /// [`ids_exhausted`] then; the database failed.
    async fn undo_past_safe_id(&self, row: &AnyRow) -> Result<(), StoreError> {
        let id: i64 = get(row, "id")?;
        if id <= super::MAX_SAFE_INTEGER {
            return Ok(());
        }
        sqlx::query("DELETE FROM items WHERE id = $1")
            .bind(id)
            .execute(&self.pool)
            .await?;
        Err(ids_exhausted())
    }

    /// Whether [`Store::id_room`] holds now.
    async fn has_id_room(&self) -> Result<bool, StoreError> {
        let sql = format!(
            "SELECT CAST(CASE WHEN {} THEN 1 ELSE 0 END AS BIGINT)",
            self.id_room()
        );
        #[expect(
            clippy::disallowed_methods,
            reason = "a read: no write is committed when it stops early"
        )]
        let (room,): (i64,) = sqlx::query_as(&sql).fetch_one(&self.pool).await?;
        Ok(room == 1)
    }

    /// Claims the oldest open item of `queue` with a fresh token, `epoch + 1` and
    /// the lease starting now on the database clock; `None` when nothing is open.
    ///
    /// One statement: on PostgreSQL the candidate is locked with `FOR UPDATE SKIP
    /// LOCKED`, so concurrent claimers on any instance never get the same item; on
    /// SQLite the statement runs under the single writer lock.
    ///
    /// A claimed row that does not decode (a payload that is not JSON, a
    /// counter out of range) is failed at once with reason
    /// [`UNREADABLE_REASON`](super::UNREADABLE_REASON), fenced on the new
    /// token, and the next item is claimed: the answer is a readable item or
    /// `None`, never an error for work left committed (see `unreadable`).
    ///
    /// # Errors
    /// The database failed.
    pub async fn claim(
        &self,
        queue: &str,
        worker_id: Option<i64>,
    ) -> Result<Option<Claimed>, StoreError> {
        Ok(self
            .claim_once(queue, worker_id, None)
            .await?
            .map(|(c, _)| c))
    }

    /// [`Store::claim`] under the claimer's idempotency key (the
    /// `Idempotency-Key` header of the claim; each claim sends a new one,
    /// and sends it again only when its answer was lost). When a lease
    /// claimed with `key` in `queue` by the same worker (`worker_id`; `None`
    /// is the admin token) is still running, that lease is answered again,
    /// with `true` (replayed): a new token (the server keeps only token
    /// hashes, so the first one cannot be sent again; it no longer fences
    /// anything) under the next epoch, the lease renewed from now. Without this,
    /// a claim whose answer was lost left its item running under a token
    /// nobody held until the TTL ran out, an attempt spent. A lease that
    /// ended meanwhile is not handed back (a new item is claimed, as for an
    /// unknown key): its TTL ran out or another holder took it. Like a
    /// heartbeat, the replay renews a lease past its TTL that no takeover
    /// has ended yet.
    ///
    /// Copies of one claim that race (a retry sent while the first copy is
    /// still being answered, on this instance or another) take ONE item
    /// between them: a unique index allows one running lease per key, queue
    /// and caller, so the claim statement of every copy but one fails on it
    /// and that copy answers the replay instead (each copy rotating the
    /// token, as a replay sent later does: the last one answered holds the
    /// lease). Another caller's claim with the same key is not affected by
    /// it: it claims afresh.
    ///
    /// # Errors
    /// As [`Store::claim`].
    pub async fn claim_once(
        &self,
        queue: &str,
        worker_id: Option<i64>,
        key: Option<&str>,
    ) -> Result<Option<(Claimed, bool)>, StoreError> {
        self.claim_attempt(queue, worker_id, key, None).await
    }

    /// [`Store::claim_once`] for one copy of a keyed claim that numbers its
    /// copies: `attempt` is the request's `Request-Attempt` (see
    /// [`Attempt`]): a later copy of a key by the same sender carries a
    /// higher number. The running lease of `key` is not answered again to
    /// a copy that arrives after a later copy by its sender was answered
    /// (held up in the network while its client gave up on it and sent the
    /// key again): it changes nothing and is refused, so it cannot rotate
    /// the token the copy its client is waiting for handed out. Any other
    /// copy replays as in [`Store::claim_once`]: the same number again is
    /// the same request resent (a browser resends a POST once on a reset
    /// keep-alive socket, and the page gets that answer), and copies
    /// without the header or of another sender are not ordered.
    ///
    /// The lease's end does not make such a copy a new claim: the highest
    /// number seen per queue, caller, key AND sender is remembered (table
    /// `claim_keys`) for [`CLAIM_KEY_MEMORY_MS`], and a copy older than it
    /// is refused too, after the lease ended (settled, released, reaped,
    /// paused), instead of claiming another item under a token nobody
    /// receives (which then ran for the TTL and spent an attempt). Each
    /// keyed copy with a `Request-Attempt` runs three steps, in one detached
    /// task (a client that goes away cannot cut them short):
    ///
    /// 1. READ before claiming: a number above `n` stored for the sender
    ///    makes the copy late: refused (`409`) having claimed nothing. (A
    ///    read: an empty poll writes nothing.)
    /// 2. CLAIM as [`Store::claim_once`]: replay the running lease under the
    ///    key (refused when that lease's copy is later), or claim afresh.
    /// 3. WRITE once the claim (fresh or replay) committed: one conditional
    ///    upsert raises the sender's row to `n` unless a higher number is
    ///    stored. When one is (a later copy wrote in between), this copy's
    ///    claim is undone, fenced on its own token and `running` (the item
    ///    open again, no attempt counted, the epoch spent) and refused.
    ///
    /// Why two copies `a` < `b` of one sender, on any instances, leave at
    /// most one lease standing, `b`'s (or `a`'s, replayed by `b`): the
    /// unique index `items_claim_key_once` keeps one running lease per key,
    /// so while one runs the other copy replays it or is refused in step 2
    /// (a fresh claim racing it fails on the index and runs again alone).
    /// The row only grows and its writes are serialised (the row lock on
    /// PostgreSQL, one writer on SQLite). If `b` took an item and wrote
    /// before `a`'s step 1, `a` is refused there. Otherwise, if `a`'s lease
    /// was still running at `b`'s step 2, `b` replayed it (`a`'s token is
    /// fenced out; `a`'s step 3 then undoes nothing, or, before `b`'s write,
    /// lets `a` answer a lease its client gave up on, which `b` holds now).
    /// If it had ended by then, `b` claims afresh as a new claim would, and
    /// `a`'s answer carries an ended lease's token. If `b` took an item first
    /// and `a` claimed afresh after `b`'s lease ended, `b`'s client can only
    /// have ended it after `b`'s answer, so after `b` wrote: `a`'s step 3
    /// finds `b`'s number and undoes `a`'s claim. Not covered: the reaper
    /// or an operator ending `b`'s lease in the milliseconds between `b`'s
    /// claim and its write, while `a` reads, claims afresh and writes first
    /// (then `a`'s claim stands under a token nobody holds until its TTL).
    ///
    /// A refused copy counts in `agentstore_claim_late_copies_total`; one
    /// undone in step 3 also counted in `agentstore_claims_total` when its
    /// claim committed.
    ///
    /// # Errors
    /// As [`Store::claim`]; `conflict` for a copy older than one seen (no
    /// lease held; an undone claim spent the item's epoch).
    pub async fn claim_attempt(
        &self,
        queue: &str,
        worker_id: Option<i64>,
        key: Option<&str>,
        attempt: Option<&Attempt>,
    ) -> Result<Option<(Claimed, bool)>, StoreError> {
        let (store, queue, key, attempt) = (
            self.clone(),
            queue.to_owned(),
            key.map(str::to_owned),
            attempt.cloned(),
        );
        // One task: a client that goes away between the claim and the
        // write must not leave a late copy's claim standing.
        detached(async move {
            let (token, token_hash) = tokens::new_lease_token();
            let ordered = key.as_deref().zip(attempt.as_ref());
            if let Some((key, a)) = ordered {
                let stored = store.stored_attempt(&queue, worker_id, key, a).await?;
                if let Some(stored) = stored.filter(|&n| n > a.n) {
                    store.metrics.claim_late_copy();
                    return Err(superseded(a.n, stored));
                }
            }
            let claimed = store
                .claim_hashed(
                    &queue,
                    worker_id,
                    key.as_deref(),
                    attempt.clone(),
                    &token_hash,
                )
                .await?;
            if let (Some((item, _)), Some((key, a))) = (&claimed, ordered) {
                if let Some(seen) = store
                    .newer_attempt(&queue, worker_id, key, a, item.id, &token_hash)
                    .await?
                {
                    store.metrics.claim_late_copy();
                    return Err(superseded(a.n, seen));
                }
            }
            Ok(claimed.map(|(item, r)| (store.claim_response(item, token.0), r)))
        })
        .await
    }

    /// Step 2 of [`Store::claim_attempt`] (the claim or replay) under the
    /// token hash `token_hash`.
    async fn claim_hashed(
        &self,
        queue: &str,
        worker_id: Option<i64>,
        key: Option<&str>,
        attempt: Option<Attempt>,
        token_hash: &str,
    ) -> Result<Option<(Item, bool)>, StoreError> {
        let token_hash = token_hash.to_owned();
        if let Some(key) = key {
            let (store, q, k, h, a) = (
                self.clone(),
                queue.to_owned(),
                key.to_owned(),
                token_hash.clone(),
                attempt.clone(),
            );
            let again =
                detached(async move { store.claim_again(&q, &k, a.as_ref(), &h, worker_id).await });
            if let Some(item) = again.await? {
                return Ok(Some((item, true)));
            }
        }
        let key = key.map(str::to_owned);
        if self.backend == Backend::Postgres {
            let (reply, answer) = oneshot::channel();
            let job = ClaimJob {
                worker_id,
                token_hash,
                key,
                attempt,
                reply,
            };
            if self.claims.push(&queue.to_owned(), job) {
                let store = self.clone();
                let queue = queue.to_owned();
                tokio::spawn(async move { store.run_claims(queue).await });
            }
            return answer
                .await
                .unwrap_or(Err(StoreError::Database(sqlx::Error::WorkerCrashed)));
        }
        let (store, queue) = (self.clone(), queue.to_owned());
        detached(async move {
            store
                .claim_one(
                    &queue,
                    &token_hash,
                    worker_id,
                    key.as_deref(),
                    attempt.as_ref(),
                )
                .await
        })
        .await
    }

    /// Step 1 of [`Store::claim_attempt`]: the number stored for `key` (in
    /// `queue`, by `worker_id`) and the sender of `attempt`, if any (a read:
    /// an empty poll writes nothing).
    async fn stored_attempt(
        &self,
        queue: &str,
        worker_id: Option<i64>,
        key: &str,
        attempt: &Attempt,
    ) -> Result<Option<i64>, StoreError> {
        let row = sqlx::query(
            "SELECT attempt FROM claim_keys
             WHERE queue = $1 AND caller = $2 AND claim_key = $3 AND sender = $4",
        )
        .bind(queue)
        .bind(worker_id.unwrap_or(0))
        .bind(key)
        .bind(attempt.sender.as_str())
        .fetch_optional_done(&self.pool)
        .await?;
        row.map(|r| get::<i64>(&r, "attempt")).transpose()
    }

    /// Step 3 of [`Store::claim_attempt`] (see [`Store::newer_attempt`]):
    /// raises the number stored for
    /// `key` (in `queue`, by `worker_id`) and the sender of `attempt` to its
    /// number unless a higher one is stored, in one upsert (copies racing
    /// wait on the row's lock, each compares with the one committed before
    /// it), and answers the number stored after it: higher than
    /// `attempt`'s when the copy is late (nothing written).
    async fn see_attempt(
        &self,
        queue: &str,
        worker_id: Option<i64>,
        key: &str,
        attempt: &Attempt,
    ) -> Result<i64, StoreError> {
        let sql = self.sql(
            "INSERT INTO claim_keys (queue, caller, claim_key, sender, attempt, answered_at)
             VALUES ($1, $2, $3, $4, $5, {now})
             ON CONFLICT (queue, caller, claim_key, sender) DO UPDATE
                 SET attempt = CASE WHEN claim_keys.attempt <= excluded.attempt
                                    THEN excluded.attempt ELSE claim_keys.attempt END,
                     answered_at = CASE WHEN claim_keys.attempt <= excluded.attempt
                                        THEN excluded.answered_at ELSE claim_keys.answered_at END
             RETURNING attempt",
        );
        let row = sqlx::query(&sql)
            .bind(queue)
            .bind(worker_id.unwrap_or(0))
            .bind(key)
            .bind(attempt.sender.as_str())
            .bind(attempt.n)
            .fetch_optional_done(&self.pool)
            .await?
            .ok_or(sqlx::Error::RowNotFound)?;
        get(&row, "attempt")
    }

    /// Step 3 of [`Store::claim_attempt`]: after this copy's claim of item
    /// `id` under `token_hash` committed, writes its number for its key and
    /// sender ([`Store::see_attempt`]); when a later copy's higher number is
    /// stored, undoes the claim (see [`Store::unclaim`]) and answers that
    /// number. The undo runs before anything else that can fail; a write or
    /// an undo that fails is tried once more, and a write that fails twice
    /// undoes the claim too (its answer would be a 5xx: nobody would hold
    /// the token).
    async fn newer_attempt(
        &self,
        queue: &str,
        worker_id: Option<i64>,
        key: &str,
        attempt: &Attempt,
        id: i64,
        token_hash: &str,
    ) -> Result<Option<i64>, StoreError> {
        let write = || self.see_attempt(queue, worker_id, key, attempt);
        let stored = match write().await {
            Ok(s) => s,
            Err(_) => match write().await {
                Ok(s) => s,
                Err(e) => {
                    self.unclaim_retried(id, token_hash).await?;
                    return Err(e);
                }
            },
        };
        match Some(stored).filter(|&n| n > attempt.n) {
            Some(n) => {
                self.unclaim_retried(id, token_hash).await?;
                Ok(Some(n))
            }
            None => Ok(None),
        }
    }

    /// [`Store::unclaim`], tried once more when the database fails.
    async fn unclaim_retried(&self, id: i64, token_hash: &str) -> Result<(), StoreError> {
        match self.unclaim(id, token_hash).await {
            Ok(()) => Ok(()),
            Err(_) => self.unclaim(id, token_hash).await,
        }
    }

    /// Undoes a claim that turned out to be a late copy (see
    /// [`Store::claim_attempt`]): its item open again, no attempt counted
    /// (nobody received its token), fenced on that token and `running`; the
    /// epoch stays spent.
    async fn unclaim(&self, id: i64, token_hash: &str) -> Result<(), StoreError> {
        let sql = self.sql(
            "UPDATE items SET state = 'open', token_hash = NULL, lease_ttl_ms = NULL,
                 claim_key = NULL, claim_attempt = NULL, claim_sender = NULL,
                 worker_id = NULL, heartbeat_at = NULL, updated_at = {now}
             WHERE id = $1 AND state = 'running' AND token_hash = $2",
        );
        sqlx::query(&sql)
            .bind(id)
            .bind(token_hash)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Deletes the remembered claim attempts (see [`Store::claim_attempt`])
    /// older than [`CLAIM_KEY_MEMORY_MS`], in pages as
    /// [`Store::delete_settled`] (skipping rows another instance's purge
    /// holds on PostgreSQL), at most [`super::reap::DELETE_MAX`] a run;
    /// returns how many went.
    ///
    /// # Errors
    /// The database failed.
    pub async fn forget_claim_keys(&self) -> Result<u64, StoreError> {
        // Its page picked once, as `delete_settled`'s (see there why).
        let sql = self.sql(
            "WITH doomed AS MATERIALIZED (
                 SELECT queue, caller, claim_key, sender FROM claim_keys
                 WHERE answered_at <= {now} - $1
                 ORDER BY answered_at LIMIT $2 {skip_locked})
             DELETE FROM claim_keys
             WHERE (queue, caller, claim_key, sender) IN (
                 SELECT queue, caller, claim_key, sender FROM doomed)",
        );
        let mut deleted = 0;
        for _ in 0..super::reap::DELETE_PAGES {
            let n = sqlx::query(&sql)
                .bind(ms(CLAIM_KEY_MEMORY_MS))
                .bind(i64::from(super::reap::DELETE_PAGE))
                .execute(&self.pool)
                .await?
                .rows_affected();
            deleted += n;
            if n < u64::from(super::reap::DELETE_PAGE) {
                break;
            }
        }
        Ok(deleted)
    }

    /// The replay of [`Store::claim_attempt`]: the running lease claimed
    /// with `key` in `queue` by `worker_id`, its token hash rotated to
    /// `token_hash` under the next epoch (each token answered is a fencing
    /// token of its own: a service that fences on `X-Lease-Epoch` alone
    /// tells two answered copies of one claim apart), `attempt` stored with
    /// it and its lease renewed
    /// (with this instance's TTL, the one answered), in one conditional
    /// statement after a read; `None` when there is none. A row that no
    /// longer decodes is failed, fenced on the new token (see
    /// `unreadable`), and `None` answered: a new item is claimed instead.
    ///
    /// # Errors
    /// `conflict` when a later copy by the sender of `attempt` was answered
    /// (nothing written); the database failed.
    async fn claim_again(
        &self,
        queue: &str,
        key: &str,
        attempt: Option<&Attempt>,
        token_hash: &str,
        worker_id: Option<i64>,
    ) -> Result<Option<Item>, StoreError> {
        let sql = self.sql(&format!(
            "UPDATE items SET token_hash = $3, epoch = epoch + 1, heartbeat_at = {{now}}, updated_at = {{now}},
                 lease_ttl_ms = {ttl}, claim_attempt = COALESCE(CAST($5 AS BIGINT), claim_attempt),
                 claim_sender = COALESCE(CAST($6 AS TEXT), claim_sender)
             WHERE id = $1 AND state = 'running' AND claim_key = $2 AND COALESCE(worker_id, 0) = $4
               AND (CAST($6 AS TEXT) IS NULL OR claim_sender IS NULL
                    OR claim_sender <> CAST($6 AS TEXT) OR claim_attempt <= CAST($5 AS BIGINT))
             RETURNING {ITEM_COLS}",
            ttl = ms(self.settings.ttl_ms),
        ));
        // A later copy by this sender may rotate the token between the read
        // and the write: read again (bounded; each round is another copy
        // answered).
        let mut row = None;
        for _ in 0..KEY_TAKEN_TRIES {
            // A read first: nearly every key is a first try, which matches
            // nothing and must not take SQLite's writer lock or a PostgreSQL
            // statement outside the claim lane for that.
            // (A copy older than one remembered after the lease ended was
            // refused before: `Store::stored_attempt`.)
            let found = sqlx::query(
                "SELECT id, claim_attempt, claim_sender FROM items
                 WHERE queue = $1 AND claim_key = $2 AND state = 'running'
                   AND COALESCE(worker_id, 0) = $3
                 ORDER BY id LIMIT 1",
            )
            .bind(queue)
            .bind(key)
            .bind(worker_id.unwrap_or(0))
            .fetch_optional_done(&self.pool)
            .await?;
            let Some(found) = found else {
                return Ok(None);
            };
            let id: i64 = get(&found, "id")?;
            let answered: Option<i64> = get(&found, "claim_attempt")?;
            let sender: Option<String> = get(&found, "claim_sender")?;
            if let Some(a) = attempt.filter(|a| a.is_late(sender.as_deref(), answered)) {
                self.metrics.claim_late_copy();
                return Err(superseded(a.n, answered.unwrap_or_default()));
            }
            row = sqlx::query(&sql)
                .bind(id)
                .bind(key)
                .bind(token_hash)
                .bind(worker_id.unwrap_or(0))
                .bind(attempt.map(|a| a.n))
                .bind(attempt.map(|a| a.sender.as_str()))
                .fetch_optional_done(&self.pool)
                .await?;
            if row.is_some() || attempt.is_none() {
                break;
            }
        }
        // Ended between the read and the write: a new claim, as for no match.
        let Some(row) = row else {
            return Ok(None);
        };
        match item_from_row(&row) {
            Ok(item) => {
                self.metrics.claim_replayed();
                Ok(Some(item))
            }
            Err(e) => {
                self.fail_unreadable_lease(get(&row, "id")?, token_hash, &e, "claim")
                    .await?;
                Ok(None)
            }
        }
    }

    /// The single-row claim statement (see [`Store::claim`]), sent again
    /// while the row it claimed does not decode: each such row is failed, so
    /// the loop ends with a readable item or none. With a key that another
    /// copy of this claim holds, the statement fails on the unique index
    /// and changes nothing, and that copy's lease is answered (`true`,
    /// replayed); when that lease ended in between, the statement runs again.
    ///
    /// A keyed claim that finds no open item is not answered `None` before
    /// it looked for its key's lease again: a copy of it may have taken the
    /// last open item after this copy first looked (see [`Store::claim_attempt`]).
    /// On PostgreSQL, when some item is still open (a claim in flight holds
    /// it locked, so the statement skipped it), it first sends the statement
    /// once more WITHOUT `SKIP LOCKED`: that one waits for every claim
    /// holding an item open when it started (a copy on another instance, or
    /// one whose statement waits on the key's unique index), so a copy still
    /// in flight has committed before the key is looked up. With no item
    /// open (an idle poll), no claim is in flight and the lookup alone
    /// decides. (SQLite runs one writer at a time: a copy that took the item
    /// has committed when this statement finds none.)
    async fn claim_one(
        &self,
        queue: &str,
        token_hash: &str,
        worker_id: Option<i64>,
        key: Option<&str>,
        attempt: Option<&Attempt>,
    ) -> ClaimAnswer {
        let statement = |lock: &str| {
            self.sql(&format!(
                "UPDATE items SET state = 'running', epoch = epoch + 1, token_hash = $2,
                     worker_id = $3, claim_key = $4, claim_attempt = CAST($5 AS BIGINT),
                     claim_sender = CAST($6 AS TEXT), claimed_at = {{now}},
                     heartbeat_at = {{now}}, updated_at = {{now}}, lease_ttl_ms = {ttl}
                 WHERE id = (SELECT id FROM items WHERE queue = $1 AND state = 'open'
                               AND {AVAILABLE_NOW}
                             ORDER BY id LIMIT 1 {lock})
                   AND state = 'open'
                 RETURNING {ITEM_COLS}",
                ttl = ms(self.settings.ttl_ms),
            ))
        };
        let mut sql = statement("{skip_locked}");
        let mut waited = self.backend != Backend::Postgres;
        let mut taken = 0;
        loop {
            let row = sqlx::query(&sql)
                .bind(queue)
                .bind(token_hash)
                .bind(worker_id)
                .bind(key)
                .bind(attempt.map(|a| a.n))
                .bind(attempt.map(|a| a.sender.as_str()))
                .fetch_optional_done(&self.pool)
                .await;
            let row = match (row, key) {
                (Ok(row), _) => row,
                // The only unique index the statement writes is the claim
                // key's: a committed running lease of this caller holds it
                // (PostgreSQL waits for a copy in flight to commit first).
                (Err(sqlx::Error::Database(e)), Some(key))
                    if e.is_unique_violation() && taken < KEY_TAKEN_TRIES =>
                {
                    taken += 1;
                    match self
                        .claim_again(queue, key, attempt, token_hash, worker_id)
                        .await?
                    {
                        Some(item) => return Ok(Some((item, true))),
                        None => continue,
                    }
                }
                (Err(e), _) => return Err(e.into()),
            };
            let Some(row) = row else {
                if let Some(key) = key {
                    if !waited {
                        waited = true;
                        // Only an open item another claim holds locked can
                        // be a copy's in flight: with none open, a copy
                        // that took one has committed.
                        if self.any_open(queue).await? {
                            sql = statement("FOR UPDATE");
                            continue;
                        }
                    }
                    if let Some(item) = self
                        .claim_again(queue, key, attempt, token_hash, worker_id)
                        .await?
                    {
                        return Ok(Some((item, true)));
                    }
                }
                self.metrics.claimed(queue, 0, 1);
                return Ok(None);
            };
            match item_from_row(&row) {
                Ok(item) => {
                    self.metrics.claimed(queue, 1, 0);
                    return Ok(Some((item, false)));
                }
                Err(e) => {
                    self.fail_unreadable_lease(get(&row, "id")?, token_hash, &e, "claim")
                        .await?;
                }
            }
        }
    }

    /// Drains `queue`'s claim lane (PostgreSQL): each batch is ONE statement
    /// that locks up to n open items with `FOR UPDATE SKIP LOCKED`, oldest
    /// first, and pairs the k-th with the k-th waiting claim (its own token
    /// hash and worker); claims beyond the items found get `None`. A batch
    /// whose statement the database refused (see `rerun_call_by_call`) is
    /// retried claim by claim, so each caller gets its own answer. Any other failure (the
    /// connection lost while the answer was read) may come after the
    /// statement committed: its claims are answered with the error and NOT
    /// claimed again, which would hand out further items while the first
    /// ones stay running under tokens nobody received (they expire after the
    /// TTL, an attempt counted, as any lease whose answer was lost). A row
    /// that does not decode is failed, fenced on its claim's token, and
    /// only that claim runs again (see [`Store::claim`]).
    ///
    /// Copies of one keyed claim (same key and caller) in one batch: only
    /// the first goes in the statement, the others are answered after it,
    /// with its lease. A member whose key a lease committed before holds
    /// fails the statement on the unique index; nothing was applied, so the
    /// batch runs claim by claim, and only that member replays that lease.
    ///
    /// The claims that run alone (and the copies after them) run in a task
    /// of their own while the lane goes on: a keyed claim run alone may
    /// wait for a row another session keeps locked (see `claim_one`), and
    /// the queue's other claims must not wait with it. They then race the
    /// lane's later statements as another instance's claims do.
    async fn run_claims(self, queue: String) {
        let _runner = self.claims.runner(&queue);
        while let Some(batch) = self.claims.next(&queue, coalesce::MAX_BATCH) {
            let (batch, copies) = split_copies(batch);
            let alone = self.claim_together(&queue, batch).await;
            if alone.is_empty() && copies.is_empty() {
                continue;
            }
            // The claims that run alone may wait for an open item's row
            // lock (see `claim_one`), which a session may keep for as long
            // as `lock_timeout` allows, and so may a copy (keyed) that
            // claims again: they run apart, so the claims that join the
            // lane meanwhile go on.
            let (store, queue) = (self.clone(), queue.clone());
            tokio::spawn(async move {
                store.claim_alone(&queue, alone).await;
                for job in copies {
                    // Keyed (a copy): it may wait for a locked row too.
                    let out = store.alone(store.replay_or_claim(&queue, &job)).await;
                    let _ = job.reply.send(out);
                }
            });
        }
    }

    /// One batch of [`Store::run_claims`], no two of them copies of one
    /// claim, a lone claim included (one statement, as for several: a
    /// keyed claim run by itself here would wait in the lane for an open
    /// item another session keeps locked). Answers each claim it decided;
    /// returns those that must claim again alone, each with whether the
    /// batch's keyed claims share one refusal (see [`Store::claim_alone`]).
    async fn claim_together(&self, queue: &str, batch: Vec<ClaimJob>) -> Vec<(ClaimJob, bool)> {
        match self.claim_batch(queue, &batch).await {
            Ok(slots) => {
                if batch.len() > 1 {
                    self.coalesced
                        .fetch_add(batch.len() as u64, Ordering::Relaxed);
                }
                let mut alone = Vec::new();
                for (job, slot) in batch.into_iter().zip(slots) {
                    match slot {
                        ClaimSlot::Answer(out) => {
                            let _ = job.reply.send(out.map(|item| item.map(|i| (i, false))));
                        }
                        ClaimSlot::Again | ClaimSlot::Empty => alone.push((job, true)),
                    }
                }
                alone
            }
            Err(e) if rerun_call_by_call(&e) => batch.into_iter().map(|job| (job, false)).collect(),
            Err(e) => {
                for job in batch {
                    let _ = job.reply.send(Err(for_each_call(&e)));
                }
                Vec::new()
            }
        }
    }

    /// Runs `jobs` one by one ([`Store::claim_one`]), answering each. A
    /// keyed claim run again alone may wait for an open item's row lock
    /// (see `claim_one`); when that wait is refused (`lock_timeout`: a
    /// session keeps the row locked, not a claim in flight), the other
    /// keyed claims of its batch marked `true` would wait for the same lock
    /// one after another, a lock timeout each: they are answered with that
    /// refusal (503) at once. A keyed claim (the only kind that waits for
    /// a row lock) holds one of the few permits for such waits while it
    /// runs ([`Store::alone`]); one that gets none within the effective
    /// `lock_timeout` is refused so too.
    async fn claim_alone(&self, queue: &str, jobs: Vec<(ClaimJob, bool)>) {
        let mut refused: Option<StoreError> = None;
        for (job, shared) in jobs {
            let out = match &refused {
                Some(e) if shared && job.key.is_some() => Err(for_each_call(e)),
                _ => {
                    let out = match job.key {
                        Some(_) => self.alone(self.claim_job(queue, &job)).await,
                        None => self.claim_job(queue, &job).await,
                    };
                    if let Err(e) = &out {
                        if shared
                            && job.key.is_some()
                            && e.unavailable() == Some(super::Unavailable::NotApplied)
                        {
                            refused = Some(for_each_call(e));
                        }
                    }
                    out
                }
            };
            let _ = job.reply.send(out);
        }
    }

    /// [`Store::claim_one`] for a claim of the lane.
    async fn claim_job(&self, queue: &str, job: &ClaimJob) -> ClaimAnswer {
        self.claim_one(
            queue,
            &job.token_hash,
            job.worker_id,
            job.key.as_deref(),
            job.attempt.as_ref(),
        )
        .await
    }

    /// A copy of a claim that ran just before it in its lane: the lease that
    /// claim took, replayed, or (it got none, or its lease already ended) a
    /// claim of its own.
    async fn replay_or_claim(&self, queue: &str, job: &ClaimJob) -> ClaimAnswer {
        if let Some(key) = job.key.as_deref() {
            if let Some(item) = self
                .claim_again(
                    queue,
                    key,
                    job.attempt.as_ref(),
                    &job.token_hash,
                    job.worker_id,
                )
                .await?
            {
                return Ok(Some((item, true)));
            }
        }
        self.claim_job(queue, job).await
    }

    /// Whether `queue` has an open item a claim may take now (committed;
    /// one a claim in flight holds locked reads as open; one backing off
    /// does not count).
    async fn any_open(&self, queue: &str) -> Result<bool, StoreError> {
        let sql = self.sql(&format!(
            "SELECT id FROM items WHERE queue = $1 AND state = 'open' AND {AVAILABLE_NOW} LIMIT 1"
        ));
        let row = sqlx::query(&sql)
            .bind(queue)
            .fetch_optional_done(&self.pool)
            .await?;
        Ok(row.is_some())
    }

    /// Of the claims `jobs` (keyed, of `queue`), those whose key a running
    /// lease of their caller holds, in one read: `true` per job.
    async fn keys_running(&self, queue: &str, jobs: &[&ClaimJob]) -> Result<Vec<bool>, StoreError> {
        let list: Vec<String> = (0..jobs.len()).map(|k| format!("${}", k + 2)).collect();
        let sql = format!(
            "SELECT claim_key, COALESCE(worker_id, 0) AS caller FROM items
             WHERE queue = $1 AND state = 'running' AND claim_key IN ({})",
            list.join(", ")
        );
        let mut q = sqlx::query(&sql).bind(queue);
        for job in jobs {
            q = q.bind(job.key.as_deref());
        }
        let rows = q.fetch_all(&self.pool).await?;
        let mut held = Vec::with_capacity(rows.len());
        for row in &rows {
            held.push((get::<String>(row, "claim_key")?, get::<i64>(row, "caller")?));
        }
        Ok(jobs
            .iter()
            .map(|j| {
                held.iter().any(|(k, c)| {
                    Some(k.as_str()) == j.key.as_deref() && *c == j.worker_id.unwrap_or(0)
                })
            })
            .collect())
    }

    /// Decides the batch's keyed claims that got no item (see `claim_one`):
    /// with no item open and no running lease under their key, `None` at
    /// once (an idle poll costs the batch two reads, not three statements
    /// per claim); the others run again alone (a copy may hold their item).
    /// A read that fails sends them all to run again alone.
    async fn settle_empty_keyed(&self, queue: &str, batch: &[ClaimJob], slots: &mut [ClaimSlot]) {
        let empty: Vec<usize> = (0..batch.len())
            .filter(|&k| matches!(slots[k], ClaimSlot::Empty))
            .collect();
        if empty.is_empty() {
            return;
        }
        let jobs: Vec<&ClaimJob> = empty.iter().map(|&k| &batch[k]).collect();
        let running = match self.any_open(queue).await {
            Ok(false) => self.keys_running(queue, &jobs).await.ok(),
            _ => None,
        };
        let mut none = 0;
        for (i, &k) in empty.iter().enumerate() {
            slots[k] = match running.as_ref().map(|r| r[i]) {
                Some(false) => {
                    none += 1;
                    ClaimSlot::Answer(Ok(None))
                }
                _ => ClaimSlot::Again,
            };
        }
        self.metrics.claimed(queue, 0, none);
    }

    async fn claim_batch(
        &self,
        queue: &str,
        batch: &[ClaimJob],
    ) -> Result<Vec<ClaimSlot>, StoreError> {
        let values: Vec<String> = (0..batch.len())
            .map(|k| {
                let p = 6 * k + 2;
                format!(
                    "(${p}::BIGINT, ${}::TEXT, ${}::BIGINT, ${}::TEXT, ${}::BIGINT, ${}::TEXT)",
                    p + 1,
                    p + 2,
                    p + 3,
                    p + 4,
                    p + 5
                )
            })
            .collect();
        let sql = self.sql(&format!(
            "WITH picked AS MATERIALIZED (
                 SELECT id FROM items WHERE queue = $1 AND state = 'open'
                   AND {AVAILABLE_NOW}
                 ORDER BY id LIMIT {n} FOR UPDATE SKIP LOCKED
             ), numbered AS (
                 SELECT id, row_number() OVER (ORDER BY id) AS n FROM picked
             )
             UPDATE items AS i SET state = 'running', epoch = i.epoch + 1,
                 token_hash = r.token_hash, worker_id = r.worker_id,
                 claim_key = r.claim_key, claim_attempt = r.claim_attempt,
                 claim_sender = r.claim_sender, claimed_at = {{now}}, heartbeat_at = {{now}}, updated_at = {{now}},
                 lease_ttl_ms = {ttl}
             FROM numbered
             JOIN (VALUES {values}) AS r(n, token_hash, worker_id, claim_key, claim_attempt, claim_sender) ON r.n = numbered.n
             WHERE i.id = numbered.id AND i.state = 'open'
             RETURNING r.n AS n, {cols}",
            n = batch.len(),
            ttl = ms(self.settings.ttl_ms),
            values = values.join(", "),
            cols = qualified_item_cols(),
        ));
        let mut q = sqlx::query(&sql).bind(queue);
        for (k, job) in batch.iter().enumerate() {
            q = q
                .bind(k as i64 + 1)
                .bind(&job.token_hash)
                .bind(job.worker_id)
                .bind(&job.key)
                .bind(job.attempt.as_ref().map(|a| a.n))
                .bind(job.attempt.as_ref().map(|a| a.sender.clone()));
        }
        let rows = q.fetch_all(&self.pool).await?;
        // Committed: one row per claim that got an item. A row that does not
        // decode is failed below and its claim runs again (counted then).
        let decoded = by_call(&rows, batch.len(), |_, row| {
            item_from_row(row).map_err(|e| (get::<i64>(row, "id"), e))
        })?;
        let readable = decoded.iter().filter(|d| matches!(d, Some(Ok(_)))).count();
        // A keyed claim that got no item runs again alone (counted then):
        // a copy of it may hold the item it missed (see `claim_one`).
        let mut empty = 0;
        for (job, row) in batch.iter().zip(&decoded) {
            empty += u64::from(row.is_none() && job.key.is_none());
        }
        self.metrics.claimed(queue, readable as u64, empty);
        let mut slots = Vec::with_capacity(batch.len());
        for (job, row) in batch.iter().zip(decoded) {
            slots.push(match row {
                None if job.key.is_some() => ClaimSlot::Empty,
                None => ClaimSlot::Answer(Ok(None)),
                Some(Ok(item)) => ClaimSlot::Answer(Ok(Some(item))),
                Some(Err((Ok(id), e))) => {
                    match self
                        .fail_unreadable_lease(id, &job.token_hash, &e, "claim")
                        .await
                    {
                        Ok(_) => ClaimSlot::Again,
                        Err(e) => ClaimSlot::Answer(Err(e)),
                    }
                }
                Some(Err((Err(e), _))) => ClaimSlot::Answer(Err(e)),
            });
        }
        self.settle_empty_keyed(queue, batch, &mut slots).await;
        Ok(slots)
    }

    fn claim_response(&self, item: Item, token: String) -> Claimed {
        let lease = Lease {
            token,
            epoch: item.epoch,
            ttl_ms: self.settings.ttl_ms,
            heartbeat_ms: self.settings.heartbeat_ms,
        };
        Claimed { item, lease }
    }

    /// Renews the lease of `id` held with `token` (even past the TTL, as long as no
    /// takeover happened); returns the TTL in ms. With `owner`, the lease must
    /// also be held by that worker.
    ///
    /// # Errors
    /// `claim_lost` (stale token), `state_conflict` (current token, item not
    /// running), `forbidden` (current token, another worker's lease),
    /// `not_found`; nothing is written in any of these cases.
    pub async fn heartbeat(
        &self,
        id: i64,
        token: &str,
        owner: Option<i64>,
    ) -> Result<u64, StoreError> {
        let (store, hash) = (self.clone(), tokens::hash(token));
        detached(async move { store.renew(id, &hash, owner).await }).await
    }

    /// The single-lease renewal of [`Store::heartbeat`], by token hash.
    async fn renew(&self, id: i64, hash: &str, owner: Option<i64>) -> Result<u64, StoreError> {
        // The answer is the TTL the lease was granted with (a heartbeat
        // renews it; it does not change it).
        let sql = self.sql(&format!(
            "UPDATE items SET heartbeat_at = {{now}}, updated_at = {{now}}
             WHERE id = $1 AND state = 'running' AND token_hash = $2
               AND ($3 = 0 OR worker_id = $3)
             RETURNING {} AS ttl",
            lease_ttl_sql("$4")
        ));
        let renewed = sqlx::query(&sql)
            .bind(id)
            .bind(hash)
            .bind(owner.unwrap_or(0))
            .bind(ms(self.settings.ttl_ms))
            .fetch_optional_done(&self.pool)
            .await?;
        match renewed {
            // Renewed (committed): a TTL that does not decode is answered
            // with this instance's, as in `renew_many` (see `unreadable`).
            Some(row) => {
                self.metrics.renewed(1);
                Ok(get::<i64>(&row, "ttl")
                    .ok()
                    .and_then(|t| u64::try_from(t).ok())
                    .unwrap_or(self.settings.ttl_ms))
            }
            None => Err(self.classify(id, hash, owner).await),
        }
    }

    /// Renews many leases in ONE statement; a result per lease, in order (the
    /// TTL in ms, or the error [`Store::heartbeat`] would give). Only the leases
    /// it did not renew are read again, to tell why.
    ///
    /// # Errors
    /// The database failed (no lease is renewed then).
    pub async fn heartbeat_many(
        &self,
        leases: &[(i64, &str)],
        owner: Option<i64>,
    ) -> Result<Vec<Result<u64, StoreError>>, StoreError> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let store = self.clone();
        let leases: Vec<(i64, String)> = leases
            .iter()
            .map(|&(id, token)| (id, tokens::hash(token)))
            .collect();
        detached(async move { store.renew_many(&leases, owner).await }).await
    }

    /// The one statement of [`Store::heartbeat_many`], by (id, token hash).
    ///
    /// On PostgreSQL it first locks the leases' rows with `FOR UPDATE SKIP
    /// LOCKED`, fenced as the renewal is (id, token hash, `running`,
    /// holder): a row the caller does not hold is never locked, so a batch
    /// naming other workers' items (any ids, junk tokens) holds up no claim
    /// of an open item (claims skip locked rows) and pushes no holder's
    /// settle or heartbeat aside. It renews only those: a row another session holds (an
    /// admin's `psql` left in a transaction) would otherwise hold the whole
    /// statement for `lock_timeout` and fail every lease of the batch. A
    /// lease passed over so (its row still reads as held by it) is renewed
    /// alone ([`Store::renew`]: it waits for its row as a single heartbeat
    /// does, at most `lock_timeout`, then `503` for it alone), all such
    /// leases at once, after the others are committed, each holding one of
    /// the few permits for such waits ([`Store::alone`]): at most a quarter
    /// of the pool waits for locked rows, and a lease that gets no permit
    /// within the effective `lock_timeout` is answered `503` for it alone,
    /// so the batch is answered within about one `lock_timeout` (two at
    /// most) however many of its rows are locked.
    async fn renew_many(
        &self,
        leases: &[(i64, String)],
        owner: Option<i64>,
    ) -> Result<Vec<Result<u64, StoreError>>, StoreError> {
        let ttl = lease_ttl_sql(&ms(self.settings.ttl_ms).to_string());
        let sql = match self.backend {
            Backend::Sqlite => {
                let pairs: Vec<String> = (0..leases.len())
                    .map(|i| format!("(${}, ${})", 2 * i + 2, 2 * i + 3))
                    .collect();
                self.sql(&format!(
                    "UPDATE items SET heartbeat_at = {{now}}, updated_at = {{now}}
                     WHERE state = 'running' AND ($1 = 0 OR worker_id = $1)
                       AND (id, token_hash) IN (VALUES {})
                     RETURNING id, token_hash, {ttl} AS ttl",
                    pairs.join(", "),
                ))
            }
            Backend::Postgres => {
                let pairs: Vec<String> = (0..leases.len())
                    .map(|i| format!("(${}::BIGINT, ${}::TEXT)", 2 * i + 2, 2 * i + 3))
                    .collect();
                self.sql(&format!(
                    "WITH v(id, token_hash) AS (VALUES {}),
                     locked AS MATERIALIZED (
                         SELECT id FROM items
                         WHERE state = 'running' AND ($1 = 0 OR worker_id = $1)
                           AND (id, token_hash) IN (SELECT id, token_hash FROM v)
                         FOR UPDATE SKIP LOCKED
                     )
                     UPDATE items SET heartbeat_at = {{now}}, updated_at = {{now}}
                     WHERE state = 'running' AND ($1 = 0 OR worker_id = $1)
                       AND (id, token_hash) IN (SELECT id, token_hash FROM v)
                       AND id IN (SELECT id FROM locked)
                     RETURNING id, token_hash, {ttl} AS ttl",
                    pairs.join(", "),
                ))
            }
        };
        let mut q = sqlx::query(&sql).bind(owner.unwrap_or(0));
        for (id, hash) in leases {
            q = q.bind(*id).bind(hash);
        }
        let rows = q.fetch_all(&self.pool).await?;
        self.metrics.renewed(rows.len() as u64);
        // Keyed by (id, token hash): a batch may name one item twice, once
        // stale. A TTL that does not decode is answered with this instance's.
        let mut renewed = HashMap::with_capacity(rows.len());
        for row in &rows {
            let ttl = get::<i64>(row, "ttl")
                .ok()
                .and_then(|t| u64::try_from(t).ok())
                .unwrap_or(self.settings.ttl_ms);
            renewed.insert(
                (get::<i64>(row, "id")?, get::<String>(row, "token_hash")?),
                ttl,
            );
        }
        let ttl_of = |id: i64, hash: &String| renewed.get(&(id, hash.clone())).copied();
        // Every lease not renewed, told in ONE read.
        let missed: Vec<(i64, &str)> = leases
            .iter()
            .filter(|(id, hash)| ttl_of(*id, hash).is_none())
            .map(|(id, hash)| (*id, hash.as_str()))
            .collect();
        let told = self.classify_or_skipped(&missed, owner, true).await;
        // The leases passed over for a locked row, each renewed alone, all
        // at once (one wait for the lock between them, not one each).
        let tasks: Vec<_> = missed
            .iter()
            .zip(&told)
            .filter(|(_, e)| e.is_none())
            .map(|(&(id, hash), _)| {
                let (store, hash) = (self.clone(), hash.to_owned());
                tokio::spawn(async move { store.alone(store.renew(id, &hash, owner)).await })
            })
            .collect();
        let mut alone = Vec::with_capacity(tasks.len());
        for task in tasks {
            alone.push(
                task.await
                    .unwrap_or(Err(StoreError::Database(sqlx::Error::WorkerCrashed))),
            );
        }
        let (mut told, mut alone) = (told.into_iter(), alone.into_iter());
        Ok(leases
            .iter()
            .map(|(id, hash)| match ttl_of(*id, hash) {
                Some(ttl) => Ok(ttl),
                None => match told.next() {
                    Some(Some(e)) => Err(e),
                    Some(None) => alone.next().unwrap_or_else(|| Err(not_found(*id))),
                    None => Err(not_found(*id)),
                },
            })
            .collect())
    }

    /// Gives `id` back: it reopens (one attempt counted) or, at the cap, fails
    /// with `retry_limit`.
    ///
    /// A release sent again by the lease that released the item (its first
    /// answer lost on the way back) is answered with the item as it is now,
    /// and changes nothing (see `released_before`). Ending calls are
    /// all safe to retry this way (settle: [`Store::settle_reporting`]).
    ///
    /// # Errors
    /// As [`Store::heartbeat`]; `Corrupt` when the release WAS applied but
    /// the item's row does not decode ([`Store::release_reporting`] answers
    /// [`Ended::Unreadable`] then).
    pub async fn release(
        &self,
        id: i64,
        token: &str,
        owner: Option<i64>,
    ) -> Result<Item, StoreError> {
        self.release_reporting(id, token, owner)
            .await
            .and_then(|(ended, _)| ended.into_item())
    }

    /// [`Store::release`], also saying what it did ([`Released`]): a replay
    /// (see `released_before`) changed nothing and must not be counted
    /// again; a release by a lease whose own settle landed before (its
    /// answer lost, so the client could not know) changed nothing either,
    /// and says to what state that settle took the item, where any other
    /// stale token is refused `claim_lost`. A release (or its replay) whose
    /// row does not decode is answered [`Ended::Unreadable`], never an
    /// error: it was applied (see `unreadable`).
    ///
    /// # Errors
    /// As [`Store::heartbeat`].
    pub async fn release_reporting(
        &self,
        id: i64,
        token: &str,
        owner: Option<i64>,
    ) -> Result<(Ended, Released), StoreError> {
        let (store, hash) = (self.clone(), tokens::hash(token));
        detached(async move { store.release_one(id, &hash, owner).await }).await
    }

    /// The release of [`Store::release_reporting`], by token hash.
    async fn release_one(
        &self,
        id: i64,
        hash: &str,
        owner: Option<i64>,
    ) -> Result<(Ended, Released), StoreError> {
        let read = match self.read_lease(id).await {
            Ok(Some(read)) => read,
            Ok(None) => return Err(not_found(id)),
            // A lease column does not decode (an epoch or counter out of
            // range, an unknown state): no next attempt can be computed.
            Err(why @ StoreError::Corrupt(_)) => {
                return self.release_unreadable(id, hash, owner, &why).await
            }
            Err(e) => return Err(e),
        };
        let item = read.item;
        // Decide with the pure rules first; the UPDATE below repeats the fence
        // atomically (token and epoch as read), so a concurrent change wins.
        let current = read.token_hash.is_some_and(|s| ct_eq(&s, hash));
        if current && owner.is_some() && read.holder != owner {
            return Err(forbidden(id));
        }
        if let Err(code) = item.apply(LeaseEvent::Release, current, read.now_ms, read.ttl_ms) {
            // Read again only for the lease that released the item (a
            // replay): any other token is refused from the one read, as a
            // missing item is (a tokenless caller learns nothing from time).
            let released_by_this = read.released_hash.is_some_and(|s| ct_eq(&s, hash))
                && (owner.is_none() || read.released_by == owner);
            if released_by_this {
                if let Some(item) = self.released_before(id, hash, owner).await? {
                    return Ok((item, Released::Again));
                }
            }
            // This lease's own settle landed (its answer was lost). Looked
            // at in the row read, as the release above: any other token
            // costs no statement more (a tokenless caller learns nothing).
            let settled_by_this = read.settled_hash.is_some_and(|s| ct_eq(&s, hash))
                && (owner.is_none() || read.settled_by == owner);
            if settled_by_this {
                if let Some(by_settle) = self.ended_by_own_settle(id, hash, owner).await? {
                    return Ok(by_settle);
                }
            }
            return Err(rejection(code, id));
        }
        let (state, attempts, reason) = end_attempt(item.attempts, item.max_redeliveries);
        let reason = if state == ItemState::Open {
            "released"
        } else {
            reason
        };
        let delay = redelivery_delay(read.backoff, state, attempts);
        let sql = self.sql(&format!(
            "UPDATE items SET state = $4, attempts = $5, last_error = $6, token_hash = NULL, lease_ttl_ms = NULL, claim_key = NULL,
                 released_token_hash = $2, released_by = worker_id,
                 worker_id = NULL, heartbeat_at = NULL, updated_at = {{now}},
                 available_at = {{now}} + CAST($8 AS BIGINT)
             WHERE id = $1 AND state = 'running' AND token_hash = $2 AND epoch = $3
               AND ($7 = 0 OR worker_id = $7)
             RETURNING {ITEM_COLS}, {AVAILABLE_IN}"
        ));
        let row = sqlx::query(&sql)
            .bind(id)
            .bind(hash)
            .bind(ms(item.epoch))
            .bind(state.as_str())
            .bind(i64::from(attempts))
            .bind(reason)
            .bind(owner.unwrap_or(0))
            .bind(delay)
            .fetch_optional_done(&self.pool)
            .await?;
        match row {
            Some(row) => {
                self.metrics.released(&super::settle::queue_of(&row));
                if state == ItemState::Failed {
                    self.metrics.retry_limit_failed("release", 1);
                }
                Ok((
                    self.ended(&row, id, Some(state), "release", true),
                    Released::Now,
                ))
            }
            // The lease ended between the read and the write: by its own
            // release or settle racing this one (a settle whose answer came
            // too late for its client), or by another path.
            None => match self.released_before(id, hash, owner).await? {
                Some(item) => Ok((item, Released::Again)),
                None => match self.ended_by_own_settle(id, hash, owner).await? {
                    Some(by_settle) => Ok(by_settle),
                    None => Err(self.classify(id, hash, owner).await),
                },
            },
        }
    }

    /// The release of a running row whose lease columns do not decode (see
    /// `unreadable`): the current lease's release fails the row with reason
    /// [`super::UNREADABLE_REASON`], its counters clamped into range (a
    /// reopened row would be failed by the next claim anyway), fenced on the
    /// token and holder, and records the release, so that the same release
    /// sent again is a replay. Answered with the row as it is then (or
    /// [`Ended::Unreadable`]); counted and logged. Any other token goes the
    /// usual way: a replay of this release, the lease's own settle, or the
    /// fence's rejection.
    async fn release_unreadable(
        &self,
        id: i64,
        hash: &str,
        owner: Option<i64>,
        why: &StoreError,
    ) -> Result<(Ended, Released), StoreError> {
        let sql = self.sql(&format!(
            "UPDATE items SET {}, released_token_hash = $3, released_by = worker_id
             WHERE id = $1 AND state = 'running' AND token_hash = $3
               AND ($4 = 0 OR worker_id = $4)
             RETURNING {ITEM_COLS}",
            super::unreadable::fail_set()
        ));
        let row = sqlx::query(&sql)
            .bind(id)
            .bind(super::UNREADABLE_REASON)
            .bind(hash)
            .bind(owner.unwrap_or(0))
            .fetch_optional_done(&self.pool)
            .await?;
        if let Some(row) = row {
            self.metrics.unreadable_row("release");
            tracing::warn!(
                item_id = id,
                error = %why,
                "release: the lease's row cannot be read; it is failed with reason {}",
                super::UNREADABLE_REASON
            );
            return Ok((
                self.ended(&row, id, Some(ItemState::Failed), "release", false),
                Released::Now,
            ));
        }
        match self.released_before(id, hash, owner).await? {
            Some(item) => Ok((item, Released::Again)),
            None => match self.ended_by_own_settle(id, hash, owner).await? {
                Some(by_settle) => Ok(by_settle),
                None => Err(self.classify(id, hash, owner).await),
            },
        }
    }

    /// A release that matched no running lease: when this very token released
    /// the item (the same holder: a worker's replay must come from the worker
    /// that released, an operator's or a beacon's from anyone holding the
    /// token), the item as it is now; the release was applied once and the
    /// retry changes nothing. `None`: the caller's usual rejection stands.
    async fn released_before(
        &self,
        id: i64,
        hash: &str,
        owner: Option<i64>,
    ) -> Result<Option<Ended>, StoreError> {
        let row = self.row_ended_by(id, hash, owner, "released").await?;
        Ok(row.map(|r| self.ended(&r, id, state_of(&r), "release", false)))
    }

    /// The item's row (with `settled_state`) when `hash` is the token of
    /// the lease whose `ending` (`released` or `settled`: the columns
    /// `{ending}_token_hash` and `{ending}_by`) was the item's last of that
    /// kind, sent by the same holder (a worker's must come from that
    /// worker; an operator's or a beacon's from anyone holding the token).
    async fn row_ended_by(
        &self,
        id: i64,
        hash: &str,
        owner: Option<i64>,
        ending: &str,
    ) -> Result<Option<AnyRow>, StoreError> {
        let sql = format!(
            "SELECT {ITEM_COLS}, settled_state FROM items
             WHERE id = $1 AND {ending}_token_hash = $2 AND ($3 = 0 OR {ending}_by = $3)"
        );
        Ok(sqlx::query(&sql)
            .bind(id)
            .bind(hash)
            .bind(owner.unwrap_or(0))
            .fetch_optional_done(&self.pool)
            .await?)
    }

    /// A release by the lease whose own settle was the item's last (the same
    /// holder, as for `released_before`; its answer lost, so its client
    /// could not know): the item as it is now and the state that settle
    /// set ([`landed_state`]), which the release changes nothing of.
    /// `None`: the caller's usual rejection stands.
    async fn ended_by_own_settle(
        &self,
        id: i64,
        hash: &str,
        owner: Option<i64>,
    ) -> Result<Option<(Ended, Released)>, StoreError> {
        let Some(row) = self.row_ended_by(id, hash, owner, "settled").await? else {
            return Ok(None);
        };
        let state = landed_state(&row)?;
        let item = self.ended(&row, id, state_of(&row), "release", false);
        Ok(Some((item, Released::BySettle(state.into()))))
    }

    /// Resumes a paused item: running again with a NEW token and `epoch + 1`;
    /// the old token is fenced from then on.
    ///
    /// # Errors
    /// `conflict` if the item is not paused, `not_found`; `Corrupt` when the
    /// row does not decode, and was failed instead ([`Store::resume_reporting`]
    /// answers [`Resumed::Unreadable`] then).
    pub async fn resume(&self, id: i64, worker_id: Option<i64>) -> Result<Claimed, StoreError> {
        self.resume_reporting(id, worker_id)
            .await
            .and_then(Resumed::into_claimed)
    }

    /// [`Store::resume`], answering a row that does not decode with
    /// [`Resumed::Unreadable`], never an error: such a row is failed at
    /// once, fenced on the new token, as a claim fails it (see
    /// `unreadable`), so no lease is left under a token nobody received.
    ///
    /// Idempotent: a resume of an item that a resume already took out of
    /// `paused`, with no claim since (its epoch is still the one that
    /// resume gave it), changes nothing and is answered
    /// [`Resumed::Again`] (an operator's resume sent again after its answer
    /// was lost, or two operators resuming at once: exactly one of them
    /// gets the lease). The conditional update is the only writer, so a
    /// resume racing a claim, the reaper or another resume has one winner.
    ///
    /// # Errors
    /// `conflict` if the item is not paused (and was not resumed last),
    /// `not_found`.
    pub async fn resume_reporting(
        &self,
        id: i64,
        worker_id: Option<i64>,
    ) -> Result<Resumed, StoreError> {
        // In a task of its own: a resume whose client goes away mid-call
        // still runs to its end (a row that does not decode is failed, not
        // left running under a token nobody received) and is counted.
        let store = self.clone();
        detached(async move { store.resume_now(id, worker_id).await }).await
    }

    /// The body of [`Store::resume_reporting`].
    async fn resume_now(&self, id: i64, worker_id: Option<i64>) -> Result<Resumed, StoreError> {
        let (token, token_hash) = tokens::new_lease_token();
        let sql = self.sql(&format!(
            "UPDATE items SET state = 'running', epoch = epoch + 1, token_hash = $2,
                 worker_id = $3, claim_key = NULL, resumed_epoch = epoch + 1,
                 claimed_at = {{now}}, heartbeat_at = {{now}}, updated_at = {{now}},
                 lease_ttl_ms = {ttl}
             WHERE id = $1 AND state = 'paused'
             RETURNING {ITEM_COLS}",
            ttl = ms(self.settings.ttl_ms),
        ));
        // A pause landing between a refused update and the read that
        // explains it makes the item resumable again: try once more.
        let mut tries = 0;
        let row = loop {
            tries += 1;
            let row = sqlx::query(&sql)
                .bind(id)
                .bind(&token_hash)
                .bind(worker_id)
                .fetch_optional_done(&self.pool)
                .await?;
            if let Some(row) = row {
                break row;
            }
            match self.resumed_before(id).await? {
                Some(again) => return Ok(again),
                None if tries < 3 => continue,
                None => {
                    return Err(StoreError::rejected(
                        ErrorCode::Conflict,
                        format!("item {id} was paused and resumed again meanwhile; send it again"),
                    ))
                }
            }
        };
        self.metrics.operator_action("resume");
        match item_from_row(&row) {
            Ok(item) => Ok(Resumed::Claimed(self.claim_response(item, token.0))),
            Err(e) => self.unreadable_resume(id, &token_hash, &e).await,
        }
    }

    /// Why a resume of item `id` found it not paused, when that is because a
    /// resume already took it out of `paused` and no claim has taken it
    /// since: [`Resumed::Again`]. `None` when the item is paused again (the
    /// caller tries again) or when it is answered as a refusal.
    async fn resumed_before(&self, id: i64) -> Result<Option<Resumed>, StoreError> {
        // Only these columns: an item whose other columns do not decode
        // (failed by the resume that met it, see `unreadable`) is answered
        // the same way.
        #[expect(
            clippy::disallowed_methods,
            reason = "a read: no write is committed when it stops early"
        )]
        let row: Option<(String, i64, Option<i64>)> =
            sqlx::query_as("SELECT state, epoch, resumed_epoch FROM items WHERE id = $1")
                .bind(id)
                .fetch_optional(&self.pool)
                .await?;
        let Some((state, epoch, resumed)) = row else {
            return Err(not_found(id));
        };
        match ItemState::parse(&state) {
            Some(ItemState::Paused) => Ok(None),
            Some(state) if resumed == Some(epoch) => Ok(Some(Resumed::Again { id, state, epoch })),
            _ => Err(StoreError::rejected(
                ErrorCode::Conflict,
                format!("item {id} is {state}, not paused"),
            )),
        }
    }

    /// Operator path: pauses a running item, keeping its token current (the
    /// holder's next fenced call gets `state_conflict`).
    ///
    /// # Errors
    /// `conflict` if the item is not running, `not_found`; `Corrupt` when
    /// the pause WAS applied but the row does not decode
    /// ([`Store::pause_reporting`] answers [`Ended::Unreadable`] then).
    pub async fn pause(&self, id: i64) -> Result<Item, StoreError> {
        self.pause_reporting(id).await.and_then(Ended::into_item)
    }

    /// [`Store::pause`], answering a row that does not decode with
    /// [`Ended::Unreadable`] (state `paused`), never an error: the pause was
    /// applied (see `unreadable`).
    ///
    /// # Errors
    /// `conflict` if the item is not running, `not_found`.
    pub async fn pause_reporting(&self, id: i64) -> Result<Ended, StoreError> {
        // In a task of its own: a pause whose client goes away mid-call is
        // counted once it commits.
        let store = self.clone();
        detached(async move { store.pause_now(id).await }).await
    }

    /// The body of [`Store::pause_reporting`].
    async fn pause_now(&self, id: i64) -> Result<Ended, StoreError> {
        let sql = self.sql(&format!(
            "UPDATE items SET state = 'paused', updated_at = {{now}}
             WHERE id = $1 AND state = 'running' RETURNING {ITEM_COLS}"
        ));
        match sqlx::query(&sql)
            .bind(id)
            .fetch_optional_done(&self.pool)
            .await?
        {
            Some(row) => {
                self.metrics.operator_action("pause");
                Ok(self.ended(&row, id, Some(ItemState::Paused), "pause", true))
            }
            None => Err(self.not_in_state(id, ItemState::Running).await),
        }
    }

    /// Operator path: puts a `failed` or `blocked` item back to `open`, with
    /// its attempts from 0 again (the whole redelivery allowance), no holder
    /// and no lease; its epoch stays until the next claim raises it, and
    /// `last_error` (and any `result`) is kept until the next settle
    /// replaces it, so a reader still sees why it had failed. Answers the
    /// item as the requeue left it ([`Ended::Unreadable`] when its row does
    /// not decode: the requeue was applied), with `false`.
    ///
    /// Idempotent: a requeue of an item that a requeue already put back to
    /// `open`, with no claim since (its epoch is still the one it had then),
    /// changes nothing and is answered the item as it is, with `true` (an
    /// operator's requeue sent again after its answer was lost, or two
    /// operators at once: one is counted). The conditional update is the
    /// only writer, so a requeue racing another has one winner. Runs
    /// detached, as every counted write: a requeue whose client went away
    /// is counted once it commits.
    ///
    /// # Errors
    /// `conflict` naming the state when the item is neither failed nor
    /// blocked (and was not requeued last), `not_found`.
    pub async fn requeue(&self, id: i64) -> Result<(Ended, bool), StoreError> {
        let store = self.clone();
        detached(async move { store.requeue_now(id).await }).await
    }

    /// The body of [`Store::requeue`].
    async fn requeue_now(&self, id: i64) -> Result<(Ended, bool), StoreError> {
        let sql = self.sql(&format!(
            "UPDATE items SET state = 'open', attempts = 0, token_hash = NULL, worker_id = NULL,
                 lease_ttl_ms = NULL, claim_key = NULL, heartbeat_at = NULL, available_at = NULL,
                 requeued_epoch = epoch, updated_at = {{now}}
             WHERE id = $1 AND state IN ('failed', 'blocked')
             RETURNING {ITEM_COLS}"
        ));
        if let Some(row) = sqlx::query(&sql)
            .bind(id)
            .fetch_optional_done(&self.pool)
            .await?
        {
            self.metrics.operator_action("requeue");
            return Ok((
                self.ended(&row, id, Some(ItemState::Open), "requeue", true),
                false,
            ));
        }
        let left_so = |_: &AnyRow| true;
        self.operator_call_again(id, "requeue", "requeued_epoch", ItemState::Open, left_so)
            .await
            .map_err(|e| e.or_not("failed or blocked"))
    }

    /// An operator's call `by` (`requeue`, `cancel`) whose conditional
    /// update changed nothing on item `id`: answered as that call sent
    /// again (the item as it is now, with `true`) while the item is as it
    /// left it: in state `landed`, with its column `mark` (the epoch the
    /// call records when it lands) equal to its epoch (no claim since), and
    /// `left_so` of its row. Else [`NotAgain`]: the caller's `conflict`
    /// naming the state the item is in, or `not_found`. Only these columns
    /// decide: an item whose other columns do not decode is answered too.
    pub(super) async fn operator_call_again(
        &self,
        id: i64,
        by: &'static str,
        mark: &str,
        landed: ItemState,
        left_so: impl Fn(&AnyRow) -> bool,
    ) -> Result<(Ended, bool), NotAgain> {
        let read = format!("SELECT {ITEM_COLS}, {mark} FROM items WHERE id = $1");
        let Some(row) = sqlx::query(&read)
            .bind(id)
            .fetch_optional_done(&self.pool)
            .await
            .map_err(|e| NotAgain::Failed(e.into()))?
        else {
            return Err(NotAgain::Failed(not_found(id)));
        };
        let state = state_of(&row);
        let epoch = get::<i64>(&row, "epoch").ok();
        let marked = get::<Option<i64>>(&row, mark).ok().flatten();
        if state == Some(landed) && marked.is_some() && marked == epoch && left_so(&row) {
            return Ok((self.ended(&row, id, state, by, false), true));
        }
        let named = get::<String>(&row, "state").unwrap_or_else(|_| "unreadable".into());
        Err(NotAgain::In { id, state: named })
    }

    /// Why a call that needs item `id` in state `wanted` changed nothing:
    /// `conflict` naming the state it is in, or `not_found`. Reads the state
    /// alone, so an item whose other columns do not decode is answered too
    /// (a resume or pause sent again after it met such a row, see
    /// `unreadable`).
    async fn not_in_state(&self, id: i64, wanted: ItemState) -> StoreError {
        #[expect(
            clippy::disallowed_methods,
            reason = "a read: no write is committed when it stops early"
        )]
        let state: Result<Option<(String,)>, _> =
            sqlx::query_as("SELECT state FROM items WHERE id = $1")
                .bind(id)
                .fetch_optional(&self.pool)
                .await;
        match state {
            Ok(Some((state,))) => StoreError::rejected(
                ErrorCode::Conflict,
                format!("item {id} is {state}, not {}", wanted.as_str()),
            ),
            Ok(None) => not_found(id),
            Err(e) => e.into(),
        }
    }

    /// Reads one item.
    ///
    /// # Errors
    /// The database failed.
    pub async fn item(&self, id: i64) -> Result<Option<Item>, StoreError> {
        let sql = self.sql(&format!(
            "SELECT {ITEM_COLS}, {AVAILABLE_IN} FROM items WHERE id = $1"
        ));
        let row = sqlx::query(&sql)
            .bind(id)
            .fetch_optional_done(&self.pool)
            .await?;
        row.as_ref().map(item_from_row).transpose()
    }

    /// Reads one item for an answer (`GET /v1/items/{id}`): the item, or
    /// [`Viewed::Unreadable`] when its row does not decode, never an error
    /// for such a row (see `unreadable`; counted `by="get"` and logged).
    ///
    /// # Errors
    /// The database failed.
    pub async fn view_item(&self, id: i64) -> Result<Option<Viewed>, StoreError> {
        let sql = self.sql(&format!(
            "SELECT {ITEM_COLS}, {AVAILABLE_IN} FROM items WHERE id = $1"
        ));
        let row = sqlx::query(&sql)
            .bind(id)
            .fetch_optional_done(&self.pool)
            .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        Ok(Some(match item_from_row(&row) {
            Ok(item) => Viewed::Item(item),
            Err(e) => {
                self.metrics.unreadable_row("get");
                tracing::warn!(item_id = id, error = %e, "get: an item row cannot be read");
                Viewed::Unreadable {
                    id,
                    state: get::<String>(&row, "state")
                        .ok()
                        .and_then(|s| ItemState::parse(&s)),
                    queue: get(&row, "queue").ok(),
                    worker_id: get::<Option<i64>>(&row, "worker_id").ok().flatten(),
                }
            }
        }))
    }

    /// One page of the items of `queue` (of one `state`, if given) with ids
    /// above `after`, in id order: at most `limit` items (and never more than
    /// [`MAX_LIST_LIMIT`](crate::routes::MAX_LIST_LIMIT), each a bind
    /// parameter of the second statement), and no more than
    /// fit [`Settings::list_page_bytes`](super::Settings::list_page_bytes)
    /// (payload, result, error and queue texts plus a fixed overhead per
    /// item; a page always holds at least one item, however large). The
    /// page's `next` is set when more items may follow: the next page is
    /// `after = next`.
    ///
    /// A tail never misses an item: within a queue, items become visible in
    /// id order (see `Store::enqueue_text`), so once a listing has shown id n,
    /// no item of the queue below n appears later, and a reader paging with
    /// `after = <last id seen>` while items arrive sees each one (unless the
    /// retention sweep deletes it first, or it leaves `state` first). On
    /// PostgreSQL that costs a per-queue lock on enqueue.
    ///
    /// Two statements: the first reads only ids and text sizes, so the items
    /// left out are never read; the second reads the items that fit, by id
    /// (those still in `state`), so an item that entered `state` in between
    /// never displaces one of them.
    ///
    /// # Errors
    /// The database failed.
    pub async fn list(
        &self,
        queue: &str,
        state: Option<ItemState>,
        after: i64,
        limit: u32,
    ) -> Result<ItemPage, StoreError> {
        let state = state.map_or("", ItemState::as_str);
        let limit = limit.min(crate::routes::MAX_LIST_LIMIT);
        let sql = "SELECT id, CAST(octet_length(payload) + octet_length(queue)
                        + COALESCE(octet_length(result), 0)
                        + COALESCE(octet_length(last_error), 0) AS BIGINT) AS bytes
                   FROM items WHERE queue = $1 AND ($2 = '' OR state = $2) AND id > $3
                   ORDER BY id LIMIT $4";
        let sizes: Vec<(i64, i64)> = sqlx::query_as(sql)
            .bind(queue)
            .bind(state)
            .bind(after)
            .bind(i64::from(limit) + 1)
            .fetch_all(&self.pool)
            .await?;
        let budget = self.settings.list_page_bytes;
        let (mut take, mut bytes) = (0usize, 0u64);
        for &(_, size) in sizes.iter().take(limit as usize) {
            let cost = u64::try_from(size).unwrap_or(0) + ITEM_OVERHEAD_BYTES;
            if take > 0 && bytes + cost > budget {
                break;
            }
            bytes += cost;
            take += 1;
        }
        let Some(&(last, _)) = take.checked_sub(1).and_then(|k| sizes.get(k)) else {
            return Ok(ItemPage {
                items: Vec::new(),
                next: None,
            });
        };
        // Exactly the ids the first statement chose (those still in the
        // state): an item that entered the state meanwhile must not take a
        // place on the page, pushing a chosen one past `next`.
        let sql = self.sql(&format!(
            "SELECT {ITEM_COLS}, {AVAILABLE_IN} FROM items
             WHERE ($1 = '' OR state = $1) AND id IN ({})
             ORDER BY id",
            placeholders(2, take)
        ));
        let mut q = sqlx::query(&sql).bind(state);
        for &(id, _) in &sizes[..take] {
            q = q.bind(id);
        }
        let rows = q.fetch_all(&self.pool).await?;
        let mut items = Vec::with_capacity(rows.len());
        for row in &rows {
            match item_from_row(row) {
                Ok(item) => items.push(item),
                Err(e) => {
                    // One bad row does not hide the rest of the queue.
                    self.metrics.unreadable_row("list");
                    tracing::warn!(
                        item_id = get::<i64>(row, "id").ok(),
                        error = %e,
                        "list: an item row cannot be read; it is left out of the page"
                    );
                }
            }
        }
        // The budget holds for the text answered, not only the text stored:
        // an error is stored as plain text and answered JSON-escaped (a
        // control character's 1 byte is 6), which the first statement
        // cannot count. A page over the budget as answered ends earlier
        // (at least one item); `next` is then its last item.
        let (mut answered, mut keep) = (0u64, 0usize);
        for item in &items {
            answered += answered_bytes(item);
            if keep > 0 && answered > budget {
                break;
            }
            keep += 1;
        }
        if keep < items.len() {
            items.truncate(keep);
            let next = items.last().map(|i| i.id);
            return Ok(ItemPage { items, next });
        }
        Ok(ItemPage {
            items,
            next: (sizes.len() > take).then_some(last),
        })
    }

    /// Reads the lease part of an item, its token hash and holder, who
    /// released it last, and the database clock, in one statement.
    async fn read_lease(&self, id: i64) -> Result<Option<LeaseRead>, StoreError> {
        let sql = self.sql(&format!(
            "SELECT state, epoch, attempts, max_redeliveries, heartbeat_at, token_hash, worker_id,
                    released_token_hash, released_by, settled_token_hash, settled_by,
                    retry_backoff_base_ms, retry_backoff_max_ms,
                    {} AS ttl_ms, {{now}} AS now_ms
             FROM items WHERE id = $1",
            lease_ttl_sql("$2")
        ));
        let row = sqlx::query(&sql)
            .bind(id)
            .bind(ms(self.settings.ttl_ms))
            .fetch_optional_done(&self.pool)
            .await?;
        row.map(|r| {
            Ok(LeaseRead {
                item: lease_item_from_row(&r)?,
                token_hash: get(&r, "token_hash")?,
                holder: get(&r, "worker_id")?,
                released_hash: get(&r, "released_token_hash")?,
                released_by: get(&r, "released_by")?,
                settled_hash: get(&r, "settled_token_hash")?,
                settled_by: get(&r, "settled_by")?,
                now_ms: get(&r, "now_ms")?,
                ttl_ms: to_u64(get(&r, "ttl_ms")?, "lease_ttl_ms")?,
                backoff: backoff_from_row(&r),
            })
        })
        .transpose()
    }
}

/// Why an operator's call found nothing to answer as sent again
/// ([`Store::operator_call_again`]).
pub(super) enum NotAgain {
    /// Item `id` is in `state` (its column's text, `"unreadable"` when that
    /// does not decode).
    In { id: i64, state: String },
    /// No such item, or the database failed.
    Failed(StoreError),
}

impl NotAgain {
    /// `conflict` naming the state the item is in and the ones the call starts
    /// `from`; the error as it is otherwise.
    pub(super) fn or_not(self, from: &str) -> StoreError {
        match self {
            NotAgain::In { id, state } => StoreError::rejected(
                ErrorCode::Conflict,
                format!("item {id} is {state}, not {from}"),
            ),
            NotAgain::Failed(e) => e,
        }
    }
}

/// The `state` column of an item row, when it is a state this build knows.
fn state_of(row: &AnyRow) -> Option<ItemState> {
    get::<String>(row, "state")
        .ok()
        .and_then(|s| ItemState::parse(&s))
}

/// `conflict`: a copy of a keyed claim (Request-Attempt number `attempt`)
/// that came after a later copy by its sender (number `answered`) was
/// answered.
fn superseded(attempt: i64, answered: i64) -> StoreError {
    StoreError::rejected(
        ErrorCode::Conflict,
        format!(
            "this copy of the claim (Request-Attempt {attempt}) came after copy {answered}: \
             it was refused and holds no lease"
        ),
    )
}

/// The refusal of an enqueue when no item id is left below
/// [`super::MAX_SAFE_INTEGER`] (nothing was added).
fn ids_exhausted() -> StoreError {
    StoreError::Corrupt(
        "no item id is left below 2^53 (Number.MAX_SAFE_INTEGER); nothing was added".into(),
    )
}
