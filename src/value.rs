//! JS value ⇄ JSON rules on the write path.
//!
//! [`to_json`] walks a JS value once, refusing what JSON cannot carry
//! (functions, symbols, BigInt, NaN/±Infinity, cycles, `undefined` inside
//! arrays, non-plain objects such as `Date`/`Map`), and yields the
//! [`serde_json::Value`] used for validation and revision hashing. Object
//! fields whose value is `undefined` are treated as absent, as
//! `JSON.stringify` does. Read paths never come through here: stored objects
//! are handed to JS as IndexedDB returns them.

use agentstore_protocol::record::MAX_DEPTH;
use js_sys::{Array, JsString, Object, Reflect};
use serde_json::{Map, Number, Value};
use wasm_bindgen::{JsCast, JsValue};

/// Largest integer magnitude written as an integer in canonical JSON (2^53).
const SAFE_INT: f64 = 9_007_199_254_740_992.0;

/// Converts a JS value to JSON, or says at which path and why it cannot be.
///
/// # Errors
/// A message like `"field data.items[2]: BigInt cannot be stored as JSON …"`.
pub fn to_json(v: &JsValue) -> Result<Value, String> {
    let mut ancestors = Vec::new();
    walk(v, &mut String::new(), &mut ancestors)
}

fn walk(v: &JsValue, path: &mut String, ancestors: &mut Vec<JsValue>) -> Result<Value, String> {
    if v.is_null() {
        return Ok(Value::Null);
    }
    if let Some(b) = v.as_bool() {
        return Ok(Value::Bool(b));
    }
    if let Some(n) = v.as_f64() {
        return number(n).ok_or_else(|| {
            at(
                path,
                &format!("{n} is not a finite number and cannot be stored as JSON"),
            )
        });
    }
    if let Some(s) = v.as_string() {
        return Ok(Value::String(s));
    }
    if v.is_undefined() {
        return Err(at(path, "undefined cannot be stored as JSON (use null)"));
    }
    if v.is_bigint() {
        return Err(at(
            path,
            "BigInt cannot be stored as JSON; store it as a string or a Number",
        ));
    }
    if v.is_symbol() {
        return Err(at(path, "a Symbol cannot be stored as JSON"));
    }
    if v.is_function() {
        return Err(at(path, "a function cannot be stored as JSON"));
    }
    if !v.is_object() {
        return Err(at(path, "this value cannot be stored as JSON"));
    }
    if ancestors.len() >= MAX_DEPTH {
        return Err(at(path, &format!("nesting deeper than {MAX_DEPTH} levels")));
    }
    if ancestors.iter().any(|a| Object::is(a, v)) {
        return Err(at(path, "a cyclic reference cannot be stored as JSON"));
    }
    ancestors.push(v.clone());
    let out = if Array::is_array(v) {
        let arr: &Array = v.unchecked_ref();
        let mut items = Vec::with_capacity(arr.length() as usize);
        for (i, item) in arr.iter().enumerate() {
            let len = path.len();
            path.push_str(&format!("[{i}]"));
            items.push(walk(&item, path, ancestors)?);
            path.truncate(len);
        }
        Value::Array(items)
    } else {
        let obj: &Object = v.unchecked_ref();
        check_plain(obj, path)?;
        let mut map = Map::new();
        for key in Object::keys(obj).iter() {
            let Some(k) = key.as_string() else { continue };
            let item = Reflect::get(obj, &key).map_err(|_| at(path, "a property getter threw"))?;
            if item.is_undefined() {
                continue;
            }
            let len = path.len();
            if !path.is_empty() {
                path.push('.');
            }
            path.push_str(&k);
            let value = walk(&item, path, ancestors)?;
            path.truncate(len);
            map.insert(k, value);
        }
        Value::Object(map)
    };
    ancestors.pop();
    Ok(out)
}

/// Only plain objects (prototype `Object.prototype` or `null`) are JSON objects;
/// `Date`, `Map`, `Set`, typed arrays and class instances would be silently
/// changed by JSON, so they are refused.
fn check_plain(obj: &Object, path: &str) -> Result<(), String> {
    let proto = Object::get_prototype_of(obj);
    if proto.is_null() {
        return Ok(());
    }
    let object_proto = Object::get_prototype_of(&Object::new());
    if Object::is(&proto, &object_proto) {
        return Ok(());
    }
    let ctor = Reflect::get(obj, &"constructor".into())
        .ok()
        .and_then(|c| Reflect::get(&c, &"name".into()).ok())
        .and_then(|n| n.as_string())
        .unwrap_or_else(|| "object".into());
    Err(at(path, &format!("a {ctor} is not a plain JSON object (convert it first, e.g. a Date with toISOString())")))
}

fn number(n: f64) -> Option<Value> {
    if !n.is_finite() {
        return None;
    }
    if n.fract() == 0.0 && n.abs() <= SAFE_INT {
        return Some(Value::Number(Number::from(n as i64)));
    }
    Number::from_f64(n).map(Value::Number)
}

fn at(path: &str, why: &str) -> String {
    if path.is_empty() {
        why.to_owned()
    } else {
        format!("field {path}: {why}")
    }
}

/// The UTF-16 code units of a JS string (lone surrogates included).
pub fn units(s: &JsString) -> Vec<u16> {
    s.iter().collect()
}

/// A JS string from UTF-16 code units (may contain lone surrogates).
pub fn from_units(units: &[u16]) -> JsString {
    // String.fromCharCode takes its units as arguments; stay well under
    // engines' argument limits by joining chunks.
    units
        .chunks(4096)
        .map(JsString::from_char_code)
        .fold(JsString::from(""), |acc, s| acc.concat(&s))
}
