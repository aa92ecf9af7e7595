//! A sample configuration (`examples/lb.toml`) and mixed traffic for it:
//! TCP and UDP over IPv4, an any-port UDP VIP, IPv6, ICMP errors about VIP
//! flows, fragments in and out of order, traffic for no VIP, and garbage.
//! Each frame says what must become of it, so tests (and people) can check
//! a run packet by packet. `fastpath lb sample-pcap` writes it to a file.

use std::net::IpAddr;

use packet::build::{Frame, L4};
use packet::reply::Refusal;
use packet::{flow, parse_frame, proto, FlowKey, Reason};

use lb::config::Config;
use lb::counters::DropReason;
use lb::worker::flow_hash;

/// The sample configuration.
pub const CONFIG: &str = include_str!("../../../examples/lb.toml");

/// What must happen to a sample frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// Forwarded to the backend Maglev picks in `pool` for `flow`.
    Forward {
        /// The VIP's pool.
        pool: &'static str,
        /// The flow whose hash picks the backend (for fragments: the first
        /// fragment's 5-tuple; for ICMP errors: the quoted client flow).
        flow: FlowKey,
    },
    /// Dropped and counted under this reason.
    Drop(DropReason),
    /// For a VIP's address on a port or protocol no VIP serves: dropped
    /// and counted as [`DropReason::VipPortNotServed`], and answered as a
    /// host answers a closed port, with this ([`packet::reply::refusal`]
    /// of the frame: a TCP RST, an ICMP port unreachable), back out of the
    /// port.
    Refused(Refusal),
}

/// A frame and its fate.
#[derive(Debug, Clone)]
pub struct SampleFrame {
    /// The Ethernet frame.
    pub frame: Vec<u8>,
    /// Its fate.
    pub expect: Expect,
}

/// A DNS query for example.com/A, so decoders see a real DNS message.
const DNS_QUERY: &[u8] = &[
    0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0, 7, b'e', b'x', b'a', b'm', b'p', b'l', b'e', 3,
    b'c', b'o', b'm', 0, 0, 1, 0, 1,
];

/// An address from text (panics on a typo: for samples and tests).
pub fn ip(s: &str) -> IpAddr {
    s.parse().expect("sample addresses are valid")
}

/// A TCP frame carrying a small HTTP request.
pub fn tcp(src: &str, sport: u16, dst: &str, dport: u16, flags: u8) -> Vec<u8> {
    Frame::tcp(
        ip(src),
        ip(dst),
        sport,
        dport,
        flags,
        b"GET / HTTP/1.1\r\n\r\n",
    )
    .to_bytes()
}

/// The 5-tuple of a frame that parses.
pub fn flow_of(frame: &[u8]) -> FlowKey {
    parse_frame(frame).expect("sample frames parse").flow
}

fn fwd(frame: Vec<u8>, pool: &'static str) -> SampleFrame {
    let flow = flow_of(&frame);
    SampleFrame {
        frame,
        expect: Expect::Forward { pool, flow },
    }
}

/// The mixed traffic for [`CONFIG`].
pub fn mixed_traffic() -> Vec<SampleFrame> {
    let mut out = Vec::new();
    for i in 0..60u16 {
        let src = format!("203.0.113.{}", i % 50 + 1);
        for flags in [0x02, 0x10, 0x18] {
            out.push(fwd(tcp(&src, 1000 + i, "192.0.2.80", 80, flags), "web"));
        }
        out.push(fwd(
            Frame::udp(
                ip(&src),
                ip("192.0.2.53"),
                2000 + i,
                53 + (i % 3),
                DNS_QUERY,
            )
            .to_bytes(),
            "dns",
        ));
        let v6 = Frame::tcp(
            ip(&format!("2001:db8:1::{:x}", i + 1)),
            ip("2001:db8::80"),
            3000 + i,
            80,
            0x02,
            b"x",
        );
        out.push(fwd(v6.to_bytes(), "web6"));
    }
    // ICMP frag-needed from a router about packets VIP -> client: to the
    // backend of the client -> VIP flow.
    for i in 0..5u16 {
        let quoted = tcp(
            "192.0.2.80",
            80,
            &format!("203.0.113.{}", i + 1),
            1000 + i,
            0x10,
        );
        let frame = Frame::icmp(
            ip("198.51.100.1"),
            ip("192.0.2.80"),
            3,
            4,
            1400,
            &quoted[14..14 + 28],
        )
        .to_bytes();
        let flow = FlowKey::v4(
            [203, 0, 113, (i + 1) as u8],
            [192, 0, 2, 80],
            1000 + i,
            80,
            proto::TCP,
        );
        out.push(SampleFrame {
            frame,
            expect: Expect::Forward { pool: "web", flow },
        });
    }
    let quoted6 = Frame::tcp(
        ip("2001:db8::80"),
        ip("2001:db8:1::1"),
        80,
        3000,
        0x10,
        &[0; 8],
    )
    .to_bytes();
    let frame = Frame::icmp(
        ip("2001:db8:ffff::1"),
        ip("2001:db8::80"),
        2,
        0,
        1280,
        &quoted6[14..14 + 48],
    )
    .to_bytes();
    let flow = FlowKey {
        src: flow::from_ip(ip("2001:db8:1::1")),
        dst: flow::from_ip(ip("2001:db8::80")),
        src_port: 3000,
        dst_port: 80,
        proto: proto::TCP,
    };
    out.push(SampleFrame {
        frame,
        expect: Expect::Forward { pool: "web6", flow },
    });
    // Fragmented UDP datagrams to the any-port UDP VIP, cut from one real
    // 56-byte datagram (its UDP length and checksum cover all fragments):
    // every fragment follows the first fragment's 5-tuple. Datagram 1 in
    // order; datagram 2 backwards, so two fragments wait for the first.
    for (ident, order) in [(0x1111u32, [0usize, 1, 2]), (0x2222, [2, 1, 0])] {
        let (src, dst) = (ip("203.0.113.77"), ip("192.0.2.53"));
        let whole = Frame::udp(src, dst, 4444, 30_000, &[7; 48]).to_bytes();
        let l4 = &whole[14 + 20..];
        let flow = flow_of(&whole);
        let piece = |from: usize, to: usize, more: bool| {
            Frame::new(src, dst, L4::Raw(proto::UDP, l4[from..to].to_vec()))
                .fragment(ident, from as u16, more)
                .to_bytes()
        };
        let parts = [
            piece(0, 24, true),
            piece(24, 48, true),
            piece(48, 56, false),
        ];
        for k in order {
            out.push(SampleFrame {
                frame: parts[k].clone(),
                expect: Expect::Forward { pool: "dns", flow },
            });
        }
    }
    // For a VIP's address but no VIP: wrong port, wrong protocol (dropped,
    // counted as such and refused: a RST, a port unreachable); and not for
    // a VIP at all: wrong address.
    for (frame, expect) in [
        (
            tcp("203.0.113.1", 5, "192.0.2.80", 443, 2),
            Expect::Refused(Refusal::TcpReset),
        ),
        (
            tcp("203.0.113.1", 5, "192.0.2.99", 80, 2),
            Expect::Drop(DropReason::NoVip),
        ),
        (
            Frame::udp(ip("203.0.113.1"), ip("192.0.2.80"), 5, 80, b"").to_bytes(),
            Expect::Refused(Refusal::PortUnreachable),
        ),
    ] {
        out.push(SampleFrame { frame, expect });
    }
    // Garbage, each with the reason it is counted under.
    let good = tcp("203.0.113.1", 9, "192.0.2.80", 80, 2);
    let mut bad_sum = good.clone();
    bad_sum[22] ^= 0x40; // TTL changed under the checksum
    let mut bad_ver = good.clone();
    bad_ver[14] = 0x55;
    let mut arp = good.clone();
    arp[12..14].copy_from_slice(&[0x08, 0x06]);
    let mut bad_udp = Frame::udp(ip("203.0.113.1"), ip("192.0.2.53"), 1, 53, b"abcd").to_bytes();
    bad_udp[14 + 20 + 5] = 250;
    let v6_cut =
        Frame::tcp(ip("2001:db8::1"), ip("2001:db8::80"), 1, 80, 2, b"").to_bytes()[..60].to_vec();
    for (frame, r) in [
        (good[..9].to_vec(), Reason::EthernetTruncated),
        (good[..30].to_vec(), Reason::Ipv4Truncated),
        (good[..50].to_vec(), Reason::Ipv4BadTotalLength),
        (bad_sum, Reason::Ipv4BadChecksum),
        (bad_ver, Reason::Ipv4BadVersion),
        (arp, Reason::NotIp),
        (bad_udp, Reason::UdpBadLength),
        (v6_cut, Reason::Ipv6BadPayloadLength),
    ] {
        out.push(SampleFrame {
            frame,
            expect: Expect::Drop(DropReason::Malformed(r)),
        });
    }
    out
}

/// The backend address Maglev names for `flow` in `pool`, computed from the
/// configuration with the maglev crate alone (no forwarder code), so tests
/// can check the forwarder against it.
pub fn expected_backend(cfg: &Config, pool: &str, flow: &FlowKey) -> Option<IpAddr> {
    let members = cfg.flatten(pool).ok()?;
    let size = cfg.pools.iter().find(|p| p.name == pool)?.table_size;
    let backends: Vec<maglev::Backend> = members
        .iter()
        .map(|m| {
            maglev::Backend::weighted(
                m.name.clone().unwrap_or_else(|| m.address.to_string()),
                m.weight,
            )
        })
        .collect();
    let mut t = maglev::Maglev::new(size).ok()?;
    t.populate(&backends).ok()?;
    Some(members[t.lookup(flow_hash(flow))? as usize].address)
}

#[cfg(test)]
mod tests {
    #[test]
    fn sample_config_is_valid() {
        super::Config::parse(super::CONFIG, "examples/lb.toml").unwrap();
        assert!(super::mixed_traffic().len() > 300);
    }
}
