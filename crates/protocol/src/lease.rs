//! Work leases: defaults, HTTP wire types for every `/v1` lease endpoint, and the
//! pure lease state machine the server's SQL implements.
//!
//! Nothing here reads a clock. Every time is an argument in milliseconds on the
//! DATABASE clock (`now_ms`), so the rules are tested with plain `cargo test`, and a
//! client whose wall clock is off by minutes changes nothing (case C-T1): clients
//! only ever see durations (`ttl_ms`, `heartbeat_ms`).
//!
//! Reconnect backoff is not part of this module.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{ErrorBody, ErrorCode};

/// Lease time-to-live: a claim whose last heartbeat is older than this may be taken over (ms).
pub const DEFAULT_TTL_MS: u64 = 90_000;
/// How often a worker should heartbeat a held lease (ms).
pub const DEFAULT_HEARTBEAT_MS: u64 = 15_000;
/// How often each server instance runs a reaper pass (ms).
pub const DEFAULT_REAPER_MS: u64 = 15_000;
/// Re-deliveries an item gets after its first delivery: a claim that ends without
/// a settle (lease expiry or release) reopens the item while it has had at most
/// this many re-deliveries; the ending after that fails it with `retry_limit`.
/// So an item is delivered at most `1 + 5` times (DESIGN "retry cap 5").
pub const DEFAULT_MAX_REDELIVERIES: u32 = 5;
/// `last_error` of an item failed by the retry cap.
pub const RETRY_LIMIT_REASON: &str = "retry_limit";
/// `last_error` of an item an operator cancelled (`POST /v1/items/{id}/cancel`).
pub const CANCELLED_REASON: &str = "cancelled";
/// Largest `max_redeliveries` an enqueue may ask for.
pub const MAX_REDELIVERIES_LIMIT: u32 = 1_000;
/// Largest `max_attempts` an enqueue may ask for: [`MAX_REDELIVERIES_LIMIT`]
/// re-deliveries plus the first delivery.
pub const MAX_ATTEMPTS_LIMIT: u32 = MAX_REDELIVERIES_LIMIT + 1;
/// Largest `base` and `max` of a [`RetryBackoff`]: one day (ms).
pub const RETRY_BACKOFF_LIMIT_MS: u64 = 86_400_000;

/// The state of a work item.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ItemState {
    /// Waiting to be claimed.
    Open,
    /// Claimed: a lease token is current and heartbeats keep it alive.
    Running,
    /// Set aside; `resume` makes it `running` again with a new token.
    Paused,
    /// Settled as blocked by its worker (terminal until an operator acts).
    Blocked,
    /// Settled successfully (terminal).
    Done,
    /// Settled as failed, or failed by the retry cap (terminal).
    Failed,
}

impl ItemState {
    /// Every state, for exhaustive tests.
    pub const ALL: [ItemState; 6] = [
        ItemState::Open,
        ItemState::Running,
        ItemState::Paused,
        ItemState::Blocked,
        ItemState::Done,
        ItemState::Failed,
    ];

    /// The wire / database string (`"open"`, `"running"`, …).
    pub const fn as_str(self) -> &'static str {
        match self {
            ItemState::Open => "open",
            ItemState::Running => "running",
            ItemState::Paused => "paused",
            ItemState::Blocked => "blocked",
            ItemState::Done => "done",
            ItemState::Failed => "failed",
        }
    }

    /// Parses a state string; `None` for unknown strings.
    pub fn parse(s: &str) -> Option<ItemState> {
        ItemState::ALL.into_iter().find(|st| st.as_str() == s)
    }
}

/// The states a worker may settle a running item into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SettleState {
    /// Finished successfully.
    Done,
    /// Finished with an error; not retried.
    Failed,
    /// Cannot proceed until something outside changes.
    Blocked,
    /// Set aside; resumable with a new token.
    Paused,
}

impl SettleState {
    /// Parses a settle state's wire name (`done`, `failed`, `blocked`,
    /// `paused`); `None` for any other string.
    pub fn parse(s: &str) -> Option<SettleState> {
        [
            SettleState::Done,
            SettleState::Failed,
            SettleState::Blocked,
            SettleState::Paused,
        ]
        .into_iter()
        .find(|st| ItemState::from(*st).as_str() == s)
    }
}

impl From<SettleState> for ItemState {
    fn from(s: SettleState) -> ItemState {
        match s {
            SettleState::Done => ItemState::Done,
            SettleState::Failed => ItemState::Failed,
            SettleState::Blocked => ItemState::Blocked,
            SettleState::Paused => ItemState::Paused,
        }
    }
}

// ---------------------------------------------------------------------------
// Wire types
// ---------------------------------------------------------------------------

/// `POST /v1/queues/{queue}/items` body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnqueueRequest {
    /// Any JSON value a client reads back as written (nesting at most 127
    /// deep, the body's own object being the 128th level serde_json allows; numbers within `f64`, no lone surrogate escape; else the server
    /// answers `400 validation`); handed to the worker unchanged.
    pub payload: Value,
    /// Re-deliveries allowed after the first delivery (0 = deliver once); the
    /// server default (`--max-redeliveries`, 5) when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_redeliveries: Option<u32>,
    /// The same cap counted as total deliveries, first included (River's and
    /// Temporal's `max_attempts`): `n` is `max_redeliveries` `n - 1`, so
    /// 1..=1001. Input only: the item stores and reports `max_redeliveries`.
    /// Giving both fields is refused (see [`retry_cap`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    /// Redelivery backoff (opt-in): after a delivery ends without a settle
    /// (an expiry or a release) the reopened item is claimable only after
    /// a full-jitter delay (see [`RetryBackoff`]). Absent: claimable at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_backoff_ms: Option<RetryBackoff>,
}

/// An item's redelivery backoff (`"retry_backoff_ms": {"base": 1000, "max":
/// 60000}`): after its n-th delivery ended without a settle (an expiry the
/// reaper took over, or a release; each counts one attempt) the reopened
/// item is claimable only `delay` ms later on the database clock, `delay`
/// uniform in `[0, min(max, base · 2^(n − 1))]` ("full jitter", AWS
/// Architecture Blog "Exponential Backoff and Jitter"; see
/// [`crate::backoff::redelivery_delay_ms`]). `1 ≤ base ≤ max ≤`
/// [`RETRY_BACKOFF_LIMIT_MS`] (see [`RetryBackoff::check`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryBackoff {
    /// The ceiling after the first ended delivery (ms), doubled after each further one.
    pub base: u64,
    /// The largest ceiling (ms).
    pub max: u64,
}

impl RetryBackoff {
    /// `self` when `1 ≤ base ≤ max ≤` [`RETRY_BACKOFF_LIMIT_MS`].
    ///
    /// # Errors
    /// [`RetryBackoffError`] naming the rule (a `400 validation`).
    pub fn check(self) -> Result<RetryBackoff, RetryBackoffError> {
        if self.base == 0 || self.base > RETRY_BACKOFF_LIMIT_MS {
            Err(RetryBackoffError::BaseOutOfRange)
        } else if self.max > RETRY_BACKOFF_LIMIT_MS {
            Err(RetryBackoffError::MaxOutOfRange)
        } else if self.max < self.base {
            Err(RetryBackoffError::MaxBelowBase)
        } else {
            Ok(self)
        }
    }

    /// The delay (ms) before an item reopened by its `attempts`-th ended
    /// delivery may be claimed again, for a random `r ∈ [0, 1)`.
    pub fn delay_ms(self, attempts: u32, r: f64) -> u64 {
        crate::backoff::redelivery_delay_ms(attempts, self.base, self.max, r)
    }
}

/// Why an enqueue's `retry_backoff_ms` is refused (a `400 validation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryBackoffError {
    /// `base` is 0 or above [`RETRY_BACKOFF_LIMIT_MS`].
    BaseOutOfRange,
    /// `max` is above [`RETRY_BACKOFF_LIMIT_MS`].
    MaxOutOfRange,
    /// `max` is below `base`.
    MaxBelowBase,
}

impl std::fmt::Display for RetryBackoffError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RetryBackoffError::BaseOutOfRange => write!(
                f,
                "retry_backoff_ms.base must be 1..={RETRY_BACKOFF_LIMIT_MS} (ms, one day at most)"
            ),
            RetryBackoffError::MaxOutOfRange => write!(
                f,
                "retry_backoff_ms.max must be at most {RETRY_BACKOFF_LIMIT_MS} (ms, one day)"
            ),
            RetryBackoffError::MaxBelowBase => {
                write!(f, "retry_backoff_ms.max must be at least its base")
            }
        }
    }
}

impl std::error::Error for RetryBackoffError {}

impl EnqueueRequest {
    /// The `max_redeliveries` this body asks for (see [`retry_cap`]).
    ///
    /// # Errors
    /// As [`retry_cap`].
    pub fn retry_cap(&self) -> Result<Option<u32>, RetryCapError> {
        retry_cap(self.max_redeliveries, self.max_attempts)
    }
}

/// Why an enqueue body's retry cap is refused (a `400 validation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryCapError {
    /// Both `max_redeliveries` and `max_attempts` were given.
    Both,
    /// `max_redeliveries` is above [`MAX_REDELIVERIES_LIMIT`].
    RedeliveriesOutOfRange,
    /// `max_attempts` is 0 or above [`MAX_ATTEMPTS_LIMIT`].
    AttemptsOutOfRange,
}

impl std::fmt::Display for RetryCapError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RetryCapError::Both => write!(
                f,
                "give max_redeliveries or max_attempts, not both \
                 (max_attempts n is max_redeliveries n - 1)"
            ),
            RetryCapError::RedeliveriesOutOfRange => {
                write!(f, "max_redeliveries must be 0..={MAX_REDELIVERIES_LIMIT}")
            }
            RetryCapError::AttemptsOutOfRange => write!(
                f,
                "max_attempts must be 1..={MAX_ATTEMPTS_LIMIT} \
                 (total deliveries, the first included)"
            ),
        }
    }
}

impl std::error::Error for RetryCapError {}

/// The `max_redeliveries` an enqueue body asks for, from its
/// `max_redeliveries` (re-deliveries after the first, 0..=1000) or its
/// `max_attempts` (total deliveries, 1..=1001: `n` is `n - 1`
/// re-deliveries); `None` (the server's default) when neither is given.
///
/// # Errors
/// [`RetryCapError::Both`] when both are given, else the given one's range.
pub fn retry_cap(
    max_redeliveries: Option<u32>,
    max_attempts: Option<u32>,
) -> Result<Option<u32>, RetryCapError> {
    match (max_redeliveries, max_attempts) {
        (Some(_), Some(_)) => Err(RetryCapError::Both),
        (Some(n), None) if n > MAX_REDELIVERIES_LIMIT => Err(RetryCapError::RedeliveriesOutOfRange),
        (Some(n), None) => Ok(Some(n)),
        (None, Some(n)) if n == 0 || n > MAX_ATTEMPTS_LIMIT => {
            Err(RetryCapError::AttemptsOutOfRange)
        }
        (None, Some(n)) => Ok(Some(n - 1)),
        (None, None) => Ok(None),
    }
}

/// A work item as the server reports it (`201` of enqueue, `GET /v1/items/{id}`).
///
/// `P` holds the payload and the result: a parsed [`Value`] by default; the
/// server keeps each as the JSON text it was given (its `RawJson`), which
/// serialises to the same answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(bound(deserialize = "P: Deserialize<'de>"))]
pub struct ItemView<P = Value> {
    /// Server-assigned id (below 2^53, so exact in JS).
    pub id: i64,
    /// Queue name.
    pub queue: String,
    /// Current state.
    pub state: ItemState,
    /// The enqueued payload.
    pub payload: P,
    /// The result given to the last settle, if any.
    #[serde(default)]
    pub result: Option<P>,
    /// Claims that ended without a settle (expiries and releases).
    pub attempts: u32,
    /// Re-deliveries allowed after the first delivery: the ended attempt that
    /// exceeds it fails the item with `retry_limit` (see [`end_attempt`]).
    pub max_redeliveries: u32,
    /// Increases on every claim and resume; 0 before the first claim.
    pub epoch: u64,
    /// Why the item failed or was reopened (`"retry_limit"`, `"expired"`,
    /// `"cancelled"` by an operator, a worker's message).
    #[serde(default)]
    pub last_error: Option<String>,
    /// The worker holding the current claim, if any.
    #[serde(default)]
    pub worker_id: Option<i64>,
    /// The redelivery backoff it was enqueued with, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_backoff_ms: Option<RetryBackoff>,
    /// While the item is open but backing off after an ended delivery: how
    /// long (ms, on the database clock, as read) until a claim may take it.
    /// Absent when it is claimable now or not open (and in answers that do
    /// not read the clock: a claim, a settle).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available_in_ms: Option<u64>,
}

/// The lease part of a claim or resume answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// Fresh random token for this claim (≥128 bits); the fence for every later call.
    pub token: String,
    /// The item's epoch for this claim.
    pub epoch: u64,
    /// Lease time-to-live from the last heartbeat, on the server's database clock (ms).
    pub ttl_ms: u64,
    /// Suggested heartbeat interval (ms).
    pub heartbeat_ms: u64,
}

/// `201` answer of `POST /v1/queues/{queue}/claims` and `200` of resume.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClaimResponse<P = Value> {
    /// The claimed item (state `running`).
    pub item: ItemView<P>,
    /// The lease to heartbeat and settle with.
    pub lease: Lease,
}

/// The fields of a claimed item the client acts on (`{id, epoch}`, the rest of
/// an [`ItemView`] ignored): the SDK hands the app the item as the JS object it
/// arrived as and reads only these.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ItemRef {
    /// Item id.
    pub id: i64,
    /// Grows on every claim of the item.
    pub epoch: u64,
}

/// A claim answer ([`ClaimResponse`]) as the client reads it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimedRef {
    /// The item's id and epoch.
    pub item: ItemRef,
    /// The lease.
    pub lease: Lease,
}

/// Body of heartbeat and release: the lease token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenRequest {
    /// The lease token from the claim.
    pub token: String,
}

/// `200` answer of `POST /v1/items/{id}/heartbeat`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeartbeatResponse {
    /// The lease now lives this long from the heartbeat (ms).
    pub ttl_ms: u64,
}

/// `POST /v1/items/{id}/settle` body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SettleRequest {
    /// The lease token from the claim.
    pub token: String,
    /// The state to settle into.
    pub state: SettleState,
    /// Optional result stored with the item.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    /// Optional message stored as `last_error` (for `failed` / `blocked`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One lease in `POST /v1/heartbeats`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchHeartbeatEntry {
    /// The item id.
    pub item_id: i64,
    /// The lease token.
    pub token: String,
}

/// `POST /v1/heartbeats` body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchHeartbeatRequest {
    /// The leases to renew.
    pub leases: Vec<BatchHeartbeatEntry>,
}

/// One result of a batched heartbeat, in request order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchHeartbeatResult {
    /// The item id.
    pub item_id: i64,
    /// Whether this lease was renewed.
    pub ok: bool,
    /// Set when renewed (ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
    /// Set when not renewed (`claim_lost`, `not_found`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorBody>,
}

/// `200` answer of `POST /v1/heartbeats`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchHeartbeatResponse {
    /// One result per requested lease, in request order.
    pub results: Vec<BatchHeartbeatResult>,
}

/// `GET /v1/queues/{queue}/items?state=&limit=&after=` answer: one page of
/// a queue's items (at most `limit`, 10,000 at most, or about 4 MiB of item
/// text). `P` as in [`ItemView`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(bound(deserialize = "P: Deserialize<'de>"))]
pub struct ItemList<P = Value> {
    /// Items in id order.
    pub items: Vec<ItemView<P>>,
    /// Set when more items may follow: pass it as `after` for the next page.
    /// `None` once the queue (or state) has no item after this page.
    #[serde(default)]
    pub next: Option<i64>,
}

/// What an enrolled credential may do. The admin is not a role one can enroll
/// as: it is the one token the server is started with.
///
/// | role | may |
/// |---|---|
/// | `producer` | enqueue into, list and read the items of the queues in its scope |
/// | `worker` | claim from the queues in its scope; heartbeat, settle, release and read only the items it holds |
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Claims and works items (the default of an enrollment token).
    #[default]
    Worker,
    /// Enqueues items and reads them back.
    Producer,
}

impl Role {
    /// The wire / database string.
    pub const fn as_str(self) -> &'static str {
        match self {
            Role::Worker => "worker",
            Role::Producer => "producer",
        }
    }

    /// Parses a role string; `None` for unknown strings.
    pub fn parse(s: &str) -> Option<Role> {
        [Role::Worker, Role::Producer]
            .into_iter()
            .find(|r| r.as_str() == s)
    }
}

/// What a queue name may be, as the server's `validation` answer and the
/// SDK's ValidationError say it.
pub const QUEUE_NAME_RULE: &str =
    "queue names are 1-200 characters of A-Z a-z 0-9 _ - . : and not . or ..";

/// True for a valid queue name: 1–200 characters of `A-Z a-z 0-9 _ - . :`,
/// other than `.` and `..`. Those two are path segments a URL parser
/// resolves away (RFC 3986 §5.2.4 "remove dot segments"; the WHATWG URL
/// parser also decodes `%2E` first), so `/v1/queues/../claims` reaches
/// another route and no browser client could ever address such a queue.
pub fn is_queue_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 200
        && name != "."
        && name != ".."
        && crate::only(name, |b| {
            b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b':')
        })
}

/// The queue-scope entry that stands for every queue.
pub const ANY_QUEUE: &str = "*";

/// Longest validity an enrollment token may be given (ms): one year.
pub const MAX_ENROLLMENT_TTL_MS: u64 = 365 * 24 * 3600 * 1000;

/// Most entries in an enrollment token's queue scope.
pub const MAX_SCOPE_QUEUES: usize = 100;

/// True when a credential scoped to `scope` may act on `queue`: the scope names
/// it, or contains [`ANY_QUEUE`].
pub fn queue_in_scope(scope: &[String], queue: &str) -> bool {
    scope.iter().any(|q| q == ANY_QUEUE || q == queue)
}

/// `POST /v1/admin/enrollment-tokens` body (admin token required).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateEnrollmentRequest {
    /// Validity of the token (ms, 1..=[`MAX_ENROLLMENT_TTL_MS`]); server default
    /// (24 h) when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_in_ms: Option<u64>,
    /// The role the enrolled credential gets; `worker` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<Role>,
    /// The queues it may act on (1..=[`MAX_SCOPE_QUEUES`] queue names, or
    /// [`ANY_QUEUE`]); every queue (`["*"]`) when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queues: Option<Vec<String>>,
}

/// `POST /v1/admin/enrollment-tokens/revoke` body (admin token required):
/// the enrollment token to revoke before it is used.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RevokeEnrollmentRequest {
    /// The enrollment token as `POST /v1/admin/enrollment-tokens` answered it
    /// (`ase_…`).
    pub token: String,
}

/// `201` answer with a single-use enrollment token (shown once, stored hashed).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnrollmentToken {
    /// The token to give to one worker.
    pub token: String,
    /// Validity from creation (ms).
    pub expires_in_ms: u64,
    /// The role it grants.
    #[serde(default)]
    pub role: Role,
    /// The queue scope it grants.
    #[serde(default)]
    pub queues: Vec<String>,
}

/// `POST /v1/workers/enroll` body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnrollRequest {
    /// A single-use enrollment token.
    pub token: String,
    /// Optional display name of the worker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// `POST /v1/workers/refresh` body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RefreshRequest {
    /// The current refresh token; it is burnt by this call.
    pub refresh_token: String,
}

/// Answer of enroll and refresh: a new access token and a new refresh token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerCredentials {
    /// The worker's id.
    pub worker_id: i64,
    /// Send as `Authorization: Bearer <access_token>`.
    pub access_token: String,
    /// Access token validity from now (ms).
    pub access_expires_in_ms: u64,
    /// Single-use token for `POST /v1/workers/refresh`.
    pub refresh_token: String,
}

/// `GET /v1/health` answer (liveness: the process serves HTTP; the database is
/// not consulted, see [`Readiness`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Health {
    /// Always `"ok"`.
    pub status: String,
    /// `"sqlite"` or `"postgres"`.
    pub database: String,
}

/// `GET /v1/ready` answer: `200` with `status: "ready"` when the database answers
/// and every migration is applied; `503` with `status: "unavailable"` and a
/// `reason` otherwise.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Readiness {
    /// `"ready"` or `"unavailable"`.
    pub status: String,
    /// `"sqlite"` or `"postgres"`.
    pub database: String,
    /// Why the server is not ready (absent when ready).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Gauges of one queue, read from the database in one query: `GET
/// /v1/queues/{queue}/stats`, and the per-queue gauges of `GET /metrics`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueStats {
    /// The queue name.
    pub queue: String,
    /// Items waiting to be claimed.
    pub open: u64,
    /// Items claimed under a lease (leases held).
    pub running: u64,
    /// Items set aside by an operator or their worker.
    pub paused: u64,
    /// Items settled `blocked`.
    pub blocked: u64,
    /// Items settled `done`.
    pub done: u64,
    /// Items settled `failed` or failed by the retry cap.
    pub failed: u64,
    /// How long the longest-waiting open item has been claimable (ms on the
    /// database clock, since it was enqueued or last reopened, or since its
    /// redelivery backoff ended; 0 while every open item backs off); `null`
    /// with no open item.
    pub oldest_open_age_ms: Option<u64>,
}

impl QueueStats {
    /// The count of items in `state`.
    pub fn count(&self, state: ItemState) -> u64 {
        match state {
            ItemState::Open => self.open,
            ItemState::Running => self.running,
            ItemState::Paused => self.paused,
            ItemState::Blocked => self.blocked,
            ItemState::Done => self.done,
            ItemState::Failed => self.failed,
        }
    }

    /// Mutable count of items in `state`.
    pub fn count_mut(&mut self, state: ItemState) -> &mut u64 {
        match state {
            ItemState::Open => &mut self.open,
            ItemState::Running => &mut self.running,
            ItemState::Paused => &mut self.paused,
            ItemState::Blocked => &mut self.blocked,
            ItemState::Done => &mut self.done,
            ItemState::Failed => &mut self.failed,
        }
    }
}

/// Most queues that get series of their own in the server's per-queue
/// gauges (`agentstore_queue_items`, `agentstore_queue_oldest_open_age_seconds`).
pub const MAX_QUEUE_SERIES: usize = 500;

/// The `queue` label of the series that sums every queue past
/// [`MAX_QUEUE_SERIES`]: not a valid queue name (parentheses), so it never
/// names a real queue.
pub const OTHER_QUEUES: &str = "(other)";

/// The per-queue gauges as a scrape reports them: at most `max` queues keep
/// their own entry — those with the most items not yet settled (open,
/// running, paused, then by name) — and every other queue is summed into
/// one entry named [`OTHER_QUEUES`] (counts added, the oldest open age the
/// largest). A queue label is a value the callers choose (any producer may
/// enqueue into a new queue), and a Prometheus series per label value kept
/// for good would grow the scraper's memory without bound; the totals
/// stay exact.
pub fn fold_queue_series(mut queues: Vec<QueueStats>, max: usize) -> Vec<QueueStats> {
    if queues.len() <= max {
        return queues;
    }
    let pending = |q: &QueueStats| q.open + q.running + q.paused;
    queues.sort_by(|a, b| {
        pending(b)
            .cmp(&pending(a))
            .then_with(|| a.queue.cmp(&b.queue))
    });
    let rest = queues.split_off(max);
    let mut other = QueueStats {
        queue: OTHER_QUEUES.to_owned(),
        ..QueueStats::default()
    };
    for q in &rest {
        for state in ItemState::ALL {
            *other.count_mut(state) += q.count(state);
        }
        other.oldest_open_age_ms = other.oldest_open_age_ms.max(q.oldest_open_age_ms);
    }
    queues.push(other);
    queues
}

// ---------------------------------------------------------------------------
// State machine
// ---------------------------------------------------------------------------

/// True when a claim whose last heartbeat (or claim) was at `heartbeat_at_ms` is
/// expired at `now_ms`: older than `ttl_ms`, or never recorded.
///
/// Both times are on the database clock; the server evaluates exactly this
/// predicate in SQL (`heartbeat_at IS NULL OR heartbeat_at <= now - ttl`).
pub fn is_expired(heartbeat_at_ms: Option<i64>, now_ms: i64, ttl_ms: u64) -> bool {
    match heartbeat_at_ms {
        None => true,
        Some(at) => now_ms.saturating_sub(at) >= i64::try_from(ttl_ms).unwrap_or(i64::MAX),
    }
}

/// Where an item goes when a claim ends without a settle (expiry or release):
/// one more ended attempt; while the attempts ended so far are at most
/// `max_redeliveries` the item reopens (to be re-delivered), past that it is
/// `failed` with `retry_limit`. With 5, the 6th ended delivery fails it.
///
/// Returns `(state, attempts, last_error)`.
pub fn end_attempt(attempts: u32, max_redeliveries: u32) -> (ItemState, u32, &'static str) {
    let attempts = attempts.saturating_add(1);
    if attempts > max_redeliveries {
        (ItemState::Failed, attempts, RETRY_LIMIT_REASON)
    } else {
        (ItemState::Open, attempts, "expired")
    }
}

/// The error for a fenced call that could not apply: `state_conflict` when the
/// token is still the item's current one but the item left `running`, otherwise
/// `claim_lost`.
pub fn fence_error(token_current: bool, state: ItemState) -> ErrorCode {
    if token_current && state != ItemState::Running {
        ErrorCode::StateConflict
    } else {
        ErrorCode::ClaimLost
    }
}

/// The lease-relevant part of a work item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseItem {
    /// Current state.
    pub state: ItemState,
    /// Claim counter.
    pub epoch: u64,
    /// Claims that ended without a settle.
    pub attempts: u32,
    /// Re-deliveries allowed after the first delivery.
    pub max_redeliveries: u32,
    /// Last heartbeat (or claim) on the database clock (ms); `None` if never recorded.
    pub heartbeat_at_ms: Option<i64>,
    /// Whether a token is held (running, or paused by an operator under a live token).
    pub has_token: bool,
}

/// Something that happens to an item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseEvent {
    /// A worker claims an open item (new token, epoch + 1).
    Claim,
    /// The holder renews the lease.
    Heartbeat,
    /// The holder settles.
    Settle(SettleState),
    /// The holder gives the item back (counts one attempt).
    Release,
    /// A paused item is resumed with a new token.
    Resume,
    /// An operator pauses a running item; the token stays current.
    Pause,
    /// The reaper takes over an expired claim (counts one attempt).
    Expire,
    /// An operator cancels an item that has not ended: `open`, `running`,
    /// `paused` or `blocked` becomes `failed` ([`CANCELLED_REASON`]), no
    /// attempt counted. A holder's token stays the current one, so its next
    /// heartbeat or settle is `state_conflict` (as after a pause) and its
    /// work is cancelled (River's `JobCancel`, Temporal's activity
    /// cancellation delivered at the next heartbeat).
    Cancel,
}

impl LeaseItem {
    /// A freshly enqueued item.
    pub fn new(max_redeliveries: u32) -> LeaseItem {
        LeaseItem {
            state: ItemState::Open,
            epoch: 0,
            attempts: 0,
            max_redeliveries,
            heartbeat_at_ms: None,
            has_token: false,
        }
    }

    /// Applies `event` at `now_ms`. `token_current` says whether the caller's token
    /// is the item's current one (ignored by Claim, Resume, Pause, Cancel and Expire).
    ///
    /// # Errors
    /// `claim_lost` / `state_conflict` for fenced events that do not apply (see
    /// [`fence_error`]); `conflict` when the item is not in a state the event
    /// starts from (claiming a non-open item, resuming a non-paused one, expiring
    /// a live claim). A rejected event changes nothing.
    pub fn apply(
        &self,
        event: LeaseEvent,
        token_current: bool,
        now_ms: i64,
        ttl_ms: u64,
    ) -> Result<LeaseItem, ErrorCode> {
        let mut next = *self;
        let fenced = |item: &LeaseItem| {
            if token_current && item.has_token && item.state == ItemState::Running {
                Ok(())
            } else {
                Err(fence_error(token_current && item.has_token, item.state))
            }
        };
        match event {
            LeaseEvent::Claim | LeaseEvent::Resume => {
                let from = if event == LeaseEvent::Claim {
                    ItemState::Open
                } else {
                    ItemState::Paused
                };
                if self.state != from {
                    return Err(ErrorCode::Conflict);
                }
                next.state = ItemState::Running;
                next.epoch += 1;
                next.heartbeat_at_ms = Some(now_ms);
                next.has_token = true;
            }
            LeaseEvent::Heartbeat => {
                fenced(self)?;
                next.heartbeat_at_ms = Some(now_ms);
            }
            LeaseEvent::Settle(state) => {
                fenced(self)?;
                next.state = state.into();
                next.has_token = false;
            }
            LeaseEvent::Release => {
                fenced(self)?;
                next.end_claim();
            }
            LeaseEvent::Pause => {
                if self.state != ItemState::Running {
                    return Err(ErrorCode::Conflict);
                }
                next.state = ItemState::Paused;
            }
            LeaseEvent::Cancel => {
                if matches!(self.state, ItemState::Done | ItemState::Failed) {
                    return Err(ErrorCode::Conflict);
                }
                next.state = ItemState::Failed;
            }
            LeaseEvent::Expire => {
                if self.state != ItemState::Running
                    || !is_expired(self.heartbeat_at_ms, now_ms, ttl_ms)
                {
                    return Err(ErrorCode::Conflict);
                }
                next.end_claim();
            }
        }
        Ok(next)
    }

    fn end_claim(&mut self) {
        let (state, attempts, _) = end_attempt(self.attempts, self.max_redeliveries);
        self.state = state;
        self.attempts = attempts;
        self.has_token = false;
        self.heartbeat_at_ms = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_attempts_counts_the_first_delivery_so_it_is_one_more_than_max_redeliveries() {
        assert_eq!(retry_cap(None, Some(1)), Ok(Some(0)));
        assert_eq!(retry_cap(None, Some(3)), Ok(Some(2)));
        assert_eq!(
            retry_cap(None, Some(MAX_ATTEMPTS_LIMIT)),
            Ok(Some(MAX_REDELIVERIES_LIMIT))
        );
        assert_eq!(retry_cap(Some(0), None), Ok(Some(0)));
        assert_eq!(
            retry_cap(Some(MAX_REDELIVERIES_LIMIT), None),
            Ok(Some(MAX_REDELIVERIES_LIMIT))
        );
        assert_eq!(retry_cap(None, None), Ok(None));
        // max_attempts 3: the third ended delivery fails the item.
        let cap = retry_cap(None, Some(3)).unwrap().unwrap();
        assert_eq!(end_attempt(1, cap).0, ItemState::Open);
        assert_eq!(
            end_attempt(2, cap),
            (ItemState::Failed, 3, RETRY_LIMIT_REASON)
        );
    }

    #[test]
    fn a_retry_cap_given_both_ways_or_out_of_range_is_refused_naming_the_rule() {
        for (r, a) in [
            (Some(2), Some(3)),
            (Some(0), Some(1)),
            (Some(5000), Some(0)),
        ] {
            let e = retry_cap(r, a).unwrap_err();
            assert_eq!(e, RetryCapError::Both);
            let m = e.to_string();
            assert!(
                m.contains("max_redeliveries")
                    && m.contains("max_attempts")
                    && m.contains("not both"),
                "{m}"
            );
        }
        for a in [0, MAX_ATTEMPTS_LIMIT + 1, u32::MAX] {
            let e = retry_cap(None, Some(a)).unwrap_err();
            assert_eq!(e, RetryCapError::AttemptsOutOfRange);
            assert!(
                e.to_string().contains("max_attempts must be 1..=1001"),
                "{e}"
            );
        }
        for r in [MAX_REDELIVERIES_LIMIT + 1, u32::MAX] {
            let e = retry_cap(Some(r), None).unwrap_err();
            assert_eq!(e, RetryCapError::RedeliveriesOutOfRange);
            assert!(
                e.to_string().contains("max_redeliveries must be 0..=1000"),
                "{e}"
            );
        }
    }

    #[test]
    fn an_enqueue_request_reads_max_attempts_and_still_refuses_unknown_fields() {
        let req: EnqueueRequest =
            serde_json::from_str(r#"{"payload": {"job": 1}, "max_attempts": 3}"#).unwrap();
        assert_eq!((req.max_redeliveries, req.max_attempts), (None, Some(3)));
        assert_eq!(req.retry_cap(), Ok(Some(2)));
        let both: EnqueueRequest =
            serde_json::from_str(r#"{"payload": 1, "max_redeliveries": 2, "max_attempts": 3}"#)
                .unwrap();
        assert_eq!(both.retry_cap(), Err(RetryCapError::Both));
        assert!(
            serde_json::from_str::<EnqueueRequest>(r#"{"payload": 1, "max_tries": 3}"#).is_err()
        );
        // Absent fields stay off the wire.
        let plain = EnqueueRequest {
            payload: serde_json::json!(1),
            max_redeliveries: Some(2),
            max_attempts: None,
            retry_backoff_ms: None,
        };
        assert_eq!(
            serde_json::to_string(&plain).unwrap(),
            r#"{"payload":1,"max_redeliveries":2}"#
        );
    }

    #[test]
    fn a_retry_backoff_is_read_from_the_enqueue_body_and_checked_against_its_bounds() {
        let req: EnqueueRequest = serde_json::from_str(
            r#"{"payload": 1, "retry_backoff_ms": {"base": 1000, "max": 60000}}"#,
        )
        .unwrap();
        let b = req.retry_backoff_ms.unwrap();
        assert_eq!(
            b,
            RetryBackoff {
                base: 1000,
                max: 60_000
            }
        );
        assert_eq!(b.check(), Ok(b));
        assert_eq!(b.delay_ms(3, 1.0), 4000);
        assert_eq!(
            serde_json::to_value(&req).unwrap()["retry_backoff_ms"],
            serde_json::json!({"base": 1000, "max": 60000})
        );
        for bad in [
            r#"{"payload": 1, "retry_backoff_ms": {"base": 1}}"#,
            r#"{"payload": 1, "retry_backoff_ms": {"base": 1, "max": 2, "factor": 2}}"#,
            r#"{"payload": 1, "retry_backoff_ms": {"base": -1, "max": 2}}"#,
            r#"{"payload": 1, "retry_backoff_ms": 1000}"#,
        ] {
            assert!(
                serde_json::from_str::<EnqueueRequest>(bad).is_err(),
                "{bad}"
            );
        }
        let one_day = RETRY_BACKOFF_LIMIT_MS;
        for (base, max, e) in [
            (0, 10, RetryBackoffError::BaseOutOfRange),
            (one_day + 1, one_day + 1, RetryBackoffError::BaseOutOfRange),
            (10, one_day + 1, RetryBackoffError::MaxOutOfRange),
            (10, 9, RetryBackoffError::MaxBelowBase),
        ] {
            assert_eq!(RetryBackoff { base, max }.check(), Err(e), "{base} {max}");
            assert!(e.to_string().contains("retry_backoff_ms."), "{e}");
        }
        for (base, max) in [(1, 1), (1, one_day), (one_day, one_day)] {
            assert!(RetryBackoff { base, max }.check().is_ok());
        }
    }

    #[test]
    fn a_settle_state_parses_from_its_wire_name_and_nothing_else() {
        for st in [
            SettleState::Done,
            SettleState::Failed,
            SettleState::Blocked,
            SettleState::Paused,
        ] {
            assert_eq!(SettleState::parse(ItemState::from(st).as_str()), Some(st));
        }
        for other in ["open", "running", "Done", "", "done "] {
            assert_eq!(SettleState::parse(other), None, "{other:?}");
        }
    }

    const TTL: u64 = 90_000;

    /// `.` and `..` are refused (a URL parser resolves them away, so the
    /// queue's routes would be other routes); other names of dots, and the
    /// documented characters, are names.
    #[test]
    fn dot_segments_are_not_queue_names() {
        for bad in [".", "..", "", "a/b", "a b", "é", &"x".repeat(201)] {
            assert!(!is_queue_name(bad), "{bad:?}");
        }
        for good in ["...", ".a", "a..", "jobs:v1.2", "A-Z_0", &"x".repeat(200)] {
            assert!(is_queue_name(good), "{good:?}");
        }
    }

    /// Past `max` queues, the ones with the fewest unsettled items are
    /// summed into one `(other)` entry: at most `max + 1` label values
    /// whatever the number of queues, and every count still adds up.
    #[test]
    fn queues_past_the_series_bound_are_summed_into_one_other_entry() {
        let q = |name: &str, open: u64, done: u64, age: Option<u64>| QueueStats {
            queue: name.into(),
            open,
            done,
            oldest_open_age_ms: age,
            ..QueueStats::default()
        };
        let all = vec![
            q("a", 1, 0, Some(5)),
            q("b", 9, 0, Some(7)),
            q("c", 0, 50, None),
            q("d", 3, 1, Some(40)),
        ];
        assert_eq!(
            fold_queue_series(all.clone(), 4),
            all,
            "within the bound: as read"
        );
        let folded = fold_queue_series(all.clone(), 2);
        let names: Vec<&str> = folded.iter().map(|s| s.queue.as_str()).collect();
        assert_eq!(names, ["b", "d", OTHER_QUEUES]);
        let other = &folded[2];
        assert_eq!((other.open, other.done), (1, 50));
        assert_eq!(other.oldest_open_age_ms, Some(5));
        for state in ItemState::ALL {
            let sum = |v: &[QueueStats]| v.iter().map(|s| s.count(state)).sum::<u64>();
            assert_eq!(sum(&folded), sum(&all), "{state:?}");
        }
        // Ties go by name: stable series from scrape to scrape.
        let tied = fold_queue_series(vec![q("y", 1, 0, None), q("x", 1, 0, None)], 1);
        assert_eq!(tied[0].queue, "x");
    }

    fn claimed(now: i64) -> LeaseItem {
        LeaseItem::new(DEFAULT_MAX_REDELIVERIES)
            .apply(LeaseEvent::Claim, false, now, TTL)
            .unwrap()
    }

    #[test]
    fn states_round_trip_through_strings_and_serde() {
        for st in ItemState::ALL {
            assert_eq!(ItemState::parse(st.as_str()), Some(st));
            assert_eq!(
                serde_json::to_string(&st).unwrap(),
                format!("\"{}\"", st.as_str())
            );
        }
        assert_eq!(ItemState::parse("nope"), None);
    }

    #[test]
    fn a_claim_expires_exactly_at_the_ttl_and_never_recorded_counts_as_expired() {
        assert!(!is_expired(Some(1_000), 1_000 + 89_999, TTL));
        assert!(is_expired(Some(1_000), 1_000 + 90_000, TTL));
        assert!(is_expired(None, 0, TTL));
    }

    #[test]
    fn expiry_depends_only_on_the_database_clock_difference() {
        // A client clock 10 minutes off never enters: only db-now minus db-heartbeat.
        let skew = 600_000;
        for base in [0_i64, 1_700_000_000_000, 1_700_000_000_000 + skew] {
            assert!(!is_expired(Some(base), base + 1_000, TTL));
            assert!(is_expired(Some(base), base + 90_001, TTL));
        }
    }

    #[test]
    fn each_claim_raises_the_epoch() {
        let a = claimed(0);
        let reopened = a.apply(LeaseEvent::Expire, false, 90_000, TTL).unwrap();
        let b = reopened
            .apply(LeaseEvent::Claim, false, 90_001, TTL)
            .unwrap();
        assert_eq!((a.epoch, b.epoch), (1, 2));
    }

    #[test]
    fn a_live_claim_cannot_be_expired_or_claimed() {
        let a = claimed(0);
        assert_eq!(
            a.apply(LeaseEvent::Expire, false, 89_999, TTL),
            Err(ErrorCode::Conflict)
        );
        assert_eq!(
            a.apply(LeaseEvent::Claim, false, 1, TTL),
            Err(ErrorCode::Conflict)
        );
    }

    #[test]
    fn a_heartbeat_past_the_ttl_but_before_takeover_renews() {
        let a = claimed(0);
        let b = a.apply(LeaseEvent::Heartbeat, true, 100_000, TTL).unwrap();
        assert_eq!(b.heartbeat_at_ms, Some(100_000));
        assert_eq!(
            b.apply(LeaseEvent::Expire, false, 100_001, TTL),
            Err(ErrorCode::Conflict)
        );
    }

    #[test]
    fn stale_token_calls_are_claim_lost_and_change_nothing() {
        let a = claimed(0);
        for ev in [
            LeaseEvent::Heartbeat,
            LeaseEvent::Release,
            LeaseEvent::Settle(SettleState::Done),
            LeaseEvent::Settle(SettleState::Blocked),
        ] {
            assert_eq!(a.apply(ev, false, 1, TTL), Err(ErrorCode::ClaimLost));
        }
        let settled = a
            .apply(LeaseEvent::Settle(SettleState::Done), true, 1, TTL)
            .unwrap();
        assert_eq!(
            settled.apply(LeaseEvent::Settle(SettleState::Done), true, 2, TTL),
            Err(ErrorCode::ClaimLost),
            "settling releases the token"
        );
    }

    #[test]
    fn current_token_on_an_item_paused_elsewhere_is_state_conflict() {
        let paused = claimed(0).apply(LeaseEvent::Pause, false, 1, TTL).unwrap();
        assert_eq!(
            paused.apply(LeaseEvent::Settle(SettleState::Done), true, 2, TTL),
            Err(ErrorCode::StateConflict)
        );
        assert_eq!(
            paused.apply(LeaseEvent::Settle(SettleState::Done), false, 2, TTL),
            Err(ErrorCode::ClaimLost)
        );
        let resumed = paused.apply(LeaseEvent::Resume, false, 3, TTL).unwrap();
        assert_eq!(resumed.epoch, paused.epoch + 1);
    }

    #[test]
    fn a_cancel_fails_any_item_not_ended_and_its_holder_then_gets_state_conflict() {
        let open = LeaseItem::new(DEFAULT_MAX_REDELIVERIES);
        let running = claimed(0);
        let paused = running.apply(LeaseEvent::Pause, false, 1, TTL).unwrap();
        for (before, holder) in [(open, false), (running, true), (paused, true)] {
            let after = before.apply(LeaseEvent::Cancel, false, 2, TTL).unwrap();
            assert_eq!(after.state, ItemState::Failed);
            assert_eq!(
                (after.epoch, after.attempts),
                (before.epoch, before.attempts),
                "no attempt counted, no new epoch"
            );
            for event in [
                LeaseEvent::Heartbeat,
                LeaseEvent::Release,
                LeaseEvent::Settle(SettleState::Done),
            ] {
                let want = if holder {
                    ErrorCode::StateConflict
                } else {
                    ErrorCode::ClaimLost
                };
                assert_eq!(after.apply(event, true, 3, TTL), Err(want), "{event:?}");
            }
            assert_eq!(
                after.apply(LeaseEvent::Claim, false, 3, TTL),
                Err(ErrorCode::Conflict),
                "a cancelled item is never claimed"
            );
            assert_eq!(
                after.apply(LeaseEvent::Expire, false, 1_000_000, TTL),
                Err(ErrorCode::Conflict),
                "nor taken over"
            );
        }
        for state in [SettleState::Done, SettleState::Failed] {
            let ended = running
                .apply(LeaseEvent::Settle(state), true, 1, TTL)
                .unwrap();
            assert_eq!(
                ended.apply(LeaseEvent::Cancel, false, 2, TTL),
                Err(ErrorCode::Conflict)
            );
        }
        let blocked = running
            .apply(LeaseEvent::Settle(SettleState::Blocked), true, 1, TTL)
            .unwrap();
        let cancelled = blocked.apply(LeaseEvent::Cancel, false, 2, TTL).unwrap();
        assert_eq!(cancelled.state, ItemState::Failed);
    }

    #[test]
    fn an_item_is_delivered_once_plus_its_redeliveries_then_fails_with_retry_limit() {
        let mut item = LeaseItem::new(DEFAULT_MAX_REDELIVERIES);
        let mut now = 0;
        let mut deliveries = 0;
        while item.state == ItemState::Open {
            item = item.apply(LeaseEvent::Claim, false, now, TTL).unwrap();
            deliveries += 1;
            now += 90_000;
            item = item.apply(LeaseEvent::Expire, false, now, TTL).unwrap();
            assert_eq!(item.attempts, deliveries);
        }
        assert_eq!(
            deliveries,
            1 + DEFAULT_MAX_REDELIVERIES,
            "first delivery + 5"
        );
        assert_eq!((item.state, item.epoch), (ItemState::Failed, 6));
        // The boundary itself: the 5th ended attempt still reopens, the 6th fails.
        assert_eq!(end_attempt(4, 5), (ItemState::Open, 5, "expired"));
        assert_eq!(
            end_attempt(5, 5),
            (ItemState::Failed, 6, RETRY_LIMIT_REASON)
        );
        assert_eq!(
            end_attempt(0, 0),
            (ItemState::Failed, 1, RETRY_LIMIT_REASON)
        );
        assert_eq!(
            item.apply(LeaseEvent::Claim, false, now, TTL),
            Err(ErrorCode::Conflict)
        );
    }

    #[test]
    fn wire_types_use_the_documented_field_names() {
        let lease = Lease {
            token: "t".into(),
            epoch: 3,
            ttl_ms: TTL,
            heartbeat_ms: DEFAULT_HEARTBEAT_MS,
        };
        let json = serde_json::to_value(&lease).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"token": "t", "epoch": 3, "ttl_ms": 90000, "heartbeat_ms": 15000})
        );
        let settle: SettleRequest =
            serde_json::from_str(r#"{"token":"t","state":"paused"}"#).unwrap();
        assert_eq!(settle.state, SettleState::Paused);
        assert!(serde_json::from_str::<SettleRequest>(r#"{"token":"t","state":"open"}"#).is_err());
    }
}
