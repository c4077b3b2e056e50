//! Several server instances on one database, driven over HTTP.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use agentstore_protocol::lease::{ClaimResponse, ItemState, WorkerCredentials};
use agentstore_server::Server;
use serde_json::json;

use crate::common::{enroll, TestDb};

const ITEMS: usize = 2_000;
const CLAIMERS: usize = 8;

/// Claims and settles until the queue is empty and every item is settled;
/// returns the ids this claimer was handed.
async fn claimer(
    n: usize,
    base: String,
    creds: WorkerCredentials,
    settled: Arc<AtomicUsize>,
) -> Vec<i64> {
    let client = reqwest::Client::new();
    let mut mine = Vec::new();
    loop {
        let resp = client
            .post(format!("{base}/v1/queues/bulk/claims"))
            .bearer_auth(&creds.access_token)
            .send()
            .await
            .unwrap();
        match resp.status().as_u16() {
            201 => {
                let c: ClaimResponse = resp.json().await.unwrap();
                mine.push(c.item.id);
                let done = client
                    .post(format!("{base}/v1/items/{}/settle", c.item.id))
                    .bearer_auth(&creds.access_token)
                    .json(&json!({"token": c.lease.token, "state": "done", "result": {"by": n}}))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(done.status(), 200, "settle of item {}", c.item.id);
                settled.fetch_add(1, Ordering::SeqCst);
            }
            204 if settled.load(Ordering::SeqCst) >= ITEMS => return mine,
            204 => tokio::time::sleep(std::time::Duration::from_millis(5)).await,
            other => panic!("claimer {n}: unexpected status {other}"),
        }
    }
}

pub async fn two_instances_with_eight_claimers_settle_every_item_exactly_once(db: TestDb) {
    let mut config = db.config();
    config.claim_rate = "1000000/s".parse().unwrap();
    config.ttl_ms = 60_000;
    config.reaper_ms = 100; // both reapers run throughout and must take nothing
    let servers = [
        Server::start(&config).await.unwrap(),
        Server::start(&config).await.unwrap(),
    ];
    let store = servers[0].store();
    for i in 0..ITEMS {
        store.enqueue("bulk", &json!({"i": i}), None).await.unwrap();
    }
    let client = reqwest::Client::new();
    let settled = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for n in 0..CLAIMERS {
        let base = servers[n % 2].url();
        let creds = enroll(&client, &base).await;
        tasks.push(tokio::spawn(claimer(n, base, creds, settled.clone())));
    }
    let mut by_claimer = HashMap::new();
    let mut seen = HashSet::new();
    for (n, task) in tasks.into_iter().enumerate() {
        for id in task.await.unwrap() {
            assert!(seen.insert(id), "item {id} was delivered to two claims");
            by_claimer.insert(id, n);
        }
    }
    assert_eq!(seen.len(), ITEMS, "every item was delivered");
    let items = store.list("bulk", None, 0, 10_000).await.unwrap().items;
    assert_eq!(items.len(), ITEMS);
    for item in &items {
        assert_eq!(item.state, ItemState::Done, "item {}", item.id);
        assert_eq!(
            (item.epoch, item.attempts),
            (1, 0),
            "item {} claimed once",
            item.id
        );
        let by = by_claimer[&item.id];
        assert_eq!(
            crate::common::value(item.result.clone()),
            Some(json!({"by": by})),
            "settled by its only claimer"
        );
    }
    let per_instance: Vec<usize> = (0..2)
        .map(|i| (0..CLAIMERS).filter(|n| n % 2 == i).count())
        .collect();
    assert_eq!(per_instance, vec![4, 4]);
    for s in servers {
        s.stop().await.unwrap();
    }
}
