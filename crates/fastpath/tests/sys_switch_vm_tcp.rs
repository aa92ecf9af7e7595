//! TCP between two virtual machines, as a user runs them: `fastpath switch
//! run` with two vhost-user ports in a throwaway namespace, two QEMU guests
//! (TCG) on them, an iperf3 server in one and its client in the other for a
//! few seconds. The transfer must complete and both ends must agree on what
//! crossed. The same pair on QEMU's TAP backend over a Linux bridge (the
//! kernel path a VM host uses without a user-space switch) shows that the
//! guests' TCP works without the switch too, and prints its rate beside.
//!
//! System tests: they need root, QEMU 10 and the guest image with iperf3
//! (scripts/setup.sh), and fail naming whichever is missing. They boot
//! guests, so they hold the machine one at a time (`systest::exclusive`).
//! Rates are printed, not asserted (TCG on a shared 2-core machine); the
//! benchmark compares them (`fastpath switch bench --part vm`).

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::vm::{port, ready, start_switch, status};
use lab::guest::{Guest, GuestOpts, Iperf, Nic};
use lab::netns::Netns;

const MAC_A: &str = "52:54:00:72:00:01";
const MAC_B: &str = "52:54:00:72:00:02";
const IP_A: &str = "10.77.0.1";
const IP_B: &str = "10.77.0.2";
/// Seconds of iperf3 traffic.
const SECS: u32 = 4;

/// Boot both guests side by side, each killed after 10 minutes whatever
/// happens; fails if the image has no iperf3 (an image older than recipe 6).
fn boot_pair(a: GuestOpts, b: GuestOpts) -> (Guest, Guest) {
    let mut ga = Guest::start(&a).unwrap_or_else(|e| panic!("A: {e}"));
    let mut gb = Guest::start(&b).unwrap_or_else(|e| panic!("B: {e}"));
    ga.wait_ready(lab::guest::BOOT).expect("A boots");
    gb.wait_ready(lab::guest::BOOT).expect("B boots");
    for g in [&mut ga, &mut gb] {
        let v = g.run("iperf3 --version", Duration::from_secs(30)).unwrap();
        assert!(
            v.0 == 0 && v.1.contains("iperf 3"),
            "{}: no iperf3 in the guest image (scripts/guest-image.sh, recipe 6): {v:?}",
            g.name()
        );
    }
    (ga, gb)
}

/// iperf3 from A to B for [`SECS`]; checks that the transfer completed and
/// that the client's and the server's reports agree; returns the
/// server's.
fn transfer(a: &mut Guest, b: &mut Guest, to: &str, what: &str) -> Iperf {
    // A first exchange learns the neighbours (ARP) and shows the path works.
    let p = a.ping(to, 3, 200).expect("ping runs");
    assert!(p.received >= 1, "{what}: A cannot reach B: {p:?}");
    b.iperf3_server(Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("{what}: iperf3 server: {e}"));
    let within = Duration::from_secs(u64::from(SECS) + 90);
    let c = a
        .iperf3_client(to, SECS, 1, within)
        .unwrap_or_else(|e| panic!("{what}: iperf3 client: {e}; B: {}", b.console_tail()));
    let s = b
        .iperf3_server_result(Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("{what}: iperf3 server report: {e}"));
    println!(
        "{what}: {:.3} Gbit/s ({} bytes in {:.1} s, {} retransmits)",
        s.gbps(),
        s.received_bytes,
        s.seconds,
        c.retransmits
    );
    assert!(
        c.sent_bytes > 0 && s.received_bytes > 0,
        "{what}: {c:?} {s:?}"
    );
    // The whole transfer: what the server read is what the client wrote,
    // short at most of what was still in flight when the test ended (a
    // few windows; 10% is far more than a TCG pair moves in one).
    assert!(
        s.received_bytes <= c.sent_bytes && s.received_bytes * 10 >= c.sent_bytes * 9,
        "{what}: client sent {} bytes, server read {}",
        c.sent_bytes,
        s.received_bytes
    );
    // The client's copy of the server's count is the server's count.
    assert_eq!(
        c.received_bytes, s.received_bytes,
        "{what}: the client's and the server's reports differ"
    );
    assert!(
        s.seconds >= f64::from(SECS) * 0.9,
        "{what}: the test ran {} s",
        s.seconds
    );
    s
}

#[test]
#[ignore = "system test: root, namespaces, QEMU, the guest image with iperf3"]
fn tcp_between_two_guests_through_the_switch() {
    let _machine = ready();
    let pid = std::process::id();
    let dir = std::env::temp_dir().join(format!("fp-switch-vm-tcp-{pid}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let ns = Netns::new(&format!("fpvtc{}", pid % 100_000)).expect("namespace");
    let ctl: PathBuf = dir.join("switch.sock");
    let (sock_a, sock_b) = (dir.join("vm-a.sock"), dir.join("vm-b.sock"));
    let sw = start_switch(
        &ns,
        &ctl,
        &[
            "--vhost-user".into(),
            format!("{},mac={MAC_A}", sock_a.display()),
            "--vhost-user".into(),
            format!("{},mac={MAC_B}", sock_b.display()),
        ],
    );
    let opts = |name: &str, sock: &Path, mac: &str, ip: &str| {
        GuestOpts::new(name, vec![Nic::vhost_user(sock, mac)])
            .ip(&format!("{ip}/24"))
            .limit(Duration::from_secs(600))
    };
    let (mut a, mut b) = boot_pair(
        opts("A", &sock_a, MAC_A, IP_A),
        opts("B", &sock_b, MAC_B, IP_B),
    );
    let before = status(&ctl).unwrap();
    let off = a.offloads("eth0").unwrap();
    println!("guest A's offloads on the switch's port: {off:?}");
    let s = transfer(&mut a, &mut b, IP_B, "A to B through the switch");
    // The bytes went through the switch's ports: A's port took at least
    // one frame per 64 KiB the server read (a frame carries at most a
    // segment), and B's port delivered frames to B.
    let after = status(&ctl).unwrap();
    let d = |p: &str, k: &str| {
        port(&after, p)[k].as_u64().unwrap() - port(&before, p)[k].as_u64().unwrap()
    };
    let (from_a, to_b) = (d("vm-a", "from_port"), d("vm-b", "to_port"));
    assert!(
        from_a >= s.received_bytes / 65_536 && to_b > 0,
        "A's port took {from_a} frames, B's got {to_b}, for {} bytes",
        s.received_bytes
    );
    for p in ["vm-a", "vm-b"] {
        let v = port(&after, p);
        assert_eq!(v["detail"]["queues"]["tx"]["broke"], 0, "{v}");
        assert_eq!(v["spoofed"], 0, "{v}");
    }
    drop(a);
    drop(b);
    drop(sw);
    drop(ns);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[ignore = "system test: root, namespaces, QEMU, the guest image with iperf3"]
fn tcp_between_two_guests_on_qemus_tap_backend_over_a_bridge() {
    let _machine = ready();
    let pid = std::process::id();
    let ns = Netns::new(&format!("fpvtb{}", pid % 100_000)).expect("namespace");
    ns.ip(&["link", "add", "name", "fpbr0", "type", "bridge"])
        .unwrap();
    ns.ip(&["link", "set", "dev", "fpbr0", "up"]).unwrap();
    let opts = |name: &str, tap: &str, mac: &str, ip: &str| {
        GuestOpts::new(name, vec![Nic::tap(tap, mac)])
            .ip(&format!("{ip}/24"))
            .netns(ns.name())
            .limit(Duration::from_secs(600))
    };
    let (mut a, mut b) = boot_pair(
        opts("A", "fpvtap0", MAC_A, IP_A),
        opts("B", "fpvtap1", MAC_B, IP_B),
    );
    for t in ["fpvtap0", "fpvtap1"] {
        ns.ip(&["link", "set", "dev", t, "master", "fpbr0"])
            .unwrap();
        ns.ip(&["link", "set", "dev", t, "up"]).unwrap();
    }
    let off = a.offloads("eth0").unwrap();
    println!("guest A's offloads on QEMU's TAP backend: {off:?}");
    let s = transfer(
        &mut a,
        &mut b,
        IP_B,
        "A to B over QEMU's TAP backend and a bridge",
    );
    assert!(s.received_bytes > 0);
    drop(a);
    drop(b);
    drop(ns);
}

/// The bench's TCP rows alone, as the full bench runs them (5 s runs, 3
/// repeats; the whole vm part runs them after every other row, and
/// `sys_switch_vm` checks them there in a quick run): every key with a
/// finite median, the ratios computed from the rates, the table printed.
/// By hand: `cargo test -p fastpath --test sys_switch_vm_tcp -- --ignored
/// --nocapture by_hand_`.
#[test]
#[ignore = "system test: root, namespaces, QEMU, the guest image with iperf3, dpdk-testpmd"]
fn by_hand_the_benchs_tcp_rows_alone() {
    let _machine = ready();
    systest::require_program("dpdk-testpmd");
    let dir = std::env::temp_dir().join(format!("fp-vm-tcp-rows-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let o = bench::vm::VmOptions {
        quick: false,
        repeats: 3,
        poll_us: 20,
        progress: Some(std::sync::Arc::new(|s: &str| eprintln!("{s}"))),
        stop: Default::default(),
        vhost_ring: lab::guest::VHOST_RING,
    };
    let r = bench::vm_tcp::run(&o, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    let r = r.expect("the TCP rows");
    print!("{}", r.to_text());
    let doc = serde_json::json!({ "vm": serde_json::to_value(&r).unwrap() });
    for k in bench::vm_tcp::KEYS {
        let v = bench::vm::at(&doc, k).unwrap_or_else(|| panic!("{k} missing: {doc}"));
        let m = v["median"].as_f64().unwrap_or_else(|| panic!("{k}: {v}"));
        assert!(m.is_finite() && m > 0.0, "{k} = {m}");
    }
    let want = r.tcp.switch.gbps.samples[0] / r.tcp.tap_bridge.gbps.samples[0];
    let got = r.tcp.ratio_over_tap_bridge.samples[0];
    assert!((got - want).abs() < 1e-9 * want, "{got} vs {want}");
}
