//! The real binary: starts with flags, serves, and exits 0 on SIGTERM.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn the_binary_serves_and_shuts_down_gracefully_on_sigterm() {
    let dir = std::env::temp_dir().join(format!("agentstore-bin-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("www")).unwrap();
    let db = dir.join("nested-new.sqlite");
    let mut child = Command::new(env!("CARGO_BIN_EXE_agentstore-server"))
        .args(["--listen", "127.0.0.1:0", "--www"])
        .arg(dir.join("www"))
        .arg("--pkg")
        .arg(dir.join("pkg"))
        .arg("--database")
        .arg(&db)
        .args([
            "--ttl-ms",
            "1000",
            "--reaper-ms",
            "100",
            "--claim-rate",
            "5/s",
        ])
        .env("NO_COLOR", "1")
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let port = loop {
        let line = lines.next().expect("server printed its address").unwrap();
        if line.contains("listening") {
            let at = line.find("127.0.0.1:").expect("address in log") + "127.0.0.1:".len();
            let digits: String = line[at..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            break digits.parse::<u16>().unwrap();
        }
    };
    assert!(db.exists(), "the SQLite file is created when missing");
    let resp = raw_http::get_health(port);
    assert!(
        resp.contains("\"status\":\"ok\""),
        "health answered: {resp}"
    );
    let pid = child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "server did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "graceful exit: {status:?}");
    let _ = std::fs::remove_dir_all(dir);
}

mod raw_http {
    /// A minimal HTTP/1.1 GET of /v1/health over a plain socket (no runtime needed).
    pub fn get_health(port: u16) -> String {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.write_all(b"GET /v1/health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }
}
