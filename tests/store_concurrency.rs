//! Races forced, not hoped for: both writers read the same revision before
//! either writes, over many rounds, on one and on two connections.
// Tests may read and call the page's values with js-sys directly: a slot
// kept by a throw lasts only for the test page (clippy.toml).
#![allow(clippy::disallowed_methods)]

use agentstore::store::Store;
use agentstore_protocol::ErrorCode;
use serde_json::{json, Value};
use std::cell::RefCell;
use std::rc::Rc;
use wasm_bindgen::prelude::{Closure, JsValue};
use wasm_bindgen::JsCast;
use wasm_bindgen_test::*;

mod common;
use common::*;

wasm_bindgen_test_configure!(run_in_browser);

#[wasm_bindgen_test]
async fn two_creates_in_the_same_tick_have_exactly_one_winner() {
    let (a, name) = open("c-s2").await;
    let b = open_named(&name).await;
    for round in 0..50 {
        let id = format!("same-{round}");
        // Same connection, then two connections on one database.
        let (ra, rb) = (
            js(json!({"_id": id, "who": "A"})),
            js(json!({"_id": id, "who": "B"})),
        );
        let (x, y) = if round % 2 == 0 {
            futures::join!(a.put(&ra), a.put(&rb))
        } else {
            futures::join!(a.put(&ra), b.put(&rb))
        };
        let winner = match (&x, &y) {
            (Ok(w), Err(e)) => {
                assert_eq!(e.code(), ErrorCode::Conflict);
                assert!(w.rev.starts_with("1-"));
                "A"
            }
            (Err(e), Ok(w)) => {
                assert_eq!(e.code(), ErrorCode::Conflict);
                assert!(w.rev.starts_with("1-"));
                "B"
            }
            _ => panic!("round {round}: exactly one create must win: {x:?} {y:?}"),
        };
        let stored = a.get(&s(&id)).await.unwrap().unwrap();
        assert_eq!(field_str(&stored, "who").as_deref(), Some(winner));
    }
    assert_indexes_clean(&a).await;
}

/// Barrier: both writers hold the same revision, then write at once — over
/// 120 rounds exactly one wins each time and the loser's body is never stored.
#[wasm_bindgen_test]
async fn two_writers_with_the_same_revision_exactly_one_wins_every_round() {
    let (a, name) = open("barrier").await;
    let b = open_named(&name).await;
    let rev = a.put(&js(json!({"_id": "k", "n": 0}))).await.unwrap().rev;
    race_rounds(&a, &b, rev, 120).await;
    assert_indexes_clean(&a).await;
}

/// `rounds` rounds of the barrier race on record `k`, starting from `rev`:
/// both connections write against the same revision at once; exactly one
/// wins, the stored body and revision are the winner's, and the generation
/// grows by one per round.
async fn race_rounds(a: &Store, b: &Store, mut rev: String, rounds: u32) {
    for round in 1..=rounds {
        let (ra, rb) = (
            js(json!({"_id": "k", "_rev": rev, "n": round, "w": "a"})),
            js(json!({"_id": "k", "_rev": rev, "n": round, "w": "b"})),
        );
        let (x, y) = futures::join!(a.put(&ra), b.put(&rb));
        let (won, who) = match (x, y) {
            (Ok(w), Err(e)) if e.code() == ErrorCode::Conflict => (w, "a"),
            (Err(e), Ok(w)) if e.code() == ErrorCode::Conflict => (w, "b"),
            (x, y) => panic!("round {round}: {x:?} {y:?}"),
        };
        let stored = a.get(&s("k")).await.unwrap().unwrap();
        assert_eq!(field_str(&stored, "w").as_deref(), Some(who));
        assert_eq!(
            field_str(&stored, "_rev").as_deref(),
            Some(won.rev.as_str())
        );
        let generation: u64 = rev.split('-').next().unwrap().parse().unwrap();
        assert!(won.rev.starts_with(&format!("{}-", generation + 1)));
        rev = won.rev;
    }
}

fn push_fn(item: &'static str, delay_ms: u32) -> js_sys::Function {
    js_sys::Function::new_with_args(
        "cur",
        &format!(
            "return new Promise(r => setTimeout(() => r({{...(cur || {{}}), items: [...((cur && cur.items) || []), '{item}']}}), {delay_ms}));"
        ),
    )
}

#[wasm_bindgen_test]
async fn read_modify_write_split_by_an_await_conflicts_and_mutate_merges() {
    let (store, _) = open("c-s3").await;
    let r1 = store
        .put(&js(json!({"_id": "r1", "items": []})))
        .await
        .unwrap()
        .rev;
    // A and B both read r1; A writes; then B writes what it based on r1.
    let ra = store
        .put(&js(json!({"_id": "r1", "_rev": r1, "items": ["a"]})))
        .await;
    let rb = store
        .put(&js(json!({"_id": "r1", "_rev": r1, "items": ["b"]})))
        .await;
    ra.unwrap();
    assert_eq!(rb.unwrap_err().code(), ErrorCode::Conflict);

    // mutate for both, each with an async function awaiting a timer.
    let (_store2, name) = open("c-s3m").await;
    let store = open_named(&name).await;
    store
        .put(&js(json!({"_id": "r1", "items": []})))
        .await
        .unwrap();
    let key = s("r1");
    let (fa, fb) = (push_fn("a", 50), push_fn("b", 10));
    let (x, y) = futures::join!(
        store.mutate(&key, &fa, 8, None),
        store.mutate(&key, &fb, 8, None)
    );
    x.unwrap();
    y.unwrap();
    let got = store.get(&s("r1")).await.unwrap().unwrap();
    let items: Vec<String> = js_sys::Array::from(&field(&got, "items"))
        .iter()
        .map(|v| v.as_string().unwrap())
        .collect();
    let mut sorted = items.clone();
    sorted.sort();
    assert_eq!(sorted, vec!["a", "b"], "{items:?}");
    assert!(field_str(&got, "_rev").unwrap().starts_with("3-"));

    // retries: 0 under contention rejects and overwrites nothing.
    let before = field_str(&got, "_rev").unwrap();
    // `slow` has read the record; its function finishes only once `fast` has
    // written (a gate, not a timer: the order holds however busy the machine).
    let mut open_gate = None;
    let gate = js_sys::Promise::new(&mut |resolve, _| open_gate = Some(resolve));
    let slow: js_sys::Function = wasm_bindgen::JsCast::unchecked_into(
        js_sys::Function::new_with_args(
            "gate",
            "return (cur) => gate.then(() => ({...cur, items: [...cur.items, 'slow']}));",
        )
        .call1(&wasm_bindgen::JsValue::NULL, &gate)
        .unwrap(),
    );
    let fast = push_fn("fast", 0);
    let (x, y) = futures::join!(store.mutate(&key, &slow, 0, None), async {
        let y = store.mutate(&key, &fast, 0, None).await;
        open_gate
            .take()
            .unwrap()
            .call0(&wasm_bindgen::JsValue::NULL)
            .unwrap();
        y
    });
    y.unwrap();
    let e = x.unwrap_err();
    assert_eq!(e.code(), ErrorCode::Conflict);
    assert!(matches!(
        e,
        agentstore::StoreError::Conflict {
            attempts: Some(1),
            ..
        }
    ));
    let now = store.get(&s("r1")).await.unwrap().unwrap();
    let items: Vec<String> = js_sys::Array::from(&field(&now, "items"))
        .iter()
        .map(|v| v.as_string().unwrap())
        .collect();
    assert!(items.contains(&"fast".to_string()) && !items.contains(&"slow".to_string()));
    assert!(
        field_str(&now, "_rev").unwrap().starts_with("4-"),
        "{before} then one write"
    );
    assert_indexes_clean(&store).await;
}

/// 50 concurrent increments through `mutate` from two store instances on one
/// database give exactly 50.
#[wasm_bindgen_test]
async fn fifty_concurrent_mutate_increments_from_two_instances_give_fifty() {
    let (a, name) = open("inc").await;
    let b = open_named(&name).await;
    a.put(&js(json!({"_id": "counter", "n": 0}))).await.unwrap();
    let inc = js_sys::Function::new_with_args(
        "cur",
        "return Promise.resolve().then(() => ({...cur, n: cur.n + 1}));",
    );
    let key = s("counter");
    let mut futs = Vec::new();
    for i in 0..50 {
        let s_ = if i % 2 == 0 { &a } else { &b };
        futs.push(s_.mutate(&key, &inc, 100, None));
    }
    for r in futures::future::join_all(futs).await {
        r.unwrap();
    }
    let got = a.get(&s("counter")).await.unwrap().unwrap();
    assert_eq!(field(&got, "n").as_f64(), Some(50.0));
    assert!(field_str(&got, "_rev").unwrap().starts_with("51-"));
    assert_indexes_clean(&a).await;
}

#[wasm_bindgen_test]
async fn mutate_returning_undefined_writes_nothing_and_a_thrown_error_passes_through() {
    let (store, _) = open("mut-undef").await;
    let rev = store
        .put(&js(json!({"_id": "u", "v": 1})))
        .await
        .unwrap()
        .rev;
    let none = js_sys::Function::new_with_args("cur", "return undefined;");
    assert!(store
        .mutate(&s("u"), &none, 8, None)
        .await
        .unwrap()
        .is_none());
    let throws = js_sys::Function::new_with_args("cur", "throw new RangeError('nope');");
    let e = store.mutate(&s("u"), &throws, 8, None).await.unwrap_err();
    let js_err = e.to_js();
    assert_eq!(field_str(&js_err, "name").as_deref(), Some("RangeError"));
    let got = store.get(&s("u")).await.unwrap().unwrap();
    assert_eq!(field_str(&got, "_rev").as_deref(), Some(rev.as_str()));
    // An aborted signal stops before reading.
    let ctl = web_sys::AbortController::new().unwrap();
    ctl.abort();
    let inc = js_sys::Function::new_with_args("cur", "return {...cur, v: 2};");
    let e = store
        .mutate(&s("u"), &inc, 8, Some(&ctl.signal()))
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::Aborted);
    // A signal aborted while the function runs: the same AbortError and
    // nothing written, whether the function is synchronous or async (before,
    // a synchronous one's result was committed).
    for body in [
        "globalThis.__ctl.abort(); return {...cur, v: 3};",
        "globalThis.__ctl.abort(); return Promise.resolve({...cur, v: 3});",
    ] {
        let ctl = web_sys::AbortController::new().unwrap();
        js_sys::Reflect::set(&js_sys::global(), &"__ctl".into(), &ctl).unwrap();
        let f = js_sys::Function::new_with_args("cur", body);
        let e = store
            .mutate(&s("u"), &f, 8, Some(&ctl.signal()))
            .await
            .unwrap_err();
        assert_eq!(e.code(), ErrorCode::Aborted, "{body}");
        let got = store.get(&s("u")).await.unwrap().unwrap();
        assert_eq!(
            field_str(&got, "_rev").as_deref(),
            Some(rev.as_str()),
            "{body}"
        );
    }
    // mutate creates when nothing is stored
    let mk = js_sys::Function::new_with_args("cur", "return cur ? undefined : {v: 'new'};");
    let w = store
        .mutate(&s("fresh"), &mk, 8, None)
        .await
        .unwrap()
        .unwrap();
    assert!(w.rev.starts_with("1-"));
    assert_indexes_clean(&store).await;
}

#[wasm_bindgen_test]
async fn put_many_is_all_or_nothing_and_reports_every_conflicting_position() {
    let (store, _) = open("many").await;
    let r = store
        .put(&js(json!({"_id": "b", "v": 0})))
        .await
        .unwrap()
        .rev;
    store.put(&js(json!({"_id": "d", "v": 0}))).await.unwrap();
    // conflict at the last position only
    let batch =
        js(json!([{"_id": "a"}, {"_id": "b", "_rev": r, "v": 1}, {"_id": "c"}, {"_id": "d"}]));
    let e = store.put_many(&batch).await.unwrap_err();
    match &e {
        agentstore::StoreError::BatchConflict { failures } => {
            assert_eq!(
                failures.iter().map(|f| f.index).collect::<Vec<_>>(),
                vec![3]
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(
        store.get(&s("a")).await.unwrap().is_none(),
        "nothing written"
    );
    assert_eq!(
        field(&store.get(&s("b")).await.unwrap().unwrap(), "v").as_f64(),
        Some(0.0)
    );
    // several conflicting positions are all reported
    let batch = js(json!([{"_id": "b"}, {"_id": "x"}, {"_id": "d", "_rev": "9-ff"}]));
    let e = store.put_many(&batch).await.unwrap_err();
    let js_err = e.to_js();
    let idx: Vec<f64> = js_sys::Array::from(&field(&js_err, "failures"))
        .iter()
        .map(|f| field(&f, "index").as_f64().unwrap())
        .collect();
    assert_eq!(idx, vec![0.0, 2.0]);
    assert_eq!(field_str(&js_err, "name").as_deref(), Some("ConflictError"));
    // the whole batch lands when every position is right
    let batch: Vec<Value> = (0..500)
        .map(|i| json!({"_id": format!("m{i:04}"), "i": i}))
        .collect();
    let out = store.put_many(&js(Value::Array(batch))).await.unwrap();
    assert_eq!(out.len(), 500);
    assert_eq!(all_ids(&store, "m", 1000).await.len(), 500);
    assert_indexes_clean(&store).await;
}

/// A user callback that awaits timers and promises between the read and the
/// write never splits a transaction (case C-E3): concurrent async mutates
/// and plain puts on the same record never lose an update.
#[wasm_bindgen_test]
async fn foreign_awaits_in_callbacks_never_split_a_transaction() {
    let (store, _) = open("c-e3").await;
    store.put(&js(json!({"_id": "c", "n": 0}))).await.unwrap();
    let slow_inc = js_sys::Function::new_with_args(
        "cur",
        "return new Promise(r => setTimeout(r, Math.random() * 5)).then(() => crypto.subtle.digest('SHA-256', new Uint8Array(8))).then(() => ({...cur, n: cur.n + 1}));",
    );
    let done = Rc::new(RefCell::new(0));
    let key = s("c");
    let mut futs = Vec::new();
    for _ in 0..20 {
        futs.push(store.mutate(&key, &slow_inc, 200, None));
    }
    for r in futures::future::join_all(futs).await {
        r.unwrap();
        *done.borrow_mut() += 1;
    }
    let got = store.get(&s("c")).await.unwrap().unwrap();
    assert_eq!(field(&got, "n").as_f64(), Some(20.0));
    assert_eq!(*done.borrow(), 20);
    assert_indexes_clean(&store).await;
}

/// A synchronous mutate function runs inside the write transaction, so even
/// with `retries: 0` four concurrent writers on two connections never
/// conflict and every increment lands.
#[wasm_bindgen_test]
async fn synchronous_mutate_functions_never_conflict_even_without_retries() {
    let (a, name) = open("sync-mut").await;
    let b = open_named(&name).await;
    a.put(&js(json!({"_id": "n", "n": 0, "recordType": "counter"})))
        .await
        .unwrap();
    let inc = js_sys::Function::new_with_args("cur", "return {...cur, n: cur.n + 1};");
    let key = s("n");
    let mut futs = Vec::new();
    for i in 0..200 {
        futs.push(if i % 2 == 0 { &a } else { &b }.mutate(&key, &inc, 0, None));
    }
    for r in futures::future::join_all(futs).await {
        r.unwrap();
    }
    let got = a.get(&s("n")).await.unwrap().unwrap();
    assert_eq!(field(&got, "n").as_f64(), Some(200.0));
    assert!(field_str(&got, "_rev").unwrap().starts_with("201-"));
    assert_indexes_clean(&a).await;
}

/// Opens `name` with no derived index declared (the write path then has no
/// index entry to keep in step, until another connection declares one).
async fn open_plain(name: &str) -> Store {
    Store::open(name, 2000, None, vec![]).await.expect("open")
}

/// The same barrier race as above on stores that maintain no index: over
/// 120 rounds on two connections exactly one writer wins and the stored body
/// is the winner's.
#[wasm_bindgen_test]
async fn without_indexes_two_writers_with_the_same_revision_exactly_one_wins_every_round() {
    let name = fresh_name("plain-barrier");
    let (a, b) = (open_plain(&name).await, open_plain(&name).await);
    let mut rev = a.put(&js(json!({"_id": "k", "n": 0}))).await.unwrap().rev;
    // Each connection has read the (empty) index state once.
    rev = b
        .put(&js(json!({"_id": "k", "_rev": rev, "n": 0})))
        .await
        .unwrap()
        .rev;
    race_rounds(&a, &b, rev, 120).await;
}

/// An update whose `_rev` is a tombstone's revision resurrects the record
/// (as in PouchDB) also when no index is maintained, and an older revision
/// still conflicts.
#[wasm_bindgen_test]
async fn without_indexes_a_tombstone_revision_still_resurrects() {
    let store = open_plain(&fresh_name("plain-tomb")).await;
    let r1 = store
        .put(&js(json!({"_id": "t", "n": 1})))
        .await
        .unwrap()
        .rev;
    let r2 = store
        .put(&js(json!({"_id": "t", "_rev": r1, "n": 2})))
        .await
        .unwrap()
        .rev;
    let tomb = store.delete(&s("t"), &s(&r2)).await.unwrap();
    let back = store
        .put(&js(json!({"_id": "t", "_rev": tomb, "n": 4})))
        .await
        .unwrap();
    assert!(back.rev.starts_with("4-"), "{}", back.rev);
    let e = store
        .put(&js(json!({"_id": "t", "_rev": r2, "n": 5})))
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::Conflict);
    let stored = store.get(&s("t")).await.unwrap().unwrap();
    assert_eq!(field(&stored, "n").as_f64(), Some(4.0));
}

/// A connection that last saw no index maintained, updating after another
/// connection declared and built one, keeps that index's entries (its
/// writes read the index state generation inside their transaction). Every
/// round changes `recordType`, so a missed entry shows as stale or missing
/// in `verifyIndexes`.
#[wasm_bindgen_test]
async fn an_update_after_another_connection_builds_an_index_maintains_it() {
    let name = fresh_name("plain-then-indexed");
    let plain = open_plain(&name).await;
    let mut rev = plain
        .put(&js(json!({"_id": "x", "recordType": "a"})))
        .await
        .unwrap()
        .rev;
    rev = plain
        .put(&js(json!({"_id": "x", "_rev": rev, "recordType": "b"})))
        .await
        .unwrap()
        .rev;
    let indexed = open_named(&name).await;
    for (round, kind) in ["c", "d", "e", "f"].iter().enumerate() {
        rev = plain
            .put(&js(
                json!({"_id": "x", "_rev": rev, "recordType": kind, "round": round}),
            ))
            .await
            .unwrap()
            .rev;
        assert_indexes_clean(&indexed).await;
    }
}

/// Group commit: writes issued together share one transaction, and each
/// keeps its own outcome. Over 40 rounds, two puts with the same revision,
/// a put of another id and a throwing mutate are issued at once: exactly one
/// of the two same-revision puts wins, the loser gets a ConflictError naming
/// the winner's revision, the other id is written and the throw reaches only
/// its own caller.
#[wasm_bindgen_test]
async fn writes_issued_together_keep_their_own_cas_outcomes_and_errors() {
    let (a, _) = open("group").await;
    let mut rev = a.put(&js(json!({"_id": "k", "n": 0}))).await.unwrap().rev;
    let thrower = js_sys::Function::new_with_args("cur", "throw new RangeError('mine')");
    for round in 0..40 {
        let other = format!("other-{round}");
        let rx = js(json!({"_id": "k", "n": round, "who": "x", "_rev": rev}));
        let ry = js(json!({"_id": "k", "n": round, "who": "y", "_rev": rev}));
        let rz = js(json!({"_id": other, "recordType": "counter"}));
        let k = s("k");
        let (x, y, z, t) = futures::join!(
            a.put(&rx),
            a.put(&ry),
            a.put(&rz),
            a.mutate(&k, &thrower, 0, None)
        );
        let (won, lost) = match (x, y) {
            (Ok(w), Err(e)) => (w, e),
            (Err(e), Ok(w)) => (w, e),
            (x, y) => panic!("round {round}: exactly one must win: {x:?} {y:?}"),
        };
        match &lost {
            agentstore::error::StoreError::Conflict { current_rev, .. } => {
                assert_eq!(current_rev.as_deref(), Some(won.rev.as_str()))
            }
            other => panic!("round {round}: the loser must conflict: {other:?}"),
        }
        assert!(z.unwrap().rev.starts_with("1-"));
        match t {
            Err(agentstore::error::StoreError::Thrown(v)) => {
                assert!(wasm_bindgen::JsCast::is_instance_of::<js_sys::RangeError>(
                    &v
                ))
            }
            other => panic!("round {round}: the throw must reach its caller: {other:?}"),
        }
        let stored = a.get(&s("k")).await.unwrap().unwrap();
        assert_eq!(
            field_str(&stored, "_rev").as_deref(),
            Some(won.rev.as_str())
        );
        rev = won.rev;
    }
    assert_indexes_clean(&a).await;
}

/// A shared transaction that fails (here: aborted after its writes by the
/// test hook) keeps nothing, and each of its writes is run again alone, so
/// each gets the outcome it would have had in a transaction of its own. A
/// write alone in its transaction still reports the failure.
#[wasm_bindgen_test]
async fn a_failed_shared_transaction_retries_each_write_alone() {
    let (a, _) = open("group-abort").await;
    let inc = js_sys::Function::new_with_args("cur", "return {...cur, n: (cur ? cur.n : 0) + 1};");
    for round in 0..10 {
        let (p, q) = (format!("p-{round}"), format!("q-{round}"));
        a.inject_abort_next_write();
        let (rp, rq, n) = (js(json!({"_id": p})), js(json!({"_id": q})), s("n"));
        let (x, y, z) = futures::join!(a.put(&rp), a.put(&rq), a.mutate(&n, &inc, 0, None));
        assert!(x.unwrap().rev.starts_with("1-"));
        assert!(y.unwrap().rev.starts_with("1-"));
        assert!(z.unwrap().is_some());
    }
    let n = a.get(&s("n")).await.unwrap().unwrap();
    assert_eq!(field(&n, "n").as_f64(), Some(10.0));
    a.inject_abort_next_write();
    let alone = a.put(&js(json!({"_id": "alone"}))).await;
    assert_eq!(code(&alone.unwrap_err()), ErrorCode::Transaction);
    assert!(a.get(&s("alone")).await.unwrap().is_none());
    assert_indexes_clean(&a).await;
}

/// `delete` joins a group of single-record writes like `put`: issued
/// together with puts, a deletion of a missing id and a put racing it on
/// the same revision, in a shared transaction the test hook aborts after
/// its writes, each is run again alone and keeps its own outcome (20
/// rounds): the other put is written, exactly one of the deletion and the
/// racing put wins and the loser's ConflictError names the winner's
/// revision (what `get` then answers: the put's record, or none), and the
/// missing id gets NotFoundError.
#[wasm_bindgen_test]
async fn a_delete_issued_with_other_writes_shares_their_transaction_and_keeps_its_outcome() {
    let (a, _) = open("group-delete").await;
    let unknown = s(&format!("1-{}", "0".repeat(32)));
    for round in 0..20 {
        let rev = a
            .put(&js(json!({"_id": "k", "n": round})))
            .await
            .unwrap()
            .rev;
        let (p, missing, k, kr) = (
            js(json!({"_id": format!("p-{round}")})),
            s(&format!("missing-{round}")),
            s("k"),
            s(&rev),
        );
        let racer = js(json!({"_id": "k", "n": -1, "_rev": rev}));
        a.inject_abort_next_write();
        let (x, d, m, r) = futures::join!(
            a.put(&p),
            a.delete(&k, &kr),
            a.delete(&missing, &unknown),
            a.put(&racer)
        );
        assert!(x.unwrap().rev.starts_with("1-"), "round {round}");
        assert_eq!(code(&m.unwrap_err()), ErrorCode::NotFound, "round {round}");
        let (won, lost, deleted) = match (d, r) {
            (Ok(t), Err(e)) => (t, e, true),
            (Err(e), Ok(w)) => (w.rev, e, false),
            (d, r) => panic!("round {round}: exactly one must win: {d:?} {r:?}"),
        };
        match &lost {
            agentstore::error::StoreError::Conflict { current_rev, .. } => {
                assert_eq!(current_rev.as_deref(), Some(won.as_str()), "round {round}")
            }
            other => panic!("round {round}: the loser must conflict: {other:?}"),
        }
        let stored = a.get(&s("k")).await.unwrap();
        let stored_rev = stored.as_ref().and_then(|r| field_str(r, "_rev"));
        let expected = (!deleted).then_some(won.as_str());
        assert_eq!(stored_rev.as_deref(), expected, "round {round}");
    }
    assert_indexes_clean(&a).await;
}

/// A write never joins a group started before another transaction the
/// caller issued in between: `put(y)`, `deleteMany([x])` (a transaction of
/// its own), `put(x)` issued in that order without awaiting run in that
/// order (the create of `x` follows its tombstone), every round; and so do
/// `put(y)`, `delete(x)`, `put(x)`, which share one group in that order.
#[wasm_bindgen_test]
async fn a_write_issued_after_a_delete_never_runs_before_it() {
    let (a, _) = open("group-order").await;
    for round in 0..20 {
        let (x, y) = (format!("x-{round}"), format!("y-{round}"));
        let rev = a.put(&js(json!({"_id": x}))).await.unwrap().rev;
        let (ry, rx, kx, kr) = (
            js(json!({"_id": y})),
            js(json!({"_id": x, "again": true})),
            s(&x),
            s(&rev),
        );
        let batch = js(json!([{"id": x, "rev": rev}]));
        let (py, dx, px) = if round % 2 == 0 {
            let (py, dx, px) = futures::join!(a.put(&ry), a.delete_many(&batch), a.put(&rx));
            (py, dx.map(|mut revs| revs.remove(0)), px)
        } else {
            futures::join!(a.put(&ry), a.delete(&kx, &kr), a.put(&rx))
        };
        py.unwrap();
        let tomb = dx.unwrap();
        let again = px.unwrap();
        assert!(
            tomb.starts_with("2-") && again.rev.starts_with("3-"),
            "{tomb} {}",
            again.rev
        );
    }
    assert_indexes_clean(&a).await;
}

/// An abort while an async `mutate` function is pending (one that never
/// settles) rejects the call with AbortError carrying the signal's reason,
/// instead of holding it forever, and nothing is written. (The backoff sleep
/// between attempts is raced against the signal the same way.)
#[wasm_bindgen_test]
async fn an_abort_while_an_async_mutate_function_is_pending_rejects_the_call() {
    let (store, _) = open("abort-pending").await;
    let rev = store
        .put(&js(json!({"_id": "u", "v": 1})))
        .await
        .unwrap()
        .rev;
    let never = js_sys::Function::new_with_args("cur", "return new Promise(() => {});");
    for round in 0..5 {
        let ctl = web_sys::AbortController::new().unwrap();
        let signal = ctl.signal();
        // Aborted from a timer once the call is waiting on the function.
        let abort_later =
            Closure::once_into_js(move || ctl.abort_with_reason(&JsValue::from_str("stop")));
        let set_timeout: js_sys::Function =
            js_sys::Reflect::get(&js_sys::global(), &"setTimeout".into())
                .unwrap()
                .unchecked_into();
        set_timeout
            .call2(&JsValue::NULL, &abort_later, &JsValue::from(round * 10))
            .unwrap();
        // The test's own bound: a call still pending 10 s after the abort fails.
        let bound = wasm_bindgen_futures::JsFuture::from(js_sys::Promise::new(&mut |ok, _| {
            set_timeout
                .call2(&JsValue::NULL, &ok, &JsValue::from(10_000))
                .unwrap();
        }));
        let key = s("u");
        let call = store.mutate(&key, &never, 8, Some(&signal));
        let e = match futures::future::select(Box::pin(call), Box::pin(bound)).await {
            futures::future::Either::Left((r, _)) => r.unwrap_err(),
            futures::future::Either::Right(_) => {
                panic!("round {round}: still pending after the abort")
            }
        };
        match e {
            agentstore::error::StoreError::Aborted(reason) => {
                assert_eq!(reason.as_string().as_deref(), Some("stop"))
            }
            other => panic!("round {round}: {other:?}"),
        }
    }
    let got = store.get(&s("u")).await.unwrap().unwrap();
    assert_eq!(field_str(&got, "_rev").as_deref(), Some(rev.as_str()));
}

/// A write issued after `close()` is refused with ClosedError even while a
/// group of this connection is still running (it would otherwise join it
/// and be committed); the write issued before `close()` completes.
#[wasm_bindgen_test]
async fn a_write_issued_after_close_is_refused_while_a_group_is_open() {
    let (a, name) = open("group-close").await;
    let (ra, rb) = (js(json!({"_id": "before"})), js(json!({"_id": "after"})));
    let (x, y) = futures::join!(a.put(&ra), async {
        a.close();
        a.put(&rb).await
    });
    assert!(x.unwrap().rev.starts_with("1-"), "issued before close()");
    assert_eq!(code(&y.unwrap_err()), ErrorCode::Closed);
    let again = open_named(&name).await;
    assert!(again.get(&s("before")).await.unwrap().is_some());
    assert!(again.get(&s("after")).await.unwrap().is_none());
}

/// When a shared transaction fails and a read was issued after its writes,
/// the writes are not run again behind the read's back: each gets the
/// transaction's error, so a read never misses a write that then reports
/// success. 10 rounds.
#[wasm_bindgen_test]
async fn a_read_issued_after_grouped_writes_never_misses_a_write_that_succeeded() {
    let (a, _) = open("group-order-fail").await;
    for round in 0..10 {
        let (p, q) = (format!("p-{round}"), format!("q-{round}"));
        let (rp, rq, kp) = (js(json!({"_id": p})), js(json!({"_id": q})), s(&p));
        a.inject_abort_next_write();
        let (x, y, got) = futures::join!(a.put(&rp), a.put(&rq), a.get(&kp));
        let got = got.unwrap();
        assert_eq!(
            x.is_ok(),
            got.is_some(),
            "round {round}: the read sees p exactly when p's put succeeded"
        );
        assert_eq!(code(&x.unwrap_err()), ErrorCode::Transaction);
        assert_eq!(code(&y.unwrap_err()), ErrorCode::Transaction);
    }
    assert_indexes_clean(&a).await;
}

/// Only transactions on the same database close a group or stop its
/// writes being run again: with a read on another database issued after
/// two grouped writes, a shared transaction that fails still runs each
/// write again alone, and both succeed (10 rounds). Before, one counter for
/// every database (also the lease journal's) made both writes fail with
/// the transaction's error. Review finding (helper-178).
#[wasm_bindgen_test]
async fn a_read_on_another_database_does_not_stop_a_failed_groups_writes_being_run_again() {
    let (a, _) = open("group-other-db-a").await;
    let (b, _) = open("group-other-db-b").await;
    a_failed_group_is_run_again_despite_a_read_on(&a, &b).await;
}

/// Which of the 64 transaction counters database `name` shared before
/// (src/store/db.rs `tx_seq`, a hash of the name, until helper-187): two
/// names on one slot shared a counter.
fn old_counter_slot(name: &str) -> u32 {
    name.bytes()
        .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)))
        % 64
}

/// As above, with two database names that shared a transaction counter
/// before: a fresh store's and the lease journal's, `agentstore-leases`
/// (a lease heartbeat's write there during a group). Every database has a
/// counter of its own: the failed group's writes are still run again
/// alone, and both succeed. Before, the read on the journal's database
/// made both writes fail with the transaction's error (as do "agents" and
/// "tasks", "store" and "app", "cache" and "records"). Review finding
/// (helper-187).
#[wasm_bindgen_test]
async fn a_read_on_a_database_whose_name_shared_a_counter_does_not_stop_the_run_again() {
    let journal = "agentstore-leases";
    let base = fresh_name("group-collide");
    let name = (0..)
        .map(|i| format!("{base}-{i}"))
        .find(|n| old_counter_slot(n) == old_counter_slot(journal))
        .unwrap();
    assert_eq!(
        (
            old_counter_slot("agents"),
            old_counter_slot("store"),
            old_counter_slot("cache")
        ),
        (
            old_counter_slot("tasks"),
            old_counter_slot("app"),
            old_counter_slot("records")
        ),
        "the pairs the review named shared a slot"
    );
    let a = open_named(&name).await;
    let b = open_named(journal).await;
    a_failed_group_is_run_again_despite_a_read_on(&a, &b).await;
}

/// Two grouped writes on `a` whose shared transaction fails, with a read
/// on `b` (another database) issued after them: each write is run again
/// alone and succeeds (10 rounds).
async fn a_failed_group_is_run_again_despite_a_read_on(a: &Store, b: &Store) {
    for round in 0..10 {
        let (p, q) = (format!("p-{round}"), format!("q-{round}"));
        let (rp, rq, kp) = (js(json!({"_id": p})), js(json!({"_id": q})), s(&p));
        a.inject_abort_next_write();
        let (x, y, got) = futures::join!(a.put(&rp), a.put(&rq), b.get(&kp));
        assert!(
            got.unwrap().is_none(),
            "round {round}: b is another database"
        );
        assert!(x.unwrap().rev.starts_with("1-"), "round {round}");
        assert!(y.unwrap().rev.starts_with("1-"), "round {round}");
        assert!(a.get(&kp).await.unwrap().is_some(), "round {round}");
    }
    assert_indexes_clean(a).await;
}

/// Group commit keeps issue order across connections too: a write issued
/// on connection A after a read on connection B (same tick, no awaits) never
/// joins a group A started before that read, so the read does not see it.
/// Before, A's second put joined A's first put's transaction, which B's read
/// (created after it) waited for: the read saw a write issued after it.
/// Review finding (helper-175).
#[wasm_bindgen_test]
async fn a_read_on_another_connection_never_sees_a_write_issued_after_it() {
    let (a, name) = open("group-cross-order").await;
    let b = open_named(&name).await;
    for round in 0..10 {
        let (first, later) = (format!("a-{round}"), format!("x-{round}"));
        let (ra, rx, kx) = (
            js(json!({"_id": first})),
            js(json!({"_id": later})),
            s(&later),
        );
        let (w1, got, w2) = futures::join!(a.put(&ra), b.get(&kx), a.put(&rx));
        w1.unwrap();
        w2.unwrap();
        assert!(
            got.unwrap().is_none(),
            "round {round}: the read saw a write issued after it"
        );
        assert!(
            b.get(&kx).await.unwrap().is_some(),
            "round {round}: written"
        );
    }
    assert_indexes_clean(&a).await;
}

/// Holds a readwrite transaction over `records` of database `name`, from a
/// connection of its own, until the returned function is called (it keeps
/// the transaction active by chaining requests): every write transaction
/// of the store waits behind it.
async fn hold_records(name: &str) -> js_sys::Function {
    let hold = js_sys::Function::new_with_args(
        "name",
        "return new Promise((resolve, reject) => {
           const open = indexedDB.open(name);
           open.onerror = () => reject(open.error);
           open.onsuccess = () => {
             const db = open.result;
             const tx = db.transaction(['records'], 'readwrite');
             let held = true;
             tx.oncomplete = () => db.close();
             const spin = () => { if (held) tx.objectStore('records').get('').onsuccess = spin; };
             tx.objectStore('records').get('').onsuccess = () => {
               resolve(() => { held = false; });
               spin();
             };
           };
         });",
    );
    let p = hold.call1(&JsValue::NULL, &s(name)).unwrap();
    wasm_bindgen_futures::JsFuture::from(js_sys::Promise::from(p))
        .await
        .unwrap()
        .unchecked_into()
}

/// An `abort` event while a `mutate` call runs its function counts, whatever
/// `signal.aborted` reads (a synthetic event on a real signal; a real abort
/// of a signal whose `aborted` getter was redefined): fired inside a
/// synchronous function, inside the synchronous part of one returning a
/// Promise, or after an `await` of an async one (between its Promise and
/// the wait for it), the call rejects with AbortError (`cause`: the
/// signal's reason) and nothing is written. Before, only `signal.aborted`
/// was read after the function ran, and all six shapes wrote `n = 1`.
/// Found by helper-218.
#[wasm_bindgen_test]
async fn an_abort_event_while_a_mutate_function_runs_rejects_and_writes_nothing() {
    let (store, name) = open("abort-event-in-fn").await;
    store.put(&js(json!({"_id": "k", "n": 0}))).await.unwrap();
    let api: JsValue = agentstore::AgentStore::from_store(
        Store::open(&name, 2000, None, vec![by_type()])
            .await
            .unwrap(),
    )
    .into();
    let never_aborted = js_sys::Function::new_with_args(
        "s",
        "Object.defineProperty(s, 'aborted', { get: () => false });",
    );
    let shapes = [
        "(cur) => { FIRE; return { ...cur, n: 1 }; }",
        "(cur) => { FIRE; return Promise.resolve({ ...cur, n: 1 }); }",
        "async (cur) => { await null; FIRE; return { ...cur, n: 1 }; }",
    ];
    for synthetic in [true, false] {
        for shape in shapes {
            let ctl = web_sys::AbortController::new().unwrap();
            let signal = ctl.signal();
            let fire = if synthetic {
                "c.signal.dispatchEvent(new Event('abort'))"
            } else {
                never_aborted.call1(&JsValue::NULL, &signal).unwrap();
                "c.abort('stop')"
            };
            let body = format!("return {};", shape.replace("FIRE", fire));
            let f = js_fn("c", &body, &ctl.clone().into());
            let opts = js(json!({"retries": 0}));
            js_sys::Reflect::set(&opts, &"signal".into(), &signal).unwrap();
            let r = invoke(&api, "mutate", &[s("k"), f, opts]).await;
            let what = format!("synthetic {synthetic}, {shape}");
            match &r {
                Err(e) => {
                    assert_eq!(
                        error_kind(e),
                        ("AbortError".into(), "aborted".into()),
                        "{what}"
                    );
                    let cause = (!synthetic).then(|| "stop".to_string());
                    assert_eq!(field_str(e, "cause"), cause, "{what}");
                }
                Ok(w) => panic!("{what}: written {w:?}"),
            }
            let k = store.get(&s("k")).await.unwrap().unwrap();
            assert_eq!(field(&k, "n").as_f64(), Some(0.0), "{what}");
        }
    }
    assert_indexes_clean(&store).await;
}

/// An abort while a `mutate` waits for its transaction (here queued behind
/// another connection's readwrite transaction) rejects the call at once
/// with AbortError, before that transaction ends, and the function is never
/// called and nothing of it is written; a `put` issued with it still
/// succeeds once the transaction can run. 10 rounds each, the mutate
/// leading the group (the put joins it) and joining it (the put leads).
#[wasm_bindgen_test]
async fn a_mutate_aborted_while_its_transaction_waits_rejects_at_once_and_writes_nothing() {
    let (a, name) = open("abort-queued").await;
    a.put(&js(json!({"_id": "k", "n": 0}))).await.unwrap();
    let calls = Rc::new(std::cell::Cell::new(0u32));
    let counted = calls.clone();
    let f: js_sys::Function = Closure::<dyn FnMut(JsValue) -> JsValue>::new(move |cur: JsValue| {
        counted.set(counted.get() + 1);
        let next = js_sys::Object::assign(&js_sys::Object::new(), cur.unchecked_ref());
        js_sys::Reflect::set(&next, &"n".into(), &JsValue::from(99)).unwrap();
        next.into()
    })
    .into_js_value()
    .unchecked_into();
    for round in 0..20 {
        let release = hold_records(&name).await;
        let ctl = web_sys::AbortController::new().unwrap();
        let signal = ctl.signal();
        let settled = Rc::new(RefCell::new(None));
        let (key, other) = (s("k"), js(json!({"_id": format!("p-{round}")})));
        let mutate = async {
            let r = a.mutate(&key, &f, 0, Some(&signal)).await;
            *settled.borrow_mut() = Some(r);
        };
        let put = a.put(&other);
        let driver = async {
            // Both calls were issued (polled) before this: abort, and the
            // mutate must settle while the other transaction still holds.
            ctl.abort_with_reason(&JsValue::from_str("stop"));
            wait_for("the aborted mutate to settle", || {
                settled.borrow().is_some()
            })
            .await;
            release.call0(&JsValue::NULL).unwrap();
        };
        let put = if round % 2 == 0 {
            futures::join!(mutate, put, driver).1
        } else {
            let (p, (), ()) = futures::join!(put, mutate, driver);
            p
        };
        assert!(put.unwrap().rev.starts_with("1-"), "round {round}");
        let got = settled.borrow_mut().take();
        match got {
            Some(Err(agentstore::error::StoreError::Aborted(reason))) => {
                assert_eq!(reason.as_string().as_deref(), Some("stop"), "round {round}")
            }
            other => panic!("round {round}: {other:?}"),
        }
    }
    assert_eq!(calls.get(), 0, "the function was never called");
    let k = a.get(&s("k")).await.unwrap().unwrap();
    assert_eq!(field(&k, "n").as_f64(), Some(0.0));
    assert_indexes_clean(&a).await;
}

/// A write whose call already rejected with AbortError never lands, also
/// when its signal's `abort` event fired while `signal.aborted` stays false
/// (a synthetic event on a real signal; a real abort of a signal whose
/// `aborted` getter was redefined): the mutate joins a group a `put` leads,
/// queued behind another connection's transaction, and is aborted so. The
/// put is written; the function is never called and `k` keeps its value.
/// Before, the group skipped only a member whose `signal.aborted` was true,
/// and wrote the rejected mutate's result. 10 rounds.
#[wasm_bindgen_test]
async fn a_write_whose_call_rejected_as_aborted_never_lands_even_for_a_synthetic_abort_event() {
    let (a, name) = open("abort-synthetic").await;
    a.put(&js(json!({"_id": "k", "n": 0}))).await.unwrap();
    let calls = Rc::new(std::cell::Cell::new(0u32));
    let counted = calls.clone();
    let f: js_sys::Function = Closure::<dyn FnMut(JsValue) -> JsValue>::new(move |_: JsValue| {
        counted.set(counted.get() + 1);
        js(json!({"n": 99}))
    })
    .into_js_value()
    .unchecked_into();
    let never_aborted = js_sys::Function::new_with_args(
        "s",
        "Object.defineProperty(s, 'aborted', { get: () => false });",
    );
    for round in 0..10 {
        let release = hold_records(&name).await;
        let ctl = web_sys::AbortController::new().unwrap();
        let signal = ctl.signal();
        let settled = Rc::new(RefCell::new(None));
        let (key, other) = (s("k"), js(json!({"_id": format!("p-{round}")})));
        let put = a.put(&other);
        let mutate = async {
            let r = a.mutate(&key, &f, 0, Some(&signal)).await;
            *settled.borrow_mut() = Some(r);
        };
        let driver = async {
            if round % 2 == 0 {
                let ev = web_sys::Event::new("abort").unwrap();
                signal.dispatch_event(&ev).unwrap();
            } else {
                never_aborted.call1(&JsValue::NULL, &signal).unwrap();
                ctl.abort();
            }
            wait_for("the aborted mutate to settle", || {
                settled.borrow().is_some()
            })
            .await;
            release.call0(&JsValue::NULL).unwrap();
        };
        let (put, (), ()) = futures::join!(put, mutate, driver);
        assert!(put.unwrap().rev.starts_with("1-"), "round {round}");
        let got = settled.borrow_mut().take();
        match got {
            Some(Err(e)) => assert_eq!(code(&e), ErrorCode::Aborted, "round {round}"),
            other => panic!("round {round}: {other:?}"),
        }
        // Anything the group still wrote for the mutate is committed now.
        let k = a.get(&s("k")).await.unwrap().unwrap();
        assert_eq!(field(&k, "n").as_f64(), Some(0.0), "round {round}");
    }
    assert_eq!(calls.get(), 0, "the function was never called");
    assert_indexes_clean(&a).await;
}

/// A `mutate` with a signal never leads a group others join: aborted while
/// its transaction waits, it takes no other write with it. Issued in this
/// order without awaiting — the mutate (aborted at once), `put(p)`,
/// `get(p)`, `putMany([p])` — the calls still take effect in issue order
/// (20 rounds): the put is written, the get reads it, the batch create of
/// the same id conflicts.
#[wasm_bindgen_test]
async fn an_aborted_mutate_never_moves_other_writes_after_later_calls() {
    let (a, name) = open("abort-order").await;
    let f = js_sys::Function::new_with_args("cur", "return {...cur, n: 1};");
    for round in 0..20 {
        let release = hold_records(&name).await;
        let ctl = web_sys::AbortController::new().unwrap();
        let signal = ctl.signal();
        let id = format!("p-{round}");
        let (key, p, pid, batch) = (
            s("k"),
            js(json!({"_id": id})),
            s(&id),
            js(json!([{"_id": id, "v": 2}])),
        );
        let driver = async {
            ctl.abort();
            release.call0(&JsValue::NULL).unwrap();
        };
        let (m, put, got, many, ()) = futures::join!(
            a.mutate(&key, &f, 0, Some(&signal)),
            a.put(&p),
            a.get(&pid),
            a.put_many(&batch),
            driver
        );
        assert_eq!(code(&m.unwrap_err()), ErrorCode::Aborted, "round {round}");
        let rev = put.unwrap().rev;
        let got = got.unwrap().expect("the get issued after the put reads it");
        assert_eq!(field_str(&got, "_rev").as_deref(), Some(rev.as_str()));
        assert_eq!(
            code(&many.unwrap_err()),
            ErrorCode::Conflict,
            "round {round}"
        );
    }
    assert!(
        a.get(&s("k")).await.unwrap().is_none(),
        "the mutate wrote nothing"
    );
    assert_indexes_clean(&a).await;
}

/// Overwrites the stored record `id` of database `name` with one whose
/// `_rev` does not parse, from a connection of its own (another script of
/// the origin, or an old release's bug).
async fn damage_rev(name: &str, id: &str) {
    let f = js_sys::Function::new_with_args(
        "name, id",
        "return new Promise((ok, err) => {
           const r = indexedDB.open(name);
           r.onerror = () => err(r.error);
           r.onsuccess = () => {
             const db = r.result;
             const tx = db.transaction(['records'], 'readwrite');
             tx.objectStore('records').put({ _id: id, _rev: 'not a revision' });
             tx.oncomplete = () => { db.close(); ok(); };
             tx.onabort = () => { db.close(); err(tx.error); };
           };
         });",
    );
    let p = f.call2(&JsValue::NULL, &s(name), &s(id)).unwrap();
    wasm_bindgen_futures::JsFuture::from(js_sys::Promise::from(p))
        .await
        .unwrap();
}

/// A stored record whose `_rev` does not parse fails only the write to its
/// id when that write shares a transaction with others issued in the same
/// tick: the others keep their own outcomes, also when a read issued after
/// them rules out running them again. Before, the damaged record failed
/// the shared transaction, and every write of it got that record's error.
/// 10 rounds.
#[wasm_bindgen_test]
async fn a_damaged_stored_revision_fails_only_its_own_write_in_a_shared_transaction() {
    let (a, name) = open("group-damaged").await;
    for round in 0..10 {
        let (bad, p, q) = (
            format!("bad-{round}"),
            format!("p-{round}"),
            format!("q-{round}"),
        );
        a.put(&js(json!({"_id": bad}))).await.unwrap();
        damage_rev(&name, &bad).await;
        let (rp, rb, rq, kp) = (
            js(json!({"_id": p})),
            js(json!({"_id": bad, "n": 1})),
            js(json!({"_id": q})),
            s(&p),
        );
        let (x, y, z, got) = futures::join!(a.put(&rp), a.put(&rb), a.put(&rq), a.get(&kp));
        assert!(x.is_ok(), "round {round}: {:?}", x.err());
        assert!(z.is_ok(), "round {round}: {:?}", z.err());
        assert_eq!(code(&y.unwrap_err()), ErrorCode::Transaction);
        assert!(got.unwrap().is_some(), "round {round}: the read sees p");
        assert!(a.get(&s(&q)).await.unwrap().is_some());
    }
}
