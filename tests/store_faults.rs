//! Every write is all or nothing, whatever fails inside it (issue 15).
//!
//! The IndexedDB layer's test hook makes the n-th write request of the next
//! write transaction fail — first, middle, last; a value IndexedDB cannot
//! clone (the request throws `DataCloneError`) or an `add()` of a key that
//! exists (`ConstraintError`, delivered asynchronously) — and each test checks
//! that nothing of the write is visible afterwards: records, tombstones,
//! derived-index entries and `watch` announcements.

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
                Fault::Constraint => {
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
