//! Change notifications across tabs: after a write transaction COMMITS, its
//! changes are posted on a `BroadcastChannel` named after the database; every
//! [`Watcher`] (in this tab or any other of the origin) filters them by prefix.
//! <https://developer.mozilla.org/en-US/docs/Web/API/BroadcastChannel>

use crate::error::set;
use js_sys::{Array, Function, JsString, Object, Reflect};
use wasm_bindgen::prelude::Closure;
use wasm_bindgen::{JsCast, JsValue};
use web_sys::{BroadcastChannel, MessageEvent};

fn channel_name(db: &str) -> String {
    ["agentstore:", db].concat()
}

/// Posts committed changes (`[{id, rev, deleted}]`) for one database.
pub struct Notifier {
    name: String,
    /// `None` where BroadcastChannel does not exist; watching is then local-free.
    channel: Option<BroadcastChannel>,
}

impl Notifier {
    /// A notifier for database `name`.
    pub fn new(name: &str) -> Notifier {
        Notifier {
            name: name.to_owned(),
            channel: BroadcastChannel::new(&channel_name(name)).ok(),
        }
    }

    /// The database name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Posts one message with every change of a committed transaction.
    pub fn post(&self, changes: &[(JsValue, String, bool)]) {
        let Some(ch) = &self.channel else { return };
        if changes.is_empty() {
            return;
        }
        let arr: Array = changes
            .iter()
            .map(|(id, rev, deleted)| {
                let o = Object::new();
                set(&o, "id", id);
                set(&o, "rev", &rev.as_str().into());
                set(&o, "deleted", &JsValue::from_bool(*deleted));
                JsValue::from(o)
            })
            .collect();
        let _ = ch.post_message(&arr);
    }
}

impl Drop for Notifier {
    fn drop(&mut self) {
        if let Some(ch) = &self.channel {
            ch.close();
        }
    }
}

/// A subscription made by `watch({prefix}, callback)`: calls `callback({id,
/// rev, deleted})` for every committed change whose id starts with `prefix`,
/// from any tab. Stops on [`Watcher::close`] or when dropped.
#[must_use = "the subscription stops when the Watcher is dropped"]
pub struct Watcher {
    channel: BroadcastChannel,
    /// Set by `close()`: a callback that closes its own handle gets no
    /// further change, not even the rest of the message it is handling.
    closed: std::rc::Rc<std::cell::Cell<bool>>,
    _listener: Closure<dyn FnMut(MessageEvent)>,
}

impl Watcher {
    /// Subscribes to changes of database `db` under `prefix`.
    ///
    /// # Errors
    /// The DOMException when BroadcastChannel is unavailable.
    pub fn new(db: &str, prefix: JsString, callback: Function) -> Result<Watcher, JsValue> {
        let channel = BroadcastChannel::new(&channel_name(db))?;
        let closed = std::rc::Rc::new(std::cell::Cell::new(false));
        let stop = closed.clone();
        let listener = Closure::<dyn FnMut(MessageEvent)>::new(move |ev: MessageEvent| {
            let data = ev.data();
            if !Array::is_array(&data) {
                return;
            }
            for change in Array::from(&data).iter() {
                if stop.get() {
                    return;
                }
                let matches = Reflect::get(&change, &"id".into())
                    .ok()
                    .and_then(|id| id.dyn_into::<JsString>().ok())
                    .is_some_and(|id| starts_with(&id, &prefix));
                if matches {
                    let _ = callback.call1(&JsValue::NULL, &change);
                }
            }
        });
        channel.set_onmessage(Some(listener.as_ref().unchecked_ref()));
        Ok(Watcher {
            channel,
            closed,
            _listener: listener,
        })
    }

    /// Stops the subscription (also for the rest of a message being handled).
    pub fn close(&self) {
        self.closed.set(true);
        self.channel.set_onmessage(None);
        self.channel.close();
    }
}

/// `id.startsWith(prefix)` on UTF-16 code units (exact for lone surrogates).
fn starts_with(id: &JsString, prefix: &JsString) -> bool {
    id.length() >= prefix.length() && id.slice(0, prefix.length()) == *prefix
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.close();
    }
}
