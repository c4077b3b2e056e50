//! Bulk paths: PouchDB dump import, NDJSON snapshot export/import (cargo
//! feature `io`: the package builds it as its own module, `pkg/io/`, which
//! the store loads on the first import or export; see `crate::api`).
//!
//! Imports read their source twice, streaming, with the lines kept as JS
//! strings (a Blob through one the SDK made over it, whose `stream` is the
//! platform's: both passes read the same bytes; see `Source::from_js`):
//! pass 1 parses and validates every line and chooses each id's
//! winner (only revision metadata is kept, per id, in a JS `Map`); pass 2
//! reads again and writes each id's winner once, in batches of `batch`
//! records per transaction. A bad line therefore fails the import before
//! anything is written, and no record other than an id's winner is ever
//! written (the derived indexes and `watch` see only winners).

use super::calls::{read_after, Calls};
use super::db::{KeyRange, Query, TransactionMode, RECORDS, TOMBSTONES};
use super::index;
use super::lines::{ExportOptions, ImportOptions, JsBlob, Lines, Source, DEFAULT_BATCH};
use super::mutate::{check_abort, settle_callback};
use super::{read_many, tombstone, Store};
use crate::error::{set, Result, StoreError};
use agentstore_protocol::pouch::{
    add_row, check_dump_end, classify_line, decode_leaves, encode_leaves, import_replaces,
    revisions_ancestors, seq_from_number, seq_from_text, winning_leaf, DumpSummary, Incomplete,
    Leaf, LegacyIndexReport, LineKind, BOOKKEEPING_FIELDS,
};
use agentstore_protocol::rev::{Current, Rev};
use js_sys::{Array, Function, JsString, Map, Object, Reflect};
use wasm_bindgen::{JsCast, JsValue};

#[wasm_bindgen::prelude::wasm_bindgen(module = "/js/parse.js")]
extern "C" {
    /// `JSON.parse` of an import's line (a JS string: no copy into linear
    /// memory) with every `-0` made `0`, as `put` stores numbers
    /// (js/parse.js `parseLine`).
    #[wasm_bindgen(js_name = parseLine)]
    fn parse_line_js(text: &JsString) -> JsValue;
}

/// [`parse_line_js`]: `Err(())` when the text is not JSON (the JS side
/// answers `undefined`, which `JSON.parse` never does, instead of throwing
/// through a `catch` binding: see `value::call1`).
fn parse_line(text: &JsString) -> std::result::Result<JsValue, ()> {
    let v = parse_line_js(text);
    if v.is_undefined() {
        Err(())
    } else {
        Ok(v)
    }
}

/// What an import wrote.
#[derive(Debug, Default, Clone, Copy)]
pub struct ImportCounts {
    /// Records and tombstones written.
    pub written: u32,
    /// Ids skipped because the store already held an equal or newer revision.
    pub kept_newer: u32,
}

/// One winner waiting for its batch's transaction.
struct Staged {
    id: JsString,
    rev: Rev,
    deleted: bool,
    object: JsValue,
}

impl Staged {
    /// The winning row of `id` at revision `win` (a JS string): a tombstone
    /// when `deleted`, else `doc` as it is.
    fn winner(id: JsValue, win: &JsValue, deleted: bool, doc: JsValue) -> Result<Staged> {
        let rev_text = win.as_string().unwrap_or_default();
        let rev = Rev::parse(&rev_text).map_err(|e| StoreError::Transaction(e.0))?;
        let id: JsString = id.unchecked_into();
        let object = if deleted {
            let t = tombstone(&id, &rev_text);
            // A snapshot keeps when the record was deleted (purgeTombstones'
            // clock; `check_tombstone_line` checked it in pass 1), and so
            // does a PouchDB dump's deleted document that carries one.
            if let Some(at) = get(&doc, "deletedAt").as_f64().filter(|at| at.is_finite()) {
                set(&t, "deletedAt", &at.into());
            }
            t.into()
        } else {
            doc
        };
        Ok(Staged {
            id,
            rev,
            deleted,
            object,
        })
    }
}

/// Pass 2 of an import: collects winners and writes them `opts.batch` at a
/// time, reporting progress after each committed batch.
struct Writer<'a> {
    store: &'a Store,
    opts: &'a ImportOptions,
    /// Ids the import resolves to (the progress total).
    total: u32,
    staged: Vec<Staged>,
    counts: ImportCounts,
    mode: WriteMode,
}

impl<'a> Writer<'a> {
    fn new(store: &'a Store, opts: &'a ImportOptions, total: u32) -> Self {
        Writer {
            store,
            opts,
            total,
            staged: Vec::new(),
            counts: ImportCounts::default(),
            mode: WriteMode::Unknown,
        }
    }

    /// Stages `item`, writing a batch when it is full. Answers whether the
    /// import is complete (every winner written): the caller then stops
    /// reading, so nothing after the last write (an abort while the rest of
    /// the source is read) can report the written import as not done.
    async fn push(&mut self, item: Staged) -> Result<bool> {
        self.staged.push(item);
        if self.staged.len() >= self.opts.batch as usize {
            self.flush(false).await?;
        }
        Ok(self.counts.written + self.counts.kept_newer >= self.total)
    }

    async fn finish(mut self) -> Result<ImportCounts> {
        self.flush(true).await?;
        // A `close()` during the import (in the last `onProgress`, or while
        // the source was read and nothing was left to write) ends it as it
        // ends one with batches left: with ClosedError.
        self.store.check_open()?;
        Ok(self.counts)
    }

    /// Writes the staged winners in one transaction (each only over a lower
    /// stored revision), then reports progress. What `onProgress` throws
    /// ends the import with it, unless this was the last batch (`last`, or
    /// every winner is written): the import is then complete, and says so,
    /// as `rebuildIndexes` does.
    async fn flush(&mut self, last: bool) -> Result<()> {
        if self.staged.is_empty() {
            return Ok(());
        }
        check_abort(self.opts.signal.as_ref())?;
        let batch = loop {
            match self.store.write_batch(&self.staged, &mut self.mode).await {
                Ok(b) => break b,
                // A write from elsewhere made `add()` fail (the batch ran
                // without reads, `mode` is still not `Read`): read, retry once.
                Err(StoreError::Transaction(m))
                    if self.mode != WriteMode::Read && m.starts_with("ConstraintError") =>
                {
                    self.mode = WriteMode::Read;
                }
                Err(e) => return Err(e),
            }
        };
        self.counts.written += batch.written;
        self.counts.kept_newer += batch.kept_newer;
        let done = self.counts.written + self.counts.kept_newer;
        self.staged.clear();
        // Committed; closed meanwhile: no progress call after close(), and
        // the call rejects with ClosedError.
        self.store.check_open()?;
        if let Some(cb) = &self.opts.on_progress {
            let called = crate::value::call2(cb, &JsValue::NULL, &done.into(), &self.total.into());
            // An async `onProgress` is awaited before the next batch (no
            // transaction is open here: the batch committed).
            let complete = last || done >= self.total;
            let called =
                settle_callback(called, self.opts.signal.as_ref(), self.store, complete).await?;
            if let Err(e) = called {
                if !complete {
                    return Err(StoreError::Thrown(e));
                }
            }
        }
        Ok(())
    }
}

/// The legacy index document's drift, from its winning row's `records` and
/// the winners (`leaves`: id → winning revision; `dead`: ids whose winner is
/// deleted).
fn legacy_report(
    leaves: &Map,
    dead: &js_sys::Set,
    legacy_index_id: &str,
    rows: &Map,
    live_others: u64,
) -> Option<LegacyIndexReport> {
    let key = JsValue::from_str(legacy_index_id);
    let win = leaves.get(&key);
    if win.is_undefined() || dead.has(&key) {
        return None;
    }
    let records = &rows.get(&win);
    if !records.is_object() || Array::is_array(records) {
        return None;
    }
    let listed = Object::keys(records.unchecked_ref::<Object>());
    let listed_live = listed
        .iter()
        .filter(|id| !leaves.get(id).is_undefined() && !dead.has(id))
        .count() as u64;
    // The document is a live winner here (checked above).
    let lists_itself = listed.includes(&key, 0);
    Some(LegacyIndexReport::from_counts(
        legacy_index_id.to_owned(),
        u64::from(listed.length()),
        listed_live,
        lists_itself,
        live_others,
    ))
}

/// How a batch learns what the store holds for its ids.
#[derive(Clone, Copy, PartialEq, Eq)]
enum WriteMode {
    /// Not decided yet (before the first batch).
    Unknown,
    /// The store was empty when the import began. Each id is written once
    /// per import, so an id of a new batch can only be present if something
    /// else wrote it meanwhile, and each batch checks for that without a
    /// read per id: live records and tombstones are written with `add()`,
    /// which refuses an id already in that store (the batch is then retried
    /// reading); the tombstones store must still hold exactly the `dead`
    /// tombstones this import wrote (counted, so only while it is small);
    /// and a tombstone's id is looked up among the live records.
    Fresh { dead: u32 },
    /// Read each id's live record and tombstone first.
    Read,
}

/// Tombstones an import into an empty store may write before it reads per
/// id again (counting the tombstones store costs time in proportion to it).
const FRESH_MAX_TOMBSTONES: u32 = 20_000;

/// "`what` line `n`: `why`" — a ValidationError naming the line.
fn line_error(what: &str, n: usize, why: &str) -> StoreError {
    let n = agentstore_protocol::canonical::decimal(n as u64);
    StoreError::validation(agentstore_protocol::cat(&[what, " line ", &n, ": ", why]))
}

thread_local! {
    /// Property names as JS strings, made once: imports read a handful of
    /// fields of every document, and a fresh JS string per read (decoded from
    /// wasm memory) costs more than the read.
    static KEYS: std::cell::RefCell<Vec<(&'static str, JsValue)>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// `v[key]`, or `undefined`.
fn get(v: &JsValue, key: &'static str) -> JsValue {
    let k = KEYS.with(|keys| {
        let mut keys = keys.borrow_mut();
        if let Some((_, k)) = keys.iter().find(|(name, _)| *name == key) {
            return k.clone();
        }
        let k = JsValue::from_str(key);
        keys.push((key, k.clone()));
        k
    });
    crate::value::get(v, &k).unwrap_or(JsValue::UNDEFINED)
}

/// The next non-empty line (trimmed) with its number.
async fn next_line(lines: &mut Lines<'_>) -> Result<Option<(usize, JsString)>> {
    while let Some(line) = lines.next().await? {
        let line = line.trim();
        if line.length() > 0 {
            return Ok(Some((lines.number, line)));
        }
    }
    Ok(None)
}

/// Why a row's `_rev` was refused before it was parsed: absent, not a
/// string, or longer than any revision ([`crate::value::MAX_REV_TEXT`]).
const NO_REV: &str = "_rev must be a revision string of at most 96 UTF-16 code units";

/// One PouchDB row as read from a dump line.
struct Row {
    id: JsString,
    rev: Rev,
    rev_text: String,
    deleted: bool,
}

/// Reads `doc`'s id, revision and deletion flag (`None` for `_local/` docs).
fn pouch_row(doc: &JsValue, n: usize) -> Result<Option<Row>> {
    const WHAT: &str = "PouchDB dump";
    if !doc.is_object() || Array::is_array(doc) {
        return Err(line_error(WHAT, n, "a doc must be an object"));
    }
    // The reason of the id check itself (not a string, empty, too long).
    let id =
        super::check_id_value(&get(doc, "_id")).map_err(|e| line_error(WHAT, n, &e.message()))?;
    if id.starts_with("_local/", 0) {
        return Ok(None);
    }
    let rev_text = crate::value::short_string(&get(doc, "_rev"), crate::value::MAX_REV_TEXT)
        .ok_or_else(|| line_error(WHAT, n, NO_REV))?;
    let rev = Rev::parse(&rev_text).map_err(|e| line_error(WHAT, n, &e.0))?;
    let deleted = get(doc, "_deleted").as_bool() == Some(true);
    Ok(Some(Row {
        id,
        rev,
        rev_text,
        deleted,
    }))
}

/// Most `_revisions.ids` one doc may list (PouchDB keeps 1,000 by default,
/// its `revs_limit`); a longer list is refused rather than copied in.
const MAX_REVISION_IDS: u32 = 100_000;

/// The ancestors a doc's `_revisions` names (empty when it has none). A
/// `_revisions` must describe the row's own `rev` (see
/// [`revisions_ancestors`]): one that names another revision is refused.
fn pouch_ancestors(doc: &JsValue, rev: &Rev, n: usize) -> Result<Vec<Rev>> {
    let revs = get(doc, "_revisions");
    if revs.is_undefined() || revs.is_null() {
        return Ok(Vec::new());
    }
    let bad = || {
        line_error(
            "PouchDB dump",
            n,
            "_revisions must be {start, ids: [hash, …]} (at most 100,000 ids)",
        )
    };
    let start = get(&revs, "start")
        .as_f64()
        .filter(|s| s.fract() == 0.0 && *s >= 1.0 && *s <= 9_007_199_254_740_991.0)
        .ok_or_else(bad)? as u64;
    let ids = get(&revs, "ids").dyn_into::<Array>().map_err(|_| bad())?;
    // Each id is a revision hash (copied only when short), and there are
    // at most as many as generations a dump can hold in one line. `ids[0]`
    // is read too: it must be the row's own hash.
    if ids.length() > MAX_REVISION_IDS {
        return Err(bad());
    }
    let ids: Vec<String> = ids
        .iter()
        .map(|h| crate::value::short_string(&h, crate::value::MAX_REV_TEXT).ok_or_else(bad))
        .collect::<Result<_>>()?;
    revisions_ancestors(rev, start, &ids).map_err(|e| line_error("PouchDB dump", n, &e.0))
}

/// Where a dump's sequence numbers stand while it is read: the header's
/// `db_info.update_seq` and the last `seq` a line carried.
#[derive(Default)]
struct Seqs {
    update_seq: Option<u64>,
    last_seq: Option<u64>,
}

/// The sequence number a `seq` or `update_seq` value names (see
/// [`seq_from_number`], [`seq_from_text`]). A string is read by its first 24
/// UTF-16 units (CouchDB's run to hundreds): enough for any seq up to
/// 2^53 − 1 followed by `-`, and a longer run of digits is too large anyway.
fn seq_value(v: &JsValue) -> Option<u64> {
    match v.as_f64() {
        Some(n) => seq_from_number(n),
        None => seq_from_text(&crate::value::text_prefix(v, 24)?),
    }
}

/// The docs of a dump line (`None` for a header or `seq` line); records the
/// header's `db_info.update_seq` and each line's `seq` in `seqs`.
///
/// # Errors
/// ValidationError naming line `n` when it is not a dump line, or when a
/// header's `update_seq` is neither absent nor a sequence number.
fn dump_docs(line: &JsString, n: usize, first: bool, seqs: &mut Seqs) -> Result<Option<Array>> {
    const WHAT: &str = "PouchDB dump";
    let v = parse_line(line).map_err(|_| line_error(WHAT, n, "not JSON"))?;
    if !v.is_object() || Array::is_array(&v) {
        return Err(line_error(WHAT, n, "expected a JSON object"));
    }
    let docs = get(&v, "docs");
    let seq = get(&v, "seq");
    let kind = classify_line(first, !docs.is_undefined(), !seq.is_undefined())
        .map_err(|why| line_error(WHAT, n, why))?;
    if let Some(s) = seq_value(&seq) {
        seqs.last_seq = Some(s);
    }
    if kind == LineKind::Header {
        let update_seq = get(&get(&v, "db_info"), "update_seq");
        if !update_seq.is_undefined() && !update_seq.is_null() {
            seqs.update_seq = Some(seq_value(&update_seq).ok_or_else(|| {
                line_error(
                    WHAT,
                    n,
                    "the header's db_info.update_seq must be a sequence number (an integer, or a CouchDB \"6582-g1…\" string)",
                )
            })?);
        }
    }
    if kind != LineKind::Docs {
        return Ok(None);
    }
    docs.dyn_into::<Array>()
        .map(Some)
        .map_err(|_| line_error(WHAT, n, "\"docs\" must be an array"))
}

/// The ValidationError of a dump that [`check_dump_end`] refuses.
fn incomplete(why: Incomplete) -> StoreError {
    let (update_seq, last_seq) =
        match why {
            Incomplete::Empty => return StoreError::validation(
                "PouchDB dump: the source is empty (not even a header line); nothing was written",
            ),
            Incomplete::CutOff {
                update_seq,
                last_seq,
            } => (update_seq, last_seq),
        };
    let num = agentstore_protocol::canonical::decimal;
    let (a, b) = (num(update_seq), last_seq.map(num).unwrap_or_default());
    let reached: &[&str] = match last_seq {
        Some(_) => &[" but its last seq is ", &b],
        None => &[" but it has no seq line"],
    };
    let mut why = vec!["PouchDB dump: the header's db_info.update_seq is ", &a];
    why.extend_from_slice(reached);
    why.push(" (the dump was cut off); nothing was written");
    StoreError::validation(agentstore_protocol::cat(&why))
}

/// Checks an imported live record exactly as `put` checks a record (the
/// same walk: reserved fields, `recordType`, `updatedAt`, JSON-only values,
/// nesting depth, size), so that every record in the store, however it got
/// there, can be read back, updated with `put`/`mutate` and exported and
/// imported again.
fn check_body(v: &JsValue, what: &str, n: usize) -> Result<()> {
    crate::value::walk_record(v)
        .and_then(|w| match w.updated_at_unreal {
            // An import keeps `updatedAt`: it must be a real date.
            true => Err(crate::value::bad_updated_at()),
            false => Ok(()),
        })
        .map_err(|e| line_error(what, n, &e.message()))
}

/// Removes PouchDB's bookkeeping fields (`_revisions`, `_conflicts`, …) from
/// a parsed doc before it is checked or stored.
fn strip_bookkeeping(doc: &JsValue) {
    for f in BOOKKEEPING_FIELDS {
        let _ = Reflect::delete_property(doc.unchecked_ref::<Object>(), &f.into());
    }
}

/// One snapshot line after the first header.
enum SnapshotLine {
    /// The header of an export appended to the first (`cat a b`), with the
    /// number of lines it declares: skipped, so joined exports import as one.
    Header(u64),
    /// A record or tombstone: its id and revision.
    Row(JsString, Rev),
}

/// Reads one snapshot line after the first header.
fn snapshot_row(line: &JsString, n: usize) -> Result<SnapshotLine> {
    const WHAT: &str = "snapshot";
    let v = parse_line(line).map_err(|_| line_error(WHAT, n, "not JSON"))?;
    if !v.is_object() || Array::is_array(&v) {
        return Err(line_error(WHAT, n, "expected a JSON object"));
    }
    if is_appended_header(&v) {
        return Ok(SnapshotLine::Header(header_lines(&v, n)?));
    }
    let id =
        super::check_id_value(&get(&v, "_id")).map_err(|e| line_error(WHAT, n, &e.message()))?;
    let rev = crate::value::short_string(&get(&v, "_rev"), crate::value::MAX_REV_TEXT)
        .ok_or_else(|| line_error(WHAT, n, NO_REV))?;
    let rev = Rev::parse(&rev).map_err(|e| line_error(WHAT, n, &e.0))?;
    if get(&v, "_deleted").as_bool() != Some(true) {
        check_body(&v, WHAT, n)?;
    } else {
        check_tombstone_line(&v, n)?;
    }
    Ok(SnapshotLine::Row(id, rev))
}

/// A snapshot's tombstone line holds what an export writes for one and
/// nothing else: `_id`, `_rev`, `_deleted: true` and, from releases that
/// record it, `deletedAt` (ms since the epoch, `purgeTombstones`' clock: a
/// finite number, as every stored one is; any, so that every export imports
/// again, also one whose time came from a PouchDB dump's deleted document).
/// An import keeps the value a line carries, so one it could not keep as
/// given (a `deletedAt` that is not a finite number, a body a tombstone
/// does not store) is refused rather than changed.
///
/// # Errors
/// ValidationError naming line `n`.
fn check_tombstone_line(v: &JsValue, n: usize) -> Result<()> {
    for key in Object::keys(v.unchecked_ref::<Object>()).iter() {
        let key = key.as_string().unwrap_or_default();
        if !matches!(key.as_str(), "_id" | "_rev" | "_deleted" | "deletedAt") {
            return Err(line_error(
                "snapshot",
                n,
                "a tombstone line holds only _id, _rev, _deleted and deletedAt",
            ));
        }
    }
    let at = get(v, "deletedAt");
    if !at.is_undefined() && !at.as_f64().is_some_and(f64::is_finite) {
        return Err(line_error(
            "snapshot",
            n,
            "a tombstone's deletedAt must be a finite number of ms since the epoch",
        ));
    }
    Ok(())
}

/// The number of lines (records, then tombstones) that header `v` (line
/// `n`) declares. Every release has written version 1 with both counts
/// (`{"agentstore":"snapshot","records":N,"tombstones":M,"version":1}`; the
/// first, with the keys in another order).
///
/// # Errors
/// ValidationError for another version (a format this release does not
/// know) or a count that is not a non-negative integer.
fn header_lines(v: &JsValue, n: usize) -> Result<u64> {
    if get(v, "version").as_f64() != Some(1.0) {
        return Err(line_error(
            "snapshot",
            n,
            "an unknown snapshot version (this release reads version 1)",
        ));
    }
    let count = |key| {
        get(v, key)
            .as_f64()
            .filter(|c| c.fract() == 0.0 && *c >= 0.0 && *c <= 9_007_199_254_740_991.0)
            .map(|c| c as u64)
    };
    match (count("records"), count("tombstones")) {
        (Some(r), Some(t)) => Ok(r + t),
        _ => Err(line_error(
            "snapshot",
            n,
            "the header's records and tombstones must be counts",
        )),
    }
}

/// `Ok` when header line `at`, which declares `declared` lines, is followed
/// by as many: a file cut short (a download that stopped at a line
/// boundary) or with lines added is refused.
fn check_count(at: usize, declared: u64, read: u64) -> Result<()> {
    if declared == read {
        return Ok(());
    }
    let num = agentstore_protocol::canonical::decimal;
    let why = agentstore_protocol::cat(&[
        "the header declares ",
        &num(declared),
        " records and tombstones but ",
        &num(read),
        " lines follow it (a cut-off or altered file); nothing was written",
    ]);
    Err(line_error("snapshot", at, &why))
}

/// `{"agentstore": "snapshot", …}`: a snapshot's header line.
fn is_snapshot_header(v: &JsValue) -> bool {
    // Compared in JS (`===`): the value may be any length.
    get(v, "agentstore") == JsValue::from_str("snapshot")
}

/// A later header line, as a second export appended to the first starts
/// with: the header's full shape (a `version` number, no `_id` or `_rev`),
/// so that a damaged record line is still refused, not skipped.
fn is_appended_header(v: &JsValue) -> bool {
    is_snapshot_header(v)
        && get(v, "version").as_f64().is_some()
        && get(v, "_id").is_undefined()
        && get(v, "_rev").is_undefined()
}

impl Store {
    /// Imports a pouchdb-replication-stream dump with the defaults of
    /// [`ImportOptions`] and `on_progress`; see [`Store::import_pouch_dump_with`].
    ///
    /// # Errors
    /// As [`Store::import_pouch_dump_with`].
    pub async fn import_pouch_dump(
        &self,
        source: impl Into<JsValue>,
        legacy_index_id: &str,
        on_progress: Option<&Function>,
    ) -> Result<(DumpSummary, ImportCounts, Option<LegacyIndexReport>)> {
        let opts = ImportOptions {
            on_progress: on_progress.cloned(),
            ..ImportOptions::default()
        };
        self.import_pouch_dump_with(&source.into(), legacy_index_id, &opts)
            .await
    }

    /// Imports a pouchdb-replication-stream dump (a string, `Blob`,
    /// `Response` or `ReadableStream` of NDJSON): each id's PouchDB winner
    /// (see [`agentstore_protocol::pouch`]: `_revisions` ancestry honoured,
    /// live leaves beat deleted ones), tombstones kept, `_local/` documents
    /// skipped, bodies stored as given (their `updatedAt` kept). A winner
    /// replaces a stored record only when its revision is higher
    /// (generation, then hash). A winning live body is checked as `put`
    /// checks a record (decided after pass 1, so a bad one writes nothing);
    /// losing revisions, never stored, are not held against the dump.
    ///
    /// Pass 1 validates every line and keeps per id only its leaf revisions
    /// (in a JS `Map`); pass 2 writes the winners in transactions of
    /// `opts.batch` records.
    ///
    /// Between the passes the dump must prove it is whole
    /// ([`agentstore_protocol::pouch::check_dump_end`]): an empty source is
    /// refused, and when the header carries `db_info.update_seq` (a number,
    /// or CouchDB's `"6582-g1…"`, counted by its leading integer) the last
    /// `seq` read must reach it. A header without `update_seq` cannot be
    /// checked and is taken as whole; `update_seq` 0 needs no `seq` line.
    ///
    /// # Errors
    /// ValidationError naming the first bad line, for a source of another
    /// type, an empty source or one cut off before the header's
    /// `update_seq` (naming both seqs; nothing written); AbortError from `opts.signal` and
    /// QuotaExceededError / TransactionError from a batch, and ClosedError
    /// when the store is closed during the import (also in the last
    /// `onProgress`, and at once while the source is read, however long it
    /// stalls: the source is cancelled): the batches committed before stay (each holds final
    /// winners only), the failing batch leaves nothing, and running the same
    /// import again completes it.
    pub async fn import_pouch_dump_with(
        &self,
        source: &JsValue,
        legacy_index_id: &str,
        opts: &ImportOptions,
    ) -> Result<(DumpSummary, ImportCounts, Option<LegacyIndexReport>)> {
        let source = Source::from_js(source, opts.signal.as_ref(), self).await?;
        let mut summary = DumpSummary::default();
        // id → encoded leaf set (pass 1), then → the winner's encoded leaf.
        let leaves = Map::new();
        // id → Set of the revisions named as ancestors by some row (only
        // ids that have any).
        let ancestors = Map::new();
        // Everything kept per row is a JS value (the JS heap gives it back
        // after the import; wasm memory never shrinks): the legacy index
        // document's live rows (revision → `records`, the first row of
        // each), and the live rows `put` would refuse (id → Map of revision
        // → `[row number, message]`, the first row of each), however many losing
        // rows a dump refuses.
        let legacy_rows = Map::new();
        let refused = Map::new();

        let legacy_key = JsValue::from_str(legacy_index_id);
        let mut lines = source.lines(opts.signal.clone(), self)?;
        let mut first = true;
        let mut seqs = Seqs::default();
        while let Some((n, line)) = next_line(&mut lines).await? {
            let docs = dump_docs(&line, n, first, &mut seqs)?;
            first = false;
            let Some(docs) = docs else { continue };
            for doc in docs.iter() {
                summary.documents_read += 1;
                let Some(row) = pouch_row(&doc, n)? else {
                    summary.local_skipped += 1;
                    continue;
                };
                let anc = pouch_ancestors(&doc, &row.rev, n)?;
                let key = JsValue::from(row.id.clone());
                if !row.deleted {
                    strip_bookkeeping(&doc);
                    if let Err(e) = check_body(&doc, "PouchDB dump", n) {
                        // Refused only if this revision wins (decided before
                        // pass 2, so nothing is written): a losing leaf or
                        // superseded revision is never stored.
                        let revs = refused.get(&key).dyn_into::<Map>().unwrap_or_else(|_| {
                            let m = Map::new();
                            refused.set(&key, &m);
                            m
                        });
                        let rev = JsValue::from_str(&row.rev_text);
                        if !revs.has(&rev) {
                            // The row's place in the dump (documents read so
                            // far): the first refused winner is the first
                            // row, also between the docs of one line.
                            let at = JsValue::from(summary.documents_read as f64);
                            revs.set(&rev, &Array::of2(&at, &e.message().into()));
                        }
                    }
                }
                // A Set per id: every row of the id asks it, and a dump that
                // repeats a history names the same ancestors again and
                // again (an Array's `includes` made that quadratic).
                let known = ancestors.get(&key);
                let is_ancestor = known
                    .dyn_ref::<js_sys::Set>()
                    .is_some_and(|a| a.has(&JsValue::from_str(&row.rev_text)));
                if !anc.is_empty() {
                    let set = known.dyn_into::<js_sys::Set>().unwrap_or_else(|_| {
                        let a = js_sys::Set::new(&JsValue::UNDEFINED);
                        ancestors.set(&key, &a);
                        a
                    });
                    for r in &anc {
                        set.add(&JsValue::from_str(&r.text()));
                    }
                }
                let mut set_ = match leaves.get(&key).as_string() {
                    Some(s) => decode_leaves(&s).map_err(|e| StoreError::Transaction(e.0))?,
                    None => Vec::new(),
                };
                if !row.deleted && key == legacy_key {
                    let rev = JsValue::from_str(&row.rev_text);
                    if !legacy_rows.has(&rev) {
                        legacy_rows.set(&rev, &get(&doc, "records"));
                    }
                }
                let leaf = Leaf {
                    rev: row.rev,
                    deleted: row.deleted,
                };
                if add_row(&mut set_, leaf, &anc, is_ancestor) {
                    if set_.len() > agentstore_protocol::pouch::MAX_LEAVES {
                        return Err(line_error(
                            "PouchDB dump",
                            n,
                            "a document has more than 1,000 leaves (conflicting or deleted branches)",
                        ));
                    }
                    leaves.set(&key, &JsValue::from_str(&encode_leaves(&set_)));
                }
            }
        }
        drop(ancestors);
        // A source that ended before the seq its header promised (or held
        // nothing) is not the dump: refused before pass 2 writes anything.
        check_dump_end(!first, seqs.update_seq, seqs.last_seq).map_err(incomplete)?;
        summary.last_seq = seqs.last_seq;

        // Every id's winner (its revision string; deleted winners also in
        // `dead`), the counts, and the live ids for the legacy report.
        let dead = js_sys::Set::new(&JsValue::UNDEFINED);
        let mut bad = None;
        let mut live_others = 0u64;
        leaves.for_each(&mut |value, key| {
            let set_ = match decode_leaves(&value.as_string().unwrap_or_default()) {
                Ok(s) => s,
                Err(e) => {
                    bad = Some(e);
                    return;
                }
            };
            summary.count_id(&set_);
            if let Some(w) = winning_leaf(&set_) {
                if w.deleted {
                    dead.add(&key);
                } else if key != legacy_key {
                    live_others += 1;
                }
                leaves.set(&key, &JsValue::from_str(&w.rev.text()));
            }
        });
        if let Some(e) = bad {
            return Err(StoreError::Transaction(e.0));
        }
        // The first row (in dump order) whose refused body won.
        let mut first_bad: Option<(f64, JsValue)> = None;
        refused.for_each(&mut |revs, id| {
            if dead.has(&id) {
                return;
            }
            let hit = revs.unchecked_ref::<Map>().get(&leaves.get(&id));
            if let Some(hit) = hit.dyn_ref::<Array>() {
                let at = hit.get(0).as_f64().unwrap_or(f64::INFINITY);
                if first_bad.as_ref().is_none_or(|(first, _)| at < *first) {
                    first_bad = Some((at, hit.get(1)));
                }
            }
        });
        if let Some((_, message)) = first_bad {
            return Err(StoreError::validation(
                message.as_string().unwrap_or_default(),
            ));
        }
        drop(refused);
        let legacy = legacy_report(&leaves, &dead, legacy_index_id, &legacy_rows, live_others);
        drop(legacy_rows);

        let mut writer = Writer::new(self, opts, leaves.size());
        let mut lines = source.lines(opts.signal.clone(), self)?;
        let mut first = true;
        let mut ignore = Seqs::default();
        'lines: while let Some((n, line)) = next_line(&mut lines).await? {
            let docs = dump_docs(&line, n, first, &mut ignore)?;
            first = false;
            let Some(docs) = docs else { continue };
            for doc in docs.iter() {
                // Only an id's winning row goes on (compared as JS strings:
                // no copy into wasm for the others); `_local/` ids have none.
                let id = get(&doc, "_id");
                let win = leaves.get(&id);
                if win.is_undefined() || get(&doc, "_rev") != win {
                    continue;
                }
                leaves.delete(&id);
                let deleted = dead.has(&id);
                if !deleted {
                    strip_bookkeeping(&doc);
                }
                if writer.push(Staged::winner(id, &win, deleted, doc)?).await? {
                    break 'lines;
                }
            }
        }
        let counts = writer.finish().await?;
        Ok((summary, counts, legacy))
    }

    /// Exports every record and tombstone as one NDJSON string; see
    /// [`Store::export_snapshot_chunks`]. The text is copied into wasm memory:
    /// for tests and small stores (the JS `exportSnapshot` never copies it).
    ///
    /// # Errors
    /// As [`Store::export_snapshot_chunks`].
    pub async fn export_snapshot(&self) -> Result<String> {
        let parts = self.export_snapshot_chunks(None, DEFAULT_BATCH).await?;
        Ok(String::from(parts.join("")))
    }

    /// [`Store::export_snapshot_with`] with only `on_chunk` and `batch`.
    ///
    /// # Errors
    /// As [`Store::export_snapshot_with`].
    pub async fn export_snapshot_chunks(
        &self,
        on_chunk: Option<&Function>,
        batch: u32,
    ) -> Result<Array> {
        let opts = ExportOptions {
            batch,
            ..ExportOptions::default()
        };
        self.export_snapshot_with(on_chunk, &opts).await
    }

    /// Exports every record and tombstone as NDJSON: a header line
    /// `{"agentstore":"snapshot","records":N,"tombstones":M,"version":1}`, then
    /// one stored object per line in key order (records, then tombstones),
    /// read in one read-only transaction (a consistent snapshot)
    /// `opts.batch` objects at a time. Each chunk (whole lines, each ending
    /// in `\n`) goes to `on_chunk` when given (the returned array is then
    /// empty), else into the returned array of JS strings.
    ///
    /// `on_chunk` is called with one chunk at a time, in order. When it
    /// returns a thenable (an async `on_chunk`), the next chunk waits until
    /// that settles, and the export resolves only after the last one did.
    /// The transaction is never held by that wait (it would commit under a
    /// foreign await, CASES.md C-E3): the reads go on while `on_chunk`'s
    /// promise is pending, and the chunks it has not taken yet wait in JS
    /// memory (at most the whole export, as `exportSnapshot`'s string).
    ///
    /// `opts.on_progress(done, total)` is called after each batch read (and
    /// after its chunk went to `on_chunk`): `done` objects (records and
    /// tombstones) exported of the `total` the header counts. It takes its
    /// turn with the chunks: a thenable it returns is awaited as
    /// `on_chunk`'s is, before the next chunk or progress call (the reads go
    /// on meanwhile). An empty store makes no progress call.
    ///
    /// `opts.signal` is looked at before each read and before each chunk
    /// or progress call, and ends a wait for a pending thenable: once it
    /// aborts, no chunk follows, the read transaction is dropped and the
    /// export rejects with AbortError, unless every row was read and every
    /// chunk collected or handed over (its thenable settled): the abort
    /// then only stops the progress calls left, and the export resolves.
    ///
    /// # Errors
    /// AbortError (`cause`: the signal's reason); TransactionError;
    /// ClosedError, also when the store is closed during the export (no
    /// chunk goes to `on_chunk` after it; a pending `on_chunk` promise is
    /// no longer waited for); whatever `on_chunk` throws or its thenable
    /// rejects with (no chunk goes to it after that); what `on_progress`
    /// throws or rejects with before its last call (the one with `done ==
    /// total`: the export is complete then, and resolves).
    pub async fn export_snapshot_with(
        &self,
        on_chunk: Option<&Function>,
        opts: &ExportOptions,
    ) -> Result<Array> {
        let mut out = Calls::new(
            self,
            on_chunk,
            opts.on_progress.as_ref(),
            opts.signal.as_ref(),
        );
        out.check()?;
        let tx = self
            .db
            .tx(&[RECORDS, TOMBSTONES], TransactionMode::ReadOnly)?;
        let (records, tombs) = (tx.store(RECORDS)?, tx.store(TOMBSTONES)?);
        let (n_records, n_tombs) = (records.count(None)?, tombs.count(None)?);
        let (n_records, n_tombs) = (n_records.await?, n_tombs.await?);
        let header = Object::new();
        set(&header, "agentstore", &"snapshot".into());
        set(&header, "records", &JsValue::from(n_records));
        set(&header, "tombstones", &JsValue::from(n_tombs));
        set(&header, "version", &JsValue::from(1));
        let nl = JsString::from("\n");
        let header = js_sys::JSON::stringify(&header)
            .map_err(|_| StoreError::Transaction("the snapshot header is not JSON".into()))?;
        out.chunk(header.concat(&nl))?;
        let (total, mut done) = (n_records + n_tombs, 0);
        for store in [records, tombs] {
            let mut after: Option<JsValue> = None;
            // Every row read (the counts are of this transaction's view):
            // no read is left for an abort to stop, so one while the last
            // `onProgress` Promise is pending only ends that wait.
            while done < total {
                out.check()?;
                let rows = read_after(&store, after.as_ref(), opts.batch).await?;
                let Some(last) = rows.last() else { break };
                after = Some(get(last, "_id"));
                let lines = Array::new();
                for v in &rows {
                    let line = js_sys::JSON::stringify(v).map_err(|_| {
                        StoreError::Transaction("a stored record is not JSON".into())
                    })?;
                    lines.push(&line);
                }
                lines.push(&JsString::from(""));
                out.chunk(lines.join("\n"))?;
                done += rows.len() as u32;
                out.progress(done, total)?;
                if rows.len() < opts.batch as usize {
                    break;
                }
            }
        }
        self.check_open()?;
        tx.end_read();
        out.finish().await
    }

    /// The chunks of [`Store::export_snapshot_with`] as one `Blob`
    /// (`type: application/x-ndjson` is not set; the bytes are UTF-8).
    ///
    /// # Errors
    /// As [`Store::export_snapshot_with`].
    pub async fn export_snapshot_blob(&self, batch: u32) -> Result<JsValue> {
        let opts = ExportOptions {
            batch,
            ..ExportOptions::default()
        };
        self.export_snapshot_blob_with(&opts).await
    }

    /// [`Store::export_snapshot_blob`] with progress and a signal.
    ///
    /// # Errors
    /// As [`Store::export_snapshot_with`].
    pub async fn export_snapshot_blob_with(&self, opts: &ExportOptions) -> Result<JsValue> {
        let parts = self.export_snapshot_with(None, opts).await?;
        JsBlob::new(&parts)
            .map(Into::into)
            .map_err(|e| StoreError::from_dom(&e))
    }

    /// Imports a snapshot made by [`Store::export_snapshot`] with the
    /// defaults of [`ImportOptions`]; see [`Store::import_snapshot_with`].
    ///
    /// # Errors
    /// As [`Store::import_snapshot_with`].
    pub async fn import_snapshot(
        &self,
        source: impl Into<JsValue>,
        on_progress: Option<&Function>,
    ) -> Result<ImportCounts> {
        let opts = ImportOptions {
            on_progress: on_progress.cloned(),
            ..ImportOptions::default()
        };
        self.import_snapshot_with(&source.into(), &opts).await
    }

    /// Imports a snapshot (a string, `Blob`, `Response` or `ReadableStream`
    /// of [`Store::export_snapshot`]'s NDJSON). Each record keeps its
    /// revision and its `updatedAt`. When one id appears on several lines
    /// (an older export appended to a newer one), the highest revision wins
    /// (generation, then hash; a tombstone is a revision like any other) and
    /// only it is written; it replaces a stored record only when higher.
    ///
    /// The header's `version` must be 1 and its `records` + `tombstones`
    /// the number of lines after it (each header of joined exports counts
    /// its own), so that a file cut short is refused, not imported in part.
    ///
    /// # Errors
    /// ValidationError naming the first bad line, an unknown header version
    /// or a line count other than the header's, or for an empty source
    /// (nothing written); otherwise as [`Store::import_pouch_dump_with`].
    pub async fn import_snapshot_with(
        &self,
        source: &JsValue,
        opts: &ImportOptions,
    ) -> Result<ImportCounts> {
        let source = Source::from_js(source, opts.signal.as_ref(), self).await?;
        // id → the highest revision seen (pass 1); deleted once written (pass 2).
        let winners = Map::new();
        let mut lines = source.lines(opts.signal.clone(), self)?;
        // The header in force (its line and the lines it declares), and the
        // lines read after it.
        let mut header: Option<(usize, u64)> = None;
        let mut read = 0;
        while let Some((n, line)) = next_line(&mut lines).await? {
            let Some((at, declared)) = header else {
                let v = parse_line(&line).map_err(|_| line_error("snapshot", n, "not JSON"))?;
                if !is_snapshot_header(&v) {
                    return Err(line_error(
                        "snapshot",
                        n,
                        "missing the agentstore snapshot header",
                    ));
                }
                header = Some((n, header_lines(&v, n)?));
                continue;
            };
            let (id, rev) = match snapshot_row(&line, n)? {
                SnapshotLine::Header(next) => {
                    check_count(at, declared, read)?;
                    (header, read) = (Some((n, next)), 0);
                    continue;
                }
                SnapshotLine::Row(id, rev) => (id, rev),
            };
            read += 1;
            let key = JsValue::from(id);
            let held = match winners.get(&key).as_string() {
                Some(s) => Some(Rev::parse(&s).map_err(|e| StoreError::Transaction(e.0))?),
                None => None,
            };
            if import_replaces(held.as_ref(), &rev) {
                winners.set(&key, &JsValue::from_str(&rev.text()));
            }
        }
        match header {
            // An empty source (or only blank lines): not even the header
            // every export starts with.
            None => {
                return Err(StoreError::validation(
                    "snapshot: the source is empty (missing the agentstore snapshot header)",
                ))
            }
            Some((at, declared)) => check_count(at, declared, read)?,
        }
        let mut writer = Writer::new(self, opts, winners.size());
        let mut lines = source.lines(opts.signal.clone(), self)?;
        let mut header = false;
        while let Some((_, line)) = next_line(&mut lines).await? {
            if !header {
                header = true;
                continue;
            }
            // Pass 1 checked every line; only each id's winning line goes on.
            let v = parse_line(&line).unwrap_or_default();
            let id = get(&v, "_id");
            let win = winners.get(&id);
            if win.is_undefined() || get(&v, "_rev") != win {
                continue;
            }
            winners.delete(&id);
            let deleted = get(&v, "_deleted").as_bool() == Some(true);
            if writer.push(Staged::winner(id, &win, deleted, v)?).await? {
                break;
            }
        }
        writer.finish().await
    }

    /// One batch in one transaction; see [`WriteMode`]. On success `mode`
    /// counts the batch's writes when it is `Fresh`.
    async fn write_batch(&self, staged: &[Staged], mode: &mut WriteMode) -> Result<ImportCounts> {
        let tx = self.write_tx()?;
        let mut batch = ImportCounts::default();
        let changes = Array::new();
        let mut dead_added = 0u32;
        let mut fresh = false;
        // Tombstones stored when the batch began (read in the fresh modes).
        let mut dead_now = 0;
        let issued: Result<()> = async {
            let records = tx.store(RECORDS)?;
            let tombs = tx.store(TOMBSTONES)?;
            let state = match *mode {
                WriteMode::Read => self.write_indexes(&tx).await?,
                WriteMode::Unknown => {
                    let (l, d) = (records.count(None)?, tombs.count(None)?);
                    let state = self.write_indexes(&tx).await?;
                    fresh = (l.await?, d.await?) == (0, 0);
                    state
                }
                WriteMode::Fresh { dead } => {
                    let d = tombs.count(None)?;
                    let state = self.write_indexes(&tx).await?;
                    dead_now = d.await?;
                    fresh = dead_now == dead;
                    state
                }
            };
            if !fresh {
                // From here on a failure is not a sign of a write from elsewhere.
                *mode = WriteMode::Read;
            }
            let currents = if fresh {
                // Tombstones look for a live record written meanwhile. A live
                // record's `add` fails on a live record written meanwhile, but
                // cannot see a tombstone: those are read once, over the key
                // range of the batch's live ids (the tombstone count alone
                // cannot tell: another connection may have removed one
                // tombstone and written another between two batches).
                // (None when no tombstone is stored at all: the first batch,
                // and every batch of an import without deletions.)
                let dead_live = if dead_now > 0 {
                    live_tombstones(&tombs, staged).await?
                } else {
                    Map::new()
                };
                let deleted: Vec<&JsString> =
                    staged.iter().filter(|i| i.deleted).map(|i| &i.id).collect();
                let mut found = read_many(&tx, &deleted).await?.into_iter();
                staged
                    .iter()
                    .map(|i| match i.deleted {
                        true => Ok(found.next().unwrap_or((Current::Missing, None))),
                        false => match dead_live.get(&i.id) {
                            t if t.is_undefined() => Ok((Current::Missing, None)),
                            t => Ok((Current::Deleted(super::stored_rev(&t)?), None)),
                        },
                    })
                    .collect::<Result<Vec<_>>>()?
            } else {
                let ids: Vec<&JsString> = staged.iter().map(|i| &i.id).collect();
                read_many(&tx, &ids).await?
            };
            // close() (or a versionchange) while the reads were out: no
            // batch is written after it (the dropped transaction aborts).
            self.check_open()?;
            for (item, (current, stored)) in staged.iter().zip(&currents) {
                if !import_replaces(current.rev(), &item.rev) {
                    batch.kept_newer += 1;
                    continue;
                }
                // The removal and the index upkeep first, the record or
                // tombstone (the request that takes space) last, as
                // `super::write_record` orders them: a request Firefox
                // refuses for quota keeps nothing of its item after it.
                let key = JsValue::from(item.id.clone());
                match current {
                    Current::Live(_) if item.deleted => {
                        records.delete(key)?;
                    }
                    Current::Deleted(_) if !item.deleted => {
                        tombs.delete(key)?;
                    }
                    _ => {}
                }
                index::maintain(
                    &tx,
                    &state,
                    stored.as_ref(),
                    (!item.deleted).then_some(&item.object),
                )?;
                let target = if item.deleted { &tombs } else { &records };
                if fresh {
                    target.add(&item.object, None)?;
                } else {
                    target.put(&item.object, None)?;
                }
                if item.deleted {
                    dead_added += 1;
                }
                self.changes
                    .change(&changes, &item.id, &item.rev.text(), item.deleted);
                batch.written += 1;
            }
            Ok(())
        }
        .await;
        // On an error the dropped transaction aborts: nothing of the batch stays.
        issued?;
        self.finish(tx).await?;
        self.changes.post(&changes);
        *mode = match (*mode, fresh) {
            (WriteMode::Unknown, true) => WriteMode::Fresh { dead: dead_added },
            (WriteMode::Fresh { dead }, true) if dead + dead_added <= FRESH_MAX_TOMBSTONES => {
                WriteMode::Fresh {
                    dead: dead + dead_added,
                }
            }
            _ => WriteMode::Read,
        };
        Ok(batch)
    }
}

/// The tombstones (by id, in a JS `Map`) stored for any of the live (not
/// deleted) items of `staged`: one `getAll` over the key range from the
/// least to the greatest of their ids (compared as IndexedDB compares
/// string keys, by UTF-16 code units, as JS `<` does).
async fn live_tombstones(tombs: &super::db::ObjectStore, staged: &[Staged]) -> Result<Map> {
    let found = Map::new();
    let mut live = staged
        .iter()
        .filter(|i| !i.deleted)
        .map(|i| JsValue::from(i.id.clone()));
    let Some(first) = live.next() else {
        return Ok(found);
    };
    let (mut lo, mut hi) = (first.clone(), first);
    for id in live {
        if id.lt(&lo) {
            lo = id;
        } else if id.gt(&hi) {
            hi = id;
        }
    }
    // Keys only (an unordered dump's range may hold many of the import's
    // own tombstones); the values of the few that match are read after.
    let range = KeyRange::bound(&lo, &hi, None, None)?;
    let keys = js_sys::Set::new(&JsValue::UNDEFINED);
    for k in tombs
        .get_all_keys(Some(Query::KeyRange(range)), None)?
        .await?
    {
        keys.add(&k);
    }
    let hits: Vec<_> = staged
        .iter()
        .filter(|i| !i.deleted && keys.has(&i.id))
        .map(|i| tombs.get(JsValue::from(i.id.clone())))
        .collect::<Result<_>>()?;
    for t in super::db::all(hits).await?.into_iter().flatten() {
        found.set(
            &crate::value::get(&t, &"_id".into()).unwrap_or_default(),
            &t,
        );
    }
    Ok(found)
}
