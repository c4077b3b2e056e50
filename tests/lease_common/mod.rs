//! Helpers shared by the lease browser suites. The server URL and admin token
//! come in at compile time (`AGENTSTORE_TEST_SERVER`,
//! `AGENTSTORE_TEST_ADMIN_TOKEN`; scripts/test.sh starts the server with short
//! TTLs). Without them the suites fail under `CI` and skip with a console note
//! otherwise. A second server with a long TTL (`AGENTSTORE_TEST_SERVER_LONG_TTL`,
//! same admin token) serves the tests whose point is not expiry but whose
//! multi-step sequence must fit in one TTL (see [`long_ttl_server`]); the
//! `*_at` helpers take the base URL of the server to use.
#![allow(dead_code)]

use std::rc::Rc;

use agentstore::lease::{Claimed, ClientConfig, ClientInner, Credentials, LeaseError, LeaseInner};
use agentstore_protocol::lease::{ItemList, ItemView};
use futures::future::{select, Either};
use js_sys::{Function, Promise, Reflect};
use serde_json::{json, Value};
use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_futures::JsFuture;
use web_sys::{Headers, RequestInit, Response};

/// The server flags scripts/test.sh uses: TTL 3 s, heartbeat 0.5 s, reaper 0.2 s.
pub const TTL_MS: f64 = 3_000.0;
/// Heartbeat interval of the test server.
pub const HEARTBEAT_MS: f64 = 500.0;

/// TTL of the long-TTL test server (scripts/test.sh), heartbeat 0.5 s as well.
pub const LONG_TTL_MS: f64 = 60_000.0;

/// The long-TTL test server's base URL, or `None` (skip) outside CI. For the
/// tests whose point is not expiry (the server's TTL, the client's local
/// deadline) but whose sequence of steps must fit inside one TTL: on a busy
/// machine that may take longer than the 3 s of [`server`], and the test
/// would then fail though the code is right. Heartbeats still go out every
/// [`HEARTBEAT_MS`].
pub fn long_ttl_server() -> Option<&'static str> {
    server()?;
    configured(
        option_env!("AGENTSTORE_TEST_SERVER_LONG_TTL"),
        "AGENTSTORE_TEST_SERVER_LONG_TTL",
    )
}

/// `value`, a URL the test script passes at compile time as `name`, when it
/// was set; else `None` (the tests that need it skip, with a console note),
/// and a failed assertion under `CI` (scripts/test.sh starts what it names).
pub fn configured(value: Option<&'static str>, name: &str) -> Option<&'static str> {
    match value {
        Some(url) if !url.is_empty() => Some(url),
        _ => {
            assert!(
                option_env!("CI").is_none(),
                "{name} must be set at compile time in CI (scripts/test.sh starts it)"
            );
            web_sys::console::warn_1(
                &format!("tests skipped: {name} is not set (run scripts/test.sh)").into(),
            );
            None
        }
    }
}

/// `(base URL, admin token)`, or `None` (skip) outside CI.
pub fn server() -> Option<(&'static str, &'static str)> {
    match (
        option_env!("AGENTSTORE_TEST_SERVER"),
        option_env!("AGENTSTORE_TEST_ADMIN_TOKEN"),
    ) {
        (Some(url), Some(admin)) if !url.is_empty() => Some((url, admin)),
        _ => {
            assert!(
                option_env!("CI").is_none(),
                "AGENTSTORE_TEST_SERVER and AGENTSTORE_TEST_ADMIN_TOKEN must be set at compile time in CI (scripts/test.sh starts the server)"
            );
            web_sys::console::warn_1(
                &"lease suite skipped: AGENTSTORE_TEST_SERVER is not set (run scripts/test.sh)"
                    .into(),
            );
            None
        }
    }
}

/// A queue name no other test uses.
pub fn fresh_queue(tag: &str) -> String {
    format!("t-{tag}-{}", (js_sys::Math::random() * 1e12) as u64)
}

/// `performance.now()`.
pub fn now() -> f64 {
    agentstore::lease::http::now_ms()
}

/// Sleeps `ms`.
pub async fn sleep(ms: f64) {
    agentstore::lease::http::sleep_ms(ms).await
}

/// An admin request; returns `(status, JSON body or Null)`.
pub async fn admin(method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    admin_at(server().expect("server").0, method, path, body).await
}

/// [`admin`] to the server at `base`.
pub async fn admin_at(base: &str, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let (_, token) = server().expect("server");
    let init = RequestInit::new();
    init.set_method(method);
    let headers = Headers::new().unwrap();
    headers
        .set("Authorization", &format!("Bearer {token}"))
        .unwrap();
    if let Some(b) = body {
        headers.set("Content-Type", "application/json").unwrap();
        init.set_body(&JsValue::from_str(&b.to_string()));
    }
    init.set_headers(&headers);
    let fetch: Function = Reflect::get(&js_sys::global(), &"fetch".into())
        .unwrap()
        .unchecked_into();
    let p: Promise = fetch
        .call2(&JsValue::UNDEFINED, &format!("{base}{path}").into(), &init)
        .unwrap()
        .unchecked_into();
    let resp: Response = JsFuture::from(p)
        .await
        .expect("admin fetch")
        .unchecked_into();
    let text = JsFuture::from(resp.text().unwrap())
        .await
        .unwrap()
        .as_string()
        .unwrap_or_default();
    (
        resp.status(),
        serde_json::from_str(&text).unwrap_or(Value::Null),
    )
}

/// Enqueues one item; returns its id.
pub async fn enqueue(queue: &str, payload: Value) -> i64 {
    enqueue_at(server().expect("server").0, queue, payload).await
}

/// [`enqueue`] on the server at `base`.
pub async fn enqueue_at(base: &str, queue: &str, payload: Value) -> i64 {
    let (status, body) = admin_at(
        base,
        "POST",
        &format!("/v1/queues/{queue}/items"),
        Some(json!({ "payload": payload })),
    )
    .await;
    assert_eq!(status, 201, "enqueue: {body}");
    body["id"].as_i64().expect("id")
}

/// The item as the server sees it.
pub async fn item(id: i64) -> ItemView {
    item_at(server().expect("server").0, id).await
}

/// [`item`] on the server at `base`.
pub async fn item_at(base: &str, id: i64) -> ItemView {
    let (status, body) = admin_at(base, "GET", &format!("/v1/items/{id}"), None).await;
    assert_eq!(status, 200, "item {id}: {body}");
    serde_json::from_value(body).expect("item view")
}

/// Every item of a queue, following the listing's `next` pages (a page
/// holds at most 10,000 items or about 4 MiB of item text).
pub async fn items(queue: &str) -> Vec<ItemView> {
    let mut all = Vec::new();
    let mut after = String::new();
    loop {
        let (status, body) = admin(
            "GET",
            &format!("/v1/queues/{queue}/items?limit=10000{after}"),
            None,
        )
        .await;
        assert_eq!(status, 200, "list: {body}");
        let page: ItemList = serde_json::from_value(body).expect("list");
        all.extend(page.items);
        match page.next {
            Some(n) => after = format!("&after={n}"),
            None => return all,
        }
    }
}

/// Polls until `item(id)` satisfies `f`, for at most `ms`.
pub async fn wait_item(id: i64, ms: f64, f: impl Fn(&ItemView) -> bool) -> ItemView {
    wait_item_at(server().expect("server").0, id, ms, f).await
}

/// [`wait_item`] on the server at `base`.
pub async fn wait_item_at(base: &str, id: i64, ms: f64, f: impl Fn(&ItemView) -> bool) -> ItemView {
    let until = now() + ms;
    loop {
        let it = item_at(base, id).await;
        if f(&it) || now() > until {
            return it;
        }
        sleep(50.0).await;
    }
}

/// A fresh single-use enrollment token for a worker that may claim from `queue`
/// only (the least privilege a test worker needs).
pub async fn enrollment_token(queue: &str) -> String {
    enrollment_token_at(server().expect("server").0, queue).await
}

/// [`enrollment_token`] of the server at `base`.
pub async fn enrollment_token_at(base: &str, queue: &str) -> String {
    let body = json!({"role": "worker", "queues": [queue]});
    let (status, body) = admin_at(base, "POST", "/v1/admin/enrollment-tokens", Some(body)).await;
    assert_eq!(status, 201);
    body["token"].as_str().unwrap().to_owned()
}

/// Test configuration: no journal, no pagehide hook (each suite is one page).
pub fn config() -> ClientConfig {
    ClientConfig {
        journal_name: None,
        release_on_pagehide: false,
        ..ClientConfig::default()
    }
}

/// A client authenticated with the admin token.
pub fn admin_client(config: ClientConfig) -> Rc<ClientInner> {
    admin_client_at(server().expect("server").0, config)
}

/// [`admin_client`] of the server at `base`.
pub fn admin_client_at(base: &str, config: ClientConfig) -> Rc<ClientInner> {
    let (_, token) = server().expect("server");
    ClientInner::new(
        base,
        Credentials {
            access_token: Some(token.to_owned()),
            ..Credentials::default()
        },
        config,
    )
    .expect("client")
}

/// A client of a loopback port nothing listens on (the discard port 9):
/// every request fails as a network error.
pub fn unreachable_client() -> Rc<ClientInner> {
    ClientInner::new(
        "http://127.0.0.1:9",
        Credentials {
            access_token: Some("x".into()),
            ..Credentials::default()
        },
        config(),
    )
    .expect("client")
}

/// Claims from `queue`, expecting a lease.
pub async fn claim(client: &Rc<ClientInner>, queue: &str) -> Rc<LeaseInner> {
    match client.claim(queue, None).await.expect("claim") {
        Claimed::Lease(l) => l,
        Claimed::Empty(_) => panic!("queue {queue} is empty"),
    }
}

/// Claims from `queue`, expecting nothing open.
pub async fn claim_none(client: &Rc<ClientInner>, queue: &str) {
    assert!(matches!(
        client.claim(queue, None).await,
        Ok(Claimed::Empty(_))
    ));
}

/// Waits for the lease's signal to abort (at most `ms`); returns the abort
/// reason's `reason` field and when it was seen.
pub async fn wait_abort(lease: &LeaseInner, ms: f64) -> Option<(String, f64)> {
    let signal = lease.signal();
    let until = now() + ms;
    while !signal.aborted() && now() < until {
        sleep(10.0).await;
    }
    signal.aborted().then(|| {
        let reason = Reflect::get(&signal.reason(), &"reason".into())
            .ok()
            .and_then(|r| r.as_string())
            .unwrap_or_default();
        (reason, now())
    })
}

/// Races `f` against `ms`.
pub async fn within<T>(ms: f64, f: impl std::future::Future<Output = T>) -> Option<T> {
    match select(Box::pin(f), Box::pin(sleep(ms))).await {
        Either::Left((v, _)) => Some(v),
        Either::Right(_) => None,
    }
}

/// The `reason` of a ClaimLost error.
pub fn loss(e: &LeaseError) -> Option<&'static str> {
    e.loss_reason().map(|r| r.as_str())
}

/// A JSON value as a JS value (for `settle` results).
pub fn js(v: Value) -> JsValue {
    js_sys::JSON::parse(&v.to_string()).expect("JSON")
}

/// Records when the lease's `abort` event fires (read with [`aborted_at`]).
/// Reads the signal once, at registration: nothing later touches the lease's
/// getters, so the record shows when the heartbeat loop acted.
pub fn abort_recorder(lease: &LeaseInner) -> Rc<std::cell::Cell<Option<f64>>> {
    let at = Rc::new(std::cell::Cell::new(None));
    let a2 = at.clone();
    let cb = wasm_bindgen::closure::Closure::once_into_js(move || a2.set(Some(now())));
    lease
        .signal()
        .add_event_listener_with_callback("abort", cb.unchecked_ref())
        .unwrap();
    at
}

/// When the recorded `abort` event fired, if it did.
pub fn aborted_at(rec: &Rc<std::cell::Cell<Option<f64>>>) -> Option<f64> {
    rec.get()
}

/// Replaces the page's `fetch` for a test: runs `body` (JS) after a prelude
/// that keeps the page's own `fetch` as `real` (for the hook's `restore`)
/// and defines `answer(status, body)`, a Response-like object the lease
/// client reads (`status`, `headers.get`, `json()`). Returns what `body`
/// returns (the hook the test drives).
pub fn fake_fetch(body: &str) -> JsValue {
    let prelude = "const real = globalThis.fetch;
        const answer = (status, body) => ({ status, headers: { get: () => null }, json: async () => body });
        ";
    js_sys::Function::new_no_args(&[prelude, body].concat())
        .call0(&JsValue::NULL)
        .unwrap()
}

/// Calls the test hook object's method `k` (a fetch or timer hook that
/// returns `{counter: () => n, restore: () => …}`).
pub fn hook_call(hook: &JsValue, k: &str) -> JsValue {
    let f: Function = Reflect::get(hook, &k.into()).unwrap().unchecked_into();
    f.call0(hook).unwrap()
}

/// A watchdog on the page's event loop: `max()` is the longest gap (ms)
/// between two ticks of a 50 ms interval since it started (a page starved
/// or frozen that long ran no timer and handled no answer meanwhile).
pub fn watchdog() -> wasm_bindgen::JsValue {
    js_sys::Function::new_no_args(
        "let last = performance.now(), max = 0;
         const t = setInterval(() => { const n = performance.now(); max = Math.max(max, n - last); last = n; }, 50);
         return { max: () => Math.max(max, performance.now() - last), stop: () => clearInterval(t) };",
    )
    .call0(&wasm_bindgen::JsValue::NULL)
    .unwrap()
}

/// The longest stall of the page's event loop (ms) that a round of a test
/// keeping leases alive across TTLs may see and still count. A heartbeat
/// leaves every [`HEARTBEAT_MS`] and a lease's local deadline is 2.7 s after
/// the last one sent, so a stall well under 2.2 s cannot lose a lease; a
/// page starved longer (a busy machine) may rightly lose it at its deadline.
/// Also the longest round trip of a lease request such a round may see (see
/// [`trip_timer`]): a lease server or proxy stalled that long (a busy
/// machine) may as rightly cost a lease its deadline.
pub const ROUND_STALL_MS: f64 = 1_000.0;

/// The longest time a lease of a round may go without a confirmed
/// heartbeat and still count (see [`trip_timer`]'s `gap()`): from the send
/// of its last request the server answered with success to the answer of
/// the next. A lease's local deadline is 2.7 s after the former; several
/// stalls each under [`ROUND_STALL_MS`] (a slow answer, then a heartbeat
/// sent late) can add up to it, and the lease is then rightly lost.
pub const ROUND_GAP_MS: f64 = 0.9 * TTL_MS - HEARTBEAT_MS;

/// Times the round trips of the lease requests (claims, heartbeats,
/// settles, releases) the page's `fetch` sends from now on, by wrapping it:
/// `max()` is the longest (ms; one still unanswered counts up to now);
/// `gap()` the longest time a lease went without a confirmation: from the
/// send of its last request answered with success (its claim, a heartbeat
/// naming its token) to the answer of its next request (one still
/// unanswered counts up to now), per lease token; `restore()` puts back the
/// `fetch` it wrapped (unless another has replaced the wrapper since).
pub fn trip_timer() -> JsValue {
    js_sys::Function::new_no_args(
        "const real = globalThis.fetch;
        const timed = /\\/(claims|heartbeats|heartbeat|settle|release)$/;
        let longest = 0, gap = 0;
        const open = new Set();
        // token -> send time of its latest request answered with success.
        const confirmed = new Map();
        const tokens = (init) => {
            const body = init && typeof init.body === 'string' ? init.body : '';
            return [...body.matchAll(/\"token\":\"([^\"]+)\"/g)].map((m) => m[1]);
        };
        const since = (trip, t) => {
            for (const k of trip.tokens) if (confirmed.has(k)) gap = Math.max(gap, t - confirmed.get(k));
        };
        const timer = function (url, init) {
            const answer = real.call(this, url, init);
            const path = String(url).split('?')[0];
            if (!timed.test(path)) return answer;
            const trip = { at: performance.now(), tokens: tokens(init) };
            open.add(trip);
            const end = (r) => {
                open.delete(trip);
                const t = performance.now();
                longest = Math.max(longest, t - trip.at);
                since(trip, t);
                if (!(r && r.status >= 200 && r.status < 300)) return;
                for (const k of trip.tokens) confirmed.set(k, Math.max(confirmed.get(k) ?? 0, trip.at));
                // A claim's token is in its answer (read from a copy; this
                // runs before the client reads the answer).
                if (/\\/claims$/.test(path) && r.status === 201) {
                    r.clone().json().then((b) => {
                        const k = b && b.lease && b.lease.token;
                        if (k && !confirmed.has(k)) confirmed.set(k, trip.at);
                    }, () => {});
                }
            };
            Promise.resolve(answer).then(end, () => end(null));
            return answer;
        };
        globalThis.fetch = timer;
        return {
            max: () => { let m = longest; for (const t of open) m = Math.max(m, performance.now() - t.at); return m; },
            gap: () => { const t = performance.now(); for (const trip of open) since(trip, t); return gap; },
            restore: () => { if (globalThis.fetch === timer) globalThis.fetch = real; },
        };",
    )
    .call0(&JsValue::NULL)
    .unwrap()
}

/// What makes a round of [`unstalled_rounds`] not count: the page's event
/// loop stalled for `page_stall_ms` or more (see [`watchdog`]), a lease
/// request's round trip took `trip_ms` or more, or a lease went `gap_ms` or
/// more without a confirmed heartbeat (see [`trip_timer`]). At most
/// `rounds` rounds run.
#[derive(Clone, Copy, Debug)]
pub struct Rounds {
    pub rounds: u32,
    pub page_stall_ms: f64,
    pub trip_ms: f64,
    pub gap_ms: f64,
}

impl Default for Rounds {
    /// Eight rounds; [`ROUND_STALL_MS`] for a stall and a trip,
    /// [`ROUND_GAP_MS`] for a gap.
    fn default() -> Rounds {
        Rounds {
            rounds: 8,
            page_stall_ms: ROUND_STALL_MS,
            trip_ms: ROUND_STALL_MS,
            gap_ms: ROUND_GAP_MS,
        }
    }
}

/// Runs `round(n)` until one runs without stalling (see [`Rounds`]), at
/// most `limits.rounds` rounds; what a round that stalled returned is handed
/// to `discard` (to give its leases back). Returns the clean round's value;
/// fails when every round stalled.
pub async fn unstalled_rounds<T, F, D>(
    limits: Rounds,
    round: impl FnMut(u32) -> F,
    discard: impl FnMut(T) -> D,
) -> T
where
    F: std::future::Future<Output = T>,
    D: std::future::Future<Output = ()>,
{
    excused_rounds(limits, round, |_| async { false }, discard).await
}

/// [`unstalled_rounds`], except that a round whose outcome `right` accepts
/// counts however much it stalled: a stall only excuses a wrong outcome
/// (on a busy machine, a round of hundreds of requests nearly always has
/// one slow request, and running a right round again only costs time).
pub async fn excused_rounds<T, F, R, D>(
    limits: Rounds,
    mut round: impl FnMut(u32) -> F,
    mut right: impl FnMut(&T) -> R,
    mut discard: impl FnMut(T) -> D,
) -> T
where
    F: std::future::Future<Output = T>,
    R: std::future::Future<Output = bool>,
    D: std::future::Future<Output = ()>,
{
    let (mut page, mut trip, mut unconfirmed) = (0.0f64, 0.0f64, 0.0f64);
    for n in 0..limits.rounds {
        let dog = watchdog();
        let trips = trip_timer();
        let t = round(n).await;
        hook_call(&trips, "restore");
        let stalled = hook_call(&dog, "max").as_f64().unwrap_or(f64::INFINITY);
        hook_call(&dog, "stop");
        let slowest = hook_call(&trips, "max").as_f64().unwrap_or(f64::INFINITY);
        let gap = hook_call(&trips, "gap").as_f64().unwrap_or(f64::INFINITY);
        if stalled < limits.page_stall_ms && slowest < limits.trip_ms && gap < limits.gap_ms
            || right(&t).await
        {
            return t;
        }
        web_sys::console::warn_1(
            &format!("round {n} run again: page stalled {stalled} ms, slowest lease request {slowest} ms, a lease unconfirmed for {gap} ms").into(),
        );
        page = page.max(stalled);
        trip = trip.max(slowest);
        unconfirmed = unconfirmed.max(gap);
        discard(t).await;
    }
    panic!(
        "every round stalled ({limits:?}): the page up to {page} ms, a lease request up to {trip} ms, a lease unconfirmed up to {unconfirmed} ms"
    );
}

/// [`unstalled_rounds`] with the default [`Rounds`] for a round that
/// returns the client holding its leases and what the test checks next;
/// the clients of the rounds that stalled are closed (their leases given
/// back). Returns the clean round's client and value.
pub async fn unstalled_round<T, F: std::future::Future<Output = (Rc<ClientInner>, T)>>(
    round: impl FnMut(u32) -> F,
) -> (Rc<ClientInner>, T) {
    unstalled_rounds(
        Rounds::default(),
        round,
        |(c, _)| async move { c.close().await },
    )
    .await
}
