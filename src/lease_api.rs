//! The JavaScript API of work leases (`#[wasm_bindgen]` exports): `LeaseClient`,
//! `Lease` and `Worker`. Thin: parse options, call [`crate::lease`], turn
//! results into plain JS objects and errors into JS `Error`s (`ClaimLostError`
//! carries `reason`: `claim_lost` | `expired_locally` | `released`). Every
//! method returning a Promise never panics.

use std::rc::Rc;

use agentstore_protocol::lease::SettleState;
use js_sys::{Array, Function, Object, Promise};
use wasm_bindgen::prelude::*;
use web_sys::{AbortSignal, Headers, Request};

use crate::error::set;
use crate::lease::{
    Claimed, ClientConfig, ClientInner, Credentials, LeaseError, LeaseInner, Status, WorkOptions,
    WorkerInner,
};
use crate::options::{known, opt, opt_bool, opt_fn, opt_num, opt_signal, opt_str};
use agentstore_protocol::lease::ItemState;

#[wasm_bindgen(typescript_custom_section)]
const TS_LEASE_TYPES: &str = r#"
export interface LeaseClientOptions {
  /** Bearer token (a worker's access token, or the admin token). */
  accessToken?: string | null | undefined;
  /** Refresh token: used once on a 401, then rotated (see onCredentials). */
  refreshToken?: string | null | undefined;
  /** Single-use enrollment token: enrolls on the first request when no accessToken is given. */
  enrollmentToken?: string | null | undefined;
  /** Worker name sent with the enrollment. */
  name?: string | null | undefined;
  /** Called after each enrollment/refresh with the NEW tokens; persist refreshToken. What it throws is logged with console.error; the call goes on. */
  onCredentials?: ((c: IssuedCredentials) => void) | null | undefined;
  /** Bound of one request (ms, an integer in 1..=600000). Default 30000. */
  requestTimeoutMs?: number | null | undefined;
  /** Lease journal: false disables it, a string names its IndexedDB database. Default "agentstore-leases". */
  journal?: boolean | string | null | undefined;
  /** Hold a Web Lock per lease (navigator.locks; skipped where absent). Default true. */
  webLocks?: boolean | null | undefined;
  /** Release held leases with a beacon on pagehide (windows only). Default true. */
  releaseOnPagehide?: boolean | null | undefined;
  /** recover(): how long to wait for another page's lease lock (ms, an integer in 0..=600000). Default 1000. */
  lockWaitMs?: number | null | undefined;
  /**
   * Origins (`"https://api.example"`) besides the lease server's own that `lease.fetch` sends
   * `X-Lease-Token`/`X-Lease-Epoch` to. Default none: the token alone can release the lease,
   * so it never goes to a third party unless you name it here.
   */
  leaseHeaderOrigins?: readonly string[] | null | undefined;
  /** TEST HOOK: maps each heartbeat timer delay (ms) to the delay used (simulates throttled tabs). */
  testTimerDelay?: ((ms: number) => number) | null | undefined;
}
export interface WorkOptions {
  /** Parallel slots, 1..64. Default 1. */
  concurrency?: number | null | undefined;
  /** Wait after an empty claim (ms, an integer in 0..=3600000), plus jitter in [0, min(interval/2, 30 s)]. Default 5000. */
  pollIntervalMs?: number | null | undefined;
  /** Reconnect backoff random(base, min(cap, base*2^n)) (ms), 1..3600000; default 10000. */
  reconnectBaseMs?: number | null | undefined;
  /** Cap of the reconnect backoff (ms), reconnectBaseMs..3600000 (a cap below the base, given or default, is a ValidationError); default 300000. */
  reconnectCapMs?: number | null | undefined;
}
/** The credentials handed to `onCredentials` after an enrollment or refresh. */
export interface IssuedCredentials { workerId: number; accessToken: string; refreshToken: string; accessExpiresInMs: number; }
/** `LeaseClient.credentials`: the tokens in use now (null when absent). */
export interface CurrentCredentials { accessToken: string | null; refreshToken: string | null; }
export type ItemState = "open" | "running" | "paused" | "blocked" | "done" | "failed";
export type SettleState = "done" | "failed" | "blocked" | "paused";
/** A work item as the lease server sends it (`lease.item`, and what `settle` resolves with). */
export interface LeaseItem {
  id: number; queue: string; state: ItemState;
  /** The enqueued JSON payload. */
  payload: unknown;
  /** The result given to the last settle, if any. */
  result?: unknown;
  /** Claims that ended without a settle (expiries and releases). */
  attempts: number; max_redeliveries: number;
  /** Grows on every claim and resume. */
  epoch: number;
  last_error?: string | null; worker_id?: number | null;
}
/** What `settle` resolves with when the server applied it but cannot read the item's stored row (its payload is not JSON). */
export interface UnreadableItem { id: number; state: ItemState; unreadable_row: true; }
export interface ClaimOptions { signal?: AbortSignal | null | undefined; }
export interface RecoverOptions {
  /** true: journalled leases that are still valid are heartbeated and returned in `resumed` instead of released. */
  resume?: boolean | null | undefined;
}
export interface SettleOptions {
  /** A message stored as the item's `last_error` (for failed / blocked). */
  error?: string | null | undefined;
}
/** `work()` handler: its resolved value settles the item `done` (with it as the result; one JSON cannot carry, such as NaN or a Date, settles `failed` with the reason), a throw settles `failed`. */
export type WorkHandler = (lease: Lease) => unknown | Promise<unknown>;
/** Errors of the lease client: `name`/`code`/`status` as in the README table. */
export interface LeaseError extends Error {
  name: ErrorName; code: ErrorCode; status: number;
  /** From `Retry-After` (ms, at most 3,600,000: a longer or unbounded one is read as 1 hour, the longest the reference server asks for). */
  retryAfterMs?: number;
  /** AbortError: the signal's reason. */
  cause?: unknown;
}
export interface WorkStats { claimed: number; done: number; failed: number; lost: number; released: number; connectionFailures: number; backoffsMs: number[]; pollDelaysMs: number[]; }
export interface Recovery { released: number[]; lost: number[]; busy: number[]; skipped: number[]; pending: number[]; resumed: Lease[]; }
/** `ClaimLostError`: the lease is gone; nothing was written under it after it was lost (a settle of unknown outcome sent before may have landed: the same settle sent again says). */
export interface ClaimLostError extends Error { name: "ClaimLostError"; code: "claim_lost"; status: 409; reason: "claim_lost" | "expired_locally" | "released"; itemId: number; }
/** `AlreadySettledError`: a settle of this lease landed before (its answer was lost) and this one asked for something else; nothing was written by it, and the lease is settled into `settledState`. */
export interface AlreadySettledError extends Error { name: "AlreadySettledError"; code: "already_settled"; status: 409; settledState: SettleState; itemId: number; }
"#;

/// A string argument: `ValidationError` naming `what` for any other JS type
/// (exports never take `String`, whose glue traps on a number) and for a
/// string with a lone surrogate, which the conversion would change
/// ([`crate::value::exact_string`]).
fn string_param(v: &JsValue, what: &'static str) -> Result<String, LeaseError> {
    crate::value::exact_string(v).ok_or_else(|| {
        let mut m = String::from(what);
        m.push_str(crate::value::STRING_ARG);
        LeaseError::Validation(m)
    })
}

/// A queue name argument: a string that is a queue name
/// (`agentstore_protocol::lease::is_queue_name`), else a ValidationError
/// saying the rule, before anything is sent (`.` and `..` would reach other
/// routes once the URL is resolved).
fn queue_param(v: &JsValue) -> Result<String, LeaseError> {
    let queue = string_param(v, "queue")?;
    if agentstore_protocol::lease::is_queue_name(&queue) {
        Ok(queue)
    } else {
        Err(LeaseError::Validation(
            agentstore_protocol::lease::QUEUE_NAME_RULE.into(),
        ))
    }
}

/// Runs `f` as a Promise rejecting with the error's JS `Error`.
fn run<F>(f: F) -> Promise
where
    F: std::future::Future<Output = Result<JsValue, LeaseError>> + 'static,
{
    crate::options::run(f)
}

/// The Promise-returning lease methods' calls, which share one exported
/// async body ([`call`]): one state machine in the module instead of one
/// per method.
enum Call {
    /// `client.claim(queue, options)`.
    Claim(Rc<ClientInner>, JsValue, JsValue),
    /// `client.recover(options)`.
    Recover(Rc<ClientInner>, JsValue),
    /// `client.close()`.
    Close(Rc<ClientInner>),
    /// `lease.heartbeat()`.
    Heartbeat(Rc<LeaseInner>),
    /// `lease.settle(…)`, its arguments read during the call.
    Settle(Rc<LeaseInner>, SettleArgs),
    /// `lease.release()`.
    Release(Rc<LeaseInner>),
    /// `worker.stop()`.
    Stop(Rc<WorkerInner>),
}

/// `settle`'s state, result and error message, or why they were refused.
type SettleArgs = Result<(SettleState, Option<JsValue>, Option<String>), LeaseError>;

/// Runs one lease method as a Promise (its first poll, during the call,
/// reads its arguments).
fn call(c: Call) -> Promise {
    run(async move {
        match c {
            Call::Claim(inner, queue, options) => {
                let queue = queue_param(&queue)?;
                known(&options, "signal")?;
                let signal = opt_signal(&options)?;
                let _watch = crate::options::track(signal.as_ref());
                match inner.claim(&queue, signal.as_ref()).await? {
                    Claimed::Lease(l) => Ok(Lease::from_inner(l).into()),
                    Claimed::Empty(_) => Ok(JsValue::NULL),
                }
            }
            Call::Recover(inner, options) => recovery_js(&inner, &options).await,
            Call::Close(inner) => {
                inner.close().await;
                Ok(JsValue::UNDEFINED)
            }
            Call::Heartbeat(inner) => Ok(JsValue::from(inner.heartbeat().await? as f64)),
            Call::Settle(inner, asked) => {
                let (state, result, error) = asked?;
                inner.settle(state, result, error).await
            }
            Call::Release(inner) => {
                // Recorded in the first poll (synchronously, during the
                // call), and only when the call is not refused for nesting;
                // never in place of an ending call that may land (on the
                // wire, or unanswered: a settle, whose work `work()` and
                // `close()` then send again if this release fails too,
                // rather than a release handing that work back). Behind one
                // on the wire, that call's answer decides, later
                // (`release_behind`).
                if inner.ending_pending() {
                    inner.release_behind.set(true);
                } else {
                    *inner.asked.borrow_mut() = Some(crate::lease::lease::Ending::Release);
                }
                inner.release().await?;
                Ok(JsValue::UNDEFINED)
            }
            Call::Stop(inner) => {
                inner.stop().await;
                Ok(JsValue::UNDEFINED)
            }
        }
    })
}

/// `recover(options)`'s answer: `{released, lost, busy, skipped, pending,
/// resumed}`.
async fn recovery_js(inner: &Rc<ClientInner>, options: &JsValue) -> Result<JsValue, LeaseError> {
    known(options, "resume")?;
    let resume = opt_bool(options, "resume")?.unwrap_or(false);
    let r = inner.recover(resume).await?;
    let o = Object::new();
    let ids = |v: &[i64]| -> JsValue {
        let a = Array::new();
        for &i in v {
            a.push(&JsValue::from(i as f64));
        }
        a.into()
    };
    set(&o, "released", &ids(&r.released));
    set(&o, "lost", &ids(&r.lost));
    set(&o, "busy", &ids(&r.busy));
    set(&o, "skipped", &ids(&r.skipped));
    set(&o, "pending", &ids(&r.pending));
    set(&o, "resumed", &leases_js(r.resumed));
    Ok(o.into())
}

/// A client of the agentstore lease server.
///
/// ```js
/// const client = new LeaseClient("https://leases.example", { enrollmentToken, onCredentials: save });
/// await client.recover();                  // release what a closed page still held
/// const lease = await client.claim("jobs"); // Lease | null
/// if (lease) {
///   const res = await lease.fetch("/api/run", { method: "POST", body: JSON.stringify(lease.item.payload) });
///   await lease.settle("done", await res.json());
/// }
/// ```
///
/// Heartbeats run automatically (one batched request for all held leases) at
/// the server's interval; a lease whose heartbeats fail until its local
/// deadline (`sent_at` of the last successful heartbeat + TTL − margin, on
/// `performance.now()`; 5 s after a jump of the wall clock unless a heartbeat
/// sent after it succeeds) aborts with `expired_locally`.
#[wasm_bindgen]
pub struct LeaseClient {
    inner: Rc<ClientInner>,
}

#[wasm_bindgen]
impl LeaseClient {
    /// `new LeaseClient(baseUrl, options)`; see `LeaseClientOptions`.
    ///
    /// # Errors
    /// `ValidationError` for a bad base URL or option.
    #[wasm_bindgen(constructor)]
    pub fn new(
        #[wasm_bindgen(js_name = baseUrl, unchecked_param_type = "string")] base_url: JsValue,
        #[wasm_bindgen(unchecked_optional_param_type = "LeaseClientOptions | null")]
        options: JsValue,
    ) -> Result<LeaseClient, JsValue> {
        crate::options::nested(|| Self::build(&base_url, &options))?.map_err(|e| e.to_js())
    }

    fn build(base_url: &JsValue, o: &JsValue) -> Result<LeaseClient, LeaseError> {
        let base_url = string_param(base_url, "baseUrl")?;
        if !(o.is_undefined() || o.is_null() || o.is_object()) || o.is_function() {
            return Err(LeaseError::Validation("options must be an object".into()));
        }
        known(
            o,
            "accessToken refreshToken enrollmentToken name onCredentials requestTimeoutMs \
             journal webLocks releaseOnPagehide lockWaitMs leaseHeaderOrigins testTimerDelay",
        )?;
        let creds = Credentials {
            access_token: opt_str(o, "accessToken")?,
            refresh_token: opt_str(o, "refreshToken")?,
            enrollment_token: opt_str(o, "enrollmentToken")?,
            name: opt_str(o, "name")?,
        };
        let mut config = ClientConfig::default();
        if let Some(t) = opt_num(
            o,
            "requestTimeoutMs",
            1,
            600_000,
            "an integer in [1, 600000]",
        )? {
            config.request_timeout_ms = t;
        }
        let journal = opt(o, "journal")?;
        if let Some(b) = journal.as_bool() {
            if !b {
                config.journal_name = None;
            }
        } else if let Some(name) = crate::value::short_string(&journal, crate::value::MAX_ARG_UNITS)
        {
            config.journal_name = Some(name);
        } else if !journal.is_undefined() && !journal.is_null() {
            return Err(LeaseError::Validation(
                "journal must be a boolean or a string".into(),
            ));
        }
        if let Some(b) = opt_bool(o, "webLocks")? {
            config.use_locks = b;
        }
        if let Some(b) = opt_bool(o, "releaseOnPagehide")? {
            config.release_on_pagehide = b;
        }
        if let Some(ms) = opt_num(o, "lockWaitMs", 0, 600_000, "an integer in [0, 600000]")? {
            config.lock_wait_ms = ms;
        }
        let origins = opt(o, "leaseHeaderOrigins")?;
        if !origins.is_undefined() && !origins.is_null() {
            let bad = || {
                LeaseError::Validation(
                    "leaseHeaderOrigins must be an array of at most 64 absolute URLs".into(),
                )
            };
            if !crate::value::is_array(&origins).map_err(|_| bad())? {
                return Err(bad());
            }
            let origins =
                crate::value::items(origins.unchecked_ref(), 64, "").map_err(|_| bad())?;
            for v in origins {
                let origin = crate::value::short_string(&v, crate::value::MAX_ARG_UNITS)
                    .and_then(|u| crate::lease::client::origin_of(&u))
                    .ok_or_else(bad)?;
                config.header_origins.push(origin);
            }
        }
        config.timer_delay = opt_fn(o, "testTimerDelay")?;
        config.on_credentials = opt_fn(o, "onCredentials")?;
        Ok(LeaseClient {
            inner: ClientInner::new(&base_url, creds, config)?,
        })
    }

    /// Claims the oldest open item of `queue`: a `Lease`, or `null` when none is open.
    /// Options: `{signal}`. A claim answered after its local deadline (the
    /// answer took longer than the TTL less the safety margin) resolves to a
    /// lease already lost (`expired_locally`, its signal aborted, given
    /// back): call `throwIfLost()` before acting on any lease. `work()`
    /// never starts its handler on one.
    ///
    /// # Errors
    /// `NetworkError`, `RateLimitedError` (`retryAfterMs`), `UnauthorizedError`,
    /// `ForbiddenError` (a queue out of the credentials' scope), `InternalError`,
    /// `AbortError`, `ClosedError` (also when `close()` runs while the claim
    /// waits for its answer: it rejects at once, and a lease the server
    /// grants it is released); `ValidationError` for bad options or a
    /// `queue` that is not a queue name (1–200 of `A-Z a-z 0-9 _ - . :`, not
    /// `.` or `..`), before anything is sent.
    #[wasm_bindgen(unchecked_return_type = "Promise<Lease | null>")]
    pub fn claim(
        &self,
        #[wasm_bindgen(unchecked_param_type = "string")] queue: JsValue,
        #[wasm_bindgen(unchecked_optional_param_type = "ClaimOptions | null")] options: JsValue,
    ) -> Promise {
        call(Call::Claim(self.inner.clone(), queue, options))
    }

    /// Starts a work loop: `handler(lease)` (may be async) runs for each claimed
    /// item under `lease.signal`; its result settles `done`, a throw settles
    /// `failed` (one after the browser's own `beforeunload` only if the page
    /// is still there 3 s later: else the `pagehide` beacon hands it back),
    /// a lost lease discards it. No claim after the browser's own `pagehide`
    /// until the page is shown again. See `WorkOptions`. Leases journalled
    /// by earlier pages are released (`recover()`) before the first claim. An
    /// empty claim waits `pollIntervalMs` plus jitter, and at least the server's
    /// `Retry-After`.
    ///
    /// # Errors
    /// `ValidationError` for bad options (among them a `reconnectCapMs`
    /// below `reconnectBaseMs`, either of them given or default) or a
    /// `queue` that is not a queue name; `ClosedError` after `close()`.
    /// Nothing starts then.
    pub fn work(
        &self,
        #[wasm_bindgen(unchecked_param_type = "string")] queue: JsValue,
        #[wasm_bindgen(unchecked_param_type = "WorkHandler")] handler: JsValue,
        #[wasm_bindgen(unchecked_optional_param_type = "WorkOptions | null")] options: JsValue,
    ) -> Result<Worker, JsValue> {
        let queue = queue_param(&queue).map_err(|e| e.to_js())?;
        let handler: Function = handler
            .dyn_into()
            .map_err(|_| LeaseError::Validation("handler must be a function".into()).to_js())?;
        self.inner.check_open().map_err(|e| e.to_js())?;
        let parse = || -> Result<WorkOptions, LeaseError> {
            known(
                &options,
                "concurrency pollIntervalMs reconnectBaseMs reconnectCapMs",
            )?;
            let mut w = WorkOptions::default();
            if let Some(c) = opt_num(&options, "concurrency", 1, 64, "an integer in [1, 64]")? {
                w.concurrency = c as u32;
            }
            if let Some(p) = opt_num(
                &options,
                "pollIntervalMs",
                0,
                3_600_000,
                "an integer in [0, 3600000]",
            )? {
                w.poll_interval_ms = p;
            }
            if let Some(b) = opt_num(
                &options,
                "reconnectBaseMs",
                // 0 would retry an unreachable server in a tight loop.
                1,
                3_600_000,
                "an integer in [1, 3600000]",
            )? {
                w.reconnect_base_ms = b;
            }
            if let Some(c) = opt_num(
                &options,
                "reconnectCapMs",
                1,
                3_600_000,
                "an integer in [1, 3600000]",
            )? {
                w.reconnect_cap_ms = c;
            }
            // A cap below the base (either given, or the other's default)
            // has no window to draw from: refused, never clamped.
            if w.reconnect_cap_ms < w.reconnect_base_ms {
                return Err(LeaseError::Validation(
                    "reconnectCapMs must be at least reconnectBaseMs (defaults 300000 and 10000)"
                        .into(),
                ));
            }
            Ok(w)
        };
        let opts = crate::options::nested(parse)?.map_err(|e| e.to_js())?;
        let inner = WorkerInner::start(self.inner.clone(), queue, handler, opts, wrap_lease);
        Ok(Worker { inner })
    }

    /// Reconciles leases journalled by earlier pages (for this base URL): those
    /// no live page holds are released now (`{resume: true}`: heartbeated and
    /// returned in `resumed` when still valid). Leases another page holds (its
    /// Web Lock is taken) are left alone; without Web Locks nothing is touched.
    ///
    /// # Errors
    /// `ClosedError` after `close()`, and at once when `close()` runs
    /// meanwhile (the entry being reconciled is finished, a lease being
    /// resumed released; the others stay journalled); `TransactionError`
    /// when the journal cannot be read; `ValidationError` for bad options.
    #[wasm_bindgen(unchecked_return_type = "Promise<Recovery>")]
    pub fn recover(
        &self,
        #[wasm_bindgen(unchecked_optional_param_type = "RecoverOptions | null")] options: JsValue,
    ) -> Promise {
        let recovering = call(Call::Recover(self.inner.clone(), options));
        let Some(closing) = &self.inner.closing else {
            return recovering;
        };
        // Raced with `close()`: at its abort the race adopts `closed`, a
        // Promise rejected with ClosedError (marked handled, so only the
        // race reports it). The reconciling runs on in the call's task
        // and stops after its entry (`ClientInner::recover`).
        let closed = Promise::reject(&LeaseError::Closed.to_js());
        crate::lease::heartbeat::mark_handled(&closed);
        crate::store::race_abort_js(&recovering, &closing.signal(), &closed)
    }

    /// The leases this client holds now, as new `Lease` objects on each
    /// read (each acts on the same lease as the one `claim` gave; compare
    /// them by `itemId` and `epoch`, not with `===` or `includes`).
    #[wasm_bindgen(getter, unchecked_return_type = "Lease[]")]
    pub fn held(&self) -> Array {
        leases_js(self.inner.held())
    }

    /// The current tokens `{accessToken, refreshToken}` (null when absent).
    #[wasm_bindgen(getter, unchecked_return_type = "CurrentCredentials")]
    pub fn credentials(&self) -> JsValue {
        let c = self.inner.credentials();
        let o = Object::new();
        let s = |v: Option<String>| v.map_or(JsValue::NULL, JsValue::from);
        set(&o, "accessToken", &s(c.access_token));
        set(&o, "refreshToken", &s(c.refresh_token));
        o.into()
    }

    /// Releases every held lease (their signals abort with `released`) and
    /// stops; later calls reject with `ClosedError`. A lease whose settle
    /// failed is settled once more with the same body instead.
    /// A `claim()` or `recover()` still waiting for its answer (and a
    /// `work()` slot's claim) rejects with `ClosedError` at once; its request
    /// runs on, and a lease it brings is released.
    /// Resolves once every lease has been settled or released (or its call
    /// failed; its journal entry then stays for `recover()`), including
    /// those late grants: it waits for their answers and releases, each
    /// bounded by `requestTimeoutMs`. `free()` and `[Symbol.dispose]()`
    /// start it too (`using client = new LeaseClient(…)` closes the client
    /// at the end of the block; `await using` waits for it). A second call,
    /// or one after `free()`, does nothing and resolves.
    #[wasm_bindgen(unchecked_return_type = "Promise<void>")]
    pub fn close(&self) -> Promise {
        call(Call::Close(self.inner.clone()))
    }
}

fn wrap_lease(inner: Rc<LeaseInner>) -> JsValue {
    Lease::from_inner(inner).into()
}

/// `Lease[]` for `held` and `recover`'s `resumed`.
fn leases_js(leases: Vec<Rc<LeaseInner>>) -> Array {
    let a = Array::new();
    for l in leases {
        a.push(&wrap_lease(l));
    }
    a
}

/// A claimed work item. `signal` aborts with a `ClaimLostError` when the lease
/// is lost (`reason: "claim_lost"`), expires locally (`"expired_locally"`) or is
/// released (`"released"`); stop the work then — a settle made after the loss
/// is refused (nothing written). A settle already on the wire when the lease
/// expired locally may still land: it then resolves, and `status` turns from
/// `"expired_locally"` to `"settled"` (the signal stays aborted).
///
/// Fence your own writes with `epoch` (it grows on every claim of the item):
/// store it with what you write and refuse writes with a lower epoch than the
/// stored one; `lease.fetch()` sends it as `X-Lease-Epoch` (and the token as
/// `X-Lease-Token`) for your server to check.
///
/// A `Lease` keeps its `LeaseClient` alive: an app that drops the client and
/// keeps only the lease (`await new LeaseClient(url, o).claim(q)`) still
/// holds it, and the client's heartbeats go on until `close()`, or until
/// the client and all its leases are freed (then what is still held is
/// released). A lease dropped without a settle or release may stay held
/// until the page goes away: a listener on its own `signal` that refers to
/// it keeps it and its client alive (the signal's controller is held by
/// the client's Rust side).
#[wasm_bindgen]
pub struct Lease {
    inner: Rc<LeaseInner>,
    /// The client, strongly (the client holds its leases' Rust side, never
    /// this wrapper: no cycle).
    _client: Option<Rc<ClientInner>>,
}

impl Lease {
    /// Wraps a Rust lease (for `work()` handlers and tests).
    pub fn from_inner(inner: Rc<LeaseInner>) -> Lease {
        Lease {
            _client: inner.client().ok(),
            inner,
        }
    }

    /// The Rust side of this lease.
    pub fn inner(&self) -> &Rc<LeaseInner> {
        &self.inner
    }
}

#[wasm_bindgen]
impl Lease {
    /// The item as the server sent it: `{id, queue, state, payload, attempts, max_redeliveries, epoch, …}`.
    #[wasm_bindgen(getter, unchecked_return_type = "LeaseItem")]
    pub fn item(&self) -> JsValue {
        self.inner.item.clone()
    }

    /// The item id.
    #[wasm_bindgen(getter, js_name = itemId)]
    pub fn item_id(&self) -> f64 {
        self.inner.item_id as f64
    }

    /// The claim's epoch (exact: below 2^53).
    #[wasm_bindgen(getter)]
    pub fn epoch(&self) -> f64 {
        self.inner.epoch as f64
    }

    /// The queue.
    #[wasm_bindgen(getter)]
    pub fn queue(&self) -> String {
        self.inner.queue.clone()
    }

    /// The lease token (the fence of every call about this claim; keep it secret).
    #[wasm_bindgen(getter)]
    pub fn token(&self) -> String {
        self.inner.token().to_owned()
    }

    /// Aborted with a `ClaimLostError` when the lease is lost or released.
    #[wasm_bindgen(getter)]
    pub fn signal(&self) -> AbortSignal {
        self.inner.signal()
    }

    /// `"held"`, `"ending"`, `"settled"`, or the loss reason.
    #[wasm_bindgen(
        getter,
        unchecked_return_type = "\"held\" | \"ending\" | \"settled\" | \"claim_lost\" | \"expired_locally\" | \"released\""
    )]
    pub fn status(&self) -> String {
        match self.inner.status() {
            Status::Held => "held".into(),
            Status::Ending => "ending".into(),
            Status::Settled(_) => "settled".into(),
            Status::Lost(r) => r.as_str().into(),
        }
    }

    /// Milliseconds left to the local deadline (negative once past it).
    #[wasm_bindgen(getter, js_name = msToDeadline)]
    pub fn ms_to_deadline(&self) -> f64 {
        // A jump of the wall clock not yet taken in shortens it first.
        self.inner.check_deadline();
        self.inner.deadline() - crate::lease::http::now_ms()
    }

    /// Throws the `ClaimLostError` if the lease is no longer held, or once a
    /// release of it was sent (reason `released`; even while `status` still
    /// reads `ending`, or `held` after the release failed: the server may
    /// have applied it).
    #[wasm_bindgen(js_name = throwIfLost)]
    pub fn throw_if_lost(&self) -> Result<(), JsValue> {
        match self.inner.fenced_error() {
            Some(e) => Err(e.to_js()),
            None => Ok(()),
        }
    }

    /// Renews now; resolves with the TTL (ms). Automatic heartbeats already run.
    ///
    /// # Errors
    /// `ClaimLostError` when the claim is gone; `NetworkError`;
    /// `StateConflictError`, without sending anything, while a settle or
    /// release of this lease is out or unanswered; `StateConflictError` from
    /// the server when the item left `running` by another path (an operator
    /// paused or cancelled it): the lease is lost then too (`status`
    /// `"claim_lost"`, `signal` aborted with a `ClaimLostError`).
    #[wasm_bindgen(unchecked_return_type = "Promise<number>")]
    pub fn heartbeat(&self) -> Promise {
        call(Call::Heartbeat(self.inner.clone()))
    }

    /// Settles into `state` (`"done"`, `"failed"`, `"blocked"`, `"paused"`) with
    /// an optional JSON `result` and `{error}` message; resolves with the item,
    /// or with `{id, state, unreadable_row: true}` when the server applied the
    /// settle but cannot read the item's stored row (its payload is not JSON).
    ///
    /// # Errors
    /// `ClaimLostError` (without sending anything if the lease is already lost,
    /// except the same settle sent again to learn what became of one of
    /// unknown outcome, below),
    /// `StateConflictError` when the item left `running` by another path (an
    /// operator paused or cancelled it; nothing written, the lease is lost:
    /// `status` `"claim_lost"`, `signal` aborted with a `ClaimLostError`),
    /// `NetworkError` (the lease is kept; retry; unless a heartbeat was
    /// refused meanwhile: then lost at once, and the same settle sent again
    /// within the local deadline ends it settled if the first one landed),
    /// `ValidationError` for a bad state or a result JSON cannot carry
    /// (the records' rules: NaN, `undefined` in an array, a `Date`, a
    /// `Map`… are refused, never changed as `JSON.stringify` would);
    /// `AlreadySettledError` (`settledState`) when an earlier settle of this
    /// lease landed and this one asks for something else: the lease is
    /// settled by that one, nothing was written by this one.
    #[wasm_bindgen(unchecked_return_type = "Promise<LeaseItem | UnreadableItem>")]
    pub fn settle(
        &self,
        #[wasm_bindgen(unchecked_param_type = "SettleState")] state: JsValue,
        #[wasm_bindgen(unchecked_optional_param_type = "unknown")] result: JsValue,
        #[wasm_bindgen(unchecked_optional_param_type = "SettleOptions | null")] options: JsValue,
    ) -> Promise {
        let inner = self.inner.clone();
        // Read and recorded synchronously: a handler that calls settle()
        // and returns without awaiting it has asked for this ending by the
        // time work() looks.
        let asked: Result<_, LeaseError> = match crate::options::nested(|| {
            (|| {
                let state = crate::value::short_string(&state, 16)
                    .and_then(|s| ItemState::parse(&s))
                    .and_then(|s| match s {
                        ItemState::Done => Some(SettleState::Done),
                        ItemState::Failed => Some(SettleState::Failed),
                        ItemState::Blocked => Some(SettleState::Blocked),
                        ItemState::Paused => Some(SettleState::Paused),
                        _ => None,
                    })
                    .ok_or_else(|| {
                        LeaseError::Validation(
                            "state must be done, failed, blocked or paused".into(),
                        )
                    })?;
                let result = if result.is_undefined() {
                    None
                } else {
                    Some(
                        crate::value::json_value(&result)
                            .map_err(|e| LeaseError::Validation(e.message()))?,
                    )
                };
                known(&options, "error")?;
                let error = opt_str(&options, "error")?;
                // The app's last call: a release made before it, still
                // waiting behind an earlier settle, no longer decides.
                inner.release_behind.set(false);
                *inner.asked.borrow_mut() = Some(crate::lease::lease::Ending::Settle(
                    state,
                    result.clone(),
                    error.clone(),
                ));
                Ok((state, result, error))
            })()
        }) {
            Ok(asked) => asked,
            Err(e) => return Promise::reject(&e),
        };
        call(Call::Settle(self.inner.clone(), asked))
    }

    /// Gives the item back now (one attempt counted); `signal` aborts with
    /// `released` when the release is sent (not when it is answered), and
    /// from then `throwIfLost`, `fetch` and `prepareRequest` refuse, even if
    /// it fails (`status` is then `held` again: retry `release()` or
    /// `settle()`; heartbeats go on until one lands or the lease is lost).
    ///
    /// # Errors
    /// `ClaimLostError` when the lease is already lost (its `reason`) or
    /// settled (`reason` `"released"`, message "the lease was settled");
    /// `StateConflictError` when the item left `running` by another path (an
    /// operator paused or cancelled it): the lease is lost then (`status` `"claim_lost"`,
    /// `signal` aborted with a `ClaimLostError` `claim_lost`); `NetworkError`
    /// (the lease is kept, unless a heartbeat refused meanwhile lost it;
    /// retry). A second call after one that succeeded
    /// resolves. A release made while a settle of this lease is on the wire
    /// or went unanswered is sent (after that settle's answer, if one
    /// comes) but does not replace the settle, unless that answer says it
    /// did not land (any refusal but no answer or a 5xx: a 400, a 413, a
    /// 429, a proxy's page): when the release fails too, `work()`
    /// sends that settle again, not a release (the settle may have landed;
    /// a release could hand its work back), and `close()` sends it again
    /// first, releasing only if the lease is still held after it. Such a
    /// release does not abort `signal` when it is sent (the settle may have
    /// landed), but does once its own outcome is unknown (no answer, a 5xx):
    /// the server may have applied it.
    #[wasm_bindgen(unchecked_return_type = "Promise<void>")]
    pub fn release(&self) -> Promise {
        call(Call::Release(self.inner.clone()))
    }

    /// `fetch(input, init)` (`input`: a URL string, a `URL` or a `Request`)
    /// aborted when the lease is lost (and by
    /// `init.signal`), with `X-Lease-Token` and `X-Lease-Epoch` headers when the
    /// target's origin is the lease server's or listed in `leaseHeaderOrigins`
    /// (other origins get the request without them: the token alone can
    /// release the lease). Rejects at once with the `ClaimLostError` when the
    /// lease is already lost, including past its local deadline, or a release
    /// of it was sent. Listed
    /// cross-origin targets must allow these headers in CORS. A request
    /// sent with these headers does not follow redirects (see
    /// [`Lease::prepare_request`]): a redirect answer rejects with a
    /// NetworkError (with `init.redirect` `"error"` too, then with the
    /// browser's own message), unless `init.redirect` is `"manual"` (the
    /// opaque-redirect `Response` is returned).
    #[wasm_bindgen(unchecked_return_type = "Promise<Response>")]
    pub fn fetch(
        &self,
        #[wasm_bindgen(unchecked_param_type = "string | URL | Request")] input: JsValue,
        #[wasm_bindgen(unchecked_optional_param_type = "RequestInit | null")] init: JsValue,
    ) -> Promise {
        // Everything that may run the caller's code (`init`'s getters, the
        // getters of what they throw, a page's own `fetch` wrapper) runs
        // as one level of nesting.
        let (sent, signal, manual) =
            match crate::options::nested(|| self.send(input, init)).and_then(|r| r) {
                Ok(s) => s,
                Err(e) => return Promise::reject(&e),
            };
        // An abort answers with the signal's reason: the lease's own
        // ClaimLostError as it is, the caller's reason (whatever it is) as
        // the `cause` of an AbortError. Anything else is fetch's own
        // rejection ("Failed to fetch", a TypeError): a NetworkError.
        let lease_signal = self.inner.signal();
        crate::options::run(async move {
            // `adopt`: the page's `fetch` may be a wrapper that returns
            // anything; nothing of it runs here.
            let answer = wasm_bindgen_futures::JsFuture::from(crate::value::adopt(&sent))
                .await
                .map_err(|e| {
                    let Some(reason) = crate::options::abort_reason(&signal) else {
                        return coded(e, LeaseError::Network);
                    };
                    let ours = crate::options::abort_reason(&lease_signal);
                    if ours.is_some_and(|r| Object::is(&reason, &r)) {
                        reason
                    } else {
                        LeaseError::Aborted(reason).to_js()
                    }
                })?;
            // Our "manual" in place of the caller's "follow" (see `stamp`):
            // the redirect is refused, not handed over as an opaque answer
            // the caller never asked for.
            // (Read as strings: web-sys's enums carry every variant's
            // name into the glue.)
            if manual && crate::error::get_str(&answer, "type").as_deref() == Some("opaqueredirect")
            {
                return Err(LeaseError::Network(
                    "a redirect, which lease.fetch does not follow with the lease headers (pass redirect: \"manual\" to get it)".into(),
                )
                .to_js());
            }
            Ok(answer)
        })
    }

    /// The `Request` that `fetch(input, init)` sends: lease headers stamped and
    /// a signal that follows both the lease and `init.signal`. A request that
    /// carries the lease headers and would follow redirects (`redirect:
    /// "follow"`, the default) gets `redirect: "manual"`: browsers keep
    /// custom headers across a redirect to another origin (the Fetch standard
    /// strips only `Authorization`), and the token alone can release the
    /// lease. The lease is checked now, not when the `Request` is sent: one
    /// sent later carries the token whatever became of the lease (its signal
    /// aborts only when the heartbeat loop's timer runs); `fetch` checks it
    /// in the call that sends.
    ///
    /// # Errors
    /// The `ClaimLostError` when the lease is lost or a release of it was
    /// sent; a ValidationError (the
    /// `Request` constructor's message) for input it refuses, e.g. a bad URL
    /// or a body on a GET.
    #[wasm_bindgen(js_name = prepareRequest)]
    pub fn prepare_request(
        &self,
        #[wasm_bindgen(unchecked_param_type = "string | URL | Request")] input: JsValue,
        #[wasm_bindgen(unchecked_optional_param_type = "RequestInit | null")] init: JsValue,
    ) -> Result<Request, JsValue> {
        // The Request constructor reads `init`'s getters.
        crate::options::nested(|| self.prepare(input, init))
            .and_then(|r| r)
            .map(|(r, _)| r)
    }

    /// [`Lease::fetch`]'s synchronous part: the request sent, its signal,
    /// and whether [`Lease::prepare`] turned "follow" into "manual".
    fn send(&self, input: JsValue, init: JsValue) -> Result<(JsValue, AbortSignal, bool), JsValue> {
        let (request, manual) = self.prepare(input, init)?;
        let fetch = crate::value::get(&js_sys::global(), &"fetch".into())
            .ok()
            .and_then(|f| f.dyn_into::<Function>().ok())
            .ok_or_else(|| LeaseError::Network("fetch is not available".into()).to_js())?;
        let sent = crate::value::call1(&fetch, &JsValue::UNDEFINED, &request)
            .map_err(|e| coded(e, LeaseError::Network))?;
        Ok((sent, request.signal(), manual))
    }

    /// [`Lease::prepare_request`], and whether it turned the caller's
    /// `redirect: "follow"` into `"manual"`.
    fn prepare(&self, input: JsValue, init: JsValue) -> Result<(Request, bool), JsValue> {
        if let Some(e) = self.inner.fenced_error() {
            return Err(e.to_js());
        }
        self.stamp(input, init)
            .map_err(|e| coded(e, LeaseError::Validation))
    }

    /// [`Lease::prepare`] once the lease is known to be held.
    fn stamp(&self, input: JsValue, init: JsValue) -> Result<(Request, bool), JsValue> {
        // A URL object stands for its `href`, as for the platform's `fetch`.
        let href = url_href(&input);
        let input = if href.is_string() { href } else { input };
        // A URL is copied into wasm memory only up to 64 Ki units (a longer
        // one is refused below as not a string).
        let url = crate::value::short_string(&input, crate::value::MAX_ARG_UNITS);
        // `init` only when it is an object (`undefined` is an absent init).
        let init = if init.is_object() {
            init
        } else {
            JsValue::UNDEFINED
        };
        let base = match url {
            Some(url) => new_request(&url.into(), &init)?,
            None => {
                let req: Request = input.dyn_into().map_err(|_| {
                    LeaseError::Validation(
                        "input must be a URL string (at most 65,536 UTF-16 code units), a URL or a Request"
                            .into(),
                    )
                    .to_js()
                })?;
                // A new Request either way: an object that only claims
                // Request's prototype is refused here (a TypeError), not
                // read through getters that throw past the module.
                new_request(&req, &init)?
            }
        };
        let signal = follow_both(&self.inner.signal(), &base.signal())?;
        // Fields defined, not assigned (see src/lease/http.rs `send`).
        let next = Object::new();
        let mut manual = false;
        // The token alone can release the lease: it goes only to the lease
        // server's origin and the origins listed in `leaseHeaderOrigins`,
        // and never along a redirect (whose target may be anywhere).
        // The URL is read up to 64 Ki units: a longer one is refused rather
        // than copied into wasm memory.
        let url = crate::value::short_string(
            &crate::value::get(&base, &"url".into())?,
            crate::value::MAX_ARG_UNITS,
        )
        .ok_or_else(|| {
            LeaseError::Validation("the request URL is longer than 65,536 UTF-16 code units".into())
                .to_js()
        })?;
        if self.inner.may_send_headers_to(&url) {
            if crate::error::get_str(&base, "redirect").as_deref() == Some("follow") {
                crate::error::set(&next, "redirect", &"manual".into());
                manual = true;
            }
            let headers = Headers::new_with_headers(&base.headers())?;
            headers.set("X-Lease-Token", self.inner.token())?;
            let epoch = js_sys::Number::from(self.inner.epoch as f64).to_string_with_radix(10)?;
            headers.set("X-Lease-Epoch", &String::from(epoch))?;
            crate::error::set(&next, "headers", &headers);
        }
        crate::error::set(&next, "signal", &signal);
        Ok((new_request(&base, &next)?, manual))
    }

    /// TEST HOOK: suspends (true) or resumes (false) this lease's automatic
    /// heartbeats, to simulate a stalled worker.
    #[wasm_bindgen(js_name = setHeartbeatsPaused)]
    pub fn set_heartbeats_paused(
        &self,
        #[wasm_bindgen(unchecked_param_type = "boolean")] paused: JsValue,
    ) -> Result<(), JsValue> {
        let paused = paused
            .as_bool()
            .ok_or_else(|| LeaseError::Validation("paused must be a boolean".into()).to_js())?;
        self.inner.set_heartbeats_paused(paused);
        Ok(())
    }
}

/// `new Request(input, init)`: one binding for a URL or a Request, with or
/// without an init (`undefined` is an absent one: WebIDL's `optional
/// RequestInit init = {}`), instead of web-sys's four constructors.
///
/// # Errors
/// What the constructor throws (a TypeError).
fn new_request(input: &JsValue, init: &JsValue) -> Result<Request, JsValue> {
    crate::value::new_request(input, init).map(JsCast::unchecked_into)
}

#[wasm_bindgen(module = "/js/lease.js")]
extern "C" {
    /// The `href` of a `URL` object, read through `URL.prototype`'s getter
    /// (never the object's own `href` or `toString`), else `undefined`
    /// (js/lease.js `urlHref`).
    #[wasm_bindgen(js_name = urlHref)]
    fn url_href(v: &JsValue) -> JsValue;
    /// A signal aborted when either input aborts: one that already has,
    /// else `AbortSignal.any`, else a controller following both
    /// (js/lease.js `followBoth`; signals' getters are read in `try`, so a
    /// page that redefines `aborted` or `reason` or replaces
    /// `AbortSignal.any` gets an error here, never an unwind through the
    /// module).
    #[wasm_bindgen(js_name = followBoth, catch)]
    fn follow_both(a: &AbortSignal, b: &AbortSignal) -> Result<AbortSignal, JsValue>;
}

/// A running `work()` loop. Exported to JS as `LeaseWorker` so it never
/// shadows the DOM's `Worker`.
#[wasm_bindgen(js_name = LeaseWorker)]
pub struct Worker {
    inner: Rc<WorkerInner>,
}

#[wasm_bindgen(js_class = LeaseWorker)]
impl Worker {
    /// Stops claiming; resolves when running handlers have finished and
    /// settled. `free()` and `[Symbol.dispose]()` start it too (`using
    /// worker = client.work(…)` stops the worker at the end of the block;
    /// `await using` waits for it). A second call, or one after `free()`,
    /// resolves too.
    #[wasm_bindgen(unchecked_return_type = "Promise<void>")]
    pub fn stop(&self) -> Promise {
        call(Call::Stop(self.inner.clone()))
    }

    /// Counters: `{claimed, done, failed, lost, released, connectionFailures, backoffsMs, pollDelaysMs}`.
    #[wasm_bindgen(getter, unchecked_return_type = "WorkStats")]
    pub fn stats(&self) -> JsValue {
        let s = *self.inner.stats.borrow();
        let o = Object::new();
        set(&o, "claimed", &s.claimed.into());
        set(&o, "done", &s.done.into());
        set(&o, "failed", &s.failed.into());
        set(&o, "lost", &s.lost.into());
        set(&o, "released", &s.released.into());
        set(&o, "connectionFailures", &s.connection_failures.into());
        let ms = |v: &std::cell::RefCell<Vec<f64>>| -> Array {
            let a = Array::new();
            for &d in v.borrow().iter() {
                a.push(&JsValue::from(d));
            }
            a
        };
        set(&o, "backoffsMs", &ms(&self.inner.backoffs));
        set(&o, "pollDelaysMs", &ms(&self.inner.polls));
        o.into()
    }

    /// True once `stop()` was called, or an error retrying cannot fix
    /// stopped the worker (see `finished`).
    #[wasm_bindgen(getter)]
    pub fn stopping(&self) -> bool {
        self.inner.is_stopping()
    }

    /// Settles once the worker has stopped (every slot idle: after `stop()`,
    /// `client.close()`, or an error): resolves after `stop()` or
    /// `close()`, and rejects with the error when a claim was refused for a
    /// reason retrying cannot fix, which stops the worker as `stop()` does
    /// (running handlers finish and settle; nothing more is claimed):
    /// `UnauthorizedError` (credentials refused after a refresh, revoked, or
    /// a spent enrollment token), `ForbiddenError` (a queue out of the
    /// worker's scope) or `ValidationError`. Such errors are not retried and
    /// not counted in `connectionFailures`. The same Promise on every read;
    /// not reading it reports no unhandled rejection (the error is also
    /// logged with `console.warn`).
    #[wasm_bindgen(getter, unchecked_return_type = "Promise<void>")]
    pub fn finished(&self) -> Option<Promise> {
        self.inner.finished.borrow().clone()
    }
}

/// `e` when it is already one of this SDK's errors (it has a string `code`),
/// else `make(e.message)` with `e` as its `cause`: a platform `TypeError`
/// from `new Request` or `fetch` gets a `name`, `code` and `status` like
/// every other rejection. An abort by the caller's own signal (an
/// `AbortError` or `TimeoutError` DOMException) becomes the AbortError whose
/// `cause` it is.
fn coded(e: JsValue, make: fn(String) -> LeaseError) -> JsValue {
    // One of this SDK's errors: a real Error whose `code` is one of ours and
    // whose `name` is that code's (a plain `{code: "ECONNRESET"}`, or the
    // page's own Error that happens to carry `code: "network"`, is not).
    let ours = e.is_instance_of::<js_sys::Error>()
        && crate::error::get_str(&e, "code")
            .and_then(|c| agentstore_protocol::ErrorCode::parse(&c))
            .is_some_and(|c| crate::error::get_str(&e, "name").as_deref() == Some(c.js_name()));
    if ours {
        return e;
    }
    // Through `get_str`: a thrown message of any length is read only up to
    // its first 64 Ki units.
    let name = crate::error::get_str(&e, "name");
    if matches!(name.as_deref(), Some("AbortError" | "TimeoutError")) {
        return LeaseError::Aborted(e).to_js();
    }
    let message = crate::error::get_str(&e, "message")
        .unwrap_or_else(|| "the request could not be made".into());
    let out = make(message).to_js();
    crate::error::set(&out, "cause", &e);
    out
}
