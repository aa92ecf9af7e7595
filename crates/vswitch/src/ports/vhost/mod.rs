//! vhost-user ports: a virtual machine's virtio-net device, served by the
//! switch. QEMU (the frontend, a client) connects to the port's socket and
//! shares the guest's memory and the virtio rings in it; the switch takes
//! the frames the guest transmits straight from guest memory into its
//! forwarding pass and copies frames for the guest once, into the buffers
//! the guest posted, as for every other port.
//!
//! - [`mem`]: the guest's memory regions, mapped from the frontend's sealed
//!   memfds, and the checked address translations.
//! - [`control`]: the vhost-user protocol (the `vhost` crate's framing, our
//!   request handler) and the connection, driven without blocking.
//! - [`datapath`]: the split virtqueues, every guest-written index and
//!   address checked, and the paper's notification schemes.
//!
//! A [`VhostPort`] owns its listening socket, at most one frontend
//! connection, the kick eventfds, and the running [`datapath::Device`]. All
//! of them sit in the port's own epoll instance, which is the one
//! descriptor the switch watches for the port ([`Port::fd`]): the control
//! protocol runs in the switch's thread, from its event loop, between
//! forwarding passes. A frontend that leaves (or is refused) takes its
//! device with it; the port listens again, and a new frontend (QEMU
//! restarted, or reconnecting) starts afresh.
//!
//! # A switch restarted under running guests
//!
//! The guest's state lives in guest memory, not in the switch: a switch
//! that stops (or dies) and is started again on the same socket paths
//! (a stale socket file is replaced, [`::ring::sockpath`]) gets its
//! guests back when QEMU reconnects (`-chardev socket,...,reconnect-ms=N`):
//! QEMU starts each queue again at the used ring's index, which is where
//! this switch, completing in order, left nothing behind
//! ([`inflight`] says what QEMU does and why that is enough). A frontend
//! that asks for the in-flight region (`INFLIGHT_SHMFD`) gets it, and
//! the restart is checked against it. Handing the ports to a new process
//! without the reconnect gap is not built: a restart costs the guests
//! the new process's start and QEMU's reconnect interval.
//!
//! # What a frontend can still do to guest memory, and how it is contained
//!
//! Guest memory is a file descriptor the switch did not create and cannot
//! seal: the frontend keeps its own descriptor and can act on the file at
//! any time. What it can do, and what stops it:
//!
//! - **Shrink the file** (`ftruncate`) so that our next read of the lost
//!   pages faults with SIGBUS: refused up front. A region is mapped only
//!   from a memfd whose seals hold `F_SEAL_SHRINK` (checked before its size,
//!   since a size read from an unsealed file can be made false at once);
//!   QEMU's `memory-backend-memfd` seals by default. Regular files
//!   (`memory-backend-file`) cannot be sealed and are refused.
//! - **Punch holes** (`FALLOC_FL_PUNCH_HOLE`, allowed on a sealed memfd):
//!   on an ordinary (shmem) memfd the pages read as zeros again and a write
//!   allocates a page; no fault. The rings then hold zeros: an available
//!   index of 0 where the queue had consumed entries is an index that went
//!   backwards, which stops that queue ("available index jumped to 0",
//!   counted and shown in the port's status) until the frontend sets it up
//!   again; a queue that had consumed nothing sees nothing available.
//!   Harmless to the switch and to the other ports.
//! - **Back the memfd with huge pages** (`hugetlb=on`) and punch a hole: a
//!   later touch needs a fresh huge page, and with the pool exhausted that
//!   touch is SIGBUS, which would end the switch. Refused (`fstatfs` says
//!   hugetlbfs): handling SIGBUS soundly in the switch's one thread (a
//!   handler that jumps out of a copy) is not done.
//! - **Write anything into the rings and buffers at any time**, including
//!   while the switch reads them: every index and address is read once and
//!   checked before use ([`datapath`]); a frame copied while the guest
//!   rewrites it arrives garbled, which only the guest's own traffic
//!   suffers.
//! - **Replace the memory table** while running: the queues are rebuilt on
//!   the new mappings (a table that no longer holds the rings is refused and
//!   the connection closed); the old mappings go only once nothing points
//!   into them.
//!
//! A frontend that breaks a rule is disconnected with the reason in the
//! port's status (`last_close`); the switch goes on serving its other ports.

pub mod control;
pub mod datapath;
pub mod inflight;
pub mod mem;

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use crate::status::{FrontendStatus, PairStatus, PortDetail, Queues, VhostDetail};
use rustix::event::epoll;

use ::ring::device::FrameRef;
use ::ring::Mode;

use crate::bridge::{mac_text, Mac};
use crate::chain;
use crate::ports::{Counters, Port};
use control::{queues, Closed, Connection, Offer, Refusal};
pub use control::{DEFAULT_QUEUE_PAIRS, MAX_QUEUE_PAIRS};
use datapath::{is_tx, Device, Queue, QueueStats, RXQ, TXQ};

/// Errors creating a vhost-user port.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The socket could not be bound.
    #[error("vhost-user socket {}", path.display())]
    Bind {
        /// The socket path.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The port's epoll instance could not be made or filled.
    #[error("vhost-user port epoll")]
    Epoll(#[source] std::io::Error),
    /// The socket path holds something that is not the port's to replace
    /// (a live socket, or not a socket).
    #[error(transparent)]
    Path(#[from] ::ring::sockpath::SocketPathError),
}

/// How a port is set up.
#[derive(Clone, Debug)]
pub struct Config {
    /// The port's name.
    pub name: String,
    /// The socket QEMU connects to.
    pub path: PathBuf,
    /// The notification scheme.
    pub mode: Mode,
    /// Interrupt moderation of the guest's interrupts, in 250 ns units (0:
    /// off).
    pub itr: u32,
    /// Offer `EVENT_IDX`.
    pub event_idx: bool,
    /// Offer `MRG_RXBUF`.
    pub mergeable: bool,
    /// Offer the checksum and TCP segmentation offloads
    /// ([`control::OFFLOADS`]).
    pub offloads: bool,
    /// The guest's MAC, when the switch knows it (the `mac=` QEMU is
    /// given for this port's NIC).
    pub mac: Option<Mac>,
    /// Lock the port to [`Config::mac`] (port security; on by default, and
    /// only meaningful with a MAC): the guest's frames from any other
    /// source address are dropped, and no other port can take its traffic
    /// by sending from its address.
    pub port_security: bool,
    /// Queue pairs offered (1..=[`MAX_QUEUE_PAIRS`], default
    /// [`DEFAULT_QUEUE_PAIRS`]): QEMU's `queues=` may be at most this.
    pub queue_pairs: u16,
}

impl Config {
    /// A port named `name` on `path`, event-index windows (`Csb`), no
    /// moderation, every feature offered, no MAC known.
    pub fn new(name: &str, path: &Path) -> Config {
        Config {
            name: name.to_string(),
            path: path.to_path_buf(),
            mode: Mode::Csb,
            itr: 0,
            event_idx: true,
            mergeable: true,
            offloads: true,
            mac: None,
            port_security: true,
            queue_pairs: DEFAULT_QUEUE_PAIRS,
        }
    }
}

/// Tokens in the port's epoll instance.
const TOK_LISTEN: u64 = 1;
const TOK_CONN: u64 = 2;
/// Queue `i`'s kick eventfd: this plus `i`.
const TOK_KICK: u64 = 3;

/// Connection events, for the status document.
#[derive(Clone, Debug, Default)]
pub struct ConnStats {
    /// Frontends accepted.
    pub accepted: u64,
    /// Frontends turned away because one was connected.
    pub turned_away: u64,
    /// Connections that ended, and the last reason.
    pub closed: u64,
    /// Why the last connection ended.
    pub last_close: Option<String>,
    /// Devices (re)built from what the frontend set up.
    pub rebuilds: u64,
}

/// A vhost-user port.
pub struct VhostPort {
    cfg: Config,
    epoll: Arc<OwnedFd>,
    listener: UnixListener,
    conn: Option<Connection>,
    dev: Option<Device>,
    /// The frontend state's generation the device was built from.
    built: u64,
    c: Counters,
    /// Each queue's counters (`2k`: pair `k`'s receive queue, `2k + 1`
    /// its transmit queue), kept across connections.
    st: Vec<QueueStats>,
    cs: ConnStats,
    log: Vec<String>,
    /// The socket file the port made: removed when it drops, if still
    /// that file.
    _made: Option<::ring::sockpath::BoundPath>,
}

impl VhostPort {
    /// Listen on `cfg.path`: a stale socket file is replaced, a live
    /// socket or anything not a socket is refused and left as it is
    /// ([`::ring::sockpath`]); the socket is removed when the port drops,
    /// only if it is still the one the port made.
    pub fn bind(cfg: Config) -> Result<VhostPort, Error> {
        let bind = |e| Error::Bind {
            path: cfg.path.clone(),
            source: e,
        };
        ::ring::sockpath::claim(&cfg.path)?;
        let listener = UnixListener::bind(&cfg.path).map_err(bind)?;
        let made = ::ring::sockpath::BoundPath::note(&cfg.path);
        listener.set_nonblocking(true).map_err(bind)?;
        let epoll =
            epoll::create(epoll::CreateFlags::CLOEXEC).map_err(|e| Error::Epoll(e.into()))?;
        epoll::add(
            &epoll,
            listener.as_fd(),
            epoll::EventData::new_u64(TOK_LISTEN),
            epoll::EventFlags::IN,
        )
        .map_err(|e| Error::Epoll(e.into()))?;
        let cfg_pairs = cfg.queue_pairs.clamp(1, MAX_QUEUE_PAIRS);
        Ok(VhostPort {
            cfg,
            epoll: Arc::new(epoll),
            listener,
            _made: made,
            conn: None,
            dev: None,
            built: 0,
            c: Counters::default(),
            st: vec![QueueStats::default(); queues(cfg_pairs)],
            cs: ConnStats::default(),
            log: Vec::new(),
        })
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.cfg.path
    }

    /// Change the notification scheme (the running queues restart with it,
    /// where they stood).
    pub fn set_notify(&mut self, mode: Mode, itr: u32) {
        self.cfg.mode = mode;
        self.cfg.itr = itr;
        if self.dev.is_some() {
            self.sync_progress();
            self.rebuild();
        }
    }

    /// Tell the frontend state where the running queues got to, so that
    /// GET_VRING_BASE answers it and a rebuilt queue starts there.
    fn sync_progress(&self) {
        if let (Some(d), Some(conn)) = (&self.dev, &self.conn) {
            let mut f = conn.frontend();
            for (i, q) in d.queues.iter().enumerate() {
                if let Some(q) = q {
                    f.vrings[i].last_avail = q.last_avail();
                }
            }
        }
    }

    /// What the first pair's queues did (0: to the guest, 1: from the
    /// guest).
    pub fn queue_stats(&self) -> [QueueStats; 2] {
        [self.st[RXQ], self.st[TXQ]]
    }

    /// What each queue did (`2k`: pair `k` to the guest, `2k + 1`: pair
    /// `k` from the guest).
    pub fn all_queue_stats(&self) -> Vec<QueueStats> {
        self.st.clone()
    }

    /// Queue pairs offered.
    pub fn queue_pairs(&self) -> u16 {
        self.cfg.queue_pairs.clamp(1, MAX_QUEUE_PAIRS)
    }

    /// Which queues run now (enabled by the frontend and set up), by
    /// index.
    pub fn queues_running(&self) -> Vec<bool> {
        let n = self.st.len();
        match &self.dev {
            Some(d) => d
                .queues
                .iter()
                .map(|q| q.as_ref().is_some_and(|q| q.broken().is_none()))
                .collect(),
            None => vec![false; n],
        }
    }

    /// Connection events.
    pub fn conn_stats(&self) -> &ConnStats {
        &self.cs
    }

    /// The requests of the first connections, one line each.
    pub fn protocol_log(&self) -> &[String] {
        &self.log
    }

    /// Whether a frontend is connected.
    pub fn connected(&self) -> bool {
        self.conn.is_some()
    }

    /// Whether the first pair's two queues run, and no queue that runs
    /// has stopped (the other pairs run as the guest enabled them).
    pub fn running(&self) -> bool {
        self.dev.as_ref().is_some_and(|d| {
            d.queues[RXQ].is_some()
                && d.queues[TXQ].is_some()
                && d.queues.iter().flatten().all(|q| q.broken().is_none())
        })
    }

    /// The features the frontend acknowledged, if it did.
    pub fn acked_features(&self) -> Option<u64> {
        self.conn
            .as_ref()
            .and_then(|c| c.frontend().acked_features())
    }

    fn accept(&mut self) {
        loop {
            let stream = match self.listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // A failed accept (out of descriptors, say) leaves the
                    // client in the queue: try again on the next event.
                    tracing::warn!(port = %self.cfg.name, "vhost-user accept: {e}");
                    return;
                }
            };
            if let Some(c) = &self.conn {
                // One frontend per device: a second is closed at once,
                // unless the first never claimed the device and has had
                // the time a real frontend needs: then the newcomer takes
                // its place (a silent connection cannot hold the port
                // until its handshake deadline while QEMU is turned away).
                if c.evictable(Instant::now()) {
                    self.close(Closed::Evicted);
                } else {
                    self.cs.turned_away += 1;
                    continue;
                }
            }
            let offer = Offer {
                event_idx: self.cfg.event_idx,
                mergeable: self.cfg.mergeable,
                offloads: self.cfg.offloads,
                queue_pairs: self.queue_pairs(),
            };
            let c = match Connection::new(stream, offer, self.epoll.clone(), TOK_KICK) {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(port = %self.cfg.name, "vhost-user connection: {e}");
                    continue;
                }
            };
            if let Err(e) = epoll::add(
                &*self.epoll,
                c.fd(),
                epoll::EventData::new_u64(TOK_CONN),
                epoll::EventFlags::IN | epoll::EventFlags::RDHUP,
            ) {
                tracing::warn!(port = %self.cfg.name, "vhost-user connection: {e}");
                continue;
            }
            self.cs.accepted += 1;
            self.conn = Some(c);
        }
    }

    /// Serve the connection's messages, then rebuild the device if the
    /// frontend changed it.
    fn serve(&mut self, now: Instant) {
        // Where the running queues got to, for GET_VRING_BASE and for
        // restarting them where they stood (the messages may then change it).
        self.sync_progress();
        let Some(conn) = self.conn.as_mut() else {
            return;
        };
        let res = conn.serve(now, &mut self.log);
        if let Err(e) = res {
            self.close(e);
            return;
        }
        let generation = conn.frontend().generation;
        if generation != self.built {
            self.rebuild();
        }
    }

    /// Build the device again from what the frontend set up.
    fn rebuild(&mut self) {
        // What each queue had left of its descriptor budget goes on to the
        // queue built in its place.
        let mut carried = Vec::new();
        if let Some(d) = &mut self.dev {
            for (i, q) in d.queues.iter_mut().enumerate() {
                carried.push(q.as_ref().map(|q| q.credit()));
                if let Some(q) = q {
                    q.flush_held(&mut self.st[i]);
                }
            }
        }
        self.dev = None;
        let Some(conn) = &self.conn else {
            return;
        };
        let built = {
            let f = conn.frontend();
            let n = f.vrings.len();
            let setups: Vec<_> = (0..n)
                .map(|i| f.queue_setup(i, self.cfg.mode, self.cfg.itr))
                .collect();
            // The port's descriptor budget is shared among the pairs that
            // run (a pair with either queue ready counts).
            let share = (0..n / 2)
                .filter(|p| setups[2 * p].is_some() || setups[2 * p + 1].is_some())
                .count()
                .max(1) as u16;
            let mut queues: Vec<Option<Queue>> = (0..n).map(|_| None).collect();
            let mut err = None;
            for (i, (slot, setup)) in queues.iter_mut().zip(setups).enumerate() {
                if let Some((mem, mut setup)) = setup {
                    setup.share = share;
                    let dir = if is_tx(i) { "tx" } else { "rx" };
                    let name = format!("{} {dir}{}", self.cfg.name, i / 2);
                    match Queue::new(name, mem, setup) {
                        Ok(mut q) => {
                            if let Some(Some(c)) = carried.get(i) {
                                q.carry_credit(*c);
                            }
                            // A start the in-flight region refused, or one
                            // that recovered heads in flight, is counted.
                            let rec = q.recovered();
                            self.st[i].resubmitted += u64::from(rec.resubmitted);
                            if q.broken().is_some() {
                                self.st[i].broke += 1;
                            }
                            *slot = Some(q)
                        }
                        Err(source) => {
                            err = Some(Refusal::Ring { index: i, source });
                            break;
                        }
                    }
                }
            }
            match err {
                Some(e) => Err(e),
                None => Ok((f.generation, queues, f.hdr_len(), f.offloads())),
            }
        };
        match built {
            Ok((generation, queues, hdr_len, (tx, rx, mrg))) => {
                self.built = generation;
                self.cs.rebuilds += 1;
                if queues.iter().any(|q| q.is_some()) {
                    let mut d = Device::new(queues, hdr_len);
                    d.set_offloads(tx, rx, mrg);
                    self.dev = Some(d);
                }
            }
            Err(e) => self.close(Closed::Refused(e)),
        }
    }

    fn close(&mut self, why: Closed) {
        let text = chain(&why);
        tracing::info!(port = %self.cfg.name, "vhost-user frontend gone: {text}");
        if let Some(d) = &mut self.dev {
            for (i, q) in d.queues.iter_mut().enumerate() {
                if let Some(q) = q {
                    q.flush_held(&mut self.st[i]);
                }
            }
        }
        self.dev = None;
        if let Some(c) = self.conn.take() {
            let _ = epoll::delete(&*self.epoll, c.fd());
        }
        self.cs.closed += 1;
        self.cs.last_close = Some(text);
        self.built = 0;
    }

    fn drain_kicks(&mut self) {
        if let Some(c) = &self.conn {
            let f = c.frontend();
            for (i, v) in f.vrings.iter().enumerate() {
                if let Some(k) = &v.kick {
                    self.st[i].kicks += k.drain();
                }
            }
        }
    }
}

impl Port for VhostPort {
    fn name(&self) -> &str {
        &self.cfg.name
    }

    fn kind(&self) -> &'static str {
        "vhost-user"
    }

    fn fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.epoll.as_fd())
    }

    fn on_event(&mut self) {
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 8];
        // SAFETY: evs is a live, writable array of 8 events; timeout 0
        // never blocks.
        let n = unsafe {
            libc::epoll_wait(
                std::os::fd::AsRawFd::as_raw_fd(&*self.epoll),
                evs.as_mut_ptr(),
                evs.len() as libc::c_int,
                0,
            )
        };
        let now = Instant::now();
        let mut kicks = false;
        for ev in evs.iter().take(n.max(0) as usize) {
            match ev.u64 {
                TOK_LISTEN => self.accept(),
                TOK_CONN => self.serve(now),
                _ => kicks = true,
            }
        }
        if kicks {
            self.drain_kicks();
        }
    }

    fn pending(&mut self) -> bool {
        match &mut self.dev {
            Some(d) => d.pending(&mut self.st),
            None => false,
        }
    }

    fn rx(&mut self, max: u32, out: &mut Vec<FrameRef>) -> u32 {
        match &mut self.dev {
            Some(d) => d.rx(max, out, &mut self.st),
            None => 0,
        }
    }

    fn rx_offloads(&self) -> &[(u32, crate::offload::Offload)] {
        self.dev.as_ref().map_or(&[], |d| d.rx_offloads())
    }

    fn offload_caps(&self) -> crate::offload::Caps {
        self.dev
            .as_ref()
            .map_or(crate::offload::Caps::NONE, |d| d.rx_caps)
    }

    unsafe fn tx_offload(&mut self, f: FrameRef, o: &crate::offload::Offload) -> bool {
        let (ok, bytes) = match &mut self.dev {
            // SAFETY: forwarded from the caller's contract.
            Some(d) => unsafe { d.tx_offload(f, o, &mut self.st) },
            None => (0, 0),
        };
        self.c.to_port += ok;
        self.c.to_port_bytes += bytes;
        self.c.dropped_full += 1 - ok;
        ok == 1
    }

    fn rx_done(&mut self, token: u32, frames: u64, now: Instant) {
        self.c.from_port += frames;
        if let Some(d) = &mut self.dev {
            d.rx_done(token, now, &mut self.st);
        }
    }

    unsafe fn tx(&mut self, f: FrameRef) -> bool {
        // SAFETY: forwarded from the caller's contract.
        unsafe { self.tx_batch(&[f]) == 1 }
    }

    unsafe fn tx_batch(&mut self, frames: &[FrameRef]) -> u64 {
        let (ok, bytes) = match &mut self.dev {
            // SAFETY: forwarded from the caller's contract.
            Some(d) => unsafe { d.tx(frames, &mut self.st) },
            None => (0, 0),
        };
        self.c.to_port += ok;
        self.c.to_port_bytes += bytes;
        self.c.dropped_full += frames.len() as u64 - ok;
        ok
    }

    fn tx_flush(&mut self, now: Instant) {
        if let Some(d) = &mut self.dev {
            d.tx_flush(now, &mut self.st);
        }
    }

    fn deadline(&self) -> Option<Instant> {
        let d = self.dev.as_ref().and_then(|d| d.deadline());
        let c = self.conn.as_ref().and_then(|c| c.deadline());
        match (d, c) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn timer(&mut self, now: Instant) {
        if let Some(d) = &mut self.dev {
            d.timer(now, &mut self.st);
        }
        if let Some(Err(e)) = self.conn.as_ref().map(|c| c.check_partial(now)) {
            self.close(e);
        }
    }

    fn prepare_sleep(&mut self) -> bool {
        match &mut self.dev {
            Some(d) => d.prepare_sleep(&mut self.st),
            None => true,
        }
    }

    fn wake(&mut self) {
        if let Some(d) = &mut self.dev {
            d.wake();
        }
    }

    fn locked_mac(&self) -> Option<Mac> {
        self.cfg.mac.filter(|_| self.cfg.port_security)
    }

    fn as_any(&mut self) -> Option<&mut dyn std::any::Any> {
        Some(self)
    }
    fn counters(&mut self) -> &mut Counters {
        &mut self.c
    }

    fn status(&self) -> PortDetail {
        let per = |n: u64, d: u64| if d == 0 { 0.0 } else { n as f64 / d as f64 };
        // Every pair together, as the other ports count them.
        let sum = |tx: bool| {
            let mut t = QueueStats::default();
            for (i, q) in self.st.iter().enumerate() {
                if is_tx(i) == tx {
                    t.kicks += q.kicks;
                    t.calls += q.calls;
                }
            }
            t
        };
        let (rxq, txq) = (sum(false), sum(true));
        let queue = |i: usize| {
            let mut v = self.st[i].status();
            if let Some(q) = self.dev.as_ref().and_then(|d| d.queues[i].as_ref()) {
                v.size = Some(q.size());
                v.broken = q.broken().map(str::to_string);
                v.running = None;
            }
            v
        };
        let frontend = self.conn.as_ref().map(|c| {
            let f = c.frontend();
            FrontendStatus {
                features: f.acked_features().map(|x| format!("{x:#x}")),
                protocol_features: format!("{:#x}", f.acked_protocol_features()),
                event_idx: f.event_idx(),
                memory_bytes: f.memory().map(|m| m.mapped_bytes()),
                memory_regions: f.memory().map(|m| format!("{m:?}")),
                memory_seals: f.memory().map(|m| m.seals()),
                requests: c.requests,
            }
        });
        let broken = self.dev.as_ref().and_then(|d| {
            d.queues
                .iter()
                .flatten()
                .find_map(|q| q.broken().map(str::to_string))
        });
        let signals_blocked = self.dev.as_ref().map_or(0, |d| {
            d.queues
                .iter()
                .flatten()
                .filter_map(|q| q.call_line())
                .map(|l| l.blocked())
                .sum()
        });
        PortDetail::Vhost(Box::new(VhostDetail {
            socket: self.cfg.path.display().to_string(),
            mode: self.cfg.mode.to_string(),
            itr: self.cfg.itr,
            mac: self.cfg.mac.map(|m| mac_text(&m)),
            connected: self.conn.is_some(),
            running: self.running(),
            // All queues together, as the other ports count them: the
            // guest's doorbell writes, and the interrupts asked of QEMU.
            kicks: txq.kicks + rxq.kicks,
            interrupts: txq.calls + rxq.calls,
            signals_blocked,
            broken,
            frontend,
            queues: Queues {
                rx: queue(RXQ),
                tx: queue(TXQ),
            },
            queue_pairs: self.queue_pairs(),
            pairs: {
                let on = self.queues_running();
                (0..self.st.len() / 2)
                    .map(|p| PairStatus {
                        running: on[2 * p] && on[2 * p + 1],
                        queues: Queues {
                            rx: queue(2 * p),
                            tx: queue(2 * p + 1),
                        },
                    })
                    .collect()
            },
            kicks_per_packet: per(txq.kicks, self.c.from_port),
            tx_interrupts_per_packet: per(txq.calls, self.c.from_port),
            rx_interrupts_per_packet: per(rxq.calls, self.c.to_port),
            accepted: self.cs.accepted,
            turned_away: self.cs.turned_away,
            closed: self.cs.closed,
            last_close: self.cs.last_close.clone(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ::ring::sockpath::SocketPathError;
    use std::os::unix::net::UnixStream;

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("fp-vhost-bind-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn bind_refuses_a_file_or_a_live_socket_and_removes_only_its_own() {
        let d = dir("claim");
        let p = d.join("vm.sock");
        // A regular file (a disk image, a typo) is refused and kept.
        std::fs::write(&p, b"disk image").unwrap();
        let e = VhostPort::bind(Config::new("vm", &p)).err().unwrap();
        assert!(
            matches!(e, Error::Path(SocketPathError::NotSocket { .. })),
            "{e}"
        );
        assert_eq!(std::fs::read(&p).unwrap(), b"disk image");
        std::fs::remove_file(&p).unwrap();
        // A live socket (another switch's port) is refused and kept.
        let other = UnixListener::bind(&p).unwrap();
        let e = VhostPort::bind(Config::new("vm", &p)).err().unwrap();
        assert!(
            matches!(e, Error::Path(SocketPathError::Live { .. })),
            "{e}"
        );
        assert!(
            UnixStream::connect(&p).is_ok(),
            "the other socket still answers"
        );
        // Once its program is gone, the stale file is replaced.
        drop(other);
        let port = VhostPort::bind(Config::new("vm", &p)).unwrap();
        // The same path again, while the port listens: refused.
        let e = VhostPort::bind(Config::new("vm2", &p)).err().unwrap();
        assert!(
            matches!(e, Error::Path(SocketPathError::Live { .. })),
            "{e}"
        );
        drop(port);
        assert!(!p.exists(), "the port removes the socket it made");
        // A socket another program put at the path after ours stays.
        let port = VhostPort::bind(Config::new("vm", &p)).unwrap();
        std::fs::rename(&p, d.join("aside.sock")).unwrap();
        let other = UnixListener::bind(&p).unwrap();
        drop(port);
        assert!(p.exists(), "another program's socket is not removed");
        drop(other);
        let _ = std::fs::remove_dir_all(&d);
    }
}
