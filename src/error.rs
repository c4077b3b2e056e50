//! The SDK's error type and its mapping to JS `Error` objects.
//!
//! Every error crossing into JS is a real `Error` whose `name`, `code` and
//! `status` come from [`agentstore_protocol::ErrorCode`]; conflict errors also
//! carry `id`, `expectedRev`, `currentRev` and `current`.

use agentstore_protocol::ErrorCode;
use js_sys::{Array, Object};
use wasm_bindgen::JsValue;

/// One failing position of a batch (`putMany`, imports).
#[derive(Debug, Clone)]
pub struct BatchFailure {
    /// Index in the input array.
    pub index: usize,
    /// The record id, when one could be read.
    pub id: JsValue,
    /// What was wrong at that position.
    pub message: String,
    /// For conflicts: the revision the caller expected and the stored one.
    pub expected_rev: Option<String>,
    /// The stored revision (`None` when nothing is stored).
    pub current_rev: Option<String>,
    /// The error the single-record call would give for this position
    /// (`put`/`delete`): validation, conflict, or not_found (a deletion with
    /// nothing live to delete, as `delete`'s NotFoundError).
    pub code: ErrorCode,
}

/// Everything an agentstore operation can fail with.
///
/// Messages are assembled from static text and the error's fields by
/// [`StoreError::message`], without `core::fmt` (kept off wasm paths).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum StoreError {
    /// Input refused before anything was written.
    Validation {
        /// What was wrong.
        message: String,
        /// Per-position failures for batch calls (empty otherwise).
        failures: Vec<BatchFailure>,
    },
    /// An import source that failed while it was read (a ValidationError
    /// whose message names the platform's error, kept as its `cause`).
    Unreadable {
        /// What failed, naming the platform's error.
        message: String,
        /// The platform's error (or whatever the stream errored with).
        cause: JsValue,
    },
    /// Compare-and-swap failed.
    Conflict {
        /// The record id (a JS string; may hold lone surrogates).
        id: JsValue,
        /// The id for messages (lossy).
        id_text: String,
        /// Revision the caller wrote against (`None` = create).
        expected_rev: Option<String>,
        /// Revision stored now (`None` = nothing).
        current_rev: Option<String>,
        /// The stored record, or null.
        current: JsValue,
        /// For `mutate`: how many attempts were made.
        attempts: Option<u32>,
    },
    /// A `putMany` in which some positions conflicted; nothing was written.
    BatchConflict {
        /// Every conflicting position.
        failures: Vec<BatchFailure>,
    },
    /// A `deleteMany` refused only for positions with nothing live to
    /// delete: NotFoundError, as `delete` of each (each failure's `code`
    /// is `not_found`).
    BatchNotFound {
        /// Every such position.
        failures: Vec<BatchFailure>,
    },
    /// The record does not exist (or is a tombstone): its id (a JS string,
    /// exact: may hold lone surrogates) and the id for messages (lossy).
    NotFound(JsValue, String),
    /// The browser refused the write for lack of quota; the transaction rolled back.
    QuotaExceeded(String),
    /// The transaction failed or aborted for another reason.
    Transaction(String),
    /// The open (or `destroy`) stayed blocked by another tab's connection (name, timeout ms).
    Blocked(String, u32),
    /// The store was closed (by `close()` or another tab's upgrade).
    Closed(String),
    /// Cancelled through an AbortSignal.
    Aborted(JsValue),
    /// A value thrown by a caller's callback (for example `mutate`'s function),
    /// passed back to JS unchanged.
    Thrown(JsValue),
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message())
    }
}

impl std::error::Error for StoreError {}

impl StoreError {
    /// A validation error with a message.
    pub fn validation(message: impl Into<String>) -> Self {
        StoreError::Validation {
            message: message.into(),
            failures: Vec::new(),
        }
    }

    /// The human-readable message (what `Display` and the JS `message` say).
    pub fn message(&self) -> String {
        let or_none = |r: &Option<String>| r.clone().unwrap_or_else(|| "none".into());
        match self {
            StoreError::Validation { message, .. } | StoreError::Unreadable { message, .. } => {
                message.clone()
            }
            StoreError::Conflict {
                id_text,
                expected_rev,
                current_rev,
                ..
            } => agentstore_protocol::cat(&[
                "conflict on ",
                id_text,
                ": expected revision ",
                &or_none(expected_rev),
                ", stored revision is ",
                &or_none(current_rev),
            ]),
            // One message for both (the name and code say which; each
            // failure carries its own code): a put batch has no deletion
            // to find nothing for.
            StoreError::BatchConflict { .. } | StoreError::BatchNotFound { .. } => {
                "the batch was refused at the positions in failures (each with its code and currentRev); nothing was written".into()
            }
            StoreError::NotFound(_, id) => agentstore_protocol::cat(&["record ", id, " not found"]),
            StoreError::QuotaExceeded(m) => agentstore_protocol::cat(&[
                "storage quota exceeded; the transaction was rolled back: ",
                m,
            ]),
            StoreError::Transaction(m) => {
                agentstore_protocol::cat(&["IndexedDB transaction failed: ", m])
            }
            StoreError::Blocked(name, ms) => {
                let ms = agentstore_protocol::canonical::decimal(u64::from(*ms));
                agentstore_protocol::cat(&[
                    "\"",
                    name,
                    "\": the open or deletion did not complete within ",
                    &ms,
                    " ms: another tab's connection blocks (or is queued ahead of) it",
                ])
            }
            StoreError::Closed(why) => agentstore_protocol::cat(&["the store is closed: ", why]),
            StoreError::Aborted(_) => "the operation was aborted".into(),
            StoreError::Thrown(_) => "the callback threw".into(),
        }
    }

    /// The protocol code of this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            StoreError::Validation { .. } | StoreError::Unreadable { .. } => ErrorCode::Validation,
            StoreError::Conflict { .. } | StoreError::BatchConflict { .. } => ErrorCode::Conflict,
            StoreError::NotFound(..) | StoreError::BatchNotFound { .. } => ErrorCode::NotFound,
            StoreError::QuotaExceeded(_) => ErrorCode::QuotaExceeded,
            StoreError::Transaction(_) => ErrorCode::Transaction,
            StoreError::Blocked(..) => ErrorCode::Blocked,
            StoreError::Closed(_) => ErrorCode::Closed,
            StoreError::Aborted(_) => ErrorCode::Aborted,
            StoreError::Thrown(_) => ErrorCode::Internal,
        }
    }

    /// Classifies a DOMException (or any thrown JS value) from IndexedDB.
    pub fn from_dom(value: &JsValue) -> Self {
        // Read through Reflect (which catches), also for a DOMException: a
        // getter that throws must not unwind through the module.
        let (name, message) = (
            get_str(value, "name").unwrap_or_default(),
            get_str(value, "message")
                .or_else(|| crate::value::text_prefix(value, crate::value::MAX_ARG_UNITS))
                .unwrap_or_default(),
        );
        // An InvalidStateError is not taken as a closed connection: Firefox
        // also throws one from `put` in the first readwrite transaction
        // after a quota abort, on a connection that is open (js/promise.js
        // `afterQuota` uses that transaction up). Only
        // `IDBDatabase.transaction()` throwing it says the connection closed
        // (src/store/db.rs `Db::tx`).
        match name.as_str() {
            "QuotaExceededError" => StoreError::QuotaExceeded(message),
            "DataError" | "DataCloneError" => {
                StoreError::validation(agentstore_protocol::cat(&[&name, ": ", &message]))
            }
            _ => StoreError::Transaction(agentstore_protocol::cat(&[&name, ": ", &message])),
        }
    }

    /// Builds the JS `Error` object for this error.
    pub fn to_js(&self) -> JsValue {
        if let StoreError::Thrown(v) = self {
            return v.clone();
        }
        let code = self.code();
        let err = js_sys::Error::new(&self.message());
        err.set_name(code.js_name());
        let o: &JsValue = err.as_ref();
        set(o, "code", &code.as_str().into());
        set(o, "status", &JsValue::from(code.status()));
        match self {
            StoreError::Conflict {
                id,
                expected_rev,
                current_rev,
                current,
                attempts,
                ..
            } => {
                set(o, "id", id);
                set(o, "expectedRev", &opt_str(expected_rev));
                set(o, "currentRev", &opt_str(current_rev));
                set(o, "current", current);
                if let Some(n) = attempts {
                    set(o, "attempts", &JsValue::from(*n));
                }
            }
            StoreError::NotFound(id, _) => set(o, "id", id),
            StoreError::BatchConflict { failures } | StoreError::BatchNotFound { failures } => {
                set(o, "failures", &failures_to_js(failures))
            }
            StoreError::Validation { failures, .. } if !failures.is_empty() => {
                set(o, "failures", &failures_to_js(failures))
            }
            StoreError::Aborted(reason) | StoreError::Unreadable { cause: reason, .. } => {
                set(o, "cause", reason)
            }
            _ => {}
        }
        err.into()
    }
}

impl From<String> for StoreError {
    /// A validation error with this message (option readers build these).
    fn from(message: String) -> Self {
        StoreError::validation(message)
    }
}

impl From<StoreError> for JsValue {
    fn from(e: StoreError) -> JsValue {
        e.to_js()
    }
}

fn failures_to_js(failures: &[BatchFailure]) -> JsValue {
    let arr = Array::new();
    for f in failures {
        let o = Object::new();
        set(&o, "index", &JsValue::from(f.index as u32));
        set(&o, "id", &f.id);
        set(&o, "message", &f.message.as_str().into());
        // The three codes a failure can have (`as_str` would keep every
        // code's text in the store-only build).
        let code = match f.code {
            ErrorCode::NotFound => "not_found",
            ErrorCode::Conflict => "conflict",
            _ => "validation",
        };
        set(&o, "code", &code.into());
        if f.expected_rev.is_some() || f.current_rev.is_some() {
            set(&o, "expectedRev", &opt_str(&f.expected_rev));
            set(&o, "currentRev", &opt_str(&f.current_rev));
        }
        arr.push(&o);
    }
    arr.into()
}

/// The JS function `(DOMException) => Error` that turns a failed read's
/// exception into its typed Error (`StoreError::from_dom(e).to_js()`), for
/// the reads whose Promise is made in JS (src/store/db.rs `Req::answer`).
/// Made once per module instance and kept for its life.
pub(crate) fn dom_error_fn() -> JsValue {
    thread_local! {
        static TO_ERROR: JsValue = wasm_bindgen::closure::Closure::<dyn Fn(JsValue) -> JsValue>::new(
            |e: JsValue| StoreError::from_dom(&e).to_js(),
        )
        .into_js_value();
    }
    TO_ERROR.with(JsValue::clone)
}

fn opt_str(s: &Option<String>) -> JsValue {
    s.as_deref().map_or(JsValue::NULL, JsValue::from)
}

/// Makes `value` the own data property `key` of `obj` (js/promise.js
/// `own`: defined, not assigned, so that an accessor or read-only property
/// of that name on `Object.prototype` cannot swallow it), ignoring failures
/// (only possible on non-extensible objects, which are never passed).
pub(crate) fn set(obj: &JsValue, key: &str, value: &JsValue) {
    own(obj, key, value);
}

#[wasm_bindgen::prelude::wasm_bindgen(module = "/js/promise.js")]
extern "C" {
    fn own(o: &JsValue, key: &str, value: &JsValue);
}

/// Reads `obj[key]` as a string, if it is one: at most its first 64 Ki
/// UTF-16 code units ([`crate::value::MAX_ARG_UNITS`]; an error's `message`
/// may be any length, and wasm memory never shrinks).
pub(crate) fn get_str(obj: &JsValue, key: &str) -> Option<String> {
    // `Reflect.get` throws for a non-object (`from_dom(null)`: the `error`
    // of a transaction the module aborted), and a throw through a `catch`
    // import returning a value leaks a table slot (js/promise.js
    // `callInto1`): two per aborted purge before.
    if !obj.is_object() && !obj.is_function() {
        return None;
    }
    let v = crate::value::get(obj, &JsValue::from_str(key)).ok()?;
    crate::value::text_prefix(&v, crate::value::MAX_ARG_UNITS)
}

/// Result alias for the SDK.
pub type Result<T> = std::result::Result<T, StoreError>;
