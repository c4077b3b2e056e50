//! Enrollment, refresh and access tokens.

use std::sync::Arc;

use agentstore_protocol::lease::{Role, ANY_QUEUE};
use agentstore_protocol::ErrorCode;
use agentstore_server::{Settings, Store, StoreError};
use tokio::sync::Barrier;

use crate::common::{sleep_ms, TestDb};

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
        assert_eq!(
            ok.len(),
            1,
            "round {round}: exactly one enrollment succeeds"
        );
        let rejected = results
            .iter()
            .find_map(|r| r.as_ref().err())
            .expect("one rejected");
        assert_eq!(rejected.code(), Some(ErrorCode::Unauthorized));
        assert_eq!(
            a.authenticate(&ok[0].access_token).await.unwrap().worker_id,
            ok[0].worker_id
        );
        assert_eq!(workers(&a).await, round, "one worker per token");
    }
}

pub async fn a_refresh_token_used_twice_gets_one_success_and_one_rejection(db: TestDb) {
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
    assert_eq!(ok.len(), 1, "exactly one refresh succeeds");
    let rejected = results
        .iter()
        .find_map(|r| r.as_ref().err())
        .expect("one rejected");
    assert_eq!(rejected.code(), Some(ErrorCode::Unauthorized));
    let new = ok[0];
    assert_eq!(new.worker_id, creds.worker_id);
    assert_ne!(new.refresh_token, creds.refresh_token);
    assert_eq!(
        a.authenticate(&new.access_token).await.unwrap().worker_id,
        creds.worker_id
    );
    // Later reuse of the old one is still rejected; the rotated one works once.
    let again = a.refresh(&creds.refresh_token).await;
    assert_eq!(again.unwrap_err().code(), Some(ErrorCode::Unauthorized));
    a.refresh(&new.refresh_token).await.unwrap();
    let used = a.refresh(&new.refresh_token).await;
    assert_eq!(used.unwrap_err().code(), Some(ErrorCode::Unauthorized));
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

pub async fn access_tokens_expire_on_the_database_clock(db: TestDb) {
    let store = db
        .store(Settings {
            access_ttl_ms: 1_000,
            ..Settings::default()
        })
        .await;
    let (token, _) = store
        .create_enrollment_token(Some(5_000), Role::Worker, &[ANY_QUEUE.into()])
        .await
        .unwrap();
    let creds = store.enroll(&token.0, None).await.unwrap();
    assert_eq!(
        store
            .authenticate(&creds.access_token)
            .await
            .unwrap()
            .worker_id,
        creds.worker_id
    );
    sleep_ms(1_200).await;
    let expired = store.authenticate(&creds.access_token).await;
    assert_eq!(expired.unwrap_err().code(), Some(ErrorCode::Unauthorized));
    // The refresh token outlives it and issues a working one.
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
}
