//! The event loop: passes over the ports while frames flow, polling for a
//! while when they stop, then sleeping in epoll until a kick, a control
//! connection or a moderation timer; and the dispatch of epoll events to
//! ports and to the servers of the port kinds outside programs attach.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::event::epoll;

use crate::ports::{Owner, Served};
use crate::{Error, Switch};

/// While busy (or idle with only polled ports), the switch looks for events
/// (kicks, control messages) at least this often.
const BUSY_EPOLL_EVERY: Duration = Duration::from_micros(10);

/// What an epoll event is about: its token's class in bits 40..48, a
/// server's index in bits 32..40, and a port index or connection id below.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Token {
    /// The descriptor of the port at this index.
    Port(u16),
    /// The listening socket of the server at this index
    /// ([`crate::ports::servers`]).
    Listen(u8),
    /// A connection (its id) of the server at this index.
    Conn(u8, u32),
}

const TOK_PORT: u64 = 1 << 40;
const TOK_LISTEN: u64 = 2 << 40;
const TOK_CONN: u64 = 3 << 40;
const TOK_MASK: u64 = 0xff << 40;

impl Token {
    /// The number epoll carries for this token.
    fn encode(self) -> u64 {
        match self {
            Token::Port(idx) => TOK_PORT | u64::from(idx),
            Token::Listen(k) => TOK_LISTEN | u64::from(k) << 32,
            Token::Conn(k, id) => TOK_CONN | u64::from(k) << 32 | u64::from(id),
        }
    }

    /// The token an event carries back (none: not one of ours).
    fn decode(token: u64) -> Option<Token> {
        let k = (token >> 32) as u8;
        let low = token as u32;
        match token & TOK_MASK {
            TOK_PORT => Some(Token::Port(low as u16)),
            TOK_LISTEN => Some(Token::Listen(k)),
            TOK_CONN => Some(Token::Conn(k, low)),
            _ => None,
        }
    }
}

/// The switch's epoll instance: every descriptor it watches carries a token.
pub(crate) struct Poller(OwnedFd);

impl Poller {
    pub(crate) fn new() -> std::io::Result<Poller> {
        Ok(Poller(epoll::create(epoll::CreateFlags::CLOEXEC)?))
    }

    pub(crate) fn watch(&self, fd: BorrowedFd<'_>, token: Token) -> Result<(), Error> {
        epoll::add(
            &self.0,
            fd,
            epoll::EventData::new_u64(token.encode()),
            epoll::EventFlags::IN,
        )
        .map_err(|e| Error::Watch(e.into()))
    }

    pub(crate) fn unwatch(&self, fd: BorrowedFd<'_>) {
        // Failure only means it was not watched.
        let _ = epoll::delete(&self.0, fd);
    }

    /// Wait up to `timeout_us` microseconds (0: just look) for events.
    pub(crate) fn wait(&self, events: &mut [libc::epoll_event], timeout_us: i64) -> usize {
        let ts = libc::timespec {
            tv_sec: timeout_us / 1_000_000,
            tv_nsec: (timeout_us % 1_000_000) * 1000,
        };
        // rustix's epoll::wait rounds timeouts up to milliseconds (it uses
        // epoll_pwait2 only with its "linux_5_11" feature); moderation timers
        // need microseconds, so this one call stays raw.
        // SAFETY: events is a live, writable array of events.len() entries;
        // ts is a live timespec; a null sigmask leaves the mask alone.
        let n = unsafe {
            libc::epoll_pwait2(
                self.0.as_raw_fd(),
                events.as_mut_ptr(),
                events.len() as libc::c_int,
                &ts,
                std::ptr::null(),
            )
        };
        n.max(0) as usize
    }
}

impl Switch {
    /// Run until `stop` is set. `status_flag` (SIGUSR1) prints status.
    pub fn run(&mut self, stop: &AtomicBool, status_flag: Option<&AtomicBool>) {
        let mut idle_since: Option<Instant> = None;
        let mut last_epoll = Instant::now();
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; 64];
        while !stop.load(Ordering::Relaxed) {
            let now = Instant::now();
            let work = self.forward_all(now);
            // Ports whose pending() sees new frames without an event: while
            // all are, even idle passes need not look in epoll every time.
            let all_polled = self.ports.iter().flatten().all(|p| p.port.polled());
            self.stats.passes += 1;
            if work == 0 {
                self.stats.idle_passes += 1;
            } else {
                self.stats.busy_ns += now.elapsed().as_nanos() as u64;
            }
            for p in self.ports.iter_mut().flatten() {
                p.port.timer(now);
            }
            if let Some(f) = status_flag {
                if f.swap(false, Ordering::Relaxed) {
                    eprintln!(
                        "{}",
                        serde_json::to_string_pretty(&self.status()).unwrap_or_default()
                    );
                }
            }
            if now.duration_since(self.last_aging) > Duration::from_secs(1) {
                self.age(now);
            }
            let timeout_us: i64 = if work > 0 {
                idle_since = None;
                0
            } else {
                let since = *idle_since.get_or_insert(now);
                if now.duration_since(since) < Duration::from_micros(self.cfg.poll_us) {
                    0
                } else if self
                    .ports
                    .iter_mut()
                    .flatten()
                    .all(|p| p.port.prepare_sleep())
                {
                    self.stats.sleeps += 1;
                    let next = self
                        .ports
                        .iter()
                        .flatten()
                        .filter_map(|p| p.port.deadline())
                        .min();
                    match next {
                        // Moderation timers need microseconds, not epoll_wait's milliseconds.
                        Some(d) => (d.saturating_duration_since(now).as_micros() as i64).max(1),
                        None => 100_000,
                    }
                } else {
                    0
                }
            };
            // While frames flow, looking in epoll (a system call) on every
            // pass costs more than a short batch: look at most every
            // BUSY_EPOLL_EVERY then. Kicks of ports without a CSB carry
            // their counters, so an idle pass looks at once unless every
            // port is polled (CSB ring ports, memif, ports inside the switch).
            let n = if timeout_us > 0
                || (work == 0 && !all_polled)
                || now.duration_since(last_epoll) >= BUSY_EPOLL_EVERY
            {
                last_epoll = now;
                self.poller.wait(&mut events, timeout_us)
            } else {
                0
            };
            if timeout_us > 0 {
                for p in self.ports.iter_mut().flatten() {
                    p.port.wake();
                }
            }
            for ev in events.iter().take(n) {
                self.dispatch(ev.u64);
            }
        }
    }

    /// Forward a batch from every port with frames waiting; returns the
    /// frames forwarded.
    fn forward_all(&mut self, now: Instant) -> usize {
        let mut work = 0;
        for s in 0..self.ports.len() {
            let pending = match self.ports.get_mut(s) {
                Some(Some(p)) => p.port.broken().is_none() && p.port.pending(),
                _ => false,
            };
            if pending {
                work += self.forward(s, now);
            }
        }
        work
    }

    /// One pass, for a program that drives the switch step by step
    /// instead of [`Switch::run`] (a test that plays a peer in the same
    /// thread, say): a batch from every port with frames, then the timers
    /// that are due. Returns the frames forwarded.
    pub fn pass(&mut self) -> usize {
        let now = Instant::now();
        let work = self.forward_all(now);
        for p in self.ports.iter_mut().flatten() {
            p.port.timer(now);
        }
        work
    }

    /// Serve what the switch's descriptors have waiting (kicks, control
    /// and attach connections, vhost-user messages), without waiting: the
    /// other half of driving the switch step by step ([`Switch::pass`]).
    pub fn poll_events(&mut self) {
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; 64];
        let n = self.poller.wait(&mut events, 0);
        for ev in events.iter().take(n) {
            self.dispatch(ev.u64);
        }
    }

    /// Act on one epoll event: a port's descriptor, or a server's listening
    /// socket or connection.
    fn dispatch(&mut self, token: u64) {
        match Token::decode(token) {
            Some(Token::Port(idx)) => {
                if let Some(Some(p)) = self.ports.get_mut(idx as usize) {
                    p.port.on_event();
                }
            }
            Some(Token::Listen(k)) => self.accept_on(k),
            Some(Token::Conn(k, id)) => self.serve_on(k, id),
            None => {}
        }
    }

    /// Accept every connection waiting on server `k`'s socket and watch it.
    fn accept_on(&mut self, k: u8) {
        let poller = &self.poller;
        if let Some(server) = self.servers.get_mut(k as usize) {
            server.accept_all(&mut |id, fd| poller.watch(fd, Token::Conn(k, id)).is_ok());
        }
    }

    /// Let server `k` handle what arrived on its connection `id`; when the
    /// connection closed, stop watching it and remove the ports it brought.
    fn serve_on(&mut self, k: u8, id: u32) {
        // The server is taken out while it serves, so that it can add its
        // ports to (and read the status of) the switch that holds it.
        let mut servers = std::mem::take(&mut self.servers);
        let served = match servers.get_mut(k as usize) {
            Some(server) => server.serve_conn(
                id,
                Owner {
                    server: k,
                    conn: id,
                },
                self,
            ),
            None => Served::Open,
        };
        self.servers = servers;
        if let Served::Closed(fd) = served {
            self.poller.unwatch(fd.as_fd());
            self.remove_owned(Owner {
                server: k,
                conn: id,
            });
        }
    }
}

/// Run a switch on its own thread; returns a handle to stop it.
pub fn spawn(mut sw: Switch) -> (Arc<AtomicBool>, std::thread::JoinHandle<Switch>) {
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    let h = std::thread::Builder::new()
        .name("switch".into())
        .spawn(move || {
            sw.run(&s2, None);
            sw
        })
        .expect("spawn switch thread");
    (stop, h)
}
