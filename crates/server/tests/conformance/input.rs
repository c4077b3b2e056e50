//! Hostile input over HTTP: every answer is 2xx or a 4xx `{code, message}`, the
//! same on both backends, and a refused request changes nothing.

use agentstore_protocol::lease::{ItemState, Role, WorkerCredentials};
use agentstore_protocol::{ErrorBody, ErrorCode};
use agentstore_server::{Server, Store};
use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, TestCaseError, TestRunner};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::common::{http_server, snapshot, TestDb, ADMIN};

/// Sends `body` (raw text) to `path` as `bearer`; returns status and text.
async fn send(
    server: &Server,
    method: Method,
    path: &str,
    bearer: Option<&str>,
    body: Option<String>,
) -> (StatusCode, String) {
    let mut req = reqwest::Client::new().request(method, format!("{}{path}", server.url()));
    if let Some(b) = bearer {
        req = req.bearer_auth(b);
    }
    if let Some(body) = body {
        req = req.header("content-type", "application/json").body(body);
    }
    let resp = req.send().await.unwrap();
    (resp.status(), resp.text().await.unwrap())
}

/// Asserts a `{code, message}` refusal with `code` and an unchanged database.
async fn refused(
    store: &Store,
    before: &[String],
    (status, text): (StatusCode, String),
    code: ErrorCode,
    what: &str,
) {
    assert_eq!(status.as_u16(), code.status(), "{what}: {text}");
    let body: ErrorBody = serde_json::from_str(&text).unwrap_or_else(|_| panic!("{what}: {text}"));
    assert_eq!(body.code, code, "{what}");
    assert!(!body.message.is_empty(), "{what}");
    assert_eq!(snapshot(store).await, before, "{what} changed state");
}

pub async fn out_of_range_numbers_are_400_before_they_reach_sql(db: TestDb) {
    let server = http_server(&db).await;
    let store = server.store().clone();
    let before = snapshot(&store).await;
    for (path, body) in [
        (
            "/v1/admin/enrollment-tokens",
            r#"{"expires_in_ms": 9223372036854775807}"#,
        ),
        (
            "/v1/admin/enrollment-tokens",
            r#"{"expires_in_ms": 18446744073709551615}"#,
        ),
        ("/v1/admin/enrollment-tokens", r#"{"expires_in_ms": 0}"#),
        ("/v1/admin/enrollment-tokens", r#"{"expires_in_ms": -1}"#),
        ("/v1/admin/enrollment-tokens", r#"{"expires_in_ms": 1e300}"#),
        (
            "/v1/queues/q/items",
            r#"{"payload": 1, "max_redeliveries": 4294967295}"#,
        ),
        (
            "/v1/queues/q/items",
            r#"{"payload": 1, "max_redeliveries": 1001}"#,
        ),
    ] {
        let answer = send(&server, Method::POST, path, Some(ADMIN), Some(body.into())).await;
        refused(&store, &before, answer, ErrorCode::Validation, body).await;
    }
    server.stop().await.unwrap();
}

/// An enqueue body gives its retry cap as `max_redeliveries` or as
/// `max_attempts` (one more), never both: both is `400 validation` naming
/// both fields, even when they agree, and nothing is written.
pub async fn an_enqueue_giving_both_max_redeliveries_and_max_attempts_is_refused(db: TestDb) {
    let server = http_server(&db).await;
    let store = server.store().clone();
    let before = snapshot(&store).await;
    for body in [
        r#"{"payload": 1, "max_redeliveries": 2, "max_attempts": 3}"#,
        r#"{"payload": 1, "max_attempts": 1, "max_redeliveries": 0}"#,
        r#"{"payload": 1, "max_redeliveries": 5000, "max_attempts": 0}"#,
    ] {
        let answer = send(
            &server,
            Method::POST,
            "/v1/queues/q/items",
            Some(ADMIN),
            Some(body.into()),
        )
        .await;
        let message = serde_json::from_str::<ErrorBody>(&answer.1).map(|b| b.message);
        let message = message.unwrap_or_default();
        refused(&store, &before, answer, ErrorCode::Validation, body).await;
        assert!(
            message.contains("max_redeliveries")
                && message.contains("max_attempts")
                && message.contains("not both"),
            "{body}: {message}"
        );
    }
    server.stop().await.unwrap();
}

/// `max_attempts` is 1..=1001 (`max_redeliveries` 0..=1000 plus the first
/// delivery): 0 or above 1001 is `400 validation` naming the range, nothing
/// written; the bounds themselves are accepted.
pub async fn an_enqueue_max_attempts_out_of_1_to_1001_is_refused_naming_the_range(db: TestDb) {
    let server = http_server(&db).await;
    let store = server.store().clone();
    let before = snapshot(&store).await;
    for n in ["0", "1002", "4294967295"] {
        let body = format!(r#"{{"payload": 1, "max_attempts": {n}}}"#);
        let answer = send(
            &server,
            Method::POST,
            "/v1/queues/q/items",
            Some(ADMIN),
            Some(body.clone()),
        )
        .await;
        let message = serde_json::from_str::<ErrorBody>(&answer.1).map(|b| b.message);
        let message = message.unwrap_or_default();
        refused(&store, &before, answer, ErrorCode::Validation, &body).await;
        assert!(
            message.contains("max_attempts must be 1..=1001"),
            "{body}: {message}"
        );
    }
    for (n, cap) in [(1, 0), (1001, 1000)] {
        let body = format!(r#"{{"payload": 1, "max_attempts": {n}}}"#);
        let (status, text) = send(
            &server,
            Method::POST,
            "/v1/queues/q/items",
            Some(ADMIN),
            Some(body),
        )
        .await;
        assert_eq!(status, StatusCode::CREATED, "{text}");
        let item: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(item["max_redeliveries"], json!(cap), "{text}");
    }
    server.stop().await.unwrap();
}

/// `.` and `..` are no queue names: a URL parser resolves them away (a
/// browser's `fetch` of `/v1/queues/../claims` reaches `/v1/claims`), so no
/// browser client could address such a queue. Refused as a path segment
/// sent unresolved (as `curl --path-as-is` sends it), plain or
/// percent-encoded, and in an enrollment token's scope; nothing is written.
/// Before, each was accepted (`201`, a queue named `..`).
pub async fn dot_segment_queue_names_are_refused(db: TestDb) {
    let server = http_server(&db).await;
    let store = server.store().clone();
    let before = snapshot(&store).await;
    for scope in [".", ".."] {
        let body = json!({"queues": [scope]}).to_string();
        let path = "/v1/admin/enrollment-tokens";
        let answer = send(&server, Method::POST, path, Some(ADMIN), Some(body)).await;
        refused(&store, &before, answer, ErrorCode::Validation, scope).await;
    }
    for name in ["..", "%2E%2E", "%2e.", ".", "%2E"] {
        for (route, body) in [("items", r#"{"payload": 1}"#), ("claims", "")] {
            let path = format!("/v1/queues/{name}/{route}");
            let answer = unresolved_post(&server, &path, body).await;
            refused(&store, &before, answer, ErrorCode::Validation, &path).await;
        }
    }
    // A name of three dots is not a dot segment: still a queue.
    let (status, text) = send(
        &server,
        Method::POST,
        "/v1/queues/.../items",
        Some(ADMIN),
        Some(r#"{"payload": 1}"#.into()),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{text}");
    server.stop().await.unwrap();
}

/// An enqueue sent again with its `Idempotency-Key` (its answer was lost)
/// adds no second item: the retry is answered `201` with the same item and
/// `Idempotent-Replayed: true`, also when the copies race; the key reused
/// for another request in the queue is `409 conflict`; keys are per queue;
/// a malformed key is `400 validation`. Nothing else is written. Before,
/// every retry added another item (no key was read).
pub async fn an_enqueue_sent_again_with_its_idempotency_key_adds_one_item(db: TestDb) {
    let server = http_server(&db).await;
    let store = server.store().clone();
    let http = reqwest::Client::new();
    let url = server.url();
    let post = |queue: &str, key: Option<String>, body: Value| {
        let mut req = http
            .post(format!("{url}/v1/queues/{queue}/items"))
            .bearer_auth(ADMIN)
            .json(&body);
        if let Some(k) = key {
            // As bytes: a non-ASCII key must reach the server to be refused.
            let value = reqwest::header::HeaderValue::from_bytes(k.as_bytes()).unwrap();
            req = req.header("Idempotency-Key", value);
        }
        async move {
            let resp = req.send().await.unwrap();
            let replayed = resp.headers().get("idempotent-replayed").is_some();
            let status = resp.status();
            (status, replayed, resp.json::<Value>().await.unwrap())
        }
    };
    let count = |queue: &'static str| {
        let pool = store.pool().clone();
        async move {
            sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM items WHERE queue = $1")
                .bind(queue)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    let key = || Some(String::from("order-7/attempt:1"));
    let (s, replayed, first) = post("iq", key(), json!({"payload": {"n": 7}})).await;
    assert_eq!((s, replayed), (StatusCode::CREATED, false), "{first}");
    let (s, replayed, again) = post("iq", key(), json!({"payload": {"n": 7}})).await;
    assert_eq!((s, replayed), (StatusCode::CREATED, true), "{again}");
    assert_eq!(again["id"], first["id"]);
    assert_eq!(count("iq").await, 1);
    // Racing copies of one request: one item, one of them not a replay.
    let copies: Vec<_> = (0..8)
        .map(|_| {
            post(
                "iq",
                Some("race".into()),
                json!({"payload": 1, "max_redeliveries": 2}),
            )
        })
        .collect();
    let answers = futures_util::future::join_all(copies).await;
    assert!(answers.iter().all(|(s, _, _)| *s == StatusCode::CREATED));
    assert_eq!(
        answers.iter().filter(|(_, r, _)| !r).count(),
        1,
        "one was not a replay"
    );
    assert!(answers
        .iter()
        .all(|(_, _, b)| b["id"] == answers[0].2["id"]));
    assert_eq!(count("iq").await, 2);
    let before = snapshot(&store).await;
    // The key reused for another request: refused, nothing written.
    for body in [
        json!({"payload": {"n": 8}}),
        json!({"payload": {"n": 7}, "max_redeliveries": 1}),
        json!({"payload": {"n":7}, "max_redeliveries": 5}),
    ] {
        let (s, _, b) = post("iq", key(), body.clone()).await;
        assert_eq!(
            (s, b["code"].as_str()),
            (StatusCode::CONFLICT, Some("conflict")),
            "{body}"
        );
    }
    for bad in [
        String::new(),
        "k".repeat(256),
        "a b".into(),
        "\u{e9}t\u{e9}".into(),
    ] {
        let (s, _, b) = post("iq", Some(bad.clone()), json!({"payload": 1})).await;
        assert_eq!(
            (s, b["code"].as_str()),
            (StatusCode::BAD_REQUEST, Some("validation")),
            "{bad:?}"
        );
    }
    assert_eq!(snapshot(&store).await, before, "refusals wrote nothing");
    // Keys are per queue, and requests without a key are never deduplicated.
    let (s, replayed, other) = post("iq2", key(), json!({"payload": {"n": 7}})).await;
    assert_eq!((s, replayed), (StatusCode::CREATED, false));
    assert_ne!(other["id"], first["id"]);
    for _ in 0..2 {
        assert_eq!(
            post("iq3", None, json!({"payload": 1})).await.0,
            StatusCode::CREATED
        );
    }
    assert_eq!(count("iq3").await, 2);
    // A replay whose item's row no longer decodes is still answered (it was
    // applied): `{id, state, unreadable_row: true}`, never a 500.
    sqlx::query("UPDATE items SET payload = 'not json' WHERE id = $1")
        .bind(first["id"].as_i64().unwrap())
        .execute(store.pool())
        .await
        .unwrap();
    let (s, replayed, b) = post("iq", key(), json!({"payload": {"n": 7}})).await;
    assert_eq!((s, replayed), (StatusCode::CREATED, true), "{b}");
    assert_eq!(
        (&b["id"], b["state"].as_str(), b["unreadable_row"].as_bool()),
        (&first["id"], Some("open"), Some(true))
    );
    server.stop().await.unwrap();
}

/// An enqueue's `Idempotency-Key` is its producer's own: two producers of
/// one queue (and the admin token) that send the same key get an item each,
/// with the same payload or another one, and each one's retry replays its
/// own item; a producer reusing its key for another request is still `409
/// conflict`. A key stored before keys were scoped (`idempotency_scope`
/// NULL) still answers every producer of its queue, as it did. Before,
/// keys were shared per queue: the second producer got the first one's
/// item as a replay (same payload) or a `409` (another payload).
pub async fn an_idempotency_key_is_scoped_to_the_producer_that_sent_it(db: TestDb) {
    let server = http_server(&db).await;
    let store = server.store().clone();
    let http = reqwest::Client::new();
    let url = server.url();
    let producer = |store: Store| async move {
        let (t, _) = store
            .create_enrollment_token(None, Role::Producer, &["sq".into()])
            .await
            .unwrap();
        store.enroll(&t.0, None).await.unwrap().access_token
    };
    let (a, b) = (producer(store.clone()).await, producer(store.clone()).await);
    let post = |bearer: &str, key: &str, body: Value| {
        let req = http
            .post(format!("{url}/v1/queues/sq/items"))
            .bearer_auth(bearer)
            .header("Idempotency-Key", key)
            .json(&body);
        async move {
            let resp = req.send().await.unwrap();
            let replayed = resp.headers().get("idempotent-replayed").is_some();
            let status = resp.status();
            (status, replayed, resp.json::<Value>().await.unwrap())
        }
    };
    let same = || json!({"payload": {"order": 1}});
    let (s, replayed, of_a) = post(&a, "k1", same()).await;
    assert_eq!((s, replayed), (StatusCode::CREATED, false), "{of_a}");
    // The same key and request by another producer, then by the admin:
    // items of their own, not a's item replayed.
    let (s, replayed, of_b) = post(&b, "k1", same()).await;
    assert_eq!((s, replayed), (StatusCode::CREATED, false), "{of_b}");
    let (s, replayed, of_admin) = post(ADMIN, "k1", same()).await;
    assert_eq!((s, replayed), (StatusCode::CREATED, false), "{of_admin}");
    let ids = [&of_a["id"], &of_b["id"], &of_admin["id"]];
    assert!(
        ids[0] != ids[1] && ids[1] != ids[2] && ids[0] != ids[2],
        "{ids:?}"
    );
    // Each one's retry replays its own item.
    for (who, first) in [(&a, &of_a), (&b, &of_b), (&ADMIN.to_owned(), &of_admin)] {
        let (s, replayed, again) = post(who, "k1", same()).await;
        assert_eq!((s, replayed), (StatusCode::CREATED, true), "{again}");
        assert_eq!(again["id"], first["id"]);
    }
    // Another payload under a key another producer used: a new item.
    let (s, replayed, other) = post(&a, "k2", json!({"payload": "a's"})).await;
    assert_eq!((s, replayed), (StatusCode::CREATED, false), "{other}");
    let (s, replayed, b_other) = post(&b, "k2", json!({"payload": "b's"})).await;
    assert_eq!((s, replayed), (StatusCode::CREATED, false), "{b_other}");
    assert_ne!(other["id"], b_other["id"]);
    // A producer reusing its own key for another request: still refused,
    // nothing written.
    let before = snapshot(&store).await;
    let (s, _, refused) = post(&a, "k1", json!({"payload": {"order": 2}})).await;
    assert_eq!(
        (s, refused["code"].as_str()),
        (StatusCode::CONFLICT, Some("conflict")),
        "{refused}"
    );
    assert_eq!(snapshot(&store).await, before, "the refusal wrote nothing");
    // A key stored before keys were scoped is the queue's, as it was: any
    // producer's retry of that request replays it, another request is 409.
    let (s, _, legacy) = post(&a, "old", same()).await;
    assert_eq!(s, StatusCode::CREATED);
    sqlx::query("UPDATE items SET idempotency_scope = NULL WHERE id = $1")
        .bind(legacy["id"].as_i64().unwrap())
        .execute(store.pool())
        .await
        .unwrap();
    for who in [&a, &b, &ADMIN.to_owned()] {
        let (s, replayed, again) = post(who, "old", same()).await;
        assert_eq!((s, replayed), (StatusCode::CREATED, true), "{again}");
        assert_eq!(again["id"], legacy["id"]);
        let (s, _, refused) = post(who, "old", json!({"payload": 0})).await;
        assert_eq!(s, StatusCode::CONFLICT, "{refused}");
    }
    let (count,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM items WHERE queue = 'sq'")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(count, 6, "k1 three times, k2 twice, old once");
    server.stop().await.unwrap();
}

/// POSTs `body` to `path` as the admin over a raw connection, the path sent
/// byte for byte (an HTTP client library resolves dot segments first).
async fn unresolved_post(server: &Server, path: &str, body: &str) -> (StatusCode, String) {
    use std::io::{Read, Write};
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {ADMIN}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let addr = server.addr();
    tokio::task::spawn_blocking(move || {
        let mut conn = std::net::TcpStream::connect(addr).unwrap();
        conn.set_read_timeout(Some(std::time::Duration::from_secs(20)))
            .unwrap();
        conn.write_all(request.as_bytes()).unwrap();
        let mut answer = String::new();
        conn.read_to_string(&mut answer).unwrap();
        let status = answer
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse::<u16>().ok())
            .expect("a status line");
        let body = answer.split("\r\n\r\n").nth(1).unwrap_or("").to_owned();
        (StatusCode::from_u16(status).unwrap(), body)
    })
    .await
    .unwrap()
}

pub async fn bodies_that_are_not_objects_of_the_documented_fields_are_refused(db: TestDb) {
    let server = http_server(&db).await;
    let store = server.store().clone();
    let before = snapshot(&store).await;
    for body in [
        r#"[{"job":1},3]"#,
        r#"[{"job":1}]"#,
        "3",
        r#""payload""#,
        "null",
        "true",
        r#"{"payload": 1, "extra": 2}"#,
        r#"{"payload": 1, "max_redeliveries": "3"}"#,
        r#"{"max_redeliveries": 3}"#,
        "[1,",
        "\u{0}",
    ] {
        enqueue_refused(&server, &store, &before, body, ErrorCode::Validation).await;
    }
    for body in ["{", "", "{\"payload\": 1"] {
        enqueue_refused(&server, &store, &before, body, ErrorCode::BadRequest).await;
    }
    server.stop().await.unwrap();
}

/// A payload or result that is JSON no client can read back as written is
/// refused with `400 validation` and nothing changes: nesting deeper than
/// 128, a number beyond `f64` (a browser reads `1e400` as `Infinity`), a lone
/// surrogate escape. A refused settle leaves the lease held: the same
/// settle with a readable result then lands. Before, each was stored, and a
/// resend of such a result could not be recognised as a replay.
pub async fn json_no_client_can_read_back_is_refused_in_payloads_and_results(db: TestDb) {
    let server = http_server(&db).await;
    let store = server.store().clone();
    let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
    let unreadable = [
        deep.as_str(),
        "1e400",
        "-1e400",
        r#""\ud800""#,
        r#"{"a": "x\udc00"}"#,
    ];
    let before = snapshot(&store).await;
    for value in unreadable {
        let body = format!(r#"{{"payload": {value}}}"#);
        enqueue_refused(&server, &store, &before, &body, ErrorCode::Validation).await;
    }
    let item = store.enqueue("q", &json!(1), None).await.unwrap();
    let lease = store.claim("q", None).await.unwrap().unwrap().lease;
    let path = format!("/v1/items/{}/settle", item.id);
    let before = snapshot(&store).await;
    for value in unreadable {
        let body = format!(
            r#"{{"token": {}, "state": "done", "result": {value}}}"#,
            serde_json::to_string(&lease.token).unwrap()
        );
        let answer = send(&server, Method::POST, &path, Some(ADMIN), Some(body)).await;
        refused(&store, &before, answer, ErrorCode::Validation, value).await;
    }
    let body = json!({"token": lease.token, "state": "done", "result": [1e300, "\u{e000}"]});
    let (status, text) = send(
        &server,
        Method::POST,
        &path,
        Some(ADMIN),
        Some(body.to_string()),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let now = store.item(item.id).await.unwrap().unwrap();
    assert_eq!(now.state, ItemState::Done);
    server.stop().await.unwrap();
}

async fn enqueue_refused(
    server: &Server,
    store: &Store,
    before: &[String],
    body: &str,
    code: ErrorCode,
) {
    let path = "/v1/queues/q/items";
    let answer = send(server, Method::POST, path, Some(ADMIN), Some(body.into())).await;
    refused(store, before, answer, code, body).await;
}

pub async fn a_failure_report_containing_nul_is_kept_and_the_item_leaves_running(db: TestDb) {
    let server = http_server(&db).await;
    let store = server.store().clone();
    let item = store.enqueue("q", &json!(1), None).await.unwrap();
    let lease = store.claim("q", None).await.unwrap().unwrap().lease;
    let body = json!({"token": lease.token, "state": "failed", "error": "disk\u{0}full",
                      "result": {"log": "a\u{0}b"}});
    let (status, text) = send(
        &server,
        Method::POST,
        &format!("/v1/items/{}/settle", item.id),
        Some(ADMIN),
        Some(body.to_string()),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let now = store.item(item.id).await.unwrap().unwrap();
    assert_eq!(now.state, ItemState::Failed);
    assert_eq!(now.last_error.as_deref(), Some("disk\u{FFFD}full"));
    assert_eq!(
        crate::common::value(now.result),
        Some(json!({"log": "a\u{0}b"})),
        "JSON keeps it escaped"
    );
    // A worker name cannot hold one: refused, nothing enrolled.
    let (t, _) = store
        .create_enrollment_token(None, Role::Worker, &["q".into()])
        .await
        .unwrap();
    let before = snapshot(&store).await;
    let body = json!({"token": t.0, "name": "w\u{0}"}).to_string();
    let answer = send(
        &server,
        Method::POST,
        "/v1/workers/enroll",
        None,
        Some(body),
    )
    .await;
    refused(
        &store,
        &before,
        answer,
        ErrorCode::Validation,
        "NUL in a name",
    )
    .await;
    server.stop().await.unwrap();
}

pub async fn framework_answers_are_code_and_message_too(db: TestDb) {
    let server = http_server(&db).await;
    let store = server.store().clone();
    let item = store.enqueue("q", &json!(1), None).await.unwrap();
    let before = snapshot(&store).await;
    let cases = [
        (
            Method::DELETE,
            format!("/v1/items/{}", item.id),
            ErrorCode::MethodNotAllowed,
        ),
        (
            Method::GET,
            "/v1/queues/q/claims".into(),
            ErrorCode::MethodNotAllowed,
        ),
        (
            Method::PUT,
            "/v1/heartbeats".into(),
            ErrorCode::MethodNotAllowed,
        ),
        (
            Method::GET,
            "/v1/items/%FF%FE".into(),
            ErrorCode::BadRequest,
        ),
        (
            Method::GET,
            "/v1/queues/q/items?limit=%FF".into(),
            ErrorCode::Validation,
        ),
        (
            Method::GET,
            "/v1/no/such/endpoint".into(),
            ErrorCode::NotFound,
        ),
        (Method::GET, "/v1/".into(), ErrorCode::NotFound),
        (Method::POST, "/v1".into(), ErrorCode::NotFound),
    ];
    for (method, path, code) in cases {
        let what = format!("{method} {path}");
        let answer = send(&server, method, &path, Some(ADMIN), None).await;
        refused(&store, &before, answer, code, &what).await;
    }
    server.stop().await.unwrap();
}

/// What a generated request is made of.
#[derive(Debug, Clone)]
struct Generated {
    method: Method,
    path: String,
    auth: Option<String>,
    content_type: Option<String>,
    body: Option<String>,
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        ".{0,12}".prop_map(Value::from),
        Just(Value::from("done")),
        Just(Value::from("failed")),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::btree_map(
                prop_oneof![
                    Just("payload".to_owned()),
                    Just("token".to_owned()),
                    Just("state".to_owned()),
                    Just("error".to_owned()),
                    Just("result".to_owned()),
                    Just("leases".to_owned()),
                    Just("item_id".to_owned()),
                    Just("max_redeliveries".to_owned()),
                    Just("max_attempts".to_owned()),
                    Just("expires_in_ms".to_owned()),
                    Just("role".to_owned()),
                    Just("queues".to_owned()),
                    Just("name".to_owned()),
                    Just("refresh_token".to_owned()),
                    ".{0,6}",
                ],
                inner,
                0..4,
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn generated(ids: Vec<i64>, tokens: Vec<String>) -> impl Strategy<Value = Generated> {
    let segment = prop_oneof![
        prop::sample::select(ids).prop_map(|i| i.to_string()),
        Just("q".to_owned()),
        Just("0".to_owned()),
        Just("-1".to_owned()),
        Just("9223372036854775808".to_owned()),
        Just("%00".to_owned()),
        Just("%FF".to_owned()),
        "[a-zA-Z0-9_.:%-]{0,12}",
    ];
    let path = (
        prop::sample::select(vec![
            "/v1/health",
            "/v1/admin/enrollment-tokens",
            "/v1/workers/enroll",
            "/v1/workers/refresh",
            "/v1/queues/{}/items",
            "/v1/queues/{}/claims",
            "/v1/items/{}",
            "/v1/items/{}/heartbeat",
            "/v1/items/{}/settle",
            "/v1/items/{}/release",
            "/v1/items/{}/pause",
            "/v1/items/{}/resume",
            "/v1/heartbeats",
            "/v1/{}",
        ]),
        segment,
        prop_oneof![
            Just(String::new()),
            Just("?state=done".to_owned()),
            Just("?limit=99999999999".to_owned()),
            "\\?[a-z=&%0-9]{0,12}",
        ],
    )
        .prop_map(|(t, s, q)| format!("{}{q}", t.replace("{}", &s)));
    let method = prop::sample::select(vec![
        Method::GET,
        Method::POST,
        Method::POST,
        Method::POST,
        Method::PUT,
        Method::DELETE,
        Method::PATCH,
    ]);
    let mut auths: Vec<Option<String>> = tokens.into_iter().map(Some).collect();
    auths.extend([
        None,
        Some("garbage".into()),
        Some(format!("asa_{}", "0".repeat(81))),
    ]);
    let body = prop_oneof![
        Just(None),
        json_value().prop_map(|v| Some(v.to_string())),
        ".{0,40}".prop_map(Some),
    ];
    let content_type = prop::sample::select(vec![
        None,
        Some("application/json".to_owned()),
        Some("text/plain".to_owned()),
        Some("application/x-www-form-urlencoded".to_owned()),
    ]);
    (
        method,
        path,
        prop::sample::select(auths),
        content_type,
        body,
    )
        .prop_map(|(method, path, auth, content_type, body)| Generated {
            method,
            path,
            auth,
            content_type,
            body,
        })
}

async fn principal(store: &Store, role: Role) -> WorkerCredentials {
    let (t, _) = store
        .create_enrollment_token(None, role, &["q".into()])
        .await
        .unwrap();
    store.enroll(&t.0, None).await.unwrap()
}

pub async fn generated_requests_never_get_a_5xx_and_a_refusal_changes_nothing(db: TestDb) {
    let server = http_server(&db).await;
    let store = server.store().clone();
    let worker = principal(&store, Role::Worker).await;
    let producer = principal(&store, Role::Producer).await;
    let mut ids = Vec::new();
    for n in 0..4 {
        ids.push(store.enqueue("q", &json!(n), None).await.unwrap().id);
    }
    store.claim("q", Some(worker.worker_id)).await.unwrap();
    let tokens = vec![ADMIN.to_owned(), worker.access_token, producer.access_token];
    let base = server.url();
    let http = reqwest::Client::new();
    let handle = tokio::runtime::Handle::current();
    let mut runner = TestRunner::new(ProptestConfig {
        cases: 160,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let outcome = runner.run(&generated(ids, tokens), |g| {
        tokio::task::block_in_place(|| {
            handle.block_on(async {
                let before = snapshot(&store).await;
                let url = format!("{base}{}", g.path);
                // A dot segment (`/v1/..`, `/v1/%2e%2e`) is resolved by the
                // URL parser before the request is sent: it leaves the API
                // (a static file's 404 has no JSON body), so only requests
                // whose resolved path is under `/v1` must answer one.
                let path = reqwest::Url::parse(&url)
                    .map(|u| u.path().to_owned())
                    .unwrap_or_default();
                let api = path == "/v1" || path.starts_with("/v1/");
                let mut req = http.request(g.method.clone(), url);
                if let Some(a) = &g.auth {
                    req = req.header("authorization", format!("Bearer {a}"));
                }
                if let Some(ct) = &g.content_type {
                    req = req.header("content-type", ct);
                }
                if let Some(b) = &g.body {
                    req = req.body(b.clone());
                }
                let resp = req
                    .send()
                    .await
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                let status = resp.status();
                let text = resp.text().await.unwrap_or_default();
                prop_assert!(!status.is_server_error(), "{g:?} -> {status} {text}");
                if status.is_client_error() {
                    let body: Result<ErrorBody, _> = serde_json::from_str(&text);
                    prop_assert!(
                        body.is_ok() || !api,
                        "{g:?} -> {status} not {{code, message}}: {text}"
                    );
                    prop_assert_eq!(
                        snapshot(&store).await,
                        before,
                        "{:?} -> {} changed state",
                        g,
                        status
                    );
                }
                Ok(())
            })
        })
    });
    if let Err(e) = outcome {
        panic!("{e}");
    }
    server.stop().await.unwrap();
}

/// An entry of a batched heartbeat whose `item_id` is not a positive
/// integer gets the code the single heartbeat answers for that id
/// (`bad_request`), and the other entries are renewed. Before, the entry
/// was looked up and answered `not_found` while the single route answered
/// `400 bad_request`.
pub async fn a_batched_heartbeat_entry_with_a_non_positive_id_is_bad_request_as_alone(db: TestDb) {
    let server = http_server(&db).await;
    let store = server.store().clone();
    store.enqueue("q", &json!(1), None).await.unwrap();
    let held = store.claim("q", None).await.unwrap().expect("claimed");
    let token = held.lease.token.clone();
    for id in [0i64, -1] {
        let (status, text) = send(
            &server,
            Method::POST,
            &format!("/v1/items/{id}/heartbeat"),
            Some(ADMIN),
            Some(json!({"token": token}).to_string()),
        )
        .await;
        assert_eq!(status.as_u16(), 400, "single, item {id}: {text}");
        let alone: ErrorBody = serde_json::from_str(&text).unwrap();
        assert_eq!(alone.code, ErrorCode::BadRequest);
    }
    let body = json!({"leases": [
        {"item_id": 0, "token": token},
        {"item_id": held.item.id, "token": token},
        {"item_id": -1, "token": token},
    ]});
    let (status, text) = send(
        &server,
        Method::POST,
        "/v1/heartbeats",
        Some(ADMIN),
        Some(body.to_string()),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let answer: Value = serde_json::from_str(&text).unwrap();
    let results = answer["results"].as_array().unwrap();
    assert_eq!(results.len(), 3);
    for k in [0, 2] {
        assert_eq!(results[k]["ok"], false, "{text}");
        assert_eq!(results[k]["error"]["code"], "bad_request", "{text}");
    }
    assert_eq!(results[1]["ok"], true, "{text}");
    server.stop().await.unwrap();
}

/// A pool connection the database closed under the server (PostgreSQL: a
/// terminated backend, as a restart or a failover does) is found by the
/// statement that uses it: that request is answered `503` with
/// `Retry-After` (code `internal`: the database was unavailable, not the
/// request at fault; clients retry any 5xx), the connection leaves the pool, and the requests
/// after it are answered. SQLite has no connection to lose: nothing to show.
pub async fn a_connection_closed_under_the_server_is_a_503_and_then_replaced(db: TestDb) {
    if db.kind == crate::common::Kind::Sqlite {
        return;
    }
    let server = http_server(&db).await;
    let store = server.store().clone();
    let item = store.enqueue("q", &json!(1), None).await.unwrap();
    crate::common::until_idle(&store).await;
    let idle = store.pool().num_idle();
    assert!(idle >= 1, "the pool keeps a connection");
    // The backends of the server's pool (and no other test's): each idle
    // connection held at once, so each is asked once.
    let mut held = Vec::new();
    let mut pids = Vec::new();
    for _ in 0..idle {
        let mut conn = store.pool().acquire().await.unwrap();
        let (pid,): (i32,) = sqlx::query_as("SELECT pg_backend_pid()")
            .fetch_one(&mut *conn)
            .await
            .unwrap();
        pids.push(pid);
        held.push(conn);
    }
    drop(held);
    let raw = db.raw_pool().await;
    for pid in pids {
        sqlx::query("SELECT pg_terminate_backend($1)")
            .bind(pid)
            .fetch_all(&raw)
            .await
            .unwrap();
    }
    raw.close().await;
    let mut answers = Vec::new();
    for _ in 0..idle + 2 {
        let (status, text) = send(
            &server,
            Method::GET,
            &format!("/v1/items/{}", item.id),
            Some(ADMIN),
            None,
        )
        .await;
        if status != StatusCode::OK {
            let body: ErrorBody = serde_json::from_str(&text).unwrap();
            // Unavailable, to be retried: not a 500 (the request was fine).
            assert_eq!(
                (status.as_u16(), body.code),
                (503, ErrorCode::Internal),
                "{text}"
            );
        }
        answers.push(status.as_u16());
    }
    // Not necessarily the first request: a connection the pool opened after
    // the count (a background task's) is live and may be handed out first.
    // Each dead connection costs at most one request, and a statement that
    // uses one finds it.
    let failed = answers.iter().filter(|&&a| a == 503).count();
    assert!(
        (1..=idle).contains(&failed),
        "the dead connections are found, each once: {answers:?} ({idle} terminated)"
    );
    assert_eq!(
        answers.last(),
        Some(&200),
        "dead connections leave the pool: {answers:?}"
    );
    server.stop().await.unwrap();
}

/// README's nesting limit is exact: a payload or a result nested 127 deep is
/// accepted, one nested 128 deep is `400 validation` (the body's own object
/// is the 128th level serde_json allows). Before, README said 128 was
/// accepted, and only 200 was tried.
pub async fn a_payload_or_result_nests_at_most_127_deep(db: TestDb) {
    let server = http_server(&db).await;
    let store = server.store().clone();
    let nested = |n: usize| format!("{}1{}", "[".repeat(n), "]".repeat(n));
    for (depth, ok) in [(127, true), (128, false)] {
        let (status, text) = send(
            &server,
            Method::POST,
            "/v1/queues/q/items",
            Some(ADMIN),
            Some(format!(r#"{{"payload": {}}}"#, nested(depth))),
        )
        .await;
        let want = if ok {
            StatusCode::CREATED
        } else {
            StatusCode::BAD_REQUEST
        };
        assert_eq!(status, want, "payload {depth} deep: {text}");
        assert!(ok || text.contains("validation"), "{text}");
    }
    store.enqueue("q2", &json!(1), None).await.unwrap();
    let lease = store.claim("q2", None).await.unwrap().unwrap();
    for (depth, ok) in [(128, false), (127, true)] {
        let body = format!(
            r#"{{"token": {}, "state": "done", "result": {}}}"#,
            serde_json::to_string(&lease.lease.token).unwrap(),
            nested(depth)
        );
        let path = format!("/v1/items/{}/settle", lease.item.id);
        let (status, text) = send(&server, Method::POST, &path, Some(ADMIN), Some(body)).await;
        let want = if ok {
            StatusCode::OK
        } else {
            StatusCode::BAD_REQUEST
        };
        assert_eq!(status, want, "result {depth} deep: {text}");
    }
    server.stop().await.unwrap();
}
