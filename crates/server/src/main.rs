//! `agentstore-server` binary: parse flags, start, stop on SIGINT/SIGTERM.
//!
//! The signal handlers are installed first, before the flags are read, the
//! database is opened or the address is bound: a SIGTERM or SIGINT at any moment
//! after `main` starts ends in a graceful exit 0. During start-up the start is
//! abandoned (nothing is served yet; an unfinished migration's transaction is not
//! committed); once serving, the server stops accepting, lets in-flight requests
//! finish, stops the reaper and closes the database. A second signal during
//! that stop, more than 1 s after the first, exits at once (status 130).

use agentstore_server::{Config, Server};
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    // First: until these exist a SIGTERM would kill the process (default action).
    let shutdown = Shutdown::install();
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .init();
    // Out-of-range values and contradicting flags end here, with clap's
    // usage error (exit 2) naming the flags.
    let config = Config::from_args(std::env::args_os()).unwrap_or_else(|e| e.exit());
    tracing::info!(pid = std::process::id(), "agentstore-server starting");
    let mut shutdown = match shutdown {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "could not install the SIGINT/SIGTERM handlers");
            return std::process::ExitCode::FAILURE;
        }
    };
    let server = tokio::select! {
        started = Server::start(&config) => match started {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(error = %e, "could not start");
                return std::process::ExitCode::FAILURE;
            }
        },
        signal = shutdown.recv() => {
            tracing::info!(signal, "stopped during start-up");
            return std::process::ExitCode::SUCCESS;
        }
    };
    let signal = shutdown.recv().await;
    tracing::info!(signal, "shutting down");
    // A second signal while the stop waits (for requests in flight, up to
    // --read-timeout-ms plus 30 s) exits at once, as an operator pressing
    // Ctrl-C again expects: what is still running is abandoned (PostgreSQL
    // rolls back a transaction left open; a lone statement waiting for a
    // lock is applied once it gets it; an SQLite commit is atomic).
    // A second signal within `SECOND_SIGNAL_AFTER` of the first is the same
    // request sent twice (a terminal's Ctrl-C to the process group and a
    // wrapper such as scripts/demo.sh or npm forwarding its own SIGTERM),
    // not an operator insisting: it is ignored.
    let first = tokio::time::Instant::now();
    let stop = server.stop();
    tokio::pin!(stop);
    let stopped = loop {
        tokio::select! {
            stopped = &mut stop => break stopped,
            again = shutdown.recv() => {
                if first.elapsed() < SECOND_SIGNAL_AFTER {
                    tracing::info!(signal = again, "second signal within 1 s of the first: ignored");
                    continue;
                }
                tracing::warn!(signal = again, "second signal: exiting without waiting for requests in flight");
                return std::process::ExitCode::from(130);
            }
        }
    };
    match stopped {
        Ok(()) => {
            tracing::info!("stopped");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            tracing::error!(error = %e, "server failed");
            std::process::ExitCode::FAILURE
        }
    }
}

/// How long after the first SIGINT/SIGTERM a second one is taken for the
/// same request delivered twice and ignored (see `main`).
const SECOND_SIGNAL_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

/// SIGINT and SIGTERM streams, registered when created: a signal that arrives
/// before [`Shutdown::recv`] is awaited is still seen by it.
struct Shutdown {
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
}

impl Shutdown {
    #[cfg(unix)]
    fn install() -> std::io::Result<Shutdown> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Shutdown {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    #[cfg(not(unix))]
    fn install() -> std::io::Result<Shutdown> {
        Ok(Shutdown {})
    }

    /// Resolves with the signal's name once one arrives.
    #[cfg(unix)]
    async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }

    #[cfg(not(unix))]
    async fn recv(&mut self) -> &'static str {
        let _ = tokio::signal::ctrl_c().await;
        "ctrl-c"
    }
}
