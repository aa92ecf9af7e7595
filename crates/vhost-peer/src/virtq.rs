//! Where a virtio split queue's rings lie in guest memory, and one
//! descriptor as the frontend writes it (virtio 1.x, 2.7: the descriptor
//! table of 16-byte entries, the available ring `flags, idx, ring[num]`,
//! the used ring `flags, idx, ring[num] of (id, len)`).

/// `VIRTQ_DESC_F_NEXT`: the chain goes on at `next`.
pub const F_NEXT: u16 = 1;
/// `VIRTQ_DESC_F_WRITE`: the device writes this buffer (receive).
pub const F_WRITE: u16 = 2;
/// `VIRTQ_DESC_F_INDIRECT`: the buffer is a table of descriptors.
pub const F_INDIRECT: u16 = 4;

/// Where one queue's rings lie in the shared memory (offsets).
#[derive(Clone, Copy, Debug)]
pub struct Layout {
    /// Entries.
    pub num: u16,
    /// Descriptor table offset.
    pub desc: u64,
    /// Available ring offset.
    pub avail: u64,
    /// Used ring offset.
    pub used: u64,
}

impl Layout {
    /// Queue `q` of `num` entries (at most 2048), laid out from offset
    /// `q * 64 KiB`.
    pub fn standard(q: u64, num: u16) -> Layout {
        let base = q * 0x1_0000;
        Layout {
            num,
            desc: base,
            avail: base + 0x8000,
            used: base + 0xa000,
        }
    }

    /// Queue `q` (0 or 1) of `num` entries, up to the largest ring virtio
    /// allows (32,768), laid out from offset `q * 1 MiB`: the descriptor
    /// table (512 KiB at most), the available ring at +512 KiB, the used
    /// ring at +580 KiB. Two such queues fill the first 2 MiB; use at least
    /// [`LARGE_MEM`] bytes of memory, buffers from [`LARGE_BUFS`].
    pub fn large(q: u64, num: u16) -> Layout {
        let base = q << 20;
        Layout {
            num,
            desc: base,
            avail: base + 0x8_0000,
            used: base + 0x9_1000,
        }
    }

    /// The used entries (id, len) the device wrote to this ring in `mem`
    /// since `seen`, which moves past them.
    pub fn take_used(&self, mem: &crate::mem::SharedMem, seen: &mut u16) -> Vec<(u32, u32)> {
        let idx = mem.r16(self.used + 2);
        let mut out = Vec::new();
        while *seen != idx {
            let e = self.used + 4 + 8 * u64::from(*seen % self.num);
            out.push((mem.r32(e), mem.r32(e + 4)));
            *seen = seen.wrapping_add(1);
        }
        out
    }

    /// Offset of descriptor `i`.
    pub fn desc_at(&self, i: u16) -> u64 {
        self.desc + 16 * u64::from(i)
    }
}

/// Guest memory for two [`Layout::large`] queues and 1 MiB of buffers.
pub const LARGE_MEM: u64 = 4 << 20;
/// Where buffers start beside two [`Layout::large`] queues.
pub const LARGE_BUFS: u64 = 2 << 20;

// The buffers lie past both large queues and inside the memory.
const _: () = assert!(LARGE_BUFS >= 2 << 20 && LARGE_BUFS < LARGE_MEM);

/// One descriptor as the frontend writes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawDesc {
    /// Guest-physical address.
    pub addr: u64,
    /// Length.
    pub len: u32,
    /// Flags.
    pub flags: u16,
    /// Next.
    pub next: u16,
}

impl RawDesc {
    /// The 16 bytes of the descriptor table entry.
    pub fn bytes(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[0..8].copy_from_slice(&self.addr.to_le_bytes());
        b[8..12].copy_from_slice(&self.len.to_le_bytes());
        b[12..14].copy_from_slice(&self.flags.to_le_bytes());
        b[14..16].copy_from_slice(&self.next.to_le_bytes());
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_queues_do_not_overlap_each_other_or_the_buffers() {
        let n = 32768u64;
        for q in 0..2 {
            let l = Layout::large(q, 32768);
            assert!(l.desc + 16 * n <= l.avail);
            assert!(l.avail + 6 + 2 * n <= l.used);
            assert!(l.used + 6 + 8 * n <= (q + 1) << 20);
        }
    }
}
