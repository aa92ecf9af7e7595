//! A well-behaved frontend with one queue pair (queue 0 receives, queue 1
//! transmits), every value of which its user may change: the device is
//! set up as QEMU sets it up, then the rings are written by hand.

use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;
use std::time::Duration;

use ring::notify::EventFd;

use crate::mem::SharedMem;
use crate::virtq::{Layout, RawDesc, F_NEXT, F_WRITE};
use crate::wire::{
    inflight, mem_table, req, state, u64p, vring_addr, Wire, FEATURES, PROTOCOL_F_INFLIGHT_SHMFD,
    VERSION,
};
use crate::{Error, Result};

/// Where transmit buffers start in the shared memory of a
/// [`Layout::standard`] guest.
pub const TX_BUFS: u64 = 0x2_0000;
/// Where receive buffers start.
pub const RX_BUFS: u64 = 0xa_0000;
/// Bytes per buffer.
pub const BUF: u64 = 2048;
/// Bytes of shared memory (rings of up to 2048 entries, 256 buffers each
/// way).
pub const MEM: u64 = 0x20_0000;

/// Bytes of shared memory for a guest that sends and receives large
/// frames ([`Guest::send_chain`], [`Guest::post_rx_sized`]).
pub const BIG_MEM: u64 = 0x40_0000;
/// Where [`Guest::send_chain`] puts a frame (up to 1 MiB).
pub const BIG_TX: u64 = 0x20_0000;
/// Where [`Guest::post_rx_sized`] puts receive buffers (up to 1 MiB).
pub const BIG_RX: u64 = 0x30_0000;

/// Virtio-net's header on every frame (`virtio_net_hdr_mrg_rxbuf`, 12
/// bytes with VERSION_1).
pub const HDR: u64 = 12;

/// A fresh eventfd.
pub fn eventfd() -> std::io::Result<EventFd> {
    EventFd::new().map_err(std::io::Error::other)
}

/// A frontend with one queue pair, attached.
pub struct Guest {
    /// The connection.
    pub wire: Wire,
    /// Guest memory.
    pub mem: SharedMem,
    /// Queue 0 (receive) and 1 (transmit).
    pub q: [Layout; 2],
    /// Kick eventfds (ours to write).
    pub kick: [EventFd; 2],
    /// Call eventfds (ours to read).
    pub call: [EventFd; 2],
    /// The available index each queue has published.
    pub avail_idx: [u16; 2],
    /// The used index each queue was read up to.
    pub used_seen: [u16; 2],
    /// The backend's in-flight region, once asked for
    /// ([`Guest::attach_tracked_pumped`]): handed back on every reconnect.
    pub inflight: Option<SharedMem>,
}

impl Guest {
    /// Connect to `path` and set the device up, as QEMU does, with `size`
    /// bytes of guest memory and the queues where `q` puts them; for a
    /// backend running in a thread or process of its own (each reply is
    /// awaited up to `timeout`).
    pub fn attach(path: &Path, size: u64, q: [Layout; 2], timeout: Duration) -> Result<Guest> {
        Guest::attach_inner(path, size, q, timeout, FEATURES, None)
    }

    /// [`Guest::attach`] for a backend driven in this thread: `pump` runs
    /// it while a reply is awaited.
    pub fn attach_pumped(
        path: &Path,
        size: u64,
        q: [Layout; 2],
        timeout: Duration,
        pump: &mut dyn FnMut(),
    ) -> Result<Guest> {
        Guest::attach_inner(path, size, q, timeout, FEATURES, Some(pump))
    }

    /// [`Guest::attach_pumped`] acknowledging `features` (say
    /// [`crate::OFFLOAD_FEATURES`]) instead of [`FEATURES`].
    pub fn attach_pumped_features(
        path: &Path,
        size: u64,
        q: [Layout; 2],
        timeout: Duration,
        features: u64,
        pump: &mut dyn FnMut(),
    ) -> Result<Guest> {
        Guest::attach_inner(path, size, q, timeout, features, Some(pump))
    }

    /// Features, memory table, then for each queue size, base, addresses,
    /// kick, call, enable: QEMU's order.
    fn attach_inner(
        path: &Path,
        size: u64,
        q: [Layout; 2],
        timeout: Duration,
        features: u64,
        mut pump: Option<&mut dyn FnMut()>,
    ) -> Result<Guest> {
        let mem = SharedMem::new(size, true).map_err(Error::io("guest memory"))?;
        let wire = Wire::connect(path).map_err(Error::io("connect to the backend"))?;
        let ev = || eventfd().map_err(Error::io("eventfd"));
        let mut g = Guest {
            wire,
            mem,
            q,
            kick: [ev()?, ev()?],
            call: [ev()?, ev()?],
            avail_idx: [0; 2],
            used_seen: [0; 2],
            inflight: None,
        };
        for (code, name) in [
            (req::GET_FEATURES, "GET_FEATURES"),
            (req::GET_PROTOCOL_FEATURES, "GET_PROTOCOL_FEATURES"),
        ] {
            let r = match pump.as_mut() {
                Some(p) => g.wire.request_pumped(code, &[], timeout, &mut **p),
                None => g.wire.request(code, &[], timeout),
            };
            r.ok_or(Error::NoReply(name))?;
        }
        g.wire
            .send(req::SET_PROTOCOL_FEATURES, VERSION, &u64p(0), &[])
            .map_err(Error::io("send a request"))?;
        g.wire
            .send(req::SET_OWNER, VERSION, &[], &[])
            .map_err(Error::io("send a request"))?;
        g.wire
            .send(req::SET_FEATURES, VERSION, &u64p(features), &[])
            .map_err(Error::io("send a request"))?;
        g.set_mem_table(&[(0, size, g.mem.uaddr, 0)], &[g.mem.file.as_fd()])
            .map_err(Error::io("send a request"))?;
        for i in 0..2u32 {
            g.setup_queue(i).map_err(Error::io("send a request"))?;
        }
        Ok(g)
    }

    /// [`Guest::attach_pumped`] that also negotiates `INFLIGHT_SHMFD` and
    /// asks the backend for its in-flight region (`GET_INFLIGHT_FD`, before
    /// the queues start, as QEMU's block devices do), kept in
    /// [`Guest::inflight`].
    pub fn attach_tracked_pumped(
        path: &Path,
        size: u64,
        q: [Layout; 2],
        timeout: Duration,
        pump: &mut dyn FnMut(),
    ) -> Result<Guest> {
        let mem = SharedMem::new(size, true).map_err(Error::io("guest memory"))?;
        let wire = Wire::connect(path).map_err(Error::io("connect to the backend"))?;
        let ev = || eventfd().map_err(Error::io("eventfd"));
        let mut g = Guest {
            wire,
            mem,
            q,
            kick: [ev()?, ev()?],
            call: [ev()?, ev()?],
            avail_idx: [0; 2],
            used_seen: [0; 2],
            inflight: None,
        };
        g.handshake(true, timeout, pump)?;
        let num = g.q[0].num.max(g.q[1].num);
        g.wire
            .send(req::GET_INFLIGHT_FD, VERSION, &inflight(0, 0, 2, num), &[])
            .map_err(Error::io("send a request"))?;
        let (reply, fd) = g
            .wire
            .await_reply_fd(timeout, Some(pump))
            .ok_or(Error::NoReply("GET_INFLIGHT_FD"))?;
        let fd = fd.ok_or(Error::NoReply("GET_INFLIGHT_FD's descriptor"))?;
        let mmap_size = reply
            .get(..8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
            .unwrap_or(0);
        g.inflight = Some(
            SharedMem::from_file(std::fs::File::from(fd), mmap_size)
                .map_err(Error::io("map the in-flight region"))?,
        );
        g.set_mem_table(&[(0, size, g.mem.uaddr, 0)], &[g.mem.file.as_fd()])
            .map_err(Error::io("send a request"))?;
        for i in 0..2u32 {
            g.setup_queue(i).map_err(Error::io("send a request"))?;
        }
        Ok(g)
    }

    /// Connect again to a backend at `path` (it restarted), as QEMU does:
    /// the same guest memory and eventfds, the acknowledged features, the
    /// in-flight region handed back if there is one (`SET_INFLIGHT_FD`),
    /// and each queue started at the used ring's index read from guest
    /// memory (QEMU's `virtio_queue_restore_last_avail_idx` after a
    /// backend vanished).
    pub fn reconnect_pumped(
        &mut self,
        path: &Path,
        timeout: Duration,
        pump: &mut dyn FnMut(),
    ) -> Result<()> {
        self.wire = Wire::connect(path).map_err(Error::io("connect to the backend"))?;
        let tracked = self.inflight.is_some();
        self.handshake(tracked, timeout, pump)?;
        if let Some(r) = &self.inflight {
            let num = self.q[0].num.max(self.q[1].num);
            self.wire
                .send(
                    req::SET_INFLIGHT_FD,
                    VERSION,
                    &inflight(r.size, 0, 2, num),
                    &[r.file.as_fd()],
                )
                .map_err(Error::io("send a request"))?;
        }
        self.set_mem_table(
            &[(0, self.mem.size, self.mem.uaddr, 0)],
            &[self.mem.file.as_fd()],
        )
        .map_err(Error::io("send a request"))?;
        for i in 0..2u32 {
            let used = self.mem.r16(self.q[i as usize].used + 2);
            self.setup_queue_at(i, used)
                .map_err(Error::io("send a request"))?;
        }
        Ok(())
    }

    /// Features, protocol features (`INFLIGHT_SHMFD` too if `tracked`),
    /// owner, features acknowledged.
    fn handshake(
        &mut self,
        tracked: bool,
        timeout: Duration,
        pump: &mut dyn FnMut(),
    ) -> Result<()> {
        for (code, name) in [
            (req::GET_FEATURES, "GET_FEATURES"),
            (req::GET_PROTOCOL_FEATURES, "GET_PROTOCOL_FEATURES"),
        ] {
            self.wire
                .request_pumped(code, &[], timeout, pump)
                .ok_or(Error::NoReply(name))?;
        }
        let proto = if tracked {
            PROTOCOL_F_INFLIGHT_SHMFD
        } else {
            0
        };
        let send = |w: &Wire, code, payload: &[u8]| {
            w.send(code, VERSION, payload, &[])
                .map_err(Error::io("send a request"))
        };
        send(&self.wire, req::SET_PROTOCOL_FEATURES, &u64p(proto))?;
        send(&self.wire, req::SET_OWNER, &[])?;
        send(&self.wire, req::SET_FEATURES, &u64p(FEATURES))?;
        Ok(())
    }

    /// Send a memory table.
    pub fn set_mem_table(
        &self,
        regions: &[(u64, u64, u64, u64)],
        fds: &[BorrowedFd<'_>],
    ) -> std::io::Result<()> {
        self.wire
            .send(req::SET_MEM_TABLE, VERSION, &mem_table(regions), fds)
    }

    /// Set queue `i` up with its layout, from index 0.
    pub fn setup_queue(&self, i: u32) -> std::io::Result<()> {
        self.setup_queue_at(i, 0)
    }

    /// Set queue `i` up with its layout, starting at `base`.
    pub fn setup_queue_at(&self, i: u32, base: u16) -> std::io::Result<()> {
        let l = self.q[i as usize];
        let ua = self.mem.uaddr;
        self.wire.send(
            req::SET_VRING_NUM,
            VERSION,
            &state(i, u32::from(l.num)),
            &[],
        )?;
        self.wire.send(
            req::SET_VRING_BASE,
            VERSION,
            &state(i, u32::from(base)),
            &[],
        )?;
        self.wire.send(
            req::SET_VRING_ADDR,
            VERSION,
            &vring_addr(i, ua + l.desc, ua + l.used, ua + l.avail),
            &[],
        )?;
        self.wire.send(
            req::SET_VRING_KICK,
            VERSION,
            &u64p(u64::from(i)),
            &[self.kick[i as usize].as_fd()],
        )?;
        self.wire.send(
            req::SET_VRING_CALL,
            VERSION,
            &u64p(u64::from(i)),
            &[self.call[i as usize].as_fd()],
        )?;
        self.wire
            .send(req::SET_VRING_ENABLE, VERSION, &state(i, 1), &[])
    }

    /// Write descriptor `i` of queue `q`.
    pub fn put_desc(&self, q: usize, i: u16, d: RawDesc) {
        self.mem.write(self.q[q].desc_at(i), &d.bytes());
    }

    /// Put `head` in queue `q`'s available ring at the `k`-th entry after
    /// the published index (not published: see [`Guest::publish`]).
    pub fn push_avail(&mut self, q: usize, k: u16, head: u16) {
        let l = self.q[q];
        let slot = self.avail_idx[q].wrapping_add(k) % l.num;
        self.mem.w16(l.avail + 4 + 2 * u64::from(slot), head);
    }

    /// Publish queue `q`'s available index `idx` (written as given, so any
    /// value) and kick.
    pub fn publish(&mut self, q: usize, idx: u16) {
        self.avail_idx[q] = idx;
        self.mem.w16(self.q[q].avail + 2, idx);
        self.kick[q].signal();
    }

    /// Send one frame (header + frame in one descriptor) on queue 1, from
    /// the [`TX_BUFS`] area.
    pub fn send_frame(&mut self, frame: &[u8]) {
        let l = self.q[1];
        let slot = self.avail_idx[1] % l.num;
        let off = TX_BUFS + u64::from(slot) * BUF;
        self.mem.write(off, &[0u8; HDR as usize]);
        self.mem.write(off + HDR, frame);
        self.put_desc(
            1,
            slot,
            RawDesc {
                addr: self.mem.gpa + off,
                len: HDR as u32 + frame.len() as u32,
                flags: 0,
                next: 0,
            },
        );
        self.push_avail(1, 0, slot);
        let idx = self.avail_idx[1].wrapping_add(1);
        self.publish(1, idx);
    }

    /// Post `n` receive buffers on queue 0, from the [`RX_BUFS`] area.
    pub fn post_rx(&mut self, n: u16) {
        let l = self.q[0];
        for k in 0..n {
            let slot = self.avail_idx[0].wrapping_add(k) % l.num;
            self.put_desc(
                0,
                slot,
                RawDesc {
                    addr: self.mem.gpa + RX_BUFS + u64::from(slot) * BUF,
                    len: BUF as u32,
                    flags: F_WRITE,
                    next: 0,
                },
            );
            self.push_avail(0, k, slot);
        }
        let idx = self.avail_idx[0].wrapping_add(n);
        self.publish(0, idx);
    }

    /// Send a frame with the virtio-net header `hdr` as one chain on queue
    /// 1: the header in a descriptor of its own (descriptor 0), the frame
    /// cut into `pieces` descriptors (1..=pieces) of about equal size, from
    /// the [`BIG_TX`] area (memory of [`BIG_MEM`] bytes). The previous
    /// chain must have been returned (the descriptors are reused).
    pub fn send_chain(&mut self, hdr: &[u8; 12], frame: &[u8], pieces: usize) {
        let pieces = pieces.clamp(1, frame.len().max(1));
        self.mem.write(BIG_TX, hdr);
        let frame_at = BIG_TX + 64;
        self.mem.write(frame_at, frame);
        self.put_desc(
            1,
            0,
            RawDesc {
                addr: self.mem.gpa + BIG_TX,
                len: HDR as u32,
                flags: F_NEXT,
                next: 1,
            },
        );
        let per = frame.len().div_ceil(pieces);
        let mut at = 0usize;
        let mut i = 1u16;
        while at < frame.len() || i == 1 {
            let len = per.min(frame.len() - at);
            let last = at + len >= frame.len();
            self.put_desc(
                1,
                i,
                RawDesc {
                    addr: self.mem.gpa + frame_at + at as u64,
                    len: len as u32,
                    flags: if last { 0 } else { F_NEXT },
                    next: if last { 0 } else { i + 1 },
                },
            );
            at += len;
            i += 1;
            if last {
                break;
            }
        }
        self.push_avail(1, 0, 0);
        let idx = self.avail_idx[1].wrapping_add(1);
        self.publish(1, idx);
    }

    /// Post `n` receive buffers of `len` bytes each on queue 0, from the
    /// [`BIG_RX`] area (`n x len` at most 1 MiB).
    pub fn post_rx_sized(&mut self, n: u16, len: u32) {
        let l = self.q[0];
        for k in 0..n {
            let slot = self.avail_idx[0].wrapping_add(k) % l.num;
            self.put_desc(
                0,
                slot,
                RawDesc {
                    addr: self.mem.gpa + BIG_RX + u64::from(slot) * u64::from(len),
                    len,
                    flags: F_WRITE,
                    next: 0,
                },
            );
            self.push_avail(0, k, slot);
        }
        let idx = self.avail_idx[0].wrapping_add(n);
        self.publish(0, idx);
    }

    /// Frames received on queue 0 into buffers of `len` bytes that
    /// [`Guest::post_rx_sized`] posted, mergeable-style: each frame's
    /// header (12 bytes) and the frame gathered from `num_buffers` used
    /// buffers, with that count. A frame whose buffers have not all been
    /// used yet, or an entry shorter than a header, ends the list.
    pub fn received_merged(&mut self, len: u32) -> Vec<([u8; 12], Vec<u8>, u16)> {
        let used = self.take_used(0);
        let mut out = Vec::new();
        let mut i = 0;
        while i < used.len() {
            let (id, n) = used[i];
            let at = BIG_RX + u64::from(id) * u64::from(len);
            if u64::from(n) < HDR {
                break;
            }
            let b = self.mem.read(at, n as usize);
            let hdr: [u8; 12] = b[..12].try_into().expect("12 bytes");
            let nb = u16::from_le_bytes([hdr[10], hdr[11]]).max(1);
            let mut frame = b[12..].to_vec();
            for j in 1..usize::from(nb) {
                let Some(&(id, n)) = used.get(i + j) else {
                    return out;
                };
                let at = BIG_RX + u64::from(id) * u64::from(len);
                frame.extend(self.mem.read(at, n as usize));
            }
            out.push((hdr, frame, nb));
            i += usize::from(nb);
        }
        out
    }

    /// Used entries of queue `q` since last read: (id, len).
    pub fn take_used(&mut self, q: usize) -> Vec<(u32, u32)> {
        self.q[q].take_used(&self.mem, &mut self.used_seen[q])
    }

    /// Frames received on queue 0 since last read (header stripped), from
    /// buffers that [`Guest::post_rx`] posted.
    pub fn received(&mut self) -> Vec<Vec<u8>> {
        let used = self.take_used(0);
        used.into_iter()
            .filter(|&(_, len)| u64::from(len) >= HDR)
            .map(|(id, len)| {
                self.mem.read(
                    RX_BUFS + u64::from(id) * BUF + HDR,
                    (u64::from(len) - HDR) as usize,
                )
            })
            .collect()
    }
}
