//! Sink ports: a counter inside the switch, for benchmarks.

use std::time::Instant;

use ring::device::FrameRef;

use super::{Counters, Port};

/// A sink inside the switch: counts what it is given (the host side of a
/// guest-transmit benchmark).
pub struct SinkPort {
    name: String,
    c: Counters,
    mac: Option<crate::bridge::Mac>,
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
    pub fn with_mac(name: &str, mac: crate::bridge::Mac) -> SinkPort {
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
    fn locked_mac(&self) -> Option<crate::bridge::Mac> {
        self.mac
    }
    fn counters(&mut self) -> &mut Counters {
        &mut self.c
    }
}
