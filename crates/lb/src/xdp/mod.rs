//! The load balancer in the driver (`lb run --driver xdp`): its XDP
//! program (`bpf/lb.c`), what it shares with the packet threads ([`abi`]:
//! constants and map layouts, written out for the C side by the build), its
//! loader and maps ([`maps`]: for AF_XDP ports through netio's generic hook,
//! [`Loader`], or for test runs, [`Detached`]), and here the maps kept
//! equal to the running [`Tables`], with its counters read back as
//! [`Counters`].
//!
//! The program forwards what a packet thread would forward the same way
//! (same flow hash, same Maglev slot, same connection rules, same GRE
//! bytes) for TCP and UDP to VIPs, exactly matched or of a prefix group
//! (longest prefix, then suffix, as [`crate::vip::VipMatcher`]), IPv4
//! (without options) and IPv6 (without extension headers), to IPv4 and
//! IPv6 backends alike; the rest (fragments, ICMP, extension headers,
//! probes, partial checksums, redirects among a fleet) reaches the packet
//! threads through AF_XDP as before (the groups' prefixes are steered
//! whole: netio's `steer.h`). Its
//! connection tables (one per family) are its own: a flow it forwarded and
//! whose next packet goes to user space (an ICMP error quoting it, say) is looked up by
//! Maglev there, which agrees unless the tables changed in between.
//!
//! A `quic` VIP (IETF QUIC-LB) whose configurations are all plaintext
//! routes by connection ID in the driver as the packet threads do
//! ([`crate::quic::QuicRoute::backend`]): the program reads the QUIC header
//! (RFC 8999), the codepoint's configuration ([`Conf`]'s `quic_*`) and the
//! server ID, looks the server ID up among the VIP's (`lb_quic_ids`) and
//! forwards to its backend if healthy; a miss falls back to the connection
//! table and Maglev, as any UDP flow. Encrypted configurations (single-pass
//! AES, four-pass) would need AES in the program: a VIP with one of them is
//! left whole to the packet threads, and so is every VIP of its address and
//! protocol (an any-port one would otherwise take its datagrams here).
//!
//! Tables are placed by content: a Maglev table (with its slots' backend
//! ids) is written once into the slot array and shared by every VIP over
//! it, like [`Tables`] shares them; a sync writes only tables it has not
//! placed before, points the VIPs at them, then frees the ranges of tables
//! no VIP uses any more (reused by a later sync, by which time no packet
//! that read the old VIP entry is still running). When a table finds no
//! room (the array full of tables the new snapshot drops, or fragmented),
//! the driver is turned off, placement starts over empty, and the driver
//! comes back on if the snapshot fits at all.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use maglev::Maglev;

use crate::config::{Config, Conntrack};
use crate::counters::{Counters, DropReason, Traffic};
use crate::tables::Tables;

pub mod abi;
pub mod maps;

pub use abi::{
    AddrKey, BackendEntry, Conf, PrefixGroup, PrefixKey, QuicIdKey, SuffixKey, VipEntry, VipKey,
    VipKey6, ACCEPTING, ANY_PORT, EMPTY, FLOW_SEED, HEALTHY, V4, V6,
};
pub use maps::{Detached, Loader, Sizes, Verdict, XdpLb, XDP_DROP, XDP_TX};

/// Why the fast path's maps could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A map operation failed.
    #[error(transparent)]
    Maps(#[from] maps::Error),
}

/// The map sizes for a configuration: room for twice its VIPs, backends
/// and Maglev slots (a reload that changes every table places the new ones
/// before freeing the old), and its connection tables.
pub fn sizes(cfg: &Config, t: &Tables) -> Sizes {
    let slots: u64 = distinct(t)
        .values()
        .map(|(tab, _)| u64::from(tab.size()))
        .sum();
    let quic_ids = DriverQuic::of(t).ids(t).len() as u64;
    let threads = cfg.forwarder.threads.max(1) as u64;
    let clamp = |v: u64| v.min(u64::from(u32::MAX / 4)) as u32;
    Sizes {
        vips: clamp((2 * t.vips.len() as u64).max(64)),
        backends: clamp((2 * t.backends.len() as u64).max(256)),
        slots: clamp((2 * slots).max(1 << 18)),
        conns: clamp((cfg.conntrack.size as u64 * threads).max(4096)),
        prefixes: clamp((2 * t.matcher.prefixes().len() as u64).max(64)),
        quic_ids: clamp((2 * quic_ids).max(64)),
    }
}

/// The codepoints of a set of plaintext QUIC-LB configurations as the
/// program reads them ([`Conf::quic_sid`], [`Conf::quic_need`],
/// [`Conf::quic_self`]).
type QuicTable = ([u8; 8], [u8; 8], [u8; 8]);

/// The QUIC-LB configurations of `c` as the program reads them: `None`
/// when any is encrypted (the program has no AES), or there is none.
fn plaintext(c: &quic_lb::Configs) -> Option<QuicTable> {
    let mut t: QuicTable = Default::default();
    let mut any = false;
    for cp in 0..quic_lb::UNROUTABLE_CODEPOINT {
        let Some(conf) = c.get(cp) else { continue };
        if conf.encoding() != quic_lb::Encoding::Plaintext {
            return None;
        }
        let i = usize::from(cp);
        // At most 15 and 20 (`quic_lb::Config::new`).
        t.0[i] = u8::try_from(conf.server_id_len()).ok()?;
        t.1[i] = u8::try_from(conf.cid_len()).ok()?;
        t.2[i] = u8::from(conf.self_describing());
        any = true;
    }
    any.then_some(t)
}

/// Which `quic` VIPs route by connection ID in the driver: those whose
/// configurations are all plaintext and the same as the first such VIP's
/// (the program holds one set; every VIP shares the configuration's set
/// today, so this is all or none). The others are left to user space.
struct DriverQuic {
    table: Option<QuicTable>,
    /// By VIP index.
    in_driver: Vec<bool>,
}

impl DriverQuic {
    fn of(t: &Tables) -> Self {
        let mut table = None;
        let in_driver = t
            .vips
            .iter()
            .map(|v| {
                let Some(p) = v.quic.as_ref().and_then(|r| plaintext(r.configs())) else {
                    return false;
                };
                *table.get_or_insert(p) == p
            })
            .collect();
        DriverQuic { table, in_driver }
    }

    fn routes(&self, index: u32) -> bool {
        self.in_driver.get(index as usize).copied().unwrap_or(false)
    }

    /// Left to user space: a `quic` VIP the driver does not route.
    fn steered(&self, t: &Tables, index: u32) -> bool {
        t.vips.get(index as usize).is_some_and(|v| v.quic.is_some()) && !self.routes(index)
    }

    /// The server ID map's entries (`lb_quic_ids`).
    fn ids(&self, t: &Tables) -> Vec<(QuicIdKey, u32)> {
        let mut ids = Vec::new();
        for (i, v) in t.vips.iter().enumerate() {
            let (true, Some(r)) = (self.routes(i as u32), &v.quic) else {
                continue;
            };
            for (sid, backend) in r.server_ids() {
                let octets = sid.as_bytes();
                let mut id = [0u8; 16];
                // At most 15 octets (`quic_lb::ServerId`'s configurations).
                let n = octets.len().min(abi::QUIC_MAX_SID as usize);
                id[..n].copy_from_slice(&octets[..n]);
                ids.push((
                    QuicIdKey {
                        vip: i as u32,
                        len: n as u32,
                        id,
                    },
                    backend,
                ));
            }
        }
        ids
    }
}

/// Whether the maps of a program loaded with `room` can hold snapshot `t`
/// (placed from empty, as [`XdpTables::sync`] starts over when placing
/// piecemeal finds no room): else the configuration's key that outgrew
/// them and why, saying a restart is needed. A snapshot that does not fit
/// would turn the driver off (every frame to the packet threads) until
/// the daemon restarts with maps made for it.
pub fn fits(room: &Sizes, t: &Tables) -> Result<(), (String, String)> {
    let slots: u64 = distinct(t)
        .values()
        .map(|(tab, _)| u64::from(tab.size()))
        .sum();
    let prefixes = t.matcher.prefixes().len() as u64;
    let quic_ids = DriverQuic::of(t).ids(t).len() as u64;
    let checks = [
        (
            "pools.table_size",
            "Maglev slots (all distinct tables together)",
            slots,
            room.slots,
        ),
        (
            "pools.backends",
            "backends (every backend id since the start)",
            t.backends.len() as u64,
            room.backends,
        ),
        ("vips", "VIPs", t.vips.len() as u64, room.vips),
        (
            "prefix_groups.prefixes",
            "prefix-group prefixes",
            prefixes,
            room.prefixes,
        ),
        (
            "pools.backends.quic_server_id",
            "server IDs of quic VIPs (each VIP's pool's together)",
            quic_ids,
            room.quic_ids,
        ),
    ];
    for (key, what, need, have) in checks {
        if need > u64::from(have) {
            return Err((
                key.to_string(),
                format!(
                    "this configuration needs {need} {what}; the load balancer in the driver \
                     (XDP) was loaded with room for {have}, and its maps keep their size until \
                     the daemon restarts: restart it to apply this configuration (a reload would \
                     have turned the driver off, every frame to the packet threads)"
                ),
            ));
        }
    }
    Ok(())
}

/// An IPv6 address as the program loads it: four words of its bytes as
/// they lie in the packet.
fn words(a: &[u8; 16]) -> [u32; 4] {
    let w = |i: usize| u32::from_ne_bytes([a[i], a[i + 1], a[i + 2], a[i + 3]]);
    [w(0), w(4), w(8), w(12)]
}

/// A table by what it forwards: its identity and its slots' backend ids.
type TableKey = (usize, Vec<u32>);

/// The distinct tables of a snapshot, with a VIP index over each.
fn distinct(t: &Tables) -> HashMap<TableKey, (Arc<Maglev>, usize)> {
    let mut d = HashMap::new();
    for (i, v) in t.vips.iter().enumerate() {
        d.entry((Arc::as_ptr(&v.table) as usize, v.slots.clone()))
            .or_insert_with(|| (Arc::clone(&v.table), i));
    }
    d
}

/// A table in the slot array.
struct Placed {
    /// Held so that its address is not reused by another table while its
    /// key is in use.
    _table: Arc<Maglev>,
    at: u32,
    m: u32,
}

/// What one sync did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Sync {
    /// Whether the fast path forwards (else every frame goes to user space).
    pub enabled: bool,
    /// Why it does not, when it does not.
    pub reason: Option<String>,
    /// VIPs forwarded in the driver.
    pub vips: usize,
    /// VIPs left to user space (`quic` VIPs with an encrypted
    /// configuration and the VIPs of their address and protocol).
    pub vips_in_user_space: usize,
    /// Tables written by this sync.
    pub tables_written: usize,
    /// Slots written by this sync.
    pub slots_written: u64,
}

/// How placing a snapshot went.
enum Placement {
    /// Placed (or turned off for a reason starting over cannot change).
    Done(Sync),
    /// A table found no room in the slot array: why.
    NoRoom(String, Sync),
}

/// The fast path's maps and what is placed in them.
pub struct XdpTables {
    lb: XdpLb,
    base: Conf,
    placed: HashMap<TableKey, Placed>,
    /// Free ranges of the slot array (start, length), by start.
    free: Vec<(u32, u32)>,
}

impl XdpTables {
    /// Over the maps of a loaded program, with the connection table's
    /// timeouts from `[conntrack]`. Forwards nothing until [`XdpTables::sync`].
    pub fn new(lb: XdpLb, ct: &Conntrack) -> Self {
        let ms = |s: f64| (s * 1000.0).clamp(1.0, crate::conntrack::MAX_TIMEOUT_MS as f64) as u32;
        let base = Conf {
            tcp_timeout_ms: ms(ct.tcp_timeout_s),
            udp_timeout_ms: ms(ct.udp_timeout_s),
            linger_ms: crate::worker::CLOSE_LINGER_MS as u32,
            ..Conf::default()
        };
        let slots = lb.sizes().slots;
        XdpTables {
            lb,
            base,
            placed: HashMap::new(),
            free: vec![(0, slots)],
        }
    }

    /// The maps.
    pub fn maps(&self) -> &XdpLb {
        &self.lb
    }

    fn alloc(&mut self, m: u32) -> Option<u32> {
        let i = self.free.iter().position(|&(_, len)| len >= m)?;
        let (at, len) = self.free[i];
        if len == m {
            self.free.remove(i);
        } else {
            self.free[i] = (at + m, len - m);
        }
        Some(at)
    }

    fn release(&mut self, at: u32, m: u32) {
        let i = self.free.partition_point(|&(s, _)| s < at);
        self.free.insert(i, (at, m));
        // Merge with the neighbours.
        if i + 1 < self.free.len() && self.free[i].0 + self.free[i].1 == self.free[i + 1].0 {
            self.free[i].1 += self.free[i + 1].1;
            self.free.remove(i + 1);
        }
        if i > 0 && self.free[i - 1].0 + self.free[i - 1].1 == self.free[i].0 {
            self.free[i - 1].1 += self.free[i].1;
            self.free.remove(i);
        }
    }

    /// Turns the fast path off (every frame to user space), saying why.
    fn off(&self, reason: String, mut s: Sync) -> Result<Sync, Error> {
        self.lb.set_conf(Conf {
            enabled: 0,
            ..self.base
        })?;
        s.enabled = false;
        s.reason = Some(reason);
        Ok(s)
    }

    /// Makes the maps forward as `t` does. Where they cannot (a map too
    /// small for a reload that grew), the fast path is turned off and every
    /// frame goes to user space, which forwards with `t`: nothing is lost,
    /// and [`Sync::reason`] says why.
    pub fn sync(&mut self, t: &Tables) -> Result<Sync, Error> {
        match self.place(t)? {
            Placement::Done(s) => Ok(s),
            Placement::NoRoom(_, s) => {
                // The slot array may be full of tables no VIP will use once
                // this snapshot is in, or fragmented. With the driver off
                // (the program reads no slot then), start it over empty.
                self.off(String::new(), s)?;
                self.placed.clear();
                self.free = vec![(0, self.lb.sizes().slots)];
                match self.place(t)? {
                    Placement::Done(s) => Ok(s),
                    Placement::NoRoom(why, s) => self.off(why, s),
                }
            }
        }
    }

    /// [`XdpTables::sync`] without starting over.
    fn place(&mut self, t: &Tables) -> Result<Placement, Error> {
        let mut s = Sync::default();
        let sizes = self.lb.sizes();
        if t.backends.len() > sizes.backends as usize {
            let why = format!(
                "{} backends, room for {} (restart to grow)",
                t.backends.len(),
                sizes.backends
            );
            return self.off(why, s).map(Placement::Done);
        }
        self.lb.write_backends(t.backends.iter().map(|b| {
            let v4 = (
                packet::flow::unmapped(&b.outer.src),
                packet::flow::unmapped(&b.outer.dst),
            );
            let mut e = BackendEntry {
                dmac: b.outer.eth_dst,
                smac: b.outer.eth_src,
                ttl: b.outer.ttl,
                ..BackendEntry::default()
            };
            // The worker's families (packet::gre::encapsulate): both
            // outer addresses IPv4, or both IPv6; mixed, it fails there, so
            // neither flag here (user space then has the frame).
            match v4 {
                (Some(src), Some(dst)) => {
                    e.src = u32::from_ne_bytes(src);
                    e.dst = u32::from_ne_bytes(dst);
                    e.flags |= V4;
                }
                (None, None) => {
                    e.src6 = words(&b.outer.src);
                    e.dst6 = words(&b.outer.dst);
                    e.flags |= V6;
                }
                _ => {}
            }
            if b.healthy {
                e.flags |= HEALTHY;
            }
            if b.accepting {
                e.flags |= ACCEPTING;
            }
            e
        }))?;
        let mut used: HashSet<TableKey> = HashSet::new();
        // `quic` VIPs with an encrypted configuration route by connection
        // IDs this program cannot decrypt: they are left to the packet
        // threads, and so is every VIP of their address and protocol (an
        // any-port one would otherwise take their datagrams here).
        let dq = DriverQuic::of(t);
        let quic = |index: u32| dq.steered(t, index);
        let quic4: HashSet<([u8; 4], u8)> = t
            .matcher
            .exact_v4()
            .filter(|&(_, _, _, i)| quic(i))
            .map(|(a, _, p, _)| (a, p))
            .collect();
        let quic6: HashSet<([u8; 16], u8)> = t
            .matcher
            .exact_v6()
            .filter(|&(_, _, _, i)| quic(i))
            .map(|(a, _, p, _)| (a, p))
            .collect();
        let mut vips = Vec::new();
        for (addr, port, proto, index) in t.matcher.exact_v4() {
            if quic4.contains(&(addr, proto)) {
                continue;
            }
            let Some(e) = self.entry(t, &dq, index, &mut used, &mut s)? else {
                continue;
            };
            let e = match e {
                Ok(e) => e,
                Err(why) => return Ok(Placement::NoRoom(why, s)),
            };
            vips.push((
                VipKey {
                    addr: u32::from_ne_bytes(addr),
                    port: port.map_or(ANY_PORT, u32::from),
                    proto: u32::from(proto),
                },
                e,
            ));
        }
        let mut vips6 = Vec::new();
        for (addr, port, proto, index) in t.matcher.exact_v6() {
            if quic6.contains(&(addr, proto)) {
                continue;
            }
            let Some(e) = self.entry(t, &dq, index, &mut used, &mut s)? else {
                continue;
            };
            let e = match e {
                Ok(e) => e,
                Err(why) => return Ok(Placement::NoRoom(why, s)),
            };
            vips6.push((
                VipKey6 {
                    addr: words(&addr),
                    port: port.map_or(ANY_PORT, u32::from),
                    proto: u32::from(proto),
                },
                e,
            ));
        }
        // The VIP sources first: a VIP is matched only once its address
        // is refused as a source.
        let addrs: Vec<AddrKey> = t
            .matcher
            .addresses()
            .map(|a| AddrKey { addr: words(&a) })
            .collect();
        if let Err(e) = self.lb.set_vip_addrs(&addrs) {
            return self.off(e.to_string(), s).map(Placement::Done);
        }
        // The server IDs before the VIPs that read them.
        if let Err(e) = self.lb.set_quic_ids(&dq.ids(t)) {
            return self.off(e.to_string(), s).map(Placement::Done);
        }
        if let Err(e) = self.lb.set_vips(&vips, &vips6) {
            return self.off(e.to_string(), s).map(Placement::Done);
        }
        let prefixes: Vec<(PrefixKey, PrefixGroup)> = t
            .matcher
            .prefixes()
            .into_iter()
            .map(|(net, len, group, host)| {
                (
                    PrefixKey {
                        prefixlen: u32::from(len),
                        addr: words(&net.to_be_bytes()),
                    },
                    PrefixGroup {
                        group: u32::from(group),
                        host: words(&host.to_be_bytes()),
                    },
                )
            })
            .collect();
        let mut suffixes = Vec::new();
        // As for addresses: a prefix-group VIP left to user space takes
        // every VIP of its suffix and protocol there with it.
        let quic_suffixes: HashSet<(u16, u128, u8)> = t
            .matcher
            .suffixes()
            .filter(|&(_, _, _, _, i)| quic(i))
            .map(|(g, sfx, _, p, _)| (g, sfx, p))
            .collect();
        for (group, suffix, port, proto, index) in t.matcher.suffixes() {
            if quic_suffixes.contains(&(group, suffix, proto)) {
                continue;
            }
            let Some(e) = self.entry(t, &dq, index, &mut used, &mut s)? else {
                continue;
            };
            let e = match e {
                Ok(e) => e,
                Err(why) => return Ok(Placement::NoRoom(why, s)),
            };
            suffixes.push((
                SuffixKey {
                    group: u32::from(group),
                    suffix: words(&suffix.to_be_bytes()),
                    port: port.map_or(ANY_PORT, u32::from),
                    proto: u32::from(proto),
                },
                e,
            ));
        }
        if let Err(e) = self.lb.set_groups(&prefixes, &suffixes) {
            return self.off(e.to_string(), s).map(Placement::Done);
        }
        let gone: Vec<TableKey> = self
            .placed
            .keys()
            .filter(|k| !used.contains(*k))
            .cloned()
            .collect();
        for k in gone {
            if let Some(p) = self.placed.remove(&k) {
                self.release(p.at, p.m);
            }
        }
        let mut conf = Conf {
            enabled: 1,
            ..self.base
        };
        if let Some(sp) = &t.spread {
            conf.keyed = 1;
            if let Some((net, host)) = sp.v4.and_then(|p| p.v4_bits()) {
                conf.spread_v4 = 1;
                conf.spread_net = net;
                conf.spread_host = host;
            }
            if let Some((net, host)) = sp.v6.and_then(|p| p.v6_bits()) {
                conf.spread_v6 = 1;
                conf.spread6_net = net;
                conf.spread6_host = host;
            }
        }
        conf.groups = u32::from(!prefixes.is_empty());
        if let Some((sid, need, described)) = dq.table {
            conf.quic_sid = sid;
            conf.quic_need = need;
            conf.quic_self = described;
        }
        self.lb.set_conf(conf)?;
        s.enabled = true;
        s.vips = vips.len() + vips6.len() + suffixes.len();
        s.vips_in_user_space = t.vips.len().saturating_sub(s.vips);
        Ok(Placement::Done(s))
    }

    /// The VIP map entry of VIP `index`, its Maglev table placed (written
    /// into the slot array if no VIP placed it before): `None` for an
    /// index the snapshot lacks, `Err` (why) when the table finds no room.
    fn entry(
        &mut self,
        t: &Tables,
        dq: &DriverQuic,
        index: u32,
        used: &mut HashSet<TableKey>,
        s: &mut Sync,
    ) -> Result<Option<Result<VipEntry, String>>, Error> {
        let Some(v) = t.vips.get(index as usize) else {
            return Ok(None);
        };
        if dq.steered(t, index) {
            return Ok(None);
        }
        let key = (Arc::as_ptr(&v.table) as usize, v.slots.clone());
        let at = match self.placed.get(&key) {
            Some(p) => p.at,
            None => {
                let m = v.table.size();
                let Some(at) = self.alloc(m) else {
                    return Ok(Some(Err(format!(
                        "no room for a table of {m} slots ({} slots in all; restart to grow)",
                        self.lb.sizes().slots
                    ))));
                };
                let slots =
                    (0..m as usize).map(|i| v.table.slot(i).map_or(EMPTY, |j| v.slots[j as usize]));
                self.lb.write_slots(at, slots)?;
                s.tables_written += 1;
                s.slots_written += u64::from(m);
                self.placed.insert(
                    key.clone(),
                    Placed {
                        _table: Arc::clone(&v.table),
                        at,
                        m,
                    },
                );
                at
            }
        };
        used.insert(key);
        let mut e = VipEntry::new(index, at, v.table.size());
        if dq.routes(index) {
            e.quic = abi::QUIC_PLAINTEXT;
        }
        Ok(Some(Ok(e)))
    }

    /// What the program forwarded and dropped, as packet-thread counters
    /// (forwarded frames are both received and sent, dropped ones received
    /// and counted by reason; connection-table entries are not
    /// counted, the kernel's LRU map keeps no count).
    pub fn counters(&self) -> Result<Counters, Error> {
        let st = self.lb.stats()?;
        let (vips, backends) = self.lb.traffic();
        let conv = |v: Vec<abi::Traffic>| -> Vec<Traffic> {
            let last = v.iter().rposition(|t| t.packets > 0).map_or(0, |i| i + 1);
            v[..last]
                .iter()
                .map(|t| Traffic {
                    packets: t.packets,
                    bytes: t.bytes,
                })
                .collect()
        };
        let mut c = Counters::new();
        let refused = [
            (DropReason::MartianSource, st.martian_source),
            (DropReason::SourceIsVip, st.source_is_vip),
            (DropReason::TtlZero, st.ttl_zero),
        ];
        for (why, n) in refused {
            c.drops[why.index()] = n;
        }
        c.rx = st.forwarded + refused.iter().map(|(_, n)| n).sum::<u64>();
        c.tx = st.forwarded;
        c.per_vip = conv(vips);
        c.per_backend = conv(backends);
        c.conntrack.hits = st.ct_hits;
        c.conntrack.misses = st.ct_misses;
        c.conntrack.inserts = st.ct_inserts;
        c.conntrack.closes = st.ct_closes;
        c.quic_routed = st.quic_routed;
        c.quic_miss = st.quic_miss;
        c.quic_server_down = st.quic_server_down;
        Ok(c)
    }
}
