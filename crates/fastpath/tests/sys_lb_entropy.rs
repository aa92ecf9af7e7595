//! `[encap] source_prefix` through the binary a user runs, decoded by
//! tshark (a decoder we did not write): flows replayed through `fastpath lb
//! run --pcap-in` leave with outer sources inside the prefix, several
//! distinct, one per flow, the flow hash in the GRE key, and good
//! checksums, outer and inner, including the inner TCP checksums the
//! capture carried partial (as an offloading local sender leaves them).

mod common;

use std::collections::{HashMap, HashSet};
use std::net::Ipv4Addr;
use std::path::PathBuf;

use common::fastpath;
use lab::sample::{ip, CONFIG};
use packet::build::Frame;
use packet::gre::Spread;
use packet::parse_frame;

fn workdir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("fastpath-entropy-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `valid` with its TCP checksum field as an offloading sender leaves it
/// (the folded pseudo-header sum).
fn partial(valid: &[u8]) -> Vec<u8> {
    let p = parse_frame(valid).unwrap();
    let len = (p.l3_offset + p.l3_len - p.l4_offset) as u16;
    let (s, d) = (
        packet::flow::unmapped(&p.flow.src).unwrap(),
        packet::flow::unmapped(&p.flow.dst).unwrap(),
    );
    let folded = !packet::checksum::finish(packet::checksum::pseudo_v4(s, d, 6, len));
    let mut f = valid.to_vec();
    f[p.l4_offset + 16..p.l4_offset + 18].copy_from_slice(&folded.to_be_bytes());
    f
}

fn good(status: &str) -> bool {
    status == "1" || status.eq_ignore_ascii_case("good")
}

#[test]
#[ignore = "system test: tshark"]
fn tshark_sees_per_flow_sources_in_the_prefix_and_the_flow_hash_as_key() {
    let dir = workdir();
    let (cfg, inp, out) = (
        dir.join("lb.toml"),
        dir.join("in.pcap"),
        dir.join("out.pcap"),
    );
    std::fs::write(
        &cfg,
        CONFIG.replace(
            "[encap]\n",
            "[encap]\nsource_prefix = \"198.18.100.0/24\"\n",
        ),
    )
    .unwrap();
    // 200 flows of 3 packets; every other flow's first packet partial.
    let flows = 200u16;
    let mut frames = Vec::new();
    let mut key_of: HashMap<(Ipv4Addr, u16), u32> = HashMap::new();
    let mut partials = 0;
    for round in 0..3u8 {
        for i in 0..flows {
            let client = Ipv4Addr::new(203, 0, 113, (i % 100) as u8 + 1);
            let sport = 20_000 + i;
            let flags = if round == 0 { 0x02 } else { 0x10 };
            let f = Frame::tcp(
                client.into(),
                ip("192.0.2.80"),
                sport,
                80,
                flags,
                &[round; 20],
            )
            .to_bytes();
            let flow = parse_frame(&f).unwrap().flow;
            key_of.insert((client, sport), Spread::key(lb::worker::flow_hash(&flow)));
            if round == 0 && i % 2 == 0 {
                frames.push(partial(&f));
                partials += 1;
            } else {
                frames.push(f);
            }
        }
    }
    netio::pcap::write_frames(&inp, &frames).unwrap();
    let report = common::json_of(
        fastpath()
            .args(["lb", "run", "--format", "json", "--config"])
            .arg(&cfg)
            .arg("--pcap-in")
            .arg(&inp)
            .arg("--pcap-out")
            .arg(&out),
    );
    assert_eq!(
        report["forwarded"].as_u64(),
        Some(frames.len() as u64),
        "{report}"
    );

    let lines = common::tshark_fields(
        &out,
        &["ip.check_checksum:TRUE", "tcp.check_checksum:TRUE"],
        &[
            "ip.src",
            "gre.key",
            "ip.checksum.status",
            "tcp.srcport",
            "tcp.checksum.status",
            "_ws.malformed",
        ],
    );
    assert_eq!(lines.len(), frames.len(), "tshark sees every frame");
    let mut per_flow: HashMap<(Ipv4Addr, u16), HashSet<(Ipv4Addr, u32)>> = HashMap::new();
    for line in &lines {
        let c: Vec<&str> = line.split('|').collect();
        // ip.src and ip.checksum.status: outer, then inner.
        let srcs: Vec<Ipv4Addr> = c[0].split(',').map(|a| a.parse().unwrap()).collect();
        assert_eq!(srcs.len(), 2, "outer and inner IPv4: {line}");
        let (outer, client) = (srcs[0], srcs[1]);
        let o = outer.octets();
        assert_eq!(
            o[..3],
            [198, 18, 100],
            "outer source {outer} in the prefix: {line}"
        );
        let key = u32::from_str_radix(c[1].trim_start_matches("0x"), 16)
            .unwrap_or_else(|_| panic!("no GRE key: {line}"));
        let sums: Vec<&str> = c[2].split(',').collect();
        assert!(
            sums.len() == 2 && sums.iter().all(|s| good(s)),
            "IPv4 checksums: {line}"
        );
        let sport: u16 = c[3].parse().unwrap();
        assert!(good(c[4]), "inner TCP checksum: {line}");
        assert!(c[5].is_empty(), "malformed: {line}");
        assert_eq!(key_of[&(client, sport)], key, "GRE key = flow hash: {line}");
        per_flow
            .entry((client, sport))
            .or_default()
            .insert((outer, key));
    }
    assert_eq!(per_flow.len(), usize::from(flows));
    assert!(
        per_flow.values().all(|s| s.len() == 1),
        "every packet of a flow: one outer source and key"
    );
    let distinct: HashSet<Ipv4Addr> = per_flow.values().flatten().map(|s| s.0).collect();
    // 200 flows into 256 addresses: about 139 distinct expected.
    assert!(
        distinct.len() >= 100,
        "only {} distinct outer sources",
        distinct.len()
    );
    assert!(partials > 0);
    std::fs::remove_dir_all(&dir).unwrap();
}
