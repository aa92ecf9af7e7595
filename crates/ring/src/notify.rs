//! Notifications: eventfd kicks and interrupts, the paper's modes, and the
//! interrupt moderation timer.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::event::{eventfd, poll, EventfdFlags, PollFd, PollFlags, Timespec};
use rustix::fs::{fcntl_getfl, fcntl_setfl, OFlags};
use rustix::io::ReadWriteFlags;

use crate::signaller;
pub use crate::signaller::{Line, LineStats};

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

/// A string that names no [`Mode`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown mode {got:?}: expected base, sc or csb")]
pub struct ParseModeError {
    /// The string as given.
    pub got: String,
}

impl std::str::FromStr for Mode {
    type Err = ParseModeError;
    fn from_str(s: &str) -> std::result::Result<Mode, ParseModeError> {
        match s.to_ascii_lowercase().as_str() {
            "base" => Ok(Mode::Base),
            "sc" => Ok(Mode::Sc),
            "csb" => Ok(Mode::Csb),
            _ => Err(ParseModeError { got: s.to_string() }),
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

/// An eventfd: a kick or an interrupt line, often shared with a peer.
///
/// No call on it blocks, whatever the peer does with the descriptor it
/// shares: the `O_NONBLOCK` flag lives in the open file description, which
/// the peer can change, so it is set here but never relied on. Reads ask
/// the kernel not to wait on each call (`preadv2(RWF_NOWAIT)`); writes go
/// through [`crate::signaller`], which never sleeps and holds at most one
/// write in flight per line.
#[derive(Debug)]
pub struct EventFd {
    fd: OwnedFd,
    line: Arc<Line>,
}

impl EventFd {
    /// A fresh eventfd (non-blocking, close-on-exec), counter at 0.
    pub fn new() -> Result<EventFd> {
        eventfd(0, EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC)
            .map(EventFd::own)
            .map_err(sys("eventfd"))
    }

    fn own(fd: OwnedFd) -> EventFd {
        EventFd {
            fd,
            line: Arc::default(),
        }
    }

    /// Adopt a descriptor received from a peer. It is made non-blocking (as
    /// a courtesy: nothing here depends on it); if it is not an eventfd,
    /// signal and drain simply fail and are counted or ignored.
    pub fn from_fd(fd: OwnedFd) -> EventFd {
        // Failure is ignored on purpose: fcntl fails only on a descriptor that
        // is no descriptor, and on one that is no eventfd the calls below fail.
        if let Ok(fl) = fcntl_getfl(&fd) {
            let _ = fcntl_setfl(&fd, fl | OFlags::NONBLOCK);
        }
        EventFd::own(fd)
    }

    /// Raise the notification (one write of 1). Never blocks: a write the
    /// peer makes wait (its counter full, its flags changed) waits in a
    /// kernel worker, and signals raised meanwhile are counted as held.
    #[inline]
    pub fn signal(&self) {
        if !signaller::signal(self.fd.as_fd(), &self.line) {
            // No io_uring (disabled by the administrator): a write checked
            // for room first. A peer can still race it; daemons refuse to
            // start without the ring (see [`signaller::ready`]).
            let mut p = [PollFd::new(&self.fd, PollFlags::OUT)];
            let room = matches!(poll(&mut p, Some(&Timespec::default())), Ok(1));
            if !room || rustix::io::write(&self.fd, &1u64.to_ne_bytes()).is_err() {
                self.line.failed_one();
            }
        }
    }

    /// What became of the signals raised on this line.
    pub fn stats(&self) -> LineStats {
        self.line.stats()
    }

    /// Consume pending notifications; returns how many were raised (0 if none).
    /// Never blocks, even on a descriptor the peer made blocking.
    #[inline]
    pub fn drain(&self) -> u64 {
        let mut v = [0u8; 8];
        // -1 (u64::MAX): the file's own position; an eventfd has none.
        match rustix::io::preadv2(
            &self.fd,
            &mut [std::io::IoSliceMut::new(&mut v)],
            u64::MAX,
            ReadWriteFlags::NOWAIT,
        ) {
            Ok(8) => u64::from_ne_bytes(v),
            _ => 0,
        }
    }

    /// Sleep until notified or `timeout` passes; returns the notifications
    /// consumed (0 on timeout). The timeout is taken in whole milliseconds,
    /// at least one.
    pub fn wait(&self, timeout: Duration) -> u64 {
        let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as i64;
        let t = Timespec {
            tv_sec: ms / 1000,
            tv_nsec: (ms % 1000) * 1_000_000,
        };
        // An interrupted or failed poll is a spurious wake-up: drain tells.
        let _ = poll(&mut [PollFd::new(&self.fd, PollFlags::IN)], Some(&t));
        self.drain()
    }

    /// A second descriptor for the same eventfd, to hand to the peer.
    pub fn dup(&self) -> Result<OwnedFd> {
        self.fd.try_clone().map_err(sys("dup eventfd"))
    }

    /// The descriptor number, e.g. to register with epoll.
    pub fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl Drop for EventFd {
    fn drop(&mut self) {
        signaller::cancel(&self.line);
    }
}

impl AsFd for EventFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
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
    /// A moderator allowing one interrupt per `itr` units of
    /// [`ITR_UNIT_NS`] (0: no moderation).
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
    fn modes_parse_and_print() {
        for m in [Mode::Base, Mode::Sc, Mode::Csb] {
            assert_eq!(m.to_string().parse::<Mode>(), Ok(m));
        }
        assert_eq!("CSB".parse::<Mode>(), Ok(Mode::Csb));
        let e = "fast".parse::<Mode>().unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown mode \"fast\": expected base, sc or csb"
        );
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
