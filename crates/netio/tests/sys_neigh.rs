//! Next-hop resolution from the kernel ([`netio::neigh`]) in throwaway
//! namespaces: a load balancer's namespace `lb` whose interface `n0` faces
//! a gateway namespace `gw` (interface `g0`, a known MAC), with the backend
//! subnets routed through the gateway.
//!
//! ```text
//! lb: n0 10.203.0.2/24 --veth-- g0 10.203.0.1/24 (gw)
//!     10.203.8.0/24 via 10.203.0.1       (the gateway answers ARP)
//!     10.203.9.0/24 via 10.203.0.9       (nobody has 10.203.0.9)
//!     fd00:203::2/64 -- fd00:203::1, fd00:203:8::/64 via fd00:203::1
//! ```
//!
//! System tests: they need root and iproute2, and fail naming what is missing.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use netio::neigh::{self, Error};
use netns::Netns;

const N0_MAC: &str = "02:00:00:00:5a:01";
const G0_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x5a, 0xfe];
const G0_NEW_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x5a, 0xfd];

struct Net {
    lb: Netns,
    gw: Netns,
}

fn net(tag: &str) -> Net {
    systest::require_netns();
    let id = std::process::id() % 100_000;
    let lb = Netns::new(&format!("fpnl-{tag}-{id}")).unwrap();
    let gw = Netns::new(&format!("fpng-{tag}-{id}")).unwrap();
    netns::veth(&lb, "n0", N0_MAC, &gw, "g0", &neigh::format_mac(&G0_MAC)).unwrap();
    lb.ip(&["addr", "add", "10.203.0.2/24", "dev", "n0"])
        .unwrap();
    gw.ip(&["addr", "add", "10.203.0.1/24", "dev", "g0"])
        .unwrap();
    lb.ip(&["addr", "add", "fd00:203::2/64", "dev", "n0", "nodad"])
        .unwrap();
    gw.ip(&["addr", "add", "fd00:203::1/64", "dev", "g0", "nodad"])
        .unwrap();
    lb.ip(&["route", "add", "10.203.8.0/24", "via", "10.203.0.1"])
        .unwrap();
    lb.ip(&["route", "add", "10.203.9.0/24", "via", "10.203.0.9"])
        .unwrap();
    lb.ip(&["route", "add", "fd00:203:8::/64", "via", "fd00:203::1"])
        .unwrap();
    Net { lb, gw }
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
#[ignore = "system test: root, namespaces"]
fn the_gateways_mac_is_found_from_the_route_and_the_neighbour_table() {
    let n = net("found");
    // The neighbour table starts empty: resolution has to be triggered.
    let before =
        n.lb.inside(|| neigh::neighbour(netio::afpacket::ifindex("n0").unwrap(), ip("10.203.0.1")))
            .unwrap()
            .unwrap();
    assert_eq!(before, None, "no entry before the first resolution");
    let r =
        n.lb.inside(|| neigh::resolve("n0", ip("10.203.8.5"), Duration::from_secs(3)))
            .unwrap()
            .unwrap();
    assert_eq!(r.mac, G0_MAC);
    assert_eq!(r.next_hop, ip("10.203.0.1"));
    assert!(r.via_gateway && r.probed, "{r:?}");
    // The route lookup alone, as `ip route get` shows it.
    let route =
        n.lb.inside(|| neigh::route(ip("10.203.8.5")))
            .unwrap()
            .unwrap();
    assert_eq!(route.gateway, Some(ip("10.203.0.1")));
    // On-link: the backend itself is the next hop (here the gateway's own
    // address, which answers).
    let r =
        n.lb.inside(|| neigh::resolve("n0", ip("10.203.0.1"), Duration::from_secs(3)))
            .unwrap()
            .unwrap();
    assert!(!r.via_gateway && r.mac == G0_MAC, "{r:?}");
    // IPv6: a neighbour solicitation instead of ARP.
    let r =
        n.lb.inside(|| neigh::resolve("n0", ip("fd00:203:8::5"), Duration::from_secs(3)))
            .unwrap()
            .unwrap();
    assert_eq!((r.next_hop, r.mac), (ip("fd00:203::1"), G0_MAC));
}

#[test]
#[ignore = "system test: root, namespaces"]
fn a_missing_gateway_is_a_clear_error() {
    let n = net("missing");
    // Routed through 10.203.0.9, which nobody has: ARP goes unanswered.
    let t = Instant::now();
    let e =
        n.lb.inside(|| neigh::resolve("n0", ip("10.203.9.5"), Duration::from_millis(1500)))
            .unwrap()
            .unwrap_err();
    let waited = t.elapsed();
    match &e {
        Error::Unresolved {
            interface,
            next_hop,
            destination,
            ..
        } => {
            assert_eq!(interface, "n0");
            assert_eq!(*next_hop, ip("10.203.0.9"));
            assert_eq!(*destination, ip("10.203.9.5"));
        }
        other => panic!("expected Unresolved, got {other:?}"),
    }
    let text = e.to_string();
    assert!(
        text.contains("10.203.0.9") && text.contains("n0") && text.contains("1500 ms"),
        "{text}"
    );
    assert!(
        waited >= Duration::from_millis(1500) && waited < Duration::from_secs(5),
        "bounded wait: {waited:?}"
    );
    // No route at all (no default route in the namespace).
    let e =
        n.lb.inside(|| neigh::resolve("n0", ip("10.250.0.1"), Duration::from_secs(1)))
            .unwrap()
            .unwrap_err();
    assert!(matches!(e, Error::NoRoute { .. }), "{e:?}");
    assert!(e.to_string().contains("10.250.0.1"), "{e}");
    // A route through another interface than the one asked about.
    netns::veth(
        &n.lb,
        "d0",
        "02:00:00:00:5a:10",
        &n.lb,
        "d1",
        "02:00:00:00:5a:11",
    )
    .unwrap();
    n.lb.ip(&["addr", "add", "10.204.0.2/24", "dev", "d0"])
        .unwrap();
    let e =
        n.lb.inside(|| neigh::resolve("n0", ip("10.204.0.7"), Duration::from_secs(1)))
            .unwrap()
            .unwrap_err();
    assert!(
        matches!(&e, Error::OtherInterface { via, .. } if via == "d0"),
        "{e:?}"
    );
    // An interface that does not exist.
    let e =
        n.lb.inside(|| neigh::resolve("nope0", ip("10.203.8.5"), Duration::from_secs(1)))
            .unwrap()
            .unwrap_err();
    assert!(matches!(e, Error::NoInterface { .. }), "{e:?}");
}

/// Resolves every 200 ms until the MAC is `want`, at most `limit`; how long
/// it took.
fn until_mac(n: &Net, want: [u8; 6], limit: Duration) -> Duration {
    let t = Instant::now();
    loop {
        let r =
            n.lb.inside(|| neigh::resolve("n0", ip("10.203.8.5"), Duration::from_secs(1)))
                .unwrap();
        if r.as_ref().is_ok_and(|r| r.mac == want) {
            return t.elapsed();
        }
        assert!(
            t.elapsed() < limit,
            "still {r:?} after {limit:?}, expected {}",
            neigh::format_mac(&want)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
#[ignore = "system test: root, namespaces"]
fn a_changed_neighbour_mac_is_picked_up() {
    let n = net("changed");
    until_mac(&n, G0_MAC, Duration::from_secs(5));
    // The entry changed in the kernel's table (as `ip neigh replace` or a
    // routing daemon would): the next look sees it.
    n.lb.ip(&[
        "neigh",
        "replace",
        "10.203.0.1",
        "lladdr",
        &neigh::format_mac(&G0_NEW_MAC),
        "nud",
        "reachable",
        "dev",
        "n0",
    ])
    .unwrap();
    until_mac(&n, G0_NEW_MAC, Duration::from_secs(2));
    n.lb.ip(&["neigh", "flush", "dev", "n0"]).unwrap();
    until_mac(&n, G0_MAC, Duration::from_secs(5));
    // The gateway changes its MAC and announces it (gratuitous ARP, as
    // routers and VRRP do; arp_notify here): seen at the next look.
    n.gw.sysctl("net.ipv4.conf.g0.arp_notify", "1").unwrap();
    n.gw.ip(&[
        "link",
        "set",
        "dev",
        "g0",
        "address",
        &neigh::format_mac(&G0_NEW_MAC),
    ])
    .unwrap();
    let took = until_mac(&n, G0_NEW_MAC, Duration::from_secs(5));
    eprintln!("an announced MAC change was picked up in {took:.1?}");
    // It changes back and says nothing. The kernel believes a confirmed
    // entry for its reachable time, then each look probes the stale entry:
    // the kernel's unicast probes to the old MAC fail and a broadcast
    // request finds the new one. At default settings that takes up to
    // about a minute (reachable time 15-45 s, then 5 s + 3 probes); the
    // test shortens the kernel's timers to keep it short.
    n.gw.sysctl("net.ipv4.conf.g0.arp_notify", "0").unwrap();
    n.lb.sysctl("net.ipv4.neigh.n0.base_reachable_time_ms", "1000")
        .unwrap();
    n.lb.sysctl("net.ipv4.neigh.n0.delay_first_probe_time", "1")
        .unwrap();
    n.gw.ip(&[
        "link",
        "set",
        "dev",
        "g0",
        "address",
        &neigh::format_mac(&G0_MAC),
    ])
    .unwrap();
    let took = until_mac(&n, G0_MAC, Duration::from_secs(30));
    eprintln!("a silent MAC change was picked up in {took:.1?}");
}
