//! A frame for a VIP's address on a port or protocol no VIP serves is
//! answered as a host answers a closed port, so that the client learns at
//! once instead of waiting out its timeout: a TCP RST (RFC 9293 section
//! 3.10.7.1), an ICMP or ICMPv6 port unreachable (RFC 792, RFC 4443), back
//! to the sender from the address it used; and it stays counted as
//! dropped (`vip_port_not_served`). What a host must not answer (RFC 1122
//! section 3.2.2, RFC 4443 section 2.4(e)) is not answered, and replies
//! are rate-limited per packet thread. Frames are built and replies read
//! with etherparse, an implementation we did not write.
//!
//! The sample configuration (`examples/lb.toml`) serves 192.0.2.80 TCP 80,
//! 192.0.2.53 UDP on any port and 2001:db8::80 TCP 80.

mod common;

use etherparse::{
    Icmpv4Type, Icmpv6Type, IpNumber, NetHeaders, PacketBuilder, PacketHeaders, TransportHeader,
};
use lb::config::Config;
use lb::conntrack::Conntrack;
use lb::counters::DropReason;
use lb::frag::FragTable;
use lb::worker::{Worker, REFUSALS_PER_S, REFUSAL_BURST};
use lb::{Control, Mode};
use maio::{Hugepages, Pool};

const CLIENT_MAC: [u8; 6] = [2, 0, 0, 0, 0, 9];
const LB_MAC: [u8; 6] = [2, 0, 0, 0, 0x0e, 2];

fn setup() -> (Control, Worker, Pool) {
    let cfg = Config::parse(lb_sample::CONFIG, "test").unwrap();
    let control = Control::new(cfg).unwrap();
    let pool = Pool::new(maio::Config {
        buffers: 256,
        buf_size: 2048,
        hugepages: Hugepages::Never,
        magazine_depth: 16,
    })
    .unwrap();
    let worker = Worker::new(
        &pool,
        Mode::Maglev,
        Conntrack::new(1024, 60_000, 30_000),
        FragTable::new(64, 10_000),
    );
    (control, worker, pool)
}

/// Runs `frames` through the worker at `now` ms: the frames it sent.
fn run(
    control: &Control,
    w: &mut Worker,
    pool: &Pool,
    frames: &[Vec<u8>],
    now: u64,
) -> Vec<Vec<u8>> {
    let mut h = pool.handle();
    let mut sent = Vec::new();
    for chunk in frames.chunks(32) {
        let mut batch: Vec<_> = chunk
            .iter()
            .map(|f| common::packet(pool, &mut h, f))
            .collect();
        let mut out = Vec::new();
        w.process(&control.tables().load(), &mut batch, &mut out, now);
        for p in out {
            let s = usize::from(p.off);
            sent.push(pool.data(&p.buf)[s..s + usize::from(p.len)].to_vec());
            h.free(p.buf).unwrap();
        }
    }
    sent
}

fn v4(src: &str, dst: &str) -> PacketBuilder4 {
    let (s, d): (std::net::Ipv4Addr, std::net::Ipv4Addr) =
        (src.parse().unwrap(), dst.parse().unwrap());
    PacketBuilder::ethernet2(CLIENT_MAC, LB_MAC).ipv4(s.octets(), d.octets(), 64)
}

type PacketBuilder4 = etherparse::PacketBuilderStep<etherparse::IpHeaders>;

fn v6(src: &str, dst: &str) -> PacketBuilder4 {
    let (s, d): (std::net::Ipv6Addr, std::net::Ipv6Addr) =
        (src.parse().unwrap(), dst.parse().unwrap());
    PacketBuilder::ethernet2(CLIENT_MAC, LB_MAC).ipv6(s.octets(), d.octets(), 64)
}

/// A TCP segment from port 40000 to `dport`; `flags` among S, A, F, R, P.
fn tcp(b: PacketBuilder4, dport: u16, flags: &str, seq: u32, ack: u32, payload: &[u8]) -> Vec<u8> {
    let mut t = b.tcp(40_000, dport, seq, 65_535);
    for c in flags.chars() {
        t = match c {
            'S' => t.syn(),
            'A' => t.ack(ack),
            'F' => t.fin(),
            'R' => t.rst(),
            'P' => t.psh(),
            _ => panic!("flag {c}"),
        };
    }
    let mut out = Vec::new();
    t.write(&mut out, payload).unwrap();
    out
}

fn udp(b: PacketBuilder4, dport: u16, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    b.udp(40_000, dport).write(&mut out, payload).unwrap();
    out
}

/// A reply, read: its MACs and addresses must answer `to`.
struct Reply {
    headers: TransportHeader,
    payload: Vec<u8>,
}

fn read_reply(reply: &[u8], to: &[u8]) -> Reply {
    let h = PacketHeaders::from_ethernet_slice(reply).unwrap();
    let q = PacketHeaders::from_ethernet_slice(to).unwrap();
    let (eth, qeth) = (
        h.link.clone().unwrap().ethernet2().unwrap(),
        q.link.clone().unwrap().ethernet2().unwrap(),
    );
    assert_eq!(
        (eth.source, eth.destination),
        (qeth.destination, qeth.source)
    );
    let payload = h.payload.slice().to_vec();
    match (h.net.clone().unwrap(), q.net.clone().unwrap()) {
        (NetHeaders::Ipv4(ip, _), NetHeaders::Ipv4(qip, _)) => {
            assert_eq!((ip.source, ip.destination), (qip.destination, qip.source));
            assert_eq!(ip.time_to_live, 64);
            assert_eq!(ip.header_checksum, ip.calc_header_checksum());
            let t = h.transport.clone().unwrap();
            match &t {
                TransportHeader::Tcp(r) => {
                    assert_eq!(r.checksum, r.calc_checksum_ipv4(&ip, &payload).unwrap())
                }
                TransportHeader::Icmpv4(i) => {
                    assert_eq!(i.checksum, i.icmp_type.calc_checksum(&payload))
                }
                other => panic!("reply is {other:?}"),
            }
            Reply {
                headers: t,
                payload,
            }
        }
        (NetHeaders::Ipv6(ip, _), NetHeaders::Ipv6(qip, _)) => {
            assert_eq!((ip.source, ip.destination), (qip.destination, qip.source));
            assert_eq!(ip.hop_limit, 64);
            let t = h.transport.clone().unwrap();
            match &t {
                TransportHeader::Tcp(r) => {
                    assert_eq!(r.checksum, r.calc_checksum_ipv6(&ip, &payload).unwrap())
                }
                TransportHeader::Icmpv6(i) => assert_eq!(
                    i.checksum,
                    i.icmp_type
                        .calc_checksum(ip.source, ip.destination, &payload)
                        .unwrap()
                ),
                other => panic!("reply is {other:?}"),
            }
            Reply {
                headers: t,
                payload,
            }
        }
        _ => panic!("reply of another IP version"),
    }
}

/// A RST's sequence number, ACK flag and acknowledgment number.
type Rst = (u32, bool, u32);

/// The RST's (seq, ack flag, ack number), checked to come from the
/// segment's destination port back to its source port.
fn rst(r: &Reply, dport: u16) -> Rst {
    let TransportHeader::Tcp(t) = &r.headers else {
        panic!("not TCP: {:?}", r.headers)
    };
    assert!(t.rst && !t.syn && !t.fin && r.payload.is_empty());
    assert_eq!((t.source_port, t.destination_port), (dport, 40_000));
    (t.sequence_number, t.ack, t.acknowledgment_number)
}

#[test]
fn tcp_to_an_unserved_port_is_reset_as_rfc_9293_says() {
    let (control, mut w, pool) = setup();
    let to = |dst: &str| v4("198.51.100.7", dst);
    let cases: Vec<(Vec<u8>, u16, Rst)> = vec![
        // SYN without ACK: <SEQ=0><ACK=SEG.SEQ+SEG.LEN><CTL=RST,ACK>, the
        // SYN counting one.
        (
            tcp(to("192.0.2.80"), 443, "S", 1000, 0, b""),
            443,
            (0, true, 1001),
        ),
        // With ACK: <SEQ=SEG.ACK><CTL=RST>.
        (
            tcp(to("192.0.2.80"), 443, "A", 5, 0xdead_beef, b""),
            443,
            (0xdead_beef, false, 0),
        ),
        (
            tcp(to("192.0.2.80"), 22, "PA", 5, 77, b"data"),
            22,
            (77, false, 0),
        ),
        // FIN without ACK, with 4 bytes: SEG.LEN = 4 + 1, wrapping.
        (
            tcp(to("192.0.2.80"), 443, "F", u32::MAX, 0, b"abcd"),
            443,
            (0, true, 4),
        ),
        // TCP to the UDP VIP's address: no TCP VIP there.
        (tcp(to("192.0.2.53"), 53, "S", 7, 0, b""), 53, (0, true, 8)),
        // IPv6.
        (
            tcp(v6("2001:db8:1::7", "2001:db8::80"), 443, "S", 9, 0, b""),
            443,
            (0, true, 10),
        ),
    ];
    for (i, (f, dport, want)) in cases.iter().enumerate() {
        let out = run(&control, &mut w, &pool, std::slice::from_ref(f), 1);
        assert_eq!(out.len(), 1, "case {i}: one reply");
        assert_eq!(rst(&read_reply(&out[0], f), *dport), *want, "case {i}");
    }
    let c = &w.counters;
    let n = cases.len() as u64;
    assert_eq!(c.refused_tcp_rst, n);
    assert_eq!(c.drops_for(DropReason::VipPortNotServed), n);
    assert_eq!(
        (c.tx, c.rx),
        (0, n),
        "the segments are dropped, not forwarded"
    );
    assert_eq!(c.rx, c.tx + c.dropped());
}

#[test]
fn a_reset_is_never_answered() {
    let (control, mut w, pool) = setup();
    for flags in ["R", "RA", "RS"] {
        let f = tcp(v4("198.51.100.7", "192.0.2.80"), 443, flags, 1, 1, b"");
        assert!(run(&control, &mut w, &pool, &[f], 1).is_empty(), "{flags}");
    }
    assert_eq!(w.counters.refused_tcp_rst, 0);
    assert_eq!(w.counters.drops_for(DropReason::VipPortNotServed), 3);
}

#[test]
fn udp_to_an_unserved_port_gets_port_unreachable() {
    let (control, mut w, pool) = setup();
    let f4 = udp(v4("198.51.100.7", "192.0.2.80"), 53, b"query");
    let out = run(&control, &mut w, &pool, std::slice::from_ref(&f4), 1);
    assert_eq!(out.len(), 1);
    let r = read_reply(&out[0], &f4);
    let TransportHeader::Icmpv4(i) = &r.headers else {
        panic!("{:?}", r.headers)
    };
    assert_eq!(
        i.icmp_type,
        Icmpv4Type::DestinationUnreachable(etherparse::icmpv4::DestUnreachableHeader::Port)
    );
    assert_eq!(
        r.payload,
        f4[14..],
        "the datagram quoted whole (it is small)"
    );

    // A big one: quoted only as far as 576 octets of ICMP packet allow.
    let big = udp(v4("198.51.100.7", "192.0.2.80"), 9, &[0x55; 1200]);
    let out = run(&control, &mut w, &pool, std::slice::from_ref(&big), 1);
    assert_eq!(out[0].len(), 14 + 576);
    assert_eq!(read_reply(&out[0], &big).payload, big[14..14 + 576 - 28]);

    let f6 = udp(v6("2001:db8:1::7", "2001:db8::80"), 53, &[0x66; 1400]);
    let out = run(&control, &mut w, &pool, std::slice::from_ref(&f6), 1);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].len(), 14 + 1280, "ICMPv6 fills the minimum MTU");
    let r = read_reply(&out[0], &f6);
    let TransportHeader::Icmpv6(i) = &r.headers else {
        panic!("{:?}", r.headers)
    };
    assert_eq!(
        i.icmp_type,
        Icmpv6Type::DestinationUnreachable(etherparse::icmpv6::DestUnreachableCode::Port)
    );
    assert_eq!(r.payload, f6[14..14 + 1280 - 48]);
    let c = &w.counters;
    assert_eq!(c.refused_icmp_unreachable, 3);
    assert_eq!(c.drops_for(DropReason::VipPortNotServed), 3);
    assert_eq!(c.rx, c.tx + c.dropped());
}

#[test]
fn what_a_host_must_not_answer_is_not_answered() {
    let (control, mut w, pool) = setup();
    let mut frames: Vec<(&str, Vec<u8>)> = Vec::new();
    // Fragments: the first and a later one of a UDP datagram to the TCP
    // VIP's address.
    let mut first = Vec::new();
    let mut ip =
        etherparse::Ipv4Header::new(0, 64, IpNumber::UDP, [198, 51, 100, 7], [192, 0, 2, 80])
            .unwrap();
    ip.more_fragments = true;
    ip.identification = 7;
    PacketBuilder::ethernet2(CLIENT_MAC, LB_MAC)
        .ip(etherparse::IpHeaders::Ipv4(ip.clone(), Default::default()))
        .udp(40_000, 53)
        .write(&mut first, &[0; 32])
        .unwrap();
    frames.push(("first fragment", first));
    let mut later = Vec::new();
    ip.more_fragments = false;
    ip.fragment_offset = etherparse::IpFragOffset::try_new(5).unwrap();
    ip.set_payload_len(16).unwrap();
    ip.header_checksum = ip.calc_header_checksum();
    later.extend_from_slice(&LB_MAC);
    later.extend_from_slice(&CLIENT_MAC);
    later.extend_from_slice(&[0x08, 0x00]);
    later.extend_from_slice(&ip.to_bytes());
    later.extend_from_slice(&[0; 16]);
    frames.push(("later fragment", later));
    // An ICMP error about something the VIP sent (port unreachable).
    let quoted = udp(v4("192.0.2.80", "198.51.100.7"), 9, b"x");
    let mut err = Vec::new();
    PacketBuilder::ethernet2(CLIENT_MAC, LB_MAC)
        .ipv4([198, 51, 100, 7], [192, 0, 2, 80], 64)
        .icmpv4(Icmpv4Type::DestinationUnreachable(
            etherparse::icmpv4::DestUnreachableHeader::Port,
        ))
        .write(&mut err, &quoted[14..])
        .unwrap();
    frames.push(("ICMP error", err));
    let mut err6 = Vec::new();
    PacketBuilder::ethernet2(CLIENT_MAC, LB_MAC)
        .ipv6(
            "2001:db8:1::7"
                .parse::<std::net::Ipv6Addr>()
                .unwrap()
                .octets(),
            "2001:db8::80"
                .parse::<std::net::Ipv6Addr>()
                .unwrap()
                .octets(),
            64,
        )
        .icmpv6(Icmpv6Type::DestinationUnreachable(
            etherparse::icmpv6::DestUnreachableCode::Port,
        ))
        .write(&mut err6, &[0; 48])
        .unwrap();
    frames.push(("ICMPv6 error", err6));
    // Sent to the link's broadcast and to a multicast MAC.
    let mut bcast = tcp(v4("198.51.100.7", "192.0.2.80"), 443, "S", 1, 0, b"");
    bcast[..6].fill(0xff);
    frames.push(("link broadcast", bcast));
    let mut mcast = udp(v6("2001:db8:1::7", "2001:db8::80"), 53, b"x");
    mcast[..6].copy_from_slice(&[0x33, 0x33, 0, 0, 0, 1]);
    frames.push(("link multicast", mcast));
    // Martian and VIP sources, TTL 0: refused before any answer.
    frames.push((
        "loopback source",
        tcp(v4("127.0.0.1", "192.0.2.80"), 443, "S", 1, 0, b""),
    ));
    frames.push((
        "broadcast source",
        udp(v4("255.255.255.255", "192.0.2.80"), 53, b"x"),
    ));
    frames.push((
        "multicast source",
        udp(v6("ff02::1", "2001:db8::80"), 53, b"x"),
    ));
    frames.push((
        "VIP source",
        tcp(v4("192.0.2.53", "192.0.2.80"), 443, "S", 1, 0, b""),
    ));
    let mut ttl0 = Vec::new();
    PacketBuilder::ethernet2(CLIENT_MAC, LB_MAC)
        .ipv4([198, 51, 100, 7], [192, 0, 2, 80], 0)
        .udp(1, 2)
        .write(&mut ttl0, b"x")
        .unwrap();
    frames.push(("TTL 0", ttl0));
    // Neither TCP nor UDP.
    let mut gre = Vec::new();
    PacketBuilder::ethernet2(CLIENT_MAC, LB_MAC)
        .ipv4([198, 51, 100, 7], [192, 0, 2, 80], 64)
        .write(&mut gre, IpNumber::GRE, &[0; 8])
        .unwrap();
    frames.push(("GRE", gre));
    for (what, f) in &frames {
        let out = run(&control, &mut w, &pool, std::slice::from_ref(f), 1);
        assert!(out.is_empty(), "{what} was answered: {:02x?}", out);
    }
    // A multicast destination is no VIP's address: not for the load
    // balancer at all.
    let m = udp(v4("198.51.100.7", "239.1.2.3"), 53, b"x");
    assert!(run(&control, &mut w, &pool, &[m], 1).is_empty());
    let c = &w.counters;
    assert_eq!((c.refused_tcp_rst, c.refused_icmp_unreachable), (0, 0));
    assert_eq!(c.refusal_rate_limited, 0, "none of them took a token");
    assert!(c.drops_for(DropReason::NoVip) >= 1);
}

/// A flood of SYNs from forged sources to unserved ports gets at most
/// the burst at once, then the rate: the load balancer is no reflector.
#[test]
fn refusals_are_rate_limited_per_packet_thread() {
    let (control, mut w, pool) = setup();
    let flood = |n: u32| -> Vec<Vec<u8>> {
        (0..n)
            .map(|i| {
                let src = format!("198.51.{}.{}", 100 + (i >> 8) % 4, i & 0xff);
                tcp(v4(&src, "192.0.2.80"), 443, "S", i, 0, b"")
            })
            .collect()
    };
    let n = 1000;
    let at_1 = run(&control, &mut w, &pool, &flood(n), 1).len() as u64;
    assert_eq!(at_1, REFUSAL_BURST, "the burst at once");
    // 20 ms later: 20 more at 1,000 a second.
    let at_21 = run(&control, &mut w, &pool, &flood(n), 21).len() as u64;
    assert_eq!(at_21, REFUSALS_PER_S * 20 / 1000);
    // Long quiet: never more than the burst.
    let at_10s = run(&control, &mut w, &pool, &flood(n), 10_021).len() as u64;
    assert_eq!(at_10s, REFUSAL_BURST);
    let sent = at_1 + at_21 + at_10s;
    assert!(sent <= REFUSAL_BURST + REFUSALS_PER_S * 10_020 / 1000);
    let c = &w.counters;
    assert_eq!(c.refused_tcp_rst, sent);
    assert_eq!(c.refusal_rate_limited, 3 * u64::from(n) - sent);
    assert_eq!(c.drops_for(DropReason::VipPortNotServed), 3 * u64::from(n));
    assert_eq!(c.rx, c.tx + c.dropped());
}

/// Served ports are forwarded as before, beside the refusals.
#[test]
fn served_ports_are_still_forwarded() {
    let (control, mut w, pool) = setup();
    let ok = tcp(v4("198.51.100.7", "192.0.2.80"), 80, "S", 1, 0, b"");
    let out = run(&control, &mut w, &pool, &[ok], 1);
    assert_eq!(out.len(), 1);
    assert!(packet::gre::decapsulate(&out[0]).is_ok());
    assert_eq!(w.counters.tx, 1);
    assert_eq!(w.counters.refused_tcp_rst, 0);
}
