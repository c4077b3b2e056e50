//! Release without `Authorization` (a `sendBeacon`): the lease token is the
//! only credential, so the answer tells nothing to a caller without it, and
//! such calls are rate limited per client address like enroll and refresh.

use agentstore_protocol::lease::Role;
use agentstore_protocol::{ErrorBody, ErrorCode};
use reqwest::{Client, Response};
use serde_json::json;

use crate::common::{enqueue_over_http, snapshot, statements, TestDb, ADMIN};

/// A tokenless release of item `id` with `token`.
async fn beacon(http: &Client, base: &str, id: i64, token: &str) -> Response {
    http.post(format!("{base}/v1/items/{id}/release"))
        .header("content-type", "text/plain;charset=UTF-8")
        .body(json!({ "token": token }).to_string())
        .send()
        .await
        .unwrap()
}

async fn error(resp: Response) -> (u16, ErrorBody) {
    (resp.status().as_u16(), resp.json().await.unwrap())
}

/// An item enqueued and claimed by the admin over HTTP; its id.
async fn claimed_item(http: &Client, base: &str) -> i64 {
    let id = enqueue_over_http(http, base, "q").await;
    let claim = http
        .post(format!("{base}/v1/queues/q/claims"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(claim.status(), 201);
    id
}

/// Before, a tokenless release answered `404 not_found` for an id that
/// does not exist and `409 claim_lost` for one that does: anyone could list
/// the ids in use. Now both are `409 claim_lost` with the same message
/// (but for the id) and cost the same one read; nothing is written. A
/// caller with credentials is told `not_found` as before.
pub async fn a_tokenless_release_of_a_missing_item_is_answered_as_a_wrong_token(db: TestDb) {
    let mut config = db.config();
    config.auth_rate = "1000000/s".parse().unwrap();
    config.reaper_ms = 3_600_000; // no reaper pass among the statements counted
    let server = agentstore_server::Server::start(&config).await.unwrap();
    let (http, base, store) = (Client::new(), server.url(), server.store().clone());
    let id = claimed_item(&http, &base).await;
    let missing = id + 1_000;
    let wrong = "0".repeat(48);
    let before = snapshot(&store).await;

    let (existing, n_existing) = statements(&store, beacon(&http, &base, id, &wrong)).await;
    let (absent, n_absent) = statements(&store, beacon(&http, &base, missing, &wrong)).await;
    let (existing, absent) = (error(existing).await, error(absent).await);
    assert_eq!(existing.0, 409);
    assert_eq!(existing.1.code, ErrorCode::ClaimLost);
    assert_eq!(
        (
            absent.0,
            absent.1.code,
            absent.1.message.replace(&missing.to_string(), "#")
        ),
        (
            existing.0,
            existing.1.code,
            existing.1.message.replace(&id.to_string(), "#")
        ),
        "a missing item is answered as a wrong token"
    );
    assert_eq!(n_absent, n_existing, "the same statements either way");
    assert_eq!(snapshot(&store).await, before, "nothing written");

    let admin = http
        .post(format!("{base}/v1/items/{missing}/release"))
        .bearer_auth(ADMIN)
        .json(&json!({ "token": wrong }))
        .send()
        .await
        .unwrap();
    assert_eq!(error(admin).await.1.code, ErrorCode::NotFound);
    server.stop().await.unwrap();
}

/// Before, tokenless releases had no limit (enroll and refresh had one).
/// Now past `--auth-rate` per client address they are `429` with
/// `Retry-After`, refused before the database is touched; an authenticated
/// release is not limited by it, and enrolling from the same address still
/// works (the beacons have a bucket of their own).
pub async fn tokenless_releases_past_the_auth_rate_are_refused_before_the_database(db: TestDb) {
    let mut config = db.config();
    config.auth_rate = "3/min".parse().unwrap();
    config.claim_rate = "1000000/s".parse().unwrap();
    config.reaper_ms = 3_600_000;
    let server = agentstore_server::Server::start(&config).await.unwrap();
    let (http, base, store) = (Client::new(), server.url(), server.store().clone());
    let id = claimed_item(&http, &base).await;
    let wrong = "0".repeat(48);
    for k in 0..3 {
        let (status, body) = error(beacon(&http, &base, id, &wrong).await).await;
        assert_eq!(
            (status, body.code),
            (409, ErrorCode::ClaimLost),
            "beacon {k}"
        );
    }
    let (limited, n) = statements(&store, beacon(&http, &base, id, &wrong)).await;
    assert_eq!(limited.status(), 429);
    let retry: u64 = limited.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&retry), "Retry-After {retry}");
    assert_eq!(error(limited).await.1.code, ErrorCode::RateLimited);
    assert_eq!(n, 0, "refused before the database is touched");

    let admin = http
        .post(format!("{base}/v1/items/{id}/release"))
        .bearer_auth(ADMIN)
        .json(&json!({ "token": wrong }))
        .send()
        .await
        .unwrap();
    assert_eq!(error(admin).await.1.code, ErrorCode::ClaimLost);
    let (token, _) = store
        .create_enrollment_token(None, Role::Worker, &["q".into()])
        .await
        .unwrap();
    let enroll = http
        .post(format!("{base}/v1/workers/enroll"))
        .json(&json!({ "token": token.0 }))
        .send()
        .await
        .unwrap();
    assert_eq!(enroll.status(), 201, "enroll has its own allowance");
    server.stop().await.unwrap();
}
