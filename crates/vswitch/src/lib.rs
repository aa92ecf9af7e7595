//! A VALE-style software switch.
//!
//! One thread forwards for every port. For each port with frames waiting it
//! takes a batch straight from the port's memory, does one lookup pass (learn
//! the source address, find the destination, or flood), then one pass per
//! destination that copies the frames for it into that port, and publishes
//! and notifies each destination once per batch. A destination that cannot
//! take a frame (its ring is full) loses that frame, counted; nobody waits
//! for a slow port.
//!
//! When no port has work for `poll_us`, the switch tells its CSB ports it is
//! going to sleep and waits in epoll for kicks, control connections and
//! moderation timers.

pub mod bridge;
pub mod memif;
pub mod pktgen;
pub mod ports;

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ring::control::{Conn, Listener, Request};
use ring::device::{DevicePort, FrameRef};
use rustix::event::epoll;
use serde_json::{json, Value};

use bridge::{Mac, MacTable};
pub use ports::{Counters, EchoPort, GenPort, Port, RingPort, SinkPort, TapPort};

/// Frames taken from one port per pass.
pub const BATCH: u32 = 256;
const FLOOD: u16 = u16::MAX;
const DROP: u16 = u16::MAX - 1;
/// The most ports one switch serves.
pub const MAX_PORTS: usize = 1024;
/// The longest `poll_us` and `memif_moderation_us` a switch takes, from
/// its file or the command line: one second.
pub const MAX_INTERVAL_US: u64 = 1_000_000;
/// While busy (or idle with only polled ports), the switch looks for events
/// (kicks, control messages) at least this often.
const BUSY_EPOLL_EVERY: Duration = Duration::from_micros(10);

/// Errors starting the switch or adding a port.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The epoll instance the switch sleeps in could not be created.
    #[error("creating the switch's epoll instance")]
    Epoll(#[source] std::io::Error),
    /// A descriptor could not be added to the switch's epoll instance.
    #[error("watching a descriptor in epoll")]
    Watch(#[source] std::io::Error),
    /// The control socket could not be bound.
    #[error("control socket {}", path.display())]
    Control {
        /// The socket path.
        path: PathBuf,
        /// Why.
        #[source]
        source: ring::Error,
    },
    /// The memif socket could not be bound.
    #[error(transparent)]
    Memif(#[from] memif::Error),
    /// Port names are unique.
    #[error("a port named {0:?} exists")]
    PortExists(String),
    /// All [`MAX_PORTS`] ports are in use.
    #[error("too many ports (at most {MAX_PORTS})")]
    TooManyPorts,
}

/// Errors loading the switch's TOML file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("reading switch settings {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML, or has unknown keys or wrong types.
    #[error("{}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// What and where, as the TOML parser says.
        #[source]
        source: toml::de::Error,
    },
    /// `poll_us` is above one second.
    #[error("{}: poll_us and memif_moderation_us must be at most 1000000", path.display())]
    PollUs {
        /// The file.
        path: PathBuf,
    },
    /// `aging_s` is zero.
    #[error("{}: aging_s must be at least 1", path.display())]
    AgingS {
        /// The file.
        path: PathBuf,
    },
}

/// Why the switch refused a port asked for on the control socket (the text
/// goes back in the reply).
#[derive(Debug, thiserror::Error)]
enum AttachError {
    #[error("port name must be 1..=64 bytes")]
    Name,
    #[error("this connection already owns a port")]
    SecondPort,
    #[error("itr {0} is out of range 0..=65535")]
    Itr(u32),
    #[error("creating the port")]
    Device(#[source] ring::Error),
    #[error("handing out the port's descriptors")]
    DriverFds(#[source] ring::Error),
    #[error(transparent)]
    Switch(#[from] Error),
}

/// An error and its sources as one line, `outer: inner: ...` (a source whose
/// text its parent already ends with is not repeated).
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(src) = cur {
        let t = src.to_string();
        if !s.ends_with(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        cur = src.source();
    }
    s
}

/// The switch's epoll instance: every descriptor it watches carries a token.
struct Poller(OwnedFd);

impl Poller {
    fn new() -> std::io::Result<Poller> {
        Ok(Poller(epoll::create(epoll::CreateFlags::CLOEXEC)?))
    }

    fn watch(&self, fd: BorrowedFd<'_>, token: u64) -> Result<(), Error> {
        epoll::add(
            &self.0,
            fd,
            epoll::EventData::new_u64(token),
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

/// Switch settings.
#[derive(Clone, Debug)]
pub struct Config {
    /// Control socket (attach, status); none: no outside ports.
    pub socket: Option<PathBuf>,
    /// memif server socket; none: no memif.
    pub memif_socket: Option<PathBuf>,
    /// Keep polling this long after the last work before sleeping.
    pub poll_us: u64,
    /// Forget a MAC address not seen for this long.
    pub aging: Duration,
    /// Addresses learned at most (beyond: flood).
    pub max_macs: usize,
    /// Log ports as they come and go.
    pub log_ports: bool,
    /// memif interrupt moderation (zero: off). Off, a memif client
    /// signals the switch after every burst it sends once the switch has
    /// gone to sleep. On, a sleeping switch masks those interrupts and looks
    /// at its memif rings again this long after it fell asleep, so a busy
    /// client fills a batch instead of waking it per burst; after
    /// [`memif::QUIET_WAKES`] empty looks in a row it unmasks them and
    /// sleeps until one comes. For a switch that shares its core with the
    /// peers it serves: a wake-up per burst there preempts the sender it is
    /// waiting for.
    pub memif_moderation: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            socket: None,
            memif_socket: None,
            poll_us: 20,
            aging: Duration::from_secs(300),
            max_macs: 65536,
            log_ports: true,
            memif_moderation: Duration::ZERO,
        }
    }
}

/// Switch-wide counters.
#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
pub struct SwitchStats {
    /// Frames delivered to at least one port.
    pub forwarded: u64,
    /// Frames sent to every port (unknown or group destination).
    pub flooded: u64,
    /// Frames shorter than an Ethernet header.
    pub runts: u64,
    /// Frames whose destination is the port they came from.
    pub same_port: u64,
    /// Frames no port received (flooded with no other port, or all full).
    pub no_destination: u64,
    /// Batches forwarded (one per port with frames, per pass).
    pub batches: u64,
    /// Times the switch slept in epoll.
    pub sleeps: u64,
    /// Passes over the ports (each looks at every port once).
    pub passes: u64,
    /// Passes that found no frames anywhere (polling while idle).
    pub idle_passes: u64,
    /// Wall-clock nanoseconds spent in passes that found frames (the
    /// forwarding itself; idle polling and sleeping excluded).
    pub busy_ns: u64,
}

const TOK_LISTEN: u64 = 1 << 40;
const TOK_CONN: u64 = 2 << 40;
const TOK_PORT: u64 = 3 << 40;
const TOK_MEMIF_LISTEN: u64 = 4 << 40;
const TOK_MEMIF_CONN: u64 = 5 << 40;
const TOK_MASK: u64 = 0xff << 40;

struct Slot {
    port: Box<dyn Port>,
    /// Control connection that owns the port (closing it detaches).
    conn: Option<u32>,
}

/// The switch.
pub struct Switch {
    ports: Vec<Option<Slot>>,
    macs: MacTable,
    poller: Poller,
    listener: Option<Listener>,
    memif: Option<memif::Server>,
    conns: HashMap<u32, Conn>,
    next_conn: u32,
    cfg: Config,
    /// Switch-wide counters.
    pub stats: SwitchStats,
    frames: Vec<FrameRef>,
    dst: Vec<u16>,
    last_aging: Instant,
}

impl Switch {
    /// A switch with no ports, listening on the sockets `cfg` names.
    pub fn new(cfg: Config) -> Result<Switch, Error> {
        let mut sw = Switch {
            ports: Vec::new(),
            macs: MacTable::new(cfg.aging, cfg.max_macs),
            poller: Poller::new().map_err(Error::Epoll)?,
            listener: None,
            memif: None,
            conns: HashMap::new(),
            next_conn: 0,
            stats: SwitchStats::default(),
            frames: Vec::with_capacity(BATCH as usize),
            dst: Vec::with_capacity(BATCH as usize),
            last_aging: Instant::now(),
            cfg: cfg.clone(),
        };
        if let Some(p) = &cfg.socket {
            let l = Listener::bind(p).map_err(|source| Error::Control {
                path: p.clone(),
                source,
            })?;
            sw.poller.watch(l.as_fd(), TOK_LISTEN)?;
            sw.listener = Some(l);
        }
        if let Some(p) = &cfg.memif_socket {
            let m = memif::Server::bind(p)?;
            sw.poller.watch(m.listen_fd(), TOK_MEMIF_LISTEN)?;
            sw.memif = Some(m);
        }
        Ok(sw)
    }

    /// Add a port; returns its index.
    pub fn add_port(&mut self, port: Box<dyn Port>) -> Result<u16, Error> {
        self.add_owned(port, None)
    }

    fn add_owned(&mut self, port: Box<dyn Port>, conn: Option<u32>) -> Result<u16, Error> {
        if self.find(port.name()).is_some() {
            return Err(Error::PortExists(port.name().to_string()));
        }
        let idx = match self.ports.iter().position(|p| p.is_none()) {
            Some(i) => i,
            None if self.ports.len() < MAX_PORTS => {
                self.ports.push(None);
                self.ports.len() - 1
            }
            None => return Err(Error::TooManyPorts),
        };
        if let Some(fd) = port.fd() {
            self.poller.watch(fd, TOK_PORT | idx as u64)?;
        }
        if self.cfg.log_ports {
            tracing::info!(port = port.name(), kind = port.kind(), "port attached");
        }
        self.ports[idx] = Some(Slot { port, conn });
        Ok(idx as u16)
    }

    /// Remove a port; its addresses are forgotten.
    pub fn remove_port(&mut self, idx: u16) -> Option<Box<dyn Port>> {
        let slot = self.ports.get_mut(idx as usize)?.take()?;
        if let Some(fd) = slot.port.fd() {
            self.poller.unwatch(fd);
        }
        self.macs.forget_port(idx);
        if self.cfg.log_ports {
            tracing::info!(port = slot.port.name(), "port detached");
        }
        Some(slot.port)
    }

    /// The index of the port named `name`.
    pub fn find(&self, name: &str) -> Option<u16> {
        self.ports
            .iter()
            .position(|p| p.as_ref().is_some_and(|s| s.port.name() == name))
            .map(|i| i as u16)
    }

    /// The port at `idx`, if there is one.
    pub fn port_mut(&mut self, idx: u16) -> Option<&mut dyn Port> {
        match self.ports.get_mut(idx as usize) {
            Some(Some(s)) => Some(s.port.as_mut()),
            _ => None,
        }
    }

    /// Forward one batch from port `s`; returns frames taken.
    fn forward(&mut self, s: usize, now: Instant) -> usize {
        self.frames.clear();
        self.dst.clear();
        let token = {
            let Some(Some(src)) = self.ports.get_mut(s) else {
                return 0;
            };
            src.port.rx(BATCH, &mut self.frames)
        };
        let n = self.frames.len();
        // Lookup pass. The frames' first bytes were written by another core:
        // start fetching them a few frames ahead of reading their addresses.
        const AHEAD: usize = 8;
        for f in self.frames.iter().take(AHEAD) {
            ring::device::prefetch(f.ptr);
        }
        let mut flood = false;
        // All frames to one unicast port (bulk traffic): one batched copy.
        let mut uniform: Option<u16> = None;
        let mut mixed = false;
        // Bulk traffic repeats its addresses: remember the last pair so a
        // batch of one flow costs one learn and one lookup, not one per frame.
        let mut last_src: Option<Mac> = None;
        let mut last_dst: Option<(Mac, u16)> = None;
        for i in 0..n {
            if let Some(a) = self.frames.get(i + AHEAD) {
                ring::device::prefetch(a.ptr);
            }
            let f = self.frames[i];
            if f.len < 14 {
                self.stats.runts += 1;
                self.dst.push(DROP);
                mixed = true;
                continue;
            }
            let mut hdr = [0u8; 12];
            // SAFETY: the port guarantees f.ptr is readable for f.len >= 14
            // bytes until rx_done; we copy the addresses out once.
            unsafe { std::ptr::copy_nonoverlapping(f.ptr, hdr.as_mut_ptr(), 12) };
            let dmac: Mac = hdr[..6].try_into().expect("6 bytes");
            let smac: Mac = hdr[6..].try_into().expect("6 bytes");
            if last_src != Some(smac) {
                self.macs.learn(smac, s as u16, now);
                last_src = Some(smac);
            }
            let d = match last_dst {
                Some((m, d)) if m == dmac => d,
                _ => {
                    let d = if dmac[0] & 1 != 0 {
                        FLOOD
                    } else {
                        self.macs.lookup(&dmac, now).unwrap_or(FLOOD)
                    };
                    last_dst = Some((dmac, d));
                    d
                }
            };
            let d = if d == s as u16 {
                self.stats.same_port += 1;
                DROP
            } else {
                d
            };
            flood |= d == FLOOD;
            match uniform {
                None if i == 0 => uniform = Some(d),
                Some(u) if u == d => {}
                _ => mixed = true,
            }
            self.dst.push(d);
        }
        let mut any_unicast_ok = 0u64;
        let mut delivered = vec![false; 0];
        // A flooded batch with one other port to reach: that port is its
        // only destination (two-port switches with unlearned addresses).
        let mut flood_single: Option<u64> = None;
        if uniform == Some(FLOOD) && !mixed {
            let mut others = self
                .ports
                .iter()
                .enumerate()
                .filter(|(p, slot)| {
                    *p != s && slot.as_ref().is_some_and(|x| x.port.broken().is_none())
                })
                .map(|(p, _)| p);
            if let (Some(p), None) = (others.next(), others.next()) {
                if let Some(Some(dst)) = self.ports.get_mut(p) {
                    // SAFETY: the frames are valid until the source's
                    // rx_done below.
                    flood_single = Some(unsafe { dst.port.tx_batch(&self.frames) });
                    dst.port.tx_flush(now);
                }
            }
        }
        match uniform {
            _ if flood_single.is_some() => {}
            // The common case: the whole batch goes to one port.
            Some(d) if !mixed && d != FLOOD && d != DROP => {
                if let Some(Some(dst)) = self.ports.get_mut(d as usize) {
                    if dst.port.broken().is_none() {
                        // SAFETY: the frames are valid until the source's
                        // rx_done below.
                        any_unicast_ok = unsafe { dst.port.tx_batch(&self.frames) };
                        dst.port.tx_flush(now);
                    }
                }
            }
            _ => {
                // One pass per destination.
                if flood {
                    delivered = vec![false; n];
                }
                for p in 0..self.ports.len() {
                    if p == s {
                        continue;
                    }
                    let Some(Some(dst)) = self.ports.get_mut(p) else {
                        continue;
                    };
                    if dst.port.broken().is_some() {
                        continue;
                    }
                    let mut touched = false;
                    for (i, f) in self.frames.iter().enumerate() {
                        let d = self.dst[i];
                        if d == p as u16 || d == FLOOD {
                            touched = true;
                            // SAFETY: f is valid until the source's rx_done below.
                            let ok = unsafe { dst.port.tx(*f) };
                            if d == FLOOD {
                                delivered[i] |= ok;
                            } else if ok {
                                any_unicast_ok += 1;
                            }
                        }
                    }
                    if touched {
                        dst.port.tx_flush(now);
                    }
                }
            }
        }
        let mut flooded = 0;
        let mut lost = 0;
        if let Some(ok) = flood_single {
            flooded = n as u64;
            lost = n as u64 - ok;
        }
        for (i, &d) in self.dst.iter().enumerate() {
            if flood_single.is_some() {
                break;
            }
            if d == FLOOD {
                flooded += 1;
                if !delivered[i] {
                    lost += 1;
                }
            } else if d != DROP && self.ports.get(d as usize).is_none_or(|p| p.is_none()) {
                lost += 1;
            }
        }
        self.stats.forwarded += any_unicast_ok + (flooded - lost.min(flooded));
        self.stats.flooded += flooded;
        self.stats.no_destination += lost;
        self.stats.batches += 1;
        if let Some(Some(src)) = self.ports.get_mut(s) {
            src.port.rx_done(token, n as u64, now);
        }
        n
    }

    /// Run until `stop` is set. `status_flag` (SIGUSR1) prints status.
    pub fn run(&mut self, stop: &AtomicBool, status_flag: Option<&AtomicBool>) {
        let mut idle_since: Option<Instant> = None;
        let mut last_epoll = Instant::now();
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; 64];
        while !stop.load(Ordering::Relaxed) {
            let now = Instant::now();
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
                self.macs.age(now);
                self.last_aging = now;
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
                let tok = ev.u64;
                let idx = (tok & !TOK_MASK) as u32;
                match tok & TOK_MASK {
                    TOK_PORT => {
                        if let Some(Some(p)) = self.ports.get_mut(idx as usize) {
                            p.port.on_event();
                        }
                    }
                    TOK_LISTEN => self.accept(),
                    TOK_CONN => self.serve_conn(idx),
                    TOK_MEMIF_LISTEN => self.memif_accept(),
                    TOK_MEMIF_CONN => self.memif_serve(idx),
                    _ => {}
                }
            }
        }
    }

    fn accept(&mut self) {
        while let Some(c) = self.listener.as_ref().and_then(|l| l.accept()) {
            let id = self.next_conn;
            self.next_conn = self.next_conn.wrapping_add(1) & 0xff_ffff; // memif owners count down from u32::MAX
            if self.poller.watch(c.as_fd(), TOK_CONN | id as u64).is_ok() {
                self.conns.insert(id, c);
            }
        }
    }

    fn serve_conn(&mut self, id: u32) {
        let Some(conn) = self.conns.get(&id) else {
            return;
        };
        let msg = match conn.recv() {
            Ok(Some((m, _fds))) => m,
            Ok(None) | Err(_) => return self.drop_conn(id),
        };
        let reply = match serde_json::from_slice::<Request>(&msg) {
            Err(e) => (
                json!({"ok": false, "error": format!("bad request: {e}")}),
                vec![],
            ),
            Ok(Request::Status) => {
                let mut v = self.status();
                v["ok"] = json!(true);
                (v, vec![])
            }
            Ok(Request::Attach(req)) => match self.attach(id, &req) {
                Ok((v, fds)) => (v, fds),
                Err(e) => (json!({"ok": false, "error": chain(&e)}), vec![]),
            },
        };
        let fds: Vec<BorrowedFd<'_>> = reply.1.iter().map(|f| f.as_fd()).collect();
        let bytes = serde_json::to_vec(&reply.0).unwrap_or_default();
        if let Some(conn) = self.conns.get(&id) {
            if ring::control::send_fds(conn.as_fd(), &bytes, &fds).is_err() {
                self.drop_conn(id);
            }
        }
    }

    fn attach(
        &mut self,
        conn: u32,
        req: &ring::control::AttachRequest,
    ) -> Result<(Value, Vec<OwnedFd>), AttachError> {
        if req.name.is_empty() || req.name.len() > 64 {
            return Err(AttachError::Name);
        }
        if self.ports.iter().flatten().any(|p| p.conn == Some(conn)) {
            return Err(AttachError::SecondPort);
        }
        if req.itr > 65535 {
            return Err(AttachError::Itr(req.itr));
        }
        let dev = DevicePort::create(&req.name, req.geometry(), req.mode, req.itr)
            .map_err(AttachError::Device)?;
        let fds = dev.driver_fds().map_err(AttachError::DriverFds)?;
        let port = RingPort {
            name: req.name.clone(),
            dev,
            c: Counters::default(),
        };
        let idx = self.add_owned(Box::new(port), Some(conn))?;
        Ok((
            json!({"ok": true, "port": idx, "name": req.name, "slots": req.slots, "buf_size": req.buf_size}),
            fds.into(),
        ))
    }

    fn drop_conn(&mut self, id: u32) {
        if let Some(c) = self.conns.remove(&id) {
            self.poller.unwatch(c.as_fd());
        }
        self.remove_owned(id);
    }

    /// Remove every port the connection `owner` brought.
    fn remove_owned(&mut self, owner: u32) {
        let owned: Vec<u16> = self
            .ports
            .iter()
            .enumerate()
            .filter(|(_, p)| p.as_ref().is_some_and(|s| s.conn == Some(owner)))
            .map(|(i, _)| i as u16)
            .collect();
        for i in owned {
            self.remove_port(i);
        }
    }

    fn memif_accept(&mut self) {
        if let Some(m) = self.memif.as_mut() {
            while let Some((id, fd)) = m.accept() {
                let _ = self.poller.watch(fd, TOK_MEMIF_CONN | id as u64);
            }
        }
    }

    fn memif_serve(&mut self, id: u32) {
        let Some(m) = self.memif.as_mut() else {
            return;
        };
        match m.serve(id) {
            memif::Event::None => {}
            memif::Event::Connected(mut port) => {
                port.set_moderation(self.cfg.memif_moderation);
                if let Err(e) = self.add_owned(port, Some(u32::MAX - id)) {
                    tracing::warn!("memif port refused: {}", chain(&e));
                    if let Some(fd) = self.memif.as_mut().and_then(|m| m.close(id)) {
                        self.poller.unwatch(fd.as_fd());
                    }
                }
            }
            memif::Event::Closed(fd) => {
                self.poller.unwatch(fd.as_fd());
                self.remove_owned(u32::MAX - id);
            }
        }
    }

    /// The status document (also the control socket's `status` reply).
    pub fn status(&mut self) -> Value {
        let mut ports = Vec::new();
        for (i, p) in self.ports.iter_mut().enumerate() {
            if let Some(s) = p {
                let c = *s.port.counters();
                ports.push(json!({
                    "index": i,
                    "name": s.port.name(),
                    "kind": s.port.kind(),
                    "from_port": c.from_port,
                    "to_port": c.to_port,
                    "to_port_bytes": c.to_port_bytes,
                    "dropped_full": c.dropped_full,
                    "detail": s.port.status(),
                }));
            }
        }
        json!({
            "switch": self.stats,
            "macs": self.macs.len(),
            "ports": ports,
        })
    }

    /// The control socket's path, if it has one.
    pub fn socket_path(&self) -> Option<&Path> {
        self.cfg.socket.as_deref()
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

/// The switch's TOML file (every key optional; unknown keys are errors).
///
/// ```toml
/// socket = "/run/fastpath/switch.sock"   # control socket (attach, status)
/// memif_socket = "/run/fastpath/memif.sock"
/// taps = ["fptap0"]                      # TAP ports to create
/// poll_us = 20                           # poll this long before sleeping
/// memif_moderation_us = 0                # > 0: memif interrupt moderation
/// aging_s = 300                          # MAC aging
/// max_macs = 65536
/// ```
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// Control socket (attach, status).
    pub socket: Option<PathBuf>,
    /// memif server socket.
    pub memif_socket: Option<PathBuf>,
    /// TAP ports to create (or open).
    #[serde(default)]
    pub taps: Vec<String>,
    /// Keep polling this long (microseconds) before sleeping; at most 1 s.
    pub poll_us: Option<u64>,
    /// memif interrupt moderation in microseconds (0: off); at most 1 s.
    pub memif_moderation_us: Option<u64>,
    /// MAC aging in seconds; at least 1.
    pub aging_s: Option<u64>,
    /// Addresses learned at most.
    pub max_macs: Option<usize>,
}

impl FileConfig {
    /// Read and check a settings file.
    pub fn load(path: &Path) -> Result<FileConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let c: FileConfig = toml::from_str(&text).map_err(|source| ConfigError::Parse {
            path: path.to_path_buf(),
            source,
        })?;
        if c.poll_us.is_some_and(|p| p > MAX_INTERVAL_US)
            || c.memif_moderation_us.is_some_and(|p| p > MAX_INTERVAL_US)
        {
            return Err(ConfigError::PollUs {
                path: path.to_path_buf(),
            });
        }
        if c.aging_s == Some(0) {
            return Err(ConfigError::AgingS {
                path: path.to_path_buf(),
            });
        }
        Ok(c)
    }

    /// Overlay onto defaults.
    pub fn config(&self) -> Config {
        let d = Config::default();
        Config {
            socket: self.socket.clone(),
            memif_socket: self.memif_socket.clone(),
            poll_us: self.poll_us.unwrap_or(d.poll_us),
            aging: self.aging_s.map(Duration::from_secs).unwrap_or(d.aging),
            max_macs: self.max_macs.unwrap_or(d.max_macs),
            log_ports: true,
            memif_moderation: self
                .memif_moderation_us
                .map(Duration::from_micros)
                .unwrap_or(d.memif_moderation),
        }
    }
}
