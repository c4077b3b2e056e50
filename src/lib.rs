//! agentstore: agent-record storage in IndexedDB with revisions,
//! compare-and-swap writes, exact prefix listing and derived indexes, plus
//! fenced work leases — a Rust → WebAssembly SDK for web apps.
//!
//! The JS API is [`api::AgentStore`] and, with the default `lease` feature,
//! `lease_api::LeaseClient`; the pure rules both follow live in the
//! `agentstore-protocol` crate. Build with `--no-default-features` for a
//! store-only package (smaller: see BENCHMARKS.md).

pub mod api;
pub mod error;
#[cfg(feature = "lease")]
pub mod lease;
#[cfg(feature = "lease")]
pub mod lease_api;
mod options;
pub mod store;
pub mod value;

pub use api::AgentStore;
pub use error::StoreError;

/// Installs `console_error_panic_hook` in debug builds with the
/// `debug-panics` feature; release builds never panic by construction.
#[cfg(feature = "debug-panics")]
#[wasm_bindgen::prelude::wasm_bindgen(start)]
pub fn start() {
    console_error_panic_hook::set_once();
}
