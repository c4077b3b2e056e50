//! Credentials: authenticated requests, enrollment with a single-use token and
//! refresh on `401`, shared by concurrent callers through one JS Promise.

use std::rc::Rc;

use agentstore_protocol::lease::{EnrollRequest, RefreshRequest, WorkerCredentials};
use js_sys::Promise;
use wasm_bindgen::JsValue;
use wasm_bindgen_futures::JsFuture;
use web_sys::AbortSignal;

use super::client::ClientInner;
use super::error::{LeaseError, Result};
use super::http::{self, parse, to_js, Answer, Call};

/// How the client authenticates.
#[derive(Debug, Clone, Default)]
pub struct Credentials {
    /// Current access token (`Authorization: Bearer`); may be the admin token.
    pub access_token: Option<String>,
    /// Single-use refresh token, rotated by every refresh.
    pub refresh_token: Option<String>,
    /// Single-use enrollment token. Kept until an enrollment with it succeeds
    /// and dropped when the server refuses it. Resending it (or a refresh
    /// token) after a network error is safe: the server burns it atomically,
    /// and when only its answer was lost, the same token sent again within
    /// the server's replay grace (60 s by default) gets new credentials for
    /// the same worker.
    pub enrollment_token: Option<String>,
    /// Worker name sent with the enrollment.
    pub name: Option<String>,
}

/// The `again` of a call that carries no lease token: sent again as it was.
fn no_lease() -> Result<Option<JsValue>> {
    Ok(None)
}

impl ClientInner {
    /// An authenticated request: enrolls first when only an enrollment token is
    /// held, and refreshes once on `401` when a refresh token is held.
    ///
    /// # Errors
    /// As [`http::send`]; `Unauthorized` when no credentials are left.
    pub(crate) fn authed<'a>(
        self: &'a Rc<Self>,
        method: &'a str,
        path: &'a str,
        body: Option<&'a JsValue>,
        timeout_ms: f64,
        signal: Option<&'a AbortSignal>,
    ) -> impl std::future::Future<Output = Result<Answer>> + 'a {
        // Not an `async fn` of its own: one state machine (authed_while's)
        // serves both, instead of a copy inlined into a wrapper's.
        self.authed_while(method, path, body, timeout_ms, signal, &no_lease, None)
    }

    /// [`ClientInner::authed`] for a call that carries lease tokens: `again`
    /// is asked before the call is sent a second time (after a `401` and a
    /// credential refresh, which may take up to the request timeout), when
    /// the leases it carries may have ended or passed their local deadline
    /// meanwhile. It answers the error to give instead (the call is not sent
    /// again), or the body to send in place of `body` (built again from the
    /// leases still held), or `None` (sent again as it was). Never a
    /// heartbeat or a settle past the deadline (`HeartbeatPlan`): the server
    /// may already have handed the item to another worker.
    ///
    /// `key` is sent as `Idempotency-Key` (a claim's).
    ///
    /// # Errors
    /// As [`ClientInner::authed`], or the error `again` gives.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn authed_while(
        self: &Rc<Self>,
        method: &str,
        path: &str,
        body: Option<&JsValue>,
        timeout_ms: f64,
        signal: Option<&AbortSignal>,
        again: &dyn Fn() -> Result<Option<JsValue>>,
        key: Option<&str>,
    ) -> Result<Answer> {
        if self.creds.borrow().access_token.is_none() {
            self.renew(self.generation.get()).await?;
        }
        let mut retried = false;
        // The body built again for the second attempt, when `again` did.
        let mut rebuilt = None;
        let url = self.url(path);
        loop {
            let generation = self.generation.get();
            let token = self.creds.borrow().access_token.clone();
            let r = http::send(Call {
                method,
                url: &url,
                bearer: token.as_deref(),
                body: rebuilt.as_ref().or(body),
                timeout_ms,
                signal,
                key,
                numbered: key.is_some(),
            })
            .await;
            match r {
                Err(LeaseError::Unauthorized(m)) if !retried => {
                    let can = self.creds.borrow().refresh_token.is_some()
                        || generation != self.generation.get();
                    if !can {
                        return Err(LeaseError::Unauthorized(m));
                    }
                    self.renew(generation).await?;
                    rebuilt = again()?;
                    retried = true;
                }
                other => return other,
            }
        }
    }

    /// Gets new credentials (enroll or refresh) unless someone already did since
    /// `stale`; concurrent callers share one request (a refresh token is
    /// single-use) through one JS Promise, so `onCredentials` fires once.
    async fn renew(self: &Rc<Self>, stale: u32) -> Result<()> {
        if self.generation.get() != stale {
            return Ok(());
        }
        let existing = self.auth_flight.borrow().clone();
        let flight = match existing {
            Some(p) => p,
            None => {
                let me = self.clone();
                let p: Promise = crate::options::spawn_promise(async move {
                    let r = me.renew_now().await;
                    *me.auth_flight.borrow_mut() = None;
                    let ok = r.is_ok();
                    *me.auth_error.borrow_mut() = r.err();
                    Ok(JsValue::from(ok))
                });
                *self.auth_flight.borrow_mut() = Some(p.clone());
                p
            }
        };
        match JsFuture::from(flight).await {
            Ok(v) if v.as_bool() == Some(true) => Ok(()),
            _ => {
                Err(self.auth_error.borrow().clone().unwrap_or_else(|| {
                    LeaseError::Unauthorized("credentials renewal failed".into())
                }))
            }
        }
    }

    async fn renew_now(self: &Rc<Self>) -> Result<()> {
        let (refresh, enroll, name) = {
            let c = self.creds.borrow();
            (
                c.refresh_token.clone(),
                c.enrollment_token.clone(),
                c.name.clone(),
            )
        };
        let enrolling = refresh.is_none() && enroll.is_some();
        let (path, body) = if let Some(refresh_token) = refresh {
            (
                "/v1/workers/refresh",
                to_js(&RefreshRequest { refresh_token }),
            )
        } else if let Some(token) = enroll {
            ("/v1/workers/enroll", to_js(&EnrollRequest { token, name }))
        } else {
            return Err(LeaseError::Unauthorized(
                "no access token, refresh token or enrollment token".into(),
            ));
        };
        let url = self.url(path);
        let answer = http::send(Call {
            method: "POST",
            url: &url,
            bearer: None,
            body: Some(&body),
            timeout_ms: self.config.request_timeout_ms,
            signal: None,
            key: None,
            numbered: true,
        })
        .await;
        let answer = match answer {
            Ok(a) => a,
            Err(e) => {
                // A refused token is spent for good; after a network error or a
                // 5xx the same token is sent again on the next try.
                if enrolling && !e.is_transient() {
                    self.creds.borrow_mut().enrollment_token = None;
                }
                return Err(e);
            }
        };
        let wc: WorkerCredentials = parse(&answer.body)?;
        {
            let mut c = self.creds.borrow_mut();
            c.access_token = Some(wc.access_token.clone());
            c.refresh_token = Some(wc.refresh_token.clone());
            c.enrollment_token = None;
        }
        self.generation.set(self.generation.get().wrapping_add(1));
        if let Some(cb) = &self.config.on_credentials {
            let o = js_sys::Object::new();
            crate::error::set(&o, "workerId", &JsValue::from(wc.worker_id as f64));
            crate::error::set(&o, "accessToken", &wc.access_token.as_str().into());
            crate::error::set(&o, "refreshToken", &wc.refresh_token.as_str().into());
            crate::error::set(
                &o,
                "accessExpiresInMs",
                &JsValue::from(wc.access_expires_in_ms as f64),
            );
            // A throw (the app failed to save the refresh token) changes
            // nothing here, the new tokens being in use already, but is
            // logged: swallowed, the app would never learn of it.
            if let Err(e) = crate::value::call1(cb, &JsValue::UNDEFINED, &o) {
                web_sys::console::error_2(&"agentstore: onCredentials threw".into(), &e);
            }
        }
        Ok(())
    }
}
