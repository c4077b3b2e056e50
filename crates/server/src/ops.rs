//! Operator endpoints: readiness, queue gauges and Prometheus metrics.
//!
//! - `GET /v1/health` (in [`routes`](crate::routes)) is liveness: it never touches
//!   the database, so a database outage does not get a healthy process restarted.
//! - `GET /v1/ready` is readiness: `503` while the database does not answer
//!   within [`READY_TIMEOUT`] or a migration is not recorded; it recovers by
//!   itself when the database returns (the pool reconnects on its next use).
//! - `GET /v1/queues/{queue}/stats` is the JSON view of one queue's gauges (the
//!   admin, or a producer scoped to that queue).
//! - `GET /metrics` is the text exposition of [`Metrics`](crate::metrics::Metrics),
//!   behind the admin token; `--metrics-listen` serves it without a token on a
//!   separate address (for a scraper on a private network).

use std::time::Duration;

use agentstore_protocol::lease::{QueueStats, Readiness};
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};

use crate::auth::{Admin, Caller};
use crate::error::ApiError;
use crate::extract::{queue_name, Segment};
use crate::metrics::CONTENT_TYPE;
use crate::state::AppState;
use crate::store::pending;

/// How long readiness waits for the database before answering `503`.
pub const READY_TIMEOUT: Duration = Duration::from_secs(2);

/// The operator routes under `/v1`.
pub fn v1_router() -> Router<AppState> {
    Router::new()
        .route("/ready", get(ready))
        .route("/queues/{queue}/stats", get(queue_stats))
}

/// `GET /metrics` on the main listener (admin token).
pub fn metrics_router() -> Router<AppState> {
    Router::new().route("/metrics", get(admin_metrics))
}

/// `GET /metrics` without a token, for the `--metrics-listen` address only.
pub fn open_metrics_router() -> Router<AppState> {
    Router::new().route("/metrics", get(metrics))
}

async fn ready(State(st): State<AppState>) -> (StatusCode, Json<Readiness>) {
    let reason = match tokio::time::timeout(READY_TIMEOUT, pending(&st.store)).await {
        Ok(Ok(0)) => None,
        Ok(Ok(n)) => Some(format!("{n} migration(s) not applied")),
        Ok(Err(e)) => {
            // The detail goes to the log; an unauthenticated probe learns the kind.
            tracing::warn!(error = %e, "readiness: database check failed");
            Some("database unavailable or schema missing".to_owned())
        }
        Err(_) => Some(format!(
            "database did not answer within {} ms",
            READY_TIMEOUT.as_millis()
        )),
    };
    let status = if reason.is_none() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let body = Readiness {
        status: if reason.is_none() {
            "ready"
        } else {
            "unavailable"
        }
        .to_owned(),
        database: st.store.backend().name().to_owned(),
        reason,
    };
    (status, Json(body))
}

async fn queue_stats(
    State(st): State<AppState>,
    caller: Caller,
    Segment(queue): Segment,
) -> Result<Json<QueueStats>, ApiError> {
    // The role and scope first: a caller refused them is refused whatever
    // the name (an invalid one is in no scope but "*").
    caller.produce(&queue)?;
    let queue = queue_name(&queue)?;
    let mut stats = st.store.queue_stats(Some(queue)).await?;
    Ok(Json(stats.pop().unwrap_or_default()))
}

async fn admin_metrics(st: State<AppState>, _: Admin) -> Result<Response, ApiError> {
    metrics(st).await
}

async fn metrics(State(st): State<AppState>) -> Result<Response, ApiError> {
    let text = st
        .metrics
        .render(&st.store, st.metrics_read_timeout)
        .await?;
    Ok(([(header::CONTENT_TYPE, CONTENT_TYPE)], text).into_response())
}
