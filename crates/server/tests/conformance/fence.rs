//! Why fenced writes matched no row, told for many at once: a batch of
//! heartbeats (or settles) that were not applied is classified with ONE
//! statement, whatever their number, and each keeps its own answer.

use std::time::{Duration, Instant};

use agentstore_protocol::lease::SettleState;
use agentstore_protocol::ErrorCode;
use serde_json::json;

use crate::common::{statements, ttl, TestDb};

const LONG: u64 = 60_000;

fn codes(outcomes: &[Result<u64, agentstore_server::StoreError>]) -> Vec<Option<ErrorCode>> {
    outcomes
        .iter()
        .map(|o| match o {
            Ok(_) => None,
            Err(e) => Some(e.code().expect("a protocol code, not a database error")),
        })
        .collect()
}

/// One batch mixing every kind of failure — a missing item, a wrong token,
/// a lease taken over by the reaper (and claimed again), a lease released
/// (and claimed again), a settled item, another worker's lease, an item
/// paused under its current token — answers each entry as a single
/// heartbeat does, at the cost of two statements: the renewal and ONE read
/// of why the others failed. Before, each entry not renewed ran its own
/// read, one after another: a batch of 500 bogus leases cost 501
/// statements. A settle with a stale token costs its update and one read
/// (before: two).
pub async fn a_batch_of_failed_heartbeats_is_classified_in_one_statement(db: TestDb) {
    let store = db.store(ttl(LONG)).await;
    let short = db.store(ttl(150)).await;
    let (me, other) = (Some(1), Some(2));
    let mut ids = Vec::new();
    for k in 0..7 {
        ids.push(store.enqueue("q", &json!(k), None).await.unwrap().id);
    }
    let mut tokens = Vec::new();
    for (k, _) in ids.iter().enumerate() {
        // Item 2's lease is granted with a 150 ms TTL; item 4's holder is another worker.
        let (by, worker) = match k {
            2 => (&short, me),
            4 => (&store, other),
            _ => (&store, me),
        };
        let c = by.claim("q", worker).await.unwrap().expect("claim");
        assert_eq!(c.item.id, ids[k]);
        tokens.push(c.lease.token);
    }
    // 2: taken over by the reaper, then claimed again.
    let deadline = Instant::now() + Duration::from_secs(20);
    while short.reap().await.unwrap() == (0, 0) {
        assert!(Instant::now() < deadline, "item 2 never expired");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // 3: released, then claimed again.
    store.release(ids[3], &tokens[3], me).await.unwrap();
    for _ in 0..2 {
        store.claim("q", me).await.unwrap().expect("claimed again");
    }
    // 5: settled. 6: paused by the operator, its token still current.
    store
        .settle(ids[5], &tokens[5], me, SettleState::Done, None, None)
        .await
        .unwrap();
    store.pause(ids[6]).await.unwrap();

    let missing = ids[6] + 1_000;
    let batch: Vec<(i64, &str)> = vec![
        (ids[0], tokens[0].as_str()),
        (missing, "no-such-token"),
        (ids[1], "not-its-token"),
        (ids[2], tokens[2].as_str()),
        (ids[3], tokens[3].as_str()),
        (ids[4], tokens[4].as_str()),
        (ids[5], tokens[5].as_str()),
        (ids[6], tokens[6].as_str()),
        (ids[1], "not-its-token"),
        (missing, "no-such-token"),
    ];
    let expected = vec![
        None,
        Some(ErrorCode::NotFound),
        Some(ErrorCode::ClaimLost),
        Some(ErrorCode::ClaimLost),
        Some(ErrorCode::ClaimLost),
        Some(ErrorCode::Forbidden),
        Some(ErrorCode::ClaimLost),
        Some(ErrorCode::StateConflict),
        Some(ErrorCode::ClaimLost),
        Some(ErrorCode::NotFound),
    ];
    // The same answers one by one.
    for ((id, token), want) in batch.iter().zip(&expected) {
        let single = store.heartbeat(*id, token, me).await;
        assert_eq!(single.err().and_then(|e| e.code()), *want, "item {id}");
    }
    let (outcomes, n) = statements(&store, store.heartbeat_many(&batch, me)).await;
    assert_eq!(codes(&outcomes.unwrap()), expected);
    assert_eq!(n, 2, "one renewal and one read of why");

    // 500 bogus leases: still two statements.
    let bogus: Vec<(i64, String)> = (0..500)
        .map(|k| (ids[k % 7] + (k as i64 / 7) * 10_000, format!("bogus-{k}")))
        .collect();
    let bogus: Vec<(i64, &str)> = bogus.iter().map(|(id, t)| (*id, t.as_str())).collect();
    let (outcomes, n) = statements(&store, store.heartbeat_many(&bogus, me)).await;
    let outcomes = outcomes.unwrap();
    assert_eq!(outcomes.len(), 500);
    for ((id, _), code) in bogus.iter().zip(codes(&outcomes)) {
        let want = if ids.contains(id) {
            ErrorCode::ClaimLost
        } else {
            ErrorCode::NotFound
        };
        assert_eq!(code, Some(want), "item {id}");
    }
    assert_eq!(n, 2, "a batch of 500 bogus leases");

    // A stale settle: its update and one read (replay or why not).
    let (settled, n) = statements(
        &store,
        store.settle(ids[1], "not-its-token", me, SettleState::Done, None, None),
    )
    .await;
    assert_eq!(settled.unwrap_err().code(), Some(ErrorCode::ClaimLost));
    assert_eq!(n, 2, "a stale settle");
}

/// A batch of heartbeats or settles naming rows its caller does not hold
/// (an open item of another queue, another worker's lease; junk tokens)
/// takes no row lock on them (PostgreSQL): while the batch statement runs,
/// another session can lock both rows (`FOR UPDATE SKIP LOCKED` returns
/// them) and a claim of that queue takes the open item. Before, the batch
/// statement's lock step locked every id named, whatever its token, holder
/// or state: any worker could make concurrent claims skip open items
/// (`204` while items were open) and push holders' settles to the alone
/// path. The statement is held open deterministically: a trigger on the
/// caller's own lease (renewed or settled in the same statement) waits
/// for an advisory lock this test holds, until the checks are done. Ids
/// are ordered so that the rows named come before the caller's lease. On
/// SQLite (no row locks) there is nothing to check.
pub async fn a_batch_naming_rows_its_caller_does_not_hold_locks_none_of_them(db: TestDb) {
    if db.kind != crate::common::Kind::Postgres {
        return;
    }
    let store = db.store(ttl(LONG)).await;
    let (intruder, holder, claimer) = (Some(1), Some(2), Some(3));
    let junk = "0".repeat(48);
    let key: i64 = rand::random::<i64>() & 0x7fff_ffff_ffff;
    sqlx::query(&format!(
        "CREATE FUNCTION stall_update() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN PERFORM pg_advisory_xact_lock({key}); RETURN NEW; END $$"
    ))
    .execute(store.pool())
    .await
    .unwrap();
    sqlx::query(
        "CREATE TRIGGER stall BEFORE UPDATE ON items FOR EACH ROW
         WHEN (OLD.queue = 'stall') EXECUTE FUNCTION stall_update()",
    )
    .execute(store.pool())
    .await
    .unwrap();

    // Holds the advisory lock; returns the session and its pid.
    let hold = || async {
        let mut tx = store.pool().begin().await.unwrap();
        sqlx::query(&format!("SELECT pg_advisory_xact_lock({key})"))
            .execute(&mut *tx)
            .await
            .unwrap();
        let (pid,): (i32,) = sqlx::query_as("SELECT pg_backend_pid()")
            .fetch_one(&mut *tx)
            .await
            .unwrap();
        (tx, pid)
    };
    // Waits (bounded) until a session waits for `pid`'s lock.
    let blocked_by = |pid: i32| {
        let pool = store.pool().clone();
        async move {
            let until = Instant::now() + Duration::from_secs(20);
            loop {
                let (n,): (i64,) = sqlx::query_as(
                    "SELECT COUNT(*) FROM pg_stat_activity
                     WHERE wait_event_type = 'Lock' AND $1 = ANY(pg_blocking_pids(pid))",
                )
                .bind(pid)
                .fetch_one(&pool)
                .await
                .unwrap();
                if n >= 1 {
                    return;
                }
                assert!(Instant::now() < until, "the batch statement waits");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    };
    // The rows of `ids` another session can lock now.
    let lockable = |ids: [i64; 2]| {
        let pool = store.pool().clone();
        async move {
            let mut tx = pool.begin().await.unwrap();
            let rows: Vec<(i64,)> = sqlx::query_as(
                "SELECT id FROM items WHERE id IN ($1, $2) ORDER BY id FOR UPDATE SKIP LOCKED",
            )
            .bind(ids[0])
            .bind(ids[1])
            .fetch_all(&mut *tx)
            .await
            .unwrap();
            tx.rollback().await.unwrap();
            rows.into_iter().map(|(id,)| id).collect::<Vec<_>>()
        }
    };

    // Heartbeats. Another worker's lease, an open item, then the intruder's own lease.
    let held = store.enqueue("other", &json!("held"), None).await.unwrap();
    let held_lease = store.claim("other", holder).await.unwrap().unwrap();
    assert_eq!(held_lease.item.id, held.id);
    let open = store.enqueue("other", &json!("open"), None).await.unwrap();
    store.enqueue("stall", &json!("own"), None).await.unwrap();
    let own = store.claim("stall", intruder).await.unwrap().unwrap();
    assert!(held.id < open.id && open.id < own.item.id);
    // Once a batch statement waits on the held lock: it locked neither `held`
    // nor `open` (another session can lock both), and a claim takes `open`.
    let held_id = held.id;
    let neither_locked = |pid: i32, open: i64, what: &'static str| {
        let (store, blocked, rows) = (store.clone(), blocked_by(pid), lockable([held_id, open]));
        async move {
            blocked.await;
            assert_eq!(
                rows.await,
                vec![held_id, open],
                "the {what} batch locked rows its caller does not hold"
            );
            let got = store.claim("other", claimer).await.unwrap();
            assert_eq!(
                got.map(|c| c.item.id),
                Some(open),
                "a claim takes the open item"
            );
        }
    };
    let (tx, pid) = hold().await;
    let batch = {
        let (store, junk, t) = (store.clone(), junk.clone(), own.lease.token.clone());
        let own = own.item.id;
        tokio::spawn(async move {
            store
                .heartbeat_many(&[(held.id, &junk), (open.id, &junk), (own, &t)], intruder)
                .await
        })
    };
    neither_locked(pid, open.id, "heartbeat").await;
    tx.commit().await.unwrap();
    let out = batch.await.unwrap().unwrap();
    assert!(
        out[0].is_err() && out[1].is_err() && out[2].is_ok(),
        "{out:?}"
    );

    // Settles, in one coalesced statement (the lane stalled behind a
    // decoy until all three joined it).
    let open = store
        .enqueue("other", &json!("open 2"), None)
        .await
        .unwrap();
    store.enqueue("stall", &json!("own 2"), None).await.unwrap();
    let own = store.claim("stall", intruder).await.unwrap().unwrap();
    let decoy = store.enqueue("decoy", &json!("decoy"), None).await.unwrap();
    let t_decoy = store.claim("decoy", None).await.unwrap().unwrap();
    assert_eq!(t_decoy.item.id, decoy.id);
    let (tx, pid) = hold().await;
    let (lane, decoy_settle) =
        crate::settled::stall_settle_lane(&store, decoy.id, t_decoy.lease.token).await;
    let settle = |id: i64, token: String| {
        let store = store.clone();
        tokio::spawn(async move {
            store
                .settle(id, &token, intruder, SettleState::Done, None, None)
                .await
        })
    };
    let calls = [
        settle(held.id, junk.clone()),
        settle(open.id, junk.clone()),
        settle(own.item.id, own.lease.token.clone()),
    ];
    crate::settled::wait_settles_waiting(&store, calls.len()).await;
    lane.commit().await.unwrap();
    decoy_settle.await.unwrap().expect("the decoy settled");
    neither_locked(pid, open.id, "settle").await;
    tx.commit().await.unwrap();
    let [a, b, c] = calls;
    assert!(a.await.unwrap().is_err() && b.await.unwrap().is_err());
    assert!(c.await.unwrap().is_ok(), "the intruder's own lease settled");
    // The other worker's lease was never touched.
    store
        .heartbeat(held.id, &held_lease.lease.token, holder)
        .await
        .expect("the holder still holds its lease");
}
