//! A vhost-user frontend of our own: it speaks the protocol to a port the
//! way QEMU does, shares a memfd as guest memory, and lays out and fills
//! the virtio rings itself, so that tests can make it lie: send malformed
//! messages, put impossible values in the rings, shrink or swap its memory,
//! disconnect half-way.
//!
//! The switch runs in the caller's thread: every request that expects a
//! reply takes the switch to pump ([`EventLoop::poll_events`]) until the reply
//! comes.

use std::fs::File;
use std::io::{IoSlice, Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, FromRawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use rustix::net::{sendmsg, SendAncillaryBuffer, SendAncillaryMessage, SendFlags};

use ring::notify::EventFd;
use vswitch::EventLoop;

/// Request codes used here.
pub mod req {
    /// GET_FEATURES.
    pub const GET_FEATURES: u32 = 1;
    /// SET_FEATURES.
    pub const SET_FEATURES: u32 = 2;
    /// SET_OWNER.
    pub const SET_OWNER: u32 = 3;
    /// SET_MEM_TABLE.
    pub const SET_MEM_TABLE: u32 = 5;
    /// SET_VRING_NUM.
    pub const SET_VRING_NUM: u32 = 8;
    /// SET_VRING_ADDR.
    pub const SET_VRING_ADDR: u32 = 9;
    /// SET_VRING_BASE.
    pub const SET_VRING_BASE: u32 = 10;
    /// GET_VRING_BASE.
    pub const GET_VRING_BASE: u32 = 11;
    /// SET_VRING_KICK.
    pub const SET_VRING_KICK: u32 = 12;
    /// SET_VRING_CALL.
    pub const SET_VRING_CALL: u32 = 13;
    /// GET_PROTOCOL_FEATURES.
    pub const GET_PROTOCOL_FEATURES: u32 = 15;
    /// SET_PROTOCOL_FEATURES.
    pub const SET_PROTOCOL_FEATURES: u32 = 16;
    /// SET_VRING_ENABLE.
    pub const SET_VRING_ENABLE: u32 = 18;
}

/// Header flags: version 1.
pub const VERSION: u32 = 1;
/// Header flags: wants a reply.
pub const NEED_REPLY: u32 = 8;

/// The feature bits this frontend acknowledges: VERSION_1, EVENT_IDX,
/// PROTOCOL_FEATURES.
pub const FEATURES: u64 = 1 << 32 | 1 << 29 | 1 << 30;

/// A memfd shared as guest memory, mapped here too.
pub struct SharedMem {
    /// The memfd.
    pub file: File,
    map: memmap2::MmapRaw,
    /// Its size.
    pub size: u64,
    /// The guest-physical address of its first byte.
    pub gpa: u64,
    /// The "frontend virtual address" of its first byte (what ring
    /// addresses are given as).
    pub uaddr: u64,
}

impl SharedMem {
    /// A memfd of `size` bytes; `seal`: sealed against shrinking and
    /// growing, as QEMU's memfd backend does by default.
    pub fn new(size: u64, seal: bool) -> std::io::Result<SharedMem> {
        // SAFETY: memfd_create with a NUL-terminated literal name.
        let fd = unsafe {
            libc::memfd_create(
                c"fastpath-frontend".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor nothing else owns.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(size)?;
        if seal {
            // SAFETY: fcntl on our own descriptor with an integer argument.
            if unsafe {
                libc::fcntl(
                    fd,
                    libc::F_ADD_SEALS,
                    libc::F_SEAL_SHRINK | libc::F_SEAL_GROW,
                )
            } != 0
            {
                return Err(std::io::Error::last_os_error());
            }
        }
        let map = memmap2::MmapOptions::new()
            .len(size as usize)
            .map_raw(&file)?;
        Ok(SharedMem {
            file,
            map,
            size,
            gpa: 0,
            uaddr: 0x7f00_0000_0000,
        })
    }

    /// Write `b` at offset `off` (ignored where it does not fit).
    pub fn write(&self, off: u64, b: &[u8]) {
        if off
            .checked_add(b.len() as u64)
            .is_some_and(|e| e <= self.size)
        {
            // SAFETY: the range lies inside our own mapping (checked).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    b.as_ptr(),
                    self.map.as_mut_ptr().add(off as usize),
                    b.len(),
                )
            };
        }
    }

    /// Read `n` bytes at `off` (zeros where outside).
    pub fn read(&self, off: u64, n: usize) -> Vec<u8> {
        let mut v = vec![0u8; n];
        if off.checked_add(n as u64).is_some_and(|e| e <= self.size) {
            // SAFETY: the range lies inside our own mapping (checked).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    self.map.as_ptr().add(off as usize),
                    v.as_mut_ptr(),
                    n,
                )
            };
        }
        v
    }

    /// A little-endian u16 at `off`.
    pub fn r16(&self, off: u64) -> u16 {
        let b = self.read(off, 2);
        u16::from_le_bytes([b[0], b[1]])
    }

    /// A little-endian u32 at `off`.
    pub fn r32(&self, off: u64) -> u32 {
        let b = self.read(off, 4);
        u32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }

    /// Write a little-endian u16 at `off`.
    pub fn w16(&self, off: u64, v: u16) {
        self.write(off, &v.to_le_bytes());
    }
}

/// Where one queue's rings lie in the shared memory (offsets).
#[derive(Clone, Copy, Debug)]
pub struct Layout {
    /// Entries.
    pub num: u16,
    /// Descriptor table offset.
    pub desc: u64,
    /// Available ring offset.
    pub avail: u64,
    /// Used ring offset.
    pub used: u64,
}

impl Layout {
    /// Queue `q` of `num` entries, laid out from offset `q * 64 KiB`.
    pub fn standard(q: u64, num: u16) -> Layout {
        let base = q * 0x1_0000;
        Layout {
            num,
            desc: base,
            avail: base + 0x8000,
            used: base + 0xa000,
        }
    }

    /// Offset of descriptor `i`.
    pub fn desc_at(&self, i: u16) -> u64 {
        self.desc + 16 * u64::from(i)
    }
}

/// One descriptor as the frontend writes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawDesc {
    /// Guest-physical address.
    pub addr: u64,
    /// Length.
    pub len: u32,
    /// Flags.
    pub flags: u16,
    /// Next.
    pub next: u16,
}

/// The connection, message by message.
pub struct Wire {
    sock: UnixStream,
}

impl Wire {
    /// Connect to a port's socket.
    pub fn connect(path: &Path) -> std::io::Result<Wire> {
        let sock = UnixStream::connect(path)?;
        sock.set_nonblocking(true)?;
        Ok(Wire { sock })
    }

    /// Send raw bytes with descriptors attached.
    pub fn send_raw(&self, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> std::io::Result<()> {
        let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(8))];
        let mut anc = SendAncillaryBuffer::new(&mut space);
        if !fds.is_empty() && !anc.push(SendAncillaryMessage::ScmRights(fds)) {
            return Err(std::io::Error::other("too many descriptors"));
        }
        let n = sendmsg(
            &self.sock,
            &[IoSlice::new(bytes)],
            &mut anc,
            SendFlags::NOSIGNAL,
        )?;
        if n != bytes.len() {
            return Err(std::io::Error::other("short send"));
        }
        Ok(())
    }

    /// Send a message.
    pub fn send(
        &self,
        code: u32,
        flags: u32,
        payload: &[u8],
        fds: &[BorrowedFd<'_>],
    ) -> std::io::Result<()> {
        let mut m = Vec::with_capacity(12 + payload.len());
        m.extend_from_slice(&code.to_le_bytes());
        m.extend_from_slice(&flags.to_le_bytes());
        m.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        m.extend_from_slice(payload);
        self.send_raw(&m, fds)
    }

    /// Wait (pumping the switch) for a reply's 8-byte value.
    pub fn reply(&mut self, sw: &mut EventLoop) -> Option<u64> {
        let mut buf = Vec::new();
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(2) {
            sw.poll_events();
            let mut b = [0u8; 64];
            match (&self.sock).read(&mut b) {
                Ok(0) => return None,
                Ok(n) => buf.extend_from_slice(&b[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => return None,
            }
            if buf.len() >= 12 {
                let size = u32::from_le_bytes([buf[8], buf[9], buf[10], buf[11]]) as usize;
                if buf.len() >= 12 + size {
                    let mut v = [0u8; 8];
                    let n = size.min(8);
                    v[..n].copy_from_slice(&buf[12..12 + n]);
                    return Some(u64::from_le_bytes(v));
                }
            }
        }
        None
    }

    /// A request with a reply.
    pub fn ask(&mut self, sw: &mut EventLoop, code: u32, payload: &[u8]) -> Option<u64> {
        self.send(code, VERSION, payload, &[]).ok()?;
        self.reply(sw)
    }

    /// Close the write side (the port sees the end of the stream).
    pub fn shutdown(&self) {
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
    }

    /// Whether the port closed the connection (reads end of stream).
    pub fn closed_by_peer(&self) -> bool {
        let mut b = [0u8; 1];
        matches!((&self.sock).read(&mut b), Ok(0))
            || matches!((&self.sock).write(&[]), Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe)
    }
}

/// `VhostUserVringState` payload.
pub fn state(index: u32, num: u32) -> Vec<u8> {
    let mut v = index.to_le_bytes().to_vec();
    v.extend_from_slice(&num.to_le_bytes());
    v
}

/// `VhostUserU64` payload.
pub fn u64p(v: u64) -> Vec<u8> {
    v.to_le_bytes().to_vec()
}

/// `SET_VRING_ADDR` payload (frontend addresses).
pub fn vring_addr(index: u32, desc: u64, used: u64, avail: u64) -> Vec<u8> {
    let mut v = index.to_le_bytes().to_vec();
    v.extend_from_slice(&0u32.to_le_bytes());
    for a in [desc, used, avail, 0u64] {
        v.extend_from_slice(&a.to_le_bytes());
    }
    v
}

/// `SET_MEM_TABLE` payload: (guest-physical, size, frontend address,
/// offset) per region.
pub fn mem_table(regions: &[(u64, u64, u64, u64)]) -> Vec<u8> {
    let mut v = (regions.len() as u32).to_le_bytes().to_vec();
    v.extend_from_slice(&0u32.to_le_bytes());
    for &(gpa, size, ua, off) in regions {
        for a in [gpa, size, ua, off] {
            v.extend_from_slice(&a.to_le_bytes());
        }
    }
    v
}

/// A fresh eventfd.
pub fn eventfd() -> std::io::Result<EventFd> {
    EventFd::new().map_err(std::io::Error::other)
}

/// A well-behaved frontend with one queue pair, whose every value tests can
/// change: the device set up as QEMU sets it up, then rings written by hand.
pub struct TestGuest {
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
}

/// Where transmit buffers start in the shared memory.
pub const TX_BUFS: u64 = 0x2_0000;
/// Where receive buffers start.
pub const RX_BUFS: u64 = 0xa_0000;
/// Bytes per buffer.
pub const BUF: u64 = 2048;
/// Bytes of shared memory (rings of up to 2048 entries, 256 buffers each
/// way).
pub const MEM: u64 = 0x20_0000;

impl TestGuest {
    /// Connect to `path` and set the device up, as QEMU does: features,
    /// memory table, then for each queue size, base, addresses, kick,
    /// call, enable.
    pub fn attach(sw: &mut EventLoop, path: &Path, num: u16) -> std::io::Result<TestGuest> {
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
    ) -> std::io::Result<TestGuest> {
        let mem = SharedMem::new(size, true)?;
        let wire = Wire::connect(path)?;
        let mut g = TestGuest {
            wire,
            mem,
            q,
            kick: [eventfd()?, eventfd()?],
            call: [eventfd()?, eventfd()?],
            avail_idx: [0; 2],
            used_seen: [0; 2],
        };
        let err = |what: &str| std::io::Error::other(format!("no reply to {what}"));
        g.wire
            .ask(sw, req::GET_FEATURES, &[])
            .ok_or_else(|| err("GET_FEATURES"))?;
        g.wire
            .ask(sw, req::GET_PROTOCOL_FEATURES, &[])
            .ok_or_else(|| err("GET_PROTOCOL_FEATURES"))?;
        g.wire
            .send(req::SET_PROTOCOL_FEATURES, VERSION, &u64p(0), &[])?;
        g.wire.send(req::SET_OWNER, VERSION, &[], &[])?;
        g.wire
            .send(req::SET_FEATURES, VERSION, &u64p(FEATURES), &[])?;
        g.set_mem_table(&[(0, size, g.mem.uaddr, 0)], &[g.mem.file.as_fd()])?;
        for i in 0..2u32 {
            g.setup_queue(i)?;
        }
        sw.poll_events();
        Ok(g)
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

    /// Set queue `i` up with its layout.
    pub fn setup_queue(&self, i: u32) -> std::io::Result<()> {
        let l = self.q[i as usize];
        let ua = self.mem.uaddr;
        self.wire.send(
            req::SET_VRING_NUM,
            VERSION,
            &state(i, u32::from(l.num)),
            &[],
        )?;
        self.wire
            .send(req::SET_VRING_BASE, VERSION, &state(i, 0), &[])?;
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
        let at = self.q[q].desc_at(i);
        let mut b = [0u8; 16];
        b[0..8].copy_from_slice(&d.addr.to_le_bytes());
        b[8..12].copy_from_slice(&d.len.to_le_bytes());
        b[12..14].copy_from_slice(&d.flags.to_le_bytes());
        b[14..16].copy_from_slice(&d.next.to_le_bytes());
        self.mem.write(at, &b);
    }

    /// Put `head` in queue `q`'s available ring at the next entry (not
    /// published: see [`TestGuest::publish`]).
    pub fn push_avail(&mut self, q: usize, k: u16, head: u16) {
        let l = self.q[q];
        let slot = self.avail_idx[q].wrapping_add(k) % l.num;
        self.mem.w16(l.avail + 4 + 2 * u64::from(slot), head);
    }

    /// Publish `n` more entries of queue `q` (or any index: it is written
    /// as given) and kick.
    pub fn publish(&mut self, q: usize, idx: u16) {
        self.avail_idx[q] = idx;
        self.mem.w16(self.q[q].avail + 2, idx);
        self.kick[q].signal();
    }

    /// Send one frame (header + frame in one descriptor) on queue 1.
    pub fn send_frame(&mut self, frame: &[u8]) {
        let l = self.q[1];
        let slot = self.avail_idx[1] % l.num;
        let off = TX_BUFS + u64::from(slot) * BUF;
        self.mem.write(off, &[0u8; 12]);
        self.mem.write(off + 12, frame);
        self.put_desc(
            1,
            slot,
            RawDesc {
                addr: self.mem.gpa + off,
                len: 12 + frame.len() as u32,
                flags: 0,
                next: 0,
            },
        );
        self.push_avail(1, 0, slot);
        let idx = self.avail_idx[1].wrapping_add(1);
        self.publish(1, idx);
    }

    /// Post `n` receive buffers on queue 0.
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
                    flags: 2,
                    next: 0,
                },
            );
            self.push_avail(0, k, slot);
        }
        let idx = self.avail_idx[0].wrapping_add(n);
        self.publish(0, idx);
    }

    /// Used entries of queue `q` since last read: (id, len).
    pub fn take_used(&mut self, q: usize) -> Vec<(u32, u32)> {
        let l = self.q[q];
        let idx = self.mem.r16(l.used + 2);
        let mut out = Vec::new();
        while self.used_seen[q] != idx {
            let e = l.used + 4 + 8 * u64::from(self.used_seen[q] % l.num);
            out.push((self.mem.r32(e), self.mem.r32(e + 4)));
            self.used_seen[q] = self.used_seen[q].wrapping_add(1);
        }
        out
    }

    /// Frames received on queue 0 since last read (header stripped).
    pub fn received(&mut self) -> Vec<Vec<u8>> {
        let used = self.take_used(0);
        used.into_iter()
            .filter(|&(_, len)| len >= 12)
            .map(|(id, len)| {
                self.mem
                    .read(RX_BUFS + u64::from(id) * BUF + 12, (len - 12) as usize)
            })
            .collect()
    }
}
