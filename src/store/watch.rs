//! Change notifications across tabs: after a write transaction COMMITS, its
//! changes are posted on a `BroadcastChannel` named after the database; every
//! [`Watcher`] (in this tab or any other of the origin) filters them by prefix.
//! <https://developer.mozilla.org/en-US/docs/Web/API/BroadcastChannel>

use crate::error::set;
use js_sys::{Array, Function, JsString, Object};
use std::cell::Cell;
use wasm_bindgen::{JsCast, JsValue};
use web_sys::BroadcastChannel;

fn channel_name(db: &str) -> String {
    agentstore_protocol::cat(&["agentstore:", db])
}

/// Posts committed changes (`[{id, rev, deleted}]`) for one database.
pub struct Notifier {
    name: String,
    /// `None` where BroadcastChannel does not exist; watching is then local-free.
    channel: Option<BroadcastChannel>,
    /// False while the index state this connection last read says no
    /// context ever watched the database (`IndexState::quiet`): changes are
    /// then not posted. Only ever goes from false to true on one database
    /// (a watch clears the mark for good), so a transaction that read the
    /// state before a later one of this connection re-read it posts at
    /// worst once more than needed.
    watched: Cell<bool>,
    /// The purge count of the index state this connection last read
    /// (`IndexState::purges`), the one its next post was written under:
    /// every write transaction reads the state (or its cached copy of the
    /// same generation) and posts right after its commit, before any
    /// later transaction's read can run.
    purges: Cell<f64>,
    /// The database's own number from the same state (`IndexState::db`).
    db: Cell<f64>,
}

impl Notifier {
    /// A notifier for database `name`.
    pub fn new(name: &str) -> Notifier {
        Notifier {
            name: name.to_owned(),
            channel: BroadcastChannel::new(&channel_name(name)).ok(),
            watched: Cell::new(true),
            purges: Cell::new(0.0),
            db: Cell::new(0.0),
        }
    }

    /// The database name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Records whether the index state just read says the database is
    /// watched, its purge count and the database's number (see the fields).
    pub fn set_state(&self, watched: bool, purges: f64, db: f64) {
        self.watched.set(watched);
        self.purges.set(purges);
        self.db.set(db);
    }

    /// Whether writes post (see the field; true until the state is read).
    pub fn watched(&self) -> bool {
        self.watched.get()
    }

    /// Whether this context has `BroadcastChannel`.
    pub fn can_post(&self) -> bool {
        self.channel.is_some()
    }

    /// Posts one message with every change of a committed transaction
    /// (`changes`: `[{id, rev, deleted}]`, built with [`Notifier::change`]),
    /// the array's `p` the purge count the transaction read (the index
    /// state's `purges`): with the revision's generation and hash it orders
    /// one id's changes as they committed, which a watcher uses to drop a
    /// change another context's later post overtook (js/promise.js
    /// `watchChannel`); `d` the database's number, which tells a database
    /// made again after a `destroy` from the one before.
    pub fn post(&self, changes: &Array) {
        let Some(ch) = &self.channel else { return };
        if changes.length() == 0 {
            return;
        }
        set(changes, "p", &self.purges.get().into());
        set(changes, "d", &self.db.get().into());
        let _ = ch.post_message(changes);
    }

    /// Appends the change `{id, rev, deleted}` to `changes` (a message for
    /// [`Notifier::post`]); nothing is built where there is no channel to
    /// post it on, or on a database no context has watched. The writes
    /// build the message as they go: a slice of tuples turned into an
    /// `Array` afterwards compiled one iterator chain per caller.
    pub fn change(&self, changes: &Array, id: &JsValue, rev: &str, deleted: bool) {
        if self.channel.is_none() || !self.watched.get() {
            return;
        }
        let o = Object::new();
        set(&o, "id", id);
        set(&o, "rev", &rev.into());
        set(&o, "deleted", &JsValue::from_bool(deleted));
        changes.push(&o);
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
/// from any tab (js/promise.js `watchChannel`: the listener and its handle
/// are JS). Stops on [`Watcher::close`] only: dropping a `Watcher` (or the
/// page dropping the JS handle) leaves it running, as an event listener
/// stays until it is removed.
///
/// Writes to a database that no context has watched post nothing (a
/// `BroadcastChannel` post costs a write in Chromium about a tenth of its
/// time: BENCHMARKS, thirty-fourth round); the first watch marks the
/// database in IndexedDB (`Store::mark_watched`), and the handle's `ready`
/// resolves once that mark committed.
pub struct Watcher {
    /// The JS handle: `{close(), ready, [Symbol.dispose]()}`, frozen.
    handle: JsValue,
}

#[wasm_bindgen::prelude::wasm_bindgen(module = "/js/promise.js")]
extern "C" {
    /// Listens on BroadcastChannel `name` (throws where there is none);
    /// returns the subscription's handle, with `ready` on it.
    #[wasm_bindgen(js_name = watchChannel, catch)]
    fn watch_channel(
        name: &str,
        prefix: &JsString,
        callback: &Function,
        ready: &js_sys::Promise,
    ) -> Result<JsValue, JsValue>;
}

impl Watcher {
    /// Subscribes to changes of `store`'s database under `prefix`, and
    /// marks the database as watched (see [`Watcher`]).
    ///
    /// # Errors
    /// ClosedError when `store` is closed; the DOMException when
    /// BroadcastChannel is unavailable (the database is marked all the
    /// same: its writes then post, which no one loses by; `watch()` checks
    /// for BroadcastChannel first and marks nothing then).
    pub fn new(
        store: &super::Store,
        prefix: JsString,
        callback: Function,
    ) -> Result<Watcher, JsValue> {
        // The mark's transaction is created during this call, so it commits
        // after the listener below is attached. A failed mark rejects
        // `ready` (the listener then hears only writers that post anyway).
        let ready = store.mark_watched().map_err(|e| e.to_js())?;
        let handle = watch_channel(&channel_name(store.name()), &prefix, &callback, &ready)?;
        Ok(Watcher { handle })
    }

    /// The JS handle `{close(), ready, [Symbol.dispose]()}` that `watch()`
    /// returns.
    pub fn handle(&self) -> &JsValue {
        &self.handle
    }

    /// Stops the subscription (also for the rest of a message being
    /// handled); a second call does nothing.
    pub fn close(&self) {
        if let Ok(close) = crate::value::get(&self.handle, &"close".into()) {
            let _ = crate::value::call0(&close.unchecked_into::<Function>(), &self.handle);
        }
    }
}
