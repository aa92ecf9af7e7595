//! Whole frames from reprs, for generators and tests: lengths and checksums
//! are filled in.

use std::net::IpAddr;

use crate::checksum::{pseudo_v4, pseudo_v6};
use crate::ethernet::{EthernetRepr, Mac};
use crate::flow::{from_ip, unmapped};
use crate::icmp::IcmpRepr;
use crate::ipv4::Ipv4Repr;
use crate::ipv6::{Extension, Ipv6Repr};
use crate::tcp::TcpRepr;
use crate::udp::UdpRepr;
use crate::{ethertype, proto};

/// The network layer of a frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ip {
    /// IPv4 (`payload_len` and `protocol` are filled in by `to_bytes`).
    V4(Ipv4Repr),
    /// IPv6 (`upper_len` and `protocol` are filled in by `to_bytes`).
    V6(Ipv6Repr),
}

/// The transport layer of a frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum L4 {
    /// TCP.
    Tcp(TcpRepr),
    /// UDP.
    Udp(UdpRepr),
    /// ICMP (v4 or v6 by the network layer).
    Icmp(IcmpRepr),
    /// Raw bytes with a protocol number (fragments, GRE...).
    Raw(u8, Vec<u8>),
}

/// A frame to build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// Ethernet header (its ethertype is filled in).
    pub eth: EthernetRepr,
    /// Network layer.
    pub ip: Ip,
    /// Transport layer.
    pub l4: L4,
}

/// Default MACs for generated frames.
pub const CLIENT_MAC: Mac = [0x02, 0, 0, 0, 0, 0x01];
/// Default MACs for generated frames.
pub const LB_MAC: Mac = [0x02, 0, 0, 0, 0, 0x02];

impl Frame {
    /// A frame from `src` to `dst` (same family) carrying `l4`.
    pub fn new(src: IpAddr, dst: IpAddr, l4: L4) -> Self {
        let (s, d) = (from_ip(src), from_ip(dst));
        let ip = match (unmapped(&s), unmapped(&d)) {
            (Some(s4), Some(d4)) => Ip::V4(Ipv4Repr {
                src: s4,
                dst: d4,
                protocol: 0,
                ttl: 64,
                tos: 0,
                ident: 1,
                dont_frag: true,
                more_frags: false,
                frag_offset: 0,
                options: Vec::new(),
                payload_len: 0,
            }),
            _ => Ip::V6(Ipv6Repr {
                src: s,
                dst: d,
                traffic_class: 0,
                flow_label: 0,
                hop_limit: 64,
                extensions: Vec::new(),
                protocol: 0,
                upper_len: 0,
            }),
        };
        Frame {
            eth: EthernetRepr {
                dst: LB_MAC,
                src: CLIENT_MAC,
                vlan: None,
                ethertype: 0,
            },
            ip,
            l4,
        }
    }

    /// A TCP segment with `flags` and `payload`.
    pub fn tcp(
        src: IpAddr,
        dst: IpAddr,
        sport: u16,
        dport: u16,
        flags: u8,
        payload: &[u8],
    ) -> Self {
        Frame::new(
            src,
            dst,
            L4::Tcp(TcpRepr {
                src_port: sport,
                dst_port: dport,
                seq: 1000,
                ack: 0,
                flags,
                window: 65_535,
                urgent: 0,
                options: Vec::new(),
                payload: payload.to_vec(),
            }),
        )
    }

    /// A UDP datagram.
    pub fn udp(src: IpAddr, dst: IpAddr, sport: u16, dport: u16, payload: &[u8]) -> Self {
        Frame::new(
            src,
            dst,
            L4::Udp(UdpRepr {
                src_port: sport,
                dst_port: dport,
                payload: payload.to_vec(),
            }),
        )
    }

    /// An ICMP or ICMPv6 message.
    pub fn icmp(src: IpAddr, dst: IpAddr, kind: u8, code: u8, rest: u32, payload: &[u8]) -> Self {
        Frame::new(
            src,
            dst,
            L4::Icmp(IcmpRepr {
                kind,
                code,
                rest,
                payload: payload.to_vec(),
            }),
        )
    }

    /// The transport protocol number.
    pub fn protocol(&self) -> u8 {
        match (&self.l4, &self.ip) {
            (L4::Tcp(_), _) => proto::TCP,
            (L4::Udp(_), _) => proto::UDP,
            (L4::Icmp(_), Ip::V4(_)) => proto::ICMP,
            (L4::Icmp(_), Ip::V6(_)) => proto::ICMPV6,
            (L4::Raw(p, _), _) => *p,
        }
    }

    fn l4_len(&self) -> usize {
        match &self.l4 {
            L4::Tcp(t) => t.buffer_len(),
            L4::Udp(u) => u.buffer_len(),
            L4::Icmp(i) => i.buffer_len(),
            L4::Raw(_, b) => b.len(),
        }
    }

    /// The bytes of the frame, lengths and checksums filled in.
    pub fn to_bytes(&self) -> Vec<u8> {
        let proto = self.protocol();
        let l4_len = self.l4_len();
        let mut eth = self.eth;
        let (ip_bytes, pseudo) = match &self.ip {
            Ip::V4(r) => {
                let mut r = r.clone();
                r.protocol = proto;
                r.payload_len = l4_len;
                let mut b = vec![0; r.header_len()];
                r.emit(&mut b);
                eth.ethertype = ethertype::IPV4;
                (b, pseudo_v4(r.src, r.dst, proto, l4_len as u16))
            }
            Ip::V6(r) => {
                let mut r = r.clone();
                r.protocol = proto;
                r.upper_len = l4_len;
                let mut b = vec![0; r.header_len()];
                r.emit(&mut b);
                eth.ethertype = ethertype::IPV6;
                (b, pseudo_v6(r.src, r.dst, proto, l4_len as u32))
            }
        };
        let mut out = vec![0; eth.header_len()];
        eth.emit(&mut out);
        out.extend_from_slice(&ip_bytes);
        let at = out.len();
        out.resize(at + l4_len, 0);
        let l4 = &mut out[at..];
        match &self.l4 {
            L4::Tcp(t) => t.emit(l4, pseudo),
            L4::Udp(u) => u.emit(l4, pseudo),
            L4::Icmp(i) => i.emit(
                l4,
                if matches!(self.ip, Ip::V6(_)) {
                    pseudo
                } else {
                    0
                },
            ),
            L4::Raw(_, b) => l4.copy_from_slice(b),
        }
        out
    }

    /// Sets the IPv4 fragment fields, or adds an IPv6 fragment header.
    pub fn fragment(mut self, ident: u32, offset: u16, more: bool) -> Self {
        match &mut self.ip {
            Ip::V4(r) => {
                r.ident = ident as u16;
                r.frag_offset = offset;
                r.more_frags = more;
                r.dont_frag = false;
            }
            Ip::V6(r) => r
                .extensions
                .push(Extension::Fragment(crate::ipv6::Fragment {
                    offset,
                    more,
                    ident,
                })),
        }
        self
    }
}
