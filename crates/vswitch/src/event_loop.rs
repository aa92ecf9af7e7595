//! The event loop, [`EventLoop`]: the switch, the epoll instance it sleeps
//! in and the servers of the port kinds outside programs attach. It makes
//! passes over the ports while frames flow, polls for a while when they
//! stop (at least `poll_us`, longer while a port's adaptive window says
//! more frames are coming: [`crate::polling`]), then sleeps in epoll until a kick, a control connection or a
//! moderation timer; it dispatches epoll events to ports and servers, and
//! adds to the switch the ports the servers' connections bring (and removes
//! them when the connections close).

use std::ops::{Deref, DerefMut};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::event::epoll;

use crate::attach::{Attach, Served};
use crate::control::ControlServer;
use crate::polling::Budget;
use crate::ports::{memif, Port};
use crate::switch::{Owner, STATUS_PAGE_BYTES};
use crate::{Config, Error, Switch};

/// While busy (or idle with only polled ports), the switch looks for events
/// (kicks, control messages) at least this often.
const BUSY_EPOLL_EVERY: Duration = Duration::from_micros(10);

/// How often the servers' connections are looked at for a handshake
/// deadline that passed ([`Attach::expire`]): a small part of the deadline,
/// and at most as often as an idle switch wakes anyway.
const EXPIRE_EVERY: Duration = Duration::from_millis(100);

/// What an epoll event is about: its token's class in bits 40..48, a
/// server's index in bits 32..40, and a port index or connection id below.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Token {
    /// The descriptor of the port at this index.
    Port(u16),
    /// The listening socket of the server at this index ([`servers`]).
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
struct Poller(OwnedFd);

impl Poller {
    fn new() -> std::io::Result<Poller> {
        Ok(Poller(epoll::create(epoll::CreateFlags::CLOEXEC)?))
    }

    fn watch(&self, fd: BorrowedFd<'_>, token: Token) -> Result<(), Error> {
        epoll::add(
            &self.0,
            fd,
            epoll::EventData::new_u64(token.encode()),
            epoll::EventFlags::IN,
        )
        .map_err(|e| Error::Watch(e.into()))
    }

    fn unwatch(&self, fd: BorrowedFd<'_>) {
        // Failure only means it was not watched.
        let _ = epoll::delete(&self.0, fd);
    }

    /// Wait up to `timeout_us` microseconds (0: just look) for events.
    fn wait(&self, events: &mut [libc::epoll_event], timeout_us: i64) -> usize {
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

/// The servers of the kinds of port that outside programs attach, bound to
/// the sockets `cfg` names, in a fixed order (a server's index is part of
/// its epoll tokens and of its ports' [`Owner`]). A new kind that attaches
/// through a socket registers here: one line that binds its server.
fn servers(cfg: &Config) -> Result<Vec<Box<dyn Attach>>, Error> {
    let mut servers: Vec<Box<dyn Attach>> = Vec::new();
    if let Some(p) = &cfg.socket {
        servers.push(Box::new(ControlServer::bind(p, &cfg.ring_unlocked)?));
    }
    if let Some(p) = &cfg.memif_socket {
        servers.push(Box::new(memif::Attached::bind(p, cfg.memif_moderation)?));
    }
    Ok(servers)
}

/// A switch and what drives it: the epoll instance it sleeps in (every
/// descriptor it watches, ports' and servers', carries a token) and the
/// servers of the port kinds outside programs attach.
///
/// It derefs to its [`Switch`], for reading counters and reaching ports;
/// add and remove ports through the event loop's own
/// [`EventLoop::add_port`] and [`EventLoop::remove_port`], which also watch
/// and unwatch their descriptors.
pub struct EventLoop {
    switch: Switch,
    poller: Poller,
    /// In their registration order ([`servers`]).
    servers: Vec<Box<dyn Attach>>,
    /// When the servers' handshake deadlines are next looked at.
    next_expire: Instant,
}

impl EventLoop {
    /// Drive `switch`: bind the control and memif sockets its configuration
    /// names, and watch them and its ports' descriptors.
    pub fn new(switch: Switch) -> Result<EventLoop, Error> {
        // Before any peer can attach: the switch does not run where a
        // peer's interrupt line could block it.
        ring::signaller::ready()?;
        let poller = Poller::new().map_err(Error::Epoll)?;
        let servers = servers(&switch.cfg)?;
        for (k, server) in servers.iter().enumerate() {
            poller.watch(server.listen_fd(), Token::Listen(k as u8))?;
        }
        for (idx, slot) in switch.ports.iter().enumerate() {
            if let Some(fd) = slot.as_ref().and_then(|s| s.port.fd()) {
                poller.watch(fd, Token::Port(idx as u16))?;
            }
        }
        Ok(EventLoop {
            switch,
            poller,
            servers,
            next_expire: Instant::now() + EXPIRE_EVERY,
        })
    }

    /// The switch, no longer driven (its sockets closed).
    pub fn into_switch(self) -> Switch {
        self.switch
    }

    /// Add a port and watch its descriptor; returns its index.
    pub fn add_port(&mut self, port: Box<dyn Port>) -> Result<u16, Error> {
        self.add_owned(port, None)
    }

    /// Add a port that connection `owner` brought (none: the caller's) and
    /// watch its descriptor; returns its index.
    fn add_owned(&mut self, port: Box<dyn Port>, owner: Option<Owner>) -> Result<u16, Error> {
        let idx = self.switch.add_owned(port, owner)?;
        let watched = match self.switch.port_mut(idx).and_then(|p| p.fd()) {
            Some(fd) => self.poller.watch(fd, Token::Port(idx)),
            None => Ok(()),
        };
        if let Err(e) = watched {
            // A port whose events nobody sees is not in the switch.
            self.switch.remove_port(idx);
            return Err(e);
        }
        Ok(idx)
    }

    /// Stop watching a port's descriptor and remove it; its addresses are
    /// forgotten.
    pub fn remove_port(&mut self, idx: u16) -> Option<Box<dyn Port>> {
        if let Some(fd) = self.switch.port_mut(idx)?.fd() {
            self.poller.unwatch(fd);
        }
        self.switch.remove_port(idx)
    }

    /// Run until `stop` is set. `status_flag` (SIGUSR1) prints status.
    ///
    /// After the last work the switch polls at least `poll_us`, then for as
    /// long as some port's adaptive window is open and the polling budget
    /// allows ([`crate::polling`]); then it asks every port for kicks and
    /// sleeps in epoll.
    pub fn run(&mut self, stop: &AtomicBool, status_flag: Option<&AtomicBool>) {
        let settings = self.switch.cfg.polling();
        let adaptive = settings.adaptive();
        let floor = Duration::from_nanos(settings.floor_ns);
        let epoch = Instant::now();
        let ns = |t: Instant| t.saturating_duration_since(epoch).as_nanos() as u64;
        let mut budget = Budget::new(&settings, 0);
        let mut idle_since: Option<Instant> = None;
        // Polled past the floor in the idle stretch under way.
        let mut stretch_ns = 0u64;
        let mut prev = epoch;
        let mut next_roll = epoch + Duration::from_secs(1);
        let mut last_epoll = Instant::now();
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; 64];
        while !stop.load(Ordering::Relaxed) {
            let sw = &mut self.switch;
            let now = Instant::now();
            let t = ns(now);
            let work = sw.forward_all(now);
            // Ports whose pending() sees new frames without an event: while
            // all are, even idle passes need not look in epoll every time.
            let all_polled = sw.ports.iter().flatten().all(|p| p.port.polled());
            sw.stats.passes += 1;
            if work == 0 {
                sw.stats.idle_passes += 1;
            } else {
                sw.stats.busy_ns += now.elapsed().as_nanos() as u64;
                if adaptive {
                    for p in sw.ports.iter_mut().flatten() {
                        if crate::polling::learns(p.port.kind()) {
                            let from = p.port.counters().from_port;
                            p.poll.observe(t, from, &settings);
                        }
                    }
                }
            }
            for p in sw.ports.iter_mut().flatten() {
                p.port.timer(now);
            }
            if now >= next_roll {
                next_roll = now + Duration::from_secs(1);
                for p in sw.ports.iter_mut().flatten() {
                    p.poll.roll(t);
                }
            }
            if let Some(f) = status_flag {
                if f.swap(false, Ordering::Relaxed) {
                    eprintln!(
                        "{}",
                        serde_json::to_string_pretty(&sw.status()).unwrap_or_default()
                    );
                }
            }
            if now.duration_since(sw.last_aging) > Duration::from_secs(1) {
                sw.age(now);
            }
            let timeout_us: i64 = if work > 0 {
                idle_since = None;
                if stretch_ns > 0 {
                    // The polling found work: not charged.
                    stretch_ns = 0;
                    for p in sw.ports.iter_mut().flatten() {
                        p.poll.paid();
                    }
                }
                0
            } else {
                let since = *idle_since.get_or_insert(now);
                let open = adaptive && sw.ports.iter().flatten().any(|p| p.poll.open(t));
                if now.duration_since(since) < floor {
                    0
                } else if open && budget.allows(t, stretch_ns) {
                    // A window holds the switch awake: this pass's time
                    // past the floor is the open windows'.
                    let dt = ns(now)
                        .saturating_sub(ns(prev))
                        .min(ns(now).saturating_sub(ns(since + floor)));
                    stretch_ns += dt;
                    sw.stats.polled_ns += dt;
                    for p in sw.ports.iter_mut().flatten() {
                        if p.poll.open(t) {
                            p.poll.polled(dt);
                        }
                    }
                    // Polling past the floor gives way to anything else
                    // that wants this core (a guest's vCPU on a shared
                    // core, say): a window saves the guests' kicks, it must
                    // not take the CPU they need. On an idle core the call
                    // returns at once.
                    rustix::thread::sched_yield();
                    0
                } else if sw
                    .ports
                    .iter_mut()
                    .flatten()
                    .all(|p| p.port.prepare_sleep())
                {
                    sw.stats.sleeps += 1;
                    if open {
                        sw.stats.budget_sleeps += 1;
                    }
                    if stretch_ns > 0 {
                        budget.charge(t, stretch_ns);
                        sw.stats.poll_wasted_ns += stretch_ns;
                        stretch_ns = 0;
                        for p in sw.ports.iter_mut().flatten() {
                            p.poll.slept();
                        }
                    }
                    // A port held back for spoofing is looked at again
                    // when its hold ends, as a timer would.
                    let next = sw
                        .ports
                        .iter()
                        .flatten()
                        .filter_map(|p| p.port.deadline().into_iter().chain(p.held_until).min())
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
            prev = now;
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
                for p in self.switch.ports.iter_mut().flatten() {
                    p.port.wake();
                }
            }
            for ev in events.iter().take(n) {
                self.dispatch(ev.u64);
            }
            self.expire(now);
        }
    }

    /// Close the servers' connections whose handshake deadline passed
    /// (looked at every [`EXPIRE_EVERY`]).
    fn expire(&mut self, now: Instant) {
        if now < self.next_expire {
            return;
        }
        self.next_expire = now + EXPIRE_EVERY;
        for k in 0..self.servers.len() {
            self.reap(k as u8, now);
        }
    }

    /// Stop watching the connections server `k` closed (deadline passed,
    /// or made room for a newcomer) and remove what they brought.
    fn reap(&mut self, k: u8, now: Instant) {
        let Some(server) = self.servers.get_mut(k as usize) else {
            return;
        };
        for (id, fd) in server.expire(now) {
            self.closed(
                Owner {
                    server: k,
                    conn: id,
                },
                fd,
            );
        }
    }

    /// Connection `owner` closed: stop watching it and remove the ports it
    /// brought.
    fn closed(&mut self, owner: Owner, fd: OwnedFd) {
        self.poller.unwatch(fd.as_fd());
        for idx in self.switch.owned_by(owner) {
            self.remove_port(idx);
        }
    }

    /// Serve what the switch's descriptors have waiting (kicks, control
    /// and attach connections, vhost-user messages), without waiting: the
    /// other half, with [`Switch::pass`], of driving the switch step by
    /// step instead of [`EventLoop::run`] (a test that plays a peer in the
    /// same thread, say).
    pub fn poll_events(&mut self) {
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; 64];
        let n = self.poller.wait(&mut events, 0);
        for ev in events.iter().take(n) {
            self.dispatch(ev.u64);
        }
        self.expire(Instant::now());
    }

    /// Act on one epoll event: a port's descriptor, or a server's listening
    /// socket or connection.
    fn dispatch(&mut self, token: u64) {
        match Token::decode(token) {
            Some(Token::Port(idx)) => {
                if let Some(p) = self.switch.port_mut(idx) {
                    p.on_event();
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
        // A newcomer may have taken the place of a connection that had not
        // completed its handshake.
        self.reap(k, Instant::now());
    }

    /// Let server `k` handle what arrived on its connection `id`, and do
    /// what that asks of the switch (add the port the connection brings,
    /// hand it a page of the status document) until it asks nothing more;
    /// when the connection closed, stop watching it and remove the ports it
    /// brought.
    fn serve_on(&mut self, k: u8, id: u32) {
        let owner = Owner {
            server: k,
            conn: id,
        };
        let Some(server) = self.servers.get_mut(k as usize) else {
            return;
        };
        let mut served = server.serve_conn(id);
        loop {
            served = match served {
                Served::Open => return,
                Served::Closed(fd) => {
                    self.closed(owner, fd);
                    return;
                }
                Served::Port(port) => {
                    let added = self.add_owned(port, Some(owner));
                    self.servers[k as usize].added(id, added)
                }
                Served::Status(from) => {
                    let page = self.switch.status_page(from, STATUS_PAGE_BYTES);
                    self.servers[k as usize].status(id, page)
                }
            };
        }
    }
}

impl Deref for EventLoop {
    type Target = Switch;

    fn deref(&self) -> &Switch {
        &self.switch
    }
}

impl DerefMut for EventLoop {
    fn deref_mut(&mut self) -> &mut Switch {
        &mut self.switch
    }
}

/// Run a switch on its own thread, its sockets bound before this returns;
/// returns a handle to stop it, and the thread, which gives the switch back.
pub fn spawn(sw: Switch) -> Result<(Arc<AtomicBool>, std::thread::JoinHandle<Switch>), Error> {
    let mut el = EventLoop::new(sw)?;
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    let h = std::thread::Builder::new()
        .name("switch".into())
        .spawn(move || {
            el.run(&s2, None);
            el.into_switch()
        })
        .expect("spawn switch thread");
    Ok((stop, h))
}
