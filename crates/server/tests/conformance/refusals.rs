//! Early answers over real TCP: a request refused before its handler read the
//! body (no or a bad token, the wrong role, a rate limit, a host or method
//! the server does not answer) still gets its status and `{code, message}`
//! when it sent a large body. Answered while that body sat unread in the
//! socket, the server closed the connection with it unread, the kernel sent
//! a TCP reset, and the client often saw a network error instead of the
//! refusal (18–33 of 320 here at 2 MiB on loopback; 30–35 of 160 at 8 MiB
//! over a 1 MiB limit, once bodies under it were drained).

use agentstore_protocol::lease::{Role, WorkerCredentials};
use agentstore_protocol::{ErrorBody, ErrorCode};
use agentstore_server::Store;
use reqwest::{Method, StatusCode};

use crate::common::{TestDb, ADMIN};

/// Requests of each kind: enough that a lost answer shows (before the fix,
/// a few in 40 were lost at 2 MB).
const TRIES: usize = 40;

const MIB: usize = 1024 * 1024;

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

/// A server with a body limit of `limit` bytes and claim and enrolment
/// rates of one a minute, each taken already (the rest of the test is
/// `429`), and a producer and a worker of queue `jobs`.
async fn limited_server(
    db: &TestDb,
    limit: usize,
) -> (
    agentstore_server::Server,
    WorkerCredentials,
    WorkerCredentials,
) {
    let mut config = db.config();
    config.max_body_bytes = limit;
    config.claim_rate = "1/min".parse().unwrap();
    config.auth_rate = "1/min".parse().unwrap();
    let server = agentstore_server::Server::start(&config)
        .await
        .expect("start server");
    let producer = enrolled(server.store(), Role::Producer).await;
    let worker = enrolled(server.store(), Role::Worker).await;
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
    (server, producer, worker)
}

/// Sends every refusal [`TRIES`] times with a body of `body_bytes` (each
/// kind on a client of its own, the kinds at once) and asserts that every
/// one got its status and code, and that nothing changed.
async fn every_answer_arrives(
    server: agentstore_server::Server,
    refusals: Vec<Refusal>,
    body_bytes: usize,
) {
    let store = server.store().clone();
    // One buffer for every request (leaked: it lives as long as the test).
    let body: &'static [u8] = vec![b' '; body_bytes].leak();
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
        "{} of {sent} answers did not arrive as sent:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
    assert_eq!(crate::common::snapshot(&store).await, before);
    server.stop().await.unwrap();
}

fn no_token() -> Refusal {
    Refusal {
        what: "no token",
        method: Method::POST,
        path: "/v1/queues/jobs/items",
        bearer: None,
        host: None,
        status: StatusCode::UNAUTHORIZED,
        code: ErrorCode::Unauthorized,
    }
}

fn not_the_admin(producer: &WorkerCredentials) -> Refusal {
    Refusal {
        what: "a producer at an admin endpoint",
        method: Method::POST,
        path: "/v1/admin/enrollment-tokens",
        bearer: Some(producer.access_token.clone()),
        host: None,
        status: StatusCode::FORBIDDEN,
        code: ErrorCode::Forbidden,
    }
}

fn enrolling_too_fast() -> Refusal {
    Refusal {
        what: "enrolling too fast",
        method: Method::POST,
        path: "/v1/workers/enroll",
        bearer: None,
        host: None,
        status: StatusCode::TOO_MANY_REQUESTS,
        code: ErrorCode::RateLimited,
    }
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
    let (server, producer, worker) = limited_server(&db, 4 * MIB).await;
    let refusals = vec![
        no_token(),
        Refusal {
            what: "a bad token",
            method: Method::POST,
            path: "/v1/items/1/settle",
            bearer: Some("not-a-token".into()),
            host: None,
            status: StatusCode::UNAUTHORIZED,
            code: ErrorCode::Unauthorized,
        },
        not_the_admin(&producer),
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
        enrolling_too_fast(),
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
    every_answer_arrives(server, refusals, 2 * MIB).await;
}

/// A body over `--max-body-bytes` (8 MiB over 1 MiB) is not drained before
/// the answer, but its answer arrives all the same, [`TRIES`] times in a
/// row for each kind: the `413` of a handler that read up to the limit, and
/// refusals sent before any of it was read (`401`, the admin-only `403`,
/// `429`). The answer goes out with `Connection: close` and the server then
/// closes lingering (it reads and discards what still arrives until the
/// client closes its side), so the close is no reset under the answer.
pub async fn an_answer_to_a_body_over_the_limit_reaches_the_client(db: TestDb) {
    let (server, producer, _) = limited_server(&db, MIB).await;
    let refusals = vec![
        Refusal {
            what: "too large",
            method: Method::POST,
            path: "/v1/queues/jobs/items",
            bearer: Some(ADMIN.into()),
            host: None,
            status: StatusCode::PAYLOAD_TOO_LARGE,
            code: ErrorCode::PayloadTooLarge,
        },
        no_token(),
        not_the_admin(&producer),
        enrolling_too_fast(),
    ];
    every_answer_arrives(server, refusals, 8 * MIB).await;
}
