//! The fleet in namespaces: three load balancers behind a BIRD
//! router's ECMP route, nginx and UDP-echo backends behind decap agents.
//!
//! - The demo's figures meet their goals and agree with the fleet
//!   simulator for the same sizes (`fastpath lb demo --format json`).
//! - The same flows sent straight to each load balancer (scapy, an
//!   independent packet library, in the router's namespace) pick the same
//!   backend on every one, the one Maglev names for them.
//! - Fragmented datagrams whose fragments reach different load balancers
//!   arrive whole at the backend, which answers the client.
//! - packet-tracer: probes through the router are reported by the load
//!   balancer that handled them, fragmented probes by both the one that
//!   redirected them and the responsible one, each with the table
//!   fingerprint that `/status` shows.
//! - `fastpath lb status --api A --api B --api C` sees the fleet agree, and
//!   names the odd one out after one load balancer's weights change, and
//!   after one load balancer's `[fleet] peers` loses a peer.
//! - A peer whose fastpath dies (its BIRD still up) is seen down by the
//!   others, and its fragments are counted as dropped by reason; peers are
//!   checked without touching BIRD (no "Unexpected connect" in its log).

mod common;

use std::collections::BTreeMap;
use std::net::{IpAddr, UdpSocket};
use std::time::{Duration, Instant};

use lab::topology::{Topology, UDP_ECHO_PORT, VIP};

const PY: &str = "/usr/bin/python3";

/// Sends frames described on stdin, one per line:
/// `iface src_mac dst_mac src_ip sport payload_len frag_size iface2,iface3,...`.
/// `frag_size` 0 sends one unfragmented frame on `iface`; otherwise the
/// datagram is fragmented (scapy's `fragment`) and fragment i goes out on
/// the i-th interface of the comma list (cycling), with its MACs.
const SEND: &str = r#"
import sys
from scapy.all import Ether, IP, UDP, Raw, fragment, sendp
vip, port, ident = sys.argv[1], int(sys.argv[2]), 7000
macs = {}
for line in sys.stdin:
    f = line.split()
    if not f:
        continue
    if f[0] == "mac":
        macs[f[1]] = (f[2], f[3])
        continue
    src, sport, n, fs, ifaces = f[0], int(f[1]), int(f[2]), int(f[3]), f[4].split(",")
    ident += 1
    d = IP(src=src, dst=vip, id=ident) / UDP(sport=sport, dport=port) / Raw(b"f" * n)
    parts = fragment(d, fragsize=fs) if fs else [d]
    for i, p in enumerate(parts):
        ifc = ifaces[i % len(ifaces)]
        s, dm = macs[ifc]
        sendp(Ether(src=s, dst=dm) / p, iface=ifc, verbose=False)
"#;

/// Runs SEND in the router's namespace with `lines`.
fn send(t: &Topology, lines: &[String]) {
    let mut input = String::new();
    for k in 1..=t.lb_count() {
        input += &format!(
            "mac {} {} {}\n",
            Topology::router_if(k),
            Topology::router_mac(k),
            Topology::lb_mac(k)
        );
    }
    for l in lines {
        input += l;
        input.push('\n');
    }
    let out = t
        .router
        .exec_input(
            &[PY, "-c", SEND, VIP, &UDP_ECHO_PORT.to_string()],
            input.as_bytes(),
        )
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// UDP sockets in the client's namespace bound to `(address, port)`, to
/// catch the backends' answers (they go straight to the client).
fn listeners(t: &Topology, at: &[(String, u16)]) -> Vec<UdpSocket> {
    let at = at.to_vec();
    Topology::inside(&t.client, move || {
        at.iter()
            .map(|(a, p)| {
                let s = UdpSocket::bind((a.as_str(), *p)).unwrap();
                s.set_read_timeout(Some(Duration::from_millis(200)))
                    .unwrap();
                s
            })
            .collect::<Vec<_>>()
    })
    .unwrap()
}

/// Every answer each socket got within `wait`: `backend-I LEN` strings.
fn answers(socks: &[UdpSocket], wait: Duration) -> Vec<Vec<String>> {
    let deadline = Instant::now() + wait;
    let mut got = vec![Vec::new(); socks.len()];
    let mut buf = [0u8; 256];
    while Instant::now() < deadline {
        for (i, s) in socks.iter().enumerate() {
            if let Ok(n) = s.recv(&mut buf) {
                got[i].push(String::from_utf8_lossy(&buf[..n]).to_string());
            }
        }
        if got.iter().all(|g| !g.is_empty()) {
            // One more round for stragglers (duplicates would show here).
            std::thread::sleep(Duration::from_millis(100));
            for (i, s) in socks.iter().enumerate() {
                if let Ok(n) = s.recv(&mut buf) {
                    got[i].push(String::from_utf8_lossy(&buf[..n]).to_string());
                }
            }
            break;
        }
    }
    got
}

fn status(t: &Topology, k: usize) -> serde_json::Value {
    serde_json::from_str(&t.api_on(k, "GET", "/status").unwrap()).unwrap()
}

fn udp_fingerprint(t: &Topology, k: usize) -> String {
    status(t, k)["vips"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "udp-echo")
        .unwrap()["fingerprint"]
        .as_str()
        .unwrap()
        .to_string()
}

fn fleet_status(t: &Topology) -> (bool, serde_json::Value) {
    let apis: Vec<String> = (1..=3).map(|k| t.api_addr(k)).collect();
    let fp = env!("CARGO_BIN_EXE_fastpath");
    // The fleet's APIs listen on data addresses with a token: reads need
    // it too.
    let token = t.dir.join("api-token");
    let out = t
        .router
        .command(fp)
        .args(["lb", "status", "--format", "json", "--token-file"])
        .arg(&token)
        .args(apis.iter().flat_map(|a| ["--api", a.as_str()]))
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {} {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.success(), v)
}

#[test]
#[ignore = "system test: root, namespaces, BIRD, nginx, python3-scapy"]
fn the_demo_meets_its_goals_and_matches_the_simulator() {
    systest::require_netns();
    // The demo's last scene runs a three-member etcd cluster.
    systest::require_programs(&["etcd", "etcdctl"]);
    let v = common::json(&[
        "lb",
        "demo",
        "--format",
        "json",
        "--requests",
        "90",
        "--connections",
        "45",
    ]);
    let f = &v["fleet"];
    let n = |p: &str| {
        p.split('.')
            .fold(f, |v, k| &v[k])
            .as_u64()
            .unwrap_or_else(|| panic!("{p} missing: {f}"))
    };
    assert_eq!(n("lb_killed.broken_connections"), 0, "{f}");
    assert_eq!(n("lb_restored.broken_connections"), 0, "{f}");
    assert_eq!(n("rolling_restart.failed_requests"), 0, "{f}");
    assert_eq!(n("rolling_restart.broken_connections"), 0, "{f}");
    assert!(n("rolling_restart.requests") > 50, "{f}");
    // A SIGTERM drains: an announced load balancer keeps forwarding until
    // no VIP packet came for `[bgp] drain_quiet_ms` (300 ms, the demo's
    // default), counted from the signal. Its controller used to say "not
    // announced" once it had withdrawn, and a stop that read that skipped
    // the drain (exits 60-105 ms after the signal in about one restart in
    // three), stopping the datapath before the router had moved the flows.
    for r in f["rolling_restart"]["per_lb"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let exited = r["exited_ms"].as_f64().unwrap_or(0.0);
        assert!(
            exited >= 300.0,
            "exited {exited} ms after SIGTERM, undrained: {r}"
        );
    }
    // The kill moved flows between load balancers (it would prove nothing
    // otherwise), and so did the return.
    assert!(
        n("lb_killed.moved_lb") > 0 && n("lb_restored.moved_lb") > 0,
        "{f}"
    );
    let measured = n("lb_and_backend_change.broken_connections");
    let predicted = n("lb_and_backend_change.predicted");
    let on_removed = n("lb_and_backend_change.on_removed_backend");
    assert!(measured <= predicted, "{f}");
    assert!(measured >= on_removed, "{f}");
    assert_eq!(f["agree"], true, "{f}");
    // QUIC downloads that move: none breaks routed by connection ID, most
    // do by the 5-tuple (the peer is built beside fastpath by the
    // workspace: the section ran).
    let q = &f["quic"];
    assert_eq!(q["routed_by_cid"]["connections"], 30, "{q}");
    assert_eq!(q["routed_by_cid"]["migrations"], 60, "{q}");
    assert_eq!(q["routed_by_cid"]["broken"], 0, "{q}");
    assert!(
        q["routed_by_5tuple"]["broken"].as_u64().unwrap_or(0) >= 10,
        "most moved connections break without QUIC-LB: {q}"
    );
    // The fleet's configuration in etcd: a push that adds a backend is
    // applied by all three (the same revision), an invalid revision is
    // refused by every one, and no request fails meanwhile nor while each
    // was restarted to follow etcd.
    let e = &f["etcd"];
    assert!(e.is_object(), "the etcd scene did not run: {f}");
    let pushed = e["pushed_revision"].as_i64().unwrap_or(0);
    assert!(
        pushed > e["first_revision"].as_i64().unwrap_or(i64::MAX),
        "{e}"
    );
    assert_eq!(
        e["applied"],
        serde_json::json!([pushed, pushed, pushed]),
        "{e}"
    );
    assert_eq!(e["agree"], true, "{e}");
    assert!(
        e["added_backend"].as_str().is_some_and(|a| !a.is_empty()),
        "{e}"
    );
    assert!(e["invalid_revision"].as_i64().unwrap_or(0) > pushed, "{e}");
    assert_eq!(e["refused_by_all"], true, "{e}");
    let refused = e["refused"].as_array().expect("refusals");
    assert_eq!(refused.len(), 3, "{e}");
    assert!(
        refused
            .iter()
            .all(|r| r.as_str().is_some_and(|r| r.contains("nowhere"))),
        "{e}"
    );
    assert_eq!(e["failed_requests"], 0, "{e}");
    assert_eq!(e["restart_failed_requests"], 0, "{e}");
    // The load balancer restarted onto etcd builds the same tables as the
    // ones still on their files: otherwise a connection the route moves
    // between them may be sent to another backend.
    let restarts = e["restarts"].as_array().cloned().unwrap_or_default();
    assert_eq!(restarts.len(), 3, "{e}");
    for r in &restarts {
        assert_eq!(r["tables_agree"], true, "{r}");
        let (term, exited) = (r["term_s"].as_f64(), r["exited_s"].as_f64());
        let drained = exited.zip(term).map(|(x, t)| x - t);
        assert!(drained >= Some(0.3), "exited undrained: {r}");
    }
    assert!(e["requests"].as_u64().unwrap_or(0) > 10, "{e}");
    assert!(e["restart_requests"].as_u64().unwrap_or(0) > 50, "{e}");
    // The simulator for the same sizes: the same zeros, and about as many
    // broken by the backend change (binomial noise of a third of the
    // connections, 4 standard deviations, plus what it remaps).
    let sim = &f["simulated"];
    for e in ["lb_killed", "lb_restored", "rolling_restart"] {
        assert_eq!(sim[e]["broken"], 0, "{sim}");
    }
    let c = n("lb_and_backend_change.connections") as f64;
    let sd = (c * (1.0 / 3.0) * (2.0 / 3.0)).sqrt();
    let simulated = sim["lb_and_backend_change"]["broken"].as_u64().unwrap() as f64;
    let remapped = sim["lb_and_backend_change"]["remapped"].as_u64().unwrap() as f64;
    assert!(
        (measured as f64 - simulated).abs() <= 4.0 * sd + remapped + 1.0,
        "measured {measured}, simulated {simulated} (sd {sd:.1}): {sim}"
    );
}

#[test]
#[ignore = "system test: root, namespaces, BIRD, nginx, python3-scapy"]
fn fragments_tracer_and_agreement_across_the_fleet() {
    systest::require_python_module(PY, "scapy");
    let mut t = common::topology(3, 3, "f");
    t.start_udp_echo().unwrap();
    let sources = t.add_client_addresses(8).unwrap();
    t.start_lbs().unwrap();
    t.wait_for_ecmp(&[1, 2, 3], Duration::from_secs(40))
        .unwrap();
    t.wait_for_vip(Duration::from_secs(20)).unwrap();
    // Everything below runs with one AF_XDP socket and worker per receive
    // queue (two packet threads on two queues), `[fleet]` notwithstanding.
    for k in 1..=3 {
        let driver = status(&t, k)["driver"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(
            driver.contains("one socket per queue on 2 queues"),
            "lb{k}: {driver}"
        );
    }

    // 1. The same 20 flows straight into each load balancer.
    let flows: Vec<(String, u16)> = (0..20)
        .map(|j| ("10.10.1.2".to_string(), 41_000 + j))
        .collect();
    let cfg = lb::config::Config::load(&t.config).unwrap().config;
    let mut seen: BTreeMap<u16, Vec<String>> = BTreeMap::new();
    for k in 1..=3 {
        let socks = listeners(&t, &flows);
        let lines: Vec<String> = flows
            .iter()
            .map(|(a, p)| format!("{a} {p} 64 0 {}", Topology::router_if(k)))
            .collect();
        send(&t, &lines);
        let got = answers(&socks, Duration::from_secs(3));
        for ((_, p), g) in flows.iter().zip(got) {
            assert_eq!(g.len(), 1, "flow from port {p} through lb{k}: {g:?}");
            seen.entry(*p).or_default().push(g[0].clone());
        }
    }
    for (p, answers) in &seen {
        assert!(
            answers.iter().all(|a| a == &answers[0]),
            "port {p}: the load balancers disagree: {answers:?}"
        );
        // ... and it is the backend Maglev names from the configuration.
        let flow = packet::FlowKey {
            src: packet::flow::mapped([10, 10, 1, 2]),
            dst: packet::flow::mapped([198, 18, 0, 80]),
            src_port: *p,
            dst_port: UDP_ECHO_PORT,
            proto: 17,
        };
        let want = lab::sample::expected_backend(&cfg, "web", &flow).unwrap();
        let i = (1..=3)
            .find(|&i| Topology::backend_address(i) == want.to_string())
            .unwrap();
        assert_eq!(answers[0], format!("backend-{i} 64"), "port {p}");
    }

    // 2. Fragments of one datagram through different load balancers: the
    // first through lb1, the second through lb2, the third through lb3
    // (rotated per source), 1200 bytes in 512-byte fragments.
    let redirected_before: u64 = (1..=3)
        .map(|k| {
            status(&t, k)["fleet"]["fragments_redirected"]
                .as_u64()
                .unwrap()
        })
        .sum();
    let at: Vec<(String, u16)> = sources.iter().map(|s| (s.clone(), 42_000)).collect();
    let socks = listeners(&t, &at);
    let lines: Vec<String> = sources
        .iter()
        .enumerate()
        .map(|(j, s)| {
            let ifs: Vec<String> = (0..3)
                .map(|i| Topology::router_if(1 + (i + j) % 3))
                .collect();
            format!("{s} 42000 1200 512 {}", ifs.join(","))
        })
        .collect();
    send(&t, &lines);
    let got = answers(&socks, Duration::from_secs(3));
    for (s, g) in sources.iter().zip(&got) {
        assert_eq!(g.len(), 1, "datagram from {s}: {g:?}");
        assert!(
            g[0].ends_with(" 1200"),
            "from {s}, reassembled whole: {g:?}"
        );
    }
    let redirected: u64 = (1..=3)
        .map(|k| {
            status(&t, k)["fleet"]["fragments_redirected"]
                .as_u64()
                .unwrap()
        })
        .sum::<u64>()
        - redirected_before;
    let received: u64 = (1..=3)
        .map(|k| {
            status(&t, k)["fleet"]["fragments_redirect_received"]
                .as_u64()
                .unwrap()
        })
        .sum();
    // Three fragments each, one per load balancer: two of the three
    // arrive away from the responsible peer.
    assert_eq!(redirected, 2 * sources.len() as u64, "{}", status(&t, 1));
    assert_eq!(received, redirected);

    // 3. packet-tracer through the router: TCP probes, then fragmented UDP
    // probes from each source until one was redirected.
    let fp = env!("CARGO_BIN_EXE_fastpath");
    let trace = |args: &[&str]| -> serde_json::Value {
        let out = t
            .client
            .command(fp)
            .args([
                "lb",
                "trace",
                "--report-to",
                "10.10.1.2:9999",
                "--format",
                "json",
            ])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let fingerprints: Vec<String> = (1..=3).map(|k| udp_fingerprint(&t, k)).collect();
    assert!(fingerprints.iter().all(|f| f == &fingerprints[0]));
    let v = trace(&[
        "--vip",
        &format!("{VIP}:80"),
        "--proto",
        "tcp",
        "--count",
        "8",
    ]);
    let probes = v["probes"].as_array().unwrap();
    assert_eq!(probes.len(), 8, "{v}");
    let mut machines = std::collections::BTreeSet::new();
    for p in probes {
        let r = p["reports"].as_array().unwrap();
        assert_eq!(
            r.len(),
            1,
            "one load balancer handles an unfragmented probe: {p}"
        );
        assert_eq!(r[0]["conntrack"], "miss", "{p}");
        machines.insert(r[0]["machine"].as_str().unwrap().to_string());
    }
    assert!(!machines.is_empty());
    let mut redirected_probe = None;
    for s in &sources {
        let v = trace(&[
            "--vip",
            &format!("{VIP}:{UDP_ECHO_PORT}"),
            "--proto",
            "udp",
            "--fragment",
            "--src",
            s,
        ]);
        let p = &v["probes"][0];
        let r = p["reports"].as_array().unwrap();
        for x in r {
            assert_eq!(x["fingerprint"], fingerprints[0].as_str(), "{p}");
        }
        if r.iter().any(|x| !x["redirected_to"].is_null()) {
            redirected_probe = Some(p.clone());
            break;
        }
        assert_eq!(r.len(), 1, "{p}");
    }
    let p = redirected_probe.expect("no fragmented probe was redirected from 8 sources");
    let r = p["reports"].as_array().unwrap();
    assert_eq!(
        r.len(),
        2,
        "the redirecting and the responsible load balancer: {p}"
    );
    let (from, to) = if r[0]["redirected_to"].is_null() {
        (&r[1], &r[0])
    } else {
        (&r[0], &r[1])
    };
    assert_eq!(to["arrived_redirected"], true, "{p}");
    assert_ne!(from["machine"], to["machine"], "{p}");
    assert!(to["backend_address"].is_string(), "{p}");

    // 4. The fleet agrees; then lb3's weights change and it is named.
    let (ok, v) = fleet_status(&t);
    assert!(ok && v["agree"] == true, "{v}");
    t.set_backends_on(3, &[(1, 3), (2, 1), (3, 1)]).unwrap();
    t.api_on(3, "POST", "/reload").unwrap();
    let (ok, v) = fleet_status(&t);
    assert!(!ok && v["agree"] == false, "{v}");
    let diffs = v["differences"].as_array().unwrap();
    assert!(
        diffs.iter().any(|d| d["lb"] == t.api_addr(3).as_str()
            && d["detail"].as_str().unwrap().contains("weight")),
        "{v}"
    );

    // 4b. lb3 forgets a peer (its weights agree again): the fleet
    // disagrees on peers and names lb3; put back, it agrees.
    t.set_backends_on(3, &[(1, 1), (2, 1), (3, 1)]).unwrap();
    let lb3_config = std::fs::read_to_string(&t.configs[2]).unwrap();
    let all_peers = "peers = [\"10.10.2.2\", \"10.10.2.3\", \"10.10.2.4\"]";
    assert!(lb3_config.contains(all_peers), "{lb3_config}");
    std::fs::write(
        &t.configs[2],
        lb3_config.replace(all_peers, "peers = [\"10.10.2.2\", \"10.10.2.4\"]"),
    )
    .unwrap();
    t.api_on(3, "POST", "/reload").unwrap();
    let (ok, v) = fleet_status(&t);
    assert!(!ok && v["agree"] == false, "{v}");
    let diffs = v["differences"].as_array().unwrap();
    assert_eq!(diffs.len(), 1, "{v}");
    assert_eq!(diffs[0]["lb"], t.api_addr(3).as_str(), "{v}");
    assert_eq!(diffs[0]["aspects"], serde_json::json!(["peers"]), "{v}");
    assert!(
        diffs[0]["detail"]
            .as_str()
            .unwrap()
            .contains("missing 10.10.2.3"),
        "{v}"
    );
    std::fs::write(&t.configs[2], &lb3_config).unwrap();
    t.api_on(3, "POST", "/reload").unwrap();
    let (ok, v) = fleet_status(&t);
    assert!(ok && v["agree"] == true, "{v}");

    // 5. A dead peer: lb3's fastpath dies while its BIRD lives on (a
    // check of BGP's port would still see it up); lb1 notices (lb3's
    // fastpath no longer answers its probes) ...
    t.procs.kill(&Topology::lb_proc(3));
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let s = status(&t, 1);
        let up = s["fleet"]["peers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["address"] == "10.10.2.4")
            .map(|p| p["up"] == true);
        if up == Some(false) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "lb1 still sees lb3 up with its fastpath dead: {s}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // ... then its machine dies too; lb1 drops, by reason, the fragments
    // lb3 is responsible for.
    t.kill_lb_machine(3).unwrap();
    let peers: Vec<IpAddr> = (1..=3)
        .map(|k| Topology::lb_address(k).parse().unwrap())
        .collect();
    let lb3: IpAddr = Topology::lb_address(3).parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let s = status(&t, 1);
        let up = s["fleet"]["peers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["address"] == "10.10.2.4")
            .map(|p| p["up"] == true);
        if up == Some(false) {
            break;
        }
        assert!(Instant::now() < deadline, "lb1 still sees lb3 up: {s}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let theirs: Vec<&String> = sources
        .iter()
        .filter(|s| {
            let a: std::net::Ipv4Addr = s.parse().unwrap();
            let flow = packet::FlowKey {
                src: packet::flow::mapped(a.octets()),
                dst: packet::flow::mapped([198, 18, 0, 80]),
                src_port: 0,
                dst_port: 0,
                proto: 17,
            };
            lb::frag_redirect::responsible(&peers, &flow) == Some(lb3)
        })
        .collect();
    let drops = |s: &serde_json::Value| s["drops"]["fragment_peer_down"].as_u64().unwrap_or(0);
    let before = drops(&status(&t, 1));
    let lines: Vec<String> = sources
        .iter()
        .map(|s| format!("{s} 43000 1200 512 {}", Topology::router_if(1)))
        .collect();
    send(&t, &lines);
    std::thread::sleep(Duration::from_millis(500));
    let after = drops(&status(&t, 1));
    assert_eq!(
        after - before,
        3 * theirs.len() as u64,
        "{} of 8 sources are lb3's, 3 fragments each",
        theirs.len()
    );

    // 6. The peer checks of the whole test, every load balancer probing
    // the others, and no BIRD was bothered by them.
    for k in 1..=3 {
        let log = t.bird_log(&Topology::bird_of(k));
        assert!(log.contains("Started"), "lb{k}'s BIRD logs: {log}");
        assert!(
            !log.contains("Unexpected connect"),
            "lb{k}'s BIRD was probed on BGP's port:\n{log}"
        );
    }
}
