//! Early answers over real TCP: a request refused before its handler read the
//! body (no or a bad token, the wrong role, a rate limit, a host or method
//! the server does not answer) still gets its status and `{code, message}`
//! when it sent a large body. Answered while that body sat unread in the
//! socket, the server closed the connection with it unread, the kernel sent
//! a TCP reset, and the client often saw a network error instead of the
//! refusal (2–4 of 40 at 2 MB on loopback).

use agentstore_protocol::lease::{Role, WorkerCredentials};
use agentstore_protocol::{ErrorBody, ErrorCode};
use agentstore_server::Store;
use reqwest::{Method, StatusCode};

use crate::common::{TestDb, ADMIN};

/// Requests of each kind: enough that a lost answer shows (before the fix,
/// a few in 40 were lost at 2 MB).
const TRIES: usize = 40;

/// The body every refused request sends: 2 MiB, under the server's limit.
const BODY_BYTES: usize = 2 * 1024 * 1024;

async fn enrolled(store: &Store, role: Role) -> WorkerCredentials {
    let (token, _) = store
        .create_enrollment_token(None, role, &["jobs".to_owned()])
        .await
        .unwrap();
    store.enroll(&token.0, Some("refused")).await.unwrap()
}

/// One kind of refusal: the request, and the status and code it must get.
struct Refusal {
    what: &'static str,
    method: Method,
    path: &'static str,
    bearer: Option<String>,
    host: Option<&'static str>,
    status: StatusCode,
    code: ErrorCode,
}

/// Sends `r` [`TRIES`] times, one after the other on one client, with a
/// 2 MiB body; returns what went wrong (lost answers, wrong answers).
async fn send(url: String, r: Refusal, body: &'static [u8]) -> Vec<String> {
    let http = reqwest::Client::new();
    let mut wrong = Vec::new();
    for i in 0..TRIES {
        let mut req = http
            .request(r.method.clone(), format!("{url}{}", r.path))
            .header("content-type", "application/json")
            .body(body);
        if let Some(b) = &r.bearer {
            req = req.bearer_auth(b);
        }
        if let Some(h) = r.host {
            req = req.header("host", h);
        }
        let cell = format!("{} #{i} ({} {})", r.what, r.method, r.path);
        let resp = match req.send().await {
            Ok(resp) => resp,
            Err(e) => {
                wrong.push(format!("{cell}: lost: {e:?}"));
                continue;
            }
        };
        let status = resp.status();
        let text = match resp.text().await {
            Ok(t) => t,
            Err(e) => {
                wrong.push(format!("{cell}: {status}, body lost: {e:?}"));
                continue;
            }
        };
        let code = serde_json::from_str::<ErrorBody>(&text).map(|b| b.code);
        if status != r.status || code.ok() != Some(r.code) {
            wrong.push(format!("{cell}: {status} {text}"));
        }
    }
    wrong
}

/// Every refusal a handler or middleware answers before it reads the body
/// reaches a client that sent a 2 MiB body (under `--max-body-bytes`),
/// [`TRIES`] times in a row for each kind: `401` without or with a bad token,
/// the admin-only `403`, the claim's wrong-role `403`, the `429` of claim
/// polling and of enrolment, the `Host` check's `403` and a `405`. The
/// server reads and discards the unread body before it answers, so the
/// connection is not reset under the answer (and stays open for the next
/// request).
pub async fn a_refusal_reaches_a_client_that_sent_a_large_body(db: TestDb) {
    let mut config = db.config();
    config.max_body_bytes = 4 * 1024 * 1024;
    // One claim and one enrolment per client, then 429 for the rest of the test.
    config.claim_rate = "1/min".parse().unwrap();
    config.auth_rate = "1/min".parse().unwrap();
    let server = agentstore_server::Server::start(&config)
        .await
        .expect("start server");
    let store = server.store().clone();
    let producer = enrolled(&store, Role::Producer).await;
    let worker = enrolled(&store, Role::Worker).await;
    let http = reqwest::Client::new();
    // Take each limiter's one request, with no body.
    let claimed = http
        .post(format!("{}/v1/queues/jobs/claims", server.url()))
        .bearer_auth(&worker.access_token)
        .send()
        .await
        .unwrap();
    assert_eq!(claimed.status(), StatusCode::NO_CONTENT);
    let enrolled = http
        .post(format!("{}/v1/workers/enroll", server.url()))
        .body("{\"token\": \"not-a-token\"}")
        .send()
        .await
        .unwrap();
    assert_eq!(enrolled.status(), StatusCode::UNAUTHORIZED);
    let refusals = [
        Refusal {
            what: "no token",
            method: Method::POST,
            path: "/v1/queues/jobs/items",
            bearer: None,
            host: None,
            status: StatusCode::UNAUTHORIZED,
            code: ErrorCode::Unauthorized,
        },
        Refusal {
            what: "a bad token",
            method: Method::POST,
            path: "/v1/items/1/settle",
            bearer: Some("not-a-token".into()),
            host: None,
            status: StatusCode::UNAUTHORIZED,
            code: ErrorCode::Unauthorized,
        },
        Refusal {
            what: "a producer at an admin endpoint",
            method: Method::POST,
            path: "/v1/admin/enrollment-tokens",
            bearer: Some(producer.access_token.clone()),
            host: None,
            status: StatusCode::FORBIDDEN,
            code: ErrorCode::Forbidden,
        },
        Refusal {
            what: "a producer claiming",
            method: Method::POST,
            path: "/v1/queues/jobs/claims",
            bearer: Some(producer.access_token.clone()),
            host: None,
            status: StatusCode::FORBIDDEN,
            code: ErrorCode::Forbidden,
        },
        Refusal {
            what: "a worker claiming too fast",
            method: Method::POST,
            path: "/v1/queues/jobs/claims",
            bearer: Some(worker.access_token.clone()),
            host: None,
            status: StatusCode::TOO_MANY_REQUESTS,
            code: ErrorCode::RateLimited,
        },
        Refusal {
            what: "enrolling too fast",
            method: Method::POST,
            path: "/v1/workers/enroll",
            bearer: None,
            host: None,
            status: StatusCode::TOO_MANY_REQUESTS,
            code: ErrorCode::RateLimited,
        },
        Refusal {
            what: "another host",
            method: Method::POST,
            path: "/v1/queues/jobs/items",
            bearer: Some(ADMIN.into()),
            host: Some("evil.example"),
            status: StatusCode::FORBIDDEN,
            code: ErrorCode::Forbidden,
        },
        Refusal {
            what: "a method the path does not take",
            method: Method::POST,
            path: "/v1/health",
            bearer: None,
            host: None,
            status: StatusCode::METHOD_NOT_ALLOWED,
            code: ErrorCode::MethodNotAllowed,
        },
    ];
    // One buffer for every request (leaked: it lives as long as the test).
    let body: &'static [u8] = vec![b' '; BODY_BYTES].leak();
    let before = crate::common::snapshot(&store).await;
    let url = server.url();
    let sent = TRIES * refusals.len();
    let runs = refusals
        .into_iter()
        .map(|r| tokio::spawn(send(url.clone(), r, body)));
    let mut wrong = Vec::new();
    for run in futures_util::future::join_all(runs).await {
        wrong.extend(run.unwrap());
    }
    assert!(
        wrong.is_empty(),
        "{} of {sent} refusals did not arrive as sent:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
    assert_eq!(crate::common::snapshot(&store).await, before);
    server.stop().await.unwrap();
}
