//! In-flight descriptor tracking in a region shared with the frontend
//! (`VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD`), so that a switch that dies
//! and is started again loses no descriptor the guest posted and uses none
//! twice.
//!
//! # What the protocol says
//!
//! The frontend asks for the region with `GET_INFLIGHT_FD` (giving the
//! number of queues and their size); the backend allocates it, lays it out
//! as it likes, and returns a descriptor and its size. The frontend keeps
//! the descriptor: when it connects to a backend again (the backend
//! restarted), it hands the same region back with `SET_INFLIGHT_FD` before
//! it starts the queues. For split rings the specification (QEMU's
//! `docs/interop/vhost-user.rst`, "Inflight I/O tracking") gives each
//! queue this region, all little-endian:
//!
//! ```text
//! QueueRegionSplit  features u64, version u16 (0: not initialised, 1),
//!                   desc_num u16, last_batch_head u16, used_idx u16,
//!                   desc[desc_num] DescStateSplit
//! DescStateSplit    inflight u8, padding [u8; 5], next u16, counter u64
//! ```
//!
//! and the backend's steps:
//! - taking a head `i` from the available ring: `desc[i].counter` = a
//!   counter that grows with every head taken, then `desc[i].inflight` = 1;
//! - returning heads as used, one batch: for each head `i` of the batch,
//!   `desc[i].next` = `last_batch_head`, `last_batch_head` = `i`; then the
//!   used ring (entries, then `used.idx`, with a barrier); then
//!   `desc[i].inflight` = 0 for each head of the batch; then the region's
//!   `used_idx` = `used.idx`;
//! - after a reconnect: if the region's `used_idx` is not the used ring's
//!   `idx`, the backend died between publishing a batch and clearing it,
//!   so the batch (walked from `last_batch_head` by `next`) is cleared and
//!   `used_idx` set; the heads still in flight are then resubmitted, in
//!   the order of their counters.
//!
//! This module lays a queue's region out as above, at a 64-byte aligned
//! stride of [`queue_bytes`] per queue.
//!
//! # What QEMU's vhost-user-net does (checked in its source)
//!
//! QEMU's network device does not use this region: only its block and
//! SCSI vhost-user devices send `GET_INFLIGHT_FD`. When the backend's
//! socket closes, `net/vhost-user.c` (`net_vhost_user_event`,
//! `CHR_EVENT_CLOSED` -> `chr_closed_bh`) saves the acknowledged features
//! and sets the link down; stopping the vhost device calls
//! `GET_VRING_BASE`, which fails on the dead socket, so
//! `hw/virtio/vhost.c` (`vhost_virtqueue_stop`) falls back to
//! `virtio_queue_restore_last_avail_idx`: the next available entry becomes
//! the **used ring's index read from guest memory**. With
//! `-chardev socket,...,reconnect-ms=N` the chardev connects again every N
//! ms; on `CHR_EVENT_OPENED` `vhost_user_start` sets the device up again
//! (features, owner, protocol features), the link goes up, and the queues
//! start as at boot (memory table, size, `SET_VRING_BASE` with that used
//! index, addresses, kick, call, enable), with the features acknowledged
//! before. The guest sees nothing but a pause.
//!
//! # What the backend must do, and does
//!
//! The switch completes chains in the order it takes them (both queues),
//! and a forwarding pass takes, forwards and returns its chains before
//! the next. So the chains in flight when the switch dies are exactly the
//! available entries from the used ring's index on, in order; starting
//! the queue there (what QEMU asks for) takes each of them again, once.
//! A used entry written but not yet published is written again; a
//! receive buffer filled but not published is filled again (the frame in
//! it was never visible). What cannot be told apart at a `SIGKILL` is a
//! frame delivered to another port and not yet returned to its sender:
//! it is sent again (at most the one batch in flight); none is lost.
//!
//! With the region (a frontend that asks for it), the same start is
//! checked against it: the last batch is repaired as the specification
//! says, the heads in flight are sorted by counter, and they must be the
//! available entries from the used index on (an in-order device took
//! them so); the queue then starts at the used index, which resubmits
//! them in order. The region is the frontend's memory as much as ours:
//! every field read from it is checked (version, `desc_num`, the head
//! `last_batch_head`, the batch length the two used indices imply, the
//! `inflight` bytes, the heads' order), the work is one pass over
//! `desc_num` entries and a sort, and a region that fails a check stops
//! that queue only ([`InflightError`], counted where queues break), as
//! an impossible ring index does.

use std::fs::File;
use std::ptr::NonNull;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{fence, AtomicU16, AtomicU64, AtomicU8};
use std::sync::Arc;

use super::mem::{GuestAddr, GuestMemory, MemError, RegionSpec};

/// The region layout's version.
pub const VERSION: u16 = 1;
/// Bytes of a queue region's header.
const HEADER: u64 = 16;
/// Bytes of one descriptor's state.
const DESC_STATE: u64 = 16;
/// Each queue's region starts at a multiple of this.
const ALIGN: u64 = 64;

/// Bytes of one queue's region for queues of `queue_size` entries.
pub const fn queue_bytes(queue_size: u16) -> u64 {
    let n = HEADER + DESC_STATE * queue_size as u64;
    n.div_ceil(ALIGN) * ALIGN
}

/// Why the region could not be made or mapped.
#[derive(Debug, thiserror::Error)]
pub enum RegionError {
    /// Queue count or size out of range.
    #[error("{num_queues} queues of {queue_size} entries (1..={max_queues} queues of a power of two up to 32768)")]
    Shape {
        /// Queues asked for.
        num_queues: u16,
        /// Their size.
        queue_size: u16,
        /// Queues of this device.
        max_queues: usize,
    },
    /// The size given for a region handed back is less than its queues
    /// need, or its offset is not aligned.
    #[error("region of {size} bytes at offset {offset} for {num_queues} queues of {queue_size} (at least {need} bytes, at a 64-byte aligned offset)")]
    Size {
        /// Bytes given.
        size: u64,
        /// Offset given.
        offset: u64,
        /// Queues.
        num_queues: u16,
        /// Their size.
        queue_size: u16,
        /// Bytes needed.
        need: u64,
    },
    /// The memfd could not be made.
    #[error("making the region's memfd")]
    Create(#[source] std::io::Error),
    /// The file was refused or could not be mapped (the checks of guest
    /// memory: a memfd sealed against shrinking, not hugetlbfs, long
    /// enough).
    #[error("mapping the region")]
    Map(#[source] MemError),
}

/// Why a queue's region cannot be trusted (the queue stops).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum InflightError {
    /// A version this backend does not know.
    #[error("in-flight region: version {0} (0 or {VERSION} expected)")]
    Version(u16),
    /// The region was laid out for another queue size.
    #[error("in-flight region: desc_num {found}, the ring has {num}")]
    DescNum {
        /// What the region says.
        found: u16,
        /// The ring's size.
        num: u16,
    },
    /// The ring is larger than the region's queues.
    #[error("in-flight region made for queues of {region}, the ring has {num}")]
    QueueSize {
        /// The region's queue size.
        region: u16,
        /// The ring's size.
        num: u16,
    },
    /// The last batch is longer than a ring, or starts outside it.
    #[error("in-flight region: last batch of {len} heads from head {head} (ring of {num})")]
    Batch {
        /// Heads between the region's and the ring's used index.
        len: u16,
        /// `last_batch_head`.
        head: u16,
        /// The ring's size.
        num: u16,
    },
    /// A batch entry's `next` is outside the ring.
    #[error("in-flight region: batch link {0} outside the ring")]
    Link(u16),
    /// An `inflight` byte other than 0 or 1.
    #[error("in-flight region: head {head} has inflight = {value}")]
    Flag {
        /// The head.
        head: u16,
        /// The byte.
        value: u8,
    },
    /// More heads in flight than the guest made available.
    #[error("in-flight region: {inflight} heads in flight, {avail} available past the used index")]
    Count {
        /// Heads marked in flight.
        inflight: u16,
        /// Available entries past the used index.
        avail: u16,
    },
    /// The heads in flight are not the available entries from the used
    /// index on, in counter order.
    #[error("in-flight region: the {k}-th head in flight is {head}, the available ring has {found} there")]
    Order {
        /// Position from the used index.
        k: u16,
        /// The head in flight.
        head: u16,
        /// The available ring's entry.
        found: u16,
    },
}

/// A region of in-flight state for all queues: made here
/// ([`Region::create`], `GET_INFLIGHT_FD`) or handed back by the frontend
/// ([`Region::map`], `SET_INFLIGHT_FD`).
pub struct Region {
    mem: GuestMemory,
    /// Bytes of each queue's region.
    stride: u64,
    num_queues: u16,
    queue_size: u16,
}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} queues of {} ({} bytes each)",
            self.num_queues, self.queue_size, self.stride
        )
    }
}

/// The largest queue a split ring may have.
pub const MAX_QUEUE_SIZE: u32 = 32768;

fn check_shape(num_queues: u16, queue_size: u16, max_queues: usize) -> Result<(), RegionError> {
    let ok = num_queues >= 1
        && usize::from(num_queues) <= max_queues
        && queue_size.is_power_of_two()
        && u32::from(queue_size) <= MAX_QUEUE_SIZE;
    if ok {
        Ok(())
    } else {
        Err(RegionError::Shape {
            num_queues,
            queue_size,
            max_queues,
        })
    }
}

impl Region {
    /// Make a zeroed region for `num_queues` queues (at most
    /// `max_queues`) of `queue_size` entries: a memfd sealed against
    /// shrinking and growing, mapped here. Returns it and the descriptor
    /// for the frontend, and the region's size.
    pub fn create(
        num_queues: u16,
        queue_size: u16,
        max_queues: usize,
    ) -> Result<(Region, File, u64), RegionError> {
        check_shape(num_queues, queue_size, max_queues)?;
        let stride = queue_bytes(queue_size);
        let size = stride * u64::from(num_queues);
        let fd = rustix::fs::memfd_create(
            "vhost-inflight",
            rustix::fs::MemfdFlags::CLOEXEC | rustix::fs::MemfdFlags::ALLOW_SEALING,
        )
        .map_err(|e| RegionError::Create(e.into()))?;
        rustix::fs::ftruncate(&fd, size).map_err(|e| RegionError::Create(e.into()))?;
        rustix::fs::fcntl_add_seals(
            &fd,
            rustix::fs::SealFlags::SHRINK | rustix::fs::SealFlags::GROW,
        )
        .map_err(|e| RegionError::Create(e.into()))?;
        let file = File::from(fd);
        let ours = file.try_clone().map_err(RegionError::Create)?;
        let region = Region::map_file(ours, size, 0, num_queues, queue_size)?;
        Ok((region, file, size))
    }

    /// Map a region the frontend hands back: `size` bytes at `offset` of
    /// `file`, for `num_queues` of `queue_size`; every check of guest
    /// memory applies to the file.
    pub fn map(
        file: File,
        size: u64,
        offset: u64,
        num_queues: u16,
        queue_size: u16,
        max_queues: usize,
    ) -> Result<Region, RegionError> {
        check_shape(num_queues, queue_size, max_queues)?;
        Region::map_file(file, size, offset, num_queues, queue_size)
    }

    fn map_file(
        file: File,
        size: u64,
        offset: u64,
        num_queues: u16,
        queue_size: u16,
    ) -> Result<Region, RegionError> {
        let stride = queue_bytes(queue_size);
        let need = stride * u64::from(num_queues);
        if size < need || !offset.is_multiple_of(ALIGN) {
            return Err(RegionError::Size {
                size,
                offset,
                num_queues,
                queue_size,
                need,
            });
        }
        let spec = RegionSpec {
            guest_phys_addr: 0,
            memory_size: need,
            user_addr: 0,
            mmap_offset: offset,
        };
        let mem = GuestMemory::map(&[spec], vec![file]).map_err(RegionError::Map)?;
        Ok(Region {
            mem,
            stride,
            num_queues,
            queue_size,
        })
    }

    /// Queues the region holds.
    pub fn num_queues(&self) -> u16 {
        self.num_queues
    }

    /// Entries of each queue the region was made for.
    pub fn queue_size(&self) -> u16 {
        self.queue_size
    }

    /// Queue `i`'s part, if the region has one.
    pub fn queue(self: &Arc<Region>, i: usize) -> Option<QueueRegion> {
        if i >= usize::from(self.num_queues) {
            return None;
        }
        let at = self.stride * i as u64;
        let p = self.mem.gpa(GuestAddr(at), self.stride)?;
        Some(QueueRegion {
            base: p.as_non_null(),
            region: self.clone(),
        })
    }
}

/// One queue's part of a [`Region`].
pub struct QueueRegion {
    /// Keeps the mapping `base` points into.
    region: Arc<Region>,
    /// The queue's header, 64-byte aligned (the mapping is page aligned,
    /// the offset and stride multiples of 64).
    base: NonNull<u8>,
}

// SAFETY: the pointer points into the mapping `region` keeps alive; the
// region is used by one thread at a time, through atomics only.
unsafe impl Send for QueueRegion {}

impl QueueRegion {
    fn u16_at(&self, off: u64) -> &AtomicU16 {
        debug_assert!(off + 2 <= self.region.stride);
        // SAFETY: off + 2 <= stride, so the field lies inside this queue's
        // part of the mapping `region` keeps; off is even and the base
        // 64-aligned; atomics only, so the frontend writing is no race.
        unsafe { self.base.add(off as usize).cast::<AtomicU16>().as_ref() }
    }

    fn version(&self) -> &AtomicU16 {
        self.u16_at(8)
    }
    fn desc_num(&self) -> &AtomicU16 {
        self.u16_at(10)
    }
    fn last_batch_head(&self) -> &AtomicU16 {
        self.u16_at(12)
    }
    fn used_idx(&self) -> &AtomicU16 {
        self.u16_at(14)
    }

    /// Descriptor `i`'s state: inflight, next, counter. Callers pass
    /// `i < queue_size`.
    fn desc(&self, i: u16) -> (&AtomicU8, &AtomicU16, &AtomicU64) {
        debug_assert!(i < self.region.queue_size);
        let off = HEADER + DESC_STATE * u64::from(i);
        // SAFETY: i < queue_size, so the 16 bytes at off lie inside this
        // queue's part (stride >= 16 + 16 * queue_size); offsets 0, 6, 8
        // are aligned for u8, u16, u64 (base 64-aligned, off a multiple of
        // 16); atomics only.
        unsafe {
            let p = self.base.add(off as usize);
            (
                p.cast::<AtomicU8>().as_ref(),
                p.add(6).cast::<AtomicU16>().as_ref(),
                p.add(8).cast::<AtomicU64>().as_ref(),
            )
        }
    }
}

/// What a queue's start found in its region.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Recovered {
    /// Heads still in flight, taken again from the used index on.
    pub resubmitted: u16,
    /// Heads of a last batch that was published but not cleared.
    pub repaired: u16,
    /// Whether the region was fresh (version 0) and initialised here.
    pub fresh: bool,
}

/// The tracking of one running queue: marks heads in flight as they are
/// taken and clears them once their used entries are published.
pub struct Tracker {
    q: QueueRegion,
    num: u16,
    counter: u64,
    last_batch_head: u16,
    /// Heads returned since the last publish.
    batch: Vec<u16>,
}

impl Tracker {
    /// Check the region against the ring and start tracking: `used` is the
    /// used ring's index (read from guest memory), `avail` the available
    /// index, `entry(k)` the available ring's entry `used + k`. The queue
    /// then starts at `used`.
    pub fn start(
        q: QueueRegion,
        num: u16,
        used: u16,
        avail: u16,
        entry: impl Fn(u16) -> u16,
    ) -> Result<(Tracker, Recovered), InflightError> {
        if num > q.region.queue_size {
            return Err(InflightError::QueueSize {
                region: q.region.queue_size,
                num,
            });
        }
        let mut rec = Recovered::default();
        let version = q.version().load(Acquire);
        if version == 0 {
            // Fresh (or given back unused): lay it out; nothing in flight.
            for i in 0..num {
                let (f, n, c) = q.desc(i);
                f.store(0, Relaxed);
                n.store(0, Relaxed);
                c.store(0, Relaxed);
            }
            q.desc_num().store(num, Relaxed);
            q.last_batch_head().store(0, Relaxed);
            q.used_idx().store(used, Relaxed);
            q.version().store(VERSION, Release);
            rec.fresh = true;
            let t = Tracker {
                q,
                num,
                counter: 1,
                last_batch_head: 0,
                batch: Vec::new(),
            };
            return Ok((t, rec));
        }
        if version != VERSION {
            return Err(InflightError::Version(version));
        }
        let found = q.desc_num().load(Relaxed);
        if found != num {
            return Err(InflightError::DescNum { found, num });
        }
        // A batch published but not cleared: clear it (each field read
        // once, the walk bounded by the batch's length).
        let region_used = q.used_idx().load(Relaxed);
        let len = used.wrapping_sub(region_used);
        let head = q.last_batch_head().load(Relaxed);
        if len != 0 {
            if len > num || head >= num {
                return Err(InflightError::Batch { len, head, num });
            }
            let mut i = head;
            for k in 0..len {
                let (f, n, _) = q.desc(i);
                f.store(0, Relaxed);
                if k + 1 < len {
                    i = n.load(Relaxed);
                    if i >= num {
                        return Err(InflightError::Link(i));
                    }
                }
            }
            fence(Release);
            q.used_idx().store(used, Relaxed);
            rec.repaired = len;
        }
        // The heads in flight, by counter.
        let mut inflight: Vec<(u64, u16)> = Vec::new();
        let mut counter = 0u64;
        for i in 0..num {
            let (f, _, c) = q.desc(i);
            let c = c.load(Relaxed);
            match f.load(Relaxed) {
                0 => {}
                1 => inflight.push((c, i)),
                value => return Err(InflightError::Flag { head: i, value }),
            }
            counter = counter.max(c);
        }
        let ahead = avail.wrapping_sub(used);
        let n = inflight.len() as u16; // at most num <= 32768
        if ahead > num || n > ahead {
            return Err(InflightError::Count {
                inflight: n,
                avail: ahead,
            });
        }
        inflight.sort_unstable();
        for (k, &(_, h)) in inflight.iter().enumerate() {
            let k = k as u16;
            let found = entry(k);
            if found != h {
                return Err(InflightError::Order { k, head: h, found });
            }
        }
        rec.resubmitted = n;
        let t = Tracker {
            q,
            num,
            counter: counter.wrapping_add(1),
            last_batch_head: head.min(num - 1),
            batch: Vec::new(),
        };
        Ok((t, rec))
    }

    /// A head taken from the available ring (checked `< num` by the
    /// caller): its counter, then its flag.
    #[inline]
    pub fn take(&mut self, head: u16) {
        if head >= self.num {
            return;
        }
        let (f, _, c) = self.q.desc(head);
        c.store(self.counter, Relaxed);
        self.counter = self.counter.wrapping_add(1);
        fence(Release);
        f.store(1, Relaxed);
    }

    /// A head's used entry is written (not yet published): it joins the
    /// batch.
    #[inline]
    pub fn used(&mut self, head: u16) {
        if head >= self.num {
            return;
        }
        let (_, n, _) = self.q.desc(head);
        n.store(self.last_batch_head, Relaxed);
        self.last_batch_head = head;
        self.q.last_batch_head().store(head, Release);
        self.batch.push(head);
    }

    /// The used index `used_idx` is published: the batch is no longer in
    /// flight.
    #[inline]
    pub fn published(&mut self, used_idx: u16) {
        if self.batch.is_empty() {
            return;
        }
        fence(Release);
        for &h in &self.batch {
            self.q.desc(h).0.store(0, Relaxed);
        }
        fence(Release);
        self.q.used_idx().store(used_idx, Relaxed);
        self.batch.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_the_specification_s() {
        assert_eq!(queue_bytes(1), 64);
        assert_eq!(queue_bytes(256), 16 + 16 * 256 + 48);
        let (r, _f, size) = Region::create(2, 8, 2).unwrap();
        assert_eq!(size, 2 * queue_bytes(8));
        assert!(Region::create(3, 8, 2).is_err());
        assert!(Region::create(2, 7, 2).is_err());
        let r = Arc::new(r);
        let q = r.queue(1).unwrap();
        assert!(r.queue(2).is_none());
        let (mut t, rec) = Tracker::start(q, 8, 5, 5, |_| 0).unwrap();
        assert!(rec.fresh);
        t.take(3);
        t.take(4);
        let q = r.queue(1).unwrap();
        assert_eq!(q.version().load(Relaxed), 1);
        assert_eq!(q.desc(3).0.load(Relaxed), 1);
        assert!(q.desc(4).2.load(Relaxed) > q.desc(3).2.load(Relaxed));
        t.used(3);
        t.used(4);
        assert_eq!(q.last_batch_head().load(Relaxed), 4);
        assert_eq!(q.desc(4).1.load(Relaxed), 3);
        t.published(7);
        assert_eq!(q.desc(3).0.load(Relaxed), 0);
        assert_eq!(q.used_idx().load(Relaxed), 7);
    }

    #[test]
    fn a_batch_published_but_not_cleared_is_repaired_and_the_rest_resubmitted() {
        let (r, _f, _) = Region::create(1, 8, 2).unwrap();
        let r = Arc::new(r);
        let (mut t, _) = Tracker::start(r.queue(0).unwrap(), 8, 0, 0, |_| 0).unwrap();
        // Heads 2, 5, 1 taken in that order; 2 and 5 returned and the used
        // index published (2), then the switch died before clearing them.
        for h in [2, 5, 1] {
            t.take(h);
        }
        t.used(2);
        t.used(5);
        drop(t);
        let ring = [2u16, 5, 1];
        let (_, rec) =
            Tracker::start(r.queue(0).unwrap(), 8, 2, 3, |k| ring[2 + k as usize]).unwrap();
        assert_eq!(
            rec,
            Recovered {
                resubmitted: 1,
                repaired: 2,
                fresh: false
            }
        );
    }

    #[test]
    fn lying_regions_are_refused() {
        let (r, _f, _) = Region::create(1, 8, 2).unwrap();
        let r = Arc::new(r);
        let (mut t, _) = Tracker::start(r.queue(0).unwrap(), 8, 0, 0, |_| 0).unwrap();
        t.take(6);
        drop(t);
        let q = || r.queue(0).unwrap();
        // In flight, but not what the available ring holds there.
        let e = Tracker::start(q(), 8, 0, 1, |_| 4).err().unwrap();
        assert!(matches!(e, InflightError::Order { .. }), "{e}");
        // In flight, but nothing available.
        let e = Tracker::start(q(), 8, 0, 0, |_| 6).err().unwrap();
        assert!(matches!(e, InflightError::Count { .. }), "{e}");
        // A batch longer than the ring.
        let e = Tracker::start(q(), 8, 100, 100, |_| 6).err().unwrap();
        assert!(matches!(e, InflightError::Batch { .. }), "{e}");
        // Another size.
        let e = Tracker::start(q(), 4, 0, 1, |_| 6).err().unwrap();
        assert!(matches!(e, InflightError::DescNum { .. }), "{e}");
        q().desc(2).0.store(7, Relaxed);
        let e = Tracker::start(q(), 8, 0, 1, |_| 6).err().unwrap();
        assert_eq!(e, InflightError::Flag { head: 2, value: 7 });
        q().version().store(9, Relaxed);
        let e = Tracker::start(q(), 8, 0, 1, |_| 6).err().unwrap();
        assert_eq!(e, InflightError::Version(9));
    }
}
