//! The forwarder's one-pass parser: Ethernet (optionally tagged), IPv4 or
//! IPv6 with extension headers and fragments, then TCP, UDP or ICMP, read in
//! place. Every length is checked before it is used.

use crate::ethernet::{self, EthernetFrame};
use crate::flow::{mapped, FlowKey};
use crate::icmp::{self, IcmpPacket};
use crate::ipv4::{self, Ipv4Packet};
use crate::ipv6::{self, Ipv6Packet};
use crate::tcp::{self, TcpPacket};
use crate::udp::{self, UdpPacket};
use crate::{ethertype, fail, proto, read16, Reason, Result};

// TCP and UDP put their ports at the same offsets, so the quick paths read
// them once for both.
const _: () = assert!(
    tcp::field::SRC_PORT.start == udp::field::SRC_PORT.start
        && tcp::field::SRC_PORT.end == udp::field::SRC_PORT.end
        && tcp::field::DST_PORT.start == udp::field::DST_PORT.start
        && tcp::field::DST_PORT.end == udp::field::DST_PORT.end
);
/// The bytes holding both ports of a TCP or UDP header.
const PORTS_LEN: usize = tcp::field::DST_PORT.end;

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

/// Parses the IP packet of type `ethertype` at `l3_offset` in `frame`, as
/// [`parse_frame`] does after the Ethernet header: for a packet found
/// inside another, such as the inner packet of GRE
/// ([`crate::gre::decapsulate`]). Offsets in the result are into `frame`.
pub fn parse_packet(frame: &[u8], l3_offset: usize, ethertype: u16) -> Result<Parsed> {
    let inside = l3_offset <= frame.len();
    match ethertype {
        ethertype::IPV4 if inside => parse_v4(frame, l3_offset),
        ethertype::IPV4 => fail(Reason::Ipv4Truncated),
        ethertype::IPV6 if inside => parse_v6(frame, l3_offset),
        ethertype::IPV6 => fail(Reason::Ipv6Truncated),
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
    let proto = ip.protocol();
    let (src_port, dst_port, tcp_flags, icmp_quote) = transport(L3::V4, proto, fragment, l4)?;
    Ok(Parsed {
        l3_offset,
        l3_len,
        l3: L3::V4,
        l4_offset: l3_offset + hl,
        flow: FlowKey {
            src: mapped(ip.src()),
            dst: mapped(ip.dst()),
            src_port,
            dst_port,
            proto,
        },
        tos: ip.tos(),
        ttl: ip.ttl(),
        fragment,
        tcp_flags,
        icmp_quote,
    })
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
    let proto = chain.protocol;
    let (src_port, dst_port, tcp_flags, icmp_quote) = transport(
        L3::V6,
        proto,
        fragment,
        &frame[l4_offset..l3_offset + l3_len],
    )?;
    Ok(Parsed {
        l3_offset,
        l3_len,
        l3: L3::V6,
        l4_offset,
        flow: FlowKey {
            src: ip.src(),
            dst: ip.dst(),
            src_port,
            dst_port,
            proto,
        },
        tos: ip.traffic_class(),
        ttl: ip.hop_limit(),
        fragment,
        tcp_flags,
        icmp_quote,
    })
}

/// What [`transport`] read: ports, TCP flags and an ICMP quote.
type Transport = (u16, u16, u8, Option<FlowKey>);

/// Reads ports, flags and ICMP quotes from the transport header `l4`.
///
/// Returned, not written into a `Parsed` its caller had already stored:
/// the caller then copied that struct out with wide loads over these
/// narrow stores, which the CPU cannot forward (a stall that was half of
/// `parse_v4`'s samples in `lb bench`). Inlined so that the ports and
/// flags stay in registers; the rare ICMP quote is read out of line.
#[inline(always)]
fn transport(l3: L3, proto: u8, fragment: Option<FragInfo>, l4: &[u8]) -> Result<Transport> {
    if fragment.is_some_and(|f| !f.is_first()) {
        return Ok((0, 0, 0, None)); // no transport header in this fragment
    }
    match proto {
        proto::TCP => {
            let h = TcpPacket::new_checked(l4)?;
            Ok((h.src_port(), h.dst_port(), h.flags(), None))
        }
        proto::UDP => {
            let u = if fragment.is_some() {
                UdpPacket::new_checked_fragment(l4)?
            } else {
                UdpPacket::new_checked(l4)?
            };
            Ok((u.src_port(), u.dst_port(), 0, None))
        }
        _ => Ok((0, 0, 0, icmp_quote(l3, proto, l4)?)),
    }
}

/// The flow quoted by an ICMP "fragmentation needed" or ICMPv6 "packet too
/// big" message, if `l4` is one.
#[inline(never)]
fn icmp_quote(l3: L3, proto: u8, l4: &[u8]) -> Result<Option<FlowKey>> {
    match proto {
        proto::ICMP if l3 == L3::V4 => {
            let m = IcmpPacket::new_checked(l4)?;
            if m.kind() == icmp::V4_DEST_UNREACHABLE && m.code() == icmp::V4_FRAG_NEEDED {
                return Ok(Some(quote_v4(m.payload())?.reversed()));
            }
        }
        proto::ICMPV6 if l3 == L3::V6 => {
            let m = IcmpPacket::new_checked(l4)?;
            if m.kind() == icmp::V6_PACKET_TOO_BIG {
                return Ok(Some(quote_v6(m.payload())?.reversed()));
            }
        }
        _ => {}
    }
    Ok(None)
}

/// The 5-tuple of the common case, read with bounds checks only: an
/// (optionally tagged) IPv4 or IPv6 TCP or UDP packet that is not a fragment
/// and has no IPv6 extension headers. Anything else gives `None`, and the
/// caller falls back to [`parse_frame`]. Nothing is validated beyond what
/// reading the fields needs: this is for steering, whose only job is to
/// send a flow's packets to one thread; the packet thread validates.
#[inline]
pub fn steer_flow(frame: &[u8]) -> Option<FlowKey> {
    use ethernet::field as eth;
    let mut l3 = ethernet::HEADER_LEN;
    let mut et = read16(frame.get(..l3)?, eth::ETHERTYPE);
    if et == ethertype::VLAN {
        l3 = ethernet::HEADER_LEN + ethernet::VLAN_TAG_LEN;
        et = read16(frame.get(..l3)?, eth::VLAN_ETHERTYPE);
    }
    match et {
        ethertype::IPV4 => {
            // The slice holds a whole fixed header, all these getters read.
            let ip = Ipv4Packet::new_unchecked(frame.get(l3..l3 + ipv4::MIN_HEADER_LEN)?);
            let hl = ip.header_len();
            if ip.version() != 4 || ip.is_fragment() || hl < ipv4::MIN_HEADER_LEN {
                return None;
            }
            let proto = ip.protocol();
            if proto != proto::TCP && proto != proto::UDP {
                return None;
            }
            let (src_port, dst_port) = ports(proto, frame.get(l3 + hl..l3 + hl + PORTS_LEN)?);
            Some(FlowKey::v4(ip.src(), ip.dst(), src_port, dst_port, proto))
        }
        ethertype::IPV6 => {
            // The slice holds a whole fixed header, all these getters read.
            let ip = Ipv6Packet::new_unchecked(frame.get(l3..l3 + ipv6::HEADER_LEN)?);
            let proto = ip.next_header();
            if ip.version() != 6 || (proto != proto::TCP && proto != proto::UDP) {
                return None;
            }
            let l4 = l3 + ipv6::HEADER_LEN;
            let (src_port, dst_port) = ports(proto, frame.get(l4..l4 + PORTS_LEN)?);
            Some(FlowKey {
                src: ip.src(),
                dst: ip.dst(),
                src_port,
                dst_port,
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
    if q.len() < ipv4::MIN_HEADER_LEN {
        return fail(Reason::IcmpBadQuote);
    }
    // Holds the fixed header, all these getters read.
    let ip = Ipv4Packet::new_unchecked(q);
    let hl = ip.header_len();
    if ip.version() != 4 || hl < ipv4::MIN_HEADER_LEN || q.len() < hl + PORTS_LEN {
        return fail(Reason::IcmpBadQuote);
    }
    let proto = ip.protocol();
    let (sp, dp) = ports(proto, &q[hl..]);
    Ok(FlowKey::v4(ip.src(), ip.dst(), sp, dp, proto))
}

fn quote_v6(q: &[u8]) -> Result<FlowKey> {
    if q.len() < ipv6::HEADER_LEN {
        return fail(Reason::IcmpBadQuote);
    }
    // Holds the fixed header, all these getters read.
    let ip = Ipv6Packet::new_unchecked(q);
    if ip.version() != 6 {
        return fail(Reason::IcmpBadQuote);
    }
    let chain = ipv6::walk(ip.next_header(), &q[ipv6::HEADER_LEN..])
        .map_err(|_| crate::Error(Reason::IcmpBadQuote))?;
    let l4 = ipv6::HEADER_LEN + chain.offset;
    if q.len() < l4 + PORTS_LEN {
        return fail(Reason::IcmpBadQuote);
    }
    let (sp, dp) = ports(chain.protocol, &q[l4..]);
    Ok(FlowKey {
        src: ip.src(),
        dst: ip.dst(),
        src_port: sp,
        dst_port: dp,
        proto: chain.protocol,
    })
}

/// Ports of a protocol that has them (`l4` holds at least [`PORTS_LEN`]
/// bytes).
fn ports(proto: u8, l4: &[u8]) -> (u16, u16) {
    match proto {
        proto::TCP | proto::UDP => (
            read16(l4, tcp::field::SRC_PORT),
            read16(l4, tcp::field::DST_PORT),
        ),
        _ => (0, 0),
    }
}
