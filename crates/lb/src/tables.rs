//! What packet threads read: an immutable snapshot of VIPs, their Maglev
//! tables and the backends, swapped in one atomic step by the control plane
//! ([`Control`]). A packet thread loads the snapshot once per batch, so no
//! packet ever sees half a configuration.
//!
//! Backend ids are stable for the life of the process: a backend keeps its
//! id across reloads (by name), and a removed backend's id stays reserved
//! and unhealthy. Connection-table entries hold ids, so they stay meaningful
//! across reloads and are reused only while their backend is healthy.
//!
//! Tables are built once per distinct content and shared: a Maglev table is
//! a function of its size and its pool's backends (ids, addresses, weights
//! and health, in configuration order), so VIPs over equal pools share one
//! ([`Arc`]), and a reload or health change rebuilds only the tables whose
//! pool changed; the others are carried over from the running snapshot.
//! Tables that must be built are built in parallel, one thread per core.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use maglev::Maglev;
use packet::gre::Outer;

use crate::config::{
    parse_mac, parse_prefix, BackendConf, Config, ConfigError, Encap, FleetConf, IncludeCycle,
    PoolConf, PLACEHOLDER_GATEWAY_MAC,
};
use crate::vip::VipMatcher;

// What the tables make of a configuration, defined here on the
// configuration's own types (so every caller keeps calling them as
// methods) and not in `config`, which is the file's model and its
// validation: a pool flattened into the backends its table is built from,
// drained ones at weight 0; this load balancer among its fleet; the
// per-flow spread of outer sources.

impl Config {
    /// The backends of a pool of a *validated* configuration with its
    /// included pools, as [`Config::flatten`]: a pool without includes or
    /// drained backends is its own backend list, borrowed (validation made
    /// its names unique).
    /// `index` is [`Config::pool_index`].
    pub fn pool_members<'a>(
        &'a self,
        index: &HashMap<&str, &'a PoolConf>,
        pool: &str,
    ) -> Result<std::borrow::Cow<'a, [BackendConf]>, IncludeCycle> {
        match index.get(pool) {
            Some(p) if p.include.is_empty() && p.drained.is_empty() => {
                Ok(std::borrow::Cow::Borrowed(&p.backends))
            }
            _ => self.flatten_in(index, pool).map(std::borrow::Cow::Owned),
        }
    }

    /// The backends of a pool with its included pools, each backend once
    /// (first occurrence wins), or the cycle that prevents it. A backend in
    /// its pool's `drained` list comes with weight 0.
    pub fn flatten(&self, pool: &str) -> Result<Vec<BackendConf>, IncludeCycle> {
        self.flatten_in(&self.pool_index(), pool)
    }

    /// [`Config::flatten`] with the pools by name ([`Config::pool_index`]),
    /// for callers flattening many pools.
    pub fn flatten_in(
        &self,
        index: &HashMap<&str, &PoolConf>,
        pool: &str,
    ) -> Result<Vec<BackendConf>, IncludeCycle> {
        Ok(self
            .members_as_written(index, pool)?
            .into_iter()
            .map(|(mut b, drained)| {
                // Drained: no share of the table (the file keeps its
                // weight to restore).
                if drained {
                    b.weight = 0;
                }
                b
            })
            .collect())
    }
}

impl FleetConf {
    /// This load balancer's own address in [`FleetConf::peers`]: `[encap]
    /// source` for IPv4 peers, `source6` for IPv6 ones.
    pub fn own(&self, encap: &Encap) -> Option<IpAddr> {
        if self.peers.first().is_some_and(IpAddr::is_ipv6) {
            encap.source6
        } else {
            encap.source
        }
    }
}

impl Encap {
    /// Per-flow entropy from `source_prefix` and `source_prefix6`, if
    /// either is set (validation has checked them; an invalid one counts
    /// as unset here).
    pub fn spread(&self) -> Option<packet::gre::Spread> {
        let parse = |s: &Option<String>| {
            let (a, l) = parse_prefix(s.as_deref()?)?;
            packet::gre::SourcePrefix::new(a, l).ok()
        };
        let s = packet::gre::Spread {
            v4: parse(&self.source_prefix).filter(|p| p.is_v4()),
            v6: parse(&self.source_prefix6).filter(|p| !p.is_v4()),
        };
        (s.v4.is_some() || s.v6.is_some()).then_some(s)
    }
}

/// A backend in a snapshot.
#[derive(Debug, Clone)]
pub struct Backend {
    /// Unique name.
    pub name: String,
    /// Address (IPv4-mapped for IPv4).
    pub addr: [u8; 16],
    /// Whether new and existing flows may go to it.
    pub healthy: bool,
    /// Whether new connections may go to it: healthy and not drained
    /// (weight above 0). A drained backend keeps its established
    /// connections (conntrack) but takes no new ones.
    pub accepting: bool,
    /// Whether it is in the current configuration.
    pub configured: bool,
    /// Outer headers for packets to it.
    pub outer: Outer,
    /// The same headers made once ([`packet::gre::Template`]), which the
    /// packet threads copy instead of building them per packet; set with
    /// `outer` by the table builder. `None`: built from `outer` per packet.
    pub template: Option<packet::gre::Template>,
}

/// A VIP in a snapshot (a clone shares its Maglev table).
#[derive(Debug, Clone)]
pub struct Vip {
    /// Name from the configuration.
    pub name: String,
    /// Its Maglev table over its healthy backends (slots index `slots`);
    /// shared by the VIPs whose pools have the same table size and
    /// backends, and carried over by reloads that leave them unchanged.
    pub table: Arc<Maglev>,
    /// Backend id of each table index.
    pub slots: Vec<u32>,
    /// All its backends' ids (healthy or not).
    pub backends: Vec<u32>,
    /// The weight of each of `backends` in this VIP's pool (0: drained).
    pub weights: Vec<u32>,
    /// Its pool's name.
    pub pool: String,
    /// A stable 64-bit hash (FNV-1a, the same in every process and on every
    /// machine) of what this VIP forwards by: its lookup table (the backend
    /// per entry) and its backends (address and weight, in the table or
    /// not). Two load balancers with equal fingerprints pick the same backend
    /// for every flow; computed once per build (see [`fingerprint`]).
    pub fingerprint: u64,
    /// A `quic` VIP's routing by connection ID ([`crate::quic`]).
    pub quic: Option<Arc<crate::quic::QuicRoute>>,
}

impl Vip {
    /// The backend for a flow hash, if any backend is healthy.
    #[inline]
    pub fn pick(&self, hash: u64) -> Option<u32> {
        self.table.lookup(hash).map(|i| self.slots[i as usize])
    }
}

/// One consistent view of the configuration.
#[derive(Debug)]
pub struct Tables {
    /// VIP matching.
    pub matcher: VipMatcher,
    /// VIPs, by index.
    pub vips: Vec<Vip>,
    /// Backends, by stable id.
    pub backends: Vec<Backend>,
    /// Incremented by every swap.
    pub generation: u64,
    /// `[fleet]`: where fragments go (none: all are handled here).
    pub fleet: Option<crate::frag_redirect::Fleet>,
    /// This load balancer's own addresses (`[encap]` source and source6,
    /// key form): GRE to one of them marked as a redirected fragment is
    /// taken in ([`crate::frag_redirect`]).
    pub own: Vec<[u8; 16]>,
    /// `[encap] source_prefix` / `source_prefix6`: per-flow outer sources
    /// and the flow hash in the GRE key (none: every frame from `source`).
    /// In the snapshot, so that a reload changes it between two batches.
    pub spread: Option<packet::gre::Spread>,
    /// The room the load balancer in the driver (XDP) was loaded with, once
    /// it is (the same cell in every snapshot of one [`Control`]): its maps
    /// keep their sizes until a restart, so the control plane refuses a
    /// configuration whose tables would not fit them
    /// ([`crate::xdp::Loader::for_tables`] fills it).
    pub driver_room: Arc<std::sync::OnceLock<crate::xdp::Sizes>>,
    /// Whether any VIP is `quic`: UDP is read for connection IDs only then.
    pub any_quic: bool,
}

impl Tables {
    /// Whether `addr` is one of this load balancer's own addresses.
    #[inline]
    pub fn is_own(&self, addr: &[u8; 16]) -> bool {
        self.own.iter().any(|a| a == addr)
    }

    /// The heap memory of this snapshot's tables, per VIP and in total
    /// (see [`TableMemory`]).
    pub fn memory(&self) -> TableMemory {
        use std::mem::size_of;
        let mut seen = std::collections::HashSet::new();
        let mut tables = 0;
        let per_vip: Vec<usize> = self
            .vips
            .iter()
            .map(|v| {
                let table: *const Maglev = &*v.table;
                if seen.insert(table) {
                    tables += v.table.heap_bytes();
                }
                v.table.heap_bytes()
                    + (v.slots.capacity() + v.backends.capacity() + v.weights.capacity())
                        * size_of::<u32>()
            })
            .collect();
        let vip_lists: usize = self
            .vips
            .iter()
            .map(|v| {
                size_of::<Vip>()
                    + v.name.capacity()
                    + v.pool.capacity()
                    + (v.slots.capacity() + v.backends.capacity() + v.weights.capacity())
                        * size_of::<u32>()
            })
            .sum();
        let backends = self.backends.capacity() * size_of::<Backend>()
            + self
                .backends
                .iter()
                .map(|b| b.name.capacity())
                .sum::<usize>();
        TableMemory {
            per_vip,
            distinct_tables: seen.len(),
            tables,
            total: tables + vip_lists + backends,
        }
    }
}

/// Heap bytes of a snapshot ([`Tables::memory`]), by allocated capacity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableMemory {
    /// Per VIP (in `Tables::vips` order): its Maglev table (slots, bitmap,
    /// scratch) and its backend lists. VIPs sharing a table (same pool,
    /// same backends and health) each count it here.
    pub per_vip: Vec<usize>,
    /// Maglev tables in the snapshot; VIPs whose pools have the same table
    /// size, backends, weights and health share one.
    pub distinct_tables: usize,
    /// Bytes of the distinct Maglev tables, each counted once.
    pub tables: usize,
    /// Everything: the distinct tables once, every VIP's lists and names,
    /// and the backend registry.
    pub total: usize,
}

/// The control plane: owns the configuration, the backend registry and
/// health, builds snapshots aside and swaps them in.
pub struct Control {
    config: Config,
    /// Backend ids by name.
    ids: rustc_hash::FxHashMap<String, u32>,
    /// Backend ids of backends named by their address (no `name`), by
    /// address: the same ids as `ids`, found without formatting the name.
    addr_ids: rustc_hash::FxHashMap<std::net::IpAddr, u32>,
    /// Health by backend id (absent: healthy).
    health: rustc_hash::FxHashMap<u32, bool>,
    /// The tables of the running snapshot by what they are built from:
    /// what the next build reuses.
    built: rustc_hash::FxHashMap<TableKey, Arc<Built>>,
    generation: u64,
    current: Arc<ArcSwap<Tables>>,
    /// `[fleet]`: the peer table of the running list and address (kept
    /// across liveness changes), peers known down, and the address of
    /// each per-peer counter slot (append-only).
    peers: Option<(
        Vec<std::net::IpAddr>,
        std::net::IpAddr,
        Arc<crate::frag_redirect::Peers>,
    )>,
    peers_down: std::collections::HashSet<std::net::IpAddr>,
    peer_slots: Vec<std::net::IpAddr>,
    /// The next hop's MAC as the daemon resolved it from the kernel, used
    /// when `[encap] gateway_mac` is not set (kept across reloads).
    resolved_gateway: Option<[u8; 6]>,
    /// The driver's room ([`Tables::driver_room`]), shared with every
    /// snapshot.
    driver_room: Arc<std::sync::OnceLock<crate::xdp::Sizes>>,
    /// `[[quic_lb]]` with its keys read, once per configuration applied
    /// (health changes rebuild tables without reading key files again).
    quic: Option<Arc<quic_lb::Configs>>,
}

impl Control {
    /// Builds the first snapshot from a validated configuration.
    pub fn new(config: Config) -> Result<Self, ConfigError> {
        Self::with_gateway(config, None)
    }

    /// Like [`Control::new`], with the next hop's MAC already resolved
    /// (see [`Control::set_resolved_gateway`]), so that the first snapshot
    /// carries it.
    pub fn with_gateway(config: Config, resolved: Option<[u8; 6]>) -> Result<Self, ConfigError> {
        let driver_room = Arc::new(std::sync::OnceLock::new());
        let mut c = Control {
            config: Config::default(),
            ids: rustc_hash::FxHashMap::default(),
            addr_ids: rustc_hash::FxHashMap::default(),
            health: rustc_hash::FxHashMap::default(),
            built: rustc_hash::FxHashMap::default(),
            generation: 0,
            current: Arc::new(ArcSwap::from_pointee(Tables {
                matcher: VipMatcher::default(),
                vips: Vec::new(),
                backends: Vec::new(),
                generation: 0,
                fleet: None,
                own: Vec::new(),
                spread: None,
                driver_room: Arc::clone(&driver_room),
                any_quic: false,
            })),
            peers: None,
            peers_down: std::collections::HashSet::new(),
            peer_slots: Vec::new(),
            resolved_gateway: resolved,
            driver_room,
            quic: None,
        };
        c.apply(config)?;
        Ok(c)
    }

    /// The shared handle packet threads load snapshots from.
    pub fn tables(&self) -> Arc<ArcSwap<Tables>> {
        Arc::clone(&self.current)
    }

    /// The running configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Replaces the configuration: the new tables are built aside and swapped
    /// in one step. An invalid configuration is rejected whole and the
    /// running one keeps serving; so is one whose tables would not fit the
    /// maps the load balancer in the driver was loaded with
    /// ([`Tables::driver_room`]): only a restart makes them bigger.
    pub fn apply(&mut self, config: Config) -> Result<(), ConfigError> {
        config.validate("(config)")?;
        let quic = if config.quic_lb.is_empty() {
            None
        } else {
            Some(Arc::new(config.quic_configs().map_err(|e| {
                ConfigError {
                    file: "(config)".into(),
                    key: "quic_lb".into(),
                    problem: e.to_string(),
                }
            })?))
        };
        let running = std::mem::replace(&mut self.quic, quic);
        let tables = match self.build(&config) {
            Ok(t) => t,
            Err(e) => {
                self.quic = running;
                return Err(e);
            }
        };
        self.config = config;
        self.current.store(Arc::new(tables));
        Ok(())
    }

    /// Marks a `[fleet]` peer up or down (from the daemon's peer checks)
    /// and swaps in tables that say so: fragments a down peer is
    /// responsible for are dropped (`fragment_peer_down`), never sent to
    /// another peer ([`crate::frag_redirect`] says why). Returns false for an
    /// address that is not a peer, or is this load balancer.
    pub fn set_peer_up(&mut self, peer: std::net::IpAddr, up: bool) -> bool {
        let Some(f) = &self.config.fleet else {
            return false;
        };
        if !f.peers.contains(&peer) || f.own(&self.config.encap) == Some(peer) {
            return false;
        }
        let changed = if up {
            self.peers_down.remove(&peer)
        } else {
            self.peers_down.insert(peer)
        };
        if changed && !self.swap_fleet() {
            return false; // the config was valid when applied
        }
        true
    }

    /// Swaps in the running snapshot with only its `[fleet]` part built
    /// again (after a peer liveness change): liveness is all that changed,
    /// so the VIPs keep their Maglev tables (the same [`Arc`]s), slots and
    /// fingerprints, and the backends their ids and health; nothing is
    /// validated or hashed again. False if the fleet could not be built,
    /// which cannot happen to a configuration that was valid when applied.
    fn swap_fleet(&mut self) -> bool {
        let cfg = std::mem::take(&mut self.config);
        let (eth_src, eth_dst) = (encap_mac(&cfg), self.gateway_mac(&cfg));
        let fleet = self.build_fleet(&cfg, eth_src, eth_dst);
        self.config = cfg;
        let Ok(fleet) = fleet else {
            return false;
        };
        let cur = self.current.load_full();
        self.generation += 1;
        self.current.store(Arc::new(Tables {
            matcher: cur.matcher.clone(),
            vips: cur.vips.clone(),
            backends: cur.backends.clone(),
            generation: self.generation,
            fleet,
            own: cur.own.clone(),
            spread: cur.spread,
            driver_room: Arc::clone(&self.driver_room),
            any_quic: cur.any_quic,
        }));
        true
    }

    /// Builds the running configuration again (after a health or peer
    /// change) and swaps it in; false if the build failed, which cannot
    /// happen to a configuration that was valid when applied.
    fn rebuild(&mut self) -> bool {
        let cfg = std::mem::take(&mut self.config);
        let built = self.build(&cfg);
        self.config = cfg;
        match built {
            Ok(t) => {
                self.current.store(Arc::new(t));
                true
            }
            Err(_) => false,
        }
    }

    /// The destination MAC of encapsulated frames under `cfg`: `[encap]
    /// gateway_mac` if set, else the resolved next hop, else
    /// [`PLACEHOLDER_GATEWAY_MAC`].
    pub fn gateway_mac(&self, cfg: &Config) -> [u8; 6] {
        cfg.encap
            .gateway_mac
            .as_deref()
            .and_then(parse_mac)
            .or(self.resolved_gateway)
            .unwrap_or(PLACEHOLDER_GATEWAY_MAC)
    }

    /// The next hop's MAC as last resolved (none: not resolved).
    pub fn resolved_gateway(&self) -> Option<[u8; 6]> {
        self.resolved_gateway
    }

    /// Sets the next hop's MAC the daemon resolved from the kernel (none:
    /// unresolved) and, if that changes the frames' destination (no
    /// `[encap] gateway_mac` overrides it), swaps in tables that use it, in
    /// one step like a reload. Returns whether the tables were swapped.
    pub fn set_resolved_gateway(&mut self, mac: Option<[u8; 6]>) -> bool {
        if self.resolved_gateway == mac {
            return false;
        }
        let before = self.gateway_mac(&self.config);
        self.resolved_gateway = mac;
        before != self.gateway_mac(&self.config) && self.rebuild()
    }

    /// Marks a backend healthy or not (by name) and swaps in tables without
    /// (or with) it. Returns false for an unknown name.
    pub fn set_health(&mut self, name: &str, healthy: bool) -> bool {
        let Some(&id) = self.ids.get(name) else {
            return false;
        };
        self.health.insert(id, healthy);
        self.rebuild()
    }

    /// A `quic` VIP's routing: its pool's server IDs (members in the order
    /// [`Config::pool_members`] gives them, as `members` holds their ids).
    fn quic_route(
        &self,
        cfg: &Config,
        index: &std::collections::HashMap<&str, &crate::config::PoolConf>,
        v: &crate::config::VipConf,
        members: &[Member],
    ) -> Result<Option<Arc<crate::quic::QuicRoute>>, ConfigError> {
        let (true, Some(configs)) = (v.quic, &self.quic) else {
            return Ok(None);
        };
        let err = |problem: String| ConfigError {
            file: "(config)".into(),
            key: format!("vips.{}", v.name),
            problem,
        };
        let list = cfg
            .pool_members(index, &v.pool)
            .map_err(|c| err(format!("cycle: {c}")))?;
        let mut ids = Vec::with_capacity(members.len());
        for (b, m) in list.iter().zip(members) {
            let text = b.quic_server_id.as_deref().unwrap_or("");
            let sid =
                crate::quic::server_id(&b.display_name(), text).map_err(|e| err(e.to_string()))?;
            ids.push((sid, m.id));
        }
        Ok(Some(Arc::new(crate::quic::QuicRoute::new(
            Arc::clone(configs),
            ids,
        ))))
    }

    fn build(&mut self, cfg: &Config) -> Result<Tables, ConfigError> {
        let err = |key: String, problem: String| ConfigError {
            file: "(config)".into(),
            key,
            problem,
        };
        let eth_src = encap_mac(cfg);
        let eth_dst = self.gateway_mac(cfg);
        let src4 = cfg.encap.source.map(packet::flow::from_ip);
        let src6 = cfg.encap.source6.map(packet::flow::from_ip);
        // Registry (the running snapshot's backends): every backend named
        // anywhere gets a stable id. New names are kept aside so a failed
        // build changes nothing.
        let mut added: rustc_hash::FxHashMap<String, u32> = Default::default();
        let mut added_addr: rustc_hash::FxHashMap<std::net::IpAddr, u32> = Default::default();
        let mut backends = self.current.load().backends.clone();
        for b in backends.iter_mut() {
            b.configured = false;
            b.healthy = false;
            b.accepting = false;
        }
        let index = cfg.pool_index();
        // Each distinct pool's members once, however many VIPs it serves.
        let mut pools: rustc_hash::FxHashMap<&str, Arc<PoolMembers>> = Default::default();
        // The tables of this build by key: reused from the last build, or
        // none yet (in `todo`).
        let mut tables: rustc_hash::FxHashMap<TableKey, Option<Arc<Built>>> = Default::default();
        let mut todo: Vec<Todo> = Vec::new();
        // Per VIP: its pool's members and its table's key.
        let mut per_vip = Vec::with_capacity(cfg.vips.len());
        for (i, v) in cfg.vips.iter().enumerate() {
            let members = match pools.get(v.pool.as_str()) {
                Some(m) => Arc::clone(m),
                None => {
                    let list = cfg
                        .pool_members(&index, &v.pool)
                        .map_err(|c| err(format!("vips[{i}].pool"), format!("cycle: {c}")))?;
                    let size = index.get(v.pool.as_str()).map_or(65_537, |p| p.table_size);
                    let mut m = PoolMembers {
                        key: TableKey {
                            size,
                            members: Vec::with_capacity(list.len()),
                        },
                        weights: Vec::with_capacity(list.len()),
                    };
                    for b in list.iter() {
                        let addr = packet::flow::from_ip(b.address);
                        let known = match &b.name {
                            Some(n) => self.ids.get(n).or_else(|| added.get(n)).copied(),
                            None => self
                                .addr_ids
                                .get(&b.address)
                                .or_else(|| added_addr.get(&b.address))
                                .copied(),
                        };
                        let id = match known {
                            Some(id) => id,
                            None => {
                                let name = b.display_name();
                                if let Some(&id) = self.ids.get(&name).or_else(|| added.get(&name))
                                {
                                    // Named by its address elsewhere.
                                    if b.name.is_none() {
                                        added_addr.insert(b.address, id);
                                    }
                                    id
                                } else {
                                    let id = backends.len() as u32;
                                    backends.push(Backend {
                                        name: name.clone(),
                                        addr,
                                        healthy: false,
                                        accepting: false,
                                        configured: false,
                                        outer: Outer {
                                            eth_src,
                                            eth_dst,
                                            src: [0; 16],
                                            dst: addr,
                                            ttl: 64,
                                        },
                                        template: None,
                                    });
                                    added.insert(name, id);
                                    if b.name.is_none() {
                                        added_addr.insert(b.address, id);
                                    }
                                    id
                                }
                            }
                        };
                        let healthy = *self.health.get(&id).unwrap_or(&true);
                        let src = if b.address.is_ipv4() { src4 } else { src6 };
                        let r = &mut backends[id as usize];
                        r.addr = addr;
                        r.configured = true;
                        r.healthy = healthy;
                        // In any pool with a weight: a backend drained in
                        // one pool but weighted in another still takes new
                        // connections.
                        r.accepting |= healthy && b.weight > 0;
                        r.outer = Outer {
                            eth_src,
                            eth_dst,
                            src: src.unwrap_or([0; 16]),
                            dst: addr,
                            ttl: cfg.encap.ttl,
                        };
                        r.template = packet::gre::Template::new(&r.outer).ok();
                        m.key.members.push(Member {
                            id,
                            addr,
                            weight: b.weight,
                            healthy,
                        });
                        m.weights.push(b.weight);
                    }
                    let m = Arc::new(m);
                    pools.insert(v.pool.as_str(), Arc::clone(&m));
                    m
                }
            };
            if !tables.contains_key(&members.key) {
                let reused = self.built.get(&members.key).map(Arc::clone);
                if reused.is_none() {
                    todo.push(Todo {
                        key: members.key.clone(),
                        pool: v.pool.clone(),
                    });
                }
                tables.insert(members.key.clone(), reused);
            }
            per_vip.push(members);
        }
        // Build what changed, in parallel.
        let fresh = build_tables(&todo, &backends)
            .map_err(|(pool, key, e)| err(format!("pools.{pool}{key}"), e.to_string()))?;
        let mut built: rustc_hash::FxHashMap<TableKey, Arc<Built>> = Default::default();
        built.reserve(tables.len());
        for (t, b) in todo.into_iter().zip(fresh) {
            built.insert(t.key, Arc::new(b));
        }
        built.extend(tables.into_iter().filter_map(|(k, b)| Some((k, b?))));
        let mut vips = Vec::with_capacity(cfg.vips.len());
        for (v, members) in cfg.vips.iter().zip(per_vip) {
            let b = &built[&members.key];
            // What the VIP matches is part of what the fleet must agree on:
            // the same table behind another address or port serves other
            // traffic.
            let matches = format!(
                "{}|{}|{}|{}|{}",
                v.address.map(|a| a.to_string()).unwrap_or_default(),
                v.prefix_group.as_deref().unwrap_or(""),
                v.suffix.map(|a| a.to_string()).unwrap_or_default(),
                v.port.map(|p| p.to_string()).unwrap_or_default(),
                v.protocol.number()
            );
            vips.push(Vip {
                name: v.name.clone(),
                table: Arc::clone(&b.table),
                slots: b.slots.clone(),
                backends: members.key.members.iter().map(|m| m.id).collect(),
                weights: members.weights.clone(),
                pool: v.pool.clone(),
                fingerprint: vip_fingerprint(&matches, b.fingerprint),
                quic: self.quic_route(cfg, &index, v, &members.key.members)?,
            });
        }
        let fleet = self
            .build_fleet(cfg, eth_src, eth_dst)
            .map_err(|e| err("fleet".into(), e.to_string()))?;
        let own = [cfg.encap.source, cfg.encap.source6]
            .into_iter()
            .flatten()
            .map(packet::flow::from_ip)
            .collect();
        let any_quic = vips.iter().any(|v| v.quic.is_some());
        let tables = Tables {
            any_quic,
            matcher: VipMatcher::new(cfg),
            vips,
            backends,
            generation: self.generation + 1,
            fleet,
            own,
            spread: cfg.encap.spread(),
            driver_room: Arc::clone(&self.driver_room),
        };
        // Refused before anything here changes: the running snapshot stays
        // what the driver forwards by.
        if let Some(room) = self.driver_room.get() {
            crate::xdp::fits(room, &tables).map_err(|(key, problem)| err(key, problem))?;
        }
        self.ids.extend(added);
        self.addr_ids.extend(added_addr);
        self.built = built;
        self.generation += 1;
        Ok(tables)
    }

    /// The `[fleet]` part of a snapshot: the peer table (rebuilt only when
    /// the list or this load balancer's address changes), liveness, outer
    /// headers and counter slots.
    fn build_fleet(
        &mut self,
        cfg: &Config,
        eth_src: [u8; 6],
        eth_dst: [u8; 6],
    ) -> Result<Option<crate::frag_redirect::Fleet>, crate::frag_redirect::FleetError> {
        let Some(f) = &cfg.fleet else {
            self.peers = None;
            return Ok(None);
        };
        let Some(me) = f.own(&cfg.encap) else {
            return Ok(None); // rejected by validation
        };
        // A peer that leaves the list and comes back starts up, as its new
        // check does.
        self.peers_down.retain(|a| f.peers.contains(a));
        let peers = match &self.peers {
            Some((list, addr, p)) if *list == f.peers && *addr == me => Arc::clone(p),
            _ => {
                let p = Arc::new(crate::frag_redirect::Peers::new(&f.peers, me)?);
                self.peers = Some((f.peers.clone(), me, Arc::clone(&p)));
                p
            }
        };
        let src = packet::flow::from_ip(me);
        let mut counter_slot = Vec::with_capacity(peers.addrs().len());
        for a in peers.addrs() {
            let slot = match self.peer_slots.iter().position(|s| s == a) {
                Some(i) => i,
                None => {
                    self.peer_slots.push(*a);
                    self.peer_slots.len() - 1
                }
            };
            counter_slot.push(slot as u32);
        }
        Ok(Some(crate::frag_redirect::Fleet {
            up: peers
                .addrs()
                .iter()
                .map(|a| *a == me || !self.peers_down.contains(a))
                .collect(),
            outer: peers
                .addrs()
                .iter()
                .map(|a| Outer {
                    eth_src,
                    eth_dst,
                    src,
                    dst: packet::flow::from_ip(*a),
                    ttl: cfg.encap.ttl,
                })
                .collect(),
            counter_slot,
            counter_peers: Arc::new(self.peer_slots.clone()),
            peers,
        }))
    }
}

/// The source MAC of encapsulated frames: `[encap] mac`, else a locally
/// administered placeholder.
fn encap_mac(cfg: &Config) -> [u8; 6] {
    cfg.encap
        .mac
        .as_deref()
        .and_then(parse_mac)
        .unwrap_or([2, 0, 0, 0, 0, 1])
}

/// One backend of a pool as its table sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Member {
    /// Stable id (one per name, for the life of the control plane): the
    /// name seeds the backend's permutation.
    id: u32,
    /// Address (the fingerprint hashes it).
    addr: [u8; 16],
    /// Weight (0: drained, out of the table).
    weight: u32,
    /// Health (unhealthy: out of the table).
    healthy: bool,
}

/// What a table is built from: its size and its pool's backends in
/// configuration order (the order the table's indices follow). Equal keys
/// give equal tables, slots and fingerprints.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct TableKey {
    size: u64,
    members: Vec<Member>,
}

/// A pool's backends in one build.
struct PoolMembers {
    key: TableKey,
    /// The weight of each member (as in `Vip::weights`).
    weights: Vec<u32>,
}

/// A table and what goes with it, shared by every VIP of equal key.
#[derive(Debug)]
struct Built {
    table: Arc<Maglev>,
    /// Backend id of each table index.
    slots: Vec<u32>,
    /// The table's [`fingerprint`] (without what a VIP matches).
    fingerprint: u64,
}

/// A table to build, and the pool named in its errors.
struct Todo {
    key: TableKey,
    pool: String,
}

/// A built table, or the key under `pools.<pool>` its error names and the
/// error.
type BuildResult = Result<Built, (&'static str, maglev::Error)>;

/// Builds one table from its key; the error names the key under
/// `pools.<pool>` (`".table_size"` or `""`).
fn build_table(key: &TableKey, backends: &[Backend]) -> BuildResult {
    let mut hashing = Vec::new();
    let mut slots = Vec::new();
    // (address, weight) of the backends in the table, in table index
    // order, and of those left out (unhealthy or drained).
    let mut in_table = Vec::new();
    let mut out_of_table = Vec::new();
    for m in &key.members {
        if m.healthy && m.weight > 0 {
            hashing.push(maglev::Backend::weighted(
                backends[m.id as usize].name.clone(),
                m.weight,
            ));
            slots.push(m.id);
            in_table.push((m.addr, m.weight));
        } else {
            out_of_table.push((m.addr, m.weight));
        }
    }
    let mut table = Maglev::new(key.size).map_err(|e| (".table_size", e))?;
    table.populate(&hashing).map_err(|e| ("", e))?;
    let fingerprint = fingerprint(&table, &in_table, &out_of_table);
    Ok(Built {
        table: Arc::new(table),
        slots,
        fingerprint,
    })
}

/// Builds `todo`'s tables, in order, on up to one thread per core (each
/// takes the next table not taken); the first error (in `todo` order)
/// names its pool.
fn build_tables(
    todo: &[Todo],
    backends: &[Backend],
) -> Result<Vec<Built>, (String, &'static str, maglev::Error)> {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(todo.len());
    let one = |i: usize| build_table(&todo[i].key, backends);
    let mut done: Vec<(usize, BuildResult)> = if threads <= 1 {
        (0..todo.len()).map(|i| (i, one(i))).collect()
    } else {
        let next = AtomicUsize::new(0);
        let work = || {
            let mut mine = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= todo.len() {
                    break mine;
                }
                mine.push((i, one(i)));
            }
        };
        std::thread::scope(|s| {
            let helpers: Vec<_> = (1..threads).map(|_| s.spawn(work)).collect();
            let mut all = work();
            for h in helpers {
                // A panic in a helper is a bug; carry it to the caller.
                all.extend(h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)));
            }
            all
        })
    };
    done.sort_unstable_by_key(|(i, _)| *i);
    done.into_iter()
        .map(|(i, r)| r.map_err(|(key, e)| (todo[i].pool.clone(), key, e)))
        .collect()
}

/// FNV-1a, 64 bits: a fixed, seedless hash, so a fingerprint means the same
/// in every process and on every machine (unlike std's `RandomState`).
struct Fnv1a(u64);

impl Fnv1a {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;

    fn new() -> Self {
        Fnv1a(Self::OFFSET)
    }

    fn bytes(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(Self::PRIME);
        }
    }

    fn u32(&mut self, v: u32) {
        self.bytes(&v.to_le_bytes());
    }

    /// FNV-1a over 32-bit words: one multiply per word instead of four.
    /// For the table's entries (65,537 of them by default), which made the
    /// byte-wise hash an eighth of a 1,000-VIP load's CPU time.
    fn words(&mut self, words: impl Iterator<Item = u32>) {
        for w in words {
            self.0 ^= u64::from(w);
            self.0 = self.0.wrapping_mul(Self::PRIME);
        }
    }
}

/// The fingerprint of one VIP's forwarding state: the table and its
/// backends, independent of the order the configuration lists them in and
/// of this process's backend ids.
///
/// `in_table` holds (address, weight) of each backend in table index order
/// (the index `table` entries hold); `out_of_table` the backends left out
/// (unhealthy, or drained with weight 0). The backends are hashed in
/// address order, and each table entry as the address-order rank of its
/// backend, so two configurations listing the same backends in a different
/// order (which give the same table) have the same fingerprint.
pub fn fingerprint(
    table: &Maglev,
    in_table: &[([u8; 16], u32)],
    out_of_table: &[([u8; 16], u32)],
) -> u64 {
    let mut order: Vec<usize> = (0..in_table.len()).collect();
    order.sort_by_key(|&i| in_table[i]);
    // rank[table index] = position in address order.
    let mut rank = vec![0u32; in_table.len()];
    for (r, &i) in order.iter().enumerate() {
        rank[i] = r as u32;
    }
    let mut h = Fnv1a::new();
    h.u32(in_table.len() as u32);
    for &i in &order {
        h.bytes(&in_table[i].0);
        h.u32(in_table[i].1);
    }
    let mut out = out_of_table.to_vec();
    out.sort_unstable();
    h.u32(out.len() as u32);
    for (addr, weight) in &out {
        h.bytes(addr);
        h.u32(*weight);
    }
    h.u32(table.size());
    h.words(
        table
            .entries()
            .iter()
            .map(|&e| rank.get(e as usize).copied().unwrap_or(u32::MAX)),
    );
    h.0
}

/// A VIP's fingerprint: what it matches (`address|prefix group|suffix|
/// port|protocol`) and its table's [`fingerprint`].
pub fn vip_fingerprint(matches: &str, table: u64) -> u64 {
    let mut h = Fnv1a::new();
    h.bytes(matches.as_bytes());
    h.bytes(&table.to_le_bytes());
    h.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    #[test]
    fn a_vip_at_another_address_or_port_has_another_fingerprint() {
        let t = 0x1234_5678_9abc_def0;
        let a = vip_fingerprint("192.0.2.80|||80|6", t);
        assert_eq!(a, vip_fingerprint("192.0.2.80|||80|6", t));
        assert_ne!(a, vip_fingerprint("192.0.2.81|||80|6", t));
        assert_ne!(a, vip_fingerprint("192.0.2.80|||81|6", t));
        assert_ne!(a, vip_fingerprint("192.0.2.80|||80|17", t));
        assert_ne!(a, vip_fingerprint("192.0.2.80|||80|6", t ^ 1));
    }

    /// A configuration with one VIP over `backends` (address last octet,
    /// weight), listed in the given order.
    fn config(backends: &[(u8, u32)], table_size: u64) -> Config {
        let list: Vec<String> = backends
            .iter()
            .map(|(o, w)| format!("{{ address = \"10.1.0.{o}\", weight = {w} }}"))
            .collect();
        let text = format!(
            "[encap]\nsource = \"10.0.0.1\"\n\
             [[pools]]\nname = \"web\"\ntable_size = {table_size}\nbackends = [{}]\n\
             [[vips]]\nname = \"http\"\naddress = \"198.18.0.80\"\nport = 80\n\
             protocol = \"tcp\"\npool = \"web\"\n",
            list.join(", ")
        );
        Config::parse(&text, "t.toml").unwrap()
    }

    fn fp(c: &Control) -> u64 {
        c.tables().load().vips[0].fingerprint
    }

    #[test]
    fn fnv1a_matches_the_reference_vectors() {
        // From the FNV reference (draft-eastlake-fnv): "" and "a".
        let mut h = Fnv1a::new();
        assert_eq!(h.0, 0xcbf2_9ce4_8422_2325);
        h.bytes(b"a");
        assert_eq!(h.0, 0xaf63_dc4c_8601_ec8c);
        let mut h = Fnv1a::new();
        h.bytes(b"foobar");
        assert_eq!(h.0, 0x8594_4171_f739_67e8);
    }

    #[test]
    fn fingerprint_is_a_constant_across_processes() {
        // A fixed value: any change to the hashed content or the hash shows
        // here, and another process or machine computes the same.
        let c = Control::new(config(&[(1, 1), (2, 2), (3, 1)], 251)).unwrap();
        let again = Control::new(config(&[(1, 1), (2, 2), (3, 1)], 251)).unwrap();
        assert_eq!(fp(&c), fp(&again));
        assert_eq!(format!("{:016x}", fp(&c)), "ff3db3f5a2f862ea");
    }

    #[test]
    fn fingerprint_ignores_process_history() {
        // A load balancer that saw other backends first (other ids) agrees
        // with a fresh one on the same configuration.
        let mut old = Control::new(config(&[(9, 1), (8, 1)], 251)).unwrap();
        old.apply(config(&[(1, 1), (2, 2)], 251)).unwrap();
        let fresh = Control::new(config(&[(1, 1), (2, 2)], 251)).unwrap();
        assert_eq!(fp(&old), fp(&fresh));
    }

    #[test]
    fn the_resolved_gateway_is_swapped_in_and_a_configured_one_wins() {
        let dst = |c: &Control| -> Vec<[u8; 6]> {
            c.tables()
                .load()
                .backends
                .iter()
                .map(|b| b.outer.eth_dst)
                .collect()
        };
        let resolved = [2, 0, 0, 0, 0x5a, 0xfe];
        // Not configured, not resolved: the placeholder (pcap replay).
        let mut c = Control::new(config(&[(1, 1), (2, 1)], 251)).unwrap();
        assert_eq!(dst(&c), [PLACEHOLDER_GATEWAY_MAC; 2]);
        let (g0, f0) = (c.tables().load().generation, fp(&c));
        // Resolved: swapped in at once, the tables otherwise the same.
        assert!(c.set_resolved_gateway(Some(resolved)));
        assert_eq!(dst(&c), [resolved; 2]);
        assert_eq!(c.tables().load().generation, g0 + 1);
        assert_eq!(fp(&c), f0, "the next hop is not part of the fingerprint");
        assert!(
            !c.set_resolved_gateway(Some(resolved)),
            "no change, no swap"
        );
        // A reload keeps it, and backends added later get it too.
        c.apply(config(&[(1, 1), (2, 1), (3, 1)], 251)).unwrap();
        assert_eq!(dst(&c), [resolved; 3]);
        // A configured gateway_mac overrides it; a new resolution then
        // changes nothing.
        let mut cfg = config(&[(1, 1)], 251);
        cfg.encap.gateway_mac = Some("02:00:00:00:00:aa".into());
        c.apply(cfg).unwrap();
        let configured = [2, 0, 0, 0, 0, 0xaa];
        assert_eq!(dst(&c)[0], configured);
        assert!(!c.set_resolved_gateway(Some([2, 0, 0, 0, 0x5a, 0xfd])));
        assert_eq!(dst(&c)[0], configured);
        // Built with it from the start: the first snapshot carries it.
        let c = Control::with_gateway(config(&[(1, 1)], 251), Some(resolved)).unwrap();
        assert_eq!(dst(&c), [resolved]);
        assert_eq!(c.tables().load().generation, 1);
    }

    #[test]
    fn health_changes_that_change_the_table_change_it() {
        let mut c = Control::new(config(&[(1, 1), (2, 1), (3, 1)], 251)).unwrap();
        let before = fp(&c);
        assert!(c.set_health("10.1.0.2", false));
        let down = fp(&c);
        assert_ne!(before, down);
        assert!(c.set_health("10.1.0.2", true));
        assert_eq!(fp(&c), before, "back to the same table, same fingerprint");
    }

    #[test]
    fn unhealthy_and_drained_backends_differ() {
        // Both leave the table; the backend list tells them apart.
        let mut down = Control::new(config(&[(1, 1), (2, 1), (3, 1)], 251)).unwrap();
        assert!(down.set_health("10.1.0.3", false));
        let drained = Control::new(config(&[(1, 1), (2, 1), (3, 0)], 251)).unwrap();
        assert_eq!(
            down.tables().load().vips[0].table.entries(),
            drained.tables().load().vips[0].table.entries()
        );
        assert_ne!(fp(&down), fp(&drained));
    }

    fn backends() -> impl Strategy<Value = Vec<(u8, u32)>> {
        proptest::collection::btree_map(1u8..200, 0u32..4, 1..7)
            .prop_map(|m| m.into_iter().collect())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        #[test]
        fn same_config_same_fingerprint(b in backends(), rot in 0usize..7) {
            // Two independent control planes, the backends listed in a
            // different order: the same table, the same fingerprint.
            let mut other = b.clone();
            let len = other.len();
            other.rotate_left(rot % len);
            let x = Control::new(config(&b, 251)).unwrap();
            let y = Control::new(config(&other, 251)).unwrap();
            prop_assert_eq!(fp(&x), fp(&y));
        }

        #[test]
        fn equal_fingerprints_pick_the_same_backends(
            b in backends(),
            history in backends(),
            hashes in proptest::collection::vec(any::<u64>(), 64),
        ) {
            // One load balancer fresh, one that ran another configuration
            // first (other backend ids): equal fingerprints, and every flow
            // goes to the same backend address on both.
            let x = Control::new(config(&b, 251)).unwrap();
            let mut y = Control::new(config(&history, 251)).unwrap();
            y.apply(config(&b, 251)).unwrap();
            prop_assert_eq!(fp(&x), fp(&y));
            let (tx, ty) = (x.tables().load_full(), y.tables().load_full());
            for h in hashes {
                let addr = |t: &Tables| t.vips[0].pick(h).map(|id| t.backends[id as usize].addr);
                prop_assert_eq!(addr(&tx), addr(&ty));
            }
        }

        #[test]
        fn changing_a_weight_changes_it(b in backends(), i in 0usize..7, dw in 1u32..3) {
            let i = i % b.len();
            let mut changed = b.clone();
            changed[i].1 = (changed[i].1 + dw) % 4;
            let x = Control::new(config(&b, 251)).unwrap();
            let y = Control::new(config(&changed, 251)).unwrap();
            prop_assert_ne!(fp(&x), fp(&y));
        }

        #[test]
        fn removing_a_backend_changes_it(b in backends(), i in 0usize..7) {
            prop_assume!(b.len() > 1);
            let mut fewer = b.clone();
            fewer.remove(i % b.len());
            let x = Control::new(config(&b, 251)).unwrap();
            let y = Control::new(config(&fewer, 251)).unwrap();
            prop_assert_ne!(fp(&x), fp(&y));
        }

        #[test]
        fn table_size_changes_it(b in backends()) {
            let x = Control::new(config(&b, 251)).unwrap();
            let y = Control::new(config(&b, 257)).unwrap();
            prop_assert_ne!(fp(&x), fp(&y));
        }
    }

    /// A model of a configuration: pools (table size, backends as (last
    /// octet, weight), whether it includes pool 0) and VIPs (their pool).
    /// A pool of a [`Model`]: table size, backends, whether it includes p0.
    type ModelPool = (u64, Vec<(u8, u32)>, bool);

    #[derive(Debug, Clone)]
    struct Model {
        pools: Vec<ModelPool>,
        vips: Vec<usize>,
    }

    impl Model {
        fn text(&self) -> String {
            let mut t = String::from("[encap]\nsource = \"10.0.0.1\"\n");
            for (i, (size, backends, include)) in self.pools.iter().enumerate() {
                let list: Vec<String> = backends
                    .iter()
                    .map(|(o, w)| format!("{{ address = \"10.1.0.{o}\", weight = {w} }}"))
                    .collect();
                t += &format!(
                    "[[pools]]\nname = \"p{i}\"\ntable_size = {size}\nbackends = [{}]\n",
                    list.join(", ")
                );
                if *include && i != 0 {
                    t += "include = [\"p0\"]\n";
                }
            }
            for (i, p) in self.vips.iter().enumerate() {
                t += &format!(
                    "[[vips]]\nname = \"v{i}\"\naddress = \"198.18.0.{}\"\nport = 80\n\
                     protocol = \"tcp\"\npool = \"p{p}\"\n",
                    i + 1
                );
            }
            t
        }

        fn config(&self) -> Config {
            Config::parse(&self.text(), "model.toml").unwrap()
        }
    }

    /// One change to a model, or to health.
    #[derive(Debug, Clone)]
    enum Change {
        Weight(usize, usize, u32),
        Remove(usize, usize),
        Add(usize, u8, u32),
        Size(usize, u64),
        Include(usize),
        Retarget(usize, usize),
        Health(u8, bool),
    }

    fn pool_backends() -> impl Strategy<Value = Vec<(u8, u32)>> {
        proptest::collection::btree_map(1u8..12, 0u32..3, 0..5)
            .prop_map(|m| m.into_iter().collect())
    }

    fn model() -> impl Strategy<Value = Model> {
        (
            proptest::collection::vec(
                (
                    prop_oneof![Just(251u64), Just(257)],
                    pool_backends(),
                    any::<bool>(),
                ),
                3,
            ),
            proptest::collection::vec(0usize..3, 1..5),
        )
            .prop_map(|(pools, vips)| Model { pools, vips })
    }

    fn change() -> impl Strategy<Value = Change> {
        prop_oneof![
            (0usize..3, 0usize..5, 0u32..3).prop_map(|(p, i, w)| Change::Weight(p, i, w)),
            (0usize..3, 0usize..5).prop_map(|(p, i)| Change::Remove(p, i)),
            (0usize..3, 1u8..12, 0u32..3).prop_map(|(p, o, w)| Change::Add(p, o, w)),
            (0usize..3, prop_oneof![Just(251u64), Just(257)]).prop_map(|(p, m)| Change::Size(p, m)),
            (1usize..3).prop_map(Change::Include),
            (0usize..4, 0usize..3).prop_map(|(v, p)| Change::Retarget(v, p)),
            (1u8..12, any::<bool>()).prop_map(|(o, h)| Change::Health(o, h)),
        ]
    }

    /// A VIP's name, fingerprint, table entries, and the names of its
    /// table's backends and of all its backends.
    type Forwarding = (String, u64, Vec<u32>, Vec<String>, Vec<String>);

    /// What a VIP forwards by, in names rather than this process's ids.
    fn by_name(t: &Tables, v: &Vip) -> Forwarding {
        let name = |id: &u32| t.backends[*id as usize].name.clone();
        (
            v.name.clone(),
            v.fingerprint,
            v.table.entries().to_vec(),
            v.slots.iter().map(name).collect(),
            v.backends.iter().map(name).collect(),
        )
    }

    fn snapshot(c: &Control) -> Vec<Forwarding> {
        let t = c.tables().load_full();
        t.vips.iter().map(|v| by_name(&t, v)).collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]

        #[test]
        fn incremental_builds_equal_full_builds(
            start in model(),
            changes in proptest::collection::vec(change(), 1..12),
        ) {
            let mut m = start;
            let mut c = Control::new(m.config()).unwrap();
            let mut health: HashMap<String, bool> = HashMap::new();
            for ch in changes {
                match ch {
                    Change::Weight(p, i, w) => {
                        let b = &mut m.pools[p].1;
                        if !b.is_empty() {
                            let i = i % b.len();
                            b[i].1 = w;
                        }
                    }
                    Change::Remove(p, i) => {
                        let b = &mut m.pools[p].1;
                        if !b.is_empty() {
                            b.remove(i % b.len());
                        }
                    }
                    Change::Add(p, o, w) => {
                        if !m.pools[p].1.iter().any(|(x, _)| *x == o) {
                            m.pools[p].1.push((o, w));
                        }
                    }
                    Change::Size(p, size) => m.pools[p].0 = size,
                    Change::Include(p) => m.pools[p].2 ^= true,
                    Change::Retarget(v, p) => {
                        let v = v % m.vips.len();
                        m.vips[v] = p;
                    }
                    Change::Health(o, h) => {
                        let name = format!("10.1.0.{o}");
                        if c.set_health(&name, h) {
                            health.insert(name, h);
                        }
                    }
                }
                c.apply(m.config()).unwrap();
                // The peer: a fresh control plane with the same health.
                let mut fresh = Control::new(m.config()).unwrap();
                for (name, h) in &health {
                    fresh.set_health(name, *h);
                }
                prop_assert_eq!(snapshot(&c), snapshot(&fresh));
                // And this control plane rebuilding everything: the same
                // ids, so the same snapshot field for field.
                let before = c.tables().load_full();
                c.built.clear();
                prop_assert!(c.rebuild());
                let after = c.tables().load_full();
                for (x, y) in before.vips.iter().zip(&after.vips) {
                    prop_assert_eq!(x.table.entries(), y.table.entries());
                    prop_assert_eq!(&x.slots, &y.slots);
                    prop_assert_eq!(&x.backends, &y.backends);
                    prop_assert_eq!(&x.weights, &y.weights);
                    prop_assert_eq!(x.fingerprint, y.fingerprint);
                }
                let flags = |t: &Tables| -> Vec<(String, bool, bool, bool)> {
                    t.backends
                        .iter()
                        .map(|b| (b.name.clone(), b.healthy, b.accepting, b.configured))
                        .collect()
                };
                prop_assert_eq!(flags(&before), flags(&after));
            }
        }
    }

    #[test]
    fn unchanged_pools_keep_their_tables_and_equal_pools_share_one() {
        let mut m = Model {
            pools: vec![
                (251, vec![(1, 1), (2, 1)], false),
                (251, vec![(3, 1), (4, 1)], false),
                (251, vec![(1, 1), (2, 1)], false),
            ],
            vips: vec![0, 1, 2, 0],
        };
        let mut c = Control::new(m.config()).unwrap();
        let t0 = c.tables().load_full();
        // VIPs over one pool, and over equal pools, share a table.
        assert!(Arc::ptr_eq(&t0.vips[0].table, &t0.vips[3].table));
        assert!(Arc::ptr_eq(&t0.vips[0].table, &t0.vips[2].table));
        assert_eq!(t0.memory().distinct_tables, 2);
        // A reload changing pool 1 only rebuilds pool 1's table.
        m.pools[1].1.push((5, 2));
        c.apply(m.config()).unwrap();
        let t1 = c.tables().load_full();
        assert!(Arc::ptr_eq(&t0.vips[0].table, &t1.vips[0].table));
        assert!(Arc::ptr_eq(&t0.vips[2].table, &t1.vips[2].table));
        assert!(!Arc::ptr_eq(&t0.vips[1].table, &t1.vips[1].table));
        // A health change rebuilds the tables with that backend only.
        assert!(c.set_health("10.1.0.5", false));
        let t2 = c.tables().load_full();
        assert!(Arc::ptr_eq(&t1.vips[0].table, &t2.vips[0].table));
        assert!(!Arc::ptr_eq(&t1.vips[1].table, &t2.vips[1].table));
        // Back up: the same content as before, built again (the table of
        // the unhealthy state replaced it in the cache).
        assert!(c.set_health("10.1.0.5", true));
        let t3 = c.tables().load_full();
        assert_eq!(t3.vips[1].table.entries(), t1.vips[1].table.entries());
        assert_eq!(t3.vips[1].fingerprint, t1.vips[1].fingerprint);
        // Table memory: each table counted once in the total, per VIP each.
        let mem = t3.memory();
        assert_eq!(mem.per_vip.len(), 4);
        assert!(mem.per_vip.iter().all(|&b| b >= 251 * 4));
        assert!(mem.tables >= 2 * 251 * 4 && mem.tables < 3 * 251 * 4 + 4096);
        assert!(mem.total > mem.tables);
    }

    #[test]
    fn a_peer_change_swaps_the_fleet_and_keeps_every_table() {
        use std::net::IpAddr;
        let m = Model {
            pools: vec![
                (251, vec![(1, 1), (2, 1)], false),
                (257, vec![(3, 1), (4, 2)], true),
                (251, vec![(5, 1), (6, 0)], false),
            ],
            vips: vec![0, 1, 2, 1],
        };
        let text = format!(
            "{}[fleet]\npeers = [\"10.0.0.3\", \"10.0.0.1\", \"10.0.0.2\"]\n",
            m.text()
        );
        let cfg = Config::parse(&text, "fleet.toml").unwrap();
        let mut c = Control::new(cfg).unwrap();
        // Health state must survive the swap too.
        assert!(c.set_health("10.1.0.2", false));
        let fleet = |t: &Tables| {
            let f = t.fleet.as_ref().expect("[fleet] is configured");
            let up: Vec<(IpAddr, bool)> =
                f.peers.addrs().iter().copied().zip(f.up.clone()).collect();
            (
                up,
                f.outer.clone(),
                f.counter_slot.clone(),
                f.counter_peers.clone(),
            )
        };
        let flags = |t: &Tables| -> Vec<(String, [u8; 16], bool, bool, bool, Outer)> {
            t.backends
                .iter()
                .map(|b| {
                    (
                        b.name.clone(),
                        b.addr,
                        b.healthy,
                        b.accepting,
                        b.configured,
                        b.outer,
                    )
                })
                .collect()
        };
        let ip = |s: &str| -> IpAddr { s.parse().unwrap() };
        let t0 = c.tables().load_full();
        let forwarding0 = snapshot(&c);
        assert!(fleet(&t0).0.iter().all(|&(_, up)| up));

        // Not through a build at all: with the cache of built tables
        // emptied, a build (as a health change does) would make every
        // table anew.
        c.built.clear();
        assert!(c.set_peer_up(ip("10.0.0.2"), false));
        let t1 = c.tables().load_full();
        assert_eq!(t1.generation, t0.generation + 1);
        // Every Maglev table and the peer table are the running ones.
        for (x, y) in t0.vips.iter().zip(&t1.vips) {
            assert!(Arc::ptr_eq(&x.table, &y.table), "{} rebuilt", x.name);
        }
        let peers = |t: &Tables| Arc::clone(&t.fleet.as_ref().unwrap().peers);
        assert!(Arc::ptr_eq(&peers(&t0), &peers(&t1)));
        assert_eq!(snapshot(&c), forwarding0);
        assert_eq!(flags(&t1), flags(&t0));
        assert_eq!(
            fleet(&t1).0,
            [
                (ip("10.0.0.1"), true),
                (ip("10.0.0.2"), false),
                (ip("10.0.0.3"), true)
            ]
        );
        // The same as a full build of everything with that peer down.
        c.built.clear();
        assert!(c.rebuild());
        let full = c.tables().load_full();
        assert!(!Arc::ptr_eq(&t1.vips[0].table, &full.vips[0].table));
        assert_eq!(snapshot(&c), forwarding0);
        assert_eq!(flags(&full), flags(&t1));
        assert_eq!(fleet(&full), fleet(&t1));
        assert_eq!(format!("{:?}", full.matcher), format!("{:?}", t1.matcher));
        assert_eq!(full.own, t1.own);

        // No change, no swap; not a peer, or this load balancer: refused.
        let g = c.tables().load().generation;
        assert!(c.set_peer_up(ip("10.0.0.2"), false));
        assert!(!c.set_peer_up(ip("10.0.0.9"), false));
        assert!(!c.set_peer_up(ip("10.0.0.1"), false));
        assert_eq!(c.tables().load().generation, g);
        // Back up: as at the start.
        assert!(c.set_peer_up(ip("10.0.0.2"), true));
        let t2 = c.tables().load_full();
        assert!(Arc::ptr_eq(&full.vips[3].table, &t2.vips[3].table));
        assert_eq!(fleet(&t2), fleet(&t0));
        assert_eq!(flags(&t2), flags(&t0));
    }
}
