//! Browser lifecycle glue: `pagehide` release beacons and Web Locks
//! (`navigator.locks`), both looked up on the global scope so the client also
//! runs in workers, where they are skipped cleanly when absent.

use js_sys::{Function, Promise};
use wasm_bindgen::closure::Closure;
use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_futures::JsFuture;

fn get(obj: &JsValue, key: &str) -> Option<JsValue> {
    crate::value::get(obj, &key.into())
        .ok()
        .filter(|v| !v.is_undefined() && !v.is_null())
}

/// Logs a warning on the console.
pub fn warn(message: &str) {
    web_sys::console::warn_1(&message.into());
}

#[wasm_bindgen::prelude::wasm_bindgen(module = "/js/lease.js")]
extern "C" {
    /// Sends `body` (as text/plain, so no CORS preflight) to `url` with
    /// [`navigator.sendBeacon`](https://developer.mozilla.org/docs/Web/API/Navigator/sendBeacon),
    /// falling back to `fetch(url, {method: "POST", keepalive: true})`
    /// (js/lease.js `beacon`; it throws nothing).
    pub fn beacon(url: &str, body: &str);
    /// The Web Lock request of [`lock`] (js/lease.js `requestLock`):
    /// `undefined` without Web Locks, else `[granted, unlock]`.
    #[wasm_bindgen(js_name = requestLock, catch)]
    fn request_lock_js(name: &str, wait_ms: f64) -> Result<JsValue, JsValue>;
    /// A Promise of the held locks' names, or of `undefined` (js/lease.js
    /// `heldLocks`; it never rejects).
    #[wasm_bindgen(js_name = heldLocks)]
    fn held_locks_js() -> Promise;
}

/// The events on which the heartbeat loop looks at its leases at once: a
/// page shown or focused again, a frozen page resumed (Page Lifecycle
/// `resume`) and a network back are what a machine waking from a suspend, or
/// a tab leaving the background, fire first. (The loop's own timer may be up
/// to a heartbeat interval away: browsers' timers, like `performance.now()`,
/// do not run while the machine sleeps.)
pub const RESUME_EVENTS: [&str; 5] = ["visibilitychange", "pageshow", "focus", "online", CAPTURED];

/// The one event [`listen`] hears while capturing: `resume` is fired at the
/// `document` without bubbling (Page Lifecycle API), so a listener on the
/// window hears it only in the capture phase. The others are heard
/// bubbling, so that an element's `focus` (which does not bubble) is not
/// taken for the window's.
const CAPTURED: &str = "resume";

/// The window's `pagehide` (windows only: workers have none).
pub const PAGEHIDE: [&str; 1] = ["pagehide"];

/// The window's `beforeunload`: the page begins to be left (windows only).
pub const BEFOREUNLOAD: [&str; 1] = ["beforeunload"];

/// A listener [`listen`] installed (its argument is the event).
pub type Listener = Closure<dyn FnMut(JsValue)>;

/// Calls `f` with each of `events` of the global scope (window or worker);
/// `None` outside a window when `window_only` (for `pagehide`).
pub fn listen(events: &[&str], window_only: bool, f: Box<dyn FnMut(JsValue)>) -> Option<Listener> {
    let global = js_sys::global();
    if window_only {
        get(&global, "document")?;
    }
    let cb: Listener = Closure::wrap(f);
    let target: &web_sys::EventTarget = global.unchecked_ref();
    for (i, e) in events.iter().enumerate() {
        if target
            .add_event_listener_with_callback_and_bool(
                e,
                cb.as_ref().unchecked_ref(),
                *e == CAPTURED,
            )
            .is_err()
        {
            // None of it stays registered: the closure is dropped below.
            unlisten(&events[..i], &cb);
            return None;
        }
    }
    Some(cb)
}

/// Whether event `e` was fired by the browser rather than by a script's
/// `dispatchEvent` (its `isTrusted`; true when it cannot be told).
pub fn trusted(e: &JsValue) -> bool {
    get(e, "isTrusted")
        .and_then(|t| t.as_bool())
        .unwrap_or(true)
}

/// Whether `e` is the `pageshow` of a page restored from the back/forward
/// cache (its `persisted`; the resume events carry no other).
pub fn restored(e: &JsValue) -> bool {
    get(e, "persisted").is_some_and(|p| p.is_truthy())
}

/// Whether the window's document is `visible` (`document.visibilityState`;
/// false outside a window).
pub fn visible() -> bool {
    get(&js_sys::global(), "document")
        .and_then(|d| get(&d, "visibilityState"))
        .and_then(|v| v.as_string())
        .is_some_and(|v| v == "visible")
}

/// Removes a listener installed by [`listen`] for the same `events`.
pub fn unlisten(events: &[&str], cb: &Listener) {
    let global = js_sys::global();
    let target: &web_sys::EventTarget = global.unchecked_ref();
    for e in events {
        let _ = target.remove_event_listener_with_callback_and_bool(
            e,
            cb.as_ref().unchecked_ref(),
            *e == CAPTURED,
        );
    }
}

/// The result of asking for a Web Lock.
pub enum LockOutcome {
    /// Held until the function is called.
    Acquired(Function),
    /// Another context (tab, worker) holds it.
    Busy,
    /// `navigator.locks` does not exist here.
    Unsupported,
}

/// The names of the Web Locks held now in this origin
/// (`navigator.locks.query()`), or `None` where that cannot be asked
/// (js/lease.js `heldLocks`).
pub async fn held_locks() -> Option<js_sys::Array> {
    JsFuture::from(held_locks_js())
        .await
        .ok()
        .filter(js_sys::Array::is_array)
        .map(JsCast::unchecked_into)
}

/// Requests the exclusive [Web Lock](https://developer.mozilla.org/docs/Web/API/LockManager/request)
/// `name`, waiting at most `wait_ms` (0 = only if free now; `f64::INFINITY` =
/// until it is granted). The lock is held until the returned function is
/// called (or the page goes away).
///
/// The request is issued when this function is called, not when the future
/// is first polled: Web Locks grant requests in the order they were made, so
/// a caller can take its place in the queue before it does anything that
/// another context might react to.
pub fn lock(name: &str, wait_ms: f64) -> impl std::future::Future<Output = LockOutcome> {
    let issued = request_lock(name, wait_ms);
    async move {
        let Some((granted, unlock)) = issued else {
            return LockOutcome::Unsupported;
        };
        match JsFuture::from(granted).await.ok().and_then(|v| v.as_bool()) {
            Some(true) => LockOutcome::Acquired(unlock),
            _ => LockOutcome::Busy,
        }
    }
}

/// Issues the request of [`lock`]: `(granted, unlock)`, where `granted`
/// resolves with whether the lock is held; `None` without Web Locks.
fn request_lock(name: &str, wait_ms: f64) -> Option<(Promise, Function)> {
    let pair = request_lock_js(name, wait_ms).ok()?;
    if pair.is_undefined() {
        return None;
    }
    let pair: js_sys::Array = pair.unchecked_into();
    Some((pair.get(0).unchecked_into(), pair.get(1).unchecked_into()))
}
