//! Bad input gets a ValidationError and writes nothing — never a panic.
use agentstore::store::ListQuery;
use agentstore_protocol::ErrorCode;
use serde_json::json;
use wasm_bindgen::JsValue;
use wasm_bindgen_test::*;

mod common;
use common::*;

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
        assert!(ListQuery::from_js(&js(opts.clone())).is_err(), "{opts}");
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
