//! Versioned, idempotent schema migrations for both backends.
//!
//! `schema_migrations` records each applied version. Every migration runs in its
//! own write transaction together with its version row, under a lock (SQLite's
//! writer lock, a PostgreSQL advisory lock), so instances starting together apply
//! each migration exactly once and a crash leaves either all of it or none.
//!
//! Why not sqlx's `Migrator` (measured with sqlx 0.8.6 by
//! `crates/server/measurements/sqlx-migrator-race`: 2 instances starting together
//! on a fresh SQLite file, 20 rounds → 9 rounds where one of them failed to start;
//! 6 instances → 13 of 20; this migrator passes the same race in
//! `concurrent_starts_apply_each_migration_exactly_once` on both backends): it reads
//! the applied versions ONCE, before and outside the transactions that apply
//! them, and its SQLite `lock()` does nothing. Two instances starting together on
//! one SQLite file both decide to apply version 1; the second one's `CREATE TABLE`
//! then fails and that instance does not start. Here the "is it applied?" check
//! runs inside the write transaction that applies it (`BEGIN IMMEDIATE` takes the
//! writer lock first), so the loser sees the winner's row and skips. On
//! PostgreSQL sqlx's advisory lock would do, but one migrator per backend would
//! still need our `{id_pk}`/`{now}` dialect filled at run time and a bridge from
//! the `schema_migrations` rows existing databases already hold to
//! `_sqlx_migrations`: more code than this file, for a weaker guarantee.

use super::{Backend, Store, StoreError};

/// One schema step. SQL uses the placeholders of [`Backend::sql`].
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    /// Increasing version number.
    pub version: i64,
    /// Short description.
    pub name: &'static str,
    /// `;`-separated statements.
    pub sql: &'static str,
}

/// All migrations, oldest first. Never edit a released one; append.
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "items",
        sql: "CREATE TABLE items (
                id {id_pk},
                queue TEXT NOT NULL,
                state TEXT NOT NULL,
                payload TEXT NOT NULL,
                result TEXT,
                attempts BIGINT NOT NULL DEFAULT 0,
                max_attempts BIGINT NOT NULL,
                epoch BIGINT NOT NULL DEFAULT 0,
                token_hash TEXT,
                worker_id BIGINT,
                claimed_at BIGINT,
                last_error TEXT,
                created_at BIGINT NOT NULL,
                updated_at BIGINT NOT NULL
            );
            CREATE INDEX items_queue_state ON items (queue, state, id)",
    },
    Migration {
        version: 2,
        name: "heartbeats_and_workers",
        // Claims made before heartbeats existed start their lease at the claim
        // time; a running row with neither counts as expired.
        sql: "ALTER TABLE items ADD COLUMN heartbeat_at BIGINT;
            UPDATE items SET heartbeat_at = claimed_at WHERE state = 'running';
            CREATE INDEX items_state_heartbeat ON items (state, heartbeat_at);
            CREATE TABLE workers (
                id {id_pk},
                name TEXT,
                created_at BIGINT NOT NULL
            );
            CREATE TABLE enrollment_tokens (
                selector TEXT PRIMARY KEY,
                verifier_hash TEXT NOT NULL,
                created_at BIGINT NOT NULL,
                expires_at BIGINT NOT NULL,
                used_at BIGINT,
                worker_id BIGINT
            );
            CREATE TABLE refresh_tokens (
                selector TEXT PRIMARY KEY,
                verifier_hash TEXT NOT NULL,
                worker_id BIGINT NOT NULL,
                created_at BIGINT NOT NULL,
                expires_at BIGINT NOT NULL,
                used_at BIGINT
            );
            CREATE TABLE access_tokens (
                selector TEXT PRIMARY KEY,
                verifier_hash TEXT NOT NULL,
                worker_id BIGINT NOT NULL,
                created_at BIGINT NOT NULL,
                expires_at BIGINT NOT NULL
            )",
    },
    Migration {
        version: 3,
        name: "roles_and_queue_scopes",
        // Credentials issued before roles existed keep what they could do: a
        // worker on every queue (`["*"]`). New tokens name their role and scope.
        sql: "ALTER TABLE enrollment_tokens ADD COLUMN role TEXT NOT NULL DEFAULT 'worker';
            ALTER TABLE enrollment_tokens ADD COLUMN queues TEXT NOT NULL DEFAULT '[\"*\"]';
            ALTER TABLE workers ADD COLUMN role TEXT NOT NULL DEFAULT 'worker';
            ALTER TABLE workers ADD COLUMN queues TEXT NOT NULL DEFAULT '[\"*\"]'",
    },
    Migration {
        version: 4,
        name: "retry_cap_counts_redeliveries",
        // The cap used to count deliveries (5 = four re-deliveries); it now counts
        // re-deliveries after the first. Existing items keep the deliveries they had.
        sql: "ALTER TABLE items RENAME COLUMN max_attempts TO max_redeliveries;
            UPDATE items SET max_redeliveries = max_redeliveries - 1",
    },
    Migration {
        version: 5,
        name: "settle_replay",
        // The token hash of the lease that settled the item and its holder, so
        // a settle sent again by that lease (its first answer lost) is
        // answered, not refused. (Cleared when the item got a new token
        // until version 14.)
        sql: "ALTER TABLE items ADD COLUMN settled_token_hash TEXT;
            ALTER TABLE items ADD COLUMN settled_by BIGINT",
    },
    Migration {
        version: 6,
        name: "credential_lineage",
        // Which single-use token's use issued a credential (its selector), so
        // a replay of that token can revoke exactly what the lost answer held.
        // `revoked`: a refresh or enrollment token revoked by reuse detection
        // or superseded by a replay; presenting it again is reuse.
        sql: "ALTER TABLE access_tokens ADD COLUMN parent TEXT;
            ALTER TABLE refresh_tokens ADD COLUMN parent TEXT;
            ALTER TABLE refresh_tokens ADD COLUMN revoked BIGINT NOT NULL DEFAULT 0;
            ALTER TABLE enrollment_tokens ADD COLUMN revoked BIGINT NOT NULL DEFAULT 0;
            CREATE INDEX access_tokens_parent ON access_tokens (parent);
            CREATE INDEX refresh_tokens_parent ON refresh_tokens (parent)",
    },
    Migration {
        version: 7,
        name: "release_replay",
        // The token hash of the lease that last released the item and its
        // holder, so a release sent again by that lease (its first answer
        // lost) is answered, not refused. Kept when the item is claimed again
        // (unlike settled_token_hash): a released item reopens and may be
        // claimed before the retry arrives; the next release overwrites it.
        sql: "ALTER TABLE items ADD COLUMN released_token_hash TEXT;
            ALTER TABLE items ADD COLUMN released_by BIGINT",
    },
    Migration {
        version: 8,
        name: "lease_ttl",
        // The TTL (ms) the current lease was granted with, by the instance
        // that granted it: expiry and takeover use it, not the TTL of the
        // instance that happens to look, so an instance started with a
        // shorter --ttl-ms never takes over a lease before the time its
        // holder was promised. Cleared when the lease ends (settle,
        // release, takeover), so NULL means: granted by a binary that does
        // not set it (before this column, or an older one during a rolling
        // upgrade); then the looking instance's TTL applies, as before.
        sql: "ALTER TABLE items ADD COLUMN lease_ttl_ms BIGINT",
    },
    Migration {
        version: 9,
        name: "retry_counts_not_negative",
        // Version 4 made a cap of 0 deliveries (which `--max-attempts 0`
        // once accepted) into -1 re-deliveries, which no reader holds: such
        // a row could not be read, and one running stopped every reaper
        // pass. A negative cap means deliver once (0 re-deliveries); a
        // negative attempt count, none ended.
        sql: "UPDATE items SET max_redeliveries = 0 WHERE max_redeliveries < 0;
            UPDATE items SET attempts = 0 WHERE attempts < 0",
    },
    Migration {
        version: 10,
        name: "enqueue_idempotency",
        // A producer's `Idempotency-Key` per queue (NULL: none) and the hash
        // of the request it came with, so an enqueue sent again after a lost
        // answer finds its item instead of adding a second one, and a key
        // reused for another request is refused. Nullable columns: adding
        // them rewrites nothing on either backend. (A development build of
        // this version also created a unique index over every row; version
        // 11 drops it.)
        sql: "ALTER TABLE items ADD COLUMN idempotency_key TEXT;
            ALTER TABLE items ADD COLUMN request_hash TEXT",
    },
    Migration {
        version: 11,
        name: "enqueue_idempotency_index",
        // Unique over the rows that have a key only (a partial index: the
        // keyless items, nearly all of them, add no entry, and an update of
        // a leased row's heartbeat adds none to it either), in a migration
        // of its own so that PostgreSQL's exclusive lock of the ALTERs above
        // is not held while it is built.
        sql: "DROP INDEX IF EXISTS items_queue_idempotency_key;
            CREATE UNIQUE INDEX items_idempotency_key ON items (queue, idempotency_key)
                WHERE idempotency_key IS NOT NULL",
    },
    Migration {
        version: 12,
        name: "claim_idempotency",
        // The `Idempotency-Key` of the claim that holds a running item
        // (NULL: none), so a claim sent again after its answer was lost gets
        // that lease back instead of a second item (see `Store::claim`).
        // Every claim and resume writes it and every end of a lease clears
        // it, so it only ever names the current lease's claim. Nullable:
        // adding it rewrites nothing.
        sql: "ALTER TABLE items ADD COLUMN claim_key TEXT",
    },
    Migration {
        version: 13,
        name: "claim_idempotency_index",
        // Not unique: two copies of one claim racing (the first still
        // running when its retry arrives) could each take an item, and the
        // replay then picked the oldest. Version 15 replaces it by a unique
        // index, which closes that race. Partial, so keyless leases add no
        // entry; its own migration, as version 11 (PostgreSQL's lock).
        sql: "CREATE INDEX items_claim_key ON items (queue, claim_key)
                WHERE claim_key IS NOT NULL",
    },
    Migration {
        version: 14,
        name: "settle_replay_kept",
        // What the last settle asked for (a hash of its state, error and
        // result text), so that settle sent again by its lease is answered
        // as a replay also after the item moved on (a `paused` settle whose
        // item an operator resumed): `settled_token_hash` is from now on
        // kept when the item gets a new token, as `released_token_hash` is,
        // and the next settle overwrites both. NULL for settles made
        // before: those replay only while the item is as they left it.
        sql: "ALTER TABLE items ADD COLUMN settled_request_hash TEXT",
    },
    Migration {
        version: 15,
        name: "claim_idempotency_unique",
        // At most one running lease per claim key, queue and caller
        // (`COALESCE(worker_id, 0)`: the admin token is a caller too, and
        // NULLs are distinct in a unique index), so copies of one claim
        // racing take one item between them: the copy whose claim statement
        // meets the index replays the lease that took the key (see
        // `Store::claim_once`). Another caller's use of a key is its own
        // (keys are random per claim). Only running rows: a paused lease
        // keeps its key until it is resumed (which clears it) or settled,
        // and no claim replays it meanwhile, so it must not hold the key.
        // Rows that racing copies left under one key before are cut first
        // to the oldest (the one a replay picked): the others keep running
        // under their tokens until settled or reaped, keyless. (On
        // PostgreSQL a binary without this index claiming between the two
        // statements can still add such a row; the index build then fails,
        // this migration is rolled back whole, and the next start applies it.)
        sql: "UPDATE items SET claim_key = NULL
            WHERE claim_key IS NOT NULL AND state = 'running' AND EXISTS (
                SELECT 1 FROM items AS older
                WHERE older.queue = items.queue AND older.claim_key = items.claim_key
                  AND COALESCE(older.worker_id, 0) = COALESCE(items.worker_id, 0)
                  AND older.state = 'running' AND older.id < items.id);
            DROP INDEX IF EXISTS items_claim_key;
            CREATE UNIQUE INDEX items_claim_key_once
                ON items (queue, claim_key, COALESCE(worker_id, 0))
                WHERE claim_key IS NOT NULL AND state = 'running'",
    },
    Migration {
        version: 16,
        name: "settled_state",
        // The state the last settle set, beside `settled_token_hash`: a
        // release by that settle's lease (its answer lost) is answered with
        // it, also once the item moved on (a `paused` settle resumed and then
        // failed by a later lease's retry limit, which no settle wrote).
        // NULL for settles made before: the item's state stands in for it.
        sql: "ALTER TABLE items ADD COLUMN settled_state TEXT",
    },
    Migration {
        version: 17,
        name: "claim_attempt",
        // The `Request-Attempt` (number, sender) of the copy of a keyed
        // claim answered last (`Store::claim_attempt`): a copy by that
        // sender that reaches the server after it (a request held up in the
        // network while its client gave up and sent the key again) must
        // not rotate the token that later copy handed out. NULL for a claim
        // sent without the header: any copy of it replays, as before.
        sql: "ALTER TABLE items ADD COLUMN claim_attempt BIGINT;
            ALTER TABLE items ADD COLUMN claim_sender TEXT",
    },
    Migration {
        version: 18,
        name: "credential_use_attempt",
        // The `Request-Attempt` of the request that used a single-use token
        // last (`Store::use_once`): a copy of an enrollment or refresh that
        // reaches the server after a later copy was answered must not be
        // taken for a replay, which would revoke the credentials that later
        // copy issued (the ones its client holds). NULL: sent without it.
        sql: "ALTER TABLE enrollment_tokens ADD COLUMN used_attempt BIGINT;
            ALTER TABLE enrollment_tokens ADD COLUMN used_sender TEXT;
            ALTER TABLE refresh_tokens ADD COLUMN used_attempt BIGINT;
            ALTER TABLE refresh_tokens ADD COLUMN used_sender TEXT",
    },
    Migration {
        version: 19,
        name: "settled_retention",
        // `--retention-ms` (`Store::delete_settled`) finds the settled items
        // older than the retention by settle time. Partial: a heartbeat
        // (which moves `updated_at` of a running row) never touches it.
        sql: "CREATE INDEX items_settled ON items (updated_at) WHERE state IN ('done', 'failed')",
    },
    Migration {
        version: 20,
        name: "enqueue_idempotency_scope",
        // Whose `Idempotency-Key` an enqueue's key is: the producer that sent
        // it (its `workers.id`, which its refreshed credentials keep; 0 for
        // the admin token), so two producers of a queue that happen to pick
        // one key no longer get each other's item (a replay) or a `409`:
        // a key is its sender's own, as Stripe scopes keys per API key (see
        // `Store::enqueue_once`). NULL: keyless, or keyed before this
        // version; such a key still answers every producer of its queue,
        // as it did. Nullable: adding it rewrites nothing.
        sql: "ALTER TABLE items ADD COLUMN idempotency_scope BIGINT",
    },
    Migration {
        version: 21,
        name: "enqueue_idempotency_scope_index",
        // Replaces version 11's `(queue, idempotency_key)` index: one key per
        // queue AND producer for the keys scoped by version 20, and one per
        // queue, as before, for the keys left unscoped (keyed before it, or
        // by a binary without it during a rolling upgrade, which still reads
        // a key as the queue's; such a binary's keyed enqueue also shadows a
        // producer's scoped key of the same name, whose retry then finds the
        // unscoped item: upgrade every instance before producers rely on
        // keys being their own). Both partial (keyless rows add no entry);
        // in a migration of their own, as version 11 (PostgreSQL's lock).
        sql: "DROP INDEX IF EXISTS items_idempotency_key;
            CREATE UNIQUE INDEX items_idempotency_key_scoped
                ON items (queue, idempotency_scope, idempotency_key)
                WHERE idempotency_key IS NOT NULL AND idempotency_scope IS NOT NULL;
            CREATE UNIQUE INDEX items_idempotency_key_unscoped
                ON items (queue, idempotency_key)
                WHERE idempotency_key IS NOT NULL AND idempotency_scope IS NULL",
    },
    Migration {
        version: 22,
        name: "settled_lease_counters",
        // The epoch and attempt count the item had when the last settle
        // landed (the settling lease's epoch; a settle changes neither),
        // beside `settled_token_hash`: that settle sent again after its
        // item moved on (resumed, released, claimed again) is answered
        // with the item as that settle left it, and the epoch and attempts
        // of a later lease are not its to read (see `replay_or_rejection`).
        // NULL for settles made before: their replays answer the item's
        // counters as they are now, as before. Nullable: adding them
        // rewrites nothing.
        sql: "ALTER TABLE items ADD COLUMN settled_epoch BIGINT;
            ALTER TABLE items ADD COLUMN settled_attempts BIGINT",
    },
    Migration {
        version: 23,
        name: "claim_keys",
        // The first form of the table below (one row per queue, caller and
        // key), as a database made with that day's main has it; replaced by
        // migration 24.
        sql: "CREATE TABLE claim_keys (
                queue TEXT NOT NULL,
                caller BIGINT NOT NULL,
                claim_key TEXT NOT NULL,
                sender TEXT NOT NULL,
                attempt BIGINT NOT NULL,
                answered_at BIGINT NOT NULL,
                PRIMARY KEY (queue, caller, claim_key)
            );
            CREATE INDEX claim_keys_answered ON claim_keys (answered_at)",
    },
    Migration {
        version: 24,
        name: "claim_keys_per_sender",
        // The highest `Request-Attempt` number seen per queue, caller
        // (`COALESCE(worker_id, 0)`), key and sender for a keyed claim,
        // written once the claim took an item and kept after its lease
        // ended: every
        // end of a lease clears `items.claim_key`, so a copy held up in the
        // network that arrived after the lease ended found no lease under
        // its key and claimed a second item under a token nobody received
        // (see `Store::claim_attempt`). Rows older than
        // `CLAIM_KEY_MEMORY_MS` are deleted (`Store::forget_claim_keys`).
        // The sender joined the primary key (another sender's copy no
        // longer overwrites the row); the rows are an hour's memory at
        // most, so the table is made again rather than copied.
        sql: "DROP TABLE claim_keys;
            CREATE TABLE claim_keys (
                queue TEXT NOT NULL,
                caller BIGINT NOT NULL,
                claim_key TEXT NOT NULL,
                sender TEXT NOT NULL,
                attempt BIGINT NOT NULL,
                answered_at BIGINT NOT NULL,
                PRIMARY KEY (queue, caller, claim_key, sender)
            );
            CREATE INDEX claim_keys_answered ON claim_keys (answered_at)",
    },
    Migration {
        version: 25,
        name: "token_attempts",
        // The highest `Request-Attempt` number seen per single-use token
        // (`kind`: `enrollment` or `refresh`, and its selector) AND sender,
        // as `claim_keys` keeps per claim key: version 18's
        // `used_attempt`/`used_sender` hold only the copy answered last, so
        // once another sender's copy replayed the token, a copy held up in
        // the network from the first sender (which had sent a higher number
        // since, answered) was no longer seen as late, was taken for a
        // replay and revoked the credentials the other sender's copy got
        // (see `Store::use_once`). `expires_at` is the token's: the row is
        // purged with it (`Store::purge_credentials`).
        sql: "CREATE TABLE token_attempts (
                kind TEXT NOT NULL,
                selector TEXT NOT NULL,
                sender TEXT NOT NULL,
                attempt BIGINT NOT NULL,
                expires_at BIGINT NOT NULL,
                PRIMARY KEY (kind, selector, sender)
            );
            CREATE INDEX token_attempts_expires ON token_attempts (expires_at)",
    },
    Migration {
        version: 26,
        name: "resumed_epoch",
        // The epoch a resume gave the item (its lease's): a resume sent
        // again after its answer was lost, or a second operator's resume
        // racing the first, finds the item no longer paused and, while the
        // item's epoch is still the one that resume set, is answered that
        // the resume landed (`Resumed::Again`) instead of `409 conflict`
        // (see `Store::resume_reporting`). Any later claim raises the epoch
        // past it. NULL for items never resumed. Nullable: adding it
        // rewrites nothing.
        sql: "ALTER TABLE items ADD COLUMN resumed_epoch BIGINT",
    },
    Migration {
        version: 27,
        name: "requeued_epoch",
        // The epoch of an item when an operator's requeue put it back to
        // `open` (a requeue keeps the epoch): a requeue sent again after its
        // answer was lost, or a second operator's racing the first, finds
        // the item open and, while its epoch is still that one (no claim
        // since), is answered that the requeue landed instead of `409
        // conflict` (see `Store::requeue`). NULL for items never requeued.
        sql: "ALTER TABLE items ADD COLUMN requeued_epoch BIGINT",
    },
    Migration {
        version: 28,
        name: "cancelled_epoch",
        // The epoch of an item when an operator's cancel failed it: a cancel
        // sent again after its answer was lost, or a second operator's
        // racing the first, finds the item failed and, while its epoch is
        // still that one, is answered that the cancel landed instead of
        // `409 conflict` (see `Store::cancel`). NULL for items never
        // cancelled.
        sql: "ALTER TABLE items ADD COLUMN cancelled_epoch BIGINT",
    },
    Migration {
        version: 29,
        name: "retry_backoff",
        // An item's redelivery backoff as enqueued (`retry_backoff_ms`:
        // base and max in ms; NULL: none, reopened items are claimable at
        // once, as before) and the database time from which a claim may
        // take it (`available_at`; NULL: now). An expiry or a release of
        // an item with a backoff sets it to now plus a full-jitter delay
        // (`Store::take_over`, `Store::release`); every claim skips an
        // open item whose time has not come. The claims still read
        // `items_queue_state` (queue, state, id) in id order and filter
        // `available_at` on the row: items backing off ahead of the first
        // claimable one cost a row read each per claim, as River's and
        // Temporal's retries wait in the table they are claimed from.
        // Nullable: adding them rewrites nothing.
        sql: "ALTER TABLE items ADD COLUMN retry_backoff_base_ms BIGINT;
            ALTER TABLE items ADD COLUMN retry_backoff_max_ms BIGINT;
            ALTER TABLE items ADD COLUMN available_at BIGINT",
    },
];

/// Columns a migration added only in a later edit of its SQL, made after
/// databases had already recorded the first form: version 5 (`settled_by`)
/// and 6 (`revoked`, both edited by 66d869c), 17 (`claim_sender`) and 18
/// (`used_sender`, both edited by 0ae72f1). A database that applied a first
/// form has the version row but not the column, and every claim, enrollment
/// and refresh failed with `500` on it ("no such column"; helper-246).
/// [`migrate`] adds each one missing. A later migration that drops or
/// renames one of them must take it out of this list, or every start would
/// add it back. (Version 10's first form left an index
/// that version 11 drops, and version 23's, a key that version 24 rebuilds.)
const LATE_COLUMNS: &[(&str, &str, &str)] = &[
    ("items", "settled_by", "BIGINT"),
    ("refresh_tokens", "revoked", "BIGINT NOT NULL DEFAULT 0"),
    ("enrollment_tokens", "revoked", "BIGINT NOT NULL DEFAULT 0"),
    ("items", "claim_sender", "TEXT"),
    ("enrollment_tokens", "used_sender", "TEXT"),
    ("refresh_tokens", "used_sender", "TEXT"),
];

/// Advisory lock key for migrations on PostgreSQL ("agst").
const PG_MIGRATION_LOCK: i64 = 0x6167_7374;

/// Applies every migration not yet recorded; returns how many were applied
/// (0 when the schema is current: running it twice is a no-op).
///
/// # Errors
/// A statement fails; that migration is rolled back whole.
pub async fn migrate(store: &Store) -> Result<usize, StoreError> {
    let mut applied = 0;
    for m in MIGRATIONS {
        let mut tx = store.begin_write().await?;
        if store.backend == Backend::Postgres {
            pg_migration_lock(&mut tx).await?;
        }
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS schema_migrations (
                version BIGINT PRIMARY KEY,
                name TEXT NOT NULL,
                applied_at BIGINT NOT NULL
            )",
        )
        .execute(&mut *tx)
        .await?;
        #[expect(
            clippy::disallowed_methods,
            reason = "inside a transaction: its COMMIT reports a failed write"
        )]
        let (present,): (i64,) =
            sqlx::query_as("SELECT COUNT(*) FROM schema_migrations WHERE version = $1")
                .bind(m.version)
                .fetch_one(&mut *tx)
                .await?;
        if present > 0 {
            tx.rollback().await?;
            continue;
        }
        for stmt in store.sql(m.sql).split(';') {
            if !stmt.trim().is_empty() {
                sqlx::query(stmt).execute(&mut *tx).await?;
            }
        }
        let record = store.sql(
            "INSERT INTO schema_migrations (version, name, applied_at) VALUES ($1, $2, {now})",
        );
        sqlx::query(&record)
            .bind(m.version)
            .bind(m.name)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        tracing::info!(version = m.version, name = m.name, "applied migration");
        applied += 1;
    }
    refuse_newer(store).await?;
    add_late_columns(store).await?;
    Ok(applied)
}

/// Takes the migration lock in `tx` (PostgreSQL), waiting for another
/// instance's migration however long it takes (not the pool's
/// `lock_timeout`, see `PG_LOCK_TIMEOUT_MS`), and lets what runs under it
/// take as long as it takes (not the pool's `statement_timeout`, see
/// `PG_STATEMENT_TIMEOUT_MS`).
///
/// # Errors
/// The database failed.
async fn pg_migration_lock(tx: &mut sqlx::Transaction<'_, sqlx::Any>) -> Result<(), StoreError> {
    sqlx::query(
        "SELECT set_config('lock_timeout', '0', true),
                set_config('statement_timeout', '0', true)",
    )
    .execute(&mut **tx)
    .await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(PG_MIGRATION_LOCK)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Refuses a database a newer server migrated (a version above the last of
/// [`MIGRATIONS`] recorded): this server would run its statements against a
/// schema it does not know, and leave what newer code keeps in step half
/// written (helper-246: an older server's settle left the replay's epoch
/// stale). A downgrade fails at start, naming both versions.
///
/// # Errors
/// The database is newer, or the database failed.
async fn refuse_newer(store: &Store) -> Result<(), StoreError> {
    let known = MIGRATIONS.last().map_or(0, |m| m.version);
    #[expect(clippy::disallowed_methods, reason = "a read")]
    let (newest,): (Option<i64>,) = sqlx::query_as("SELECT MAX(version) FROM schema_migrations")
        .fetch_one(store.pool())
        .await?;
    match newest {
        Some(v) if v > known => Err(StoreError::Database(sqlx::Error::Configuration(
            format!(
                "the database was migrated by a newer agentstore-server (schema version {v}; \
                 this server knows versions up to {known}): run that release or a later one"
            )
            .into(),
        ))),
        _ => Ok(()),
    }
}

/// Adds every [`LATE_COLUMNS`] entry the database lacks, in one write
/// transaction (under the migration lock on PostgreSQL, so that instances
/// starting together add each once).
///
/// # Errors
/// The database failed.
async fn add_late_columns(store: &Store) -> Result<(), StoreError> {
    let mut tx = store.begin_write().await?;
    if store.backend == Backend::Postgres {
        pg_migration_lock(&mut tx).await?;
    }
    let probe = if store.backend == Backend::Postgres {
        // `pg_attribute`, not `information_schema.columns`, which lists only
        // the columns the role has a privilege on (helper-248); the table
        // is found by the search path, as `ALTER TABLE` finds it.
        "SELECT COUNT(*) FROM pg_attribute
         WHERE attrelid = to_regclass($1) AND attname = $2 AND NOT attisdropped"
    } else {
        "SELECT COUNT(*) FROM pragma_table_info($1) WHERE name = $2"
    };
    for (table, column, ty) in LATE_COLUMNS {
        #[expect(
            clippy::disallowed_methods,
            reason = "inside a transaction: its COMMIT reports a failed write"
        )]
        let (present,): (i64,) = sqlx::query_as(probe)
            .bind(*table)
            .bind(*column)
            .fetch_one(&mut *tx)
            .await?;
        if present == 0 {
            sqlx::query(&format!("ALTER TABLE {table} ADD COLUMN {column} {ty}"))
                .execute(&mut *tx)
                .await?;
            tracing::warn!(
                table,
                column,
                "added a column an earlier form of its migration left out"
            );
        }
    }
    tx.commit().await?;
    Ok(())
}

/// How many of [`MIGRATIONS`] this database has not recorded (readiness: a
/// database restored from an older backup, or replaced under a running server).
///
/// # Errors
/// The database failed, or `schema_migrations` does not exist.
pub async fn pending(store: &Store) -> Result<usize, StoreError> {
    let applied: Vec<(i64,)> = sqlx::query_as("SELECT version FROM schema_migrations")
        .fetch_all(store.pool())
        .await?;
    Ok(MIGRATIONS
        .iter()
        .filter(|m| !applied.iter().any(|(v,)| *v == m.version))
        .count())
}
