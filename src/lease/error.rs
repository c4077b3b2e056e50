//! The lease client's error type and its mapping to JS `Error` objects.
//!
//! Like [`crate::StoreError`], every error crossing into JS is a real `Error`
//! whose `name`, `code` and `status` come from [`ErrorCode`]. A lost lease is a
//! `ClaimLostError` (`code "claim_lost"`, `status 409`) with `reason`
//! (`"claim_lost"`, `"expired_locally"` or `"released"`) and `itemId`. A
//! settle after the lease's own settle landed is an `AlreadySettledError`
//! (`code "already_settled"`, `status 409`) with `settledState` and `itemId`.

use agentstore_protocol::lease::{ItemState, SettleState};
use agentstore_protocol::ErrorCode;
use wasm_bindgen::JsValue;

use crate::error::set;

/// Why a lease stopped being ours; the `reason` of a `ClaimLostError`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LossReason {
    /// The server answered `claim_lost` (or `state_conflict`, `not_found`):
    /// another claim or path owns the item now.
    ClaimLost,
    /// No heartbeat succeeded before the local deadline (the server may be
    /// about to hand the item to someone else).
    ExpiredLocally,
    /// This client released the lease (`release()` or `pagehide`).
    Released,
}

impl LossReason {
    /// The `reason` string: `claim_lost`, `expired_locally` or `released`.
    pub const fn as_str(self) -> &'static str {
        match self {
            LossReason::ClaimLost => "claim_lost",
            LossReason::ExpiredLocally => "expired_locally",
            LossReason::Released => "released",
        }
    }
}

/// Everything a lease-client operation can fail with.
///
/// Messages are static text or the server's own message; numbers travel as
/// structured fields of the JS error (`itemId`, `retryAfterMs`, …), never
/// formatted into the text (no `core::fmt` on wasm paths).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum LeaseError {
    /// The lease is no longer ours; nothing was written under it.
    ClaimLost {
        /// The work item.
        item_id: i64,
        /// Why.
        reason: LossReason,
        /// Detail (the server's message, or what the client saw).
        message: String,
    },
    /// The token is current but the item left `running` by another path
    /// (an operator paused or cancelled it).
    StateConflict(String),
    /// A settle of a lease whose own earlier settle landed (its answer was
    /// lost) asked for something else: nothing was written by it; the lease
    /// is settled into `state`, by that first settle.
    AlreadySettled {
        /// The work item.
        item_id: i64,
        /// The state the settle that landed set.
        state: SettleState,
        /// The server's message.
        message: String,
    },
    /// The server refused the credentials (after one refresh attempt).
    Unauthorized(String),
    /// Claim polling too fast; retry after `retry_after_ms`.
    RateLimited {
        /// From the `Retry-After` header (ms).
        retry_after_ms: f64,
    },
    /// The server could not be reached, or did not answer in time.
    Network(String),
    /// Bad input to an SDK call.
    Validation(String),
    /// Any other `{code, message}` answer of the server.
    Server {
        /// The protocol code.
        code: ErrorCode,
        /// The HTTP status.
        status: u16,
        /// The server's message.
        message: String,
        /// The answer's `Retry-After` (ms), when it had one (a 503 from a
        /// gateway or a server shedding load): `work()` waits at least that
        /// long before it tries again (RFC 9110 §10.2.3).
        retry_after_ms: Option<f64>,
    },
    /// Cancelled through an AbortSignal; carries its reason.
    Aborted(JsValue),
    /// The client was closed (or dropped).
    Closed,
}

impl std::fmt::Display for LeaseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for LeaseError {}

impl LeaseError {
    /// The protocol code of this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            LeaseError::ClaimLost { .. } => ErrorCode::ClaimLost,
            LeaseError::StateConflict(_) => ErrorCode::StateConflict,
            LeaseError::AlreadySettled { .. } => ErrorCode::AlreadySettled,
            LeaseError::Unauthorized(_) => ErrorCode::Unauthorized,
            LeaseError::RateLimited { .. } => ErrorCode::RateLimited,
            LeaseError::Network(_) => ErrorCode::Network,
            LeaseError::Validation(_) => ErrorCode::Validation,
            LeaseError::Server { code, .. } => *code,
            LeaseError::Aborted(_) => ErrorCode::Aborted,
            LeaseError::Closed => ErrorCode::Closed,
        }
    }

    /// The error's message: static text, or the server's / caller's message.
    pub fn message(&self) -> &str {
        match self {
            LeaseError::ClaimLost { message, .. }
            | LeaseError::AlreadySettled { message, .. }
            | LeaseError::StateConflict(message)
            | LeaseError::Unauthorized(message)
            | LeaseError::Network(message)
            | LeaseError::Validation(message)
            | LeaseError::Server { message, .. } => message,
            LeaseError::RateLimited { .. } => "rate limited; retry after retryAfterMs",
            LeaseError::Aborted(_) => "the operation was aborted",
            LeaseError::Closed => "the lease client is closed",
        }
    }

    /// True for failures worth retrying later: no answer, a 5xx, rate
    /// limiting, or an answer without the lease server's error body at any
    /// status (a proxy's or CDN's page during a deploy: the call never
    /// reached the server, so it neither landed nor says anything about the
    /// lease; see [`LeaseError::is_foreign_refusal`]).
    pub fn is_transient(&self) -> bool {
        match self {
            LeaseError::Network(_) | LeaseError::RateLimited { .. } => true,
            LeaseError::Server { status, .. } if *status >= 500 => true,
            LeaseError::Server {
                code: ErrorCode::Network,
                ..
            } => true,
            _ => false,
        }
    }

    /// True for a refusal that sending the same request again cannot turn
    /// into an answer, so `work()` stops instead of retrying it: the
    /// credentials refused after a refresh, or none left (revoked, a spent
    /// enrollment token), a queue the worker may not claim from (the
    /// server's `forbidden`), a request the server finds invalid. Never an
    /// answer without the server's error body (a proxy's 401 or 403 page is
    /// a `network` error, retried).
    pub fn stops_work(&self) -> bool {
        matches!(
            self,
            LeaseError::Unauthorized(_)
                | LeaseError::Validation(_)
                | LeaseError::Server {
                    code: ErrorCode::Forbidden,
                    ..
                }
        )
    }

    /// True for a refusal (a 4xx, not a 429) whose answer did not carry the
    /// lease server's `{code, message}` body: something between this client
    /// and the server (a proxy's, a CDN's page) refused the call, which
    /// therefore did not land. It says nothing about the lease, whatever its
    /// status (a 404 is no `not_found`, a 409 no `claim_lost`, a 400 or 413
    /// no refusal of the call's content by the server). A `network` error
    /// with the answer's status (see `http::error_from`).
    pub fn is_foreign_refusal(&self) -> bool {
        matches!(
            self,
            LeaseError::Server {
                code: ErrorCode::Network,
                status: 400..=499,
                message,
                ..
            } if message == super::http::NO_ERROR_BODY
        )
    }

    /// True when the server said the token's lease is over (`claim_lost`,
    /// `state_conflict`, `not_found` in its error body): nothing is left to
    /// release, and its journal entry may go. Any other refusal (a 400, 405
    /// or 413 from a proxy or an older server, any answer without the
    /// server's error body, an unreadable answer) proves nothing by itself.
    pub fn proves_lease_over(&self) -> bool {
        self.is_servers_verdict() || matches!(self, LeaseError::ClaimLost { .. })
    }

    /// True when the lease server itself said what became of the lease:
    /// `claim_lost`, `state_conflict` or `not_found` in its error body, or
    /// `already_settled`. A loss seen locally (`expired_locally`,
    /// `released`), an answer without the server's error body (a `network`
    /// error whatever its status: such a code is never read from a status
    /// alone) or any other refusal is not.
    pub fn is_servers_verdict(&self) -> bool {
        matches!(
            self,
            LeaseError::Server {
                code: ErrorCode::ClaimLost | ErrorCode::NotFound,
                ..
            } | LeaseError::StateConflict(_)
                | LeaseError::AlreadySettled { .. }
        )
    }

    /// How long the answer asked to wait before trying again (ms): a 429's
    /// `Retry-After`, or another answer's when it had one.
    pub fn retry_after_ms(&self) -> Option<f64> {
        match self {
            LeaseError::RateLimited { retry_after_ms } => Some(*retry_after_ms),
            LeaseError::Server { retry_after_ms, .. } => *retry_after_ms,
            _ => None,
        }
    }

    /// The loss reason, for `ClaimLost`.
    pub fn loss_reason(&self) -> Option<LossReason> {
        match self {
            LeaseError::ClaimLost { reason, .. } => Some(*reason),
            _ => None,
        }
    }

    /// Builds the JS `Error` object for this error.
    pub fn to_js(&self) -> JsValue {
        let code = self.code();
        let err = js_sys::Error::new(self.message());
        err.set_name(code.js_name());
        let o: &JsValue = err.as_ref();
        set(o, "code", &code.as_str().into());
        let status = match self {
            LeaseError::Server { status, .. } => *status,
            _ => code.status(),
        };
        set(o, "status", &JsValue::from(status));
        match self {
            LeaseError::ClaimLost {
                item_id, reason, ..
            } => {
                set(o, "reason", &reason.as_str().into());
                set(o, "itemId", &JsValue::from(*item_id as f64));
            }
            LeaseError::AlreadySettled { item_id, state, .. } => {
                set(o, "settledState", &ItemState::from(*state).as_str().into());
                set(o, "itemId", &JsValue::from(*item_id as f64));
            }
            LeaseError::RateLimited { retry_after_ms }
            | LeaseError::Server {
                retry_after_ms: Some(retry_after_ms),
                ..
            } => set(o, "retryAfterMs", &JsValue::from(*retry_after_ms)),
            LeaseError::Aborted(reason) => set(o, "cause", reason),
            _ => {}
        }
        err.into()
    }
}

impl From<String> for LeaseError {
    /// A validation error with this message (option readers build these).
    fn from(message: String) -> Self {
        LeaseError::Validation(message)
    }
}

impl From<LeaseError> for JsValue {
    fn from(e: LeaseError) -> JsValue {
        e.to_js()
    }
}

/// Result alias for the lease client.
pub type Result<T> = std::result::Result<T, LeaseError>;
