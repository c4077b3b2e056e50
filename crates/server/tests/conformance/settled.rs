//! A settle by a lease whose own settle already landed (its answer lost)
//! asking for something else: `try { settle('done', r) } catch {
//! settle('failed', e) }`. Before, it was `409 claim_lost` ("nothing was
//! written under it"), which this lease's first settle was: now it is `409
//! already_settled` naming the state that settle set, and writes nothing.

use agentstore_protocol::lease::{ItemState, SettleState};
use agentstore_protocol::{ErrorBody, ErrorCode};
use agentstore_server::{Store, StoreError};
use reqwest::Client;
use serde_json::{json, Value};

use crate::common::{enqueue_over_http, sleep_ms, ttl, TestDb, ADMIN};
use crate::lease::{code, snapshot, token};

const LONG: u64 = 60_000;

/// The state an `already_settled` refusal names; panics on any other outcome.
fn already_settled<T: std::fmt::Debug>(r: Result<T, StoreError>, what: &str) -> SettleState {
    match r {
        Err(StoreError::AlreadySettled { state, .. }) => state,
        other => panic!("{what}: expected already_settled, got {other:?}"),
    }
}

/// Settles `id` with `token` as `owner`.
async fn settle(
    store: &Store,
    id: i64,
    token: &str,
    owner: Option<i64>,
    state: SettleState,
    result: Option<Value>,
    error: Option<&str>,
) -> Result<agentstore_server::store::Item, StoreError> {
    store
        .settle(id, token, owner, state, result.as_ref(), error)
        .await
}

/// Every settle state.
const STATES: [SettleState; 4] = [
    SettleState::Done,
    SettleState::Failed,
    SettleState::Blocked,
    SettleState::Paused,
];

/// For each state a lease settled into: a settle by that lease into every
/// other state, with another result, or with another error is
/// `already_settled` naming that state, and changes nothing; the same
/// settle is still a replay; the token sent by another worker, and another
/// token, are still `claim_lost`.
pub async fn a_settle_after_its_leases_own_settle_landed_is_already_settled_and_changes_nothing(
    db: TestDb,
) {
    let store = db.store(ttl(LONG)).await;
    let (w1, w2) = (Some(31), Some(32));
    for landed in STATES {
        let item = store.enqueue("q", &json!(1), None).await.unwrap();
        let t1 = token(&store, "q", w1).await;
        let r = Some(json!({"ok": 1}));
        let first = settle(&store, item.id, &t1, w1, landed, r.clone(), Some("e"))
            .await
            .unwrap();
        let before = snapshot(&store, item.id).await;
        for other in STATES.into_iter().filter(|s| *s != landed) {
            let again = settle(&store, item.id, &t1, w1, other, r.clone(), Some("e")).await;
            assert_eq!(
                already_settled(again, "another state"),
                landed,
                "{landed:?} then {other:?}"
            );
        }
        let again = settle(&store, item.id, &t1, w1, landed, Some(json!(2)), Some("e")).await;
        assert_eq!(already_settled(again, "another result"), landed);
        let again = settle(&store, item.id, &t1, w1, landed, None, Some("e")).await;
        assert_eq!(already_settled(again, "no result"), landed);
        let again = settle(&store, item.id, &t1, w1, landed, r.clone(), Some("x")).await;
        assert_eq!(already_settled(again, "another error"), landed);
        assert_eq!(snapshot(&store, item.id).await, before, "nothing written");
        let same = settle(&store, item.id, &t1, w1, landed, r.clone(), Some("e")).await;
        assert_eq!(same.expect("the same settle is a replay"), first);
        let other_worker = settle(&store, item.id, &t1, w2, SettleState::Failed, None, None).await;
        assert_eq!(code(other_worker), ErrorCode::ClaimLost, "another worker");
        let wrong = "0".repeat(48);
        let other_token = settle(&store, item.id, &wrong, w1, SettleState::Failed, None, None);
        assert_eq!(
            code(other_token.await),
            ErrorCode::ClaimLost,
            "another token"
        );
        assert_eq!(snapshot(&store, item.id).await, before, "nothing written");
    }
}

/// The item moved on after the lease's own `paused` settle landed: resumed
/// by an operator, then released and claimed by another worker. A settle by
/// the first lease is still `already_settled` (`paused`), and the leases
/// that hold the item since are untouched. Once another lease settles the
/// item, the first lease's token is `claim_lost` (the server keeps the last
/// settle only), as is the intermediate lease's.
pub async fn a_settle_after_its_leases_own_settle_landed_and_the_item_moved_on_is_already_settled(
    db: TestDb,
) {
    let store = db.store(ttl(LONG)).await;
    let (w1, w2) = (Some(41), Some(42));
    let item = store.enqueue("m", &json!(1), None).await.unwrap();
    let t1 = token(&store, "m", w1).await;
    settle(&store, item.id, &t1, w1, SettleState::Paused, None, None)
        .await
        .unwrap();
    // Resumed by an operator: a new lease.
    let t2 = store.resume(item.id, None).await.unwrap().lease.token;
    let before = snapshot(&store, item.id).await;
    let r = settle(
        &store,
        item.id,
        &t1,
        w1,
        SettleState::Done,
        Some(json!(1)),
        None,
    )
    .await;
    assert_eq!(already_settled(r, "after the resume"), SettleState::Paused);
    assert_eq!(snapshot(&store, item.id).await, before, "nothing written");
    store.heartbeat(item.id, &t2, None).await.unwrap();
    // Given back and claimed by another worker.
    store.release(item.id, &t2, None).await.unwrap();
    let t3 = token(&store, "m", w2).await;
    let before = snapshot(&store, item.id).await;
    for state in [SettleState::Failed, SettleState::Done] {
        let r = settle(&store, item.id, &t1, w1, state, None, Some("boom")).await;
        assert_eq!(
            already_settled(r, "after another worker's claim"),
            SettleState::Paused
        );
    }
    assert_eq!(snapshot(&store, item.id).await, before, "nothing written");
    store.heartbeat(item.id, &t3, w2).await.unwrap();
    let r = settle(&store, item.id, &t2, None, SettleState::Done, None, None).await;
    assert_eq!(
        code(r),
        ErrorCode::ClaimLost,
        "the released lease settled nothing"
    );
    settle(&store, item.id, &t3, w2, SettleState::Done, None, None)
        .await
        .unwrap();
    let r = settle(&store, item.id, &t1, w1, SettleState::Failed, None, None).await;
    assert_eq!(code(r), ErrorCode::ClaimLost, "another lease settled since");
}

/// Over HTTP: `409` with `{code: "already_settled", message, settled}`.
pub async fn an_already_settled_answer_is_409_and_names_the_landed_state(db: TestDb) {
    let server = crate::common::http_server(&db).await;
    let (http, base) = (Client::new(), server.url());
    let id = enqueue_over_http(&http, &base, "h").await;
    let claim = crate::common::admin_json(http.post(format!("{base}/v1/queues/h/claims"))).await;
    let t = claim["lease"]["token"].as_str().unwrap().to_owned();
    let send = |body: Value| {
        http.post(format!("{base}/v1/items/{id}/settle"))
            .bearer_auth(ADMIN)
            .json(&body)
            .send()
    };
    let done = send(json!({"token": t, "state": "done", "result": {"n": 1}}))
        .await
        .unwrap();
    assert_eq!(done.status(), 200);
    let failed = send(json!({"token": t, "state": "failed", "error": "timeout"}))
        .await
        .unwrap();
    assert_eq!(failed.status(), 409);
    let text = failed.text().await.unwrap();
    let body: ErrorBody = serde_json::from_str(&text).unwrap();
    assert_eq!(
        (body.code, body.settled),
        (ErrorCode::AlreadySettled, Some(SettleState::Done)),
        "{text}"
    );
    let raw: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(raw["settled"], "done", "{text}");
    // Another token: claim_lost, with no `settled`.
    let wrong = send(json!({"token": "0".repeat(48), "state": "failed"}))
        .await
        .unwrap();
    assert_eq!(wrong.status(), 409);
    let text = wrong.text().await.unwrap();
    let raw: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        (raw["code"].as_str(), raw.get("settled")),
        (Some("claim_lost"), None)
    );
    // The item is as the first settle left it.
    let item = crate::common::admin_json(http.get(format!("{base}/v1/items/{id}"))).await;
    assert_eq!(
        (item["state"].as_str(), &item["result"]),
        (Some("done"), &json!({"n": 1}))
    );
}

/// PostgreSQL's coalesced settle statement (`told_or_skipped` tells
/// the settles it did not apply in one read): forced by holding a lock
/// on the items table while a decoy item settles, so that the lane's runner waits in the decoy's settle
/// while the settles below queue behind it and then go out as ONE batch.
/// In it: settles by leases whose own settle landed (another state, another
/// result, after a resume), the same settle again (a replay), another
/// token, and a first settle. Each keeps its own answer. Not forced on
/// SQLite (no settle lane): the same calls run one by one there.
pub async fn settles_after_their_leases_own_settle_landed_are_already_settled_in_one_batch(
    db: TestDb,
) {
    let store = db.store(ttl(LONG)).await;
    let postgres = db.kind == crate::common::Kind::Postgres;
    let mut landed = Vec::new();
    for (k, state) in STATES.into_iter().enumerate() {
        let item = store.enqueue("b", &json!(k), None).await.unwrap();
        let t = token(&store, "b", None).await;
        let first = settle(&store, item.id, &t, None, state, Some(json!(k)), None)
            .await
            .unwrap();
        landed.push((item.id, t, state, first));
    }
    // The paused one is resumed: its item has moved on.
    let paused = landed[3].0;
    let resumed = store.resume(paused, None).await.unwrap().lease.token;
    let fresh = store.enqueue("b", &json!("fresh"), None).await.unwrap();
    let t_fresh = token(&store, "b", None).await;
    let decoy = store.enqueue("b", &json!("decoy"), None).await.unwrap();
    let t_decoy = token(&store, "b", None).await;
    let before: Vec<_> = {
        let mut v = Vec::new();
        for (id, ..) in &landed {
            v.push(snapshot(&store, *id).await);
        }
        v
    };
    let coalesced = store.coalesced_calls();

    let spawn = |id: i64, t: String, state: SettleState, result: Option<Value>| {
        let store = store.clone();
        tokio::spawn(async move { settle(&store, id, &t, None, state, result, None).await })
    };
    let (lock, decoy_settle) = if postgres {
        let (lock, settle) = stall_settle_lane(&store, decoy.id, t_decoy).await;
        (Some(lock), settle)
    } else {
        (None, spawn(decoy.id, t_decoy, SettleState::Done, None))
    };
    let (d, f, b, p) = (&landed[0], &landed[1], &landed[2], &landed[3]);
    let calls = vec![
        // done, then failed
        spawn(d.0, d.1.clone(), SettleState::Failed, None),
        // failed, then failed with another result
        spawn(f.0, f.1.clone(), SettleState::Failed, Some(json!("other"))),
        // blocked, the same settle again: a replay
        spawn(b.0, b.1.clone(), SettleState::Blocked, Some(json!(2))),
        // paused and resumed since, then done
        spawn(p.0, p.1.clone(), SettleState::Done, Some(json!(3))),
        // another token
        spawn(d.0, "0".repeat(48), SettleState::Failed, None),
        // a first settle
        spawn(fresh.id, t_fresh, SettleState::Done, Some(json!("fresh"))),
    ];
    if let Some(lock) = lock {
        // Every call above has joined the lane before the lock goes.
        wait_settles_waiting(&store, calls.len()).await;
        lock.commit().await.unwrap();
    }
    let mut out = Vec::new();
    for c in calls {
        out.push(c.await.unwrap());
    }
    decoy_settle.await.unwrap().expect("the decoy settled");
    let mut out = out.into_iter();
    let mut next = || out.next().unwrap();
    assert_eq!(
        already_settled(next(), "done, then failed"),
        SettleState::Done
    );
    assert_eq!(
        already_settled(next(), "another result"),
        SettleState::Failed
    );
    assert_eq!(next().expect("a replay"), b.3);
    assert_eq!(
        already_settled(next(), "after a resume"),
        SettleState::Paused
    );
    assert_eq!(code(next()), ErrorCode::ClaimLost, "another token");
    assert_eq!(next().expect("a first settle").state, ItemState::Done);
    for ((id, ..), before) in landed.iter().zip(before) {
        assert_eq!(
            snapshot(&store, *id).await,
            before,
            "item {id}: nothing written"
        );
    }
    store.heartbeat(paused, &resumed, None).await.unwrap();
    if postgres {
        assert!(
            store.coalesced_calls() >= coalesced + 6,
            "the six settles shared one statement ({} coalesced)",
            store.coalesced_calls() - coalesced
        );
    }
}

/// Holds a lock on the items table (PostgreSQL) and starts `decoy`'s settle, which
/// then waits on the lock with the settle lane's runner: settles started
/// after it queue in the lane until the lock goes. Bounded wait.
pub(crate) async fn stall_settle_lane(
    store: &Store,
    decoy: i64,
    t_decoy: String,
) -> (
    sqlx::Transaction<'static, sqlx::Any>,
    tokio::task::JoinHandle<Result<agentstore_server::store::Item, StoreError>>,
) {
    // The table, not the decoy's row: a settle statement skips a row
    // another session locks (`FOR UPDATE SKIP LOCKED`) and waits for it
    // apart, off the lane; it cannot skip the table.
    let mut lock = store.pool().begin().await.unwrap();
    sqlx::query("LOCK TABLE items IN SHARE MODE")
        .execute(&mut *lock)
        .await
        .unwrap();
    let (holder,): (i32,) = sqlx::query_as("SELECT pg_backend_pid()")
        .fetch_one(&mut *lock)
        .await
        .unwrap();
    let decoy_settle = {
        let store = store.clone();
        tokio::spawn(async move {
            settle(&store, decoy, &t_decoy, None, SettleState::Done, None, None).await
        })
    };
    let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        // Waiting for this lock: other tests' sessions wait for their own
        // locks in the same cluster meanwhile.
        let (waiting,): (i64,) = sqlx::query_as(
            "SELECT COUNT(*) FROM pg_stat_activity
             WHERE wait_event_type = 'Lock' AND $1 = ANY(pg_blocking_pids(pid))",
        )
        .bind(holder)
        .fetch_one(store.pool())
        .await
        .unwrap();
        if waiting >= 1 {
            break;
        }
        assert!(
            std::time::Instant::now() < until,
            "the decoy's settle waits"
        );
        sleep_ms(5).await;
    }
    (lock, decoy_settle)
}

/// Waits (bounded) until `n` settles wait in `store`'s settle lane.
pub(crate) async fn wait_settles_waiting(store: &Store, n: usize) {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while store.settles_waiting() < n {
        assert!(
            std::time::Instant::now() < until,
            "{} of {n} settles joined the lane",
            store.settles_waiting()
        );
        sleep_ms(5).await;
    }
}

/// PostgreSQL's coalesced settle statement records what each settle's
/// replay answers (migration 22: its lease's epoch and the attempts then),
/// as the single-row statement does: paused settles made in ONE statement
/// (forced as above, by a table lock and a decoy), their items then moved on
/// (resumed, released: one attempt, claimed again: epoch 3), are each
/// replayed with the answer it got then (epoch 1, no attempt, no holder),
/// write nothing, and the later leases run on. Before, only a script
/// checked the batched statement's columns. On SQLite (no settle lane)
/// the same settles run one by one.
pub async fn settles_made_in_one_statement_are_replayed_with_their_own_epoch_and_attempts(
    db: TestDb,
) {
    const N: usize = 6;
    let store = db.store(ttl(LONG)).await;
    let postgres = db.kind == crate::common::Kind::Postgres;
    let mut held = Vec::new();
    for k in 0..N {
        let item = store.enqueue("rb", &json!(k), None).await.unwrap();
        held.push((item.id, token(&store, "rb", None).await));
    }
    let decoy = store.enqueue("rb", &json!("decoy"), None).await.unwrap();
    let t_decoy = token(&store, "rb", None).await;
    let coalesced = store.coalesced_calls();
    let stalled = if postgres {
        Some(stall_settle_lane(&store, decoy.id, t_decoy).await)
    } else {
        None
    };
    let calls: Vec<_> = held
        .iter()
        .enumerate()
        .map(|(k, (id, t))| {
            let (store, id, t) = (store.clone(), *id, t.clone());
            tokio::spawn(async move {
                let result = json!({"step": k});
                settle(
                    &store,
                    id,
                    &t,
                    None,
                    SettleState::Paused,
                    Some(result),
                    None,
                )
                .await
            })
        })
        .collect();
    if let Some((lock, decoy_settle)) = stalled {
        wait_settles_waiting(&store, N).await;
        lock.commit().await.unwrap();
        decoy_settle.await.unwrap().expect("the decoy settled");
    }
    let mut answered = Vec::new();
    for c in calls {
        let item = c.await.unwrap().expect("paused");
        assert_eq!(
            (item.state, item.epoch, item.attempts),
            (ItemState::Paused, 1, 0)
        );
        answered.push(item);
    }
    if postgres {
        assert!(
            store.coalesced_calls() >= coalesced + N as u64,
            "the {N} settles shared one statement ({} coalesced)",
            store.coalesced_calls() - coalesced
        );
    }
    // Each item moves on: resumed (epoch 2), that lease released (one
    // attempt), claimed again (epoch 3).
    let mut later = Vec::new();
    for (id, _) in &held {
        let resumed = store.resume(*id, None).await.unwrap().lease.token;
        store.release(*id, &resumed, None).await.unwrap();
        later.push(token(&store, "rb", None).await);
    }
    for (k, (((id, t), first), now_token)) in held.iter().zip(&answered).zip(&later).enumerate() {
        let before = snapshot(&store, *id).await;
        let replay = settle(
            &store,
            *id,
            t,
            None,
            SettleState::Paused,
            Some(json!({"step": k})),
            None,
        )
        .await
        .expect("a replay");
        assert_eq!(&replay, first, "item {id}: the answer its settle got");
        assert_eq!(
            snapshot(&store, *id).await,
            before,
            "item {id}: nothing written"
        );
        let now = store.item(*id).await.unwrap().unwrap();
        assert_eq!(
            (now.state, now.epoch, now.attempts),
            (ItemState::Running, 3, 1),
            "item {id}: the later lease runs on"
        );
        store.heartbeat(*id, now_token, None).await.unwrap();
    }
}

/// A settle sent again byte for byte by its lease after its item moved on
/// (resumed by an operator, released, claimed again by a later lease with a
/// higher epoch and one attempt more) is answered with exactly the answer
/// the first settle got: that settle's state and result, its lease's epoch
/// and the attempts then, no holder. Before, the replay took the epoch and
/// attempts of the item as it is now: the later lease's. The replay writes
/// nothing, and the later lease runs on.
pub async fn a_settle_replayed_after_its_item_moved_on_answers_that_settle_not_the_later_lease(
    db: TestDb,
) {
    let server = crate::common::http_server(&db).await;
    let store = server.store().clone();
    let http = Client::new();
    let base = server.url();
    let worker = crate::common::enroll(&http, &base).await;
    let id = enqueue_over_http(&http, &base, "rq").await;
    let claim = |bearer: String| {
        let req = http
            .post(format!("{base}/v1/queues/rq/claims"))
            .bearer_auth(bearer);
        async move {
            let resp = req.send().await.unwrap();
            assert_eq!(resp.status(), 201);
            resp.json::<Value>().await.unwrap()
        }
    };
    let first = claim(worker.access_token.clone()).await;
    assert_eq!(
        (&first["item"]["id"], &first["lease"]["epoch"]),
        (&json!(id), &json!(1))
    );
    let body = format!(
        r#"{{"token": {}, "state": "paused", "result": {{"step": 1, "note": "halfway"}}}}"#,
        first["lease"]["token"]
    );
    let settle = || {
        http.post(format!("{base}/v1/items/{id}/settle"))
            .bearer_auth(&worker.access_token)
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
    };
    let resp = settle().await.unwrap();
    assert_eq!(resp.status(), 200);
    let answered: Value = resp.json().await.unwrap();
    assert_eq!(
        (
            &answered["state"],
            &answered["epoch"],
            &answered["attempts"]
        ),
        (&json!("paused"), &json!(1), &json!(0)),
        "{answered}"
    );
    // The item moves on: resumed (epoch 2), that lease released (one
    // attempt), claimed again by the same worker (epoch 3).
    let resumed = http
        .post(format!("{base}/v1/items/{id}/resume"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(resumed.status(), 200);
    let resumed: Value = resumed.json().await.unwrap();
    let released = http
        .post(format!("{base}/v1/items/{id}/release"))
        .bearer_auth(ADMIN)
        .json(&json!({"token": resumed["lease"]["token"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(released.status(), 200);
    let later = claim(worker.access_token.clone()).await;
    assert_eq!(
        (&later["item"]["epoch"], &later["item"]["attempts"]),
        (&json!(3), &json!(1)),
        "{later}"
    );
    let before = snapshot(&store, id).await;
    // The first settle, byte for byte: a replay, answered as it was then.
    let resp = settle().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()
            .get("idempotent-replayed")
            .map(|v| v.to_str().unwrap()),
        Some("true")
    );
    let replayed: Value = resp.json().await.unwrap();
    assert_eq!(
        replayed, answered,
        "the first settle's answer, nothing of the later lease"
    );
    assert_eq!(snapshot(&store, id).await, before, "nothing written");
    let now = store.item(id).await.unwrap().unwrap();
    assert_eq!(
        (now.state, now.epoch, now.attempts, now.worker_id),
        (ItemState::Running, 3, 1, Some(worker.worker_id)),
        "the later lease runs on"
    );
    server.stop().await.unwrap();
}
