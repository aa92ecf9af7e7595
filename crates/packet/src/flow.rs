//! The 5-tuple flow key and its hash.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// A flow's 5-tuple. IPv4 addresses are stored IPv4-mapped (`::ffff:a.b.c.d`)
/// so one key type serves both families.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct FlowKey {
    /// Source address (IPv4-mapped for IPv4).
    pub src: [u8; 16],
    /// Destination address (IPv4-mapped for IPv4).
    pub dst: [u8; 16],
    /// Source port (0 where the protocol has none, or for a fragment's
    /// 3-tuple).
    pub src_port: u16,
    /// Destination port.
    pub dst_port: u16,
    /// IP protocol.
    pub proto: u8,
}

/// `a.b.c.d` as an IPv4-mapped IPv6 address.
///
/// Built as one 128-bit value: written byte by byte into an array, it was
/// then read back whole by the parser's caller, a load the CPU cannot
/// forward from those stores.
#[inline]
pub fn mapped(v4: [u8; 4]) -> [u8; 16] {
    ((0xffff_u128 << 32) | u128::from(u32::from_be_bytes(v4))).to_be_bytes()
}

/// The IPv4 address inside an IPv4-mapped address, if it is one.
pub fn unmapped(a: &[u8; 16]) -> Option<[u8; 4]> {
    (a[..10] == [0; 10] && a[10] == 0xff && a[11] == 0xff).then(|| [a[12], a[13], a[14], a[15]])
}

/// Whether `src` (key form) can never be a packet's source on the wire,
/// so that a datagram carrying it is to be dropped rather than answered
/// or forwarded. IPv4 (RFC 1122 section 3.2.1.3, RFC 6890): "this
/// network" 0.0.0.0/8, loopback 127.0.0.0/8, multicast 224.0.0.0/4,
/// reserved 240.0.0.0/4 and the limited broadcast 255.255.255.255 (inside
/// 240/4). IPv6 (RFC 4291 sections 2.5.2, 2.5.3, 2.7): the unspecified
/// address ::, loopback ::1 and multicast ff00::/8. An IPv4-mapped source
/// (`::ffff:a.b.c.d`, which is also how an IPv4 source is keyed) is
/// judged by the IPv4 rules on `a.b.c.d`.
#[inline]
pub fn martian_source(src: &[u8; 16]) -> bool {
    match unmapped(src) {
        Some([a, ..]) => a == 0 || a == 127 || a >= 224,
        None => {
            let x = u128::from_be_bytes(*src);
            x <= 1 || src[0] == 0xff
        }
    }
}

/// An address as stored in a key, for display.
pub fn to_ip(a: &[u8; 16]) -> IpAddr {
    match unmapped(a) {
        Some(v4) => IpAddr::V4(Ipv4Addr::from(v4)),
        None => IpAddr::V6(Ipv6Addr::from(*a)),
    }
}

/// An address in key form.
pub fn from_ip(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => mapped(v4.octets()),
        IpAddr::V6(v6) => v6.octets(),
    }
}

#[inline]
fn fold_mul(a: u64, b: u64) -> u64 {
    let p = u128::from(a) * u128::from(b);
    (p as u64) ^ ((p >> 64) as u64)
}

impl FlowKey {
    /// A key from IPv4 addresses.
    pub fn v4(src: [u8; 4], dst: [u8; 4], src_port: u16, dst_port: u16, proto: u8) -> Self {
        FlowKey {
            src: mapped(src),
            dst: mapped(dst),
            src_port,
            dst_port,
            proto,
        }
    }

    /// Whether both addresses are IPv4.
    pub fn is_v4(&self) -> bool {
        unmapped(&self.dst).is_some()
    }

    /// The same flow seen from the other end.
    pub fn reversed(&self) -> Self {
        FlowKey {
            src: self.dst,
            dst: self.src,
            src_port: self.dst_port,
            dst_port: self.src_port,
            proto: self.proto,
        }
    }

    /// The 3-tuple (addresses and protocol, ports zeroed) used for fragments.
    pub fn three_tuple(&self) -> Self {
        FlowKey {
            src_port: 0,
            dst_port: 0,
            ..*self
        }
    }

    /// A fast 64-bit hash with a seed (folded 64x64->128 multiplies, as in
    /// wyhash and foldhash: three multiplies for the whole key). Different
    /// seeds give independent hashes: steering and connection tracking use
    /// different ones.
    #[inline]
    pub fn hash(&self, seed: u64) -> u64 {
        let w = |b: &[u8; 16], i: usize| {
            u64::from_le_bytes([
                b[i],
                b[i + 1],
                b[i + 2],
                b[i + 3],
                b[i + 4],
                b[i + 5],
                b[i + 6],
                b[i + 7],
            ])
        };
        let tail = (u64::from(self.src_port) << 24)
            | (u64::from(self.dst_port) << 8)
            | u64::from(self.proto);
        let a = fold_mul(
            w(&self.src, 0) ^ 0xa076_1d64_78bd_642f ^ seed,
            w(&self.src, 8) ^ 0xe703_7ed1_a0b4_28db,
        );
        let b = fold_mul(
            w(&self.dst, 0) ^ 0x8ebc_6af0_9c88_c6e3,
            w(&self.dst, 8) ^ 0x5899_65cc_7537_4cc3 ^ seed,
        );
        fold_mul(
            a ^ tail ^ 0x1d8e_4e27_c47d_124f,
            b ^ seed.rotate_left(32) ^ 0x9e37_79b9_7f4a_7c15,
        )
    }
}

impl std::fmt::Display for FlowKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}:{} -> {}:{}",
            self.proto,
            to_ip(&self.src),
            self.src_port,
            to_ip(&self.dst),
            self.dst_port
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapped_is_the_std_mapping() {
        // Addresses whose bytes differ, and the edges.
        for v4 in [
            [0, 0, 0, 0],
            [255; 4],
            [1, 2, 3, 4],
            [192, 0, 2, 255],
            [10, 128, 7, 9],
        ] {
            let want = std::net::Ipv4Addr::from(v4).to_ipv6_mapped().octets();
            assert_eq!(mapped(v4), want);
            assert_eq!(unmapped(&mapped(v4)), Some(v4));
        }
    }

    /// The special-purpose blocks that may not be a source (RFC 1122
    /// 3.2.1.3, RFC 6890's registry, RFC 4291), at their edges, and the
    /// addresses around them that may.
    #[test]
    fn martian_sources_are_the_rfcs_blocks() {
        let ip = |s: &str| from_ip(s.parse().unwrap());
        for s in [
            "0.0.0.0",
            "0.255.255.255",
            "127.0.0.1",
            "127.255.255.255",
            "224.0.0.1",
            "239.255.255.255",
            "240.0.0.0",
            "255.255.255.254",
            "255.255.255.255",
            "::",
            "::1",
            "ff02::1",
            "ff00::",
            "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            // An IPv6 packet from a mapped martian is as martian.
            "::ffff:127.0.0.1",
            "::ffff:0.0.0.0",
        ] {
            assert!(martian_source(&ip(s)), "{s} taken as a source");
        }
        for s in [
            "1.0.0.0",
            "126.255.255.255",
            "128.0.0.0",
            "223.255.255.255",
            "10.0.0.1",
            "192.0.2.1",
            "198.51.100.7",
            "::2",
            "2001:db8::1",
            "fe80::1",
            "feff::1",
            "::ffff:198.51.100.1",
        ] {
            assert!(!martian_source(&ip(s)), "{s} refused as a source");
        }
    }

    #[test]
    fn hash_distinguishes_fields_and_spreads() {
        let k = FlowKey::v4([10, 0, 0, 1], [10, 0, 0, 2], 1234, 80, 6);
        let mut seen = std::collections::HashSet::new();
        for v in [
            k,
            k.reversed(),
            FlowKey {
                src_port: 1235,
                ..k
            },
            FlowKey { dst_port: 81, ..k },
            FlowKey { proto: 17, ..k },
            k.three_tuple(),
        ] {
            assert!(seen.insert(v.hash(0)), "{v}");
        }
        assert_ne!(k.hash(0), k.hash(1));
        // Low bits spread over 16 buckets for sequential ports.
        let mut buckets = [0u32; 16];
        for p in 0..16_000u16 {
            buckets[(FlowKey { src_port: p, ..k }.hash(7) & 15) as usize] += 1;
        }
        assert!(
            buckets.iter().all(|&c| (800..1200).contains(&c)),
            "{buckets:?}"
        );
        assert_eq!(to_ip(&k.src).to_string(), "10.0.0.1");
        assert!(k.is_v4());
    }
}
