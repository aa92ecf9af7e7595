//! The `fastpath` binary as a user runs it.

mod common;

use common::fastpath;

/// What the tests that run `lb bench --topology veth` need, held while
/// they run: each pins its generator to CPU 0 and the device under test to
/// CPU 1, so two at once would halve each other's rates and the rates'
/// sanity checks would test the contention instead (CI once saw nftables
/// deliver 0.47 of what reached d0 while the other veth bench ran).
fn veth_bench_alone() -> systest::Exclusive {
    systest::require_netns();
    systest::require_program("nft");
    systest::exclusive()
}

#[test]
fn hash_eval_json_document() {
    // 6553 and 65537 are both prime.
    let v = common::json(&[
        "lb",
        "hash-eval",
        "--quick",
        "--format",
        "json",
        "--backends",
        "100",
        "--sizes",
        "6553,65537",
        "--repetitions",
        "3",
    ]);
    for method in ["maglev", "karger", "rendezvous"] {
        for m in ["6553", "65537"] {
            let r = &v["results"][method][m];
            assert!(r["max_share_pct"].as_f64().unwrap() >= r["min_share_pct"].as_f64().unwrap());
            assert!(r["gen_ms"].as_f64().unwrap() > 0.0);
        }
    }
    // Maglev is within one entry of M/N at both sizes.
    for (m, r) in v["results"]["maglev"].as_object().unwrap() {
        let m: f64 = m.parse().unwrap();
        let fair = m / 100.0;
        let max = r["max_entries"].as_f64().unwrap();
        let min = r["min_entries"].as_f64().unwrap();
        assert!(
            max - fair < 1.0 && fair - min < 1.0,
            "M={m}: {min}..{max} vs {fair}"
        );
        let d = r["disruption"].as_array().unwrap();
        assert_eq!(d.len(), 3);
        assert!(d.iter().all(|p| p["changed_pct"].as_f64().unwrap() > 0.0));
    }
}

#[test]
fn non_prime_size_is_a_clear_error() {
    let out = fastpath()
        .args(["lb", "hash-eval", "--quick", "--sizes", "65536"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("65536") && err.contains("not prime") && err.contains("65537"),
        "{err}"
    );
}

#[test]
fn plots_land_in_the_plot_dir() {
    let dir = std::env::temp_dir().join(format!("fastpath-cli-plots-{}", std::process::id()));
    let out = fastpath()
        .args([
            "lb",
            "hash-eval",
            "--quick",
            "--backends",
            "50",
            "--sizes",
            "5003",
        ])
        .arg("--plot-dir")
        .arg(&dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Figure 11") && text.contains("Figure 12"));
    for f in ["figure11.svg", "figure12.svg"] {
        let s = std::fs::read_to_string(dir.join(f)).unwrap();
        assert!(s.contains("<svg"));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn lb_bench_json_document() {
    let v = common::json(&[
        "lb",
        "bench",
        "--packets",
        "20000",
        "--repeats",
        "1",
        "--threads",
        "0,1",
        "--format",
        "json",
    ]);
    for kind in [
        "syn",
        "non_syn",
        "constant",
        "null",
        "non_syn_v6",
        "null_v6",
        "udp",
        "quic_plaintext",
        "quic_single_pass",
        "quic_four_pass",
    ] {
        for t in ["0", "1"] {
            let c = &v["results"][kind][t];
            assert!(c["mpps"].as_f64().unwrap() > 0.0, "{kind}/{t}");
            assert!(
                (c["ns_per_packet"].as_f64().unwrap() * c["mpps"].as_f64().unwrap() - 1000.0).abs()
                    < 1e-6
            );
            // Every generated packet was forwarded: the rate is of real work.
            assert_eq!(c["forwarded"], 20000, "{kind}/{t}");
            if kind.starts_with("null") {
                assert!(c.get("ratio_to_null").is_none());
            } else {
                // IPv6 traffic stands beside the null forwarder on the
                // same IPv6 frames, the rest beside the IPv4 one.
                let null = if kind.ends_with("_v6") {
                    "null_v6"
                } else {
                    "null"
                };
                let r = c["ratio_to_null"].as_f64().unwrap();
                let n = v["results"][null][t]["mpps"].as_f64().unwrap();
                let m = c["mpps"].as_f64().unwrap();
                assert!((r - m / n).abs() < 1e-9, "{kind}/{t}: {r} vs {m}/{n}");
            }
            // QUIC rows stand beside plain UDP's, measured in the same run
            // (the bench refuses a run whose datagrams were not all routed
            // by connection ID).
            if kind.starts_with("quic") {
                let r = c["ratio_to_udp"].as_f64().unwrap();
                let (q, u) = (
                    c["mpps"].as_f64().unwrap(),
                    v["results"]["udp"][t]["mpps"].as_f64().unwrap(),
                );
                assert!((r - q / u).abs() < 1e-9, "{kind}/{t}: {r} vs {q}/{u}");
            } else {
                assert!(c.get("ratio_to_udp").is_none(), "{kind}/{t}");
            }
        }
    }
    // The non-SYN packet's stages, each timed, summed beyond parse, beside
    // the difference to null of the run-to-completion rows (threads 0),
    // for IPv4 and for IPv6.
    for (stages, above, kind, null) in [
        ("stages", "above_null_ns", "non_syn", "null"),
        ("stages_v6", "above_null_v6_ns", "non_syn_v6", "null_v6"),
    ] {
        bench_stages(&v, stages, above, kind, null);
    }
}

fn bench_stages(v: &serde_json::Value, stages: &str, above: &str, kind: &str, null: &str) {
    let st = &v[stages];
    let names: Vec<&str> = st["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["stage"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "parse",
            "flow_hash",
            "vip_match",
            "conntrack_hit",
            "maglev_pick",
            "checksum_check",
            "encapsulate"
        ],
        "{st}"
    );
    let ns = |name: &str| {
        st["stages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["stage"] == name)
            .unwrap()["ns"]
            .as_f64()
            .unwrap()
    };
    for n in &names {
        assert!(ns(n) > 0.0, "{n}: {st}");
    }
    let beyond: f64 = names
        .iter()
        .filter(|n| !["parse", "maglev_pick"].contains(n))
        .map(|n| ns(n))
        .sum();
    assert!(
        (st["sum_ns"].as_f64().unwrap() - beyond).abs() < 1e-6,
        "{st}"
    );
    let above = v[above].as_f64().unwrap();
    let (f, n) = (
        v["results"][kind]["0"]["ns_per_packet"].as_f64().unwrap(),
        v["results"][null]["0"]["ns_per_packet"].as_f64().unwrap(),
    );
    assert!((above - (f - n)).abs() < 1e-6, "{above} vs {f} - {n}");
    assert!(!st["cpu"].as_str().unwrap().is_empty(), "{st}");
}

/// The bench starts with 8, 16 and 32 packet threads: its pool follows
/// the thread count (it once stopped at 8 with "forwarder.pool_buffers:
/// 16384 cannot fill the queues").
#[test]
fn lb_bench_starts_with_many_packet_threads() {
    let v = common::json(&[
        "lb",
        "bench",
        "--packets",
        "4000",
        "--repeats",
        "1",
        "--threads",
        "8,16,32",
        "--format",
        "json",
    ]);
    for kind in ["syn", "non_syn", "constant", "null"] {
        for t in ["8", "16", "32"] {
            let c = &v["results"][kind][t];
            assert!(c["mpps"].as_f64().unwrap() > 0.0, "{kind}/{t}: {v}");
            assert_eq!(c["forwarded"], 4000, "{kind}/{t}");
        }
    }
}

/// `lb bench --scaling --format json`: every mode at every thread count
/// under `scaling.<mode>.<threads>`, with figures that agree with each
/// other (not that they are fast: this machine is shared).
#[test]
fn lb_bench_scaling_json_document() {
    let v = common::json(&[
        "lb",
        "bench",
        "--scaling",
        "--packets",
        "20000",
        "--repeats",
        "1",
        "--threads",
        "2,3",
        "--format",
        "json",
    ]);
    let cpus = v["cpus"].as_u64().unwrap() as usize;
    assert!(cpus >= 1, "{v}");
    assert!(
        v["generator"]["mpps_per_queue"].as_f64().unwrap() > 0.0,
        "{v}"
    );
    assert!(!v["load_average"].as_str().unwrap().is_empty(), "{v}");
    for mode in ["per_queue", "steering", "null_per_queue", "null_steering"] {
        // 1 is measured too: efficiency is relative to it.
        let one = v["scaling"][mode]["1"]["mpps"].as_f64().unwrap();
        for t in [1usize, 2, 3] {
            let c = &v["scaling"][mode][t.to_string()];
            let mpps = c["mpps"].as_f64().unwrap();
            assert!(mpps > 0.0, "{mode}/{t}: {v}");
            // Every frame offered is forwarded; one queue offers all
            // 20000, several stop when the first has offered its share.
            let offered = c["offered"].as_u64().unwrap();
            assert_eq!(c["forwarded"], offered, "{mode}/{t}: {v}");
            if t == 1 || !mode.ends_with("per_queue") {
                assert_eq!(offered, 20000, "{mode}/{t}: {v}");
            } else {
                assert!(
                    (20000 / t as u64..=20000).contains(&offered),
                    "{mode}/{t}: {v}"
                );
            }
            let per = c["mpps_per_thread"].as_f64().unwrap();
            assert!((per * t as f64 - mpps).abs() < 1e-9 * mpps.max(1.0), "{v}");
            // Run to completion, each loop's magazines absorb its bursts:
            // the depot is visited while they fill (about 14 times a
            // queue), not once every 64 packets (15.6 per 1000) as when
            // two loops traded their buffers through it.
            let trips = c["depot_trips_per_kpkt"].as_f64().unwrap();
            // (With more workers than CPUs they take turns, and do more.)
            if mode.ends_with("per_queue") && t <= cpus {
                assert!(trips < 5.0, "{mode}/{t}: {trips} depot trips per 1000: {v}");
            }
            let eff = c["efficiency"].as_f64().unwrap();
            assert!(
                (eff - mpps / (t as f64 * one)).abs() < 1e-9,
                "{mode}/{t}: efficiency {eff} is not total / (N x one): {v}"
            );
            let placement = c["placement"].as_array().unwrap();
            if mode.ends_with("per_queue") {
                // Each worker pinned, when there are CPUs enough, to a CPU
                // of its own.
                assert_eq!(placement.len(), t, "{mode}/{t}: {v}");
                if t <= cpus {
                    let mut on: Vec<u64> = placement.iter().map(|p| p.as_u64().unwrap()).collect();
                    on.sort_unstable();
                    on.dedup();
                    assert_eq!(on.len(), t, "{mode}/{t}: {v}");
                }
            } else {
                assert_eq!(placement.len(), 1, "{mode}/{t}: {v}");
            }
            assert!(placement
                .iter()
                .all(|p| (p.as_u64().unwrap() as usize) < cpus.max(64)));
        }
    }
}

#[test]
#[ignore = "system test: root, namespaces, nftables"]
fn lb_bench_veth_json_document() {
    let _alone = veth_bench_alone();
    let v = common::json(&[
        "lb",
        "bench",
        "--topology",
        "veth",
        "--generator",
        "afxdp",
        "--seconds",
        "0.5",
        "--format",
        "json",
    ]);
    // Every device under test, driven by the same generator: what it was
    // offered, what came out, and a row is valid only when the generator
    // offered at least 1.5 times what the device delivered.
    for k in ["fastpath", "fastpath_ipv6", "nftables", "xdp_forwarder"] {
        let r = &v["results"][k];
        let offered = r["offered_mpps"].as_f64().unwrap();
        let delivered = r["delivered_mpps"].as_f64().unwrap();
        assert!(delivered > 0.0, "{k} forwarded nothing: {v}");
        assert!(offered > 0.0, "{k}: nothing offered: {v}");
        assert_eq!(
            r["valid"].as_bool().unwrap(),
            offered >= 1.5 * delivered,
            "{k}: validity disagrees with its own figures: {v}"
        );
        assert!(r["drops"].as_u64().is_some(), "{v}");
    }
    // The whole run is valid only if every row is.
    let all = v["results"]
        .as_object()
        .unwrap()
        .values()
        .all(|r| r["valid"].as_bool().unwrap());
    assert_eq!(v["valid"].as_bool().unwrap(), all, "{v}");
    assert!(v["ratio_to_nftables"].as_f64().unwrap() > 0.0);
    assert!(v["ratio_to_xdp_forwarder"].as_f64().unwrap() > 0.0);
    ipv6_ratio_is_the_rows(&v);
    quic_ratio_is_the_rows(&v);
    // The generator alone (into a sink): what it can offer at all.
    assert!(v["generator_alone"]["offered_mpps"].as_f64().unwrap() > 0.0);
    let fp = &v["results"]["fastpath"];
    let note = fp["note"].as_str().unwrap();
    assert!(note.contains("driver"), "{v}");
    // On AF_XDP the forwarder transmits the frame it received: no copy in
    // user space.
    if note.contains("AF_XDP") {
        assert_eq!(fp["copies_per_packet"].as_f64(), Some(0.0), "{v}");
    }
}

/// With more veth queues the generator must offer more than with one, or
/// the bench refuses, giving both figures and why; it no longer measures a
/// generator that more queues slow down.
#[test]
#[ignore = "system test: root, namespaces, nftables"]
fn lb_bench_veth_refuses_queues_that_offer_no_more() {
    let _alone = veth_bench_alone();
    let out = fastpath()
        .args([
            "lb",
            "bench",
            "--topology",
            "veth",
            "--gen-queues",
            "2",
            "--seconds",
            "0.5",
            "--format",
            "json",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    if err.contains("namespace") && !out.status.success() && !err.contains("no more than") {
        // No namespaces here: nothing to measure.
        return;
    }
    if out.status.success() {
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["generator_queues"], 2, "{v}");
        assert!(v["generator_alone"]["offered_mpps"].as_f64().unwrap() > 0.0);
    } else {
        assert!(
            err.contains("with 2 veth queues the generator alone offers")
                && err.contains("no more than with one")
                && err.contains("--gen-queues"),
            "{err}"
        );
    }
}

/// `fastpath ... | head -1`: the reader goes away before fastpath writes.
/// Rust ignores SIGPIPE, so every print then fails with EPIPE; the command
/// must end quietly (no panic message, success) rather than report a bug.
#[test]
fn closed_output_pipe_ends_quietly() {
    for args in [
        &["disk", "presets"][..],
        &[
            "lb",
            "hash-eval",
            "--quick",
            "--backends",
            "50",
            "--sizes",
            "6553",
            "--repetitions",
            "2",
        ][..],
        &["--help"][..],
    ] {
        let mut child = fastpath()
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // Close the read end at once: every write fails with EPIPE.
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !err.contains("panicked") && !err.contains("Broken pipe"),
            "{args:?}: {err}"
        );
        assert!(out.status.success(), "{args:?}: {:?} {err}", out.status);
    }
}

/// The top-level help names every subsystem that exists, and nothing that
/// "arrives later".
#[test]
fn top_level_help_describes_what_exists() {
    let out = fastpath().arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for sub in ["lb", "switch", "pktgen", "maio", "disk"] {
        assert!(
            help.contains(&format!("  {sub} ")),
            "{sub} missing:\n{help}"
        );
    }
    assert!(!help.contains("arrive"), "{help}");
}

/// The XDP generator (live frames, the default) drives every device under
/// test: each row forwarded something, no row delivered more than was
/// offered, and validity follows from the row's own figures. Its program
/// stays in the kernel's XDP dispatcher (otherwise every call sleeps
/// through two RCU grace periods), and frames the kernel forwarded, and so
/// edited in place (TTL, addresses), go out as the template again when
/// their pages come back: nftables forwards most of what reaches d0 (it
/// once forwarded 1 in 30, the rest expiring after 64 round trips of
/// their page).
#[test]
#[ignore = "system test: root, namespaces, nftables"]
fn lb_bench_veth_xdp_generator_rows_are_valid() {
    let _alone = veth_bench_alone();
    let v = common::json(&[
        "lb",
        "bench",
        "--topology",
        "veth",
        "--seconds",
        "0.5",
        "--format",
        "json",
    ]);
    let how = v["generator"].as_str().unwrap();
    assert!(how.contains("XDP live frames"), "{v}");
    assert!(!how.contains("not pinned"), "{v}");
    let nft = &v["results"]["nftables"];
    let (reached, delivered, lost_on_return) = (
        nft["reached_mpps"].as_f64().unwrap(),
        nft["delivered_mpps"].as_f64().unwrap(),
        nft["dropped_on_return"].as_u64().unwrap() as f64 / 0.5 / 1e6,
    );
    assert!(
        delivered + lost_on_return >= 0.5 * reached,
        "nftables dropped what reached d0 (frames not restored?): {v}"
    );
    for k in ["fastpath", "fastpath_ipv6", "nftables", "xdp_forwarder"] {
        let r = &v["results"][k];
        let offered = r["offered_mpps"].as_f64().unwrap();
        let reached = r["reached_mpps"].as_f64().unwrap();
        let delivered = r["delivered_mpps"].as_f64().unwrap();
        assert!(
            delivered > 0.0,
            "{k}: the XDP generator's frames were not forwarded: {v}"
        );
        assert!(reached > 0.0, "{k}: nothing reached d0: {v}");
        assert!(
            offered >= delivered,
            "{k}: delivered more than offered: {v}"
        );
        assert_eq!(
            r["valid"].as_bool().unwrap(),
            offered >= 1.5 * delivered,
            "{k}: validity disagrees with its own figures: {v}"
        );
    }
    assert!(v["generator_alone"]["offered_mpps"].as_f64().unwrap() > 0.0);
    // The load balancer runs as a daemon would, in a session of its own:
    // in the bench's, its autogroup shared one CPU weight with the
    // generator, and d0's NAPI thread took four fifths of its core.
    for k in ["fastpath", "fastpath_ipv6", "fastpath_af_xdp"] {
        let note = v["results"][k]["note"].as_str().unwrap();
        assert!(note.contains("; own session;"), "{k}: {note}");
    }
    ipv6_ratio_is_the_rows(&v);
    quic_ratio_is_the_rows(&v);
}

/// The veth bench's IPv6 row: the load balancer in the driver (its note
/// names the driver), and the IPv6 / IPv4 ratio is its rows' delivered
/// rates' ratio.
fn ipv6_ratio_is_the_rows(v: &serde_json::Value) {
    let r = &v["results"];
    let note = r["fastpath_ipv6"]["note"].as_str().unwrap();
    assert!(note.contains("driver"), "{v}");
    let (v6, v4) = (
        r["fastpath_ipv6"]["delivered_mpps"].as_f64().unwrap(),
        r["fastpath"]["delivered_mpps"].as_f64().unwrap(),
    );
    assert!(v6 > 0.0, "the IPv6 row forwarded nothing: {v}");
    // In the driver: next to nothing reached the packet threads.
    let secs = v["seconds"].as_f64().unwrap();
    let to_user = r["fastpath_ipv6"]["frames_to_user_space"].as_u64().unwrap() as f64;
    assert!(
        to_user < 0.01 * v6 * 1e6 * secs,
        "IPv6 frames went to user space: {v}"
    );
    let ratio = v["ratio_ipv6_to_ipv4"].as_f64().unwrap();
    assert!(
        (ratio - v6 / v4).abs() < 1e-9,
        "{ratio} vs {v6} / {v4}: {v}"
    );
}

/// The veth bench's QUIC row: plaintext QUIC-LB routed in the driver
/// (next to nothing reached the packet threads), and the QUIC / UDP ratio
/// is its rows' delivered rates' ratio.
fn quic_ratio_is_the_rows(v: &serde_json::Value) {
    let r = &v["results"];
    let (q, u) = (
        r["fastpath_quic"]["delivered_mpps"].as_f64().unwrap(),
        r["fastpath"]["delivered_mpps"].as_f64().unwrap(),
    );
    assert!(q > 0.0, "the QUIC row forwarded nothing: {v}");
    let secs = v["seconds"].as_f64().unwrap();
    let to_user = r["fastpath_quic"]["frames_to_user_space"].as_u64().unwrap() as f64;
    assert!(
        to_user < 0.01 * q * 1e6 * secs,
        "QUIC frames went to user space: {v}"
    );
    let ratio = v["ratio_quic_to_udp"].as_f64().unwrap();
    assert!((ratio - q / u).abs() < 1e-9, "{ratio} vs {q} / {u}: {v}");
}

/// `lb run --help` describes the daemon, not only the pcap replay (issue
/// 17, item 5), and every `fastpath lb X` that any `lb` subcommand's help
/// names is a subcommand that exists (an error once pointed at a missing
/// `fastpath lb reload`).
#[test]
fn lb_help_describes_the_daemon_and_names_only_real_subcommands() {
    let help = |args: &[&str]| {
        let o = fastpath().args(args).output().unwrap();
        assert!(o.status.success(), "{args:?}");
        String::from_utf8(o.stdout).unwrap()
    };
    let run = help(&["lb", "run", "--help"]);
    for needle in [
        "--interface",
        "SIGHUP",
        "SIGTERM",
        "[api] listen",
        "POST /reload",
        "health checks",
        "[bgp]",
        "fastpath lb reload",
        "--pcap-in",
    ] {
        assert!(
            run.contains(needle),
            "`lb run --help` lacks {needle:?}:\n{run}"
        );
    }
    let top = help(&["lb", "--help"]);
    let subcommands: Vec<String> = top
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter(|l| l.starts_with("  ") && !l.starts_with("    "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect();
    assert!(subcommands.iter().any(|s| s == "reload"), "{top}");
    for sub in subcommands.iter().filter(|s| *s != "help") {
        let text = help(&["lb", sub, "--help"]);
        for (i, _) in text.match_indices("fastpath lb ") {
            let named: String = text[i + "fastpath lb ".len()..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            assert!(
                subcommands.contains(&named),
                "`lb {sub} --help` names `fastpath lb {named}`, which does not exist"
            );
        }
    }
}

/// `lb check-config` points at the tunnel where a pool's health checks go
/// straight to backends that client traffic reaches through GRE (a dead
/// decap agent is invisible to them), and says nothing once they go
/// through the tunnel; the file is valid either way.
#[test]
fn check_config_warns_when_direct_checks_guard_backends_behind_decap_agents() {
    let dir = std::env::temp_dir().join(format!("fastpath-check-via-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("lb.toml");
    let config = |via: &str| {
        format!(
            "[encap]\nsource = \"10.0.0.1\"\n\
             [[pools]]\nname = \"web\"\nbackends = [{{ address = \"10.1.0.1\" }}]\n\
             health = {{ kind = \"http\", port = 80{via} }}\n\
             [[vips]]\nname = \"http\"\naddress = \"198.18.0.80\"\nport = 80\nprotocol = \"tcp\"\npool = \"web\"\n"
        )
    };
    let check = |text: &str| {
        std::fs::write(&file, text).unwrap();
        let out = fastpath()
            .args(["lb", "check-config"])
            .arg(&file)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let text = check(&config(""));
    assert!(
        text.contains("warning: pool \"web\"") && text.contains("via = \"tunnel\""),
        "{text}"
    );
    let text = check(&config(", via = \"tunnel\""));
    assert!(!text.contains("warning"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `lb check-config --host` checks what the file needs of this machine
/// (BIRD's socket, the routes' directory, the token file's mode) and
/// prints every problem, failing; without `--host` the same file is valid
/// (it may be meant for another machine). With each fixed, it passes.
#[test]
fn check_config_host_reports_every_problem_of_this_host() {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("fastpath-check-host-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (socket, routes, token) = (dir.join("bird.ctl"), dir.join("routes"), dir.join("token"));
    std::fs::write(&token, "a-long-enough-secret-token\n").unwrap();
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o644)).unwrap();
    let file = dir.join("lb.toml");
    std::fs::write(
        &file,
        format!(
            "[encap]\nsource = \"10.0.0.1\"\n\
             [api]\nlisten = \"127.0.0.1:9180\"\ntoken_file = \"{}\"\n\
             [bgp]\nvips_file = \"{}/vips.conf\"\nbirdc = [\"true\", \"-s\", \"{}\"]\n\
             [[pools]]\nname = \"web\"\nbackends = [{{ address = \"10.1.0.1\" }}]\n\
             [[vips]]\nname = \"http\"\naddress = \"198.18.0.80\"\nport = 80\nprotocol = \"tcp\"\npool = \"web\"\n",
            token.display(),
            routes.display(),
            socket.display()
        ),
    )
    .unwrap();
    let check = |args: &[&str]| {
        let out = fastpath()
            .args(["lb", "check-config"])
            .arg(&file)
            .args(args)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8(out.stdout).unwrap(),
            String::from_utf8(out.stderr).unwrap(),
        )
    };
    let (ok, _, err) = check(&[]);
    assert!(ok, "{err}");
    let (ok, out, err) = check(&["--host"]);
    assert!(!ok, "{out}");
    assert!(err.contains("3 problem(s) on this host"), "{err}");
    for (key, what) in [
        ("bgp.birdc", "does not exist"),
        ("bgp.vips_file", "does not exist"),
        ("api.token_file", "chmod 600"),
    ] {
        assert!(
            err.lines().any(|l| l.contains(key) && l.contains(what)),
            "{key}: {err}"
        );
        assert!(
            out.contains(&format!("host problem: {}: {key}", file.display())),
            "{out}"
        );
    }
    let (ok, out, _) = check(&["--host", "--format", "json"]);
    assert!(!ok);
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        doc["host_problems"].as_array().map(Vec::len),
        Some(3),
        "{doc}"
    );

    std::fs::create_dir_all(&routes).unwrap();
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
    let _bird = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let (ok, out, err) = check(&["--host"]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("host: has what the file needs"), "{out}");
    let (_, out, _) = check(&["--format", "json"]);
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(doc.get("host_problems").is_none(), "{doc}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every load-balancer configuration the repository ships as an example
/// (the package installs them as the operator's starting point) passes
/// `lb check-config` with no warning: an example the daemon itself warns
/// about teaches the mistake.
#[test]
fn every_shipped_example_passes_check_config_without_a_warning() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let mut checked = Vec::new();
    for e in std::fs::read_dir(&dir).unwrap() {
        let path = e.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !(name.starts_with("lb") && name.ends_with(".toml")) {
            continue;
        }
        let out = fastpath()
            .args(["lb", "check-config"])
            .arg(&path)
            .output()
            .unwrap();
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "{name}: {all}");
        assert!(!all.contains("warning"), "{name}: {all}");
        checked.push(name);
    }
    assert!(checked.iter().any(|n| n == "lb.toml"), "{checked:?}");
}

/// `lb decap --help` says which kernel settings a backend needs besides
/// the agent: without them the backends answer ARP for the VIP, or drop
/// the decapsulated packets.
#[test]
fn decap_help_names_the_kernel_settings_a_backend_needs() {
    let o = fastpath().args(["lb", "decap", "--help"]).output().unwrap();
    assert!(o.status.success());
    let help = String::from_utf8(o.stdout).unwrap();
    for needle in ["arp_ignore=1", "arp_announce=2", "rp_filter=0"] {
        assert!(help.contains(needle), "no {needle}:\n{help}");
    }
}

/// The man pages say how the commands end and, for the ones that run as
/// services, which signals they handle and which files they use.
#[test]
fn man_pages_have_exit_status_signals_and_files() {
    let dir = std::env::temp_dir().join(format!("fastpath-man-sections-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = fastpath()
        .args(["man", "--out"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(out.status.success());
    let page = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap();
    for e in std::fs::read_dir(&dir).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        assert!(page(&name).contains(".SH \"EXIT STATUS\""), "{name}");
    }
    let run = page("fastpath-lb-run.1");
    for needle in [
        ".SH SIGNALS",
        ".SH FILES",
        "SIGHUP",
        "SIGTERM",
        "/run/fastpath/vips.conf",
    ] {
        assert!(run.contains(needle), "fastpath-lb-run.1: no {needle}");
    }
    assert!(page("fastpath-lb-decap.1").contains(".SH SIGNALS"));
    assert!(page("fastpath-lb-withdraw.1").contains(".SH FILES"));
    std::fs::remove_dir_all(&dir).unwrap();
}
