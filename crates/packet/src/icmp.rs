//! ICMPv4 and ICMPv6 headers, and the errors that quote a packet.

use crate::{be16, be32, checksum, fail, put16, put32, Reason, Result};

/// Length of an ICMP header (type, code, checksum, 4 bytes of "rest").
pub const HEADER_LEN: usize = 8;

/// ICMPv4 destination unreachable.
pub const V4_DEST_UNREACHABLE: u8 = 3;
/// ICMPv4 code "fragmentation needed and DF set".
pub const V4_FRAG_NEEDED: u8 = 4;
/// ICMPv4 echo request.
pub const V4_ECHO_REQUEST: u8 = 8;
/// ICMPv6 packet too big.
pub const V6_PACKET_TOO_BIG: u8 = 2;
/// ICMPv6 echo request.
pub const V6_ECHO_REQUEST: u8 = 128;

/// A checked view of an ICMP message (either version; the layout of the
/// first 8 bytes is shared).
#[derive(Debug, Clone)]
pub struct IcmpPacket<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> IcmpPacket<T> {
    /// Validates that the header is present.
    pub fn new_checked(buf: T) -> Result<Self> {
        if buf.as_ref().len() < HEADER_LEN {
            return fail(Reason::IcmpTruncated);
        }
        Ok(IcmpPacket { buf })
    }

    fn b(&self) -> &[u8] {
        self.buf.as_ref()
    }

    /// Message type.
    pub fn kind(&self) -> u8 {
        self.b()[0]
    }

    /// Code.
    pub fn code(&self) -> u8 {
        self.b()[1]
    }

    /// The 4 bytes after the checksum (MTU, identifier and sequence...).
    pub fn rest(&self) -> u32 {
        be32(self.b(), 4)
    }

    /// Identifier of an echo message.
    pub fn echo_ident(&self) -> u16 {
        be16(self.b(), 4)
    }

    /// Everything after the header (for errors: the quoted packet).
    pub fn payload(&self) -> &[u8] {
        &self.b()[HEADER_LEN..]
    }
}

/// A parsed ICMP message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IcmpRepr {
    /// Message type.
    pub kind: u8,
    /// Code.
    pub code: u8,
    /// The 4 bytes after the checksum.
    pub rest: u32,
    /// Payload.
    pub payload: Vec<u8>,
}

impl IcmpRepr {
    /// Reads a checked message.
    pub fn parse<T: AsRef<[u8]>>(p: &IcmpPacket<T>) -> Self {
        IcmpRepr {
            kind: p.kind(),
            code: p.code(),
            rest: p.rest(),
            payload: p.payload().to_vec(),
        }
    }

    /// Bytes [`IcmpRepr::emit`] writes.
    pub fn buffer_len(&self) -> usize {
        HEADER_LEN + self.payload.len()
    }

    /// Writes the message with its checksum; `pseudo` is 0 for ICMPv4 and
    /// the pseudo-header sum for ICMPv6.
    pub fn emit(&self, buf: &mut [u8], pseudo: u32) {
        let len = self.buffer_len();
        buf[0] = self.kind;
        buf[1] = self.code;
        put16(buf, 2, 0);
        put32(buf, 4, self.rest);
        buf[8..len].copy_from_slice(&self.payload);
        let c = checksum::finish(checksum::sum(pseudo, &buf[..len]));
        put16(buf, 2, c);
    }
}
