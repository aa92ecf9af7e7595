//! TCP headers.

use crate::{checksum, fail, read16, read32, write16, write32, Reason, Result};

/// Where each field of a TCP header lies.
pub mod field {
    use crate::Field;

    /// Source port.
    pub const SRC_PORT: Field = 0..2;
    /// Destination port.
    pub const DST_PORT: Field = 2..4;
    /// Sequence number.
    pub const SEQ_NUM: Field = 4..8;
    /// Acknowledgment number.
    pub const ACK_NUM: Field = 8..12;
    /// Data offset in 32-bit words (high nibble); the low nibble is
    /// reserved (and the old NS flag) and written as zero.
    pub const DATA_OFF: usize = 12;
    /// Flags, FIN..CWR (see [`super::flags`]).
    pub const FLAGS: usize = 13;
    /// Window.
    pub const WIN_SIZE: Field = 14..16;
    /// Checksum over the pseudo-header and the segment.
    pub const CHECKSUM: Field = 16..18;
    /// Urgent pointer.
    pub const URGENT: Field = 18..20;
}

/// Length of a TCP header without options.
pub const MIN_HEADER_LEN: usize = field::URGENT.end;
/// Length of a TCP header with the most options (data offset 15).
pub const MAX_HEADER_LEN: usize = 60;

/// TCP flag bits (the [`field::FLAGS`] byte).
pub mod flags {
    /// FIN.
    pub const FIN: u8 = 0x01;
    /// SYN.
    pub const SYN: u8 = 0x02;
    /// RST.
    pub const RST: u8 = 0x04;
    /// PSH.
    pub const PSH: u8 = 0x08;
    /// ACK.
    pub const ACK: u8 = 0x10;
}

/// A checked view of a TCP segment: the data offset fits the segment.
///
/// The segment is the whole buffer: checksums cover all of it. After
/// [`TcpPacket::set_header_len`] the header may no longer fit: re-check with
/// [`TcpPacket::new_checked`] (on [`TcpPacket::into_inner`]) before reading
/// options or payload.
#[derive(Debug, Clone)]
pub struct TcpPacket<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> TcpPacket<T> {
    /// Validates the header length.
    pub fn new_checked(buf: T) -> Result<Self> {
        if buf.as_ref().len() < MIN_HEADER_LEN {
            return fail(Reason::TcpTruncated);
        }
        let p = TcpPacket { buf };
        let off = p.header_len();
        if off < MIN_HEADER_LEN || off > p.b().len() {
            return fail(Reason::TcpBadDataOffset);
        }
        Ok(p)
    }

    /// A view over a buffer of at least [`MIN_HEADER_LEN`] bytes, for
    /// writing a segment: nothing is validated.
    pub(crate) fn new_unchecked(buf: T) -> Self {
        TcpPacket { buf }
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

    /// Sequence number.
    pub fn seq(&self) -> u32 {
        read32(self.b(), field::SEQ_NUM)
    }

    /// Acknowledgment number.
    pub fn ack(&self) -> u32 {
        read32(self.b(), field::ACK_NUM)
    }

    /// Header length in bytes.
    pub fn header_len(&self) -> usize {
        usize::from(self.b()[field::DATA_OFF] >> 4) * 4
    }

    /// Flags (FIN..CWR, the low 8 bits).
    pub fn flags(&self) -> u8 {
        self.b()[field::FLAGS]
    }

    /// Window.
    pub fn window(&self) -> u16 {
        read16(self.b(), field::WIN_SIZE)
    }

    /// The checksum field.
    pub fn checksum(&self) -> u16 {
        read16(self.b(), field::CHECKSUM)
    }

    /// Urgent pointer.
    pub fn urgent(&self) -> u16 {
        read16(self.b(), field::URGENT)
    }

    /// Options bytes.
    pub fn options(&self) -> &[u8] {
        &self.b()[MIN_HEADER_LEN..self.header_len()]
    }

    /// Payload.
    pub fn payload(&self) -> &[u8] {
        &self.b()[self.header_len()..]
    }

    /// Whether the checksum verifies given the pseudo-header sum.
    pub fn checksum_ok(&self, pseudo: u32) -> bool {
        checksum::finish(checksum::sum(pseudo, self.b())) == 0
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> TcpPacket<T> {
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

    /// Sets the sequence number.
    pub fn set_seq(&mut self, seq: u32) {
        write32(self.b_mut(), field::SEQ_NUM, seq);
    }

    /// Sets the acknowledgment number.
    pub fn set_ack(&mut self, ack: u32) {
        write32(self.b_mut(), field::ACK_NUM, ack);
    }

    /// Sets the header length in bytes (a multiple of 4, at most
    /// [`MAX_HEADER_LEN`]); the reserved bits after it are cleared.
    pub fn set_header_len(&mut self, len: usize) {
        debug_assert!(len.is_multiple_of(4) && len <= MAX_HEADER_LEN);
        self.b_mut()[field::DATA_OFF] = ((len / 4) as u8) << 4;
    }

    /// Sets the flags.
    pub fn set_flags(&mut self, flags: u8) {
        self.b_mut()[field::FLAGS] = flags;
    }

    /// Sets the window.
    pub fn set_window(&mut self, window: u16) {
        write16(self.b_mut(), field::WIN_SIZE, window);
    }

    /// Sets the checksum field (see [`TcpPacket::fill_checksum`]).
    pub fn set_checksum(&mut self, value: u16) {
        write16(self.b_mut(), field::CHECKSUM, value);
    }

    /// Sets the urgent pointer.
    pub fn set_urgent(&mut self, urgent: u16) {
        write16(self.b_mut(), field::URGENT, urgent);
    }

    /// Computes the checksum over `pseudo` (from [`checksum::pseudo_v4`] or
    /// [`checksum::pseudo_v6`]) and the whole segment, and writes it.
    pub fn fill_checksum(&mut self, pseudo: u32) {
        self.set_checksum(0);
        let c = checksum::finish(checksum::sum(pseudo, self.b()));
        self.set_checksum(c);
    }

    /// Options bytes, writable.
    pub fn options_mut(&mut self) -> &mut [u8] {
        let hl = self.header_len();
        &mut self.b_mut()[MIN_HEADER_LEN..hl]
    }

    /// Payload, writable.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let hl = self.header_len();
        &mut self.b_mut()[hl..]
    }
}

/// A parsed TCP segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpRepr {
    /// Source port.
    pub src_port: u16,
    /// Destination port.
    pub dst_port: u16,
    /// Sequence number.
    pub seq: u32,
    /// Acknowledgment number.
    pub ack: u32,
    /// Flags.
    pub flags: u8,
    /// Window.
    pub window: u16,
    /// Urgent pointer.
    pub urgent: u16,
    /// Options (a multiple of 4 bytes, at most 40).
    pub options: Vec<u8>,
    /// Payload.
    pub payload: Vec<u8>,
}

impl TcpRepr {
    /// Reads a checked segment.
    pub fn parse<T: AsRef<[u8]>>(p: &TcpPacket<T>) -> Self {
        TcpRepr {
            src_port: p.src_port(),
            dst_port: p.dst_port(),
            seq: p.seq(),
            ack: p.ack(),
            flags: p.flags(),
            window: p.window(),
            urgent: p.urgent(),
            options: p.options().to_vec(),
            payload: p.payload().to_vec(),
        }
    }

    /// Bytes [`TcpRepr::emit`] writes.
    pub fn buffer_len(&self) -> usize {
        MIN_HEADER_LEN + self.options.len() + self.payload.len()
    }

    /// Writes the segment with its checksum over `pseudo` (from
    /// [`checksum::pseudo_v4`] or [`checksum::pseudo_v6`]).
    pub fn emit(&self, buf: &mut [u8], pseudo: u32) {
        let mut p = TcpPacket::new_unchecked(&mut buf[..self.buffer_len()]);
        p.set_src_port(self.src_port);
        p.set_dst_port(self.dst_port);
        p.set_seq(self.seq);
        p.set_ack(self.ack);
        p.set_header_len(MIN_HEADER_LEN + self.options.len());
        p.set_flags(self.flags);
        p.set_window(self.window);
        p.set_urgent(self.urgent);
        p.options_mut().copy_from_slice(&self.options);
        p.payload_mut().copy_from_slice(&self.payload);
        p.fill_checksum(pseudo);
    }
}
