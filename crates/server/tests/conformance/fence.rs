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
