//! The one error type every handler returns, and its `{code, message}` response.

use agentstore_protocol::lease::{ItemState, SettleState};
use agentstore_protocol::{ErrorBody, ErrorCode};
use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::store::{StoreError, Unavailable};

/// `Retry-After` (s) of a `503` for a database that is unavailable.
pub const UNAVAILABLE_RETRY_AFTER_S: u64 = 1;

/// An error answered as `{code, message}` with the code's HTTP status.
#[derive(Debug)]
pub struct ApiError {
    /// The protocol code; decides the status.
    pub code: ErrorCode,
    /// Shown to the client: never a token or an internal detail.
    pub message: String,
    /// Seconds for `Retry-After` (rate limiting).
    pub retry_after_s: Option<u64>,
    /// A refusal of the store's lease fence (a token, state or holder the
    /// item does not have), not of the caller's credentials or role: the
    /// metrics count its `403` apart from `agentstore_auth_rejected_total`.
    pub fenced: bool,
    /// `already_settled`: the state the lease's own settle that landed set
    /// (the body's `settled`).
    pub settled: Option<SettleState>,
    /// The database could not serve the request for the moment (see
    /// [`StoreError::unavailable`]): answered `503` (code `internal`) with
    /// `Retry-After`, not `500`.
    pub unavailable: bool,
}

/// Response extension marking an [`ApiError`] with `fenced` set.
#[derive(Debug, Clone, Copy)]
pub struct Fenced;

impl ApiError {
    /// An error with `code` and a client-safe `message`.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> ApiError {
        ApiError {
            code,
            message: message.into(),
            retry_after_s: None,
            fenced: false,
            settled: None,
            unavailable: false,
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
            StoreError::Rejected { code, message } => ApiError {
                fenced: true,
                ..ApiError::new(code, message)
            },
            StoreError::AlreadySettled { id, state } => ApiError {
                fenced: true,
                settled: Some(state),
                ..ApiError::new(
                    ErrorCode::AlreadySettled,
                    format!(
                        "item {id}: this lease's settle into {} landed before; nothing was written",
                        ItemState::from(state).as_str()
                    ),
                )
            },
            other if other.unavailable().is_some() => {
                let not_applied = other.unavailable() == Some(Unavailable::NotApplied);
                tracing::warn!(error = %other, not_applied, "database unavailable");
                ApiError {
                    unavailable: true,
                    retry_after_s: Some(UNAVAILABLE_RETRY_AFTER_S),
                    ..ApiError::new(
                        ErrorCode::Internal,
                        if not_applied {
                            "the database is busy or unavailable: retry"
                        } else {
                            "the connection to the database was lost: the request may or may not have been applied; retry it"
                        },
                    )
                }
            }
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
        let status = if self.unavailable {
            StatusCode::SERVICE_UNAVAILABLE
        } else {
            StatusCode::from_u16(self.code.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
        };
        let body = ErrorBody {
            code: self.code,
            message: self.message,
            settled: self.settled,
        };
        let mut resp = (status, Json(body)).into_response();
        // For the metrics middleware, which counts answers by code.
        resp.extensions_mut().insert(self.code);
        if self.fenced {
            resp.extensions_mut().insert(Fenced);
        }
        if status == StatusCode::UNAUTHORIZED {
            // Every 401 carries a challenge (RFC 9110 §15.5.2), in the form
            // of RFC 6750 §3 (a browser shows no login dialog for `Bearer`).
            resp.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"agentstore\""),
            );
        }
        if let Some(secs) = self.retry_after_s {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }
}

/// Middleware for the API: answers under `/v1` that the framework makes itself
/// (`405` for a known path with another method, a path or query string the
/// extractors cannot decode, `/v1/` itself, …) get the same `{code, message}`
/// body as every handler error, keeping their status and headers (`Allow`,
/// `Retry-After`). Other paths (static files) are left alone.
pub async fn json_errors(req: Request, next: Next) -> Response {
    let path = req.uri().path();
    let api = path == "/v1" || path.starts_with("/v1/");
    let resp = next.run(req).await;
    if api {
        as_json_error(resp)
    } else {
        resp
    }
}

fn as_json_error(resp: Response) -> Response {
    let status = resp.status();
    let is_error = status.is_client_error() || status.is_server_error();
    let is_json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !is_error || is_json {
        return resp;
    }
    let code = match status {
        StatusCode::UNAUTHORIZED => ErrorCode::Unauthorized,
        StatusCode::FORBIDDEN => ErrorCode::Forbidden,
        StatusCode::NOT_FOUND => ErrorCode::NotFound,
        StatusCode::METHOD_NOT_ALLOWED => ErrorCode::MethodNotAllowed,
        StatusCode::PAYLOAD_TOO_LARGE => ErrorCode::PayloadTooLarge,
        StatusCode::TOO_MANY_REQUESTS => ErrorCode::RateLimited,
        s if s.is_client_error() => ErrorCode::BadRequest,
        _ => ErrorCode::Internal,
    };
    let message = match code {
        ErrorCode::MethodNotAllowed => "this endpoint does not accept this method",
        ErrorCode::Internal => "internal error",
        _ => status.canonical_reason().unwrap_or("request refused"),
    };
    let (mut parts, _) = resp.into_parts();
    let body = ApiError::new(code, message).into_response();
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Response::from_parts(parts, body.into_body())
}
