//! Schema migrations: upgrade in place, idempotent.

use agentstore_protocol::lease::{ItemState, Readiness, Role, SettleState, ANY_QUEUE};
use agentstore_server::store::{migrate, Backend, MIGRATIONS};
use agentstore_server::{Server, Settings, Store};
use serde_json::json;

use crate::common::{Kind, TestDb};

async fn versions(pool: &sqlx::AnyPool) -> Vec<i64> {
    sqlx::query_as::<_, (i64,)>("SELECT version FROM schema_migrations ORDER BY version")
        .fetch_all(pool)
        .await
        .unwrap()
        .into_iter()
        .map(|(v,)| v)
        .collect()
}

fn backend(db: &TestDb) -> Backend {
    match db.kind {
        Kind::Sqlite => Backend::Sqlite,
        Kind::Postgres => Backend::Postgres,
    }
}

pub async fn an_older_schema_upgrades_in_place_and_keeps_its_rows(db: TestDb) {
    let b = backend(&db);
    let raw = db.raw_pool().await;
    // The schema as release 1 left it, written out here (not taken from MIGRATIONS).
    let v1 = [
        "CREATE TABLE schema_migrations (version BIGINT PRIMARY KEY, name TEXT NOT NULL,
             applied_at BIGINT NOT NULL)",
        "CREATE TABLE items (id {id_pk}, queue TEXT NOT NULL, state TEXT NOT NULL,
             payload TEXT NOT NULL, result TEXT, attempts BIGINT NOT NULL DEFAULT 0,
             max_attempts BIGINT NOT NULL, epoch BIGINT NOT NULL DEFAULT 0, token_hash TEXT,
             worker_id BIGINT, claimed_at BIGINT, last_error TEXT, created_at BIGINT NOT NULL,
             updated_at BIGINT NOT NULL)",
        "CREATE INDEX items_queue_state ON items (queue, state, id)",
        "INSERT INTO schema_migrations (version, name, applied_at) VALUES (1, 'items', 0)",
        "INSERT INTO items (queue, state, payload, max_attempts, epoch, created_at, updated_at)
             VALUES ('q', 'open', '{\"n\":1}', 5, 0, 0, 0)",
        "INSERT INTO items (queue, state, payload, max_attempts, epoch, token_hash, claimed_at,
             created_at, updated_at)
             VALUES ('q', 'running', '{\"n\":2}', 5, 1, 'abc', {now}, 0, 0)",
        "INSERT INTO items (queue, state, payload, max_attempts, epoch, token_hash, created_at,
             updated_at)
             VALUES ('q', 'running', '{\"n\":3}', 5, 1, 'def', 0, 0)",
        "INSERT INTO items (queue, state, payload, result, attempts, max_attempts, epoch,
             created_at, updated_at)
             VALUES ('q', 'done', '{\"n\":4}', '\"ok\"', 1, 5, 2, 0, 0)",
    ];
    for stmt in v1 {
        sqlx::query(&b.sql(stmt)).execute(&raw).await.unwrap();
    }
    assert_eq!(versions(&raw).await, vec![1]);

    let store = db.store(Settings::default()).await; // migrates on connect
    let all: Vec<i64> = MIGRATIONS.iter().map(|m| m.version).collect();
    assert_eq!(versions(&raw).await, all);
    let items = store.list("q", None, 0, 10).await.unwrap().items;
    let seen: Vec<_> = items
        .iter()
        .map(|i| (i.payload.to_value().unwrap(), i.state, i.epoch))
        .collect();
    assert_eq!(
        seen,
        vec![
            (json!({"n": 1}), ItemState::Open, 0),
            (json!({"n": 2}), ItemState::Running, 1),
            (json!({"n": 3}), ItemState::Running, 1),
            (json!({"n": 4}), ItemState::Done, 2),
        ]
    );
    assert_eq!(
        crate::common::value(items[3].result.clone()),
        Some(json!("ok"))
    );
    assert_eq!(items[3].attempts, 1);
    // A cap of 5 deliveries becomes 4 re-deliveries: the item keeps its deliveries.
    assert_eq!(items[0].max_redeliveries, 4);
    // The old claim with a claim time keeps a live lease; the one without counts as expired.
    let expired: Vec<i64> = store
        .expired_claims(10)
        .await
        .unwrap()
        .iter()
        .map(|c| c.id)
        .collect();
    assert_eq!(expired, vec![items[2].id]);
    // New rows get ids after the old ones and the upgraded schema works.
    let new = store.enqueue("q", &json!({"n": 5}), None).await.unwrap();
    assert!(new.id > items[3].id);
    let c = store
        .claim("q", None)
        .await
        .unwrap()
        .expect("old open item claimable");
    assert_eq!(c.item.id, items[0].id);
    raw.close().await;
}

/// A database that recorded versions 5, 6, 17 and 18 in the first form of
/// their SQL (before later edits added columns to them) gets those columns
/// at the next start, and claims, settles, enrollments and refreshes work
/// on it. Before, the server started (ready) and answered them `500` ("no
/// such column: claim_sender", "used_sender"; helper-246).
pub async fn columns_added_by_a_later_edit_of_a_recorded_migration_are_added_at_start(db: TestDb) {
    let store = db.store(Settings::default()).await;
    let id = store.enqueue("q", &json!({"n": 1}), None).await.unwrap().id;
    store.close().await;
    let raw = db.raw_pool().await;
    // The first forms left these out (the rest of the schema is the same).
    for (table, column) in [
        ("items", "settled_by"),
        ("refresh_tokens", "revoked"),
        ("enrollment_tokens", "revoked"),
        ("items", "claim_sender"),
        ("enrollment_tokens", "used_sender"),
        ("refresh_tokens", "used_sender"),
    ] {
        sqlx::query(&format!("ALTER TABLE {table} DROP COLUMN {column}"))
            .execute(&raw)
            .await
            .unwrap_or_else(|e| panic!("drop {table}.{column}: {e}"));
    }
    raw.close().await;
    let store = db.store(Settings::default()).await; // migrates on connect
    let claimed = store
        .claim("q", None)
        .await
        .expect("a claim works")
        .expect("the item is claimed");
    assert_eq!(claimed.item.id, id);
    let settled = store
        .settle(
            id,
            &claimed.lease.token,
            None,
            SettleState::Done,
            None,
            None,
        )
        .await;
    assert!(settled.is_ok(), "a settle works: {settled:?}");
    let (token, _) = store
        .create_enrollment_token(None, Role::Worker, &[ANY_QUEUE.into()])
        .await
        .unwrap();
    let creds = store
        .enroll(&token.0, Some("w"))
        .await
        .expect("an enrollment works");
    let refreshed = store.refresh(&creds.refresh_token).await;
    assert!(refreshed.is_ok(), "a refresh works: {refreshed:?}");
    let again = db.store(Settings::default()).await;
    assert_eq!(migrate(&again).await.unwrap(), 0, "nothing added twice");
}

/// A server started on a database a newer release migrated (a version it
/// does not know recorded) refuses to start, naming both versions. Before,
/// it started and wrote rows the newer code reads half written (helper-246).
pub async fn a_database_migrated_by_a_newer_server_is_refused_at_start(db: TestDb) {
    let store = db.store(Settings::default()).await;
    let known = MIGRATIONS.last().unwrap().version;
    sqlx::query(
        "INSERT INTO schema_migrations (version, name, applied_at) VALUES ($1, 'future', 0)",
    )
    .bind(known + 1)
    .execute(store.pool())
    .await
    .unwrap();
    store.close().await;
    let refused = Store::connect(&db.database, Settings::default()).await;
    let message = match refused {
        Ok(_) => panic!("a newer database is refused"),
        Err(e) => e.to_string(),
    };
    assert!(
        message.contains(&format!("schema version {}", known + 1))
            && message.contains(&format!("up to {known}")),
        "{message}"
    );
}

pub async fn running_migrations_twice_is_a_no_op(db: TestDb) {
    let store = db.store(Settings::default()).await;
    store.enqueue("q", &json!(1), None).await.unwrap();
    let before = versions(store.pool()).await;
    assert_eq!(migrate(&store).await.unwrap(), 0, "nothing left to apply");
    let again = db.store(Settings::default()).await; // a second instance starting
    assert_eq!(migrate(&again).await.unwrap(), 0);
    assert_eq!(versions(store.pool()).await, before);
    assert_eq!(store.list("q", None, 0, 10).await.unwrap().items.len(), 1);
}

/// Instances starting together on a fresh database: every start succeeds and
/// each migration is recorded once (forced: all connect behind one barrier,
/// several rounds).
pub async fn concurrent_starts_apply_each_migration_exactly_once(db: TestDb) {
    const STARTS: usize = 6;
    const ROUNDS: usize = 5;
    let all: Vec<i64> = MIGRATIONS.iter().map(|m| m.version).collect();
    for round in 0..ROUNDS {
        let fresh = TestDb::create(db.kind).await.expect("fresh database");
        let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(STARTS));
        let mut starts = Vec::new();
        for _ in 0..STARTS {
            let (fresh, barrier) = (fresh.clone(), barrier.clone());
            starts.push(tokio::spawn(async move {
                barrier.wait().await;
                Store::connect(&fresh.database, Settings::default()).await
            }));
        }
        let mut stores = Vec::new();
        for s in starts {
            stores.push(
                s.await
                    .unwrap()
                    .unwrap_or_else(|e| panic!("round {round}: a concurrent start failed: {e}")),
            );
        }
        assert_eq!(versions(stores[0].pool()).await, all, "round {round}");
        for s in stores {
            s.close().await;
        }
        fresh.cleanup().await;
    }
}

/// `/v1/ready` is 503 while a migration is not recorded (a database restored
/// from an older backup under a running server) and 200 once it is.
pub async fn readiness_is_503_while_a_migration_is_not_recorded(db: TestDb) {
    let server = Server::start(&db.config()).await.unwrap();
    let http = reqwest::Client::new();
    let ready = |http: reqwest::Client, url: String| async move {
        let resp = http.get(format!("{url}/v1/ready")).send().await.unwrap();
        let status = resp.status().as_u16();
        (status, resp.json::<Readiness>().await.unwrap())
    };
    let (status, body) = ready(http.clone(), server.url()).await;
    assert_eq!(
        (status, body.status.as_str(), body.reason),
        (200, "ready", None)
    );
    let last = MIGRATIONS.last().unwrap();
    let pool = server.store().pool();
    sqlx::query("DELETE FROM schema_migrations WHERE version = $1")
        .bind(last.version)
        .execute(pool)
        .await
        .unwrap();
    let (status, body) = ready(http.clone(), server.url()).await;
    assert_eq!((status, body.status.as_str()), (503, "unavailable"));
    assert_eq!(body.reason.as_deref(), Some("1 migration(s) not applied"));
    let health = http
        .get(format!("{}/v1/health", server.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200, "liveness does not look at the schema");
    sqlx::query("INSERT INTO schema_migrations (version, name, applied_at) VALUES ($1, $2, 0)")
        .bind(last.version)
        .bind(last.name)
        .execute(pool)
        .await
        .unwrap();
    assert_eq!(ready(http, server.url()).await.0, 200);
    server.stop().await.unwrap();
}
