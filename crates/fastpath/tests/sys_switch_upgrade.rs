//! The switch restarted under running guests: two TCG guests ping each
//! other through `fastpath switch run` (QEMU's vhost-user chardevs with
//! `reconnect-ms=100`); the switch is stopped, with `SIGTERM` and then
//! with `SIGKILL` (its sockets left behind as stale files), and a new one
//! started at once on the same sockets. Pings must come back within 5 s
//! of the stop (the goal is 1 s; the bound is loose for a loaded two-core
//! machine, and each measured gap is printed), neither guest may
//! reboot (its boot id stays the same), and neither guest's link may
//! change (a link taken down and up costs the guest a second of ARP
//! retry: its neighbours are flushed and the request it sends while down
//! is lost).
//!
//! System test: it needs root, QEMU 10 and the guest image
//! (scripts/setup.sh), and fails naming whichever is missing. It boots
//! guests, so it holds the machine (`systest::exclusive`).

use std::path::Path;

use bench::vm_upgrade::{measure, Upgrade};
use rustix::process::Signal;

/// The loose bound on a ping gap, ms (goal: 1,000).
const GAP_BOUND_MS: f64 = 5000.0;

fn ready() -> systest::Exclusive {
    systest::require_root();
    if let Some(what) = lab::guest::missing() {
        systest::missing(&what);
    }
    systest::exclusive()
}

fn run(tag: &str, sig: Signal) -> Upgrade {
    let dir = std::env::temp_dir().join(format!("fp-switch-upgrade-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let exe = Path::new(env!("CARGO_BIN_EXE_fastpath"));
    let say = |s: &str| eprintln!("{s}");
    let u = measure(exe, &dir, 2, sig, &say).unwrap_or_else(|e| panic!("{tag}: {e:#}"));
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!(
        "{tag}: ping gap {:?} ms (goal <= 1000), switch down {:?} ms, guests' queues running again after {:?} ms",
        u.ping_gap_ms.samples, u.switch_down_ms.samples, u.reconnected_ms.samples
    );
    assert_eq!(u.not_resumed, 0, "{tag}: pings did not come back: {u:?}");
    assert_eq!(u.reboots, 0, "{tag}: a guest rebooted: {u:?}");
    assert_eq!(
        u.carried_by_new_switch, 2,
        "{tag}: the new switch did not carry both guests' frames: {u:?}"
    );
    // The guests' links stay up across the restart: a link taken down
    // flushes the guest's neighbours and costs a second of ARP retry.
    for (i, b) in u.breakdown.iter().enumerate() {
        assert_eq!(
            b.carrier_changes,
            [0, 0],
            "{tag}: restart {}: the guests' links changed: {}",
            i + 1,
            b.line()
        );
    }
    for g in &u.ping_gap_ms.samples {
        assert!(*g <= GAP_BOUND_MS, "{tag}: a gap of {g} ms: {u:?}");
    }
    u
}

#[test]
#[ignore = "system test: root, QEMU 10, the guest image"]
fn guests_keep_their_network_across_a_switch_restart() {
    let _machine = ready();
    run("term", Signal::TERM);
}

#[test]
#[ignore = "system test: root, QEMU 10, the guest image"]
fn guests_keep_their_network_across_a_switch_crash() {
    let _machine = ready();
    run("kill", Signal::KILL);
}
