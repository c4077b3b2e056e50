//! `agentstore-server`: the reference lease server for agentstore.
//!
//! Work items live in queues; workers claim them under fenced leases measured on
//! the database clock, heartbeat them, and settle them. SQLite (embedded, the
//! default) and PostgreSQL (shared by several instances) run the same SQL through
//! one [`store::Store`]. The protocol — wire types, error codes, the lease state
//! machine — lives in `agentstore-protocol`.
//!
//! Start one in-process (as the tests do):
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use agentstore_server::{Config, Server};
//! let server = Server::start(&Config::for_tests("demo.sqlite", "admin-secret")).await?;
//! println!("listening on {}", server.url());
//! server.stop().await?;
//! # Ok(()) }
//! ```

pub mod app;
pub mod auth;
pub mod authcache;
pub mod config;
pub mod drain;
pub mod error;
pub mod extract;
pub mod host;
pub mod metrics;
pub mod ops;
pub mod ratelimit;
pub mod reaper;
pub mod routes;
pub mod state;
pub mod store;
pub mod tokens;
pub mod wire;

pub use app::{Server, StartError};
pub use config::Config;
pub use error::ApiError;
pub use store::{Attempt, Settings, Store, StoreError};
