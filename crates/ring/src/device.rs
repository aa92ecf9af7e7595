//! The device side of a ring port (the NIC emulation in the hypervisor;
//! here, the switch).
//!
//! Nothing in the shared region is trusted. Every counter the driver writes is
//! checked against what is possible (`head - tail <= slots`, never moving
//! backwards); a port whose counters are impossible is marked broken and no
//! longer served. Every slot is checked (buffer index in range, length within
//! the buffer) before its buffer is touched, and each value is read once, into
//! a local, so that a peer changing it afterwards cannot change our decision.

use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release, SeqCst};
use std::sync::atomic::{fence, AtomicU64};
use std::time::Instant;

use crate::layout::distance;
use crate::notify::{EventFd, Moderator};
use crate::shm::Region;
use crate::{Geometry, Mode, Result};

/// Bit of [`GuestLine::want`](crate::layout::GuestLine::want): a sleeping
/// guest waits for TX completions.
pub const WANT_TX: u32 = 1;
/// Bit of [`GuestLine::want`](crate::layout::GuestLine::want): a sleeping
/// guest waits for received frames.
pub const WANT_RX: u32 = 2;

/// Counters of one port, readable from other threads.
#[derive(Debug, Default)]
pub struct DeviceStats {
    /// Kicks received (driver-to-device notifications: the VM exits).
    pub kicks: AtomicU64,
    /// Interrupts raised.
    pub irqs: AtomicU64,
    /// Frames taken from the TX ring.
    pub tx_frames: AtomicU64,
    /// Frames placed in the RX ring.
    pub rx_frames: AtomicU64,
    /// Frames for this port dropped because its RX ring was full.
    pub rx_full: AtomicU64,
    /// TX slots with an impossible buffer index or length (skipped).
    pub bad_slots: AtomicU64,
    /// Impossible ring counters (the port is then broken).
    pub bad_index: AtomicU64,
}

/// A received frame still in the driver's buffer: valid until `tx_complete`.
#[derive(Clone, Copy, Debug)]
pub struct FrameRef {
    /// First byte of the frame, inside a shared mapping: copy it, never make
    /// a Rust reference of it (the peer may be writing).
    pub ptr: *const u8,
    /// Frame length in bytes (checked against the buffer size).
    pub len: u32,
}

// SAFETY: a FrameRef is only an address into a mapping its port keeps alive;
// it is dereferenced only by the thread that owns that port, before the
// port's rx_done.
unsafe impl Send for FrameRef {}

/// Start fetching the cache line at `p` (a hint: batched code issues these
/// ahead of touching the data, so that misses overlap).
#[inline(always)]
pub fn prefetch(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is only a hint: it never faults and has no effect on
    // program state for any address, valid or not; SSE is part of the x86-64
    // baseline, so the instruction always exists.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Copy `len` bytes of a frame. Frames of 32..=64 bytes (minimum-size
/// Ethernet) are two overlapping fixed 32-byte moves, inlined, instead of a
/// call into `memcpy` with a run-time length.
///
/// # Safety
/// `src` readable and `dst` writable for `len` bytes; they do not overlap.
#[inline(always)]
pub unsafe fn copy_frame(src: *const u8, dst: *mut u8, len: usize) {
    if (32..=64).contains(&len) {
        // SAFETY: 32 <= len, so [0, 32) and [len - 32, len) lie inside both
        // buffers (the caller's contract).
        unsafe {
            std::ptr::copy_nonoverlapping(src, dst, 32);
            std::ptr::copy_nonoverlapping(src.add(len - 32), dst.add(len - 32), 32);
        }
    } else {
        // SAFETY: the caller's contract.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
    }
}

/// Device side of one ring pair.
pub struct DevicePort {
    region: Region,
    kick: EventFd,
    irq: EventFd,
    mode: Mode,
    moder: Moderator,
    slots: u32,
    buf_size: u32,
    tx_tail: u32,
    tx_head: u32,
    rx_tail: u32,
    rx_head: u32,
    rx_published: u32,
    irq_epoch: u32,
    broken: Option<String>,
    /// What this port did, readable while it runs.
    pub stats: DeviceStats,
}

impl DevicePort {
    /// Create a port: its region, kick and interrupt eventfds.
    pub fn create(name: &str, geo: Geometry, mode: Mode, itr: u32) -> Result<DevicePort> {
        Ok(DevicePort {
            region: Region::create(name, geo)?,
            kick: EventFd::new()?,
            irq: EventFd::new()?,
            mode,
            moder: Moderator::new(itr),
            slots: geo.slots,
            buf_size: geo.buf_size,
            tx_tail: 0,
            tx_head: 0,
            rx_tail: 0,
            rx_head: 0,
            rx_published: 0,
            irq_epoch: 0,
            broken: None,
            stats: DeviceStats::default(),
        })
    }

    /// The descriptors the driver needs: region, kick, interrupt.
    pub fn driver_fds(&self) -> Result<[OwnedFd; 3]> {
        Ok([self.region.dup_fd()?, self.kick.dup()?, self.irq.dup()?])
    }

    /// What became of the interrupts raised on the driver's line (those a
    /// peer that stopped reading its counter could not take).
    pub fn irq_line(&self) -> crate::notify::LineStats {
        self.irq.stats()
    }

    /// The kick eventfd: wait on it (or register it with epoll) to learn
    /// that the driver queued work.
    pub fn kick_fd(&self) -> &EventFd {
        &self.kick
    }

    /// The port's notification mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The port's ring and buffer dimensions.
    pub fn geometry(&self) -> Geometry {
        self.region.geometry()
    }

    /// Why the port is no longer served (the driver wrote an impossible
    /// counter), or None while it is healthy.
    pub fn broken(&self) -> Option<&str> {
        self.broken.as_deref()
    }

    fn mark_broken(&mut self, why: String) {
        if self.broken.is_none() {
            self.stats.bad_index.fetch_add(1, Relaxed);
            self.broken = Some(why);
        }
    }

    /// Consume pending kicks. In the register-based modes a kick is the only
    /// moment the device learns the driver's counters (the register write),
    /// so they are read here; with a CSB they are read on every pass.
    pub fn on_kick(&mut self) -> u64 {
        let n = self.kick.drain();
        if n > 0 {
            self.stats.kicks.fetch_add(n, Relaxed);
            if self.mode != Mode::Csb {
                self.read_driver();
            }
        }
        n
    }

    /// Read and check the driver's counters.
    fn read_driver(&mut self) {
        if self.broken.is_some() {
            return;
        }
        let g = &self.region.csb().guest;
        let head = g.tx_head.load(Acquire);
        let rx_head = g.rx_head.load(Acquire);
        // TX: head may run at most `slots` ahead of what we completed, and
        // never backwards from what we saw.
        if distance(head, self.tx_tail) > self.slots
            || distance(head, self.tx_tail) < distance(self.tx_head, self.tx_tail)
        {
            self.mark_broken(format!(
                "tx head {head} impossible (tail {}, last head {})",
                self.tx_tail, self.tx_head
            ));
            return;
        }
        // RX: released slots never pass what we filled, never go backwards.
        if distance(self.rx_tail, rx_head) > self.slots
            || distance(rx_head, self.rx_head) > distance(self.rx_tail, self.rx_head)
        {
            self.mark_broken(format!(
                "rx head {rx_head} impossible (tail {}, last head {})",
                self.rx_tail, self.rx_head
            ));
            return;
        }
        self.tx_head = head;
        self.rx_head = rx_head;
    }

    /// With a CSB, poll the driver's counters; returns TX frames waiting.
    #[inline]
    pub fn poll(&mut self) -> u32 {
        if self.mode == Mode::Csb {
            self.read_driver();
        }
        self.tx_pending()
    }

    /// TX frames the driver handed over and the device has not completed (0
    /// once the port is broken).
    #[inline]
    pub fn tx_pending(&self) -> u32 {
        if self.broken.is_some() {
            0
        } else {
            distance(self.tx_head, self.tx_tail)
        }
    }

    /// Append up to `max` frames waiting in the TX ring to `out`; returns how
    /// many slots were consumed (bad slots are consumed, counted, skipped).
    /// The frames stay valid until [`DevicePort::tx_complete`].
    pub fn tx_peek(&mut self, max: u32, out: &mut Vec<FrameRef>) -> u32 {
        let n = self.tx_pending().min(max);
        for k in 0..n {
            let slot = self.region.tx_slot(self.tx_tail.wrapping_add(k));
            let buf = slot.buf.load(Relaxed);
            let len = slot.len.load(Relaxed) as u32;
            match self.region.buf_ptr(buf) {
                Some(p) if len > 0 && len <= self.buf_size => out.push(FrameRef { ptr: p, len }),
                _ => {
                    self.stats.bad_slots.fetch_add(1, Relaxed);
                }
            }
        }
        n
    }

    /// Hand `n` TX slots back to the driver and notify it per the mode.
    pub fn tx_complete(&mut self, n: u32, frames: u64, now: Instant) {
        if n == 0 {
            return;
        }
        self.tx_tail = self.tx_tail.wrapping_add(n);
        self.stats.tx_frames.fetch_add(frames, Relaxed);
        self.region.csb().host.tx_tail.store(self.tx_tail, Release);
        self.notify(now);
    }

    /// Free RX slots as far as the device knows.
    #[inline]
    pub fn rx_space(&self) -> u32 {
        if self.broken.is_some() {
            return 0;
        }
        self.slots - distance(self.rx_tail, self.rx_head)
    }

    /// Copy a frame into the next RX slot (not yet visible to the driver:
    /// see [`DevicePort::rx_publish`]). False, counted, if the ring is full.
    ///
    /// # Safety
    /// `src` must be readable for `len` bytes (it may be another port's
    /// shared memory, which its peer may be writing: we only copy it).
    pub unsafe fn rx_push(&mut self, src: *const u8, len: u32) -> bool {
        if self.rx_space() == 0 && self.mode == Mode::Csb {
            // The driver may have released slots since we last looked.
            self.read_driver();
        }
        if self.rx_space() == 0 {
            self.stats.rx_full.fetch_add(1, Relaxed);
            return false;
        }
        let slot = self.region.rx_slot(self.rx_tail);
        let buf = slot.buf.load(Relaxed);
        let Some(dst) = self.region.buf_ptr(buf) else {
            self.mark_broken(format!("rx slot buffer index {buf} out of range"));
            return false;
        };
        let len = len.min(self.buf_size);
        // SAFETY: dst has buf_size >= len bytes (buf_ptr checked the index);
        // the caller guarantees src; the regions are distinct mappings.
        unsafe { copy_frame(src, dst, len as usize) };
        slot.len.store(len as u16, Relaxed);
        slot.flags.store(0, Relaxed);
        self.rx_tail = self.rx_tail.wrapping_add(1);
        true
    }

    /// Copy as many of `frames` as fit into the next RX slots, in order (not
    /// yet visible to the driver: see [`DevicePort::rx_publish`]). Returns
    /// how many were taken (a prefix of `frames`) and their bytes; the rest
    /// are counted in `rx_full`. One look at the driver's counters per
    /// batch, not per frame; the destination buffers are prefetched a few
    /// frames ahead of the copy.
    ///
    /// # Safety
    /// Every frame's `ptr` must be readable for its `len` bytes (it may be
    /// another port's shared memory, which its peer may be writing: we only
    /// copy it).
    pub unsafe fn rx_push_batch(&mut self, frames: &[FrameRef]) -> (usize, u64) {
        const AHEAD: u32 = 4;
        if (self.rx_space() as usize) < frames.len() && self.mode == Mode::Csb {
            // The driver may have released slots since we last looked.
            self.read_driver();
        }
        let n = (self.rx_space() as usize).min(frames.len());
        let mut bytes = 0u64;
        for k in 0..AHEAD.min(n as u32) {
            let b = self
                .region
                .rx_slot(self.rx_tail.wrapping_add(k))
                .buf
                .load(Relaxed);
            if let Some(p) = self.region.buf_ptr(b) {
                prefetch(p);
            }
        }
        for (k, f) in frames[..n].iter().enumerate() {
            if (k as u32) + AHEAD < n as u32 {
                let ahead = self.rx_tail.wrapping_add(AHEAD);
                let b = self.region.rx_slot(ahead).buf.load(Relaxed);
                if let Some(p) = self.region.buf_ptr(b) {
                    prefetch(p);
                }
            }
            let slot = self.region.rx_slot(self.rx_tail);
            let buf = slot.buf.load(Relaxed);
            let Some(dst) = self.region.buf_ptr(buf) else {
                self.mark_broken(format!("rx slot buffer index {buf} out of range"));
                self.stats
                    .rx_full
                    .fetch_add((frames.len() - k) as u64, Relaxed);
                return (k, bytes);
            };
            let len = f.len.min(self.buf_size);
            // SAFETY: dst has buf_size >= len bytes (buf_ptr checked the
            // index); the caller guarantees f; the regions are distinct
            // mappings.
            unsafe { copy_frame(f.ptr, dst, len as usize) };
            slot.len.store(len as u16, Relaxed);
            slot.flags.store(0, Relaxed);
            self.rx_tail = self.rx_tail.wrapping_add(1);
            bytes += u64::from(len);
        }
        if n < frames.len() {
            self.stats
                .rx_full
                .fetch_add((frames.len() - n) as u64, Relaxed);
        }
        (n, bytes)
    }

    /// Make pushed frames visible and notify the driver per the mode.
    pub fn rx_publish(&mut self, now: Instant) {
        let n = distance(self.rx_tail, self.rx_published);
        if n == 0 {
            return;
        }
        self.rx_published = self.rx_tail;
        self.stats.rx_frames.fetch_add(n as u64, Relaxed);
        self.region.csb().host.rx_tail.store(self.rx_tail, Release);
        self.notify(now);
    }

    /// Interrupt policy after new completions or new frames.
    fn notify(&mut self, now: Instant) {
        if self.mode == Mode::Csb && !self.guest_wants_irq() {
            return;
        }
        if self.moder.request(now) {
            self.fire();
        }
    }

    /// CSB: has the driver said it sleeps, for something now available, and
    /// not been interrupted for this sleep yet?
    fn guest_wants_irq(&self) -> bool {
        fence(SeqCst);
        let g = &self.region.csb().guest;
        let epoch = g.sleep.load(Acquire);
        if epoch.is_multiple_of(2) || epoch == self.irq_epoch {
            return false;
        }
        let want = g.want.load(Relaxed);
        let tx_ready = want & WANT_TX != 0
            && (self
                .tx_tail
                .wrapping_add(self.slots)
                .wrapping_sub(g.tx_cur.load(Relaxed)) as i32)
                > 0;
        let rx_ready =
            want & WANT_RX != 0 && (self.rx_tail.wrapping_sub(g.rx_cur.load(Relaxed)) as i32) > 0;
        tx_ready || rx_ready
    }

    fn fire(&mut self) {
        if self.mode == Mode::Csb {
            self.irq_epoch = self.region.csb().guest.sleep.load(Acquire);
        }
        self.irq.signal();
        self.stats.irqs.fetch_add(1, Relaxed);
    }

    /// When a moderated interrupt is due.
    pub fn deadline(&self) -> Option<Instant> {
        self.moder.deadline()
    }

    /// Fire a held interrupt whose moderation interval has ended.
    pub fn timer(&mut self, now: Instant) {
        if self.moder.due(now) && (self.mode != Mode::Csb || self.guest_wants_irq()) {
            self.fire();
        }
    }

    /// CSB: announce that the device is going to sleep. Returns false (and
    /// stays awake) if the driver queued work meanwhile: set the flag, fence,
    /// look again, so that a kick cannot be lost between the look and the
    /// sleep. In the other modes the driver always kicks: always true.
    pub fn prepare_sleep(&mut self) -> bool {
        if self.mode != Mode::Csb || self.broken.is_some() {
            return true;
        }
        let h = &self.region.csb().host;
        let e = h.sleep.load(Relaxed);
        if e.is_multiple_of(2) {
            h.sleep.store(e.wrapping_add(1), Relaxed);
        }
        fence(SeqCst);
        if self.poll() > 0 {
            self.wake();
            return false;
        }
        true
    }

    /// CSB: the device is awake again (polling).
    pub fn wake(&mut self) {
        let h = &self.region.csb().host;
        let e = h.sleep.load(Relaxed);
        if e % 2 == 1 {
            h.sleep.store(e.wrapping_add(1), Release);
        }
    }
}
