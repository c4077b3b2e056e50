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

/// `parts` joined with nothing between them, as `parts.concat()` gives them.
///
/// Messages are built with this instead of `[..].concat()`: std's
/// `join_generic_copy` behind `concat` is 877 bytes of wasm with its
/// specialised separator copies, this loop a tenth of that.
pub fn cat(parts: &[&str]) -> String {
    let mut s = String::with_capacity(parts.iter().map(|p| p.len()).sum());
    for p in parts {
        s.push_str(p);
    }
    s
}
