//! Delayed timers (case C-T2 scaled to the test server's TTL of 3 s and
//! heartbeat of 0.5 s), injected through the client's `timer_delay` test hook.
use agentstore::lease::Status;
use agentstore_protocol::lease::{ItemState, SettleState};
use serde_json::json;
use wasm_bindgen_test::*;

mod lease_common;
use lease_common::*;

wasm_bindgen_test_configure!(run_in_browser);

fn delayed(extra_ms: f64) -> agentstore::lease::ClientConfig {
    let mut c = config();
    c.timer_delay = Some(js_sys::Function::new_with_args(
        "ms",
        &format!("return ms + {extra_ms}"),
    ));
    c
}

#[wasm_bindgen_test]
async fn timers_late_by_less_than_the_ttl_keep_the_lease_alive() {
    if server().is_none() {
        return;
    }
    let q = fresh_queue("late-short");
    let id = enqueue(&q, json!({})).await;
    // Every heartbeat timer fires 1.5 s late (half the TTL), like a throttled tab.
    let c = admin_client(delayed(1_500.0));
    let lease = claim(&c, &q).await;
    sleep(3.0 * TTL_MS).await;
    assert_eq!(lease.status(), Status::Held);
    assert!(!lease.signal().aborted());
    let seen = item(id).await;
    assert_eq!(
        (seen.state, seen.epoch, seen.attempts),
        (ItemState::Running, 1, 0)
    );
    lease
        .settle(SettleState::Done, None, None)
        .await
        .expect("still ours");
}

#[wasm_bindgen_test]
async fn a_timer_late_past_the_ttl_heartbeats_at_once_and_claim_lost_ends_the_work() {
    if server().is_none() {
        return;
    }
    let q = fresh_queue("late-long");
    let id = enqueue(&q, json!({})).await;
    // The first heartbeat timer fires 4.5 s late: past the 3 s TTL.
    let slow = admin_client(delayed(4_500.0));
    let other = admin_client(config());
    let t0 = now();
    let stale = claim(&slow, &q).await;
    wait_item(id, 3.0 * TTL_MS, |it| it.state == ItemState::Open).await;
    let fresh = claim(&other, &q).await;
    assert_eq!(
        stale.status(),
        Status::Held,
        "the sleeping client has not noticed yet"
    );
    let (reason, at) = wait_abort(&stale, 4.0 * TTL_MS).await.expect("aborted");
    assert_eq!(
        reason, "claim_lost",
        "the late heartbeat asked the server, which said claim_lost"
    );
    assert!(
        at - t0 >= 4_500.0,
        "aborted by the late heartbeat, not before it"
    );
    assert!(
        at - t0 <= 4_500.0 + HEARTBEAT_MS + 1_000.0,
        "at once when the timer fired"
    );
    // Never resumed on that token: no longer heartbeated, settle refused locally.
    assert!(slow.held().is_empty());
    let e = stale
        .settle(SettleState::Done, Some(js(json!("stale"))), None)
        .await
        .unwrap_err();
    assert_eq!(loss(&e), Some("claim_lost"));
    sleep(2.0 * HEARTBEAT_MS).await;
    let seen = item(id).await;
    assert_eq!(
        (seen.state, seen.epoch, seen.result),
        (ItemState::Running, 2, None)
    );
    fresh.heartbeat().await.expect("the new claim is untouched");
    fresh.release().await.unwrap();
}
