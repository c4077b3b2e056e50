//! The one list of error codes shared by the SDK's JS errors and the server's
//! `{code, message}` JSON bodies.

use serde::{Deserialize, Serialize};

use crate::lease::SettleState;

/// Every error code agentstore reports, in the SDK (as the JS `Error`'s `code`)
/// and on the wire (as the `code` of a `{code, message}` body).
///
/// `as_str()` gives the wire/JS code, `js_name()` the JS `Error.name`, and
/// `status()` the HTTP-like status carried by both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ErrorCode {
    /// A compare-and-swap failed: the given revision is not the current one.
    Conflict,
    /// Input the API does not accept (shape, type, limit); nothing was written.
    Validation,
    /// The record or item does not exist (or is a tombstone).
    NotFound,
    /// The browser's storage quota was exceeded; the transaction was rolled back.
    QuotaExceeded,
    /// An IndexedDB transaction failed or aborted for another reason.
    Transaction,
    /// Opening the database stayed blocked by another tab past the timeout.
    Blocked,
    /// The store was closed (by `close()` or a `versionchange` from another tab).
    Closed,
    /// The operation was cancelled through its `AbortSignal`.
    Aborted,
    /// The lease token is no longer the item's current claim; nothing was written.
    ClaimLost,
    /// The token is current but the item left `running` by another path.
    StateConflict,
    /// This lease's own settle landed before (its answer was lost) and a
    /// settle with other content came after it: nothing was written; the
    /// error names the state that first settle set.
    AlreadySettled,
    /// Missing, malformed, expired or wrong credentials.
    Unauthorized,
    /// Credentials are valid but not allowed to do this.
    Forbidden,
    /// Too many requests; retry after the `Retry-After` delay.
    RateLimited,
    /// The request body exceeds the server's limit.
    PayloadTooLarge,
    /// The request was malformed (bad JSON, bad path parameter).
    BadRequest,
    /// The endpoint exists but not with this HTTP method.
    MethodNotAllowed,
    /// The server could not be reached.
    Network,
    /// An unexpected failure; details are in the server log, not the response.
    Internal,
}

impl ErrorCode {
    /// All codes, for tables and exhaustive tests.
    pub const ALL: [ErrorCode; 19] = [
        ErrorCode::Conflict,
        ErrorCode::Validation,
        ErrorCode::NotFound,
        ErrorCode::QuotaExceeded,
        ErrorCode::Transaction,
        ErrorCode::Blocked,
        ErrorCode::Closed,
        ErrorCode::Aborted,
        ErrorCode::ClaimLost,
        ErrorCode::StateConflict,
        ErrorCode::AlreadySettled,
        ErrorCode::Unauthorized,
        ErrorCode::Forbidden,
        ErrorCode::RateLimited,
        ErrorCode::PayloadTooLarge,
        ErrorCode::BadRequest,
        ErrorCode::MethodNotAllowed,
        ErrorCode::Network,
        ErrorCode::Internal,
    ];

    /// The code string (`"conflict"`, `"claim_lost"`, …) used on the wire and in JS.
    pub const fn as_str(self) -> &'static str {
        match self {
            ErrorCode::Conflict => "conflict",
            ErrorCode::Validation => "validation",
            ErrorCode::NotFound => "not_found",
            ErrorCode::QuotaExceeded => "quota_exceeded",
            ErrorCode::Transaction => "transaction",
            ErrorCode::Blocked => "blocked",
            ErrorCode::Closed => "closed",
            ErrorCode::Aborted => "aborted",
            ErrorCode::ClaimLost => "claim_lost",
            ErrorCode::StateConflict => "state_conflict",
            ErrorCode::AlreadySettled => "already_settled",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::RateLimited => "rate_limited",
            ErrorCode::PayloadTooLarge => "payload_too_large",
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::MethodNotAllowed => "method_not_allowed",
            ErrorCode::Network => "network",
            ErrorCode::Internal => "internal",
        }
    }

    /// The JS `Error.name` for this code. `Aborted` uses the platform's
    /// `"AbortError"` so `signal.reason`-style checks keep working.
    pub const fn js_name(self) -> &'static str {
        match self {
            ErrorCode::Conflict => "ConflictError",
            ErrorCode::Validation => "ValidationError",
            ErrorCode::NotFound => "NotFoundError",
            ErrorCode::QuotaExceeded => "QuotaExceededError",
            ErrorCode::Transaction => "TransactionError",
            ErrorCode::Blocked => "BlockedError",
            ErrorCode::Closed => "ClosedError",
            ErrorCode::Aborted => "AbortError",
            ErrorCode::ClaimLost => "ClaimLostError",
            ErrorCode::StateConflict => "StateConflictError",
            ErrorCode::AlreadySettled => "AlreadySettledError",
            ErrorCode::Unauthorized => "UnauthorizedError",
            ErrorCode::Forbidden => "ForbiddenError",
            ErrorCode::RateLimited => "RateLimitedError",
            ErrorCode::PayloadTooLarge => "PayloadTooLargeError",
            ErrorCode::BadRequest => "BadRequestError",
            ErrorCode::MethodNotAllowed => "MethodNotAllowedError",
            ErrorCode::Network => "NetworkError",
            ErrorCode::Internal => "InternalError",
        }
    }

    /// The HTTP status the server answers with, and the `status` field of the JS error.
    pub const fn status(self) -> u16 {
        match self {
            ErrorCode::Conflict
            | ErrorCode::ClaimLost
            | ErrorCode::StateConflict
            | ErrorCode::AlreadySettled => 409,
            ErrorCode::Validation | ErrorCode::BadRequest => 400,
            ErrorCode::NotFound => 404,
            ErrorCode::QuotaExceeded => 507,
            ErrorCode::Blocked => 423,
            ErrorCode::Closed => 410,
            ErrorCode::Aborted => 499,
            ErrorCode::Unauthorized => 401,
            ErrorCode::Forbidden => 403,
            ErrorCode::RateLimited => 429,
            ErrorCode::PayloadTooLarge => 413,
            ErrorCode::MethodNotAllowed => 405,
            ErrorCode::Network => 503,
            ErrorCode::Transaction | ErrorCode::Internal => 500,
        }
    }

    /// Parses a code string; `None` for unknown codes.
    pub fn parse(s: &str) -> Option<ErrorCode> {
        ErrorCode::ALL.into_iter().find(|c| c.as_str() == s)
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The JSON error body the server sends and the SDK parses: `{code,
/// message}`, and for `already_settled` also `settled`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// One of [`ErrorCode`]'s strings.
    pub code: ErrorCode,
    /// Human-readable; never contains tokens or internal details.
    pub message: String,
    /// `already_settled`: the state this lease's settle that landed set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settled: Option<SettleState>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_round_trips_through_its_string_and_serde() {
        for code in ErrorCode::ALL {
            assert_eq!(ErrorCode::parse(code.as_str()), Some(code));
            let json = serde_json::to_string(&code).unwrap();
            assert_eq!(json, format!("\"{}\"", code.as_str()));
            assert!(code.js_name().ends_with("Error"));
        }
    }

    #[test]
    fn js_names_and_codes_are_unique() {
        let mut names: Vec<_> = ErrorCode::ALL.iter().map(|c| c.js_name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), ErrorCode::ALL.len());
    }
}
