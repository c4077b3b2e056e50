//! Rows that cannot be decoded (a counter out of range, a payload that is not
//! JSON, an unknown state) never stop a pass over many rows: the reaper fails
//! such an expired lease and takes over every other; listings and gauges
//! leave the row out and answer the rest.

use agentstore_protocol::lease::{ItemState, Role};
use agentstore_protocol::ErrorCode;
use agentstore_server::store::{migrate, UNREADABLE_REASON};
use agentstore_server::{Settings, Store};
use serde_json::json;

use crate::common::{ttl, TestDb};

/// Waits (bounded) until `n` running items are expired on the database
/// clock, read with raw SQL (the store's own read is what is under test).
async fn until_expired(store: &Store, n: i64) {
    let sql = store.backend().sql(
        "SELECT COUNT(*) FROM items
         WHERE state = 'running' AND heartbeat_at <= {now} - lease_ttl_ms",
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let (expired,): (i64,) = sqlx::query_as(&sql).fetch_one(store.pool()).await.unwrap();
        if expired >= n {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{expired} of {n} leases expired after 20 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// The counter `agentstore_unreadable_rows_total{by}` of `store`'s metrics.
async fn unreadable_counted(store: &Store, by: &str) -> String {
    let text = crate::common::render(store).await.unwrap();
    let prefix = format!("agentstore_unreadable_rows_total{{by=\"{by}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .unwrap_or_else(|| panic!("no {prefix} in the metrics"))
        .to_owned()
}

async fn set(store: &Store, sql: &str, id: i64) {
    sqlx::query(sql)
        .bind(id)
        .execute(store.pool())
        .await
        .unwrap();
}

/// An expired running row whose `max_redeliveries` is -1 (what migration 4
/// made of items enqueued with `--max-attempts 0`) sits first in the
/// reaper's read. Before, the read failed on it and the pass returned that
/// error before any takeover: no expired lease of any queue was ever taken
/// over again. Now the pass takes over the others (in another queue too),
/// and fails the bad row with reason `unreadable_row`, its counters clamped
/// so that it reads again; a bad row whose lease is live is not touched.
pub async fn an_unreadable_running_row_does_not_stop_the_reaper_taking_over_the_others(db: TestDb) {
    let store = db.store(ttl(200)).await;
    let long = db.store(ttl(60_000)).await;
    let bad = store.enqueue("first", &json!("bad"), None).await.unwrap();
    let live_bad = store.enqueue("first", &json!("live"), None).await.unwrap();
    let good1 = store.enqueue("second", &json!(1), None).await.unwrap();
    let good2 = store.enqueue("second", &json!(2), None).await.unwrap();
    let bad_token = store
        .claim("first", None)
        .await
        .unwrap()
        .expect("bad")
        .lease
        .token;
    // Claimed with a 60 s lease: it does not expire during the test.
    long.claim("first", None).await.unwrap().expect("live bad");
    for _ in 0..2 {
        store.claim("second", None).await.unwrap().expect("good");
    }
    for id in [bad.id, live_bad.id] {
        set(
            &store,
            "UPDATE items SET max_redeliveries = -1 WHERE id = $1",
            id,
        )
        .await;
    }
    until_expired(&store, 3).await;

    let taken = store.reap().await.expect("a pass over an unreadable row");
    assert_eq!(taken, (2, 0), "both good leases reopened");
    for id in [good1.id, good2.id] {
        let now = store.item(id).await.unwrap().unwrap();
        assert_eq!(
            (now.state, now.attempts, now.last_error.as_deref()),
            (ItemState::Open, 1, Some("expired")),
            "item {id}"
        );
    }
    let failed = store.item(bad.id).await.unwrap().expect("reads again");
    assert_eq!(
        (
            failed.state,
            failed.last_error.as_deref(),
            failed.max_redeliveries,
            failed.worker_id
        ),
        (ItemState::Failed, Some(UNREADABLE_REASON), 0, None)
    );
    assert_eq!(
        store
            .heartbeat(bad.id, &bad_token, None)
            .await
            .unwrap_err()
            .code(),
        Some(ErrorCode::ClaimLost),
        "its old lease is gone"
    );
    let (state, max): (String, i64) =
        sqlx::query_as("SELECT state, max_redeliveries FROM items WHERE id = $1")
            .bind(live_bad.id)
            .fetch_one(store.pool())
            .await
            .unwrap();
    assert_eq!(
        (state.as_str(), max),
        ("running", -1),
        "a live lease is kept"
    );
    assert_eq!(unreadable_counted(&store, "reaper").await, "1");
    assert_eq!(store.reap().await.unwrap(), (0, 0), "nothing left to take");
}

/// A listing and the queue gauges leave out a row they cannot decode and
/// answer the rest. Before, one such row made every listing of its queue,
/// and every `/metrics` scrape, fail with 500.
pub async fn an_unreadable_row_is_left_out_of_listings_and_gauges_and_the_rest_is_answered(
    db: TestDb,
) {
    let store = db.store(Settings::default()).await;
    let mut ids = Vec::new();
    for k in 0..4 {
        ids.push(store.enqueue("q", &json!(k), None).await.unwrap().id);
    }
    store.enqueue("other", &json!("x"), None).await.unwrap();
    set(
        &store,
        "UPDATE items SET payload = 'not json' WHERE id = $1",
        ids[1],
    )
    .await;
    set(
        &store,
        "UPDATE items SET state = 'bogus' WHERE id = $1",
        ids[3],
    )
    .await;

    let page = store
        .list("q", None, 0, 100)
        .await
        .expect("the rest is listed");
    let listed: Vec<i64> = page.items.iter().map(|i| i.id).collect();
    assert_eq!(listed, vec![ids[0], ids[2]]);
    assert_eq!(page.next, None);
    assert_eq!(unreadable_counted(&store, "list").await, "2");

    let stats = store.queue_stats(None).await.expect("the rest is counted");
    let q = stats.iter().find(|s| s.queue == "q").expect("q");
    // The bad payload is an open item all the same; the unknown state is not counted.
    assert_eq!((q.open, q.running, q.failed), (3, 0, 0));
    let other = stats.iter().find(|s| s.queue == "other").expect("other");
    assert_eq!(other.open, 1);
    // Rows the gauges leave out are a gauge (rows now), not a counter that
    // every scrape raised again.
    set(
        &store,
        "UPDATE items SET state = 'zombie' WHERE id = $1",
        ids[0],
    )
    .await;
    for _ in 0..3 {
        let text = crate::common::render(&store).await.unwrap();
        assert!(
            text.lines()
                .any(|l| l == "agentstore_unreadable_item_rows 2"),
            "{text}"
        );
        assert!(!text.contains("by=\"stats\""));
    }
}

/// Migration 9 clamps the negative caps and attempt counts older migrations
/// left (a database upgraded from before it still holds them); before it,
/// such rows stayed -1 for good.
pub async fn negative_retry_counts_left_by_older_migrations_are_clamped_to_zero(db: TestDb) {
    let store = db.store(Settings::default()).await;
    let a = store.enqueue("q", &json!("a"), None).await.unwrap();
    let b = store.enqueue("q", &json!("b"), Some(3)).await.unwrap();
    set(
        &store,
        "UPDATE items SET max_redeliveries = -1, attempts = -2 WHERE id = $1",
        a.id,
    )
    .await;
    // As a database last migrated before version 9.
    sqlx::query("DELETE FROM schema_migrations WHERE version = 9")
        .execute(store.pool())
        .await
        .unwrap();
    assert_eq!(migrate(&store).await.unwrap(), 1, "migration 9 applied");
    let now = store.item(a.id).await.unwrap().expect("reads again");
    assert_eq!((now.max_redeliveries, now.attempts), (0, 0));
    let untouched = store.item(b.id).await.unwrap().unwrap();
    assert_eq!((untouched.max_redeliveries, untouched.attempts), (3, 0));
}

/// `(state, last_error)` of item `id`, read with raw SQL (its row does not
/// decode as an item).
async fn raw_state(store: &Store, id: i64) -> (String, Option<String>) {
    sqlx::query_as("SELECT state, last_error FROM items WHERE id = $1")
        .bind(id)
        .fetch_one(store.pool())
        .await
        .unwrap()
}

/// A claim that lands on a row it cannot decode (a payload that is not JSON)
/// fails that row with reason `unreadable_row` and answers the next readable
/// item, or nothing. Before, the claim committed the row as `running` under a
/// token nobody received and answered 500; after the TTL the reaper reopened
/// it and the next claim answered 500 again, up to the retry cap. Concurrent
/// claims (one coalesced statement on PostgreSQL) each get a readable item
/// of their own.
pub async fn a_claim_fails_an_unreadable_row_and_answers_the_next_readable_item(db: TestDb) {
    let store = db.store(Settings::default()).await;
    let bad = store.enqueue("q", &json!("bad"), None).await.unwrap();
    let good = store.enqueue("q", &json!("good"), None).await.unwrap();
    let alone = store.enqueue("alone", &json!("bad"), None).await.unwrap();
    for id in [bad.id, alone.id] {
        set(
            &store,
            "UPDATE items SET payload = 'not json' WHERE id = $1",
            id,
        )
        .await;
    }

    let claimed = store.claim("q", None).await.expect("no 500").expect("good");
    assert_eq!(claimed.item.id, good.id);
    assert!(store.claim("q", None).await.unwrap().is_none());
    assert!(
        store.claim("alone", None).await.expect("no 500").is_none(),
        "a queue holding only an unreadable row is answered as empty"
    );
    for id in [bad.id, alone.id] {
        assert_eq!(
            raw_state(&store, id).await,
            ("failed".to_owned(), Some(UNREADABLE_REASON.to_owned())),
            "item {id}"
        );
    }
    assert_eq!(unreadable_counted(&store, "claim").await, "2");
    let (running,): (i64,) =
        sqlx::query_as("SELECT COUNT(*) FROM items WHERE token_hash IS NOT NULL")
            .fetch_one(store.pool())
            .await
            .unwrap();
    assert_eq!(running, 1, "only the claim that was answered holds a token");

    // Many claims at once over bad and good rows interleaved.
    let mut goods = Vec::new();
    for k in 0..16 {
        let item = store.enqueue("many", &json!(k), None).await.unwrap();
        if k % 2 == 0 {
            set(
                &store,
                "UPDATE items SET payload = 'not json' WHERE id = $1",
                item.id,
            )
            .await;
        } else {
            goods.push(item.id);
        }
    }
    let answers = crate::common::at_once(12, |_| {
        let store = store.clone();
        async move { store.claim("many", None).await }
    })
    .await;
    let mut got: Vec<i64> = answers
        .into_iter()
        .filter_map(|a| a.expect("no claim fails").map(|c| c.item.id))
        .collect();
    got.sort_unstable();
    assert_eq!(got, goods, "each readable item handed out exactly once");
    let (tokens,): (i64,) = sqlx::query_as(
        "SELECT COUNT(*) FROM items WHERE queue = 'many' AND token_hash IS NOT NULL",
    )
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!(tokens, 8, "no lease is held under a token nobody received");
}

/// A settle or a release whose row no longer decodes (its payload corrupted
/// while the lease ran) is answered 200 with the item's id and new state,
/// and so is the same call sent again (a replay). Before, both were 500
/// after the commit, and every retry 500 again.
pub async fn a_settle_or_release_of_an_unreadable_row_is_answered_and_so_is_its_retry(db: TestDb) {
    let server = crate::common::http_server(&db).await;
    let store = server.store().clone();
    let http = reqwest::Client::new();
    let base = server.url();
    let mut leases = Vec::new();
    for _ in 0..2 {
        let id = crate::common::enqueue_over_http(&http, &base, "q").await;
        let resp = http
            .post(format!("{base}/v1/queues/q/claims"))
            .bearer_auth(crate::common::ADMIN)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 201);
        let claimed: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(claimed["item"]["id"], id);
        set(
            &store,
            "UPDATE items SET payload = 'not json' WHERE id = $1",
            id,
        )
        .await;
        leases.push((id, claimed["lease"]["token"].as_str().unwrap().to_owned()));
    }
    let calls = [
        (
            "settle",
            json!({"token": leases[0].1, "state": "done", "result": {"ok": true}}),
            leases[0].0,
            "done",
        ),
        (
            "release",
            json!({"token": leases[1].1}),
            leases[1].0,
            "open",
        ),
    ];
    for (call, body, id, state) in calls {
        for attempt in ["first", "again"] {
            let resp = http
                .post(format!("{base}/v1/items/{id}/{call}"))
                .bearer_auth(crate::common::ADMIN)
                .json(&body)
                .send()
                .await
                .unwrap();
            let status = resp.status();
            let replayed = resp.headers().contains_key("idempotent-replayed");
            let text = resp.text().await.unwrap();
            assert_eq!(status, 200, "{call} ({attempt}): {text}");
            assert_eq!(replayed, attempt == "again", "{call} ({attempt})");
            let answer: serde_json::Value = serde_json::from_str(&text).unwrap();
            assert_eq!(answer["id"], id, "{call} ({attempt}): {text}");
            if attempt == "first" {
                assert_eq!(answer["state"], state, "{call}: {text}");
            }
        }
        assert_eq!(raw_state(&store, id).await.0, state, "{call}");
    }
    // Counted once each, when committed (a replay counts in no metric).
    assert_eq!(unreadable_counted(&store, "settle").await, "1");
    assert_eq!(unreadable_counted(&store, "release").await, "1");
    server.stop().await.unwrap();
}

/// Sets item `id`'s payload to text that is not JSON.
async fn corrupt_payload(store: &Store, id: i64) {
    set(
        store,
        "UPDATE items SET payload = 'not json' WHERE id = $1",
        id,
    )
    .await;
}

/// POSTs `body` to `{base}{path}` with the admin token: status and JSON answer.
async fn post_admin(
    http: &reqwest::Client,
    base: &str,
    path: &str,
    body: serde_json::Value,
) -> (u16, serde_json::Value) {
    let resp = http
        .post(format!("{base}{path}"))
        .bearer_auth(crate::common::ADMIN)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    let answer = serde_json::from_str(&text).unwrap_or_else(|_| json!(text));
    (status, answer)
}

/// A resume of a paused row that does not decode (its payload corrupted
/// while it was paused) fails it at once, fenced on the token the resume
/// made, with reason `unreadable_row`, and answers 200 `{id, state:
/// "failed", unreadable_row: true}` with no lease; the same resume sent
/// again is answered as a replay (`{id, state: "failed", epoch, replayed:
/// true}`). Before, the resume committed the row as running
/// under a token nobody received and answered 500 (after the TTL the reaper
/// reopened it for the claims to fail), and its retry answered 500 as well.
pub async fn a_resume_of_an_unreadable_row_fails_it_and_is_answered_and_so_is_its_retry(
    db: TestDb,
) {
    let server = crate::common::http_server(&db).await;
    let store = server.store().clone();
    let (http, base) = (reqwest::Client::new(), server.url());
    let id = crate::common::enqueue_over_http(&http, &base, "q").await;
    store.claim("q", None).await.unwrap().expect("claimed");
    store.pause(id).await.unwrap();
    corrupt_payload(&store, id).await;

    let (status, answer) =
        post_admin(&http, &base, &format!("/v1/items/{id}/resume"), json!({})).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer,
        json!({"id": id, "state": "failed", "unreadable_row": true})
    );
    assert_eq!(
        raw_state(&store, id).await,
        ("failed".to_owned(), Some(UNREADABLE_REASON.to_owned()))
    );
    let (tokens,): (i64,) =
        sqlx::query_as("SELECT COUNT(*) FROM items WHERE token_hash IS NOT NULL")
            .fetch_one(store.pool())
            .await
            .unwrap();
    assert_eq!(tokens, 0, "no lease is held under a token nobody received");

    // Sent again: that resume landed (and failed the row), so the retry is
    // answered as a replay, with the state it left, and changes nothing.
    let (status, answer) =
        post_admin(&http, &base, &format!("/v1/items/{id}/resume"), json!({})).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer,
        json!({"id": id, "state": "failed", "epoch": 2, "replayed": true})
    );
    assert_eq!(unreadable_counted(&store, "resume").await, "1");
    server.stop().await.unwrap();
}

/// A pause of a running row that does not decode is applied and answered
/// 200 `{id, state: "paused", unreadable_row: true}`; the same pause sent
/// again is 409 conflict, and the holder's token is fenced as for any
/// pause. Before, the pause committed and answered 500, and so did its retry.
pub async fn a_pause_of_an_unreadable_row_is_answered_and_so_is_its_retry(db: TestDb) {
    let server = crate::common::http_server(&db).await;
    let store = server.store().clone();
    let (http, base) = (reqwest::Client::new(), server.url());
    let id = crate::common::enqueue_over_http(&http, &base, "q").await;
    let token = store
        .claim("q", None)
        .await
        .unwrap()
        .expect("claimed")
        .lease
        .token;
    corrupt_payload(&store, id).await;

    let (status, answer) =
        post_admin(&http, &base, &format!("/v1/items/{id}/pause"), json!({})).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer,
        json!({"id": id, "state": "paused", "unreadable_row": true})
    );
    assert_eq!(raw_state(&store, id).await.0, "paused");
    let (status, answer) =
        post_admin(&http, &base, &format!("/v1/items/{id}/pause"), json!({})).await;
    assert_eq!(
        (status, &answer["code"]),
        (409, &json!("conflict")),
        "{answer}"
    );
    let (status, answer) = post_admin(
        &http,
        &base,
        &format!("/v1/items/{id}/heartbeat"),
        json!({"token": token}),
    )
    .await;
    assert_eq!(
        (status, &answer["code"]),
        (409, &json!("state_conflict")),
        "{answer}"
    );
    assert_eq!(unreadable_counted(&store, "pause").await, "1");
    server.stop().await.unwrap();
}

/// A heartbeat renews a lease whose stored TTL does not decode (on SQLite a
/// text; on PostgreSQL, whose column holds only integers, a negative one)
/// and answers this instance's TTL, alone as in a batch; the reaper and a
/// release read that same TTL (one SQL expression, `lease_ttl_sql`). Before,
/// the single heartbeat renewed the lease and then answered 500 on SQLite,
/// the reaper failed the renewed lease at once, and a release answered 500.
pub async fn a_lease_whose_stored_ttl_does_not_decode_is_renewed_kept_by_the_reaper_and_releasable(
    db: TestDb,
) {
    let store = db.store(ttl(60_000)).await;
    // (stored value, the TTL it counts as). On SQLite also a REAL within
    // the range, which reads as its integer part (it used to reach the
    // reaper's integer decode as a REAL and fail the lease).
    let cases: &[(&str, u64)] = match store.backend() {
        agentstore_server::store::Backend::Sqlite => {
            &[("'not a number'", 60_000), ("5000.5", 5_000)]
        }
        agentstore_server::store::Backend::Postgres => &[("-1", 60_000)],
    };
    for (n, &(bad, counted)) in cases.iter().enumerate() {
        let queue = format!("q{n}");
        let item = store.enqueue(&queue, &json!(1), None).await.unwrap();
        let token = crate::lease::token(&store, &queue, None).await;
        set(
            &store,
            &format!("UPDATE items SET lease_ttl_ms = {bad}, heartbeat_at = 0 WHERE id = $1"),
            item.id,
        )
        .await;

        let ttl_ms = store
            .heartbeat(item.id, &token, None)
            .await
            .expect("renewed and answered");
        assert_eq!(ttl_ms, counted, "{bad}");
        assert_ne!(crate::common::heartbeat_at(&store, item.id).await, Some(0));
        let many = store
            .heartbeat_many(&[(item.id, token.as_str())], None)
            .await
            .unwrap();
        assert_eq!(
            many.into_iter().map(Result::ok).collect::<Vec<_>>(),
            vec![Some(counted)],
            "{bad}"
        );
        // The reaper reads the same TTL: the lease just renewed is live.
        // Before, it read the bad TTL as 0 (SQLite) or as -1 ms (PostgreSQL),
        // took the lease for expired and failed the item at its next pass.
        assert_eq!(
            store.reap().await.unwrap(),
            (0, 0),
            "{bad}: nothing expired"
        );
        let still = store.item(item.id).await.unwrap().expect("kept");
        assert_eq!((still.state, still.epoch), (ItemState::Running, 1), "{bad}");
        // And so does the release, which answered 500 on it before.
        let released = store
            .release(item.id, &token, None)
            .await
            .expect("released");
        assert_eq!(released.state, ItemState::Open, "{bad}");
    }
}

/// A read of an item whose row does not decode (`GET /v1/items/{id}`) is
/// answered `200 {id, state, unreadable_row: true}` (`state` left out when
/// it is not one the server knows) to whoever may read the item, decided on
/// the columns that do decode: the admin, a producer of its queue, the
/// worker holding its claim; anyone else is refused as for any item. Before,
/// every such read answered 500.
pub async fn a_read_of_an_unreadable_row_is_answered_to_those_who_may_read_it(db: TestDb) {
    let server = crate::common::http_server(&db).await;
    let store = server.store().clone();
    let enrolled = |role: Role, queue: &'static str| {
        let store = store.clone();
        async move {
            let (token, _) = store
                .create_enrollment_token(None, role, &[queue.to_owned()])
                .await
                .unwrap();
            store.enroll(&token.0, Some("reader")).await.unwrap()
        }
    };
    let producer = enrolled(Role::Producer, "q").await;
    let every_queue = enrolled(Role::Producer, "*").await;
    let elsewhere = enrolled(Role::Producer, "other").await;
    let holder = enrolled(Role::Worker, "q").await;
    let other_worker = enrolled(Role::Worker, "q").await;

    let held = store.enqueue("q", &json!("held"), None).await.unwrap();
    let claimed = store
        .claim("q", Some(holder.worker_id))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(claimed.item.id, held.id);
    let bad_payload = store.enqueue("q", &json!("p"), None).await.unwrap();
    let bad_state = store.enqueue("q", &json!("s"), None).await.unwrap();
    set(
        &store,
        "UPDATE items SET attempts = -5 WHERE id = $1",
        held.id,
    )
    .await;
    set(
        &store,
        "UPDATE items SET payload = 'not json' WHERE id = $1",
        bad_payload.id,
    )
    .await;
    set(
        &store,
        "UPDATE items SET state = 'bogus' WHERE id = $1",
        bad_state.id,
    )
    .await;

    let http = reqwest::Client::new();
    let get = |id: i64, bearer: String| {
        let req = http
            .get(format!("{}/v1/items/{id}", server.url()))
            .bearer_auth(bearer);
        async move {
            let resp = req.send().await.unwrap();
            let status = resp.status().as_u16();
            (status, resp.json::<serde_json::Value>().await.unwrap())
        }
    };
    let admin = crate::common::ADMIN.to_owned();
    for (id, state) in [(held.id, json!("running")), (bad_payload.id, json!("open"))] {
        for who in [&admin, &producer.access_token, &every_queue.access_token] {
            assert_eq!(
                get(id, who.clone()).await,
                (
                    200,
                    json!({"id": id, "state": state, "unreadable_row": true})
                ),
                "item {id}"
            );
        }
    }
    assert_eq!(
        get(bad_state.id, admin.clone()).await,
        (200, json!({"id": bad_state.id, "unreadable_row": true})),
        "an unknown state is left out"
    );
    assert_eq!(
        get(held.id, holder.access_token.clone()).await,
        (
            200,
            json!({"id": held.id, "state": "running", "unreadable_row": true})
        ),
        "the worker holding its claim"
    );
    for (id, who) in [
        (held.id, &other_worker.access_token),
        (held.id, &elsewhere.access_token),
        (bad_payload.id, &holder.access_token),
        (bad_payload.id, &elsewhere.access_token),
    ] {
        let (status, body) = get(id, who.clone()).await;
        assert_eq!(status, ErrorCode::Forbidden.status(), "item {id}: {body}");
        assert_eq!(body["code"], json!("forbidden"));
    }
    // A queue that does not decode (SQLite keeps any bytes in a TEXT
    // column; PostgreSQL refuses them on write): only a caller that may
    // read every item reads it. Before, a producer of every queue was
    // refused (its scope was matched against the queue it could not read).
    let mut counted = 12;
    if db.kind == crate::common::Kind::Sqlite {
        let bad_queue = store.enqueue("q", &json!("b"), None).await.unwrap();
        set(
            &store,
            "UPDATE items SET queue = x'ff' WHERE id = $1",
            bad_queue.id,
        )
        .await;
        for who in [&admin, &every_queue.access_token] {
            assert_eq!(
                get(bad_queue.id, who.clone()).await,
                (
                    200,
                    json!({"id": bad_queue.id, "state": "open", "unreadable_row": true})
                ),
                "a queue that does not decode"
            );
        }
        for who in [&producer.access_token, &holder.access_token] {
            let (status, body) = get(bad_queue.id, who.clone()).await;
            assert_eq!(status, ErrorCode::Forbidden.status(), "{body}");
        }
        counted += 4;
    }
    // Every read that met such a row, refused ones included, is counted.
    assert_eq!(unreadable_counted(&store, "get").await, counted.to_string());
    // The reads changed nothing.
    assert_eq!(
        raw_state(&store, held.id).await,
        ("running".to_owned(), None)
    );
    server.stop().await.unwrap();
}

/// An enrolment whose token's stored scope does not decode (a role this
/// server does not know, queues that are not a list of names) is refused
/// and writes nothing: no worker, the token still unused, so once the row
/// is repaired the same token enrols. Before, the scope was copied as it
/// was: the token was burned for a worker whose every request failed.
pub async fn an_enrolment_whose_stored_scope_does_not_decode_writes_nothing(db: TestDb) {
    let store = db.store(Settings::default()).await;
    let (token, _) = store
        .create_enrollment_token(None, Role::Worker, &["q".to_owned()])
        .await
        .unwrap();
    for (bad, good) in [
        (
            "UPDATE enrollment_tokens SET role = 'operator'",
            "UPDATE enrollment_tokens SET role = 'worker'",
        ),
        (
            "UPDATE enrollment_tokens SET queues = '\"q\"'",
            "UPDATE enrollment_tokens SET queues = '[\"q\"]'",
        ),
    ] {
        sqlx::query(bad).execute(store.pool()).await.unwrap();
        let before = crate::common::snapshot(&store).await;
        let refused = store.enroll(&token.0, Some("w")).await;
        assert!(refused.is_err(), "{bad}: {refused:?}");
        assert_eq!(
            crate::common::snapshot(&store).await,
            before,
            "{bad}: nothing written"
        );
        let (used,): (i64,) =
            sqlx::query_as("SELECT COUNT(*) FROM enrollment_tokens WHERE worker_id IS NOT NULL")
                .fetch_one(store.pool())
                .await
                .unwrap();
        assert_eq!(used, 0, "{bad}: the token is not burned");
        sqlx::query(good).execute(store.pool()).await.unwrap();
    }
    let creds = store.enroll(&token.0, Some("w")).await.expect("repaired");
    let principal = store
        .authenticate(&creds.access_token)
        .await
        .expect("the credential works");
    assert_eq!(principal.role, Role::Worker);
    assert_eq!(principal.queues, vec!["q".to_owned()]);
}

/// A release by the current lease of a running row whose epoch does not
/// decode (-1: out of range on both backends). Before, it answered 500 and
/// changed nothing, and so did every retry, while the holder kept the lease
/// alive. Now it fails the item with reason `unreadable_row` (its counters
/// clamped into range), as a claim of such a row does, counts it and answers
/// the item; the same release sent again is a replay of it. A wrong token
/// changes nothing and is `claim_lost`.
pub async fn a_release_of_a_lease_whose_epoch_does_not_decode_fails_the_item_once(db: TestDb) {
    use agentstore_server::store::Released;
    let store = db.store(ttl(60_000)).await;
    let item = store.enqueue("q", &json!(1), None).await.unwrap();
    let token = crate::lease::token(&store, "q", None).await;
    set(&store, "UPDATE items SET epoch = -1 WHERE id = $1", item.id).await;

    let wrong = store
        .release_reporting(item.id, "not the token", None)
        .await;
    assert_eq!(
        wrong.expect_err("a wrong token").code(),
        Some(ErrorCode::ClaimLost)
    );
    use sqlx::Row;
    let state = sqlx::query("SELECT state, epoch FROM items WHERE id = $1")
        .bind(item.id)
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(
        (state.get::<String, _>(0), state.get::<i64, _>(1)),
        ("running".to_owned(), -1),
        "a wrong token changed nothing"
    );

    let (ended, done) = store
        .release_reporting(item.id, &token, None)
        .await
        .expect("answered, not 500");
    assert!(matches!(done, Released::Now));
    let failed = ended.into_item().expect("the clamped row reads again");
    assert_eq!(
        (failed.state, failed.last_error.as_deref()),
        (ItemState::Failed, Some(UNREADABLE_REASON))
    );
    assert_eq!(unreadable_counted(&store, "release").await, "1");

    let (again, replayed) = store
        .release_reporting(item.id, &token, None)
        .await
        .expect("the retry is answered");
    assert!(matches!(replayed, Released::Again), "a replay");
    assert_eq!(again.into_item().unwrap().state, ItemState::Failed);
    assert_eq!(
        unreadable_counted(&store, "release").await,
        "1",
        "counted once"
    );
}

/// C-V2 on the server: no item id or lease epoch past 2^53 − 1 (what a
/// JavaScript number holds exactly) is ever answered. A claim that would
/// raise an epoch past it fails the item as unreadable (its epoch clamped
/// back) and answers the next item; the last epoch below it is answered
/// exactly. An enqueue when the last id below it is taken adds nothing and
/// fails (keyed or not), while the same keyed enqueue sent again still
/// replays. Before, a claim answered epoch 2^53 (the SDK refused the answer
/// and the item ran out its TTL, an attempt spent) and enqueues answered
/// ids 2^53, 2^53 + 1, …
pub async fn ids_and_epochs_never_pass_the_largest_safe_integer(db: TestDb) {
    use agentstore_server::store::MAX_SAFE_INTEGER as MAX;
    let store = db.store(Settings::default()).await;
    let last = store.enqueue("q", &json!("last"), None).await.unwrap();
    let spent = store.enqueue("q", &json!("spent"), None).await.unwrap();
    let next = store.enqueue("q", &json!("next"), None).await.unwrap();
    for (id, epoch) in [(last.id, MAX - 1), (spent.id, MAX)] {
        sqlx::query("UPDATE items SET epoch = $1 WHERE id = $2")
            .bind(epoch)
            .bind(id)
            .execute(store.pool())
            .await
            .unwrap();
    }
    let first = store.claim("q", None).await.unwrap().expect("claimed");
    assert_eq!(
        (first.item.id, first.lease.epoch),
        (last.id, MAX.unsigned_abs())
    );
    let second = store
        .claim("q", None)
        .await
        .expect("no 500")
        .expect("claimed");
    assert_eq!((second.item.id, second.lease.epoch), (next.id, 1));
    assert_eq!(
        raw_state(&store, spent.id).await,
        ("failed".to_owned(), Some(UNREADABLE_REASON.to_owned()))
    );
    let (epoch,): (i64,) = sqlx::query_as("SELECT epoch FROM items WHERE id = $1")
        .bind(spent.id)
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(epoch, MAX, "clamped back");
    assert!(store.item(spent.id).await.is_ok(), "the failed item reads");

    // A resume that would raise a paused item's epoch past the bound fails
    // it as unreadable; sent again, it is a replay at the clamped epoch.
    let paused = store.enqueue("p", &json!(1), None).await.unwrap().id;
    store.claim("p", None).await.unwrap().expect("claimed");
    store.pause(paused).await.unwrap();
    sqlx::query("UPDATE items SET epoch = $1 WHERE id = $2")
        .bind(MAX)
        .bind(paused)
        .execute(store.pool())
        .await
        .unwrap();
    let first = store.resume_reporting(paused, None).await.unwrap();
    assert!(
        matches!(first, agentstore_server::store::Resumed::Unreadable { .. }),
        "{first:?}"
    );
    let again = store
        .resume_reporting(paused, None)
        .await
        .expect("a replay");
    assert!(
        matches!(
            again,
            agentstore_server::store::Resumed::Again { epoch, .. } if epoch == MAX
        ),
        "{again:?}"
    );

    let near = match store.backend() {
        agentstore_server::store::Backend::Sqlite => {
            "UPDATE sqlite_sequence SET seq = $1 WHERE name = 'items'"
        }
        agentstore_server::store::Backend::Postgres => {
            "SELECT setval(pg_get_serial_sequence('items', 'id'), $1)"
        }
    };
    sqlx::query(near)
        .bind(MAX - 1)
        .execute(store.pool())
        .await
        .unwrap();
    let (top, replayed) = store
        .enqueue_once("ids", &json!(1), None, None, Some("k1"))
        .await
        .unwrap();
    assert!(!replayed);
    assert_eq!(
        top.into_item().unwrap().id,
        MAX,
        "the last safe id is handed out"
    );
    let count = || async {
        let (n,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM items")
            .fetch_one(store.pool())
            .await
            .unwrap();
        n
    };
    let before = count().await;
    assert!(
        store.enqueue("ids", &json!(2), None).await.is_err(),
        "no id left"
    );
    assert!(
        store
            .enqueue_once("ids", &json!(3), None, None, Some("k2"))
            .await
            .is_err(),
        "no id left for a new key"
    );
    let (again, replayed) = store
        .enqueue_once("ids", &json!(1), None, None, Some("k1"))
        .await
        .expect("a replay needs no id");
    assert!(replayed);
    assert_eq!(again.into_item().unwrap().id, MAX);
    assert_eq!(count().await, before, "nothing added");
    // A keyed item past the bound (another copy's, not yet deleted again) is
    // not replayed: deleted, and the enqueue refused.
    sqlx::query("UPDATE items SET id = $1 WHERE id = $2")
        .bind(MAX + 1)
        .bind(MAX)
        .execute(store.pool())
        .await
        .unwrap();
    assert!(
        store
            .enqueue_once("ids", &json!(1), None, None, Some("k1"))
            .await
            .is_err(),
        "no replay of an item past the bound"
    );
    let (past,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM items WHERE id > $1")
        .bind(MAX)
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(past, 0, "nothing left past the bound");

    // Worker ids too: an enrollment past the bound writes nothing.
    use agentstore_protocol::lease::ANY_QUEUE;
    let token = store
        .create_enrollment_token(None, Role::Worker, &[ANY_QUEUE.into()])
        .await
        .unwrap()
        .0;
    let near = match store.backend() {
        agentstore_server::store::Backend::Sqlite => {
            "UPDATE sqlite_sequence SET seq = $1 WHERE name = 'workers'"
        }
        agentstore_server::store::Backend::Postgres => {
            "SELECT setval(pg_get_serial_sequence('workers', 'id'), $1)"
        }
    };
    let w = store.enroll(&token.0, None).await.unwrap();
    assert!(w.worker_id < MAX);
    let token = store
        .create_enrollment_token(None, Role::Worker, &[ANY_QUEUE.into()])
        .await
        .unwrap()
        .0;
    sqlx::query(near)
        .bind(MAX)
        .execute(store.pool())
        .await
        .unwrap();
    assert!(
        store.enroll(&token.0, None).await.is_err(),
        "no worker id left"
    );
    let (workers,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM workers WHERE id > $1")
        .bind(MAX)
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(workers, 0, "no worker added past the bound");
}
