//! `[[pools]]`: backends, weights, drained backends and pools that include
//! pools ([`super::includes`] walks them). Flattening a pool into what its
//! table is built from ([`Config::flatten`]) is table work,
//! defined with the tables (`lb::tables`).

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use super::includes::{self, MAX_RESOLVED};
use super::{check_name, not_a_host, problem, Config, HealthConf, IncludeCycle, Problem};

/// The largest Maglev table: 16,777,213 slots, the largest prime below
/// 2^24 (64 MiB of entries). The paper uses 65,537 and names 655,373 for
/// larger pools; M above 100 times the backends keeps the imbalance near
/// 1%, so this serves 167,000 backends in one pool. What a configuration's
/// tables need together is checked against the machine's memory.
pub const MAX_TABLE_SIZE: u64 = 16_777_213;

/// The fewest Maglev slots per backend a VIP's pool may have: with `M`
/// slots over `N` equally weighted backends each gets `M/N` slots, give or
/// take one, so a backend's share is off by at most `N/M`: a tenth here.
/// The paper asks for `M` much larger than `N` (100 times keeps it near
/// 1%); `table_size = 2` or `3` for a few backends ignored their weights
/// and split the flows 2 to 1.
pub const MIN_SLOTS_PER_BACKEND: u64 = 10;

/// One backend of a pool.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BackendConf {
    /// Its address (the outer destination of encapsulated packets).
    pub address: IpAddr,
    /// Unique name; defaults to the address. Seeds its Maglev permutation.
    pub name: Option<String>,
    /// Relative weight; 0 drains it (or list it in its pool's `drained`,
    /// which keeps the weight to restore).
    #[serde(default = "one")]
    pub weight: u32,
    /// Its QUIC-LB server ID in hex (`[[quic_lb]]`): the octets a QUIC
    /// server writes into the connection IDs it issues, by which a `quic`
    /// VIP routes them to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quic_server_id: Option<String>,
}

impl BackendConf {
    /// Its name: `name`, else the address.
    pub fn display_name(&self) -> String {
        self.name
            .clone()
            .unwrap_or_else(|| self.address.to_string())
    }

    /// Whether `s` names it: its name, or its address (written any way
    /// that parses to it).
    pub fn is_named(&self, s: &str) -> bool {
        self.name.as_deref() == Some(s) || s.parse::<IpAddr>().is_ok_and(|a| a == self.address)
    }
}

fn one() -> u32 {
    1
}

/// `[[pools]]`.
///
/// ```toml
/// [[pools]]
/// name = "web"
/// table_size = 65537
/// backends = [{ address = "10.1.0.1" }, { address = "10.1.0.2", weight = 2 }]
/// include = ["web-extra"]  # pools may contain pools
/// drained = ["10.1.0.2"]   # takes no new connections, keeps its weight
///                          # (`fastpath lb drain|undrain BACKEND` edit this)
/// ```
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PoolConf {
    /// Unique name.
    pub name: String,
    /// Backends.
    #[serde(default)]
    pub backends: Vec<BackendConf>,
    /// Other pools whose backends belong to this one.
    #[serde(default)]
    pub include: Vec<String>,
    /// Maglev table size for VIPs served by this pool: a prime of at least
    /// [`MIN_SLOTS_PER_BACKEND`] slots per backend it resolves to.
    #[serde(default = "default_table_size")]
    pub table_size: u64,
    /// Health check for the pool's own backends (none: always healthy).
    pub health: Option<HealthConf>,
    /// Own backends (by name or address) that take no new connections:
    /// their weight counts as 0 while they keep the one written, restored
    /// when they leave this list (`fastpath lb drain|undrain`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub drained: Vec<String>,
}

impl PoolConf {
    /// Whether one of its own backends is drained (by `drained`).
    pub fn is_drained(&self, b: &BackendConf) -> bool {
        self.drained.iter().any(|d| b.is_named(d))
    }
}

fn default_table_size() -> u64 {
    u64::from(maglev::DEFAULT_TABLE_SIZE)
}

/// A backend's name as validation compares it: an address (the default
/// name) or another name.
#[derive(PartialEq, Eq, Hash)]
pub(super) enum BackendKey<'a> {
    Addr(IpAddr),
    Name(&'a str),
}

impl BackendKey<'_> {
    /// The key of a backend, without formatting the address that names
    /// most backends: a name that is an address written the way it
    /// prints is that address.
    pub(super) fn of(b: &BackendConf) -> BackendKey<'_> {
        match &b.name {
            None => BackendKey::Addr(b.address),
            Some(n) => match n.parse::<IpAddr>() {
                Ok(a) if a.to_string() == *n => BackendKey::Addr(a),
                _ => BackendKey::Name(n),
            },
        }
    }
}

impl Config {
    /// `[[pools]]`: unique names, prime table sizes, unique backends with
    /// host addresses, outer sources for their families, drained lists
    /// that name their own backends, and includes that exist, without
    /// cycles, at most [`MAX_INCLUDE_DEPTH`](super::MAX_INCLUDE_DEPTH)
    /// deep, reaching each address under one name. Returns how many
    /// backends each pool resolves to (own and included), by position.
    pub(super) fn check_pools(&self) -> Result<Vec<usize>, Problem> {
        let e = &self.encap;
        // Pools: unique names, valid table sizes, known includes, unique
        // backend names within a pool, outer sources for their families.
        let mut pools: HashMap<&str, usize> = HashMap::with_capacity(self.pools.len());
        for (i, p) in self.pools.iter().enumerate() {
            check_name(|| format!("pools[{i}].name"), &p.name)?;
            if pools.insert(p.name.as_str(), i).is_some() {
                return problem(
                    format!("pools[{i}].name"),
                    format!("{:?} is defined twice", p.name),
                );
            }
            if let Err(err) = maglev::check_table_size(p.table_size) {
                return problem(format!("pools[{i}].table_size"), err.to_string());
            }
            if p.table_size > MAX_TABLE_SIZE {
                return problem(
                    format!("pools[{i}].table_size"),
                    format!(
                        "{} is larger than {MAX_TABLE_SIZE}, the largest table allowed \
                         (the paper uses 65537)",
                        p.table_size
                    ),
                );
            }
            let name_of = BackendConf::display_name;
            let mut names = HashSet::with_capacity(p.backends.len());
            let mut addresses: HashMap<IpAddr, usize> = HashMap::with_capacity(p.backends.len());
            for (j, b) in p.backends.iter().enumerate() {
                if let Some(n) = &b.name {
                    check_name(|| format!("pools[{i}].backends[{j}].name"), n)?;
                }
                if let Some(why) = not_a_host(b.address) {
                    return problem(
                        format!("pools[{i}].backends[{j}].address"),
                        format!("{} is {why}, not a backend's address", b.address),
                    );
                }
                if !names.insert(BackendKey::of(b)) {
                    return problem(
                        format!("pools[{i}].backends[{j}]"),
                        format!("backend {:?} appears twice", name_of(b)),
                    );
                }
                // The same machine under two names would get two shares of
                // the table: a silent double weight.
                if let Some(k) = addresses.insert(b.address, j) {
                    let (name, other) = (name_of(b), name_of(&p.backends[k]));
                    return problem(
                        format!("pools[{i}].backends[{j}]"),
                        format!(
                            "backend {name:?} has the address {} of backend {other:?} \
                             (pools[{i}].backends[{k}]); list a machine once and give it a weight",
                            b.address
                        ),
                    );
                }
                if b.address.is_ipv4() && e.source.is_none() {
                    return problem(
                        "encap.source".into(),
                        format!(
                            "pool {:?} has IPv4 backends, so an IPv4 outer source is needed",
                            p.name
                        ),
                    );
                }
                if b.address.is_ipv6() && e.source6.is_none() {
                    return problem(
                        "encap.source6".into(),
                        format!(
                            "pool {:?} has IPv6 backends, so an IPv6 outer source is needed",
                            p.name
                        ),
                    );
                }
            }
            // Each entry names own backends (by name, or by address, in
            // which case it names the backend at that address), and no two
            // entries drain the same backend: one pass over the backends
            // and one over the entries.
            if !p.drained.is_empty() {
                let mut by_name: HashMap<&str, usize> = HashMap::with_capacity(p.backends.len());
                for (j, b) in p.backends.iter().enumerate() {
                    if let Some(n) = &b.name {
                        by_name.insert(n.as_str(), j);
                    }
                }
                let mut drained: HashSet<usize> = HashSet::with_capacity(p.drained.len());
                for (j, d) in p.drained.iter().enumerate() {
                    let named = by_name.get(d.as_str()).copied();
                    let at = d
                        .parse::<IpAddr>()
                        .ok()
                        .and_then(|a| addresses.get(&a).copied());
                    if named.is_none() && at.is_none() {
                        return problem(
                            format!("pools[{i}].drained[{j}]"),
                            format!(
                                "{d:?} is not one of pool {:?}'s own backends (by name or address)",
                                p.name
                            ),
                        );
                    }
                    let these = [named, at].into_iter().flatten();
                    if these.clone().any(|b| drained.contains(&b)) {
                        return problem(
                            format!("pools[{i}].drained[{j}]"),
                            format!("{d:?} drains a backend listed earlier in drained"),
                        );
                    }
                    drained.extend(these);
                }
            }
        }
        for (i, p) in self.pools.iter().enumerate() {
            for (j, inc) in p.include.iter().enumerate() {
                if !pools.contains_key(inc.as_str()) {
                    return problem(
                        format!("pools[{i}].include[{j}]"),
                        format!("no pool named {inc:?}"),
                    );
                }
            }
        }
        includes::check_graph(&self.pools, &pools)?;
        let index = self.pool_index();
        let mut resolved: Vec<usize> = self.pools.iter().map(|p| p.backends.len()).collect();
        let mut budget = MAX_RESOLVED;
        for (i, p) in self.pools.iter().enumerate() {
            if p.include.is_empty() {
                continue; // its own backends, checked above
            }
            // Included pools may share a backend (same name: counted once),
            // but not an address under another name.
            let mut addresses: rustc_hash::FxHashMap<IpAddr, &BackendConf> = Default::default();
            let mut twice = None;
            let mut count = 0usize;
            let walked = includes::walk(&index, &p.name, budget, &mut |b, _| {
                count += 1;
                if let Some(other) = addresses.insert(b.address, b) {
                    twice.get_or_insert((other, b));
                }
            });
            match walked {
                Ok(spent) => budget -= spent,
                Err(includes::WalkError::Cycle(c)) => {
                    return problem(format!("pools[{i}].include"), c.to_string())
                }
                Err(includes::WalkError::Budget) => {
                    return problem(
                        format!("pools[{i}].include"),
                        format!(
                            "resolving the includes of this pool and those before it reaches \
                             more than {MAX_RESOLVED} pools and backends in all; share fewer \
                             pools through include"
                        ),
                    )
                }
            }
            if let Some((other, b)) = twice {
                return problem(
                    format!("pools[{i}].include"),
                    format!(
                        "pool {:?} reaches the address {} twice, as backends {:?} and \
                         {:?} (through its includes); list a machine once and give it a weight",
                        p.name,
                        b.address,
                        other.display_name(),
                        b.display_name()
                    ),
                );
            }
            resolved[i] = count;
        }
        Ok(resolved)
    }

    /// The VIP address a tunnel health check of `pool`'s backends goes to:
    /// the first VIP with an address whose pool is `pool` or includes it
    /// (one walk over the VIPs and pools: [`Config::tunnel_vips`]).
    pub fn tunnel_vip(&self, pool: &str) -> Option<IpAddr> {
        self.tunnel_vips().get(pool).copied()
    }

    /// The VIP address a tunnel health check of each pool goes to (as
    /// [`Config::tunnel_vip`] for every pool at once, in time linear in the
    /// VIPs, pools and includes): pools no VIP with an address reaches are
    /// absent.
    pub fn tunnel_vips(&self) -> HashMap<&str, IpAddr> {
        let index = self.pool_index();
        let mut out: HashMap<&str, IpAddr> = HashMap::new();
        let mut stack = Vec::new();
        // VIPs in order, so the first VIP reaching a pool wins. A pool
        // already assigned has all the pools it includes assigned too (it
        // was walked), so a walk stops there: each pool is walked once.
        for v in &self.vips {
            let Some(addr) = v.address else { continue };
            stack.push(v.pool.as_str());
            while let Some(name) = stack.pop() {
                let Some(p) = index.get(name) else { continue };
                if out.contains_key(p.name.as_str()) {
                    continue;
                }
                out.insert(p.name.as_str(), addr);
                stack.extend(p.include.iter().map(String::as_str));
            }
        }
        out
    }

    /// The pools by name (the first of a name: validation rejects
    /// duplicates), for [`Config::flatten_in`] and [`Config::pool_members`].
    pub fn pool_index(&self) -> HashMap<&str, &PoolConf> {
        let mut index = HashMap::with_capacity(self.pools.len());
        for p in &self.pools {
            index.entry(p.name.as_str()).or_insert(p);
        }
        index
    }

    /// The backends of a pool with its included pools, each once (first
    /// occurrence wins, depth first in include order), with the weight
    /// written in the file and whether the pool that lists it drains it;
    /// or the cycle that prevents it. [`Config::flatten_in`] is this with
    /// drained weights as 0. Each pool is entered once, with no recursion:
    /// linear in the pools, includes and backends it reaches.
    pub fn members_as_written(
        &self,
        index: &HashMap<&str, &PoolConf>,
        pool: &str,
    ) -> Result<Vec<(BackendConf, bool)>, IncludeCycle> {
        let mut out = Vec::new();
        includes::walk(index, pool, usize::MAX, &mut |b, drained| {
            out.push((b.clone(), drained));
        })
        .map_err(|e| match e {
            includes::WalkError::Cycle(c) => c,
            // Cannot happen: each pool is entered once, so the walk spends
            // at most the pools and backends there are.
            includes::WalkError::Budget => IncludeCycle(format!("{pool} (too large to resolve)")),
        })?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use crate::config::tests::*;
    use crate::config::*;
    use std::collections::HashSet;
    use std::net::IpAddr;

    #[test]
    fn a_name_that_is_another_backends_address_is_taken() {
        let pool = |list: &str| {
            format!(
                "[encap]\nsource = \"10.0.0.1\"\n[[pools]]\nname = \"web\"\nbackends = [{list}]\n\
                 [[vips]]\nname = \"v\"\naddress = \"198.18.0.1\"\nprotocol = \"tcp\"\npool = \"web\"\n"
            )
        };
        let e = err(&pool(
            "{ address = \"10.1.0.9\" }, { address = \"10.1.0.2\", name = \"10.1.0.9\" }",
        ));
        assert_eq!(e.key, "pools[0].backends[1]");
        assert!(
            e.problem.contains("\"10.1.0.9\" appears twice"),
            "{}",
            e.problem
        );
        // Written another way it is another name.
        Config::parse(
            &pool("{ address = \"fd00::9\" }, { address = \"fd00::2\", name = \"fd00:0::9\" }")
                .replace("[encap]\n", "[encap]\nsource6 = \"fd00::1\"\n"),
            "t",
        )
        .unwrap();
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

        /// `tunnel_vips` (one walk) agrees with the definition (the first
        /// VIP with an address whose pool reaches the pool, by a search
        /// of its own per VIP) on any include graph, cycles and unknown
        /// pools included.
        #[test]
        fn tunnel_vips_agree_with_tunnel_vip(
            includes in proptest::collection::vec(proptest::collection::vec(0usize..7, 0..3), 6),
            vips in proptest::collection::vec((0usize..7, proptest::prelude::any::<bool>()), 0..6),
        ) {
            let cfg = Config {
                pools: includes
                    .iter()
                    .enumerate()
                    .map(|(i, inc)| PoolConf {
                        name: format!("p{i}"),
                        backends: Vec::new(),
                        // p6 does not exist.
                        include: inc.iter().map(|j| format!("p{j}")).collect(),
                        table_size: 251,
                        health: None,
                        drained: Vec::new(),
                    })
                    .collect(),
                vips: vips
                    .iter()
                    .enumerate()
                    .map(|(i, &(pool, addressed))| VipConf {
                        name: format!("v{i}"),
                        address: addressed.then(|| IpAddr::from([198, 18, 0, i as u8 + 1])),
                        prefix_group: None,
                        suffix: None,
                        port: None,
                        protocol: Protocol::Tcp,
                        pool: format!("p{pool}"),
                        quic: false,
                    })
                    .collect(),
                ..Config::default()
            };
            let all = cfg.tunnel_vips();
            let reaches = |from: &str, target: &str| {
                let mut todo = vec![from.to_string()];
                let mut seen = HashSet::new();
                while let Some(p) = todo.pop() {
                    if p == target {
                        return true;
                    }
                    if seen.insert(p.clone()) {
                        for q in cfg.pools.iter().filter(|q| q.name == p) {
                            todo.extend(q.include.iter().cloned());
                        }
                    }
                }
                false
            };
            for p in &cfg.pools {
                let want = cfg
                    .vips
                    .iter()
                    .filter(|v| reaches(&v.pool, &p.name))
                    .find_map(|v| v.address);
                proptest::prop_assert_eq!(all.get(p.name.as_str()).copied(), want);
                proptest::prop_assert_eq!(cfg.tunnel_vip(&p.name), want);
            }
        }
    }
}
