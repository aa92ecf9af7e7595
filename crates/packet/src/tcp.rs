//! TCP headers.

use crate::{be16, be32, checksum, fail, put16, put32, Reason, Result};

/// Length of a TCP header without options.
pub const MIN_HEADER_LEN: usize = 20;

/// TCP flag bits (low byte of the flags field).
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
#[derive(Debug, Clone)]
pub struct TcpPacket<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> TcpPacket<T> {
    /// Validates the header length.
    pub fn new_checked(buf: T) -> Result<Self> {
        let b = buf.as_ref();
        if b.len() < MIN_HEADER_LEN {
            return fail(Reason::TcpTruncated);
        }
        let off = usize::from(b[12] >> 4) * 4;
        if off < MIN_HEADER_LEN || off > b.len() {
            return fail(Reason::TcpBadDataOffset);
        }
        Ok(TcpPacket { buf })
    }

    fn b(&self) -> &[u8] {
        self.buf.as_ref()
    }

    /// Source port.
    pub fn src_port(&self) -> u16 {
        be16(self.b(), 0)
    }

    /// Destination port.
    pub fn dst_port(&self) -> u16 {
        be16(self.b(), 2)
    }

    /// Sequence number.
    pub fn seq(&self) -> u32 {
        be32(self.b(), 4)
    }

    /// Acknowledgment number.
    pub fn ack(&self) -> u32 {
        be32(self.b(), 8)
    }

    /// Header length in bytes.
    pub fn header_len(&self) -> usize {
        usize::from(self.b()[12] >> 4) * 4
    }

    /// Flags (FIN..CWR, the low 8 bits).
    pub fn flags(&self) -> u8 {
        self.b()[13]
    }

    /// Window.
    pub fn window(&self) -> u16 {
        be16(self.b(), 14)
    }

    /// Urgent pointer.
    pub fn urgent(&self) -> u16 {
        be16(self.b(), 18)
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
        let hl = MIN_HEADER_LEN + self.options.len();
        put16(buf, 0, self.src_port);
        put16(buf, 2, self.dst_port);
        put32(buf, 4, self.seq);
        put32(buf, 8, self.ack);
        buf[12] = ((hl / 4) as u8) << 4;
        buf[13] = self.flags;
        put16(buf, 14, self.window);
        put16(buf, 16, 0);
        put16(buf, 18, self.urgent);
        buf[20..hl].copy_from_slice(&self.options);
        buf[hl..hl + self.payload.len()].copy_from_slice(&self.payload);
        let c = checksum::finish(checksum::sum(pseudo, &buf[..self.buffer_len()]));
        put16(buf, 16, c);
    }
}
