//! The load balancer in the driver (`[forwarder] driver = "xdp"`, issue
//! 15): real HTTP from a client namespace through the VIP to the nginx
//! backends, with the TCP connections forwarded by the XDP program (the
//! daemon's counters say the driver forwarded them) and everything else
//! (ARP, health checks, the client's checksum-offloaded segments) still
//! handled. Then a backend goes down through its health check: the
//! driver's maps follow the tables, and new connections avoid it.

mod common;

use std::time::Duration;

#[test]
fn http_through_the_load_balancer_in_the_driver() {
    let Some(mut t) = common::topology(1, 2, "xdpd") else {
        return;
    };
    let cfg = &t.configs[0];
    let text = std::fs::read_to_string(cfg).unwrap();
    std::fs::write(
        cfg,
        text.replacen("[forwarder]\n", "[forwarder]\ndriver = \"xdp\"\n", 1),
    )
    .unwrap();
    t.start_lb().unwrap();
    t.wait_for_vip(Duration::from_secs(20)).unwrap();
    let status = t.status_of(1).unwrap();
    assert!(
        status.driver.contains("in the driver"),
        "driver: {}",
        status.driver
    );
    let status_json = |t: &lab::topology::Topology| -> serde_json::Value {
        serde_json::from_str(&t.api("GET", "/status").unwrap()).unwrap()
    };
    let before = status_json(&t);
    let by = t.requests(40).unwrap();
    assert_eq!(by.get(""), None, "no request failed: {by:?}");
    assert_eq!(by.len(), 2, "both backends answered: {by:?}");
    let forwarded = |v: &serde_json::Value| v["forwarded"].as_u64().unwrap_or(0);
    // 40 connections of several segments each from the client, through
    // the driver: its counters reach the daemon's within a publication
    // interval (100 ms).
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    let after = loop {
        let s = status_json(&t);
        if forwarded(&s) - forwarded(&before) >= 40 * 3 || std::time::Instant::now() > deadline {
            break s;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let n = forwarded(&after) - forwarded(&before);
    assert!(n >= 40 * 3, "forwarded {n}: {after}");
    let per_backend: u64 = after["vips"][0]["backends"]
        .as_array()
        .map(|a| a.iter().filter_map(|b| b["packets"].as_u64()).sum())
        .unwrap_or(0);
    assert!(
        per_backend >= n,
        "per-backend packets {per_backend} < {n}: {after}"
    );
    // The driver forwarded them, not the packet threads: every segment of
    // these connections is plain IPv4 TCP to the VIP.
    let in_driver = |v: &serde_json::Value| v["forwarded_in_driver"].as_u64().unwrap_or(0);
    let d = in_driver(&after) - in_driver(&before);
    assert!(d >= n, "the driver forwarded {d} of {n}: {after}");

    // Failover: backend 1's nginx stops, its health check takes it out of
    // the tables, the driver's maps follow, and every new connection goes
    // to backend 2.
    t.procs.stop("nginx1");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while t
        .api("GET", "/metrics")
        .unwrap_or_default()
        .contains("fastpath_lb_backend_healthy{backend=\"10.10.3.2\",address=\"10.10.3.2\"} 1")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "backend 1 never marked down"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let before = status_json(&t);
    let by = t.requests(30).unwrap();
    assert_eq!(
        by.get(""),
        None,
        "no request failed after the failover: {by:?}"
    );
    assert!(!by.contains_key("backend-1") && by.len() == 1, "{by:?}");
    std::thread::sleep(Duration::from_millis(300));
    let after = status_json(&t);
    let d = in_driver(&after) - in_driver(&before);
    assert!(
        d >= 30 * 3,
        "after the failover the driver forwarded {d}: {after}"
    );
}
