//! Request bodies whose JSON the server stores without reading it: the
//! protocol's `EnqueueRequest` and `SettleRequest`, field for field, with the
//! payload and result kept as the JSON text the client sent (see
//! [`store::Item`](crate::store::Item) for why).

use agentstore_protocol::lease::{RetryBackoff, SettleState};
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

/// A JSON value kept as written, refused (a `400 validation`) when it is
/// JSON a `serde_json::Value` cannot hold: nesting deeper than 127 (the
/// body's own object is the 128th level serde_json allows), a number
/// beyond `f64` (`1e400`, which a browser reads as `Infinity`), a `\u`
/// escape of a lone surrogate. Every client parses it back, and a settle's
/// resend is compared with what was stored by value (`same_json`): a value
/// that does not parse could be neither handed out faithfully nor replayed.
#[derive(Debug)]
pub struct CheckedJson(Box<RawValue>);

impl std::ops::Deref for CheckedJson {
    type Target = RawValue;
    fn deref(&self) -> &RawValue {
        &self.0
    }
}

impl<'de> Deserialize<'de> for CheckedJson {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<CheckedJson, D::Error> {
        let raw = Box::<RawValue>::deserialize(d)?;
        serde_json::from_str::<serde_json::Value>(raw.get()).map_err(serde::de::Error::custom)?;
        Ok(CheckedJson(raw))
    }
}

/// `POST /v1/queues/{queue}/items` body (`EnqueueRequest`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnqueueBody {
    /// Any JSON value; stored and handed to the worker as written.
    pub payload: CheckedJson,
    /// Re-deliveries allowed after the first delivery.
    #[serde(default)]
    pub max_redeliveries: Option<u32>,
    /// The same cap as total deliveries (`max_redeliveries` + 1); not with
    /// `max_redeliveries` (see `agentstore_protocol::lease::retry_cap`).
    #[serde(default)]
    pub max_attempts: Option<u32>,
    /// Redelivery backoff (see `agentstore_protocol::lease::RetryBackoff`).
    #[serde(default)]
    pub retry_backoff_ms: Option<RetryBackoff>,
}

/// `POST /v1/items/{id}/settle` body (`SettleRequest`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SettleBody {
    /// The lease token from the claim.
    pub token: String,
    /// The state to settle into.
    pub state: SettleState,
    /// Optional result, stored as written (`null` = none).
    #[serde(default)]
    pub result: Option<CheckedJson>,
    /// Optional message stored as `last_error`.
    #[serde(default)]
    pub error: Option<String>,
}
