//! HTTP and clock glue shared by the lease client: `fetch` from the global scope
//! (a window or a worker), answers read with `response.json()` and decoded
//! field by field and request bodies built the same way ([`super::wire`]; no
//! JSON text on the Rust side), answers mapped to
//! [`LeaseError`], `performance.now()` and timers.

use agentstore_protocol::lease::SettleState;
use agentstore_protocol::ErrorCode;
use futures::future::{select, Either};
use js_sys::{Function, Promise};
use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_futures::JsFuture;
use web_sys::{AbortController, AbortSignal, Headers};

use super::error::{LeaseError, Result};
use super::wire::{FromWire, ToWire};
use crate::error::set;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};

/// How far (ms) the wall clock may run ahead of `performance.now()` between
/// two consecutive readings before it counts as a jump (above the two
/// clocks' jitter; a smaller step is not counted).
const JUMP_SKEW_MS: f64 = 1_000.0;

/// [`now_ms`]'s state, as `f64` bits: the readings of both clocks at the
/// last reference point and the last value returned (the module is
/// single-threaded; atomics only make plain statics of them,
/// `thread_local!` would add its lazy-init machinery).
/// The fourth is the time the lease clock stepped back, added to it (see
/// [`now_ms`]).
static CLOCK: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];
/// Whether [`CLOCK`] holds a reference point yet.
static CLOCK_SET: AtomicBool = AtomicBool::new(false);
/// How many jumps [`now_ms`] has seen (see [`jumps`]).
static JUMPS: AtomicU32 = AtomicU32::new(0);

#[cfg(feature = "test-hooks")]
thread_local! {
    static SHIFT: std::cell::Cell<(f64, f64)> = const { std::cell::Cell::new((0.0, 0.0)) };
}

/// Test hook: `Date.now()` as [`now_ms`] reads it is shifted by `ms` (a
/// wall clock set forward, or a machine waking from a suspend of `ms`: the
/// wall clock is then ahead of `performance.now()` by that much).
#[cfg(feature = "test-hooks")]
pub fn shift_wall_clock(ms: f64) {
    SHIFT.with(|s| s.set((ms, s.get().1)));
}

/// Test hook: `performance.now()` as [`now_ms`] reads it is shifted by `ms`
/// (a negative shift of the time since some instant stands for a clock that
/// stopped then: a suspend the page could not see).
#[cfg(feature = "test-hooks")]
pub fn shift_monotonic_clock(ms: f64) {
    SHIFT.with(|s| s.set((s.get().0, ms)));
}

/// The two clocks' readings (ms): `Date.now()` and `performance.now()`
/// (`Date.now()` where there is no `performance`).
fn clocks() -> (f64, f64) {
    let perf = crate::value::get(&js_sys::global(), &"performance".into())
        .ok()
        .and_then(|p| p.dyn_into::<web_sys::Performance>().ok())
        .map(|p| p.now());
    let wall = js_sys::Date::now();
    let perf = perf.unwrap_or(wall);
    #[cfg(feature = "test-hooks")]
    let (wall, perf) = {
        let (w, p) = SHIFT.with(std::cell::Cell::get);
        (wall + w, perf + p)
    };
    (wall, perf)
}

/// Milliseconds on the monotonic clock (`performance.now()`), used ONLY for
/// durations: never compared with a wall clock or the server's clock (case
/// C-T1). Never decreases.
///
/// Each reading also compares both clocks' advance since the previous one:
/// when `Date.now()` ran ahead by more than [`JUMP_SKEW_MS`], [`jumps`]
/// counts one more jump. `performance.now()` stops while the operating
/// system sleeps on macOS, Linux, ChromeOS and Android (w3c/hr-time issue
/// 115; MDN, "Ticking during sleep"), so a jump is either a suspend, after
/// which the server may have reaped a lease this clock still reads as held,
/// or a wall clock set forward, which changes nothing. Each lease asks the
/// server which at once ([`agentstore_protocol::lease_client::HeartbeatPlan::observe`]).
/// A wall clock set back counts nothing, unless `Date.now()` stands in for
/// `performance.now()` (no `Performance` here): a step back of the lease
/// clock over 1 s counts as a jump, and the clock goes on from where it was.
#[inline(never)]
pub fn now_ms() -> f64 {
    let (wall, perf) = clocks();
    let get = |i: usize| f64::from_bits(CLOCK[i].load(Relaxed));
    let set = |i: usize, v: f64| CLOCK[i].store(v.to_bits(), Relaxed);
    if !CLOCK_SET.swap(true, Relaxed) {
        set(0, perf);
        set(1, wall);
        set(2, perf);
    }
    // Against the previous reading (the reference moves every time): the
    // clocks' slow drift (NTP slews the wall clock, not the monotonic one)
    // never adds up to a false jump.
    let step = perf - get(0);
    // A lease clock that stepped back: no `performance` here (or one that
    // is not a `Performance`, such as a page's wrapper), so the wall clock
    // stands in for it and was set back. How much time passed meanwhile
    // is unknown: it counts as a jump (the server is asked at once), and
    // the clock goes on from where it was instead of standing still until
    // the wall clock caught up (which held a lease past its deadline for
    // as long as the clock was set back).
    // A step forward is time that passed, whatever it was: in this
    // fallback a wall clock set right again looks the same as a gap between
    // readings, so the correction counts (held leases may then be lost
    // locally: never held past their deadline). Giving it back instead
    // stopped the lease clock for as long as the clock had been set back,
    // whenever readings were over 1 s apart (review of a3ba827).
    if (wall - get(1)) - step > JUMP_SKEW_MS || step < -JUMP_SKEW_MS {
        JUMPS.fetch_add(1, Relaxed);
    }
    if step < 0.0 {
        set(3, get(3) - step);
    }
    set(0, perf);
    set(1, wall);
    let now = get(2).max(perf + get(3));
    set(2, now);
    now
}

/// How many times [`now_ms`] has seen the wall clock jump ahead of the
/// monotonic clock (read it after `now_ms()`; it only grows).
pub fn jumps() -> u32 {
    JUMPS.load(Relaxed)
}

/// `Math.random()` in `[0, 1)`.
pub fn random() -> f64 {
    js_sys::Math::random()
}

#[wasm_bindgen::prelude::wasm_bindgen(module = "/js/lease.js")]
extern "C" {
    /// Aborts `controller` with `signal`'s reason when it aborts; returns
    /// the function that stops following (js/lease.js `followSignal`).
    #[wasm_bindgen(js_name = followSignal)]
    fn follow_signal(signal: &AbortSignal, controller: &AbortController) -> Function;
}

#[wasm_bindgen::prelude::wasm_bindgen(module = "/js/lease.js")]
extern "C" {
    /// `headers.get(name)` when it is a string of at most 256 units, else
    /// `None`; throws nothing (js/lease.js `header`).
    fn header(headers: &JsValue, name: &str) -> Option<String>;
    /// Sets a request's `Request-Attempt` (a number raised with every
    /// such request sent; see the server's `Store::claim_attempt` and
    /// `Store::refresh_attempt`) and, unless `key` is empty, its
    /// `Idempotency-Key`; throws nothing (js/lease.js `numberRequest`).
    #[wasm_bindgen(js_name = numberRequest)]
    fn number_request(headers: &Headers, key: &str);
}

#[wasm_bindgen::prelude::wasm_bindgen(module = "/js/lease.js")]
extern "C" {
    /// `[promise, end]`: resolved after `ms`, or at once by `end()`
    /// (js/lease.js `timer`).
    #[wasm_bindgen(js_name = timer)]
    fn timer_js(ms: f64) -> js_sys::Array;
}

/// Ends a [`timer`]'s wait when dropped (its future lost a `select`, or a
/// race ended it early): the timer is cleared and its Promise resolved, so
/// neither a pending timer nor the `JsFuture`'s callbacks outlive the wait
/// (a Promise that never settles would keep them in wasm memory for good).
pub(crate) struct EndTimer(Function);

impl Drop for EndTimer {
    fn drop(&mut self) {
        let _ = crate::value::call0(&self.0, &JsValue::UNDEFINED);
    }
}

/// A Promise resolved after `ms` (NaN: 0; clamped to `[0, 2^31)`, so
/// `Infinity` is the longest timer, never the 0 ms `setTimeout` would make
/// of it), and the guard that clears it when dropped.
pub(crate) fn timer(ms: f64) -> (Promise, EndTimer) {
    let ms = if ms.is_nan() { 0.0 } else { ms };
    let pair = timer_js(ms.clamp(0.0, 2_147_483_000.0).ceil());
    (
        Promise::from(pair.get(0)),
        EndTimer(pair.get(1).unchecked_into()),
    )
}

/// Sleeps `ms` on a JS [`timer`] (gloo-timers' `TimeoutFuture` cost
/// ~1.5 kB of wasm with the oneshot channel it uses).
pub async fn sleep_ms(ms: f64) {
    let (wait, _end) = timer(ms);
    let _ = JsFuture::from(wait).await;
}

/// A successful answer: status and body.
#[derive(Debug, Clone)]
pub struct Answer {
    /// HTTP status (2xx).
    pub status: u16,
    /// The body from `response.json()` (`null` for 204 or an empty body).
    pub body: JsValue,
    /// `Retry-After` in ms, when present, at most 1 hour
    /// (`agentstore_protocol::backoff::retry_after_ms`).
    pub retry_after_ms: Option<f64>,
    /// `Idempotent-Replayed: true`: the server answered a settle or release
    /// this lease token had already made (its first answer lost) and changed
    /// nothing.
    pub replayed: bool,
}

/// One request to the lease server.
pub struct Call<'a> {
    /// `GET` or `POST`.
    pub method: &'a str,
    /// Absolute URL.
    pub url: &'a str,
    /// `Authorization: Bearer …`, when set.
    pub bearer: Option<&'a str>,
    /// JSON body (a JS value, stringified here), when set.
    pub body: Option<&'a JsValue>,
    /// Give up after this long (ms); the request is aborted.
    pub timeout_ms: f64,
    /// The caller's signal: aborting it aborts the request with its reason.
    pub signal: Option<&'a AbortSignal>,
    /// `Idempotency-Key`, when set (a claim's; see `ClientInner::claim`).
    pub key: Option<&'a str>,
    /// Send a `Request-Attempt` (claims, enrollments and refreshes: requests
    /// that are sent again when their answer is lost).
    pub numbered: bool,
}

/// `value` as a JS value (a request body or a journal entry; see
/// [`super::wire::ToWire`]).
pub(crate) fn to_js<T: ToWire>(value: &T) -> JsValue {
    value.to_wire()
}

/// A wire type from a `response.json()` value, read field by field
/// ([`super::wire`]: each string bounded before it is copied).
///
/// # Errors
/// `Server` (`internal`) when the answer does not have the expected shape
/// or a field exceeds its bound.
pub(crate) fn parse<T: FromWire>(value: &JsValue) -> Result<T> {
    T::from_wire(value).ok_or_else(|| LeaseError::Server {
        code: ErrorCode::Internal,
        status: 200,
        message: "the lease server's answer does not have the expected shape".into(),
        retry_after_ms: None,
    })
}

fn global_fetch() -> Result<Function> {
    crate::value::get(&js_sys::global(), &"fetch".into())
        .ok()
        .and_then(|f| f.dyn_into::<Function>().ok())
        .ok_or_else(|| LeaseError::Network("fetch is not available in this context".into()))
}

/// Sends `call`; 2xx → [`Answer`], anything else → the matching [`LeaseError`]
/// (from the `{code, message}` body when there is one).
///
/// # Errors
/// `Network` when there is no answer (refused, DNS, CORS, timeout); `Aborted`
/// when the caller's signal fired; the server's code otherwise.
pub async fn send(call: Call<'_>) -> Result<Answer> {
    if let Some(s) = call.signal {
        if let Some(reason) = crate::options::abort_reason(s) {
            return Err(LeaseError::Aborted(reason));
        }
    }
    let controller = AbortController::new().map_err(|e| LeaseError::Network(describe(&e)))?;
    // Follow the caller's signal for the duration of the request.
    let stop = call.signal.map(|s| follow_signal(s, &controller));
    let result = send_inner(&call, &controller).await;
    if let Some(stop) = stop {
        let _ = crate::value::call0(&stop, &JsValue::NULL);
    }
    result
}

async fn send_inner(call: &Call<'_>, controller: &AbortController) -> Result<Answer> {
    let headers = Headers::new().map_err(|e| LeaseError::Network(describe(&e)))?;
    if let Some(t) = call.bearer {
        let mut v = String::with_capacity(7 + t.len());
        v.push_str("Bearer ");
        v.push_str(t);
        let _ = headers.set("Authorization", &v);
    }
    if call.numbered {
        number_request(&headers, call.key.unwrap_or_default());
    }
    // Fields defined, not assigned (`crate::error::set`): web-sys's
    // `RequestInit` setters assign, and an accessor without a setter of
    // that name on `Object.prototype` (a page's polyfill or pollution) made
    // them throw past the module: the call never settled.
    let init = js_sys::Object::new();
    set(&init, "method", &call.method.into());
    if let Some(b) = call.body {
        let _ = headers.set("Content-Type", "application/json");
        let text = js_sys::JSON::stringify(b)
            .map_err(|_| LeaseError::Validation("the request body is not JSON".into()))?;
        set(&init, "body", &text);
    }
    set(&init, "headers", &headers);
    set(&init, "signal", &controller.signal());
    let promise: Promise = crate::value::call2(
        &global_fetch()?,
        &JsValue::UNDEFINED,
        &JsValue::from_str(call.url),
        &init,
    )
    .map_err(|e| LeaseError::Network(describe(&e)))?
    .unchecked_into();
    // The answer is read through Reflect and `adopt` (which catch): the
    // page's `fetch` may be its own wrapper (a test mock) answering with
    // anything, which must not throw past the module.
    let fetch = async {
        let resp = JsFuture::from(crate::value::adopt(&promise)).await?;
        let status = crate::value::get(&resp, &"status".into())?
            .as_f64()
            .filter(|s| (0.0..1000.0).contains(s))
            .ok_or_else(|| JsValue::from_str("fetch answered without a Response"))?
            as u16;
        // An empty body (204) is `null`; a body that is not JSON too.
        let body = if status == 204 {
            JsValue::NULL
        } else {
            let json: Function = crate::value::get(&resp, &"json".into())?.dyn_into()?;
            JsFuture::from(crate::value::adopt(&crate::value::call0(&json, &resp)?))
                .await
                .unwrap_or(JsValue::NULL)
        };
        let headers = crate::value::get(&resp, &"headers".into())?;
        Ok::<_, JsValue>((status, headers, body))
    };
    let timeout = sleep_ms(call.timeout_ms);
    let (status, headers, body) = match select(Box::pin(fetch), Box::pin(timeout)).await {
        Either::Left((Ok(r), _)) => r,
        Either::Left((Err(e), _)) => {
            return Err(match call.signal {
                Some(s) => crate::options::abort_reason(s)
                    .map_or_else(|| LeaseError::Network(describe(&e)), LeaseError::Aborted),
                None => LeaseError::Network(describe(&e)),
            })
        }
        Either::Right(_) => {
            controller.abort();
            return Err(LeaseError::Network(
                "no answer within the request timeout".into(),
            ));
        }
    };
    // `Number()` skips surrounding white space itself (and fetch has already
    // stripped HTTP white space from the value).
    let retry_after_ms = header(&headers, "Retry-After").and_then(|v| {
        agentstore_protocol::backoff::retry_after_ms(
            js_sys::Number::from(JsValue::from_str(&v)).value_of(),
        )
    });
    if (200..300).contains(&status) {
        let replayed = header(&headers, "Idempotent-Replayed").is_some_and(|v| v == "true");
        return Ok(Answer {
            status,
            body,
            retry_after_ms,
            replayed,
        });
    }
    Err(error_from(status, &body, retry_after_ms))
}

/// The message of an error whose answer had no `{code, message}` body: not
/// the lease server's (it answers every `/v1` error with one), but a
/// proxy's, a CDN's or a gateway's page. Such an answer is a `network`
/// error carrying its HTTP status (a 429 stays a rate limit), never the
/// code the status alone would suggest (a 409 is no `claim_lost`, a 404 no
/// `not_found`, a 400 no `validation`): it says nothing about the lease.
pub(crate) const NO_ERROR_BODY: &str = "the lease server answered without an error body";

/// Maps a non-2xx answer to an error.
pub fn error_from(status: u16, body: &JsValue, retry_after_ms: Option<f64>) -> LeaseError {
    // `{code, message}` read field by field, each bounded before it is
    // copied into wasm memory (a page's `fetch` wrapper may answer with
    // anything): the code is one of ErrorCode's strings, the message is
    // kept up to its first 8 KiB.
    let field = |k: &str| crate::value::get(body, &k.into()).unwrap_or(JsValue::UNDEFINED);
    let code = crate::value::short_string(&field("code"), 32)
        .and_then(|c| ErrorCode::ALL.into_iter().find(|k| k.as_str() == c));
    let message = crate::value::text_prefix(&field("message"), 8192);
    let (code, message) = match code.zip(message) {
        // The lease's own settle landed before: `settled` names its state
        // (the item id is the lease's; see `LeaseInner::on_rejection`).
        Some((ErrorCode::AlreadySettled, message)) => {
            if let Some(state) = crate::value::short_string(&field("settled"), 16)
                .as_deref()
                .and_then(SettleState::parse)
            {
                return LeaseError::AlreadySettled {
                    item_id: 0,
                    state,
                    message,
                };
            }
            (ErrorCode::AlreadySettled, message)
        }
        Some(b) => b,
        // Not the lease server's answer: the call did not reach it (as far
        // as this answer tells). Its status is kept, but no code is read
        // into it: taking a proxy's 409 page for a conflict, or its 400 for
        // a validation error, read it as the server's verdict.
        None if status == ErrorCode::RateLimited.status() => {
            (ErrorCode::RateLimited, String::from(NO_ERROR_BODY))
        }
        None => (ErrorCode::Network, String::from(NO_ERROR_BODY)),
    };
    from_code(code, status, message, retry_after_ms)
}

/// The error for a protocol `code` (a whole answer's, or one batch entry's).
pub fn from_code(
    code: ErrorCode,
    status: u16,
    message: String,
    retry_after_ms: Option<f64>,
) -> LeaseError {
    match code {
        ErrorCode::StateConflict => LeaseError::StateConflict(message),
        ErrorCode::Unauthorized => LeaseError::Unauthorized(message),
        ErrorCode::RateLimited => LeaseError::RateLimited {
            retry_after_ms: retry_after_ms.unwrap_or(1000.0),
        },
        ErrorCode::Validation => LeaseError::Validation(message),
        code => LeaseError::Server {
            code,
            status,
            message,
            retry_after_ms,
        },
    }
}

/// The `message` of a thrown JS value (or the value itself when it is a
/// string), at most its first 8 KiB.
pub fn describe(e: &JsValue) -> String {
    // Cut in JS first: only the kept part is copied into wasm memory.
    // `Reflect.get` only on an object: on a primitive it throws, and a throw
    // through an import that returns a value keeps a table slot
    // (crate::value::call1).
    let mut m = (e.is_object() || e.is_function())
        .then(|| crate::value::get(e, &"message".into()).ok())
        .flatten()
        // One unit more than is kept, so a longer message is seen as cut.
        .and_then(|v| crate::value::text_prefix(&v, 8193))
        .or_else(|| crate::value::text_prefix(e, 8193))
        .unwrap_or_else(|| String::from("unknown error"));
    // A failure report must fit the server's request body limit (64 KiB by
    // default): keep the first 8 KiB, cut at a character boundary.
    if m.len() > 8192 {
        let mut end = 8192;
        while !m.is_char_boundary(end) {
            end -= 1;
        }
        m.truncate(end);
        m.push('…');
    }
    m
}
