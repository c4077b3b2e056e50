//! Derived index rules: definitions, fingerprints, entry keys and the key
//! ranges of `listBy` queries, all on IndexedDB's key ordering.
//!
//! An entry's IndexedDB key is the array `[tag, v1, …, vn, id]` where `tag` is
//! `"<name>@<fingerprint>"` and `v1…vn` are the record's values at the
//! definition's key paths. Entries of all indexes share one object store; the
//! tag keeps them apart and changes whenever the definition changes, so a new
//! definition never reads entries built for an old one. Ordering follows
//! <https://w3c.github.io/IndexedDB/#compare-two-keys>: numbers < strings <
//! arrays; strings by UTF-16 code units; arrays element by element, a proper
//! prefix first.

use crate::keys::{dot_parts, hex_units, hex_value, prefix_successor, push_hex, push_units};
use md5::{Digest, Md5};
use serde::{Deserialize, Serialize};
use std::cmp::Ordering;

/// Most indexes one store may declare.
pub const MAX_INDEXES: usize = 16;
/// Most key paths in one index.
pub const MAX_INDEX_KEYS: usize = 8;

/// A derived index declared at open: `{name, keys: ["recordType", "updatedAt"]}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexDef {
    /// 1..=64 characters of `[A-Za-z0-9_-]`.
    pub name: String,
    /// Top-level field names or dotted paths (`"meta.owner"`), 1..=8 of them.
    pub keys: Vec<String>,
}

impl IndexDef {
    /// The tag `"<name>@<16 hex>"`: md5 of the canonical definition. Same
    /// definition → same tag, in every tab and every session.
    ///
    /// The canonical definition is the JSON text `["<name>",["<key>",…]]`
    /// (serde_json's escaping, written by hand so the SDK needs no JSON
    /// library for it; a test checks it against serde_json).
    pub fn tag(&self) -> String {
        let mut canonical = String::from("[");
        json_string(&mut canonical, &self.name);
        canonical.push_str(",[");
        for (i, k) in self.keys.iter().enumerate() {
            if i > 0 {
                canonical.push(',');
            }
            json_string(&mut canonical, k);
        }
        canonical.push_str("]]");
        let digest = Md5::digest(canonical.as_bytes());
        let mut tag = self.name.clone();
        tag.push('@');
        for b in digest.iter().take(8) {
            push_hex(&mut tag, u64::from(*b), 2);
        }
        tag
    }
}

/// Appends `s` as a JSON string literal, escaped exactly as serde_json does:
/// `"` and `\` backslashed, `\b \f \n \r \t` short, other controls as `\u00XX`.
fn json_string(out: &mut String, s: &str) {
    out.push('"');
    crate::canonical::escape_json(s, &mut |p| out.push_str(p));
    out.push('"');
}

/// `before"name"after`: messages quote names as JSON strings without
/// `core::fmt` (kept out of the SDK's wasm).
fn quoted(before: &str, name: &str, after: &str) -> String {
    let mut out = String::from(before);
    json_string(&mut out, name);
    out.push_str(after);
    out
}

// The messages of `check_defs` spell these limits out.
const _: () = assert!(MAX_INDEXES == 16 && MAX_INDEX_KEYS == 8);

/// Checks a set of definitions.
///
/// # Errors
/// A message for an empty/oversized/duplicate name, a bad character, or an
/// empty/oversized key list or empty path segment.
pub fn check_defs(defs: &[IndexDef]) -> Result<(), String> {
    if defs.len() > MAX_INDEXES {
        return Err("at most 16 indexes".into());
    }
    for (i, d) in defs.iter().enumerate() {
        let name_ok = !d.name.is_empty()
            && d.name.len() <= 64
            && crate::only(&d.name, |b| {
                b.is_ascii_alphanumeric() || b == b'_' || b == b'-'
            });
        if !name_ok {
            return Err(quoted(
                "index name ",
                &d.name,
                " must be 1..=64 characters of A-Z a-z 0-9 _ -",
            ));
        }
        if defs[..i].iter().any(|o| o.name == d.name) {
            return Err(quoted("index ", &d.name, " is declared twice"));
        }
        if d.keys.is_empty() || d.keys.len() > MAX_INDEX_KEYS {
            return Err(quoted("index ", &d.name, " needs 1..=8 keys"));
        }
        if d.keys.iter().any(|k| dot_parts(k).any(str::is_empty)) {
            return Err(quoted("index ", &d.name, " has an empty key path segment"));
        }
    }
    Ok(())
}

/// One component of an IndexedDB key, as far as indexes use them.
#[derive(Debug, Clone, PartialEq)]
pub enum KeyPart {
    /// A finite number.
    Num(f64),
    /// A string as UTF-16 code units.
    Str(Vec<u16>),
    /// The empty array `[]`: sorts above every number and string, used as
    /// the "after everything with this prefix" sentinel in ranges.
    Max,
}

impl KeyPart {
    fn rank(&self) -> u8 {
        match self {
            KeyPart::Num(_) => 0,
            KeyPart::Str(_) => 1,
            KeyPart::Max => 2,
        }
    }
}

/// Compares two key parts as IndexedDB does.
pub fn cmp_part(a: &KeyPart, b: &KeyPart) -> Ordering {
    match (a, b) {
        (KeyPart::Num(x), KeyPart::Num(y)) => x.partial_cmp(y).unwrap_or(Ordering::Equal),
        (KeyPart::Str(x), KeyPart::Str(y)) => x.cmp(y),
        _ => a.rank().cmp(&b.rank()),
    }
}

/// Compares two array keys as IndexedDB does (element-wise, shorter first).
pub fn cmp_key(a: &[KeyPart], b: &[KeyPart]) -> Ordering {
    for (x, y) in a.iter().zip(b) {
        match cmp_part(x, y) {
            Ordering::Equal => continue,
            o => return o,
        }
    }
    a.len().cmp(&b.len())
}

/// A `listBy` condition on the index's leading components.
#[derive(Debug, Clone, PartialEq)]
pub enum Condition {
    /// The whole index.
    All,
    /// Leading components equal these values exactly (not as prefixes).
    Eq(Vec<KeyPart>),
    /// The first component is a string starting with these code units.
    Prefix(Vec<u16>),
    /// The first component lies in this range (`None` = unbounded).
    Range {
        /// Lower value of the first component.
        lower: Option<KeyPart>,
        /// Upper value of the first component.
        upper: Option<KeyPart>,
        /// Exclude entries whose first component equals `lower`.
        lower_open: bool,
        /// Exclude entries whose first component equals `upper`.
        upper_open: bool,
    },
}

/// A key range over entry keys `[tag, …]`.
#[derive(Debug, Clone, PartialEq)]
pub struct EntryRange {
    /// Lower key (always present: at least `[tag]`).
    pub lower: Vec<KeyPart>,
    /// Whether `lower` itself is excluded.
    pub lower_open: bool,
    /// Upper key (always present: at most `[tag, []]`).
    pub upper: Vec<KeyPart>,
    /// Whether `upper` itself is excluded.
    pub upper_open: bool,
}

/// Checks a `listBy` query against the index it names, whose entry keys are
/// `[tag, key values…, id]` with `keys` key values: `eq` gives at most `keys`
/// values (one more would be compared with the record id), and `after` is an
/// entry key of this index (a cursor of another index would restart the
/// listing or end it early, silently). Static messages, for the wasm side.
///
/// # Errors
/// The message of the first rule broken.
pub fn check_query(
    tag: &str,
    keys: usize,
    cond: &Condition,
    after: Option<&[KeyPart]>,
) -> Result<(), &'static str> {
    if matches!(cond, Condition::Eq(v) if v.len() > keys) {
        return Err("eq has more values than the index has keys");
    }
    if let Some(a) = after {
        let tag = KeyPart::Str(crate::utf16(tag));
        let ours = a.first() == Some(&tag);
        if !ours || a.len() != keys + 2 || a.iter().any(|p| matches!(p, KeyPart::Max)) {
            return Err("after is a cursor of another index: pass the next of this index's listBy");
        }
    }
    Ok(())
}

/// The entry key range of a condition on index `tag`, continuing after the
/// entry key `after` (a previous page's last key) in the listing direction.
/// `None` when the range is empty.
pub fn entry_range(
    tag: &str,
    cond: &Condition,
    after: Option<&[KeyPart]>,
    descending: bool,
) -> Option<EntryRange> {
    let t = KeyPart::Str(crate::utf16(tag));
    let with = |parts: &[KeyPart]| -> Vec<KeyPart> {
        let mut v = vec![t.clone()];
        v.extend_from_slice(parts);
        v
    };
    let mut r = match cond {
        Condition::All => EntryRange {
            lower: with(&[]),
            lower_open: false,
            upper: with(&[KeyPart::Max]),
            upper_open: true,
        },
        Condition::Eq(vals) => {
            let mut hi = vals.clone();
            hi.push(KeyPart::Max);
            EntryRange {
                lower: with(vals),
                lower_open: false,
                upper: with(&hi),
                upper_open: true,
            }
        }
        Condition::Prefix(p) => {
            let upper = match prefix_successor(p) {
                Some(s) => with(&[KeyPart::Str(s)]),
                None => with(&[KeyPart::Max]),
            };
            EntryRange {
                lower: with(&[KeyPart::Str(p.clone())]),
                lower_open: false,
                upper,
                upper_open: true,
            }
        }
        Condition::Range {
            lower,
            upper,
            lower_open,
            upper_open,
        } => {
            let (lo, lo_open) = match lower {
                None => (with(&[]), false),
                Some(v) if *lower_open => (with(&[v.clone(), KeyPart::Max]), true),
                Some(v) => (with(std::slice::from_ref(v)), false),
            };
            let (hi, hi_open) = match upper {
                None => (with(&[KeyPart::Max]), true),
                Some(v) if *upper_open => (with(std::slice::from_ref(v)), true),
                Some(v) => (with(&[v.clone(), KeyPart::Max]), true),
            };
            EntryRange {
                lower: lo,
                lower_open: lo_open,
                upper: hi,
                upper_open: hi_open,
            }
        }
    };
    if let Some(a) = after {
        if descending {
            if cmp_key(a, &r.upper) != Ordering::Greater {
                r.upper = a.to_vec();
                r.upper_open = true;
            }
        } else if cmp_key(a, &r.lower) != Ordering::Less {
            r.lower = a.to_vec();
            r.lower_open = true;
        }
    }
    match cmp_key(&r.lower, &r.upper) {
        Ordering::Greater => None,
        Ordering::Equal if r.lower_open || r.upper_open => None,
        _ => Some(r),
    }
}

/// Most UTF-16 code units the string values of one index entry may hold in
/// all (250,000): a record whose key paths yield longer strings has no entry
/// in that index, as one whose path yields no string or number. Every entry
/// key then encodes as a cursor within [`MAX_KEY_CURSOR_LEN`] (4 hex digits
/// per unit; the tag, the id and the separators add at most 4,442
/// characters), so `listBy` can always be paged past it. Index keys are
/// bounded in most databases for the same reason (MongoDB's 1,024-byte
/// index key limit before 4.2, DynamoDB's 2,048-byte partition key), and
/// Chromium's IndexedDB team asks for keys of at most kilobytes
/// (w3c/IndexedDB#344).
pub const MAX_INDEXED_UNITS: u32 = 250_000;

/// The longest `listBy` cursor [`decode_key_cursor`] takes, in ASCII
/// characters (1 Mi): string parts of 262,143 UTF-16 code units in all (4
/// hex digits each). A longer cursor is refused before it is read (a
/// caller's string copied into wasm memory grows it for the page's life).
pub const MAX_KEY_CURSOR_LEN: u32 = 1 << 20;

/// Encodes an entry key as an opaque cursor: `"i1."` then per part
/// `n<16 hex f64 bits>` or `s<4 hex per unit>` separated by `.`.
pub fn encode_key_cursor(key: &[KeyPart]) -> String {
    let mut out = String::from("i1");
    for p in key {
        out.push('.');
        match p {
            KeyPart::Num(n) => {
                out.push('n');
                push_hex(&mut out, n.to_bits(), 16);
            }
            KeyPart::Str(u) => {
                out.push('s');
                push_units(&mut out, u);
            }
            KeyPart::Max => out.push('m'),
        }
    }
    out
}

/// Decodes [`encode_key_cursor`].
///
/// # Errors
/// A message when the cursor was not made by `encode_key_cursor`.
pub fn decode_key_cursor(s: &str) -> Result<Vec<KeyPart>, String> {
    let bad = || "invalid index cursor: not made by listBy".to_string();
    // Cursors are ASCII by construction; anything else is refused here,
    // before any byte-indexed split (a split inside a multi-byte character
    // would panic, and a panic in wasm kills the module).
    if !s.is_ascii() || s.len() > MAX_KEY_CURSOR_LEN as usize {
        return Err(bad());
    }
    // An entry key has the index's tag, at most MAX_INDEX_KEYS values and
    // the id: more parts are refused before any is allocated.
    let mut dots = 0;
    for b in s.bytes() {
        dots += usize::from(b == b'.');
    }
    if dots > MAX_INDEX_KEYS + 2 {
        return Err(bad());
    }
    let mut parts = dot_parts(s);
    if parts.next() != Some("i1") {
        return Err(bad());
    }
    // A loop, not `map(..).collect::<Result<_, _>>()`: one body instead of
    // the iterator adapters' monomorphs (about 600 bytes of wasm).
    let mut out = Vec::new();
    for p in parts {
        let (kind, body) = p.split_at(p.len().min(1));
        out.push(match kind {
            // NaN is no IndexedDB key (an entry never holds one): refused
            // here, not by IDBKeyRange's DataError.
            "n" if body.len() == 16 => KeyPart::Num(
                hex_value(body.as_bytes())
                    .map(f64::from_bits)
                    .filter(|n| !n.is_nan())
                    .ok_or_else(bad)?,
            ),
            "s" => KeyPart::Str(hex_units(body).ok_or_else(bad)?),
            "m" if body.is_empty() => KeyPart::Max,
            _ => return Err(bad()),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(x: &str) -> KeyPart {
        KeyPart::Str(x.encode_utf16().collect())
    }

    /// The longest entry key an index holds (a tag of the longest name,
    /// eight string values of [`MAX_INDEXED_UNITS`] units in all, the
    /// longest id, each unit needing 4 hex digits) encodes as a cursor
    /// `decode_key_cursor` takes: `listBy` can always page past any entry.
    #[test]
    fn the_longest_entry_key_an_index_holds_makes_a_cursor_list_by_takes() {
        let def = IndexDef {
            name: "n".repeat(64),
            keys: vec!["k".into(); MAX_INDEX_KEYS],
        };
        let per = MAX_INDEXED_UNITS as usize / MAX_INDEX_KEYS;
        let mut key = vec![s(&def.tag())];
        for i in 0..MAX_INDEX_KEYS {
            // The remainder goes to the last value: MAX_INDEXED_UNITS in all.
            let extra = if i + 1 == MAX_INDEX_KEYS {
                MAX_INDEXED_UNITS as usize % MAX_INDEX_KEYS
            } else {
                0
            };
            key.push(s(&"\u{ffff}".repeat(per + extra)));
        }
        key.push(s(&"\u{ffff}".repeat(crate::record::MAX_ID_UNITS)));
        let cursor = encode_key_cursor(&key);
        assert!(
            cursor.len() <= MAX_KEY_CURSOR_LEN as usize,
            "{}",
            cursor.len()
        );
        assert_eq!(decode_key_cursor(&cursor).unwrap(), key);
    }

    #[test]
    fn a_key_cursor_with_more_parts_than_an_entry_key_or_too_long_is_refused_before_it_is_read() {
        let most = vec![KeyPart::Max; MAX_INDEX_KEYS + 2];
        assert_eq!(decode_key_cursor(&encode_key_cursor(&most)).unwrap(), most);
        let more = vec![KeyPart::Max; MAX_INDEX_KEYS + 3];
        assert!(decode_key_cursor(&encode_key_cursor(&more)).is_err());
        assert!(decode_key_cursor(&["i1", &".m".repeat(1 << 20)].concat()).is_err());
        let longest = "a".repeat((MAX_KEY_CURSOR_LEN as usize - 4) / 4);
        let c = encode_key_cursor(&[s(&longest)]);
        assert_eq!(c.len(), MAX_KEY_CURSOR_LEN as usize);
        assert_eq!(decode_key_cursor(&c).unwrap(), vec![s(&longest)]);
        let too_long = encode_key_cursor(&[s(&longest), s("bc")]);
        assert!(decode_key_cursor(&too_long).is_err());
    }

    /// NaN is no IndexedDB key: a forged cursor naming one is refused as
    /// any cursor `listBy` did not make (before, IDBKeyRange's DataError
    /// text came through).
    #[test]
    fn a_key_cursor_naming_nan_is_refused_as_not_made_by_list_by() {
        let tag = s(&IndexDef {
            name: "n".into(),
            keys: vec!["k".into()],
        }
        .tag());
        for bits in [
            f64::NAN.to_bits(),
            0x7ff0_0000_0000_0001,
            0xfff8_0000_0000_0000,
        ] {
            let c = encode_key_cursor(&[tag.clone(), KeyPart::Num(f64::from_bits(bits)), s("id")]);
            assert_eq!(
                decode_key_cursor(&c),
                Err("invalid index cursor: not made by listBy".to_string()),
                "{bits:x}"
            );
        }
        let c = encode_key_cursor(&[tag, KeyPart::Num(f64::INFINITY), s("id")]);
        assert!(decode_key_cursor(&c).is_ok());
    }

    fn inside(r: &EntryRange, k: &[KeyPart]) -> bool {
        let lo = cmp_key(k, &r.lower);
        let hi = cmp_key(k, &r.upper);
        (lo == Ordering::Greater || (lo == Ordering::Equal && !r.lower_open))
            && (hi == Ordering::Less || (hi == Ordering::Equal && !r.upper_open))
    }

    fn key(tag: &str, parts: &[KeyPart]) -> Vec<KeyPart> {
        let mut v = vec![s(tag)];
        v.extend_from_slice(parts);
        v
    }

    #[test]
    fn eq_with_more_values_than_keys_and_cursors_of_another_index_are_refused() {
        let tag = "byType@1";
        let eq = |n: usize| Condition::Eq((0..n).map(|i| s(&i.to_string())).collect());
        assert_eq!(check_query(tag, 1, &eq(1), None), Ok(()));
        assert!(check_query(tag, 1, &eq(2), None).is_err());
        assert_eq!(check_query(tag, 2, &eq(2), None), Ok(()));
        let ours = key(tag, &[s("run"), s("r1")]);
        assert_eq!(check_query(tag, 1, &Condition::All, Some(&ours)), Ok(()));
        for bad in [
            key("byOther@2", &[s("run"), s("r1")]),
            key(tag, &[s("r1")]),
            key(tag, &[s("run"), s("x"), s("r1")]),
            key(tag, &[KeyPart::Max, s("r1")]),
            vec![KeyPart::Num(1.0), s("run"), s("r1")],
            Vec::new(),
        ] {
            assert!(
                check_query(tag, 1, &Condition::All, Some(&bad)).is_err(),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn tag_is_stable_and_changes_with_the_definition() {
        let a = IndexDef {
            name: "byType".into(),
            keys: vec!["recordType".into(), "updatedAt".into()],
        };
        let mut b = a.clone();
        assert_eq!(a.tag(), b.tag());
        assert!(a.tag().starts_with("byType@"));
        b.keys.reverse();
        assert_ne!(a.tag(), b.tag());
    }

    #[test]
    fn tag_canonical_text_is_serde_json_s() {
        let keys = [
            "a",
            "q\"uote",
            "back\\slash",
            "ctl\u{1}\u{1f}\u{8}\u{c}\n\r\t",
            "é😀\u{7f}",
        ];
        for k in keys {
            let d = IndexDef {
                name: "n-1_x".into(),
                keys: vec![k.into(), "b.c".into()],
            };
            let want = serde_json::to_string(&(&d.name, &d.keys)).unwrap();
            let digest = Md5::digest(want.as_bytes());
            let hex: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
            assert_eq!(d.tag(), format!("{}@{hex}", d.name), "key {k:?}");
        }
        // the tag of the index every suite declares never changes across releases
        let by_type = IndexDef {
            name: "byType".into(),
            keys: vec!["recordType".into(), "updatedAt".into()],
        };
        let want = serde_json::to_string(&(&by_type.name, &by_type.keys)).unwrap();
        assert_eq!(want, r#"["byType",["recordType","updatedAt"]]"#);
    }

    #[test]
    fn definitions_are_checked() {
        let ok = IndexDef {
            name: "by-type_1".into(),
            keys: vec!["a.b".into()],
        };
        assert!(check_defs(std::slice::from_ref(&ok)).is_ok());
        assert!(check_defs(&[ok.clone(), ok.clone()]).is_err());
        assert!(check_defs(&[IndexDef {
            name: "".into(),
            keys: vec!["a".into()]
        }])
        .is_err());
        assert!(check_defs(&[IndexDef {
            name: "a b".into(),
            keys: vec!["a".into()]
        }])
        .is_err());
        assert!(check_defs(&[IndexDef {
            name: "x".into(),
            keys: vec![]
        }])
        .is_err());
        assert!(check_defs(&[IndexDef {
            name: "x".into(),
            keys: vec!["a..b".into()]
        }])
        .is_err());
    }

    #[test]
    fn equality_does_not_match_longer_values_that_start_with_it() {
        let r = entry_range("t", &Condition::Eq(vec![s("run")]), None, false).unwrap();
        assert!(inside(&r, &key("t", &[s("run"), s("2026-01-01"), s("id")])));
        assert!(!inside(
            &r,
            &key("t", &[s("runs"), s("2026-01-01"), s("id")])
        ));
        assert!(!inside(&r, &key("t", &[s("ru"), s("z"), s("id")])));
        assert!(
            !inside(&r, &key("u", &[s("run"), s("z"), s("id")])),
            "other index"
        );
        assert!(!inside(&r, &key("t@", &[s("run")])));
    }

    #[test]
    fn prefix_and_range_conditions() {
        let r = entry_range(
            "t",
            &Condition::Prefix("ag".encode_utf16().collect()),
            None,
            false,
        )
        .unwrap();
        assert!(inside(&r, &key("t", &[s("agent"), s("id")])));
        assert!(!inside(&r, &key("t", &[s("ah"), s("id")])));
        let r = entry_range(
            "t",
            &Condition::Range {
                lower: Some(KeyPart::Num(2.0)),
                upper: Some(KeyPart::Num(5.0)),
                lower_open: true,
                upper_open: false,
            },
            None,
            false,
        )
        .unwrap();
        assert!(!inside(&r, &key("t", &[KeyPart::Num(2.0), s("id")])));
        assert!(inside(&r, &key("t", &[KeyPart::Num(3.0), s("id")])));
        assert!(inside(&r, &key("t", &[KeyPart::Num(5.0), s("id")])));
        assert!(!inside(&r, &key("t", &[KeyPart::Num(5.5), s("id")])));
        assert!(
            !inside(&r, &key("t", &[s("5"), s("id")])),
            "strings sort after numbers"
        );
    }

    #[test]
    fn cursor_continues_strictly_after_the_last_entry_and_round_trips() {
        let last = key(
            "t",
            &[s("run"), s("2026"), KeyPart::Str(vec![0x61, 0xD800])],
        );
        let c = encode_key_cursor(&last);
        assert_eq!(decode_key_cursor(&c).unwrap(), last);
        let r = entry_range("t", &Condition::Eq(vec![s("run")]), Some(&last), false).unwrap();
        assert!(!inside(&r, &last));
        let r = entry_range("t", &Condition::Eq(vec![s("run")]), Some(&last), true).unwrap();
        assert!(!inside(&r, &last) && inside(&r, &key("t", &[s("run"), s("2025"), s("a")])));
        let n = vec![KeyPart::Num(-0.5), KeyPart::Max];
        assert_eq!(decode_key_cursor(&encode_key_cursor(&n)).unwrap(), n);
        for bad in [
            "",
            "c1.00",
            "i1.x",
            "i1.n12",
            "i1.s123",
            "i1.s+061",
            "i1.s00FF",
            "i1.n+000000000000000",
        ] {
            assert!(decode_key_cursor(bad).is_err(), "{bad}");
        }
        // a cursor past the condition's range gives an empty page
        let past = key("t", &[s("zzz"), s("a")]);
        assert_eq!(
            entry_range("t", &Condition::Eq(vec![s("run")]), Some(&past), false),
            None
        );
    }

    #[test]
    fn a_cursor_with_non_ascii_text_is_refused_not_a_panic() {
        for c in [
            "i1.\u{e9}",
            "i1.\u{e9}0000",
            "i1.s\u{e9}",
            "\u{1F600}",
            "i1.n\u{e9}000000000000000",
            "i1.s00\u{e9}",
        ] {
            assert!(decode_key_cursor(c).is_err(), "{c:?}");
        }
        let good = encode_key_cursor(&[s("\u{e9}\u{1F600}"), KeyPart::Num(1.5), KeyPart::Max]);
        assert_eq!(
            decode_key_cursor(&good).unwrap(),
            vec![s("\u{e9}\u{1F600}"), KeyPart::Num(1.5), KeyPart::Max]
        );
    }
}
