//! Load generator for agentstore-server (see BENCHMARKS.md).
//!
//! Enrolls `--workers` workers (scoped to the run's queue), enqueues `--items`
//! items (not timed), then runs every worker concurrently: claim →
//! `--heartbeats` heartbeats → settle `done` (`--heartbeats 0`: claim → settle,
//! the shape pg-boss's fetch → complete has), until the queue answers `204` or
//! `--max-secs` passes. With several
//! `--server` URLs (instances sharing one PostgreSQL database) worker `i` talks
//! to server `i % n`. Only loopback addresses are accepted.
//!
//! ```text
//! agentstore-loadgen --server http://127.0.0.1:8787 --admin-token t --items 4000 --json
//! ```

mod stats;

use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentstore_protocol::lease::{ClaimResponse, SettleRequest, SettleState, WorkerCredentials};
use clap::Parser;
use reqwest::{Client, StatusCode, Url};
use serde::Serialize;
use serde_json::{json, Value};
use stats::{Latency, Samples};

/// Command line.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Server base URL (repeat for several instances on one database); loopback only.
    #[arg(long = "server", required = true)]
    servers: Vec<String>,
    /// The servers' admin token (creates enrollment tokens, enqueues).
    #[arg(long, env = "AGENTSTORE_ADMIN_TOKEN", hide_env_values = true)]
    admin_token: String,
    /// Concurrent workers.
    #[arg(long, default_value_t = 64)]
    workers: usize,
    /// Items enqueued before the timed run.
    #[arg(long, default_value_t = 4_000)]
    items: usize,
    /// Heartbeats per claimed item.
    #[arg(long, default_value_t = 3)]
    heartbeats: usize,
    /// Stop the timed run after this many seconds even if items remain.
    #[arg(long, default_value_t = 60)]
    max_secs: u64,
    /// Queue name (default: a fresh one per run).
    #[arg(long)]
    queue: Option<String>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// What one worker measured.
#[derive(Debug, Default)]
struct WorkerStats {
    claim: Samples,
    heartbeat: Samples,
    settle: Samples,
    settled: usize,
    errors: usize,
}

/// The run's summary (printed as JSON with `--json`).
#[derive(Debug, Serialize)]
struct Report {
    servers: usize,
    workers: usize,
    items: usize,
    settled: usize,
    heartbeats: usize,
    errors: usize,
    timed_out: bool,
    elapsed_s: f64,
    items_per_s: f64,
    heartbeats_per_s: f64,
    requests_per_s: f64,
    all: Latency,
    claim: Latency,
    heartbeat: Latency,
    settle: Latency,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn loopback_url(s: &str) -> Result<Url, BoxError> {
    let url = Url::parse(s)?;
    let ok = match url.host_str() {
        Some("localhost") => true,
        Some(h) => h
            .trim_matches(['[', ']'])
            .parse::<IpAddr>()
            .is_ok_and(|ip| ip.is_loopback()),
        None => false,
    };
    if !ok {
        return Err(format!("{s}: only loopback servers are allowed").into());
    }
    Ok(url)
}

fn endpoint(base: &Url, path: &str) -> Url {
    let mut u = base.clone();
    u.set_path(path);
    u
}

async fn post_ok(client: &Client, url: Url, bearer: &str, body: Value) -> Result<Value, BoxError> {
    let resp = client
        .post(url.clone())
        .bearer_auth(bearer)
        .json(&body)
        .send()
        .await?;
    let status = resp.status();
    if !status.is_success() {
        let text = resp.text().await.unwrap_or_default();
        return Err(format!("POST {url}: {status} {text}").into());
    }
    Ok(resp.json().await?)
}

/// Enrolls one worker that may claim from `queue` only (least privilege). The
/// server limits enrollments per client address: a `429` is waited out for its
/// `Retry-After` (untimed set-up).
async fn enroll(
    client: &Client,
    base: &Url,
    admin: &str,
    queue: &str,
) -> Result<WorkerCredentials, BoxError> {
    let t = post_ok(
        client,
        endpoint(base, "/v1/admin/enrollment-tokens"),
        admin,
        json!({"role": "worker", "queues": [queue]}),
    )
    .await?;
    loop {
        let resp = client
            .post(endpoint(base, "/v1/workers/enroll"))
            .json(&json!({"token": t["token"], "name": "loadgen"}))
            .send()
            .await?;
        match resp.status() {
            StatusCode::CREATED => return Ok(resp.json().await?),
            StatusCode::TOO_MANY_REQUESTS => {
                let secs = resp
                    .headers()
                    .get(reqwest::header::RETRY_AFTER)
                    .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
                    .unwrap_or(1);
                tokio::time::sleep(Duration::from_secs(secs)).await;
            }
            other => return Err(format!("enroll: {other}").into()),
        }
    }
}

/// Enqueues `items` items with 32 requests in flight, spread over the servers.
async fn enqueue_all(
    client: &Client,
    servers: &[Url],
    admin: &str,
    queue: &str,
    items: usize,
) -> Result<(), BoxError> {
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for t in 0..32 {
        let (client, next) = (client.clone(), next.clone());
        let base = servers[t % servers.len()].clone();
        let (admin, queue) = (admin.to_owned(), queue.to_owned());
        tasks.push(tokio::spawn(async move {
            let url = endpoint(&base, &format!("/v1/queues/{queue}/items"));
            while next.fetch_add(1, Ordering::Relaxed) < items {
                post_ok(&client, url.clone(), &admin, json!({"payload": {"n": 1}})).await?;
            }
            Ok::<(), BoxError>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}

/// One worker: claim → heartbeats → settle until the queue is empty or `deadline`.
async fn work(
    client: Client,
    base: Url,
    access: String,
    queue: String,
    heartbeats: usize,
    deadline: Instant,
) -> WorkerStats {
    let mut st = WorkerStats::default();
    let claim_url = endpoint(&base, &format!("/v1/queues/{queue}/claims"));
    while Instant::now() < deadline {
        let t = Instant::now();
        let resp = client
            .post(claim_url.clone())
            .bearer_auth(&access)
            .send()
            .await;
        let claimed = match resp {
            Ok(r) if r.status() == StatusCode::CREATED => r.json::<ClaimResponse>().await.ok(),
            Ok(r) if r.status() == StatusCode::NO_CONTENT => {
                st.claim.push(t.elapsed().as_micros());
                break;
            }
            Ok(r) if r.status() == StatusCode::TOO_MANY_REQUESTS => {
                st.errors += 1;
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
            _ => None,
        };
        st.claim.push(t.elapsed().as_micros());
        let Some(c) = claimed else {
            st.errors += 1;
            continue;
        };
        let id = c.item.id;
        let token = c.lease.token;
        let hb_url = endpoint(&base, &format!("/v1/items/{id}/heartbeat"));
        for _ in 0..heartbeats {
            let t = Instant::now();
            let ok = client
                .post(hb_url.clone())
                .bearer_auth(&access)
                .json(&json!({"token": token}))
                .send()
                .await
                .is_ok_and(|r| r.status() == StatusCode::OK);
            st.heartbeat.push(t.elapsed().as_micros());
            if !ok {
                st.errors += 1;
            }
        }
        let body = SettleRequest {
            token,
            state: SettleState::Done,
            result: Some(json!({"ok": true})),
            error: None,
        };
        let t = Instant::now();
        let ok = client
            .post(endpoint(&base, &format!("/v1/items/{id}/settle")))
            .bearer_auth(&access)
            .json(&body)
            .send()
            .await
            .is_ok_and(|r| r.status() == StatusCode::OK);
        st.settle.push(t.elapsed().as_micros());
        if ok {
            st.settled += 1;
        } else {
            st.errors += 1;
        }
    }
    st
}

async fn run(args: Args) -> Result<Report, BoxError> {
    let servers = args
        .servers
        .iter()
        .map(|s| loopback_url(s))
        .collect::<Result<Vec<_>, _>>()?;
    let client = Client::builder()
        .pool_max_idle_per_host(args.workers + 32)
        .tcp_nodelay(true)
        .no_proxy()
        .build()?;
    let queue = args.queue.clone().unwrap_or_else(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        format!("bench-{nanos}")
    });
    let mut creds = Vec::with_capacity(args.workers);
    for i in 0..args.workers {
        creds.push(
            enroll(
                &client,
                &servers[i % servers.len()],
                &args.admin_token,
                &queue,
            )
            .await?,
        );
    }
    enqueue_all(&client, &servers, &args.admin_token, &queue, args.items).await?;

    let start = Instant::now();
    let deadline = start + Duration::from_secs(args.max_secs);
    let tasks: Vec<_> = creds
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            tokio::spawn(work(
                client.clone(),
                servers[i % servers.len()].clone(),
                c.access_token,
                queue.clone(),
                args.heartbeats,
                deadline,
            ))
        })
        .collect();
    let mut total = WorkerStats::default();
    for t in tasks {
        let w = t.await?;
        total.claim.merge(&w.claim);
        total.heartbeat.merge(&w.heartbeat);
        total.settle.merge(&w.settle);
        total.settled += w.settled;
        total.errors += w.errors;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let mut all = Samples::default();
    for s in [&total.claim, &total.heartbeat, &total.settle] {
        all.merge(s);
    }
    let heartbeats = total.heartbeat.len();
    Ok(Report {
        servers: servers.len(),
        workers: args.workers,
        items: args.items,
        settled: total.settled,
        heartbeats,
        errors: total.errors,
        timed_out: Instant::now() >= deadline,
        elapsed_s: elapsed,
        items_per_s: total.settled as f64 / elapsed,
        heartbeats_per_s: heartbeats as f64 / elapsed,
        requests_per_s: all.len() as f64 / elapsed,
        all: all.summary(),
        claim: total.claim.summary(),
        heartbeat: total.heartbeat.summary(),
        settle: total.settle.summary(),
    })
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let json_out = args.json;
    match run(args).await {
        Ok(r) if json_out => {
            println!("{}", serde_json::to_string(&r).unwrap_or_default());
            std::process::ExitCode::SUCCESS
        }
        Ok(r) => {
            println!(
                "{} server(s), {} workers: {}/{} items settled in {:.2} s{}",
                r.servers,
                r.workers,
                r.settled,
                r.items,
                r.elapsed_s,
                if r.timed_out { " (time bound hit)" } else { "" }
            );
            println!(
                "items/s {:.0}  heartbeats/s {:.0}  requests/s {:.0}  errors {}",
                r.items_per_s, r.heartbeats_per_s, r.requests_per_s, r.errors
            );
            for (name, l) in [
                ("all", r.all),
                ("claim", r.claim),
                ("heartbeat", r.heartbeat),
                ("settle", r.settle),
            ] {
                println!(
                    "{name:>10}: p50 {:.2} ms  p99 {:.2} ms  max {:.2} ms  (n={})",
                    l.p50_ms, l.p99_ms, l.max_ms, l.count
                );
            }
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("agentstore-loadgen: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
