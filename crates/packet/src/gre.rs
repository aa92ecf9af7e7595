//! GRE (RFC 2784) encapsulation of an IP packet in an outer IPv4 or IPv6
//! header, written in place into the headroom in front of the packet, and
//! decapsulation for the backends' side.

use crate::ethernet::{EthernetFrame, EthernetRepr, Mac};
use crate::flow::unmapped;
use crate::ipv4::{Ipv4Packet, Ipv4Repr};
use crate::ipv6::{Ipv6Packet, Ipv6Repr};
use crate::parse::{Parsed, L3};
use crate::{be16, ethertype, fail, proto, put16, Reason, Result};

/// Length of a GRE header without optional fields.
pub const HEADER_LEN: usize = 4;

/// Where encapsulated packets go: the outer Ethernet and IP headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outer {
    /// Our MAC.
    pub eth_src: Mac,
    /// The next hop's MAC.
    pub eth_dst: Mac,
    /// Outer source address (IPv4-mapped for IPv4).
    pub src: [u8; 16],
    /// Outer destination address, the backend (IPv4-mapped for IPv4).
    pub dst: [u8; 16],
    /// Outer TTL or hop limit.
    pub ttl: u8,
}

/// Why a packet could not be encapsulated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum EncapError {
    /// Not enough headroom in front of the IP packet for the outer headers.
    #[error("no headroom: need {need} bytes before the IP header, have {have}")]
    NoHeadroom {
        /// Bytes needed.
        need: usize,
        /// Bytes available.
        have: usize,
    },
    /// The result would exceed the outer IP's 65535-byte limit.
    #[error("encapsulated packet would exceed 65535 bytes")]
    TooBig,
    /// Outer source and destination are of different families.
    #[error("outer source and destination address families differ")]
    MixedFamilies,
}

/// Bytes of outer headers (Ethernet, IP, GRE) for an outer family.
pub fn overhead(outer_v4: bool) -> usize {
    crate::ethernet::HEADER_LEN + if outer_v4 { 20 } else { 40 } + HEADER_LEN
}

/// Encapsulates in place. `buf[start..]` holds a frame parsed as `p`; the
/// outer headers are written into the bytes just before its IP header (the
/// frame's own Ethernet header and any headroom before `start`). Returns the
/// range of the encapsulated frame in `buf`. Link padding after the inner
/// packet is dropped. `flow_hash` fills the IPv6 flow label, for ECMP.
///
/// The inner packet is not copied: only headers are written.
pub fn encapsulate(
    buf: &mut [u8],
    start: usize,
    p: &Parsed,
    outer: &Outer,
    flow_hash: u64,
) -> std::result::Result<std::ops::Range<usize>, EncapError> {
    let (src4, dst4) = (unmapped(&outer.src), unmapped(&outer.dst));
    let outer_v4 = match (src4.is_some(), dst4.is_some()) {
        (true, true) => true,
        (false, false) => false,
        _ => return Err(EncapError::MixedFamilies),
    };
    let inner_at = start + p.l3_offset;
    let need = overhead(outer_v4);
    if inner_at < need {
        return Err(EncapError::NoHeadroom {
            need,
            have: inner_at,
        });
    }
    let inner_len = p.l3_len;
    let ip_hl = need - crate::ethernet::HEADER_LEN - HEADER_LEN;
    if outer_v4 && ip_hl + HEADER_LEN + inner_len > 65_535
        || !outer_v4 && HEADER_LEN + inner_len > 65_535
    {
        return Err(EncapError::TooBig);
    }
    let begin = inner_at - need;
    // IPv6 is never fragmented by routers; for IPv4 follow the inner DF.
    let dont_frag = p.l3 == L3::V6 || buf.get(inner_at + 6).is_some_and(|b| b & 0x40 != 0);
    let hdr = &mut buf[begin..inner_at];
    EthernetRepr {
        dst: outer.eth_dst,
        src: outer.eth_src,
        vlan: None,
        ethertype: if outer_v4 {
            ethertype::IPV4
        } else {
            ethertype::IPV6
        },
    }
    .emit(hdr);
    let ip = &mut hdr[crate::ethernet::HEADER_LEN..];
    if let (Some(s), Some(d)) = (src4, dst4) {
        Ipv4Repr {
            src: s,
            dst: d,
            protocol: proto::GRE,
            ttl: outer.ttl,
            tos: p.tos,
            ident: 0,
            dont_frag,
            more_frags: false,
            frag_offset: 0,
            options: Vec::new(),
            payload_len: HEADER_LEN + inner_len,
        }
        .emit(ip);
    } else {
        Ipv6Repr {
            src: outer.src,
            dst: outer.dst,
            traffic_class: p.tos,
            flow_label: (flow_hash & 0x000f_ffff) as u32,
            hop_limit: outer.ttl,
            extensions: Vec::new(),
            protocol: proto::GRE,
            upper_len: HEADER_LEN + inner_len,
        }
        .emit(ip);
    }
    let gre = &mut hdr[need - HEADER_LEN..];
    put16(gre, 0, 0); // no checksum, key or sequence; version 0
    put16(
        gre,
        2,
        if p.l3 == L3::V4 {
            ethertype::IPV4
        } else {
            ethertype::IPV6
        },
    );
    Ok(begin..inner_at + inner_len)
}

/// A decapsulated packet: where the inner IP packet lies in the frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decapsulated {
    /// Range of the inner IP packet in the frame.
    pub inner: std::ops::Range<usize>,
    /// The inner packet's ethertype (IPv4 or IPv6).
    pub ethertype: u16,
    /// Outer source address (IPv4-mapped for IPv4).
    pub outer_src: [u8; 16],
    /// Outer destination address.
    pub outer_dst: [u8; 16],
}

/// Finds the inner packet of an Ethernet/IP/GRE frame. Checksum, key and
/// sequence fields are skipped; routing (RFC 1701) and versions other than
/// 0 are rejected.
pub fn decapsulate(frame: &[u8]) -> Result<Decapsulated> {
    let eth = EthernetFrame::new_checked(frame)?;
    let l3 = eth.header_len();
    let (gre_at, end, outer_src, outer_dst) = match eth.ethertype() {
        ethertype::IPV4 => {
            let ip = Ipv4Packet::new_checked(&frame[l3..])?;
            if ip.protocol() != proto::GRE || ip.is_fragment() {
                return fail(Reason::GreMalformed);
            }
            (
                l3 + ip.header_len(),
                l3 + ip.total_len(),
                crate::flow::mapped(ip.src()),
                crate::flow::mapped(ip.dst()),
            )
        }
        ethertype::IPV6 => {
            let ip = Ipv6Packet::new_checked(&frame[l3..])?;
            let chain = ip.extensions()?;
            if chain.protocol != proto::GRE || chain.fragment.is_some() {
                return fail(Reason::GreMalformed);
            }
            (
                l3 + crate::ipv6::HEADER_LEN + chain.offset,
                l3 + crate::ipv6::HEADER_LEN + ip.payload_len(),
                ip.src(),
                ip.dst(),
            )
        }
        _ => return fail(Reason::NotIp),
    };
    let g = &frame[gre_at..end];
    if g.len() < HEADER_LEN {
        return fail(Reason::GreMalformed);
    }
    let flags = be16(g, 0);
    if flags & 0x4007 != 0 {
        return fail(Reason::GreMalformed); // routing present, or version != 0
    }
    let optional = 4
        * (usize::from(flags & 0x8000 != 0)
            + usize::from(flags & 0x2000 != 0)
            + usize::from(flags & 0x1000 != 0));
    if g.len() < HEADER_LEN + optional {
        return fail(Reason::GreMalformed);
    }
    Ok(Decapsulated {
        inner: gre_at + HEADER_LEN + optional..end,
        ethertype: be16(g, 2),
        outer_src,
        outer_dst,
    })
}
