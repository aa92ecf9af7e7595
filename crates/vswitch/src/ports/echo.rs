//! Echo ports: a reflector inside the switch, for benchmarks.

use std::time::Instant;

use ring::device::FrameRef;

use super::{Counters, Port};
use crate::status::{EchoDetail, PortDetail};

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
    fn as_any(&mut self) -> Option<&mut dyn std::any::Any> {
        Some(self)
    }
    fn counters(&mut self) -> &mut Counters {
        &mut self.c
    }
    fn status(&self) -> PortDetail {
        PortDetail::Echo(EchoDetail {
            queued: self.queue.len(),
        })
    }
}
