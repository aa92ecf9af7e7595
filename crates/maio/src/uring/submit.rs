//! Submission: the io_uring (with SQPOLL or without), each request's
//! operation and user_data, batching requests until a batch point, keeping
//! a stream socket's sends in order, and the scatter-gather messages that
//! requests point at until they complete.

use std::time::Duration;

use io_uring::{opcode, squeue, types, IoUring};

use super::zerocopy::SEND_ZC_REPORT_USAGE;
use super::{check_disabled, memlock, sys, Config, Result, Ring, Sent, SockId, UringError};

/// A zero-copy send of the caller's buffer.
pub(super) const OP_SEND_ZC: u64 = 1;
/// A copy-mode send (its buffer goes back to the pool).
pub(super) const OP_SEND: u64 = 2;
/// A socket's multishot receive.
pub(super) const OP_RECV: u64 = 3;
/// A zero-copy SENDMSG of a scatter-gather list.
pub(super) const OP_SENDMSG_ZC: u64 = 4;
/// An ordinary send of the caller's buffer (the kernel copies on this route).
pub(super) const OP_SEND_PLAIN: u64 = 5;
/// An ordinary SENDMSG of a scatter-gather list (same reason).
pub(super) const OP_SENDMSG: u64 = 6;
/// Copy-mode datagrams sent as one segmented SENDMSG (UDP GSO).
pub(super) const OP_SENDMSG_GSO: u64 = 8;

/// The user_data of a request: its operation in the top byte, the socket
/// in the next 24 bits, and a buffer index or message id below.
pub(super) fn ud(op: u64, sock: u32, idx: u32) -> u64 {
    (op << 56) | ((sock as u64 & 0xff_ffff) << 32) | idx as u64
}

/// The operation, socket and index of a completion's user_data (see
/// [`ud`]).
pub(super) fn ud_parts(u: u64) -> (u64, u32, u32) {
    let op = u >> 56;
    let sock = ((u >> 32) & 0xff_ffff) as u32;
    let idx = u as u32;
    (op, sock, idx)
}

/// A send waiting its turn on a stream socket.
#[derive(Debug)]
pub(super) enum Pending {
    /// A prepared request (copy mode, a forwarded list).
    Entry(squeue::Entry),
    /// A zero-copy send of the caller's buffer: consecutive ones go out
    /// together as one SENDMSG_ZC.
    Zc { idx: u32, len: u32 },
}

/// Whose buffers a scatter-gather message carries.
#[derive(Clone, Copy)]
pub(super) enum MsgKind {
    /// Received buffers forwarded: back to the receive ring when done.
    Forward,
    /// The caller's buffers (`send_zc`): back to the caller, each with its
    /// own completion.
    User,
    /// Copy-mode datagrams sent segmented: back to the pool, each with its
    /// own completion.
    Datagrams,
}

/// A scatter-gather message whose memory must stay put while the kernel
/// reads it.
pub(super) struct SgMsg {
    pub(super) hdr: libc::msghdr,
    pub(super) iov: Vec<libc::iovec>,
    /// Room for one control message with a u16 (`UDP_SEGMENT`), 8-aligned
    /// as `cmsghdr` wants.
    pub(super) ctrl: [u64; 4],
    /// A segmented send's segment size (0 otherwise).
    pub(super) seg: u32,
}

// SAFETY: the raw pointers in an SgMsg point into its own `iov` and into the
// pool's region; it moves between threads only together with the Ring that
// owns both, and is never read by us after it is built.
unsafe impl Send for SgMsg {}

/// The io_uring itself: a kernel polling thread for submissions (SQPOLL,
/// pinned if asked) or, without one, completions held for our next system
/// call.
pub(super) fn build(cfg: &Config) -> Result<IoUring> {
    let mut b = IoUring::builder();
    if cfg.sqpoll {
        b.setup_sqpoll(cfg.sqpoll_idle_ms);
        if let Some(cpu) = cfg.sqpoll_cpu {
            b.setup_sqpoll_cpu(cpu);
        }
    } else {
        // Completions of requests that finish later (a multishot
        // receive) are posted at our next system call instead of
        // interrupting us.
        b.setup_coop_taskrun();
    }
    b.build(cfg.entries).map_err(|e| {
        if let Some(d) = check_disabled() {
            return d;
        }
        match e.raw_os_error() {
            Some(libc::ENOMEM) => UringError::Memlock {
                bytes: 0,
                limit: memlock(),
            },
            Some(libc::ENOSYS) => UringError::TooOld {
                what: "io_uring",
                needs: "5.1",
                source: e,
            },
            _ => UringError::Sys {
                what: "io_uring_setup",
                source: e,
            },
        }
    })
}

impl Ring {
    /// Queue one request; with the queue full, hand what is queued to the
    /// kernel and reap first.
    pub(super) fn push(&mut self, e: squeue::Entry) -> Result<()> {
        // SAFETY: every entry we build points at pool memory (registered and
        // alive while the ring lives) or at nothing; buffers in flight are
        // marked InFlight so safe code cannot touch or free them.
        if unsafe { self.ring.submission().push(&e) }.is_err() {
            self.enter()?;
            self.reap();
            // SAFETY: as above.
            unsafe { self.ring.submission().push(&e) }.map_err(|_| UringError::Busy)?;
        }
        Ok(())
    }

    /// Whether requests are handed to the kernel in batches (see
    /// [`Config::batch_submit`]).
    pub fn batch_submit(&self) -> bool {
        self.batch_submit
    }

    /// A request was queued: hand it over now, unless requests are batched
    /// (then the next batch point does, see [`Config::batch_submit`]).
    pub(super) fn kick(&mut self) -> Result<()> {
        if self.batch_submit {
            return Ok(());
        }
        self.enter()
    }

    /// Hand queued submissions to the kernel. With SQPOLL this is a memory
    /// write unless the polling thread went to sleep; without, one
    /// `io_uring_enter` for everything queued (datagrams waiting to be sent
    /// segmented included).
    pub fn submit(&mut self) -> Result<()> {
        self.flush_runs()?;
        self.enter()
    }

    pub(super) fn enter(&mut self) -> Result<()> {
        if self.sqpoll {
            self.ring.submission().sync();
            if !self.ring.submission().need_wakeup() {
                return Ok(());
            }
        } else if self.ring.submission().is_empty() {
            return Ok(());
        }
        self.enters += 1;
        self.ring.submit().map_err(sys("io_uring_enter"))?;
        Ok(())
    }

    /// A batch point: with [`Config::batch_submit`], hand everything queued
    /// to the kernel in one system call.
    pub(super) fn flush_batch(&mut self) {
        if !self.batch_submit {
            return;
        }
        let _ = self.flush_runs();
        if !self.ring.submission().is_empty() {
            let _ = self.enter();
        }
    }

    /// Sends on one stream socket must reach it in order, but io_uring
    /// lets a later send pass an earlier one that had to wait for socket
    /// space. So a socket has one batch in flight at a time: the caller's
    /// zero-copy buffers as one SENDMSG_ZC, or prepared requests as one
    /// linked chain (IOSQE_IO_LINK: each starts when the previous finished);
    /// the next batch goes when this one has completed.
    pub(super) fn flush_sends(&mut self, s: SockId) -> Result<()> {
        let sock = self.sock(s)?;
        if !sock.stream {
            // Datagrams carry their own boundaries: no ordering to keep.
            let all: Vec<Pending> = sock.queued.drain(..).collect();
            for p in all {
                if let Pending::Entry(e) = p {
                    self.push(e)?;
                }
            }
            return Ok(());
        }
        if sock.chain > 0 || sock.queued.is_empty() {
            return Ok(());
        }
        // Zero-copy sends of the caller's buffers at the head of the queue
        // go out together as one message, as the paper's kernel thread takes
        // every buffer posted to the ring at once.
        if matches!(sock.queued.front(), Some(Pending::Zc { .. })) {
            let mut items = Vec::new();
            while items.len() < 64 {
                match sock.queued.front() {
                    Some(&Pending::Zc { idx, len }) => {
                        items.push((idx, len));
                        sock.queued.pop_front();
                    }
                    _ => break,
                }
            }
            sock.chain = 1;
            let e = self.sg_message(s, &items, MsgKind::User)?;
            return self.push_chain(vec![e]);
        }
        let mut chain: Vec<squeue::Entry> = Vec::new();
        while chain.len() < 32 && matches!(sock.queued.front(), Some(Pending::Entry(_))) {
            if let Some(Pending::Entry(e)) = sock.queued.pop_front() {
                chain.push(e);
            }
        }
        sock.chain = chain.len() as u32;
        let last = chain.len().saturating_sub(1);
        let chain: Vec<squeue::Entry> = chain
            .into_iter()
            .enumerate()
            .map(|(i, e)| {
                if i < last {
                    e.flags(squeue::Flags::IO_LINK)
                } else {
                    e
                }
            })
            .collect();
        self.push_chain(chain)
    }

    /// Publish entries in one step: with SQPOLL the kernel thread could
    /// otherwise take the first half of a chain alone and break the link.
    pub(super) fn push_chain(&mut self, chain: Vec<squeue::Entry>) -> Result<()> {
        if chain.is_empty() {
            return Ok(());
        }
        let free = {
            let sq = self.ring.submission();
            sq.capacity() - sq.len()
        };
        if free < chain.len() {
            self.enter()?;
            while {
                let sq = self.ring.submission();
                sq.capacity() - sq.len() < chain.len()
            } {
                self.wait(Duration::from_micros(100));
                self.ring.submission().sync();
            }
        }
        // SAFETY: as in `push`: the entries point at registered pool memory
        // whose buffers are marked InFlight, and at messages kept in `msgs`
        // until their completion.
        unsafe { self.ring.submission().push_multiple(&chain) }.map_err(|_| UringError::Busy)?;
        Ok(())
    }

    pub(super) fn send_done(&mut self, sock: u32) {
        if let Some(s) = self.socks.get_mut(sock as usize) {
            if s.stream {
                s.chain = s.chain.saturating_sub(1);
            }
        }
    }

    /// Build the SENDMSG_ZC (or, where the kernel copies anyway, the
    /// SENDMSG) carrying pool buffers `items` (index, length) to socket `s`;
    /// the message stays in `msgs` until the kernel is done with it.
    pub(super) fn sg_message(
        &mut self,
        s: SockId,
        items: &[(u32, u32)],
        kind: MsgKind,
    ) -> Result<squeue::Entry> {
        let zc = self.want_zc(s)?;
        let m = self.sg_msg(items);
        let id = self.keep_msg(m, items, kind);
        let m = &self.msgs[&id].0;
        let e = if zc {
            opcode::SendMsgZc::new(types::Fixed(s.0), &m.hdr)
                .flags(libc::MSG_WAITALL as u32)
                .ioprio(SEND_ZC_REPORT_USAGE)
                .build()
                .user_data(ud(OP_SENDMSG_ZC, s.0, id))
        } else {
            opcode::SendMsg::new(types::Fixed(s.0), &m.hdr)
                .flags(libc::MSG_WAITALL as u32)
                .build()
                .user_data(ud(OP_SENDMSG, s.0, id))
        };
        Ok(e)
    }

    /// A message (no name, no control data yet) whose iovecs are pool
    /// buffers `items` (index, length).
    pub(super) fn sg_msg(&self, items: &[(u32, u32)]) -> Box<SgMsg> {
        let iov: Vec<libc::iovec> = items
            .iter()
            .map(|&(idx, len)| libc::iovec {
                iov_base: self.addr_of(idx) as *mut _,
                iov_len: len as usize,
            })
            .collect();
        let mut m = Box::new(SgMsg {
            // SAFETY: msghdr is plain data (integers and raw pointers), for
            // which all-zero is a valid value: no name, no control data.
            hdr: unsafe { std::mem::zeroed() },
            iov,
            ctrl: [0; 4],
            seg: 0,
        });
        m.hdr.msg_iov = m.iov.as_mut_ptr();
        m.hdr.msg_iovlen = m.iov.len();
        m
    }

    /// Keep message `m` (carrying buffers `items`) until its completion;
    /// returns its id.
    pub(super) fn keep_msg(&mut self, m: Box<SgMsg>, items: &[(u32, u32)], kind: MsgKind) -> u32 {
        let id = self.next_msg;
        self.next_msg = self.next_msg.wrapping_add(1);
        let idxs = items.iter().map(|x| x.0).collect();
        self.msgs.insert(id, (m, idxs, 0, kind));
        id
    }

    pub(super) fn finish_sg(&mut self, sock: u32, id: u32, res: Option<i32>, copied: bool) {
        let Some((m, idxs, first, kind)) = self.msgs.remove(&id) else {
            return;
        };
        let result = res.unwrap_or(first);
        match kind {
            MsgKind::Forward => {
                self.in_flight -= 1;
                for idx in idxs {
                    let addr = self.addr_of(idx);
                    if let Some(bid) = self.bufring.bids.iter().position(|&x| x == idx) {
                        // Still InFlight: straight back into the kernel's receive ring.
                        self.bufring
                            .push(bid as u16, addr, self.pool.buf_size() as u32);
                    }
                }
                self.publish_rx();
                self.done.push_back(Sent {
                    sock: SockId(sock),
                    buf: None,
                    result,
                    copied,
                });
            }
            MsgKind::Datagrams => {
                // One completion per datagram, each with its length.
                let total: usize = m.iov.iter().map(|v| v.iov_len).sum();
                let seg = m.seg.max(1) as usize;
                for k in 0..total.div_ceil(seg) {
                    let r = if result < 0 {
                        result
                    } else {
                        seg.min(total - k * seg) as i32
                    };
                    self.copy_done(sock, r);
                }
                for idx in idxs {
                    self.release_sent(idx);
                }
            }
            MsgKind::User => {
                // One completion per buffer, as if each had gone alone
                // (MSG_WAITALL: all of the message went, or it failed).
                for (idx, v) in idxs.into_iter().zip(&m.iov) {
                    let r = if result < 0 { result } else { v.iov_len as i32 };
                    self.finish_send(sock, idx, r, copied);
                }
            }
        }
    }
}
