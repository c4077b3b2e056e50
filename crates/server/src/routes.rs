//! The `/v1` handlers. Each one authenticates, validates, makes one store call and
//! maps the outcome; every failure is an [`ApiError`].

use std::collections::HashMap;

use agentstore_protocol::lease::{
    BatchHeartbeatRequest, BatchHeartbeatResponse, BatchHeartbeatResult, ClaimResponse,
    CreateEnrollmentRequest, EnqueueRequest, EnrollRequest, EnrollmentToken, Health,
    HeartbeatResponse, ItemList, ItemState, ItemView, RefreshRequest, SettleRequest, TokenRequest,
    WorkerCredentials,
};
use agentstore_protocol::{ErrorBody, ErrorCode};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};

use crate::app::AppState;
use crate::auth::{caller_from, Admin, Caller};
use crate::error::ApiError;
use crate::extract::{item_id, queue_name, JsonBody};

/// Most leases one batched heartbeat may carry.
pub const MAX_BATCH: usize = 500;

/// The `/v1` router.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/health", get(health))
        .route("/admin/enrollment-tokens", post(create_enrollment))
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

async fn create_enrollment(
    State(st): State<AppState>,
    _: Admin,
    JsonBody(req): JsonBody<CreateEnrollmentRequest>,
) -> Result<(StatusCode, Json<EnrollmentToken>), ApiError> {
    let (secret, expires_in_ms) = st.store.create_enrollment_token(req.expires_in_ms).await?;
    let body = EnrollmentToken {
        token: secret.0,
        expires_in_ms,
    };
    Ok((StatusCode::CREATED, Json(body)))
}

async fn enroll(
    State(st): State<AppState>,
    JsonBody(req): JsonBody<EnrollRequest>,
) -> Result<(StatusCode, Json<WorkerCredentials>), ApiError> {
    let creds = st.store.enroll(&req.token, req.name.as_deref()).await?;
    Ok((StatusCode::CREATED, Json(creds)))
}

async fn refresh(
    State(st): State<AppState>,
    JsonBody(req): JsonBody<RefreshRequest>,
) -> Result<Json<WorkerCredentials>, ApiError> {
    Ok(Json(st.store.refresh(&req.refresh_token).await?))
}

async fn enqueue(
    State(st): State<AppState>,
    _: Caller,
    Path(queue): Path<String>,
    JsonBody(req): JsonBody<EnqueueRequest>,
) -> Result<(StatusCode, Json<ItemView>), ApiError> {
    let queue = queue_name(&queue)?;
    let item = st
        .store
        .enqueue(queue, &req.payload, req.max_attempts)
        .await?;
    Ok((StatusCode::CREATED, Json(item)))
}

async fn list(
    State(st): State<AppState>,
    _: Caller,
    Path(queue): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Json<ItemList>, ApiError> {
    let queue = queue_name(&queue)?;
    let state = match q.get("state").map(String::as_str) {
        None => None,
        Some(s) => Some(
            ItemState::parse(s)
                .ok_or_else(|| ApiError::new(ErrorCode::Validation, "unknown state"))?,
        ),
    };
    let limit = match q.get("limit") {
        None => 1000,
        Some(l) => l.parse::<u32>().map_err(|_| {
            ApiError::new(
                ErrorCode::Validation,
                "limit must be a non-negative integer",
            )
        })?,
    }
    .min(10_000);
    let items = st.store.list(queue, state, limit).await?;
    Ok(Json(ItemList { items }))
}

async fn claim(
    State(st): State<AppState>,
    caller: Caller,
    Path(queue): Path<String>,
) -> Result<Response, ApiError> {
    let queue = queue_name(&queue)?;
    if let Err(wait) = st.limiter.check(caller.worker_id().unwrap_or(-1)) {
        let mut e = ApiError::new(ErrorCode::RateLimited, "claim polling too fast");
        e.retry_after_s = Some(wait.as_millis().div_ceil(1000).max(1) as u64);
        return Err(e);
    }
    let claimed = st.store.claim(queue, caller.worker_id()).await?;
    st.metrics.claimed(claimed.is_some());
    match claimed {
        Some(claimed) => Ok((StatusCode::CREATED, Json(claimed)).into_response()),
        None => {
            let secs = st.idle_retry_ms.div_ceil(1000).max(1);
            let retry = [(header::RETRY_AFTER, HeaderValue::from(secs))];
            Ok((StatusCode::NO_CONTENT, retry).into_response())
        }
    }
}

async fn item(
    State(st): State<AppState>,
    _: Caller,
    Path(id): Path<String>,
) -> Result<Json<ItemView>, ApiError> {
    let id = item_id(&id)?;
    match st.store.item(id).await? {
        Some(item) => Ok(Json(item)),
        None => Err(ApiError::new(
            ErrorCode::NotFound,
            format!("item {id} does not exist"),
        )),
    }
}

async fn heartbeat(
    State(st): State<AppState>,
    _: Caller,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<TokenRequest>,
) -> Result<Json<HeartbeatResponse>, ApiError> {
    let ttl_ms = st.store.heartbeat(item_id(&id)?, &req.token).await?;
    st.metrics.heartbeat();
    Ok(Json(HeartbeatResponse { ttl_ms }))
}

async fn heartbeats(
    State(st): State<AppState>,
    _: Caller,
    JsonBody(req): JsonBody<BatchHeartbeatRequest>,
) -> Result<Json<BatchHeartbeatResponse>, ApiError> {
    if req.leases.len() > MAX_BATCH {
        return Err(ApiError::new(
            ErrorCode::Validation,
            format!("at most {MAX_BATCH} leases per batch"),
        ));
    }
    let mut results = Vec::with_capacity(req.leases.len());
    for lease in req.leases {
        let outcome = st.store.heartbeat(lease.item_id, &lease.token).await;
        results.push(match outcome {
            Ok(ttl_ms) => {
                st.metrics.heartbeat();
                BatchHeartbeatResult {
                    item_id: lease.item_id,
                    ok: true,
                    ttl_ms: Some(ttl_ms),
                    error: None,
                }
            }
            Err(e) => {
                let e = ApiError::from(e);
                st.metrics.answered(e.code);
                BatchHeartbeatResult {
                    item_id: lease.item_id,
                    ok: false,
                    ttl_ms: None,
                    error: Some(ErrorBody {
                        code: e.code,
                        message: e.message,
                    }),
                }
            }
        });
    }
    Ok(Json(BatchHeartbeatResponse { results }))
}

async fn settle(
    State(st): State<AppState>,
    _: Caller,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<SettleRequest>,
) -> Result<Json<ItemView>, ApiError> {
    let item = st
        .store
        .settle(
            item_id(&id)?,
            &req.token,
            req.state,
            req.result.as_ref(),
            req.error.as_deref(),
        )
        .await?;
    st.metrics.settled(req.state);
    Ok(Json(item))
}

/// Release also serves `navigator.sendBeacon`, which cannot set headers: the
/// lease token in the body is the credential then. A present `Authorization`
/// header must still be valid.
async fn release(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<TokenRequest>,
) -> Result<Json<ItemView>, ApiError> {
    caller_from(&st, &headers).await?;
    let item = st.store.release(item_id(&id)?, &req.token).await?;
    if item.state == ItemState::Failed {
        st.metrics.retry_limit_failed("release", 1);
    }
    Ok(Json(item))
}

async fn resume(
    State(st): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<ClaimResponse>, ApiError> {
    Ok(Json(
        st.store.resume(item_id(&id)?, caller.worker_id()).await?,
    ))
}

async fn pause(
    State(st): State<AppState>,
    _: Admin,
    Path(id): Path<String>,
) -> Result<Json<ItemView>, ApiError> {
    Ok(Json(st.store.pause(item_id(&id)?).await?))
}
