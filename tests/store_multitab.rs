//! Another connection's upgrade (case C-E1): a polite connection closes and
//! says so; an open blocked by one that refuses fails with BlockedError after
//! its timeout instead of hanging, and leaves nothing open behind; once
//! that one closes, the open (waiting, or retried) resolves and nothing
//! written before, or reported written meanwhile, is lost.
// Tests may read and call the page's values with js-sys directly: a slot
// kept by a throw lasts only for the test page (clippy.toml).
#![allow(clippy::disallowed_methods)]

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
    // The old tab finally closes: the abandoned upgrade is aborted (its
    // connection closed), so it blocks nobody; a new open at version 3 goes
    // through.
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

/// Everything a store holds: the snapshot (records + tombstones) and the
/// derived-index entries.
async fn contents(store: &Store) -> (String, String) {
    (
        store.export_snapshot().await.expect("export"),
        store.dump_entries().await.expect("entries"),
    )
}

/// A store at version 1 holding records (one updated, one deleted) with
/// the `byType` index built, closed again; returns its contents.
async fn filled(name: &str) -> (String, String) {
    let store = open_named(name).await;
    for i in 0..20 {
        let t = if i % 2 == 0 { "run" } else { "agent" };
        store
            .put(&js(json!({"_id": format!("r{i:02}"), "recordType": t})))
            .await
            .unwrap();
    }
    let rev = store.get(&s("r03")).await.unwrap().unwrap();
    let rev = field_str(&rev, "_rev").unwrap();
    store
        .put(&js(json!({"_id": "r03", "_rev": rev, "recordType": "run"})))
        .await
        .unwrap();
    let rev = store.get(&s("r04")).await.unwrap().unwrap();
    store
        .delete(&s("r04"), &s(&field_str(&rev, "_rev").unwrap()))
        .await
        .unwrap();
    let before = contents(&store).await;
    store.close();
    before
}

/// Counts the `versionchange` events a raw connection received (it still
/// does not close).
fn count_version_changes(conn: &JsValue) {
    js_sys::Function::new_with_args(
        "db",
        "db.__versionchanges = 0; db.onversionchange = () => { db.__versionchanges += 1; };",
    )
    .call1(&JsValue::NULL, conn)
    .unwrap();
}

fn version_changes(conn: &JsValue) -> f64 {
    js_sys::Reflect::get(conn, &"__versionchanges".into())
        .unwrap()
        .as_f64()
        .unwrap_or(0.0)
}

fn close_raw(conn: &JsValue) {
    js_sys::Reflect::get(conn, &"close".into())
        .unwrap()
        .unchecked_into::<js_sys::Function>()
        .call0(conn)
        .unwrap();
}

/// The newer connection works after the wait: what was stored before is
/// all there (records, tombstones, index entries), `listBy` and a new write
/// work and the indexes verify clean.
async fn works_and_kept(store: &Store, before: &(String, String)) {
    assert_eq!(&contents(store).await, before, "nothing was lost");
    let q = agentstore::store::ByQuery::from_js(&js(json!({"eq": "run"}))).unwrap();
    // r00..r18 even (10), r03 turned into a run, r04 deleted: 10 runs.
    assert_eq!(
        store.list_by("byType", &q).await.unwrap().records.length(),
        10
    );
    store
        .put(&js(json!({"_id": "after", "recordType": "run"})))
        .await
        .unwrap();
    assert!(store.get(&s("after")).await.unwrap().is_some());
    assert_indexes_clean(store).await;
}

/// An open at a newer version, blocked by a connection that holds the
/// older one and does not close on `versionchange`, waits (its timeout is
/// far away) and resolves once that connection closes: the same call, not
/// a retry. The opened store works and nothing stored before is lost.
#[wasm_bindgen_test]
async fn a_blocked_open_resolves_once_the_old_connection_closes_and_loses_nothing() {
    let name = fresh_name("blocked-then-open");
    let before = filled(&name).await;
    let old = stubborn_connection(&name).await;
    count_version_changes(&old);
    let closed_at = Rc::new(Cell::new(None::<f64>));
    let started = js_sys::Date::now();
    let opening = Store::open_versioned(&name, 2, 60_000, None, vec![by_type()]);
    let closing = async {
        // The old connection was asked to close and did not: the open is
        // blocked until it does.
        wait_for("the old connection's versionchange", || {
            version_changes(&old) > 0.0
        })
        .await;
        close_raw(&old);
        closed_at.set(Some(js_sys::Date::now()));
    };
    let (opened, ()) = futures::join!(opening, closing);
    let store = opened.expect("the blocked open resolves once unblocked");
    let resolved = js_sys::Date::now();
    assert!(
        closed_at.get().is_some_and(|t| t <= resolved),
        "resolved only after the old connection closed"
    );
    assert!(
        resolved - started < 30_000.0,
        "resolved by the close, long before its blocked timeout"
    );
    assert_eq!(version_changes(&old), 1.0);
    works_and_kept(&store, &before).await;
}

/// An open blocked until its timeout fails with BlockedError; once the old
/// connection closes, the next open AT THE SAME VERSION resolves (the
/// abandoned request's upgrade runs first and closes its own connection, so
/// it blocks nothing), works, and nothing stored before is lost.
#[wasm_bindgen_test]
async fn an_open_retried_at_the_same_version_after_a_blocked_timeout_resolves_and_loses_nothing() {
    let name = fresh_name("blocked-retry");
    let before = filled(&name).await;
    let old = stubborn_connection(&name).await;
    let e = match Store::open_versioned(&name, 2, 300, None, vec![by_type()]).await {
        Err(e) => e,
        Ok(_) => panic!("the open must not succeed while blocked"),
    };
    assert_eq!(e.code(), ErrorCode::Blocked);
    close_raw(&old);
    let store = Store::open_versioned(&name, 2, 30_000, None, vec![by_type()])
        .await
        .expect("the retried open resolves");
    works_and_kept(&store, &before).await;
    // A third connection at that version opens at once (no upgrade, no
    // leftover connection to block it), and sees the write.
    let third = Store::open_versioned(&name, 2, 300, None, vec![by_type()])
        .await
        .expect("nothing left blocking");
    assert!(third.get(&s("after")).await.unwrap().is_some());
}

/// While an open at a newer version waits for a connection that does not
/// close, this page's store keeps writing (four concurrent puts at a time,
/// sharing group-commit transactions) until the upgrade's `versionchange`
/// closes it; then the blocker closes and the open resolves. Every write
/// that reported success is there at its revision in the upgraded
/// database, every refused one (ClosedError) is absent: nothing reported
/// written is lost, nothing refused is half-written (3 rounds).
#[wasm_bindgen_test]
async fn writes_racing_a_blocked_upgrade_are_kept_exactly_when_they_reported_success() {
    type Outcomes = Rc<std::cell::RefCell<Vec<(String, Result<String, ErrorCode>)>>>;
    for round in 0..3 {
        let name = fresh_name("blocked-writes");
        let old = Rc::new(open_named(&name).await);
        let blocker = stubborn_connection(&name).await;
        count_version_changes(&blocker);
        let outcomes: Outcomes = Default::default();
        let writing = {
            let (old, outcomes) = (old.clone(), outcomes.clone());
            async move {
                // Bounded: the upgrade's versionchange closes the store.
                let until = js_sys::Date::now() + 30_000.0;
                for i in 0.. {
                    assert!(js_sys::Date::now() < until, "the old store never closed");
                    let ids: Vec<String> = (0..4).map(|k| format!("w{i:04}-{k}")).collect();
                    let recs: Vec<JsValue> = ids
                        .iter()
                        .map(|id| js(json!({"_id": id, "recordType": "run"})))
                        .collect();
                    let (a, b, c, d) = futures::join!(
                        old.put(&recs[0]),
                        old.put(&recs[1]),
                        old.put(&recs[2]),
                        old.put(&recs[3])
                    );
                    let mut refused = 0;
                    for (id, r) in ids.into_iter().zip([a, b, c, d]) {
                        refused += usize::from(r.is_err());
                        outcomes
                            .borrow_mut()
                            .push((id, r.map(|w| w.rev).map_err(|e| e.code())));
                    }
                    if refused == 4 {
                        return;
                    }
                }
            }
        };
        let upgrading = async {
            // Some writes first, then the newer open (round 0: at once).
            wait_for("writes before the upgrade", || {
                outcomes.borrow().len() >= 8 * round
            })
            .await;
            let opening = Store::open_versioned(&name, 2, 60_000, None, vec![by_type()]);
            let closing = async {
                wait_for("the blocker's versionchange", || {
                    version_changes(&blocker) > 0.0
                })
                .await;
                close_raw(&blocker);
            };
            futures::join!(opening, closing).0
        };
        let ((), newer) = futures::join!(writing, upgrading);
        let newer = newer.expect("the open resolves once the blocker closed");
        let outcomes = outcomes.borrow().clone();
        let mut kept = 0;
        for (id, r) in &outcomes {
            let got = newer.get(&s(id)).await.unwrap();
            let stored = got.as_ref().and_then(|g| field_str(g, "_rev"));
            match r {
                Ok(rev) => {
                    assert_eq!(stored.as_ref(), Some(rev), "round {round}: {id}");
                    kept += 1;
                }
                Err(code) => {
                    assert_eq!(*code, ErrorCode::Closed, "round {round}: {id}");
                    assert_eq!(stored, None, "round {round}: {id} was refused");
                }
            }
        }
        assert!(kept >= 8 * round, "round {round}: {kept} writes kept");
        assert_eq!(newer.count(&[], None).await.unwrap(), kept as u32);
        assert_indexes_clean(&newer).await;
    }
}

/// An open that gave up (BlockedError) while queued behind a deletion that a
/// stubborn connection blocks creates nothing once that connection closes:
/// its request cannot be cancelled, and when it runs, after the deletion,
/// its upgrade is aborted. Before, it created the database again (empty),
/// undoing the `destroy` the app had asked for. Probed after the blocker
/// closes by a raw open queued behind the abandoned one (IndexedDB runs one
/// name's requests in order): it sees no database (`oldVersion` 0) and
/// aborts its own upgrade. Found by helper-220.
#[wasm_bindgen_test]
async fn an_open_that_gave_up_behind_a_blocked_deletion_creates_nothing_later() {
    let name = fresh_name("gave-up-behind-delete");
    drop(Store::open(&name, 2000, None, vec![]).await.unwrap());
    let stubborn = stubborn_connection(&name).await;
    let deleted = agentstore::store::destroy(&name, 100).await;
    assert_eq!(deleted.map_err(|e| e.code()), Err(ErrorCode::Blocked));
    let gave_up = Store::open(&name, 100, None, vec![]).await.map(drop);
    assert_eq!(gave_up.map_err(|e| e.code()), Err(ErrorCode::Blocked));
    js_sys::Reflect::get(&stubborn, &"close".into())
        .unwrap()
        .unchecked_into::<js_sys::Function>()
        .call0(&stubborn)
        .unwrap();
    let probe = js_sys::Function::new_with_args(
        "name",
        "return new Promise((ok) => { const r = indexedDB.open(name); \
           r.onupgradeneeded = (e) => { ok(e.oldVersion === 0 ? 'absent' : 'upgrade'); r.transaction.abort(); }; \
           r.onsuccess = () => { r.result.close(); ok('present'); }; \
           r.onerror = (e) => e.preventDefault(); });",
    );
    let p: js_sys::Promise = probe
        .call1(&JsValue::NULL, &name.clone().into())
        .unwrap()
        .into();
    let found = wasm_bindgen_futures::JsFuture::from(p).await.unwrap();
    assert_eq!(found.as_string().as_deref(), Some("absent"));
}
