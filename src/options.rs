//! Reading JS option objects, shared by every exported class. Readers fail
//! with a message; `?` turns it into the caller's validation error (both
//! `StoreError` and `LeaseError` implement `From<String>`).

use js_sys::{Function, Promise};
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_futures::future_to_promise;
use web_sys::AbortSignal;

/// Runs `f` as a Promise; its error becomes the JS `Error` it converts to.
///
/// `f` is boxed so that one copy of `future_to_promise`'s machinery serves
/// every exported method (generic, it was inlined into each: ~0.5 kB of
/// wasm per method).
pub(crate) fn run<F, E>(f: F) -> Promise
where
    F: std::future::Future<Output = Result<JsValue, E>> + 'static,
    E: Into<JsValue>,
{
    promise(Box::pin(async move { f.await.map_err(Into::into) }))
}

/// `future_to_promise(f)`, with `f` boxed: every such Promise shares one
/// instance of wasm-bindgen-futures' task machinery (spawn, queue, the
/// Promise's executor: about 550 bytes of wasm per future type) instead of
/// one per `async` block. Unlike [`run`], nothing is polled during the call.
#[cfg(feature = "lease")]
pub(crate) fn spawn_promise(
    f: impl std::future::Future<Output = Result<JsValue, JsValue>> + 'static,
) -> Promise {
    let f: std::pin::Pin<Box<dyn std::future::Future<Output = Result<JsValue, JsValue>>>> =
        Box::pin(f);
    future_to_promise(f)
}

/// `spawn_local(f)`, with `f` boxed: one instance of the task machinery
/// for every background task of the lease client (see [`spawn_promise`];
/// the store's two background tasks call `spawn_local` directly: for two,
/// the box costs more than it saves).
#[cfg(feature = "lease")]
pub(crate) fn spawn(f: impl std::future::Future<Output = ()> + 'static) {
    let f: std::pin::Pin<Box<dyn std::future::Future<Output = ()>>> = Box::pin(f);
    wasm_bindgen_futures::spawn_local(f);
}

/// How deeply calls into the module may nest while it reads its input.
///
/// A getter, Proxy trap or `toJSON` of the caller's input runs while the
/// module reads it, and may call the module again (`store.put(this)` from a
/// getter of the record being put). Each level holds frames on the
/// module's shadow stack, which has no overflow check: unbounded, the
/// recursion ran into the module's data ("memory access out of bounds")
/// and the module was dead. 16 levels is far past any sane nesting.
const MAX_NESTING: u32 = 16;

/// How many nested calls one outermost call may start in all. Depth alone
/// does not bound the work: a Proxy whose every trap calls the module again
/// fans out (k reads per level: k^16 calls).
const MAX_NESTED_CALLS: u32 = 1024;

/// Calls into the module now reading their input (see [`MAX_NESTING`]).
/// (Atomics only to be safe `static`s: the module has one thread.)
static NESTING: AtomicU32 = AtomicU32::new(0);
/// Nested calls started since the outermost one began.
static NESTED_CALLS: AtomicU32 = AtomicU32::new(0);

/// Runs `f` as one more level of nested calls into the module.
///
/// # Errors
/// ValidationError (a JS `Error`) without running `f` when
/// [`MAX_NESTING`] levels are already running, or the outermost call has
/// started [`MAX_NESTED_CALLS`] nested ones.
pub(crate) fn nested<T>(f: impl FnOnce() -> T) -> Result<T, JsValue> {
    let depth = enter()?;
    let out = f();
    NESTING.store(depth, Relaxed);
    Ok(out)
}

/// One more level of nesting: the depth before it, to store back when the
/// level ends (one out-of-line copy for every [`nested`]).
#[inline(never)]
fn enter() -> Result<u32, JsValue> {
    let depth = NESTING.load(Relaxed);
    let calls = if depth == 0 {
        0
    } else {
        NESTED_CALLS.load(Relaxed) + 1
    };
    if depth >= MAX_NESTING || calls > MAX_NESTED_CALLS {
        // Back to 0 in a microtask, when no frame of the module is on the
        // stack: a JS exception that unwound through the module's frames
        // (past a binding without `catch`) skipped a level's restore, and
        // must not leave the module refusing every call.
        let reset = wasm_bindgen::closure::Closure::once(|_: JsValue| NESTING.store(0, Relaxed));
        let _ = Promise::resolve(&JsValue::UNDEFINED).then(&reset);
        reset.forget(); // a `once` closure frees itself when called
        return Err(crate::error::StoreError::validation(
            "nested too deeply: a getter or toJSON of the input calls agentstore again",
        )
        .to_js());
    }
    NESTING.store(depth + 1, Relaxed);
    NESTED_CALLS.store(calls, Relaxed);
    Ok(depth)
}

/// The one instance of `future_to_promise`.
///
/// The future is polled once here, synchronously, before the Promise is
/// returned: everything a method does before its first `.await` (reading
/// and checking its arguments, walking a record, issuing its IndexedDB
/// requests) happens during the call, as IndexedDB's own `put` clones its
/// value during the call. `future_to_promise` alone polls first in a
/// microtask, so a caller that changed a record (or emptied an array) right
/// after `put(r)` / `putMany(a)` returned had the change stored. Every leaf
/// future keeps only the waker of its latest poll (the `Future` contract), so
/// the later polls under `future_to_promise` wake it as usual.
fn promise(
    mut f: std::pin::Pin<Box<dyn std::future::Future<Output = Result<JsValue, JsValue>>>>,
) -> Promise {
    use std::task::{Context, Poll, Waker};
    // The first poll reads the caller's input: one level of nesting.
    match nested(|| f.as_mut().poll(&mut Context::from_waker(Waker::noop()))) {
        Err(e) | Ok(Poll::Ready(Err(e))) => Promise::reject(&e),
        Ok(Poll::Ready(Ok(v))) => Promise::resolve(&v),
        Ok(Poll::Pending) => future_to_promise(f),
    }
}

/// Runs a method whose work after its checks is requests issued during the
/// call and answered by a Promise made in JS (the reads: `get`, `getMany`,
/// `count`, `list`): `f` runs as one level of [`nested`] calls (it reads the
/// caller's input), and its error becomes a rejected Promise, as [`run`]'s
/// do; `f` gets the function that types the reads' failures
/// ([`crate::error::dom_error_fn`]). No executor and no future: the answer
/// costs no call back into the module.
pub(crate) fn issue(
    f: impl FnOnce(&JsValue) -> Result<Promise, crate::error::StoreError>,
) -> Promise {
    let to_error = crate::error::dom_error_fn();
    match nested(|| f(&to_error)) {
        Ok(Ok(p)) => p,
        Ok(Err(e)) => Promise::reject(&e.to_js()),
        Err(e) => Promise::reject(&e),
    }
}

/// `options[key]`, or `undefined` when `options` is not an object.
///
/// # Errors
/// A message naming `key` when reading it throws (a getter or a Proxy
/// trap): never read as "not given", which would silently drop, say, a
/// `signal`.
pub(crate) fn opt(options: &JsValue, key: &str) -> Result<JsValue, String> {
    if options.is_object() {
        crate::value::get(options, &key.into())
            .map_err(|_| agentstore_protocol::cat(&[key, " could not be read (its getter threw)"]))
    } else {
        Ok(JsValue::UNDEFINED)
    }
}

/// [`opt`] for the store's readers: one out-of-line copy of the error
/// conversion (a ValidationError) instead of one per call site.
///
/// # Errors
/// ValidationError when reading `key` throws.
#[inline(never)]
pub(crate) fn read(options: &JsValue, key: &str) -> Result<JsValue, crate::error::StoreError> {
    opt(options, key).map_err(crate::error::StoreError::validation)
}

/// An options argument is `undefined`, `null` or an object: anything else
/// (a string, a number, a function) is refused instead of read as "no
/// options" (`rebuildIndexes("restart")` would otherwise run a restart).
/// `what` names the argument in the message.
pub(crate) fn check_object(options: &JsValue, what: &str) -> Result<(), String> {
    if options.is_undefined() || options.is_null() || options.is_object() {
        Ok(())
    } else {
        Err(agentstore_protocol::cat(&[what, " must be an object"]))
    }
}

/// `options[key]` when given (not `undefined`/`null`), converted by `f`, or
/// an error saying it must be `what`. Options that are not an object are
/// refused (see [`check_object`]).
fn given<T>(
    options: &JsValue,
    key: &str,
    what: &str,
    f: impl FnOnce(JsValue) -> Option<T>,
) -> Result<Option<T>, String> {
    check_object(options, "options")?;
    let v = opt(options, key)?;
    if v.is_undefined() || v.is_null() {
        return Ok(None);
    }
    f(v).map(Some)
        .ok_or_else(|| agentstore_protocol::cat(&[key, " must be ", what]))
}

/// `Ok` when every own enumerable key of `options` that holds a value (not
/// `undefined` or `null`, which mean "not given") is one of `known`
/// (space-separated names). An option the call does not take is refused,
/// not ignored: a misspelt `prefx` would otherwise list every record, and
/// `retry` instead of `retries` would keep the default. Dexie and PouchDB
/// ignore unknown keys; TypeScript's excess-property check refuses them in
/// object literals, and this is that check at run time for every caller.
/// Options that are not an object are left to [`check_object`].
///
/// # Errors
/// A message naming the first unknown key and the known ones, or saying
/// the keys could not be listed (a Proxy whose `ownKeys` trap throws).
#[inline(never)]
pub(crate) fn known(options: &JsValue, known: &'static str) -> Result<(), String> {
    let k = unknown_option(options, known);
    match k.as_string() {
        Some(k) => Err(agentstore_protocol::cat(&[
            "unknown option \"",
            &k,
            "\" (this call takes: ",
            known,
            ")",
        ])),
        None if k.is_null() => Err("the options' keys could not be listed (ownKeys threw)".into()),
        None => Ok(()),
    }
}

#[wasm_bindgen::prelude::wasm_bindgen(module = "/js/promise.js")]
extern "C" {
    /// The first key of `options` not in `known`, `undefined` for none,
    /// `null` when the keys could not be listed (js/promise.js
    /// `unknownOption`).
    #[wasm_bindgen(js_name = unknownOption)]
    fn unknown_option(options: &JsValue, known: &str) -> JsValue;

    /// Watches `signal` for a call (js/promise.js `trackAbort`).
    #[wasm_bindgen(js_name = trackAbort)]
    fn track_abort(signal: &AbortSignal);

    /// Ends one call's watch (js/promise.js `untrackAbort`).
    #[wasm_bindgen(js_name = untrackAbort)]
    fn untrack_abort(signal: &AbortSignal);

    /// Whether a watched `signal` fired `abort` (js/promise.js `abortFired`).
    #[wasm_bindgen(js_name = abortFired)]
    fn abort_fired(signal: &AbortSignal) -> bool;
}

/// An optional string option.
#[cfg_attr(not(feature = "lease"), allow(dead_code))]
pub(crate) fn opt_str(options: &JsValue, key: &str) -> Result<Option<String>, String> {
    given(
        options,
        key,
        "a string of at most 65,536 UTF-16 code units",
        |v| crate::value::short_string(&v, crate::value::MAX_ARG_UNITS),
    )
}

/// An optional boolean option (a string such as `"false"` or a number is
/// refused, not coerced).
pub(crate) fn opt_bool(options: &JsValue, key: &str) -> Result<Option<bool>, String> {
    given(options, key, "a boolean", |v| v.as_bool())
}

/// An optional boolean option of the store, `false` when not given; a
/// ValidationError otherwise (one out-of-line copy for every flag).
#[inline(never)]
pub(crate) fn flag(options: &JsValue, key: &str) -> Result<bool, crate::error::StoreError> {
    opt_bool(options, key)
        .map(|b| b.unwrap_or(false))
        .map_err(crate::error::StoreError::validation)
}

/// An optional integer in `min..=max` (every numeric option is a count or a
/// duration in ms; a fraction is refused, not truncated). `what` is the
/// message's rule, e.g. `"an integer in [1, 600000]"`: a static string, so
/// no number is formatted on the wasm side (float formatting alone is
/// ~16 kB of code).
pub(crate) fn opt_num(
    options: &JsValue,
    key: &str,
    min: u32,
    max: u32,
    what: &'static str,
) -> Result<Option<f64>, String> {
    given(options, key, what, |v| {
        v.as_f64()
            .filter(|n| (f64::from(min)..=f64::from(max)).contains(n) && n.fract() == 0.0)
    })
}

/// An optional function option.
pub(crate) fn opt_fn(options: &JsValue, key: &str) -> Result<Option<Function>, String> {
    given(options, key, "a function", |v| {
        v.dyn_into::<Function>().ok()
    })
}

/// `Some(reason)` when `signal` has aborted, or fired `abort` while a call
/// watched it ([`track`]: the event counts whatever `signal.aborted` reads,
/// a synthetic event's `reason` `undefined`). Read through Reflect
/// (which catches): a caller's signal may be one whose `aborted` or
/// `reason` was redefined to throw, and a throw must not unwind through the
/// module (a write group or a lease would be left half-done). A getter that
/// throws reads as aborted, with what it threw as the reason.
pub(crate) fn abort_reason(signal: &AbortSignal) -> Option<JsValue> {
    match crate::value::get(signal, &"aborted".into()) {
        Ok(a) if !a.is_truthy() && !abort_fired(signal) => None,
        Ok(_) => Some(crate::value::get(signal, &"reason".into()).unwrap_or_else(|e| e)),
        Err(e) => Some(e),
    }
}

/// The optional `signal` option: an AbortSignal of any realm (an iframe's
/// too, told by its internal slots, [`crate::value::is_a`]). An object that
/// only claims `AbortSignal.prototype` (whose `aborted` getter throws on
/// it, and would throw past the module where it is read) is refused like
/// any non-signal. A call reads it after its other options and holds
/// [`track`]'s guard of it from then on, while it runs.
pub(crate) fn opt_signal(options: &JsValue) -> Result<Option<AbortSignal>, String> {
    given(options, "signal", "an AbortSignal", |v| {
        crate::value::is_a(&v, "AbortSignal", "aborted").then(|| v.unchecked_into())
    })
}

/// A call's watch of its `signal` (js/promise.js `trackAbort`): while the
/// guard lives, an `abort` event counts at every look ([`abort_reason`]),
/// also one fired before a wait began listening; dropped with the call, it
/// removes the listener (the last call's) so that nothing keeps the signal
/// alive.
pub(crate) struct Tracked(AbortSignal);

impl Drop for Tracked {
    fn drop(&mut self) {
        untrack_abort(&self.0);
    }
}

/// Watches `signal` (when given) until the guard is dropped: hold it for
/// the whole call.
pub(crate) fn track(signal: Option<&AbortSignal>) -> Option<Tracked> {
    signal.map(|s| {
        track_abort(s);
        Tracked(s.clone())
    })
}

/// `v` as a Rust string, or a ValidationError (a JS `Error`) saying `what`
/// must be a string. Exported functions take `JsValue` and call this instead
/// of taking `String`/`&str`: wasm-bindgen's glue for those trusts the JS type
/// and traps ("memory access out of bounds") when given a number.
///
/// # Errors
/// ValidationError when `v` is not a string, or holds a lone surrogate
/// (which the conversion would change: [`crate::value::exact_string`]).
pub(crate) fn string_arg(v: &JsValue, what: &'static str) -> Result<String, JsValue> {
    crate::value::exact_string(v).ok_or_else(|| {
        crate::error::StoreError::validation(agentstore_protocol::cat(&[
            what,
            crate::value::STRING_ARG,
        ]))
        .to_js()
    })
}
