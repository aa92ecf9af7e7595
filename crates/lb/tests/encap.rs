//! Encapsulation options through the datapath: per-flow outer
//! sources from `[encap] source_prefix` with the flow hash in the GRE key,
//! and TCP/UDP checksums a local sender left partial completed on the way
//! (and counted); the options' validation names the key.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::AtomicBool;

use etherparse::{NetHeaders, PacketHeaders, TransportHeader};
use lb::config::Config;
use lb::datapath::{Datapath, Params, RunStats};
use lb::worker::flow_hash;
use lb::Control;
use netio::mem::{MemPort, Vary};
use packet::build::Frame;
use packet::gre::{decapsulate, SourcePrefix, Spread};
use packet::{flow, parse_frame, proto};

use lb_sample::{ip, mixed_traffic, CONFIG};

fn config(extra: &str) -> Config {
    Config::parse(
        &CONFIG.replace("[encap]\n", &format!("[encap]\n{extra}")),
        "test",
    )
    .unwrap()
}

fn run(cfg: &Config, frames: Vec<Vec<u8>>) -> (RunStats, Vec<Vec<u8>>) {
    let control = Control::new(cfg.clone()).unwrap();
    let dp = Datapath::new(Params::from_config(cfg), control.tables()).unwrap();
    let n = frames.len() as u64;
    let mut port = MemPort::new(frames, Vary::None, Some(n)).capture();
    let stats = dp.run(&mut port, &AtomicBool::new(false)).unwrap();
    (stats, port.captured.take().unwrap())
}

/// The inner packet of a GRE frame, as a frame of its own (parsed).
fn inner_frame(f: &[u8]) -> Vec<u8> {
    let d = decapsulate(f).unwrap();
    [&f[..12], &d.ethertype.to_be_bytes()[..], &f[d.inner]].concat()
}

fn outer_checksum_ok(f: &[u8]) -> bool {
    match PacketHeaders::from_ethernet_slice(f).unwrap().net.unwrap() {
        NetHeaders::Ipv4(ip, _) => ip.header_checksum == ip.calc_header_checksum(),
        NetHeaders::Ipv6(..) => true,
    }
}

/// The sample capture without the frames to unserved ports, which are
/// answered (a RST, a port unreachable; `forwarder.rs`, `refusals.rs`)
/// rather than encapsulated.
fn gre_bound_sample() -> Vec<Vec<u8>> {
    mixed_traffic()
        .into_iter()
        .filter(|s| !matches!(s.expect, lb_sample::Expect::Refused(_)))
        .map(|s| s.frame)
        .collect()
}

fn source_prefix_spreads_flows(threads: usize) {
    let mut cfg =
        config("source_prefix = \"198.18.100.0/24\"\nsource_prefix6 = \"fd00:100::/64\"\n");
    cfg.forwarder.threads = threads;
    let v4 = SourcePrefix::new(ip("198.18.100.0"), 24).unwrap();
    let v6 = SourcePrefix::new(ip("fd00:100::"), 64).unwrap();
    // The sample capture, then 300 flows of 3 packets each.
    let mut frames = gre_bound_sample();
    for round in 0..3u8 {
        for i in 0..300u16 {
            let src = IpAddr::from([203, 0, 113, (i % 200) as u8 + 1]);
            let flags = if round == 0 { 0x02 } else { 0x10 };
            frames.push(
                Frame::tcp(src, ip("192.0.2.80"), 1024 + i, 80, flags, &[round; 10]).to_bytes(),
            );
        }
    }
    let (stats, out) = run(&cfg, frames);
    assert!(stats.counters.tx as usize == out.len() && out.len() > 900);
    // flow -> (outer source, key)
    let mut per_flow: HashMap<packet::FlowKey, (IpAddr, Option<u32>)> = HashMap::new();
    for f in &out {
        let d = decapsulate(f).unwrap();
        assert!(outer_checksum_ok(f), "outer IPv4 header checksum");
        let src = d.outer_src;
        let p = parse_frame(&inner_frame(f)).unwrap();
        if packet::flow::unmapped(&d.outer_dst).is_some() {
            assert!(v4.contains(&src), "{}", flow::to_ip(&src));
        } else {
            assert!(v6.contains(&src), "{}", flow::to_ip(&src));
        }
        assert!(d.key.is_some(), "keyed GRE");
        if p.fragment.is_none() && p.icmp_quote.is_none() {
            assert_eq!(d.key, Some(Spread::key(flow_hash(&p.flow))));
            let seen = per_flow.entry(p.flow).or_insert((flow::to_ip(&src), d.key));
            assert_eq!(*seen, (flow::to_ip(&src), d.key), "one source per flow");
        }
    }
    let distinct: std::collections::HashSet<IpAddr> = per_flow.values().map(|v| v.0).collect();
    assert!(
        distinct.len() >= 150,
        "{} distinct sources over {} flows",
        distinct.len(),
        per_flow.len()
    );
}

#[test]
fn source_prefix_spreads_flows_inline() {
    source_prefix_spreads_flows(0);
}

#[test]
fn source_prefix_spreads_flows_two_packet_threads() {
    source_prefix_spreads_flows(2);
}

#[test]
fn without_source_prefix_frames_are_unkeyed_from_source() {
    let (_, out) = run(&config(""), gre_bound_sample());
    for f in &out {
        let d = decapsulate(f).unwrap();
        assert_eq!(d.key, None);
        let want = if flow::unmapped(&d.outer_dst).is_some() {
            ip("10.0.0.1")
        } else {
            ip("fd00::1")
        };
        assert_eq!(flow::to_ip(&d.outer_src), want);
    }
}

/// Whether etherparse finds the transport checksum of `f` valid.
fn transport_ok(f: &[u8]) -> bool {
    let h = PacketHeaders::from_ethernet_slice(f).unwrap();
    let pl = h.payload.slice();
    let want = match (h.net.as_ref().unwrap(), h.transport.as_ref().unwrap()) {
        (NetHeaders::Ipv4(i, _), TransportHeader::Tcp(t)) => t.calc_checksum_ipv4(i, pl).unwrap(),
        (NetHeaders::Ipv6(i, _), TransportHeader::Tcp(t)) => t.calc_checksum_ipv6(i, pl).unwrap(),
        (NetHeaders::Ipv4(i, _), TransportHeader::Udp(u)) => u.calc_checksum_ipv4(i, pl).unwrap(),
        (NetHeaders::Ipv6(i, _), TransportHeader::Udp(u)) => u.calc_checksum_ipv6(i, pl).unwrap(),
        other => panic!("{other:?}"),
    };
    let got = match h.transport.unwrap() {
        TransportHeader::Tcp(t) => t.checksum,
        TransportHeader::Udp(u) => u.checksum,
        _ => unreachable!(),
    };
    got == want
}

/// `valid` with its checksum field as an offloading sender leaves it: the
/// folded pseudo-header sum.
fn partial(valid: &[u8]) -> Vec<u8> {
    let p = parse_frame(valid).unwrap();
    let len = p.l3_offset + p.l3_len - p.l4_offset;
    let pseudo = match (flow::unmapped(&p.flow.src), flow::unmapped(&p.flow.dst)) {
        (Some(s), Some(d)) => packet::checksum::pseudo_v4(s, d, p.flow.proto, len as u16),
        _ => packet::checksum::pseudo_v6(p.flow.src, p.flow.dst, p.flow.proto, len as u32),
    };
    let folded = !packet::checksum::finish(pseudo);
    let at = p.l4_offset + if p.flow.proto == proto::TCP { 16 } else { 6 };
    let mut f = valid.to_vec();
    f[at..at + 2].copy_from_slice(&folded.to_be_bytes());
    f
}

fn partial_checksums_are_completed(threads: usize) {
    let mut cfg = config("");
    cfg.forwarder.threads = threads;
    let valid = vec![
        Frame::tcp(ip("203.0.113.7"), ip("192.0.2.80"), 40000, 80, 0x02, b"").to_bytes(),
        Frame::tcp(
            ip("203.0.113.7"),
            ip("192.0.2.80"),
            40000,
            80,
            0x18,
            b"GET / HTTP/1.0\r\n\r\n",
        )
        .to_bytes(),
        Frame::udp(ip("203.0.113.8"), ip("192.0.2.53"), 5353, 53, b"query").to_bytes(),
        Frame::tcp(ip("2001:db8::7"), ip("2001:db8::80"), 40001, 80, 0x02, b"").to_bytes(),
    ];
    let mut frames: Vec<Vec<u8>> = valid.iter().map(|f| partial(f)).collect();
    assert!(
        frames.iter().all(|f| !transport_ok(f)),
        "partial is not valid"
    );
    // Valid packets, and one with a corrupt checksum: neither is touched.
    frames.extend(valid.iter().cloned());
    let mut corrupt = valid[1].clone();
    let p = parse_frame(&corrupt).unwrap();
    corrupt[p.l4_offset + 16] ^= 0x40;
    frames.push(corrupt.clone());
    let (stats, out) = run(&cfg, frames);
    assert_eq!(out.len(), 2 * valid.len() + 1);
    assert_eq!(stats.counters.csum_completed, valid.len() as u64);
    let inner: Vec<Vec<u8>> = out.iter().map(|f| inner_frame(f)).collect();
    let strip = |f: &[u8]| f[12..].to_vec();
    for v in &valid {
        let n = inner.iter().filter(|i| strip(i) == strip(v)).count();
        assert_eq!(n, 2, "the completed copy equals the valid one");
    }
    assert!(
        inner.iter().any(|i| strip(i) == strip(&corrupt)),
        "corrupt one kept as is"
    );
    assert_eq!(
        inner.iter().filter(|i| transport_ok(i)).count(),
        2 * valid.len()
    );
}

#[test]
fn partial_checksums_are_completed_inline() {
    partial_checksums_are_completed(0);
}

#[test]
fn partial_checksums_are_completed_two_packet_threads() {
    partial_checksums_are_completed(2);
}

#[test]
fn source_prefixes_are_validated_naming_the_key() {
    let err = |extra: &str| {
        Config::parse(
            &CONFIG.replace("[encap]\n", &format!("[encap]\n{extra}\n")),
            "lb.toml",
        )
        .unwrap_err()
    };
    for (extra, key, says) in [
        (
            "source_prefix = \"10.0.0.0/8\"",
            "encap.source_prefix",
            "/16 to /32",
        ),
        (
            "source_prefix = \"10.0.1.5/24\"",
            "encap.source_prefix",
            "10.0.1.0/24",
        ),
        (
            "source_prefix = \"10.0.1.0\"",
            "encap.source_prefix",
            "not a prefix",
        ),
        (
            "source_prefix = \"fd00::/64\"",
            "encap.source_prefix",
            "IPv4 prefix",
        ),
        (
            "source_prefix = \"10.0.0.0/33\"",
            "encap.source_prefix",
            "not a prefix",
        ),
        (
            "source_prefix6 = \"10.0.1.0/24\"",
            "encap.source_prefix6",
            "IPv6 prefix",
        ),
        (
            "source_prefix6 = \"fd00::/48\"",
            "encap.source_prefix6",
            "/64 to /128",
        ),
    ] {
        let e = err(extra);
        assert_eq!(e.key, key, "{extra}: {e}");
        let text = e.to_string();
        assert!(
            text.contains(says) && text.contains("lb.toml"),
            "{extra}: {text}"
        );
    }
    let ok = config("source_prefix = \"198.18.0.0/16\"\nsource_prefix6 = \"fd00::1/128\"\n");
    let s = ok.encap.spread().unwrap();
    assert_eq!(s.v4.map(|p| p.size()), Some(65_536));
    assert_eq!(s.v6.map(|p| p.size()), Some(1));
    assert_eq!(config("").encap.spread(), None);
    // A reload applies them: nothing waits for a restart.
    assert!(config("").restart_keys(&ok).is_empty());
}

/// A reload that sets `source_prefix` changes the outer source and key of
/// the next frames of a running datapath (the prefixes live in the swapped
/// snapshot), and one that removes it changes them back.
#[test]
fn a_reload_applies_source_prefix_to_a_running_datapath() {
    let plain = config("");
    let spread = config("source_prefix = \"198.18.100.0/24\"\n");
    let v4 = SourcePrefix::new(ip("198.18.100.0"), 24).unwrap();
    let mut control = Control::new(plain.clone()).unwrap();
    let dp = Datapath::new(Params::from_config(&plain), control.tables()).unwrap();
    let frame = Frame::tcp(ip("203.0.113.7"), ip("192.0.2.80"), 4000, 80, 0x02, b"x").to_bytes();
    let once = || {
        let mut port = MemPort::new(vec![frame.clone()], Vary::None, Some(1)).capture();
        dp.run(&mut port, &AtomicBool::new(false)).unwrap();
        let out = port.captured.take().unwrap();
        assert_eq!(out.len(), 1);
        let d = decapsulate(&out[0]).unwrap();
        (flow::to_ip(&d.outer_src), d.key)
    };
    assert_eq!(once(), (ip("10.0.0.1"), None));
    control.apply(spread).unwrap();
    let (src, key) = once();
    assert!(v4.contains(&flow::from_ip(src)), "{src}");
    assert!(key.is_some());
    control.apply(plain).unwrap();
    assert_eq!(once(), (ip("10.0.0.1"), None));
}

#[test]
fn the_example_config_documents_source_prefix() {
    let example = CONFIG;
    assert!(example.contains("source_prefix"), "examples/lb.toml");
    // Uncommented, the documented lines parse.
    let on = example
        .lines()
        .map(|l| {
            let t = l.trim_start_matches("# ");
            if t.starts_with("source_prefix") {
                t.to_string()
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    let cfg = Config::parse(&on, "lb.toml").unwrap();
    assert!(cfg.encap.spread().is_some());
}
