//! What PostgreSQL's per-queue enqueue lock costs (`Store::enqueue` takes
//! it so that ids become visible in id order within a queue): `tasks`
//! concurrent tasks each enqueue `per_task` items, all into one queue, then
//! each into a queue of its own, through one `Store` on a fresh schema of
//! the PostgreSQL server named by `AGENTSTORE_TEST_PG_URL`
//! (`scripts/pg.sh start`). `commit_ms` > 0 adds that much latency to every
//! insert (a trigger sleeping after it, standing in for a commit's fsync or
//! a synchronous replica: the test cluster runs with `fsync=off`).
//!
//! ```text
//! cargo run -p agentstore-server --example enqueue_lock_cost [-- tasks per_task commit_ms]
//! ```
//!
//! Prints, per case, the wall time, enqueues per second and the mean and
//! 99th-percentile time of one enqueue as its caller saw it.

use std::time::{Duration, Instant};

use agentstore_server::{Settings, Store};

fn arg(n: usize, default: u64) -> u64 {
    std::env::args()
        .nth(n)
        .map_or(default, |a| a.parse().expect("a number"))
}

/// `tasks` tasks, task `t` enqueuing `per` items into `queue(t)`; the time
/// of each enqueue.
async fn run(store: &Store, tasks: u64, per: u64, queue: fn(u64) -> String) -> Vec<Duration> {
    let mut handles = Vec::new();
    for t in 0..tasks {
        let (store, queue) = (store.clone(), queue(t));
        handles.push(tokio::spawn(async move {
            let mut took = Vec::new();
            for i in 0..per {
                let start = Instant::now();
                store
                    .enqueue(&queue, &serde_json::json!({"t": t, "i": i}), None)
                    .await
                    .expect("enqueue");
                took.push(start.elapsed());
            }
            took
        }));
    }
    let mut all = Vec::new();
    for h in handles {
        all.extend(h.await.expect("task"));
    }
    all
}

fn report(case: &str, wall: Duration, mut took: Vec<Duration>) {
    took.sort_unstable();
    let n = took.len();
    let mean = took.iter().sum::<Duration>() / u32::try_from(n).expect("count");
    let p99 = took[(n * 99 / 100).min(n - 1)];
    println!(
        "{case:<22} {n:>6} enqueues  wall {:>7.0} ms  {:>7.0}/s  mean {:>6.2} ms  p99 {:>6.2} ms",
        wall.as_secs_f64() * 1e3,
        n as f64 / wall.as_secs_f64(),
        mean.as_secs_f64() * 1e3,
        p99.as_secs_f64() * 1e3,
    );
}

#[tokio::main]
async fn main() {
    let (tasks, per, commit_ms) = (arg(1, 8), arg(2, 250), arg(3, 0));
    let base = std::env::var("AGENTSTORE_TEST_PG_URL")
        .expect("AGENTSTORE_TEST_PG_URL: start PostgreSQL with scripts/pg.sh start");
    sqlx::any::install_default_drivers();
    let schema = format!("enqueue_cost_{}", std::process::id());
    let admin = sqlx::AnyPool::connect(&base).await.expect("connect");
    sqlx::query(&format!("CREATE SCHEMA {schema}"))
        .execute(&admin)
        .await
        .expect("create schema");
    let sep = if base.contains('?') { '&' } else { '?' };
    let url = format!("{base}{sep}options=-c%20search_path%3D{schema}");
    let store = Store::connect(&url, Settings::default())
        .await
        .expect("connect store");
    if commit_ms > 0 {
        let pool = sqlx::AnyPool::connect(&url).await.expect("connect");
        sqlx::query(&format!(
            "CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN PERFORM pg_sleep({}); RETURN NULL; END $$",
            commit_ms as f64 / 1e3
        ))
        .execute(&pool)
        .await
        .expect("create function");
        sqlx::query(
            "CREATE TRIGGER slow_commit AFTER INSERT ON items FOR EACH ROW
             EXECUTE FUNCTION slow_commit()",
        )
        .execute(&pool)
        .await
        .expect("create trigger");
    }
    println!("{tasks} tasks x {per} enqueues, {commit_ms} ms added to each insert");
    // Warm the pool and the plans.
    run(&store, tasks, 10, |t| format!("warm{t}")).await;
    for round in 0..2 {
        let start = Instant::now();
        let took = run(&store, tasks, per, |_| "one".to_owned()).await;
        report(&format!("one queue (run {round})"), start.elapsed(), took);
        let start = Instant::now();
        let took = run(&store, tasks, per, |t| format!("q{t}")).await;
        report(
            &format!("{tasks} queues (run {round})"),
            start.elapsed(),
            took,
        );
    }
    store.close().await;
    sqlx::query(&format!("DROP SCHEMA {schema} CASCADE"))
        .execute(&admin)
        .await
        .expect("drop schema");
}
