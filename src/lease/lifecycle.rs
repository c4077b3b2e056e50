//! Browser lifecycle glue: `pagehide` release beacons and Web Locks
//! (`navigator.locks`), both looked up on the global scope so the client also
//! runs in workers, where they are skipped cleanly when absent.

use std::cell::RefCell;
use std::rc::Rc;

use js_sys::{Function, Object, Promise, Reflect};
use wasm_bindgen::closure::Closure;
use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_futures::JsFuture;

fn get(obj: &JsValue, key: &str) -> Option<JsValue> {
    Reflect::get(obj, &key.into())
        .ok()
        .filter(|v| !v.is_undefined() && !v.is_null())
}

/// Logs a warning on the console.
pub fn warn(message: &str) {
    web_sys::console::warn_1(&message.into());
}

/// Sends `body` (as text/plain, so no CORS preflight) to `url` with
/// [`navigator.sendBeacon`](https://developer.mozilla.org/docs/Web/API/Navigator/sendBeacon),
/// falling back to `fetch(url, {method: "POST", keepalive: true})`.
pub fn beacon(url: &str, body: &str) {
    let global = js_sys::global();
    let sent = get(&global, "navigator")
        .and_then(|nav| {
            let f = get(&nav, "sendBeacon")?.dyn_into::<Function>().ok()?;
            f.call2(&nav, &url.into(), &body.into()).ok()
        })
        .and_then(|v| v.as_bool())
        .unwrap_or(false);
    if sent {
        return;
    }
    if let Some(fetch) = get(&global, "fetch").and_then(|f| f.dyn_into::<Function>().ok()) {
        let init = Object::new();
        let _ = Reflect::set(&init, &"method".into(), &"POST".into());
        let _ = Reflect::set(&init, &"body".into(), &body.into());
        let _ = Reflect::set(&init, &"keepalive".into(), &JsValue::TRUE);
        if let Ok(p) = fetch.call2(&JsValue::UNDEFINED, &url.into(), &init) {
            // Nobody waits for it; swallow the rejection.
            on_reject(&p, Closure::once_into_js(|_: JsValue| {}));
        }
    }
}

/// `promise.catch(handler)` for a handler made by `Closure::once_into_js`.
fn on_reject(promise: &JsValue, handler: JsValue) {
    let catch = Reflect::get(promise, &"catch".into())
        .ok()
        .and_then(|f| f.dyn_into::<Function>().ok());
    if let Some(catch) = catch {
        let _ = catch.call1(promise, &handler);
    }
}

/// The events on which the heartbeat loop looks at its leases at once: a
/// page shown or focused again and a network back are what a machine waking
/// from a suspend, or a tab leaving the background, fire first. (The loop's
/// own timer may be up to a heartbeat interval away: browsers' timers, like
/// `performance.now()`, do not run while the machine sleeps.)
pub const RESUME_EVENTS: [&str; 4] = ["visibilitychange", "pageshow", "focus", "online"];

/// The window's `pagehide` (windows only: workers have none).
pub const PAGEHIDE: [&str; 1] = ["pagehide"];

/// Calls `f` on each of `events` of the global scope (window or worker);
/// `None` outside a window when `window_only` (for `pagehide`).
pub fn listen(
    events: &[&str],
    window_only: bool,
    f: Box<dyn FnMut()>,
) -> Option<Closure<dyn FnMut()>> {
    let global = js_sys::global();
    if window_only {
        get(&global, "document")?;
    }
    let cb = Closure::wrap(f);
    let target: &web_sys::EventTarget = global.unchecked_ref();
    for (i, e) in events.iter().enumerate() {
        if target
            .add_event_listener_with_callback(e, cb.as_ref().unchecked_ref())
            .is_err()
        {
            // None of it stays registered: the closure is dropped below.
            unlisten(&events[..i], &cb);
            return None;
        }
    }
    Some(cb)
}

/// Removes a listener installed by [`listen`] for the same `events`.
pub fn unlisten(events: &[&str], cb: &Closure<dyn FnMut()>) {
    let global = js_sys::global();
    let target: &web_sys::EventTarget = global.unchecked_ref();
    for e in events {
        let _ = target.remove_event_listener_with_callback(e, cb.as_ref().unchecked_ref());
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
    let locks = get(&js_sys::global(), "navigator").and_then(|n| get(&n, "locks"))?;
    let request = get(&locks, "request").and_then(|f| f.dyn_into::<Function>().ok())?;
    // `granted` resolves with true (lock held) or false (busy / gave up).
    let grant_slot: Rc<RefCell<Option<Function>>> = Rc::new(RefCell::new(None));
    let g2 = grant_slot.clone();
    let granted = Promise::new(&mut |resolve, _| *g2.borrow_mut() = Some(resolve));
    let grant = grant_slot.borrow_mut().take();
    // `hold` stays pending (keeping the lock) until `unlock` is called.
    let hold_slot: Rc<RefCell<Option<Function>>> = Rc::new(RefCell::new(None));
    let h2 = hold_slot.clone();
    let hold = Promise::new(&mut |resolve, _| *h2.borrow_mut() = Some(resolve));
    let unlock = hold_slot.borrow_mut().take();
    let (grant, unlock) = (grant?, unlock?);
    // Set when the wait ran out: a lock granted in that same instant (its
    // callback not run yet, which the abort cannot stop) is let go at once,
    // instead of held for the page's life by a caller told "busy".
    let gave_up = Rc::new(std::cell::Cell::new(false));
    let g = grant.clone();
    let late = gave_up.clone();
    let cb = Closure::once_into_js(move |lock: JsValue| -> JsValue {
        let held = !lock.is_null() && !lock.is_undefined() && !late.get();
        let _ = g.call1(&JsValue::UNDEFINED, &JsValue::from(held));
        if held {
            hold.into()
        } else {
            JsValue::UNDEFINED
        }
    });
    let options = Object::new();
    let controller = web_sys::AbortController::new().ok();
    if wait_ms <= 0.0 {
        let _ = Reflect::set(&options, &"ifAvailable".into(), &JsValue::TRUE);
    } else if let (Some(c), true) = (&controller, wait_ms.is_finite()) {
        let _ = Reflect::set(&options, &"signal".into(), &c.signal());
    }
    let p = request.call3(&locks, &name.into(), &options, &cb).ok()?;
    let g = grant.clone();
    let on_err = Closure::once_into_js(move |_: JsValue| {
        let _ = g.call1(&JsValue::UNDEFINED, &JsValue::FALSE);
    });
    on_reject(&p, on_err);
    if wait_ms > 0.0 && wait_ms.is_finite() {
        if let Some(c) = controller {
            let g = grant.clone();
            wasm_bindgen_futures::spawn_local(async move {
                super::http::sleep_ms(wait_ms).await;
                // Aborting a granted request does nothing; a pending one rejects.
                gave_up.set(true);
                c.abort();
                let _ = g.call1(&JsValue::UNDEFINED, &JsValue::FALSE);
            });
        }
    }
    Some((granted, unlock))
}
