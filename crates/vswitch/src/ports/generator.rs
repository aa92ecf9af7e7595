//! Generator ports: a source inside the switch, for benchmarks.

use std::time::Instant;

use ring::device::FrameRef;

use super::{Counters, Port};
use crate::status::{GeneratorDetail, PortDetail};

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
    fn as_any(&mut self) -> Option<&mut dyn std::any::Any> {
        Some(self)
    }
    fn counters(&mut self) -> &mut Counters {
        &mut self.c
    }
    fn status(&self) -> PortDetail {
        PortDetail::Generator(GeneratorDetail {
            frame_len: self.frame.len(),
        })
    }
}
