//! Flag ranges and the rules between flags: a value the server cannot run
//! with is refused at startup with a message naming the flag, never accepted
//! to fail later (before: `--access-ttl-ms 18446744073709551615` overflowed
//! `{now} + $4` and every enroll answered 500 on PostgreSQL, `--reaper-ms 0`
//! looped every millisecond, `--ttl-ms 0` expired every lease at once, and
//! `--heartbeat-ms` at or above `--ttl-ms` lost every lease between two
//! heartbeats).

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use agentstore_server::{Config, Server, StartError};
use clap::Parser;

fn parse(args: &[&str]) -> Result<Config, clap::Error> {
    Config::from_args(std::iter::once("agentstore-server").chain(args.iter().copied()))
}

#[test]
fn every_numeric_flag_refuses_a_value_outside_its_range_naming_the_flag() {
    let cases: &[(&str, &[&str], &str)] = &[
        (
            "--ttl-ms",
            &["0", "99", "86400001", "18446744073709551615"],
            "100000",
        ),
        ("--heartbeat-ms", &["0", "9", "86400001"], "500"),
        ("--reaper-ms", &["0", "9", "86400001"], "200"),
        ("--max-redeliveries", &["1001", "4294967295", "-1"], "0"),
        ("--max-body-bytes", &["0", "1023", "67108865"], "1024"),
        (
            "--access-ttl-ms",
            &["0", "999", "86400001", "9300000000000000000"],
            "1000",
        ),
        ("--db-pool", &["1001", "-1"], "0"),
        ("--idle-retry-ms", &["0", "3600001"], "100"),
        ("--retention-ms", &["-1", "315360000001"], "0"),
        ("--metrics-read-timeout-ms", &["0", "99", "600001"], "100"),
        (
            "--claim-rate",
            &["0/s", "10000001/s", "1/3600001ms"],
            "1000/s",
        ),
        (
            "--auth-rate",
            &["0/s", "10000001/s", "2/7200000ms"],
            "5/100ms",
        ),
    ];
    for (flag, bad, good) in cases {
        for value in *bad {
            // Clap's own parse (the range is part of the flag) and the
            // startup path agree.
            let arg = format!("{flag}={value}");
            for err in [
                Config::try_parse_from(["agentstore-server", &arg]).map(drop),
                parse(&[&arg]).map(drop),
            ] {
                let err = err.expect_err(&format!("{flag} {value} accepted"));
                let text = err.to_string();
                assert!(text.contains(flag), "{flag} {value}: {text}");
            }
        }
        assert!(parse(&[flag, good]).is_ok(), "{flag} {good} refused");
    }
    assert!(parse(&[]).is_ok(), "the defaults are valid");
}

#[test]
fn a_heartbeat_not_below_the_ttl_is_refused_naming_both_flags() {
    for args in [
        &["--ttl-ms", "1000", "--heartbeat-ms", "1000"][..],
        &["--ttl-ms", "1000", "--heartbeat-ms", "5000"],
        // The default heartbeat (15 s) with a shorter TTL.
        &["--ttl-ms", "10000"],
    ] {
        let text = parse(args).expect_err("accepted").to_string();
        assert!(
            text.contains("--heartbeat-ms") && text.contains("--ttl-ms"),
            "{args:?}: {text}"
        );
    }
    assert!(parse(&["--ttl-ms", "1000", "--heartbeat-ms", "999"]).is_ok());
}

/// A retention shorter than a minute, or than the lease TTL, would delete an
/// item whose settle or release a client may still send again after a lost
/// answer: refused at startup, naming the flags. 0 keeps items for good.
#[test]
fn a_retention_shorter_than_a_minute_or_the_ttl_is_refused_naming_the_flags() {
    for args in [
        &["--retention-ms", "1"][..],
        &["--retention-ms", "59999"],
        &["--retention-ms", "60000", "--ttl-ms", "120000"],
    ] {
        let text = parse(args).expect_err("accepted").to_string();
        assert!(
            text.contains("--retention-ms") && text.contains("--ttl-ms"),
            "{args:?}: {text}"
        );
    }
    for good in [
        &["--retention-ms", "0"][..],
        &["--retention-ms", "90000"],
        &["--retention-ms", "60000", "--ttl-ms", "60000"],
        &["--retention-ms", "120000", "--ttl-ms", "120000"],
    ] {
        let c = parse(good).expect("accepted");
        assert_eq!(c.settings().retention_ms, c.retention_ms, "{good:?}");
    }
    assert_eq!(
        parse(&[]).unwrap().retention_ms,
        0,
        "kept for good by default"
    );
}

#[test]
fn metrics_listen_on_the_listen_address_is_refused() {
    let text = parse(&[
        "--listen",
        "127.0.0.1:18999",
        "--metrics-listen",
        "127.0.0.1:18999",
    ])
    .expect_err("accepted")
    .to_string();
    assert!(text.contains("--metrics-listen"), "{text}");
    assert!(parse(&["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"]).is_ok());
}

/// `--metrics-listen` on `--listen`'s port in another form of an address
/// that overlaps it is refused naming both flags, before the database is
/// opened. Before, only the byte-identical address was: the server created
/// and migrated the database, then exited with "Address already in use"
/// naming no flag.
#[test]
fn metrics_listen_colliding_with_listen_in_another_form_is_refused() {
    for (listen, metrics, public) in [
        ("0.0.0.0:18999", "127.0.0.1:18999", false),
        ("127.0.0.1:18999", "[::ffff:127.0.0.1]:18999", false),
        ("[::ffff:127.0.0.1]:18999", "127.0.0.1:18999", false),
        ("[::]:18999", "127.0.0.1:18999", false),
        ("127.0.0.1:18999", "0.0.0.0:18999", true),
        ("[::1]:18999", "[::]:18999", true),
    ] {
        let mut args = vec!["--listen", listen, "--metrics-listen", metrics];
        if public {
            args.push("--metrics-public");
        }
        let text = parse(&args)
            .expect_err(&format!("{listen} and {metrics} accepted"))
            .to_string();
        assert!(
            text.contains("--metrics-listen") && text.contains("--listen"),
            "{listen} {metrics}: {text}"
        );
    }
    for (listen, metrics) in [
        ("0.0.0.0:18999", "127.0.0.1:19000"),
        ("0.0.0.0:18999", "[::1]:18999"),
        ("127.0.0.2:18999", "127.0.0.1:18999"),
        ("0.0.0.0:0", "127.0.0.1:0"),
    ] {
        parse(&["--listen", listen, "--metrics-listen", metrics])
            .unwrap_or_else(|e| panic!("{listen} {metrics}: {e}"));
    }
}

/// An `--allowed-host` entry with a port can never match (the port is taken
/// off `Host` before it is compared): refused at startup naming it and the
/// entry to give. Before, it was accepted and every request addressed to
/// that name answered 403.
#[test]
fn an_allowed_host_with_a_port_is_refused_naming_it() {
    for (bad, give) in [("localhost:8787", "localhost"), ("[::1]:8787", "[::1]")] {
        let text = parse(&["--allowed-host", bad])
            .map(drop)
            .expect_err(&format!("{bad} accepted"))
            .to_string();
        assert!(
            text.contains("--allowed-host") && text.contains(bad) && text.contains(give),
            "{bad}: {text}"
        );
    }
    for good in ["localhost", "::1", "[::1]", "demo.example", "*"] {
        parse(&["--allowed-host", good]).unwrap_or_else(|e| panic!("{good}: {e}"));
    }
}

/// The tokenless metrics listener shows queue names and gauges: on a
/// non-loopback address it needs `--metrics-public`, named in the refusal.
#[test]
fn metrics_listen_off_loopback_needs_metrics_public() {
    for addr in ["0.0.0.0:0", "192.0.2.1:9100", "[::]:0"] {
        let text = parse(&["--metrics-listen", addr])
            .expect_err(addr)
            .to_string();
        assert!(
            text.contains("--metrics-listen") && text.contains("--metrics-public"),
            "{addr}: {text}"
        );
        let config = parse(&["--metrics-listen", addr, "--metrics-public"]).expect(addr);
        assert!(config.metrics_public);
    }
    for addr in [
        "127.0.0.1:0",
        "127.0.0.2:9100",
        "[::1]:0",
        "[::ffff:127.0.0.1]:0",
    ] {
        assert!(parse(&["--metrics-listen", addr]).is_ok(), "{addr}");
    }
}

/// A configuration built in code skips clap's parser: the server checks it
/// before it opens the database or binds an address.
#[tokio::test]
async fn server_start_refuses_a_configuration_out_of_range_built_in_code() {
    let dir = std::env::temp_dir().join(format!("agentstore-config-{}", std::process::id()));
    let database = dir.join("never-created.sqlite");
    type Tweak = fn(&mut Config);
    let tweaks: [(&str, Tweak); 6] = [
        ("--ttl-ms", |c| c.ttl_ms = 0),
        ("--reaper-ms", |c| c.reaper_ms = 0),
        ("--access-ttl-ms", |c| c.access_ttl_ms = u64::MAX),
        ("--heartbeat-ms", |c| c.heartbeat_ms = c.ttl_ms),
        // tower-http's origin list panics on "*": it was met only after the
        // database had been opened and migrated (exit 101).
        ("--allow-origin", |c| c.allow_origin = vec!["*".into()]),
        ("--allow-origin: \"http://a\\nb\" can never match", |c| {
            c.allow_origin = vec!["http://a\nb".into()]
        }),
    ];
    for (flag, tweak) in tweaks {
        let mut config = Config::for_tests(&database.display().to_string(), "admin");
        tweak(&mut config);
        match Server::start(&config).await {
            Err(StartError::Config(message)) => {
                assert!(message.contains(flag), "{flag}: {message}");
            }
            Err(other) => panic!("{flag}: {other}"),
            Ok(server) => {
                server.stop().await.unwrap();
                panic!("{flag}: started");
            }
        }
    }
    assert!(!database.exists(), "refused before the database was opened");
}

/// The binary exits with clap's usage error (status 2) naming the flag.
#[test]
fn the_binary_exits_with_a_usage_error_naming_the_flag() {
    for (args, flag) in [
        (&["--reaper-ms", "0"][..], "--reaper-ms"),
        (&["--ttl-ms", "3000"], "--heartbeat-ms"),
        (
            &["--allow-origin", "http://127.0.0.1:8080,*"],
            "--allow-origin",
        ),
    ] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_agentstore-server"))
            .args(["--listen", "127.0.0.1:0", "--database", "sqlite::memory:"])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Bounded: a binary that accepted the flags would serve forever.
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break Some(status);
            }
            if Instant::now() > deadline {
                child.kill().unwrap();
                child.wait().unwrap();
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut stderr = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut stderr)
            .unwrap();
        let status = status.unwrap_or_else(|| panic!("{args:?}: still running after 30 s"));
        assert_eq!(status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(flag), "{args:?}: {stderr}");
    }
}

/// An `--allow-origin` entry no browser's `Origin` header could ever equal
/// is refused at startup naming it: before, such entries were accepted and
/// every browser call from that page failed CORS with nothing saying why.
/// Origins as browsers send them (RFC 6454 §6.2) are accepted, of any
/// scheme (an extension's, an app shell's), and `null` (a sandboxed
/// iframe's or a `file:` page's opaque origin).
#[test]
fn an_allow_origin_entry_that_can_never_match_is_refused_naming_it() {
    for bad in [
        "https://app.example.com/",
        "https://app.example.com/path",
        "https://*.example.com",
        "HTTP://LOCALHOST:3000",
        "http://LOCALHOST:3000",
        "Https://app.example.com",
        "not an origin",
        "app.example.com",
        "1http://files.example.com",
        "http://::1",
        "http://h:080",
        "https://user@app.example.com",
        "http://127.0.0.1:80",
        "https://app.example.com:443",
        "http://127.0.0.1:99999",
        "http://127.0.0.1:x",
        "http://[::1",
        "http://",
        "http://127.0.0.1:8080:*",
        "https://bücher.example",
    ] {
        let err = parse(&["--allow-origin", bad])
            .map(drop)
            .expect_err(&format!("{bad:?} accepted"));
        let text = err.to_string();
        assert!(
            text.contains("--allow-origin") && text.contains(bad),
            "{bad}: {text}"
        );
    }
    for good in [
        "http://127.0.0.1:*",
        "https://app.example.com",
        "http://localhost:3000",
        "http://[::1]:8080",
        "http://[::1]:*",
        "https://xn--bcher-kva.example",
        "chrome-extension://abcdefghijklmnopabcdefghijklmnop",
        "capacitor://localhost",
        "null",
        "http://127.0.0.1:8080,https://app.example.com",
    ] {
        parse(&["--allow-origin", good]).unwrap_or_else(|e| panic!("{good}: {e}"));
    }
}

/// An `--allow-origin` entry whose IP address is spelled otherwise than a
/// browser spells it in `Origin` (the WHATWG URL standard's canonical form)
/// can never match: it is refused at startup, naming the entry and the form
/// to give. Before, these were accepted and every call from the page failed
/// CORS.
#[test]
fn an_allow_origin_ip_address_not_spelled_as_a_browser_sends_it_is_refused() {
    for (bad, sent) in [
        ("http://[0:0:0:0:0:0:0:1]:5173", "http://[::1]:5173"),
        (
            "http://[::ffff:127.0.0.1]:5173",
            "http://[::ffff:7f00:1]:5173",
        ),
        ("http://0x7f.0.0.1:5173", "http://127.0.0.1:5173"),
        ("http://127.1:5173", "http://127.0.0.1:5173"),
        ("http://[0:0::1]:*", "http://[::1]:*"),
    ] {
        let err = parse(&["--allow-origin", bad])
            .map(drop)
            .expect_err(&format!("{bad:?} accepted"));
        let text = err.to_string();
        assert!(
            text.contains("--allow-origin") && text.contains(bad) && text.contains(sent),
            "{bad}: {text}"
        );
        parse(&["--allow-origin", sent]).unwrap_or_else(|e| panic!("{sent}: {e}"));
    }
}

/// An admin token an `Authorization` header cannot carry (a character
/// outside printable ASCII) is refused at startup, as an empty one is
/// (helper-234: `tokén-secret` started the server and every admin call was
/// `401`, the admin locked out with no message).
#[test]
fn an_admin_token_a_header_cannot_carry_is_refused_at_startup() {
    for token in ["tokén-secret", "tab\there", "nul\u{7f}"] {
        let err = parse(&["--admin-token", token]).unwrap_err().to_string();
        assert!(err.contains("--admin-token"), "{token:?}: {err}");
        assert!(
            err.contains("printable ASCII") || err.contains("whitespace"),
            "{token:?}: {err}"
        );
    }
    assert!(parse(&["--admin-token", "A-z_0.9~!"]).is_ok());
}
