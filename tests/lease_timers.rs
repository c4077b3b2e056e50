//! Delayed timers (case C-T2 scaled to the test server's TTL of 3 s and
//! heartbeat of 0.5 s), injected through the client's `timer_delay` test hook.
// Tests may read and call the page's values with js-sys directly: a slot
// kept by a throw lasts only for the test page (clippy.toml).
#![allow(clippy::disallowed_methods)]

use agentstore::lease::{LossReason, Status};
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

/// Every heartbeat timer fires 1.5 s late (half the TTL), like a throttled
/// tab: a heartbeat leaves every 2 s, and each answer renews the local
/// deadline to 2.7 s after its request, so the lease lives as long as the
/// page is never starved for the 0.7 s between the two (a page that is
/// loses it, rightly, at its deadline), and as long as each heartbeat (and
/// the claim) is answered within those 0.7 s (one answered later, by a lease
/// server or proxy stalled on a busy machine, loses it as rightly). A round
/// counts when the page's event loop never stalled for 400 ms, no lease
/// request took 500 ms and the lease never went 2.5 s from a confirmed
/// heartbeat's send to the next answer; rounds run until one does (at most eight), and in
/// that round the lease is still held after three TTLs and settles. In any
/// round, a lease that is not held was lost at its deadline.
#[wasm_bindgen_test]
async fn timers_late_by_less_than_the_ttl_keep_the_lease_alive() {
    if server().is_none() {
        return;
    }
    // A heartbeat every 2 s: a lease goes 2 s and a round trip without a
    // confirmation in any round; 2.5 s, near the 2.7 s deadline, may rightly
    // lose it.
    let limits = Rounds {
        rounds: 8,
        page_stall_ms: 400.0,
        trip_ms: 500.0,
        gap_ms: 2_500.0,
    };
    let (c, lease, id, status) = unstalled_rounds(
        limits,
        |round| async move {
            let q = fresh_queue("late-short");
            let id = enqueue(&q, json!({})).await;
            let c = admin_client(delayed(1_500.0));
            let lease = claim(&c, &q).await;
            sleep(3.0 * TTL_MS).await;
            let status = lease.status();
            assert!(
                matches!(
                    status,
                    Status::Held | Status::Lost(LossReason::ExpiredLocally)
                ),
                "round {round}: {status:?}"
            );
            (c, lease, id, status)
        },
        |(c, ..)| async move { c.close().await },
    )
    .await;
    assert_eq!(status, Status::Held);
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
    c.close().await;
}

#[wasm_bindgen_test]
async fn a_timer_late_past_the_ttl_finds_the_lease_already_lost_and_sends_nothing() {
    if server().is_none() {
        return;
    }
    let q = fresh_queue("late-long");
    let id = enqueue(&q, json!({})).await;
    // Every heartbeat timer fires 4.5 s late: past the 3 s TTL.
    let slow = admin_client(delayed(4_500.0));
    let other = admin_client(config());
    let stale = claim(&slow, &q).await;
    let fired = abort_recorder(&stale);
    let deadline = stale.deadline();
    wait_item(id, 3.0 * TTL_MS, |it| it.state == ItemState::Open).await;
    let fresh = claim(&other, &q).await;
    // The late timer may or may not have fired by now; never before the deadline.
    if let Some(at) = aborted_at(&fired) {
        assert!(at >= deadline, "aborted {} ms early", deadline - at);
    }
    // Whatever the timers did, the first reader past the deadline sees the
    // loss, synchronously: status, signal and throwIfLost agree.
    assert_eq!(stale.status(), Status::Lost(LossReason::ExpiredLocally));
    assert!(
        aborted_at(&fired).is_some(),
        "the abort event fired synchronously"
    );
    assert!(stale.signal().aborted());
    assert_eq!(
        stale.lost_error().as_ref().and_then(loss),
        Some("expired_locally")
    );
    assert!(slow.held().is_empty());
    let e = stale
        .settle(SettleState::Done, Some(js(json!("stale"))), None)
        .await
        .unwrap_err();
    assert_eq!(loss(&e), Some("expired_locally"));
    let seen = item(id).await;
    assert_eq!(
        (seen.state, seen.epoch, seen.result),
        (ItemState::Running, 2, None)
    );
    fresh.heartbeat().await.expect("the new claim is untouched");
    fresh.release().await.unwrap();
}

/// CASES C-F2, "its own process claims it again": a client whose heartbeat
/// timers are held back (a throttled tab) still holds item X locally when the
/// server has reopened it; the same client then claims X again. The new
/// claim proves the old one gone, so the old lease is lost at once — its
/// signal aborts with `claim_lost` — instead of staying held, unheard, until
/// its late timer. (Before, the new lease silently replaced it in the
/// client's registry and nothing ever ended it.)
#[wasm_bindgen_test]
async fn a_client_that_claims_its_own_item_again_loses_the_earlier_claim() {
    if server().is_none() {
        return;
    }
    let q = fresh_queue("reclaim-own");
    let id = enqueue(&q, json!({})).await;
    // Timers 20 s late: nothing of the old lease runs during this test
    // unless the new claim ends it.
    let c = admin_client(delayed(20_000.0));
    let old = claim(&c, &q).await;
    let fired = abort_recorder(&old);
    wait_item(id, 5.0 * TTL_MS, |it| it.state == ItemState::Open).await;
    let new = claim(&c, &q).await;
    assert_eq!(new.item_id, old.item_id);
    assert!(
        aborted_at(&fired).is_some(),
        "the old lease's signal aborted when the item was claimed again"
    );
    assert_eq!(old.status(), Status::Lost(LossReason::ClaimLost));
    assert_eq!(c.held().len(), 1, "only the new lease is held");
    new.settle(SettleState::Done, None, None)
        .await
        .expect("the new claim is ours");
    let seen = item(id).await;
    assert_eq!((seen.state, seen.epoch), (ItemState::Done, 2));
}

/// A machine that sleeps: `performance.now()` (and the browser's timers)
/// stop while the operating system is suspended on macOS, Linux, ChromeOS
/// and Android, so on waking the wall clock is ahead of it by the time
/// asleep. Simulated here: the loop's timers fire 60 s late and nothing reads
/// the lease clock while the server reaps the lease (about a TTL); then the
/// monotonic clock is set back by the time that passed (it stood still).
/// The page waking (`online`, here) wakes the heartbeat loop, which sees the
/// jump and heartbeats at once; the server answers `claim_lost`, and the
/// signal aborts without anyone reading the lease, well before the loop's
/// own timer: the wait for the abort is bounded at 30 s, and that timer
/// fires 60 s after the claim at the earliest (a bound of a few seconds
/// after the wake, against a timer 9 s late, failed on a busy machine
/// though the wake worked). Status and settle agree. (Before the jump was confirmed with
/// the server, the lease was lost locally at the first reading, and a wall
/// clock merely set forward lost it as well: see the next test.)
#[wasm_bindgen_test]
async fn a_machine_waking_from_a_sleep_past_the_ttl_finds_its_lease_lost() {
    woken_by("online", false).await;
}

/// The same wake by the Page Lifecycle `resume` event, which Chrome fires
/// at the `document` of a frozen tab as it resumes, without bubbling (so a
/// listener on the window hears it only when capturing). Before, it was not
/// listened to: a tab resumed while hidden aborted a kept signal at the
/// loop's throttled timer only (helper-225).
#[wasm_bindgen_test]
async fn a_frozen_page_resuming_past_the_ttl_finds_its_lease_lost() {
    woken_by("resume", true).await;
}

/// [`a_machine_waking_from_a_sleep_past_the_ttl_finds_its_lease_lost`] with
/// the wake given by `event`, dispatched at the `document` (`at_document`)
/// or the global scope.
async fn woken_by(event: &str, at_document: bool) {
    const LATE_MS: f64 = 60_000.0;
    if server().is_none() {
        return;
    }
    let q = fresh_queue("slept");
    let id = enqueue(&q, json!({})).await;
    let c = admin_client(delayed(LATE_MS));
    // Real time (`Date.now()`: the test hooks shift only the lease clock).
    let claimed_at = js_sys::Date::now();
    let lease = claim(&c, &q).await;
    let fired = abort_recorder(&lease);
    // Asleep: only the server's clock runs (no `now()` read meanwhile).
    let asleep = js_sys::Date::now();
    let mut reaped = false;
    for _ in 0..200 {
        if item(id).await.state == ItemState::Open {
            reaped = true;
            break;
        }
        sleep(50.0).await;
    }
    assert!(reaped, "the server did not reap the lease");
    agentstore::lease::http::shift_monotonic_clock(asleep - js_sys::Date::now());
    let target = if at_document {
        js_sys::Reflect::get(&js_sys::global(), &"document".into()).unwrap()
    } else {
        js_sys::global().into()
    };
    let target: web_sys::EventTarget = wasm_bindgen::JsCast::unchecked_into(target);
    // Not bubbling, as the browser's own `resume` and `online`.
    target
        .dispatch_event(&web_sys::Event::new(event).unwrap())
        .unwrap();
    let woke_at = js_sys::Date::now();
    let aborted = within(30_000.0, async {
        while aborted_at(&fired).is_none() {
            sleep(20.0).await;
        }
    })
    .await;
    // Seen before the loop's own timer could have fired (LATE_MS after the
    // claim at the earliest): the wake brought the abort.
    let seen_at = js_sys::Date::now();
    let by_wake = seen_at < claimed_at + LATE_MS;
    let status = lease.status();
    let settled = lease.settle(SettleState::Done, None, None).await;
    agentstore::lease::http::shift_monotonic_clock(0.0);
    assert!(aborted.is_some(), "the signal did not abort on waking");
    assert!(
        by_wake,
        "seen {} ms after the claim ({} ms after the wake): maybe the loop's late timer's doing",
        seen_at - claimed_at,
        seen_at - woke_at
    );
    assert_eq!(status, Status::Lost(LossReason::ClaimLost));
    assert_eq!(loss(&settled.unwrap_err()), Some("claim_lost"));
    assert_eq!(item(id).await.state, ItemState::Open);
}

/// Case C-T1 while a lease is held: the client's wall clock set 10 minutes
/// forward, and later back, changes nothing. The lease is not lost (the
/// jump only makes a heartbeat go out at once, and its success confirms the
/// lease), heartbeats go on past the 5 s within which that confirmation was
/// due, and the settle lands with no attempt spent and no other claim.
/// Before, the jump counted as 10 minutes asleep: the lease was lost locally
/// (`expired_locally`) and released at the next reading.
#[wasm_bindgen_test]
async fn a_wall_clock_set_forward_or_back_while_a_lease_is_held_changes_nothing() {
    use agentstore::lease::http::shift_wall_clock;
    use agentstore_protocol::lease_client::CONFIRM_WINDOW_MS;
    if server().is_none() {
        return;
    }
    let (c, (lease, id, claimed, fired, held)) = unstalled_round(|_| async {
        let q = fresh_queue("clockset");
        let id = enqueue(&q, json!({})).await;
        let c = admin_client(config());
        let lease = claim(&c, &q).await;
        let claimed = item(id).await;
        let fired = abort_recorder(&lease);
        let mut held = Vec::new();
        // Forward 10 minutes, held past the confirmation window; then back.
        for (shift, hold_ms) in [(600_000.0, CONFIRM_WINDOW_MS + 1_000.0), (0.0, TTL_MS)] {
            shift_wall_clock(shift);
            let until = now() + hold_ms;
            while now() < until && lease.status() == Status::Held {
                sleep(50.0).await;
            }
            held.push(lease.status());
        }
        (c, (lease, id, claimed, fired, held))
    })
    .await;
    shift_wall_clock(0.0);
    assert_eq!(held, [Status::Held, Status::Held]);
    assert_eq!(aborted_at(&fired), None, "the signal aborted");
    lease
        .settle(SettleState::Done, None, None)
        .await
        .expect("the lease is still ours");
    let seen = item(id).await;
    assert_eq!(seen.state, ItemState::Done);
    assert_eq!(
        (seen.epoch, seen.attempts),
        (claimed.epoch, claimed.attempts)
    );
    c.close().await;
}

/// `performance.now()` itself, as the page reads it (unshifted by the
/// test hooks), in ms.
fn performance_now() -> impl Fn() -> f64 {
    let performance = js_sys::Reflect::get(&js_sys::global(), &"performance".into()).unwrap();
    let now: js_sys::Function = js_sys::Reflect::get(&performance, &"now".into())
        .unwrap()
        .into();
    move || now.call0(&performance).unwrap().as_f64().unwrap()
}

/// The lease clock is `performance.now()` alone, and it counts a jump of
/// the wall clock ahead of it once, never the two clocks' slow drift: steps
/// below a second (NTP slewing, small corrections) count no jump however
/// far they add up, one jump of 5 s counts one, and a clock set back counts
/// none. No server needed.
#[wasm_bindgen_test]
async fn the_lease_clock_counts_a_jump_of_the_wall_clock_but_not_small_steps() {
    use agentstore::lease::http::{jumps, now_ms, shift_wall_clock};
    // `performance.now()` itself, unshifted: the lease clock may advance by
    // no more than it does (however slowly a busy machine runs this).
    let perf = performance_now();
    let real_start = perf();
    let start = now_ms();
    let before = jumps();
    for step in 1..=4 {
        shift_wall_clock(f64::from(step) * 600.0);
        now_ms();
    }
    let after_steps = now_ms();
    assert_eq!(jumps(), before, "2.4 s of small steps counted as a jump");
    shift_wall_clock(2_400.0 + 5_000.0);
    let after_jump = now_ms();
    let real = perf() - real_start;
    assert_eq!(jumps(), before + 1, "a 5 s jump not counted once");
    shift_wall_clock(0.0);
    now_ms();
    assert_eq!(jumps(), before + 1, "a clock set back counted as a jump");
    // Against the time that really passed, not a fixed bound: counting the
    // steps (2.4 s) or the jump (5 s) would put the lease clock that far
    // ahead of `performance.now()` (1 ms: a browser's coarsened timer).
    assert!(
        after_jump - start <= real + 1.0,
        "the wall clock's steps and jump moved the lease clock by {} ms in {real} ms",
        after_jump - start
    );
    assert!(after_jump >= after_steps, "the clock went back");
    assert!(now_ms() >= after_jump, "the clock never goes back");
}

/// Sets the wall clock `ms` off, as the lease clock reads it where
/// `Date.now()` stands in for `performance.now()` (none, or a page's
/// replacement that is not a `Performance`): both of its readings move
/// together, so the two-clock rule sees nothing and only the lease clock's
/// own steps count.
fn shift_fallback_clock(ms: f64) {
    agentstore::lease::http::shift_wall_clock(ms);
    agentstore::lease::http::shift_monotonic_clock(ms);
}

/// Where `Date.now()` stands in for `performance.now()`, a wall clock set
/// back 60 s counts as a jump (the server is asked at once) and the lease
/// clock runs on at the real rate from where it was, also across a gap of
/// 1.5 s between readings; set right again, the correction counts as time
/// passed (the fallback cannot tell it from a gap): the lease clock never
/// runs behind real time, so a lease is never held past its deadline. A
/// step of 500 ms back counts no jump. Before, the lease clock stood still
/// until the wall clock caught up: a lease read "held" for as long as the
/// clock was set back (helper-225: 63 s past a 4 s TTL). A fix that gave
/// the correction back stood it still again across gaps over 1 s (review of
/// a3ba827). No server needed.
#[wasm_bindgen_test]
async fn a_fallback_clock_set_back_counts_a_jump_and_never_runs_behind() {
    use agentstore::lease::http::{jumps, now_ms};
    let perf = performance_now();
    let mut seen = Vec::new();
    for (back, jumped) in [(60_000.0, 1), (500.0, 0)] {
        // A reading first: what earlier tests' hooks left is settled then.
        now_ms();
        let before = jumps();
        let start = now_ms();
        shift_fallback_clock(-back);
        let stepped = now_ms();
        let real_start = perf();
        let on_back = jumps() - before;
        sleep(1_500.0).await;
        let later = now_ms();
        let real = perf() - real_start;
        shift_fallback_clock(0.0);
        let forward = now_ms();
        let real_forward = perf() - real_start;
        assert!(stepped >= start, "the lease clock went back");
        seen.push((back, on_back, jumped));
        // The lease clock advanced as `performance.now()` did (1 ms: a
        // browser's coarsened timer), not by nothing, and after the
        // correction it is not behind real time.
        assert!(
            (later - stepped - real).abs() <= 1.0,
            "{back} ms back: the lease clock moved {} ms in {real} ms",
            later - stepped
        );
        assert!(
            forward - stepped >= real_forward - 1.0,
            "{back} ms back and set right: the lease clock moved {} ms in {real_forward} ms",
            forward - stepped
        );
    }
    for (back, on_back, jumped) in seen {
        assert_eq!(on_back, jumped, "jumps counted for {back} ms back");
    }
}

/// A heartbeat is never sent for a lease past its local deadline, even when
/// the pass that planned it ran app code first: here one pass finds lease A
/// expired (its heartbeats paused) and lease B due, and A's abort listener
/// (which that pass runs) keeps the page busy until B's deadline has passed.
/// B is then lost at its deadline and left out of the batch. Before, the
/// batch planned before the listener ran was sent with B's token after B's
/// deadline, and the server renewed a lease the page had already given up.
/// Review finding.
#[wasm_bindgen_test]
async fn a_heartbeat_batch_delayed_past_a_leases_deadline_leaves_that_lease_out() {
    use std::cell::{Cell, RefCell};
    use std::rc::Rc;
    use wasm_bindgen::closure::Closure;
    use wasm_bindgen::{JsCast, JsValue};
    if server().is_none() {
        return;
    }
    // Two rounds must count. A round in which A was already lost before its
    // abort listener could be added (the 1.2 s sleep and B's claim ran past
    // A's deadline on a busy machine) is run again: it tests nothing.
    let (mut round, mut void) = (0, 0);
    while round < 2 {
        let q = fresh_queue("late-batch");
        enqueue(&q, json!({})).await;
        enqueue(&q, json!({})).await;
        // The heartbeat loop sleeps until `target` (the lease clock, ms)
        // once it is set, so that one pass finds A expired and B due.
        let target = Rc::new(Cell::new(0.0f64));
        let t = target.clone();
        let delay = Closure::<dyn FnMut(f64) -> f64>::new(move |ms: f64| ms.max(t.get() - now()));
        let mut cfg = config();
        cfg.timer_delay = Some(delay.as_ref().unchecked_ref::<js_sys::Function>().clone());
        delay.forget();
        let c = admin_client(cfg);
        let a = claim(&c, &q).await;
        a.set_heartbeats_paused(true);
        sleep(1_200.0).await;
        let b = claim(&c, &q).await;
        // Heartbeats sent from now on: (lease clock at the call, body).
        let sent = Rc::new(RefCell::new(Vec::<(f64, String)>::new()));
        let s = sent.clone();
        let record = Closure::<dyn FnMut(String)>::new(move |body: String| {
            s.borrow_mut().push((now(), body));
        });
        let install = js_sys::Function::new_with_args(
            "record",
            "const real = globalThis.fetch;
            globalThis.fetch = (input, init) => {
                const url = String(input instanceof Request ? input.url : input);
                if (url.endsWith('/v1/heartbeats')) record(String(init && init.body));
                return real(input, init);
            };
            return () => { globalThis.fetch = real; };",
        );
        if a.status() != Status::Held {
            void += 1;
            assert!(void < 5, "A was lost before B's claim in {void} rounds");
            c.close().await;
            continue;
        }
        let restore: js_sys::Function = install
            .call1(&JsValue::NULL, record.as_ref())
            .unwrap()
            .into();
        // A's abort listener keeps the page busy until B's deadline is past.
        let busy_until = Rc::new(Cell::new(0.0f64));
        let (b2, busy) = (b.clone(), busy_until.clone());
        let on_abort = Closure::<dyn FnMut()>::new(move || {
            let until = b2.deadline() + 20.0;
            while now() <= until {}
            busy.set(now());
        });
        a.signal()
            .add_event_listener_with_callback("abort", on_abort.as_ref().unchecked_ref())
            .unwrap();
        target.set(a.deadline() + 30.0);
        let lost = within(4.0 * TTL_MS, async {
            while b.status() == Status::Held {
                sleep(20.0).await;
            }
        })
        .await;
        // (A batch planned before the busy listener ran goes out in its
        // task's first poll, before B reads as lost here: already recorded.)
        restore.call0(&JsValue::NULL).unwrap();
        drop(record);
        drop(on_abort);
        assert!(lost.is_some(), "round {round}: B still held");
        assert_eq!(a.status(), Status::Lost(LossReason::ExpiredLocally));
        assert_eq!(b.status(), Status::Lost(LossReason::ExpiredLocally));
        let past = busy_until.get();
        assert!(past > 0.0, "round {round}: A's abort listener ran");
        let late: Vec<_> = sent
            .borrow()
            .iter()
            .filter(|(at, body)| *at >= past && body.contains(b.token()))
            .cloned()
            .collect();
        assert!(
            late.is_empty(),
            "round {round}: B heartbeated after its deadline: {late:?}"
        );
        c.close().await;
        round += 1;
    }
}
