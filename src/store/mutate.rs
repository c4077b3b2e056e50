//! `mutate`: read-modify-write of one record with a caller's function.

use super::group::{Done, Job};
use super::{Prepared, Store, Written};
use crate::error::{set, Result, StoreError};
use agentstore_protocol::backoff::{full_jitter_ms, MUTATE_BASE_MS, MUTATE_CAP_MS};
use agentstore_protocol::rev::Current;
use js_sys::{Function, JsString};
use wasm_bindgen::{JsCast, JsValue};
use web_sys::AbortSignal;

impl Store {
    /// Read-modify-write of one record with `f(current | null)`; `f`
    /// returning `undefined` writes nothing (`Ok(None)`).
    ///
    /// A synchronous `f` is called inside the write transaction, between the
    /// read and the write (only IndexedDB is awaited there), so it cannot
    /// conflict. An async `f` (it returns a thenable) is awaited OUTSIDE any
    /// transaction — awaiting a foreign promise inside one would auto-commit
    /// it — and its result is written with the revision it was given; on a
    /// conflict the whole read-apply-write is retried after a full-jitter
    /// backoff, at most `retries` more times.
    ///
    /// # Errors
    /// ConflictError with `attempts` when retries run out; AbortError when
    /// `signal` aborts; whatever `f` throws, unchanged; ValidationError when
    /// `f` returns something that is not a valid record.
    pub async fn mutate(
        &self,
        id: &JsValue,
        f: &Function,
        retries: u32,
        signal: Option<&AbortSignal>,
    ) -> Result<Option<Written>> {
        let id = super::check_id_value(id)?;
        let mut attempt = 0u32;
        loop {
            check_abort(signal)?;
            let job = Job::Mutate {
                id: id.clone(),
                f: f.clone(),
            };
            let (promise, rev) = match self.write_one(job, signal).await? {
                Done::Written(w) => return Ok(Some(w)),
                Done::Unchanged => return Ok(None),
                Done::Async { promise, rev } => (promise, rev),
            };
            // An async function: its (unwritten) read ended with the group;
            // await it outside any transaction, then compare-and-swap
            // against the revision it saw.
            let out = until_abort(promise, signal).await?;
            check_abort(signal)?;
            let Some(prepared) = mutate_result(&id, out, rev.as_deref())? else {
                return Ok(None);
            };
            // Its put is skipped, too, when `signal` aborts while it waits.
            match self
                .write_one(Job::Put(prepared), signal)
                .await
                .and_then(Done::written)
            {
                Ok(w) => return Ok(Some(w)),
                Err(StoreError::Conflict {
                    id,
                    id_text,
                    expected_rev,
                    current_rev,
                    current,
                    ..
                }) if attempt >= retries => {
                    return Err(StoreError::Conflict {
                        id,
                        id_text,
                        expected_rev,
                        current_rev,
                        current,
                        attempts: Some(attempt + 1),
                    })
                }
                Err(StoreError::Conflict { .. }) => {
                    let delay = full_jitter_ms(
                        attempt,
                        MUTATE_BASE_MS,
                        MUTATE_CAP_MS,
                        js_sys::Math::random(),
                    );
                    until_abort(super::db::sleep_promise(delay as u32), signal).await?;
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// What calling `mutate`'s function inside the write transaction gave.
pub(super) enum Called {
    /// A synchronous result to write (its `_rev` is the one read).
    Write(Prepared),
    /// Nothing to write now: `undefined`, or a thenable to await outside.
    Done(Done),
}

/// Calls `f` with a copy of what the transaction read for `id` (`current`,
/// `stored`). A synchronous function runs between the read and the write
/// (only IndexedDB is awaited there), so its write cannot conflict; the
/// signal is checked before and after it.
///
/// # Errors
/// AbortError, the value `f` threw, ValidationError for a result that is
/// not a record.
pub(super) fn call(
    id: &JsString,
    f: &Function,
    signal: Option<&AbortSignal>,
    current: &Current,
    stored: Option<&JsValue>,
) -> Result<Called> {
    check_abort(signal)?;
    // The function gets its own copy: one that edits its argument in
    // place (`r => { r.recordType = "x"; return r; }`) must not change
    // the stored record the index upkeep reads the old keys from.
    let arg = match stored {
        Some(v) => structured_clone(v)?,
        None => JsValue::NULL,
    };
    let out = crate::value::call1(f, &JsValue::NULL, &arg).map_err(StoreError::Thrown)?;
    let rev = match current {
        Current::Live(r) => Some(r.text()),
        _ => None,
    };
    if let Some(promise) = crate::value::as_promise(&out) {
        // Handled from now on: if the group's transaction fails, this
        // attempt's promise is dropped unawaited (the member runs again),
        // and its rejection must not reach the page as unhandled. Awaiting
        // it later still sees the rejection.
        // (`Boolean` as the handler: any function that cannot throw.)
        let get = |o: &JsValue, k: &str| crate::value::get(o, &k.into());
        if let (Ok(catch), Ok(handler)) =
            (get(&promise, "catch"), get(&js_sys::global(), "Boolean"))
        {
            if let Some(catch) = catch.dyn_ref::<Function>() {
                let _ = crate::value::call1(catch, &promise, &handler);
            }
        }
        // Aborted while `f` ran (its synchronous part): the thenable is
        // not waited for, and nothing is written.
        check_abort(signal)?;
        return Ok(Called::Done(Done::Async { promise, rev }));
    }
    check_abort(signal)?;
    Ok(match mutate_result(id, out, rev.as_deref())? {
        Some(p) => Called::Write(p),
        None => Called::Done(Done::Unchanged),
    })
}

/// The record `mutate` writes for the function's result `out`: `None` for
/// `undefined`; `_id` set to `id` (another `_id` is refused), `_rev` set
/// to the revision read.
///
/// # Errors
/// ValidationError for a result that is not a record object, has another
/// `_id`, or is not a valid record.
fn mutate_result(id: &JsString, out: JsValue, read_rev: Option<&str>) -> Result<Option<Prepared>> {
    if out.is_undefined() {
        return Ok(None);
    }
    if !out.is_object() || crate::value::is_array(&out)? {
        return Err(StoreError::validation(
            "the mutate function must return a record object or undefined",
        ));
    }
    // One read of each top-level field; the walk reads the nested ones once.
    let next = crate::value::shallow_copy(&out)?;
    // Omitted, `_id` is the id mutated; another one is a mistake (a copy
    // meant for another record would overwrite this one), not renamed.
    let given = crate::value::get(&next, &"_id".into()).unwrap_or(JsValue::UNDEFINED);
    if !given.is_undefined() && given != JsValue::from(id) {
        return Err(StoreError::validation(
            "the mutate function returned a record with another _id (omit it, or keep the id mutated)",
        ));
    }
    set(&next, "_id", id);
    match read_rev {
        Some(r) => set(&next, "_rev", &r.into()),
        None => {
            let _ = js_sys::Reflect::delete_property(&next, &"_rev".into());
        }
    }
    Store::prepare(&next).map(Some)
}

/// Fails with AbortError (carrying `signal.reason`) once `signal` is aborted.
pub(crate) fn check_abort(signal: Option<&AbortSignal>) -> Result<()> {
    match signal {
        Some(s) => crate::options::abort_reason(s).map_or(Ok(()), |r| Err(StoreError::Aborted(r))),
        None => Ok(()),
    }
}

/// Awaits `promise`, but rejects with AbortError (carrying
/// `signal.reason`) as soon as `signal` aborts: an async `mutate` function
/// that never settles, or a backoff sleep, does not hold the call after an
/// abort. A rejection of `promise` is passed through unchanged.
///
/// # Errors
/// AbortError; the value `promise` rejected with.
async fn until_abort(promise: js_sys::Promise, signal: Option<&AbortSignal>) -> Result<JsValue> {
    race_abort(promise, signal)
        .await?
        .map_err(StoreError::Thrown)
}

/// Awaits `promise` raced with `signal`: AbortError (carrying
/// `signal.reason`) once it aborts (also when it already had), else the
/// promise's own outcome, for the caller to map.
///
/// # Errors
/// AbortError.
pub(crate) async fn race_abort(
    promise: js_sys::Promise,
    signal: Option<&AbortSignal>,
) -> Result<std::result::Result<JsValue, JsValue>> {
    let Some(sig) = signal else {
        return Ok(wasm_bindgen_futures::JsFuture::from(promise).await);
    };
    check_abort(signal)?;
    let marker = JsValue::from(js_sys::Object::new());
    let out = wasm_bindgen_futures::JsFuture::from(race_abort_js(&promise, sig, &marker)).await;
    match out {
        Ok(v) if v == marker => Err(StoreError::Aborted(
            crate::options::abort_reason(sig).unwrap_or(JsValue::UNDEFINED),
        )),
        other => Ok(other),
    }
}

/// `promise` raced with `signal` as [`race_abort`] races it, and in the
/// same way with the closing of `store`'s connection (`close()`, another
/// tab's `versionchange`; [`super::db::Db::closing`]): for waits on
/// something other than IndexedDB (an import's source), which a closed
/// connection would not end.
///
/// # Errors
/// AbortError; the store's ClosedError once it closes (also when it was
/// closed already).
#[cfg(feature = "io")]
pub(crate) async fn race_abort_or_close(
    promise: js_sys::Promise,
    signal: Option<&AbortSignal>,
    store: &Store,
) -> Result<std::result::Result<JsValue, JsValue>> {
    let closed = JsValue::from(js_sys::Object::new());
    // Raced (which handles `promise`'s rejection) before anything returns
    // early, so a callback that closed the store and then rejects leaves no
    // unhandled rejection.
    let raced = race_abort_js(&promise, &store.db.closing()?, &closed);
    // An already aborted signal fires no `abort` event: looked at here.
    store.check_open()?;
    match race_abort(raced, signal).await? {
        Ok(v) if v == closed => Err(store
            .check_open()
            .err()
            .unwrap_or_else(|| StoreError::Closed("the connection closed".into()))),
        other => Ok(other),
    }
}

/// What a user callback (`onProgress`) returned or threw, settled: a
/// thenable it returned is awaited (raced as [`race_abort_or_close`] races
/// it, so an abort or `close()` ends the wait at once); its rejection is
/// handled here, never an unhandled rejection, and comes back as a throw.
///
/// `complete`: the call's work is all committed (its last progress call).
/// An abort then only ends the wait: the call resolves with what it did,
/// since an AbortError would report as not done work that is written.
///
/// # Errors
/// AbortError (unless `complete`); ClosedError.
#[cfg(feature = "io")]
pub(crate) async fn settle_callback(
    called: std::result::Result<JsValue, JsValue>,
    signal: Option<&AbortSignal>,
    store: &Store,
    complete: bool,
) -> Result<std::result::Result<JsValue, JsValue>> {
    match called.as_ref().ok().and_then(crate::value::as_promise) {
        Some(p) => match race_abort_or_close(p, signal, store).await {
            Err(StoreError::Aborted(_)) if complete => Ok(Ok(JsValue::UNDEFINED)),
            settled => settled,
        },
        None => Ok(called),
    }
}

#[wasm_bindgen::prelude::wasm_bindgen(module = "/js/promise.js")]
extern "C" {
    /// `promise` raced with `signal`'s `abort` event, which resolves it with
    /// `marker` (js/promise.js `raceAbort`).
    #[wasm_bindgen(js_name = raceAbort)]
    pub(crate) fn race_abort_js(
        promise: &js_sys::Promise,
        signal: &AbortSignal,
        marker: &JsValue,
    ) -> js_sys::Promise;

    /// `[aborted, stop]`: a Promise resolved on `signal`'s `abort` event,
    /// and the function that removes its listener (js/promise.js
    /// `abortWatch`).
    #[wasm_bindgen(js_name = abortWatch)]
    pub(super) fn abort_watch(signal: &AbortSignal) -> js_sys::Array;
}

/// `structuredClone(v)`: a deep copy of a stored record (plain data).
/// <https://developer.mozilla.org/docs/Web/API/Window/structuredClone>
fn structured_clone(v: &JsValue) -> Result<JsValue> {
    let f: Function = crate::value::get(&js_sys::global(), &"structuredClone".into())
        .ok()
        .and_then(|f| f.dyn_into().ok())
        .ok_or_else(|| StoreError::Transaction("structuredClone is not available".into()))?;
    crate::value::call1(&f, &JsValue::NULL, v)
        .map_err(|_| StoreError::Transaction("a stored record could not be copied".into()))
}
