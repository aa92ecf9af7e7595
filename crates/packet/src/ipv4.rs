//! IPv4 headers, with options and fragments.

use crate::{checksum, fail, read16, read_array, write16, Reason, Result};

/// Where each field of an IPv4 header lies.
pub mod field {
    use crate::Field;

    /// Version (high nibble) and header length in 32-bit words (low nibble).
    pub const VER_IHL: usize = 0;
    /// Type of service: DSCP (high 6 bits) and ECN (low 2 bits).
    pub const DSCP_ECN: usize = 1;
    /// Total length, header and payload.
    pub const LENGTH: Field = 2..4;
    /// Identification.
    pub const IDENT: Field = 4..6;
    /// Flags (high 3 bits, see [`super::flags`]) and fragment offset in
    /// 8-byte units (low 13 bits).
    pub const FLG_OFF: Field = 6..8;
    /// Time to live.
    pub const TTL: usize = 8;
    /// Payload protocol.
    pub const PROTOCOL: usize = 9;
    /// Header checksum.
    pub const CHECKSUM: Field = 10..12;
    /// Source address.
    pub const SRC_ADDR: Field = 12..16;
    /// Destination address.
    pub const DST_ADDR: Field = 16..20;
}

/// The bits of the [`field::FLG_OFF`] word.
pub mod flags {
    /// Reserved; must be zero.
    pub const RESERVED: u16 = 0x8000;
    /// Don't fragment.
    pub const DONT_FRAG: u16 = 0x4000;
    /// More fragments.
    pub const MORE_FRAGS: u16 = 0x2000;
    /// The fragment offset, in 8-byte units.
    pub const OFFSET: u16 = 0x1fff;
}

/// Length of an IPv4 header without options.
pub const MIN_HEADER_LEN: usize = field::DST_ADDR.end;
/// Length of an IPv4 header with the most options (IHL 15).
pub const MAX_HEADER_LEN: usize = 60;

/// A checked view of an IPv4 packet: version, header length and total length
/// are consistent with the buffer (which may carry trailing padding, as
/// short Ethernet frames do).
///
/// Setters write fields as given. After [`Ipv4Packet::set_header_len`] or
/// [`Ipv4Packet::set_total_len`] the lengths may no longer fit the buffer:
/// re-check with [`Ipv4Packet::new_checked`] (on
/// [`Ipv4Packet::into_inner`]) before reading options, payload or checksum.
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
        let p = Ipv4Packet { buf };
        if p.version() != 4 {
            return fail(Reason::Ipv4BadVersion);
        }
        let hl = p.header_len();
        if hl < MIN_HEADER_LEN || hl > p.b().len() {
            return fail(Reason::Ipv4BadHeaderLength);
        }
        let total = p.total_len();
        if total < hl || total > p.b().len() {
            return fail(Reason::Ipv4BadTotalLength);
        }
        if p.frag_offset() as usize + (total - hl) > 65_535 {
            return fail(Reason::BadFragment);
        }
        Ok(p)
    }

    /// A view over a buffer of at least [`MIN_HEADER_LEN`] bytes, for
    /// writing a header: nothing is validated.
    pub(crate) fn new_unchecked(buf: T) -> Self {
        Ipv4Packet { buf }
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buf
    }

    fn b(&self) -> &[u8] {
        self.buf.as_ref()
    }

    /// IP version (4 for a checked packet).
    pub fn version(&self) -> u8 {
        self.b()[field::VER_IHL] >> 4
    }

    /// Header length in bytes.
    pub fn header_len(&self) -> usize {
        usize::from(self.b()[field::VER_IHL] & 0x0f) * 4
    }

    /// The type-of-service byte (DSCP << 2 | ECN).
    pub fn tos(&self) -> u8 {
        self.b()[field::DSCP_ECN]
    }

    /// Total length (header and payload).
    pub fn total_len(&self) -> usize {
        usize::from(read16(self.b(), field::LENGTH))
    }

    /// Identification.
    pub fn ident(&self) -> u16 {
        read16(self.b(), field::IDENT)
    }

    fn flg_off(&self) -> u16 {
        read16(self.b(), field::FLG_OFF)
    }

    /// Don't-fragment flag.
    pub fn dont_frag(&self) -> bool {
        self.flg_off() & flags::DONT_FRAG != 0
    }

    /// More-fragments flag.
    pub fn more_frags(&self) -> bool {
        self.flg_off() & flags::MORE_FRAGS != 0
    }

    /// Fragment offset in bytes.
    pub fn frag_offset(&self) -> u16 {
        (self.flg_off() & flags::OFFSET) << 3
    }

    /// Whether this is a fragment (first or not).
    pub fn is_fragment(&self) -> bool {
        self.more_frags() || self.frag_offset() != 0
    }

    /// Time to live.
    pub fn ttl(&self) -> u8 {
        self.b()[field::TTL]
    }

    /// Payload protocol.
    pub fn protocol(&self) -> u8 {
        self.b()[field::PROTOCOL]
    }

    /// The header checksum field.
    pub fn checksum(&self) -> u16 {
        read16(self.b(), field::CHECKSUM)
    }

    /// Source address.
    pub fn src(&self) -> [u8; 4] {
        read_array(self.b(), field::SRC_ADDR)
    }

    /// Destination address.
    pub fn dst(&self) -> [u8; 4] {
        read_array(self.b(), field::DST_ADDR)
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

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv4Packet<T> {
    fn b_mut(&mut self) -> &mut [u8] {
        self.buf.as_mut()
    }

    fn set_flg_off(&mut self, value: u16) {
        write16(self.b_mut(), field::FLG_OFF, value);
    }

    /// Sets the version (the high nibble of the first byte).
    pub fn set_version(&mut self, version: u8) {
        let b = &mut self.b_mut()[field::VER_IHL];
        *b = (*b & 0x0f) | (version << 4);
    }

    /// Sets the header length in bytes (a multiple of 4, at most
    /// [`MAX_HEADER_LEN`]).
    pub fn set_header_len(&mut self, len: usize) {
        debug_assert!(len.is_multiple_of(4) && len <= MAX_HEADER_LEN);
        let b = &mut self.b_mut()[field::VER_IHL];
        *b = (*b & 0xf0) | ((len / 4) as u8 & 0x0f);
    }

    /// Sets the type-of-service byte (DSCP << 2 | ECN).
    pub fn set_tos(&mut self, tos: u8) {
        self.b_mut()[field::DSCP_ECN] = tos;
    }

    /// Sets the total length (header and payload).
    pub fn set_total_len(&mut self, len: u16) {
        write16(self.b_mut(), field::LENGTH, len);
    }

    /// Sets the identification.
    pub fn set_ident(&mut self, ident: u16) {
        write16(self.b_mut(), field::IDENT, ident);
    }

    /// Clears the three flag bits (reserved, DF, MF), keeping the offset.
    pub fn clear_flags(&mut self) {
        let v = self.flg_off() & flags::OFFSET;
        self.set_flg_off(v);
    }

    /// Sets or clears the don't-fragment flag.
    pub fn set_dont_frag(&mut self, on: bool) {
        let v = self.flg_off() & !flags::DONT_FRAG;
        self.set_flg_off(if on { v | flags::DONT_FRAG } else { v });
    }

    /// Sets or clears the more-fragments flag.
    pub fn set_more_frags(&mut self, on: bool) {
        let v = self.flg_off() & !flags::MORE_FRAGS;
        self.set_flg_off(if on { v | flags::MORE_FRAGS } else { v });
    }

    /// Sets the fragment offset in bytes (a multiple of 8; the low 3 bits
    /// are dropped).
    pub fn set_frag_offset(&mut self, offset: u16) {
        let v = self.flg_off() & !flags::OFFSET;
        self.set_flg_off(v | (offset >> 3));
    }

    /// Sets the time to live.
    pub fn set_ttl(&mut self, ttl: u8) {
        self.b_mut()[field::TTL] = ttl;
    }

    /// Sets the payload protocol.
    pub fn set_protocol(&mut self, protocol: u8) {
        self.b_mut()[field::PROTOCOL] = protocol;
    }

    /// Sets the header checksum field (see [`Ipv4Packet::fill_checksum`]).
    pub fn set_checksum(&mut self, value: u16) {
        write16(self.b_mut(), field::CHECKSUM, value);
    }

    /// Sets the source address.
    pub fn set_src(&mut self, addr: [u8; 4]) {
        self.b_mut()[field::SRC_ADDR].copy_from_slice(&addr);
    }

    /// Sets the destination address.
    pub fn set_dst(&mut self, addr: [u8; 4]) {
        self.b_mut()[field::DST_ADDR].copy_from_slice(&addr);
    }

    /// Computes the header checksum over the header as it now stands and
    /// writes it.
    pub fn fill_checksum(&mut self) {
        self.set_checksum(0);
        let hl = self.header_len();
        let c = checksum::checksum(&self.b()[..hl]);
        self.set_checksum(c);
    }

    /// Options bytes, writable.
    pub fn options_mut(&mut self) -> &mut [u8] {
        let hl = self.header_len();
        &mut self.b_mut()[MIN_HEADER_LEN..hl]
    }

    /// Payload, writable.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let (hl, total) = (self.header_len(), self.total_len());
        &mut self.b_mut()[hl..total]
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
    ///
    /// The checksum is summed from the same values as they are written,
    /// not read back from `buf`: reading the freshly written header with
    /// wide loads over its narrow stores stalls the CPU (no store-to-load
    /// forwarding), which was a fifth of the time `lb bench` spent here.
    #[inline(always)]
    pub fn emit(&self, buf: &mut [u8]) {
        let hl = self.header_len();
        debug_assert!(self.options.len().is_multiple_of(4) && hl <= MAX_HEADER_LEN);
        let be = |b: [u8; 2]| u16::from_be_bytes(b);
        let mut words = [
            be([0x40 | (hl / 4) as u8, self.tos]),
            (hl + self.payload_len) as u16,
            self.ident,
            (if self.dont_frag { flags::DONT_FRAG } else { 0 })
                | (if self.more_frags {
                    flags::MORE_FRAGS
                } else {
                    0
                })
                | (self.frag_offset >> 3),
            be([self.ttl, self.protocol]),
            0, // the checksum, below
            be([self.src[0], self.src[1]]),
            be([self.src[2], self.src[3]]),
            be([self.dst[0], self.dst[1]]),
            be([self.dst[2], self.dst[3]]),
        ];
        let sum = words.iter().map(|&w| u32::from(w)).sum::<u32>();
        words[field::CHECKSUM.start / 2] = checksum::finish(checksum::sum(sum, &self.options));
        let (fixed, options) = buf[..hl].split_at_mut(MIN_HEADER_LEN);
        for (out, w) in fixed.chunks_exact_mut(2).zip(words) {
            out.copy_from_slice(&w.to_be_bytes());
        }
        options.copy_from_slice(&self.options);
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
