//! Wire formats, in the style of smoltcp's `wire` module: for each header a
//! zero-copy view over a byte buffer (`XxxPacket<T: AsRef<[u8]>>`) whose
//! checked constructor validates every length before any field is read, and
//! a plain `XxxRepr` struct to parse into and emit from. Each module names
//! its header's byte ranges once, in a `field` module ([`Field`]); the
//! getters, the setters (on views over writable buffers) and `emit` all use
//! those names, so each layout fact is written in one place.
//!
//! [`parse::parse_frame`] is the forwarder's one-pass parser: it reads the
//! Ethernet, IP and transport headers of a frame in place and returns offsets
//! and the flow key, or an [`Error`] whose [`Reason`] is counted by the
//! caller. No input, however malformed, makes this crate panic (fuzzed, and
//! property-tested on arbitrary bytes).
//!
//! # Example
//!
//! ```
//! use packet::{build::Frame, ipv4::Ipv4Packet, parse_frame, proto};
//!
//! let (client, vip) = ("198.51.100.7".parse()?, "198.18.0.80".parse()?);
//! let mut frame = Frame::udp(client, vip, 5353, 53, b"query").to_bytes();
//! let p = parse_frame(&frame)?;
//! assert_eq!((p.flow.proto, p.flow.dst_port, p.ttl), (proto::UDP, 53, 64));
//! // Rewrite in place through a view: one hop less, the checksum refilled.
//! let mut ip = Ipv4Packet::new_checked(&mut frame[p.l3_offset..])?;
//! ip.set_ttl(ip.ttl() - 1);
//! ip.fill_checksum();
//! assert_eq!(parse_frame(&frame)?.ttl, 63);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! `cargo run -p packet --example rewrite` goes further: views and reprs of
//! each header, a destination rewritten with both checksums fixed, GRE
//! encapsulation ([`gre`]) and back.

pub mod build;
pub mod checksum;
pub mod ethernet;
pub mod flow;
pub mod gre;
pub mod icmp;
pub mod ipv4;
pub mod ipv6;
pub mod parse;
pub mod quic;
pub mod reply;
pub mod tcp;
pub mod udp;

pub use flow::FlowKey;
pub use parse::{parse_frame, Parsed};

/// Why a packet was rejected. Each reason is a counter in the forwarder, so
/// the set is fixed and every reason has a stable snake_case name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reason {
    /// Shorter than an Ethernet header.
    EthernetTruncated,
    /// An 802.1Q tag without room for the inner ethertype.
    VlanTruncated,
    /// Neither IPv4 nor IPv6 (ARP, LLDP...): not for a load balancer.
    NotIp,
    /// Shorter than an IPv4 header.
    Ipv4Truncated,
    /// Version field is not 4.
    Ipv4BadVersion,
    /// IHL below 5 or beyond the buffer.
    Ipv4BadHeaderLength,
    /// Total length below the header length or beyond the buffer.
    Ipv4BadTotalLength,
    /// Header checksum does not verify.
    Ipv4BadChecksum,
    /// Fragment offset plus payload beyond 65535 bytes.
    BadFragment,
    /// Shorter than an IPv6 header.
    Ipv6Truncated,
    /// Version field is not 6.
    Ipv6BadVersion,
    /// Payload length beyond the buffer.
    Ipv6BadPayloadLength,
    /// An extension header runs past the payload.
    Ipv6ExtensionTruncated,
    /// More extension headers than we walk (a resource-exhaustion guard).
    Ipv6TooManyExtensions,
    /// Shorter than a TCP header.
    TcpTruncated,
    /// Data offset below 5 or beyond the segment.
    TcpBadDataOffset,
    /// Shorter than a UDP header.
    UdpTruncated,
    /// UDP length field inconsistent with the IP payload.
    UdpBadLength,
    /// Shorter than an ICMP header.
    IcmpTruncated,
    /// An ICMP error whose quoted packet cannot be parsed.
    IcmpBadQuote,
    /// Shorter than a GRE header, or GRE flags we do not handle.
    GreMalformed,
}

impl Reason {
    /// Every reason, in counter order.
    pub const ALL: [Reason; 21] = [
        Reason::EthernetTruncated,
        Reason::VlanTruncated,
        Reason::NotIp,
        Reason::Ipv4Truncated,
        Reason::Ipv4BadVersion,
        Reason::Ipv4BadHeaderLength,
        Reason::Ipv4BadTotalLength,
        Reason::Ipv4BadChecksum,
        Reason::BadFragment,
        Reason::Ipv6Truncated,
        Reason::Ipv6BadVersion,
        Reason::Ipv6BadPayloadLength,
        Reason::Ipv6ExtensionTruncated,
        Reason::Ipv6TooManyExtensions,
        Reason::TcpTruncated,
        Reason::TcpBadDataOffset,
        Reason::UdpTruncated,
        Reason::UdpBadLength,
        Reason::IcmpTruncated,
        Reason::IcmpBadQuote,
        Reason::GreMalformed,
    ];

    /// Stable snake_case name, for counters and metrics.
    pub fn name(self) -> &'static str {
        match self {
            Reason::EthernetTruncated => "ethernet_truncated",
            Reason::VlanTruncated => "vlan_truncated",
            Reason::NotIp => "not_ip",
            Reason::Ipv4Truncated => "ipv4_truncated",
            Reason::Ipv4BadVersion => "ipv4_bad_version",
            Reason::Ipv4BadHeaderLength => "ipv4_bad_header_length",
            Reason::Ipv4BadTotalLength => "ipv4_bad_total_length",
            Reason::Ipv4BadChecksum => "ipv4_bad_checksum",
            Reason::BadFragment => "bad_fragment",
            Reason::Ipv6Truncated => "ipv6_truncated",
            Reason::Ipv6BadVersion => "ipv6_bad_version",
            Reason::Ipv6BadPayloadLength => "ipv6_bad_payload_length",
            Reason::Ipv6ExtensionTruncated => "ipv6_extension_truncated",
            Reason::Ipv6TooManyExtensions => "ipv6_too_many_extensions",
            Reason::TcpTruncated => "tcp_truncated",
            Reason::TcpBadDataOffset => "tcp_bad_data_offset",
            Reason::UdpTruncated => "udp_truncated",
            Reason::UdpBadLength => "udp_bad_length",
            Reason::IcmpTruncated => "icmp_truncated",
            Reason::IcmpBadQuote => "icmp_bad_quote",
            Reason::GreMalformed => "gre_malformed",
        }
    }

    /// Position in [`Reason::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A rejected packet, with the reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("malformed packet: {0}")]
pub struct Error(pub Reason);

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, Error>;

/// Shorthand used by the parsers.
pub(crate) fn fail<T>(r: Reason) -> Result<T> {
    Err(Error(r))
}

/// IP protocol numbers used here.
pub mod proto {
    /// ICMP for IPv4.
    pub const ICMP: u8 = 1;
    /// TCP.
    pub const TCP: u8 = 6;
    /// UDP.
    pub const UDP: u8 = 17;
    /// GRE.
    pub const GRE: u8 = 47;
    /// ICMP for IPv6.
    pub const ICMPV6: u8 = 58;
    /// IPv6 hop-by-hop options.
    pub const HOPOPT: u8 = 0;
    /// IPv6 routing header.
    pub const ROUTING: u8 = 43;
    /// IPv6 fragment header.
    pub const FRAGMENT: u8 = 44;
    /// IPv6 destination options.
    pub const DSTOPTS: u8 = 60;
    /// IPv6 authentication header.
    pub const AH: u8 = 51;
    /// IPv6 no next header.
    pub const NONE: u8 = 59;
}

/// Ethertypes used here.
pub mod ethertype {
    /// IPv4.
    pub const IPV4: u16 = 0x0800;
    /// IPv6.
    pub const IPV6: u16 = 0x86dd;
    /// 802.1Q VLAN tag.
    pub const VLAN: u16 = 0x8100;
    /// ARP.
    pub const ARP: u16 = 0x0806;
}

/// A header field: the byte range it occupies, counted from the start of
/// its header. Each wire module names its fields once, in its `field`
/// module, and its getters, setters and `emit` all use those names.
pub type Field = core::ops::Range<usize>;

/// Reads the big-endian `u16` in field `f` (which must be 2 bytes) of `b`.
#[inline]
pub(crate) fn read16(b: &[u8], f: Field) -> u16 {
    let s = &b[f];
    u16::from_be_bytes([s[0], s[1]])
}

/// Reads the big-endian `u32` in field `f` (which must be 4 bytes) of `b`.
#[inline]
pub(crate) fn read32(b: &[u8], f: Field) -> u32 {
    let s = &b[f];
    u32::from_be_bytes([s[0], s[1], s[2], s[3]])
}

/// Copies field `f` of `b` (which must be `N` bytes, e.g. an address) out.
#[inline]
pub(crate) fn read_array<const N: usize>(b: &[u8], f: Field) -> [u8; N] {
    let mut a = [0; N];
    a.copy_from_slice(&b[f]);
    a
}

/// Writes `v` big-endian into field `f` (which must be 2 bytes) of `b`.
#[inline]
pub(crate) fn write16(b: &mut [u8], f: Field, v: u16) {
    b[f].copy_from_slice(&v.to_be_bytes());
}

/// Writes `v` big-endian into field `f` (which must be 4 bytes) of `b`.
#[inline]
pub(crate) fn write32(b: &mut [u8], f: Field, v: u32) {
    b[f].copy_from_slice(&v.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reason_indices_match_all() {
        for (i, r) in Reason::ALL.iter().enumerate() {
            assert_eq!(r.index(), i);
        }
        let mut names: Vec<_> = Reason::ALL.iter().map(|r| r.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), Reason::ALL.len());
    }
}
