//! An operator revokes a worker's or producer's credentials
//! (`POST /v1/admin/workers/{id}/revoke`): before, a leaked credential could
//! only be revoked by refresh-token reuse detection, and otherwise lived for
//! the access token's TTL and the refresh token's lifetime.

use agentstore_protocol::lease::{ItemState, WorkerCredentials};
use agentstore_protocol::{ErrorBody, ErrorCode};
use reqwest::{Client, StatusCode};
use serde_json::{json, Value};

use crate::common::{admin_json, enqueue_over_http, enroll, http_server, TestDb, ADMIN};

/// `POST {base}/v1/admin/workers/{id}/revoke` with `bearer`.
async fn revoke(http: &Client, base: &str, id: &str, bearer: &str) -> reqwest::Response {
    http.post(format!("{base}/v1/admin/workers/{id}/revoke"))
        .bearer_auth(bearer)
        .send()
        .await
        .unwrap()
}

/// The status of a `POST {base}{path}` with `bearer` and `body`.
async fn status(http: &Client, base: &str, path: &str, bearer: &str, body: Value) -> StatusCode {
    http.post(format!("{base}{path}"))
        .bearer_auth(bearer)
        .json(&body)
        .send()
        .await
        .unwrap()
        .status()
}

/// The status of `POST /v1/workers/refresh` with `refresh_token`.
async fn refresh(http: &Client, base: &str, refresh_token: &str) -> reqwest::Response {
    http.post(format!("{base}/v1/workers/refresh"))
        .json(&json!({ "refresh_token": refresh_token }))
        .send()
        .await
        .unwrap()
}

/// After a revoke, every access token of the worker (the current one, one
/// this instance verified a moment before and so holds in its cache, and
/// one from before its last refresh) is refused `401` on claim and
/// heartbeat, and its refresh token is refused; other workers are not
/// touched. Its lease is left running, to expire after its TTL like a lost
/// worker's, and the reaper takes it over. Revoking again is `204` too.
pub async fn an_admin_revoke_refuses_every_credential_of_the_worker_at_once(db: TestDb) {
    let server = http_server(&db).await;
    let store = server.store().clone();
    let http = Client::new();
    let base = server.url().to_owned();
    // Enrolled with a token kept here, to be sent again after the revoke.
    let enrollment = admin_json(
        http.post(format!("{base}/v1/admin/enrollment-tokens"))
            .json(&json!({})),
    )
    .await["token"]
        .clone();
    let enroll_with = |token: Value| {
        http.post(format!("{base}/v1/workers/enroll"))
            .json(&json!({ "token": token }))
            .send()
    };
    let resp = enroll_with(enrollment.clone()).await.unwrap();
    assert_eq!(resp.status(), StatusCode::CREATED);
    let first: WorkerCredentials = resp.json().await.unwrap();
    let other = enroll(&http, &base).await;
    let resp = refresh(&http, &base, &first.refresh_token).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let worker: WorkerCredentials = resp.json().await.unwrap();
    assert_eq!(worker.worker_id, first.worker_id);

    let id = enqueue_over_http(&http, &base, "rv").await;
    let resp = http
        .post(format!("{base}/v1/queues/rv/claims"))
        .bearer_auth(&worker.access_token)
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::CREATED);
    let claimed: Value = resp.json().await.unwrap();
    let lease = json!({"token": claimed["lease"]["token"]});
    let heartbeat = format!("/v1/items/{id}/heartbeat");
    // Verified, and so in this instance's cache of verified tokens.
    let beat = status(
        &http,
        &base,
        &heartbeat,
        &worker.access_token,
        lease.clone(),
    )
    .await;
    assert_eq!(beat, StatusCode::OK);

    let resp = revoke(&http, &base, &worker.worker_id.to_string(), ADMIN).await;
    assert_eq!(resp.status(), StatusCode::NO_CONTENT);
    for access in [&worker.access_token, &first.access_token] {
        let claim = status(&http, &base, "/v1/queues/rv/claims", access, json!({})).await;
        assert_eq!(claim, StatusCode::UNAUTHORIZED, "claim after the revoke");
        let beat = status(&http, &base, &heartbeat, access, lease.clone()).await;
        assert_eq!(beat, StatusCode::UNAUTHORIZED, "heartbeat after the revoke");
    }
    for refresh_token in [&worker.refresh_token, &first.refresh_token] {
        let resp = refresh(&http, &base, refresh_token).await;
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED, "refresh after it");
    }
    // Its enrollment token, sent again (as after a lost answer), enrolls
    // nothing back.
    let resp = enroll_with(enrollment).await.unwrap();
    assert_eq!(
        resp.status(),
        StatusCode::UNAUTHORIZED,
        "the enrollment token sent again after the revoke"
    );
    // Idempotent.
    let resp = revoke(&http, &base, &worker.worker_id.to_string(), ADMIN).await;
    assert_eq!(resp.status(), StatusCode::NO_CONTENT, "revoked again");
    // Another worker is not touched.
    let claim = status(
        &http,
        &base,
        "/v1/queues/rv/claims",
        &other.access_token,
        json!({}),
    )
    .await;
    assert_eq!(claim, StatusCode::NO_CONTENT, "another worker still claims");

    // The lease stays until its TTL runs out (moved back here in SQL),
    // then the reaper reopens the item as for any lost worker.
    let item = store.item(id).await.unwrap().unwrap();
    assert_eq!(item.state, ItemState::Running, "the lease is left running");
    sqlx::query("UPDATE items SET heartbeat_at = heartbeat_at - lease_ttl_ms - 1000 WHERE id = $1")
        .bind(id)
        .execute(store.pool())
        .await
        .unwrap();
    store.reap().await.unwrap();
    let item = store.item(id).await.unwrap().unwrap();
    assert_eq!((item.state, item.attempts), (ItemState::Open, 1));
    server.stop().await.unwrap();
}

/// A producer's credentials are revoked the same way; an unknown id is
/// `404 not_found`, an id that is not a positive integer `400`, and a
/// worker or producer token calling the route `403 forbidden` (nothing
/// revoked).
pub async fn revoking_needs_the_admin_and_a_known_id(db: TestDb) {
    let server = http_server(&db).await;
    let http = Client::new();
    let base = server.url().to_owned();
    let worker = enroll(&http, &base).await;
    let token = admin_json(
        http.post(format!("{base}/v1/admin/enrollment-tokens"))
            .json(&json!({"role": "producer", "queues": ["rp"]})),
    )
    .await;
    let resp = http
        .post(format!("{base}/v1/workers/enroll"))
        .json(&json!({"token": token["token"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::CREATED);
    let producer: WorkerCredentials = resp.json().await.unwrap();
    let enqueue = "/v1/queues/rp/items";
    let body = json!({"payload": 1});

    // Neither may revoke (itself or the other): 403, and both still work.
    for (caller, target) in [
        (&worker, &producer),
        (&producer, &worker),
        (&worker, &worker),
    ] {
        let resp = revoke(
            &http,
            &base,
            &target.worker_id.to_string(),
            &caller.access_token,
        )
        .await;
        assert_eq!(resp.status(), StatusCode::FORBIDDEN);
        let err: ErrorBody = resp.json().await.unwrap();
        assert_eq!(err.code, ErrorCode::Forbidden);
    }
    let claim = status(
        &http,
        &base,
        "/v1/queues/rp/claims",
        &worker.access_token,
        json!({}),
    )
    .await;
    assert_eq!(claim, StatusCode::NO_CONTENT, "the worker was not revoked");
    let sent = status(&http, &base, enqueue, &producer.access_token, body.clone()).await;
    assert_eq!(sent, StatusCode::CREATED, "the producer was not revoked");

    for (id, code) in [
        ("999999999", ErrorCode::NotFound),
        ("0", ErrorCode::BadRequest),
        ("-1", ErrorCode::BadRequest),
        ("x", ErrorCode::BadRequest),
    ] {
        let resp = revoke(&http, &base, id, ADMIN).await;
        assert_eq!(resp.status().as_u16(), code.status(), "id {id}");
        let err: ErrorBody = resp.json().await.unwrap();
        assert_eq!(err.code, code, "id {id}");
    }

    let resp = revoke(&http, &base, &producer.worker_id.to_string(), ADMIN).await;
    assert_eq!(resp.status(), StatusCode::NO_CONTENT);
    let sent = status(&http, &base, enqueue, &producer.access_token, body).await;
    assert_eq!(sent, StatusCode::UNAUTHORIZED, "enqueue after the revoke");
    let resp = refresh(&http, &base, &producer.refresh_token).await;
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED, "refresh after it");
    server.stop().await.unwrap();
}

/// `POST {base}/v1/admin/enrollment-tokens/revoke` of `token` with `bearer`.
async fn revoke_enrollment(
    http: &Client,
    base: &str,
    token: &Value,
    bearer: &str,
) -> reqwest::Response {
    http.post(format!("{base}/v1/admin/enrollment-tokens/revoke"))
        .bearer_auth(bearer)
        .json(&json!({ "token": token }))
        .send()
        .await
        .unwrap()
}

/// A new enrollment token of every queue, as the admin creates it.
async fn enrollment_token(http: &Client, base: &str) -> Value {
    admin_json(
        http.post(format!("{base}/v1/admin/enrollment-tokens"))
            .json(&json!({})),
    )
    .await["token"]
        .clone()
}

/// `POST {base}/v1/workers/enroll` with `token`.
async fn enroll_with(http: &Client, base: &str, token: &Value) -> reqwest::Response {
    http.post(format!("{base}/v1/workers/enroll"))
        .json(&json!({ "token": token }))
        .send()
        .await
        .unwrap()
}

/// An operator revokes an enrollment token nobody used yet (handed out by
/// mistake, or to a party that no longer needs it): it then enrolls nothing
/// (`401`), and revoking it again is `204` too. Before, such a token stayed
/// usable for its whole lifetime (a day by default). A token used already
/// is not revoked (`409 conflict`, naming the worker it enrolled, which
/// keeps working); a token no row matches is `404`; only the admin may
/// revoke one.
pub async fn an_unused_enrollment_token_revoked_by_the_admin_enrolls_nothing(db: TestDb) {
    let server = http_server(&db).await;
    let http = Client::new();
    let base = server.url().to_owned();
    let token = enrollment_token(&http, &base).await;
    let resp = revoke_enrollment(&http, &base, &token, ADMIN).await;
    assert_eq!(resp.status(), StatusCode::NO_CONTENT);
    let resp = enroll_with(&http, &base, &token).await;
    assert_eq!(
        resp.status(),
        StatusCode::UNAUTHORIZED,
        "enrolled after the revoke"
    );
    let resp = revoke_enrollment(&http, &base, &token, ADMIN).await;
    assert_eq!(resp.status(), StatusCode::NO_CONTENT, "revoked again");

    // Used already: refused, and the worker it enrolled is not touched.
    let used = enrollment_token(&http, &base).await;
    let resp = enroll_with(&http, &base, &used).await;
    assert_eq!(resp.status(), StatusCode::CREATED);
    let worker: WorkerCredentials = resp.json().await.unwrap();
    let resp = revoke_enrollment(&http, &base, &used, ADMIN).await;
    assert_eq!(resp.status(), StatusCode::CONFLICT);
    let err: ErrorBody = resp.json().await.unwrap();
    assert_eq!(err.code, ErrorCode::Conflict);
    assert!(
        err.message
            .contains(&format!("worker {}", worker.worker_id)),
        "{}",
        err.message
    );
    let claim = status(
        &http,
        &base,
        "/v1/queues/re/claims",
        &worker.access_token,
        json!({}),
    )
    .await;
    assert_eq!(claim, StatusCode::NO_CONTENT, "the worker still claims");

    // No row matches: a token whose secret is wrong, a malformed one, a
    // refresh token.
    let text = token.as_str().unwrap();
    let last = if text.ends_with('0') { "1" } else { "0" };
    let wrong = json!(format!("{}{last}", &text[..text.len() - 1]));
    for t in [wrong, json!("ase_nonsense"), json!(worker.refresh_token)] {
        let resp = revoke_enrollment(&http, &base, &t, ADMIN).await;
        assert_eq!(resp.status(), StatusCode::NOT_FOUND, "{t}");
        let err: ErrorBody = resp.json().await.unwrap();
        assert_eq!(err.code, ErrorCode::NotFound);
    }

    // Only the admin: a worker's token is 403, none 401, and an unknown
    // field 400; the token stays usable.
    let fresh = enrollment_token(&http, &base).await;
    let resp = revoke_enrollment(&http, &base, &fresh, &worker.access_token).await;
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    let resp = http
        .post(format!("{base}/v1/admin/enrollment-tokens/revoke"))
        .json(&json!({ "token": fresh }))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    let resp = http
        .post(format!("{base}/v1/admin/enrollment-tokens/revoke"))
        .bearer_auth(ADMIN)
        .json(&json!({ "token": fresh, "worker": 1 }))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 400);
    let resp = enroll_with(&http, &base, &fresh).await;
    assert_eq!(
        resp.status(),
        StatusCode::CREATED,
        "not revoked by a refused call"
    );
    server.stop().await.unwrap();
}

/// A revoke and an enrollment of one token sent at the same moment: exactly
/// one wins, every round — the enrollment (`201`, the revoke `409`) or the
/// revoke (`204`, the enrollment `401`). Never both (a worker enrolled with
/// a token the operator was told is revoked), never neither.
pub async fn an_enrollment_racing_the_revoke_of_its_token_ends_one_way(db: TestDb) {
    let server = http_server(&db).await;
    let http = Client::new();
    let base = server.url().to_owned();
    let (mut enrolled, mut revoked) = (0, 0);
    for round in 0..20 {
        let token = enrollment_token(&http, &base).await;
        let barrier = tokio::sync::Barrier::new(2);
        let (e, r) = tokio::join!(
            async {
                barrier.wait().await;
                enroll_with(&http, &base, &token).await.status()
            },
            async {
                barrier.wait().await;
                revoke_enrollment(&http, &base, &token, ADMIN)
                    .await
                    .status()
            },
        );
        match (e, r) {
            (StatusCode::CREATED, StatusCode::CONFLICT) => enrolled += 1,
            (StatusCode::UNAUTHORIZED, StatusCode::NO_CONTENT) => revoked += 1,
            other => panic!("round {round}: enroll and revoke answered {other:?}"),
        }
    }
    assert_eq!(enrolled + revoked, 20);
    server.stop().await.unwrap();
}
