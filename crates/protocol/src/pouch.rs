//! Reading a PouchDB dump (pouchdb-replication-stream format) and choosing
//! each document's winning revision the way PouchDB does.
//!
//! Format: a header line `{"version", "db_type", "db_info", …}`, then lines
//! `{"docs": [doc, …]}` where each doc is one leaf revision with `_revisions`,
//! and `{"seq": N}` checkpoint lines. Winner rule (PouchDB's `winningRev`):
//! non-deleted leaves beat deleted ones, then the highest generation, then
//! the highest revision string.

use crate::rev::Rev;
use serde::Serialize;
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// One document's winning revision, ready to store.
#[derive(Debug, Clone, PartialEq)]
pub struct Winner {
    /// The document id.
    pub id: String,
    /// The winning revision, kept in PouchDB's form.
    pub rev: Rev,
    /// Whether the winner is a tombstone (every leaf deleted).
    pub deleted: bool,
    /// The body with `_id` and `_rev` and without PouchDB's bookkeeping
    /// (`_revisions`, `_conflicts`, `_deleted`, `_attachments`).
    pub body: Map<String, Value>,
    /// Losing non-deleted leaf revisions (PouchDB's `_conflicts`).
    pub conflicts: Vec<Rev>,
}

/// Counts from reading a dump; the JS summary of `importPouchDump`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DumpSummary {
    /// Leaf documents read from `docs` lines.
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
    /// The last `{"seq": N}` line, if any.
    pub last_seq: Option<u64>,
}

/// A dump line that could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DumpError {
    /// 1-based line number.
    pub line: usize,
    /// What was wrong.
    pub message: String,
}

impl std::fmt::Display for DumpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PouchDB dump line {}: {}", self.line, self.message)
    }
}

impl std::error::Error for DumpError {}

struct Leaf {
    rev: Rev,
    deleted: bool,
    body: Map<String, Value>,
}

/// Reads a whole dump and returns the summary and one [`Winner`] per id, in id order.
///
/// # Errors
/// [`DumpError`] for a line that is not JSON, a doc without a string `_id`
/// or with a malformed `_rev`. Nothing is returned in that case, so an import
/// built on this writes nothing.
pub fn resolve_dump(text: &str) -> Result<(DumpSummary, Vec<Winner>), DumpError> {
    let mut summary = DumpSummary::default();
    let mut leaves: BTreeMap<String, Vec<Leaf>> = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        let err = |message: String| DumpError {
            line: i + 1,
            message,
        };
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let value: Value = serde_json::from_str(line).map_err(|e| err(format!("not JSON: {e}")))?;
        let Value::Object(mut obj) = value else {
            return Err(err("expected a JSON object".into()));
        };
        if let Some(seq) = obj.get("seq") {
            summary.last_seq = seq.as_u64();
            continue;
        }
        let Some(docs) = obj.remove("docs") else {
            if i == 0 {
                continue; // header line
            }
            return Err(err(
                "expected a header, {\"docs\": [...]} or {\"seq\": N}".into()
            ));
        };
        let Value::Array(docs) = docs else {
            return Err(err("\"docs\" must be an array".into()));
        };
        for doc in docs {
            let Value::Object(mut doc) = doc else {
                return Err(err("a doc must be an object".into()));
            };
            let id = match doc.get("_id") {
                Some(Value::String(s)) if !s.is_empty() => s.clone(),
                _ => return Err(err("a doc has no string _id".into())),
            };
            summary.documents_read += 1;
            if id.starts_with("_local/") {
                summary.local_skipped += 1;
                continue;
            }
            let rev = match doc.get("_rev") {
                Some(Value::String(s)) => Rev::parse(s).map_err(|e| err(e.0))?,
                _ => return Err(err(format!("doc {id:?} has no string _rev"))),
            };
            let deleted = doc.get("_deleted") == Some(&Value::Bool(true));
            for k in [
                "_revisions",
                "_conflicts",
                "_deleted",
                "_attachments",
                "_revs_info",
                "_deleted_conflicts",
            ] {
                doc.remove(k);
            }
            let entry = leaves.entry(id).or_default();
            if !entry.iter().any(|l| l.rev == rev) {
                entry.push(Leaf {
                    rev,
                    deleted,
                    body: doc,
                });
            }
        }
    }
    let mut winners = Vec::with_capacity(leaves.len());
    for (id, mut ls) in leaves {
        // Non-deleted first, then highest revision: sort so the winner is last.
        ls.sort_by(|a, b| (!a.deleted, &a.rev).cmp(&(!b.deleted, &b.rev)));
        let Some(win) = ls.pop() else { continue };
        let conflicts = ls
            .iter()
            .filter(|l| !l.deleted)
            .map(|l| l.rev.clone())
            .rev()
            .collect();
        if !win.deleted && ls.iter().any(|l| !l.deleted) {
            summary.conflicts_resolved += 1;
        }
        if win.deleted {
            summary.tombstones += 1;
        } else {
            summary.live += 1;
        }
        winners.push(Winner {
            id,
            rev: win.rev,
            deleted: win.deleted,
            body: win.body,
            conflicts,
        });
    }
    Ok((summary, winners))
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

/// Compares the legacy index document `index_id` (if the dump has it live,
/// with a `records` object) with the winners it should describe: every live
/// document except itself.
pub fn legacy_index_report(winners: &[Winner], index_id: &str) -> Option<LegacyIndexReport> {
    let doc = winners.iter().find(|w| w.id == index_id && !w.deleted)?;
    let Some(Value::Object(listed)) = doc.body.get("records") else {
        return None;
    };
    let live: std::collections::HashSet<&str> = winners
        .iter()
        .filter(|w| !w.deleted && w.id != index_id)
        .map(|w| w.id.as_str())
        .collect();
    Some(LegacyIndexReport {
        id: index_id.to_owned(),
        listed: listed.len() as u64,
        lost: live.iter().filter(|id| !listed.contains_key(**id)).count() as u64,
        stale: listed
            .keys()
            .filter(|id| !live.contains(id.as_str()))
            .count() as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const DUMP: &str = include_str!("../../../www/data/agent-records.pouchdump.ndjson");
    const EXPECTED: &str = include_str!("../../../www/data/agent-records.expected.json");

    /// Every id's winner equals PouchDB's own answer in the shared expected file.
    #[test]
    fn winners_match_pouchdb_answers_on_the_shared_dump() {
        let (summary, winners) = resolve_dump(DUMP).unwrap();
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
        assert_eq!(winners.len(), live.len() + deleted.len());
        for w in &winners {
            if w.deleted {
                assert!(deleted.contains(&w.id.as_str()), "{} should be live", w.id);
                continue;
            }
            let e = &live[&w.id];
            assert_eq!(w.rev.to_string(), e["rev"].as_str().unwrap(), "{}", w.id);
            assert_eq!(w.body.get("recordType"), e.get("recordType"), "{}", w.id);
            assert_eq!(w.body.get("updatedAt"), e.get("updatedAt"), "{}", w.id);
            let conflicts: Vec<String> = w.conflicts.iter().map(Rev::to_string).collect();
            let want: Vec<String> = e["conflicts"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap().to_owned())
                .collect();
            assert_eq!(conflicts, want, "{}", w.id);
        }
        let conflicted = live
            .values()
            .filter(|e| !e["conflicts"].as_array().unwrap().is_empty())
            .count();
        assert_eq!(summary.conflicts_resolved as usize, conflicted);
        assert_eq!(summary.last_seq, Some(6582));
    }

    /// Computed independently of the legacy document's own claims: the live
    /// ids it lacks and the listed ids that are not live.
    #[test]
    fn legacy_index_report_counts_what_the_old_index_lost() {
        let (_, winners) = resolve_dump(DUMP).unwrap();
        let r = legacy_index_report(&winners, "agent-index").unwrap();
        let expected: Value = serde_json::from_str(EXPECTED).unwrap();
        let live = expected["live"].as_object().unwrap();
        let doc = winners.iter().find(|w| w.id == "agent-index").unwrap();
        let listed = doc.body["records"].as_object().unwrap();
        let lost = live
            .keys()
            .filter(|k| *k != "agent-index" && !listed.contains_key(*k))
            .count();
        let stale = listed.keys().filter(|k| !live.contains_key(*k)).count();
        assert_eq!(
            (r.listed as usize, r.lost as usize, r.stale as usize),
            (listed.len(), lost, stale)
        );
        assert!(
            r.lost > 0,
            "the shared dump's legacy index did lose records"
        );
        assert_eq!(legacy_index_report(&winners, "no-such-doc"), None);
    }

    #[test]
    fn deleted_leaf_loses_to_a_lower_live_leaf_and_local_docs_are_skipped() {
        let dump = concat!(
            "{\"version\":\"1.2.9\"}\n",
            "{\"docs\":[{\"_id\":\"x\",\"_rev\":\"3-aa\",\"_deleted\":true},{\"_id\":\"x\",\"_rev\":\"2-bb\",\"v\":2}]}\n",
            "{\"docs\":[{\"_id\":\"_local/cp\",\"_rev\":\"0-1\"},{\"_id\":\"y\",\"_rev\":\"1-aa\",\"_deleted\":true}]}\n",
            "{\"seq\":4}\n"
        );
        let (s, w) = resolve_dump(dump).unwrap();
        assert_eq!(
            (s.documents_read, s.live, s.tombstones, s.local_skipped),
            (4, 1, 1, 1)
        );
        assert_eq!(w[0].rev.to_string(), "2-bb");
        assert!(!w[0].deleted);
        assert!(w[1].deleted);
    }

    #[test]
    fn a_bad_line_names_its_number() {
        let e = resolve_dump("{\"version\":1}\n{\"docs\":[{\"_rev\":\"1-a\"}]}\n").unwrap_err();
        assert_eq!(e.line, 2);
        assert!(resolve_dump("{}\nnot json")
            .unwrap_err()
            .message
            .contains("not JSON"));
    }
}
