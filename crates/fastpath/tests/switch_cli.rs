//! `fastpath switch` and `fastpath pktgen` as separate processes, as a user
//! runs them.

mod common;

use std::process::{Child, Stdio};

use common::fastpath;
use std::time::{Duration, Instant};

struct Proc(Child);
impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn status(sock: &str) -> serde_json::Value {
    common::json(&["switch", "status", "--socket", sock, "--format", "json"])
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn port_names(s: &serde_json::Value) -> Vec<String> {
    s["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn switch_and_pktgen_processes() {
    let sock = std::env::temp_dir().join(format!("fp-cli-sw-{}.sock", std::process::id()));
    let sock_s = sock.to_str().unwrap().to_string();
    let sw = fastpath()
        .args(["switch", "run", "--socket", &sock_s])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut sw = Proc(sw);
    wait_for("the control socket", || sock.exists());

    // A receiver, then a sender: every frame is flooded to the receiver.
    let rx = fastpath()
        .args([
            "pktgen", "--socket", &sock_s, "--name", "rx", "--mode", "rx",
        ])
        .args(["--count", "20000", "--duration", "30", "--format", "json"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for("rx to attach", || {
        port_names(&status(&sock_s)).contains(&"rx".into())
    });
    let txr = common::json(&[
        "pktgen",
        "--socket",
        &sock_s,
        "--name",
        "tx",
        "--mode",
        "tx",
        "--count",
        "20000",
        "--rate",
        "200000",
        "--port-mode",
        "sc",
        "--itr",
        "100",
        "--format",
        "json",
    ]);
    assert_eq!(txr["packets"], 20000);
    assert!(
        txr["kicks_per_packet"].as_f64().unwrap() < 0.5,
        "SC kicked too often: {txr}"
    );
    // The receiver exits when it has all 20000. If it has not, its port's
    // counters must account for every frame: put into its ring or, if the
    // receiver was descheduled long enough for its ring to fill (a loaded
    // 2-core machine), dropped and counted. The switch never holds the
    // sender up, so drops are the designed outcome, not a failure.
    let mut rx = Proc(rx);
    let mut accounted: Option<(u64, u64)> = None;
    wait_for(
        "rx to finish or all 20000 frames to be accounted for",
        || {
            if rx.0.try_wait().unwrap().is_some() {
                return true;
            }
            let s = status(&sock_s);
            let Some(p) = s["ports"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["name"] == "rx")
            else {
                return false; // detached: it has just exited
            };
            let (to, dropped) = (
                p["to_port"].as_u64().unwrap(),
                p["dropped_full"].as_u64().unwrap(),
            );
            if to + dropped == 20000 {
                accounted = Some((to, dropped));
            }
            accounted.is_some()
        },
    );
    let mut expect = 20000;
    if let Some((delivered, dropped)) = accounted {
        assert!(
            dropped < 2000,
            "most frames must arrive: {delivered} delivered, {dropped} dropped"
        );
        expect = delivered;
        if dropped > 0 {
            // The receiver cannot reach its count; let it drain, then stop it.
            std::thread::sleep(Duration::from_secs(1));
            // SAFETY: kill(2) on our own child's pid, which has not been reaped.
            unsafe { libc::kill(rx.0.id() as i32, libc::SIGINT) };
        }
    }
    let mut rx_out = Vec::new();
    std::io::Read::read_to_end(rx.0.stdout.as_mut().unwrap(), &mut rx_out).unwrap();
    let _ = rx.0.wait();
    let rxr: serde_json::Value = serde_json::from_slice(&rx_out).unwrap();
    assert_eq!(rxr["packets"], expect, "{rxr}");

    // A pktgen killed with SIGKILL loses its port; the switch carries on.
    let mut victim = Proc(
        fastpath()
            .args([
                "pktgen", "--socket", &sock_s, "--name", "victim", "--mode", "tx",
            ])
            .args(["--duration", "30", "--rate", "10000"])
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for("victim to attach", || {
        port_names(&status(&sock_s)).contains(&"victim".into())
    });
    victim.0.kill().unwrap();
    let _ = victim.0.wait();
    wait_for("victim's port to go", || {
        !port_names(&status(&sock_s)).contains(&"victim".into())
    });

    // Attaching a second port under an existing name is refused with a reason.
    let _keep = Proc(
        fastpath()
            .args([
                "pktgen",
                "--socket",
                &sock_s,
                "--name",
                "dup",
                "--mode",
                "rx",
                "--duration",
                "30",
            ])
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for("dup to attach", || {
        port_names(&status(&sock_s)).contains(&"dup".into())
    });
    let again = fastpath()
        .args([
            "pktgen",
            "--socket",
            &sock_s,
            "--name",
            "dup",
            "--duration",
            "1",
        ])
        .output()
        .unwrap();
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("exists"));

    // SIGUSR1 prints the status; SIGTERM stops the switch and removes the socket.
    let pid = sw.0.id() as i32;
    // SAFETY: kill(2) on our own child, not yet reaped (the pid is its).
    unsafe { libc::kill(pid, libc::SIGUSR1) };
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let end = Instant::now() + Duration::from_secs(5);
    let code = loop {
        if let Some(c) = sw.0.try_wait().unwrap() {
            break c;
        }
        assert!(Instant::now() < end, "switch did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(code.success());
    let mut err = String::new();
    use std::io::Read;
    sw.0.stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(err.contains("\"ports\""), "no status on SIGUSR1: {err}");
    assert!(!sock.exists(), "socket left behind");
}

/// A memif window too short for testpmd's once-a-second reports, or a
/// switch placement the bench does not know, is refused before anything
/// starts, with the minimum stated.
#[test]
fn switch_bench_refuses_a_short_memif_window_and_an_unknown_placement() {
    let out = fastpath()
        .args(["switch", "bench", "--part", "memif", "--memif-seconds", "1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--memif-seconds must be 2..=60"), "{err}");
    assert!(err.contains("once a second"), "{err}");
    // A placement that is neither auto, none nor a CPU, the same way.
    let out = fastpath()
        .args(["switch", "bench", "--part", "memif", "--switch-cpu", "fast"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--switch-cpu") && err.contains("\"fast\""),
        "{err}"
    );
}

#[test]
fn switch_rejects_a_bad_config_and_pktgen_bad_arguments() {
    let dir = std::env::temp_dir().join(format!("fp-cli-cfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "socket = \"/tmp/x.sock\"\npoll_usec = 5\n").unwrap();
    let out = fastpath()
        .args(["switch", "run", "--config", bad.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("poll_usec") && err.contains("bad.toml"),
        "{err}"
    );

    // The flags hold to the file's bounds (at most a second). (The missing
    // file makes a run that accepted the flag end at once instead of
    // serving for ever; its error would not name the flag.)
    for flag in ["--memif-moderation-us", "--poll-us"] {
        let out = fastpath()
            .args([
                "switch",
                "run",
                "--config",
                "/nonexistent/sw.toml",
                flag,
                "2000000",
            ])
            .output()
            .unwrap();
        assert!(!out.status.success(), "{flag} 2000000 was accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(flag) && err.contains("1000000"), "{err}");
    }
    // And the bench's moderation flag the same way (refused before any
    // row runs).
    let out = fastpath()
        .args(["switch", "bench", "--memif-moderation-us", "2000000"])
        .output()
        .unwrap();
    assert!(!out.status.success(), "bench took 2000000");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--memif-moderation-us") && err.contains("1000000"),
        "{err}"
    );

    let out = fastpath()
        .args(["pktgen", "--size", "9000"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--size"));
    let out = fastpath()
        .args(["pktgen", "--socket", "/nonexistent/sw.sock"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/sw.sock"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[ignore = "system test: root (TAP devices)"]
fn switch_bench_quick_json_document() {
    // The TAP backend of Figure 1 creates TAP devices.
    systest::require_root();
    let t0 = Instant::now();
    // Figure 1 and ring-to-ring forwarding; the memif rows beside DPDK's
    // testpmd are a measurement of several seconds with two testpmd
    // processes, left to `make bench` (vswitch's memif_testpmd test checks
    // the port against testpmd).
    let v = common::json(&[
        "switch",
        "bench",
        "--quick",
        "--part",
        "figure1",
        "--part",
        "forwarding",
        "--format",
        "json",
    ]);
    for backend in ["switch", "tap"] {
        for row in [
            "base_itr0",
            "base_itr100",
            "sc_itr100",
            "csb_itr0",
            "csb_itr100",
        ] {
            let r = &v["backends"][backend][row];
            for k in [
                "tx_kpps",
                "rx_kpps",
                "mbps_1514",
                "notifications_per_packet",
                "rr_tps",
            ] {
                let x = r[k]
                    .as_f64()
                    .unwrap_or_else(|| panic!("{backend}.{row}.{k} missing"));
                assert!(x.is_finite() && x >= 0.0, "{backend}.{row}.{k} = {x}");
            }
            assert!(
                r["tx_kpps"].as_f64().unwrap() > 0.0,
                "{backend}.{row}: nothing sent"
            );
            assert!(
                r["rr_tps"].as_f64().unwrap() > 0.0,
                "{backend}.{row}: no round trips"
            );
        }
        // The modes do what they say: BASE kicks for every packet; SC and
        // CSB kick a small fraction of the time.
        let n = |row: &str| {
            v["backends"][backend][row]["notifications_per_packet"]
                .as_f64()
                .unwrap()
        };
        let k = |row: &str| {
            v["backends"][backend][row]["kicks_per_packet"]
                .as_f64()
                .unwrap()
        };
        assert!(
            k("base_itr0") >= 1.0,
            "{backend}: BASE kicked less than once a packet"
        );
        assert!(
            k("sc_itr100") < 0.5,
            "{backend}: SC kicks/packet {}",
            k("sc_itr100")
        );
        assert!(
            n("csb_itr0") < 0.5 * n("base_itr0"),
            "{backend}: CSB notified as often as BASE"
        );
    }
    assert!(v["forwarding"]["ring_to_ring_mpps"].as_f64().unwrap() > 0.0);
    // The label follows from the run's own counters: never
    // "generator-limited" while the receiver's ring dropped frames or
    // frames went missing, and drops at the receiver make it the limit.
    let f = &v["forwarding"];
    let limit = f["limit"].as_str().unwrap();
    let dropped = f["switch_dropped_at_receiver"].as_u64().unwrap();
    let figures = &f["figures"];
    let lost = figures["offered"].as_u64().unwrap() - figures["received"].as_u64().unwrap();
    assert_eq!(f["generator_limited"], limit == "generator", "{f}");
    if dropped > 0 {
        assert_eq!(limit, "receiver", "{f}");
    }
    if limit == "generator" {
        assert_eq!(dropped, 0, "{f}");
        assert!(
            lost <= figures["in_flight_allowance"].as_u64().unwrap(),
            "{f}"
        );
        assert!(f["switch_idle_pass_share"].as_f64().unwrap() > 0.5, "{f}");
    }
    // Pinned where there are two CPUs (the default), and the CPU shares
    // are of every CPU the process may use, not of the one it was pinned
    // to while sending.
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert_eq!(
        f["placement"],
        if cpus >= 2 { "pinned" } else { "scheduler" },
        "{f}"
    );
    assert_eq!(
        f["share_of_cores"]["cores"].as_f64(),
        Some(cpus as f64),
        "{f}"
    );
    eprintln!("switch bench --quick took {:?}", t0.elapsed());
}

/// The isolation part through the command line: each attack has its row,
/// the victim kept forwarding under it, the switch answered its status,
/// and a new pair forwarded after the attacker left. Loose bounds: the
/// figures themselves are the benchmark's (RELIABILITY.md).
#[test]
fn switch_bench_isolation_part_reports_every_attack() {
    let v = common::json(&[
        "switch",
        "bench",
        "--quick",
        "--part",
        "isolation",
        "--format",
        "json",
    ]);
    let iso = &v["isolation"];
    let rows = iso["rows"].as_array().unwrap_or_else(|| panic!("{v}"));
    let names: Vec<&str> = rows.iter().filter_map(|r| r["attack"].as_str()).collect();
    assert_eq!(
        names,
        ["irq-blocked", "rx-loop", "tx-long", "spoof", "idle-memif"],
        "{iso}"
    );
    for r in rows {
        assert!(
            r["attacked_fps"]["min"].as_f64().unwrap() > 0.0,
            "victim stopped: {r}"
        );
        assert!(r["status_answered"].as_u64().unwrap() > 0, "{r}");
        assert_eq!(r["status_failed"].as_u64(), Some(0), "{r}");
        assert_eq!(r["recovered"], r["repeats"], "{r}");
    }
    assert!(
        v.get("backends").is_none() && v.get("forwarding").is_none(),
        "only the part asked for: {v}"
    );
}
