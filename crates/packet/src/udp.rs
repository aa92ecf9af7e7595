//! UDP headers.

use crate::{checksum, fail, read16, write16, Reason, Result};

/// Where each field of a UDP header lies.
pub mod field {
    use crate::Field;

    /// Source port.
    pub const SRC_PORT: Field = 0..2;
    /// Destination port.
    pub const DST_PORT: Field = 2..4;
    /// Length of header and payload.
    pub const LENGTH: Field = 4..6;
    /// Checksum over the pseudo-header and the datagram (0: none).
    pub const CHECKSUM: Field = 6..8;
}

/// Length of a UDP header.
pub const HEADER_LEN: usize = field::CHECKSUM.end;

/// The checksum field's value for a running sum (from
/// [`checksum::sum`]): computed 0 is sent as 0xffff, since 0 means "no
/// checksum" in UDP.
fn checksum_field(sum: u32) -> u16 {
    match checksum::finish(sum) {
        0 => 0xffff,
        c => c,
    }
}

/// A checked view of a UDP datagram (or the first fragment of one, whose
/// length field may exceed the bytes present: see
/// [`UdpPacket::new_checked_fragment`]).
///
/// After [`UdpPacket::set_len`] the length may no longer fit the buffer;
/// readers clamp it to the buffer, so nothing panics, but re-check with
/// [`UdpPacket::new_checked`] before trusting it.
#[derive(Debug, Clone)]
pub struct UdpPacket<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> UdpPacket<T> {
    /// Validates the header and that the length field fits the buffer.
    pub fn new_checked(buf: T) -> Result<Self> {
        let p = Self::new_checked_fragment(buf)?;
        let len = p.len_field();
        if len < HEADER_LEN || len > p.b().len() {
            return fail(Reason::UdpBadLength);
        }
        Ok(p)
    }

    /// Validates only that the header is present (a first fragment carries
    /// the whole datagram's length).
    pub fn new_checked_fragment(buf: T) -> Result<Self> {
        if buf.as_ref().len() < HEADER_LEN {
            return fail(Reason::UdpTruncated);
        }
        Ok(UdpPacket { buf })
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buf
    }

    fn b(&self) -> &[u8] {
        self.buf.as_ref()
    }

    /// Source port.
    pub fn src_port(&self) -> u16 {
        read16(self.b(), field::SRC_PORT)
    }

    /// Destination port.
    pub fn dst_port(&self) -> u16 {
        read16(self.b(), field::DST_PORT)
    }

    /// Length field.
    pub fn len_field(&self) -> usize {
        usize::from(read16(self.b(), field::LENGTH))
    }

    /// The checksum field.
    pub fn checksum(&self) -> u16 {
        read16(self.b(), field::CHECKSUM)
    }

    /// End of the datagram: the length field, clamped to the buffer.
    fn end(&self) -> usize {
        self.len_field().clamp(HEADER_LEN, self.b().len())
    }

    /// Payload (up to the length field, or the buffer if shorter).
    pub fn payload(&self) -> &[u8] {
        &self.b()[HEADER_LEN..self.end()]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> UdpPacket<T> {
    /// A view over a buffer of at least [`HEADER_LEN`] bytes, for writing a
    /// datagram: nothing is validated.
    pub(crate) fn new_unchecked(buf: T) -> Self {
        UdpPacket { buf }
    }

    fn b_mut(&mut self) -> &mut [u8] {
        self.buf.as_mut()
    }

    /// Sets the source port.
    pub fn set_src_port(&mut self, port: u16) {
        write16(self.b_mut(), field::SRC_PORT, port);
    }

    /// Sets the destination port.
    pub fn set_dst_port(&mut self, port: u16) {
        write16(self.b_mut(), field::DST_PORT, port);
    }

    /// Sets the length field (header and payload).
    pub fn set_len(&mut self, len: u16) {
        write16(self.b_mut(), field::LENGTH, len);
    }

    /// Sets the checksum field (see [`UdpPacket::fill_checksum`]).
    pub fn set_checksum(&mut self, value: u16) {
        write16(self.b_mut(), field::CHECKSUM, value);
    }

    /// Computes the checksum over `pseudo` (from [`checksum::pseudo_v4`] or
    /// [`checksum::pseudo_v6`]) and the whole buffer, which should hold
    /// exactly the datagram, and writes it.
    pub fn fill_checksum(&mut self, pseudo: u32) {
        self.set_checksum(0);
        let c = checksum_field(checksum::sum(pseudo, self.b()));
        self.set_checksum(c);
    }

    /// Payload (up to the length field, or the buffer if shorter), writable.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let end = self.end();
        &mut self.b_mut()[HEADER_LEN..end]
    }
}

/// A parsed UDP datagram.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UdpRepr {
    /// Source port.
    pub src_port: u16,
    /// Destination port.
    pub dst_port: u16,
    /// Payload.
    pub payload: Vec<u8>,
}

impl UdpRepr {
    /// Reads a checked datagram.
    pub fn parse<T: AsRef<[u8]>>(p: &UdpPacket<T>) -> Self {
        UdpRepr {
            src_port: p.src_port(),
            dst_port: p.dst_port(),
            payload: p.payload().to_vec(),
        }
    }

    /// Bytes [`UdpRepr::emit`] writes.
    pub fn buffer_len(&self) -> usize {
        HEADER_LEN + self.payload.len()
    }

    /// Writes the datagram with its checksum over `pseudo`.
    pub fn emit(&self, buf: &mut [u8], pseudo: u32) {
        let len = self.buffer_len();
        let mut p = UdpPacket::new_unchecked(&mut buf[..len]);
        p.set_src_port(self.src_port);
        p.set_dst_port(self.dst_port);
        p.set_len(len as u16);
        p.b_mut()[HEADER_LEN..].copy_from_slice(&self.payload);
        p.fill_checksum(pseudo);
    }
}
