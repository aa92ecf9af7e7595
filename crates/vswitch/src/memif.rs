//! memif, server side: the shared-memory packet interface of VPP and DPDK
//! (protocol version 2.0), so that outside programs (DPDK's testpmd with
//! `net_memif`, VPP, libmemif applications) can attach to the switch.
//!
//! The client owns the memory: it sends its regions (memfds) and rings,
//! each ring with an interrupt eventfd; the server maps them. Ring header
//! and descriptor layout as the protocol defines them: `cookie, flags, head`
//! in the first cache line, `tail` in the second, 16-byte descriptors
//! (`flags, region, length, offset, metadata`) from the third. Client to
//! server: the client produces at `head`, the server consumes and returns
//! slots by moving `tail`. Server to client: the client posts empty buffers
//! by moving `head`, the server fills them and moves `tail`.
//!
//! Everything read from the client's memory is validated as in
//! [`ring::device`]: region indices, offsets and lengths against the mapped
//! sizes, counters against the ring size. Regions must be sealed against
//! shrinking, so the client cannot turn our reads into SIGBUS.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU16, Ordering::Acquire, Ordering::Release};
use std::time::Instant;

use memmap2::MmapRaw;
use ring::device::FrameRef;
use ring::notify::EventFd;
use serde_json::{json, Value};

use crate::ports::{Counters, Port};

pub const COOKIE: u32 = 0x3E31F20;
pub const VERSION: u16 = 0x0200;
const MSG_SIZE: usize = 128;
const MSG_ACK: u16 = 1;
const MSG_HELLO: u16 = 2;
const MSG_INIT: u16 = 3;
const MSG_ADD_REGION: u16 = 4;
const MSG_ADD_RING: u16 = 5;
const MSG_CONNECT: u16 = 6;
const MSG_CONNECTED: u16 = 7;
const MSG_DISCONNECT: u16 = 8;
const RING_FLAG_C2S: u16 = 1;
const RING_FLAG_MASK_INT: u16 = 1;
const MAX_REGIONS: usize = 16;
const MAX_REGION_SIZE: u64 = 1 << 32;
const MAX_LOG2_RING: u8 = 14;
const RING_HDR: usize = 128;
const DESC: usize = 16;

/// What serving a connection produced.
pub enum Event {
    None,
    Connected(Box<dyn Port>),
    /// The connection ended; its descriptor was removed from epoll's view.
    Closed(RawFd),
}

struct Region {
    map: MmapRaw,
    size: usize,
}

struct RingInfo {
    region: u16,
    offset: u32,
    log2: u8,
    int: EventFd,
}

struct MConn {
    fd: OwnedFd,
    id: u32,
    inited: bool,
    peer_name: String,
    regions: Vec<Option<Region>>,
    c2s: Vec<(u16, RingInfo)>,
    s2c: Vec<(u16, RingInfo)>,
    connected: bool,
}

/// The memif listener and its connections.
pub struct Server {
    listen: ring::control::Listener,
    path: PathBuf,
    conns: HashMap<u32, MConn>,
    next: u32,
}

impl Server {
    pub fn bind(path: &Path) -> std::io::Result<Server> {
        Ok(Server {
            listen: ring::control::Listener::bind(path).map_err(std::io::Error::other)?,
            path: path.to_path_buf(),
            conns: HashMap::new(),
            next: 0,
        })
    }

    pub fn listen_fd(&self) -> RawFd {
        self.listen.fd()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Accept one connection and greet it; returns its id and descriptor.
    pub fn accept(&mut self) -> Option<(u32, RawFd)> {
        let fd = self.listen.accept()?.into_fd();
        let mut m = [0u8; MSG_SIZE];
        put16(&mut m, 0, MSG_HELLO);
        m[2..10].copy_from_slice(b"fastpath");
        put16(&mut m, 34, VERSION);
        put16(&mut m, 36, VERSION);
        put16(&mut m, 38, (MAX_REGIONS - 1) as u16);
        put16(&mut m, 40, 0); // one ring each way (highest index 0)
        put16(&mut m, 42, 0);
        m[44] = MAX_LOG2_RING;
        if ring::control::send_msg(fd.as_raw_fd(), &m, &[]).is_err() {
            return None;
        }
        let id = self.next;
        self.next = self.next.wrapping_add(1) & 0xff_ffff;
        let raw = fd.as_raw_fd();
        self.conns.insert(
            id,
            MConn {
                fd,
                id,
                inited: false,
                peer_name: String::new(),
                regions: Vec::new(),
                c2s: Vec::new(),
                s2c: Vec::new(),
                connected: false,
            },
        );
        Some((id, raw))
    }

    /// Close a connection; returns its descriptor (to forget in epoll).
    pub fn close(&mut self, id: u32) -> Option<RawFd> {
        self.conns.remove(&id).map(|c| c.fd.as_raw_fd())
    }

    /// Handle one message on connection `id`.
    pub fn serve(&mut self, id: u32) -> Event {
        let Some(c) = self.conns.get_mut(&id) else {
            return Event::None;
        };
        let raw = c.fd.as_raw_fd();
        let (msg, fds) = match ring::control::recv_msg(raw) {
            Ok(Some(m)) => m,
            Ok(None) | Err(_) => {
                self.conns.remove(&id);
                return Event::Closed(raw);
            }
        };
        match handle(c, &msg, fds) {
            Ok(ev) => ev,
            Err(why) => {
                tracing::warn!(conn = id, "memif: {why}");
                let mut m = [0u8; MSG_SIZE];
                put16(&mut m, 0, MSG_DISCONNECT);
                let b = why.as_bytes();
                let n = b.len().min(95);
                m[6..6 + n].copy_from_slice(&b[..n]);
                let _ = ring::control::send_msg(raw, &m, &[]);
                self.conns.remove(&id);
                Event::Closed(raw)
            }
        }
    }
}

fn put16(m: &mut [u8], at: usize, v: u16) {
    m[at..at + 2].copy_from_slice(&v.to_le_bytes());
}
fn get16(m: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([m[at], m[at + 1]])
}
fn get32(m: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(m[at..at + 4].try_into().expect("4 bytes"))
}
fn get64(m: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(m[at..at + 8].try_into().expect("8 bytes"))
}

fn ack(c: &MConn) -> Result<Event, String> {
    let mut m = [0u8; MSG_SIZE];
    put16(&mut m, 0, MSG_ACK);
    ring::control::send_msg(c.fd.as_raw_fd(), &m, &[]).map_err(|e| e.to_string())?;
    Ok(Event::None)
}

fn cstr(b: &[u8]) -> String {
    let end = b.iter().position(|&x| x == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

fn handle(c: &mut MConn, msg: &[u8], mut fds: Vec<OwnedFd>) -> Result<Event, String> {
    if msg.len() < 2 {
        return Err("short message".into());
    }
    let mut m = [0u8; MSG_SIZE];
    let n = msg.len().min(MSG_SIZE);
    m[..n].copy_from_slice(&msg[..n]);
    let ty = get16(&m, 0);
    if c.connected && ty != MSG_DISCONNECT {
        return Err(format!("message type {ty} after connect"));
    }
    match ty {
        MSG_INIT => {
            if c.inited {
                return Err("second init".into());
            }
            let v = get16(&m, 2);
            if v != VERSION {
                return Err(format!("unsupported version {v:#x}"));
            }
            if m[8] != 0 {
                return Err("only ethernet mode is supported".into());
            }
            c.id = get32(&m, 4);
            c.peer_name = cstr(&m[33..65]);
            c.inited = true;
            ack(c)
        }
        MSG_ADD_REGION => {
            if !c.inited {
                return Err("add_region before init".into());
            }
            let idx = get16(&m, 2) as usize;
            let size = get64(&m, 4);
            let fd = fds.pop().ok_or("add_region without a descriptor")?;
            if idx >= MAX_REGIONS || size == 0 || size > MAX_REGION_SIZE {
                return Err(format!("region {idx} of {size} bytes refused"));
            }
            let file = File::from(fd);
            let have = file.metadata().map_err(|e| e.to_string())?.len();
            if have < size {
                return Err(format!(
                    "region {idx}: file is {have} bytes, {size} claimed"
                ));
            }
            // SAFETY: fcntl on a descriptor we own.
            let seals = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GET_SEALS) };
            if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
                return Err(format!(
                    "region {idx} is not sealed against shrinking (a peer could make our reads fault)"
                ));
            }
            let map = memmap2::MmapOptions::new()
                .len(size as usize)
                .map_raw(&file)
                .map_err(|e| format!("mmap region {idx}: {e}"))?;
            if c.regions.len() <= idx {
                c.regions.resize_with(idx + 1, || None);
            }
            c.regions[idx] = Some(Region {
                map,
                size: size as usize,
            });
            ack(c)
        }
        MSG_ADD_RING => {
            if !c.inited {
                return Err("add_ring before init".into());
            }
            let flags = get16(&m, 2);
            let index = get16(&m, 4);
            let region = get16(&m, 6);
            let offset = get32(&m, 8);
            let log2 = m[12];
            let int = fds
                .pop()
                .ok_or("add_ring without an interrupt descriptor")?;
            if log2 > MAX_LOG2_RING || log2 == 0 {
                return Err(format!("ring size 2^{log2} refused"));
            }
            let r = c
                .regions
                .get(region as usize)
                .and_then(|r| r.as_ref())
                .ok_or(format!("ring {index} names unknown region {region}"))?;
            let need = offset as usize + RING_HDR + (DESC << log2);
            if need > r.size || !offset.is_multiple_of(64) {
                return Err(format!("ring {index} does not fit its region"));
            }
            let info = RingInfo {
                region,
                offset,
                log2,
                int: EventFd::from_fd(int),
            };
            if flags & RING_FLAG_C2S != 0 {
                c.c2s.push((index, info));
            } else {
                c.s2c.push((index, info));
            }
            ack(c)
        }
        MSG_CONNECT => {
            let name = cstr(&m[2..34]);
            let c2s = take_ring0(&mut c.c2s).ok_or("no client-to-server ring 0")?;
            let s2c = take_ring0(&mut c.s2c).ok_or("no server-to-client ring 0")?;
            let regions: Vec<Option<Region>> = std::mem::take(&mut c.regions);
            let port = MemifPort::new(
                format!("memif{}", c.id),
                format!("{} ({})", name, c.peer_name),
                regions,
                c2s,
                s2c,
            )?;
            let mut r = [0u8; MSG_SIZE];
            put16(&mut r, 0, MSG_CONNECTED);
            r[2..10].copy_from_slice(b"fastpath");
            ring::control::send_msg(c.fd.as_raw_fd(), &r, &[]).map_err(|e| e.to_string())?;
            c.connected = true;
            Ok(Event::Connected(Box::new(port)))
        }
        MSG_DISCONNECT => Err(format!("peer disconnected: {}", cstr(&m[6..102]))),
        _ => Err(format!("unexpected message type {ty}")),
    }
}

fn take_ring0(v: &mut Vec<(u16, RingInfo)>) -> Option<RingInfo> {
    let i = v.iter().position(|(idx, _)| *idx == 0)?;
    Some(v.swap_remove(i).1)
}

/// One ring in the client's memory, with everything needed to check it.
struct MRing {
    base: *mut u8,
    mask: u16,
    size: u16,
    int: EventFd,
}

impl MRing {
    fn head(&self) -> &AtomicU16 {
        // SAFETY: base + 6 is inside the ring header (checked at add_ring);
        // 2-byte aligned because the ring is 64-byte aligned.
        unsafe { &*(self.base.add(6) as *const AtomicU16) }
    }
    fn tail(&self) -> &AtomicU16 {
        // SAFETY: base + 64 is inside the 128-byte ring header.
        unsafe { &*(self.base.add(64) as *const AtomicU16) }
    }
    fn flags(&self) -> u16 {
        // SAFETY: base + 4 is inside the ring header.
        unsafe { (self.base.add(4) as *const u16).read_volatile() }
    }
    fn desc(&self, slot: u16) -> *mut u8 {
        // SAFETY: (slot & mask) < ring size, and the descriptors fit (checked).
        unsafe { self.base.add(RING_HDR + (slot & self.mask) as usize * DESC) }
    }
}

/// The switch port over a connected memif.
pub struct MemifPort {
    name: String,
    peer: String,
    regions: Vec<Option<Region>>,
    c2s: MRing,
    s2c: MRing,
    c2s_next: u16,
    s2c_next: u16,
    s2c_published: u16,
    broken: Option<String>,
    c: Counters,
    bad_desc: u64,
    too_long: u64,
}

// SAFETY: the raw ring pointers point into mappings this port owns; the port
// is used by one thread at a time.
unsafe impl Send for MemifPort {}

impl MemifPort {
    fn new(
        name: String,
        peer: String,
        regions: Vec<Option<Region>>,
        c2s: RingInfo,
        s2c: RingInfo,
    ) -> Result<MemifPort, String> {
        let mk = |r: RingInfo| -> Result<MRing, String> {
            let reg = regions
                .get(r.region as usize)
                .and_then(|x| x.as_ref())
                .ok_or("ring region vanished")?;
            // SAFETY: offset + header + descriptors <= region size (checked in add_ring).
            let base = unsafe { reg.map.as_mut_ptr().add(r.offset as usize) };
            // SAFETY: the cookie is the first word of the ring header.
            let cookie = unsafe { (base as *const u32).read_volatile() };
            if cookie != COOKIE {
                return Err(format!("ring cookie {cookie:#x} is not {COOKIE:#x}"));
            }
            Ok(MRing {
                base,
                mask: (1u16 << r.log2) - 1,
                size: 1u16 << r.log2,
                int: r.int,
            })
        };
        let c2s = mk(c2s)?;
        let s2c = mk(s2c)?;
        let c2s_next = c2s.tail().load(Acquire);
        let s2c_next = s2c.tail().load(Acquire);
        Ok(MemifPort {
            name,
            peer,
            c2s_next,
            s2c_next,
            s2c_published: s2c_next,
            regions,
            c2s,
            s2c,
            broken: None,
            c: Counters::default(),
            bad_desc: 0,
            too_long: 0,
        })
    }

    /// A descriptor's buffer, if its region, offset and length are possible.
    fn buffer(&self, d: *const u8) -> Option<(*mut u8, u32, *mut u8)> {
        let mut raw = [0u8; DESC];
        // SAFETY: d points at a descriptor inside a checked ring; copied once.
        unsafe { std::ptr::copy_nonoverlapping(d, raw.as_mut_ptr(), DESC) };
        let region = get16(&raw, 2) as usize;
        let len = get32(&raw, 4);
        let off = get32(&raw, 8) as usize;
        let r = self.regions.get(region)?.as_ref()?;
        if off.checked_add(len as usize)? > r.size {
            return None;
        }
        // SAFETY: off + len <= region size.
        Some((unsafe { r.map.as_mut_ptr().add(off) }, len, d as *mut u8))
    }
}

impl Port for MemifPort {
    fn name(&self) -> &str {
        &self.name
    }
    fn kind(&self) -> &'static str {
        "memif"
    }
    fn fd(&self) -> Option<RawFd> {
        Some(self.c2s.int.raw())
    }
    fn on_event(&mut self) {
        self.c2s.int.drain();
    }
    fn pending(&mut self) -> bool {
        self.broken.is_none() && self.c2s.head().load(Acquire) != self.c2s_next
    }
    fn rx(&mut self, max: u32, out: &mut Vec<FrameRef>) -> u32 {
        let head = self.c2s.head().load(Acquire);
        let avail = head.wrapping_sub(self.c2s_next);
        if avail > self.c2s.size {
            self.broken = Some(format!(
                "c2s head {head} impossible (next {})",
                self.c2s_next
            ));
            return 0;
        }
        let n = (avail as u32).min(max) as u16;
        for k in 0..n {
            let d = self.c2s.desc(self.c2s_next.wrapping_add(k));
            match self.buffer(d) {
                Some((p, len, _)) if len > 0 => out.push(FrameRef { ptr: p, len }),
                _ => self.bad_desc += 1,
            }
        }
        n as u32
    }
    fn rx_done(&mut self, token: u32, frames: u64, _now: Instant) {
        self.c2s_next = self.c2s_next.wrapping_add(token as u16);
        self.c2s.tail().store(self.c2s_next, Release);
        self.c.from_port += frames;
    }
    unsafe fn tx(&mut self, f: FrameRef) -> bool {
        if self.broken.is_some() {
            return false;
        }
        let head = self.s2c.head().load(Acquire);
        let space = head.wrapping_sub(self.s2c_next);
        if space > self.s2c.size {
            self.broken = Some(format!(
                "s2c head {head} impossible (tail {})",
                self.s2c_next
            ));
            return false;
        }
        if space == 0 {
            self.c.dropped_full += 1;
            return false;
        }
        let d = self.s2c.desc(self.s2c_next);
        let Some((dst, cap, dp)) = self.buffer(d) else {
            self.bad_desc += 1;
            self.c.dropped_full += 1;
            return false;
        };
        if f.len > cap {
            // Chained buffers are not supported: one frame, one buffer.
            self.too_long += 1;
            self.c.dropped_full += 1;
            return false;
        }
        // SAFETY: dst has cap >= f.len bytes in the client's region; the
        // caller guarantees f; then the descriptor's length and flags.
        unsafe {
            std::ptr::copy_nonoverlapping(f.ptr, dst, f.len as usize);
            (dp.add(4) as *mut u32).write_volatile(f.len);
            (dp as *mut u16).write_volatile(0);
        }
        self.s2c_next = self.s2c_next.wrapping_add(1);
        self.c.to_port += 1;
        self.c.to_port_bytes += f.len as u64;
        true
    }
    fn tx_flush(&mut self, _now: Instant) {
        if self.s2c_next == self.s2c_published {
            return;
        }
        self.s2c_published = self.s2c_next;
        self.s2c.tail().store(self.s2c_next, Release);
        if self.s2c.flags() & RING_FLAG_MASK_INT == 0 {
            self.s2c.int.signal();
        }
    }
    fn broken(&self) -> Option<&str> {
        self.broken.as_deref()
    }
    fn counters(&mut self) -> &mut Counters {
        &mut self.c
    }
    fn status(&self) -> Value {
        json!({
            "peer": self.peer,
            "ring_size": self.c2s.size,
            "bad_descriptors": self.bad_desc,
            "too_long": self.too_long,
            "broken": self.broken,
        })
    }
}
