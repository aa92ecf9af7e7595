//! Emit-then-parse round trips, robustness on arbitrary bytes, and
//! cross-checks against etherparse (an implementation we did not write).

use std::net::IpAddr;

use packet::build::{Frame, Ip, L4};
use packet::ethernet::{EthernetFrame, EthernetRepr};
use packet::gre::{decapsulate, encapsulate, encapsulate_keyed, Outer};
use packet::icmp::{IcmpPacket, IcmpRepr};
use packet::ipv4::{Ipv4Packet, Ipv4Repr};
use packet::ipv6::{Extension, Fragment, Ipv6Packet, Ipv6Repr};
use packet::tcp::{TcpPacket, TcpRepr};
use packet::udp::{UdpPacket, UdpRepr};
use packet::{flow, parse_frame, proto, Reason};
use proptest::prelude::*;

fn ipv4_repr() -> impl Strategy<Value = Ipv4Repr> {
    (
        any::<[u8; 4]>(),
        any::<[u8; 4]>(),
        any::<u8>(),
        any::<u8>(),
        any::<u8>(),
        any::<u16>(),
        any::<(bool, bool)>(),
        0u16..8000,
        prop::collection::vec(any::<u8>(), 0..=10),
        0usize..1400,
    )
        .prop_map(
            |(src, dst, protocol, ttl, tos, ident, (df, mf), off, opt_words, payload_len)| {
                let options: Vec<u8> = opt_words.iter().flat_map(|&w| [w; 4]).collect();
                Ipv4Repr {
                    src,
                    dst,
                    protocol,
                    ttl,
                    tos,
                    ident,
                    dont_frag: df,
                    more_frags: mf,
                    frag_offset: off << 3,
                    options,
                    payload_len,
                }
            },
        )
}

fn extension() -> impl Strategy<Value = Extension> {
    prop_oneof![
        (0usize..3, any::<u8>()).prop_map(|(k, b)| Extension::HopByHop(vec![b; 6 + 8 * k])),
        (0usize..3, any::<u8>())
            .prop_map(|(k, b)| Extension::DestinationOptions(vec![b; 6 + 8 * k])),
        (0usize..3, any::<u8>()).prop_map(|(k, b)| Extension::Routing(vec![b; 6 + 8 * k])),
        (0usize..3, any::<u8>()).prop_map(|(k, b)| Extension::Authentication(vec![b; 10 + 4 * k])),
        (any::<u32>(), any::<bool>()).prop_map(|(ident, more)| Extension::Fragment(Fragment {
            offset: 0,
            more,
            ident
        })),
    ]
}

fn ipv6_repr() -> impl Strategy<Value = Ipv6Repr> {
    (
        any::<[u8; 16]>(),
        any::<[u8; 16]>(),
        any::<u8>(),
        0u32..(1 << 20),
        any::<u8>(),
        prop::collection::vec(extension(), 0..4),
        prop_oneof![
            Just(proto::TCP),
            Just(proto::UDP),
            Just(proto::ICMPV6),
            Just(proto::GRE)
        ],
        0usize..1400,
    )
        .prop_map(
            |(src, dst, traffic_class, flow_label, hop_limit, extensions, protocol, upper_len)| {
                Ipv6Repr {
                    src,
                    dst,
                    traffic_class,
                    flow_label,
                    hop_limit,
                    extensions,
                    protocol,
                    upper_len,
                }
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn ethernet_round_trip(dst in any::<[u8; 6]>(), src in any::<[u8; 6]>(), vlan in any::<Option<u16>>(), et in any::<u16>()) {
        prop_assume!(et != packet::ethertype::VLAN);
        let r = EthernetRepr { dst, src, vlan, ethertype: et };
        let mut b = vec![0u8; r.header_len()];
        r.emit(&mut b);
        prop_assert_eq!(EthernetRepr::parse(&EthernetFrame::new_checked(&b[..]).unwrap()), r);
    }

    #[test]
    fn ipv4_round_trip(r in ipv4_repr()) {
        prop_assume!(usize::from(r.frag_offset) + r.payload_len <= 65_535);
        let mut b = vec![0u8; r.header_len() + r.payload_len];
        r.emit(&mut b);
        let p = Ipv4Packet::new_checked(&b[..]).unwrap();
        prop_assert!(p.checksum_ok());
        prop_assert_eq!(Ipv4Repr::parse(&p), r);
    }

    /// The emitted header as etherparse reads it: every field, and the
    /// checksum etherparse computes over the same bytes.
    #[test]
    fn ipv4_emit_matches_etherparse(r in ipv4_repr()) {
        let mut b = vec![0u8; r.header_len()];
        r.emit(&mut b);
        let h = etherparse::Ipv4HeaderSlice::from_slice(&b).unwrap().to_header();
        prop_assert_eq!(h.source, r.src);
        prop_assert_eq!(h.destination, r.dst);
        prop_assert_eq!(h.protocol.0, r.protocol);
        prop_assert_eq!(h.time_to_live, r.ttl);
        prop_assert_eq!(h.identification, r.ident);
        prop_assert_eq!((h.dont_fragment, h.more_fragments), (r.dont_frag, r.more_frags));
        prop_assert_eq!(h.fragment_offset.value(), r.frag_offset >> 3);
        prop_assert_eq!(usize::from(h.total_len), r.header_len() + r.payload_len);
        prop_assert_eq!(h.options.as_slice(), &r.options[..]);
        prop_assert_eq!((h.dscp.value() << 2) | h.ecn.value(), r.tos);
        prop_assert_eq!(h.header_checksum, h.calc_header_checksum());
    }

    #[test]
    fn ipv6_round_trip(r in ipv6_repr()) {
        let mut b = vec![0u8; r.header_len() + r.upper_len];
        r.emit(&mut b);
        let p = Ipv6Packet::new_checked(&b[..]).unwrap();
        prop_assert_eq!(Ipv6Repr::parse(&p).unwrap(), r);
    }

    #[test]
    fn transport_round_trips(
        sport in any::<u16>(), dport in any::<u16>(), seq in any::<u32>(), flags in any::<u8>(),
        opt_words in 0usize..=10, payload in prop::collection::vec(any::<u8>(), 0..300),
        kind in any::<u8>(), rest in any::<u32>(),
    ) {
        let pseudo = packet::checksum::pseudo_v4([10, 0, 0, 1], [10, 0, 0, 2], 6, 0);
        let t = TcpRepr { src_port: sport, dst_port: dport, seq, ack: !seq, flags, window: 7, urgent: 9,
            options: vec![1; opt_words * 4], payload: payload.clone() };
        let mut b = vec![0u8; t.buffer_len()];
        t.emit(&mut b, pseudo);
        let p = TcpPacket::new_checked(&b[..]).unwrap();
        prop_assert!(p.checksum_ok(pseudo));
        prop_assert_eq!(TcpRepr::parse(&p), t);

        let u = UdpRepr { src_port: sport, dst_port: dport, payload: payload.clone() };
        let mut b = vec![0u8; u.buffer_len()];
        u.emit(&mut b, pseudo);
        prop_assert_eq!(UdpRepr::parse(&UdpPacket::new_checked(&b[..]).unwrap()), u);

        let i = IcmpRepr { kind, code: flags, rest, payload };
        let mut b = vec![0u8; i.buffer_len()];
        i.emit(&mut b, 0);
        prop_assert_eq!(packet::checksum::checksum(&b), 0);
        prop_assert_eq!(IcmpRepr::parse(&IcmpPacket::new_checked(&b[..]).unwrap()), i);
    }

    /// Arbitrary bytes never panic the parser, with or without a valid
    /// Ethernet/IP prefix to get past the first checks.
    #[test]
    fn parse_never_panics(mut bytes in prop::collection::vec(any::<u8>(), 0..200), prefix in 0u8..3) {
        match prefix {
            1 if bytes.len() > 14 => { bytes[12] = 0x08; bytes[13] = 0x00; bytes[14] = 0x45; }
            2 if bytes.len() > 14 => { bytes[12] = 0x86; bytes[13] = 0xdd; bytes[14] = 0x60; }
            _ => {}
        }
        let _ = parse_frame(&bytes);
        let _ = packet::parse::steer_flow(&bytes);
        let _ = decapsulate(&bytes);
    }

    /// Valid frames, truncated or with one byte changed, never panic; when
    /// they still parse, the result is within the frame.
    #[test]
    fn mutated_frames_never_panic(cut in 0usize..200, at in 0usize..200, val in any::<u8>(), v6 in any::<bool>(), kind in 0u8..4) {
        let (s, d): (IpAddr, IpAddr) = if v6 {
            ("2001:db8::1".parse().unwrap(), "2001:db8::2".parse().unwrap())
        } else {
            ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap())
        };
        let f = match kind {
            0 => Frame::tcp(s, d, 1, 2, 2, b"hello"),
            1 => Frame::udp(s, d, 1, 2, b"hello"),
            2 => Frame::icmp(s, d, if v6 { 2 } else { 3 }, 4, 1400, &Frame::tcp(d, s, 2, 1, 16, b"").to_bytes()[14..]),
            _ => Frame::udp(s, d, 1, 2, &[0; 40]).fragment(9, 0, true),
        };
        let mut b = f.to_bytes();
        if at < b.len() { b[at] = val; }
        b.truncate(cut.max(1));
        if let Ok(p) = parse_frame(&b) {
            prop_assert!(p.l3_offset + p.l3_len <= b.len());
            prop_assert!(p.l4_offset <= p.l3_offset + p.l3_len);
            // Where the steering shortcut answers for a valid packet, it
            // names the same flow as the full parse.
            if let Some(f) = packet::parse::steer_flow(&b) {
                if p.fragment.is_none() && p.icmp_quote.is_none() {
                    prop_assert_eq!(f, p.flow);
                }
            }
        }
        let _ = packet::parse::steer_flow(&b);
    }

    /// etherparse reads our frames the way we do.
    #[test]
    fn etherparse_agrees(sport in any::<u16>(), dport in any::<u16>(), v6 in any::<bool>(), udp in any::<bool>(),
                         payload in prop::collection::vec(any::<u8>(), 0..100), vlan in any::<Option<u16>>()) {
        let (s, d): (IpAddr, IpAddr) = if v6 {
            ("2001:db8::7".parse().unwrap(), "2001:db8:1::9".parse().unwrap())
        } else {
            ("192.0.2.7".parse().unwrap(), "198.51.100.9".parse().unwrap())
        };
        let mut f = if udp { Frame::udp(s, d, sport, dport, &payload) } else { Frame::tcp(s, d, sport, dport, 0x18, &payload) };
        f.eth.vlan = vlan.map(|v| v & 0x0fff);
        let b = f.to_bytes();
        let ours = parse_frame(&b).unwrap();
        let theirs = etherparse::SlicedPacket::from_ethernet(&b).unwrap();
        let (tsp, tdp) = match theirs.transport.unwrap() {
            etherparse::TransportSlice::Tcp(t) => (t.source_port(), t.destination_port()),
            etherparse::TransportSlice::Udp(u) => (u.source_port(), u.destination_port()),
            other => panic!("{other:?}"),
        };
        prop_assert_eq!((ours.flow.src_port, ours.flow.dst_port), (tsp, tdp));
        prop_assert_eq!(packet::parse::steer_flow(&b), Some(ours.flow));
        match theirs.net.unwrap() {
            etherparse::NetSlice::Ipv4(ip) => {
                prop_assert_eq!(flow::to_ip(&ours.flow.src), IpAddr::V4(ip.header().source_addr()));
                prop_assert_eq!(flow::to_ip(&ours.flow.dst), IpAddr::V4(ip.header().destination_addr()));
            }
            etherparse::NetSlice::Ipv6(ip) => {
                prop_assert_eq!(flow::to_ip(&ours.flow.src), IpAddr::V6(ip.header().source_addr()));
                prop_assert_eq!(flow::to_ip(&ours.flow.dst), IpAddr::V6(ip.header().destination_addr()));
            }
        }
        // Transport checksums verify with etherparse's own computation.
        let pkt = etherparse::PacketHeaders::from_ethernet_slice(&b).unwrap();
        let sum_ok = match (&pkt.net, &pkt.transport) {
            (Some(etherparse::NetHeaders::Ipv4(h, _)), Some(etherparse::TransportHeader::Udp(u))) => u.calc_checksum_ipv4(h, pkt.payload.slice()).unwrap() == u.checksum,
            (Some(etherparse::NetHeaders::Ipv6(h, _)), Some(etherparse::TransportHeader::Udp(u))) => u.calc_checksum_ipv6(h, pkt.payload.slice()).unwrap() == u.checksum,
            (Some(etherparse::NetHeaders::Ipv4(h, _)), Some(etherparse::TransportHeader::Tcp(t))) => t.calc_checksum_ipv4(h, pkt.payload.slice()).unwrap() == t.checksum,
            (Some(etherparse::NetHeaders::Ipv6(h, _)), Some(etherparse::TransportHeader::Tcp(t))) => t.calc_checksum_ipv6(h, pkt.payload.slice()).unwrap() == t.checksum,
            _ => false,
        };
        prop_assert!(sum_ok);
    }

    /// GRE around v4/v6 in v4/v6: etherparse reads the outer headers, the
    /// inner packet comes back byte for byte, and lengths, TTL, DSCP and the
    /// protocol type are right.
    #[test]
    fn gre_encapsulation(inner_v6 in any::<bool>(), outer_v6 in any::<bool>(), tos in any::<u8>(), ttl in 1u8..255,
                         payload in prop::collection::vec(any::<u8>(), 0..200), headroom in 0usize..128) {
        let (s, d): (IpAddr, IpAddr) = if inner_v6 {
            ("2001:db8::1".parse().unwrap(), "2001:db8::80".parse().unwrap())
        } else {
            ("203.0.113.1".parse().unwrap(), "192.0.2.80".parse().unwrap())
        };
        let mut f = Frame::udp(s, d, 4000, 53, &payload);
        match &mut f.ip { Ip::V4(r) => r.tos = tos, Ip::V6(r) => r.traffic_class = tos }
        let frame = f.to_bytes();
        let p = parse_frame(&frame).unwrap();
        let inner = frame[p.l3_offset..p.l3_offset + p.l3_len].to_vec();
        let mut buf = vec![0u8; headroom];
        buf.extend_from_slice(&frame);
        buf.extend_from_slice(&[0xee; 6]); // link padding, dropped
        let (os, od): (IpAddr, IpAddr) = if outer_v6 {
            ("fd00::1".parse().unwrap(), "fd00::2".parse().unwrap())
        } else {
            ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap())
        };
        let outer = Outer { eth_src: [2, 0, 0, 0, 0, 9], eth_dst: [2, 0, 0, 0, 0, 10], src: flow::from_ip(os), dst: flow::from_ip(od), ttl };
        let need = packet::gre::overhead(!outer_v6);
        let res = encapsulate(&mut buf, headroom, &p, &outer, 0xabcdef);
        if headroom + p.l3_offset < need {
            prop_assert!(res.is_err());
            return Ok(());
        }
        let range = res.unwrap();
        let out = &buf[range];
        let h = etherparse::PacketHeaders::from_ethernet_slice(out).unwrap();
        match h.net.unwrap() {
            etherparse::NetHeaders::Ipv4(ip, _) => {
                prop_assert!(!outer_v6);
                prop_assert_eq!(ip.protocol, etherparse::IpNumber::GRE);
                prop_assert_eq!(ip.time_to_live, ttl);
                prop_assert_eq!((ip.dscp.value() << 2) | ip.ecn.value(), tos);
                prop_assert_eq!(usize::from(ip.total_len), 20 + 4 + inner.len());
                prop_assert_eq!(ip.header_checksum, ip.calc_header_checksum());
            }
            etherparse::NetHeaders::Ipv6(ip, _) => {
                prop_assert!(outer_v6);
                prop_assert_eq!(ip.next_header, etherparse::IpNumber::GRE);
                prop_assert_eq!(ip.hop_limit, ttl);
                prop_assert_eq!(ip.traffic_class, tos);
                prop_assert_eq!(usize::from(ip.payload_length), 4 + inner.len());
                prop_assert_eq!(ip.flow_label.value(), 0xbcdef);
            }
        }
        let dec = decapsulate(out).unwrap();
        prop_assert_eq!(&out[dec.inner.clone()], &inner[..]);
        prop_assert_eq!(dec.ethertype, if inner_v6 { 0x86dd } else { 0x0800 });
        prop_assert_eq!(dec.key, None);
    }

    /// GRE with a key (RFC 2890): etherparse reads the key we wrote, the
    /// lengths count its 4 bytes, decapsulation gives it back with the
    /// inner packet, and the inner packet parses in place as it did alone.
    #[test]
    fn gre_keyed_encapsulation(inner_v6 in any::<bool>(), outer_v6 in any::<bool>(), key in any::<u32>(),
                               payload in prop::collection::vec(any::<u8>(), 0..200), headroom in 0usize..128) {
        let (s, d): (IpAddr, IpAddr) = if inner_v6 {
            ("2001:db8::1".parse().unwrap(), "2001:db8::80".parse().unwrap())
        } else {
            ("203.0.113.1".parse().unwrap(), "192.0.2.80".parse().unwrap())
        };
        let frame = Frame::udp(s, d, 4000, 53, &payload).to_bytes();
        let p = parse_frame(&frame).unwrap();
        let inner = frame[p.l3_offset..p.l3_offset + p.l3_len].to_vec();
        let mut buf = vec![0u8; headroom];
        buf.extend_from_slice(&frame);
        let (os, od): (IpAddr, IpAddr) = if outer_v6 {
            ("fd00::1".parse().unwrap(), "fd00::2".parse().unwrap())
        } else {
            ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap())
        };
        let outer = Outer { eth_src: [2, 0, 0, 0, 0, 9], eth_dst: [2, 0, 0, 0, 0, 10], src: flow::from_ip(os), dst: flow::from_ip(od), ttl: 64 };
        let need = packet::gre::overhead_keyed(!outer_v6);
        prop_assert_eq!(need, packet::gre::overhead(!outer_v6) + 4);
        let res = encapsulate_keyed(&mut buf, headroom, &p, &outer, 1, Some(key));
        if headroom + p.l3_offset < need {
            prop_assert!(res.is_err());
            return Ok(());
        }
        let range = res.unwrap();
        let out = &buf[range];
        let h = etherparse::PacketHeaders::from_ethernet_slice(out).unwrap();
        let gre_at = match h.net.unwrap() {
            etherparse::NetHeaders::Ipv4(ip, _) => {
                prop_assert_eq!(usize::from(ip.total_len), 20 + 8 + inner.len());
                prop_assert_eq!(ip.header_checksum, ip.calc_header_checksum());
                14 + 20
            }
            etherparse::NetHeaders::Ipv6(ip, _) => {
                prop_assert_eq!(usize::from(ip.payload_length), 8 + inner.len());
                14 + 40
            }
        };
        // Flags: key present, nothing else, version 0; then the key.
        prop_assert_eq!(&out[gre_at..gre_at + 2], &[0x20, 0][..]);
        prop_assert_eq!(&out[gre_at + 4..gre_at + 8], &key.to_be_bytes()[..]);
        let dec = decapsulate(out).unwrap();
        prop_assert_eq!(dec.key, Some(key));
        prop_assert_eq!(&out[dec.inner.clone()], &inner[..]);
        let again = packet::parse::parse_packet(out, dec.inner.start, dec.ethertype).unwrap();
        prop_assert_eq!(again.flow, p.flow);
        prop_assert_eq!(again.l3_offset, dec.inner.start);
    }
}

#[test]
fn malformed_inputs_name_their_reason() {
    let s: IpAddr = "10.0.0.1".parse().unwrap();
    let d: IpAddr = "10.0.0.2".parse().unwrap();
    let good = Frame::tcp(s, d, 1, 80, 2, b"").to_bytes();
    let check = |b: &[u8], r: Reason| assert_eq!(parse_frame(b).unwrap_err().0, r, "{b:?}");
    check(&good[..10], Reason::EthernetTruncated);
    check(&good[..20], Reason::Ipv4Truncated);
    let mut b = good.clone();
    b[24] ^= 0xff; // TTL changed, checksum now wrong
    check(&b, Reason::Ipv4BadChecksum);
    check(&good[..40], Reason::Ipv4BadTotalLength);
    let mut b = good.clone();
    b[12] = 0x08;
    b[13] = 0x06;
    check(&b, Reason::NotIp);
    // A TCP header with a data offset of 4 words.
    let mut f = Frame::tcp(s, d, 1, 80, 2, b"");
    if let L4::Tcp(t) = &mut f.l4 {
        t.options.clear();
    }
    let mut b = f.to_bytes();
    b[14 + 20 + 12] = 0x40;
    check(&b, Reason::TcpBadDataOffset);
    // UDP length longer than the datagram.
    let mut b = Frame::udp(s, d, 1, 53, b"abcd").to_bytes();
    b[14 + 20 + 5] = 200;
    check(&b, Reason::UdpBadLength);
    // ICMP frag-needed whose quote is cut inside the IP header.
    let b = Frame::icmp(s, d, 3, 4, 1400, &[0x45, 0, 0, 0]).to_bytes();
    check(&b, Reason::IcmpBadQuote);
}

#[test]
fn fragments_and_quotes() {
    let s: IpAddr = "10.0.0.1".parse().unwrap();
    let d: IpAddr = "10.0.0.2".parse().unwrap();
    for (src, dst) in [
        (s, d),
        (
            "2001:db8::1".parse().unwrap(),
            "2001:db8::2".parse().unwrap(),
        ),
    ] {
        // First fragment: ports present, UDP length covers the whole datagram.
        let mut f = Frame::udp(src, dst, 5000, 53, &[0; 64]).fragment(77, 0, true);
        if let L4::Udp(u) = &mut f.l4 {
            u.payload.truncate(16);
        }
        let mut b = f.to_bytes();
        // Make the UDP length claim 72 bytes, more than this fragment holds.
        let p = parse_frame(&b).unwrap();
        b[p.l4_offset + 5] = 72;
        let p = parse_frame(&b).unwrap();
        assert_eq!((p.flow.src_port, p.flow.dst_port), (5000, 53));
        assert_eq!(p.fragment.unwrap().ident, 77);
        // Non-first fragment: no ports.
        let b = Frame::new(src, dst, L4::Raw(proto::UDP, vec![1; 48]))
            .fragment(77, 24, false)
            .to_bytes();
        let p = parse_frame(&b).unwrap();
        assert_eq!(
            (p.flow.src_port, p.flow.dst_port, p.flow.proto),
            (0, 0, proto::UDP)
        );
        assert_eq!(p.fragment.unwrap().offset, 24);
    }
    // ICMP frag-needed from a router about VIP:80 -> client:5555 names the
    // client -> VIP flow.
    let vip: IpAddr = "192.0.2.80".parse().unwrap();
    let client: IpAddr = "203.0.113.9".parse().unwrap();
    let quoted = Frame::tcp(vip, client, 80, 5555, 0x10, &[0; 32]).to_bytes();
    let b = Frame::icmp(
        "198.51.100.1".parse().unwrap(),
        vip,
        3,
        4,
        1400,
        &quoted[14..14 + 28],
    )
    .to_bytes();
    let p = parse_frame(&b).unwrap();
    let q = p.icmp_quote.unwrap();
    assert_eq!(
        (
            flow::to_ip(&q.src),
            q.src_port,
            flow::to_ip(&q.dst),
            q.dst_port
        ),
        (client, 5555, vip, 80)
    );
}
