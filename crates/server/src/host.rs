//! The `Host` check of a loopback listener (DNS-rebinding protection).
//!
//! A server on `127.0.0.1` is out of other machines' reach, but not out of
//! reach of a web page: a page from `http://evil.example:8787` whose DNS
//! answer is switched to `127.0.0.1` after it loaded ("DNS rebinding") sends
//! its requests to this server as same-origin requests, so CORS does not
//! stop it from reading the answers (the demo's `/runtime/demo.json` with its
//! enrollment tokens, a token-less `--metrics-listen`). Such a request still
//! names the attacker's host in its `Host` header: a loopback listener
//! answers only requests addressed to a loopback address or to a host name
//! allowed by `--allowed-host` (default `localhost`), and refuses the rest
//! with `403 {code: "forbidden"}` before routing (the guard Vite, webpack-dev-server
//! and Jupyter put in front of their loopback servers).

use std::net::IpAddr;
use std::sync::Arc;

use agentstore_protocol::ErrorCode;
use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;

/// `--allowed-host` value that turns the check off.
pub const ANY_HOST: &str = "*";

/// Which `Host` values a loopback listener answers.
#[derive(Debug, Clone)]
pub struct HostCheck {
    /// Lower-case host names (no port, no trailing dot) allowed besides
    /// loopback addresses; empty with `any`.
    names: Vec<String>,
    /// `--allowed-host '*'`: every host (the operator put a proxy in front
    /// that checks it, or accepts the risk).
    any: bool,
}

impl HostCheck {
    /// The check for `--allowed-host` values (`*`: any host).
    pub fn new(allowed: &[String]) -> HostCheck {
        HostCheck {
            any: allowed.iter().any(|h| h == ANY_HOST),
            names: allowed.iter().map(|h| normalise(h)).collect(),
        }
    }

    /// Whether a request whose `Host` (or absolute-form authority) is
    /// `host` may be answered. A request without one is: browsers always
    /// send it, so its absence means a client that is not a web page.
    pub fn allows(&self, host: Option<&str>) -> bool {
        let Some(host) = host else { return true };
        if self.any {
            return true;
        }
        let name = normalise(strip_port(host));
        let bare = name.trim_start_matches('[').trim_end_matches(']');
        if let Ok(ip) = bare.parse::<IpAddr>() {
            if ip.to_canonical().is_loopback() {
                return true;
            }
        }
        if bare != name && self.names.iter().any(|n| n == bare) {
            return true; // `--allowed-host ::1`-style, without brackets
        }
        self.names.iter().any(|n| n == &name)
    }
}

/// `--allowed-host`: a host name or address without scheme, path or
/// whitespace (`*`: any host).
pub fn allowed_host_arg(v: &str) -> Result<String, String> {
    if v.is_empty()
        || v.chars()
            .any(|c| c.is_whitespace() || c.is_control() || "/?#@".contains(c))
    {
        Err(format!(
            "{v:?} is not a host name or address (e.g. localhost, demo.example, or * for any)"
        ))
    } else if strip_port(v) != v {
        // The port is taken off `Host` before it is compared, so an entry
        // with one never matched: refused instead of every request to that
        // name answered 403.
        Err(format!(
            "{v:?} names a port: a host is allowed on every port this server listens on; \
             give {:?}",
            strip_port(v)
        ))
    } else {
        Ok(v.to_owned())
    }
}

/// Lower case, without a trailing dot (`LOCALHOST.` is `localhost`).
fn normalise(host: &str) -> String {
    host.trim_end_matches('.').to_ascii_lowercase()
}

/// `host` without its `:port` (an IPv6 literal keeps its brackets).
fn strip_port(host: &str) -> &str {
    if host.starts_with('[') {
        return host.find(']').map_or(host, |end| &host[..=end]);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if !name.contains(':') && port.bytes().all(|b| b.is_ascii_digit()) => {
            name
        }
        _ => host,
    }
}

/// Middleware: refuses a request whose host `check` does not allow, with
/// `403 forbidden` naming the host and the flag that would allow it.
pub async fn check_host(State(check): State<Arc<HostCheck>>, req: Request, next: Next) -> Response {
    let host = req
        .uri()
        .authority()
        .map(|a| a.as_str().to_owned())
        .or_else(|| {
            req.headers()
                .get(header::HOST)
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        });
    if check.allows(host.as_deref()) {
        return next.run(req).await;
    }
    let shown: String = host.unwrap_or_default().chars().take(100).collect();
    tracing::warn!(host = %shown, "refused a request addressed to a host that is not allowed");
    let name = strip_port(&shown);
    ApiError::new(
        ErrorCode::Forbidden,
        format!(
            "this server listens on loopback and answers only requests addressed to a loopback \
             address or an allowed host name, not {shown:?} (a page on another host could be \
             using DNS rebinding to reach it); start it with --allowed-host {name} to allow it"
        ),
    )
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(allowed: &[&str]) -> HostCheck {
        HostCheck::new(&allowed.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>())
    }

    #[test]
    fn loopback_addresses_and_allowed_names_pass_and_others_do_not() {
        let c = check(&["localhost"]);
        for ok in [
            "127.0.0.1:8787",
            "127.0.0.1",
            "127.1.2.3:80",
            "[::1]:8787",
            "[::1]",
            "localhost:8787",
            "LOCALHOST.:1",
        ] {
            assert!(c.allows(Some(ok)), "{ok}");
        }
        assert!(c.allows(None), "no Host: not a browser");
        for bad in [
            "evil.example:8787",
            "evil.example",
            "localhost.evil.example",
            "10.0.0.1:8787",
            "[2001:db8::1]:8787",
            "",
        ] {
            assert!(!c.allows(Some(bad)), "{bad}");
        }
        let c = check(&["demo.example", "192.168.1.5"]);
        assert!(c.allows(Some("Demo.Example:8787")));
        assert!(c.allows(Some("192.168.1.5:8787")));
        assert!(c.allows(Some("127.0.0.1:8787")), "loopback always");
        assert!(!c.allows(Some("localhost:8787")), "localhost not listed");
        assert!(check(&["*"]).allows(Some("evil.example")));
    }

    #[test]
    fn an_allowed_host_is_a_bare_name() {
        assert!(allowed_host_arg("demo.example").is_ok());
        assert!(allowed_host_arg("*").is_ok());
        for good in ["::1", "[::1]", "127.0.0.1"] {
            assert!(allowed_host_arg(good).is_ok(), "{good}");
        }
        for bad in ["", "http://x", "a b", "x/y", "localhost:8787", "[::1]:8787"] {
            assert!(allowed_host_arg(bad).is_err(), "{bad}");
        }
    }
}
