//! Record validation limits and rules, and the canonical body used for revisions.
//!
//! A record is a JSON object with a string `_id`. The SDK walks the JS value
//! once (rejecting what JSON cannot carry), classifies each top-level field
//! with [`top_field`] and streams the canonical bytes into a
//! [`crate::canonical::BodyDigest`]; [`check_record`] applies the same rules
//! to a parsed JSON object (imports, native tests). Messages are static
//! strings: the SDK adds the field path itself.

use crate::rev::Rev;
use serde_json::{Map, Value};

/// Longest `_id`, in UTF-16 code units (IndexedDB's unit; 1024 units ≤ 2 KiB).
pub const MAX_ID_UNITS: usize = 1024;
/// Deepest nesting of objects/arrays in a record (the record itself is depth 1).
pub const MAX_DEPTH: usize = 64;
/// Largest record, measured as its canonical JSON, in bytes (64 MiB).
pub const MAX_RECORD_BYTES: usize = 64 << 20;
/// Largest `limit` a listing accepts.
pub const MAX_LIST_LIMIT: u32 = 10_000;
/// Default `limit` of a listing.
pub const DEFAULT_LIST_LIMIT: u32 = 100;
/// Most records in one `putMany` / import transaction.
pub const MAX_BATCH: usize = 100_000;

/// Top-level fields starting with `_` that a caller may set. Everything else
/// beginning with `_` is reserved.
pub const ALLOWED_UNDERSCORE_FIELDS: [&str; 2] = ["_id", "_rev"];

/// Checks the length of an `_id`, given in UTF-16 code units (JS `length`).
///
/// # Errors
/// A message when the id is empty or longer than [`MAX_ID_UNITS`].
pub fn check_id(len_units: usize) -> Result<(), String> {
    if len_units == 0 {
        return Err("_id must be a non-empty string".into());
    }
    if len_units > MAX_ID_UNITS {
        return Err(ID_TOO_LONG.into());
    }
    Ok(())
}

/// Message for an `_id` longer than [`MAX_ID_UNITS`].
pub const ID_TOO_LONG: &str = "_id is longer than 1024 UTF-16 code units";
/// Message for a reserved top-level field.
pub const RESERVED_FIELD: &str =
    "is reserved: fields starting with '_' other than _id and _rev are not allowed";
/// Message for a `_rev` that is not a string.
pub const REV_NOT_STRING: &str = "_rev must be a string";
/// Message for a `recordType` that is not a string.
pub const RECORD_TYPE_NOT_STRING: &str = "recordType must be a string";
/// Message for a malformed `updatedAt`.
pub const BAD_UPDATED_AT: &str =
    "updatedAt must be an ISO-8601 UTC string with milliseconds, e.g. 2026-03-01T08:27:12.804Z";
/// Message for a record whose canonical JSON exceeds [`MAX_RECORD_BYTES`].
pub const TOO_LARGE: &str = "the record is larger than 64 MiB as JSON";

/// What a top-level field of a record is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopField {
    /// `_id` (checked with [`check_id`]).
    Id,
    /// `_rev`: a revision string, not part of the body digest.
    Rev,
    /// `recordType`: a string.
    RecordType,
    /// `updatedAt`: [`is_iso_millis_utc`]; hashed after the body digest.
    UpdatedAt,
    /// Any other field starting with `_`: refused ([`RESERVED_FIELD`]).
    Reserved,
    /// Application data.
    Data,
}

/// Classifies a top-level field name.
pub fn top_field(key: &str) -> TopField {
    match key {
        "_id" => TopField::Id,
        "_rev" => TopField::Rev,
        "recordType" => TopField::RecordType,
        "updatedAt" => TopField::UpdatedAt,
        k if k.starts_with("_") => TopField::Reserved,
        _ => TopField::Data,
    }
}

/// What the top-level check learned about a record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordMeta {
    /// The parsed `_rev`, when the caller gave one (an update).
    pub rev: Option<Rev>,
    /// Whether `updatedAt` is present (the SDK sets it when absent).
    pub has_updated_at: bool,
}

/// Checks the top level of a record for `put`: reserved `_` fields, the shape
/// of `_rev`, and the types of the conventional `recordType` (string) and
/// `updatedAt` (ISO-8601 UTC with milliseconds, `YYYY-MM-DDTHH:MM:SS.sssZ`).
/// `_id` is checked separately by [`check_id`] because it may hold lone
/// surrogates that a Rust string cannot.
///
/// # Errors
/// A message naming the first offending field.
pub fn check_record(record: &Map<String, Value>) -> Result<RecordMeta, String> {
    for key in record.keys() {
        if top_field(key) == TopField::Reserved {
            return Err(crate::cat(&["field ", key, " ", RESERVED_FIELD]));
        }
    }
    let rev = match record.get("_rev") {
        None => None,
        Some(Value::String(s)) => Some(Rev::parse(s).map_err(|e| e.0)?),
        Some(_) => return Err(REV_NOT_STRING.into()),
    };
    match record.get("recordType") {
        None | Some(Value::String(_)) => {}
        Some(_) => return Err(RECORD_TYPE_NOT_STRING.into()),
    }
    let has_updated_at = match record.get("updatedAt") {
        None => false,
        Some(Value::String(s)) if is_iso_millis_utc(s) => true,
        Some(_) => return Err(BAD_UPDATED_AT.into()),
    };
    Ok(RecordMeta {
        rev,
        has_updated_at,
    })
}

/// `YYYY-MM-DDTHH:MM:SS.sssZ` naming a real instant: what
/// `Date.prototype.toISOString` produces for years 0000–9999. The day must
/// exist in its month (30 April, 29 February only in a Gregorian leap
/// year): ECMA-262's Date Time String Format (§21.4.1.32) makes an
/// out-of-range field an invalid string, so `Date.parse` of `2026-02-30…`
/// is NaN in a conforming engine, and no `toISOString` ever produced it.
pub fn is_iso_millis_utc(s: &str) -> bool {
    iso_millis_fields(s).is_some_and(|(year, month, day)| {
        let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
        let days = match month {
            2 if leap => 29,
            2 => 28,
            4 | 6 | 9 | 11 => 30,
            _ => 31,
        };
        day <= days
    })
}

/// `YYYY-MM-DDTHH:MM:SS.sssZ` with every field in range except that the day
/// need only be 01–31 (so `2026-02-30…` passes): the rule `updatedAt`
/// followed before releases checked the day against its month. A record
/// stored then may hold such a value; `put` accepts it back only as a copy
/// of the stored record's, which it replaces by now (see
/// [`is_iso_millis_utc`] for a value that is kept).
pub fn is_iso_millis_shape(s: &str) -> bool {
    iso_millis_fields(s).is_some()
}

/// Year, month and day of a [`is_iso_millis_shape`] string.
fn iso_millis_fields(s: &str) -> Option<(u32, u32, u32)> {
    let b = s.as_bytes();
    if b.len() != 24 {
        return None;
    }
    let digits = |r: std::ops::Range<usize>| b[r].iter().all(u8::is_ascii_digit);
    let num =
        |r: std::ops::Range<usize>| b[r].iter().fold(0u32, |n, d| n * 10 + u32::from(d - b'0'));
    let shape = digits(0..4)
        && b[4] == b'-'
        && digits(5..7)
        && b[7] == b'-'
        && digits(8..10)
        && b[10] == b'T'
        && digits(11..13)
        && b[13] == b':'
        && digits(14..16)
        && b[16] == b':'
        && digits(17..19)
        && b[19] == b'.'
        && digits(20..23)
        && b[23] == b'Z';
    // Only digits are read as numbers: a byte below b'0' (a `+` or a space
    // where a digit goes) would underflow `d - b'0'`.
    if !shape {
        return None;
    }
    let (year, month, day) = (num(0..4), num(5..7), num(8..10));
    ((1..=12).contains(&month)
        && (1..=31).contains(&day)
        && num(11..13) < 24
        && num(14..16) < 60
        && num(17..19) < 60)
        .then_some((year, month, day))
}

/// The canonical JSON of a record body for hashing: every field but `_rev`,
/// object keys sorted (serde_json's map is ordered), no whitespace.
pub fn canonical_body(record: &Map<String, Value>) -> String {
    let mut body = record.clone();
    body.remove("_rev");
    // Serialising a Value cannot fail (keys are strings, numbers are finite).
    serde_json::to_string(&Value::Object(body)).unwrap_or_default()
}

/// Checks a listing `limit` (`None` = default).
///
/// # Errors
/// A message when the limit is 0 or above [`MAX_LIST_LIMIT`].
pub fn check_limit(limit: Option<f64>) -> Result<u32, String> {
    match limit {
        None => Ok(DEFAULT_LIST_LIMIT),
        Some(l) if l.fract() == 0.0 && l >= 1.0 && l <= f64::from(MAX_LIST_LIMIT) => Ok(l as u32),
        Some(_) => Err("limit must be an integer between 1 and 10000".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timestamp_with_a_sign_or_spaces_where_digits_go_is_refused_without_underflow() {
        // Each has the right length and separators but a byte below b'0'
        // in a digit position (before, `d - b'0'` underflowed: a panic in
        // debug builds and tests, a trap in a debug wasm).
        for s in [
            "+026-01-01T00:00:00.000Z",
            "2026-+1-01T00:00:00.000Z",
            "2026-01- 1T00:00:00.000Z",
            "2026-01-01T 0:00:00.000Z",
            "                        ",
            "!!!!!!!!!!!!!!!!!!!!!!!!",
        ] {
            assert!(!is_iso_millis_shape(s), "{s:?}");
            assert!(!is_iso_millis_utc(s), "{s:?}");
        }
        assert!(is_iso_millis_utc("2026-01-01T00:00:00.000Z"));
    }
    use serde_json::json;

    fn obj(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => unreachable!(),
        }
    }

    #[test]
    fn top_fields_are_classified() {
        assert_eq!(top_field("_id"), TopField::Id);
        assert_eq!(top_field("_rev"), TopField::Rev);
        assert_eq!(top_field("_deleted"), TopField::Reserved);
        assert_eq!(top_field("recordType"), TopField::RecordType);
        assert_eq!(top_field("updatedAt"), TopField::UpdatedAt);
        assert_eq!(top_field("name"), TopField::Data);
        for f in ALLOWED_UNDERSCORE_FIELDS {
            assert_ne!(top_field(f), TopField::Reserved);
        }
    }

    #[test]
    fn id_limits() {
        assert!(check_id(0).is_err());
        assert!(check_id(1).is_ok());
        assert!(check_id(MAX_ID_UNITS).is_ok());
        assert!(check_id(MAX_ID_UNITS + 1).is_err());
    }

    #[test]
    fn reserved_fields_and_rev_shape_are_checked() {
        assert!(check_record(&obj(json!({"_id": "a", "_foo": 1}))).is_err());
        assert!(check_record(&obj(json!({"_id": "a", "_deleted": true}))).is_err());
        assert!(check_record(&obj(json!({"_id": "a", "_rev": 3}))).is_err());
        assert!(check_record(&obj(json!({"_id": "a", "_rev": "x"}))).is_err());
        let m = check_record(&obj(json!({"_id": "a", "_rev": "2-ab", "n": {"_x": 1}}))).unwrap();
        assert_eq!(m.rev.unwrap().generation, 2);
    }

    /// A day its month does not have is refused, as ECMA-262's date format
    /// refuses it; the last day of each month, and 29 February of a leap
    /// year (2000 and 2024, not 1900 or 2026), are kept.
    #[test]
    fn updated_at_names_a_day_its_month_has() {
        for bad in [
            "2026-02-29T00:00:00.000Z",
            "2026-02-30T00:00:00.000Z",
            "1900-02-29T00:00:00.000Z",
            "2026-04-31T00:00:00.000Z",
            "2026-06-31T00:00:00.000Z",
            "2026-09-31T00:00:00.000Z",
            "2026-11-31T00:00:00.000Z",
            "2026-01-32T00:00:00.000Z",
            "2026-01-00T00:00:00.000Z",
        ] {
            assert!(!is_iso_millis_utc(bad), "{bad}");
            // Out of its month but within 01-31: the shape earlier
            // releases accepted (and may have stored).
            let legacy = !bad.contains("-32T") && !bad.contains("-00T");
            assert_eq!(is_iso_millis_shape(bad), legacy, "{bad}");
        }
        for good in [
            "2024-02-29T23:59:59.999Z",
            "2000-02-29T00:00:00.000Z",
            "2026-02-28T00:00:00.000Z",
            "2026-04-30T00:00:00.000Z",
            "2026-12-31T00:00:00.000Z",
            "0000-02-29T00:00:00.000Z",
        ] {
            assert!(
                is_iso_millis_utc(good) && is_iso_millis_shape(good),
                "{good}"
            );
        }
    }

    #[test]
    fn conventional_fields_have_types() {
        assert!(check_record(&obj(json!({"_id": "a", "recordType": 1}))).is_err());
        assert!(check_record(&obj(json!({"_id": "a", "updatedAt": "yesterday"}))).is_err());
        assert!(check_record(&obj(
            json!({"_id": "a", "updatedAt": "2026-13-01T00:00:00.000Z"})
        ))
        .is_err());
        let m = check_record(&obj(
            json!({"_id": "a", "updatedAt": "2026-03-01T08:27:12.804Z"}),
        ))
        .unwrap();
        assert!(m.has_updated_at);
    }

    #[test]
    fn canonical_body_ignores_key_order_and_rev() {
        let a = obj(json!({"_id": "a", "b": 1, "a": [1, {"y": null, "x": 2}], "_rev": "1-aa"}));
        let b = obj(json!({"a": [1, {"x": 2, "y": null}], "_id": "a", "b": 1}));
        assert_eq!(canonical_body(&a), canonical_body(&b));
        assert_eq!(
            canonical_body(&b),
            r#"{"_id":"a","a":[1,{"x":2,"y":null}],"b":1}"#
        );
    }

    #[test]
    fn limit_bounds() {
        assert_eq!(check_limit(None), Ok(DEFAULT_LIST_LIMIT));
        assert_eq!(check_limit(Some(7.0)), Ok(7));
        for bad in [0.0, -1.0, 1.5, f64::NAN, 1e9] {
            assert!(check_limit(Some(bad)).is_err(), "{bad}");
        }
    }
}
