//! Golden pcap test through the binary a user runs: mixed sample traffic
//! goes through `fastpath lb run`; every output frame is checked field by
//! field with etherparse and decoded by tshark, a decoder we did not write,
//! as GRE carrying the original packet to the backend the Maglev table names.

mod common;

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use common::fastpath;
use lab::sample::{expected_backend, mixed_traffic, Expect, CONFIG};
use packet::{flow, parse_frame};

fn workdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("fastpath-golden-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn example_config() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/lb.toml")
}

#[test]
#[ignore = "system test: tshark"]
fn lb_run_forwards_the_sample_capture_as_gre_to_maglev_backends() {
    let dir = workdir("run");
    let (inp, out) = (dir.join("in.pcap"), dir.join("out.pcap"));
    let st = fastpath()
        .args(["lb", "sample-pcap", "--out"])
        .arg(&inp)
        .status()
        .unwrap();
    assert!(st.success());
    let report = common::json_of(
        fastpath()
            .args(["lb", "run", "--format", "json", "--config"])
            .arg(example_config())
            .arg("--pcap-in")
            .arg(&inp)
            .arg("--pcap-out")
            .arg(&out),
    );

    let cfg = lb::Config::parse(CONFIG, "examples/lb.toml").unwrap();
    let sample = mixed_traffic();
    // Inner IP packet -> (expected backend, original frame's TOS byte).
    let mut want: HashMap<Vec<u8>, (IpAddr, u8)> = HashMap::new();
    for s in &sample {
        if let Expect::Forward { pool, flow } = s.expect {
            let p = parse_frame(&s.frame).unwrap();
            want.insert(
                s.frame[p.l3_offset..p.l3_offset + p.l3_len].to_vec(),
                (expected_backend(&cfg, pool, &flow).unwrap(), p.tos),
            );
        }
    }
    assert_eq!(report["forwarded"].as_u64().unwrap() as usize, want.len());
    // Not for a VIP: counted apart from drops, as in the daemon's /status;
    // for a VIP's address on a port or protocol no VIP serves: a drop.
    assert_eq!(report["not_for_vip_by_kind"]["no_vip"], 1);
    assert_eq!(report["drops"]["vip_port_not_served"], 2, "{report}");
    // ... and answered: one TCP RST, one ICMP port unreachable.
    assert_eq!(report["refusals"]["tcp_rst"], 1, "{report}");
    assert_eq!(report["refusals"]["icmp_unreachable"], 1, "{report}");
    let refused: Vec<&Vec<u8>> = sample
        .iter()
        .filter(|s| matches!(s.expect, Expect::Refused(_)))
        .map(|s| &s.frame)
        .collect();
    assert_eq!(refused.len(), 2);
    let kinds = report["not_for_vip_by_kind"].as_object().unwrap();
    assert_eq!(
        report["not_for_vip"].as_u64(),
        Some(kinds.values().filter_map(|v| v.as_u64()).sum::<u64>())
    );
    assert!(report["drops"].get("no_vip").is_none(), "{report}");
    assert_eq!(report["drops"]["ipv4_bad_checksum"], 1);

    // Field by field with etherparse.
    let frames = netio::pcap::read_frames(&out).unwrap();
    assert_eq!(frames.len(), want.len() + refused.len());
    let mut expected_dst = Vec::new();
    // Frame number (from 1) -> the refused frame it answers.
    let mut replies: HashMap<usize, &Vec<u8>> = HashMap::new();
    for (i, f) in frames.iter().enumerate() {
        let h = etherparse::PacketHeaders::from_ethernet_slice(f).unwrap();
        let gre = match h.net.as_ref() {
            Some(etherparse::NetHeaders::Ipv4(ip, _)) => ip.protocol == etherparse::IpNumber::GRE,
            Some(etherparse::NetHeaders::Ipv6(ip, _)) => {
                ip.next_header == etherparse::IpNumber::GRE
            }
            None => false,
        };
        if !gre {
            // A refusal: back to the client that sent a refused frame,
            // from the VIP's address it used, at the MAC it came from.
            let (src, dst) = match h.net.clone().unwrap() {
                etherparse::NetHeaders::Ipv4(ip, _) => {
                    (IpAddr::from(ip.source), IpAddr::from(ip.destination))
                }
                etherparse::NetHeaders::Ipv6(ip, _) => {
                    (IpAddr::from(ip.source), IpAddr::from(ip.destination))
                }
            };
            let to = refused
                .iter()
                .find(|r| {
                    let p = parse_frame(r).unwrap();
                    // A RST answers TCP, an ICMP error UDP.
                    let tcp = matches!(h.transport, Some(etherparse::TransportHeader::Tcp(_)));
                    (flow::to_ip(&p.flow.dst), flow::to_ip(&p.flow.src)) == (src, dst)
                        && (p.flow.proto == packet::proto::TCP) == tcp
                        && r[6..12] == f[..6]
                        && r[..6] == f[6..12]
                })
                .unwrap_or_else(|| panic!("frame {i}: neither GRE nor a refusal"));
            assert!(replies.insert(i + 1, to).is_none());
            expected_dst.push(dst);
            continue;
        }
        let h = etherparse::PacketHeaders::from_ethernet_slice(f).unwrap();
        let eth = h.link.clone().unwrap().ethernet2().unwrap();
        assert_eq!(eth.source, [2, 0, 0, 0, 0, 1], "frame {i}: our MAC");
        assert_eq!(
            eth.destination,
            [2, 0, 0, 0, 0, 0xfe],
            "frame {i}: the gateway's MAC"
        );
        let d = packet::gre::decapsulate(f).unwrap();
        let inner = &f[d.inner.clone()];
        let (backend, tos) = *want
            .get(inner)
            .unwrap_or_else(|| panic!("frame {i} carries a packet that was never sent"));
        match h.net.unwrap() {
            etherparse::NetHeaders::Ipv4(ip, _) => {
                assert_eq!(ip.protocol, etherparse::IpNumber::GRE);
                assert_eq!(ip.time_to_live, 64);
                assert_eq!(
                    (ip.dscp.value() << 2) | ip.ecn.value(),
                    tos,
                    "frame {i}: DSCP/ECN copied"
                );
                assert_eq!(usize::from(ip.total_len), 20 + 4 + inner.len());
                assert_eq!(ip.header_checksum, ip.calc_header_checksum());
                assert_eq!(IpAddr::from(ip.destination), backend, "frame {i}: backend");
                assert_eq!(
                    IpAddr::from(ip.source),
                    "10.0.0.1".parse::<IpAddr>().unwrap()
                );
                assert_eq!(d.ethertype, 0x0800);
            }
            etherparse::NetHeaders::Ipv6(ip, _) => {
                assert_eq!(ip.next_header, etherparse::IpNumber::GRE);
                assert_eq!(ip.hop_limit, 64);
                assert_eq!(ip.traffic_class, tos);
                assert_eq!(usize::from(ip.payload_length), 4 + inner.len());
                assert_eq!(IpAddr::from(ip.destination), backend, "frame {i}: backend");
                assert_eq!(d.ethertype, 0x86dd);
            }
        }
        // GRE: no checksum, key or sequence; version 0.
        let gre = &f[d.inner.start - 4..d.inner.start];
        assert_eq!(&gre[..2], &[0, 0]);
        assert_eq!(flow::to_ip(&d.outer_dst), backend);
        expected_dst.push(backend);
    }

    // tshark: every frame but the refusals is GRE, nothing is malformed,
    // the outer destination is the expected backend; the refusals are a
    // TCP RST and an ICMP port unreachable with good checksums.
    let lines = common::tshark_fields(
        &out,
        &["tcp.check_checksum:TRUE", "ip.check_checksum:TRUE"],
        &[
            "frame.number",
            "gre.proto",
            "ip.dst",
            "ipv6.dst",
            "_ws.malformed",
            "tcp.flags.reset",
            "tcp.checksum.status",
            "icmp.type",
            "icmp.code",
            "icmp.checksum.status",
            "ip.checksum.status",
        ],
    );
    let mut seen_replies = 0;
    assert_eq!(lines.len(), frames.len(), "tshark sees every frame");
    for (i, line) in lines.iter().enumerate() {
        let cols: Vec<&str> = line.split('|').collect();
        assert_eq!(cols[0], (i + 1).to_string());
        if let Some(to) = replies.get(&(i + 1)) {
            seen_replies += 1;
            assert!(cols[4].is_empty(), "frame {}: malformed: {line}", i + 1);
            // (An ICMP error's quoted header is checked too.)
            assert!(
                cols[10].split(',').all(|c| c == "1"),
                "frame {}: IP checksum: {line}",
                i + 1
            );
            if parse_frame(to).unwrap().flow.proto == packet::proto::TCP {
                assert_eq!(
                    (cols[5], cols[6]),
                    ("1", "1"),
                    "frame {}: RST: {line}",
                    i + 1
                );
            } else {
                assert_eq!(
                    (cols[7], cols[8], cols[9]),
                    ("3", "3", "1"),
                    "frame {}: port unreachable: {line}",
                    i + 1
                );
            }
            continue;
        }
        assert!(
            cols[1] == "0x0800" || cols[1] == "0x86dd",
            "frame {}: tshark does not decode GRE: {line}",
            i + 1
        );
        assert!(
            cols[4].is_empty(),
            "frame {}: tshark finds it malformed: {line}",
            i + 1
        );
        let outer = if cols[2].is_empty() { cols[3] } else { cols[2] };
        let outer: IpAddr = outer.split(',').next().unwrap().parse().unwrap();
        assert_eq!(
            outer,
            expected_dst[i],
            "frame {}: tshark's outer destination",
            i + 1
        );
    }
    assert_eq!(seen_replies, refused.len());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Any packet thread count starts with the example configuration, which
/// leaves the pool to follow the count: 32 threads forward the sample as
/// two do. A pool written in the file too small for the queues of the
/// count given on the command line is refused, naming the key, the
/// count and what would do.
#[test]
fn lb_run_starts_with_32_packet_threads() {
    let dir = workdir("threads32");
    let (inp, out) = (dir.join("in.pcap"), dir.join("out.pcap"));
    let st = fastpath()
        .args(["lb", "sample-pcap", "--out"])
        .arg(&inp)
        .status()
        .unwrap();
    assert!(st.success());
    let run = |config: &Path, threads: &str| {
        fastpath()
            .args([
                "lb",
                "run",
                "--format",
                "json",
                "--threads",
                threads,
                "--config",
            ])
            .arg(config)
            .arg("--pcap-in")
            .arg(&inp)
            .arg("--pcap-out")
            .arg(&out)
            .output()
            .unwrap()
    };
    let forwarded = |o: &std::process::Output| {
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        v["forwarded"].as_u64().unwrap()
    };
    let two = forwarded(&run(&example_config(), "2"));
    assert!(two > 0);
    assert_eq!(forwarded(&run(&example_config(), "32")), two);

    let small = dir.join("small.toml");
    let text = std::fs::read_to_string(example_config()).unwrap();
    std::fs::write(
        &small,
        text.replace("queue_size = 256", "queue_size = 256\npool_buffers = 4096"),
    )
    .unwrap();
    assert_eq!(forwarded(&run(&small, "2")), two);
    let o = run(&small, "32");
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("small.toml")
            && err.contains("forwarder.pool_buffers")
            && err.contains("32 packet thread")
            && err.contains("at least 16896")
            && err.contains("--threads 32"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn lb_run_rejects_a_bad_config_naming_the_key() {
    let dir = workdir("badcfg");
    let cfg = dir.join("bad.toml");
    std::fs::write(&cfg, CONFIG.replace("pool = \"web\"", "pool = \"missing\"")).unwrap();
    let inp = dir.join("in.pcap");
    netio::pcap::write_frames(&inp, &[]).unwrap();
    let res = fastpath()
        .args(["lb", "run", "--config"])
        .arg(&cfg)
        .arg("--pcap-in")
        .arg(&inp)
        .arg("--pcap-out")
        .arg(dir.join("out.pcap"))
        .output()
        .unwrap();
    assert!(!res.status.success());
    let err = String::from_utf8_lossy(&res.stderr);
    assert!(
        err.contains("bad.toml") && err.contains("vips[0].pool") && err.contains("missing"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
