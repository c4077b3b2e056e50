//! Router assembly and the running server handle.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, Request};
use axum::http::{header, HeaderName, HeaderValue, Method};
use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tower::ServiceBuilder;
use tower_http::cors::{AllowOrigin, CorsLayer};
use tower_http::request_id::{
    MakeRequestId, PropagateRequestIdLayer, RequestId, SetRequestIdLayer,
};
use tower_http::services::ServeDir;
use tower_http::trace::TraceLayer;

use crate::config::Config;
use crate::drain::{Linger, Lingering};
use crate::error::json_errors;
use crate::metrics;
use crate::ratelimit::RateLimiter;
use crate::state::AppState;
use crate::store::{Store, StoreError};
use crate::{ops, reaper, routes, tokens};

/// The request id header: taken from the request when a proxy set one,
/// otherwise a fresh UUID; echoed on the response and recorded in the
/// request's tracing span.
pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The state every handler shares, built from the flags; its metrics are the
/// store's (see [`Store::metrics`]).
pub fn state(config: &Config, store: Store) -> AppState {
    AppState {
        metrics: store.metrics().clone(),
        store,
        admin_hash: config
            .admin_token
            .as_deref()
            .filter(|t| !t.is_empty())
            .map(tokens::hash),
        auth_cache: Arc::default(),
        claim_limiter: Arc::new(RateLimiter::new(config.claim_rate)),
        auth_limiter: Arc::new(RateLimiter::new(config.auth_rate)),
        beacon_limiter: Arc::new(RateLimiter::new(config.auth_rate)),
        idle_retry_ms: config.idle_retry_ms,
        metrics_read_timeout: std::time::Duration::from_millis(config.metrics_read_timeout_ms),
    }
}

/// Builds the whole application: `/v1` API, `/metrics` (admin), `/pkg/` and
/// `/` static files, CORS, body limit, metrics and request tracing with a
/// request id.
///
/// # Errors
/// An `--allow-origin` value is not a valid header value.
pub fn router(config: &Config, state: AppState) -> Result<Router, String> {
    let cors = CorsLayer::new()
        .allow_origin(allow_origin(&config.allow_origin)?)
        .allow_methods([Method::GET, Method::POST])
        .allow_headers([
            header::AUTHORIZATION,
            header::CONTENT_TYPE,
            HeaderName::from_static(crate::routes::IDEMPOTENCY_KEY),
            HeaderName::from_static(crate::routes::REQUEST_ATTEMPT),
            // What `lease.fetch`/`prepareRequest` add for the lease server's
            // own origin: without them a page on another origin (the case
            // `--allow-origin` exists for) gets its fenced requests to this
            // origin refused at the preflight.
            HeaderName::from_static("x-lease-token"),
            HeaderName::from_static("x-lease-epoch"),
        ])
        .expose_headers([
            header::RETRY_AFTER,
            REQUEST_ID,
            HeaderName::from_static(crate::routes::IDEMPOTENT_REPLAYED),
        ])
        .max_age(Duration::from_secs(600));
    let metrics = state.metrics.clone();
    let api = routes::router()
        .merge(ops::v1_router())
        .layer(DefaultBodyLimit::max(config.max_body_bytes))
        // A body that does not arrive in time fails its read: the request
        // is answered 400 and the connection closed (see `serve`).
        .layer(axum::Extension(crate::extract::BodyBounds {
            deadline: Duration::from_millis(config.read_timeout_ms),
            limit: config.max_body_bytes,
        }))
        .with_state(state.clone());
    // ServeDir maps `.wasm` to `application/wasm` (mime_guess), which
    // `WebAssembly.instantiateStreaming` requires.
    let app = Router::new()
        .nest("/v1", api)
        .merge(ops::metrics_router().with_state(state))
        .nest_service(
            "/pkg",
            tower::ServiceBuilder::new()
                .map_response(|r| prefix_redirect("/pkg", r))
                .service(ServeDir::new(&config.pkg)),
        )
        .fallback_service(ServeDir::new(&config.www))
        .layer(axum::middleware::from_fn(static_guard))
        .layer(axum::middleware::from_fn(json_errors));
    // The metrics middleware outside CORS: a preflight, which CORS answers
    // itself, is an answer too. Before, none was counted in
    // `agentstore_http_responses_total` nor timed.
    let app = app.layer(cors).layer(axum::middleware::from_fn_with_state(
        metrics,
        metrics::track,
    ));
    Ok(outer(app, config, config.listen))
}

/// Longest path component and path the static files answer for: longer
/// ones cannot name a file (Linux's `NAME_MAX`, `PATH_MAX`), and tower-http's
/// `ServeDir` answered them `500` (`File name too long`) with two ERROR log
/// lines holding the whole path: any client raised the 5xx rate at will.
const NAME_MAX: usize = 255;
const PATH_MAX: usize = 4096;

/// Static paths (not `/v1`, not `/metrics`) that no file can match are `404`
/// before `ServeDir` sees them: a component too long for a file name, or a
/// path starting with `//`, which `ServeDir` redirects to `//dir/`, a
/// scheme-relative URL to the host `dir` (an open redirect).
async fn static_guard(req: Request, next: axum::middleware::Next) -> axum::response::Response {
    use axum::response::IntoResponse;
    let path = req.uri().path();
    let api = path == "/v1" || path.starts_with("/v1/") || path == "/metrics";
    // Lengths of the decoded path (what names the file): a file name of
    // 100 `é` is 200 bytes, 600 characters percent-encoded.
    let decoded_len = |s: &str| percent_encoding::percent_decode_str(s).count();
    if !api
        && (path.starts_with("//")
            || decoded_len(path) > PATH_MAX
            || path.split('/').any(|c| decoded_len(c) > NAME_MAX))
    {
        return axum::http::StatusCode::NOT_FOUND.into_response();
    }
    next.run(req).await
}

/// A `ServeDir` nested under `prefix` redirects `/prefix/dir` to `/dir/`
/// (axum strips the prefix before it sees the path; tokio-rs/axum#1731):
/// puts the prefix back.
fn prefix_redirect<B>(prefix: &str, mut resp: axum::http::Response<B>) -> axum::http::Response<B> {
    if resp.status().is_redirection() {
        if let Some(loc) = resp
            .headers()
            .get(header::LOCATION)
            .and_then(|v| v.to_str().ok())
        {
            // `//dir/` too: `/pkg//dir/` is a path of this server, while
            // `//dir/` left as is would name the host `dir`.
            if loc.starts_with('/') {
                if let Ok(v) = HeaderValue::from_str(&format!("{prefix}{loc}")) {
                    resp.headers_mut().insert(header::LOCATION, v);
                }
            }
        }
    }
    resp
}

/// At most this many characters of the request path and of a client's
/// `X-Request-Id` go into the request span (every log line of the request):
/// the whole of them let any client write ~64 KiB per request into the
/// WARN/ERROR log.
const SPAN_FIELD_MAX: usize = 256;

/// The layers every listener's app gets, outermost last: the `Host` check
/// ([`host_checked`]), then the drain of unread request bodies (see
/// [`crate::drain`]: outside every layer and handler that may answer before
/// reading the body), then request tracing ([`traced`]).
fn outer(app: Router, config: &Config, listen: SocketAddr) -> Router {
    let drain = crate::drain::Drain {
        limit: config.max_body_bytes,
        read_timeout: Duration::from_millis(config.read_timeout_ms),
    };
    traced(
        host_checked(app, config, listen).layer(axum::middleware::from_fn_with_state(
            drain,
            crate::drain::drain_unread,
        )),
    )
}

/// `app` behind the `Host` check when `listen` is a loopback address (see
/// [`crate::host`]); as it is otherwise.
fn host_checked(app: Router, config: &Config, listen: SocketAddr) -> Router {
    if !listen.ip().to_canonical().is_loopback() {
        return app;
    }
    let check = Arc::new(crate::host::HostCheck::new(&config.allowed_host));
    app.layer(axum::middleware::from_fn_with_state(
        check,
        crate::host::check_host,
    ))
}

/// Random (version 4) UUIDs for request ids, drawn from the thread-local
/// CSPRNG (`rand::thread_rng`) instead of one `getrandom` system call per
/// request as tower-http's `MakeRequestUuid` does.
#[derive(Clone, Copy)]
struct FastUuid;

impl MakeRequestId for FastUuid {
    fn make_request_id<B>(&mut self, _: &axum::http::Request<B>) -> Option<RequestId> {
        let id = uuid::Builder::from_random_bytes(rand::random()).into_uuid();
        HeaderValue::from_str(&id.to_string())
            .ok()
            .map(RequestId::new)
    }
}

/// Request tracing: a request id (kept from the request or a new UUID) in
/// every request's span and on its response.
fn traced(app: Router) -> Router {
    app.layer(
        ServiceBuilder::new()
            .layer(SetRequestIdLayer::new(REQUEST_ID, FastUuid))
            .layer(TraceLayer::new_for_http().make_span_with(|req: &Request| {
                let id = req
                    .headers()
                    .get(REQUEST_ID)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("-");
                let clip = |s: &str| -> String { s.chars().take(SPAN_FIELD_MAX).collect() };
                tracing::info_span!(
                    "request",
                    method = %clip(req.method().as_str()),
                    uri = %clip(req.uri().path()),
                    request_id = %clip(id),
                )
            }))
            .layer(PropagateRequestIdLayer::new(REQUEST_ID)),
    )
}

/// The CORS allow-list: exact origins, plus `scheme://host:*` entries that
/// allow that scheme and host on any port (for test runners that serve from a
/// random loopback port, e.g. `http://127.0.0.1:*`).
///
/// # Errors
/// An entry is `*` (tower-http's list panics on it; every origin is not
/// offered: name them) or not a valid header value. Checked by
/// [`Config::validate`], before the database is opened.
pub(crate) fn allow_origin(entries: &[String]) -> Result<AllowOrigin, String> {
    let mut exact = Vec::new();
    let mut any_port = Vec::new();
    for o in entries.iter().map(|o| o.trim()) {
        if o == "*" {
            return Err("--allow-origin \"*\" is not accepted: name each origin \
                        (scheme://host[:port], or scheme://host:* for every port)"
                .into());
        }
        let (origin, every_port) = match o.strip_suffix(":*") {
            Some(prefix) => (prefix, true),
            None => (o, false),
        };
        not_an_origin(origin, every_port).map_or(Ok(()), |why| {
            Err(format!(
                "--allow-origin: {o:?} can never match: {why} (an entry is an origin as a \
                 browser sends it, scheme://host[:port] in lower case with no path, or \
                 scheme://host:* for every port)"
            ))
        })?;
        if let Some(canonical) = canonical_origin(origin).filter(|c| c != origin) {
            let star = if every_port { ":*" } else { "" };
            return Err(format!(
                "--allow-origin: {o:?} can never match: a browser sends this origin as \
                 {canonical}{star} (an IP address in its canonical form); give that"
            ));
        }
        if every_port {
            // "Any port" includes the scheme's default, which a browser
            // leaves out of the origin (`http://127.0.0.1`, not `…:80`).
            exact.push(
                HeaderValue::from_str(origin)
                    .map_err(|_| format!("--allow-origin: bad origin {o:?}"))?,
            );
            any_port.push(format!("{origin}:"));
        } else {
            exact.push(
                HeaderValue::from_str(o)
                    .map_err(|_| format!("--allow-origin: bad origin {o:?}"))?,
            );
        }
    }
    if any_port.is_empty() {
        return Ok(AllowOrigin::list(exact));
    }
    Ok(AllowOrigin::predicate(move |origin: &HeaderValue, _| {
        exact.contains(origin)
            || origin.to_str().is_ok_and(|o| {
                any_port.iter().any(|p| {
                    o.strip_prefix(p.as_str()).is_some_and(|port| {
                        !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit())
                    })
                })
            })
    }))
}

/// How a browser serializes `origin` in its `Origin` header (the WHATWG URL
/// standard's host parser and origin serialization), for `http` and `https`
/// only (the other schemes' origins are opaque there); `None` otherwise or
/// when it does not parse. It differs from an entry [`not_an_origin`]
/// accepts only in an IP address's spelling: `[0:0:0:0:0:0:0:1]` is sent as
/// `[::1]`, `[::ffff:127.0.0.1]` as `[::ffff:7f00:1]`, `0x7f.0.0.1` and
/// `127.1` as `127.0.0.1`.
fn canonical_origin(origin: &str) -> Option<String> {
    if !(origin.starts_with("http://") || origin.starts_with("https://")) {
        return None;
    }
    url::Url::parse(origin)
        .ok()
        .map(|u| u.origin().ascii_serialization())
}

/// Why `origin` (an `--allow-origin` entry, its `:*` taken off when
/// `every_port`) is not an origin a browser could send, or `None`. A browser
/// serializes the `Origin` header as `scheme://host[:port]` (RFC 6454 §6.2,
/// the WHATWG URL standard's origin serialization): the scheme and host in
/// lower case (a host beyond ASCII in its punycode form), no path, no
/// user info, and no port when it is the scheme's default. An entry of any
/// other shape is compared byte for byte and never matches: refused at
/// startup instead of leaving every browser call failing CORS unexplained.
fn not_an_origin(origin: &str, every_port: bool) -> Option<&'static str> {
    // A sandboxed iframe's or a `file:` page's opaque origin.
    if origin == "null" && !every_port {
        return None;
    }
    let Some((scheme, rest)) = origin.split_once("://") else {
        return Some("it has no scheme:// (e.g. https://)");
    };
    // Any scheme (an extension's `chrome-extension://…`, an app shell's
    // `capacitor://localhost`), as RFC 3986 spells one, in lower case.
    let mut letters = scheme.bytes();
    if !letters.next().is_some_and(|b| b.is_ascii_alphabetic())
        || !letters.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'))
    {
        return Some("the scheme is not one (letters, digits, + - .)");
    }
    if scheme.bytes().any(|b| b.is_ascii_uppercase()) {
        return Some("the scheme must be lower case");
    }
    let default_port = match scheme {
        "http" => "80",
        "https" => "443",
        _ => "",
    };
    if rest.contains(['/', '?', '#']) {
        return Some("an origin has no path, query or fragment (no trailing /)");
    }
    if rest.contains('@') {
        return Some("an origin has no user info");
    }
    let (host, port) = match rest.strip_prefix('[') {
        // An IPv6 literal: `[…]`, then the port if any.
        Some(v6) => match v6.split_once(']') {
            Some((addr, after)) if !addr.is_empty() => {
                if !addr
                    .bytes()
                    .all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.')
                {
                    return Some("the IPv6 address holds other characters");
                }
                if addr.bytes().any(|b| b.is_ascii_uppercase()) {
                    return Some("the host must be lower case");
                }
                match after {
                    "" => (addr, None),
                    p => match p.strip_prefix(':') {
                        Some(p) => (addr, Some(p)),
                        None => return Some("something follows the IPv6 address"),
                    },
                }
            }
            _ => return Some("the IPv6 address is not closed by ]"),
        },
        None => match rest.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (rest, None),
        },
    };
    if host.is_empty() {
        return Some("it has no host");
    }
    if host.contains('*') {
        return Some("a host cannot hold a wildcard (only a trailing :* for every port)");
    }
    if host.bytes().any(|b| b.is_ascii_uppercase()) {
        return Some("the host must be lower case");
    }
    if !rest.starts_with('[') && host.contains(':') {
        return Some("an IPv6 address goes in brackets: [::1]");
    }
    if !rest.starts_with('[')
        && !host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
    {
        return Some("the host holds a character a browser never sends (a host beyond ASCII goes in its punycode form)");
    }
    match port {
        Some(_) if every_port => Some("a port and :* both"),
        Some(p) if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) => {
            Some("the port is not a number")
        }
        Some(p) if p.len() > 1 && p.starts_with('0') => {
            Some("a browser writes a port without leading zeros")
        }
        Some(p) if p.parse::<u32>().map_or(true, |n| n > 65_535) => Some("the port is above 65535"),
        Some(p) if p == default_port => {
            Some("a browser leaves the scheme's default port out of an origin (80 for http, 443 for https)")
        }
        _ => None,
    }
}

/// How long [`Server::stop`] waits, after the HTTP drain, for the database
/// statements still running to finish before it abandons them.
pub const CLOSE_WAIT: Duration = Duration::from_secs(10);

/// A running server: its address, and a way to stop it gracefully.
#[derive(Debug)]
pub struct Server {
    addr: SocketAddr,
    metrics_addr: Option<SocketAddr>,
    store: Store,
    shutdown: watch::Sender<bool>,
    http: JoinHandle<std::io::Result<()>>,
    /// The `--metrics-listen` server, when configured.
    metrics_http: Option<JoinHandle<std::io::Result<()>>>,
    reaper: JoinHandle<()>,
}

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The database could not be opened or migrated.
    #[error("database: {0}")]
    Store(#[from] StoreError),
    /// The listen address could not be bound.
    #[error("listen: {0}")]
    Listen(#[from] std::io::Error),
    /// A flag value is invalid.
    #[error("config: {0}")]
    Config(String),
}

impl Server {
    /// Checks `config` ([`Config::validate`]), opens the database (migrating
    /// it), binds `config.listen`, and starts the HTTP server and this
    /// instance's reaper.
    ///
    /// # Errors
    /// See [`StartError`].
    pub async fn start(config: &Config) -> Result<Server, StartError> {
        config.validate().map_err(StartError::Config)?;
        let store = Store::connect(&config.database, config.settings()).await?;
        let metrics = store.metrics().clone();
        let state = state(config, store.clone());
        let app = router(config, state.clone()).map_err(StartError::Config)?;
        let listener = TcpListener::bind(config.listen).await?;
        let addr = listener.local_addr()?;
        let metrics_listener = match config.metrics_listen {
            Some(at) => Some(TcpListener::bind(at).await?),
            None => None,
        };
        let (shutdown, rx) = watch::channel(false);
        let read_timeout = Duration::from_millis(config.read_timeout_ms);
        let reaper = reaper::spawn(
            store.clone(),
            Duration::from_millis(config.reaper_ms),
            rx.clone(),
            metrics,
        );
        let mut metrics_addr = None;
        let metrics_http = match metrics_listener {
            Some(l) => {
                let at = l.local_addr()?;
                metrics_addr = Some(at);
                tracing::info!(addr = %l.local_addr()?, "metrics listening (no token)");
                Some(serve(
                    l,
                    outer(ops::open_metrics_router().with_state(state), config, at),
                    rx.clone(),
                    read_timeout,
                    config.max_connections_per_ip,
                ))
            }
            None => None,
        };
        let http = serve(
            listener,
            app,
            rx,
            read_timeout,
            config.max_connections_per_ip,
        );
        tracing::info!(%addr, database = store.backend().name(), "agentstore-server listening");
        Ok(Server {
            addr,
            metrics_addr,
            store,
            shutdown,
            http,
            metrics_http,
            reaper,
        })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://<addr>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The `--metrics-listen` address, when configured.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// This instance's store.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Stops accepting, lets in-flight requests finish, stops the reaper and
    /// closes the database pool, waiting at most [`CLOSE_WAIT`] for the
    /// statements still running (those of requests whose client went away,
    /// or cut off at the drain deadline) to hand their connections back.
    ///
    /// # Errors
    /// The HTTP server task failed.
    pub async fn stop(self) -> std::io::Result<()> {
        let _ = self.shutdown.send(true);
        let served = self.http.await.map_err(std::io::Error::other)?;
        if let Some(m) = self.metrics_http {
            m.await.map_err(std::io::Error::other)??;
        }
        let _ = self.reaper.await;
        // `close` waits for every checked-out connection: a statement
        // blocked without a bound (a lock wait with `lock_timeout` 0, a
        // database that stopped answering) held the stop, and the process,
        // for good. What is still running is abandoned: PostgreSQL rolls
        // back an open transaction when its connection goes (a lone
        // statement waiting for a lock is applied once it gets it: the
        // backend sees the client gone only when it answers), and an SQLite
        // commit is atomic whenever the process ends.
        if tokio::time::timeout(CLOSE_WAIT, self.store.close())
            .await
            .is_err()
        {
            tracing::warn!(
                "database statements still running after {} s: abandoned",
                CLOSE_WAIT.as_secs()
            );
        }
        served
    }
}

/// Serves `app` (HTTP/1.1) on `listener` until `shutdown` changes, then
/// stops accepting and lets open connections finish their requests.
///
/// This is `axum::serve` plus what it does not configure: a client gets
/// `read_timeout` to send each request's headers (hyper's
/// `header_read_timeout`, which also ends a keep-alive connection idle that
/// long) and `read_timeout` again for its whole body (the API's
/// [`crate::extract::BodyDeadline`]), and a connection closed with a body too
/// large to drain unread in it closes lingering ([`crate::drain::Lingering`]).
/// Without the timeouts a client with no credentials
/// held a connection, and a file descriptor, open for ever by sending a
/// request slowly; a few hundred such connections stopped the server
/// answering (`accept: Too many open files`).
fn serve(
    listener: TcpListener,
    app: Router,
    mut shutdown: watch::Receiver<bool>,
    read_timeout: Duration,
    max_per_ip: usize,
) -> JoinHandle<std::io::Result<()>> {
    use hyper_util::rt::{TokioIo, TokioTimer};
    use tower::ServiceExt;
    tokio::spawn(async move {
        let mut http = hyper::server::conn::http1::Builder::new();
        http.timer(TokioTimer::new())
            .header_read_timeout(read_timeout);
        let graceful = hyper_util::server::graceful::GracefulShutdown::new();
        let mut connections = tokio::task::JoinSet::new();
        // Open connections per client address (`--max-connections-per-ip`).
        let per_ip: Arc<std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>> =
            Arc::default();
        loop {
            // Finished connections' tasks are let go as the loop goes.
            while connections.try_join_next().is_some() {}
            let (stream, peer) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(conn) => conn,
                    Err(e) => {
                        // Out of file descriptors, a connection reset before
                        // it was accepted: as axum::serve, wait and go on.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(250)).await;
                        continue;
                    }
                },
                _ = shutdown.changed() => break,
            };
            let key = crate::ratelimit::client_key(peer.ip());
            if max_per_ip > 0 {
                let mut open = per_ip
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                let n = open.entry(key).or_insert(0);
                if *n >= max_per_ip {
                    tracing::debug!(%peer, "--max-connections-per-ip reached: connection closed");
                    drop(stream);
                    continue;
                }
                *n += 1;
            }
            let slot = ConnSlot {
                per_ip: (max_per_ip > 0).then(|| per_ip.clone()),
                key,
            };
            // Connect info: the unauthenticated endpoints are limited per
            // client address (`ConnectInfo<SocketAddr>`, as axum's
            // `into_make_service_with_connect_info` sets it). The linger:
            // a connection closed with a body too large to drain unread in
            // it closes lingering (see `crate::drain`).
            let linger = Linger::default();
            let service = app.clone().map_request({
                let linger = linger.clone();
                move |req: Request<hyper::body::Incoming>| {
                    let mut req = req.map(axum::body::Body::new);
                    let extensions = req.extensions_mut();
                    extensions.insert(axum::extract::ConnectInfo(peer));
                    extensions.insert(linger.clone());
                    req
                }
            });
            let conn = http.serve_connection(
                TokioIo::new(Lingering::new(
                    SendTimeout::new(stream, read_timeout),
                    linger,
                )),
                hyper_util::service::TowerToHyperService::new(service),
            );
            let conn = graceful.watch(conn);
            connections.spawn(async move {
                let _slot = slot;
                if let Err(e) = conn.await {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
            });
        }
        drop(listener);
        // In-flight requests finish; a client cannot hold the drain open
        // longer than its read timeout, and a handler gets 30 s more. Then
        // what is left is closed.
        let drain = read_timeout + Duration::from_secs(30);
        if tokio::time::timeout(drain, graceful.shutdown())
            .await
            .is_err()
        {
            tracing::warn!("connections still open after the drain deadline: closed");
        }
        connections.shutdown().await;
        Ok(())
    })
}

/// One open connection's place in the per-address count; freed when dropped.
struct ConnSlot {
    per_ip: Option<Arc<std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>>>,
    key: std::net::IpAddr,
}

impl Drop for ConnSlot {
    fn drop(&mut self) {
        if let Some(per_ip) = &self.per_ip {
            let mut open = per_ip
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some(n) = open.get_mut(&self.key) {
                *n -= 1;
                if *n == 0 {
                    open.remove(&self.key);
                }
            }
        }
    }
}

/// A connection whose writes fail (`TimedOut`) once one makes no progress
/// for `limit`: the client stopped reading. nginx's `send_timeout` (between
/// two successive writes, not for the whole response). Without it a client
/// that never read a response larger than the socket buffers (a big static
/// file) held the connection, and its file descriptor, for good.
struct SendTimeout<T> {
    io: T,
    limit: Duration,
    /// Armed while a write waits; reset by any progress.
    stalled: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

impl<T> SendTimeout<T> {
    fn new(io: T, limit: Duration) -> Self {
        SendTimeout {
            io,
            limit,
            stalled: None,
        }
    }

    /// `poll`'s outcome, or `TimedOut` once it has been pending for `limit`.
    fn bounded<R>(
        &mut self,
        cx: &mut std::task::Context<'_>,
        poll: impl FnOnce(
            std::pin::Pin<&mut T>,
            &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<R>>,
    ) -> std::task::Poll<std::io::Result<R>>
    where
        T: Unpin,
    {
        use std::future::Future;
        use std::task::Poll;
        match poll(std::pin::Pin::new(&mut self.io), cx) {
            Poll::Pending => {
                let limit = self.limit;
                let timer = self
                    .stalled
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
                if timer.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "the client read nothing of the response within --read-timeout-ms",
                    )));
                }
                Poll::Pending
            }
            ready => {
                self.stalled = None;
                ready
            }
        }
    }
}

impl<T: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for SendTimeout<T> {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl<T: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for SendTimeout<T> {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.get_mut().bounded(cx, |io, cx| io.poll_write(cx, buf))
    }

    fn poll_write_vectored(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.get_mut()
            .bounded(cx, |io, cx| io.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        self.get_mut().bounded(cx, |io, cx| io.poll_flush(cx))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        self.get_mut().bounded(cx, |io, cx| io.poll_shutdown(cx))
    }
}
