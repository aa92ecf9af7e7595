//! Copy mode (the paper's standard mode, for small messages): bytes copied
//! into pool buffers and sent with ordinary sends, the buffers back to the
//! pool on completion; and, with batched submission, copy-mode datagrams of
//! one size for one UDP socket gathered into a run sent as one segmented
//! SENDMSG (UDP GSO).

use io_uring::{opcode, squeue, types};

use super::submit::{ud, MsgKind, Pending, OP_SEND, OP_SENDMSG_GSO};
use super::{Result, Ring, Sent, SockId};
use crate::{Buf, State};

/// Most datagrams in one segmented send (the kernel's `UDP_MAX_SEGMENTS`:
/// 64 in older kernels, more in newer ones; 64 works on all).
pub const GSO_MAX_SEGMENTS: usize = 64;
/// Most payload bytes in one segmented send (an IPv4 datagram's limit,
/// less headers).
pub(super) const GSO_MAX_BYTES: u32 = 65_000;

/// Copy-mode datagrams for one segmented send, copied end to end into pool
/// buffers (the kernel reads a few large pieces, not one per datagram):
/// all of the first one's length but the last, which may be shorter.
#[derive(Debug, Default)]
pub(super) struct Run {
    /// Pool buffers (index, bytes used).
    pub(super) bufs: Vec<(u32, u32)>,
    /// The segment size: the first datagram's length.
    pub(super) seg: u32,
    pub(super) datagrams: u32,
    pub(super) bytes: u32,
    /// A datagram shorter than `seg` came: it must be the last.
    pub(super) closed: bool,
}

impl Ring {
    /// Copy-mode send (the paper's standard mode, for small messages): the
    /// bytes are copied into pool buffers and sent; those buffers go back to
    /// the pool on completion. On a datagram socket each buffer's worth is a
    /// datagram, and an empty message an empty datagram.
    pub fn send_copy(&mut self, s: SockId, data: &[u8]) -> Result<()> {
        let sock = self.sock(s)?;
        let gso = sock.gso;
        // On a datagram socket an empty message is an empty datagram (which
        // `chunks` would not yield); on a stream it is nothing.
        let empty_datagram = (data.is_empty() && !sock.stream).then_some(data);
        for chunk in data.chunks(self.pool.buf_size()).chain(empty_datagram) {
            if gso && !chunk.is_empty() {
                self.add_to_run(s, chunk)?;
                continue;
            }
            if gso {
                // An empty datagram cannot be a segment: it goes alone,
                // after the run before it.
                self.send_run(s)?;
            }
            let idx = self.copy_out(chunk)?;
            let e = self.plain_send(s.0, idx, chunk.len() as u32);
            self.sock(s)?.queued.push_back(Pending::Entry(e));
        }
        if gso && !data.is_empty() {
            // Held for the batch point.
            return Ok(());
        }
        self.flush_sends(s)?;
        self.kick()
    }

    /// A pool buffer holding a copy of `data`, handed to the kernel
    /// (`InFlight`, counted in flight); returns its index.
    pub(super) fn copy_out(&mut self, data: &[u8]) -> Result<u32> {
        let mut b = self.handle.alloc()?;
        self.pool.data_mut(&mut b)[..data.len()].copy_from_slice(data);
        self.lend(b)
    }

    /// Hand pool buffer `b` to the kernel: `InFlight`, counted in flight,
    /// known by its index until its completion.
    pub(super) fn lend(&mut self, b: Buf) -> Result<u32> {
        self.pool.transition(&b, State::User, State::InFlight)?;
        self.in_flight += 1;
        Ok(b.into_raw())
    }

    /// An ordinary send of `len` bytes of pool buffer `idx`, which goes back
    /// to the pool on completion.
    pub(super) fn plain_send(&self, sock: u32, idx: u32, len: u32) -> squeue::Entry {
        opcode::Send::new(types::Fixed(sock), self.addr_of(idx) as *const u8, len)
            .flags(libc::MSG_WAITALL)
            .build()
            .user_data(ud(OP_SEND, sock, idx))
    }

    /// A copy-mode send of pool buffer `idx` finished: the buffer goes back
    /// to the pool, the caller gets a completion without it.
    pub(super) fn free_sent(&mut self, sock: u32, idx: u32, result: i32) {
        self.release_sent(idx);
        self.copy_done(sock, result);
    }

    /// A copy-mode send's completion (its buffer went back to the pool).
    pub(super) fn copy_done(&mut self, sock: u32, result: i32) {
        self.done.push_back(Sent {
            sock: SockId(sock),
            buf: None,
            result,
            copied: true,
        });
    }

    /// The kernel is done with copy-mode buffer `idx`: back to the pool.
    pub(super) fn release_sent(&mut self, idx: u32) {
        // SAFETY: idx came from into_raw of a buffer we sent, taken back
        // exactly once (here, on its completion).
        if let Ok(b) = unsafe { self.pool.from_raw(idx) } {
            let _ = self.pool.transition(&b, State::InFlight, State::User);
            let _ = self.handle.free(b);
        }
        self.in_flight -= 1;
    }

    /// Copy a datagram (not empty, at most a buffer) onto the end of socket
    /// `s`'s run, sending the run first if it cannot join it (longer than
    /// the first, after a shorter one, or the run is full).
    pub(super) fn add_to_run(&mut self, s: SockId, data: &[u8]) -> Result<()> {
        let len = data.len() as u32;
        let r = &self.sock(s)?.run;
        if r.datagrams > 0
            && (len > r.seg
                || r.closed
                || r.datagrams as usize >= GSO_MAX_SEGMENTS
                || r.bytes + len > GSO_MAX_BYTES)
        {
            self.send_run(s)?;
        }
        let bs = self.pool.buf_size() as u32;
        let (idx, at) = match self.sock(s)?.run.bufs.last() {
            Some(&(idx, used)) if used + len <= bs => (idx, used),
            _ => {
                let b = self.handle.alloc()?;
                let idx = self.lend(b)?;
                self.sock(s)?.run.bufs.push((idx, 0));
                (idx, 0)
            }
        };
        // SAFETY: `idx` is a pool buffer of this run, InFlight but not yet
        // handed to the kernel (the run's send is not queued), so nothing
        // else reads or writes it; at + len <= buf_size keeps the copy
        // inside it.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                (self.addr_of(idx) as *mut u8).add(at as usize),
                data.len(),
            );
        }
        let r = &mut self.sock(s)?.run;
        if let Some(last) = r.bufs.last_mut() {
            last.1 += len;
        }
        if r.datagrams == 0 {
            r.seg = len;
        } else if len < r.seg {
            r.closed = true;
        }
        r.datagrams += 1;
        r.bytes += len;
        Ok(())
    }

    /// Send every socket's waiting datagrams (a batch point).
    pub(super) fn flush_runs(&mut self) -> Result<()> {
        if !self.udp_gso {
            return Ok(());
        }
        for i in 0..self.socks.len() {
            if self.socks[i].run.datagrams > 0 {
                self.send_run(SockId(i as u32))?;
            }
        }
        Ok(())
    }

    /// Queue socket `s`'s run: one datagram as an ordinary send, more as one
    /// SENDMSG whose `UDP_SEGMENT` is the first datagram's length.
    pub(super) fn send_run(&mut self, s: SockId) -> Result<()> {
        let run = std::mem::take(&mut self.sock(s)?.run);
        let e = match (run.datagrams, &run.bufs[..]) {
            (0, _) | (_, []) => return Ok(()),
            (1, &[(idx, len)]) => self.plain_send(s.0, idx, len),
            _ => {
                let mut m = self.sg_msg(&run.bufs);
                m.seg = run.seg;
                // At least two datagrams within GSO_MAX_BYTES: seg < 2^16.
                let seg = run.seg as u16;
                // SAFETY: `ctrl` is 32 bytes, 8-aligned, inside the boxed
                // message (which stays put until the completion), and
                // CMSG_SPACE(2) = 24 of them hold one cmsghdr and its u16;
                // msg_control/msg_controllen describe exactly that space, so
                // CMSG_FIRSTHDR returns `ctrl`'s start and CMSG_DATA a
                // pointer inside it.
                unsafe {
                    m.hdr.msg_control = m.ctrl.as_mut_ptr().cast();
                    m.hdr.msg_controllen = libc::CMSG_SPACE(2) as usize;
                    let c = libc::CMSG_FIRSTHDR(&m.hdr);
                    (*c).cmsg_level = libc::SOL_UDP;
                    // UDP_SEGMENT's data is the segment size as a u16.
                    (*c).cmsg_type = libc::UDP_SEGMENT;
                    (*c).cmsg_len = libc::CMSG_LEN(2) as usize;
                    libc::CMSG_DATA(c).cast::<u16>().write_unaligned(seg);
                }
                let id = self.keep_msg(m, &run.bufs, MsgKind::Datagrams);
                self.gso_sends += 1;
                self.gso_datagrams += run.datagrams as u64;
                opcode::SendMsg::new(types::Fixed(s.0), &self.msgs[&id].0.hdr)
                    .build()
                    .user_data(ud(OP_SENDMSG_GSO, s.0, id))
            }
        };
        self.push(e)
    }

    /// A segmented send finished. If the kernel refused to segment it
    /// (rather than failing the send), its datagrams go again one by one,
    /// and so do the socket's later ones.
    pub(super) fn finish_gso(&mut self, sock: u32, id: u32, res: i32) {
        let refused = [libc::EIO, libc::EINVAL, libc::EMSGSIZE, libc::EOPNOTSUPP];
        if res < 0 && refused.contains(&-res) {
            if let Some((m, idxs, _, _)) = self.msgs.remove(&id) {
                self.gso_refused += 1;
                if let Some(s) = self.socks.get_mut(sock as usize) {
                    s.gso = false;
                }
                // The run's bytes, cut at its segment size, each datagram
                // copied into a buffer of its own and sent alone.
                let seg = m.seg.max(1) as usize;
                let mut bytes = Vec::new();
                for v in &m.iov {
                    // SAFETY: each iovec is a run buffer's used part, inside
                    // the pool region, InFlight and no longer read by the
                    // kernel (its send completed).
                    bytes.extend_from_slice(unsafe {
                        std::slice::from_raw_parts(v.iov_base as *const u8, v.iov_len)
                    });
                }
                for idx in idxs {
                    self.release_sent(idx);
                }
                for d in bytes.chunks(seg) {
                    match self.copy_out(d) {
                        Ok(idx) => {
                            let e = self.plain_send(sock, idx, d.len() as u32);
                            if self.push(e).is_err() {
                                self.free_sent(sock, idx, -libc::EBUSY);
                            }
                        }
                        Err(_) => self.copy_done(sock, -libc::ENOBUFS),
                    }
                }
                return;
            }
        }
        self.finish_sg(sock, id, Some(res), true);
    }
}
