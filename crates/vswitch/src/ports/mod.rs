//! The kinds of switch port.
//!
//! Every port implements [`Port`]; the switch holds them as `Box<dyn Port>`
//! and knows nothing of their kind beyond that trait.
//!
//! - [`ring`]: the device side of the paravirtual NIC, attached through the
//!   control socket.
//! - [`tap`]: a TAP device (the kernel's stack).
//! - [`memif`]: memif clients (DPDK, VPP) attached through the memif socket.
//! - [`vhost`]: a virtual machine's virtio-net device (QEMU attaches over
//!   vhost-user); one socket per port, made from the configuration.
//!
//! Ports inside the switch that make, count or reflect frames are the
//! benchmarks' (the `bench` crate's `switch_ports`): any type that
//! implements [`Port`] can be added.
//!
//! A kind whose ports outside programs attach through a socket of its own
//! also has a server implementing the event loop's `Attach` (as
//! `memif/mod.rs` does); the event loop binds it (its `servers`), adds the
//! ports its connections bring and removes them when they close. Port
//! kinds import the status types ([`crate::status`]) and nothing of the
//! switch itself.

pub mod memif;
pub mod ring;
pub mod tap;
pub mod vhost;

use std::os::fd::BorrowedFd;
use std::time::Instant;

use ::ring::device::FrameRef;

use crate::offload::{Caps, Offload};

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
    /// Frames from this port dropped by port security: a source address
    /// other than the one the port is locked to, or one locked to another
    /// port.
    pub spoofed: u64,
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
    /// The offload metadata of the frames of the last `rx` that carry some
    /// (a partial checksum, a segment to cut), as (index in that batch,
    /// metadata), in batch order; checked against the frames by the port.
    /// Frames without offloads have no entry, so a batch without any costs
    /// the switch one look at an empty slice.
    fn rx_offloads(&self) -> &[(u32, Offload)] {
        &[]
    }
    /// What the port can take unfinished ([`Port::tx_offload`]); the switch
    /// finishes (segments, checksums) any other frame before handing it
    /// over.
    fn offload_caps(&self) -> Caps {
        Caps::NONE
    }
    /// Take one frame with its offload metadata, which
    /// [`Port::offload_caps`] accepts; false if the port cannot take it now.
    ///
    /// # Safety
    /// `f` must be readable for `f.len` bytes.
    unsafe fn tx_offload(&mut self, f: FrameRef, _o: &Offload) -> bool {
        // SAFETY: forwarded from the caller's contract.
        unsafe { self.tx(f) }
    }
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
    /// The only source address this port may send from (port security),
    /// if it is locked: the switch drops its frames from any other address
    /// and pins this one to it, so that no other port can take its traffic
    /// by sending from it.
    fn locked_mac(&self) -> Option<crate::bridge::Mac> {
        None
    }
    /// The port's counters (the switch updates some of them).
    fn counters(&mut self) -> &mut Counters;
    /// Port-specific details for the status document.
    fn status(&self) -> crate::status::PortDetail {
        crate::status::PortDetail::None(crate::status::NoDetail {})
    }
    /// The port as `Any`, for the program that added it to reach its own
    /// kind's methods through [`crate::Switch::port_as`] (a VM port's
    /// notification scheme, say). Kinds with such methods return
    /// `Some(self)`.
    fn as_any(&mut self) -> Option<&mut dyn std::any::Any> {
        None
    }
}
