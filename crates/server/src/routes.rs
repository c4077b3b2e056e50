//! The `/v1` handlers. Each one authenticates, validates, makes one store call and
//! maps the outcome; every failure is an [`ApiError`].

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use agentstore_protocol::lease::{
    BatchHeartbeatRequest, BatchHeartbeatResponse, BatchHeartbeatResult, CreateEnrollmentRequest,
    EnrollRequest, EnrollmentToken, Health, HeartbeatResponse, ItemState, RefreshRequest,
    RetryBackoff, RevokeEnrollmentRequest, TokenRequest, WorkerCredentials, ANY_QUEUE,
    MAX_ENROLLMENT_TTL_MS, MAX_SCOPE_QUEUES,
};
use agentstore_protocol::{ErrorBody, ErrorCode};
use axum::extract::{ConnectInfo, FromRequestParts, Query, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};

use crate::auth::{caller_from, Admin, Caller};
use crate::error::ApiError;
use crate::extract::{
    item_id, positive_item_id, queue_name, worker_id, JsonBody, RawBody, Segment,
};
use crate::ratelimit::{client_key, retry_after_secs, RateLimiter};
use crate::state::AppState;
use crate::store::{claim_lost, Attempt, Ended, ItemPage, Released, Resumed, Viewed};
use crate::wire::{EnqueueBody, SettleBody};

/// Most re-deliveries an item may be given (`max_attempts` at most one more).
pub const MAX_REDELIVERIES_LIMIT: u32 = agentstore_protocol::lease::MAX_REDELIVERIES_LIMIT;

/// Most leases one batched heartbeat may carry.
pub const MAX_BATCH: usize = 500;

/// The `/v1` router.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/health", get(health))
        .route("/admin/enrollment-tokens", post(create_enrollment))
        .route("/admin/enrollment-tokens/revoke", post(revoke_enrollment))
        .route("/admin/workers/{id}/revoke", post(revoke_worker))
        .route("/workers/enroll", post(enroll))
        .route("/workers/refresh", post(refresh))
        .route("/queues/{queue}/items", post(enqueue).get(list))
        .route("/queues/{queue}/claims", post(claim))
        .route("/items/{id}", get(item))
        .route("/items/{id}/heartbeat", post(heartbeat))
        .route("/items/{id}/settle", post(settle))
        .route("/items/{id}/release", post(release))
        .route("/items/{id}/resume", post(resume))
        .route("/items/{id}/pause", post(pause))
        .route("/items/{id}/requeue", post(requeue))
        .route("/items/{id}/cancel", post(cancel))
        .route("/heartbeats", post(heartbeats))
        .fallback(|| async { ApiError::new(ErrorCode::NotFound, "no such endpoint") })
}

/// Liveness: cheap, and independent of the database (readiness is `/v1/ready`).
async fn health(State(st): State<AppState>) -> Json<Health> {
    Json(Health {
        status: "ok".into(),
        database: st.store.backend().name().into(),
    })
}

fn invalid(message: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::Validation, message)
}

async fn create_enrollment(
    State(st): State<AppState>,
    _: Admin,
    JsonBody(req): JsonBody<CreateEnrollmentRequest>,
) -> Result<(StatusCode, Json<EnrollmentToken>), ApiError> {
    if req
        .expires_in_ms
        .is_some_and(|ms| ms == 0 || ms > MAX_ENROLLMENT_TTL_MS)
    {
        return Err(invalid(format!(
            "expires_in_ms must be 1..={MAX_ENROLLMENT_TTL_MS}"
        )));
    }
    let role = req.role.unwrap_or_default();
    let queues = req.queues.unwrap_or_else(|| vec![ANY_QUEUE.to_owned()]);
    if queues.is_empty() || queues.len() > MAX_SCOPE_QUEUES {
        return Err(invalid(format!(
            "queues must name 1..={MAX_SCOPE_QUEUES} queues (or \"{ANY_QUEUE}\")"
        )));
    }
    for q in &queues {
        if q != ANY_QUEUE {
            queue_name(q)?;
        }
    }
    let (secret, expires_in_ms) = st
        .store
        .create_enrollment_token(req.expires_in_ms, role, &queues)
        .await?;
    let body = EnrollmentToken {
        token: secret.0,
        expires_in_ms,
        role,
        queues,
    };
    Ok((StatusCode::CREATED, Json(body)))
}

/// `POST /v1/admin/enrollment-tokens/revoke` (admin only), body `{"token":
/// "ase_…"}`: revokes an enrollment token before its use (one handed out
/// by mistake, or to a party that no longer needs it), so it enrolls
/// nothing; `204`, again `204` when revoked already; `409 conflict` when it
/// was used already (the message names the worker it enrolled, which
/// `POST /v1/admin/workers/{id}/revoke` revokes); `404 not_found` when no
/// enrollment token matches (see [`crate::Store::revoke_enrollment_token`]).
async fn revoke_enrollment(
    State(st): State<AppState>,
    _: Admin,
    JsonBody(req): JsonBody<RevokeEnrollmentRequest>,
) -> Result<StatusCode, ApiError> {
    st.store.revoke_enrollment_token(&req.token).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v1/admin/workers/{id}/revoke` (admin only): revokes every access
/// and refresh token of that worker or producer at once; `204`, again `204`
/// when already revoked; `404 not_found` for an unknown id (see
/// [`crate::Store::revoke_credentials`]). This instance's cache of verified
/// tokens forgets the worker at once (the revocation is counted before the
/// answer).
async fn revoke_worker(
    State(st): State<AppState>,
    _: Admin,
    Segment(id): Segment,
) -> Result<StatusCode, ApiError> {
    st.store.revoke_credentials(worker_id(&id)?).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The rate-limit key of the connection's peer address (the server is
/// started with connect info; behind a reverse proxy that is the proxy's
/// address): an IPv6 peer is keyed by its /64 ([`client_key`]).
fn client_ip(parts: &Parts) -> IpAddr {
    parts
        .extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |c| client_key(c.0.ip()))
}

/// Takes one request of the client's address (an IPv6 one by its /64) from
/// `limiter`, else `429 rate_limited` with `Retry-After`.
fn admit(limiter: &RateLimiter<IpAddr>, parts: &Parts, what: &str) -> Result<(), ApiError> {
    limiter.check(&client_ip(parts)).map_err(|wait| {
        let mut e = ApiError::new(ErrorCode::RateLimited, format!("too many {what}"));
        e.retry_after_s = Some(retry_after_secs(wait));
        e
    })
}

/// Admission to an unauthenticated endpoint (enroll, refresh): at most
/// `--auth-rate` per client address, else `429 rate_limited` with `Retry-After`,
/// decided before the body is parsed or the database is touched (the body of
/// a refused request is only read and discarded, see [`crate::drain`]).
#[derive(Debug, Clone, Copy)]
pub struct Throttled;

impl FromRequestParts<AppState> for Throttled {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, st: &AppState) -> Result<Throttled, ApiError> {
        admit(&st.auth_limiter, parts, "credential requests").map(|()| Throttled)
    }
}

/// Who releases: a caller with an `Authorization` header (which must be
/// valid, and then its role rules apply), or a tokenless beacon
/// (`navigator.sendBeacon` cannot set headers), whose lease token in the
/// body is the only credential. A beacon is admitted like enroll: at most
/// `--auth-rate` per client address (a bucket of its own), decided before
/// the body is parsed or the database is touched (as [`Throttled`]).
#[derive(Debug, Clone)]
pub enum Releaser {
    /// Authenticated.
    Caller(Caller),
    /// No `Authorization` header.
    Beacon,
}

impl FromRequestParts<AppState> for Releaser {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, st: &AppState) -> Result<Releaser, ApiError> {
        match caller_from(st, &parts.headers).await? {
            Some(caller) => Ok(Releaser::Caller(caller)),
            None => {
                admit(&st.beacon_limiter, parts, "tokenless releases").map(|()| Releaser::Beacon)
            }
        }
    }
}

/// Longest worker name (characters).
const MAX_NAME_CHARS: usize = 200;

/// `201` with new credentials. The same token sent again because the
/// answer was lost (within the replay grace) is answered with new
/// credentials for the worker it enrolled; a copy whose `Request-Attempt`
/// is lower than that of its sender's copy answered last is a late copy:
/// `409 conflict`, nothing changed (see [`crate::Store::enroll_attempt`]).
async fn enroll(
    State(st): State<AppState>,
    _: Throttled,
    headers: HeaderMap,
    JsonBody(req): JsonBody<EnrollRequest>,
) -> Result<(StatusCode, Json<WorkerCredentials>), ApiError> {
    let attempt = request_attempt(&headers)?;
    if let Some(name) = &req.name {
        if name.chars().count() > MAX_NAME_CHARS || name.chars().any(char::is_control) {
            return Err(invalid(format!(
                "name must be at most {MAX_NAME_CHARS} characters without control characters"
            )));
        }
    }
    let creds = st
        .store
        .enroll_attempt(&req.token, req.name.as_deref(), attempt.as_ref())
        .await?;
    Ok((StatusCode::CREATED, Json(creds)))
}

/// New credentials for a refresh token, as [`enroll`] for a replay and a
/// late copy (see [`crate::Store::refresh_attempt`]).
async fn refresh(
    State(st): State<AppState>,
    _: Throttled,
    headers: HeaderMap,
    JsonBody(req): JsonBody<RefreshRequest>,
) -> Result<Json<WorkerCredentials>, ApiError> {
    let attempt = request_attempt(&headers)?;
    Ok(Json(
        st.store
            .refresh_attempt(&req.refresh_token, attempt.as_ref())
            .await?,
    ))
}

/// The `Idempotency-Key` request header of an enqueue or a claim: 1–255
/// characters of visible ASCII (`!`..`~`), or absent.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// The request's idempotency key, if it sent one.
///
/// # Errors
/// `validation` for a key that is empty, longer than 255 characters, not
/// visible ASCII, or sent twice.
fn idempotency_key(headers: &HeaderMap) -> Result<Option<&str>, ApiError> {
    let mut values = headers.get_all(IDEMPOTENCY_KEY).iter();
    let Some(v) = values.next() else {
        return Ok(None);
    };
    let key = v
        .to_str()
        .ok()
        .filter(|k| (1..=255).contains(&k.len()) && k.bytes().all(|b| b.is_ascii_graphic()))
        .filter(|_| values.next().is_none())
        .ok_or_else(|| {
            ApiError::new(
                ErrorCode::Validation,
                "Idempotency-Key must be one header of 1-255 visible ASCII characters",
            )
        })?;
    Ok(Some(key))
}

/// The `Request-Attempt` request header of a claim, an enrollment or a
/// refresh: `<sender>.<n>`, where `sender` (1–64 characters of
/// `A-Z a-z 0-9 _ -`) names the client's JavaScript realm (a page load, a
/// worker) and `n` (0–2^53−1, decimal) is a number that sender raises with
/// every such request it sends: of two copies of one request (the same
/// `Idempotency-Key`, or the same single-use token) by one sender, the
/// later one carries the higher number. A copy that arrives after a later
/// one by its sender was answered is refused instead of being answered as
/// a replay (see [`crate::Attempt`], [`crate::Store::claim_attempt`],
/// [`crate::Store::refresh_attempt`]).
pub const REQUEST_ATTEMPT: &str = "request-attempt";

/// The request's attempt number, if it sent one.
///
/// # Errors
/// `validation` for a value that is not one header of that form (`n` of
/// 1–16 decimal digits, at most 2^53−1: a JavaScript client's safe
/// integers).
fn request_attempt(headers: &HeaderMap) -> Result<Option<Attempt>, ApiError> {
    let mut values = headers.get_all(REQUEST_ATTEMPT).iter();
    let Some(v) = values.next() else {
        return Ok(None);
    };
    let parsed = v
        .to_str()
        .ok()
        .and_then(|t| t.rsplit_once('.'))
        .filter(|(sender, n)| {
            (1..=64).contains(&sender.len())
                && sender
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
                && (1..=16).contains(&n.len())
                && n.bytes().all(|b| b.is_ascii_digit())
        })
        .and_then(|(sender, n)| Some((sender, n.parse::<i64>().ok()?)))
        .filter(|(_, n)| *n < (1 << 53))
        .filter(|_| values.next().is_none());
    let Some((sender, n)) = parsed else {
        return Err(ApiError::new(
            ErrorCode::Validation,
            "Request-Attempt must be one header <sender>.<n>: a sender of 1-64 characters \
             A-Z a-z 0-9 _ - and a whole number 0-9007199254740991",
        ));
    };
    Ok(Some(Attempt {
        sender: sender.to_owned(),
        n,
    }))
}

/// `201` with the item. With an `Idempotency-Key`, the same request sent
/// again by the same caller (producer, or the admin token) adds nothing and
/// is answered `201` with the item as it is now and `Idempotent-Replayed:
/// true`; the key reused by that caller for another request in the queue is
/// `409 conflict`; another caller's key is its own, whatever its text (see
/// [`crate::Store::enqueue_once`]).
async fn enqueue(
    State(st): State<AppState>,
    caller: Caller,
    Segment(queue): Segment,
    headers: HeaderMap,
    body: RawBody,
) -> Result<Response, ApiError> {
    // The role and scope first: a caller refused them is refused whatever
    // the name (an invalid one is in no scope but "*").
    let producer = caller.produce(&queue)?;
    let queue = queue_name(&queue)?;
    let key = idempotency_key(&headers)?;
    let req: EnqueueBody = body.json()?;
    // `max_attempts` n is `max_redeliveries` n - 1; the item keeps only the latter.
    let cap = agentstore_protocol::lease::retry_cap(req.max_redeliveries, req.max_attempts)
        .map_err(|e| invalid(e.to_string()))?;
    let backoff = req
        .retry_backoff_ms
        .map(RetryBackoff::check)
        .transpose()
        .map_err(|e| invalid(e.to_string()))?;
    let (ended, replayed) = st
        .store
        .enqueue_with(queue, &*req.payload, cap, backoff, producer, key)
        .await?;
    Ok(replay_marked((StatusCode::CREATED, Json(ended)), replayed))
}

/// Largest `limit` of a listing (the default is 1000); a page also stops at
/// about [`Settings::list_page_bytes`](crate::Settings::list_page_bytes) of
/// item text.
pub const MAX_LIST_LIMIT: u32 = 10_000;

/// `GET /v1/queues/{queue}/items?state=&limit=&after=`: one page in id order,
/// `{items, next}`; while `next` is set, `after=next` gets the next page.
async fn list(
    State(st): State<AppState>,
    caller: Caller,
    Segment(queue): Segment,
    Query(pairs): Query<Vec<(String, String)>>,
) -> Result<Json<ItemPage>, ApiError> {
    caller.produce(&queue)?;
    let queue = queue_name(&queue)?;
    // A parameter the listing does not take (`status=done` for `state`) or
    // one given twice is refused: ignored, it would list what was not
    // asked for (every state), as an unknown SDK option would.
    let mut q: HashMap<String, String> = HashMap::new();
    for (k, v) in pairs {
        if !["state", "limit", "after"].contains(&k.as_str()) {
            return Err(ApiError::new(
                ErrorCode::Validation,
                format!("unknown query parameter {k:?} (this listing takes: state, limit, after)"),
            ));
        }
        if q.insert(k, v).is_some() {
            return Err(ApiError::new(
                ErrorCode::Validation,
                "a query parameter is given twice",
            ));
        }
    }
    let state = match q.get("state").map(String::as_str) {
        None => None,
        Some(s) => Some(
            ItemState::parse(s)
                .ok_or_else(|| ApiError::new(ErrorCode::Validation, "unknown state"))?,
        ),
    };
    // 0 is refused: an empty page without `next` is the answer of the last
    // page, and would tell a client paging by `next` that the queue is empty.
    let limit = match q.get("limit") {
        None => 1000,
        // Any size: a limit past the largest (even past u64) is taken as
        // the largest.
        Some(l) => l
            .parse::<u64>()
            .ok()
            .or_else(|| {
                (!l.is_empty() && l.bytes().all(|b| b.is_ascii_digit())).then_some(u64::MAX)
            })
            .filter(|l| *l > 0)
            .ok_or_else(|| {
                ApiError::new(ErrorCode::Validation, "limit must be a positive integer")
            })?,
    }
    .min(u64::from(MAX_LIST_LIMIT)) as u32;
    let after = match q.get("after") {
        None => 0,
        Some(a) => a.parse::<i64>().ok().filter(|a| *a >= 0).ok_or_else(|| {
            ApiError::new(
                ErrorCode::Validation,
                "after must be a non-negative integer (an item id)",
            )
        })?,
    };
    Ok(Json(st.store.list(queue, state, after, limit).await?))
}

/// `201` with the item and its lease, or `204` with `Retry-After` when
/// nothing is open. With an `Idempotency-Key` (a new one per claim, sent
/// again only when the claim's answer was lost), a lease that claim took
/// and still holds is answered again: `201`, `Idempotent-Replayed: true`, a
/// new token (see [`crate::Store::claim_once`]). With a `Request-Attempt`
/// too, not to a copy that arrives after a later copy by its sender was answered:
/// that late copy is `409 conflict` and holds no lease, also once the
/// later copy's lease ended (see [`crate::Store::claim_attempt`]).
async fn claim(
    State(st): State<AppState>,
    caller: Caller,
    Segment(queue): Segment,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let worker = caller.claim(&queue)?;
    let queue = queue_name(&queue)?;
    let key = idempotency_key(&headers)?;
    let attempt = request_attempt(&headers)?;
    if let Err(wait) = st.claim_limiter.check(&worker.unwrap_or(-1)) {
        let mut e = ApiError::new(ErrorCode::RateLimited, "claim polling too fast");
        e.retry_after_s = Some(retry_after_secs(wait));
        return Err(e);
    }
    match st
        .store
        .claim_attempt(queue, worker, key, attempt.as_ref())
        .await?
    {
        Some((claimed, replayed)) => Ok(replay_marked(
            (StatusCode::CREATED, Json(claimed)),
            replayed,
        )),
        None => {
            let secs = st.idle_retry_ms.div_ceil(1000).max(1);
            let retry = [(header::RETRY_AFTER, HeaderValue::from(secs))];
            Ok((StatusCode::NO_CONTENT, retry).into_response())
        }
    }
}

async fn item(
    State(st): State<AppState>,
    caller: Caller,
    Segment(id): Segment,
) -> Result<Json<Viewed>, ApiError> {
    let id = item_id(&id)?;
    match st.store.view_item(id).await? {
        Some(item) => {
            let (queue, holder) = item.owners();
            caller.read(queue, holder).map(|()| Json(item))
        }
        // Only a caller that may read every item (the admin, a producer of
        // every queue) is told that one does not exist; anyone else gets
        // the refusal it gets for an item it may not read (of no queue, held
        // by nobody), so that ids outside its scope cannot be probed (see
        // [`unseen`]).
        None => {
            if !caller.reads_every_item() {
                caller.read(None, None)?;
            }
            Err(ApiError::new(
                ErrorCode::NotFound,
                format!("item {id} does not exist"),
            ))
        }
    }
}

/// What a fenced write (heartbeat, settle, release) of item `id` by
/// `caller` answers when it failed with `e`: for a worker, an item that does
/// not exist is answered as one whose lease token is wrong (`409
/// claim_lost`, the same message but for the id, after the same one read),
/// so that a worker cannot tell which ids exist outside its leases, as a
/// tokenless release cannot (see [`release`]). The admin is told
/// `not_found`.
fn unseen(caller: &Caller, id: i64, e: ApiError) -> ApiError {
    if e.code == ErrorCode::NotFound && !matches!(caller, Caller::Admin) {
        claim_lost(id).into()
    } else {
        e
    }
}

async fn heartbeat(
    State(st): State<AppState>,
    caller: Caller,
    Segment(id): Segment,
    body: RawBody,
) -> Result<Json<HeartbeatResponse>, ApiError> {
    let owner = caller.lease_owner()?;
    let id = item_id(&id)?;
    let req: TokenRequest = body.json()?;
    let ttl_ms = st
        .store
        .heartbeat(id, &req.token, owner)
        .await
        .map_err(|e| unseen(&caller, id, e.into()))?;
    Ok(Json(HeartbeatResponse { ttl_ms }))
}

/// Renews every listed lease in one statement; a result per lease. An entry
/// whose `item_id` is not positive gets `bad_request` (what the single
/// heartbeat answers for that id) and is not looked up.
async fn heartbeats(
    State(st): State<AppState>,
    caller: Caller,
    body: RawBody,
) -> Result<Json<BatchHeartbeatResponse>, ApiError> {
    let owner = caller.lease_owner()?;
    let req: BatchHeartbeatRequest = body.json()?;
    if req.leases.len() > MAX_BATCH {
        return Err(invalid(format!("at most {MAX_BATCH} leases per batch")));
    }
    let leases: Vec<(i64, &str)> = req
        .leases
        .iter()
        .filter(|l| positive_item_id(l.item_id).is_ok())
        .map(|l| (l.item_id, l.token.as_str()))
        .collect();
    let mut outcomes = st
        .store
        .heartbeat_many(&leases, owner)
        .await?
        .into_iter()
        .map(|o| o.map_err(ApiError::from));
    let results = req
        .leases
        .iter()
        .map(|l| {
            let outcome = match positive_item_id(l.item_id) {
                Ok(_) => outcomes
                    .next()
                    .unwrap_or_else(|| Err(ApiError::new(ErrorCode::Internal, "internal error"))),
                Err(e) => Err(e),
            };
            match outcome {
                Ok(ttl_ms) => BatchHeartbeatResult {
                    item_id: l.item_id,
                    ok: true,
                    ttl_ms: Some(ttl_ms),
                    error: None,
                },
                Err(e) => {
                    let e = unseen(&caller, l.item_id, e);
                    st.metrics.answered(e.code);
                    BatchHeartbeatResult {
                        item_id: l.item_id,
                        ok: false,
                        ttl_ms: None,
                        error: Some(ErrorBody {
                            code: e.code,
                            message: e.message,
                            settled: e.settled,
                        }),
                    }
                }
            }
        })
        .collect();
    Ok(Json(BatchHeartbeatResponse { results }))
}

/// `200` with the item as the settle left it (`ItemView`; `{id, state,
/// unreadable_row: true}` when its row does not decode). The same settle
/// sent again by its lease (its answer lost) changes nothing and is
/// answered `200` with `Idempotent-Replayed: true` and that same item as
/// the settle left it, also after the item moved on: its state, result and
/// error, its lease's epoch and the attempts then, no holder, nothing of a
/// later lease (see `store::settle::as_settled`).
async fn settle(
    State(st): State<AppState>,
    caller: Caller,
    Segment(id): Segment,
    body: RawBody,
) -> Result<Response, ApiError> {
    let owner = caller.lease_owner()?;
    let id = item_id(&id)?;
    let req: SettleBody = body.json()?;
    let (item, replayed) = st
        .store
        .settle_reporting(
            id,
            &req.token,
            owner,
            req.state,
            req.result.as_deref(),
            req.error.as_deref(),
        )
        .await
        .map_err(|e| unseen(&caller, id, e.into()))?;
    Ok(replay_marked(Json(item), replayed))
}

/// The answer header that marks a replayed ending call (a settle or release
/// this lease token had already made, answered again and changing nothing),
/// as Stripe's API marks a replayed idempotent request. Exposed to browsers
/// by CORS.
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";

/// `answer`, with `Idempotent-Replayed: true` when `replayed`.
fn replay_marked(answer: impl IntoResponse, replayed: bool) -> Response {
    let mut resp = answer.into_response();
    if replayed {
        resp.headers_mut()
            .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    }
    resp
}

/// Release also serves `navigator.sendBeacon`, which cannot set headers: the
/// lease token in the body is the credential then (see [`Releaser`]). Without
/// credentials, a missing item is answered as a wrong token is (`409
/// claim_lost`, in one read either way), so a beacon cannot tell which ids
/// exist. A beacon is honoured for a revoked worker's lease too: such a
/// lease can no longer be heartbeaten or settled (those need the worker's
/// access token), so it ends at its expiry anyway, counting the same attempt
/// an expiry counts (`end_attempt`); the release only ends it sooner and
/// frees the item for another worker.
async fn release(
    State(st): State<AppState>,
    releaser: Releaser,
    Segment(id): Segment,
    body: RawBody,
) -> Result<Response, ApiError> {
    let owner = match &releaser {
        Releaser::Caller(caller) => caller.lease_owner()?,
        Releaser::Beacon => None,
    };
    let id = item_id(&id)?;
    let req: TokenRequest = body.json()?;
    let released = st.store.release_reporting(id, &req.token, owner).await;
    let (item, done) = match (released, releaser) {
        (Err(e), Releaser::Beacon) if e.code() == Some(ErrorCode::NotFound) => {
            return Err(claim_lost(id).into());
        }
        (Err(e), Releaser::Caller(caller)) => return Err(unseen(&caller, id, e.into())),
        (outcome, _) => outcome?,
    };
    match done {
        Released::Now => Ok(Json(item).into_response()),
        // Only that it was released: the item may have moved on (claimed,
        // settled by another worker), and a released token is no read key.
        Released::Again => Ok(replay_marked(
            Json(serde_json::json!({"id": id, "replayed": true})),
            true,
        )),
        // This lease's own settle landed before (its answer was lost):
        // nothing released; `settled` is the state that settle set.
        Released::BySettle(state) => Ok(replay_marked(
            Json(serde_json::json!({"id": id, "replayed": true, "settled": state.as_str()})),
            true,
        )),
    }
}

/// `200` with `{item, lease}`; when the paused row does not decode, `200`
/// with `{id, state: "failed", unreadable_row: true}`: it was failed instead
/// (see `Store::resume_reporting`). Sent again after a resume landed (its
/// answer lost, or another operator's resume first), `200` with `{id,
/// state, epoch, replayed: true}` and `Idempotent-Replayed: true`: nothing
/// changed, no lease handed out.
async fn resume(
    State(st): State<AppState>,
    _: Admin,
    Segment(id): Segment,
) -> Result<Response, ApiError> {
    let resumed = st.store.resume_reporting(item_id(&id)?, None).await?;
    let again = matches!(resumed, Resumed::Again { .. });
    Ok(replay_marked(Json(resumed), again))
}

/// `200` with the item; when its row does not decode, `200` with `{id,
/// state: "paused", unreadable_row: true}` (the pause was applied).
async fn pause(
    State(st): State<AppState>,
    _: Admin,
    Segment(id): Segment,
) -> Result<Json<Ended>, ApiError> {
    Ok(Json(st.store.pause_reporting(item_id(&id)?).await?))
}

/// `POST /v1/items/{id}/requeue` (admin only): a `failed` or `blocked` item
/// back to `open`, attempts 0, epoch kept until the next claim,
/// `last_error` kept; `200` with the item (`{id, state: "open",
/// unreadable_row: true}` when its row does not decode: the requeue was
/// applied). Sent again before any claim took it, `200` with the item as it
/// is and `Idempotent-Replayed: true`, nothing changed; `409 conflict` from
/// any other state (see [`crate::Store::requeue`]).
async fn requeue(
    State(st): State<AppState>,
    _: Admin,
    Segment(id): Segment,
) -> Result<Response, ApiError> {
    let (item, replayed) = st.store.requeue(item_id(&id)?).await?;
    Ok(replay_marked(Json(item), replayed))
}

/// `POST /v1/items/{id}/cancel` (admin only): an `open`, `running`, `paused`
/// or `blocked` item to `failed` with `last_error` `"cancelled"`, no attempt
/// counted; a holder's next heartbeat or settle is `409 state_conflict`.
/// `200` with the item (`{id, state: "failed", unreadable_row: true}` when
/// its row does not decode: the cancel was applied). Sent again while the
/// item is as that cancel left it, `200` with the item and
/// `Idempotent-Replayed: true`, nothing changed; `409 conflict` naming the
/// state from `done` or any other `failed` (see [`crate::Store::cancel`]).
async fn cancel(
    State(st): State<AppState>,
    _: Admin,
    Segment(id): Segment,
) -> Result<Response, ApiError> {
    let (item, replayed) = st.store.cancel(item_id(&id)?).await?;
    Ok(replay_marked(Json(item), replayed))
}
