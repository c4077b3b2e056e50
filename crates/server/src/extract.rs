//! Request extractors whose rejections are [`ApiError`]s, so every failure
//! (malformed JSON, oversized body, bad id) answers `{code, message}`.

use agentstore_protocol::ErrorCode;
use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, MatchedPath, Request};
use axum::http::request::Parts;
use axum::http::StatusCode;
use serde::de::DeserializeOwned;

use crate::error::ApiError;

/// A JSON body, parsed whatever its `Content-Type` (a `sendBeacon` string arrives
/// as `text/plain`). Too large → `413 payload_too_large`; not JSON → `400
/// bad_request`; JSON of the wrong shape → `400 validation`.
#[derive(Debug)]
pub struct JsonBody<T>(pub T);

impl<S, T> FromRequest<S> for JsonBody<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        RawBody::from_request(req, state)
            .await?
            .json()
            .map(JsonBody)
    }
}

/// The route's one path parameter (a queue name or an item id),
/// percent-decoded; bytes that are not UTF-8 become U+FFFD. Never refused
/// here: axum's `Path<String>` answered `400` for such a segment before the
/// handler checked the caller's role and scope, so an out-of-scope caller
/// learnt the name was bad instead of being refused (README "Roles and
/// scopes": the role and scope first, an invalid name is in no scope but
/// `"*"`). The handler's own check ([`queue_name`], [`item_id`]) refuses it
/// after the role and scope, as any other invalid name or id.
#[derive(Debug)]
pub struct Segment(pub String);

impl<S: Send + Sync> FromRequestParts<S> for Segment {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        // The segment where the route's template has its `{…}` (axum's
        // `RawPathParams` refuses one that is not UTF-8 once decoded, too).
        let template = parts
            .extensions
            .get::<MatchedPath>()
            .map_or("", |m| m.as_str());
        // Counted from the end: a nested router sees the path without the
        // prefix its template holds.
        let value = template
            .split('/')
            .rev()
            .position(|s| s.starts_with('{'))
            .and_then(|i| parts.uri.path().split('/').rev().nth(i))
            .unwrap_or("");
        Ok(Segment(
            percent_encoding::percent_decode_str(value)
                .decode_utf8_lossy()
                .into_owned(),
        ))
    }
}

/// A request body read whole but not yet parsed: a handler that must refuse
/// a caller its role does not allow (`403`) whatever the body is takes this,
/// checks the role, and only then calls [`RawBody::json`]. Too large → `413
/// payload_too_large`, before any role check (a declared `Content-Length`
/// over the limit before any of the body is read; the rest of such a body is
/// only read and discarded, after the answer, by [`crate::drain`]'s
/// lingering close); past the read deadline → `400 bad_request`. (An answer sent
/// before a body is read, by a handler or an extractor, reaches the client
/// all the same: [`crate::drain`] reads and discards the body first.)
#[derive(Debug)]
pub struct RawBody(Bytes);

impl RawBody {
    /// Parses the body as [`JsonBody`] does.
    ///
    /// # Errors
    /// As [`parse`].
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, ApiError> {
        parse(&self.0)
    }
}

impl<S> FromRequest<S> for RawBody
where
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let bounds = req.extensions().get::<BodyBounds>().copied();
        // A declared length over the limit is refused before the body is
        // polled: no `100 Continue` invites a body that would be refused
        // (RFC 9110 §10.1.1), and no wait for bytes that would only fail at
        // the limit or at the read deadline (a `400` then, not the `413`).
        let declared = req
            .headers()
            .get(axum::http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        if let (Some(b), Some(n)) = (bounds, declared) {
            if n > b.limit as u64 {
                return Err(too_large());
            }
        }
        let deadline = bounds.map(|b| b.deadline);
        let read = Bytes::from_request(req, state);
        let read = match deadline {
            // One deadline for the whole body: a client trickling a byte
            // now and then never holds the connection past it.
            Some(d) => tokio::time::timeout(d, read).await.map_err(|_| {
                ApiError::new(
                    ErrorCode::BadRequest,
                    "the request body did not arrive within --read-timeout-ms",
                )
            })?,
            None => read.await,
        };
        read.map(RawBody).map_err(|r| {
            if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
                too_large()
            } else {
                ApiError::new(ErrorCode::BadRequest, "could not read the request body")
            }
        })
    }
}

fn too_large() -> ApiError {
    ApiError::new(ErrorCode::PayloadTooLarge, "request body too large")
}

/// The bounds of a request body once its handler reads it, set on the API's
/// requests by the router.
#[derive(Debug, Clone, Copy)]
pub struct BodyBounds {
    /// How long the whole body may take to arrive (`--read-timeout-ms`):
    /// past it [`JsonBody`] answers `400 bad_request` and the connection is
    /// closed (the rest of the body is never read).
    pub deadline: std::time::Duration,
    /// `--max-body-bytes`: a `Content-Length` over it is answered `413
    /// payload_too_large` before any of the body is read (the limit itself
    /// is enforced on what arrives by `DefaultBodyLimit`).
    pub limit: usize,
}

/// Parses a JSON body with the error mapping of [`JsonBody`]. Every body is a
/// JSON object: serde would also fill a struct from an array of its fields in
/// order (`[{"job":1},3]` as `{payload, max_redeliveries}`), so anything else is
/// refused before it is decoded; unknown fields are refused by the wire types.
///
/// # Errors
/// `bad_request` for malformed JSON, `validation` for the wrong shape.
pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
    if first.is_some_and(|&b| b != b'{') {
        return Err(ApiError::new(
            ErrorCode::Validation,
            "the body must be a JSON object",
        ));
    }
    serde_json::from_slice(bytes).map_err(|e| {
        use serde_json::error::Category;
        match e.classify() {
            Category::Data => ApiError::new(ErrorCode::Validation, format!("invalid body: {e}")),
            _ => ApiError::new(ErrorCode::BadRequest, format!("malformed JSON: {e}")),
        }
    })
}

/// Parses an item id path segment.
///
/// # Errors
/// `bad_request` unless it is a positive integer.
pub fn item_id(raw: &str) -> Result<i64, ApiError> {
    raw.parse::<i64>()
        .map_err(|_| not_positive())
        .and_then(positive_item_id)
}

/// Checks an item id given as a number (an entry of a batched heartbeat), as
/// [`item_id`] checks a path segment.
///
/// # Errors
/// `bad_request` unless it is positive.
pub fn positive_item_id(id: i64) -> Result<i64, ApiError> {
    if id > 0 {
        Ok(id)
    } else {
        Err(not_positive())
    }
}

fn not_positive() -> ApiError {
    ApiError::new(ErrorCode::BadRequest, "item id must be a positive integer")
}

/// Parses a worker (or producer) id path segment.
///
/// # Errors
/// `bad_request` unless it is a positive integer.
pub fn worker_id(raw: &str) -> Result<i64, ApiError> {
    match raw.parse::<i64>() {
        Ok(id) if id > 0 => Ok(id),
        _ => Err(ApiError::new(
            ErrorCode::BadRequest,
            "worker id must be a positive integer",
        )),
    }
}

/// Checks a queue name ([`agentstore_protocol::lease::is_queue_name`]:
/// 1–200 characters of `A-Z a-z 0-9 _ - . :`, not `.` or `..`).
///
/// # Errors
/// `validation` otherwise.
pub fn queue_name(raw: &str) -> Result<&str, ApiError> {
    if agentstore_protocol::lease::is_queue_name(raw) {
        Ok(raw)
    } else {
        Err(ApiError::new(
            ErrorCode::Validation,
            agentstore_protocol::lease::QUEUE_NAME_RULE,
        ))
    }
}
