//! `[encap]`: the outer headers of encapsulated packets (addresses, MACs,
//! TTL, per-flow sources). What the tables make of them (the per-flow
//! spread, [`Encap::spread`]) is defined with the tables (`lb::tables`).

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use super::{
    check_prefix, not_a_host, not_a_station, overlapping, parse_mac, problem, Problem, NOT_A_SOURCE,
};

/// `[encap]`.
///
/// ```toml
/// [encap]
/// source = "10.0.0.1"      # outer source address for IPv4 backends
/// source6 = "fd00::1"      # outer source address for IPv6 backends
/// mac = "02:00:00:00:00:01"  # default: the interface's own MAC
/// # gateway_mac = "02:00:00:00:00:fe"  # the next hop's MAC; see below
/// ttl = 64
/// # source_prefix = "198.18.100.0/24"  # per-flow outer sources (RSS on the backends)
/// # source_prefix6 = "fd00:100::/64"
/// ```
///
/// `[encap] gateway_mac` is the MAC of the next hop every encapsulated frame
/// is sent to: the router towards the backends (or the backend itself when
/// it is on the interface's own subnet). Leave it out: the daemon
/// (`fastpath lb run --interface`) finds it from the kernel, as the kernel's
/// own packets would (the route to the first backend, then the neighbour
/// table, resolving the address if needed), checks it again every few
/// seconds and swaps in a change like a reload; `fastpath lb status` shows
/// what it found or why it could not. Set it only to override that. Pcap
/// replay has no interface and no kernel route: there the frames carry the
/// configured value, else [`PLACEHOLDER_GATEWAY_MAC`].
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Encap {
    /// Outer source for IPv4 backends.
    pub source: Option<IpAddr>,
    /// Outer source for IPv6 backends.
    pub source6: Option<IpAddr>,
    /// Our MAC (default: the interface's own, or 02:00:00:00:00:01 for
    /// pcap files).
    pub mac: Option<String>,
    /// The next hop's MAC, overriding what the daemon resolves from the
    /// kernel (none: resolved; pcap replay uses [`PLACEHOLDER_GATEWAY_MAC`]).
    pub gateway_mac: Option<String>,
    /// Outer TTL / hop limit.
    pub ttl: u8,
    /// A prefix (IPv4 CIDR, /16 to /32) each flow's outer source address
    /// toward IPv4 backends is taken from, by its flow hash, so that the
    /// backends' NICs spread flows over their queues; GRE then carries the
    /// flow hash in its key. None: every frame leaves from `source`. A
    /// reload applies a change (flows then leave from new sources).
    pub source_prefix: Option<String>,
    /// The same for IPv6 backends (an IPv6 CIDR, /64 to /128).
    pub source_prefix6: Option<String>,
}

impl Default for Encap {
    fn default() -> Self {
        Encap {
            source: None,
            source6: None,
            mac: None,
            gateway_mac: None,
            ttl: 64,
            source_prefix: None,
            source_prefix6: None,
        }
    }
}

/// The destination MAC of encapsulated frames when `[encap] gateway_mac`
/// is not set and no next hop was resolved: pcap replay (no interface), or
/// a daemon that could not resolve its gateway (it says so at start and in
/// `/status`; such frames are lost).
pub const PLACEHOLDER_GATEWAY_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0xfe];

impl Encap {
    /// `[encap]`: addresses, MACs, TTL.
    pub(super) fn check(&self) -> Result<(), Problem> {
        let e = self;
        if let Some(m) = e.mac.as_deref().filter(|m| parse_mac(m).is_none()) {
            return problem(
                "encap.mac".into(),
                format!("{m:?} is not a MAC address like 02:00:00:00:00:01"),
            );
        }
        if let Some(m) = e.gateway_mac.as_deref().filter(|m| parse_mac(m).is_none()) {
            return problem(
                "encap.gateway_mac".into(),
                format!("{m:?} is not a MAC address like 02:00:00:00:00:fe (leave it out to have the daemon resolve the next hop)"),
            );
        }
        // Frames go from one station to another: a group address as their
        // source is invalid, as their destination it floods the segment.
        // The source may be zero: it is the interface's own MAC when not
        // configured, and loopback's is zero.
        for (key, m, what) in [
            ("encap.mac", &e.mac, "this load balancer's"),
            ("encap.gateway_mac", &e.gateway_mac, "the next hop's"),
        ] {
            let Some(text) = m else { continue };
            let why = parse_mac(text)
                .filter(|m| key == "encap.gateway_mac" || *m != [0; 6])
                .and_then(not_a_station);
            if let Some(why) = why {
                return problem(
                    key.into(),
                    format!("{text:?} is {why}, not {what} own MAC address"),
                );
            }
        }
        if e.source.is_some_and(|a| !a.is_ipv4()) {
            return problem(
                "encap.source".into(),
                "must be an IPv4 address (use source6 for IPv6)".into(),
            );
        }
        if e.source6.is_some_and(|a| !a.is_ipv6()) {
            return problem("encap.source6".into(), "must be an IPv6 address".into());
        }
        for (key, a) in [("encap.source", e.source), ("encap.source6", e.source6)] {
            if let Some(why) = a.and_then(not_a_host) {
                return problem(
                    key.into(),
                    format!(
                        "{} is {why}: backends answer the outer source, so it must be this \
                         load balancer's own unicast address",
                        a.map_or(String::new(), |a| a.to_string())
                    ),
                );
            }
        }
        if e.ttl == 0 {
            return problem("encap.ttl".into(), "must be at least 1".into());
        }
        for (key, value, v4, example) in [
            (
                "encap.source_prefix",
                &e.source_prefix,
                true,
                "198.18.100.0/24",
            ),
            (
                "encap.source_prefix6",
                &e.source_prefix6,
                false,
                "fd00:100::/64",
            ),
        ] {
            let Some(text) = value else { continue };
            let (addr, len) = check_prefix(|| key.into(), text, example)?;
            if addr.is_ipv4() != v4 {
                return problem(
                    key.into(),
                    if v4 {
                        format!(
                            "{text:?} must be an IPv4 prefix (source_prefix6 is for IPv6 backends)"
                        )
                    } else {
                        format!(
                            "{text:?} must be an IPv6 prefix (source_prefix is for IPv4 backends)"
                        )
                    },
                );
            }
            if let Err(err) = packet::gre::SourcePrefix::new(addr, len) {
                return problem(key.into(), format!("{text:?}: {err}"));
            }
            // Backends answer the outer source (health checks through the
            // tunnel, ICMP errors): it must be a unicast host's address.
            if let Some(what) = overlapping((addr, len), &NOT_A_SOURCE) {
                return problem(
                    key.into(),
                    format!(
                        "{text:?} includes {what}, which is no host's own address: backends \
                         answer the outer source, so give a unicast prefix routed to this load \
                         balancer, like \"{example}\""
                    ),
                );
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
    fn gateway_mac_is_optional_and_checked_when_set() {
        // Unset: no placeholder in the configuration; the daemon resolves
        // the next hop itself.
        let c = Config::parse(GOOD, "t.toml").unwrap();
        assert_eq!(c.encap.gateway_mac, None);
        assert_eq!(Encap::default().gateway_mac, None);
        // Set: an override, kept as written.
        let c = Config::parse(
            &GOOD.replace("[encap]", "[encap]\ngateway_mac = \"02:aa:bb:cc:dd:ee\""),
            "t.toml",
        )
        .unwrap();
        assert_eq!(c.encap.gateway_mac.as_deref(), Some("02:aa:bb:cc:dd:ee"));
        // Set badly: still an error naming the key and the way out.
        for bad in ["02:aa:bb:cc:dd", "router", "02:aa:bb:cc:dd:zz", ""] {
            let e = err(&GOOD.replace("[encap]", &format!("[encap]\ngateway_mac = \"{bad}\"")));
            assert_eq!(e.key, "encap.gateway_mac", "{bad}: {e}");
            assert!(
                e.problem.contains(&format!("{bad:?}")) && e.problem.contains("leave it out"),
                "{e}"
            );
        }
    }
}
