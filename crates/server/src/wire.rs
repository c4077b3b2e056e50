//! Request bodies whose JSON the server stores without reading it: the
//! protocol's `EnqueueRequest` and `SettleRequest`, field for field, with the
//! payload and result kept as the JSON text the client sent (see
//! [`store::Item`](crate::store::Item) for why).

use agentstore_protocol::lease::SettleState;
use serde::Deserialize;
use serde_json::value::RawValue;

/// `POST /v1/queues/{queue}/items` body (`EnqueueRequest`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnqueueBody {
    /// Any JSON value; stored and handed to the worker as written.
    pub payload: Box<RawValue>,
    /// Re-deliveries allowed after the first delivery.
    #[serde(default)]
    pub max_redeliveries: Option<u32>,
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
    pub result: Option<Box<RawValue>>,
    /// Optional message stored as `last_error`.
    #[serde(default)]
    pub error: Option<String>,
}
