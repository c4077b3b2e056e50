//! `--retention-ms`: settled items (`done`, `failed`) older than the
//! retention are deleted by the reaper's sweep, and nothing else is.
//! Before it, items were never deleted: the table, every listing of done
//! items and every `/metrics` scrape (which groups all items) grew without
//! bound on a busy server.

use agentstore_protocol::lease::{ItemState, SettleState};
use agentstore_server::{Settings, Store};
use serde_json::json;

use crate::common::TestDb;
use crate::lease::token;

const HOUR: u64 = 3600 * 1000;

/// A store with a one-hour retention on `db`, and a raw pool to age rows.
async fn retained(db: &TestDb) -> (Store, sqlx::AnyPool) {
    let store = db
        .store(Settings {
            retention_ms: HOUR,
            ..Settings::default()
        })
        .await;
    (store, db.raw_pool().await)
}

/// Moves item `id`'s `updated_at` two hours back, so that it looks settled
/// then (no test waits on the clock).
async fn settled_two_hours_earlier(pool: &sqlx::AnyPool, id: i64) {
    sqlx::query("UPDATE items SET updated_at = updated_at - $1 WHERE id = $2")
        .bind(2 * HOUR as i64)
        .bind(id)
        .execute(pool)
        .await
        .unwrap();
}

/// Enqueues one item in `queue`, claims it and settles it as `state`.
async fn settled(store: &Store, queue: &str, state: SettleState, key: Option<&str>) -> i64 {
    let (ended, _) = store
        .enqueue_once(queue, &json!({"q": queue}), None, None, key)
        .await
        .unwrap();
    let t = token(store, queue, None).await;
    store
        .settle(ended.id(), &t, None, state, None, Some("e"))
        .await
        .unwrap();
    ended.id()
}

/// Items in every state, half of them made to look settled two hours ago
/// (their `updated_at` moved back in SQL, so no test waits on the clock):
/// one sweep deletes exactly the old `done` and `failed` ones; the young
/// settled ones, and items of every other state however old, stay. The key
/// of a deleted keyed item enqueues a new item; the sweep is counted in
/// `/metrics`; with retention 0 nothing is ever deleted.
pub async fn settled_items_past_the_retention_are_deleted_and_nothing_else(db: TestDb) {
    let (store, pool) = retained(&db).await;
    let mut old = Vec::new();
    let mut kept = Vec::new();
    for age in ["old", "young"] {
        let done = settled(&store, &format!("{age}-done"), SettleState::Done, None).await;
        let failed = settled(&store, &format!("{age}-failed"), SettleState::Failed, None).await;
        let keyed = settled(
            &store,
            &format!("{age}-keyed"),
            SettleState::Done,
            Some("k"),
        )
        .await;
        let blocked = settled(
            &store,
            &format!("{age}-blocked"),
            SettleState::Blocked,
            None,
        )
        .await;
        let paused = settled(&store, &format!("{age}-paused"), SettleState::Paused, None).await;
        let open = store
            .enqueue(&format!("{age}-open"), &json!(1), None)
            .await
            .unwrap()
            .id;
        store
            .enqueue(&format!("{age}-running"), &json!(1), None)
            .await
            .unwrap();
        let running = store
            .claim(&format!("{age}-running"), None)
            .await
            .unwrap()
            .unwrap()
            .item
            .id;
        let all = [done, failed, keyed, blocked, paused, open, running];
        if age == "old" {
            for id in all {
                settled_two_hours_earlier(&pool, id).await;
            }
            old.extend([done, failed, keyed]);
            kept.extend([blocked, paused, open, running]);
        } else {
            kept.extend(all);
        }
    }
    let off = db.store(Settings::default()).await;
    assert_eq!(
        off.delete_settled().await.unwrap(),
        0,
        "retention 0 keeps all"
    );

    assert_eq!(store.metrics().delete_settled(&store).await.unwrap(), 3);
    for id in &old {
        assert!(
            store.item(*id).await.unwrap().is_none(),
            "item {id} deleted"
        );
    }
    for id in &kept {
        assert!(store.item(*id).await.unwrap().is_some(), "item {id} kept");
    }
    assert_eq!(
        store.item(kept[2]).await.unwrap().unwrap().state,
        ItemState::Open
    );
    assert_eq!(
        store.delete_settled().await.unwrap(),
        0,
        "nothing more to delete"
    );

    // The deleted keyed item's key adds a new item; the young one's replays.
    let (again, replayed) = store
        .enqueue_once(
            "old-keyed",
            &json!({"q": "old-keyed"}),
            None,
            None,
            Some("k"),
        )
        .await
        .unwrap();
    assert!(!replayed && !old.contains(&again.id()), "a new item");
    let (_, replayed) = store
        .enqueue_once(
            "young-keyed",
            &json!({"q": "young-keyed"}),
            None,
            None,
            Some("k"),
        )
        .await
        .unwrap();
    assert!(replayed, "a kept item's key still replays");

    let text = crate::common::render(&store).await.unwrap();
    assert!(
        text.lines()
            .any(|l| l == "agentstore_settled_items_deleted_total 3"),
        "counted in /metrics"
    );
}

/// A server started with `--retention-ms` deletes an item settled longer
/// ago than that by itself (the reaper's sweep, every tenth pass), and keeps
/// one settled since; `--retention-ms 0` (the default) keeps both.
pub async fn a_server_with_a_retention_deletes_old_settled_items_by_itself(db: TestDb) {
    let pool = db.raw_pool().await;
    for retention_ms in [120_000, 0] {
        let mut config = db.config();
        config.reaper_ms = 10;
        config.retention_ms = retention_ms;
        let server = agentstore_server::Server::start(&config)
            .await
            .expect("start server");
        let store = server.store().clone();
        let old = settled(&store, "sweep-old", SettleState::Failed, None).await;
        sqlx::query("UPDATE items SET updated_at = updated_at - $1 WHERE id = $2")
            .bind(600_000_i64)
            .bind(old)
            .execute(&pool)
            .await
            .unwrap();
        let young = settled(&store, "sweep-young", SettleState::Done, None).await;
        if retention_ms == 0 {
            // Dozens of sweeps' worth of reaper passes: a pass that deletes
            // nothing leaves no trace to wait for, so the wait is on passes.
            let passes = |text: &str| {
                text.lines()
                    .find_map(|l| l.strip_prefix("agentstore_reaper_pass_duration_seconds_count "))
                    .and_then(|n| n.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            let start = passes(&crate::common::render(&store).await.unwrap());
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
            while passes(&crate::common::render(&store).await.unwrap()) < start + 40 {
                assert!(std::time::Instant::now() < deadline, "the reaper never ran");
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
            assert!(
                store.item(old).await.unwrap().is_some(),
                "retention 0 keeps it"
            );
        } else {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
            while store.item(old).await.unwrap().is_some() {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the sweep never deleted the old item"
                );
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        }
        assert!(
            store.item(young).await.unwrap().is_some(),
            "a young one stays"
        );
        server.stop().await.unwrap();
    }
}

/// The first reaper pass after a start sweeps (retention, and the purges
/// of expired credentials and old claim keys), not only every tenth: a
/// server restarted more often than ten passes (rolling deploys, crash
/// loops, scale to zero) still deletes what is due. Here the second server
/// runs one pass only (a reaper interval of an hour: the first pass comes at
/// start). Before, the pass counter started at 1 and that pass swept
/// nothing, so such a server never deleted a settled item. Found by
/// helper-222.
pub async fn the_first_reaper_pass_after_a_start_sweeps(db: TestDb) {
    let pool = db.raw_pool().await;
    let mut config = db.config();
    config.reaper_ms = 3_600_000;
    config.retention_ms = 120_000;
    let first = agentstore_server::Server::start(&config)
        .await
        .expect("start server");
    let old = settled(first.store(), "first-pass", SettleState::Done, None).await;
    settled_two_hours_earlier(&pool, old).await;
    first.stop().await.unwrap();
    let server = agentstore_server::Server::start(&config)
        .await
        .expect("start server again");
    let store = server.store().clone();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while store.item(old).await.unwrap().is_some() {
        assert!(
            std::time::Instant::now() < deadline,
            "the first pass after the start never deleted the old item"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    server.stop().await.unwrap();
}

/// A keyed enqueue sent again while the retention sweep deletes the item
/// that key added: the INSERT is refused by the key, and the item can be
/// gone by the time it is read. Before, that read failed and the enqueue
/// answered 500; now the key is free again and the enqueue adds a new item
/// (or, when the sweep came after the read, replays the old one). Each round
/// starts the enqueue and the sweep together (the enqueue's INSERT is sent
/// first, then the sweep's DELETE), 150 rounds.
pub async fn a_keyed_enqueue_replayed_while_retention_deletes_its_item_is_answered(db: TestDb) {
    let (store, pool) = retained(&db).await;
    let (mut replayed_n, mut added_n) = (0, 0);
    for round in 0..150 {
        let queue = format!("race-{round}");
        let old = settled(&store, &queue, SettleState::Done, Some("k")).await;
        settled_two_hours_earlier(&pool, old).await;
        let payload = json!({"q": queue});
        let (enqueued, swept) = tokio::join!(
            store.enqueue_once(&queue, &payload, None, None, Some("k")),
            store.delete_settled(),
        );
        let (ended, replayed) = enqueued.unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert_eq!(swept.unwrap(), 1, "round {round}: the old item is swept");
        if replayed {
            assert_eq!(
                ended.id(),
                old,
                "round {round}: a replay names the old item"
            );
            replayed_n += 1;
        } else {
            assert_ne!(ended.id(), old, "round {round}: a new item");
            assert!(store.item(ended.id()).await.unwrap().is_some());
            added_n += 1;
        }
    }
    eprintln!("keyed enqueue vs sweep: {replayed_n} replays, {added_n} new items");
}

/// Due `done` rows a sweep of this test makes: more than two sweeps
/// delete ([`agentstore_server::store::DELETE_MAX`] each).
const BACKLOG: i64 = 45_000;

/// A backlog the planner does not know of: the table analyzed while it held
/// a few open items, then 45,000 `done` rows settled long ago inserted in
/// one statement (autovacuum kept off the table on PostgreSQL, so the
/// statistics stay stale), swept by two instances at once. Before, the
/// sweep's `id IN (… LIMIT … FOR UPDATE SKIP LOCKED)` ran as a nested loop
/// whose inner side locked its page again for every outer row: both
/// DELETEs stalled on the lock manager until `statement_timeout` (60 s by
/// default, 10 s here) canceled them, and the reaper waited meanwhile. Now
/// each statement picks its page once: every due row goes within a few
/// pairs of sweeps and no sweep fails.
pub async fn two_sweeps_of_a_backlog_the_planner_underestimates_delete_it_all(db: TestDb) {
    let url = match db.kind {
        crate::common::Kind::Postgres => {
            format!("{}%20-c%20statement_timeout%3D10000", db.database)
        }
        crate::common::Kind::Sqlite => db.database.clone(),
    };
    let settings = Settings {
        retention_ms: HOUR,
        ..Settings::default()
    };
    let a = Store::connect(&url, settings).await.unwrap();
    let b = Store::connect(&url, settings).await.unwrap();
    for _ in 0..5 {
        a.enqueue("backlog-open", &json!(1), None).await.unwrap();
    }
    if db.kind == crate::common::Kind::Postgres {
        sqlx::query("ALTER TABLE items SET (autovacuum_enabled = false)")
            .execute(a.pool())
            .await
            .unwrap();
    }
    sqlx::query("ANALYZE items")
        .execute(a.pool())
        .await
        .unwrap();
    due_done_rows(a.pool(), "backlog", BACKLOG).await;

    let mut deleted = 0;
    for round in 0..4 {
        let swept = crate::common::at_once(2, |k| {
            let store = [&a, &b][k].clone();
            async move { store.delete_settled().await }
        })
        .await;
        for (k, s) in swept.into_iter().enumerate() {
            deleted += s.unwrap_or_else(|e| panic!("round {round}: sweep {k} failed: {e}"));
        }
        if deleted == BACKLOG as u64 {
            break;
        }
    }
    assert_eq!(
        deleted, BACKLOG as u64,
        "every due row deleted within 4 pairs of sweeps"
    );
    let (left,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM items WHERE queue = 'backlog'")
        .fetch_one(a.pool())
        .await
        .unwrap();
    assert_eq!(left, 0);
    let (open,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM items WHERE state = 'open'")
        .fetch_one(a.pool())
        .await
        .unwrap();
    assert_eq!(open, 5, "the open items stay");
    a.close().await;
    b.close().await;
}

/// Inserts `n` `done` items into `queue` in one statement, settled at
/// `updated_at` 1, 2, … `n` ms after the epoch (long past any retention, in
/// that order).
async fn due_done_rows(pool: &sqlx::AnyPool, queue: &str, n: i64) {
    sqlx::query(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < $1)
         INSERT INTO items (queue, state, payload, attempts, max_redeliveries, epoch,
                            created_at, updated_at)
         SELECT $2, 'done', '1', 1, 5, 1, i, i FROM n",
    )
    .bind(n)
    .bind(queue)
    .execute(pool)
    .await
    .unwrap();
}

/// `agentstore_settled_items_deleted_total` in `store`'s scrape.
async fn deleted_total(store: &Store) -> u64 {
    let text = crate::common::render(store).await.unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("agentstore_settled_items_deleted_total "))
        .and_then(|n| n.parse().ok())
        .expect("the counter")
}

/// A sweep that fails on its second page (a trigger refuses to delete one
/// of its rows): its first page of 1,000 rows is committed and gone, and
/// `agentstore_settled_items_deleted_total` says 1,000. Before, a sweep
/// counted only when it ended well, so it said 0 though 1,000 rows were
/// gone for good. Once the trigger is dropped the next sweep deletes and
/// counts the other 500.
pub async fn a_sweep_failing_partway_counts_the_pages_it_deleted(db: TestDb) {
    let (store, pool) = retained(&db).await;
    due_done_rows(&pool, "partway", 1_500).await;
    let (refused,): (i64,) = sqlx::query_as("SELECT id FROM items WHERE updated_at = 1200")
        .fetch_one(&pool)
        .await
        .unwrap();
    let create: &[String] = match db.kind {
        crate::common::Kind::Sqlite => &[format!(
            "CREATE TRIGGER refuse_one BEFORE DELETE ON items WHEN OLD.id = {refused}
             BEGIN SELECT RAISE(ABORT, 'refused'); END"
        )],
        crate::common::Kind::Postgres => &[
            format!(
                "CREATE FUNCTION refuse_one() RETURNS trigger LANGUAGE plpgsql AS $$
                 BEGIN
                     IF OLD.id = {refused} THEN RAISE EXCEPTION 'refused'; END IF;
                     RETURN OLD;
                 END $$"
            ),
            "CREATE TRIGGER refuse_one BEFORE DELETE ON items
             FOR EACH ROW EXECUTE FUNCTION refuse_one()"
                .to_owned(),
        ],
    };
    for sql in create {
        sqlx::query(sql).execute(&pool).await.unwrap();
    }

    let failed = store.metrics().delete_settled(&store).await;
    assert!(failed.is_err(), "the second page is refused: {failed:?}");
    let (left,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM items")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(left, 500, "the first page is gone");
    assert_eq!(deleted_total(&store).await, 1_000, "and counted");

    let drop = match db.kind {
        crate::common::Kind::Sqlite => "DROP TRIGGER refuse_one",
        crate::common::Kind::Postgres => "DROP TRIGGER refuse_one ON items",
    };
    sqlx::query(drop).execute(&pool).await.unwrap();
    assert_eq!(store.metrics().delete_settled(&store).await.unwrap(), 500);
    assert_eq!(
        deleted_total(&store).await,
        1_500,
        "every row deleted counted"
    );
}
