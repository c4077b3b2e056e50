//! The one error type every handler returns, and its `{code, message}` response.

use agentstore_protocol::{ErrorBody, ErrorCode};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::store::StoreError;

/// An error answered as `{code, message}` with the code's HTTP status.
#[derive(Debug)]
pub struct ApiError {
    /// The protocol code; decides the status.
    pub code: ErrorCode,
    /// Shown to the client: never a token or an internal detail.
    pub message: String,
    /// Seconds for `Retry-After` (rate limiting).
    pub retry_after_s: Option<u64>,
}

impl ApiError {
    /// An error with `code` and a client-safe `message`.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> ApiError {
        ApiError {
            code,
            message: message.into(),
            retry_after_s: None,
        }
    }

    /// `401 unauthorized`.
    pub fn unauthorized() -> ApiError {
        ApiError::new(ErrorCode::Unauthorized, "missing or invalid credentials")
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> ApiError {
        match e {
            StoreError::Rejected { code, message } => ApiError::new(code, message),
            other => {
                // Details stay in the log; the client learns only that it failed.
                tracing::error!(error = %other, "store failure");
                ApiError::new(ErrorCode::Internal, "internal error")
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status =
            StatusCode::from_u16(self.code.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = ErrorBody {
            code: self.code,
            message: self.message,
        };
        let mut resp = (status, Json(body)).into_response();
        // For the metrics middleware, which counts answers by code.
        resp.extensions_mut().insert(self.code);
        if let Some(secs) = self.retry_after_s {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }
}
