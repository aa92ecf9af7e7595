//! Notifications: eventfd kicks and interrupts, the paper's modes, and the
//! interrupt moderation timer.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use crate::{sys, Result};

/// How driver and device notify each other (the rows of the paper's Figure 1;
/// `itr` is a separate setting and combines with any of them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// A kick per transmitted packet, an interrupt per completion.
    Base,
    /// Send Combining: transmit kicks are deferred while a transmit-completion
    /// interrupt is pending and flushed, as one kick, when it arrives.
    Sc,
    /// Communication Status Block: both sides poll shared memory and notify
    /// only a peer that has said it sleeps.
    Csb,
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Mode, String> {
        match s.to_ascii_lowercase().as_str() {
            "base" => Ok(Mode::Base),
            "sc" => Ok(Mode::Sc),
            "csb" => Ok(Mode::Csb),
            _ => Err(format!("unknown mode {s:?}: expected base, sc or csb")),
        }
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Mode::Base => "base",
            Mode::Sc => "sc",
            Mode::Csb => "csb",
        })
    }
}

/// The unit of `itr`, as in the e1000 and the paper: 250 ns.
pub const ITR_UNIT_NS: u64 = 250;

/// A non-blocking eventfd: a kick or an interrupt line.
#[derive(Debug)]
pub struct EventFd(OwnedFd);

impl EventFd {
    pub fn new() -> Result<EventFd> {
        // SAFETY: plain syscall; the descriptor is owned by the returned value.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(sys("eventfd"));
        }
        // SAFETY: fd is a fresh descriptor owned by nobody else.
        Ok(EventFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Adopt a descriptor received from a peer. It is made non-blocking; if it
    /// is not an eventfd, signal and drain simply fail and are ignored.
    pub fn from_fd(fd: OwnedFd) -> EventFd {
        // SAFETY: fcntl on a descriptor we own.
        unsafe {
            let fl = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
            libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, fl | libc::O_NONBLOCK);
        }
        EventFd(fd)
    }

    /// Raise the notification (one write of 1).
    #[inline]
    pub fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64. A full counter (EAGAIN) means
        // the peer has 2^64-2 unread notifications: nothing is lost by failing.
        unsafe { libc::write(self.0.as_raw_fd(), &one as *const u64 as *const _, 8) };
    }

    /// Consume pending notifications; returns how many were raised (0 if none).
    #[inline]
    pub fn drain(&self) -> u64 {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64.
        let n = unsafe { libc::read(self.0.as_raw_fd(), &mut v as *mut u64 as *mut _, 8) };
        if n == 8 {
            v
        } else {
            0
        }
    }

    /// Sleep until notified or `timeout` passes; returns the notifications
    /// consumed (0 on timeout).
    pub fn wait(&self, timeout: Duration) -> u64 {
        let mut p = libc::pollfd {
            fd: self.0.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut p, 1, ms.max(1)) };
        self.drain()
    }

    pub fn dup(&self) -> Result<OwnedFd> {
        self.0.try_clone().map_err(|e| crate::Error::Sys {
            what: "dup eventfd",
            source: e,
        })
    }

    pub fn raw(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

impl AsFd for EventFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

/// Interrupt moderation (device side): at most one interrupt per interval;
/// a request inside the interval is held and fired when it ends.
#[derive(Debug)]
pub struct Moderator {
    interval: Duration,
    last: Option<Instant>,
    pending: bool,
}

impl Moderator {
    pub fn new(itr: u32) -> Moderator {
        Moderator {
            interval: Duration::from_nanos(itr as u64 * ITR_UNIT_NS),
            last: None,
            pending: false,
        }
    }

    /// Ask for an interrupt; true if it may fire now (the caller fires it).
    #[inline]
    pub fn request(&mut self, now: Instant) -> bool {
        if self.interval.is_zero() {
            return true;
        }
        match self.last {
            Some(t) if now < t + self.interval => {
                self.pending = true;
                false
            }
            _ => {
                self.last = Some(now);
                self.pending = false;
                true
            }
        }
    }

    /// When a held interrupt is due, if one is held.
    pub fn deadline(&self) -> Option<Instant> {
        if self.pending {
            self.last.map(|t| t + self.interval)
        } else {
            None
        }
    }

    /// True if a held interrupt is due now (and marks it fired).
    #[inline]
    pub fn due(&mut self, now: Instant) -> bool {
        match self.deadline() {
            Some(d) if now >= d => {
                self.pending = false;
                self.last = Some(now);
                true
            }
            _ => false,
        }
    }

    /// Forget a held interrupt (it became unnecessary).
    pub fn cancel(&mut self) {
        self.pending = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eventfd_counts_signals() {
        let e = EventFd::new().unwrap();
        assert_eq!(e.drain(), 0);
        e.signal();
        e.signal();
        assert_eq!(e.drain(), 2);
        assert_eq!(e.wait(Duration::from_millis(1)), 0);
    }

    #[test]
    fn moderation_holds_then_fires_once() {
        let mut m = Moderator::new(100); // 25 us
        let t0 = Instant::now();
        assert!(m.request(t0));
        assert!(!m.request(t0 + Duration::from_micros(5)));
        assert!(!m.request(t0 + Duration::from_micros(10)));
        assert_eq!(m.deadline(), Some(t0 + Duration::from_micros(25)));
        assert!(!m.due(t0 + Duration::from_micros(24)));
        assert!(m.due(t0 + Duration::from_micros(25)));
        assert!(!m.due(t0 + Duration::from_micros(26)), "fired twice");
        assert_eq!(m.deadline(), None);
        let mut z = Moderator::new(0);
        assert!(z.request(t0) && z.request(t0));
    }
}
