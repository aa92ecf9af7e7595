//! `[fleet]`: the load balancers sharing the VIPs, for fragments. Which
//! of the peers is this one ([`FleetConf::own`]) is table work,
//! defined with the tables (`lb::tables`).

use std::collections::HashMap;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use super::health::{interval, ok200, slash, timeout, two};
use super::{
    check_health_conf, not_a_host, problem, CheckKind, CheckPath, Config, HealthConf, Problem,
};

/// `[fleet]`: the load balancers that share the VIPs behind one router (the
/// Maglev pool of the paper's section 4.3), this one included. A fragment
/// of a datagram for a VIP is handled by one of them, chosen by the hash of
/// its 3-tuple (source, destination, protocol) over this list, the same on
/// every load balancer whatever the list's order; the others send it there
/// in GRE marked with [`packet::gre::FRAGMENT_REDIRECT_KEY`], and a marked
/// fragment is never sent on again. Changes apply on reload.
///
/// ```toml
/// [fleet]
/// peers = ["10.10.2.2", "10.10.2.3", "10.10.2.4"]  # this one is [encap] source
/// name = "lb1"                                      # default: the host name
/// health = { kind = "fastpath", port = 9181 }       # the default: fastpath's own probe
/// ```
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FleetConf {
    /// Every load balancer's address, this one's included: `[encap]
    /// source` for IPv4 peers, `source6` for IPv6 ones (one family).
    pub peers: Vec<IpAddr>,
    /// This machine's name in reports (default: the host name).
    pub name: Option<String>,
    /// How the other peers' liveness is checked, from the daemon, at their
    /// addresses (`via` must be `"direct"`). Fragments whose peer is down
    /// are dropped, counted as `fragment_peer_down`. Default: kind
    /// `"fastpath"` on [`PEER_PORT`]: each peer's fastpath answers while
    /// its datapath beats (this load balancer answers the others there).
    #[serde(default = "default_peer_health")]
    pub health: HealthConf,
}

/// The UDP port on which a `[fleet]` peer's fastpath answers the liveness
/// probe of [`CheckKind::Fastpath`] by default.
pub const PEER_PORT: u16 = 9181;

fn default_peer_health() -> HealthConf {
    HealthConf {
        kind: CheckKind::Fastpath,
        port: PEER_PORT,
        path: slash(),
        expect_status: ok200(),
        interval_ms: interval(),
        timeout_ms: timeout(),
        rise: two(),
        fall: two(),
        via: CheckPath::Direct,
    }
}

impl Config {
    /// `[fleet]`: peers of one family, each once, this load balancer
    /// among them; a direct peer check with sane timers; a printable name.
    pub(super) fn check_fleet(&self) -> Result<(), Problem> {
        let Some(f) = &self.fleet else {
            return Ok(());
        };
        if f.peers.len() > 1024 {
            return problem(
                "fleet.peers".into(),
                format!(
                    "{} peers are too many; expected at most 1024",
                    f.peers.len()
                ),
            );
        }
        let mut seen = HashMap::new();
        for (i, a) in f.peers.iter().enumerate() {
            if let Some(j) = seen.insert(*a, i) {
                return problem(
                    format!("fleet.peers[{i}]"),
                    format!(
                        "{a} is listed twice (also fleet.peers[{j}]); list each load balancer once"
                    ),
                );
            }
            if a.is_ipv4() != f.peers[0].is_ipv4() {
                return problem(
                    format!("fleet.peers[{i}]"),
                    format!(
                        "{a} is not of the family of fleet.peers[0] ({}); list one address family",
                        f.peers[0]
                    ),
                );
            }
            // Loopback is refused where a file is loaded to run
            // ([`Config::check_peers_reachable`]): a model of a fleet on
            // one machine (tests) may put peers there.
            if let Some(why) = not_a_host(*a).filter(|_| !a.to_canonical().is_loopback()) {
                return problem(
                    format!("fleet.peers[{i}]"),
                    format!(
                        "{a} is {why}, not a load balancer's address: list each one's own \
                         [encap] source"
                    ),
                );
            }
        }
        // The peers' family says which outer source is this load balancer's
        // address among them, as [`FleetConf::own`] picks it for the tables.
        let (own_key, family, own) = if f.peers.first().is_some_and(IpAddr::is_ipv6) {
            ("encap.source6", "IPv6", self.encap.source6)
        } else {
            ("encap.source", "IPv4", self.encap.source)
        };
        match own {
            None => {
                return problem(
                    own_key.into(),
                    format!("[fleet] lists {family} peers: set {own_key}, this load balancer's address among them"),
                )
            }
            Some(me) if !f.peers.contains(&me) => {
                return problem(
                    "fleet.peers".into(),
                    format!(
                        "this load balancer ({own_key} = {me}) is not in the list; \
                         every load balancer lists the whole fleet, itself included"
                    ),
                )
            }
            Some(_) => {}
        }
        let h = &f.health;
        if h.via != CheckPath::Direct {
            return problem(
                "fleet.health.via".into(),
                "peers are checked at their own addresses: use \"direct\"".into(),
            );
        }
        if h.kind == CheckKind::Fastpath && h.port == 0 {
            return problem(
                "fleet.health.port".into(),
                format!(
                    "the peers' fastpath answers on a UDP port: give one (default {PEER_PORT})"
                ),
            );
        }
        check_health_conf("fleet.health", h)?;
        if let Some(n) = &f.name {
            if n.is_empty() || n.len() > 255 || n.chars().any(char::is_control) {
                return problem(
                    "fleet.name".into(),
                    format!("{n:?} must be 1 to 255 printable characters"),
                );
            }
        }
        Ok(())
    }

    /// `[fleet] peers` on a network: none on loopback, where fragments
    /// redirected in GRE would never leave this machine. Asked where a
    /// file is loaded to run ([`Config::load`]), not by [`Config::validate`],
    /// whose models of a fleet on one machine may put peers there.
    pub(super) fn check_peers_reachable(&self) -> Result<(), Problem> {
        let Some(f) = &self.fleet else {
            return Ok(());
        };
        for (i, a) in f.peers.iter().enumerate() {
            if a.to_canonical().is_loopback() {
                return problem(
                    format!("fleet.peers[{i}]"),
                    format!(
                        "{a} is a loopback address, which no other load balancer reaches: \
                         list each load balancer's own [encap] source"
                    ),
                );
            }
        }
        Ok(())
    }

    /// This machine's name in reports: `[fleet] name`, else the host name.
    pub fn machine_name(&self) -> String {
        self.fleet
            .as_ref()
            .and_then(|f| f.name.clone())
            .or_else(|| {
                std::fs::read_to_string("/proc/sys/kernel/hostname")
                    .ok()
                    .map(|h| h.trim().to_string())
                    .filter(|h| !h.is_empty())
            })
            .unwrap_or_else(|| "unknown".into())
    }
}

#[cfg(test)]
mod tests {
    use crate::config::tests::*;
    use crate::config::*;

    #[test]
    fn fleet_lists_this_load_balancer_once_in_one_family() {
        let fleet = |peers: &str| format!("{GOOD}\n[fleet]\npeers = [{peers}]\nname = \"lb1\"\n");
        let c = Config::parse(&fleet("\"10.0.0.2\", \"10.0.0.1\", \"10.0.0.3\""), "t").unwrap();
        let f = c.fleet.as_ref().unwrap();
        assert_eq!(f.own(&c.encap), Some(ip("10.0.0.1")));
        // Peers are checked by their own fastpath, not at BGP's port.
        assert_eq!(
            (f.health.kind, f.health.port),
            (CheckKind::Fastpath, PEER_PORT)
        );
        let e = err(&GOOD.replace(
            "include = [\"extra\"]",
            "include = [\"extra\"]\nhealth = { kind = \"fastpath\", port = 80 }",
        ));
        assert_eq!(e.key, "pools[0].health.kind", "{e}");
        assert_eq!(c.machine_name(), "lb1");
        let e = err(&fleet("\"10.0.0.2\", \"10.0.0.3\""));
        assert!(
            e.key == "fleet.peers" && e.problem.contains("10.0.0.1"),
            "{e}"
        );
        let e = err(&fleet("\"10.0.0.1\", \"10.0.0.2\", \"10.0.0.1\""));
        assert!(
            e.key == "fleet.peers[2]" && e.problem.contains("twice"),
            "{e}"
        );
        let e = err(&fleet("\"10.0.0.1\", \"fd00::2\""));
        assert!(
            e.key == "fleet.peers[1]" && e.problem.contains("family"),
            "{e}"
        );
        // IPv6 peers identify this load balancer by source6.
        let e = err(&fleet("\"fd00::1\", \"fd00::2\""));
        assert_eq!(e.key, "encap.source6", "{e}");
        let v6 =
            fleet("\"fd00::1\", \"fd00::2\"").replace("[encap]", "[encap]\nsource6 = \"fd00::1\"");
        Config::parse(&v6, "t").unwrap();
        let e = err(&fleet("\"10.0.0.1\"").replace(
            "name = \"lb1\"",
            "health = { kind = \"tcp\", port = 179, via = \"tunnel\" }",
        ));
        assert_eq!(e.key, "fleet.health.via", "{e}");
        let e = err(&fleet("\"10.0.0.1\"").replace("name = \"lb1\"", "colour = 1"));
        assert!(
            e.key.starts_with("line") && e.problem.contains("colour"),
            "{e}"
        );
        // A change inside [fleet] is applied by a reload; adding or
        // removing the section changes how the ports are opened.
        let old = Config::parse(GOOD, "t").unwrap();
        let one = Config::parse(&fleet("\"10.0.0.1\""), "t").unwrap();
        let two = Config::parse(&fleet("\"10.0.0.1\", \"10.0.0.2\""), "t").unwrap();
        assert!(one.restart_keys(&two).is_empty());
        assert_eq!(old.restart_keys(&two), ["fleet"]);
        assert_eq!(two.restart_keys(&old), ["fleet"]);
    }
}
