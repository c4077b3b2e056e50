//! The request path's database cost, driver against driver: the lease hot path
//! (claim, heartbeat, settle: one statement each) through `sqlx::Any` (what the
//! server uses, one SQL for both backends) and through the typed SQLite driver,
//! with 64 concurrent tasks, on fresh SQLite files. BENCHMARKS.md quotes it.
//!
//! ```text
//! cargo run --release -p agentstore-server --example driver_profile [-- items]
//! ```

#![allow(
    clippy::disallowed_methods,
    reason = "a measurement of drivers, not the server's write path (clippy.toml)"
)]

use std::time::Instant;

use sqlx::any::AnyPoolOptions;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{AnyPool, Executor, SqlitePool};

const TASKS: usize = 64;
const NOW: &str = "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)";

fn schema() -> String {
    format!(
        "CREATE TABLE items (id INTEGER PRIMARY KEY AUTOINCREMENT, queue TEXT NOT NULL,
           state TEXT NOT NULL, token_hash TEXT, heartbeat_at BIGINT, updated_at BIGINT);
         CREATE INDEX items_queue_state ON items (queue, state, id);
         INSERT INTO items (queue, state, updated_at) SELECT 'q', 'open', {NOW}
           FROM (WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c WHERE n < 100000)
                 SELECT n FROM c)"
    )
}

fn claim_sql() -> String {
    format!(
        "UPDATE items SET state = 'running', token_hash = $1, heartbeat_at = {NOW}, updated_at = {NOW}
         WHERE id = (SELECT id FROM items WHERE queue = 'q' AND state = 'open' ORDER BY id LIMIT 1)
         RETURNING id"
    )
}

fn heartbeat_sql() -> String {
    format!(
        "UPDATE items SET heartbeat_at = {NOW}, updated_at = {NOW}
         WHERE id = $1 AND state = 'running' AND token_hash = $2"
    )
}

fn settle_sql() -> String {
    "UPDATE items SET state = 'done', token_hash = NULL WHERE id = $1 AND token_hash = $2".into()
}

macro_rules! one_item {
    ($pool:expr, $n:expr) => {{
        let token = format!("t{}", $n);
        let (id,): (i64,) = sqlx::query_as(&claim_sql())
            .bind(&token)
            .fetch_one($pool)
            .await
            .expect("claim");
        for _ in 0..3 {
            sqlx::query(&heartbeat_sql())
                .bind(id)
                .bind(&token)
                .execute($pool)
                .await
                .expect("heartbeat");
        }
        sqlx::query(&settle_sql())
            .bind(id)
            .bind(&token)
            .execute($pool)
            .await
            .expect("settle");
    }};
}

/// Items per second for `items` items over `pool`, `TASKS` tasks at once.
macro_rules! timed {
    ($pool:expr, $items:expr) => {{
        let start = Instant::now();
        let mut tasks = Vec::new();
        for t in 0..TASKS {
            let pool = $pool.clone();
            tasks.push(tokio::spawn(async move {
                for n in (t..$items).step_by(TASKS) {
                    one_item!(&pool, n);
                }
            }));
        }
        for t in tasks {
            t.await.expect("task");
        }
        $items as f64 / start.elapsed().as_secs_f64()
    }};
}

async fn run_any(path: &str, items: usize) -> f64 {
    sqlx::any::install_default_drivers();
    let url = format!("sqlite://{path}?mode=rwc");
    let pool: AnyPool = AnyPoolOptions::new()
        .max_connections(4)
        .after_connect(|c, _| {
            Box::pin(async move {
                c.execute(agentstore_server::store::SQLITE_SYNCHRONOUS)
                    .await?;
                Ok(())
            })
        })
        .connect(&url)
        .await
        .expect("any pool");
    pool.execute("PRAGMA journal_mode = WAL")
        .await
        .expect("wal");
    for stmt in schema().split(';') {
        pool.execute(stmt).await.expect("schema");
    }
    timed!(pool, items)
}

async fn run_typed(path: &str, items: usize) -> f64 {
    let options = SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full);
    let pool: SqlitePool = SqlitePoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await
        .expect("sqlite pool");
    for stmt in schema().split(';') {
        pool.execute(stmt).await.expect("schema");
    }
    timed!(pool, items)
}

#[tokio::main]
async fn main() {
    let items: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(4_000);
    let dir = std::env::temp_dir().join(format!("agentstore-driver-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let mut rows = Vec::new();
    for round in 0..3 {
        let any = run_any(
            &dir.join(format!("any{round}.db")).display().to_string(),
            items,
        )
        .await;
        let typed = run_typed(
            &dir.join(format!("typed{round}.db")).display().to_string(),
            items,
        )
        .await;
        rows.push((any, typed));
    }
    let _ = std::fs::remove_dir_all(&dir);
    println!("items/s (claim + 3 heartbeats + settle = 5 statements each), {TASKS} tasks, pool 4:");
    println!("| round | sqlx::Any | typed SqlitePool | typed / Any |");
    println!("|---|---:|---:|---:|");
    for (i, (any, typed)) in rows.iter().enumerate() {
        println!("| {} | {any:.0} | {typed:.0} | {:.2} |", i + 1, typed / any);
    }
}
