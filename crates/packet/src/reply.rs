//! Refusals: what a host's stack answers a segment or datagram sent to a
//! port nobody listens on, so that the sender learns at once instead of
//! waiting out its timeout. Pure functions: a frame in, the reply frame out.
//!
//! - TCP (RFC 9293 section 3.10.7.1, the CLOSED state): a segment without
//!   RST is answered with a RST. If it has ACK, the RST is
//!   `<SEQ=SEG.ACK><CTL=RST>`; otherwise `<SEQ=0><ACK=SEG.SEQ+SEG.LEN>
//!   <CTL=RST,ACK>`, SYN and FIN each counting one in SEG.LEN.
//! - UDP: ICMP destination unreachable, port unreachable (type 3 code 3,
//!   RFC 792; RFC 1812 section 4.3.2.3 quotes as much of the datagram as
//!   keeps the ICMP packet within [`V4_MAX`] octets), or ICMPv6 destination
//!   unreachable, port unreachable (type 1 code 4, RFC 4443 section 3.1;
//!   quoting as much as fits in [`V6_MAX`] octets, section 2.4(c)).
//!
//! Nothing is answered that a host must not answer (RFC 1122 section
//! 3.2.2, RFC 4443 section 2.4(e)): a segment with RST, an ICMP message, a
//! frame sent to a link-layer group address (broadcast or multicast) or
//! from one, an IP multicast or broadcast destination, a martian source
//! ([`crate::flow::martian_source`]: multicast and broadcast sources
//! among them), anything but TCP or UDP, and a fragment: a non-first
//! fragment must never be answered, and a first one is not either, since
//! the whole datagram's length (the RST's acknowledgment) is not known
//! without reassembling it.
//!
//! The reply goes back the way the frame came: its Ethernet header with
//! the two addresses swapped (a VLAN tag kept), IP source the address the
//! sender used, IP destination the sender, TTL or hop limit [`TTL`].

use crate::checksum::{pseudo_v4, pseudo_v6};
use crate::flow::{martian_source, unmapped};
use crate::icmp::{self, IcmpPacket};
use crate::ipv4::{self, Ipv4Repr};
use crate::ipv6::{self, Ipv6Repr};
use crate::parse::{Parsed, L3};
use crate::tcp::{flags, TcpPacket, TcpRepr};
use crate::{ethernet, proto};

/// TTL (IPv4) or hop limit (IPv6) of a reply: the Linux default
/// (`net.ipv4.ip_default_ttl`), which RFC 1700 recommended.
pub const TTL: u8 = 64;
/// The largest ICMP error, IP header included (RFC 1812 section 4.3.2.3:
/// the minimum reassembly size every host takes, RFC 791).
pub const V4_MAX: usize = 576;
/// The largest ICMPv6 error, IPv6 header included (RFC 4443 section
/// 2.4(c): the IPv6 minimum MTU, RFC 8200 section 5).
pub const V6_MAX: usize = 1280;
/// ICMPv6 destination unreachable (RFC 4443 section 3.1).
pub const V6_DEST_UNREACHABLE: u8 = 1;
/// ICMPv6 destination unreachable code "port unreachable".
pub const V6_PORT_UNREACHABLE: u8 = 4;
/// ICMP destination unreachable code "port unreachable" (RFC 792).
pub const V4_PORT_UNREACHABLE: u8 = 3;
/// The TOS of an ICMP error: precedence 6, "internetwork control" (RFC
/// 1812 section 4.3.2.5), as Linux sends them.
pub const ICMP_TOS: u8 = 0xc0;

/// What a refused frame was answered with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// A TCP RST.
    TcpReset,
    /// An ICMP or ICMPv6 port unreachable.
    PortUnreachable,
}

/// Builds in `out` (cleared first) the reply a host sends for `frame`,
/// whose parse is `p` ([`crate::parse_frame`] of `frame`), when the
/// frame's destination port is not served; `None` (and `out` empty) when
/// such a frame must not be answered (see the module's list). Never
/// panics, even if `p` is not `frame`'s parse.
pub fn refusal(frame: &[u8], p: &Parsed, out: &mut Vec<u8>) -> Option<Refusal> {
    out.clear();
    let r = build(frame, p, out);
    if r.is_none() {
        out.clear();
    }
    r
}

/// What [`refusal`] would answer `frame` (parsed as `p`) with, from the
/// headers alone and without building anything: for a caller that counts
/// or rate-limits replies before it spends the work on one. `None` for a
/// frame that must not be answered; [`refusal`] may still give `None` for
/// a frame whose parse `p` is not.
pub fn kind(frame: &[u8], p: &Parsed) -> Option<Refusal> {
    if p.fragment.is_some() || !answerable(frame, p) {
        return None;
    }
    match p.flow.proto {
        proto::TCP if p.tcp_flags & flags::RST == 0 => Some(Refusal::TcpReset),
        proto::UDP => Some(Refusal::PortUnreachable),
        _ => None,
    }
}

fn build(frame: &[u8], p: &Parsed, out: &mut Vec<u8>) -> Option<Refusal> {
    kind(frame, p)?;
    let l3_end = p.l3_offset.checked_add(p.l3_len)?;
    let eth = frame.get(..p.l3_offset)?;
    let packet = frame.get(p.l3_offset..l3_end)?;
    if eth.len() < ethernet::HEADER_LEN || p.l4_offset < p.l3_offset {
        return None;
    }
    // The link header, back to the sender.
    out.extend_from_slice(&eth[6..12]);
    out.extend_from_slice(&eth[..6]);
    out.extend_from_slice(&eth[12..]);
    match p.flow.proto {
        proto::TCP => {
            let seg = TcpPacket::new_checked(frame.get(p.l4_offset..l3_end)?).ok()?;
            let f = seg.flags();
            if f & flags::RST != 0 {
                return None;
            }
            let rst = if f & flags::ACK != 0 {
                (seg.ack(), 0, flags::RST)
            } else {
                let len = seg.payload().len() as u32
                    + u32::from(f & flags::SYN != 0)
                    + u32::from(f & flags::FIN != 0);
                (0, seg.seq().wrapping_add(len), flags::RST | flags::ACK)
            };
            let t = TcpRepr {
                src_port: seg.dst_port(),
                dst_port: seg.src_port(),
                seq: rst.0,
                ack: rst.1,
                flags: rst.2,
                window: 0,
                urgent: 0,
                options: Vec::new(),
                payload: Vec::new(),
            };
            let l4_len = t.buffer_len();
            let pseudo = ip_header(p, proto::TCP, 0, l4_len, out)?;
            let at = out.len();
            out.resize(at + l4_len, 0);
            t.emit(&mut out[at..], pseudo);
            Some(Refusal::TcpReset)
        }
        proto::UDP => {
            let (room, kind, code, tos) = match p.l3 {
                L3::V4 => (
                    V4_MAX - ipv4::MIN_HEADER_LEN - icmp::HEADER_LEN,
                    icmp::V4_DEST_UNREACHABLE,
                    V4_PORT_UNREACHABLE,
                    ICMP_TOS,
                ),
                L3::V6 => (
                    V6_MAX - ipv6::HEADER_LEN - icmp::HEADER_LEN,
                    V6_DEST_UNREACHABLE,
                    V6_PORT_UNREACHABLE,
                    0,
                ),
            };
            let quote = &packet[..packet.len().min(room)];
            let l4_len = icmp::HEADER_LEN + quote.len();
            let protocol = match p.l3 {
                L3::V4 => proto::ICMP,
                L3::V6 => proto::ICMPV6,
            };
            let ip_pseudo = ip_header(p, protocol, tos, l4_len, out)?;
            let at = out.len();
            out.resize(at + l4_len, 0);
            let mut m = IcmpPacket::new_unchecked(&mut out[at..]);
            m.set_kind(kind);
            m.set_code(code);
            m.set_rest(0);
            m.payload_mut().copy_from_slice(quote);
            // ICMPv6's checksum covers the pseudo-header (RFC 4443 section
            // 2.3); ICMP's does not (RFC 792).
            m.fill_checksum(if p.l3 == L3::V6 { ip_pseudo } else { 0 });
            Some(Refusal::PortUnreachable)
        }
        _ => None,
    }
}

/// Whether a frame may be answered at all: not to or from a link-layer
/// group address, not to an IP multicast or broadcast address, not from a
/// martian source, TCP or UDP (never an ICMP error).
fn answerable(frame: &[u8], p: &Parsed) -> bool {
    const GROUP: u8 = 1; // the I/G bit of a MAC address's first octet
    let (Some(dst_mac), Some(src_mac)) = (frame.first(), frame.get(6)) else {
        return false;
    };
    let group_dst = match unmapped(&p.flow.dst) {
        // 224.0.0.0/4 multicast; 240.0.0.0/4 reserved, with the limited
        // broadcast 255.255.255.255.
        Some([a, ..]) if p.l3 == L3::V4 => a >= 224,
        Some(_) => false,
        None => p.flow.dst[0] == 0xff,
    };
    dst_mac & GROUP == 0
        && src_mac & GROUP == 0
        && !group_dst
        && !martian_source(&p.flow.src)
        && p.icmp_quote.is_none()
        && (p.flow.proto == proto::TCP || p.flow.proto == proto::UDP)
}

/// Appends to `out` the reply's IP header (VIP to sender) for `l4_len`
/// bytes of protocol `protocol`, and returns the pseudo-header sum.
fn ip_header(p: &Parsed, protocol: u8, tos: u8, l4_len: usize, out: &mut Vec<u8>) -> Option<u32> {
    let at = out.len();
    match p.l3 {
        L3::V4 => {
            let (vip, peer) = (unmapped(&p.flow.dst)?, unmapped(&p.flow.src)?);
            let ip = Ipv4Repr {
                src: vip,
                dst: peer,
                protocol,
                ttl: TTL,
                tos,
                // Atomic (DF, unfragmented): the identification is not
                // used (RFC 6864 section 4.1).
                ident: 0,
                dont_frag: true,
                more_frags: false,
                frag_offset: 0,
                options: Vec::new(),
                payload_len: l4_len,
            };
            out.resize(at + ip.header_len(), 0);
            ip.emit(&mut out[at..]);
            Some(pseudo_v4(vip, peer, protocol, l4_len as u16))
        }
        L3::V6 => {
            let ip = Ipv6Repr {
                src: p.flow.dst,
                dst: p.flow.src,
                traffic_class: 0,
                flow_label: 0,
                hop_limit: TTL,
                extensions: Vec::new(),
                protocol,
                upper_len: l4_len,
            };
            out.resize(at + ip.header_len(), 0);
            ip.emit(&mut out[at..]);
            Some(pseudo_v6(p.flow.dst, p.flow.src, protocol, l4_len as u32))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build::Frame;
    use crate::icmp::IcmpPacket;
    use crate::{parse_frame, Reason};
    use std::net::IpAddr;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn tcp(src: &str, dst: &str, flags: u8, seq: u32, ack: u32, payload: &[u8]) -> Vec<u8> {
        let mut f = Frame::tcp(ip(src), ip(dst), 40_000, 443, flags, payload);
        if let crate::build::L4::Tcp(t) = &mut f.l4 {
            t.seq = seq;
            t.ack = ack;
        }
        f.to_bytes()
    }

    fn reply(frame: &[u8]) -> Option<(Refusal, Vec<u8>)> {
        let p = parse_frame(frame).unwrap();
        let mut out = vec![0xaa; 3];
        let r = refusal(frame, &p, &mut out);
        assert_eq!(kind(frame, &p), r, "kind agrees with the reply");
        if r.is_none() {
            assert!(out.is_empty());
        }
        r.map(|r| (r, out))
    }

    /// The reply's TCP header, checked: its checksum verifies over the
    /// reply's own pseudo-header.
    fn rst_of(out: &[u8]) -> (u32, u32, u8, u16, u16) {
        let p = parse_frame(out).unwrap();
        assert_eq!(p.flow.proto, proto::TCP);
        let seg = TcpPacket::new_checked(&out[p.l4_offset..p.l3_offset + p.l3_len]).unwrap();
        let pseudo = match p.l3 {
            L3::V4 => pseudo_v4(
                unmapped(&p.flow.src).unwrap(),
                unmapped(&p.flow.dst).unwrap(),
                proto::TCP,
                seg.header_len() as u16,
            ),
            L3::V6 => pseudo_v6(p.flow.src, p.flow.dst, proto::TCP, seg.header_len() as u32),
        };
        assert!(seg.checksum_ok(pseudo), "RST checksum");
        assert!(seg.payload().is_empty() && seg.options().is_empty());
        assert_eq!(p.ttl, TTL);
        (
            seg.seq(),
            seg.ack(),
            seg.flags(),
            seg.src_port(),
            seg.dst_port(),
        )
    }

    #[test]
    fn syn_is_answered_with_rst_ack_acknowledging_the_syn() {
        let f = tcp("198.51.100.7", "192.0.2.80", flags::SYN, 1000, 77, b"");
        let (r, out) = reply(&f).unwrap();
        assert_eq!(r, Refusal::TcpReset);
        // No ACK in the SYN: SEQ=0, ACK=SEG.SEQ+1 (the SYN counts one).
        assert_eq!(
            rst_of(&out),
            (0, 1001, flags::RST | flags::ACK, 443, 40_000)
        );
        let p = parse_frame(&out).unwrap();
        assert_eq!(p.flow.src, crate::flow::from_ip(ip("192.0.2.80")));
        assert_eq!(p.flow.dst, crate::flow::from_ip(ip("198.51.100.7")));
        assert_eq!(out[..6], f[6..12], "to the sender's MAC");
        assert_eq!(out[6..12], f[..6], "from the MAC it was sent to");
        assert_eq!(out.len(), 14 + 20 + 20);
    }

    #[test]
    fn ack_is_answered_with_rst_at_its_acknowledgment() {
        for flags in [flags::ACK, flags::ACK | flags::PSH, flags::SYN | flags::ACK] {
            let f = tcp("198.51.100.7", "192.0.2.80", flags, 5, 0xdead_beef, b"data");
            let (_, out) = reply(&f).unwrap();
            assert_eq!(rst_of(&out), (0xdead_beef, 0, flags::RST, 443, 40_000));
        }
    }

    #[test]
    fn fin_and_payload_count_in_the_acknowledgment() {
        let f = tcp(
            "198.51.100.7",
            "192.0.2.80",
            flags::FIN,
            u32::MAX - 2,
            0,
            b"abcd",
        );
        let (_, out) = reply(&f).unwrap();
        // 4 bytes and the FIN, wrapping around 2^32.
        assert_eq!(rst_of(&out).1, 2);
        let f = tcp("198.51.100.7", "192.0.2.80", 0, 10, 0, b"");
        assert_eq!(rst_of(&reply(&f).unwrap().1).1, 10, "no flags, no data");
    }

    #[test]
    fn rst_is_never_answered() {
        for flags in [flags::RST, flags::RST | flags::ACK, flags::RST | flags::SYN] {
            let f = tcp("198.51.100.7", "192.0.2.80", flags, 1, 1, b"");
            assert_eq!(reply(&f), None);
        }
    }

    #[test]
    fn tcp_over_ipv6() {
        let f = tcp("2001:db8:1::7", "2001:db8::80", flags::SYN, 9, 0, b"");
        let (_, out) = reply(&f).unwrap();
        assert_eq!(rst_of(&out), (0, 10, flags::RST | flags::ACK, 443, 40_000));
        let p = parse_frame(&out).unwrap();
        assert_eq!(p.flow.src, crate::flow::from_ip(ip("2001:db8::80")));
        assert_eq!(out.len(), 14 + 40 + 20);
    }

    #[test]
    fn udp_is_answered_with_port_unreachable_quoting_the_datagram() {
        let f = Frame::udp(ip("198.51.100.7"), ip("192.0.2.80"), 5353, 99, b"hello").to_bytes();
        let (r, out) = reply(&f).unwrap();
        assert_eq!(r, Refusal::PortUnreachable);
        let p = parse_frame(&out).unwrap();
        assert_eq!((p.flow.proto, p.ttl, p.tos), (proto::ICMP, TTL, ICMP_TOS));
        let m = IcmpPacket::new_checked(&out[p.l4_offset..p.l3_offset + p.l3_len]).unwrap();
        assert_eq!((m.kind(), m.code(), m.rest()), (3, 3, 0));
        assert!(m.checksum_ok(0));
        assert_eq!(m.payload(), &f[14..], "the whole small datagram quoted");

        let f = Frame::udp(ip("2001:db8:1::7"), ip("2001:db8::80"), 5353, 99, b"hi").to_bytes();
        let (_, out) = reply(&f).unwrap();
        let p = parse_frame(&out).unwrap();
        assert_eq!((p.flow.proto, p.ttl), (proto::ICMPV6, TTL));
        let m = IcmpPacket::new_checked(&out[p.l4_offset..p.l3_offset + p.l3_len]).unwrap();
        assert_eq!((m.kind(), m.code()), (1, 4));
        let len = (p.l3_len - 40) as u32;
        assert!(m.checksum_ok(pseudo_v6(p.flow.src, p.flow.dst, proto::ICMPV6, len)));
        assert!(!m.checksum_ok(0), "the pseudo-header is in ICMPv6's sum");
        assert_eq!(m.payload(), &f[14..]);
    }

    #[test]
    fn quotes_are_cut_to_the_minimum_mtu() {
        let big = vec![7u8; 1400];
        let f = Frame::udp(ip("198.51.100.7"), ip("192.0.2.80"), 1, 2, &big).to_bytes();
        let (_, out) = reply(&f).unwrap();
        assert_eq!(out.len(), 14 + V4_MAX);
        let f = Frame::udp(ip("2001:db8:1::7"), ip("2001:db8::80"), 1, 2, &big).to_bytes();
        let (_, out) = reply(&f).unwrap();
        assert_eq!(out.len(), 14 + V6_MAX);
        assert_eq!(out[14 + 48..], f[14..14 + V6_MAX - 48]);
    }

    #[test]
    fn what_a_host_must_not_answer_is_not_answered() {
        let syn = |s: &str, d: &str| tcp(s, d, flags::SYN, 1, 0, b"");
        let udp = |s: &str, d: &str| Frame::udp(ip(s), ip(d), 1, 2, b"x").to_bytes();
        let mut bcast_mac = syn("198.51.100.7", "192.0.2.80");
        bcast_mac[..6].fill(0xff);
        let mut mcast_mac = udp("198.51.100.7", "192.0.2.80");
        mcast_mac[..6].copy_from_slice(&[0x01, 0x00, 0x5e, 0, 0, 1]);
        let mut group_src_mac = udp("198.51.100.7", "192.0.2.80");
        group_src_mac[6] |= 1;
        let first = Frame::udp(ip("198.51.100.7"), ip("192.0.2.80"), 1, 2, &[0; 32])
            .fragment(7, 0, true)
            .to_bytes();
        let later = Frame::new(
            ip("198.51.100.7"),
            ip("192.0.2.80"),
            crate::build::L4::Raw(proto::UDP, vec![0; 16]),
        )
        .fragment(7, 16, false)
        .to_bytes();
        let later6 = Frame::new(
            ip("2001:db8:1::7"),
            ip("2001:db8::80"),
            crate::build::L4::Raw(proto::TCP, vec![0; 16]),
        )
        .fragment(7, 16, false)
        .to_bytes();
        let quoted = &udp("192.0.2.80", "198.51.100.7")[14..14 + 28];
        let icmp_err =
            Frame::icmp(ip("198.51.100.1"), ip("192.0.2.80"), 3, 3, 0, quoted).to_bytes();
        let frag_needed =
            Frame::icmp(ip("198.51.100.1"), ip("192.0.2.80"), 3, 4, 1400, quoted).to_bytes();
        let echo = Frame::icmp(ip("198.51.100.1"), ip("192.0.2.80"), 8, 0, 1, b"ping").to_bytes();
        let gre = Frame::new(
            ip("198.51.100.1"),
            ip("192.0.2.80"),
            crate::build::L4::Raw(proto::GRE, vec![0; 8]),
        )
        .to_bytes();
        for (what, f) in [
            ("broadcast MAC", bcast_mac),
            ("multicast MAC", mcast_mac),
            ("group source MAC", group_src_mac),
            ("first fragment", first),
            ("later fragment", later),
            ("later IPv6 fragment", later6),
            ("ICMP error", icmp_err),
            ("ICMP frag needed", frag_needed),
            ("ICMP echo", echo),
            ("GRE", gre),
            ("multicast destination", udp("198.51.100.7", "239.1.2.3")),
            (
                "broadcast destination",
                udp("198.51.100.7", "255.255.255.255"),
            ),
            ("IPv6 multicast destination", udp("2001:db8::1", "ff02::1")),
            ("broadcast source", udp("255.255.255.255", "192.0.2.80")),
            ("multicast source", syn("224.0.0.1", "192.0.2.80")),
            ("loopback source", syn("127.0.0.1", "192.0.2.80")),
            ("unspecified IPv6 source", udp("::", "2001:db8::80")),
            ("IPv6 multicast source", syn("ff02::1", "2001:db8::80")),
        ] {
            assert_eq!(reply(&f), None, "{what} was answered");
        }
    }

    /// A `Parsed` that does not belong to the frame gives no reply, and no
    /// panic.
    #[test]
    fn a_foreign_parse_is_refused_quietly() {
        let f = tcp("198.51.100.7", "192.0.2.80", flags::SYN, 1, 0, b"");
        let mut p = parse_frame(&f).unwrap();
        p.l3_len = 4000;
        assert_eq!(refusal(&f, &p, &mut Vec::new()), None);
        let short = &f[..20];
        assert_eq!(
            parse_frame(short).unwrap_err().0,
            Reason::Ipv4Truncated,
            "(the parser refuses it first)"
        );
        let p = parse_frame(&f).unwrap();
        assert_eq!(refusal(short, &p, &mut Vec::new()), None);
    }
}
