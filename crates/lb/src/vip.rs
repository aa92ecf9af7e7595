//! VIP matching: exact <address, port, protocol>, then any-port VIPs, then
//! the prefix/suffix matching of the paper's section 4.2.
//!
//! Prefix/suffix: a prefix group holds the (large) prefixes a class of
//! clusters is allocated from, and the prefix length of one cluster in that
//! class. A destination first goes through longest-prefix matching over all
//! groups, which picks the class; its host part under the class's cluster
//! prefix length is the suffix, matched exactly against the VIPs configured
//! for that group. (The paper's "longest suffix matching" reduces to this
//! because one class has one cluster prefix length.) So a load balancer
//! serves `74.125.137.1` and `74.125.200.1` with one VIP `<class-a, .1>`,
//! including clusters it has never heard of.

use rustc_hash::{FxHashMap, FxHashSet};

use crate::config::{key_mask as mask, parse_prefix, prefix_key, Config};

/// Marker for "any port" in keys.
const ANY_PORT: u32 = 1 << 16;

/// Up to this many exact VIPs are matched by comparing each, not by
/// hashing.
const FEW: usize = 8;

#[derive(Debug, Clone)]
struct Group {
    /// (network, length in 128-bit space)
    prefixes: Vec<(u128, u8)>,
    cluster_len: u8,
}

/// The compiled matcher. Built once per configuration, read by every packet
/// thread.
#[derive(Debug, Clone, Default)]
pub struct VipMatcher {
    exact: FxHashMap<(u128, u32, u8), u32>,
    /// The exact VIPs again, as a list, when there are at most [`FEW`]:
    /// comparing a few keys costs less than hashing one (a packet hashed
    /// its 19-byte key twice, found and any-port, before).
    few: Option<Vec<(u128, u32, u8, u32)>>,
    addrs: FxHashSet<u128>,
    groups: Vec<Group>,
    suffix: FxHashMap<(u16, u128, u32, u8), u32>,
}

fn key_addr(a: std::net::IpAddr) -> u128 {
    u128::from_be_bytes(packet::flow::from_ip(a))
}

impl VipMatcher {
    /// Compiles the VIPs of a validated configuration; VIP `i` of the config
    /// matches as index `i`.
    pub fn new(cfg: &Config) -> Self {
        let mut m = VipMatcher::default();
        for g in &cfg.prefix_groups {
            let mut prefixes = Vec::new();
            let mut v4 = true;
            for p in &g.prefixes {
                if let Some((a, l)) = parse_prefix(p) {
                    v4 = a.is_ipv4();
                    prefixes.push(prefix_key(a, l));
                }
            }
            let cluster_len = if v4 {
                96 + g.cluster_prefix_len
            } else {
                g.cluster_prefix_len
            };
            m.groups.push(Group {
                prefixes,
                cluster_len,
            });
        }
        for (i, v) in cfg.vips.iter().enumerate() {
            let port = v.port.map_or(ANY_PORT, u32::from);
            let proto = v.protocol.number();
            if let Some(a) = v.address {
                m.exact.insert((key_addr(a), port, proto), i as u32);
                m.addrs.insert(key_addr(a));
            } else if let (Some(g), Some(s)) = (&v.prefix_group, v.suffix) {
                if let Some(gi) = cfg.prefix_groups.iter().position(|x| &x.name == g) {
                    let host = !mask(m.groups[gi].cluster_len);
                    m.suffix
                        .insert((gi as u16, key_addr(s) & host, port, proto), i as u32);
                }
            }
        }
        m.few = (m.exact.len() <= FEW).then(|| {
            m.exact
                .iter()
                .map(|(&(a, port, proto), &i)| (a, port, proto, i))
                .collect()
        });
        m
    }

    /// The exactly matched IPv4 VIPs: address, port (`None`: any port),
    /// protocol and VIP index (what the XDP fast path matches, with
    /// [`VipMatcher::exact_v6`]; prefix-group VIPs stay in user space).
    pub fn exact_v4(&self) -> impl Iterator<Item = ([u8; 4], Option<u16>, u8, u32)> + '_ {
        self.exact.iter().filter_map(|(&(a, port, proto), &i)| {
            let v4 = packet::flow::unmapped(&a.to_be_bytes())?;
            let port = u16::try_from(port).ok();
            Some((v4, port, proto, i))
        })
    }

    /// The exactly matched IPv6 VIPs: address, port (`None`: any port),
    /// protocol and VIP index, as [`VipMatcher::exact_v4`].
    pub fn exact_v6(&self) -> impl Iterator<Item = ([u8; 16], Option<u16>, u8, u32)> + '_ {
        self.exact.iter().filter_map(|(&(a, port, proto), &i)| {
            let a = a.to_be_bytes();
            if packet::flow::unmapped(&a).is_some() {
                return None;
            }
            let port = u16::try_from(port).ok();
            Some((a, port, proto, i))
        })
    }

    /// The prefix groups' prefixes, as [`VipMatcher::lookup`] matches them:
    /// network (key form, as a number), length (in the 128 bits of key
    /// form: 96 more for IPv4), the group's index, and the host bits under
    /// the group's cluster prefix length (whose address bits are the
    /// suffix). A prefix listed by several groups is given once, for the
    /// first of them, which is the one the longest-prefix match picks.
    pub fn prefixes(&self) -> Vec<(u128, u8, u16, u128)> {
        let mut seen = FxHashSet::default();
        let mut out = Vec::new();
        for (gi, g) in self.groups.iter().enumerate() {
            for &(net, len) in &g.prefixes {
                if seen.insert((net, len)) {
                    out.push((net, len, gi as u16, !mask(g.cluster_len)));
                }
            }
        }
        out
    }

    /// The prefix-group VIPs: group index, suffix (key form, as a number),
    /// port (`None`: any port), protocol and VIP index.
    pub fn suffixes(&self) -> impl Iterator<Item = (u16, u128, Option<u16>, u8, u32)> + '_ {
        self.suffix
            .iter()
            .map(|(&(g, suffix, port, proto), &i)| (g, suffix, u16::try_from(port).ok(), proto, i))
    }

    /// The VIP a packet to `dst:port` over `proto` is for, if any.
    #[inline]
    pub fn lookup(&self, dst: &[u8; 16], port: u16, proto: u8) -> Option<u32> {
        let a = u128::from_be_bytes(*dst);
        if let Some(few) = &self.few {
            // The VIP of this port, else the one of any port.
            let mut any = None;
            for &(va, vport, vproto, i) in few {
                if va == a && vproto == proto {
                    if vport == u32::from(port) {
                        return Some(i);
                    }
                    if vport == ANY_PORT {
                        any = Some(i);
                    }
                }
            }
            if any.is_some() {
                return any;
            }
        } else {
            if let Some(&v) = self.exact.get(&(a, u32::from(port), proto)) {
                return Some(v);
            }
            if let Some(&v) = self.exact.get(&(a, ANY_PORT, proto)) {
                return Some(v);
            }
        }
        if self.groups.is_empty() {
            return None;
        }
        let gi = self.longest_prefix(a)?;
        let suffix = a & !mask(self.groups[gi].cluster_len);
        let g = gi as u16;
        self.suffix
            .get(&(g, suffix, u32::from(port), proto))
            .or_else(|| self.suffix.get(&(g, suffix, ANY_PORT, proto)))
            .copied()
    }

    fn longest_prefix(&self, a: u128) -> Option<usize> {
        let mut best: Option<(usize, u8)> = None;
        for (gi, g) in self.groups.iter().enumerate() {
            for &(net, len) in &g.prefixes {
                if a & mask(len) == net && best.is_none_or(|(_, l)| len > l) {
                    best = Some((gi, len));
                }
            }
        }
        best.map(|(gi, _)| gi)
    }

    /// Whether `src` is the address of a VIP configured by address (a
    /// source no client may have: [`crate::counters::DropReason::SourceIsVip`]).
    /// Prefix groups' ranges are not VIP sources: they hold other
    /// clusters' machines too.
    #[inline]
    pub fn is_vip_source(&self, src: &[u8; 16]) -> bool {
        self.addrs.contains(&u128::from_be_bytes(*src))
    }

    /// The addresses of the VIPs configured by address, in key form
    /// (what [`VipMatcher::is_vip_source`] looks for), each once.
    pub fn addresses(&self) -> impl Iterator<Item = [u8; 16]> + '_ {
        self.addrs.iter().map(|a| a.to_be_bytes())
    }

    /// Whether `dst` could be a VIP address (for non-first fragments, which
    /// carry no port): a configured address, or inside a prefix group.
    pub fn is_vip_address(&self, dst: &[u8; 16]) -> bool {
        let a = u128::from_be_bytes(*dst);
        self.addrs.contains(&a) || self.longest_prefix(a).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use packet::flow::from_ip;
    use proptest::prelude::*;

    proptest! {
        /// A matcher of a few exact VIPs (compared one by one) answers
        /// every packet as the hashed one does: the port's VIP first, then
        /// the any-port VIP of the address, else nothing.
        #[test]
        fn few_vips_match_as_the_hashed_ones(
            vips in prop::collection::btree_map(
                (0u128..4, prop::option::of(0u16..4), prop::sample::select(vec![6u8, 17])),
                any::<u16>(),
                0..=FEW,
            ),
            probes in prop::collection::vec((0u128..5, 0u16..5, prop::sample::select(vec![6u8, 17, 1])), 1..64),
        ) {
            let mut hashed = VipMatcher::default();
            for (i, (&(a, port, proto), _)) in vips.iter().enumerate() {
                hashed.exact.insert((a, port.map_or(ANY_PORT, u32::from), proto), i as u32);
            }
            let mut few = hashed.clone();
            few.few = Some(
                hashed.exact.iter().map(|(&(a, p, pr), &i)| (a, p, pr, i)).collect(),
            );
            for (a, port, proto) in probes {
                let dst = a.to_be_bytes();
                prop_assert_eq!(few.lookup(&dst, port, proto), hashed.lookup(&dst, port, proto));
            }
        }
    }

    fn cfg() -> Config {
        Config::parse(
            r#"
[encap]
source = "10.0.0.1"
[[pools]]
name = "p"
backends = [{ address = "10.1.0.1" }]
[[prefix_groups]]
name = "class-a"
prefixes = ["74.125.0.0/16", "173.194.0.0/16"]
cluster_prefix_len = 24
[[prefix_groups]]
name = "narrow"
prefixes = ["74.125.200.0/22"]
cluster_prefix_len = 28
[[vips]]
name = "web"
address = "192.0.2.80"
port = 80
protocol = "tcp"
pool = "p"
[[vips]]
name = "dns-any"
address = "192.0.2.53"
protocol = "udp"
pool = "p"
[[vips]]
name = "svc1"
prefix_group = "class-a"
suffix = "0.0.0.1"
port = 443
protocol = "tcp"
pool = "p"
[[vips]]
name = "narrow-svc"
prefix_group = "narrow"
suffix = "0.0.0.5"
protocol = "tcp"
pool = "p"
"#,
            "t",
        )
        .unwrap()
    }

    fn at(s: &str) -> [u8; 16] {
        from_ip(s.parse().unwrap())
    }

    #[test]
    fn matching_order() {
        let m = VipMatcher::new(&cfg());
        assert_eq!(m.lookup(&at("192.0.2.80"), 80, 6), Some(0));
        assert_eq!(m.lookup(&at("192.0.2.80"), 81, 6), None);
        assert_eq!(m.lookup(&at("192.0.2.80"), 80, 17), None);
        assert_eq!(m.lookup(&at("192.0.2.53"), 5353, 17), Some(1));
        // Prefix/suffix: any cluster of class A, even one never configured.
        assert_eq!(m.lookup(&at("74.125.137.1"), 443, 6), Some(2));
        assert_eq!(m.lookup(&at("173.194.71.1"), 443, 6), Some(2));
        assert_eq!(m.lookup(&at("74.125.9.1"), 443, 6), Some(2));
        assert_eq!(m.lookup(&at("74.125.137.2"), 443, 6), None);
        assert_eq!(m.lookup(&at("74.125.137.1"), 80, 6), None);
        // The longer prefix wins: 74.125.200.0/22 is the "narrow" class,
        // whose clusters are /28s.
        assert_eq!(m.lookup(&at("74.125.201.5"), 22, 6), Some(3));
        assert_eq!(m.lookup(&at("74.125.201.21"), 22, 6), Some(3));
        assert_eq!(m.lookup(&at("74.125.201.1"), 443, 6), None);
        assert!(m.is_vip_address(&at("192.0.2.80")) && m.is_vip_address(&at("74.125.1.1")));
        assert!(!m.is_vip_address(&at("8.8.8.8")));
    }
}
