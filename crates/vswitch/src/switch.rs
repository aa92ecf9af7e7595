//! The switch core: the port slots, the MAC table (with the addresses
//! locked ports pin), the forwarding pass, and the status document (whole,
//! or in pages that fit one control message). The loop that drives it is
//! [`crate::EventLoop`]; ports come from [`crate::ports`]. The switch knows
//! ports only through [`Port`]; it watches no descriptor and serves no
//! socket (the event loop does both).

use std::path::{Path, PathBuf};
use std::time::Instant;

use ring::device::FrameRef;

use crate::bridge::{Mac, MacTable};
use crate::offload::{self, Gso, Offload};
use crate::ports::{vhost, Port};
pub use crate::status::SwitchStats;
use crate::status::{PortStatus, Status};
use crate::Config;

/// Frames taken from one port per pass.
pub const BATCH: u32 = 256;
const FLOOD: u16 = u16::MAX;
const DROP: u16 = u16::MAX - 1;
/// The most ports one switch serves.
pub const MAX_PORTS: usize = 1024;
pub use crate::budgets::{SPOOF_HOLD_MAX, SPOOF_HOLD_PER_FRAME};
/// Bytes of port entries in one page of the status document: a page and
/// the switch-wide part stay well inside one control message
/// ([`ring::control::MAX_MSG`], 64 KiB), however many ports there are.
pub const STATUS_PAGE_BYTES: usize = 48 * 1024;

/// Errors starting the switch or adding a port.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The epoll instance the switch sleeps in could not be created.
    #[error("creating the switch's epoll instance")]
    Epoll(#[source] std::io::Error),
    /// Interrupts could not be raised without blocking: without its
    /// io_uring, a peer that makes its line blocking could stop the switch.
    #[error("the switch cannot start: {0} (is io_uring disabled by kernel.io_uring_disabled or a seccomp filter?)")]
    Signals(#[from] ring::signaller::Unavailable),
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
    Memif(#[from] crate::ports::memif::Error),
    /// Port names are unique.
    #[error("a port named {0:?} exists")]
    PortExists(String),
    /// All [`MAX_PORTS`] ports are in use.
    #[error("too many ports (at most {MAX_PORTS})")]
    TooManyPorts,
    /// A port asked to be locked to an address another port is locked to.
    #[error(
        "port {port:?}: address {} is locked to port {owner:?}",
        crate::bridge::mac_text(mac)
    )]
    MacTaken {
        /// The port that asked.
        port: String,
        /// The address.
        mac: Mac,
        /// The port it is locked to.
        owner: String,
    },
    /// A vhost-user port from the configuration could not be made.
    #[error(transparent)]
    Vhost(#[from] vhost::Error),
}

/// Which connection brought a port: the index of its server in the event
/// loop's list and the connection's id there. The port goes when the
/// connection closes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Owner {
    /// The server's index.
    pub(crate) server: u8,
    /// The connection's id on that server.
    pub(crate) conn: u32,
}

/// A port and the connection that brought it, if one did.
pub(crate) struct Slot {
    pub(crate) port: Box<dyn Port>,
    /// The connection that owns the port (closing it detaches).
    pub(crate) owner: Option<Owner>,
    /// The only source address the port may use ([`Port::locked_mac`]).
    pub(crate) lock: Option<Mac>,
    /// Until when the port is held back for frames port security refused
    /// ([`SPOOF_HOLD_PER_FRAME`]).
    pub(crate) held_until: Option<Instant>,
    /// Time it was held back so, nanoseconds.
    pub(crate) spoof_held_ns: u64,
    /// Its adaptive polling window (the event loop's).
    pub(crate) poll: crate::polling::Window,
}

/// How a looked-up batch can be delivered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Route {
    /// No frame goes anywhere (all dropped, or none left).
    Nowhere,
    /// Every frame to this one port.
    One(u16),
    /// Every frame flooded.
    Flood,
    /// Anything else: several destinations, or frames dropped; `flood`:
    /// some frame is flooded.
    Mixed { flood: bool },
}

/// What a delivery step did with a batch.
#[derive(Clone, Copy, Debug, Default)]
struct Delivery {
    /// Unicast frames a destination took.
    unicast_ok: u64,
    /// Frames flooded.
    flooded: u64,
    /// Frames no port took: floods nobody took, and unicast frames whose
    /// port went away.
    lost: u64,
}

/// The switch's buffers for finishing a frame with offloads in software.
struct Finish<'a> {
    scratch: &'a mut Vec<u8>,
    out: &'a mut Vec<u8>,
    lens: &'a mut Vec<u32>,
    stats: &'a mut SwitchStats,
}

impl Finish<'_> {
    /// Hand `f`, described by `o`, to `port`: whole if the port takes it
    /// so, else segmented or with its checksum completed here, from the
    /// switch's own copy. True if the port took all of it.
    ///
    /// # Safety
    /// `f` must be readable for `f.len` bytes.
    unsafe fn deliver(&mut self, port: &mut dyn Port, f: FrameRef, o: &Offload) -> bool {
        if port.offload_caps().accepts(o) {
            // SAFETY: forwarded from the caller's contract.
            return unsafe { port.tx_offload(f, o) };
        }
        let len = f.len as usize;
        self.scratch.resize(len, 0);
        // SAFETY: the caller guarantees f.ptr is readable for f.len bytes;
        // scratch is the switch's own buffer of that length.
        unsafe { ring::device::copy_frame(f.ptr, self.scratch.as_mut_ptr(), len) };
        self.out.clear();
        self.lens.clear();
        if o.gso != Gso::None {
            if offload::segment(self.scratch, o, self.out, self.lens) == 0 {
                return false;
            }
            self.stats.segmented += 1;
        } else {
            self.out.extend_from_slice(self.scratch);
            offload::complete_csum(self.out, o);
            self.lens.push(f.len);
            self.stats.checksummed += 1;
        }
        let mut at = 0usize;
        let mut all = true;
        for &l in self.lens.iter() {
            let piece = FrameRef {
                ptr: self.out[at..].as_ptr(),
                len: l,
            };
            at += l as usize;
            // SAFETY: the piece lies in `out`, the switch's own buffer,
            // which is not touched until the port has copied it.
            all &= unsafe { port.tx(piece) };
        }
        all
    }
}

/// The switch.
pub struct Switch {
    pub(crate) ports: Vec<Option<Slot>>,
    macs: MacTable,
    pub(crate) cfg: Config,
    /// Switch-wide counters.
    pub stats: SwitchStats,
    frames: Vec<FrameRef>,
    dst: Vec<u16>,
    /// Per flooded frame of a batch: whether some port took it.
    delivered: Vec<bool>,
    /// The switch's own copies of a batch that port security checks
    /// ([`Switch::own_frames`]); it only grows, and only before `frames`
    /// points into it.
    copies: Vec<u8>,
    /// Each frame's offload metadata, beside `frames`, when the batch has
    /// any (empty otherwise: frames without offloads cost nothing).
    meta: Vec<Offload>,
    /// A frame with offloads copied out of its port before it is finished
    /// for a destination that cannot take it unfinished.
    scratch: Vec<u8>,
    /// The finished frames (segments, or the frame with its checksum).
    finished: Vec<u8>,
    /// Their lengths.
    finished_lens: Vec<u32>,
    pub(crate) last_aging: Instant,
}

impl Switch {
    /// A switch with the vhost-user ports `cfg` lists (each listening on
    /// its own socket for QEMU). The control and memif sockets `cfg` names
    /// are bound by the [`crate::EventLoop`] that drives it.
    pub fn new(cfg: Config) -> Result<Switch, Error> {
        let vms = cfg.vhost_user.clone();
        let mut sw = Switch {
            ports: Vec::new(),
            macs: MacTable::new(cfg.aging, cfg.max_macs),
            stats: SwitchStats::default(),
            frames: Vec::with_capacity(BATCH as usize),
            dst: Vec::with_capacity(BATCH as usize),
            delivered: Vec::with_capacity(BATCH as usize),
            copies: Vec::new(),
            meta: Vec::new(),
            scratch: Vec::new(),
            finished: Vec::new(),
            finished_lens: Vec::new(),
            last_aging: Instant::now(),
            cfg,
        };
        for v in vms {
            sw.add_port(Box::new(vhost::VhostPort::bind(v)?))?;
        }
        Ok(sw)
    }

    /// Add a port; returns its index. While an [`crate::EventLoop`] drives
    /// the switch, add ports through it instead, so that it watches their
    /// descriptors.
    pub fn add_port(&mut self, port: Box<dyn Port>) -> Result<u16, Error> {
        self.add_owned(port, None)
    }

    /// Add a port that connection `owner` brought (none: the caller's);
    /// returns its index.
    pub(crate) fn add_owned(
        &mut self,
        port: Box<dyn Port>,
        owner: Option<Owner>,
    ) -> Result<u16, Error> {
        if self.find(port.name()).is_some() {
            return Err(Error::PortExists(port.name().to_string()));
        }
        let lock = port.locked_mac();
        if let Some(mac) = lock {
            if let Some(owner) = self.macs.pinned(&mac) {
                let owner = self
                    .ports
                    .get(owner as usize)
                    .and_then(|p| p.as_ref())
                    .map(|p| p.port.name().to_string())
                    .unwrap_or_default();
                return Err(Error::MacTaken {
                    port: port.name().to_string(),
                    mac,
                    owner,
                });
            }
        }
        let idx = match self.ports.iter().position(|p| p.is_none()) {
            Some(i) => i,
            None if self.ports.len() < MAX_PORTS => {
                self.ports.push(None);
                self.ports.len() - 1
            }
            None => return Err(Error::TooManyPorts),
        };
        if self.cfg.log_ports {
            tracing::info!(port = port.name(), kind = port.kind(), "port attached");
        }
        if let Some(mac) = lock {
            self.macs.pin(mac, idx as u16);
        }
        self.ports[idx] = Some(Slot {
            port,
            owner,
            lock,
            held_until: None,
            spoof_held_ns: 0,
            poll: crate::polling::Window::default(),
        });
        Ok(idx as u16)
    }

    /// Remove a port; its addresses are forgotten. While an
    /// [`crate::EventLoop`] drives the switch, remove ports through it
    /// instead, so that it stops watching their descriptors.
    pub fn remove_port(&mut self, idx: u16) -> Option<Box<dyn Port>> {
        let slot = self.ports.get_mut(idx as usize)?.take()?;
        self.macs.forget_port(idx);
        if self.cfg.log_ports {
            tracing::info!(port = slot.port.name(), "port detached");
        }
        Some(slot.port)
    }

    /// The indices of the ports the connection `owner` brought.
    pub(crate) fn owned_by(&self, owner: Owner) -> Vec<u16> {
        self.ports
            .iter()
            .enumerate()
            .filter(|(_, p)| p.as_ref().is_some_and(|s| s.owner == Some(owner)))
            .map(|(i, _)| i as u16)
            .collect()
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

    /// The port at `idx` as its own kind `T`, if it is one (and offers
    /// [`Port::as_any`]).
    pub fn port_as<T: 'static>(&mut self, idx: u16) -> Option<&mut T> {
        self.port_mut(idx)?.as_any()?.downcast_mut::<T>()
    }

    /// Forget addresses not seen for the aging time.
    pub(crate) fn age(&mut self, now: Instant) {
        self.macs.age(now);
        self.last_aging = now;
    }

    /// Forward a batch from every port with frames waiting; returns the
    /// frames forwarded.
    pub(crate) fn forward_all(&mut self, now: Instant) -> usize {
        let mut work = 0;
        for s in 0..self.ports.len() {
            let pending = match self.ports.get_mut(s) {
                Some(Some(p)) => {
                    // A hold that ended is forgotten, so that the event
                    // loop does not wake for it.
                    if p.held_until.is_some_and(|t| now >= t) {
                        p.held_until = None;
                    }
                    p.held_until.is_none() && p.port.broken().is_none() && p.port.pending()
                }
                _ => false,
            };
            if pending {
                work += self.forward(s, now);
            }
        }
        work
    }

    /// One pass, for a program that drives the switch step by step
    /// instead of [`crate::EventLoop::run`] (a test that plays a peer in
    /// the same thread, say, with [`crate::EventLoop::poll_events`]): a
    /// batch from every port with frames, then the timers that are due.
    /// Returns the frames forwarded.
    pub fn pass(&mut self) -> usize {
        let now = Instant::now();
        let work = self.forward_all(now);
        for p in self.ports.iter_mut().flatten() {
            p.port.timer(now);
        }
        work
    }

    /// Forward one batch from port `s`; returns frames taken. Three steps:
    /// [`Switch::receive`] the batch, [`Switch::look_up`] each frame's
    /// destination, then deliver by the strategy the destinations allow
    /// (one port, a flood with one port to reach, or one pass per port).
    fn forward(&mut self, s: usize, now: Instant) -> usize {
        let Some((token, lock)) = self.receive(s) else {
            return 0;
        };
        let n = self.frames.len();
        // Port security: only when this port is locked or some address is
        // pinned are source addresses checked. Frames whose source fails
        // the check where the peer wrote it are dropped there, without a
        // copy (a refusal holds whatever the peer writes later); the rest
        // are copied into the switch's own buffer and checked again there,
        // on the bytes that are delivered.
        let guard = lock.is_some() || self.macs.has_pins();
        let mut spoofed = 0;
        if guard {
            spoofed = self.screen(s, lock);
            self.own_frames();
        }
        let (route, refused) = self.look_up(s, lock, guard, now);
        spoofed += refused;
        // Frames with offloads are delivered one by one, each as its
        // destination can take it (whole, or finished here).
        let route = match route {
            Route::One(_) if !self.meta.is_empty() => Route::Mixed { flood: false },
            Route::Flood if !self.meta.is_empty() => Route::Mixed { flood: true },
            r => r,
        };
        let done = match route {
            Route::Nowhere => Delivery::default(),
            Route::One(d) => self.deliver_one(d, now),
            Route::Flood => match self.only_other_port(s) {
                Some(p) => self.deliver_flood_single(p, now),
                None => self.deliver_each(s, true, now),
            },
            Route::Mixed { flood } => self.deliver_each(s, flood, now),
        };
        self.stats.forwarded += done.unicast_ok + (done.flooded - done.lost.min(done.flooded));
        self.stats.flooded += done.flooded;
        self.stats.no_destination += done.lost;
        self.stats.batches += 1;
        self.stats.spoofed += spoofed;
        if let Some(Some(src)) = self.ports.get_mut(s) {
            src.port.counters().spoofed += spoofed;
            src.port.rx_done(token, n as u64, now);
            if spoofed > 0 {
                let hold = (SPOOF_HOLD_PER_FRAME * spoofed.min(u64::from(u32::MAX)) as u32)
                    .min(SPOOF_HOLD_MAX);
                src.held_until = Some(now + hold);
                src.spoof_held_ns += hold.as_nanos() as u64;
            }
        }
        n
    }

    /// Whether port `s` (locked to `lock`, if it is) may send from `smac`.
    #[inline]
    fn source_allowed(&self, s: usize, lock: Option<Mac>, smac: &Mac) -> bool {
        match lock {
            Some(m) => m == *smac,
            None => self.macs.pinned(smac).is_none_or(|p| p == s as u16),
        }
    }

    /// Drop from the batch the frames whose source address port `s` may
    /// not use, read where the peer wrote them: six bytes each, no copy.
    /// Returns how many were dropped. A frame that passes here may still
    /// be refused on the switch's copy ([`Switch::look_up`]).
    fn screen(&mut self, s: usize, lock: Option<Mac>) -> u64 {
        let before = self.frames.len();
        let mut last: Option<(Mac, bool)> = None;
        let mut kept = 0;
        for i in 0..before {
            let f = self.frames[i];
            let keep = if f.len < 14 {
                // A runt: look_up counts it.
                true
            } else {
                let mut smac: Mac = [0; 6];
                // SAFETY: the port guarantees f.ptr is readable for f.len
                // >= 14 bytes until rx_done; bytes 6..12 are copied out
                // once.
                unsafe { std::ptr::copy_nonoverlapping(f.ptr.add(6), smac.as_mut_ptr(), 6) };
                match last {
                    Some((m, ok)) if m == smac => ok,
                    _ => {
                        let ok = self.source_allowed(s, lock, &smac);
                        last = Some((smac, ok));
                        ok
                    }
                }
            };
            if keep {
                self.frames[kept] = f;
                if let Some(&m) = self.meta.get(i) {
                    self.meta[kept] = m;
                }
                kept += 1;
            }
        }
        self.frames.truncate(kept);
        if !self.meta.is_empty() {
            self.meta.truncate(kept);
        }
        (before - kept) as u64
    }

    /// Take a batch from port `s` into `frames`: the port's token for
    /// `rx_done` and the address the port is locked to. None if there is
    /// no port at `s`.
    fn receive(&mut self, s: usize) -> Option<(u32, Option<Mac>)> {
        self.frames.clear();
        self.dst.clear();
        self.meta.clear();
        let Some(Some(src)) = self.ports.get_mut(s) else {
            return None;
        };
        let token = src.port.rx(BATCH, &mut self.frames);
        let offloads = src.port.rx_offloads();
        if !offloads.is_empty() {
            self.meta.resize(self.frames.len(), Offload::default());
            for &(i, o) in offloads {
                if let Some(m) = self.meta.get_mut(i as usize) {
                    *m = o;
                }
            }
        }
        Some((token, src.lock))
    }

    /// Copy the batch out of the port's memory into the switch's own
    /// buffer, once, and point `frames` at the copies. A port's frames lie
    /// in memory its peer can write (guest memory, a shared ring or memif
    /// region) at any time: checking a frame's source address there and
    /// then copying it again to deliver it would deliver whatever the peer
    /// wrote in between. What port security checks is what is delivered.
    fn own_frames(&mut self) {
        let total: usize = self.frames.iter().map(|f| f.len as usize).sum();
        if self.copies.len() < total {
            self.copies.resize(total, 0);
        }
        let mut at = 0;
        for f in &mut self.frames {
            let len = f.len as usize;
            let dst = &mut self.copies[at..at + len];
            // SAFETY: the port guarantees f.ptr is readable for f.len bytes
            // until rx_done; dst is the switch's own buffer, f.len bytes,
            // never a port's memory.
            unsafe { ring::device::copy_frame(f.ptr, dst.as_mut_ptr(), len) };
            f.ptr = dst.as_ptr();
            at += len;
        }
    }

    /// Each frame's destination into `dst` (a port, [`FLOOD`] or [`DROP`]),
    /// learning source addresses and dropping those port security refuses;
    /// returns how the batch can be delivered and the frames refused as
    /// spoofed.
    fn look_up(&mut self, s: usize, lock: Option<Mac>, guard: bool, now: Instant) -> (Route, u64) {
        let mut src_ok = true;
        let mut spoofed = 0u64;
        let n = self.frames.len();
        // The frames' first bytes were written by another core: start
        // fetching them a few frames ahead of reading their addresses.
        const AHEAD: usize = 8;
        for f in self.frames.iter().take(AHEAD) {
            ring::device::prefetch(f.ptr);
        }
        let mut flood = false;
        // All frames to one destination (bulk traffic): one batched copy.
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
                src_ok = !guard || self.source_allowed(s, lock, &smac);
                if src_ok {
                    self.macs.learn(smac, s as u16, now);
                }
                last_src = Some(smac);
            }
            if !src_ok {
                spoofed += 1;
                self.dst.push(DROP);
                mixed = true;
                continue;
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
        let route = match uniform {
            Some(FLOOD) if !mixed => Route::Flood,
            Some(d) if !mixed && d != DROP => Route::One(d),
            _ if self.dst.iter().all(|&d| d == DROP) => Route::Nowhere,
            _ => Route::Mixed { flood },
        };
        (route, spoofed)
    }

    /// The one live port other than `s`, if there is exactly one (a
    /// flooded batch then has a single destination: two-port switches with
    /// unlearned addresses).
    fn only_other_port(&self, s: usize) -> Option<usize> {
        let mut others = self
            .ports
            .iter()
            .enumerate()
            .filter(|(p, slot)| *p != s && slot.as_ref().is_some_and(|x| x.port.broken().is_none()))
            .map(|(p, _)| p);
        match (others.next(), others.next()) {
            (Some(p), None) => Some(p),
            _ => None,
        }
    }

    /// The whole batch to port `d` (the common case): one batched copy.
    fn deliver_one(&mut self, d: u16, now: Instant) -> Delivery {
        let mut done = Delivery::default();
        match self.ports.get_mut(d as usize) {
            Some(Some(dst)) => {
                if dst.port.broken().is_none() {
                    // SAFETY: the frames are valid until the source's
                    // rx_done, after delivery.
                    done.unicast_ok = unsafe { dst.port.tx_batch(&self.frames) };
                    dst.port.tx_flush(now);
                }
            }
            // The port went away since its address was learned.
            _ => done.lost = self.frames.len() as u64,
        }
        done
    }

    /// A flooded batch to the only other port, `p`, in one batched copy.
    fn deliver_flood_single(&mut self, p: usize, now: Instant) -> Delivery {
        let n = self.frames.len() as u64;
        let mut ok = 0;
        if let Some(Some(dst)) = self.ports.get_mut(p) {
            // SAFETY: the frames are valid until the source's rx_done,
            // after delivery.
            ok = unsafe { dst.port.tx_batch(&self.frames) };
            dst.port.tx_flush(now);
        }
        Delivery {
            unicast_ok: 0,
            flooded: n,
            lost: n - ok,
        }
    }

    /// Mixed destinations: one pass over the batch per live port other
    /// than the source `s`, each frame to the ports its destination names
    /// (`flood`: some frame is flooded).
    fn deliver_each(&mut self, s: usize, flood: bool, now: Instant) -> Delivery {
        let mut done = Delivery::default();
        self.delivered.clear();
        if flood {
            self.delivered.resize(self.frames.len(), false);
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
                    let ok = match self.meta.get(i) {
                        Some(o) if *o != Offload::default() => {
                            let mut fin = Finish {
                                scratch: &mut self.scratch,
                                out: &mut self.finished,
                                lens: &mut self.finished_lens,
                                stats: &mut self.stats,
                            };
                            // SAFETY: f is valid until the source's
                            // rx_done, after delivery.
                            unsafe { fin.deliver(&mut *dst.port, *f, o) }
                        }
                        // SAFETY: f is valid until the source's rx_done,
                        // after delivery.
                        _ => unsafe { dst.port.tx(*f) },
                    };
                    if d == FLOOD {
                        self.delivered[i] |= ok;
                    } else if ok {
                        done.unicast_ok += 1;
                    }
                }
            }
            if touched {
                dst.port.tx_flush(now);
            }
        }
        for (i, &d) in self.dst.iter().enumerate() {
            if d == FLOOD {
                done.flooded += 1;
                if !self.delivered[i] {
                    done.lost += 1;
                }
            } else if d != DROP && self.ports.get(d as usize).is_none_or(|p| p.is_none()) {
                done.lost += 1;
            }
        }
        done
    }

    /// The status document: the switch's counters and every port.
    pub fn status(&mut self) -> Status {
        self.status_page(0, usize::MAX)
    }

    /// One page of the status document: the switch's counters and the
    /// ports from index `from` on, as many as fit `max_bytes` of JSON (at
    /// least one). `next` is the index to ask for next, absent on the last
    /// page. The control socket answers `status` with the page from 0 and
    /// [`STATUS_PAGE_BYTES`], so that a reply fits one message whatever the
    /// number of ports; ports that come and go between pages may be missed
    /// or seen twice, as in any paged listing.
    pub fn status_page(&mut self, from: usize, max_bytes: usize) -> Status {
        let mut ports = Vec::new();
        let mut bytes = 0usize;
        let mut next = None;
        for (i, p) in self.ports.iter_mut().enumerate().skip(from) {
            let Some(s) = p else {
                continue;
            };
            let v = port_status(i, s);
            let n = serde_json::to_vec(&v).map(|b| b.len()).unwrap_or(0) + 1;
            if !ports.is_empty() && bytes.saturating_add(n) > max_bytes {
                next = Some(i);
                break;
            }
            bytes += n;
            ports.push(v);
        }
        Status {
            switch: self.stats,
            macs: self.macs.len(),
            ports,
            next,
        }
    }

    /// The control socket's path, if it has one.
    pub fn socket_path(&self) -> Option<&Path> {
        self.cfg.socket.as_deref()
    }
}

/// One port's entry in the status document.
fn port_status(i: usize, s: &mut Slot) -> PortStatus {
    let c = *s.port.counters();
    PortStatus {
        index: i,
        name: s.port.name().to_string(),
        kind: s.port.kind().to_string(),
        from_port: c.from_port,
        to_port: c.to_port,
        to_port_bytes: c.to_port_bytes,
        dropped_full: c.dropped_full,
        spoofed: c.spoofed,
        spoof_held_us: s.spoof_held_ns / 1000,
        locked_mac: s.lock.map(|m| crate::bridge::mac_text(&m)),
        polling: crate::polling::learns(s.port.kind()).then(|| s.poll.status()),
        detail: s.port.status(),
    }
}
