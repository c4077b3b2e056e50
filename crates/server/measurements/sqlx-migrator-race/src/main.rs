//! Do N instances starting at once on one fresh SQLite file all succeed with
//! sqlx's Migrator? Prints, per round, how many starts failed and why.
//!
//!   cargo run --release --manifest-path crates/server/measurements/sqlx-migrator-race/Cargo.toml -- 2 20
//!
//! (arguments: starts per round, rounds). The server's own migrator passes the
//! same race in `concurrent_starts_apply_each_migration_exactly_once`.
use std::borrow::Cow;
use std::sync::Arc;

use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};
use tokio::sync::Barrier;

const V1: &str = "CREATE TABLE items (id INTEGER PRIMARY KEY AUTOINCREMENT, queue TEXT NOT NULL, state TEXT NOT NULL);
CREATE INDEX items_queue_state ON items (queue, state, id)";
const V2: &str = "ALTER TABLE items ADD COLUMN heartbeat_at BIGINT;
CREATE TABLE workers (id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT)";

fn migrator() -> Migrator {
    let m = |v: i64, d: &'static str, sql: &'static str| {
        Migration::new(
            v,
            Cow::Borrowed(d),
            MigrationType::Simple,
            Cow::Borrowed(sql),
            false,
        )
    };
    Migrator {
        migrations: Cow::Owned(vec![m(1, "items", V1), m(2, "workers", V2)]),
        ..Migrator::DEFAULT
    }
}

#[tokio::main]
async fn main() {
    let n: usize = std::env::args().nth(1).map_or(4, |s| s.parse().unwrap());
    let rounds: usize = std::env::args().nth(2).map_or(20, |s| s.parse().unwrap());
    let mut failed_rounds = 0;
    for round in 0..rounds {
        let path =
            std::env::temp_dir().join(format!("sqlx-race-{}-{round}.sqlite", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let barrier = Arc::new(Barrier::new(n));
        let mut tasks = Vec::new();
        for _ in 0..n {
            // Pools open one after the other (switching to WAL takes a lock);
            // only the migrations start together, behind the barrier.
            let opts = SqliteConnectOptions::new()
                .filename(&path)
                .create_if_missing(true)
                .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal);
            let pool = SqlitePoolOptions::new()
                .max_connections(4)
                .connect_with(opts)
                .await
                .unwrap();
            let barrier = barrier.clone();
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                let r = migrator().run(&pool).await;
                pool.close().await;
                r.map_err(|e| e.to_string())
            }));
        }
        let mut errors = Vec::new();
        for t in tasks {
            if let Err(e) = t.await.unwrap() {
                errors.push(e);
            }
        }
        if !errors.is_empty() {
            failed_rounds += 1;
            println!(
                "round {round}: {} of {n} starts failed: {}",
                errors.len(),
                errors[0]
            );
        }
        let _ = std::fs::remove_file(&path);
    }
    println!("sqlx Migrator, SQLite, {n} concurrent starts x {rounds} rounds: {failed_rounds} rounds with a failed start");
}
