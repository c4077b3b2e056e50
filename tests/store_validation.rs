//! Bad input gets a ValidationError and writes nothing — never a panic.
// Tests may read and call the page's values with js-sys directly: a slot
// kept by a throw lasts only for the test page (clippy.toml).
#![allow(clippy::disallowed_methods)]

use agentstore::store::{ListQuery, LIST_KEYS};
use agentstore_protocol::ErrorCode;
use serde_json::json;
use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_test::*;

mod common;
use common::*;
#[path = "common/values.rs"]
mod values;
use values::*;

wasm_bindgen_test_configure!(run_in_browser);

fn obj_with(id: &str, key: &str, value: &JsValue) -> JsValue {
    let o = js_sys::Object::new();
    js_sys::Reflect::set(&o, &"_id".into(), &id.into()).unwrap();
    js_sys::Reflect::set(&o, &key.into(), value).unwrap();
    o.into()
}

fn eval(src: &str) -> JsValue {
    js_sys::Function::new_no_args(&format!("return ({src});"))
        .call0(&JsValue::NULL)
        .unwrap()
}

#[wasm_bindgen_test]
async fn malformed_records_are_validation_errors_and_write_nothing() {
    let (store, _) = open("bad").await;
    let cyclic = eval("(() => { const o = {_id: 'cyc', a: {}}; o.a.self = o; return o; })()");
    let deep = eval("(() => { let o = {}; const root = {_id: 'deep', o}; for (let i = 0; i < 100; i++) { o.n = {}; o = o.n; } return root; })()");
    let cases: Vec<(&str, JsValue)> = vec![
        ("no _id", js(json!({"v": 1}))),
        ("numeric _id", js(json!({"_id": 5}))),
        ("empty _id", js(json!({"_id": ""}))),
        ("oversized _id", js(json!({"_id": "x".repeat(1025)}))),
        ("non-object record", JsValue::from_str("just a string")),
        ("array record", js(json!([{"_id": "arr"}]))),
        ("null record", JsValue::NULL),
        (
            "BigInt field",
            obj_with("bi", "v", &js_sys::BigInt::from(5u32).into()),
        ),
        (
            "NaN field",
            obj_with("nan", "v", &JsValue::from_f64(f64::NAN)),
        ),
        (
            "Infinity field",
            obj_with("inf", "v", &JsValue::from_f64(f64::INFINITY)),
        ),
        (
            "function field",
            obj_with("fn", "v", &js_sys::Function::new_no_args("return 1").into()),
        ),
        ("symbol field", obj_with("sym", "v", &eval("Symbol('s')"))),
        (
            "undefined in array",
            obj_with("ua", "v", &eval("[1, undefined, 3]")),
        ),
        ("cyclic", cyclic),
        ("too deep", deep),
        ("Date field", obj_with("date", "v", &eval("new Date(0)"))),
        (
            "Map field",
            obj_with("map", "v", &eval("new Map([['k', 'v']])")),
        ),
        ("_rev wrong shape", js(json!({"_id": "r", "_rev": "abc"}))),
        ("_rev not a string", js(json!({"_id": "r2", "_rev": 1}))),
        (
            "unknown _ field",
            js(json!({"_id": "u", "_attachments": {}})),
        ),
        (
            "_deleted via put",
            js(json!({"_id": "d", "_deleted": true})),
        ),
        (
            "recordType not a string",
            js(json!({"_id": "t", "recordType": 7})),
        ),
        (
            "updatedAt not ISO",
            js(json!({"_id": "w", "updatedAt": "yesterday"})),
        ),
    ];
    assert!(cases.len() >= 15);
    for (what, rec) in &cases {
        let e = store.put(rec).await.expect_err(what);
        assert_eq!(e.code(), ErrorCode::Validation, "{what}: {e}");
        let js_err = e.to_js();
        assert_eq!(
            field_str(&js_err, "name").as_deref(),
            Some("ValidationError"),
            "{what}"
        );
        assert!(!e.to_string().is_empty());
    }
    // The same records in one batch: every position reported, nothing written.
    let arr: js_sys::Array = cases.iter().map(|(_, r)| r.clone()).collect();
    arr.push(&js(json!({"_id": "fine"})));
    let e = store.put_many(&arr.into()).await.unwrap_err();
    match e {
        agentstore::StoreError::Validation { failures, .. } => {
            assert_eq!(failures.len(), cases.len())
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        store.export_snapshot().await.unwrap().lines().count(),
        1,
        "only the header: nothing written"
    );
}

#[wasm_bindgen_test]
async fn malformed_arguments_are_validation_errors() {
    let (store, _) = open("badargs").await;
    for bad in [
        JsValue::from(1),
        JsValue::NULL,
        JsValue::UNDEFINED,
        JsValue::from_str(""),
    ] {
        assert_eq!(
            store.get(&bad).await.unwrap_err().code(),
            ErrorCode::Validation
        );
    }
    let rev = store.put(&js(json!({"_id": "a"}))).await.unwrap().rev;
    assert_eq!(
        store
            .delete(&s("a"), &JsValue::from(3))
            .await
            .unwrap_err()
            .code(),
        ErrorCode::Validation
    );
    assert_eq!(
        store
            .delete(&s("a"), &s("not-a-rev"))
            .await
            .unwrap_err()
            .code(),
        ErrorCode::Validation
    );
    assert!(
        store.get(&s("a")).await.unwrap().is_some(),
        "{rev} still there"
    );
    for opts in [
        json!({"limit": -1}),
        json!({"limit": 1.5}),
        json!({"limit": "7"}),
        json!({"prefix": 5}),
        json!({"type": 1}),
        json!({"after": 5}),
        json!({"after": "c1.zz"}),
    ] {
        assert!(
            ListQuery::from_js(&js(opts.clone()), LIST_KEYS).is_err(),
            "{opts}"
        );
    }
    assert_eq!(
        store
            .put_many(&js(json!({"_id": "not-an-array"})))
            .await
            .unwrap_err()
            .code(),
        ErrorCode::Validation
    );
    let dup = js(json!([{"_id": "dup"}, {"_id": "dup"}]));
    assert_eq!(
        store.put_many(&dup).await.unwrap_err().code(),
        ErrorCode::Validation
    );
    assert!(store.get(&s("dup")).await.unwrap().is_none());
    let not_fn = js_sys::Function::new_with_args("cur", "return 42;");
    assert_eq!(
        store
            .mutate(&s("a"), &not_fn, 0, None)
            .await
            .unwrap_err()
            .code(),
        ErrorCode::Validation
    );
    assert_eq!(
        store
            .import_snapshot("{\"nope\":1}\n", None)
            .await
            .unwrap_err()
            .code(),
        ErrorCode::Validation
    );
    assert_eq!(
        store
            .import_pouch_dump("{}\n[1,2]\n", "agent-index", None)
            .await
            .unwrap_err()
            .code(),
        ErrorCode::Validation
    );
}

#[wasm_bindgen_test]
async fn a_closed_store_rejects_with_closed_error() {
    let (store, _) = open("closed").await;
    store.close();
    assert_eq!(
        store.get(&s("a")).await.unwrap_err().code(),
        ErrorCode::Closed
    );
    assert_eq!(
        store
            .put(&js(json!({"_id": "a"})))
            .await
            .unwrap_err()
            .code(),
        ErrorCode::Closed
    );
}

/// What a getter or a Proxy trap returns is read once: the `_id`, the
/// revision check, the digest and the stored copy all come from that one
/// read. (Before, the copy was a second read: a getter answering "fresh"
/// then "victim" overwrote `victim` without its revision, and a value
/// checked as a number was stored as a BigInt.)
#[wasm_bindgen_test]
async fn a_getter_is_read_once_so_what_is_stored_is_what_was_checked() {
    let (store, _) = open("read-once").await;
    let victim = store
        .put(&js(json!({"_id": "victim", "recordType": "task", "n": 1})))
        .await
        .unwrap();
    let two_faced = eval(
        "(() => { let n = 0, m = 0; return { get _id() { return n++ ? 'victim' : 'fresh'; }, \
         recordType: 'agent', get v() { return m++ ? 10n : 1; } }; })()",
    );
    let w = store.put(&two_faced).await.unwrap();
    assert_eq!(w.id, "fresh");
    let fresh = store.get(&s("fresh")).await.unwrap().expect("fresh stored");
    assert_eq!(field_str(&fresh, "_id").as_deref(), Some("fresh"));
    assert_eq!(field(&fresh, "v").as_f64(), Some(1.0), "the value checked");
    let kept = store.get(&s("victim")).await.unwrap().unwrap();
    assert_eq!(field_str(&kept, "_rev"), Some(victim.rev));
    assert_eq!(field(&kept, "n").as_f64(), Some(1.0));
    // The same through putMany and through mutate's returned object.
    let twice = eval(
        "(() => { let n = 0; return [{ get _id() { return n++ ? 'victim' : 'fresh2'; } }]; })()",
    );
    store.put_many(&twice).await.unwrap();
    assert!(store.get(&s("fresh2")).await.unwrap().is_some());
    let f = js_sys::Function::new_with_args(
        "cur",
        "let m = 0; return { get n() { return m++ ? 10n : 2; } };",
    );
    store.mutate(&s("victim"), &f, 0, None).await.unwrap();
    let after = store.get(&s("victim")).await.unwrap().unwrap();
    assert_eq!(field(&after, "n").as_f64(), Some(2.0));
    assert_indexes_clean(&store).await;
}

/// A revoked Proxy, a throwing Proxy trap or a throwing array-element getter,
/// anywhere a call reads caller input, is a ValidationError and the store
/// goes on working. (Before, the exception unwound through the module: the
/// Promise never settled.)
#[wasm_bindgen_test]
async fn a_throwing_proxy_trap_is_a_validation_error_not_a_hang() {
    let (store, _) = open("traps").await;
    let records = [
        "(() => { const p = Proxy.revocable({}, {}); p.revoke(); return p.proxy; })()",
        "({_id: 'x', a: Object.defineProperty([], 0, {get() { throw 1; }, enumerable: true})})",
        "({_id: 'x', m: new Proxy({}, {ownKeys() { throw 1; }})})",
        "({_id: 'x', m: new Proxy({}, {getPrototypeOf() { throw 1; }})})",
        "({_id: 'x', a: new Proxy([], {get() { throw 1; }})})",
        "(() => { const p = Proxy.revocable([], {}); p.revoke(); return {_id: 'x', a: p.proxy}; })()",
    ];
    for src in records {
        let e = store.put(&eval(src)).await.unwrap_err();
        assert_eq!(e.code(), ErrorCode::Validation, "{src}: {}", e.message());
    }
    let arrays = [
        "new Proxy([], {get() { throw 1; }})",
        "(() => { const p = Proxy.revocable([], {}); p.revoke(); return p.proxy; })()",
        "Object.defineProperty([], 0, {get() { throw 1; }, enumerable: true})",
    ];
    for src in arrays {
        let e = store.put_many(&eval(src)).await.unwrap_err();
        assert_eq!(e.code(), ErrorCode::Validation, "putMany {src}");
        let e = store.get_many(&eval(src)).await.unwrap_err();
        assert_eq!(e.code(), ErrorCode::Validation, "getMany {src}");
        let e = store.delete_many(&eval(src)).await.unwrap_err();
        assert_eq!(e.code(), ErrorCode::Validation, "deleteMany {src}");
        let q = js_sys::Object::new();
        js_sys::Reflect::set(&q, &"eq".into(), &eval(src)).unwrap();
        assert!(
            agentstore::store::ByQuery::from_js(&q).is_err(),
            "listBy eq {src}"
        );
    }
    store.put(&js(json!({"_id": "m"}))).await.unwrap();
    let f = js_sys::Function::new_with_args(
        "cur",
        "const p = Proxy.revocable({}, {}); p.revoke(); return p.proxy;",
    );
    let e = store.mutate(&s("m"), &f, 0, None).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::Validation);
    // Still working, nothing of the above written.
    store.put(&js(json!({"_id": "after"}))).await.unwrap();
    assert_eq!(all_ids(&store, "", 100).await, vec!["after", "m"]);
    assert_indexes_clean(&store).await;
}

/// An array whose length alone is past the 64 MiB record limit is refused
/// before any of it is read (before: `[].length = 2 ** 29` made the walk
/// allocate 2 GiB and panic).
#[wasm_bindgen_test]
async fn a_huge_sparse_array_is_refused_as_too_large() {
    let (store, _) = open("sparse").await;
    for len in ["2 ** 29", "2 ** 32 - 1", "2 ** 25 + 1"] {
        let rec = eval(&format!(
            "(() => {{ const a = []; a.length = {len}; return {{_id: 'h', a}}; }})()"
        ));
        let e = store.put(&rec).await.unwrap_err();
        assert_eq!(e.code(), ErrorCode::Validation, "{len}");
        assert!(
            e.message().contains("larger than"),
            "{len}: {}",
            e.message()
        );
    }
    assert!(store.get(&s("h")).await.unwrap().is_none());
}

/// A `__proto__` key (as `JSON.parse` makes it) is stored as the data it is,
/// and the index reads only the record's own fields. (Before, the copy's
/// `__proto__` setter dropped the field and made it the prototype, whose `k`
/// the index then read: an entry `verifyIndexes` called stale.)
#[wasm_bindgen_test]
async fn a_proto_key_is_stored_as_data_and_indexed_as_such() {
    let name = fresh_name("proto");
    let by_k = agentstore_protocol::index::IndexDef {
        name: "byK".into(),
        keys: vec!["data.k".into()],
    };
    let store = agentstore::store::Store::open(&name, 2000, None, vec![by_k])
        .await
        .unwrap();
    store.rebuild_indexes(500, false, None, None).await.unwrap();
    let text = r#"{"_id":"pp","data":{"__proto__":{"k":7},"x":1}}"#;
    let rec = js_sys::JSON::parse(text).unwrap();
    store.put(&rec).await.unwrap();
    let got = store.get(&s("pp")).await.unwrap().unwrap();
    let data = field(&got, "data");
    let own = js_sys::Object::get_own_property_descriptor(
        data.unchecked_ref::<js_sys::Object>(),
        &"__proto__".into(),
    );
    assert!(own.is_object(), "__proto__ kept as an own field");
    assert_eq!(field(&field(&data, "__proto__"), "k").as_f64(), Some(7.0));
    assert_eq!(field(&data, "x").as_f64(), Some(1.0));
    let q = agentstore::store::ByQuery::from_js(&js(json!({"eq": 7}))).unwrap();
    assert_eq!(store.list_by("byK", &q).await.unwrap().records.length(), 0);
    assert_indexes_clean(&store).await;
}

/// `list({type})` and `count({type})` compare the type as UTF-16 code units,
/// as IndexedDB stores it: a lone surrogate is not U+FFFD.
#[wasm_bindgen_test]
async fn a_type_with_a_lone_surrogate_lists_only_itself() {
    let (store, _) = open("surrogate-type").await;
    let lone = eval("'\\uD800'");
    let replacement = eval("'\\uFFFD'");
    for (id, t) in [("a", &lone), ("b", &replacement)] {
        store.put(&obj_with(id, "recordType", t)).await.unwrap();
    }
    let q = ListQuery {
        record_type: Some(lone.clone().into()),
        limit: 10,
        ..Default::default()
    };
    let page = store.list(&q).await.unwrap();
    let ids: Vec<String> = page
        .records
        .iter()
        .map(|r| field_str(&r, "_id").unwrap())
        .collect();
    assert_eq!(ids, vec!["a"]);
    let t: js_sys::JsString = lone.into();
    assert_eq!(store.count(&[], Some(&t)).await.unwrap(), 1);
}

/// `blockedTimeoutMs` past the browsers' 2^31 - 1 ms timer limit (which they
/// run at once) is refused, not an open that fails as blocked at once.
#[wasm_bindgen_test]
async fn a_blocked_timeout_past_the_timer_limit_is_refused() {
    let name = fresh_name("timer-limit");
    for ms in [4_294_967_295.0, 2_147_483_648.0] {
        let o = js_sys::Object::new();
        js_sys::Reflect::set(&o, &"blockedTimeoutMs".into(), &ms.into()).unwrap();
        let e =
            wasm_bindgen_futures::JsFuture::from(agentstore::AgentStore::open(s(&name), o.into()))
                .await
                .unwrap_err();
        assert_eq!(field_str(&e, "code").as_deref(), Some("validation"), "{ms}");
    }
    let o = js(json!({"blockedTimeoutMs": 2_147_483_647u32}));
    let opened = wasm_bindgen_futures::JsFuture::from(agentstore::AgentStore::open(s(&name), o))
        .await
        .expect("the largest timer opens");
    let close: js_sys::Function = field(&opened, "close").unchecked_into();
    close.call0(&opened).unwrap();
}

/// The stored copy keeps the caller's key order (nested too), although the
/// revision digest reads the keys sorted.
#[wasm_bindgen_test]
async fn the_stored_record_keeps_the_callers_key_order() {
    let (store, _) = open("key-order").await;
    let text = r#"{"_id":"o","z":1,"a":2,"m":{"y":1,"b":[{"q":1,"c":2}]}}"#;
    store
        .put(&js_sys::JSON::parse(text).unwrap())
        .await
        .unwrap();
    let got = store.get(&s("o")).await.unwrap().unwrap();
    let back: String = js_sys::JSON::stringify(&got).unwrap().into();
    assert!(back.starts_with(&text[..text.len() - 1]), "{back}");
}

/// A count or ms option is an integer: `batchSize: 1.5` is refused with a
/// ValidationError (it was truncated to 1), in every call that takes one,
/// and nothing is written.
#[wasm_bindgen_test]
async fn a_fractional_count_option_is_refused_not_truncated() {
    let name = fresh_name("fraction");
    let opened = wasm_bindgen_futures::JsFuture::from(agentstore::AgentStore::open(
        s(&name),
        JsValue::UNDEFINED,
    ))
    .await
    .unwrap();
    let call = |method: &str, args: &[JsValue]| {
        let f: js_sys::Function = field(&opened, method).unchecked_into();
        let args: js_sys::Array = args.iter().collect();
        let p: js_sys::Promise = f.apply(&opened, &args).unwrap().unchecked_into();
        wasm_bindgen_futures::JsFuture::from(p)
    };
    let snapshot = "{\"agentstore\":\"snapshot\",\"records\":1,\"tombstones\":0,\"version\":1}\n{\"_id\":\"a\",\"_rev\":\"1-aa\"}";
    for batch in [1.5, 2.5, 9999.25] {
        let o = js(json!({ "batchSize": batch }));
        let calls = [
            ("rebuildIndexes", vec![o.clone()]),
            ("exportSnapshot", vec![o.clone()]),
            ("importSnapshot", vec![s(snapshot), o.clone()]),
        ];
        for (method, args) in calls {
            let e = call(method, &args).await.unwrap_err();
            assert_eq!(
                field_str(&e, "code").as_deref(),
                Some("validation"),
                "{method} {batch}"
            );
        }
    }
    let got = call("get", &[s("a")]).await.unwrap();
    assert!(got.is_null(), "nothing was imported");
    let close: js_sys::Function = field(&opened, "close").unchecked_into();
    close.call0(&opened).unwrap();
}

/// The store `AgentStore.open(name, opts)` resolves to, as JavaScript sees it.
async fn open_js(name: &str, opts: JsValue) -> JsValue {
    wasm_bindgen_futures::JsFuture::from(agentstore::AgentStore::open(s(name), opts))
        .await
        .unwrap()
}

/// `opened[method](...args)` awaited as a Promise.
fn call_js(opened: &JsValue, method: &str, args: Vec<JsValue>) -> wasm_bindgen_futures::JsFuture {
    let f: js_sys::Function = field(opened, method).unchecked_into();
    let args: js_sys::Array = args.iter().collect();
    let p: js_sys::Promise = f.apply(opened, &args).unwrap().unchecked_into();
    wasm_bindgen_futures::JsFuture::from(p)
}

/// Every options argument of the store is read one way: options that are
/// not an object, a boolean given as a string or a number, a fraction where
/// a count goes, and listing options given to `count` are ValidationErrors,
/// never read as "no options", coerced or ignored. (Before:
/// `rebuildIndexes({restart: "false"})` ran a restart, `list({descending:
/// "true"})` listed ascending, `listBy("byType", {range: "run"})` returned the
/// whole index, `count({prefix, after})` counted the whole prefix, and
/// `open(name, {blockedTimeoutMs: 1.5})` truncated.) `null` stays "not given".
#[wasm_bindgen_test]
async fn options_are_checked_one_way_never_coerced_or_ignored() {
    let name = fresh_name("options");
    let opts = js(json!({"indexes": [{"name": "byType", "keys": ["recordType", "updatedAt"]}]}));
    let opened = open_js(&name, opts).await;
    let call = |method: &str, args: Vec<JsValue>| call_js(&opened, method, args);
    call("put", vec![js(json!({"_id": "a", "recordType": "run"}))])
        .await
        .unwrap();
    let id_fn = eval("(r) => r");
    let refused: Vec<(&str, Vec<JsValue>)> = vec![
        ("rebuildIndexes", vec![s("restart")]),
        ("rebuildIndexes", vec![js(json!({"restart": "false"}))]),
        ("rebuildIndexes", vec![js(json!({"restart": 0}))]),
        ("list", vec![js(json!({"descending": "true"}))]),
        ("listBy", vec![s("byType"), s("run")]),
        ("listBy", vec![s("byType"), js(json!({"range": "run"}))]),
        (
            "listBy",
            vec![s("byType"), js(json!({"range": ["a", "b"]}))],
        ),
        (
            "listBy",
            vec![s("byType"), js(json!({"range": {"lowerOpen": "yes"}}))],
        ),
        (
            "listBy",
            vec![s("byType"), js(json!({"eq": "run", "descending": 1}))],
        ),
        ("count", vec![js(json!({"prefix": "a", "after": "x"}))]),
        ("count", vec![js(json!({"limit": 5}))]),
        ("count", vec![js(json!({"descending": true}))]),
        (
            "mutate",
            vec![s("a"), id_fn.clone(), js(json!({"retries": 1.5}))],
        ),
        ("mutate", vec![s("a"), id_fn.clone(), s("retries")]),
        ("exportSnapshot", vec![s("batchSize")]),
    ];
    for (method, args) in refused {
        let shown = format!(
            "{method}({:?})",
            args.iter()
                .map(|a| js_sys::JSON::stringify(a).ok().and_then(|s| s.as_string()))
                .collect::<Vec<_>>()
        );
        let e = call(method, args).await.expect_err(&shown);
        assert_eq!(
            field_str(&e, "code").as_deref(),
            Some("validation"),
            "{shown}"
        );
        assert_eq!(
            field_str(&e, "name").as_deref(),
            Some("ValidationError"),
            "{shown}"
        );
    }
    // `null` is "not given"; real booleans and counts work.
    call("mutate", vec![s("a"), id_fn, js(json!({"retries": null}))])
        .await
        .expect("retries: null is the default");
    let n = call("count", vec![js(json!({"prefix": "a", "type": "run"}))])
        .await
        .unwrap();
    assert_eq!(n.as_f64(), Some(1.0));
    let page = call("list", vec![js(json!({"descending": true}))])
        .await
        .unwrap();
    assert_eq!(js_sys::Array::from(&field(&page, "records")).length(), 1);
    for bad in [
        json!({"blockedTimeoutMs": 1.5}),
        json!({"blockedTimeoutMs": "5"}),
    ] {
        let e = wasm_bindgen_futures::JsFuture::from(agentstore::AgentStore::open(
            s(&fresh_name("options-open")),
            js(bad.clone()),
        ))
        .await
        .expect_err("refused");
        assert_eq!(
            field_str(&e, "code").as_deref(),
            Some("validation"),
            "{bad}"
        );
    }
    // watch's options too (it throws at once: it returns a handle).
    let watch: js_sys::Function = field(&opened, "watch").unchecked_into();
    let e = watch
        .call2(&opened, &s("agent:"), &eval("() => {}"))
        .expect_err("a string is not watch options");
    assert_eq!(field_str(&e, "code").as_deref(), Some("validation"));
    let close: js_sys::Function = field(&opened, "close").unchecked_into();
    close.call0(&opened).unwrap();
}

/// A `listBy` range whose `lower` is above its `upper` (strings, numbers,
/// or a string above a number: numbers sort first) is a ValidationError
/// saying so, as IndexedDB's own `IDBKeyRange.bound` refuses it; an equal
/// pair (closed: that key; with an open end: empty) is a range. Before, an
/// inverted range answered an empty page, hiding the caller's mistake.
#[wasm_bindgen_test]
async fn an_inverted_list_by_range_is_a_validation_error_not_an_empty_page() {
    let name = fresh_name("inverted-range");
    let opts = js(json!({"indexes": [{"name": "byType", "keys": ["recordType"]}]}));
    let opened = open_js(&name, opts).await;
    let call = |method: &str, args: Vec<JsValue>| call_js(&opened, method, args);
    call("put", vec![js(json!({"_id": "a", "recordType": "run"}))])
        .await
        .unwrap();
    for range in [
        json!({"lower": "b", "upper": "a"}),
        json!({"lower": 2, "upper": 1}),
        json!({"lower": "a", "upper": 5, "upperOpen": true}),
    ] {
        let e = call("listBy", vec![s("byType"), js(json!({ "range": range }))])
            .await
            .expect_err("an inverted range is refused");
        assert_eq!(
            (
                field_str(&e, "name").as_deref(),
                field_str(&e, "code").as_deref()
            ),
            (Some("ValidationError"), Some("validation")),
            "{range}"
        );
        assert!(e.is_instance_of::<js_sys::Error>(), "{range}");
        let m = field_str(&e, "message").unwrap_or_default();
        assert!(m.contains("range: lower is above upper"), "{m}");
    }
    let records = |page: &JsValue| js_sys::Array::from(&field(page, "records")).length();
    let page = call(
        "listBy",
        vec![
            s("byType"),
            js(json!({"range": {"lower": "run", "upper": "run"}})),
        ],
    )
    .await
    .expect("an equal pair is that key");
    assert_eq!(records(&page), 1);
    let page = call(
        "listBy",
        vec![
            s("byType"),
            js(json!({"range": {"lower": "run", "upper": "run", "lowerOpen": true}})),
        ],
    )
    .await
    .expect("an equal pair with an open end is an empty range");
    assert_eq!(records(&page), 0);
    let close: js_sys::Function = field(&opened, "close").unchecked_into();
    close.call0(&opened).unwrap();
}

/// An option the call does not take (a misspelt key holding a value) is a
/// ValidationError naming it, and the call does nothing: before, `list`
/// with `prefx` listed every record, `mutate` with `retry: 0` retried 8
/// times, `importPouchDump` with `batch` wrote with the default. A key
/// holding `undefined` or `null` is "not given", as everywhere.
#[wasm_bindgen_test]
async fn an_option_the_call_does_not_take_is_refused_and_nothing_is_done() {
    let name = fresh_name("unknown-option");
    let opts = js(json!({"indexes": [{"name": "byType", "keys": ["recordType"]}]}));
    let opened = open_js(&name, opts).await;
    let call = |method: &str, args: Vec<JsValue>| call_js(&opened, method, args);
    let a = call(
        "put",
        vec![js(json!({"_id": "a", "recordType": "run", "v": 1}))],
    )
    .await
    .unwrap();
    let d = call("put", vec![js(json!({"_id": "d"}))]).await.unwrap();
    call("delete", vec![s("d"), field(&d, "rev")])
        .await
        .unwrap();
    let bump = eval("(r) => ({...r, v: 2})");
    let dump = "{\"docs\":[{\"_id\":\"imp\",\"_rev\":\"1-a\"}]}\n{\"seq\":1}\n";
    let snapshot = call("exportSnapshot", vec![]).await.unwrap();
    let refused: Vec<(&str, Vec<JsValue>)> = vec![
        ("list", vec![js(json!({"prefx": "zz"}))]),
        ("count", vec![js(json!({"prefx": "zz"}))]),
        ("listBy", vec![s("byType"), js(json!({"eqq": "run"}))]),
        (
            "listBy",
            vec![s("byType"), js(json!({"range": {"lowr": "a"}}))],
        ),
        (
            "mutate",
            vec![s("a"), bump.clone(), js(json!({"retry": 0}))],
        ),
        (
            "purgeTombstones",
            vec![js(json!({"olderThanMs": 0, "dryRun": true}))],
        ),
        ("exportSnapshot", vec![js(json!({"batch": 1}))]),
        ("exportSnapshotBlob", vec![js(json!({"batch": 1}))]),
        (
            "exportSnapshotChunks",
            vec![eval("() => {}"), js(json!({"batch": 1}))],
        ),
        ("importPouchDump", vec![s(dump), js(json!({"batch": 5}))]),
        (
            "importSnapshot",
            vec![snapshot.clone(), js(json!({"legacyIndexId": "x"}))],
        ),
        ("rebuildIndexes", vec![js(json!({"batchsize": 5}))]),
    ];
    for (method, args) in refused {
        let e = call(method, args).await.expect_err(method);
        assert_eq!(
            field_str(&e, "name").as_deref(),
            Some("ValidationError"),
            "{method}"
        );
        let msg = field_str(&e, "message").unwrap_or_default();
        assert!(msg.contains("unknown option"), "{method}: {msg}");
    }
    // A deletion's key it does not take (PouchDB's `_deleted`) is refused
    // at its position, and the batch deletes nothing.
    let rev_a = field_str(&a, "rev").unwrap();
    let e = call(
        "deleteMany",
        vec![js(json!([{"id": "a", "rev": rev_a, "_deleted": true}]))],
    )
    .await
    .expect_err("deleteMany");
    let failures = js_sys::Array::from(&field(&e, "failures"));
    let msg = field_str(&failures.get(0), "message").unwrap_or_default();
    assert!(
        msg.contains("unknown option \"_deleted\""),
        "deleteMany: {msg}"
    );
    // Nothing was done: `a` is unchanged, the tombstone stays, nothing imported.
    let a = call("get", vec![s("a")]).await.unwrap();
    assert_eq!(field(&a, "v").as_f64(), Some(1.0));
    assert!(call("get", vec![s("imp")]).await.unwrap().is_null());
    let purged = call("purgeTombstones", vec![js(json!({"olderThanMs": 0}))])
        .await
        .unwrap();
    assert_eq!(
        purged.as_f64(),
        Some(1.0),
        "the refused purge purged nothing"
    );
    // `undefined` and `null` are "not given".
    let page = call(
        "list",
        vec![eval("({prefx: undefined, limit: null, x: null})")],
    )
    .await
    .unwrap();
    assert_eq!(js_sys::Array::from(&field(&page, "records")).length(), 1);
    // open, destroy and watch too.
    let e = wasm_bindgen_futures::JsFuture::from(agentstore::AgentStore::open(
        s(&name),
        js(json!({"indexs": [{"name": "byType", "keys": ["recordType"]}]})),
    ))
    .await
    .expect_err("indexs");
    assert_eq!(field_str(&e, "code").as_deref(), Some("validation"));
    // An index definition's key it does not take (Dexie's `unique`): no
    // index would keep that promise.
    let e = wasm_bindgen_futures::JsFuture::from(agentstore::AgentStore::open(
        s(&name),
        js(json!({"indexes": [{"name": "byType", "keys": ["recordType"], "unique": true}]})),
    ))
    .await
    .expect_err("unique");
    let msg = field_str(&e, "message").unwrap_or_default();
    assert!(
        msg.contains("unknown option \"unique\""),
        "index definition: {msg}"
    );
    let e = wasm_bindgen_futures::JsFuture::from(agentstore::AgentStore::destroy(
        s(&name),
        js(json!({"blockedTimeout": 1})),
    ))
    .await
    .expect_err("blockedTimeout");
    assert_eq!(field_str(&e, "code").as_deref(), Some("validation"));
    assert!(
        !call("get", vec![s("a")]).await.unwrap().is_null(),
        "the refused destroy left the store open and whole"
    );
    let watch: js_sys::Function = field(&opened, "watch").unchecked_into();
    let e = watch
        .call2(&opened, &js(json!({"prefx": "a"})), &eval("() => {}"))
        .expect_err("prefx");
    assert_eq!(field_str(&e, "code").as_deref(), Some("validation"));
    let close: js_sys::Function = field(&opened, "close").unchecked_into();
    close.call0(&opened).unwrap();
}

/// A string past the record size limit (as a value, a key or `_rev`) is
/// refused with ValidationError before it is copied into wasm memory: the
/// module's memory (which never shrinks) grows by less than 16 MiB for a
/// 72 Mi-unit string.
#[wasm_bindgen_test]
async fn an_oversized_string_is_refused_without_copying_it_into_wasm_memory() {
    let (store, _) = open("huge-string").await;
    let make = js_sys::Function::new_with_args(
        "kind",
        "const big = 'x'.repeat(72 * 1024 * 1024); \
         if (kind === 0) return {_id: 'a', s: big}; \
         if (kind === 1) return {_id: 'a', [big]: 1}; \
         return {_id: 'a', _rev: big};",
    );
    let memory = || {
        let m: js_sys::WebAssembly::Memory = wasm_bindgen::memory().unchecked_into();
        m.buffer()
            .unchecked_into::<js_sys::ArrayBuffer>()
            .byte_length()
    };
    for kind in 0..3 {
        let record = make.call1(&JsValue::NULL, &kind.into()).unwrap();
        let before = memory();
        let e = store.put(&record).await.unwrap_err();
        assert_eq!(e.code(), ErrorCode::Validation, "kind {kind}");
        let grown = memory() - before;
        assert!(
            grown < 16 << 20,
            "kind {kind}: wasm memory grew by {grown} bytes"
        );
    }
    assert!(store.get(&s("a")).await.unwrap().is_none());
}

/// An options object whose getter (or Proxy trap) throws is a ValidationError
/// naming the option, and the call does nothing: it is never read as "not
/// given". Before, a throwing `signal` getter silently dropped the abort,
/// and a throwing `prefix` getter listed the whole store.
#[wasm_bindgen_test]
async fn an_option_whose_getter_throws_is_a_validation_error_not_a_missing_option() {
    use agentstore::AgentStore;
    use wasm_bindgen_futures::JsFuture;
    let (store, _) = open("throwing-options").await;
    let api = AgentStore::from_store(store);
    JsFuture::from(api.put(js(json!({"_id": "a"}))))
        .await
        .unwrap();
    let throwing = |key: &str| eval(&format!("{{ get {key}() {{ throw new Error('no'); }} }}"));
    let calls: Vec<(&str, js_sys::Promise)> = vec![
        ("list prefix", api.list(throwing("prefix"))),
        ("list limit", api.list(throwing("limit"))),
        ("count type", api.count(throwing("type"))),
        ("listBy eq", api.list_by("byType".into(), throwing("eq"))),
        (
            "mutate signal",
            api.mutate(
                "a".into(),
                eval("(r) => ({...r, n: 1})"),
                throwing("signal"),
            ),
        ),
        (
            "mutate retries",
            api.mutate(
                "a".into(),
                eval("(r) => ({...r, n: 1})"),
                throwing("retries"),
            ),
        ),
        (
            "purge olderThanMs",
            api.purge_tombstones(throwing("olderThanMs")),
        ),
    ];
    for (what, p) in calls {
        let e = JsFuture::from(p).await.expect_err(what);
        assert_eq!(
            field_str(&e, "code").as_deref(),
            Some("validation"),
            "{what}"
        );
        assert!(
            field_str(&e, "message").is_some_and(|m| m.contains("could not be read")),
            "{what}: {:?}",
            field_str(&e, "message")
        );
    }
    let got = JsFuture::from(api.get("a".into())).await.unwrap();
    assert!(field(&got, "n").is_undefined(), "no mutate ran");
}

/// What `mutate`'s function returns is checked like what `put` takes: a Date,
/// Map, typed array, boxed string or class instance is a ValidationError
/// (before, its own fields were copied into a plain object and stored),
/// whether the function returns it or a Promise of it.
#[wasm_bindgen_test]
async fn mutate_refuses_a_result_that_is_not_a_plain_object() {
    let (store, _) = open("mutate-plain").await;
    let w = store.put(&js(json!({"_id": "m", "v": 1}))).await.unwrap();
    for body in [
        "new Date(0)",
        "new Map([['k', 1]])",
        "new Uint8Array([7, 8])",
        "new String('hi')",
        "new (class M { constructor() { this.n = 1; } })()",
    ] {
        for wrap in ["return {b};", "return Promise.resolve({b});"] {
            let src = wrap.replace("{b}", body);
            let f = js_sys::Function::new_with_args("cur", &src);
            let e = store.mutate(&s("m"), &f, 0, None).await.unwrap_err();
            assert_eq!(e.code(), ErrorCode::Validation, "{src}");
            assert!(
                e.to_string().contains("not a plain JSON object"),
                "{src}: {e}"
            );
        }
    }
    // A null-prototype object is plain, as in put.
    let f = js_sys::Function::new_with_args(
        "cur",
        "return Object.assign(Object.create(null), {v: 2});",
    );
    store.mutate(&s("m"), &f, 0, None).await.unwrap();
    let got = store.get(&s("m")).await.unwrap().unwrap();
    assert_eq!(field(&got, "v").as_f64(), Some(2.0));
    assert!(
        field_str(&got, "_rev").unwrap().starts_with("2-"),
        "only the last call wrote: {}",
        w.rev
    );
}

/// A `mutate` function whose result names another `_id` is refused
/// (ValidationError, nothing written to either id), sync or async; its own
/// `_id`, or none, writes the record mutated. Before, `_id` was overwritten
/// with the id mutated: a copy meant for another record silently replaced
/// this one.
#[wasm_bindgen_test]
async fn mutate_refuses_a_result_with_another_id_and_writes_nothing() {
    let (store, _) = open("mutate-other-id").await;
    let w = store.put(&js(json!({"_id": "x", "v": 1}))).await.unwrap();
    for src in [
        "return {_id: 'other', v: 2};",
        "return Promise.resolve({_id: 'other', v: 2});",
        "return {_id: 7, v: 2};",
        "return {...cur, _id: 'x ', v: 2};",
    ] {
        let f = js_sys::Function::new_with_args("cur", src);
        let e = store.mutate(&s("x"), &f, 0, None).await.unwrap_err();
        assert_eq!(e.code(), ErrorCode::Validation, "{src}");
        assert!(e.to_string().contains("another _id"), "{src}: {e}");
    }
    assert!(store.get(&s("other")).await.unwrap().is_none());
    let got = store.get(&s("x")).await.unwrap().unwrap();
    assert_eq!(field_str(&got, "_rev"), Some(w.rev), "x untouched");
    for src in ["return {...cur, v: 3};", "return {v: 4};"] {
        let f = js_sys::Function::new_with_args("cur", src);
        store.mutate(&s("x"), &f, 0, None).await.unwrap();
    }
    let got = store.get(&s("x")).await.unwrap().unwrap();
    assert_eq!(field(&got, "v").as_f64(), Some(4.0));
}

/// Names are taken exactly or refused: a store name, index name or key path
/// with a lone surrogate is a ValidationError. Before, each lone surrogate
/// became U+FFFD, so `open("t\uD800")` and `open("t\uDC00")` opened one
/// database, and `destroy` of one deleted the other's records.
#[wasm_bindgen_test]
async fn a_name_with_a_lone_surrogate_is_refused_not_changed() {
    let base = fresh_name("lone");
    let code = |e: &JsValue| field_str(e, "code");
    for name in [format!("\"{base}\\ud800\""), format!("\"{base}\\udc00x\"")] {
        let e = wasm_bindgen_futures::JsFuture::from(agentstore::AgentStore::open(
            eval(&name),
            JsValue::UNDEFINED,
        ))
        .await
        .expect_err("refused");
        assert_eq!(code(&e).as_deref(), Some("validation"), "open {name}");
        let e = wasm_bindgen_futures::JsFuture::from(agentstore::AgentStore::destroy(
            eval(&name),
            JsValue::UNDEFINED,
        ))
        .await
        .expect_err("refused");
        assert_eq!(code(&e).as_deref(), Some("validation"), "destroy {name}");
    }
    for indexes in [
        "[{name: 'by\\ud800', keys: ['recordType']}]",
        "[{name: 'byType', keys: ['a\\udfff']}]",
    ] {
        let o = js_sys::Object::new();
        js_sys::Reflect::set(&o, &"indexes".into(), &eval(indexes)).unwrap();
        let e = wasm_bindgen_futures::JsFuture::from(agentstore::AgentStore::open(
            s(&fresh_name("lone-index")),
            o.into(),
        ))
        .await
        .expect_err("refused");
        assert_eq!(code(&e).as_deref(), Some("validation"), "{indexes}");
    }
    // A well-formed name with U+FFFD or an astral character is kept as it is.
    let ok = format!("{base}\u{FFFD}\u{1F600}");
    let opened = wasm_bindgen_futures::JsFuture::from(agentstore::AgentStore::open(
        s(&ok),
        JsValue::UNDEFINED,
    ))
    .await
    .expect("opened");
    let close: js_sys::Function = field(&opened, "close").unchecked_into();
    close.call0(&opened).unwrap();
    wasm_bindgen_futures::JsFuture::from(agentstore::AgentStore::destroy(
        s(&ok),
        JsValue::UNDEFINED,
    ))
    .await
    .expect("destroyed");
}

/// An array behind a Proxy whose `length` is a fraction is read up to the
/// whole part of it, as the walk did in wasm (`as u32`), so the stored copy
/// and the revision do not change with where the walk runs.
#[wasm_bindgen_test]
async fn a_proxy_array_with_a_fractional_length_is_read_up_to_its_whole_part() {
    let (store, _) = open("proxy-length").await;
    let rec = eval(
        "({_id: 'p', a: new Proxy([1, 2, 3], {get: (t, k) => (k === 'length' ? 1.5 : t[k])}), \
          b: new Proxy([7], {get: (t, k) => (k === 'length' ? 1e-9 : t[k])})})",
    );
    store.put(&rec).await.unwrap();
    let got = store.get(&s("p")).await.unwrap().unwrap();
    let text = String::from(js_sys::JSON::stringify(&got).unwrap());
    assert!(
        text.contains(r#""a":[1]"#) && text.contains(r#""b":[]"#),
        "{text}"
    );
}

/// A getter or Proxy trap that calls the store again while the store reads
/// it (here: a record whose getter writes that record again, and an id list
/// whose trap asks `getMany` for that list again) re-enters the module with
/// no end. The nesting is bounded: past it a call is refused with a
/// ValidationError before it reads anything, every call settles, and the
/// store goes on working. Unbounded, the recursion ran until the engine's
/// stack overflowed inside the module's own frames.
#[wasm_bindgen_test]
async fn a_getter_that_calls_the_store_again_is_bounded_and_every_call_settles() {
    let body = "return (async () => {
        const calls = [];
        const track = (p) => { calls.push(p.then(() => 'ok', (e) => e instanceof Error ? e.code : 'not an Error')); };
        const rec = { _id: 'loop', get v() { track(s.put(this)); return 1; } };
        track(s.put(rec));
        const ids = new Proxy(['a'], { get(t, k) { if (k === '0') track(s.getMany(ids)); return t[k]; } });
        track(s.getMany(ids));
        // A Proxy whose every read calls the store again fans out: bounded
        // in all, not only in depth.
        const fan = new Proxy({}, { get() { track(s.count(fan)); return undefined; } });
        track(s.count(fan));
        // An object that only claims Response's prototype: its getters
        // throw; the import refuses it, every time.
        for (let i = 0; i < 20; i++) {
            try { track(s.importSnapshot(Object.create(Response.prototype))); }
            catch (e) { calls.push(Promise.resolve('threw ' + e)); }
        }
        const all = [];
        for (let i = 0; i < calls.length; i++) all.push(await calls[i]);
        await s.put({ _id: 'after', n: 1 });
        const after = await s.get('after');
        return { all, after: after && after.n };
    })();";
    let out = with_js_store(body).await;
    let all: js_sys::Array = field(&out, "all").unchecked_into();
    let codes: Vec<String> = all.iter().filter_map(|v| v.as_string()).collect();
    assert_eq!(codes.len() as u32, all.length());
    assert!(
        codes
            .iter()
            .all(|c| ["ok", "validation", "conflict"].contains(&c.as_str())),
        "{codes:?}"
    );
    assert!(
        codes.iter().any(|c| c == "validation"),
        "the nesting was cut"
    );
    // 1,024 nested calls run at most; each reads its few options, and a
    // read past the bound gets a refused call.
    assert!(codes.len() < 20_000, "bounded: {}", codes.len());
    assert_eq!(
        field(&out, "after").as_f64(),
        Some(1.0),
        "the store goes on working"
    );
}

/// An object that only claims a platform prototype (`instanceof` says
/// AbortSignal, Promise, Blob or Response) throws from every getter and
/// method of the real class. Each is refused or rejected as a value like
/// any other, never thrown past the module: before, a fake `signal` threw
/// from inside the write group (whose later writes then waited for ever),
/// and a fake Promise returned by `mutate`'s function threw from `then`.
#[wasm_bindgen_test]
async fn an_object_that_only_claims_a_platform_prototype_is_refused_and_the_store_goes_on() {
    let body = "return (async () => {
        const out = {};
        await s.put({ _id: 'm', n: 1 });
        const signal = Object.create(AbortSignal.prototype);
        out.mutateSignal = await settle(() => s.mutate('m', (r) => ({ ...r, n: 2 }), { signal }));
        out.importSignal = await settle(() => s.importSnapshot('', { signal }));
        out.rebuildSignal = await settle(() => s.rebuildIndexes({ signal }));
        out.fakePromise = await settle(() => s.mutate('m', () => Object.create(Promise.prototype)));
        out.fakeBlob = await settle(() => s.importSnapshot(Object.create(Blob.prototype)));
        out.fakeResponse = await settle(() => s.importPouchDump(Object.create(Response.prototype)));
        // A real signal whose own `aborted` throws once the write group
        // reads it, and a Promise whose own `then` throws: each call settles,
        // and the group they were in does not hang the writes after it.
        let n = 0;
        const late = Object.defineProperty(new AbortController().signal, 'aborted', {
            get() { if (n++ >= 2) throw new Error('late'); return false; },
        });
        // One that only claims the prototype, with the same getter, is no
        // signal (told by its internal slots, not its prototype chain).
        const fakeLate = Object.create(AbortSignal.prototype, { aborted: { get() { return false; } } });
        out.fakeLateSignal = await settle(() => s.mutate('m', (r) => r, { signal: fakeLate }));
        const grouped = [s.put({ _id: 'g' }), s.mutate('m', (r) => ({ ...r, n: 1 }), { signal: late })];
        out.lateSignal = await settle(() => grouped[1]);
        await grouped[0];
        const bad = () => Object.assign(Promise.resolve({ n: 1 }), { then() { throw new Error('then'); } });
        out.badThen = await settle(() => s.mutate('m', bad));
        // Writes after them (grouped: issued in one tick) still commit.
        const [a, b] = await Promise.all([s.put({ _id: 'a' }), s.put({ _id: 'b' })]);
        out.after = a.id + b.id + (await s.get('m')).n;
        return out;
    })();";
    let out = with_js_store(body).await;
    let got = |k: &str| field_str(&out, k).unwrap_or_default();
    assert_eq!(got("mutateSignal"), "validation");
    assert_eq!(got("importSignal"), "validation");
    assert_eq!(got("rebuildSignal"), "validation");
    assert_ne!(got("fakePromise"), "not an Error");
    assert_eq!(got("fakeBlob"), "validation");
    assert_eq!(got("fakeResponse"), "validation");
    assert_eq!(got("lateSignal"), "aborted");
    assert_eq!(got("fakeLateSignal"), "validation");
    assert_ne!(got("badThen"), "not an Error");
    assert_eq!(got("after"), "ab1", "the store goes on working");
}

/// Runs the JS `body` (a function body that returns a Promise, with
/// [`SETTLE_JS`]'s `settle` in scope) with `s`, an
/// `AgentStore` opened through the JS API on a fresh database; returns what
/// the Promise resolves to (panics if it rejects) and closes the store.
async fn with_js_store(body: &str) -> JsValue {
    let name = format!("js-{}", (js_sys::Math::random() * 1e9) as u64);
    let opened = wasm_bindgen_futures::JsFuture::from(agentstore::AgentStore::open(
        s(&name),
        JsValue::UNDEFINED,
    ))
    .await
    .unwrap();
    let f = js_sys::Function::new_with_args("s", &[SETTLE_JS, body].concat());
    let out = wasm_bindgen_futures::JsFuture::from(js_sys::Promise::from(
        f.call1(&JsValue::NULL, &opened).unwrap(),
    ))
    .await
    .expect("every call settles");
    let close: js_sys::Function = field(&opened, "close").unchecked_into();
    close.call0(&opened).unwrap();
    out
}

/// A record at the last revision generation (2^53-1, which an import may
/// bring) has no next revision: `putMany` and `deleteMany` report it in
/// `failures` at its position and write nothing, with a ValidationError as
/// `put` and `delete` of it (no retry can succeed). Before, the batch
/// failed with a ValidationError without `failures`.
#[wasm_bindgen_test]
async fn a_batch_member_at_the_last_revision_generation_is_a_failure_at_its_position() {
    let body = "return (async () => {
        const rev = '9007199254740991-' + 'a'.repeat(32);
        const header = JSON.stringify({ agentstore: 'snapshot', version: 1, records: 1, tombstones: 0 });
        await s.importSnapshot(header + '\\n' + JSON.stringify({ _id: 'm', _rev: rev, recordType: 't' }) + '\\n');
        const b = await s.put({ _id: 'b' });
        const put = await s.putMany([{ _id: 'x' }, { _id: 'm', _rev: rev }]).then(() => null, (e) => e);
        const del = await s.deleteMany([{ id: 'b', rev: b.rev }, { id: 'm', rev }]).then(() => null, (e) => e);
        const at = (e) => e && e.failures ? e.name + ' ' + e.failures.map((f) => f.index + ':' + f.id).join(',') : String(e);
        return [at(put), at(del), String(await s.get('x')), (await s.get('b'))._rev === b.rev, (await s.get('m'))._rev === rev].join(' ');
    })();";
    let out = with_js_store(body).await;
    assert_eq!(
        out.as_string().as_deref(),
        Some("ValidationError 1:m ValidationError 1:m null true true"),
        "no retry can succeed: not a ConflictError"
    );
}

/// A NotFoundError names the id exactly as given, as a ConflictError does
/// (its message is text: a lone surrogate shows as U+FFFD there). Before,
/// it had no `id`.
#[wasm_bindgen_test]
async fn a_not_found_error_carries_the_exact_id() {
    let body = "return (async () => {
        const id = 'a\\uD800';
        const e = await s.delete(id, '1-ab').then(() => null, (e) => e);
        return [e.name, e.id === id].join(' ');
    })();";
    let out = with_js_store(body).await;
    assert_eq!(out.as_string().as_deref(), Some("NotFoundError true"));
}

/// A string argument longer than 64 Ki UTF-16 code units (a prefix longer
/// than any id, a name, a key part, a `list` cursor) is a ValidationError
/// before it is copied into wasm memory, which would otherwise grow for the
/// rest of the page's life; so is a revision, a header value, a constructor
/// name or a field name read outside the record walk. (`listBy`'s cursor
/// has its own, larger bound: it is as long as the indexed values of the
/// entry it names.)
#[wasm_bindgen_test]
async fn a_string_argument_too_long_to_be_one_is_refused_before_it_is_copied_into_wasm_memory() {
    // Longer than the whole linear memory: copying it in would have to grow
    // the memory (for the rest of the page's life) by at least 4 MiB.
    let units = wasm_memory_bytes() + f64::from(4u32 << 20);
    let before = wasm_memory_bytes();
    let body = format!(
        "return (async () => {{
        const out = {{}};
        const big = 'x'.repeat({units});
        await s.put({{ _id: 'k', recordType: 't' }});
        out.listPrefix = await settle(() => s.list({{ prefix: big }}));
        out.countPrefix = await settle(() => s.count({{ prefix: big }}));
        out.listAfter = await settle(() => s.list({{ after: big }}));
        out.listByEq = await settle(() => s.listBy('byType', {{ eq: big }}));
        out.listByPrefix = await settle(() => s.listBy('byType', {{ prefix: big }}));
        out.listByName = await settle(() => s.listBy(big));
        out.listByAfter = await settle(() => s.listBy('byType', {{ after: 'i1.' + big }}));
        // Within the cursor's length bound, but not ASCII (up to 3 bytes a unit).
        out.listByAfterWide = await settle(() => s.listBy('byType', {{ after: String.fromCharCode(233).repeat(1 << 20) }}));
        out.openName = await settle(() => s.constructor.open(big));
        out.indexName = await settle(() => s.constructor.open('never', {{ indexes: [{{ name: big, keys: ['a'] }}] }}));
        out.legacyId = await settle(() => s.importPouchDump('', {{ legacyIndexId: big }}));
        // Fields read outside the record walk: a revision, a header value,
        // a constructor's name, a field name on a failure path.
        out.pouchRev = await settle(() => s.importPouchDump(JSON.stringify({{ docs: [{{ _id: 'p', _rev: big }}] }})));
        out.snapshotRev = await settle(() => s.importSnapshot(JSON.stringify({{ _id: 'p', _rev: big }}) + '\\n'));
        out.header = await settle(() => s.importSnapshot(JSON.stringify({{ agentstore: big }}) + '\\n'));
        out.ctorName = await settle(() => s.put(Object.create({{ constructor: {{ name: big }} }})));
        out.pathKey = await settle(() => s.put({{ _id: 'q', [big]: [undefined] }}));
        out.mutateKey = await settle(() => s.mutate('k', () => ({{ [big]: [undefined] }})));
        out.after = (await s.get('k'))._id;
        return out;
    }})();"
    );
    let out = with_js_store(&body).await;
    let grew = wasm_memory_bytes() - before;
    assert!(
        grew < f64::from(2u32 << 20),
        "linear memory grew by {grew} bytes for refused arguments"
    );
    let got = |k: &str| field_str(&out, k).unwrap_or_default();
    for k in [
        "listPrefix",
        "countPrefix",
        "listAfter",
        "listByEq",
        "listByPrefix",
        "listByName",
        "listByAfter",
        "listByAfterWide",
        "openName",
        "indexName",
        "legacyId",
        "pouchRev",
        "snapshotRev",
        "header",
        "ctorName",
        "pathKey",
        "mutateKey",
    ] {
        assert_eq!(got(k), "validation", "{k}");
    }
    assert_eq!(got("after"), "k", "the store goes on working");
}

/// A ReadableStream or Response whose own `pipeThrough`, `getReader` or
/// `read` is replaced (throws, or answers a non-stream, a non-reader, a
/// non-Promise or a throwing thenable) fails the import with a
/// ValidationError; before, a throw there unwound through the module. (A
/// Response body is read with its stream's `getReader`; its own `blob`,
/// replaced here before, is no longer called; nor is a Blob's own
/// `stream`: see store_import.)
#[wasm_bindgen_test]
async fn an_import_source_whose_own_stream_methods_are_replaced_is_an_error_and_the_store_goes_on()
{
    let body = "return (async () => {
        const out = {};
        const stream = (own) => Object.assign(new ReadableStream(), own);
        const reading = (read) => stream({ getReader: () => ({ read }) });
        const signal = { signal: new AbortController().signal };
        out.pipeThrows = await settle(() => s.importSnapshot(stream({ pipeThrough() { throw new Error('pipe'); } }), signal));
        out.notAStream = await settle(() => s.importSnapshot(stream({ pipeThrough: () => 42 }), signal));
        out.readerThrows = await settle(() => s.importSnapshot(stream({ getReader() { throw new Error('reader'); } })));
        out.notAReader = await settle(() => s.importPouchDump(stream({ getReader: () => 42 })));
        out.readThrows = await settle(() => s.importPouchDump(reading(() => { throw new Error('read'); })));
        out.readNotAPromise = await settle(() => s.importPouchDump(reading(() => 7)));
        out.readBadThen = await settle(() => s.importSnapshot(reading(() => ({ then() { throw new Error('then'); } }))));
        const response = new Response('{}');
        response.body.getReader = () => 7;
        out.responseReader = await settle(() => s.importPouchDump(response));
        await s.put({ _id: 'after' });
        out.after = (await s.get('after'))._id;
        return out;
    })();";
    let out = with_js_store(body).await;
    let got = |k: &str| field_str(&out, k).unwrap_or_default();
    for k in [
        "pipeThrows",
        "notAStream",
        "readerThrows",
        "notAReader",
        "readThrows",
        "readNotAPromise",
        "readBadThen",
        "responseReader",
    ] {
        assert_eq!(got(k), "validation", "{k}");
    }
    assert_eq!(got("after"), "after", "the store goes on working");
}

/// A record holding one string of tens of MiB (within the 64 MiB limit) is
/// hashed in pieces of at most 64 Ki units: the module's memory grows by a
/// piece, not by the string. Before, the whole string was one piece.
#[wasm_bindgen_test]
async fn a_large_string_in_a_record_is_hashed_in_pieces_not_copied_whole() {
    let units = wasm_memory_bytes() + f64::from(4u32 << 20);
    assert!(
        units < f64::from(60u32 << 20),
        "the module's memory is already {units} B"
    );
    let before = wasm_memory_bytes();
    let body = format!(
        "return (async () => {{
        const big = 'x'.repeat({units}) + '\\u{{1F600}}'.repeat(70000);
        const w = await s.put({{ _id: 'big', s: big }});
        const back = await s.get('big');
        return {{ same: back.s === big, rev: w.rev }};
    }})();"
    );
    let out = with_js_store(&body).await;
    let grew = wasm_memory_bytes() - before;
    assert!(
        grew < f64::from(2u32 << 20),
        "linear memory grew by {grew} bytes"
    );
    assert_eq!(field(&out, "same").as_bool(), Some(true));
}

/// `idsByTitle(t)`: the ids of store `t` in the order of its index
/// `byTitle`, paged one record at a time through `next`.
const BY_TITLE_JS: &str = "const idsByTitle = async (t) => {
    const seen = [];
    let page = await t.listBy('byTitle', { limit: 1 });
    for (;;) {
        seen.push(...page.records.map((r) => r._id));
        if (!page.next) return seen;
        page = await t.listBy('byTitle', { limit: 1, after: page.next });
    }
};
";

/// `listBy` pages through index entries whose string parts are longer than
/// the 64 Ki-unit bound on caller arguments: the store's own keys and
/// cursors are not bounded by it.
#[wasm_bindgen_test]
async fn list_by_pages_through_index_values_longer_than_an_argument_may_be() {
    let body = "return (async () => {
        const name = 'long-' + Math.random();
        const t = await s.constructor.open(name, { indexes: [{ name: 'byTitle', keys: ['title'] }] });
        const long = 'x'.repeat(70000);
        for (let i = 0; i < 3; i++) await t.put({ _id: 'r' + i, title: long + i });
        const seen = await idsByTitle(t);
        t.close();
        return seen.join(',');
    })();";
    let out = with_js_store(&[BY_TITLE_JS, body].concat()).await;
    assert_eq!(out.as_string().as_deref(), Some("r0,r1,r2"));
}

/// `listBy` pages past an entry whose indexed value is longer than a cursor
/// may name: a record whose string values exceed MAX_INDEXED_UNITS (250,000
/// UTF-16 units in all) has no entry, as one whose value is not a string or
/// number, and `verifyIndexes` expects none. Before, its entry was written,
/// the page ending on it answered a `next` of over 1 Mi characters, and
/// `listBy` refused that cursor: no page after it could be reached.
#[wasm_bindgen_test]
async fn list_by_pages_past_a_record_whose_indexed_value_is_too_long_to_index() {
    let body = "return (async () => {
        const name = 'too-long-' + Math.random();
        const t = await s.constructor.open(name, { indexes: [{ name: 'byTitle', keys: ['title'] }] });
        await t.put({ _id: 'a', title: 'a' });
        await t.put({ _id: 'b', title: 'b'.repeat(300000) });
        await t.put({ _id: 'c', title: 'c'.repeat(250000) });
        await t.put({ _id: 'd', title: 'd' });
        const seen = await idsByTitle(t);
        const v = await t.verifyIndexes();
        const problems = v.missing.length + v.orphaned.length + v.stale.length;
        t.close();
        return seen.join(',') + ' ' + problems;
    })();";
    let out = with_js_store(&[BY_TITLE_JS, body].concat()).await;
    assert_eq!(out.as_string().as_deref(), Some("a,c,d 0"));
}

/// A `listBy` cursor is checked with a RegExp; a page that replaced
/// `RegExp.prototype.exec` with one that throws gets a rejected Promise
/// (ValidationError), not an exception thrown through the module. Before,
/// the check was a non-catching import: the call threw synchronously and
/// left the module's nesting count raised.
#[wasm_bindgen_test]
async fn a_replaced_regexp_exec_makes_a_list_by_cursor_a_validation_error() {
    let body = "return (async () => {
        const real = RegExp.prototype.exec;
        let out;
        RegExp.prototype.exec = () => { throw new Error('replaced'); };
        try {
            const p = s.listBy('byTitle', { after: 'i1.s0061' });
            RegExp.prototype.exec = real;
            out = await p.then(() => 'resolved', (e) => e.name);
        } catch (e) {
            out = 'threw ' + e.message;
        } finally {
            RegExp.prototype.exec = real;
        }
        await s.put({ _id: 'after', v: 1 });
        return out + ' ' + (await s.get('after')).v;
    })();";
    let out = with_js_store(body).await;
    assert_eq!(out.as_string().as_deref(), Some("ValidationError 1"));
}

/// A value with a `toJSON` method that `Object.keys` does not list (own and
/// non-enumerable, on an object or an array, at the top or nested) is
/// refused: `JSON.stringify` would store what `toJSON` returns, and the copy
/// of its fields is not that. Before, the fields were stored silently, so
/// the record read back was not the one written. The same for what
/// `mutate`'s function returns, and for each record of a `putMany`
/// (nothing written).
#[wasm_bindgen_test]
async fn a_value_whose_to_json_is_hidden_is_refused_not_stored_as_its_fields() {
    let (store, _) = open("tojson").await;
    let hide =
        "Object.defineProperty(o, 'toJSON', {value() { return {b: 2}; }, enumerable: false})";
    let cases = [
        format!("(() => {{ const o = {{_id: 't1', a: 1}}; {hide}; return o; }})()"),
        format!("(() => {{ const o = {{a: 1}}; {hide}; return {{_id: 't2', n: o}}; }})()"),
        format!("(() => {{ const o = [1, 2]; {hide}; return {{_id: 't3', n: [o]}}; }})()"),
    ];
    for src in &cases {
        let e = store.put(&eval(src)).await.expect_err(src);
        assert_eq!(e.code(), ErrorCode::Validation, "{src}");
        assert!(e.to_string().contains("toJSON"), "{src}: {e}");
    }
    let batch: js_sys::Array = cases.iter().map(|c| eval(c)).collect();
    batch.push(&js(json!({"_id": "fine"})));
    assert!(store.put_many(&batch.into()).await.is_err());
    store.put(&js(json!({"_id": "m", "v": 1}))).await.unwrap();
    let f = js_sys::Function::new_with_args(
        "cur",
        &format!("const o = {{_id: 'm', v: 2}}; {hide}; return o;"),
    );
    let e = store.mutate(&s("m"), &f, 0, None).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::Validation);
    assert_eq!(
        store.export_snapshot().await.unwrap().lines().count(),
        2,
        "the header and m: nothing else written"
    );
    let got = store.get(&s("m")).await.unwrap().unwrap();
    assert_eq!(field(&got, "v").as_f64(), Some(1.0));
    // A `toJSON` field that is no function is data, read once like any field.
    let rec = eval(
        "(() => { globalThis.tojsonReads = 0; const o = {_id: 'g'}; \
         Object.defineProperty(o, 'toJSON', {get() { globalThis.tojsonReads++; return 5; }, enumerable: true}); \
         return o; })()",
    );
    store.put(&rec).await.unwrap();
    assert_eq!(
        eval("globalThis.tojsonReads").as_f64(),
        Some(1.0),
        "read once"
    );
    let got = store.get(&s("g")).await.unwrap().unwrap();
    assert_eq!(field(&got, "toJSON").as_f64(), Some(5.0));
}

/// A `JSON.rawJSON` value (a frozen null-prototype object whose one field
/// is `rawJSON`) is written by `JSON.stringify` as its raw text: stored as
/// its fields, the record read back held `{rawJSON: "…"}` where the caller
/// wrote a number. Refused (a review finding), at any depth, in a batch
/// (nothing written) and from `mutate`.
#[wasm_bindgen_test]
async fn a_json_raw_json_value_is_refused_not_stored_as_its_fields() {
    assert!(
        eval("typeof JSON.rawJSON === 'function'").is_truthy(),
        "both engines of the suite have JSON.rawJSON"
    );
    let (store, _) = open("rawjson").await;
    let cases = [
        "({_id: 'r1', n: JSON.rawJSON('12345678901234567890')})",
        "({_id: 'r2', deep: {list: [1, JSON.rawJSON('2')]}})",
    ];
    for src in cases {
        let e = store.put(&eval(src)).await.expect_err(src);
        assert_eq!(e.code(), ErrorCode::Validation, "{src}");
        assert!(e.to_string().contains("JSON.rawJSON"), "{src}: {e}");
    }
    let batch: js_sys::Array = cases.iter().map(|c| eval(c)).collect();
    batch.push(&js(json!({"_id": "fine"})));
    assert!(store.put_many(&batch.into()).await.is_err());
    store.put(&js(json!({"_id": "m", "v": 1}))).await.unwrap();
    let f = js_sys::Function::new_with_args("cur", "return {...cur, v: JSON.rawJSON('2')};");
    let e = store.mutate(&s("m"), &f, 0, None).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::Validation);
    assert_eq!(
        store.export_snapshot().await.unwrap().lines().count(),
        2,
        "the header and m: nothing else written"
    );
}

/// A plain object made in another realm (a same-origin iframe's) is a plain
/// object, as `JSON.stringify`, structured clone and Dexie take it: it was
/// refused as "not a plain JSON object" (its prototype is that realm's
/// `Object.prototype`). Stored as this realm's would be, at any depth; that
/// realm's Date, Map and class instances are still refused.
#[wasm_bindgen_test]
async fn a_plain_object_of_another_realm_is_stored_as_a_plain_object() {
    let (store, _) = open("realm").await;
    eval(
        "globalThis.otherRealm = document.body.appendChild(document.createElement('iframe')).contentWindow",
    );
    let rec = eval("otherRealm.eval(\"({_id: 'x', a: {b: 1, c: [{d: 'e'}]}, n: -0})\")");
    assert!(
        eval("Object.getPrototypeOf(otherRealm.eval('({})')) !== Object.prototype").is_truthy(),
        "the iframe is another realm"
    );
    store.put(&rec).await.unwrap();
    let got = store.get(&s("x")).await.unwrap().unwrap();
    js_sys::Reflect::set(&js_sys::global(), &"gotX".into(), &got).unwrap();
    assert_eq!(
        eval("JSON.stringify({...gotX, _rev: undefined, updatedAt: undefined}) + Object.is(gotX.n, 0)")
            .as_string()
            .as_deref(),
        Some(r#"{"_id":"x","a":{"b":1,"c":[{"d":"e"}]},"n":0}true"#),
        "stored as a plain object of this realm's would be"
    );
    for src in [
        "otherRealm.eval(\"({_id: 'd', at: new Date(0)})\")",
        "otherRealm.eval(\"({_id: 'm', map: new Map()})\")",
        "otherRealm.eval(\"({_id: 'c', v: new (class Point { constructor() { this.x = 1; } })()})\")",
    ] {
        let e = store.put(&eval(src)).await.expect_err(src);
        assert_eq!(e.code(), ErrorCode::Validation, "{src}");
    }
    eval("(document.body.removeChild(otherRealm.frameElement), delete globalThis.otherRealm)");
}
