//! Settling a lease: done, failed, blocked or paused, with the result as the
//! JSON text the worker sent. On PostgreSQL concurrent settles share one
//! statement (see `coalesce`); a settle sent again by the lease that settled
//! the item is answered as a replay and changes nothing, and another settle
//! by that lease is refused `already_settled` (see [`replay_or_rejection`]).

use super::FetchDone;
use std::collections::HashMap;
use std::sync::atomic::Ordering;

use agentstore_protocol::lease::{ItemState, SettleState};
use serde_json::value::RawValue;
use serde_json::Value;
use sqlx::any::AnyRow;
use tokio::sync::oneshot;

use super::coalesce::{self, by_call, for_each_call, rerun_call_by_call};
use super::fence::{distinct, not_found, placeholders, Fence};
use super::item::{landed_state, qualified_item_cols, same_json, Ended, Item, RawJson, ITEM_COLS};
use super::{detached, get, to_u32, to_u64, Backend, Store, StoreError};
use crate::tokens::{self, ct_eq};

/// A settle, waiting in the settle lane on PostgreSQL (`reply` set) or run
/// directly on SQLite.
pub(super) struct SettleJob {
    id: i64,
    hash: String,
    owner: Option<i64>,
    state: SettleState,
    result: Option<String>,
    error: Option<String>,
    /// What the settle asks for, as stored in `settled_request_hash`
    /// (see [`request_hash`]).
    request_hash: String,
    reply: Option<oneshot::Sender<Result<(Ended, bool), StoreError>>>,
}

/// A hash of what a settle asks for (its state, error and result text), so
/// a settle sent again is told apart from another one by the same lease
/// after the row moved on. Lengths first: no two requests give one text.
fn request_hash(state: &str, result: Option<&str>, error: Option<&str>) -> String {
    let part = |v: Option<&str>| {
        v.map_or(String::from("-"), |v| {
            [&v.len().to_string(), ":", v].concat()
        })
    };
    tokens::hash(&[state, "|", &part(error), "|", &part(result)].concat())
}

impl SettleJob {
    /// The state settled into, as stored.
    fn state_name(&self) -> &'static str {
        ItemState::from(self.state).as_str()
    }

    fn answer(self, out: Result<(Ended, bool), StoreError>) {
        if let Some(reply) = self.reply {
            let _ = reply.send(out);
        }
    }
}

impl Store {
    /// Settles `id` into `state`, storing `result` and `error`; releases the token.
    /// A NUL character in `error` (which PostgreSQL's `TEXT` cannot hold) is stored
    /// as U+FFFD on both backends, so a failure report is never lost to its content.
    ///
    /// Also says whether this was a replay (see `settled_before`),
    /// which changed nothing and must not be counted again. `result` is
    /// stored as it is written. A settle (or its replay) whose row does not
    /// decode is answered [`Ended::Unreadable`], never an error: it was
    /// applied (see `unreadable`).
    ///
    /// # Errors
    /// As [`Store::heartbeat`].
    pub async fn settle_reporting(
        &self,
        id: i64,
        token: &str,
        owner: Option<i64>,
        state: SettleState,
        result: Option<&RawValue>,
        error: Option<&str>,
    ) -> Result<(Ended, bool), StoreError> {
        let result = result.map(|r| r.get().to_owned());
        self.settle_text(id, token, owner, state, result, error)
            .await
    }

    /// [`Store::settle_reporting`] with the result as JSON text.
    async fn settle_text(
        &self,
        id: i64,
        token: &str,
        owner: Option<i64>,
        state: SettleState,
        result: Option<String>,
        error: Option<&str>,
    ) -> Result<(Ended, bool), StoreError> {
        let error = error.map(|e| e.replace('\0', "\u{FFFD}"));
        let request_hash = request_hash(
            ItemState::from(state).as_str(),
            result.as_deref(),
            error.as_deref(),
        );
        let job = SettleJob {
            id,
            hash: tokens::hash(token),
            owner,
            state,
            result,
            error,
            request_hash,
            reply: None,
        };
        if self.backend == Backend::Postgres {
            let (reply, answer) = oneshot::channel();
            if self.settles.push(
                &(),
                SettleJob {
                    reply: Some(reply),
                    ..job
                },
            ) {
                let store = self.clone();
                tokio::spawn(async move { store.run_settles().await });
            }
            return answer
                .await
                .unwrap_or(Err(StoreError::Database(sqlx::Error::WorkerCrashed)));
        }
        let store = self.clone();
        detached(async move { store.settle_one(&job).await }).await
    }

    /// [`Store::settle_reporting`] without the replay flag, the result given
    /// as a `Value` (stored as compact JSON).
    ///
    /// # Errors
    /// As [`Store::heartbeat`]; `Corrupt` when the settle WAS applied but
    /// the item's row does not decode ([`Store::settle_reporting`] answers
    /// [`Ended::Unreadable`] then).
    pub async fn settle(
        &self,
        id: i64,
        token: &str,
        owner: Option<i64>,
        state: SettleState,
        result: Option<&Value>,
        error: Option<&str>,
    ) -> Result<Item, StoreError> {
        self.settle_text(id, token, owner, state, result.map(Value::to_string), error)
            .await
            .and_then(|(ended, _)| ended.into_item())
    }

    /// The single-row settle statement (see [`Store::settle`]).
    async fn settle_one(&self, job: &SettleJob) -> Result<(Ended, bool), StoreError> {
        let sql = self.sql(&format!(
            "UPDATE items SET state = $3, result = $4, last_error = $5, token_hash = NULL, lease_ttl_ms = NULL, claim_key = NULL,
                 settled_token_hash = $2, settled_request_hash = $7, settled_by = worker_id,
                 settled_state = $3, settled_epoch = epoch, settled_attempts = attempts,
                 worker_id = NULL, heartbeat_at = NULL,
                 updated_at = {{now}}
             WHERE id = $1 AND state = 'running' AND token_hash = $2
               AND ($6 = 0 OR worker_id = $6)
             RETURNING {ITEM_COLS}"
        ));
        let row = sqlx::query(&sql)
            .bind(job.id)
            .bind(&job.hash)
            .bind(job.state_name())
            .bind(job.result.as_deref())
            .bind(job.error.as_deref())
            .bind(job.owner.unwrap_or(0))
            .bind(&job.request_hash)
            .fetch_optional_done(&self.pool)
            .await?;
        match row {
            Some(row) => {
                self.metrics.settled(&queue_of(&row), job.state);
                let state = Some(job.state.into());
                Ok((self.ended(&row, job.id, state, "settle", true), false))
            }
            None => self.settled_before(job).await.map(|item| (item, true)),
        }
    }

    /// A settle that matched no running lease (see [`replay_or_rejection`]).
    async fn settled_before(&self, job: &SettleJob) -> Result<Ended, StoreError> {
        self.told_or_skipped(&[job], false)
            .await
            .pop()
            .flatten()
            .unwrap_or_else(|| Err(not_found(job.id)))
    }

    /// Settles that matched no running lease, each answered by
    /// [`replay_or_rejection`], from ONE read of every item they name, in
    /// call order. With `skipped` (the settles a coalesced statement did not
    /// apply), a settle whose item the read finds
    /// still running under its lease (what the statement's fence asks for)
    /// gets `None`: the statement passed over its row because another
    /// session held it locked (`FOR UPDATE SKIP LOCKED`, see
    /// [`Store::settle_batch`]), and it must be run alone.
    async fn told_or_skipped(
        &self,
        jobs: &[&SettleJob],
        skipped: bool,
    ) -> Vec<Option<Result<Ended, StoreError>>> {
        if jobs.is_empty() {
            return Vec::new();
        }
        let ids = distinct(jobs.iter().map(|job| job.id));
        let sql = format!(
            "SELECT {ITEM_COLS}, token_hash, settled_token_hash, settled_by, settled_request_hash,
                 settled_state, settled_epoch, settled_attempts, cancelled_epoch
             FROM items WHERE id IN ({})",
            placeholders(1, ids.len())
        );
        let mut q = sqlx::query(&sql);
        for id in &ids {
            q = q.bind(*id);
        }
        let rows = match q.fetch_all(&self.pool).await {
            Ok(rows) => rows,
            Err(e) => {
                let e = StoreError::from(e);
                return jobs.iter().map(|_| Some(Err(for_each_call(&e)))).collect();
            }
        };
        let mut by_id = HashMap::new();
        for row in &rows {
            match get::<i64>(row, "id") {
                Ok(id) => by_id.insert(id, row),
                Err(e) => return jobs.iter().map(|_| Some(Err(for_each_call(&e)))).collect(),
            };
        }
        jobs.iter()
            .map(|job| match by_id.get(&job.id) {
                Some(row) if skipped && holds(job, row) => None,
                Some(row) => Some(replay_or_rejection(self, job, row)),
                None => Some(Err(not_found(job.id))),
            })
            .collect()
    }

    /// Drains the settle lane (PostgreSQL): each batch is ONE statement whose
    /// rows each carry the fence of one settle (id, token hash, holder), as
    /// [`Store::settle_one`] does; the settles it did not apply are read
    /// again, together in one statement, to tell why (nothing was written
    /// for them). The statement passes over a row another session holds
    /// locked (see [`Store::settle_batch`]): such a settle is run alone in a
    /// task of its own, waiting for that row as an uncoalesced settle would
    /// (at most `lock_timeout`, then `503`; see [`Store::settle_alone`] for
    /// the bound on such waits), while the rest of its batch is
    /// answered at once and the lane goes on. A batch whose statement
    /// the database refused (see `rerun_call_by_call`) is retried settle by settle, each
    /// in a task of its own; any
    /// other failure may come after the commit, and is every settle's answer
    /// (a settle run again would find its own commit and be answered as a
    /// replay, which it is not).
    async fn run_settles(self) {
        let _runner = self.settles.runner(&());
        while let Some(batch) = self.settles.next(&(), coalesce::MAX_BATCH) {
            // A lone settle too: run as `settle_one`, its wait for a locked
            // row would hold every settle that joins the lane meanwhile.
            match self.settle_batch(&batch).await {
                Ok(applied) => {
                    if batch.len() > 1 {
                        self.coalesced
                            .fetch_add(batch.len() as u64, Ordering::Relaxed);
                    }
                    // Every settle not applied, told in one read.
                    let missed: Vec<&SettleJob> = batch
                        .iter()
                        .zip(&applied)
                        .filter_map(|(job, item)| item.is_none().then_some(job))
                        .collect();
                    let mut told = self.told_or_skipped(&missed, true).await.into_iter();
                    for (job, item) in batch.into_iter().zip(applied) {
                        let out = match item {
                            Some(ended) => Ok((ended, false)),
                            None => match told.next() {
                                Some(Some(told)) => told.map(|item| (item, true)),
                                Some(None) => {
                                    self.settle_alone(job);
                                    continue;
                                }
                                None => Err(not_found(job.id)),
                            },
                        };
                        job.answer(out);
                    }
                }
                Err(e) if rerun_call_by_call(&e) => {
                    for job in batch {
                        self.settle_alone(job);
                    }
                }
                Err(e) => {
                    for job in batch {
                        job.answer(Err(for_each_call(&e)));
                    }
                }
            }
        }
    }

    /// Runs `job` by itself ([`Store::settle_one`]) in a task of its own and
    /// answers it, so that its wait for a locked row holds up no other call.
    /// It holds one of the few permits for such waits while it runs
    /// ([`Store::alone`]): settles passed over for many locked rows take at
    /// most a quarter of the pool, and one that gets no permit within the
    /// effective `lock_timeout` is answered `503`, nothing written.
    fn settle_alone(&self, job: SettleJob) {
        let store = self.clone();
        tokio::spawn(async move {
            let out = store.alone(store.settle_one(&job)).await;
            job.answer(out);
        });
    }

    /// The coalesced settle statement of [`Store::run_settles`]: the settles
    /// it applied, in call order (`None` for the others). It first locks the
    /// batch's rows with `FOR UPDATE SKIP LOCKED`, each fenced as its settle
    /// (id, token hash, `running`, holder), so a settle naming a row its
    /// caller does not hold locks nothing (a claim of that row, or its
    /// holder's settle, is never passed over for it), and writes only those: a
    /// row another session holds (an admin's `psql` left in a transaction)
    /// would otherwise hold the whole statement, every settle of the batch,
    /// for `lock_timeout` and then fail them all `503`.
    async fn settle_batch(&self, batch: &[SettleJob]) -> Result<Vec<Option<Ended>>, StoreError> {
        let values: Vec<String> = (0..batch.len())
            .map(|k| {
                let p = 8 * k + 1;
                format!(
                    "(${p}::BIGINT, ${}::BIGINT, ${}::TEXT, ${}::TEXT, ${}::TEXT, ${}::TEXT, ${}::BIGINT, ${}::TEXT)",
                    p + 1,
                    p + 2,
                    p + 3,
                    p + 4,
                    p + 5,
                    p + 6,
                    p + 7
                )
            })
            .collect();
        // One row per settle; a batch naming an item twice updates it once
        // (PostgreSQL applies the first matching source row), and the other
        // settle is classified afterwards, as if it had come second.
        let sql = self.sql(&format!(
            "WITH v(n, id, hash, state, result, last_error, owner, request_hash) AS (VALUES {values}),
             locked AS MATERIALIZED (
                 SELECT i.id FROM items AS i
                 WHERE i.state = 'running'
                   AND EXISTS (SELECT 1 FROM v
                               WHERE v.id = i.id AND v.hash = i.token_hash
                                 AND (v.owner = 0 OR i.worker_id = v.owner))
                 FOR UPDATE SKIP LOCKED
             )
             UPDATE items AS i SET state = v.state, result = v.result, last_error = v.last_error,
                 token_hash = NULL, lease_ttl_ms = NULL, claim_key = NULL, settled_token_hash = v.hash,
                 settled_request_hash = v.request_hash, settled_by = i.worker_id,
                 settled_state = v.state, settled_epoch = i.epoch, settled_attempts = i.attempts,
                 worker_id = NULL,
                 heartbeat_at = NULL, updated_at = {{now}}
             FROM v
             WHERE i.id = v.id AND i.id IN (SELECT id FROM locked)
               AND i.state = 'running' AND i.token_hash = v.hash
               AND (v.owner = 0 OR i.worker_id = v.owner)
             RETURNING v.n AS n, {cols}",
            values = values.join(", "),
            cols = qualified_item_cols(),
        ));
        let mut q = sqlx::query(&sql);
        for (k, job) in batch.iter().enumerate() {
            q = q
                .bind(k as i64 + 1)
                .bind(job.id)
                .bind(&job.hash)
                .bind(job.state_name())
                .bind(job.result.as_deref())
                .bind(job.error.as_deref())
                .bind(job.owner.unwrap_or(0))
                .bind(&job.request_hash);
        }
        let rows = q.fetch_all(&self.pool).await?;
        // Committed: one row per settle applied, counted by the call its `n`
        // names whether or not the rest of the row decodes.
        let applied = rows.iter().filter_map(|row| {
            let n: i64 = get(row, "n").ok()?;
            Some((row, batch.get(usize::try_from(n - 1).ok()?)?))
        });
        for (row, job) in applied {
            self.metrics.settled(&queue_of(row), job.state);
        }
        by_call(&rows, batch.len(), |k, row| {
            let job = &batch[k];
            self.ended(row, job.id, Some(job.state.into()), "settle", true)
        })
    }
}

/// The queue of an item's `row` a settle or release returned, for the
/// metrics' `queue` label; one that does not decode counts under the
/// queues without a label of their own.
pub(super) fn queue_of(row: &AnyRow) -> String {
    get::<String>(row, "queue")
        .unwrap_or_else(|_| agentstore_protocol::lease::OTHER_QUEUES.to_owned())
}

/// Whether `row` is still held by `job`'s lease: running under its token,
/// by its worker if it names one (the fence of [`Store::settle_one`]).
fn holds(job: &SettleJob, row: &AnyRow) -> bool {
    let running = get::<String>(row, "state").is_ok_and(|s| s == "running");
    let token = get::<Option<String>>(row, "token_hash")
        .ok()
        .flatten()
        .is_some_and(|t| ct_eq(&t, &job.hash));
    let worker = get::<Option<i64>>(row, "worker_id").ok().flatten();
    running && token && (job.owner.is_none() || worker == job.owner)
}

/// A settle that matched no running lease, judged from its item's row: when
/// the same lease (token) made the item's last settle with this very
/// settle — same state, result and error; the first was applied and its
/// answer lost — it is answered with the item as that settle left it (see
/// [`as_settled`]: an operator may have resumed a `paused` item since, or
/// requeued a failed one, and another lease may hold or have ended it), so the holder can retry a settle safely (an
/// idempotent retry, as with an idempotency key: the same key with other
/// content is refused). Another settle by that same lease (another state,
/// result or error) is refused `already_settled`, naming the state the
/// first one set, also after the item moved on, as long as no later holder
/// has settled it. Otherwise the usual rejection (`claim_lost`,
/// `state_conflict`, …). Read-only: a replay changes nothing. Told from the
/// fence columns, the result and the error only, so a row whose payload does
/// not decode is still answered (as [`Ended::Unreadable`]).
fn replay_or_rejection(store: &Store, job: &SettleJob, row: &AnyRow) -> Result<Ended, StoreError> {
    let settled: Option<String> = get(row, "settled_token_hash")?;
    let settled_by: Option<i64> = get(row, "settled_by")?;
    let asked: Option<String> = get(row, "settled_request_hash")?;
    let state: String = get(row, "state")?;
    // The same holder only: a worker's replay must come from the worker
    // that settled (settle_one's owner fence), an operator's from anyone.
    let same_lease = settled.as_deref().is_some_and(|s| ct_eq(s, &job.hash))
        && (job.owner.is_none() || settled_by == job.owner);
    // The same request, byte for byte: a replay even after the item moved
    // on (resumed, claimed, settled by no one else since).
    // Whether the item left the state this settle set: another state, a
    // lease holding it, or a claim since (the epoch passed the settle's: an
    // operator's requeue lets a later lease's ending bring the item back to
    // the same state, with that lease's result and error).
    let settled_epoch: Option<i64> = get(row, "settled_epoch")?;
    // An operator's cancel under the settle's epoch came after it (a cancel
    // of the running lease would have refused the settle): the `blocked`
    // or `paused` item it left is `failed` now, with the cancel's reason,
    // at the same epoch.
    let cancelled_since =
        settled_epoch.is_some() && get::<Option<i64>>(row, "cancelled_epoch")? == settled_epoch;
    let moved_on = state != job.state_name()
        || cancelled_since
        || get::<Option<String>>(row, "token_hash")?.is_some()
        || settled_epoch.is_some_and(|e| get::<i64>(row, "epoch").map_or(true, |now| now != e));
    if same_lease && asked.as_deref() == Some(job.request_hash.as_str()) {
        // What another holder wrote since (its result, its error) is not
        // this caller's to read: the settle's own, which this very request
        // wrote (the stored text is the same while the item has not moved
        // on).
        let written = moved_on.then(|| {
            let result = job.result.clone().and_then(|r| RawJson::from_text(r).ok());
            (result, job.error.clone())
        });
        return Ok(as_settled(store, job, row, written));
    }
    // The same request in substance while the item is as it left it (a
    // result re-serialised with other spacing; a settle made before the
    // request hash was kept).
    if same_lease && !moved_on {
        let result: Option<String> = get(row, "result")?;
        let last_error: Option<String> = get(row, "last_error")?;
        let same_result = match (&result, &job.result) {
            (None, None) => true,
            (Some(stored), Some(sent)) => same_json(stored, sent),
            _ => false,
        };
        if same_result && last_error == job.error {
            return Ok(as_settled(store, job, row, None));
        }
    }
    // Another settle by the lease whose own settle landed (its answer
    // lost: `try { settle('done') } catch { settle('failed') }`): not
    // `claim_lost` ("nothing was written under it"), which this lease's
    // first settle was; nothing is written now either.
    if same_lease {
        return Err(StoreError::AlreadySettled {
            id: job.id,
            state: landed_state(row)?,
        });
    }
    Err(Fence::from_row(row)?.rejection(job.id, &job.hash, job.owner))
}

/// The answer to a settle replayed by its lease (see [`replay_or_rejection`]):
/// the item as that settle left it, nothing of a lease that holds or held
/// it since. The item's shape (`ItemView`, as a first settle's answer, so a
/// client reads both alike), with:
/// - `id`, `queue`, `payload`, `max_redeliveries`: the row's (a lease
///   changes none of them);
/// - `state`: the state this settle set; `worker_id`: none (a settle ends
///   its lease);
/// - `result`, `last_error`: `written` (this settle's, when the item moved
///   on), else the row's (the same text: nothing wrote them since);
/// - `epoch`, `attempts`: as they were when this settle landed
///   (`settled_epoch`, `settled_attempts`, migration 22: the settling
///   lease's epoch, and the attempts ended before it), not a later lease's
///   higher ones. A settle made before migration 22 recorded them has
///   none: the row's stand in (right while the item has not moved on).
///
/// [`Ended::Unreadable`] when the row or a recorded counter does not decode.
fn as_settled(
    store: &Store,
    job: &SettleJob,
    row: &AnyRow,
    written: Option<(Option<RawJson>, Option<String>)>,
) -> Ended {
    let settled = Some(job.state.into());
    let mut item = match store.ended(row, job.id, settled, "settle", false) {
        Ended::Item(item) => item,
        unreadable => return unreadable,
    };
    let counters = || -> Result<_, StoreError> {
        let epoch: Option<i64> = get(row, "settled_epoch")?;
        let attempts: Option<i64> = get(row, "settled_attempts")?;
        Ok((
            epoch.map(|e| to_u64(e, "settled_epoch")).transpose()?,
            attempts
                .map(|a| to_u32(a, "settled_attempts"))
                .transpose()?,
        ))
    };
    match counters() {
        Ok((epoch, attempts)) => {
            item.epoch = epoch.unwrap_or(item.epoch);
            item.attempts = attempts.unwrap_or(item.attempts);
        }
        Err(e) => {
            tracing::warn!(item = job.id, error = %e, "a settle's recorded counters do not decode");
            return Ended::Unreadable {
                id: job.id,
                state: settled,
            };
        }
    }
    item.state = job.state.into();
    item.worker_id = None;
    if let Some((result, last_error)) = written {
        item.result = result;
        item.last_error = last_error;
    }
    Ended::Item(item)
}
