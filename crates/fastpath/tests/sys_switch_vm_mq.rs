//! A guest with two vCPUs and two queue pairs on `fastpath switch run`:
//! QEMU asks the switch's port for two pairs (`queues=2`), the guest's
//! driver turns both on (`ethtool -L eth0 combined 2`), it pings another
//! guest, and pktgen from two threads, one per transmit queue, reaches the
//! switch on both queues, as its status shows; turned down to one pair,
//! the second pair stops and only the first carries traffic.
//!
//! System test: it needs root, QEMU 10 and the guest image
//! (scripts/setup.sh), and fails naming whichever is missing. It boots
//! guests, so it holds the machine (`systest::exclusive`).

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::vm::{port, ready, start_switch, status};
use lab::guest::{Guest, GuestOpts, Nic};
use lab::netns::Netns;

const MAC_A: &str = "52:54:00:72:00:01";
const MAC_B: &str = "52:54:00:72:00:02";
const IP_A: &str = "10.77.0.1";
const IP_B: &str = "10.77.0.2";
/// Frames per pktgen thread.
const FRAMES: u64 = 4_000;

/// The queue pairs of `vm-a` in the switch's status, in order.
fn pairs(ctl: &Path) -> Vec<serde_json::Value> {
    let s = status(ctl).expect("status");
    let d = port(&s, "vm-a")["detail"].clone();
    d["pairs"]
        .as_array()
        .unwrap_or_else(|| panic!("no pairs: {d}"))
        .clone()
}

/// Transmit chains each pair of `vm-a` has completed.
fn tx_chains(ctl: &Path) -> Vec<u64> {
    pairs(ctl)
        .iter()
        .map(|p| p["queues"]["tx"]["chains"].as_u64().unwrap_or(0))
        .collect()
}

/// Which pairs of `vm-a` run.
fn running(ctl: &Path) -> Vec<bool> {
    pairs(ctl).iter().map(|p| p["running"] == true).collect()
}

/// Wait up to 10 s for `vm-a`'s pairs to run as `want` says.
fn wait_running(ctl: &Path, want: &[bool]) {
    let t = std::time::Instant::now();
    loop {
        let r = running(ctl);
        if r == want {
            return;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "pairs running {r:?}, expected {want:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
#[ignore = "system test: root, namespaces, QEMU, the guest image"]
fn a_two_vcpu_guest_sends_on_both_queue_pairs() {
    let _machine = ready();
    let pid = std::process::id();
    let dir = std::env::temp_dir().join(format!("fp-switch-vm-mq-{pid}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let ns = Netns::new(&format!("fpvmq{}", pid % 100_000)).expect("namespace");
    let ctl: PathBuf = dir.join("switch.sock");
    let (sock_a, sock_b) = (dir.join("vm-a.sock"), dir.join("vm-b.sock"));
    let _sw = start_switch(
        &ns,
        &ctl,
        &[
            "--vhost-user".into(),
            format!("{},mac={MAC_A},queues=2", sock_a.display()),
            "--vhost-user".into(),
            format!("{},mac={MAC_B}", sock_b.display()),
        ],
    );
    let s = status(&ctl).unwrap();
    assert_eq!(port(&s, "vm-a")["detail"]["queue_pairs"], 2);
    let limit = Duration::from_secs(600);
    let oa = GuestOpts::new("A", vec![Nic::vhost_user(&sock_a, MAC_A).queues(2)])
        .cpus(2)
        .ip(&format!("{IP_A}/24"))
        .limit(limit);
    let ob = GuestOpts::new("B", vec![Nic::vhost_user(&sock_b, MAC_B)])
        .ip(&format!("{IP_B}/24"))
        .limit(limit);
    let mut a = Guest::start(&oa).expect("start A");
    let mut b = Guest::start(&ob).expect("start B");
    a.wait_ready(lab::guest::BOOT).expect("A boots");
    b.wait_ready(lab::guest::BOOT).expect("B boots");

    // Both pairs on (the driver's default with two vCPUs; said anyway).
    let l = a.set_queues("eth0", 2).expect("ethtool -L eth0 combined 2");
    assert!(
        l.contains("Combined:\t2") || l.contains("Combined:        2"),
        "{l}"
    );
    wait_running(&ctl, &[true, true]);
    let p = a.ping(IP_B, 6, 200).expect("ping");
    assert!(p.received * 2 >= 6, "A -> B: {p:?}; {}", a.console_tail());

    // Two pktgen threads, one per transmit queue: both queues carry them.
    let c0 = tx_chains(&ctl);
    let r = a
        .pktgen_queues(
            "eth0",
            2,
            FRAMES,
            60,
            32,
            MAC_B,
            IP_B,
            Duration::from_secs(300),
        )
        .expect("pktgen on two queues");
    assert!(r.iter().all(|t| t.sent >= FRAMES), "{r:?}");
    std::thread::sleep(Duration::from_secs(1));
    let c1 = tx_chains(&ctl);
    let d: Vec<u64> = c1.iter().zip(&c0).map(|(x, y)| x - y).collect();
    assert!(
        d[0] >= FRAMES && d[1] >= FRAMES,
        "transmit chains per pair: {d:?} (each thread sent {FRAMES})"
    );
    assert!(d[2..].iter().all(|&x| x == 0), "{d:?}");

    // Down to one pair: the second stops, and one pktgen thread's frames
    // all come on the first.
    a.set_queues("eth0", 1).expect("ethtool -L eth0 combined 1");
    wait_running(&ctl, &[true, false]);
    let c2 = tx_chains(&ctl);
    let r = a
        .pktgen_queues(
            "eth0",
            1,
            FRAMES,
            60,
            32,
            MAC_B,
            IP_B,
            Duration::from_secs(300),
        )
        .expect("pktgen on one queue");
    assert!(r[0].sent >= FRAMES, "{r:?}");
    std::thread::sleep(Duration::from_secs(1));
    let c3 = tx_chains(&ctl);
    assert!(c3[0] - c2[0] >= FRAMES, "{c2:?} -> {c3:?}");
    assert_eq!(c3[1], c2[1], "the pair turned off carries nothing");
    let p = a.ping(IP_B, 4, 200).expect("ping");
    assert!(p.received * 2 >= 4, "A -> B on one pair: {p:?}");
    drop(a);
    drop(b);
    drop(_sw);
    drop(ns);
    let _ = std::fs::remove_dir_all(&dir);
}
