//! `GET /metrics` after a scripted workload: every counter equals what the
//! workload did, counted from the answers it got; a second server in the same
//! process (on the same database) counts nothing of it.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::time::{Duration, Instant};

use agentstore_protocol::lease::{
    ClaimResponse, ItemState, QueueStats, SettleState, WorkerCredentials, MAX_QUEUE_SERIES,
};
use agentstore_server::store::Ended;
use agentstore_server::Server;
use reqwest::{Client, StatusCode};
use serde_json::{json, Value};

use crate::common::{at_once, enqueue_over_http, enroll, Kind, TestDb, ADMIN};

/// One parsed sample: metric name, labels, value.
type Sample = (String, BTreeMap<String, String>, f64);

/// Parses the text exposition format (enough of it for our own output).
fn parse(text: &str) -> Vec<Sample> {
    let mut out = Vec::new();
    for line in text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let (series, value) = line.rsplit_once(' ').expect("sample line");
        let value: f64 = value.parse().expect("sample value");
        let (name, labels) = match series.split_once('{') {
            None => (series.to_owned(), BTreeMap::new()),
            Some((name, rest)) => {
                let body = rest.strip_suffix('}').expect("closing brace");
                let labels = body
                    .split("\",")
                    .filter(|kv| !kv.is_empty())
                    .map(|kv| {
                        let (k, v) = kv.split_once("=\"").expect("label");
                        (k.to_owned(), v.trim_end_matches('"').to_owned())
                    })
                    .collect();
                (name.to_owned(), labels)
            }
        };
        out.push((name, labels, value));
    }
    out
}

/// The value of `name` with exactly `labels`; 0 when the series is absent
/// (a labelled counter appears at its first increment).
fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    let want: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let found: Vec<f64> = samples
        .iter()
        .filter(|(n, l, _)| n == name && *l == want)
        .map(|(_, _, v)| *v)
        .collect();
    assert!(found.len() <= 1, "{name}{labels:?} appears twice");
    found.first().copied().unwrap_or(0.0)
}

/// The sum of `name` over the series whose labels include `labels`.
fn sum(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|(n, l, _)| {
            n == name
                && labels
                    .iter()
                    .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|(_, _, v)| *v)
        .sum()
}

/// What the workload saw, counted from the answers.
#[derive(Debug, Default)]
struct Tally {
    claim_requests: u64,
    claimed: u64,
    empty: u64,
    rate_limited: u64,
}

struct Api {
    http: Client,
    base: String,
}

impl Api {
    async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        bearer: Option<&str>,
        body: Option<Value>,
    ) -> reqwest::Response {
        let mut req = self.http.request(method, format!("{}{path}", self.base));
        if let Some(t) = bearer {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        req.send().await.unwrap()
    }

    async fn post(&self, path: &str, bearer: &str, body: Value) -> reqwest::Response {
        self.send(reqwest::Method::POST, path, Some(bearer), Some(body))
            .await
    }

    async fn ok(&self, path: &str, bearer: &str, body: Value) -> Value {
        let resp = self.post(path, bearer, body).await;
        assert!(resp.status().is_success(), "{path}: {}", resp.status());
        resp.json().await.unwrap()
    }

    async fn worker(&self) -> WorkerCredentials {
        enroll(&self.http, &self.base).await
    }

    async fn enqueue(&self, max_redeliveries: Option<u32>) -> i64 {
        let mut body = json!({"payload": {"job": true}});
        if let Some(m) = max_redeliveries {
            body["max_redeliveries"] = json!(m);
        }
        self.ok("/v1/queues/mq/items", ADMIN, body).await["id"]
            .as_i64()
            .unwrap()
    }

    /// One claim; counts its answer in `tally`.
    async fn claim(&self, queue: &str, bearer: &str, tally: &mut Tally) -> Option<ClaimResponse> {
        let resp = self
            .post(&format!("/v1/queues/{queue}/claims"), bearer, json!({}))
            .await;
        tally.claim_requests += 1;
        match resp.status().as_u16() {
            201 => {
                tally.claimed += 1;
                Some(resp.json().await.unwrap())
            }
            204 => {
                tally.empty += 1;
                None
            }
            429 => {
                tally.rate_limited += 1;
                None
            }
            other => panic!("claim answered {other}"),
        }
    }

    async fn status(&self, path: &str, bearer: &str, body: Value) -> (u16, Value) {
        let resp = self.post(path, bearer, body).await;
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    async fn scrape(&self) -> Vec<Sample> {
        let resp = self
            .send(reqwest::Method::GET, "/metrics", Some(ADMIN), None)
            .await;
        assert_eq!(resp.status(), StatusCode::OK);
        let ct = resp.headers()["content-type"].to_str().unwrap().to_owned();
        assert!(ct.starts_with("text/plain; version=0.0.4"), "{ct}");
        parse(&resp.text().await.unwrap())
    }
}

/// Waits (bounded) until the item is in `state`.
async fn until_state(store: &agentstore_server::Store, id: i64, state: ItemState) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if store.item(id).await.unwrap().map(|i| i.state) == Some(state) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "item {id} never became {state:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub async fn a_scrape_counts_exactly_what_a_scripted_workload_did(db: TestDb) {
    let mut config = db.config();
    config.claim_rate = "20/s".parse().unwrap();
    config.ttl_ms = 60_000;
    config.reaper_ms = 50;
    let server = Server::start(&config).await.unwrap();
    // Same process, same database: its registry must stay untouched. Its reaper
    // waits an hour, so every takeover is the first server's.
    config.reaper_ms = 3_600_000;
    let other = Server::start(&config).await.unwrap();
    let api = Api {
        http: Client::new(),
        base: server.url(),
    };
    let store = server.store();
    let mut t = Tally::default();
    let w = api.worker().await;
    let tok = w.access_token.as_str();

    // Refused callers: 3 × 401, 2 × 403.
    let get = reqwest::Method::GET;
    for bearer in [None, Some("not-a-token")] {
        let resp = api
            .send(get.clone(), "/v1/queues/mq/items", bearer, None)
            .await;
        assert_eq!(resp.status(), 401);
    }
    assert_eq!(
        api.send(get.clone(), "/metrics", None, None).await.status(),
        401
    );
    let (s, _) = api
        .status("/v1/admin/enrollment-tokens", tok, json!({}))
        .await;
    assert_eq!(s, 403);
    assert_eq!(
        api.send(get.clone(), "/metrics", Some(tok), None)
            .await
            .status(),
        403
    );

    let a = api.enqueue(None).await;
    let b = api.enqueue(None).await;
    let c = api.enqueue(None).await;
    let d = api.enqueue(Some(0)).await; // delivered once
    let e = api.enqueue(None).await;
    let f = api.enqueue(Some(0)).await; // delivered once

    // A: two heartbeats, settled done. B: settled failed.
    let ca = api.claim("mq", tok, &mut t).await.expect("A");
    assert_eq!(ca.item.id, a);
    for _ in 0..2 {
        let (s, _) = api
            .status(
                &format!("/v1/items/{a}/heartbeat"),
                tok,
                json!({"token": ca.lease.token}),
            )
            .await;
        assert_eq!(s, 200);
    }
    let (s, _) = api
        .status(
            &format!("/v1/items/{a}/settle"),
            tok,
            json!({"token": ca.lease.token, "state": "done"}),
        )
        .await;
    assert_eq!(s, 200);
    let cb = api.claim("mq", tok, &mut t).await.expect("B");
    assert_eq!(cb.item.id, b);
    let (s, _) = api
        .status(
            &format!("/v1/items/{b}/settle"),
            tok,
            json!({"token": cb.lease.token, "state": "failed", "error": "boom"}),
        )
        .await;
    assert_eq!(s, 200);

    // C paused by the admin: its holder's heartbeat and settle are state_conflict.
    let cc = api.claim("mq", tok, &mut t).await.expect("C");
    assert_eq!(cc.item.id, c);
    api.ok(&format!("/v1/items/{c}/pause"), ADMIN, json!({}))
        .await;
    let (s, body) = api
        .status(
            &format!("/v1/items/{c}/heartbeat"),
            tok,
            json!({"token": cc.lease.token}),
        )
        .await;
    assert_eq!((s, body["code"].as_str()), (409, Some("state_conflict")));
    let (s, body) = api
        .status(
            &format!("/v1/items/{c}/settle"),
            tok,
            json!({"token": cc.lease.token, "state": "done"}),
        )
        .await;
    assert_eq!((s, body["code"].as_str()), (409, Some("state_conflict")));
    // A's old token: claim_lost, alone and in a batch beside C's.
    let (s, body) = api
        .status(
            &format!("/v1/items/{a}/heartbeat"),
            tok,
            json!({"token": ca.lease.token}),
        )
        .await;
    assert_eq!((s, body["code"].as_str()), (409, Some("claim_lost")));
    let (s, body) = api
        .status(
            "/v1/heartbeats",
            tok,
            json!({"leases": [{"item_id": a, "token": ca.lease.token}, {"item_id": c, "token": cc.lease.token}]}),
        )
        .await;
    assert_eq!(s, 200);
    let codes: Vec<_> = body["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["error"]["code"].clone())
        .collect();
    assert_eq!(codes, vec![json!("claim_lost"), json!("state_conflict")]);

    // D (cap 1) and E expire: the reaper fails D at the cap and reopens E.
    let cd = api.claim("mq", tok, &mut t).await.expect("D");
    let ce = api.claim("mq", tok, &mut t).await.expect("E");
    assert_eq!((cd.item.id, ce.item.id), (d, e));
    sqlx::query("UPDATE items SET heartbeat_at = NULL WHERE id = $1 OR id = $2")
        .bind(d)
        .bind(e)
        .execute(store.pool())
        .await
        .unwrap();
    until_state(store, d, ItemState::Failed).await;
    until_state(store, e, ItemState::Open).await;
    // E again, settled done; F (cap 1) released: failed at the cap by the release.
    let ce2 = api.claim("mq", tok, &mut t).await.expect("E again");
    assert_eq!((ce2.item.id, ce2.item.epoch), (e, 2));
    let (s, _) = api
        .status(
            &format!("/v1/items/{e}/settle"),
            tok,
            json!({"token": ce2.lease.token, "state": "done"}),
        )
        .await;
    assert_eq!(s, 200);
    let cf = api.claim("mq", tok, &mut t).await.expect("F");
    assert_eq!(cf.item.id, f);
    let (s, body) = api
        .status(
            &format!("/v1/items/{f}/release"),
            tok,
            json!({"token": cf.lease.token}),
        )
        .await;
    assert_eq!(
        (s, body["state"].as_str(), body["last_error"].as_str()),
        (200, Some("failed"), Some("retry_limit"))
    );
    // The same release again (its answer lost): a replay, counted once.
    let (s, again) = api
        .status(
            &format!("/v1/items/{f}/release"),
            tok,
            json!({"token": cf.lease.token}),
        )
        .await;
    assert_eq!((s, again["replayed"].as_bool()), (200, Some(true)));
    // G stays running (one lease held), H stays open.
    let g = api.enqueue(None).await;
    api.enqueue(None).await;
    let cg = api.claim("mq", tok, &mut t).await.expect("G");
    assert_eq!(cg.item.id, g);

    // Empty claims, then a second worker polls until it is rate limited.
    for _ in 0..2 {
        assert!(api.claim("empty", tok, &mut t).await.is_none());
    }
    let w2 = api.worker().await;
    for _ in 0..500 {
        api.claim("empty", &w2.access_token, &mut t).await;
        if t.rate_limited > 0 {
            break;
        }
    }
    assert_eq!(t.rate_limited, 1, "the second worker was rate limited once");
    // The second worker sends G's current token: the lease fence's 403,
    // alone and in a batch; not a credential or role refusal.
    let (s, body) = api
        .status(
            &format!("/v1/items/{g}/heartbeat"),
            &w2.access_token,
            json!({"token": cg.lease.token}),
        )
        .await;
    assert_eq!((s, body["code"].as_str()), (403, Some("forbidden")));
    let (s, body) = api
        .status(
            "/v1/heartbeats",
            &w2.access_token,
            json!({"leases": [{"item_id": g, "token": cg.lease.token}]}),
        )
        .await;
    assert_eq!(
        (s, body["results"][0]["error"]["code"].as_str()),
        (200, Some("forbidden"))
    );
    assert_eq!(t.claimed, 8);
    // An operator pauses a lease of another queue and resumes it (the resumed
    // lease is the operator's: held, so two leases are held in all); a
    // resume sent again is answered as a replay and not counted.
    let r = api
        .ok("/v1/queues/mr/items", ADMIN, json!({"payload": 1}))
        .await["id"]
        .as_i64()
        .unwrap();
    assert_eq!(api.claim("mr", tok, &mut t).await.expect("R").item.id, r);
    api.ok(&format!("/v1/items/{r}/pause"), ADMIN, json!({}))
        .await;
    api.ok(&format!("/v1/items/{r}/resume"), ADMIN, json!({}))
        .await;
    let (s, body) = api
        .status(&format!("/v1/items/{r}/resume"), ADMIN, json!({}))
        .await;
    assert_eq!((s, body["replayed"].as_bool()), (200, Some(true)));

    // The other server saw none of it.
    let quiet = Api {
        http: api.http.clone(),
        base: other.url(),
    }
    .scrape()
    .await;
    for name in [
        "agentstore_claims_total",
        "agentstore_claims_empty_total",
        "agentstore_heartbeats_total",
        "agentstore_claim_lost_total",
        "agentstore_state_conflict_total",
        "agentstore_reaper_reopened_total",
        "agentstore_rate_limited_total",
        "agentstore_releases_total",
    ] {
        assert_eq!(sum(&quiet, name, &[]), 0.0, "{name} on the other server");
    }
    assert_eq!(sum(&quiet, "agentstore_settles_total", &[]), 0.0);
    assert_eq!(sum(&quiet, "agentstore_items_enqueued_total", &[]), 0.0);
    assert_eq!(
        value(
            &quiet,
            "agentstore_auth_rejected_total",
            &[("status", "401")]
        ),
        0.0
    );

    let m = api.scrape().await;
    let n = |name: &str, labels: &[(&str, &str)]| value(&m, name, labels);
    // By queue: every claim that took an item was in `mq` but R's (`mr`);
    // every empty one in `empty`, a queue that never had an item, so they
    // are counted under `(other)` (an empty poll takes no series).
    let mq = [("queue", "mq")];
    assert_eq!(sum(&m, "agentstore_claims_total", &[]), t.claimed as f64);
    assert_eq!(n("agentstore_claims_total", &[("queue", "mr")]), 1.0);
    assert_eq!(n("agentstore_claims_total", &mq), t.claimed as f64 - 1.0);
    assert_eq!(
        n("agentstore_claims_empty_total", &[("queue", "(other)")]),
        t.empty as f64
    );
    assert_eq!(
        sum(&m, "agentstore_claims_empty_total", &[]),
        t.empty as f64
    );
    assert_eq!(n("agentstore_heartbeats_total", &[]), 2.0);
    let settles = |state: &str| n("agentstore_settles_total", &[mq[0], ("state", state)]);
    assert_eq!(settles("done"), 2.0);
    assert_eq!(settles("failed"), 1.0);
    assert_eq!(settles("paused"), 0.0);
    assert_eq!(sum(&m, "agentstore_settles_total", &[]), 3.0);
    assert_eq!(n("agentstore_claim_lost_total", &[]), 2.0);
    assert_eq!(n("agentstore_state_conflict_total", &[]), 3.0);
    assert_eq!(n("agentstore_reaper_reopened_total", &[]), 1.0);
    assert_eq!(
        n("agentstore_retry_limit_failures_total", &[("by", "reaper")]),
        1.0
    );
    assert_eq!(
        n(
            "agentstore_retry_limit_failures_total",
            &[("by", "release")]
        ),
        1.0
    );
    assert_eq!(
        n("agentstore_rate_limited_total", &[]),
        t.rate_limited as f64
    );
    // F's release (its replay not again); C and R paused, R resumed.
    assert_eq!(n("agentstore_releases_total", &mq), 1.0);
    assert_eq!(sum(&m, "agentstore_releases_total", &[]), 1.0);
    assert_eq!(
        n("agentstore_operator_actions_total", &[("action", "pause")]),
        2.0
    );
    assert_eq!(
        n("agentstore_operator_actions_total", &[("action", "resume")]),
        1.0
    );
    assert_eq!(
        n("agentstore_auth_rejected_total", &[("status", "401")]),
        3.0
    );
    assert_eq!(
        n("agentstore_auth_rejected_total", &[("status", "403")]),
        2.0,
        "the lease fence's 403s are not credential refusals"
    );
    assert_eq!(n("agentstore_lease_forbidden_total", &[]), 2.0);
    let claims_route = [("method", "POST"), ("route", "/v1/queues/{queue}/claims")];
    assert_eq!(
        n(
            "agentstore_http_request_duration_seconds_count",
            &claims_route
        ),
        t.claim_requests as f64
    );
    assert!(n("agentstore_reaper_pass_duration_seconds_count", &[]) >= 1.0);
    // Every claim answer by its status code.
    for (code, seen) in [
        ("201", t.claimed),
        ("204", t.empty),
        ("429", t.rate_limited),
    ] {
        let labels = [claims_route[0], claims_route[1], ("code", code)];
        assert_eq!(
            n("agentstore_http_responses_total", &labels),
            seen as f64,
            "claims answered {code}"
        );
    }
    assert_eq!(
        sum(&m, "agentstore_http_responses_total", &[("code", "401")]),
        3.0
    );
    assert_eq!(
        sum(&m, "agentstore_http_responses_total", &[("code", "403")]),
        3.0,
        "2 credential or role refusals, 1 of the lease fence (the other in a batch answered 200)"
    );

    // Gauges, read from the database at scrape time: the same numbers as the
    // JSON view.
    let stats: QueueStats = api
        .send(get.clone(), "/v1/queues/mq/stats", Some(ADMIN), None)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        (
            stats.open,
            stats.running,
            stats.paused,
            stats.blocked,
            stats.done,
            stats.failed
        ),
        (1, 1, 1, 0, 2, 3)
    );
    for state in ItemState::ALL {
        assert_eq!(
            n(
                "agentstore_queue_items",
                &[("queue", "mq"), ("state", state.as_str())]
            ),
            stats.count(state) as f64,
            "{state:?}"
        );
    }
    // Every item of the queue was enqueued through this server (none deleted).
    let items: u64 = ItemState::ALL.iter().map(|s| stats.count(*s)).sum();
    assert_eq!(
        n("agentstore_items_enqueued_total", &[("queue", "mq")]),
        items as f64
    );
    // G, and R under the operator's resumed lease.
    assert_eq!(n("agentstore_leases_held", &[]), 2.0);
    let age = n(
        "agentstore_queue_oldest_open_age_seconds",
        &[("queue", "mq")],
    );
    assert!((0.0..600.0).contains(&age), "oldest open age {age}");
    assert!(stats.oldest_open_age_ms.is_some());
    let max = n("agentstore_db_pool_connections_max", &[]);
    assert!(max >= 1.0);
    assert!((0.0..=max).contains(&n("agentstore_db_pool_connections_in_use", &[])));

    other.stop().await.unwrap();
    server.stop().await.unwrap();
}

pub async fn metrics_listen_serves_metrics_without_a_token_only_there(db: TestDb) {
    let mut config = db.config();
    config.metrics_listen = Some("127.0.0.1:0".parse().unwrap());
    let server = Server::start(&config).await.unwrap();
    let http = Client::new();
    let open = format!("http://{}/metrics", server.metrics_addr().unwrap());
    // One request and one queue, so that the labelled families have a
    // series (those by queue appear at the queue's first count): a claim
    // settled, one released, one that found nothing.
    enqueue_over_http(&http, &server.url(), "q").await;
    let store = server.store();
    let c = store.claim("q", None).await.unwrap().expect("the item");
    store
        .release(c.item.id, &c.lease.token, None)
        .await
        .unwrap();
    let c = store
        .claim("q", None)
        .await
        .unwrap()
        .expect("the item again");
    store
        .settle(
            c.item.id,
            &c.lease.token,
            None,
            SettleState::Done,
            None,
            None,
        )
        .await
        .unwrap();
    assert!(store.claim("q", None).await.unwrap().is_none());
    let resp = http.get(&open).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    // Every metric family is in the README's list with its type, and the list
    // names nothing else.
    let mut served: Vec<(String, String)> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| {
            let (name, kind) = l.split_once(' ').unwrap();
            (name.to_owned(), kind.to_owned())
        })
        .collect();
    let readme = include_str!("../../../../README.md");
    let section = &readme[readme
        .find("## Running the server")
        .expect("README section")..];
    let section = &section[..section[3..].find("\n## ").map_or(section.len(), |i| i + 3)];
    let mut listed: Vec<(String, String)> = section
        .lines()
        .filter_map(|l| l.strip_prefix("| `agentstore_"))
        .map(|l| {
            let name = l.split(['`', '{']).next().unwrap();
            let kind = l.split('|').nth(1).unwrap().trim();
            (format!("agentstore_{name}"), kind.to_owned())
        })
        .collect();
    served.sort();
    listed.sort();
    assert!(served.len() >= 17, "{served:?}");
    assert_eq!(served, listed, "/metrics vs the README's list");
    // Only /metrics lives there; the main listener still wants the admin token.
    let api_there = format!("http://{}/v1/health", server.metrics_addr().unwrap());
    assert_eq!(http.get(api_there).send().await.unwrap().status(), 404);
    let main = format!("{}/metrics", server.url());
    assert_eq!(http.get(&main).send().await.unwrap().status(), 401);
    server.stop().await.unwrap();
}

/// Concurrent scrapes: eight scrapers × 30 scrapes over six queues, each
/// with one open item. Every scrape reports every queue's item gauge and
/// oldest-open age (a scrape's reset of the scrape-time gauges must never
/// show in another scrape's output).
pub async fn concurrent_scrapes_each_report_every_queue_gauge(db: TestDb) {
    let mut config = db.config();
    config.metrics_listen = Some("127.0.0.1:0".parse().unwrap());
    let server = Server::start(&config).await.unwrap();
    let http = Client::new();
    let queues: Vec<String> = (0..6).map(|i| format!("scrape{i}")).collect();
    for q in &queues {
        enqueue_over_http(&http, &server.url(), q).await;
    }
    let url = format!("http://{}/metrics", server.metrics_addr().unwrap());
    let scrapers: Vec<_> = (0..8)
        .map(|_| {
            let (http, url, queues) = (http.clone(), url.clone(), queues.clone());
            tokio::spawn(async move {
                for _ in 0..30 {
                    let text = http.get(&url).send().await.unwrap().text().await.unwrap();
                    let samples = parse(&text);
                    for q in &queues {
                        let open = samples.iter().any(|(n, l, v)| {
                            n == "agentstore_queue_items"
                                && l.get("queue") == Some(q)
                                && l.get("state").map(String::as_str) == Some("open")
                                && *v == 1.0
                        });
                        let age = samples.iter().any(|(n, l, _)| {
                            n == "agentstore_queue_oldest_open_age_seconds"
                                && l.get("queue") == Some(q)
                        });
                        assert!(open && age, "queue {q} missing from a scrape:\n{text}");
                    }
                }
            })
        })
        .collect();
    for s in scrapers {
        s.await.unwrap();
    }
    server.stop().await.unwrap();
}

/// A scrape whose queue gauges cannot be read from the database (the items
/// table gone; on PostgreSQL also a lock that stalls the read) still answers
/// `200` with every counter, histogram and pool gauge, the queue gauges at
/// their last values and `agentstore_queue_stats_up` 0, within the 2 s the
/// read may take (the default `--metrics-read-timeout-ms`); once the read
/// works again, `up` is 1. Before, such a scrape answered `500` (after 30 s
/// when the database stalled): monitoring went dark exactly during a
/// database outage. The scrapes that expect `up` 1 are retried (bounded):
/// a database stalled for 2 s on a busy machine gives a scrape `up` 0
/// rightly, and must not fail the test.
pub async fn a_scrape_answers_when_the_queue_gauges_cannot_be_read(db: TestDb) {
    let mut config = db.config();
    config.metrics_read_timeout_ms = agentstore_server::metrics::QUEUE_STATS_TIMEOUT_MS;
    config.metrics_listen = Some("127.0.0.1:0".parse().unwrap());
    let server = Server::start(&config).await.unwrap();
    let http = Client::new();
    enqueue_over_http(&http, &server.url(), "gauged").await;
    let url = format!("http://{}/metrics", server.metrics_addr().unwrap());
    let scrape = || async {
        let started = Instant::now();
        let resp = http.get(&url).send().await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let samples = parse(&resp.text().await.unwrap());
        (samples, started.elapsed())
    };
    // A scrape that read the queue gauges: retried while `up` is 0, for at
    // most 60 s.
    let scrape_up = || async {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (samples, _) = scrape().await;
            if value(&samples, "agentstore_queue_stats_up", &[]) == 1.0 {
                return samples;
            }
            assert!(Instant::now() < deadline, "up stayed 0 for 60 s");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    let open = [("queue", "gauged"), ("state", "open")];
    let samples = scrape_up().await;
    assert_eq!(value(&samples, "agentstore_queue_items", &open), 1.0);

    let pool = server.store().pool().clone();
    let exec = |sql: &'static str| {
        let pool = pool.clone();
        async move { sqlx::query(sql).execute(&pool).await.unwrap() }
    };
    exec("ALTER TABLE items RENAME TO items_away").await;
    let (samples, _) = scrape().await;
    exec("ALTER TABLE items_away RENAME TO items").await;
    assert_eq!(value(&samples, "agentstore_queue_stats_up", &[]), 0.0);
    assert_eq!(
        value(&samples, "agentstore_queue_items", &open),
        1.0,
        "the last value read"
    );
    assert!(
        samples
            .iter()
            .any(|(n, _, _)| n == "agentstore_http_request_duration_seconds_count"),
        "the counters and histograms are there"
    );
    assert!(
        samples
            .iter()
            .any(|(n, _, _)| n == "agentstore_db_pool_connections_max"),
        "the pool gauges are there"
    );

    if db.kind == Kind::Postgres {
        // A lock held by another connection stalls the read: the scrape
        // answers after the read's 2 s, not the pool's 30 s.
        let mut holder = pool.begin().await.unwrap();
        sqlx::query("LOCK TABLE items IN ACCESS EXCLUSIVE MODE")
            .execute(&mut *holder)
            .await
            .unwrap();
        let (samples, took) = scrape().await;
        holder.rollback().await.unwrap();
        assert_eq!(value(&samples, "agentstore_queue_stats_up", &[]), 0.0);
        assert!(took < Duration::from_secs(15), "the scrape took {took:?}");
    }
    scrape_up().await;
    server.stop().await.unwrap();
}

/// A scrape over more queues than get series of their own
/// (`MAX_QUEUE_SERIES`, 500) reports 500 queues and one `(other)` series
/// that sums the rest: the label count stays bounded whatever queues
/// producers make up, and the totals stay exact. The busiest queue keeps its
/// own series. Before, every queue ever used got 7 series on every scrape,
/// for good.
pub async fn per_queue_series_are_bounded_and_the_rest_summed(db: TestDb) {
    let store = db.store(agentstore_server::Settings::default()).await;
    let n = MAX_QUEUE_SERIES + 5;
    for k in 0..n {
        store
            .enqueue(&format!("many{k:04}"), &json!(k), None)
            .await
            .unwrap();
    }
    for k in 0..3 {
        store.enqueue("many9999", &json!(k), None).await.unwrap();
    }
    let samples = parse(&crate::common::render(&store).await.unwrap());
    let open: Vec<(&String, f64)> = samples
        .iter()
        .filter(|(name, l, _)| {
            name == "agentstore_queue_items" && l.get("state").map(String::as_str) == Some("open")
        })
        .map(|(_, l, v)| (&l["queue"], *v))
        .collect();
    assert_eq!(
        open.len(),
        MAX_QUEUE_SERIES + 1,
        "series of their own and (other)"
    );
    let total: f64 = open.iter().map(|(_, v)| v).sum();
    assert_eq!(total, (n + 3) as f64, "every open item counted once");
    let other = open.iter().find(|(q, _)| *q == "(other)").expect("(other)");
    assert_eq!(other.1, 6.0, "the six queues past the bound");
    assert!(
        open.iter().any(|(q, v)| *q == "many9999" && *v == 3.0),
        "the busiest queue keeps its series"
    );
}

/// Before, an empty claim gave its queue a `queue` label value of its own
/// in the counters (first come, first served, at most `MAX_QUEUE_SERIES`):
/// a worker scoped to every queue polling made-up queue names took every
/// slot, and every real queue counted after it folded into `(other)` until
/// a restart. Now only a queue that had an item (enqueued, claimed, settled,
/// released) takes a slot; an empty poll of a queue without one is counted
/// under `(other)`, and the totals stay exact.
pub async fn empty_polls_of_unknown_queues_take_no_queue_series(db: TestDb) {
    let store = db.store(agentstore_server::Settings::default()).await;
    let n = MAX_QUEUE_SERIES + 1;
    for k in 0..n {
        let none = store.claim(&format!("made-up{k:04}"), None).await.unwrap();
        assert!(none.is_none());
    }
    store.enqueue("jobs", &json!(1), None).await.unwrap();
    store.claim("jobs", None).await.unwrap().expect("claimed");
    store.claim("jobs", None).await.unwrap();
    let m = parse(&crate::common::render(&store).await.unwrap());
    assert_eq!(
        value(&m, "agentstore_items_enqueued_total", &[("queue", "jobs")]),
        1.0,
        "jobs has its own series"
    );
    assert_eq!(
        value(&m, "agentstore_claims_total", &[("queue", "jobs")]),
        1.0
    );
    assert_eq!(
        value(&m, "agentstore_claims_empty_total", &[("queue", "jobs")]),
        1.0,
        "an empty poll of a queue that had an item keeps its name"
    );
    assert_eq!(
        value(&m, "agentstore_claims_empty_total", &[("queue", "(other)")]),
        n as f64,
        "the made-up queues' polls, summed"
    );
    assert_eq!(
        sum(&m, "agentstore_claims_empty_total", &[]),
        (n + 1) as f64
    );
    assert!(
        !m.iter()
            .any(|(_, l, _)| l.get("queue").is_some_and(|q| q.starts_with("made-up"))),
        "no series of a queue that never had an item"
    );
}

/// Sends `request` (raw HTTP/1.1) to `server` while `db`'s items are locked,
/// and goes away once the server's call waits on the lock: the server drops
/// the request unanswered, and only then is the lock released, so that the
/// call commits after its request is gone.
async fn send_and_go_away(db: &TestDb, server: &Server, request: String) {
    send_and_go_away_behind(db, server, request, None).await;
}

/// [`send_and_go_away`], the lock taken on PostgreSQL by `pg_lock` (run in
/// the locking transaction; `None`: the whole items table). SQLite's is
/// always its single writer lock. A lock that blocks a statement's
/// execution but not its preparation (a row lock, a uniqueness check)
/// makes the server's call wait with its statement sent: a table lock
/// also holds up a statement not yet prepared on its connection, which a
/// dropped request then never sends.
async fn send_and_go_away_behind(
    db: &TestDb,
    server: &Server,
    request: String,
    pg_lock: Option<&str>,
) {
    let in_use = || server.store().pool_usage().0;
    // Nothing else of the server's holds a connection: its reaper's one pass
    // at start is done (on a busy machine it may start after the server
    // answers its first request; a pass waiting on the lock would pass for
    // the call), and admin requests use none to authenticate.
    until("the reaper's first pass is done", || async {
        let m = parse(&crate::common::render(server.store()).await.unwrap());
        value(&m, "agentstore_reaper_pass_duration_seconds_count", &[]) >= 1.0
    })
    .await;
    until("the server's pool is idle", || async { in_use() == 0 }).await;
    let raw = db.raw_pool().await;
    let mut lock = raw.begin().await.unwrap();
    let sql = match db.kind {
        // Any write takes SQLite's single writer lock.
        Kind::Sqlite => "UPDATE items SET updated_at = updated_at",
        // Blocks UPDATE and FOR UPDATE, not plain reads.
        Kind::Postgres => pg_lock.unwrap_or("LOCK TABLE items IN EXCLUSIVE MODE"),
    };
    sqlx::query(sql).execute(&mut *lock).await.unwrap();
    let holder: Option<i32> = match db.kind {
        Kind::Sqlite => None,
        Kind::Postgres => Some(
            sqlx::query_as::<_, (i32,)>("SELECT pg_backend_pid()")
                .fetch_one(&mut *lock)
                .await
                .unwrap()
                .0,
        ),
    };
    let mut conn = std::net::TcpStream::connect(server.addr()).unwrap();
    conn.write_all(request.as_bytes()).unwrap();
    until("the call waits on the lock", || async { in_use() >= 1 }).await;
    if let Some(pid) = holder {
        // The server's session itself waits on this lock, not only holds a
        // connection.
        until("the statement waits on the lock", || async {
            let (n,): (i64,) = sqlx::query_as(
                "SELECT COUNT(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))",
            )
            .bind(pid)
            .fetch_one(&raw)
            .await
            .unwrap();
            n >= 1
        })
        .await;
    }
    conn.shutdown(std::net::Shutdown::Write).unwrap();
    // The server closes the connection when it drops the request.
    let answer = tokio::task::spawn_blocking(move || {
        conn.set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let mut answer = Vec::new();
        match conn.read_to_end(&mut answer) {
            Ok(_) => answer,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => answer,
            Err(e) => panic!("the server kept the connection: {e}"),
        }
    })
    .await
    .unwrap();
    assert!(answer.is_empty(), "{}", String::from_utf8_lossy(&answer));
    lock.rollback().await.unwrap();
}

/// Waits (bounded) until `cond` holds.
async fn until<F, Fut>(what: &str, cond: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cond().await {
        assert!(Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A claim and a settle whose clients went away while the server's call was
/// in flight still commit, and each is counted once; a settle sent again (a
/// replay) is not counted again.
pub async fn a_claim_and_a_settle_whose_client_went_away_are_counted_once_committed(db: TestDb) {
    let mut config = db.config();
    config.reaper_ms = 3_600_000;
    let server = Server::start(&config).await.unwrap();
    let api = Api {
        http: Client::new(),
        base: server.url(),
    };
    let store = server.store();
    let a = api.enqueue(None).await;
    let ca = api
        .claim("mq", ADMIN, &mut Tally::default())
        .await
        .expect("A");
    assert_eq!(ca.item.id, a);
    let b = api.enqueue(None).await;

    let claim = format!(
        "POST /v1/queues/mq/claims HTTP/1.1\r\nHost: 127.0.0.1\r\n\
         Authorization: Bearer {ADMIN}\r\nContent-Length: 0\r\n\r\n"
    );
    send_and_go_away(&db, &server, claim).await;
    until_state(store, b, ItemState::Running).await;

    let body = json!({"token": ca.lease.token, "state": "done"}).to_string();
    let settle = format!(
        "POST /v1/items/{a}/settle HTTP/1.1\r\nHost: 127.0.0.1\r\n\
         Authorization: Bearer {ADMIN}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    send_and_go_away(&db, &server, settle).await;
    until_state(store, a, ItemState::Done).await;

    let counts = || async {
        let m = api.scrape().await;
        (
            sum(&m, "agentstore_claims_total", &[]),
            sum(&m, "agentstore_settles_total", &[("state", "done")]),
        )
    };
    // Counted as the store learns of each commit, which may come a moment
    // after the row shows it.
    let deadline = Instant::now() + Duration::from_secs(20);
    while counts().await != (2.0, 1.0) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(counts().await, (2.0, 1.0), "claims, settles");
    // The settle sent again: answered as a replay, not counted again.
    let resp = api
        .post(
            &format!("/v1/items/{a}/settle"),
            ADMIN,
            json!({"token": ca.lease.token, "state": "done"}),
        )
        .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["idempotent-replayed"], "true");
    assert_eq!(counts().await, (2.0, 1.0), "claims, settles");
    server.stop().await.unwrap();
}

/// Waits (bounded) until `counter` reads `want`, then checks it stays there
/// a moment: a count the store makes just after the row shows its commit is
/// waited for, one counted twice is caught.
async fn until_counted(api: &Api, what: &str, counter: impl Fn(&[Sample]) -> f64, want: f64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = counter(&api.scrape().await);
        if got == want {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: counted {got}, expected {want}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(counter(&api.scrape().await), want, "{what}: counted again");
}

/// Before, an enqueue, a pause and a resume counted their commit in the
/// request's own future: a client that went away while the statement waited
/// on a lock left the write committed and the counter unmoved
/// (`agentstore_items_enqueued_total`, `agentstore_operator_actions_total`),
/// against the promise that a call whose client went away is counted all the
/// same. Each runs to its end and is counted exactly once now, keyed and
/// plain enqueues alike.
pub async fn an_enqueue_pause_or_resume_whose_client_went_away_is_counted_once_committed(
    db: TestDb,
) {
    let mut config = db.config();
    config.reaper_ms = 3_600_000;
    let server = Server::start(&config).await.unwrap();
    let api = Api {
        http: Client::new(),
        base: server.url(),
    };
    let store = server.store();
    let enqueued = |m: &[Sample]| value(m, "agentstore_items_enqueued_total", &[("queue", "gone")]);
    let acted = |action: &'static str| {
        move |m: &[Sample]| {
            value(
                m,
                "agentstore_operator_actions_total",
                &[("action", action)],
            )
        }
    };
    let in_gone = || async {
        let (n,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM items WHERE queue = 'gone'")
            .fetch_one(store.pool())
            .await
            .unwrap();
        n
    };
    let body = json!({"payload": {"n": 1}}).to_string();
    let enqueue = |key: &str| {
        format!(
            "POST /v1/queues/gone/items HTTP/1.1\r\nHost: 127.0.0.1\r\n\
             Authorization: Bearer {ADMIN}\r\nContent-Type: application/json\r\n{key}\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    let admin_post = |path: String| {
        format!(
            "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\
             Authorization: Bearer {ADMIN}\r\nContent-Length: 0\r\n\r\n"
        )
    };

    // A keyed enqueue: on PostgreSQL its INSERT waits on an uncommitted row
    // holding its key (the admin's scope, 0), which is then rolled back.
    let keyed = enqueue("Idempotency-Key: gone-1\r\n");
    let key_row = "INSERT INTO items (queue, state, payload, attempts, max_redeliveries, epoch,
                       created_at, updated_at, idempotency_key, request_hash, idempotency_scope)
                   VALUES ('gone', 'open', '0', 0, 5, 0, 0, 0, 'gone-1', 'held', 0)";
    send_and_go_away_behind(&db, &server, keyed, Some(key_row)).await;
    until("the keyed enqueue committed", || async {
        in_gone().await == 1
    })
    .await;
    until_counted(&api, "keyed enqueue", enqueued, 1.0).await;

    let id = store
        .claim("gone", None)
        .await
        .unwrap()
        .expect("claimed")
        .item
        .id;
    let row_lock = format!("SELECT id FROM items WHERE id = {id} FOR UPDATE");
    let pause = admin_post(format!("/v1/items/{id}/pause"));
    send_and_go_away_behind(&db, &server, pause, Some(&row_lock)).await;
    until_state(store, id, ItemState::Paused).await;
    until_counted(&api, "pause", acted("pause"), 1.0).await;

    let resume = admin_post(format!("/v1/items/{id}/resume"));
    send_and_go_away_behind(&db, &server, resume, Some(&row_lock)).await;
    until_state(store, id, ItemState::Running).await;
    until_counted(&api, "resume", acted("resume"), 1.0).await;

    // A plain enqueue, behind the whole table locked.
    send_and_go_away(&db, &server, enqueue("")).await;
    until("the enqueue committed", || async { in_gone().await == 2 }).await;
    until_counted(&api, "enqueue", enqueued, 2.0).await;
    server.stop().await.unwrap();
}

/// Settles that commit together in one statement (PostgreSQL) whose rows
/// cannot be read back (one item's payload is corrupt) are answered with
/// what they decided (`Ended::Unreadable`, not an error: they were applied),
/// never as replays of themselves; every settle that committed is counted
/// once, also those whose row could not be read.
pub async fn a_settle_whose_answer_cannot_be_read_is_counted_and_not_a_replay(db: TestDb) {
    const ROUNDS: usize = 20;
    const ITEMS: usize = 8;
    let server = Server::start(&db.config()).await.unwrap();
    let store = std::sync::Arc::new(server.store().clone());
    for round in 0..ROUNDS {
        let queue = format!("corrupt{round}");
        let mut held = Vec::new();
        for k in 0..ITEMS {
            store.enqueue(&queue, &json!(k), None).await.unwrap();
            held.push(store.claim(&queue, None).await.unwrap().expect("claimed"));
        }
        // The second: the first settle of a round usually runs alone, the
        // rest as one statement that then holds this item.
        sqlx::query("UPDATE items SET payload = 'not json' WHERE id = $1")
            .bind(held[1].item.id)
            .execute(store.pool())
            .await
            .unwrap();
        let held = std::sync::Arc::new(held);
        let settles = at_once(ITEMS, |k| {
            let (store, held) = (store.clone(), held.clone());
            async move {
                let c = &held[k];
                let done = SettleState::Done;
                store
                    .settle_reporting(c.item.id, &c.lease.token, None, done, None, None)
                    .await
            }
        })
        .await;
        for (k, settle) in settles.iter().enumerate() {
            assert!(
                !matches!(settle, Ok((_, true))),
                "round {round}: settle {k} answered as a replay of itself"
            );
        }
        assert!(
            matches!(
                settles[1],
                Ok((
                    Ended::Unreadable {
                        state: Some(ItemState::Done),
                        ..
                    },
                    false
                ))
            ),
            "round {round}: the corrupt item: {:?}",
            settles[1]
        );
        let (done,): (i64,) =
            sqlx::query_as("SELECT COUNT(*) FROM items WHERE queue = $1 AND state = 'done'")
                .bind(&queue)
                .fetch_one(store.pool())
                .await
                .unwrap();
        assert_eq!(done, ITEMS as i64, "round {round}: every settle committed");
    }
    let api = Api {
        http: Client::new(),
        base: server.url(),
    };
    let m = api.scrape().await;
    assert_eq!(
        sum(&m, "agentstore_settles_total", &[("state", "done")]),
        (ROUNDS * ITEMS) as f64
    );
    server.stop().await.unwrap();
}

/// Every answer is counted by method, route template and status code
/// (`agentstore_http_responses_total`), 5xx included: a database outage's
/// `503` (forced: the server's pool closed) is counted under its route, so
/// an error rate can be computed (before, no series saw a 5xx). Every
/// enqueue committed counts once in `agentstore_items_enqueued_total{queue}`
/// (a keyed enqueue sent again is a replay, not counted again), and routes
/// are templates, never raw paths.
pub async fn every_answer_is_counted_by_route_and_code_and_every_enqueue_by_queue(db: TestDb) {
    let server = Server::start(&db.config()).await.unwrap();
    let api = Api {
        http: Client::new(),
        base: server.url(),
    };
    let keyed = |queue: &str| {
        api.http
            .post(format!("{}/v1/queues/{queue}/items", api.base))
            .bearer_auth(ADMIN)
            .header("Idempotency-Key", "k-1")
            .json(&json!({"payload": 1}))
    };
    for queue in ["ea", "ea", "eb"] {
        api.ok(
            &format!("/v1/queues/{queue}/items"),
            ADMIN,
            json!({"payload": 0}),
        )
        .await;
    }
    assert_eq!(keyed("ea").send().await.unwrap().status(), 201);
    let again = keyed("ea").send().await.unwrap();
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    let resp = api
        .send(reqwest::Method::GET, "/v1/queues/ea/items", None, None)
        .await;
    assert_eq!(resp.status(), 401);

    // The database goes away: the enqueue is a 503.
    server.store().close().await;
    let resp = api
        .post("/v1/queues/ea/items", ADMIN, json!({"payload": 2}))
        .await;
    assert_eq!(resp.status(), 503);

    let m = api.scrape().await;
    assert_eq!(value(&m, "agentstore_queue_stats_up", &[]), 0.0);
    let items = [("method", "POST"), ("route", "/v1/queues/{queue}/items")];
    let answered = |code: &str| {
        value(
            &m,
            "agentstore_http_responses_total",
            &[items[0], items[1], ("code", code)],
        )
    };
    assert_eq!(answered("201"), 5.0, "4 enqueues and a replay");
    assert_eq!(answered("503"), 1.0, "the outage's answer");
    assert_eq!(
        value(
            &m,
            "agentstore_http_responses_total",
            &[
                ("method", "GET"),
                ("route", "/v1/queues/{queue}/items"),
                ("code", "401")
            ],
        ),
        1.0
    );
    assert_eq!(
        sum(&m, "agentstore_http_responses_total", &[("code", "503")]),
        1.0
    );
    assert!(
        m.iter()
            .filter(|(n, ..)| n == "agentstore_http_responses_total")
            .all(|(_, l, _)| !l["route"].contains("/ea/")),
        "routes are templates"
    );
    assert_eq!(
        value(&m, "agentstore_items_enqueued_total", &[("queue", "ea")]),
        3.0,
        "the replay not counted again"
    );
    assert_eq!(
        value(&m, "agentstore_items_enqueued_total", &[("queue", "eb")]),
        1.0
    );
    server.stop().await.unwrap();
}

/// Lock requests on `items` waiting now (sessions of other tests lock
/// their own schema's `items`, another relation).
async fn waiting_on_items(observer: &sqlx::AnyPool) -> i64 {
    let (n,): (i64,) = sqlx::query_as(
        "SELECT COUNT(*) FROM pg_locks WHERE relation = 'items'::regclass AND NOT granted",
    )
    .fetch_one(observer)
    .await
    .unwrap();
    n
}

/// A scrape that comes while another's read of the queue gauges is in
/// flight shares that read. Before, it waited for that read and then read
/// again within its own timeout, so whenever a read took over half of
/// `--metrics-read-timeout-ms` the overlapping scrape (an HA Prometheus
/// pair) answered `agentstore_queue_stats_up 0` against a healthy database.
/// Forced on PostgreSQL with locks, no timing: the first read waits for a
/// session's lock on `items`; the second scrape comes; a second lock is
/// queued behind the first read, so any read after it waits out the
/// timeout; the first lock goes. Both scrapes answer `up` 1 with the gauges.
/// (SQLite readers never wait for a lock: there is nothing to hold there.)
pub async fn a_scrape_overlapping_a_read_in_flight_shares_it(db: TestDb) {
    if db.kind == Kind::Sqlite {
        return;
    }
    // One connection, its read already prepared there by a first scrape: a
    // statement prepared anew takes the table's lock twice (to parse, then
    // to run), and the second lock below would come between the two. No
    // `lock_timeout`, and a read timeout of a minute: the read waits for the
    // lock while the steps below run, which on a busy machine took longer
    // than the 5 s default (the scrape then read `stats_up` 0; helper-251).
    let store = agentstore_server::Store::connect(
        &crate::outage::with_lock_timeout(&db, 0),
        agentstore_server::Settings {
            pool_size: 1,
            ..agentstore_server::Settings::default()
        },
    )
    .await
    .expect("connect store");
    store.enqueue("shared", &json!(1), None).await.unwrap();
    crate::common::render(&store).await.unwrap();
    use sqlx::Connection;
    let (_, url) = agentstore_server::store::database_url(&db.database);
    let connect = || async { sqlx::AnyConnection::connect(&url).await.unwrap() };
    let observer = db.raw_pool().await;
    let lock = |mut conn: sqlx::AnyConnection| async move {
        sqlx::query("BEGIN").execute(&mut conn).await.unwrap();
        sqlx::query("LOCK TABLE items IN ACCESS EXCLUSIVE MODE")
            .execute(&mut conn)
            .await
            .unwrap();
        conn
    };
    let mut first = lock(connect().await).await;
    let scrape = |store: agentstore_server::Store| {
        tokio::spawn(async move {
            store
                .metrics()
                .render(&store, crate::common::METRICS_READ)
                .await
                .unwrap()
        })
    };
    let a = scrape(store.clone());
    until("the first read waits for the lock", || async {
        waiting_on_items(&observer).await == 1
    })
    .await;
    let b = scrape(store.clone());
    until("both scrapes wait", || async {
        store.metrics().scrapes_waiting() == 2
    })
    .await;
    let (release, released) = tokio::sync::oneshot::channel::<()>();
    let second = tokio::spawn({
        let conn = connect().await;
        async move {
            let mut conn = lock(conn).await;
            let _ = released.await;
            sqlx::query("ROLLBACK").execute(&mut conn).await.unwrap();
        }
    });
    until("the second lock is queued behind the read", || async {
        waiting_on_items(&observer).await == 2
    })
    .await;
    sqlx::query("ROLLBACK").execute(&mut first).await.unwrap();
    let (a, b) = (a.await.unwrap(), b.await.unwrap());
    release.send(()).unwrap();
    second.await.unwrap();
    for (which, text) in [("first", a), ("second", b)] {
        let samples = parse(&text);
        assert_eq!(
            value(&samples, "agentstore_queue_stats_up", &[]),
            1.0,
            "the {which} scrape"
        );
        assert_eq!(
            value(
                &samples,
                "agentstore_queue_items",
                &[("queue", "shared"), ("state", "open")]
            ),
            1.0,
            "the {which} scrape"
        );
    }
    store.close().await;
}
