//! Derived indexes: entries kept in the DERIVED object store, written in the
//! same readwrite transaction as the record they derive from; `listBy`,
//! `verifyIndexes` and a resumable, deterministic `rebuildIndexes`.
//!
//! Which indexes exist is shared state in META, stored as a structured-clone
//! object (no JSON text): `"indexes"` = `{defs: {tag: {name, keys}}, active:
//! [tag], building: [tag]}` — definitions by tag, the tags whose entries are
//! complete (used by `listBy`) and the tags being (re)built. Every change of
//! it also bumps the number at `"indexes-gen"`, so a write transaction reads
//! one number and reuses the definitions it cached for that generation
//! ([`Store::write_indexes`]). Each building tag has its own checkpoint at
//! `"rebuild:<tag>"` = `{after, done}`, so one connection's rebuild never
//! ends or replaces another's (case: two tabs with different index sets).
//! Every write maintains every active or building tag, so a tab that
//! declares other indexes still keeps this tab's indexes in step.

use super::db::{KeyRange, Query, TransactionMode};
use super::db::{Req, Tx, DERIVED, META, RECORDS};
use super::Store;
use crate::error::{get_str, set, Result, StoreError};
use crate::value;
use agentstore_protocol::index::{
    decode_key_cursor, encode_key_cursor, entry_range, Condition, EntryRange, IndexDef, KeyPart,
    MAX_INDEXED_UNITS,
};
use agentstore_protocol::record::check_limit;
use js_sys::{Array, Function, JsString, Object};
use std::cell::RefCell;
use std::rc::Rc;
use wasm_bindgen::{JsCast, JsValue};

/// META key of the shared index state object.
const STATE_KEY: &str = "indexes";
/// META key of the state's generation: a number bumped with every change.
const GEN_KEY: &str = "indexes-gen";
/// META key prefix of a building tag's checkpoint.
const CHECKPOINT_PREFIX: &str = "rebuild:";

/// Shared index state (the object at META `"indexes"`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct IndexState {
    /// Every known definition by tag.
    pub defs: Defs,
    /// Tags whose entries are complete and kept in step.
    pub active: Vec<String>,
    /// Tags being (re)built; each has a checkpoint of its own.
    pub building: Vec<String>,
    /// Tombstone purges so far (`purgeTombstones` calls that removed any).
    pub purges: f64,
    /// No `watch()` was ever made on this database (stored as `watched:
    /// false`, written when this release creates the database; cleared by
    /// the first `watch()`). Writes then post no change message. A state
    /// without the field (a database an earlier release made, or state an
    /// earlier release wrote back) counts as watched.
    pub quiet: bool,
    /// The database's own number (`db`, a random number js/promise.js
    /// `createSchema` stores when this release creates the database; 0 for
    /// one an earlier release made): posted with its changes, it tells a
    /// watcher a database made again after a `destroy` from the one before.
    pub db: f64,
}

/// Index definitions by tag, in tag order (a sorted `Vec`: see
/// [`agentstore_protocol::vecmap`] for why not a `BTreeMap`).
pub type Defs = agentstore_protocol::vecmap::VecMap<String, IndexDef>;

/// A building tag's checkpoint (META `"rebuild:<tag>"` = `{after, done}`).
#[derive(Debug, Clone, Default, PartialEq)]
struct Checkpoint {
    /// Records with ids up to this `list` cursor are done (`None`: none yet).
    after: Option<String>,
    /// Records processed so far.
    done: u32,
}

/// The definitions every write must keep in step (active plus building
/// tags), as of state generation `gen`.
#[derive(Debug, Default)]
pub struct Maintained {
    gen: f64,
    tags: Vec<(String, IndexDef)>,
    purges: f64,
}

/// A connection's cache of [`Maintained`] for the last generation it read.
#[derive(Default)]
pub(crate) struct IndexCache(RefCell<Option<Rc<Maintained>>>);

impl Maintained {
    /// [`IndexState::purges`] as of this read.
    pub(crate) fn purges(&self) -> f64 {
        self.purges
    }
}

impl IndexState {
    /// Tags every write must keep in step (active plus building, each
    /// with its definition), as owned copies for the write path's cache.
    fn maintained(&self) -> Vec<(String, IndexDef)> {
        let mut tags = Vec::new();
        for list in [&self.active, &self.building] {
            for t in list {
                if let Some(d) = self.defs.get(t) {
                    tags.push((t.clone(), d.clone()));
                }
            }
        }
        tags
    }

    fn to_js(&self) -> JsValue {
        let defs = Object::new();
        for (tag, d) in self.defs.iter() {
            set(&defs, tag, &def_js(d));
        }
        let o = Object::new();
        set(&o, "defs", &defs);
        set(&o, "active", &strings_js(&self.active));
        set(&o, "building", &strings_js(&self.building));
        if self.purges > 0.0 {
            set(&o, "purges", &JsValue::from_f64(self.purges));
        }
        if self.quiet {
            set(&o, "watched", &JsValue::FALSE);
        }
        if self.db != 0.0 {
            set(&o, "db", &JsValue::from_f64(self.db));
        }
        o.into()
    }

    /// Reads the stored object; anything else (nothing yet, or the JSON text
    /// of releases before this one) is an empty state, and `open` rebuilds.
    fn from_js(v: &JsValue) -> IndexState {
        let mut state = IndexState::default();
        if !v.is_object() {
            return state;
        }
        let field = |k: &str| crate::value::get(v, &k.into()).unwrap_or(JsValue::UNDEFINED);
        let defs = field("defs");
        if defs.is_object() {
            for entry in Object::entries(defs.unchecked_ref()).iter() {
                let entry = Array::from(&entry);
                let (Some(tag), def) = (entry.get(0).as_string(), entry.get(1)) else {
                    continue;
                };
                let keys = crate::value::get(&def, &"keys".into()).unwrap_or_default();
                if let (Some(name), Some(keys)) = (get_str(&def, "name"), strings_from_js(&keys)) {
                    state.defs.insert(tag, IndexDef { name, keys });
                }
            }
        }
        state.active = strings_from_js(&field("active")).unwrap_or_default();
        state.building = strings_from_js(&field("building")).unwrap_or_default();
        state.purges = field("purges").as_f64().unwrap_or(0.0);
        state.quiet = field("watched").as_bool() == Some(false);
        state.db = field("db").as_f64().unwrap_or(0.0);
        state
    }
}

/// An index definition as JS: `{name, keys}` (the shape `open` takes).
pub(crate) fn def_js(d: &IndexDef) -> JsValue {
    let o = Object::new();
    set(&o, "name", &d.name.as_str().into());
    set(&o, "keys", &strings_js(&d.keys));
    o.into()
}

fn strings_js(xs: &[String]) -> JsValue {
    let a = Array::new();
    for x in xs {
        a.push(&x.as_str().into());
    }
    a.into()
}

fn strings_from_js(v: &JsValue) -> Option<Vec<String>> {
    if !Array::is_array(v) {
        return None;
    }
    let mut out = Vec::new();
    for x in Array::from(v).iter() {
        out.push(x.as_string()?);
    }
    Some(out)
}

/// Issues the read of the state generation stored in `tx` (which must
/// include META); [`gen_of`] reads its answer.
pub(crate) fn issue_gen(tx: &Tx) -> Result<Req<Option<JsValue>>> {
    tx.store(META)?.get(JsValue::from_str(GEN_KEY))
}

/// The state generation a [`issue_gen`] request answered (0 before the
/// first change).
fn gen_of(v: Option<JsValue>) -> f64 {
    v.and_then(|v| v.as_f64()).unwrap_or(0.0)
}

/// Reads the shared state and its generation inside `tx` (which must include
/// META): both requests are issued before the first is awaited.
async fn read_state(tx: &Tx) -> Result<(f64, IndexState)> {
    let gen = issue_gen(tx)?;
    let state = tx.store(META)?.get(JsValue::from_str(STATE_KEY))?;
    let gen = gen_of(gen.await?);
    Ok((gen, IndexState::from_js(&state.await?.unwrap_or_default())))
}

/// Starts the definitions `fresh` in `state` (inside `tx`, which must
/// include META and DERIVED): drops the entries, checkpoints and state of
/// each one's tag and of older definitions of the same name, then adds it
/// as building (with an empty checkpoint) or, with `active` (a store
/// without records: nothing to build), as active. The caller writes the
/// state.
fn start_tags(tx: &Tx, state: &mut IndexState, fresh: &[&IndexDef], active: bool) -> Result<()> {
    for d in fresh {
        let tag = d.tag();
        // Entries of this tag, and of older definitions of the same name.
        let mut dropped = vec![tag.clone()];
        for (t, o) in state.defs.iter() {
            if o.name == d.name && *t != tag {
                dropped.push(t.clone());
            }
        }
        drop_tags(tx, state, &dropped)?;
        state.defs.insert(tag.clone(), (*d).clone());
        if active {
            state.active.push(tag);
        } else {
            state.building.push(tag.clone());
            write_checkpoint(tx, &tag, &Checkpoint::default())?;
        }
    }
    Ok(())
}

/// Drops `tags` in `state` (inside `tx`, which must include META and
/// DERIVED): their entries (one key-range delete per tag), checkpoints and
/// definitions. The caller writes the state.
fn drop_tags(tx: &Tx, state: &mut IndexState, tags: &[String]) -> Result<()> {
    let derived = tx.store(DERIVED)?;
    let meta = tx.store(META)?;
    for t in tags {
        if let Some(all) = entry_range(t, &Condition::All, None, false) {
            derived.delete(to_range(&all)?)?;
        }
        meta.delete(checkpoint_key(t))?;
        state.defs.remove(t);
    }
    state.active.retain(|t| !tags.contains(t));
    state.building.retain(|t| !tags.contains(t));
    Ok(())
}

#[wasm_bindgen::prelude::wasm_bindgen(module = "/js/promise.js")]
extern "C" {
    /// Turns `watched: false` in the state in `tx` into `true`, with the next
    /// generation, as [`write_state`] would (js/promise.js `markWatched`);
    /// settles with the transaction, rejecting with `to_error(tx.error)`.
    #[wasm_bindgen(js_name = markWatched)]
    fn mark_watched(tx: &web_sys::IdbTransaction, to_error: &JsValue) -> js_sys::Promise;
}

/// Stores `state` as generation `gen + 1` (also done in JS by
/// js/promise.js `markWatched`, for the one change a `watch()` makes).
fn write_state(tx: &Tx, state: &IndexState, gen: f64) -> Result<()> {
    let meta = tx.store(META)?;
    meta.put(&state.to_js(), Some(&JsValue::from_str(STATE_KEY)))?;
    meta.put(
        &JsValue::from_f64(gen + 1.0),
        Some(&JsValue::from_str(GEN_KEY)),
    )?;
    Ok(())
}

fn checkpoint_key(tag: &str) -> JsValue {
    JsValue::from(agentstore_protocol::cat(&[CHECKPOINT_PREFIX, tag]))
}

async fn read_checkpoint(tx: &Tx, tag: &str) -> Result<Option<Checkpoint>> {
    let v = tx.store(META)?.get(checkpoint_key(tag))?.await?;
    Ok(v.filter(JsValue::is_object).map(|v| Checkpoint {
        after: get_str(&v, "after"),
        done: crate::value::get(&v, &"done".into())
            .ok()
            .and_then(|d| d.as_f64())
            .unwrap_or(0.0) as u32,
    }))
}

fn write_checkpoint(tx: &Tx, tag: &str, cp: &Checkpoint) -> Result<()> {
    let o = Object::new();
    set(
        &o,
        "after",
        &cp.after.as_deref().map_or(JsValue::NULL, JsValue::from),
    );
    set(&o, "done", &cp.done.into());
    tx.store(META)?.put(&o, Some(&checkpoint_key(tag)))?;
    Ok(())
}

impl Store {
    /// The derived indexes a write transaction must maintain, read inside
    /// `tx` (which must include META): one small read of the state
    /// generation; the definitions are re-read only when another connection
    /// (or this one) changed them since this connection last looked. Pass
    /// the result to [`maintain`] for each record the transaction changes.
    ///
    /// # Errors
    /// TransactionError / ClosedError from IndexedDB.
    #[cfg(feature = "io")]
    pub(crate) async fn write_indexes(&self, tx: &Tx) -> Result<Rc<Maintained>> {
        self.write_indexes_from(tx, issue_gen(tx)?).await
    }

    /// Runs `read` (whose requests are issued after the generation read) and
    /// [`Store::write_indexes`] in `tx`: the same requests, in one round of
    /// IndexedDB's in-order request queue, as awaiting both together.
    ///
    /// # Errors
    /// `read`'s error, or as [`Store::write_indexes`].
    pub(crate) async fn with_indexes<T>(
        &self,
        tx: &Tx,
        read: impl std::future::Future<Output = Result<T>>,
    ) -> Result<(T, Rc<Maintained>)> {
        let gen = issue_gen(tx)?;
        let t = read.await?;
        Ok((t, self.write_indexes_from(tx, gen).await?))
    }

    /// Marks the database as watched (clears [`IndexState::quiet`], which
    /// bumps the generation) in a readwrite transaction created during this
    /// call (js/promise.js `markWatched`: the read, the conditional write
    /// and the Promise are JS, no Rust future); the Promise resolves with
    /// `undefined` once it committed (or found the mark already gone).
    /// Every write transaction created after it, in any tab or worker,
    /// posts its changes. One created before it (this connection's queued
    /// writes, another context's) reads the state first and may post
    /// nothing, even if it commits after `watch()` attached its listener:
    /// it was concurrent with the subscription. A connection whose last
    /// read of the state found the mark creates no transaction (the mark
    /// is never taken back while a connection to the database is open).
    ///
    /// # Errors
    /// ClosedError when the store is closed (returned); the Promise rejects
    /// with QuotaExceededError / TransactionError when the transaction
    /// aborts.
    pub(crate) fn mark_watched(&self) -> Result<js_sys::Promise> {
        if self.index_cache.0.borrow().is_some() && self.changes.watched() {
            self.db.check_open()?;
            return Ok(js_sys::Promise::resolve(&JsValue::UNDEFINED));
        }
        let tx = self.db.tx(&[META], TransactionMode::ReadWrite)?;
        let done = mark_watched(tx.raw(), &crate::error::dom_error_fn());
        // The transaction is JS's now: no abort when `tx` drops.
        tx.end_read();
        Ok(done)
    }

    /// [`Store::write_indexes`] given the issued generation read.
    pub(crate) async fn write_indexes_from(
        &self,
        tx: &Tx,
        gen: Req<Option<JsValue>>,
    ) -> Result<Rc<Maintained>> {
        let gen = gen_of(gen.await?);
        if let Some(m) = self
            .index_cache
            .0
            .borrow()
            .as_ref()
            .filter(|m| m.gen == gen)
        {
            return Ok(m.clone());
        }
        let (gen, state) = read_state(tx).await?;
        let m = Rc::new(Maintained {
            gen,
            tags: state.maintained(),
            purges: state.purges,
        });
        self.changes.set_state(!state.quiet, state.purges, state.db);
        *self.index_cache.0.borrow_mut() = Some(m.clone());
        Ok(m)
    }
}

#[wasm_bindgen::prelude::wasm_bindgen]
extern "C" {
    /// `Object.hasOwn(o, key)`, catching (a page may replace it).
    #[wasm_bindgen(js_namespace = Object, js_name = hasOwn, catch)]
    fn has_own(o: &JsValue, key: &JsValue) -> std::result::Result<bool, JsValue>;
}

#[wasm_bindgen::prelude::wasm_bindgen(module = "/js/promise.js")]
extern "C" {
    /// A string of at most `max` ASCII characters (js/promise.js
    /// `isAsciiUpTo`), checked before it is copied.
    /// Catching: the check runs a RegExp, whose `exec` a page may replace.
    #[wasm_bindgen(js_name = isAsciiUpTo, catch)]
    fn is_ascii_up_to(v: &JsValue, max: u32) -> std::result::Result<bool, JsValue>;
    /// One `listBy` page read in the transaction of `state` (js/promise.js
    /// `byPage`).
    #[wasm_bindgen(js_name = byPage)]
    #[allow(clippy::too_many_arguments)]
    fn by_page(
        state: &web_sys::IdbRequest,
        tag: &str,
        paths: &JsValue,
        range: &JsValue,
        descending: bool,
        limit: u32,
        entry_keys: &JsValue,
        cursor_of: &JsValue,
        to_error: &JsValue,
    ) -> js_sys::Promise;
}

/// The value at a dotted key path, if it is a valid index component
/// (a string or a finite number); otherwise the record has no entry.
///
/// Each step reads an OWN property, as IndexedDB evaluates a key path
/// (<https://w3c.github.io/IndexedDB/#evaluate-a-key-path-on-a-value>, "if
/// hop is false, return failure"): a record written (a null-prototype walk
/// copy) and the same record read back (an ordinary object) then give the
/// same key even when a library has set `Object.prototype.<key>`. Records
/// reach here only as walk copies or structured clones, never Proxies.
fn component(record: &JsValue, path: &str) -> Option<JsValue> {
    let mut v = record.clone();
    for seg in agentstore_protocol::keys::dot_parts(path) {
        let seg = JsValue::from_str(seg);
        if !v.is_object() || has_own(&v, &seg) != Ok(true) {
            return None;
        }
        v = crate::value::get(&v, &seg).ok()?;
    }
    match v.as_f64() {
        Some(n) if n.is_finite() => Some(v),
        Some(_) => None,
        None if v.is_string() => Some(v),
        None => None,
    }
}

/// The entry key `[tag, v1, …, vn, id]` of `record`, or `None` when a
/// component is missing or not a string/finite number.
pub(crate) fn entry_key(tag: &str, def: &IndexDef, record: &JsValue) -> Option<Array> {
    entry_key_within(tag, def, record, MAX_INDEXED_UNITS)
}

/// [`entry_key`] with string values of at most `max` UTF-16 code units in
/// all ([`MAX_INDEXED_UNITS`] for an entry to write or expect; unbounded to
/// find an entry an earlier release wrote, so that it is deleted).
fn entry_key_within(tag: &str, def: &IndexDef, record: &JsValue, max: u32) -> Option<Array> {
    let key = Array::new();
    key.push(&JsValue::from_str(tag));
    let mut units = 0u32;
    for path in &def.keys {
        let v = component(record, path)?;
        if let Some(text) = v.dyn_ref::<JsString>() {
            units = units.saturating_add(text.length());
            if units > max {
                return None;
            }
        }
        key.push(&v);
    }
    key.push(&crate::value::get(record, &"_id".into()).ok()?);
    Some(key)
}

/// Issues the entry writes for one record changing from `old` to `new`
/// (either may be absent) — inside the caller's transaction, no await.
pub(crate) fn maintain(
    tx: &Tx,
    indexes: &Maintained,
    old: Option<&JsValue>,
    new: Option<&JsValue>,
) -> Result<()> {
    if indexes.tags.is_empty() {
        return Ok(());
    }
    let derived = tx.store(DERIVED)?;
    for (tag, def) in &indexes.tags {
        // An entry written before MAX_INDEXED_UNITS bounded them goes too.
        let old_key = old.and_then(|o| entry_key_within(tag, def, o, u32::MAX));
        let new_key = new.and_then(|n| entry_key(tag, def, n));
        if let (Some(o), Some(n)) = (&old_key, &new_key) {
            if idb_cmp(o, n)? == 0 {
                continue;
            }
        }
        if let Some(o) = old_key {
            derived.delete(JsValue::from(o))?;
        }
        if let Some(n) = new_key {
            derived.put(&n, Some(&n))?;
        }
    }
    Ok(())
}

fn factory() -> Result<web_sys::IdbFactory> {
    crate::value::get(&js_sys::global(), &"indexedDB".into())
        .ok()
        .and_then(|f| f.dyn_into().ok())
        .ok_or_else(|| StoreError::Transaction("IndexedDB is not available".into()))
}

/// `indexedDB.cmp(a, b)`: IndexedDB's own key order.
fn idb_cmp(a: &JsValue, b: &JsValue) -> Result<i16> {
    factory()?.cmp(a, b).map_err(|e| StoreError::from_dom(&e))
}

fn part_to_js(p: &KeyPart) -> JsValue {
    match p {
        KeyPart::Num(n) => JsValue::from_f64(*n),
        KeyPart::Str(u) => value::from_units(u).into(),
        KeyPart::Max => Array::new().into(),
    }
}

fn key_to_js(parts: &[KeyPart]) -> JsValue {
    let a = Array::new();
    for p in parts {
        a.push(&part_to_js(p));
    }
    a.into()
}

fn part_from_js(v: &JsValue) -> Option<KeyPart> {
    if let Some(n) = v.as_f64() {
        return n.is_finite().then_some(KeyPart::Num(n));
    }
    if let Some(s) = v.dyn_ref::<JsString>() {
        return Some(KeyPart::Str(value::units(s)));
    }
    // `value::is_array` catches (a revoked Proxy throws from `Array.isArray`).
    let empty = crate::value::get(v, &"length".into()).ok()?.as_f64() == Some(0.0);
    (value::is_array(v).ok()? && empty).then_some(KeyPart::Max)
}

fn key_from_js(v: &JsValue) -> Option<Vec<KeyPart>> {
    // Loops, here and in `strings_from_js`, rather than `collect` into an
    // `Option`: one body each instead of the iterator adapters' monomorphs.
    let mut out = Vec::new();
    for p in Array::from(v).iter() {
        out.push(part_from_js(&p)?);
    }
    Some(out)
}

fn to_range(r: &EntryRange) -> Result<Query> {
    Ok(Query::KeyRange(KeyRange::bound(
        &key_to_js(&r.lower),
        &key_to_js(&r.upper),
        Some(r.lower_open),
        Some(r.upper_open),
    )?))
}

/// A parsed `listBy` query.
pub struct ByQuery {
    cond: Condition,
    limit: u32,
    after: Option<Vec<KeyPart>>,
    descending: bool,
}

impl ByQuery {
    /// Reads `{eq | prefix | range, limit, after, descending}`.
    ///
    /// # Errors
    /// ValidationError for more than one condition, wrong types, a range
    /// whose `lower` is above its `upper`, bad limit or cursor.
    pub fn from_js(o: &JsValue) -> Result<ByQuery> {
        crate::options::check_object(o, "listBy options").map_err(StoreError::validation)?;
        crate::options::known(o, "eq prefix range limit after descending")?;
        let get = |k: &str| crate::options::read(o, k);
        let given = |v: &JsValue| !v.is_undefined() && !v.is_null();
        // A caller's key part: a string is copied into wasm memory only up
        // to the units an entry may hold (`MAX_INDEXED_UNITS`, 250,000: every
        // entry can be looked up, and a longer value matches none; the
        // store's own keys, read for `next`, are not bounded).
        let max = agentstore_protocol::index::MAX_INDEXED_UNITS;
        let part = |v: &JsValue, what: &str| {
            (!v.is_string() || value::bounded(v, max).is_some())
                .then(|| part_from_js(v))
                .flatten()
                .filter(|p| *p != KeyPart::Max)
                .ok_or_else(|| {
                    StoreError::validation(agentstore_protocol::cat(&[
                        what,
                        " must be a finite number or a string of at most 250,000 UTF-16 code units",
                    ]))
                })
        };
        let (eq, prefix, range) = (get("eq")?, get("prefix")?, get("range")?);
        if u8::from(given(&eq)) + u8::from(given(&prefix)) + u8::from(given(&range)) > 1 {
            return Err(StoreError::validation(
                "give at most one of eq, prefix, range",
            ));
        }
        let cond = if given(&eq) {
            let vals: Vec<JsValue> = if value::is_array(&eq)? {
                value::items(
                    eq.unchecked_ref(),
                    agentstore_protocol::index::MAX_INDEX_KEYS,
                    "eq takes at most 8 values",
                )?
            } else {
                vec![eq]
            };
            if vals.is_empty() {
                return Err(StoreError::validation("eq must not be empty"));
            }
            // An entry's strings hold at most `max` units in all, so a
            // longer key matches none: refused before any is copied (eight
            // parts of `max` each would grow wasm memory by 4 MB for good).
            let units = vals.iter().fold(0u32, |n, v| {
                n.saturating_add(v.dyn_ref::<js_sys::JsString>().map_or(0, |s| s.length()))
            });
            if units > max {
                return Err(StoreError::validation(
                    "eq's strings must hold at most 250,000 UTF-16 code units in all",
                ));
            }
            let mut key = Vec::new();
            for v in &vals {
                key.push(part(v, "eq")?);
            }
            Condition::Eq(key)
        } else if given(&prefix) {
            let s = value::bounded(&prefix, max).ok_or_else(|| {
                StoreError::validation(
                    "prefix must be a string of at most 250,000 UTF-16 code units",
                )
            })?;
            Condition::Prefix(value::units(s))
        } else if given(&range) {
            if !range.is_object() || value::is_array(&range)? {
                return Err(StoreError::validation(
                    "range must be an object {lower?, upper?, lowerOpen?, upperOpen?}",
                ));
            }
            crate::options::known(&range, "lower upper lowerOpen upperOpen")?;
            let opt = |k: &str| -> Result<Option<KeyPart>> {
                let v = crate::options::read(&range, k)?;
                if given(&v) {
                    part(&v, k).map(Some)
                } else {
                    Ok(None)
                }
            };
            let (lower, upper) = (opt("lower")?, opt("upper")?);
            // An inverted range is a caller's mistake (IndexedDB's own
            // `IDBKeyRange.bound` refuses it too), not an empty listing.
            if let (Some(l), Some(u)) = (&lower, &upper) {
                if agentstore_protocol::index::cmp_part(l, u) == std::cmp::Ordering::Greater {
                    return Err(StoreError::validation("range: lower is above upper"));
                }
            }
            Condition::Range {
                lower,
                upper,
                lower_open: crate::options::flag(&range, "lowerOpen")?,
                upper_open: crate::options::flag(&range, "upperOpen")?,
            }
        } else {
            Condition::All
        };
        let limit = match get("limit")? {
            v if !given(&v) => check_limit(None),
            v => check_limit(Some(
                v.as_f64()
                    .ok_or_else(|| StoreError::validation("limit must be a number"))?,
            )),
        }
        .map_err(StoreError::validation)?;
        let after = match get("after")? {
            v if !given(&v) => None,
            v => Some(
                decode_key_cursor(
                    // The store's own cursor, as long as the indexed values
                    // of the entry it names (4 hex digits per code unit):
                    // bounded by MAX_KEY_CURSOR_LEN, not the 64 Ki-unit
                    // bound of other arguments, and copied only when it is
                    // ASCII within it (1 byte per unit).
                    &is_ascii_up_to(&v, agentstore_protocol::index::MAX_KEY_CURSOR_LEN)
                        .unwrap_or(false)
                        .then(|| v.as_string())
                        .flatten()
                    .ok_or_else(|| {
                        StoreError::validation(
                            "after must be a cursor string made by listBy (at most 1,048,576 characters)",
                        )
                    })?,
                )
                .map_err(StoreError::validation)?,
            ),
        };
        Ok(ByQuery {
            cond,
            limit,
            after,
            descending: crate::options::flag(o, "descending")?,
        })
    }
}

/// What `verifyIndexes` found.
#[derive(Default)]
pub struct Verification {
    /// Records examined.
    pub checked: u32,
    /// Ids of records that should have an entry and have none.
    pub missing: Vec<JsValue>,
    /// Ids named by entries whose record does not exist.
    pub orphaned: Vec<JsValue>,
    /// Ids whose entry's key differs from the record's (or should not exist).
    pub stale: Vec<JsValue>,
    /// Indexes not verified because they are being (re)built.
    pub building: Vec<String>,
}

impl Store {
    /// The declared definition named `name`.
    fn def(&self, name: &str) -> Result<&IndexDef> {
        self.indexes.iter().find(|d| d.name == name).ok_or_else(|| {
            StoreError::validation(agentstore_protocol::cat(&[
                "no index named \"",
                name,
                "\" was declared at open",
            ]))
        })
    }

    /// One page of records in index order: `{records, next}`.
    ///
    /// While the index is being (re)built the page is computed from the
    /// records themselves, so answers stay correct during a rebuild.
    ///
    /// # Errors
    /// ValidationError for an undeclared index or bad query.
    pub async fn list_by(&self, name: &str, q: &ByQuery) -> Result<super::Page> {
        let page = super::answered(self.list_by_promise(name, q, &JsValue::UNDEFINED)?).await?;
        Ok(super::list::page_from_js(&page))
    }

    /// `listBy` as the JS method answers it: the state read issued during
    /// the call, the rest of the page read in JS (js/promise.js `byPage`),
    /// entering the module again only to encode `next` and, while the index
    /// is being built, to compute the records' entry keys.
    ///
    /// # Errors
    /// As [`Store::list_by`], thrown; the Promise rejects with
    /// TransactionError and the like.
    pub(crate) fn list_by_promise(
        &self,
        name: &str,
        q: &ByQuery,
        to_error: &JsValue,
    ) -> Result<js_sys::Promise> {
        let def = self.def(name)?;
        let tag = def.tag();
        agentstore_protocol::index::check_query(&tag, def.keys.len(), &q.cond, q.after.as_deref())
            .map_err(StoreError::validation)?;
        let Some(range) = entry_range(&tag, &q.cond, q.after.as_deref(), q.descending) else {
            return super::list::empty_page(&self.db);
        };
        let range: JsValue = to_range(&range)?.into();
        let tx = self
            .db
            .tx(&[META, DERIVED, RECORDS], TransactionMode::ReadOnly)?;
        let meta: web_sys::IdbObjectStore = tx.store(META)?.into();
        let state = meta
            .get(&JsValue::from_str(STATE_KEY))
            .map_err(|e| StoreError::from_dom(&e))?;
        tx.end_read();
        thread_local! {
            /// `(records, tag, paths) => keys`: the entry keys of the
            /// records that have one, for an index being built.
            static ENTRY_KEYS: JsValue =
                wasm_bindgen::closure::Closure::<dyn Fn(Array, String, JsValue) -> Array>::new(
                    |rows: Array, tag: String, paths: JsValue| {
                        let keys = strings_from_js(&paths).unwrap_or_default();
                        let def = IndexDef { name: String::new(), keys };
                        let keys = Array::new();
                        for r in rows.iter() {
                            if let Some(k) = entry_key(&tag, &def, &r) {
                                keys.push(&k);
                            }
                        }
                        keys
                    },
                )
                .into_js_value();
            /// `(entry key) => cursor`: the `next` of a page.
            static CURSOR_OF: JsValue =
                wasm_bindgen::closure::Closure::<dyn Fn(JsValue) -> JsValue>::new(|k: JsValue| {
                    key_from_js(&k).map_or(JsValue::NULL, |k| encode_key_cursor(&k).into())
                })
                .into_js_value();
        }
        Ok(by_page(
            &state,
            &tag,
            &strings_js(&def.keys),
            &range,
            q.descending,
            q.limit,
            &ENTRY_KEYS.with(JsValue::clone),
            &CURSOR_OF.with(JsValue::clone),
            to_error,
        ))
    }

    /// [`Store::verify_indexes_with`] without progress or signal.
    ///
    /// # Errors
    /// As [`Store::verify_indexes_with`].
    #[cfg(feature = "io")]
    pub async fn verify_indexes(&self) -> Result<Verification> {
        self.verify_indexes_with(None, None).await
    }

    /// Compares every active index with what the records say it should
    /// hold, in one read-only transaction (a consistent view): each index's
    /// entry keys are read whole, the records [`super::DEFAULT_BATCH`] (1,000) at a time.
    ///
    /// `on_progress(done, total)` is called after each batch of records:
    /// `done` records read of the `total` stored (an empty store makes no
    /// call). A thenable it returns is awaited before the next call and
    /// before the result, while the reads go on (the transaction cannot
    /// wait for it; see `store/calls.rs`). `signal` is looked at before
    /// each read and each call, and ends a wait for such a thenable.
    ///
    /// # Errors
    /// AbortError (`cause`: the signal's reason); what `on_progress` throws
    /// or rejects with, unless in its last call (`done == total`: the
    /// verification is complete then, and resolves); TransactionError /
    /// ClosedError.
    #[cfg(feature = "io")]
    pub async fn verify_indexes_with(
        &self,
        on_progress: Option<&Function>,
        signal: Option<&web_sys::AbortSignal>,
    ) -> Result<Verification> {
        let mut calls = super::calls::Calls::new(self, None, on_progress, signal);
        calls.check()?;
        let tx = self
            .db
            .tx(&[META, DERIVED, RECORDS], TransactionMode::ReadOnly)?;
        let (_, state) = read_state(&tx).await?;
        let records = tx.store(RECORDS)?;
        // Counted only for `on_progress` (a count walks the whole store).
        let total = match on_progress {
            Some(_) => records.count(None)?.await?,
            None => 0,
        };
        let mut v = Verification::default();
        // Per active index: its definition, tag, and id -> the expected
        // entry key as JSON text, in record order (a JS Map keyed by the id
        // itself: exact, lone surrogates included, and no Rust map code in
        // the wasm).
        let mut active = Vec::new();
        for def in &self.indexes {
            let tag = def.tag();
            if state.active.contains(&tag) {
                active.push((def, tag, js_sys::Map::new()));
            } else {
                v.building.push(def.name.clone());
            }
        }
        let live = js_sys::Set::new(&JsValue::UNDEFINED);
        let mut after: Option<JsValue> = None;
        loop {
            calls.check()?;
            let rows =
                super::calls::read_after(&records, after.as_ref(), super::DEFAULT_BATCH).await?;
            for r in &rows {
                let id = crate::value::get(r, &"_id".into()).unwrap_or_default();
                live.add(&id);
                for (def, tag, expected) in &active {
                    if let Some(k) = entry_key(tag, def, r) {
                        expected.set(&id, &json_text(&k));
                    }
                }
            }
            v.checked += rows.len() as u32;
            if !rows.is_empty() {
                calls.progress(v.checked, total.max(v.checked))?;
            }
            match rows.last() {
                Some(last) if rows.len() == super::DEFAULT_BATCH as usize => {
                    after = Some(crate::value::get(last, &"_id".into()).unwrap_or_default());
                }
                _ => break,
            }
        }
        for (_, tag, expected) in &active {
            calls.check()?;
            let all = entry_range(tag, &Condition::All, None, false)
                .ok_or_else(|| StoreError::Transaction("empty index range".into()))?;
            let actual = tx
                .store(DERIVED)?
                .get_all_keys(Some(to_range(&all)?), None)?
                .await?;
            let (seen, stale) = (
                js_sys::Set::new(&JsValue::UNDEFINED),
                js_sys::Set::new(&JsValue::UNDEFINED),
            );
            for k in &actual {
                let id = Array::from(k).at(-1);
                if !live.has(&id) {
                    v.orphaned.push(id);
                } else if expected.get(&id) != json_text(k) {
                    stale.add(&id);
                    v.stale.push(id);
                } else {
                    seen.add(&id);
                }
            }
            expected.for_each(&mut |_, id| {
                if !seen.has(&id) && !stale.has(&id) {
                    v.missing.push(id);
                }
            });
        }
        tx.end_read();
        calls.finish().await?;
        Ok(v)
    }

    /// Drops the derived index `name`, which this connection does not
    /// declare: every definition of that name (an older one too), all its
    /// entries and its rebuild checkpoint, in one readwrite transaction.
    /// Every tab's writes stop maintaining it at once (they read the shared
    /// state's generation in their own transaction). A tab that still
    /// declares it answers `listBy` for it from the records, lists it under
    /// `building` in `verifyIndexes`, and rebuilds it at its next `open`
    /// (as after a redefinition by another tab). Resolves to whether an
    /// index of that name existed. Dexie drops an index when a new schema
    /// version leaves it out; here definitions need no version, so the drop
    /// is explicit.
    ///
    /// `signal` is looked at once, before the transaction: an abort after
    /// that leaves the drop to complete (it is all or nothing).
    ///
    /// # Errors
    /// ValidationError when this connection declares `name` (its next open
    /// would build it again); AbortError (`cause`: the signal's reason,
    /// nothing dropped); TransactionError / ClosedError from IndexedDB.
    pub async fn drop_index(
        &self,
        name: &str,
        signal: Option<&web_sys::AbortSignal>,
    ) -> Result<bool> {
        if self.indexes.iter().any(|d| d.name == name) {
            return Err(StoreError::validation(DECLARED));
        }
        // Aborted before its transaction has read the index state (also
        // while it waits behind another connection's): nothing is dropped.
        // Once it writes, the drop is one transaction, and it completes.
        super::mutate::check_abort(signal)?;
        let tx = self.db.tx(&[META, DERIVED], TransactionMode::ReadWrite)?;
        let (gen, mut state) = read_state(&tx).await?;
        // (Dropped on the error, the transaction is aborted: see `Tx`.)
        super::mutate::check_abort(signal)?;
        let tags: Vec<String> = state
            .defs
            .iter()
            .filter(|(_, d)| d.name == name)
            .map(|(t, _)| t.clone())
            .collect();
        if !tags.is_empty() {
            drop_tags(&tx, &mut state, &tags)?;
            write_state(&tx, &state, gen)?;
        }
        tx.commit().await?;
        Ok(!tags.is_empty())
    }

    /// Rebuilds every declared index from the records, in batches of
    /// `batch_size` records per transaction. With `restart` every declared
    /// index starts over; without, an active index is kept and a building
    /// one resumes from its own checkpoint (written by any connection).
    /// `on_progress(done, total)` is called after each batch. Entries are a
    /// pure function of the records, so the result is identical every time,
    /// and connections rebuilding the same tag at once only share the work.
    /// Resolves once every declared index is active: another connection's
    /// rebuild of other indexes never ends this one (checkpoints are per tag).
    ///
    /// # Errors
    /// AbortError when `signal` aborts (the checkpoints stay, so a later call
    /// with `restart` false resumes, while one with `restart` starts over;
    /// one aborted before the call changes nothing); what
    /// `on_progress` threw, unchanged, when it throws before the last batch
    /// (the committed batches stay); TransactionError when another
    /// connection redefined one of these index names meanwhile, or from
    /// IndexedDB; QuotaExceededError.
    pub async fn rebuild_indexes(
        &self,
        batch_size: u32,
        restart: bool,
        on_progress: Option<&Function>,
        signal: Option<&web_sys::AbortSignal>,
    ) -> Result<u32> {
        let tags: Vec<String> = self.indexes.iter().map(IndexDef::tag).collect();
        // Aborted already: nothing is restarted (a restart drops entries).
        super::mutate::check_abort(signal)?;
        // Start the tags that are neither active nor building (all with `restart`).
        let tx = self.db.tx(&[META, DERIVED], TransactionMode::ReadWrite)?;
        let (gen, mut state) = read_state(&tx).await?;
        let fresh: Vec<&IndexDef> = self
            .indexes
            .iter()
            .zip(&tags)
            .filter(|(_, t)| restart || !(state.active.contains(t) || state.building.contains(t)))
            .map(|(d, _)| d)
            .collect();
        if !fresh.is_empty() {
            start_tags(&tx, &mut state, &fresh, false)?;
            write_state(&tx, &state, gen)?;
        }
        tx.commit().await?;
        let batch = batch_size.clamp(1, 10_000);
        // Counted once: a count walks the whole store (~80 ms per 100,000
        // records), and progress only needs an estimate of the total.
        let mut counted: Option<u32> = None;
        loop {
            super::mutate::check_abort(signal)?;
            let tx = self
                .db
                .tx(&[META, DERIVED, RECORDS], TransactionMode::ReadWrite)?;
            let (gen, mut state) = read_state(&tx).await?;
            let total = match counted {
                Some(t) => t,
                None => *counted.insert(tx.store(RECORDS)?.count(None)?.await?),
            };
            if let Some(d) = self
                .indexes
                .iter()
                .zip(&tags)
                .find(|(_, t)| !state.defs.contains_key(*t))
            {
                tx.commit().await?;
                return Err(StoreError::Transaction(agentstore_protocol::cat(&[
                    "index ",
                    &d.0.name,
                    " was redefined or dropped by another connection during the rebuild",
                ])));
            }
            // This connection's tags still building, each at its checkpoint.
            let mut mine = Vec::new();
            for t in tags.iter().filter(|t| state.building.contains(t)) {
                mine.push((t, read_checkpoint(&tx, t).await?.unwrap_or_default()));
            }
            // Continue from the checkpoint furthest behind; re-putting entries
            // a tag already has is harmless (same key), so the tags converge.
            let Some(from) = mine
                .iter()
                .map(|(_, c)| c)
                .min_by(|a, b| cursor_order(a, b))
                .cloned()
            else {
                // Every tag is active: finished here or by another connection.
                tx.commit().await?;
                return Ok(total);
            };
            let after = from
                .after
                .as_deref()
                .map(agentstore_protocol::keys::decode_cursor)
                .transpose()
                .map_err(StoreError::Transaction)?;
            let range = agentstore_protocol::keys::page_range(&[], after.as_deref(), false);
            let query = match range.as_ref().and_then(|r| r.lower.as_ref()) {
                Some(b) => Some(Query::KeyRange(KeyRange::lower_bound(
                    &value::from_units(&b.key).into(),
                    Some(b.open),
                )?)),
                None => None,
            };
            // One row past the batch says whether any is left: a last batch
            // that is exactly full finishes here, not in an empty batch after
            // it (which reported its progress twice, and a callback throwing
            // at `done == total` then left the rebuild unfinished).
            let mut rows = tx
                .store(RECORDS)?
                .get_all(query, Some(batch.saturating_add(1)))?
                .await?;
            // close() (or a versionchange) while the read was out: no batch
            // is written after it (the dropped transaction aborts).
            self.check_open()?;
            let finished = rows.len() as u32 <= batch;
            rows.truncate(batch as usize);
            let mut next = Checkpoint {
                after: from.after,
                done: from.done + rows.len() as u32,
            };
            if let Some(last) = rows.last() {
                let id: JsString = crate::value::get(last, &"_id".into())
                    .unwrap_or_default()
                    .into();
                next.after = Some(agentstore_protocol::keys::encode_cursor(&value::units(&id)));
            }
            if finished {
                let meta = tx.store(META)?;
                for (t, _) in &mine {
                    meta.delete(checkpoint_key(t))?;
                    state.building.retain(|b| b != *t);
                    if !state.active.contains(*t) {
                        state.active.push((*t).clone());
                    }
                }
                write_state(&tx, &state, gen)?;
            } else {
                for (t, _) in &mine {
                    write_checkpoint(&tx, t, &next)?;
                }
            }
            // The entries, the requests that take space, go after the
            // checkpoint or state that counts them done: Firefox, refusing
            // a request for quota, aborts the transaction but keeps the
            // requests issued after the refused one (README, "A failed
            // write leaves nothing behind"). Issued before, an advanced
            // checkpoint or an index marked complete stayed while the
            // entries were refused: the index answered listBy without them
            // and `rebuildIndexes({restart: false})` saw nothing to do.
            let derived = tx.store(DERIVED)?;
            for r in &rows {
                for (t, _) in &mine {
                    if let Some(k) = state.defs.get(*t).and_then(|d| entry_key(t, d, r)) {
                        derived.put(&k, Some(&k))?;
                    }
                }
            }
            tx.commit().await?;
            // Committed; closed meanwhile: no progress call, and the call
            // rejects (ClosedError) even after its last batch.
            self.check_open()?;
            // A throwing callback ends the call with what it threw, as in
            // the imports; the batch is committed, so a later call resumes.
            // After the last batch the rebuild is complete, and it says so.
            if let Some(cb) = on_progress {
                let called = crate::value::call2(
                    cb,
                    &JsValue::NULL,
                    &JsValue::from(next.done),
                    &JsValue::from(total.max(next.done)),
                );
                // An async `onProgress` (only the io build's rebuildIndexes
                // takes one) is awaited before the next batch, outside any
                // transaction (this batch committed).
                #[cfg(feature = "io")]
                let called = super::mutate::settle_callback(called, signal, self, finished).await?;
                if !finished {
                    called.map_err(StoreError::Thrown)?;
                }
            }
            if finished {
                return Ok(next.done);
            }
            // Yield to the event loop so the page stays responsive.
            super::db::sleep(0).await;
        }
    }

    /// Whether every declared index is active (complete).
    ///
    /// # Errors
    /// TransactionError / ClosedError.
    pub async fn indexes_ready(&self) -> Result<bool> {
        let tx = self.db.tx(&[META], TransactionMode::ReadOnly)?;
        let (_, state) = read_state(&tx).await?;
        tx.end_read();
        Ok(self.indexes.iter().all(|d| state.active.contains(&d.tag())))
    }

    /// What `open()` does about the declared indexes, in one readwrite
    /// transaction over META, DERIVED and RECORDS: `true` when every one is
    /// active (complete), or when the store holds no record, in which case
    /// those not active are made active at once (there is nothing to
    /// build); `false` when a rebuild is needed, also when that adoption
    /// fails to commit (e.g. for quota: the rebuild then does it). A record
    /// written by another connection is either counted or written after the
    /// indexes are active (and then kept in step by its write). This spares
    /// a new app's first `open()` the rebuild and the module that carries
    /// it.
    ///
    /// # Errors
    /// TransactionError / ClosedError from the reads.
    pub async fn prepare_indexes(&self) -> Result<bool> {
        let tx = self
            .db
            .tx(&[META, DERIVED, RECORDS], TransactionMode::ReadWrite)?;
        let records = tx.store(RECORDS)?.count(None)?;
        let (gen, mut state) = read_state(&tx).await?;
        let mut fresh = Vec::new();
        for d in &self.indexes {
            if !state.active.contains(&d.tag()) {
                fresh.push(d);
            }
        }
        if fresh.is_empty() {
            tx.end_read();
            return Ok(true);
        }
        if records.await? > 0 {
            tx.end_read();
            return Ok(false);
        }
        start_tags(&tx, &mut state, &fresh, true)?;
        write_state(&tx, &state, gen)?;
        Ok(tx.commit().await.is_ok())
    }

    /// All entries of the DERIVED store as `[key, value]` JSON text, for tests
    /// that compare rebuilds byte for byte.
    ///
    /// # Errors
    /// TransactionError.
    #[doc(hidden)]
    pub async fn dump_entries(&self) -> Result<String> {
        let tx = self.db.tx(&[DERIVED], TransactionMode::ReadOnly)?;
        let keys = tx.store(DERIVED)?.get_all_keys(None, None)?;
        let vals = tx.store(DERIVED)?.get_all(None, None)?;
        let (keys, vals) = (keys.await?, vals.await?);
        tx.end_read();
        let pairs: Array = keys
            .iter()
            .zip(&vals)
            .map(|(k, v)| JsValue::from(Array::of2(k, v)))
            .collect();
        Ok(json_text(&pairs.into()).as_string().unwrap_or_default())
    }

    /// Raw access to the DERIVED store for fault-injection tests.
    ///
    /// # Errors
    /// TransactionError.
    #[doc(hidden)]
    pub async fn raw_derived(&self, put: &[(JsValue, JsValue)], delete: &[JsValue]) -> Result<()> {
        let tx = self.db.tx(&[DERIVED], TransactionMode::ReadWrite)?;
        let d = tx.store(DERIVED)?;
        for (k, v) in put {
            d.put(v, Some(k))?;
        }
        for k in delete {
            d.delete(k.clone())?;
        }
        tx.commit().await
    }
}

/// Orders checkpoints by how far they got (`None` = not started = first).
/// Cursors are compared as the ids they encode (UTF-16 units, IndexedDB's order).
fn cursor_order(a: &Checkpoint, b: &Checkpoint) -> std::cmp::Ordering {
    let key = |c: &Checkpoint| {
        c.after
            .as_deref()
            .and_then(|s| agentstore_protocol::keys::decode_cursor(s).ok())
    };
    key(a).cmp(&key(b))
}

/// Builds the `{checked, missing, orphaned, stale, building}` JS object.
pub fn verification_js(v: &Verification) -> JsValue {
    let o = Object::new();
    set(&o, "checked", &v.checked.into());
    let arr = |xs: &[JsValue]| -> JsValue {
        let a = Array::new();
        for x in xs {
            a.push(x);
        }
        a.into()
    };
    set(&o, "missing", &arr(&v.missing));
    set(&o, "orphaned", &arr(&v.orphaned));
    set(&o, "stale", &arr(&v.stale));
    set(&o, "building", &strings_js(&v.building));
    o.into()
}

/// `JSON.stringify(v)` as a JS string (entry keys hold record strings of
/// any length: compared in JS, never copied into wasm memory).
fn json_text(v: &JsValue) -> JsValue {
    js_sys::JSON::stringify(v)
        .map(JsValue::from)
        .unwrap_or_default()
}

/// The ValidationError message of `dropIndex` of a declared index (the
/// connection's next open would build it again), checked by the entry
/// point too, before the io module is loaded.
pub(crate) const DECLARED: &str =
    "dropIndex: this store was opened declaring that index; open it without the index to drop it";
