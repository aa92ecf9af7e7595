//! Ring ports: the device side of the paravirtual NIC (`ring`), attached by
//! a driver over the control socket (the switch's `control.rs`), with the
//! paper's notification schemes (interrupt moderation, send combining, CSB).

use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use ring::device::{DevicePort, FrameRef};

use super::{Counters, Port};
use crate::status::{PortDetail, RingDetail};

/// The device side of a paravirtual NIC attached through the control socket.
pub struct RingPort {
    /// Port name.
    pub name: String,
    /// The device side of the port's rings.
    pub dev: DevicePort,
    /// Counters.
    pub c: Counters,
    /// The address the port is locked to (port security), if the driver
    /// asked for it.
    pub mac: Option<crate::bridge::Mac>,
}

impl Port for RingPort {
    fn name(&self) -> &str {
        &self.name
    }
    fn kind(&self) -> &'static str {
        "ring"
    }
    fn fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.dev.kick_fd().as_fd())
    }
    fn on_event(&mut self) {
        self.dev.on_kick();
    }
    fn polled(&self) -> bool {
        self.dev.mode() == ring::Mode::Csb
    }
    fn pending(&mut self) -> bool {
        self.dev.poll() > 0
    }
    fn rx(&mut self, max: u32, out: &mut Vec<FrameRef>) -> u32 {
        self.dev.tx_peek(max, out)
    }
    fn rx_done(&mut self, token: u32, frames: u64, now: Instant) {
        self.c.from_port += frames;
        self.dev.tx_complete(token, frames, now);
    }
    unsafe fn tx(&mut self, f: FrameRef) -> bool {
        // SAFETY: forwarded from the caller's contract.
        let ok = unsafe { self.dev.rx_push(f.ptr, f.len) };
        if ok {
            self.c.to_port += 1;
            self.c.to_port_bytes += f.len as u64;
        } else {
            self.c.dropped_full += 1;
        }
        ok
    }
    unsafe fn tx_batch(&mut self, frames: &[FrameRef]) -> u64 {
        // SAFETY: forwarded from the caller's contract.
        let (n, bytes) = unsafe { self.dev.rx_push_batch(frames) };
        self.c.to_port += n as u64;
        self.c.to_port_bytes += bytes;
        self.c.dropped_full += (frames.len() - n) as u64;
        n as u64
    }
    fn tx_flush(&mut self, now: Instant) {
        self.dev.rx_publish(now);
    }
    fn deadline(&self) -> Option<Instant> {
        self.dev.deadline()
    }
    fn timer(&mut self, now: Instant) {
        self.dev.timer(now);
    }
    fn prepare_sleep(&mut self) -> bool {
        self.dev.prepare_sleep()
    }
    fn wake(&mut self) {
        self.dev.wake();
    }
    fn broken(&self) -> Option<&str> {
        self.dev.broken()
    }
    fn locked_mac(&self) -> Option<crate::bridge::Mac> {
        self.mac
    }
    fn counters(&mut self) -> &mut Counters {
        &mut self.c
    }
    fn status(&self) -> PortDetail {
        let s = &self.dev.stats;
        PortDetail::Ring(RingDetail {
            mode: self.dev.mode().to_string(),
            slots: self.dev.geometry().slots,
            kicks: s.kicks.load(Relaxed),
            interrupts: s.irqs.load(Relaxed),
            signals_blocked: self.dev.irq_line().blocked(),
            bad_slots: s.bad_slots.load(Relaxed),
            bad_index: s.bad_index.load(Relaxed),
            broken: self.dev.broken().map(str::to_string),
        })
    }
}
