//! An operator's requeue (`POST /v1/items/{id}/requeue`): the way out of
//! `failed` and `blocked`.

use agentstore_protocol::lease::{ItemState, SettleState};
use agentstore_protocol::{ErrorBody, ErrorCode};
use agentstore_server::store::Ended;
use agentstore_server::Store;
use serde_json::{json, Value};

use crate::common::{assert_operator_actions, http_server, snapshot, TestDb, ADMIN};

/// An item of `queue` claimed and settled into `state` with error `why`.
async fn settled_item(store: &Store, queue: &str, state: SettleState, why: &str) -> i64 {
    let item = store.enqueue(queue, &json!(1), None).await.unwrap();
    let c = store.claim(queue, None).await.unwrap().expect("claimed");
    assert_eq!(c.item.id, item.id);
    store
        .settle(item.id, &c.lease.token, None, state, None, Some(why))
        .await
        .unwrap();
    item.id
}

/// A failed or blocked item is put back to `open` by the admin: its
/// attempts start again from 0, its epoch stays until the next claim raises
/// it, and `last_error` is kept (why it had failed, until the next settle
/// replaces it). Sent again before any claim (its answer lost), the requeue
/// changes nothing and is answered `200` with the item and
/// `Idempotent-Replayed: true`. Any other state is `409 conflict` and
/// changes nothing; an unknown id is `404`. Committed requeues are counted
/// in `agentstore_operator_actions_total{action="requeue"}`, replays not.
pub async fn an_operator_requeues_a_failed_or_blocked_item_and_nothing_else(db: TestDb) {
    let server = http_server(&db).await;
    let store = server.store().clone();
    let http = reqwest::Client::new();
    let requeue = |id: i64, bearer: &'static str| {
        let req = http
            .post(format!("{}/v1/items/{id}/requeue", server.url()))
            .bearer_auth(bearer);
        async move {
            let resp = req.send().await.unwrap();
            let replayed = resp.headers().get("idempotent-replayed").is_some();
            let status = resp.status().as_u16();
            let body: Value = resp.json().await.unwrap_or(Value::Null);
            (status, body, replayed)
        }
    };

    let failed = settled_item(&store, "rq", SettleState::Failed, "boom").await;
    let blocked = settled_item(&store, "rq", SettleState::Blocked, "needs a human").await;
    for (id, why) in [(failed, "boom"), (blocked, "needs a human")] {
        let before = store.item(id).await.unwrap().unwrap();
        let (status, body, replayed) = requeue(id, ADMIN).await;
        assert_eq!((status, replayed), (200, false), "{body}");
        assert_eq!(body["id"], json!(id));
        assert_eq!(body["state"], json!("open"));
        assert_eq!(body["attempts"], json!(0));
        assert_eq!(body["epoch"], json!(before.epoch), "epoch kept");
        assert_eq!(body["last_error"], json!(why), "last_error kept");
        let now = store.item(id).await.unwrap().unwrap();
        assert_eq!(
            (now.state, now.attempts, now.epoch, now.worker_id),
            (ItemState::Open, 0, before.epoch, None)
        );
        // Sent again: a replay, nothing written.
        let rows = snapshot(&store).await;
        let (status, body, replayed) = requeue(id, ADMIN).await;
        assert_eq!((status, replayed), (200, true), "{body}");
        assert_eq!(body["state"], json!("open"));
        assert_eq!(snapshot(&store).await, rows, "a replay writes nothing");
    }

    // Claimable again, under the next epoch; once claimed, a requeue (a
    // late copy of the one before, too) is refused.
    let c = store.claim("rq", None).await.unwrap().expect("claimed");
    assert_eq!(c.item.id, failed);
    assert_eq!(c.lease.epoch, 2);
    let open = store.enqueue("rq2", &json!(2), None).await.unwrap().id;
    let done = settled_item(&store, "rq3", SettleState::Done, "-").await;
    let paused = settled_item(&store, "rq4", SettleState::Paused, "-").await;
    let rows = snapshot(&store).await;
    for (id, state) in [
        (failed, "running"),
        (open, "open"),
        (done, "done"),
        (paused, "paused"),
    ] {
        let (status, body, _) = requeue(id, ADMIN).await;
        assert_eq!(status, 409, "{state}: {body}");
        let err: ErrorBody = serde_json::from_value(body.clone()).unwrap();
        assert_eq!(err.code, ErrorCode::Conflict, "{state}: {body}");
        assert!(err.message.contains(state), "{state}: {body}");
    }
    let (status, body, _) = requeue(done + 1_000, ADMIN).await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(snapshot(&store).await, rows, "a refusal writes nothing");

    // Failed again (a settle): requeued again, counted again.
    store
        .settle(
            failed,
            &c.lease.token,
            None,
            SettleState::Failed,
            None,
            None,
        )
        .await
        .unwrap();
    assert_eq!(requeue(failed, ADMIN).await.0, 200);

    // Three requeues committed, the replays not counted.
    assert_operator_actions(&server.url(), "requeue", 3).await;
    server.stop().await.unwrap();
}

/// An item failed at the retry cap (`retry_limit`: a release with no
/// redelivery left) starts again with its whole allowance: open, attempts
/// 0, claimable.
pub async fn a_requeued_item_failed_at_the_retry_cap_gets_its_attempts_back(db: TestDb) {
    let server = http_server(&db).await;
    let store = server.store().clone();
    let item = store.enqueue("cap", &json!(1), Some(0)).await.unwrap();
    let c = store.claim("cap", None).await.unwrap().expect("claimed");
    let released = store.release(item.id, &c.lease.token, None).await.unwrap();
    assert_eq!(released.state, ItemState::Failed);
    assert_eq!(released.last_error.as_deref(), Some("retry_limit"));
    let resp = reqwest::Client::new()
        .post(format!("{}/v1/items/{}/requeue", server.url(), item.id))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let now = store.item(item.id).await.unwrap().unwrap();
    assert_eq!((now.state, now.attempts), (ItemState::Open, 0));
    let again = store.claim("cap", None).await.unwrap().expect("claimable");
    assert_eq!((again.item.id, again.lease.epoch), (item.id, 2));
    server.stop().await.unwrap();
}

/// A settle whose answer was lost, sent again after an operator requeued
/// the item and a later lease ended it in the same state (here: released
/// at the retry cap, `failed` with `retry_limit`): it is still a replay,
/// answered with what that settle set (its error, its epoch), not the
/// later lease's error. (Sent again in other spacing it is `409
/// already_settled`, as after any move on: the row no longer holds its
/// result to compare with.) Before, the row's `failed` state hid the
/// requeue and the replay answered `last_error: "retry_limit"`. Nothing
/// changes either way.
pub async fn a_settle_sent_again_after_a_requeue_answers_its_own_outcome(db: TestDb) {
    let server = http_server(&db).await;
    let store = server.store().clone();
    let item = store.enqueue("again", &json!(1), Some(0)).await.unwrap();
    let a = store.claim("again", None).await.unwrap().expect("claimed");
    let result = serde_json::value::RawValue::from_string("{\"r\":1}".into()).unwrap();
    let spaced = serde_json::value::RawValue::from_string("{ \"r\": 1 }".into()).unwrap();
    let settle = |result: &serde_json::value::RawValue| {
        let (store, token, result) = (store.clone(), a.lease.token.clone(), result.to_owned());
        async move {
            store
                .settle_reporting(
                    item.id,
                    &token,
                    None,
                    SettleState::Failed,
                    Some(&result),
                    Some("e1"),
                )
                .await
        }
    };
    let (first, replayed) = settle(&result).await.unwrap();
    assert!(!replayed);
    let Ended::Item(first) = first else {
        panic!("unreadable")
    };
    store.requeue(item.id).await.unwrap();
    let b = store.claim("again", None).await.unwrap().expect("claimed");
    assert_eq!(b.item.id, item.id);
    let ended = store.release(item.id, &b.lease.token, None).await.unwrap();
    assert_eq!(
        (ended.state, ended.last_error.as_deref()),
        (ItemState::Failed, Some("retry_limit"))
    );
    let before = snapshot(&store).await;
    let (again, replayed) = settle(&result).await.unwrap();
    let Ended::Item(again) = again else {
        panic!("unreadable")
    };
    assert!(replayed, "a replay");
    assert_eq!(
        (again.state, again.last_error.as_deref(), again.epoch),
        (ItemState::Failed, Some("e1"), first.epoch),
        "the settle's own outcome"
    );
    assert_eq!(
        again
            .result
            .as_ref()
            .map(|r| serde_json::from_str::<Value>(r.get()).unwrap()),
        Some(json!({"r": 1}))
    );
    let respaced = settle(&spaced).await.map(|_| ()).unwrap_err();
    assert_eq!(
        respaced.code(),
        Some(ErrorCode::AlreadySettled),
        "{respaced}"
    );
    assert_eq!(snapshot(&store).await, before, "a replay changes nothing");
    server.stop().await.unwrap();
}
