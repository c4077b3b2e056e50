//! Key-range math on UTF-16 code units, and opaque keyset cursors.
//!
//! IndexedDB orders string keys by UTF-16 code units
//! (<https://w3c.github.io/IndexedDB/#compare-two-keys>), so every computation
//! here works on `[u16]`: a prefix's upper bound can be a lone surrogate, which
//! is a valid JS string but not a Rust `String`.

/// The exclusive upper bound of all strings starting with `prefix`: the prefix
/// with trailing 0xFFFF units dropped and its last unit incremented.
///
/// Returns `None` when there is no upper bound (empty prefix, or only 0xFFFF
/// units): the range is then "everything ≥ prefix". Never uses a sentinel
/// character such as U+FFF0/U+FFFF, which would cut off keys above it.
pub fn prefix_successor(prefix: &[u16]) -> Option<Vec<u16>> {
    let mut out = prefix.to_vec();
    while let Some(&last) = out.last() {
        if last == 0xFFFF {
            out.pop();
        } else {
            let n = out.len() - 1;
            out[n] = last + 1;
            return Some(out);
        }
    }
    None
}

/// Whether `key` starts with `prefix` (code-unit-wise).
pub fn has_prefix(key: &[u16], prefix: &[u16]) -> bool {
    key.starts_with(prefix)
}

const CURSOR_TAG: &str = "c1.";

/// Encodes the last key of a page as an opaque cursor string: `"c1."` followed
/// by four lower-case hex digits per UTF-16 unit (lone surrogates survive).
pub fn encode_cursor(key: &[u16]) -> String {
    let mut s = String::with_capacity(CURSOR_TAG.len() + key.len() * 4);
    s.push_str(CURSOR_TAG);
    push_units(&mut s, key);
    s
}

/// Appends the low `digits` hex digits of `v` (lower case, zero-padded).
pub(crate) fn push_hex(out: &mut String, v: u64, digits: u32) {
    for i in (0..digits).rev() {
        let d = ((v >> (i * 4)) & 0xF) as u8;
        out.push(char::from(if d < 10 { b'0' + d } else { b'a' - 10 + d }));
    }
}

/// Appends four lower-case hex digits per UTF-16 unit of `units`.
pub(crate) fn push_units(out: &mut String, units: &[u16]) {
    for unit in units {
        push_hex(out, u64::from(*unit), 4);
    }
}

/// The value of `digits` read as lower-case hex (`0-9a-f` only: no sign,
/// no upper case, so one value has exactly one text of a given length), or
/// `None` for any other byte, or for more than 16 digits (more than a
/// `u64` holds: `from_str_radix` refused them too).
pub(crate) fn hex_value(digits: &[u8]) -> Option<u64> {
    if digits.len() > 16 {
        return None;
    }
    let mut v = 0u64;
    for &d in digits {
        let n = match d {
            b'0'..=b'9' => d - b'0',
            b'a'..=b'f' => d - b'a' + 10,
            _ => return None,
        };
        v = v << 4 | u64::from(n);
    }
    Some(v)
}

/// The UTF-16 units written by [`push_units`] (four hex digits each), or
/// `None` when `hex` is not such a text.
pub(crate) fn hex_units(hex: &str) -> Option<Vec<u16>> {
    // A loop, not `chunks(4).map(..).collect()`: that compiled a
    // `GenericShunt`, its `try_fold` and a `from_iter` (about 700 B).
    let b = hex.as_bytes();
    if b.len() % 4 != 0 {
        return None;
    }
    let mut units = Vec::with_capacity(b.len() / 4);
    let mut i = 0;
    while i < b.len() {
        units.push(hex_value(&b[i..i + 4])? as u16);
        i += 4;
    }
    Some(units)
}

/// Whether `units` (UTF-16 code units) hold a lone surrogate: a high one
/// (0xD800–0xDBFF) not followed by a low one (0xDC00–0xDFFF), or a low one
/// not preceded by a high one. Such a string is a valid JS string but has
/// no UTF-8 form (a conversion turns it into U+FFFD).
pub fn has_lone_surrogate(units: &[u16]) -> bool {
    let mut i = 0;
    while let Some(&u) = units.get(i) {
        match u {
            0xD800..=0xDBFF if matches!(units.get(i + 1), Some(0xDC00..=0xDFFF)) => i += 2,
            0xD800..=0xDFFF => return true,
            _ => i += 1,
        }
    }
    false
}

/// The parts of `s` between `.`s, as `s.split('.')` gives them (an empty
/// part where two dots meet or at either end). Written over bytes: `'.'`
/// is ASCII, so every part is on a character boundary, and the module keeps
/// one splitter instead of `str::split`'s searcher and `memchr`.
pub fn dot_parts(s: &str) -> impl Iterator<Item = &str> {
    DotParts(Some(s))
}

/// The iterator of [`dot_parts`]: what is left to split, `None` once the
/// last part was given.
struct DotParts<'a>(Option<&'a str>);

impl<'a> Iterator for DotParts<'a> {
    type Item = &'a str;

    fn next(&mut self) -> Option<&'a str> {
        let r = self.0?;
        // A loop, not `bytes().position(..)`: one body, no `try_fold`.
        let b = r.as_bytes();
        let mut i = 0;
        while i < b.len() && b[i] != b'.' {
            i += 1;
        }
        self.0 = if i < b.len() { Some(&r[i + 1..]) } else { None };
        Some(&r[..i])
    }
}

/// Decodes a cursor made by [`encode_cursor`].
///
/// # Errors
/// `Err` with a message when the string was not made by `encode_cursor`.
pub fn decode_cursor(cursor: &str) -> Result<Vec<u16>, String> {
    let body = cursor
        .strip_prefix(CURSOR_TAG)
        .ok_or_else(|| "invalid cursor: not made by this store".to_string())?;
    hex_units(body).ok_or_else(|| "invalid cursor: malformed".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u(s: &str) -> Vec<u16> {
        s.encode_utf16().collect()
    }

    #[test]
    fn a_lone_surrogate_is_found_wherever_it_is() {
        let cases: [(&[u16], bool); 9] = [
            (&[], false),
            (&[0x61], false),
            (&[0xD83D, 0xDE00], false),
            (&[0x61, 0xD83D, 0xDE00, 0x62], false),
            (&[0xD83D], true),
            (&[0xDE00], true),
            (&[0xDE00, 0xD83D], true),
            (&[0xD83D, 0xD83D, 0xDE00], true),
            (&[0xD83D, 0xDE00, 0xDE00], true),
        ];
        for (u, lone) in cases {
            assert_eq!(has_lone_surrogate(u), lone, "{u:x?}");
            assert_eq!(
                lone,
                char::decode_utf16(u.iter().copied()).any(|c| c.is_err())
            );
        }
    }

    #[test]
    fn hex_value_reads_at_most_16_lower_case_digits() {
        for s in [
            "",
            "0",
            "f",
            "ff",
            "00ff",
            "ffffffffffffffff",
            "0000000000000000",
            "1ffffffffffffffff",
            "00000000000000000",
            "F",
            "+1",
            "-1",
            "g",
            " 1",
            "é",
        ] {
            // from_str_radix also takes upper case, a sign and leading
            // zeros past 16 digits, and refuses "" (which the fixed-width
            // fields never hold: an empty digit run is 0).
            let lower_hex = s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
            let std = match s {
                "" => Some(0),
                _ if s.len() > 16 => None,
                _ if lower_hex => u64::from_str_radix(s, 16).ok(),
                _ => None,
            };
            assert_eq!(hex_value(s.as_bytes()), std, "{s:?}");
        }
    }

    #[test]
    fn dot_parts_splits_as_str_split_does() {
        for s in [
            "",
            ".",
            "a",
            "a.b",
            ".a",
            "a.",
            "a..b",
            "é.ü.",
            "i1.s0061.n00",
        ] {
            assert_eq!(
                dot_parts(s).collect::<Vec<_>>(),
                s.split('.').collect::<Vec<_>>(),
                "{s:?}"
            );
        }
    }

    #[test]
    fn successor_increments_last_code_unit() {
        assert_eq!(prefix_successor(&u("user1_")), Some(u("user1`")));
        assert_eq!(
            prefix_successor(&u("agent-system:")),
            Some(u("agent-system;"))
        );
        assert_eq!(prefix_successor(&u("a/")), Some(u("a0")));
    }

    #[test]
    fn successor_drops_trailing_ffff_units() {
        assert_eq!(prefix_successor(&[0x61, 0xFFFF]), Some(vec![0x62]));
        assert_eq!(prefix_successor(&[0x61, 0xFFFF, 0xFFFF]), Some(vec![0x62]));
        assert_eq!(prefix_successor(&[0xFFFF, 0xFFFF]), None);
        assert_eq!(prefix_successor(&[]), None);
    }

    #[test]
    fn successor_can_be_a_lone_surrogate() {
        assert_eq!(prefix_successor(&[0x61, 0xD7FF]), Some(vec![0x61, 0xD800]));
        // An astral char's high surrogate as the last unit stays a surrogate.
        assert_eq!(prefix_successor(&[0xD83D]), Some(vec![0xD83E]));
    }

    /// Every key that starts with the prefix sorts inside [prefix, successor),
    /// and no key outside it does — checked over keys beyond the BMP (case C-L2).
    #[test]
    fn prefix_range_is_exact_for_astral_and_ffff_keys() {
        let keys = [
            "a/\u{FF61}",
            "a/\u{1F600}",
            "a/\u{FFFF}",
            "a/\u{10FFFF}",
            "a/zz",
            "a0",
            "a.",
            "a/",
            "a",
        ];
        let prefix = u("a/");
        let hi = prefix_successor(&prefix).unwrap();
        for k in keys {
            let k = u(k);
            let inside = k.as_slice() >= prefix.as_slice() && k.as_slice() < hi.as_slice();
            assert_eq!(inside, has_prefix(&k, &prefix), "{k:?}");
        }
        // Sorted by UTF-16 units: the astral keys (surrogates 0xD83D, 0xDBFF)
        // come before U+FF61 and U+FFFF.
        let mut sorted: Vec<Vec<u16>> = keys[..5].iter().map(|k| u(k)).collect();
        sorted.sort();
        let third: Vec<u16> = sorted.iter().map(|k| k[2]).collect();
        assert_eq!(third, vec![0x7A, 0xD83D, 0xDBFF, 0xFF61, 0xFFFF]);
    }

    #[test]
    fn cursor_round_trips_lone_surrogates() {
        for key in [vec![], vec![0x61, 0xD800], vec![0xFFFF, 0xDC00, 0x0000]] {
            assert_eq!(decode_cursor(&encode_cursor(&key)).unwrap(), key);
        }
        // One text per position: no sign, no upper-case digits.
        for bad in [
            "", "c1.abc", "c2.0061", "c1.zzzz", "c1.é000", "c1.+061", "c1.00FF",
        ] {
            assert!(decode_cursor(bad).is_err(), "{bad}");
        }
    }
}

/// One end of a key range on UTF-16 keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bound {
    /// The key at the end of the range.
    pub key: Vec<u16>,
    /// Whether the key itself is excluded.
    pub open: bool,
}

/// The key range of one page of a prefix listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageRange {
    /// Lower end (`None` = unbounded).
    pub lower: Option<Bound>,
    /// Upper end (`None` = unbounded).
    pub upper: Option<Bound>,
}

/// The range for a page of keys starting with `prefix`, continuing after the
/// keyset cursor key `after` (exclusive) in the listing's direction.
///
/// Returns `None` when the range is empty (for example a cursor already past
/// the prefix), so callers never build an inverted `IDBKeyRange` (which throws).
pub fn page_range(prefix: &[u16], after: Option<&[u16]>, descending: bool) -> Option<PageRange> {
    let mut lower = Some(Bound {
        key: prefix.to_vec(),
        open: false,
    });
    let mut upper = prefix_successor(prefix).map(|key| Bound { key, open: true });
    if let Some(after) = after {
        let cut = Bound {
            key: after.to_vec(),
            open: true,
        };
        if descending {
            if upper.as_ref().is_none_or(|u| after < u.key.as_slice()) {
                upper = Some(cut);
            }
        } else if lower.as_ref().is_none_or(|l| after >= l.key.as_slice()) {
            lower = Some(cut);
        }
    }
    if lower.as_ref().is_some_and(|l| l.key.is_empty() && !l.open) {
        lower = None; // "" is the smallest string: no lower bound needed
    }
    if let (Some(l), Some(u)) = (&lower, &upper) {
        if l.key > u.key || (l.key == u.key && (l.open || u.open)) {
            return None;
        }
    }
    Some(PageRange { lower, upper })
}

#[cfg(test)]
mod page_tests {
    use super::*;

    fn u(s: &str) -> Vec<u16> {
        s.encode_utf16().collect()
    }

    fn contains(r: &PageRange, k: &[u16]) -> bool {
        r.lower.as_ref().is_none_or(|l| {
            if l.open {
                k > l.key.as_slice()
            } else {
                k >= l.key.as_slice()
            }
        }) && r.upper.as_ref().is_none_or(|h| {
            if h.open {
                k < h.key.as_slice()
            } else {
                k <= h.key.as_slice()
            }
        })
    }

    #[test]
    fn page_after_cursor_excludes_the_cursor_and_stays_in_prefix() {
        let keys: Vec<Vec<u16>> = ["user_1", "user1_a", "user1_b", "user1_c", "user2"]
            .iter()
            .map(|k| u(k))
            .collect();
        let r = page_range(&u("user1_"), Some(&u("user1_a")), false).unwrap();
        let got: Vec<&Vec<u16>> = keys.iter().filter(|k| contains(&r, k)).collect();
        assert_eq!(got, vec![&u("user1_b"), &u("user1_c")]);
        let r = page_range(&u("user1_"), Some(&u("user1_c")), true).unwrap();
        let got: Vec<&Vec<u16>> = keys.iter().filter(|k| contains(&r, k)).collect();
        assert_eq!(got, vec![&u("user1_a"), &u("user1_b")]);
    }

    #[test]
    fn cursor_outside_the_prefix_gives_an_empty_page_not_an_inverted_range() {
        assert_eq!(page_range(&u("a/"), Some(&u("b")), false), None);
        assert_eq!(page_range(&u("b"), Some(&u("a")), true), None);
        assert!(page_range(&u("b"), Some(&u("a")), false).is_some());
    }

    #[test]
    fn empty_prefix_is_unbounded() {
        let r = page_range(&[], None, false).unwrap();
        assert_eq!(
            r,
            PageRange {
                lower: None,
                upper: None
            }
        );
        let r = page_range(&[0xFFFF], None, false).unwrap();
        assert!(r.upper.is_none() && r.lower.is_some());
    }
}
