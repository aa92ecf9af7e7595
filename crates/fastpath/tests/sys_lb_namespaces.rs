//! The load balancer on real interfaces, end to end, in the topology of
//! `make demo` (lab::topology): client, router (BIRD), load balancer
//! (AF_PACKET, BIRD), three nginx backends behind `fastpath lb decap`.
//! Real HTTP through the VIP with direct server return; BGP announce and
//! withdraw; the API; health-check failover with established connections to
//! the other backends unaffected; a rejected and an accepted reload.

use std::time::{Duration, Instant};

use lab::topology::{HttpConn, Topology, VIP};

fn wait_for(t: &Topology, what: &str, f: &dyn Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}; metrics:\n{}",
            t.api("GET", "/metrics").unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn metric(t: &Topology, line_start: &str) -> Option<u64> {
    t.api("GET", "/metrics")
        .ok()?
        .lines()
        .find(|l| l.starts_with(line_start))?
        .split_whitespace()
        .last()?
        .parse()
        .ok()
}

#[test]
#[ignore = "system test: root, namespaces"]
fn http_through_the_vip_failover_reload_and_bgp() {
    systest::require_netns();
    systest::require_programs(&["bird", "birdc", "nginx"]);
    let tag = format!("t{}", std::process::id() % 100_000);
    let mut t = Topology::build(
        std::path::Path::new(env!("CARGO_BIN_EXE_fastpath")),
        3,
        &tag,
    )
    .unwrap();
    t.start_lb().unwrap();
    t.wait_for_vip(Duration::from_secs(20)).unwrap();

    // BGP: the router learned the VIP from the load balancer.
    assert!(
        t.router_route().contains("via 10.10.2.2"),
        "router: {}",
        t.router_route()
    );
    let learned = t.router_bird_route();
    assert!(
        learned.contains("lb1") && learned.contains("BGP") && learned.contains("65001"),
        "router's BIRD: {learned}"
    );

    // Real HTTP, each request a new flow: every one answered, by every backend.
    let by = t.requests(60).unwrap();
    assert_eq!(by.get(""), None, "no request failed: {by:?}");
    assert_eq!(by.len(), 3, "all three backends answer: {by:?}");

    // Long-lived connections, one per backend reached.
    let mut conns: Vec<(String, HttpConn)> = Vec::new();
    for _ in 0..40 {
        let mut c = Topology::inside(&t.client, HttpConn::connect)
            .unwrap()
            .unwrap();
        let who = c.get().unwrap();
        if !conns.iter().any(|(w, _)| *w == who) {
            conns.push((who, c));
        }
    }
    assert_eq!(conns.len(), 3);

    // The API from inside the load balancer's namespace.
    wait_for(&t, "per-VIP metrics", &|| {
        metric(&t, "fastpath_lb_vip_packets_total{vip=\"http\"}").is_some_and(|v| v >= 180)
    });
    let status = t.api("GET", "/status").unwrap();
    assert!(
        status.contains("\"bgp_announced\":true") && status.contains("10.10.5.2"),
        "{status}"
    );

    // Failover: backend 1's nginx stops; it leaves the table; new flows go
    // to the others, and established connections to them are unaffected.
    t.procs.stop("nginx1");
    wait_for(&t, "backend 1 marked down", &|| {
        t.api("GET", "/metrics")
            .unwrap_or_default()
            .contains("fastpath_lb_backend_healthy{backend=\"10.10.3.2\",address=\"10.10.3.2\"} 0")
    });
    let by = t.requests(40).unwrap();
    assert_eq!(
        by.get(""),
        None,
        "no request failed after the failover: {by:?}"
    );
    assert!(!by.contains_key("backend-1") && by.len() == 2, "{by:?}");
    for (who, c) in conns.iter_mut().filter(|(w, _)| w != "backend-1") {
        assert_eq!(&c.get().unwrap(), who, "an established connection moved");
    }

    // A broken configuration is rejected whole, with the reason; traffic
    // keeps flowing on the running one.
    let good = std::fs::read_to_string(&t.config).unwrap();
    std::fs::write(
        &t.config,
        good.replace("pool = \"web\"", "pool = \"nonexistent\""),
    )
    .unwrap();
    let answer = t.api("POST", "/reload").unwrap();
    assert!(
        answer.contains("error")
            && answer.contains("vips[0].pool")
            && answer.contains("nonexistent"),
        "{answer}"
    );
    assert!(t.request().is_ok(), "traffic flows after a rejected reload");
    assert_eq!(metric(&t, "fastpath_lb_reload_failures_total"), Some(1));
    // A good configuration applies, here on SIGHUP.
    std::fs::write(&t.config, &good).unwrap();
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(t.procs.pid("lb").unwrap() as i32, libc::SIGHUP) };
    wait_for(&t, "the SIGHUP reload", &|| {
        metric(&t, "fastpath_lb_reloads_total") == Some(1)
    });
    assert!(t.request().is_ok());
    // A key that cannot change while running is reported, not silently
    // ignored; the rest of the file applies.
    std::fs::write(&t.config, good.replace("threads = 2", "threads = 1")).unwrap();
    let answer = t.api("POST", "/reload").unwrap();
    assert!(
        answer.contains("\"not_applied\":[\"forwarder.threads\"]"),
        "{answer}"
    );
    assert_eq!(metric(&t, "fastpath_lb_reloads_total"), Some(2));
    std::fs::write(&t.config, &good).unwrap();

    // No healthy backend left: the VIP is withdrawn (it would only attract
    // traffic to drop); one back, and it is announced again.
    t.procs.stop("nginx2");
    t.procs.stop("nginx3");
    let deadline = Instant::now() + Duration::from_secs(10);
    while t.router_route().contains("10.10.2.2") {
        assert!(
            Instant::now() < deadline,
            "the VIP stays announced with no healthy backend"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    t.start_nginx(2).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !t.router_route().contains("10.10.2.2") {
        assert!(
            Instant::now() < deadline,
            "the VIP is not announced again when a backend recovers"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    t.wait_for_vip(Duration::from_secs(10)).unwrap();
    assert_eq!(t.request().unwrap(), "backend-2");

    // Stopping the load balancer withdraws the VIP from the router.
    let lb_out = t.procs.stop("lb");
    let deadline = Instant::now() + Duration::from_secs(10);
    while t.router_route().contains("10.10.2.2") {
        assert!(
            Instant::now() < deadline,
            "the router still routes {VIP} to a stopped load balancer"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(lb_out.contains("forwarded (GRE)"), "{lb_out}");
    for i in 1..=3 {
        let d = t.procs.stop(&format!("decap{i}"));
        assert!(
            d.contains("delivered") && !d.contains("delivered 0 "),
            "backend {i}: {d}"
        );
    }
}
