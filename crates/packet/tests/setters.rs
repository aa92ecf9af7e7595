//! Setters round-trip: a field written with a view's setter reads back the
//! same through the view's getter and through etherparse (an implementation
//! we did not write), and checksums filled in by the views verify with
//! etherparse's own computation.

use std::net::IpAddr;

use packet::build::Frame;
use packet::checksum::{pseudo_v4, pseudo_v6};
use packet::ethernet::{self, EthernetFrame};
use packet::gre::{self, GrePacket};
use packet::icmp::IcmpPacket;
use packet::ipv4::{self, Ipv4Packet};
use packet::ipv6::{self, Ipv6Packet};
use packet::tcp::TcpPacket;
use packet::udp::UdpPacket;
use packet::{ethertype, parse_frame, proto};
use proptest::prelude::*;

fn v4_pair() -> (IpAddr, IpAddr) {
    (
        "192.0.2.7".parse().unwrap(),
        "198.51.100.9".parse().unwrap(),
    )
}

fn v6_pair() -> (IpAddr, IpAddr) {
    (
        "2001:db8::7".parse().unwrap(),
        "2001:db8:1::9".parse().unwrap(),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn ethernet_setters(dst in any::<[u8; 6]>(), src in any::<[u8; 6]>(), et in any::<u16>(),
                        tagged in any::<bool>(), tci in any::<u16>()) {
        prop_assume!(et != ethertype::VLAN);
        let (s, d) = v4_pair();
        let mut f = Frame::udp(s, d, 1, 2, b"x");
        f.eth.vlan = tagged.then_some(0);
        let mut b = f.to_bytes();
        let mut v = EthernetFrame::new_checked(&mut b[..]).unwrap();
        v.set_dst(dst);
        v.set_src(src);
        prop_assert_eq!(v.set_vlan_tci(tci), tagged);
        v.set_ethertype(et);
        prop_assert_eq!((v.dst(), v.src(), v.ethertype()), (dst, src, et));
        prop_assert_eq!(v.vlan_tci(), tagged.then_some(tci));

        let e = etherparse::Ethernet2HeaderSlice::from_slice(&b).unwrap();
        prop_assert_eq!((e.destination(), e.source()), (dst, src));
        if tagged {
            prop_assert_eq!(e.ether_type().0, ethertype::VLAN);
            let t = etherparse::SingleVlanHeaderSlice::from_slice(&b[ethernet::HEADER_LEN..]).unwrap();
            let their_tci = (u16::from(t.priority_code_point().value()) << 13)
                | (u16::from(t.drop_eligible_indicator()) << 12)
                | t.vlan_identifier().value();
            prop_assert_eq!(their_tci, tci);
            prop_assert_eq!(t.ether_type().0, et);
        } else {
            prop_assert_eq!(e.ether_type().0, et);
        }
    }

    #[test]
    fn ipv4_setters(src in any::<[u8; 4]>(), dst in any::<[u8; 4]>(), tos in any::<u8>(), ident in any::<u16>(),
                    df in any::<bool>(), mf in any::<bool>(), off in 0u16..8000, ttl in any::<u8>(),
                    protocol in any::<u8>(), opt_words in 0usize..=10, opt in any::<u8>(),
                    payload in prop::collection::vec(any::<u8>(), 0..100), cut in any::<prop::sample::Index>()) {
        let (s, d) = v4_pair();
        let mut f = Frame::udp(s, d, 1, 2, &payload);
        if let packet::build::Ip::V4(r) = &mut f.ip {
            r.options = vec![0; opt_words * 4];
        }
        let frame = f.to_bytes();
        let mut b = frame[ethernet::HEADER_LEN..].to_vec();
        let mut p = Ipv4Packet::new_checked(&mut b[..]).unwrap();
        let hl = p.header_len();
        // A total length anywhere from the bare header to the whole buffer.
        let total = hl + cut.index(p.total_len() - hl + 1);
        p.set_version(4);
        p.set_header_len(hl);
        p.set_total_len(total as u16);
        p.set_tos(tos);
        p.set_ident(ident);
        p.set_dont_frag(df);
        p.set_more_frags(mf);
        p.set_frag_offset(off << 3);
        p.set_ttl(ttl);
        p.set_protocol(protocol);
        p.set_src(src);
        p.set_dst(dst);
        p.options_mut().fill(opt);
        p.fill_checksum();
        prop_assert_eq!((p.version(), p.header_len(), p.total_len()), (4, hl, total));
        prop_assert_eq!((p.tos(), p.ident(), p.ttl(), p.protocol()), (tos, ident, ttl, protocol));
        prop_assert_eq!((p.dont_frag(), p.more_frags(), p.frag_offset()), (df, mf, off << 3));
        prop_assert_eq!((p.src(), p.dst()), (src, dst));
        prop_assert!(p.options().iter().all(|&o| o == opt));
        prop_assert_eq!(p.payload().len(), total - hl);
        prop_assert!(p.checksum_ok());
        let p = Ipv4Packet::new_checked(p.into_inner()).unwrap();
        prop_assert!(p.checksum_ok());

        let e = etherparse::Ipv4HeaderSlice::from_slice(&b).unwrap();
        prop_assert_eq!(usize::from(e.ihl()) * 4, hl);
        prop_assert_eq!(usize::from(e.total_len()), total);
        prop_assert_eq!((e.dcp().value() << 2) | e.ecn().value(), tos);
        prop_assert_eq!(e.identification(), ident);
        prop_assert_eq!((e.dont_fragment(), e.more_fragments()), (df, mf));
        prop_assert_eq!(e.fragments_offset().value(), off);
        prop_assert_eq!((e.ttl(), e.protocol().0), (ttl, protocol));
        prop_assert_eq!((e.source(), e.destination()), (src, dst));
        prop_assert!(e.options().iter().all(|&o| o == opt));
        prop_assert_eq!(e.header_checksum(), e.to_header().calc_header_checksum());
    }

    #[test]
    fn ipv6_setters(src in any::<[u8; 16]>(), dst in any::<[u8; 16]>(), tc in any::<u8>(), label in any::<u32>(),
                    hop in any::<u8>(), next in any::<u8>(), payload in prop::collection::vec(any::<u8>(), 0..100),
                    cut in any::<prop::sample::Index>()) {
        let (s, d) = v6_pair();
        let frame = Frame::udp(s, d, 1, 2, &payload).to_bytes();
        let mut b = frame[ethernet::HEADER_LEN..].to_vec();
        let mut p = Ipv6Packet::new_checked(&mut b[..]).unwrap();
        let len = cut.index(p.payload_len() + 1);
        p.set_version(6);
        p.set_traffic_class(tc);
        p.set_flow_label(label);
        p.set_payload_len(len as u16);
        p.set_next_header(next);
        p.set_hop_limit(hop);
        p.set_src(src);
        p.set_dst(dst);
        prop_assert_eq!((p.version(), p.traffic_class(), p.flow_label()), (6, tc, label & 0x000f_ffff));
        prop_assert_eq!((p.payload_len(), p.next_header(), p.hop_limit()), (len, next, hop));
        prop_assert_eq!((p.src(), p.dst()), (src, dst));
        prop_assert_eq!(p.payload().len(), len);
        prop_assert!(Ipv6Packet::new_checked(p.into_inner()).is_ok());

        let e = etherparse::Ipv6HeaderSlice::from_slice(&b).unwrap();
        prop_assert_eq!((e.traffic_class(), e.flow_label().value()), (tc, label & 0x000f_ffff));
        prop_assert_eq!(usize::from(e.payload_length()), len);
        prop_assert_eq!((e.next_header().0, e.hop_limit()), (next, hop));
        prop_assert_eq!((e.source(), e.destination()), (src, dst));
        prop_assert_eq!(b.len(), ipv6::HEADER_LEN + payload.len() + 8);
    }

    #[test]
    fn tcp_setters(v6 in any::<bool>(), sport in any::<u16>(), dport in any::<u16>(), seq in any::<u32>(), ack in any::<u32>(),
                   flags in any::<u8>(), window in any::<u16>(), urgent in any::<u16>(), opt in any::<u8>(),
                   payload in prop::collection::vec(any::<u8>(), 0..100)) {
        let (s, d) = if v6 { v6_pair() } else { v4_pair() };
        let mut f = Frame::tcp(s, d, 1, 2, 0, &payload);
        if let packet::build::L4::Tcp(t) = &mut f.l4 {
            t.options = vec![0; 8];
        }
        let mut b = f.to_bytes();
        let at = parse_frame(&b).unwrap().l4_offset;
        let len = b.len() - at;
        let (sa, da) = (packet::flow::from_ip(s), packet::flow::from_ip(d));
        let pseudo = match (packet::flow::unmapped(&sa), packet::flow::unmapped(&da)) {
            (Some(s4), Some(d4)) => pseudo_v4(s4, d4, proto::TCP, len as u16),
            _ => pseudo_v6(sa, da, proto::TCP, len as u32),
        };
        let mut t = TcpPacket::new_checked(&mut b[at..]).unwrap();
        let hl = t.header_len();
        t.set_header_len(hl);
        t.set_src_port(sport);
        t.set_dst_port(dport);
        t.set_seq(seq);
        t.set_ack(ack);
        t.set_flags(flags);
        t.set_window(window);
        t.set_urgent(urgent);
        t.options_mut().fill(opt);
        t.payload_mut().reverse();
        t.fill_checksum(pseudo);
        prop_assert_eq!((t.src_port(), t.dst_port(), t.seq(), t.ack()), (sport, dport, seq, ack));
        prop_assert_eq!((t.header_len(), t.flags(), t.window(), t.urgent()), (hl, flags, window, urgent));
        prop_assert!(t.options().iter().all(|&o| o == opt));
        let mut reversed = payload.clone();
        reversed.reverse();
        prop_assert_eq!(t.payload(), &reversed[..]);
        prop_assert!(t.checksum_ok(pseudo));
        let sum = t.checksum();

        let e = etherparse::TcpHeaderSlice::from_slice(&b[at..]).unwrap();
        prop_assert_eq!((e.source_port(), e.destination_port()), (sport, dport));
        prop_assert_eq!((e.sequence_number(), e.acknowledgment_number()), (seq, ack));
        prop_assert_eq!(usize::from(e.data_offset()) * 4, hl);
        let their_flags = [e.fin(), e.syn(), e.rst(), e.psh(), e.ack(), e.urg(), e.ece(), e.cwr()]
            .iter()
            .enumerate()
            .fold(0u8, |acc, (i, &on)| acc | (u8::from(on) << i));
        prop_assert_eq!(their_flags, flags);
        prop_assert_eq!((e.window_size(), e.urgent_pointer(), e.checksum()), (window, urgent, sum));
        let body = &b[at + hl..];
        let theirs = match (packet::flow::unmapped(&sa), packet::flow::unmapped(&da)) {
            (Some(s4), Some(d4)) => e.calc_checksum_ipv4_raw(s4, d4, body).unwrap(),
            _ => e.calc_checksum_ipv6_raw(sa, da, body).unwrap(),
        };
        prop_assert_eq!(theirs, sum);
        // The whole frame still parses, with the new ports.
        let p = parse_frame(&b).unwrap();
        prop_assert_eq!((p.flow.src_port, p.flow.dst_port, p.tcp_flags), (sport, dport, flags));
    }

    #[test]
    fn udp_setters(v6 in any::<bool>(), sport in any::<u16>(), dport in any::<u16>(),
                   payload in prop::collection::vec(any::<u8>(), 0..100)) {
        let (s, d) = if v6 { v6_pair() } else { v4_pair() };
        let mut b = Frame::udp(s, d, 1, 2, &payload).to_bytes();
        let at = parse_frame(&b).unwrap().l4_offset;
        let len = b.len() - at;
        let (sa, da) = (packet::flow::from_ip(s), packet::flow::from_ip(d));
        let pseudo = match (packet::flow::unmapped(&sa), packet::flow::unmapped(&da)) {
            (Some(s4), Some(d4)) => pseudo_v4(s4, d4, proto::UDP, len as u16),
            _ => pseudo_v6(sa, da, proto::UDP, len as u32),
        };
        let mut u = UdpPacket::new_checked(&mut b[at..]).unwrap();
        u.set_src_port(sport);
        u.set_dst_port(dport);
        u.set_len(len as u16);
        u.payload_mut().reverse();
        u.fill_checksum(pseudo);
        prop_assert_eq!((u.src_port(), u.dst_port(), u.len_field()), (sport, dport, len));
        let mut reversed = payload.clone();
        reversed.reverse();
        prop_assert_eq!(u.payload(), &reversed[..]);
        let sum = u.checksum();
        prop_assert_ne!(sum, 0);

        let e = etherparse::UdpHeaderSlice::from_slice(&b[at..]).unwrap();
        prop_assert_eq!((e.source_port(), e.destination_port()), (sport, dport));
        prop_assert_eq!((usize::from(e.length()), e.checksum()), (len, sum));
        let body = &b[at + packet::udp::HEADER_LEN..];
        let h = e.to_header();
        let theirs = match (packet::flow::unmapped(&sa), packet::flow::unmapped(&da)) {
            (Some(s4), Some(d4)) => h.calc_checksum_ipv4_raw(s4, d4, body).unwrap(),
            _ => h.calc_checksum_ipv6_raw(sa, da, body).unwrap(),
        };
        prop_assert_eq!(theirs, sum);
        let p = parse_frame(&b).unwrap();
        prop_assert_eq!((p.flow.src_port, p.flow.dst_port), (sport, dport));
    }

    #[test]
    fn icmp_setters(kind in any::<u8>(), code in any::<u8>(), rest in any::<u32>(), echo in any::<Option<(u16, u16)>>(),
                    payload in prop::collection::vec(any::<u8>(), 0..100)) {
        let (s, d) = v4_pair();
        let mut b = Frame::icmp(s, d, 0, 0, 0, &payload).to_bytes();
        let at = parse_frame(&b).unwrap().l4_offset;
        let mut m = IcmpPacket::new_checked(&mut b[at..]).unwrap();
        m.set_kind(kind);
        m.set_code(code);
        m.set_rest(rest);
        let rest = match echo {
            Some((ident, seq_no)) => {
                m.set_echo_ident(ident);
                m.set_echo_seq_no(seq_no);
                prop_assert_eq!((m.echo_ident(), m.echo_seq_no()), (ident, seq_no));
                (u32::from(ident) << 16) | u32::from(seq_no)
            }
            None => rest,
        };
        m.fill_checksum(0);
        prop_assert_eq!((m.kind(), m.code(), m.rest()), (kind, code, rest));
        prop_assert_eq!(m.payload(), &payload[..]);
        prop_assert!(m.checksum_ok(0));
        let sum = m.checksum();

        let e = etherparse::Icmpv4Slice::from_slice(&b[at..]).unwrap();
        prop_assert_eq!((e.type_u8(), e.code_u8(), e.checksum()), (kind, code, sum));
        prop_assert_eq!(e.bytes5to8(), rest.to_be_bytes());
        prop_assert_eq!(packet::checksum::checksum(&b[at..]), 0);
    }

    #[test]
    fn gre_setters(protocol in any::<u16>(), key in any::<bool>(), seq in any::<bool>(), csum in any::<bool>(),
                   payload in prop::collection::vec(any::<u8>(), 0..40)) {
        let mut b = vec![0u8; gre::HEADER_LEN + 12];
        b.extend_from_slice(&payload);
        let flags = if key { gre::flags::KEY } else { 0 }
            | if seq { gre::flags::SEQUENCE } else { 0 }
            | if csum { gre::flags::CHECKSUM } else { 0 };
        let mut g = GrePacket::new_checked(&mut b[..]).unwrap();
        g.set_flags(flags);
        g.set_protocol(protocol);
        let g = GrePacket::new_checked(g.into_inner()).unwrap();
        prop_assert_eq!((g.flags(), g.protocol()), (flags, protocol));
        let optional = 4 * (usize::from(key) + usize::from(seq) + usize::from(csum));
        prop_assert_eq!(g.header_len(), gre::HEADER_LEN + optional);
        prop_assert_eq!(g.payload().len(), 12 - optional + payload.len());
        // Routing and versions other than 0 are refused.
        for bad in [gre::flags::ROUTING, 1] {
            let mut b = b.clone();
            GrePacket::new_checked(&mut b[..]).unwrap().set_flags(bad);
            prop_assert!(GrePacket::new_checked(&b[..]).is_err());
        }
    }

    #[test]
    fn gre_repr_reads_back(protocol in any::<u16>(), key in any::<Option<u32>>(),
                           payload in prop::collection::vec(any::<u8>(), 0..40)) {
        let repr = gre::GreRepr { protocol, key };
        // Whatever the buffer held before, the header written is exactly
        // the one asked for.
        let mut b = vec![0xffu8; repr.header_len()];
        b.extend_from_slice(&payload);
        repr.emit(&mut b);
        let g = GrePacket::new_checked(&b[..]).unwrap();
        prop_assert_eq!((g.protocol(), g.key()), (protocol, key));
        prop_assert_eq!(g.header_len(), repr.header_len());
        prop_assert_eq!(g.payload(), &payload[..]);
    }
}

/// A checked IPv4 view whose total length is set beyond its buffer is
/// refused when checked again, instead of reading past the end.
#[test]
fn length_setters_are_rechecked() {
    let (s, d) = v4_pair();
    let good = Frame::udp(s, d, 1, 2, b"abc").to_bytes()[ethernet::HEADER_LEN..].to_vec();
    let mut b = good.clone();
    let mut p = Ipv4Packet::new_checked(&mut b[..]).unwrap();
    p.set_total_len(1000);
    assert_eq!(
        Ipv4Packet::new_checked(p.into_inner()).unwrap_err().0,
        packet::Reason::Ipv4BadTotalLength
    );
    let mut b = good.clone();
    let mut p = Ipv4Packet::new_checked(&mut b[..]).unwrap();
    p.set_header_len(ipv4::MAX_HEADER_LEN);
    assert_eq!(
        Ipv4Packet::new_checked(p.into_inner()).unwrap_err().0,
        packet::Reason::Ipv4BadHeaderLength
    );
    // Adding a tag is not something a view in place can do.
    let mut e = Frame::udp(s, d, 1, 2, b"abc").to_bytes();
    assert!(!EthernetFrame::new_checked(&mut e[..])
        .unwrap()
        .set_vlan_tci(5));
}
