//! The lease journal and Web Locks: `recover()` releases what a gone page left
//! in the journal, leaves a live page's (locked) leases alone, can resume a
//! still-valid lease, and touches nothing where Web Locks are missing or a
//! lease was claimed without one.
// Tests may read and call the page's values with js-sys directly: a slot
// kept by a throw lasts only for the test page (clippy.toml).
#![allow(clippy::disallowed_methods)]

use agentstore::lease::journal::Journal;
use agentstore::lease::{ClientConfig, Credentials, Status};
use agentstore_protocol::lease::{ItemState, SettleState};
use js_sys::{Object, Reflect};
use serde_json::json;
use wasm_bindgen::JsValue;
use wasm_bindgen_test::*;

mod lease_common;
use lease_common::*;
#[path = "common/values.rs"]
mod values;

wasm_bindgen_test_configure!(run_in_browser);

fn journalled(name: &str, locks: bool) -> ClientConfig {
    ClientConfig {
        journal_name: Some(name.to_owned()),
        use_locks: locks,
        lock_wait_ms: 200.0,
        ..config()
    }
}

/// On the long-TTL server: from the claims to the recover's release must
/// fit inside one TTL (or the reaper says "expired", and the paused leases
/// reach their local deadline and are released by their own client), which
/// on a busy machine may take longer than 3 s.
#[wasm_bindgen_test]
async fn recover_releases_the_leases_a_gone_page_left_in_the_journal() {
    let Some(base) = long_ttl_server() else {
        return;
    };
    let journal = fresh_queue("journal");
    let q = fresh_queue("recover");
    let a = enqueue_at(base, &q, json!({})).await;
    let b = enqueue_at(base, &q, json!({})).await;
    // The "old page": its leases are journalled; its locks went with it.
    let old = admin_client_at(base, journalled(&journal, false));
    let la = claim(&old, &q).await;
    let lb = claim(&old, &q).await;
    la.set_heartbeats_paused(true);
    lb.set_heartbeats_paused(true);
    gone_with_its_locks(&journal, &old.base).await;

    let new = admin_client_at(base, journalled(&journal, true));
    let report = new.recover(false).await.expect("recover");
    let mut released = report.released.clone();
    released.sort_unstable();
    assert_eq!(released, vec![a, b]);
    assert!(report.busy.is_empty() && report.lost.is_empty() && report.skipped.is_empty());
    for id in [a, b] {
        let it = item_at(base, id).await;
        assert_eq!(
            (it.state, it.attempts, it.last_error.as_deref()),
            (ItemState::Open, 1, Some("released"))
        );
    }
    // Released now, not after the TTL: the reaper would have said "expired".
    let again = new.recover(false).await.unwrap();
    assert!(
        again.released.is_empty() && again.lost.is_empty(),
        "journal emptied"
    );
    // The old page's stale leases learn it on their next heartbeat (or, on a
    // slow machine, already lost them at their local deadline).
    la.set_heartbeats_paused(false);
    let (reason, _) = wait_abort(&la, 2.0 * TTL_MS).await.expect("aborted");
    assert!(
        reason == "claim_lost" || reason == "expired_locally",
        "{reason}"
    );
}

/// Rewrites the journal entries of `base` as a page that held each item's
/// Web Lock would have left them once it was gone (its locks went with it):
/// the leases were claimed without a lock (`webLocks: false`), so no lock of
/// theirs is held now.
async fn gone_with_its_locks(journal: &str, base: &str) {
    let j = Journal::new(Some(journal.to_owned()));
    for mut e in j.list(base).await.unwrap() {
        assert!(!e.locked, "claimed without a Web Lock");
        e.locked = true;
        j.put(&e).await.unwrap();
    }
}

/// Wraps the page's `fetch`: a `method` request whose URL matches the
/// RegExp source `pattern` is answered `status` with the text `body` (JSON,
/// or none; nothing reaches the server); every other request goes through. Returns
/// the function that restores the page's own `fetch`.
fn intercept(pattern: &str, method: &str, status: u16, body: &str) -> js_sys::Function {
    let install = js_sys::Function::new_with_args(
        "pattern, method, status, body",
        "const real = globalThis.fetch;
        const re = new RegExp(pattern);
        globalThis.fetch = (input, init) => {
            const url = String(input instanceof Request ? input.url : input);
            const m = (init && init.method) || (input instanceof Request ? input.method : 'GET');
            if (m === method && re.test(url)) {
                return Promise.resolve(new Response(body,
                    { status, headers: { 'content-type': 'application/json' } }));
            }
            return real(input, init);
        };
        return () => { globalThis.fetch = real; };",
    );
    let args = js_sys::Array::of4(
        &pattern.into(),
        &method.into(),
        &JsValue::from(status),
        &body.into(),
    );
    install.apply(&JsValue::NULL, &args).unwrap().into()
}

/// A client of a newly enrolled worker (may claim from `queue` only), with
/// journal `journal`.
async fn enrolled(
    queue: &str,
    name: &str,
    journal: &str,
    locks: bool,
) -> std::rc::Rc<agentstore::lease::ClientInner> {
    let (base, _) = server().unwrap();
    agentstore::lease::ClientInner::new(
        base,
        Credentials {
            enrollment_token: Some(enrollment_token(queue).await),
            name: Some(name.into()),
            ..Credentials::default()
        },
        journalled(journal, locks),
    )
    .unwrap()
}

/// A live context that claims without Web Locks (`webLocks: false`) leaves
/// journal entries whose item lock is free: another context's `recover()`
/// cannot tell them from a gone page's and must not release them. Before,
/// it released the live lease and the item was delivered again while its
/// handler still ran.
#[wasm_bindgen_test]
async fn recover_leaves_alone_a_lease_claimed_without_a_web_lock() {
    if server().is_none() {
        return;
    }
    let journal = fresh_queue("journal");
    let q = fresh_queue("unlocked");
    let id = enqueue(&q, json!({})).await;
    let live = admin_client(journalled(&journal, false));
    let lease = claim(&live, &q).await;
    for locks in [true, false] {
        let other = admin_client(journalled(&journal, locks));
        let report = other.recover(false).await.unwrap();
        assert_eq!(report.skipped, vec![id], "locks {locks}");
        assert!(report.released.is_empty() && report.lost.is_empty());
        let resumed = other.recover(true).await.unwrap();
        assert!(resumed.resumed.is_empty() && resumed.lost.is_empty());
    }
    assert_eq!(item(id).await.state, ItemState::Running);
    assert_eq!(lease.status(), Status::Held);
    lease.release().await.unwrap();
}

/// The entry of a lease claimed without a Web Lock goes once the server
/// shows that lease over (here: it expired and the item reopened): it is
/// reported `lost` and deleted, so a crashed page's entries do not pile up.
#[wasm_bindgen_test]
async fn recover_clears_the_entry_of_an_unlocked_lease_that_ended() {
    if server().is_none() {
        return;
    }
    let journal = fresh_queue("journal");
    let q = fresh_queue("unlocked-ended");
    let id = enqueue(&q, json!({})).await;
    let crashed = admin_client(journalled(&journal, false));
    let _lease = claim(&crashed, &q).await;
    crashed.vanish();
    let other = admin_client(journalled(&journal, true));
    assert_eq!(
        other.recover(false).await.unwrap().skipped,
        vec![id],
        "still current"
    );
    wait_item(id, 4.0 * TTL_MS, |it| it.state == ItemState::Open).await;
    let report = other.recover(false).await.unwrap();
    assert_eq!(report.lost, vec![id]);
    assert!(report.skipped.is_empty() && report.released.is_empty());
    let left = Journal::new(Some(journal.clone()))
        .list(&other.base)
        .await
        .unwrap();
    assert!(left.is_empty(), "the entry is gone");
}

/// A journalled lease whose context is gone (its Web Lock free: a terminated
/// Web Worker, a closed tab) and which is still current on the server under
/// ANOTHER worker (each context enrolled on its own, as browser-worker-leases.md
/// says to, sharing one origin's journal): the server refuses this worker's
/// release (403), so the lease is released by its token alone, as the gone
/// context's `pagehide` beacon would have (a worker has none), and reported
/// `released`; with `resume` too, since it cannot be resumed under these
/// credentials. Before, it was `busy` and left running until its TTL (90 s
/// by default, an attempt spent), although the guide promises such leases are
/// released at once.
#[wasm_bindgen_test]
async fn recover_releases_a_gone_context_s_lease_of_another_worker_by_its_token() {
    if server().is_none() {
        return;
    }
    for resume in [false, true] {
        let journal = fresh_queue("journal");
        let q = fresh_queue("two-workers");
        let id = enqueue(&q, json!({})).await;
        let a = enrolled(&q, "a", &journal, false).await;
        let _lease = claim(&a, &q).await;
        a.vanish();
        gone_with_its_locks(&journal, &a.base).await;
        let b = enrolled(&q, "b", &journal, true).await;
        let report = b.recover(resume).await.unwrap();
        assert_eq!(
            report.released,
            vec![id],
            "resume {resume}: busy {:?}",
            report.busy
        );
        assert!(report.busy.is_empty() && report.lost.is_empty() && report.resumed.is_empty());
        let left = Journal::new(Some(journal.clone()))
            .list(&b.base)
            .await
            .unwrap();
        assert!(left.is_empty(), "the entry is gone");
        assert_eq!(item(id).await.state, ItemState::Open);
        // The item is claimable at once, by the worker that recovered it.
        let again = claim(&b, &q).await;
        assert_eq!(again.item_id, id);
        again.release().await.unwrap();
    }
}

/// A worker's page claims without a Web Lock and dies; its lease expires and
/// another worker claims the item. The first worker's next page runs
/// `recover()`: it may not read the item any more (403), so the entry's
/// token is checked with a heartbeat, which the server answers `claim_lost`
/// (a heartbeat renews only the caller's own lease, so nothing changes): the
/// entry is reported lost and deleted. Before, it was skipped by every
/// `recover()`, for ever, and the journal kept growing.
#[wasm_bindgen_test]
async fn recover_drops_the_entry_of_an_unlocked_lease_another_worker_took_over() {
    if server().is_none() {
        return;
    }
    let journal = fresh_queue("journal");
    let q = fresh_queue("taken-over");
    let id = enqueue(&q, json!({})).await;
    let (base, _) = server().unwrap();
    let first = enrolled(&q, "first", &journal, false).await;
    let _gone = claim(&first, &q).await;
    let creds = first.credentials();
    first.vanish();
    wait_item(id, 4.0 * TTL_MS, |it| it.state == ItemState::Open).await;
    let other = enrolled(&q, "other", &fresh_queue("journal"), true).await;
    let taken = claim(&other, &q).await;
    // The first worker again, on a new page (its stored credentials).
    let again = agentstore::lease::ClientInner::new(
        base,
        Credentials {
            access_token: creds.access_token,
            refresh_token: creds.refresh_token,
            ..Credentials::default()
        },
        journalled(&journal, true),
    )
    .unwrap();
    let report = again.recover(false).await.unwrap();
    assert_eq!(report.lost, vec![id]);
    assert!(report.skipped.is_empty() && report.busy.is_empty() && report.released.is_empty());
    let left = Journal::new(Some(journal.clone()))
        .list(&again.base)
        .await
        .unwrap();
    assert!(left.is_empty(), "the entry is gone");
    // The other worker's lease is untouched.
    let it = item(id).await;
    assert_eq!((it.state, it.epoch), (ItemState::Running, 2));
    assert_eq!(taken.status(), Status::Held);
    taken.release().await.unwrap();
}

/// `recover()` keeps the entry of an unlocked lease whose item the server
/// cannot read (`GET` answers `{id, state: "running", unreadable_row:
/// true}`, with no epoch to compare): it may still be a live page's lease,
/// so it is skipped, not reported lost and deleted. Before, the missing
/// epoch read as "another lease": the entry was dropped.
#[wasm_bindgen_test]
async fn recover_skips_an_unlocked_lease_whose_item_the_server_cannot_read() {
    if server().is_none() {
        return;
    }
    let journal = fresh_queue("journal");
    let q = fresh_queue("unreadable");
    let id = enqueue(&q, json!({})).await;
    let old = admin_client(journalled(&journal, false));
    let _lease = claim(&old, &q).await;
    old.vanish();
    let hook = intercept(
        r"/v1/items/\d+$",
        "GET",
        200,
        &json!({"id": id, "state": "running", "unreadable_row": true}).to_string(),
    );
    let new = admin_client(journalled(&journal, true));
    let report = new.recover(false).await;
    hook.call0(&JsValue::NULL).unwrap();
    let report = report.unwrap();
    assert_eq!(report.skipped, vec![id], "lost {:?}", report.lost);
    assert!(report.lost.is_empty() && report.released.is_empty());
    let left = Journal::new(Some(journal.clone()))
        .list(&new.base)
        .await
        .unwrap();
    assert_eq!(left.len(), 1, "the entry is kept");
    assert_eq!(item(id).await.state, ItemState::Running);
}

/// `recover()` drops a journal entry only when the lease is over: the
/// server said so in its error body (`claim_lost`, `state_conflict`,
/// `not_found`), or, when a release is refused for another reason, the item
/// shows it. A release refused with a 400 (as a proxy or an older server may
/// answer) or a 404 without the server's error body, while the item still
/// runs under the entry's claim, keeps the entry (`pending`), and the next
/// `recover()` releases it. An entry whose item was settled meanwhile goes
/// (`lost`) even while its releases are refused, so a refusing proxy never
/// keeps entries for good. Before, any non-transient refusal deleted the
/// entry as `lost`, and the item waited out its TTL.
#[wasm_bindgen_test]
async fn recover_keeps_an_entry_whose_release_was_refused_for_another_reason() {
    // On the long-TTL server: the paused leases' client releases them at
    // their local deadline, and the settle, the journal's cleanup and three
    // recovers must all come before it, which on a busy machine may take
    // longer than the 3 s TTL's 2.7 s.
    let Some(base) = long_ttl_server() else {
        return;
    };
    let journal = fresh_queue("journal");
    let q = fresh_queue("refused-release");
    let id = enqueue_at(base, &q, json!({})).await;
    let settled = enqueue_at(base, &q, json!({})).await;
    let old = admin_client_at(base, journalled(&journal, false));
    let lease = claim(&old, &q).await;
    let done_elsewhere = claim(&old, &q).await;
    assert_eq!((lease.item_id, done_elsewhere.item_id), (id, settled));
    lease.set_heartbeats_paused(true);
    done_elsewhere.set_heartbeats_paused(true);
    gone_with_its_locks(&journal, &old.base).await;
    // The other entry's item is settled by someone else (its own lease
    // here); the settle's own journal cleanup is then undone, as a page gone
    // before it could delete the entry would leave it.
    let entries = Journal::new(Some(journal.clone()));
    let kept = entries
        .list(&old.base)
        .await
        .unwrap()
        .into_iter()
        .find(|e| e.item_id == settled)
        .unwrap();
    done_elsewhere
        .settle(SettleState::Done, None, None)
        .await
        .unwrap();
    let until = now() + 30_000.0;
    while entries
        .list(&old.base)
        .await
        .unwrap()
        .iter()
        .any(|e| e.item_id == settled)
    {
        assert!(now() < until, "the settle's cleanup");
        sleep(10.0).await;
    }
    entries.put(&kept).await.unwrap();
    let new = admin_client_at(base, journalled(&journal, true));
    let body = json!({"code": "validation", "message": "refused by a proxy"}).to_string();
    let mut lost = Vec::new();
    for (status, body) in [(400, body.as_str()), (404, "")] {
        let hook = intercept(r"/v1/items/\d+/release$", "POST", status, body);
        let refused = new.recover(false).await;
        hook.call0(&JsValue::NULL).unwrap();
        let refused = refused.unwrap();
        assert_eq!(
            refused.pending,
            vec![id],
            "{status}: lost {:?}",
            refused.lost
        );
        assert!(refused.released.is_empty(), "{status}");
        assert_eq!(item_at(base, id).await.state, ItemState::Running);
        lost.extend(refused.lost);
    }
    assert_eq!(lost, vec![settled], "the settled item's entry goes");
    let again = new.recover(false).await.unwrap();
    assert_eq!(
        again.released,
        vec![id],
        "the kept entry is released next time"
    );
    assert_eq!(item_at(base, id).await.state, ItemState::Open);
    assert!(entries.list(&new.base).await.unwrap().is_empty());
}

#[wasm_bindgen_test]
async fn recover_leaves_a_live_pages_locked_lease_alone() {
    if server().is_none() {
        return;
    }
    let journal = fresh_queue("journal");
    let q = fresh_queue("busy");
    let id = enqueue(&q, json!({})).await;
    let live = admin_client(journalled(&journal, true));
    let lease = claim(&live, &q).await;
    let other = admin_client(journalled(&journal, true));
    let report = other.recover(false).await.unwrap();
    assert_eq!(report.busy, vec![id], "the live page holds its Web Lock");
    assert!(report.released.is_empty());
    assert_eq!(item(id).await.state, ItemState::Running);
    assert_eq!(lease.status(), Status::Held);
    // The journal entry is deleted after the settle (asynchronously): wait for it.
    let entries = agentstore::lease::journal::Journal::new(Some(journal.clone()));
    let journalled_ids = || async {
        entries
            .list(&other.base)
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.item_id)
            .collect::<Vec<_>>()
    };
    assert_eq!(journalled_ids().await, vec![id], "journalled while held");
    lease.settle(SettleState::Done, None, None).await.unwrap();
    let until = now() + 30_000.0;
    while !journalled_ids().await.is_empty() {
        assert!(now() < until, "the settled lease left the journal");
        sleep(10.0).await;
    }
    let after = other.recover(false).await.unwrap();
    assert!(
        after.busy.is_empty() && after.released.is_empty(),
        "settled leases leave the journal"
    );
}

/// A lease of a fresh queue (tag `tag`) of the server at `base` claimed by a
/// page that then went away with its Web Locks, left in a fresh journal; its
/// item id, and the client of a new page on that journal (Web Locks on).
async fn left_by_a_gone_page(
    base: &str,
    tag: &str,
) -> (i64, std::rc::Rc<agentstore::lease::ClientInner>) {
    let journal = fresh_queue("journal");
    let q = fresh_queue(tag);
    let id = enqueue_at(base, &q, json!({})).await;
    let old = admin_client_at(base, journalled(&journal, false));
    let _stale = claim(&old, &q).await;
    old.vanish();
    gone_with_its_locks(&journal, &old.base).await;
    (id, admin_client_at(base, journalled(&journal, true)))
}

#[wasm_bindgen_test]
async fn recover_with_resume_keeps_heartbeating_a_still_valid_lease() {
    if server().is_none() {
        return;
    }
    // From the gone page's claim to the new page's first heartbeat, and then
    // two TTLs: a round in which the page stalled is run again.
    // (What the round found is checked after it: a round whose page stalled
    // past the lease's deadline before the resume is run again, not failed.)
    let (_new, (id, resumed)) = unstalled_round(|_| async {
        let (id, new) = left_by_a_gone_page(server().unwrap().0, "resume").await;
        let report = new.recover(true).await.unwrap();
        sleep(2.0 * TTL_MS).await;
        (new, (id, report.resumed))
    })
    .await;
    assert_eq!(resumed.len(), 1);
    let lease = resumed[0].clone();
    assert_eq!((lease.item_id, lease.epoch), (id, 1));
    assert_eq!(lease.status(), Status::Held, "heartbeated by the new page");
    assert_eq!(item(id).await.state, ItemState::Running);
    lease
        .settle(SettleState::Done, Some(js(json!(1))), None)
        .await
        .unwrap();
    assert_eq!(item(id).await.state, ItemState::Done);
}

/// `recover({resume: true})` resumes a lease only on the lease server's
/// heartbeat answer, for no longer than the TTL that answer gives, and
/// never hands out as resumed a lease whose deadline passed meanwhile: a
/// 2xx without `{ttl_ms}` (a service worker's, a captive portal's) leaves
/// the entry for a later recover, and a TTL shorter than the journal's
/// (which any script of the origin can write) is the one the local deadline
/// follows, here 1 ms: the lease is over before recover returns, so it is
/// reported lost and released (the item goes back to the queue now).
/// Before, any 2xx renewed the lease for the journal's TTL; and then a
/// lease already lost locally was listed in `resumed`.
#[wasm_bindgen_test]
async fn recover_resumes_only_on_the_servers_heartbeat_answer_and_within_its_ttl() {
    // On the long-TTL server: both recovers must come while the server
    // still holds the claim (or the reaper says "expired"), which on a busy
    // machine may take longer than 3 s.
    let Some(base) = long_ttl_server() else {
        return;
    };
    let (id, new) = left_by_a_gone_page(base, "resume-answer").await;

    let restore = intercept("/heartbeat$", "POST", 200, r#"{"ok":true}"#);
    let report = new.recover(true).await;
    restore.call0(&JsValue::NULL).unwrap();
    let report = report.unwrap();
    assert!(
        report.resumed.is_empty() && report.lost.is_empty() && report.released.is_empty(),
        "a 2xx that is not the server's answer renews nothing"
    );
    assert_eq!(item_at(base, id).await.state, ItemState::Running);

    let restore = intercept("/heartbeat$", "POST", 200, r#"{"ttl_ms":1}"#);
    let report = new.recover(true).await;
    restore.call0(&JsValue::NULL).unwrap();
    let report = report.unwrap();
    assert!(
        report.resumed.is_empty(),
        "a lease whose answered 1 ms TTL ran out is not resumed (the journal's {LONG_TTL_MS} ms would have kept it)"
    );
    assert_eq!(report.lost, vec![id], "reported lost");
    assert!(new.held().is_empty());
    let it = wait_item_at(base, id, 10_000.0, |it| it.state == ItemState::Open).await;
    assert_eq!(
        it.last_error.as_deref(),
        Some("released"),
        "released by the client at its local deadline, not expired by the server"
    );
}

/// `recover({resume: true})` never hands out as resumed a lease whose item
/// left `running` between its heartbeat and its read of the item: here the
/// gone page's release (a late beacon) lands right after the new page's
/// heartbeat renewed the token. The epoch is unchanged (a release does not
/// grow it), so the epoch check alone let the lease through as held while
/// the item was open for any worker to claim. Review finding.
#[wasm_bindgen_test]
async fn recover_never_resumes_a_lease_whose_item_left_running_after_its_heartbeat() {
    // On the long-TTL server: the item must still be running under the gone
    // page's claim when the new page recovers (or the reaper says "expired"),
    // which on a busy machine may take longer than 3 s.
    let (Some(base), Some((_, admin))) = (long_ttl_server(), server()) else {
        return;
    };
    let journal = fresh_queue("journal");
    let q = fresh_queue("resume-left");
    let id = enqueue_at(base, &q, json!({})).await;
    let old = admin_client_at(base, journalled(&journal, false));
    let stale = claim(&old, &q).await;
    let token = stale.token().to_owned();
    old.vanish();
    gone_with_its_locks(&journal, &old.base).await;
    let new = admin_client_at(base, journalled(&journal, true));

    // Before the page's first read of the item (which follows its
    // heartbeat), the old page's release lands.
    let install = js_sys::Function::new_with_args(
        "pattern, release, auth, body",
        "const real = globalThis.fetch;
        const re = new RegExp(pattern);
        let done = false;
        globalThis.fetch = async (input, init) => {
            const url = String(input instanceof Request ? input.url : input);
            const m = (init && init.method) || (input instanceof Request ? input.method : 'GET');
            if (!done && m === 'GET' && re.test(url)) {
                done = true;
                const r = await real(release, { method: 'POST', body,
                    headers: { authorization: auth, 'content-type': 'application/json' } });
                if (!r.ok) throw new Error('the late release failed: ' + r.status);
            }
            return real(input, init);
        };
        return () => { globalThis.fetch = real; };",
    );
    let args = js_sys::Array::of4(
        &format!("/v1/items/{id}$").into(),
        &format!("{base}/v1/items/{id}/release").into(),
        &format!("Bearer {admin}").into(),
        &json!({ "token": token }).to_string().into(),
    );
    let restore: js_sys::Function = install.apply(&JsValue::NULL, &args).unwrap().into();
    let report = new.recover(true).await;
    restore.call0(&JsValue::NULL).unwrap();
    let report = report.unwrap();
    assert!(
        report.resumed.is_empty(),
        "not resumed: the item is no longer running"
    );
    assert_eq!(report.lost, vec![id], "reported lost");
    assert!(new.held().is_empty());
    let it = item_at(base, id).await;
    assert_eq!(
        (it.state, it.last_error.as_deref(), it.epoch),
        (ItemState::Open, Some("released"), 1),
        "released by the late beacon, the epoch unchanged"
    );
}

#[wasm_bindgen_test]
async fn without_web_locks_recover_touches_nothing() {
    if server().is_none() {
        return;
    }
    let journal = fresh_queue("journal");
    let q = fresh_queue("nolocks");
    let id = enqueue(&q, json!({})).await;
    let old = admin_client(journalled(&journal, false));
    let lease = claim(&old, &q).await;
    // As if claimed with a Web Lock, in a browser that has them.
    gone_with_its_locks(&journal, &old.base).await;
    let nav = Reflect::get(&js_sys::global(), &"navigator".into()).unwrap();
    let desc = Object::new();
    Reflect::set(&desc, &"value".into(), &JsValue::UNDEFINED).unwrap();
    Reflect::set(&desc, &"configurable".into(), &JsValue::TRUE).unwrap();
    Reflect::define_property(&nav.clone().into(), &"locks".into(), &desc).unwrap();
    let report = admin_client(journalled(&journal, true))
        .recover(false)
        .await;
    Reflect::delete_property(&nav.into(), &"locks".into()).unwrap();
    let report = report.unwrap();
    assert_eq!(
        report.skipped,
        vec![id],
        "a live page's lease cannot be told apart"
    );
    assert!(report.released.is_empty());
    assert_eq!(item(id).await.state, ItemState::Running);
    lease.release().await.unwrap();
}

/// A Web Lock granted in the instant its finite wait runs out (its callback
/// not run yet, which the wait's abort cannot stop) is let go at once. Before,
/// the caller was told "busy" while the callback went on to hold the lock
/// for the page's life, and every later lease of that item in any tab waited
/// behind it. (Web Locks are stubbed here so the grant lands exactly as the
/// wait's signal aborts.) Review finding.
#[wasm_bindgen_test]
async fn a_web_lock_granted_as_its_wait_runs_out_is_let_go() {
    let stub = js_sys::Function::new_no_args(
        "const nav = globalThis.navigator; const had = Object.getOwnPropertyDescriptor(nav, 'locks'); \
         const log = { released: false }; \
         Object.defineProperty(nav, 'locks', { configurable: true, value: { request(name, opts, cb) { \
           return new Promise((res) => { opts.signal.addEventListener('abort', () => { \
             const held = cb({ name, mode: 'exclusive' }); \
             Promise.resolve(held).then(() => { log.released = true; }); res(held); }); }); } } }); \
         return { log, restore() { if (had) Object.defineProperty(nav, 'locks', had); else delete nav.locks; } };",
    )
    .call0(&wasm_bindgen::JsValue::NULL)
    .unwrap();
    let outcome = agentstore::lease::lifecycle::lock("agentstore-test-late-grant", 50.0).await;
    let log = js_sys::Reflect::get(&stub, &"log".into()).unwrap();
    let released = || {
        js_sys::Reflect::get(&log, &"released".into())
            .unwrap()
            .as_bool()
            .unwrap_or(false)
    };
    let let_go = within(5_000.0, async {
        while !released() {
            sleep(10.0).await;
        }
    })
    .await;
    let restore = js_sys::Function::from(js_sys::Reflect::get(&stub, &"restore".into()).unwrap());
    restore.call0(&stub).unwrap();
    assert!(matches!(
        outcome,
        agentstore::lease::lifecycle::LockOutcome::Busy
    ));
    assert!(let_go.is_some(), "the late-granted lock is still held");
}

/// A well-formed journal entry of item `item_id` at `base`.
fn journal_entry(base: &str, item_id: i64) -> agentstore::lease::journal::Entry {
    agentstore::lease::journal::Entry {
        base: base.into(),
        item_id,
        token: "t".repeat(43),
        epoch: 1,
        queue: "q".into(),
        ttl_ms: 30_000,
        heartbeat_ms: 10_000,
        locked: true,
    }
}

/// A journal entry another script of the origin wrote with fields longer
/// than the module's whole memory is skipped by `list` and compared by
/// `delete` without being copied into wasm memory (which never shrinks);
/// the well-formed entry beside it is still listed. Before, its strings
/// were copied whole.
#[wasm_bindgen_test]
async fn a_journal_entry_with_huge_fields_is_never_copied_into_wasm_memory() {
    let name = fresh_queue("journal-huge");
    let base = "http://127.0.0.1:9";
    let j = Journal::new(Some(name.clone()));
    let good = journal_entry(base, 1);
    j.put(&good).await.unwrap();
    let units = values::wasm_memory_bytes() + f64::from(4u32 << 20);
    let write = js_sys::Function::new_with_args(
        "name, base",
        &format!(
            "const big = 'x'.repeat({units});
            return new Promise((resolve, reject) => {{
                const open = indexedDB.open(name);
                open.onerror = () => reject(open.error);
                open.onsuccess = () => {{
                    const db = open.result;
                    const tx = db.transaction('leases', 'readwrite');
                    tx.objectStore('leases').put({{ base, itemId: 2, token: big, epoch: 1, queue: big,
                        ttlMs: 1, heartbeatMs: 1, locked: true }}, [base, 2]);
                    tx.oncomplete = () => {{ db.close(); resolve(); }};
                    tx.onerror = () => reject(tx.error);
                }};
            }});"
        ),
    );
    let p = write
        .call2(&JsValue::NULL, &name.as_str().into(), &base.into())
        .unwrap();
    wasm_bindgen_futures::JsFuture::from(js_sys::Promise::from(p))
        .await
        .expect("raw entry written");
    let before = values::wasm_memory_bytes();
    let listed = j.list(base).await.unwrap();
    j.delete(base, 2, "t").await.unwrap();
    let grew = values::wasm_memory_bytes() - before;
    assert!(
        grew < f64::from(2u32 << 20),
        "linear memory grew by {grew} bytes"
    );
    assert!(listed == vec![good], "only the well-formed entry is listed");
}

/// Journal calls made before the journal's database is open run in the
/// order they were made: a `delete` called right after its `put`, both
/// before the first open finished, removes the entry. (A review asked
/// whether the two connections such calls open could reorder them; they do
/// not: IndexedDB serves the opens of one name in request order, so the
/// put's transaction is created first. This guards that.)
#[wasm_bindgen_test]
async fn journal_calls_made_while_it_opens_keep_call_order() {
    let base = "http://127.0.0.1:9";
    for round in 0..12 {
        let name = fresh_queue("journal-order");
        let j = Journal::new(Some(name.clone()));
        let e = journal_entry(base, round);
        let (put, deleted) = futures::join!(j.put(&e), j.delete(base, e.item_id, &e.token));
        put.unwrap();
        deleted.unwrap();
        assert!(
            j.list(base).await.unwrap().is_empty(),
            "round {round}: the entry deleted after its put is still listed"
        );
    }
}
