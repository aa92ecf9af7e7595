//! `fastpath maio bench --quick --format json`: the document of the paper's
//! Figures 2-4.

mod common;

#[test]
fn maio_bench_quick_json_document() {
    let v = common::json(&[
        "maio",
        "bench",
        "--quick",
        "--format",
        "json",
        "--seconds",
        "0.1",
    ]);
    for m in ["sendmsg", "sendmmsg", "io_uring", "maio"] {
        let pps = v["figure2"][m]["pps"]
            .as_f64()
            .unwrap_or_else(|| panic!("figure2.{m}"));
        assert!(pps > 1000.0, "figure2.{m} = {pps}");
    }
    let cpb = |f: &str, m: &str| -> f64 {
        let x = v[f][m]["cycles_per_byte"]
            .as_f64()
            .unwrap_or_else(|| panic!("{f}.{m}"));
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
    for m in ["read_write", "splice", "io_uring", "maio", "maio_no_sqpoll"] {
        cpb("figure4", m);
    }
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
fn maio_bench_runs_only_the_figures_asked_for() {
    let bench = || {
        let mut c = common::fastpath();
        c.args(["maio", "bench", "--format", "json", "--reps", "1"])
            .args(["--seconds", "0.05"]);
        c
    };
    let v = common::json_of(bench().args(["--figure", "2"]));
    assert!(v["figure2"]["maio"]["pps"].as_f64().unwrap() > 0.0);
    for f in ["figure3", "figure3_udp_veth", "figure4"] {
        assert!(v.get(f).is_none(), "{f} was not asked for");
    }
    let bad = bench().args(["--figure", "5"]).output().unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("5"));
}
