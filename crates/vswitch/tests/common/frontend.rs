//! The vhost-user frontend of `vhost-peer` (it speaks the protocol to a
//! port the way QEMU does, shares a memfd as guest memory, and lays out and
//! fills the virtio rings itself, so that tests can make it lie), with the
//! glue these tests need: the switch runs in the test's own thread, so
//! every request that expects a reply pumps it ([`EventLoop::poll_events`])
//! until the reply comes.

// Each test binary uses a part of what is re-exported here.
#![allow(unused_imports)]

use std::ops::{Deref, DerefMut};
use std::path::Path;

use vhost_peer::Guest;
pub use vhost_peer::{
    eventfd, mem_table, req, state, u64p, vring_addr, Layout, RawDesc, SharedMem, Wire, BUF,
    FEATURES, MEM, NEED_REPLY, REPLY_TIMEOUT, RX_BUFS, TX_BUFS, VERSION,
};
use vswitch::EventLoop;

/// Requests that expect a reply, pumping a switch driven by the test.
pub trait Pumped {
    /// Send `code` with `payload` and pump `sw` until the reply's 8-byte
    /// value comes (or [`REPLY_TIMEOUT`] passes: `None`).
    fn ask(&mut self, sw: &mut EventLoop, code: u32, payload: &[u8]) -> Option<u64>;
}

impl Pumped for Wire {
    fn ask(&mut self, sw: &mut EventLoop, code: u32, payload: &[u8]) -> Option<u64> {
        self.request_pumped(code, payload, REPLY_TIMEOUT, &mut || {
            sw.poll_events();
        })
    }
}

/// A well-behaved frontend with one queue pair ([`vhost_peer::Guest`]),
/// attached to a switch that the test drives.
pub struct TestGuest(Guest);

impl Deref for TestGuest {
    type Target = Guest;
    fn deref(&self) -> &Guest {
        &self.0
    }
}

impl DerefMut for TestGuest {
    fn deref_mut(&mut self) -> &mut Guest {
        &mut self.0
    }
}

impl TestGuest {
    /// Connect to `path` and set the device up, as QEMU does: features,
    /// memory table, then for each queue size, base, addresses, kick,
    /// call, enable.
    pub fn attach(sw: &mut EventLoop, path: &Path, num: u16) -> vhost_peer::Result<TestGuest> {
        let q = [Layout::standard(0, num), Layout::standard(1, num)];
        TestGuest::attach_with(sw, path, MEM, q)
    }

    /// [`TestGuest::attach`] with `size` bytes of guest memory and the
    /// queues where `q` puts them (rings larger than the standard layout
    /// holds).
    pub fn attach_with(
        sw: &mut EventLoop,
        path: &Path,
        size: u64,
        q: [Layout; 2],
    ) -> vhost_peer::Result<TestGuest> {
        let g = Guest::attach_pumped(path, size, q, REPLY_TIMEOUT, &mut || {
            sw.poll_events();
        })?;
        sw.poll_events();
        Ok(TestGuest(g))
    }

    /// [`TestGuest::attach`] with the in-flight region negotiated and
    /// asked for (`GET_INFLIGHT_FD`).
    pub fn attach_tracked(
        sw: &mut EventLoop,
        path: &Path,
        num: u16,
    ) -> vhost_peer::Result<TestGuest> {
        let q = [Layout::standard(0, num), Layout::standard(1, num)];
        let g = Guest::attach_tracked_pumped(path, MEM, q, REPLY_TIMEOUT, &mut || {
            sw.poll_events();
        })?;
        sw.poll_events();
        Ok(TestGuest(g))
    }

    /// [`TestGuest::attach_with`] acknowledging `features` instead of the
    /// frontend's default set.
    pub fn attach_features(
        sw: &mut EventLoop,
        path: &Path,
        size: u64,
        q: [Layout; 2],
        features: u64,
    ) -> vhost_peer::Result<TestGuest> {
        let g = Guest::attach_pumped_features(path, size, q, REPLY_TIMEOUT, features, &mut || {
            sw.poll_events();
        })?;
        sw.poll_events();
        Ok(TestGuest(g))
    }

    /// Connect again to `path` (a new switch there), as QEMU does after
    /// its backend vanished.
    pub fn reconnect(&mut self, sw: &mut EventLoop, path: &Path) -> vhost_peer::Result<()> {
        self.0.reconnect_pumped(path, REPLY_TIMEOUT, &mut || {
            sw.poll_events();
        })?;
        sw.poll_events();
        Ok(())
    }
}
