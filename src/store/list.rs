//! Exact prefix listing with keyset cursors.
//!
//! The range is `[prefix, successor(prefix))` computed on UTF-16 code units by
//! the protocol crate — never a `\uffff` sentinel — so keys beyond the BMP and
//! keys containing U+FFFF are listed (case C-L2). Pages continue strictly
//! after the last key seen (`next`), so concurrent writes never make a page
//! skip or repeat a record that existed before the listing began.

use super::db::{answer_of, KeyRange, Query, TransactionMode};
use super::db::{BY_TYPE, RECORDS};
use super::Store;
use crate::error::{Result, StoreError};
use crate::value;
use agentstore_protocol::keys::{decode_cursor, encode_cursor, page_range, Bound, PageRange};
use agentstore_protocol::record::{check_limit, MAX_ID_UNITS};
use js_sys::{Array, JsString};
use wasm_bindgen::{JsCast, JsValue};

/// A parsed `list()` query.
#[derive(Debug, Clone, Default)]
pub struct ListQuery {
    /// Keys must start with these UTF-16 units (empty = all).
    pub prefix: Vec<u16>,
    /// Only records whose `recordType` equals this.
    pub record_type: Option<JsString>,
    /// Page size, 1..=10 000.
    pub limit: u32,
    /// Continue after this key (decoded cursor).
    pub after: Option<Vec<u16>>,
    /// Largest key first.
    pub descending: bool,
}

/// The options `list` takes.
pub const LIST_KEYS: &str = "prefix type limit after descending";

impl ListQuery {
    /// Reads `{prefix, type, limit, after, descending}` from a JS object (or
    /// undefined); `keys` names the options the call takes ([`LIST_KEYS`],
    /// or only `prefix type` for `count`).
    ///
    /// # Errors
    /// ValidationError for wrong types, a key not in `keys`, a bad limit or
    /// a cursor not made by `list` with this prefix.
    pub fn from_js(options: &JsValue, keys: &'static str) -> Result<ListQuery> {
        let get = |k: &str| crate::options::read(options, k);
        if !options.is_undefined() && !options.is_null() && !options.is_object() {
            return Err(StoreError::validation("list options must be an object"));
        }
        crate::options::known(options, keys)?;
        let prefix = match get("prefix")? {
            v if v.is_undefined() || v.is_null() => Vec::new(),
            v => match v.dyn_into::<JsString>() {
                // No id is longer (and the copy into wasm memory stays small).
                Ok(s) if s.length() as usize > MAX_ID_UNITS => {
                    return Err(StoreError::validation(
                        "prefix is longer than any id (1024 UTF-16 code units)",
                    ))
                }
                Ok(s) => value::units(&s),
                Err(_) => return Err(StoreError::validation("prefix must be a string")),
            },
        };
        let record_type = match get("type")? {
            v if v.is_undefined() || v.is_null() => None,
            // Kept as JS text: a lone surrogate must match itself, not U+FFFD.
            v => Some(
                v.dyn_into::<JsString>()
                    .map_err(|_| StoreError::validation("type must be a string"))?,
            ),
        };
        let limit = match get("limit")? {
            v if v.is_undefined() || v.is_null() => check_limit(None),
            v => match v.as_f64() {
                Some(n) => check_limit(Some(n)),
                None => Err("limit must be a number".into()),
            },
        }
        .map_err(StoreError::validation)?;
        let after = match get("after")? {
            v if v.is_undefined() || v.is_null() => None,
            v => {
                let s = value::short_string(&v, value::MAX_ARG_UNITS).ok_or_else(|| {
                    StoreError::validation(
                        "after must be a cursor string from a previous page's next",
                    )
                })?;
                Some(decode_cursor(&s).map_err(StoreError::validation)?)
            }
        };
        // A page's `next` is its last record's `_id`, which starts with the
        // listing's prefix: another prefix's cursor is refused, as `listBy`
        // refuses another index's.
        if after.as_ref().is_some_and(|a| !a.starts_with(&prefix)) {
            return Err(StoreError::validation(
                "after is a cursor of a listing of another prefix",
            ));
        }
        let descending = crate::options::flag(options, "descending")?;
        Ok(ListQuery {
            prefix,
            record_type,
            limit,
            after,
            descending,
        })
    }
}

/// One page: the stored records (as IndexedDB returned them) and the cursor
/// for the next page (`None` on the last page).
#[derive(Debug)]
pub struct Page {
    /// Records in key order (descending when asked).
    pub records: Array,
    /// Opaque cursor for `after`, or `None`.
    pub next: Option<String>,
}

impl Store {
    /// Lists one page of live records.
    ///
    /// # Errors
    /// ClosedError / TransactionError from IndexedDB.
    pub async fn list(&self, q: &ListQuery) -> Result<Page> {
        let page = super::answered(self.list_promise(q, &JsValue::UNDEFINED)?).await?;
        Ok(page_from_js(&page))
    }

    /// `list` as the JS method answers it: the read issued during the call
    /// (one `getAll`, or a descending cursor walked in JS) and the page
    /// `{records, next}` made in JS (js/promise.js `listPage`), with no trip
    /// through wasm per row nor an executor.
    ///
    /// # Errors
    /// As [`Store::list`], thrown; the Promise rejects with TransactionError
    /// and the like.
    pub(crate) fn list_promise(
        &self,
        q: &ListQuery,
        to_error: &JsValue,
    ) -> Result<js_sys::Promise> {
        let Some(range) = page_range(&q.prefix, q.after.as_deref(), q.descending) else {
            return empty_page(&self.db);
        };
        let tx = self.db.tx(&[RECORDS], TransactionMode::ReadOnly)?;
        let store = tx.store(RECORDS)?;
        let fetch = q.limit + 1;
        let query = query_js(key_range(&range, q.record_type.as_ref())?);
        let dom = |r: std::result::Result<web_sys::IdbRequest, JsValue>| {
            r.map_err(|e| StoreError::from_dom(&e))
        };
        let prev = web_sys::IdbCursorDirection::Prev;
        let rows = match (&q.record_type, q.descending) {
            // Ascending pages come from one getAll whose JS array is handed
            // on as is.
            (None, false) => answer_of(
                &dom(store.source().get_all_req(&query, &fetch.into()))?,
                to_error,
            ),
            (Some(_), false) => answer_of(
                &dom(store
                    .index(BY_TYPE)?
                    .source()
                    .get_all_req(&query, &fetch.into()))?,
                to_error,
            ),
            (None, true) => {
                let raw: web_sys::IdbObjectStore = store.into();
                let c = dom(raw.open_cursor_with_range_and_direction(&query, prev))?;
                cursor_rows(&c, fetch, to_error)
            }
            (Some(_), true) => {
                let raw: web_sys::IdbIndex = store.index(BY_TYPE)?.into();
                let c = dom(raw.open_cursor_with_range_and_direction(&query, prev))?;
                cursor_rows(&c, fetch, to_error)
            }
        };
        tx.end_read();
        Ok(list_page(&rows, q.limit, &cursor_fn()))
    }
}

/// A page `{records, next}` made in JS as [`Page`].
pub(super) fn page_from_js(page: &JsValue) -> Page {
    let field = |k: &str| crate::value::get(page, &k.into()).unwrap_or_default();
    Page {
        records: field("records").unchecked_into(),
        next: field("next").as_string(),
    }
}

/// The answer of a page whose key range is empty: `{records: [], next: null}`.
///
/// # Errors
/// ClosedError when `db` is closed: a closed store answers that, even with
/// nothing to read (a paging loop must not read it as the end).
pub(super) fn empty_page(db: &super::db::Db) -> Result<js_sys::Promise> {
    db.check_open()?;
    let none = js_sys::Promise::resolve(&JsValue::from(Array::new()));
    Ok(list_page(&none, 0, &JsValue::NULL))
}

/// The JS function `(record) => cursor` that encodes the cursor after a
/// page's last record (its `_id`, [`encode_cursor`]), for js/promise.js
/// `listPage`. Made once per module instance.
fn cursor_fn() -> JsValue {
    thread_local! {
        static CURSOR_OF: JsValue = wasm_bindgen::closure::Closure::<dyn Fn(JsValue) -> JsValue>::new(
            |row: JsValue| {
                let id: JsString = crate::value::get(&row, &"_id".into())
                    .unwrap_or_default()
                    .unchecked_into();
                JsValue::from(encode_cursor(&value::units(&id)))
            },
        )
        .into_js_value();
    }
    CURSOR_OF.with(JsValue::clone)
}

#[wasm_bindgen::prelude::wasm_bindgen(module = "/js/promise.js")]
extern "C" {
    /// Up to `max` rows of the cursor `request` opened, walked in JS
    /// (js/promise.js `cursorRows`); rejects with `to_error(DOMException)`.
    #[wasm_bindgen(js_name = cursorRows)]
    pub(crate) fn cursor_rows(
        request: &web_sys::IdbRequest,
        max: u32,
        to_error: &JsValue,
    ) -> js_sys::Promise;
    /// The page `{records, next}` of the rows `rows` resolves with
    /// (js/promise.js `listPage`).
    #[wasm_bindgen(js_name = listPage)]
    fn list_page(rows: &js_sys::Promise, limit: u32, cursor_of: &JsValue) -> js_sys::Promise;
}

/// The JS value of an optional idb query (`undefined` = the whole store).
fn query_js(q: Option<Query>) -> JsValue {
    q.map_or(JsValue::UNDEFINED, JsValue::from)
}

/// The IndexedDB key range for a page; with a type, keys are `[type, id]`.
pub(super) fn key_range(r: &PageRange, record_type: Option<&JsString>) -> Result<Option<Query>> {
    let key = |b: &Bound| -> JsValue {
        let id: JsValue = value::from_units(&b.key).into();
        match record_type {
            None => id,
            Some(t) => Array::of2(t, &id).into(),
        }
    };
    // With a type, a missing bound still has to stay inside [type] … [type, []]:
    // arrays sort after every string, so [type, []] is above all [type, id].
    let (lower, lower_open) = match (&r.lower, record_type) {
        (Some(b), _) => (Some(key(b)), b.open),
        (None, Some(t)) => (Some(Array::of1(t).into()), false),
        (None, None) => (None, false),
    };
    let (upper, upper_open) = match (&r.upper, record_type) {
        (Some(b), _) => (Some(key(b)), b.open),
        (None, Some(t)) => (Some(Array::of2(t, &Array::new()).into()), true),
        (None, None) => (None, false),
    };
    let range = match (lower, upper) {
        (None, None) => return Ok(None),
        (Some(l), None) => KeyRange::lower_bound(&l, Some(lower_open))?,
        (None, Some(u)) => KeyRange::upper_bound(&u, Some(upper_open))?,
        (Some(l), Some(u)) => KeyRange::bound(&l, &u, Some(lower_open), Some(upper_open))?,
    };
    Ok(Some(Query::KeyRange(range)))
}
