//! The outer headers copied from a [`Template`] are byte for byte those
//! [`encapsulate`] builds for the same packet: for inner and outer IPv4
//! and IPv6, every TOS, DF or not, random addresses, TTLs, MACs, lengths,
//! flow hashes and headroom (too little included), and for fragments.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use packet::build::{Frame, Ip};
use packet::gre::{encapsulate, encapsulate_templated, Outer, Template};
use packet::{flow, parse_frame};
use proptest::prelude::*;

fn addr(v6: bool, bytes: [u8; 16]) -> IpAddr {
    if v6 {
        IpAddr::V6(Ipv6Addr::from(bytes))
    } else {
        IpAddr::V4(Ipv4Addr::new(bytes[0], bytes[1], bytes[2], bytes[3]))
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4000))]
    #[test]
    fn templated_headers_are_the_built_ones(
        inner_v6 in any::<bool>(), outer_v6 in any::<bool>(), tos in any::<u8>(),
        df in any::<bool>(), ttl in any::<u8>(), macs in any::<([u8; 6], [u8; 6])>(),
        a in any::<[[u8; 16]; 4]>(), hash in any::<u64>(), tcp in any::<bool>(),
        payload in prop::collection::vec(any::<u8>(), 0..1500), headroom in 0usize..96,
        pad in 0usize..8,
    ) {
        let (s, d) = (addr(inner_v6, a[0]), addr(inner_v6, a[1]));
        let mut f = if tcp {
            Frame::tcp(s, d, 4000, 80, 0x10, &payload)
        } else {
            Frame::udp(s, d, 4000, 53, &payload)
        };
        match &mut f.ip {
            Ip::V4(r) => { r.tos = tos; r.dont_frag = df }
            Ip::V6(r) => r.traffic_class = tos,
        }
        let frame = f.to_bytes();
        let p = parse_frame(&frame).unwrap();
        let mut buf = vec![0u8; headroom];
        buf.extend_from_slice(&frame);
        buf.extend(std::iter::repeat_n(0xee, pad)); // link padding
        let outer = Outer {
            eth_src: macs.0,
            eth_dst: macs.1,
            src: flow::from_ip(addr(outer_v6, a[2])),
            dst: flow::from_ip(addr(outer_v6, a[3])),
            ttl,
        };
        let t = Template::new(&outer).unwrap();
        prop_assert_eq!(t.is_v4(), !outer_v6);
        let (mut built, mut copied) = (buf.clone(), buf.clone());
        let want = encapsulate(&mut built, headroom, &p, &outer, hash);
        let got = encapsulate_templated(&mut copied, headroom, &p, &t, hash);
        match (&want, &got) {
            (Ok(w), Ok(g)) => {
                prop_assert_eq!(w, g);
                prop_assert_eq!(&built[w.clone()], &copied[g.clone()]);
                // Outside the range, nothing else was written either.
                prop_assert_eq!(&built, &copied);
            }
            (Err(w), Err(g)) => prop_assert_eq!(w, g),
            _ => prop_assert!(false, "built {:?}, copied {:?}", want, got),
        }
    }
}

#[test]
fn a_template_refuses_mixed_families() {
    let outer = Outer {
        eth_src: [2, 0, 0, 0, 0, 1],
        eth_dst: [2, 0, 0, 0, 0, 2],
        src: flow::from_ip("10.0.0.1".parse().unwrap()),
        dst: flow::from_ip("fd00::2".parse().unwrap()),
        ttl: 64,
    };
    assert_eq!(
        Template::new(&outer).unwrap_err(),
        packet::gre::EncapError::MixedFamilies
    );
}
