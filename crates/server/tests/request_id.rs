//! Request tracing: every request gets an `x-request-id` (kept from a proxy, or
//! a fresh UUID), echoed on the response and recorded in its log span.
//!
//! Alone in its test binary: it installs the process-wide tracing subscriber,
//! which tests running beside it in one process would share.

use std::sync::{Arc, Mutex};

use agentstore_server::{Config, Server};

/// Captured log output.
#[derive(Clone, Default)]
struct LogBuf(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for LogBuf {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn every_request_gets_a_request_id_in_its_response_and_its_log_span() {
    let logs = LogBuf::default();
    let sink = logs.clone();
    tracing_subscriber::fmt()
        .with_env_filter("tower_http=debug,agentstore_server=info")
        .with_ansi(false)
        .with_writer(move || sink.clone())
        .init();
    let dir = std::env::temp_dir().join(format!("agentstore-reqid-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let db = dir.join("db.sqlite").display().to_string();
    let server = Server::start(&Config::for_tests(&db, "reqid-admin"))
        .await
        .unwrap();
    let http = reqwest::Client::new();
    let mut ids = Vec::new();
    for _ in 0..2 {
        let resp = http
            .get(format!("{}/v1/health", server.url()))
            .send()
            .await
            .unwrap();
        let id = resp.headers()["x-request-id"].to_str().unwrap().to_owned();
        assert_eq!(id.len(), 36, "a UUID: {id}");
        ids.push(id);
    }
    assert_ne!(ids[0], ids[1], "a fresh id per request");
    // An id set by a proxy in front is kept and echoed (on an error answer too).
    let resp = http
        .get(format!("{}/v1/items/1", server.url()))
        .header("x-request-id", "proxy-given-42")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    assert_eq!(resp.headers()["x-request-id"], "proxy-given-42");
    server.stop().await.unwrap();
    let _ = std::fs::remove_dir_all(dir);
    let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    for id in ids.iter().map(String::as_str).chain(["proxy-given-42"]) {
        assert!(
            text.contains(&format!("request_id={id}")),
            "span of request {id} in the log:\n{text}"
        );
    }
}
