//! Health checks through the tunnel: with `via =
//! "tunnel"`, a check goes GRE-encapsulated to the backend with the VIP as
//! inner destination, through the backend's decapsulation agent, the way
//! client traffic goes. Killing a backend's `fastpath lb decap` (its nginx
//! still running and answering on its own address) takes that backend out
//! within fall x interval, and only that one.

mod common;

use std::time::{Duration, Instant};

use lab::topology::Topology;

fn healthy(t: &Topology, addr: &str) -> Option<bool> {
    let m = t.api("GET", "/metrics").ok()?;
    let line = m.lines().find(|l| {
        l.starts_with("fastpath_lb_backend_healthy{") && l.contains(&format!("address=\"{addr}\""))
    })?;
    Some(line.trim_end().ends_with(" 1"))
}

#[test]
#[ignore = "system test: root, namespaces, nginx"]
fn a_dead_decap_agent_is_detected_by_tunnel_checks() {
    let mut t = common::topology(1, 3, "h");
    let conf = std::fs::read_to_string(&t.config).unwrap();
    assert!(conf.contains("fall = 2 }"), "{conf}");
    std::fs::write(
        &t.config,
        conf.replace("fall = 2 }", "fall = 2, via = \"tunnel\" }"),
    )
    .unwrap();
    t.start_lb().unwrap();
    t.wait_for_vip(Duration::from_secs(30)).unwrap();

    // Through the tunnel, every backend answers: all stay healthy.
    std::thread::sleep(Duration::from_millis(1500));
    for b in ["10.10.3.2", "10.10.4.2", "10.10.5.2"] {
        assert_eq!(
            healthy(&t, b),
            Some(true),
            "{b} before the fault:\n{}",
            t.api("GET", "/metrics").unwrap_or_default()
        );
    }

    // Backend 1's decapsulation dies; its nginx keeps running.
    t.procs.stop("decap1");
    let killed = Instant::now();
    while healthy(&t, "10.10.3.2") != Some(false) {
        assert!(
            killed.elapsed() < Duration::from_secs(5),
            "backend 1 still healthy {:?} after its decap agent died",
            killed.elapsed()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let took = killed.elapsed();
    // fall (2) x interval (200 ms) plus the timeout (300 ms), with slack
    // for a loaded machine.
    assert!(took < Duration::from_millis(2_500), "took {took:?}");
    for b in ["10.10.4.2", "10.10.5.2"] {
        assert_eq!(healthy(&t, b), Some(true), "{b} after backend 1's fault");
    }
    // New connections now avoid backend 1.
    let by = t.requests(60).unwrap();
    assert_eq!(by.get("backend-1"), None, "{by:?}");
    assert_eq!(by.get(""), None, "failed requests: {by:?}");
    eprintln!("backend 1 out {took:?} after its decap agent died");
}
