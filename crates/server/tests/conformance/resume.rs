//! An operator's resume sent again, and resumes racing each other, a claim
//! and the reaper.

use std::sync::Arc;

use agentstore_protocol::lease::{ItemState, SettleState};
use agentstore_protocol::ErrorCode;
use agentstore_server::store::Resumed;
use agentstore_server::Store;
use serde_json::json;

use crate::common::{at_once, ttl, TestDb};
use crate::lease::{code, snapshot};

const LONG: u64 = 60_000;

/// An item of `queue` claimed and then paused by its own worker: resumable.
async fn paused_item(store: &Store, queue: &str) -> i64 {
    let item = store.enqueue(queue, &json!(1), None).await.unwrap();
    let c = store.claim(queue, None).await.unwrap().expect("claimed");
    store
        .settle(
            item.id,
            &c.lease.token,
            None,
            SettleState::Paused,
            None,
            None,
        )
        .await
        .unwrap();
    item.id
}

fn again(r: &Resumed) -> Option<(ItemState, i64)> {
    match r {
        Resumed::Again { state, epoch, .. } => Some((*state, *epoch)),
        _ => None,
    }
}

pub async fn a_resume_sent_again_after_it_landed_is_answered_and_changes_nothing(db: TestDb) {
    let store = db.store(ttl(LONG)).await;
    let id = paused_item(&store, "q").await;
    let first = store.resume_reporting(id, None).await.unwrap();
    let Resumed::Claimed(first) = first else {
        panic!("the first resume resumes: {first:?}")
    };
    let token = first.lease.token;
    let before = snapshot(&store, id).await;

    // Its answer lost, the operator sends it again: answered that it
    // landed, nothing changed, and the lease it handed out stays current.
    let second = store.resume_reporting(id, None).await.unwrap();
    assert_eq!(again(&second), Some((ItemState::Running, 2)));
    assert_eq!(
        serde_json::to_value(&second).unwrap(),
        json!({"id": id, "state": "running", "epoch": 2, "replayed": true})
    );
    assert_eq!(snapshot(&store, id).await, before, "nothing written");
    store.heartbeat(id, &token, None).await.unwrap();

    // Still a replay once that lease settled the item: the resume did land.
    store
        .settle(id, &token, None, SettleState::Done, None, None)
        .await
        .unwrap();
    let late = store.resume_reporting(id, None).await.unwrap();
    assert_eq!(again(&late), Some((ItemState::Done, 2)));
    // `Store::resume` (which must hand out a lease) refuses it plainly.
    assert_eq!(code(store.resume(id, None).await), ErrorCode::Conflict);

    // An item running under a claim was never resumed: still a conflict,
    // as is a resume of an item a claim took after a resume.
    let other = store.enqueue("q", &json!(2), None).await.unwrap();
    store.claim("q", None).await.unwrap().expect("claimed");
    assert_eq!(
        code(store.resume_reporting(other.id, None).await),
        ErrorCode::Conflict
    );
    let third = paused_item(&store, "r").await;
    let t = store.resume(third, None).await.unwrap().lease.token;
    store.release(third, &t, None).await.unwrap();
    store
        .claim("r", None)
        .await
        .unwrap()
        .expect("claimed again");
    assert_eq!(
        code(store.resume_reporting(third, None).await),
        ErrorCode::Conflict,
        "a later claim's lease is not that resume's"
    );
}

pub async fn two_operators_resuming_at_once_get_one_lease_and_one_replay(db: TestDb) {
    const ROUNDS: usize = 20;
    // Each operator's resume goes through its own instance.
    let a = Arc::new(db.store(ttl(LONG)).await);
    let b = Arc::new(db.store(ttl(LONG)).await);
    for _ in 0..ROUNDS {
        let id = paused_item(&a, "q").await;
        let stores = [a.clone(), b.clone()];
        let out = at_once(2, |k| {
            let store = stores[k].clone();
            async move { store.resume_reporting(id, None).await.unwrap() }
        })
        .await;
        let leases: Vec<_> = out
            .iter()
            .filter_map(|r| match r {
                Resumed::Claimed(c) => Some(c.lease.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(leases.len(), 1, "exactly one lease: {out:?}");
        assert_eq!(leases[0].epoch, 2);
        let replays: Vec<_> = out.iter().filter_map(again).collect();
        assert_eq!(replays, vec![(ItemState::Running, 2)], "{out:?}");
        let item = a.item(id).await.unwrap().unwrap();
        assert_eq!((item.state, item.epoch), (ItemState::Running, 2));
        a.heartbeat(id, &leases[0].token, None).await.unwrap();
    }
}

pub async fn a_resume_racing_a_claim_and_the_reaper_keeps_its_lease(db: TestDb) {
    const ROUNDS: usize = 10;
    let stores = [
        Arc::new(db.store(ttl(LONG)).await),
        Arc::new(db.store(ttl(LONG)).await),
        Arc::new(db.store(ttl(LONG)).await),
    ];
    for round in 0..ROUNDS {
        let queue = format!("q{round}");
        let paused = paused_item(&stores[0], &queue).await;
        // An expired lease beside it, for the reaper to take over and the
        // claim to take then.
        let expired = stores[0].enqueue(&queue, &json!(2), None).await.unwrap();
        stores[0]
            .claim(&queue, None)
            .await
            .unwrap()
            .expect("claimed");
        sqlx::query(&format!(
            "UPDATE items SET heartbeat_at = heartbeat_at - {} WHERE id = {}",
            LONG + 1_000,
            expired.id
        ))
        .execute(stores[0].pool())
        .await
        .unwrap();
        let s = stores.clone();
        let q = queue.clone();
        let out = at_once(3, move |k| {
            let (store, queue) = (s[k].clone(), q.clone());
            async move {
                match k {
                    0 => Some(store.resume(paused, None).await.unwrap().lease.token),
                    1 => {
                        store.reap().await.unwrap();
                        None
                    }
                    _ => store
                        .claim(&queue, None)
                        .await
                        .unwrap()
                        .map(|c| c.item.id.to_string()),
                }
            }
        })
        .await;
        let token = out[0].clone().expect("the resume resumes");
        if let Some(claimed) = &out[2] {
            assert_eq!(claimed, &expired.id.to_string(), "never the resumed item");
        }
        let item = stores[0].item(paused).await.unwrap().unwrap();
        assert_eq!((item.state, item.epoch), (ItemState::Running, 2));
        stores[1].heartbeat(paused, &token, None).await.unwrap();
    }
}
