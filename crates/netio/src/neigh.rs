//! The next hop's MAC address, from the kernel: which neighbour a frame
//! towards an address must be sent to, found the way the kernel's own
//! packets find it.
//!
//! 1. A route lookup (`RTM_GETROUTE` for the address, as `ip route get`
//!    does): the route's gateway if it has one, else the address itself
//!    (on-link), and the interface it leaves through.
//! 2. The neighbour table (`RTM_GETNEIGH` dump, as `ip neigh show`): the
//!    next hop's link-layer address, if the entry holds one.
//! 3. If it does not, resolution is triggered the ordinary way: an empty
//!    UDP datagram to the next hop's discard port (9) from a connected
//!    socket of this network namespace, which makes the kernel send an ARP
//!    request (IPv6: a neighbour solicitation); then the table is read
//!    again until the entry is there or the wait is over. An entry the
//!    kernel holds but has not confirmed lately (stale) is used at once and
//!    probed the same way, so that a next hop that changed its MAC is found
//!    out by the next look.
//!
//! Everything runs in the calling thread's network namespace, over
//! blocking NETLINK_ROUTE sockets (no async runtime), each request bounded
//! in time ([`crate::rtnl`]), with the messages built and parsed by the
//! `netlink-packet-route` crate.

use std::io;
use std::net::{IpAddr, SocketAddr, SocketAddrV6, UdpSocket};
use std::time::{Duration, Instant};

use netlink_packet_core::NLM_F_DUMP;
use netlink_packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourMessage, NeighbourState,
};
use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteMessage, RouteType};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};

use crate::rtnl;

/// The UDP port a resolution probe is sent to: discard (RFC 863), which
/// nothing is expected to answer.
pub const PROBE_PORT: u16 = 9;

/// How often the neighbour table is read while waiting for resolution.
const POLL: Duration = Duration::from_millis(20);

/// How often a probe is sent again while the entry stays unresolved.
const REPROBE: Duration = Duration::from_secs(1);

/// Why a next hop could not be found.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Talking to the kernel over NETLINK_ROUTE failed.
    #[error("netlink ({what}): {source}")]
    Netlink {
        /// What was being asked.
        what: &'static str,
        /// The system's answer.
        #[source]
        source: io::Error,
    },
    /// The kernel's answer did not parse.
    #[error("netlink ({what}): the kernel's answer did not parse: {detail}")]
    Decode {
        /// What was being asked.
        what: &'static str,
        /// The parser's complaint.
        detail: String,
    },
    /// The interface does not exist in this network namespace.
    #[error("no interface {interface} in this network namespace")]
    NoInterface {
        /// The interface asked for.
        interface: String,
    },
    /// The kernel has no route to the address.
    #[error("no route to {destination}: {source}")]
    NoRoute {
        /// The address looked up.
        destination: IpAddr,
        /// The kernel's answer (e.g. "Network is unreachable").
        #[source]
        source: io::Error,
    },
    /// The address is one of this machine's own.
    #[error(
        "{destination} is an address of this machine (a {kind} route), not one behind a next hop"
    )]
    Local {
        /// The address looked up.
        destination: IpAddr,
        /// The route's type, in words.
        kind: String,
    },
    /// The route leaves through another interface than the one frames are
    /// sent on, so the kernel knows no next hop on that one.
    #[error("the route to {destination} leaves through {via}, not {interface}")]
    OtherInterface {
        /// The address looked up.
        destination: IpAddr,
        /// The interface frames are sent on.
        interface: String,
        /// The interface the kernel's route uses.
        via: String,
    },
    /// The next hop did not answer neighbour resolution in time.
    #[error("{next_hop} (the next hop on {interface} towards {destination}) did not answer address resolution within {waited_ms} ms (neighbour entry: {state})")]
    Unresolved {
        /// The interface.
        interface: String,
        /// The address looked up.
        destination: IpAddr,
        /// The next hop whose MAC is missing.
        next_hop: IpAddr,
        /// How long resolution was waited for.
        waited_ms: u64,
        /// The neighbour entry's state at the end, as `ip neigh` writes it
        /// ("none" without an entry).
        state: String,
    },
    /// The resolution probe could not be sent.
    #[error("probing {next_hop} (UDP to port {PROBE_PORT}): {source}")]
    Probe {
        /// The next hop.
        next_hop: IpAddr,
        /// The system's answer.
        #[source]
        source: io::Error,
    },
}

/// A route the kernel chose for an address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// The address looked up.
    pub destination: IpAddr,
    /// The route's gateway (none: the address is on-link).
    pub gateway: Option<IpAddr>,
    /// The interface index it leaves through.
    pub oif: Option<u32>,
}

impl Route {
    /// The neighbour a frame towards the destination goes to: the gateway,
    /// else the destination itself.
    pub fn next_hop(&self) -> IpAddr {
        self.gateway.unwrap_or(self.destination)
    }
}

/// A neighbour-table entry's state (`ip neigh`'s words).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Resolution in progress, no address yet.
    Incomplete,
    /// Confirmed lately.
    Reachable,
    /// Known but not confirmed lately; still used.
    Stale,
    /// Waiting before probing a stale entry.
    Delay,
    /// Being probed.
    Probe,
    /// Resolution failed.
    Failed,
    /// No resolution needed on this link.
    NoArp,
    /// Configured by hand.
    Permanent,
    /// No state (an entry being created or removed).
    None,
    /// A state this code does not know (the kernel's bits).
    Other(u16),
}

impl State {
    fn from_kernel(s: NeighbourState) -> State {
        match s {
            NeighbourState::Incomplete => State::Incomplete,
            NeighbourState::Reachable => State::Reachable,
            NeighbourState::Stale => State::Stale,
            NeighbourState::Delay => State::Delay,
            NeighbourState::Probe => State::Probe,
            NeighbourState::Failed => State::Failed,
            NeighbourState::Noarp => State::NoArp,
            NeighbourState::Permanent => State::Permanent,
            NeighbourState::None => State::None,
            NeighbourState::Other(v) => State::Other(v),
            _ => State::Other(u16::from(s)),
        }
    }

    /// Whether the entry's link-layer address may be used (the kernel
    /// itself sends to it in these states).
    pub fn usable(self) -> bool {
        matches!(
            self,
            State::Reachable
                | State::Stale
                | State::Delay
                | State::Probe
                | State::NoArp
                | State::Permanent
        )
    }

    /// Whether the address is known good without asking again: confirmed
    /// lately, or not subject to resolution at all.
    pub fn confirmed(self) -> bool {
        matches!(self, State::Reachable | State::NoArp | State::Permanent)
    }
}

impl std::fmt::Display for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            State::Incomplete => f.write_str("INCOMPLETE"),
            State::Reachable => f.write_str("REACHABLE"),
            State::Stale => f.write_str("STALE"),
            State::Delay => f.write_str("DELAY"),
            State::Probe => f.write_str("PROBE"),
            State::Failed => f.write_str("FAILED"),
            State::NoArp => f.write_str("NOARP"),
            State::Permanent => f.write_str("PERMANENT"),
            State::None => f.write_str("NONE"),
            State::Other(v) => write!(f, "{v:#x}"),
        }
    }
}

/// A neighbour-table entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Neighbour {
    /// The interface index.
    pub ifindex: u32,
    /// The neighbour's address.
    pub address: IpAddr,
    /// Its link-layer address, if the entry holds an Ethernet one.
    pub mac: Option<[u8; 6]>,
    /// The entry's state.
    pub state: State,
}

/// A next hop found: where frames towards `destination` go on the
/// interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// The address looked up.
    pub destination: IpAddr,
    /// The neighbour frames go to (the route's gateway, or the destination).
    pub next_hop: IpAddr,
    /// Whether the route has a gateway (else the destination is on-link).
    pub via_gateway: bool,
    /// The next hop's MAC.
    pub mac: [u8; 6],
    /// The neighbour entry's state when it was read.
    pub state: State,
    /// Whether a probe was sent (the entry was missing, failed or not
    /// confirmed lately).
    pub probed: bool,
}

/// `aa:bb:cc:dd:ee:ff`.
pub fn format_mac(m: &[u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

fn netlink(what: &'static str) -> impl Fn(io::Error) -> Error {
    move |source| Error::Netlink { what, source }
}

/// One request to the kernel ([`crate::rtnl::request`]); the messages of
/// its answer (one for a get, all of them for a dump). An error answer is
/// returned as its errno.
fn request(
    what: &'static str,
    msg: RouteNetlinkMessage,
    dump: bool,
) -> Result<Result<Vec<RouteNetlinkMessage>, io::Error>, Error> {
    rtnl::request(msg, if dump { NLM_F_DUMP } else { 0 }).map_err(|e| match e {
        rtnl::Error::Io(source) => Error::Netlink { what, source },
        rtnl::Error::Decode(detail) => Error::Decode { what, detail },
    })
}

fn family(a: IpAddr) -> AddressFamily {
    match a {
        IpAddr::V4(_) => AddressFamily::Inet,
        IpAddr::V6(_) => AddressFamily::Inet6,
    }
}

fn route_ip(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(v) => Some(IpAddr::V4(*v)),
        RouteAddress::Inet6(v) => Some(IpAddr::V6(*v)),
        _ => None,
    }
}

/// The route the kernel picks for `destination` (`ip route get`).
pub fn route(destination: IpAddr) -> Result<Route, Error> {
    const WHAT: &str = "route lookup (RTM_GETROUTE)";
    let mut msg = RouteMessage::default();
    msg.header.address_family = family(destination);
    msg.header.destination_prefix_length = if destination.is_ipv4() { 32 } else { 128 };
    msg.attributes
        .push(RouteAttribute::Destination(RouteAddress::from(destination)));
    let answer = request(WHAT, RouteNetlinkMessage::GetRoute(msg), false)?.map_err(|source| {
        Error::NoRoute {
            destination,
            source,
        }
    })?;
    let Some(RouteNetlinkMessage::NewRoute(r)) = answer.into_iter().next() else {
        return Err(Error::Decode {
            what: WHAT,
            detail: "no route message in the answer".into(),
        });
    };
    match r.header.kind {
        RouteType::Unicast => {}
        RouteType::Unreachable | RouteType::BlackHole | RouteType::Prohibit | RouteType::Throw => {
            return Err(Error::NoRoute {
                destination,
                source: io::Error::other(format!("a {:?} route", r.header.kind).to_lowercase()),
            })
        }
        other => {
            return Err(Error::Local {
                destination,
                kind: format!("{other:?}").to_lowercase(),
            })
        }
    }
    let mut route = Route {
        destination,
        gateway: None,
        oif: None,
    };
    for a in &r.attributes {
        match a {
            RouteAttribute::Gateway(g) => route.gateway = route_ip(g),
            RouteAttribute::Via(netlink_packet_route::route::RouteVia::Inet6(g)) => {
                route.gateway = Some(IpAddr::V6(*g))
            }
            RouteAttribute::Via(netlink_packet_route::route::RouteVia::Inet(g)) => {
                route.gateway = Some(IpAddr::V4(*g))
            }
            RouteAttribute::Oif(i) => route.oif = Some(*i),
            _ => {}
        }
    }
    Ok(route)
}

/// Every entry of the neighbour table of `address`'s family.
pub fn neighbours(of_family: IpAddr) -> Result<Vec<Neighbour>, Error> {
    const WHAT: &str = "neighbour table (RTM_GETNEIGH)";
    let mut msg = NeighbourMessage::default();
    msg.header.family = family(of_family);
    let answer =
        request(WHAT, RouteNetlinkMessage::GetNeighbour(msg), true)?.map_err(netlink(WHAT))?;
    Ok(answer
        .into_iter()
        .filter_map(|m| match m {
            RouteNetlinkMessage::NewNeighbour(n) => Some(n),
            _ => None,
        })
        .filter_map(|n| {
            let mut address = None;
            let mut mac = None;
            for a in &n.attributes {
                match a {
                    NeighbourAttribute::Destination(NeighbourAddress::Inet(v)) => {
                        address = Some(IpAddr::V4(*v))
                    }
                    NeighbourAttribute::Destination(NeighbourAddress::Inet6(v)) => {
                        address = Some(IpAddr::V6(*v))
                    }
                    NeighbourAttribute::LinkLayerAddress(l) => {
                        mac = <[u8; 6]>::try_from(l.as_slice()).ok()
                    }
                    _ => {}
                }
            }
            Some(Neighbour {
                ifindex: n.header.ifindex,
                address: address?,
                mac,
                state: State::from_kernel(n.header.state),
            })
        })
        .collect())
}

/// The neighbour entry of `address` on interface `ifindex`, if any.
pub fn neighbour(ifindex: u32, address: IpAddr) -> Result<Option<Neighbour>, Error> {
    Ok(neighbours(address)?
        .into_iter()
        .find(|n| n.ifindex == ifindex && n.address == address))
}

/// Makes the kernel resolve `next_hop` on `ifindex`: an empty UDP datagram
/// to its discard port from a connected socket (the kernel queues it behind
/// an ARP request or neighbour solicitation, and sends it once resolved).
pub fn probe(next_hop: IpAddr, ifindex: u32) -> Result<(), Error> {
    let fail = |source| Error::Probe { next_hop, source };
    let (bind, to): (SocketAddr, SocketAddr) = match next_hop {
        IpAddr::V4(_) => (
            (std::net::Ipv4Addr::UNSPECIFIED, 0).into(),
            (next_hop, PROBE_PORT).into(),
        ),
        IpAddr::V6(v6) => (
            (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
            // A link-local next hop (the usual IPv6 gateway) needs its link.
            SocketAddr::V6(SocketAddrV6::new(
                v6,
                PROBE_PORT,
                0,
                if v6.segments()[0] & 0xffc0 == 0xfe80 {
                    ifindex
                } else {
                    0
                },
            )),
        ),
    };
    let s = UdpSocket::bind(bind).map_err(fail)?;
    s.connect(to).map_err(fail)?;
    match s.send(&[]) {
        Ok(_) => Ok(()),
        // An earlier probe's ICMP error, reported on this send: the
        // datagram still left, and so did the resolution.
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => Ok(()),
        Err(e) => Err(fail(e)),
    }
}

/// The name of interface `index` in this namespace (its number if unknown).
fn interface_name(index: u32) -> String {
    rustix::net::socket_with(
        rustix::net::AddressFamily::INET,
        rustix::net::SocketType::DGRAM,
        rustix::net::SocketFlags::CLOEXEC,
        None,
    )
    .ok()
    .and_then(|s| rustix::net::netdevice::index_to_name(&s, index).ok())
    .unwrap_or_else(|| format!("interface #{index}"))
}

/// The route towards `destination`, checked to leave through `interface`
/// (index `ifindex`).
pub fn route_on(interface: &str, ifindex: u32, destination: IpAddr) -> Result<Route, Error> {
    let r = route(destination)?;
    match r.oif {
        Some(o) if o != ifindex => Err(Error::OtherInterface {
            destination,
            interface: interface.to_string(),
            via: interface_name(o),
        }),
        _ => Ok(r),
    }
}

/// The MAC of the next hop on `interface` towards `destination`: the route
/// lookup, the neighbour table, and if the entry is missing or failed,
/// probes and up to `wait` for the kernel to resolve it. An entry that is
/// usable but not confirmed lately is returned at once and probed, so
/// that a change is seen by the next call.
pub fn resolve(interface: &str, destination: IpAddr, wait: Duration) -> Result<Resolved, Error> {
    let ifindex = crate::afpacket::ifindex(interface).ok_or_else(|| Error::NoInterface {
        interface: interface.to_string(),
    })?;
    let route = route_on(interface, ifindex, destination)?;
    let next_hop = route.next_hop();
    let start = Instant::now();
    let mut last_probe: Option<Instant> = None;
    let mut state = "none".to_string();
    loop {
        let entry = neighbour(ifindex, next_hop)?;
        if let Some(n) = &entry {
            state = n.state.to_string();
            if let (true, Some(mac)) = (n.state.usable(), n.mac) {
                let probed = !n.state.confirmed();
                if probed {
                    probe(next_hop, ifindex)?;
                }
                return Ok(Resolved {
                    destination,
                    next_hop,
                    via_gateway: route.gateway.is_some(),
                    mac,
                    state: n.state,
                    probed: probed || last_probe.is_some(),
                });
            }
        }
        let now = Instant::now();
        if last_probe.is_none_or(|t| now.duration_since(t) >= REPROBE) {
            probe(next_hop, ifindex)?;
            last_probe = Some(now);
        }
        if now.duration_since(start) >= wait {
            return Err(Error::Unresolved {
                interface: interface.to_string(),
                destination,
                next_hop,
                waited_ms: wait.as_millis() as u64,
                state,
            });
        }
        std::thread::sleep(
            POLL.min(wait.saturating_sub(now.duration_since(start)))
                .max(Duration::from_millis(1)),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_usable_and_confirmed_as_the_kernel_uses_them() {
        for s in [State::Reachable, State::Permanent, State::NoArp] {
            assert!(s.usable() && s.confirmed(), "{s}");
        }
        for s in [State::Stale, State::Delay, State::Probe] {
            assert!(s.usable() && !s.confirmed(), "{s}");
        }
        for s in [
            State::Incomplete,
            State::Failed,
            State::None,
            State::Other(0x100),
        ] {
            assert!(!s.usable(), "{s}");
        }
        assert_eq!(
            State::from_kernel(NeighbourState::from(0x04u16)),
            State::Stale
        );
        assert_eq!(format_mac(&[2, 0, 0, 0, 0xab, 0xfe]), "02:00:00:00:ab:fe");
    }

    #[test]
    fn loopback_routes_are_local_not_a_next_hop() {
        // The loopback route exists in every namespace, this one included.
        match route("127.0.0.1".parse().unwrap()) {
            Err(Error::Local { kind, .. }) => assert_eq!(kind, "local"),
            other => panic!("expected a local route, got {other:?}"),
        }
    }
}
