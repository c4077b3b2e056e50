//! Recovery: reconcile the journal of earlier pages — release (or resume) the
//! leases no live page holds.

use std::rc::Rc;

use agentstore_protocol::lease::{HeartbeatResponse, ItemRef, TokenRequest};
use agentstore_protocol::lease_client::HeartbeatPlan;
use agentstore_protocol::ErrorCode;
use js_sys::Function;
use wasm_bindgen::JsValue;

use super::client::{item_path, ClientInner};
use super::error::{LeaseError, Result};
use super::http::{jumps, now_ms, parse, to_js};
use super::journal::Entry;
use super::lease::{LeaseInner, Status};
use super::lifecycle;

/// What `recover()` did with the journal of an earlier page.
#[derive(Default)]
pub struct Recovery {
    /// Released on the server (back in the queue now, not after the TTL).
    pub released: Vec<i64>,
    /// Still valid and now heartbeated by this client again.
    pub resumed: Vec<Rc<LeaseInner>>,
    /// Already gone on the server (taken over, settled or released).
    pub lost: Vec<i64>,
    /// Held by another live page (its Web Lock is taken), or by another
    /// worker on the server (403) whose release by the token alone was
    /// refused too: left alone.
    pub busy: Vec<i64>,
    /// Not touched: no Web Locks here, or the lease was claimed without one
    /// (`webLocks: false`), so a live page's lease cannot be told apart.
    pub skipped: Vec<i64>,
    /// Kept for the next `recover()`: the server could not be asked (no
    /// answer, a 5xx, refused credentials).
    pub pending: Vec<i64>,
}

/// Which list of a [`Recovery`] an entry goes to.
enum Became {
    Released,
    Lost,
    Busy,
    Skipped,
    Pending,
}

fn unlock_now(f: &Option<Function>) {
    if let Some(f) = f {
        let _ = crate::value::call0(f, &JsValue::UNDEFINED);
    }
}

impl ClientInner {
    /// Reconciles the journal of earlier pages for this base URL: each lease not
    /// held by a live page (its Web Lock is free) is released — or, with
    /// `resume`, heartbeated and handed back if still valid. An entry leaves the
    /// journal only once its lease has ended on the server.
    ///
    /// Once `close()` ran, the entries not reached yet stay journalled for a
    /// later `recover()` (the one being reconciled is finished; a lease it
    /// was resuming is released). The JS `recover()` rejects with
    /// `ClosedError` at `close()` without waiting for that entry, and
    /// `close()` waits for it.
    ///
    /// # Errors
    /// `ClosedError`; `TransactionError` when the journal cannot be read at all.
    pub async fn recover(self: &Rc<Self>, resume: bool) -> Result<Recovery> {
        self.recover_until(resume, &|| self.closed.get()).await
    }

    /// [`ClientInner::recover`], leaving the entries not reached yet for a
    /// later one once `stop()` is true (`work()`'s `stop()`, which must not
    /// wait for a whole journal's releases).
    ///
    /// # Errors
    /// As [`ClientInner::recover`].
    pub(crate) async fn recover_until(
        self: &Rc<Self>,
        resume: bool,
        stop: &dyn Fn() -> bool,
    ) -> Result<Recovery> {
        self.check_open()?;
        // `close()` waits for it (see `ClientInner::ending_call`).
        let _recovering = self.ending_call();
        let mut report = Recovery::default();
        let entries = self
            .journal
            .list(&self.base)
            .await
            .map_err(|e| LeaseError::Server {
                code: ErrorCode::Transaction,
                status: ErrorCode::Transaction.status(),
                message: e,
                retry_after_ms: None,
            })?;
        // The Web Locks held now: an entry whose lock another context holds
        // waits `lockWaitMs` once for all such entries (a context going
        // away lets go of its locks within it), then is busy if its lock is
        // still held; before, each waited `lockWaitMs` in turn (6 such
        // leases made `recover()`, and `work()`'s start, wait 6 s). Where
        // Web Locks cannot be queried, each waits in turn as before.
        let held_by = |held: &Option<js_sys::Array>, id: i64| {
            held.as_ref()
                .is_some_and(|h| h.includes(&self.lock_name(id).as_str().into(), 0))
        };
        let mut held = lifecycle::held_locks().await;
        let mine = |id: i64| self.leases.borrow().contains_key(&id);
        if entries
            .iter()
            .any(|e| e.locked && !mine(e.item_id) && held_by(&held, e.item_id))
        {
            // Not past `close()`: a closed client waits for no other
            // context (nor does `work()`'s `finished`, which waits for this).
            // Cleared when `close()` ends the wait early.
            let (mut wait, _end) = super::http::timer(self.config.lock_wait_ms);
            if let Some(c) = &self.closing {
                wait = crate::store::race_abort_js(&wait, &c.signal(), &JsValue::UNDEFINED);
            }
            let _ = wasm_bindgen_futures::JsFuture::from(wait).await;
            held = lifecycle::held_locks().await;
        }
        'entries: for entry in entries {
            let id = entry.item_id;
            if mine(id) || stop() {
                continue;
            }
            let mut unlock = None;
            // What became of the entry, and whether it leaves the journal
            // (its lease is over on the server). One journal delete for
            // every way there: one copy of its future in this loop's.
            let (became, forget) = 'entry: {
                // Claimed without a Web Lock: a free lock says nothing about
                // whether its context is alive. Left alone while its lease may
                // still be current; its entry goes once the server shows the
                // lease over (a crashed page's entries do not pile up).
                if !entry.locked {
                    break 'entry if self.lease_over(&entry).await {
                        (Became::Lost, true)
                    } else {
                        (Became::Skipped, false)
                    };
                }
                if held_by(&held, id) {
                    break 'entry (Became::Busy, false);
                }
                match lifecycle::lock(&self.lock_name(id), self.config.lock_wait_ms).await {
                    lifecycle::LockOutcome::Acquired(f) => unlock = Some(f),
                    lifecycle::LockOutcome::Busy => break 'entry (Became::Busy, false),
                    lifecycle::LockOutcome::Unsupported => break 'entry (Became::Skipped, false),
                }
                if resume {
                    match self.resume_entry(&entry).await {
                        Ok(Some(lease)) => {
                            lease.locking.set(true);
                            *lease.unlock.borrow_mut() = unlock.take();
                            // close() ran while this entry was being checked:
                            // it could not see the lease, so nothing would
                            // heartbeat or end it. It is released, as claim()
                            // releases a lease granted after close().
                            if self.closed.get() {
                                self.give_back(&lease).await;
                                return Err(LeaseError::Closed);
                            }
                            // Its deadline passed while it was checked (a slow
                            // answer): lost locally, which released it and
                            // let its lock go; never handed out as resumed.
                            if lease.status() != Status::Held {
                                break 'entry (Became::Lost, false);
                            }
                            report.resumed.push(lease);
                            continue 'entries;
                        }
                        Ok(None) => break 'entry (Became::Lost, true),
                        // Another worker's lease (a terminated worker's own
                        // enrollment): it cannot be resumed under these
                        // credentials, and its lock is free, so its context
                        // is gone: released below, by its token.
                        Err(LeaseError::Server {
                            code: ErrorCode::Forbidden,
                            ..
                        }) => {}
                        Err(_) => break 'entry (Became::Pending, false),
                    }
                }
                match self.release_token(id, &entry.token, false).await {
                    // A replay: this token had been released already (a
                    // pagehide beacon, or a release whose answer was lost).
                    Ok(true) => (Became::Lost, true),
                    Ok(false) => (Became::Released, true),
                    // Current on the server and held by another worker: a
                    // context of this origin enrolled on its own (a
                    // terminated Web Worker, a closed tab) whose Web Lock is
                    // free, so it is gone. Released by the token alone, as
                    // its `pagehide` beacon would have (workers have none),
                    // instead of left running until the TTL.
                    Err(LeaseError::Server {
                        code: ErrorCode::Forbidden,
                        ..
                    }) => match self.release_token(id, &entry.token, true).await {
                        Ok(true) => (Became::Lost, true),
                        Ok(false) => (Became::Released, true),
                        Err(e) if e.proves_lease_over() => (Became::Lost, true),
                        Err(e) if e.is_transient() => (Became::Pending, false),
                        Err(_) => (Became::Busy, false),
                    },
                    // claim_lost / state_conflict / not_found: nothing left to
                    // release. A release refused for another reason that is no
                    // outage (a 405 or 413, the server's or a proxy's page
                    // without its error body) says nothing either way: the item
                    // itself decides, as for an unlocked entry, so an entry
                    // whose lease is over never stays for good.
                    Err(e)
                        if e.proves_lease_over()
                            || ((!e.is_transient() || e.is_foreign_refusal())
                                && !matches!(e, LeaseError::Unauthorized(_))
                                && self.lease_over(&entry).await) =>
                    {
                        (Became::Lost, true)
                    }
                    Err(_) => (Became::Pending, false), // kept for the next recover
                }
            };
            if forget {
                let _ = self.journal.delete(&self.base, id, &entry.token).await;
            }
            match became {
                Became::Released => &mut report.released,
                Became::Lost => &mut report.lost,
                Became::Busy => &mut report.busy,
                Became::Skipped => &mut report.skipped,
                Became::Pending => &mut report.pending,
            }
            .push(id);
            unlock_now(&unlock);
        }
        Ok(report)
    }

    /// `POST /v1/items/{id}/release` with `token`; `true` when the server
    /// answered it as a replay (this token had been released already).
    /// With `by_token_alone`, sent without `Authorization`: the server
    /// authorises a release by its token alone (as it does a `pagehide`
    /// beacon), for a journalled lease of another worker whose context is
    /// gone (its Web Lock free), which these credentials may not release
    /// (`403`).
    ///
    /// # Errors
    /// As [`ClientInner::authed`], or [`super::http::send`] by the token
    /// alone (`claim_lost` for a token no longer current,
    /// `RateLimitedError` past the server's `--auth-rate`).
    pub(crate) async fn release_token(
        self: &Rc<Self>,
        item_id: i64,
        token: &str,
        by_token_alone: bool,
    ) -> Result<bool> {
        let body = to_js(&TokenRequest {
            token: token.to_owned(),
        });
        let path = item_path(item_id, "/release");
        let timeout_ms = self.config.request_timeout_ms;
        let answer = if by_token_alone {
            super::http::send(super::http::Call {
                method: "POST",
                url: &self.url(&path),
                bearer: None,
                body: Some(&body),
                timeout_ms,
                signal: None,
                key: None,
                numbered: false,
            })
            .await
        } else {
            self.authed("POST", &path, Some(&body), timeout_ms, None)
                .await
        };
        answer
            .and_then(|a| super::lease::confirmed(a, item_id, None))
            .map(|a| a.replayed)
    }

    /// Whether the server shows `entry`'s lease over: the item is neither
    /// running nor paused under the entry's epoch (claimed again, settled,
    /// released, expired), or it is gone. `false` when that cannot be told
    /// (no answer).
    ///
    /// A worker may not read an item it does not hold (403). The entry's
    /// token then decides, through a heartbeat: `claim_lost` / `not_found`
    /// say the token's lease is over; `forbidden` says it is still current
    /// and another worker's (the entry is another worker's, sharing this
    /// origin's journal). That heartbeat renews nothing: the server renews
    /// only a lease the calling worker holds, and the 403 said it holds none
    /// of this item.
    async fn lease_over(self: &Rc<Self>, entry: &Entry) -> bool {
        let path = item_path(entry.item_id, "");
        let timeout = self.config.request_timeout_ms;
        match self.authed("GET", &path, None, timeout, None).await {
            Ok(a) => {
                let state = crate::error::get_str(&a.body, "state");
                let held = matches!(state.as_deref(), Some("running" | "paused"));
                // A row the server cannot read answers its id and state
                // only (`unreadable_row`): no epoch to compare, so a held
                // one may still be this entry's lease.
                if crate::lease::wire::field(&a.body, "unreadable_row").is_truthy() {
                    return !held && state.is_some();
                }
                let same = parse::<ItemRef>(&a.body).is_ok_and(|v| v.epoch == entry.epoch);
                !(held && same)
            }
            Err(LeaseError::Server {
                code: ErrorCode::NotFound,
                ..
            }) => true,
            Err(LeaseError::Server {
                code: ErrorCode::Forbidden,
                ..
            }) => {
                let body = to_js(&TokenRequest {
                    token: entry.token.clone(),
                });
                let path = item_path(entry.item_id, "/heartbeat");
                matches!(
                    self.authed("POST", &path, Some(&body), timeout, None).await,
                    Err(LeaseError::Server {
                        code: ErrorCode::ClaimLost | ErrorCode::NotFound,
                        ..
                    })
                )
            }
            Err(_) => false,
        }
    }

    /// Heartbeats a journalled lease; `Some` (heartbeated from now on) if valid.
    /// Only the lease server's heartbeat answer (`{ttl_ms}`) counts as a
    /// renewal (a service worker's or a portal's 2xx is an unknown outcome:
    /// the entry stays for a later recover), and the local deadline runs for
    /// the shorter of the TTL it answered and the journal's (which any
    /// script of the origin can write).
    async fn resume_entry(self: &Rc<Self>, entry: &Entry) -> Result<Option<Rc<LeaseInner>>> {
        let body = to_js(&TokenRequest {
            token: entry.token.clone(),
        });
        let sent_at = now_ms();
        let jumps = jumps();
        let timeout = self.config.request_timeout_ms;
        let path = item_path(entry.item_id, "/heartbeat");
        let renewed: HeartbeatResponse =
            match self.authed("POST", &path, Some(&body), timeout, None).await {
                Ok(a) => parse(&a.body)?,
                // Kept for a later recover: no answer, refused credentials, or
                // (403) a lease another worker holds.
                Err(
                    e @ (LeaseError::Network(_)
                    | LeaseError::Unauthorized(_)
                    | LeaseError::Server {
                        code: ErrorCode::Forbidden,
                        ..
                    }),
                ) => return Err(e),
                Err(e) if e.proves_lease_over() => return Ok(None),
                Err(e) => return Err(e),
            };
        let answer = self
            .authed("GET", &item_path(entry.item_id, ""), None, timeout, None)
            .await?;
        let view: ItemRef = parse(&answer.body)?;
        // Paused and resumed (a new claim, a new token) between the heartbeat
        // and this read: the journalled token is stale, and pairing it with
        // the new epoch would send the wrong fence.
        if view.epoch != entry.epoch {
            return Ok(None);
        }
        // Released, settled, taken over or paused between the heartbeat and
        // this read (a gone page's beacon or settle landing late): the epoch
        // is unchanged but the token is over, so the lease is not resumed.
        // Every way to a new token grows the epoch, so a `running` item of
        // the same epoch is still this token's.
        if crate::error::get_str(&answer.body, "state").as_deref() != Some("running") {
            return Ok(None);
        }
        let ttl_ms = entry.ttl_ms.min(renewed.ttl_ms);
        let mut plan = HeartbeatPlan::new(sent_at, ttl_ms as f64, entry.heartbeat_ms as f64);
        plan.jumps = jumps;
        let lease = Rc::new(LeaseInner::new(
            self,
            entry.queue.clone(),
            entry.token.clone(),
            view,
            answer.body,
            plan,
        )?);
        self.leases
            .borrow_mut()
            .insert(lease.item_id, lease.clone());
        self.ensure_heartbeats();
        Ok(Some(lease))
    }
}
