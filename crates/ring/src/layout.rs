//! The byte layout of a port's shared memory.
//!
//! ```text
//! 0        Header (one cache line)
//! 64       CSB: guest line, host line (one cache line each)
//! 192      TX slots  [slots x 8 bytes]
//! ...      RX slots  [slots x 8 bytes]
//! ...      buffers   [bufs x buf_size], page aligned
//! ```
//! Every field another process writes is an atomic, so both sides may touch it
//! at any time without a data race in the Rust sense.

use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64};

/// "FPRING" and layout version 1.
pub const MAGIC: u64 = 0x4650_5249_4e47_0001;
/// Cache line size: the header and each side's CSB line own one, so that
/// the two sides never write the same line.
pub const CACHE_LINE: usize = 64;
/// Page size: the buffer area and the region length are page aligned.
pub const PAGE: usize = 4096;
/// Most slots per ring.
pub const MAX_SLOTS: u32 = 1 << 15;
/// Smallest buffer, in bytes.
pub const MIN_BUF: u32 = 64;
/// Largest buffer, in bytes.
pub const MAX_BUF: u32 = 65536;

/// First cache line of the region, written once by the device before the
/// region is handed out (and sealed against resizing).
#[repr(C)]
pub struct Header {
    /// [`MAGIC`], stored last (Release) once the rest is written.
    pub magic: AtomicU64,
    /// Slots per ring.
    pub slots: AtomicU32,
    /// Buffers in the buffer area.
    pub bufs: AtomicU32,
    /// Bytes per buffer.
    pub buf_size: AtomicU32,
    _pad0: u32,
    /// Offset of the TX ring.
    pub tx_off: AtomicU64,
    /// Offset of the RX ring.
    pub rx_off: AtomicU64,
    /// Offset of the buffer area.
    pub bufs_off: AtomicU64,
    /// Length of the whole region.
    pub len: AtomicU64,
    _pad1: u64,
}

/// A ring descriptor: which buffer, how many bytes, flags.
#[repr(C)]
pub struct Slot {
    /// Index of the buffer in the buffer area (checked before every use).
    pub buf: AtomicU32,
    /// Bytes of frame in the buffer (checked against the buffer size).
    pub len: AtomicU16,
    /// Reserved, written 0.
    pub flags: AtomicU16,
}

/// The guest's cache line of the Communication Status Block.
#[repr(C, align(64))]
pub struct GuestLine {
    /// TX slots handed to the device (free-running).
    pub tx_head: AtomicU32,
    /// TX wake-up point: interrupt the sleeping guest once `tx_tail` passes it.
    pub tx_cur: AtomicU32,
    /// RX slots released back to the device (free-running).
    pub rx_head: AtomicU32,
    /// RX wake-up point: interrupt the sleeping guest once `rx_tail` passes it.
    pub rx_cur: AtomicU32,
    /// Sleep epoch: odd while the guest sleeps waiting for an interrupt.
    pub sleep: AtomicU32,
    /// While asleep, what it waits for (`device::WANT_TX | WANT_RX`).
    pub want: AtomicU32,
}

/// The host's cache line of the Communication Status Block.
#[repr(C, align(64))]
pub struct HostLine {
    /// TX slots the device has finished with (free-running).
    pub tx_tail: AtomicU32,
    /// RX slots the device has filled (free-running).
    pub rx_tail: AtomicU32,
    /// Sleep epoch: odd while the host sleeps waiting for a kick.
    pub sleep: AtomicU32,
}

/// The Communication Status Block of one ring pair.
#[repr(C)]
pub struct Csb {
    /// Written by the driver (guest), read by the device.
    pub guest: GuestLine,
    /// Written by the device (host), read by the driver.
    pub host: HostLine,
}

const _: () = assert!(std::mem::size_of::<Header>() == CACHE_LINE);
const _: () = assert!(std::mem::size_of::<Slot>() == 8);
const _: () = assert!(std::mem::size_of::<Csb>() == 2 * CACHE_LINE);

/// Offset of the [`Csb`]: right after the header.
pub const CSB_OFF: usize = CACHE_LINE;
/// Offset of the TX ring: right after the CSB.
pub const TX_OFF: usize = 3 * CACHE_LINE;

/// Ring and buffer dimensions of a port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Geometry {
    /// Slots per ring, a power of two.
    pub slots: u32,
    /// Bytes per buffer.
    pub buf_size: u32,
}

impl Default for Geometry {
    fn default() -> Self {
        Geometry {
            slots: 1024,
            buf_size: 2048,
        }
    }
}

/// Offsets derived from a geometry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Offsets {
    /// Offset of the TX ring.
    pub tx: usize,
    /// Offset of the RX ring.
    pub rx: usize,
    /// Offset of the buffer area (page aligned).
    pub bufs_off: usize,
    /// Two buffers per slot: one behind each TX and each RX slot.
    pub bufs: u32,
    /// Length of the whole region (page aligned).
    pub len: usize,
}

/// Why a [`Geometry`] is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GeometryError {
    /// The slot count is not a power of two in range.
    #[error("slots must be a power of two in 2..={MAX_SLOTS}, got {slots}")]
    Slots {
        /// The slot count asked for.
        slots: u32,
    },
    /// The buffer size is out of range or not a multiple of 64.
    #[error("buf_size must be a multiple of 64 in {MIN_BUF}..={MAX_BUF}, got {buf_size}")]
    BufSize {
        /// The buffer size asked for.
        buf_size: u32,
    },
}

impl Geometry {
    /// Check that a port can have this geometry (the device checks a
    /// request, the driver what the header says).
    pub fn validate(&self) -> Result<(), GeometryError> {
        if !self.slots.is_power_of_two() || self.slots < 2 || self.slots > MAX_SLOTS {
            return Err(GeometryError::Slots { slots: self.slots });
        }
        if self.buf_size < MIN_BUF || self.buf_size > MAX_BUF || !self.buf_size.is_multiple_of(64) {
            return Err(GeometryError::BufSize {
                buf_size: self.buf_size,
            });
        }
        Ok(())
    }

    /// Where each part of the region lies for this geometry (which must be
    /// valid: see [`Geometry::validate`]).
    pub fn offsets(&self) -> Offsets {
        let slots = self.slots as usize;
        let tx = TX_OFF;
        let rx = tx + slots * 8;
        let bufs_off = (rx + slots * 8).next_multiple_of(PAGE);
        let bufs = 2 * self.slots;
        let len = (bufs_off + bufs as usize * self.buf_size as usize).next_multiple_of(PAGE);
        Offsets {
            tx,
            rx,
            bufs_off,
            bufs,
            len,
        }
    }
}

/// Free-running counter arithmetic: how far `ahead` is past `behind`.
#[inline]
pub fn distance(ahead: u32, behind: u32) -> u32 {
    ahead.wrapping_sub(behind)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_rejects_bad_values() {
        for (slots, buf) in [(0, 2048), (3, 2048), (1 << 16, 2048), (256, 32), (256, 100)] {
            let g = Geometry {
                slots,
                buf_size: buf,
            };
            assert!(g.validate().is_err(), "{g:?} accepted");
        }
        Geometry::default().validate().unwrap();
    }

    #[test]
    fn offsets_do_not_overlap() {
        let g = Geometry {
            slots: 256,
            buf_size: 2048,
        };
        let o = g.offsets();
        assert!(o.tx >= CSB_OFF + std::mem::size_of::<Csb>());
        assert_eq!(o.rx, o.tx + 256 * 8);
        assert!(o.bufs_off >= o.rx + 256 * 8);
        assert_eq!(o.bufs_off % PAGE, 0);
        assert!(o.len >= o.bufs_off + 512 * 2048);
    }
}
