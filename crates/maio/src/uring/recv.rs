//! Receive buffers: pool buffers lent to the kernel in a provided-buffer
//! ring, one multishot (bundled where the kernel can) receive per socket,
//! the scatter-gather lists of received buffers handed to the caller, and
//! their way back: recycled into the ring, or forwarded zero-copy and
//! returned when the kernel is done.

use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

use io_uring::{cqueue, opcode, types};
use memmap2::MmapMut;

use super::submit::{ud, MsgKind, Pending, OP_RECV};
use super::{Result, Ring, RxBuf, SockId, UringError};
use crate::{Buf, State};

/// The buffer group of the provided-buffer ring.
pub(super) const BGID: u16 = 7;

/// The provided-buffer ring: entries of {addr, len, bid}; the tail is the
/// last 16 bits of entry 0.
pub(super) struct BufRing {
    pub(super) mem: MmapMut,
    pub(super) mask: u16,
    pub(super) tail: u16,
    pub(super) head: u16,
    /// bid -> pool index
    pub(super) bids: Vec<u32>,
}

impl BufRing {
    pub(super) fn push(&mut self, bid: u16, addr: u64, len: u32) {
        let at = (self.tail & self.mask) as usize * 16;
        let e = &mut self.mem[at..at + 16];
        e[0..8].copy_from_slice(&addr.to_ne_bytes());
        e[8..12].copy_from_slice(&len.to_ne_bytes());
        e[12..14].copy_from_slice(&bid.to_ne_bytes());
        self.tail = self.tail.wrapping_add(1);
    }

    pub(super) fn publish(&mut self) {
        // SAFETY: offset 14 of entry 0 is the ring tail the kernel reads; it
        // is 2-byte aligned inside our page-aligned mapping.
        let t = unsafe { &*(self.mem.as_ptr().add(14) as *const AtomicU16) };
        t.store(self.tail, Ordering::Release);
    }

    pub(super) fn bid_at(&self, pos: u16) -> u16 {
        let at = (pos & self.mask) as usize * 16;
        u16::from_ne_bytes([self.mem[at + 12], self.mem[at + 13]])
    }
}

impl Ring {
    pub(super) fn arm_recv(&mut self, s: SockId) -> Result<()> {
        let sock = self.sock(s)?;
        if sock.recv_armed || sock.starved || sock.eof || sock.error.is_some() {
            return Ok(());
        }
        sock.recv_armed = true;
        let e = if self.bundles {
            opcode::RecvMultiBundle::new(types::Fixed(s.0), BGID).build()
        } else {
            opcode::RecvMulti::new(types::Fixed(s.0), BGID).build()
        };
        self.push(e.user_data(ud(OP_RECV, s.0, 0)))?;
        self.kick()
    }

    pub(super) fn on_recv(&mut self, sock: u32, res: i32, flags: u32) {
        let more = cqueue::more(flags);
        let bs = self.pool.buf_size();
        if res > 0 {
            let Some(bid) = cqueue::buffer_select(flags) else {
                return;
            };
            // The kernel consumes ring entries in order: this CQE's buffers
            // start at our head (a bundle spans several).
            debug_assert_eq!(self.bufring.bid_at(self.bufring.head), bid);
            let mut left = res as usize;
            while left > 0 {
                let b = self.bufring.bid_at(self.bufring.head);
                self.bufring.head = self.bufring.head.wrapping_add(1);
                let idx = self.bufring.bids[b as usize];
                let len = left.min(bs);
                left -= len;
                // SAFETY: `idx` was given up with into_raw when its buffer
                // went into the receive ring; this bundle entry is its one
                // return from the kernel, and the token is given up again
                // at once (the socket's rx queue holds the index).
                if let Ok(buf) = unsafe { self.pool.from_raw(idx) } {
                    let _ = self.pool.transition(&buf, State::InFlight, State::Received);
                    let _ = buf.into_raw();
                }
                if let Some(s) = self.socks.get_mut(sock as usize) {
                    s.rx.push_back((idx, len));
                }
            }
        }
        // Our head is the kernel's once this completion is taken: entries
        // between it and the tail were given back since the kernel found
        // the ring empty (those sends may have been reaped just before this
        // completion, their publish_rx already done).
        let ring_empty = self.bufring.head == self.bufring.tail;
        let Some(s) = self.socks.get_mut(sock as usize) else {
            return;
        };
        if res == 0 {
            s.eof = true;
        } else if res == -libc::ENOBUFS {
            // Starved only while nothing came back: otherwise nothing would
            // ever call publish_rx again and the receive would stay off.
            s.starved = ring_empty;
        } else if res < 0 {
            if res == -libc::EINVAL && self.bundles {
                // No bundles on this kernel: plain multishot instead.
                self.bundles = false;
            } else {
                s.error = Some(-res);
            }
        }
        if !more {
            s.recv_armed = false;
        }
    }

    /// Collect up to `max` received buffers of socket `s` (a scatter-gather
    /// list). Returns 0 with nothing waiting; see [`Ring::eof`].
    pub fn recv_sg(&mut self, s: SockId, max: usize, out: &mut Vec<RxBuf>) -> Result<usize> {
        self.arm_recv(s)?;
        self.flush_batch();
        self.reap();
        if let Some(e) = self.sock(s)?.error {
            return Err(UringError::Sys {
                what: "receive",
                source: std::io::Error::from_raw_os_error(e),
            });
        }
        let mut n = 0;
        while n < max {
            let Some((idx, len)) = self.sock(s)?.rx.pop_front() else {
                break;
            };
            // SAFETY: idx was recorded once, when the kernel filled it.
            let buf = unsafe { self.pool.from_raw(idx) }?;
            out.push(RxBuf { buf, len });
            n += 1;
        }
        if n == 0 && !self.sock(s)?.recv_armed {
            self.arm_recv(s)?;
        }
        Ok(n)
    }

    /// Like [`Ring::recv_sg`], waiting up to `timeout` for data.
    pub fn recv_sg_wait(
        &mut self,
        s: SockId,
        max: usize,
        out: &mut Vec<RxBuf>,
        timeout: Duration,
    ) -> Result<usize> {
        let end = Instant::now() + timeout;
        loop {
            let n = self.recv_sg(s, max, out)?;
            if n > 0 || self.eof(s) || Instant::now() >= end {
                return Ok(n);
            }
            self.wait(Duration::from_millis(1));
        }
    }

    /// The peer closed the connection and everything before it was taken.
    pub fn eof(&self, s: SockId) -> bool {
        self.socks
            .get(s.0 as usize)
            .is_some_and(|x| x.eof && x.rx.is_empty())
    }

    /// Give a received buffer back: it returns to the kernel's receive ring.
    pub fn recycle(&mut self, b: RxBuf) -> Result<()> {
        self.pool
            .transition(&b.buf, State::Received, State::InFlight)?;
        let idx = b.buf.into_raw();
        let bid = self
            .bufring
            .bids
            .iter()
            .position(|&x| x == idx)
            .ok_or_else(|| crate::Error::Foreign(format!("index {idx} (not a receive buffer)")))?;
        let addr = self.addr_of(idx);
        self.bufring
            .push(bid as u16, addr, self.pool.buf_size() as u32);
        self.publish_rx();
        Ok(())
    }

    /// Hand the buffers pushed since the last call to the kernel; sockets
    /// whose receive starved may receive again.
    pub(super) fn publish_rx(&mut self) {
        self.bufring.publish();
        for s in &mut self.socks {
            s.starved = false;
        }
    }

    /// Return a buffer that came from the receive ring (and was forwarded)
    /// to the receive ring; any other buffer goes back to the pool.
    pub fn give_back(&mut self, buf: Buf) -> Result<()> {
        let idx = buf.index();
        match self.bufring.bids.iter().position(|&x| x == idx) {
            Some(bid) => {
                self.pool.transition(&buf, State::User, State::InFlight)?;
                let _ = buf.into_raw();
                let addr = self.addr_of(idx);
                self.bufring
                    .push(bid as u16, addr, self.pool.buf_size() as u32);
                self.publish_rx();
                Ok(())
            }
            None => Ok(self.handle.free(buf)?),
        }
    }

    /// Send a received buffer onward without copying it (a proxy's
    /// forwarding step): it becomes the caller's and goes out zero-copy;
    /// when [`Ring::completions`] returns it, hand it back with
    /// [`Ring::give_back`].
    pub fn forward(&mut self, rx: RxBuf, to: SockId) -> Result<()> {
        self.pool
            .transition(&rx.buf, State::Received, State::User)?;
        self.send_zc(to, rx.buf, rx.len)
    }

    /// Send a whole scatter-gather list of received buffers onward as one
    /// zero-copy message (IORING_OP_SENDMSG_ZC): one request, one
    /// completion and one notification for the lot, in order with the
    /// socket's other sends. The buffers go straight back to the receive
    /// ring when the kernel is done with them.
    pub fn forward_sg(&mut self, bufs: &mut Vec<RxBuf>, to: SockId) -> Result<usize> {
        self.sock(to)?;
        if bufs.is_empty() {
            return Ok(0);
        }
        let mut items = Vec::with_capacity(bufs.len());
        let mut total = 0;
        for rb in bufs.drain(..) {
            self.pool
                .transition(&rb.buf, State::Received, State::InFlight)?;
            items.push((rb.buf.into_raw(), rb.len as u32));
            total += rb.len;
        }
        let e = self.sg_message(to, &items, MsgKind::Forward)?;
        self.in_flight += 1;
        self.sock(to)?.queued.push_back(Pending::Entry(e));
        self.flush_sends(to)?;
        self.kick()?;
        Ok(total)
    }
}
