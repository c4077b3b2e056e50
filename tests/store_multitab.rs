//! Another connection's upgrade (case C-E1): a polite connection closes and
//! says so; an open blocked by one that refuses fails with BlockedError after
//! its timeout instead of hanging, and leaves nothing open behind.
use agentstore::store::Store;
use agentstore_protocol::ErrorCode;
use serde_json::json;
use std::cell::Cell;
use std::rc::Rc;
use wasm_bindgen::prelude::*;
use wasm_bindgen_test::*;

mod common;
use common::*;

wasm_bindgen_test_configure!(run_in_browser);

/// A raw connection that ignores `versionchange` (an old tab that never closes).
async fn stubborn_connection(name: &str) -> JsValue {
    let open = js_sys::Function::new_with_args(
        "name",
        "return new Promise((ok, err) => { const r = indexedDB.open(name); r.onsuccess = () => ok(r.result); r.onerror = () => err(r.error); });",
    );
    let p: js_sys::Promise = open.call1(&JsValue::NULL, &name.into()).unwrap().into();
    wasm_bindgen_futures::JsFuture::from(p).await.unwrap()
}

#[wasm_bindgen_test]
async fn an_upgrade_from_another_connection_closes_this_one_and_notifies() {
    let name = fresh_name("vc");
    let told = Rc::new(Cell::new(0));
    let t2 = told.clone();
    let cb = Closure::<dyn FnMut()>::new(move || t2.set(t2.get() + 1));
    let old = Store::open(
        &name,
        2000,
        Some(cb.as_ref().unchecked_ref::<js_sys::Function>().clone()),
        vec![],
    )
    .await
    .unwrap();
    old.put(&js(json!({"_id": "kept"}))).await.unwrap();
    // A newer release opens at version 2: it succeeds because `old` closes.
    let newer = Store::open_versioned(&name, 2, 1000, None, vec![])
        .await
        .unwrap();
    assert_eq!(told.get(), 1, "onVersionChange called once");
    let closed = old.get(&s("kept")).await.unwrap_err();
    assert_eq!(closed.code(), ErrorCode::Closed);
    // A close() after the upgrade closed it (an onVersionChange that closes
    // the store) keeps the reason that says why.
    old.close();
    let closed = old.get(&s("kept")).await.unwrap_err();
    assert!(
        closed.message().contains("another tab"),
        "{}",
        closed.message()
    );
    assert!(
        newer.get(&s("kept")).await.unwrap().is_some(),
        "data survives the upgrade"
    );
}

#[wasm_bindgen_test]
async fn an_open_blocked_by_a_connection_that_refuses_to_close_fails_after_its_timeout() {
    let name = fresh_name("blocked");
    // Errors thrown into the page by callbacks (an abandoned open's
    // `upgradeneeded` calling a dropped closure was one).
    js_sys::Function::new_no_args(
        "globalThis.__uncaught = []; addEventListener('error', e => __uncaught.push(String(e.message)));",
    )
    .call0(&JsValue::NULL)
    .unwrap();
    drop(Store::open(&name, 2000, None, vec![]).await.unwrap());
    let stubborn = stubborn_connection(&name).await;
    let started = js_sys::Date::now();
    let e = match Store::open_versioned(&name, 2, 300, None, vec![]).await {
        Err(e) => e,
        Ok(_) => panic!("the open must not succeed while blocked"),
    };
    let waited = js_sys::Date::now() - started;
    assert_eq!(e.code(), ErrorCode::Blocked);
    assert_eq!(
        e.to_js().dyn_into::<js_sys::Error>().unwrap().name(),
        "BlockedError"
    );
    assert!(
        waited >= 290.0,
        "gave up only after the timeout ({waited} ms)"
    );
    // The old tab finally closes: the abandoned upgrade completes and closes
    // itself, so it blocks nobody; a new open at version 3 goes through.
    js_sys::Reflect::get(&stubborn, &"close".into())
        .unwrap()
        .unchecked_into::<js_sys::Function>()
        .call0(&stubborn)
        .unwrap();
    // The open itself waits (bounded) until no connection blocks it any more.
    let later = Store::open_versioned(&name, 3, 30_000, None, vec![])
        .await
        .unwrap();
    later.put(&js(json!({"_id": "after"}))).await.unwrap();
    let uncaught = js_sys::Reflect::get(&js_sys::global(), &"__uncaught".into()).unwrap();
    assert_eq!(
        js_sys::Array::from(&uncaught).length(),
        0,
        "no uncaught error when the abandoned upgrade finally runs: {uncaught:?}"
    );
}
