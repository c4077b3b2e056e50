//! Helpers for the tests that hand the SDK caller values through its JS API,
//! shared by the store and lease suites (`#[path]`-included by both).
#![allow(dead_code)]

use wasm_bindgen::{JsCast, JsValue};

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

/// Accessors without a setter on `Object.prototype` for the given names
/// (a page's polyfill or pollution), removed again when dropped.
pub struct PrototypeGetters(JsValue);

impl PrototypeGetters {
    pub fn install(names: &[&str]) -> PrototypeGetters {
        let names: js_sys::Array = names.iter().map(|n| JsValue::from_str(n)).collect();
        js_sys::Function::new_with_args(
            "names",
            "for (const k of names) Object.defineProperty(Object.prototype, k, \
             { get() { return undefined; }, configurable: true });",
        )
        .call1(&JsValue::NULL, &names)
        .expect("install");
        PrototypeGetters(names.into())
    }
}

impl Drop for PrototypeGetters {
    fn drop(&mut self) {
        js_sys::Function::new_with_args(
            "names",
            "for (const k of names) delete Object.prototype[k];",
        )
        .call1(&JsValue::NULL, &self.0)
        .expect("remove");
    }
}

/// `v`'s OWN property `k` (`undefined` when it has none: an inherited
/// accessor does not count).
pub fn own(v: &JsValue, k: &str) -> JsValue {
    let d: JsValue =
        js_sys::Object::get_own_property_descriptor(v.unchecked_ref::<js_sys::Object>(), &k.into());
    if d.is_undefined() {
        d
    } else {
        js_sys::Reflect::get(&d, &"value".into()).unwrap_or_default()
    }
}
