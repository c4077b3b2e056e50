//! Pure rules shared by the agentstore SDK (wasm) and the lease server.
//!
//! Nothing here touches a browser, a clock or a database: time and randomness
//! come in as arguments so every rule is tested with plain `cargo test`.

pub mod backoff;
pub mod canonical;
pub mod error;
pub mod index;
pub mod keys;
pub mod lease;
pub mod lease_client;
pub mod pouch;
pub mod record;
pub mod rev;
pub mod vecmap;

pub use error::{ErrorBody, ErrorCode};
