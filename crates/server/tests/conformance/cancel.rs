//! An operator's cancel (`POST /v1/items/{id}/cancel`): stopping one item
//! that has not ended, whatever holds it.

use agentstore_protocol::lease::{ItemState, SettleState, CANCELLED_REASON};
use agentstore_protocol::{ErrorBody, ErrorCode};
use agentstore_server::Store;
use serde_json::{json, Value};

use crate::common::{assert_operator_actions, at_once, http_server, snapshot, TestDb, ADMIN};

/// `POST /v1/items/{id}/cancel` as `bearer`: status, body, whether it was
/// marked a replay.
async fn cancel(url: &str, id: i64, bearer: &str) -> (u16, Value, bool) {
    let resp = reqwest::Client::new()
        .post(format!("{url}/v1/items/{id}/cancel"))
        .bearer_auth(bearer)
        .send()
        .await
        .unwrap();
    let replayed = resp.headers().get("idempotent-replayed").is_some();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null), replayed)
}

/// The code a rejected store call answered.
fn code<T: std::fmt::Debug>(r: Result<T, agentstore_server::StoreError>) -> Option<ErrorCode> {
    r.err().and_then(|e| e.code())
}

/// An item of `queue` claimed and settled into `state`; its id.
async fn settled_item(store: &Store, queue: &str, state: SettleState) -> i64 {
    let id = store.enqueue(queue, &json!(1), None).await.unwrap().id;
    let c = store.claim(queue, None).await.unwrap().expect("claimed");
    assert_eq!(c.item.id, id);
    let why = Some("worker's reason");
    store
        .settle(id, &c.lease.token, None, state, None, why)
        .await
        .unwrap();
    id
}

/// An open, a running, a paused and a blocked item are failed by the
/// admin's cancel with `last_error` `"cancelled"`, their attempts and epoch
/// kept. The running item's holder is told `state_conflict` at its next
/// heartbeat, settle and release (its work is cancelled, nothing it sends
/// lands), and no claim takes a cancelled item. Sent again, the cancel is a
/// replay (`200`, `Idempotent-Replayed`, nothing written); `done` and a
/// worker's `failed` are `409 conflict` naming the state, nothing written;
/// an unknown id is `404`. A requeue brings a cancelled item back.
/// Committed cancels are counted in
/// `agentstore_operator_actions_total{action="cancel"}`, replays not.
pub async fn an_operator_cancels_an_item_that_has_not_ended_and_nothing_else(db: TestDb) {
    let server = http_server(&db).await;
    let store = server.store().clone();
    let url = server.url().to_owned();
    let q = "cx";

    let open = store.enqueue(q, &json!("open"), None).await.unwrap().id;
    let running_item = store.enqueue(q, &json!("running"), None).await.unwrap().id;
    let paused_item = store.enqueue(q, &json!("paused"), None).await.unwrap().id;
    // Claim the second and third (the first is claimed on the way and
    // released, one attempt counted).
    let first = store.claim(q, None).await.unwrap().unwrap();
    assert_eq!(first.item.id, open);
    let running = store.claim(q, None).await.unwrap().unwrap();
    let paused = store.claim(q, None).await.unwrap().unwrap();
    assert_eq!(
        (running.item.id, paused.item.id),
        (running_item, paused_item)
    );
    store.release(open, &first.lease.token, None).await.unwrap();
    store.pause(paused_item).await.unwrap();
    let blocked = settled_item(&store, "cx-b", SettleState::Blocked).await;

    for id in [open, running_item, paused_item, blocked] {
        let before = store.item(id).await.unwrap().unwrap();
        let (status, body, replayed) = cancel(&url, id, ADMIN).await;
        assert_eq!((status, replayed), (200, false), "{id}: {body}");
        assert_eq!(body["id"], json!(id));
        assert_eq!(body["state"], json!("failed"));
        assert_eq!(body["last_error"], json!(CANCELLED_REASON));
        let now = store.item(id).await.unwrap().unwrap();
        assert_eq!(now.state, ItemState::Failed);
        assert_eq!(
            (now.attempts, now.epoch),
            (before.attempts, before.epoch),
            "{id}: no attempt counted, no new epoch"
        );
        let rows = snapshot(&store).await;
        let (status, body, replayed) = cancel(&url, id, ADMIN).await;
        assert_eq!((status, replayed), (200, true), "{id}: {body}");
        assert_eq!(body["state"], json!("failed"));
        assert_eq!(snapshot(&store).await, rows, "a replay writes nothing");
    }

    // The holders' leases are over: every fenced call is state_conflict
    // and changes nothing.
    let rows = snapshot(&store).await;
    for (id, token) in [
        (running_item, &running.lease.token),
        (paused_item, &paused.lease.token),
    ] {
        assert_eq!(
            code(store.heartbeat(id, token, None).await),
            Some(ErrorCode::StateConflict)
        );
        let done = SettleState::Done;
        assert_eq!(
            code(store.settle(id, token, None, done, None, None).await),
            Some(ErrorCode::StateConflict)
        );
        assert_eq!(
            code(store.release(id, token, None).await),
            Some(ErrorCode::StateConflict)
        );
    }
    assert!(
        store.claim(q, None).await.unwrap().is_none(),
        "none claimable"
    );
    assert_eq!(snapshot(&store).await, rows, "refused calls write nothing");

    // Ended items are refused, an unknown id is 404.
    let done = settled_item(&store, "cx-d", SettleState::Done).await;
    let failed = settled_item(&store, "cx-f", SettleState::Failed).await;
    let rows = snapshot(&store).await;
    for (id, state) in [(done, "done"), (failed, "failed")] {
        let (status, body, _) = cancel(&url, id, ADMIN).await;
        assert_eq!(status, 409, "{state}: {body}");
        let err: ErrorBody = serde_json::from_value(body.clone()).unwrap();
        assert_eq!(err.code, ErrorCode::Conflict, "{state}: {body}");
        assert!(err.message.contains(state), "{state}: {body}");
    }
    assert_eq!(cancel(&url, failed + 1_000, ADMIN).await.0, 404);
    assert_eq!(snapshot(&store).await, rows, "a refusal writes nothing");

    // Requeued, claimed under the next epoch, cancelled again: counted.
    store.requeue(running_item).await.unwrap();
    let again = store.claim(q, None).await.unwrap().unwrap();
    assert_eq!(
        (again.item.id, again.lease.epoch),
        (running_item, running.lease.epoch + 1)
    );
    assert_eq!(cancel(&url, running_item, ADMIN).await.0, 200);

    // Five cancels committed, the replays not counted.
    assert_operator_actions(&url, "cancel", 5).await;
    server.stop().await.unwrap();
}

/// A cancel and the holder's settle sent at the same moment (a barrier,
/// 20 rounds): exactly one lands. Either the settle's state stands and the
/// cancel is `409`, or the item is cancelled and the settle is
/// `state_conflict`; never both answered as applied, never a settled result
/// under `"cancelled"`.
pub async fn a_cancel_racing_the_holder_s_settle_has_one_winner(db: TestDb) {
    let server = http_server(&db).await;
    let store = server.store().clone();
    let url = server.url().to_owned();
    let mut wins = (0, 0);
    for round in 0..20 {
        let id = store.enqueue("cr", &json!(round), None).await.unwrap().id;
        let c = store.claim("cr", None).await.unwrap().unwrap();
        assert_eq!(c.item.id, id);
        let (store2, url2, token) = (store.clone(), url.clone(), c.lease.token.clone());
        let out = at_once(2, move |k| {
            let (store, url, token) = (store2.clone(), url2.clone(), token.clone());
            async move {
                if k == 0 {
                    let done = SettleState::Done;
                    let r = store.settle(id, &token, None, done, None, None).await;
                    (r.is_ok(), code(r))
                } else {
                    let (status, body, _) = cancel(&url, id, ADMIN).await;
                    assert!(status == 200 || status == 409, "{status} {body}");
                    (status == 200, None)
                }
            }
        })
        .await;
        let ((settled, settle_code), (cancelled, _)) = (out[0], out[1]);
        let item = store.item(id).await.unwrap().unwrap();
        assert!(settled != cancelled, "round {round}: exactly one lands");
        if settled {
            wins.0 += 1;
            assert_eq!(item.state, ItemState::Done, "round {round}");
        } else {
            wins.1 += 1;
            assert_eq!(settle_code, Some(ErrorCode::StateConflict), "round {round}");
            assert_eq!(item.state, ItemState::Failed, "round {round}");
            assert_eq!(item.last_error.as_deref(), Some(CANCELLED_REASON));
        }
    }
    eprintln!("settle won {}, cancel won {}", wins.0, wins.1);
    server.stop().await.unwrap();
}

/// A resume took a paused item out of `paused`, a pause put it back, and an
/// operator cancelled it there: a resume sent now finds the item failed by
/// the cancel, not left by that earlier resume, so it is `409 conflict`
/// naming the state, never `200` with `Idempotent-Replayed` (which says a
/// resume landed). A resume whose own answer was lost before a cancel of
/// the running item it resumed is still answered as a replay.
pub async fn a_resume_of_a_paused_item_an_operator_cancelled_is_refused_not_replayed(db: TestDb) {
    let server = http_server(&db).await;
    let store = server.store().clone();
    let url = server.url().to_owned();
    let resume = |id: i64| {
        let url = url.clone();
        async move {
            let resp = reqwest::Client::new()
                .post(format!("{url}/v1/items/{id}/resume"))
                .bearer_auth(ADMIN)
                .send()
                .await
                .unwrap();
            let replayed = resp.headers().get("idempotent-replayed").is_some();
            let status = resp.status().as_u16();
            (
                status,
                resp.json::<Value>().await.unwrap_or(Value::Null),
                replayed,
            )
        }
    };
    let id = store.enqueue("cxr", &json!(1), None).await.unwrap().id;
    store.claim("cxr", None).await.unwrap().unwrap();
    store.pause(id).await.unwrap();
    store.resume(id, None).await.unwrap();
    store.pause(id).await.unwrap();
    assert_eq!(cancel(&url, id, ADMIN).await.0, 200);
    let rows = snapshot(&store).await;
    let (status, body, replayed) = resume(id).await;
    assert_eq!((status, replayed), (409, false), "{body}");
    let err: ErrorBody = serde_json::from_value(body.clone()).unwrap();
    assert_eq!(err.code, ErrorCode::Conflict, "{body}");
    assert!(err.message.contains("failed"), "{body}");
    assert_eq!(snapshot(&store).await, rows, "a refusal writes nothing");

    // Resumed (its answer lost), then cancelled while running: the resume
    // sent again is still its replay.
    let other = store.enqueue("cxr", &json!(2), None).await.unwrap().id;
    store.claim("cxr", None).await.unwrap().unwrap();
    store.pause(other).await.unwrap();
    store.resume(other, None).await.unwrap();
    assert_eq!(cancel(&url, other, ADMIN).await.0, 200);
    let (status, body, replayed) = resume(other).await;
    assert_eq!((status, replayed), (200, true), "{body}");
    assert_eq!(body["state"], json!("failed"), "{body}");
    server.stop().await.unwrap();
}

/// A lease settled its item `blocked` (its answer lost) and an operator
/// cancelled the blocked item: ANOTHER settle by that lease, `failed` with
/// the text `"cancelled"` (what the row now reads), is refused
/// `already_settled` naming `blocked`, as before the cancel; it never
/// answered as a replay of a settle that did not land. The same settle
/// sent again is still its replay, answered as it left the item.
pub async fn a_lease_s_other_settle_after_a_cancel_of_its_blocked_item_is_already_settled(
    db: TestDb,
) {
    let store = db.store(agentstore_server::Settings::default()).await;
    for state in [SettleState::Blocked, SettleState::Paused] {
        let id = store.enqueue("cxs", &json!(1), None).await.unwrap().id;
        let c = store.claim("cxs", None).await.unwrap().unwrap();
        store
            .settle(id, &c.lease.token, None, state, None, None)
            .await
            .unwrap();
        store.cancel(id).await.unwrap();
        let rows = snapshot(&store).await;
        let other = store
            .settle_reporting(
                id,
                &c.lease.token,
                None,
                SettleState::Failed,
                None,
                Some(CANCELLED_REASON),
            )
            .await;
        match other {
            Err(agentstore_server::StoreError::AlreadySettled { state: s, .. }) => {
                assert_eq!(s, state);
            }
            other => panic!("{state:?}: {other:?}"),
        }
        let (again, replayed) = store
            .settle_reporting(id, &c.lease.token, None, state, None, None)
            .await
            .unwrap();
        assert!(replayed);
        let again = again.into_item().unwrap();
        assert_eq!(
            (again.state, again.last_error),
            (ItemState::from(state), None)
        );
        assert_eq!(snapshot(&store).await, rows, "nothing written");
    }
}
