//! What the vhost-user tests share: a frontend of our own that can lie
//! ([`frontend`]), a port that keeps what it is given, one that counts it,
//! and a switch driven step by step in the test's own thread.

#![allow(dead_code)]

pub mod frontend;
pub mod memif;
pub mod ring_port;

use std::path::{Path, PathBuf};
use std::time::Instant;

use ring::device::FrameRef;
use ring::Mode;
use vswitch::ports::vhost::{Config as VhostConfig, VhostPort};
use vswitch::{Config, Counters, EventLoop, Port, Switch};

/// Keeps a copy of every frame it is given.
pub struct CapturePort {
    name: String,
    /// The frames, in order.
    pub frames: Vec<Vec<u8>>,
    c: Counters,
}

impl CapturePort {
    /// A capture named `name`.
    pub fn new(name: &str) -> CapturePort {
        CapturePort {
            name: name.into(),
            frames: Vec::new(),
            c: Counters::default(),
        }
    }
}

impl Port for CapturePort {
    fn name(&self) -> &str {
        &self.name
    }
    fn kind(&self) -> &'static str {
        "capture"
    }
    fn pending(&mut self) -> bool {
        false
    }
    fn rx(&mut self, _max: u32, _out: &mut Vec<FrameRef>) -> u32 {
        0
    }
    fn rx_done(&mut self, _token: u32, _frames: u64, _now: Instant) {}
    unsafe fn tx(&mut self, f: FrameRef) -> bool {
        // SAFETY: the caller guarantees f is readable for f.len bytes.
        let b = unsafe { std::slice::from_raw_parts(f.ptr, f.len as usize) };
        self.frames.push(b.to_vec());
        self.c.to_port += 1;
        true
    }
    fn counters(&mut self) -> &mut Counters {
        &mut self.c
    }
    fn as_any(&mut self) -> Option<&mut dyn std::any::Any> {
        Some(self)
    }
}

/// Counts what it is given and keeps nothing: a destination that always
/// has room, for tests that look at counters (the benchmarks' sink, in the
/// `bench` crate, also pins an address to itself; these tests need not).
pub struct SinkPort {
    name: String,
    c: Counters,
}

impl SinkPort {
    /// A sink named `name`.
    pub fn new(name: &str) -> SinkPort {
        SinkPort {
            name: name.into(),
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
        self.c.to_port_bytes += u64::from(f.len);
        true
    }
    fn counters(&mut self) -> &mut Counters {
        &mut self.c
    }
}

/// A fresh directory for one test's sockets.
pub fn dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("fp-vhost-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("socket directory");
    d
}

/// A switch that learns no address (every frame goes to every other
/// port), driven by the test: [`settle`].
pub fn switch() -> EventLoop {
    let sw = Switch::new(Config {
        max_macs: 0,
        log_ports: false,
        ..Config::default()
    })
    .expect("switch");
    EventLoop::new(sw).expect("event loop")
}

/// A vhost-user port `name` on `dir/name.sock`, added to `sw`.
pub fn add_vport(sw: &mut EventLoop, dir: &Path, name: &str, mode: Mode, itr: u32) -> u16 {
    let mut c = VhostConfig::new(name, &dir.join(format!("{name}.sock")));
    c.mode = mode;
    c.itr = itr;
    sw.add_port(Box::new(VhostPort::bind(c).expect("bind vhost-user port")))
        .expect("add port")
}

/// A vhost-user port `name` on `dir/name.sock` offering `pairs` queue
/// pairs (CSB), added to `sw`.
pub fn add_mq_port(sw: &mut EventLoop, dir: &Path, name: &str, pairs: u16) -> u16 {
    let mut c = VhostConfig::new(name, &dir.join(format!("{name}.sock")));
    c.mode = Mode::Csb;
    c.queue_pairs = pairs;
    sw.add_port(Box::new(VhostPort::bind(c).expect("bind")))
        .expect("add port")
}

/// Let the switch serve what is waiting and forward it, a few times over.
pub fn settle(sw: &mut EventLoop) {
    for _ in 0..4 {
        sw.poll_events();
        sw.pass();
    }
}

/// The vhost-user port at `i`.
pub fn vport(sw: &mut EventLoop, i: u16) -> &mut VhostPort {
    sw.port_as::<VhostPort>(i).expect("a vhost-user port")
}

/// The capture port at `i`.
pub fn capture(sw: &mut EventLoop, i: u16) -> &mut CapturePort {
    sw.port_as::<CapturePort>(i).expect("a capture port")
}
