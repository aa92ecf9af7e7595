//! What packet threads read: an immutable snapshot of VIPs, their Maglev
//! tables and the backends, swapped in one atomic step by the control plane
//! ([`Control`]). A packet thread loads the snapshot once per batch, so no
//! packet ever sees half a configuration.
//!
//! Backend ids are stable for the life of the process: a backend keeps its
//! id across reloads (by name), and a removed backend's id stays reserved
//! and unhealthy. Connection-table entries hold ids, so they stay meaningful
//! across reloads and are reused only while their backend is healthy.

use std::collections::HashMap;
use std::sync::Arc;

use arc_swap::ArcSwap;
use maglev::Maglev;
use packet::gre::Outer;

use crate::config::{parse_mac, Config, ConfigError};
use crate::vip::VipMatcher;

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
}

/// A VIP in a snapshot.
#[derive(Debug)]
pub struct Vip {
    /// Name from the configuration.
    pub name: String,
    /// Its Maglev table over its healthy backends (slots index `slots`).
    pub table: Maglev,
    /// Backend id of each table index.
    pub slots: Vec<u32>,
    /// All its backends' ids (healthy or not).
    pub backends: Vec<u32>,
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
}

/// The control plane: owns the configuration, the backend registry and
/// health, builds snapshots aside and swaps them in.
pub struct Control {
    config: Config,
    ids: HashMap<String, u32>,
    registry: Vec<Backend>,
    health: HashMap<String, bool>,
    generation: u64,
    current: Arc<ArcSwap<Tables>>,
}

impl Control {
    /// Builds the first snapshot from a validated configuration.
    pub fn new(config: Config) -> Result<Self, ConfigError> {
        let mut c = Control {
            config: Config::default(),
            ids: HashMap::new(),
            registry: Vec::new(),
            health: HashMap::new(),
            generation: 0,
            current: Arc::new(ArcSwap::from_pointee(Tables {
                matcher: VipMatcher::default(),
                vips: Vec::new(),
                backends: Vec::new(),
                generation: 0,
            })),
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
    /// running one keeps serving.
    pub fn apply(&mut self, config: Config) -> Result<(), ConfigError> {
        config.validate("(config)")?;
        let tables = self.build(&config)?;
        self.config = config;
        self.current.store(Arc::new(tables));
        Ok(())
    }

    /// Marks a backend healthy or not (by name) and swaps in tables without
    /// (or with) it. Returns false for an unknown name.
    pub fn set_health(&mut self, name: &str, healthy: bool) -> bool {
        if !self.ids.contains_key(name) {
            return false;
        }
        self.health.insert(name.to_string(), healthy);
        let cfg = self.config.clone();
        match self.build(&cfg) {
            Ok(t) => {
                self.current.store(Arc::new(t));
                true
            }
            Err(_) => false, // the config was valid when applied
        }
    }

    fn build(&mut self, cfg: &Config) -> Result<Tables, ConfigError> {
        let err = |key: String, problem: String| ConfigError {
            file: "(config)".into(),
            key,
            problem,
        };
        let eth_src = cfg
            .encap
            .mac
            .as_deref()
            .and_then(parse_mac)
            .unwrap_or([2, 0, 0, 0, 0, 1]);
        let eth_dst = parse_mac(&cfg.encap.gateway_mac).unwrap_or_default();
        let src4 = cfg.encap.source.map(packet::flow::from_ip);
        let src6 = cfg.encap.source6.map(packet::flow::from_ip);
        // Registry: every backend named anywhere gets a stable id. Work on
        // copies so a failed build changes nothing.
        let mut known = self.ids.clone();
        let mut backends = self.registry.clone();
        for b in backends.iter_mut() {
            b.configured = false;
            b.healthy = false;
            b.accepting = false;
        }
        let mut vips = Vec::with_capacity(cfg.vips.len());
        for (i, v) in cfg.vips.iter().enumerate() {
            let members = cfg
                .flatten(&v.pool)
                .map_err(|c| err(format!("vips[{i}].pool"), format!("cycle: {c}")))?;
            let pool = cfg
                .pools
                .iter()
                .find(|p| p.name == v.pool)
                .map(|p| p.table_size)
                .unwrap_or(65_537);
            let mut ids = Vec::new();
            let mut hashing = Vec::new();
            let mut slots = Vec::new();
            for m in &members {
                let name = m.name.clone().unwrap_or_else(|| m.address.to_string());
                let addr = packet::flow::from_ip(m.address);
                let id = match known.get(&name) {
                    Some(&id) => id,
                    None => {
                        let id = backends.len() as u32;
                        known.insert(name.clone(), id);
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
                        });
                        id
                    }
                };
                let healthy = *self.health.get(&name).unwrap_or(&true);
                let src = if m.address.is_ipv4() { src4 } else { src6 };
                let b = &mut backends[id as usize];
                b.addr = addr;
                b.configured = true;
                b.healthy = healthy;
                // In any pool with a weight: a backend drained in one pool
                // but weighted in another still takes new connections.
                b.accepting |= healthy && m.weight > 0;
                b.outer = Outer {
                    eth_src,
                    eth_dst,
                    src: src.unwrap_or([0; 16]),
                    dst: addr,
                    ttl: cfg.encap.ttl,
                };
                ids.push(id);
                if healthy && m.weight > 0 {
                    hashing.push(maglev::Backend::weighted(name, m.weight));
                    slots.push(id);
                }
            }
            let mut table = Maglev::new(pool)
                .map_err(|e| err(format!("pools.{}.table_size", v.pool), e.to_string()))?;
            table
                .populate(&hashing)
                .map_err(|e| err(format!("pools.{}", v.pool), e.to_string()))?;
            vips.push(Vip {
                name: v.name.clone(),
                table,
                slots,
                backends: ids,
            });
        }
        self.ids = known;
        self.registry = backends.clone();
        self.generation += 1;
        Ok(Tables {
            matcher: VipMatcher::new(cfg),
            vips,
            backends,
            generation: self.generation,
        })
    }
}
