//! Who is calling and what it may do.
//!
//! Three kinds of caller (README "Roles and scopes"):
//! - the **admin**: the one token the server is started with; every endpoint,
//!   every queue (creates enrollment tokens, pauses, resumes);
//! - a **producer**: enqueues into, lists and reads the items of the queues its
//!   enrollment token named;
//! - a **worker**: claims from the queues its enrollment token named, and
//!   heartbeats, settles, releases and reads only the items it holds.
//!
//! Credentials are compared in constant time and never logged. Every refusal is
//! `403 forbidden` decided before anything is written and before the request
//! body is parsed (handlers that need a role take it as
//! [`crate::extract::RawBody`]). A `401` or `403` answered by an extractor,
//! before the body is read, reaches a client that sent one all the same:
//! [`crate::drain`] reads and discards the body before the answer goes out.

use agentstore_protocol::lease::{queue_in_scope, Role, ANY_QUEUE};
use agentstore_protocol::ErrorCode;
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{header, HeaderMap};

use crate::error::ApiError;
use crate::state::AppState;
use crate::store::Principal;
use crate::tokens::{self, ct_eq};

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// Holder of the admin token.
    Admin,
    /// An enrolled producer or worker.
    Enrolled(Principal),
}

fn forbidden(message: &str) -> ApiError {
    ApiError::new(ErrorCode::Forbidden, message)
}

impl Caller {
    fn scoped(&self, role: Role, queue: &str) -> bool {
        match self {
            Caller::Admin => true,
            Caller::Enrolled(p) => p.role == role && queue_in_scope(&p.queues, queue),
        }
    }

    /// May enqueue into and list `queue`: the admin (`Ok(None)`), or a
    /// producer scoped to it (`Ok(Some(producer id))`, its `workers.id`:
    /// whose an enqueue's `Idempotency-Key` is, see
    /// [`crate::Store::enqueue_once`]).
    ///
    /// # Errors
    /// `403 forbidden` otherwise.
    pub fn produce(&self, queue: &str) -> Result<Option<i64>, ApiError> {
        if self.scoped(Role::Producer, queue) {
            Ok(self.worker_id())
        } else {
            Err(forbidden(
                "this credential may not enqueue into or list this queue",
            ))
        }
    }

    /// May claim from `queue`: the admin (`Ok(None)`), or a worker scoped to it
    /// (`Ok(Some(worker id))`, recorded as the lease holder).
    ///
    /// # Errors
    /// `403 forbidden` otherwise.
    pub fn claim(&self, queue: &str) -> Result<Option<i64>, ApiError> {
        if !self.scoped(Role::Worker, queue) {
            return Err(forbidden("this credential may not claim from this queue"));
        }
        Ok(self.worker_id())
    }

    /// The lease holder a fenced call (heartbeat, settle, release) must match:
    /// `None` for the admin (the lease token alone decides), the worker's id for
    /// a worker.
    ///
    /// # Errors
    /// `403 forbidden` for a producer.
    pub fn lease_owner(&self) -> Result<Option<i64>, ApiError> {
        match self {
            Caller::Admin => Ok(None),
            Caller::Enrolled(p) if p.role == Role::Worker => Ok(Some(p.worker_id)),
            Caller::Enrolled(_) => Err(forbidden("producers do not hold leases")),
        }
    }

    /// May read every item, of any queue, held or not: the admin, and a
    /// producer scoped to every queue (`"*"`). Only such a caller is told
    /// that an item does not exist (`routes::item`).
    pub fn reads_every_item(&self) -> bool {
        match self {
            Caller::Admin => true,
            Caller::Enrolled(p) => {
                p.role == Role::Producer && p.queues.iter().any(|q| q == ANY_QUEUE)
            }
        }
    }

    /// May read an item of `queue` whose claim `holder` holds (each `None`
    /// when not known: the column does not decode, or no claim): the admin;
    /// a producer scoped to its queue; the worker holding its current claim.
    ///
    /// # Errors
    /// `403 forbidden` otherwise.
    pub fn read(&self, queue: Option<&str>, holder: Option<i64>) -> Result<(), ApiError> {
        let allowed = match self {
            Caller::Admin => true,
            Caller::Enrolled(p) => match p.role {
                // A producer of every queue reads an item whose queue
                // column does not decode too (as `reads_every_item` says).
                Role::Producer => {
                    self.reads_every_item() || queue.is_some_and(|q| queue_in_scope(&p.queues, q))
                }
                Role::Worker => holder == Some(p.worker_id),
            },
        };
        if allowed {
            Ok(())
        } else {
            Err(forbidden("this credential may not read this item"))
        }
    }

    fn worker_id(&self) -> Option<i64> {
        match self {
            Caller::Admin => None,
            Caller::Enrolled(p) => Some(p.worker_id),
        }
    }
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    // An empty token is no credential (it must never match a token that
    // hashes the empty string).
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
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
    let hash = tokens::hash(token);
    if let Some(admin_hash) = &state.admin_hash {
        if ct_eq(admin_hash, &hash) {
            return Ok(Some(Caller::Admin));
        }
    }
    let revocations = state.store.revocations();
    if let Some(principal) = state.auth_cache.get(&hash, revocations) {
        return Ok(Some(Caller::Enrolled(principal)));
    }
    // Read before the database is asked: an answer that may have raced a
    // revocation (the total moved meanwhile) is not cached.
    let before = revocations.total();
    let (principal, valid_ms) =
        state
            .store
            .authenticate_for(token)
            .await
            .map_err(|e| match e.code() {
                Some(_) => ApiError::unauthorized(),
                None => ApiError::from(e),
            })?;
    let seen = revocations.of(principal.worker_id);
    if revocations.total() == before {
        state
            .auth_cache
            .put(hash, principal.clone(), valid_ms, seen);
    }
    Ok(Some(Caller::Enrolled(principal)))
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
            Caller::Enrolled(_) => Err(forbidden("this endpoint needs the admin token")),
        }
    }
}
