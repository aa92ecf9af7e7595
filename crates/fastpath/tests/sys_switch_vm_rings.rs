//! The receiving guest's rings, compared by hand: guest to guest over
//! guest to sink and TCP between two guests, with the guests' vhost-user
//! rings at 256 entries (QEMU's default) and at 1024 (the lab's), runs
//! alternated with the same binary. Prints the table that BENCHMARKS.md
//! quotes; asserts only that each run's guests ran the rings asked for and
//! that every figure was measured.
//!
//! By hand: `cargo test -p fastpath --test sys_switch_vm_rings --
//! --ignored --nocapture by_hand_` (about 10 minutes on two cores).
//!
//! System test: it needs root, QEMU 10 and the guest image with iperf3
//! (scripts/setup.sh), and fails naming whichever is missing.

mod common;

use common::vm::ready;

#[test]
#[ignore = "system test: root, QEMU 10, the guest image with iperf3"]
fn by_hand_rings_256_and_1024_alternated() {
    let _machine = ready();
    let dir = std::env::temp_dir().join(format!("fp-vm-rings-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let rounds = std::env::var("FP_RINGS_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let o = bench::vm::VmOptions {
        quick: false,
        repeats: 3,
        poll_us: 20,
        progress: Some(std::sync::Arc::new(|s: &str| eprintln!("{s}"))),
        stop: Default::default(),
        vhost_ring: lab::guest::VHOST_RING,
    };
    let runs = bench::vm_rings::alternate(&o, &dir, &[256, 1024], rounds);
    let _ = std::fs::remove_dir_all(&dir);
    let runs = runs.expect("the runs");
    print!("{}", bench::vm_rings::summary(&runs));
    for r in &runs {
        assert_eq!(
            (r.guest_b_rings.rx, r.guest_b_rings.tx),
            (u32::from(r.vhost_ring), u32::from(r.vhost_ring)),
            "{r:?}"
        );
        assert!(r.tcp4_gbps > 0.0 && r.tcp1_gbps > 0.0, "{r:?}");
        assert!(
            r.guest_to_guest
                .ratio_over_sink
                .samples
                .iter()
                .all(|x| x.is_finite()),
            "{r:?}"
        );
    }
}
