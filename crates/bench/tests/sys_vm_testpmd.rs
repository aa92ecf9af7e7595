//! The vm part's testpmd rows on this machine: one TCG guest with a NIC on
//! the switch and a NIC on DPDK testpmd's vhost PMD, pktgen on each. What
//! is checked is that both backends took the guest's frames and every
//! figure is there (rates are the benchmark's to judge, not a test's).
//! `FP_VM_TESTPMD_REPEATS` (default 1) runs more repeats, and the rows
//! are printed: `cargo test -p bench --test sys_vm_testpmd -- --ignored
//! --nocapture`.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

#[test]
#[ignore = "system test: root, QEMU 10, the guest image, DPDK testpmd"]
fn the_guest_transmits_into_the_switch_and_into_testpmd() {
    systest::require_root();
    systest::require_programs(&["dpdk-testpmd", "qemu-system-x86_64", "stdbuf"]);
    assert!(
        lab::guest::available(),
        "the guest image is needed (scripts/guest-image.sh)"
    );
    let repeats = std::env::var("FP_VM_TESTPMD_REPEATS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let quick = std::env::var_os("FP_VM_TESTPMD_FULL").is_none();
    let o = bench::vm::VmOptions {
        quick,
        repeats,
        poll_us: vswitch::Config::default().poll_us,
        progress: Some(Arc::new(|s: &str| eprintln!("{s}"))),
        stop: Arc::new(AtomicBool::new(false)),
        vhost_ring: lab::guest::VHOST_RING,
    };
    let t = bench::vm_testpmd::run(&o).unwrap_or_else(|e| panic!("{}", chain(&e)));
    eprintln!(
        "{}",
        bench::vm_testpmd::TestpmdPart::Measured(Box::new(t.clone())).to_text()
    );
    eprintln!("{}", serde_json::to_string_pretty(&t).unwrap());
    for r in [&t.burst1, &t.burst32] {
        for (what, s) in [
            ("switch pps", &r.switch_pps),
            ("testpmd pps", &r.testpmd_pps),
            ("ratio", &r.ratio),
            ("kicks per packet", &r.kicks_per_packet),
            ("switch CPU", &r.switch_cpu_ns_per_packet),
            ("testpmd CPU", &r.testpmd_cpu_ns_per_packet),
        ] {
            assert_eq!(s.samples.len(), repeats, "burst {} {what}", r.burst);
            assert!(
                s.min.is_some_and(|x| x.is_finite() && x >= 0.0),
                "burst {} {what}: {s:?}",
                r.burst
            );
        }
        assert!(r.switch_pps.min.unwrap() > 100.0, "burst {}", r.burst);
        assert!(r.testpmd_pps.min.unwrap() > 100.0, "burst {}", r.burst);
        // testpmd counted (most of) what pktgen sent it: the PMD took the
        // guest's frames, not a black hole.
        assert!(
            r.testpmd_received_share.min.is_some_and(|x| x > 0.9),
            "burst {}: {:?}",
            r.burst,
            r.testpmd_received_share
        );
    }
    assert!(t.placement.pinned.iter().all(|&p| p), "{:?}", t.placement);
}

fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(x) = src {
        s += &format!(": {x}");
        src = x.source();
    }
    s
}
