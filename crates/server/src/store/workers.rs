//! Workers and their credentials: enrollment tokens, refresh tokens, access tokens.
//!
//! The unauthenticated calls (enroll, refresh) first READ the token's row by its
//! selector and compare the verifier hash in constant time; only a match opens
//! the write transaction, so random or forged tokens never take SQLite's single
//! writer lock. Inside it, single-use tokens are burnt by a conditional
//! `UPDATE … WHERE used_at IS NULL AND verifier_hash = …`, so two concurrent uses
//! serialize on that row and exactly one sees it unused.

use agentstore_protocol::lease::{Role, WorkerCredentials};
use agentstore_protocol::ErrorCode;
use sqlx::any::AnyRow;
use sqlx::{Any, Transaction};

use super::{ms, Attempt, Store, StoreError};
use crate::tokens::{self, ct_eq, Kind, Presented, Secret};

fn unauthorized(what: &str) -> StoreError {
    StoreError::rejected(
        ErrorCode::Unauthorized,
        format!("{what} is invalid, expired or already used"),
    )
}

/// An enrolled caller as its access token names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The worker (or producer) id.
    pub worker_id: i64,
    /// What it may do.
    pub role: Role,
    /// The queues it may act on (`"*"` = every queue).
    pub queues: Vec<String>,
}

/// The principal of an access-token row.
///
/// # Errors
/// [`StoreError::Corrupt`] when the role or queues do not decode, or when
/// `worker_id` is not positive: the lease fences and idempotency scopes
/// write the admin (who has no worker id) as `0`, so a worker or producer
/// row with id `0` would act as the admin there. Ids come from the
/// `workers` table's auto-increment key and start at 1; a row with another
/// id was written by hand, and its token is refused rather than trusted.
fn principal(worker_id: i64, role: &str, queues: &str) -> Result<Principal, StoreError> {
    if worker_id <= 0 {
        return Err(StoreError::Corrupt(format!(
            "worker id {worker_id}: ids start at 1 (0 stands for the admin)"
        )));
    }
    let (role, queues) = scope(role, queues)?;
    Ok(Principal {
        worker_id,
        role,
        queues,
    })
}

/// A stored scope: its role and queues (a JSON array of names).
///
/// # Errors
/// [`StoreError::Corrupt`] when either does not decode.
fn scope(role: &str, queues: &str) -> Result<(Role, Vec<String>), StoreError> {
    Ok((
        Role::parse(role).ok_or_else(|| StoreError::Corrupt(format!("role {role:?}")))?,
        serde_json::from_str(queues).map_err(|e| StoreError::Corrupt(format!("queues: {e}")))?,
    ))
}

impl Store {
    /// Creates a single-use enrollment token valid for `expires_in_ms` (default from
    /// [`super::Settings`]) that enrolls a credential of `role` scoped to `queues`.
    /// The secret is returned once and stored hashed. The caller validates the
    /// arguments (the route checks their ranges).
    ///
    /// # Errors
    /// The database failed.
    pub async fn create_enrollment_token(
        &self,
        expires_in_ms: Option<u64>,
        role: Role,
        queues: &[String],
    ) -> Result<(Secret, u64), StoreError> {
        let ttl = expires_in_ms.unwrap_or(self.settings.enrollment_ttl_ms);
        let cred = tokens::new_credential(Kind::Enrollment);
        let sql = self.sql(
            "INSERT INTO enrollment_tokens (selector, verifier_hash, created_at, expires_at, role, queues)
             VALUES ($1, $2, {now}, {now} + $3, $4, $5)",
        );
        sqlx::query(&sql)
            .bind(&cred.selector)
            .bind(&cred.verifier_hash)
            .bind(ms(ttl))
            .bind(role.as_str())
            .bind(serde_json::to_string(queues).unwrap_or_else(|_| "[]".into()))
            .execute(&self.pool)
            .await?;
        Ok((cred.secret, ttl))
    }

    /// Revokes the enrollment token `token` before its use, for an operator
    /// (`POST /v1/admin/enrollment-tokens/revoke`): a later enrollment with it
    /// is refused `401` as for any revoked token. Calling it again changes
    /// nothing. Decided in one write transaction on the token's row, the one
    /// an enrollment burns under the condition `used_at IS NULL AND revoked
    /// = 0`: of a revoke and an enrollment racing, exactly one wins (the
    /// enrollment `201` and the revoke `409`, or the revoke and the
    /// enrollment `401`). An expired token is revoked as well (it enrolls
    /// nothing either way) until the retention purge removes its row.
    ///
    /// # Errors
    /// `not_found` when no enrollment token matches `token` (malformed, a
    /// wrong secret, or its row purged); `conflict` when it was used
    /// already, naming the worker it enrolled: revoking that worker
    /// ([`Store::revoke_credentials`]) is the operator's own decision, not
    /// taken here.
    pub async fn revoke_enrollment_token(&self, token: &str) -> Result<(), StoreError> {
        let unknown = || {
            StoreError::rejected(
                ErrorCode::NotFound,
                "no enrollment token matches this token",
            )
        };
        let presented = tokens::parse_credential(Kind::Enrollment, token).ok_or_else(unknown)?;
        let mut tx = self.begin_write().await?;
        let done = sqlx::query(
            "UPDATE enrollment_tokens SET revoked = 1
             WHERE selector = $1 AND verifier_hash = $2 AND used_at IS NULL",
        )
        .bind(&presented.selector)
        .bind(&presented.verifier_hash)
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() == 1 {
            tx.commit().await?;
            return Ok(());
        }
        #[expect(
            clippy::disallowed_methods,
            reason = "a read: the transaction is rolled back after it"
        )]
        let used: Option<(Option<i64>,)> = sqlx::query_as(
            "SELECT worker_id FROM enrollment_tokens WHERE selector = $1 AND verifier_hash = $2",
        )
        .bind(&presented.selector)
        .bind(&presented.verifier_hash)
        .fetch_optional(&mut *tx)
        .await?;
        tx.rollback().await?;
        match used {
            None => Err(unknown()),
            Some((worker,)) => Err(StoreError::rejected(
                ErrorCode::Conflict,
                match worker {
                    Some(id) => format!(
                        "this enrollment token was used already: it enrolled worker {id} \
                         (revoke that worker with POST /v1/admin/workers/{id}/revoke)"
                    ),
                    None => "this enrollment token was used already".to_owned(),
                },
            )),
        }
    }

    /// Reads the unexpired row of `table` for `presented` (used or not) and
    /// compares its verifier in constant time; no write happens here.
    async fn valid_token_row(
        &self,
        table: &str,
        extra: &str,
        presented: &Presented,
    ) -> Result<Option<AnyRow>, StoreError> {
        let sql = self.sql(&format!(
            "SELECT verifier_hash, {extra} FROM {table}
             WHERE selector = $1 AND expires_at > {{now}}"
        ));
        #[expect(
            clippy::disallowed_methods,
            reason = "a read: no write is committed when it stops early"
        )]
        let row = sqlx::query(&sql)
            .bind(&presented.selector)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.filter(|r| {
            super::get::<String>(r, "verifier_hash")
                .is_ok_and(|h| ct_eq(&h, &presented.verifier_hash))
        }))
    }

    /// Uses a single-use token of `kind`: finds its row (with the `extra`
    /// columns) and checks the verifier WITHOUT writing; only then begins the
    /// write transaction and burns it there.
    ///
    /// A token already used is a replay (its answer was lost, the caller sends
    /// it again) when it was used less than [`super::Settings::replay_grace_ms`]
    /// ago, has not been revoked, and the credentials that use issued have not
    /// refreshed: those credentials are revoked here (the refresh token kept
    /// as revoked, so a later use of it is detected), and the caller issues
    /// new ones for the same worker (`Some(worker_id)`). Any other reuse, or
    /// any use of a revoked token, is refused and revokes every credential of
    /// the worker, its enrollment token included (reuse detection, RFC 9700
    /// §4.14.2): a token that two parties hold is a stolen one, and the
    /// server cannot tell which party is legitimate. Every credential change
    /// of a worker first locks its `workers` row, so concurrent refreshes,
    /// replays and revocations of one worker apply one after another on both
    /// backends: exactly one refresh token of a worker is usable at any time
    /// (an access token issued before a refresh lives out its lifetime, as
    /// with any rotation, unless the worker is revoked).
    ///
    /// `attempt` is the request's `Request-Attempt` (see [`Attempt`]): the
    /// highest number answered per token AND sender is remembered (table
    /// `token_attempts`, purged with the token). A copy of a used token
    /// whose own sender had a higher number answered is an earlier copy
    /// that reached the server late (its client gave up on it and sent the
    /// token again, and that later copy was answered): it is refused and
    /// changes nothing, whatever other senders did with the token since, so
    /// it can revoke neither the credentials its own later copy issued nor
    /// those another sender's replay got (a reloaded page that sent the
    /// token it had saved), and it trips no reuse detection once those
    /// credentials refreshed. (Judged against the last use alone, as
    /// before, a late copy arriving after another sender's replay was taken
    /// for a replay: it revoked that sender's credentials, whose next
    /// refresh then revoked the whole worker.) A copy of a sender with no
    /// higher number answered replays, or is reuse, as before. The last
    /// use's pair (`used_attempt`, `used_sender`) is still written and
    /// read, for a use made by a binary without the table.
    ///
    /// A copy is late only within the replay grace of the token's first
    /// use (which no later copy moves): a held-up copy arrives within its
    /// request's timeout (the SDK's 30 s by default; an app that sets it
    /// above the grace has a copy held up past it taken as reuse). The numbers are the client's word, and
    /// a sender id is shown in every request: whoever holds a stolen token
    /// can use it first in its victim's name with the highest number there
    /// is. Within the grace that turns the victim's copies away (`409`)
    /// without revoking anything; after it the victim's use is reuse and
    /// revokes the worker, the thief's credentials included. (Judged
    /// without that limit, the forged number kept reuse from being detected
    /// for as long as the token was kept: `409` for good.)
    ///
    /// # Errors
    /// `unauthorized` when the token is malformed, wrong, expired, revoked or
    /// reused outside a replay; `conflict` for a late copy.
    async fn use_once(
        &self,
        kind: Kind,
        token: &str,
        extra: &str,
        attempt: Option<&Attempt>,
    ) -> Result<(AnyRow, Option<i64>, Presented, Transaction<'static, Any>), StoreError> {
        let (table, what) = token_table(kind);
        let presented = tokens::parse_credential(kind, token).ok_or_else(|| unauthorized(what))?;
        let Some(row) = self.valid_token_row(table, extra, &presented).await? else {
            return Err(unauthorized(what));
        };
        let mut tx = self.begin_write().await?;
        let known: Option<i64> = super::get(&row, "worker_id")?;
        if let Some(worker_id) = known {
            lock_worker(&mut tx, worker_id).await?;
        }
        let burn = self.sql(&format!(
            "UPDATE {table} SET used_at = {{now}}, used_attempt = CAST($3 AS BIGINT),
                 used_sender = CAST($4 AS TEXT)
             WHERE selector = $1 AND verifier_hash = $2 AND used_at IS NULL AND revoked = 0
               AND expires_at > {{now}}"
        ));
        let done = sqlx::query(&burn)
            .bind(&presented.selector)
            .bind(&presented.verifier_hash)
            .bind(attempt.map(|a| a.n))
            .bind(attempt.map(|a| a.sender.as_str()))
            .execute(&mut *tx)
            .await?;
        if done.rows_affected() == 1 {
            if let Some(a) = attempt {
                self.see_token_attempt(&mut tx, kind, &presented.selector, a)
                    .await?;
            }
            return Ok((row, None, presented, tx));
        }
        // Used or revoked before (maybe by a use that committed while this
        // one waited): read it again, with the worker it enrolled.
        let mut used = self.read_used(&mut tx, table, &presented).await?;
        if let Some((Some(worker_id), ..)) = used {
            if known != Some(worker_id) {
                // The worker was not known when this transaction began (an
                // enrollment token's first use committed meanwhile). Start
                // over with the worker's lock taken first — the order every
                // other credential change uses, so none deadlocks with this
                // one — and decide on what is current under it.
                tx.rollback().await?;
                tx = self.begin_write().await?;
                lock_worker(&mut tx, worker_id).await?;
                used = self.read_used(&mut tx, table, &presented).await?;
            }
        }
        let Some((Some(worker_id), revoked, recent, used_attempt, used_sender)) = used else {
            tx.rollback().await?;
            return Err(unauthorized(what));
        };
        // Late only within the replay grace: a copy held up in the network
        // reaches the server within its request's timeout (30 s by default,
        // under the grace; a longer one set by the app is not waited for). After it, a number stored for a sender
        // proves nothing (whoever used the token first may have sent any
        // number in that sender's name, which every request shows): the
        // copy is reuse, whatever number came first.
        if revoked == 0 && recent == 1 {
            if let Some(a) = attempt {
                let stored = self
                    .stored_token_attempt(&mut tx, kind, &presented.selector, a)
                    .await?;
                if stored.is_some_and(|n| n > a.n)
                    || a.is_late(used_sender.as_deref(), used_attempt)
                {
                    tx.rollback().await?;
                    return Err(StoreError::rejected(
                        ErrorCode::Conflict,
                        "a later copy of this request by its sender (a higher Request-Attempt) \
                         was answered first: nothing was changed",
                    ));
                }
            }
        }
        #[expect(
            clippy::disallowed_methods,
            reason = "a read: no write is committed when it stops early"
        )]
        let moved_on: (i64,) = sqlx::query_as(
            "SELECT COUNT(*) FROM refresh_tokens
             WHERE parent = $1 AND used_at IS NOT NULL AND revoked = 0",
        )
        .bind(&presented.selector)
        .fetch_one(&mut *tx)
        .await?;
        if revoked == 0 && recent == 1 && moved_on.0 == 0 {
            if let Some(a) = attempt {
                self.see_token_attempt(&mut tx, kind, &presented.selector, a)
                    .await?;
                let raise = self.sql(&format!(
                    "UPDATE {table} SET used_attempt = $2, used_sender = $3 WHERE selector = $1"
                ));
                sqlx::query(&raise)
                    .bind(&presented.selector)
                    .bind(a.n)
                    .bind(a.sender.as_str())
                    .execute(&mut *tx)
                    .await?;
            }
            let revoke = self.sql(
                "UPDATE refresh_tokens SET revoked = 1, used_at = COALESCE(used_at, {now})
                 WHERE parent = $1",
            );
            sqlx::query(&revoke)
                .bind(&presented.selector)
                .execute(&mut *tx)
                .await?;
            sqlx::query("DELETE FROM access_tokens WHERE parent = $1")
                .bind(&presented.selector)
                .execute(&mut *tx)
                .await?;
            return Ok((row, Some(worker_id), presented, tx));
        }
        self.revoke_worker(&mut tx, worker_id).await?;
        self.commit_revoking(tx, worker_id).await?;
        Err(unauthorized(what))
    }

    /// The highest `Request-Attempt` number answered for the single-use
    /// token of `kind` with `selector` to the sender of `attempt` (see
    /// `use_once`), if any.
    async fn stored_token_attempt(
        &self,
        tx: &mut Transaction<'static, Any>,
        kind: Kind,
        selector: &str,
        attempt: &Attempt,
    ) -> Result<Option<i64>, StoreError> {
        #[expect(
            clippy::disallowed_methods,
            reason = "a read: no write is committed when it stops early"
        )]
        let row: Option<(i64,)> = sqlx::query_as(
            "SELECT attempt FROM token_attempts
             WHERE kind = $1 AND selector = $2 AND sender = $3",
        )
        .bind(kind_name(kind))
        .bind(selector)
        .bind(attempt.sender.as_str())
        .fetch_optional(&mut **tx)
        .await?;
        Ok(row.map(|(n,)| n))
    }

    /// Raises the number remembered for the token of `kind` with `selector`
    /// and the sender of `attempt` to its number (never lowers it), kept
    /// until the token expires (see `use_once`). The caller's transaction
    /// answers the use.
    async fn see_token_attempt(
        &self,
        tx: &mut Transaction<'static, Any>,
        kind: Kind,
        selector: &str,
        attempt: &Attempt,
    ) -> Result<(), StoreError> {
        let (table, _) = token_table(kind);
        let sql = format!(
            "INSERT INTO token_attempts (kind, selector, sender, attempt, expires_at)
             SELECT $1, $2, $3, $4, expires_at FROM {table} WHERE selector = $2
             ON CONFLICT (kind, selector, sender) DO UPDATE
                 SET attempt = CASE WHEN token_attempts.attempt < excluded.attempt
                                    THEN excluded.attempt ELSE token_attempts.attempt END"
        );
        sqlx::query(&sql)
            .bind(kind_name(kind))
            .bind(selector)
            .bind(attempt.sender.as_str())
            .bind(attempt.n)
            .execute(&mut **tx)
            .await?;
        Ok(())
    }

    /// The worker a used token of `table` belongs to, whether it is revoked,
    /// whether it was used within the replay grace (1) or not (0), and the
    /// `Request-Attempt` of its last use (number, sender).
    #[expect(
        clippy::disallowed_methods,
        reason = "a read: no write is committed when it stops early"
    )]
    async fn read_used(
        &self,
        tx: &mut Transaction<'static, Any>,
        table: &str,
        presented: &Presented,
    ) -> Result<Option<(Option<i64>, i64, i64, Option<i64>, Option<String>)>, StoreError> {
        let sql = self.sql(&format!(
            "SELECT worker_id, revoked,
                 CAST(CASE WHEN used_at > {{now}} - $3 THEN 1 ELSE 0 END AS BIGINT) AS recent,
                 used_attempt, used_sender
             FROM {table}
             WHERE selector = $1 AND verifier_hash = $2 AND expires_at > {{now}}"
        ));
        Ok(sqlx::query_as(&sql)
            .bind(&presented.selector)
            .bind(&presented.verifier_hash)
            .bind(ms(self.settings.replay_grace_ms))
            .fetch_optional(&mut **tx)
            .await?)
    }

    /// Revokes every credential of `worker_id`: its access tokens go, its
    /// refresh and enrollment tokens stay as revoked (so a later use of one
    /// is still recognised as reuse). The caller holds the worker's lock.
    async fn revoke_worker(
        &self,
        tx: &mut Transaction<'static, Any>,
        worker_id: i64,
    ) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM access_tokens WHERE worker_id = $1")
            .bind(worker_id)
            .execute(&mut **tx)
            .await?;
        let refresh = self.sql(
            "UPDATE refresh_tokens SET revoked = 1, used_at = COALESCE(used_at, {now})
             WHERE worker_id = $1",
        );
        sqlx::query(&refresh)
            .bind(worker_id)
            .execute(&mut **tx)
            .await?;
        sqlx::query("UPDATE enrollment_tokens SET revoked = 1 WHERE worker_id = $1")
            .bind(worker_id)
            .execute(&mut **tx)
            .await?;
        Ok(())
    }

    /// Revokes every credential of worker (or producer) `worker_id` at
    /// once, for an operator (`POST /v1/admin/workers/{id}/revoke`): its
    /// access tokens are deleted, its refresh and enrollment tokens kept as
    /// revoked, so a later use of one is refused as reuse, and it cannot
    /// enroll or refresh again (a new enrollment makes a new worker). Its
    /// leases are left as they are: unable to heartbeat, they expire after
    /// their TTL and the reaper takes them over. Under the worker's lock,
    /// as every credential change: a refresh racing it either commits first
    /// (and what it issued is revoked here) or is refused. Counted as a
    /// revocation ([`Store::revocations`]), so this instance's cache of
    /// verified tokens drops the worker's entries at once; other instances
    /// within that cache's `MAX_AGE`. Calling it again changes nothing.
    ///
    /// # Errors
    /// `not_found` when no worker has that id.
    pub async fn revoke_credentials(&self, worker_id: i64) -> Result<(), StoreError> {
        let mut tx = self.begin_write().await?;
        if !lock_worker(&mut tx, worker_id).await? {
            tx.rollback().await?;
            return Err(StoreError::rejected(
                ErrorCode::NotFound,
                format!("worker {worker_id} does not exist"),
            ));
        }
        self.revoke_worker(&mut tx, worker_id).await?;
        self.commit_revoking(tx, worker_id).await
    }

    /// Enrolls a worker (or producer: the token's role) with a single-use
    /// enrollment token: creates it, burns the token and issues credentials in
    /// ONE transaction, opened only after the token was found and matched. The
    /// same token sent again because the answer was lost issues new
    /// credentials for the worker it enrolled (see `use_once`).
    ///
    /// # Errors
    /// `unauthorized` when the token is malformed, wrong, expired or used;
    /// [`StoreError::Corrupt`] when the scope stored with it (role, queues)
    /// does not decode: nothing is written and the token stays unused.
    pub async fn enroll(
        &self,
        token: &str,
        name: Option<&str>,
    ) -> Result<WorkerCredentials, StoreError> {
        self.enroll_attempt(token, name, None).await
    }

    /// [`Store::enroll`] for a request that carried `Request-Attempt`
    /// `attempt`: a late copy (its sender's copy with a higher number was
    /// answered) is refused and changes nothing (see `use_once`).
    ///
    /// # Errors
    /// As [`Store::enroll`]; `conflict` for a late copy.
    pub async fn enroll_attempt(
        &self,
        token: &str,
        name: Option<&str>,
        attempt: Option<&Attempt>,
    ) -> Result<WorkerCredentials, StoreError> {
        let (row, replay, presented, mut tx) = self
            .use_once(Kind::Enrollment, token, "role, queues, worker_id", attempt)
            .await?;
        let worker_id = match replay {
            Some(worker_id) => worker_id,
            None => {
                let role: String = super::get(&row, "role")?;
                let queues: String = super::get(&row, "queues")?;
                // The worker is copied from the token's scope: one that does
                // not decode (written by hand or by another version) would
                // make a worker whose every request fails, and burn the
                // token for it. Refused before anything is written.
                scope(&role, &queues)?;
                let insert = self.sql(
                    "INSERT INTO workers (name, created_at, role, queues) VALUES ($1, {now}, $2, $3)
                     RETURNING id",
                );
                #[expect(
                    clippy::disallowed_methods,
                    reason = "inside a transaction: its COMMIT reports a failed write"
                )]
                let (worker_id,): (i64,) = sqlx::query_as(&insert)
                    .bind(name)
                    .bind(&role)
                    .bind(&queues)
                    .fetch_one(&mut *tx)
                    .await?;
                if worker_id > super::MAX_SAFE_INTEGER {
                    // Rolled back with `tx`: the token is not spent.
                    return Err(StoreError::Corrupt(
                        "no worker id is left below 2^53 (Number.MAX_SAFE_INTEGER); nothing was written".into(),
                    ));
                }
                sqlx::query("UPDATE enrollment_tokens SET worker_id = $2 WHERE selector = $1")
                    .bind(&presented.selector)
                    .bind(worker_id)
                    .execute(&mut *tx)
                    .await?;
                worker_id
            }
        };
        let creds = self.issue(&mut tx, worker_id, &presented.selector).await?;
        match replay {
            Some(w) => self.commit_revoking(tx, w).await?,
            None => tx.commit().await?,
        }
        Ok(creds)
    }

    /// Commits a transaction that revoked credentials of `worker_id`, then
    /// counts the revocation (see [`Store::revocations`]) — in a task of its
    /// own, so that a request dropped mid-commit (its client went away)
    /// still counts it, and only once the commit has returned. A commit
    /// that failed is counted too: its outcome is unknown (it may have
    /// landed), and a count too many only makes the auth cache drop entries
    /// it could have kept, never keep a revoked one.
    async fn commit_revoking(
        &self,
        tx: Transaction<'static, Any>,
        worker_id: i64,
    ) -> Result<(), StoreError> {
        let revocations = self.revocations.clone();
        let committed = tokio::spawn(async move {
            let r = tx.commit().await;
            revocations.record(worker_id);
            r
        })
        .await
        .map_err(|e| StoreError::Corrupt(e.to_string()))?;
        Ok(committed?)
    }

    /// Exchanges a refresh token for new credentials, burning it, in one
    /// transaction opened only after the token was found and matched. A
    /// second use is refused, except a replay (see `use_once`).
    ///
    /// # Errors
    /// `unauthorized` when the token is malformed, wrong, expired or used.
    pub async fn refresh(&self, refresh_token: &str) -> Result<WorkerCredentials, StoreError> {
        self.refresh_attempt(refresh_token, None).await
    }

    /// [`Store::refresh`] for a request that carried `Request-Attempt`
    /// `attempt`: a late copy (its sender's copy with a higher number was
    /// answered) is refused and changes nothing (see `use_once`).
    ///
    /// # Errors
    /// As [`Store::refresh`]; `conflict` for a late copy.
    pub async fn refresh_attempt(
        &self,
        refresh_token: &str,
        attempt: Option<&Attempt>,
    ) -> Result<WorkerCredentials, StoreError> {
        let (row, replay, presented, mut tx) = self
            .use_once(Kind::Refresh, refresh_token, "worker_id", attempt)
            .await?;
        let worker_id: i64 = super::get(&row, "worker_id")?;
        let creds = self.issue(&mut tx, worker_id, &presented.selector).await?;
        match replay {
            Some(w) => self.commit_revoking(tx, w).await?,
            None => tx.commit().await?,
        }
        Ok(creds)
    }

    /// The enrolled caller an access token belongs to (id, role, queue scope), if
    /// the token is valid and unexpired on the database clock.
    ///
    /// # Errors
    /// `unauthorized` otherwise.
    pub async fn authenticate(&self, access_token: &str) -> Result<Principal, StoreError> {
        Ok(self.authenticate_for(access_token).await?.0)
    }

    /// [`Store::authenticate`], and how long the token stays valid from now on
    /// the database clock (ms), so that a caller may remember the answer that long.
    ///
    /// # Errors
    /// `unauthorized` when the token is malformed, wrong or expired.
    pub async fn authenticate_for(
        &self,
        access_token: &str,
    ) -> Result<(Principal, u64), StoreError> {
        let presented = tokens::parse_credential(Kind::Access, access_token)
            .ok_or_else(|| unauthorized("access token"))?;
        let sql = self.sql(
            "SELECT a.verifier_hash, a.worker_id, w.role, w.queues, a.expires_at - {now} AS left_ms
             FROM access_tokens a JOIN workers w ON w.id = a.worker_id
             WHERE a.selector = $1 AND a.expires_at > {now}",
        );
        #[expect(
            clippy::disallowed_methods,
            reason = "a read: no write is committed when it stops early"
        )]
        let row: Option<(String, i64, String, String, i64)> = sqlx::query_as(&sql)
            .bind(&presented.selector)
            .fetch_optional(&self.pool)
            .await?;
        match row {
            Some((hash, worker, role, queues, left)) if ct_eq(&hash, &presented.verifier_hash) => {
                Ok((principal(worker, &role, &queues)?, left.max(0) as u64))
            }
            _ => Err(unauthorized("access token")),
        }
    }

    /// Deletes expired and used credentials; returns how many rows went.
    /// On PostgreSQL a row another session holds locked (a refresh or an
    /// enrollment in flight, an admin's `psql` left in a transaction) is
    /// left for a later purge (`FOR UPDATE SKIP LOCKED`), so it never holds
    /// the purge for `lock_timeout` and fails it.
    ///
    /// # Errors
    /// The database failed.
    pub async fn purge_credentials(&self) -> Result<u64, StoreError> {
        let mut n = 0;
        for table in ["access_tokens", "refresh_tokens", "enrollment_tokens"] {
            // The rows picked (and locked) once, as `delete_settled`'s
            // page (see there why: `IN (… FOR UPDATE SKIP LOCKED)` may be
            // planned to lock them again for every outer row).
            let sql = self.sql(&format!(
                "WITH doomed AS MATERIALIZED (
                     SELECT selector FROM {table} WHERE expires_at <= {{now}} {{skip_locked}})
                 DELETE FROM {table} WHERE selector IN (SELECT selector FROM doomed)"
            ));
            n += sqlx::query(&sql).execute(&self.pool).await?.rows_affected();
        }
        // The numbers remembered for single-use tokens (see `use_once`)
        // expire with their token.
        let sql = self.sql(
            "WITH doomed AS MATERIALIZED (
                 SELECT kind, selector, sender FROM token_attempts
                 WHERE expires_at <= {now} {skip_locked})
             DELETE FROM token_attempts
             WHERE (kind, selector, sender) IN (SELECT kind, selector, sender FROM doomed)",
        );
        n += sqlx::query(&sql).execute(&self.pool).await?.rows_affected();
        Ok(n)
    }

    /// Issues an access and a refresh token for `worker_id`, recording the
    /// selector of the single-use token whose use issued them (`parent`).
    async fn issue(
        &self,
        tx: &mut Transaction<'static, Any>,
        worker_id: i64,
        parent: &str,
    ) -> Result<WorkerCredentials, StoreError> {
        let access = tokens::new_credential(Kind::Access);
        let refresh = tokens::new_credential(Kind::Refresh);
        for (table, cred, ttl) in [
            ("access_tokens", &access, self.settings.access_ttl_ms),
            ("refresh_tokens", &refresh, self.settings.refresh_ttl_ms),
        ] {
            let sql = self.sql(&format!(
                "INSERT INTO {table} (selector, verifier_hash, worker_id, created_at, expires_at, parent)
                 VALUES ($1, $2, $3, {{now}}, {{now}} + $4, $5)"
            ));
            sqlx::query(&sql)
                .bind(&cred.selector)
                .bind(&cred.verifier_hash)
                .bind(worker_id)
                .bind(ms(ttl))
                .bind(parent)
                .execute(&mut **tx)
                .await?;
        }
        Ok(WorkerCredentials {
            worker_id,
            access_token: access.secret.0,
            access_expires_in_ms: self.settings.access_ttl_ms,
            refresh_token: refresh.secret.0,
        })
    }
}

/// The table of single-use tokens of `kind`, and what the token is called.
fn token_table(kind: Kind) -> (&'static str, &'static str) {
    match kind {
        Kind::Enrollment => ("enrollment_tokens", "enrollment token"),
        Kind::Refresh => ("refresh_tokens", "refresh token"),
        Kind::Access => ("access_tokens", "access token"),
    }
}

/// `token_attempts.kind` of a token of `kind`.
fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Enrollment => "enrollment",
        Kind::Refresh => "refresh",
        Kind::Access => "access",
    }
}

/// Locks the `workers` row of `worker_id` for the rest of `tx` (a no-op
/// update: a row lock on PostgreSQL; SQLite's write transaction already holds
/// the database's single writer lock). Whether the row exists.
async fn lock_worker(
    tx: &mut Transaction<'static, Any>,
    worker_id: i64,
) -> Result<bool, StoreError> {
    let done = sqlx::query("UPDATE workers SET id = id WHERE id = $1")
        .bind(worker_id)
        .execute(&mut **tx)
        .await?;
    Ok(done.rows_affected() == 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fences read owner `0` as the admin: no token may authenticate as
    /// a worker or producer with that id (or a negative one).
    #[test]
    fn a_worker_id_the_fences_read_as_the_admin_never_authenticates() {
        for id in [0, -1, i64::MIN] {
            for role in ["worker", "producer"] {
                assert!(
                    matches!(principal(id, role, r#"["*"]"#), Err(StoreError::Corrupt(_))),
                    "{role} {id}"
                );
            }
        }
        let p = principal(1, "worker", r#"["q"]"#).expect("id 1 is a worker");
        assert_eq!(
            (p.worker_id, p.role, p.queues),
            (1, Role::Worker, vec!["q".to_string()])
        );
    }
}
