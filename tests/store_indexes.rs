//! Derived indexes: written in the record's own transaction, never orphaned
//! by concurrent writers, verified and rebuilt deterministically.
// Tests may read and call the page's values with js-sys directly: a slot
// kept by a throw lasts only for the test page (clippy.toml).
#![allow(clippy::disallowed_methods)]

use agentstore::store::{ByQuery, Store};
use agentstore_protocol::index::IndexDef;
use agentstore_protocol::ErrorCode;
use serde_json::{json, Value};
use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_test::*;

mod common;
use common::*;

wasm_bindgen_test_configure!(run_in_browser);

/// Every id listed by `byType` for query `q`, following `next` cursors.
async fn by_all(store: &Store, q: Value) -> Vec<String> {
    let mut out = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let mut qv = q.clone();
        if let Some(a) = &after {
            qv["after"] = json!(a);
        }
        let page = store
            .list_by("byType", &ByQuery::from_js(&js(qv)).unwrap())
            .await
            .unwrap();
        out.extend(page.records.iter().map(|r| field_str(&r, "_id").unwrap()));
        match page.next {
            None => return out,
            Some(n) => after = Some(n),
        }
    }
}

/// An index over `owner`, beside `byType`.
fn by_owner() -> IndexDef {
    IndexDef {
        name: "byOwner".into(),
        keys: vec!["owner".into()],
    }
}

fn at(n: u32) -> String {
    format!(
        "2026-03-01T08:{:02}:{:02}.{:03}Z",
        n / 3600 % 60,
        n / 60 % 60,
        n % 1000
    )
}

#[wasm_bindgen_test]
async fn list_by_type_returns_one_type_newest_first_and_eq_is_exact() {
    let (store, _) = open("idx-basic").await;
    let mut recs = Vec::new();
    for i in 0..40u32 {
        let t = ["run", "runs", "agent", "ru"][i as usize % 4];
        recs.push(json!({"_id": format!("r{i:02}"), "recordType": t, "updatedAt": at(i * 7)}));
    }
    store.put_many(&js(Value::Array(recs))).await.unwrap();
    let got = by_all(&store, json!({"eq": "run", "descending": true, "limit": 3})).await;
    let want: Vec<String> = (0..40)
        .rev()
        .filter(|i| i % 4 == 0)
        .map(|i| format!("r{i:02}"))
        .collect();
    assert_eq!(
        got, want,
        "only 'run', newest updatedAt first, across pages"
    );
    assert_eq!(
        by_all(&store, json!({"prefix": "ru", "limit": 100}))
            .await
            .len(),
        30
    );
    assert_eq!(
        by_all(&store, json!({"eq": ["agent", at(2 * 7)]})).await,
        vec!["r02"]
    );
    assert_indexes_clean(&store).await;
}

/// 200 rounds: two writers on two connections save different records at
/// once; the index lists both every time.
#[wasm_bindgen_test]
async fn concurrent_saves_of_different_records_are_both_indexed() {
    let (a, name) = open("idx-race").await;
    let b = open_named(&name).await;
    for round in 0..200u32 {
        let (ra, rb) = (
            js(json!({"_id": format!("a{round:03}"), "recordType": "run", "updatedAt": at(round)})),
            js(json!({"_id": format!("b{round:03}"), "recordType": "run", "updatedAt": at(round)})),
        );
        let (x, y) = futures::join!(a.put(&ra), b.put(&rb));
        x.unwrap();
        y.unwrap();
        let q = ByQuery::from_js(&js(json!({"eq": ["run", at(round)]}))).unwrap();
        let page = a.list_by("byType", &q).await.unwrap();
        let ids: Vec<String> = page
            .records
            .iter()
            .map(|r| field_str(&r, "_id").unwrap())
            .collect();
        assert!(
            ids.contains(&format!("a{round:03}")) && ids.contains(&format!("b{round:03}")),
            "round {round}: {ids:?}"
        );
    }
    assert_eq!(
        by_all(&a, json!({"eq": "run", "limit": 1000})).await.len(),
        400
    );
    assert_indexes_clean(&a).await;
}

#[wasm_bindgen_test]
async fn concurrent_save_and_delete_never_drop_an_unrelated_entry() {
    let (a, name) = open("idx-del").await;
    let b = open_named(&name).await;
    let keep: Vec<Value> = (0..50)
        .map(|i| json!({"_id": format!("keep{i:02}"), "recordType": "memory"}))
        .collect();
    a.put_many(&js(Value::Array(keep))).await.unwrap();
    for round in 0..100u32 {
        let doomed = a
            .put(&js(
                json!({"_id": format!("d{round}"), "recordType": "memory"}),
            ))
            .await
            .unwrap();
        let rec = js(json!({"_id": format!("n{round}"), "recordType": "memory"}));
        let id = s(&format!("d{round}"));
        let rev = s(&doomed.rev);
        let (x, y) = futures::join!(b.put(&rec), a.delete(&id, &rev));
        x.unwrap();
        y.unwrap();
    }
    let listed = by_all(&a, json!({"eq": "memory", "limit": 1000})).await;
    assert_eq!(listed.iter().filter(|i| i.starts_with("keep")).count(), 50);
    assert_eq!(listed.iter().filter(|i| i.starts_with('n')).count(), 100);
    assert_eq!(listed.iter().filter(|i| i.starts_with('d')).count(), 0);
    assert_indexes_clean(&a).await;
}

#[wasm_bindgen_test]
async fn an_aborted_transaction_leaves_neither_record_nor_index_entry() {
    let (store, _) = open("idx-abort").await;
    store.inject_abort_next_write();
    let e = store
        .put(&js(json!({"_id": "x", "recordType": "run"})))
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::Transaction);
    assert!(store.get(&s("x")).await.unwrap().is_none());
    assert!(by_all(&store, json!({"eq": "run"})).await.is_empty());
    // an update that aborts keeps the old record AND its old entry
    let r = store
        .put(&js(json!({"_id": "y", "recordType": "run"})))
        .await
        .unwrap()
        .rev;
    store.inject_abort_next_write();
    assert!(store
        .put(&js(json!({"_id": "y", "_rev": r, "recordType": "agent"})))
        .await
        .is_err());
    assert_eq!(by_all(&store, json!({"eq": "run"})).await, vec!["y"]);
    assert!(by_all(&store, json!({"eq": "agent"})).await.is_empty());
    store.inject_abort_next_write();
    let batch = js(json!([{"_id": "p1", "recordType": "run"}, {"_id": "p2", "recordType": "run"}]));
    assert!(store.put_many(&batch).await.is_err());
    assert_eq!(by_all(&store, json!({"eq": "run"})).await, vec!["y"]);
    assert_indexes_clean(&store).await;
}

/// Corrupt the entries directly; verify names exactly what was done and the
/// rebuild restores a byte-identical index.
#[wasm_bindgen_test]
async fn verify_reports_corruption_exactly_and_rebuild_restores_identical_entries() {
    let (store, _) = open("idx-corrupt").await;
    let recs: Vec<Value> = (0..30u32)
        .map(|i| json!({"_id": format!("c{i:02}"), "recordType": "toolCall", "updatedAt": at(i)}))
        .collect();
    store.put_many(&js(Value::Array(recs))).await.unwrap();
    let before = store.dump_entries().await.unwrap();
    let tag = by_type().tag();
    let key = |t: &str, up: &str, id: &str| -> JsValue { js(json!([tag, t, up, id])) };
    // delete c03's entry, add an orphan for a record that does not exist,
    // and change c07's key (stale).
    let orphan = key("toolCall", &at(99), "ghost");
    let changed = key("run", &at(7), "c07");
    store
        .raw_derived(
            &[(orphan.clone(), orphan), (changed.clone(), changed)],
            &[
                key("toolCall", &at(3), "c03"),
                key("toolCall", &at(7), "c07"),
            ],
        )
        .await
        .unwrap();
    let v = store.verify_indexes().await.unwrap();
    let ids = |xs: &Vec<JsValue>| {
        xs.iter()
            .map(|x| x.as_string().unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(v.checked, 30);
    assert_eq!(ids(&v.missing), vec!["c03"]);
    assert_eq!(ids(&v.orphaned), vec!["ghost"]);
    assert_eq!(ids(&v.stale), vec!["c07"]);
    assert_ne!(store.dump_entries().await.unwrap(), before);
    let n = store.rebuild_indexes(7, true, None, None).await.unwrap();
    assert_eq!(n, 30);
    assert_eq!(
        store.dump_entries().await.unwrap(),
        before,
        "byte-identical after rebuild"
    );
    assert_indexes_clean(&store).await;
}

/// `listBy` reads what `verifyIndexes` checks: the entries' keys. An entry
/// whose stored value no longer equals its key (a foreign write, a partial
/// restore) is reported by neither, so listing must not trust the value:
/// before, `listBy` fetched the record named by the value's last element
/// and answered another record than the clean index says.
#[wasm_bindgen_test]
async fn list_by_answers_from_the_entry_keys_that_verify_checks_not_their_values() {
    let (store, _) = open("idx-values").await;
    let recs = json!([
        {"_id": "a", "recordType": "run", "updatedAt": at(1)},
        {"_id": "b", "recordType": "note", "updatedAt": at(2)},
    ]);
    store.put_many(&js(recs)).await.unwrap();
    let tag = by_type().tag();
    let key = js(json!([tag, "run", at(1), "a"]));
    let wrong_value = js(json!([tag, "note", at(2), "b"]));
    store.raw_derived(&[(key, wrong_value)], &[]).await.unwrap();
    let v = store.verify_indexes().await.unwrap();
    assert!(v.missing.is_empty() && v.orphaned.is_empty() && v.stale.is_empty());
    assert_eq!(by_all(&store, json!({"eq": "run"})).await, vec!["a"]);
    assert_eq!(
        by_all(&store, json!({"eq": "run", "descending": true})).await,
        vec!["a"]
    );
    assert_eq!(
        by_all(&store, json!({"limit": 1})).await,
        vec!["b", "a"],
        "paging (its cursor comes from the entry) still visits each record once"
    );
}

/// An index key path reads the record's own fields, as IndexedDB
/// evaluates key paths: a library that sets `Object.prototype.team` must
/// not make the record written (a null-prototype copy: no entry) and the
/// same record read back (an ordinary object) disagree. Before,
/// `verifyIndexes` reported the record missing and a rebuild added an entry
/// the next write removed.
#[wasm_bindgen_test]
async fn an_index_key_path_reads_own_fields_only_as_indexeddb_does() {
    let by_team = IndexDef {
        name: "byTeam".into(),
        keys: vec!["team".into()],
    };
    let store = Store::open(&fresh_name("idx-proto"), 2000, None, vec![by_team])
        .await
        .unwrap();
    let proto = js_sys::Object::get_prototype_of(&js_sys::Object::new());
    let field = JsValue::from_str("team");
    js_sys::Reflect::set(&proto, &field, &JsValue::from_str("red")).unwrap();
    // Nothing panics before the prototype is restored (a panic would leave
    // it polluted for the rest of the page's tests).
    let outcome = async {
        store
            .put(&js(json!({"_id": "a", "recordType": "run"})))
            .await?;
        let v = store.verify_indexes().await?;
        let clean = v.missing.is_empty() && v.orphaned.is_empty() && v.stale.is_empty();
        let q = ByQuery::from_js(&js(json!({"eq": "red"})))?;
        let listed = store.list_by("byTeam", &q).await?.records.length();
        store.rebuild_indexes(7, true, None, None).await?;
        Ok::<_, agentstore::error::StoreError>((clean, listed, store.dump_entries().await?))
    }
    .await;
    js_sys::Reflect::delete_property(&proto, &field).unwrap();
    let (clean, listed, entries) = outcome.map_err(|e| e.message()).unwrap();
    assert!(clean, "verifyIndexes reports nothing");
    assert_eq!(listed, 0, "no own team: no entry");
    assert_eq!(entries, "[]", "a rebuild adds none either");
}

/// `rebuildIndexes` treats its signal and its callback as the imports do: a
/// signal aborted before the call changes nothing (before, the restart
/// dropped every entry first and the call then failed, leaving the index to
/// be served by full scans), and a throwing `onProgress` ends the call with
/// what it threw (before, the throw was swallowed and the rebuild ran on);
/// the committed batches stay, so a later call resumes.
#[wasm_bindgen_test]
async fn an_aborted_signal_or_a_throwing_callback_stops_a_rebuild_like_an_import() {
    let (store, _) = open("idx-stop").await;
    let recs: Vec<Value> = (0..100u32)
        .map(|i| json!({"_id": format!("s{i:03}"), "recordType": "run", "updatedAt": at(i)}))
        .collect();
    store.put_many(&js(Value::Array(recs))).await.unwrap();
    assert!(store.indexes_ready().await.unwrap());
    let before = store.dump_entries().await.unwrap();
    let ctl = web_sys::AbortController::new().unwrap();
    ctl.abort();
    for restart in [true, false] {
        let e = store
            .rebuild_indexes(10, restart, None, Some(&ctl.signal()))
            .await
            .unwrap_err();
        assert_eq!(e.code(), ErrorCode::Aborted, "restart {restart}");
        assert!(store.indexes_ready().await.unwrap(), "still active");
        assert_eq!(store.dump_entries().await.unwrap(), before, "untouched");
    }
    let throws =
        js_sys::Function::new_with_args("done, total", "throw new Error('stop at ' + done)");
    let e = store
        .rebuild_indexes(10, true, Some(&throws), None)
        .await
        .unwrap_err();
    let thrown = e.to_js();
    assert_eq!(field_str(&thrown, "message").as_deref(), Some("stop at 10"));
    assert!(!store.indexes_ready().await.unwrap(), "stopped mid-way");
    let n = store.rebuild_indexes(10, false, None, None).await.unwrap();
    assert_eq!(n, 100);
    assert_eq!(store.dump_entries().await.unwrap(), before);
    assert_indexes_clean(&store).await;
    // A throw after the last batch: the rebuild is complete, and resolves.
    let n = store
        .rebuild_indexes(1000, true, Some(&throws), None)
        .await
        .expect("complete");
    assert_eq!(n, 100);
    assert!(store.indexes_ready().await.unwrap());
}

/// A rebuild aborted while it waits for its last `onProgress` Promise (every
/// batch committed, every index active) resolves with its count: AbortError
/// would report a complete rebuild as stopped. An abort while an earlier
/// batch's Promise is pending still stops it. Before, both rejected with
/// AbortError (helper-202's finding).
#[wasm_bindgen_test]
async fn a_rebuild_aborted_after_its_last_batch_resolves_with_its_count() {
    let (store, _) = open("idx-abort-last").await;
    let recs: Vec<Value> = (0..30u32)
        .map(|i| json!({"_id": format!("s{i:03}"), "recordType": "run", "updatedAt": at(i)}))
        .collect();
    store.put_many(&js(Value::Array(recs))).await.unwrap();
    let before = store.dump_entries().await.unwrap();
    // Aborts (on a timer) in the call with done == `at`, and returns a
    // Promise that never settles.
    let make = js_sys::Function::new_with_args(
        "c, at",
        "return (d) => { if (d !== at) return; setTimeout(() => c.abort('late'), 0); return new Promise(() => {}); }",
    );
    for (at, complete) in [(30, true), (10, false)] {
        let ctl = web_sys::AbortController::new().unwrap();
        let cb: js_sys::Function = make
            .call2(&JsValue::NULL, &ctl, &at.into())
            .unwrap()
            .unchecked_into();
        let out = store
            .rebuild_indexes(10, true, Some(&cb), Some(&ctl.signal()))
            .await;
        assert!(ctl.signal().aborted(), "at {at}: the abort was made");
        match complete {
            true => assert_eq!(out.expect("complete: resolves"), 30),
            false => assert_eq!(out.unwrap_err().code(), ErrorCode::Aborted),
        }
        assert_eq!(store.indexes_ready().await.unwrap(), complete, "at {at}");
    }
    store.rebuild_indexes(10, false, None, None).await.unwrap();
    assert_eq!(store.dump_entries().await.unwrap(), before);
    assert_indexes_clean(&store).await;
}

/// An async `onProgress` of `rebuildIndexes` is awaited before the next
/// batch (each call only after the previous one's Promise resolved), and a
/// rejection before the last batch ends the call with that error, as a
/// throw does; the committed batches stay and a later call resumes.
/// Before, the Promise was ignored: the batches ran on and the rejection
/// went unhandled while the call resolved.
#[wasm_bindgen_test]
async fn an_async_on_progress_is_awaited_and_its_rejection_stops_a_rebuild() {
    let (store, _) = open("idx-async-progress").await;
    let recs: Vec<Value> = (0..30u32)
        .map(|i| json!({"_id": format!("p{i:03}"), "recordType": "run", "updatedAt": at(i)}))
        .collect();
    store.put_many(&js(Value::Array(recs))).await.unwrap();
    let before = store.dump_entries().await.unwrap();
    let log = js_sys::Array::new();
    let slow = js_sys::Function::new_with_args(
        "done, total",
        "const log = this; log.push('call ' + done); \
         return new Promise((r) => setTimeout(() => { log.push('done ' + done); r(); }, 2));",
    );
    let n = store
        .rebuild_indexes(10, true, Some(&slow.bind0(&log)), None)
        .await
        .unwrap();
    assert_eq!(n, 30);
    let log: Vec<String> = log.iter().map(|v| v.as_string().unwrap()).collect();
    assert_eq!(
        log,
        ["call 10", "done 10", "call 20", "done 20", "call 30", "done 30"]
    );
    let rejects = js_sys::Function::new_with_args(
        "done, total",
        "return Promise.reject(new Error('stop at ' + done))",
    );
    let e = store
        .rebuild_indexes(10, true, Some(&rejects), None)
        .await
        .unwrap_err();
    assert_eq!(
        field_str(&e.to_js(), "message").as_deref(),
        Some("stop at 10")
    );
    assert!(!store.indexes_ready().await.unwrap(), "stopped mid-way");
    assert_eq!(
        store.rebuild_indexes(10, false, None, None).await.unwrap(),
        30
    );
    assert_eq!(store.dump_entries().await.unwrap(), before);
    assert_indexes_clean(&store).await;
}

/// A rebuild whose record count is a multiple of its batch size finishes in
/// its last, exactly full batch, and reports each batch once. Before, an
/// empty batch ran after it: `onProgress` saw `(100, 100)` twice, and a
/// callback throwing at `done == total` ended the call with the index still
/// building (served by full scans).
#[wasm_bindgen_test]
async fn a_rebuild_whose_last_batch_is_exactly_full_finishes_there_and_reports_each_batch_once() {
    let (store, _) = open("idx-full-batch").await;
    let recs: Vec<Value> = (0..100u32)
        .map(|i| json!({"_id": format!("f{i:03}"), "recordType": "run", "updatedAt": at(i)}))
        .collect();
    store.put_many(&js(Value::Array(recs))).await.unwrap();
    let before = store.dump_entries().await.unwrap();
    let record = js_sys::Function::new_with_args("done, total", "this.push(done + '/' + total)");
    for batch in [10u32, 25, 100] {
        let seen = js_sys::Array::new();
        let n = store
            .rebuild_indexes(batch, true, Some(&record.bind0(&seen)), None)
            .await
            .unwrap();
        assert_eq!(n, 100);
        let seen: Vec<String> = seen.iter().map(|v| v.as_string().unwrap()).collect();
        let want: Vec<String> = (1..=100 / batch)
            .map(|i| format!("{}/100", i * batch))
            .collect();
        assert_eq!(seen, want, "batch {batch}");
        // A callback throwing at the last batch: the rebuild is complete.
        let throws = js_sys::Function::new_with_args(
            "done, total",
            "if (done === total) throw new Error('last')",
        );
        let n = store
            .rebuild_indexes(batch, true, Some(&throws), None)
            .await
            .expect("complete at the last batch");
        assert_eq!(n, 100, "batch {batch}");
        assert!(
            store.indexes_ready().await.unwrap(),
            "batch {batch}: active"
        );
        assert_eq!(store.dump_entries().await.unwrap(), before);
    }
    assert_indexes_clean(&store).await;
}

/// A rebuild cancelled half-way keeps its checkpoint; reads stay right while
/// it is incomplete; a resumed rebuild finishes clean.
#[wasm_bindgen_test]
async fn rebuild_is_cancellable_resumable_and_reads_stay_correct_meanwhile() {
    let (store, name) = open("idx-resume").await;
    let recs: Vec<Value> = (0..300u32).map(|i| json!({"_id": format!("k{i:03}"), "recordType": if i % 2 == 0 {"run"} else {"agent"}, "updatedAt": at(i)})).collect();
    store.put_many(&js(Value::Array(recs))).await.unwrap();
    let before = store.dump_entries().await.unwrap();
    let ctl = web_sys::AbortController::new().unwrap();
    let calls = std::rc::Rc::new(std::cell::Cell::new(0u32));
    let (c2, sig) = (calls.clone(), ctl.clone());
    let cb = wasm_bindgen::closure::Closure::<dyn FnMut(u32, u32)>::new(move |_d: u32, _t: u32| {
        c2.set(c2.get() + 1);
        if c2.get() == 3 {
            sig.abort();
        }
    });
    let e = store
        .rebuild_indexes(
            25,
            true,
            Some(wasm_bindgen::JsCast::unchecked_ref(cb.as_ref())),
            Some(&ctl.signal()),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::Aborted);
    assert!(!store.indexes_ready().await.unwrap());
    // Mid-rebuild: writes still maintain the entries, listings answer from records.
    store
        .put(&js(
            json!({"_id": "k999", "recordType": "run", "updatedAt": at(999)}),
        ))
        .await
        .unwrap();
    let runs = by_all(
        &store,
        json!({"eq": "run", "descending": true, "limit": 40}),
    )
    .await;
    assert_eq!(runs.len(), 151);
    assert_eq!(runs[0], "k999");
    // Another connection (a reload) resumes from the checkpoint.
    let again = Store::open(&name, 2000, None, vec![by_type()])
        .await
        .unwrap();
    let calls2 = std::rc::Rc::new(std::cell::Cell::new(0u32));
    let first = std::rc::Rc::new(std::cell::Cell::new(0u32));
    let (c3, f3) = (calls2.clone(), first.clone());
    let cb2 = wasm_bindgen::closure::Closure::<dyn FnMut(u32, u32)>::new(move |d: u32, _t: u32| {
        if c3.get() == 0 {
            f3.set(d);
        }
        c3.set(c3.get() + 1);
    });
    again
        .rebuild_indexes(
            25,
            false,
            Some(wasm_bindgen::JsCast::unchecked_ref(cb2.as_ref())),
            None,
        )
        .await
        .unwrap();
    assert!(
        first.get() > 75,
        "resumed after the checkpoint (first progress {})",
        first.get()
    );
    assert!(again.indexes_ready().await.unwrap());
    assert_indexes_clean(&again).await;
    store
        .delete(
            &s("k999"),
            &s(&field_str(&store.get(&s("k999")).await.unwrap().unwrap(), "_rev").unwrap()),
        )
        .await
        .unwrap();
    assert_eq!(store.dump_entries().await.unwrap(), before);
}

/// Changing a definition needs no IndexedDB upgrade (an open connection does
/// not block it) and rebuilds under a new tag.
#[wasm_bindgen_test]
async fn a_changed_definition_rebuilds_without_a_version_upgrade() {
    let (old, name) = open("idx-change").await;
    old.put_many(&js(json!([{"_id": "a", "recordType": "run", "owner": "x"}, {"_id": "b", "recordType": "run", "owner": "y"}]))).await.unwrap();
    let def = by_owner();
    // `old` stays open: an upgrade would block and fail after 300 ms.
    let new = Store::open(&name, 300, None, vec![by_type(), def])
        .await
        .unwrap();
    new.rebuild_indexes(500, false, None, None).await.unwrap();
    let q = ByQuery::from_js(&js(json!({"eq": "y"}))).unwrap();
    let page = new.list_by("byOwner", &q).await.unwrap();
    assert_eq!(page.records.length(), 1);
    // the old connection's writes keep the new index in step too
    old.put(&js(json!({"_id": "c", "owner": "y"})))
        .await
        .unwrap();
    assert_eq!(
        new.list_by("byOwner", &q).await.unwrap().records.length(),
        2
    );
    assert_indexes_clean(&new).await;
    assert_eq!(
        new.list_by("nope", &q).await.unwrap_err().code(),
        ErrorCode::Validation
    );
}

/// Every entry an index holds can be looked up: a key of up to 250,000
/// UTF-16 units has an entry, and `eq`, `prefix` and `range` take values as
/// long (one unit more, also over an `eq`'s parts in all, is a
/// ValidationError, and could match no entry).
/// Before, they took at most 65,536 units, so a record whose key was longer
/// was indexed but could not be found by it (helper-201's finding).
#[wasm_bindgen_test]
async fn every_indexed_key_can_be_looked_up_by_its_whole_value() {
    let (_, name) = open("idx-long-key").await;
    let store = Store::open(&name, 300, None, vec![by_type(), by_owner()])
        .await
        .unwrap();
    let long = "o".repeat(250_000);
    store
        .put_many(&js(
            json!([{"_id": "long", "owner": long}, {"_id": "short", "owner": "o"}]),
        ))
        .await
        .unwrap();
    // (Built, so `listBy` answers from its entries, not from the records.)
    store.rebuild_indexes(500, false, None, None).await.unwrap();
    assert_indexes_clean(&store).await;
    let ids = |page: &agentstore::store::Page| -> Vec<String> {
        page.records
            .iter()
            .map(|r| field_str(&r, "_id").unwrap())
            .collect()
    };
    for (q, want) in [
        (json!({"eq": long}), vec!["long"]),
        (json!({"prefix": long}), vec!["long"]),
        (
            json!({"range": {"lower": long, "upper": long}}),
            vec!["long"],
        ),
        (json!({"prefix": "o"}), vec!["short", "long"]),
    ] {
        let page = store
            .list_by("byOwner", &ByQuery::from_js(&js(q)).unwrap())
            .await
            .unwrap();
        assert_eq!(ids(&page), want);
    }
    let longer = format!("{long}o");
    for q in [
        json!({"eq": longer}),
        // The parts of one key hold at most as many in all.
        json!({"eq": [long, "o"]}),
        json!({"prefix": longer}),
        json!({"range": {"lower": longer}}),
    ] {
        let e = ByQuery::from_js(&js(q)).map(|_| ()).unwrap_err();
        assert_eq!(e.code(), ErrorCode::Validation);
        assert!(e.to_string().contains("250,000"), "{e}");
    }
}

#[wasm_bindgen_test]
async fn watch_delivers_committed_changes_under_its_prefix_only() {
    let (store, _) = open("watch").await;
    let (cb, seen) = change_log();
    let w = agentstore::store::Watcher::new(&store, "w/".into(), cb).unwrap();
    let r = store.put(&js(json!({"_id": "w/1"}))).await.unwrap().rev;
    store.put(&js(json!({"_id": "other"}))).await.unwrap();
    store.delete(&s("w/1"), &s(&r)).await.unwrap();
    store.inject_abort_next_write();
    let _ = store.put(&js(json!({"_id": "w/aborted"}))).await;
    // Changes arrive in commit order: once the next commit is seen, the
    // aborted write would have been seen before it.
    store.put(&js(json!({"_id": "w/next"}))).await.unwrap();
    let seen_len = |n: usize| {
        let seen = seen.clone();
        move || seen.borrow().len() >= n
    };
    wait_for("w/next", seen_len(3)).await;
    assert_eq!(
        *seen.borrow(),
        vec!["w/1:false", "w/1:true", "w/next:false"]
    );
    // A control watch opened after `w`: a BroadcastChannel delivers to a page's
    // channels in creation order, so once the control has seen w/2, `w` would
    // have too had close() not stopped it.
    let control = std::rc::Rc::new(std::cell::Cell::new(false));
    let c2 = control.clone();
    let control_cb =
        wasm_bindgen::closure::Closure::<dyn FnMut(JsValue)>::new(move |_| c2.set(true));
    let control_watch = agentstore::store::Watcher::new(
        &store,
        "w/".into(),
        wasm_bindgen::JsCast::unchecked_ref::<js_sys::Function>(control_cb.as_ref()).clone(),
    )
    .unwrap();
    w.close();
    store.put(&js(json!({"_id": "w/2"}))).await.unwrap();
    wait_for("the control watch", move || control.get()).await;
    assert_eq!(seen.borrow().len(), 3, "nothing after close");
    control_watch.close();
    assert_indexes_clean(&store).await;
}

const DUMP: &str = include_str!("../www/data/agent-records.pouchdump.ndjson");
const EXPECTED: &str = include_str!("../www/data/agent-records.expected.json");

/// After importing the real dump, byType lists exactly the live runs, newest
/// first, and the migration report matches what the legacy document lacks.
#[wasm_bindgen_test]
async fn dump_import_builds_indexes_from_records_and_reports_the_legacy_drift() {
    let (store, _) = open("idx-dump").await;
    let (_, _, legacy) = store
        .import_pouch_dump(DUMP, "agent-index", None)
        .await
        .unwrap();
    let legacy = legacy.unwrap();
    let expected: Value = serde_json::from_str(EXPECTED).unwrap();
    let live = expected["live"].as_object().unwrap();
    // independently: the legacy doc's records map vs the live ids
    let doc = store.get(&s("agent-index")).await.unwrap().unwrap();
    let listed: Vec<String> = js_sys::Object::keys(&field(&doc, "records").into())
        .iter()
        .map(|k| k.as_string().unwrap())
        .collect();
    let lost = live
        .keys()
        .filter(|k| *k != "agent-index" && !listed.contains(k))
        .count();
    let stale = listed.iter().filter(|k| !live.contains_key(*k)).count();
    assert_eq!(
        (
            legacy.lost as usize,
            legacy.stale as usize,
            legacy.listed as usize
        ),
        (lost, stale, listed.len())
    );
    let mut runs: Vec<(&String, &str)> = live
        .iter()
        .filter(|(_, v)| v["recordType"] == "run")
        .map(|(k, v)| (k, v["updatedAt"].as_str().unwrap()))
        .collect();
    runs.sort_by(|a, b| {
        (b.1, b.0.encode_utf16().collect::<Vec<_>>())
            .cmp(&(a.1, a.0.encode_utf16().collect::<Vec<_>>()))
    });
    let want: Vec<String> = runs.iter().map(|(k, _)| (*k).clone()).collect();
    assert_eq!(
        by_all(
            &store,
            json!({"eq": "run", "descending": true, "limit": 250})
        )
        .await,
        want
    );
    assert_indexes_clean(&store).await;
}

/// Two connections with different index sets rebuild at the same time (the
/// second starts before the first's first batch): checkpoints are per tag,
/// so the first's rebuild is never ended by the second's. Each resolves with
/// its index built, active (listBy reads the entries), maintained by the
/// other connection's writes, and verifyIndexes clean.
#[wasm_bindgen_test]
async fn rebuilds_of_different_index_sets_in_two_connections_both_finish() {
    let name = fresh_name("idx-two-sets");
    let by_owner = by_owner();
    let a = Store::open(&name, 2000, None, vec![by_type()])
        .await
        .unwrap();
    let b = Store::open(&name, 2000, None, vec![by_owner.clone()])
        .await
        .unwrap();
    let recs: Vec<Value> = (0..300u32)
        .map(|i| json!({"_id": format!("r{i:03}"), "recordType": if i % 2 == 0 {"run"} else {"agent"}, "owner": format!("o{}", i % 7), "updatedAt": at(i)}))
        .collect();
    a.put_many(&js(Value::Array(recs))).await.unwrap();
    for round in 0..3 {
        let (ra, rb) = futures::join!(
            a.rebuild_indexes(20, true, None, None),
            b.rebuild_indexes(15, true, None, None)
        );
        assert_eq!(ra.unwrap(), 300 + round, "round {round}");
        assert_eq!(rb.unwrap(), 300 + round, "round {round}");
        assert!(
            a.indexes_ready().await.unwrap(),
            "round {round}: a's index active"
        );
        assert!(
            b.indexes_ready().await.unwrap(),
            "round {round}: b's index active"
        );
        assert_indexes_clean(&a).await;
        assert_indexes_clean(&b).await;
        // b's writes maintain a's index (b does not declare it), and vice versa
        b.put(&js(json!({"_id": format!("w{round}"), "recordType": "run", "owner": "o9", "updatedAt": at(1000 + round)})))
            .await
            .unwrap();
        assert_eq!(
            by_all(&a, json!({"eq": "run", "descending": true, "limit": 1})).await[0],
            format!("w{round}")
        );
        let q = ByQuery::from_js(&js(json!({"eq": "o9"}))).unwrap();
        assert_eq!(
            b.list_by("byOwner", &q).await.unwrap().records.length(),
            round + 1
        );
        assert_indexes_clean(&a).await;
        assert_indexes_clean(&b).await;
    }
    // listBy reads a's entries (not the records): remove one entry and it is gone from the listing.
    let tag = by_type().tag();
    let key = js(json!([tag, "run", at(298), "r298"]));
    a.raw_derived(&[], &[key]).await.unwrap();
    let runs = by_all(&a, json!({"eq": "run"})).await;
    assert!(!runs.contains(&"r298".to_string()) && runs.contains(&"r296".to_string()));
    assert_eq!(a.verify_indexes().await.unwrap().missing.len(), 1);
}

/// A synchronous `mutate` function runs inside the write transaction; one
/// that edits its argument in place instead of returning a copy must not
/// change what the index upkeep reads as the OLD record. Otherwise the old
/// entry (`task`) is never deleted and the record is listed under both
/// types. Also in place: setting `updatedAt` keeps the caller's value.
#[wasm_bindgen_test]
async fn a_synchronous_mutate_that_edits_its_argument_in_place_keeps_the_index_exact() {
    let (store, _) = open("mutate-in-place").await;
    for i in 0..5 {
        let id = format!("t{i}");
        store
            .put(&js(
                json!({"_id": id, "recordType": "task", "updatedAt": at(i)}),
            ))
            .await
            .unwrap();
    }
    let retype = js_sys::Function::new_with_args("r", "r.recordType = 'archived'; return r;");
    let restamp = js_sys::Function::new_with_args(
        "r",
        "r.updatedAt = '2020-01-01T00:00:00.000Z'; r.n = 1; return r;",
    );
    for i in 0..5 {
        let key = JsValue::from(format!("t{i}"));
        store.mutate(&key, &retype, 0, None).await.unwrap().unwrap();
    }
    assert_eq!(
        by_all(&store, json!({"eq": ["task"]})).await,
        Vec::<String>::new()
    );
    assert_eq!(by_all(&store, json!({"eq": ["archived"]})).await.len(), 5);
    store
        .mutate(&JsValue::from("t0"), &restamp, 0, None)
        .await
        .unwrap()
        .unwrap();
    let t0 = store.get(&JsValue::from("t0")).await.unwrap().unwrap();
    assert_eq!(
        field_str(&t0, "updatedAt").as_deref(),
        Some("2020-01-01T00:00:00.000Z")
    );
    assert_indexes_clean(&store).await;
}

/// A store with no record adopts its declared indexes at once (there is
/// nothing to build): `open()` on a new database leaves them active without
/// a rebuild (in the shipped entry points, without loading the module that
/// carries the rebuild), and writes keep them in step from the first one.
/// A store that holds records does not adopt: it needs the rebuild.
#[wasm_bindgen_test]
async fn an_empty_store_adopts_its_declared_indexes_without_a_rebuild() {
    let name = fresh_name("adopt");
    let opened = wasm_bindgen_futures::JsFuture::from(agentstore::AgentStore::open(
        s(&name),
        js(json!({"indexes": [{"name": "byType", "keys": ["recordType", "updatedAt"]}]})),
    ))
    .await
    .unwrap();
    let close: js_sys::Function = wasm_bindgen::JsCast::unchecked_into(field(&opened, "close"));
    let store = open_named(&name).await;
    assert!(
        store.indexes_ready().await.unwrap(),
        "active as soon as open() resolved"
    );
    assert!(store.prepare_indexes().await.unwrap(), "still ready");
    store
        .put(&js(json!({"_id": "a", "recordType": "run"})))
        .await
        .unwrap();
    assert_eq!(by_all(&store, json!({"eq": "run"})).await, vec!["a"]);
    assert_indexes_clean(&store).await;
    close.call0(&opened).unwrap();
    // With a record stored and a new definition, nothing is adopted.
    let other = Store::open(&name, 2000, None, vec![by_owner()])
        .await
        .unwrap();
    assert!(!other.prepare_indexes().await.unwrap());
    assert!(!other.indexes_ready().await.unwrap());
    other.rebuild_indexes(500, false, None, None).await.unwrap();
    assert!(other.indexes_ready().await.unwrap());
}

/// `listBy` refuses an `eq` with more values than the index has keys (the
/// extra value was compared with the record id: `eq: ["run", updatedAt,
/// "r1"]` listed r1 and `"x"` in its place listed nothing) and an `after`
/// cursor made by another index (a lower tag restarted the listing and
/// repeated records, a higher one ended it early).
#[wasm_bindgen_test]
async fn list_by_refuses_eq_longer_than_the_index_and_a_cursor_of_another_index() {
    let name = fresh_name("idx-query-shape");
    let by_owner = by_owner();
    let store = Store::open(&name, 2000, None, vec![by_type(), by_owner])
        .await
        .unwrap();
    let recs: Vec<Value> = (0..6)
        .map(|i| json!({"_id": format!("r{i}"), "recordType": "run", "owner": format!("o{i}"), "updatedAt": at(i)}))
        .collect();
    store.put_many(&js(Value::Array(recs))).await.unwrap();
    let q = |v: Value| ByQuery::from_js(&js(v)).unwrap();
    for extra in ["r1", "x"] {
        let err = store
            .list_by("byType", &q(json!({"eq": ["run", at(1), extra]})))
            .await
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::Validation, "{extra}");
    }
    // Exactly as many values as keys is an exact match.
    let page = store
        .list_by("byType", &q(json!({"eq": ["run", at(1)]})))
        .await
        .unwrap();
    assert_eq!(page.records.length(), 1);
    for (from, to) in [("byOwner", "byType"), ("byType", "byOwner")] {
        let first = store.list_by(from, &q(json!({"limit": 2}))).await.unwrap();
        let cursor = first.next.expect("a second page");
        let err = store
            .list_by(to, &q(json!({"limit": 2, "after": cursor})))
            .await
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::Validation, "{from} cursor on {to}");
    }
    // The index's own cursor still pages through every record once.
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let mut v = json!({"limit": 4});
        if let Some(a) = &after {
            v["after"] = json!(a);
        }
        let page = store.list_by("byOwner", &q(v)).await.unwrap();
        seen.extend(page.records.iter().map(|r| field_str(&r, "_id").unwrap()));
        match page.next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    assert_eq!(seen, ["r0", "r1", "r2", "r3", "r4", "r5"]);
}

/// `dropIndex(name)` removes an index the calling connection does not
/// declare: its entries go in one transaction, and no connection's writes
/// maintain it afterwards, not even one that still declares it and cached
/// the definitions before the drop. That connection answers `listBy` from
/// the records (exact), reports the index as `building`, and a later open
/// declaring it builds it again. A connection declaring the name is refused
/// and nothing changes. Before, an index nobody declared any more was kept
/// in step by every write forever.
#[wasm_bindgen_test]
async fn a_dropped_index_loses_its_entries_and_no_write_maintains_it_again() {
    let name = fresh_name("idx-drop");
    let by_owner = by_owner();
    let tag = by_owner.tag();
    let old = Store::open(&name, 2000, None, vec![by_type(), by_owner.clone()])
        .await
        .unwrap();
    assert!(
        old.prepare_indexes().await.unwrap(),
        "an empty store adopts them"
    );
    let recs: Vec<Value> = (0..40u32)
        .map(|i| json!({"_id": format!("r{i:02}"), "recordType": "run", "owner": format!("o{}", i % 4), "updatedAt": at(i)}))
        .collect();
    old.put_many(&js(Value::Array(recs))).await.unwrap();
    // An entry is `[tag, …]`, stored as its own value: each shows twice.
    let key_start = format!("[\"{tag}\"");
    let entries = |d: &str| d.matches(key_start.as_str()).count() / 2;
    assert_eq!(entries(&old.dump_entries().await.unwrap()), 40);

    let refused = old.drop_index("byOwner", None).await.unwrap_err();
    assert_eq!(refused.code(), ErrorCode::Validation);
    assert_eq!(
        entries(&old.dump_entries().await.unwrap()),
        40,
        "a refused drop changes nothing"
    );

    let new = Store::open(&name, 2000, None, vec![by_type()])
        .await
        .unwrap();
    assert!(new.drop_index("byOwner", None).await.unwrap(), "it existed");
    assert_eq!(entries(&new.dump_entries().await.unwrap()), 0);
    assert!(
        !new.drop_index("byOwner", None).await.unwrap(),
        "dropped already"
    );

    // Writes of both connections, the old one with its cached definitions.
    let w1 = old
        .put(&js(
            json!({"_id": "w1", "recordType": "run", "owner": "o1", "updatedAt": at(100)}),
        ))
        .await
        .unwrap();
    new.put(&js(
        json!({"_id": "w2", "recordType": "run", "owner": "o1", "updatedAt": at(101)}),
    ))
    .await
    .unwrap();
    old.put(&js(
        json!({"_id": "w3", "recordType": "run", "owner": "o1", "updatedAt": at(102)}),
    ))
    .await
    .unwrap();
    old.delete(&s("w1"), &s(&w1.rev)).await.unwrap();
    assert_eq!(
        entries(&new.dump_entries().await.unwrap()),
        0,
        "no write maintains a dropped index"
    );
    assert_indexes_clean(&new).await;

    // The old connection still answers exactly, from the records.
    let q = ByQuery::from_js(&js(json!({"eq": "o1"}))).unwrap();
    let page = old.list_by("byOwner", &q).await.unwrap();
    let mut ids: Vec<String> = page
        .records
        .iter()
        .map(|r| field_str(&r, "_id").unwrap())
        .collect();
    ids.sort();
    let mut want: Vec<String> = (0..40u32)
        .filter(|i| i % 4 == 1)
        .map(|i| format!("r{i:02}"))
        .chain(["w2".into(), "w3".into()])
        .collect();
    want.sort();
    assert_eq!(ids, want);
    assert_eq!(
        old.verify_indexes().await.unwrap().building,
        vec!["byOwner".to_string()]
    );

    // Declared again: built again, exactly.
    old.close();
    let again = Store::open(&name, 2000, None, vec![by_type(), by_owner])
        .await
        .unwrap();
    again.rebuild_indexes(500, false, None, None).await.unwrap();
    assert_indexes_clean(&again).await;
    assert_eq!(entries(&again.dump_entries().await.unwrap()), 42);
    assert_eq!(
        again.list_by("byOwner", &q).await.unwrap().records.length(),
        12
    );
}

/// `verifyIndexes({onProgress, signal})`: `onProgress(done, total)` after
/// each 1,000 records read, up to the number stored, an async one awaited
/// before the next call and before the report, which is the same as
/// without options; a throw before the last call rejects with it, one in
/// the last does not. An aborted signal, or one aborted from the first
/// progress call, rejects with AbortError and its reason. Before, the
/// options were ignored: no progress call, and an aborted signal verified.
#[wasm_bindgen_test]
async fn verify_indexes_reports_progress_up_to_the_total_and_stops_on_abort() {
    let (store, _) = open("idx-verify-progress").await;
    let recs: Vec<Value> = (0..2500u32)
        .map(|i| json!({"_id": format!("v{i:04}"), "recordType": "run", "updatedAt": at(i)}))
        .collect();
    store.put_many(&js(Value::Array(recs))).await.unwrap();
    let api: JsValue = agentstore::AgentStore::from_store(store).into();
    let text = |v: &JsValue| js_sys::JSON::stringify(v).unwrap().as_string().unwrap();
    let plain = invoke(&api, "verifyIndexes", &[]).await.unwrap();
    assert_eq!(field(&plain, "checked").as_f64(), Some(2500.0));

    let st = js(json!({"log": []}));
    let slow = js_fn(
        "st",
        "return (d, t) => { st.log.push('call ' + d + '/' + t); \
           return new Promise((r) => setTimeout(() => { st.log.push('done ' + d); r(); }, 2)); };",
        &st,
    );
    let opts = js(json!({}));
    js_sys::Reflect::set(&opts, &"onProgress".into(), &slow).unwrap();
    let v = invoke(&api, "verifyIndexes", std::slice::from_ref(&opts))
        .await
        .unwrap();
    assert_eq!(text(&v), text(&plain));
    let want: Vec<String> = [1000, 2000, 2500]
        .iter()
        .flat_map(|d| [format!("call {d}/2500"), format!("done {d}")])
        .collect();
    assert_eq!(strings(&field(&st, "log")), want);

    for (body, rejects) in [
        (
            "return (d) => { if (d === 1000) throw new Error('stop'); };",
            true,
        ),
        (
            "return (d) => d === 2000 ? Promise.reject(new Error('stop')) : undefined;",
            true,
        ),
        (
            "return (d, t) => { if (d === t) throw new Error('stop'); };",
            false,
        ),
    ] {
        let on = js_fn("", body, &JsValue::UNDEFINED);
        js_sys::Reflect::set(&opts, &"onProgress".into(), &on).unwrap();
        let out = invoke(&api, "verifyIndexes", std::slice::from_ref(&opts)).await;
        match rejects {
            true => assert_eq!(
                field_str(&out.unwrap_err(), "message").as_deref(),
                Some("stop")
            ),
            false => assert_eq!(
                text(&out.unwrap()),
                text(&plain),
                "complete at the last call"
            ),
        }
    }

    let ctl = aborted("stop");
    let opts = js(json!({}));
    js_sys::Reflect::set(&opts, &"signal".into(), &ctl.signal()).unwrap();
    let e = invoke(&api, "verifyIndexes", &[opts]).await.unwrap_err();
    assert_eq!(error_kind(&e), ("AbortError".into(), "aborted".into()));
    assert_eq!(field_str(&e, "cause").as_deref(), Some("stop"));

    let ctl = web_sys::AbortController::new().unwrap();
    let opts = js(json!({}));
    js_sys::Reflect::set(&opts, &"signal".into(), &ctl.signal()).unwrap();
    let st = js(json!({"calls": 0}));
    js_sys::Reflect::set(&st, &"ctl".into(), &ctl).unwrap();
    let on = js_fn(
        "st",
        "return () => { st.calls++; st.ctl.abort('mid'); };",
        &st,
    );
    js_sys::Reflect::set(&opts, &"onProgress".into(), &on).unwrap();
    let e = invoke(&api, "verifyIndexes", &[opts]).await.unwrap_err();
    assert_eq!(error_kind(&e), ("AbortError".into(), "aborted".into()));
    assert_eq!(field_str(&e, "cause").as_deref(), Some("mid"));
    assert_eq!(
        field(&st, "calls").as_f64(),
        Some(1.0),
        "no call after the abort"
    );
}

/// `dropIndex(name, {signal})`: an aborted signal rejects with AbortError
/// (its reason as `cause`) and drops nothing, and `onProgress` is refused
/// (the drop is one transaction: there is no progress to report). Before,
/// the options were ignored and the index was dropped.
#[wasm_bindgen_test]
async fn drop_index_with_an_aborted_signal_drops_nothing() {
    let name = fresh_name("idx-drop-abort");
    let old = Store::open(&name, 2000, None, vec![by_type(), by_owner()])
        .await
        .unwrap();
    assert!(old.prepare_indexes().await.unwrap());
    old.put(&js(json!({"_id": "a", "owner": "o1"})))
        .await
        .unwrap();
    let api: JsValue = agentstore::AgentStore::from_store(
        Store::open(&name, 2000, None, vec![by_type()])
            .await
            .unwrap(),
    )
    .into();
    let ctl = aborted("stop");
    let opts = js(json!({}));
    js_sys::Reflect::set(&opts, &"signal".into(), &ctl.signal()).unwrap();
    let e = invoke(&api, "dropIndex", &[s("byOwner"), opts])
        .await
        .unwrap_err();
    assert_eq!(error_kind(&e), ("AbortError".into(), "aborted".into()));
    assert_eq!(field_str(&e, "cause").as_deref(), Some("stop"));
    let f = js_fn("", "return () => {};", &JsValue::UNDEFINED);
    let opts = js(json!({}));
    js_sys::Reflect::set(&opts, &"onProgress".into(), &f).unwrap();
    let e = invoke(&api, "dropIndex", &[s("byOwner"), opts])
        .await
        .unwrap_err();
    assert_eq!(
        error_kind(&e),
        ("ValidationError".into(), "validation".into())
    );
    let dropped = invoke(&api, "dropIndex", &[s("byOwner")]).await.unwrap();
    assert_eq!(dropped.as_bool(), Some(true), "it was still there");
}

/// `dropIndex(name, {signal})` aborted after its transaction was issued but
/// before that transaction read the index state drops nothing and rejects
/// with AbortError (docs/api.md: also while the transaction waits behind
/// another tab's). Before, the signal was looked at only before the
/// transaction was issued, and the drop went on. Found by helper-218.
#[wasm_bindgen_test]
async fn a_drop_aborted_after_its_transaction_was_issued_drops_nothing() {
    let name = fresh_name("idx-drop-abort-issued");
    let old = Store::open(&name, 2000, None, vec![by_type(), by_owner()])
        .await
        .unwrap();
    assert!(old.prepare_indexes().await.unwrap());
    let store = Store::open(&name, 2000, None, vec![by_type()])
        .await
        .unwrap();
    let ctl = web_sys::AbortController::new().unwrap();
    let signal = ctl.signal();
    // `join!` polls the drop first: it issues its transaction and waits for
    // the index state's read; the abort comes then.
    let (got, ()) = futures::join!(store.drop_index("byOwner", Some(&signal)), async {
        ctl.abort_with_reason(&"stop".into());
    });
    match got {
        Err(e) => assert_eq!(code(&e), ErrorCode::Aborted, "{e:?}"),
        Ok(dropped) => panic!("not refused: dropped {dropped}"),
    }
    assert!(
        store.drop_index("byOwner", None).await.unwrap(),
        "it was still there"
    );
}

/// An `abort` event (with `signal.aborted` still false) fired inside an
/// `onProgress` call of `rebuildIndexes` or `verifyIndexes`, before that
/// call returns a Promise that never settles, ends the call (a rebuild with
/// AbortError): the event counts from the call on, also for a wait that
/// began listening after it. Before, the wait for the Promise listened only
/// from then on, and both calls never settled. Found by helper-218.
#[wasm_bindgen_test]
async fn an_abort_event_before_an_on_progress_promise_ends_a_rebuild_or_verify() {
    let (store, name) = open("idx-abort-event-progress").await;
    let docs: Vec<Value> = (0..30u32)
        .map(|i| json!({"_id": format!("r{i:03}"), "recordType": "run"}))
        .collect();
    store.put_many(&js(json!(docs))).await.unwrap();
    let api: JsValue = agentstore::AgentStore::from_store(open_named(&name).await).into();
    for method in ["rebuildIndexes", "verifyIndexes"] {
        let opts = js_fn(
            "m",
            "const sig = new AbortController().signal; \
             const o = { signal: sig, onProgress: () => { \
               sig.dispatchEvent(new Event('abort')); return new Promise(() => {}); } }; \
             if (m === 'rebuildIndexes') o.batchSize = 10; \
             return o;",
            &s(method),
        );
        let p = js_sys::Reflect::get(&api, &method.into()).unwrap();
        let p = js_sys::Function::from(p).call1(&api, &opts).unwrap();
        let got = settled_within_30s(&p).await;
        // A verify whose one `onProgress` call is its last has read every
        // record: it may resolve with its report (docs/api.md); never hang.
        match method {
            "rebuildIndexes" => assert_eq!(got, "rejected AbortError"),
            _ => assert_ne!(got, "pending", "{method}"),
        }
    }
    // The aborted rebuild resumes from its checkpoint.
    store.rebuild_indexes(500, false, None, None).await.unwrap();
    assert_indexes_clean(&store).await;
}

/// The way to wait for `open()`'s background rebuild (docs/api.md, Derived
/// indexes): `rebuildIndexes({restart: false})` right after `open()` works
/// alongside it and resolves with every declared index complete (an app
/// that must not serve `listBy` from full scans awaits it).
#[wasm_bindgen_test]
async fn rebuild_without_restart_right_after_open_waits_for_the_background_rebuild() {
    let name = fresh_name("idx-await-background");
    let first = open_named(&name).await;
    let recs: Vec<Value> = (0..1200u32)
        .map(|i| json!({"_id": format!("b{i:04}"), "recordType": "run", "owner": format!("o{}", i % 3), "updatedAt": at(i)}))
        .collect();
    first.put_many(&js(Value::Array(recs))).await.unwrap();
    first.close();
    let indexes = js(json!([
        {"name": "byType", "keys": ["recordType", "updatedAt"]},
        {"name": "byOwner", "keys": ["owner"]},
    ]));
    let opts = js_sys::Object::new();
    js_sys::Reflect::set(&opts, &"indexes".into(), &indexes).unwrap();
    let api =
        wasm_bindgen_futures::JsFuture::from(agentstore::AgentStore::open(s(&name), opts.into()))
            .await
            .unwrap();
    let n = invoke(&api, "rebuildIndexes", &[js(json!({"restart": false}))])
        .await
        .unwrap();
    assert_eq!(n.as_f64(), Some(1200.0));
    let v = invoke(&api, "verifyIndexes", &[]).await.unwrap();
    let text = js_sys::JSON::stringify(&v).unwrap().as_string().unwrap();
    assert_eq!(
        text,
        r#"{"checked":1200,"missing":[],"orphaned":[],"stale":[],"building":[]}"#
    );
    invoke(&api, "close", &[]).await.unwrap();
}
