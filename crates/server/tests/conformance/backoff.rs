//! Opt-in redelivery backoff (`retry_backoff_ms` of an enqueue): an item
//! reopened by an ended delivery (the reaper's takeover of an expired
//! lease, a release) is claimable only from its `available_at` on, a
//! full-jitter draw after the end; without a backoff, at once.
//!
//! Every wait below is for a condition, bounded; the database clock is read
//! around each claim to tell whether the item was due: a claim that got no
//! item must have started before `available_at`, and one that got it must
//! have ended at or after it.

use std::time::{Duration, Instant};

use agentstore_protocol::lease::{ItemState, RetryBackoff};
use agentstore_protocol::{ErrorBody, ErrorCode};
use agentstore_server::store::Claimed;
use agentstore_server::Store;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::common::{http_server, sleep_ms, snapshot, ttl, TestDb, ADMIN};

/// The database clock (ms), as the server reads it.
async fn db_now(store: &Store) -> i64 {
    let sql = format!("SELECT {} AS now_ms", store.backend().now_ms());
    let (now,): (i64,) = sqlx::query_as(&sql)
        .fetch_one(store.pool())
        .await
        .expect("read the database clock");
    now
}

/// The raw `available_at` of an item.
async fn available_at(store: &Store, id: i64) -> Option<i64> {
    let (v,): (Option<i64>,) = sqlx::query_as("SELECT available_at FROM items WHERE id = $1")
        .bind(id)
        .fetch_one(store.pool())
        .await
        .expect("read available_at");
    v
}

/// Enqueues `payload` into `queue` with `backoff` and a large retry cap.
async fn enqueue(store: &Store, queue: &str, backoff: Option<RetryBackoff>) -> i64 {
    store
        .enqueue_with(queue, &json!("job"), Some(50), backoff, None, None)
        .await
        .expect("enqueue")
        .0
        .id()
}

/// Claims from `queue` until it gets item `id`, asserting on the database
/// clock that no claim got it before `due` and that none found nothing
/// once it was due; bounded. Returns the claim and how many claims ended
/// before `due` (each found nothing, as asserted): 0 when the draw left no
/// time for one (a short draw, or a busy machine), and the round proved
/// nothing about the wait.
async fn claim_when_due(store: &Store, queue: &str, id: i64, due: i64) -> (Claimed, usize) {
    let deadline = Instant::now() + Duration::from_secs(15);
    let (mut refused, mut attempts) = (0, 0u32);
    loop {
        let before = db_now(store).await;
        // Keyless and keyed claims in turn (a fresh key each: on PostgreSQL
        // a keyed claim that gets no item from the lane's statement claims
        // again alone, by the single-row statement).
        let key = (attempts % 2 == 1).then(|| format!("k-{due}-{attempts}"));
        attempts += 1;
        let claimed = store
            .claim_once(queue, None, key.as_deref())
            .await
            .expect("claim")
            .map(|(c, replayed)| {
                assert!(!replayed, "a fresh key replays nothing");
                c
            });
        let after = db_now(store).await;
        match claimed {
            Some(c) => {
                assert_eq!(c.item.id, id, "the only item of the queue");
                assert!(
                    after >= due,
                    "claimed by {after} on the database clock, before it was due at {due}"
                );
                assert_eq!(c.item.available_in_ms, None);
                return (c, refused);
            }
            None => {
                assert!(
                    before < due,
                    "no item for a claim started at {before}, though the item was due at {due}"
                );
                refused += usize::from(after < due);
            }
        }
        assert!(
            Instant::now() < deadline,
            "item {id} was never claimed (due at {due})"
        );
        // A poll interval, not an assertion.
        sleep_ms(15).await;
    }
}

/// Waits (bounded) for the reaper to take over the expired lease of `id`.
async fn reap_until_open(store: &Store, id: i64) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        store.reap().await.expect("reap");
        let item = store.item(id).await.unwrap().unwrap();
        if item.state == ItemState::Open {
            return;
        }
        assert!(Instant::now() < deadline, "the lease of {id} never expired");
        sleep_ms(20).await;
    }
}

/// Rounds (ended deliveries) a test draws at most until one leaves time
/// for a claim to end before the item is due.
const ROUNDS: u32 = 20;

pub async fn an_expired_item_with_a_retry_backoff_is_not_claimed_before_its_delay(db: TestDb) {
    let store = db.store(ttl(100)).await;
    let backoff = RetryBackoff {
        base: 400,
        max: 800,
    };
    let id = enqueue(&store, "q", Some(backoff)).await;
    let mut rounds = 0;
    let claimed = store.claim("q", None).await.unwrap().expect("claimed");
    assert_eq!(claimed.item.retry_backoff_ms, Some(backoff));
    loop {
        rounds += 1;
        reap_until_open(&store, id).await;
        let item = store.item(id).await.unwrap().unwrap();
        assert_eq!(
            (item.attempts, item.last_error.as_deref()),
            (rounds, Some("expired"))
        );
        let due = available_at(&store, id)
            .await
            .expect("a reopened item with a backoff has an available_at");
        let now = db_now(&store).await;
        // The draw is within the ceiling: base after the first expiry, then doubled up to max.
        let ceiling = (backoff.base << (rounds - 1)).min(backoff.max) as i64;
        assert!(
            due - now <= ceiling,
            "due in {} ms, ceiling {ceiling}",
            due - now
        );
        if due - now > 5 {
            let shown = item.available_in_ms.expect("GET shows when it is due");
            assert!(shown as i64 <= ceiling, "{shown} > {ceiling}");
        }
        let (_, refused) = claim_when_due(&store, "q", id, due).await;
        if refused > 0 {
            break;
        }
        assert!(
            rounds < ROUNDS,
            "{ROUNDS} draws, none left time for a claim before the item was due"
        );
    }
}

pub async fn a_released_item_with_a_retry_backoff_is_claimed_after_its_delay(db: TestDb) {
    let store = db.store(ttl(60_000)).await;
    let backoff = RetryBackoff {
        base: 600,
        max: 600,
    };
    let id = enqueue(&store, "q", Some(backoff)).await;
    let mut rounds = 0;
    let mut claimed = store.claim("q", None).await.unwrap().expect("claimed");
    loop {
        rounds += 1;
        let released = store
            .release(id, &claimed.lease.token, None)
            .await
            .expect("release");
        assert_eq!(
            (released.state, released.attempts),
            (ItemState::Open, rounds)
        );
        assert_eq!(released.last_error.as_deref(), Some("released"));
        let due = available_at(&store, id).await.expect("available_at set");
        let now = db_now(&store).await;
        assert!(due - now <= 600, "due in {} ms", due - now);
        // The release's answer says when, as a duration (ms), when not due yet.
        if let Some(shown) = released.available_in_ms {
            assert!(shown <= 600, "{shown}");
        }
        let (again, refused) = claim_when_due(&store, "q", id, due).await;
        claimed = again;
        if refused > 0 {
            break;
        }
        assert!(
            rounds < ROUNDS,
            "{ROUNDS} draws, none left time for a claim before the item was due"
        );
    }
}

pub async fn an_item_without_a_retry_backoff_is_claimable_again_at_once(db: TestDb) {
    let store = db.store(ttl(60_000)).await;
    let id = enqueue(&store, "q", None).await;
    let claimed = store.claim("q", None).await.unwrap().expect("claimed");
    assert_eq!(claimed.item.retry_backoff_ms, None);
    let released = store.release(id, &claimed.lease.token, None).await.unwrap();
    assert_eq!(released.available_in_ms, None);
    assert_eq!(available_at(&store, id).await, None);
    let again = store
        .claim("q", None)
        .await
        .unwrap()
        .expect("claimable at once");
    assert_eq!(again.item.id, id);
}

/// A queue whose only open item backs off answers "no item" (a `204`,
/// the idle `Retry-After`), to keyless and keyed claims alike, and the item
/// backing off does not hold up the newer items behind it.
pub async fn a_queue_whose_only_open_items_back_off_answers_no_item(db: TestDb) {
    let server = http_server(&db).await;
    let store = server.store().clone();
    // A day's ceiling: the draw is below a second about once in 86,400.
    let day = RetryBackoff {
        base: 86_400_000,
        max: 86_400_000,
    };
    let first = enqueue(&store, "q", Some(day)).await;
    let behind = enqueue(&store, "q", None).await;
    let claimed = store.claim("q", None).await.unwrap().expect("claimed");
    assert_eq!(claimed.item.id, first);
    store
        .release(first, &claimed.lease.token, None)
        .await
        .unwrap();
    let next = store
        .claim("q", None)
        .await
        .unwrap()
        .expect("the item behind");
    assert_eq!(
        next.item.id, behind,
        "a backing-off item does not hold up the queue"
    );
    let http = reqwest::Client::new();
    for key in [None, Some("k-1")] {
        let mut req = http
            .post(format!("{}/v1/queues/q/claims", server.url()))
            .bearer_auth(ADMIN);
        if let Some(key) = key {
            req = req.header("Idempotency-Key", key);
        }
        let started = Instant::now();
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status(), StatusCode::NO_CONTENT, "{key:?}");
        assert!(resp.headers().contains_key("retry-after"), "{key:?}");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{key:?}: answered in {:?}",
            started.elapsed()
        );
    }
    // GET shows when it is due, as a duration on the database clock.
    let item: Value = http
        .get(format!("{}/v1/items/{first}", server.url()))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(item["state"], "open");
    assert_eq!(
        item["retry_backoff_ms"],
        json!({"base": 86_400_000, "max": 86_400_000})
    );
    let left = item["available_in_ms"].as_u64().expect("available_in_ms");
    assert!(left <= 86_400_000, "{item}");
    server.stop().await.unwrap();
}

/// `retry_backoff_ms` is `{base, max}` in ms, `1 ≤ base ≤ max ≤ 86400000`
/// (a day); anything else is `400 validation` and writes nothing. A keyed
/// enqueue sent again must repeat it (another one is `409 conflict`).
pub async fn an_enqueue_with_a_bad_retry_backoff_is_refused_400(db: TestDb) {
    let server = http_server(&db).await;
    let store = server.store().clone();
    let http = reqwest::Client::new();
    let url = format!("{}/v1/queues/q/items", server.url());
    let before = snapshot(&store).await;
    for (backoff, names) in [
        (r#"{"base": 0, "max": 10}"#, "base"),
        (r#"{"base": 10, "max": 9}"#, "max"),
        (r#"{"base": 10, "max": 86400001}"#, "max"),
        (r#"{"base": 86400001, "max": 86400001}"#, "base"),
        (r#"{"base": -1, "max": 10}"#, ""),
        (r#"{"base": 1.5, "max": 10}"#, ""),
        (r#"{"base": 10}"#, ""),
        (r#"{"base": 10, "max": 20, "factor": 3}"#, ""),
        (r#"1000"#, ""),
    ] {
        let body = format!(r#"{{"payload": 1, "retry_backoff_ms": {backoff}}}"#);
        let resp = http
            .post(&url)
            .bearer_auth(ADMIN)
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "{body}");
        let err: ErrorBody = resp.json().await.unwrap();
        assert_eq!(err.code, ErrorCode::Validation, "{body}");
        if !names.is_empty() {
            assert!(
                err.message.contains(&format!("retry_backoff_ms.{names}")),
                "{body}: {}",
                err.message
            );
        }
        assert_eq!(snapshot(&store).await, before, "{body} changed state");
    }
    let keyed = |backoff: Value| {
        http.post(&url)
            .bearer_auth(ADMIN)
            .header("Idempotency-Key", "e-1")
            .json(&json!({"payload": 1, "retry_backoff_ms": backoff}))
            .send()
    };
    let first = keyed(json!({"base": 1, "max": 86_400_000})).await.unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    let item: Value = first.json().await.unwrap();
    assert_eq!(
        item["retry_backoff_ms"],
        json!({"base": 1, "max": 86_400_000})
    );
    let again = keyed(json!({"base": 1, "max": 86_400_000})).await.unwrap();
    assert_eq!(again.status(), StatusCode::CREATED);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    let other = keyed(json!({"base": 2, "max": 86_400_000})).await.unwrap();
    assert_eq!(other.status(), StatusCode::CONFLICT);
    server.stop().await.unwrap();
}

/// An operator's requeue makes an item claimable at once, whatever backoff
/// it was waiting out (here: cancelled while backing off, then requeued).
pub async fn a_requeued_item_is_claimable_at_once_whatever_its_backoff(db: TestDb) {
    let store = db.store(ttl(60_000)).await;
    // A day's ceiling: the draw is below a second about once in 86,400.
    let day = RetryBackoff {
        base: 86_400_000,
        max: 86_400_000,
    };
    let id = enqueue(&store, "q", Some(day)).await;
    let claimed = store.claim("q", None).await.unwrap().expect("claimed");
    store.release(id, &claimed.lease.token, None).await.unwrap();
    assert!(available_at(&store, id).await.is_some());
    assert!(
        store.claim("q", None).await.unwrap().is_none(),
        "backing off"
    );
    store.cancel(id).await.unwrap();
    store.requeue(id).await.unwrap();
    assert_eq!(available_at(&store, id).await, None);
    let item = store.item(id).await.unwrap().unwrap();
    assert_eq!((item.state, item.available_in_ms), (ItemState::Open, None));
    let again = store
        .claim("q", None)
        .await
        .unwrap()
        .expect("claimable at once");
    assert_eq!(again.item.id, id);
}

/// The queue's oldest-open age (`oldest_open_age_ms`, the
/// `agentstore_queue_oldest_open_age_seconds` gauge the README's
/// `AgentstoreOldestOpenItemTooOld` alert pages on: "an item has waited for
/// a worker") counts the time an open item could have been claimed: an
/// item backing off waits for its delay, not for a worker, so it ages the
/// queue only from when it is due.
pub async fn a_backing_off_item_ages_the_queue_only_from_when_it_is_due(db: TestDb) {
    let store = db.store(ttl(60_000)).await;
    let day = RetryBackoff {
        base: 86_400_000,
        max: 86_400_000,
    };
    let id = enqueue(&store, "q", Some(day)).await;
    let claimed = store.claim("q", None).await.unwrap().expect("claimed");
    store.release(id, &claimed.lease.token, None).await.unwrap();
    // Released (reopened) 20 minutes ago, due 10 minutes from now: the
    // seed moves both times back as the wait itself would have.
    let now = db_now(&store).await;
    sqlx::query("UPDATE items SET updated_at = $1, available_at = $2 WHERE id = $3")
        .bind(now - 1_200_000)
        .bind(now + 600_000)
        .bind(id)
        .execute(store.pool())
        .await
        .unwrap();
    assert!(store.claim("q", None).await.unwrap().is_none(), "not due");
    let stats = store.queue_stats(Some("q")).await.unwrap().remove(0);
    assert_eq!(stats.open, 1);
    let age = stats.oldest_open_age_ms.unwrap_or(0);
    assert!(
        age < 60_000,
        "an item due in 10 minutes has not waited for a worker, yet aged {age} ms"
    );
    // Due 5 s ago: it has waited 5 s for a worker, not 20 minutes.
    sqlx::query("UPDATE items SET available_at = $1 WHERE id = $2")
        .bind(now - 5_000)
        .bind(id)
        .execute(store.pool())
        .await
        .unwrap();
    let age = store.queue_stats(Some("q")).await.unwrap()[0]
        .oldest_open_age_ms
        .expect("an open item");
    assert!((5_000..60_000).contains(&age), "due 5 s ago, aged {age} ms");
    // An item without a backoff still ages from when it was enqueued.
    let plain = enqueue(&store, "p", None).await;
    sqlx::query("UPDATE items SET updated_at = updated_at - 1200000 WHERE id = $1")
        .bind(plain)
        .execute(store.pool())
        .await
        .unwrap();
    let age = store.queue_stats(Some("p")).await.unwrap()[0]
        .oldest_open_age_ms
        .expect("an open item");
    assert!(age >= 1_200_000, "{age}");
}
