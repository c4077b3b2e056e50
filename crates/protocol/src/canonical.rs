//! The canonical JSON of a record body, streamed into its digest.
//!
//! The SDK walks a JS value once and feeds each token here; nothing builds a
//! JSON tree or a JSON string. The bytes fed are exactly what
//! [`crate::record::canonical_body`] produces for the same body (object keys
//! sorted by their UTF-8 bytes, no whitespace, serde_json's string escapes,
//! integers up to 2^53 written as integers), so natively and in the browser
//! the digest is the same. [`BodyDigest::len`] counts those bytes: the size
//! limit reads the same pass.

use md5::{Digest, Md5};

/// Largest integer magnitude written as an integer (2^53).
pub const SAFE_INT: f64 = 9_007_199_254_740_992.0;

/// An MD5 digest of canonical JSON being written, and its length in bytes.
#[derive(Clone, Default)]
pub struct BodyDigest {
    md5: Md5,
    len: usize,
}

impl BodyDigest {
    /// An empty digest.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds raw bytes: punctuation (`{ } [ ] , :`), `null`, `true`,
    /// `false` or a number's text.
    pub fn raw(&mut self, bytes: &[u8]) {
        self.md5.update(bytes);
        self.len += bytes.len();
    }

    /// Feeds a finite number: an integer of magnitude ≤ 2^53 as its decimal
    /// digits; anything else through `fallback` (the SDK passes JavaScript's
    /// `String(n)`, so no float formatting is compiled into the wasm).
    ///
    /// Returns `false` (feeding nothing) for NaN and ±Infinity.
    pub fn number(&mut self, n: f64, fallback: impl FnOnce(f64) -> String) -> bool {
        if !n.is_finite() {
            return false;
        }
        if n.fract() == 0.0 && n.abs() <= SAFE_INT {
            let mut buf = [0u8; 20];
            let digits = itoa(n.abs() as u64, &mut buf);
            if n < 0.0 {
                self.raw(b"-");
            }
            self.raw(digits);
        } else {
            self.raw(fallback(n).as_bytes());
        }
        true
    }

    /// Feeds a JSON string literal (quotes and escapes included), escaped as
    /// serde_json does: `\"`, `\\`, `\b \f \n \r \t`, other control
    /// characters as `\u00xx`; everything else as UTF-8.
    pub fn string(&mut self, s: &str) {
        self.raw(b"\"");
        self.string_body(s);
        self.raw(b"\"");
    }

    /// Feeds a JSON string literal given as UTF-16 code units, which may
    /// hold lone surrogates (JavaScript strings can): each lone surrogate is
    /// written as the escape `\udxxx` (lower-case hex), as ECMAScript's
    /// well-formed `JSON.stringify` writes it (ES2019, "JSON superset" and
    /// "well-formed JSON.stringify" proposals); everything else as
    /// [`BodyDigest::string`]. Two strings that differ only in which lone
    /// surrogate (or U+FFFD) they hold therefore digest differently.
    pub fn string_utf16(&mut self, units: &[u16]) {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        self.raw(b"\"");
        let mut run = String::new();
        for c in char::decode_utf16(units.iter().copied()) {
            match c {
                Ok(c) => run.push(c),
                Err(lone) => {
                    self.string_body(&run);
                    run.clear();
                    let u = lone.unpaired_surrogate();
                    self.raw(&[
                        b'\\',
                        b'u',
                        HEX[usize::from(u >> 12)],
                        HEX[usize::from((u >> 8) & 15)],
                        HEX[usize::from((u >> 4) & 15)],
                        HEX[usize::from(u & 15)],
                    ]);
                }
            }
        }
        self.string_body(&run);
        self.raw(b"\"");
    }

    /// The escaped content of a JSON string literal, without the quotes.
    fn string_body(&mut self, s: &str) {
        escape_json(s, &mut |p| self.raw(p.as_bytes()));
    }

    /// Bytes fed so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing was fed.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The digest as 32 lower-case hex characters.
    pub fn finish(self) -> String {
        hex(&self.md5.finalize())
    }
}

/// Feeds `emit` the content of `s` as a JSON string literal (without the
/// quotes), escaped as serde_json escapes it: `\"`, `\\`, `\b \f \n \r \t`,
/// other control characters (below U+0020) as `\u00xx` in lower-case hex,
/// everything else as it is. The pieces, in order, are runs of `s` and
/// escapes; the digest and the index tag's text both write through this.
pub fn escape_json(s: &str, emit: &mut dyn FnMut(&str)) {
    const HEX: &str = "0123456789abcdef";
    let mut start = 0;
    for (i, b) in s.bytes().enumerate() {
        let esc = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            0x08 => "\\b",
            0x0c => "\\f",
            0..=0x1f => "\\u00",
            _ => continue,
        };
        emit(&s[start..i]);
        emit(esc);
        if esc.len() == 4 {
            let (hi, lo) = (usize::from(b >> 4), usize::from(b & 15));
            emit(&HEX[hi..=hi]);
            emit(&HEX[lo..=lo]);
        }
        start = i + 1;
    }
    emit(&s[start..]);
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(HEX[usize::from(b >> 4)]));
        out.push(char::from(HEX[usize::from(b & 15)]));
    }
    out
}

/// The decimal digits of `n`, written at the end of `buf` (no `core::fmt`).
pub fn itoa(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[i..];
        }
    }
}

/// [`itoa`] as text, for messages and revision parts built by
/// concatenation (no `format!`; the digits are ASCII, so each byte is its
/// own `char` and no UTF-8 check is needed).
pub fn decimal(n: u64) -> String {
    let mut s = String::new();
    for &d in itoa(n, &mut [0; 20]) {
        s.push(char::from(d));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::canonical_body;
    use serde_json::{json, Value};

    #[test]
    fn every_character_is_escaped_as_serde_json_escapes_it() {
        let mut s: String = (0u8..0x80).map(char::from).collect();
        s.push_str("\u{e9}\u{7ff}\u{ffff}\u{1f600}\"x\\");
        for text in [s.as_str(), "", "plain", "\u{1f}", "a\"", "\\b"] {
            let mut out = String::from("\"");
            escape_json(text, &mut |p| out.push_str(p));
            out.push('"');
            assert_eq!(out, serde_json::to_string(text).unwrap(), "{text:?}");
        }
    }

    /// Streams a serde_json value the way the SDK streams a JS value.
    fn feed(d: &mut BodyDigest, v: &Value) {
        match v {
            Value::Null => d.raw(b"null"),
            Value::Bool(b) => d.raw(if *b { b"true" } else { b"false" }),
            Value::Number(n) => {
                assert!(d.number(n.as_f64().unwrap(), |f| serde_json::to_string(&f).unwrap()));
            }
            Value::String(s) => d.string(s),
            Value::Array(items) => {
                d.raw(b"[");
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        d.raw(b",");
                    }
                    feed(d, item);
                }
                d.raw(b"]");
            }
            Value::Object(map) => {
                d.raw(b"{");
                for (i, (k, item)) in map.iter().enumerate() {
                    if i > 0 {
                        d.raw(b",");
                    }
                    d.string(k);
                    d.raw(b":");
                    feed(d, item);
                }
                d.raw(b"}");
            }
        }
    }

    #[test]
    fn streamed_bytes_equal_the_canonical_body() {
        let body = json!({
            "_id": "a/\"quoted\"\\slash",
            "n": [0, -1, 9007199254740992_i64, 1.5, -0.25, 1e300],
            "s": "tab\there\nnew \u{1} \u{1f} \u{7f} é 😀",
            "o": {"z": null, "a": true, "m": false},
        });
        let expected = canonical_body(body.as_object().unwrap());
        let mut d = BodyDigest::new();
        feed(&mut d, &body);
        assert_eq!(d.len(), expected.len());
        let mut whole = BodyDigest::new();
        whole.raw(expected.as_bytes());
        assert_eq!(d.finish(), whole.finish());
    }

    #[test]
    fn lone_surrogates_digest_as_their_json_stringify_escapes() {
        let digest = |units: &[u16]| {
            let mut d = BodyDigest::new();
            d.string_utf16(units);
            (d.len(), d.finish())
        };
        let text = |t: &str| {
            let mut d = BodyDigest::new();
            d.raw(t.as_bytes());
            (d.len(), d.finish())
        };
        // "a\ud800b" as JSON.stringify writes it; a pair stays one character.
        assert_eq!(digest(&[0x61, 0xd800, 0x62]), text("\"a\\ud800b\""));
        assert_eq!(digest(&[0xdc00]), text("\"\\udc00\""));
        assert_eq!(digest(&[0xd83d, 0xde00, 0x22]), text("\"😀\\\"\""));
        // Distinct lone surrogates and U+FFFD digest apart.
        let all = [digest(&[0xd800]), digest(&[0xdc00]), digest(&[0xfffd])];
        assert!(all[0] != all[1] && all[1] != all[2] && all[0] != all[2]);
        // Well-formed input digests exactly as `string`.
        let mut d = BodyDigest::new();
        d.string("é\n");
        assert_eq!(digest(&[0xe9, 0x0a]).1, d.finish());
    }

    #[test]
    fn non_finite_numbers_are_refused() {
        let mut d = BodyDigest::new();
        for n in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            assert!(!d.number(n, |_| unreachable!()));
        }
        assert!(d.is_empty());
    }

    #[test]
    fn integers_are_written_without_formatting() {
        let mut buf = [0u8; 20];
        assert_eq!(itoa(0, &mut buf), b"0");
        assert_eq!(itoa(u64::MAX, &mut buf), b"18446744073709551615");
        assert_eq!(decimal(0), "0");
        assert_eq!(decimal(413), "413");
        assert_eq!(decimal(u64::MAX), "18446744073709551615");
        assert_eq!(hex(&[0x0a, 0xff]), "0aff");
    }
}
