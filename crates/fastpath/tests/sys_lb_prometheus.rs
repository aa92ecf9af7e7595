//! A real Prometheus server (Debian's `prometheus`, a scraper and parser we
//! did not write) scrapes the load balancer's /metrics inside its
//! namespace; a query for a per-backend counter returns what /status says.
//! The shipped Grafana dashboard (dashboards/fastpath-lb.json) is valid
//! JSON and every query in it names a metric the load balancer exports.

mod common;

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use lab::topology::Topology;

const PROM: &str = "127.0.0.1:19090";

/// GET `path` from `addr` (run inside a namespace); the body.
fn get(addr: &str, path: &str) -> Option<String> {
    let mut s =
        std::net::TcpStream::connect_timeout(&addr.parse().ok()?, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .ok()?;
    let mut a = String::new();
    s.read_to_string(&mut a).ok()?;
    a.split_once("\r\n\r\n").map(|(_, b)| b.to_string())
}

/// The whole answer (head and body) to `GET path` with `Accept: accept`
/// from `addr` (run inside a namespace).
fn get_accepting(addr: &str, path: &str, accept: &str) -> Option<String> {
    let mut s =
        std::net::TcpStream::connect_timeout(&addr.parse().ok()?, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(
        format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\nAccept: {accept}\r\n\r\n").as_bytes(),
    )
    .ok()?;
    let mut a = String::new();
    s.read_to_string(&mut a).ok()?;
    Some(a)
}

/// `query` to the Prometheus in the load balancer's namespace: the first
/// result's value, if any.
fn query(t: &Topology, q: &str) -> Option<f64> {
    let path = format!(
        "/api/v1/query?query={}",
        q.bytes()
            .map(|b| match b {
                b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' => (b as char).to_string(),
                _ => format!("%{b:02X}"),
            })
            .collect::<String>()
    );
    let body = Topology::inside(t.lb(), move || get(PROM, &path)).ok()??;
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    v["data"]["result"][0]["value"][1].as_str()?.parse().ok()
}

#[test]
#[ignore = "system test: root, namespaces, BIRD, nginx, Prometheus"]
fn prometheus_scrapes_the_load_balancer_and_the_dashboard_names_real_metrics() {
    systest::require_program("prometheus");
    let mut t = common::topology(1, 3, "p");
    t.start_lb().unwrap();
    t.wait_for_vip(Duration::from_secs(30)).unwrap();
    let by = t.requests(30).unwrap();
    assert_eq!(by.values().sum::<usize>(), 30, "{by:?}");
    assert!(!by.contains_key(""), "{by:?}");

    let conf = t.dir.join("prometheus.yml");
    std::fs::write(
        &conf,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: fastpath\n    static_configs:\n      - targets: ['{}']\n",
            lab::topology::API
        ),
    )
    .unwrap();
    let data = t.dir.join("prometheus-data");
    let prom = t
        .lb()
        .command("prometheus")
        .arg(format!("--config.file={}", conf.display()))
        .arg(format!("--storage.tsdb.path={}", data.display()))
        .arg(format!("--web.listen-address={PROM}"))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    t.procs.push("prometheus", prom);

    // The scrape is healthy, and the per-backend counter Prometheus stored
    // is the one /status reports (no traffic meanwhile: they must match).
    // The packet threads publish their counters periodically: wait until
    // two readings a second apart agree, so the 30 requests are all in.
    let packets = |t: &Topology| -> u64 {
        let status: serde_json::Value =
            serde_json::from_str(&t.api("GET", "/status").unwrap()).unwrap();
        status["vips"][0]["backends"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["address"] == "10.10.3.2")
            .unwrap()["packets"]
            .as_u64()
            .unwrap()
    };
    let settle = Instant::now() + Duration::from_secs(15);
    let mut want = packets(&t);
    loop {
        std::thread::sleep(Duration::from_secs(1));
        let now = packets(&t);
        if (now == want && now > 0) || Instant::now() > settle {
            want = now;
            break;
        }
        want = now;
    }
    assert!(want > 0, "backend 1 got no packets");
    let deadline = Instant::now() + Duration::from_secs(30);
    let (mut up, mut got) = (None, None);
    while Instant::now() < deadline {
        up = query(&t, "up{job=\"fastpath\"}");
        got = query(
            &t,
            "fastpath_lb_backend_packets_total{address=\"10.10.3.2\"}",
        );
        if up == Some(1.0) && got == Some(want as f64) {
            break;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    let logs = t.procs.stop("prometheus");
    assert_eq!(up, Some(1.0), "the scrape failed: {logs}");
    assert_eq!(
        got,
        Some(want as f64),
        "Prometheus has {got:?}, /status {want}"
    );

    // A scraper that asks for the classic text format gets it; the default
    // stays OpenMetrics.
    for (accept, want, eof) in [
        (
            "text/plain;version=0.0.4",
            "text/plain; version=0.0.4",
            false,
        ),
        ("*/*", "application/openmetrics-text", true),
    ] {
        let answer = Topology::inside(t.lb(), move || {
            get_accepting(lab::topology::API, "/metrics", accept)
        })
        .unwrap()
        .unwrap();
        let (head, body) = answer.split_once("\r\n\r\n").unwrap();
        assert!(
            head.to_ascii_lowercase()
                .contains(&format!("content-type: {want}")),
            "{accept}: {head}"
        );
        assert_eq!(body.contains("# EOF"), eof, "{accept}");
        assert!(
            body.contains("\nfastpath_lb_backend_packets_total{"),
            "{accept}: {body}"
        );
    }

    // The dashboard: JSON, and every metric its queries name is exported.
    let metrics = t.api("GET", "/metrics").unwrap();
    let dash: serde_json::Value =
        serde_json::from_str(include_str!("../../../dashboards/fastpath-lb.json")).unwrap();
    let mut exprs = Vec::new();
    for p in dash["panels"].as_array().unwrap() {
        for q in p["targets"].as_array().unwrap() {
            exprs.push(q["expr"].as_str().unwrap().to_string());
        }
    }
    assert!(exprs.len() >= 10, "{exprs:?}");
    let mut names = 0;
    for e in &exprs {
        let mut rest = e.as_str();
        while let Some(i) = rest.find("fastpath_lb_") {
            let name: String = rest[i..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            // Families a single box without [fleet] or [tracer] does not
            // export are checked by name in the exposition code instead.
            let optional = name.starts_with("fastpath_lb_fleet_")
                || name.starts_with("fastpath_lb_fragments_redirected")
                || name.starts_with("fastpath_lb_trace_");
            assert!(
                optional
                    || metrics.lines().any(|l| l.starts_with(&format!("{name}{{"))
                        || l.starts_with(&format!("{name} "))),
                "the dashboard's {name} is not in /metrics"
            );
            if optional {
                let family = name.trim_end_matches("_total");
                assert!(
                    include_str!("../../lbd/src/metrics.rs").contains(&format!("\"{family}\"")),
                    "the dashboard's {name} is not exported by lbd::metrics"
                );
            }
            names += 1;
            rest = &rest[i + name.len()..];
        }
    }
    assert!(names >= exprs.len(), "{exprs:?}");
}
