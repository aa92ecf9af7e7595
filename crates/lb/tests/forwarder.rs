//! The forwarder end to end: mixed traffic through the datapath (inline and
//! with packet threads), checked packet by packet against an independent
//! Maglev computation; connection persistence across backend changes;
//! conntrack full; a SYN flood; malformed input counted by reason.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::AtomicBool;

use lb::config::Config;
use lb::conntrack::Conntrack;
use lb::counters::DropReason;
use lb::datapath::{Datapath, Params};
use lb::frag::FragTable;
use lb::worker::{Mode, Worker};
use lb::{flow_hash, Control};
use maio::{Hugepages, Pool};
use netio::mem::{MemPort, Vary};
use netio::{Packet, HEADROOM};
use packet::build::{Frame, L4};
use packet::gre::decapsulate;
use packet::{flow, parse_frame, proto, FlowKey, Reason};

pub const CONFIG: &str = r#"
[forwarder]
threads = 2
batch = 16
queue_size = 256
pool_buffers = 4096

[conntrack]
size = 4096

[encap]
source = "10.0.0.1"
source6 = "fd00::1"

[[pools]]
name = "web"
backends = [{ address = "10.1.0.1" }, { address = "10.1.0.2" }, { address = "10.1.0.3", weight = 2 }]
include = ["web-extra"]

[[pools]]
name = "web-extra"
backends = [{ address = "10.1.0.4", name = "extra-4" }]

[[pools]]
name = "dns"
table_size = 1009
backends = [{ address = "10.2.0.1" }, { address = "10.2.0.2" }]

[[pools]]
name = "web6"
backends = [{ address = "fd00:1::1" }, { address = "fd00:1::2" }, { address = "fd00:1::3" }]

[[vips]]
name = "http"
address = "192.0.2.80"
port = 80
protocol = "tcp"
pool = "web"

[[vips]]
name = "dns-any-port"
address = "192.0.2.53"
protocol = "udp"
pool = "dns"

[[vips]]
name = "http6"
address = "2001:db8::80"
port = 80
protocol = "tcp"
pool = "web6"
"#;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// The backend address Maglev names for `flow` on the VIP's pool, computed
/// from the configuration with the maglev crate alone.
fn expected_backend(cfg: &Config, pool: &str, flow: &FlowKey) -> IpAddr {
    let members = cfg.flatten(pool).unwrap();
    let size = cfg
        .pools
        .iter()
        .find(|p| p.name == pool)
        .unwrap()
        .table_size;
    let backends: Vec<maglev::Backend> = members
        .iter()
        .map(|m| {
            maglev::Backend::weighted(
                m.name.clone().unwrap_or_else(|| m.address.to_string()),
                m.weight,
            )
        })
        .collect();
    let mut t = maglev::Maglev::new(size).unwrap();
    t.populate(&backends).unwrap();
    members[t.lookup(flow_hash(flow)).unwrap() as usize].address
}

/// One input frame and what must happen to it.
struct Case {
    frame: Vec<u8>,
    /// (pool, flow that picks the backend), or None if it must be dropped.
    expect: Option<(&'static str, FlowKey)>,
}

fn tcp(src: &str, sport: u16, dst: &str, dport: u16, flags: u8) -> Vec<u8> {
    Frame::tcp(
        ip(src),
        ip(dst),
        sport,
        dport,
        flags,
        b"GET / HTTP/1.1\r\n\r\n",
    )
    .to_bytes()
}

fn flow_of(frame: &[u8]) -> FlowKey {
    parse_frame(frame).unwrap().flow
}

/// Mixed traffic: TCP and UDP over IPv4, any-port UDP, IPv6, ICMP errors
/// about VIP flows, fragments (in and out of order), traffic for no VIP,
/// and garbage.
fn traffic() -> (Vec<Case>, HashMap<Reason, u64>, u64) {
    let mut cases = Vec::new();
    for i in 0..60u16 {
        let src = format!("203.0.113.{}", i % 50 + 1);
        for flags in [0x02, 0x10, 0x18] {
            let f = tcp(&src, 1000 + i, "192.0.2.80", 80, flags);
            let fl = flow_of(&f);
            cases.push(Case {
                frame: f,
                expect: Some(("web", fl)),
            });
        }
        let u = Frame::udp(ip(&src), ip("192.0.2.53"), 2000 + i, 53 + (i % 3), b"query").to_bytes();
        let fl = flow_of(&u);
        cases.push(Case {
            frame: u,
            expect: Some(("dns", fl)),
        });
        let v6 = Frame::tcp(
            ip(&format!("2001:db8:1::{:x}", i + 1)),
            ip("2001:db8::80"),
            3000 + i,
            80,
            0x02,
            b"x",
        )
        .to_bytes();
        let fl = flow_of(&v6);
        cases.push(Case {
            frame: v6,
            expect: Some(("web6", fl)),
        });
    }
    // ICMP frag-needed from a router about packets VIP -> client: goes to the
    // backend of the client -> VIP flow.
    for i in 0..5u16 {
        let quoted = tcp(
            "192.0.2.80",
            80,
            &format!("203.0.113.{}", i + 1),
            1000 + i,
            0x10,
        );
        let f = Frame::icmp(
            ip("198.51.100.1"),
            ip("192.0.2.80"),
            3,
            4,
            1400,
            &quoted[14..14 + 28],
        )
        .to_bytes();
        let client_flow = FlowKey::v4(
            [203, 0, 113, (i + 1) as u8],
            [192, 0, 2, 80],
            1000 + i,
            80,
            proto::TCP,
        );
        cases.push(Case {
            frame: f,
            expect: Some(("web", client_flow)),
        });
    }
    let quoted6 = Frame::tcp(
        ip("2001:db8::80"),
        ip("2001:db8:1::1"),
        80,
        3000,
        0x10,
        &[0; 8],
    )
    .to_bytes();
    let f = Frame::icmp(
        ip("2001:db8:ffff::1"),
        ip("2001:db8::80"),
        2,
        0,
        1280,
        &quoted6[14..14 + 48],
    )
    .to_bytes();
    let fl6 = FlowKey {
        src: flow::from_ip(ip("2001:db8:1::1")),
        dst: flow::from_ip(ip("2001:db8::80")),
        src_port: 3000,
        dst_port: 80,
        proto: proto::TCP,
    };
    cases.push(Case {
        frame: f,
        expect: Some(("web6", fl6)),
    });
    // Fragments of UDP datagrams to the DNS VIP: all follow the first
    // fragment's 5-tuple. Datagram 1 in order; datagram 2's last fragment
    // arrives before its first.
    for (ident, order) in [(0x1111u32, [0usize, 1, 2]), (0x2222, [2, 1, 0])] {
        let first = {
            let mut f = Frame::udp(ip("203.0.113.77"), ip("192.0.2.53"), 4444, 53, &[7; 16])
                .fragment(ident, 0, true);
            if let L4::Udp(u) = &mut f.l4 {
                u.payload = vec![7; 16];
            }
            f.to_bytes()
        };
        let key = flow_of(&first);
        let middle = Frame::new(
            ip("203.0.113.77"),
            ip("192.0.2.53"),
            L4::Raw(proto::UDP, vec![8; 24]),
        )
        .fragment(ident, 24, true)
        .to_bytes();
        let last = Frame::new(
            ip("203.0.113.77"),
            ip("192.0.2.53"),
            L4::Raw(proto::UDP, vec![9; 8]),
        )
        .fragment(ident, 48, false)
        .to_bytes();
        let parts = [first, middle, last];
        for k in order {
            cases.push(Case {
                frame: parts[k].clone(),
                expect: Some(("dns", key)),
            });
        }
    }
    // Not for a VIP: wrong port, wrong address, wrong protocol.
    let mut no_vip = 0;
    for f in [
        tcp("203.0.113.1", 5, "192.0.2.80", 443, 2),
        tcp("203.0.113.1", 5, "192.0.2.99", 80, 2),
        Frame::udp(ip("203.0.113.1"), ip("192.0.2.80"), 5, 80, b"").to_bytes(),
    ] {
        cases.push(Case {
            frame: f,
            expect: None,
        });
        no_vip += 1;
    }
    // Garbage, each with the reason it must be counted under.
    let good = tcp("203.0.113.1", 9, "192.0.2.80", 80, 2);
    let mut bad_sum = good.clone();
    bad_sum[22] ^= 0x40; // TTL
    let mut bad_ver = good.clone();
    bad_ver[14] = 0x55;
    let mut arp = good.clone();
    arp[12..14].copy_from_slice(&[0x08, 0x06]);
    let mut bad_udp = Frame::udp(ip("203.0.113.1"), ip("192.0.2.53"), 1, 53, b"abcd").to_bytes();
    bad_udp[14 + 20 + 5] = 250;
    let garbage = [
        (good[..9].to_vec(), Reason::EthernetTruncated),
        (good[..30].to_vec(), Reason::Ipv4Truncated),
        (good[..50].to_vec(), Reason::Ipv4BadTotalLength),
        (bad_sum, Reason::Ipv4BadChecksum),
        (bad_ver, Reason::Ipv4BadVersion),
        (arp, Reason::NotIp),
        (bad_udp, Reason::UdpBadLength),
        (
            Frame::tcp(ip("2001:db8::1"), ip("2001:db8::80"), 1, 80, 2, b"").to_bytes()[..60]
                .to_vec(),
            Reason::Ipv6BadPayloadLength,
        ),
    ];
    let mut reasons = HashMap::new();
    for (f, r) in garbage {
        *reasons.entry(r).or_insert(0) += 1;
        cases.push(Case {
            frame: f,
            expect: None,
        });
    }
    (cases, reasons, no_vip)
}

fn run_mixed(threads: usize) {
    let mut cfg = Config::parse(CONFIG, "test").unwrap();
    cfg.forwarder.threads = threads;
    let (cases, reasons, no_vip) = traffic();
    let control = Control::new(cfg.clone()).unwrap();
    let mut params = Params::from_config(&cfg);
    params.hugepages = Hugepages::Auto;
    let dp = Datapath::new(params, control.tables()).unwrap();
    let frames: Vec<Vec<u8>> = cases.iter().map(|c| c.frame.clone()).collect();
    let mut port = MemPort::new(frames, Vary::None, Some(cases.len() as u64)).capture();
    let stats = dp.run(&mut port, &AtomicBool::new(false)).unwrap();

    // Expected: inner IP packet bytes -> expected backend address.
    let mut want: HashMap<Vec<u8>, IpAddr> = HashMap::new();
    let mut forwarded = 0;
    for c in &cases {
        if let Some((pool, fl)) = c.expect {
            let p = parse_frame(&c.frame).unwrap();
            want.insert(
                c.frame[p.l3_offset..p.l3_offset + p.l3_len].to_vec(),
                expected_backend(&cfg, pool, &fl),
            );
            forwarded += 1;
        }
    }
    let out = port.captured.take().unwrap();
    assert_eq!(
        out.len(),
        forwarded,
        "threads={threads}: forwarded count; drops {:?}",
        stats.counters.drop_table()
    );
    for frame in &out {
        let d = decapsulate(frame).expect("every output is GRE");
        let inner = &frame[d.inner.clone()];
        let backend = want
            .get(inner)
            .unwrap_or_else(|| panic!("output carries a packet that was not sent: {inner:02x?}"));
        assert_eq!(
            flow::to_ip(&d.outer_dst),
            *backend,
            "wrong backend for {:?}",
            parse_frame(&[&[0u8; 12][..], &d.ethertype.to_be_bytes(), inner].concat())
                .map(|p| p.flow)
        );
        let src = if backend.is_ipv4() {
            "10.0.0.1"
        } else {
            "fd00::1"
        };
        assert_eq!(flow::to_ip(&d.outer_src), ip(src));
    }
    let c = &stats.counters;
    assert_eq!(c.drops_for(DropReason::NoVip), no_vip);
    for (r, n) in reasons {
        assert_eq!(c.drops_for(DropReason::Malformed(r)), n, "{r}");
    }
    assert_eq!(c.rx, cases.len() as u64);
    assert_eq!(c.tx as usize, forwarded);
    assert_eq!(c.icmp_to_backend, 6);
    assert_eq!(
        (c.frag_held, c.frag_released),
        (2, 2),
        "datagram 2's two early fragments wait for the first"
    );
    assert_eq!(stats.pool.in_use, 0, "every buffer returned to the pool");
    // Per-VIP counters add up.
    let per_vip: u64 = c.per_vip.iter().map(|t| t.packets).sum();
    assert_eq!(per_vip, c.tx);
}

#[test]
fn mixed_traffic_inline() {
    run_mixed(0);
}

#[test]
fn mixed_traffic_two_packet_threads() {
    run_mixed(2);
}

// --- packet-thread level tests --------------------------------------------

fn worker(pool: &Pool, ct_size: usize) -> Worker {
    Worker::new(
        pool,
        Mode::Maglev,
        Conntrack::new(ct_size, 300_000, 30_000),
        FragTable::new(64, 1000),
    )
}

fn small_pool() -> Pool {
    Pool::new(maio::Config {
        buffers: 4096,
        buf_size: 2048,
        hugepages: Hugepages::Never,
        magazine_depth: 64,
    })
    .unwrap()
}

/// Runs frames through a worker; returns the backend address per frame
/// (None if dropped), in order.
fn through(
    w: &mut Worker,
    pool: &Pool,
    control: &Control,
    frames: &[Vec<u8>],
    now: u64,
) -> Vec<Option<IpAddr>> {
    let mut h = pool.handle();
    let t = control.tables().load_full();
    let mut res = Vec::new();
    for f in frames {
        let mut b = h.alloc().unwrap();
        pool.data_mut(&mut b)[HEADROOM..HEADROOM + f.len()].copy_from_slice(f);
        let mut batch = vec![Packet {
            buf: b,
            off: HEADROOM as u16,
            len: f.len() as u16,
        }];
        let mut out = Vec::new();
        w.process(&t, &mut batch, &mut out, now);
        res.push(out.pop().map(|p| {
            let d = decapsulate(p.frame(pool)).unwrap();
            let a = flow::to_ip(&d.outer_dst);
            h.free(p.buf).unwrap();
            a
        }));
    }
    res
}

#[test]
fn connections_persist_when_backends_are_added_and_removed() {
    let cfg = Config::parse(CONFIG, "test").unwrap();
    let mut control = Control::new(cfg.clone()).unwrap();
    let pool = small_pool();
    let mut w = worker(&pool, 4096);
    let syns: Vec<Vec<u8>> = (0..800u16)
        .map(|i| {
            tcp(
                &format!("198.18.{}.{}", i / 200, i % 200 + 1),
                10_000 + i,
                "192.0.2.80",
                80,
                2,
            )
        })
        .collect();
    let before = through(&mut w, &pool, &control, &syns, 0);
    assert!(before.iter().all(Option::is_some));

    // Add a backend and remove another.
    let mut next = cfg.clone();
    let web = next.pools.iter_mut().find(|p| p.name == "web").unwrap();
    web.backends.retain(|b| b.address != ip("10.1.0.2"));
    web.backends.push(lb::config::BackendConf {
        address: ip("10.1.0.9"),
        name: None,
        weight: 1,
    });
    control.apply(next.clone()).unwrap();

    let acks: Vec<Vec<u8>> = (0..800u16)
        .map(|i| {
            tcp(
                &format!("198.18.{}.{}", i / 200, i % 200 + 1),
                10_000 + i,
                "192.0.2.80",
                80,
                0x10,
            )
        })
        .collect();
    let after = through(&mut w, &pool, &control, &acks, 1000);
    let mut moved = 0;
    for (i, (b, a)) in before.iter().zip(&after).enumerate() {
        if *b == Some(ip("10.1.0.2")) {
            // Its backend is gone: the flow moves to Maglev's new choice.
            assert_eq!(*a, Some(expected_backend(&next, "web", &flow_of(&acks[i]))));
            moved += 1;
        } else {
            assert_eq!(
                a, b,
                "flow {i} kept by conntrack although its backend is healthy"
            );
        }
    }
    assert!(moved > 100, "the removed backend held flows ({moved})");
    // A fresh load balancer (no conntrack) follows the new table, which is
    // the same as the old one for most flows (Maglev's minimal disruption).
    let mut fresh = worker(&pool, 4096);
    let fresh_after = through(&mut fresh, &pool, &control, &acks, 0);
    let same = before
        .iter()
        .zip(&fresh_after)
        .filter(|(b, a)| b == a)
        .count();
    assert!(same > 500, "Maglev kept most flows in place: {same}/800");
    // Marking a backend unhealthy moves its flows even with conntrack.
    assert!(control.set_health("10.1.0.1", false));
    let unhealthy = through(&mut w, &pool, &control, &acks, 2000);
    assert!(unhealthy.iter().all(|a| *a != Some(ip("10.1.0.1"))));
    assert!(!control.set_health("nonexistent", false));
}

#[test]
fn conntrack_full_still_forwards_by_maglev() {
    let cfg = Config::parse(CONFIG, "test").unwrap();
    let control = Control::new(cfg.clone()).unwrap();
    let pool = small_pool();
    let mut w = worker(&pool, 4); // one bucket of four
    let frames: Vec<Vec<u8>> = (0..100u16)
        .map(|i| tcp("198.51.100.7", 20_000 + i, "192.0.2.80", 80, 2))
        .collect();
    let got = through(&mut w, &pool, &control, &frames, 0);
    for (f, g) in frames.iter().zip(&got) {
        assert_eq!(*g, Some(expected_backend(&cfg, "web", &flow_of(f))));
    }
    let ct = w.counters.conntrack;
    assert_eq!((ct.inserts, ct.insert_failures), (4, 96));
    assert_eq!(w.counters.tx, 100);
}

#[test]
fn no_healthy_backend_drops_and_counts() {
    let cfg = Config::parse(CONFIG, "test").unwrap();
    let mut control = Control::new(cfg).unwrap();
    for b in ["10.2.0.1", "10.2.0.2"] {
        assert!(control.set_health(b, false));
    }
    let pool = small_pool();
    let mut w = worker(&pool, 64);
    let f = Frame::udp(ip("203.0.113.1"), ip("192.0.2.53"), 1, 53, b"q").to_bytes();
    assert_eq!(through(&mut w, &pool, &control, &[f], 0), vec![None]);
    assert_eq!(w.counters.drops_for(DropReason::NoHealthyBackend), 1);
}

#[test]
fn syn_flood_from_random_sources() {
    let mut cfg = Config::parse(CONFIG, "test").unwrap();
    cfg.conntrack.size = 1024;
    cfg.forwarder.threads = 2;
    let control = Control::new(cfg.clone()).unwrap();
    let dp = Datapath::new(Params::from_config(&cfg), control.tables()).unwrap();
    // 256 random sources; the generator rewrites the source port of every
    // packet, so each of the 60,000 SYNs is a new flow.
    let mut rng = maglev::eval::SplitMix::new(99);
    let templates: Vec<Vec<u8>> = (0..256)
        .map(|_| {
            let a = rng.next_u64().to_be_bytes();
            let src = IpAddr::from([a[0] | 1, a[1], a[2], a[3]]);
            Frame::tcp(src, ip("192.0.2.80"), 1, 80, 0x02, b"").to_bytes()
        })
        .collect();
    let n = 60_000u64;
    let mut port = MemPort::new(templates, Vary::SourcePort { at: 14 + 20 }, Some(n)).capture();
    let stats = dp.run(&mut port, &AtomicBool::new(false)).unwrap();
    let c = &stats.counters;
    assert_eq!(c.tx, n, "every SYN is forwarded: {:?}", c.drop_table());
    assert!(c.conntrack.insert_failures > 0, "the tables filled up");
    assert_eq!(
        c.conntrack.inserts + c.conntrack.insert_failures + c.conntrack.hits,
        n
    );
    assert_eq!(stats.pool.in_use, 0);
    // Spot-check backends against Maglev.
    for frame in port.captured.unwrap().iter().step_by(997) {
        let d = decapsulate(frame).unwrap();
        let inner_flow =
            parse_frame(&[&frame[..12], &[0x08, 0x00], &frame[d.inner.clone()]].concat())
                .unwrap()
                .flow;
        assert_eq!(
            flow::to_ip(&d.outer_dst),
            expected_backend(&cfg, "web", &inner_flow)
        );
    }
}
