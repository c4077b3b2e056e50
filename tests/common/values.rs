//! Helpers for the tests that hand the SDK caller values through its JS API,
//! shared by the store and lease suites (`#[path]`-included by both).
#![allow(dead_code)]

use wasm_bindgen::JsCast;

/// Bytes of the module's linear memory (it never shrinks).
pub fn wasm_memory_bytes() -> f64 {
    let memory: js_sys::WebAssembly::Memory = wasm_bindgen::memory().unchecked_into();
    js_sys::ArrayBuffer::from(memory.buffer()).byte_length() as f64
}

/// A JS async function `settle(f)` for test bodies: `'ok'` when `f()`
/// resolves, else the rejection's `code` (or `name`), or `'not an Error'`.
pub const SETTLE_JS: &str = "const settle = async (f) => { \
    try { await f(); return 'ok'; } \
    catch (e) { return e instanceof Error ? (e.code ?? e.name) : 'not an Error'; } };";
