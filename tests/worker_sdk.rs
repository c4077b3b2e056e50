//! The whole SDK inside a dedicated Web Worker, while the page writes to the
//! same database.
//!
//! The page spawns a module worker that imports this test binary's own JS
//! glue (`/wasm-bindgen-test.js`, which exports the SDK's classes exactly as
//! `pkg/agentstore.js` does) and drives the JS API there: `AgentStore.open`,
//! `put`, `mutate`, `list`, `listBy`, `watch`, and a `LeaseClient` with its
//! journal and Web Locks on (`claim`, `heartbeat`, `settle`, `work`,
//! `recover`). Meanwhile the page writes its own records and bumps the same
//! counter record with `mutate`. Runs in Chromium and Firefox (scripts/test.sh).
// Tests may read and call the page's values with js-sys directly: a slot
// kept by a throw lasts only for the test page (clippy.toml).
#![allow(clippy::disallowed_methods)]

use std::cell::RefCell;
use std::rc::Rc;

use agentstore_protocol::lease::ItemState;
use js_sys::{Array, Function, Object, Reflect};
use serde_json::json;
use wasm_bindgen::prelude::*;
use wasm_bindgen_test::*;

mod common;
mod lease_common;
use common::*;
use lease_common::{enqueue_at, fresh_queue, item_at, long_ttl_server, now, server, sleep};

wasm_bindgen_test_configure!(run_in_browser);

/// Records each side writes.
const N: u32 = 40;
/// Work items the worker settles (one by hand, the rest through `work()`).
const JOBS: usize = 4;

/// The worker: one module that answers a `start` message with a summary.
const WORKER_JS: &str = r#"
const { default: init, AgentStore, LeaseClient } = await import(MODULE_URL);
const wait = (ms) => new Promise((r) => setTimeout(r, ms));
async function until(cond, ms, what) {
  const t0 = performance.now();
  while (!cond()) {
    if (performance.now() - t0 > ms) throw new Error(`timed out waiting for ${what}`);
    await wait(20);
  }
}
self.onmessage = async ({ data }) => {
  if (data.type !== "start") return;
  const { db, server, admin, queue, n, jobs } = data;
  const out = {
    type: "done",
    isWorker: typeof window === "undefined" && typeof document === "undefined" &&
      typeof WorkerGlobalScope !== "undefined" && self instanceof WorkerGlobalScope,
  };
  try {
    // The test runner's glue has no default .wasm URL; pkg/agentstore.js does.
    await init({ module_or_path: new URL("wasm-bindgen-test_bg.wasm", MODULE_URL) });
    const store = await AgentStore.open(db, {
      indexes: [{ name: "byType", keys: ["recordType", "updatedAt"] }],
    });
    const seenPage = new Set();
    const watch = store.watch({ prefix: "page:" }, (c) => seenPage.add(c.id));
    self.postMessage({ type: "ready" });

    // Store: own records and the shared counter, interleaved with the page's.
    for (let i = 0; i < n; i++) {
      await store.put({ _id: `worker:${String(i).padStart(3, "0")}`, recordType: "w", i });
      await store.mutate("shared:counter", (c) => ({ ...(c ?? { _id: "shared:counter" }), n: (c?.n ?? 0) + 1 }));
    }
    let conflict = null;
    try {
      await store.put({ _id: "worker:000", i: -1 }); // no _rev over a live record
    } catch (e) {
      conflict = { name: e.name, code: e.code, status: e.status };
    }
    out.conflict = conflict;

    // Leases: journal (IndexedDB) and Web Locks on, pagehide hook requested.
    const client = new LeaseClient(server, {
      accessToken: admin,
      journal: `agentstore-leases-${db}`,
      webLocks: true,
      releaseOnPagehide: true,
    });
    out.recovered = await client.recover();
    const lease = await client.claim(queue);
    if (!lease) throw new Error("claim returned null with items open");
    out.heartbeatTtl = await lease.heartbeat();
    out.heldWhileClaimed = client.held.length;
    await store.put({ _id: `job:${lease.itemId}`, recordType: "job", epoch: lease.epoch, by: "claim" });
    out.settled = await lease.settle("done", { by: "claim", item: lease.itemId });
    out.statusAfterSettle = lease.status;

    const handled = [];
    const worker = client.work(queue, async (l) => {
      l.throwIfLost();
      await store.put({ _id: `job:${l.itemId}`, recordType: "job", epoch: l.epoch, by: "work" });
      handled.push(l.itemId);
      return { by: "work", item: l.itemId };
    }, { concurrency: 2, pollIntervalMs: 50 });
    await until(() => worker.stats.done >= jobs - 1, 20000, "work() to settle the rest");
    await worker.stop();
    out.stats = worker.stats;
    out.handled = handled;
    await client.close();

    // Reads in the worker, then wait until the page's writes were all seen.
    const mine = await store.list({ prefix: "worker:", limit: 1000 });
    out.listed = mine.records.length;
    const byType = await store.listBy("byType", { eq: "w", limit: 1000 });
    out.listedBy = byType.records.length;
    await until(() => seenPage.size >= n, 20000, "the page's changes");
    out.seenPage = seenPage.size;
    watch.close();
    store.close();
  } catch (e) {
    out.error = `${e?.name}: ${e?.message}\n${e?.stack ?? ""}`;
  }
  self.postMessage(out);
};
self.postMessage({ type: "loaded" });
"#;

/// Spawns the worker; returns it and the array its messages land in.
fn spawn_worker() -> (JsValue, Array) {
    let origin = Reflect::get(&js_sys::global(), &"location".into())
        .and_then(|l| Reflect::get(&l, &"origin".into()))
        .ok()
        .and_then(|o| o.as_string())
        .expect("a page origin");
    let src = WORKER_JS.replace(
        "MODULE_URL",
        &format!("{:?}", format!("{origin}/wasm-bindgen-test.js")),
    );
    let spawn = Function::new_with_args(
        "src",
        "const url = URL.createObjectURL(new Blob([src], { type: 'text/javascript' }));
         const worker = new Worker(url, { type: 'module' });
         const inbox = [];
         worker.addEventListener('message', (e) => inbox.push(e.data));
         worker.addEventListener('error', (e) => inbox.push({ type: 'error', message: String(e.message || e) }));
         return [worker, inbox];",
    );
    let pair: Array = spawn
        .call1(&JsValue::NULL, &src.into())
        .expect("spawn")
        .into();
    (pair.get(0), pair.get(1).into())
}

/// Waits (at most `ms`) for a message of `kind`; panics on a worker error.
async fn message(inbox: &Array, kind: &str, ms: f64) -> JsValue {
    let until = now() + ms;
    loop {
        for m in inbox.iter() {
            match field_str(&m, "type").as_deref() {
                Some(k) if k == kind => return m,
                Some("error") => panic!("worker error: {:?}", field_str(&m, "message")),
                Some("done") => panic!(
                    "the worker ended before {kind:?}: {:?}",
                    field_str(&m, "error")
                ),
                _ => {}
            }
        }
        assert!(now() < until, "no {kind:?} message from the worker");
        sleep(20.0).await;
    }
}

fn num(v: &JsValue, k: &str) -> f64 {
    field(v, k).as_f64().unwrap_or(f64::NAN)
}

#[wasm_bindgen_test]
async fn store_watch_and_leases_work_in_a_worker_while_the_page_writes_the_same_database() {
    // The long-TTL server: the worker's lease steps (claim, heartbeat, a
    // store write, settle; work()'s items) are not about expiry, and on a
    // busy machine they may take longer than the 2.7 s local deadline of the
    // 3 s server, losing a lease (and failing the epoch checks) rightly.
    let Some((_, admin)) = server() else {
        return;
    };
    let Some(base) = long_ttl_server() else {
        return;
    };
    let db = fresh_name("worker");
    let queue = fresh_queue("worker");
    let mut ids = Vec::new();
    for j in 0..JOBS {
        ids.push(enqueue_at(base, &queue, json!({ "job": j })).await);
    }
    let page = open_named(&db).await;

    // The page watches the worker's writes.
    let seen_worker = Rc::new(RefCell::new(Vec::<String>::new()));
    let s2 = seen_worker.clone();
    let cb = Closure::<dyn FnMut(JsValue)>::new(move |c: JsValue| {
        s2.borrow_mut()
            .push(field_str(&c, "id").unwrap_or_default());
    });
    let watcher = agentstore::store::Watcher::new(
        &page,
        "worker:".into(),
        cb.as_ref().unchecked_ref::<Function>().clone(),
    )
    .expect("watch");

    let (worker, inbox) = spawn_worker();
    message(&inbox, "loaded", 60_000.0).await;
    let start = Object::new();
    for (k, v) in [
        ("type", JsValue::from("start")),
        ("db", db.as_str().into()),
        ("server", base.into()),
        ("admin", admin.into()),
        ("queue", queue.as_str().into()),
        ("n", N.into()),
        ("jobs", (JOBS as u32).into()),
    ] {
        Reflect::set(&start, &k.into(), &v).unwrap();
    }
    let post: Function = Reflect::get(&worker, &"postMessage".into())
        .unwrap()
        .unchecked_into();
    post.call1(&worker, &start).unwrap();
    message(&inbox, "ready", 60_000.0).await;

    // The page's writes, concurrent with the worker's.
    let bump = Function::new_with_args(
        "c",
        "return { ...(c ?? { _id: 'shared:counter' }), n: ((c && c.n) || 0) + 1 };",
    );
    for i in 0..N {
        page.put(&js(
            json!({"_id": format!("page:{i:03}"), "recordType": "p", "i": i}),
        ))
        .await
        .expect("page put");
        page.mutate(&s("shared:counter"), &bump, 50, None)
            .await
            .expect("page mutate");
    }

    let out = message(&inbox, "done", 90_000.0).await;
    let terminate: Function = Reflect::get(&worker, &"terminate".into())
        .unwrap()
        .unchecked_into();
    let _ = terminate.call0(&worker);
    assert_eq!(field_str(&out, "error"), None, "the worker failed");
    assert_eq!(
        field(&out, "isWorker").as_bool(),
        Some(true),
        "ran in a worker scope"
    );

    // Store, in both contexts.
    let conflict = field(&out, "conflict");
    assert_eq!(
        (
            field_str(&conflict, "name"),
            field_str(&conflict, "code"),
            num(&conflict, "status")
        ),
        (Some("ConflictError".into()), Some("conflict".into()), 409.0)
    );
    assert_eq!(
        (num(&out, "listed"), num(&out, "listedBy")),
        (f64::from(N), f64::from(N))
    );
    assert_eq!(all_ids(&page, "worker:", 7).await.len(), N as usize);
    assert_eq!(all_ids(&page, "page:", 7).await.len(), N as usize);
    let counter = page.get(&s("shared:counter")).await.unwrap().unwrap();
    assert_eq!(
        num(&counter, "n"),
        f64::from(2 * N),
        "no lost update between page and worker"
    );
    assert_indexes_clean(&page).await;

    // Watch, both directions.
    assert_eq!(num(&out, "seenPage"), f64::from(N));
    let until = now() + 10_000.0;
    while seen_worker.borrow().len() < N as usize && now() < until {
        sleep(20.0).await;
    }
    assert_eq!(seen_worker.borrow().len(), N as usize);
    watcher.close();

    // Leases: one by hand, the rest through work(), every job written once.
    assert!(num(&out, "heartbeatTtl") > 0.0);
    assert_eq!(num(&out, "heldWhileClaimed"), 1.0);
    assert_eq!(
        field_str(&out, "statusAfterSettle").as_deref(),
        Some("settled")
    );
    assert_eq!(
        field_str(&field(&out, "settled"), "state").as_deref(),
        Some("done")
    );
    let stats = field(&out, "stats");
    assert_eq!(
        (
            num(&stats, "done"),
            num(&stats, "failed"),
            num(&stats, "lost")
        ),
        ((JOBS - 1) as f64, 0.0, 0.0)
    );
    assert_eq!(all_ids(&page, "job:", 100).await.len(), JOBS);
    for id in ids {
        let it = item_at(base, id).await;
        assert_eq!((it.state, it.epoch), (ItemState::Done, 1), "item {id}");
        let job = page.get(&s(&format!("job:{id}"))).await.unwrap().unwrap();
        assert_eq!(num(&job, "epoch"), 1.0);
    }
    page.close();
}
