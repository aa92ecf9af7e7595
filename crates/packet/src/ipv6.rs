//! IPv6 headers and the extension-header chain, including the fragment header.

use crate::{be16, be32, fail, proto, put16, put32, Reason, Result};

/// Length of the fixed IPv6 header.
pub const HEADER_LEN: usize = 40;
/// Most extension headers walked before giving up (RFC 8200 allows any
/// number; a forwarder must bound its work per packet).
pub const MAX_EXTENSIONS: usize = 8;

/// A checked view of an IPv6 packet: version and payload length are
/// consistent with the buffer.
#[derive(Debug, Clone)]
pub struct Ipv6Packet<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> Ipv6Packet<T> {
    /// Validates the fixed header.
    pub fn new_checked(buf: T) -> Result<Self> {
        let b = buf.as_ref();
        if b.len() < HEADER_LEN {
            return fail(Reason::Ipv6Truncated);
        }
        if b[0] >> 4 != 6 {
            return fail(Reason::Ipv6BadVersion);
        }
        if HEADER_LEN + usize::from(be16(b, 4)) > b.len() {
            return fail(Reason::Ipv6BadPayloadLength);
        }
        Ok(Ipv6Packet { buf })
    }

    fn b(&self) -> &[u8] {
        self.buf.as_ref()
    }

    /// Traffic class (DSCP << 2 | ECN).
    pub fn traffic_class(&self) -> u8 {
        let b = self.b();
        (b[0] << 4) | (b[1] >> 4)
    }

    /// Flow label (20 bits).
    pub fn flow_label(&self) -> u32 {
        be32(self.b(), 0) & 0x000f_ffff
    }

    /// Payload length (extension headers included).
    pub fn payload_len(&self) -> usize {
        usize::from(be16(self.b(), 4))
    }

    /// The first next-header value.
    pub fn next_header(&self) -> u8 {
        self.b()[6]
    }

    /// Hop limit.
    pub fn hop_limit(&self) -> u8 {
        self.b()[7]
    }

    /// Source address.
    pub fn src(&self) -> [u8; 16] {
        let mut a = [0; 16];
        a.copy_from_slice(&self.b()[8..24]);
        a
    }

    /// Destination address.
    pub fn dst(&self) -> [u8; 16] {
        let mut a = [0; 16];
        a.copy_from_slice(&self.b()[24..40]);
        a
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
            proto::HOPOPT | proto::ROUTING | proto::DSTOPTS => {
                if payload.len() < off + 2 {
                    return fail(Reason::Ipv6ExtensionTruncated);
                }
                (usize::from(payload[off + 1]) + 1) * 8
            }
            proto::AH => {
                if payload.len() < off + 2 {
                    return fail(Reason::Ipv6ExtensionTruncated);
                }
                (usize::from(payload[off + 1]) + 2) * 4
            }
            proto::FRAGMENT => 8,
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
            let f = Fragment {
                offset: be16(h, 2) & 0xfff8,
                more: h[3] & 1 != 0,
                ident: be32(h, 4),
            };
            fragment = Some(f);
            if f.offset != 0 {
                // A non-first fragment: what follows is data, not headers.
                return Ok(Chain {
                    protocol: h[0],
                    offset: off + len,
                    fragment,
                });
            }
        }
        next = h[0];
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
            | Extension::Authentication(d) => 2 + d.len(),
            Extension::Fragment(_) => 8,
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
            let (ext, len) = match next {
                proto::FRAGMENT => {
                    let f = Fragment {
                        offset: be16(pl, off + 2) & 0xfff8,
                        more: pl[off + 3] & 1 != 0,
                        ident: be32(pl, off + 4),
                    };
                    (Extension::Fragment(f), 8)
                }
                proto::AH => {
                    let len = (usize::from(pl[off + 1]) + 2) * 4;
                    (
                        Extension::Authentication(pl[off + 2..off + len].to_vec()),
                        len,
                    )
                }
                code => {
                    let len = (usize::from(pl[off + 1]) + 1) * 8;
                    let data = pl[off + 2..off + len].to_vec();
                    let e = match code {
                        proto::HOPOPT => Extension::HopByHop(data),
                        proto::DSTOPTS => Extension::DestinationOptions(data),
                        // walk() stops at anything that is not an extension.
                        _ => Extension::Routing(data),
                    };
                    (e, len)
                }
            };
            next = pl[off];
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
        put32(
            buf,
            0,
            (6 << 28) | (u32::from(self.traffic_class) << 20) | (self.flow_label & 0x000f_ffff),
        );
        put16(buf, 4, (ext_len + self.upper_len) as u16);
        buf[6] = self
            .extensions
            .first()
            .map_or(self.protocol, Extension::code);
        buf[7] = self.hop_limit;
        buf[8..24].copy_from_slice(&self.src);
        buf[24..40].copy_from_slice(&self.dst);
        let mut off = HEADER_LEN;
        for (i, e) in self.extensions.iter().enumerate() {
            let next = self
                .extensions
                .get(i + 1)
                .map_or(self.protocol, Extension::code);
            buf[off] = next;
            match e {
                Extension::Fragment(f) => {
                    buf[off + 1] = 0;
                    put16(buf, off + 2, (f.offset & 0xfff8) | u16::from(f.more));
                    put32(buf, off + 4, f.ident);
                }
                Extension::Authentication(d) => {
                    buf[off + 1] = ((2 + d.len()) / 4 - 2) as u8;
                    buf[off + 2..off + 2 + d.len()].copy_from_slice(d);
                }
                Extension::HopByHop(d)
                | Extension::DestinationOptions(d)
                | Extension::Routing(d) => {
                    buf[off + 1] = ((2 + d.len()) / 8 - 1) as u8;
                    buf[off + 2..off + 2 + d.len()].copy_from_slice(d);
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
