//! A raw AF_PACKET socket on one interface, for tests that play the wire:
//! they send hand-made frames into the load balancer's interface and catch
//! what it transmits, stamped by the kernel as it arrives.

use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

/// The socket, bound to one interface of the namespace it was opened in.
pub struct RawSocket {
    fd: OwnedFd,
}

impl RawSocket {
    /// Opens it on `iface` of the calling thread's namespace. It does not
    /// see its own frames, and received frames carry the kernel's receive
    /// stamp.
    pub fn open(iface: &str) -> RawSocket {
        let proto = i32::from((libc::ETH_P_ALL as u16).to_be());
        // SAFETY: socket(2) with constant arguments; the result is checked.
        let raw =
            unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, proto) };
        assert!(raw >= 0, "socket: {}", std::io::Error::last_os_error());
        // SAFETY: `raw` is a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let index =
            netio::afpacket::ifindex(iface).unwrap_or_else(|| panic!("no interface {iface}"));
        let set = |level, opt| {
            let one: libc::c_int = 1;
            // SAFETY: the option takes an int; `one` outlives the call.
            let r = unsafe {
                libc::setsockopt(
                    fd.as_raw_fd(),
                    level,
                    opt,
                    (&one as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                )
            };
            assert_eq!(r, 0, "setsockopt: {}", std::io::Error::last_os_error());
        };
        set(libc::SOL_PACKET, libc::PACKET_IGNORE_OUTGOING);
        set(libc::SOL_SOCKET, libc::SO_TIMESTAMPNS);
        netio::afpacket::bind_all(fd.as_fd(), index).unwrap_or_else(|e| panic!("bind: {e}"));
        RawSocket { fd }
    }

    /// Sends one whole frame (the test fails if the kernel takes less).
    pub fn send(&self, frame: &[u8]) {
        // SAFETY: `frame` is valid for its length during the call.
        let r = unsafe { libc::send(self.fd.as_raw_fd(), frame.as_ptr().cast(), frame.len(), 0) };
        assert_eq!(
            r,
            frame.len() as isize,
            "send: {}",
            std::io::Error::last_os_error()
        );
    }

    /// The first frame within `timeout` that `wanted` accepts, with its
    /// kernel receive stamp (since the epoch); frames it refuses are
    /// skipped. None when none came in time.
    pub fn receive_matching(
        &self,
        timeout: Duration,
        wanted: impl Fn(&[u8]) -> bool,
    ) -> Option<(Vec<u8>, Duration)> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.checked_duration_since(Instant::now())?;
            let Some((frame, stamp)) = self.receive(left) else {
                continue; // poll woke without a frame (the loop is bounded by the deadline)
            };
            if wanted(&frame) {
                return Some((frame, stamp));
            }
        }
    }

    /// The next frame and its kernel receive stamp (since the epoch), if
    /// one comes within `timeout`.
    pub fn receive(&self, timeout: Duration) -> Option<(Vec<u8>, Duration)> {
        let mut p = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd, alive for the call.
        if unsafe { libc::poll(&mut p, 1, ms) } <= 0 {
            return None;
        }
        let mut buf = vec![0u8; 2048];
        let mut control = [0u64; 16];
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        // SAFETY: msghdr is plain old data; all-zero is a valid value.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&control) as _;
        // SAFETY: `msg` points at `iov` (into `buf`) and `control`, which
        // outlive the call.
        let n = unsafe { libc::recvmsg(self.fd.as_raw_fd(), &mut msg, libc::MSG_DONTWAIT) };
        if n < 0 {
            return None;
        }
        buf.truncate(n as usize);
        let mut stamp = None;
        // SAFETY: `msg` was filled in by recvmsg; the CMSG macros walk its
        // control buffer within `msg_controllen`.
        let mut c = unsafe { libc::CMSG_FIRSTHDR(&msg) };
        while !c.is_null() {
            // SAFETY: `c` is a control message header inside `control`.
            let h = unsafe { &*c };
            if h.cmsg_level == libc::SOL_SOCKET && h.cmsg_type == libc::SCM_TIMESTAMPNS {
                // SAFETY: an SCM_TIMESTAMPNS message carries a timespec,
                // maybe unaligned in the buffer.
                let ts: libc::timespec =
                    unsafe { std::ptr::read_unaligned(libc::CMSG_DATA(c).cast()) };
                stamp = Some(Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32));
            }
            // SAFETY: as for CMSG_FIRSTHDR.
            c = unsafe { libc::CMSG_NXTHDR(&msg, c) };
        }
        Some((buf, stamp.unwrap_or_else(now_realtime)))
    }
}

/// The time since the epoch, as the kernel stamps received frames.
pub fn now_realtime() -> Duration {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
}
