//! Zero-copy send accounting: SEND_ZC of the caller's buffers and its two
//! completions (bytes sent, then the notification that gives the buffer
//! back), whether the kernel copied after all, and the adaptive probing that
//! sends ordinary sends on a route that copies anyway.

use io_uring::{cqueue, opcode, types};

use super::submit::{ud, Pending, OP_SEND_PLAIN, OP_SEND_ZC};
use super::{Result, Ring, Sent, SockId};
use crate::{Buf, State};

/// `IORING_SEND_ZC_REPORT_USAGE` (linux/io_uring.h): report in the
/// notification whether the kernel copied after all.
pub(super) const SEND_ZC_REPORT_USAGE: u16 = 1 << 3;
/// `IORING_NOTIF_USAGE_ZC_COPIED`.
pub(super) const NOTIF_USAGE_ZC_COPIED: u32 = 1 << 31;

/// On a socket whose zero-copy sends the kernel copied, one send in this
/// many is still sent zero-copy, to find out whether it still copies.
pub const ZC_PROBE_EVERY: u32 = 128;

impl Ring {
    /// Zero-copy send of `len` bytes of `buf` (a fixed buffer). The buffer
    /// is `InFlight` until [`Ring::completions`] hands it back.
    pub fn send_zc(&mut self, s: SockId, buf: Buf, len: usize) -> Result<()> {
        self.sock(s)?;
        let len = len.min(self.pool.buf_size());
        self.pool.transition(&buf, State::User, State::InFlight)?;
        let idx = buf.into_raw();
        self.in_flight += 1;
        if self.sock(s)?.stream {
            self.sock(s)?.queued.push_back(Pending::Zc {
                idx,
                len: len as u32,
            });
            self.flush_sends(s)?;
            return self.kick();
        }
        let addr = self.addr_of(idx) as *const u8;
        let e = if self.want_zc(s)? {
            opcode::SendZc::new(types::Fixed(s.0), addr, len as u32)
                .buf_index(Some(0))
                .flags(libc::MSG_WAITALL)
                .zc_flags(SEND_ZC_REPORT_USAGE)
                .build()
                .user_data(ud(OP_SEND_ZC, s.0, idx))
        } else {
            opcode::Send::new(types::Fixed(s.0), addr, len as u32)
                .flags(libc::MSG_WAITALL)
                .build()
                .user_data(ud(OP_SEND_PLAIN, s.0, idx))
        };
        self.sock(s)?.queued.push_back(Pending::Entry(e));
        self.flush_sends(s)?;
        self.kick()
    }

    /// Whether the next send of pool buffers on `s` asks for zero copy:
    /// yes unless the kernel copied this socket's last zero-copy send, and
    /// then still once every [`ZC_PROBE_EVERY`] sends. A zero-copy send
    /// that the kernel ends up copying costs more than an ordinary one (it
    /// is set up for zero copy, copied later and notified separately), so
    /// on a route that copies anyway the ordinary send is the cheaper way
    /// to send the same buffers. Linux's MSG_ZEROCOPY documentation gives
    /// the same advice.
    pub(super) fn want_zc(&mut self, s: SockId) -> Result<bool> {
        let adaptive = self.adaptive_zc;
        let sock = self.sock(s)?;
        let zc = if !adaptive || !sock.kernel_copies || sock.since_probe + 1 >= ZC_PROBE_EVERY {
            sock.since_probe = 0;
            true
        } else {
            sock.since_probe += 1;
            false
        };
        if zc {
            self.zc_sends += 1;
        } else {
            self.plain_sends += 1;
        }
        Ok(zc)
    }

    /// A zero-copy notification for socket `sock` said whether the kernel
    /// copied.
    pub(super) fn note_copied(&mut self, sock: u32, copied: bool) {
        if let Some(s) = self.socks.get_mut(sock as usize) {
            s.kernel_copies = copied;
        }
    }

    pub(super) fn finish_send(&mut self, sock: u32, idx: u32, result: i32, copied: bool) {
        self.in_flight -= 1;
        // SAFETY: idx came from into_raw of the buffer handed to this send,
        // taken back exactly once (here, on its final completion).
        let buf = unsafe { self.pool.from_raw(idx) }.ok();
        if let Some(b) = &buf {
            let _ = self.pool.transition(b, State::InFlight, State::User);
        }
        self.done.push_back(Sent {
            sock: SockId(sock),
            buf,
            result,
            copied,
        });
    }

    /// A completion of a SEND_ZC: first the bytes sent (the buffer still
    /// the kernel's), then the notification that gives the buffer back and
    /// says whether the kernel copied.
    pub(super) fn on_send_zc(&mut self, sock: u32, idx: u32, res: i32, flags: u32) {
        if cqueue::notif(flags) {
            let copied = res as u32 & NOTIF_USAGE_ZC_COPIED != 0;
            self.note_copied(sock, copied);
            let result = self.zc_results.remove(&idx).unwrap_or(0);
            self.finish_send(sock, idx, result, copied);
        } else if cqueue::more(flags) {
            // Bytes sent; the buffer comes back with the notification.
            self.zc_results.insert(idx, res);
            self.send_done(sock);
        } else {
            // No notification follows (the send failed early).
            self.send_done(sock);
            self.finish_send(sock, idx, res, false);
        }
    }

    /// A completion of a SENDMSG_ZC: as for SEND_ZC, for a whole
    /// scatter-gather message.
    pub(super) fn on_sendmsg_zc(&mut self, sock: u32, idx: u32, res: i32, flags: u32) {
        if cqueue::notif(flags) {
            let copied = res as u32 & NOTIF_USAGE_ZC_COPIED != 0;
            self.note_copied(sock, copied);
            self.finish_sg(sock, idx, None, copied);
        } else {
            self.send_done(sock);
            if cqueue::more(flags) {
                if let Some(m) = self.msgs.get_mut(&idx) {
                    m.2 = res;
                }
            } else {
                self.finish_sg(sock, idx, Some(res), false);
            }
        }
    }
}
