//! Addresses, prefixes and MAC addresses as the sections write them, and
//! the classes of address each may not be.

use std::net::IpAddr;

/// Why `a` cannot be a host's own address (a backend, a VIP, an outer
/// source), or `None` when it can: not unspecified, not the broadcast
/// address, not multicast, not loopback (an IPv4-mapped IPv6 address is
/// judged as its IPv4 address).
pub fn not_a_host(a: IpAddr) -> Option<&'static str> {
    let a = match a {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(a, IpAddr::V4),
        v4 => v4,
    };
    if a.is_unspecified() {
        Some("the unspecified address")
    } else if matches!(a, IpAddr::V4(v4) if v4.is_broadcast()) {
        Some("the broadcast address")
    } else if a.is_multicast() {
        Some("a multicast address")
    } else if a.is_loopback() {
        Some("a loopback address")
    } else {
        None
    }
}

/// Why `m` cannot be a station's MAC address (zero, broadcast or
/// multicast: the group bit of the first octet), or `None` when it can.
pub fn not_a_station(m: [u8; 6]) -> Option<&'static str> {
    if m == [0; 6] {
        Some("the zero address")
    } else if m == [0xff; 6] {
        Some("the broadcast address")
    } else if m[0] & 1 == 1 {
        Some("a multicast address (the first octet is odd)")
    } else {
        None
    }
}

/// The ranges no unicast host is in: a prefix reports go to may not
/// overlap them (`0.0.0.0/0` would send reports anywhere, broadcast
/// included).
pub(super) const NOT_UNICAST: [(&str, IpAddr, u8); 5] = [
    (
        "\"this network\" (0.0.0.0/8)",
        IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
        8,
    ),
    (
        "multicast (224.0.0.0/4)",
        IpAddr::V4(std::net::Ipv4Addr::new(224, 0, 0, 0)),
        4,
    ),
    (
        "reserved and broadcast (240.0.0.0/4)",
        IpAddr::V4(std::net::Ipv4Addr::new(240, 0, 0, 0)),
        4,
    ),
    (
        "the unspecified address (::)",
        IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
        128,
    ),
    (
        "multicast (ff00::/8)",
        IpAddr::V6(std::net::Ipv6Addr::new(0xff00, 0, 0, 0, 0, 0, 0, 0)),
        8,
    ),
];

/// Whether two prefixes share an address: the shorter contains the other.
pub(super) fn overlaps((a, la): (IpAddr, u8), (b, lb): (IpAddr, u8)) -> bool {
    let bits = |x: IpAddr| match x {
        IpAddr::V4(v) => u128::from(u32::from(v)) << 96,
        IpAddr::V6(v) => u128::from(v),
    };
    if a.is_ipv4() != b.is_ipv4() {
        return false;
    }
    let l = u32::from(la.min(lb));
    let mask = if l == 0 { 0 } else { u128::MAX << (128 - l) };
    bits(a) & mask == bits(b) & mask
}

/// Parses `aa:bb:cc:dd:ee:ff`.
pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut m = [0u8; 6];
    let mut parts = s.split(':');
    for b in &mut m {
        *b = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(m)
}

/// Parses `addr/len`.
pub fn parse_prefix(s: &str) -> Option<(IpAddr, u8)> {
    let (a, l) = s.split_once('/')?;
    let a: IpAddr = a.trim().parse().ok()?;
    let l: u8 = l.trim().parse().ok()?;
    let max = if a.is_ipv4() { 32 } else { 128 };
    (l <= max).then_some((a, l))
}
