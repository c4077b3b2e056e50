//! Revisions: `"<generation>-<hex>"`, and the compare-and-swap decision.
//!
//! Rules (DESIGN.md "Records"): the store assigns revisions; the generation
//! starts at 1, grows by one per write (a tombstone is a write), and never
//! exceeds 2^53 − 1 so it survives a trip through a JS Number. The hex part is
//! `md5(previous revision + "\n" + part₁ + "\n" + part₂ …)` where the parts
//! are the body's digest (md5 hex of its canonical JSON without `_rev` and
//! `updatedAt`, [`crate::canonical::BodyDigest`]) and then `updatedAt`: the
//! digest is computed before the write transaction, and the same write on
//! the same previous revision yields the same revision, like PouchDB's
//! deterministic revisions. Revisions imported from PouchDB keep their
//! 32-hex form.

use md5::{Digest, Md5};
use std::cmp::Ordering;
use std::fmt;

/// Largest generation a revision may carry: 2^53 − 1 (`Number.MAX_SAFE_INTEGER`).
pub const MAX_GENERATION: u64 = (1 << 53) - 1;
/// Longest accepted hex part, in characters (PouchDB uses 32).
pub const MAX_REV_HEX: usize = 64;

/// A parsed revision. Ordering follows PouchDB's winner rule: generation
/// first, then the hex string compared as a string.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Rev {
    /// 1 ..= [`MAX_GENERATION`].
    pub generation: u64,
    /// Lower-case hex, 1 ..= [`MAX_REV_HEX`] characters.
    pub hash: String,
}

/// Why a revision string was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RevParseError(pub String);

impl fmt::Display for RevParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RevParseError {}

/// `digits` (ASCII `0-9` only, at least one; leading zeros allowed) as a
/// number of at most 2^53 − 1 ([`MAX_GENERATION`], the largest integer a JS
/// Number holds exactly), or `None`. (`str::parse` also takes a `+` sign,
/// and its code is a second decimal reader in the module.)
pub fn decimal(digits: &str) -> Option<u64> {
    if digits.is_empty() {
        return None;
    }
    // n <= 2^53 - 1 before each step, so n * 10 + 9 cannot overflow.
    let mut n = 0u64;
    for b in digits.bytes() {
        let d = b.wrapping_sub(b'0');
        if d >= 10 {
            return None;
        }
        n = n * 10 + u64::from(d);
        if n > MAX_GENERATION {
            return None;
        }
    }
    Some(n)
}

impl Rev {
    /// Parses `"<generation>-<hex>"`.
    ///
    /// # Errors
    /// A message naming the problem: missing `-`, a generation that is not a
    /// decimal in 1..=2^53−1 (no sign, no leading zero), or a hex part that is
    /// empty, too long or not lower-case hex.
    pub fn parse(s: &str) -> Result<Rev, RevParseError> {
        let err = |why: &str| {
            Err(RevParseError(crate::cat(&[
                "invalid _rev \"",
                s,
                "\": ",
                why,
            ])))
        };
        let b = s.as_bytes();
        let mut dash = 0;
        while dash < b.len() && b[dash] != b'-' {
            dash += 1;
        }
        if dash == b.len() {
            return err("expected \"<generation>-<hex>\"");
        }
        let (gen, hash) = (&s[..dash], &s[dash + 1..]);
        if gen.is_empty() || !crate::only(gen, |b| b.is_ascii_digit()) || b[0] == b'0' {
            return err("generation must be a positive decimal integer");
        }
        let Some(generation) = decimal(gen) else {
            return err("generation exceeds 2^53-1");
        };
        if hash.is_empty() || hash.len() > MAX_REV_HEX {
            return err("hex part must be 1..=64 characters");
        }
        if !crate::only(hash, |b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return err("hex part must be lower-case hexadecimal");
        }
        Ok(Rev {
            generation,
            hash: hash.to_owned(),
        })
    }

    /// The revision that follows `prev` (or the first one) for a write
    /// described by `parts` (the body digest, then `updatedAt` when the
    /// record has one).
    ///
    /// # Errors
    /// When `prev` is already at [`MAX_GENERATION`].
    pub fn next(prev: Option<&Rev>, parts: &[&str]) -> Result<Rev, RevParseError> {
        let generation = match prev {
            None => 1,
            Some(p) if p.generation >= MAX_GENERATION => {
                return Err(RevParseError(
                    "revision generation would exceed 2^53-1".into(),
                ))
            }
            Some(p) => p.generation + 1,
        };
        let mut h = Md5::new();
        if let Some(p) = prev {
            h.update(p.text().as_bytes());
        }
        for part in parts {
            h.update(b"\n");
            h.update(part.as_bytes());
        }
        Ok(Rev {
            generation,
            hash: crate::canonical::hex(&h.finalize()),
        })
    }

    /// `"<generation>-<hex>"`, without `core::fmt` (kept off wasm paths).
    pub fn text(&self) -> String {
        let mut buf = [0u8; 20];
        let gen = crate::canonical::itoa(self.generation, &mut buf);
        let mut out = String::with_capacity(gen.len() + 1 + self.hash.len());
        for &d in gen {
            out.push(char::from(d));
        }
        out.push('-');
        out.push_str(&self.hash);
        out
    }
}

impl fmt::Display for Rev {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text())
    }
}

impl Ord for Rev {
    fn cmp(&self, other: &Self) -> Ordering {
        self.generation
            .cmp(&other.generation)
            .then_with(|| self.hash.cmp(&other.hash))
    }
}

impl PartialOrd for Rev {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// What the store currently holds for an id, as far as CAS is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Current {
    /// Nothing was ever stored under this id.
    Missing,
    /// A live record at this revision.
    Live(Rev),
    /// A tombstone at this revision.
    Deleted(Rev),
}

impl Current {
    /// The current revision, if any (live or tombstone).
    pub fn rev(&self) -> Option<&Rev> {
        match self {
            Current::Missing => None,
            Current::Live(r) | Current::Deleted(r) => Some(r),
        }
    }
}

/// Outcome of a refused compare-and-swap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CasError {
    /// The expected revision does not match what is stored (HTTP-like 409).
    Conflict,
    /// A delete of a record that does not exist or is already deleted (404).
    NotFound,
}

/// Decides a `put`: returns the revision the write builds on (`None` = first
/// write ever for this id).
///
/// - no `_rev`: allowed when nothing is stored or the id is a tombstone (the
///   generation continues); a live record means conflict;
/// - with `_rev`: must equal the current revision. A stale revision never
///   resurrects a deleted record (case C-S1); the tombstone's own revision
///   may, as in PouchDB.
///
/// # Errors
/// [`CasError::Conflict`] when the rules above refuse the write.
pub fn decide_put<'a>(
    current: &'a Current,
    expected: Option<&Rev>,
) -> Result<Option<&'a Rev>, CasError> {
    match (current, expected) {
        (Current::Missing, None) => Ok(None),
        (Current::Deleted(r), None) => Ok(Some(r)),
        (Current::Live(_), None) | (Current::Missing, Some(_)) => Err(CasError::Conflict),
        (Current::Live(r) | Current::Deleted(r), Some(e)) if r == e => Ok(Some(r)),
        (_, Some(_)) => Err(CasError::Conflict),
    }
}

/// Decides a `delete(id, rev)`: returns the revision the tombstone follows.
///
/// # Errors
/// [`CasError::NotFound`] when nothing live is stored, [`CasError::Conflict`]
/// when `expected` is not the live revision.
pub fn decide_delete<'a>(current: &'a Current, expected: &Rev) -> Result<&'a Rev, CasError> {
    match current {
        Current::Missing | Current::Deleted(_) => Err(CasError::NotFound),
        Current::Live(r) if r == expected => Ok(r),
        Current::Live(_) => Err(CasError::Conflict),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rev(s: &str) -> Rev {
        Rev::parse(s).unwrap()
    }

    #[test]
    fn decimal_reads_digits_up_to_2_pow_53_minus_1_and_nothing_else() {
        assert_eq!(decimal("0"), Some(0));
        assert_eq!(decimal("007"), Some(7));
        assert_eq!(decimal("9007199254740991"), Some(MAX_GENERATION));
        for bad in [
            "",
            "9007199254740992",
            "99999999999999999999999",
            "+1",
            "-1",
            "1a",
            " 1",
            "١",
        ] {
            assert_eq!(decimal(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn next_revision_is_deterministic_and_depends_on_parent_and_body() {
        let a = Rev::next(None, &["d1"]).unwrap();
        assert_eq!(a, Rev::next(None, &["d1"]).unwrap());
        assert_eq!(a.generation, 1);
        assert_eq!(a.hash.len(), 32);
        assert_ne!(a, Rev::next(None, &["d2"]).unwrap());
        assert_ne!(
            a,
            Rev::next(None, &["d1", "2026-01-01T00:00:00.000Z"]).unwrap()
        );
        let b = Rev::next(Some(&a), &["d1"]).unwrap();
        assert_eq!(b.generation, 2);
        assert_ne!(b.hash, a.hash);
        assert_eq!(Rev::parse(&b.to_string()).unwrap(), b);
        assert_eq!(b.text(), b.to_string());
        assert_eq!(b.text(), format!("2-{}", b.hash));
    }

    #[test]
    fn generation_stops_at_max_safe_integer() {
        let top = Rev {
            generation: MAX_GENERATION,
            hash: "ab".into(),
        };
        assert!(Rev::next(Some(&top), &["{}"]).is_err());
        let below = Rev {
            generation: MAX_GENERATION - 1,
            hash: "ab".into(),
        };
        assert_eq!(
            Rev::next(Some(&below), &["{}"]).unwrap().generation,
            MAX_GENERATION
        );
        assert!(Rev::parse("9007199254740991-ab").is_ok());
        assert!(Rev::parse("9007199254740992-ab").is_err());
    }

    #[test]
    fn malformed_revisions_are_refused() {
        for bad in [
            "",
            "1",
            "-ab",
            "0-ab",
            "01-ab",
            "+1-ab",
            "1-",
            "1-AB",
            "1-xyz",
            "a-ab",
            "1-ab-cd",
            &format!("1-{}", "a".repeat(65)),
        ] {
            assert!(Rev::parse(bad).is_err(), "{bad:?} accepted");
        }
        assert_eq!(rev("3-0a").generation, 3);
    }

    #[test]
    fn ordering_is_generation_then_hash_string() {
        assert!(rev("2-0") > rev("1-f"));
        assert!(
            rev("1-f8335ffa694941ebfc232fef178ae606") > rev("1-c9819547fefe64b233e69395821b50b1")
        );
        assert!(rev("10-a") > rev("9-b"));
    }

    #[test]
    fn stale_revision_after_delete_conflicts() {
        let r1 = rev("1-aa");
        let r2 = rev("2-bb");
        let tomb = Current::Deleted(r2.clone());
        assert_eq!(decide_put(&tomb, Some(&r1)), Err(CasError::Conflict));
        assert_eq!(decide_put(&tomb, None), Ok(Some(&r2)));
        assert_eq!(decide_put(&tomb, Some(&r2)), Ok(Some(&r2)));
    }

    #[test]
    fn create_and_update_rules() {
        let r1 = rev("1-aa");
        assert_eq!(decide_put(&Current::Missing, None), Ok(None));
        assert_eq!(
            decide_put(&Current::Missing, Some(&r1)),
            Err(CasError::Conflict)
        );
        let live = Current::Live(r1.clone());
        assert_eq!(decide_put(&live, None), Err(CasError::Conflict));
        assert_eq!(decide_put(&live, Some(&r1)), Ok(Some(&r1)));
        assert_eq!(
            decide_put(&live, Some(&rev("1-ab"))),
            Err(CasError::Conflict)
        );
    }

    #[test]
    fn delete_rules() {
        let r1 = rev("1-aa");
        assert_eq!(
            decide_delete(&Current::Missing, &r1),
            Err(CasError::NotFound)
        );
        assert_eq!(
            decide_delete(&Current::Deleted(r1.clone()), &r1),
            Err(CasError::NotFound)
        );
        assert_eq!(
            decide_delete(&Current::Live(r1.clone()), &rev("2-aa")),
            Err(CasError::Conflict)
        );
        assert_eq!(decide_delete(&Current::Live(r1.clone()), &r1), Ok(&r1));
    }
}
