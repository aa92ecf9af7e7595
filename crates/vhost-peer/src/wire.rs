//! The vhost-user connection, message by message: a 12-byte header (request
//! code, flags, payload size, little-endian), the payload, and descriptors
//! as `SCM_RIGHTS`. Everything is sent as given, so a caller can send what
//! no QEMU would.

use std::io::{IoSlice, Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::net::{
    recvmsg, sendmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use std::os::fd::OwnedFd;

/// Request codes used here (the vhost-user specification's numbers).
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
    /// GET_QUEUE_NUM.
    pub const GET_QUEUE_NUM: u32 = 17;
    /// SET_VRING_ENABLE.
    pub const SET_VRING_ENABLE: u32 = 18;
    /// GET_INFLIGHT_FD.
    pub const GET_INFLIGHT_FD: u32 = 31;
    /// SET_INFLIGHT_FD.
    pub const SET_INFLIGHT_FD: u32 = 32;
}

/// Protocol feature `MQ` (bit 0): the backend answers `GET_QUEUE_NUM`.
pub const PROTOCOL_F_MQ: u64 = 1;
/// Protocol feature `INFLIGHT_SHMFD` (bit 12).
pub const PROTOCOL_F_INFLIGHT_SHMFD: u64 = 1 << 12;

/// Header flags: version 1.
pub const VERSION: u32 = 1;
/// Header flags: wants a reply.
pub const NEED_REPLY: u32 = 8;

/// The feature bits this frontend acknowledges: VERSION_1, EVENT_IDX,
/// PROTOCOL_FEATURES.
pub const FEATURES: u64 = 1 << 32 | 1 << 29 | 1 << 30;

/// [`FEATURES`] and the offloads a Linux guest takes: `CSUM` (0),
/// `GUEST_CSUM` (1), `GUEST_TSO4/6` (7, 8), `HOST_TSO4/6` (11, 12) and
/// `MRG_RXBUF` (15).
pub const OFFLOAD_FEATURES: u64 =
    FEATURES | 1 | 1 << 1 | 1 << 7 | 1 << 8 | 1 << 11 | 1 << 12 | 1 << 15;

/// How long a request waits for its reply: long enough for a backend on a
/// loaded machine, short enough that a backend that never answers fails a
/// test quickly.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(2);

/// The connection, message by message.
pub struct Wire {
    sock: UnixStream,
}

impl Wire {
    /// Connect to a backend's socket (non-blocking: a backend that stops
    /// reading makes sends fail rather than hang).
    pub fn connect(path: &Path) -> std::io::Result<Wire> {
        let sock = UnixStream::connect(path)?;
        sock.set_nonblocking(true)?;
        Ok(Wire { sock })
    }

    /// The socket, e.g. to wait on it.
    pub fn socket(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }

    /// Send raw bytes with descriptors attached (at most 8).
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

    /// Send a message: header with `code` and `flags`, then `payload`.
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

    /// Wait up to `timeout` for a reply and return its first 8 payload
    /// bytes as a number, for a backend that runs in a thread or process
    /// of its own (this thread sleeps in `poll(2)`). `None`: no reply in
    /// time, or the backend closed the connection.
    pub fn await_reply(&mut self, timeout: Duration) -> Option<u64> {
        self.reply_inner(timeout, None)
    }

    /// [`Wire::await_reply`] for a backend driven in this thread: `pump`
    /// runs it (e.g. the switch's `poll_events`) between reads.
    pub fn await_reply_pumped(&mut self, timeout: Duration, pump: &mut dyn FnMut()) -> Option<u64> {
        self.reply_inner(timeout, Some(pump))
    }

    fn reply_inner(
        &mut self,
        timeout: Duration,
        mut pump: Option<&mut dyn FnMut()>,
    ) -> Option<u64> {
        let mut buf = Vec::new();
        let t = Instant::now();
        while t.elapsed() < timeout {
            match pump.as_mut() {
                Some(p) => p(),
                None => {
                    let left = timeout.saturating_sub(t.elapsed());
                    let ts = Timespec {
                        tv_sec: left.as_secs() as i64,
                        tv_nsec: i64::from(left.subsec_nanos()),
                    };
                    let mut fds = [PollFd::new(&self.sock, PollFlags::IN)];
                    // An interrupted or failed poll just loops: the read
                    // below decides, and the deadline bounds the loop.
                    let _ = poll(&mut fds, Some(&ts));
                }
            }
            let mut b = [0u8; 64];
            match (&self.sock).read(&mut b) {
                Ok(0) => return None,
                Ok(n) => buf.extend_from_slice(&b[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
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

    /// Wait up to `timeout` for a whole reply and return its payload and
    /// the first descriptor that came with it (`pump`, if given, runs a
    /// backend driven in this thread between reads). `None`: no reply in
    /// time, or the connection ended.
    pub fn await_reply_fd(
        &mut self,
        timeout: Duration,
        mut pump: Option<&mut dyn FnMut()>,
    ) -> Option<(Vec<u8>, Option<OwnedFd>)> {
        let mut buf = Vec::new();
        let mut fd = None;
        let t = Instant::now();
        while t.elapsed() < timeout {
            match pump.as_mut() {
                Some(p) => p(),
                None => {
                    let mut fds = [PollFd::new(&self.sock, PollFlags::IN)];
                    let ts = Timespec {
                        tv_sec: 0,
                        tv_nsec: 10_000_000,
                    };
                    let _ = poll(&mut fds, Some(&ts));
                }
            }
            let mut b = [0u8; 256];
            let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(8))];
            let mut anc = RecvAncillaryBuffer::new(&mut space);
            let mut iov = [std::io::IoSliceMut::new(&mut b)];
            match recvmsg(&self.sock, &mut iov, &mut anc, RecvFlags::DONTWAIT) {
                Ok(r) if r.bytes == 0 => return None,
                Ok(r) => {
                    for m in anc.drain() {
                        if let RecvAncillaryMessage::ScmRights(fds) = m {
                            for f in fds {
                                fd.get_or_insert(f);
                            }
                        }
                    }
                    buf.extend_from_slice(&b[..r.bytes]);
                }
                Err(rustix::io::Errno::AGAIN) | Err(rustix::io::Errno::INTR) => {}
                Err(_) => return None,
            }
            if buf.len() >= 12 {
                let size = u32::from_le_bytes([buf[8], buf[9], buf[10], buf[11]]) as usize;
                if buf.len() >= 12 + size {
                    return Some((buf[12..12 + size].to_vec(), fd));
                }
            }
        }
        None
    }

    /// A request that expects a reply, for a backend running elsewhere:
    /// send, then [`Wire::await_reply`].
    pub fn request(&mut self, code: u32, payload: &[u8], timeout: Duration) -> Option<u64> {
        self.send(code, VERSION, payload, &[]).ok()?;
        self.await_reply(timeout)
    }

    /// A request that expects a reply, for a backend driven in this thread:
    /// send, then [`Wire::await_reply_pumped`].
    pub fn request_pumped(
        &mut self,
        code: u32,
        payload: &[u8],
        timeout: Duration,
        pump: &mut dyn FnMut(),
    ) -> Option<u64> {
        self.send(code, VERSION, payload, &[]).ok()?;
        self.await_reply_pumped(timeout, pump)
    }

    /// Close both directions (the backend sees the end of the stream).
    pub fn shutdown(&self) {
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
    }

    /// Whether the backend closed the connection (reads end of stream).
    pub fn closed_by_peer(&self) -> bool {
        let mut b = [0u8; 1];
        matches!((&self.sock).read(&mut b), Ok(0))
            || matches!((&self.sock).write(&[]), Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe)
    }
}

/// `VhostUserInflight` payload (24 bytes: two u64, two u16, padding).
pub fn inflight(mmap_size: u64, mmap_offset: u64, num_queues: u16, queue_size: u16) -> Vec<u8> {
    let mut v = Vec::with_capacity(24);
    v.extend_from_slice(&mmap_size.to_le_bytes());
    v.extend_from_slice(&mmap_offset.to_le_bytes());
    v.extend_from_slice(&num_queues.to_le_bytes());
    v.extend_from_slice(&queue_size.to_le_bytes());
    v.resize(24, 0);
    v
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_are_laid_out_as_the_specification_says() {
        assert_eq!(state(1, 256), [1, 0, 0, 0, 0, 1, 0, 0]);
        let a = vring_addr(1, 0x10, 0x20, 0x30);
        assert_eq!(a.len(), 40);
        assert_eq!(a[8], 0x10);
        assert_eq!(a[16], 0x20);
        assert_eq!(a[24], 0x30);
        let t = mem_table(&[(0, 0x1000, 0x7f00, 0)]);
        assert_eq!(t.len(), 8 + 32);
        assert_eq!(t[0], 1);
    }

    #[test]
    fn a_reply_is_read_from_a_backend_in_another_thread() {
        let (a, b) = UnixStream::pair().expect("pair");
        a.set_nonblocking(true).expect("nonblocking");
        let mut w = Wire { sock: a };
        let t = std::thread::spawn(move || {
            let mut m = [0u8; 12];
            (&b).read_exact(&mut m).expect("request");
            let mut r = m[..4].to_vec();
            r.extend_from_slice(&(VERSION | 4).to_le_bytes());
            r.extend_from_slice(&8u32.to_le_bytes());
            r.extend_from_slice(&FEATURES.to_le_bytes());
            (&b).write_all(&r).expect("reply");
            b
        });
        assert_eq!(
            w.request(req::GET_FEATURES, &[], REPLY_TIMEOUT),
            Some(FEATURES)
        );
        drop(t.join().expect("backend"));
        assert_eq!(w.await_reply(Duration::from_millis(50)), None);
    }
}
