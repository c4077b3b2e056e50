//! Import sources read line by line without copying them into wasm memory:
//! a JS string, a `Blob`, a `Response` or a `ReadableStream` of bytes. Lines
//! stay JS strings and are parsed by the browser's `JSON.parse`, so the
//! module's linear memory does not grow with the data.

//!
//! The import options and [`check_source`] are built into every module: the
//! entry points check an import's arguments before they load the io module
//! (`crate::api`), which holds the rest.
#![cfg_attr(not(feature = "io"), allow(dead_code))]

#[cfg(feature = "io")]
use super::mutate::race_abort_or_close;
#[cfg(feature = "io")]
use super::Store;
use crate::error::{Result, StoreError};
use crate::value::is_a;
use js_sys::{Array, Function, JsString};
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use web_sys::AbortSignal;

/// Records per import transaction (and per export chunk) unless told otherwise.
pub const DEFAULT_BATCH: u32 = 1000;
/// Largest accepted `batch`.
pub const MAX_IMPORT_BATCH: u32 = 10_000;

/// Options of an import (and, as [`ExportOptions`], of an export).
#[derive(Debug, Clone)]
pub struct ImportOptions {
    /// Called as `(done, total)`: by an import after each committed batch
    /// (`done` counts ids done, `total` the ids the import resolves to); by
    /// an export after each batch read (objects exported, and the records
    /// and tombstones it holds).
    pub on_progress: Option<Function>,
    /// Stops the import between batches (an export before each read and
    /// each callback) with AbortError.
    pub signal: Option<AbortSignal>,
    /// Records per transaction (objects per export read and chunk),
    /// 1..=[`MAX_IMPORT_BATCH`].
    pub batch: u32,
}

/// Options of an export: `on_progress`, `signal` and `batch`, as an
/// import's (see [`ImportOptions`] for what each means to an export).
pub type ExportOptions = ImportOptions;

impl Default for ImportOptions {
    fn default() -> Self {
        ImportOptions {
            on_progress: None,
            signal: None,
            batch: DEFAULT_BATCH,
        }
    }
}

/// The ValidationError message for a source of another type.
const SOURCE_TYPES: &str = "an import takes a string, Blob, Response or ReadableStream";

#[cfg(feature = "io")]
#[wasm_bindgen(module = "/js/parse.js")]
extern "C" {
    /// Whether `Object.prototype.toString.call(v)` is `"[object
    /// Uint8Array]"`, false when it throws (a `Symbol.toStringTag` getter;
    /// js/parse.js `taggedUint8Array`: a bool, so a throw keeps no table
    /// slot, see `value::call1`).
    #[wasm_bindgen(js_name = taggedUint8Array)]
    fn tagged_uint8_array(v: &JsValue) -> bool;
}

#[wasm_bindgen]
extern "C" {
    /// `JSON.parse` on a JS string (js_sys's binding takes a Rust `&str`,
    /// which would copy every line into linear memory).
    #[wasm_bindgen(js_namespace = JSON, js_name = parse, catch)]
    pub(crate) fn json_parse(text: &JsString) -> std::result::Result<JsValue, JsValue>;

    #[wasm_bindgen(js_name = Blob)]
    #[derive(Clone)]
    pub(crate) type JsBlob;
    #[wasm_bindgen(constructor, js_class = "Blob", catch)]
    pub(crate) fn new(parts: &Array) -> std::result::Result<JsBlob, JsValue>;
    // `pipeThrough`, `getReader` and `read` are called on the caller's
    // objects (a stream's own methods may be replaced, and then what they
    // answer is anything), and `stream` on a Blob the SDK made: each
    // binding catches, so a throw is an import error instead of an unwind
    // through the module.
    #[wasm_bindgen(method, catch, js_class = "Blob")]
    fn stream(this: &JsBlob) -> std::result::Result<JsReadableStream, JsValue>;

    #[wasm_bindgen(js_name = Response)]
    #[derive(Clone)]
    type JsResponse;

    #[wasm_bindgen(js_name = ReadableStream)]
    type JsReadableStream;
    #[wasm_bindgen(method, catch, js_class = "ReadableStream", js_name = pipeThrough)]
    fn pipe_through(
        this: &JsReadableStream,
        transform: &JsTextDecoderStream,
    ) -> std::result::Result<JsReadableStream, JsValue>;
    #[wasm_bindgen(method, catch, js_class = "ReadableStream", js_name = getReader)]
    fn get_reader(this: &JsReadableStream) -> std::result::Result<JsReader, JsValue>;

    type JsReader;

    #[wasm_bindgen(js_name = TransformStream)]
    type JsTransformStream;
    #[wasm_bindgen(constructor, js_class = "TransformStream", catch)]
    fn new() -> std::result::Result<JsTransformStream, JsValue>;

    #[wasm_bindgen(js_name = TextDecoderStream)]
    type JsTextDecoderStream;
    #[wasm_bindgen(constructor, catch, js_class = "TextDecoderStream")]
    fn new(label: &str, options: &JsValue) -> std::result::Result<JsTextDecoderStream, JsValue>;
}

/// An import source that can be read more than once (imports read it twice:
/// once to validate and choose winners, once to write them).
#[cfg(feature = "io")]
pub(crate) enum Source {
    /// A JS string.
    Text(JsString),
    /// A `Blob` the SDK made (over the caller's Blob, or a `Response` or
    /// `ReadableStream` first collected into one, outside wasm memory), so
    /// that every read of it gives the same bytes.
    Blob(JsBlob),
}

/// What an import source is, without reading it.
enum Kind<'a> {
    Text(&'a JsString),
    Blob(&'a JsBlob),
    /// A Response's `body`, as read (once) for its checks.
    Response(JsValue),
    Stream,
}

/// `v[key]`; a throwing getter means `v` is not a source.
fn prop(v: &JsValue, key: &str) -> Result<JsValue> {
    crate::value::get(v, &key.into()).map_err(|_| StoreError::validation(SOURCE_TYPES))
}

fn kind(v: &JsValue) -> Result<Kind<'_>> {
    if let Some(s) = v.dyn_ref::<JsString>() {
        return Ok(Kind::Text(s));
    }
    // Told by their internal slots, not `instanceof` (`dyn_ref`): a Blob,
    // Response or stream made by an iframe or another same-origin window
    // has that realm's prototypes and is as good as this realm's, while an
    // object that only claims the prototype is none of them.
    if is_a(v, "Blob", "size") {
        return Ok(Kind::Blob(v.unchecked_ref()));
    }
    // `ok`, `bodyUsed`, `body` and `locked` are read with Reflect (which
    // catches): an own getter the caller put on the object may throw, which
    // must not unwind through the module's frames.
    if is_a(v, "Response", "ok") {
        let r: &JsResponse = v.unchecked_ref();
        // `fetch` resolves for an HTTP error too: its body (an error page,
        // or nothing) is not the data asked for, and an empty one would
        // import as an empty source.
        if !prop(r, "ok")?.is_truthy() {
            let status = prop(r, "status")?.as_f64().unwrap_or(0.0);
            let n = agentstore_protocol::canonical::decimal(status as u64);
            return Err(StoreError::validation(agentstore_protocol::cat(&[
                "the import source is an HTTP ",
                &n,
                " response (its ok is false)",
            ])));
        }
        if prop(r, "bodyUsed")?.is_truthy() {
            return Err(StoreError::validation("the Response body was already read"));
        }
        let body = prop(r, "body")?;
        if body.is_object() && prop(&body, "locked")?.is_truthy() {
            return Err(StoreError::validation(
                "the Response body is locked (it is already being read)",
            ));
        }
        return Ok(Kind::Response(body));
    }
    if is_a(v, "ReadableStream", "locked") {
        if prop(v, "locked")?.is_truthy() {
            return Err(StoreError::validation(
                "the ReadableStream is locked (it is already being read)",
            ));
        }
        return Ok(Kind::Stream);
    }
    Err(StoreError::validation(SOURCE_TYPES))
}

/// `Ok` for a value an import can read (a string, `Blob`, unread `Response`
/// or `ReadableStream`), without reading it.
///
/// # Errors
/// ValidationError as [`Source::from_js`] gives it.
pub(crate) fn check_source(v: &JsValue) -> Result<()> {
    kind(v).map(|_| ())
}

/// Whether `v` is a Uint8Array of any realm (an iframe's too, where
/// `instanceof Uint8Array` is false). `ArrayBuffer.isView` looks at the
/// internal slots (the Blob it goes into takes its bytes, never its text),
/// and `Object.prototype.toString` names the view's type, refusing the
/// other typed arrays and DataViews.
#[cfg(feature = "io")]
fn is_uint8_array(v: &JsValue) -> bool {
    js_sys::ArrayBuffer::is_view(v) && tagged_uint8_array(v)
}

/// The ValidationError message for a stream chunk whose `byteLength` could
/// not be read as a number (an own getter that throws or lies).
#[cfg(feature = "io")]
const CHUNK_UNREADABLE: &str =
    "reading a chunk of the import source's stream threw (its byteLength getter)";

/// How many bytes of a stream source are collected as chunks before they
/// are folded into one Blob (see [`Source::from_js`]).
#[cfg(feature = "io")]
const FOLD_BYTES: u32 = 4 << 20;

#[cfg(feature = "io")]
impl Source {
    /// Accepts a string, `Blob` (or `File`), `Response` or `ReadableStream`.
    /// Each is read from what was checked: a Blob through a Blob made over
    /// it (the caller's own `stream`, `text` or `slice` are never called),
    /// a Response's `body` as its getter answered this module's checks
    /// (read once here; the JS entry point's own checks read it once
    /// before, and what is imported is what this read answered, checked).
    ///
    /// A stream is collected for an import into `store`: each read is raced
    /// with `signal` and with the store's closing, so `close()` (or an
    /// abort) ends the collection at once, also while the stream stalls,
    /// and cancels the stream, which then stops.
    ///
    /// # Errors
    /// ValidationError for any other value, a used-up `Response` body or
    /// one of an HTTP error; the stream's own error while it is collected;
    /// AbortError; the store's ClosedError.
    pub(crate) async fn from_js(
        v: &JsValue,
        signal: Option<&AbortSignal>,
        store: &Store,
    ) -> Result<Source> {
        let body = match kind(v)? {
            Kind::Text(s) => return Ok(Source::Text(s.clone())),
            // Read through a Blob of the SDK's own: its bytes are the
            // caller's (a Blob of a Blob copies none), but its `stream` is
            // `Blob.prototype.stream`, so both passes read the same bytes.
            // The caller's own object may have had its `stream` (or `text`,
            // `slice`…) replaced by one that answers other bytes on the
            // second call, which pass 2 would then write unchecked.
            Kind::Blob(b) => {
                return JsBlob::new(&Array::of1(b))
                    .map(Source::Blob)
                    .map_err(|e| unreadable(&e))
            }
            Kind::Response(body) => body,
            Kind::Stream => v.clone(),
        };
        // No body (`new Response(null)`, a 204): an empty source.
        if body.is_null() {
            return Ok(Source::Text(JsString::from("")));
        }
        // (Of the Response's realm, which may be another's.)
        if !is_a(&body, "ReadableStream", "locked") {
            return Err(StoreError::validation(SOURCE_TYPES));
        }
        let body: JsReadableStream = body.unchecked_into();
        // With a signal, the body is collected through a pipe the signal
        // aborts: an aborted import cancels its source instead of reading on
        // (a body that never ends would grow memory after the rejection).
        // The pipe errors its output with the source's own error.
        let body = match signal {
            Some(sig) => {
                let opts = js_sys::Object::new();
                crate::error::set(&opts, "signal", sig);
                let pipe = JsTransformStream::new().map_err(|e| unreadable(&e))?;
                call_method(&body, "pipeThrough", &[&pipe, &opts])
                    .map_err(|e| unreadable(&e))?
                    .unchecked_into()
            }
            None => body,
        };
        // Collected chunk by chunk into a Blob (by the browser, outside wasm
        // memory) rather than by `Response.blob()`, which rejects with a
        // TypeError of its own ("Failed to fetch") and drops the stream's.
        let reader: JsReader = call_method(&body, "getReader", &[])
            .map_err(|e| unreadable(&e))?
            .unchecked_into();
        let parts = Array::new();
        let mut pending = 0u32;
        loop {
            let Some(chunk) = read_step(&reader, signal, store).await? else {
                break;
            };
            if !is_uint8_array(&chunk) {
                return Err(StoreError::validation(
                    "the import source's stream must give Uint8Array chunks (UTF-8 bytes)",
                ));
            }
            // Counted by `byteLength` read with Reflect (which catches): the
            // chunk is the caller's, and an own getter on it may throw,
            // which must not unwind through the module's frames (the Blob
            // below takes the bytes from the view's internal slots).
            let size = crate::value::get(&chunk, &"byteLength".into())
                .ok()
                .and_then(|n| n.as_f64())
                .ok_or_else(|| StoreError::validation(CHUNK_UNREADABLE))?;
            pending = pending.saturating_add(size as u32);
            parts.push(&chunk);
            // Folded into a Blob every 4 MiB (a Blob of Blobs copies no
            // bytes): the chunks do not pile up in the JS heap until the
            // end, and the browser's blob storage may page them to disk.
            if pending >= FOLD_BYTES {
                let blob = JsBlob::new(&parts).map_err(|e| unreadable(&e))?;
                parts.set_length(0);
                parts.push(&blob);
                pending = 0;
            }
        }
        JsBlob::new(&parts)
            .map(Source::Blob)
            .map_err(|e| unreadable(&e))
    }

    /// A fresh reader from the first line, for an import into `store`;
    /// each chunk read is raced with `signal` and with the store's closing.
    ///
    /// # Errors
    /// ValidationError when the Blob cannot be read as a stream.
    pub(crate) fn lines<'a>(
        &self,
        signal: Option<AbortSignal>,
        store: &'a Store,
    ) -> Result<Lines<'a>> {
        Ok(match self {
            Source::Text(s) => Lines::new(s.clone(), None, signal, store),
            Source::Blob(b) => {
                // `fatal`: bytes that are not UTF-8 are an error naming
                // the source, not U+FFFD written under the revision of a
                // body that held other bytes (the decoder's default).
                let options = js_sys::Object::new();
                crate::error::set(&options, "fatal", &JsValue::TRUE);
                let text =
                    JsTextDecoderStream::new("utf-8", &options).map_err(|e| unreadable(&e))?;
                let reader = b
                    .stream()
                    .and_then(|s| s.pipe_through(&text))
                    .and_then(|s| s.get_reader())
                    .map_err(|e| unreadable(&e))?;
                Lines::new(JsString::from(""), Some(reader), signal, store)
            }
        })
    }
}

/// Lines of a source, `\n`-separated (a trailing `\r` is trimmed by the
/// caller's `trim`), each a JS string.
#[cfg(feature = "io")]
pub(crate) struct Lines<'a> {
    reader: Option<JsReader>,
    buf: JsString,
    pos: u32,
    /// Pieces of the current line from earlier chunks (joined once, so a
    /// very long line costs linear time).
    carry: Array,
    /// 1-based number of the line last returned.
    pub(crate) number: usize,
    signal: Option<AbortSignal>,
    /// The store imported into: its closing ends a read (a Blob's reader
    /// waits on the browser).
    store: &'a Store,
}

#[cfg(feature = "io")]
impl<'a> Lines<'a> {
    fn new(
        buf: JsString,
        reader: Option<JsReader>,
        signal: Option<AbortSignal>,
        store: &'a Store,
    ) -> Lines<'a> {
        Lines {
            reader,
            buf,
            pos: 0,
            carry: Array::new(),
            number: 0,
            signal,
            store,
        }
    }

    /// The next line, or `None` at the end.
    ///
    /// # Errors
    /// The stream's error (as thrown), for a Blob that cannot be read;
    /// AbortError; the store's ClosedError.
    pub(crate) async fn next(&mut self) -> Result<Option<JsString>> {
        loop {
            let len = self.buf.length();
            if self.pos < len {
                let idx = self.buf.index_of("\n", self.pos as i32);
                if idx >= 0 {
                    let piece = self.buf.slice(self.pos, idx as u32);
                    self.pos = idx as u32 + 1;
                    return Ok(Some(self.take(piece)));
                }
                self.carry.push(&self.buf.slice(self.pos, len));
                self.pos = len;
            }
            let Some(reader) = &self.reader else {
                if self.carry.length() == 0 {
                    return Ok(None);
                }
                return Ok(Some(self.take(JsString::from(""))));
            };
            match read_step(reader, self.signal.as_ref(), self.store).await? {
                None => self.reader = None,
                Some(v) => {
                    self.buf = v.dyn_into().unwrap_or_else(|_| JsString::from(""));
                    self.pos = 0;
                }
            }
        }
    }

    fn take(&mut self, piece: JsString) -> JsString {
        self.number += 1;
        if self.carry.length() == 0 {
            return piece;
        }
        self.carry.push(&piece);
        let line = self.carry.join("");
        self.carry = Array::new();
        line
    }
}

/// The next chunk `reader` gives (`None` at the end), raced with `signal`
/// and with the closing of `store`. When the store is closed, or either
/// ends the wait, the reader is cancelled: a source no longer read (a
/// stream that stalls, or one that would go on for ever) stops.
///
/// # Errors
/// As [`unreadable`] for a read that fails; AbortError from `signal`; the
/// store's ClosedError.
#[cfg(feature = "io")]
async fn read_step(
    reader: &JsReader,
    signal: Option<&AbortSignal>,
    store: &Store,
) -> Result<Option<JsValue>> {
    let raced = async {
        // Not read on after `close()` (nothing would be written).
        store.check_open()?;
        // Adopted by a new Promise: a `read` that answers a non-Promise (or
        // a thenable that throws) is a rejection here.
        let read = call_method(reader, "read", &[]).map_err(|e| unreadable(&e))?;
        race_abort_or_close(crate::value::adopt(&read), signal, store).await
    };
    let step = match raced.await {
        Ok(step) => step.map_err(|e| unreadable(&e))?,
        Err(e) => {
            cancel(reader);
            return Err(e);
        }
    };
    if !step.is_object() {
        // Not a reader's `{done, value}` (a replaced `read`): an error, not a
        // loop reading nothing forever.
        return Err(unreadable(&JsValue::from_str(
            "a read answered a non-object",
        )));
    }
    if crate::value::get(&step, &"done".into()).is_ok_and(|d| d.is_truthy()) {
        return Ok(None);
    }
    Ok(Some(
        crate::value::get(&step, &"value".into()).unwrap_or_default(),
    ))
}

#[cfg(feature = "io")]
impl Drop for Lines<'_> {
    /// A source left before its end (an import that stopped reading once
    /// every record was written, or that failed) is cancelled: its pipe
    /// stops now, not when it is collected.
    fn drop(&mut self) {
        if let Some(reader) = self.reader.take() {
            cancel(&reader);
        }
    }
}

/// `o[name](...args)` on the caller's stream or reader (its methods may be
/// replaced): looked up and called through src/value.rs, so a throw keeps
/// no slot of the externref table (a `catch` method binding returning a
/// value kept one per throw, e.g. `getReader` of a locked stream).
///
/// # Errors
/// What the lookup or the call threw, or a message when `o[name]` is not a
/// function.
#[cfg(feature = "io")]
fn call_method(
    o: &JsValue,
    name: &str,
    args: &[&JsValue],
) -> std::result::Result<JsValue, JsValue> {
    let f = crate::value::get(o, &name.into())?;
    let Some(f) = f.dyn_ref::<js_sys::Function>() else {
        return Err(JsValue::from_str(&agentstore_protocol::cat(&[
            name,
            " is not a function",
        ])));
    };
    match args {
        [] => crate::value::call0(f, o),
        [a] => crate::value::call1(f, o, a),
        [a, b, ..] => crate::value::call2(f, o, a, b),
    }
}

/// Cancels `reader`'s stream (the caller's, or a pipe from it, which passes
/// the cancellation on to the caller's), so that it stops; what `cancel`
/// throws or rejects with (a replaced `cancel`, a source whose own `cancel`
/// fails) is dropped, not left as an unhandled rejection.
#[cfg(feature = "io")]
fn cancel(reader: &JsReader) {
    if let Ok(done) = call_method(reader, "cancel", &[]) {
        let done = wasm_bindgen_futures::JsFuture::from(crate::value::adopt(&done));
        wasm_bindgen_futures::spawn_local(async move {
            let _ = done.await;
        });
    }
}

/// The import source failed while it was read (a fetch aborted or cut off
/// mid-body, a `File` that became unreadable, a stream that errored): an
/// AbortError when it was aborted, else a ValidationError naming what the
/// platform said, with that error as its `cause`. Either way a real `Error`
/// with the SDK's `code`.
#[cfg(feature = "io")]
fn unreadable(e: &JsValue) -> StoreError {
    let name = crate::error::get_str(e, "name").unwrap_or_default();
    if name == "AbortError" {
        return StoreError::Aborted(e.clone());
    }
    // A stream may error with any value, a string included.
    let message = crate::error::get_str(e, "message")
        .or_else(|| crate::value::text_prefix(e, crate::value::MAX_ARG_UNITS))
        .unwrap_or_default();
    // Neither (a stream errored with `null`, a Symbol, a number…): the
    // value itself is the error's `cause`.
    let message = match (name.is_empty(), message.is_empty()) {
        (true, true) => "a value that is not an Error: see cause".to_owned(),
        _ => message,
    };
    let sep = if name.is_empty() { "" } else { ": " };
    StoreError::Unreadable {
        message: agentstore_protocol::cat(&[
            "the import source could not be read (",
            &name,
            sep,
            &message,
            ")",
        ]),
        cause: e.clone(),
    }
}
