//! Command-line configuration (also built by tests with [`Config::for_tests`]).
//!
//! Every numeric flag has a documented range, checked when the flag is parsed
//! (its error names the flag), and [`Config::validate`] checks what one flag
//! cannot know alone (`--heartbeat-ms` below `--ttl-ms`, two listeners on one
//! address). [`Server::start`](crate::Server::start) runs [`Config::validate`]
//! too, so a configuration built in code is held to the same ranges.

use std::net::{IpAddr, SocketAddr};
use std::ops::RangeInclusive;
use std::path::PathBuf;

use agentstore_protocol::lease::{
    DEFAULT_HEARTBEAT_MS, DEFAULT_MAX_REDELIVERIES, DEFAULT_REAPER_MS, DEFAULT_TTL_MS,
};
use clap::{CommandFactory, Parser};

use crate::metrics::QUEUE_STATS_TIMEOUT_MS;
use crate::ratelimit::Rate;
use crate::routes::MAX_REDELIVERIES_LIMIT;
use crate::store::Settings;

/// One day in ms: the longest lease TTL, heartbeat, reaper interval and
/// access token lifetime accepted (longer would mean a lost worker holds its
/// item, or a leaked token works, for days).
const DAY_MS: u64 = 24 * 3600 * 1000;

/// `--ttl-ms`: at least 100 ms (a lease has to outlive a request).
pub const TTL_MS: RangeInclusive<u64> = 100..=DAY_MS;
/// `--heartbeat-ms`: at least 10 ms, and below `--ttl-ms` (see [`Config::validate`]).
pub const HEARTBEAT_MS: RangeInclusive<u64> = 10..=DAY_MS;
/// `--reaper-ms`: at least 10 ms (0 made the reaper loop every millisecond).
pub const REAPER_MS: RangeInclusive<u64> = 10..=DAY_MS;
/// `--max-redeliveries`: as an enqueue body's `max_redeliveries`.
pub const MAX_REDELIVERIES: RangeInclusive<u32> = 0..=MAX_REDELIVERIES_LIMIT;
/// `--max-body-bytes`: 1 KiB to 64 MiB.
pub const MAX_BODY_BYTES: RangeInclusive<u64> = 1024..=64 * 1024 * 1024;
/// `--access-ttl-ms`: 1 s to one day (the expiry is computed in SQL as the
/// database clock plus this, which must not overflow 64 bits).
pub const ACCESS_TTL_MS: RangeInclusive<u64> = 1000..=DAY_MS;
/// `--db-pool`: 0 (the backend's default) to 1000 connections.
pub const DB_POOL: RangeInclusive<u32> = 0..=1000;
/// `--idle-retry-ms`: 1 ms to one hour.
pub const IDLE_RETRY_MS: RangeInclusive<u64> = 1..=3600 * 1000;
/// `--read-timeout-ms`: 100 ms to one hour.
pub const READ_TIMEOUT_MS: RangeInclusive<u64> = 100..=3600 * 1000;
/// `--retention-ms`: 0 (keep settled items for good) or one minute to ten
/// years, and not below `--ttl-ms` (see [`Config::validate`]).
pub const RETENTION_MS: RangeInclusive<u64> = 0..=3650 * DAY_MS;
/// The shortest `--retention-ms` other than 0.
pub const MIN_RETENTION_MS: u64 = 60 * 1000;
/// `--metrics-read-timeout-ms`: 100 ms to 10 minutes.
pub const METRICS_READ_TIMEOUT_MS: RangeInclusive<u64> = 100..=600 * 1000;

/// `agentstore-server`: the agentstore lease server and demo host.
#[derive(Debug, Clone, Parser)]
#[command(
    version,
    about,
    after_help = "SIGTERM or SIGINT stops the server gracefully: new connections are refused \
at once, requests in flight are answered (for at most --read-timeout-ms plus 30 s), database \
statements still running get 10 s more, and the process exits 0. A second signal during \
that wait, more than 1 s after the first, exits at once (status 130)."
)]
pub struct Config {
    /// Address to listen on (`127.0.0.1:0` picks a free port).
    #[arg(long, default_value = "127.0.0.1:8787")]
    pub listen: SocketAddr,
    /// `postgres://…` for PostgreSQL; an SQLite file path or `sqlite://` URL otherwise
    /// (the file is created if missing). On PostgreSQL each connection gets
    /// `lock_timeout` 5 s and `statement_timeout` 60 s unless set already (server
    /// configuration, role, database, or the URL's `options`, e.g.
    /// `?options=-c%20statement_timeout%3D0`; an explicit 0 is kept; a lock wait
    /// is part of a statement, so `statement_timeout` bounds it too).
    #[arg(long, default_value = "agentstore.sqlite")]
    pub database: String,
    /// Directory served at `/` (the demo page).
    #[arg(long, default_value = "www")]
    pub www: PathBuf,
    /// Directory served at `/pkg/` (wasm-pack output).
    #[arg(long, default_value = "pkg")]
    pub pkg: PathBuf,
    /// Admin bearer token (creates enrollment tokens, enqueues, reads, pauses).
    /// Without it the admin endpoints always answer 401 (403 to a worker's
    /// or producer's token). An empty token, or
    /// one with whitespace, is refused at startup: `Authorization: Bearer `
    /// with nothing after it would otherwise be the admin.
    #[arg(long, env = "AGENTSTORE_ADMIN_TOKEN", hide_env_values = true, value_parser = admin_token_arg)]
    pub admin_token: Option<String>,
    /// Origins allowed by CORS (repeat or comma-separate); none → no CORS headers.
    /// `scheme://host:*` allows that scheme and host on any port (e.g.
    /// `http://127.0.0.1:*` for a test runner on a random loopback port).
    /// Each entry must be an origin as a browser sends it (lower case, no
    /// path, no default port; any scheme; or `null`): one no `Origin` header
    /// could equal is refused at startup.
    #[arg(long, value_delimiter = ',')]
    pub allow_origin: Vec<String>,
    /// Lease TTL from the last heartbeat (ms, 100..=86400000).
    #[arg(long, default_value_t = DEFAULT_TTL_MS, value_parser = clap::value_parser!(u64).range(TTL_MS))]
    pub ttl_ms: u64,
    /// Heartbeat interval suggested to workers (ms, 10..=86400000, below `--ttl-ms`).
    #[arg(long, default_value_t = DEFAULT_HEARTBEAT_MS, value_parser = clap::value_parser!(u64).range(HEARTBEAT_MS))]
    pub heartbeat_ms: u64,
    /// Interval between reaper passes on this instance (ms, 10..=86400000).
    #[arg(long, default_value_t = DEFAULT_REAPER_MS, value_parser = clap::value_parser!(u64).range(REAPER_MS))]
    pub reaper_ms: u64,
    /// Re-deliveries a new item gets after its first delivery (the retry cap):
    /// with 5 an item is delivered at most 6 times, then fails with `retry_limit`
    /// (0..=1000).
    #[arg(long, default_value_t = DEFAULT_MAX_REDELIVERIES, value_parser = clap::value_parser!(u32).range(i64::from(*MAX_REDELIVERIES.start())..=i64::from(*MAX_REDELIVERIES.end())))]
    pub max_redeliveries: u32,
    /// Claim polling limit per worker per server instance: `20/s`, `600/min`,
    /// `5/100ms`. Each instance counts in its own memory (no shared state, no
    /// database round trip), so a worker spread over n instances may claim up
    /// to n times this rate in all.
    #[arg(long, default_value = "10/s")]
    pub claim_rate: Rate,
    /// Enroll/refresh limit per client address per instance (these need no
    /// credentials), and apart from it the same limit for tokenless
    /// releases (beacons): `20/s`, `600/min`, `5/100ms`. Past it: `429`
    /// with `Retry-After`.
    #[arg(long, default_value = "20/s")]
    pub auth_rate: Rate,
    /// Largest accepted request body (bytes, 1024..=67108864).
    #[arg(long, default_value_t = 64 * 1024, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(MAX_BODY_BYTES))]
    pub max_body_bytes: usize,
    /// Access token lifetime (ms, 1000..=86400000).
    #[arg(long, default_value_t = 15 * 60 * 1000, value_parser = clap::value_parser!(u64).range(ACCESS_TTL_MS))]
    pub access_ttl_ms: u64,
    /// Database connections per instance (0 = 4 for SQLite, 10 for PostgreSQL;
    /// at most 1000).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(i64::from(*DB_POOL.start())..=i64::from(*DB_POOL.end())))]
    pub db_pool: u32,
    /// `Retry-After` of a `204` claim answer (ms, rounded up to seconds;
    /// 1..=3600000).
    #[arg(long, default_value_t = 5_000, value_parser = clap::value_parser!(u64).range(IDLE_RETRY_MS))]
    pub idle_retry_ms: u64,
    /// How long a `done` or `failed` item is kept after it settled, with its
    /// result and enqueue `Idempotency-Key` (ms; 0 = for good, the default;
    /// else 60000..=315360000000 and at least `--ttl-ms`). The reaper deletes
    /// older ones (River's `CompletedJobRetentionPeriod`, pg-boss's
    /// `deleteAfter`); open, running, paused and blocked items are never
    /// deleted.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(RETENTION_MS))]
    pub retention_ms: u64,
    /// How long a client may take to send a request's headers, and then its
    /// whole body (ms, 100..=3600000). Past it the connection is closed
    /// (headers; this also ends a keep-alive connection left idle that long)
    /// or the request is answered `400 bad_request` and the connection
    /// closed (body). A response the client stops reading is cut off once
    /// a write has made no progress for as long (nginx's `send_timeout`).
    /// It bounds how long
    /// a client without credentials can hold a connection, and with it a
    /// file descriptor, open (the "slowloris" attack; nginx's
    /// `client_header_timeout` and `client_body_timeout`, 60 s each). A
    /// stop waits for requests in flight at most this long plus 30 s.
    #[arg(long, default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(READ_TIMEOUT_MS))]
    pub read_timeout_ms: u64,
    /// Also serve `GET /metrics` WITHOUT a token on this address. Without
    /// it, `/metrics` exists only on `--listen`, behind the admin token. A
    /// loopback address (`127.0.0.1`, `::1`) is accepted as is; any other
    /// (a private interface a Prometheus scraper reaches, `0.0.0.0`) only
    /// with `--metrics-public`, since whoever reaches it reads queue names
    /// and gauges.
    #[arg(long)]
    pub metrics_listen: Option<SocketAddr>,
    /// Allow `--metrics-listen` on a non-loopback address: the operator
    /// states that everyone who can reach it may read the metrics.
    #[arg(long)]
    pub metrics_public: bool,
    /// How long a `/metrics` scrape waits for the queue gauges' database
    /// read (ms, 100..=600000). Past it the scrape still answers, the queue
    /// gauges keep their last values and `agentstore_queue_stats_up` is 0.
    /// Keep it below the scraper's own timeout (Prometheus: 10 s).
    #[arg(long, default_value_t = QUEUE_STATS_TIMEOUT_MS, value_parser = clap::value_parser!(u64).range(METRICS_READ_TIMEOUT_MS))]
    pub metrics_read_timeout_ms: u64,
    /// Host names a loopback listener (`--listen`, `--metrics-listen` on
    /// `127.0.0.1` or `::1`) answers besides loopback addresses (repeat or
    /// comma-separate; `*`: any). A request whose `Host` is anything else
    /// is refused with `403 forbidden`: a web page on another host that
    /// rebinds its DNS name to 127.0.0.1 could otherwise drive this server
    /// and read its answers (DNS rebinding). Giving the flag replaces the
    /// default, so list `localhost` too if it is still wanted. A listener
    /// on any other address (`0.0.0.0`, a LAN address) checks no `Host`.
    #[arg(long, value_delimiter = ',', default_value = "localhost", value_parser = crate::host::allowed_host_arg)]
    pub allowed_host: Vec<String>,
    /// Connections one client address (an IPv6 one by its /64) may hold
    /// open at once on each listener (0: no limit). Past it a new
    /// connection is closed at once. `--read-timeout-ms` bounds how long
    /// one connection is held, not how many: without a cap one client
    /// holding ~1000 idle connections (re-opened as they time out) used up
    /// the process's file descriptors and every other client was refused.
    #[arg(long, default_value_t = 256)]
    pub max_connections_per_ip: usize,
}

/// `--admin-token`: any non-empty text without whitespace (a bearer token is
/// one header word).
fn admin_token_arg(v: &str) -> Result<String, String> {
    if v.is_empty() || v.chars().any(char::is_whitespace) {
        Err("the admin token must be non-empty and contain no whitespace".into())
    } else if !v.bytes().all(|b| b.is_ascii_graphic()) {
        // `Authorization` is read as visible ASCII: a token with any other
        // character could never be presented, and the admin was locked out.
        Err("the admin token must be printable ASCII (a header value cannot carry other characters)".into())
    } else {
        Ok(v.to_owned())
    }
}

/// `value` within `range`, or an error naming `flag`.
fn in_range<T: PartialOrd + std::fmt::Display>(
    flag: &str,
    value: T,
    range: &RangeInclusive<T>,
) -> Result<(), String> {
    if range.contains(&value) {
        Ok(())
    } else {
        Err(format!(
            "{flag} {value} is out of range ({}..={})",
            range.start(),
            range.end()
        ))
    }
}

impl Config {
    /// Parses `args` (the program name first) and runs [`Config::validate`]:
    /// what `main` does. A value out of its flag's range, or flags that
    /// contradict each other, are a [`clap::Error`] naming the flags.
    ///
    /// # Errors
    /// The arguments do not parse, or do not validate.
    pub fn from_args<I, T>(args: I) -> Result<Config, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let config = Config::try_parse_from(args)?;
        config.validate().map_err(|message| {
            Config::command().error(clap::error::ErrorKind::ArgumentConflict, message)
        })?;
        Ok(config)
    }

    /// Checks every numeric field against its flag's range (fields set in
    /// code skip clap's parser) and the rules between flags: `--heartbeat-ms`
    /// below `--ttl-ms` (a worker told to heartbeat less often than the TTL
    /// loses every lease between two heartbeats), `--retention-ms` 0 or at
    /// least one minute and `--ttl-ms`, and `--metrics-listen` not the
    /// address of `--listen`, and loopback unless `--metrics-public`.
    ///
    /// # Errors
    /// A message naming the flag(s) at fault.
    pub fn validate(&self) -> Result<(), String> {
        in_range("--ttl-ms", self.ttl_ms, &TTL_MS)?;
        in_range("--heartbeat-ms", self.heartbeat_ms, &HEARTBEAT_MS)?;
        in_range("--reaper-ms", self.reaper_ms, &REAPER_MS)?;
        in_range(
            "--max-redeliveries",
            self.max_redeliveries,
            &MAX_REDELIVERIES,
        )?;
        in_range(
            "--max-body-bytes",
            self.max_body_bytes as u64,
            &MAX_BODY_BYTES,
        )?;
        in_range("--access-ttl-ms", self.access_ttl_ms, &ACCESS_TTL_MS)?;
        in_range("--db-pool", self.db_pool, &DB_POOL)?;
        in_range("--idle-retry-ms", self.idle_retry_ms, &IDLE_RETRY_MS)?;
        in_range("--retention-ms", self.retention_ms, &RETENTION_MS)?;
        in_range("--read-timeout-ms", self.read_timeout_ms, &READ_TIMEOUT_MS)?;
        in_range(
            "--metrics-read-timeout-ms",
            self.metrics_read_timeout_ms,
            &METRICS_READ_TIMEOUT_MS,
        )?;
        if self.retention_ms != 0 && self.retention_ms < MIN_RETENTION_MS.max(self.ttl_ms) {
            // A settle or release sent again after a lost answer must still
            // find its item (the SDK retries one while its lease could live).
            return Err(format!(
                "--retention-ms {} is too short: 0 (keep for good), or at least 60000 and \
                 --ttl-ms {}, so that a settle sent again after a lost answer finds its item",
                self.retention_ms, self.ttl_ms
            ));
        }
        if self.heartbeat_ms >= self.ttl_ms {
            return Err(format!(
                "--heartbeat-ms {} must be below --ttl-ms {}: workers heartbeating that \
                 rarely would lose every lease between two heartbeats",
                self.heartbeat_ms, self.ttl_ms
            ));
        }
        crate::app::allow_origin(&self.allow_origin).map(drop)?;
        if let Some(metrics) = self.metrics_listen {
            if metrics == self.listen && metrics.port() != 0 {
                return Err(format!(
                    "--metrics-listen {metrics} is the --listen address: the tokenless \
                     /metrics listener needs an address of its own"
                ));
            }
            if binds_overlap(metrics, self.listen) {
                return Err(format!(
                    "--metrics-listen {metrics} collides with --listen {}: both bind port {} \
                     on the same address (a wildcard covers every address of its family, \
                     [::] both families; an IPv4-mapped address is its IPv4 one); give the \
                     tokenless /metrics listener a port of its own",
                    self.listen,
                    metrics.port()
                ));
            }
            if !metrics.ip().to_canonical().is_loopback() && !self.metrics_public {
                return Err(format!(
                    "--metrics-listen {metrics} is not a loopback address: the tokenless \
                     /metrics listener shows queue names and gauges to whoever reaches \
                     it; add --metrics-public if that is meant"
                ));
            }
        }
        Ok(())
    }

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
            retention_ms: self.retention_ms,
            ..Settings::default()
        }
    }
}

/// Whether binding `a` and `b` (one a listener of this server each) would
/// collide: one port (not 0, which picks a free one) on addresses that
/// overlap. Before, only byte-identical addresses were refused, and
/// `--listen 0.0.0.0:X --metrics-listen 127.0.0.1:X` (or
/// `[::ffff:127.0.0.1]:X` beside `127.0.0.1:X`) passed the check: the
/// server opened and migrated the database, then exited with "Address
/// already in use" naming no flag. An unspecified address covers its
/// family's addresses; `[::]` both families (Linux binds it dual-stack).
fn binds_overlap(a: SocketAddr, b: SocketAddr) -> bool {
    if a.port() != b.port() || a.port() == 0 {
        return false;
    }
    let (x, y) = (a.ip().to_canonical(), b.ip().to_canonical());
    let covers = |u: IpAddr, v: IpAddr| u.is_unspecified() && (u.is_ipv6() || v.is_ipv4());
    x == y || covers(x, y) || covers(y, x)
}
