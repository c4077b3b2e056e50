//! Test databases for the conformance suite: a fresh SQLite file, or a fresh
//! schema in the PostgreSQL server named by `AGENTSTORE_TEST_PG_URL`.

use std::future::Future;
use std::path::PathBuf;

use agentstore_protocol::lease::WorkerCredentials;
use agentstore_server::store::database_url;
use agentstore_server::{Config, Settings, Store};
use rand::RngCore;
use sqlx::Connection;

/// Which backend a generated test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Sqlite,
    Postgres,
}

/// One isolated database for one test.
#[derive(Debug, Clone)]
pub struct TestDb {
    pub kind: Kind,
    /// What to pass as `--database`.
    pub database: String,
    dir: Option<PathBuf>,
    pg: Option<(String, String)>,
}

fn suffix() -> String {
    let mut b = [0u8; 6];
    rand::rngs::OsRng.fill_bytes(&mut b);
    hex::encode(b)
}

impl TestDb {
    /// A fresh database, or `None` when PostgreSQL is not configured outside CI.
    ///
    /// # Panics
    /// In CI (`CI` set) without `AGENTSTORE_TEST_PG_URL`: the PostgreSQL half of the
    /// suite must run there, never skip silently.
    pub async fn create(kind: Kind) -> Option<TestDb> {
        sqlx::any::install_default_drivers();
        match kind {
            Kind::Sqlite => {
                let dir = std::env::temp_dir().join(format!("agentstore-test-{}", suffix()));
                std::fs::create_dir_all(&dir).expect("temp dir");
                let database = dir.join("db.sqlite").display().to_string();
                Some(TestDb {
                    kind,
                    database,
                    dir: Some(dir),
                    pg: None,
                })
            }
            Kind::Postgres => {
                let base = match std::env::var("AGENTSTORE_TEST_PG_URL") {
                    Ok(url) if !url.is_empty() => url,
                    _ => {
                        assert!(
                            std::env::var_os("CI").is_none(),
                            "CI is set but AGENTSTORE_TEST_PG_URL is not: start PostgreSQL with \
                             scripts/pg.sh start and export the URL it prints"
                        );
                        eprintln!(
                            "NOTICE: AGENTSTORE_TEST_PG_URL is not set; skipping the PostgreSQL \
                             variant (run scripts/pg.sh start)"
                        );
                        return None;
                    }
                };
                let schema = format!("t_{}", suffix());
                let mut conn = sqlx::AnyConnection::connect(&base)
                    .await
                    .expect("connect to PostgreSQL");
                sqlx::query(&format!("CREATE SCHEMA {schema}"))
                    .execute(&mut conn)
                    .await
                    .expect("create schema");
                conn.close().await.ok();
                let sep = if base.contains('?') { '&' } else { '?' };
                let database = format!("{base}{sep}options=-c%20search_path%3D{schema}");
                Some(TestDb {
                    kind,
                    database,
                    dir: None,
                    pg: Some((base, schema)),
                })
            }
        }
    }

    /// A new store instance (its own pool) on this database.
    pub async fn store(&self, settings: Settings) -> Store {
        Store::connect(&self.database, settings)
            .await
            .expect("connect store")
    }

    /// A server config on this database with a test admin token, and a
    /// metrics read timeout of a minute: a test that reads the queue gauges
    /// must not see them stale (`agentstore_queue_stats_up` 0) because the
    /// database stalled for 2 s on a busy machine. The test of that timeout
    /// sets its own.
    pub fn config(&self) -> Config {
        let mut config = Config::for_tests(&self.database, ADMIN);
        config.metrics_read_timeout_ms = METRICS_READ.as_millis() as u64;
        config
    }

    /// A raw pool on this database (no migrations), for hand-built schemas.
    pub async fn raw_pool(&self) -> sqlx::AnyPool {
        let (_, url) = database_url(&self.database);
        sqlx::AnyPool::connect(&url).await.expect("raw pool")
    }

    /// Deletes the database (file or schema).
    pub async fn cleanup(self) {
        if let Some(dir) = self.dir {
            let _ = std::fs::remove_dir_all(dir);
        }
        if let Some((base, schema)) = self.pg {
            if let Ok(mut conn) = sqlx::AnyConnection::connect(&base).await {
                let _ = sqlx::query(&format!("DROP SCHEMA {schema} CASCADE"))
                    .execute(&mut conn)
                    .await;
                let _ = conn.close().await;
            }
        }
    }
}

/// The admin token test servers use.
pub const ADMIN: &str = "test-admin-token";

/// Runs one behaviour on a fresh database of `kind`, then drops the database.
pub async fn run<F, Fut>(kind: Kind, behaviour: F)
where
    F: FnOnce(TestDb) -> Fut,
    Fut: Future<Output = ()>,
{
    let Some(db) = TestDb::create(kind).await else {
        return;
    };
    behaviour(db.clone()).await;
    db.cleanup().await;
}

/// Settings with a short TTL for tests (ms).
pub fn ttl(ttl_ms: u64) -> Settings {
    Settings {
        ttl_ms,
        heartbeat_ms: ttl_ms / 3,
        ..Settings::default()
    }
}

/// A stored result (or payload) as a value, to compare with `json!(…)`.
pub fn value(raw: Option<agentstore_server::store::RawJson>) -> Option<serde_json::Value> {
    raw.map(|r| r.to_value().expect("stored JSON parses"))
}

/// Sleeps `ms` milliseconds.
pub async fn sleep_ms(ms: u64) {
    tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
}

/// The raw `heartbeat_at` of an item (ms on the database clock).
pub async fn heartbeat_at(store: &Store, id: i64) -> Option<i64> {
    let (v,): (Option<i64>,) = sqlx::query_as("SELECT heartbeat_at FROM items WHERE id = $1")
        .bind(id)
        .fetch_one(store.pool())
        .await
        .expect("read heartbeat_at");
    v
}

/// How long the tests let a scrape wait for the queue gauges' read (see
/// [`TestDb::config`]).
pub const METRICS_READ: std::time::Duration = std::time::Duration::from_secs(60);

/// `store`'s metrics exposition as a scrape renders it, with the tests'
/// [`METRICS_READ`] bound.
pub async fn render(
    store: &agentstore_server::Store,
) -> Result<String, agentstore_server::StoreError> {
    store.metrics().render(store, METRICS_READ).await
}

/// A server on `db` for HTTP-level tests: no limits in the way (the limits
/// have their own tests), the test admin token.
pub async fn http_server(db: &TestDb) -> agentstore_server::Server {
    let mut config = db.config();
    config.claim_rate = "1000000/s".parse().unwrap();
    config.auth_rate = "1000000/s".parse().unwrap();
    agentstore_server::Server::start(&config)
        .await
        .expect("start server")
}

/// Everything a request could change, as text: every item row, every worker
/// and every credential row (their use and expiry included).
pub async fn snapshot(store: &Store) -> Vec<String> {
    const TABLES: [(&str, &[&str]); 5] = [
        (
            "items",
            &[
                "id",
                "queue",
                "state",
                "payload",
                "COALESCE(result, '')",
                "attempts",
                "max_redeliveries",
                "epoch",
                "COALESCE(token_hash, '')",
                "COALESCE(worker_id, 0)",
                "COALESCE(heartbeat_at, 0)",
                "COALESCE(last_error, '')",
                "updated_at",
            ],
        ),
        ("workers", &["id", "COALESCE(name, '')", "role", "queues"]),
        (
            "enrollment_tokens",
            &[
                "selector",
                "COALESCE(used_at, 0)",
                "COALESCE(worker_id, 0)",
                "expires_at",
            ],
        ),
        (
            "refresh_tokens",
            &["selector", "COALESCE(used_at, 0)", "expires_at"],
        ),
        ("access_tokens", &["selector", "expires_at"]),
    ];
    let mut rows = Vec::new();
    for (table, cols) in TABLES {
        // One text per row: the columns joined with '|'.
        let row = cols
            .iter()
            .map(|c| format!("CAST({c} AS TEXT)"))
            .collect::<Vec<_>>()
            .join(" || '|' || ");
        let sql = format!("SELECT {row} AS r FROM {table} ORDER BY 1");
        let found: Vec<(String,)> = sqlx::query_as(&sql)
            .fetch_all(store.pool())
            .await
            .expect("snapshot");
        rows.extend(found.into_iter().map(|(r,)| format!("{table}: {r}")));
    }
    rows
}

/// The JSON answer of `request` sent with the admin token.
pub async fn admin_json(request: reqwest::RequestBuilder) -> serde_json::Value {
    request
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// Enrolls a worker (every queue) on the server at `base` over HTTP, with an
/// enrollment token the admin creates.
pub async fn enroll(client: &reqwest::Client, base: &str) -> WorkerCredentials {
    let token = admin_json(
        client
            .post(format!("{base}/v1/admin/enrollment-tokens"))
            .json(&serde_json::json!({})),
    )
    .await;
    let resp = client
        .post(format!("{base}/v1/workers/enroll"))
        .json(&serde_json::json!({"token": token["token"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    resp.json().await.unwrap()
}

/// Asserts that the server at `url` counts `n` committed operator calls of
/// `action` in `agentstore_operator_actions_total` (its `/metrics`, read
/// with the admin token).
pub async fn assert_operator_actions(url: &str, action: &str, n: u64) {
    let metrics = reqwest::Client::new()
        .get(format!("{url}/metrics"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let want = format!("agentstore_operator_actions_total{{action=\"{action}\"}} {n}");
    assert!(
        metrics.lines().any(|l| l == want),
        "want {want}:\n{}",
        metrics
            .lines()
            .filter(|l| l.contains("operator_actions"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// Runs `n` tasks that a barrier releases together (the race forced, not
/// hoped for); `f(k)` makes the k-th. Their outputs, in task order.
pub async fn at_once<T, F, Fut>(n: usize, f: F) -> Vec<T>
where
    F: Fn(usize) -> Fut,
    Fut: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(n));
    let tasks: Vec<_> = (0..n)
        .map(|k| {
            let (barrier, task) = (barrier.clone(), f(k));
            tokio::spawn(async move {
                barrier.wait().await;
                task.await
            })
        })
        .collect();
    let mut out = Vec::with_capacity(n);
    for t in tasks {
        out.push(t.await.expect("task"));
    }
    out
}

/// Statements `call` sent on `store`'s pool: connections handed back, read
/// once the pool is idle again (a connection goes back a moment after the
/// call returns). Bounded.
pub async fn statements<T>(store: &Store, call: impl std::future::Future<Output = T>) -> (T, u64) {
    until_idle(store).await;
    let before = store.pool_checkouts();
    let out = call.await;
    until_idle(store).await;
    (out, store.pool_checkouts() - before)
}

pub async fn until_idle(store: &Store) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let pool = store.pool();
    while pool.num_idle() != pool.size() as usize {
        assert!(
            std::time::Instant::now() < deadline,
            "the pool never went idle"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// Enqueues `{"payload": 1}` into `queue` through the HTTP API (admin
/// token); the new item's id.
pub async fn enqueue_over_http(http: &reqwest::Client, base: &str, queue: &str) -> i64 {
    let resp = http
        .post(format!("{base}/v1/queues/{queue}/items"))
        .bearer_auth(ADMIN)
        .json(&serde_json::json!({"payload": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    resp.json::<serde_json::Value>().await.unwrap()["id"]
        .as_i64()
        .unwrap()
}
