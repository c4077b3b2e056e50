//! The HTTP surface through real sockets: auth, errors, limits, CORS, static
//! files, the lease flow and the background reaper. Servers run on SQLite on
//! 127.0.0.1 with an ephemeral port.

use std::path::PathBuf;
use std::time::Duration;

use agentstore_protocol::lease::{ClaimResponse, ItemView, WorkerCredentials};
use agentstore_protocol::{ErrorBody, ErrorCode};
use agentstore_server::{Config, Server};
use rand::RngCore;
use reqwest::{Client, Method, Response, StatusCode};
use serde_json::{json, Value};

const ADMIN: &str = "http-test-admin";

struct Harness {
    server: Server,
    http: Client,
    dir: PathBuf,
}

impl Harness {
    async fn start(tune: impl FnOnce(&mut Config)) -> Harness {
        let mut b = [0u8; 6];
        rand::rngs::OsRng.fill_bytes(&mut b);
        let dir = std::env::temp_dir().join(format!("agentstore-http-{}", hex::encode(b)));
        std::fs::create_dir_all(dir.join("www")).unwrap();
        std::fs::create_dir_all(dir.join("pkg")).unwrap();
        std::fs::write(dir.join("www/index.html"), "<h1>demo</h1>").unwrap();
        std::fs::write(dir.join("pkg/agentstore_bg.wasm"), b"\0asm\x01\0\0\0").unwrap();
        let mut config = Config::for_tests(&dir.join("db.sqlite").display().to_string(), ADMIN);
        config.www = dir.join("www");
        config.pkg = dir.join("pkg");
        tune(&mut config);
        let server = Server::start(&config).await.unwrap();
        Harness {
            server,
            http: Client::new(),
            dir,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.server.url())
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        bearer: Option<&str>,
        body: Option<Value>,
    ) -> Response {
        let mut req = self.http.request(method, self.url(path));
        if let Some(token) = bearer {
            req = req.bearer_auth(token);
        }
        if let Some(body) = body {
            req = req.json(&body);
        }
        req.send().await.unwrap()
    }

    async fn post(&self, path: &str, bearer: &str, body: Value) -> Response {
        self.call(Method::POST, path, Some(bearer), Some(body))
            .await
    }

    async fn worker(&self) -> WorkerCredentials {
        let t: Value = self
            .post("/v1/admin/enrollment-tokens", ADMIN, json!({}))
            .await
            .json()
            .await
            .unwrap();
        let resp = self
            .call(
                Method::POST,
                "/v1/workers/enroll",
                None,
                Some(json!({"token": t["token"]})),
            )
            .await;
        assert_eq!(resp.status(), StatusCode::CREATED);
        resp.json().await.unwrap()
    }

    async fn enqueue(&self, queue: &str) -> ItemView {
        let resp = self
            .post(
                &format!("/v1/queues/{queue}/items"),
                ADMIN,
                json!({"payload": {"x": 1}}),
            )
            .await;
        assert_eq!(resp.status(), StatusCode::CREATED);
        resp.json().await.unwrap()
    }

    async fn stop(self) {
        self.server.stop().await.unwrap();
        let _ = std::fs::remove_dir_all(self.dir);
    }
}

/// Asserts an error answer: status, JSON `{code, message}` with `code`.
async fn expect_error(resp: Response, code: ErrorCode) -> ErrorBody {
    assert_eq!(resp.status().as_u16(), code.status(), "status for {code}");
    let ct = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    assert!(
        ct.starts_with("application/json"),
        "JSON error body, got {ct:?}"
    );
    if code == ErrorCode::Unauthorized {
        // RFC 9110 §15.5.2: every 401 names its scheme (RFC 6750 §3).
        let challenge = resp.headers().get("www-authenticate");
        assert_eq!(
            challenge.and_then(|v| v.to_str().ok()),
            Some("Bearer realm=\"agentstore\""),
            "the 401's challenge"
        );
    }
    let body: ErrorBody = resp.json().await.unwrap();
    assert_eq!(body.code, code);
    assert!(!body.message.is_empty());
    body
}

#[tokio::test]
async fn requests_without_or_with_a_wrong_token_are_401_and_health_needs_none() {
    let h = Harness::start(|_| {}).await;
    let health: Value = h
        .call(Method::GET, "/v1/health", None, None)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(health, json!({"status": "ok", "database": "sqlite"}));
    let item = h.enqueue("q").await;
    let endpoints = [
        (
            Method::POST,
            "/v1/queues/q/items".to_owned(),
            Some(json!({"payload": 1})),
        ),
        (Method::GET, "/v1/queues/q/items".to_owned(), None),
        (Method::POST, "/v1/queues/q/claims".to_owned(), None),
        (Method::GET, format!("/v1/items/{}", item.id), None),
        (
            Method::POST,
            format!("/v1/items/{}/heartbeat", item.id),
            Some(json!({"token": "x"})),
        ),
        (
            Method::POST,
            format!("/v1/items/{}/settle", item.id),
            Some(json!({"token": "x", "state": "done"})),
        ),
        (Method::POST, format!("/v1/items/{}/resume", item.id), None),
        (
            Method::POST,
            "/v1/heartbeats".to_owned(),
            Some(json!({"leases": []})),
        ),
        (
            Method::POST,
            "/v1/admin/enrollment-tokens".to_owned(),
            Some(json!({})),
        ),
    ];
    let forged = "asa_0123456789abcdef.".to_owned() + &"ab".repeat(32);
    for (method, path, body) in endpoints {
        for bearer in [None, Some("wrong"), Some(forged.as_str()), Some("")] {
            let resp = h.call(method.clone(), &path, bearer, body.clone()).await;
            expect_error(resp, ErrorCode::Unauthorized).await;
        }
    }
    let basic = h
        .http
        .get(h.url("/v1/queues/q/items"))
        .basic_auth("a", Some("b"))
        .send()
        .await
        .unwrap();
    expect_error(basic, ErrorCode::Unauthorized).await;
    // A worker is authenticated but not an admin.
    let w = h.worker().await;
    let resp = h
        .post("/v1/admin/enrollment-tokens", &w.access_token, json!({}))
        .await;
    expect_error(resp, ErrorCode::Forbidden).await;
    let bad_enroll = h
        .call(
            Method::POST,
            "/v1/workers/enroll",
            None,
            Some(json!({"token": "nope"})),
        )
        .await;
    expect_error(bad_enroll, ErrorCode::Unauthorized).await;
    h.stop().await;
}

/// An empty admin token is refused at startup (flag or environment), and an
/// empty bearer never authenticates: before, `--admin-token ""` made
/// `Authorization: Bearer ` (nothing after it) the admin.
#[tokio::test]
async fn an_empty_admin_token_is_refused_and_an_empty_bearer_is_never_the_admin() {
    use clap::Parser;
    for bad in ["", "two words", " "] {
        let parsed = Config::try_parse_from(["agentstore-server", "--admin-token", bad]);
        assert!(parsed.is_err(), "{bad:?} accepted");
    }
    assert!(Config::try_parse_from(["agentstore-server", "--admin-token", "t"]).is_ok());
    // A configuration built in code with an empty token has no admin at all.
    let h = Harness::start(|c| c.admin_token = Some(String::new())).await;
    for bearer in [Some(""), Some(" "), None] {
        let resp = h
            .call(
                Method::POST,
                "/v1/admin/enrollment-tokens",
                bearer,
                Some(json!({})),
            )
            .await;
        expect_error(resp, ErrorCode::Unauthorized).await;
        let resp = h
            .call(Method::GET, "/v1/queues/q/items", bearer, None)
            .await;
        expect_error(resp, ErrorCode::Unauthorized).await;
    }
    h.stop().await;
}

#[tokio::test]
async fn unknown_items_and_endpoints_are_404() {
    let h = Harness::start(|_| {}).await;
    expect_error(
        h.call(Method::GET, "/v1/items/424242", Some(ADMIN), None)
            .await,
        ErrorCode::NotFound,
    )
    .await;
    let hb = h
        .post("/v1/items/424242/heartbeat", ADMIN, json!({"token": "t"}))
        .await;
    expect_error(hb, ErrorCode::NotFound).await;
    let settle = h
        .post(
            "/v1/items/424242/settle",
            ADMIN,
            json!({"token": "t", "state": "done"}),
        )
        .await;
    expect_error(settle, ErrorCode::NotFound).await;
    expect_error(
        h.call(Method::GET, "/v1/nothing/here", Some(ADMIN), None)
            .await,
        ErrorCode::NotFound,
    )
    .await;
    h.stop().await;
}

#[tokio::test]
async fn malformed_json_and_bad_parameters_are_400() {
    let h = Harness::start(|_| {}).await;
    let item = h.enqueue("q").await;
    let raw = |body: &'static str| {
        h.http
            .post(h.url(&format!("/v1/items/{}/heartbeat", item.id)))
            .bearer_auth(ADMIN)
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    expect_error(raw("{not json").await.unwrap(), ErrorCode::BadRequest).await;
    expect_error(raw("").await.unwrap(), ErrorCode::BadRequest).await;
    expect_error(raw(r#"{"token": 5}"#).await.unwrap(), ErrorCode::Validation).await;
    let bad_state = h
        .post(
            &format!("/v1/items/{}/settle", item.id),
            ADMIN,
            json!({"token": "t", "state": "open"}),
        )
        .await;
    expect_error(bad_state, ErrorCode::Validation).await;
    let bad_id = h
        .post("/v1/items/abc/heartbeat", ADMIN, json!({"token": "t"}))
        .await;
    expect_error(bad_id, ErrorCode::BadRequest).await;
    let bad_limit = h
        .call(
            Method::GET,
            "/v1/queues/q/items?limit=abc",
            Some(ADMIN),
            None,
        )
        .await;
    expect_error(bad_limit, ErrorCode::Validation).await;
    let bad_queue = h
        .post("/v1/queues/has%20space/items", ADMIN, json!({"payload": 1}))
        .await;
    expect_error(bad_queue, ErrorCode::Validation).await;
    h.stop().await;
}

#[tokio::test]
async fn an_oversized_body_is_413() {
    let h = Harness::start(|c| c.max_body_bytes = 1024).await;
    let big = json!({"payload": "x".repeat(4096)});
    let resp = h.post("/v1/queues/q/items", ADMIN, big).await;
    expect_error(resp, ErrorCode::PayloadTooLarge).await;
    // Without a Content-Length (chunked), the limit still holds while reading.
    let stream = futures_body("x".repeat(8192));
    let resp = h
        .http
        .post(h.url("/v1/queues/q/items"))
        .bearer_auth(ADMIN)
        .body(stream)
        .send()
        .await
        .unwrap();
    expect_error(resp, ErrorCode::PayloadTooLarge).await;
    let small = h
        .post("/v1/queues/q/items", ADMIN, json!({"payload": "ok"}))
        .await;
    assert_eq!(small.status(), StatusCode::CREATED);
    h.stop().await;
}

fn futures_body(s: String) -> reqwest::Body {
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        s.into_bytes().chunks(512).map(|c| Ok(c.to_vec())).collect();
    reqwest::Body::wrap_stream(futures_util::stream::iter(chunks))
}

#[tokio::test]
async fn claim_polling_past_the_rate_limit_is_429_with_retry_after() {
    let h = Harness::start(|c| c.claim_rate = "3/min".parse().unwrap()).await;
    let (a, b) = (h.worker().await, h.worker().await);
    for _ in 0..3 {
        let resp = h
            .call(
                Method::POST,
                "/v1/queues/q/claims",
                Some(&a.access_token),
                None,
            )
            .await;
        assert_eq!(resp.status(), StatusCode::NO_CONTENT);
        assert!(resp.headers().contains_key("retry-after"));
    }
    let limited = h
        .call(
            Method::POST,
            "/v1/queues/q/claims",
            Some(&a.access_token),
            None,
        )
        .await;
    let retry: u64 = limited.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=20).contains(&retry), "Retry-After {retry}s for 3/min");
    expect_error(limited, ErrorCode::RateLimited).await;
    let other = h
        .call(
            Method::POST,
            "/v1/queues/q/claims",
            Some(&b.access_token),
            None,
        )
        .await;
    assert_eq!(
        other.status(),
        StatusCode::NO_CONTENT,
        "limits are per worker"
    );
    h.stop().await;
}

#[tokio::test]
async fn cors_preflight_allows_listed_origins_only() {
    let h = Harness::start(|c| c.allow_origin = vec!["http://app.example".into()]).await;
    let preflight = |origin: &'static str| {
        h.http
            .request(Method::OPTIONS, h.url("/v1/queues/q/claims"))
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .header(
                "access-control-request-headers",
                "authorization,content-type",
            )
            .send()
    };
    let ok = preflight("http://app.example").await.unwrap();
    assert!(ok.status().is_success());
    assert_eq!(
        ok.headers()["access-control-allow-origin"],
        "http://app.example"
    );
    let methods = ok.headers()["access-control-allow-methods"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(methods.contains("POST"));
    let allowed_headers = ok.headers()["access-control-allow-headers"]
        .to_str()
        .unwrap()
        .to_lowercase();
    assert!(allowed_headers.contains("authorization"));
    let refused = preflight("http://evil.example").await.unwrap();
    assert!(
        !refused
            .headers()
            .contains_key("access-control-allow-origin"),
        "refused origin gets no grant"
    );
    h.stop().await;
}

/// `lease.fetch` and `prepareRequest` add `X-Lease-Token` and
/// `X-Lease-Epoch` to a request for the lease server's own origin
/// (docs/api.md). A page on another origin (what `--allow-origin` is for)
/// sends a preflight naming them, and it must be granted: before, the
/// grant listed only the API's own headers, so the browser refused the
/// fenced request (helper-244: "Request header field x-lease-token is not
/// allowed by Access-Control-Allow-Headers").
#[tokio::test]
async fn cors_preflight_grants_the_fencing_headers_lease_fetch_sends() {
    let h = Harness::start(|c| c.allow_origin = vec!["http://app.example".into()]).await;
    let ok = h
        .http
        .request(Method::OPTIONS, h.url("/v1/health"))
        .header("origin", "http://app.example")
        .header("access-control-request-method", "GET")
        .header(
            "access-control-request-headers",
            "x-lease-epoch,x-lease-token",
        )
        .send()
        .await
        .unwrap();
    assert!(ok.status().is_success());
    let allowed: Vec<String> = ok.headers()["access-control-allow-headers"]
        .to_str()
        .unwrap()
        .split(',')
        .map(|h| h.trim().to_lowercase())
        .collect();
    for name in ["x-lease-token", "x-lease-epoch"] {
        assert!(allowed.iter().any(|a| a == name), "{name} in {allowed:?}");
    }
    h.stop().await;
}

/// CORS preflights are answers too: each is counted in
/// `agentstore_http_responses_total` and timed, under its route (`other`
/// for a path no route matches, so the label set stays bounded). Before,
/// the CORS layer answered them outside the metrics middleware and none
/// was. An `OPTIONS` is still answered by CORS as before, whatever its
/// path (a load balancer's `OPTIONS /` health check keeps its `200`).
#[tokio::test]
async fn cors_preflights_are_counted_and_timed() {
    let h = Harness::start(|c| c.allow_origin = vec!["http://app.example".into()]).await;
    let preflight = |path: &str| {
        h.http
            .request(Method::OPTIONS, h.url(path))
            .header("access-control-request-method", "POST")
            .header("origin", "http://app.example")
            .send()
    };
    for _ in 0..2 {
        let ok = preflight("/v1/queues/q/claims").await.unwrap();
        assert_eq!(ok.status(), StatusCode::OK);
        assert!(ok.headers().contains_key("access-control-allow-origin"));
    }
    let other = preflight("/nonexistent").await.unwrap();
    assert_eq!(
        other.status(),
        StatusCode::OK,
        "answered by CORS, as before"
    );

    let text = h
        .call(Method::GET, "/metrics", Some(ADMIN), None)
        .await
        .text()
        .await
        .unwrap();
    let series = |name: &str, labels: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}{{{labels}}} ")))
            .map(|v| v.to_owned())
    };
    let route = "route=\"/v1/queues/{queue}/claims\"";
    assert_eq!(
        series(
            "agentstore_http_responses_total",
            &format!("code=\"200\",method=\"OPTIONS\",{route}")
        )
        .as_deref(),
        Some("2"),
        "{text}"
    );
    assert_eq!(
        series(
            "agentstore_http_request_duration_seconds_count",
            &format!("method=\"OPTIONS\",{route}")
        )
        .as_deref(),
        Some("2"),
        "the two preflights, timed"
    );
    assert_eq!(
        series(
            "agentstore_http_responses_total",
            "code=\"200\",method=\"OPTIONS\",route=\"other\""
        )
        .as_deref(),
        Some("1"),
        "an unknown path under the bounded label\n{text}"
    );
    h.stop().await;
}

#[tokio::test]
async fn cors_any_port_entry_allows_that_host_on_every_port_only() {
    let h = Harness::start(|c| {
        c.allow_origin = vec!["http://127.0.0.1:*".into(), "http://app.example".into()]
    })
    .await;
    let grant = |origin: &'static str| {
        let req = h
            .http
            .request(Method::OPTIONS, h.url("/v1/heartbeats"))
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .header(
                "access-control-request-headers",
                "authorization,content-type",
            )
            .send();
        async move {
            req.await
                .unwrap()
                .headers()
                .get("access-control-allow-origin")
                .map(|v| v.to_str().unwrap().to_owned())
        }
    };
    for ok in [
        "http://127.0.0.1:41234",
        "http://127.0.0.1:80",
        // Port 80 as a browser sends it: the default port is left out.
        "http://127.0.0.1",
        "http://app.example",
    ] {
        assert_eq!(grant(ok).await.as_deref(), Some(ok), "{ok} is allowed");
    }
    for refused in [
        "http://127.0.0.1:",
        "http://127.0.0.1:80.evil.example",
        "http://127.0.0.10:80",
        "https://127.0.0.1:443",
        "http://localhost:8080",
    ] {
        assert_eq!(grant(refused).await, None, "{refused} is refused");
    }
    h.stop().await;
}

#[tokio::test]
async fn the_lease_flow_works_over_http_and_stale_tokens_get_claim_lost() {
    let h = Harness::start(|_| {}).await;
    let w = h.worker().await;
    let t = w.access_token.as_str();
    let item = h.enqueue("jobs").await;
    let resp = h
        .call(Method::POST, "/v1/queues/jobs/claims", Some(t), None)
        .await;
    assert_eq!(resp.status(), StatusCode::CREATED);
    let c: ClaimResponse = resp.json().await.unwrap();
    assert_eq!(
        (c.item.id, c.item.worker_id, c.lease.epoch),
        (item.id, Some(w.worker_id), 1)
    );
    let hb = h
        .post(
            &format!("/v1/items/{}/heartbeat", item.id),
            t,
            json!({"token": c.lease.token}),
        )
        .await;
    assert_eq!(hb.status(), StatusCode::OK);
    assert_eq!(hb.json::<Value>().await.unwrap(), json!({"ttl_ms": 90000}));
    let batch = h
        .post(
            "/v1/heartbeats",
            t,
            json!({"leases": [
            {"item_id": item.id, "token": c.lease.token},
            {"item_id": item.id, "token": "stale"},
            {"item_id": 999999, "token": "x"}]}),
        )
        .await;
    let batch: Value = batch.json().await.unwrap();
    let codes: Vec<Value> = batch["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["error"]["code"].clone())
        .collect();
    // A worker is not told that item 999999 does not exist: it is answered
    // as a wrong token is (only the admin is told `not_found`).
    assert_eq!(
        codes,
        vec![Value::Null, json!("claim_lost"), json!("claim_lost")]
    );
    assert_eq!(batch["results"][0]["ok"], json!(true));
    let settle_path = format!("/v1/items/{}/settle", item.id);
    let settle = |token: String| {
        h.post(
            &settle_path,
            t,
            json!({"token": token, "state": "done", "result": [1, 2]}),
        )
    };
    let done: ItemView = settle(c.lease.token.clone()).await.json().await.unwrap();
    assert_eq!(done.result, Some(json!([1, 2])));
    // The same settle again (its answer lost) is a replay: the same item;
    // other content with the spent token is already_settled, naming the
    // state the settle set.
    let replay = settle(c.lease.token.clone()).await;
    assert_eq!(replay.status(), StatusCode::OK);
    assert_eq!(replay.json::<ItemView>().await.unwrap(), done);
    let other = h
        .post(
            &settle_path,
            t,
            json!({"token": c.lease.token, "state": "done", "result": [3]}),
        )
        .await;
    let other = expect_error(other, ErrorCode::AlreadySettled).await;
    assert_eq!(
        other.settled,
        Some(agentstore_protocol::lease::SettleState::Done)
    );
    let empty = h
        .call(Method::POST, "/v1/queues/jobs/claims", Some(t), None)
        .await;
    assert_eq!(empty.status(), StatusCode::NO_CONTENT);
    assert_eq!(empty.headers()["retry-after"], "5");
    let listed: Value = h
        .call(
            Method::GET,
            "/v1/queues/jobs/items?state=done",
            Some(ADMIN),
            None,
        )
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(listed["items"][0]["id"], json!(item.id));
    // Refresh rotates. The same token again (the answer lost) is a replay
    // with new credentials; once those have refreshed, the old token is
    // refused.
    let refresh = |token: String| {
        h.call(
            Method::POST,
            "/v1/workers/refresh",
            None,
            Some(json!({"refresh_token": token})),
        )
    };
    let r1 = refresh(w.refresh_token.clone()).await;
    assert_eq!(r1.status(), StatusCode::OK);
    let r2 = refresh(w.refresh_token.clone()).await;
    assert_eq!(r2.status(), StatusCode::OK);
    let r2: WorkerCredentials = r2.json().await.unwrap();
    assert_eq!(refresh(r2.refresh_token).await.status(), StatusCode::OK);
    expect_error(
        refresh(w.refresh_token.clone()).await,
        ErrorCode::Unauthorized,
    )
    .await;
    h.stop().await;
}

#[tokio::test]
async fn release_accepts_a_beacon_body_without_headers_but_not_a_wrong_bearer() {
    let h = Harness::start(|_| {}).await;
    let item = h.enqueue("q").await;
    let c: ClaimResponse = h
        .call(Method::POST, "/v1/queues/q/claims", Some(ADMIN), None)
        .await
        .json()
        .await
        .unwrap();
    let url = h.url(&format!("/v1/items/{}/release", item.id));
    let body = json!({"token": c.lease.token}).to_string();
    let wrong = h
        .http
        .post(&url)
        .bearer_auth("wrong")
        .body(body.clone())
        .send()
        .await
        .unwrap();
    expect_error(wrong, ErrorCode::Unauthorized).await;
    // navigator.sendBeacon(url, string) sends text/plain and no Authorization.
    let beacon = h
        .http
        .post(&url)
        .header("content-type", "text/plain;charset=UTF-8")
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(beacon.status(), StatusCode::OK);
    assert!(beacon.headers().get("idempotent-replayed").is_none());
    let released: ItemView = beacon.json().await.unwrap();
    assert_eq!((released.state.as_str(), released.attempts), ("open", 1));
    // The beacon sent again (its answer lost): a replay, nothing changes.
    let again = h.http.post(&url).body(body).send().await.unwrap();
    assert_eq!(again.status(), StatusCode::OK);
    assert_eq!(
        again
            .headers()
            .get("idempotent-replayed")
            .map(|v| v.as_bytes()),
        Some(&b"true"[..]),
        "marked as a replay"
    );
    // Only that it was released: a released token reads nothing of the item.
    let replayed: Value = again.json().await.unwrap();
    assert_eq!(replayed, json!({"id": item.id, "replayed": true}));
    let other = json!({"token": "0".repeat(48)}).to_string();
    let wrong_token = h.http.post(&url).body(other).send().await.unwrap();
    expect_error(wrong_token, ErrorCode::ClaimLost).await;
    h.stop().await;
}

#[tokio::test]
async fn pause_elsewhere_then_resume_over_http() {
    let h = Harness::start(|_| {}).await;
    let item = h.enqueue("q").await;
    let c: ClaimResponse = h
        .call(Method::POST, "/v1/queues/q/claims", Some(ADMIN), None)
        .await
        .json()
        .await
        .unwrap();
    let paused = h
        .call(
            Method::POST,
            &format!("/v1/items/{}/pause", item.id),
            Some(ADMIN),
            None,
        )
        .await;
    assert_eq!(paused.status(), StatusCode::OK);
    let settle = h
        .post(
            &format!("/v1/items/{}/settle", item.id),
            ADMIN,
            json!({"token": c.lease.token, "state": "done"}),
        )
        .await;
    expect_error(settle, ErrorCode::StateConflict).await;
    let resumed: ClaimResponse = h
        .call(
            Method::POST,
            &format!("/v1/items/{}/resume", item.id),
            Some(ADMIN),
            None,
        )
        .await
        .json()
        .await
        .unwrap();
    assert_ne!(resumed.lease.token, c.lease.token);
    assert_eq!(resumed.lease.epoch, 2);
    let old = h
        .post(
            &format!("/v1/items/{}/heartbeat", item.id),
            ADMIN,
            json!({"token": c.lease.token}),
        )
        .await;
    expect_error(old, ErrorCode::ClaimLost).await;
    h.stop().await;
}

#[tokio::test]
async fn a_resume_sent_again_over_http_is_answered_as_a_replay() {
    let h = Harness::start(|_| {}).await;
    let item = h.enqueue("q").await;
    h.call(Method::POST, "/v1/queues/q/claims", Some(ADMIN), None)
        .await;
    let url = format!("/v1/items/{}/", item.id);
    let paused = h
        .call(Method::POST, &format!("{url}pause"), Some(ADMIN), None)
        .await;
    assert_eq!(paused.status(), StatusCode::OK);
    let first = h
        .call(Method::POST, &format!("{url}resume"), Some(ADMIN), None)
        .await;
    assert_eq!(first.status(), StatusCode::OK);
    assert!(first.headers().get("idempotent-replayed").is_none());
    let first: ClaimResponse = first.json().await.unwrap();
    // The first answer lost: the operator sends it again.
    let again = h
        .call(Method::POST, &format!("{url}resume"), Some(ADMIN), None)
        .await;
    assert_eq!(again.status(), StatusCode::OK, "not 409 conflict");
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    let body: serde_json::Value = again.json().await.unwrap();
    assert_eq!(
        body,
        json!({"id": item.id, "state": "running", "epoch": 2, "replayed": true})
    );
    let hb = h
        .post(
            &format!("{url}heartbeat"),
            ADMIN,
            json!({"token": first.lease.token}),
        )
        .await;
    assert_eq!(hb.status(), StatusCode::OK, "the first lease stays current");
    h.stop().await;
}

#[tokio::test]
async fn the_background_reaper_reopens_an_abandoned_claim() {
    let h = Harness::start(|c| {
        c.ttl_ms = 150;
        c.heartbeat_ms = 50;
        c.reaper_ms = 50;
    })
    .await;
    let item = h.enqueue("q").await;
    let claimed = h
        .call(Method::POST, "/v1/queues/q/claims", Some(ADMIN), None)
        .await;
    assert_eq!(claimed.status(), StatusCode::CREATED);
    let mut state = String::new();
    // Bounded generously (a busy machine delays the reaper's passes); the
    // attempt count tells an expiry from anything else.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now: ItemView = h
            .call(
                Method::GET,
                &format!("/v1/items/{}", item.id),
                Some(ADMIN),
                None,
            )
            .await
            .json()
            .await
            .unwrap();
        state = now.state.as_str().to_owned();
        if state == "open" {
            assert_eq!(now.attempts, 1);
            break;
        }
    }
    assert_eq!(
        state, "open",
        "reaped within 30 s with TTL 150 ms and reaper 50 ms"
    );
    h.stop().await;
}

#[tokio::test]
async fn static_files_are_served_and_wasm_has_its_mime_type() {
    let h = Harness::start(|_| {}).await;
    let index = h.http.get(h.url("/")).send().await.unwrap();
    assert_eq!(index.status(), StatusCode::OK);
    assert_eq!(index.text().await.unwrap(), "<h1>demo</h1>");
    let wasm = h
        .http
        .get(h.url("/pkg/agentstore_bg.wasm"))
        .send()
        .await
        .unwrap();
    assert_eq!(wasm.status(), StatusCode::OK);
    assert_eq!(wasm.headers()["content-type"], "application/wasm");
    h.stop().await;
}

#[tokio::test]
async fn stopping_the_server_is_graceful_and_closes_the_port() {
    let h = Harness::start(|_| {}).await;
    let addr = h.server.addr();
    assert!(h
        .http
        .get(h.url("/v1/health"))
        .send()
        .await
        .unwrap()
        .status()
        .is_success());
    h.stop().await;
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "port closed after stop"
    );
}

/// A connection to `addr` that has sent `bytes` (and then sends nothing).
async fn sent(addr: std::net::SocketAddr, bytes: &[u8]) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(bytes).await.unwrap();
    stream
}

/// Reads from `stream` until the server answers something and closes the
/// connection, or `within` passes; returns what it sent and whether it
/// closed.
async fn answer_then_close(
    stream: &mut (impl tokio::io::AsyncRead + Unpin),
    within: Duration,
) -> (String, bool) {
    use tokio::io::AsyncReadExt;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let closed = tokio::time::timeout(within, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .is_ok();
    (String::from_utf8_lossy(&got).into_owned(), closed)
}

/// A client with no credentials cannot hold a connection open by sending a
/// request slowly ("slowloris"): headers not complete within
/// `--read-timeout-ms` close the connection, a body not complete within it
/// (cut off, or trickled a byte at a time) is answered 400 with the JSON
/// error body and the connection closed, and
/// the server answers others meanwhile. Before, such connections stayed
/// open for good, and a few hundred of them (each a file descriptor) stopped
/// the server accepting (`accept: Too many open files`).
#[tokio::test]
async fn a_request_sent_too_slowly_is_cut_off_after_the_read_timeout() {
    use tokio::io::AsyncWriteExt;
    const READ_TIMEOUT_MS: u64 = 300;
    let h = Harness::start(|c| c.read_timeout_ms = READ_TIMEOUT_MS).await;
    let addr = h.server.addr();
    // Generous bound: a busy machine may be slow to fire the timer, but an
    // uncut connection would hang the whole bound.
    let bound = Duration::from_millis(READ_TIMEOUT_MS * 40);
    // Headers cut off part-way, and a connection that never sends a byte.
    let mut partial = sent(
        addr,
        b"POST /v1/workers/enroll HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-",
    )
    .await;
    let mut silent = tokio::net::TcpStream::connect(addr).await.unwrap();
    // A body shorter than its Content-Length, and a chunked body never ended,
    // each to a route that needs no credentials.
    let mut short = sent(addr, b"POST /v1/workers/enroll HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"tok").await;
    let mut chunked = sent(addr, b"POST /v1/items/1/release HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"tok\r\n").await;
    // A body trickled a byte at a time, each well within the timeout: the
    // deadline is for the whole body, not for the gap between two reads.
    let trickled = sent(addr, b"POST /v1/workers/enroll HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n").await;
    let (mut trickle_read, mut trickle_write) = trickled.into_split();
    let trickler = tokio::spawn(async move {
        while trickle_write.write_all(b" ").await.is_ok() {
            tokio::time::sleep(Duration::from_millis(READ_TIMEOUT_MS / 4)).await;
        }
    });
    // Meanwhile the server answers.
    let health = h.http.get(h.url("/v1/health")).send().await.unwrap();
    assert_eq!(health.status(), StatusCode::OK);
    for (what, stream) in [("partial headers", &mut partial), ("no bytes", &mut silent)] {
        let (text, closed) = answer_then_close(stream, bound).await;
        assert!(closed, "{what}: the connection is closed");
        assert!(!text.contains("200 OK"), "{what}: {text}");
    }
    for (what, stream) in [("short body", &mut short), ("unended chunks", &mut chunked)] {
        let (text, closed) = answer_then_close(stream, bound).await;
        assert!(closed, "{what}: the connection is closed");
        assert!(text.starts_with("HTTP/1.1 400"), "{what}: {text}");
        assert!(
            text.contains("\"code\":\"bad_request\"") && text.contains("read-timeout-ms"),
            "{what}: {text}"
        );
    }
    let (trickled_answer, closed) = answer_then_close(&mut trickle_read, bound).await;
    assert!(closed, "a trickled body is cut off, not read for ever");
    assert!(
        trickled_answer.starts_with("HTTP/1.1 400") && trickled_answer.contains("read-timeout-ms"),
        "{trickled_answer}"
    );
    trickler.abort();
    // A keep-alive connection between requests: served, then closed once
    // idle for the timeout (a browser opens a new one for its next request).
    let mut idle = sent(addr, b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").await;
    let (text, closed) = answer_then_close(&mut idle, bound).await;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(closed, "an idle keep-alive connection is closed");
    h.server.stop().await.unwrap();
}

/// A request refused before its body was read has that body read and
/// discarded before the answer (see `agentstore_server::drain`), so its
/// connection stays open for the next request: a `401` to a 50 kB body,
/// then a health check, both answered on one connection, which only the
/// idle timeout closes. A request with `Expect: 100-continue` is refused
/// without a `100 Continue`: its client never has to send the body (the
/// drain must not ask for it), and the connection is closed.
#[tokio::test]
async fn a_refusal_keeps_the_connection_and_asks_for_no_expected_body() {
    const READ_TIMEOUT_MS: u64 = 500;
    let h = Harness::start(|c| c.read_timeout_ms = READ_TIMEOUT_MS).await;
    let addr = h.server.addr();
    let bound = Duration::from_millis(READ_TIMEOUT_MS * 40);
    let body = "{\"payload\": \"".to_owned() + &"x".repeat(50_000) + "\"}";
    let mut two = format!(
        "POST /v1/queues/jobs/items HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes();
    two.extend_from_slice(b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
    let mut stream = sent(addr, &two).await;
    let (text, closed) = answer_then_close(&mut stream, bound).await;
    assert!(closed, "closed once idle");
    assert!(text.starts_with("HTTP/1.1 401"), "{text}");
    assert!(text.contains("\"code\":\"unauthorized\""), "{text}");
    assert!(
        !text.to_ascii_lowercase().contains("connection: close"),
        "the refusal keeps the connection: {text}"
    );
    assert!(
        text.contains("HTTP/1.1 200") && text.contains("\"status\":\"ok\""),
        "the next request is answered on the same connection: {text}"
    );
    let mut expecting = sent(
        addr,
        b"POST /v1/queues/jobs/items HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: 50000\r\n\r\n",
    )
    .await;
    let (text, closed) = answer_then_close(&mut expecting, bound).await;
    assert!(closed, "the connection is closed: its body was never sent");
    assert!(
        text.starts_with("HTTP/1.1 401"),
        "no 100 Continue first: {text}"
    );
    h.stop().await;
}

/// A client that stops reading a response larger than the socket buffers
/// (a big static file) is cut off once a write has made no progress for
/// `--read-timeout-ms` (nginx's `send_timeout`), so a stop drains at once.
/// Before, the connection and its file descriptor were held for as long as
/// the client liked (250 such clients exhausted a 256-descriptor limit),
/// and a stop waited out its whole drain deadline (read timeout + 30 s).
#[tokio::test]
async fn a_client_that_stops_reading_a_response_is_cut_off_after_the_read_timeout() {
    use tokio::io::AsyncReadExt;
    const READ_TIMEOUT_MS: u64 = 300;
    let h = Harness::start(|c| c.read_timeout_ms = READ_TIMEOUT_MS).await;
    std::fs::write(h.dir.join("www/big.bin"), vec![7u8; 32 << 20]).unwrap();
    let mut reader = sent(
        h.server.addr(),
        b"GET /big.bin HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
    )
    .await;
    // The response has started (and then the client reads no more).
    let mut first = [0u8; 16];
    reader.read_exact(&mut first).await.unwrap();
    assert!(first.starts_with(b"HTTP/1.1 200"));
    // Far under the drain deadline (read timeout + 30 s), which a stop
    // waiting on the stalled response would take.
    let bound = Duration::from_millis(READ_TIMEOUT_MS * 40);
    let started = std::time::Instant::now();
    tokio::time::timeout(bound, h.server.stop())
        .await
        .expect("the stalled response is cut off: the stop drains")
        .unwrap();
    assert!(started.elapsed() < bound);
    drop(reader);
}

/// `GET path` on `h` with `Host: host`.
async fn with_host(h: &Harness, url: &str, host: &str) -> Response {
    h.http
        .get(url)
        .header(reqwest::header::HOST, host)
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_loopback_server_refuses_a_host_that_is_not_loopback_or_allowed() {
    let h = Harness::start(|c| c.metrics_listen = Some("127.0.0.1:0".parse().unwrap())).await;
    let port = h.server.addr().port();
    let metrics = format!("http://{}/metrics", h.server.metrics_addr().unwrap());
    // A DNS-rebinding page names its own host: nothing is served to it, not
    // the API, not a static file, not the token-less metrics.
    for url in [h.url("/v1/health"), h.url("/index.html"), metrics.clone()] {
        let refused = with_host(&h, &url, &format!("evil.example:{port}")).await;
        assert_eq!(refused.status(), StatusCode::FORBIDDEN, "{url}");
        let body: ErrorBody = refused.json().await.unwrap();
        assert_eq!(body.code, ErrorCode::Forbidden);
        assert!(
            body.message.contains("--allowed-host evil.example"),
            "{}",
            body.message
        );
    }
    for host in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        format!("[::1]:{port}"),
        "127.0.0.1".to_owned(),
    ] {
        let ok = with_host(&h, &h.url("/v1/health"), &host).await;
        assert_eq!(ok.status(), StatusCode::OK, "{host}");
    }
    assert_eq!(
        with_host(&h, &metrics, "localhost").await.status(),
        StatusCode::OK
    );
    h.stop().await;

    // Hosts named by --allowed-host pass (and replace `localhost`);
    // loopback addresses always do.
    let h = Harness::start(|c| c.allowed_host = vec!["demo.example".into()]).await;
    let url = h.url("/v1/health");
    assert_eq!(
        with_host(&h, &url, "Demo.Example:80").await.status(),
        StatusCode::OK
    );
    assert_eq!(
        with_host(&h, &url, "127.0.0.1").await.status(),
        StatusCode::OK
    );
    assert_eq!(
        with_host(&h, &url, "localhost").await.status(),
        StatusCode::FORBIDDEN
    );
    h.stop().await;
    let h = Harness::start(|c| c.allowed_host = vec!["*".into()]).await;
    assert_eq!(
        with_host(&h, &h.url("/v1/health"), "evil.example")
            .await
            .status(),
        StatusCode::OK
    );
    h.stop().await;
}

/// A request whose declared `Content-Length` is over `--max-body-bytes` is
/// answered `413 payload_too_large` at once, from its headers: with
/// `Expect: 100-continue` no `100 Continue` invites a body that would be
/// refused (RFC 9110 §10.1.1), and without it the server does not wait for
/// the body, to answer `400` at the read deadline. Before, the first got
/// `100 Continue` and the second `400` after `--read-timeout-ms`.
#[tokio::test]
async fn a_declared_content_length_over_the_limit_is_413_at_once() {
    let h = Harness::start(|c| {
        c.max_body_bytes = 1024;
        c.read_timeout_ms = 60_000;
    })
    .await;
    let addr = h.server.addr();
    let head = format!(
        "POST /v1/queues/q/items HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {ADMIN}\r\nContent-Length: 1000000\r\n"
    );
    let mut expecting = sent(
        addr,
        format!("{head}Expect: 100-continue\r\n\r\n").as_bytes(),
    )
    .await;
    let first = first_answer(&mut expecting).await;
    let mut short = sent(addr, format!("{head}\r\n{{\"payload\":1}}").as_bytes()).await;
    let second = first_answer(&mut short).await;
    for (what, text) in [("Expect: 100-continue", &first), ("a short body", &second)] {
        assert!(
            text.starts_with("HTTP/1.1 413") && text.contains("payload_too_large"),
            "{what}: {text:?}"
        );
    }
    // Closed by the client: the lingering close ends (else at the deadline).
    drop((expecting, short));
    h.stop().await;
}

/// Reads the server's first answer on `stream`: a `100 Continue`, or an
/// answer whose JSON body has arrived; bounded at 20 s, well below the read
/// deadline of [`a_declared_content_length_over_the_limit_is_413_at_once`]
/// (an answer only at that deadline is none here).
async fn first_answer(stream: &mut tokio::net::TcpStream) -> String {
    use tokio::io::AsyncReadExt;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let _ = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let text = String::from_utf8_lossy(&got);
            if text.contains("\r\n\r\n")
                && (text.starts_with("HTTP/1.1 100") || text.trim_end().ends_with('}'))
            {
                return;
            }
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    String::from_utf8_lossy(&got).into_owned()
}

/// One client address holds at most `--max-connections-per-ip` connections
/// at once (helper-234): past it a new connection is closed unanswered, and
/// once one of the held ones closes a new one is served. Before, there was no
/// cap: one client holding ~1,000 idle connections (re-opened as the read
/// timeout closed them) used up the file descriptors and every other client
/// was refused.
#[tokio::test]
async fn connections_past_the_per_address_cap_are_closed_and_a_freed_place_is_reused() {
    const CAP: usize = 4;
    let h = Harness::start(|c| c.max_connections_per_ip = CAP).await;
    let addr = h.server.addr();
    let health = b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    let bound = Duration::from_secs(20);
    // CAP connections, each answered (so each is surely counted), kept open.
    let mut held = Vec::new();
    for _ in 0..CAP {
        let mut s = sent(addr, health).await;
        let got = first_answer(&mut s).await;
        assert!(
            got.starts_with("HTTP/1.1 200"),
            "a connection under the cap is served: {got:?}"
        );
        held.push(s);
    }
    let mut over = tokio::net::TcpStream::connect(addr).await.unwrap();
    {
        use tokio::io::AsyncWriteExt;
        let _ = over.write_all(health).await;
    }
    let (got, closed) = answer_then_close(&mut over, bound).await;
    assert!(
        got.is_empty() && closed,
        "the connection past the cap is closed unanswered: {got:?}"
    );
    // One held connection closes; its place is freed once the server sees
    // the close, so a new connection is served within the bound.
    drop(held.pop());
    let served = tokio::time::timeout(bound, async {
        loop {
            let mut s = sent(addr, health).await;
            if first_answer(&mut s).await.starts_with("HTTP/1.1 200") {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(served.is_ok(), "a freed place serves a new connection");
    drop(held);
    h.stop().await;
}

/// A static path no file can have is `404`, not a `500` logged at ERROR
/// (tower-http's `ServeDir` answered a segment over `NAME_MAX` with the
/// error `File name too long`, so any client raised the 5xx rate an
/// operator alerts on), and a path starting with `//` is never redirected
/// to `//segment/`, a URL of another host (an open redirect); a directory
/// under `/pkg` redirects within `/pkg` (helper-234).
#[tokio::test]
async fn static_paths_no_file_can_have_are_404_and_redirects_stay_on_the_server() {
    let h = Harness::start(|_| {}).await;
    std::fs::create_dir_all(h.dir.join("www/evil.example")).unwrap();
    std::fs::write(h.dir.join("www/evil.example/index.html"), "x").unwrap();
    std::fs::create_dir_all(h.dir.join("pkg/io")).unwrap();
    std::fs::write(h.dir.join("pkg/io/index.html"), "io").unwrap();
    let no_redirects = Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let long = "a".repeat(300);
    for path in [
        format!("/{long}"),
        format!("/pkg/{long}"),
        format!("/x/{long}/y"),
        "/%61".repeat(300),
    ] {
        let resp = no_redirects.get(h.url(&path)).send().await.unwrap();
        assert_eq!(
            resp.status(),
            StatusCode::NOT_FOUND,
            "a segment over 255 bytes"
        );
    }
    // A name of 200 bytes (100 `é`), 600 characters percent-encoded, is a
    // file name like any other (helper-237: the limit was applied to the
    // encoded path).
    std::fs::write(h.dir.join("www").join("é".repeat(100)), "accented").unwrap();
    let encoded = "%C3%A9".repeat(100);
    let resp = no_redirects
        .get(h.url(&format!("/{encoded}")))
        .send()
        .await
        .unwrap();
    assert_eq!(
        resp.status(),
        StatusCode::OK,
        "an encoded name under 255 bytes"
    );
    // Sent as is (a client library would fold `//` away).
    let mut s = sent(
        h.server.addr(),
        b"GET //evil.example HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
    )
    .await;
    let (got, _) = answer_then_close(&mut s, Duration::from_secs(20)).await;
    assert!(
        got.starts_with("HTTP/1.1 404"),
        "`//host` is not redirected to another host: {got:?}"
    );
    // The same under /pkg, whose service sees the path without `/pkg`
    // (helper-237: `/pkg///evil.example` redirected to `//evil.example/`).
    std::fs::create_dir_all(h.dir.join("pkg/evil.example")).unwrap();
    let mut s = sent(
        h.server.addr(),
        b"GET /pkg///evil.example HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
    )
    .await;
    let (got, _) = answer_then_close(&mut s, Duration::from_secs(20)).await;
    let location = got.lines().find_map(|l| {
        l.to_ascii_lowercase()
            .strip_prefix("location: ")
            .map(str::to_owned)
    });
    assert!(
        got.starts_with("HTTP/1.1 404")
            || location.as_deref().is_some_and(|l| l.starts_with("/pkg/")),
        "a /pkg redirect stays on the server: {got:?}"
    );
    let resp = no_redirects.get(h.url("/pkg/io")).send().await.unwrap();
    assert!(resp.status().is_redirection(), "a directory redirects");
    assert_eq!(
        resp.headers().get("location").and_then(|v| v.to_str().ok()),
        Some("/pkg/io/"),
        "within /pkg"
    );
    h.stop().await;
}
