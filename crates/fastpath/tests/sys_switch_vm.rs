//! Virtual machines on the switch, as a user runs them: `fastpath switch
//! run` with two vhost-user ports and a TAP port, in a throwaway namespace;
//! two QEMU guests (TCG) attached to the VM ports exchange traffic with each
//! other and with the namespace's kernel through the TAP port; one guest's
//! QEMU is killed while it transmits and the switch keeps serving the
//! other, then a new QEMU takes the dead one's port; and `fastpath switch
//! bench --part vm --quick` reports every key it promises.
//!
//! System tests: they need root, QEMU 10 and the guest image
//! (scripts/setup.sh), and fail naming whichever is missing. They boot
//! guests, so they hold the machine one at a time (`systest::exclusive`).

mod common;

use std::path::{Path, PathBuf};

use std::time::{Duration, Instant};

use common::fastpath;
use common::vm::{port, ready, start_switch, status};
use lab::guest::{Guest, GuestOpts, Nic};
use lab::netns::Netns;

const MAC_A: &str = "52:54:00:71:00:01";
const MAC_B: &str = "52:54:00:71:00:02";
const TAP: &str = "fpvmt0";
const HOST_IP: &str = "10.76.0.254";
const IP_A: &str = "10.76.0.1";
const IP_B: &str = "10.76.0.2";

fn boot(sock: &Path, mac: &str, ip: &str, name: &str) -> Guest {
    let o = GuestOpts::new(name, vec![Nic::vhost_user(sock, mac)])
        .ip(&format!("{ip}/24"))
        .limit(Duration::from_secs(900));
    Guest::start(&o).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn ping_ok(g: &mut Guest, to: &str, n: u32) {
    let p = g.ping(to, n, 200).expect("ping runs");
    assert!(
        p.received * 2 >= n,
        "{} -> {to}: {}/{} replies; console: {}",
        g.name(),
        p.received,
        n,
        g.console_tail()
    );
}

#[test]
#[ignore = "system test: root, namespaces, QEMU, the guest image"]
fn guests_talk_to_each_other_and_to_a_tap_port_through_the_switch() {
    let _machine = ready();
    let pid = std::process::id();
    let dir = std::env::temp_dir().join(format!("fp-switch-vm-{pid}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let ns = Netns::new(&format!("fpvmt{}", pid % 100_000)).expect("namespace");
    let ctl: PathBuf = dir.join("switch.sock");
    let (sock_a, sock_b) = (dir.join("vm-a.sock"), dir.join("vm-b.sock"));
    let _sw = start_switch(
        &ns,
        &ctl,
        &[
            "--tap".into(),
            TAP.into(),
            "--vhost-user".into(),
            format!("{},mac={MAC_A}", sock_a.display()),
            "--vhost-user".into(),
            format!("{},mac={MAC_B},mode=sc,itr=100", sock_b.display()),
        ],
    );
    ns.ip(&["link", "set", "dev", TAP, "up"]).unwrap();
    ns.ip(&["addr", "add", &format!("{HOST_IP}/24"), "dev", TAP])
        .unwrap();
    let s = status(&ctl).unwrap();
    assert_eq!(port(&s, "vm-a")["kind"], "vhost-user");
    assert_eq!(port(&s, "vm-a")["locked_mac"], MAC_A);
    assert_eq!(port(&s, "vm-b")["detail"]["mode"], "sc");

    let mut a = boot(&sock_a, MAC_A, IP_A, "A");
    let mut b = boot(&sock_b, MAC_B, IP_B, "B");
    a.wait_ready(lab::guest::BOOT).expect("A boots");
    b.wait_ready(lab::guest::BOOT).expect("B boots");

    // The guests' drivers run the 1024-entry rings the lab asks QEMU for
    // (QEMU's default is 256), and the switch serves them.
    for g in [&mut a, &mut b] {
        let out = g.ok("ethtool -g eth0", Duration::from_secs(30)).unwrap();
        let r = bench::vm_rings::parse_rings(&out).unwrap_or_else(|| panic!("{out}"));
        assert_eq!((r.rx, r.tx), (1024, 1024), "{}: {out}", g.name());
    }
    // Guest to guest, and each guest to the TAP port's kernel.
    ping_ok(&mut a, IP_B, 6);
    ping_ok(&mut b, IP_A, 6);
    ping_ok(&mut a, HOST_IP, 4);
    ping_ok(&mut b, HOST_IP, 4);
    // A blast from A to B: every frame accounted for at B's port.
    let rx0 = b.stat("eth0", "rx_packets").unwrap();
    let before = port(&status(&ctl).unwrap(), "vm-b");
    let sent = a
        .pktgen(
            "eth0",
            20_000,
            60,
            32,
            MAC_B,
            IP_B,
            Duration::from_secs(300),
        )
        .expect("pktgen");
    assert!(sent.sent >= 20_000, "{sent:?}");
    std::thread::sleep(Duration::from_secs(1));
    let s = status(&ctl).unwrap();
    let (va, vb) = (port(&s, "vm-a"), port(&s, "vm-b"));
    let into_b = vb["to_port"].as_u64().unwrap() - before["to_port"].as_u64().unwrap();
    let lost_b = vb["dropped_full"].as_u64().unwrap() - before["dropped_full"].as_u64().unwrap();
    assert!(
        into_b + lost_b >= 20_000,
        "B's port took {into_b} and dropped {lost_b} of 20,000"
    );
    let rx1 = b.stat("eth0", "rx_packets").unwrap();
    assert!(rx1 - rx0 > 0, "B received nothing");
    assert!(va["from_port"].as_u64().unwrap() >= 20_000, "{va}");
    // The VM ports count their notifications, and nothing was refused.
    for v in [&va, &vb] {
        let d = &v["detail"];
        assert!(d["kicks"].as_u64().is_some(), "{v}");
        assert!(d["interrupts"].as_u64().unwrap() > 0, "{v}");
        assert_eq!(d["queues"]["tx"]["broke"], 0, "{v}");
        assert_eq!(v["spoofed"], 0, "{v}");
    }
    let tap = port(&s, TAP);
    assert!(tap["from_port"].as_u64().unwrap() >= 4, "{tap}");
    // The table shows the VM ports with their per-packet figures.
    let out = fastpath()
        .args(["switch", "status", "--socket"])
        .arg(&ctl)
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("vhost-user") && table.contains("kicks/pkt"),
        "{table}"
    );

    // QEMU killed mid-traffic: A's port records it, B keeps being served.
    let pid_a = a.pid();
    let blast = std::thread::spawn(move || {
        let r = a.pktgen(
            "eth0",
            2_000_000,
            60,
            32,
            MAC_B,
            IP_B,
            Duration::from_secs(60),
        );
        (a, r)
    });
    std::thread::sleep(Duration::from_secs(3));
    if let Some(p) = rustix::process::Pid::from_raw(pid_a as i32) {
        rustix::process::kill_process(p, rustix::process::Signal::KILL).expect("kill QEMU");
    }
    let (_dead, r) = blast.join().unwrap();
    assert!(r.is_err(), "pktgen in a killed guest cannot finish");
    let t = Instant::now();
    loop {
        let s = status(&ctl).unwrap();
        let va = port(&s, "vm-a");
        if va["detail"]["connected"] == false {
            let why = va["detail"]["last_close"].as_str().unwrap_or_default();
            assert!(why.contains("closed"), "{va}");
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "A still attached: {va}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    ping_ok(&mut b, HOST_IP, 3);
    // A new QEMU on A's socket: the port serves it from a fresh start.
    let mut a2 = boot(&sock_a, MAC_A, IP_A, "A again");
    a2.wait_ready(lab::guest::BOOT).expect("A boots again");
    ping_ok(&mut a2, IP_B, 4);
    let s = status(&ctl).unwrap();
    assert!(port(&s, "vm-a")["detail"]["accepted"].as_u64().unwrap() >= 2);
    drop(a2);
    drop(b);
    drop(_sw);
    drop(ns);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[ignore = "system test: root, namespaces, QEMU, the guest image"]
fn bench_part_vm_reports_its_keys_with_ratios_and_limits() {
    let _machine = ready();
    let doc = common::json(&[
        "switch", "bench", "--part", "vm", "--quick", "--format", "json",
    ]);
    for k in bench::vm::KEYS.iter().chain(&bench::vm_tcp::KEYS) {
        let v = bench::vm::at(&doc, k).unwrap_or_else(|| panic!("{k} missing: {doc}"));
        for s in ["min", "median", "max"] {
            let x = v[s].as_f64().unwrap_or_else(|| panic!("{k}.{s}: {v}"));
            assert!(x.is_finite() && x >= 0.0, "{k}.{s} = {x}");
        }
    }
    let vm = &doc["vm"];
    // Rates are rates, ratios are computed from them.
    assert!(vm["vhost_user"]["guest_tx_pps"]["median"].as_f64().unwrap() > 100.0);
    assert!(vm["qemu_tap"]["guest_tx_pps"]["median"].as_f64().unwrap() > 100.0);
    let r = vm["ratio_vhost_user_over_tap"]["median"].as_f64().unwrap();
    let want = vm["vhost_user"]["guest_tx_pps"]["samples"][0]
        .as_f64()
        .unwrap()
        / vm["qemu_tap"]["guest_tx_pps"]["samples"][0]
            .as_f64()
            .unwrap();
    assert!((r - want).abs() < 1e-6 * want, "ratio {r} vs {want}");
    let n = vm["vhost_user"]["notifications_per_packet"]["median"]
        .as_f64()
        .unwrap();
    assert!(n < 2.0, "notifications per packet {n}");
    assert!(vm["guest_to_guest"]["ratio_over_sink"]["median"]
        .as_f64()
        .is_some());
    // Every scheme and every e1000 row, each naming its limit.
    for s in ["base", "moderated", "sc", "csb", "csb_itr100"] {
        for b in ["burst1", "burst32"] {
            let row = &vm["vhost_user"]["schemes"][s][b];
            assert!(
                row["limit"].as_str().is_some_and(|l| l.contains("TCG")),
                "{s} {b}: {row}"
            );
        }
    }
    for k in [
        "moderation_off_burst1",
        "moderation_off_burst32",
        "moderation_on_burst1",
        "moderation_on_burst32",
    ] {
        let row = &vm["e1000"][k];
        assert!(row["limit"].as_str().is_some(), "{k}: {row}");
        assert!(
            row["interrupts_per_packet"]["median"].as_f64().is_some(),
            "{k}: {row}"
        );
    }
    // Whether the throttling bound is measured, not assumed.
    assert!(
        vm["e1000"]["throttled_over_unthrottled_irq_per_packet_burst1"]
            .as_f64()
            .is_some()
    );
    for k in ["qemu_tap", "guest_to_sink", "guest_to_guest"] {
        assert!(vm[k]["limit"].as_str().is_some(), "{k} names no limit");
    }
    assert!(vm["machine"]["load_avg_1min"]["median"].as_f64().is_some());
    assert_eq!(vm["machine"]["accel"], "tcg");
}
