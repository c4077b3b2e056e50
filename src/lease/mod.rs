//! Work leases, browser side: claim an item, heartbeat it, settle it — and
//! never keep acting on a claim that is lost.
//!
//! - [`client::ClientInner`]: credentials (enrollment, refresh on `401`),
//!   claims, ONE batched heartbeat request per pass for every held lease, the
//!   journal and `pagehide` release.
//! - [`lease::LeaseInner`]: one lease: its `AbortSignal` (aborted with a
//!   `ClaimLostError` whose `reason` is `claim_lost`, `expired_locally` or
//!   `released`), `heartbeat`, `settle`, `release`, and the epoch-fencing
//!   pattern for your own writes.
//! - [`work::WorkerInner`]: the `work()` loop.
//! - [`journal`]: held leases in IndexedDB, reconciled by `recover()`.
//! - [`lifecycle`]: `pagehide` beacons and Web Locks.
//!
//! Time: only `performance.now()` durations. The local deadline of a lease is
//! `sent_at(last successful heartbeat) + ttl − margin`; the rules live in
//! `agentstore_protocol::lease_client` and are tested natively.

pub mod client;
pub mod error;
pub mod http;
pub mod journal;
#[allow(clippy::module_inception)]
pub mod lease;
pub mod lifecycle;
pub mod work;

pub use client::{Claimed, ClientConfig, ClientInner, Credentials, Recovery};
pub use error::{LeaseError, LossReason};
pub use lease::{LeaseInner, Status};
pub use work::{Stats, WorkOptions, WorkerInner};
