//! Per-flow entropy in the outer headers (`gre::Spread`): the outer source
//! comes from a prefix by the flow hash, the flow hash rides in the GRE key,
//! and the outer IPv4 header stays valid (checked with etherparse, an
//! implementation we did not write).

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use etherparse::{NetHeaders, PacketHeaders};
use packet::build::Frame;
use packet::gre::{
    decapsulate, encapsulate_spread, Outer, PrefixError, SourcePrefix, Spread,
    FRAGMENT_REDIRECT_KEY,
};
use packet::{flow, parse_frame};
use proptest::prelude::*;

const SEED: u64 = 0x6d61_676c_6576;

fn outer(dst: IpAddr, src: IpAddr) -> Outer {
    Outer {
        eth_src: [2, 0, 0, 0, 0, 1],
        eth_dst: [2, 0, 0, 0, 0, 0xfe],
        src: flow::from_ip(src),
        dst: flow::from_ip(dst),
        ttl: 64,
    }
}

fn prefix(s: &str) -> SourcePrefix {
    let (a, l) = s.split_once('/').unwrap();
    SourcePrefix::new(a.parse().unwrap(), l.parse().unwrap()).unwrap()
}

/// Encapsulates `frame` (placed after 64 bytes of headroom) toward `o`
/// with `spread`; returns the GRE frame and the flow hash used.
fn encap(frame: &[u8], o: &Outer, spread: &Spread) -> (Vec<u8>, u64) {
    let mut buf = vec![0u8; 64];
    buf.extend_from_slice(frame);
    let p = parse_frame(frame).unwrap();
    let hash = p.flow.hash(SEED);
    let r = encapsulate_spread(&mut buf, 64, &p, o, hash, spread).unwrap();
    (buf[r].to_vec(), hash)
}

/// The outer source, GRE key and outer IPv4 checksum verdict (etherparse).
fn outer_fields(f: &[u8]) -> (IpAddr, Option<u32>, bool) {
    let d = decapsulate(f).unwrap();
    let h = PacketHeaders::from_ethernet_slice(f).unwrap();
    let ok = match h.net.unwrap() {
        NetHeaders::Ipv4(ip, _) => ip.header_checksum == ip.calc_header_checksum(),
        NetHeaders::Ipv6(_, _) => true,
    };
    (flow::to_ip(&d.outer_src), d.key, ok)
}

fn tcp_flow() -> impl Strategy<Value = ([u8; 4], [u8; 4], u16, u16)> {
    any::<([u8; 4], [u8; 4], u16, u16)>()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn the_outer_source_is_a_function_of_the_flow_inside_the_prefix(
        (s, d, sp, dp) in tcp_flow(),
        payloads in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..200), 1..5),
        len in 16u8..=32,
    ) {
        let net = Ipv4Addr::from(u32::from_be_bytes([198, 18, 7, 9]) & (u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0)));
        let pfx = SourcePrefix::new(net.into(), len).unwrap();
        let spread = Spread { v4: Some(pfx), v6: None };
        let o = outer("10.1.0.1".parse().unwrap(), "10.0.0.1".parse().unwrap());
        let mut seen = HashSet::new();
        for (i, pl) in payloads.iter().enumerate() {
            let f = Frame::tcp(Ipv4Addr::from(s).into(), Ipv4Addr::from(d).into(), sp, dp, if i == 0 { 0x02 } else { 0x10 }, pl).to_bytes();
            let (g, hash) = encap(&f, &o, &spread);
            let (src, key, ok) = outer_fields(&g);
            prop_assert!(ok, "outer IPv4 checksum");
            prop_assert!(pfx.contains(&flow::from_ip(src)), "{src} in {net}/{len}");
            let want = hash as u32;
            let want = if want == FRAGMENT_REDIRECT_KEY { want ^ 1 } else { want };
            prop_assert_eq!(key, Some(want), "the GRE key carries the flow hash");
            prop_assert_eq!(src, flow::to_ip(&pfx.pick(hash)));
            // The inner packet is carried unchanged.
            let d = decapsulate(&g).unwrap();
            let p = parse_frame(&f).unwrap();
            prop_assert_eq!(&g[d.inner.clone()], &f[p.l3_offset..p.l3_offset + p.l3_len]);
            seen.insert((src, key));
        }
        prop_assert_eq!(seen.len(), 1, "every packet of the flow: one source, one key");
    }

    #[test]
    fn ipv6_outer_sources_stay_in_their_prefix(
        s in any::<[u8; 16]>(), d in any::<[u8; 16]>(), sp in any::<u16>(), len in 64u8..=128,
    ) {
        let (mut s, mut d) = (s, d);
        s[0] = 0x20;
        d[0] = 0x20;
        let net = u128::from_be_bytes([0xfd, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0, 0]);
        let net = Ipv6Addr::from(net);
        let pfx = SourcePrefix::new(net.into(), len).unwrap();
        let spread = Spread { v4: Some(prefix("198.18.0.0/24")), v6: Some(pfx) };
        let o = outer("fd00:1::1".parse().unwrap(), "fd00::1".parse().unwrap());
        let f = Frame::udp(Ipv6Addr::from(s).into(), Ipv6Addr::from(d).into(), sp, 53, b"q").to_bytes();
        let (g, hash) = encap(&f, &o, &spread);
        let (src, key, _) = outer_fields(&g);
        prop_assert!(pfx.contains(&flow::from_ip(src)));
        prop_assert_eq!(key, Some(Spread::key(hash)));
    }
}

#[test]
fn a_thousand_flows_spread_over_a_slash_24() {
    let pfx = prefix("198.18.5.0/24");
    let spread = Spread {
        v4: Some(pfx),
        v6: None,
    };
    let o = outer("10.1.0.1".parse().unwrap(), "10.0.0.1".parse().unwrap());
    let mut rng = 0x1234_5678_9abc_def0u64;
    let mut next = || {
        // xorshift: reproducible "random" flows.
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut by_src: HashMap<IpAddr, usize> = HashMap::new();
    for _ in 0..1000 {
        let r = next();
        let client = Ipv4Addr::from((r >> 32) as u32 | 0x0100_0000);
        let f = Frame::tcp(
            client.into(),
            "192.0.2.80".parse().unwrap(),
            r as u16,
            80,
            0x02,
            b"",
        )
        .to_bytes();
        let (g, _) = encap(&f, &o, &spread);
        let (src, key, ok) = outer_fields(&g);
        assert!(ok && key.is_some());
        assert!(pfx.contains(&flow::from_ip(src)), "{src}");
        *by_src.entry(src).or_default() += 1;
    }
    // 1,000 balls in 256 bins leave about 5 empty; 200 is far below.
    assert!(
        by_src.len() >= 200,
        "only {} distinct sources",
        by_src.len()
    );
    let most = by_src.values().max().copied().unwrap_or(0);
    assert!(most <= 16, "one source has {most} of 1,000 flows");
}

#[test]
fn without_a_prefix_of_its_family_the_source_stays() {
    // Only an IPv6 prefix: IPv4 backends keep the configured source (the
    // key is still there).
    let spread = Spread {
        v4: None,
        v6: Some(prefix("fd00:7::/64")),
    };
    let o = outer("10.1.0.1".parse().unwrap(), "10.0.0.1".parse().unwrap());
    let f = Frame::udp(
        "1.2.3.4".parse().unwrap(),
        "192.0.2.80".parse().unwrap(),
        5,
        53,
        b"x",
    )
    .to_bytes();
    let (g, hash) = encap(&f, &o, &spread);
    let (src, key, ok) = outer_fields(&g);
    assert_eq!(src, "10.0.0.1".parse::<IpAddr>().unwrap());
    assert_eq!(key, Some(Spread::key(hash)));
    assert!(ok);
}

#[test]
fn the_redirect_key_is_never_a_flow_key() {
    let h = u64::from(FRAGMENT_REDIRECT_KEY) | (7 << 32);
    assert_ne!(Spread::key(h), FRAGMENT_REDIRECT_KEY);
    assert_eq!(Spread::key(h), FRAGMENT_REDIRECT_KEY ^ 1);
    assert_eq!(Spread::key(0xdead_beef_0000_0042), 0x42);
}

#[test]
fn prefixes_are_checked() {
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    assert_eq!(
        SourcePrefix::new(ip("10.0.0.0"), 8),
        Err(PrefixError::TooShort {
            len: 8,
            min: 16,
            max: 32
        })
    );
    assert_eq!(
        SourcePrefix::new(ip("10.0.0.0"), 33),
        Err(PrefixError::TooLong { len: 33, max: 32 })
    );
    let e = SourcePrefix::new(ip("10.0.1.5"), 24).unwrap_err();
    assert_eq!(
        e,
        PrefixError::HostBits {
            len: 24,
            network: ip("10.0.1.0")
        }
    );
    assert!(e.to_string().contains("10.0.1.0/24"), "{e}");
    assert!(matches!(
        SourcePrefix::new(ip("fd00::"), 48),
        Err(PrefixError::TooShort { min: 64, .. })
    ));
    let one = SourcePrefix::new(ip("10.0.0.7"), 32).unwrap();
    assert_eq!(one.size(), 1);
    assert_eq!(one.pick(u64::MAX), flow::from_ip(ip("10.0.0.7")));
    let p = SourcePrefix::new(ip("10.9.0.0"), 16).unwrap();
    assert!(p.is_v4() && p.prefix_len() == 16 && p.size() == 65_536);
    assert_eq!(p.pick(0x1_0203), flow::from_ip(ip("10.9.2.3")));
    assert!(!p.contains(&flow::from_ip(ip("10.10.0.0"))));
    let p6 = SourcePrefix::new(ip("fd00:7::"), 64).unwrap();
    assert!(!p6.is_v4());
    assert_eq!(p6.size(), u64::MAX);
    assert_eq!(
        p6.pick(0x0102_0304_0506_0708),
        flow::from_ip(ip("fd00:7::102:304:506:708"))
    );
}
