//! Pure rules shared by the agentstore SDK (wasm) and the lease server.
//!
//! Nothing here touches a browser, a clock or a database: time and randomness
//! come in as arguments so every rule is tested with plain `cargo test`.

pub mod backoff;
pub mod canonical;
pub mod error;
pub mod index;
pub mod keys;
pub mod lease;
pub mod lease_client;
pub mod pouch;
pub mod record;
pub mod rev;
pub mod vecmap;

pub use error::{ErrorBody, ErrorCode};

/// `parts` joined with nothing between them, as `parts.concat()` gives them.
///
/// Messages are built with this instead of `[..].concat()`: std's
/// `join_generic_copy` behind `concat` is 877 bytes of wasm with its
/// specialised separator copies, this loop a tenth of that.
pub fn cat(parts: &[&str]) -> String {
    let mut n = 0;
    for p in parts {
        n += p.len();
    }
    let mut s = String::with_capacity(n);
    for p in parts {
        s.push_str(p);
    }
    s
}

/// Whether every byte of `s` passes `ok` (`s.bytes().all(ok)`, as a loop
/// over a function pointer: one body for every check of an ASCII alphabet
/// instead of one `try_fold` per closure).
pub fn only(s: &str, ok: fn(u8) -> bool) -> bool {
    for b in s.bytes() {
        if !ok(b) {
            return false;
        }
    }
    true
}

/// `s` as UTF-16 code units (`s.encode_utf16().collect()`, as a loop: the
/// adapter and its `from_iter` were 486 bytes of wasm).
pub fn utf16(s: &str) -> Vec<u16> {
    let mut v = Vec::with_capacity(s.len());
    let mut buf = [0u16; 2];
    for c in s.chars() {
        v.extend_from_slice(c.encode_utf16(&mut buf));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf16_gives_the_units_encode_utf16_gives() {
        for s in [
            "",
            "a",
            "é",
            "\u{7ff}",
            "\u{ffff}",
            "x\u{1f600}y",
            "i@0a\u{10ffff}",
        ] {
            assert_eq!(utf16(s), s.encode_utf16().collect::<Vec<_>>(), "{s:?}");
        }
    }

    #[test]
    fn only_is_bytes_all() {
        let digit: fn(u8) -> bool = |b| b.is_ascii_digit();
        for s in ["", "0", "09", "0a", "a0", "١", "12 3"] {
            assert_eq!(only(s, digit), s.bytes().all(digit), "{s:?}");
        }
        assert_eq!(cat(&["a", "", "bc"]), "abc");
    }
}
