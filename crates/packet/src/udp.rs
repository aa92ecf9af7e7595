//! UDP headers.

use crate::{be16, checksum, fail, put16, Reason, Result};

/// Length of a UDP header.
pub const HEADER_LEN: usize = 8;

/// A checked view of a UDP datagram (or the first fragment of one, whose
/// length field may exceed the bytes present: see
/// [`UdpPacket::new_checked_fragment`]).
#[derive(Debug, Clone)]
pub struct UdpPacket<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> UdpPacket<T> {
    /// Validates the header and that the length field fits the buffer.
    pub fn new_checked(buf: T) -> Result<Self> {
        let p = Self::new_checked_fragment(buf)?;
        let len = usize::from(be16(p.b(), 4));
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

    /// Length field.
    pub fn len_field(&self) -> usize {
        usize::from(be16(self.b(), 4))
    }

    /// Payload (up to the length field, or the buffer if shorter).
    pub fn payload(&self) -> &[u8] {
        let end = self.len_field().clamp(HEADER_LEN, self.b().len());
        &self.b()[HEADER_LEN..end]
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
        put16(buf, 0, self.src_port);
        put16(buf, 2, self.dst_port);
        put16(buf, 4, len as u16);
        put16(buf, 6, 0);
        buf[8..len].copy_from_slice(&self.payload);
        let c = match checksum::finish(checksum::sum(pseudo, &buf[..len])) {
            0 => 0xffff, // zero means "no checksum" in UDP
            c => c,
        };
        put16(buf, 6, c);
    }
}
