//! The ports the switch benchmarks put inside the switch: a source
//! ([`GenPort`]), a counter ([`SinkPort`]) and a reflector ([`EchoPort`]),
//! the host side of Figure 1's guest-receive, guest-transmit and ping-pong
//! rows and of the VM bench's guest-to-sink row. They implement
//! [`vswitch::Port`] like any kind of port; the switch library does not
//! carry them, since only benchmarks put them in a switch.

use std::time::Instant;

use ring::device::FrameRef;
use vswitch::bridge::Mac;
use vswitch::status::{EchoDetail, GeneratorDetail, PortDetail};
use vswitch::{Counters, Port};

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

/// A sink inside the switch: counts what it is given (the host side of a
/// guest-transmit benchmark).
pub struct SinkPort {
    name: String,
    c: Counters,
    mac: Option<Mac>,
}

impl SinkPort {
    /// A sink named `name`.
    pub fn new(name: &str) -> SinkPort {
        SinkPort {
            name: name.to_string(),
            c: Counters::default(),
            mac: None,
        }
    }

    /// A sink named `name` that owns `mac`: the address is pinned to it
    /// ([`Port::locked_mac`]), so frames for it come here alone, as to a
    /// station, instead of being flooded to every port until learned (a
    /// sink never sends, so it is never learned).
    pub fn with_mac(name: &str, mac: Mac) -> SinkPort {
        SinkPort {
            mac: Some(mac),
            ..SinkPort::new(name)
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
    fn as_any(&mut self) -> Option<&mut dyn std::any::Any> {
        Some(self)
    }
    fn locked_mac(&self) -> Option<Mac> {
        self.mac
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
