//! The memory a memif client shares, as typed structures.
//!
//! A region is a sealed memfd the client sends with `add_region`; rings and
//! packet buffers lie in regions at offsets the client names. A ring is one
//! [`RingHeader`] (two cache lines) followed by `2^log2` [`Desc`]s:
//!
//! ```text
//! ring offset + 0     RingHeader::client  cookie, flags, head  (client writes)
//! ring offset + 64    RingHeader::server  tail                 (server writes)
//! ring offset + 128   Desc[0 .. 2^log2]   16 bytes each
//! ```
//!
//! `head` and `tail` are free-running 16-bit counters; slot `i` of a ring is
//! `desc[i & (size - 1)]`. On a client-to-server ring the client fills
//! descriptors and moves `head`, the server consumes them and moves `tail`.
//! On a server-to-client ring the client posts empty buffers by moving
//! `head`, the server fills them (writing the descriptor's `length` and
//! `flags`) and moves `tail`.
//!
//! Every field is an atomic: the client may write any of them at any time, so
//! the server reads each one once, into a local, checks it, then acts on the
//! local ([`super::datapath`] does that).

use std::sync::atomic::{AtomicU16, AtomicU32};

/// The value the client writes into every ring's `cookie`.
pub const COOKIE: u32 = 0x3E31F20;

/// `RingHeader::client.flags`: the ring's receiver does not want interrupts.
pub const RING_FLAG_MASK_INT: u16 = 1;

/// Bytes per cache line, the alignment of the header's two lines and of
/// every ring's offset in its region.
pub const CACHE_LINE: usize = 64;

/// The ring header's first cache line: the client's.
#[repr(C, align(64))]
pub struct ClientLine {
    /// [`COOKIE`], written once by the client before it connects.
    pub cookie: AtomicU32,
    /// Written by the ring's receiver ([`RING_FLAG_MASK_INT`]). The server
    /// writes none: it only reads it on server-to-client rings.
    pub flags: AtomicU16,
    /// Written by the client: frames produced (client-to-server) or empty
    /// buffers posted (server-to-client).
    pub head: AtomicU16,
}

/// The ring header's second cache line: the server's.
#[repr(C, align(64))]
pub struct ServerLine {
    /// Written by the server: slots returned (client-to-server) or filled
    /// (server-to-client).
    pub tail: AtomicU16,
}

/// The start of a ring in a region: one cache line for each side.
#[repr(C)]
pub struct RingHeader {
    /// Written by the client.
    pub client: ClientLine,
    /// Written by the server.
    pub server: ServerLine,
}

/// A ring descriptor: one packet buffer in a region.
///
/// On a client-to-server ring the client writes every field. On a
/// server-to-client ring the client writes `region`, `offset` and `length`
/// (the buffer's capacity); the server writes `length` (the frame's) and
/// `flags` when it fills the buffer.
#[repr(C)]
pub struct Desc {
    /// Chaining flags; the server writes 0 (one frame, one buffer).
    pub flags: AtomicU16,
    /// Index of the region that holds the buffer.
    pub region: AtomicU16,
    /// Bytes in the buffer (frame length, or capacity of an empty buffer).
    pub length: AtomicU32,
    /// Offset of the buffer in its region.
    pub offset: AtomicU32,
    /// Free for the client; never read by the server.
    pub metadata: AtomicU32,
}

const _: () = assert!(std::mem::size_of::<RingHeader>() == 2 * CACHE_LINE);
const _: () = assert!(std::mem::offset_of!(RingHeader, server) == CACHE_LINE);
const _: () = assert!(std::mem::offset_of!(ClientLine, cookie) == 0);
const _: () = assert!(std::mem::offset_of!(ClientLine, flags) == 4);
const _: () = assert!(std::mem::offset_of!(ClientLine, head) == 6);
const _: () = assert!(std::mem::offset_of!(ServerLine, tail) == 0);
const _: () = assert!(std::mem::size_of::<Desc>() == 16);
const _: () = assert!(std::mem::offset_of!(Desc, region) == 2);
const _: () = assert!(std::mem::offset_of!(Desc, length) == 4);
const _: () = assert!(std::mem::offset_of!(Desc, offset) == 8);
const _: () = assert!(std::mem::offset_of!(Desc, metadata) == 12);

/// Bytes a ring of `2^log2` descriptors occupies in its region.
pub const fn ring_bytes(log2: u8) -> usize {
    std::mem::size_of::<RingHeader>() + (std::mem::size_of::<Desc>() << log2)
}

/// A descriptor as read once from shared memory: the values every check and
/// every use then work on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DescRepr {
    /// Region index.
    pub region: u16,
    /// Buffer length in bytes.
    pub length: u32,
    /// Buffer offset in the region.
    pub offset: u32,
}

impl Desc {
    /// Read the fields the server uses, each once.
    #[inline]
    pub fn read(&self) -> DescRepr {
        use std::sync::atomic::Ordering::Relaxed;
        DescRepr {
            region: self.region.load(Relaxed),
            length: self.length.load(Relaxed),
            offset: self.offset.load(Relaxed),
        }
    }
}
