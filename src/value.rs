//! The write path's one walk over a JS record.
//!
//! [`walk_record`] visits the value once, in JavaScript (`js/walk.js`: one
//! call across the boundary per record, where a walk in wasm made about
//! fifteen per field), and in that pass: refuses what JSON cannot carry
//! (functions, symbols, BigInt, NaN/±Infinity, cycles, `undefined` inside
//! arrays, non-plain objects such as `Date`/`Map`, a getter that throws),
//! checks the types of the top-level fields, writes the canonical JSON body
//! and builds the object to store: a deep copy made of plain objects and
//! arrays holding exactly what `JSON.stringify` would see (`-0` as `0`).
//! Storing that copy instead of the caller's object means a `Proxy` or an
//! object with getters is stored as plain data, and IndexedDB's structured
//! clone never meets a value it cannot clone in the middle of a write.
//! Object fields whose value is `undefined` are treated as absent, as
//! `JSON.stringify` does. This side hashes the body (its byte count is the
//! size check) and checks `_id`, `_rev` and `updatedAt` with the protocol
//! crate's rules; no float formatting is compiled into the module.

use crate::error::StoreError;
use agentstore_protocol::canonical::{decimal, BodyDigest};
use agentstore_protocol::record::{
    is_iso_millis_shape, is_iso_millis_utc, BAD_UPDATED_AT, MAX_RECORD_BYTES,
    RECORD_TYPE_NOT_STRING, RESERVED_FIELD, REV_NOT_STRING, TOO_LARGE,
};
use agentstore_protocol::rev::Rev;
use js_sys::{Array, JsString, Object};
use wasm_bindgen::{JsCast, JsValue};

/// Bytes reserved for `,"updatedAt":"…"` when checking the size limit (the
/// timestamp is decided inside the write transaction).
const UPDATED_AT_BYTES: usize = 40;

/// A record that passed validation, ready for a write transaction.
pub struct Walked {
    /// The object to store: a plain deep copy (`_rev`/`updatedAt` are set at
    /// write time).
    pub object: Object,
    /// `_id` as a JS string (may hold lone surrogates).
    pub id: JsString,
    /// The `_rev` the caller wrote against.
    pub rev: Option<Rev>,
    /// The caller's `updatedAt`, when given.
    pub updated_at: Option<String>,
    /// `updated_at` names a day its month does not have (`2026-02-30…`),
    /// which releases before the day check accepted and may have stored:
    /// such a value may only be the stored record's, copied back, which
    /// `put` replaces by now ([`bad_updated_at`] otherwise).
    pub updated_at_unreal: bool,
    /// md5 hex of the canonical body without `_rev` and `updatedAt`.
    pub digest: String,
}

/// Why a walk stopped: a static reason and the path to the field, innermost
/// segment first (built only on failure).
struct Fail {
    why: &'static str,
    /// Extra text after `why` (a constructor's name), when any.
    detail: Option<String>,
    path: Vec<Seg>,
}

enum Seg {
    Key(String),
    Index(u32),
}

impl Fail {
    fn new(why: &'static str) -> Fail {
        Fail {
            why,
            detail: None,
            path: Vec::new(),
        }
    }

    fn at(mut self, seg: Seg) -> Fail {
        self.path.push(seg);
        self
    }

    /// `field a.b[2]: why` (or just `why` at the top), without `core::fmt`.
    fn into_error(self) -> StoreError {
        let mut msg = String::new();
        if !self.path.is_empty() {
            msg.push_str("field ");
            for (i, seg) in self.path.iter().rev().enumerate() {
                match seg {
                    Seg::Key(k) => {
                        if i > 0 {
                            msg.push('.');
                        }
                        msg.push_str(k);
                    }
                    Seg::Index(n) => {
                        msg.push('[');
                        msg.push_str(&decimal(u64::from(*n)));
                        msg.push(']');
                    }
                }
            }
            msg.push_str(": ");
        }
        msg.push_str(self.why);
        if let Some(d) = self.detail {
            msg.push_str(&d);
        }
        StoreError::validation(msg)
    }
}

type Walk<T> = std::result::Result<T, Fail>;

/// The reasons of `js/walk.js`'s failure codes, by code.
const WHY: [&str; 18] = [
    GETTER_THREW,
    "a property getter threw",
    TOO_LARGE,
    "NaN and Infinity are not finite numbers and cannot be stored as JSON",
    "undefined cannot be stored as JSON (use null)",
    "BigInt cannot be stored as JSON; store it as a string or a Number",
    "a Symbol cannot be stored as JSON",
    "a function cannot be stored as JSON",
    "this value cannot be stored as JSON",
    "nesting deeper than 64 levels",
    "a cyclic reference cannot be stored as JSON",
    "not a plain JSON object (convert it first, e.g. a Date with toISOString()): ",
    REV_NOT_STRING,
    BAD_UPDATED_AT,
    RECORD_TYPE_NOT_STRING,
    RESERVED_FIELD,
    "a record must be a plain object",
    "a value with a toJSON method cannot be stored; store what toJSON returns",
];

#[wasm_bindgen::prelude::wasm_bindgen(module = "/js/walk.js")]
extern "C" {
    /// `walkRecord(record)`: `[copy, bodyPieces, id, rev, updatedAt]` or
    /// `[code, path, detail]` (see js/walk.js).
    #[wasm_bindgen(js_name = walkRecord, catch)]
    fn walk_record_js(record: &JsValue) -> Result<Array, JsValue>;
    /// `walkedId()`: the `_id` value the last `walkRecord` read.
    #[wasm_bindgen(js_name = walkedId)]
    pub(crate) fn walked_id() -> JsValue;
    /// `shallowCopy(o)`: the copy or `[code, path, detail]` (see js/walk.js).
    #[wasm_bindgen(js_name = shallowCopy, catch)]
    fn shallow_copy_js(o: &JsValue) -> Result<JsValue, JsValue>;
    /// `walkValue(v)`: `[copy]` or `[code, path, detail]` (see js/walk.js).
    #[cfg(feature = "lease")]
    #[wasm_bindgen(js_name = walkValue, catch)]
    fn walk_value_js(v: &JsValue) -> Result<Array, JsValue>;
}

/// A plain copy of `v`, any JSON value (a lease's settle result), read once
/// with the record walk's rules (DESIGN.md, Records: what JSON cannot carry
/// — NaN/±Infinity, `undefined` in an array, a function, a Symbol, a BigInt,
/// a cycle, a `Date` or `Map`, a `toJSON` method, a getter that throws, over
/// 64 levels or 64 MiB — is refused, never silently changed, where
/// `JSON.stringify` would write `null` or `{}` or drop it). Object fields
/// holding `undefined` are absent, as in records.
///
/// # Errors
/// ValidationError naming the field, as [`walk_record`]'s.
#[cfg(feature = "lease")]
pub(crate) fn json_value(v: &JsValue) -> crate::error::Result<JsValue> {
    let out = walk_value_js(v).map_err(|_| StoreError::validation(GETTER_THREW))?;
    match out.get(0).as_f64() {
        Some(code) if out.length() > 1 => Err(walk_failure(code, &out)),
        _ => match lone_surrogate_at(&out.get(0)).dyn_into::<Array>() {
            Ok(path) => {
                let mut fail =
                    Fail::new("a lone surrogate (half of a UTF-16 pair) cannot be sent as JSON");
                at_path(&mut fail, &path);
                Err(fail.into_error())
            }
            Err(_) => Ok(out.get(0)),
        },
    }
}

#[cfg(feature = "lease")]
#[wasm_bindgen::prelude::wasm_bindgen(module = "/js/lease.js")]
extern "C" {
    /// The path to the first string or key of `v` (a walked copy) holding a
    /// lone surrogate, else `undefined` (js/lease.js `loneSurrogateAt`).
    #[wasm_bindgen(js_name = loneSurrogateAt)]
    fn lone_surrogate_at(v: &JsValue) -> JsValue;
}

/// Walks a record for `put`: see the module docs. The walk itself runs in
/// JavaScript (`js/walk.js`, one call per record); this side hashes the
/// canonical body it wrote and checks `_id`, `_rev`, `updatedAt` and the
/// size with the protocol crate's rules.
///
/// # Errors
/// ValidationError naming the field, e.g.
/// `"field data.items[2]: BigInt cannot be stored as JSON; …"`.
pub fn walk_record(record: &JsValue) -> crate::error::Result<Walked> {
    let out = walk_record_js(record).map_err(|_| StoreError::validation(GETTER_THREW))?;
    let first = out.get(0);
    if let Some(code) = first.as_f64() {
        return Err(walk_failure(code, &out));
    }
    let top = |key: &str, why: &'static str| Fail::new(why).at(Seg::Key(key.into())).into_error();
    let rev = match out.get(3) {
        v if v.is_undefined() => None,
        v => Some(
            short_string(&v, MAX_REV_TEXT)
                .and_then(|s| Rev::parse(&s).ok())
                .ok_or_else(|| top("_rev", "_rev is not a revision"))?,
        ),
    };
    let updated_at = match out.get(4) {
        v if v.is_undefined() => None,
        v => Some(
            v.as_string()
                .filter(|s| is_iso_millis_shape(s))
                .ok_or_else(bad_updated_at)?,
        ),
    };
    let updated_at_unreal = updated_at.as_deref().is_some_and(|s| !is_iso_millis_utc(s));
    // The body arrives in pieces: each is copied into wasm memory (which
    // never shrinks), hashed and dropped before the next.
    let mut digest = BodyDigest::new();
    for piece in Array::from(&out.get(1)).iter() {
        digest.raw(piece.as_string().unwrap_or_default().as_bytes());
        if digest.len() + UPDATED_AT_BYTES > MAX_RECORD_BYTES {
            return Err(StoreError::validation(TOO_LARGE));
        }
    }
    let id = crate::store::check_id_value(&out.get(2))?;
    Ok(Walked {
        object: first.unchecked_into(),
        id,
        rev,
        updated_at,
        updated_at_unreal,
        digest: digest.finish(),
    })
}

/// The ValidationError of an `updatedAt` that is not an ISO-8601 UTC
/// instant with milliseconds naming a day its month has (field `updatedAt`).
pub fn bad_updated_at() -> StoreError {
    Fail::new(BAD_UPDATED_AT)
        .at(Seg::Key("updatedAt".into()))
        .into_error()
}

/// The ValidationError of js/walk.js's failure `[code, path, detail]`.
fn walk_failure(code: f64, out: &Array) -> StoreError {
    let mut fail = Fail::new(WHY.get(code as usize).copied().unwrap_or(GETTER_THREW));
    fail.detail = Some(name(&out.get(2))).filter(|d| !d.is_empty());
    at_path(&mut fail, &Array::from(&out.get(1)));
    fail.into_error()
}

/// Sets `fail`'s path from `path` (keys and indexes outermost first, as
/// js/walk.js lists them; `Fail` keeps it innermost first). Inlined in the
/// store build, where it has one caller whose code then stays as it was
/// (a call measured +71 B gzip there); the lease build has two.
#[cfg_attr(not(feature = "lease"), inline(always))]
fn at_path(fail: &mut Fail, path: &Array) {
    for seg in path.iter() {
        fail.path.insert(
            0,
            match seg.as_f64() {
                Some(i) => Seg::Index(i as u32),
                None => Seg::Key(name(&seg)),
            },
        );
    }
}

/// Whether `text`, the JS string `js` read into Rust, may have lost a lone
/// surrogate to U+FFFD: it holds U+FFFD (a byte scan: `str::contains`
/// brings in the two-way string searcher, ~1.3 kB of wasm) and `js` is not
/// known to be well-formed. A genuine U+FFFD is common (decoded tool
/// output): `isWellFormed` (one call) settles those; without it (older
/// browsers) the answer is "maybe".
fn may_be_lossy(text: &str, js: &JsValue) -> bool {
    text.as_bytes().windows(3).any(|w| w == [0xEF, 0xBF, 0xBD])
        && !is_well_formed_js(js).unwrap_or(false)
}

/// `v` as a Rust string when the conversion loses nothing: `None` for a
/// non-string and for one holding a lone surrogate, which the conversion
/// would turn into U+FFFD (two different names would then be one). For
/// names: the store name, index names and keys, `legacyIndexId`.
/// Longer strings are refused (the caller gets `None`) before anything is
/// copied: see [`MAX_ARG_UNITS`].
pub(crate) fn exact_string(v: &JsValue) -> Option<String> {
    let text = short_string(v, MAX_ARG_UNITS)?;
    let exact = !may_be_lossy(&text, v)
        || !agentstore_protocol::keys::has_lone_surrogate(&units(v.unchecked_ref()));
    exact.then_some(text)
}

/// A getter or Proxy trap of the caller's value threw while it was read.
const GETTER_THREW: &str = "reading this value threw (a getter or a Proxy trap)";

// Reads of caller-supplied values that can run caller code (getters, Proxy
// traps) go through bindings with `catch`: an exception thrown through a
// binding without it unwinds the wasm stack and leaves the module's async
// task half-run. js_sys's `Array::is_array` and `Array::get`/`length` have
// no `catch`.
#[wasm_bindgen::prelude::wasm_bindgen]
extern "C" {
    #[wasm_bindgen(js_namespace = Array, js_name = isArray, catch)]
    fn is_array_js(v: &JsValue) -> Result<bool, JsValue>;
    /// `String.prototype.isWellFormed.call(s)` (throws where it is missing).
    #[wasm_bindgen(js_namespace = ["String", "prototype", "isWellFormed"], js_name = call, catch)]
    fn is_well_formed_js(s: &JsValue) -> Result<bool, JsValue>;
}

/// `Array.isArray(v)`; a revoked Proxy (which makes it throw) is a
/// ValidationError.
///
/// # Errors
/// ValidationError when reading `v` threw.
pub(crate) fn is_array(v: &JsValue) -> crate::error::Result<bool> {
    is_array_js(v).map_err(|_| StoreError::validation(GETTER_THREW))
}

/// The elements of the array `v`, each read once, or a ValidationError when
/// it has more than `max` or reading it threw.
///
/// # Errors
/// ValidationError (`too_many` when longer than `max`).
pub(crate) fn items(
    v: &Array,
    max: usize,
    too_many: &'static str,
) -> crate::error::Result<Vec<JsValue>> {
    let len = length(v).map_err(Fail::into_error)?;
    if len as usize > max {
        return Err(StoreError::validation(too_many));
    }
    let mut out = Vec::with_capacity(len as usize);
    for i in 0..len {
        match get(v, &JsValue::from(i)) {
            Ok(item) => out.push(item),
            Err(_) => return Err(Fail::new(GETTER_THREW).at(Seg::Index(i)).into_error()),
        }
    }
    Ok(out)
}

/// `v.length` as an array length (read once; a throwing trap is a failure).
fn length(v: &Array) -> Walk<u32> {
    get(v, &"length".into())
        .ok()
        .and_then(|n| n.as_f64())
        .filter(|n| (0.0..=f64::from(u32::MAX)).contains(n))
        .map(|n| n as u32)
        .ok_or_else(|| Fail::new(GETTER_THREW))
}

/// A field name or constructor name for an error message: its first 256
/// UTF-16 units (a name may be any length; only that much is copied).
fn name(v: &JsValue) -> String {
    text_prefix(v, 256).unwrap_or_default()
}

/// The longest revision text: a generation below 2^53 (16 digits), `-`
/// and at most 64 hex digits, with room to spare.
pub(crate) const MAX_REV_TEXT: u32 = 96;

/// `v` as a Rust string when it is a JS string of at most `max_units`
/// UTF-16 units; `None` otherwise. The length is read first, so a huge
/// string is refused without being copied into wasm memory (which never
/// shrinks).
pub(crate) fn short_string(v: &JsValue, max_units: u32) -> Option<String> {
    bounded(v, max_units).map(String::from)
}

/// A plain copy of `obj`'s own fields (one level, each read once, no
/// prototype), for a value that is walked afterwards and must not be read
/// twice (js/walk.js `shallowCopy`).
///
/// # Errors
/// ValidationError when `obj` is not a plain object, has a `toJSON`, or
/// reading it threw.
pub(crate) fn shallow_copy(obj: &JsValue) -> crate::error::Result<Object> {
    let out = shallow_copy_js(obj).map_err(|_| StoreError::validation(GETTER_THREW))?;
    if is_array(&out)? {
        let out: &Array = out.unchecked_ref();
        return Err(walk_failure(out.get(0).as_f64().unwrap_or(0.0), out));
    }
    Ok(out.unchecked_into())
}

/// Longest string argument copied into the module's memory, in UTF-16
/// code units (64 Ki): names, prefixes, key parts, cursors, options.
/// Linear memory never shrinks, so a caller string of hundreds of MiB copied
/// in would keep the page that large for its life; longer ones are refused
/// with a ValidationError before the copy. (Record bodies are not arguments:
/// they are hashed piece by piece under [`MAX_RECORD_BYTES`].)
pub(crate) const MAX_ARG_UNITS: u32 = 1 << 16;

/// The message end for a string argument that is not one ([`exact_string`]).
pub(crate) const STRING_ARG: &str =
    " must be a string without lone surrogates, at most 65,536 UTF-16 code units long";

/// `v` as a JS string of at most `max_units` UTF-16 code units (its length
/// is read without copying it).
pub(crate) fn bounded(v: &JsValue, max_units: u32) -> Option<&JsString> {
    v.dyn_ref::<JsString>().filter(|s| s.length() <= max_units)
}

/// The first `max_units` UTF-16 code units of `v` when it is a string (cut
/// in JS, so only they are copied into wasm memory), e.g. an error's
/// `message`; a lone surrogate left at the cut becomes U+FFFD.
pub(crate) fn text_prefix(v: &JsValue, max_units: u32) -> Option<String> {
    Some(String::from(v.dyn_ref::<JsString>()?.slice(0, max_units)))
}

/// The UTF-16 code units of a JS string (lone surrogates included).
pub fn units(s: &JsString) -> Vec<u16> {
    // A loop, not `s.iter().collect()` (its adapters were 347 bytes).
    let n = s.length();
    let mut v = Vec::with_capacity(n as usize);
    for i in 0..n {
        v.push(s.char_code_at(i) as u16);
    }
    v
}

/// A JS string from UTF-16 code units (may contain lone surrogates).
pub fn from_units(units: &[u16]) -> JsString {
    // String.fromCharCode takes its units as arguments; stay well under
    // engines' argument limits by joining chunks.
    let mut s = JsString::from("");
    for c in units.chunks(4096) {
        s = s.concat(&JsString::from_char_code(c));
    }
    s
}

/// `v` as a Promise when it is one or a thenable (a Promise of another realm,
/// a library's `PromiseLike`: anything with a callable `then`, as the
/// Promises/A+ "thenable" rule and `await` itself treat it), adopted by a
/// new Promise ([`adopt`]); `None` for any other value.
pub(crate) fn as_promise(v: &JsValue) -> Option<js_sys::Promise> {
    let thenable = v.dyn_ref::<js_sys::Promise>().is_some()
        || ((v.is_object() || v.is_function())
            && get(v, &"then".into()).is_ok_and(|t| t.is_function()));
    thenable.then(|| adopt(v))
}

/// A new Promise that settles as `v` does (`new Promise(r => r(v))`).
///
/// Unlike `Promise.resolve(v)`, which reads `v.constructor` and may hand `v`
/// itself back, and unlike `v.then(…)`, nothing of `v` can throw past the
/// call: `resolve(v)` reads `v.then` at once, and a getter that throws there
/// rejects the new Promise; the `then` it found runs in a later job, and
/// what it throws (or an object that only claims Promise's prototype) rejects
/// the new Promise too (js/promise.js).
pub(crate) fn adopt(v: &JsValue) -> js_sys::Promise {
    adopt_js(v)
}

/// `f.call(this, a)`: what it returned, or `Err` with what it threw.
/// Use it (not js-sys `Function::call1`) for functions that may throw: see
/// js/promise.js `callInto1` (a throw through a `catch` import that
/// returns a value leaks an externref table slot).
pub(crate) fn call1(f: &js_sys::Function, this: &JsValue, a: &JsValue) -> Result<JsValue, JsValue> {
    call_into1(f, this, a)?;
    Ok(take_called())
}

/// `f.call(this)`, as [`call1`].
pub(crate) fn call0(f: &js_sys::Function, this: &JsValue) -> Result<JsValue, JsValue> {
    call_into0(f, this)?;
    Ok(take_called())
}

/// `Reflect.get(o, k)`: the value, or `Err` with what a getter or Proxy trap
/// threw (or the TypeError for an `o` that is not an object). Use it, not
/// js-sys `Reflect::get`, on anything the page made (see [`call1`]): the
/// crate's clippy.toml refuses js-sys's.
pub(crate) fn get(o: &JsValue, k: &JsValue) -> Result<JsValue, JsValue> {
    get_into(o, k)?;
    Ok(take_called())
}

/// `new Request(input, init)`: the Request, or `Err` with what the
/// constructor threw (a TypeError; see [`call1`]).
#[cfg(feature = "lease")]
pub(crate) fn new_request(input: &JsValue, init: &JsValue) -> Result<JsValue, JsValue> {
    request_into(input, init)?;
    Ok(take_called())
}

/// `f.call(this, a, b)`, as [`call1`].
pub(crate) fn call2(
    f: &js_sys::Function,
    this: &JsValue,
    a: &JsValue,
    b: &JsValue,
) -> Result<JsValue, JsValue> {
    call_into2(f, this, a, b)?;
    Ok(take_called())
}

#[wasm_bindgen::prelude::wasm_bindgen(module = "/js/promise.js")]
extern "C" {
    #[wasm_bindgen(catch, js_name = callInto0)]
    fn call_into0(f: &js_sys::Function, this: &JsValue) -> Result<(), JsValue>;
    #[wasm_bindgen(catch, js_name = getInto)]
    fn get_into(o: &JsValue, k: &JsValue) -> Result<(), JsValue>;
    #[cfg(feature = "lease")]
    #[wasm_bindgen(catch, js_name = requestInto)]
    fn request_into(input: &JsValue, init: &JsValue) -> Result<(), JsValue>;
    #[wasm_bindgen(catch, js_name = callInto1)]
    fn call_into1(f: &js_sys::Function, this: &JsValue, a: &JsValue) -> Result<(), JsValue>;
    #[wasm_bindgen(catch, js_name = callInto2)]
    fn call_into2(
        f: &js_sys::Function,
        this: &JsValue,
        a: &JsValue,
        b: &JsValue,
    ) -> Result<(), JsValue>;
    #[wasm_bindgen(js_name = takeCalled)]
    fn take_called() -> JsValue;
    #[wasm_bindgen(js_name = adopt)]
    fn adopt_js(v: &JsValue) -> js_sys::Promise;
    /// Whether `v` is a `class` of any realm: `class.prototype`'s getter
    /// `getter` accepts it (js/promise.js `isA`).
    #[wasm_bindgen(js_name = isA)]
    fn is_a_js(v: &JsValue, class: &str, getter: &str) -> bool;
}

/// Whether `v` is a `class` object (`"Blob"`, `"Response"`,
/// `"ReadableStream"`, `"AbortSignal"`) of any realm, told by its internal
/// slots as `class.prototype`'s getter `getter` checks them (a brand check),
/// where `dyn_ref`/`instanceof` would refuse one made by an iframe or
/// another same-origin window (its prototypes are its own) and accept an
/// object that only claims the prototype. Never throws.
pub(crate) fn is_a(v: &JsValue, class: &str, getter: &str) -> bool {
    v.is_object() && is_a_js(v, class, getter)
}
