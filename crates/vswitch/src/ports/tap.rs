//! TAP ports: frames to and from the kernel's network stack through a TAP
//! device.

use std::os::fd::{AsFd, BorrowedFd};
use std::time::Instant;

use netio::tap::Tap;
use ring::device::FrameRef;

use super::{Counters, Port};
use crate::status::{PortDetail, TapDetail};

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
    fn as_any(&mut self) -> Option<&mut dyn std::any::Any> {
        Some(self)
    }
    fn counters(&mut self) -> &mut Counters {
        &mut self.c
    }
    fn status(&self) -> PortDetail {
        PortDetail::Tap(TapDetail {
            write_errors: self.write_errors,
        })
    }
}
