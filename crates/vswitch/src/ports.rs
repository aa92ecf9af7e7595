//! The kinds of switch port.

use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use netio::tap::Tap;
use ring::device::{DevicePort, FrameRef};
use serde_json::{json, Value};

/// Counters every port keeps (frames into the switch from the port, and out
/// of the switch to the port).
#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
pub struct Counters {
    /// Frames the port handed the switch.
    pub from_port: u64,
    /// Frames the switch gave the port.
    pub to_port: u64,
    /// Bytes of those frames.
    pub to_port_bytes: u64,
    /// Frames for this port dropped because it could not take them.
    pub dropped_full: u64,
}

/// A switch port. Frames a port hands the switch stay where they are (in the
/// port's own memory) until `rx_done`: the switch copies each one straight
/// into its destination, one copy per frame as in VALE.
pub trait Port: Send {
    /// The port's name, unique in its switch.
    fn name(&self) -> &str;
    /// What kind of port it is, for the status document (`ring`, `tap`, ...).
    fn kind(&self) -> &'static str;
    /// The descriptor whose readability means "look at me", if any.
    fn fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }
    /// The descriptor became readable.
    fn on_event(&mut self) {}
    /// Frames waiting to enter the switch (a hint; may poll shared memory).
    fn pending(&mut self) -> bool;
    /// Whether [`Port::pending`] sees new frames without the port's
    /// descriptor becoming readable first (shared-memory counters polled,
    /// or a port inside the switch). Ports that learn of frames only through
    /// an event (TAP, ring ports without a CSB) say false.
    fn polled(&self) -> bool {
        true
    }
    /// Append up to `max` frames to `out`; returns a token for `rx_done`.
    fn rx(&mut self, max: u32, out: &mut Vec<FrameRef>) -> u32;
    /// The frames of the last `rx` have been forwarded.
    fn rx_done(&mut self, token: u32, frames: u64, now: Instant);
    /// Take one frame (copy it); false if the port cannot take it now.
    ///
    /// # Safety
    /// `f` must be readable for `f.len` bytes.
    unsafe fn tx(&mut self, f: FrameRef) -> bool;
    /// Take `frames` in order (copy them), as [`Port::tx`] on each; returns
    /// how many were taken. Ports with rings override it to look at their
    /// ring and update their counters once per batch instead of per frame.
    ///
    /// # Safety
    /// Every frame must be readable for its `len` bytes.
    unsafe fn tx_batch(&mut self, frames: &[FrameRef]) -> u64 {
        let mut ok = 0;
        for f in frames {
            // SAFETY: forwarded from the caller's contract.
            if unsafe { self.tx(*f) } {
                ok += 1;
            }
        }
        ok
    }
    /// End of a batch of `tx`: publish and notify.
    fn tx_flush(&mut self, _now: Instant) {}
    /// When the port next needs [`Port::timer`] (interrupt moderation).
    fn deadline(&self) -> Option<Instant> {
        None
    }
    /// Called on every pass: fire what is due by `now`.
    fn timer(&mut self, _now: Instant) {}
    /// About to sleep in epoll: false if work appeared (stay awake).
    fn prepare_sleep(&mut self) -> bool {
        true
    }
    /// The switch woke up after [`Port::prepare_sleep`].
    fn wake(&mut self) {}
    /// Broken ports are no longer served.
    fn broken(&self) -> Option<&str> {
        None
    }
    /// The port's counters (the switch updates some of them).
    fn counters(&mut self) -> &mut Counters;
    /// Port-specific details for the status document.
    fn status(&self) -> Value {
        json!({})
    }
}

/// The device side of a paravirtual NIC attached through the control socket.
pub struct RingPort {
    /// Port name.
    pub name: String,
    /// The device side of the port's rings.
    pub dev: DevicePort,
    /// Counters.
    pub c: Counters,
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
    fn counters(&mut self) -> &mut Counters {
        &mut self.c
    }
    fn status(&self) -> Value {
        let s = &self.dev.stats;
        json!({
            "mode": self.dev.mode().to_string(),
            "slots": self.dev.geometry().slots,
            "kicks": s.kicks.load(Relaxed),
            "interrupts": s.irqs.load(Relaxed),
            "bad_slots": s.bad_slots.load(Relaxed),
            "bad_index": s.bad_index.load(Relaxed),
            "broken": self.dev.broken(),
        })
    }
}

/// Frames to and from the kernel through a TAP device: a system call per
/// frame each way, as a hypervisor's TAP backend.
pub struct TapPort {
    tap: Tap,
    bufs: Vec<[u8; 2048]>,
    readable: bool,
    c: Counters,
    write_errors: u64,
}

impl TapPort {
    /// A port over an open TAP device.
    pub fn new(tap: Tap) -> TapPort {
        TapPort {
            tap,
            bufs: vec![[0u8; 2048]; 64],
            readable: true,
            c: Counters::default(),
            write_errors: 0,
        }
    }
}

impl Port for TapPort {
    fn name(&self) -> &str {
        self.tap.name()
    }
    fn kind(&self) -> &'static str {
        "tap"
    }
    fn fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.tap.as_fd())
    }
    fn on_event(&mut self) {
        self.readable = true;
    }
    fn polled(&self) -> bool {
        false
    }
    fn pending(&mut self) -> bool {
        self.readable
    }
    fn rx(&mut self, max: u32, out: &mut Vec<FrameRef>) -> u32 {
        let n = (max as usize).min(self.bufs.len());
        for i in 0..n {
            match self.tap.recv(&mut self.bufs[i][..]) {
                Some(len) => out.push(FrameRef {
                    ptr: self.bufs[i].as_ptr(),
                    len: len as u32,
                }),
                None => {
                    self.readable = false;
                    break;
                }
            }
        }
        0
    }
    fn rx_done(&mut self, _token: u32, frames: u64, _now: Instant) {
        self.c.from_port += frames;
    }
    unsafe fn tx(&mut self, f: FrameRef) -> bool {
        // SAFETY: forwarded from the caller's contract.
        if unsafe { self.tap.send_raw(f.ptr, f.len as usize) } {
            self.c.to_port += 1;
            self.c.to_port_bytes += f.len as u64;
            true
        } else {
            self.c.dropped_full += 1;
            self.write_errors += 1;
            false
        }
    }
    fn counters(&mut self) -> &mut Counters {
        &mut self.c
    }
    fn status(&self) -> Value {
        json!({ "write_errors": self.write_errors })
    }
}

/// A source inside the switch: frames from a template, as fast as the switch
/// takes them (the host side of a guest-receive benchmark).
pub struct GenPort {
    name: String,
    frame: Vec<u8>,
    /// Frames to send in all; none: without end.
    pub limit: Option<u64>,
    c: Counters,
}

impl GenPort {
    /// A generator of copies of `frame`, `limit` of them (none: endless).
    pub fn new(name: &str, frame: Vec<u8>, limit: Option<u64>) -> GenPort {
        GenPort {
            name: name.to_string(),
            frame,
            limit,
            c: Counters::default(),
        }
    }
}

impl Port for GenPort {
    fn name(&self) -> &str {
        &self.name
    }
    fn kind(&self) -> &'static str {
        "gen"
    }
    fn pending(&mut self) -> bool {
        self.limit.is_none_or(|l| self.c.from_port < l)
    }
    fn rx(&mut self, max: u32, out: &mut Vec<FrameRef>) -> u32 {
        let left = self.limit.map_or(u64::MAX, |l| l - self.c.from_port);
        for _ in 0..(max as u64).min(left) {
            out.push(FrameRef {
                ptr: self.frame.as_ptr(),
                len: self.frame.len() as u32,
            });
        }
        0
    }
    fn rx_done(&mut self, _token: u32, frames: u64, _now: Instant) {
        self.c.from_port += frames;
    }
    unsafe fn tx(&mut self, _f: FrameRef) -> bool {
        self.c.dropped_full += 1;
        false
    }
    fn counters(&mut self) -> &mut Counters {
        &mut self.c
    }
    fn status(&self) -> Value {
        json!({ "frame_len": self.frame.len() })
    }
}

/// A sink inside the switch: counts what it is given (the host side of a
/// guest-transmit benchmark).
pub struct SinkPort {
    name: String,
    c: Counters,
}

impl SinkPort {
    /// A sink named `name`.
    pub fn new(name: &str) -> SinkPort {
        SinkPort {
            name: name.to_string(),
            c: Counters::default(),
        }
    }
}

impl Port for SinkPort {
    fn name(&self) -> &str {
        &self.name
    }
    fn kind(&self) -> &'static str {
        "sink"
    }
    fn pending(&mut self) -> bool {
        false
    }
    fn rx(&mut self, _max: u32, _out: &mut Vec<FrameRef>) -> u32 {
        0
    }
    fn rx_done(&mut self, _token: u32, _frames: u64, _now: Instant) {}
    unsafe fn tx(&mut self, f: FrameRef) -> bool {
        self.c.to_port += 1;
        self.c.to_port_bytes += f.len as u64;
        true
    }
    fn counters(&mut self) -> &mut Counters {
        &mut self.c
    }
}

/// A reflector inside the switch: sends every frame back with its addresses
/// swapped (the host side of a ping-pong benchmark).
pub struct EchoPort {
    name: String,
    queue: std::collections::VecDeque<Vec<u8>>,
    out: Vec<Vec<u8>>,
    c: Counters,
}

impl EchoPort {
    /// A reflector named `name`.
    pub fn new(name: &str) -> EchoPort {
        EchoPort {
            name: name.to_string(),
            queue: Default::default(),
            out: Vec::new(),
            c: Counters::default(),
        }
    }
}

impl Port for EchoPort {
    fn name(&self) -> &str {
        &self.name
    }
    fn kind(&self) -> &'static str {
        "echo"
    }
    fn pending(&mut self) -> bool {
        !self.queue.is_empty()
    }
    fn rx(&mut self, max: u32, out: &mut Vec<FrameRef>) -> u32 {
        self.out.clear();
        while self.out.len() < max as usize {
            let Some(f) = self.queue.pop_front() else {
                break;
            };
            self.out.push(f);
        }
        for f in &self.out {
            out.push(FrameRef {
                ptr: f.as_ptr(),
                len: f.len() as u32,
            });
        }
        0
    }
    fn rx_done(&mut self, _token: u32, frames: u64, _now: Instant) {
        self.c.from_port += frames;
    }
    unsafe fn tx(&mut self, f: FrameRef) -> bool {
        if self.queue.len() >= 1024 || f.len < 12 {
            self.c.dropped_full += 1;
            return false;
        }
        // SAFETY: the caller guarantees f.ptr is readable for f.len bytes.
        let mut v = unsafe { std::slice::from_raw_parts(f.ptr, f.len as usize) }.to_vec();
        let (d, s) = v.split_at_mut(6);
        d.swap_with_slice(&mut s[..6]);
        self.queue.push_back(v);
        self.c.to_port += 1;
        self.c.to_port_bytes += f.len as u64;
        true
    }
    fn counters(&mut self) -> &mut Counters {
        &mut self.c
    }
    fn status(&self) -> Value {
        json!({ "queued": self.queue.len() })
    }
}
