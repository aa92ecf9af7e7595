//! AF_XDP ports: an XDP program (ours, `bpf/xsk.c`, built by `build.rs`)
//! redirects the interface's frames to an AF_XDP socket whose UMEM is the
//! whole `maio` pool, so received frames land directly in pool buffers.
//!
//! - Receive is zero-copy into the pool: for each frame taken from the RX
//!   ring, the slot's reserved buffer goes to the fill ring in its place.
//! - Transmit copies each frame into one of the port's own transmit buffers
//!   (also pool memory), which come back on the completion ring; the
//!   caller's buffers are free for recycling at once, as the `Nic` contract
//!   says.
//! - Native XDP is tried first and generic (SKB) mode is the fallback; the
//!   socket binds in copy mode (veth has no zero-copy driver support).
//!
//! The four rings are shared with the kernel: producer and consumer indices
//! are read and written atomically (acquire/release), descriptors are read
//! only below an acquired producer index, and every address the kernel
//! hands back is checked against the pool before it is used.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};

use maio::{Buf, Handle, Pool, State};
use memmap2::{MmapMut, MmapOptions};

use crate::afpacket::setsockopt;
use crate::{Error, Nic, PortStats, Slot};

#[cfg(fastpath_xdp_obj)]
// Aligned: the ELF parser reads the object in place.
static XSK_OBJ: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/xsk.o"));
#[cfg(not(fastpath_xdp_obj))]
static XSK_OBJ: &[u8] = &[];
#[cfg(fastpath_xdp_obj)]
static BOUNCE_OBJ: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/bounce.o"));
#[cfg(not(fastpath_xdp_obj))]
static BOUNCE_OBJ: &[u8] = &[];

/// Attaches our steering program with an empty VIP set, which passes every
/// frame to the kernel: on veth, an XDP program is what makes an interface
/// accept frames its peer sends with XDP_TX or redirect. Detached when the
/// returned handle drops.
pub fn attach_pass(iface: &str) -> Result<aya::Ebpf, Error> {
    if XSK_OBJ.is_empty() {
        return Err(err(
            "XDP program",
            iface,
            "not built: clang and libbpf-dev were missing at build time",
        ));
    }
    let mut bpf = aya::Ebpf::load(XSK_OBJ).map_err(|e| err("loading the XDP program", iface, e))?;
    let prog: &mut aya::programs::Xdp = bpf
        .program_mut("fastpath_xsk")
        .ok_or_else(|| err("XDP program", iface, "missing from the object"))?
        .try_into()
        .map_err(|e| err("XDP program", iface, e))?;
    prog.load()
        .map_err(|e| err("verifying the XDP program", iface, e))?;
    prog.attach(iface, aya::programs::XdpFlags::DRV_MODE)
        .map_err(|e| err("attaching XDP", iface, e))?;
    Ok(bpf)
}

/// Attaches the bounce program (every frame back out, MACs swapped) to an
/// interface of the calling thread's namespace; detached when the returned
/// handle drops. For measuring what a veth pair can carry.
pub fn attach_bounce(iface: &str) -> Result<(aya::Ebpf, XdpMode), Error> {
    if BOUNCE_OBJ.is_empty() {
        return Err(err(
            "bounce program",
            iface,
            "not built: clang and libbpf-dev were missing at build time",
        ));
    }
    let mut bpf =
        aya::Ebpf::load(BOUNCE_OBJ).map_err(|e| err("loading the bounce program", iface, e))?;
    let prog: &mut aya::programs::Xdp = bpf
        .program_mut("fastpath_bounce")
        .ok_or_else(|| err("bounce program", iface, "missing from the object"))?
        .try_into()
        .map_err(|e| err("bounce program", iface, e))?;
    prog.load()
        .map_err(|e| err("verifying the bounce program", iface, e))?;
    let mode = match prog.attach(iface, aya::programs::XdpFlags::DRV_MODE) {
        Ok(_) => XdpMode::Native,
        Err(_) => {
            prog.attach(iface, aya::programs::XdpFlags::SKB_MODE)
                .map_err(|e| err("attaching the bounce program", iface, e))?;
            XdpMode::Generic
        }
    };
    Ok((bpf, mode))
}

/// The set of VIP addresses the XDP program sends to the socket (IPv4
/// stored IPv4-mapped); frames to any other address go to the kernel.
/// Cloneable: the control plane updates it when the VIPs change.
#[derive(Clone)]
pub struct VipFilter(
    std::sync::Arc<std::sync::Mutex<aya::maps::HashMap<aya::maps::MapData, [u8; 16], u8>>>,
);

impl VipFilter {
    /// Makes the set exactly `addrs`.
    pub fn set(&self, addrs: &[[u8; 16]]) -> Result<(), Error> {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let old: Vec<[u8; 16]> = m.keys().filter_map(Result::ok).collect();
        for k in old.iter().filter(|k| !addrs.contains(k)) {
            m.remove(k).map_err(|e| err("VIP map", "-", e))?;
        }
        for a in addrs {
            m.insert(a, 1, 0).map_err(|e| err("VIP map", "-", e))?;
        }
        Ok(())
    }
}

/// Entries in each of the four rings.
const RING: u32 = 1024;

/// Pool buffers an AF_XDP port keeps for itself (fill ring and transmit
/// buffers); the pool must have this many beyond the datapath's needs.
pub const BUFFERS_NEEDED: u32 = 2 * RING;

/// Which XDP attach mode is in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XdpMode {
    /// The driver runs the program (veth supports it).
    Native,
    /// The kernel runs it after building an skb (works everywhere, slower).
    Generic,
}

fn err(what: &str, iface: &str, reason: impl std::fmt::Display) -> Error {
    Error::Io {
        what: format!("AF_XDP on {iface}: {what}"),
        reason: reason.to_string(),
    }
}

fn os_err(what: &str, iface: &str) -> Error {
    let e = io::Error::last_os_error();
    let hint = match e.raw_os_error() {
        Some(libc::EPERM) => " (needs root, and RLIMIT_MEMLOCK high enough for the UMEM)",
        Some(libc::EAFNOSUPPORT) => " (this kernel has no AF_XDP)",
        _ => "",
    };
    err(what, iface, format!("{e}{hint}"))
}

/// One of the four rings.
struct XRing {
    map: MmapMut,
    producer: usize,
    consumer: usize,
    flags: usize,
    desc: usize,
    mask: u32,
    /// Entry size: 8 (fill, completion) or 16 (rx, tx).
    entry: usize,
}

impl XRing {
    fn map(
        fd: i32,
        off: &libc::xdp_ring_offset,
        pgoff: u64,
        entry: usize,
        iface: &str,
    ) -> Result<XRing, Error> {
        let len = off.desc as usize + RING as usize * entry;
        // SAFETY: maps the ring the kernel set up for this socket at its
        // documented page offset, with the length the offsets imply. The
        // kernel and we exchange ownership of entries through the producer
        // and consumer words, which are accessed only atomically.
        let map = unsafe {
            MmapOptions::new()
                .offset(pgoff)
                .len(len)
                .populate()
                .map_mut(fd)
        }
        .map_err(|e| err("mmap ring", iface, e))?;
        Ok(XRing {
            map,
            producer: off.producer as usize,
            consumer: off.consumer as usize,
            flags: off.flags as usize,
            desc: off.desc as usize,
            mask: RING - 1,
            entry,
        })
    }

    fn word(&self, at: usize) -> &AtomicU32 {
        let p = self.map[at..at + 4].as_ptr();
        // SAFETY: the kernel places these words 4-byte aligned inside the
        // mapping, which lives as long as `self`; both sides access them
        // only atomically.
        unsafe { &*p.cast::<AtomicU32>() }
    }

    fn prod(&self) -> &AtomicU32 {
        self.word(self.producer)
    }

    fn cons(&self) -> &AtomicU32 {
        self.word(self.consumer)
    }

    fn needs_wakeup(&self) -> bool {
        self.word(self.flags).load(Ordering::Acquire) & libc::XDP_RING_NEED_WAKEUP != 0
    }

    fn at(&self, i: u32) -> usize {
        self.desc + (i & self.mask) as usize * self.entry
    }

    fn put_u64(&mut self, i: u32, v: u64) {
        let a = self.at(i);
        self.map[a..a + 8].copy_from_slice(&v.to_ne_bytes());
    }

    fn get_u64(&self, i: u32) -> u64 {
        let a = self.at(i);
        u64::from_ne_bytes(self.map[a..a + 8].try_into().expect("8 bytes"))
    }

    fn put_desc(&mut self, i: u32, addr: u64, len: u32) {
        let a = self.at(i);
        self.map[a..a + 8].copy_from_slice(&addr.to_ne_bytes());
        self.map[a + 8..a + 12].copy_from_slice(&len.to_ne_bytes());
        self.map[a + 12..a + 16].copy_from_slice(&0u32.to_ne_bytes());
    }

    fn get_desc(&self, i: u32) -> (u64, u32) {
        let a = self.at(i);
        (
            u64::from_ne_bytes(self.map[a..a + 8].try_into().expect("8 bytes")),
            u32::from_ne_bytes(self.map[a + 8..a + 12].try_into().expect("4 bytes")),
        )
    }
}

/// An AF_XDP port on queue 0 of an interface.
pub struct AfXdpPort {
    /// The socket; closed first on drop, before its buffers go back.
    fd: Option<OwnedFd>,
    iface: String,
    pool: Pool,
    handle: Handle,
    fill: XRing,
    comp: XRing,
    rx: XRing,
    tx: XRing,
    /// Tokens of buffers the kernel holds (fill ring or in flight), by index.
    kernel: Vec<Option<Buf>>,
    /// Our transmit buffers not in flight.
    tx_free: Vec<Buf>,
    mode: XdpMode,
    stats: PortStats,
    /// Addresses from the kernel that did not name a buffer we gave it.
    pub bad_addresses: u64,
    vips: VipFilter,
    /// Keeps the XDP program attached while any of its ports lives.
    _bpf: std::sync::Arc<std::sync::Mutex<aya::Ebpf>>,
}

// SAFETY: the rings' mappings and the tokens are owned by the port, which is
// used by one thread at a time (Send, not Sync); the kernel side is
// synchronized through the ring words.
unsafe impl Send for AfXdpPort {}

impl AfXdpPort {
    /// Loads and attaches the XDP program (native, else generic), creates
    /// the socket with the whole pool as its UMEM, binds to queue 0, and
    /// steers frames for `vips` to it.
    pub fn open(iface: &str, pool: &Pool, vips: &[[u8; 16]]) -> Result<Self, Error> {
        Ok(Self::open_queues(iface, pool, vips, 1)?.remove(0))
    }

    /// One port per queue `0..queues` of the interface (one per packet
    /// thread, each served run-to-completion; the NIC spreads flows over its
    /// queues). One XDP program serves them all; each socket registers the
    /// pool as its own UMEM, and buffers stay unique through the pool's
    /// tokens.
    pub fn open_queues(
        iface: &str,
        pool: &Pool,
        vips: &[[u8; 16]],
        queues: u32,
    ) -> Result<Vec<Self>, Error> {
        if XSK_OBJ.is_empty() {
            return Err(err("XDP program", iface, "not built: clang and libbpf-dev were missing at build time (run scripts/setup.sh and rebuild)"));
        }
        let index = crate::afpacket::ifindex(iface).ok_or_else(|| {
            err(
                "interface",
                iface,
                "no such interface in this network namespace",
            )
        })?;
        let mut bpf =
            aya::Ebpf::load(XSK_OBJ).map_err(|e| err("loading the XDP program", iface, e))?;
        let mode = {
            let prog: &mut aya::programs::Xdp = bpf
                .program_mut("fastpath_xsk")
                .ok_or_else(|| err("XDP program", iface, "fastpath_xsk missing from the object"))?
                .try_into()
                .map_err(|e| err("XDP program", iface, e))?;
            prog.load()
                .map_err(|e| err("verifying the XDP program", iface, e))?;
            match prog.attach(iface, aya::programs::XdpFlags::DRV_MODE) {
                Ok(_) => XdpMode::Native,
                Err(native) => {
                    prog.attach(iface, aya::programs::XdpFlags::SKB_MODE)
                        .map_err(|e| {
                            err(
                                "attaching XDP",
                                iface,
                                format!("native: {native}; generic: {e}"),
                            )
                        })?;
                    XdpMode::Generic
                }
            }
        };
        let vip_map = aya::maps::HashMap::try_from(
            bpf.take_map("vips")
                .ok_or_else(|| err("VIP map", iface, "missing"))?,
        )
        .map_err(|e| err("VIP map", iface, e))?;
        let filter = VipFilter(std::sync::Arc::new(std::sync::Mutex::new(vip_map)));
        filter.set(vips)?;

        let shared = std::sync::Arc::new(std::sync::Mutex::new(bpf));
        let mut ports = Vec::new();
        for queue in 0..queues.max(1) {
            let mut bpf_guard = shared.lock().unwrap_or_else(|p| p.into_inner());
            // SAFETY: socket(2); the result is checked.
            let raw = unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
            if raw < 0 {
                return Err(os_err("socket", iface));
            }
            // SAFETY: a fresh descriptor owned here.
            let fd = unsafe { OwnedFd::from_raw_fd(raw) };
            let s = fd.as_raw_fd();
            let (base, len) = pool.region();
            let chunk = pool.buf_size() as u32;
            let reg = libc::xdp_umem_reg {
                addr: base as u64,
                len: len as u64,
                chunk_size: chunk,
                headroom: 0,
                flags: 0,
                tx_metadata_len: 0,
            };
            setsockopt(s, libc::SOL_XDP, libc::XDP_UMEM_REG, &reg)
                .map_err(|e| err("registering the pool as UMEM", iface, e))?;
            for opt in [
                libc::XDP_UMEM_FILL_RING,
                libc::XDP_UMEM_COMPLETION_RING,
                libc::XDP_RX_RING,
                libc::XDP_TX_RING,
            ] {
                setsockopt(s, libc::SOL_XDP, opt, &RING).map_err(|e| err("ring size", iface, e))?;
            }
            // SAFETY: xdp_mmap_offsets is plain old data; the kernel fills it and
            // we pass its size.
            let mut off: libc::xdp_mmap_offsets = unsafe { std::mem::zeroed() };
            let mut olen = std::mem::size_of::<libc::xdp_mmap_offsets>() as u32;
            // SAFETY: getsockopt into `off` with its size.
            if unsafe {
                libc::getsockopt(
                    s,
                    libc::SOL_XDP,
                    libc::XDP_MMAP_OFFSETS,
                    (&mut off as *mut libc::xdp_mmap_offsets).cast(),
                    &mut olen,
                )
            } < 0
            {
                return Err(os_err("XDP_MMAP_OFFSETS", iface));
            }
            let fill = XRing::map(s, &off.fr, libc::XDP_UMEM_PGOFF_FILL_RING, 8, iface)?;
            let comp = XRing::map(s, &off.cr, libc::XDP_UMEM_PGOFF_COMPLETION_RING, 8, iface)?;
            let rx = XRing::map(s, &off.rx, libc::XDP_PGOFF_RX_RING as u64, 16, iface)?;
            let tx = XRing::map(s, &off.tx, libc::XDP_PGOFF_TX_RING as u64, 16, iface)?;
            // SAFETY: sockaddr_xdp is plain old data; all-zero is valid.
            let mut sxdp: libc::sockaddr_xdp = unsafe { std::mem::zeroed() };
            sxdp.sxdp_family = libc::AF_XDP as u16;
            sxdp.sxdp_flags = libc::XDP_COPY | libc::XDP_USE_NEED_WAKEUP;
            sxdp.sxdp_ifindex = index;
            sxdp.sxdp_queue_id = queue;
            // SAFETY: bind with a valid sockaddr_xdp and its size.
            if unsafe {
                libc::bind(
                    s,
                    (&sxdp as *const libc::sockaddr_xdp).cast(),
                    std::mem::size_of::<libc::sockaddr_xdp>() as u32,
                )
            } < 0
            {
                return Err(os_err("bind", iface));
            }
            let mut xsks: aya::maps::XskMap<_> = aya::maps::XskMap::try_from(
                bpf_guard
                    .map_mut("xsks")
                    .ok_or_else(|| err("XSK map", iface, "missing"))?,
            )
            .map_err(|e| err("XSK map", iface, e))?;
            xsks.set(queue, s, 0)
                .map_err(|e| err("inserting the socket into the XSK map", iface, e))?;
            drop(bpf_guard);
            let mut port = AfXdpPort {
                fd: Some(fd),
                iface: iface.to_string(),
                pool: pool.clone(),
                handle: pool.handle(),
                fill,
                comp,
                rx,
                tx,
                kernel: (0..pool.buffers()).map(|_| None).collect(),
                tx_free: Vec::new(),
                mode,
                stats: PortStats::default(),
                bad_addresses: 0,
                vips: filter.clone(),
                _bpf: std::sync::Arc::clone(&shared),
            };
            // Prime the fill ring, and set aside the transmit buffers.
            for i in 0..RING {
                let b = port
                    .handle
                    .alloc()
                    .map_err(|e| err("priming the fill ring", iface, e))?;
                let idx = b.index();
                let _ = pool.transition(&b, State::User, State::InFlight);
                port.fill.put_u64(i, u64::from(idx) * u64::from(chunk));
                port.kernel[idx as usize] = Some(b);
            }
            port.fill.prod().store(RING, Ordering::Release);
            for _ in 0..RING {
                port.tx_free.push(
                    port.handle
                        .alloc()
                        .map_err(|e| err("transmit buffers", iface, e))?,
                );
            }
            ports.push(port);
        }
        Ok(ports)
    }

    fn raw(&self) -> i32 {
        self.fd.as_ref().map_or(-1, AsRawFd::as_raw_fd)
    }

    /// The VIP set's handle (for updates on reload).
    pub fn vip_filter(&self) -> VipFilter {
        self.vips.clone()
    }

    /// The XDP attach mode in use.
    pub fn mode(&self) -> XdpMode {
        self.mode
    }

    fn chunk(&self) -> u64 {
        self.pool.buf_size() as u64
    }

    /// Takes back transmit buffers the kernel has finished with.
    fn reap(&mut self) {
        let prod = self.comp.prod().load(Ordering::Acquire);
        let mut cons = self.comp.cons().load(Ordering::Relaxed);
        while cons != prod {
            let addr = self.comp.get_u64(cons);
            let idx = (addr / self.chunk()) as usize;
            match self.kernel.get_mut(idx).and_then(Option::take) {
                Some(b) => {
                    let _ = self.pool.transition(&b, State::InFlight, State::User);
                    self.tx_free.push(b);
                }
                None => self.bad_addresses += 1,
            }
            cons = cons.wrapping_add(1);
        }
        self.comp.cons().store(cons, Ordering::Release);
    }

    /// Wakes the kernel's transmit processing until it has taken every
    /// queued descriptor: in copy mode it takes at most a small batch (32)
    /// per wake-up. Bounded: stops when a wake-up makes no progress.
    fn kick_tx(&self) {
        let prod = self.tx.prod().load(Ordering::Relaxed);
        let mut last = u32::MAX;
        for _ in 0..RING / 16 {
            let cons = self.tx.cons().load(Ordering::Acquire);
            if cons == prod || cons == last {
                break;
            }
            last = cons;
            // SAFETY: a zero-length sendto on our socket only wakes the
            // kernel's transmit processing.
            unsafe {
                libc::sendto(
                    self.raw(),
                    std::ptr::null(),
                    0,
                    libc::MSG_DONTWAIT,
                    std::ptr::null(),
                    0,
                )
            };
        }
    }
}

impl Nic for AfXdpPort {
    fn receive(&mut self, _pool: &Pool, slots: &mut [Slot]) -> Result<usize, Error> {
        let chunk = self.chunk();
        let prod = self.rx.prod().load(Ordering::Acquire);
        let mut cons = self.rx.cons().load(Ordering::Relaxed);
        let fill_prod = self.fill.prod().load(Ordering::Relaxed);
        let mut pushed = 0u32;
        let mut n = 0;
        while cons != prod && n < slots.len() {
            let (addr, len) = self.rx.get_desc(cons);
            cons = cons.wrapping_add(1);
            self.stats.rx += 1;
            let idx = (addr / chunk) as usize;
            let off = addr % chunk;
            let Some(got) = self.kernel.get_mut(idx).and_then(Option::take) else {
                self.bad_addresses += 1;
                continue;
            };
            if off + u64::from(len) > chunk || len == 0 {
                // Not a frame we can use: straight back to the fill ring.
                self.fill
                    .put_u64(fill_prod.wrapping_add(pushed), idx as u64 * chunk);
                self.kernel[idx] = Some(got);
                pushed += 1;
                self.stats.rx_too_big += 1;
                continue;
            }
            let _ = self.pool.transition(&got, State::InFlight, State::User);
            // The slot's reserved buffer replaces it in the fill ring.
            let Some(reserved) = slots[n].buf.replace(got) else {
                return Err(err(
                    "receive",
                    &self.iface,
                    "a slot came without a reserved buffer",
                ));
            };
            let r = reserved.index() as usize;
            let _ = self
                .pool
                .transition(&reserved, State::User, State::InFlight);
            self.fill
                .put_u64(fill_prod.wrapping_add(pushed), r as u64 * chunk);
            self.kernel[r] = Some(reserved);
            pushed += 1;
            slots[n].off = off as u16;
            slots[n].len = len as u16;
            self.stats.rx_bytes += u64::from(len);
            n += 1;
        }
        self.rx.cons().store(cons, Ordering::Release);
        self.fill
            .prod()
            .store(fill_prod.wrapping_add(pushed), Ordering::Release);
        if pushed > 0 && self.fill.needs_wakeup() {
            // SAFETY: a zero-length, non-blocking recvfrom only wakes the
            // kernel's receive processing.
            unsafe {
                libc::recvfrom(
                    self.raw(),
                    std::ptr::null_mut(),
                    0,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                )
            };
        }
        Ok(n)
    }

    fn transmit(&mut self, pool: &Pool, slots: &[Slot]) -> Result<usize, Error> {
        self.reap();
        let chunk = self.chunk();
        let prod = self.tx.prod().load(Ordering::Relaxed);
        let cons = self.tx.cons().load(Ordering::Acquire);
        let room = RING - prod.wrapping_sub(cons);
        let mut n = 0u32;
        for s in slots {
            if n == room {
                break;
            }
            let frame = s.frame(pool);
            if frame.len() > pool.buf_size() {
                break;
            }
            let Some(mut b) = self.tx_free.pop() else {
                break;
            };
            pool.data_mut(&mut b)[..frame.len()].copy_from_slice(frame);
            let idx = b.index() as usize;
            let _ = pool.transition(&b, State::User, State::InFlight);
            self.tx
                .put_desc(prod.wrapping_add(n), idx as u64 * chunk, frame.len() as u32);
            self.kernel[idx] = Some(b);
            self.stats.tx += 1;
            self.stats.tx_bytes += frame.len() as u64;
            n += 1;
        }
        if n > 0 {
            self.tx
                .prod()
                .store(prod.wrapping_add(n), Ordering::Release);
            self.kick_tx();
        }
        Ok(n as usize)
    }

    fn wait(&mut self, timeout_ms: i32) {
        let mut p = libc::pollfd {
            fd: self.raw(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: a valid pollfd for the call's duration.
        unsafe { libc::poll(&mut p, 1, timeout_ms) };
    }

    fn stats(&self) -> PortStats {
        self.stats
    }
}

impl Drop for AfXdpPort {
    /// Closes the socket, so the kernel lets go of the UMEM, then gives
    /// every buffer back to the pool.
    fn drop(&mut self) {
        drop(self.fd.take());
        for b in self
            .kernel
            .iter_mut()
            .filter_map(Option::take)
            .chain(self.tx_free.drain(..))
        {
            let _ = self.pool.transition(&b, State::InFlight, State::User);
            let _ = self.handle.free(b);
        }
    }
}
