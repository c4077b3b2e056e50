//! Helpers shared by the browser suites (each `tests/*.rs` is its own page).
#![allow(dead_code)]

use agentstore::store::{ListQuery, Store};
use agentstore::StoreError;
use agentstore_protocol::index::IndexDef;
use agentstore_protocol::ErrorCode;
use js_sys::{JsString, Reflect};
use wasm_bindgen::JsValue;

/// A database name no other test uses.
pub fn fresh_name(tag: &str) -> String {
    format!("t-{tag}-{}", (js_sys::Math::random() * 1e12) as u64)
}

/// The derived index every suite declares: one type, newest first.
pub fn by_type() -> IndexDef {
    IndexDef {
        name: "byType".into(),
        keys: vec!["recordType".into(), "updatedAt".into()],
    }
}

/// Opens database `name` with the `byType` index, built and active.
pub async fn open_named(name: &str) -> Store {
    let store = Store::open(name, 2000, None, vec![by_type()])
        .await
        .expect("open");
    store
        .rebuild_indexes(500, false, None, None)
        .await
        .expect("index build");
    store
}

/// Opens a fresh store.
pub async fn open(tag: &str) -> (Store, String) {
    let name = fresh_name(tag);
    (open_named(&name).await, name)
}

/// Asserts that every derived index is exactly what the records say.
pub async fn assert_indexes_clean(store: &Store) {
    let v = store.verify_indexes().await.expect("verify");
    let n = |x: &Vec<JsValue>| x.len();
    assert_eq!(
        (n(&v.missing), n(&v.orphaned), n(&v.stale), v.building.len()),
        (0, 0, 0, 0),
        "index not clean: missing {:?} orphaned {:?} stale {:?}",
        v.missing,
        v.orphaned,
        v.stale
    );
}

/// A JS object from JSON.
pub fn js(v: serde_json::Value) -> JsValue {
    js_sys::JSON::parse(&v.to_string()).expect("json")
}

pub fn s(v: &str) -> JsValue {
    JsValue::from_str(v)
}

pub fn field(v: &JsValue, k: &str) -> JsValue {
    Reflect::get(v, &k.into()).unwrap_or(JsValue::UNDEFINED)
}

pub fn field_str(v: &JsValue, k: &str) -> Option<String> {
    field(v, k).as_string()
}

pub fn code(e: &StoreError) -> ErrorCode {
    e.code()
}

/// Every live id under `prefix`, paging with `limit`.
pub async fn all_ids(store: &Store, prefix: &str, limit: u32) -> Vec<String> {
    let mut q = ListQuery {
        prefix: prefix.encode_utf16().collect(),
        limit,
        ..Default::default()
    };
    let mut out = Vec::new();
    loop {
        let page = store.list(&q).await.expect("list");
        for r in page.records.iter() {
            out.push(String::from(JsString::from(field(&r, "_id"))));
        }
        match page.next {
            Some(n) => {
                q.after = Some(agentstore_protocol::keys::decode_cursor(&n).expect("cursor"))
            }
            None => return out,
        }
    }
}

/// Ids (as UTF-16 units, exact) of one page walk.
pub async fn all_id_units(
    store: &Store,
    prefix: &[u16],
    limit: u32,
    descending: bool,
) -> Vec<Vec<u16>> {
    let mut q = ListQuery {
        prefix: prefix.to_vec(),
        limit,
        descending,
        ..Default::default()
    };
    let mut out = Vec::new();
    loop {
        let page = store.list(&q).await.expect("list");
        for r in page.records.iter() {
            out.push(agentstore::value::units(&JsString::from(field(&r, "_id"))));
        }
        match page.next {
            Some(n) => {
                q.after = Some(agentstore_protocol::keys::decode_cursor(&n).expect("cursor"))
            }
            None => return out,
        }
    }
}

/// A `watch` callback that records each change as `"id:deleted"`, and the record.
pub fn change_log() -> (
    js_sys::Function,
    std::rc::Rc<std::cell::RefCell<Vec<String>>>,
) {
    let seen = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    let s2 = seen.clone();
    let cb = wasm_bindgen::closure::Closure::<dyn FnMut(JsValue)>::new(move |c: JsValue| {
        s2.borrow_mut().push(format!(
            "{}:{}",
            field_str(&c, "id").unwrap(),
            field(&c, "deleted").as_bool().unwrap()
        ));
    });
    (
        wasm_bindgen::JsCast::unchecked_into(cb.into_js_value()),
        seen,
    )
}

/// Waits until `cond()` holds, polling every 10 ms; panics naming `what` after
/// 30 s (bounded, and generous for a busy machine).
pub async fn wait_for(what: &str, cond: impl Fn() -> bool) {
    let until = js_sys::Date::now() + 30_000.0;
    while !cond() {
        assert!(js_sys::Date::now() < until, "timed out waiting for {what}");
        gloo_timers::future::TimeoutFuture::new(10).await;
    }
}

/// `target[method](...args)` called through JS, as an app calls it, and
/// awaited: the exported methods' JS signatures, whatever the Rust ones.
pub async fn invoke(target: &JsValue, method: &str, args: &[JsValue]) -> Result<JsValue, JsValue> {
    let f: js_sys::Function = Reflect::get(target, &method.into()).expect("method").into();
    let args: js_sys::Array = args.iter().collect();
    let p = f.apply(target, &args)?;
    wasm_bindgen_futures::JsFuture::from(js_sys::Promise::resolve(&p)).await
}

/// A JS function made from `params` and `body`, called with `arg`: returns
/// what the body returns (a callback closing over `arg`).
pub fn js_fn(params: &str, body: &str, arg: &JsValue) -> JsValue {
    js_sys::Function::new_with_args(params, body)
        .call1(&JsValue::NULL, arg)
        .expect("js_fn")
}

/// `(name, code)` of a rejection, which must be a real `Error`.
pub fn error_kind(e: &JsValue) -> (String, String) {
    assert!(
        wasm_bindgen::JsCast::is_instance_of::<js_sys::Error>(e),
        "not an Error: {e:?}"
    );
    (
        field_str(e, "name").unwrap_or_default(),
        field_str(e, "code").unwrap_or_default(),
    )
}

/// An AbortController already aborted with `reason`.
pub fn aborted(reason: &str) -> web_sys::AbortController {
    let c = web_sys::AbortController::new().expect("AbortController");
    c.abort_with_reason(&reason.into());
    c
}

/// Strings of a JS array.
pub fn strings(v: &JsValue) -> Vec<String> {
    js_sys::Array::from(v)
        .iter()
        .map(|x| x.as_string().unwrap_or_default())
        .collect()
}

/// Races `p` (a Promise, or any value) with a bounded wait: `"resolved <v>"`,
/// `"rejected <error name>"`, or `"pending"` when it has not settled in
/// 30 s (a call that never settles fails its test instead of hanging it).
#[allow(dead_code)]
pub async fn settled_within_30s(p: &JsValue) -> String {
    let bounded = js_sys::Function::new_with_args(
        "p",
        "return Promise.race([Promise.resolve(p).then((v) => 'resolved ' + v, (e) => 'rejected ' + (e && e.name)), \
         new Promise((ok) => setTimeout(() => ok('pending'), 30000))]);",
    );
    let raced = bounded.call1(&JsValue::NULL, p).expect("race");
    wasm_bindgen_futures::JsFuture::from(js_sys::Promise::from(raced))
        .await
        .expect("raced")
        .as_string()
        .expect("a string")
}
