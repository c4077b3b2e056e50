//! Roles and queue scopes over HTTP: every endpoint × every kind of caller.
//! Each call is either allowed (2xx) or refused with `403 {code: "forbidden"}`
//! (`401` without credentials) and then changes nothing in the database.

use agentstore_protocol::lease::{Role, WorkerCredentials};
use agentstore_protocol::{ErrorBody, ErrorCode};
use agentstore_server::Store;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::common::{http_server, snapshot, TestDb, ADMIN};

/// The queue every scoped credential below names (or not).
const Q: &str = "jobs";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Who {
    Anonymous,
    Admin,
    /// Producer scoped to `Q`.
    Producer,
    /// Producer scoped to another queue.
    ProducerElsewhere,
    /// Worker scoped to `Q`, holding the running item.
    Holder,
    /// Worker scoped to `Q`, not holding it.
    OtherWorker,
    /// Worker scoped to another queue.
    WorkerElsewhere,
}

const EVERYONE: [Who; 7] = [
    Who::Anonymous,
    Who::Admin,
    Who::Producer,
    Who::ProducerElsewhere,
    Who::Holder,
    Who::OtherWorker,
    Who::WorkerElsewhere,
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Endpoint {
    Health,
    CreateEnrollment,
    Enroll,
    Refresh,
    Enqueue,
    List,
    Claim,
    Item,
    Heartbeat,
    Heartbeats,
    Settle,
    Release,
    Pause,
    Resume,
    Requeue,
    Cancel,
    Ready,
    Stats,
    Metrics,
    RevokeWorker,
}

const ENDPOINTS: [Endpoint; 20] = [
    Endpoint::Health,
    Endpoint::CreateEnrollment,
    Endpoint::Enroll,
    Endpoint::Refresh,
    Endpoint::Enqueue,
    Endpoint::List,
    Endpoint::Claim,
    Endpoint::Item,
    Endpoint::Heartbeat,
    Endpoint::Heartbeats,
    Endpoint::Settle,
    Endpoint::Release,
    Endpoint::Pause,
    Endpoint::Resume,
    Endpoint::Requeue,
    Endpoint::Cancel,
    Endpoint::Ready,
    Endpoint::Stats,
    Endpoint::Metrics,
    Endpoint::RevokeWorker,
];

/// The rule under test (README "Roles and scopes"): `true` = allowed.
fn allowed(e: Endpoint, who: Who) -> bool {
    use Endpoint as E;
    use Who as W;
    match e {
        // Public: the body is the credential.
        E::Health | E::Ready | E::Enroll | E::Refresh => true,
        E::CreateEnrollment
        | E::Pause
        | E::Resume
        | E::Requeue
        | E::Cancel
        | E::Metrics
        | E::RevokeWorker => who == W::Admin,
        E::Enqueue | E::List | E::Stats => matches!(who, W::Admin | W::Producer),
        E::Claim => matches!(who, W::Admin | W::Holder | W::OtherWorker),
        E::Item => matches!(who, W::Admin | W::Producer | W::Holder),
        E::Heartbeat | E::Heartbeats | E::Settle => matches!(who, W::Admin | W::Holder),
        // Without headers the lease token alone is the credential (sendBeacon).
        E::Release => matches!(who, W::Admin | W::Holder | W::Anonymous),
    }
}

struct Principals {
    producer: WorkerCredentials,
    producer_elsewhere: WorkerCredentials,
    holder: WorkerCredentials,
    other_worker: WorkerCredentials,
    worker_elsewhere: WorkerCredentials,
}

async fn enrolled(store: &Store, role: Role, queue: &str) -> WorkerCredentials {
    let (token, _) = store
        .create_enrollment_token(None, role, &[queue.to_owned()])
        .await
        .unwrap();
    store.enroll(&token.0, Some("matrix")).await.unwrap()
}

impl Principals {
    async fn new(store: &Store) -> Principals {
        Principals {
            producer: enrolled(store, Role::Producer, Q).await,
            producer_elsewhere: enrolled(store, Role::Producer, "elsewhere").await,
            holder: enrolled(store, Role::Worker, Q).await,
            other_worker: enrolled(store, Role::Worker, Q).await,
            worker_elsewhere: enrolled(store, Role::Worker, "elsewhere").await,
        }
    }

    fn bearer(&self, who: Who) -> Option<&str> {
        Some(match who {
            Who::Anonymous => return None,
            Who::Admin => ADMIN,
            Who::Producer => &self.producer.access_token,
            Who::ProducerElsewhere => &self.producer_elsewhere.access_token,
            Who::Holder => &self.holder.access_token,
            Who::OtherWorker => &self.other_worker.access_token,
            Who::WorkerElsewhere => &self.worker_elsewhere.access_token,
        })
    }
}

/// The request for `e` against a fresh fixture: an item of `Q` running under
/// the holder's lease (paused first for `resume`, failed for `requeue`) and an open one behind it.
async fn request(store: &Store, p: &Principals, e: Endpoint) -> (Method, String, Option<Value>) {
    let running = store.enqueue(Q, &json!({"n": 1}), None).await.unwrap();
    store.enqueue(Q, &json!({"n": 2}), None).await.unwrap();
    // Claim until this cell's item is running under the holder (older open
    // items left by earlier cells are claimed on the way).
    let token = loop {
        let c = store
            .claim(Q, Some(p.holder.worker_id))
            .await
            .unwrap()
            .unwrap();
        if c.item.id == running.id {
            break c.lease.token;
        }
    };
    let id = running.id;
    let lease = json!({"token": token});
    match e {
        Endpoint::Health => (Method::GET, "/v1/health".into(), None),
        Endpoint::Ready => (Method::GET, "/v1/ready".into(), None),
        Endpoint::Stats => (Method::GET, format!("/v1/queues/{Q}/stats"), None),
        Endpoint::Metrics => (Method::GET, "/metrics".into(), None),
        Endpoint::CreateEnrollment => (
            Method::POST,
            "/v1/admin/enrollment-tokens".into(),
            Some(json!({"role": "worker", "queues": [Q]})),
        ),
        Endpoint::Enroll => {
            let (t, _) = store
                .create_enrollment_token(None, Role::Worker, &[Q.to_owned()])
                .await
                .unwrap();
            let body = json!({"token": t.0});
            (Method::POST, "/v1/workers/enroll".into(), Some(body))
        }
        Endpoint::Refresh => {
            let c = enrolled(store, Role::Worker, Q).await;
            let body = json!({"refresh_token": c.refresh_token});
            (Method::POST, "/v1/workers/refresh".into(), Some(body))
        }
        Endpoint::Enqueue => (
            Method::POST,
            format!("/v1/queues/{Q}/items"),
            Some(json!({"payload": {"n": 3}})),
        ),
        Endpoint::List => (Method::GET, format!("/v1/queues/{Q}/items"), None),
        Endpoint::Claim => (Method::POST, format!("/v1/queues/{Q}/claims"), None),
        Endpoint::Item => (Method::GET, format!("/v1/items/{id}"), None),
        Endpoint::Heartbeat => (
            Method::POST,
            format!("/v1/items/{id}/heartbeat"),
            Some(lease),
        ),
        Endpoint::Heartbeats => (
            Method::POST,
            "/v1/heartbeats".into(),
            Some(json!({"leases": [{"item_id": id, "token": token}]})),
        ),
        Endpoint::Settle => (
            Method::POST,
            format!("/v1/items/{id}/settle"),
            Some(json!({"token": token, "state": "done"})),
        ),
        Endpoint::Release => (Method::POST, format!("/v1/items/{id}/release"), Some(lease)),
        Endpoint::Pause => (Method::POST, format!("/v1/items/{id}/pause"), None),
        Endpoint::Resume => {
            store.pause(id).await.unwrap();
            (Method::POST, format!("/v1/items/{id}/resume"), None)
        }
        Endpoint::Requeue => {
            let failed = agentstore_protocol::lease::SettleState::Failed;
            store
                .settle(id, &token, Some(p.holder.worker_id), failed, None, None)
                .await
                .unwrap();
            (Method::POST, format!("/v1/items/{id}/requeue"), None)
        }
        Endpoint::Cancel => (Method::POST, format!("/v1/items/{id}/cancel"), None),
        // A worker of its own: revoking one of the callers would refuse
        // the cells after it.
        Endpoint::RevokeWorker => {
            let w = enrolled(store, Role::Worker, Q).await.worker_id;
            (Method::POST, format!("/v1/admin/workers/{w}/revoke"), None)
        }
    }
}

pub async fn every_endpoint_allows_exactly_its_roles_and_a_refusal_changes_nothing(db: TestDb) {
    let server = http_server(&db).await;
    let store = server.store().clone();
    let p = Principals::new(&store).await;
    let http = reqwest::Client::new();
    let mut refused = 0;
    for e in ENDPOINTS {
        for who in EVERYONE {
            let (method, path, body) = request(&store, &p, e).await;
            let before = snapshot(&store).await;
            let mut req = http.request(method.clone(), format!("{}{path}", server.url()));
            if let Some(b) = p.bearer(who) {
                req = req.bearer_auth(b);
            }
            if let Some(body) = body {
                req = req.json(&body);
            }
            let resp = req.send().await.unwrap();
            let status = resp.status();
            let text = resp.text().await.unwrap();
            let cell = format!("{method} {path} as {who:?}: {status} {text}");
            // The batched call answers 200 with a result per lease; a foreign
            // lease is refused in its result.
            let batch_refusal = e == Endpoint::Heartbeats
                && status == StatusCode::OK
                && serde_json::from_str::<Value>(&text).unwrap()["results"][0]["error"]["code"]
                    == json!("forbidden");
            if allowed(e, who) {
                assert!(status.is_success() && !batch_refusal, "allowed: {cell}");
                continue;
            }
            refused += 1;
            let expected = if who == Who::Anonymous {
                ErrorCode::Unauthorized
            } else {
                ErrorCode::Forbidden
            };
            if !batch_refusal {
                assert_eq!(status.as_u16(), expected.status(), "refused: {cell}");
                let err: ErrorBody = serde_json::from_str(&text).expect(&cell);
                assert_eq!(err.code, expected, "{cell}");
            }
            assert_eq!(
                snapshot(&store).await,
                before,
                "a refusal changed state: {cell}"
            );
        }
    }
    assert!(refused > 40, "the matrix refuses most cells ({refused})");
    server.stop().await.unwrap();
}

/// Before, enqueue, heartbeat, the batched heartbeat, settle and release
/// parsed their body before the role check: a caller of the wrong role (a
/// worker enqueuing, a producer heartbeating) sending an empty or malformed
/// body was answered `400`, not the `403` every other refusal is; and
/// enqueue, listing, claim and queue stats checked the queue name first, so
/// a caller of the wrong role naming an invalid queue got `400` too. Now
/// every endpoint refuses a caller its role or queue scope does not allow
/// (`401` without credentials) before parsing the body or the queue name,
/// and changes nothing. (A body over the limit may be answered `413`
/// first; a worker sending another lease's token is refused by the lease
/// fence, which needs the body: neither is here.)
pub async fn a_refused_caller_is_refused_whatever_its_body(db: TestDb) {
    let server = http_server(&db).await;
    let store = server.store().clone();
    let p = Principals::new(&store).await;
    let http = reqwest::Client::new();
    let bodies: [(&str, &str); 4] = [
        ("empty", ""),
        ("truncated JSON", "{\"token\": "),
        ("not an object", "[1, 2]"),
        ("wrong shape", "{\"nonsense\": true}"),
    ];
    let (mut refused, mut wrong) = (0, Vec::new());
    for e in ENDPOINTS {
        let (method, path, _) = request(&store, &p, e).await;
        if method != Method::POST {
            continue;
        }
        for who in EVERYONE {
            let fenced = matches!(
                e,
                Endpoint::Heartbeat | Endpoint::Heartbeats | Endpoint::Settle | Endpoint::Release
            ) && matches!(who, Who::OtherWorker | Who::WorkerElsewhere);
            if allowed(e, who) || fenced {
                continue;
            }
            let expected = if who == Who::Anonymous {
                ErrorCode::Unauthorized
            } else {
                ErrorCode::Forbidden
            };
            for (what, body) in bodies {
                let before = snapshot(&store).await;
                let mut req = http
                    .post(format!("{}{path}", server.url()))
                    .header("content-type", "application/json")
                    .body(body.to_owned());
                if let Some(b) = p.bearer(who) {
                    req = req.bearer_auth(b);
                }
                let resp = req.send().await.unwrap();
                let status = resp.status();
                let text = resp.text().await.unwrap();
                let cell = format!("POST {path} as {who:?}, {what} body: {status} {text}");
                let code = serde_json::from_str::<ErrorBody>(&text).map(|b| b.code);
                if status.as_u16() != expected.status() || code.ok() != Some(expected) {
                    wrong.push(cell.clone());
                }
                assert_eq!(snapshot(&store).await, before, "changed state: {cell}");
                refused += 1;
            }
        }
    }
    // A caller of the wrong role naming an invalid queue is refused too;
    // one whose scope holds every queue is told the name is invalid. Also
    // a name that does not decode as UTF-8 (`%FF`): before, axum's path
    // extractor answered it `400` to every caller, ahead of the role check.
    let worker = p.holder.access_token.as_str();
    let producer = p.producer.access_token.as_str();
    for (method, path, bearer, expected) in ["/v1/queues/bad%20q", "/v1/queues/%FF"]
        .into_iter()
        .flat_map(|bad| {
            [
                (
                    Method::POST,
                    format!("{bad}/items"),
                    worker,
                    StatusCode::FORBIDDEN,
                ),
                (
                    Method::GET,
                    format!("{bad}/items"),
                    worker,
                    StatusCode::FORBIDDEN,
                ),
                (
                    Method::GET,
                    format!("{bad}/stats"),
                    worker,
                    StatusCode::FORBIDDEN,
                ),
                (
                    Method::POST,
                    format!("{bad}/claims"),
                    producer,
                    StatusCode::FORBIDDEN,
                ),
                (
                    Method::POST,
                    format!("{bad}/items"),
                    ADMIN,
                    StatusCode::BAD_REQUEST,
                ),
                (
                    Method::POST,
                    format!("{bad}/claims"),
                    ADMIN,
                    StatusCode::BAD_REQUEST,
                ),
            ]
        })
    {
        let before = snapshot(&store).await;
        let resp = http
            .request(method.clone(), format!("{}{path}", server.url()))
            .bearer_auth(bearer)
            .header("content-type", "application/json")
            .body(if method == Method::POST {
                "{\"payload\": 1}"
            } else {
                ""
            })
            .send()
            .await
            .unwrap();
        let status = resp.status();
        if status != expected {
            let text = resp.text().await.unwrap();
            wrong.push(format!("{method} {path}: {status} {text}"));
        }
        assert_eq!(
            snapshot(&store).await,
            before,
            "changed state: {method} {path}"
        );
    }
    // A producer is refused a fenced call before its item id is read too.
    for (id, rest) in ["not-an-id", "%FF"]
        .into_iter()
        .flat_map(|id| ["heartbeat", "settle", "release"].map(|rest| (id, rest)))
    {
        let path = format!("/v1/items/{id}/{rest}");
        let resp = http
            .post(format!("{}{path}", server.url()))
            .bearer_auth(&p.producer.access_token)
            .body("")
            .send()
            .await
            .unwrap();
        let status = resp.status();
        if status != StatusCode::FORBIDDEN {
            let text = resp.text().await.unwrap();
            wrong.push(format!("POST {path} as Producer: {status} {text}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "not refused as such:\n{}",
        wrong.join("\n")
    );
    assert!(refused > 100, "cells refused: {refused}");
    server.stop().await.unwrap();
}

pub async fn a_worker_enrolled_for_one_queue_claims_there_and_nowhere_else(db: TestDb) {
    let server = http_server(&db).await;
    let store = server.store().clone();
    let worker = enrolled(&store, Role::Worker, Q).await;
    store.enqueue(Q, &json!(1), None).await.unwrap();
    let other = store.enqueue("other", &json!(2), None).await.unwrap();
    let http = reqwest::Client::new();
    let claim = |queue: &str| {
        http.post(format!("{}/v1/queues/{queue}/claims", server.url()))
            .bearer_auth(&worker.access_token)
            .send()
    };
    assert_eq!(claim(Q).await.unwrap().status(), StatusCode::CREATED);
    assert_eq!(
        claim("other").await.unwrap().status(),
        StatusCode::FORBIDDEN
    );
    let still = store.item(other.id).await.unwrap().unwrap();
    assert_eq!((still.epoch, still.worker_id), (0, None), "untouched");
    // The scope survives a refresh.
    let fresh = store.refresh(&worker.refresh_token).await.unwrap();
    let p = store.authenticate(&fresh.access_token).await.unwrap();
    assert_eq!((p.role, p.queues), (Role::Worker, vec![Q.to_owned()]));
    server.stop().await.unwrap();
}

/// Before, `GET /v1/items/{id}` answered `404` for an id that does not
/// exist and `403` for one outside the caller's scope, and a worker's
/// heartbeat, settle or release with a wrong token answered `404` or `409`
/// the same way: any enrolled caller could list the ids in use in every
/// queue. Now a caller other than the admin gets, for a missing item, the
/// answer it gets for an existing item it may not touch (the same status,
/// code and message but for the id), in one call and in a batched
/// heartbeat; nothing is written. The admin is still told `not_found`.
pub async fn an_enrolled_caller_cannot_tell_a_missing_item_from_one_it_may_not_touch(db: TestDb) {
    let server = http_server(&db).await;
    let store = server.store().clone();
    let p = Principals::new(&store).await;
    let elsewhere = store
        .enqueue("elsewhere", &json!({"n": 1}), None)
        .await
        .unwrap();
    store
        .claim("elsewhere", Some(p.worker_elsewhere.worker_id))
        .await
        .unwrap()
        .expect("claimed");
    let (existing, missing) = (elsewhere.id, elsewhere.id + 1_000);
    let wrong = "0".repeat(48);
    let http = reqwest::Client::new();
    let call = |method: Method, path: String, bearer: &str, body: Option<Value>| {
        let mut req = http
            .request(method, format!("{}{path}", server.url()))
            .bearer_auth(bearer);
        if let Some(b) = body {
            req = req.json(&b);
        }
        async move {
            let resp = req.send().await.unwrap();
            (resp.status().as_u16(), resp.text().await.unwrap())
        }
    };
    // The answer for item `id` with the id written as `#`.
    let seen = |answer: (u16, String), id: i64| {
        let err: ErrorBody = serde_json::from_str(&answer.1).expect(&answer.1);
        (
            answer.0,
            err.code,
            err.message.replace(&id.to_string(), "#"),
        )
    };
    let before = snapshot(&store).await;
    for who in [
        &p.producer,
        &p.producer_elsewhere,
        &p.holder,
        &p.other_worker,
    ] {
        let bearer = who.access_token.as_str();
        let get = |id: i64| call(Method::GET, format!("/v1/items/{id}"), bearer, None);
        let (a, b) = (get(existing).await, get(missing).await);
        // A producer of "elsewhere" may read the existing item.
        if a.0 != 200 {
            assert_eq!(seen(a, existing), seen(b, missing), "GET");
        } else {
            assert_eq!(b.0, 403, "GET of a missing item: {}", b.1);
        }
    }
    for who in [&p.holder, &p.other_worker, &p.worker_elsewhere] {
        let bearer = who.access_token.as_str();
        for (rest, body) in [
            ("heartbeat", json!({"token": wrong})),
            ("settle", json!({"token": wrong, "state": "done"})),
            ("release", json!({"token": wrong})),
        ] {
            let post = |id: i64| {
                call(
                    Method::POST,
                    format!("/v1/items/{id}/{rest}"),
                    bearer,
                    Some(body.clone()),
                )
            };
            let (a, b) = (post(existing).await, post(missing).await);
            assert_eq!(a.0, 409, "{rest}: {}", a.1);
            assert_eq!(seen(a, existing), seen(b, missing), "{rest}");
        }
        let batch = call(
            Method::POST,
            "/v1/heartbeats".into(),
            bearer,
            Some(json!({"leases": [
                {"item_id": existing, "token": wrong},
                {"item_id": missing, "token": wrong}]})),
        )
        .await;
        assert_eq!(batch.0, 200, "{}", batch.1);
        let results: Value = serde_json::from_str(&batch.1).unwrap();
        let entry = |i: usize, id: i64| {
            let e = &results["results"][i]["error"];
            (
                e["code"].clone(),
                e["message"].as_str().unwrap().replace(&id.to_string(), "#"),
            )
        };
        assert_eq!(entry(0, existing), entry(1, missing), "batched heartbeat");
        assert_eq!(entry(0, existing).0, json!("claim_lost"));
    }
    assert_eq!(snapshot(&store).await, before, "nothing written");
    // A producer of every queue may read every item: it is told which do
    // not exist (by a read); so is the admin, by a read and a fenced write.
    let everywhere = enrolled(&store, Role::Producer, "*").await;
    let answer = call(
        Method::GET,
        format!("/v1/items/{missing}"),
        &everywhere.access_token,
        None,
    )
    .await;
    assert_eq!(seen(answer, missing).1, ErrorCode::NotFound, "'*' producer");
    for (method, rest, body) in [
        (Method::GET, "", None),
        (Method::POST, "/heartbeat", Some(json!({"token": wrong}))),
    ] {
        let answer = call(method, format!("/v1/items/{missing}{rest}"), ADMIN, body).await;
        assert_eq!(seen(answer, missing).1, ErrorCode::NotFound, "admin{rest}");
    }
    server.stop().await.unwrap();
}
