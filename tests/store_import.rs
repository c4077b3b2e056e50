//! Imports and exports: winners inside one import, PouchDB `_revisions`,
//! lines that carry documents, bad lines, `updatedAt`, streamed sources
//! (Blob, Response, ReadableStream), progress, abort and failed batches.
// Tests may read and call the page's values with js-sys directly: a slot
// kept by a throw lasts only for the test page (clippy.toml).
#![allow(clippy::disallowed_methods)]

use agentstore::store::{ByQuery, ImportOptions, Store};
use agentstore_protocol::ErrorCode;
use js_sys::{Array, Function, JsString, Promise};
use serde_json::json;
use std::cell::RefCell;
use std::rc::Rc;
use wasm_bindgen::closure::Closure;
use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_futures::JsFuture;
use wasm_bindgen_test::*;

mod common;
use common::*;
#[path = "common/values.rs"]
mod values;
use values::wasm_memory_bytes;

wasm_bindgen_test_configure!(run_in_browser);

/// The header of an empty snapshot (no line may follow it).
const HEADER: &str = "{\"agentstore\":\"snapshot\",\"records\":0,\"tombstones\":0,\"version\":1}";

/// A snapshot of `lines` under the header an export writes for them
/// (tombstones counted by their `"_deleted":true`).
fn snapshot<S: AsRef<str>>(lines: &[S]) -> String {
    let dead = lines
        .iter()
        .filter(|l| l.as_ref().contains("\"_deleted\":true"))
        .count();
    let header = json!({"agentstore": "snapshot", "records": lines.len() - dead,
                        "tombstones": dead, "version": 1});
    std::iter::once(header.to_string())
        .chain(lines.iter().map(|l| l.as_ref().to_owned()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// `[text, Blob, Response, ReadableStream]` of the same text.
fn sources(text: &str) -> Vec<(&'static str, JsValue)> {
    let f = Function::new_with_args(
        "t",
        "return [t, new Blob([t]), new Response(t), new Blob([t]).stream()]",
    );
    let a: Array = f.call1(&JsValue::NULL, &text.into()).unwrap().into();
    ["string", "Blob", "Response", "ReadableStream"]
        .into_iter()
        .zip(a.iter())
        .collect()
}

/// Every change `watch` announces, as `id@rev` (`!` marks a deletion).
struct Seen {
    seen: Rc<RefCell<Vec<String>>>,
    _cb: Closure<dyn FnMut(JsValue)>,
    watcher: agentstore::store::Watcher,
}

fn watch_all(store: &Store) -> Seen {
    let seen = Rc::new(RefCell::new(Vec::new()));
    let s2 = seen.clone();
    let cb = Closure::<dyn FnMut(JsValue)>::new(move |c: JsValue| {
        let mark = if field(&c, "deleted").as_bool() == Some(true) {
            "!"
        } else {
            ""
        };
        s2.borrow_mut().push(format!(
            "{}@{}{mark}",
            field_str(&c, "id").unwrap(),
            field_str(&c, "rev").unwrap()
        ));
    });
    let watcher = agentstore::store::Watcher::new(
        store,
        "".into(),
        cb.as_ref().unchecked_ref::<Function>().clone(),
    )
    .unwrap();
    Seen {
        seen,
        _cb: cb,
        watcher,
    }
}

impl Seen {
    /// Writes a sentinel and waits (bounded) until it is announced: every
    /// change committed before it has been delivered by then (one channel
    /// delivers in order). Returns what came before it.
    async fn drain(self, store: &Store) -> Vec<String> {
        store.put(&js(json!({"_id": "~sentinel"}))).await.unwrap();
        for _ in 0..500 {
            if self
                .seen
                .borrow()
                .iter()
                .any(|c| c.starts_with("~sentinel@"))
            {
                break;
            }
            gloo_timers::future::TimeoutFuture::new(20).await;
        }
        self.watcher.close();
        let mut out = self.seen.borrow().clone();
        assert!(
            out.pop().is_some_and(|l| l.starts_with("~sentinel@")),
            "sentinel seen"
        );
        out.sort();
        out
    }
}

fn rec(id: &str, rev: &str, updated: &str) -> String {
    json!({"_id": id, "_rev": rev, "recordType": "run", "updatedAt": updated}).to_string()
}

/// A snapshot of `n` records `p0`… at revision 1-aa.
fn snapshot_of_runs(n: usize) -> String {
    let lines: Vec<String> = (0..n)
        .map(|i| rec(&format!("p{i}"), "1-aa", "2026-01-01T00:00:00.000Z"))
        .collect();
    snapshot(&lines)
}

fn tomb(id: &str, rev: &str) -> String {
    json!({"_id": id, "_rev": rev, "_deleted": true}).to_string()
}

async fn runs(store: &Store) -> Vec<String> {
    let q = ByQuery::from_js(&js(json!({"eq": "run"}))).unwrap();
    let page = store.list_by("byType", &q).await.unwrap();
    page.records
        .iter()
        .map(|r| {
            format!(
                "{}@{}",
                field_str(&r, "_id").unwrap(),
                field_str(&r, "_rev").unwrap()
            )
        })
        .collect()
}

/// Issue 15: an older export appended to a newer one (and the reverse)
/// resolves each id to its highest revision, a tombstone like any other;
/// only winners reach the store, the derived index and `watch`.
#[wasm_bindgen_test]
async fn duplicate_ids_in_one_snapshot_resolve_to_the_highest_revision_and_only_it_is_written() {
    let newer = [
        rec("x", "2-bb", "2026-02-02T00:00:00.000Z"),
        tomb("y", "2-cc"),
        tomb("z", "2-dd"),
    ];
    let older = [
        rec("x", "1-aa", "2026-01-01T00:00:00.000Z"),
        rec("y", "1-aa", "2026-01-01T00:00:00.000Z"),
        rec("z", "1-ff", "2026-01-01T00:00:00.000Z"),
        rec("x", "2-ba", "2026-01-03T00:00:00.000Z"),
    ];
    for order in [[&newer[..], &older[..]], [&older[..], &newer[..]]] {
        let (store, _) = open("snap-dup").await;
        let text = snapshot(&order.concat());
        let seen = watch_all(&store);
        let c = store.import_snapshot(text.as_str(), None).await.unwrap();
        assert_eq!((c.written, c.kept_newer), (3, 0));
        let got = store.get(&s("x")).await.unwrap().unwrap();
        assert_eq!(field_str(&got, "_rev").as_deref(), Some("2-bb"));
        assert_eq!(
            field_str(&got, "updatedAt").as_deref(),
            Some("2026-02-02T00:00:00.000Z")
        );
        assert!(store.get(&s("y")).await.unwrap().is_none());
        assert!(store.get(&s("z")).await.unwrap().is_none());
        assert_eq!(runs(&store).await, ["x@2-bb"]);
        assert_indexes_clean(&store).await;
        assert_eq!(seen.drain(&store).await, ["x@2-bb", "y@2-cc!", "z@2-dd!"]);
    }
}

fn pouch_doc(id: &str, rev: &str, deleted: bool, ancestors: &[&str]) -> serde_json::Value {
    let (generation, hash) = rev.split_once('-').unwrap();
    let mut ids = vec![hash];
    ids.extend_from_slice(ancestors);
    let mut d = json!({
        "_id": id, "_rev": rev, "recordType": "run", "updatedAt": "2026-01-01T00:00:00.000Z",
        "_revisions": {"start": generation.parse::<u64>().unwrap(), "ids": ids}
    });
    if deleted {
        d["_deleted"] = json!(true);
    }
    d
}

fn dump(lines: &[serde_json::Value]) -> String {
    std::iter::once("{\"version\":\"1.2.9\",\"db_type\":\"idb\"}".to_owned())
        .chain(lines.iter().map(|l| l.to_string()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Issue 15: `x` live at 1-a in one row, deleted at its child 2-b (whose
/// `_revisions` names 1-a) in another imports `x` deleted, as PouchDB says —
/// in either order, in separate lines or one; only 2-b is announced.
#[wasm_bindgen_test]
async fn a_pouch_revision_named_as_an_ancestor_never_wins() {
    let live = pouch_doc("x", "1-a", false, &[]);
    let dead = pouch_doc("x", "2-b", true, &["a"]);
    let cases = [
        dump(&[json!({"docs": [live]}), json!({"docs": [dead]})]),
        dump(&[json!({"docs": [dead]}), json!({"docs": [live]})]),
        dump(&[json!({"docs": [live, dead]})]),
    ];
    for text in cases {
        let (store, _) = open("pouch-anc").await;
        let seen = watch_all(&store);
        let opts = ImportOptions {
            batch: 1,
            ..ImportOptions::default()
        };
        let (sum, c, _) = store
            .import_pouch_dump_with(&text.as_str().into(), "agent-index", &opts)
            .await
            .unwrap();
        assert_eq!((sum.documents_read, sum.live, sum.tombstones), (2, 0, 1));
        assert_eq!(c.written, 1);
        assert!(store.get(&s("x")).await.unwrap().is_none(), "x is deleted");
        assert!(store
            .export_snapshot()
            .await
            .unwrap()
            .contains(r#"{"_id":"x","_rev":"2-b","_deleted":true,"#));
        assert!(runs(&store).await.is_empty());
        assert_indexes_clean(&store).await;
        assert_eq!(seen.drain(&store).await, ["x@2-b!"]);
    }
}

/// Several live leaves of one id across lines: PouchDB's winner is the only
/// record written, indexed and announced.
#[wasm_bindgen_test]
async fn duplicate_pouch_rows_write_only_the_pouchdb_winner() {
    let text = dump(&[
        json!({"docs": [pouch_doc("c", "2-aa", false, &["00"]), pouch_doc("d", "3-ff", true, &["ee", "dd"])]}),
        json!({"seq": 2}),
        json!({"docs": [pouch_doc("c", "2-bb", false, &["00"]), pouch_doc("d", "1-cc", false, &[])]}),
        json!({"docs": [pouch_doc("c", "2-aa", false, &["00"])]}),
    ]);
    let (store, _) = open("pouch-dup").await;
    let seen = watch_all(&store);
    let (sum, c, _) = store
        .import_pouch_dump(text.as_str(), "agent-index", None)
        .await
        .unwrap();
    assert_eq!(
        (sum.live, sum.tombstones, sum.conflicts_resolved),
        (2, 0, 1)
    );
    assert_eq!(c.written, 2);
    let mut got = runs(&store).await;
    got.sort();
    assert_eq!(got, ["c@2-bb", "d@1-cc"]);
    assert_indexes_clean(&store).await;
    assert_eq!(seen.drain(&store).await, ["c@2-bb", "d@1-cc"]);
}

/// Issue 15: a line holding both `docs` and `seq` is imported — here one
/// line of 3,000 documents with multi-byte text, streamed from a Blob so it
/// spans many chunks of the byte stream.
#[wasm_bindgen_test]
async fn a_dump_line_with_docs_and_seq_is_imported_whatever_its_size() {
    let docs: Vec<_> = (0..3000)
        .map(|i| {
            let mut d = pouch_doc(&format!("r{i:05}"), "1-ab", false, &[]);
            d["name"] = json!(format!("Señor 翻译助手 {i} 🦀"));
            d
        })
        .collect();
    let text = dump(&[json!({"docs": docs, "seq": 3000})]);
    for (kind, src) in sources(&text) {
        let (store, _) = open("pouch-docs-seq").await;
        let opts = ImportOptions::default();
        let (sum, c, _) = store
            .import_pouch_dump_with(&src, "agent-index", &opts)
            .await
            .unwrap();
        assert_eq!(
            (sum.documents_read, sum.live, sum.last_seq, c.written),
            (3000, 3000, Some(3000), 3000),
            "{kind}"
        );
        let r = store.get(&s("r02999")).await.unwrap().unwrap();
        assert_eq!(
            field_str(&r, "name").as_deref(),
            Some("Señor 翻译助手 2999 🦀"),
            "{kind}"
        );
        assert!(
            field(&r, "_revisions").is_undefined(),
            "bookkeeping dropped"
        );
    }
}

/// One id with more leaves (conflicting or deleted branches) than
/// `MAX_LEAVES` fails the import with a ValidationError naming the line of
/// the leaf past the bound, and nothing is written; at the bound it
/// imports, PouchDB's winner written. Before, every row of the id copied
/// and decoded the whole leaf set: an import quadratic in that id's rows.
#[wasm_bindgen_test]
async fn a_document_with_more_leaves_than_the_bound_is_refused_naming_its_line() {
    let max = agentstore_protocol::pouch::MAX_LEAVES;
    let lines = |n: usize| {
        let docs: Vec<_> = (0..n)
            .map(|i| pouch_doc("x", &format!("1-{i:032x}"), false, &[]))
            .collect();
        dump(
            &docs
                .chunks(100)
                .map(|c| json!({ "docs": c }))
                .collect::<Vec<_>>(),
        )
    };
    let (store, _) = open("many-leaves").await;
    let e = store
        .import_pouch_dump(lines(max + 1).as_str(), "agent-index", None)
        .await
        .unwrap_err();
    // The header is line 1, then 100 docs a line: doc `max` (from 0) is on
    // line 2 + max / 100.
    assert_refused_at_line(&store, &e, 2 + max / 100).await;
    let (store, _) = open("many-leaves-ok").await;
    let (sum, c, _) = store
        .import_pouch_dump(lines(max).as_str(), "agent-index", None)
        .await
        .unwrap();
    assert_eq!((sum.documents_read, c.written), (max as u64, 1));
    let got = store.get(&s("x")).await.unwrap().expect("x");
    let rev = js_sys::Reflect::get(&got, &"_rev".into()).unwrap();
    assert_eq!(rev.as_string().unwrap(), format!("1-{:032x}", max - 1));
}

/// A line that cannot be read fails the whole import with a ValidationError
/// naming the line, before any batch is written.
#[wasm_bindgen_test]
async fn an_unreadable_line_is_a_validation_error_naming_it_and_nothing_is_written() {
    let ok = |id: &str| json!({"docs": [pouch_doc(id, "1-aa", false, &[])]});
    let good = dump(&[ok("a"), ok("b"), ok("c")]);
    let bad_pouch = [
        (format!("{good}\n{{\"docs\": [oops\n"), 5),
        (format!("{good}\n{{\"nothing\": 1}}\n"), 5),
        (format!("{good}\n{{\"docs\": {{}}}}\n"), 5),
        (
            format!("{good}\n\n{{\"docs\": [{{\"_id\": 7, \"_rev\": \"1-a\"}}]}}\n"),
            6,
        ),
        (
            format!("{good}\n{{\"docs\": [{{\"_id\": \"q\", \"_rev\": \"x\"}}]}}\n"),
            5,
        ),
    ];
    for (text, line) in bad_pouch {
        let (store, _) = open("bad-line").await;
        let opts = ImportOptions {
            batch: 1,
            ..ImportOptions::default()
        };
        let e = store
            .import_pouch_dump_with(&text.as_str().into(), "agent-index", &opts)
            .await
            .unwrap_err();
        assert_refused_at_line(&store, &e, line).await;
    }
    let snap = snapshot(&[rec("a", "1-aa", "2026-01-01T00:00:00.000Z"), "[1]".into()]);
    let snap_no_rev = snapshot(&[
        rec("a", "1-aa", "2026-01-01T00:00:00.000Z"),
        "{\"_id\":\"b\"}".into(),
    ]);
    for text in [snap, snap_no_rev] {
        let (store, _) = open("bad-snap").await;
        let e = store
            .import_snapshot(text.as_str(), None)
            .await
            .unwrap_err();
        assert_eq!(e.code(), ErrorCode::Validation);
        assert!(e.to_string().contains("line 3:"), "{e}");
        assert!(store.get(&s("a")).await.unwrap().is_none());
    }
}

/// A row's `_revisions` must describe its own `_rev`: the reviewers' dump
/// (`_rev` 1-aa with `_revisions` 3-cc, 2-bb, then a row 2-bb) used to
/// resolve to 1-aa "old", its ancestors burying the newer 2-bb. Refused
/// naming the bad row's line in either line order, nothing written; the
/// same rows with a `_revisions` of their own import 2-bb.
#[wasm_bindgen_test]
async fn a_row_whose_revisions_disagree_with_its_rev_is_refused_naming_its_line() {
    let head = "{\"version\":\"1.2.4\",\"db_type\":\"leveldb\",\"start_time\":\"2026-01-01T00:00:00.000Z\",\"db_info\":{\"doc_count\":1,\"update_seq\":2}}";
    let bad = json!({"docs": [{"_id": "x", "_rev": "1-aa", "v": "old", "recordType": "run",
                               "_revisions": {"start": 3, "ids": ["cc", "bb"]}}]})
    .to_string();
    let new = json!({"docs": [{"_id": "x", "_rev": "2-bb", "v": "new", "recordType": "run"}]})
        .to_string();
    let end = "{\"seq\":2}";
    let cases = [
        ([head, bad.as_str(), new.as_str(), end], 2),
        ([head, new.as_str(), bad.as_str(), end], 3),
    ];
    for (lines, line) in cases {
        let (store, _) = open("pouch-revs-disagree").await;
        let text = lines.join("\n");
        let e = store
            .import_pouch_dump(text.as_str(), "agent-index", None)
            .await
            .unwrap_err();
        assert_refused_at_line(&store, &e, line).await;
        assert!(e.to_string().contains("_revisions"), "{e}");
        assert!(store.get(&s("x")).await.unwrap().is_none());
    }
    // The start right but ids[0] another hash, and the other way round.
    for revisions in [
        json!({"start": 1, "ids": ["bb"]}),
        json!({"start": 2, "ids": ["aa", "bb"]}),
        json!({"start": 1, "ids": []}),
    ] {
        let row = json!({"docs": [{"_id": "x", "_rev": "1-aa", "recordType": "run",
                                   "_revisions": revisions}]});
        let (store, _) = open("pouch-revs-disagree").await;
        let e = store
            .import_pouch_dump(dump(&[row]).as_str(), "agent-index", None)
            .await
            .unwrap_err();
        assert_refused_at_line(&store, &e, 2).await;
    }
    // Rows whose `_revisions` are their own import as PouchDB says.
    let old = pouch_doc("x", "1-aa", false, &[]);
    let newer = pouch_doc("x", "2-bb", false, &["aa"]);
    let (store, _) = open("pouch-revs-agree").await;
    store
        .import_pouch_dump(
            dump(&[json!({"docs": [newer]}), json!({"docs": [old]})]).as_str(),
            "agent-index",
            None,
        )
        .await
        .unwrap();
    let x = store.get(&s("x")).await.unwrap().expect("x");
    assert_eq!(field_str(&x, "_rev").as_deref(), Some("2-bb"));
}

/// Issue 15: imports keep the `updatedAt` they carry (and add none), so
/// "newest first" listings keep their order.
#[wasm_bindgen_test]
async fn imports_keep_their_updated_at() {
    let (store, _) = open("keep-updated").await;
    let text = snapshot(&[
        rec("old", "3-aa", "2001-02-03T04:05:06.007Z"),
        json!({"_id": "bare", "_rev": "1-aa"}).to_string(),
    ]);
    store.import_snapshot(text.as_str(), None).await.unwrap();
    let old = store.get(&s("old")).await.unwrap().unwrap();
    assert_eq!(
        field_str(&old, "updatedAt").as_deref(),
        Some("2001-02-03T04:05:06.007Z")
    );
    let bare = store.get(&s("bare")).await.unwrap().unwrap();
    assert!(field(&bare, "updatedAt").is_undefined());
    let (store, _) = open("keep-updated-pouch").await;
    let text = dump(&[json!({"docs": [pouch_doc("p", "4-aa", false, &["bb"])]})]);
    store
        .import_pouch_dump(text.as_str(), "agent-index", None)
        .await
        .unwrap();
    let p = store.get(&s("p")).await.unwrap().unwrap();
    assert_eq!(
        field_str(&p, "updatedAt").as_deref(),
        Some("2026-01-01T00:00:00.000Z")
    );
}

/// Calls `f(arg)`, a JS function made from `body` (test set-up only).
fn js_call(args: &str, body: &str, arg: &JsValue) -> JsValue {
    Function::new_with_args(args, body)
        .call1(&JsValue::NULL, arg)
        .unwrap()
}

/// Awaits a JS Promise (a test's own timer, or what a test records).
async fn settled(p: JsValue) -> JsValue {
    JsFuture::from(p.unchecked_into::<Promise>()).await.unwrap()
}

/// A store of 7 records and 1 tombstone, and its export.
async fn export_fixture(tag: &str) -> (Store, String) {
    let (store, _) = open(tag).await;
    for i in 0..7 {
        store
            .put(&js(json!({"_id": format!("k{i}"), "recordType": "run"})))
            .await
            .unwrap();
    }
    let w = store.put(&js(json!({"_id": "gone"}))).await.unwrap();
    store.delete(&s("gone"), &s(&w.rev)).await.unwrap();
    let text = store.export_snapshot().await.unwrap();
    (store, text)
}

/// An async `onChunk` (`exportSnapshotChunks(async c => { await
/// writable.write(c) })`) is awaited: each chunk goes to it only after the
/// Promise of the previous call resolved, in order, and the export resolves
/// after the last. With `batchSize` 2 the reads span several of its timers,
/// and the export is still the one consistent snapshot. Before, every chunk
/// was handed over at once, the Promises ignored.
#[wasm_bindgen_test]
async fn an_async_on_chunk_gets_each_chunk_only_after_the_previous_one_resolved() {
    let (store, text) = export_fixture("export-async").await;
    let st = js(json!({"log": [], "got": [], "busy": false}));
    let f = js_call(
        "st",
        "return (c) => { const i = st.got.length; st.log.push('call ' + i); \
           if (st.busy) st.log.push('overlap'); st.busy = true; st.got.push(c); \
           return new Promise((r) => setTimeout(() => { st.busy = false; \
             st.log.push('done ' + i); r(); }, 2)); };",
        &st,
    );
    store
        .export_snapshot_chunks(Some(f.unchecked_ref()), 2)
        .await
        .expect("export");
    let got: Vec<String> = Array::from(&field(&st, "got"))
        .iter()
        .map(|c| c.as_string().unwrap())
        .collect();
    assert_eq!(got.len(), 6, "header, 4 record chunks, 1 tombstone chunk");
    assert_eq!(got.concat(), text);
    let log: Vec<String> = Array::from(&field(&st, "log"))
        .iter()
        .map(|c| c.as_string().unwrap())
        .collect();
    let want: Vec<String> = (0..6)
        .flat_map(|i| [format!("call {i}"), format!("done {i}")])
        .collect();
    assert_eq!(
        log, want,
        "one at a time, the export resolved after the last"
    );
}

/// `{batchSize: 2, …}` plus `extra` (JSON) and `signal`, when given.
fn export_opts(extra: serde_json::Value, signal: Option<&web_sys::AbortSignal>) -> JsValue {
    let mut o = json!({"batchSize": 2});
    if let (Some(o), Some(e)) = (o.as_object_mut(), extra.as_object()) {
        o.extend(e.clone());
    }
    let o = js(o);
    if let Some(sig) = signal {
        js_sys::Reflect::set(&o, &"signal".into(), sig).unwrap();
    }
    o
}

/// `exportSnapshot`, `exportSnapshotBlob` and `exportSnapshotChunks` take a
/// `signal`. An aborted one is refused with AbortError (`cause`: its
/// reason). One that aborts mid-way ends the export: no chunk goes to
/// `onChunk` after the abort, whether it came from a synchronous `onChunk`
/// or while an async one's Promise was pending, the call rejects with
/// AbortError and the read transaction is dropped (the store goes on, and
/// exports whole again). Before, `signal` was an option no export took
/// (ValidationError).
#[wasm_bindgen_test]
async fn an_aborted_export_rejects_with_abort_error_and_hands_no_chunk_after_the_abort() {
    let (store, text) = export_fixture("export-abort").await;
    let api: JsValue = agentstore::AgentStore::from_store(store).into();
    let ctl = aborted("stop");
    let sig = ctl.signal();
    let noop = js_fn("", "return () => {};", &JsValue::UNDEFINED);
    for (method, args) in [
        ("exportSnapshot", vec![export_opts(json!({}), Some(&sig))]),
        (
            "exportSnapshotBlob",
            vec![export_opts(json!({}), Some(&sig))],
        ),
        (
            "exportSnapshotChunks",
            vec![noop, export_opts(json!({}), Some(&sig))],
        ),
    ] {
        let e = invoke(&api, method, &args).await.unwrap_err();
        assert_eq!(
            error_kind(&e),
            ("AbortError".into(), "aborted".into()),
            "{method}"
        );
        assert_eq!(field_str(&e, "cause").as_deref(), Some("stop"), "{method}");
    }
    for (how, body) in [
        (
            "a synchronous onChunk aborts as it takes the 2nd chunk",
            "return (c) => { st.got.push(c); if (st.got.length === 2) st.ctl.abort('mid'); };",
        ),
        (
            "the signal aborts while the 2nd chunk's Promise is pending",
            "return (c) => { st.got.push(c); if (st.got.length === 2) { \
               setTimeout(() => st.ctl.abort('mid'), 5); return new Promise(() => {}); } };",
        ),
    ] {
        let ctl = web_sys::AbortController::new().unwrap();
        let st = js(json!({"got": []}));
        js_sys::Reflect::set(&st, &"ctl".into(), &ctl).unwrap();
        let f = js_fn("st", body, &st);
        let opts = export_opts(json!({}), Some(&ctl.signal()));
        let e = invoke(&api, "exportSnapshotChunks", &[f, opts])
            .await
            .unwrap_err();
        assert_eq!(
            error_kind(&e),
            ("AbortError".into(), "aborted".into()),
            "{how}"
        );
        assert_eq!(field_str(&e, "cause").as_deref(), Some("mid"), "{how}");
        assert_eq!(
            strings(&field(&st, "got")).len(),
            2,
            "{how}: no chunk after the abort"
        );
    }
    // An abort from `onProgress` ends the string and Blob exports too.
    for method in ["exportSnapshot", "exportSnapshotBlob"] {
        let ctl = web_sys::AbortController::new().unwrap();
        let on = js_fn("c", "return () => c.abort('from progress');", &ctl);
        let opts = export_opts(json!({}), Some(&ctl.signal()));
        js_sys::Reflect::set(&opts, &"onProgress".into(), &on).unwrap();
        let e = invoke(&api, method, &[opts]).await.unwrap_err();
        assert_eq!(
            error_kind(&e),
            ("AbortError".into(), "aborted".into()),
            "{method}"
        );
        assert_eq!(
            field_str(&e, "cause").as_deref(),
            Some("from progress"),
            "{method}"
        );
    }
    let again = invoke(&api, "exportSnapshot", &[]).await.unwrap();
    assert_eq!(again.as_string().as_deref(), Some(text.as_str()));
}

/// An export's `onProgress(done, total)` counts the records and tombstones
/// exported, after each batch and after that batch's chunk went to
/// `onChunk`, up to the header's total. An async one is awaited before the
/// next chunk or call, and the export resolves after the last; a throw or
/// rejection before the last call rejects the export with it, one in the
/// last call (the export is complete) does not. Before, `onProgress` was an
/// option no export took (ValidationError).
#[wasm_bindgen_test]
async fn export_progress_counts_records_and_tombstones_up_to_the_total_in_turn_with_the_chunks() {
    let (store, text) = export_fixture("export-progress").await;
    let api: JsValue = agentstore::AgentStore::from_store(store).into();
    let st = js(json!({"log": []}));
    let chunk = js_fn("st", "return (c) => { st.log.push('chunk'); };", &st);
    let progress = js_fn(
        "st",
        "return (d, t) => { st.log.push('call ' + d + '/' + t); \
           return new Promise((r) => setTimeout(() => { st.log.push('done ' + d); r(); }, 2)); };",
        &st,
    );
    let opts = export_opts(json!({}), None);
    js_sys::Reflect::set(&opts, &"onProgress".into(), &progress).unwrap();
    invoke(&api, "exportSnapshotChunks", &[chunk, opts.clone()])
        .await
        .expect("export");
    // 7 records in 4 batches of 2, then 1 tombstone; the header first.
    let mut want = vec!["chunk".to_owned()];
    for d in [2, 4, 6, 7, 8] {
        want.extend(["chunk".into(), format!("call {d}/8"), format!("done {d}")]);
    }
    assert_eq!(strings(&field(&st, "log")), want);

    let st = js(json!({"log": []}));
    let record = js_fn("st", "return (d, t) => { st.log.push(d + '/' + t); };", &st);
    js_sys::Reflect::set(&opts, &"onProgress".into(), &record).unwrap();
    let out = invoke(&api, "exportSnapshot", std::slice::from_ref(&opts))
        .await
        .unwrap();
    assert_eq!(out.as_string().as_deref(), Some(text.as_str()));
    assert_eq!(
        strings(&field(&st, "log")),
        ["2/8", "4/8", "6/8", "7/8", "8/8"]
    );

    for (body, rejects) in [
        (
            "return (d) => { if (d === 4) throw new Error('stop at ' + d); };",
            true,
        ),
        (
            "return (d) => d === 4 ? Promise.reject(new Error('stop at ' + d)) : undefined;",
            true,
        ),
        (
            "return (d, t) => { if (d === t) throw new Error('stop at ' + d); };",
            false,
        ),
    ] {
        let on = js_fn("", body, &JsValue::UNDEFINED);
        js_sys::Reflect::set(&opts, &"onProgress".into(), &on).unwrap();
        for method in ["exportSnapshot", "exportSnapshotBlob"] {
            let out = invoke(&api, method, std::slice::from_ref(&opts)).await;
            match rejects {
                true => assert_eq!(
                    field_str(&out.unwrap_err(), "message").as_deref(),
                    Some("stop at 4"),
                    "{method} {body}"
                ),
                false => assert!(out.is_ok(), "{method}: complete at the last call"),
            }
        }
    }
}

/// An async `onChunk` whose Promise rejects (a failed `writable.write`)
/// stops the export, which rejects with that same error; no chunk follows,
/// and the rejection is handled (no `unhandledrejection`), for a Promise and
/// for another library's thenable. Before, the export resolved as a success
/// and the rejection went unhandled.
#[wasm_bindgen_test]
async fn an_async_on_chunk_that_rejects_rejects_the_export_and_gets_no_more_chunks() {
    let (store, _) = export_fixture("export-reject").await;
    let unhandled = js(json!({"n": 0}));
    let listen = js_call(
        "u",
        "const h = (e) => { if (String(e.reason && e.reason.message).startsWith('disk full')) u.n++; }; \
         globalThis.addEventListener('unhandledrejection', h); \
         return () => globalThis.removeEventListener('unhandledrejection', h);",
        &unhandled,
    );
    let makers = [
        // A Promise that rejects on the 2nd chunk.
        "return (c) => { st.calls++; return st.calls === 2 ? \
           Promise.reject(new Error('disk full ' + st.calls)) : Promise.resolve(); };",
        // A thenable that is not a Promise, rejecting later.
        "return (c) => { st.calls++; const n = st.calls; return { then(ok, no) { \
           setTimeout(() => n === 2 ? no(new Error('disk full ' + n)) : ok(), 1); } }; };",
    ];
    for body in makers {
        let st = js(json!({"calls": 0}));
        let f = js_call("st", body, &st);
        let e = store
            .export_snapshot_chunks(Some(f.unchecked_ref()), 2)
            .await
            .unwrap_err();
        let thrown = e.to_js();
        assert_eq!(
            field_str(&thrown, "message").as_deref(),
            Some("disk full 2"),
            "the export rejects with onChunk's own error: {e}"
        );
        assert_eq!(field(&st, "calls").as_f64(), Some(2.0), "no chunk after it");
        store
            .get(&s("k0"))
            .await
            .unwrap()
            .expect("the store goes on");
    }
    // Whatever an unhandled rejection would fire is queued by now.
    settled(js_call(
        "",
        "return new Promise((r) => setTimeout(r, 0));",
        &JsValue::UNDEFINED,
    ))
    .await;
    listen
        .unchecked_ref::<Function>()
        .call0(&JsValue::NULL)
        .unwrap();
    assert_eq!(
        field(&unhandled, "n").as_f64(),
        Some(0.0),
        "no unhandled rejection"
    );
}

/// A callback that closes the store and then returns a Promise that
/// rejects: the call rejects with ClosedError and the callback's rejection
/// is handled, not an `unhandledrejection` (for `onChunk` and an import's
/// `onProgress`). Before, the store was found closed before the Promise
/// was raced, and its rejection was left unhandled. Review finding
/// (helper-178).
#[wasm_bindgen_test]
async fn a_callback_that_closes_the_store_then_rejects_leaves_no_unhandled_rejection() {
    let text = serde_json::to_string(&snapshot_of_runs(20)).unwrap();
    let calls = [
        "s.exportSnapshotChunks(cb, { batchSize: 2 })".to_owned(),
        format!("s.importSnapshot({text}, {{ batchSize: 5, onProgress: cb }})"),
    ];
    for (i, call) in calls.iter().enumerate() {
        let (store, _) = export_fixture(&format!("close-then-reject-{i}")).await;
        let api = JsValue::from(agentstore::AgentStore::from_store(store));
        let f = Function::new_with_args(
            "s",
            &format!(
                "const st = {{ unhandled: 0, rejected: false }}; \
                 const h = (e) => {{ if (String(e.reason && e.reason.message) === 'close then fail') {{ \
                   st.unhandled++; e.preventDefault(); }} }}; \
                 globalThis.addEventListener('unhandledrejection', h); \
                 const cb = () => {{ s.close(); return new Promise((_, no) => setTimeout(() => {{ \
                   st.rejected = true; no(new Error('close then fail')); }}, 5)); }}; \
                 const turn = () => new Promise((r) => setTimeout(r, 0)); \
                 return ({call}).then(() => 'resolved', (e) => e.name).then(async (r) => {{ \
                   for (let n = 0; !st.rejected && n < 2000; n++) await turn(); \
                   await turn(); await turn(); \
                   globalThis.removeEventListener('unhandledrejection', h); \
                   return [r, st.rejected, st.unhandled]; }});"
            ),
        );
        let p: Promise = f.call1(&JsValue::NULL, &api).unwrap().unchecked_into();
        let out: Array = JsFuture::from(p).await.unwrap().into();
        assert_eq!(
            out.get(0).as_string().as_deref(),
            Some("ClosedError"),
            "{call}"
        );
        assert_eq!(
            out.get(1).as_bool(),
            Some(true),
            "the callback's Promise rejected"
        );
        assert_eq!(
            out.get(2).as_f64(),
            Some(0.0),
            "no unhandled rejection: {call}"
        );
    }
}

/// An import's async `onProgress` is awaited before the next batch (each
/// call only after the previous one resolved), and one that rejects before
/// the last batch ends the import with that error as a throw does, the
/// committed batches kept. Before, the Promise was ignored: the batches ran
/// on and a rejection went unhandled while the import resolved.
#[wasm_bindgen_test]
async fn an_async_on_progress_is_awaited_and_its_rejection_ends_the_import() {
    let (_, text) = export_fixture("progress-src").await;
    let st = js(json!({"log": [], "busy": false}));
    let f = js_call(
        "st",
        "return (d, t) => { st.log.push('call ' + d); if (st.busy) st.log.push('overlap'); \
           st.busy = true; return new Promise((r) => setTimeout(() => { st.busy = false; \
             st.log.push('done ' + d); r(); }, 2)); };",
        &st,
    );
    let (store, _) = open("progress-async").await;
    let opts = ImportOptions {
        batch: 3,
        on_progress: Some(f.unchecked_into()),
        ..ImportOptions::default()
    };
    store
        .import_snapshot_with(&text.as_str().into(), &opts)
        .await
        .unwrap();
    let log: Vec<String> = Array::from(&field(&st, "log"))
        .iter()
        .map(|c| c.as_string().unwrap())
        .collect();
    assert_eq!(
        log,
        ["call 3", "done 3", "call 6", "done 6", "call 8", "done 8"]
    );

    let st = js(json!({"calls": 0}));
    let f = js_call(
        "st",
        "return () => { st.calls++; return st.calls === 1 ? \
           Promise.reject(new Error('progress failed')) : undefined; };",
        &st,
    );
    let (store, _) = open("progress-reject").await;
    let opts = ImportOptions {
        batch: 3,
        on_progress: Some(f.unchecked_into()),
        ..ImportOptions::default()
    };
    let e = store
        .import_snapshot_with(&text.as_str().into(), &opts)
        .await
        .unwrap_err();
    assert_eq!(
        field_str(&e.to_js(), "message").as_deref(),
        Some("progress failed"),
        "{e}"
    );
    assert_eq!(field(&st, "calls").as_f64(), Some(1.0), "no batch after it");
    let kept = store.export_snapshot().await.unwrap();
    assert!(
        kept.starts_with("{\"agentstore\":\"snapshot\",\"records\":3,"),
        "{kept}"
    );
}

/// Issue 17: a string, Blob, Response and ReadableStream import the same;
/// anything else is a ValidationError and the store keeps working.
#[wasm_bindgen_test]
async fn imports_take_a_string_blob_response_or_readable_stream_and_refuse_anything_else() {
    let (a, _) = open("src-a").await;
    for i in 0..25 {
        a.put(&js(
            json!({"_id": format!("k{i}"), "recordType": "run", "v": "é"}),
        ))
        .await
        .unwrap();
    }
    let w = a.put(&js(json!({"_id": "gone"}))).await.unwrap();
    a.delete(&s("gone"), &s(&w.rev)).await.unwrap();
    let text = a.export_snapshot().await.unwrap();
    for (kind, src) in sources(&text) {
        let (b, _) = open("src-b").await;
        let opts = ImportOptions {
            batch: 4,
            ..ImportOptions::default()
        };
        let c = b.import_snapshot_with(&src, &opts).await.unwrap();
        assert_eq!(c.written, 26, "{kind}");
        assert_eq!(b.export_snapshot().await.unwrap(), text, "{kind}");
        assert_indexes_clean(&b).await;
    }
    let (b, _) = open("src-bad").await;
    let used = Function::new_with_args("", "const r = new Response('x'); r.text(); return r;")
        .call0(&JsValue::NULL)
        .unwrap();
    let bad = [
        JsValue::from(42),
        JsValue::NULL,
        JsValue::UNDEFINED,
        js(json!({"docs": []})),
        Array::new().into(),
        JsValue::from(js_sys::Symbol::for_("s")),
        used,
    ];
    for v in bad {
        let e = b
            .import_pouch_dump_with(&v, "agent-index", &ImportOptions::default())
            .await
            .unwrap_err();
        assert_eq!(e.code(), ErrorCode::Validation, "{v:?}: {e}");
        let e = b
            .import_snapshot_with(&v, &ImportOptions::default())
            .await
            .unwrap_err();
        assert_eq!(e.code(), ErrorCode::Validation, "{v:?}: {e}");
    }
    b.put(&js(json!({"_id": "still-works"}))).await.unwrap();
}

async fn blob_text(v: &JsValue) -> String {
    let text: Function = field(v, "text").unchecked_into();
    let p: Promise = text.call0(v).unwrap().unchecked_into();
    JsFuture::from(p).await.unwrap().as_string().unwrap()
}

/// Issue 17: the export streams — chunks of whole lines to `onChunk`, or a
/// Blob — with the same bytes as the string form, read in one transaction.
#[wasm_bindgen_test]
async fn export_streams_chunks_or_a_blob_with_the_same_bytes() {
    let (store, _) = open("export").await;
    for i in 0..30 {
        store
            .put(&js(json!({"_id": format!("e{i:02}"), "n": i})))
            .await
            .unwrap();
    }
    let w = store.put(&js(json!({"_id": "t"}))).await.unwrap();
    store.delete(&s("t"), &s(&w.rev)).await.unwrap();
    let whole = store.export_snapshot().await.unwrap();
    assert_eq!(whole.lines().count(), 32);
    assert!(whole.starts_with(
        "{\"agentstore\":\"snapshot\",\"records\":30,\"tombstones\":1,\"version\":1}\n"
    ));
    let chunks = Rc::new(RefCell::new(Vec::<String>::new()));
    let c2 = chunks.clone();
    let cb = Closure::<dyn FnMut(JsString)>::new(move |c: JsString| c2.borrow_mut().push(c.into()));
    let rest = store
        .export_snapshot_chunks(Some(cb.as_ref().unchecked_ref()), 7)
        .await
        .unwrap();
    assert_eq!(rest.length(), 0);
    let chunks = chunks.borrow().clone();
    assert_eq!(
        chunks.len(),
        1 + 5 + 1,
        "header, 30 records by 7, 1 tombstone"
    );
    assert!(chunks.iter().all(|c| c.ends_with('\n')));
    assert_eq!(chunks.concat(), whole);
    let blob = store.export_snapshot_blob(7).await.unwrap();
    assert_eq!(blob_text(&blob).await, whole);
}

/// Progress after each committed batch; an aborted signal stops the import
/// before its next batch; a batch that fails leaves nothing of itself, and
/// running the import again completes it.
#[wasm_bindgen_test]
async fn progress_abort_and_a_failed_batch_leave_only_whole_committed_batches() {
    let text = snapshot_of_runs(5);
    let (store, _) = open("progress").await;
    let calls = Rc::new(RefCell::new(Vec::<(u32, u32)>::new()));
    let c2 = calls.clone();
    let cb =
        Closure::<dyn FnMut(u32, u32)>::new(move |d: u32, t: u32| c2.borrow_mut().push((d, t)));
    let opts = ImportOptions {
        on_progress: Some(cb.as_ref().unchecked_ref::<Function>().clone()),
        batch: 2,
        ..ImportOptions::default()
    };
    store.inject_abort_next_write();
    let e = store
        .import_snapshot_with(&text.as_str().into(), &opts)
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::Transaction);
    assert!(
        holds_no_record(&store).await,
        "the failed first batch left nothing"
    );
    assert!(calls.borrow().is_empty());
    let c = store
        .import_snapshot_with(&text.as_str().into(), &opts)
        .await
        .unwrap();
    assert_eq!(c.written, 5);
    assert_eq!(*calls.borrow(), [(2, 5), (4, 5), (5, 5)]);

    let (store, _) = open("abort").await;
    let ctl = web_sys::AbortController::new().unwrap();
    ctl.abort();
    let opts = ImportOptions {
        signal: Some(ctl.signal()),
        ..ImportOptions::default()
    };
    let e = store
        .import_snapshot_with(&text.as_str().into(), &opts)
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::Aborted);
    assert!(store.get(&s("p0")).await.unwrap().is_none());
}

/// An import into an empty store skips per-id reads only while nothing else
/// writes: a record and a tombstone written between two batches (here by
/// another connection, in the progress callback, before the next batch's
/// transaction exists) are seen and their newer revisions kept.
#[wasm_bindgen_test]
async fn a_write_from_elsewhere_during_an_import_into_an_empty_store_is_not_overwritten() {
    let text = snapshot_of_runs(6);
    let (store, c, db) = import_with_writes_between_batches(
        "foreign",
        &text,
        "tx.objectStore('records').put({_id: 'p4', _rev: '9-ff', recordType: 'run', updatedAt: '2026-05-05T00:00:00.000Z'}); \
         tx.objectStore('tombstones').put({_id: 'p5', _rev: '9-ee', _deleted: true});",
    )
    .await;
    assert_eq!((c.written, c.kept_newer), (4, 2));
    assert!(
        store.get(&s("p5")).await.unwrap().is_none(),
        "the newer tombstone stays"
    );
    let p4 = store.get(&s("p4")).await.unwrap().unwrap();
    assert_eq!(field_str(&p4, "_rev").as_deref(), Some("9-ff"));
    for i in [0, 1, 2, 3] {
        let r = store.get(&s(&format!("p{i}"))).await.unwrap().unwrap();
        assert_eq!(field_str(&r, "_rev").as_deref(), Some("1-aa"));
    }
    let close: Function = field(&db, "close").unchecked_into();
    close.call0(&db).unwrap();
}

/// The same, when the writes from elsewhere leave the tombstone count as the
/// import left it: one of the import's own tombstones is removed (its id
/// written again) and a newer tombstone written for an id the import brings
/// later. The import must not bring that record back over the tombstone
/// (before, its `add` could not see the tombstone, and the record and the
/// tombstone were both stored: the delete was undone). Review finding.
#[wasm_bindgen_test]
async fn a_tombstone_written_elsewhere_during_an_import_is_kept_when_the_count_is_unchanged() {
    let lines: Vec<String> = std::iter::once(tomb("p0", "1-aa"))
        .chain((1..6).map(|i| rec(&format!("p{i}"), "1-aa", "2026-01-01T00:00:00.000Z")))
        .collect();
    let text = snapshot(&lines);
    let (store, c, db) = import_with_writes_between_batches(
        "foreign-swap",
        &text,
        "tx.objectStore('tombstones').delete('p0'); \
         tx.objectStore('records').put({_id: 'p0', _rev: '2-bb', recordType: 'run', updatedAt: '2026-05-05T00:00:00.000Z'}); \
         tx.objectStore('tombstones').put({_id: 'p5', _rev: '9-ee', _deleted: true});",
    )
    .await;
    assert_eq!((c.written, c.kept_newer), (5, 1));
    assert!(
        store.get(&s("p5")).await.unwrap().is_none(),
        "the newer tombstone stays and the record is not brought back"
    );
    let p0 = store.get(&s("p0")).await.unwrap().unwrap();
    assert_eq!(field_str(&p0, "_rev").as_deref(), Some("2-bb"));
    for i in 1..5 {
        let r = store.get(&s(&format!("p{i}"))).await.unwrap().unwrap();
        assert_eq!(field_str(&r, "_rev").as_deref(), Some("1-aa"));
    }
    let count = Function::new_with_args(
        "db",
        "return new Promise((ok) => { const r = db.transaction('records').objectStore('records').count('p5'); r.onsuccess = () => ok(r.result); })",
    );
    let live_p5 = JsFuture::from(
        count
            .call1(&JsValue::NULL, &db)
            .unwrap()
            .unchecked_into::<Promise>(),
    )
    .await
    .unwrap();
    assert_eq!(
        live_p5.as_f64(),
        Some(0.0),
        "no live p5 beside its tombstone"
    );
    let close: Function = field(&db, "close").unchecked_into();
    close.call0(&db).unwrap();
}

/// Every way into the store checks a record as `put` does: a snapshot line
/// or a PouchDB doc with a reserved `_` field, a non-string `recordType`, a
/// malformed `updatedAt`, a value JSON cannot carry or nesting past the
/// limit is refused naming its line, and nothing of the import is written
/// (before, such a record was stored and then refused by `put`, `mutate`
/// and the store's own `importSnapshot` of its export).
#[wasm_bindgen_test]
async fn an_imported_record_must_pass_the_checks_put_makes() {
    let mut deep = json!("leaf");
    for _ in 0..80 {
        deep = json!({ "n": deep });
    }
    let bad_fields: [(&str, serde_json::Value); 5] = [
        ("_custom", json!(1)),
        ("recordType", json!(5)),
        ("updatedAt", json!("yesterday")),
        ("nested", deep),
        ("_rev_info", json!("x")),
    ];
    for (key, value) in bad_fields {
        let mut good = json!({"_id": "a", "_rev": "1-aa", "recordType": "run"});
        let mut bad = json!({"_id": "b", "_rev": "1-aa", "recordType": "run"});
        bad[key] = value.clone();
        // The same body as `put` sees it is refused there too.
        let (store, _) = open("import-rules-put").await;
        let mut put_body = bad.clone();
        put_body.as_object_mut().unwrap().remove("_rev");
        let e = store.put(&js(put_body)).await.unwrap_err();
        assert_eq!(e.code(), ErrorCode::Validation, "put {key}: {e}");

        let snap = snapshot(&[good.to_string(), bad.to_string()]);
        let (store, _) = open("import-rules-snap").await;
        let e = store
            .import_snapshot(snap.as_str(), None)
            .await
            .unwrap_err();
        assert_eq!(e.code(), ErrorCode::Validation, "snapshot {key}: {e}");
        assert!(e.to_string().contains("line 3:"), "snapshot {key}: {e}");
        assert!(store.get(&s("a")).await.unwrap().is_none(), "{key}");

        good["_revisions"] = json!({"start": 1, "ids": ["aa"]});
        bad["_revisions"] = json!({"start": 1, "ids": ["aa"]});
        let text = dump(&[json!({"docs": [good]}), json!({"docs": [bad]})]);
        let (store, _) = open("import-rules-pouch").await;
        let e = store
            .import_pouch_dump(text.as_str(), "agent-index", None)
            .await
            .unwrap_err();
        assert_eq!(e.code(), ErrorCode::Validation, "pouch {key}: {e}");
        assert!(e.to_string().contains("line 3:"), "pouch {key}: {e}");
        assert!(store.get(&s("a")).await.unwrap().is_none(), "{key}");
    }
}

/// Only what an import stores must pass `put`'s checks: a PouchDB revision
/// that loses (a conflicting leaf with a lower hash, or an ancestor the
/// winner supersedes) may carry a body `put` would refuse, and PouchDB's
/// own `_local_seq`/`_removed` fields are bookkeeping, stripped like
/// `_revisions`.
#[wasm_bindgen_test]
async fn a_losing_pouch_revision_is_not_held_against_the_dump() {
    let mut loser = pouch_doc("x", "1-a", false, &[]);
    loser["_custom"] = json!(1);
    let winner = pouch_doc("x", "1-b", false, &[]);
    let mut old = pouch_doc("y", "1-a", false, &[]);
    old["recordType"] = json!(5);
    let mut newer = pouch_doc("y", "2-c", false, &["a"]);
    newer["_local_seq"] = json!(7);
    newer["_removed"] = json!(false);
    let text = dump(&[
        json!({"docs": [loser, old]}),
        json!({"docs": [winner, newer]}),
    ]);
    let (store, _) = open("pouch-loser").await;
    store
        .import_pouch_dump(text.as_str(), "agent-index", None)
        .await
        .expect("only the winners are checked");
    let x = store.get(&s("x")).await.unwrap().unwrap();
    assert_eq!(field_str(&x, "_rev").as_deref(), Some("1-b"));
    assert!(field(&x, "_custom").is_undefined());
    let y = store.get(&s("y")).await.unwrap().unwrap();
    assert_eq!(field_str(&y, "_rev").as_deref(), Some("2-c"));
    assert!(field(&y, "_local_seq").is_undefined());
    assert!(field(&y, "_removed").is_undefined());
}

/// A dump of `n` ids built in JS (nothing of it in wasm memory), each with
/// a winning revision 1-b and a body `put` refuses (`updatedAt` a number,
/// the epoch milliseconds PouchDB apps often stored) on revision 1-a: the
/// losing leaf when `bad_winner` is false, else on the winner 1-b (its
/// good body then on the loser 1-a).
fn refused_rows_dump(n: u32, bad_winner: bool) -> JsValue {
    let make = Function::new_with_args(
        "n, badWinner",
        "const doc = (id, rev, bad) => JSON.stringify({_id: id, _rev: rev, recordType: 'run', \
           updatedAt: bad ? 1767225600000 + n : '2026-01-01T00:00:00.000Z', \
           _revisions: {start: 1, ids: [rev.slice(2)]}}); \
         const lines = ['{\"version\":\"1.2.9\",\"db_type\":\"idb\"}']; \
         for (let i = 0; i < n; i++) { \
           const id = 'r' + String(i).padStart(6, '0'); \
           lines.push('{\"docs\":[' + doc(id, '1-a', !badWinner) + ',' + doc(id, '1-b', badWinner) + ']}'); \
         } \
         return lines.join('\\n');",
    );
    make.call2(&JsValue::NULL, &n.into(), &bad_winner.into())
        .unwrap()
}

/// Rows whose bodies an import refuses are kept, until the winners are
/// known, as JS values: wasm memory, which never shrinks, stays as it was
/// however many losing rows a dump refuses (it grew by about 280 bytes per
/// refused row, for the page's life), and a dump whose winners are refused
/// is refused naming the first such line, nothing written.
#[wasm_bindgen_test]
async fn refused_losing_rows_of_a_dump_leave_wasm_memory_as_it_was() {
    const N: u32 = 30_000;
    let (store, _) = open("pouch-refused-memory").await;
    // Warm-up: the first import's own buffers.
    store
        .import_pouch_dump(refused_rows_dump(200, false), "agent-index", None)
        .await
        .unwrap();
    let before = wasm_memory_bytes();
    let (summary, counts, _) = store
        .import_pouch_dump(refused_rows_dump(N, false), "agent-index", None)
        .await
        .expect("only the winners are checked");
    assert_eq!(summary.documents_read, 2 * u64::from(N));
    assert_eq!((counts.written, counts.kept_newer), (N - 200, 200));
    let r = store.get(&s("r029999")).await.unwrap().unwrap();
    assert_eq!(field_str(&r, "_rev").as_deref(), Some("1-b"));
    let e = store
        .import_pouch_dump(refused_rows_dump(N, true), "agent-index", None)
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::Validation, "{e}");
    assert!(e.to_string().contains("line 2:"), "{e}");
    let grown = wasm_memory_bytes() - before;
    assert!(
        grown < f64::from(2 << 20),
        "wasm memory grew by {grown} bytes over {} refused rows",
        2 * N
    );
}

/// A stream source larger than the 4 MiB at which its chunks are folded
/// into a Blob, cut into chunks at odd byte offsets (inside lines and
/// inside a 2-byte UTF-8 character), imports every record exactly.
#[wasm_bindgen_test]
async fn a_stream_source_larger_than_the_fold_imports_every_record_exactly() {
    let pad = "é".repeat(1500);
    let lines: Vec<String> = (0..3000)
        .map(|i| json!({"_id": format!("big{i:04}"), "_rev": "1-aa", "pad": pad}).to_string())
        .collect();
    let text = snapshot(&lines);
    assert!(text.len() > 8 << 20, "two folds and a rest: {}", text.len());
    let stream = Function::new_with_args(
        "text",
        "const bytes = new TextEncoder().encode(text); let at = 0; \
         return new ReadableStream({ pull(c) { \
           if (at >= bytes.length) { c.close(); return; } \
           const n = 65537; c.enqueue(bytes.slice(at, at + n)); at += n; } });",
    )
    .call1(&JsValue::NULL, &JsValue::from_str(&text))
    .unwrap();
    let (store, _) = open("big-stream").await;
    let c = store.import_snapshot(stream, None).await.unwrap();
    assert_eq!(c.written, 3000);
    for id in ["big0000", "big1234", "big2999"] {
        let got = store.get(&s(id)).await.unwrap().unwrap();
        assert_eq!(
            field_str(&got, "pad").as_deref(),
            Some(pad.as_str()),
            "{id}"
        );
    }
}

/// A stream chunk is the caller's object: a real Uint8Array with an own
/// accessor that throws. Before, its `length` was read through a binding
/// that does not catch; the throw unwound through the module and the import
/// never settled. Now a throwing `length`, `buffer` or `byteOffset` does not
/// matter (the bytes are taken from the view's internal slots) and every
/// record imports; a throwing `byteLength` (what the collector counts) is a
/// ValidationError that writes nothing; and the store imports normally
/// afterwards.
#[wasm_bindgen_test]
async fn import_stream_chunk_with_throwing_getters_imports_or_rejects_instead_of_hanging() {
    let text = snapshot_of_runs(3);
    let make = Function::new_with_args(
        "text, key",
        "const bytes = new TextEncoder().encode(text); \
         Object.defineProperty(bytes, key, { get() { throw new Error('getter ' + key); } }); \
         return new ReadableStream({ start(c) { c.enqueue(bytes); c.close(); } });",
    );
    let stream = |key: &str| {
        make.call2(&JsValue::NULL, &s(&text), &s(key))
            .expect("the stream is made")
    };
    for key in ["length", "buffer", "byteOffset"] {
        let (store, _) = open(&format!("chunk-getter-{key}")).await;
        let c = store
            .import_snapshot(stream(key), None)
            .await
            .unwrap_or_else(|e| panic!("{key}: {e}"));
        assert_eq!(c.written, 3, "{key}");
        assert_eq!(
            runs(&store).await,
            ["p0@1-aa", "p1@1-aa", "p2@1-aa"],
            "{key}"
        );
    }
    let (store, _) = open("chunk-getter-byteLength").await;
    let e = store
        .import_snapshot(stream("byteLength"), None)
        .await
        .expect_err("a chunk whose byteLength throws");
    assert_eq!(e.code(), ErrorCode::Validation, "{e}");
    assert!(e.to_string().contains("byteLength"), "{e}");
    assert!(runs(&store).await.is_empty(), "nothing is written");
    // The module is whole: the same store imports the next source.
    let c = store.import_snapshot(s(&text), None).await.unwrap();
    assert_eq!(c.written, 3);
    assert_eq!(runs(&store).await, ["p0@1-aa", "p1@1-aa", "p2@1-aa"]);
}

/// Two exports joined into one source (`cat a.ndjson b.ndjson`, or an older
/// export appended to a newer one) import as one: the second header line is
/// skipped, and per id the highest revision wins whichever export holds it.
/// Before, the second header was read as a record without `_id` and the
/// whole import was refused.
#[wasm_bindgen_test]
async fn joined_exports_import_as_one_with_the_highest_revision_winning() {
    let (a, _) = open("join-a").await;
    let (b, _) = open("join-b").await;
    let r1 = a
        .put(&js(json!({"_id": "shared", "v": 1})))
        .await
        .unwrap()
        .rev;
    a.put(&js(json!({"_id": "only-a"}))).await.unwrap();
    let first = b
        .put(&js(json!({"_id": "shared", "v": 1})))
        .await
        .unwrap()
        .rev;
    let newer = b
        .put(&js(json!({"_id": "shared", "_rev": first, "v": 2})))
        .await
        .unwrap()
        .rev;
    b.put(&js(json!({"_id": "only-b"}))).await.unwrap();
    assert!(newer.starts_with("2-") && r1.starts_with("1-"));
    let joined = format!(
        "{}{}",
        a.export_snapshot().await.unwrap(),
        b.export_snapshot().await.unwrap()
    );
    for (kind, source) in sources(&joined) {
        let (c, _) = open("join-c").await;
        let counts = c.import_snapshot(source, None).await.expect(kind);
        assert_eq!(counts.written, 3, "{kind}");
        for id in ["only-a", "only-b"] {
            assert!(c.get(&s(id)).await.unwrap().is_some(), "{kind}: {id}");
        }
        let shared = c.get(&s("shared")).await.unwrap().unwrap();
        assert_eq!(field_str(&shared, "_rev"), Some(newer.clone()), "{kind}");
    }
    // Only a whole header is skipped: a damaged line that merely names the
    // format is refused, and nothing is written.
    let (d, _) = open("join-d").await;
    let damaged = format!("{HEADER}\n{{\"agentstore\":\"snapshot\"}}\n");
    let e = d.import_snapshot(damaged.as_str(), None).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::Validation, "{}", e.message());
}

/// A source that fails while it is read (a stream that errors mid-way, as a
/// fetch cut off or a File that became unreadable does) rejects with an SDK
/// error — a real `Error` with `name`, a string `code` and `status` — and
/// writes nothing. Before, the platform's error came through as is (a
/// DOMException's `code` is a legacy number).
#[wasm_bindgen_test]
async fn a_source_that_fails_while_read_is_a_typed_error_and_writes_nothing() {
    let (store, _) = open("unreadable").await;
    let line = json!({"_id": "x", "_rev": "1-aa"}).to_string();
    for (name, want) in [
        ("NotReadableError", "validation"),
        ("AbortError", "aborted"),
    ] {
        let make = Function::new_with_args(
            "head, name",
            "return new ReadableStream({ start(c) { \
               c.enqueue(new TextEncoder().encode(head + '\\n')); \
               c.error(new DOMException('the source went away', name)); } })",
        );
        let text = snapshot(&[line.as_str()]);
        let stream = make
            .call2(&JsValue::NULL, &text.into(), &name.into())
            .unwrap();
        let e = store.import_snapshot(stream, None).await.unwrap_err();
        let thrown = e.to_js();
        assert!(
            thrown.is_instance_of::<js_sys::Error>(),
            "{name}: a real Error"
        );
        // The engines differ in what a Response reading an errored stream
        // rejects with (Firefox: an AbortError whatever the stream's error),
        // so either typed code passes; the raw error had none.
        let code = field_str(&thrown, "code");
        assert!(
            code.as_deref() == Some(want)
                || matches!(code.as_deref(), Some("validation" | "aborted")),
            "{name}: code {code:?}"
        );
        assert!(
            field(&thrown, "status").as_f64().is_some(),
            "{name}: status"
        );
        assert!(
            store.get(&s("x")).await.unwrap().is_none(),
            "{name}: nothing written"
        );
    }
}

/// The names of the origin's databases (`indexedDB.databases()`).
async fn database_names() -> Vec<String> {
    let f = Function::new_no_args("return indexedDB.databases().then((l) => l.map((d) => d.name))");
    let p: Promise = f.call0(&JsValue::NULL).unwrap().into();
    let a: Array = JsFuture::from(p).await.unwrap().into();
    a.iter().filter_map(|v| v.as_string()).collect()
}

/// The entry points run imports and exports on a second connection opened
/// with `Store::open_existing` (the io module's). A store deleted before that
/// open is refused with ClosedError and not created again empty (an export
/// would otherwise answer an empty snapshot, an import write into it).
#[wasm_bindgen_test]
async fn a_second_connection_never_recreates_a_deleted_store() {
    let name = fresh_name("io-existing");
    let err = Store::open_existing(&name, 5000, vec![])
        .await
        .err()
        .expect("a store that does not exist is refused");
    assert_eq!(code(&err), ErrorCode::Closed);
    assert!(
        !database_names().await.contains(&name),
        "the refused open left no database behind"
    );

    let first = open_named(&name).await;
    first.put(&js(json!({"_id": "a", "n": 1}))).await.unwrap();
    let second = Store::open_existing(&name, 5000, vec![by_type()])
        .await
        .expect("an existing store opens");
    let got = second
        .get(&s("a"))
        .await
        .unwrap()
        .expect("the same records");
    assert_eq!(field(&got, "n").as_f64(), Some(1.0));
    second.close();
    first.close();
    agentstore::store::destroy(&name, 5000).await.unwrap();
    let err = Store::open_existing(&name, 5000, vec![])
        .await
        .err()
        .expect("a destroyed store is refused");
    assert_eq!(code(&err), ErrorCode::Closed);
    assert!(!database_names().await.contains(&name));
}

/// `(name, code)` of the error an AgentStore Promise rejects with.
async fn rejection(p: Promise) -> (String, String) {
    let e = JsFuture::from(p).await.expect_err("the call must reject");
    (
        field_str(&e, "name").unwrap_or_default(),
        field_str(&e, "code").unwrap_or_default(),
    )
}

/// The JS API refuses an import the same way in every build (the shipped
/// entry points check before they load the io module; this build runs the
/// bodies in place): its arguments first, then a closed store, then an
/// aborted signal, all before the source is read. Before, an empty or
/// header-only source on a closed store resolved `{written: 0}` here while
/// the entry points rejected with ClosedError.
#[wasm_bindgen_test]
async fn an_import_refuses_a_closed_store_or_an_aborted_signal_before_it_reads() {
    let (store, _name) = open("io-refusals").await;
    let api = agentstore::AgentStore::from_store(store);
    let aborted = web_sys::AbortController::new().unwrap();
    aborted.abort();
    let with_signal = js_sys::Object::new();
    js_sys::Reflect::set(&with_signal, &"signal".into(), &aborted.signal()).unwrap();
    assert_eq!(
        rejection(api.import_snapshot(s(""), with_signal.clone().into())).await,
        ("AbortError".into(), "aborted".into())
    );
    assert_eq!(
        rejection(api.import_pouch_dump(s(HEADER), with_signal.into())).await,
        ("AbortError".into(), "aborted".into())
    );
    api.close();
    for p in [
        api.import_snapshot(s(""), JsValue::UNDEFINED),
        api.import_snapshot(s(HEADER), JsValue::UNDEFINED),
        api.import_pouch_dump(s(""), JsValue::UNDEFINED),
    ] {
        assert_eq!(rejection(p).await, ("ClosedError".into(), "closed".into()));
    }
    // A source that is already being read is refused before anything else
    // (the entry points refuse it without loading the io module).
    let f = Function::new_no_args(
        "const r = new Response('x'); r.body.getReader(); \
         const s = new Blob(['x']).stream(); s.getReader(); return [r, s];",
    );
    let busy: Array = f.call0(&JsValue::NULL).unwrap().into();
    for source in busy.iter() {
        let e = JsFuture::from(api.import_snapshot(source, JsValue::UNDEFINED))
            .await
            .expect_err("a locked source is refused");
        assert_eq!(field_str(&e, "name").as_deref(), Some("ValidationError"));
        let message = field_str(&e, "message").unwrap_or_default();
        assert!(message.contains("locked"), "{message}");
    }
    // Bad arguments are named first, even on a closed store.
    assert_eq!(
        rejection(api.import_snapshot(JsValue::from(42), JsValue::UNDEFINED)).await,
        ("ValidationError".into(), "validation".into())
    );
}

/// An import whose source never ends (a stalled stream or response body)
/// rejects with AbortError as soon as its signal aborts, and writes nothing.
/// Before, the signal was looked at only between batches, so the call waited
/// for the body for ever.
#[wasm_bindgen_test]
async fn an_abort_while_the_source_stalls_rejects_the_import() {
    let (store, _name) = open("io-stalled").await;
    let api = agentstore::AgentStore::from_store(store);
    // Each stream counts its cancellation in globalThis.__stalledCancelled.
    let stalled = Function::new_with_args(
        "head, response",
        "globalThis.__stalledCancelled ??= 0; \
         const s = new ReadableStream({ start(c) { c.enqueue(new TextEncoder().encode(head + '\\n')); }, \
           cancel() { globalThis.__stalledCancelled++; } }); \
         return response ? new Response(s) : s;",
    );
    let cancelled = || {
        js_sys::Reflect::get(&js_sys::global(), &"__stalledCancelled".into())
            .unwrap()
            .as_f64()
            .unwrap_or(0.0)
    };
    for (pouch, response) in [(false, false), (false, true), (true, false), (true, true)] {
        let source = stalled
            .call2(
                &JsValue::NULL,
                &HEADER.into(),
                &JsValue::from_bool(response),
            )
            .unwrap();
        let ctl = web_sys::AbortController::new().unwrap();
        let options = js_sys::Object::new();
        js_sys::Reflect::set(&options, &"signal".into(), &ctl.signal()).unwrap();
        let p = if pouch {
            api.import_pouch_dump(source, options.into())
        } else {
            api.import_snapshot(source, options.into())
        };
        let before = cancelled();
        ctl.abort();
        assert_eq!(
            rejection(p).await,
            ("AbortError".into(), "aborted".into()),
            "pouch {pouch}, response {response}"
        );
        // The source is cancelled, not read on after the rejection.
        wait_for("the stalled source to be cancelled", || {
            cancelled() > before
        })
        .await;
    }
    assert_eq!(
        JsFuture::from(api.count(JsValue::UNDEFINED))
            .await
            .unwrap()
            .as_f64(),
        Some(0.0)
    );
}

/// Imports `text` in batches of 2 into a new store named after `tag` while a
/// second (raw IndexedDB) connection runs the JS statements `writes` on `tx`,
/// its readwrite transaction over records and tombstones, once: in the
/// progress callback of the first batch, before the next batch's
/// transaction exists. Returns the store, the counts and that connection.
async fn import_with_writes_between_batches(
    tag: &str,
    text: &str,
    writes: &str,
) -> (Store, agentstore::store::ImportCounts, JsValue) {
    let (store, name) = open(tag).await;
    let open_raw = Function::new_with_args(
        "name",
        "return new Promise((ok, err) => { const r = indexedDB.open(name); r.onsuccess = () => ok(r.result); r.onerror = () => err(r.error); })",
    );
    let db = JsFuture::from(
        open_raw
            .call1(&JsValue::NULL, &name.as_str().into())
            .unwrap()
            .unchecked_into::<Promise>(),
    )
    .await
    .unwrap();
    let on_progress = Function::new_with_args(
        "db",
        &format!(
            "let once = false; return (done) => {{ if (once) return; once = true; \
             const tx = db.transaction(['records', 'tombstones'], 'readwrite'); {writes} }}"
        ),
    )
    .call1(&JsValue::NULL, &db)
    .unwrap();
    let opts = ImportOptions {
        on_progress: Some(on_progress.unchecked_into()),
        batch: 2,
        ..ImportOptions::default()
    };
    let c = store
        .import_snapshot_with(&text.into(), &opts)
        .await
        .unwrap();
    (store, c, db)
}

/// `e` is the ValidationError of dump line `line`, and `store` holds no record.
async fn assert_refused_at_line(store: &Store, e: &agentstore::StoreError, line: usize) {
    assert_eq!(e.code(), ErrorCode::Validation, "{e}");
    assert!(e.to_string().contains(&format!("line {line}:")), "{e}");
    assert!(holds_no_record(store).await, "nothing written");
}

/// Whether `store` holds no live record (its snapshot header says 0).
async fn holds_no_record(store: &Store) -> bool {
    store
        .export_snapshot()
        .await
        .unwrap()
        .contains("\"records\":0")
}

/// A source whose bytes are not UTF-8 (a Latin-1 `é` inside a string) is
/// refused with a ValidationError and nothing is written, as a Blob, a
/// Response or a ReadableStream, for a snapshot and a PouchDB dump alike.
/// Before, the decoder replaced the byte with U+FFFD and the record was
/// stored under the revision of a body that held other bytes.
#[wasm_bindgen_test]
async fn bytes_that_are_not_utf8_are_refused_and_nothing_is_written() {
    let (store, _) = open("not-utf8").await;
    let good = json!({"_id": "a", "_rev": "1-aa", "v": 1}).to_string();
    let snapshot = snapshot(&[
        good.clone(),
        "{\"_id\":\"b\",\"_rev\":\"1-bb\",\"v\":\"caf\u{1}\"}\n".to_owned(),
    ]);
    let dump = format!(
        "{{\"db_name\":\"d\",\"doc_count\":2}}\n{{\"docs\":[{good},{{\"_id\":\"b\",\"_rev\":\"1-bb\",\"v\":\"caf\u{1}\"}}]}}\n"
    );
    // The text with its U+0001 marker replaced by the lone byte 0xE9, as
    // a Blob, a Response and a ReadableStream.
    let make = Function::new_with_args(
        "t",
        "const e = new TextEncoder().encode(t); \
         const b = e.map(x => x === 1 ? 0xe9 : x); \
         return [new Blob([b]), new Response(b), new Blob([b]).stream()]",
    );
    for (what, text) in [("snapshot", &snapshot), ("dump", &dump)] {
        let sources: Array = make.call1(&JsValue::NULL, &text.into()).unwrap().into();
        for (kind, source) in ["Blob", "Response", "ReadableStream"]
            .iter()
            .zip(sources.iter())
        {
            let e = if what == "snapshot" {
                store.import_snapshot(source, None).await.map(|_| ())
            } else {
                store
                    .import_pouch_dump(source, "agent-index", None)
                    .await
                    .map(|_| ())
            }
            .expect_err(&format!("{what} as a {kind}"));
            assert_eq!(e.code(), ErrorCode::Validation, "{what} as a {kind}: {e:?}");
            for id in ["a", "b"] {
                assert!(
                    store.get(&s(id)).await.unwrap().is_none(),
                    "{what} as a {kind}: {id} written"
                );
            }
        }
    }
}

/// A negative zero in an imported line (`-0`, `-0.0`, `-1e-400`, which
/// underflows to it) is stored as `0`, as `put` stores it (JSON has no
/// negative zero). Before, imports stored `JSON.parse`'s value as parsed:
/// `get` answered `-0` where a `put` of the same record answers `0` (a
/// review finding). Snapshots and PouchDB dumps, at any depth.
#[wasm_bindgen_test]
async fn an_imported_negative_zero_is_stored_as_zero_as_put_stores_it() {
    let body = r#""a":-0,"b":[1,-0.0,{"c":-1e-400}],"d":-0.5,"e":"x:-0,","#;
    let is_zero = |v: &JsValue, at: &str| {
        js_sys::Reflect::set(&js_sys::global(), &"importedZero".into(), v).unwrap();
        let f = js_sys::Function::new_no_args(
            "const r = globalThis.importedZero; return [Object.is(r.a, 0), Object.is(r.b[1], 0), Object.is(r.b[2].c, 0), r.d, r.e].join();",
        );
        assert_eq!(
            f.call0(&JsValue::NULL).unwrap().as_string().as_deref(),
            Some("true,true,true,-0.5,x:-0,"),
            "{at}"
        );
    };
    let (store, _) = open("negzero-snap").await;
    let text = snapshot(&[[
        "{\"_id\":\"z\",\"_rev\":\"1-aa\",",
        body,
        "\"updatedAt\":\"2026-01-01T00:00:00.000Z\"}",
    ]
    .concat()]);
    store.import_snapshot(text.as_str(), None).await.unwrap();
    is_zero(&store.get(&s("z")).await.unwrap().unwrap(), "snapshot");
    let (store, _) = open("negzero-pouch").await;
    let text = [
        "{\"version\":\"1.2.9\",\"db_type\":\"idb\"}".to_owned(),
        [
            "{\"docs\":[{\"_id\":\"p\",\"_rev\":\"1-aa\",\"_revisions\":{\"start\":1,\"ids\":[\"aa\"]},",
            body,
            "\"updatedAt\":\"2026-01-01T00:00:00.000Z\"}]}",
        ]
        .concat(),
    ]
    .join("\n");
    store
        .import_pouch_dump(text.as_str(), "agent-index", None)
        .await
        .unwrap();
    is_zero(&store.get(&s("p")).await.unwrap().unwrap(), "PouchDB dump");
}

/// A throwing `onProgress` ends an import only while more is to be
/// written: thrown after a batch with records still to come, the import
/// rejects with what it threw and keeps the batches committed so far;
/// thrown after the last batch (also one that ends exactly at a batch
/// boundary), the import is complete and resolves, as `rebuildIndexes`
/// does.
#[wasm_bindgen_test]
async fn a_throwing_on_progress_ends_an_import_only_while_more_is_to_be_written() {
    let text = snapshot_of_runs(5);
    // (batch size, throw when `done` reaches, expected outcome)
    for (batch, at, completes) in [(2, 2, false), (2, 4, false), (2, 5, true), (5, 5, true)] {
        let (store, _) = open("progress-throw").await;
        let cb = Function::new_with_args(
            "done",
            &format!("if (done >= {at}) throw new RangeError('ui gone');"),
        );
        let opts = ImportOptions {
            on_progress: Some(cb),
            batch,
            ..ImportOptions::default()
        };
        let out = store
            .import_snapshot_with(&text.as_str().into(), &opts)
            .await;
        let stored = store.count(&[], None).await.unwrap();
        if completes {
            assert_eq!(out.unwrap().written, 5, "batch {batch}, thrown at {at}");
            assert_eq!(stored, 5);
        } else {
            match out {
                Err(agentstore::StoreError::Thrown(v)) => {
                    assert!(v.is_instance_of::<js_sys::RangeError>())
                }
                other => panic!("batch {batch}, thrown at {at}: {other:?}"),
            }
            assert_eq!(stored, at, "the batches committed before the throw stay");
        }
    }
}

/// A `Response` whose `ok` is false (what `fetch` resolves with for a wrong
/// URL: agentstore-server's own 404 has an empty body) is refused with a
/// ValidationError naming its status before anything is read or written,
/// by both imports, also when its body holds a valid snapshot. Before, an
/// empty 404 imported as an empty source (`{written: 0}`).
#[wasm_bindgen_test]
async fn an_import_refuses_a_response_that_is_not_ok_naming_its_status() {
    let (store, _) = open("http-error").await;
    let make = Function::new_with_args(
        "body",
        "return [[404, new Response('', { status: 404, statusText: 'Not Found' })], \
                 [500, new Response(null, { status: 500 })], \
                 [503, new Response(body, { status: 503 })]]",
    );
    let cases: Array = make
        .call1(&JsValue::NULL, &snapshot_of_runs(3).into())
        .unwrap()
        .into();
    for case in cases.iter() {
        let case: Array = case.into();
        let (status, response) = (case.get(0).as_f64().unwrap(), case.get(1));
        let want = format!("the import source is an HTTP {status} response");
        let e = store
            .import_snapshot_with(&response, &ImportOptions::default())
            .await
            .expect_err("a failed response is refused");
        assert_eq!(e.code(), ErrorCode::Validation, "{status}: {e}");
        assert!(e.message().contains(&want), "{status}: {e}");
        let e = store
            .import_pouch_dump_with(&response, "agent-index", &ImportOptions::default())
            .await
            .expect_err("a failed response is refused");
        assert_eq!(e.code(), ErrorCode::Validation, "{status}: {e}");
        assert!(e.message().contains(&want), "{status}: {e}");
        // Refused without reading it.
        assert_eq!(field(&response, "bodyUsed").as_bool(), Some(false));
    }
    assert!(holds_no_record(&store).await, "nothing written");
    // The JS methods refuse it the same way (the entry points before they
    // load the io module).
    let api = agentstore::AgentStore::from_store(store);
    let response = make
        .call1(&JsValue::NULL, &s(""))
        .map(|a| Array::from(&a).get(0))
        .map(|c| Array::from(&c).get(1))
        .unwrap();
    let e = JsFuture::from(api.import_snapshot(response, JsValue::UNDEFINED))
        .await
        .expect_err("refused");
    assert_eq!(field_str(&e, "name").as_deref(), Some("ValidationError"));
    assert!(field_str(&e, "message").unwrap().contains("HTTP 404"));
}

/// A source that errors while it is read rejects with a ValidationError
/// whose message names the source's own error, kept as its `cause`: a
/// ReadableStream (read directly, or through the pipe a `signal` adds), a
/// Response over one; for both imports (a stream erroring with a value
/// that is not an Error says so). Before,
/// a stream or Response was collected by `Response.blob()`, whose own
/// TypeError ("Failed to fetch" in Chromium) was named instead and the
/// stream's error dropped, and no source kept a `cause`.
#[wasm_bindgen_test]
async fn a_source_that_errors_names_its_own_error_and_keeps_it_as_cause() {
    let (store, _) = open("source-error").await;
    let make = Function::new_with_args(
        "kind, err, head",
        "const bytes = new TextEncoder().encode(head + '\\n'); \
         const failing = () => new ReadableStream({ start(c) { c.error(err); } }); \
         const midway = () => new ReadableStream({ start(c) { c.enqueue(bytes); c.error(err); } }); \
         if (kind === 'stream') return failing(); \
         if (kind === 'stream midway') return midway(); \
         return new Response(midway());",
    );
    let kinds = ["stream", "stream midway", "Response"];
    // An Error, or a value that is none (named "see cause": before, the
    // message ended in an empty "()", helper-202).
    let errors = [
        (
            JsValue::from(js_sys::Error::new("stream boom")),
            "(Error: stream boom)",
        ),
        (JsValue::NULL, "(a value that is not an Error: see cause)"),
    ];
    for (kind, pouch, signal, (err, named)) in kinds.iter().flat_map(|k| {
        errors.iter().flat_map(move |e| {
            [
                (*k, false, false, e),
                (*k, true, false, e),
                (*k, false, true, e),
            ]
        })
    }) {
        let what = format!("{kind}, pouch {pouch}, signal {signal}, {named}");
        let source = make
            .call3(&JsValue::NULL, &kind.into(), err, &s(HEADER))
            .unwrap();
        let ctl = web_sys::AbortController::new().unwrap();
        let opts = ImportOptions {
            signal: signal.then(|| ctl.signal()),
            ..ImportOptions::default()
        };
        let e = if pouch {
            store
                .import_pouch_dump_with(&source, "agent-index", &opts)
                .await
                .map(|_| ())
        } else {
            store.import_snapshot_with(&source, &opts).await.map(|_| ())
        }
        .expect_err(&what);
        assert_eq!(e.code(), ErrorCode::Validation, "{what}: {e}");
        assert!(e.message().contains(named), "{what}: {}", e.message());
        let thrown = e.to_js();
        assert_eq!(
            field_str(&thrown, "name").as_deref(),
            Some("ValidationError")
        );
        assert!(
            js_sys::Object::is(&field(&thrown, "cause"), err),
            "{what}: the stream's error is the cause"
        );
    }
    assert!(holds_no_record(&store).await, "nothing written");
}

/// A Blob whose own `stream` answers other bytes on its second call (and
/// whose own `text`, `arrayBuffer`, `slice` and `bytes` throw) imports its
/// own bytes, the same in both passes, for both imports: the record pass 1
/// checked is the one written, and none of the Blob's own methods is
/// called. Before, the Blob's own `stream` was called once per pass, so
/// pass 2 wrote what its second call answered (another body under the
/// checked revision, with a reserved field `put` refuses), unchecked.
#[wasm_bindgen_test]
async fn a_blob_whose_own_stream_is_replaced_imports_its_own_bytes_in_both_passes() {
    let at = "2026-01-01T00:00:00.000Z";
    let line = |v: &str, extra: bool| {
        let mut r =
            json!({"_id": "x", "_rev": "1-aa", "recordType": "run", "updatedAt": at, "v": v});
        if extra {
            r["_evil"] = json!(true);
        }
        r
    };
    let pouch = |r: serde_json::Value| {
        [
            "{\"version\":\"1.2.9\",\"db_type\":\"idb\"}".to_owned(),
            json!({"docs": [r]}).to_string(),
        ]
        .join("\n")
    };
    let make = Function::new_with_args(
        "a, b",
        "const blob = new Blob([a]); let calls = 0; \
         blob.stream = () => new Blob([++calls === 1 ? a : b]).stream(); \
         for (const k of ['text', 'arrayBuffer', 'slice', 'bytes']) blob[k] = () => { throw new Error(k); }; \
         return [blob, () => calls];",
    );
    for pouch_dump in [false, true] {
        let what = if pouch_dump {
            "PouchDB dump"
        } else {
            "snapshot"
        };
        let (checked, swapped) = (line("checked", false), line("swapped", true));
        let (a, b) = if pouch_dump {
            (pouch(checked), pouch(swapped))
        } else {
            (
                snapshot(&[checked.to_string()]),
                snapshot(&[swapped.to_string()]),
            )
        };
        let made: Array = make.call2(&JsValue::NULL, &s(&a), &s(&b)).unwrap().into();
        let (blob, calls) = (made.get(0), made.get(1).unchecked_into::<Function>());
        let (store, _) = open("blob-own-stream").await;
        if pouch_dump {
            store
                .import_pouch_dump(blob, "agent-index", None)
                .await
                .map(|_| ())
        } else {
            store.import_snapshot(blob, None).await.map(|_| ())
        }
        .unwrap_or_else(|e| panic!("{what}: {e}"));
        let got = store.get(&s("x")).await.unwrap().expect("x is written");
        assert_eq!(
            (
                field_str(&got, "v").as_deref(),
                field(&got, "_evil").is_undefined()
            ),
            (Some("checked"), true),
            "{what}: the checked record is the one written"
        );
        assert_eq!(
            calls.call0(&JsValue::NULL).unwrap().as_f64(),
            Some(0.0),
            "{what}: the Blob's own stream is never called"
        );
        store.close();
    }
}

/// A Response's own `body` getter is read once, by the source's checks,
/// and the stream it answered is the one imported: a getter that answers
/// another stream the second time is not read again. Before, the body was
/// read once for the checks and again to be collected, so the import read
/// a stream the checks had not seen.
#[wasm_bindgen_test]
async fn a_responses_own_body_getter_is_read_once_and_its_answer_imported() {
    let at = "2026-01-01T00:00:00.000Z";
    let text = |v: &str| {
        snapshot(&[
            json!({"_id": "x", "_rev": "1-aa", "recordType": "run", "updatedAt": at, "v": v})
                .to_string(),
        ])
    };
    let made: Array = Function::new_with_args(
        "a, b",
        "const ra = new Response(a), rb = new Response(b); let reads = 0; \
         const body = Object.getOwnPropertyDescriptor(Response.prototype, 'body').get; \
         Object.defineProperty(ra, 'body', { get() { return ++reads === 1 ? body.call(ra) : body.call(rb); } }); \
         return [ra, () => reads];",
    )
    .call2(&JsValue::NULL, &s(&text("checked")), &s(&text("other")))
    .unwrap()
    .into();
    let reads = made.get(1).unchecked_into::<Function>();
    let (store, _) = open("response-own-body").await;
    store.import_snapshot(made.get(0), None).await.unwrap();
    let got = store.get(&s("x")).await.unwrap().expect("x is written");
    assert_eq!(field_str(&got, "v").as_deref(), Some("checked"));
    assert_eq!(
        reads.call0(&JsValue::NULL).unwrap().as_f64(),
        Some(1.0),
        "the body getter ran once"
    );
    store.close();
}

/// A snapshot's header is checked: a `version` other than 1 (a format this
/// release does not know) is refused up front, and the lines that follow
/// each header must number its `records` + `tombstones`, so a file cut
/// short (at a line boundary, down to nothing) or with lines added is
/// refused, naming both counts, with nothing written (pass 1 reads the
/// whole source first). Headers as every release wrote them still import:
/// version 1 with both counts, in either key order. Before, the header was
/// only looked for, and a truncated file resolved as complete.
#[wasm_bindgen_test]
async fn a_snapshot_header_of_an_unknown_version_or_another_line_count_is_refused() {
    let line = |id: &str| rec(id, "1-aa", "2026-01-01T00:00:00.000Z");
    let header = |version: u32, records: u32| {
        json!({"agentstore": "snapshot", "records": records, "tombstones": 0, "version": version})
            .to_string()
    };
    let refused = [
        (
            format!("{}\n{}\n", header(99, 1), line("a")),
            "line 1: an unknown snapshot version",
        ),
        (
            format!("{}\n", header(1, 5)),
            "line 1: the header declares 5 records and tombstones but 0 lines follow it",
        ),
        (
            format!("{}\n{}\n{}\n", header(1, 1), line("a"), line("b")),
            "line 1: the header declares 1 records and tombstones but 2 lines follow it",
        ),
        // The first of two joined exports cut short; the second whole.
        (
            format!(
                "{}\n{}\n{}\n{}\n",
                header(1, 2),
                line("a"),
                header(1, 1),
                line("b")
            ),
            "line 1: the header declares 2 records and tombstones but 1 lines follow it",
        ),
        (
            format!(
                "{}\n{}\n{}\n{}\n",
                header(1, 1),
                line("a"),
                header(1, 1),
                ""
            ),
            "line 3: the header declares 1 records and tombstones but 0 lines follow it",
        ),
        (
            format!(
                "{}\n{}\n{}\n{}\n",
                header(1, 1),
                line("a"),
                header(2, 1),
                line("b")
            ),
            "line 3: an unknown snapshot version",
        ),
        (
            format!(
                "{}\n{}\n",
                json!({"agentstore": "snapshot", "version": 1}),
                line("a")
            ),
            "line 1: the header's records and tombstones must be counts",
        ),
        (String::new(), "the source is empty"),
        ("\n\n".into(), "the source is empty"),
    ];
    let (store, _) = open("header-checks").await;
    for (text, want) in refused {
        for (kind, source) in sources(&text) {
            let e = store
                .import_snapshot_with(&source, &ImportOptions::default())
                .await
                .expect_err(want);
            assert_eq!(e.code(), ErrorCode::Validation, "{kind}: {e}");
            assert!(e.message().contains(want), "{kind}: {}", e.message());
        }
        assert!(holds_no_record(&store).await, "{want}: nothing written");
    }
    // The first release's key order, and a header followed by its lines.
    let first_release = format!(
        "{}\n{}\n",
        json!({"agentstore": "snapshot", "version": 1, "records": 1, "tombstones": 0}),
        line("a")
    );
    let c = store
        .import_snapshot(first_release.as_str(), None)
        .await
        .unwrap();
    assert_eq!(c.written, 1);
    let (empty, _) = open("header-empty").await;
    let c = empty.import_snapshot(HEADER, None).await.unwrap();
    assert_eq!((c.written, c.kept_newer), (0, 0), "an empty store's export");
}

/// `(result, chunks or progress calls, calls after close())` of `body` run
/// as `(s) => Promise` on an AgentStore over a new store of `n` records.
async fn closed_during(tag: &str, n: usize, body: &str) -> (String, u32, u32) {
    let (store, _) = open(tag).await;
    let records: Vec<serde_json::Value> =
        (0..n).map(|i| json!({"_id": format!("r{i:03}")})).collect();
    store.put_many(&js(json!(records))).await.unwrap();
    let api = JsValue::from(agentstore::AgentStore::from_store(store));
    let run = Function::new_with_args(
        "s",
        &format!(
            "let calls = 0, after = 0, closed = false; \
             const close = () => {{ s.close(); closed = true; }}; \
             const seen = () => {{ calls++; if (closed) after++; }}; \
             return ({body}).then(() => 'resolved', (e) => e.name).then((r) => [r, calls, after]);"
        ),
    );
    let p: Promise = run.call1(&JsValue::NULL, &api).unwrap().unchecked_into();
    let out: Array = JsFuture::from(p).await.unwrap().into();
    (
        out.get(0).as_string().unwrap(),
        out.get(1).as_f64().unwrap() as u32,
        out.get(2).as_f64().unwrap() as u32,
    )
}

/// `close()` while a batch's reads are out (its transaction made, its
/// writes not yet issued): an import or a rebuild writes no batch after it
/// and calls no `onProgress` after it, and rejects with ClosedError, also
/// when that batch is the last. Before, the batch's writes were issued once
/// its reads answered, it committed after `close()` returned, `onProgress`
/// ran, and a rebuild whose last batch it was resolved. Review finding
/// (helper-175).
#[wasm_bindgen_test]
async fn close_while_a_batchs_reads_are_out_writes_no_batch_after_it() {
    // `s.close()` right after the read that follows the `at`-th progress
    // call is issued (IndexedDB's read methods wrapped for the call).
    let run = |tag: &'static str, n: usize, body: String| async move {
        let (store, name) = open(tag).await;
        let records: Vec<serde_json::Value> = (0..n)
            .map(|i| json!({"_id": format!("r{i:03}"), "recordType": "run"}))
            .collect();
        if n > 0 {
            store.put_many(&js(json!(records))).await.unwrap();
        }
        let api = JsValue::from(agentstore::AgentStore::from_store(store));
        let f = Function::new_with_args(
            "s",
            &format!(
                "let calls = 0, after = 0, closed = false, armed = false; \
                 const P = IDBObjectStore.prototype, reals = {{}}; \
                 for (const m of ['get', 'getAll', 'getAllKeys', 'count']) {{ reals[m] = P[m]; \
                   P[m] = function (...a) {{ const r = reals[m].apply(this, a); \
                     if (armed && !closed) {{ closed = true; s.close(); }} return r; }}; }} \
                 const seen = (at) => {{ calls++; if (closed) after++; if (calls === at) armed = true; }}; \
                 return ({body}).then(() => 'resolved', (e) => e.name) \
                   .finally(() => {{ for (const m in reals) P[m] = reals[m]; }}) \
                   .then((r) => [r, calls, after]);"
            ),
        );
        let p: Promise = f.call1(&JsValue::NULL, &api).unwrap().unchecked_into();
        let out: Array = JsFuture::from(p).await.unwrap().into();
        let again = open_named(&name).await;
        (
            out.get(0).as_string().unwrap(),
            out.get(1).as_f64().unwrap() as u32,
            out.get(2).as_f64().unwrap() as u32,
            again,
        )
    };
    // A 50-record import in batches of 5, closed while the 2nd, then the
    // last, batch reads: only the batches before it are stored.
    let text = serde_json::to_string(&snapshot_of_runs(50)).unwrap();
    for (at, tag) in [(1, "close-reads-import-2"), (9, "close-reads-import-last")] {
        let body =
            format!("s.importSnapshot({text}, {{ batchSize: 5, onProgress: () => seen({at}) }})");
        let (r, calls, after, again) = run(tag, 0, body).await;
        assert_eq!((r.as_str(), calls, after), ("ClosedError", at, 0), "{tag}");
        assert_eq!(
            again.count(&[], None).await.unwrap(),
            5 * at,
            "{tag}: no batch after close()"
        );
    }
    // A rebuild of 20 records in batches of 5, closed while its last batch
    // reads: it rejects, and the index is not complete.
    let body = "s.rebuildIndexes({ batchSize: 5, onProgress: () => seen(3) })".to_owned();
    let (r, calls, after, again) = run("close-reads-rebuild", 20, body).await;
    assert_eq!((r.as_str(), calls, after), ("ClosedError", 3, 0));
    drop(again);
}

/// `close()` stops an export or import in progress: no callback runs after
/// it and the call rejects with ClosedError, for every export form and for
/// an import, also when it comes with the last chunk or the last batch's
/// progress. Before, an export read on in its transaction (which IndexedDB
/// lets finish) and handed over every chunk, and an import closed in its
/// last `onProgress` (or whose source was still being read) resolved.
#[wasm_bindgen_test]
async fn close_stops_an_export_or_import_in_progress_with_closed_error() {
    let closed = |n| ("ClosedError".to_owned(), n, 0);
    // 50 records in chunks of 5: the header, then 10 chunks.
    let chunks = |at: u32| {
        format!(
            "s.exportSnapshotChunks(() => {{ seen(); if (calls === {at}) close(); }}, {{ batchSize: 5 }})"
        )
    };
    assert_eq!(
        closed_during("close-chunks-1", 50, &chunks(1)).await,
        closed(1)
    );
    assert_eq!(
        closed_during("close-chunks-4", 50, &chunks(4)).await,
        closed(4)
    );
    assert_eq!(
        closed_during("close-chunks-last", 50, &chunks(11)).await,
        closed(11)
    );
    // No callback: closed as the export issues its third one-record read
    // (IndexedDB's getAll wrapped for the call; no timer races the export).
    for method in ["exportSnapshot", "exportSnapshotBlob"] {
        let body = format!(
            "(() => {{ const real = IDBObjectStore.prototype.getAll; let reads = 0; \
             IDBObjectStore.prototype.getAll = function (...a) {{ if (++reads === 3) close(); return real.apply(this, a); }}; \
             return s.{method}({{ batchSize: 1 }}).finally(() => {{ IDBObjectStore.prototype.getAll = real; }}); }})()"
        );
        assert_eq!(
            closed_during(method, 20, &body).await,
            closed(0),
            "{method}"
        );
    }
    // Imports of a 50-record snapshot in batches of 5, closed in the first,
    // then in the last, progress call.
    let text = serde_json::to_string(&snapshot_of_runs(50)).unwrap();
    for (at, tag) in [(1, "close-import-1"), (10, "close-import-last")] {
        let body = format!(
            "s.importSnapshot({text}, {{ batchSize: 5, onProgress: () => {{ seen(); if (calls === {at}) close(); }} }})"
        );
        assert_eq!(closed_during(tag, 0, &body).await, closed(at), "{tag}");
    }
    // Closed while the source is read (by the stream's own pull), before
    // any batch: no progress call.
    let body = format!(
        "s.importSnapshot(new ReadableStream({{ pull(c) {{ close(); \
         c.enqueue(new TextEncoder().encode({text})); c.close(); }} }}), {{ onProgress: seen }})"
    );
    assert_eq!(
        closed_during("close-import-read", 0, &body).await,
        closed(0)
    );
    // A long stream: not read on after close() (before, all 10,000 chunks
    // were pulled, then the import rejected).
    let body = "s.importSnapshot(new ReadableStream({ pull(c) { seen(); if (calls === 3) close(); \
         if (calls > 10000) { c.close(); return; } \
         c.enqueue(new TextEncoder().encode(calls === 1 \
           ? '{\"agentstore\":\"snapshot\",\"version\":1,\"records\":0,\"tombstones\":0}\\n' : '\\n')); } }))";
    let (result, calls, after) = closed_during("close-import-long", 0, body).await;
    assert_eq!(result, "ClosedError");
    assert!(
        after <= 2,
        "the stream is not read on after close(): {calls} pulls, {after} after it"
    );
}

/// `close()` while the export waits on an async `onChunk` whose Promise
/// never settles ends the export with ClosedError at once (the wait is
/// raced with the closing), and no chunk follows: in the middle of the
/// export, and after its last chunk, where the close comes only once the
/// export took up the thenable (its `then` was called). Before, the
/// thenable was never taken up and that export resolved.
#[wasm_bindgen_test]
async fn close_ends_an_export_waiting_on_an_async_on_chunk_with_closed_error() {
    // 50 records in chunks of 5: the header, then 10 chunks (11 in all).
    let never = [
        (2, "queueMicrotask(close); return new Promise(() => {});"),
        (11, "return { then() { close(); } };"),
    ];
    for (at, wait) in never {
        let body = format!(
            "s.exportSnapshotChunks(() => {{ seen(); if (calls === {at}) {{ {wait} }} \
             return Promise.resolve(); }}, {{ batchSize: 5 }})"
        );
        assert_eq!(
            closed_during("close-async-chunk", 50, &body).await,
            ("ClosedError".to_owned(), at, 0),
            "closed at chunk {at}"
        );
    }
}

/// The shared dump made by real PouchDB: its header says `update_seq` 6582
/// and its last line is `{"seq":6582}`.
const SHARED_DUMP: &str = include_str!("../www/data/agent-records.pouchdump.ndjson");

/// `store` holds nothing at all: no record, no tombstone.
async fn holds_nothing(store: &Store) -> bool {
    store.export_snapshot().await.unwrap().trim_end() == HEADER
}

/// A dump whose source ends before its last seq reaches the header's
/// `db_info.update_seq` (a download or copy that stopped, even at a line
/// boundary) is refused with a ValidationError naming both seqs, from every
/// kind of source, and nothing is written; CouchDB's string seqs count by
/// their leading integer. Before, the part that arrived was imported as if
/// it were the whole database.
#[wasm_bindgen_test]
async fn a_dump_cut_off_before_its_update_seq_is_refused_and_nothing_is_written() {
    let lines: Vec<&str> = SHARED_DUMP.lines().collect();
    let last = lines.iter().rposition(|l| *l == "{\"seq\":6582}").unwrap();
    let cases = [
        // Cut just before the last seq line: the seq line before it is 6579.
        (lines[..last].join("\n") + "\n", "but its last seq is 6579"),
        // Cut after the first docs line, before any seq line.
        (lines[..2].join("\n"), "but it has no seq line"),
    ];
    for (text, said) in cases {
        for (kind, src) in sources(&text) {
            let (store, _) = open("pouch-cut").await;
            let opts = ImportOptions {
                batch: 1,
                ..ImportOptions::default()
            };
            let e = store
                .import_pouch_dump_with(&src, "agent-index", &opts)
                .await
                .expect_err("a cut-off dump is refused");
            assert_eq!(e.code(), ErrorCode::Validation, "{kind}: {e}");
            let message = e.to_string();
            assert!(
                message.contains("db_info.update_seq is 6582") && message.contains(said),
                "{kind}: {message}"
            );
            assert!(holds_nothing(&store).await, "{kind}: nothing written");
        }
    }
    // CouchDB: `update_seq` and `seq` are strings whose leading integer counts.
    let couch = |last: u32| {
        format!(
            "{{\"version\":\"1.2.9\",\"db_info\":{{\"update_seq\":\"3-g1AAAAQ\"}}}}\n{}\n{}\n",
            json!({"docs": [pouch_doc("a", "1-aa", false, &[])]}),
            json!({ "seq": format!("{last}-g1AAAAR") })
        )
    };
    let (store, _) = open("pouch-cut-couch").await;
    let e = store
        .import_pouch_dump(couch(2).as_str(), "agent-index", None)
        .await
        .expect_err("a cut-off CouchDB dump is refused");
    assert!(
        e.to_string()
            .contains("update_seq is 3 but its last seq is 2"),
        "{e}"
    );
    assert!(holds_nothing(&store).await, "nothing written");
    let (sum, c, _) = store
        .import_pouch_dump(couch(3).as_str(), "agent-index", None)
        .await
        .unwrap();
    assert_eq!((sum.last_seq, c.written), (Some(3), 1));
    // The whole shared dump still imports (its last seq is its update_seq).
    let (sum, c, _) = store
        .import_pouch_dump(SHARED_DUMP, "agent-index", None)
        .await
        .unwrap();
    assert_eq!(sum.last_seq, Some(6582));
    assert!(c.written > 0);
}

/// An empty source (no line, or blank lines only: not even the header every
/// dump starts with) is refused with a ValidationError and nothing is
/// written, from every kind of source. A header without `update_seq`
/// (nothing to check against), or with `update_seq` 0 (a database never
/// written), and no documents still imports, writing nothing. Before, an
/// empty source imported as an empty dump.
#[wasm_bindgen_test]
async fn an_empty_pouch_dump_is_refused_and_nothing_is_written() {
    let (store, _) = open("pouch-empty").await;
    for text in ["", "\n", " \r\n\n"] {
        for (kind, src) in sources(text) {
            let e = store
                .import_pouch_dump_with(&src, "agent-index", &ImportOptions::default())
                .await
                .expect_err("an empty source is refused");
            assert_eq!(e.code(), ErrorCode::Validation, "{kind} {text:?}: {e}");
            assert!(e.to_string().contains("empty"), "{kind} {text:?}: {e}");
        }
    }
    assert!(holds_nothing(&store).await, "nothing written");
    for header in [
        "{\"version\":\"1.2.9\",\"db_type\":\"idb\"}",
        "{\"version\":\"1.2.9\",\"db_info\":{\"update_seq\":0}}",
        "{\"version\":\"1.2.9\",\"db_info\":{\"update_seq\":null}}",
    ] {
        let (sum, c, _) = store
            .import_pouch_dump(header, "agent-index", None)
            .await
            .unwrap();
        assert_eq!((sum.documents_read, c.written), (0, 0), "{header}");
    }
    // An update_seq that names no seq is a bad header, not "unknown".
    let e = store
        .import_pouch_dump(
            "{\"db_info\":{\"update_seq\":\"later\"}}\n",
            "agent-index",
            None,
        )
        .await
        .unwrap_err();
    assert!(e.to_string().contains("line 1:"), "{e}");
    assert!(holds_nothing(&store).await, "nothing written");
}

/// `[label, source]` pairs made by an iframe (another realm: its own
/// `Uint8Array`, `Blob`, `ReadableStream`, … whose `instanceof` this
/// realm's classes refuse) from `text`, the iframe itself, and chunks a
/// stream must refuse; `js` (a function of `(w, text)`, `w` the iframe's
/// window) makes the sources.
fn from_iframe(text: &str, js: &str) -> (JsValue, Vec<(String, JsValue)>) {
    let f = Function::new_with_args(
        "text",
        &format!(
            "const frame = document.createElement('iframe'); document.body.appendChild(frame); \
             const w = frame.contentWindow; return [frame, ({js})(w, text)];"
        ),
    );
    let out: Array = f.call1(&JsValue::NULL, &text.into()).unwrap().into();
    let pairs: Array = out.get(1).into();
    let pairs = pairs
        .iter()
        .map(|p| {
            let p: Array = p.into();
            (p.get(0).as_string().unwrap(), p.get(1))
        })
        .collect();
    (out.get(0), pairs)
}

/// A stream of the iframe's `Uint8Array` chunks of `text` (two of them),
/// made with `RS` (`ReadableStream` of this realm or the iframe's).
const IFRAME_STREAM: &str = "const chunks = () => { const h = text.length >> 1; \
     return [new w.TextEncoder().encode(text.slice(0, h)), new w.TextEncoder().encode(text.slice(h))]; }; \
     const streamOf = (RS) => new RS({ start(c) { for (const u of chunks()) c.enqueue(u); c.close(); } });";

/// Sources from another realm (an iframe's Blob, File, Response and
/// ReadableStream, and this realm's stream of the iframe's Uint8Arrays)
/// import as this realm's do, with an iframe's AbortSignal as `signal`;
/// what is not a Uint8Array (a string, an array, another typed array, a
/// DataView, an object that only claims the tag, a Proxy) is still refused
/// chunk by chunk, and an object that only claims Blob is no source.
/// Before, `instanceof` refused every one of the iframe's objects: a stream
/// of its Uint8Arrays with "must give Uint8Array chunks", its Blob,
/// Response and stream as no source at all, its signal as no AbortSignal.
#[wasm_bindgen_test]
async fn sources_chunks_and_signals_from_another_realm_import_as_this_realms_do() {
    let text = snapshot_of_runs(5);
    let mut frames = Vec::new();
    let (frame, sources) = from_iframe(
        &text,
        &format!(
            "(w, text) => {{ {IFRAME_STREAM} return [\
               ['this realm\\'s stream of its Uint8Arrays', streamOf(ReadableStream)], \
               ['its stream', streamOf(w.ReadableStream)], \
               ['its Blob', new w.Blob([text])], \
               ['its File', new w.File([text], 'snapshot.ndjson')], \
               ['its Response', new w.Response(text)], \
               ['its Response of its stream', new w.Response(streamOf(w.ReadableStream))], \
             ]; }}"
        ),
    );
    frames.push(frame);
    for (label, src) in sources {
        let (store, _) = open("realm").await;
        let c = store
            .import_snapshot_with(&src, &ImportOptions::default())
            .await
            .unwrap_or_else(|e| panic!("{label}: {e}"));
        assert_eq!(c.written, 5, "{label}");
    }
    // A PouchDB dump from the iframe's stream too.
    let docs: Vec<_> = (0..3)
        .map(|i| pouch_doc(&format!("d{i}"), "1-aa", false, &[]))
        .collect();
    let text = dump(&[json!({ "docs": docs }), json!({"seq": 3})]);
    let (frame, sources) = from_iframe(
        &text,
        &format!("(w, text) => {{ {IFRAME_STREAM} return [['its stream', streamOf(w.ReadableStream)]]; }}"),
    );
    frames.push(frame);
    let (store, _) = open("realm-pouch").await;
    let (sum, c, _) = store
        .import_pouch_dump_with(&sources[0].1, "agent-index", &ImportOptions::default())
        .await
        .unwrap();
    assert_eq!((sum.live, c.written), (3, 3));

    // Chunks that are not a Uint8Array of any realm are refused.
    let (frame, bad) = from_iframe(
        HEADER,
        "(w) => [\
           ['a string', 'x'], ['an array', [1, 2]], ['its Uint16Array', new w.Uint16Array(2)], \
           ['its DataView', new w.DataView(new w.ArrayBuffer(2))], \
           ['an object claiming the tag', { [Symbol.toStringTag]: 'Uint8Array', length: 1, 0: 65 }], \
           ['a Proxy of a Uint8Array', new Proxy(new Uint8Array([65]), {})], \
         ].map(([l, chunk]) => [l, new ReadableStream({ start(c) { c.enqueue(chunk); c.close(); } })])",
    );
    frames.push(frame);
    let (store, _) = open("realm-bad").await;
    for (label, src) in bad {
        let e = store
            .import_snapshot_with(&src, &ImportOptions::default())
            .await
            .expect_err(&label);
        assert!(
            e.to_string().contains("must give Uint8Array chunks"),
            "{label}: {e}"
        );
    }
    // Objects that only claim to be a Blob are no source.
    let (frame, fakes) = from_iframe(
        "",
        "(w) => [['a tag', { [Symbol.toStringTag]: 'Blob', size: 0 }], \
                 ['its Blob prototype', w.Object.create(w.Blob.prototype)], \
                 ['a Proxy of a Blob', new Proxy(new Blob([]), {})]]",
    );
    frames.push(frame);
    for (label, src) in fakes {
        let e = store
            .import_snapshot_with(&src, &ImportOptions::default())
            .await
            .expect_err(&label);
        assert_eq!(e.code(), ErrorCode::Validation, "{label}: {e}");
        assert!(e.to_string().contains("an import takes"), "{label}: {e}");
    }

    // The iframe's AbortSignal is a signal: one not aborted lets the import
    // run, an aborted one stops it.
    let api = agentstore::AgentStore::from_store(store);
    let (frame, signals) = from_iframe(
        "",
        "(w) => { const live = new w.AbortController(), dead = new w.AbortController(); dead.abort(); \
                  return [['live', { signal: live.signal }], ['aborted', { signal: dead.signal }]]; }",
    );
    frames.push(frame);
    let text = snapshot_of_runs(2);
    let done = JsFuture::from(api.import_snapshot(s(&text), signals[0].1.clone()))
        .await
        .expect("a live signal of another realm");
    assert_eq!(field(&done, "written").as_f64(), Some(2.0));
    assert_eq!(
        rejection(api.import_snapshot(s(&text), signals[1].1.clone())).await,
        ("AbortError".into(), "aborted".into())
    );
    let remove = Function::new_with_args("f", "f.remove()");
    for f in frames {
        remove.call1(&JsValue::NULL, &f).unwrap();
    }
}

/// Starts an import (`pouch`: `importPouchDump`, else `importSnapshot`,
/// with a live `signal` when `signal`) through the JS API of `store` from a
/// source that gives its first line `head` and then stalls (never enqueues
/// again, never closes): a ReadableStream or a Response of one (`shape`).
/// Returns the state the JS keeps:
/// `pulls` and `cancelled` of the stream, the import's `result` (its
/// error's `name`, or "resolved") and `message` once it settles, and
/// `close()` (the store's).
fn stalled_import(store: Store, head: &str, shape: &str, pouch: bool, signal: bool) -> JsValue {
    let api = JsValue::from(agentstore::AgentStore::from_store(store));
    let start = Function::new_with_args(
        "api, head, shape, pouch, signal",
        "const state = { pulls: 0, cancelled: 0, result: null, message: null, close: () => api.close() }; \
         const s = new ReadableStream({ start(c) { c.enqueue(new TextEncoder().encode(head + '\\n')); }, \
           pull() { state.pulls++; }, cancel() { state.cancelled++; } }); \
         let source = s; \
         if (shape === 'Response') source = new Response(s); \
         const options = signal ? { signal: (state.ctl = new AbortController()).signal } : undefined; \
         const p = pouch ? api.importPouchDump(source, options) : api.importSnapshot(source, options); \
         p.then(() => { state.result = 'resolved'; }, (e) => { state.result = e.name; state.message = e.message; }); \
         return state;",
    );
    let args = Array::of5(
        &api,
        &head.into(),
        &shape.into(),
        &pouch.into(),
        &signal.into(),
    );
    start.apply(&JsValue::NULL, &args).unwrap()
}

/// `close()` ends an import whose source stalls (a stream that never
/// enqueues again and never closes) at once, with ClosedError, and cancels
/// the source so that it stops: for a ReadableStream and a Response being
/// collected; with and without a signal; for both imports. (A Blob is read
/// through one the SDK made over it, which never stalls.) Another tab's
/// upgrade (`versionchange`) ends it the same way. Before, `close()` was
/// looked at only before each read, so the import waited on the stalled
/// read for ever (here: until `wait_for` gave up) and the stream stayed open.
#[wasm_bindgen_test]
async fn close_ends_an_import_whose_source_stalls_with_closed_error_and_cancels_it() {
    let num = |state: &JsValue, k: &str| field(state, k).as_f64().unwrap_or(0.0);
    for pouch in [false, true] {
        let head = if pouch {
            "{\"version\":\"1.2.9\",\"db_type\":\"idb\"}"
        } else {
            HEADER
        };
        for shape in ["ReadableStream", "Response"] {
            for signal in [false, true] {
                let case = format!("pouch {pouch}, {shape}, signal {signal}");
                let (store, _) = open("close-stalled").await;
                let state = stalled_import(store, head, shape, pouch, signal);
                // The first line is read; the next read waits on the stream.
                wait_for(&format!("{case}: the stream to be pulled"), || {
                    num(&state, "pulls") >= 1.0
                })
                .await;
                assert!(field(&state, "result").is_null(), "{case}: still waiting");
                let close: Function = field(&state, "close").into();
                close.call0(&JsValue::NULL).unwrap();
                wait_for(&format!("{case}: the import to end after close()"), || {
                    !field(&state, "result").is_null()
                })
                .await;
                assert_eq!(
                    field_str(&state, "result").as_deref(),
                    Some("ClosedError"),
                    "{case}"
                );
                wait_for(&format!("{case}: the stream to be cancelled"), || {
                    num(&state, "cancelled") >= 1.0
                })
                .await;
            }
        }
    }
    // Another tab upgrades the database: this connection closes itself.
    let (store, name) = open("close-stalled-upgrade").await;
    let state = stalled_import(store, HEADER, "ReadableStream", false, false);
    wait_for("the stream to be pulled", || num(&state, "pulls") >= 1.0).await;
    let newer = Store::open_versioned(&name, 2, 5000, None, vec![])
        .await
        .unwrap();
    wait_for("the import to end after versionchange", || {
        !field(&state, "result").is_null()
    })
    .await;
    assert_eq!(field_str(&state, "result").as_deref(), Some("ClosedError"));
    let message = field_str(&state, "message").unwrap_or_default();
    assert!(message.contains("another tab"), "{message}");
    wait_for("the stream to be cancelled", || {
        num(&state, "cancelled") >= 1.0
    })
    .await;
    newer.close();
}

/// A snapshot's tombstone line is kept as given or refused: a `deletedAt`
/// that is not a finite number, or a field a tombstone does not store, is
/// a ValidationError naming the line, and nothing is written. Before,
/// `"deletedAt": "yesterday"` was replaced by the import's own clock and
/// other fields were dropped. A tombstone line with a number `deletedAt`
/// (any: every stored one is one, also one taken from a PouchDB dump), or
/// with none (releases before it), still imports, and keeps its time; a
/// store's export, such a time included, imports again.
#[wasm_bindgen_test]
async fn a_snapshot_tombstone_line_with_a_bad_deleted_at_or_a_body_is_refused_and_nothing_is_written(
) {
    let live = rec("a", "1-aa", "2026-01-01T00:00:00.000Z");
    let bad = [
        json!({"_id": "x", "_rev": "2-bb", "_deleted": true, "deletedAt": "yesterday"}).to_string(),
        json!({"_id": "x", "_rev": "2-bb", "_deleted": true, "deletedAt": null}).to_string(),
        json!({"_id": "x", "_rev": "2-bb", "_deleted": true, "extra": 1}).to_string(),
        // JSON.parse reads it as Infinity.
        r#"{"_id":"x","_rev":"2-bb","_deleted":true,"deletedAt":1e400}"#.to_owned(),
    ];
    for line in bad {
        let (store, _) = open("bad-tomb").await;
        let text = snapshot(&[live.clone(), line.clone()]);
        let e = store
            .import_snapshot(text.as_str(), None)
            .await
            .unwrap_err();
        assert_refused_at_line(&store, &e, 3).await;
        assert!(e.to_string().contains("tombstone"), "{line}: {e}");
    }
    // Kept as given: an old deletion, purged by any bound past it; one
    // without a time (releases before it) is counted from the import.
    let (store, _) = open("good-tomb").await;
    let old = json!({"_id": "x", "_rev": "2-bb", "_deleted": true, "deletedAt": 1000}).to_string();
    let text = snapshot(&[live, old, tomb("y", "3-cc")]);
    store.import_snapshot(text.as_str(), None).await.unwrap();
    let out = store.export_snapshot().await.unwrap();
    assert!(out.contains("\"deletedAt\":1000"), "{out}");
    assert_eq!(
        store.purge_tombstones(60_000.0, None, None).await.unwrap(),
        1
    );
    let out = store.export_snapshot().await.unwrap();
    assert!(!out.contains("\"x\"") && out.contains("\"y\""), "{out}");
    // A PouchDB dump's deleted document whose body has a `deletedAt` (here
    // a fraction) stores it; the store's export imports again, keeping it.
    let (pouch, _) = open("pouch-tomb").await;
    let mut doc = pouch_doc("z", "2-dd", true, &["cc"]);
    doc["deletedAt"] = json!(1.5);
    pouch
        .import_pouch_dump_with(
            &dump(&[json!({ "docs": [doc] })]).as_str().into(),
            "agent-index",
            &ImportOptions::default(),
        )
        .await
        .unwrap();
    let out = pouch.export_snapshot().await.unwrap();
    assert!(out.contains("\"deletedAt\":1.5"), "{out}");
    let (again, _) = open("pouch-tomb-again").await;
    again.import_snapshot(out.as_str(), None).await.unwrap();
    assert_eq!(again.export_snapshot().await.unwrap(), out);
}

/// An export whose every chunk was handed over when its signal aborts
/// resolves with them: an abort while the last `onProgress` Promise is
/// pending (batches of 2: the last call follows the last chunk), or one made
/// at once in the last call when the rows fill whole batches (batches of 1:
/// no read is left after it). AbortError would report a complete export as
/// cut short. Before, both rejected with AbortError (the kind of
/// helper-202's finding, in the exports).
#[wasm_bindgen_test]
async fn an_export_aborted_after_its_last_chunk_resolves_with_every_chunk() {
    let (store, text) = export_fixture("export-abort-last").await;
    let api: JsValue = agentstore::AgentStore::from_store(store).into();
    for (batch, body) in [
        (
            2,
            "return (d, t) => { if (d !== t) return; \
               setTimeout(() => c.abort('late'), 0); return new Promise(() => {}); };",
        ),
        (1, "return (d, t) => { if (d === t) c.abort('late'); };"),
    ] {
        let ctl = web_sys::AbortController::new().unwrap();
        let opts = export_opts(json!({"batchSize": batch}), Some(&ctl.signal()));
        js_sys::Reflect::set(&opts, &"onProgress".into(), &js_fn("c", body, &ctl)).unwrap();
        let got = invoke(&api, "exportSnapshot", &[opts])
            .await
            .unwrap_or_else(|e| panic!("batch {batch}: {e:?}"));
        assert!(ctl.signal().aborted(), "batch {batch}: the abort was made");
        assert_eq!(
            got.as_string().as_deref(),
            Some(text.as_str()),
            "batch {batch}"
        );
    }
}

/// Aborts `ctl` when the next read-only transaction opened from now on
/// completes (every read of the operation done, the operation waiting
/// only for its callbacks); returns the function that undoes the hook.
fn abort_when_reads_end(ctl: &web_sys::AbortController) -> Function {
    js_fn(
        "c",
        "const proto = IDBDatabase.prototype, open = proto.transaction; \
         proto.transaction = function (names, mode) { const t = open.apply(this, arguments); \
           if (mode !== 'readwrite') t.addEventListener('complete', () => c.abort('late')); return t; }; \
         return () => { proto.transaction = open; };",
        ctl,
    )
    .unchecked_into()
}

/// An export or verification whose reads are all done when its signal
/// aborts resolves, also while an EARLIER `onProgress` Promise is pending
/// (the calls fall behind the reads; the last one not made yet): the abort
/// only stops the calls left. Before, both rejected with AbortError
/// (helper-204's finding).
#[wasm_bindgen_test]
async fn an_export_or_verification_aborted_after_its_reads_resolves() {
    let (store, text) = export_fixture("export-abort-lag").await;
    // The progress call for `at` done returns a Promise that never settles.
    let pending_at = |at: u32| -> Function {
        js_fn(
            "at",
            "return (d) => { if (d === at) return new Promise(() => {}); };",
            &at.into(),
        )
        .unchecked_into()
    };
    let ctl = web_sys::AbortController::new().unwrap();
    let opts = export_opts(json!({"batchSize": 2}), Some(&ctl.signal()));
    js_sys::Reflect::set(&opts, &"onProgress".into(), &pending_at(2)).unwrap();
    let undo = abort_when_reads_end(&ctl);
    let api: JsValue = agentstore::AgentStore::from_store(store).into();
    let got = invoke(&api, "exportSnapshot", &[opts]).await;
    undo.call0(&JsValue::NULL).unwrap();
    assert!(ctl.signal().aborted(), "export: the abort was made");
    assert_eq!(
        got.expect("export: complete, resolves")
            .as_string()
            .as_deref(),
        Some(text.as_str())
    );

    let (store, _) = open("verify-abort-lag").await;
    let recs: Vec<serde_json::Value> = (0..1001u32)
        .map(|i| json!({"_id": format!("v{i:04}"), "recordType": "run"}))
        .collect();
    store
        .put_many(&js(serde_json::Value::Array(recs)))
        .await
        .unwrap();
    let ctl = web_sys::AbortController::new().unwrap();
    let undo = abort_when_reads_end(&ctl);
    let got = store
        .verify_indexes_with(Some(&pending_at(1000)), Some(&ctl.signal()))
        .await;
    undo.call0(&JsValue::NULL).unwrap();
    assert!(ctl.signal().aborted(), "verify: the abort was made");
    assert_eq!(got.expect("verify: complete, resolves").checked, 1001);
}

/// An import whose every record is written when its signal aborts resolves
/// with what it wrote: an abort in its last `onProgress`, made while the
/// Promise it returned is pending, or made there at once while the rest of
/// the source is still to be read (a lower revision of `a` follows every
/// winner). AbortError would report written records as not imported.
/// Before, the pending case rejected with AbortError from every source, and
/// the other from the sources read in chunks (helper-202's finding).
#[wasm_bindgen_test]
async fn an_import_aborted_after_its_last_write_resolves_with_what_it_wrote() {
    const T: &str = "2026-01-01T00:00:00.000Z";
    let snap = snapshot(&[
        rec("a", "2-bb", T),
        rec("b", "1-aa", T),
        rec("a", "1-aa", T),
    ]);
    let pouch = dump(&[
        json!({"docs": [pouch_doc("a", "2-bb", false, &["aa"]), pouch_doc("b", "1-aa", false, &[])]}),
        json!({"docs": [pouch_doc("a", "1-aa", false, &[])]}),
    ]);
    let on_progress = Function::new_with_args(
        "c, pending",
        "return (d, t) => { if (d !== t) return; \
           if (!pending) { c.abort('late'); return; } \
           setTimeout(() => c.abort('late'), 0); return new Promise(() => {}); }",
    );
    for (kind, text) in [("snapshot", &snap), ("pouch", &pouch)] {
        for pending in [true, false] {
            for (label, source) in sources(text) {
                let what = format!("{kind}, {label}, pending {pending}");
                let (store, _) = open("abort-last").await;
                let ctl = web_sys::AbortController::new().unwrap();
                let cb = on_progress
                    .call2(&JsValue::NULL, &ctl, &pending.into())
                    .unwrap();
                let opts = ImportOptions {
                    on_progress: Some(cb.unchecked_into()),
                    signal: Some(ctl.signal()),
                    batch: 1,
                };
                let c = match kind {
                    "snapshot" => store.import_snapshot_with(&source, &opts).await,
                    _ => store
                        .import_pouch_dump_with(&source, "agent-index", &opts)
                        .await
                        .map(|(_, c, _)| c),
                }
                .unwrap_or_else(|e| panic!("{what}: {e}"));
                assert!(ctl.signal().aborted(), "{what}: the abort was made");
                assert_eq!((c.written, c.kept_newer), (2, 0), "{what}");
                let a = store.get(&s("a")).await.unwrap().unwrap();
                assert_eq!(field_str(&a, "_rev").as_deref(), Some("2-bb"), "{what}");
                assert!(store.get(&s("b")).await.unwrap().is_some(), "{what}");
            }
        }
    }
}

/// PouchDB's legacy index document listing its own id beside one of three
/// live records lost the other two: `lost` counts them both (its own entry
/// is neither a found record nor stale). Before, `lost` was 1
/// (helper-202's finding).
#[wasm_bindgen_test]
async fn a_legacy_index_listing_itself_reports_every_record_it_lost() {
    let mut index = pouch_doc("agent-index", "1-aa", false, &[]);
    index["records"] = json!({"agent-index": {}, "r1": {}});
    let text = dump(&[json!({"docs": [
        index,
        pouch_doc("r1", "1-aa", false, &[]),
        pouch_doc("r2", "1-aa", false, &[]),
        pouch_doc("r3", "1-aa", false, &[]),
    ]})]);
    let (store, _) = open("legacy-self").await;
    let (_, _, legacy) = store
        .import_pouch_dump_with(
            &text.as_str().into(),
            "agent-index",
            &ImportOptions::default(),
        )
        .await
        .unwrap();
    let legacy = legacy.expect("the legacy document was read");
    assert_eq!((legacy.listed, legacy.lost, legacy.stale), (2, 2, 0));
}

/// A dump row whose `_id` or `_rev` is refused says why (as `importSnapshot`
/// and `put` do), not that it has none: an `_id` too long or empty, a
/// `_rev` longer than any revision. Before, each said "a doc has no string
/// _id" / "_rev" (helper-202's finding).
#[wasm_bindgen_test]
async fn a_refused_dump_row_names_why_its_id_or_rev_was_refused() {
    let long_id = "x".repeat(1025);
    let long_rev = format!("1-{}", "a".repeat(95));
    let cases = [
        (json!({"_id": long_id, "_rev": "1-aa"}), "longer than 1024"),
        (json!({"_id": "", "_rev": "1-aa"}), "non-empty"),
        (json!({"_id": "q", "_rev": long_rev}), "at most 96"),
    ];
    for (doc, why) in cases {
        let text = dump(&[json!({"docs": [doc]})]);
        for (kind, e) in [
            (
                "pouch",
                open("bad-row")
                    .await
                    .0
                    .import_pouch_dump_with(
                        &text.as_str().into(),
                        "agent-index",
                        &ImportOptions::default(),
                    )
                    .await
                    .map(|_| ())
                    .unwrap_err(),
            ),
            (
                "snapshot",
                open("bad-row")
                    .await
                    .0
                    .import_snapshot(snapshot(&[doc.to_string()]).as_str(), None)
                    .await
                    .map(|_| ())
                    .unwrap_err(),
            ),
        ] {
            assert_eq!(e.code(), ErrorCode::Validation, "{kind}: {e}");
            assert!(e.to_string().contains(why), "{kind}: {e}");
            assert!(e.to_string().contains("line 2:"), "{kind}: {e}");
        }
    }
}
