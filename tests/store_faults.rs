//! Every write is all or nothing, whatever fails inside it (issue 15).
//!
//! The IndexedDB layer's test hook makes the n-th write request of the next
//! write transaction fail — first, middle, last; a value IndexedDB cannot
//! clone (the request throws `DataCloneError`) or an `add()` of a key that
//! exists (`ConstraintError`, delivered asynchronously) — and each test checks
//! that nothing of the write is visible afterwards: records, tombstones,
//! derived-index entries and `watch` announcements.
// Tests may read and call the page's values with js-sys directly: a slot
// kept by a throw lasts only for the test page (clippy.toml).
#![allow(clippy::disallowed_methods)]

use agentstore::store::db::Fault;
use agentstore::store::{Store, Watcher};
use agentstore_protocol::ErrorCode;
use js_sys::{Array, Function};
use serde_json::json;
use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_test::*;

mod common;
use common::*;

wasm_bindgen_test_configure!(run_in_browser);

/// Everything a write could change: the snapshot (records + tombstones)
/// and the derived-index entries.
async fn visible(store: &Store) -> (String, String) {
    (
        store.export_snapshot().await.expect("export"),
        store.dump_entries().await.expect("entries"),
    )
}

/// A watcher that records the ids it is told about.
fn watch_ids(store: &Store) -> (Watcher, Array) {
    let seen = Array::new();
    let push = Function::new_with_args("change", "this.push(change.id)").bind0(&seen);
    let w = Watcher::new(store, "".into(), push).expect("watch");
    (w, seen)
}

/// Waits (bounded) until the watcher has announced `id`.
async fn announced(seen: &Array, id: &str) {
    for _ in 0..500 {
        if seen.iter().any(|v| v.as_string().as_deref() == Some(id)) {
            return;
        }
        gloo_timers::future::TimeoutFuture::new(10).await;
    }
    panic!("watch never announced {id}");
}

/// Store with one live record `old` (to be updated), one tombstone `gone`
/// (to be re-created) and the byType index active.
async fn seeded(tag: &str) -> (Store, String, String) {
    let (store, _) = open(tag).await;
    let old = store
        .put(&js(json!({"_id": "old", "recordType": "run", "n": 1})))
        .await
        .unwrap()
        .rev;
    let gone = store
        .put(&js(json!({"_id": "gone", "recordType": "run"})))
        .await
        .unwrap()
        .rev;
    let gone = store.delete(&s("gone"), &s(&gone)).await.unwrap();
    (store, old, gone)
}

/// Put/add requests (what the hook counts) of the batch below, in the order
/// issued: for each of the three records its record put (`add` for `new`)
/// and its new index entry (deletes of old entries and of `gone`'s tombstone
/// go between them).
const BATCH_REQUESTS: u32 = 6;

fn batch(old_rev: &str, gone_rev: &str) -> JsValue {
    js(json!([
        {"_id": "old", "_rev": old_rev, "recordType": "agent", "n": 2},
        {"_id": "gone", "_rev": gone_rev, "recordType": "run"},
        {"_id": "new", "recordType": "run"},
    ]))
}

#[wasm_bindgen_test]
async fn a_batch_failing_at_any_request_leaves_nothing_visible() {
    for kind in [Fault::Clone, Fault::Constraint] {
        for n in [0, BATCH_REQUESTS / 2, BATCH_REQUESTS - 1] {
            let (store, old, gone) = seeded("fault-batch").await;
            let before = visible(&store).await;
            let (watcher, seen) = watch_ids(&store);
            store.inject_request_fault(n, kind);
            let e = store
                .put_many(&batch(&old, &gone))
                .await
                .expect_err("the failing batch must fail");
            let msg = e.message();
            match kind {
                Fault::Clone => {
                    assert_eq!(e.code(), ErrorCode::Validation, "{kind:?}@{n}: {msg}");
                    assert!(msg.contains("DataCloneError"), "{kind:?}@{n}: {msg}");
                }
                _ => {
                    assert!(msg.contains("ConstraintError"), "{kind:?}@{n}: {msg}");
                }
            }
            assert_eq!(visible(&store).await, before, "{kind:?} at request {n}");
            // A later write is announced; the failed one never was.
            store.put(&js(json!({"_id": "sentinel"}))).await.unwrap();
            announced(&seen, "sentinel").await;
            assert_eq!(seen.length(), 1, "{kind:?}@{n}: {:?}", seen.to_vec());
            assert_indexes_clean(&store).await;
            // The batch itself still succeeds once nothing is injected.
            store.put_many(&batch(&old, &gone)).await.unwrap();
            // (A subscription lasts until closed.)
            watcher.close();
        }
    }
}

#[wasm_bindgen_test]
async fn single_writes_failing_at_any_request_leave_nothing_visible() {
    for kind in [Fault::Clone, Fault::Constraint] {
        // put (update with an index change: record put, then entry delete
        // and entry put)
        for n in 0..2 {
            let (store, old, _) = seeded("fault-put").await;
            let before = visible(&store).await;
            store.inject_request_fault(n, kind);
            assert!(store
                .put(&js(
                    json!({"_id": "old", "_rev": old, "recordType": "agent"})
                ))
                .await
                .is_err());
            assert_eq!(visible(&store).await, before, "put: {kind:?} at {n}");
        }
        // delete (tombstone put, record delete, entry delete): the tombstone
        // put is the only put the hook can replace
        let (store, old, _) = seeded("fault-delete").await;
        let before = visible(&store).await;
        store.inject_request_fault(0, kind);
        assert!(store.delete(&s("old"), &s(&old)).await.is_err());
        assert_eq!(visible(&store).await, before, "delete: {kind:?}");
        // deleteMany (a tombstone put per id). Before, its transaction did not
        // take the hook, so it went untested and the armed fault hit the
        // next unrelated write.
        for n in 0..2 {
            let (store, old, _) = seeded("fault-delete-many").await;
            let other = store
                .put(&js(json!({"_id": "other", "recordType": "run"})))
                .await
                .unwrap()
                .rev;
            let before = visible(&store).await;
            store.inject_request_fault(n, kind);
            let items = js(json!([{"id": "old", "rev": old}, {"id": "other", "rev": other}]));
            assert!(
                store.delete_many(&items).await.is_err(),
                "deleteMany: {kind:?} at {n}"
            );
            assert_eq!(visible(&store).await, before, "deleteMany: {kind:?} at {n}");
            store
                .put(&js(json!({"_id": "after"})))
                .await
                .expect("the hook was spent");
        }
        // mutate with a synchronous function
        let (store, _, _) = seeded("fault-mutate").await;
        let before = visible(&store).await;
        store.inject_request_fault(1, kind);
        let f = Function::new_with_args("r", "return {...r, recordType: 'agent'}");
        assert!(store.mutate(&s("old"), &f, 0, None).await.is_err());
        assert_eq!(visible(&store).await, before, "mutate: {kind:?}");
    }
}

/// A write whose transaction the browser refuses to mutate (its `put`
/// throws InvalidStateError, as in Firefox's first readwrite transaction
/// after a quota abort, which the SDK uses up itself: js/promise.js
/// `afterQuota`, tested in tests/e2e/quota_recovery.test.mjs) is a
/// TransactionError that wrote nothing, never a ClosedError: the store is
/// open, and the same write then succeeds, for every write call. Before,
/// each rejected with ClosedError (helper-201's finding in Firefox).
#[wasm_bindgen_test]
async fn a_write_whose_transaction_is_refused_is_no_closed_store() {
    let (store, _, _) = seeded("fault-refused").await;
    let refused = |e: agentstore::error::StoreError, what: &str| {
        assert_eq!(e.code(), ErrorCode::Transaction, "{what}: {e}");
        assert!(e.to_string().contains("InvalidStateError"), "{what}: {e}");
    };
    let put = js(json!({"_id": "p", "recordType": "run"}));
    store.inject_request_fault(0, Fault::Refused);
    refused(store.put(&put).await.unwrap_err(), "put");
    assert!(
        store.get(&s("p")).await.unwrap().is_none(),
        "nothing written"
    );
    assert!(store.put(&put).await.expect("put").rev.starts_with("1-"));
    let f = Function::new_with_args("r", "return {...r, n: 3}");
    store.inject_request_fault(0, Fault::Refused);
    refused(
        store.mutate(&s("old"), &f, 0, None).await.unwrap_err(),
        "mutate",
    );
    let old = store.mutate(&s("old"), &f, 0, None).await.expect("mutate");
    let old = old.expect("written").rev;
    store.inject_request_fault(0, Fault::Refused);
    refused(
        store.delete(&s("old"), &s(&old)).await.unwrap_err(),
        "delete",
    );
    store.delete(&s("old"), &s(&old)).await.expect("delete");
    let many = js(json!([{"_id": "m1"}, {"_id": "m2"}]));
    store.inject_request_fault(0, Fault::Refused);
    refused(store.put_many(&many).await.unwrap_err(), "putMany");
    let revs = store.put_many(&many).await.expect("putMany");
    let items = js(json!([{"id": "m1", "rev": revs[0].rev}, {"id": "m2", "rev": revs[1].rev}]));
    store.inject_request_fault(0, Fault::Refused);
    refused(store.delete_many(&items).await.unwrap_err(), "deleteMany");
    store.delete_many(&items).await.expect("deleteMany");
    for (id, live) in [("p", true), ("old", false), ("m1", false)] {
        assert_eq!(store.get(&s(id)).await.unwrap().is_some(), live, "{id}");
    }
    assert_indexes_clean(&store).await;
}

#[wasm_bindgen_test]
async fn an_import_failing_midway_leaves_nothing_visible() {
    let (store, _, _) = seeded("fault-import").await;
    let before = visible(&store).await;
    let lines: Vec<String> = (0..20)
        .map(|i| {
            json!({"_id": format!("imp{i:02}"), "_rev": "1-aa", "recordType": "run",
                   "updatedAt": "2026-01-01T00:00:00.000Z"})
            .to_string()
        })
        .collect();
    let text = format!(
        "{}\n{}\n",
        json!({"agentstore": "snapshot", "version": 1, "records": 20, "tombstones": 0}),
        lines.join("\n")
    );
    store.inject_request_fault(20, Fault::Constraint);
    assert!(store.import_snapshot(&text, None).await.is_err());
    assert_eq!(visible(&store).await, before);
}

#[wasm_bindgen_test]
async fn values_indexeddb_cannot_clone_are_stored_as_the_plain_data_json_sees() {
    let (store, _) = open("fault-clone-values").await;
    // A Proxy (structured clone throws DataCloneError on it) and an object
    // whose field is a getter: stored as the plain data JSON.stringify sees.
    let rec: JsValue = js_sys::eval(
        "({_id: 'p', meta: new Proxy({k: 1}, {}), get g() { return 2; }, \
          list: new Proxy([1, 2], {})})",
    )
    .unwrap();
    store
        .put_many(&Array::of2(&js(json!({"_id": "a", "ok": true})), &rec).into())
        .await
        .unwrap();
    let got = store.get(&s("p")).await.unwrap().unwrap();
    let text: String = js_sys::JSON::stringify(&got).unwrap().into();
    assert!(text.contains(r#""meta":{"k":1}"#), "{text}");
    assert!(text.contains(r#""g":2"#), "{text}");
    assert!(text.contains(r#""list":[1,2]"#), "{text}");
    // A getter that throws: ValidationError naming the field, nothing written.
    let bad: JsValue =
        js_sys::eval("({_id: 'b', nested: {get boom() { throw new Error('no'); }}})").unwrap();
    let e = store
        .put_many(&Array::of2(&js(json!({"_id": "c"})), &bad).into())
        .await
        .unwrap_err();
    assert_eq!(code(&e), ErrorCode::Validation);
    let failures = match &e {
        agentstore::StoreError::Validation { failures, .. } => failures.clone(),
        other => panic!("{other:?}"),
    };
    assert_eq!(failures.len(), 1);
    assert!(
        failures[0].message.contains("nested.boom"),
        "{}",
        failures[0].message
    );
    assert!(store.get(&s("c")).await.unwrap().is_none());
    // A typed array over a detached buffer is not plain JSON data: refused.
    let detached: JsValue = js_sys::eval(
        "(() => { const b = new ArrayBuffer(8); const v = new Uint8Array(b); \
          structuredClone(b, {transfer: [b]}); return {_id: 'd', bytes: v}; })()",
    )
    .unwrap();
    let e = store.put(&detached).await.unwrap_err();
    assert_eq!(code(&e), ErrorCode::Validation);
    assert!(e.message().contains("field bytes"), "{}", e.message());
}

#[wasm_bindgen_test]
async fn updated_at_is_now_unless_the_caller_changed_it() {
    let (store, _) = open("updated-at").await;
    let given = "2020-01-01T00:00:00.000Z";
    let w = store
        .put(&js(json!({"_id": "u", "updatedAt": given})))
        .await
        .unwrap();
    let stored = store.get(&s("u")).await.unwrap().unwrap();
    assert_eq!(field_str(&stored, "updatedAt").as_deref(), Some(given));
    // put({...stored, name}) carries the stored timestamp: it becomes now.
    let edit = js_sys::Object::assign(&js_sys::Object::new(), stored.unchecked_ref());
    js_sys::Reflect::set(&edit, &"name".into(), &"x".into()).unwrap();
    let w2 = store.put(&edit).await.unwrap();
    let after = store.get(&s("u")).await.unwrap().unwrap();
    let now = field_str(&after, "updatedAt").unwrap();
    assert!(now.as_str() > given, "{now}");
    assert_ne!(w2.rev, w.rev);
    // A different value given by the caller is kept.
    let mine = "2021-06-01T12:00:00.000Z";
    js_sys::Reflect::set(&after, &"updatedAt".into(), &mine.into()).unwrap();
    store.put(&after).await.unwrap();
    let kept = store.get(&s("u")).await.unwrap().unwrap();
    assert_eq!(field_str(&kept, "updatedAt").as_deref(), Some(mine));
    // Absent: now.
    store.put(&js(json!({"_id": "v"}))).await.unwrap();
    let v = store.get(&s("v")).await.unwrap().unwrap();
    assert!(field_str(&v, "updatedAt").unwrap().as_str() > mine);
}

#[wasm_bindgen_test]
async fn the_same_write_on_the_same_parent_gives_the_same_revision() {
    let (a, _) = open("rev-a").await;
    let (b, _) = open("rev-b").await;
    let rec = json!({"_id": "r", "z": [1, 2.5, "s"], "a": {"y": null, "x": true},
                     "updatedAt": "2020-01-01T00:00:00.000Z"});
    let ra = a.put(&js(rec.clone())).await.unwrap().rev;
    let rb = b.put(&js(rec)).await.unwrap().rev;
    assert_eq!(ra, rb);
    // key order does not matter
    let (c, _) = open("rev-c").await;
    let rc = c
        .put(&js(json!({"updatedAt": "2020-01-01T00:00:00.000Z",
                        "a": {"x": true, "y": null}, "z": [1, 2.5, "s"], "_id": "r"})))
        .await
        .unwrap()
        .rev;
    assert_eq!(ra, rc);
}

/// How a transaction shared with other callers' writes is made to fail:
/// aborted after its writes, where a quota abort comes (at commit), or its
/// `n`-th write request failing asynchronously (a ConstraintError, which
/// aborts it as a request refused for quota does).
#[derive(Debug, Clone, Copy)]
enum Abort {
    AtCommit,
    Request(u32),
}

/// Arms `how` for the next write transaction of `store`: a request fault
/// is taken by the next one STARTED, an abort by the next one to COMMIT.
fn arm(store: &Store, how: Abort) {
    match how {
        Abort::AtCommit => store.inject_abort_next_write(),
        Abort::Request(n) => store.inject_request_fault(n, Fault::Constraint),
    }
}

/// `e` is the failure `how` causes, reported as the transaction's.
fn assert_failed_as(e: &agentstore::StoreError, how: Abort, what: &str) {
    let msg = e.message();
    assert_eq!(e.code(), ErrorCode::Transaction, "{what} {how:?}: {msg}");
    let cause = match how {
        Abort::AtCommit => "injected fault",
        Abort::Request(_) => "ConstraintError",
    };
    assert!(msg.contains(cause), "{what} {how:?}: {msg}");
}

/// Writes a sentinel and waits until the watcher announced it: every
/// change committed before it has been announced by then.
async fn settled_announcements(store: &Store, seen: &Array) -> Vec<String> {
    store.put(&js(json!({"_id": "sentinel"}))).await.unwrap();
    announced(seen, "sentinel").await;
    let mut ids: Vec<String> = seen.iter().map(|v| v.as_string().unwrap()).collect();
    ids.sort();
    ids
}

/// A revision no record here has: a compare-and-swap with it conflicts.
fn stale_rev() -> String {
    format!("1-{}", "0".repeat(32))
}

/// A `putMany` whose transaction fails (aborted at commit, or a request
/// failing first, middle or last) while single-record writes issued with
/// it share a group-commit transaction queued behind it: the batch rejects
/// with the transaction's error and nothing of it is kept or announced
/// (the record it updates keeps its revision, the tombstone it replaces
/// stays, the id it creates is free), and each grouped write keeps its own
/// outcome: the create of that same id succeeds, a stale revision
/// conflicts naming the stored one, a `mutate` applies once.
#[wasm_bindgen_test]
async fn a_put_many_failing_beside_grouped_writes_keeps_nothing_and_theirs_keep_their_outcomes() {
    let inc = Function::new_with_args("cur", "return {...cur, n: cur.n + 1};");
    for how in [
        Abort::AtCommit,
        Abort::Request(0),
        Abort::Request(BATCH_REQUESTS / 2),
        Abort::Request(BATCH_REQUESTS - 1),
    ] {
        let (store, old, gone) = seeded("fault-many-group").await;
        store
            .put(&js(json!({"_id": "counter", "recordType": "run", "n": 0})))
            .await
            .unwrap();
        let (watcher, seen) = watch_ids(&store);
        let (x, new, stale, counter) = (
            js(json!({"_id": "x", "recordType": "run"})),
            js(json!({"_id": "new", "recordType": "agent", "mine": true})),
            js(json!({"_id": "old", "_rev": stale_rev(), "n": 9})),
            s("counter"),
        );
        let many = batch(&old, &gone);
        // The batch's transaction starts first (and takes the fault); the
        // four single writes share the next one.
        arm(&store, how);
        let (many, px, pnew, pstale, m) = futures::join!(
            store.put_many(&many),
            store.put(&x),
            store.put(&new),
            store.put(&stale),
            store.mutate(&counter, &inc, 0, None)
        );
        assert_failed_as(&many.unwrap_err(), how, "putMany");
        assert!(px.unwrap().rev.starts_with("1-"), "{how:?}");
        assert!(pnew.unwrap().rev.starts_with("1-"), "{how:?}");
        match pstale {
            Err(agentstore::StoreError::Conflict { current_rev, .. }) => {
                assert_eq!(current_rev.as_deref(), Some(old.as_str()), "{how:?}")
            }
            other => panic!("{how:?}: the stale put must conflict: {other:?}"),
        }
        assert!(m.unwrap().unwrap().rev.starts_with("2-"), "{how:?}");
        // Nothing of the batch: `old` as seeded, `gone` still a tombstone
        // at its revision, `new` the single put's.
        let got = store.get(&s("old")).await.unwrap().unwrap();
        assert_eq!(field_str(&got, "_rev"), Some(old.clone()), "{how:?}");
        assert_eq!(field_str(&got, "recordType").as_deref(), Some("run"));
        assert!(store.get(&s("gone")).await.unwrap().is_none(), "{how:?}");
        assert!(
            store.export_snapshot().await.unwrap().contains(&gone),
            "{how:?}: the tombstone stays"
        );
        let got = store.get(&s("new")).await.unwrap().unwrap();
        assert_eq!(field(&got, "mine").as_bool(), Some(true), "{how:?}");
        let got = store.get(&s("counter")).await.unwrap().unwrap();
        assert_eq!(field(&got, "n").as_f64(), Some(1.0), "{how:?}");
        assert_indexes_clean(&store).await;
        assert_eq!(
            settled_announcements(&store, &seen).await,
            ["counter", "new", "sentinel", "x"],
            "{how:?}: only the writes that committed are announced"
        );
        watcher.close();
    }
}

/// The other way round: a group-commit transaction of single-record writes
/// fails (aborted at commit, or a request failing first or last) while a
/// `putMany` issued after them waits behind it. Each grouped write rejects
/// with the transaction's error (run again, it would land after the batch
/// issued after it) and nothing of them is kept or announced; the batch
/// commits whole.
#[wasm_bindgen_test]
async fn a_grouped_transaction_failing_before_a_put_many_keeps_nothing_of_it_and_the_batch_commits()
{
    let inc = Function::new_with_args("cur", "return {...cur, n: cur.n + 1};");
    // Counted write requests of the group: x and y (a record and an entry
    // each), the counter (its record and its new entry).
    const GROUP_REQUESTS: u32 = 6;
    for how in [
        Abort::AtCommit,
        Abort::Request(0),
        Abort::Request(GROUP_REQUESTS - 1),
    ] {
        let (store, old, gone) = seeded("fault-group-many").await;
        store
            .put(&js(json!({"_id": "counter", "recordType": "run", "n": 0})))
            .await
            .unwrap();
        let (watcher, seen) = watch_ids(&store);
        let (x, y, counter) = (
            js(json!({"_id": "x", "recordType": "run"})),
            js(json!({"_id": "y", "recordType": "run"})),
            s("counter"),
        );
        let many = batch(&old, &gone);
        arm(&store, how);
        let (px, py, m, many) = futures::join!(
            store.put(&x),
            store.put(&y),
            store.mutate(&counter, &inc, 0, None),
            store.put_many(&many)
        );
        assert_failed_as(&px.unwrap_err(), how, "put x");
        assert_failed_as(&py.unwrap_err(), how, "put y");
        assert_failed_as(&m.unwrap_err(), how, "mutate");
        let many = many.unwrap();
        assert!(store.get(&s("x")).await.unwrap().is_none(), "{how:?}");
        assert!(store.get(&s("y")).await.unwrap().is_none(), "{how:?}");
        let got = store.get(&s("counter")).await.unwrap().unwrap();
        assert_eq!(field(&got, "n").as_f64(), Some(0.0), "{how:?}");
        for w in &many {
            let got = store.get(&w.id.clone().into()).await.unwrap().unwrap();
            assert_eq!(field_str(&got, "_rev"), Some(w.rev.clone()), "{how:?}");
        }
        assert_indexes_clean(&store).await;
        assert_eq!(
            settled_announcements(&store, &seen).await,
            ["gone", "new", "old", "sentinel"],
            "{how:?}: only the batch's writes are announced"
        );
        watcher.close();
    }
}

/// An import whose second batch fails (aborted at commit, or a request
/// failing first or last) while single-record writes of this connection
/// and of another one run beside it: the import rejects with the
/// transaction's error, its first batch stays, nothing of the failing batch
/// (nor of the one after) is kept or announced, and every other write keeps
/// its own outcome (created, a stale revision conflicting, a `mutate`
/// applied once). Running the import again completes it. (The store is not
/// empty, so the import reads before it writes: a ConstraintError there is
/// not taken for another writer's `add` race and retried.)
#[wasm_bindgen_test]
async fn an_import_batch_failing_beside_grouped_writes_keeps_nothing_of_it_and_theirs_keep_their_outcomes(
) {
    use std::rc::Rc;
    let inc = Function::new_with_args("cur", "return {...cur, n: cur.n + 1};");
    let lines: Vec<String> = (0..30)
        .map(|i| {
            json!({"_id": format!("imp{i:02}"), "_rev": "1-aa", "recordType": "run",
                   "updatedAt": "2026-01-01T00:00:00.000Z"})
            .to_string()
        })
        .collect();
    let text = format!(
        "{}\n{}\n",
        json!({"agentstore": "snapshot", "version": 1, "records": 30, "tombstones": 0}),
        lines.join("\n")
    );
    // Counted write requests of one batch of 10: a record and an entry each.
    for how in [Abort::AtCommit, Abort::Request(0), Abort::Request(19)] {
        let name = fresh_name("fault-import-group");
        let a = Rc::new(open_named(&name).await);
        let b = open_named(&name).await;
        let counter = a
            .put(&js(json!({"_id": "counter", "recordType": "run", "n": 0})))
            .await
            .unwrap()
            .rev;
        let (watcher, seen) = watch_ids(&a);
        // After the first batch committed: arm the fault for the next one.
        let (a2, batches) = (a.clone(), Rc::new(std::cell::Cell::new(0)));
        let b2 = batches.clone();
        let progress = wasm_bindgen::closure::Closure::<dyn FnMut(u32, u32)>::new(
            move |_done: u32, _total: u32| {
                b2.set(b2.get() + 1);
                if b2.get() == 1 {
                    arm(&a2, how);
                }
            },
        );
        let opts = agentstore::store::ImportOptions {
            on_progress: Some(progress.as_ref().unchecked_ref::<Function>().clone()),
            signal: None,
            batch: 10,
        };
        let source = JsValue::from_str(&text);
        let (x, stale, ctr, y, z) = (
            js(json!({"_id": "x", "recordType": "run"})),
            js(json!({"_id": "counter", "_rev": stale_rev()})),
            s("counter"),
            js(json!({"_id": "y", "recordType": "agent"})),
            js(json!({"_id": "z"})),
        );
        // a's single writes start the first transaction (their group
        // commits before the import's first batch does, so the fault armed
        // after that batch is the import's); b's share transactions of b.
        let (px, pstale, m, imported, py, pz) = futures::join!(
            a.put(&x),
            a.put(&stale),
            a.mutate(&ctr, &inc, 0, None),
            a.import_snapshot_with(&source, &opts),
            b.put(&y),
            b.put(&z)
        );
        assert_failed_as(&imported.unwrap_err(), how, "import");
        assert_eq!(batches.get(), 1, "{how:?}: only the first batch committed");
        assert!(px.unwrap().rev.starts_with("1-"), "{how:?}");
        match pstale {
            Err(agentstore::StoreError::Conflict { current_rev, .. }) => {
                assert!(current_rev.is_some(), "{how:?}")
            }
            other => panic!("{how:?}: the stale put must conflict: {other:?}"),
        }
        let m = m.unwrap().unwrap();
        assert!(m.rev.starts_with("2-") && m.rev != counter, "{how:?}");
        assert!(py.unwrap().rev.starts_with("1-"), "{how:?}");
        assert!(pz.unwrap().rev.starts_with("1-"), "{how:?}");
        let ids: Vec<String> = (0..30).map(|i| format!("imp{i:02}")).collect();
        let got = a
            .get_many(&ids.iter().map(|i| s(i)).collect::<Array>().into())
            .await
            .unwrap();
        let present: Vec<bool> = got.iter().map(|r| !r.is_null()).collect();
        let want: Vec<bool> = (0..30).map(|i| i < 10).collect();
        assert_eq!(present, want, "{how:?}: the first batch only");
        for id in ["x", "y", "z"] {
            assert!(a.get(&s(id)).await.unwrap().is_some(), "{how:?}: {id}");
        }
        let got = a.get(&s("counter")).await.unwrap().unwrap();
        assert_eq!(field(&got, "n").as_f64(), Some(1.0), "{how:?}");
        assert_indexes_clean(&a).await;
        let heard = settled_announcements(&a, &seen).await;
        for id in &ids[10..] {
            assert!(!heard.contains(id), "{how:?}: {id} was announced");
        }
        for id in ids[..10].iter().map(String::as_str).chain(["x", "counter"]) {
            assert!(heard.iter().any(|h| h == id), "{how:?}: {id} not announced");
        }
        // Nothing armed any more: the same import completes.
        let again = a.import_snapshot(source, None).await.unwrap();
        assert_eq!((again.written, again.kept_newer), (20, 10), "{how:?}");
        assert_indexes_clean(&a).await;
        watcher.close();
    }
}

/// A group-commit transaction whose n-th write request fails (every n),
/// with nothing issued after it: nothing of it is kept, and each of its
/// writes is run again alone and gets the outcome it would have had alone
/// (the creates succeed, a stale revision conflicts naming the stored one,
/// a `mutate` applies once), each announced once.
#[wasm_bindgen_test]
async fn a_grouped_transaction_whose_request_fails_runs_each_write_again_alone() {
    let inc = Function::new_with_args("cur", "return {...cur, n: cur.n + 1};");
    // x and y (a record and an entry each), the counter (record, new entry).
    const GROUP_REQUESTS: u32 = 6;
    for n in 0..GROUP_REQUESTS {
        let (store, _) = open("fault-group-request").await;
        let counter = store
            .put(&js(json!({"_id": "counter", "recordType": "run", "n": 0})))
            .await
            .unwrap()
            .rev;
        let (watcher, seen) = watch_ids(&store);
        let (x, y, stale, ctr) = (
            js(json!({"_id": "x", "recordType": "run"})),
            js(json!({"_id": "y", "recordType": "agent"})),
            js(json!({"_id": "counter", "_rev": stale_rev(), "n": 9})),
            s("counter"),
        );
        arm(&store, Abort::Request(n));
        let (px, py, m, pstale) = futures::join!(
            store.put(&x),
            store.put(&y),
            store.mutate(&ctr, &inc, 0, None),
            store.put(&stale)
        );
        assert!(px.unwrap().rev.starts_with("1-"), "request {n}");
        assert!(py.unwrap().rev.starts_with("1-"), "request {n}");
        let m = m.unwrap().unwrap();
        assert!(m.rev.starts_with("2-"), "request {n}");
        match pstale {
            Err(agentstore::StoreError::Conflict { current_rev, .. }) => {
                assert_eq!(current_rev, Some(m.rev.clone()), "request {n}")
            }
            other => panic!("request {n}: the stale put must conflict: {other:?}"),
        }
        let got = store.get(&s("counter")).await.unwrap().unwrap();
        assert_eq!(field(&got, "n").as_f64(), Some(1.0), "request {n}");
        assert_ne!(m.rev, counter);
        assert_indexes_clean(&store).await;
        assert_eq!(
            settled_announcements(&store, &seen).await,
            ["counter", "sentinel", "x", "y"],
            "request {n}"
        );
        watcher.close();
    }
}
