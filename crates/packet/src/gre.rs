//! GRE (RFC 2784) encapsulation of an IP packet in an outer IPv4 or IPv6
//! header, written in place into the headroom in front of the packet, and
//! decapsulation for the backends' side. The optional key field (RFC 2890)
//! can be written and is read back: load balancers mark fragments they
//! redirect to a peer with [`FRAGMENT_REDIRECT_KEY`].

use crate::ethernet::{EthernetFrame, EthernetRepr, Mac};
use crate::flow::unmapped;
use crate::ipv4::{Ipv4Packet, Ipv4Repr};
use crate::ipv6::{Ipv6Packet, Ipv6Repr};
use crate::parse::{Parsed, L3};
use crate::{ethertype, fail, proto, read16, write16, Reason, Result};

/// Where each field of a GRE header lies.
pub mod field {
    use crate::Field;

    /// Flags (see [`super::flags`]) and version (low 3 bits).
    pub const FLAGS_VERSION: Field = 0..2;
    /// Ethertype of the encapsulated packet.
    pub const PROTOCOL: Field = 2..4;
}

/// The bits of the [`field::FLAGS_VERSION`] word.
pub mod flags {
    /// A checksum (and 2 reserved bytes) follows the fixed header.
    pub const CHECKSUM: u16 = 0x8000;
    /// RFC 1701 source routing; not handled.
    pub const ROUTING: u16 = 0x4000;
    /// A 4-byte key follows.
    pub const KEY: u16 = 0x2000;
    /// A 4-byte sequence number follows.
    pub const SEQUENCE: u16 = 0x1000;
    /// The version; only 0 is handled.
    pub const VERSION: u16 = 0x0007;
}

/// Length of a GRE header without optional fields.
pub const HEADER_LEN: usize = field::PROTOCOL.end;
/// Length of each optional field (checksum, key, sequence).
const OPTIONAL_LEN: usize = 4;
/// Length of a GRE header with a key and no other optional field.
pub const KEYED_HEADER_LEN: usize = HEADER_LEN + OPTIONAL_LEN;

/// The GRE key that marks a fragment one load balancer redirected to the
/// peer responsible for its datagram (Maglev paper, section 4.3): ASCII
/// "FPFR" (fastpath fragment redirect). A load balancer that receives GRE
/// with this key, addressed to itself, handles the inner fragment and never
/// redirects it again. The XDP program (`netio`'s `bpf/xsk.c`) matches the
/// same value.
pub const FRAGMENT_REDIRECT_KEY: u32 = 0x4650_4652;

/// A checked view of a GRE packet: version 0, no routing, and the optional
/// fields its flags announce are present.
#[derive(Debug, Clone)]
pub struct GrePacket<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> GrePacket<T> {
    /// Validates the flags and that the header with its optional fields
    /// fits.
    pub fn new_checked(buf: T) -> Result<Self> {
        if buf.as_ref().len() < HEADER_LEN {
            return fail(Reason::GreMalformed);
        }
        let p = GrePacket { buf };
        if p.flags() & (flags::ROUTING | flags::VERSION) != 0 {
            return fail(Reason::GreMalformed); // routing present, or version != 0
        }
        if p.b().len() < p.header_len() {
            return fail(Reason::GreMalformed);
        }
        Ok(p)
    }

    /// A view over a buffer of at least [`HEADER_LEN`] bytes, for writing a
    /// header: nothing is validated.
    pub(crate) fn new_unchecked(buf: T) -> Self {
        GrePacket { buf }
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buf
    }

    fn b(&self) -> &[u8] {
        self.buf.as_ref()
    }

    /// The flags and version word.
    pub fn flags(&self) -> u16 {
        read16(self.b(), field::FLAGS_VERSION)
    }

    /// Ethertype of the encapsulated packet.
    pub fn protocol(&self) -> u16 {
        read16(self.b(), field::PROTOCOL)
    }

    /// Header length, optional fields (checksum, key, sequence) included.
    pub fn header_len(&self) -> usize {
        let f = self.flags();
        let present = [flags::CHECKSUM, flags::KEY, flags::SEQUENCE]
            .iter()
            .filter(|&&bit| f & bit != 0)
            .count();
        HEADER_LEN + OPTIONAL_LEN * present
    }

    /// The encapsulated packet.
    pub fn payload(&self) -> &[u8] {
        &self.b()[self.header_len()..]
    }

    /// The key field, if the flags announce one (it follows the checksum
    /// field when that is present too).
    pub fn key(&self) -> Option<u32> {
        let f = self.flags();
        if f & flags::KEY == 0 {
            return None;
        }
        let at = HEADER_LEN
            + if f & flags::CHECKSUM != 0 {
                OPTIONAL_LEN
            } else {
                0
            };
        // `new_checked` made sure the optional fields are present.
        self.b()
            .get(at..at + OPTIONAL_LEN)
            .map(|k| u32::from_be_bytes([k[0], k[1], k[2], k[3]]))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> GrePacket<T> {
    /// Sets the flags and version word. Announcing optional fields changes
    /// the header length: re-check with [`GrePacket::new_checked`] (on
    /// [`GrePacket::into_inner`]) before reading the payload.
    pub fn set_flags(&mut self, value: u16) {
        write16(self.buf.as_mut(), field::FLAGS_VERSION, value);
    }

    /// Sets the ethertype of the encapsulated packet.
    pub fn set_protocol(&mut self, ethertype: u16) {
        write16(self.buf.as_mut(), field::PROTOCOL, ethertype);
    }
}

/// A GRE header to write: version 0, no checksum or sequence number, and
/// a key (RFC 2890) when one is given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GreRepr {
    /// Ethertype of the encapsulated packet.
    pub protocol: u16,
    /// The key field, if any.
    pub key: Option<u32>,
}

impl GreRepr {
    /// Header length [`GreRepr::emit`] writes: [`HEADER_LEN`], or
    /// [`KEYED_HEADER_LEN`] with a key.
    pub fn header_len(&self) -> usize {
        if self.key.is_some() {
            KEYED_HEADER_LEN
        } else {
            HEADER_LEN
        }
    }

    /// Writes the header at the start of `buf`, which must hold
    /// [`GreRepr::header_len`] bytes.
    #[inline(always)]
    pub fn emit(&self, buf: &mut [u8]) {
        let mut gre = GrePacket::new_unchecked(&mut *buf);
        gre.set_flags(if self.key.is_some() { flags::KEY } else { 0 });
        gre.set_protocol(self.protocol);
        if let Some(k) = self.key {
            buf[HEADER_LEN..KEYED_HEADER_LEN].copy_from_slice(&k.to_be_bytes());
        }
    }
}

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

/// Why a prefix cannot spread outer source addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PrefixError {
    /// Shorter than the family allows (too many addresses).
    #[error("/{len} is too short: use /{min} to /{max}")]
    TooShort {
        /// The length given.
        len: u8,
        /// The shortest allowed.
        min: u8,
        /// The longest allowed.
        max: u8,
    },
    /// Longer than the family's address.
    #[error("/{len} is longer than the address (at most /{max})")]
    TooLong {
        /// The length given.
        len: u8,
        /// The address length in bits.
        max: u8,
    },
    /// Bits set after the prefix length.
    #[error("host bits are set after /{len}: the prefix is {network}/{len}")]
    HostBits {
        /// The length given.
        len: u8,
        /// The address with its host bits cleared.
        network: std::net::IpAddr,
    },
}

/// The shortest IPv4 [`SourcePrefix`]: 65,536 addresses.
pub const MIN_PREFIX_LEN_V4: u8 = 16;
/// The shortest IPv6 [`SourcePrefix`]: the 64 host bits a flow hash fills.
pub const MIN_PREFIX_LEN_V6: u8 = 64;

/// A prefix the outer source address of each flow is taken from (as
/// Katran does): a backend's NIC spreads GRE over its receive queues by the
/// outer addresses alone, so one source address for every flow lands all of
/// them on one queue. A flow's source is the network address plus its flow
/// hash modulo the prefix's size: the same for every packet of the flow, on
/// every load balancer of a fleet (they share the hash).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourcePrefix {
    /// The network address, key form (IPv4-mapped for IPv4), as a number.
    net: u128,
    /// The host bits (the prefix's size minus one).
    host: u128,
    /// The prefix length (of the family's own address).
    len: u8,
}

impl SourcePrefix {
    /// A prefix of `addr` (its network address) and `len` bits: IPv4 /16
    /// to /32, IPv6 /64 to /128, no host bits set.
    pub fn new(addr: std::net::IpAddr, len: u8) -> std::result::Result<Self, PrefixError> {
        let (bits, min) = match addr {
            std::net::IpAddr::V4(_) => (32u8, MIN_PREFIX_LEN_V4),
            std::net::IpAddr::V6(_) => (128u8, MIN_PREFIX_LEN_V6),
        };
        if len > bits {
            return Err(PrefixError::TooLong { len, max: bits });
        }
        if len < min {
            return Err(PrefixError::TooShort {
                len,
                min,
                max: bits,
            });
        }
        let host_bits = u32::from(bits - len);
        let host = 1u128.checked_shl(host_bits).map_or(u128::MAX, |h| h - 1);
        let a = u128::from_be_bytes(crate::flow::from_ip(addr));
        if a & host != 0 {
            return Err(PrefixError::HostBits {
                len,
                network: crate::flow::to_ip(&(a & !host).to_be_bytes()),
            });
        }
        Ok(SourcePrefix { net: a, host, len })
    }

    /// An IPv4 prefix's network address and host bits as numbers (`None`
    /// for IPv6): the outer source of a flow is `net | (hash & host)`.
    pub fn v4_bits(&self) -> Option<(u32, u32)> {
        self.is_v4().then_some((self.net as u32, self.host as u32))
    }

    /// An IPv6 prefix's network address as four 32-bit words (the first
    /// holds the address's first bytes) and the host bits of the last two
    /// (`None` for IPv4): an IPv6 prefix is /64 or longer, so the host bits
    /// lie in those, and the outer source of a flow is the network with
    /// `hash >> 32` and `hash` (low 32 bits) masked into words 2 and 3.
    pub fn v6_bits(&self) -> Option<([u32; 4], [u32; 2])> {
        if self.is_v4() || self.host > u128::from(u64::MAX) {
            return None;
        }
        let w = |v: u128, i: u32| (v >> (96 - 32 * i)) as u32;
        Some((
            [
                w(self.net, 0),
                w(self.net, 1),
                w(self.net, 2),
                w(self.net, 3),
            ],
            [w(self.host, 2), w(self.host, 3)],
        ))
    }

    /// Whether the prefix is IPv4.
    pub fn is_v4(&self) -> bool {
        crate::flow::unmapped(&self.net.to_be_bytes()).is_some()
    }

    /// The prefix length.
    pub fn prefix_len(&self) -> u8 {
        self.len
    }

    /// Addresses in the prefix (saturating at `u64::MAX`).
    pub fn size(&self) -> u64 {
        u64::try_from(self.host).map_or(u64::MAX, |h| h.saturating_add(1))
    }

    /// Whether `addr` (key form) lies in the prefix.
    pub fn contains(&self, addr: &[u8; 16]) -> bool {
        u128::from_be_bytes(*addr) & !self.host == self.net
    }

    /// The outer source of the flow whose hash is `flow_hash` (key form):
    /// the network address plus the hash modulo the prefix's size.
    #[inline]
    pub fn pick(&self, flow_hash: u64) -> [u8; 16] {
        (self.net | (u128::from(flow_hash) & self.host)).to_be_bytes()
    }
}

/// Per-flow entropy in the outer headers (`[encap] source_prefix`): the
/// outer source taken from a prefix by the flow hash, and the flow hash in
/// the GRE key ([`Spread::key`]), so that a backend can spread flows over
/// its receive queues by the outer headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Spread {
    /// The prefix for IPv4 outer headers (none: the configured source).
    pub v4: Option<SourcePrefix>,
    /// The prefix for IPv6 outer headers (none: the configured source).
    pub v6: Option<SourcePrefix>,
}

impl Spread {
    /// The outer headers of a flow: `outer` with its source taken from the
    /// prefix of its family, if there is one.
    #[inline]
    pub fn outer(&self, outer: &Outer, flow_hash: u64) -> Outer {
        let prefix = if crate::flow::unmapped(&outer.dst).is_some() {
            self.v4
        } else {
            self.v6
        };
        let mut o = *outer;
        if let Some(p) = prefix {
            o.src = p.pick(flow_hash);
        }
        o
    }

    /// The GRE key of a flow: its hash's low 32 bits, never
    /// [`FRAGMENT_REDIRECT_KEY`] (whose last bit is flipped).
    #[inline]
    pub fn key(flow_hash: u64) -> u32 {
        let k = flow_hash as u32;
        if k == FRAGMENT_REDIRECT_KEY {
            k ^ 1
        } else {
            k
        }
    }
}

/// [`encapsulate`] with per-flow entropy ([`Spread`]): the outer source
/// from the flow's prefix, and the flow hash in a GRE key (4 bytes more:
/// [`overhead_keyed`]). The outer IPv4 header is emitted with the chosen
/// source, so its checksum costs nothing more than without a prefix.
pub fn encapsulate_spread(
    buf: &mut [u8],
    start: usize,
    p: &Parsed,
    outer: &Outer,
    flow_hash: u64,
    spread: &Spread,
) -> std::result::Result<std::ops::Range<usize>, EncapError> {
    encapsulate_keyed(
        buf,
        start,
        p,
        &spread.outer(outer, flow_hash),
        flow_hash,
        Some(Spread::key(flow_hash)),
    )
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
    crate::ethernet::HEADER_LEN
        + if outer_v4 {
            crate::ipv4::MIN_HEADER_LEN
        } else {
            crate::ipv6::HEADER_LEN
        }
        + HEADER_LEN
}

/// Bytes of outer headers (Ethernet, IP, GRE with a key) for an outer
/// family.
pub fn overhead_keyed(outer_v4: bool) -> usize {
    overhead(outer_v4) + OPTIONAL_LEN
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
    encapsulate_keyed(buf, start, p, outer, flow_hash, None)
}

/// [`encapsulate`], with a GRE key field (RFC 2890) when `key` is given
/// (4 more bytes of headroom: [`overhead_keyed`]).
pub fn encapsulate_keyed(
    buf: &mut [u8],
    start: usize,
    p: &Parsed,
    outer: &Outer,
    flow_hash: u64,
    key: Option<u32>,
) -> std::result::Result<std::ops::Range<usize>, EncapError> {
    let (src4, dst4) = (unmapped(&outer.src), unmapped(&outer.dst));
    let outer_v4 = match (src4.is_some(), dst4.is_some()) {
        (true, true) => true,
        (false, false) => false,
        _ => return Err(EncapError::MixedFamilies),
    };
    let inner_at = start + p.l3_offset;
    let gre_len = if key.is_some() {
        KEYED_HEADER_LEN
    } else {
        HEADER_LEN
    };
    let need = overhead(outer_v4) - HEADER_LEN + gre_len;
    if inner_at < need {
        return Err(EncapError::NoHeadroom {
            need,
            have: inner_at,
        });
    }
    let inner_len = p.l3_len;
    let ip_hl = need - crate::ethernet::HEADER_LEN - gre_len;
    if outer_v4 && ip_hl + gre_len + inner_len > 65_535 || !outer_v4 && gre_len + inner_len > 65_535
    {
        return Err(EncapError::TooBig);
    }
    let begin = inner_at - need;
    // IPv6 is never fragmented by routers; for IPv4 follow the inner DF.
    let dont_frag = p.l3 == L3::V6
        || buf
            .get(inner_at..inner_at + inner_len)
            .and_then(|ip| Ipv4Packet::new_checked(ip).ok())
            .is_some_and(|ip| ip.dont_frag());
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
            payload_len: gre_len + inner_len,
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
            upper_len: gre_len + inner_len,
        }
        .emit(ip);
    }
    GreRepr {
        protocol: if p.l3 == L3::V4 {
            ethertype::IPV4
        } else {
            ethertype::IPV6
        },
        key,
    }
    .emit(&mut hdr[need - gre_len..]);
    Ok(begin..inner_at + inner_len)
}

/// The outer headers toward one backend (Ethernet, IPv4 or IPv6, GRE
/// without a key), made once when the tables are built, so that a packet
/// is encapsulated by copying them whole and writing the few fields that
/// depend on it: the inner packet's length, TOS and DF bit (IPv4) or
/// traffic class and flow label (IPv6), and GRE's protocol. The IPv4
/// checksum is finished from the sum of the constant fields, which is
/// kept here. The bytes are exactly [`encapsulate`]'s for the same
/// [`Outer`] (a property test checks them against each other).
#[derive(Debug, Clone)]
pub struct Template {
    hdr: [u8; TEMPLATE_MAX],
    v4: bool,
    /// IPv4: the one's-complement sum of the IP header with its TOS,
    /// total length, flags and checksum zero.
    sum: u32,
}

/// The longest outer header a [`Template`] holds: Ethernet, IPv6, GRE.
const TEMPLATE_MAX: usize = crate::ethernet::HEADER_LEN + crate::ipv6::HEADER_LEN + HEADER_LEN;

impl Template {
    /// The outer headers toward `outer`; refused if its two addresses are
    /// of different families.
    pub fn new(outer: &Outer) -> std::result::Result<Template, EncapError> {
        let (src4, dst4) = (unmapped(&outer.src), unmapped(&outer.dst));
        let v4 = match (src4.is_some(), dst4.is_some()) {
            (true, true) => true,
            (false, false) => false,
            _ => return Err(EncapError::MixedFamilies),
        };
        let mut hdr = [0u8; TEMPLATE_MAX];
        let len = overhead(v4);
        EthernetRepr {
            dst: outer.eth_dst,
            src: outer.eth_src,
            vlan: None,
            ethertype: if v4 { ethertype::IPV4 } else { ethertype::IPV6 },
        }
        .emit(&mut hdr[..len]);
        let ip = &mut hdr[crate::ethernet::HEADER_LEN..len];
        let mut sum = 0;
        if let (Some(s), Some(d)) = (src4, dst4) {
            Ipv4Repr {
                src: s,
                dst: d,
                protocol: proto::GRE,
                ttl: outer.ttl,
                tos: 0,
                ident: 0,
                dont_frag: false,
                more_frags: false,
                frag_offset: 0,
                options: Vec::new(),
                payload_len: 0,
            }
            .emit(ip);
            // Total length and checksum as zero: the packet's are added.
            ip[2..4].fill(0);
            ip[10..12].fill(0);
            sum = crate::checksum::sum(0, &ip[..crate::ipv4::MIN_HEADER_LEN]);
        } else {
            Ipv6Repr {
                src: outer.src,
                dst: outer.dst,
                traffic_class: 0,
                flow_label: 0,
                hop_limit: outer.ttl,
                extensions: Vec::new(),
                protocol: proto::GRE,
                upper_len: 0,
            }
            .emit(ip);
        }
        GreRepr {
            protocol: 0,
            key: None,
        }
        .emit(&mut hdr[len - HEADER_LEN..len]);
        Ok(Template { hdr, v4, sum })
    }

    /// Whether the outer header is IPv4.
    pub fn is_v4(&self) -> bool {
        self.v4
    }
}

/// [`encapsulate`] with the outer headers of a [`Template`]: the same
/// bytes, without building and checksumming them for every packet.
#[inline]
pub fn encapsulate_templated(
    buf: &mut [u8],
    start: usize,
    p: &Parsed,
    t: &Template,
    flow_hash: u64,
) -> std::result::Result<std::ops::Range<usize>, EncapError> {
    let need = overhead(t.v4);
    let inner_at = start + p.l3_offset;
    if inner_at < need {
        return Err(EncapError::NoHeadroom {
            need,
            have: inner_at,
        });
    }
    let inner_len = p.l3_len;
    let ip_len = need - crate::ethernet::HEADER_LEN;
    // The outer IP's payload (or, for IPv4, whole packet) fits 16 bits.
    let length = if t.v4 { ip_len } else { HEADER_LEN } + inner_len;
    if length > 65_535 {
        return Err(EncapError::TooBig);
    }
    let end = inner_at + inner_len;
    if end > buf.len() {
        // A parse of this very frame would not have said so; refused
        // rather than trusted.
        return Err(EncapError::TooBig);
    }
    let inner_type = if p.l3 == L3::V4 {
        ethertype::IPV4
    } else {
        ethertype::IPV6
    };
    let begin = inner_at - need;
    // The inner IPv4 header was parsed into `p` (at least 20 octets at
    // `inner_at`): its DF bit is read where it lies, not parsed again.
    let dont_frag = p.l3 == L3::V6 || buf.get(inner_at + 6).is_some_and(|f| f & 0x40 != 0);
    let hdr = &mut buf[begin..inner_at];
    hdr.copy_from_slice(&t.hdr[..need]);
    let ip = &mut hdr[crate::ethernet::HEADER_LEN..];
    if t.v4 {
        let flags: u16 = if dont_frag { 0x4000 } else { 0 };
        ip[1] = p.tos;
        ip[2..4].copy_from_slice(&(length as u16).to_be_bytes());
        ip[6..8].copy_from_slice(&flags.to_be_bytes());
        let sum = t.sum + u32::from(p.tos) + length as u32 + u32::from(flags);
        ip[10..12].copy_from_slice(&crate::checksum::finish(sum).to_be_bytes());
    } else {
        let first = 6u32 << 28 | u32::from(p.tos) << 20 | (flow_hash & 0x000f_ffff) as u32;
        ip[0..4].copy_from_slice(&first.to_be_bytes());
        ip[4..6].copy_from_slice(&(length as u16).to_be_bytes());
    }
    hdr[need - 2..need].copy_from_slice(&inner_type.to_be_bytes());
    Ok(begin..end)
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
    /// The GRE key, if the header carries one.
    pub key: Option<u32>,
}

/// Finds the inner packet of an Ethernet/IP/GRE frame. Checksum and
/// sequence fields are skipped, the key is read; routing (RFC 1701) and versions other than
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
    let g = GrePacket::new_checked(&frame[gre_at..end])?;
    Ok(Decapsulated {
        inner: gre_at + g.header_len()..end,
        ethertype: g.protocol(),
        outer_src,
        outer_dst,
        key: g.key(),
    })
}
