//! Completing the TCP and UDP checksums a local sender left partial
//! (`checksum::complete_partial`), checked against etherparse's checksums
//! (an implementation we did not write): a partial checksum becomes exactly
//! the valid one, a valid packet is never changed, and a corrupt one (neither
//! valid nor partial) is never "completed".

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use etherparse::{NetHeaders, PacketHeaders, TransportHeader};
use packet::build::Frame;
use packet::checksum::{complete_partial, Partial};
use packet::{parse_frame, proto};
use proptest::prelude::*;

/// One's-complement sum of 16-bit big-endian words, written out here
/// rather than taken from the crate under test.
fn ones_sum(words: impl IntoIterator<Item = u16>) -> u16 {
    let mut s: u32 = 0;
    for w in words {
        s += u32::from(w);
        s = (s & 0xffff) + (s >> 16);
    }
    s as u16
}

fn words(b: &[u8]) -> impl Iterator<Item = u16> + '_ {
    b.chunks(2)
        .map(|c| u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]))
}

/// What Linux leaves in the field of a checksum it offloads: the folded
/// pseudo-header sum (`~csum_tcpudp_magic`).
fn pseudo_field(src: IpAddr, dst: IpAddr, protocol: u8, len: usize) -> u16 {
    let mut ph = Vec::new();
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            ph.extend_from_slice(&s.octets());
            ph.extend_from_slice(&d.octets());
            ph.extend_from_slice(&[0, protocol]);
            ph.extend_from_slice(&(len as u16).to_be_bytes());
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            ph.extend_from_slice(&s.octets());
            ph.extend_from_slice(&d.octets());
            ph.extend_from_slice(&(len as u32).to_be_bytes());
            ph.extend_from_slice(&[0, 0, 0, protocol]);
        }
        _ => unreachable!("one family"),
    }
    ones_sum(words(&ph))
}

/// The transport checksum field's offset in the frame, and whether
/// etherparse finds the checksum valid.
fn inspect(frame: &[u8]) -> (usize, bool) {
    let p = parse_frame(frame).unwrap();
    let at = p.l4_offset + if p.flow.proto == proto::TCP { 16 } else { 6 };
    let h = PacketHeaders::from_ethernet_slice(frame).unwrap();
    let payload = h.payload.slice();
    let want = match (h.net.as_ref().unwrap(), h.transport.as_ref().unwrap()) {
        (NetHeaders::Ipv4(ip, _), TransportHeader::Tcp(t)) => {
            t.calc_checksum_ipv4(ip, payload).unwrap()
        }
        (NetHeaders::Ipv6(ip, _), TransportHeader::Tcp(t)) => {
            t.calc_checksum_ipv6(ip, payload).unwrap()
        }
        (NetHeaders::Ipv4(ip, _), TransportHeader::Udp(u)) => {
            u.calc_checksum_ipv4(ip, payload).unwrap()
        }
        (NetHeaders::Ipv6(ip, _), TransportHeader::Udp(u)) => {
            u.calc_checksum_ipv6(ip, payload).unwrap()
        }
        other => panic!("not TCP/UDP over IP: {other:?}"),
    };
    (at, u16::from_be_bytes([frame[at], frame[at + 1]]) == want)
}

fn addrs() -> impl Strategy<Value = (IpAddr, IpAddr)> {
    prop_oneof![
        (any::<[u8; 4]>(), any::<[u8; 4]>())
            .prop_map(|(s, d)| (Ipv4Addr::from(s).into(), Ipv4Addr::from(d).into())),
        (any::<[u8; 16]>(), any::<[u8; 16]>()).prop_map(|(s, d)| {
            // Not IPv4-mapped: those are IPv4 to the builder.
            let (mut s, mut d) = (s, d);
            s[0] |= 0x20;
            d[0] |= 0x20;
            (Ipv6Addr::from(s).into(), Ipv6Addr::from(d).into())
        }),
    ]
}

/// A valid TCP or UDP frame (checksum filled in by the builder).
fn frames() -> impl Strategy<Value = Vec<u8>> {
    (
        addrs(),
        any::<(u16, u16)>(),
        any::<bool>(),
        any::<u8>(),
        prop::collection::vec(any::<u8>(), 0..1400),
    )
        .prop_map(|((s, d), (sp, dp), tcp, flags, payload)| {
            if tcp {
                Frame::tcp(s, d, sp, dp, flags, &payload).to_bytes()
            } else {
                Frame::udp(s, d, sp, dp, &payload).to_bytes()
            }
        })
}

/// The frame with its checksum field as an offloading sender leaves it.
fn partial_of(valid: &[u8]) -> (Vec<u8>, usize) {
    let p = parse_frame(valid).unwrap();
    let (at, ok) = inspect(valid);
    assert!(ok, "the builder fills in valid checksums");
    let len = p.l3_offset + p.l3_len - p.l4_offset;
    let field = pseudo_field(
        packet::flow::to_ip(&p.flow.src),
        packet::flow::to_ip(&p.flow.dst),
        p.flow.proto,
        len,
    );
    let mut partial = valid.to_vec();
    partial[at..at + 2].copy_from_slice(&field.to_be_bytes());
    (partial, at)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn a_partial_checksum_is_completed_to_the_valid_one(valid in frames()) {
        let (mut f, at) = partial_of(&valid);
        let coincidence = f == valid; // the valid sum equals the pseudo sum
        let p = parse_frame(&f).unwrap();
        let r = complete_partial(&mut f, &p);
        prop_assert_eq!(&f, &valid, "completed to exactly the builder's checksum");
        prop_assert!(inspect(&f).1, "etherparse agrees");
        prop_assert_eq!(r, if coincidence { Partial::AlreadyValid } else { Partial::Completed });
        prop_assert!(f[at..at + 2] != [0, 0] || p.flow.proto == proto::TCP, "UDP never gets 0");
    }

    #[test]
    fn a_valid_packet_is_never_changed(valid in frames()) {
        let mut f = valid.clone();
        let p = parse_frame(&f).unwrap();
        let r = complete_partial(&mut f, &p);
        prop_assert_eq!(&f, &valid);
        prop_assert!(r != Partial::Completed);
    }

    #[test]
    fn a_corrupt_checksum_is_never_completed(valid in frames(), bad in any::<u16>()) {
        let (partial, at) = partial_of(&valid);
        let good = [valid[at], valid[at + 1]];
        let pseudo = [partial[at], partial[at + 1]];
        let bad = bad.to_be_bytes();
        prop_assume!(bad != good && bad != pseudo);
        let mut f = valid.clone();
        f[at..at + 2].copy_from_slice(&bad);
        let before = f.clone();
        let p = parse_frame(&f).unwrap();
        prop_assert_eq!(complete_partial(&mut f, &p), Partial::No);
        prop_assert_eq!(&f, &before);
        prop_assert!(!inspect(&f).1, "still invalid");
    }

    #[test]
    fn a_corrupt_payload_with_a_valid_field_is_never_touched(
        valid in frames(),
        flip in any::<(usize, u8)>(),
    ) {
        // A bit flipped on the way: the field holds the old valid sum.
        let (partial, field) = partial_of(&valid);
        // (A valid sum that happens to equal the pseudo-header sum cannot
        // be told from a partial one: left out.)
        prop_assume!(partial[field..field + 2] != valid[field..field + 2]);
        let p = parse_frame(&valid).unwrap();
        let end = p.l3_offset + p.l3_len;
        prop_assume!(end > p.l4_offset + 20);
        let at = p.l4_offset + 20 + flip.0 % (end - p.l4_offset - 20);
        let mut f = valid.clone();
        f[at] ^= flip.1 | 1;
        let before = f.clone();
        let p = parse_frame(&f).unwrap();
        let r = complete_partial(&mut f, &p);
        prop_assert_eq!(&f, &before);
        prop_assert!(r != Partial::Completed);
    }
}

#[test]
fn fragments_icmp_and_truncated_packets_are_left_alone() {
    let (s, d): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
    let mut icmp = Frame::icmp(s, d, 8, 0, 0, b"ping").to_bytes();
    let before = icmp.clone();
    let p = parse_frame(&icmp).unwrap();
    assert_eq!(complete_partial(&mut icmp, &p), Partial::No);
    assert_eq!(icmp, before);
    // A parse result that does not match the frame (shorter): no panic.
    let valid = Frame::tcp(s, d, 1, 80, 0x02, b"hello").to_bytes();
    let (partial, _) = partial_of(&valid);
    let p = parse_frame(&partial).unwrap();
    let mut short = partial[..p.l4_offset + 10].to_vec();
    assert_eq!(complete_partial(&mut short, &p), Partial::No);
    // The real thing, for contrast.
    let mut f = partial.clone();
    assert_eq!(complete_partial(&mut f, &p), Partial::Completed);
    assert_eq!(f, valid);
}
