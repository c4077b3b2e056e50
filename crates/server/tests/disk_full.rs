//! SQLite whose file cannot grow (a full disk; simulated with a soft
//! RLIMIT_FSIZE and SIGXFSZ ignored, so `write()` fails as it does on a full
//! disk): no write is answered 2xx unless it is in the database, and one the
//! database refused is a `503` (README: a write the database refused, not a
//! fault of the server). Before, sqlx-sqlite dropped the failed commit of a
//! single-statement write (the reset after its first `RETURNING` row), and
//! 382 of 400 enqueues answered `201` were not stored, all with one id;
//! claims got leases the database never held, settles `200 done` that left
//! the item running. Found by helper-222 (the real binary, a real file).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const ADMIN: &str = "disk-full-admin";

fn http(port: u16, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let body = body.unwrap_or("");
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {ADMIN}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out[9..12].parse().unwrap();
    let body = out.split("\r\n\r\n").nth(1).unwrap_or("").to_owned();
    (status, body)
}

/// Starts the binary on `db`, under a file-size limit of `limit_kib` if given.
fn start(db: &std::path::Path, port: u16, limit_kib: Option<u32>) -> Child {
    let bin = env!("CARGO_BIN_EXE_agentstore-server");
    let limit = limit_kib.map_or(String::new(), |k| {
        format!("trap '' XFSZ; ulimit -S -f {k}; ")
    });
    let child = Command::new("sh")
        .arg("-c")
        .arg(format!("{limit}exec \"$0\" \"$@\""))
        .arg(bin)
        .args(["--listen", &format!("127.0.0.1:{port}"), "--database"])
        .arg(db)
        .env("AGENTSTORE_ADMIN_TOKEN", ADMIN)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "server did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    child
}

/// `DISK_FULL_PORT` + `offset` when set (a shared machine's port range), else a free port.
fn free_port(offset: u16) -> u16 {
    match std::env::var("DISK_FULL_PORT") {
        Ok(p) => p.parse::<u16>().unwrap() + offset,
        Err(_) => std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port(),
    }
}

fn id_of(body: &str) -> i64 {
    let at = body.find("\"id\":").unwrap() + 5;
    body[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .unwrap()
}

#[test]
fn an_enqueue_answered_201_on_a_full_disk_is_in_the_database() {
    let dir = std::env::temp_dir().join(format!("agentstore-full-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let db = dir.join("full.sqlite");
    let port = free_port(0);
    let mut first = start(&db, port, None); // created and migrated without a limit
    first.kill().unwrap();
    first.wait().unwrap();
    let mut server = start(&db, port, Some(400));
    let pad = "x".repeat(4000);
    let mut answered = Vec::new();
    let mut refused = Vec::new();
    for i in 0..150 {
        let (status, body) = http(
            port,
            "POST",
            "/v1/queues/full/items",
            Some(&format!(r#"{{"payload": {{"i": {i}, "pad": "{pad}"}}}}"#)),
        );
        if status == 201 {
            answered.push(id_of(&body));
        } else {
            refused.push(status);
        }
    }
    server.kill().unwrap(); // kill -9: what is on disk is what the next start sees
    server.wait().unwrap();
    let mut server = start(&db, port, None);
    let mut missing = Vec::new();
    for id in &answered {
        if http(port, "GET", &format!("/v1/items/{id}"), None).0 != 200 {
            missing.push(*id);
        }
    }
    let mut distinct = answered.clone();
    distinct.dedup();
    server.kill().unwrap();
    server.wait().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!refused.is_empty(), "the disk filled up");
    assert!(
        refused.iter().all(|s| *s == 503),
        "a write the database refused is 503: {refused:?}"
    );
    assert!(
        missing.is_empty() && distinct.len() == answered.len(),
        "{} enqueues answered 201 ({} distinct ids); ids answered but not stored: {:?}",
        answered.len(),
        distinct.len(),
        &missing[..missing.len().min(5)]
    );
}

/// The lease side of the same fault: on a full disk a claim is answered `201`
/// with a lease the database does not hold, the same item and epoch to every
/// claimant, and a settle `200 done` that leaves the item running.
#[test]
fn claims_and_settles_on_a_full_disk_are_answered_only_when_stored() {
    let dir = std::env::temp_dir().join(format!("agentstore-full2-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let db = dir.join("full.sqlite");
    let port = free_port(1);
    let mut server = start(&db, port, None);
    for i in 0..4 {
        assert_eq!(
            http(
                port,
                "POST",
                "/v1/queues/L/items",
                Some(&format!(r#"{{"payload": {i}}}"#))
            )
            .0,
            201
        );
    }
    // One lease claimed while the disk had room, to settle later.
    let (status, held) = http(port, "POST", "/v1/queues/L/claims", None);
    assert_eq!(status, 201);
    let held_id = id_of(&held);
    let token_at = held.find("\"token\":\"").unwrap() + 9;
    let token: String = held[token_at..].chars().take_while(|c| *c != '"').collect();
    server.kill().unwrap();
    server.wait().unwrap();
    let mut server = start(&db, port, Some(300));
    let pad = "y".repeat(4000);
    for _ in 0..120 {
        http(
            port,
            "POST",
            "/v1/queues/fill/items",
            Some(&format!(r#"{{"payload": "{pad}"}}"#)),
        );
    }
    let mut claimed = Vec::new();
    for _ in 0..3 {
        let (status, body) = http(port, "POST", "/v1/queues/L/claims", None);
        if status == 201 {
            claimed.push(id_of(&body));
        }
    }
    let settle = http(
        port,
        "POST",
        &format!("/v1/items/{held_id}/settle"),
        Some(&format!(r#"{{"token": "{token}", "state": "done"}}"#)),
    );
    server.kill().unwrap();
    server.wait().unwrap();
    let mut server = start(&db, port, None);
    let after = http(port, "GET", &format!("/v1/items/{held_id}"), None).1;
    let running_claims = claimed
        .iter()
        .filter(|id| {
            http(port, "GET", &format!("/v1/items/{id}"), None)
                .1
                .contains("\"running\"")
        })
        .count();
    server.kill().unwrap();
    server.wait().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        running_claims == claimed.len() && (settle.0 != 200 || after.contains("\"done\"")),
        "claims answered 201 for items {claimed:?}, {running_claims} of them running after a restart; \
         settle answered {} and the item is now {after}",
        settle.0
    );
}
