//! IPv4 headers, with options and fragments.

use crate::{be16, checksum, fail, put16, Reason, Result};

/// Length of an IPv4 header without options.
pub const MIN_HEADER_LEN: usize = 20;

/// A checked view of an IPv4 packet: version, header length and total length
/// are consistent with the buffer (which may carry trailing padding, as
/// short Ethernet frames do).
#[derive(Debug, Clone)]
pub struct Ipv4Packet<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> Ipv4Packet<T> {
    /// Validates lengths and version. The header checksum is checked
    /// separately ([`Ipv4Packet::checksum_ok`]).
    pub fn new_checked(buf: T) -> Result<Self> {
        let b = buf.as_ref();
        if b.len() < MIN_HEADER_LEN {
            return fail(Reason::Ipv4Truncated);
        }
        if b[0] >> 4 != 4 {
            return fail(Reason::Ipv4BadVersion);
        }
        let hl = usize::from(b[0] & 0x0f) * 4;
        if hl < MIN_HEADER_LEN || hl > b.len() {
            return fail(Reason::Ipv4BadHeaderLength);
        }
        let total = usize::from(be16(b, 2));
        if total < hl || total > b.len() {
            return fail(Reason::Ipv4BadTotalLength);
        }
        let p = Ipv4Packet { buf };
        if p.frag_offset() as usize + (total - hl) > 65_535 {
            return fail(Reason::BadFragment);
        }
        Ok(p)
    }

    fn b(&self) -> &[u8] {
        self.buf.as_ref()
    }

    /// Header length in bytes.
    pub fn header_len(&self) -> usize {
        usize::from(self.b()[0] & 0x0f) * 4
    }

    /// The type-of-service byte (DSCP << 2 | ECN).
    pub fn tos(&self) -> u8 {
        self.b()[1]
    }

    /// Total length (header and payload).
    pub fn total_len(&self) -> usize {
        usize::from(be16(self.b(), 2))
    }

    /// Identification.
    pub fn ident(&self) -> u16 {
        be16(self.b(), 4)
    }

    /// Don't-fragment flag.
    pub fn dont_frag(&self) -> bool {
        self.b()[6] & 0x40 != 0
    }

    /// More-fragments flag.
    pub fn more_frags(&self) -> bool {
        self.b()[6] & 0x20 != 0
    }

    /// Fragment offset in bytes.
    pub fn frag_offset(&self) -> u16 {
        (be16(self.b(), 6) & 0x1fff) << 3
    }

    /// Whether this is a fragment (first or not).
    pub fn is_fragment(&self) -> bool {
        self.more_frags() || self.frag_offset() != 0
    }

    /// Time to live.
    pub fn ttl(&self) -> u8 {
        self.b()[8]
    }

    /// Payload protocol.
    pub fn protocol(&self) -> u8 {
        self.b()[9]
    }

    /// Source address.
    pub fn src(&self) -> [u8; 4] {
        let b = self.b();
        [b[12], b[13], b[14], b[15]]
    }

    /// Destination address.
    pub fn dst(&self) -> [u8; 4] {
        let b = self.b();
        [b[16], b[17], b[18], b[19]]
    }

    /// Whether the header checksum verifies.
    pub fn checksum_ok(&self) -> bool {
        checksum::checksum(&self.b()[..self.header_len()]) == 0
    }

    /// Options bytes (between the fixed header and the payload).
    pub fn options(&self) -> &[u8] {
        &self.b()[MIN_HEADER_LEN..self.header_len()]
    }

    /// Payload (up to the total length, excluding trailing padding).
    pub fn payload(&self) -> &[u8] {
        &self.b()[self.header_len()..self.total_len()]
    }
}

/// A parsed IPv4 header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ipv4Repr {
    /// Source address.
    pub src: [u8; 4],
    /// Destination address.
    pub dst: [u8; 4],
    /// Payload protocol.
    pub protocol: u8,
    /// Time to live.
    pub ttl: u8,
    /// Type-of-service byte (DSCP and ECN).
    pub tos: u8,
    /// Identification.
    pub ident: u16,
    /// Don't-fragment flag.
    pub dont_frag: bool,
    /// More-fragments flag.
    pub more_frags: bool,
    /// Fragment offset in bytes (a multiple of 8).
    pub frag_offset: u16,
    /// Options, a multiple of 4 bytes, at most 40.
    pub options: Vec<u8>,
    /// Payload length.
    pub payload_len: usize,
}

impl Ipv4Repr {
    /// Reads a checked packet.
    pub fn parse<T: AsRef<[u8]>>(p: &Ipv4Packet<T>) -> Self {
        Ipv4Repr {
            src: p.src(),
            dst: p.dst(),
            protocol: p.protocol(),
            ttl: p.ttl(),
            tos: p.tos(),
            ident: p.ident(),
            dont_frag: p.dont_frag(),
            more_frags: p.more_frags(),
            frag_offset: p.frag_offset(),
            options: p.options().to_vec(),
            payload_len: p.total_len() - p.header_len(),
        }
    }

    /// Header length [`Ipv4Repr::emit`] writes.
    pub fn header_len(&self) -> usize {
        MIN_HEADER_LEN + self.options.len()
    }

    /// Writes the header, checksum included, at the start of `buf`.
    /// `buf` must hold [`Ipv4Repr::header_len`] bytes; options must be a
    /// multiple of 4 bytes and at most 40.
    pub fn emit(&self, buf: &mut [u8]) {
        let hl = self.header_len();
        debug_assert!(self.options.len().is_multiple_of(4) && self.options.len() <= 40);
        buf[0] = 0x40 | (hl / 4) as u8;
        buf[1] = self.tos;
        put16(buf, 2, (hl + self.payload_len) as u16);
        put16(buf, 4, self.ident);
        let flags = (u16::from(self.dont_frag) << 14) | (u16::from(self.more_frags) << 13);
        put16(buf, 6, flags | (self.frag_offset >> 3));
        buf[8] = self.ttl;
        buf[9] = self.protocol;
        put16(buf, 10, 0);
        buf[12..16].copy_from_slice(&self.src);
        buf[16..20].copy_from_slice(&self.dst);
        buf[20..hl].copy_from_slice(&self.options);
        let c = checksum::checksum(&buf[..hl]);
        put16(buf, 10, c);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repr() -> Ipv4Repr {
        Ipv4Repr {
            src: [10, 0, 0, 1],
            dst: [10, 0, 0, 2],
            protocol: 17,
            ttl: 64,
            tos: 0xb8,
            ident: 7,
            dont_frag: false,
            more_frags: true,
            frag_offset: 1480,
            options: vec![1, 1, 1, 0],
            payload_len: 8,
        }
    }

    #[test]
    fn round_trip_and_checks() {
        let r = repr();
        let mut b = vec![0u8; r.header_len() + 8 + 6]; // 6 bytes of padding
        r.emit(&mut b);
        let p = Ipv4Packet::new_checked(&b[..]).unwrap();
        assert!(p.checksum_ok() && p.is_fragment());
        assert_eq!(Ipv4Repr::parse(&p), r);
        assert_eq!(p.payload().len(), 8);
        let mut bad = b.clone();
        bad[0] = 0x65;
        assert_eq!(
            Ipv4Packet::new_checked(&bad[..]).unwrap_err().0,
            Reason::Ipv4BadVersion
        );
        bad[0] = 0x44;
        assert_eq!(
            Ipv4Packet::new_checked(&bad[..]).unwrap_err().0,
            Reason::Ipv4BadHeaderLength
        );
        bad[0] = 0x4f; // 60-byte header, longer than the 38-byte buffer
        assert_eq!(
            Ipv4Packet::new_checked(&bad[..]).unwrap_err().0,
            Reason::Ipv4BadHeaderLength
        );
        let mut bad = b.clone();
        bad[3] = 200;
        assert_eq!(
            Ipv4Packet::new_checked(&bad[..]).unwrap_err().0,
            Reason::Ipv4BadTotalLength
        );
        let mut bad = b.clone();
        bad[8] ^= 1;
        assert!(!Ipv4Packet::new_checked(&bad[..]).unwrap().checksum_ok());
        // Offset 65528 + 8 bytes of payload passes 65535.
        let mut r2 = repr();
        r2.frag_offset = 65_528;
        let mut b = vec![0u8; r2.header_len() + 8];
        r2.emit(&mut b);
        assert_eq!(
            Ipv4Packet::new_checked(&b[..]).unwrap_err().0,
            Reason::BadFragment
        );
    }
}
