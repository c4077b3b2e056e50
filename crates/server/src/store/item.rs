//! A work item as the server stores and answers it.
//!
//! The payload and result stay the JSON text they were stored as, from the
//! request body to the database and back into every answer: never parsed into
//! a `serde_json::Value`, which costs about 32 bytes per JSON value (a 64 KiB
//! payload of `[0,0,…]` becomes about 1 MiB), and never re-serialised (what a
//! producer enqueued is what a worker receives, byte for byte). An [`Item`] is
//! the protocol's `ItemView` over that text, and a [`Claimed`] its
//! `ClaimResponse`.

use agentstore_protocol::lease::{
    ClaimResponse, ItemList, ItemState, ItemView, LeaseItem, RetryBackoff, SettleState,
};
use agentstore_protocol::ErrorCode;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;
use serde_json::Value;
use sqlx::any::AnyRow;

use super::{get, to_u32, to_u64, StoreError};

/// The columns [`item_from_row`] reads.
pub(super) const ITEM_COLS: &str =
    "id, queue, state, payload, result, attempts, max_redeliveries, \
     epoch, last_error, worker_id, retry_backoff_base_ms, retry_backoff_max_ms";

/// An SQL condition (dialect placeholders unfilled: see `Backend::sql`) true
/// for an item a claim may take now, as far as its redelivery backoff goes:
/// no `available_at`, or one that has come on the database clock.
pub(super) const AVAILABLE_NOW: &str = "(available_at IS NULL OR available_at <= {now})";

/// An extra column (placeholders unfilled) for the statements that answer
/// an item with its `available_in_ms` ([`item_from_row`] reads it when the
/// row has it): the ms until an open item backing off may be claimed,
/// NULL when it may be now.
pub(super) const AVAILABLE_IN: &str = "CASE WHEN state = 'open' AND available_at > {now} \
     THEN available_at - {now} END AS available_in_ms";

/// The item's redelivery backoff from its row's `retry_backoff_base_ms`
/// and `retry_backoff_max_ms`: `None` when it has none, or when they do not
/// make one (only checked backoffs are stored; a row edited by hand is read
/// as having none rather than refused).
pub(super) fn backoff_from_row(row: &AnyRow) -> Option<RetryBackoff> {
    let base = get::<Option<i64>>(row, "retry_backoff_base_ms").ok()??;
    let max = get::<Option<i64>>(row, "retry_backoff_max_ms").ok()??;
    RetryBackoff {
        base: u64::try_from(base).ok()?,
        max: u64::try_from(max).ok()?,
    }
    .check()
    .ok()
}

/// The delay (ms) before an item that an ended delivery left in `state`
/// with `attempts` may be claimed again: a draw of its `backoff` when it
/// reopened with one, else `None` (claimable at once; `available_at` is
/// stored NULL).
pub(super) fn redelivery_delay(
    backoff: Option<RetryBackoff>,
    state: ItemState,
    attempts: u32,
) -> Option<i64> {
    let backoff = backoff.filter(|_| state == ItemState::Open)?;
    i64::try_from(backoff.delay_ms(attempts, rand::random::<f64>())).ok()
}

/// [`ITEM_COLS`] qualified with the table alias `i` (for statements that join),
/// derived once.
pub(super) fn qualified_item_cols() -> &'static str {
    static COLS: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        ITEM_COLS
            .split(", ")
            .map(|c| format!("i.{c} AS {c}"))
            .collect::<Vec<_>>()
            .join(", ")
    });
    &COLS
}

/// One JSON value as text, checked to be JSON once when it is made and
/// written into answers as it is.
#[derive(Debug, Clone)]
pub struct RawJson(Box<RawValue>);

impl RawJson {
    /// Takes `text` if it is one JSON value (whitespace around it is dropped).
    ///
    /// # Errors
    /// `text` is not JSON.
    pub fn from_text(text: String) -> Result<RawJson, serde_json::Error> {
        RawValue::from_string(text).map(RawJson)
    }

    /// The JSON text.
    pub fn get(&self) -> &str {
        self.0.get()
    }

    /// The value parsed (tests and rare comparisons; answers never need it).
    ///
    /// # Errors
    /// The text is JSON a `Value` cannot hold (a number beyond `f64`, nesting
    /// deeper than 128).
    pub fn to_value(&self) -> Result<Value, serde_json::Error> {
        serde_json::from_str(self.get())
    }
}

/// Equal texts (what was stored is compared, not what it means).
impl PartialEq for RawJson {
    fn eq(&self, other: &RawJson) -> bool {
        self.get() == other.get()
    }
}

/// Equal values, whatever the spelling (for tests: `item.payload == json!(…)`).
impl PartialEq<Value> for RawJson {
    fn eq(&self, other: &Value) -> bool {
        self.to_value().is_ok_and(|v| &v == other)
    }
}

impl Serialize for RawJson {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl<'de> Deserialize<'de> for RawJson {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<RawJson, D::Error> {
        Box::<RawValue>::deserialize(d).map(RawJson)
    }
}

/// A work item: the protocol's [`ItemView`] with the payload and the result
/// held as their JSON text (see the module docs).
pub type Item = ItemView<RawJson>;

/// A claim or resume: the item and its new lease (the protocol's
/// [`ClaimResponse`], the item held as [`Item`]).
pub type Claimed = ClaimResponse<RawJson>;

/// One page of a queue's items (`GET /v1/queues/{queue}/items`): the
/// protocol's [`ItemList`] over [`Item`].
pub type ItemPage = ItemList<RawJson>;

/// The answer of a call that ends or stops a lease (a settle or a release,
/// or the same call sent again; a pause): the item as the call left it, or,
/// when its row does not decode, only what the call decided (see
/// `unreadable`). Serialised as the item, or as `{id, state, unreadable_row:
/// true}`.
#[derive(Debug, Clone)]
pub enum Ended {
    /// The item as it is now.
    Item(Item),
    /// The item's row does not decode (a payload or result that is not
    /// JSON, a counter out of range); the call was applied all the same.
    Unreadable {
        /// The item.
        id: i64,
        /// The state the call left it in (`None`: a replay found a state
        /// it does not know).
        state: Option<ItemState>,
    },
}

impl Serialize for Ended {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Ended::Item(item) => item.serialize(s),
            Ended::Unreadable { id, state } => serialize_unreadable(s, *id, *state),
        }
    }
}

/// What a release did (see `Store::release_reporting`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Released {
    /// The lease was released now.
    Now,
    /// The same lease released it before (a release sent again): nothing
    /// changed.
    Again,
    /// The same lease SETTLED it before, to this state (its settle landed
    /// and the answer was lost): nothing was released, nothing changed.
    BySettle(ItemState),
}

/// `{id, state, unreadable_row: true}` (`state` left out when `None`).
fn serialize_unreadable<S: Serializer>(
    s: S,
    id: i64,
    state: Option<ItemState>,
) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    let mut m = s.serialize_map(None)?;
    m.serialize_entry("id", &id)?;
    if let Some(state) = state {
        m.serialize_entry("state", &state)?;
    }
    m.serialize_entry("unreadable_row", &true)?;
    m.end()
}

impl Ended {
    /// The item's id.
    pub fn id(&self) -> i64 {
        match self {
            Ended::Item(item) => item.id,
            Ended::Unreadable { id, .. } => *id,
        }
    }

    /// The item, when its row decoded.
    ///
    /// # Errors
    /// [`StoreError::Corrupt`] for [`Ended::Unreadable`]: the call WAS
    /// applied; only the item cannot be read.
    pub fn into_item(self) -> Result<Item, StoreError> {
        match self {
            Ended::Item(item) => Ok(item),
            Ended::Unreadable { id, .. } => Err(StoreError::Corrupt(format!(
                "item {id}: applied, but its row cannot be read"
            ))),
        }
    }
}

/// What `GET /v1/items/{id}` reads: the item, or, when its row does not
/// decode (see `unreadable`), the columns a reader's permission and the
/// answer need, read one by one so that one bad column does not hide the
/// rest. Serialised as the item, or as `{id, state, unreadable_row: true}`
/// (`state` left out when it is not one this server knows).
#[derive(Debug, Clone)]
pub enum Viewed {
    /// The item as it is now.
    Item(Item),
    /// The item's row does not decode (a payload or result that is not
    /// JSON, a counter out of range, an unknown state).
    Unreadable {
        /// The item.
        id: i64,
        /// Its state, when that column decodes.
        state: Option<ItemState>,
        /// Its queue, when that column decodes (a producer may read only
        /// items of its queues).
        queue: Option<String>,
        /// The worker holding its claim, when that column decodes and is
        /// set (a worker may read only the item it holds).
        worker_id: Option<i64>,
    },
}

impl Serialize for Viewed {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Viewed::Item(item) => item.serialize(s),
            Viewed::Unreadable { id, state, .. } => serialize_unreadable(s, *id, *state),
        }
    }
}

impl Viewed {
    /// The item's queue and the worker holding its claim, as far as they
    /// decode (what `Caller::read` decides on).
    pub fn owners(&self) -> (Option<&str>, Option<i64>) {
        match self {
            Viewed::Item(item) => (Some(item.queue.as_str()), item.worker_id),
            Viewed::Unreadable {
                queue, worker_id, ..
            } => (queue.as_deref(), *worker_id),
        }
    }
}

/// The answer of a resume: the item and its new lease, or, when the row it
/// resumed does not decode, only that the item was failed instead (see
/// `unreadable`): no lease is handed out for an item nobody can read.
/// Serialised as the claim (`{item, lease}`), as `{id, state,
/// unreadable_row: true}`, or, for a resume sent again, as `{id, state,
/// epoch, replayed: true}`.
#[derive(Debug, Clone)]
pub enum Resumed {
    /// The item, running under the new lease.
    Claimed(Claimed),
    /// The resumed row does not decode; it was failed with reason
    /// [`UNREADABLE_REASON`](super::UNREADABLE_REASON) and its new token
    /// fenced.
    Unreadable {
        /// The item.
        id: i64,
        /// `failed`, or `None` when the row left the new lease before it
        /// could be failed (an operator's pause meanwhile).
        state: Option<ItemState>,
    },
    /// The item was no longer paused because a resume had already
    /// resumed it (a resume sent again after its answer was lost, or two
    /// operators resuming at once) and no claim has taken it since: nothing
    /// was changed and no lease is handed out (its token is stored hashed
    /// only; the first answer carried it).
    Again {
        /// The item.
        id: i64,
        /// Its state now (`running` under that resume's lease, or where
        /// that lease went since: settled, released, taken over).
        state: ItemState,
        /// The epoch that resume gave it.
        epoch: i64,
    },
}

impl Serialize for Resumed {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Resumed::Claimed(claimed) => claimed.serialize(s),
            Resumed::Unreadable { id, state } => serialize_unreadable(s, *id, *state),
            Resumed::Again { id, state, epoch } => {
                use serde::ser::SerializeMap;
                let mut m = s.serialize_map(Some(4))?;
                m.serialize_entry("id", id)?;
                m.serialize_entry("state", state)?;
                m.serialize_entry("epoch", epoch)?;
                m.serialize_entry("replayed", &true)?;
                m.end()
            }
        }
    }
}

impl Resumed {
    /// The item and its lease, when its row decoded.
    ///
    /// # Errors
    /// [`StoreError::Corrupt`] for [`Resumed::Unreadable`]: the item WAS
    /// changed (failed), and no lease was handed out.
    pub fn into_claimed(self) -> Result<Claimed, StoreError> {
        match self {
            Resumed::Claimed(claimed) => Ok(claimed),
            Resumed::Unreadable { id, .. } => Err(StoreError::Corrupt(format!(
                "item {id}: its row cannot be read, so it was failed instead of resumed"
            ))),
            Resumed::Again { id, state, epoch } => Err(StoreError::rejected(
                ErrorCode::Conflict,
                format!(
                    "item {id} was resumed already (epoch {epoch}), it is {}",
                    state.as_str()
                ),
            )),
        }
    }
}

/// Decodes an [`ITEM_COLS`] row.
pub(super) fn item_from_row(row: &AnyRow) -> Result<Item, StoreError> {
    let state: String = get(row, "state")?;
    let json = |col: &str, text: String| {
        RawJson::from_text(text).map_err(|e| StoreError::Corrupt(format!("{col}: {e}")))
    };
    Ok(Item {
        id: {
            let id = get(row, "id")?;
            to_u64(id, "id")?;
            id
        },
        queue: get(row, "queue")?,
        state: ItemState::parse(&state)
            .ok_or_else(|| StoreError::Corrupt(format!("state {state:?}")))?,
        payload: json("payload", get(row, "payload")?)?,
        result: get::<Option<String>>(row, "result")?
            .map(|r| json("result", r))
            .transpose()?,
        attempts: to_u32(get(row, "attempts")?, "attempts")?,
        max_redeliveries: to_u32(get(row, "max_redeliveries")?, "max_redeliveries")?,
        epoch: to_u64(get(row, "epoch")?, "epoch")?,
        last_error: get(row, "last_error")?,
        worker_id: get(row, "worker_id")?,
        retry_backoff_ms: backoff_from_row(row),
        // Only statements that read the clock for it have the column.
        available_in_ms: get::<Option<i64>>(row, "available_in_ms")
            .ok()
            .flatten()
            .and_then(|v| u64::try_from(v).ok())
            .filter(|&v| v > 0),
    })
}

/// Decodes the lease columns of a row (state, epoch, attempts,
/// max_redeliveries, heartbeat_at, token_hash).
pub(super) fn lease_item_from_row(row: &AnyRow) -> Result<LeaseItem, StoreError> {
    let state: String = get(row, "state")?;
    let token: Option<String> = get(row, "token_hash")?;
    Ok(LeaseItem {
        state: ItemState::parse(&state)
            .ok_or_else(|| StoreError::Corrupt(format!("state {state:?}")))?,
        epoch: to_u64(get(row, "epoch")?, "epoch")?,
        attempts: to_u32(get(row, "attempts")?, "attempts")?,
        max_redeliveries: to_u32(get(row, "max_redeliveries")?, "max_redeliveries")?,
        heartbeat_at_ms: get(row, "heartbeat_at")?,
        has_token: token.is_some(),
    })
}

/// Whether two stored JSON texts hold the same value: the same text, or
/// texts that parse to equal values (a settle sent again with its result
/// serialised another way is the same settle).
pub(super) fn same_json(a: &str, b: &str) -> bool {
    a == b
        || matches!(
            (serde_json::from_str::<Value>(a), serde_json::from_str::<Value>(b)),
            (Ok(x), Ok(y)) if x == y
        )
}

/// The state the item's last settle set, from a row with its `state` and
/// `settled_state` columns (for a lease whose own settle landed and whose
/// answer was lost). A settle made before migration 16 did not record its
/// state: the item's stands in while it is one only a settle sets, else
/// `paused` (only a pause moves on: resumed, then claimed or failed).
pub(super) fn landed_state(row: &AnyRow) -> Result<SettleState, StoreError> {
    let recorded: Option<String> = get(row, "settled_state")?;
    let now: String = get(row, "state")?;
    Ok(recorded
        .as_deref()
        .and_then(SettleState::parse)
        .or_else(|| SettleState::parse(&now))
        .unwrap_or(SettleState::Paused))
}
