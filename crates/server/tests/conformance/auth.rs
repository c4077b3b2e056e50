//! Enrollment, refresh and access tokens.

use std::sync::Arc;

use agentstore_protocol::lease::{Role, ANY_QUEUE};
use agentstore_protocol::ErrorCode;
use agentstore_server::{Attempt, Settings, Store, StoreError};
use tokio::sync::Barrier;

use serde_json::json;

use crate::common::{http_server, sleep_ms, TestDb};

/// Request-Attempt number `n` of `sender`.
fn at(sender: &str, n: i64) -> Attempt {
    Attempt {
        sender: sender.to_owned(),
        n,
    }
}

async fn workers(store: &Store) -> i64 {
    let (n,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM workers")
        .fetch_one(store.pool())
        .await
        .unwrap();
    n
}

/// Runs `f` on two store instances at once, released together by a barrier.
async fn twice_concurrently<T, F, Fut>(
    a: &Arc<Store>,
    b: &Arc<Store>,
    f: F,
) -> [Result<T, StoreError>; 2]
where
    T: Send + 'static,
    F: Fn(Arc<Store>) -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>> + Send + 'static,
{
    let barrier = Arc::new(Barrier::new(2));
    let spawn = |store: Arc<Store>| {
        let (barrier, fut) = (barrier.clone(), f(store));
        tokio::spawn(async move {
            barrier.wait().await;
            fut.await
        })
    };
    let (x, y) = (spawn(a.clone()), spawn(b.clone()));
    [x.await.unwrap(), y.await.unwrap()]
}

/// Whether `creds`' access token still authenticates.
async fn valid(store: &Store, creds: &agentstore_protocol::lease::WorkerCredentials) -> bool {
    store.authenticate(&creds.access_token).await.is_ok()
}

/// Refresh tokens of `worker` that could still be used (unused, not
/// revoked), read from the database (using one would change it).
async fn live_refresh_tokens(store: &Store, worker: i64) -> i64 {
    let (n,): (i64,) = sqlx::query_as(
        "SELECT COUNT(*) FROM refresh_tokens WHERE worker_id = $1 AND used_at IS NULL AND revoked = 0",
    )
    .bind(worker)
    .fetch_one(store.pool())
    .await
    .unwrap();
    n
}

/// Two uses of one enrollment token at once (two instances): one worker,
/// and exactly one of the two credential pairs valid — the later use is a
/// replay of the earlier (as a lost answer's retry is) and revokes what the
/// earlier use issued.
pub async fn an_enrollment_token_used_twice_concurrently_enrolls_exactly_one_worker(db: TestDb) {
    let a = Arc::new(db.store(Settings::default()).await);
    let b = Arc::new(db.store(Settings::default()).await);
    const ROUNDS: i64 = 10;
    for round in 1..=ROUNDS {
        let (token, _) = a
            .create_enrollment_token(None, Role::Worker, &[ANY_QUEUE.into()])
            .await
            .unwrap();
        let results = twice_concurrently(&a, &b, |s| {
            let token = token.0.clone();
            async move { s.enroll(&token, Some("w")).await }
        })
        .await;
        let ok: Vec<_> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
        assert_eq!(ok.len(), 2, "round {round}: the second use is a replay");
        assert_eq!(
            ok[0].worker_id, ok[1].worker_id,
            "round {round}: one worker"
        );
        let live = [valid(&a, ok[0]).await, valid(&a, ok[1]).await];
        assert_eq!(
            live.iter().filter(|v| **v).count(),
            1,
            "round {round}: exactly one credential pair valid: {live:?}"
        );
        assert_eq!(
            live_refresh_tokens(&a, ok[0].worker_id).await,
            1,
            "round {round}: exactly one refresh token usable"
        );
        assert_eq!(workers(&a).await, round, "one worker per token");
    }
}

/// Two uses of one refresh token at once: exactly one resulting pair valid,
/// for the same worker. Once the surviving pair has refreshed, the old token
/// is a reuse: refused, and every credential of the worker is revoked.
pub async fn a_refresh_token_used_twice_leaves_exactly_one_valid_pair(db: TestDb) {
    let a = Arc::new(db.store(Settings::default()).await);
    let b = Arc::new(db.store(Settings::default()).await);
    let (token, _) = a
        .create_enrollment_token(None, Role::Worker, &[ANY_QUEUE.into()])
        .await
        .unwrap();
    let creds = a.enroll(&token.0, None).await.unwrap();
    let results = twice_concurrently(&a, &b, |s| {
        let refresh = creds.refresh_token.clone();
        async move { s.refresh(&refresh).await }
    })
    .await;
    let ok: Vec<_> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
    assert_eq!(ok.len(), 2, "the second use is a replay");
    let live: Vec<_> = {
        let mut v = Vec::new();
        for c in &ok {
            if valid(&a, c).await {
                v.push(*c);
            }
        }
        v
    };
    assert_eq!(live.len(), 1, "exactly one pair valid");
    assert_eq!(live_refresh_tokens(&a, creds.worker_id).await, 1);
    let new = live[0];
    assert_eq!(new.worker_id, creds.worker_id);
    assert_ne!(new.refresh_token, creds.refresh_token);
    let newer = a.refresh(&new.refresh_token).await.unwrap();
    // The survivor refreshed: the old token again is a reuse.
    let again = a.refresh(&creds.refresh_token).await;
    assert_eq!(again.unwrap_err().code(), Some(ErrorCode::Unauthorized));
    assert!(
        !valid(&a, &newer).await,
        "reuse revoked the worker's credentials"
    );
    let used = a.refresh(&newer.refresh_token).await;
    assert_eq!(used.unwrap_err().code(), Some(ErrorCode::Unauthorized));
}

/// The answer to an enrollment or a refresh is lost after the server
/// committed it; the client sends the same token again and gets working
/// credentials for the same worker, and the lost ones stop working. (Before,
/// the token was burnt and the worker locked out for good.) Without a replay
/// grace the second use is refused and revokes the worker's credentials.
pub async fn a_lost_enrollment_or_refresh_answer_can_be_sent_again(db: TestDb) {
    let store = db.store(Settings::default()).await;
    let (token, _) = store
        .create_enrollment_token(None, Role::Worker, &[ANY_QUEUE.into()])
        .await
        .unwrap();
    let lost = store.enroll(&token.0, Some("w")).await.unwrap();
    let got = store.enroll(&token.0, Some("w")).await.unwrap();
    assert_eq!(got.worker_id, lost.worker_id);
    assert_eq!(workers(&store).await, 1);
    assert!(!valid(&store, &lost).await);
    // Only the new pair's refresh token is usable (the lost one is kept as
    // revoked: presenting it would be reuse, see the test below).
    assert_eq!(live_refresh_tokens(&store, got.worker_id).await, 1);
    assert!(valid(&store, &got).await);
    let lost2 = store.refresh(&got.refresh_token).await.unwrap();
    let got2 = store.refresh(&got.refresh_token).await.unwrap();
    assert_eq!(got2.worker_id, got.worker_id);
    assert!(!valid(&store, &lost2).await);
    assert!(valid(&store, &got2).await);
    store.refresh(&got2.refresh_token).await.unwrap();

    let strict = db
        .store(Settings {
            replay_grace_ms: 0,
            ..Settings::default()
        })
        .await;
    let (token, _) = strict
        .create_enrollment_token(None, Role::Worker, &[ANY_QUEUE.into()])
        .await
        .unwrap();
    let c = strict.enroll(&token.0, None).await.unwrap();
    let r = strict.refresh(&c.refresh_token).await.unwrap();
    let e = strict.refresh(&c.refresh_token).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::Unauthorized));
    assert!(
        !valid(&strict, &r).await,
        "reuse revoked the worker's credentials"
    );
}

/// A copy of an enrollment or a refresh that reaches the server after a
/// later copy of it was answered (its request held up in the network while
/// the client gave up on it and sent the token again, with a higher
/// `Request-Attempt`) is refused, `409 conflict`, and changes nothing: the
/// credentials the later copy issued, which the client holds, stay valid
/// and refresh on. Before, the late copy was taken for a replay and revoked
/// them, and the worker was locked out (its refresh token revoked, and
/// presenting it again was reuse). The same attempt sent again (a browser's
/// resend of the POST) is still a replay. Late is judged against the
/// copy's own sender, whoever used the token since: a page's held-up copy
/// 50 arriving after its copy 51 was answered AND a reloaded page (another
/// sender) replayed the token is refused too, and revokes nothing the
/// replay issued, also once those credentials refreshed (no reuse
/// detected). Over HTTP too.
pub async fn a_late_copy_of_an_enrollment_or_refresh_never_revokes_what_a_later_copy_issued(
    db: TestDb,
) {
    let store = db.store(Settings::default()).await;
    let (token, _) = store
        .create_enrollment_token(None, Role::Worker, &[ANY_QUEUE.into()])
        .await
        .unwrap();
    let got = store
        .enroll_attempt(&token.0, Some("w"), Some(&at("page", 2)))
        .await
        .unwrap();
    let late = store
        .enroll_attempt(&token.0, Some("w"), Some(&at("page", 1)))
        .await;
    assert_eq!(late.unwrap_err().code(), Some(ErrorCode::Conflict));
    assert!(valid(&store, &got).await, "copy 2's credentials stand");
    assert_eq!(workers(&store).await, 1);
    assert_eq!(live_refresh_tokens(&store, got.worker_id).await, 1);
    let resent = store
        .enroll_attempt(&token.0, Some("w"), Some(&at("page", 2)))
        .await
        .expect("the same attempt again is a replay");
    assert_eq!(resent.worker_id, got.worker_id);
    assert!(!valid(&store, &got).await && valid(&store, &resent).await);

    let r = store
        .refresh_attempt(&resent.refresh_token, Some(&at("page", 5)))
        .await
        .unwrap();
    let late = store
        .refresh_attempt(&resent.refresh_token, Some(&at("page", 4)))
        .await;
    assert_eq!(late.unwrap_err().code(), Some(ErrorCode::Conflict));
    assert!(valid(&store, &r).await, "copy 5's credentials stand");
    let next = store
        .refresh_attempt(&r.refresh_token, Some(&at("page", 6)))
        .await
        .expect("and refresh on");
    assert!(valid(&store, &next).await);
    assert_eq!(live_refresh_tokens(&store, got.worker_id).await, 1);

    // The page had sent many requests when its refresh answer was lost;
    // reloaded, it sends the refresh token it had saved again, numbered
    // from 1 by its new sender id: a replay, as before the header.
    let lost = store
        .refresh_attempt(&next.refresh_token, Some(&at("page", 51)))
        .await
        .unwrap();
    let reloaded = store
        .refresh_attempt(&next.refresh_token, Some(&at("reloaded", 1)))
        .await
        .expect("another sender's copy is a replay");
    assert_eq!(reloaded.worker_id, got.worker_id);
    assert!(!valid(&store, &lost).await && valid(&store, &reloaded).await);
    // A copy the page sent before 51, held up in the network, arrives
    // after the reloaded page's replay: late for its own sender (51 was
    // answered), whoever used the token last. Refused; it revokes nothing
    // the replay issued, so the reloaded page refreshes on (before, it was
    // taken for a replay: the reloaded page's pair was revoked and its next
    // refresh revoked the whole worker).
    let held = store
        .refresh_attempt(&next.refresh_token, Some(&at("page", 50)))
        .await;
    assert_eq!(held.unwrap_err().code(), Some(ErrorCode::Conflict));
    assert!(
        valid(&store, &reloaded).await,
        "the reloaded page's credentials stand"
    );
    assert_eq!(live_refresh_tokens(&store, got.worker_id).await, 1);
    let (token2, _) = store
        .create_enrollment_token(None, Role::Worker, &[ANY_QUEUE.into()])
        .await
        .unwrap();
    store
        .enroll_attempt(&token2.0, None, Some(&at("page", 51)))
        .await
        .unwrap();
    let again = store
        .enroll_attempt(&token2.0, None, Some(&at("reloaded", 1)))
        .await
        .expect("another sender's enrollment copy is a replay");
    assert!(valid(&store, &again).await);
    let held = store
        .enroll_attempt(&token2.0, None, Some(&at("page", 50)))
        .await;
    assert_eq!(held.unwrap_err().code(), Some(ErrorCode::Conflict));
    assert!(
        valid(&store, &again).await,
        "the reloaded page's enrollment stands"
    );
    assert_eq!(live_refresh_tokens(&store, again.worker_id).await, 1);
    // Once the reloaded page refreshed, a still older copy is refused
    // the same way, not taken for reuse (which revoked the worker).
    let on = store
        .refresh_attempt(&again.refresh_token, Some(&at("reloaded", 2)))
        .await
        .unwrap();
    let held = store
        .enroll_attempt(&token2.0, None, Some(&at("page", 49)))
        .await;
    assert_eq!(held.unwrap_err().code(), Some(ErrorCode::Conflict));
    assert!(valid(&store, &on).await, "no reuse detected");
    let next = reloaded;

    // Over HTTP.
    let server = http_server(&db).await;
    let http = reqwest::Client::new();
    let refresh = |token: String, attempt: &'static str| {
        let req = http
            .post(format!("{}/v1/workers/refresh", server.url()))
            .header("Request-Attempt", attempt)
            .json(&json!({ "refresh_token": token }));
        async move {
            let resp = req.send().await.unwrap();
            let status = resp.status().as_u16();
            let body: serde_json::Value = resp.json().await.unwrap_or_default();
            (status, body)
        }
    };
    let (s, fresh) = refresh(next.refresh_token.clone(), "h.8").await;
    assert_eq!(s, 200, "{fresh}");
    let (s, e) = refresh(next.refresh_token.clone(), "h.7").await;
    assert_eq!((s, e["code"].as_str()), (409, Some("conflict")));
    let (s, e) = refresh(next.refresh_token.clone(), "7").await;
    assert_eq!((s, e["code"].as_str()), (400, Some("validation")));
    let access = fresh["access_token"].as_str().unwrap();
    assert!(store.authenticate(access).await.is_ok());
    // Copy 6 of the first refresh, held up until after the pair copy 8
    // issued refreshed (copy 9): refused, and no reuse detected (the
    // worker's pair stands).
    let (s, on) = refresh(fresh["refresh_token"].as_str().unwrap().into(), "h.9").await;
    assert_eq!(s, 200, "{on}");
    let (s, e) = refresh(next.refresh_token.clone(), "h.6").await;
    assert_eq!((s, e["code"].as_str()), (409, Some("conflict")), "{e}");
    assert!(store
        .authenticate(on["access_token"].as_str().unwrap())
        .await
        .is_ok());
    server.stop().await.unwrap();
}

/// The numbers remembered per single-use token and sender (so that a late
/// copy is told by its own sender's numbers) live as long as their token:
/// written with its expiry, and purged with it. (Expiry forced by hand:
/// no wait.)
pub async fn remembered_token_attempts_are_purged_with_their_token(db: TestDb) {
    let store = db.store(Settings::default()).await;
    let (token, _) = store
        .create_enrollment_token(None, Role::Worker, &[ANY_QUEUE.into()])
        .await
        .unwrap();
    store
        .enroll_attempt(&token.0, None, Some(&at("page", 3)))
        .await
        .unwrap();
    let c = store
        .enroll_attempt(&token.0, None, Some(&at("reloaded", 1)))
        .await
        .expect("a replay");
    store
        .refresh_attempt(&c.refresh_token, Some(&at("reloaded", 2)))
        .await
        .unwrap();
    let rows = |sql: &'static str| {
        let pool = store.pool().clone();
        async move {
            let (n,): (i64,) = sqlx::query_as(sql).fetch_one(&pool).await.unwrap();
            n
        }
    };
    assert_eq!(
        rows("SELECT COUNT(*) FROM token_attempts").await,
        3,
        "one per token and sender"
    );
    assert_eq!(
        rows(
            "SELECT COUNT(*) FROM token_attempts a
             WHERE a.expires_at = (SELECT expires_at FROM enrollment_tokens WHERE selector = a.selector)
                OR a.expires_at = (SELECT expires_at FROM refresh_tokens WHERE selector = a.selector)"
        )
        .await,
        3,
        "each expires with its token"
    );
    let expire = |table: &'static str| {
        let pool = store.pool().clone();
        async move {
            sqlx::query(&format!("UPDATE {table} SET expires_at = 0"))
                .execute(&pool)
                .await
                .unwrap();
        }
    };
    for table in ["enrollment_tokens", "refresh_tokens", "token_attempts"] {
        expire(table).await;
    }
    store.purge_credentials().await.unwrap();
    assert_eq!(rows("SELECT COUNT(*) FROM token_attempts").await, 0);
}

/// The largest `Request-Attempt` number a client may send (2^53−1).
const MAX_ATTEMPT: i64 = (1 << 53) - 1;

/// Moves every use of `worker`'s tokens in `table` (`refresh_tokens` or
/// `enrollment_tokens`) `ms` into the past: the replay grace runs out
/// without a wait.
async fn age_uses(store: &Store, table: &str, worker: i64, ms: i64) {
    sqlx::query(&format!(
        "UPDATE {table} SET used_at = used_at - $1 WHERE worker_id = $2 AND used_at IS NOT NULL"
    ))
    .bind(ms)
    .bind(worker)
    .execute(store.pool())
    .await
    .unwrap();
}

/// Someone who got hold of a worker's unused refresh token uses it first,
/// in the name of the worker's page (its sender id travels in plain sight
/// in every `Request-Attempt`) with the highest number there is. A copy
/// is late for its sender, `409` and nothing changed, only within the
/// replay grace (a copy held up in the network cannot arrive later than
/// its request's timeout): once the grace ran out the page's own use of
/// the token is reuse, `401`, and revokes the worker, the taker's
/// credentials included. Within the grace a copy late for its sender stays
/// `409` also once the credentials moved on (as it must for a genuinely
/// held-up copy), so the taker's number buys at most the grace: the page's
/// next try after it revokes the worker. Before, the forged number made
/// every later use of the token by the page a "late copy", `409` for good,
/// and the taker's credentials stayed valid. Over HTTP too.
pub async fn a_refresh_token_reused_after_the_grace_revokes_the_worker_whatever_attempt_number_came_first(
    db: TestDb,
) {
    let store = db.store(Settings::default()).await;
    let (token, _) = store
        .create_enrollment_token(None, Role::Worker, &[ANY_QUEUE.into()])
        .await
        .unwrap();
    let page = store
        .enroll_attempt(&token.0, Some("w"), Some(&at("page", 1)))
        .await
        .unwrap();
    let taker = store
        .refresh_attempt(&page.refresh_token, Some(&at("page", MAX_ATTEMPT)))
        .await
        .expect("the first use of the token");
    age_uses(&store, "refresh_tokens", page.worker_id, 61_000).await;
    let back = store
        .refresh_attempt(&page.refresh_token, Some(&at("page", 2)))
        .await;
    assert_eq!(
        back.unwrap_err().code(),
        Some(ErrorCode::Unauthorized),
        "reuse after the grace, whatever number came first"
    );
    assert!(!valid(&store, &taker).await, "the taker's pair is revoked");
    assert_eq!(live_refresh_tokens(&store, page.worker_id).await, 0);
    let r = store
        .refresh_attempt(&taker.refresh_token, Some(&at("taker", 1)))
        .await;
    assert_eq!(r.unwrap_err().code(), Some(ErrorCode::Unauthorized));

    // The taker also refreshes what it got at once (the credentials moved
    // on): within the grace the page's copy is late for its sender, 409
    // and nothing changed; its next try after the grace is reuse.
    let (token, _) = store
        .create_enrollment_token(None, Role::Worker, &[ANY_QUEUE.into()])
        .await
        .unwrap();
    let page = store
        .enroll_attempt(&token.0, Some("w"), Some(&at("page", 3)))
        .await
        .unwrap();
    let taken = store
        .refresh_attempt(&page.refresh_token, Some(&at("page", MAX_ATTEMPT)))
        .await
        .unwrap();
    let taker = store
        .refresh_attempt(&taken.refresh_token, Some(&at("taker", 1)))
        .await
        .unwrap();
    let held = store
        .refresh_attempt(&page.refresh_token, Some(&at("page", 4)))
        .await;
    assert_eq!(held.unwrap_err().code(), Some(ErrorCode::Conflict));
    assert!(valid(&store, &taker).await, "nothing changed");
    age_uses(&store, "refresh_tokens", page.worker_id, 61_000).await;
    let back = store
        .refresh_attempt(&page.refresh_token, Some(&at("page", 5)))
        .await;
    assert_eq!(back.unwrap_err().code(), Some(ErrorCode::Unauthorized));
    assert!(!valid(&store, &taker).await, "the taker's pair is revoked");
    assert_eq!(live_refresh_tokens(&store, page.worker_id).await, 0);

    // Over HTTP, with the number as the header carries it.
    let server = http_server(&db).await;
    let http = reqwest::Client::new();
    let refresh = |token: String, attempt: String| {
        let req = http
            .post(format!("{}/v1/workers/refresh", server.url()))
            .header("Request-Attempt", attempt)
            .json(&json!({ "refresh_token": token }));
        async move {
            let resp = req.send().await.unwrap();
            let status = resp.status().as_u16();
            let body: serde_json::Value = resp.json().await.unwrap_or_default();
            (status, body)
        }
    };
    let (token, _) = store
        .create_enrollment_token(None, Role::Worker, &[ANY_QUEUE.into()])
        .await
        .unwrap();
    let page = store
        .enroll_attempt(&token.0, Some("w"), Some(&at("page", 6)))
        .await
        .unwrap();
    let (s, taker) = refresh(page.refresh_token.clone(), format!("page.{MAX_ATTEMPT}")).await;
    assert_eq!(s, 200, "{taker}");
    age_uses(&store, "refresh_tokens", page.worker_id, 61_000).await;
    let (s, e) = refresh(page.refresh_token.clone(), "page.7".into()).await;
    assert_eq!((s, e["code"].as_str()), (401, Some("unauthorized")), "{e}");
    let (s, e) = refresh(
        taker["refresh_token"].as_str().unwrap().into(),
        "taker.1".into(),
    )
    .await;
    assert_eq!((s, e["code"].as_str()), (401, Some("unauthorized")), "{e}");
    assert_eq!(live_refresh_tokens(&store, page.worker_id).await, 0);
    server.stop().await.unwrap();
}

/// As the test above, for an enrollment token someone got hold of before
/// it was used: enrolling with it first in the page's name with the
/// highest number does not make the page's own use of it, once the replay
/// grace ran out, a late copy. That use is reuse, `401`, and revokes the
/// worker the taker enrolled. Within the grace it is `409`, also once the
/// taker refreshed, and its next try after the grace revokes the worker.
pub async fn an_enrollment_token_reused_after_the_grace_revokes_the_worker_whatever_attempt_number_came_first(
    db: TestDb,
) {
    let store = db.store(Settings::default()).await;
    let (token, _) = store
        .create_enrollment_token(None, Role::Worker, &[ANY_QUEUE.into()])
        .await
        .unwrap();
    let taker = store
        .enroll_attempt(&token.0, Some("w"), Some(&at("page", MAX_ATTEMPT)))
        .await
        .expect("the first use of the token");
    age_uses(&store, "enrollment_tokens", taker.worker_id, 61_000).await;
    let back = store
        .enroll_attempt(&token.0, Some("w"), Some(&at("page", 1)))
        .await;
    assert_eq!(
        back.unwrap_err().code(),
        Some(ErrorCode::Unauthorized),
        "reuse after the grace, whatever number came first"
    );
    assert!(!valid(&store, &taker).await, "the taker's pair is revoked");
    assert_eq!(live_refresh_tokens(&store, taker.worker_id).await, 0);
    let r = store
        .refresh_attempt(&taker.refresh_token, Some(&at("taker", 1)))
        .await;
    assert_eq!(r.unwrap_err().code(), Some(ErrorCode::Unauthorized));
    assert_eq!(workers(&store).await, 1, "no worker enrolled again");

    let (token, _) = store
        .create_enrollment_token(None, Role::Worker, &[ANY_QUEUE.into()])
        .await
        .unwrap();
    let taken = store
        .enroll_attempt(&token.0, Some("w"), Some(&at("page", MAX_ATTEMPT)))
        .await
        .unwrap();
    let taker = store
        .refresh_attempt(&taken.refresh_token, Some(&at("taker", 1)))
        .await
        .unwrap();
    let held = store
        .enroll_attempt(&token.0, Some("w"), Some(&at("page", 2)))
        .await;
    assert_eq!(held.unwrap_err().code(), Some(ErrorCode::Conflict));
    assert!(valid(&store, &taker).await, "nothing changed");
    age_uses(&store, "enrollment_tokens", taker.worker_id, 61_000).await;
    let back = store
        .enroll_attempt(&token.0, Some("w"), Some(&at("page", 3)))
        .await;
    assert_eq!(back.unwrap_err().code(), Some(ErrorCode::Unauthorized));
    assert!(!valid(&store, &taker).await, "the taker's pair is revoked");
    assert_eq!(live_refresh_tokens(&store, taker.worker_id).await, 0);
    assert_eq!(workers(&store).await, 2);
}

/// Someone else sends a used token within the replay grace (it was copied
/// or intercepted): the replay hands them credentials and revokes the
/// holder's. When the holder comes back with its now-revoked refresh token,
/// that is reuse: every credential of the worker is revoked — the other
/// party's too — and the enrollment token cannot enroll it again.
pub async fn a_replayed_token_is_detected_when_its_holder_comes_back(db: TestDb) {
    let store = db.store(Settings::default()).await;
    let (token, _) = store
        .create_enrollment_token(None, Role::Worker, &[ANY_QUEUE.into()])
        .await
        .unwrap();
    let first = store.enroll(&token.0, None).await.unwrap();
    let holder = store.refresh(&first.refresh_token).await.unwrap();
    let taker = store.refresh(&first.refresh_token).await.unwrap();
    assert!(valid(&store, &taker).await);
    assert!(
        !valid(&store, &holder).await,
        "the replay revoked the holder's pair"
    );
    let back = store.refresh(&holder.refresh_token).await;
    assert_eq!(back.unwrap_err().code(), Some(ErrorCode::Unauthorized));
    assert!(
        !valid(&store, &taker).await,
        "reuse revoked the taker's pair too"
    );
    assert_eq!(live_refresh_tokens(&store, first.worker_id).await, 0);
    let r = store.refresh(&taker.refresh_token).await;
    assert_eq!(r.unwrap_err().code(), Some(ErrorCode::Unauthorized));
    let r = store.enroll(&token.0, None).await;
    assert_eq!(
        r.unwrap_err().code(),
        Some(ErrorCode::Unauthorized),
        "the enrollment token was revoked with the worker"
    );
    assert_eq!(live_refresh_tokens(&store, first.worker_id).await, 0);
}

pub async fn a_wrong_verifier_neither_enrolls_nor_burns_the_token(db: TestDb) {
    let store = db.store(Settings::default()).await;
    let (token, _) = store
        .create_enrollment_token(None, Role::Worker, &[ANY_QUEUE.into()])
        .await
        .unwrap();
    // Same selector, different verifier.
    let (selector, verifier) = token.0.split_once('.').unwrap();
    let flipped = if verifier.starts_with('0') { "1" } else { "0" };
    let forged = format!("{selector}.{flipped}{}", &verifier[1..]);
    let r = store.enroll(&forged, None).await;
    assert_eq!(r.unwrap_err().code(), Some(ErrorCode::Unauthorized));
    for junk in ["", "ase_", "asr_0000000000000000.00", "not a token"] {
        let r = store.enroll(junk, None).await;
        assert_eq!(r.unwrap_err().code(), Some(ErrorCode::Unauthorized));
    }
    assert_eq!(workers(&store).await, 0);
    store
        .enroll(&token.0, None)
        .await
        .expect("the real token still works");
    let creds_err = store.authenticate(&forged).await;
    assert_eq!(creds_err.unwrap_err().code(), Some(ErrorCode::Unauthorized));
}

/// Access tokens expire on the database clock, the refresh token outlives
/// them and issues a working one, and an enrollment token past its own
/// expiry is refused. What must succeed runs on a store with a long access
/// TTL; only the expiry uses a short one (1 s, the shortest accepted), and
/// it is awaited (bounded) rather than slept for: before, a stall of 1 s
/// between enroll and the first `authenticate` failed the test.
pub async fn access_tokens_expire_on_the_database_clock(db: TestDb) {
    let store = db.store(Settings::default()).await;
    let short = db
        .store(Settings {
            access_ttl_ms: 1_000,
            ..Settings::default()
        })
        .await;
    let (token, _) = store
        .create_enrollment_token(None, Role::Worker, &[ANY_QUEUE.into()])
        .await
        .unwrap();
    let creds = store.enroll(&token.0, None).await.unwrap();
    assert_eq!(
        store
            .authenticate(&creds.access_token)
            .await
            .unwrap()
            .worker_id,
        creds.worker_id,
        "an access token of the default TTL works"
    );
    // A 1 s access token expires: it is refused within a bound, whatever
    // the machine's load (only the refusal is asserted: whether it still
    // works at first depends on how soon after enroll the check runs).
    let (token, _) = store
        .create_enrollment_token(None, Role::Worker, &[ANY_QUEUE.into()])
        .await
        .unwrap();
    let creds = short.enroll(&token.0, None).await.unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        match short.authenticate(&creds.access_token).await {
            Err(e) => {
                assert_eq!(e.code(), Some(ErrorCode::Unauthorized));
                break;
            }
            Ok(_) => assert!(
                std::time::Instant::now() < deadline,
                "a 1 s access token still works after 30 s"
            ),
        }
        sleep_ms(100).await;
    }
    // The refresh token outlives it and issues a working one (on the store
    // with the default TTL, so that a stall cannot expire it at once).
    let fresh = store.refresh(&creds.refresh_token).await.unwrap();
    assert_eq!(
        store
            .authenticate(&fresh.access_token)
            .await
            .unwrap()
            .worker_id,
        creds.worker_id
    );
    // An enrollment token past its own expiry is refused.
    let (late, _) = store
        .create_enrollment_token(Some(50), Role::Worker, &[ANY_QUEUE.into()])
        .await
        .unwrap();
    sleep_ms(150).await;
    assert_eq!(
        store.enroll(&late.0, None).await.unwrap_err().code(),
        Some(ErrorCode::Unauthorized)
    );
    assert!(
        store.purge_credentials().await.unwrap() >= 2,
        "expired rows are swept"
    );
    short.close().await;
}

/// A well-formed credential of `prefix` with random selector and verifier.
fn random_token(prefix: &str) -> String {
    let mut b = [0u8; 40];
    rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut b);
    format!("{prefix}{}.{}", hex::encode(&b[..8]), hex::encode(&b[8..]))
}

pub async fn random_and_forged_tokens_open_no_write_transaction(db: TestDb) {
    let server = http_server(&db).await;
    let store = server.store().clone();
    let (real, _) = store
        .create_enrollment_token(None, Role::Worker, &[ANY_QUEUE.into()])
        .await
        .unwrap();
    // Same selector as the real one, wrong verifier.
    let (selector, _) = real.0.split_once('.').unwrap();
    let forged = format!("{selector}.{}", "0".repeat(64));
    let http = reqwest::Client::new();
    let before = store.write_transactions();
    for i in 0..100 {
        let (path, body) = match i % 3 {
            0 => ("enroll", json!({"token": random_token("ase_")})),
            1 => ("refresh", json!({"refresh_token": random_token("asr_")})),
            _ => ("enroll", json!({"token": forged})),
        };
        let resp = http
            .post(format!("{}/v1/workers/{path}", server.url()))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 401, "{path} with {body}");
    }
    assert_eq!(
        store.write_transactions(),
        before,
        "no write transaction for a token that does not match"
    );
    assert_eq!(workers(&store).await, 0);
    let resp = http
        .post(format!("{}/v1/workers/enroll", server.url()))
        .json(&json!({"token": real.0}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201, "the real token still enrolls");
    assert_eq!(store.write_transactions(), before + 1, "exactly one for it");
    server.stop().await.unwrap();
}

/// Requests each of the 16 flooding tasks sends.
const FLOOD_PER_TASK: u32 = 150;

/// 2,400 enrolls with random tokens from one address, while a worker
/// heartbeats: most are refused `429` before the database, and every
/// heartbeat is answered `200`. The limit is 20 a minute, so that its
/// refill stays small beside the flood however long the flood takes on a
/// loaded machine (with 20 a second, a flood that took 40 s refilled the
/// bucket some 800 times and came near the "most are refused" bound).
pub async fn a_flood_of_random_tokens_is_refused_while_every_heartbeat_is_answered(db: TestDb) {
    let mut config = db.config();
    config.auth_rate = "20/min".parse().unwrap();
    let server = agentstore_server::Server::start(&config).await.unwrap();
    let store = server.store().clone();
    let (t, _) = store
        .create_enrollment_token(None, Role::Worker, &["q".into()])
        .await
        .unwrap();
    let creds = store.enroll(&t.0, None).await.unwrap();
    let item = store.enqueue("q", &json!(1), None).await.unwrap();
    let lease = store
        .claim("q", Some(creds.worker_id))
        .await
        .unwrap()
        .unwrap()
        .lease;
    let base = server.url();
    let flooding = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let (started_tx, started_rx) = tokio::sync::oneshot::channel::<()>();
    let mut started_tx = Some(started_tx);
    let mut flood = Vec::new();
    for n in 0..16 {
        let base = base.clone();
        let started = if n == 0 { started_tx.take() } else { None };
        flood.push(tokio::spawn(async move {
            let http = reqwest::Client::new();
            let (mut limited, mut rejected) = (0u32, 0u32);
            let mut started = started;
            for _ in 0..FLOOD_PER_TASK {
                let resp = http
                    .post(format!("{base}/v1/workers/enroll"))
                    .json(&json!({"token": random_token("ase_")}))
                    .send()
                    .await
                    .unwrap();
                match resp.status().as_u16() {
                    429 => {
                        assert!(resp.headers().contains_key("retry-after"));
                        limited += 1;
                    }
                    401 => rejected += 1,
                    other => panic!("flood answered {other}"),
                }
                if let Some(tx) = started.take() {
                    let _ = tx.send(());
                }
            }
            (limited, rejected)
        }));
    }
    started_rx.await.unwrap();
    let http = reqwest::Client::new();
    let (mut beats, mut during) = (0, 0);
    let watcher = {
        let flooding = flooding.clone();
        tokio::spawn(async move {
            let mut totals = (0, 0);
            for f in flood {
                let (l, r) = f.await.unwrap();
                totals = (totals.0 + l, totals.1 + r);
            }
            flooding.store(false, std::sync::atomic::Ordering::SeqCst);
            totals
        })
    };
    while flooding.load(std::sync::atomic::Ordering::SeqCst) || beats < 20 {
        let resp = http
            .post(format!("{base}/v1/items/{}/heartbeat", item.id))
            .bearer_auth(&creds.access_token)
            .json(&json!({"token": lease.token}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "heartbeat {beats} during the flood");
        beats += 1;
        if flooding.load(std::sync::atomic::Ordering::SeqCst) {
            during += 1;
        }
    }
    let (limited, rejected) = watcher.await.unwrap();
    eprintln!(
        "flood: {limited} refused with 429, {rejected} checked (401); \
         {during} of {beats} heartbeats answered during it"
    );
    assert_eq!(limited + rejected, 16 * FLOOD_PER_TASK);
    assert!(during >= 5, "heartbeats ran during the flood ({during})");
    assert!(
        limited > rejected * 2,
        "most of the flood is refused before the database ({limited} vs {rejected})"
    );
    server.stop().await.unwrap();
}

/// Reuse of a refresh token revokes every credential of the worker, and on
/// the instance that saw the reuse an access token it verified a moment ago
/// (and so holds in its cache of verified tokens) is refused at once, not
/// when the cache entry ages out. Likewise after a replay, for the access
/// token the replay revoked.
pub async fn a_revoked_access_token_is_refused_at_once_though_it_was_just_verified(db: TestDb) {
    let server = http_server(&db).await;
    let http = reqwest::Client::new();
    let base = server.url().to_owned();
    let refresh = |token: String| {
        let http = http.clone();
        let base = base.clone();
        async move {
            http.post(format!("{base}/v1/workers/refresh"))
                .json(&json!({ "refresh_token": token }))
                .send()
                .await
                .unwrap()
        }
    };
    let claim = |access: String| {
        let http = http.clone();
        let base = base.clone();
        async move {
            http.post(format!("{base}/v1/queues/revoke-cache/claims"))
                .bearer_auth(access)
                .json(&json!({}))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    let creds = |r: reqwest::Response| async move {
        assert_eq!(r.status(), 200);
        r.json::<agentstore_protocol::lease::WorkerCredentials>()
            .await
            .unwrap()
    };

    // Replay: the first use's access token was verified (cached), then the
    // same refresh token is sent again within the grace.
    let first = crate::common::enroll(&http, &base).await;
    let a = creds(refresh(first.refresh_token.clone()).await).await;
    assert_eq!(
        claim(a.access_token.clone()).await,
        204,
        "verified and cached"
    );
    let b = creds(refresh(first.refresh_token.clone()).await).await;
    assert_eq!(
        claim(a.access_token.clone()).await,
        401,
        "revoked by the replay"
    );
    assert_eq!(claim(b.access_token.clone()).await, 204);

    // Reuse: R1 → R2 → R3, the newest access token verified (cached), then
    // R1 comes back.
    let first = crate::common::enroll(&http, &base).await;
    let second = creds(refresh(first.refresh_token.clone()).await).await;
    let third = creds(refresh(second.refresh_token.clone()).await).await;
    assert_eq!(
        claim(third.access_token.clone()).await,
        204,
        "verified and cached"
    );
    assert_eq!(refresh(first.refresh_token.clone()).await.status(), 401);
    assert_eq!(
        claim(third.access_token.clone()).await,
        401,
        "every credential of the worker is revoked, cached or not"
    );
    server.stop().await.unwrap();
}
