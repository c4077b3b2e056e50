//! Command-line configuration (also built by tests with [`Config::for_tests`]).

use std::net::SocketAddr;
use std::path::PathBuf;

use agentstore_protocol::lease::{
    DEFAULT_HEARTBEAT_MS, DEFAULT_MAX_REDELIVERIES, DEFAULT_REAPER_MS, DEFAULT_TTL_MS,
};
use clap::Parser;

use crate::ratelimit::Rate;
use crate::store::Settings;

/// `agentstore-server`: the agentstore lease server and demo host.
#[derive(Debug, Clone, Parser)]
#[command(version, about)]
pub struct Config {
    /// Address to listen on (`127.0.0.1:0` picks a free port).
    #[arg(long, default_value = "127.0.0.1:8787")]
    pub listen: SocketAddr,
    /// `postgres://…` for PostgreSQL; an SQLite file path or `sqlite://` URL otherwise
    /// (the file is created if missing).
    #[arg(long, default_value = "agentstore.sqlite")]
    pub database: String,
    /// Directory served at `/` (the demo page).
    #[arg(long, default_value = "www")]
    pub www: PathBuf,
    /// Directory served at `/pkg/` (wasm-pack output).
    #[arg(long, default_value = "pkg")]
    pub pkg: PathBuf,
    /// Admin bearer token (creates enrollment tokens, enqueues, reads, pauses).
    /// Without it the admin endpoints always answer 401. An empty token, or
    /// one with whitespace, is refused at startup: `Authorization: Bearer `
    /// with nothing after it would otherwise be the admin.
    #[arg(long, env = "AGENTSTORE_ADMIN_TOKEN", hide_env_values = true, value_parser = admin_token_arg)]
    pub admin_token: Option<String>,
    /// Origins allowed by CORS (repeat or comma-separate); none → no CORS headers.
    /// `scheme://host:*` allows that scheme and host on any port (e.g.
    /// `http://127.0.0.1:*` for a test runner on a random loopback port).
    #[arg(long, value_delimiter = ',')]
    pub allow_origin: Vec<String>,
    /// Lease TTL from the last heartbeat (ms).
    #[arg(long, default_value_t = DEFAULT_TTL_MS)]
    pub ttl_ms: u64,
    /// Heartbeat interval suggested to workers (ms).
    #[arg(long, default_value_t = DEFAULT_HEARTBEAT_MS)]
    pub heartbeat_ms: u64,
    /// Interval between reaper passes on this instance (ms).
    #[arg(long, default_value_t = DEFAULT_REAPER_MS)]
    pub reaper_ms: u64,
    /// Re-deliveries a new item gets after its first delivery (the retry cap):
    /// with 5 an item is delivered at most 6 times, then fails with `retry_limit`.
    #[arg(long, default_value_t = DEFAULT_MAX_REDELIVERIES)]
    pub max_redeliveries: u32,
    /// Claim polling limit per worker: `20/s`, `600/min`, `5/100ms`.
    #[arg(long, default_value = "10/s")]
    pub claim_rate: Rate,
    /// Enroll/refresh limit per client address (these need no credentials):
    /// `20/s`, `600/min`, `5/100ms`. Past it: `429` with `Retry-After`.
    #[arg(long, default_value = "20/s")]
    pub auth_rate: Rate,
    /// Largest accepted request body (bytes).
    #[arg(long, default_value_t = 64 * 1024)]
    pub max_body_bytes: usize,
    /// Access token lifetime (ms).
    #[arg(long, default_value_t = 15 * 60 * 1000)]
    pub access_ttl_ms: u64,
    /// Database connections per instance (0 = 4 for SQLite, 10 for PostgreSQL).
    #[arg(long, default_value_t = 0)]
    pub db_pool: u32,
    /// `Retry-After` of a `204` claim answer (ms, rounded up to seconds).
    #[arg(long, default_value_t = 5_000)]
    pub idle_retry_ms: u64,
    /// Also serve `GET /metrics` WITHOUT a token on this address (e.g. a
    /// private interface a Prometheus scraper reaches). Without it, `/metrics`
    /// exists only on `--listen`, behind the admin token.
    #[arg(long)]
    pub metrics_listen: Option<SocketAddr>,
}

/// `--admin-token`: any non-empty text without whitespace (a bearer token is
/// one header word).
fn admin_token_arg(v: &str) -> Result<String, String> {
    if v.is_empty() || v.chars().any(char::is_whitespace) {
        Err("the admin token must be non-empty and contain no whitespace".into())
    } else {
        Ok(v.to_owned())
    }
}

impl Config {
    /// Defaults for `database`, listening on `127.0.0.1:0`, with `admin_token`.
    pub fn for_tests(database: &str, admin_token: &str) -> Config {
        let mut c = Config::parse_from(["agentstore-server", "--listen", "127.0.0.1:0"]);
        c.database = database.to_owned();
        c.admin_token = Some(admin_token.to_owned());
        c
    }

    /// The store settings these flags select.
    pub fn settings(&self) -> Settings {
        Settings {
            ttl_ms: self.ttl_ms,
            heartbeat_ms: self.heartbeat_ms,
            max_redeliveries: self.max_redeliveries,
            access_ttl_ms: self.access_ttl_ms,
            pool_size: self.db_pool,
            ..Settings::default()
        }
    }
}
