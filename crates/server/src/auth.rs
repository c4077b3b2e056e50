//! Who is calling: the admin (one configured token) or an enrolled worker
//! (an access token). Both are compared in constant time; neither is logged.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{header, HeaderMap};

use crate::app::AppState;
use crate::error::ApiError;
use crate::tokens::{self, ct_eq};

/// An authenticated caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    /// Holder of the admin token.
    Admin,
    /// An enrolled worker (its id).
    Worker(i64),
}

impl Caller {
    /// The worker id, if a worker.
    pub fn worker_id(self) -> Option<i64> {
        match self {
            Caller::Admin => None,
            Caller::Worker(id) => Some(id),
        }
    }
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Authenticates from headers; `Ok(None)` when no `Authorization` header is present.
///
/// # Errors
/// `401` for a present but invalid credential.
pub async fn caller_from(
    state: &AppState,
    headers: &HeaderMap,
) -> Result<Option<Caller>, ApiError> {
    if headers.get(header::AUTHORIZATION).is_none() {
        return Ok(None);
    }
    let token = bearer(headers).ok_or_else(ApiError::unauthorized)?;
    if let Some(admin_hash) = &state.admin_hash {
        if ct_eq(admin_hash, &tokens::hash(token)) {
            return Ok(Some(Caller::Admin));
        }
    }
    let worker = state
        .store
        .authenticate(token)
        .await
        .map_err(|e| match e.code() {
            Some(_) => ApiError::unauthorized(),
            None => ApiError::from(e),
        })?;
    Ok(Some(Caller::Worker(worker)))
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Caller, ApiError> {
        caller_from(state, &parts.headers)
            .await?
            .ok_or_else(ApiError::unauthorized)
    }
}

/// A caller that must be the admin.
#[derive(Debug, Clone, Copy)]
pub struct Admin;

impl FromRequestParts<AppState> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Admin, ApiError> {
        match Caller::from_request_parts(parts, state).await? {
            Caller::Admin => Ok(Admin),
            Caller::Worker(_) => Err(ApiError::new(
                agentstore_protocol::ErrorCode::Forbidden,
                "this endpoint needs the admin token",
            )),
        }
    }
}
