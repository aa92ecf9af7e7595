//! The forwarder's one-pass parser: Ethernet (optionally tagged), IPv4 or
//! IPv6 with extension headers and fragments, then TCP, UDP or ICMP, read in
//! place. Every length is checked before it is used.

use crate::ethernet::EthernetFrame;
use crate::flow::{mapped, FlowKey};
use crate::icmp::{self, IcmpPacket};
use crate::ipv4::Ipv4Packet;
use crate::ipv6::{self, Ipv6Packet};
use crate::tcp::TcpPacket;
use crate::udp::UdpPacket;
use crate::{be16, ethertype, fail, proto, Reason, Result};

/// Network-layer family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum L3 {
    /// IPv4.
    V4,
    /// IPv6.
    V6,
}

/// Fragment information (IPv4 flags/offset or the IPv6 fragment header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FragInfo {
    /// Identification (16 bits for IPv4, 32 for IPv6).
    pub ident: u32,
    /// Offset of this fragment's data, in bytes.
    pub offset: u16,
    /// More fragments follow.
    pub more: bool,
}

impl FragInfo {
    /// Whether this fragment carries the transport header.
    pub fn is_first(&self) -> bool {
        self.offset == 0
    }
}

/// What the forwarder needs to know about a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parsed {
    /// Offset of the IP header in the frame.
    pub l3_offset: usize,
    /// Length of the IP packet (header and payload, without link padding).
    pub l3_len: usize,
    /// IP family.
    pub l3: L3,
    /// Offset of the transport header in the frame (for a non-first
    /// fragment: of the fragment's data).
    pub l4_offset: usize,
    /// The 5-tuple. Ports are 0 for protocols without ports and for
    /// non-first fragments.
    pub flow: FlowKey,
    /// IPv4 TOS or IPv6 traffic class (DSCP and ECN).
    pub tos: u8,
    /// TTL or hop limit.
    pub ttl: u8,
    /// Fragment information, if this is a fragment.
    pub fragment: Option<FragInfo>,
    /// TCP flags (0 for other protocols).
    pub tcp_flags: u8,
    /// For ICMP "fragmentation needed" and ICMPv6 "packet too big": the
    /// quoted packet's flow, reversed so it reads like the flow it answers
    /// (client to VIP).
    pub icmp_quote: Option<FlowKey>,
}

/// Parses a frame. The frame may carry link padding after the IP packet.
pub fn parse_frame(frame: &[u8]) -> Result<Parsed> {
    let eth = EthernetFrame::new_checked(frame)?;
    let l3_offset = eth.header_len();
    match eth.ethertype() {
        ethertype::IPV4 => parse_v4(frame, l3_offset),
        ethertype::IPV6 => parse_v6(frame, l3_offset),
        _ => fail(Reason::NotIp),
    }
}

fn parse_v4(frame: &[u8], l3_offset: usize) -> Result<Parsed> {
    let ip = Ipv4Packet::new_checked(&frame[l3_offset..])?;
    if !ip.checksum_ok() {
        return fail(Reason::Ipv4BadChecksum);
    }
    let fragment = ip.is_fragment().then(|| FragInfo {
        ident: u32::from(ip.ident()),
        offset: ip.frag_offset(),
        more: ip.more_frags(),
    });
    let hl = ip.header_len();
    let l3_len = ip.total_len();
    let l4 = &frame[l3_offset + hl..l3_offset + l3_len];
    let flow = FlowKey {
        src: mapped(ip.src()),
        dst: mapped(ip.dst()),
        src_port: 0,
        dst_port: 0,
        proto: ip.protocol(),
    };
    let mut p = Parsed {
        l3_offset,
        l3_len,
        l3: L3::V4,
        l4_offset: l3_offset + hl,
        flow,
        tos: ip.tos(),
        ttl: ip.ttl(),
        fragment,
        tcp_flags: 0,
        icmp_quote: None,
    };
    transport(&mut p, l4)?;
    Ok(p)
}

fn parse_v6(frame: &[u8], l3_offset: usize) -> Result<Parsed> {
    let ip = Ipv6Packet::new_checked(&frame[l3_offset..])?;
    let chain = ip.extensions()?;
    let l3_len = ipv6::HEADER_LEN + ip.payload_len();
    let l4_offset = l3_offset + ipv6::HEADER_LEN + chain.offset;
    let fragment = chain.fragment.map(|f| FragInfo {
        ident: f.ident,
        offset: f.offset,
        more: f.more,
    });
    let mut p = Parsed {
        l3_offset,
        l3_len,
        l3: L3::V6,
        l4_offset,
        flow: FlowKey {
            src: ip.src(),
            dst: ip.dst(),
            src_port: 0,
            dst_port: 0,
            proto: chain.protocol,
        },
        tos: ip.traffic_class(),
        ttl: ip.hop_limit(),
        fragment,
        tcp_flags: 0,
        icmp_quote: None,
    };
    transport(&mut p, &frame[l4_offset..l3_offset + l3_len])?;
    Ok(p)
}

/// Reads ports, flags and ICMP quotes from the transport header `l4`.
fn transport(p: &mut Parsed, l4: &[u8]) -> Result<()> {
    if let Some(f) = p.fragment {
        if !f.is_first() {
            return Ok(()); // no transport header in this fragment
        }
    }
    match p.flow.proto {
        proto::TCP => {
            let t = TcpPacket::new_checked(l4)?;
            p.flow.src_port = t.src_port();
            p.flow.dst_port = t.dst_port();
            p.tcp_flags = t.flags();
        }
        proto::UDP => {
            let u = if p.fragment.is_some() {
                UdpPacket::new_checked_fragment(l4)?
            } else {
                UdpPacket::new_checked(l4)?
            };
            p.flow.src_port = u.src_port();
            p.flow.dst_port = u.dst_port();
        }
        proto::ICMP if p.l3 == L3::V4 => {
            let m = IcmpPacket::new_checked(l4)?;
            if m.kind() == icmp::V4_DEST_UNREACHABLE && m.code() == icmp::V4_FRAG_NEEDED {
                p.icmp_quote = Some(quote_v4(m.payload())?.reversed());
            }
        }
        proto::ICMPV6 if p.l3 == L3::V6 => {
            let m = IcmpPacket::new_checked(l4)?;
            if m.kind() == icmp::V6_PACKET_TOO_BIG {
                p.icmp_quote = Some(quote_v6(m.payload())?.reversed());
            }
        }
        _ => {}
    }
    Ok(())
}

/// The 5-tuple of the common case, read with bounds checks only: an
/// (optionally tagged) IPv4 or IPv6 TCP or UDP packet that is not a fragment
/// and has no IPv6 extension headers. Anything else gives `None`, and the
/// caller falls back to [`parse_frame`]. Nothing is validated beyond what
/// reading the fields needs: this is for steering, whose only job is to
/// send a flow's packets to one thread; the packet thread validates.
#[inline]
pub fn steer_flow(frame: &[u8]) -> Option<FlowKey> {
    let mut l3 = 14;
    let mut et = be16(frame.get(..14)?, 12);
    if et == ethertype::VLAN {
        et = be16(frame.get(..18)?, 16);
        l3 = 18;
    }
    match et {
        ethertype::IPV4 => {
            let ip = frame.get(l3..l3 + 20)?;
            let hl = usize::from(ip[0] & 0x0f) * 4;
            // Not a fragment (MF clear, offset zero).
            if ip[0] >> 4 != 4 || be16(ip, 6) & 0x3fff != 0 || hl < 20 {
                return None;
            }
            let proto = ip[9];
            if proto != proto::TCP && proto != proto::UDP {
                return None;
            }
            let l4 = frame.get(l3 + hl..l3 + hl + 4)?;
            Some(FlowKey::v4(
                [ip[12], ip[13], ip[14], ip[15]],
                [ip[16], ip[17], ip[18], ip[19]],
                be16(l4, 0),
                be16(l4, 2),
                proto,
            ))
        }
        ethertype::IPV6 => {
            let ip = frame.get(l3..l3 + 40)?;
            let proto = ip[6];
            if ip[0] >> 4 != 6 || (proto != proto::TCP && proto != proto::UDP) {
                return None;
            }
            let l4 = frame.get(l3 + 40..l3 + 44)?;
            let mut src = [0u8; 16];
            let mut dst = [0u8; 16];
            src.copy_from_slice(&ip[8..24]);
            dst.copy_from_slice(&ip[24..40]);
            Some(FlowKey {
                src,
                dst,
                src_port: be16(l4, 0),
                dst_port: be16(l4, 2),
                proto,
            })
        }
        _ => None,
    }
}

/// The flow of a quoted IPv4 packet: its header and at least the 4 bytes of
/// ports. The quote is usually cut short, so its total length is not checked
/// against what is present.
fn quote_v4(q: &[u8]) -> Result<FlowKey> {
    if q.len() < 20 || q[0] >> 4 != 4 {
        return fail(Reason::IcmpBadQuote);
    }
    let hl = usize::from(q[0] & 0x0f) * 4;
    if hl < 20 || q.len() < hl + 4 {
        return fail(Reason::IcmpBadQuote);
    }
    let proto = q[9];
    let (sp, dp) = ports(proto, &q[hl..]);
    Ok(FlowKey::v4(
        [q[12], q[13], q[14], q[15]],
        [q[16], q[17], q[18], q[19]],
        sp,
        dp,
        proto,
    ))
}

fn quote_v6(q: &[u8]) -> Result<FlowKey> {
    if q.len() < ipv6::HEADER_LEN || q[0] >> 4 != 6 {
        return fail(Reason::IcmpBadQuote);
    }
    let chain =
        ipv6::walk(q[6], &q[ipv6::HEADER_LEN..]).map_err(|_| crate::Error(Reason::IcmpBadQuote))?;
    let l4 = ipv6::HEADER_LEN + chain.offset;
    if q.len() < l4 + 4 {
        return fail(Reason::IcmpBadQuote);
    }
    let (sp, dp) = ports(chain.protocol, &q[l4..]);
    let mut src = [0u8; 16];
    let mut dst = [0u8; 16];
    src.copy_from_slice(&q[8..24]);
    dst.copy_from_slice(&q[24..40]);
    Ok(FlowKey {
        src,
        dst,
        src_port: sp,
        dst_port: dp,
        proto: chain.protocol,
    })
}

/// Ports of a protocol that has them (`l4` holds at least 4 bytes).
fn ports(proto: u8, l4: &[u8]) -> (u16, u16) {
    match proto {
        proto::TCP | proto::UDP => (be16(l4, 0), be16(l4, 2)),
        _ => (0, 0),
    }
}
