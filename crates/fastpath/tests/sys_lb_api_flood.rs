//! The API within its means: 3,000 connections to a load balancer's API,
//! without a token, opened inside its namespace while its health checks
//! probe real backends (nginx) and clients go through the VIP. The daemon
//! runs with the common soft open-files limit of 1,024 (once with the hard
//! limit above it, which the daemon raises to; once with the hard limit at
//! 1,024 too, where only sharing the descriptors out helps). The flood
//! must mark no backend down and stop no request: the API takes what the
//! limit leaves after health checks and the datapath, and closes the rest
//! of the connections at once. The operator's `/status` is answered during
//! the flood (a connection that asks pushes out one that sent nothing).

mod common;

use std::net::{SocketAddr, TcpStream};
use std::process::Stdio;
use std::time::{Duration, Instant};

use lab::topology::{Topology, API};

/// Connections the flood opens.
const FLOOD: usize = 3_000;

/// Starts load balancer 1 under `prlimit --nofile=LIMITS`, logging to
/// `log`.
fn start_limited(t: &mut Topology, limits: &str, log: &std::path::Path) {
    let file = std::fs::File::create(log).unwrap();
    let err = file.try_clone().unwrap();
    // On the load balancer's machine as the topology runs it (its own
    // /run/fastpath, where its BIRD reads the routes file).
    let nofile = format!("--nofile={limits}");
    let config = t.config.to_string_lossy().into_owned();
    let child = t
        .lb_machine_command(
            1,
            &[
                "prlimit",
                &nofile,
                "--",
                env!("CARGO_BIN_EXE_fastpath"),
                "lb",
                "run",
                "--config",
                &config,
                "--interface",
                "l0",
            ],
        )
        .unwrap()
        .stdin(Stdio::null())
        .stdout(file)
        .stderr(err)
        .spawn()
        .unwrap();
    t.procs.push("lb", child);
}

/// `/status` as JSON, from inside the load balancer's namespace.
fn status(t: &Topology) -> serde_json::Value {
    serde_json::from_str(&t.api("GET", "/status").unwrap()).unwrap()
}

/// Opens `n` connections to the API from inside the load balancer's
/// namespace and keeps them (sending nothing); how many were opened.
fn flood(t: &Topology, n: usize) -> Vec<TcpStream> {
    let api: SocketAddr = API.parse().unwrap();
    Topology::inside(t.lb(), move || {
        (0..n)
            .filter_map(|_| TcpStream::connect_timeout(&api, Duration::from_secs(1)).ok())
            .collect::<Vec<_>>()
    })
    .unwrap()
}

#[test]
#[ignore = "system test: root, namespaces, nginx, prlimit"]
fn an_api_flood_marks_no_backend_down_and_forwarding_goes_on() {
    systest::require_netns();
    systest::require_program("prlimit");
    // This process holds the flood's sockets: its own limit must allow
    // them.
    let mine = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    if mine.maximum.is_some_and(|h| h < FLOOD as u64 + 512) {
        systest::missing(&format!(
            "a hard open-files limit of at least {} (ulimit -Hn)",
            FLOOD + 512
        ));
    }
    rustix::process::setrlimit(
        rustix::process::Resource::Nofile,
        rustix::process::Rlimit {
            current: mine.maximum,
            maximum: mine.maximum,
        },
    )
    .unwrap();
    let mut t = common::topology(1, 2, "af");
    for (what, limits) in [
        ("soft limit 1,024, hard above", "1024:"),
        ("soft and hard limit 1,024", "1024:1024"),
    ] {
        let log = t.dir.join(format!("lb-{}.log", limits.replace(':', "-")));
        start_limited(&mut t, limits, &log);
        if let Err(e) = t.wait_for_vip(Duration::from_secs(30)) {
            let said = std::fs::read_to_string(&log).unwrap_or_default();
            panic!("{what}: {e}\n--- the load balancer said:\n{said}");
        }
        let before = status(&t);
        assert_eq!(before["health_changes"], 0, "{what}: {before}");
        let cap = before["api"]["max_connections"].as_u64().unwrap();
        assert!((4..=512).contains(&cap), "{what}: {before}");

        let started = Instant::now();
        let held = flood(&t, FLOOD);
        eprintln!(
            "{what}: {} of {FLOOD} connections opened in {:.1?} (the API keeps {cap})",
            held.len(),
            started.elapsed()
        );
        // The operator is answered during the flood: a connection that
        // asks at once takes the place of one of the flood's, which sent
        // nothing.
        let asked = Instant::now();
        let during = t.api("GET", "/status");
        let took = asked.elapsed();
        eprintln!("{what}: /status during the flood answered in {took:.1?}");
        assert!(
            during
                .as_ref()
                .is_ok_and(|b| b.contains("\"health_changes\"")),
            "{what}: the operator got no answer during the flood: {during:?}"
        );
        assert!(took < Duration::from_secs(2), "{what}: took {took:?}");
        // While the flood's connections are held (the API closes its own
        // share after its idle timeout, 10 s), clients keep being served.
        // At least 2 s of requests however long the flood took to open
        // (19 s once, on a loaded machine, which left no window at all).
        let (mut requests, mut failed) = (0, 0);
        let serve_until =
            (started + Duration::from_secs(12)).max(Instant::now() + Duration::from_secs(2));
        while Instant::now() < serve_until {
            let by = t.requests(5).unwrap();
            requests += 5;
            failed += by.get("").copied().unwrap_or(0);
            std::thread::sleep(Duration::from_millis(200));
        }
        drop(held);
        // The API answers again, and says what it refused.
        let deadline = Instant::now() + Duration::from_secs(15);
        let after = loop {
            if let Ok(body) = t.api("GET", "/status") {
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(&body) {
                    break v;
                }
            }
            assert!(
                Instant::now() < deadline,
                "{what}: the API did not come back"
            );
            std::thread::sleep(Duration::from_millis(200));
        };
        let logs = std::fs::read_to_string(&log).unwrap_or_default();
        assert_eq!(
            after["health_changes"], 0,
            "{what}: a backend was marked down during the flood: {after}\n{logs}"
        );
        for v in after["vips"].as_array().unwrap() {
            for b in v["backends"].as_array().unwrap() {
                assert_eq!(b["healthy"], true, "{what}: {b}");
            }
        }
        assert_eq!(
            failed, 0,
            "{what}: {failed} of {requests} requests failed\n{logs}"
        );
        assert!(
            after["forwarded"].as_u64() > before["forwarded"].as_u64(),
            "{what}: nothing forwarded during the flood: {before} {after}"
        );
        assert!(
            after["api"]["refused"].as_u64().unwrap() > 0,
            "{what}: the API held the whole flood: {after}"
        );
        assert!(logs.contains("HTTP API: at most"), "{what}: {logs}");
        if limits == "1024:" {
            assert!(
                logs.contains("open files: soft limit raised from 1024"),
                "{what}: {logs}"
            );
        }
        t.procs.stop("lb");
    }
}
