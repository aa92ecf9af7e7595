//! The load balancer's XDP fast path (`bpf/lb.c`): loading it, and what
//! user space writes into its maps and reads back. The program forwards the
//! common case in the driver (GRE out of the same interface, `XDP_TX`) and
//! steers the rest to the AF_XDP socket like netio's steering program;
//! [`super::XdpTables`] decides what the maps hold, this module only knows
//! them (their layout is [`super::abi`]'s).
//!
//! The backends, the Maglev slots and the traffic counters are array maps
//! the kernel lets us map (`BPF_F_MMAPABLE`): a reload writes what changed
//! at memory speed, without a system call per entry, and counters are read
//! the same way. The program reads them while we write: a backend entry or
//! slot is one aligned word the program reads whole, and a VIP only points
//! at a table once the table is written ([`XdpLb::set_vips`] after
//! [`XdpLb::write_slots`]).

use std::collections::HashSet;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{fence, Ordering};
use std::sync::{Arc, Mutex};

use aya::maps::{Map, MapData, MapError};
use aya::programs::{ProgramError, Xdp};
use aya::{Ebpf, EbpfError, EbpfLoader};
use memmap2::{MmapMut, MmapOptions};
use netio::afxdp::{LoadProgram, XdpProgram};

use super::abi::{
    AddrKey, BackendEntry, Conf, PrefixGroup, PrefixKey, QuicIdKey, Stats, SuffixKey, Traffic,
    VipEntry, VipKey, VipKey6,
};

#[cfg(fastpath_xdp_obj)]
// Aligned: the ELF parser reads the object in place.
static LB_OBJ: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/lb.o"));
#[cfg(not(fastpath_xdp_obj))]
static LB_OBJ: &[u8] = &[];

/// The program's name in the object.
const PROGRAM: &str = "fastpath_lb";

/// Why the XDP fast path could not be set up or used.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The program was not compiled into this binary.
    #[error("the XDP load balancer was not built: clang and libbpf-dev were missing at build time (run scripts/setup.sh and rebuild)")]
    NotBuilt,
    /// The object could not be loaded (maps created).
    #[error("loading the XDP load balancer: {0}")]
    Load(#[source] Box<EbpfError>),
    /// A program or map is not in the object.
    #[error("the XDP load balancer's object has no {0}")]
    Missing(&'static str),
    /// The program could not be found, verified or attached.
    #[error("{step} the XDP load balancer: {source}")]
    Program {
        /// What was being done.
        step: &'static str,
        /// aya's answer.
        #[source]
        source: Box<ProgramError>,
    },
    /// A map could not be read or changed.
    #[error("the XDP load balancer's {what}: {source}")]
    Map {
        /// Which map, doing what.
        what: &'static str,
        /// aya's answer.
        #[source]
        source: Box<MapError>,
    },
    /// A map could not be mapped into memory.
    #[error("mapping the XDP load balancer's {what}: {source}")]
    Mmap {
        /// Which map.
        what: &'static str,
        /// The system's answer.
        #[source]
        source: std::io::Error,
    },
    /// A test run of the program failed.
    #[error("BPF_PROG_TEST_RUN of the XDP load balancer: {0}")]
    TestRun(#[source] std::io::Error),
    /// An index beyond what the maps were made for.
    #[error("the XDP load balancer's {what} has room for {cap}, {asked} asked")]
    Full {
        /// Which map.
        what: &'static str,
        /// Its capacity.
        cap: usize,
        /// What was asked for.
        asked: usize,
    },
}

// SAFETY: eighteen u32 fields (arrays included) then three arrays of
// eight u8 (96 bytes, a multiple of the 4-byte alignment), no padding,
// any bit pattern valid.
unsafe impl aya::Pod for Conf {}

// SAFETY: five u32 fields (one and an array of four), no padding, any bit
// pattern valid.
unsafe impl aya::Pod for PrefixGroup {}

// SAFETY: seven u32 fields (an array of four among them), no padding, any
// bit pattern valid.
unsafe impl aya::Pod for SuffixKey {}

// SAFETY: three u32 fields, no padding, any bit pattern valid.
unsafe impl aya::Pod for VipKey {}

// SAFETY: six u32 fields (an array of four and two more), no padding, any
// bit pattern valid.
unsafe impl aya::Pod for VipKey6 {}

// SAFETY: four u32 fields, no padding, any bit pattern valid.
unsafe impl aya::Pod for VipEntry {}

// SAFETY: eighteen u64 fields (an array of six among them), no padding,
// any bit pattern valid.
unsafe impl aya::Pod for Stats {}

// SAFETY: two u32 fields and an array of sixteen u8 (24 bytes, a multiple
// of the 4-byte alignment), no padding, any bit pattern valid.
unsafe impl aya::Pod for QuicIdKey {}

// SAFETY: an array of four u32, no padding, any bit pattern valid.
unsafe impl aya::Pod for AddrKey {}

/// How big the maps are made (fixed when the program is loaded).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizes {
    /// VIPs (entries of each VIP map, IPv4 and IPv6, and their counters).
    pub vips: u32,
    /// Backend ids.
    pub backends: u32,
    /// Maglev slots, all tables together (rounded up to even).
    pub slots: u32,
    /// Connection-table entries (of each table, IPv4 and IPv6).
    pub conns: u32,
    /// Prefixes of the prefix groups.
    pub prefixes: u32,
    /// Server IDs of the `quic` VIPs routed in the driver, all VIPs
    /// together (one entry per VIP and server ID).
    pub quic_ids: u32,
}

/// The CPUs the kernel may run the program on (`nr_cpu_ids`): the
/// per-CPU rows of the traffic counters.
fn possible_cpus() -> usize {
    std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .ok()
        .and_then(|s| {
            s.trim()
                .split(',')
                .filter_map(|r| r.rsplit('-').next()?.parse::<usize>().ok())
                .max()
        })
        .map(|m| m + 1)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// An array map mapped into memory, as `T`s.
struct Mapped<T> {
    map: MmapMut,
    len: usize,
    /// The map: the mapping holds it too, kept for clarity of ownership.
    _data: MapData,
    _t: std::marker::PhantomData<T>,
}

impl<T: Copy> Mapped<T> {
    fn new(bpf: &mut Ebpf, name: &'static str, len: usize) -> Result<Self, Error> {
        let data = match bpf.take_map(name).ok_or(Error::Missing(name))? {
            Map::Array(d) => d,
            _ => return Err(Error::Missing(name)),
        };
        let bytes = (len * std::mem::size_of::<T>()).next_multiple_of(4096);
        let fd = data.fd().as_fd().as_raw_fd();
        // SAFETY: the map is an array of `len` elements of
        // `size_of::<T>()` bytes (a multiple of 8, so no padding between
        // elements) created BPF_F_MMAPABLE; the kernel allows a shared
        // mapping of its page-rounded size, and keeps the map alive while
        // mapped.
        let map = unsafe { MmapOptions::new().len(bytes).map_mut(fd) }
            .map_err(|source| Error::Mmap { what: name, source })?;
        Ok(Mapped {
            map,
            len,
            _data: data,
            _t: std::marker::PhantomData,
        })
    }

    fn ptr(&self) -> *mut T {
        self.map.as_ptr().cast::<T>().cast_mut()
    }

    fn write(&mut self, at: usize, v: T) {
        if at < self.len {
            // SAFETY: `at` is in bounds; the mapping is page-aligned, and
            // `T`'s alignment divides its element size. The program reads
            // the element concurrently: a volatile write of a whole value.
            unsafe { self.ptr().add(at).write_volatile(v) }
        }
    }

    fn read(&self, at: usize) -> Option<T> {
        // SAFETY: as in `write`; the program may be writing it (counters):
        // a volatile read of aligned words.
        (at < self.len).then(|| unsafe { self.ptr().add(at).read_volatile() })
    }
}

/// The maps of a loaded XDP load balancer. Cloneable (one set of maps);
/// the daemon's control plane writes them when the tables change.
#[derive(Clone)]
pub struct XdpLb {
    inner: Arc<Mutex<Inner>>,
    sizes: Sizes,
    cpus: usize,
}

struct Inner {
    conf: aya::maps::Array<MapData, Conf>,
    vips: aya::maps::HashMap<MapData, VipKey, VipEntry>,
    vip_set: HashSet<VipKey>,
    vips6: aya::maps::HashMap<MapData, VipKey6, VipEntry>,
    vip6_set: HashSet<VipKey6>,
    prefixes: aya::maps::LpmTrie<MapData, [u32; 4], PrefixGroup>,
    prefix_set: HashSet<PrefixKey>,
    suffixes: aya::maps::HashMap<MapData, SuffixKey, VipEntry>,
    suffix_set: HashSet<SuffixKey>,
    vip_addrs: aya::maps::HashMap<MapData, AddrKey, u32>,
    vip_addr_set: HashSet<AddrKey>,
    quic_ids: aya::maps::HashMap<MapData, QuicIdKey, u32>,
    quic_id_set: HashSet<QuicIdKey>,
    backends: Mapped<BackendEntry>,
    /// The slot array's elements ([`SlotPair`](super::abi::SlotPair)),
    /// slot by slot.
    slots: Mapped<u32>,
    traffic: Mapped<Traffic>,
    stats: aya::maps::PerCpuArray<MapData, Stats>,
}

/// Loads the object with maps of `sizes` and verifies the program (not
/// attached). The `xsks` and `vips` maps of the steering and the `lb_out`
/// device map stay in the returned [`Ebpf`] for the AF_XDP port; the load
/// balancer's own are in the [`XdpLb`].
fn load(sizes: Sizes) -> Result<(Ebpf, XdpLb), Error> {
    if LB_OBJ.is_empty() {
        return Err(Error::NotBuilt);
    }
    let cpus = possible_cpus();
    let sizes = Sizes {
        vips: sizes.vips.max(1),
        backends: sizes.backends.max(1),
        slots: sizes.slots.max(2).next_multiple_of(2),
        conns: sizes.conns.max(64),
        prefixes: sizes.prefixes.max(1),
        quic_ids: sizes.quic_ids.max(1),
    };
    let stride = sizes.vips as usize + sizes.backends as usize;
    let traffic = stride * cpus;
    let too_big = |what, asked: usize| Error::Full {
        what,
        cap: u32::MAX as usize,
        asked,
    };
    let mut bpf = EbpfLoader::new()
        .set_max_entries("lb_vips", sizes.vips)
        .set_max_entries("lb_vips6", sizes.vips)
        .set_max_entries("lb_backends", sizes.backends)
        .set_max_entries("lb_ring", sizes.slots / 2)
        .set_max_entries(
            "lb_traffic",
            u32::try_from(traffic).map_err(|_| too_big("traffic counters", traffic))?,
        )
        .set_max_entries("lb_conns", sizes.conns)
        .set_max_entries("lb_conns6", sizes.conns)
        .set_max_entries("lb_prefixes", sizes.prefixes)
        .set_max_entries("lb_suffixes", sizes.vips)
        .set_max_entries("lb_vip_addrs", sizes.vips)
        .set_max_entries("lb_quic_ids", sizes.quic_ids)
        .load(LB_OBJ)
        .map_err(|e| Error::Load(Box::new(e)))?;
    let prog: &mut Xdp = bpf
        .program_mut(PROGRAM)
        .ok_or(Error::Missing(PROGRAM))?
        .try_into()
        .map_err(|e| Error::Program {
            step: "finding",
            source: Box::new(e),
        })?;
    prog.load().map_err(|e| Error::Program {
        step: "verifying",
        source: Box::new(e),
    })?;
    let map = |what| {
        move |e| Error::Map {
            what,
            source: Box::new(e),
        }
    };
    let conf =
        aya::maps::Array::try_from(bpf.take_map("lb_conf").ok_or(Error::Missing("lb_conf"))?)
            .map_err(map("configuration"))?;
    let vips =
        aya::maps::HashMap::try_from(bpf.take_map("lb_vips").ok_or(Error::Missing("lb_vips"))?)
            .map_err(map("VIP map"))?;
    let vips6 =
        aya::maps::HashMap::try_from(bpf.take_map("lb_vips6").ok_or(Error::Missing("lb_vips6"))?)
            .map_err(map("IPv6 VIP map"))?;
    let prefixes = aya::maps::LpmTrie::try_from(
        bpf.take_map("lb_prefixes")
            .ok_or(Error::Missing("lb_prefixes"))?,
    )
    .map_err(map("prefix map"))?;
    let suffixes = aya::maps::HashMap::try_from(
        bpf.take_map("lb_suffixes")
            .ok_or(Error::Missing("lb_suffixes"))?,
    )
    .map_err(map("prefix-group VIP map"))?;
    let vip_addrs = aya::maps::HashMap::try_from(
        bpf.take_map("lb_vip_addrs")
            .ok_or(Error::Missing("lb_vip_addrs"))?,
    )
    .map_err(map("VIP address set"))?;
    let quic_ids = aya::maps::HashMap::try_from(
        bpf.take_map("lb_quic_ids")
            .ok_or(Error::Missing("lb_quic_ids"))?,
    )
    .map_err(map("server ID map"))?;
    let stats = aya::maps::PerCpuArray::try_from(
        bpf.take_map("lb_stats").ok_or(Error::Missing("lb_stats"))?,
    )
    .map_err(map("counters"))?;
    let inner = Inner {
        conf,
        vips,
        vip_set: HashSet::new(),
        vips6,
        vip6_set: HashSet::new(),
        prefixes,
        prefix_set: HashSet::new(),
        suffixes,
        suffix_set: HashSet::new(),
        vip_addrs,
        vip_addr_set: HashSet::new(),
        quic_ids,
        quic_id_set: HashSet::new(),
        backends: Mapped::new(&mut bpf, "lb_backends", sizes.backends as usize)?,
        slots: Mapped::new(&mut bpf, "lb_ring", sizes.slots as usize)?,
        traffic: Mapped::new(&mut bpf, "lb_traffic", traffic)?,
        stats,
    };
    let lb = XdpLb {
        inner: Arc::new(Mutex::new(inner)),
        sizes,
        cpus,
    };
    lb.set_conf(Conf::default())?;
    Ok((bpf, lb))
}

impl XdpLb {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What the maps were made for.
    pub fn sizes(&self) -> Sizes {
        self.sizes
    }

    /// Writes the configuration (its `enabled` turns the fast path on or
    /// off as a whole).
    pub fn set_conf(&self, mut conf: Conf) -> Result<(), Error> {
        conf.stride = self.sizes.vips + self.sizes.backends;
        conf.vip_cap = self.sizes.vips;
        self.lock().conf.set(0, conf, 0).map_err(|e| Error::Map {
            what: "configuration",
            source: Box::new(e),
        })
    }

    /// Writes the entries of backend ids `0..` (one lock for all).
    pub fn write_backends(
        &self,
        entries: impl ExactSizeIterator<Item = BackendEntry>,
    ) -> Result<(), Error> {
        let cap = self.sizes.backends as usize;
        if entries.len() > cap {
            return Err(Error::Full {
                what: "backend array",
                cap,
                asked: entries.len(),
            });
        }
        let mut g = self.lock();
        for (id, e) in entries.enumerate() {
            g.backends.write(id, e);
        }
        Ok(())
    }

    /// Writes Maglev slots from slot index `at` on (backend ids, or
    /// [`EMPTY`]).
    pub fn write_slots(
        &self,
        at: u32,
        slots: impl ExactSizeIterator<Item = u32>,
    ) -> Result<(), Error> {
        let cap = self.sizes.slots as usize;
        let end = at as usize + slots.len();
        if end > cap {
            return Err(Error::Full {
                what: "slot array",
                cap,
                asked: end,
            });
        }
        let mut g = self.lock();
        for (i, b) in slots.enumerate() {
            g.slots.write(at as usize + i, b);
        }
        Ok(())
    }

    /// Makes the VIP maps exactly `vips` (IPv4) and `vips6` (IPv6):
    /// entries written or replaced, the rest removed. Slots and backends
    /// written before are visible to the program before any entry that
    /// points at them.
    pub fn set_vips(
        &self,
        vips: &[(VipKey, VipEntry)],
        vips6: &[(VipKey6, VipEntry)],
    ) -> Result<(), Error> {
        let cap = self.sizes.vips as usize;
        for (what, n) in [("VIP map", vips.len()), ("IPv6 VIP map", vips6.len())] {
            if n > cap {
                return Err(Error::Full {
                    what,
                    cap,
                    asked: n,
                });
            }
        }
        let index = vips.iter().map(|(_, e)| e.index);
        if let Some(i) = index
            .chain(vips6.iter().map(|(_, e)| e.index))
            .find(|&i| i as usize >= cap)
        {
            return Err(Error::Full {
                what: "VIP counters",
                cap,
                asked: i as usize + 1,
            });
        }
        fence(Ordering::SeqCst);
        let map = |what| {
            move |e| Error::Map {
                what,
                source: Box::new(e),
            }
        };
        let mut g = self.lock();
        let want: HashSet<VipKey> = vips.iter().map(|(k, _)| *k).collect();
        for (k, e) in vips {
            g.vips.insert(k, e, 0).map_err(map("VIP map"))?;
        }
        let stale: Vec<VipKey> = g.vip_set.difference(&want).copied().collect();
        for k in &stale {
            g.vips.remove(k).map_err(map("VIP map"))?;
        }
        g.vip_set = want;
        let want6: HashSet<VipKey6> = vips6.iter().map(|(k, _)| *k).collect();
        for (k, e) in vips6 {
            g.vips6.insert(k, e, 0).map_err(map("IPv6 VIP map"))?;
        }
        let stale6: Vec<VipKey6> = g.vip6_set.difference(&want6).copied().collect();
        for k in &stale6 {
            g.vips6.remove(k).map_err(map("IPv6 VIP map"))?;
        }
        g.vip6_set = want6;
        Ok(())
    }

    /// Makes the prefix groups exactly `prefixes` (each prefix's group)
    /// and `suffixes` (their VIPs), as [`XdpLb::set_vips`] does the VIPs.
    pub fn set_groups(
        &self,
        prefixes: &[(PrefixKey, PrefixGroup)],
        suffixes: &[(SuffixKey, VipEntry)],
    ) -> Result<(), Error> {
        for (what, cap, n) in [
            ("prefix map", self.sizes.prefixes, prefixes.len()),
            ("prefix-group VIP map", self.sizes.vips, suffixes.len()),
        ] {
            if n > cap as usize {
                return Err(Error::Full {
                    what,
                    cap: cap as usize,
                    asked: n,
                });
            }
        }
        let cap = self.sizes.vips as usize;
        if let Some((_, e)) = suffixes.iter().find(|(_, e)| e.index as usize >= cap) {
            return Err(Error::Full {
                what: "VIP counters",
                cap,
                asked: e.index as usize + 1,
            });
        }
        fence(Ordering::SeqCst);
        let map = |what| {
            move |e| Error::Map {
                what,
                source: Box::new(e),
            }
        };
        let trie_key = |k: &PrefixKey| aya::maps::lpm_trie::Key::new(k.prefixlen, k.addr);
        let mut g = self.lock();
        let want: HashSet<SuffixKey> = suffixes.iter().map(|(k, _)| *k).collect();
        for (k, e) in suffixes {
            g.suffixes
                .insert(k, e, 0)
                .map_err(map("prefix-group VIP map"))?;
        }
        let want_prefixes: HashSet<PrefixKey> = prefixes.iter().map(|(k, _)| *k).collect();
        for (k, v) in prefixes {
            g.prefixes
                .insert(&trie_key(k), v, 0)
                .map_err(map("prefix map"))?;
        }
        let stale: Vec<PrefixKey> = g.prefix_set.difference(&want_prefixes).copied().collect();
        for k in &stale {
            g.prefixes.remove(&trie_key(k)).map_err(map("prefix map"))?;
        }
        g.prefix_set = want_prefixes;
        let stale: Vec<SuffixKey> = g.suffix_set.difference(&want).copied().collect();
        for k in &stale {
            g.suffixes.remove(k).map_err(map("prefix-group VIP map"))?;
        }
        g.suffix_set = want;
        Ok(())
    }

    /// Makes the VIP address set (`lb_vip_addrs`) exactly `addrs`, as
    /// [`XdpLb::set_vips`] does the VIPs.
    pub fn set_vip_addrs(&self, addrs: &[AddrKey]) -> Result<(), Error> {
        let cap = self.sizes.vips as usize;
        if addrs.len() > cap {
            return Err(Error::Full {
                what: "VIP address set",
                cap,
                asked: addrs.len(),
            });
        }
        let map = |e| Error::Map {
            what: "VIP address set",
            source: Box::new(e),
        };
        let mut g = self.lock();
        let want: HashSet<AddrKey> = addrs.iter().copied().collect();
        for k in want.difference(&g.vip_addr_set.clone()) {
            g.vip_addrs.insert(k, 1, 0).map_err(map)?;
        }
        let stale: Vec<AddrKey> = g.vip_addr_set.difference(&want).copied().collect();
        for k in &stale {
            g.vip_addrs.remove(k).map_err(map)?;
        }
        g.vip_addr_set = want;
        Ok(())
    }

    /// Makes the server ID map (`lb_quic_ids`) exactly `ids` (each key's
    /// backend id): entries written or replaced, the rest removed. Written
    /// before the VIP entries that read them ([`XdpLb::set_vips`]).
    pub fn set_quic_ids(&self, ids: &[(QuicIdKey, u32)]) -> Result<(), Error> {
        let cap = self.sizes.quic_ids as usize;
        if ids.len() > cap {
            return Err(Error::Full {
                what: "server ID map",
                cap,
                asked: ids.len(),
            });
        }
        let map = |e| Error::Map {
            what: "server ID map",
            source: Box::new(e),
        };
        let mut g = self.lock();
        let want: HashSet<QuicIdKey> = ids.iter().map(|(k, _)| *k).collect();
        // Removed first: a reload may give a VIP index to another VIP, and
        // the map must hold room for the new keys.
        let stale: Vec<QuicIdKey> = g.quic_id_set.difference(&want).copied().collect();
        for k in &stale {
            g.quic_ids.remove(k).map_err(map)?;
        }
        for (k, b) in ids {
            g.quic_ids.insert(k, b, 0).map_err(map)?;
        }
        g.quic_id_set = want;
        Ok(())
    }

    /// The program's counters, summed over CPUs.
    pub fn stats(&self) -> Result<Stats, Error> {
        let g = self.lock();
        let per = g.stats.get(&0, 0).map_err(|e| Error::Map {
            what: "counters",
            source: Box::new(e),
        })?;
        let mut s = Stats::default();
        for c in per.iter() {
            s.forwarded += c.forwarded;
            s.ct_hits += c.ct_hits;
            s.ct_misses += c.ct_misses;
            s.ct_inserts += c.ct_inserts;
            s.ct_closes += c.ct_closes;
            s.to_socket += c.to_socket;
            s.forwarded6 += c.forwarded6;
            s.martian_source += c.martian_source;
            s.source_is_vip += c.source_is_vip;
            s.ttl_zero += c.ttl_zero;
            s.quic_routed += c.quic_routed;
            for (a, b) in s.quic_miss.iter_mut().zip(&c.quic_miss) {
                *a += b;
            }
            s.quic_server_down += c.quic_server_down;
        }
        Ok(s)
    }

    /// Traffic forwarded per VIP index and per backend id, summed over CPUs.
    pub fn traffic(&self) -> (Vec<Traffic>, Vec<Traffic>) {
        let g = self.lock();
        let (nv, nb) = (self.sizes.vips as usize, self.sizes.backends as usize);
        let mut vips = vec![Traffic::default(); nv];
        let mut backends = vec![Traffic::default(); nb];
        for cpu in 0..self.cpus {
            let row = cpu * (nv + nb);
            for (i, t) in vips.iter_mut().chain(backends.iter_mut()).enumerate() {
                if let Some(c) = g.traffic.read(row + i) {
                    t.packets += c.packets;
                    t.bytes += c.bytes;
                }
            }
        }
        (vips, backends)
    }
}

/// The load balancer's program for AF_XDP ports
/// ([`netio::afxdp::Program::Custom`]): loaded with maps of its sizes each
/// time ports are opened, frames it forwards leaving by the interface
/// (`lb_out`). The maps of the last one loaded are the control plane's.
pub struct Loader {
    sizes: Sizes,
    maps: Mutex<Option<XdpLb>>,
    /// Told the sizes once a program is loaded (the control plane's
    /// [`crate::tables::Tables::driver_room`]).
    room: Option<Arc<std::sync::OnceLock<Sizes>>>,
}

impl Loader {
    /// A loader for maps of `sizes`.
    pub fn new(sizes: Sizes) -> Self {
        Loader {
            sizes,
            maps: Mutex::new(None),
            room: None,
        }
    }

    /// A loader for maps sized for configuration `cfg` and its snapshot
    /// `t` ([`super::sizes`]), which tells the control plane that made
    /// `t` the room it loaded ([`crate::tables::Tables::driver_room`]), so
    /// that a reload the maps cannot hold is refused.
    pub fn for_tables(cfg: &crate::config::Config, t: &crate::tables::Tables) -> Self {
        Loader {
            room: Some(Arc::clone(&t.driver_room)),
            ..Loader::new(super::sizes(cfg, t))
        }
    }

    /// The maps of the program last loaded (by the ports last opened);
    /// `None` before any. Asked for once the ports opened, when the
    /// driver is the one in use (a fall-back to another driver never
    /// asks): the control plane of [`Loader::for_tables`] is told their
    /// room then.
    pub fn maps(&self) -> Option<XdpLb> {
        let maps = self.maps.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let (Some(room), Some(lb)) = (&self.room, &maps) {
            // The sizes as loaded (rounded up); the same for every load.
            let _ = room.set(lb.sizes());
        }
        maps
    }
}

impl LoadProgram for Loader {
    fn load(&self, _iface: &str) -> Result<XdpProgram, Box<dyn std::error::Error + Send + Sync>> {
        let (bpf, lb) = load(self.sizes)?;
        *self.maps.lock().unwrap_or_else(|p| p.into_inner()) = Some(lb);
        Ok(XdpProgram::from_loaded(bpf, PROGRAM, "XDP load balancer").egress_map("lb_out"))
    }
}

/// A loaded program, attached nowhere, that frames can be run through
/// (`BPF_PROG_TEST_RUN`): for checking it against the load balancer's own
/// worker, frame by frame.
pub struct Detached {
    /// Holds the program and its maps.
    program: XdpProgram,
    /// Its maps.
    pub lb: XdpLb,
}

pub use netio::afxdp::{Verdict, XDP_TX};

/// The program's verdict for a frame it dropped (`XDP_DROP`).
pub const XDP_DROP: u32 = 1;

impl Detached {
    /// Loads the program with maps of `sizes`.
    pub fn load(sizes: Sizes) -> Result<Self, Error> {
        let (bpf, lb) = load(sizes)?;
        Ok(Detached {
            program: XdpProgram::from_loaded(bpf, PROGRAM, "XDP load balancer"),
            lb,
        })
    }

    /// Runs the program once over `frame`.
    pub fn run(&self, frame: &[u8]) -> Result<Verdict, Error> {
        self.program.test_run(frame).map_err(Error::TestRun)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The program is C: its constants must say what this module writes.
    /// They come from one definition (`abi`), which the build writes out
    /// for `lb.c`; `tests/xdp_abi.rs` compiles that header to check it.
    #[test]
    fn the_program_agrees_on_the_values_written_into_its_maps() {
        let header = include_str!(concat!(env!("OUT_DIR"), "/lb_abi.h"));
        assert_eq!(header, super::super::abi::c_header());
        for want in [
            format!("#define LB_ANY_PORT {:#x}\n", super::super::ANY_PORT),
            format!("#define LB_EMPTY {:#x}u\n", super::super::EMPTY),
            format!("#define LB_HEALTHY {:#x}\n", super::super::HEALTHY),
            format!("#define LB_ACCEPTING {:#x}\n", super::super::ACCEPTING),
            format!("#define LB_V4 {:#x}\n", super::super::V4),
            format!("#define LB_V6 {:#x}\n", super::super::V6),
        ] {
            assert!(header.contains(&want), "lb_abi.h lacks {want:?}");
        }
        let src = include_str!("../../bpf/lb.c");
        assert!(src.contains("#include \"lb_abi.h\""));
        assert!(
            !src.contains("#define LB_"),
            "lb.c defines its own LB_ values"
        );
        // The shapes the program reads (its structs, in order).
        assert_eq!(std::mem::size_of::<Conf>(), 96);
        assert_eq!(std::mem::size_of::<PrefixKey>(), 20);
        assert_eq!(std::mem::size_of::<PrefixGroup>(), 20);
        assert_eq!(std::mem::size_of::<SuffixKey>(), 28);
        assert_eq!(std::mem::size_of::<VipKey>(), 12);
        assert_eq!(std::mem::size_of::<VipKey6>(), 24);
        assert_eq!(std::mem::size_of::<VipEntry>(), 16);
        assert_eq!(std::mem::size_of::<BackendEntry>(), 56);
        assert_eq!(std::mem::size_of::<Stats>(), 144);
        assert_eq!(std::mem::size_of::<AddrKey>(), 16);
        assert_eq!(std::mem::size_of::<QuicIdKey>(), 24);
        // The program counts QUIC misses at the worker's counter index.
        use super::super::abi as a;
        use crate::quic::Miss;
        for (code, miss) in [
            (a::QUIC_NOT_QUIC, Miss::NotQuic),
            (a::QUIC_RESERVED, Miss::Reserved),
            (a::QUIC_NO_CONFIG, Miss::NoConfig),
            (a::QUIC_TOO_SHORT, Miss::TooShort),
            (a::QUIC_LENGTH_MISMATCH, Miss::LengthMismatch),
            (a::QUIC_UNKNOWN_SERVER_ID, Miss::UnknownServerId),
        ] {
            assert_eq!(code as usize, miss.index(), "{}", miss.name());
        }
        assert_eq!(a::QUIC_MISSES as usize, Miss::ALL.len());
        assert_eq!(Stats::default().quic_miss.len(), Miss::ALL.len());
        assert_eq!(
            a::QUIC_MAX_SID as usize,
            quic_lb::MAX_PLAINTEXT_LEN - quic_lb::MIN_NONCE_LEN
        );
        assert!((a::QUIC_MAX_SID as usize) < QuicIdKey::C.size - 8);
        assert_eq!(
            std::mem::size_of::<crate::xdp::abi::SlotPair>(),
            2 * std::mem::size_of::<u32>()
        );
    }
}
