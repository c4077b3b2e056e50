//! Leases against the real server (short TTLs from scripts/test.sh): claim,
//! heartbeats across TTLs, release, takeover and fenced settles (case C-F2),
//! fenced fetch, credentials and error objects.
// Tests may read and call the page's values with js-sys directly: a slot
// kept by a throw lasts only for the test page (clippy.toml).
#![allow(clippy::disallowed_methods)]

use agentstore::lease::{LeaseError, LossReason, Status};
use agentstore_protocol::lease::{ItemState, SettleState};
use agentstore_protocol::ErrorCode;
use js_sys::Reflect;
use serde_json::json;
use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_test::*;

mod lease_common;
use lease_common::*;
#[path = "common/values.rs"]
mod values;
use values::*;

wasm_bindgen_test_configure!(run_in_browser);

/// The requests the lease client makes (claim, heartbeat, settle) keep
/// their method, body, headers and signal, and its errors their fields,
/// when `Object.prototype` has accessors without a setter of those names
/// (a page's polyfill or pollution): the fetch options and errors are
/// defined, not assigned. Before, web-sys assigned the fetch options, the
/// accessors swallowed them, and a claim went out as a GET with no body.
#[wasm_bindgen_test]
async fn lease_requests_and_errors_keep_their_fields_under_prototype_getters() {
    if server().is_none() {
        return;
    }
    let q = fresh_queue("protoget");
    let id = enqueue(&q, json!({"n": 1})).await;
    let client = admin_client(config());
    let getters =
        PrototypeGetters::install(&["method", "body", "headers", "signal", "code", "name"]);
    let lease = claim(&client, &q).await;
    assert_eq!(lease.item_id, id);
    lease
        .settle(SettleState::Done, Some(js(json!({"ok": true}))), None)
        .await
        .expect("settle");
    let err = lease
        .settle(SettleState::Failed, None, None)
        .await
        .expect_err("a second settle")
        .to_js();
    assert_eq!(
        own(&err, "code").as_string().as_deref(),
        Some("already_settled")
    );
    drop(getters);
    assert_eq!(item(id).await.state, ItemState::Done);
}

#[wasm_bindgen_test]
async fn a_heartbeated_lease_lives_five_ttls_and_release_makes_it_claimable_at_once() {
    if server().is_none() {
        return;
    }
    // A page starved for over a second may rightly lose the lease: such a
    // round is run again (see `unstalled_round`).
    let (a, (q, id, lease)) = unstalled_round(|_| async {
        let q = fresh_queue("alive");
        let id = enqueue(&q, json!({"n": 1})).await;
        let a = admin_client(config());
        let lease = claim(&a, &q).await;
        assert_eq!((lease.item_id, lease.epoch), (id, 1));
        sleep(5.0 * TTL_MS + 500.0).await;
        (a, (q, id, lease))
    })
    .await;
    let b = admin_client(config());
    assert_eq!(lease.status(), Status::Held, "still held after 5 TTLs");
    assert!(!lease.signal().aborted());
    let seen = item(id).await;
    assert_eq!(
        (seen.state, seen.epoch, seen.attempts),
        (ItemState::Running, 1, 0),
        "never taken over"
    );
    claim_none(&b, &q).await;

    lease.release().await.expect("release");
    let (reason, _) = wait_abort(&lease, 10.0).await.expect("signal aborted");
    assert_eq!(reason, "released");
    // Claimable at once: the release reopened it (the reaper would say "expired").
    let reopened = item(id).await;
    assert_eq!(
        (reopened.state, reopened.last_error.as_deref()),
        (ItemState::Open, Some("released"))
    );
    let again = claim(&b, &q).await;
    assert_eq!((again.item_id, again.epoch), (id, 2));
    assert!(a.held().is_empty());
    again
        .settle(SettleState::Done, Some(js(json!({"ok": true}))), None)
        .await
        .expect("settle");
    let done = item(id).await;
    assert_eq!(
        (done.state, done.result),
        (ItemState::Done, Some(json!({"ok": true})))
    );
}

#[wasm_bindgen_test]
async fn a_stalled_lease_is_lost_locally_before_the_server_reopens_it_and_its_stale_settle_sends_nothing(
) {
    if server().is_none() {
        return;
    }
    let q = fresh_queue("takeover");
    let id = enqueue(&q, json!({"n": 7})).await;
    let w1 = admin_client(config());
    let w2 = admin_client(config());
    let stale = claim(&w1, &q).await;
    let seen_abort = abort_recorder(&stale);
    stale.set_heartbeats_paused(true); // the worker stalls
    let reopened = wait_item(id, 3.0 * TTL_MS, |it| it.state == ItemState::Open).await;
    assert_eq!(
        (reopened.state, reopened.attempts),
        (ItemState::Open, 1),
        "reaped"
    );
    // The abort event already fired (from the heartbeat loop, not from a getter).
    assert!(
        aborted_at(&seen_abort).is_some(),
        "lost locally before the server reopened the item"
    );
    let fresh = claim(&w2, &q).await;
    assert_eq!(fresh.epoch, 2);
    assert_eq!(stale.status(), Status::Lost(LossReason::ExpiredLocally));

    // The stalled attempt comes back and settles: refused locally, nothing sent.
    let e = stale
        .settle(SettleState::Done, Some(js(json!({"from": "stale"}))), None)
        .await
        .unwrap_err();
    assert_eq!(loss(&e), Some("expired_locally"), "{e}");
    let after = item(id).await;
    assert_eq!(
        (after.state, after.epoch, after.result.clone()),
        (ItemState::Running, 2, None),
        "nothing written; the new attempt is untouched"
    );
    assert_eq!(
        loss(&stale.heartbeat().await.unwrap_err()),
        Some("expired_locally")
    );
    assert_eq!(
        loss(&stale.release().await.unwrap_err()),
        Some("expired_locally")
    );
    fresh
        .heartbeat()
        .await
        .expect("the new attempt still heartbeats");
    fresh
        .settle(SettleState::Done, Some(js(json!({"from": "fresh"}))), None)
        .await
        .unwrap();
    assert_eq!(item(id).await.result, Some(json!({"from": "fresh"})));
}

#[wasm_bindgen_test]
async fn when_the_server_takes_the_claim_away_the_next_heartbeat_aborts_within_one_interval() {
    // The long-TTL server: the point is the server's verdict, not expiry.
    // On the 3 s server a page or server stalled past the lease's 2.7 s
    // local deadline (a busy machine) loses it first, rightly, as
    // `expired_locally` (the SDK's deadline ends a lease whose heartbeats
    // went unanswered that long, whatever the server would say).
    let Some(base) = long_ttl_server() else {
        return;
    };
    let q = fresh_queue("hb-lost");
    let id = enqueue_at(base, &q, json!({})).await;
    let w1 = admin_client_at(base, config());
    let lease = claim(&w1, &q).await;
    // Counts this lease's heartbeat requests, and how many had gone out
    // when its signal aborted. (Before, the abort had to come within
    // HEARTBEAT_MS + 1 s of the pause: a page starved or frozen for a
    // second missed that with the next heartbeat aborting it.)
    let hook = js_sys::Function::new_with_args(
        "id, signal",
        "const real = globalThis.fetch;
        const mine = new RegExp('\"item_id\":' + id + '[,}]');
        let n = 0;
        let atAbort = null;
        signal.addEventListener('abort', () => { atAbort = n; });
        globalThis.fetch = (url, init) => {
            if (String(url).endsWith('/v1/heartbeats') && mine.test(String(init?.body ?? ''))) n++;
            return real(url, init);
        };
        return { count: () => n, atAbort: () => atAbort, restore: () => { globalThis.fetch = real; } };",
    )
    .call2(&JsValue::NULL, &JsValue::from(id as f64), &lease.signal())
    .unwrap();
    // An operator pauses the running item: the token is no longer current.
    let (status, _) = admin_at(base, "POST", &format!("/v1/items/{id}/pause"), None).await;
    assert_eq!(status, 200);
    let before = call_method(&hook, "count", &[]).as_f64().unwrap();
    let aborted = wait_abort(&lease, 30_000.0).await;
    let at_abort = call_method(&hook, "atAbort", &[]).as_f64();
    call_method(&hook, "restore", &[]);
    let (reason, _) = aborted.expect("aborted");
    assert_eq!(reason, "claim_lost");
    // Within one interval: by the first heartbeat sent after the pause (or
    // one already out as it was applied), not a later one.
    let at_abort = at_abort.expect("counted at the abort");
    // The heartbeat that brought the loss went through the hook (so the
    // count below is of this lease's heartbeats, not of nothing).
    assert!(at_abort >= 1.0, "no heartbeat of item {id} was counted");
    let sent = at_abort - before;
    assert!(
        sent <= 1.0,
        "aborted after {sent} heartbeats sent after the pause"
    );
    let e = lease
        .settle(SettleState::Done, None, None)
        .await
        .unwrap_err();
    assert_eq!(loss(&e), Some("claim_lost"));
    let seen = item_at(base, id).await;
    assert_eq!((seen.state, seen.result), (ItemState::Paused, None));
    assert!(w1.held().is_empty(), "never heartbeated again");
}

#[wasm_bindgen_test]
async fn an_operator_s_cancel_aborts_the_holder_s_lease_and_refuses_its_settle() {
    // The long-TTL server, as above: the point is the operator's verdict.
    let Some(base) = long_ttl_server() else {
        return;
    };
    let q = fresh_queue("cancel");
    let id = enqueue_at(base, &q, json!({})).await;
    let w1 = admin_client_at(base, config());
    let lease = claim(&w1, &q).await;
    let (status, body) = admin_at(base, "POST", &format!("/v1/items/{id}/cancel"), None).await;
    assert_eq!(status, 200, "{body}");
    // Told at its next heartbeat (bounded wait for the abort itself).
    let (reason, _) = wait_abort(&lease, 30_000.0).await.expect("aborted");
    assert_eq!(reason, "claim_lost");
    let e = lease
        .settle(SettleState::Done, Some(js(json!({"late": true}))), None)
        .await
        .unwrap_err();
    assert_eq!(loss(&e), Some("claim_lost"));
    let seen = item_at(base, id).await;
    assert_eq!((seen.state, seen.result), (ItemState::Failed, None));
    assert_eq!(seen.last_error.as_deref(), Some("cancelled"));
    assert!(w1.held().is_empty(), "never heartbeated again");
}

#[wasm_bindgen_test]
async fn heartbeats_of_many_leases_share_one_request_and_settle_stores_the_result() {
    if server().is_none() {
        return;
    }
    // (All five held after the claims is checked after the round: five
    // claims slower than the first lease's deadline are a stalled round.)
    let (c, (leases, held)) = unstalled_round(|_| async {
        let q = fresh_queue("many");
        for n in 0..5 {
            enqueue(&q, json!({ "n": n })).await;
        }
        let c = admin_client(config());
        let mut leases = Vec::new();
        for _ in 0..5 {
            leases.push(claim(&c, &q).await);
        }
        let held = c.held().len();
        sleep(2.0 * TTL_MS).await;
        (c, (leases, held))
    })
    .await;
    assert_eq!(held, 5);
    for l in &leases {
        assert_eq!(l.status(), Status::Held);
        assert!(l.deadline() > now(), "deadline moved forward by heartbeats");
    }
    let ttl = leases[0].heartbeat().await.expect("manual heartbeat");
    assert_eq!(ttl as f64, TTL_MS);
    for (i, l) in leases.iter().enumerate() {
        let state = if i % 2 == 0 {
            SettleState::Done
        } else {
            SettleState::Failed
        };
        let v = l
            .settle(state, Some(js(json!({ "i": i }))), Some("why".into()))
            .await
            .unwrap();
        assert_eq!(
            Reflect::get(&v, &"state".into())
                .unwrap()
                .as_string()
                .as_deref(),
            Some(if i % 2 == 0 { "done" } else { "failed" })
        );
        assert_eq!(l.status(), Status::Settled(state));
        assert!(
            !l.signal().aborted(),
            "a settled lease is finished, not lost"
        );
    }
    assert!(c.held().is_empty());
    let e = leases[0]
        .settle(SettleState::Done, None, None)
        .await
        .unwrap_err();
    // Another settle of a settled lease: refused as the server would
    // refuse it (already_settled, naming the state), nothing sent.
    assert_eq!(e.code(), ErrorCode::AlreadySettled, "settled twice");
}

#[wasm_bindgen_test]
async fn enrollment_gives_credentials_once_and_reports_them() {
    if server().is_none() {
        return;
    }
    let (base, _) = server().unwrap();
    let q = fresh_queue("enroll");
    let token = enrollment_token(&q).await;
    let seen = std::rc::Rc::new(std::cell::RefCell::new(Vec::<JsValue>::new()));
    let s2 = seen.clone();
    let cb = wasm_bindgen::closure::Closure::<dyn FnMut(JsValue)>::new(move |c: JsValue| {
        s2.borrow_mut().push(c)
    });
    let mut cfg = config();
    cfg.on_credentials = Some(js_sys::Function::from(cb.as_ref().clone()));
    let client = agentstore::lease::ClientInner::new(
        base,
        agentstore::lease::Credentials {
            enrollment_token: Some(token.clone()),
            name: Some("browser-test".into()),
            ..Default::default()
        },
        cfg,
    )
    .unwrap();
    let id = enqueue(&q, json!({})).await;
    let (a, b) = futures::join!(client.claim(&q, None), client.claim(&q, None));
    assert!(
        a.is_ok() && b.is_ok(),
        "concurrent first calls share one enrollment"
    );
    assert_eq!(seen.borrow().len(), 1, "enrolled once");
    let creds = client.credentials();
    assert!(creds.access_token.is_some() && creds.refresh_token.is_some());
    assert_eq!(
        creds.enrollment_token, None,
        "the single-use token is dropped"
    );
    let it = item(id).await;
    assert!(it.worker_id.is_some(), "claimed as the enrolled worker");
    for l in client.held() {
        l.release().await.unwrap();
    }
    // The same enrollment token again within the server's replay grace (an
    // answer lost on the way back looks like this) enrolls no second worker:
    // it issues new credentials for the same one.
    let other = agentstore::lease::ClientInner::new(
        base,
        agentstore::lease::Credentials {
            enrollment_token: Some(token),
            ..Default::default()
        },
        config(),
    )
    .unwrap();
    let lease = match other.claim(&q, None).await {
        Ok(agentstore::lease::Claimed::Lease(l)) => l,
        _ => panic!("the replayed enrollment claims"),
    };
    assert_eq!(
        item(lease.item_id).await.worker_id,
        it.worker_id,
        "the same worker"
    );
    lease.release().await.unwrap();
}

#[wasm_bindgen_test]
async fn lease_fetch_stamps_token_and_epoch_and_aborts_with_the_lease() {
    if server().is_none() {
        return;
    }
    let q = fresh_queue("fetch");
    enqueue(&q, json!({})).await;
    let c = admin_client(config());
    let lease = claim(&c, &q).await;
    let api = agentstore::lease_api::Lease::from_inner(lease.clone());
    let init = js_sys::Object::new();
    let headers = js_sys::Object::new();
    Reflect::set(&headers, &"X-Mine".into(), &"1".into()).unwrap();
    Reflect::set(&init, &"headers".into(), &headers).unwrap();
    Reflect::set(&init, &"method".into(), &"POST".into()).unwrap();
    let user = web_sys::AbortController::new().unwrap();
    Reflect::set(&init, &"signal".into(), &user.signal()).unwrap();
    let (base, _) = server().unwrap();
    let req = api
        .prepare_request(format!("{base}/x").into(), init.clone().into())
        .unwrap();
    let h = req.headers();
    assert_eq!(
        h.get("x-lease-token").unwrap().as_deref(),
        Some(lease.token())
    );
    assert_eq!(h.get("x-lease-epoch").unwrap().as_deref(), Some("1"));
    assert_eq!(
        h.get("x-mine").unwrap().as_deref(),
        Some("1"),
        "caller's headers kept"
    );
    assert_eq!(req.method(), "POST");
    assert!(!req.signal().aborted());
    lease.release().await.unwrap();
    assert!(
        req.signal().aborted(),
        "in-flight requests abort with the lease"
    );
    let reason = req.signal().reason();
    assert_eq!(
        Reflect::get(&reason, &"name".into())
            .unwrap()
            .as_string()
            .as_deref(),
        Some("ClaimLostError")
    );
    // After the loss, fetch rejects at once with the ClaimLostError.
    let err = wasm_bindgen_futures::JsFuture::from(api.fetch("/".into(), JsValue::UNDEFINED))
        .await
        .unwrap_err();
    assert_eq!(
        Reflect::get(&err, &"reason".into())
            .unwrap()
            .as_string()
            .as_deref(),
        Some("released")
    );

    // The caller's own signal still aborts a request prepared on a live lease.
    enqueue(&q, json!({})).await;
    let l2 = claim(&c, &q).await;
    let api2 = agentstore::lease_api::Lease::from_inner(l2.clone());
    let req2 = api2
        .prepare_request("http://127.0.0.1:1/y".into(), init.into())
        .unwrap();
    user.abort();
    assert!(req2.signal().aborted());
    assert!(!l2.signal().aborted());
    l2.release().await.unwrap();
}

/// `lease.fetch` and `prepareRequest` take a `URL` object, as the platform's
/// `fetch` and `Request` do, and read its `href` through `URL.prototype`:
/// an own `href` or `toString` on the object is never run. Before, a `URL`
/// was refused as "not a string or a Request". Review finding.
#[wasm_bindgen_test]
async fn lease_fetch_takes_a_url_object_as_the_platforms_fetch_does() {
    let Some((base, _)) = server() else {
        return;
    };
    let q = fresh_queue("fetch-url");
    enqueue(&q, json!({})).await;
    let c = admin_client(config());
    let lease = claim(&c, &q).await;
    let api = agentstore::lease_api::Lease::from_inner(lease.clone());
    let url = web_sys::Url::new(&format!("{base}/v1/health")).unwrap();
    // Own properties that would answer something else, or throw.
    let thrower = js_sys::Function::new_no_args("throw new Error('own toString ran')");
    Reflect::set(&url, &"toString".into(), &thrower).unwrap();
    let desc = js_sys::Object::new();
    Reflect::set(&desc, &"get".into(), &thrower).unwrap();
    Reflect::define_property(&url, &"href".into(), &desc).unwrap();
    let req = api
        .prepare_request(url.clone().into(), JsValue::UNDEFINED)
        .unwrap();
    assert_eq!(req.url(), format!("{base}/v1/health"));
    assert_eq!(
        req.headers().get("x-lease-token").unwrap().as_deref(),
        Some(lease.token()),
        "the lease server's origin gets the token"
    );
    let other = web_sys::Url::new("http://127.0.0.1:1/collect").unwrap();
    let req = api
        .prepare_request(other.into(), JsValue::UNDEFINED)
        .unwrap();
    assert!(req.headers().get("x-lease-token").unwrap().is_none());
    // Sent: the test page's own URL (same origin, so no CORS preflight for
    // headers; not the lease server's, so no token).
    let location = Reflect::get(&js_sys::global(), &"location".into()).unwrap();
    let page = Reflect::get(&location, &"href".into())
        .unwrap()
        .as_string()
        .unwrap();
    let own = web_sys::Url::new(&page).unwrap();
    Reflect::set(&own, &"toString".into(), &thrower).unwrap();
    let answer: web_sys::Response =
        wasm_bindgen_futures::JsFuture::from(api.fetch(own.into(), JsValue::UNDEFINED))
            .await
            .expect("fetched")
            .into();
    assert_eq!(answer.status(), 200);
    assert_eq!(
        answer.url(),
        page.split('#').next().unwrap(),
        "the URL's href"
    );
    lease.release().await.unwrap();
}

#[wasm_bindgen_test]
async fn lease_headers_go_only_to_the_lease_servers_origin_and_origins_the_app_lists() {
    if server().is_none() {
        return;
    }
    let (base, _) = server().unwrap();
    let q = fresh_queue("origins");
    enqueue(&q, json!({})).await;
    enqueue(&q, json!({})).await;
    let token_of = |api: &agentstore::lease_api::Lease, url: &str| {
        api.prepare_request(url.into(), JsValue::UNDEFINED)
            .unwrap()
            .headers()
            .get("x-lease-token")
            .unwrap()
    };
    let plain = admin_client(config());
    let lease = claim(&plain, &q).await;
    let api = agentstore::lease_api::Lease::from_inner(lease.clone());
    assert_eq!(
        token_of(&api, &format!("{base}/v1/x")),
        Some(lease.token().to_owned())
    );
    // Another origin (a third party; here another port and another host name
    // of the same machine) gets the request, but never the token.
    assert_eq!(token_of(&api, "http://127.0.0.1:1/collect"), None);
    assert_eq!(
        token_of(&api, &base.replace("127.0.0.1", "localhost")),
        None
    );
    // A relative URL resolves against the page, not the lease server.
    assert_eq!(token_of(&api, "/api/run"), None);
    let req = api
        .prepare_request("http://127.0.0.1:1/collect".into(), JsValue::UNDEFINED)
        .unwrap();
    assert!(req.headers().get("x-lease-epoch").unwrap().is_none());
    lease.release().await.unwrap();
    assert!(req.signal().aborted(), "still aborted with the lease");

    // Listed origins receive the headers.
    let listed = admin_client(agentstore::lease::ClientConfig {
        header_origins: vec!["http://127.0.0.1:1".into()],
        ..config()
    });
    let l2 = claim(&listed, &q).await;
    let api2 = agentstore::lease_api::Lease::from_inner(l2.clone());
    assert_eq!(
        token_of(&api2, "http://127.0.0.1:1/collect"),
        Some(l2.token().to_owned())
    );
    assert_eq!(token_of(&api2, "http://127.0.0.1:2/collect"), None);
    l2.release().await.unwrap();
}

#[wasm_bindgen_test]
async fn an_unreachable_server_is_a_network_error_and_errors_are_js_errors() {
    let c = unreachable_client();
    let e = c.claim("q", None).await.err().expect("no server");
    assert_eq!(e.code(), ErrorCode::Network);
    assert!(e.is_transient());
    assert!(agentstore::lease::ClientInner::new("ftp://x", Default::default(), config()).is_err());

    let lost = LeaseError::ClaimLost {
        item_id: 7,
        reason: agentstore::lease::LossReason::ExpiredLocally,
        message: "m".into(),
    }
    .to_js();
    assert!(lost.is_instance_of::<js_sys::Error>());
    let get = |k: &str| Reflect::get(&lost, &k.into()).unwrap();
    assert_eq!(get("name").as_string().as_deref(), Some("ClaimLostError"));
    assert_eq!(get("code").as_string().as_deref(), Some("claim_lost"));
    assert_eq!(get("status").as_f64(), Some(409.0));
    assert_eq!(
        get("reason").as_string().as_deref(),
        Some("expired_locally")
    );
    assert_eq!(get("itemId").as_f64(), Some(7.0));
    let limited = LeaseError::RateLimited {
        retry_after_ms: 2000.0,
    }
    .to_js();
    assert_eq!(
        Reflect::get(&limited, &"name".into())
            .unwrap()
            .as_string()
            .as_deref(),
        Some("RateLimitedError")
    );
}

/// `lease.fetch` and `lease.prepareRequest` reject like every other call:
/// input the platform's `Request` refuses is a ValidationError, a fetch that
/// gets no answer a NetworkError, the caller's own abort an AbortError, each
/// a real `Error` with `name`, `code` and `status` (the platform's error is
/// its `cause`). Before, the platform's bare TypeError came through.
#[wasm_bindgen_test]
async fn lease_fetch_errors_have_a_name_code_and_status() {
    if server().is_none() {
        return;
    }
    let q = fresh_queue("fetch-errors");
    enqueue(&q, json!({})).await;
    let c = admin_client(config());
    let lease = claim(&c, &q).await;
    let api = agentstore::lease_api::Lease::from_inner(lease.clone());
    let named = |e: &JsValue| -> (String, String, f64) {
        assert!(e.is_instance_of::<js_sys::Error>(), "a real Error");
        let get = |k: &str| Reflect::get(e, &k.into()).unwrap();
        (
            get("name").as_string().unwrap_or_default(),
            get("code").as_string().unwrap_or_default(),
            get("status").as_f64().unwrap_or(f64::NAN),
        )
    };
    let validation = ("ValidationError".to_owned(), "validation".to_owned(), 400.0);
    let e = api
        .prepare_request("http://[".into(), JsValue::UNDEFINED)
        .unwrap_err();
    assert_eq!(named(&e), validation);
    assert!(Reflect::get(&e, &"cause".into())
        .unwrap()
        .is_instance_of::<js_sys::TypeError>());
    let fetch = |input: &str, init: JsValue| {
        wasm_bindgen_futures::JsFuture::from(api.fetch(input.into(), init))
    };
    assert_eq!(
        named(&fetch("http://[", JsValue::UNDEFINED).await.unwrap_err()),
        validation
    );
    let get_with_body = js_sys::Object::new();
    Reflect::set(&get_with_body, &"method".into(), &"GET".into()).unwrap();
    Reflect::set(&get_with_body, &"body".into(), &"x".into()).unwrap();
    assert_eq!(
        named(&fetch("/x", get_with_body.into()).await.unwrap_err()),
        validation
    );
    // Port 1: browsers refuse it (an unsafe port) and nothing listens; either
    // way no answer.
    let e = fetch("http://127.0.0.1:1/y", JsValue::UNDEFINED)
        .await
        .unwrap_err();
    assert_eq!(named(&e), ("NetworkError".into(), "network".into(), 503.0));
    // The caller's own abort, whatever its reason, is an AbortError whose
    // cause is that reason (never a retryable NetworkError).
    for reason in [
        JsValue::UNDEFINED,
        js_sys::Error::new("cancel").into(),
        "a string".into(),
        // Looks like one of the SDK's errors, but is the caller's reason.
        js(json!({"code": "mine"})),
    ] {
        let user = web_sys::AbortController::new().unwrap();
        user.abort_with_reason(&reason);
        let init = js_sys::Object::new();
        Reflect::set(&init, &"signal".into(), &user.signal()).unwrap();
        let e = fetch("http://127.0.0.1:1/y", init.into())
            .await
            .unwrap_err();
        assert_eq!(named(&e), ("AbortError".into(), "aborted".into(), 499.0));
        if !reason.is_undefined() {
            assert_eq!(Reflect::get(&e, &"cause".into()).unwrap(), reason);
        }
    }
    // A page's fetch wrapper rejecting with a plain object that has a
    // `code` (not one of the SDK's errors) is still a NetworkError, the
    // object its cause (a review finding: it came through as it was).
    let hook = js_sys::Function::new_no_args(
        "const real = globalThis.fetch;
        const plain = { code: 'ECONNRESET' };
        const own = Object.assign(new Error('mine'), { code: 'network' });
        let next = plain;
        globalThis.fetch = () => Promise.reject(next);
        return { plain, own, useOwn: () => { next = own; }, restore: () => { globalThis.fetch = real; } };",
    )
    .call0(&JsValue::NULL)
    .unwrap();
    let e = fetch("/z", JsValue::UNDEFINED).await.unwrap_err();
    // The page's own Error that carries one of the SDK's codes, without its
    // name, is not one of the SDK's errors either.
    call_method(&hook, "useOwn", &[]);
    let e2 = fetch("/z", JsValue::UNDEFINED).await.unwrap_err();
    call_method(&hook, "restore", &[]);
    for (e, cause) in [(e, "plain"), (e2, "own")] {
        assert_eq!(named(&e), ("NetworkError".into(), "network".into(), 503.0));
        assert_eq!(
            Reflect::get(&e, &"cause".into()).unwrap(),
            Reflect::get(&hook, &cause.into()).unwrap()
        );
    }
    assert!(
        !lease.signal().aborted(),
        "the caller's abort leaves the lease held"
    );
    lease.release().await.unwrap();
}

/// The lease side of the bounded nesting (see the store's
/// `a_getter_that_calls_the_store_again_is_bounded_and_every_call_settles`):
/// a `RequestInit` getter that calls `lease.prepareRequest` with itself
/// again, and a settle `result` whose getter settles again, are cut off
/// with a ValidationError; the lease still settles once.
#[wasm_bindgen_test]
async fn a_getter_that_calls_the_lease_again_is_bounded() {
    if server().is_none() {
        return;
    }
    let q = fresh_queue("reenter");
    let id = enqueue(&q, json!({})).await;
    let c = admin_client(config());
    let lease = claim(&c, &q).await;
    let api = agentstore::lease_api::Lease::from_inner(lease.clone());
    let body = "return (async () => {
        const codes = [];
        const init = { get method() {
            try { l.prepareRequest('/x', init); codes.push('ok'); } catch (e) { codes.push(e.code); }
            return 'GET';
        } };
        l.prepareRequest('/x', init);
        // An object that only claims Request's prototype (its getters
        // throw): the calls after it still work.
        for (let i = 0; i < 20; i++) {
            try { l.prepareRequest(Object.create(Request.prototype)); codes.push('accepted'); }
            catch (e) { codes.push('fake:' + e.code); }
        }
        l.prepareRequest('/x');
        const settles = [];
        const result = { get n() { settles.push(l.settle('done', result)); return 1; } };
        settles.push(l.settle('done', result));
        const outcomes = [];
        for (let i = 0; i < settles.length; i++) {
            outcomes.push(await settles[i].then(() => 'ok', (e) => e instanceof Error ? e.code : 'not an Error'));
        }
        return { codes, outcomes };
    })();";
    let f = js_sys::Function::new_with_args("l", body);
    let out = wasm_bindgen_futures::JsFuture::from(js_sys::Promise::from(
        f.call1(&JsValue::NULL, &JsValue::from(api)).unwrap(),
    ))
    .await
    .expect("every call settles");
    let strings = |k: &str| -> Vec<String> {
        js_sys::Array::from(&Reflect::get(&out, &k.into()).unwrap())
            .iter()
            .map(|v| v.as_string().unwrap_or_default())
            .collect()
    };
    let codes = strings("codes");
    assert!(codes.contains(&"validation".to_owned()), "{codes:?}");
    // (`new Request(fake)` reads it as a URL string: accepted, or refused
    // with a ValidationError — never an exception past the module.)
    assert_eq!(
        codes
            .iter()
            .filter(|c| *c == "fake:validation" || *c == "accepted")
            .count(),
        20,
        "{codes:?}"
    );
    assert!(codes.len() < 84, "bounded: {}", codes.len());
    let outcomes = strings("outcomes");
    assert!(outcomes.contains(&"validation".to_owned()), "{outcomes:?}");
    assert!(outcomes.iter().any(|o| o == "ok"), "{outcomes:?}");
    let it = item(id).await;
    assert_eq!(it.state, ItemState::Done);
}

/// The answer of a page's own `fetch` wrapper (a mock, an interceptor) is
/// read without copying a long string into wasm memory: header values
/// longer than any the server sends are ignored, an error's `code` that is
/// not one of the protocol's is not read, and its `message` is kept up to
/// its first 8 KiB. Before, each was copied whole.
#[wasm_bindgen_test]
async fn a_fetch_wrappers_huge_headers_or_error_body_are_never_copied_into_wasm_memory() {
    if server().is_none() {
        return;
    }
    let c = admin_client(config());
    let units = wasm_memory_bytes() + f64::from(4u32 << 20);
    let global = js_sys::global();
    let real = Reflect::get(&global, &"fetch".into()).unwrap();
    let fake = js_sys::Function::new_with_args(
        "code",
        &format!(
            "const big = 'x'.repeat({units});
            return () => Promise.resolve({{
                status: 400,
                headers: {{ get: () => big }},
                json: async () => ({{ code: code === 'big' ? big : code, message: big }}),
            }});"
        ),
    );
    let before = wasm_memory_bytes();
    let mut errors = Vec::new();
    for code in ["bad_request", "big"] {
        let f = fake.call1(&JsValue::NULL, &code.into()).unwrap();
        Reflect::set(&global, &"fetch".into(), &f).unwrap();
        let out = c.claim("huge-answers", None).await;
        Reflect::set(&global, &"fetch".into(), &real).unwrap();
        errors.push(out.err().expect("a 400 is an error"));
    }
    let grew = wasm_memory_bytes() - before;
    assert!(
        grew < f64::from(2u32 << 20),
        "linear memory grew by {grew} bytes"
    );
    assert_eq!(errors[0].code(), ErrorCode::BadRequest);
    assert!(errors[0].message().starts_with("xxx"));
    assert!(
        errors[0].message().len() <= 8192,
        "{} bytes",
        errors[0].message().len()
    );
    assert_eq!(
        errors[1].message(),
        "the lease server answered without an error body",
        "a code that is none of the protocol's is not one"
    );
}

/// A 2xx answer of a page's own `fetch` wrapper is read field by field,
/// each string bounded before it is copied: a claim answer whose lease
/// `token` is longer than the module's whole memory is refused as the
/// server's `internal` error without being copied into wasm memory, and one
/// whose item carries a huge `last_error`, `payload`, ten million tags or
/// a thousand levels of nesting (fields the module never reads) still
/// claims. Before, serde-wasm-bindgen copied the token whole.
#[wasm_bindgen_test]
async fn a_fetch_wrappers_huge_success_answer_is_never_copied_into_wasm_memory() {
    if server().is_none() {
        return;
    }
    let c = admin_client(config());
    let units = wasm_memory_bytes() + f64::from(4u32 << 20);
    let global = js_sys::global();
    let real = Reflect::get(&global, &"fetch".into()).unwrap();
    // An item id no test's server reaches, so the fake lease's later
    // heartbeats and release touch nothing.
    let fake = js_sys::Function::new_with_args(
        "kind",
        &format!(
            "const big = 'x'.repeat({units});
            const id = 2 ** 52;
            const lease = {{ token: 't'.repeat(43), epoch: 1, ttl_ms: 30000, heartbeat_ms: 10000 }};
            let deep = {{}};
            for (let i = 0; i < 1000; i++) deep = {{ next: deep }};
            const body = {{
                token: {{ item: {{ id, epoch: 1 }}, lease: {{ ...lease, token: big }} }},
                ignored: {{
                    item: {{ id, epoch: 1, last_error: big, payload: {{ big }}, tags: new Array(1e7).fill(0), deep }},
                    lease,
                }},
            }}[kind];
            return () => Promise.resolve({{
                status: 201,
                headers: {{ get: () => null }},
                json: async () => body,
            }});"
        ),
    );
    let before = wasm_memory_bytes();
    for kind in ["token", "ignored"] {
        let f = fake.call1(&JsValue::NULL, &kind.into()).unwrap();
        Reflect::set(&global, &"fetch".into(), &f).unwrap();
        let out = c.claim("huge-success", None).await;
        Reflect::set(&global, &"fetch".into(), &real).unwrap();
        match (kind, out) {
            ("ignored", Ok(agentstore::lease::Claimed::Lease(l))) => {
                assert_eq!(l.item_id, 1i64 << 52);
                assert!(Reflect::get(&l.item, &"payload".into())
                    .unwrap()
                    .is_object());
                let _ = l.release().await;
            }
            ("ignored", other) => panic!("claims: {:?}", other.err()),
            (_, out) => {
                let e = out.err().unwrap_or_else(|| panic!("{kind}: refused"));
                assert_eq!(e.code(), ErrorCode::Internal, "{kind}");
            }
        }
    }
    let grew = wasm_memory_bytes() - before;
    assert!(
        grew < f64::from(2u32 << 20),
        "linear memory grew by {grew} bytes"
    );
}

/// A batched heartbeat answer whose error for a lease carries a code this
/// client does not know (a newer server's) is not taken for a lost claim:
/// the answer is unreadable, so the pass counts as failed and is retried,
/// and the lease still settles once the server answers again.
#[wasm_bindgen_test]
async fn a_heartbeat_error_code_the_client_does_not_know_never_loses_the_lease() {
    if server().is_none() {
        return;
    }
    let q = fresh_queue("unknown-code");
    let id = enqueue(&q, json!({})).await;
    let c = admin_client(config());
    let lease = claim(&c, &q).await;
    let hook = js_sys::Function::new_with_args(
        "id",
        "const real = globalThis.fetch;
        let n = 0;
        globalThis.fetch = (url, init) => {
            if (!String(url).endsWith('/v1/heartbeats')) return real(url, init);
            n++;
            return Promise.resolve({
                status: 200,
                headers: { get: () => null },
                json: async () => ({ results: [{ item_id: id, ok: false,
                    error: { code: 'shed_load', message: 'try later' } }] }),
            });
        };
        return { count: () => n, restore: () => { globalThis.fetch = real; } };",
    )
    .call1(&JsValue::NULL, &JsValue::from(id as f64))
    .unwrap();
    let call = |k: &str| call_method(&hook, k, &[]);
    // Two answers: the first was read before the second pass went out.
    let seen = within(4.0 * TTL_MS, async {
        while call("count").as_f64().unwrap_or(0.0) < 2.0 {
            sleep(10.0).await;
        }
    })
    .await;
    call("restore");
    assert!(seen.is_some(), "the loop sent no heartbeat");
    if let Some(e) = lease.lost_error() {
        // A slow machine may run past the local deadline meanwhile; what
        // must never happen is a claim taken for lost.
        assert_ne!(loss(&e), Some("claim_lost"), "{e:?}");
        return;
    }
    lease
        .settle(SettleState::Done, None, None)
        .await
        .expect("settles");
    assert_eq!(item(id).await.state, ItemState::Done);
}

/// A `Lease` keeps its `LeaseClient` alive: with the client freed (as the
/// garbage collector frees `await new LeaseClient(url, o).claim(q)`'s)
/// while the app still holds the lease, the lease stays held, is renewed
/// by a heartbeat and settles. Before, freeing the client
/// released its leases under the app: the lease ended `released`.
#[wasm_bindgen_test]
async fn a_lease_outlives_its_freed_client_and_keeps_heartbeating() {
    use agentstore::lease_api::Lease;
    use wasm_bindgen::convert::TryFromJsValue as _;
    let Some((base, token)) = server() else {
        return;
    };
    // The first heartbeat must be answered within 2.2 s of leaving (the
    // claim's 2.7 s less the 0.5 s interval): a round in which the page or a
    // lease request stalled (a busy machine) is run again, its lease given
    // back (see `unstalled_rounds`).
    let (id, lease, status) = unstalled_rounds(
        Rounds::default(),
        |_| async {
            let q = fresh_queue("orphan");
            let id = enqueue(&q, json!({})).await;
            let options = js_sys::Object::new();
            for (k, v) in [
                ("accessToken", JsValue::from(token)),
                ("journal", JsValue::FALSE),
                ("releaseOnPagehide", JsValue::FALSE),
            ] {
                Reflect::set(&options, &k.into(), &v).unwrap();
            }
            let client =
                agentstore::lease_api::LeaseClient::new(base.into(), options.into()).unwrap();
            let v = wasm_bindgen_futures::JsFuture::from(
                client.claim(q.as_str().into(), JsValue::UNDEFINED),
            )
            .await
            .expect("claim");
            let lease = Lease::try_from_js_value(v).expect("a Lease");
            drop(client);
            // Until a heartbeat's answer renews it (the deadline moves only
            // then), the lease must stay held; freed, the client released it
            // at once.
            let first = lease.inner().deadline();
            let status = within(4.0 * TTL_MS, async {
                loop {
                    let s = lease.status();
                    if s != "held" || lease.inner().deadline() > first {
                        return s;
                    }
                    sleep(20.0).await;
                }
            })
            .await;
            (id, lease, status)
        },
        |(_, lease, _)| async move {
            let _ = lease.inner().release().await;
        },
    )
    .await;
    assert_eq!(status.as_deref(), Some("held"), "renewed by a heartbeat");
    wasm_bindgen_futures::JsFuture::from(lease.settle(
        "done".into(),
        JsValue::UNDEFINED,
        JsValue::UNDEFINED,
    ))
    .await
    .expect("settles");
    assert_eq!(item(id).await.state, ItemState::Done);
}

/// A client holding more leases than one batched heartbeat carries (500)
/// sends every batch of a pass at once: a batch whose answer hangs never
/// holds back the heartbeat of the leases in the next one. Before, the
/// batches went one after another, so lease 501 got no heartbeat until the
/// first batch's request timed out (30 s) and could expire locally meanwhile.
#[wasm_bindgen_test]
async fn a_hanging_heartbeat_batch_never_holds_back_the_next_one() {
    if server().is_none() {
        return;
    }
    // Claims and heartbeats answered by a fake `fetch` (item ids no test's
    // server reaches); the batch holding the first lease never answers.
    let hook = fake_fetch(
        "const first = 2 ** 52;
        const seen = new Set();
        let next = 0;
        globalThis.fetch = async (url, init) => {
            url = String(url);
            if (url.endsWith('/claims')) {
                const id = first + next++;
                return answer(201, { item: { id, epoch: 1 }, lease: { token: 't'.repeat(43),
                    epoch: 1, ttl_ms: 60000, heartbeat_ms: 1 } });
            }
            if (url.endsWith('/v1/heartbeats')) {
                const { leases } = JSON.parse(init.body);
                for (const l of leases) seen.add(l.item_id);
                if (leases.some((l) => l.item_id === first)) return new Promise(() => {});
                return answer(200, { results: leases.map((l) => ({ item_id: l.item_id, ok: true, ttl_ms: 60000 })) });
            }
            return answer(204, null);
        };
        return { seen: (id) => seen.has(id), restore: () => { globalThis.fetch = real; } };",
    );
    let c = admin_client(agentstore::lease::ClientConfig {
        use_locks: false,
        ..config()
    });
    // Each lease's heartbeats wait until all are claimed (its heartbeat is
    // due at once: a 1 ms interval), so one pass sends all 501, the first
    // lease in the first batch.
    let mut leases = Vec::new();
    for _ in 0..501 {
        let l = claim(&c, "many").await;
        l.set_heartbeats_paused(true);
        leases.push(l);
    }
    for l in &leases {
        l.set_heartbeats_paused(false);
    }
    let last = leases[500].item_id;
    let seen = |id: i64| call_method(&hook, "seen", &[JsValue::from(id as f64)]).is_truthy();
    let sent = within(10_000.0, async {
        while !seen(last) {
            sleep(10.0).await;
        }
    })
    .await;
    c.close().await;
    call_method(&hook, "restore", &[]);
    assert!(seen(1i64 << 52), "the first batch went out");
    assert!(
        sent.is_some(),
        "lease 501's heartbeat waited for the hanging batch"
    );
}

/// A batched heartbeat answer whose `results` throw when read (a revoked
/// Proxy, an array whose element getter throws: what a page's own `fetch`
/// wrapper may hand back) is an unreadable answer, retried like any other:
/// the next heartbeat goes out and renews the lease. Before, the reads were
/// not catching calls, the exception went through the module's frames and
/// the heartbeat task stopped half-way, its leases never heartbeated again.
#[wasm_bindgen_test]
async fn a_heartbeat_answer_that_throws_when_read_is_retried_not_thrown_through_the_module() {
    if server().is_none() {
        return;
    }
    for hostile in [
        "(() => { const r = Proxy.revocable([], {}); r.revoke(); return r.proxy; })()",
        "(() => { const a = [{}]; Object.defineProperty(a, 0, { get() { throw new Error('no'); } }); return a; })()",
    ] {
        let hook = fake_fetch(&format!(
            "let beats = 0;
            globalThis.fetch = async (url, init) => {{
                url = String(url);
                if (url.endsWith('/claims')) {{
                    return answer(201, {{ item: {{ id: 2 ** 52, epoch: 1 }}, lease: {{ token: 't'.repeat(43),
                        epoch: 1, ttl_ms: 60000, heartbeat_ms: 50 }} }});
                }}
                if (url.endsWith('/v1/heartbeats')) {{
                    beats += 1;
                    if (beats === 1) return answer(200, {{ results: {hostile} }});
                    const {{ leases }} = JSON.parse(init.body);
                    return answer(200, {{ results: leases.map((l) => ({{ item_id: l.item_id, ok: true, ttl_ms: 60000 }})) }});
                }}
                return answer(204, null);
            }};
            return {{ beats: () => beats, restore: () => {{ globalThis.fetch = real; }} }};"
        ));
        let c = admin_client(agentstore::lease::ClientConfig {
            use_locks: false,
            ..config()
        });
        let lease = claim(&c, "hostile").await;
        let beats = || call_method(&hook, "beats", &[]).as_f64().unwrap_or(0.0);
        let again = within(10_000.0, async {
            while beats() < 2.0 {
                sleep(10.0).await;
            }
        })
        .await;
        let status = lease.status();
        c.close().await;
        call_method(&hook, "restore", &[]);
        assert!(again.is_some(), "{hostile}: no heartbeat after the answer");
        assert_eq!(status, agentstore::lease::Status::Held, "{hostile}");
    }
}

/// A client of the test server with made-up access and refresh tokens and
/// no Web Locks, for tests whose `fake_fetch` answers every request.
fn client_with_made_up_tokens() -> std::rc::Rc<agentstore::lease::ClientInner> {
    let (base, _) = server().unwrap();
    agentstore::lease::ClientInner::new(
        base,
        agentstore::lease::Credentials {
            access_token: Some("a".repeat(43)),
            refresh_token: Some("r".repeat(43)),
            ..Default::default()
        },
        agentstore::lease::ClientConfig {
            use_locks: false,
            ..config()
        },
    )
    .expect("client")
}

/// A settle answered `401` whose credential refresh outlasts the lease's
/// local deadline is not sent again: the lease is lost (`expired_locally`)
/// and the settle rejects with that, one settle on the wire. Before, the
/// refreshed credential resent it past the deadline, when the server may
/// already have handed the item to another worker (the same for a
/// heartbeat).
#[wasm_bindgen_test]
async fn a_call_refused_401_is_not_sent_again_past_the_local_deadline() {
    if server().is_none() {
        return;
    }
    let hook = fake_fetch(
        "let settles = 0;
        globalThis.fetch = async (url, init) => {
            url = String(url);
            if (url.endsWith('/claims')) {
                return answer(201, { item: { id: 2 ** 52, epoch: 1 }, lease: { token: 't'.repeat(43),
                    epoch: 1, ttl_ms: 1500, heartbeat_ms: 60000 } });
            }
            if (url.endsWith('/settle')) {
                settles += 1;
                return answer(401, { code: 'unauthorized', message: 'the access token expired' });
            }
            if (url.endsWith('/v1/workers/refresh')) {
                await new Promise((r) => setTimeout(r, 2500));
                return answer(200, { worker_id: 1, access_token: 'b'.repeat(43),
                    access_expires_in_ms: 900000, refresh_token: 'r'.repeat(43) });
            }
            // Heartbeats never answer: nothing renews the lease.
            return new Promise(() => {});
        };
        return { settles: () => settles, restore: () => { globalThis.fetch = real; } };",
    );
    let c = client_with_made_up_tokens();
    let lease = claim(&c, "refresh").await;
    let settled = lease
        .settle(agentstore_protocol::lease::SettleState::Done, None, None)
        .await;
    let settles = call_method(&hook, "settles", &[]).as_f64();
    let status = lease.status();
    call_method(&hook, "restore", &[]);
    c.close().await;
    assert_eq!(
        settles,
        Some(1.0),
        "sent again past the deadline: {settled:?}"
    );
    assert!(settled.is_err(), "{settled:?}");
    assert_eq!(
        status,
        agentstore::lease::Status::Lost(agentstore::lease::LossReason::ExpiredLocally)
    );
}

/// A batched heartbeat refused `401` whose credential refresh outlasts one
/// of its leases' local deadline is sent again without that lease's token:
/// the lease is lost (`expired_locally`, released), and only the leases
/// still held before their deadline go out with the refreshed credential.
/// Before, the body built for the first attempt was sent again as it was:
/// `gone` skipped the lease already marked lost, and the server renewed a
/// lease the page had given up (racing its release).
#[wasm_bindgen_test]
async fn a_heartbeat_resent_after_a_refresh_leaves_out_a_lease_past_its_deadline() {
    if server().is_none() {
        return;
    }
    let hook = fake_fetch(
        "let refreshed = false;
        const after = [];
        let claims = 0;
        globalThis.fetch = async (url, init) => {
            url = String(url);
            if (url.endsWith('/claims')) {
                claims += 1;
                // The first lease runs out 1.35 s after its claim; the second
                // one lives a minute.
                const ttl = claims === 1 ? 1500 : 60000;
                return answer(201, { item: { id: 2 ** 52 + claims, epoch: 1 }, lease: {
                    token: (claims === 1 ? 't' : 'u').repeat(43), epoch: 1, ttl_ms: ttl, heartbeat_ms: 100 } });
            }
            if (url.endsWith('/v1/workers/refresh')) {
                await new Promise((r) => setTimeout(r, 2500));
                refreshed = true;
                return answer(200, { worker_id: 1, access_token: 'b'.repeat(43),
                    access_expires_in_ms: 900000, refresh_token: 's'.repeat(43) });
            }
            const auth = new Headers(init.headers).get('Authorization');
            if (auth !== 'Bearer ' + 'b'.repeat(43)) {
                return answer(401, { code: 'unauthorized', message: 'the access token expired' });
            }
            if (url.endsWith('/v1/heartbeats')) {
                const { leases } = JSON.parse(init.body);
                after.push(init.body);
                return answer(200, { results: leases.map((l) => ({ item_id: l.item_id, ok: true, ttl_ms: 60000 })) });
            }
            if (url.endsWith('/release')) {
                const id = Number(url.split('/').at(-2));
                return answer(200, { id, state: 'open' });
            }
            return answer(204, null);
        };
        return { bodies: () => after.join('\\n'), count: () => after.length, refreshed: () => refreshed,
            restore: () => { globalThis.fetch = real; } };",
    );
    let c = client_with_made_up_tokens();
    let short = claim(&c, "resent").await;
    let long = claim(&c, "resent").await;
    // Heartbeats after the refresh: the live lease's renewed (bounded).
    let renewed = within(15_000.0, async {
        while !(call_method(&hook, "refreshed", &[]).is_truthy()
            && call_method(&hook, "bodies", &[])
                .as_string()
                .is_some_and(|b| b.contains(&"u".repeat(43))))
        {
            sleep(10.0).await;
        }
    })
    .await;
    let bodies = call_method(&hook, "bodies", &[]).as_string().unwrap();
    let (short_status, long_status) = (short.status(), long.status());
    call_method(&hook, "restore", &[]);
    c.close().await;
    assert!(
        renewed.is_some(),
        "the held lease was heartbeated after the refresh"
    );
    assert!(
        !bodies.contains(&"t".repeat(43)),
        "the lease past its deadline was heartbeated after the refresh: {bodies}"
    );
    assert_eq!(
        short_status,
        agentstore::lease::Status::Lost(agentstore::lease::LossReason::ExpiredLocally)
    );
    assert_eq!(long_status, agentstore::lease::Status::Held);
}

/// A heartbeat sent before a settle whose outcome stayed unknown (no answer:
/// it may have landed), answered `claim_lost` while the settle sent again is
/// out, and that retry refused without landing (a 429): the server holds no
/// lease under the token, so the lease reads lost (`claim_lost`), but the
/// first attempt may have caused the answer, so a later retry still goes
/// out, and the server's replay of the first ends the lease settled.
#[wasm_bindgen_test]
async fn a_loss_verdict_after_a_settle_of_unknown_outcome_leaves_a_later_retry_the_last_word() {
    if server().is_none() {
        return;
    }
    let hook = fake_fetch(
        "let release = null;
        let settles = 0;
        const lost = (init) => answer(200, { results: JSON.parse(init.body).leases.map((l) =>
            ({ item_id: l.item_id, ok: false, error: { code: 'claim_lost', message: 'the settle landed' } })) });
        globalThis.fetch = async (url, init) => {
            url = String(url);
            if (url.endsWith('/claims')) {
                return answer(201, { item: { id: 2 ** 52, epoch: 1 }, lease: { token: 't'.repeat(43),
                    epoch: 1, ttl_ms: 60000, heartbeat_ms: 100 } });
            }
            if (url.endsWith('/v1/heartbeats')) {
                if (release) return lost(init);
                // The first heartbeat's answer waits for the first settle.
                return new Promise((resolve) => { release = () => resolve(lost(init)); });
            }
            if (url.endsWith('/settle')) {
                settles += 1;
                if (settles === 1) throw new TypeError('Failed to fetch');
                // The replay of the first, which landed.
                if (settles === 3) return answer(200, { id: 2 ** 52, state: 'done' });
                // The heartbeat sent before the first settle is answered
                // while the second is out.
                release();
                await new Promise((r) => setTimeout(r, 50));
                return answer(429, { code: 'rate_limited', message: 'slow down' });
            }
            return answer(204, null);
        };
        return { held: () => release !== null, settles: () => settles,
            restore: () => { globalThis.fetch = real; } };",
    );
    let c = admin_client(agentstore::lease::ClientConfig {
        use_locks: false,
        ..config()
    });
    let lease = claim(&c, "unknown-then-refused").await;
    let held = within(10_000.0, async {
        while !call_method(&hook, "held", &[]).is_truthy() {
            sleep(10.0).await;
        }
    })
    .await;
    let done = agentstore_protocol::lease::SettleState::Done;
    let first = lease.settle(done, None, None).await;
    let second = lease.settle(done, None, None).await;
    let status = lease.status();
    let third = lease.settle(done, None, None).await;
    let settles = call_method(&hook, "settles", &[]).as_f64();
    c.close().await;
    call_method(&hook, "restore", &[]);
    assert!(held.is_some(), "a heartbeat went out");
    assert!(matches!(first, Err(LeaseError::Network(_))), "{first:?}");
    assert!(second.is_err(), "{second:?}");
    assert_eq!(
        status,
        Status::Lost(agentstore::lease::LossReason::ClaimLost),
        "{second:?}"
    );
    assert!(third.is_ok(), "{third:?}");
    assert_eq!(settles, Some(3.0));
    assert_eq!(lease.status(), Status::Settled(done));
}

/// A settle result, error message, state or URL longer than the module's
/// whole memory goes through (or is refused) without being copied into it:
/// wasm memory never shrinks, so a copy would keep the page that large.
#[wasm_bindgen_test]
async fn a_huge_settle_result_or_argument_is_never_copied_into_wasm_memory() {
    if server().is_none() {
        return;
    }
    let q = fresh_queue("huge");
    let id = enqueue(&q, json!({})).await;
    let c = admin_client(config());
    let lease = claim(&c, &q).await;
    let api = agentstore::lease_api::Lease::from_inner(lease.clone());
    let units = wasm_memory_bytes() + f64::from(4u32 << 20);
    let before = wasm_memory_bytes();
    let body = format!(
        "return (async () => {{
        const out = {{}};
        {SETTLE_JS}
        const big = 'x'.repeat({units});
        out.url = await settle(() => l.prepareRequest(big));
        out.state = await settle(() => l.settle(big));
        out.error = await settle(() => l.settle('failed', undefined, {{ error: big }}));
        // Larger than the server's body limit: refused there.
        out.result = await settle(() => l.settle('done', {{ big }}));
        return out;
    }})();"
    );
    let f = js_sys::Function::new_with_args("l", &body);
    let out = wasm_bindgen_futures::JsFuture::from(js_sys::Promise::from(
        f.call1(&JsValue::NULL, &JsValue::from(api)).unwrap(),
    ))
    .await
    .expect("every call settles");
    let grew = wasm_memory_bytes() - before;
    let got = |k: &str| {
        Reflect::get(&out, &k.into())
            .ok()
            .and_then(|v| v.as_string())
            .unwrap_or_default()
    };
    assert!(
        grew < f64::from(2u32 << 20),
        "linear memory grew by {grew} bytes"
    );
    assert_eq!(got("url"), "validation");
    assert_eq!(got("state"), "validation");
    assert_eq!(got("error"), "validation");
    assert_ne!(
        got("result"),
        "ok",
        "the server refuses a body over its limit"
    );
    // (Chromium reads the 413; Firefox sees the connection closed: an
    // unknown outcome, which a later settle would resend as it was.)
    assert_ne!(item(id).await.state, ItemState::Done);
}

/// Calls the method `name` of the JS object `obj` (a test hook) with `args`.
fn call_method(obj: &JsValue, name: &str, args: &[JsValue]) -> JsValue {
    js_sys::Function::from(Reflect::get(obj, &name.into()).unwrap())
        .apply(obj, &args.iter().collect::<js_sys::Array>())
        .unwrap()
}

/// The request bodies and journal entries the client builds field by field
/// (src/lease/wire.rs) carry exactly the protocol's serde names: each
/// decodes with serde (`deny_unknown_fields`) to the value it was built
/// from, each answer serde writes reads back as written, and a journal
/// entry reads back as written.
#[wasm_bindgen_test]
fn the_wire_reader_and_writer_match_the_protocols_serde_form() {
    use agentstore::lease::journal::Entry;
    use agentstore::lease::wire::{FromWire, ToWire};
    use agentstore_protocol::lease::*;
    use agentstore_protocol::ErrorBody;
    fn sent<T: ToWire + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug>(v: T) {
        let text = String::from(js_sys::JSON::stringify(&v.to_wire()).unwrap());
        assert_eq!(serde_json::from_str::<T>(&text).expect(&text), v);
    }
    fn answered<T: FromWire + serde::Serialize + PartialEq + std::fmt::Debug>(v: T) {
        let text = serde_json::to_string(&v).unwrap();
        let js = js_sys::JSON::parse(&text).unwrap();
        assert_eq!(T::from_wire(&js), Some(v), "{text}");
    }
    sent(TokenRequest {
        token: "t".repeat(43),
    });
    sent(BatchHeartbeatRequest {
        leases: vec![
            BatchHeartbeatEntry {
                item_id: 1,
                token: "a".into(),
            },
            BatchHeartbeatEntry {
                item_id: (1 << 53) - 1,
                token: "b".into(),
            },
        ],
    });
    sent(EnrollRequest {
        token: "e".into(),
        name: None,
    });
    sent(EnrollRequest {
        token: "e".into(),
        name: Some("w".into()),
    });
    sent(RefreshRequest {
        refresh_token: "r".into(),
    });
    let lease = Lease {
        token: "t".into(),
        epoch: 3,
        ttl_ms: 30_000,
        heartbeat_ms: 10_000,
    };
    answered(ClaimedRef {
        item: ItemRef { id: 7, epoch: 3 },
        lease,
    });
    answered(HeartbeatResponse { ttl_ms: 30_000 });
    answered(BatchHeartbeatResponse {
        results: vec![
            BatchHeartbeatResult {
                item_id: 1,
                ok: true,
                ttl_ms: Some(30_000),
                error: None,
            },
            BatchHeartbeatResult {
                item_id: 2,
                ok: false,
                ttl_ms: None,
                error: Some(ErrorBody {
                    code: agentstore_protocol::ErrorCode::ClaimLost,
                    message: "gone".into(),
                    settled: None,
                }),
            },
        ],
    });
    answered(WorkerCredentials {
        worker_id: 9,
        access_token: "a".into(),
        access_expires_in_ms: 900_000,
        refresh_token: "r".into(),
    });
    let entry = Entry {
        base: "http://127.0.0.1:9".into(),
        item_id: 5,
        token: "t".into(),
        epoch: 2,
        queue: "q".into(),
        ttl_ms: 30_000,
        heartbeat_ms: 10_000,
        locked: false,
    };
    assert!(Entry::from_wire(&entry.to_wire()) == Some(entry));
}

/// A 2xx answer to a settle or a release that is not the lease server's
/// confirmation (a service worker queueing POSTs while offline, a captive
/// portal) is an unknown outcome, not a settle: the lease stays held, and
/// the identical settle sent again once the server answers settles it. The
/// same for a release (`{id}` of another item). Before, any 2xx marked the
/// lease settled and dropped its journal entry while the server still held
/// the item running, to be reaped at the TTL with an attempt spent.
#[wasm_bindgen_test]
async fn a_2xx_answer_that_is_not_the_servers_confirmation_settles_nothing() {
    if server().is_none() {
        return;
    }
    let q = fresh_queue("not-confirmed");
    let id = enqueue(&q, json!({})).await;
    let other = enqueue(&q, json!({})).await;
    let c = admin_client(config());
    let lease = claim(&c, &q).await;
    assert_eq!(lease.item_id, id);
    let hook = js_sys::Function::new_with_args(
        "other",
        "const real = globalThis.fetch;
        globalThis.fetch = (url, init) => {
            const u = String(url);
            if (u.endsWith('/settle')) return Promise.resolve(new Response('queued offline', { status: 202 }));
            if (u.endsWith('/release')) return Promise.resolve(Response.json({ id: other }));
            return real(url, init);
        };
        return { restore: () => { globalThis.fetch = real; } };",
    )
    .call1(&JsValue::NULL, &JsValue::from(other as f64))
    .unwrap();
    let r = lease.settle(SettleState::Done, None, None).await;
    let r2 = lease.release().await;
    call_method(&hook, "restore", &[]);
    assert!(
        matches!(&r, Err(e) if e.is_transient()),
        "an unknown outcome: {r:?}"
    );
    assert!(
        matches!(&r2, Err(e) if e.is_transient()),
        "an unknown outcome: {r2:?}"
    );
    assert_eq!(item(id).await.state, ItemState::Running);
    lease
        .settle(SettleState::Done, None, None)
        .await
        .expect("the same settle, answered by the server");
    assert_eq!(lease.status(), Status::Settled(SettleState::Done));
    assert_eq!(item(id).await.state, ItemState::Done);
}

/// A settle, release or heartbeat answered `404` or `409` (or `400`, `413`)
/// without the server's error body (a proxy or CDN during a deploy) proves
/// nothing about the lease: the call fails with a transient NetworkError
/// carrying that status, the lease stays held (its signal not aborted, its
/// heartbeats going on) and the same settle, sent again, lands. Before, it
/// ended the lease as `claim_lost` (signal aborted, journal entry and lock
/// let go) while the server held the item running until its TTL, then
/// redelivered it with an attempt counted; and until a later review, the
/// status alone still named the error (a 409 page was a `conflict`, a 400
/// page a `validation` error: refusals for good).
#[wasm_bindgen_test]
async fn a_404_or_409_without_the_servers_error_body_does_not_end_the_lease() {
    if server().is_none() {
        return;
    }
    let q = fresh_queue("bodiless-404");
    let c = admin_client(config());
    for status in [404, 409, 400, 413] {
        let id = enqueue(&q, json!({})).await;
        let lease = claim(&c, &q).await;
        assert_eq!(lease.item_id, id);
        let hook = js_sys::Function::new_with_args(
            "status",
            "const real = globalThis.fetch;
            globalThis.fetch = (url, init) => {
                const u = String(url);
                if (/\\/(settle|release|heartbeat)$/.test(u)) return Promise.resolve(new Response('<html>Not here</html>', { status }));
                return real(url, init);
            };
            return { restore: () => { globalThis.fetch = real; } };",
        )
        .call1(&JsValue::NULL, &JsValue::from(status))
        .unwrap();
        let settled = lease.settle(SettleState::Done, None, None).await;
        let released = lease.release().await;
        let beat = lease.heartbeat().await;
        call_method(&hook, "restore", &[]);
        for (what, r) in [
            ("settle", settled.map(drop)),
            ("release", released.map(drop)),
            ("heartbeat", beat.map(drop)),
        ] {
            let e = r.expect_err(what);
            assert!(e.loss_reason().is_none(), "{status} {what}: {e:?}");
            assert!(
                e.code() == ErrorCode::Network && e.is_transient(),
                "{status} {what}: {e:?}"
            );
            let js = e.to_js();
            assert_eq!(
                (
                    Reflect::get(&js, &"name".into()).unwrap().as_string(),
                    Reflect::get(&js, &"status".into()).unwrap().as_f64()
                ),
                (Some("NetworkError".into()), Some(f64::from(status))),
                "{status} {what}"
            );
        }
        assert_eq!(lease.status(), Status::Held, "{status}: still held");
        // The release went on the wire, so the local work is cancelled
        // (the server may have applied it: helper-239); the lease's own
        // calls still go out, and the server decides.
        assert!(lease.signal().aborted(), "{status}: a release was sent");
        // And fenced for good: the failed release may have landed.
        let thrown = agentstore::lease_api::Lease::from_inner(lease.clone())
            .throw_if_lost()
            .expect_err("throwIfLost refuses after a failed release");
        assert_eq!(
            Reflect::get(&thrown, &"reason".into())
                .unwrap()
                .as_string()
                .as_deref(),
            Some("released"),
            "{status}"
        );
        lease
            .settle(SettleState::Done, None, None)
            .await
            .expect("the same settle, answered by the server");
        assert_eq!(item(id).await.state, ItemState::Done, "{status}");
    }
}

/// An option a lease call does not take (a misspelt key holding a value) is
/// a ValidationError naming it, raised before anything is sent: a claim
/// with `signl` claims nothing, a settle with `err` leaves the lease held
/// and the item running, `work` with `concurency` starts no loop, and the
/// constructor with `acessToken` makes no client. Before, each was ignored
/// (the settle stored no message, the claim could not be aborted).
#[wasm_bindgen_test]
async fn an_option_a_lease_call_does_not_take_is_refused_before_anything_is_sent() {
    let Some((base, token)) = server() else {
        return;
    };
    let is_unknown_option = |e: &JsValue, what: &str| {
        let name = Reflect::get(e, &"name".into())
            .ok()
            .and_then(|v| v.as_string());
        let msg = Reflect::get(e, &"message".into())
            .ok()
            .and_then(|v| v.as_string());
        assert_eq!(name.as_deref(), Some("ValidationError"), "{what}");
        assert!(
            msg.as_deref()
                .unwrap_or_default()
                .contains("unknown option"),
            "{what}: {msg:?}"
        );
    };
    let e = agentstore::lease_api::LeaseClient::new(
        base.into(),
        js(json!({"acessToken": token, "journal": false})),
    )
    .err()
    .expect("acessToken is refused");
    is_unknown_option(&e, "constructor");
    let client = agentstore::lease_api::LeaseClient::new(
        base.into(),
        js(json!({"accessToken": token, "journal": false, "releaseOnPagehide": false})),
    )
    .expect("client");
    let q = fresh_queue("unknown-option");
    let id = enqueue(&q, json!({})).await;
    let e = wasm_bindgen_futures::JsFuture::from(
        client.claim(q.as_str().into(), js(json!({"signl": true}))),
    )
    .await
    .expect_err("signl is refused");
    is_unknown_option(&e, "claim");
    assert_eq!(item(id).await.state, ItemState::Open, "nothing was claimed");
    let handler = js_sys::Function::new_no_args("return null");
    let e = client
        .work(
            q.as_str().into(),
            handler.into(),
            js(json!({"concurency": 2})),
        )
        .err()
        .expect("concurency is refused");
    is_unknown_option(&e, "work");
    let e = wasm_bindgen_futures::JsFuture::from(client.recover(js(json!({"resum": true}))))
        .await
        .expect_err("resum is refused");
    is_unknown_option(&e, "recover");
    let v = wasm_bindgen_futures::JsFuture::from(client.claim(q.as_str().into(), JsValue::NULL))
        .await
        .expect("claim");
    let lease =
        <agentstore::lease_api::Lease as wasm_bindgen::convert::TryFromJsValue>::try_from_js_value(
            v,
        )
        .expect("a Lease");
    let e = wasm_bindgen_futures::JsFuture::from(lease.settle(
        "failed".into(),
        JsValue::UNDEFINED,
        js(json!({"err": "boom"})),
    ))
    .await
    .expect_err("err is refused");
    is_unknown_option(&e, "settle");
    let seen = item(id).await;
    assert_eq!(
        seen.state,
        ItemState::Running,
        "the refused settle wrote nothing"
    );
    wasm_bindgen_futures::JsFuture::from(lease.settle(
        "failed".into(),
        JsValue::UNDEFINED,
        js(json!({"error": "boom"})),
    ))
    .await
    .expect("the same settle with its real option");
    let seen = item(id).await;
    assert_eq!(
        (seen.state, seen.last_error.as_deref()),
        (ItemState::Failed, Some("boom"))
    );
    wasm_bindgen_futures::JsFuture::from(client.close())
        .await
        .unwrap();
}

/// A base URL pasted with white space around it (ASCII, the vertical tab the
/// URL parser would strip itself, Unicode spaces) and a trailing slash still
/// sends every request to the server's own paths.
#[wasm_bindgen_test]
async fn a_base_url_with_white_space_around_it_reaches_the_server() {
    let Some((base, token)) = server() else {
        return;
    };
    let q = fresh_queue("trimmed-base");
    let id = enqueue(&q, json!({"n": 1})).await;
    for padded in [
        format!(" \t{base}/\n"),
        format!("{base}/\u{0B}"),
        format!("\u{A0}\u{3000}{base}\u{2028}\u{FEFF}"),
    ] {
        let client = agentstore::lease::ClientInner::new(
            &padded,
            agentstore::lease::Credentials {
                access_token: Some(token.to_owned()),
                ..Default::default()
            },
            config(),
        )
        .expect("accepted");
        let lease = claim(&client, &q).await;
        assert_eq!(lease.item_id, id, "{padded:?}");
        lease.release().await.expect("release");
        client.close().await;
    }
}

/// `settle(state, result)` refuses a result JSON cannot carry with a
/// ValidationError naming the field, sends nothing and keeps the lease
/// (DESIGN.md, Records: "never silently changed"), where `JSON.stringify`
/// would have stored `null` for NaN, `{}` for a Map, or dropped a function
/// field, and where a lone surrogate reached the server as an escape its
/// parser refuses. A result JSON carries is stored exactly.
#[wasm_bindgen_test]
async fn a_settle_result_json_cannot_carry_is_refused_and_never_stored_changed() {
    if server().is_none() {
        return;
    }
    let q = fresh_queue("settle-values");
    let id = enqueue(&q, json!({})).await;
    let c = admin_client(config());
    let lease = claim(&c, &q).await;
    let api = agentstore::lease_api::Lease::from_inner(lease.clone());
    for (text, field) in [
        ("NaN", ""),
        ("Infinity", ""),
        ("({a: NaN, b: 1})", "field a"),
        ("[1, undefined]", "field [1]"),
        ("({f() {}, x: 1})", "field f"),
        ("[Symbol()]", "field [0]"),
        ("new Map([[1, 2]])", ""),
        ("({at: new Date(0)})", "field at"),
        ("({n: 1n})", "field n"),
        ("(() => { const o = {}; o.o = o; return o; })()", "field o"),
        // A lone surrogate, which IndexedDB stores but the server's JSON
        // parser refuses (before, a 400 with serde's text; helper-201).
        ("({s: ['ok', 'x\\ud800']})", "field s[1]"),
        ("({['\\udc00k']: 1})", "field"),
    ] {
        let v = js_sys::eval(text).unwrap();
        let e =
            wasm_bindgen_futures::JsFuture::from(api.settle("done".into(), v, JsValue::UNDEFINED))
                .await
                .expect_err(text);
        let name = Reflect::get(&e, &"name".into()).unwrap().as_string();
        let message = Reflect::get(&e, &"message".into())
            .unwrap()
            .as_string()
            .unwrap_or_default();
        assert_eq!(
            name.as_deref(),
            Some("ValidationError"),
            "{text}: {message}"
        );
        assert!(message.starts_with(field), "{text}: {message}");
        assert_eq!(api.status(), "held", "{text}: the lease is kept");
    }
    let it = item(id).await;
    assert_eq!(
        (it.state, it.result),
        (ItemState::Running, None),
        "nothing sent"
    );
    let good = json!({"a": {"b": [1, null, "x", -2.5e-7]}, "_k": true, "s": "\u{fffd}"});
    wasm_bindgen_futures::JsFuture::from(api.settle(
        "done".into(),
        js(good.clone()),
        JsValue::UNDEFINED,
    ))
    .await
    .expect("a JSON result settles");
    let it = item(id).await;
    assert_eq!((it.state, it.result), (ItemState::Done, Some(good)));
}

/// Counts the POSTs whose URL ends with `suffix` (a wrapper of the page's
/// `fetch`): `{count: () => n, restore: () => …}`.
fn count_posts(suffix: &str) -> JsValue {
    js_sys::Function::new_with_args(
        "suffix",
        "const real = globalThis.fetch; let n = 0;
         globalThis.fetch = function (url, init) {
             if (String(url).endsWith(suffix)) n++;
             return real.call(this, url, init);
         };
         return { count: () => n, restore: () => { globalThis.fetch = real; } };",
    )
    .call1(&JsValue::NULL, &suffix.into())
    .unwrap()
}

/// A lease of a fresh item on the long-TTL server whose signal's `abort`
/// listener makes the call `call` (JS, `lease` in scope), and a count of the
/// POSTs to the item's `counted` endpoint (`release`, `settle`) from then on.
struct AbortListener {
    base: &'static str,
    client: std::rc::Rc<agentstore::lease::ClientInner>,
    lease: std::rc::Rc<agentstore::lease::LeaseInner>,
    api: JsValue,
    id: i64,
    /// `{inner}`: the listener's call's Promise, once it ran.
    out: JsValue,
    hook: JsValue,
}

impl AbortListener {
    async fn new(base: &'static str, tag: &str, call: &str, counted: &str) -> AbortListener {
        let q = fresh_queue(tag);
        let id = enqueue_at(base, &q, json!({})).await;
        let client = admin_client_at(base, config());
        let lease = claim(&client, &q).await;
        let api: JsValue = agentstore::lease_api::Lease::from_inner(lease.clone()).into();
        let body = format!(
            "const out = {{ inner: null }};
             lease.signal.addEventListener('abort', () => {{ out.inner = {call}; }});
             return out;"
        );
        let out = js_sys::Function::new_with_args("lease", &body)
            .call1(&JsValue::NULL, &api)
            .unwrap();
        let hook = count_posts(&format!("/v1/items/{id}/{counted}"));
        AbortListener {
            base,
            client,
            lease,
            api,
            id,
            out,
            hook,
        }
    }

    /// The app's own `lease.release()`.
    async fn release(&self) -> Result<JsValue, JsValue> {
        let release: js_sys::Function = Reflect::get(&self.api, &"release".into())
            .unwrap()
            .unchecked_into();
        let p: js_sys::Promise = release.call0(&self.api).unwrap().unchecked_into();
        wasm_bindgen_futures::JsFuture::from(p).await
    }

    /// The outcome of the listener's call (which must have run).
    async fn listeners_call(&self) -> Result<JsValue, JsValue> {
        let inner = Reflect::get(&self.out, &"inner".into()).unwrap();
        assert!(inner.is_object(), "the listener ran");
        wasm_bindgen_futures::JsFuture::from(js_sys::Promise::from(inner)).await
    }

    /// How many requests were counted (the count stops here).
    fn sent(&self) -> Option<f64> {
        let n = hook_call(&self.hook, "count").as_f64();
        hook_call(&self.hook, "restore");
        n
    }

    /// The lease ended `released` and its item is open again.
    async fn assert_released(&self) {
        assert_eq!(self.lease.status(), Status::Lost(LossReason::Released));
        assert_eq!(item_at(self.base, self.id).await.state, ItemState::Open);
    }
}

/// The common app pattern: the lease's `abort` listener releases it
/// (`lease.signal.addEventListener('abort', () => lease.release())`), and the
/// app then releases it itself. The listener runs during the app's
/// `release()` (the signal aborts when the release is sent): one release
/// goes on the wire, both calls resolve, and the lease ends `released`.
/// Before, the listener's release was sent too (the first one was not yet
/// counted as on the wire): two requests for one release.
#[wasm_bindgen_test]
async fn a_release_from_the_abort_listener_during_release_sends_one_request() {
    let Some(base) = long_ttl_server() else {
        return;
    };
    let t = AbortListener::new(base, "relisten", "lease.release()", "release").await;
    let app = t.release().await;
    let listener = t.listeners_call().await;
    let sent = t.sent();
    assert!(app.is_ok(), "the app's release resolves: {app:?}");
    assert!(
        listener.is_ok(),
        "the listener's release resolves: {listener:?}"
    );
    assert_eq!(sent, Some(1.0), "one release request");
    t.assert_released().await;
}

/// As above, with `client.close()` releasing the lease: its `abort`
/// listener's `lease.release()` waits behind close()'s release and resolves;
/// one release goes on the wire. Before, two did.
#[wasm_bindgen_test]
async fn a_release_from_the_abort_listener_during_close_sends_one_request() {
    let Some(base) = long_ttl_server() else {
        return;
    };
    let t = AbortListener::new(base, "closelisten", "lease.release()", "release").await;
    t.client.close().await;
    let listener = t.listeners_call().await;
    let sent = t.sent();
    assert!(
        listener.is_ok(),
        "the listener's release resolves: {listener:?}"
    );
    assert_eq!(sent, Some(1.0), "one release request");
    t.assert_released().await;
}

/// A settle made by the lease's `abort` listener during the app's
/// `release()` (the signal aborts when the release is sent) waits behind
/// that release and is refused once it landed: the release the app asked
/// for first is what the server applies, and only it goes on the wire.
/// Before, the listener's settle went out first, beside the release: the
/// item ended `failed` while the app's `release()` resolved.
#[wasm_bindgen_test]
async fn a_settle_from_the_abort_listener_during_release_waits_behind_it() {
    let Some(base) = long_ttl_server() else {
        return;
    };
    let call = "lease.settle('failed', null, { error: 'aborted' })";
    let t = AbortListener::new(base, "settlelisten", call, "settle").await;
    let app = t.release().await;
    let listener = t.listeners_call().await;
    let sent = t.sent();
    assert!(app.is_ok(), "the app's release resolves: {app:?}");
    assert!(
        listener.is_err(),
        "the listener's settle is refused: {listener:?}"
    );
    assert_eq!(sent, Some(0.0), "no settle on the wire");
    t.assert_released().await;
}

/// A release sent while a settle of unknown outcome was pending (no answer:
/// it may have landed) aborts the signal only once its own outcome is
/// unknown too, and a heartbeat sent before both and refused `claim_lost`
/// while the release was out loses the lease then. The signal's `abort`
/// listener releases the lease (the common app pattern): it runs once that
/// call's bookkeeping is done, so the lease still ends lost (`claim_lost`)
/// and the listener's release, on a lease the server holds no more, is
/// refused without a request. Before, the listener ran first: its release
/// took the heartbeat's verdict for itself and dropped it, went out, and
/// failed too; the lease read held (heartbeats off, `ended` pending) until
/// its local deadline.
#[wasm_bindgen_test]
async fn a_release_from_the_abort_listener_after_a_release_of_unknown_outcome_keeps_its_verdict() {
    if server().is_none() {
        return;
    }
    let hook = fake_fetch(
        "let answer_heartbeat = null;
        let releases = 0;
        let verdict_read = false;
        const lost = (init) => {
            const a = answer(200, { results: JSON.parse(init.body).leases.map((l) =>
                ({ item_id: l.item_id, ok: false, error: { code: 'claim_lost', message: 'taken over' } })) });
            const json = a.json;
            a.json = async () => { const b = await json(); verdict_read = true; return b; };
            return a;
        };
        globalThis.fetch = async (url, init) => {
            url = String(url);
            if (url.endsWith('/claims')) {
                return answer(201, { item: { id: 2 ** 52, epoch: 1 }, lease: { token: 't'.repeat(43),
                    epoch: 1, ttl_ms: 60000, heartbeat_ms: 100 } });
            }
            if (url.endsWith('/v1/heartbeats')) {
                if (answer_heartbeat) return lost(init);
                // The first heartbeat's answer waits for the first release.
                return new Promise((resolve) => { answer_heartbeat = () => resolve(lost(init)); });
            }
            // The network is cut: no settle or release reaches the server.
            if (url.endsWith('/settle')) throw new TypeError('Failed to fetch');
            if (url.endsWith('/release')) {
                releases += 1;
                if (releases === 1) {
                    // The heartbeat sent before the settle is refused
                    // while this release is out: its body read, then one
                    // task, after which the microtasks that hand the
                    // refusal to the lease have run.
                    answer_heartbeat();
                    while (!verdict_read) await new Promise((r) => setTimeout(r, 1));
                    await new Promise((r) => setTimeout(r, 0));
                }
                throw new TypeError('Failed to fetch');
            }
            return answer(204, null);
        };
        return { held: () => answer_heartbeat !== null, releases: () => releases,
            restore: () => { globalThis.fetch = real; } };",
    );
    let c = admin_client(agentstore::lease::ClientConfig {
        use_locks: false,
        ..config()
    });
    let lease = claim(&c, "listener-verdict").await;
    let held = within(10_000.0, async {
        while !call_method(&hook, "held", &[]).is_truthy() {
            sleep(10.0).await;
        }
    })
    .await;
    let api: JsValue = agentstore::lease_api::Lease::from_inner(lease.clone()).into();
    let out = js_sys::Function::new_with_args(
        "lease",
        "const out = { inner: null };
         lease.signal.addEventListener('abort', () => { out.inner = lease.release(); });
         return out;",
    )
    .call1(&JsValue::NULL, &api)
    .unwrap();
    let settled = lease.settle(SettleState::Done, None, None).await;
    let app = wasm_bindgen_futures::JsFuture::from(js_sys::Promise::from(call_method(
        &api,
        "release",
        &[],
    )))
    .await;
    let inner = Reflect::get(&out, &"inner".into()).unwrap();
    let listener = if inner.is_object() {
        Some(wasm_bindgen_futures::JsFuture::from(js_sys::Promise::from(inner)).await)
    } else {
        None
    };
    let status = lease.status();
    let releases = call_method(&hook, "releases", &[]).as_f64();
    call_method(&hook, "restore", &[]);
    c.close().await;
    assert!(held.is_some(), "a heartbeat went out");
    assert!(
        matches!(settled, Err(LeaseError::Network(_))),
        "{settled:?}"
    );
    assert!(app.is_err(), "the app's release fails: {app:?}");
    let listener = listener.expect("the listener ran");
    assert_eq!(status, Status::Lost(LossReason::ClaimLost), "{listener:?}");
    assert!(listener.is_err(), "the listener's release is refused");
    assert_eq!(releases, Some(1.0), "one release request");
}
