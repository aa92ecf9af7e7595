//! The driver side of a ring port (the guest's NIC driver), used by pktgen
//! and applications.
//!
//! The modes differ only in when the driver kicks and how it learns about
//! completions:
//! * BASE: every transmitted packet is a register write, so a kick; the
//!   driver takes every interrupt.
//! * SC: a kick is sent only when no transmit-completion interrupt is
//!   pending; packets queued meanwhile are flushed with one kick when the
//!   interrupt arrives.
//! * CSB: the driver publishes its counters in the status block and kicks
//!   only if the device has said it sleeps; it sleeps itself (and asks for an
//!   interrupt) only when it has nothing to do.

use std::os::fd::OwnedFd;
use std::sync::atomic::fence;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release, SeqCst};
use std::time::Duration;

use crate::device::{WANT_RX, WANT_TX};
use crate::layout::distance;
use crate::notify::EventFd;
use crate::shm::Region;
use crate::{Geometry, Mode, Result};

/// What the driver did: the paper's VM exits are `kicks + irqs`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct DriverStats {
    /// Kicks sent (driver-to-device notifications).
    pub kicks: u64,
    /// Interrupts taken (device-to-driver notifications).
    pub irqs: u64,
    /// Frames queued for transmission.
    pub tx: u64,
    /// Frames received.
    pub rx: u64,
    /// Bytes received.
    pub rx_bytes: u64,
    /// Bytes queued for transmission.
    pub tx_bytes: u64,
}

impl DriverStats {
    /// All notifications either way: the paper's VM exits.
    pub fn notifications(&self) -> u64 {
        self.kicks + self.irqs
    }
}

/// Driver side of one ring pair.
pub struct Driver {
    region: Region,
    kick: EventFd,
    irq: EventFd,
    mode: Mode,
    slots: u32,
    buf_size: u32,
    tx_head: u32,
    rx_head: u32,
    /// SC: a kick was sent and its completion interrupt has not arrived.
    sc_pending: bool,
    /// SC: packets were queued without a kick while one was pending.
    sc_deferred: bool,
    host_epoch_kicked: u32,
    /// What this driver did.
    pub stats: DriverStats,
}

impl Driver {
    /// Adopt the three descriptors the device handed over.
    pub fn new(region: OwnedFd, kick: OwnedFd, irq: OwnedFd, mode: Mode) -> Result<Driver> {
        let region = Region::open(region)?;
        let geo = region.geometry();
        let csb = region.csb();
        let tx_head = csb.guest.tx_head.load(Relaxed);
        let rx_head = csb.guest.rx_head.load(Relaxed);
        Ok(Driver {
            kick: EventFd::from_fd(kick),
            irq: EventFd::from_fd(irq),
            mode,
            slots: geo.slots,
            buf_size: geo.buf_size,
            tx_head,
            rx_head,
            sc_pending: false,
            sc_deferred: false,
            host_epoch_kicked: 0,
            stats: DriverStats::default(),
            region,
        })
    }

    /// The port's ring and buffer dimensions.
    pub fn geometry(&self) -> Geometry {
        self.region.geometry()
    }

    /// The port's notification mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The interrupt eventfd, e.g. to wait on several ports with epoll.
    pub fn irq_fd(&self) -> &EventFd {
        &self.irq
    }

    #[inline]
    fn do_kick(&mut self) {
        self.kick.signal();
        self.stats.kicks += 1;
    }

    /// Take pending interrupts (the guest's interrupt handler). With Send
    /// Combining, an interrupt completes the pending kick and flushes what
    /// was deferred behind it.
    #[inline]
    fn take_irqs(&mut self, n: u64) {
        if n == 0 {
            return;
        }
        self.stats.irqs += n;
        if self.mode == Mode::Sc {
            self.sc_pending = false;
            if self.sc_deferred {
                self.sc_deferred = false;
                self.sc_pending = true;
                self.region.csb().guest.tx_head.store(self.tx_head, Release);
                self.do_kick();
            }
        }
    }

    fn service(&mut self) {
        if self.mode != Mode::Csb {
            let n = self.irq.drain();
            self.take_irqs(n);
        }
    }

    /// Free TX slots.
    #[inline]
    pub fn tx_space(&self) -> u32 {
        let tail = self.region.csb().host.tx_tail.load(Acquire);
        self.slots - distance(self.tx_head, tail).min(self.slots)
    }

    /// Transmit up to `max` frames: `fill(k, buf)` writes frame `k` into `buf`
    /// and returns its length. Returns how many were queued (0 if the ring is
    /// full: then [`Driver::wait_tx`]).
    pub fn send(&mut self, max: usize, mut fill: impl FnMut(usize, &mut [u8]) -> usize) -> usize {
        self.service();
        let n = (self.tx_space() as usize).min(max);
        let csb = self.region.csb();
        for k in 0..n {
            let slot = self.region.tx_slot(self.tx_head);
            let mut buf = slot.buf.load(Relaxed);
            let ptr = match self.region.buf_ptr(buf) {
                Some(p) => p,
                None => {
                    buf = self.tx_head & (self.slots - 1);
                    slot.buf.store(buf, Relaxed);
                    self.region
                        .buf_ptr(buf)
                        .expect("slot index is a valid buffer")
                }
            };
            // SAFETY: the buffer belongs to a TX slot the driver owns (between
            // tail and head + slots); the device reads it only after head moves.
            let b = unsafe { std::slice::from_raw_parts_mut(ptr, self.buf_size as usize) };
            let len = fill(k, b).min(self.buf_size as usize);
            slot.len.store(len as u16, Relaxed);
            self.stats.tx_bytes += len as u64;
            self.tx_head = self.tx_head.wrapping_add(1);
            if self.mode == Mode::Base {
                csb.guest.tx_head.store(self.tx_head, Release);
                self.kick.signal();
                self.stats.kicks += 1;
            }
        }
        if n == 0 {
            return 0;
        }
        self.stats.tx += n as u64;
        let csb = self.region.csb();
        match self.mode {
            Mode::Base => {}
            Mode::Sc => {
                // Without a CSB, head is a device register: the device sees
                // it only when it is written, and writing it is the kick. So
                // deferred packets stay invisible until the flush.
                if self.sc_pending {
                    self.sc_deferred = true;
                } else {
                    csb.guest.tx_head.store(self.tx_head, Release);
                    self.sc_pending = true;
                    self.do_kick();
                }
            }
            Mode::Csb => {
                csb.guest.tx_head.store(self.tx_head, Release);
                csb.guest.tx_cur.store(self.tx_head, Relaxed);
                self.kick_if_host_sleeps();
            }
        }
        n
    }

    fn kick_if_host_sleeps(&mut self) {
        fence(SeqCst);
        let e = self.region.csb().host.sleep.load(Acquire);
        if e % 2 == 1 && e != self.host_epoch_kicked {
            self.host_epoch_kicked = e;
            self.do_kick();
        }
    }

    /// Sleep until TX space may be available (or `timeout`).
    pub fn wait_tx(&mut self, timeout: Duration) {
        if self.tx_space() > 0 {
            return;
        }
        self.sleep(WANT_TX, timeout, |d| d.tx_space() > 0);
    }

    /// Frames waiting in the RX ring.
    #[inline]
    pub fn rx_ready(&self) -> u32 {
        let tail = self.region.csb().host.rx_tail.load(Acquire);
        distance(tail, self.rx_head).min(self.slots)
    }

    /// Receive up to `max` frames, calling `f` on each, then release them.
    pub fn recv(&mut self, max: usize, mut f: impl FnMut(&[u8])) -> usize {
        self.service();
        let n = (self.rx_ready() as usize).min(max);
        if n == 0 {
            return 0;
        }
        for _ in 0..n {
            let slot = self.region.rx_slot(self.rx_head);
            let len = (slot.len.load(Relaxed) as u32).min(self.buf_size) as usize;
            if let Some(p) = self.region.buf_ptr(slot.buf.load(Relaxed)) {
                // SAFETY: the slot lies between head and the device's tail, so
                // the device has finished writing it and will not until released.
                f(unsafe { std::slice::from_raw_parts(p, len) });
            }
            self.stats.rx_bytes += len as u64;
            self.rx_head = self.rx_head.wrapping_add(1);
        }
        self.stats.rx += n as u64;
        let g = &self.region.csb().guest;
        g.rx_head.store(self.rx_head, Release);
        g.rx_cur.store(self.rx_head, Relaxed);
        if self.mode != Mode::Csb {
            // Returning buffers is a register write (RDT) without a CSB.
            self.do_kick();
        }
        n
    }

    /// Sleep until frames may be waiting (or `timeout`).
    pub fn wait_rx(&mut self, timeout: Duration) {
        if self.rx_ready() > 0 {
            return;
        }
        self.sleep(WANT_RX, timeout, |d| d.rx_ready() > 0);
    }

    fn sleep(&mut self, want: u32, timeout: Duration, ready: impl Fn(&Driver) -> bool) {
        if self.mode != Mode::Csb {
            let n = self.irq.wait(timeout);
            self.take_irqs(n);
            return;
        }
        let g = &self.region.csb().guest;
        g.want.store(want, Relaxed);
        g.tx_cur.store(self.tx_head, Relaxed);
        g.rx_cur.store(self.rx_head, Relaxed);
        let e = g.sleep.load(Relaxed) | 1;
        g.sleep.store(e, Relaxed);
        fence(SeqCst);
        if !ready(self) {
            let n = self.irq.wait(timeout);
            self.stats.irqs += n;
        }
        self.region
            .csb()
            .guest
            .sleep
            .store(e.wrapping_add(1), Release);
        let n = self.irq.drain();
        self.stats.irqs += n;
    }

    /// Wait for every queued TX frame to be completed (bounded by `timeout`).
    pub fn flush(&mut self, timeout: Duration) -> bool {
        let end = std::time::Instant::now() + timeout;
        while self.tx_space() < self.slots {
            if std::time::Instant::now() >= end {
                return false;
            }
            if self.mode == Mode::Csb {
                self.kick_if_host_sleeps();
            }
            let n = self.irq.wait(Duration::from_millis(1));
            self.take_irqs(n);
        }
        true
    }

    /// Test hook: the raw region, to play a hostile driver.
    pub fn region(&self) -> &Region {
        &self.region
    }

    /// Test hook: raise a kick without changing anything.
    pub fn raw_kick(&mut self) {
        self.do_kick();
    }
}
