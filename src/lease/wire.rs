//! The wire types the lease client exchanges as JS values: the answers it
//! decodes (claim, heartbeat, batched heartbeat and credential answers from
//! `response.json()`, and journal entries from IndexedDB), read field by
//! field, and the request bodies and journal entries it writes, built field
//! by field (a body is then sent as `JSON.stringify` of it).
//!
//! Each field is read once (`Reflect.get`), and a string is copied into wasm
//! memory only when it is at most [`MAX_TEXT`] UTF-16 units (the length is
//! read first): a page's own `fetch` wrapper may answer with a 40 MB
//! `token`, and another script of the origin may write anything into the
//! journal, and wasm memory never shrinks. Fields the client does not use
//! (an item's `payload`, `result`, `last_error`) are never read.
//!
//! Not serde-wasm-bindgen: its deserializer reports a mismatched field
//! through serde's `Unexpected`, whose `Display` formats floats, and that
//! alone kept 9.5 kB of float formatting code in the module (`twiggy
//! dominators`, BENCHMARKS.md, sixteenth round); its serializer, for five
//! small bodies, kept serde's serializer machinery and a field-name cache
//! (a `HashMap`) in it. The names written and read here are the serde names
//! of the protocol types (crates/protocol/src/lease.rs), which the server
//! decodes with serde.

use agentstore_protocol::lease::{
    BatchHeartbeatRequest, BatchHeartbeatResponse, BatchHeartbeatResult, ClaimedRef, EnrollRequest,
    HeartbeatResponse, ItemRef, Lease, RefreshRequest, TokenRequest, WorkerCredentials,
};
use agentstore_protocol::{ErrorBody, ErrorCode};
use js_sys::{Array, Object};
use wasm_bindgen::{JsCast, JsValue};

use super::journal::Entry;

/// Longest string field decoded (UTF-16 units); a lease token is 43.
pub const MAX_TEXT: u32 = 8192;
/// Most entries of a batched heartbeat answer decoded (the client sends at
/// most 500 a batch).
const MAX_RESULTS: u32 = 10_000;
/// `Number.MAX_SAFE_INTEGER` (2^53 − 1): integers above it are not exact.
const MAX_SAFE: f64 = 9_007_199_254_740_991.0;

/// A wire type read from a JS value.
pub trait FromWire: Sized {
    /// `None` when a field the type needs is missing, of the wrong type, not
    /// an exact integer in range, or a string over [`MAX_TEXT`] units.
    fn from_wire(v: &JsValue) -> Option<Self>;
}

/// `v[k]`, or `undefined` when `v` is not an object or the read throws.
pub(crate) fn field(v: &JsValue, k: &str) -> JsValue {
    crate::value::get(v, &k.into()).unwrap_or(JsValue::UNDEFINED)
}

/// A safe integer (`Number.isSafeInteger`).
fn int(v: &JsValue, k: &str) -> Option<i64> {
    let n = field(v, k).as_f64()?;
    (n.fract() == 0.0 && n.abs() <= MAX_SAFE).then_some(n as i64)
}

/// A non-negative safe integer.
fn uint(v: &JsValue, k: &str) -> Option<u64> {
    int(v, k).and_then(|n| u64::try_from(n).ok())
}

/// A string of at most [`MAX_TEXT`] units.
fn text(v: &JsValue, k: &str) -> Option<String> {
    crate::value::short_string(&field(v, k), MAX_TEXT)
}

impl FromWire for ItemRef {
    fn from_wire(v: &JsValue) -> Option<ItemRef> {
        Some(ItemRef {
            id: int(v, "id")?,
            epoch: uint(v, "epoch")?,
        })
    }
}

impl FromWire for Lease {
    fn from_wire(v: &JsValue) -> Option<Lease> {
        Some(Lease {
            token: text(v, "token")?,
            epoch: uint(v, "epoch")?,
            ttl_ms: uint(v, "ttl_ms")?,
            heartbeat_ms: uint(v, "heartbeat_ms")?,
        })
    }
}

impl FromWire for ClaimedRef {
    fn from_wire(v: &JsValue) -> Option<ClaimedRef> {
        Some(ClaimedRef {
            item: ItemRef::from_wire(&field(v, "item"))?,
            lease: Lease::from_wire(&field(v, "lease"))?,
        })
    }
}

impl FromWire for HeartbeatResponse {
    fn from_wire(v: &JsValue) -> Option<HeartbeatResponse> {
        Some(HeartbeatResponse {
            ttl_ms: uint(v, "ttl_ms")?,
        })
    }
}

impl FromWire for BatchHeartbeatResponse {
    fn from_wire(v: &JsValue) -> Option<BatchHeartbeatResponse> {
        // Read through catching calls: the answer comes from the page's
        // `fetch` (perhaps a wrapper's), and a revoked Proxy or a throwing
        // index getter must fail the answer, not throw through the module.
        let results = field(v, "results");
        if !crate::value::is_array(&results).ok()? {
            return None;
        }
        let results =
            crate::value::items(results.unchecked_ref(), MAX_RESULTS as usize, "").ok()?;
        // A loop, not `map(..).collect::<Option<_>>()` (its adapters were
        // about 1 kB of wasm).
        let mut out = Vec::with_capacity(results.len());
        for r in &results {
            out.push({
                let error = field(r, "error");
                // An error that is there but unreadable (a code this
                // client does not know) fails the whole answer, which is
                // then retried: it is never taken for a lost claim.
                let error = if error.is_undefined() || error.is_null() {
                    None
                } else {
                    Some(ErrorBody {
                        code: ErrorCode::parse(&text(&error, "code")?)?,
                        message: crate::value::text_prefix(&field(&error, "message"), MAX_TEXT)?,
                        settled: None,
                    })
                };
                BatchHeartbeatResult {
                    item_id: int(r, "item_id")?,
                    ok: field(r, "ok").as_bool()?,
                    ttl_ms: uint(r, "ttl_ms"),
                    error,
                }
            });
        }
        Some(BatchHeartbeatResponse { results: out })
    }
}

impl FromWire for WorkerCredentials {
    fn from_wire(v: &JsValue) -> Option<WorkerCredentials> {
        Some(WorkerCredentials {
            worker_id: int(v, "worker_id")?,
            access_token: text(v, "access_token")?,
            access_expires_in_ms: uint(v, "access_expires_in_ms")?,
            refresh_token: text(v, "refresh_token")?,
        })
    }
}

impl FromWire for Entry {
    fn from_wire(v: &JsValue) -> Option<Entry> {
        let locked = field(v, "locked");
        Some(Entry {
            base: text(v, "base")?,
            // Ids are positive: an entry naming another is not one of this
            // client's (a foreign writer's), and is left alone.
            item_id: int(v, "itemId").filter(|id| *id > 0)?,
            token: text(v, "token")?,
            epoch: uint(v, "epoch")?,
            queue: text(v, "queue")?,
            ttl_ms: uint(v, "ttlMs")?,
            heartbeat_ms: uint(v, "heartbeatMs")?,
            // Entries written before the field existed count as locked.
            locked: if locked.is_undefined() {
                true
            } else {
                locked.as_bool()?
            },
        })
    }
}

/// A wire type written as a JS value: a request body (sent as
/// `JSON.stringify` of it) or a journal entry (stored as a structured
/// clone). Integers are written as numbers (ids, epochs and durations are
/// below 2^53).
pub trait ToWire {
    /// The plain object.
    fn to_wire(&self) -> JsValue;
}

/// A plain object with `fields`.
fn object(fields: &[(&str, JsValue)]) -> JsValue {
    let o = Object::new();
    for (k, v) in fields {
        crate::error::set(&o, k, v);
    }
    o.into()
}

fn number<T: Into<i128> + Copy>(n: T) -> JsValue {
    JsValue::from(n.into() as f64)
}

impl ToWire for TokenRequest {
    fn to_wire(&self) -> JsValue {
        object(&[("token", self.token.as_str().into())])
    }
}

impl ToWire for BatchHeartbeatRequest {
    fn to_wire(&self) -> JsValue {
        let leases = Array::new();
        for l in &self.leases {
            leases.push(&object(&[
                ("item_id", number(l.item_id)),
                ("token", l.token.as_str().into()),
            ]));
        }
        object(&[("leases", leases.into())])
    }
}

impl ToWire for EnrollRequest {
    fn to_wire(&self) -> JsValue {
        let token = ("token", self.token.as_str().into());
        match &self.name {
            Some(name) => object(&[token, ("name", name.as_str().into())]),
            None => object(&[token]),
        }
    }
}

impl ToWire for RefreshRequest {
    fn to_wire(&self) -> JsValue {
        object(&[("refresh_token", self.refresh_token.as_str().into())])
    }
}

impl ToWire for Entry {
    fn to_wire(&self) -> JsValue {
        object(&[
            ("base", self.base.as_str().into()),
            ("itemId", number(self.item_id)),
            ("token", self.token.as_str().into()),
            ("epoch", number(self.epoch)),
            ("queue", self.queue.as_str().into()),
            ("ttlMs", number(self.ttl_ms)),
            ("heartbeatMs", number(self.heartbeat_ms)),
            ("locked", self.locked.into()),
        ])
    }
}
