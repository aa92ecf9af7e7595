//! A well-behaved frontend with several queue pairs: pair `k` receives on
//! queue `2k` and transmits on queue `2k + 1` (virtio-net's numbering).
//! It sets the device up as QEMU's `-netdev vhost-user,queues=N` does:
//! `MQ` among the protocol features, `GET_QUEUE_NUM` asked (and checked
//! against `N`), the memory table once, then every queue of every pair,
//! and `SET_VRING_ENABLE` on for the pairs the guest's driver uses and off
//! for the rest. Its rings and buffers are written by hand, so a test can
//! also make it lie.

use std::os::fd::AsFd;
use std::path::Path;
use std::time::Duration;

use ring::notify::EventFd;

use crate::guest::{eventfd, BUF, HDR};
use crate::mem::SharedMem;
use crate::virtq::{Layout, RawDesc, F_WRITE};
use crate::wire::{
    mem_table, req, state, u64p, vring_addr, Wire, FEATURES, PROTOCOL_F_MQ, VERSION,
};
use crate::{Error, Result};

/// The largest ring this frontend lays out (each queue's rings sit in a
/// 64 KiB slot, and its buffers in `MQ_MAX_NUM` x [`BUF`] bytes).
pub const MQ_MAX_NUM: u16 = 256;
/// Where buffers start: past the rings of up to 16 queues.
pub const MQ_BUFS: u64 = 0x10_0000;

/// Bytes of guest memory for `queues` queues ([`MQ_BUFS`], then
/// [`MQ_MAX_NUM`] buffers per queue).
pub const fn mq_mem(queues: usize) -> u64 {
    MQ_BUFS + queues as u64 * MQ_MAX_NUM as u64 * BUF
}

/// A frontend with several queue pairs, attached.
pub struct MqGuest {
    /// The connection.
    pub wire: Wire,
    /// Guest memory.
    pub mem: SharedMem,
    /// Each queue's rings (`2k`: pair `k` receives, `2k + 1`: transmits).
    pub q: Vec<Layout>,
    /// Kick eventfds (ours to write).
    pub kick: Vec<EventFd>,
    /// Call eventfds (ours to read).
    pub call: Vec<EventFd>,
    /// The available index each queue has published.
    pub avail_idx: Vec<u16>,
    /// The used index each queue was read up to.
    pub used_seen: Vec<u16>,
    /// What the backend answered to `GET_QUEUE_NUM`.
    pub queue_num: u64,
}

impl MqGuest {
    /// Connect to `path` and set up `nums.len() / 2` queue pairs with
    /// rings of `nums[i]` entries (each a power of two up to
    /// [`MQ_MAX_NUM`]), enabling the first `enabled` pairs; for a backend
    /// driven in this thread (`pump` runs it while a reply is awaited).
    /// A backend that offers fewer pairs than asked for is refused, as
    /// QEMU refuses it.
    pub fn attach_pumped(
        path: &Path,
        nums: &[u16],
        enabled: usize,
        timeout: Duration,
        pump: &mut dyn FnMut(),
    ) -> Result<MqGuest> {
        let g = MqGuest::connect_pumped(path, nums, timeout, pump)?;
        for i in 0..nums.len() {
            g.setup_queue(i as u32, 0)?;
            g.send(
                req::SET_VRING_ENABLE,
                &state(i as u32, u32::from(i / 2 < enabled)),
            )?;
        }
        Ok(g)
    }

    /// [`MqGuest::attach_pumped`] up to the memory table: no queue set up
    /// or enabled yet (the caller does it, in whatever order it likes).
    pub fn connect_pumped(
        path: &Path,
        nums: &[u16],
        timeout: Duration,
        pump: &mut dyn FnMut(),
    ) -> Result<MqGuest> {
        let n = nums.len();
        assert!(
            n >= 2 && n.is_multiple_of(2) && n <= 16,
            "whole pairs, at most 8"
        );
        assert!(nums.iter().all(|&x| x <= MQ_MAX_NUM && x.is_power_of_two()));
        let mem = SharedMem::new(mq_mem(n), true).map_err(Error::io("guest memory"))?;
        let wire = Wire::connect(path).map_err(Error::io("connect to the backend"))?;
        let ev = || eventfd().map_err(Error::io("eventfd"));
        let mut kick = Vec::new();
        let mut call = Vec::new();
        for _ in 0..n {
            kick.push(ev()?);
            call.push(ev()?);
        }
        let mut g = MqGuest {
            wire,
            mem,
            q: nums
                .iter()
                .enumerate()
                .map(|(i, &num)| Layout::standard(i as u64, num))
                .collect(),
            kick,
            call,
            avail_idx: vec![0; n],
            used_seen: vec![0; n],
            queue_num: 0,
        };
        for (code, name) in [
            (req::GET_FEATURES, "GET_FEATURES"),
            (req::GET_PROTOCOL_FEATURES, "GET_PROTOCOL_FEATURES"),
        ] {
            g.wire
                .request_pumped(code, &[], timeout, pump)
                .ok_or(Error::NoReply(name))?;
        }
        g.send(req::SET_PROTOCOL_FEATURES, &u64p(PROTOCOL_F_MQ))?;
        g.queue_num = g
            .wire
            .request_pumped(req::GET_QUEUE_NUM, &[], timeout, pump)
            .ok_or(Error::NoReply("GET_QUEUE_NUM"))?;
        if g.queue_num < (n / 2) as u64 {
            return Err(Error::Io {
                what: "the backend offers fewer queue pairs than asked for",
                source: std::io::Error::other(format!("{} < {}", g.queue_num, n / 2)),
            });
        }
        g.send(req::SET_OWNER, &[])?;
        g.send(req::SET_FEATURES, &u64p(FEATURES))?;
        g.wire
            .send(
                req::SET_MEM_TABLE,
                VERSION,
                &mem_table(&[(0, g.mem.size, g.mem.uaddr, 0)]),
                &[g.mem.file.as_fd()],
            )
            .map_err(Error::io("send a request"))?;
        Ok(g)
    }

    /// Send a request without descriptors, expecting no reply.
    pub fn send(&self, code: u32, payload: &[u8]) -> Result<()> {
        self.wire
            .send(code, VERSION, payload, &[])
            .map_err(Error::io("send a request"))
    }

    /// Queue pairs set up.
    pub fn pairs(&self) -> usize {
        self.q.len() / 2
    }

    /// Set queue `i` up with its layout (size, base, addresses, kick,
    /// call), starting at `base`; not enabled.
    pub fn setup_queue(&self, i: u32, base: u16) -> Result<()> {
        let l = self.q[i as usize];
        let ua = self.mem.uaddr;
        self.send(req::SET_VRING_NUM, &state(i, u32::from(l.num)))?;
        self.send(req::SET_VRING_BASE, &state(i, u32::from(base)))?;
        self.send(
            req::SET_VRING_ADDR,
            &vring_addr(i, ua + l.desc, ua + l.used, ua + l.avail),
        )?;
        for (code, fd) in [
            (req::SET_VRING_KICK, &self.kick[i as usize]),
            (req::SET_VRING_CALL, &self.call[i as usize]),
        ] {
            self.wire
                .send(code, VERSION, &u64p(u64::from(i)), &[fd.as_fd()])
                .map_err(Error::io("send a request"))?;
        }
        Ok(())
    }

    /// Turn pair `p` on or off (both its queues), as QEMU does when the
    /// guest's driver changes its queue count (`ethtool -L`).
    pub fn enable_pair(&self, p: usize, on: bool) -> Result<()> {
        for i in [2 * p, 2 * p + 1] {
            self.send(req::SET_VRING_ENABLE, &state(i as u32, u32::from(on)))?;
        }
        Ok(())
    }

    /// Where queue `q`'s buffer for ring slot `slot` lies (an offset).
    pub fn buf(&self, q: usize, slot: u16) -> u64 {
        MQ_BUFS + (q as u64 * u64::from(MQ_MAX_NUM) + u64::from(slot)) * BUF
    }

    /// Send one frame (header + frame in one descriptor) on pair `p`'s
    /// transmit queue.
    pub fn send_frame(&mut self, p: usize, frame: &[u8]) {
        let q = 2 * p + 1;
        let l = self.q[q];
        let slot = self.avail_idx[q] % l.num;
        let off = self.buf(q, slot);
        self.mem.write(off, &[0u8; HDR as usize]);
        self.mem.write(off + HDR, frame);
        self.mem.write(
            l.desc_at(slot),
            &RawDesc {
                addr: self.mem.gpa + off,
                len: HDR as u32 + frame.len() as u32,
                flags: 0,
                next: 0,
            }
            .bytes(),
        );
        self.mem.w16(l.avail + 4 + 2 * u64::from(slot), slot);
        self.publish(q, self.avail_idx[q].wrapping_add(1));
    }

    /// Publish queue `q`'s available index `idx` (written as given) and
    /// kick.
    pub fn publish(&mut self, q: usize, idx: u16) {
        self.avail_idx[q] = idx;
        self.mem.w16(self.q[q].avail + 2, idx);
        self.kick[q].signal();
    }

    /// Post `n` receive buffers on pair `p`'s receive queue.
    pub fn post_rx(&mut self, p: usize, n: u16) {
        let q = 2 * p;
        let l = self.q[q];
        for k in 0..n {
            let slot = self.avail_idx[q].wrapping_add(k) % l.num;
            self.mem.write(
                l.desc_at(slot),
                &RawDesc {
                    addr: self.mem.gpa + self.buf(q, slot),
                    len: BUF as u32,
                    flags: F_WRITE,
                    next: 0,
                }
                .bytes(),
            );
            self.mem.w16(l.avail + 4 + 2 * u64::from(slot), slot);
        }
        self.publish(q, self.avail_idx[q].wrapping_add(n));
    }

    /// Used entries of queue `q` since last read: (id, len).
    pub fn take_used(&mut self, q: usize) -> Vec<(u32, u32)> {
        self.q[q].take_used(&self.mem, &mut self.used_seen[q])
    }

    /// Frames received on pair `p`'s receive queue since last read
    /// (header stripped), from buffers [`MqGuest::post_rx`] posted; the
    /// buffers are posted again.
    pub fn received(&mut self, p: usize) -> Vec<Vec<u8>> {
        let q = 2 * p;
        let used = self.take_used(q);
        let out: Vec<Vec<u8>> = used
            .iter()
            .filter(|&&(_, len)| u64::from(len) >= HDR)
            .map(|&(id, len)| {
                self.mem.read(
                    self.buf(q, (id % u32::from(MQ_MAX_NUM)) as u16) + HDR,
                    (u64::from(len) - HDR) as usize,
                )
            })
            .collect();
        if !used.is_empty() {
            self.post_rx(p, used.len() as u16);
        }
        out
    }
}
