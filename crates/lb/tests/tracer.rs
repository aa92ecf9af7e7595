//! Packet-tracer probes through the in-process forwarder (inline and with
//! packet threads): a probe is forwarded like any packet and reported once
//! with the backend Maglev picks and the VIP's table fingerprint; floods
//! are rate-limited and counted; payloads that only look like probes are
//! not reported; a fragmented probe redirected between two `[fleet]` peers
//! is reported by both (redirected to, arrived redirected from).

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use lb::config::Config;
use lb::datapath::{Datapath, Params, RunStats};
use lb::tracer::{fingerprint_hex, Lookup, Marker, Probe, ProbeProto, Record, Report, Tracer};
use lb::Control;
use netio::mem::{MemPort, Vary};
use packet::build::Frame;
use packet::gre::decapsulate;
use packet::{flow, parse_frame};

use lb_sample::{expected_backend, flow_of, ip, CONFIG};

const VIP: &str = "192.0.2.80:80";
const REPORT_TO: &str = "198.51.100.9:9999";

/// Runs `frames` through a forwarder with `threads` packet threads and a
/// tracer of `rate`/`burst`; returns the run, the frames sent out, the
/// records queued, the tables and the config.
fn run(
    frames: Vec<Vec<u8>>,
    threads: usize,
    rate: u32,
    burst: u32,
) -> (RunStats, Vec<Vec<u8>>, Vec<Record>, Control, Config) {
    let mut cfg = Config::parse(CONFIG, "test").unwrap();
    cfg.forwarder.threads = threads;
    run_with(cfg, frames, rate, burst)
}

/// As [`run`], with a configuration.
fn run_with(
    cfg: Config,
    frames: Vec<Vec<u8>>,
    rate: u32,
    burst: u32,
) -> (RunStats, Vec<Vec<u8>>, Vec<Record>, Control, Config) {
    let control = Control::new(cfg.clone()).unwrap();
    let tracer = Arc::new(Tracer::new(rate, burst, lb::tracer::QUEUE_LEN));
    let mut params = Params::from_config(&cfg);
    params.tracer = Some(Arc::clone(&tracer));
    let dp = Datapath::new(params, control.tables()).unwrap();
    let n = frames.len() as u64;
    let mut port = MemPort::new(frames, Vary::None, Some(n)).capture();
    let stats = dp.run(&mut port, &AtomicBool::new(false)).unwrap();
    let out = port.captured.take().unwrap();
    let mut records = Vec::new();
    tracer.take(&mut records);
    (stats, out, records, control, cfg)
}

fn probe(id: u64, sport: u16, proto: ProbeProto) -> Probe {
    Probe {
        src: format!("203.0.113.9:{sport}").parse().unwrap(),
        vip: if proto == ProbeProto::Tcp {
            VIP.parse().unwrap()
        } else {
            "192.0.2.53:53".parse().unwrap()
        },
        proto,
        marker: Marker {
            id,
            report_to: REPORT_TO.parse().unwrap(),
        },
        padding: 32,
        quic: None,
    }
}

/// The inner packets of GRE output, by their IP bytes, with their outer
/// destination.
fn inner(out: &[Vec<u8>]) -> Vec<(Vec<u8>, std::net::IpAddr)> {
    out.iter()
        .map(|f| {
            let d = decapsulate(f).expect("GRE");
            (f[d.inner.clone()].to_vec(), flow::to_ip(&d.outer_dst))
        })
        .collect()
}

fn ip_bytes(frame: &[u8]) -> Vec<u8> {
    let p = parse_frame(frame).unwrap();
    frame[p.l3_offset..p.l3_offset + p.l3_len].to_vec()
}

#[test]
fn a_probe_is_forwarded_and_reported_once_then_hits_conntrack() {
    for threads in [0, 2] {
        let pr = probe(41, 40_000, ProbeProto::Tcp);
        let f = pr.frame().unwrap();
        let plain = lb_sample::tcp("203.0.113.10", 1234, "192.0.2.80", 80, 0x02);
        let (stats, out, records, control, cfg) =
            run(vec![f.clone(), plain.clone(), f.clone()], threads, 100, 100);
        assert_eq!(stats.counters.tx, 3, "threads={threads}: all forwarded");
        let want = expected_backend(&cfg, "web", &flow_of(&f)).unwrap();
        let sent = inner(&out);
        assert_eq!(
            sent.iter().filter(|(b, _)| *b == ip_bytes(&f)).count(),
            2,
            "both probes forwarded unchanged"
        );
        assert!(sent
            .iter()
            .filter(|(b, _)| *b == ip_bytes(&f))
            .all(|(_, to)| *to == want));
        assert!(sent.iter().any(|(b, _)| *b == ip_bytes(&plain)));
        assert_eq!(
            records.len(),
            2,
            "one report per probe, none for the plain packet"
        );
        assert_eq!(stats.counters.trace_reports, 2);
        let tables = control.tables().load_full();
        let reports: Vec<Report> = records
            .iter()
            .map(|r| Report::new(r, "lb-test", &tables))
            .collect();
        for r in &reports {
            assert_eq!(r.probe, 41);
            assert_eq!(r.machine, "lb-test");
            assert_eq!(r.vip, VIP.parse().unwrap());
            assert_eq!(r.vip_name.as_deref(), Some("http"));
            assert_eq!(r.proto, "tcp");
            assert_eq!(r.backend_address, Some(want));
            assert_eq!(r.generation, tables.generation);
            assert_eq!(
                r.fingerprint,
                Some(fingerprint_hex(tables.vips[0].fingerprint))
            );
            assert!(!r.fragment && r.redirected_to.is_none() && !r.arrived_redirected);
            assert!(usize::from(r.thread) < threads.max(1));
            // The JSON on the wire reads back the same.
            assert_eq!(&Report::parse(&r.to_json()).unwrap(), r);
        }
        assert_eq!(reports[0].conntrack, Some(Lookup::Miss));
        assert_eq!(reports[1].conntrack, Some(Lookup::Hit));
    }
}

#[test]
fn a_fragmented_probe_is_reported_by_its_first_fragment() {
    let pr = probe(7, 40_001, ProbeProto::Udp);
    let frags = pr.fragments(3, 0x4242).unwrap();
    // Out of order: the later fragments wait for the first.
    let frames = vec![frags[2].clone(), frags[0].clone(), frags[1].clone()];
    let (stats, out, records, control, cfg) = run(frames, 2, 100, 100);
    assert_eq!(stats.counters.tx, 3);
    assert_eq!(records.len(), 1);
    let tables = control.tables().load_full();
    let r = Report::new(&records[0], "lb-test", &tables);
    let want = expected_backend(&cfg, "dns", &flow_of(&frags[0])).unwrap();
    assert!(r.fragment);
    assert_eq!(r.backend_address, Some(want));
    assert_eq!(r.vip_name.as_deref(), Some("dns-any-port"));
    assert!(inner(&out).iter().all(|(_, to)| *to == want));
}

#[test]
fn a_flood_is_rate_limited_and_counted() {
    const N: u64 = 400;
    const BURST: u32 = 5;
    let frames: Vec<Vec<u8>> = (0..N)
        .map(|i| {
            probe(i, 10_000 + i as u16, ProbeProto::Udp)
                .frame()
                .unwrap()
        })
        .collect();
    let t0 = Instant::now();
    let (stats, _, records, _, _) = run(frames, 2, 1, BURST);
    let secs = t0.elapsed().as_secs();
    let c = &stats.counters;
    assert_eq!(c.tx, N, "every probe is forwarded");
    let allowed = u64::from(BURST) + secs + 1;
    assert!(
        (records.len() as u64) <= allowed,
        "{} reports, at most {allowed} allowed",
        records.len()
    );
    assert!(!records.is_empty());
    assert_eq!(c.trace_reports, records.len() as u64);
    assert_eq!(
        c.trace_reports + c.trace_rate_limited + c.trace_queue_full,
        N
    );
}

#[test]
fn payloads_that_only_look_like_probes_are_not_reported() {
    let good = probe(1, 5, ProbeProto::Udp).payload();
    let mut near = Vec::new();
    for (i, b) in [(7, b'2'), (0, b'f'), (3, 0)] {
        let mut p = good.clone();
        p[i] = b;
        near.push(p);
    }
    near.push(good[..7].to_vec()); // the magic cut short
    near.push([&[0u8][..], &good].concat()); // the magic one byte in
    let mut frames: Vec<Vec<u8>> = near
        .iter()
        .enumerate()
        .map(|(i, p)| {
            Frame::udp(ip("203.0.113.9"), ip("192.0.2.53"), 2000 + i as u16, 53, p).to_bytes()
        })
        .collect();
    // The magic, then a malformed marker: counted as invalid, not reported.
    let mut bad = good.clone();
    bad[16] = 9;
    frames.push(Frame::udp(ip("203.0.113.9"), ip("192.0.2.53"), 3000, 53, &bad).to_bytes());
    let n = frames.len() as u64;
    let (stats, _, records, _, _) = run(frames, 0, 100, 100);
    assert!(records.is_empty(), "{records:?}");
    assert_eq!(stats.counters.tx, n, "all forwarded");
    assert_eq!(stats.counters.trace_invalid, 1);
    assert_eq!(stats.counters.trace_reports, 0);
}

/// The sample configuration as one of two `[fleet]` peers, 10.0.0.1 (the
/// sample's own outer source) and 10.0.0.2.
fn fleet_member(own: &str) -> Config {
    let text = CONFIG.replace("source = \"10.0.0.1\"", &format!("source = \"{own}\""))
        + "\n[fleet]\npeers = [\"10.0.0.1\", \"10.0.0.2\"]\n";
    Config::parse(&text, "test").unwrap()
}

#[test]
fn a_redirected_fragmented_probe_is_reported_by_both_load_balancers() {
    // Fragmented probes from many sources: by their 3-tuples, some belong
    // to peer 10.0.0.2 and are redirected there by 10.0.0.1.
    let probes: Vec<Probe> = (1..=16u16)
        .map(|i| Probe {
            src: format!("203.0.113.{i}:{}", 30_000 + i).parse().unwrap(),
            ..probe(u64::from(i), 0, ProbeProto::Udp)
        })
        .collect();
    let frames: Vec<Vec<u8>> = probes
        .iter()
        .flat_map(|p| p.fragments(2, 0x100 + p.marker.id as u32).unwrap())
        .collect();
    let n = frames.len() as u64;
    let (stats_a, out_a, recs_a, control_a, cfg) =
        run_with(fleet_member("10.0.0.1"), frames, 100, 100);
    assert_eq!(
        stats_a.counters.tx, n,
        "every fragment forwarded or redirected"
    );
    assert_eq!(
        recs_a.len(),
        probes.len(),
        "one report per probe from the first: {:?}",
        stats_a.counters
    );
    let tables_a = control_a.tables().load_full();
    let peer = ip("10.0.0.2");
    let mut redirected = Vec::new();
    for r in recs_a.iter().map(|r| Report::new(r, "lb-a", &tables_a)) {
        assert!(r.fragment && !r.arrived_redirected);
        assert_eq!(
            r.vip_name.as_deref(),
            Some("dns-any-port"),
            "VIP known either way"
        );
        match r.redirected_to {
            Some(to) => {
                assert_eq!(to, peer);
                assert_eq!((r.backend.as_ref(), r.conntrack), (None, None));
                redirected.push(r.probe);
            }
            None => assert!(r.backend.is_some() && r.conntrack.is_some()),
        }
    }
    assert!(
        !redirected.is_empty() && redirected.len() < probes.len(),
        "16 datagrams split between 2 peers: {} redirected",
        redirected.len()
    );
    // What 10.0.0.1 sent to 10.0.0.2, through 10.0.0.2.
    let to_peer: Vec<Vec<u8>> = out_a
        .into_iter()
        .filter(|f| flow::to_ip(&decapsulate(f).unwrap().outer_dst) == peer)
        .collect();
    assert_eq!(to_peer.len(), 2 * redirected.len());
    let (stats_b, out_b, recs_b, control_b, _) =
        run_with(fleet_member("10.0.0.2"), to_peer, 100, 100);
    assert_eq!(stats_b.counters.tx, 2 * redirected.len() as u64);
    let tables_b = control_b.tables().load_full();
    let mut seen = Vec::new();
    for r in recs_b.iter().map(|r| Report::new(r, "lb-b", &tables_b)) {
        assert!(r.arrived_redirected && r.redirected_to.is_none());
        assert_eq!(r.redirected_from, Some(ip("10.0.0.1")));
        let p = &probes[r.probe as usize - 1];
        let want = expected_backend(&cfg, "dns", &flow_of(&p.frame().unwrap())).unwrap();
        assert_eq!(
            r.backend_address,
            Some(want),
            "Maglev's pick for the 5-tuple"
        );
        seen.push(r.probe);
    }
    seen.sort_unstable();
    redirected.sort_unstable();
    assert_eq!(
        seen, redirected,
        "the peer reports exactly the redirected probes: {:?}",
        stats_b.counters
    );
    assert!(
        inner(&out_b).iter().all(|(_, to)| *to != peer),
        "sent on to backends, not back"
    );
}

/// A `quic` VIP (192.0.2.43 UDP port 443) over two backends with QUIC-LB
/// server IDs 0a01 and 0a02, one four-pass configuration at codepoint 1.
const QUIC: &str = r#"
[[quic_lb]]
codepoint = 1
server_id_len = 2
nonce_len = 6
key = "8f95f09245765f80256934e50c66207f"

[[pools]]
name = "h3"
backends = [
  { address = "10.3.0.1", name = "h3-a", quic_server_id = "0a01" },
  { address = "10.3.0.2", name = "h3-b", quic_server_id = "0a02" },
]

[[vips]]
name = "h3"
address = "192.0.2.43"
port = 443
protocol = "udp"
quic = true
pool = "h3"
"#;

/// The connection ID server `sid` issues at codepoint 1 of [`QUIC`].
fn quic_cid(sid: [u8; 2]) -> Vec<u8> {
    let key = quic_lb::parse_key("8f95f09245765f80256934e50c66207f").unwrap();
    let conf = quic_lb::Config::new(1, 2, 6, Some(key), false).unwrap();
    conf.encode(&sid, &[1, 2, 3, 4, 5, 6], 0x0b)
        .unwrap()
        .as_bytes()
        .to_vec()
}

/// A UDP probe to the `quic` VIP carrying `quic` before its marker.
fn quic_probe(id: u64, sport: u16, quic: Option<lb::tracer::QuicProbe>) -> Probe {
    Probe {
        vip: "192.0.2.43:443".parse().unwrap(),
        quic,
        ..probe(id, sport, ProbeProto::Udp)
    }
}

/// Inner packets sent, with their outer destination ([`inner`]).
type Sent = Vec<(Vec<u8>, std::net::IpAddr)>;

/// Runs `frames` through a forwarder of the sample with [`QUIC`] (two
/// packet threads), the backends named in `down` down; returns the
/// reports, where each frame went (by its IP bytes) and the counters.
fn run_quic(frames: Vec<Vec<u8>>, down: &[&str]) -> (Vec<Report>, Sent, RunStats) {
    let cfg = Config::parse(&format!("{CONFIG}\n{QUIC}"), "test").unwrap();
    let mut control = Control::new(cfg.clone()).unwrap();
    for name in down {
        assert!(control.set_health(name, false), "{name} is a backend");
    }
    let tracer = Arc::new(Tracer::new(1000, 1000, lb::tracer::QUEUE_LEN));
    let mut params = Params::from_config(&cfg);
    params.tracer = Some(Arc::clone(&tracer));
    let dp = Datapath::new(params, control.tables()).unwrap();
    let n = frames.len() as u64;
    let mut port = MemPort::new(frames, Vary::None, Some(n)).capture();
    let stats = dp.run(&mut port, &AtomicBool::new(false)).unwrap();
    let out = port.captured.take().unwrap();
    let mut records = Vec::new();
    tracer.take(&mut records);
    let tables = control.tables().load_full();
    let mut reports: Vec<Report> = records
        .iter()
        .map(|r| Report::new(r, "lb-test", &tables))
        .collect();
    reports.sort_by_key(|r| r.probe);
    (reports, inner(&out), stats)
}

#[test]
fn a_quic_probe_routed_by_connection_id_reports_codepoint_server_id_and_backend() {
    use lb::tracer::QuicProbe;
    let cid = quic_cid([0x0a, 0x02]);
    let probes = [
        quic_probe(1, 41_000, Some(QuicProbe::Short { dcid: cid.clone() })),
        quic_probe(2, 41_001, Some(QuicProbe::Long { dcid: cid.clone() })),
    ];
    let frames: Vec<Vec<u8>> = probes.iter().map(|p| p.frame().unwrap()).collect();
    let (reports, sent, stats) = run_quic(frames.clone(), &[]);
    assert_eq!(stats.counters.quic_routed, 2);
    assert_eq!(
        reports.len(),
        2,
        "one report per probe: {:?}",
        stats.counters
    );
    for (r, f) in reports.iter().zip(&frames) {
        let q = r.quic.as_ref().expect("a QUIC step for a quic VIP");
        assert_eq!(q.decision, "routed");
        assert_eq!(q.codepoint, Some(1));
        assert_eq!(q.server_id.as_deref(), Some("0a02"));
        assert_eq!((q.down_backend.as_ref(), q.fallback.as_ref()), (None, None));
        assert_eq!(r.backend.as_deref(), Some("h3-b"));
        assert_eq!(r.vip_name.as_deref(), Some("h3"));
        // The connection table was not asked.
        assert_eq!(r.conntrack, None);
        assert_eq!(&Report::parse(&r.to_json()).unwrap(), r);
        let to: Vec<_> = sent.iter().filter(|(b, _)| *b == ip_bytes(f)).collect();
        assert_eq!(to.len(), 1);
        assert_eq!(to[0].1, ip("10.3.0.2"));
    }
}

#[test]
fn a_quic_probe_that_does_not_route_reports_why_and_the_fallback() {
    use lb::tracer::QuicProbe;
    let unknown = quic_probe(
        1,
        42_000,
        Some(QuicProbe::Short {
            dcid: quic_cid([0x0b, 0xff]),
        }),
    );
    // Codepoint 0b111 and codepoint 3 (no configuration), in long headers
    // (a short one's DCID length would be unknown).
    let reserved = quic_probe(
        3,
        42_001,
        Some(QuicProbe::Long {
            dcid: vec![0xe0, 1, 2, 3, 4, 5, 6, 7, 8],
        }),
    );
    let no_config = quic_probe(
        4,
        42_002,
        Some(QuicProbe::Long {
            dcid: vec![0x60, 1, 2, 3, 4, 5, 6, 7, 8],
        }),
    );
    // A plain probe: its marker read as a short header ("PTRACE1...",
    // codepoint 2, which has no configuration).
    let plain = quic_probe(5, 42_003, None);
    let f = unknown.frame().unwrap();
    // The unknown server ID twice from one 5-tuple: Maglev first, then the
    // connection table.
    let again = Probe {
        marker: Marker {
            id: 2,
            ..unknown.marker
        },
        ..unknown.clone()
    };
    let frames = vec![
        f.clone(),
        again.frame().unwrap(),
        reserved.frame().unwrap(),
        no_config.frame().unwrap(),
        plain.frame().unwrap(),
    ];
    let (reports, sent, stats) = run_quic(frames.clone(), &[]);
    assert_eq!(stats.counters.tx, 5, "all forwarded by the fallback");
    assert_eq!(reports.len(), 5, "{:?}", stats.counters);
    let cfg = Config::parse(&format!("{CONFIG}\n{QUIC}"), "test").unwrap();
    let want: Vec<(&str, Option<u8>, Option<&str>, &str)> = vec![
        ("server_id_unknown", Some(1), Some("0bff"), "maglev"),
        (
            "server_id_unknown",
            Some(1),
            Some("0bff"),
            "connection table",
        ),
        ("codepoint_reserved", None, None, "maglev"),
        ("codepoint_unknown", None, None, "maglev"),
        ("codepoint_unknown", None, None, "maglev"),
    ];
    for ((r, f), (decision, cp, sid, fallback)) in reports.iter().zip(&frames).zip(want) {
        let q = r.quic.as_ref().expect("a QUIC step");
        assert_eq!(q.decision, decision, "probe {}", r.probe);
        assert_eq!(q.codepoint, cp, "probe {}", r.probe);
        assert_eq!(q.server_id.as_deref(), sid, "probe {}", r.probe);
        assert_eq!(q.fallback.as_deref(), Some(fallback), "probe {}", r.probe);
        let maglev = expected_backend(&cfg, "h3", &flow_of(f)).unwrap();
        assert_eq!(r.backend_address, Some(maglev), "probe {}", r.probe);
        assert!(sent
            .iter()
            .any(|(b, to)| *b == ip_bytes(f) && *to == maglev));
    }
}

#[test]
fn a_quic_probe_naming_a_down_backend_reports_its_server_id() {
    use lb::tracer::QuicProbe;
    let p = quic_probe(
        1,
        43_000,
        Some(QuicProbe::Short {
            dcid: quic_cid([0x0a, 0x02]),
        }),
    );
    let (reports, sent, stats) = run_quic(vec![p.frame().unwrap()], &["h3-b"]);
    assert_eq!(stats.counters.quic_server_down, 1);
    assert_eq!(reports.len(), 1);
    let q = reports[0].quic.as_ref().expect("a QUIC step");
    assert_eq!(q.decision, "server_down");
    assert_eq!(q.server_id.as_deref(), Some("0a02"));
    assert_eq!(q.down_backend.as_deref(), Some("h3-b"));
    assert_eq!(q.fallback.as_deref(), Some("maglev"));
    // The only backend up took it.
    assert_eq!(reports[0].backend.as_deref(), Some("h3-a"));
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].1, ip("10.3.0.1"));
}
