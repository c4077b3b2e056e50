//! Reading a PouchDB dump (pouchdb-replication-stream format) and choosing
//! each document's winning revision the way PouchDB does — on plain revision
//! data (revision strings, deleted flags, `_revisions` ancestry), so the SDK
//! can apply it to values parsed by the browser's own `JSON.parse`.
//!
//! Format: a header line `{"version", "db_type", "db_info", …}`, then lines
//! `{"docs": [doc, …]}` where each doc is one revision with `_revisions`, and
//! `{"seq": N}` checkpoint lines (a line may carry both `docs` and `seq`).
//!
//! Winner rule (PouchDB's `winningRev`, pouchdb-merge): among the LEAF
//! revisions, non-deleted beats deleted, then the highest generation, then
//! the highest revision string. A revision named as an ancestor in any row's
//! `_revisions` is not a leaf and never wins, wherever it appears in the dump.

use crate::rev::{Rev, RevParseError};
use serde::Serialize;

/// Fields PouchDB keeps for itself; they are not part of a stored record
/// (`_local_seq` from the `local_seq` option, `_removed` from filtered
/// replication included).
pub const BOOKKEEPING_FIELDS: [&str; 8] = [
    "_revisions",
    "_conflicts",
    "_deleted",
    "_attachments",
    "_revs_info",
    "_deleted_conflicts",
    "_local_seq",
    "_removed",
];

/// Most leaves (live and deleted branches) one document of a dump may have.
/// Every row of an id is checked against the id's leaf set, so an unbounded
/// set made an import quadratic in the rows of one id, with memory growing
/// with the dump. PouchDB sets no such bound (its `revs_limit`, 1,000 by
/// default, bounds a branch's depth, not the number of branches); a real
/// document has a handful of conflicts. The leaves are counted as the rows
/// arrive: in a dump without `_revisions` (pouchdb-replication-stream
/// always writes them), leaves a later row names as its ancestors count
/// until that row.
pub const MAX_LEAVES: usize = 1_000;

/// One leaf revision of a document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leaf {
    /// The revision.
    pub rev: Rev,
    /// Whether it is a deletion (a tombstone).
    pub deleted: bool,
}

/// PouchDB's `winningRev` over a document's leaves: non-deleted first, then
/// the highest revision (generation, then hash string). `None` when empty.
pub fn winning_leaf(leaves: &[Leaf]) -> Option<&Leaf> {
    leaves
        .iter()
        .max_by(|a, b| (!a.deleted, &a.rev).cmp(&(!b.deleted, &b.rev)))
}

/// Non-deleted leaves other than the winner: PouchDB's `_conflicts`, highest first.
pub fn conflicts(leaves: &[Leaf]) -> Vec<&Rev> {
    let win = winning_leaf(leaves);
    let mut out: Vec<&Rev> = leaves
        .iter()
        .filter(|l| !l.deleted && Some(*l) != win)
        .map(|l| &l.rev)
        .collect();
    out.sort_unstable_by(|a, b| b.cmp(a));
    out
}

/// Adds one dump row to a document's leaf set.
///
/// `row_ancestors` are the revisions the row's `_revisions` names before its
/// own; `row_is_known_ancestor` says whether an earlier row named this row's
/// revision as an ancestor. A row that repeats a leaf, or that is an ancestor
/// of another row, adds nothing; leaves the row descends from stop being
/// leaves. Returns whether the set changed.
pub fn add_row(
    leaves: &mut Vec<Leaf>,
    row: Leaf,
    row_ancestors: &[Rev],
    row_is_known_ancestor: bool,
) -> bool {
    if row_is_known_ancestor || leaves.iter().any(|l| l.rev == row.rev) {
        return false;
    }
    leaves.retain(|l| !row_ancestors.contains(&l.rev));
    leaves.push(row);
    true
}

/// The ancestors named by a row's `_revisions` (`{start, ids}`, newest
/// first; `ids[0]` is the row's own revision): `(start-1)-ids[1]`, ….
///
/// `_revisions` must describe the row it is on: `start` is `rev`'s
/// generation and `ids[0]` its hash. PouchDB takes a doc's revision from
/// `_revisions` when it has one, so a row whose `_revisions` names another
/// revision (`_rev` 1-aa, `_revisions` 3-cc, 2-bb) is not one revision: taken
/// as `_rev` says, its ancestors could bury a newer leaf (2-bb) under an
/// older one. Such a row is refused, as is an empty `ids`.
///
/// # Errors
/// When `ids` is empty, `start` or `ids[0]` is not `rev`'s, `start` is below
/// the number of ids or a hash is not a revision hash.
pub fn revisions_ancestors(
    rev: &Rev,
    start: u64,
    ids: &[String],
) -> Result<Vec<Rev>, RevParseError> {
    match ids.first() {
        Some(own) if start == rev.generation && *own == rev.hash => {}
        _ => {
            return Err(RevParseError(crate::cat(&[
                "_revisions must start at the row's own _rev \"",
                &rev.text(),
                "\" (start its generation, ids[0] its hash)",
            ])))
        }
    }
    if ids.len() as u64 > start {
        return Err(RevParseError(
            "_revisions names more ancestors than its start generation allows".into(),
        ));
    }
    ids.iter()
        .enumerate()
        .skip(1)
        .map(|(i, h)| {
            let r = Rev {
                generation: start - i as u64,
                hash: h.clone(),
            };
            // Re-parse to apply the same hash rules as any other revision.
            Rev::parse(&r.text())
        })
        .collect()
}

/// Compact text form of a leaf set (`"2-ab,~3-cd"`; `~` marks a deletion),
/// so a caller can keep one per id outside its own memory (the SDK keeps
/// them in a JS `Map`).
pub fn encode_leaves(leaves: &[Leaf]) -> String {
    let mut s = String::new();
    for (i, l) in leaves.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        if l.deleted {
            s.push('~');
        }
        s.push_str(&l.rev.text());
    }
    s
}

/// Reads [`encode_leaves`]' form back.
///
/// # Errors
/// A malformed revision.
pub fn decode_leaves(s: &str) -> Result<Vec<Leaf>, RevParseError> {
    if s.is_empty() {
        return Ok(Vec::new());
    }
    s.split(',')
        .map(|part| {
            let (deleted, rev) = match part.strip_prefix('~') {
                Some(r) => (true, r),
                None => (false, part),
            };
            Ok(Leaf {
                rev: Rev::parse(rev)?,
                deleted,
            })
        })
        .collect()
}

/// What a dump line is, from which of `docs` / `seq` it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineKind {
    /// The first line without `docs`: the dump's header.
    Header,
    /// A line carrying documents (it may also carry `seq`).
    Docs,
    /// A checkpoint line `{"seq": N}` alone.
    Seq,
}

/// Classifies a dump line (`first`: it is the first non-empty line). A line
/// that carries documents is always read as documents, never skipped.
///
/// # Errors
/// A line that is none of the three.
pub fn classify_line(first: bool, has_docs: bool, has_seq: bool) -> Result<LineKind, &'static str> {
    if has_docs {
        Ok(LineKind::Docs)
    } else if has_seq {
        Ok(LineKind::Seq)
    } else if first {
        Ok(LineKind::Header)
    } else {
        Err("expected a header, {\"docs\": [...]} or {\"seq\": N}")
    }
}

/// Largest sequence number taken (2^53 − 1: a JS number holds it exactly).
const MAX_SEQ: u64 = crate::rev::MAX_GENERATION;

/// The sequence number a `seq` or `update_seq` given as a JSON number
/// names: a non-negative integer up to 2^53 − 1; `None` for any other
/// number.
pub fn seq_from_number(n: f64) -> Option<u64> {
    (n.fract() == 0.0 && (0.0..=MAX_SEQ as f64).contains(&n)).then_some(n as u64)
}

/// The sequence number a `seq` or `update_seq` given as a string names:
/// CouchDB's `"6582-g1AAAA…"` (the leading integer is the sequence number)
/// or plain digits (`"6582"`). `None` for anything else: no leading digits,
/// digits followed by something other than `-`, or a number above
/// 2^53 − 1.
pub fn seq_from_text(s: &str) -> Option<u64> {
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    let (number, rest) = s.split_at(digits);
    if number.is_empty() || !(rest.is_empty() || rest.starts_with("-")) {
        return None;
    }
    crate::rev::decimal(number)
}

/// Why a dump read to its end is not a whole dump.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Incomplete {
    /// The source holds no line at all (empty, or blank lines only): not
    /// even the header every dump starts with.
    Empty,
    /// The header's `db_info.update_seq` says the database had reached
    /// `update_seq` when the dump began, but the last `seq` the dump's
    /// lines reached is `last_seq` (lower, or none at all): the source was
    /// cut off (a download or copy that stopped, even at a line boundary).
    CutOff {
        /// The header's `db_info.update_seq`.
        update_seq: u64,
        /// The last `seq` read (a `{"seq": N}` line or a `docs` line's `seq`).
        last_seq: Option<u64>,
    },
}

/// Whether a dump read to its end is whole. `any_line`: the source held at
/// least one (non-blank) line; `update_seq`: the header's
/// `db_info.update_seq`, when it has one; `last_seq`: the last `seq` the
/// lines reached.
///
/// pouchdb-replication-stream writes the header (with `db.info()`, taken
/// before the changes are read) and then a `{"seq": N}` line after every
/// batch of changes, the last one at the end of the changes feed, so a
/// whole dump's last seq is at least the header's `update_seq` (more when
/// the database was written while it was dumped). Hence:
/// - no line at all is [`Incomplete::Empty`];
/// - a header without `update_seq` (or a dump without a header) cannot be
///   checked and is taken as whole;
/// - `update_seq` 0 (the database had never been written) is whole with or
///   without any `seq` line;
/// - otherwise the last seq must reach `update_seq`, else
///   [`Incomplete::CutOff`].
///
/// # Errors
/// [`Incomplete`] as above.
pub fn check_dump_end(
    any_line: bool,
    update_seq: Option<u64>,
    last_seq: Option<u64>,
) -> Result<(), Incomplete> {
    if !any_line {
        return Err(Incomplete::Empty);
    }
    match update_seq {
        Some(update_seq) if update_seq > 0 && last_seq.is_none_or(|l| l < update_seq) => {
            Err(Incomplete::CutOff {
                update_seq,
                last_seq,
            })
        }
        _ => Ok(()),
    }
}

/// Counts from reading a dump; the JS summary of `importPouchDump`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DumpSummary {
    /// Documents read from `docs` lines (every row, `_local/` included).
    pub documents_read: u64,
    /// Distinct ids whose winner is live.
    pub live: u64,
    /// Distinct ids whose winner is a tombstone.
    pub tombstones: u64,
    /// `_local/` documents skipped (they do not replicate).
    pub local_skipped: u64,
    /// Live ids with more than one live leaf (PouchDB's `_conflicts`),
    /// resolved to PouchDB's winner.
    pub conflicts_resolved: u64,
    /// The last `seq` seen, if any.
    pub last_seq: Option<u64>,
}

impl DumpSummary {
    /// Counts one id's final leaf set.
    pub fn count_id(&mut self, leaves: &[Leaf]) {
        match winning_leaf(leaves) {
            Some(w) if w.deleted => self.tombstones += 1,
            Some(_) => {
                self.live += 1;
                if !conflicts(leaves).is_empty() {
                    self.conflicts_resolved += 1;
                }
            }
            None => {}
        }
    }
}

/// What a legacy index document (a PouchDB doc holding `records: {id: meta}`,
/// kept up to date by unguarded read-modify-writes) had drifted to.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LegacyIndexReport {
    /// The legacy document's id.
    pub id: String,
    /// Ids it listed.
    pub listed: u64,
    /// Live records it did not list: orphans its listing never found.
    pub lost: u64,
    /// Ids it listed whose record is deleted or absent.
    pub stale: u64,
}

impl LegacyIndexReport {
    /// The report from counts: `listed` ids in the legacy document, of which
    /// `listed_live` are live winners (the document itself among them when
    /// `lists_itself`), and `live_others` live winners other than the legacy
    /// document itself. A document listing itself is neither stale (it is
    /// live) nor a found record (`live_others` leaves it out, so counting it
    /// would hide one lost record).
    pub fn from_counts(
        id: String,
        listed: u64,
        listed_live: u64,
        lists_itself: bool,
        live_others: u64,
    ) -> Self {
        let found = listed_live.saturating_sub(u64::from(lists_itself));
        LegacyIndexReport {
            id,
            listed,
            lost: live_others.saturating_sub(found),
            stale: listed.saturating_sub(listed_live),
        }
    }
}

/// The winner rule between an import and what the store holds, and between
/// two rows of one snapshot for the same id: the higher revision (generation,
/// then hash) wins and a tombstone is a revision like any other; an equal
/// revision keeps what is there. Returns whether `incoming` replaces `held`.
pub fn import_replaces(held: Option<&Rev>, incoming: &Rev) -> bool {
    held.is_none_or(|h| incoming > h)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;
    use std::collections::{BTreeMap, HashMap};

    const DUMP: &str = include_str!("../../../www/data/agent-records.pouchdump.ndjson");
    const EXPECTED: &str = include_str!("../../../www/data/agent-records.expected.json");

    /// One id's final state from [`resolve`].
    struct Resolved {
        leaves: Vec<Leaf>,
        /// The body of each leaf (by revision).
        bodies: HashMap<String, Value>,
    }

    /// Reads a whole dump with the rules above, the way the SDK does in its
    /// first pass (there over `JSON.parse` values).
    fn resolve(text: &str) -> Result<(DumpSummary, BTreeMap<String, Resolved>), (usize, String)> {
        let mut summary = DumpSummary::default();
        let mut ids: BTreeMap<String, Resolved> = BTreeMap::new();
        let mut ancestors: HashMap<String, Vec<Rev>> = HashMap::new();
        let mut first = true;
        for (i, line) in text.lines().enumerate() {
            let err = |m: &str| (i + 1, m.to_owned());
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            let v: Value = serde_json::from_str(line).map_err(|_| err("not JSON"))?;
            let kind = classify_line(first, v.get("docs").is_some(), v.get("seq").is_some())
                .map_err(err)?;
            first = false;
            if let Some(seq) = v.get("seq").and_then(seq_value) {
                summary.last_seq = Some(seq);
            }
            if kind != LineKind::Docs {
                continue;
            }
            for doc in v["docs"].as_array().ok_or_else(|| err("docs"))? {
                let id = doc["_id"].as_str().ok_or_else(|| err("_id"))?.to_owned();
                summary.documents_read += 1;
                if id.starts_with("_local/") {
                    summary.local_skipped += 1;
                    continue;
                }
                let rev = Rev::parse(doc["_rev"].as_str().ok_or_else(|| err("_rev"))?)
                    .map_err(|e| err(&e.0))?;
                let deleted = doc.get("_deleted") == Some(&Value::Bool(true));
                let anc = match doc.get("_revisions") {
                    Some(r) => {
                        let hashes: Vec<String> = r["ids"]
                            .as_array()
                            .unwrap()
                            .iter()
                            .map(|h| h.as_str().unwrap().to_owned())
                            .collect();
                        revisions_ancestors(&rev, r["start"].as_u64().unwrap(), &hashes)
                            .map_err(|e| err(&e.0))?
                    }
                    None => Vec::new(),
                };
                let known = ancestors.entry(id.clone()).or_default();
                let is_anc = known.contains(&rev);
                known.extend(anc.iter().cloned());
                let e = ids.entry(id).or_insert_with(|| Resolved {
                    leaves: Vec::new(),
                    bodies: HashMap::new(),
                });
                let rev_s = rev.to_string();
                if add_row(&mut e.leaves, Leaf { rev, deleted }, &anc, is_anc) {
                    e.bodies.insert(rev_s, doc.clone());
                }
            }
        }
        for r in ids.values() {
            summary.count_id(&r.leaves);
        }
        Ok((summary, ids))
    }

    /// A revision from its text.
    fn r(s: &str) -> Rev {
        Rev::parse(s).unwrap()
    }

    /// A `seq` / `update_seq` JSON value as the SDK reads one.
    fn seq_value(v: &Value) -> Option<u64> {
        match v {
            Value::Number(n) => seq_from_number(n.as_f64()?),
            Value::String(s) => seq_from_text(s),
            _ => None,
        }
    }

    /// [`check_dump_end`] over a dump text, as the SDK applies it after its
    /// first pass.
    fn dump_end(text: &str) -> Result<(), Incomplete> {
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        let update_seq = lines
            .first()
            .and_then(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| v.get("docs").is_none())
            .and_then(|v| v.pointer("/db_info/update_seq").and_then(seq_value));
        let (summary, _) = resolve(text).unwrap();
        check_dump_end(!lines.is_empty(), update_seq, summary.last_seq)
    }

    /// The shared dump (header `update_seq` 6582, last `{"seq": 6582}`) is
    /// whole; cut off at any line boundary before its last seq line, it is
    /// not, and the error names both seqs.
    #[test]
    fn the_shared_dump_is_whole_and_any_cut_before_its_last_seq_is_not() {
        assert_eq!(dump_end(DUMP), Ok(()));
        let lines: Vec<&str> = DUMP.lines().collect();
        let last_seq_line = lines
            .iter()
            .rposition(|l| l.starts_with("{\"seq\":"))
            .unwrap();
        assert_eq!(lines[last_seq_line], "{\"seq\":6582}");
        for keep in [1, 2, lines.len() / 2, last_seq_line] {
            let cut = lines[..keep].join("\n");
            match dump_end(&cut) {
                Err(Incomplete::CutOff {
                    update_seq: 6582,
                    last_seq,
                }) => assert!(last_seq.is_none_or(|s| s < 6582), "{keep} lines"),
                other => panic!("{keep} lines: {other:?}"),
            }
        }
        assert_eq!(
            dump_end(&lines[..last_seq_line].join("\n")),
            Err(Incomplete::CutOff {
                update_seq: 6582,
                last_seq: Some(6579)
            })
        );
    }

    #[test]
    fn an_empty_source_is_refused_and_a_dump_without_update_seq_or_at_zero_is_whole() {
        assert_eq!(check_dump_end(false, None, None), Err(Incomplete::Empty));
        assert_eq!(dump_end(""), Err(Incomplete::Empty));
        assert_eq!(dump_end("\n  \n"), Err(Incomplete::Empty));
        // No update_seq to compare with: taken as whole.
        assert_eq!(
            dump_end("{\"version\":\"1.2.9\",\"db_type\":\"idb\"}\n"),
            Ok(())
        );
        assert_eq!(
            dump_end("{\"docs\":[{\"_id\":\"a\",\"_rev\":\"1-a\"}]}\n"),
            Ok(())
        );
        // A database never written: nothing to wait for.
        assert_eq!(
            dump_end("{\"version\":\"1.2.9\",\"db_info\":{\"update_seq\":0}}\n"),
            Ok(())
        );
        assert_eq!(check_dump_end(true, Some(0), None), Ok(()));
        // Writes during the dump: the last seq passes update_seq.
        assert_eq!(check_dump_end(true, Some(5), Some(9)), Ok(()));
        assert_eq!(check_dump_end(true, Some(5), Some(5)), Ok(()));
        assert_eq!(
            check_dump_end(true, Some(5), None),
            Err(Incomplete::CutOff {
                update_seq: 5,
                last_seq: None
            })
        );
    }

    /// CouchDB's string sequences: the leading integer is the seq, in the
    /// header and in `seq` lines alike.
    #[test]
    fn couchdb_string_seqs_count_by_their_leading_integer() {
        assert_eq!(
            seq_from_text("6582-g1AAAAFTeJzLYWBg4MhgTmHgzcvPy09JdcjLz8gvLskBCeexAEmGA0Dqfx"),
            Some(6582)
        );
        assert_eq!(seq_from_text("6582"), Some(6582));
        assert_eq!(seq_from_text("0-g1"), Some(0));
        assert_eq!(
            seq_from_text("9007199254740991"),
            Some(9_007_199_254_740_991)
        );
        for bad in [
            "",
            "-5",
            "g1-6582",
            "12abc",
            " 12",
            "12 ",
            "9007199254740992",
            "99999999999999999999999-x",
        ] {
            assert_eq!(seq_from_text(bad), None, "{bad:?}");
        }
        assert_eq!(seq_from_number(6582.0), Some(6582));
        assert_eq!(seq_from_number(0.0), Some(0));
        assert_eq!(seq_from_number(-0.0), Some(0));
        for bad in [-1.0, 1.5, f64::NAN, f64::INFINITY, 9_007_199_254_740_992.0] {
            assert_eq!(seq_from_number(bad), None, "{bad}");
        }
        let header = |seq: &str| format!("{{\"db_info\":{{\"update_seq\":{seq}}}}}");
        let whole = format!("{}\n{{\"seq\":\"12-g1AAB\"}}\n", header("\"12-g1AAA\""));
        assert_eq!(dump_end(&whole), Ok(()));
        let cut = format!("{}\n{{\"seq\":\"9-g1AAB\"}}\n", header("\"12-g1AAA\""));
        assert_eq!(
            dump_end(&cut),
            Err(Incomplete::CutOff {
                update_seq: 12,
                last_seq: Some(9)
            })
        );
    }

    /// Every id's winner equals PouchDB's own answer in the shared expected file.
    #[test]
    fn winners_match_pouchdb_answers_on_the_shared_dump() {
        let (summary, ids) = resolve(DUMP).unwrap();
        let expected: Value = serde_json::from_str(EXPECTED).unwrap();
        let live = expected["live"].as_object().unwrap();
        let deleted: Vec<&str> = expected["deleted"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert_eq!(summary.live as usize, live.len());
        assert_eq!(summary.tombstones as usize, deleted.len());
        assert_eq!(ids.len(), live.len() + deleted.len());
        for (id, r) in &ids {
            let w = winning_leaf(&r.leaves).unwrap();
            if w.deleted {
                assert!(deleted.contains(&id.as_str()), "{id} should be live");
                continue;
            }
            let e = &live[id];
            let body = &r.bodies[&w.rev.to_string()];
            assert_eq!(w.rev.to_string(), e["rev"].as_str().unwrap(), "{id}");
            assert_eq!(body.get("recordType"), e.get("recordType"), "{id}");
            assert_eq!(body.get("updatedAt"), e.get("updatedAt"), "{id}");
            let got: Vec<String> = conflicts(&r.leaves).iter().map(|r| r.to_string()).collect();
            let want: Vec<String> = e["conflicts"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap().to_owned())
                .collect();
            assert_eq!(got, want, "{id}");
        }
        let conflicted = live
            .values()
            .filter(|e| !e["conflicts"].as_array().unwrap().is_empty())
            .count();
        assert_eq!(summary.conflicts_resolved as usize, conflicted);
        assert_eq!(summary.last_seq, Some(6582));
    }

    #[test]
    fn deleted_leaf_loses_to_a_lower_live_leaf_and_local_docs_are_skipped() {
        let dump = concat!(
            "{\"version\":\"1.2.9\"}\n",
            "{\"docs\":[{\"_id\":\"x\",\"_rev\":\"3-aa\",\"_deleted\":true},{\"_id\":\"x\",\"_rev\":\"2-bb\",\"v\":2}]}\n",
            "{\"docs\":[{\"_id\":\"_local/cp\",\"_rev\":\"0-1\"},{\"_id\":\"y\",\"_rev\":\"1-aa\",\"_deleted\":true}]}\n",
            "{\"seq\":4}\n"
        );
        let (s, ids) = resolve(dump).unwrap();
        assert_eq!(
            (s.documents_read, s.live, s.tombstones, s.local_skipped),
            (4, 1, 1, 1)
        );
        let x = winning_leaf(&ids["x"].leaves).unwrap();
        assert_eq!((x.rev.to_string().as_str(), x.deleted), ("2-bb", false));
        assert!(winning_leaf(&ids["y"].leaves).unwrap().deleted);
    }

    /// Issue 15: `x` live at 1-a in one row, deleted at its child 2-b (with
    /// `_revisions` naming 1-a) in another: 1-a is no leaf, so `x` is deleted
    /// — in either row order.
    #[test]
    fn an_ancestor_revision_never_wins_in_either_row_order() {
        let live =
            "{\"_id\":\"x\",\"_rev\":\"1-a\",\"v\":1,\"_revisions\":{\"start\":1,\"ids\":[\"a\"]}}";
        let dead = "{\"_id\":\"x\",\"_rev\":\"2-b\",\"_deleted\":true,\"_revisions\":{\"start\":2,\"ids\":[\"b\",\"a\"]}}";
        for (first, second) in [(live, dead), (dead, live)] {
            let dump = format!("{{}}\n{{\"docs\":[{first}]}}\n{{\"docs\":[{second}]}}\n");
            let (s, ids) = resolve(&dump).unwrap();
            let w = winning_leaf(&ids["x"].leaves).unwrap();
            assert_eq!((w.rev.to_string().as_str(), w.deleted), ("2-b", true));
            assert_eq!((s.live, s.tombstones), (0, 1));
        }
    }

    #[test]
    fn add_row_drops_the_leaves_a_row_descends_from_and_ignores_repeats() {
        let r = |s: &str| Rev::parse(s).unwrap();
        let mut leaves = vec![
            Leaf {
                rev: r("2-a1"),
                deleted: false,
            },
            Leaf {
                rev: r("3-b2"),
                deleted: false,
            },
        ];
        assert!(!add_row(
            &mut leaves,
            Leaf {
                rev: r("3-b2"),
                deleted: true
            },
            &[],
            false
        ));
        assert!(!add_row(
            &mut leaves,
            Leaf {
                rev: r("1-c3"),
                deleted: false
            },
            &[],
            true
        ));
        // 4-d4 descends from 3-b2: leaves are 2-a1 (live) and 4-d4 (deleted); 2-a1 wins.
        assert!(add_row(
            &mut leaves,
            Leaf {
                rev: r("4-d4"),
                deleted: true
            },
            &[r("3-b2"), r("2-e5")],
            false
        ));
        assert_eq!(leaves.len(), 2);
        assert_eq!(winning_leaf(&leaves).unwrap().rev, r("2-a1"));
        assert_eq!(decode_leaves(&encode_leaves(&leaves)).unwrap(), leaves);
        assert_eq!(encode_leaves(&leaves), "2-a1,~4-d4");
    }

    #[test]
    fn revisions_name_ancestors_newest_first() {
        let a = revisions_ancestors(&r("3-c"), 3, &["c".into(), "b".into(), "a".into()]).unwrap();
        assert_eq!(
            a.iter().map(Rev::to_string).collect::<Vec<_>>(),
            ["2-b", "1-a"]
        );
        assert!(revisions_ancestors(&r("1-b"), 1, &["b".into(), "a".into()]).is_err());
        assert!(revisions_ancestors(&r("2-b"), 2, &["b".into(), "XYZ".into()]).is_err());
    }

    /// `_revisions` must describe the row's own `_rev`: a `start` or
    /// `ids[0]` of another revision, or no ids at all, is refused (the
    /// reviewers' row `_rev` 1-aa with `_revisions` 3-cc, 2-bb would
    /// otherwise bury the newer leaf 2-bb under 1-aa).
    #[test]
    fn revisions_that_disagree_with_the_rows_rev_are_refused() {
        let ids = |h: &[&str]| h.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let e = revisions_ancestors(&r("1-aa"), 3, &ids(&["cc", "bb"])).unwrap_err();
        assert!(e.0.contains("\"1-aa\""), "{e:?}");
        // The right start, another hash; the right hash, another start.
        assert!(revisions_ancestors(&r("2-aa"), 2, &ids(&["bb", "cc"])).is_err());
        assert!(revisions_ancestors(&r("2-aa"), 3, &ids(&["aa", "cc"])).is_err());
        assert!(revisions_ancestors(&r("2-aa"), 1, &ids(&["aa"])).is_err());
        assert!(revisions_ancestors(&r("1-aa"), 1, &[]).is_err());
        // Hashes compare exactly (a revision hash is lower-case hex).
        assert!(revisions_ancestors(&r("1-aa"), 1, &ids(&["AA"])).is_err());
        // A row's own revision alone, or with its ancestors, is accepted.
        assert_eq!(
            revisions_ancestors(&r("1-aa"), 1, &ids(&["aa"])),
            Ok(vec![])
        );
        assert_eq!(
            revisions_ancestors(&r("3-cc"), 3, &ids(&["cc", "bb"])),
            Ok(vec![r("2-bb")])
        );
    }

    /// The reviewers' dump: a row 1-aa whose `_revisions` says 3-cc, 2-bb,
    /// then a row 2-bb, in either order, is refused naming the bad row's line.
    #[test]
    fn a_dump_row_whose_revisions_disagree_with_its_rev_is_refused_naming_its_line() {
        let head = "{\"version\":\"1.2.4\",\"db_type\":\"leveldb\",\"db_info\":{\"doc_count\":1,\"update_seq\":2}}";
        let bad = "{\"docs\":[{\"_id\":\"x\",\"_rev\":\"1-aa\",\"v\":\"old\",\"_revisions\":{\"start\":3,\"ids\":[\"cc\",\"bb\"]}}]}";
        let new = "{\"docs\":[{\"_id\":\"x\",\"_rev\":\"2-bb\",\"v\":\"new\"}]}";
        let end = "{\"seq\":2}";
        for (lines, at) in [([head, bad, new, end], 2), ([head, new, bad, end], 3)] {
            let err = resolve(&lines.join("\n")).err().expect("refused");
            assert_eq!(err.0, at, "{err:?}");
            assert!(err.1.contains("_revisions"), "{err:?}");
        }
    }

    /// A line holding both `docs` and `seq` is documents (issue 15: such a
    /// dump used to import nothing), and its seq is still recorded.
    #[test]
    fn a_line_with_docs_and_seq_is_read_as_documents() {
        assert_eq!(classify_line(false, true, true), Ok(LineKind::Docs));
        assert_eq!(classify_line(true, true, true), Ok(LineKind::Docs));
        assert_eq!(classify_line(true, false, false), Ok(LineKind::Header));
        assert!(classify_line(false, false, false).is_err());
        let dump = "{\"version\":1}\n{\"docs\":[{\"_id\":\"a\",\"_rev\":\"1-a\"}],\"seq\":7}\n";
        let (s, _) = resolve(dump).unwrap();
        assert_eq!((s.documents_read, s.live, s.last_seq), (1, 1, Some(7)));
    }

    #[test]
    fn legacy_report_counts_lost_and_stale_ids() {
        let r = LegacyIndexReport::from_counts("agent-index".into(), 10, 7, false, 9);
        assert_eq!((r.listed, r.lost, r.stale), (10, 2, 3));
    }

    /// A legacy document listing its own id (`records: {"agent-index": {},
    /// "r1": {}}` beside live r1, r2, r3) lost r2 and r3: its own entry is
    /// neither a found record nor stale.
    #[test]
    fn a_legacy_index_listing_itself_still_counts_every_lost_record() {
        let r = LegacyIndexReport::from_counts("agent-index".into(), 2, 2, true, 3);
        assert_eq!((r.listed, r.lost, r.stale), (2, 2, 0));
    }

    #[test]
    fn an_import_replaces_only_a_lower_revision() {
        let r = |s: &str| Rev::parse(s).unwrap();
        assert!(import_replaces(None, &r("1-a")));
        assert!(import_replaces(Some(&r("1-f")), &r("2-a")));
        assert!(import_replaces(Some(&r("2-a")), &r("2-b")));
        assert!(!import_replaces(Some(&r("2-b")), &r("2-b")));
        assert!(!import_replaces(Some(&r("3-a")), &r("2-f")));
    }
}
