//! The next hop's MAC, found rather than typed.
//!
//! Every encapsulated frame leaves the interface for one next hop: the
//! router towards the backends, or the backend itself when it is on the
//! interface's subnet. Unless `[encap] gateway_mac` overrides it, the daemon
//! asks the kernel, as the kernel's own packets would ([`netio::neigh`]):
//! the route to the first backend (its gateway, else the backend), then the
//! neighbour table, triggering resolution (an empty UDP datagram to the
//! next hop's discard port) when the entry is missing. At start it waits up
//! to [`START_WAIT`] for that; then [`watch`] checks again every
//! [`RECHECK`] (every [`RETRY`] while unresolved, and at once after a
//! reload) and swaps a changed MAC into the tables in one step, as a reload
//! does ([`lb::tables::Control::set_resolved_gateway`]).
//!
//! What was found, or why nothing was, is logged when it changes and is
//! part of `/status` ([`GatewayStatus`]). A gateway that cannot be
//! resolved leaves frames addressed to [`lb::config::PLACEHOLDER_GATEWAY_MAC`],
//! where they are lost: the log line at start says so, names the interface
//! and the address, and what to run. If backends route through different
//! next hops, frames still go to the first backend's, with a warning (not
//! for a dual-stack pool's other family through the same router: its next
//! hop's MAC is resolved and compared, see [`divergence`]).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use lb::config::{parse_mac, PLACEHOLDER_GATEWAY_MAC};
use lb::tables::Control;
use lb::Config;
use netio::neigh::{self, format_mac};
use serde::{Deserialize, Serialize};

/// How long the start waits for the next hop to be resolved.
pub const START_WAIT: Duration = Duration::from_secs(3);
/// How long a later check waits for resolution.
pub const CHECK_WAIT: Duration = Duration::from_secs(1);
/// How often a resolved next hop is checked again.
pub const RECHECK: Duration = Duration::from_secs(5);
/// How often an unresolved next hop is tried again.
pub const RETRY: Duration = Duration::from_secs(1);
/// Backends whose routes are compared with the first one's (the rest are
/// not looked at, to bound a check's cost).
const MAX_COMPARED: usize = 256;
/// Backends named in the warning about different next hops.
const MAX_LISTED: usize = 4;

/// Where the gateway's MAC came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// From the kernel's route and neighbour table.
    Resolved,
    /// `[encap] gateway_mac`.
    Configured,
    /// Neither: frames go to the placeholder and are lost.
    Unresolved,
}

/// The gateway in `/status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GatewayStatus {
    /// The MAC encapsulated frames are sent to. While unresolved: the last
    /// one resolved, if any (it may be stale), else none: frames carry the
    /// placeholder 02:00:00:00:00:fe and are lost.
    pub mac: Option<String>,
    /// Where it came from.
    pub source: Source,
    /// The interface frames leave through.
    pub interface: String,
    /// The next hop's address (the route's gateway, or the backend itself),
    /// when known.
    #[serde(default)]
    pub address: Option<String>,
    /// The backend whose route was looked up (the first one).
    #[serde(default)]
    pub toward: Option<String>,
    /// Why it could not be resolved.
    #[serde(default)]
    pub error: Option<String>,
    /// Backends whose next hop differs from the first one's (their frames
    /// still go to the first one's).
    #[serde(default)]
    pub warning: Option<String>,
}

impl GatewayStatus {
    /// What an operator reads in `fastpath lb status`: one line, and the
    /// warning on a second one.
    pub fn to_text(&self) -> String {
        let mut out = match (self.source, &self.mac) {
            (Source::Resolved, Some(mac)) => format!(
                "gateway: {mac} (resolved: next hop {} on {}{})\n",
                self.address.as_deref().unwrap_or("?"),
                self.interface,
                self.toward
                    .as_deref()
                    .filter(|t| Some(*t) != self.address.as_deref())
                    .map(|t| format!(", the route to backend {t}"))
                    .unwrap_or_default()
            ),
            (Source::Configured, Some(mac)) => {
                format!("gateway: {mac} (configured: [encap] gateway_mac)\n")
            }
            (_, last) => format!(
                "gateway: UNRESOLVED on {}: {}\n  {}; {}\n",
                self.interface,
                self.error.as_deref().unwrap_or("not resolved yet"),
                match last {
                    Some(m) => format!(
                        "encapsulated frames still go to {m}, the last MAC resolved, which may be stale"
                    ),
                    None => format!(
                        "encapsulated frames go to the placeholder {} and are LOST (\"forwarded\" counts them)",
                        format_mac(&PLACEHOLDER_GATEWAY_MAC)
                    ),
                },
                advice(self)
            ),
        };
        if let Some(w) = &self.warning {
            out.push_str(&format!("gateway warning: {w}\n"));
        }
        out
    }
}

/// What to run when the gateway is unresolved.
fn advice(s: &GatewayStatus) -> String {
    let mut checks = Vec::new();
    if let Some(t) = &s.toward {
        checks.push(format!("`ip route get {t}`"));
    }
    checks.push(format!("`ip neigh show dev {}`", s.interface));
    if let Some(a) = &s.address {
        checks.push(format!("`ping -c 1 -I {} {a}`", s.interface));
    }
    format!(
        "check {} in the load balancer's network namespace, or set [encap] gateway_mac = \"<the next hop's MAC>\"",
        checks.join(", ")
    )
}

/// The backends frames are sent to, once each, in the order of the VIPs
/// that use them (the first is the one whose next hop is used).
pub fn backends(cfg: &Config) -> Vec<IpAddr> {
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for v in &cfg.vips {
        for b in cfg.flatten(&v.pool).unwrap_or_default() {
            if seen.insert(b.address) {
                out.push(b.address);
            }
        }
    }
    out
}

/// One check: the status, and the MAC resolved from the kernel (none when
/// configured or unresolved).
pub fn check(cfg: &Config, interface: &str, wait: Duration) -> (GatewayStatus, Option<[u8; 6]>) {
    let mut s = GatewayStatus {
        mac: None,
        source: Source::Unresolved,
        interface: interface.to_string(),
        address: None,
        toward: None,
        error: None,
        warning: None,
    };
    if let Some(m) = cfg.encap.gateway_mac.as_deref().and_then(parse_mac) {
        s.mac = Some(format_mac(&m));
        s.source = Source::Configured;
        return (s, None);
    }
    let list = backends(cfg);
    let Some(&first) = list.first() else {
        s.error = Some("no backends in the configuration to route towards".into());
        return (s, None);
    };
    s.toward = Some(first.to_string());
    match neigh::resolve(interface, first, wait) {
        Ok(r) => {
            s.mac = Some(format_mac(&r.mac));
            s.source = Source::Resolved;
            s.address = Some(r.next_hop.to_string());
            (s, Some(r.mac))
        }
        Err(e) => {
            if let neigh::Error::Unresolved { next_hop, .. } = &e {
                s.address = Some(next_hop.to_string());
            }
            s.error = Some(e.to_string());
            (s, None)
        }
    }
}

/// Backends whose next hop is not the first backend's and whose MAC is not
/// known to be the same, in words (none: all go through the same one).
/// Reads the route table and the neighbour table. A next hop of the other
/// address family (IPv6 backends beside an IPv4 first one, in a dual-stack
/// pool) is necessarily another address, most often of the same router;
/// its MAC is rarely in the neighbour table (the datapath, not the kernel,
/// talks to it), so it is resolved (up to [`CHECK_WAIT`], once per next
/// hop) and compared, and left out when it cannot be: only a MAC known to
/// differ is worth a warning there.
pub fn divergence(
    interface: &str,
    backends: &[IpAddr],
    hop: IpAddr,
    mac: [u8; 6],
) -> Option<String> {
    let ifindex = netio::afpacket::ifindex(interface)?;
    // Other next hops, with the backends behind each.
    let mut others: BTreeMap<String, Vec<IpAddr>> = BTreeMap::new();
    let mut tables: BTreeMap<bool, Vec<neigh::Neighbour>> = BTreeMap::new();
    // Next hops of the other family, resolved: their MAC, if found.
    let mut resolved: BTreeMap<IpAddr, Option<[u8; 6]>> = BTreeMap::new();
    for &b in backends.iter().skip(1).take(MAX_COMPARED) {
        let key = match neigh::route_on(interface, ifindex, b) {
            Ok(r) if r.next_hop() == hop => continue,
            Ok(r) => {
                let h = r.next_hop();
                let table = tables
                    .entry(h.is_ipv4())
                    .or_insert_with(|| neigh::neighbours(h).unwrap_or_default());
                let mut known = table
                    .iter()
                    .find(|n| n.ifindex == ifindex && n.address == h && n.state.usable())
                    .and_then(|n| n.mac);
                let other_family = h.is_ipv4() != hop.is_ipv4();
                if known.is_none() && other_family {
                    known = *resolved.entry(h).or_insert_with(|| {
                        neigh::resolve(interface, b, CHECK_WAIT).ok().map(|r| r.mac)
                    });
                }
                match known {
                    Some(m) if m == mac => continue,
                    Some(m) => format!("next hop {h} ({})", format_mac(&m)),
                    None if other_family => continue,
                    None => format!("next hop {h} (MAC not known)"),
                }
            }
            Err(e) => format!("no next hop on {interface}: {e}"),
        };
        others.entry(key).or_default().push(b);
    }
    if others.is_empty() {
        return None;
    }
    let listed: Vec<String> = others
        .iter()
        .take(MAX_LISTED)
        .map(|(k, bs)| {
            let names: Vec<String> = bs.iter().take(3).map(IpAddr::to_string).collect();
            let more = if bs.len() > 3 {
                format!(" and {} more", bs.len() - 3)
            } else {
                String::new()
            };
            format!("{}{more} via {k}", names.join(", "))
        })
        .collect();
    let more = if others.len() > MAX_LISTED {
        format!("; and {} other next hops", others.len() - MAX_LISTED)
    } else {
        String::new()
    };
    Some(format!(
        "backends route through different next hops: {}{more}; their frames go to {hop} ({}) too, the first backend's next hop. Give the backends one next hop on {interface}, or set [encap] gateway_mac",
        listed.join("; "),
        format_mac(&mac)
    ))
}

/// The daemon's gateway state: the status `/status` shows, and a flag that
/// makes the watcher check again at once (after a reload).
#[derive(Debug)]
pub struct Gateway {
    interface: String,
    status: Mutex<GatewayStatus>,
    kick: AtomicBool,
}

impl Gateway {
    /// The first check, at start (waiting up to [`START_WAIT`] for
    /// resolution), logged; and the MAC to build the first tables with.
    pub fn start(cfg: &Config, interface: &str) -> (Gateway, Option<[u8; 6]>) {
        let (mut s, mac) = check(cfg, interface, START_WAIT);
        if let (Some(m), Some(hop)) = (
            mac,
            s.address.as_deref().and_then(|a| a.parse::<IpAddr>().ok()),
        ) {
            s.warning = divergence(interface, &backends(cfg), hop, m);
        }
        log_change(None, &s);
        (
            Gateway {
                interface: interface.to_string(),
                status: Mutex::new(s),
                kick: AtomicBool::new(false),
            },
            mac,
        )
    }

    /// The status now.
    pub fn status(&self) -> GatewayStatus {
        self.status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Asks the watcher to check again now (the configuration changed).
    pub fn kick(&self) {
        self.kick.store(true, Ordering::Release);
    }
}

/// Logs a change of the gateway's status (the first status when `old` is
/// none); nothing when nothing an operator acts on changed.
fn log_change(old: Option<&GatewayStatus>, new: &GatewayStatus) {
    // The neighbour entry's state in an unresolved next hop's error moves
    // between INCOMPLETE and FAILED from one try to the next: not a change.
    let reason = |s: &GatewayStatus| {
        s.error.as_deref().map(|e| {
            e.split(" (neighbour entry:")
                .next()
                .unwrap_or(e)
                .to_string()
        })
    };
    let same = |a: &GatewayStatus| {
        a.source == new.source
            && a.mac == new.mac
            && a.address == new.address
            && a.toward == new.toward
            && reason(a) == reason(new)
    };
    if !old.is_some_and(same) {
        match new.source {
            Source::Resolved => {
                let mac = new.mac.as_deref().unwrap_or("?");
                let hop = new.address.as_deref().unwrap_or("?");
                match old.filter(|o| o.source == Source::Resolved) {
                    Some(o) => tracing::warn!(
                        interface = %new.interface,
                        "gateway: next hop {hop} is now {mac} (was {} at {}); tables swapped",
                        o.mac.as_deref().unwrap_or("?"),
                        o.address.as_deref().unwrap_or("?")
                    ),
                    None => tracing::info!(
                        interface = %new.interface,
                        "gateway: next hop {hop} on {} is {mac} (resolved from the kernel's route to {} and its neighbour table; checked every {} s)",
                        new.interface,
                        new.toward.as_deref().unwrap_or("?"),
                        RECHECK.as_secs()
                    ),
                }
            }
            Source::Configured => tracing::info!(
                interface = %new.interface,
                "gateway: {} (configured: [encap] gateway_mac)",
                new.mac.as_deref().unwrap_or("?")
            ),
            Source::Unresolved => tracing::error!(
                interface = %new.interface,
                "gateway: cannot resolve the next hop's MAC on {}{}: {}. {} (trying again every {} s); {}",
                new.interface,
                new.toward
                    .as_deref()
                    .map(|t| format!(" towards backend {t}"))
                    .unwrap_or_default(),
                new.error.as_deref().unwrap_or("not resolved"),
                match &new.mac {
                    Some(m) => format!("Encapsulated frames still go to the last MAC resolved, {m}, which may be stale"),
                    None => format!(
                        "Encapsulated frames go to the placeholder {} and are lost until it resolves",
                        format_mac(&PLACEHOLDER_GATEWAY_MAC)
                    ),
                },
                RETRY.as_secs(),
                advice(new)
            ),
        }
    }
    if new.warning.is_some() && old.and_then(|o| o.warning.as_ref()) != new.warning.as_ref() {
        tracing::warn!(interface = %new.interface, "gateway: {}", new.warning.as_deref().unwrap_or(""));
    }
}

/// Checks the gateway again every [`RECHECK`] (every [`RETRY`] while
/// unresolved, at once when kicked) until `stop`, and swaps a change into
/// the tables through `control`. Runs on a thread of its own: a check
/// blocks on netlink and on resolution for up to [`CHECK_WAIT`].
pub fn watch(gw: &Gateway, control: &Mutex<Control>, stop: &AtomicBool) {
    // What the divergence warning was computed for: the backends and the
    // chosen next hop.
    let mut compared: Option<(Vec<IpAddr>, Option<String>, Option<String>)> = None;
    let mut last_check = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        let every = match gw.status().source {
            Source::Unresolved => RETRY,
            _ => RECHECK,
        };
        if !gw.kick.swap(false, Ordering::AcqRel) && last_check.elapsed() < every {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        }
        last_check = Instant::now();
        let cfg = control
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .config()
            .clone();
        let (mut s, mac) = check(&cfg, &gw.interface, CHECK_WAIT);
        let old = gw.status();
        // The warning, computed again only when what it depends on changed.
        let list = backends(&cfg);
        let key = (list.clone(), s.address.clone(), s.mac.clone());
        s.warning = if compared.as_ref() == Some(&key) {
            old.warning.clone()
        } else {
            let w = match (
                mac,
                s.address.as_deref().and_then(|a| a.parse::<IpAddr>().ok()),
            ) {
                (Some(m), Some(hop)) => divergence(&gw.interface, &list, hop, m),
                _ => None,
            };
            compared = Some(key);
            w
        };
        // An unresolved next hop keeps the last MAC in the tables (it may
        // still be right: the next hop may only be slow to answer); the
        // status says it is unresolved, and which MAC frames still go to.
        {
            let mut c = control.lock().unwrap_or_else(|p| p.into_inner());
            if mac.is_some() {
                c.set_resolved_gateway(mac);
            } else if s.source == Source::Unresolved {
                s.mac = c.resolved_gateway().map(|m| format_mac(&m));
            }
        }
        log_change(Some(&old), &s);
        *gw.status.lock().unwrap_or_else(|p| p.into_inner()) = s;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(extra: &str) -> Config {
        Config::parse(
            &format!(
                "[encap]\nsource = \"10.0.0.1\"\n{extra}\n\
                 [[pools]]\nname = \"a\"\nbackends = [{{ address = \"10.1.0.2\" }}, {{ address = \"10.1.0.1\" }}]\n\
                 [[pools]]\nname = \"b\"\nbackends = [{{ address = \"10.1.0.1\" }}, {{ address = \"10.3.0.1\" }}]\n\
                 [[pools]]\nname = \"unused\"\nbackends = [{{ address = \"10.9.0.1\" }}]\n\
                 [[vips]]\nname = \"x\"\naddress = \"198.18.0.1\"\nport = 80\nprotocol = \"tcp\"\npool = \"a\"\n\
                 [[vips]]\nname = \"y\"\naddress = \"198.18.0.2\"\nport = 80\nprotocol = \"tcp\"\npool = \"b\"\n"
            ),
            "t",
        )
        .unwrap()
    }

    #[test]
    fn backends_in_vip_order_once_each_served_ones_only() {
        let b: Vec<String> = backends(&cfg("")).iter().map(|a| a.to_string()).collect();
        assert_eq!(b, ["10.1.0.2", "10.1.0.1", "10.3.0.1"]);
    }

    #[test]
    fn a_configured_gateway_is_used_without_asking_the_kernel() {
        // The interface does not exist: a lookup would fail.
        let (s, mac) = check(
            &cfg("gateway_mac = \"02:00:00:00:12:34\""),
            "fp-no-such-if",
            Duration::ZERO,
        );
        assert_eq!(s.source, Source::Configured);
        assert_eq!(s.mac.as_deref(), Some("02:00:00:00:12:34"));
        assert_eq!(mac, None);
        assert!(s.to_text().contains("02:00:00:00:12:34 (configured"));
    }

    #[test]
    fn an_unresolved_gateway_says_where_and_what_to_run() {
        let (s, mac) = check(&cfg(""), "fp-no-such-if", Duration::ZERO);
        assert_eq!((s.source, mac), (Source::Unresolved, None));
        assert_eq!(s.toward.as_deref(), Some("10.1.0.2"));
        let e = s.error.clone().unwrap();
        assert!(e.contains("fp-no-such-if"), "{e}");
        let t = s.to_text();
        for want in [
            "UNRESOLVED on fp-no-such-if",
            "02:00:00:00:00:fe",
            "LOST",
            "ip route get 10.1.0.2",
            "gateway_mac",
        ] {
            assert!(t.contains(want), "{want:?} missing in {t}");
        }
        // Through JSON and back, as `lb status` reads it.
        let back: GatewayStatus =
            serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(back, s);
        assert!(serde_json::to_string(&s)
            .unwrap()
            .contains("\"source\":\"unresolved\""));
    }
}
