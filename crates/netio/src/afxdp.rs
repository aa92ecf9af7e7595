//! AF_XDP ports: an XDP program (ours, `bpf/xsk.c`, built by `build.rs`,
//! or one the caller brings, [`Program::Custom`]) redirects the
//! interface's frames to an AF_XDP socket whose UMEM is the whole `maio`
//! pool, so received frames land directly in pool buffers.
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
//!
//! The pieces a port is made of are public for programs and sockets of
//! other kinds: [`XdpProgram`] (an XDP object loaded, attached native else
//! generic, run over frames without an interface by `BPF_PROG_TEST_RUN`)
//! and [`XskSocket`] (an AF_XDP socket over a UMEM of the caller's, its
//! rings mapped).

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
    SocketAddrXdp, SocketAddrXdpFlags, XdpMmapOffsets, XdpRingFlags, XdpRingOffset, XdpUmemReg,
    XdpUmemRegFlags, XDP_PGOFF_RX_RING, XDP_PGOFF_TX_RING, XDP_UMEM_PGOFF_COMPLETION_RING,
    XDP_UMEM_PGOFF_FILL_RING,
};
use rustix::net::{sockopt, AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType};

use crate::{Hint, Nic, PortStats, Slot};

#[cfg(fastpath_xdp_obj)]
// Aligned: the ELF parser reads the object in place.
static XSK_OBJ: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/xsk.o"));
#[cfg(not(fastpath_xdp_obj))]
static XSK_OBJ: &[u8] = &[];

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
    /// The caller's program ([`Program::Custom`]) could not be loaded.
    #[error("AF_XDP on {iface}: {source}")]
    Custom {
        /// The interface.
        iface: String,
        /// The loader's answer.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
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
    /// A set of steered prefixes the program cannot hold.
    #[error("AF_XDP on {iface}: steering prefixes: {why}")]
    Prefixes {
        /// The interface.
        iface: String,
        /// What is wrong with the set.
        why: String,
    },
    /// A device map of the program could not be set to the interface.
    #[error("AF_XDP on {iface}: the {program}'s device map {map}: {source}")]
    DevMap {
        /// The interface.
        iface: String,
        /// Which program.
        program: &'static str,
        /// The map.
        map: &'static str,
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

/// The interface index of `iface` in the calling thread's namespace.
fn ifindex(iface: &str) -> Result<u32, Error> {
    crate::afpacket::ifindex(iface).ok_or_else(|| Error::NoInterface {
        iface: iface.into(),
    })
}

/// An XDP program, loaded (its maps created), with what an AF_XDP port's
/// interface needs of it: the program's name in its object, the XSK map
/// the port puts its sockets in (by queue; `xsks` unless said otherwise),
/// the VIP map its [`VipFilter`] writes (`vips`: `bpf/steer.h`'s layout),
/// and the device maps whose entry 0 becomes the interface (where frames
/// the program redirects leave; none unless said). netio's steering
/// program ([`XdpProgram::steering`]) is one; a program that handles some
/// frames itself and steers the rest by including `steer.h` is another.
///
/// Attached, the program stays attached until this drops.
pub struct XdpProgram {
    bpf: Ebpf,
    name: &'static str,
    what: &'static str,
    xsk_map: &'static str,
    vip_map: &'static str,
    egress_maps: Vec<&'static str>,
}

impl XdpProgram {
    /// Loads the object `obj` (as clang writes it) and verifies its XDP
    /// program `name`; `what` names the program in errors, which name
    /// `iface` too. An empty object is one the build could not compile.
    pub fn load(
        obj: &[u8],
        name: &'static str,
        what: &'static str,
        iface: &str,
    ) -> Result<Self, Error> {
        if obj.is_empty() {
            return Err(Error::NotBuilt {
                iface: iface.into(),
                what,
            });
        }
        let bpf = Ebpf::load(obj).map_err(|source| Error::Load {
            iface: iface.into(),
            program: what,
            source: Box::new(source),
        })?;
        let mut p = Self::from_loaded(bpf, name, what);
        p.verify(iface)?;
        Ok(p)
    }

    /// An object the caller loaded (with its own map sizes, say, and the
    /// maps it keeps for itself taken out), holding the XDP program `name`,
    /// verified or not; `what` names the program in errors.
    pub fn from_loaded(bpf: Ebpf, name: &'static str, what: &'static str) -> Self {
        XdpProgram {
            bpf,
            name,
            what,
            xsk_map: "xsks",
            vip_map: "vips",
            egress_maps: Vec::new(),
        }
    }

    /// netio's steering program (`bpf/xsk.c`): frames for a VIP to the
    /// socket of their queue, the rest to the kernel (see `bpf/steer.h`).
    /// With an empty VIP set it passes every frame, which also makes a
    /// veth accept frames its peer sends with `XDP_TX` or a redirect.
    pub fn steering(iface: &str) -> Result<Self, Error> {
        Self::load(XSK_OBJ, "fastpath_xsk", "XDP program", iface)
    }

    /// The XSK map is called `name`.
    pub fn xsk_map(mut self, name: &'static str) -> Self {
        self.xsk_map = name;
        self
    }

    /// The VIP map is called `name`.
    pub fn vip_map(mut self, name: &'static str) -> Self {
        self.vip_map = name;
        self
    }

    /// The device map `name` gets the interface as its entry 0 when ports
    /// are opened.
    pub fn egress_map(mut self, name: &'static str) -> Self {
        self.egress_maps.push(name);
        self
    }

    /// How errors name the program.
    pub fn what(&self) -> &'static str {
        self.what
    }

    /// The object, for the program's own maps.
    pub fn object(&mut self) -> &mut Ebpf {
        &mut self.bpf
    }

    /// The program.
    fn program(&mut self, iface: &str) -> Result<&mut Xdp, Error> {
        let (name, what) = (self.name, self.what);
        self.bpf
            .program_mut(name)
            .ok_or_else(|| Error::Missing {
                iface: iface.into(),
                what: name,
            })?
            .try_into()
            .map_err(|e| failed(what, iface, "finding", e))
    }

    /// Verifies the program (loads it into the kernel) unless it is.
    fn verify(&mut self, iface: &str) -> Result<(), Error> {
        let what = self.what;
        let prog = self.program(iface)?;
        if prog.fd().is_err() {
            prog.load()
                .map_err(|e| failed(what, iface, "verifying", e))?;
        }
        Ok(())
    }

    /// Attaches the program to `iface` in native mode, else in generic
    /// mode; says which.
    pub fn attach(&mut self, iface: &str) -> Result<XdpMode, Error> {
        self.verify(iface)?;
        let what = self.what;
        let prog = self.program(iface)?;
        match prog.attach(iface, XdpFlags::DRV_MODE) {
            Ok(_) => Ok(XdpMode::Native),
            Err(native) => match prog.attach(iface, XdpFlags::SKB_MODE) {
                Ok(_) => Ok(XdpMode::Generic),
                Err(generic) => Err(Error::Attach {
                    iface: iface.into(),
                    program: what,
                    native: Box::new(native),
                    source: Box::new(generic),
                }),
            },
        }
    }

    /// Attaches the program to `iface` in native mode only (on veth, what
    /// makes the interface accept frames its peer redirects).
    pub fn attach_native(&mut self, iface: &str) -> Result<(), Error> {
        self.attach_in(iface, XdpFlags::DRV_MODE)
    }

    /// Attaches the program to `iface` in generic (SKB) mode only.
    pub fn attach_generic(&mut self, iface: &str) -> Result<(), Error> {
        self.attach_in(iface, XdpFlags::SKB_MODE)
    }

    fn attach_in(&mut self, iface: &str, flags: XdpFlags) -> Result<(), Error> {
        self.verify(iface)?;
        let what = self.what;
        self.program(iface)?
            .attach(iface, flags)
            .map(|_| ())
            .map_err(|e| failed(what, iface, "attaching", e))
    }

    /// Writes `value` into entry 0 of the program's array map `map` (a
    /// program's configuration); `what` names it in errors.
    pub fn set_config<T: aya::Pod>(
        &mut self,
        iface: &str,
        map: &'static str,
        what: &'static str,
        value: T,
    ) -> Result<(), Error> {
        let map_err = |source| Error::Map {
            iface: iface.into(),
            what,
            source: Box::new(source),
        };
        let mut arr: aya::maps::Array<_, T> =
            aya::maps::Array::try_from(self.bpf.map_mut(map).ok_or_else(|| Error::Missing {
                iface: iface.into(),
                what: map,
            })?)
            .map_err(map_err)?;
        arr.set(0, value, 0).map_err(map_err)
    }

    /// Makes `iface` (index `index`) entry 0 of the device map `map`.
    pub fn set_egress(&mut self, iface: &str, index: u32, map: &'static str) -> Result<(), Error> {
        let what = self.what;
        let mut out: aya::maps::DevMap<_> =
            aya::maps::DevMap::try_from(self.bpf.map_mut(map).ok_or_else(|| Error::Missing {
                iface: iface.into(),
                what: map,
            })?)
            .map_err(|source| Error::Map {
                iface: iface.into(),
                what: "device map",
                source: Box::new(source),
            })?;
        out.set(0, index, None, 0).map_err(|source| Error::DevMap {
            iface: iface.into(),
            program: what,
            map,
            source: Box::new(source),
        })
    }

    /// Runs the program once over `frame` (`BPF_PROG_TEST_RUN`, not live:
    /// nothing is sent, no interface needed) and returns what it did and
    /// the frame as it left it. The program must be verified (loaded).
    pub fn test_run(&self, frame: &[u8]) -> io::Result<Verdict> {
        test_run(self.fd()?, frame)
    }

    /// Runs the program `repeat` times over `frame` in live-frames mode
    /// (`BPF_F_TEST_XDP_LIVE_FRAMES`, Linux 5.18), as if the frames came in
    /// on queue `queue` of interface `ifindex`: those it returns `XDP_TX`
    /// or a redirect for are really sent, in batches of `batch` (256 at
    /// most) flushed together. Returns when they are sent.
    pub fn test_run_live(
        &self,
        frame: &[u8],
        ifindex: u32,
        queue: u32,
        repeat: u32,
        batch: u32,
    ) -> io::Result<()> {
        test_run_live(self.fd()?, frame, ifindex, queue, repeat, batch)
    }

    /// The verified program's descriptor.
    fn fd(&self) -> io::Result<BorrowedFd<'_>> {
        let not_loaded = |what: &str| io::Error::new(io::ErrorKind::NotFound, what.to_string());
        let prog: &Xdp = self
            .bpf
            .program(self.name)
            .ok_or_else(|| not_loaded("no such program in the object"))?
            .try_into()
            .map_err(|_| not_loaded("not an XDP program"))?;
        prog.fd()
            .map(|fd| fd.as_fd())
            .map_err(|_| not_loaded("the program is not verified"))
    }
}

/// An [`Error::Program`].
fn failed(program: &'static str, iface: &str, step: &'static str, e: ProgramError) -> Error {
    Error::Program {
        iface: iface.into(),
        program,
        step,
        source: Box::new(e),
    }
}

/// Loads the XDP program an interface's AF_XDP ports run, each time ports
/// are opened ([`Program::Custom`]).
pub trait LoadProgram {
    /// Loads the program, its maps created, for ports on `iface`.
    fn load(&self, iface: &str) -> Result<XdpProgram, Box<dyn std::error::Error + Send + Sync>>;
}

/// Which XDP program an AF_XDP port's interface runs.
#[derive(Clone, Copy)]
pub enum Program<'a> {
    /// Steering only ([`XdpProgram::steering`]): every VIP frame to the
    /// socket.
    Steer,
    /// The caller's program, loaded by this when the ports are opened.
    Custom(&'a dyn LoadProgram),
}

impl std::fmt::Debug for Program<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Program::Steer => f.write_str("Steer"),
            Program::Custom(_) => f.write_str("Custom"),
        }
    }
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
    /// `vip_prefixes` (`steer.h`), if the program has it.
    prefixes: Option<Arc<Mutex<PrefixTrie>>>,
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
    /// Prefixes (address, length in the IPv4-mapped form): every frame to
    /// an address within one goes to the socket.
    prefixes: Vec<([u8; 16], u8)>,
}

/// `steer.h`'s `vip_prefixes`: address (IPv4-mapped) and length -> kind.
type PrefixTrie = aya::maps::LpmTrie<MapData, [u8; 16], u8>;

/// The most prefixes the steering program's `vip_prefixes` trie holds
/// (`steer.h`).
pub const MAX_VIP_PREFIXES: usize = 4096;

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

    /// Makes the set of steered prefixes exactly `prefixes` (address in
    /// the IPv4-mapped form, bits beyond the length zero, length up to
    /// 128: an IPv4 /n is a /96+n): every frame to an address within one
    /// goes to the socket, as to a VIP (prefix groups, whose VIPs are not
    /// known as addresses). Refused whole, the set unchanged, when the
    /// program has no prefix trie (an empty set is always accepted), a
    /// length is over 128, or there are more than [`MAX_VIP_PREFIXES`].
    pub fn set_prefixes(&self, prefixes: &[([u8; 16], u8)]) -> Result<(), crate::Error> {
        let refuse = |why: String| -> crate::Error {
            Error::Prefixes {
                iface: self.iface.to_string(),
                why,
            }
            .into()
        };
        let mut want: Vec<([u8; 16], u8)> = prefixes.to_vec();
        want.sort_unstable();
        want.dedup();
        if let Some((_, l)) = want.iter().find(|(_, l)| *l > 128) {
            return Err(refuse(format!("prefix length {l} is over 128")));
        }
        if want.len() > MAX_VIP_PREFIXES {
            return Err(refuse(format!(
                "{} prefixes, more than the program's trie holds ({MAX_VIP_PREFIXES})",
                want.len()
            )));
        }
        let Some(trie) = &self.prefixes else {
            if want.is_empty() {
                return Ok(());
            }
            return Err(refuse("the XDP program has no `vip_prefixes` trie".into()));
        };
        let map_err = |source| Error::Map {
            iface: self.iface.to_string(),
            what: "VIP prefix trie",
            source: Box::new(source),
        };
        let mut e = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let mut t = trie.lock().unwrap_or_else(|p| p.into_inner());
        let key = |(a, l): &([u8; 16], u8)| aya::maps::lpm_trie::Key::new(u32::from(*l), *a);
        let going: Vec<([u8; 16], u8)> = e
            .prefixes
            .iter()
            .filter(|p| want.binary_search(p).is_err())
            .copied()
            .collect();
        // New ones first, then the ones that went, so that a frame to an
        // address under both an old and a new prefix is steered
        // throughout; but when the two sets together overflow the trie,
        // the ones that went first (they are going anyway).
        let room_for_both = want.len() + going.len() <= MAX_VIP_PREFIXES;
        let remove = |t: &mut PrefixTrie| -> Result<(), Error> {
            going
                .iter()
                .try_for_each(|p| t.remove(&key(p)).map_err(map_err))
        };
        if !room_for_both {
            remove(&mut t)?;
        }
        for p in &want {
            t.insert(&key(p), VIP_ALL, 0).map_err(map_err)?;
        }
        if room_for_both {
            remove(&mut t)?;
        }
        e.prefixes = want;
        Ok(())
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
/// Entries in a port's TX and completion rings.
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

/// Which of an AF_XDP socket's four rings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RingKind {
    /// Buffers (UMEM addresses) given to the kernel to receive into.
    Fill,
    /// Buffers (UMEM addresses) the kernel is done sending from.
    Completion,
    /// Received frames (descriptors).
    Rx,
    /// Frames to send (descriptors).
    Tx,
}

impl RingKind {
    /// Bytes per entry: an address, or a descriptor (address, length,
    /// options).
    fn entry(self) -> usize {
        match self {
            RingKind::Fill | RingKind::Completion => 8,
            RingKind::Rx | RingKind::Tx => 16,
        }
    }

    /// Where the socket maps it.
    fn pgoff(self) -> u64 {
        match self {
            RingKind::Fill => XDP_UMEM_PGOFF_FILL_RING,
            RingKind::Completion => XDP_UMEM_PGOFF_COMPLETION_RING,
            RingKind::Rx => XDP_PGOFF_RX_RING,
            RingKind::Tx => XDP_PGOFF_TX_RING,
        }
    }

    /// Its offsets among the socket's.
    fn offsets(self, off: &XdpMmapOffsets) -> &XdpRingOffset {
        match self {
            RingKind::Fill => &off.fr,
            RingKind::Completion => &off.cr,
            RingKind::Rx => &off.rx,
            RingKind::Tx => &off.tx,
        }
    }
}

/// One of an AF_XDP socket's rings, mapped: the producer and consumer
/// words it shares with the kernel (to be read and written atomically,
/// with acquire and release), its flags, and its entries, addressed by a
/// free-running index (wrapped to the ring's size here).
pub struct XskRing {
    map: MmapMut,
    producer: usize,
    consumer: usize,
    flags: usize,
    desc: usize,
    mask: u32,
    /// Entry size: 8 (fill, completion) or 16 (rx, tx).
    entry: usize,
}

impl XskRing {
    fn map(
        fd: BorrowedFd<'_>,
        off: &XdpRingOffset,
        pgoff: u64,
        entry: usize,
        entries: u32,
        iface: &str,
    ) -> Result<XskRing, Error> {
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
        Ok(XskRing {
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

    /// The producer index (entries produced so far, wrapping).
    pub fn prod(&self) -> &AtomicU32 {
        self.word(self.producer)
    }

    /// The consumer index (entries consumed so far, wrapping).
    pub fn cons(&self) -> &AtomicU32 {
        self.word(self.consumer)
    }

    /// Whether the kernel asks to be woken to process the ring (the
    /// socket was bound with need_wakeup).
    pub fn needs_wakeup(&self) -> bool {
        self.word(self.flags).load(Ordering::Acquire) & XdpRingFlags::XDP_RING_NEED_WAKEUP.bits()
            != 0
    }

    /// Entries in the ring.
    pub fn entries(&self) -> u32 {
        self.mask + 1
    }

    fn at(&self, i: u32) -> usize {
        self.desc + (i & self.mask) as usize * self.entry
    }

    /// Writes the address entry `i` (fill ring).
    pub fn put_u64(&mut self, i: u32, v: u64) {
        let a = self.at(i);
        self.map[a..a + 8].copy_from_slice(&v.to_ne_bytes());
    }

    /// Reads the address entry `i` (completion ring).
    pub fn get_u64(&self, i: u32) -> u64 {
        let a = self.at(i);
        u64::from_ne_bytes(self.map[a..a + 8].try_into().expect("8 bytes"))
    }

    /// Writes the descriptor entry `i` (TX ring): a frame of `len` bytes
    /// at UMEM address `addr`.
    pub fn put_desc(&mut self, i: u32, addr: u64, len: u32) {
        let a = self.at(i);
        self.map[a..a + 8].copy_from_slice(&addr.to_ne_bytes());
        self.map[a + 8..a + 12].copy_from_slice(&len.to_ne_bytes());
        self.map[a + 12..a + 16].copy_from_slice(&0u32.to_ne_bytes());
    }

    /// Reads the descriptor entry `i` (RX ring): UMEM address and length.
    pub fn get_desc(&self, i: u32) -> (u64, u32) {
        let a = self.at(i);
        (
            u64::from_ne_bytes(self.map[a..a + 8].try_into().expect("8 bytes")),
            u32::from_ne_bytes(self.map[a + 8..a + 12].try_into().expect("4 bytes")),
        )
    }
}

/// An AF_XDP socket over a UMEM the caller owns: its rings made and mapped
/// by [`XskSocket::ring`], bound by [`XskSocket::bind`] to one queue of an
/// interface, in copy mode with need_wakeup. What an [`AfXdpPort`] is made
/// of, for a socket of another kind (a transmit-only one with a UMEM of its
/// own, say).
pub struct XskSocket {
    fd: OwnedFd,
    iface: String,
    offsets: XdpMmapOffsets,
}

impl XskSocket {
    /// A socket for `iface` whose UMEM is the `len` bytes at `addr`, in
    /// chunks of `chunk` bytes (one frame each).
    ///
    /// # Safety
    /// The memory must stay mapped while the socket is open, and be used
    /// only as the rings say: the kernel writes received frames into the
    /// chunks the fill ring gives it, and reads frames to send from those
    /// the TX ring names, until they come back on the RX and completion
    /// rings.
    pub unsafe fn new(iface: &str, addr: *mut u8, len: usize, chunk: u32) -> Result<Self, Error> {
        let sys = |op| sys(iface, op);
        let fd = rustix::net::socket_with(
            AddressFamily::XDP,
            SocketType::RAW,
            SocketFlags::CLOEXEC,
            None,
        )
        .map_err(sys("socket"))?;
        let reg = XdpUmemReg {
            addr: addr as u64,
            len: len as u64,
            chunk_size: chunk,
            headroom: 0,
            flags: XdpUmemRegFlags::empty(),
            tx_metadata_len: 0,
        };
        sockopt::set_xdp_umem_reg(fd.as_fd(), reg).map_err(sys("registering the UMEM"))?;
        let offsets = sockopt::xdp_mmap_offsets(fd.as_fd()).map_err(sys("XDP_MMAP_OFFSETS"))?;
        Ok(XskSocket {
            fd,
            iface: iface.into(),
            offsets,
        })
    }

    /// Makes the ring `kind` with `entries` entries (a power of two),
    /// without mapping it: a socket must have fill and completion rings to
    /// be bound, also one that never receives.
    pub fn ring_size(&self, kind: RingKind, entries: u32) -> Result<(), Error> {
        let sys = |op| sys(&self.iface, op);
        let s = self.fd.as_fd();
        match kind {
            RingKind::Fill => {
                sockopt::set_xdp_umem_fill_ring_size(s, entries).map_err(sys("fill ring size"))
            }
            RingKind::Completion => sockopt::set_xdp_umem_completion_ring_size(s, entries)
                .map_err(sys("completion ring size")),
            RingKind::Rx => sockopt::set_xdp_rx_ring_size(s, entries).map_err(sys("RX ring size")),
            RingKind::Tx => sockopt::set_xdp_tx_ring_size(s, entries).map_err(sys("TX ring size")),
        }
    }

    /// Makes the ring `kind` with `entries` entries (a power of two) and
    /// maps it.
    pub fn ring(&self, kind: RingKind, entries: u32) -> Result<XskRing, Error> {
        self.ring_size(kind, entries)?;
        XskRing::map(
            self.fd.as_fd(),
            kind.offsets(&self.offsets),
            kind.pgoff(),
            kind.entry(),
            entries,
            &self.iface,
        )
    }

    /// Binds the socket to queue `queue` of the interface (index
    /// `ifindex`), in copy mode with need_wakeup.
    pub fn bind(&self, ifindex: u32, queue: u32) -> Result<(), Error> {
        let addr = SocketAddrXdp::new(
            SocketAddrXdpFlags::XDP_COPY | SocketAddrXdpFlags::XDP_USE_NEED_WAKEUP,
            ifindex,
            queue,
        );
        rustix::net::bind(self.fd.as_fd(), &addr).map_err(sys(&self.iface, "bind"))
    }

    /// Readies the socket to have `frames` frames of its TX ring in flight
    /// and lets one wake-up send them all where the kernel can (see
    /// [`raise_tx_budget`]); returns how many one wake-up sends.
    pub fn prepare_tx(&self, frames: u32) -> u32 {
        let budget = if raise_tx_budget(self.fd.as_fd(), frames) {
            frames
        } else {
            32
        };
        room_in_flight(self.fd.as_fd(), frames);
        budget
    }

    /// The socket.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The socket, owned.
    pub fn into_fd(self) -> OwnedFd {
        self.fd
    }
}

/// Turns a failed system call `op` on `iface`'s socket into an
/// [`Error::Sys`].
fn sys<'a>(iface: &'a str, op: &'static str) -> impl FnOnce(rustix::io::Errno) -> Error + 'a {
    move |e| Error::Sys {
        iface: iface.into(),
        op,
        source: e.into(),
    }
}

/// An AF_XDP port on queue 0 of an interface.
pub struct AfXdpPort {
    /// The socket; closed first on drop, before its buffers go back.
    fd: Option<OwnedFd>,
    iface: String,
    pool: Pool,
    handle: Handle,
    fill: XskRing,
    comp: XskRing,
    rx: XskRing,
    tx: XskRing,
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
    /// Keeps the XDP program attached while any of its ports lives.
    _program: Arc<Mutex<XdpProgram>>,
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
        program: Program<'_>,
    ) -> Result<Vec<Self>, crate::Error> {
        if matches!(program, Program::Steer) && XSK_OBJ.is_empty() {
            return Err(Error::NotBuilt {
                iface: iface.into(),
                what: "XDP program",
            }
            .into());
        }
        let index = ifindex(iface)?;
        let mut prog = match program {
            Program::Steer => XdpProgram::steering(iface)?,
            Program::Custom(loader) => loader.load(iface).map_err(|source| Error::Custom {
                iface: iface.into(),
                source,
            })?,
        };
        // Frames the program redirects leave by the interface itself.
        for map in prog.egress_maps.clone() {
            prog.set_egress(iface, index, map)?;
        }
        let mode = prog.attach(iface)?;
        let map_err = |what| {
            move |source| Error::Map {
                iface: iface.into(),
                what,
                source: Box::new(source),
            }
        };
        let vip_map =
            aya::maps::HashMap::try_from(prog.bpf.take_map(prog.vip_map).ok_or_else(|| {
                Error::Missing {
                    iface: iface.into(),
                    what: "VIP map",
                }
            })?)
            .map_err(map_err("VIP map"))?;
        // A program that includes `steer.h` has the prefix trie; one that
        // steers by its own rules may not.
        let prefixes = match prog.bpf.take_map("vip_prefixes") {
            Some(m) => Some(Arc::new(Mutex::new(
                aya::maps::LpmTrie::try_from(m).map_err(map_err("VIP prefix trie"))?,
            ))),
            None => None,
        };
        let filter = VipFilter {
            map: Arc::new(Mutex::new(vip_map)),
            prefixes,
            iface: iface.into(),
            entries: Arc::new(Mutex::new(Entries::default())),
        };
        filter.set(vips)?;

        let shared = Arc::new(Mutex::new(prog));
        let mut ports = Vec::new();
        for queue in 0..queues.max(1) {
            let mut prog_guard = shared.lock().unwrap_or_else(|p| p.into_inner());
            let (base, len) = pool.region();
            let chunk = pool.buf_size() as u32;
            // SAFETY: the pool's region stays mapped while the port holds
            // the pool (a clone of it, below), and its buffers are lent to
            // the kernel only through the rings: the fill ring's buffers
            // and the transmit buffers are the port's until they come back.
            let sock = unsafe { XskSocket::new(iface, base, len, chunk) }?;
            let fill = sock.ring(RingKind::Fill, RX_RING)?;
            let comp = sock.ring(RingKind::Completion, RING)?;
            let rx = sock.ring(RingKind::Rx, RX_RING)?;
            let tx = sock.ring(RingKind::Tx, RING)?;
            sock.bind(index, queue)?;
            let tx_budget = sock.prepare_tx(RING);
            let busy_poll = busy_poll_configured(iface) && prefer_busy_poll(sock.fd());
            let xsk_map = prog_guard.xsk_map;
            let mut xsks: aya::maps::XskMap<_> =
                aya::maps::XskMap::try_from(prog_guard.bpf.map_mut(xsk_map).ok_or_else(|| {
                    Error::Missing {
                        iface: iface.into(),
                        what: "XSK map",
                    }
                })?)
                .map_err(map_err("XSK map"))?;
            xsks.set(queue, sock.fd().as_raw_fd(), 0)
                .map_err(map_err("inserting the socket into the XSK map"))?;
            drop(prog_guard);
            let mut port = AfXdpPort {
                fd: Some(sock.into_fd()),
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
                _program: Arc::clone(&shared),
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
        program: Program<'_>,
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

/// `BPF_PROG_TEST_RUN`, the `bpf(2)` command.
const BPF_PROG_TEST_RUN: libc::c_long = 10;
/// `BPF_F_TEST_XDP_LIVE_FRAMES` (Linux 5.18): the frames a test run's
/// program returns XDP_TX or XDP_REDIRECT for are really sent.
const BPF_F_TEST_XDP_LIVE_FRAMES: u32 = 1 << 1;

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

/// What a test run of an XDP program did with a frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// The program's return: 1 drop, 2 pass, 3 transmit, 4 redirect.
    pub action: u32,
    /// The frame as the program left it.
    pub frame: Vec<u8>,
}

/// `XDP_TX`, a [`Verdict::action`].
pub const XDP_TX: u32 = 3;

/// Runs the XDP program `prog` once over `frame` ([`XdpProgram::test_run`]).
fn test_run(prog: BorrowedFd<'_>, frame: &[u8]) -> io::Result<Verdict> {
    // Room for the frame grown by any headers the program may push.
    let mut out = vec![0u8; frame.len() + 512];
    let mut attr = TestRunAttr {
        prog_fd: prog.as_raw_fd() as u32,
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
    Ok(Verdict {
        action: attr.retval,
        frame: out,
    })
}

/// Runs `prog` over `frame` in live-frames mode
/// ([`XdpProgram::test_run_live`]).
fn test_run_live(
    prog: BorrowedFd<'_>,
    frame: &[u8],
    ifindex: u32,
    queue: u32,
    repeat: u32,
    batch: u32,
) -> io::Result<()> {
    let ctx = XdpMd {
        data_end: frame.len() as u32,
        ingress_ifindex: ifindex,
        rx_queue_index: queue,
        ..XdpMd::default()
    };
    let mut attr = TestRunAttr {
        prog_fd: prog.as_raw_fd() as u32,
        data_size_in: frame.len() as u32,
        data_in: frame.as_ptr() as u64,
        repeat,
        ctx_size_in: std::mem::size_of::<XdpMd>() as u32,
        ctx_in: std::ptr::from_ref(&ctx) as u64,
        flags: BPF_F_TEST_XDP_LIVE_FRAMES,
        batch_size: batch,
        ..TestRunAttr::default()
    };
    // SAFETY: the frame and the context it points to live until the call
    // returns, and in live mode the kernel writes into neither (no output
    // buffers given).
    unsafe { prog_test_run(&mut attr) }
}

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
