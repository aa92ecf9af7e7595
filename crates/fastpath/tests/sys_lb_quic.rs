//! QUIC that survives migration, through the namespace fleet: three load
//! balancers behind the router's ECMP route, three backends each running a
//! real QUIC server (quinn, `fastpath-quic-peer`) that issues QUIC-LB
//! connection IDs with its server ID. A hundred clients download, each
//! rebinding its socket to a new address and port twice mid-download (a NAT
//! rebinding, a move between networks).
//!
//! - With `quic = true` on the VIP every download completes: each datagram
//!   after a move reaches the same backend by its connection ID, whichever
//!   load balancer the router picks and whatever the new 5-tuple hashes to.
//! - The same run with `quic = false` (reloaded on every load balancer): the
//!   5-tuple sends most moved connections to a backend that does not know
//!   them, and they break. Both figures come from the same run.
//! - With QUIC-LB on again, one load balancer's machine dies mid-download
//!   (frozen, then killed: nothing withdrawn): the router moves its flows to
//!   the two others, which route every datagram by its connection ID to
//!   the same backend, and no download breaks.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use lab::quic::QuicLab;

#[test]
#[ignore = "system test: root, namespaces, BIRD, and the fastpath-quic-peer binary"]
fn migrating_quic_downloads_survive_with_quic_lb_and_break_without() {
    let mut t = common::topology(3, 3, "quic");
    let q = match QuicLab::new(&t, Path::new(env!("CARGO_BIN_EXE_fastpath"))) {
        Ok(q) => q,
        Err(e) => systest::missing(&format!("the QUIC peer: {e}")),
    };
    q.write_configs(&t, true).expect("configs");
    q.start_servers(&mut t, Duration::from_secs(300))
        .expect("QUIC servers");
    t.start_lbs().expect("start the load balancers");
    t.wait_for_vip(Duration::from_secs(30))
        .expect("the VIP answers");
    t.wait_for_ecmp(&[1, 2, 3], Duration::from_secs(30))
        .expect("all three in the route");
    let mut binds = vec!["10.10.1.2".to_string()];
    binds.extend(t.add_client_addresses(3).expect("client addresses"));

    let on = q
        .downloads(&t, &binds, 100, 200_000, 2, Duration::from_secs(30))
        .expect("downloads");
    assert_eq!(on.connections, 100, "{on:?}");
    assert_eq!(on.migrations, 200, "every connection moved twice: {on:?}");
    assert_eq!(on.broken, 0, "QUIC-LB on: {on:?}");
    assert_eq!(
        on.servers.len(),
        3,
        "the fallback spreads new connections: {on:?}"
    );
    // The load balancers counted what they routed by connection ID.
    let routed: u64 = (1..=3)
        .map(|k| {
            let m = t.api_on(k, "GET", "/metrics").expect("metrics");
            m.lines()
                .filter(|l| l.starts_with("fastpath_lb_quic_routed_total"))
                .filter_map(|l| l.split_whitespace().last()?.parse::<f64>().ok())
                .sum::<f64>() as u64
        })
        .sum();
    assert!(routed > 1000, "datagrams routed by connection ID: {routed}");

    // The same run with the VIP's QUIC routing off, on every load balancer.
    q.reload(&t, false).expect("reload with QUIC-LB off");
    let off = q
        .downloads(&t, &binds, 100, 200_000, 2, Duration::from_secs(10))
        .expect("downloads");
    eprintln!("QUIC-LB on: {on:?}\nQUIC-LB off: {off:?}");
    assert!(
        off.broken >= 50,
        "without QUIC-LB most moved connections break: {off:?}"
    );

    // QUIC-LB on again; load balancer 1's machine dies mid-download.
    q.reload(&t, true).expect("reload with QUIC-LB on");
    // Downloads 8 times longer than the first run's, so that the kill
    // lands in the middle (checked below).
    let client = q
        .start_client(&t, &binds, 100, 1_600_000, 2, Duration::from_secs(40))
        .expect("client");
    let client = ChildGuard(Some(client));
    std::thread::sleep(Duration::from_millis(500));
    let frozen = Instant::now();
    t.freeze_lb_machine(1).expect("freeze lb1");
    t.wait_for_ecmp(&[2, 3], Duration::from_secs(10))
        .expect("lb1 out of the route");
    let out_after = frozen.elapsed();
    t.kill_lb_machine(1).expect("kill lb1");
    let mut client = client.into_inner();
    let mid_stream = client.try_wait().expect("client").is_none();
    let killed = QuicLab::finish(client, Duration::from_secs(70)).expect("downloads");
    eprintln!("lb1 killed mid-download (out of the route after {out_after:?}): {killed:?}");
    assert!(
        mid_stream,
        "the downloads ended before the kill (make them longer): {killed:?}"
    );
    assert_eq!(killed.connections, 100, "{killed:?}");
    assert_eq!(
        killed.broken, 0,
        "QUIC-LB on, a load balancer killed mid-download: {killed:?}"
    );
}

/// A child killed if the test panics before it is waited for.
struct ChildGuard(Option<std::process::Child>);

impl ChildGuard {
    fn into_inner(mut self) -> std::process::Child {
        self.0.take().expect("child")
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
