//! Frames for the sample configuration's VIPs (`examples/lb.toml`: http
//! 192.0.2.80 TCP 80, dns-any-port 192.0.2.53 UDP, http6 2001:db8::80 TCP
//! 80) that no honest sender sends, each with the drop counter it must
//! land in, and frames just beside them that must still be forwarded.
//! Written from the specifications, not from the load balancer's code:
//!
//! - RFC 1122 section 3.2.1.3 and RFC 6890's registry: an IPv4 source in
//!   0.0.0.0/8 ("this network"), 127.0.0.0/8 (loopback), 224.0.0.0/4
//!   (multicast), 240.0.0.0/4 (reserved, 255.255.255.255 among them) is
//!   discarded: `martian_source`.
//! - RFC 4291 sections 2.5.2, 2.5.3, 2.7: the unspecified address ::,
//!   loopback ::1 and multicast ff00::/8 are never sources; an IPv4-mapped
//!   source (section 2.5.5.2) of one of the IPv4 blocks is as martian.
//! - A VIP's own address as the source (the frame's destination, another
//!   VIP, or an IPv4 VIP mapped into IPv6): only a forger sends from the
//!   load balancer's addresses: `source_is_vip`.
//! - RFC 1812 section 5.3.1 and RFC 8200 section 3: a TTL or hop limit of
//!   0 is never forwarded to us by a router: `ttl_zero`.
//!
//! One frame may break several rules: the counter is the first of
//! `martian_source`, `source_is_vip`, `ttl_zero`.

use etherparse::{IpHeaders, Ipv4Header, Ipv6Header, PacketBuilder};

/// A frame and the drop counter it must land in (`None`: forwarded).
pub struct Hostile {
    /// What it is, for messages.
    pub what: String,
    /// The Ethernet frame.
    pub frame: Vec<u8>,
    /// The drop counter's name, or `None` when it must be forwarded.
    pub drop: Option<&'static str>,
}

const ETH: ([u8; 6], [u8; 6]) = ([2, 0, 0, 0, 0, 9], [2, 0, 0, 0, 0x0e, 2]);

/// TCP SYN (to port 80) or UDP (to port 53) from `src` to `dst` with
/// TTL or hop limit `ttl`, IPv4 or IPv6 as the addresses are.
pub fn frame(src: &str, dst: &str, tcp: bool, ttl: u8) -> Vec<u8> {
    frame_with(src, dst, tcp, ttl, false)
}

/// [`frame`], as an IPv4 first fragment (more fragments follow) when
/// `first_fragment`.
pub fn frame_with(src: &str, dst: &str, tcp: bool, ttl: u8, first_fragment: bool) -> Vec<u8> {
    let src: std::net::IpAddr = src.parse().unwrap();
    let dst: std::net::IpAddr = dst.parse().unwrap();
    let proto = if tcp {
        etherparse::IpNumber::TCP
    } else {
        etherparse::IpNumber::UDP
    };
    let ip = match (src, dst) {
        (std::net::IpAddr::V4(s), std::net::IpAddr::V4(d)) => {
            let mut h = Ipv4Header::new(0, ttl, proto, s.octets(), d.octets()).unwrap();
            h.more_fragments = first_fragment;
            IpHeaders::Ipv4(h, Default::default())
        }
        (s, d) => {
            let v6 = |a: std::net::IpAddr| match a {
                std::net::IpAddr::V6(a) => a.octets(),
                std::net::IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
            };
            IpHeaders::Ipv6(
                Ipv6Header {
                    next_header: proto,
                    hop_limit: ttl,
                    source: v6(s),
                    destination: v6(d),
                    ..Default::default()
                },
                Default::default(),
            )
        }
    };
    let b = PacketBuilder::ethernet2(ETH.0, ETH.1).ip(ip);
    let mut out = Vec::new();
    let payload = [0x5au8; 32];
    if tcp {
        b.tcp(40000, 80, 1, 65535)
            .syn()
            .write(&mut out, &payload)
            .unwrap();
    } else {
        b.udp(40000, 53).write(&mut out, &payload).unwrap();
    }
    out
}

/// The frames, hostile and beside them.
pub fn frames() -> Vec<Hostile> {
    let mut v = Vec::new();
    let mut add = |src: &str, dst: &str, tcp: bool, ttl: u8, drop: Option<&'static str>| {
        v.push(Hostile {
            what: format!(
                "{} {src} -> {dst} ttl {ttl}",
                if tcp { "TCP" } else { "UDP" }
            ),
            frame: frame(src, dst, tcp, ttl),
            drop,
        });
    };
    let martian = Some("martian_source");
    let vip_src = Some("source_is_vip");
    let ttl0 = Some("ttl_zero");
    for (src, dst) in [
        ("0.0.0.0", "192.0.2.80"),
        ("0.1.2.3", "192.0.2.80"),
        ("127.0.0.1", "192.0.2.80"),
        ("127.255.255.254", "192.0.2.53"),
        ("224.0.0.1", "192.0.2.80"),
        ("239.255.255.250", "192.0.2.53"),
        ("240.0.0.1", "192.0.2.80"),
        ("255.255.255.255", "192.0.2.53"),
        ("::", "2001:db8::80"),
        ("::1", "2001:db8::80"),
        ("ff02::1", "2001:db8::80"),
        ("ff05::1:3", "2001:db8::80"),
        ("::ffff:127.0.0.1", "2001:db8::80"),
        ("::ffff:0.0.0.0", "2001:db8::80"),
        ("::ffff:224.0.0.5", "2001:db8::80"),
    ] {
        let tcp = dst.ends_with("80");
        add(src, dst, tcp, 64, martian);
        // Martian first, whatever else is wrong.
        add(src, dst, tcp, 0, martian);
    }
    // From the VIP itself, from another VIP, from an IPv4 VIP mapped.
    add("192.0.2.80", "192.0.2.80", true, 64, vip_src);
    add("192.0.2.53", "192.0.2.80", true, 64, vip_src);
    add("192.0.2.80", "192.0.2.53", false, 64, vip_src);
    add("192.0.2.53", "192.0.2.53", false, 0, vip_src);
    add("2001:db8::80", "2001:db8::80", true, 64, vip_src);
    add("::ffff:192.0.2.80", "2001:db8::80", true, 64, vip_src);
    // TTL and hop limit 0 from honest sources.
    add("198.51.100.7", "192.0.2.80", true, 0, ttl0);
    add("198.51.100.7", "192.0.2.53", false, 0, ttl0);
    add("2001:db8:1::7", "2001:db8::80", true, 0, ttl0);
    // Beside them: the edges of the blocks, and TTL 1.
    for (src, dst) in [
        ("1.0.0.1", "192.0.2.80"),
        ("126.255.255.255", "192.0.2.80"),
        ("128.0.0.1", "192.0.2.53"),
        ("223.255.255.255", "192.0.2.80"),
        ("192.0.2.81", "192.0.2.80"),
        ("2001:db8:1::7", "2001:db8::80"),
        ("64:ff9b::c633:6407", "2001:db8::80"),
        ("feff::1", "2001:db8::80"),
        ("::ffff:198.51.100.7", "2001:db8::80"),
    ] {
        add(src, dst, dst.ends_with("80"), 1, None);
    }
    v
}
