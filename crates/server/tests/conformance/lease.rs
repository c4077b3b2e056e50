//! Claims, heartbeats, fencing and takeover.

use std::sync::Arc;

use agentstore_protocol::lease::{ItemState, SettleState, RETRY_LIMIT_REASON};
use agentstore_protocol::ErrorCode;
use agentstore_server::{Settings, Store};
use serde_json::{json, Value};
use tokio::sync::Barrier;

use crate::common::{at_once, heartbeat_at, sleep_ms, ttl, value, TestDb, ADMIN};

const LONG: u64 = 60_000;

pub(crate) fn code<T: std::fmt::Debug>(r: Result<T, agentstore_server::StoreError>) -> ErrorCode {
    r.expect_err("expected a rejection")
        .code()
        .expect("a protocol code, not a database error")
}

/// The token of a claim of `queue` by `worker` (there must be an item).
pub(crate) async fn token(store: &Store, queue: &str, worker: Option<i64>) -> String {
    store
        .claim(queue, worker)
        .await
        .unwrap()
        .expect("claimed")
        .lease
        .token
}

/// Every fenced call a stale holder might make; each must be `claim_lost`.
async fn assert_all_claim_lost(store: &Store, id: i64, token: &str) {
    assert_eq!(
        code(store.heartbeat(id, token, None).await),
        ErrorCode::ClaimLost,
        "heartbeat"
    );
    for state in [SettleState::Done, SettleState::Blocked, SettleState::Failed] {
        let r = store
            .settle(id, token, None, state, Some(&json!("late")), None)
            .await;
        assert_eq!(code(r), ErrorCode::ClaimLost, "settle {state:?}");
    }
    assert_eq!(
        code(store.release(id, token, None).await),
        ErrorCode::ClaimLost,
        "release"
    );
}

/// The item's full visible state plus its raw heartbeat time.
pub(crate) async fn snapshot(
    store: &Store,
    id: i64,
) -> (agentstore_server::store::Item, Option<i64>) {
    (
        store.item(id).await.unwrap().unwrap(),
        heartbeat_at(store, id).await,
    )
}

/// A claim raises the item's epoch; were its commit lost after it was
/// answered (SQLite's `synchronous = NORMAL` under WAL rolls the last
/// commits back after a power cut), the next claimant would get the same
/// epoch and two holders would fence with one number. Every connection the
/// server's pool hands out must commit durably: SQLite `synchronous = FULL`
/// (2), PostgreSQL `synchronous_commit` not `off`. The pool is drained so
/// that each of its connections answers, not only the first.
pub async fn every_pooled_connection_commits_durably_so_no_answered_epoch_is_reissued(db: TestDb) {
    use sqlx::Row;
    let settings = Settings {
        pool_size: 3,
        ..Settings::default()
    };
    let store = db.store(settings).await;
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(store.pool().acquire().await.expect("a pooled connection"));
    }
    for conn in &mut held {
        match db.kind {
            crate::common::Kind::Sqlite => {
                let row = sqlx::query("PRAGMA synchronous")
                    .fetch_one(&mut **conn)
                    .await
                    .unwrap();
                assert_eq!(row.get::<i64, _>(0), 2, "SQLite synchronous = FULL");
            }
            crate::common::Kind::Postgres => {
                let row = sqlx::query("SHOW synchronous_commit")
                    .fetch_one(&mut **conn)
                    .await
                    .unwrap();
                assert_ne!(row.get::<String, _>(0), "off", "synchronous_commit");
            }
        }
    }
    drop(held);
    store.close().await;
}

pub async fn a_claim_is_atomic_and_raises_the_epoch(db: TestDb) {
    let store = db.store(ttl(LONG)).await;
    let a = store.enqueue("q", &json!({"n": 1}), None).await.unwrap();
    assert_eq!(
        (a.state, a.epoch, a.max_redeliveries),
        (ItemState::Open, 0, 5)
    );
    let c = store.claim("q", Some(7)).await.unwrap().expect("claimed");
    assert_eq!(c.item.id, a.id);
    assert_eq!(
        (c.item.state, c.item.epoch, c.lease.epoch),
        (ItemState::Running, 1, 1)
    );
    assert_eq!(c.item.worker_id, Some(7));
    assert_eq!(c.item.payload, json!({"n": 1}));
    assert!(c.lease.token.len() >= 32, "≥128 bits of token");
    assert_eq!((c.lease.ttl_ms, c.lease.heartbeat_ms), (LONG, LONG / 3));
    assert!(
        store.claim("q", Some(7)).await.unwrap().is_none(),
        "nothing else open"
    );
    assert!(
        store.claim("other", Some(7)).await.unwrap().is_none(),
        "queues are separate"
    );
}

pub async fn a_live_claim_is_not_reclaimed_by_any_instance_reaper_or_fresh_claim(db: TestDb) {
    let a = db.store(ttl(LONG)).await;
    let b = db.store(ttl(LONG)).await;
    let item = a.enqueue("q", &json!(1), None).await.unwrap();
    let c = a.claim("q", None).await.unwrap().expect("claimed");
    sleep_ms(50).await;
    for s in [&a, &b] {
        assert!(
            s.claim("q", None).await.unwrap().is_none(),
            "a fresh claim takes nothing"
        );
        assert_eq!(
            s.reap().await.unwrap(),
            (0, 0),
            "no reaper takes a live claim"
        );
        assert!(s.expired_claims(10).await.unwrap().is_empty());
    }
    let now = b.item(item.id).await.unwrap().unwrap();
    assert_eq!(
        (now.state, now.epoch, now.attempts),
        (ItemState::Running, 1, 0)
    );
    assert_eq!(
        b.heartbeat(item.id, &c.lease.token, None).await.unwrap(),
        LONG
    );
}

/// Instances with different `--ttl-ms` on one database (a rolling config
/// change): a lease expires after the TTL it was GRANTED with. The reaper of
/// an instance with a 150 ms TTL leaves alone a lease granted for `LONG`
/// 300 ms after its claim, and a heartbeat through that instance answers the
/// granted TTL; the other way round, the long-TTL instance takes over a
/// lease the short-TTL instance granted once that lease's 150 ms ran out.
pub async fn a_lease_expires_after_the_ttl_it_was_granted_whichever_instance_looks(db: TestDb) {
    let long = db.store(ttl(LONG)).await;
    let short = db.store(ttl(150)).await;
    let a = long.enqueue("q", &json!("a"), None).await.unwrap();
    let ca = long.claim("q", None).await.unwrap().expect("claimed");
    assert_eq!(ca.lease.ttl_ms, LONG);
    let b = short.enqueue("q", &json!("b"), None).await.unwrap();
    let cb = short.claim("q", None).await.unwrap().expect("claimed");
    assert_eq!((cb.item.id, cb.lease.ttl_ms), (b.id, 150));
    sleep_ms(300).await;
    let expired: Vec<i64> = short
        .expired_claims(10)
        .await
        .unwrap()
        .iter()
        .map(|c| c.id)
        .collect();
    assert_eq!(expired, vec![b.id], "only the 150 ms lease is expired");
    assert_eq!(
        short.heartbeat(a.id, &ca.lease.token, None).await.unwrap(),
        LONG,
        "renewed with the TTL it was granted"
    );
    assert_eq!(long.reap().await.unwrap(), (1, 0), "b's lease ran out");
    assert_eq!(short.reap().await.unwrap(), (0, 0), "a's lease is live");
    let now_a = short.item(a.id).await.unwrap().unwrap();
    assert_eq!((now_a.state, now_a.epoch), (ItemState::Running, 1));
    let now_b = long.item(b.id).await.unwrap().unwrap();
    assert_eq!(
        (now_b.state, now_b.last_error.as_deref()),
        (ItemState::Open, Some("expired"))
    );
    let batch = short
        .heartbeat_many(&[(a.id, ca.lease.token.as_str())], None)
        .await
        .unwrap();
    assert_eq!(batch[0].as_ref().ok(), Some(&LONG));
    // The TTL goes with the lease: cleared by the takeover of b and the
    // settle of a, so a later claim by a binary that does not record it (an
    // older one in a rolling upgrade) is judged by the looking instance's
    // TTL, not a stale one.
    short
        .settle(a.id, &ca.lease.token, None, SettleState::Done, None, None)
        .await
        .unwrap();
    for id in [a.id, b.id] {
        let (ttl,): (Option<i64>,) = sqlx::query_as("SELECT lease_ttl_ms FROM items WHERE id = $1")
            .bind(id)
            .fetch_one(long.pool())
            .await
            .unwrap();
        assert_eq!(ttl, None, "item {id}");
    }
}

/// Concurrent claims whose (coalesced, on PostgreSQL) claim statement
/// committed a row that cannot be read (here: the second item's stored
/// payload does not decode) never leave an item running under a token
/// nobody received: the unreadable row is failed (`unreadable_row`) and
/// only its claim runs again; every item left running is one a caller
/// received, and no claim fails. Before, a failed batch was claimed again
/// claim by claim: the batch's items stayed running under tokens nobody
/// had, and as many more were handed out; later, the corrupt item's claim
/// answered an error with the item left running. 20 rounds of 8 concurrent
/// claims.
pub async fn a_claim_whose_answer_cannot_be_read_hands_out_nothing_more(db: TestDb) {
    let store = Arc::new(db.store(ttl(LONG)).await);
    for round in 0..20 {
        let queue = format!("corrupt{round}");
        let mut ids = Vec::new();
        for k in 0..16 {
            ids.push(store.enqueue(&queue, &json!(k), None).await.unwrap().id);
        }
        // The second item: the first claim of a round usually runs alone
        // (claim_one), the rest as one batch that then contains this item.
        sqlx::query("UPDATE items SET payload = 'not json' WHERE id = $1")
            .bind(ids[1])
            .execute(store.pool())
            .await
            .unwrap();
        let claims = at_once(8, |_| {
            let (store, queue) = (store.clone(), queue.clone());
            async move { store.claim(&queue, None).await }
        })
        .await;
        let (mut received, mut errors) = (0, 0);
        for c in claims {
            match c {
                Ok(Some(_)) => received += 1,
                Ok(None) => {}
                Err(_) => errors += 1,
            }
        }
        let (running,): (i64,) =
            sqlx::query_as("SELECT COUNT(*) FROM items WHERE queue = $1 AND state = 'running'")
                .bind(&queue)
                .fetch_one(store.pool())
                .await
                .unwrap();
        assert_eq!(errors, 0, "round {round}: no claim fails");
        assert_eq!(
            received, 8,
            "round {round}: every claim got a readable item"
        );
        assert_eq!(
            running, received,
            "round {round}: {running} running, {received} received"
        );
        let (state,): (String,) = sqlx::query_as("SELECT state FROM items WHERE id = $1")
            .bind(ids[1])
            .fetch_one(store.pool())
            .await
            .unwrap();
        assert_eq!(state, "failed", "round {round}: the corrupt item");
    }
}

pub async fn an_expired_claim_is_reclaimed_and_the_new_token_differs(db: TestDb) {
    let store = db.store(ttl(150)).await;
    let item = store.enqueue("q", &json!(1), None).await.unwrap();
    let first = store.claim("q", None).await.unwrap().expect("claimed");
    sleep_ms(250).await;
    assert_eq!(store.reap().await.unwrap(), (1, 0));
    let reopened = store.item(item.id).await.unwrap().unwrap();
    assert_eq!((reopened.state, reopened.attempts), (ItemState::Open, 1));
    assert_eq!(reopened.last_error.as_deref(), Some("expired"));
    let second = store.claim("q", None).await.unwrap().expect("reclaimed");
    assert_eq!(second.item.id, item.id);
    assert_ne!(second.lease.token, first.lease.token);
    assert_eq!(second.lease.epoch, 2);
    assert_eq!(
        code(store.heartbeat(item.id, &first.lease.token, None).await),
        ErrorCode::ClaimLost
    );
    store
        .heartbeat(item.id, &second.lease.token, None)
        .await
        .unwrap();
}

pub async fn a_claim_with_no_heartbeat_recorded_counts_as_expired(db: TestDb) {
    let store = db.store(ttl(LONG)).await;
    let old = store.enqueue("q", &json!("old"), None).await.unwrap();
    let fresh = store.enqueue("q", &json!("fresh"), None).await.unwrap();
    store.claim("q", None).await.unwrap().expect("claims old");
    store.claim("q", None).await.unwrap().expect("claims fresh");
    // A running row whose lease start was never recorded (as an older server
    // could leave it): expired however long the TTL.
    sqlx::query("UPDATE items SET heartbeat_at = NULL WHERE id = $1")
        .bind(old.id)
        .execute(store.pool())
        .await
        .unwrap();
    let expired: Vec<i64> = store
        .expired_claims(10)
        .await
        .unwrap()
        .iter()
        .map(|c| c.id)
        .collect();
    assert_eq!(expired, vec![old.id]);
    assert_eq!(store.reap().await.unwrap(), (1, 0));
    assert_eq!(
        store.item(old.id).await.unwrap().unwrap().state,
        ItemState::Open
    );
    assert_eq!(
        store.item(fresh.id).await.unwrap().unwrap().state,
        ItemState::Running
    );
}

pub async fn a_heartbeat_past_the_ttl_but_before_takeover_renews_the_lease(db: TestDb) {
    let store = db.store(ttl(500)).await;
    let item = store.enqueue("q", &json!(1), None).await.unwrap();
    let c = store.claim("q", None).await.unwrap().expect("claimed");
    sleep_ms(650).await;
    assert_eq!(
        store.expired_claims(10).await.unwrap().len(),
        1,
        "expired, not yet taken"
    );
    store
        .heartbeat(item.id, &c.lease.token, None)
        .await
        .unwrap();
    assert_eq!(store.reap().await.unwrap(), (0, 0));
    let now = store.item(item.id).await.unwrap().unwrap();
    assert_eq!(
        (now.state, now.epoch, now.attempts),
        (ItemState::Running, 1, 0)
    );
    store
        .settle(item.id, &c.lease.token, None, SettleState::Done, None, None)
        .await
        .unwrap();
}

pub async fn stale_heartbeat_settle_and_blocked_settle_are_claim_lost_and_change_nothing(
    db: TestDb,
) {
    let store = db.store(ttl(150)).await;
    let item = store.enqueue("q", &json!(1), None).await.unwrap();
    let t1 = store
        .claim("q", None)
        .await
        .unwrap()
        .expect("claimed")
        .lease
        .token;
    // A token that was never issued is as stale as an old one.
    assert_all_claim_lost(&store, item.id, &"0".repeat(48)).await;
    sleep_ms(250).await;
    assert_eq!(store.reap().await.unwrap(), (1, 0));

    // Before the item is claimed again.
    let before = snapshot(&store, item.id).await;
    assert_all_claim_lost(&store, item.id, &t1).await;
    assert_eq!(
        snapshot(&store, item.id).await,
        before,
        "stale calls wrote nothing"
    );

    // After it is claimed again.
    let t2 = store
        .claim("q", None)
        .await
        .unwrap()
        .expect("reclaimed")
        .lease
        .token;
    let before = snapshot(&store, item.id).await;
    assert_all_claim_lost(&store, item.id, &t1).await;
    assert_eq!(
        snapshot(&store, item.id).await,
        before,
        "stale calls wrote nothing"
    );
    let done = store
        .settle(
            item.id,
            &t2,
            None,
            SettleState::Done,
            Some(&json!({"ok": true})),
            None,
        )
        .await
        .unwrap();
    assert_eq!(
        (done.state, value(done.result)),
        (ItemState::Done, Some(json!({"ok": true})))
    );
    // Settling released t2: a heartbeat is claim_lost, a settle into
    // another state already_settled; a release is answered with the settle
    // that ended it. (The same settle sent again is answered: see
    // a_settle_sent_again_by_its_lease_is_answered_and_changes_nothing.)
    assert_eq!(
        code(store.heartbeat(item.id, &t2, None).await),
        ErrorCode::ClaimLost
    );
    let (_, ended) = store.release_reporting(item.id, &t2, None).await.unwrap();
    assert_eq!(
        ended,
        agentstore_server::store::Released::BySettle(ItemState::Done)
    );
    for state in [SettleState::Blocked, SettleState::Failed] {
        let r = store.settle(item.id, &t2, None, state, None, None).await;
        assert_eq!(code(r), ErrorCode::AlreadySettled, "settle {state:?}");
    }
    let unknown = store.heartbeat(item.id + 1000, &t2, None).await;
    assert_eq!(code(unknown), ErrorCode::NotFound);
}

pub async fn settle_with_current_token_on_an_item_paused_elsewhere_is_state_conflict(db: TestDb) {
    let store = db.store(ttl(LONG)).await;
    let item = store.enqueue("q", &json!(1), None).await.unwrap();
    let t1 = store
        .claim("q", None)
        .await
        .unwrap()
        .expect("claimed")
        .lease
        .token;
    let paused = store.pause(item.id).await.unwrap();
    assert_eq!(paused.state, ItemState::Paused);
    let before = snapshot(&store, item.id).await;
    let r = store
        .settle(item.id, &t1, None, SettleState::Done, None, None)
        .await;
    assert_eq!(code(r), ErrorCode::StateConflict);
    assert_eq!(
        code(store.heartbeat(item.id, &t1, None).await),
        ErrorCode::StateConflict
    );
    let stranger = store
        .settle(
            item.id,
            &"f".repeat(48),
            None,
            SettleState::Done,
            None,
            None,
        )
        .await;
    assert_eq!(
        code(stranger),
        ErrorCode::ClaimLost,
        "a wrong token is still claim_lost"
    );
    assert_eq!(snapshot(&store, item.id).await, before);
    assert_eq!(code(store.pause(item.id).await), ErrorCode::Conflict);
    assert!(
        store.expired_claims(10).await.unwrap().is_empty(),
        "paused items never expire"
    );
}

pub async fn resume_of_a_paused_item_issues_a_new_token_and_fences_the_old_one(db: TestDb) {
    let store = db.store(ttl(LONG)).await;
    let item = store.enqueue("q", &json!(1), None).await.unwrap();
    let t1 = store
        .claim("q", None)
        .await
        .unwrap()
        .expect("claimed")
        .lease
        .token;
    assert_eq!(
        code(store.resume(item.id, None).await),
        ErrorCode::Conflict,
        "not paused"
    );
    store
        .settle(item.id, &t1, None, SettleState::Paused, None, None)
        .await
        .unwrap();
    let resumed = store.resume(item.id, Some(3)).await.unwrap();
    assert_ne!(resumed.lease.token, t1);
    assert_eq!(
        (resumed.item.state, resumed.lease.epoch),
        (ItemState::Running, 2)
    );
    // t1 ended by its own settle (`paused`): its heartbeat is claim_lost,
    // another settle already_settled and its release answered so; none
    // changes anything.
    assert_eq!(
        code(store.heartbeat(item.id, &t1, None).await),
        ErrorCode::ClaimLost
    );
    for state in [SettleState::Done, SettleState::Blocked, SettleState::Failed] {
        let r = store.settle(item.id, &t1, None, state, None, None).await;
        assert_eq!(code(r), ErrorCode::AlreadySettled, "settle {state:?}");
    }
    let (_, done) = store.release_reporting(item.id, &t1, None).await.unwrap();
    assert_eq!(
        done,
        agentstore_server::store::Released::BySettle(ItemState::Paused)
    );
    let t2 = resumed.lease.token;
    store.heartbeat(item.id, &t2, None).await.unwrap();

    // Paused by an operator while t2 was current: resume fences t2 as well.
    store.pause(item.id).await.unwrap();
    let t3 = store.resume(item.id, None).await.unwrap().lease.token;
    assert_all_claim_lost(&store, item.id, &t2).await;
    store
        .settle(item.id, &t3, None, SettleState::Done, None, None)
        .await
        .unwrap();
    assert_eq!(
        code(store.resume(item.id + 99, None).await),
        ErrorCode::NotFound
    );
}

/// A heartbeat and a takeover of the same expired lease, released together:
/// exactly one of them changes the item. The lease TTL is long ([`LONG`])
/// so that a lease the heartbeat renewed cannot expire again before the
/// racing takeover's conditional update runs, however far apart a loaded
/// machine runs the two; the leases are put past their deadline by moving
/// their last heartbeat back in SQL (before, a 1 s TTL and a sleep: two
/// statements run more than 1 s apart both won).
pub async fn a_heartbeat_racing_a_takeover_has_exactly_one_winner(db: TestDb) {
    const ROUNDS: usize = 40;
    // Two instances: the worker's heartbeat goes through one, the reaper runs on
    // the other, each on its own connection.
    let worker = Arc::new(db.store(ttl(LONG)).await);
    let reaper = Arc::new(db.store(ttl(LONG)).await);
    let mut leases = Vec::new();
    for i in 0..ROUNDS {
        worker.enqueue("race", &json!(i), None).await.unwrap();
        let c = worker.claim("race", None).await.unwrap().expect("claimed");
        leases.push((c.item.id, c.lease.token));
    }
    // Past the deadline by a second, on the database clock.
    sqlx::query(&format!(
        "UPDATE items SET heartbeat_at = heartbeat_at - {} WHERE queue = 'race'",
        LONG + 1_000
    ))
    .execute(worker.pool())
    .await
    .unwrap();
    let expired = reaper.expired_claims(1000).await.unwrap();
    assert_eq!(
        expired.len(),
        ROUNDS,
        "every claim is expired before the race"
    );
    let (mut heartbeat_wins, mut takeover_wins) = (0, 0);
    for ((id, token), claim) in leases.into_iter().zip(expired) {
        assert_eq!(id, claim.id);
        let barrier = Arc::new(Barrier::new(2));
        let hb = {
            let (worker, barrier) = (worker.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                worker.heartbeat(id, &token, None).await
            })
        };
        let take = {
            let (reaper, barrier) = (reaper.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                reaper.take_over(&claim).await.unwrap()
            })
        };
        let (hb, take) = (hb.await.unwrap(), take.await.unwrap());
        let item = worker.item(id).await.unwrap().unwrap();
        match (hb, take) {
            (Ok(_), None) => {
                heartbeat_wins += 1;
                assert_eq!(
                    (item.state, item.attempts, item.epoch),
                    (ItemState::Running, 0, 1)
                );
            }
            (Err(e), Some(ItemState::Open)) => {
                takeover_wins += 1;
                assert_eq!(e.code(), Some(ErrorCode::ClaimLost));
                assert_eq!((item.state, item.attempts), (ItemState::Open, 1));
            }
            (hb, take) => panic!("round for item {id}: heartbeat {hb:?}, takeover {take:?}"),
        }
    }
    eprintln!("race: heartbeat won {heartbeat_wins}, takeover won {takeover_wins}");
    assert_eq!(heartbeat_wins + takeover_wins, ROUNDS);
}

pub async fn a_takeover_of_an_item_settled_after_it_was_read_changes_nothing(db: TestDb) {
    let store = db.store(ttl(150)).await;
    let a = store.enqueue("q", &json!("a"), None).await.unwrap();
    let b = store.enqueue("q", &json!("b"), None).await.unwrap();
    let ta = store
        .claim("q", None)
        .await
        .unwrap()
        .expect("a")
        .lease
        .token;
    store.claim("q", None).await.unwrap().expect("b");
    sleep_ms(250).await;
    let read = store.expired_claims(10).await.unwrap();
    assert_eq!(read.len(), 2);

    // Between the reaper's read and its update, the worker settles `a` ...
    store
        .settle(a.id, &ta, None, SettleState::Done, None, None)
        .await
        .unwrap();
    // ... and `b` is taken over by another instance and claimed again.
    let other = db.store(ttl(150)).await;
    assert_eq!(other.reap().await.unwrap(), (1, 0));
    let tb2 = other
        .claim("q", None)
        .await
        .unwrap()
        .expect("b again")
        .lease
        .token;

    for claim in &read {
        assert_eq!(
            store.take_over(claim).await.unwrap(),
            None,
            "stale read, no write"
        );
    }
    let a_now = store.item(a.id).await.unwrap().unwrap();
    assert_eq!((a_now.state, a_now.attempts), (ItemState::Done, 0));
    let b_now = store.item(b.id).await.unwrap().unwrap();
    assert_eq!(
        (b_now.state, b_now.epoch, b_now.attempts),
        (ItemState::Running, 2, 1)
    );
    store.heartbeat(b.id, &tb2, None).await.unwrap();
}

pub async fn a_stalled_worker_that_comes_back_is_fenced_and_the_new_attempt_is_untouched(
    db: TestDb,
) {
    let store = db.store(ttl(150)).await;
    let item = store.enqueue("q", &json!(7), None).await.unwrap();
    let t1 = store
        .claim("q", Some(1))
        .await
        .unwrap()
        .expect("claimed")
        .lease
        .token;
    sleep_ms(250).await; // W1 stalls past the TTL
    assert_eq!(store.reap().await.unwrap(), (1, 0));
    let second = store
        .claim("q", Some(1))
        .await
        .unwrap()
        .expect("W1 claims again");
    assert_eq!(second.lease.epoch, 2);
    let before = snapshot(&store, item.id).await;
    // The stalled attempt resumes and heartbeats, settles, releases with t1.
    assert_eq!(
        code(store.heartbeat(item.id, &t1, None).await),
        ErrorCode::ClaimLost
    );
    let r = store
        .settle(
            item.id,
            &t1,
            None,
            SettleState::Done,
            Some(&json!("stale")),
            None,
        )
        .await;
    assert_eq!(code(r), ErrorCode::ClaimLost);
    assert_eq!(
        code(store.release(item.id, &t1, None).await),
        ErrorCode::ClaimLost
    );
    assert_eq!(
        snapshot(&store, item.id).await,
        before,
        "the t2 attempt is untouched"
    );
    store
        .heartbeat(item.id, &second.lease.token, None)
        .await
        .unwrap();
}

/// Claims item `id` of queue `q` (TTL 100 ms, three deliveries allowed)
/// three times and lets each lease expire (nothing heartbeats or settles):
/// each expiry counts an attempt, the first two reopen the item, the third
/// fails it with `retry_limit`, and no claim returns it again.
async fn die_three_times_until_the_retry_limit(store: &Store, id: i64) {
    for attempt in 1..=3u32 {
        let c = store
            .claim("q", None)
            .await
            .unwrap()
            .expect("claimable again");
        assert_eq!(c.item.id, id);
        sleep_ms(180).await; // the worker dies: nothing heartbeats or settles
        let (reopened, failed) = store.reap().await.unwrap();
        let now = store.item(id).await.unwrap().unwrap();
        assert_eq!(now.attempts, attempt);
        if attempt < 3 {
            assert_eq!((reopened, failed, now.state), (1, 0, ItemState::Open));
        } else {
            assert_eq!((reopened, failed, now.state), (0, 1, ItemState::Failed));
            assert_eq!(now.last_error.as_deref(), Some(RETRY_LIMIT_REASON));
        }
    }
    assert!(
        store.claim("q", None).await.unwrap().is_none(),
        "no claim returns it again"
    );
    assert_eq!(store.reap().await.unwrap(), (0, 0));
}

pub async fn every_expiry_counts_an_attempt_and_the_cap_fails_the_item_with_retry_limit(
    db: TestDb,
) {
    let store = db.store(ttl(100)).await;
    // Two re-deliveries: three deliveries in all.
    let item = store.enqueue("q", &json!(1), Some(2)).await.unwrap();
    die_three_times_until_the_retry_limit(&store, item.id).await;
    let failed = store
        .list("q", Some(ItemState::Failed), 0, 10)
        .await
        .unwrap()
        .items;
    assert_eq!(failed.len(), 1);
}

/// The classic retry cap as River and Temporal count it: an enqueue body's
/// `max_attempts: 3` is three deliveries in all (`max_redeliveries` 2, what
/// the item reports), so the third expiry fails the item with `retry_limit`
/// and no claim returns it again.
pub async fn with_max_attempts_3_the_third_expiry_fails_the_item_with_retry_limit(db: TestDb) {
    let mut config = db.config();
    config.ttl_ms = 100;
    config.heartbeat_ms = 33;
    config.reaper_ms = 3_600_000; // this test reaps, so the counts are its own
    let server = agentstore_server::Server::start(&config)
        .await
        .expect("start server");
    let store = server.store().clone();
    let answer = reqwest::Client::new()
        .post(format!("{}/v1/queues/q/items", server.url()))
        .bearer_auth(ADMIN)
        .json(&json!({"payload": {"job": 1}, "max_attempts": 3}))
        .send()
        .await
        .unwrap();
    let status = answer.status();
    let item: Value = answer.json().await.unwrap();
    assert_eq!(status.as_u16(), 201, "{item}");
    assert_eq!(item["max_redeliveries"], json!(2), "{item}");
    assert!(item.get("max_attempts").is_none(), "input only: {item}");
    let id = item["id"].as_i64().expect("an id");
    die_three_times_until_the_retry_limit(&store, id).await;
    server.stop().await.unwrap();
}

pub async fn release_reopens_the_item_and_counts_an_attempt(db: TestDb) {
    let store = db
        .store(Settings {
            max_redeliveries: 1,
            ..ttl(LONG)
        })
        .await;
    let item = store.enqueue("q", &json!(1), None).await.unwrap();
    let t1 = store
        .claim("q", None)
        .await
        .unwrap()
        .expect("claimed")
        .lease
        .token;
    let released = store.release(item.id, &t1, None).await.unwrap();
    assert_eq!((released.state, released.attempts), (ItemState::Open, 1));
    assert_eq!(
        code(store.heartbeat(item.id, &t1, None).await),
        ErrorCode::ClaimLost
    );
    let t2 = store
        .claim("q", None)
        .await
        .unwrap()
        .expect("again")
        .lease
        .token;
    assert_ne!(t1, t2);
    let last = store.release(item.id, &t2, None).await.unwrap();
    assert_eq!((last.state, last.attempts), (ItemState::Failed, 2));
    assert_eq!(last.last_error.as_deref(), Some(RETRY_LIMIT_REASON));
}

pub async fn lease_expiry_is_measured_only_on_the_database_clock(db: TestDb) {
    const TTL: u64 = 400;
    let store = db.store(ttl(TTL)).await;
    let item = store.enqueue("q", &json!(1), None).await.unwrap();
    store.claim("q", None).await.unwrap().expect("claimed");
    let started = heartbeat_at(&store, item.id)
        .await
        .expect("lease start recorded");
    let db_now = store.db_now_ms().await.unwrap();
    assert!(
        (0..1_000).contains(&(db_now - started)),
        "lease start is the database's now"
    );
    // Live until the database clock passes start + TTL, reclaimed right after.
    loop {
        let now = store.db_now_ms().await.unwrap();
        let expired = !store.expired_claims(10).await.unwrap().is_empty();
        let after = store.db_now_ms().await.unwrap();
        if after < started + TTL as i64 {
            assert!(!expired, "a live lease cannot be stolen");
        }
        if now >= started + TTL as i64 {
            assert!(expired, "a dead lease is reclaimable on time");
            break;
        }
        sleep_ms(25).await;
    }
    assert_eq!(store.reap().await.unwrap(), (1, 0));
    // No lease path reads this process's clock (a skewed host clock changes nothing).
    for src in [
        include_str!("../../src/store/items.rs"),
        include_str!("../../src/store/mod.rs"),
        include_str!("../../src/reaper.rs"),
    ] {
        for forbidden in ["SystemTime", "Utc::now", "OffsetDateTime", "Instant::now"] {
            assert!(
                !src.contains(forbidden),
                "lease code must not use {forbidden}"
            );
        }
    }
}

pub async fn an_item_is_redelivered_at_most_five_times_after_its_first_delivery(db: TestDb) {
    let store = db.store(ttl(LONG)).await;
    let item = store.enqueue("q", &json!(1), None).await.unwrap();
    assert_eq!(
        item.max_redeliveries, 5,
        "the default cap counts re-deliveries"
    );
    let mut deliveries = 0;
    while let Some(c) = store.claim("q", None).await.unwrap() {
        deliveries += 1;
        let after = store.release(item.id, &c.lease.token, None).await.unwrap();
        assert_eq!(after.attempts, deliveries);
        if deliveries <= 5 {
            assert_eq!(
                after.state,
                ItemState::Open,
                "delivery {deliveries} reopens"
            );
        } else {
            assert_eq!(
                after.state,
                ItemState::Failed,
                "delivery {deliveries} fails"
            );
            assert_eq!(after.last_error.as_deref(), Some(RETRY_LIMIT_REASON));
        }
    }
    assert_eq!(deliveries, 6, "first delivery + 5 re-deliveries");
    let zero = store.enqueue("once", &json!(1), Some(0)).await.unwrap();
    let c = store.claim("once", None).await.unwrap().unwrap();
    let after = store.release(zero.id, &c.lease.token, None).await.unwrap();
    assert_eq!(
        after.state,
        ItemState::Failed,
        "0 re-deliveries: delivered once"
    );
}

/// Concurrent claims and settles (on PostgreSQL they share statements: see
/// `store::coalesce`) each keep their own outcome: distinct items at epoch 1
/// with distinct tokens, `None` once the queue is dry; per item exactly one of
/// two settles with the current token wins, a settle with a wrong token or
/// another worker's identity is refused and changes nothing. 20 rounds, every
/// round's calls released together by a barrier.
pub async fn concurrent_claims_and_settles_each_keep_their_own_outcome(db: TestDb) {
    const ROUNDS: usize = 20;
    const ITEMS: usize = 24;
    const CLAIMS: usize = 36;
    let store = db.store(ttl(LONG)).await;
    for round in 0..ROUNDS {
        let queue = format!("co{round}");
        for i in 0..ITEMS {
            store.enqueue(&queue, &json!({"i": i}), None).await.unwrap();
        }
        let barrier = Arc::new(Barrier::new(CLAIMS));
        let claims: Vec<_> = (0..CLAIMS)
            .map(|w| {
                let (store, barrier, queue) = (store.clone(), barrier.clone(), queue.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    (
                        w as i64 + 1,
                        store.claim(&queue, Some(w as i64 + 1)).await.unwrap(),
                    )
                })
            })
            .collect();
        let mut held = Vec::new();
        for task in claims {
            let (worker, claim) = task.await.unwrap();
            if let Some(c) = claim {
                assert_eq!((c.item.epoch, c.lease.epoch), (1, 1));
                assert_eq!(
                    c.item.worker_id,
                    Some(worker),
                    "recorded for its own claimer"
                );
                held.push((worker, c));
            }
        }
        assert_eq!(
            held.len(),
            ITEMS,
            "round {round}: every item claimed, no more"
        );
        let ids: std::collections::HashSet<i64> = held.iter().map(|(_, c)| c.item.id).collect();
        let tokens: std::collections::HashSet<&str> =
            held.iter().map(|(_, c)| c.lease.token.as_str()).collect();
        assert_eq!(
            (ids.len(), tokens.len()),
            (ITEMS, ITEMS),
            "distinct items and tokens"
        );

        // Per item: two settles with the current token (results "a" and "b"),
        // one with a wrong token, one by another worker with the right token.
        let calls = ITEMS * 4;
        let barrier = Arc::new(Barrier::new(calls));
        let mut settles = Vec::new();
        for (worker, c) in &held {
            let variants = [
                ("a", c.lease.token.clone(), Some(*worker)),
                ("b", c.lease.token.clone(), Some(*worker)),
                ("wrong", "0".repeat(c.lease.token.len()), Some(*worker)),
                ("other", c.lease.token.clone(), Some(worker + 1000)),
            ];
            for (label, token, owner) in variants {
                let (store, barrier, id) = (store.clone(), barrier.clone(), c.item.id);
                settles.push(tokio::spawn(async move {
                    barrier.wait().await;
                    let r = store
                        .settle(
                            id,
                            &token,
                            owner,
                            SettleState::Done,
                            Some(&json!(label)),
                            None,
                        )
                        .await;
                    (id, label, r)
                }));
            }
        }
        let mut winners = std::collections::HashMap::new();
        for task in settles {
            let (id, label, r) = task.await.unwrap();
            match (label, r) {
                ("a" | "b", Ok(item)) => {
                    assert_eq!(value(item.result), Some(json!(label)));
                    assert!(
                        winners.insert(id, label).is_none(),
                        "item {id} settled twice"
                    );
                }
                // The other of the pair: its lease's own settle landed.
                ("a" | "b", Err(e)) => {
                    assert_eq!(e.code(), Some(ErrorCode::AlreadySettled), "{label}");
                }
                ("wrong", r) => assert_eq!(code(r), ErrorCode::ClaimLost, "wrong token"),
                (_, r) => {
                    let c = code(r);
                    assert!(
                        c == ErrorCode::Forbidden || c == ErrorCode::ClaimLost,
                        "another worker: {c:?}"
                    );
                }
            }
        }
        assert_eq!(
            winners.len(),
            ITEMS,
            "round {round}: every item settled once"
        );
        for (id, label) in winners {
            let item = store.item(id).await.unwrap().unwrap();
            assert_eq!(
                (item.state, value(item.result), item.epoch),
                (ItemState::Done, Some(json!(label)), 1),
                "item {id} holds its winner's result"
            );
        }
    }
    match db.kind {
        crate::common::Kind::Postgres => assert!(
            store.coalesced_calls() > 0,
            "no claim or settle shared a statement in {ROUNDS} rounds"
        ),
        crate::common::Kind::Sqlite => assert_eq!(store.coalesced_calls(), 0),
    }
}

/// A release whose answer was lost is sent again by the same lease: the
/// server answers it with the item as it is now and changes nothing (no second
/// attempt counted), even once the item was claimed again; only the holder
/// that released may replay it, and only the latest release of an item is
/// remembered. Every other call with the released token stays `claim_lost`.
pub async fn a_release_sent_again_by_its_lease_is_answered_and_changes_nothing(db: TestDb) {
    let store = db.store(ttl(LONG)).await;
    let item = store.enqueue("q", &json!(1), None).await.unwrap();
    let (w1, w2) = (Some(11), Some(12));
    let t1 = store
        .claim("q", w1)
        .await
        .unwrap()
        .expect("claimed")
        .lease
        .token;
    let first = store.release(item.id, &t1, w1).await.unwrap();
    assert_eq!((first.state, first.attempts), (ItemState::Open, 1));
    let before = snapshot(&store, item.id).await;
    for _ in 0..2 {
        let again = store
            .release(item.id, &t1, w1)
            .await
            .expect("a replay is answered");
        assert_eq!(again, first);
    }
    assert_eq!(
        snapshot(&store, item.id).await,
        before,
        "a replay writes nothing (one attempt counted)"
    );
    assert_eq!(
        code(store.release(item.id, &t1, w2).await),
        ErrorCode::ClaimLost,
        "another worker cannot replay it"
    );
    assert_eq!(
        code(store.release(item.id, &"0".repeat(48), w1).await),
        ErrorCode::ClaimLost,
        "another token"
    );
    for state in [SettleState::Done, SettleState::Failed] {
        let r = store.settle(item.id, &t1, w1, state, None, None).await;
        assert_eq!(code(r), ErrorCode::ClaimLost, "settle {state:?}");
    }
    assert_eq!(
        code(store.heartbeat(item.id, &t1, w1).await),
        ErrorCode::ClaimLost
    );

    // Claimed again before the retry arrives: still a replay, and the new
    // lease is untouched.
    let t2 = store
        .claim("q", w2)
        .await
        .unwrap()
        .expect("claimed again")
        .lease
        .token;
    let before = snapshot(&store, item.id).await;
    let again = store.release(item.id, &t1, w1).await.expect("a replay");
    assert_eq!((again.state, again.attempts), (ItemState::Running, 1));
    assert_eq!(snapshot(&store, item.id).await, before, "t2 untouched");
    store.heartbeat(item.id, &t2, w2).await.unwrap();

    // A later release of the item replaces the one remembered.
    store.release(item.id, &t2, w2).await.unwrap();
    assert_eq!(
        code(store.release(item.id, &t1, w1).await),
        ErrorCode::ClaimLost
    );
    store.release(item.id, &t2, w2).await.expect("t2's replay");

    // A lease that expired was never released: its release is refused.
    let short = db.store(ttl(100)).await;
    let item3 = short.enqueue("q3", &json!(3), None).await.unwrap();
    let t3 = short
        .claim("q3", None)
        .await
        .unwrap()
        .expect("claimed")
        .lease
        .token;
    sleep_ms(180).await;
    assert_eq!(short.reap().await.unwrap(), (1, 0));
    assert_eq!(
        code(short.release(item3.id, &t3, None).await),
        ErrorCode::ClaimLost
    );
}

/// A lease whose settle landed but whose answer was lost (so its client
/// saw no outcome) then sends a release: the server answers that the lease
/// ended by its own settle, and to what state (`done`, `failed`, `blocked`, or
/// `paused` also after an operator resumed the item since), and changes
/// nothing. Before, the release was refused `claim_lost`, which the SDK
/// reports as "nothing was written under it" for a settle that was written
/// (a review finding). Another worker with the token, or another token,
/// is still refused.
pub async fn a_release_after_its_leases_own_settle_landed_says_so_and_changes_nothing(db: TestDb) {
    use agentstore_server::store::Released;
    let store = db.store(ttl(LONG)).await;
    let (w1, w2) = (Some(21), Some(22));
    for state in [SettleState::Done, SettleState::Failed, SettleState::Blocked] {
        let item = store.enqueue("q", &json!(1), None).await.unwrap();
        let t1 = token(&store, "q", w1).await;
        store
            .settle(item.id, &t1, w1, state, None, None)
            .await
            .unwrap();
        let before = snapshot(&store, item.id).await;
        let (now, done) = store.release_reporting(item.id, &t1, w1).await.unwrap();
        let settled = ItemState::from(state);
        assert_eq!(done, Released::BySettle(settled), "{state:?}");
        assert_eq!(now.into_item().unwrap().state, settled);
        assert_eq!(snapshot(&store, item.id).await, before, "nothing changed");
        assert_eq!(
            code(store.release(item.id, &t1, w2).await),
            ErrorCode::ClaimLost,
            "another worker with the token"
        );
        assert_eq!(
            code(store.release(item.id, &"0".repeat(48), w1).await),
            ErrorCode::ClaimLost,
            "another token"
        );
    }
    // Paused by its own settle, then resumed by an operator: the new lease
    // is untouched, and the old token's release still says `paused`.
    let item = store.enqueue("p", &json!(2), None).await.unwrap();
    let t1 = token(&store, "p", None).await;
    store
        .settle(item.id, &t1, None, SettleState::Paused, None, None)
        .await
        .unwrap();
    let t2 = store.resume(item.id, None).await.unwrap().lease.token;
    let before = snapshot(&store, item.id).await;
    let (_, done) = store.release_reporting(item.id, &t1, None).await.unwrap();
    assert_eq!(done, Released::BySettle(ItemState::Paused));
    assert_eq!(
        snapshot(&store, item.id).await,
        before,
        "the resumed lease untouched"
    );
    store.heartbeat(item.id, &t2, None).await.unwrap();
    // The resumed lease then ends by a path that writes no settle (a
    // release at the redelivery cap fails the item): the old token's
    // release still says `paused`, the state its own settle set, not the
    // item's `failed` (a review finding).
    let item = store.enqueue("p0", &json!(3), Some(0)).await.unwrap();
    let t1 = token(&store, "p0", None).await;
    store
        .settle(item.id, &t1, None, SettleState::Paused, None, None)
        .await
        .unwrap();
    let t2 = store.resume(item.id, None).await.unwrap().lease.token;
    let failed = store.release(item.id, &t2, None).await.unwrap();
    assert_eq!(failed.state, ItemState::Failed, "at the redelivery cap");
    let (_, done) = store.release_reporting(item.id, &t1, None).await.unwrap();
    assert_eq!(done, Released::BySettle(ItemState::Paused));
}

/// A release racing its lease's own settle: the release reads the lease
/// current, then the settle commits before the release's conditional write,
/// which then matches nothing. Forced on PostgreSQL with a row lock held by
/// a third connection: the settle's write and then the release's queue
/// behind it (observed in `pg_stat_activity`), and the lock goes. The
/// release is answered with the settle that ended the lease (before: a
/// review found it `claim_lost` in this window), over 10 rounds. SQLite's
/// writers wait by polling, with no queue to observe or order: the race is
/// not forced there.
pub async fn a_release_racing_its_leases_own_settle_is_answered_with_that_settle(db: TestDb) {
    use agentstore_server::store::Released;
    if db.kind != crate::common::Kind::Postgres {
        return;
    }
    let store = db.store(ttl(LONG)).await;
    for round in 0..10 {
        let item = store.enqueue("race", &json!(round), None).await.unwrap();
        let t1 = token(&store, "race", None).await;
        let mut lock = store.pool().begin().await.unwrap();
        sqlx::query("SELECT id FROM items WHERE id = $1 FOR UPDATE")
            .bind(item.id)
            .fetch_one(&mut *lock)
            .await
            .unwrap();
        let (holder,): (i32,) = sqlx::query_as("SELECT pg_backend_pid()")
            .fetch_one(&mut *lock)
            .await
            .unwrap();
        // The sessions waiting behind this round's lock, directly or behind
        // a session that waits for it (a second writer of a row queues on
        // the first's tuple lock): other tests' lock waits, run in parallel
        // on the same database, are not counted.
        let waiting = || async {
            sqlx::query_as::<_, (i64,)>(
                "WITH RECURSIVE w(pid) AS (
                     SELECT pid FROM pg_stat_activity
                     WHERE wait_event_type = 'Lock' AND $1 = ANY(pg_blocking_pids(pid))
                     UNION
                     SELECT a.pid FROM pg_stat_activity a JOIN w ON w.pid = ANY(pg_blocking_pids(a.pid))
                     WHERE a.wait_event_type = 'Lock'
                 )
                 SELECT COUNT(*) FROM w",
            )
            .bind(holder)
            .fetch_one(store.pool())
            .await
            .unwrap()
            .0
        };
        let settle = {
            let (store, t1) = (store.clone(), t1.clone());
            tokio::spawn(async move {
                store
                    .settle(item.id, &t1, None, SettleState::Done, None, None)
                    .await
            })
        };
        let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while waiting().await < 1 {
            assert!(
                std::time::Instant::now() < until,
                "round {round}: the settle waits"
            );
            sleep_ms(5).await;
        }
        let release = {
            let (store, t1) = (store.clone(), t1.clone());
            tokio::spawn(async move { store.release_reporting(item.id, &t1, None).await })
        };
        while waiting().await < 2 {
            assert!(
                std::time::Instant::now() < until,
                "round {round}: the release waits"
            );
            sleep_ms(5).await;
        }
        lock.commit().await.unwrap();
        let settled = settle.await.unwrap().expect("the settle landed");
        assert_eq!(settled.state, ItemState::Done);
        let (_, done) = release.await.unwrap().expect("the release is answered");
        assert_eq!(done, Released::BySettle(ItemState::Done), "round {round}");
        assert_eq!(
            snapshot(&store, item.id).await.0.state,
            ItemState::Done,
            "round {round}: nothing released"
        );
    }
}

/// A settle whose answer was lost is sent again by its lease: the server
/// answers it with the item as the first settle left it (result, error) and
/// writes nothing. Only the same token settling into the same state is a
/// replay; the same token asking for something else is `already_settled`;
/// anything else stays `claim_lost`, including the same token after the
/// reaper failed the item at its retry cap (not this lease's settle) and
/// after the item was claimed and settled again by another lease.
pub async fn a_settle_sent_again_by_its_lease_is_answered_and_changes_nothing(db: TestDb) {
    let store = db.store(ttl(LONG)).await;
    let item = store.enqueue("q", &json!(1), None).await.unwrap();
    let t1 = store
        .claim("q", None)
        .await
        .unwrap()
        .expect("claimed")
        .lease
        .token;
    let first = store
        .settle(item.id, &t1, None, SettleState::Failed, None, Some("boom"))
        .await
        .unwrap();
    let before = snapshot(&store, item.id).await;
    // Sent again: the first settle's item, nothing written.
    for _ in 0..2 {
        let again = store
            .settle(item.id, &t1, None, SettleState::Failed, None, Some("boom"))
            .await
            .expect("a replay is answered");
        assert_eq!(again, first);
    }
    assert_eq!(
        snapshot(&store, item.id).await,
        before,
        "a replay writes nothing"
    );
    // The same token with other content is not a replay: already_settled
    // (see settled.rs).
    let r = store
        .settle(item.id, &t1, None, SettleState::Failed, None, Some("other"))
        .await;
    assert_eq!(code(r), ErrorCode::AlreadySettled, "another message");
    let one = json!(1);
    let r = store
        .settle(
            item.id,
            &t1,
            None,
            SettleState::Failed,
            Some(&one),
            Some("boom"),
        )
        .await;
    assert_eq!(code(r), ErrorCode::AlreadySettled, "another result");
    for state in [SettleState::Done, SettleState::Blocked] {
        let r = store.settle(item.id, &t1, None, state, None, None).await;
        assert_eq!(
            code(r),
            ErrorCode::AlreadySettled,
            "another state {state:?}"
        );
    }
    let r = store
        .settle(
            item.id,
            &"0".repeat(48),
            None,
            SettleState::Failed,
            None,
            Some("boom"),
        )
        .await;
    assert_eq!(code(r), ErrorCode::ClaimLost, "another token");

    // Many replays at once (PostgreSQL coalesces them into one statement).
    let item2 = store.enqueue("q2", &json!(2), None).await.unwrap();
    let t2 = store
        .claim("q2", None)
        .await
        .unwrap()
        .expect("claimed")
        .lease
        .token;
    let done = store
        .settle(
            item2.id,
            &t2,
            None,
            SettleState::Done,
            Some(&json!("r")),
            None,
        )
        .await
        .unwrap();
    let replays = at_once(8, |_| {
        let (store, t2) = (store.clone(), t2.clone());
        async move {
            store
                .settle(
                    item2.id,
                    &t2,
                    None,
                    SettleState::Done,
                    Some(&json!("r")),
                    None,
                )
                .await
        }
    })
    .await;
    for r in replays {
        assert_eq!(r.expect("replay answered"), done);
    }

    // A worker's replay comes from the worker that settled, nobody else.
    let item4 = store.enqueue("q4", &json!(4), None).await.unwrap();
    let t4 = store
        .claim("q4", Some(7))
        .await
        .unwrap()
        .expect("claimed")
        .lease
        .token;
    let settled = store
        .settle(item4.id, &t4, Some(7), SettleState::Done, None, None)
        .await
        .unwrap();
    let again = store
        .settle(item4.id, &t4, Some(7), SettleState::Done, None, None)
        .await;
    assert_eq!(again.unwrap(), settled, "the same worker's replay");
    let other = store
        .settle(item4.id, &t4, Some(8), SettleState::Done, None, None)
        .await;
    assert!(
        other.is_err(),
        "another worker with the token gets no answer"
    );

    // A new token (resume of a paused item) does not end the old token's
    // replay of its own settle (the last one made): answered, nothing
    // written (see a_settle_sent_again_after_its_item_moved_on_is_still_a_replay).
    let item5 = store.enqueue("q5", &json!(5), None).await.unwrap();
    let t5 = store
        .claim("q5", None)
        .await
        .unwrap()
        .expect("claimed")
        .lease
        .token;
    store
        .settle(item5.id, &t5, None, SettleState::Paused, None, None)
        .await
        .unwrap();
    store.resume(item5.id, None).await.unwrap();
    store.pause(item5.id).await.unwrap();
    let before = snapshot(&store, item5.id).await;
    let r = store
        .settle(item5.id, &t5, None, SettleState::Paused, None, None)
        .await;
    assert_eq!(r.expect("its own settle's replay").id, item5.id);
    assert_eq!(snapshot(&store, item5.id).await, before, "nothing written");
    let r = store
        .settle(item5.id, &t5, None, SettleState::Blocked, None, None)
        .await;
    assert_eq!(
        code(r),
        ErrorCode::AlreadySettled,
        "another settle of that token"
    );

    // The reaper's retry-cap failure is not a settle of the lease it ended.
    let store = db.store(ttl(100)).await;
    let item3 = store.enqueue("q3", &json!(3), Some(0)).await.unwrap();
    let t3 = store
        .claim("q3", None)
        .await
        .unwrap()
        .expect("claimed")
        .lease
        .token;
    sleep_ms(180).await;
    assert_eq!(store.reap().await.unwrap(), (0, 1));
    let r = store
        .settle(
            item3.id,
            &t3,
            None,
            SettleState::Failed,
            None,
            Some(RETRY_LIMIT_REASON),
        )
        .await;
    assert_eq!(
        code(r),
        ErrorCode::ClaimLost,
        "failed by the reaper, not by t3"
    );
}

/// A claim sent again with its `Idempotency-Key` (its answer was lost) gets
/// back the lease the first copy took: the same item, a new token under the
/// next epoch (the first one, which nobody received, is fenced, also by a
/// service that fences on the epoch alone), no attempt spent, the
/// lease renewed. Before, the retry took a second item and the first stayed
/// running under a token nobody held until its TTL ran out. Only the same
/// claimer's running lease is replayed: another worker's key, the admin
/// token's, a lease that ended (settled, or expired and reaped) and a
/// resumed item all claim afresh. Concurrent keyed claims (coalesced into
/// one statement on PostgreSQL) each keep their own key. Over HTTP the
/// replay is `201` with `Idempotent-Replayed: true`; a malformed key `400`.
pub async fn a_claim_sent_again_with_its_idempotency_key_gets_its_lease_back(db: TestDb) {
    const TTL: u64 = 300;
    let store = db.store(ttl(LONG)).await;
    for n in 0..4 {
        store.enqueue("q", &json!(n), None).await.unwrap();
    }
    let (first, replayed) = store
        .claim_once("q", Some(7), Some("k1"))
        .await
        .unwrap()
        .expect("claimed");
    assert!(!replayed);
    sleep_ms(5).await;
    let (again, replayed) = store
        .claim_once("q", Some(7), Some("k1"))
        .await
        .unwrap()
        .expect("replayed");
    assert!(replayed, "the same claim, sent again");
    assert_eq!(
        (again.item.id, again.item.epoch, again.item.attempts),
        (first.item.id, first.item.epoch + 1, 0)
    );
    assert_eq!(again.lease.epoch, first.lease.epoch + 1, "the next epoch");
    assert_ne!(again.lease.token, first.lease.token, "a new token");
    assert_eq!(
        code(
            store
                .heartbeat(first.item.id, &first.lease.token, None)
                .await
        ),
        ErrorCode::ClaimLost,
        "the first token fences nothing"
    );
    store
        .heartbeat(again.item.id, &again.lease.token, None)
        .await
        .expect("the replayed lease is held");
    // Another worker's key, and the admin token's, claim afresh.
    let (other, replayed) = store
        .claim_once("q", Some(8), Some("k1"))
        .await
        .unwrap()
        .unwrap();
    assert!(!replayed);
    assert_ne!(other.item.id, first.item.id);
    let (admin, replayed) = store
        .claim_once("q", None, Some("k1"))
        .await
        .unwrap()
        .unwrap();
    assert!(!replayed);
    assert!(![first.item.id, other.item.id].contains(&admin.item.id));
    // Worker 8's key names its own lease only.
    let (back, replayed) = store
        .claim_once("q", Some(8), Some("k1"))
        .await
        .unwrap()
        .unwrap();
    assert!(replayed);
    assert_eq!(back.item.id, other.item.id);
    // A settled lease is not handed back: the key claims the next item.
    store
        .settle(
            again.item.id,
            &again.lease.token,
            None,
            SettleState::Done,
            None,
            None,
        )
        .await
        .unwrap();
    let (next, replayed) = store
        .claim_once("q", Some(7), Some("k1"))
        .await
        .unwrap()
        .unwrap();
    assert!(!replayed);
    assert!(![first.item.id, other.item.id, admin.item.id].contains(&next.item.id));
    assert!(store
        .claim_once("q", Some(7), Some("k2"))
        .await
        .unwrap()
        .is_none());

    // Concurrent keyed claims each keep their key (PostgreSQL coalesces
    // them into one statement).
    for n in 0..8 {
        store.enqueue("many", &json!(n), None).await.unwrap();
    }
    let shared = Arc::new(store);
    let claims = at_once(8, |k| {
        let store = shared.clone();
        async move {
            let key = format!("c{k}");
            store.claim_once("many", Some(7), Some(&key)).await
        }
    })
    .await;
    for (k, c) in claims.into_iter().enumerate() {
        let (c, replayed) = c.unwrap().expect("one item each");
        assert!(!replayed);
        let key = format!("c{k}");
        let (r, replayed) = shared
            .claim_once("many", Some(7), Some(&key))
            .await
            .unwrap()
            .unwrap();
        assert!(replayed, "{key}");
        assert_eq!(r.item.id, c.item.id, "{key}");
    }
    let text = crate::common::render(&shared).await.unwrap();
    assert!(
        text.lines()
            .any(|l| l == "agentstore_claim_replays_total 10"),
        "k1 of two workers, and the eight keys"
    );

    // A key names a running lease only: each end of a lease clears it.
    let (kept,): (i64,) = sqlx::query_as(
        "SELECT COUNT(*) FROM items WHERE claim_key IS NOT NULL AND state <> 'running'",
    )
    .fetch_one(shared.pool())
    .await
    .unwrap();
    assert_eq!(kept, 0);

    // An expired, reaped lease is not handed back, nor a resumed item.
    let short = db.store(ttl(TTL)).await;
    let item = short.enqueue("ttl", &json!(1), None).await.unwrap();
    let (c, _) = short
        .claim_once("ttl", Some(7), Some("k3"))
        .await
        .unwrap()
        .unwrap();
    sleep_ms(TTL + 100).await;
    assert_eq!(short.reap().await.unwrap(), (1, 0));
    let (r, replayed) = short
        .claim_once("ttl", Some(7), Some("k3"))
        .await
        .unwrap()
        .unwrap();
    assert!(!replayed, "the reaped lease is over");
    assert_eq!((r.item.id, r.item.epoch), (item.id, c.item.epoch + 1));
    // Replayed by an instance of another TTL: the lease it answers is the
    // one the row holds.
    let long = db.store(ttl(LONG)).await;
    let (again, replayed) = long
        .claim_once("ttl", Some(7), Some("k3"))
        .await
        .unwrap()
        .unwrap();
    assert!(replayed);
    assert_eq!(again.lease.ttl_ms, LONG);
    let (row_ttl,): (Option<i64>,) = sqlx::query_as("SELECT lease_ttl_ms FROM items WHERE id = $1")
        .bind(item.id)
        .fetch_one(long.pool())
        .await
        .unwrap();
    assert_eq!(row_ttl, Some(LONG as i64));
    short.pause(item.id).await.unwrap();
    short.resume(item.id, Some(7)).await.unwrap();
    assert!(
        short
            .claim_once("ttl", Some(7), Some("k3"))
            .await
            .unwrap()
            .is_none(),
        "the resumed lease is the operator's, not the key's"
    );

    // Over HTTP.
    let server = crate::common::http_server(&db).await;
    let http = reqwest::Client::new();
    let id = crate::common::enqueue_over_http(&http, &server.url(), "hq").await;
    let claim = |key: &str| {
        let req = http
            .post(format!("{}/v1/queues/hq/claims", server.url()))
            .bearer_auth(crate::common::ADMIN)
            .header("Idempotency-Key", key);
        async move {
            let resp = req.send().await.unwrap();
            let replayed = resp.headers().get("idempotent-replayed").is_some();
            let status = resp.status();
            let body: serde_json::Value = resp.json().await.unwrap_or_default();
            (status.as_u16(), replayed, body)
        }
    };
    let (s, replayed, a) = claim("h1").await;
    assert_eq!(
        (s, replayed, a["item"]["id"].as_i64()),
        (201, false, Some(id))
    );
    let (s, replayed, b) = claim("h1").await;
    assert_eq!(
        (s, replayed, b["item"]["id"].as_i64()),
        (201, true, Some(id))
    );
    assert_ne!(a["lease"]["token"], b["lease"]["token"]);
    let (s, _, e) = claim("a b").await;
    assert_eq!((s, e["code"].as_str()), (400, Some("validation")));
    server.stop().await.unwrap();
}

/// A `paused` settle whose answer was lost is answered as a replay when
/// its lease sends it again, also after an operator resumed the item (and
/// after the item was released and claimed by another worker): the item
/// as it is now, nothing written. Before, the resume's new token cleared
/// the settle's record and the retry was `claim_lost`, so the SDK reported
/// a lease lost with "nothing written" for a pause that was written. The
/// same token with another request, or after a later settle by another
/// lease, is still refused.
pub async fn a_settle_sent_again_after_its_item_moved_on_is_still_a_replay(db: TestDb) {
    let store = db.store(ttl(LONG)).await;
    let item = store.enqueue("q", &json!(1), None).await.unwrap();
    let t1 = store
        .claim("q", Some(7))
        .await
        .unwrap()
        .unwrap()
        .lease
        .token;
    let r1 = json!({"r": 1});
    let pause = |token: String, result: Value| {
        let store = store.clone();
        async move {
            store
                .settle(
                    item.id,
                    &token,
                    Some(7),
                    SettleState::Paused,
                    Some(&result),
                    None,
                )
                .await
        }
    };
    pause(t1.clone(), r1.clone()).await.unwrap();
    let t2 = store.resume(item.id, None).await.unwrap().lease.token;
    let before = snapshot(&store, item.id).await;
    let again = pause(t1.clone(), r1.clone())
        .await
        .expect("a replay after the resume");
    assert_eq!((again.id, again.state), (item.id, ItemState::Paused));
    assert_eq!(snapshot(&store, item.id).await, before, "nothing written");
    // Another request with that token is refused (already_settled), and
    // changes nothing.
    assert_eq!(
        code(pause(t1.clone(), json!({"r": 2})).await),
        ErrorCode::AlreadySettled
    );
    let r = store
        .settle(item.id, &t1, Some(7), SettleState::Done, Some(&r1), None)
        .await;
    assert_eq!(code(r), ErrorCode::AlreadySettled);
    // Released and claimed by another worker: still the last settle's replay.
    store.release(item.id, &t2, None).await.unwrap();
    let t3 = store
        .claim("q", Some(8))
        .await
        .unwrap()
        .unwrap()
        .lease
        .token;
    let again = pause(t1.clone(), r1.clone())
        .await
        .expect("a replay after a claim");
    // Answered as the settle left it, not as worker 8 holds it now.
    assert_eq!(
        (again.state, value(again.result), again.worker_id),
        (ItemState::Paused, Some(r1.clone()), None)
    );
    // Once another lease settles, t1's settle is no longer the last one.
    store
        .settle(item.id, &t3, Some(8), SettleState::Done, None, None)
        .await
        .unwrap();
    assert_eq!(code(pause(t1, r1).await), ErrorCode::ClaimLost);
}
