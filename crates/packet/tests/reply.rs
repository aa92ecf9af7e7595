//! Refusals (`packet::reply`) on arbitrary TCP and UDP frames, checked
//! with this crate's parser and with etherparse (an implementation we did
//! not write): the reply parses, its checksums verify, it goes back to the
//! sender from the address it used, a RST follows RFC 9293 section
//! 3.10.7.1 and an ICMP error quotes a prefix of the datagram, as long as
//! the minimum MTU allows (RFC 1812 section 4.3.2.3, RFC 4443 section 2.4).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use etherparse::{Icmpv4Type, Icmpv6Type, NetHeaders, PacketHeaders, TransportHeader};
use packet::build::{Frame, L4};
use packet::parse::L3;
use packet::reply::{refusal, Refusal, TTL, V4_MAX, V6_MAX};
use packet::tcp::flags;
use packet::{parse_frame, proto};
use proptest::prelude::*;

/// Unicast, non-martian addresses of both families: a client and a VIP.
fn addrs() -> impl Strategy<Value = (IpAddr, IpAddr)> {
    prop_oneof![
        (1u8..127, any::<[u8; 3]>(), 128u8..224, any::<[u8; 3]>()).prop_map(|(a, r, b, s)| (
            IpAddr::V4(Ipv4Addr::new(a, r[0], r[1], r[2])),
            IpAddr::V4(Ipv4Addr::new(b, s[0], s[1], s[2])),
        )),
        (any::<[u16; 7]>(), any::<[u16; 7]>()).prop_map(|(a, b)| {
            let v6 = |w: [u16; 7]| {
                IpAddr::V6(Ipv6Addr::new(
                    0x2001, w[0], w[1], w[2], w[3], w[4], w[5], w[6],
                ))
            };
            (v6(a), v6(b))
        }),
    ]
}

fn frame() -> impl Strategy<Value = (Vec<u8>, bool)> {
    (
        addrs(),
        any::<(u16, u16, u32, u32, u8)>(),
        prop::collection::vec(any::<u8>(), 0..1600),
        any::<bool>(),
        prop::option::of(0u16..4096),
    )
        .prop_map(|((src, dst), (sp, dp, seq, ack, fl), payload, tcp, vlan)| {
            let mut f = if tcp {
                let mut f = Frame::tcp(src, dst, sp, dp, fl, &payload);
                if let L4::Tcp(t) = &mut f.l4 {
                    t.seq = seq;
                    t.ack = ack;
                }
                f
            } else {
                Frame::udp(src, dst, sp, dp, &payload)
            };
            f.eth.vlan = vlan;
            (f.to_bytes(), tcp)
        })
}

proptest! {
    #[test]
    fn replies_parse_verify_and_answer_the_sender((f, tcp) in frame()) {
        let p = parse_frame(&f).unwrap();
        let mut out = Vec::new();
        let r = refusal(&f, &p, &mut out);
        prop_assert_eq!(packet::reply::kind(&f, &p), r);
        if tcp && p.tcp_flags & flags::RST != 0 {
            prop_assert_eq!(r, None);
            prop_assert!(out.is_empty());
            return Ok(());
        }
        let want = if tcp { Refusal::TcpReset } else { Refusal::PortUnreachable };
        prop_assert_eq!(r, Some(want));
        let q = parse_frame(&out).unwrap();
        // Back the way it came: MACs swapped, the VLAN tag kept.
        prop_assert_eq!(&out[..6], &f[6..12]);
        prop_assert_eq!(&out[6..12], &f[..6]);
        prop_assert_eq!(&out[12..q.l3_offset], &f[12..p.l3_offset]);
        prop_assert_eq!(q.l3_offset + q.l3_len, out.len(), "no padding");
        prop_assert_eq!((q.flow.src, q.flow.dst), (p.flow.dst, p.flow.src));
        prop_assert_eq!(q.ttl, TTL);
        prop_assert_eq!(q.fragment, None);

        let h = PacketHeaders::from_ethernet_slice(&out).unwrap();
        let payload = h.payload.slice();
        match (h.net.unwrap(), h.transport.unwrap()) {
            (NetHeaders::Ipv4(ip, _), t) => {
                prop_assert_eq!(ip.header_checksum, ip.calc_header_checksum());
                prop_assert!(usize::from(ip.total_len) <= V4_MAX || tcp);
                check_transport(&f, &p, t, payload, |t, pl| match t {
                    TransportHeader::Tcp(t) => t.calc_checksum_ipv4(&ip, pl).unwrap(),
                    TransportHeader::Icmpv4(i) => i.icmp_type.calc_checksum(pl),
                    _ => unreachable!(),
                })?;
            }
            (NetHeaders::Ipv6(ip, _), t) => {
                prop_assert!(40 + usize::from(ip.payload_length) <= V6_MAX);
                check_transport(&f, &p, t, payload, |t, pl| match t {
                    TransportHeader::Tcp(t) => t.calc_checksum_ipv6(&ip, pl).unwrap(),
                    TransportHeader::Icmpv6(i) => i
                        .icmp_type
                        .calc_checksum(ip.source, ip.destination, pl)
                        .unwrap(),
                    _ => unreachable!(),
                })?;
            }
        }
    }

    /// No bytes and no parse make it panic; a frame that is not TCP or
    /// UDP is never answered.
    #[test]
    fn arbitrary_frames_never_panic(f in prop::collection::vec(any::<u8>(), 0..200)) {
        if let Ok(p) = parse_frame(&f) {
            let r = refusal(&f, &p, &mut Vec::new());
            if p.flow.proto != proto::TCP && p.flow.proto != proto::UDP {
                prop_assert_eq!(r, None);
            }
        }
    }
}

/// The transport header of the reply against the frame it answers;
/// `sum` is etherparse's checksum of a header over its payload.
fn check_transport(
    f: &[u8],
    p: &packet::Parsed,
    t: TransportHeader,
    payload: &[u8],
    sum: impl Fn(&TransportHeader, &[u8]) -> u16,
) -> Result<(), TestCaseError> {
    let packet = &f[p.l3_offset..p.l3_offset + p.l3_len];
    let computed = sum(&t, payload);
    match &t {
        TransportHeader::Tcp(r) => {
            prop_assert_eq!(r.checksum, computed, "TCP checksum");
            prop_assert!(r.rst && payload.is_empty() && r.options.is_empty());
            prop_assert_eq!(
                (r.source_port, r.destination_port),
                (p.flow.dst_port, p.flow.src_port)
            );
            let seg = &f[p.l4_offset..p.l3_offset + p.l3_len];
            let seq = u32::from_be_bytes([seg[4], seg[5], seg[6], seg[7]]);
            let ack = u32::from_be_bytes([seg[8], seg[9], seg[10], seg[11]]);
            let data = seg.len() - usize::from(seg[12] >> 4) * 4;
            if p.tcp_flags & flags::ACK != 0 {
                prop_assert_eq!((r.sequence_number, r.ack), (ack, false));
            } else {
                let len = data as u32
                    + u32::from(p.tcp_flags & flags::SYN != 0)
                    + u32::from(p.tcp_flags & flags::FIN != 0);
                prop_assert_eq!(r.sequence_number, 0);
                prop_assert!(r.ack);
                prop_assert_eq!(r.acknowledgment_number, seq.wrapping_add(len));
            }
            prop_assert!(!r.syn && !r.fin && !r.psh);
        }
        TransportHeader::Icmpv4(i) => {
            prop_assert_eq!(p.l3, L3::V4);
            prop_assert_eq!(i.checksum, computed, "ICMP checksum");
            prop_assert!(matches!(
                i.icmp_type,
                Icmpv4Type::DestinationUnreachable(etherparse::icmpv4::DestUnreachableHeader::Port)
            ));
            // A prefix of the datagram, as long as 576 octets allow.
            prop_assert_eq!(payload.len(), packet.len().min(V4_MAX - 28));
            prop_assert_eq!(payload, &packet[..payload.len()]);
        }
        TransportHeader::Icmpv6(i) => {
            prop_assert_eq!(p.l3, L3::V6);
            prop_assert_eq!(i.checksum, computed, "ICMPv6 checksum");
            prop_assert!(matches!(
                i.icmp_type,
                Icmpv6Type::DestinationUnreachable(etherparse::icmpv6::DestUnreachableCode::Port)
            ));
            prop_assert_eq!(payload.len(), packet.len().min(V6_MAX - 48));
            prop_assert_eq!(payload, &packet[..payload.len()]);
        }
        TransportHeader::Udp(_) => prop_assert!(false, "a UDP reply"),
    }
    Ok(())
}
