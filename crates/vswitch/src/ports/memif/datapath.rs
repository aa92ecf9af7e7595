//! The memif datapath: the client's regions mapped, its rings checked, and
//! the switch port that copies frames in and out of them.
//!
//! Everything read from the client's memory is validated as in
//! [`ring::device`]: region indices, offsets and lengths against the mapped
//! sizes, counters against the ring size. Each value is read once, checked,
//! then used, so a client rewriting it meanwhile cannot change a decision.

use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd};
use std::ptr::NonNull;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release, SeqCst};
use std::time::{Duration, Instant};

use crate::status::{MemifDetail, PortDetail};
use memmap2::MmapRaw;
use ring::device::FrameRef;
use ring::notify::EventFd;

use super::layout::{
    ring_bytes, Desc, DescRepr, RingHeader, CACHE_LINE, COOKIE, RING_FLAG_MASK_INT,
};
use crate::ports::{Counters, Port};

/// Why a connected client's rings cannot become a port.
#[derive(Debug, thiserror::Error)]
pub enum RingError {
    /// The ring's cookie is not [`COOKIE`]: the client did not initialise it.
    #[error("ring cookie {found:#x} is not {COOKIE:#x}")]
    Cookie {
        /// What the ring header holds.
        found: u32,
    },
    /// The region a ring was added in is no longer there.
    #[error("ring region vanished")]
    RegionVanished,
    /// The ring does not lie, cache-line aligned, inside its region.
    #[error("ring does not fit its region")]
    Misfit,
}

/// A region the client shared, mapped (shared, read-write).
pub(super) struct Region {
    map: MmapRaw,
    size: usize,
}

impl Region {
    /// Map the first `size` bytes of `file`. The caller has checked that the
    /// file is at least that long and sealed against shrinking.
    pub(super) fn map(file: &File, size: usize) -> std::io::Result<Region> {
        let map = memmap2::MmapOptions::new().len(size).map_raw(file)?;
        Ok(Region { map, size })
    }

    /// Whether a ring of `2^log2` descriptors at `offset` lies inside the
    /// region and is cache-line aligned.
    pub(super) fn fits_ring(&self, offset: u32, log2: u8) -> bool {
        offset as usize + ring_bytes(log2) <= self.size
            && (offset as usize).is_multiple_of(CACHE_LINE)
    }

    /// The `len` bytes at `off`, if they lie inside the region.
    #[inline]
    fn bytes(&self, off: u32, len: u32) -> Option<NonNull<u8>> {
        if (off as usize).checked_add(len as usize)? > self.size {
            return None;
        }
        // SAFETY: off + len <= size, so the pointer stays inside the mapping.
        NonNull::new(unsafe { self.map.as_mut_ptr().add(off as usize) })
    }
}

/// A ring the client added, not yet checked for its cookie.
pub(super) struct RingInfo {
    /// Region index.
    pub region: u16,
    /// Offset in the region, checked against it with [`Region::fits_ring`].
    pub offset: u32,
    /// log2 of the number of descriptors.
    pub log2: u8,
    /// The ring's interrupt eventfd.
    pub int: EventFd,
}

/// One ring in the client's memory, with everything needed to check it.
struct MRing {
    hdr: NonNull<RingHeader>,
    descs: NonNull<Desc>,
    mask: u16,
    size: u16,
    int: EventFd,
}

impl MRing {
    /// Point at a ring in `regions`, and check its cookie.
    fn new(regions: &[Option<Region>], r: RingInfo) -> Result<MRing, RingError> {
        let reg = regions
            .get(r.region as usize)
            .and_then(|x| x.as_ref())
            .ok_or(RingError::RegionVanished)?;
        if !reg.fits_ring(r.offset, r.log2) {
            return Err(RingError::Misfit);
        }
        let len = u32::try_from(ring_bytes(r.log2)).map_err(|_| RingError::Misfit)?;
        let base = reg.bytes(r.offset, len).ok_or(RingError::Misfit)?;
        let hdr = base.cast::<RingHeader>();
        // SAFETY: the header and 2^log2 descriptors lie inside the mapping,
        // the offset is cache-line aligned in a page-aligned mapping (both
        // checked just above).
        let descs = unsafe { base.add(std::mem::size_of::<RingHeader>()) }.cast::<Desc>();
        let ring = MRing {
            hdr,
            descs,
            mask: (1u16 << r.log2) - 1,
            size: 1u16 << r.log2,
            int: r.int,
        };
        let found = ring.hdr().client.cookie.load(Acquire);
        if found != COOKIE {
            return Err(RingError::Cookie { found });
        }
        Ok(ring)
    }

    #[inline]
    fn hdr(&self) -> &RingHeader {
        // SAFETY: hdr points at a RingHeader inside a mapping the port owns
        // (and keeps until it is dropped), suitably aligned (checked in
        // MRing::new); every field is an atomic, so the peer writing it
        // concurrently is no data race.
        unsafe { self.hdr.as_ref() }
    }

    #[inline]
    fn desc(&self, slot: u16) -> &Desc {
        // SAFETY: (slot & mask) < ring size, and all the ring's descriptors
        // lie inside the owned mapping (checked in MRing::new); atomics only.
        unsafe { self.descs.add((slot & self.mask) as usize).as_ref() }
    }
}

/// The switch port over a connected memif.
pub struct MemifPort {
    name: String,
    peer: String,
    regions: Vec<Option<Region>>,
    c2s: MRing,
    s2c: MRing,
    c2s_next: u16,
    s2c_next: u16,
    s2c_published: u16,
    broken: Option<String>,
    c: Counters,
    bad_desc: u64,
    too_long: u64,
    /// Interrupt moderation (zero: off; see `Config::memif_moderation`).
    moderation: Duration,
    /// While the switch sleeps moderated: when to look again.
    look_at: Option<Instant>,
    /// Moderated looks in a row that found nothing.
    quiet: u32,
    /// Moderated sleeps so far, for the status document.
    moderated_sleeps: u64,
}

/// How many slots ahead [`MemifPort::tx_batch`] prefetches the buffer it
/// will copy into (8 measured better than a whole chunk of 32 first).
const TX_AHEAD: u16 = 8;

/// Moderated looks in a row that find nothing before a memif port unmasks
/// its client's interrupts and lets the switch sleep until one comes.
pub const QUIET_WAKES: u32 = 64;

// SAFETY: the ring pointers point into mappings this port owns; the port
// is used by one thread at a time.
unsafe impl Send for MemifPort {}

impl MemifPort {
    /// A port over the client's ring 0 in each direction.
    pub(super) fn new(
        name: String,
        peer: String,
        regions: Vec<Option<Region>>,
        c2s: RingInfo,
        s2c: RingInfo,
    ) -> Result<MemifPort, RingError> {
        let c2s = MRing::new(&regions, c2s)?;
        let s2c = MRing::new(&regions, s2c)?;
        let c2s_next = c2s.hdr().server.tail.load(Acquire);
        let s2c_next = s2c.hdr().server.tail.load(Acquire);
        Ok(MemifPort {
            name,
            peer,
            c2s_next,
            s2c_next,
            s2c_published: s2c_next,
            regions,
            c2s,
            s2c,
            broken: None,
            c: Counters::default(),
            bad_desc: 0,
            too_long: 0,
            moderation: Duration::ZERO,
            look_at: None,
            quiet: 0,
            moderated_sleeps: 0,
        })
    }

    /// Sets interrupt moderation (zero: off, the client's interrupts stay
    /// unmasked).
    pub fn set_moderation(&mut self, every: Duration) {
        self.moderation = every;
    }

    /// Masks or unmasks the client's interrupts on the ring the switch
    /// receives from (the flags are the ring receiver's to write).
    fn mask(&self, masked: bool) {
        let f = &self.c2s.hdr().client.flags;
        let old = f.load(Relaxed);
        let new = if masked {
            old | RING_FLAG_MASK_INT
        } else {
            old & !RING_FLAG_MASK_INT
        };
        if new != old {
            // SeqCst: the store must be visible before the switch looks at
            // head again (prepare_sleep), or a frame sent in between would
            // neither be seen nor signalled.
            f.store(new, SeqCst);
        }
    }

    /// Prefetches the buffer of the server-to-client slot `ahead` slots
    /// past the next one, if its descriptor names a possible one.
    #[inline]
    fn prefetch_s2c(&self, ahead: u16) {
        let d = self.s2c.desc(self.s2c_next.wrapping_add(ahead)).read();
        if let Some(p) = self.buffer(d) {
            maio::prefetch(p.as_ptr());
        }
    }

    /// The buffer a descriptor names, if its region, offset and length are
    /// possible.
    #[inline]
    fn buffer(&self, d: DescRepr) -> Option<NonNull<u8>> {
        self.regions
            .get(d.region as usize)?
            .as_ref()?
            .bytes(d.offset, d.length)
    }
}

impl Port for MemifPort {
    fn name(&self) -> &str {
        &self.name
    }
    fn kind(&self) -> &'static str {
        "memif"
    }
    fn fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.c2s.int.as_fd())
    }
    fn on_event(&mut self) {
        self.c2s.int.drain();
    }
    fn pending(&mut self) -> bool {
        self.broken.is_none() && self.c2s.hdr().client.head.load(Acquire) != self.c2s_next
    }
    fn deadline(&self) -> Option<Instant> {
        self.look_at
    }
    fn prepare_sleep(&mut self) -> bool {
        if self.moderation.is_zero() || self.broken.is_some() {
            return true;
        }
        let moderated = self.quiet < QUIET_WAKES;
        self.mask(moderated);
        if moderated {
            self.look_at = Some(Instant::now() + self.moderation);
            self.moderated_sleeps += 1;
            true
        } else {
            self.look_at = None;
            // Unmasked now: a frame sent before the client saw that was not
            // signalled, so look once more before sleeping.
            !self.pending()
        }
    }
    fn wake(&mut self) {
        let looked = self.look_at.take().is_some();
        if self.pending() {
            self.quiet = 0;
        } else if looked {
            self.quiet = self.quiet.saturating_add(1);
        }
    }
    fn rx(&mut self, max: u32, out: &mut Vec<FrameRef>) -> u32 {
        let head = self.c2s.hdr().client.head.load(Acquire);
        let avail = head.wrapping_sub(self.c2s_next);
        if avail > self.c2s.size {
            self.broken = Some(format!(
                "c2s head {head} impossible (next {})",
                self.c2s_next
            ));
            return 0;
        }
        let n = (avail as u32).min(max) as u16;
        for k in 0..n {
            let d = self.c2s.desc(self.c2s_next.wrapping_add(k)).read();
            match self.buffer(d) {
                Some(p) if d.length > 0 => out.push(FrameRef {
                    ptr: p.as_ptr(),
                    len: d.length,
                }),
                _ => self.bad_desc += 1,
            }
        }
        n as u32
    }
    fn rx_done(&mut self, token: u32, frames: u64, _now: Instant) {
        self.c2s_next = self.c2s_next.wrapping_add(token as u16);
        self.c2s.hdr().server.tail.store(self.c2s_next, Release);
        self.c.from_port += frames;
    }
    unsafe fn tx(&mut self, f: FrameRef) -> bool {
        if self.broken.is_some() {
            return false;
        }
        let head = self.s2c.hdr().client.head.load(Acquire);
        let space = head.wrapping_sub(self.s2c_next);
        if space > self.s2c.size {
            self.broken = Some(format!(
                "s2c head {head} impossible (tail {})",
                self.s2c_next
            ));
            return false;
        }
        if space == 0 {
            self.c.dropped_full += 1;
            return false;
        }
        let desc = self.s2c.desc(self.s2c_next);
        let d = desc.read();
        let Some(dst) = self.buffer(d) else {
            self.bad_desc += 1;
            self.c.dropped_full += 1;
            return false;
        };
        if f.len > d.length {
            // Chained buffers are not supported: one frame, one buffer.
            self.too_long += 1;
            self.c.dropped_full += 1;
            return false;
        }
        // SAFETY: dst has d.length >= f.len bytes inside the client's region
        // (checked by buffer); the caller guarantees f is readable.
        unsafe { std::ptr::copy_nonoverlapping(f.ptr, dst.as_ptr(), f.len as usize) };
        desc.length.store(f.len, Relaxed);
        desc.flags.store(0, Relaxed);
        self.s2c_next = self.s2c_next.wrapping_add(1);
        self.c.to_port += 1;
        self.c.to_port_bytes += f.len as u64;
        true
    }
    unsafe fn tx_batch(&mut self, frames: &[FrameRef]) -> u64 {
        if self.broken.is_some() {
            return 0;
        }
        // One look at the client's head per batch, not per frame.
        let head = self.s2c.hdr().client.head.load(Acquire);
        let space = head.wrapping_sub(self.s2c_next);
        if space > self.s2c.size {
            self.broken = Some(format!(
                "s2c head {head} impossible (tail {})",
                self.s2c_next
            ));
            return 0;
        }
        let mut ok = 0u64;
        let mut bytes = 0u64;
        let mut dropped = 0u64;
        let mut left = space;
        // The buffer TX_AHEAD slots ahead is prefetched as each frame is
        // copied (the client read it last, on another core: each is a
        // miss), so that the misses overlap. One after another, the stores
        // into the buffers were most of the time forwarding took. The
        // descriptor read for a prefetch only aims the hint; the copy uses
        // its own read, checked.
        for k in 0..TX_AHEAD.min(left) {
            self.prefetch_s2c(k);
        }
        for f in frames {
            if left == 0 {
                dropped += 1;
                continue;
            }
            if left > TX_AHEAD {
                self.prefetch_s2c(TX_AHEAD);
            }
            let desc = self.s2c.desc(self.s2c_next);
            let d = desc.read();
            let Some(dst) = self.buffer(d) else {
                self.bad_desc += 1;
                dropped += 1;
                continue;
            };
            if f.len > d.length {
                // Chained buffers are not supported: one frame, one buffer.
                self.too_long += 1;
                dropped += 1;
                continue;
            }
            // SAFETY: dst has d.length >= f.len bytes inside the client's
            // region (checked by buffer); the caller guarantees f is readable.
            unsafe { ring::device::copy_frame(f.ptr, dst.as_ptr(), f.len as usize) };
            desc.length.store(f.len, Relaxed);
            desc.flags.store(0, Relaxed);
            self.s2c_next = self.s2c_next.wrapping_add(1);
            left -= 1;
            ok += 1;
            bytes += u64::from(f.len);
        }
        self.c.to_port += ok;
        self.c.to_port_bytes += bytes;
        self.c.dropped_full += dropped;
        ok
    }
    fn tx_flush(&mut self, _now: Instant) {
        if self.s2c_next == self.s2c_published {
            return;
        }
        self.s2c_published = self.s2c_next;
        self.s2c.hdr().server.tail.store(self.s2c_next, Release);
        if self.s2c.hdr().client.flags.load(Relaxed) & RING_FLAG_MASK_INT == 0 {
            self.s2c.int.signal();
        }
    }
    fn broken(&self) -> Option<&str> {
        self.broken.as_deref()
    }
    fn counters(&mut self) -> &mut Counters {
        &mut self.c
    }
    fn status(&self) -> PortDetail {
        PortDetail::Memif(MemifDetail {
            peer: self.peer.clone(),
            ring_size: self.c2s.size,
            bad_descriptors: self.bad_desc,
            too_long: self.too_long,
            moderation_us: self.moderation.as_micros() as u64,
            moderated_sleeps: self.moderated_sleeps,
            interrupts_masked: self.c2s.hdr().client.flags.load(Relaxed) & RING_FLAG_MASK_INT != 0,
            signals_blocked: self.s2c.int.stats().blocked(),
            broken: self.broken.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ports::memif::layout::COOKIE;
    use proptest::prelude::*;
    use std::os::fd::FromRawFd;

    const LOG2: u8 = 6;
    const SLOTS: usize = 1 << LOG2;
    /// The client-to-server ring at 0, the server-to-client ring after it,
    /// then one buffer per slot.
    const S2C: usize = ring_bytes(LOG2);
    const BUFS: usize = 2 * ring_bytes(LOG2);
    const BUF: usize = 256;
    const SIZE: usize = BUFS + SLOTS * BUF;

    /// One server-to-client descriptor as the client posted it.
    #[derive(Clone, Copy, Debug)]
    enum Posted {
        /// A buffer of this capacity in slot `i`'s place.
        Good(u32),
        /// A region that is not there.
        NoRegion,
        /// An offset past the region's end.
        Outside,
    }

    fn posted() -> impl Strategy<Value = Posted> {
        prop_oneof![
            8 => (0u32..=BUF as u32).prop_map(Posted::Good),
            1 => Just(Posted::NoRegion),
            1 => Just(Posted::Outside),
        ]
    }

    /// A port over a fresh memfd laid out as above, and the client's view
    /// of that memory.
    fn port(tail: u16, space: u16, descs: &[Posted]) -> (MemifPort, memmap2::MmapMut) {
        // SAFETY: memfd_create with a NUL-terminated literal name.
        let fd = unsafe { libc::memfd_create(c"memif-test".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: fd is a fresh descriptor that nothing else owns.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(SIZE as u64).unwrap();
        // SAFETY: a shared mapping of the test's own memfd, which nothing
        // truncates while it lives.
        let mut client = unsafe { memmap2::MmapMut::map_mut(&file) }.unwrap();
        let put16 =
            |m: &mut [u8], at: usize, v: u16| m[at..at + 2].copy_from_slice(&v.to_le_bytes());
        let put32 =
            |m: &mut [u8], at: usize, v: u32| m[at..at + 4].copy_from_slice(&v.to_le_bytes());
        for ring in [0, S2C] {
            put32(&mut client, ring, COOKIE);
        }
        // c2s empty; s2c: `space` buffers posted after the server's tail.
        put16(&mut client, 6, tail);
        put16(&mut client, 64, tail);
        put16(&mut client, S2C + 6, tail.wrapping_add(space));
        put16(&mut client, S2C + 64, tail);
        for (i, d) in descs.iter().enumerate() {
            let at = S2C + 128 + 16 * i;
            let (region, len, off) = match *d {
                Posted::Good(cap) => (0, cap, (BUFS + i * BUF) as u32),
                Posted::NoRegion => (1, BUF as u32, (BUFS + i * BUF) as u32),
                Posted::Outside => (0, BUF as u32, SIZE as u32 - 8),
            };
            put16(&mut client, at + 2, region);
            put32(&mut client, at + 4, len);
            put32(&mut client, at + 8, off);
        }
        let regions = vec![Some(Region::map(&file, SIZE).unwrap())];
        let ring = |offset: usize| RingInfo {
            region: 0,
            offset: offset as u32,
            log2: LOG2,
            int: EventFd::new().unwrap(),
        };
        let p = MemifPort::new("m".into(), "test".into(), regions, ring(0), ring(S2C)).unwrap();
        (p, client)
    }

    proptest! {
        /// `tx_batch` (prefetching slots ahead) does what taking the
        /// frames one by one would: the same frames in the same slots, the
        /// same counts, whatever the client posted.
        #[test]
        fn tx_batch_fills_slots_as_one_frame_at_a_time_would(
            tail in any::<u16>(),
            space in 0u16..=SLOTS as u16,
            descs in proptest::collection::vec(posted(), SLOTS),
            lens in proptest::collection::vec(1u32..=300, 0..100),
            seed in any::<u8>(),
        ) {
            let (mut p, client) = port(tail, space, &descs);
            let frames: Vec<Vec<u8>> = lens
                .iter()
                .enumerate()
                .map(|(i, &n)| (0..n).map(|b| (b as u8) ^ (i as u8).wrapping_mul(31) ^ seed).collect())
                .collect();
            let refs: Vec<FrameRef> = frames
                .iter()
                .map(|f| FrameRef { ptr: f.as_ptr(), len: f.len() as u32 })
                .collect();
            // The model: one frame at a time into the next slot.
            let (mut slot, mut left) = (tail, space);
            let (mut ok, mut dropped, mut bad, mut long) = (0u64, 0u64, 0u64, 0u64);
            let mut placed = Vec::new();
            for (i, f) in frames.iter().enumerate() {
                if left == 0 {
                    dropped += 1;
                    continue;
                }
                match descs[slot as usize % SLOTS] {
                    Posted::Good(cap) if f.len() as u32 <= cap => {
                        placed.push((slot as usize % SLOTS, i));
                        slot = slot.wrapping_add(1);
                        left -= 1;
                        ok += 1;
                    }
                    Posted::Good(_) => {
                        long += 1;
                        dropped += 1;
                    }
                    _ => {
                        bad += 1;
                        dropped += 1;
                    }
                }
            }
            // SAFETY: every FrameRef points into a live Vec of its length.
            let sent = unsafe { p.tx_batch(&refs) };
            prop_assert_eq!(sent, ok);
            prop_assert_eq!(p.c.to_port, ok);
            prop_assert_eq!(p.c.dropped_full, dropped);
            prop_assert_eq!(p.bad_desc, bad);
            prop_assert_eq!(p.too_long, long);
            prop_assert_eq!(p.s2c_next, tail.wrapping_add(ok as u16));
            for (s, i) in placed {
                let at = S2C + 128 + 16 * s;
                let len = u32::from_le_bytes(client[at + 4..at + 8].try_into().unwrap());
                prop_assert_eq!(len as usize, frames[i].len());
                prop_assert_eq!(&client[at..at + 2], &[0, 0]);
                let buf = BUFS + s * BUF;
                prop_assert_eq!(&client[buf..buf + frames[i].len()], &frames[i][..]);
            }
        }
    }
}
