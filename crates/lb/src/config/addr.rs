//! Addresses, prefixes and MAC addresses as the sections write them, and
//! the classes of address each may not be.

use std::net::IpAddr;

use super::{problem, Problem};

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

/// The ranges no host's own address is in: [`NOT_UNICAST`] and loopback
/// (an outer source from them would send the backends' answers and ICMP
/// errors nowhere, or back into the backend itself).
pub(super) const NOT_A_SOURCE: [(&str, IpAddr, u8); 7] = [
    NOT_UNICAST[0],
    NOT_UNICAST[1],
    NOT_UNICAST[2],
    NOT_UNICAST[3],
    NOT_UNICAST[4],
    (
        "loopback (127.0.0.0/8)",
        IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 0)),
        8,
    ),
    (
        "loopback (::1)",
        IpAddr::V6(std::net::Ipv6Addr::LOCALHOST),
        128,
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

/// Parses `aa:bb:cc:dd:ee:ff`: six octets of one or two hex digits each,
/// nothing else (no sign, no space: the integer parser would take
/// `+2` as 2).
pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut m = [0u8; 6];
    let mut parts = s.split(':');
    for b in &mut m {
        let part = parts.next()?;
        if part.is_empty() || part.len() > 2 || !part.bytes().all(|c| c.is_ascii_hexdigit()) {
            return None;
        }
        *b = u8::from_str_radix(part, 16).ok()?;
    }
    parts.next().is_none().then_some(m)
}

/// Parses `addr/len`, the length in decimal digits only (the integer
/// parser would take `/+16` as 16). Host bits may be set: the caller
/// refuses them where it matters ([`network_of`]).
pub fn parse_prefix(s: &str) -> Option<(IpAddr, u8)> {
    let (a, l) = s.split_once('/')?;
    let a: IpAddr = a.trim().parse().ok()?;
    let l = l.trim();
    if l.is_empty() || l.len() > 3 || !l.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let l: u8 = l.parse().ok()?;
    let max = if a.is_ipv4() { 32 } else { 128 };
    (l <= max).then_some((a, l))
}

/// The prefix `a/len` with its host bits cleared.
pub(super) fn network_of(a: IpAddr, len: u8) -> IpAddr {
    match a {
        IpAddr::V4(v) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
            IpAddr::V4((u32::from(v) & mask).into())
        }
        IpAddr::V6(v) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
            IpAddr::V6((u128::from(v) & mask).into())
        }
    }
}

/// A prefix as a section writes it: parsed ([`parse_prefix`]), without
/// host bits (`74.125.0.1/16` is refused naming `74.125.0.0/16`: it says
/// one thing and matches another). `example` shows the form; `key` names it, made only for an error (a file may hold a
/// million prefixes).
pub(super) fn check_prefix(
    key: impl FnOnce() -> String,
    text: &str,
    example: &str,
) -> Result<(IpAddr, u8), Problem> {
    let Some((a, l)) = parse_prefix(text) else {
        return problem(
            key(),
            format!(
                "{text:?} is not a prefix like \"{example}\" (an address, /, a length in digits)"
            ),
        );
    };
    let net = network_of(a, l);
    if net != a {
        return problem(
            key(),
            format!("{text:?} has host bits set: write the prefix as \"{net}/{l}\""),
        );
    }
    Ok((a, l))
}

/// The first of `ranges` that `prefix` shares an address with.
pub(super) fn overlapping(
    prefix: (IpAddr, u8),
    ranges: &[(&'static str, IpAddr, u8)],
) -> Option<&'static str> {
    ranges
        .iter()
        .find(|(_, a, l)| overlaps(prefix, (*a, *l)))
        .map(|(what, _, _)| *what)
}
