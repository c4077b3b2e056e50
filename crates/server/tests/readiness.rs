//! Readiness follows the database: `/v1/ready` answers 503 while PostgreSQL is
//! stopped and 200 again once it is back, by itself; `/v1/health` (liveness)
//! answers 200 throughout.
//!
//! The test stops and restarts a PostgreSQL cluster, so it makes its OWN
//! throwaway cluster with `scripts/pg.sh` (its own directory, its own loopback
//! port) and deletes it afterwards: the shared cluster named by
//! `AGENTSTORE_TEST_PG_URL` is never touched. Without PostgreSQL binaries it is
//! skipped with a notice (in CI, `CI` set, it fails instead).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use agentstore_protocol::lease::Readiness;
use agentstore_server::{Config, Server};

const ADMIN: &str = "readiness-admin";

/// A cluster of this test's own, stopped and removed on drop.
struct Cluster {
    dir: PathBuf,
    port: u16,
}

fn pg_sh() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/pg.sh")
}

impl Cluster {
    fn run(&self, action: &str) -> Option<String> {
        let out = Command::new("bash")
            .arg(pg_sh())
            .arg(action)
            .env("AGENTSTORE_PG_DIR", &self.dir)
            .env("AGENTSTORE_PG_PORT", self.port.to_string())
            .output()
            .expect("run scripts/pg.sh");
        if !out.status.success() {
            eprintln!(
                "pg.sh {action} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            return None;
        }
        let stdout = String::from_utf8(out.stdout).unwrap();
        Some(stdout.lines().last().unwrap_or("").to_owned())
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.run("stop");
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A free loopback port outside 55400..55600, where the engineers' and CI's
/// own clusters live, and below the kernel's ephemeral range (32768..60999
/// on Linux): the cluster is started on it after this check and started
/// again on it after a stop, and a port taken from the ephemeral range
/// (bind to :0) could be handed to any other process's socket meanwhile on
/// a busy machine. Below that range only a process asking for that very
/// port could take it.
fn free_port() -> u16 {
    let start = 20_000 + (std::process::id() % 12_000) as u16;
    (start..32_000)
        .chain(20_000..start)
        .find(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok())
        .unwrap_or_else(|| {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        })
}

async fn ready(http: &reqwest::Client, base: &str) -> (u16, Readiness) {
    let resp = http
        .get(format!("{base}/v1/ready"))
        .send()
        .await
        .expect("the server answers even when the database does not");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap())
}

/// Polls readiness until it answers `want` (bounded).
async fn until_ready_is(http: &reqwest::Client, base: &str, want: u16) -> Readiness {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, body) = ready(http, base).await;
        if status == want {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "readiness stayed {status} ({body:?}), expected {want}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn health(http: &reqwest::Client, base: &str) -> u16 {
    let resp = http.get(format!("{base}/v1/health")).send().await.unwrap();
    resp.status().as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_and_the_api_are_503_while_postgres_is_stopped_and_recover_when_it_returns() {
    let has_pg = std::fs::read_dir("/usr/lib/postgresql").is_ok_and(|mut d| d.next().is_some());
    if !has_pg {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI is set but PostgreSQL is not installed"
        );
        eprintln!("NOTICE: no PostgreSQL binaries; skipping the readiness restart test");
        return;
    }
    let dir = std::env::temp_dir().join(format!("agentstore-ready-pg-{}", std::process::id()));
    let cluster = Cluster {
        dir,
        port: free_port(),
    };
    let url = cluster.run("start").expect("throwaway cluster starts");
    assert!(url.starts_with("postgres://"), "pg.sh printed {url:?}");

    let mut config = Config::for_tests(&url, ADMIN);
    config.reaper_ms = 200; // the reaper keeps failing while the database is down
    let server = Server::start(&config).await.unwrap();
    let base = server.url();
    let http = reqwest::Client::new();
    let (status, body) = ready(&http, &base).await;
    assert_eq!((status, body.status.as_str()), (200, "ready"));
    assert_eq!(body.database, "postgres");

    cluster.run("stop").expect("cluster stops");
    let down = until_ready_is(&http, &base, 503).await;
    assert_eq!(down.status, "unavailable");
    assert!(down.reason.is_some());
    assert_eq!(
        health(&http, &base).await,
        200,
        "liveness ignores the database"
    );
    // The API answers the outage as one too: 503 to retry, not a 500.
    let resp = http
        .post(format!("{base}/v1/queues/during/claims"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 503, "a claim while the database is down");
    assert!(resp.headers().contains_key("retry-after"));

    cluster.run("start").expect("cluster restarts");
    let up = until_ready_is(&http, &base, 200).await;
    assert_eq!((up.status.as_str(), up.reason), ("ready", None));
    // Not just the probe: the API works again on the same pool.
    let resp = http
        .post(format!("{base}/v1/queues/after/items"))
        .bearer_auth(ADMIN)
        .json(&serde_json::json!({"payload": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);

    server.stop().await.unwrap();
    drop(cluster);
}
