//! `[[vips]]` and `[[prefix_groups]]`: the services, by address or by
//! prefix group and suffix (the paper's section 4.2), and the pools they
//! are served by.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use super::{
    check_name, check_prefix, not_a_host, overlapping, parse_prefix, problem, Config, Problem,
    MAX_TABLE_SIZE, MIN_SLOTS_PER_BACKEND, NOT_UNICAST,
};

/// Transport protocol of a VIP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
}

impl Protocol {
    /// The IP protocol number.
    pub fn number(self) -> u8 {
        match self {
            Protocol::Tcp => packet::proto::TCP,
            Protocol::Udp => packet::proto::UDP,
        }
    }
}

/// `[[vips]]`: an address or a prefix-group suffix, a port (or any), a
/// protocol and a pool.
///
/// ```toml
/// [[vips]]
/// name = "http"
/// address = "192.0.2.80"
/// port = 80                # omit for an any-port VIP
/// protocol = "tcp"
/// pool = "web"
///
/// [[prefix_groups]]        # paper section 4.2
/// name = "class-a"
/// prefixes = ["74.125.0.0/16", "173.194.0.0/16"]
/// cluster_prefix_len = 24  # a cluster's prefix length in this class
///
/// [[vips]]
/// name = "svc1"
/// prefix_group = "class-a"
/// suffix = "0.0.0.1"       # host part under the cluster prefix
/// port = 443
/// protocol = "tcp"
/// pool = "web"
/// ```
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct VipConf {
    /// Unique name.
    pub name: String,
    /// The VIP's address (or use `prefix_group` and `suffix`).
    pub address: Option<IpAddr>,
    /// Prefix group for prefix/suffix matching.
    pub prefix_group: Option<String>,
    /// Host part under the group's cluster prefix.
    pub suffix: Option<IpAddr>,
    /// Port; omitted means any port.
    pub port: Option<u16>,
    /// Protocol.
    pub protocol: Protocol,
    /// Backend pool.
    pub pool: String,
    /// UDP read as QUIC: routed by the destination connection ID's
    /// QUIC-LB server ID (`[[quic_lb]]`), the 5-tuple only for what does
    /// not route.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub quic: bool,
}

/// `[[prefix_groups]]`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PrefixGroupConf {
    /// Unique name.
    pub name: String,
    /// Prefixes in CIDR form.
    pub prefixes: Vec<String>,
    /// Prefix length of one cluster of this class.
    pub cluster_prefix_len: u8,
}

/// The bits of a 128-bit key-form address (IPv4-mapped for IPv4) under a
/// prefix of `len` bits, as VIP matching (`lb::vip`) masks them.
pub(crate) fn key_mask(len: u8) -> u128 {
    if len == 0 {
        0
    } else {
        u128::MAX << (128 - u32::from(len))
    }
}

/// A prefix in the key form VIP matching uses: the network with its host
/// bits cleared, and the length in 128 bits (96 more for IPv4, whose
/// addresses are IPv4-mapped).
pub(crate) fn prefix_key(a: IpAddr, len: u8) -> (u128, u8) {
    let l128 = if a.is_ipv4() { 96 + len } else { len };
    (
        u128::from_be_bytes(packet::flow::from_ip(a)) & key_mask(l128),
        l128,
    )
}

/// The IPv4 address an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`)
/// stands for.
pub(super) fn mapped(a: IpAddr) -> Option<std::net::Ipv4Addr> {
    match a {
        IpAddr::V6(v6) => v6.to_ipv4_mapped(),
        IpAddr::V4(_) => None,
    }
}

impl Config {
    /// How many distinct prefixes the prefix groups list, in key form: the
    /// prefixes the XDP program steers (the matcher's
    /// `VipMatcher::prefixes`, a prefix listed twice counted
    /// once). Validation counts them before the groups are checked, so an
    /// unparsable prefix is skipped here as the matcher skips it.
    pub(crate) fn steered_prefixes(&self) -> usize {
        let mut seen = rustc_hash::FxHashSet::default();
        for g in &self.prefix_groups {
            for (a, l) in g.prefixes.iter().filter_map(|p| parse_prefix(p)) {
                seen.insert(prefix_key(a, l));
            }
        }
        seen.len()
    }

    /// `[[prefix_groups]]`: unique names, at least one prefix, prefixes of
    /// one family that fit the cluster prefix length.
    pub(super) fn check_prefix_groups(&self) -> Result<(), Problem> {
        let mut groups = HashMap::new();
        for (i, g) in self.prefix_groups.iter().enumerate() {
            check_name(|| format!("prefix_groups[{i}].name"), &g.name)?;
            if groups.insert(g.name.as_str(), i).is_some() {
                return problem(
                    format!("prefix_groups[{i}].name"),
                    format!("{:?} is defined twice", g.name),
                );
            }
            if g.prefixes.is_empty() {
                return problem(
                    format!("prefix_groups[{i}].prefixes"),
                    "needs at least one prefix, like \"74.125.0.0/16\"".into(),
                );
            }
            let mut family = None;
            for (j, p) in g.prefixes.iter().enumerate() {
                let key = || format!("prefix_groups[{i}].prefixes[{j}]");
                let (a, l) = check_prefix(key, p, "74.125.0.0/16")?;
                // Every address of a group's clusters is a VIP: a prefix
                // over broadcast, multicast or "this network" (0.0.0.0/0
                // covers them all) would serve what no client sends to.
                if let Some(what) = overlapping((a, l), &NOT_UNICAST) {
                    return problem(
                        key(),
                        format!(
                            "{p:?} includes {what}, which no client reaches a service at: give \
                             the unicast prefixes routed to this load balancer, like \
                             \"74.125.0.0/16\""
                        ),
                    );
                }
                if *family.get_or_insert(a.is_ipv4()) != a.is_ipv4() {
                    return problem(
                        key(),
                        format!("{p:?} is not of the family of the group's first prefix; a group's clusters are all IPv4 or all IPv6"),
                    );
                }
                if l > g.cluster_prefix_len
                    || (a.is_ipv4() && g.cluster_prefix_len > 32)
                    || g.cluster_prefix_len > 128
                {
                    return problem(
                        format!("prefix_groups[{i}].cluster_prefix_len"),
                        format!("{} must be at least every prefix's length ({l}) and fit the address family", g.cluster_prefix_len),
                    );
                }
            }
        }
        Ok(())
    }

    /// `[[vips]]`: unique names and keys, host addresses, known pools and
    /// prefix groups (a suffix of the group's family), tables large enough
    /// for their pools. `resolved` is each pool's backend count, by
    /// position ([`Config::check_pools`]).
    pub(super) fn check_vips(&self, resolved: &[usize]) -> Result<(), Problem> {
        let mut pools: HashMap<&str, usize> = HashMap::with_capacity(self.pools.len());
        for (i, p) in self.pools.iter().enumerate() {
            pools.entry(p.name.as_str()).or_insert(i);
        }
        let groups: HashMap<&str, &PrefixGroupConf> = self
            .prefix_groups
            .iter()
            .map(|g| (g.name.as_str(), g))
            .collect();
        let mut vip_names = HashSet::new();
        let mut vip_keys = HashSet::new();
        for (i, v) in self.vips.iter().enumerate() {
            check_name(|| format!("vips[{i}].name"), &v.name)?;
            if !vip_names.insert(v.name.as_str()) {
                return problem(
                    format!("vips[{i}].name"),
                    format!("{:?} is defined twice", v.name),
                );
            }
            let Some(&pool) = pools.get(v.pool.as_str()) else {
                return problem(
                    format!("vips[{i}].pool"),
                    format!("no pool named {:?}", v.pool),
                );
            };
            let key = match (&v.address, &v.prefix_group, &v.suffix) {
                (Some(a), None, None) => {
                    if let Some(why) = not_a_host(*a) {
                        return problem(
                            format!("vips[{i}].address"),
                            format!("{a} is {why}, not an address clients can reach a service at"),
                        );
                    }
                    // The matcher keys IPv4 addresses in their mapped form,
                    // so `::ffff:192.0.2.80` is 192.0.2.80 to it (a second
                    // VIP so written duplicates the first), while BIRD would
                    // get an IPv6 route no client reaches.
                    if let Some(v4) = mapped(*a) {
                        return problem(
                            format!("vips[{i}].address"),
                            format!(
                                "{a} is the IPv4 address {v4} written in IPv6's IPv4-mapped form: \
                                 write address = \"{v4}\""
                            ),
                        );
                    }
                    format!("{a}")
                }
                (None, Some(g), Some(s)) => {
                    let Some(group) = groups.get(g.as_str()) else {
                        return problem(
                            format!("vips[{i}].prefix_group"),
                            format!("no prefix group named {g:?}"),
                        );
                    };
                    let v4 = group
                        .prefixes
                        .first()
                        .and_then(|p| parse_prefix(p))
                        .is_some_and(|(a, _)| a.is_ipv4());
                    if s.is_ipv4() != v4 {
                        return problem(
                            format!("vips[{i}].suffix"),
                            format!(
                                "{s} is not of the family of prefix group {g:?} ({}); \
                                 a suffix completes the group's prefixes",
                                if v4 { "IPv4" } else { "IPv6" }
                            ),
                        );
                    }
                    format!("{g}/{s}")
                }
                _ => {
                    return problem(
                        format!("vips[{i}]"),
                        "give either `address`, or both `prefix_group` and `suffix`".into(),
                    )
                }
            };
            let (members, size) = (resolved[pool], self.pools[pool].table_size);
            let least = (members as u64).saturating_mul(MIN_SLOTS_PER_BACKEND);
            if size < least {
                let suggest = if least > MAX_TABLE_SIZE {
                    format!("more than the largest table ({MAX_TABLE_SIZE}): split the pool")
                } else {
                    let prime = (least..=MAX_TABLE_SIZE)
                        .find(|&m| maglev::is_prime(m))
                        .unwrap_or(MAX_TABLE_SIZE);
                    format!("give a prime of at least {prime}, or leave table_size out for 65537")
                };
                return problem(
                    format!("pools[{pool}].table_size"),
                    format!(
                        "{size} slots are too few for pool {:?}'s {members} backends (VIP {:?} \
                         uses it): Maglev spreads flows by weight only over many slots per \
                         backend, at least {MIN_SLOTS_PER_BACKEND} (a backend's share is then \
                         off by at most a tenth; 100 keeps it within 1%); {suggest}",
                        v.pool, v.name,
                    ),
                );
            }
            if !vip_keys.insert((key.clone(), v.port, v.protocol)) {
                return problem(
                    format!("vips[{i}]"),
                    format!(
                        "another VIP already serves {key} port {:?} {:?}",
                        v.port, v.protocol
                    ),
                );
            }
        }
        Ok(())
    }
}

impl Config {
    /// Addresses that must differ and were given the same: a VIP at this
    /// load balancer's outer source or at a backend (packets encapsulated
    /// to the backend would arrive at the VIP again), a `[fleet]` peer at
    /// a VIP or a backend (fragments redirected to it would go to the
    /// service, not to a load balancer). Addresses are compared as the
    /// matcher keys them (IPv4-mapped IPv6 as IPv4). One pass over the
    /// backends, after the VIPs were checked.
    pub(super) fn check_address_collisions(&self) -> Result<(), Problem> {
        let mut vips: HashMap<IpAddr, usize> = HashMap::with_capacity(self.vips.len());
        for (i, v) in self.vips.iter().enumerate() {
            if let Some(a) = v.address {
                vips.entry(a.to_canonical()).or_insert(i);
            }
        }
        let peers: HashMap<IpAddr, usize> = self
            .fleet
            .iter()
            .flat_map(|f| f.peers.iter().enumerate())
            .map(|(k, a)| (a.to_canonical(), k))
            .collect();
        for (k, a) in self.fleet.iter().flat_map(|f| f.peers.iter().enumerate()) {
            if let Some(&i) = vips.get(&a.to_canonical()) {
                return problem(
                    format!("fleet.peers[{k}]"),
                    format!(
                        "{a} is the address of VIP {:?} (vips[{i}]), not a load balancer's: \
                         list each load balancer's own [encap] source",
                        self.vips[i].name
                    ),
                );
            }
        }
        for (key, source) in [
            ("encap.source", self.encap.source),
            ("encap.source6", self.encap.source6),
        ] {
            let Some(s) = source else { continue };
            if let Some(&i) = vips.get(&s.to_canonical()) {
                return problem(
                    format!("vips[{i}].address"),
                    format!(
                        "{s} is {key}, this load balancer's own address (the outer source \
                         backends answer): give the VIP an address of its own"
                    ),
                );
            }
        }
        if vips.is_empty() && peers.is_empty() {
            return Ok(());
        }
        for (p, pool) in self.pools.iter().enumerate() {
            for (j, b) in pool.backends.iter().enumerate() {
                let a = b.address.to_canonical();
                if let Some(&i) = vips.get(&a) {
                    return problem(
                        format!("vips[{i}].address"),
                        format!(
                            "{} is the address of backend {:?} (pools[{p}].backends[{j}]): \
                             packets encapsulated to it would arrive at the VIP again; give \
                             the VIP an address of its own",
                            b.address,
                            b.display_name()
                        ),
                    );
                }
                if let Some(&k) = peers.get(&a) {
                    return problem(
                        format!("fleet.peers[{k}]"),
                        format!(
                            "{} is the address of backend {:?} (pools[{p}].backends[{j}]), not \
                             a load balancer's: list each load balancer's own [encap] source",
                            b.address,
                            b.display_name()
                        ),
                    );
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::config::tests::*;
    use crate::config::*;

    #[test]
    fn prefix_groups_validate() {
        let g = format!(
            "{GOOD}\n[[prefix_groups]]\nname = \"a\"\nprefixes = [\"74.125.0.0/16\"]\ncluster_prefix_len = 24\n[[vips]]\nname = \"s\"\nprefix_group = \"a\"\nsuffix = \"0.0.0.1\"\nprotocol = \"udp\"\npool = \"web\"\n"
        );
        Config::parse(&g, "t").unwrap();
        assert_eq!(
            err(&g.replace("cluster_prefix_len = 24", "cluster_prefix_len = 8")).key,
            "prefix_groups[0].cluster_prefix_len"
        );
        assert_eq!(
            err(&g.replace("74.125.0.0/16", "74.125.0.0")).key,
            "prefix_groups[0].prefixes[0]"
        );
        assert_eq!(
            err(&g.replace("prefix_group = \"a\"", "prefix_group = \"b\"")).key,
            "vips[1].prefix_group"
        );
        assert_eq!(err(&g.replace("suffix = \"0.0.0.1\"\n", "")).key, "vips[1]");
    }
}
