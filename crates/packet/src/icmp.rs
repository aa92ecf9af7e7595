//! ICMPv4 and ICMPv6 headers, and the errors that quote a packet.

use crate::{checksum, fail, read16, read32, write16, write32, Reason, Result};

/// Where each field of an ICMP or ICMPv6 header lies.
pub mod field {
    use crate::Field;

    /// Message type.
    pub const TYPE: usize = 0;
    /// Code.
    pub const CODE: usize = 1;
    /// Checksum (ICMPv6: over the pseudo-header too).
    pub const CHECKSUM: Field = 2..4;
    /// The 4 bytes after the checksum, whose meaning depends on the type
    /// (MTU, identifier and sequence, unused...).
    pub const REST: Field = 4..8;
    /// Identifier of an echo request or reply.
    pub const ECHO_IDENT: Field = 4..6;
    /// Sequence number of an echo request or reply.
    pub const ECHO_SEQNO: Field = 6..8;
}

/// Length of an ICMP header (type, code, checksum, 4 bytes of "rest").
pub const HEADER_LEN: usize = field::REST.end;

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

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buf
    }

    fn b(&self) -> &[u8] {
        self.buf.as_ref()
    }

    /// Message type.
    pub fn kind(&self) -> u8 {
        self.b()[field::TYPE]
    }

    /// Code.
    pub fn code(&self) -> u8 {
        self.b()[field::CODE]
    }

    /// The checksum field.
    pub fn checksum(&self) -> u16 {
        read16(self.b(), field::CHECKSUM)
    }

    /// The 4 bytes after the checksum (MTU, identifier and sequence...).
    pub fn rest(&self) -> u32 {
        read32(self.b(), field::REST)
    }

    /// Identifier of an echo message.
    pub fn echo_ident(&self) -> u16 {
        read16(self.b(), field::ECHO_IDENT)
    }

    /// Sequence number of an echo message.
    pub fn echo_seq_no(&self) -> u16 {
        read16(self.b(), field::ECHO_SEQNO)
    }

    /// Everything after the header (for errors: the quoted packet).
    pub fn payload(&self) -> &[u8] {
        &self.b()[HEADER_LEN..]
    }

    /// Whether the checksum verifies; `pseudo` is 0 for ICMPv4 and the
    /// pseudo-header sum for ICMPv6.
    pub fn checksum_ok(&self, pseudo: u32) -> bool {
        checksum::finish(checksum::sum(pseudo, self.b())) == 0
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> IcmpPacket<T> {
    /// A view over a buffer of at least [`HEADER_LEN`] bytes, for writing a
    /// message: nothing is validated.
    pub(crate) fn new_unchecked(buf: T) -> Self {
        IcmpPacket { buf }
    }

    fn b_mut(&mut self) -> &mut [u8] {
        self.buf.as_mut()
    }

    /// Sets the message type.
    pub fn set_kind(&mut self, kind: u8) {
        self.b_mut()[field::TYPE] = kind;
    }

    /// Sets the code.
    pub fn set_code(&mut self, code: u8) {
        self.b_mut()[field::CODE] = code;
    }

    /// Sets the checksum field (see [`IcmpPacket::fill_checksum`]).
    pub fn set_checksum(&mut self, value: u16) {
        write16(self.b_mut(), field::CHECKSUM, value);
    }

    /// Sets the 4 bytes after the checksum.
    pub fn set_rest(&mut self, rest: u32) {
        write32(self.b_mut(), field::REST, rest);
    }

    /// Sets the identifier of an echo message.
    pub fn set_echo_ident(&mut self, ident: u16) {
        write16(self.b_mut(), field::ECHO_IDENT, ident);
    }

    /// Sets the sequence number of an echo message.
    pub fn set_echo_seq_no(&mut self, seq_no: u16) {
        write16(self.b_mut(), field::ECHO_SEQNO, seq_no);
    }

    /// Computes the checksum over `pseudo` (0 for ICMPv4, the pseudo-header
    /// sum for ICMPv6) and the whole buffer, which should hold exactly the
    /// message, and writes it.
    pub fn fill_checksum(&mut self, pseudo: u32) {
        self.set_checksum(0);
        let c = checksum::finish(checksum::sum(pseudo, self.b()));
        self.set_checksum(c);
    }

    /// Everything after the header, writable.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.b_mut()[HEADER_LEN..]
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
        let mut p = IcmpPacket::new_unchecked(&mut buf[..self.buffer_len()]);
        p.set_kind(self.kind);
        p.set_code(self.code);
        p.set_rest(self.rest);
        p.payload_mut().copy_from_slice(&self.payload);
        p.fill_checksum(pseudo);
    }
}
