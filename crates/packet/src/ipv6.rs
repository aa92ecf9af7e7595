//! IPv6 headers and the extension-header chain, including the fragment header.

use crate::{fail, proto, read16, read32, read_array, write16, write32, Reason, Result};

/// Where each field of the fixed IPv6 header lies.
pub mod field {
    use crate::Field;

    /// Version (4 bits), traffic class (8 bits) and flow label (20 bits).
    pub const VER_TC_FLOW: Field = 0..4;
    /// Payload length (extension headers included).
    pub const LENGTH: Field = 4..6;
    /// The first next-header value.
    pub const NXT_HDR: usize = 6;
    /// Hop limit.
    pub const HOP_LIMIT: usize = 7;
    /// Source address.
    pub const SRC_ADDR: Field = 8..24;
    /// Destination address.
    pub const DST_ADDR: Field = 24..40;
}

/// Where each field lies in the extension headers that share the generic
/// layout: hop-by-hop, routing, destination options and authentication.
pub mod ext_field {
    /// The next header after this one.
    pub const NXT_HDR: usize = 0;
    /// Length, in 8-byte units not counting the first (in 4-byte units not
    /// counting the first two, for the authentication header).
    pub const LENGTH: usize = 1;
    /// Where the header's own data starts.
    pub const DATA: usize = 2;
}

/// Where each field of the fragment extension header lies.
pub mod frag_field {
    use crate::Field;

    /// The next header after this one.
    pub const NXT_HDR: usize = 0;
    /// Reserved; zero.
    pub const RESERVED: usize = 1;
    /// Fragment offset (high 13 bits, in 8-byte units, so the mask
    /// [`super::FRAG_OFFSET_MASK`] gives bytes) and the more-fragments flag
    /// (low bit).
    pub const OFF_M: Field = 2..4;
    /// Identification.
    pub const IDENT: Field = 4..8;
}

// Every extension header, the fragment header included, starts with its
// next header: the chain walk reads it the same way for all of them.
const _: () = assert!(ext_field::NXT_HDR == frag_field::NXT_HDR);

/// Length of the fixed IPv6 header.
pub const HEADER_LEN: usize = field::DST_ADDR.end;
/// Length of a fragment extension header.
pub const FRAGMENT_LEN: usize = frag_field::IDENT.end;
/// The offset bits of [`frag_field::OFF_M`], read as bytes.
pub const FRAG_OFFSET_MASK: u16 = 0xfff8;
/// The more-fragments bit of [`frag_field::OFF_M`].
pub const FRAG_MORE: u16 = 0x0001;
/// Most extension headers walked before giving up (RFC 8200 allows any
/// number; a forwarder must bound its work per packet).
pub const MAX_EXTENSIONS: usize = 8;

/// The version field's place in [`field::VER_TC_FLOW`].
const VERSION_SHIFT: u32 = 28;
/// The traffic class's place in [`field::VER_TC_FLOW`].
const TC_SHIFT: u32 = 20;
/// The flow label's bits in [`field::VER_TC_FLOW`].
const FLOW_MASK: u32 = 0x000f_ffff;

/// A checked view of an IPv6 packet: version and payload length are
/// consistent with the buffer.
///
/// Setters write fields as given. After [`Ipv6Packet::set_payload_len`] the
/// length may no longer fit the buffer: re-check with
/// [`Ipv6Packet::new_checked`] (on [`Ipv6Packet::into_inner`]) before reading
/// the payload.
#[derive(Debug, Clone)]
pub struct Ipv6Packet<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> Ipv6Packet<T> {
    /// Validates the fixed header.
    pub fn new_checked(buf: T) -> Result<Self> {
        if buf.as_ref().len() < HEADER_LEN {
            return fail(Reason::Ipv6Truncated);
        }
        let p = Ipv6Packet { buf };
        if p.version() != 6 {
            return fail(Reason::Ipv6BadVersion);
        }
        if HEADER_LEN + p.payload_len() > p.b().len() {
            return fail(Reason::Ipv6BadPayloadLength);
        }
        Ok(p)
    }

    /// A view over a buffer of at least [`HEADER_LEN`] bytes, for writing a
    /// header: nothing is validated.
    pub(crate) fn new_unchecked(buf: T) -> Self {
        Ipv6Packet { buf }
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buf
    }

    fn b(&self) -> &[u8] {
        self.buf.as_ref()
    }

    fn ver_tc_flow(&self) -> u32 {
        read32(self.b(), field::VER_TC_FLOW)
    }

    /// IP version (6 for a checked packet).
    pub fn version(&self) -> u8 {
        (self.ver_tc_flow() >> VERSION_SHIFT) as u8
    }

    /// Traffic class (DSCP << 2 | ECN).
    pub fn traffic_class(&self) -> u8 {
        (self.ver_tc_flow() >> TC_SHIFT) as u8
    }

    /// Flow label (20 bits).
    pub fn flow_label(&self) -> u32 {
        self.ver_tc_flow() & FLOW_MASK
    }

    /// Payload length (extension headers included).
    pub fn payload_len(&self) -> usize {
        usize::from(read16(self.b(), field::LENGTH))
    }

    /// The first next-header value.
    pub fn next_header(&self) -> u8 {
        self.b()[field::NXT_HDR]
    }

    /// Hop limit.
    pub fn hop_limit(&self) -> u8 {
        self.b()[field::HOP_LIMIT]
    }

    /// Source address.
    pub fn src(&self) -> [u8; 16] {
        read_array(self.b(), field::SRC_ADDR)
    }

    /// Destination address.
    pub fn dst(&self) -> [u8; 16] {
        read_array(self.b(), field::DST_ADDR)
    }

    /// The payload (extension headers and upper layer), without padding.
    pub fn payload(&self) -> &[u8] {
        &self.b()[HEADER_LEN..HEADER_LEN + self.payload_len()]
    }

    /// Walks the extension headers.
    pub fn extensions(&self) -> Result<Chain> {
        walk(self.next_header(), self.payload())
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv6Packet<T> {
    fn b_mut(&mut self) -> &mut [u8] {
        self.buf.as_mut()
    }

    fn set_ver_tc_flow(&mut self, keep: u32, value: u32) {
        let v = (self.ver_tc_flow() & keep) | value;
        write32(self.b_mut(), field::VER_TC_FLOW, v);
    }

    /// Sets the version (the high 4 bits).
    pub fn set_version(&mut self, version: u8) {
        self.set_ver_tc_flow(
            !(0xf << VERSION_SHIFT),
            u32::from(version & 0xf) << VERSION_SHIFT,
        );
    }

    /// Sets the traffic class (DSCP << 2 | ECN).
    pub fn set_traffic_class(&mut self, tc: u8) {
        self.set_ver_tc_flow(!(0xff << TC_SHIFT), u32::from(tc) << TC_SHIFT);
    }

    /// Sets the flow label (its low 20 bits).
    pub fn set_flow_label(&mut self, label: u32) {
        self.set_ver_tc_flow(!FLOW_MASK, label & FLOW_MASK);
    }

    /// Sets the payload length (extension headers included).
    pub fn set_payload_len(&mut self, len: u16) {
        write16(self.b_mut(), field::LENGTH, len);
    }

    /// Sets the first next-header value.
    pub fn set_next_header(&mut self, next: u8) {
        self.b_mut()[field::NXT_HDR] = next;
    }

    /// Sets the hop limit.
    pub fn set_hop_limit(&mut self, hop_limit: u8) {
        self.b_mut()[field::HOP_LIMIT] = hop_limit;
    }

    /// Sets the source address.
    pub fn set_src(&mut self, addr: [u8; 16]) {
        self.b_mut()[field::SRC_ADDR].copy_from_slice(&addr);
    }

    /// Sets the destination address.
    pub fn set_dst(&mut self, addr: [u8; 16]) {
        self.b_mut()[field::DST_ADDR].copy_from_slice(&addr);
    }

    /// The payload (extension headers and upper layer), writable.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let end = HEADER_LEN + self.payload_len();
        &mut self.b_mut()[HEADER_LEN..end]
    }
}

/// Bytes of an extension header of type `code` (one that [`walk`] walks)
/// whose [`ext_field::LENGTH`] byte is `len`.
fn ext_len(code: u8, len: u8) -> usize {
    match code {
        proto::FRAGMENT => FRAGMENT_LEN,
        proto::AH => (usize::from(len) + 2) * 4,
        _ => (usize::from(len) + 1) * 8,
    }
}

/// The [`ext_field::LENGTH`] byte of an extension header of type `code`
/// and `total` bytes: the inverse of [`ext_len`].
fn ext_len_byte(code: u8, total: usize) -> u8 {
    match code {
        proto::FRAGMENT => 0,
        proto::AH => (total / 4 - 2) as u8,
        _ => (total / 8 - 1) as u8,
    }
}

/// What a fragment header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fragment {
    /// Offset of this fragment's data in bytes.
    pub offset: u16,
    /// More fragments follow.
    pub more: bool,
    /// Identification.
    pub ident: u32,
}

impl Fragment {
    /// Reads a fragment header (`h` holds at least [`FRAGMENT_LEN`] bytes).
    fn read(h: &[u8]) -> Self {
        let off_m = read16(h, frag_field::OFF_M);
        Fragment {
            offset: off_m & FRAG_OFFSET_MASK,
            more: off_m & FRAG_MORE != 0,
            ident: read32(h, frag_field::IDENT),
        }
    }

    /// Writes a fragment header after its next-header byte (`h` holds at
    /// least [`FRAGMENT_LEN`] bytes).
    fn write(&self, h: &mut [u8]) {
        h[frag_field::RESERVED] = 0;
        write16(
            h,
            frag_field::OFF_M,
            (self.offset & FRAG_OFFSET_MASK) | if self.more { FRAG_MORE } else { 0 },
        );
        write32(h, frag_field::IDENT, self.ident);
    }
}

/// The result of walking an extension-header chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chain {
    /// The upper-layer protocol (or the fragment's next header for a
    /// non-first fragment, whose upper-layer header is elsewhere).
    pub protocol: u8,
    /// Offset of the upper-layer header from the start of the IPv6 payload.
    pub offset: usize,
    /// The fragment header, if any.
    pub fragment: Option<Fragment>,
}

/// Walks extension headers starting with `next` over `payload`.
pub fn walk(mut next: u8, payload: &[u8]) -> Result<Chain> {
    let mut off = 0usize;
    let mut fragment = None;
    for _ in 0..=MAX_EXTENSIONS {
        let len = match next {
            proto::HOPOPT | proto::ROUTING | proto::DSTOPTS | proto::AH => {
                match payload.get(off + ext_field::LENGTH) {
                    Some(&len) => ext_len(next, len),
                    None => return fail(Reason::Ipv6ExtensionTruncated),
                }
            }
            proto::FRAGMENT => FRAGMENT_LEN,
            _ => {
                return Ok(Chain {
                    protocol: next,
                    offset: off,
                    fragment,
                })
            }
        };
        if payload.len() < off + len {
            return fail(Reason::Ipv6ExtensionTruncated);
        }
        let h = &payload[off..off + len];
        if next == proto::FRAGMENT {
            let f = Fragment::read(h);
            fragment = Some(f);
            if f.offset != 0 {
                // A non-first fragment: what follows is data, not headers.
                return Ok(Chain {
                    protocol: h[frag_field::NXT_HDR],
                    offset: off + len,
                    fragment,
                });
            }
        }
        next = h[ext_field::NXT_HDR];
        off += len;
    }
    fail(Reason::Ipv6TooManyExtensions)
}

/// One extension header, for building and round-tripping packets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Extension {
    /// Hop-by-hop options: the option bytes after the 2-byte prefix
    /// (length 6 + 8k).
    HopByHop(Vec<u8>),
    /// Destination options, likewise.
    DestinationOptions(Vec<u8>),
    /// Routing header, likewise (type and segments left included).
    Routing(Vec<u8>),
    /// Authentication header: the bytes after the 2-byte prefix
    /// (length 2 + 4k, at least 10).
    Authentication(Vec<u8>),
    /// Fragment header.
    Fragment(Fragment),
}

impl Extension {
    fn code(&self) -> u8 {
        match self {
            Extension::HopByHop(_) => proto::HOPOPT,
            Extension::DestinationOptions(_) => proto::DSTOPTS,
            Extension::Routing(_) => proto::ROUTING,
            Extension::Authentication(_) => proto::AH,
            Extension::Fragment(_) => proto::FRAGMENT,
        }
    }

    fn len(&self) -> usize {
        match self {
            Extension::HopByHop(d)
            | Extension::DestinationOptions(d)
            | Extension::Routing(d)
            | Extension::Authentication(d) => ext_field::DATA + d.len(),
            Extension::Fragment(_) => FRAGMENT_LEN,
        }
    }
}

/// A parsed IPv6 header with its extension headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ipv6Repr {
    /// Source address.
    pub src: [u8; 16],
    /// Destination address.
    pub dst: [u8; 16],
    /// Traffic class.
    pub traffic_class: u8,
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Hop limit.
    pub hop_limit: u8,
    /// Extension headers, in order.
    pub extensions: Vec<Extension>,
    /// The protocol after the last extension header.
    pub protocol: u8,
    /// Bytes after the extension headers.
    pub upper_len: usize,
}

impl Ipv6Repr {
    /// Reads a checked packet, walking its extension headers. A non-first
    /// fragment's chain ends at the fragment header.
    pub fn parse<T: AsRef<[u8]>>(p: &Ipv6Packet<T>) -> Result<Self> {
        let chain = p.extensions()?;
        let pl = p.payload();
        let mut extensions = Vec::new();
        let (mut next, mut off) = (p.next_header(), 0usize);
        while off < chain.offset {
            // The walk above validated every length on this path.
            let h = &pl[off..];
            let len = ext_len(next, h[ext_field::LENGTH]);
            let data = || h[ext_field::DATA..len].to_vec();
            let ext = match next {
                proto::FRAGMENT => Extension::Fragment(Fragment::read(h)),
                proto::AH => Extension::Authentication(data()),
                proto::HOPOPT => Extension::HopByHop(data()),
                proto::DSTOPTS => Extension::DestinationOptions(data()),
                // walk() stops at anything that is not an extension.
                _ => Extension::Routing(data()),
            };
            next = h[ext_field::NXT_HDR];
            extensions.push(ext);
            off += len;
        }
        Ok(Ipv6Repr {
            src: p.src(),
            dst: p.dst(),
            traffic_class: p.traffic_class(),
            flow_label: p.flow_label(),
            hop_limit: p.hop_limit(),
            extensions,
            protocol: chain.protocol,
            upper_len: p.payload_len() - chain.offset,
        })
    }

    /// Bytes of header and extensions [`Ipv6Repr::emit`] writes.
    pub fn header_len(&self) -> usize {
        HEADER_LEN + self.extensions.iter().map(Extension::len).sum::<usize>()
    }

    /// Writes the fixed header and extensions at the start of `buf`.
    /// Generic extension data must be 6 + 8k bytes long.
    pub fn emit(&self, buf: &mut [u8]) {
        let ext_len = self.header_len() - HEADER_LEN;
        let mut p = Ipv6Packet::new_unchecked(&mut *buf);
        p.set_version(6);
        p.set_traffic_class(self.traffic_class);
        p.set_flow_label(self.flow_label);
        p.set_payload_len((ext_len + self.upper_len) as u16);
        p.set_next_header(
            self.extensions
                .first()
                .map_or(self.protocol, Extension::code),
        );
        p.set_hop_limit(self.hop_limit);
        p.set_src(self.src);
        p.set_dst(self.dst);
        let mut off = HEADER_LEN;
        for (i, e) in self.extensions.iter().enumerate() {
            let next = self
                .extensions
                .get(i + 1)
                .map_or(self.protocol, Extension::code);
            let h = &mut buf[off..off + e.len()];
            h[ext_field::NXT_HDR] = next;
            match e {
                Extension::Fragment(f) => f.write(h),
                Extension::Authentication(d)
                | Extension::HopByHop(d)
                | Extension::DestinationOptions(d)
                | Extension::Routing(d) => {
                    h[ext_field::LENGTH] = ext_len_byte(e.code(), e.len());
                    h[ext_field::DATA..].copy_from_slice(d);
                }
            }
            off += e.len();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_with_fragment() {
        let r = Ipv6Repr {
            src: [1; 16],
            dst: [2; 16],
            traffic_class: 0x2e,
            flow_label: 0xabcde,
            hop_limit: 9,
            extensions: vec![
                Extension::HopByHop(vec![1, 4, 0, 0, 0, 0]),
                Extension::Fragment(Fragment {
                    offset: 0,
                    more: true,
                    ident: 77,
                }),
            ],
            protocol: proto::UDP,
            upper_len: 16,
        };
        let mut b = vec![0u8; r.header_len() + 16];
        r.emit(&mut b);
        let p = Ipv6Packet::new_checked(&b[..]).unwrap();
        let c = p.extensions().unwrap();
        assert_eq!((c.protocol, c.offset), (proto::UDP, 16));
        assert_eq!(c.fragment.unwrap().ident, 77);
        assert_eq!(Ipv6Repr::parse(&p).unwrap(), r);
        // Truncating the payload length cuts the chain.
        b[5] = 10;
        let p = Ipv6Packet::new_checked(&b[..]).unwrap();
        assert_eq!(
            p.extensions().unwrap_err().0,
            Reason::Ipv6ExtensionTruncated
        );
    }

    #[test]
    fn endless_chain_is_bounded() {
        // 10 destination-options headers of 8 bytes each.
        let mut pl = Vec::new();
        for _ in 0..10 {
            pl.extend_from_slice(&[proto::DSTOPTS, 0, 1, 4, 0, 0, 0, 0]);
        }
        assert_eq!(
            walk(proto::DSTOPTS, &pl).unwrap_err().0,
            Reason::Ipv6TooManyExtensions
        );
    }
}
