//! Records, revisions and compare-and-swap, in a real browser's IndexedDB.
// Tests may read and call the page's values with js-sys directly: a slot
// kept by a throw lasts only for the test page (clippy.toml).
#![allow(clippy::disallowed_methods)]

use agentstore_protocol::ErrorCode;
use serde_json::json;
use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_test::*;

mod common;
use common::*;
#[path = "common/values.rs"]
mod values;
use values::{own, PrototypeGetters};

wasm_bindgen_test_configure!(run_in_browser);

#[wasm_bindgen_test]
async fn create_update_delete_follow_compare_and_swap() {
    let (store, _) = open("crud").await;
    let w1 = store
        .put(&js(json!({"_id": "a", "recordType": "agent", "n": 1})))
        .await
        .unwrap();
    assert!(w1.rev.starts_with("1-"));
    let got = store.get(&s("a")).await.unwrap().unwrap();
    assert_eq!(field_str(&got, "_rev").unwrap(), w1.rev);
    assert!(
        field_str(&got, "updatedAt").is_some(),
        "updatedAt is set when absent"
    );

    // create over a live record conflicts
    let e = store
        .put(&js(json!({"_id": "a", "n": 9})))
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::Conflict);

    let w2 = store
        .put(&js(json!({"_id": "a", "_rev": w1.rev, "n": 2})))
        .await
        .unwrap();
    assert!(w2.rev.starts_with("2-"));
    // a stale revision conflicts and carries the stored record
    let e = store
        .put(&js(json!({"_id": "a", "_rev": w1.rev, "n": 3})))
        .await
        .unwrap_err();
    match &e {
        agentstore::StoreError::Conflict {
            current_rev,
            current,
            expected_rev,
            ..
        } => {
            assert_eq!(current_rev.as_deref(), Some(w2.rev.as_str()));
            assert_eq!(expected_rev.as_deref(), Some(w1.rev.as_str()));
            assert_eq!(field(current, "n").as_f64(), Some(2.0));
        }
        other => panic!("expected conflict, got {other:?}"),
    }
    assert_eq!(
        field(&store.get(&s("a")).await.unwrap().unwrap(), "n").as_f64(),
        Some(2.0)
    );

    let e = store.delete(&s("a"), &s(&w1.rev)).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::Conflict);
    let tomb = store.delete(&s("a"), &s(&w2.rev)).await.unwrap();
    assert!(tomb.starts_with("3-"));
    assert!(store.get(&s("a")).await.unwrap().is_none());
    assert_eq!(
        store.delete(&s("a"), &s(&tomb)).await.unwrap_err().code(),
        ErrorCode::NotFound
    );
    assert_eq!(
        store
            .delete(&s("never"), &s("1-aa"))
            .await
            .unwrap_err()
            .code(),
        ErrorCode::NotFound
    );
    // recreate over the tombstone continues the generation
    let w4 = store.put(&js(json!({"_id": "a", "n": 4}))).await.unwrap();
    assert!(w4.rev.starts_with("4-"), "{}", w4.rev);
}

#[wasm_bindgen_test]
async fn same_write_on_same_parent_gives_the_same_revision() {
    let (a, _) = open("det-a").await;
    let (b, _) = open("det-b").await;
    let rec =
        json!({"_id": "x", "updatedAt": "2026-03-01T08:27:12.804Z", "k": [1, 2, {"z": null}]});
    let ra = a.put(&js(rec.clone())).await.unwrap();
    let rb = b.put(&js(rec)).await.unwrap();
    assert_eq!(ra.rev, rb.rev);
}

#[wasm_bindgen_test]
async fn stale_revision_after_delete_never_resurrects() {
    let (store, _) = open("c-s1").await;
    let r1 = store
        .put(&js(json!({"_id": "foo", "recordType": "agent"})))
        .await
        .unwrap()
        .rev;
    let r2 = store.delete(&s("foo"), &s(&r1)).await.unwrap();
    assert!(r2.starts_with("2-"));
    let e = store
        .put(&js(
            json!({"_id": "foo", "_rev": r1, "recordType": "agent"}),
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::Conflict);
    assert_eq!(e.code().status(), 409);
    assert!(store.get(&s("foo")).await.unwrap().is_none());
    let typed = agentstore::store::ListQuery {
        record_type: Some("agent".into()),
        limit: 10,
        ..Default::default()
    };
    assert_eq!(
        store.list(&typed).await.unwrap().records.length(),
        0,
        "no index entry for foo"
    );
}

#[wasm_bindgen_test]
async fn nested_objects_round_trip_as_plain_objects() {
    let (store, _) = open("c-v1").await;
    store
        .put(&js(
            json!({"_id": "m", "data": {"k": "v"}, "list": [{"a": 1}], "nil": null}),
        ))
        .await
        .unwrap();
    let got = store.get(&s("m")).await.unwrap().unwrap();
    let text = String::from(js_sys::JSON::stringify(&got).unwrap());
    assert!(text.contains(r#""data":{"k":"v"}"#), "{text}");
    assert!(text.contains(r#""nil":null"#), "{text}");
    assert!(!field(&got, "data").is_instance_of::<js_sys::Map>());
}

#[wasm_bindgen_test]
async fn large_numbers_round_trip_exactly_and_bigint_is_refused() {
    let (store, _) = open("c-v2").await;
    let rec = js_sys::Object::new();
    js_sys::Reflect::set(&rec, &"_id".into(), &"n".into()).unwrap();
    let two63 = 2f64.powi(63);
    js_sys::Reflect::set(&rec, &"big".into(), &JsValue::from_f64(two63)).unwrap();
    js_sys::Reflect::set(&rec, &"frac".into(), &JsValue::from_f64(0.1 + 0.2)).unwrap();
    store.put(&rec.clone().into()).await.unwrap();
    let got = store.get(&s("n")).await.unwrap().unwrap();
    assert_eq!(field(&got, "big").as_f64(), Some(two63));
    assert_eq!(field(&got, "frac").as_f64(), Some(0.1 + 0.2));

    let b = js_sys::Object::new();
    js_sys::Reflect::set(&b, &"_id".into(), &"b".into()).unwrap();
    let bigint = js_sys::BigInt::new(&JsValue::from_str("9007199254740993")).unwrap();
    js_sys::Reflect::set(&b, &"v".into(), &bigint).unwrap();
    let e = store.put(&b.into()).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::Validation);
    assert!(e.to_string().contains("BigInt"), "{e}");
    assert!(store.get(&s("b")).await.unwrap().is_none());
}

/// JSON has no negative zero: -0 is stored as 0 at any depth, so what `get`
/// returns is what an export/import round trip gives back, and a record that
/// differs only by the sign of a zero has the same body (the same digest).
#[wasm_bindgen_test]
async fn negative_zero_is_stored_as_zero_so_get_and_a_snapshot_round_trip_agree() {
    let (store, _) = open("negzero").await;
    let rec = js_sys::Object::new();
    let nested = js_sys::Object::new();
    let list = js_sys::Array::new();
    list.push(&JsValue::from_f64(-0.0));
    js_sys::Reflect::set(&nested, &"list".into(), &list).unwrap();
    js_sys::Reflect::set(&rec, &"_id".into(), &"z".into()).unwrap();
    js_sys::Reflect::set(&rec, &"top".into(), &JsValue::from_f64(-0.0)).unwrap();
    js_sys::Reflect::set(&rec, &"nested".into(), &nested).unwrap();
    store.put(&rec.clone().into()).await.unwrap();
    let is_plus_zero = |v: JsValue| js_sys::Object::is(&v, &JsValue::from_f64(0.0));
    // the caller's object is not touched
    assert!(js_sys::Object::is(
        &js_sys::Reflect::get(&rec, &"top".into()).unwrap(),
        &JsValue::from_f64(-0.0)
    ));
    let got = store.get(&s("z")).await.unwrap().unwrap();
    assert!(
        is_plus_zero(field(&got, "top")),
        "top-level -0 is stored as 0"
    );
    let inner = js_sys::Reflect::get(&field(&got, "nested"), &"list".into()).unwrap();
    assert!(
        is_plus_zero(js_sys::Reflect::get_u32(&inner, 0).unwrap()),
        "nested -0 is stored as 0"
    );

    let text = store.export_snapshot().await.unwrap();
    let (copy, _) = open("negzero-copy").await;
    copy.import_snapshot(text.as_str(), None).await.unwrap();
    let back = copy.get(&s("z")).await.unwrap().unwrap();
    assert_eq!(
        js_sys::JSON::stringify(&back).unwrap(),
        js_sys::JSON::stringify(&got).unwrap()
    );
    assert!(is_plus_zero(field(&back, "top")));
    assert_eq!(field_str(&back, "_rev"), field_str(&got, "_rev"));
}

/// A generation near 2^53 keeps counting exactly and stops at 2^53 − 1.
#[wasm_bindgen_test]
async fn generation_near_max_safe_integer_is_never_rounded() {
    let (store, _) = open("gen").await;
    let snap = "{\"agentstore\":\"snapshot\",\"version\":1,\"records\":1,\"tombstones\":0}\n{\"_id\":\"g\",\"_rev\":\"9007199254740990-ab\",\"updatedAt\":\"2026-03-01T08:27:12.804Z\"}\n";
    store.import_snapshot(snap, None).await.unwrap();
    let w = store
        .put(&js(json!({"_id": "g", "_rev": "9007199254740990-ab"})))
        .await
        .unwrap();
    assert!(w.rev.starts_with("9007199254740991-"), "{}", w.rev);
    let e = store
        .put(&js(json!({"_id": "g", "_rev": w.rev})))
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::Validation);
    assert!(store.get(&s("g")).await.unwrap().is_some());
}

#[wasm_bindgen_test]
async fn snapshot_export_then_import_reproduces_records_and_tombstones() {
    let (a, _) = open("snap-a").await;
    a.put(&js(json!({"_id": "x", "v": 1}))).await.unwrap();
    let r = a.put(&js(json!({"_id": "y", "v": 2}))).await.unwrap().rev;
    a.delete(&s("y"), &s(&r)).await.unwrap();
    let text = a.export_snapshot().await.unwrap();
    let (b, _) = open("snap-b").await;
    let c = b.import_snapshot(&text, None).await.unwrap();
    assert_eq!(c.written, 2);
    assert_eq!(b.export_snapshot().await.unwrap(), text);
    // a stale write against the imported tombstone still conflicts
    assert_eq!(
        b.put(&js(json!({"_id": "y", "_rev": r})))
            .await
            .unwrap_err()
            .code(),
        ErrorCode::Conflict
    );
    // importing again writes nothing: local revisions are equal
    assert_eq!(b.import_snapshot(&text, None).await.unwrap().written, 0);
}

/// Errors reaching JS are real `Error`s with name, code and status.
#[wasm_bindgen_test]
async fn js_errors_carry_name_code_status_and_the_stored_record() {
    let store = agentstore::AgentStore::from_store(open("jserr").await.0);
    let first = wasm_bindgen_futures::JsFuture::from(store.put(js(json!({"_id": "e", "v": 1}))))
        .await
        .unwrap();
    let _ = first;
    let err = wasm_bindgen_futures::JsFuture::from(store.put(js(json!({"_id": "e", "v": 2}))))
        .await
        .unwrap_err();
    assert!(err.is_instance_of::<js_sys::Error>());
    assert_eq!(field_str(&err, "name").as_deref(), Some("ConflictError"));
    assert_eq!(field_str(&err, "code").as_deref(), Some("conflict"));
    assert_eq!(field(&err, "status").as_f64(), Some(409.0));
    assert_eq!(field_str(&err, "id").as_deref(), Some("e"));
    assert!(field(&err, "expectedRev").is_null());
    assert_eq!(field(&field(&err, "current"), "v").as_f64(), Some(1.0));
    let err = wasm_bindgen_futures::JsFuture::from(store.get(JsValue::from(5)))
        .await
        .unwrap_err();
    assert_eq!(field_str(&err, "name").as_deref(), Some("ValidationError"));
}

/// The objects the store makes (a write's `{id, rev}`, an Error's fields,
/// a refused record's walk failure) keep every field when
/// `Object.prototype` has an accessor without a setter of that name (a
/// page's polyfill or pollution). Before, the store assigned them
/// (`[[Set]]`), which such an accessor swallows: `put` answered `{rev}`
/// with no `id`, a ConflictError had no `code`, and the walk's own failure
/// threw a TypeError in place of the ValidationError.
#[wasm_bindgen_test]
async fn objects_the_store_makes_keep_their_fields_under_prototype_getters() {
    let store = agentstore::AgentStore::from_store(open("protoget").await.0);
    let _getters = PrototypeGetters::install(&[
        "id",
        "rev",
        "name",
        "code",
        "status",
        "expectedRev",
        "currentRev",
        "path",
        "detail",
    ]);
    let put = |v: serde_json::Value| wasm_bindgen_futures::JsFuture::from(store.put(js(v)));
    let done = put(json!({"_id": "p", "v": 1})).await.unwrap();
    assert_eq!(own(&done, "id").as_string().as_deref(), Some("p"));
    assert!(own(&done, "rev")
        .as_string()
        .is_some_and(|r| r.starts_with("1-")));
    let err = put(json!({"_id": "p", "v": 2})).await.unwrap_err();
    assert_eq!(
        own(&err, "name").as_string().as_deref(),
        Some("ConflictError")
    );
    assert_eq!(own(&err, "code").as_string().as_deref(), Some("conflict"));
    assert_eq!(own(&err, "status").as_f64(), Some(409.0));
    assert_eq!(own(&err, "id").as_string().as_deref(), Some("p"));
    assert_eq!(own(&err, "currentRev"), own(&done, "rev"));
    let bad = js_fn(
        "",
        "return { _id: 'b', deep: { n: 10n } };",
        &JsValue::UNDEFINED,
    );
    let err = wasm_bindgen_futures::JsFuture::from(store.put(bad))
        .await
        .unwrap_err();
    assert_eq!(
        own(&err, "name").as_string().as_deref(),
        Some("ValidationError")
    );
    assert_eq!(own(&err, "code").as_string().as_deref(), Some("validation"));
}

/// The revision of a create is `Rev::next(None, [md5(canonical body),
/// updatedAt])`, and the browser's canonical body must be the text the
/// protocol crate writes natively (`canonical_body`: keys in UTF-8 byte
/// order, serde_json's escapes). Each case is a body where a JavaScript
/// serialisation would differ if done naively: keys past U+FFFF (UTF-16 order
/// differs from UTF-8 order), escapes, nesting, integers up to 2^53, a lone
/// surrogate (a Rust string holds U+FFFD), a field set to `undefined`
/// (absent, as in JSON).
#[wasm_bindgen_test]
async fn the_body_digest_is_the_native_canonical_digest() {
    use agentstore_protocol::canonical::BodyDigest;
    use agentstore_protocol::record::canonical_body;
    use agentstore_protocol::rev::Rev;
    const AT: &str = "2026-03-01T08:27:12.804Z";
    let (store, _) = open("digest").await;
    // (the record as JS source, the same body natively)
    let cases: Vec<(&str, serde_json::Value)> = vec![
        (
            r#"({"_id":"k","\u{E000}":1,"\u{1F600}":2,"a":3,"Z":4,"\u00e9":5,"\uFFFF":6})"#,
            json!({"_id":"k","\u{E000}":1,"\u{1F600}":2,"a":3,"Z":4,"\u{e9}":5,"\u{FFFF}":6}),
        ),
        (
            r#"({"_id":"e","s":"q\"b\\s\n\t\r\b\f\u0001\u001f\u007f\u2028/\u{1F600}"})"#,
            json!({"_id":"e","s":"q\"b\\s\n\t\r\u{8}\u{c}\u{1}\u{1f}\u{7f}\u{2028}/\u{1F600}"}),
        ),
        (
            r#"({"_id":"n","a":[1,-42,9007199254740992,-9007199254740992,0.5,-1.25,6.125,[],{}],"o":{"z":null,"y":true,"x":false,"w":{"v":[{"u":"t"}]}}})"#,
            json!({"_id":"n","a":[1,-42,9007199254740992_i64,-9007199254740992_i64,0.5,-1.25,6.125,[],{}],"o":{"z":null,"y":true,"x":false,"w":{"v":[{"u":"t"}]}}}),
        ),
        (
            r#"({"_id":"u","gone":undefined,"kept":{"also":undefined,"here":1},"recordType":"agent"})"#,
            json!({"_id":"u","kept":{"here":1},"recordType":"agent"}),
        ),
    ];
    for (source, native) in cases {
        let record = js_sys::eval(source).unwrap();
        js_sys::Reflect::set(&record, &"updatedAt".into(), &AT.into()).unwrap();
        let written = store.put(&record).await.unwrap();
        let mut body = BodyDigest::new();
        body.raw(canonical_body(native.as_object().unwrap()).as_bytes());
        let digest = body.finish();
        let expected = Rev::next(None, &[&digest, AT]).unwrap().text();
        assert_eq!(written.rev, expected, "{source}");
    }
    // Lone surrogates (serde_json cannot hold them): digested as the
    // `\udxxx` escapes `JSON.stringify` writes, so a body with a lone
    // surrogate and one with U+FFFD in its place get different revisions
    // (before, both were digested as U+FFFD). Keys sort by their UTF-8 bytes
    // with lone surrogates counted as U+FFFD.
    for (source, canonical) in [
        (
            r#"({"_id":"l","s":"a\ud800b","t":"\udc00","\ud800k":1})"#,
            r#"{"_id":"l","s":"a\ud800b","t":"\udc00","\ud800k":1}"#,
        ),
        (
            r#"({"_id":"m","s":"a\ufffdb","t":"\ufffd","\ufffdk":1})"#,
            "{\"_id\":\"m\",\"s\":\"a\u{FFFD}b\",\"t\":\"\u{FFFD}\",\"\u{FFFD}k\":1}",
        ),
        (
            r#"({"_id":"p","\udc00":1,"\ud800":2})"#,
            r#"{"_id":"p","\ud800":2,"\udc00":1}"#,
        ),
    ] {
        let record = js_sys::eval(source).unwrap();
        js_sys::Reflect::set(&record, &"updatedAt".into(), &AT.into()).unwrap();
        let written = store.put(&record).await.unwrap();
        let mut body = BodyDigest::new();
        body.raw(canonical.as_bytes());
        let expected = Rev::next(None, &[&body.finish(), AT]).unwrap().text();
        assert_eq!(written.rev, expected, "{source}");
    }
}

/// The walk keeps the order of the key list it last sorted at each depth,
/// and the JSON text of the keys it wrote (js/walk.js `orderOf`, `keyJSON`):
/// a record must still get the native canonical digest whatever shapes came
/// before it — the same keys in another order, one key more or less, one key
/// renamed, a nested object of another shape at the same depth in between,
/// objects inside arrays, keys that need escapes — in one batch and in
/// single puts one after another.
#[wasm_bindgen_test]
async fn the_body_digest_is_the_native_one_whatever_shapes_came_before() {
    use agentstore_protocol::canonical::BodyDigest;
    use agentstore_protocol::record::canonical_body;
    use agentstore_protocol::rev::Rev;
    const AT: &str = "2026-03-01T08:27:12.804Z";
    let (store, _) = open("shapes").await;
    let sources = [
        r#"{"_id":"s0","b":1,"a":2,"o":{"y":1,"x":2}}"#,
        r#"{"_id":"s1","a":2,"b":1,"o":{"x":2,"y":1}}"#,
        r#"{"_id":"s2","b":1,"a":2,"o":{"y":1,"x":2}}"#,
        r#"{"_id":"s3","b":1,"a":2,"c":0,"o":{"y":1,"x":2,"w":3}}"#,
        r#"{"_id":"s4","b":1,"a":2}"#,
        r#"{"_id":"s5","b":1,"A":2,"o":{"y":1,"X":2}}"#,
        r#"{"_id":"s6","b":1,"a":2,"o":{"p":{"z":1,"m":2}},"q":{"y":1,"x":2}}"#,
        r#"{"_id":"s7","l":[{"y":1,"x":2},{"x":2,"y":1},{"y":1,"x":2,"v":0}],"b":1,"a":2}"#,
        r#"{"_id":"s8","q\"k":1,"\\":2,"😀":3,"":4,"b":1}"#,
        r#"{"_id":"s9","":4,"😀":3,"\\":2,"q\"k":1,"b":1}"#,
    ];
    let expected = |source: &str| {
        let native: serde_json::Value = serde_json::from_str(source).unwrap();
        let mut body = BodyDigest::new();
        body.raw(canonical_body(native.as_object().unwrap()).as_bytes());
        Rev::next(None, &[&body.finish(), AT]).unwrap().text()
    };
    let record = |source: &str| {
        let r = js_sys::JSON::parse(source).unwrap();
        js_sys::Reflect::set(&r, &"updatedAt".into(), &AT.into()).unwrap();
        r
    };
    // Twice over, so every record also follows every other shape.
    let batch = js_sys::Array::new();
    for round in 0..2 {
        for s in sources {
            let s = s.replace("\"_id\":\"s", &format!("\"_id\":\"b{round}s"));
            batch.push(&record(&s));
        }
    }
    let written = store.put_many(&batch).await.unwrap();
    let mut n = 0;
    for round in 0..2 {
        for s in sources {
            let s = s.replace("\"_id\":\"s", &format!("\"_id\":\"b{round}s"));
            assert_eq!(written[n].rev, expected(&s), "in a batch: {s}");
            n += 1;
        }
    }
    // Single puts, in order and then in reverse (each its own id).
    for (pass, list) in [
        (0, sources.to_vec()),
        (1, sources.iter().rev().copied().collect()),
    ] {
        for s in list {
            let s = s.replace("\"_id\":\"s", &format!("\"_id\":\"p{pass}s"));
            let w = store.put(&record(&s)).await.unwrap();
            assert_eq!(w.rev, expected(&s), "one put: {s}");
            let got = store.get(&w.id.into()).await.unwrap().unwrap();
            let rev = js_sys::Reflect::get(&got, &"_rev".into()).unwrap();
            assert_eq!(rev.as_string().unwrap(), expected(&s), "stored: {s}");
        }
    }
}
