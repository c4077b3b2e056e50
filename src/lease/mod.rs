//! Work leases, browser side: claim an item, heartbeat it, settle it — and
//! never keep acting on a claim that is lost.
//!
//! - [`client::ClientInner`]: configuration, the registry of held leases,
//!   `close()`; [`credentials`] (enrollment, refresh on `401`), [`claims`]
//!   (claim, lock, journal), [`heartbeat`] (the loop: ONE batched request per
//!   pass, never awaited by the loop), [`recovery`] (`recover()`).
//! - [`lease::LeaseInner`]: one lease: its `AbortSignal` (aborted with a
//!   `ClaimLostError` whose `reason` is `claim_lost`, `expired_locally` or
//!   `released`), `heartbeat`, `settle`, `release`, and the epoch-fencing
//!   pattern for your own writes.
//! - [`work::WorkerInner`]: the `work()` loop.
//! - [`journal`]: held leases in IndexedDB, reconciled by `recover()`.
//! - [`lifecycle`]: `pagehide` beacons and Web Locks.
//!
//! Time: only durations, on `http::now_ms` (`performance.now()` plus the time
//! the machine was suspended). A lease is held exactly while
//! `now < sent_at(last successful heartbeat) + ttl − margin`; the rules and the
//! loop's scheduling live in `agentstore_protocol::lease_client` and are
//! property-tested natively against a simulated clock.

pub mod claims;
pub mod client;
pub mod credentials;
pub mod error;
pub mod heartbeat;
pub mod http;
pub mod journal;
#[allow(clippy::module_inception)]
pub mod lease;
pub mod lifecycle;
pub mod recovery;
pub mod wire;
pub mod work;

pub use claims::Claimed;
pub use client::{ClientConfig, ClientInner};
pub use credentials::Credentials;
pub use error::{LeaseError, LossReason};
pub use lease::{LeaseInner, Status};
pub use recovery::Recovery;
pub use work::{Stats, WorkOptions, WorkerInner};
