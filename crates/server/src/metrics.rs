//! Prometheus metrics of one server instance, in the text exposition format.
//!
//! Each [`Server`](crate::Server) owns its own [`prometheus::Registry`], held by
//! its [`Store`]: nothing is registered in a process-wide default, so several
//! servers in one process (the tests run many) count only their own requests.
//!
//! Counters and histograms are updated where the event happens: lease changes
//! in the store as each commits (see [`Store::metrics`]), so that a request
//! whose client goes away mid-call is counted all the same; answers in the
//! handlers and the request middleware [`track`]; takeovers in the reaper.
//! Queue and pool gauges are read at scrape time: queue gauges from
//! [`Store::queue_stats`], the same call behind `GET /v1/queues/{queue}/stats`.
//! A scrape never waits on the database longer than `--metrics-read-timeout-ms`
//! ([`QUEUE_STATS_TIMEOUT_MS`] by default) and never fails for it: when that read fails or times out (the database
//! is down or stalled), the scrape still answers every counter, histogram
//! and pool gauge, the database-read gauges keep their last values, and
//! `agentstore_queue_stats_up` is 0 (node_exporter's `*_up` convention).
//! Names follow the Prometheus conventions
//! (<https://prometheus.io/docs/practices/naming/>): `_total` for counters,
//! base units (`_seconds`) for durations.

use std::sync::Arc;
use std::time::Instant;

use agentstore_protocol::lease::{
    fold_queue_series, ItemState, QueueStats, SettleState, MAX_QUEUE_SERIES, OTHER_QUEUES,
};
use agentstore_protocol::ErrorCode;
use axum::extract::{MatchedPath, Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::Response;
use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};
use tokio::sync::watch;

use crate::store::{Store, StoreError};

/// The passes and calls that count the rows they cannot decode
/// (`agentstore_unreadable_rows_total{by}`).
pub const UNREADABLE_BY: [&str; 10] = [
    "reaper", "list", "claim", "resume", "settle", "release", "pause", "requeue", "cancel", "get",
];

/// How long a scrape waits for the queue gauges' database read by default
/// (`--metrics-read-timeout-ms`; 2 s, as `GET /v1/ready`; Prometheus gives up
/// on a scrape after 10 s by default).
pub const QUEUE_STATS_TIMEOUT_MS: u64 = 2_000;

/// `Content-Type` of the text exposition format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The answer of one queue gauges' read, shared by the scrapes that wait
/// for it: the gauges of every queue and the unreadable rows, or the error.
type StatsRead = Result<Arc<(Vec<QueueStats>, u64)>, Arc<StoreError>>;

/// The metrics of one server instance (see the module docs for the names).
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// Held by a scrape from resetting the scrape-time gauges to encoding
    /// them, so that concurrent scrapes (an HA Prometheus pair, or both
    /// listeners scraped) never gather a half-filled family.
    scrape: std::sync::Mutex<()>,
    /// The queue gauges' database read last started, answered through the
    /// channel when it ends: a scrape that comes while it runs waits for
    /// that answer (within its read timeout) instead of reading again (see
    /// [`Metrics::read_in_flight`]).
    reading: std::sync::Mutex<Option<watch::Receiver<Option<StatsRead>>>>,
    /// Scrapes waiting for a queue gauges' read now (see
    /// [`Metrics::scrapes_waiting`]).
    waiting: std::sync::atomic::AtomicUsize,
    /// Claims committed that handed out an item (answered `201`, unless the
    /// client went away), by queue (see [`Metrics::queue_label`]).
    claims: IntCounterVec,
    /// Claims that found nothing open in the queue (answered `204`), by
    /// queue: under `(other)` for a queue with no label value of its own
    /// (see [`Metrics::claimed`]).
    claims_empty: IntCounterVec,
    /// Leases renewed, by single or batched heartbeat.
    heartbeats: IntCounter,
    /// Settles committed (a replay is none), by queue and the state settled
    /// into.
    settles: IntCounterVec,
    /// `claim_lost` answers, batched heartbeat entries included.
    claim_lost: IntCounter,
    /// `state_conflict` answers, batched heartbeat entries included.
    state_conflict: IntCounter,
    /// `forbidden` answers of the lease fence (a current token of another
    /// worker's lease), batched heartbeat entries included.
    lease_forbidden: IntCounter,
    /// Expired claims the reaper reopened.
    reaper_reopened: IntCounter,
    /// Leases their holder released, committed (a replay is none), by queue.
    releases: IntCounterVec,
    /// Claims answered again under their idempotency key (the lease a
    /// claim whose answer was lost had taken).
    claim_replays: IntCounter,
    /// Copies of a keyed claim refused because a later copy (a higher
    /// `Request-Attempt`) was answered first: requests held up in the network.
    claim_late_copies: IntCounter,
    /// Settled items deleted past `--retention-ms`.
    settled_deleted: IntCounter,
    /// Operator pauses, resumes and requeues committed, by action.
    operator_actions: IntCounterVec,
    /// Items failed by the retry cap (reason `retry_limit`), by the path that did it.
    retry_limit: IntCounterVec,
    /// Rows a pass over many rows could not decode, by the pass: the reaper
    /// (which failed them), a listing or the queue gauges (which left them
    /// out).
    unreadable: IntCounterVec,
    /// `429` answers.
    rate_limited: IntCounter,
    /// `401` and `403` answers, by status.
    auth_rejected: IntCounterVec,
    /// Request latency by method and route template.
    request_duration: HistogramVec,
    /// Answers by method, route template and status code (see
    /// [`code_label`]): the error rate, 5xx included.
    responses: IntCounterVec,
    /// Items added, by queue (see [`Metrics::queue_label`]); an enqueue
    /// answered as a replay of its `Idempotency-Key` is not counted again.
    enqueued: IntCounterVec,
    /// The queues that got a `queue` label value of their own in this
    /// instance's counters, at most [`MAX_QUEUE_SERIES`].
    queue_labels: std::sync::Mutex<std::collections::HashSet<String>>,
    /// Duration of one reaper pass.
    reaper_pass: Histogram,
    /// Items by queue and state (read at scrape time).
    queue_items: IntGaugeVec,
    /// Age of the longest-waiting open item by queue (read at scrape time).
    queue_oldest_open: prometheus::GaugeVec,
    /// Running items across all queues (read at scrape time).
    leases_held: IntGauge,
    /// Item rows the queue gauges left out, an unknown state (read at
    /// scrape time).
    unreadable_items: IntGauge,
    /// 1 when this scrape read the queue gauges from the database, 0 when
    /// that read failed or took longer than the scrape's read timeout.
    queue_stats_up: IntGauge,
    /// Pool connections checked out by this instance.
    pool_in_use: IntGauge,
    /// Pool size limit of this instance.
    pool_max: IntGauge,
}

fn counter(registry: &Registry, name: &str, help: &str) -> IntCounter {
    let c = IntCounter::new(name, help).expect("valid metric name");
    registry.register(Box::new(c.clone())).expect("unique name");
    c
}

fn counter_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric name");
    registry.register(Box::new(c.clone())).expect("unique name");
    c
}

fn gauge(registry: &Registry, name: &str, help: &str) -> IntGauge {
    let g = IntGauge::new(name, help).expect("valid metric name");
    registry.register(Box::new(g.clone())).expect("unique name");
    g
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new()
    }
}

impl Metrics {
    /// A fresh registry with every metric at zero.
    ///
    /// # Panics
    /// Never for the fixed names and labels used here (the registration of a
    /// static name can only fail if the name were invalid or duplicated).
    pub fn new() -> Metrics {
        let r = Registry::new();
        let request_duration = HistogramVec::new(
            HistogramOpts::new(
                "agentstore_http_request_duration_seconds",
                "HTTP request latency by method and route template (s)",
            ),
            &["method", "route"],
        )
        .expect("valid metric name");
        r.register(Box::new(request_duration.clone()))
            .expect("unique name");
        let responses = counter_vec(
            &r,
            "agentstore_http_responses_total",
            "HTTP answers by method, route template and status code",
            &["method", "route", "code"],
        );
        let enqueued = counter_vec(
            &r,
            "agentstore_items_enqueued_total",
            "Items enqueued by queue (a replayed enqueue is not counted again)",
            &["queue"],
        );
        let reaper_pass = Histogram::with_opts(HistogramOpts::new(
            "agentstore_reaper_pass_duration_seconds",
            "Duration of one reaper pass over expired claims (s)",
        ))
        .expect("valid metric name");
        r.register(Box::new(reaper_pass.clone()))
            .expect("unique name");
        let queue_items = IntGaugeVec::new(
            Opts::new("agentstore_queue_items", "Items by queue and state"),
            &["queue", "state"],
        )
        .expect("valid metric name");
        r.register(Box::new(queue_items.clone()))
            .expect("unique name");
        let queue_oldest_open = prometheus::GaugeVec::new(
            Opts::new(
                "agentstore_queue_oldest_open_age_seconds",
                "How long the longest-waiting open item of the queue has been open (s; 0 when none)",
            ),
            &["queue"],
        )
        .expect("valid metric name");
        r.register(Box::new(queue_oldest_open.clone()))
            .expect("unique name");
        let m = Metrics {
            claims: counter_vec(
                &r,
                "agentstore_claims_total",
                "Claims committed that handed out an item, by queue",
                &["queue"],
            ),
            claims_empty: counter_vec(
                &r,
                "agentstore_claims_empty_total",
                "Claims that found nothing open (204), by queue",
                &["queue"],
            ),
            heartbeats: counter(
                &r,
                "agentstore_heartbeats_total",
                "Leases renewed by a heartbeat (single or batched)",
            ),
            settles: counter_vec(
                &r,
                "agentstore_settles_total",
                "Committed settles by queue and the state settled into",
                &["queue", "state"],
            ),
            claim_lost: counter(
                &r,
                "agentstore_claim_lost_total",
                "claim_lost answers (batched heartbeat entries included)",
            ),
            state_conflict: counter(
                &r,
                "agentstore_state_conflict_total",
                "state_conflict answers (batched heartbeat entries included)",
            ),
            lease_forbidden: counter(
                &r,
                "agentstore_lease_forbidden_total",
                "forbidden answers of the lease fence: a worker sent the current token of another worker's lease (batched heartbeat entries included)",
            ),
            reaper_reopened: counter(
                &r,
                "agentstore_reaper_reopened_total",
                "Expired claims the reaper reopened",
            ),
            releases: counter_vec(
                &r,
                "agentstore_releases_total",
                "Leases released by their holder, committed, by queue (a replayed release is not counted again)",
                &["queue"],
            ),
            claim_replays: counter(
                &r,
                "agentstore_claim_replays_total",
                "Claims sent again with their Idempotency-Key that got back the running lease the first one took (its answer lost)",
            ),
            claim_late_copies: counter(
                &r,
                "agentstore_claim_late_copies_total",
                "Copies of a keyed claim refused (409) because a later copy of it, with a higher Request-Attempt, was seen first, including those whose claim was undone (a request held up in the network)",
            ),
            settled_deleted: counter(
                &r,
                "agentstore_settled_items_deleted_total",
                "Done and failed items deleted by the reaper once older than --retention-ms",
            ),
            operator_actions: counter_vec(
                &r,
                "agentstore_operator_actions_total",
                "Operator pauses, resumes and requeues committed, by action",
                &["action"],
            ),
            retry_limit: counter_vec(
                &r,
                "agentstore_retry_limit_failures_total",
                "Items failed by the retry cap (reason retry_limit), by the path that ended the last attempt",
                &["by"],
            ),
            unreadable: counter_vec(
                &r,
                "agentstore_unreadable_rows_total",
                "Rows that could not be decoded, by the pass or call that met them (the reaper, a claim and a resume fail them; a listing leaves them out; a settle, release, pause or get is answered without the item)",
                &["by"],
            ),
            rate_limited: counter(&r, "agentstore_rate_limited_total", "429 answers"),
            auth_rejected: counter_vec(
                &r,
                "agentstore_auth_rejected_total",
                "401 and 403 answers of the credential and role checks, by status (the lease fence's 403 is agentstore_lease_forbidden_total)",
                &["status"],
            ),
            leases_held: gauge(
                &r,
                "agentstore_leases_held",
                "Running items (leases held) across all queues",
            ),
            unreadable_items: gauge(
                &r,
                "agentstore_unreadable_item_rows",
                "Item rows of an unknown state, left out of the queue gauges (read at scrape time)",
            ),
            queue_stats_up: gauge(
                &r,
                "agentstore_queue_stats_up",
                "1 when this scrape read the queue gauges from the database; 0 when that read failed or took over 2 s (those gauges then keep their last values)",
            ),
            pool_in_use: gauge(
                &r,
                "agentstore_db_pool_connections_in_use",
                "Database connections this instance has checked out",
            ),
            pool_max: gauge(
                &r,
                "agentstore_db_pool_connections_max",
                "Database pool size limit of this instance",
            ),
            request_duration,
            responses,
            enqueued,
            queue_labels: std::sync::Mutex::new(std::collections::HashSet::new()),
            reaper_pass,
            queue_items,
            queue_oldest_open,
            registry: r,
            scrape: std::sync::Mutex::new(()),
            reading: std::sync::Mutex::new(None),
            waiting: std::sync::atomic::AtomicUsize::new(0),
        };
        // Every labelled counter series of a fixed label set exists from the
        // start at 0, so that `increase()` in an alert sees its first
        // increment. (The series by queue appear at a queue's first count.)
        for by in ["reaper", "release"] {
            m.retry_limit.with_label_values(&[by]);
        }
        for action in ["pause", "resume", "requeue", "cancel"] {
            m.operator_actions.with_label_values(&[action]);
        }
        for status in ["401", "403"] {
            m.auth_rejected.with_label_values(&[status]);
        }
        for by in UNREADABLE_BY {
            m.unreadable.with_label_values(&[by]);
        }
        m
    }

    /// Claims in `queue` committed: `items` that handed out an item,
    /// `empty` that found nothing open. Only claims that handed out an item
    /// may give `queue` a label value of its own ([`Metrics::queue_label`]):
    /// empty polls are counted under the queue's own value when it has
    /// one (it had an item), else under [`OTHER_QUEUES`]
    /// ([`Metrics::known_queue_label`]), so that polls of queue names that
    /// never had an item (a worker scoped to `*` trying made-up names)
    /// cannot take the slots of the queues that do.
    pub fn claimed(&self, queue: &str, items: u64, empty: u64) {
        if items == 0 && empty == 0 {
            return;
        }
        let label = if items > 0 {
            self.queue_label(queue)
        } else {
            self.known_queue_label(queue)
        };
        self.claims
            .with_label_values(&[label.as_str()])
            .inc_by(items);
        self.claims_empty
            .with_label_values(&[label.as_str()])
            .inc_by(empty);
    }

    /// An item added to `queue` (committed; not a replay).
    pub fn enqueued(&self, queue: &str) {
        self.enqueued
            .with_label_values(&[self.queue_label(queue).as_str()])
            .inc();
    }

    /// The `queue` label value of `queue` in this instance's counters (items
    /// enqueued, claims, settles, releases), for an event that shows the
    /// queue had an item (an empty claim does not: see [`Metrics::claimed`]): the
    /// queue's name for the first [`MAX_QUEUE_SERIES`] queues it counts,
    /// then [`OTHER_QUEUES`] (not a valid queue name) for every other one,
    /// so the series stay bounded whatever names producers use (a counter
    /// series, once created, is kept by the registry for good); the totals
    /// stay exact. Which queues get a name of their own is first come,
    /// first served, per instance (unlike the gauges, which fold the
    /// smallest queues at each scrape).
    pub fn queue_label(&self, queue: &str) -> String {
        let mut seen = self
            .queue_labels
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if seen.contains(queue) {
            return queue.to_owned();
        }
        if seen.len() < MAX_QUEUE_SERIES {
            seen.insert(queue.to_owned());
            return queue.to_owned();
        }
        OTHER_QUEUES.to_owned()
    }

    /// The `queue` label value `queue` already has ([`Metrics::queue_label`]),
    /// else [`OTHER_QUEUES`]; never takes a slot.
    pub fn known_queue_label(&self, queue: &str) -> String {
        let seen = self
            .queue_labels
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if seen.contains(queue) {
            queue.to_owned()
        } else {
            OTHER_QUEUES.to_owned()
        }
    }

    /// `n` leases renewed.
    pub fn renewed(&self, n: u64) {
        self.heartbeats.inc_by(n);
    }

    /// A settle of an item of `queue` into `state` committed.
    pub fn settled(&self, queue: &str, state: SettleState) {
        let label = self.queue_label(queue);
        self.settles
            .with_label_values(&[label.as_str(), ItemState::from(state).as_str()])
            .inc();
    }

    /// An error `code` answered to a client (whole response or batch
    /// entry); `forbidden` only when the lease fence answered it (the
    /// middleware counts a role's in `agentstore_auth_rejected_total`).
    pub fn answered(&self, code: ErrorCode) {
        match code {
            ErrorCode::ClaimLost => self.claim_lost.inc(),
            ErrorCode::StateConflict => self.state_conflict.inc(),
            ErrorCode::Forbidden => self.lease_forbidden.inc(),
            _ => {}
        }
    }

    /// A release of an item of `queue` committed (not a replay).
    pub fn released(&self, queue: &str) {
        self.releases
            .with_label_values(&[self.queue_label(queue).as_str()])
            .inc();
    }

    /// A claim answered again under its idempotency key.
    pub fn claim_replayed(&self) {
        self.claim_replays.inc();
    }

    /// A late copy of a keyed claim refused.
    pub fn claim_late_copy(&self) {
        self.claim_late_copies.inc();
    }

    /// An operator's `action` (`"pause"`, `"resume"`, `"requeue"` or `"cancel"`) committed.
    pub fn operator_action(&self, action: &'static str) {
        self.operator_actions.with_label_values(&[action]).inc();
    }

    /// A row that could not be decoded, met by `by` (one of [`UNREADABLE_BY`]).
    pub fn unreadable_row(&self, by: &'static str) {
        self.unreadable.with_label_values(&[by]).inc();
    }

    /// Items failed by the retry cap; `by` is `"reaper"` or `"release"`.
    pub fn retry_limit_failed(&self, by: &'static str, n: u64) {
        self.retry_limit.with_label_values(&[by]).inc_by(n);
    }

    /// Runs one reaper pass over `store` (`(reopened, failed)`, see
    /// [`Store::reap`]), recording its duration (this process's monotonic
    /// clock: a duration for the histogram only, never a lease time) and what
    /// it took over, also when the pass fails partway (the takeovers it made
    /// are committed and counted).
    ///
    /// # Errors
    /// The pass's own error, passed through.
    pub async fn reaper_pass(&self, store: &Store) -> Result<(usize, usize), StoreError> {
        let started = Instant::now();
        let mut taken = (0, 0);
        let outcome = store.reap_into(&mut taken).await;
        self.reaper_pass.observe(started.elapsed().as_secs_f64());
        self.reaper_reopened.inc_by(taken.0 as u64);
        self.retry_limit_failed("reaper", taken.1 as u64);
        outcome.map(|()| taken)
    }

    /// Deletes the settled items past the retention ([`Store::delete_settled`])
    /// and counts them; returns how many went. A sweep that fails partway
    /// still counts the pages it committed: before, it counted none of them,
    /// and `agentstore_settled_items_deleted_total` fell short of the rows
    /// gone for good.
    ///
    /// # Errors
    /// The database failed (the pages deleted before are counted).
    pub async fn delete_settled(&self, store: &Store) -> Result<u64, StoreError> {
        let mut deleted = 0;
        let outcome = store.delete_settled_into(&mut deleted).await;
        self.settled_deleted.inc_by(deleted);
        outcome.map(|()| deleted)
    }

    /// Reads the gauges from `store` and renders every metric as text. The
    /// queue gauges' database read is bounded by `read_timeout`
    /// (`--metrics-read-timeout-ms`); when it fails or times out, those gauges keep their last values and
    /// `agentstore_queue_stats_up` is 0 (see the module docs).
    ///
    /// # Errors
    /// Only the text encoding (not the database).
    pub async fn render(
        &self,
        store: &Store,
        read_timeout: std::time::Duration,
    ) -> Result<String, StoreError> {
        let mut read = self.read_in_flight(store);
        let waiting = Waiting::on(&self.waiting);
        let read = tokio::time::timeout(read_timeout, async move {
            match read.wait_for(Option::is_some).await {
                Ok(done) => done.clone().ok_or(()),
                // The read's task ended without an answer (it panicked).
                Err(_) => Err(()),
            }
        })
        .await;
        let stats = match read {
            Ok(Ok(Ok(stats))) => Some(Arc::unwrap_or_clone(stats)),
            Ok(Ok(Err(e))) => {
                tracing::warn!(error = %e, "metrics: the queue gauges could not be read");
                None
            }
            Ok(Err(())) => {
                tracing::warn!("metrics: the queue gauges' read failed");
                None
            }
            Err(_) => {
                tracing::warn!(
                    timeout_ms = read_timeout.as_millis() as u64,
                    "metrics: the queue gauges' read did not end in time"
                );
                None
            }
        };
        drop(waiting);
        let (in_use, _, max) = store.pool_usage();
        // No await from here to the end: the lock is a std one.
        let _scrape = self
            .scrape
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        self.pool_in_use.set(i64::from(in_use));
        self.pool_max.set(i64::from(max));
        self.queue_stats_up.set(i64::from(stats.is_some()));
        if let Some((queues, unreadable)) = stats {
            self.set_queue_gauges(fold_queue_series(queues, MAX_QUEUE_SERIES), unreadable);
        }
        TextEncoder::new()
            .encode_to_string(&self.registry.gather())
            .map_err(|e| StoreError::Corrupt(format!("metrics encoding: {e}")))
    }

    /// The queue gauges' read in flight, or a new one started when none is
    /// (single-flight): a scrape that comes while a read runs shares its
    /// answer. Before, it waited for that read and then read again within
    /// its own timeout, so a read taking over half the timeout made every
    /// overlapping scrape (an HA Prometheus pair) answer `up` 0 against a
    /// healthy database. The read runs in a task of its own, which outlives
    /// a scrape that stopped waiting for it; one at a time, so a stalled
    /// database ties up one pool connection, not one per scrape.
    fn read_in_flight(&self, store: &Store) -> watch::Receiver<Option<StatsRead>> {
        let mut slot = self
            .reading
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(read) = slot.as_ref() {
            // Not answered yet, and its task still runs (a task that
            // panicked dropped the sender: a new read is started).
            if read.borrow().is_none() && read.has_changed().is_ok() {
                return read.clone();
            }
        }
        let (answer, read) = watch::channel(None);
        let store = store.clone();
        tokio::spawn(async move {
            let read = store
                .queue_stats_and_unreadable(None)
                .await
                .map(Arc::new)
                .map_err(Arc::new);
            answer.send_replace(Some(read));
        });
        *slot = Some(read.clone());
        read
    }

    /// How many scrapes ([`Metrics::render`]) wait for the queue gauges'
    /// database read now: a test that overlaps two scrapes waits until both
    /// wait (the race forced, not hoped for).
    pub fn scrapes_waiting(&self) -> usize {
        self.waiting.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Sets the gauges read from the database (the caller holds `scrape`).
    fn set_queue_gauges(&self, queues: Vec<QueueStats>, unreadable: u64) {
        self.queue_items.reset();
        self.queue_oldest_open.reset();
        let mut running = 0;
        for q in &queues {
            for state in ItemState::ALL {
                let n = i64::try_from(q.count(state)).unwrap_or(i64::MAX);
                self.queue_items
                    .with_label_values(&[q.queue.as_str(), state.as_str()])
                    .set(n);
            }
            let age_ms = q.oldest_open_age_ms.unwrap_or(0);
            self.queue_oldest_open
                .with_label_values(&[q.queue.as_str()])
                .set(age_ms as f64 / 1000.0);
            running += q.running;
        }
        self.leases_held
            .set(i64::try_from(running).unwrap_or(i64::MAX));
        self.unreadable_items
            .set(i64::try_from(unreadable).unwrap_or(i64::MAX));
    }
}

/// One scrape counted in [`Metrics::scrapes_waiting`] while it lives (also
/// when the scrape is dropped mid-wait: its client went away).
struct Waiting<'a>(&'a std::sync::atomic::AtomicUsize);

impl<'a> Waiting<'a> {
    fn on(count: &'a std::sync::atomic::AtomicUsize) -> Self {
        count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Waiting(count)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The `code` label of an answer's status: the code itself for the
/// statuses this server answers (and a few a proxy or client might make
/// it see), else its class (`2xx` … `5xx`, `other`), so the label set stays
/// small and fixed.
fn code_label(status: axum::http::StatusCode) -> &'static str {
    const EXACT: [&str; 22] = [
        "200", "201", "204", "206", "304", "400", "401", "403", "404", "405", "408", "409", "411",
        "413", "415", "416", "422", "429", "500", "502", "503", "504",
    ];
    let code = status.as_str();
    if let Some(known) = EXACT.iter().find(|c| **c == code) {
        return known;
    }
    match status.as_u16() / 100 {
        2 => "2xx",
        3 => "3xx",
        4 => "4xx",
        5 => "5xx",
        _ => "other",
    }
}

/// Middleware: request latency by route template and the status-derived
/// counters (`429`, `401`/`403`, and the error code an [`ApiError`](crate::ApiError)
/// left in the response's extensions).
pub async fn track(State(metrics): State<Arc<Metrics>>, req: Request, next: Next) -> Response {
    // Label values stay a small fixed set: the route TEMPLATE (never the raw
    // path, which holds ids and queue names) and the standard methods only.
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "other".to_owned(), |p| p.as_str().to_owned());
    let method = match *req.method() {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::PATCH => "PATCH",
        _ => "other",
    };
    let started = Instant::now();
    let resp = next.run(req).await;
    metrics
        .request_duration
        .with_label_values(&[method, route.as_str()])
        .observe(started.elapsed().as_secs_f64());
    metrics
        .responses
        .with_label_values(&[method, route.as_str(), code_label(resp.status())])
        .inc();
    // A store refusal (the lease fence) is no credential or role refusal.
    let fenced = resp.extensions().get::<crate::error::Fenced>().is_some();
    match resp.status().as_u16() {
        401 => metrics.auth_rejected.with_label_values(&["401"]).inc(),
        403 if !fenced => metrics.auth_rejected.with_label_values(&["403"]).inc(),
        429 => metrics.rate_limited.inc(),
        _ => {}
    }
    if let Some(code) = resp.extensions().get::<ErrorCode>() {
        if fenced || *code != ErrorCode::Forbidden {
            metrics.answered(*code);
        }
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Enqueues into more queues than get series of their own: the first
    /// [`MAX_QUEUE_SERIES`] keep their name, the rest are counted under
    /// [`OTHER_QUEUES`], and the total stays exact.
    #[test]
    fn the_enqueue_counters_queue_label_is_bounded() {
        let m = Metrics::new();
        let extra = 7;
        for k in 0..MAX_QUEUE_SERIES + extra {
            m.enqueued(&format!("q{k}"));
        }
        m.enqueued("q0");
        let families = m.registry.gather();
        let family = families
            .iter()
            .find(|f| f.name() == "agentstore_items_enqueued_total")
            .expect("the family");
        let series: Vec<(String, f64)> = family
            .get_metric()
            .iter()
            .map(|s| {
                (
                    s.get_label()[0].value().to_owned(),
                    s.get_counter().get_value(),
                )
            })
            .collect();
        assert_eq!(series.len(), MAX_QUEUE_SERIES + 1);
        let of = |q: &str| series.iter().find(|(l, _)| l == q).map(|(_, v)| *v);
        assert_eq!(of("q0"), Some(2.0));
        assert_eq!(of(OTHER_QUEUES), Some(extra as f64));
        assert_eq!(of(&format!("q{MAX_QUEUE_SERIES}")), None);
        let total: f64 = series.iter().map(|(_, v)| v).sum();
        assert_eq!(total, (MAX_QUEUE_SERIES + extra + 1) as f64);
    }
}
