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

/// The module's allocator: talc (<https://github.com/SFBdragon/talc>) in
/// place of Rust's default dlmalloc on wasm32 — a well-kept crate whose
/// single-threaded wasm build is smaller and faster than dlmalloc (its own
/// wasm benchmarks; the size is measured in BENCHMARKS.md). It grows the
/// module's linear memory with `memory.grow` as dlmalloc does. Behind the
/// default-on `talc` feature, so a crate embedding this one can declare its
/// own allocator.
#[cfg(all(
    feature = "talc",
    target_arch = "wasm32",
    not(target_feature = "atomics")
))]
#[global_allocator]
static ALLOCATOR: talc::wasm::WasmDynamicTalc = talc::wasm::new_wasm_dynamic_allocator();

pub use api::AgentStore;
pub use error::StoreError;

/// Installs `console_error_panic_hook` in debug builds with the
/// `debug-panics` feature; release builds never panic by construction.
#[cfg(feature = "debug-panics")]
#[wasm_bindgen::prelude::wasm_bindgen(start)]
pub fn start() {
    console_error_panic_hook::set_once();
}
