//! The backends' side of GRE: `fastpath lb decap`. This kernel has no GRE
//! module, so a backend cannot simply add a GRE tunnel. Instead: a raw
//! socket receives IP protocol 47 (the kernel delivers raw protocols to raw
//! sockets without a module), the GRE header is checked and removed (with
//! `packet::gre`, the codec the load balancer encapsulates with), and the
//! inner packet is written into a TUN device, where the kernel receives it
//! as if it had arrived on an interface. With the VIP on the backend's
//! loopback, the kernel's own TCP stack serves it, and replies go straight
//! to the client (direct server return).

use std::io;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};

use netio::tap::Tun;
use packet::ethertype;
use packet::gre::GrePacket;
use packet::ipv4::Ipv4Packet;
use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::net::{AddressFamily, RecvFlags, SocketFlags, SocketType};

/// Decapsulation counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DecapStats {
    /// GRE packets received.
    pub received: u64,
    /// Inner packets written to the TUN device.
    pub delivered: u64,
    /// Inner IPv4 packets.
    pub inner_v4: u64,
    /// Inner IPv6 packets.
    pub inner_v6: u64,
    /// Dropped: GRE header malformed or flags we do not handle.
    pub malformed: u64,
    /// Dropped: the inner packet is not IPv4 or IPv6.
    pub not_ip: u64,
    /// Dropped: the TUN device refused the packet.
    pub tun_errors: u64,
}

/// Why the decapsulator could not start.
#[derive(Debug, thiserror::Error)]
pub enum DecapError {
    /// The TUN device could not be opened.
    #[error(transparent)]
    Tun(#[from] netio::tap::Error),
    /// The raw GRE socket could not be opened.
    #[error("raw {family} GRE socket: {source}{}", hint(source))]
    Socket {
        /// "IPv4" or "IPv6".
        family: &'static str,
        /// The system's answer.
        #[source]
        source: io::Error,
    },
}

/// What to do about a raw socket that could not be opened.
fn hint(e: &io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(libc::EPERM) | Some(libc::EACCES) => " (needs root, or CAP_NET_ADMIN and CAP_NET_RAW)",
        _ => "",
    }
}

/// A raw socket that receives every GRE packet (IP protocol 47) of one
/// address family.
fn raw_gre(family: AddressFamily) -> Result<OwnedFd, DecapError> {
    rustix::net::socket_with(
        family,
        SocketType::RAW,
        SocketFlags::CLOEXEC,
        Some(rustix::net::ipproto::GRE),
    )
    .map_err(|e| DecapError::Socket {
        family: if family == AddressFamily::INET {
            "IPv4"
        } else {
            "IPv6"
        },
        source: e.into(),
    })
}

/// The inner packet of a GRE payload (`g` starts at the GRE header), or why
/// not. The header is read with [`packet::gre`]: version 0, no routing, and
/// the optional fields its flags announce present. Of the inner packet only
/// the IP version is looked at (it must agree with the GRE protocol type);
/// the kernel checks the rest when it takes the packet from the TUN device.
pub fn gre_inner(g: &[u8], stats: &mut DecapStats) -> Option<std::ops::Range<usize>> {
    let Ok(gre) = GrePacket::new_checked(g) else {
        stats.malformed += 1; // truncated, routing present or version != 0
        return None;
    };
    // IPv4 and IPv6 both carry their version in the first byte's high
    // nibble.
    let Some(&first) = gre.payload().first() else {
        stats.malformed += 1; // nothing inside
        return None;
    };
    match (gre.protocol(), first >> 4) {
        (ethertype::IPV4, 4) => stats.inner_v4 += 1,
        (ethertype::IPV6, 6) => stats.inner_v6 += 1,
        _ => {
            stats.not_ip += 1;
            return None;
        }
    }
    Some(gre.header_len()..g.len())
}

/// The inner packet of what a raw GRE socket delivered, as a range of
/// `pkt`, or why not (counted in `stats`). IPv4 raw sockets deliver the IP
/// header (`ip_header`), read with [`Ipv4Packet`]; IPv6 ones start at the
/// GRE header.
fn raw_inner(
    pkt: &[u8],
    ip_header: bool,
    stats: &mut DecapStats,
) -> Option<std::ops::Range<usize>> {
    if !ip_header {
        return gre_inner(pkt, stats);
    }
    let Ok(ip) = Ipv4Packet::new_checked(pkt) else {
        stats.malformed += 1;
        return None;
    };
    let gre_at = ip.header_len();
    let inner = gre_inner(ip.payload(), stats)?;
    Some(gre_at + inner.start..gre_at + inner.end)
}

/// Runs until `stop`: GRE over IPv4 and IPv6 into TUN device `tun`.
pub fn run(tun: &str, stop: &AtomicBool) -> Result<DecapStats, DecapError> {
    let t = Tun::open(tun)?;
    // A packet from the client arrives on the TUN device although the route
    // back to the client is elsewhere: strict reverse-path filtering (1)
    // would drop it; loose (2) keeps it while any route leads back. The
    // kernel applies the larger of `all` and the device's value.
    let dev = format!("/proc/sys/net/ipv4/conf/{tun}/rp_filter");
    if let Err(e) = std::fs::write(&dev, "0") {
        // Under the systemd unit, ProtectKernelTunables= keeps /proc/sys
        // read-only: say so where it matters, never silently.
        if std::fs::read_to_string(&dev).is_ok_and(|v| v.trim() == "1") {
            tracing::warn!(
                "could not turn off strict reverse-path filtering on {tun} ({e}): decapsulated \
                 packets will be dropped; set {dev} to 0 or 2 before starting (e.g. \
                 net.ipv4.conf.default.rp_filter = 2 in /etc/sysctl.d)"
            );
        }
    }
    if std::fs::read_to_string("/proc/sys/net/ipv4/conf/all/rp_filter")
        .is_ok_and(|v| v.trim() == "1")
    {
        tracing::warn!(
            "net.ipv4.conf.all.rp_filter is 1 (strict): decapsulated packets will be dropped; \
             set it to 0 or 2 (loose)"
        );
    }
    // (socket, whether it delivers the IP header): IPv4 raw sockets deliver
    // it, IPv6 ones do not.
    let mut socks = vec![(raw_gre(AddressFamily::INET)?, true)];
    if let Ok(v6) = raw_gre(AddressFamily::INET6) {
        socks.push((v6, false));
    }
    let mut fds: Vec<PollFd<'_>> = socks
        .iter()
        .map(|(s, _)| PollFd::new(s, PollFlags::IN))
        .collect();
    let tick = Timespec {
        tv_sec: 0,
        tv_nsec: 100_000_000,
    };
    let mut stats = DecapStats::default();
    let mut buf = vec![0u8; 65_536];
    while !stop.load(Ordering::Relaxed) {
        match rustix::event::poll(&mut fds, Some(&tick)) {
            Ok(n) if n > 0 => {}
            _ => continue,
        }
        for (p, (sock, ip_header)) in fds.iter().zip(&socks) {
            if !p.revents().contains(PollFlags::IN) {
                continue;
            }
            let n = match rustix::net::recv(sock, &mut buf[..], RecvFlags::DONTWAIT) {
                Ok((n, _)) if n > 0 => n,
                _ => continue,
            };
            let pkt = &buf[..n];
            stats.received += 1;
            let Some(inner) = raw_inner(pkt, *ip_header, &mut stats) else {
                continue;
            };
            if t.send(&pkt[inner]) {
                stats.delivered += 1;
            } else {
                stats.tun_errors += 1;
            }
        }
    }
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gre_header_checks() {
        let mut s = DecapStats::default();
        let inner4 = [0x45u8, 0, 0, 20];
        let mut g = vec![0, 0, 0x08, 0x00];
        g.extend_from_slice(&inner4);
        assert_eq!(gre_inner(&g, &mut s), Some(4..8));
        // Key present: 4 more bytes before the payload.
        let mut k = vec![0x20, 0, 0x08, 0x00, 1, 2, 3, 4];
        k.extend_from_slice(&inner4);
        assert_eq!(gre_inner(&k, &mut s), Some(8..12));
        // Version 1, routing, truncation, and a non-IP payload are refused.
        assert_eq!(gre_inner(&[0, 1, 8, 0, 0x45], &mut s), None);
        assert_eq!(gre_inner(&[0x40, 0, 8, 0, 0x45], &mut s), None);
        assert_eq!(gre_inner(&[0x80, 0, 8, 0], &mut s), None);
        assert_eq!(gre_inner(&[0, 0, 0x86, 0xdd, 0x45], &mut s), None);
        assert_eq!((s.malformed, s.not_ip, s.inner_v4), (3, 1, 2));
    }

    /// Frames encapsulated by `packet::gre` (the load balancer's own
    /// encapsulation), with and without a key, over IPv4 (whose raw socket
    /// delivers the IP header) and IPv6 (whose raw socket does not): the
    /// inner packet comes back byte for byte.
    #[test]
    fn decapsulates_what_the_load_balancer_encapsulates() {
        use packet::build::Frame;
        use packet::gre::{encapsulate_keyed, Outer};
        use std::net::IpAddr;

        let mut s = DecapStats::default();
        let inners: [(IpAddr, IpAddr); 2] = [
            (
                "203.0.113.1".parse().unwrap(),
                "192.0.2.80".parse().unwrap(),
            ),
            (
                "2001:db8::1".parse().unwrap(),
                "2001:db8::80".parse().unwrap(),
            ),
        ];
        let outers: [(IpAddr, IpAddr); 2] = [
            ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap()),
            ("fd00::1".parse().unwrap(), "fd00::2".parse().unwrap()),
        ];
        let mut cases = 0;
        for (is, id) in inners {
            for (os, od) in outers {
                for key in [None, Some(0x0102_0304)] {
                    let frame = Frame::udp(is, id, 4000, 53, b"hello, backend").to_bytes();
                    let p = packet::parse_frame(&frame).unwrap();
                    let inner = frame[p.l3_offset..p.l3_offset + p.l3_len].to_vec();
                    let headroom = 64;
                    let mut buf = vec![0u8; headroom];
                    buf.extend_from_slice(&frame);
                    let outer = Outer {
                        eth_src: [2, 0, 0, 0, 0, 9],
                        eth_dst: [2, 0, 0, 0, 0, 10],
                        src: packet::flow::from_ip(os),
                        dst: packet::flow::from_ip(od),
                        ttl: 64,
                    };
                    let r = encapsulate_keyed(&mut buf, headroom, &p, &outer, 7, key).unwrap();
                    let out = &buf[r];
                    // What the raw socket delivers: the IP packet (IPv4), or
                    // its payload (IPv6).
                    let (pkt, ip_header) = if os.is_ipv4() {
                        (&out[packet::ethernet::HEADER_LEN..], true)
                    } else {
                        (
                            &out[packet::ethernet::HEADER_LEN + packet::ipv6::HEADER_LEN..],
                            false,
                        )
                    };
                    let got = raw_inner(pkt, ip_header, &mut s).unwrap();
                    assert_eq!(&pkt[got], &inner[..], "{is} in {os}, key {key:?}");
                    cases += 1;
                }
            }
        }
        assert_eq!(
            (s.inner_v4, s.inner_v6, s.malformed, s.not_ip),
            (4, 4, 0, 0)
        );
        assert_eq!(cases, 8);
        // A truncated outer IPv4 header is malformed.
        assert_eq!(raw_inner(&[0x45, 0, 0, 20], true, &mut s), None);
        assert_eq!(s.malformed, 1);
    }

    #[test]
    fn errors_keep_the_system_answer() {
        let e = DecapError::Socket {
            family: "IPv4",
            source: io::Error::from_raw_os_error(libc::EPERM),
        };
        assert!(std::error::Error::source(&e).is_some());
        let text = e.to_string();
        assert!(text.starts_with("raw IPv4 GRE socket: "), "{text}");
        assert!(
            text.ends_with(" (needs root, or CAP_NET_ADMIN and CAP_NET_RAW)"),
            "{text}"
        );
        // A bad TUN name is refused before any system call.
        let e = DecapError::from(Tun::open("").unwrap_err());
        assert!(
            matches!(e, DecapError::Tun(netio::tap::Error::BadName { .. })),
            "{e}"
        );
    }
}
