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
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ring::control::{Conn, Listener, Request};
use ring::device::{DevicePort, FrameRef};
use serde_json::{json, Value};

use bridge::{Mac, MacTable};
pub use ports::{Counters, EchoPort, GenPort, Port, RingPort, SinkPort, TapPort};

/// Frames taken from one port per pass.
pub const BATCH: u32 = 256;
const FLOOD: u16 = u16::MAX;
const DROP: u16 = u16::MAX - 1;
pub const MAX_PORTS: usize = 1024;

/// Switch settings.
#[derive(Clone, Debug)]
pub struct Config {
    /// Control socket (attach, status); none: no outside ports.
    pub socket: Option<PathBuf>,
    /// memif server socket; none: no memif.
    pub memif_socket: Option<PathBuf>,
    /// Keep polling this long after the last work before sleeping.
    pub poll_us: u64,
    pub aging: Duration,
    pub max_macs: usize,
    /// Log ports as they come and go.
    pub log_ports: bool,
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
        }
    }
}

/// Switch-wide counters.
#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
pub struct SwitchStats {
    pub forwarded: u64,
    pub flooded: u64,
    /// Frames shorter than an Ethernet header.
    pub runts: u64,
    /// Frames whose destination is the port they came from.
    pub same_port: u64,
    /// Frames no port received (flooded with no other port, or all full).
    pub no_destination: u64,
    pub batches: u64,
    pub sleeps: u64,
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
    epoll: OwnedFd,
    listener: Option<Listener>,
    memif: Option<memif::Server>,
    conns: HashMap<u32, Conn>,
    next_conn: u32,
    cfg: Config,
    pub stats: SwitchStats,
    frames: Vec<FrameRef>,
    dst: Vec<u16>,
    last_aging: Instant,
}

impl Switch {
    pub fn new(cfg: Config) -> std::io::Result<Switch> {
        // SAFETY: plain syscall.
        let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if ep < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut sw = Switch {
            ports: Vec::new(),
            macs: MacTable::new(cfg.aging, cfg.max_macs),
            // SAFETY: fresh descriptor.
            epoll: unsafe { OwnedFd::from_raw_fd(ep) },
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
            let l = Listener::bind(p).map_err(std::io::Error::other)?;
            sw.watch(l.fd(), TOK_LISTEN)?;
            sw.listener = Some(l);
        }
        if let Some(p) = &cfg.memif_socket {
            let m = memif::Server::bind(p)?;
            sw.watch(m.listen_fd(), TOK_MEMIF_LISTEN)?;
            sw.memif = Some(m);
        }
        Ok(sw)
    }

    fn watch(&self, fd: RawFd, token: u64) -> std::io::Result<()> {
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: token,
        };
        // SAFETY: epoll_ctl with a live event struct.
        if unsafe { libc::epoll_ctl(self.epoll.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) } < 0
        {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    fn unwatch(&self, fd: RawFd) {
        // SAFETY: epoll_ctl DEL; a stale fd only returns an error.
        unsafe {
            libc::epoll_ctl(
                self.epoll.as_raw_fd(),
                libc::EPOLL_CTL_DEL,
                fd,
                std::ptr::null_mut(),
            )
        };
    }

    /// Add a port; returns its index.
    pub fn add_port(&mut self, port: Box<dyn Port>) -> std::io::Result<u16> {
        self.add_owned(port, None)
    }

    fn add_owned(&mut self, port: Box<dyn Port>, conn: Option<u32>) -> std::io::Result<u16> {
        if self.find(port.name()).is_some() {
            return Err(std::io::Error::other(format!(
                "a port named {:?} exists",
                port.name()
            )));
        }
        let idx = match self.ports.iter().position(|p| p.is_none()) {
            Some(i) => i,
            None if self.ports.len() < MAX_PORTS => {
                self.ports.push(None);
                self.ports.len() - 1
            }
            None => return Err(std::io::Error::other("too many ports")),
        };
        if let Some(fd) = port.fd() {
            self.watch(fd, TOK_PORT | idx as u64)?;
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
            self.unwatch(fd);
        }
        self.macs.forget_port(idx);
        if self.cfg.log_ports {
            tracing::info!(port = slot.port.name(), "port detached");
        }
        Some(slot.port)
    }

    pub fn find(&self, name: &str) -> Option<u16> {
        self.ports
            .iter()
            .position(|p| p.as_ref().is_some_and(|s| s.port.name() == name))
            .map(|i| i as u16)
    }

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
        // Lookup pass.
        let mut flood = false;
        // Bulk traffic repeats its addresses: remember the last pair so a
        // batch of one flow costs one learn and one lookup, not one per frame.
        let mut last_src: Option<Mac> = None;
        let mut last_dst: Option<(Mac, u16)> = None;
        for f in &self.frames {
            if f.len < 14 {
                self.stats.runts += 1;
                self.dst.push(DROP);
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
            self.dst.push(d);
        }
        // One pass per destination.
        let mut delivered = vec![false; 0];
        if flood {
            delivered = vec![false; n];
        }
        let mut any_unicast_ok = 0u64;
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
        let mut flooded = 0;
        let mut lost = 0;
        for (i, &d) in self.dst.iter().enumerate() {
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
            let ts = libc::timespec {
                tv_sec: timeout_us / 1_000_000,
                tv_nsec: (timeout_us % 1_000_000) * 1000,
            };
            // SAFETY: events is a live array of 64 entries; ts is a live timespec.
            let n = unsafe {
                libc::epoll_pwait2(
                    self.epoll.as_raw_fd(),
                    events.as_mut_ptr(),
                    64,
                    &ts,
                    std::ptr::null(),
                )
            };
            if timeout_us > 0 {
                for p in self.ports.iter_mut().flatten() {
                    p.port.wake();
                }
            }
            for ev in events.iter().take(n.max(0) as usize) {
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
            if self.watch(c.fd(), TOK_CONN | id as u64).is_ok() {
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
                Err(e) => (json!({"ok": false, "error": e}), vec![]),
            },
        };
        let raw: Vec<RawFd> = reply.1.iter().map(|f| f.as_raw_fd()).collect();
        let bytes = serde_json::to_vec(&reply.0).unwrap_or_default();
        if let Some(conn) = self.conns.get(&id) {
            if conn.send(&bytes, &raw).is_err() {
                self.drop_conn(id);
            }
        }
    }

    fn attach(
        &mut self,
        conn: u32,
        req: &ring::control::AttachRequest,
    ) -> Result<(Value, Vec<OwnedFd>), String> {
        if req.name.is_empty() || req.name.len() > 64 {
            return Err("port name must be 1..=64 bytes".into());
        }
        if self.ports.iter().flatten().any(|p| p.conn == Some(conn)) {
            return Err("this connection already owns a port".into());
        }
        if req.itr > 65535 {
            return Err(format!("itr {} is out of range 0..=65535", req.itr));
        }
        let dev = DevicePort::create(&req.name, req.geometry(), req.mode, req.itr)
            .map_err(|e| e.to_string())?;
        let fds = dev.driver_fds().map_err(|e| e.to_string())?;
        let port = RingPort {
            name: req.name.clone(),
            dev,
            c: Counters::default(),
        };
        let idx = self
            .add_owned(Box::new(port), Some(conn))
            .map_err(|e| e.to_string())?;
        Ok((
            json!({"ok": true, "port": idx, "name": req.name, "slots": req.slots, "buf_size": req.buf_size}),
            fds.into(),
        ))
    }

    fn drop_conn(&mut self, id: u32) {
        if let Some(c) = self.conns.remove(&id) {
            self.unwatch(c.fd());
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
        let mut new = Vec::new();
        if let Some(m) = self.memif.as_mut() {
            while let Some(c) = m.accept() {
                new.push(c);
            }
        }
        for (id, fd) in new {
            let _ = self.watch(fd, TOK_MEMIF_CONN | id as u64);
        }
    }

    fn memif_serve(&mut self, id: u32) {
        let Some(m) = self.memif.as_mut() else {
            return;
        };
        match m.serve(id) {
            memif::Event::None => {}
            memif::Event::Connected(port) => {
                if let Err(e) = self.add_owned(port, Some(u32::MAX - id)) {
                    tracing::warn!("memif port refused: {e}");
                    if let Some(m) = self.memif.as_mut() {
                        if let Some(fd) = m.close(id) {
                            self.unwatch(fd);
                        }
                    }
                }
            }
            memif::Event::Closed(fd) => {
                self.unwatch(fd);
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
/// aging_s = 300                          # MAC aging
/// max_macs = 65536
/// ```
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub socket: Option<PathBuf>,
    pub memif_socket: Option<PathBuf>,
    #[serde(default)]
    pub taps: Vec<String>,
    pub poll_us: Option<u64>,
    pub aging_s: Option<u64>,
    pub max_macs: Option<usize>,
}

impl FileConfig {
    pub fn load(path: &Path) -> Result<FileConfig, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let c: FileConfig =
            toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        if c.poll_us.is_some_and(|p| p > 1_000_000) {
            return Err(format!(
                "{}: poll_us must be at most 1000000",
                path.display()
            ));
        }
        if c.aging_s == Some(0) {
            return Err(format!("{}: aging_s must be at least 1", path.display()));
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
        }
    }
}
