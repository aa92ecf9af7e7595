//! AF_XDP ports: an XDP program (ours, `bpf/xsk.c`, built by `build.rs`)
//! redirects the interface's frames to an AF_XDP socket whose UMEM is the
//! whole `maio` pool, so received frames land directly in pool buffers.
//!
//! - Receive is zero-copy into the pool: for each frame taken from the RX
//!   ring, the slot's reserved buffer goes to the fill ring in its place.
//! - Transmit from the pool is zero-copy ([`Nic::transmit_owned`]): the
//!   frame is sent from the buffer it sits in (a received frame rewritten
//!   in place), which the port takes and gives back to the pool when it
//!   comes back on the completion ring. [`Nic::transmit`], whose caller
//!   keeps its buffers, copies each frame into one of the port's own
//!   transmit buffers (also pool memory) instead; [`PortStats::tx_copies`]
//!   counts those copies.
//! - Native XDP is tried first and generic (SKB) mode is the fallback; the
//!   socket binds in copy mode (veth has no zero-copy driver support).
//!
//! The four rings are shared with the kernel: producer and consumer indices
//! are read and written atomically (acquire/release), descriptors are read
//! only below an acquired producer index, and every address the kernel
//! hands back is checked against the pool before it is used.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use aya::maps::{MapData, MapError};
use aya::programs::{ProgramError, Xdp, XdpFlags};
use aya::{Ebpf, EbpfError};
use maio::{Buf, Handle, Pool, State};
use memmap2::{MmapMut, MmapOptions};
use rustix::net::xdp::{
    SocketAddrXdp, SocketAddrXdpFlags, XdpRingFlags, XdpRingOffset, XdpUmemReg, XdpUmemRegFlags,
    XDP_PGOFF_RX_RING, XDP_PGOFF_TX_RING, XDP_UMEM_PGOFF_COMPLETION_RING, XDP_UMEM_PGOFF_FILL_RING,
};
use rustix::net::{sockopt, AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType};

use crate::{Hint, Nic, PortStats, Slot};

#[cfg(fastpath_xdp_obj)]
// Aligned: the ELF parser reads the object in place.
static XSK_OBJ: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/xsk.o"));
#[cfg(not(fastpath_xdp_obj))]
static XSK_OBJ: &[u8] = &[];
#[cfg(fastpath_xdp_obj)]
static FWD_OBJ: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/fwd.o"));
#[cfg(not(fastpath_xdp_obj))]
static FWD_OBJ: &[u8] = &[];

/// Why an AF_XDP port, or one of its XDP programs, failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The XDP programs were not compiled into this binary.
    #[error("AF_XDP on {iface}: {what} not built: clang and libbpf-dev were missing at build time (run scripts/setup.sh and rebuild)")]
    NotBuilt {
        /// The interface.
        iface: String,
        /// Which program.
        what: &'static str,
    },
    /// The interface does not exist here.
    #[error("AF_XDP on {iface}: no such interface in this network namespace")]
    NoInterface {
        /// The interface.
        iface: String,
    },
    /// The XDP generator's template is shorter than its headers.
    #[error(
        "XDP generator on {iface}: a {len}-byte template has no Ethernet, IPv4 and UDP headers"
    )]
    Template {
        /// The interface.
        iface: String,
        /// The template's length.
        len: usize,
    },
    /// The object file could not be loaded.
    #[error("AF_XDP on {iface}: loading the {program}: {source}")]
    Load {
        /// The interface.
        iface: String,
        /// Which program.
        program: &'static str,
        /// aya's answer.
        #[source]
        source: Box<EbpfError>,
    },
    /// A program or map is not in the object file.
    #[error("AF_XDP on {iface}: {what} missing from the object")]
    Missing {
        /// The interface.
        iface: String,
        /// What is missing.
        what: &'static str,
    },
    /// A program could not be found, verified or attached.
    #[error("AF_XDP on {iface}: {step} the {program}: {source}")]
    Program {
        /// The interface.
        iface: String,
        /// Which program.
        program: &'static str,
        /// What was being done: "finding", "verifying", "attaching".
        step: &'static str,
        /// aya's answer.
        #[source]
        source: Box<ProgramError>,
    },
    /// Neither native nor generic XDP could be attached.
    #[error("AF_XDP on {iface}: attaching the {program}: native: {native}; generic: {source}")]
    Attach {
        /// The interface.
        iface: String,
        /// Which program.
        program: &'static str,
        /// Why native (driver) mode failed.
        native: Box<ProgramError>,
        /// Why generic (SKB) mode failed.
        #[source]
        source: Box<ProgramError>,
    },
    /// A map of the program could not be opened or changed.
    #[error("AF_XDP on {iface}: {what}: {source}")]
    Map {
        /// The interface.
        iface: String,
        /// What was being done.
        what: &'static str,
        /// aya's answer.
        #[source]
        source: Box<MapError>,
    },
    /// The XDP forwarder's device map could not be set.
    #[error("AF_XDP on {iface}: the forwarder's device map: {source}")]
    DevMap {
        /// The interface.
        iface: String,
        /// aya's answer.
        #[source]
        source: Box<aya::maps::xdp::XdpMapError>,
    },
    /// A system call on the socket failed.
    #[error("AF_XDP on {iface}: {op}: {source}{}", hint(source))]
    Sys {
        /// The interface.
        iface: String,
        /// What was being done.
        op: &'static str,
        /// The system's answer.
        #[source]
        source: io::Error,
    },
    /// The kernel does not say where the rings' flags are.
    #[error("AF_XDP on {iface}: the kernel has no ring flags for need_wakeup (needs Linux 5.4 or later)")]
    NoRingFlags {
        /// The interface.
        iface: String,
    },
    /// The pool could not lend the port its buffers.
    #[error("AF_XDP on {iface}: {what}: {source}")]
    Pool {
        /// The interface.
        iface: String,
        /// What the buffers were for.
        what: &'static str,
        /// The pool's answer.
        #[source]
        source: maio::Error,
    },
    /// The caller broke the `Nic` contract.
    #[error("AF_XDP on {iface}: receive: a slot came without a reserved buffer")]
    NoReservedBuffer {
        /// The interface.
        iface: String,
    },
}

/// What to do about a failed system call of an AF_XDP port.
fn hint(e: &io::Error) -> Hint {
    Hint(match e.raw_os_error() {
        Some(libc::EPERM) => Some("needs root, and RLIMIT_MEMLOCK high enough for the UMEM"),
        Some(libc::EAFNOSUPPORT) => Some("this kernel has no AF_XDP"),
        _ => None,
    })
}

/// One of the XDP programs of `build.rs`: its object, its name in the
/// object, and how errors call it.
struct Prog {
    obj: &'static [u8],
    name: &'static str,
    program: &'static str,
}

/// The steering program (`bpf/xsk.c`).
const XSK: Prog = Prog {
    obj: XSK_OBJ,
    name: "fastpath_xsk",
    program: "XDP program",
};

/// The load balancer in the driver (`bpf/lb.c`), loaded by
/// [`crate::xdplb`]; attached like the others.
const LB: Prog = Prog {
    obj: &[],
    name: crate::xdplb::PROGRAM,
    program: "XDP load balancer",
};

/// Which XDP program an AF_XDP port's interface runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Program {
    /// Steering only (`bpf/xsk.c`): every VIP frame to the socket.
    Steer,
    /// The load balancer's fast path (`bpf/lb.c`) with maps of these sizes:
    /// the common case forwarded in the driver, the rest steered.
    LoadBalancer(crate::xdplb::Sizes),
}

/// The XDP forwarder (`bpf/fwd.c`).
const FWD: Prog = Prog {
    obj: FWD_OBJ,
    name: "fastpath_fwd",
    program: "XDP forwarder",
};

/// The sink (`bpf/fwd.c`): drops every frame.
const SINK: Prog = Prog {
    obj: FWD_OBJ,
    name: "fastpath_sink",
    program: "XDP sink",
};

impl Prog {
    /// Loads the object and verifies the program.
    fn load(&self, iface: &str) -> Result<Ebpf, Error> {
        if self.obj.is_empty() {
            return Err(Error::NotBuilt {
                iface: iface.into(),
                what: self.program,
            });
        }
        let mut bpf = Ebpf::load(self.obj).map_err(|source| Error::Load {
            iface: iface.into(),
            program: self.program,
            source: Box::new(source),
        })?;
        self.find(&mut bpf, iface)?
            .load()
            .map_err(|e| self.failed(iface, "verifying", e))?;
        Ok(bpf)
    }

    /// The program in `bpf` (from [`Prog::load`]).
    fn find<'a>(&self, bpf: &'a mut Ebpf, iface: &str) -> Result<&'a mut Xdp, Error> {
        bpf.program_mut(self.name)
            .ok_or_else(|| Error::Missing {
                iface: iface.into(),
                what: self.name,
            })?
            .try_into()
            .map_err(|e| self.failed(iface, "finding", e))
    }

    /// Attaches the program to `iface` in native mode, else in generic mode;
    /// says which.
    fn attach(&self, bpf: &mut Ebpf, iface: &str) -> Result<XdpMode, Error> {
        let prog = self.find(bpf, iface)?;
        match prog.attach(iface, XdpFlags::DRV_MODE) {
            Ok(_) => Ok(XdpMode::Native),
            Err(native) => match prog.attach(iface, XdpFlags::SKB_MODE) {
                Ok(_) => Ok(XdpMode::Generic),
                Err(generic) => Err(Error::Attach {
                    iface: iface.into(),
                    program: self.program,
                    native: Box::new(native),
                    source: Box::new(generic),
                }),
            },
        }
    }

    fn failed(&self, iface: &str, step: &'static str, e: ProgramError) -> Error {
        Error::Program {
            iface: iface.into(),
            program: self.program,
            step,
            source: Box::new(e),
        }
    }
}

/// Attaches our steering program with an empty VIP set, which passes every
/// frame to the kernel: on veth, an XDP program is what makes an interface
/// accept frames its peer sends with XDP_TX or redirect. Detached when the
/// returned handle drops.
pub fn attach_pass(iface: &str) -> Result<Ebpf, crate::Error> {
    let mut bpf = XSK.load(iface)?;
    XSK.find(&mut bpf, iface)?
        .attach(iface, XdpFlags::DRV_MODE)
        .map_err(|e| XSK.failed(iface, "attaching", e))?;
    Ok(bpf)
}

/// Attaches the sink (every frame dropped in the driver, after the
/// interface counted it) in native mode: the cheapest receiver, which also
/// makes a veth accept frames its peer redirects. Detached when the
/// returned handle drops.
pub fn attach_sink(iface: &str) -> Result<Ebpf, crate::Error> {
    let mut bpf = SINK.load(iface)?;
    SINK.find(&mut bpf, iface)?
        .attach(iface, XdpFlags::DRV_MODE)
        .map_err(|e| SINK.failed(iface, "attaching", e))?;
    Ok(bpf)
}

/// Backends the XDP forwarder takes at most (`FWD_MAX_BACKENDS` of
/// `bpf/fwd.c`).
pub const FWD_MAX_BACKENDS: usize = 16;

/// The XDP forwarder's configuration (`struct fwd_conf` of `bpf/fwd.c`).
#[repr(C)]
#[derive(Clone, Copy)]
struct FwdConf {
    dmac: [u8; 6],
    smac: [u8; 6],
    n: u32,
    backend: [[u8; 4]; FWD_MAX_BACKENDS],
}

// SAFETY: plain old data with no padding (6 + 6 bytes, then 4-byte fields
// at offset 12), as the kernel's copy of the map value expects.
unsafe impl aya::Pod for FwdConf {}

/// Attaches the XDP forwarder (`bpf/fwd.c`) to an interface of the calling
/// thread's namespace: each IPv4 frame's destination becomes one of
/// `backends` (by source address and port), its MACs `gateway` and `ours`,
/// and it leaves through the same interface by `bpf_redirect_map`. The
/// load balancer's hop done in the driver: the limit a forwarder on this
/// interface can reach. Detached when the returned handle drops.
pub fn attach_forwarder(
    iface: &str,
    gateway: [u8; 6],
    ours: [u8; 6],
    backends: &[std::net::Ipv4Addr],
) -> Result<(Ebpf, XdpMode), crate::Error> {
    let index = crate::afpacket::ifindex(iface).ok_or_else(|| Error::NoInterface {
        iface: iface.into(),
    })?;
    let mut bpf = FWD.load(iface)?;
    let mut conf = FwdConf {
        dmac: gateway,
        smac: ours,
        n: backends.len().min(FWD_MAX_BACKENDS) as u32,
        backend: [[0; 4]; FWD_MAX_BACKENDS],
    };
    for (slot, b) in conf.backend.iter_mut().zip(backends) {
        *slot = b.octets();
    }
    set_first(&mut bpf, iface, "fwd_conf", "forwarder configuration", conf)?;
    let mut out: aya::maps::DevMap<_> =
        aya::maps::DevMap::try_from(bpf.map_mut("fwd_out").ok_or_else(|| Error::Missing {
            iface: iface.into(),
            what: "fwd_out",
        })?)
        .map_err(|source| Error::Map {
            iface: iface.into(),
            what: "forwarder device map",
            source: Box::new(source),
        })?;
    out.set(0, index, None, 0).map_err(|source| Error::DevMap {
        iface: iface.into(),
        source: Box::new(source),
    })?;
    let mode = FWD.attach(&mut bpf, iface)?;
    Ok((bpf, mode))
}

/// Writes `value` into entry 0 of the array map `name` of `bpf` (a
/// program's configuration); `what` names it in errors.
fn set_first<T: aya::Pod>(
    bpf: &mut Ebpf,
    iface: &str,
    name: &'static str,
    what: &'static str,
    value: T,
) -> Result<(), Error> {
    let map = |source| Error::Map {
        iface: iface.into(),
        what,
        source: Box::new(source),
    };
    let mut arr: aya::maps::Array<_, T> =
        aya::maps::Array::try_from(bpf.map_mut(name).ok_or_else(|| Error::Missing {
            iface: iface.into(),
            what: name,
        })?)
        .map_err(map)?;
    arr.set(0, value, 0).map_err(map)
}

/// The set of VIP addresses the XDP program sends to the socket (IPv4
/// stored IPv4-mapped); frames to any other address go to the kernel.
/// Besides, for the load balancer's own addresses ([`VipFilter::set_redirects`]),
/// fragments redirected by a fleet peer (GRE with the key
/// `packet::gre::FRAGMENT_REDIRECT_KEY`) go to the socket, the rest of
/// their traffic (BGP, checks, management) to the kernel.
/// Cloneable: the control plane updates it when the VIPs change.
#[derive(Clone)]
pub struct VipFilter {
    map: Arc<Mutex<aya::maps::HashMap<MapData, [u8; 16], u8>>>,
    iface: Arc<str>,
    /// The addresses last set.
    entries: Arc<Mutex<Entries>>,
}

/// The addresses in the XDP program's map, by kind.
#[derive(Default)]
struct Entries {
    /// VIPs: every frame goes to the socket.
    vips: Vec<[u8; 16]>,
    /// Own addresses: redirected fragments go to the socket.
    own: Vec<[u8; 16]>,
}

/// Map value: every frame to the address goes to the socket.
const VIP_ALL: u8 = 1;
/// Map value: only redirected fragments (keyed GRE) go to the socket.
const VIP_REDIRECTS: u8 = 2;

impl VipFilter {
    /// Makes the VIP set exactly `addrs` (own addresses set with
    /// [`VipFilter::set_redirects`] stay).
    pub fn set(&self, addrs: &[[u8; 16]]) -> Result<(), crate::Error> {
        let mut e = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        e.vips = addrs.to_vec();
        self.write(&e.vips, &e.own)
    }

    /// Makes the set of this load balancer's own addresses, to which peers
    /// redirect fragments, exactly `addrs` (the VIPs stay).
    pub fn set_redirects(&self, addrs: &[[u8; 16]]) -> Result<(), crate::Error> {
        let mut e = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        e.own = addrs.to_vec();
        self.write(&e.vips, &e.own)
    }

    /// Writes the map: VIPs, then own addresses that are not VIPs.
    fn write(&self, vips: &[[u8; 16]], own: &[[u8; 16]]) -> Result<(), crate::Error> {
        let map_err = |source| Error::Map {
            iface: self.iface.to_string(),
            what: "VIP map",
            source: Box::new(source),
        };
        let mut m = self.map.lock().unwrap_or_else(|p| p.into_inner());
        let old: Vec<[u8; 16]> = m.keys().filter_map(Result::ok).collect();
        for k in old.iter().filter(|k| !vips.contains(k) && !own.contains(k)) {
            m.remove(k).map_err(map_err)?;
        }
        for a in vips {
            m.insert(a, VIP_ALL, 0).map_err(map_err)?;
        }
        for a in own.iter().filter(|a| !vips.contains(a)) {
            m.insert(a, VIP_REDIRECTS, 0).map_err(map_err)?;
        }
        Ok(())
    }
}

/// Entries in the TX and completion rings (and the generator's).
const RING: u32 = 1024;

/// Entries in a port's RX and fill rings: frames the kernel can receive
/// into the socket while the port's thread does not run. Where that thread
/// shares its core with the interface's receive processing (a NAPI thread,
/// or softirqs), the kernel fills the ring for a whole time slice before
/// the thread runs again; a frame the ring has no room for is dropped
/// after the kernel has done all its receive work on it.
const RX_RING: u32 = 4096;

/// `XDP_MAX_TX_SKB_BUDGET` (`SOL_XDP`, Linux 6.17): how many descriptors
/// one wake-up of a copy-mode socket sends (the kernel's default is 32).
const XDP_MAX_TX_SKB_BUDGET: libc::c_int = 9;

/// Lets one wake-up (`sendto`, `poll`) of a copy-mode socket send up to a
/// whole TX ring instead of 32 descriptors, where the kernel has the option
/// (Linux 6.17 and later): a ring is then sent in one system call instead
/// of thirty-two. Returns whether the kernel took it; older kernels keep
/// their 32, which only costs more wake-ups.
fn raise_tx_budget(fd: BorrowedFd<'_>, budget: u32) -> bool {
    crate::set_int_option(fd, libc::SOL_XDP, XDP_MAX_TX_SKB_BUDGET, budget)
}

/// `SO_BUSY_POLL` (microseconds a blocking receive busy-polls; any value
/// lets a non-blocking one poll once).
const SO_BUSY_POLL: libc::c_int = 46;
/// `SO_PREFER_BUSY_POLL` (Linux 5.11).
const SO_PREFER_BUSY_POLL: libc::c_int = 69;
/// `SO_BUSY_POLL_BUDGET` (Linux 5.11): frames one busy poll takes at most.
const SO_BUSY_POLL_BUDGET: libc::c_int = 70;
/// Frames one busy poll of the interface's receive processing takes.
const BUSY_POLL_BUDGET: u32 = 64;

/// Whether the interface is set up for preferred busy polling, the
/// kernel's way of letting an AF_XDP application share its core with the
/// interface's receive processing: with `napi_defer_hard_irqs` and
/// `gro_flush_timeout` both set (in sysfs), a socket that busy-polls with
/// `SO_PREFER_BUSY_POLL` runs that processing itself, when it is ready for
/// more frames, and the kernel's own NAPI (softirq or thread) steps in only
/// when the application has not polled for `gro_flush_timeout`. Without
/// it, both run whenever they can, and the receive processing, which
/// always has work under load, takes half the core to fill a ring the
/// application has no time left to empty.
fn busy_poll_configured(iface: &str) -> bool {
    let read = |what: &str| {
        std::fs::read_to_string(format!("/sys/class/net/{iface}/{what}"))
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    read("napi_defer_hard_irqs") > 0 && read("gro_flush_timeout") > 0
}

/// `SO_INCOMING_NAPI_ID`: the NAPI instance the socket's frames came
/// through, set by the first frame received; 0 where the driver gives its
/// XDP receive queue none (veth), so that there is nothing to busy-poll.
const SO_INCOMING_NAPI_ID: libc::c_int = 56;

/// Has the socket busy-poll its queue's NAPI in preference to the kernel;
/// whether the kernel took every option.
fn prefer_busy_poll(fd: BorrowedFd<'_>) -> bool {
    crate::set_int_option(fd, libc::SOL_SOCKET, SO_PREFER_BUSY_POLL, 1)
        && crate::set_int_option(fd, libc::SOL_SOCKET, SO_BUSY_POLL, 20)
        && crate::set_int_option(fd, libc::SOL_SOCKET, SO_BUSY_POLL_BUDGET, BUSY_POLL_BUDGET)
}

/// Room for `frames` frames of the TX ring in flight at once: in copy
/// mode each is an `sk_buff` charged to the socket's send buffer until the
/// receiver frees it (about 1 KiB for a small frame with its overhead),
/// and a full buffer makes the kernel stop taking frames until then. As
/// root the buffer may exceed `net.core.wmem_max`; else it is capped there.
fn room_in_flight(fd: BorrowedFd<'_>, frames: u32) {
    let bytes = frames as usize * 2048;
    if sockopt::set_socket_send_buffer_size_force(fd, bytes).is_err() {
        let _ = sockopt::set_socket_send_buffer_size(fd, bytes);
    }
}

/// Pool buffers an AF_XDP port keeps for itself (fill ring and transmit
/// buffers); the pool must have this many beyond the datapath's needs.
pub const BUFFERS_NEEDED: u32 = RX_RING + RING;

/// Which XDP attach mode is in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XdpMode {
    /// The driver runs the program (veth supports it).
    Native,
    /// The kernel runs it after building an skb (works everywhere, slower).
    Generic,
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
        fd: BorrowedFd<'_>,
        off: &XdpRingOffset,
        pgoff: u64,
        entry: usize,
        entries: u32,
        iface: &str,
    ) -> Result<XRing, Error> {
        let flags = off.flags.ok_or_else(|| Error::NoRingFlags {
            iface: iface.into(),
        })?;
        let len = off.desc as usize + entries as usize * entry;
        // SAFETY: maps the ring the kernel set up for this socket at its
        // documented page offset, with the length the offsets imply. The
        // kernel and we exchange ownership of entries through the producer
        // and consumer words, which are accessed only atomically.
        let map = unsafe {
            MmapOptions::new()
                .offset(pgoff)
                .len(len)
                .populate()
                .map_mut(fd.as_raw_fd())
        }
        .map_err(|source| Error::Sys {
            iface: iface.into(),
            op: "mmap ring",
            source,
        })?;
        Ok(XRing {
            map,
            producer: off.producer as usize,
            consumer: off.consumer as usize,
            flags: flags as usize,
            desc: off.desc as usize,
            mask: entries - 1,
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
        self.word(self.flags).load(Ordering::Acquire) & XdpRingFlags::XDP_RING_NEED_WAKEUP.bits()
            != 0
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
    /// By index: the buffer the kernel holds was lent by a caller of
    /// `transmit_owned` (back to the pool when completed), not one of ours.
    lent: Vec<bool>,
    mode: XdpMode,
    /// Descriptors one wake-up sends (copy mode): a whole ring where the
    /// kernel lets us raise it, else its 32.
    tx_budget: u32,
    /// The socket busy-polls the interface's receive processing itself
    /// (preferred busy polling, see [`busy_poll_configured`]).
    busy_poll: bool,
    /// Whether the first frames have told whether the queue has a NAPI
    /// instance to busy-poll (see [`SO_INCOMING_NAPI_ID`]); until then a
    /// port set up for busy polling polls.
    napi_known: bool,
    stats: PortStats,
    /// Addresses from the kernel that did not name a buffer we gave it.
    pub bad_addresses: u64,
    vips: VipFilter,
    /// The fast path's maps, when the interface runs the load balancer.
    lb: Option<crate::xdplb::XdpLb>,
    /// Keeps the XDP program attached while any of its ports lives.
    _bpf: Arc<Mutex<Ebpf>>,
}

// SAFETY: the rings' mappings and the tokens are owned by the port, which is
// used by one thread at a time (Send, not Sync); the kernel side is
// synchronized through the ring words.
unsafe impl Send for AfXdpPort {}

impl AfXdpPort {
    /// Loads and attaches the XDP program (native, else generic), creates
    /// the socket with the whole pool as its UMEM, binds to queue 0, and
    /// steers frames for `vips` to it.
    pub fn open(iface: &str, pool: &Pool, vips: &[[u8; 16]]) -> Result<Self, crate::Error> {
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
    ) -> Result<Vec<Self>, crate::Error> {
        Self::open_queues_with(iface, pool, vips, queues, Program::Steer)
    }

    /// [`AfXdpPort::open_queues`] with the interface running `program`.
    pub fn open_queues_with(
        iface: &str,
        pool: &Pool,
        vips: &[[u8; 16]],
        queues: u32,
        program: Program,
    ) -> Result<Vec<Self>, crate::Error> {
        if XSK.obj.is_empty() {
            return Err(Error::NotBuilt {
                iface: iface.into(),
                what: XSK.program,
            }
            .into());
        }
        let index = crate::afpacket::ifindex(iface).ok_or_else(|| Error::NoInterface {
            iface: iface.into(),
        })?;
        let (mut bpf, lb, prog) = match program {
            Program::Steer => (XSK.load(iface)?, None, &XSK),
            Program::LoadBalancer(sizes) => {
                let (mut bpf, lb) = crate::xdplb::load(sizes)?;
                // Forwarded frames leave by the interface itself.
                let mut out: aya::maps::DevMap<_> =
                    aya::maps::DevMap::try_from(bpf.map_mut("lb_out").ok_or_else(|| {
                        Error::Missing {
                            iface: iface.into(),
                            what: "lb_out",
                        }
                    })?)
                    .map_err(|source| Error::Map {
                        iface: iface.into(),
                        what: "the load balancer's device map",
                        source: Box::new(source),
                    })?;
                out.set(0, index, None, 0).map_err(|source| Error::DevMap {
                    iface: iface.into(),
                    source: Box::new(source),
                })?;
                (bpf, Some(lb), &LB)
            }
        };
        let mode = prog.attach(&mut bpf, iface)?;
        let map_err = |what| {
            move |source| Error::Map {
                iface: iface.into(),
                what,
                source: Box::new(source),
            }
        };
        let vip_map =
            aya::maps::HashMap::try_from(bpf.take_map("vips").ok_or_else(|| Error::Missing {
                iface: iface.into(),
                what: "VIP map",
            })?)
            .map_err(map_err("VIP map"))?;
        let filter = VipFilter {
            map: Arc::new(Mutex::new(vip_map)),
            iface: iface.into(),
            entries: Arc::new(Mutex::new(Entries::default())),
        };
        filter.set(vips)?;

        let sys = |op| {
            move |e: rustix::io::Errno| Error::Sys {
                iface: iface.into(),
                op,
                source: e.into(),
            }
        };
        let shared = Arc::new(Mutex::new(bpf));
        let mut ports = Vec::new();
        for queue in 0..queues.max(1) {
            let mut bpf_guard = shared.lock().unwrap_or_else(|p| p.into_inner());
            let fd = rustix::net::socket_with(
                AddressFamily::XDP,
                SocketType::RAW,
                SocketFlags::CLOEXEC,
                None,
            )
            .map_err(sys("socket"))?;
            let s = fd.as_fd();
            let (base, len) = pool.region();
            let chunk = pool.buf_size() as u32;
            let reg = XdpUmemReg {
                addr: base as u64,
                len: len as u64,
                chunk_size: chunk,
                headroom: 0,
                flags: XdpUmemRegFlags::empty(),
                tx_metadata_len: 0,
            };
            sockopt::set_xdp_umem_reg(s, reg).map_err(sys("registering the pool as UMEM"))?;
            sockopt::set_xdp_umem_fill_ring_size(s, RX_RING).map_err(sys("fill ring size"))?;
            sockopt::set_xdp_umem_completion_ring_size(s, RING)
                .map_err(sys("completion ring size"))?;
            sockopt::set_xdp_rx_ring_size(s, RX_RING).map_err(sys("RX ring size"))?;
            sockopt::set_xdp_tx_ring_size(s, RING).map_err(sys("TX ring size"))?;
            let off = sockopt::xdp_mmap_offsets(s).map_err(sys("XDP_MMAP_OFFSETS"))?;
            let fill = XRing::map(s, &off.fr, XDP_UMEM_PGOFF_FILL_RING, 8, RX_RING, iface)?;
            let comp = XRing::map(s, &off.cr, XDP_UMEM_PGOFF_COMPLETION_RING, 8, RING, iface)?;
            let rx = XRing::map(s, &off.rx, XDP_PGOFF_RX_RING, 16, RX_RING, iface)?;
            let tx = XRing::map(s, &off.tx, XDP_PGOFF_TX_RING, 16, RING, iface)?;
            let addr = SocketAddrXdp::new(
                SocketAddrXdpFlags::XDP_COPY | SocketAddrXdpFlags::XDP_USE_NEED_WAKEUP,
                index,
                queue,
            );
            rustix::net::bind(s, &addr).map_err(sys("bind"))?;
            let tx_budget = if raise_tx_budget(s, RING) { RING } else { 32 };
            room_in_flight(s, RING);
            let busy_poll = busy_poll_configured(iface) && prefer_busy_poll(s);
            let mut xsks: aya::maps::XskMap<_> =
                aya::maps::XskMap::try_from(bpf_guard.map_mut("xsks").ok_or_else(|| {
                    Error::Missing {
                        iface: iface.into(),
                        what: "XSK map",
                    }
                })?)
                .map_err(map_err("XSK map"))?;
            xsks.set(queue, s.as_raw_fd(), 0)
                .map_err(map_err("inserting the socket into the XSK map"))?;
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
                lent: vec![false; pool.buffers() as usize],
                mode,
                tx_budget,
                busy_poll,
                napi_known: false,
                stats: PortStats::default(),
                bad_addresses: 0,
                vips: filter.clone(),
                lb: lb.clone(),
                _bpf: Arc::clone(&shared),
            };
            let pool_err = |what| {
                move |source| Error::Pool {
                    iface: iface.into(),
                    what,
                    source,
                }
            };
            // Prime the fill ring, and set aside the transmit buffers.
            for i in 0..RX_RING {
                let b = port
                    .handle
                    .alloc()
                    .map_err(pool_err("priming the fill ring"))?;
                let idx = b.index();
                let _ = pool.transition(&b, State::User, State::InFlight);
                port.fill.put_u64(i, u64::from(idx) * u64::from(chunk));
                port.kernel[idx as usize] = Some(b);
            }
            port.fill.prod().store(RX_RING, Ordering::Release);
            for _ in 0..RING {
                port.tx_free
                    .push(port.handle.alloc().map_err(pool_err("transmit buffers"))?);
            }
            ports.push(port);
        }
        Ok(ports)
    }

    /// The socket (`None` only while the port is being dropped).
    fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.fd.as_ref().map(AsFd::as_fd)
    }

    /// The VIP set's handle (for updates on reload).
    pub fn vip_filter(&self) -> VipFilter {
        self.vips.clone()
    }

    /// The load balancer's fast path, when the interface runs it
    /// ([`Program::LoadBalancer`]).
    pub fn xdp_lb(&self) -> Option<crate::xdplb::XdpLb> {
        self.lb.clone()
    }

    /// The XDP attach mode in use.
    pub fn mode(&self) -> XdpMode {
        self.mode
    }

    /// Descriptors one wake-up of the kernel's transmit sends: the whole
    /// TX ring where the kernel takes `XDP_MAX_TX_SKB_BUDGET` (Linux 6.17),
    /// else 32.
    pub fn tx_budget(&self) -> u32 {
        self.tx_budget
    }

    /// Whether the port runs the interface's receive processing itself
    /// when its RX ring is empty (preferred busy polling: the interface
    /// has `napi_defer_hard_irqs` and `gro_flush_timeout` set). It stops
    /// at the first frames if they show the queue has no NAPI instance to
    /// poll (veth): each poll would be a system call that does nothing.
    pub fn busy_polls(&self) -> bool {
        self.busy_poll
    }

    /// Once frames have arrived: stops busy polling if the socket's
    /// frames came through no NAPI instance.
    #[cold]
    fn learn_napi(&mut self) {
        self.napi_known = true;
        let id = self
            .fd()
            .and_then(|fd| crate::get_int_option(fd, libc::SOL_SOCKET, SO_INCOMING_NAPI_ID));
        if id == Some(0) {
            self.busy_poll = false;
        }
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
                    if std::mem::take(&mut self.lent[idx]) {
                        // Sent from the caller's buffer: its frame is done.
                        let _ = self.handle.free(b);
                    } else {
                        self.tx_free.push(b);
                    }
                }
                None => self.bad_addresses += 1,
            }
            cons = cons.wrapping_add(1);
        }
        self.comp.cons().store(cons, Ordering::Release);
    }

    /// Copies the frame of `s` into one of our transmit buffers and puts
    /// its descriptor at `at` of the TX ring (not yet published); false
    /// when it cannot (no free transmit buffer, frame too big).
    fn put_copy(&mut self, pool: &Pool, s: &Slot, at: u32) -> bool {
        let frame = s.frame(pool);
        if frame.len() > self.pool.buf_size() {
            return false;
        }
        let Some(mut b) = self.tx_free.pop() else {
            return false;
        };
        self.pool.data_mut(&mut b)[..frame.len()].copy_from_slice(frame);
        let idx = b.index() as usize;
        let _ = self.pool.transition(&b, State::User, State::InFlight);
        self.tx
            .put_desc(at, idx as u64 * self.chunk(), frame.len() as u32);
        self.kernel[idx] = Some(b);
        self.stats.tx += 1;
        self.stats.tx_bytes += frame.len() as u64;
        self.stats.tx_copies += 1;
        true
    }

    /// Publishes `n` descriptors put from `prod` on, and has the kernel
    /// send them.
    fn publish_tx(&mut self, prod: u32, n: u32) {
        if n > 0 {
            self.tx
                .prod()
                .store(prod.wrapping_add(n), Ordering::Release);
            self.kick_tx();
        }
    }

    /// Wakes the kernel's transmit processing until it has taken every
    /// queued descriptor: in copy mode it takes at most
    /// [`AfXdpPort::tx_budget`] per wake-up (a whole ring, or 32 on kernels
    /// before 6.17). Bounded: stops when a wake-up makes no progress.
    fn kick_tx(&self) {
        let prod = self.tx.prod().load(Ordering::Relaxed);
        let mut last = u32::MAX;
        for _ in 0..RING / 16 {
            let cons = self.tx.cons().load(Ordering::Acquire);
            if cons == prod || cons == last {
                break;
            }
            last = cons;
            // A zero-length send only wakes the kernel's transmit processing.
            if let Some(fd) = self.fd() {
                let _ = rustix::net::send(fd, &[], SendFlags::DONTWAIT);
            }
        }
    }
}

impl Nic for AfXdpPort {
    fn receive(&mut self, _pool: &Pool, slots: &mut [Slot]) -> Result<usize, crate::Error> {
        let chunk = self.chunk();
        if self.busy_poll
            && self.rx.prod().load(Ordering::Acquire) == self.rx.cons().load(Ordering::Relaxed)
        {
            // Nothing left to take: a non-blocking receive runs the
            // interface's receive processing here, for a budget of frames
            // (preferred busy polling).
            if let Some(fd) = self.fd() {
                let _ = rustix::net::recv(fd, &mut [0u8; 0][..], RecvFlags::DONTWAIT);
            }
        }
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
                return Err(Error::NoReservedBuffer {
                    iface: self.iface.clone(),
                }
                .into());
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
        if n > 0 && self.busy_poll && !self.napi_known {
            self.learn_napi();
        }
        if pushed > 0 && self.fill.needs_wakeup() {
            // A zero-length, non-blocking receive only wakes the kernel's
            // receive processing.
            if let Some(fd) = self.fd() {
                let _ = rustix::net::recv(fd, &mut [0u8; 0][..], RecvFlags::DONTWAIT);
            }
        }
        Ok(n)
    }

    fn transmit(&mut self, pool: &Pool, slots: &[Slot]) -> Result<usize, crate::Error> {
        self.reap();
        let prod = self.tx.prod().load(Ordering::Relaxed);
        let cons = self.tx.cons().load(Ordering::Acquire);
        let room = RING - prod.wrapping_sub(cons);
        let mut n = 0u32;
        for s in slots {
            if n == room || !self.put_copy(pool, s, prod.wrapping_add(n)) {
                break;
            }
            n += 1;
        }
        self.publish_tx(prod, n);
        Ok(n as usize)
    }

    /// Sends each frame from the buffer it sits in, taking the buffer (back
    /// to the pool on completion): no copy. A frame of another pool, or one
    /// that does not lie within its buffer, is copied as by `transmit`.
    fn transmit_owned(&mut self, pool: &Pool, slots: &mut [Slot]) -> Result<usize, crate::Error> {
        self.reap();
        let ours = pool.region().0 == self.pool.region().0;
        let chunk = self.chunk();
        let prod = self.tx.prod().load(Ordering::Relaxed);
        let cons = self.tx.cons().load(Ordering::Acquire);
        let room = RING - prod.wrapping_sub(cons);
        let mut n = 0u32;
        for s in slots.iter_mut() {
            if n == room {
                break;
            }
            let (off, len) = (u64::from(s.off), u64::from(s.len));
            let at = prod.wrapping_add(n);
            if !ours || len == 0 || off + len > chunk {
                if !self.put_copy(pool, s, at) {
                    break;
                }
                n += 1;
                continue;
            }
            let Some(b) = s.buf.take() else {
                break;
            };
            let idx = b.index() as usize;
            let _ = pool.transition(&b, State::User, State::InFlight);
            self.tx.put_desc(at, idx as u64 * chunk + off, len as u32);
            self.kernel[idx] = Some(b);
            self.lent[idx] = true;
            self.stats.tx += 1;
            self.stats.tx_bytes += len;
            n += 1;
        }
        self.publish_tx(prod, n);
        Ok(n as usize)
    }

    /// Sleeps in `poll(2)` on the socket until the RX ring holds frames or
    /// `timeout_ms` passes; returns at once if it already does. Bound with
    /// `XDP_USE_NEED_WAKEUP`, the kernel needs no polling otherwise: it
    /// wakes the poll when it fills the RX ring, and the poll itself does
    /// the wake-ups the rings' flags ask for (the fill ring of a zero-copy
    /// driver; the TX ring in copy mode). While the TX ring still holds
    /// frames the kernel has not taken, it sleeps at most a millisecond:
    /// in copy mode the kernel takes them only at wake-ups.
    fn wait(&mut self, timeout_ms: i32) {
        let prod = self.rx.prod().load(Ordering::Acquire);
        if prod != self.rx.cons().load(Ordering::Relaxed) {
            return;
        }
        let tx_queued =
            self.tx.prod().load(Ordering::Relaxed) != self.tx.cons().load(Ordering::Acquire);
        let timeout_ms = if tx_queued {
            self.kick_tx();
            if (0..=1).contains(&timeout_ms) {
                timeout_ms
            } else {
                1
            }
        } else {
            timeout_ms
        };
        if let Some(fd) = self.fd() {
            crate::afpacket::poll_in(fd, timeout_ms);
        }
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

/// Every receive queue of an interface behind one [`Nic`]: one AF_XDP
/// socket per queue ([`AfXdpPort::open_queues`]), received from in turn and
/// slept on together, for a datapath with one I/O loop (software steering
/// to its packet threads). An AF_XDP socket sees only its own queue, and
/// the XDP program hands a frame of a queue without a socket to the kernel,
/// so a single socket on a multi-queue interface would lose the flows the
/// NIC puts on the other queues.
pub struct AllQueues {
    ports: Vec<AfXdpPort>,
    /// The queue received from first next time (fairness).
    next: usize,
}

impl AllQueues {
    /// Opens a socket on each of the interface's `queues` queues.
    pub fn open(
        iface: &str,
        pool: &Pool,
        vips: &[[u8; 16]],
        queues: u32,
    ) -> Result<Self, crate::Error> {
        Self::open_with(iface, pool, vips, queues, Program::Steer)
    }

    /// [`AllQueues::open`] with the interface running `program`.
    pub fn open_with(
        iface: &str,
        pool: &Pool,
        vips: &[[u8; 16]],
        queues: u32,
        program: Program,
    ) -> Result<Self, crate::Error> {
        Ok(AllQueues {
            ports: AfXdpPort::open_queues_with(iface, pool, vips, queues.max(1), program)?,
            next: 0,
        })
    }

    /// The queues served.
    pub fn queues(&self) -> usize {
        self.ports.len()
    }

    /// The first port (for its [`AfXdpPort::vip_filter`] and
    /// [`AfXdpPort::mode`], shared by all).
    pub fn first(&self) -> &AfXdpPort {
        &self.ports[0]
    }
}

impl Nic for AllQueues {
    fn receive(&mut self, pool: &Pool, slots: &mut [Slot]) -> Result<usize, crate::Error> {
        let n = self.ports.len();
        let mut filled = 0;
        for i in 0..n {
            if filled == slots.len() {
                break;
            }
            let q = (self.next + i) % n;
            match self.ports[q].receive(pool, &mut slots[filled..]) {
                Ok(k) => filled += k,
                // Frames already taken from other queues are the caller's.
                Err(_) if filled > 0 => break,
                Err(e) => return Err(e),
            }
        }
        self.next = (self.next + 1) % n;
        Ok(filled)
    }

    fn transmit(&mut self, pool: &Pool, slots: &[Slot]) -> Result<usize, crate::Error> {
        // Any queue's socket may send; the first takes what it can, the
        // others the rest when its ring is full.
        let mut sent = 0;
        for p in &mut self.ports {
            if sent == slots.len() {
                break;
            }
            sent += p.transmit(pool, &slots[sent..])?;
        }
        Ok(sent)
    }

    fn transmit_owned(&mut self, pool: &Pool, slots: &mut [Slot]) -> Result<usize, crate::Error> {
        let mut sent = 0;
        for p in &mut self.ports {
            if sent == slots.len() {
                break;
            }
            sent += p.transmit_owned(pool, &mut slots[sent..])?;
        }
        Ok(sent)
    }

    fn wait(&mut self, timeout_ms: i32) {
        let mut timeout_ms = timeout_ms;
        for p in &self.ports {
            if p.rx.prod().load(Ordering::Acquire) != p.rx.cons().load(Ordering::Relaxed) {
                return;
            }
            if p.tx.prod().load(Ordering::Relaxed) != p.tx.cons().load(Ordering::Acquire) {
                p.kick_tx();
                timeout_ms = timeout_ms.clamp(0, 1);
            }
        }
        let mut fds: Vec<rustix::event::PollFd<'_>> = self
            .ports
            .iter()
            .filter_map(|p| p.fd())
            .map(|fd| rustix::event::PollFd::from_borrowed_fd(fd, rustix::event::PollFlags::IN))
            .collect();
        let timeout = (timeout_ms >= 0).then(|| rustix::event::Timespec {
            tv_sec: i64::from(timeout_ms / 1000),
            tv_nsec: i64::from(timeout_ms % 1000) * 1_000_000,
        });
        // Woken early or interrupted: the caller polls its rings anyway.
        let _ = rustix::event::poll(&mut fds, timeout.as_ref());
    }

    fn stats(&self) -> PortStats {
        let mut s = PortStats::default();
        for p in &self.ports {
            s.add(&p.stats());
        }
        s
    }
}

/// Bytes of the generator's UMEM per frame.
const GEN_CHUNK: usize = 2048;

/// A transmit-only AF_XDP socket for a traffic generator: frames prepared
/// once in a UMEM of its own are sent again and again by descriptor (no
/// write per frame), as many as the TX ring has room for at a time, and the
/// kernel is woken only when the ring's need_wakeup flag asks (in copy mode
/// it takes up to [`Generator::tx_budget`] frames per wake-up: the whole
/// ring where the kernel allows, else 32). It reports what it offered:
/// frames the kernel took from the ring and completed (sent, or dropped by
/// a full receiver: offered either way).
pub struct Generator {
    /// The socket; closed first on drop, before the UMEM is unmapped.
    fd: OwnedFd,
    iface: String,
    tx: XRing,
    comp: XRing,
    /// The frames' memory, registered as the socket's UMEM.
    _umem: MmapMut,
    /// Each frame's UMEM address and length.
    frames: Vec<(u64, u32)>,
    /// The frame sent next.
    next: usize,
    /// Descriptors queued on the TX ring.
    queued: u64,
    /// Descriptors the kernel completed.
    completed: u64,
    /// Wake-ups (`sendto` calls).
    kicks: u64,
    /// Descriptors one wake-up sends.
    tx_budget: u32,
}

impl Generator {
    /// A socket on queue `queue` of `iface` whose UMEM holds `frames`
    /// (each at most 2048 bytes), sent in turn, round and round.
    pub fn open(iface: &str, queue: u32, frames: &[Vec<u8>]) -> Result<Self, crate::Error> {
        let sys = |op| {
            move |e: rustix::io::Errno| Error::Sys {
                iface: iface.into(),
                op,
                source: e.into(),
            }
        };
        let index = crate::afpacket::ifindex(iface).ok_or_else(|| Error::NoInterface {
            iface: iface.into(),
        })?;
        let len = (frames.len().max(1) * GEN_CHUNK).next_multiple_of(4096);
        let mut umem = MmapOptions::new()
            .len(len)
            .populate()
            .map_anon()
            .map_err(|source| Error::Sys {
                iface: iface.into(),
                op: "mapping the generator's UMEM",
                source,
            })?;
        let mut descs = Vec::with_capacity(frames.len());
        for (i, f) in frames.iter().enumerate() {
            let at = i * GEN_CHUNK;
            let n = f.len().min(GEN_CHUNK);
            umem[at..at + n].copy_from_slice(&f[..n]);
            descs.push((at as u64, n as u32));
        }
        let fd = rustix::net::socket_with(
            AddressFamily::XDP,
            SocketType::RAW,
            SocketFlags::CLOEXEC,
            None,
        )
        .map_err(sys("socket"))?;
        let s = fd.as_fd();
        let reg = XdpUmemReg {
            addr: umem.as_mut_ptr() as u64,
            len: len as u64,
            chunk_size: GEN_CHUNK as u32,
            headroom: 0,
            flags: XdpUmemRegFlags::empty(),
            tx_metadata_len: 0,
        };
        sockopt::set_xdp_umem_reg(s, reg).map_err(sys("registering the generator's UMEM"))?;
        sockopt::set_xdp_umem_fill_ring_size(s, RING).map_err(sys("fill ring size"))?;
        sockopt::set_xdp_umem_completion_ring_size(s, RING).map_err(sys("completion ring size"))?;
        sockopt::set_xdp_tx_ring_size(s, RING).map_err(sys("TX ring size"))?;
        let off = sockopt::xdp_mmap_offsets(s).map_err(sys("XDP_MMAP_OFFSETS"))?;
        let comp = XRing::map(s, &off.cr, XDP_UMEM_PGOFF_COMPLETION_RING, 8, RING, iface)?;
        let tx = XRing::map(s, &off.tx, XDP_PGOFF_TX_RING, 16, RING, iface)?;
        let addr = SocketAddrXdp::new(
            SocketAddrXdpFlags::XDP_COPY | SocketAddrXdpFlags::XDP_USE_NEED_WAKEUP,
            index,
            queue,
        );
        rustix::net::bind(s, &addr).map_err(sys("bind"))?;
        let tx_budget = if raise_tx_budget(s, RING) { RING } else { 32 };
        room_in_flight(s, RING);
        Ok(Generator {
            fd,
            iface: iface.into(),
            tx,
            comp,
            _umem: umem,
            frames: descs,
            next: 0,
            queued: 0,
            completed: 0,
            kicks: 0,
            tx_budget,
        })
    }

    /// The interface.
    pub fn iface(&self) -> &str {
        &self.iface
    }

    /// Fills the TX ring's free entries with the next frames, wakes the
    /// kernel if the ring asks, and takes in completions; returns how many
    /// frames were queued.
    pub fn send(&mut self) -> u32 {
        self.reap();
        let prod = self.tx.prod().load(Ordering::Relaxed);
        let cons = self.tx.cons().load(Ordering::Acquire);
        let room = RING - prod.wrapping_sub(cons);
        if self.frames.is_empty() {
            return 0;
        }
        for i in 0..room {
            let (addr, len) = self.frames[self.next];
            self.next = if self.next + 1 == self.frames.len() {
                0
            } else {
                self.next + 1
            };
            self.tx.put_desc(prod.wrapping_add(i), addr, len);
        }
        if room > 0 {
            self.tx
                .prod()
                .store(prod.wrapping_add(room), Ordering::Release);
            self.queued += u64::from(room);
        }
        if self.tx.needs_wakeup() && prod.wrapping_add(room) != cons {
            self.kicks += 1;
            // A zero-length send only wakes the kernel's transmit
            // processing; a full receiver (EBUSY) or a full socket buffer
            // (EAGAIN) is retried by the next call.
            let _ = rustix::net::send(&self.fd, &[], SendFlags::DONTWAIT);
        }
        room
    }

    /// Takes in completions.
    fn reap(&mut self) {
        let prod = self.comp.prod().load(Ordering::Acquire);
        let cons = self.comp.cons().load(Ordering::Relaxed);
        self.completed += u64::from(prod.wrapping_sub(cons));
        self.comp.cons().store(prod, Ordering::Release);
    }

    /// Wakes the kernel until it has taken what is queued, for at most
    /// `timeout`, and takes in the completions; returns how many are left.
    pub fn flush(&mut self, timeout: std::time::Duration) -> u64 {
        let deadline = std::time::Instant::now() + timeout;
        while self.completed < self.queued && std::time::Instant::now() < deadline {
            let _ = rustix::net::send(&self.fd, &[], SendFlags::DONTWAIT);
            self.kicks += 1;
            self.reap();
            std::thread::yield_now();
        }
        self.queued - self.completed
    }

    /// Frames the kernel completed: what was offered.
    pub fn completed(&self) -> u64 {
        self.reap_peek()
    }

    /// Completions taken in plus those waiting on the ring.
    fn reap_peek(&self) -> u64 {
        let prod = self.comp.prod().load(Ordering::Acquire);
        let cons = self.comp.cons().load(Ordering::Relaxed);
        self.completed + u64::from(prod.wrapping_sub(cons))
    }

    /// Wake-ups so far (`sendto` calls).
    pub fn kicks(&self) -> u64 {
        self.kicks
    }

    /// Descriptors one wake-up sends: the whole TX ring where the kernel
    /// takes `XDP_MAX_TX_SKB_BUDGET` (Linux 6.17), else 32.
    pub fn tx_budget(&self) -> u32 {
        self.tx_budget
    }
}

// SAFETY: the rings' and the UMEM's mappings are owned by the generator,
// which is used by one thread at a time (Send, not Sync); the kernel side is
// synchronized through the ring words.
unsafe impl Send for Generator {}

/// The XDP generator (`bpf/fwd.c`): rewrites a template frame into one of
/// many flows and sends it (XDP_TX).
const GEN: Prog = Prog {
    obj: FWD_OBJ,
    name: "fastpath_gen",
    program: "XDP generator",
};

/// `BPF_PROG_TEST_RUN`, the `bpf(2)` command.
const BPF_PROG_TEST_RUN: libc::c_long = 10;
/// `BPF_F_TEST_XDP_LIVE_FRAMES` (Linux 5.18): the frames a test run's
/// program returns XDP_TX or XDP_REDIRECT for are really sent.
const BPF_F_TEST_XDP_LIVE_FRAMES: u32 = 1 << 1;
/// Frames per batch of a live test run (the kernel's most, 256): the
/// redirects of a batch are flushed together.
const GEN_BATCH: u32 = 256;

/// `union bpf_attr` as `BPF_PROG_TEST_RUN` reads it.
#[repr(C)]
#[derive(Default)]
// Only the kernel reads the fields.
#[allow(dead_code)]
struct TestRunAttr {
    prog_fd: u32,
    retval: u32,
    data_size_in: u32,
    data_size_out: u32,
    data_in: u64,
    data_out: u64,
    repeat: u32,
    duration: u32,
    ctx_size_in: u32,
    ctx_size_out: u32,
    ctx_in: u64,
    ctx_out: u64,
    flags: u32,
    cpu: u32,
    batch_size: u32,
    /// The union is 8-byte aligned; the kernel wants the rest zero.
    _pad: u32,
}

/// `struct xdp_md`, the context a test run starts from: which interface
/// and queue the frames come in on (and so which one XDP_TX leaves by).
#[repr(C)]
#[derive(Default)]
// Only the kernel reads the fields.
#[allow(dead_code)]
struct XdpMd {
    data: u32,
    data_end: u32,
    data_meta: u32,
    ingress_ifindex: u32,
    rx_queue_index: u32,
    egress_ifindex: u32,
}

/// `bpf(BPF_PROG_TEST_RUN, attr)`.
///
/// # Safety
/// Every buffer `attr` points to (input, output, context) must be valid
/// for its given size until the call returns.
unsafe fn prog_test_run(attr: &mut TestRunAttr) -> io::Result<()> {
    // SAFETY: an attribute of the command's layout (the rest of the union
    // zero) and its size, which the kernel may write back into (the
    // program's return, the output size); the buffers are the caller's
    // contract.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_TEST_RUN,
            std::ptr::from_mut(attr),
            std::mem::size_of::<TestRunAttr>(),
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Runs the XDP program `prog_fd` once over `frame` (`BPF_PROG_TEST_RUN`,
/// not live: nothing is sent) and returns what it did and the frame as it
/// left it.
pub(crate) fn test_run(prog_fd: i32, frame: &[u8]) -> io::Result<crate::xdplb::Verdict> {
    // Room for the frame grown by any headers the program may push.
    let mut out = vec![0u8; frame.len() + 512];
    let mut attr = TestRunAttr {
        prog_fd: prog_fd as u32,
        data_size_in: frame.len() as u32,
        data_size_out: out.len() as u32,
        data_in: frame.as_ptr() as u64,
        data_out: out.as_mut_ptr() as u64,
        repeat: 1,
        ..TestRunAttr::default()
    };
    // SAFETY: the kernel reads `frame` and writes at most `data_size_out`
    // bytes into `out`, and both live until the call returns.
    unsafe { prog_test_run(&mut attr) }?;
    out.truncate(attr.data_size_out as usize);
    Ok(crate::xdplb::Verdict {
        action: attr.retval,
        frame: out,
    })
}

/// A traffic generator in the kernel: the XDP generator program run by
/// `BPF_PROG_TEST_RUN` in live-frames mode (as `xdp-trafficgen` does),
/// which sends a 64-byte UDP template out of an interface as many flows,
/// in batches of 256, with no system call, socket buffer or `sk_buff` per
/// frame. On a veth, the frames reach the peer as XDP frames, which its
/// XDP program (each device under test runs one) takes without building an
/// `sk_buff` first. It reports what it offered: every frame its program
/// sent (those the peer's full ring refused included).
pub struct XdpGenerator {
    /// Holds the loaded program (and its attachment to `lo`, if any).
    _bpf: Ebpf,
    /// Whether the program stays in the kernel's XDP dispatcher between
    /// runs (see [`XdpGenerator::pinned`]).
    pinned: bool,
    /// The program's descriptor, owned by `_bpf`.
    prog_fd: i32,
    ifindex: u32,
    queue: u32,
    template: Vec<u8>,
    offered: u64,
}

impl XdpGenerator {
    /// Loads the generator for `iface` (of the calling thread's namespace)
    /// and queue `queue`, sending `template` (a 64-byte UDP over IPv4 frame
    /// whose source address and port it varies; its headers are written
    /// over every frame before it leaves, so that a receiver that edits
    /// frames in place does not change what is sent next). The interface's
    /// peer must run an XDP program (a veth accepts XDP frames only then).
    ///
    /// It also attaches the program in generic mode to the namespace's
    /// `lo`, where it passes every frame: that keeps it in the kernel's XDP
    /// dispatcher, which a test run otherwise rebuilds twice (on entry and
    /// exit), each time waiting for an RCU grace period, so that the
    /// generator would sleep most of the time. Best effort (one program per
    /// interface: a second generator in the namespace runs unpinned); see
    /// [`XdpGenerator::pinned`].
    pub fn open(iface: &str, queue: u32, template: &[u8]) -> Result<Self, crate::Error> {
        let ifindex = crate::afpacket::ifindex(iface).ok_or_else(|| Error::NoInterface {
            iface: iface.into(),
        })?;
        let mut head = [0u8; GEN_HEAD];
        match template.get(..GEN_HEAD) {
            Some(h) => head.copy_from_slice(h),
            None => {
                return Err(Error::Template {
                    iface: iface.into(),
                    len: template.len(),
                }
                .into())
            }
        }
        let mut bpf = GEN.load(iface)?;
        let mut tmpl = GenTmpl {
            ifindex,
            head: [0; GEN_HEAD / 2],
            pad: 0,
        };
        for (w, b) in tmpl.head.iter_mut().zip(head.chunks_exact(2)) {
            *w = u16::from_ne_bytes([b[0], b[1]]);
        }
        set_first(&mut bpf, iface, "gen_tmpl", "generator template", tmpl)?;
        let prog = GEN.find(&mut bpf, iface)?;
        let pinned = prog.attach("lo", XdpFlags::SKB_MODE).is_ok();
        let prog_fd = prog
            .fd()
            .map_err(|e| GEN.failed(iface, "finding", e))?
            .as_fd()
            .as_raw_fd();
        Ok(XdpGenerator {
            _bpf: bpf,
            pinned,
            prog_fd,
            ifindex,
            queue,
            template: template.to_vec(),
            offered: 0,
        })
    }

    /// Sends `frames` frames (one system call, which returns when they are
    /// sent); returns how many.
    pub fn send(&mut self, frames: u32) -> Result<u32, crate::Error> {
        let ctx = XdpMd {
            data_end: self.template.len() as u32,
            ingress_ifindex: self.ifindex,
            rx_queue_index: self.queue,
            ..XdpMd::default()
        };
        let mut attr = TestRunAttr {
            prog_fd: self.prog_fd as u32,
            data_size_in: self.template.len() as u32,
            data_in: self.template.as_ptr() as u64,
            repeat: frames,
            ctx_size_in: std::mem::size_of::<XdpMd>() as u32,
            ctx_in: std::ptr::from_ref(&ctx) as u64,
            flags: BPF_F_TEST_XDP_LIVE_FRAMES,
            batch_size: GEN_BATCH,
            ..TestRunAttr::default()
        };
        // SAFETY: the template and the context it points to live until the
        // call returns, and in live mode the kernel writes into neither (no
        // output buffers given).
        unsafe { prog_test_run(&mut attr) }.map_err(|source| Error::Sys {
            iface: format!("ifindex {}", self.ifindex),
            op: "BPF_PROG_TEST_RUN (live frames)",
            source,
        })?;
        self.offered += u64::from(frames);
        Ok(frames)
    }

    /// Frames sent so far: what was offered.
    pub fn offered(&self) -> u64 {
        self.offered
    }

    /// Whether the program stays in the kernel's XDP dispatcher between
    /// runs (attached to `lo`); if not, every [`XdpGenerator::send`] waits
    /// out two RCU grace periods besides sending.
    pub fn pinned(&self) -> bool {
        self.pinned
    }
}

/// Ethernet, IPv4 and UDP headers of the generator's template (`GEN_HEAD`
/// of `bpf/fwd.c`).
const GEN_HEAD: usize = 42;

/// The generator's template (`struct gen_tmpl` of `bpf/fwd.c`): the
/// interface its test runs name (frames seen anywhere else pass) and the
/// headers written over each frame.
#[repr(C)]
#[derive(Clone, Copy)]
struct GenTmpl {
    ifindex: u32,
    head: [u16; GEN_HEAD / 2],
    pad: u16,
}

// SAFETY: plain old data with no padding (4 + 42 + 2 bytes, 2-aligned
// after the u32), as the kernel's copy of the map value expects.
unsafe impl aya::Pod for GenTmpl {}

#[cfg(test)]
mod tests {
    use super::{VIP_ALL, VIP_REDIRECTS};

    /// The XDP program is C: its constants must say what the Rust side
    /// writes into the map and what load balancers put in redirects.
    #[test]
    fn the_xdp_program_agrees_on_map_values_and_the_redirect_key() {
        let src = include_str!("../bpf/steer.h");
        for want in [
            format!(
                "#define FRAGMENT_REDIRECT_KEY {:#010x}",
                packet::gre::FRAGMENT_REDIRECT_KEY
            ),
            format!("#define VIP_ALL {VIP_ALL}"),
            format!("#define VIP_REDIRECTS {VIP_REDIRECTS}"),
            format!("#define GRE_FLAG_KEY {:#06x}", packet::gre::flags::KEY),
        ] {
            assert!(src.contains(&want), "bpf/steer.h lacks {want:?}");
        }
    }
}
