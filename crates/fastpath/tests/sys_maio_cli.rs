//! `fastpath maio bench --quick --format json`: the document of the paper's
//! Figures 2-4.

mod common;

#[test]
#[ignore = "system test: memlock over 8 MiB for registered io_uring buffers (root, or ulimit -l)"]
fn maio_bench_quick_json_document() {
    systest::require_memlock(64 << 20);
    let v = common::json(&[
        "maio",
        "bench",
        "--quick",
        "--format",
        "json",
        "--seconds",
        "0.1",
    ]);
    let spread = |f: &str, m: &str, k: &str| -> [f64; 3] {
        let g = |s: &str| {
            v[f][m][k][s]
                .as_f64()
                .unwrap_or_else(|| panic!("{f}.{m}.{k}.{s}"))
        };
        let x = [g("min"), g("median"), g("max")];
        assert!(x[0] <= x[1] && x[1] <= x[2], "{f}.{m}.{k} = {x:?}");
        x
    };
    for f in ["figure2", "figure2_veth"] {
        for m in [
            "sendmsg",
            "sendmmsg",
            "sendmsg_udp_gso",
            "io_uring",
            "maio",
            "maio_no_sqpoll",
            "maio_no_sqpoll_unsegmented",
        ] {
            let pps = spread(f, m, "pps");
            assert!(pps[0] > 1000.0, "{f}.{m} = {pps:?}");
            // The application thread is part of every thread.
            let app = spread(f, m, "pps_per_app_core");
            let cpu = spread(f, m, "pps_per_cpu");
            assert!(app[1] >= cpu[1] * 0.99, "{f}.{m}: {app:?} < {cpu:?}");
            spread(f, m, "pps_per_cpu");
        }
        let base = &v[f]["sendmsg"]["vs_sendmsg"]["pps"];
        assert_eq!(base["median"], 1.0, "{f}: sendmsg against itself");
        let chosen = v[f]["maio_choice"]["method"].as_str().unwrap();
        assert!(["maio", "maio_no_sqpoll"].contains(&chosen), "{chosen}");
        assert!(v[f]["load_average"]["before"][0].is_number());
    }
    // Into the veth every datagram reached the far end as a frame of its
    // own, segmented sends included (the kernel segments before the device).
    for m in ["sendmsg", "sendmsg_udp_gso", "maio_no_sqpoll"] {
        let fr = spread("figure2_veth", m, "frames_per_send");
        assert!(
            (0.999..=1.001).contains(&fr[0]) && (0.999..=1.001).contains(&fr[2]),
            "{m}: frames at the sink per datagram {fr:?}"
        );
    }
    // Without SQPOLL the sends are batched: far fewer system calls than sends.
    let sc = v["figure2"]["maio_no_sqpoll"]["syscalls_per_send"]
        .as_f64()
        .unwrap();
    assert!(
        sc < 0.5,
        "batched submission made {sc} system calls per send"
    );
    let cpb = |f: &str, m: &str| -> f64 {
        let x = spread(f, m, "cycles_per_byte")[1];
        assert!(x.is_finite() && x > 0.0, "{f}.{m} = {x}");
        x
    };
    for m in [
        "send",
        "msg_zerocopy",
        "sendfile",
        "io_uring_send_zc",
        "maio",
    ] {
        cpb("figure3", m);
    }
    for m in [
        "read_write",
        "splice",
        "io_uring",
        "maio",
        "maio_sqpoll_idle_1ms",
        "maio_no_sqpoll",
    ] {
        cpb("figure4", m);
        // Every proxy's machine-wide cost less the no-proxy pipeline's in
        // the same round, and its ratio to splice's.
        let added = spread("figure4", m, "added_cycles_per_byte")[1];
        assert!(added.is_finite(), "figure4.{m} added {added}");
        assert!(v["figure4"][m]["vs_splice"]["added_cycles_per_byte"]["median"].is_f64());
    }
    // The pipeline without a proxy: the peers' work, no proxy cycles.
    let floor = spread("figure4", "no_proxy", "machine_cycles_per_byte")[1];
    assert!(floor.is_finite() && floor > 0.0, "no_proxy machine {floor}");
    assert_eq!(spread("figure4", "no_proxy", "cycles_per_byte")[1], 0.0);
    assert!(v["figure4"]["no_proxy"]
        .get("added_cycles_per_byte")
        .is_none());
    // No ratios of its zero proxy cycles to splice's: it is the floor.
    assert_eq!(v["figure4"]["no_proxy"]["floor"], true);
    assert!(v["figure4"]["no_proxy"].get("vs_splice").is_none());
    assert!(v["figure4"]["splice"].get("floor").is_none());
    for m in ["send", "msg_zerocopy", "io_uring_send_zc", "maio"] {
        cpb("figure3_udp_veth", m);
    }
    // The kernel copies zero-copy data delivered to a local socket, and says
    // so; into a dropping veth it need not.
    for m in ["msg_zerocopy", "io_uring_send_zc", "maio"] {
        assert_eq!(v["figure3"][m]["copied"], true, "figure3.{m}");
        assert_eq!(
            v["figure3_udp_veth"][m]["copied"], false,
            "figure3_udp_veth.{m}"
        );
    }
}

#[test]
#[ignore = "system test: memlock over 8 MiB for registered io_uring buffers (root, or ulimit -l)"]
fn maio_bench_runs_only_the_figures_asked_for() {
    systest::require_memlock(64 << 20);
    let bench = || {
        let mut c = common::fastpath();
        c.args(["maio", "bench", "--format", "json", "--reps", "1"])
            .args(["--seconds", "0.05"]);
        c
    };
    let v = common::json_of(bench().args(["--figure", "2"]));
    assert!(v["figure2"]["maio"]["pps"]["median"].as_f64().unwrap() > 0.0);
    for f in ["figure3", "figure3_udp_veth", "figure4"] {
        assert!(v.get(f).is_none(), "{f} was not asked for");
    }
    let bad = bench().args(["--figure", "5"]).output().unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("5"));
}
