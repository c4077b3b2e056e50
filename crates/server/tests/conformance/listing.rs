//! `GET /v1/queues/{queue}/items`: pages bounded in bytes, payloads as sent.

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::common::{http_server, TestDb, ADMIN};
use agentstore_protocol::lease::SettleState;
use serde_json::json;

/// The part of a listing this test reads; the payload as the exact text the
/// server wrote.
#[derive(Deserialize)]
struct Page {
    items: Vec<Listed>,
    #[serde(default)]
    next: Option<i64>,
}

#[derive(Deserialize)]
struct Listed {
    id: i64,
    payload: Box<RawValue>,
}

/// A page of a listing stops at its byte budget (4 MiB by default) with
/// fewer items than asked for, `after=next` reaches every item, and every
/// payload comes back as the bytes it was enqueued with (key order,
/// whitespace, number spelling, escapes). Before, a page held `limit`
/// items whatever their size, each payload parsed into a `serde_json::Value`
/// (about 32 bytes per JSON value: the 900 KiB `[0,0,…]` payloads here
/// become about 14 MiB each) and written back re-serialised.
pub async fn a_listing_page_stops_at_its_byte_budget_and_pages_return_payloads_byte_for_byte(
    db: TestDb,
) {
    let mut config = db.config();
    config.max_body_bytes = 2 * 1024 * 1024;
    let server = agentstore_server::Server::start(&config).await.unwrap();
    let http = reqwest::Client::new();
    let base = server.url();
    let big = format!("[{}0]", "0,".repeat(450 * 1024));
    let odd = [
        r#"{"b": 1,  "a":[1.0, 1e2, -0, 0.1e-7]}"#,
        r#""caf\u00e9 \ud83d\ude00 \/ \u0000""#,
        "12345678901234567890123456789",
        r#"{"a":1,"a":2}"#,
        "[ ]",
    ];
    // Small odd ones between big ones: 5 + 10 items, about 9 MiB in all.
    let mut sent: Vec<(i64, String)> = Vec::new();
    for k in 0..15 {
        let payload = if k % 3 == 0 {
            odd[k / 3].to_owned()
        } else {
            big.clone()
        };
        let resp = http
            .post(format!("{base}/v1/queues/big/items"))
            .bearer_auth(ADMIN)
            .header("content-type", "application/json")
            .body(format!(r#"{{"payload": {payload}}}"#))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 201, "{}", resp.text().await.unwrap());
        let item: Listed = serde_json::from_str(&resp.text().await.unwrap()).unwrap();
        assert_eq!(item.payload.get(), payload, "enqueue answer, item {k}");
        sent.push((item.id, payload));
    }

    let (mut seen, mut pages, mut after) = (Vec::new(), 0, 0);
    loop {
        let resp = http
            .get(format!(
                "{base}/v1/queues/big/items?limit=100&after={after}"
            ))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let text = resp.text().await.unwrap();
        let page: Page = serde_json::from_str(&text).unwrap();
        pages += 1;
        assert!(!page.items.is_empty(), "page {pages} is empty");
        let bytes: usize = page.items.iter().map(|i| i.payload.get().len()).sum();
        assert!(
            bytes <= 4 * 1024 * 1024,
            "page {pages}: {bytes} bytes of payload"
        );
        if pages == 1 {
            assert!(
                page.items.len() < sent.len() && page.next.is_some(),
                "over budget, the first page holds {} of {} items",
                page.items.len(),
                sent.len()
            );
        }
        seen.extend(
            page.items
                .into_iter()
                .map(|i| (i.id, i.payload.get().to_owned())),
        );
        match page.next {
            Some(next) => after = next,
            None => break,
        }
        assert!(pages < 20, "paging does not end");
    }
    assert!(pages >= 3, "about 9 MiB in pages of 4 MiB: {pages} pages");
    assert_eq!(seen.len(), sent.len(), "every item listed once");
    for ((id, got), (want_id, want)) in seen.iter().zip(&sent) {
        assert_eq!(id, want_id);
        assert!(got == want, "item {id}: payload {got:.60} != {want:.60}");
    }
    // A state filter pages the same way, and a claim hands the worker the
    // payload as enqueued.
    let claimed = http
        .post(format!("{base}/v1/queues/big/claims"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(claimed.status(), 201);
    #[derive(Deserialize)]
    struct Claim {
        item: Listed,
    }
    let claim: Claim = serde_json::from_str(&claimed.text().await.unwrap()).unwrap();
    assert_eq!(
        (claim.item.id, claim.item.payload.get()),
        (sent[0].0, sent[0].1.as_str())
    );
    let running: Page = serde_json::from_str(
        &http
            .get(format!("{base}/v1/queues/big/items?state=running"))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(running.items.len(), 1);
    assert_eq!(running.next, None);
    server.stop().await.unwrap();
}

/// A listing filtered by state never skips an item that stays in that state
/// while other items enter and leave it. A page is read in two statements
/// (ids and sizes, then the items that fit); before, the second read the id
/// range of the first again with the state filter and `LIMIT`: an item that
/// entered the state in between took a place on the page, the page's last
/// item fell off its end, and `next` (that item's id) skipped it for good.
pub async fn a_state_filtered_listing_skips_no_item_that_stays_in_the_state(db: TestDb) {
    let store = db.store(agentstore_server::Settings::default()).await;
    let mut ids = Vec::new();
    for k in 0..300 {
        ids.push(store.enqueue("q", &k, None).await.unwrap().id);
    }
    // Every other item keeps entering and leaving `open`; the rest stay open.
    let (steady, flapping): (Vec<i64>, Vec<i64>) =
        ids.iter().partition(|id| ids[0] % 2 == **id % 2);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flapper = {
        let (pool, stop) = (store.pool().clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for id in &flapping {
                    sqlx::query(
                        "UPDATE items SET state = CASE state WHEN 'open' THEN 'done' ELSE 'open' END
                         WHERE id = $1",
                    )
                    .bind(*id)
                    .execute(&pool)
                    .await
                    .unwrap();
                }
            }
        })
    };
    let open = Some(agentstore_protocol::lease::ItemState::Open);
    for pass in 0..40 {
        let (mut seen, mut after) = (std::collections::HashSet::new(), 0);
        loop {
            let page = store.list("q", open, after, 7).await.unwrap();
            seen.extend(page.items.iter().map(|i| i.id));
            match page.next {
                Some(next) => after = next,
                None => break,
            }
        }
        let missed: Vec<_> = steady.iter().filter(|id| !seen.contains(id)).collect();
        assert!(
            missed.is_empty(),
            "pass {pass}: items open all along were skipped: {missed:?}"
        );
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    flapper.await.unwrap();
}

/// `limit=0` is `400 validation`. Before, it was answered `{items: [],
/// next: null}` whatever the queue held: the answer of the last page, so a
/// client paging by `next` concluded the queue was empty. A parameter the
/// listing does not take (`status=done`) or one given twice is `400` too;
/// before, it was ignored and every state listed.
pub async fn a_listing_with_limit_zero_is_refused_not_answered_as_an_empty_last_page(db: TestDb) {
    let server = crate::common::http_server(&db).await;
    let http = reqwest::Client::new();
    let base = server.url();
    crate::common::enqueue_over_http(&http, &base, "q").await;
    for query in [
        "limit=0",
        "limit=0&after=0",
        "limit=00&state=open",
        // A parameter it does not take, or one twice: not ignored.
        "status=done",
        "limit=1&limt=5",
        "state=open&state=done",
        "limit=1&limit=2",
    ] {
        let resp = http
            .get(format!("{base}/v1/queues/q/items?{query}"))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap();
        let status = resp.status();
        let text = resp.text().await.unwrap();
        assert_eq!(status, 400, "{query}: {text}");
        let body: agentstore_protocol::ErrorBody = serde_json::from_str(&text).unwrap();
        assert_eq!(
            body.code,
            agentstore_protocol::ErrorCode::Validation,
            "{query}"
        );
    }
    let resp = http
        .get(format!("{base}/v1/queues/q/items?limit=1"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    let page: Page = serde_json::from_str(&resp.text().await.unwrap()).unwrap();
    assert_eq!(page.items.len(), 1);
    // A limit past the largest is taken as the largest, whatever its size
    // (README); before, one past u32 was 400.
    for limit in ["10001", "4294967296", "99999999999999999999999"] {
        let resp = http
            .get(format!("{base}/v1/queues/q/items?limit={limit}"))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "limit={limit}");
        let page: Page = serde_json::from_str(&resp.text().await.unwrap()).unwrap();
        assert_eq!(page.items.len(), 1, "limit={limit}");
    }
    server.stop().await.unwrap();
}

/// A reader tailing a queue with `after = <last id seen>` while producers
/// on two instances (two pools) enqueue into it sees every item exactly
/// once, in id order. On PostgreSQL an id is drawn when an INSERT runs, not
/// when it commits; a trigger here sleeps 0–20 ms after each insert into
/// this test's queue (standing in for commit latency: fsync, a synchronous
/// replica), so commits land out of id order unless enqueues into one queue
/// are serialised. Before they were, the tail skipped for good an item whose
/// lower id committed after a higher one had been listed (about half of
/// them here). SQLite has one writer: it runs without the trigger.
pub async fn a_queue_tail_never_misses_an_item_committed_out_of_order(db: TestDb) {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    const WRITERS: usize = 6;
    const PER_WRITER: usize = 40;
    let queue = format!("tail-{}", rand::random::<u32>());
    let stores = [
        db.store(agentstore_server::Settings::default()).await,
        db.store(agentstore_server::Settings::default()).await,
    ];
    let raw = db.raw_pool().await;
    let pg = db.kind == crate::common::Kind::Postgres;
    if pg {
        sqlx::query(
            "CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN PERFORM pg_sleep(random() * 0.02); RETURN NULL; END $$",
        )
        .execute(&raw)
        .await
        .unwrap();
        sqlx::query(&format!(
            "CREATE TRIGGER slow_commit AFTER INSERT ON items FOR EACH ROW
             WHEN (NEW.queue = '{queue}') EXECUTE FUNCTION slow_commit()"
        ))
        .execute(&raw)
        .await
        .unwrap();
    }
    let done = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let (store, queue) = (stores[w % 2].clone(), queue.clone());
        writers.push(tokio::spawn(async move {
            let mut ids = Vec::new();
            for i in 0..PER_WRITER {
                // Both INSERTs: without and with an idempotency key.
                let key = format!("w{w}-{i}");
                let key = (i % 2 == 1).then_some(key.as_str());
                let (ended, replayed) = store
                    .enqueue_once(&queue, &serde_json::json!([w, i]), None, None, key)
                    .await
                    .unwrap();
                assert!(!replayed);
                ids.push(ended.id());
            }
            ids
        }));
    }
    let reader = {
        let (store, queue, done) = (stores[0].clone(), queue.clone(), done.clone());
        tokio::spawn(async move {
            let (mut seen, mut after) = (Vec::new(), 0);
            loop {
                // Read the flag first: a page read after it was set is the drain.
                let last = done.load(Ordering::SeqCst);
                let page = store.list(&queue, None, after, 5).await.unwrap();
                if let Some(item) = page.items.last() {
                    after = item.id;
                }
                let empty = page.items.is_empty();
                seen.extend(page.items.iter().map(|i| i.id));
                if last && empty {
                    return seen;
                }
                if empty {
                    tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                }
            }
        })
    };
    let mut enqueued = Vec::new();
    for w in writers {
        enqueued.extend(w.await.unwrap());
    }
    done.store(true, Ordering::SeqCst);
    let seen = reader.await.unwrap();
    if pg {
        sqlx::query("DROP TRIGGER slow_commit ON items")
            .execute(&raw)
            .await
            .unwrap();
        sqlx::query("DROP FUNCTION slow_commit()")
            .execute(&raw)
            .await
            .unwrap();
    }
    assert!(
        seen.windows(2).all(|w| w[0] < w[1]),
        "the tail saw ids out of order or twice"
    );
    enqueued.sort_unstable();
    let missed: Vec<i64> = enqueued
        .iter()
        .filter(|id| seen.binary_search(id).is_err())
        .copied()
        .collect();
    assert!(
        missed.is_empty(),
        "the tail never saw {} of {} items: {:?}…",
        missed.len(),
        enqueued.len(),
        &missed[..missed.len().min(10)]
    );
    assert_eq!(seen, enqueued, "the tail saw exactly the items enqueued");
}

/// A page's byte budget (about 4 MiB of item text) holds for the text the
/// page is answered with, and paging still sees every item once. A settle's
/// `error` is stored as plain text and answered JSON-escaped: a control
/// character is 1 byte stored and 6 (`\u0001`) answered. Before, the budget
/// counted the stored bytes, and a page of such items grew to about 6 times
/// it (22 MB here).
pub async fn a_listing_page_stays_near_its_byte_budget_when_errors_need_escaping(db: TestDb) {
    let server = http_server(&db).await;
    let store = server.store().clone();
    let error = "\u{1}".repeat(600 * 1024);
    let mut ids = Vec::new();
    for _ in 0..10 {
        let item = store.enqueue("esc", &json!(1), None).await.unwrap();
        ids.push(item.id);
        let lease = store.claim("esc", None).await.unwrap().unwrap();
        store
            .settle(
                lease.item.id,
                &lease.lease.token,
                None,
                SettleState::Failed,
                None,
                Some(&error),
            )
            .await
            .unwrap();
    }
    let (mut seen, mut after, mut pages) = (Vec::new(), 0i64, 0);
    loop {
        let resp = reqwest::Client::new()
            .get(format!(
                "{}/v1/queues/esc/items?after={after}",
                server.url()
            ))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let text = resp.text().await.unwrap();
        // The budget plus one item (a page always holds one) and the envelope.
        let bound = 4 * 1024 * 1024 + 6 * error.len() + 64 * 1024;
        assert!(
            text.len() <= bound,
            "a page of {} bytes, bound {bound}",
            text.len()
        );
        let page: serde_json::Value = serde_json::from_str(&text).unwrap();
        for item in page["items"].as_array().unwrap() {
            assert_eq!(item["last_error"].as_str(), Some(error.as_str()));
            seen.push(item["id"].as_i64().unwrap());
        }
        pages += 1;
        match page["next"].as_i64() {
            Some(next) => after = next,
            None => break,
        }
        assert!(pages < 20, "paging ends");
    }
    assert_eq!(seen, ids, "every item once, in order, over {pages} pages");
    server.stop().await.unwrap();
}
