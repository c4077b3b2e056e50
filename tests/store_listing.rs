//! Exact prefix listing (`list`, `listBy`, `count`), keyset paging, and the PouchDB dump import.
// Tests may read and call the page's values with js-sys directly: a slot
// kept by a throw lasts only for the test page (clippy.toml).
#![allow(clippy::disallowed_methods)]

use agentstore::store::{ListQuery, LIST_KEYS};
use serde_json::{json, Value};
use std::collections::HashSet;
use wasm_bindgen::JsValue;
use wasm_bindgen_test::*;

mod common;
use common::*;

wasm_bindgen_test_configure!(run_in_browser);

fn u(s: &str) -> Vec<u16> {
    s.encode_utf16().collect()
}

#[wasm_bindgen_test]
async fn prefix_listing_is_exact_on_neighbouring_prefixes() {
    let (store, _) = open("c-l1").await;
    for id in [
        "user_111",
        "user1_a",
        "agent-system:x",
        "agent-system-legacy:y",
        "agent-systems:z",
        "agent-system;w",
    ] {
        store.put(&js(json!({"_id": id}))).await.unwrap();
    }
    assert_eq!(all_ids(&store, "user1_", 10).await, vec!["user1_a"]);
    assert_eq!(all_ids(&store, "user_", 10).await, vec!["user_111"]);
    assert_eq!(
        all_ids(&store, "agent-system:", 10).await,
        vec!["agent-system:x"]
    );
    assert_eq!(all_ids(&store, "", 100).await.len(), 6);
}

#[wasm_bindgen_test]
async fn keys_beyond_the_bmp_list_in_utf16_order_and_page_once_each() {
    let (store, _) = open("c-l2").await;
    let ids = [
        "a/\u{FF61}",
        "a/\u{1F600}",
        "a/\u{FFFF}",
        "a/\u{10FFFF}",
        "a/zz",
        "a0",
        "a.",
    ];
    for id in ids {
        store.put(&js(json!({"_id": id}))).await.unwrap();
    }
    let mut want: Vec<Vec<u16>> = ids[..5].iter().map(|s| u(s)).collect();
    want.sort();
    assert_eq!(want[1][2], 0xD83D, "astral keys sort before U+FF61");
    for limit in [1, 2, 100] {
        assert_eq!(
            all_id_units(&store, &u("a/"), limit, false).await,
            want,
            "limit {limit}"
        );
        let mut rev = want.clone();
        rev.reverse();
        assert_eq!(
            all_id_units(&store, &u("a/"), limit, true).await,
            rev,
            "descending limit {limit}"
        );
    }
    // A prefix ending in U+FFFF and a key holding a lone surrogate.
    store.put(&js(json!({"_id": "a/\u{FFFF}x"}))).await.unwrap();
    let lone = agentstore::value::from_units(&[0x61, 0x2F, 0xD800]);
    let rec = js_sys::Object::new();
    js_sys::Reflect::set(&rec, &"_id".into(), &lone).unwrap();
    store.put(&rec.into()).await.unwrap();
    let got = all_id_units(&store, &u("a/\u{FFFF}"), 1, false).await;
    assert_eq!(got, vec![u("a/\u{FFFF}"), u("a/\u{FFFF}x")]);
    let got = all_id_units(&store, &u("a/"), 1, false).await;
    assert_eq!(got.len(), 7);
    assert!(
        got.contains(&vec![0x61, 0x2F, 0xD800]),
        "lone-surrogate key survives cursors"
    );
}

#[wasm_bindgen_test]
async fn list_by_type_pages_within_the_type_and_prefix() {
    let (store, _) = open("bytype").await;
    let mut recs = Vec::new();
    for i in 0..30 {
        let t = if i % 3 == 0 { "run" } else { "agent" };
        recs.push(json!({"_id": format!("p:{i:03}"), "recordType": t}));
    }
    recs.push(json!({"_id": "q:1", "recordType": "run"}));
    recs.push(json!({"_id": "q:2", "recordType": "runs"}));
    store.put_many(&js(Value::Array(recs))).await.unwrap();
    let mut q = ListQuery {
        prefix: u("p:"),
        record_type: Some("run".into()),
        limit: 3,
        ..Default::default()
    };
    let mut seen = Vec::new();
    loop {
        let page = store.list(&q).await.unwrap();
        for r in page.records.iter() {
            assert_eq!(field_str(&r, "recordType").as_deref(), Some("run"));
            seen.push(field_str(&r, "_id").unwrap());
        }
        match page.next {
            Some(n) => q.after = Some(agentstore_protocol::keys::decode_cursor(&n).unwrap()),
            None => break,
        }
    }
    let want: Vec<String> = (0..30)
        .filter(|i| i % 3 == 0)
        .map(|i| format!("p:{i:03}"))
        .collect();
    assert_eq!(seen, want);
    let all_runs = ListQuery {
        record_type: Some("run".into()),
        limit: 100,
        descending: true,
        ..Default::default()
    };
    let page = store.list(&all_runs).await.unwrap();
    assert_eq!(
        page.records.length(),
        11,
        "type equality does not match 'runs'"
    );
    assert_eq!(
        field_str(&page.records.get(0), "_id").as_deref(),
        Some("q:1")
    );
}

/// Paging 2,000 records with limit 7 while another writer inserts (and
/// updates) visits every pre-existing record exactly once.
#[wasm_bindgen_test]
async fn paging_while_another_writer_inserts_visits_each_record_once() {
    let (store, name) = open("paging").await;
    let recs: Vec<Value> = (0..2000)
        .map(|i| json!({"_id": format!("r:{:05}", i * 2), "i": i}))
        .collect();
    store.put_many(&js(Value::Array(recs))).await.unwrap();
    let writer = open_named(&name).await;
    let mut q = ListQuery {
        prefix: u("r:"),
        limit: 7,
        ..Default::default()
    };
    let mut seen = Vec::new();
    let mut n = 0;
    loop {
        // Interleave: a concurrent insert between existing keys, before and after the cursor.
        let rec = js(json!({"_id": format!("r:{:05}", (n * 37 % 4000) | 1)}));
        let ins = writer.put(&rec);
        let page = store.list(&q);
        let (ins, page) = futures::join!(ins, page);
        ins.unwrap();
        let page = page.unwrap();
        for r in page.records.iter() {
            seen.push(field_str(&r, "_id").unwrap());
        }
        n += 1;
        match page.next {
            Some(c) => q.after = Some(agentstore_protocol::keys::decode_cursor(&c).unwrap()),
            None => break,
        }
    }
    let even: Vec<&String> = seen
        .iter()
        .filter(|id| id[2..].parse::<u32>().unwrap() % 2 == 0)
        .collect();
    assert_eq!(even.len(), 2000, "every pre-existing record exactly once");
    let uniq: HashSet<&String> = seen.iter().collect();
    assert_eq!(uniq.len(), seen.len(), "no record repeated");
    let mut sorted = seen.clone();
    sorted.sort();
    assert_eq!(sorted, seen, "pages stay in key order");
}

#[wasm_bindgen_test]
async fn a_cursor_not_made_by_list_is_a_validation_error() {
    let (store, _) = open("cursor").await;
    let bad = js(json!({"after": "xyz"}));
    assert!(ListQuery::from_js(&bad, LIST_KEYS).is_err());
    let bad = js(json!({"limit": 0}));
    assert!(ListQuery::from_js(&bad, LIST_KEYS).is_err());
    let ok = ListQuery::from_js(&JsValue::UNDEFINED, LIST_KEYS).unwrap();
    assert_eq!(store.list(&ok).await.unwrap().records.length(), 0);
}

/// A page's `next` belongs to its prefix: given to a listing of another
/// prefix it is a ValidationError (before, a cursor below the prefix started
/// the listing again and one above it gave an empty last page), as `listBy`
/// refuses another index's cursor. A cursor of the whole store's listing
/// pages a prefix it falls in.
#[wasm_bindgen_test]
async fn a_cursor_of_another_prefix_is_a_validation_error() {
    let (store, name) = open("cursor-prefix").await;
    let ids = ["a:1", "a:2", "b:1", "b:2", "c:1"];
    store
        .put_many(&js(json!(ids.map(|id| json!({ "_id": id })))))
        .await
        .unwrap();
    let api: JsValue = agentstore::AgentStore::from_store(open_named(&name).await).into();
    let list = |o: Value| {
        let api = api.clone();
        async move { invoke(&api, "list", &[js(o)]).await }
    };
    let next = |page: &JsValue| js_sys::Reflect::get(page, &"next".into()).unwrap();
    let a = list(json!({"prefix": "a:", "limit": 1})).await.unwrap();
    let all = list(json!({"limit": 3})).await.unwrap();
    for (cursor, prefix) in [(next(&a), "b:"), (next(&a), "a:2"), (next(&all), "a:")] {
        let mut o = json!({"prefix": prefix});
        o["after"] = Value::String(cursor.as_string().unwrap());
        let e = list(o).await.unwrap_err();
        assert_eq!(error_kind(&e).0, "ValidationError", "{prefix}");
    }
    // The whole listing's cursor after "b:1" pages "b" on.
    let mut o = json!({"prefix": "b"});
    o["after"] = Value::String(next(&all).as_string().unwrap());
    let page = list(o).await.unwrap();
    let records = js_sys::Reflect::get(&page, &"records".into()).unwrap();
    let got: Vec<String> = js_sys::Array::from(&records)
        .iter()
        .map(|r| field_str(&r, "_id").unwrap())
        .collect();
    assert_eq!(got, ["b:2"]);
}

const DUMP: &str = include_str!("../www/data/agent-records.pouchdump.ndjson");
const EXPECTED: &str = include_str!("../www/data/agent-records.expected.json");

/// The shared real PouchDB dump: stored revisions and fields equal PouchDB's
/// own answers; tombstones are not listed; prefix listing is exact.
#[wasm_bindgen_test]
async fn pouchdb_dump_import_matches_pouchdb_answers() {
    let (store, _) = open("pouch").await;
    let calls = std::rc::Rc::new(std::cell::Cell::new(0u32));
    let c2 = calls.clone();
    let cb = wasm_bindgen::closure::Closure::<dyn FnMut(u32, u32)>::new(move |_d: u32, _t: u32| {
        c2.set(c2.get() + 1)
    });
    let (summary, counts, _legacy) = store
        .import_pouch_dump(
            DUMP,
            "agent-index",
            Some(wasm_bindgen::JsCast::unchecked_ref(cb.as_ref())),
        )
        .await
        .unwrap();
    assert!(calls.get() > 1, "progress reported");
    let expected: Value = serde_json::from_str(EXPECTED).unwrap();
    let live = expected["live"].as_object().unwrap();
    let deleted: Vec<&str> = expected["deleted"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(summary.live as usize, live.len());
    assert_eq!(summary.tombstones as usize, deleted.len());
    assert_eq!(summary.local_skipped, 0);
    assert_eq!(counts.written as usize, live.len() + deleted.len());
    for (id, e) in live {
        let got = store
            .get(&s(id))
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{id} missing"));
        assert_eq!(
            field_str(&got, "_rev").as_deref(),
            e["rev"].as_str(),
            "{id}"
        );
        assert_eq!(
            field_str(&got, "recordType").as_deref(),
            e["recordType"].as_str(),
            "{id}"
        );
        assert_eq!(
            field_str(&got, "updatedAt").as_deref(),
            e["updatedAt"].as_str(),
            "{id}"
        );
    }
    for id in &deleted {
        assert!(
            store.get(&s(id)).await.unwrap().is_none(),
            "{id} is a tombstone"
        );
        // a stale write cannot resurrect it
        let e = store
            .put(&js(json!({"_id": id, "_rev": "1-00"})))
            .await
            .unwrap_err();
        assert_eq!(e.code(), agentstore_protocol::ErrorCode::Conflict);
    }
    let prefix = expected["prefix"].as_str().unwrap();
    let mut want: Vec<&String> = live.keys().filter(|k| k.starts_with(prefix)).collect();
    want.sort_by_key(|k| k.encode_utf16().collect::<Vec<u16>>());
    let got = all_ids(&store, prefix, 250).await;
    assert_eq!(got.iter().collect::<Vec<_>>(), want);
    for neighbour in ["agent-system-legacy:", "agent-systems:", "agent-system;"] {
        assert!(
            live.keys().any(|k| k.starts_with(neighbour)),
            "the dump has {neighbour} ids"
        );
        assert!(got.iter().all(|k| !k.starts_with(neighbour)));
    }
    assert!(deleted.iter().all(|d| !got.iter().any(|g| g == d)));
    // A second import writes nothing: every local revision is already equal.
    let (_, again, _) = store
        .import_pouch_dump(DUMP, "agent-index", None)
        .await
        .unwrap();
    assert_eq!(again.written, 0);
}

#[wasm_bindgen_test]
async fn a_malformed_dump_writes_nothing() {
    let (store, _) = open("pouch-bad").await;
    let bad = format!("{}\n{{\"docs\":[{{\"_id\":\"ok\",\"_rev\":\"1-aa\"}}]}}\n{{\"docs\":[{{\"_id\":\"x\",\"_rev\":\"nope\"}}]}}\n", DUMP.lines().next().unwrap());
    let e = store
        .import_pouch_dump(&bad, "agent-index", None)
        .await
        .unwrap_err();
    assert_eq!(e.code(), agentstore_protocol::ErrorCode::Validation);
    assert!(e.to_string().contains("line 3"), "{e}");
    assert!(store.get(&s("ok")).await.unwrap().is_none());
}

/// Records whose `_id`, `recordType` and `label` are made of pieces that
/// sort unlike their code points under UTF-16 order: U+FFFF, astral
/// characters (surrogate pairs, U+10FFFF's included), a lone high surrogate,
/// U+FF61. `label` is a number on every 13th record (no string prefix may
/// match it). Built in JS: a lone surrogate is no Rust `String`.
const ODD_KEYS_JS: &str = "
    const pieces = ['a', '\\uFFFF', '\\uD83D\\uDE00', '\\uFF61', '\\uD83D', '\\uDBFF\\uDFFF'];
    const upTo = (n) => {
      let all = [''], last = [''];
      for (let k = 0; k < n; k++) {
        last = last.flatMap((s) => pieces.map((p) => s + p));
        all = all.concat(last);
      }
      return all;
    };
    const ids = upTo(3), types = upTo(2);
    return ids.map((v, i) => ({
      _id: v + '/' + i,
      recordType: types[(i * 11) % types.length],
      label: i % 13 === 0 ? i : types[(i * 5) % types.length],
      updatedAt: new Date(Date.UTC(2026, 0, 1) + ((i * 7919) % 1000) * 1000).toISOString(),
    }));";

/// Prefixes ending in, or made of, U+FFFF units, astral characters, half of
/// one (a lone high surrogate), and ones nothing starts with.
const ODD_PREFIXES_JS: &str =
    "return ['', 'a', '\\uFFFF', '\\uFFFF\\uFFFF', 'a\\uFFFF', 'a\\uFFFF\\uFFFF',
    '\\uD83D', '\\uD83D\\uDE00', 'a\\uD83D\\uDE00', '\\uD83D\\uDE00\\uFFFF', '\\uFFFF\\uD83D',
    '\\uFFFF\\uD83D\\uDE00', '\\uDBFF', '\\uDBFF\\uDFFF', '\\uDBFF\\uDFFF\\uFFFF', '\\uFF61',
    '\\uFF61\\uFFFF', 'b', '\\uFFFE', '\\uFFFF\\uFFFF\\uFFFF\\uFFFF'];";

/// What a prefix query must answer, computed from the records in JS (not
/// by the store): the ids of `records` whose field `key` is a string that
/// `startsWith(prefix)`, in IndexedDB's order of `[value, ...then, _id]`.
const EXPECTED_BY_JS: &str = "
    const sortKey = (r) => [r[key], ...then.map((k) => r[k]), r._id];
    return records
      .filter((r) => typeof r[key] === 'string' && r[key].startsWith(prefix))
      .sort((x, y) => indexedDB.cmp(sortKey(x), sortKey(y)))
      .map((r) => r._id);";

fn units_of(v: &JsValue) -> Vec<u16> {
    agentstore::value::units(&js_sys::JsString::from(v.clone()))
}

/// Every id `listBy(index, {prefix})` lists, paging with `limit`.
async fn by_prefix(
    store: &agentstore::store::Store,
    index: &str,
    prefix: &JsValue,
    limit: u32,
    descending: bool,
) -> Vec<Vec<u16>> {
    let mut out = Vec::new();
    let mut after = JsValue::UNDEFINED;
    loop {
        let o = js_sys::Object::new();
        js_sys::Reflect::set(&o, &"prefix".into(), prefix).unwrap();
        js_sys::Reflect::set(&o, &"limit".into(), &limit.into()).unwrap();
        js_sys::Reflect::set(&o, &"descending".into(), &descending.into()).unwrap();
        js_sys::Reflect::set(&o, &"after".into(), &after).unwrap();
        let q = agentstore::store::ByQuery::from_js(&o).expect("query");
        let page = store.list_by(index, &q).await.expect("listBy");
        out.extend(page.records.iter().map(|r| units_of(&field(&r, "_id"))));
        match page.next {
            Some(n) => after = JsValue::from_str(&n),
            None => return out,
        }
    }
}

/// `listBy(index, {prefix})` on two derived indexes (`byType` over
/// `recordType, updatedAt`; `byLabel` over a `label` that is sometimes a
/// number), both from its entries and while it is not built yet (answered
/// from the records), ascending and descending, in pages of 5 and in one,
/// lists exactly the records whose value `startsWith` the prefix, in index
/// order, for prefixes with trailing U+FFFF units, astral characters and
/// lone surrogates. The expected lists are computed by JS from the records
/// put (`startsWith`, `indexedDB.cmp`).
#[wasm_bindgen_test]
async fn list_by_prefix_is_exact_for_astral_and_ffff_values() {
    let by_label = agentstore_protocol::index::IndexDef {
        name: "byLabel".into(),
        keys: vec!["label".into()],
    };
    let (store, name) = open("by-odd").await;
    let records = js_sys::Function::new_no_args(ODD_KEYS_JS)
        .call0(&JsValue::NULL)
        .unwrap();
    store.put_many(&records).await.unwrap();
    // A second connection declaring `byLabel` too: not built yet, it is
    // answered from the records; then built, from its entries.
    let both = agentstore::store::Store::open(&name, 2000, None, vec![by_type(), by_label])
        .await
        .unwrap();
    let prefixes = js_sys::Array::from(
        &js_sys::Function::new_no_args(ODD_PREFIXES_JS)
            .call0(&JsValue::NULL)
            .unwrap(),
    );
    let expected_by = js_sys::Function::new_with_args("records, key, then, prefix", EXPECTED_BY_JS);
    let expect = |key: &str, then: &[&str], prefix: &JsValue| -> Vec<Vec<u16>> {
        let then: js_sys::Array = then.iter().map(|k| JsValue::from_str(k)).collect();
        let args = js_sys::Array::of4(&records, &key.into(), &then, prefix);
        let ids = expected_by.apply(&JsValue::NULL, &args).unwrap();
        js_sys::Array::from(&ids)
            .iter()
            .map(|v| units_of(&v))
            .collect()
    };
    let mut matched = 0;
    for built in [false, true] {
        if built {
            both.rebuild_indexes(500, false, None, None).await.unwrap();
        }
        for prefix in prefixes.iter() {
            let p = units_of(&prefix);
            for (index, key, then) in [
                ("byType", "recordType", &["updatedAt"][..]),
                ("byLabel", "label", &[][..]),
            ] {
                let want = expect(key, then, &prefix);
                matched += want.len();
                let mut rev = want.clone();
                rev.reverse();
                for limit in [5, 10_000] {
                    let what = format!("{index} built={built} prefix {p:04X?} limit {limit}");
                    assert_eq!(
                        by_prefix(&both, index, &prefix, limit, false).await,
                        want,
                        "{what}"
                    );
                    assert_eq!(
                        by_prefix(&both, index, &prefix, limit, true).await,
                        rev,
                        "{what} descending"
                    );
                }
            }
        }
    }
    assert!(
        matched > 1000,
        "the prefixes match many records ({matched})"
    );
    assert_indexes_clean(&both).await;
}

/// `count({prefix})` and `count({prefix, type})` (the latter counted on the
/// native `[recordType, _id]` index) equal the number of records whose
/// `_id` `startsWith` the prefix (and whose `recordType` is the type), for
/// prefixes with trailing U+FFFF units, astral characters and lone
/// surrogates and every type stored; computed by JS from the records put.
#[wasm_bindgen_test]
async fn count_by_prefix_and_type_is_exact_for_astral_and_ffff_ids() {
    let (store, _) = open("count-odd").await;
    let records = js_sys::Function::new_no_args(ODD_KEYS_JS)
        .call0(&JsValue::NULL)
        .unwrap();
    store.put_many(&records).await.unwrap();
    let prefixes = js_sys::Array::from(
        &js_sys::Function::new_no_args(ODD_PREFIXES_JS)
            .call0(&JsValue::NULL)
            .unwrap(),
    );
    let types = js_sys::Function::new_with_args(
        "records",
        "return [...new Set(records.map((r) => r.recordType))];",
    )
    .call1(&JsValue::NULL, &records)
    .unwrap();
    let expected = js_sys::Function::new_with_args(
        "records, prefix, type",
        "return records.filter((r) => r._id.startsWith(prefix) \
           && (type === undefined || r.recordType === type)).length;",
    );
    let mut counted = 0;
    for prefix in prefixes.iter() {
        let p = units_of(&prefix);
        let want = expected
            .call3(&JsValue::NULL, &records, &prefix, &JsValue::UNDEFINED)
            .unwrap()
            .as_f64()
            .unwrap() as u32;
        assert_eq!(
            store.count(&p, None).await.unwrap(),
            want,
            "prefix {p:04X?}"
        );
        counted += want;
        for t in js_sys::Array::from(&types).iter() {
            let want = expected
                .call3(&JsValue::NULL, &records, &prefix, &t)
                .unwrap()
                .as_f64()
                .unwrap() as u32;
            let ty = js_sys::JsString::from(t.clone());
            assert_eq!(
                store.count(&p, Some(&ty)).await.unwrap(),
                want,
                "prefix {p:04X?} type {:04X?}",
                units_of(&t)
            );
        }
    }
    assert!(counted > 300, "the prefixes match many ids ({counted})");
}
