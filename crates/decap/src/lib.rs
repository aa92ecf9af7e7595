//! The backends' side of GRE: `fastpath lb decap`. This kernel has no GRE
//! module, so a backend cannot simply add a GRE tunnel. Instead: a raw
//! socket receives IP protocol 47 (the kernel delivers raw protocols to raw
//! sockets without a module), the GRE header is checked and removed, and the
//! inner packet is written into a TUN device, where the kernel receives it
//! as if it had arrived on an interface. With the VIP on the backend's
//! loopback, the kernel's own TCP stack serves it, and replies go straight
//! to the client (direct server return).

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};

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

/// Errors setting the helper up.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {reason}")]
pub struct DecapError {
    what: String,
    reason: String,
}

fn err(what: &str) -> DecapError {
    let e = io::Error::last_os_error();
    let hint = match e.raw_os_error() {
        Some(libc::EPERM) | Some(libc::EACCES) => " (needs root, or CAP_NET_ADMIN and CAP_NET_RAW)",
        Some(libc::ENOENT) => " (is /dev/net/tun present?)",
        _ => "",
    };
    DecapError {
        what: what.into(),
        reason: format!("{e}{hint}"),
    }
}

fn ifreq(name: &str) -> Result<libc::ifreq, DecapError> {
    let c = CString::new(name).map_err(|_| DecapError {
        what: format!("interface name {name:?}"),
        reason: "contains a NUL byte".into(),
    })?;
    let bytes = c.as_bytes_with_nul();
    if bytes.len() > libc::IFNAMSIZ {
        return Err(DecapError {
            what: format!("interface name {name:?}"),
            reason: format!("longer than {} bytes", libc::IFNAMSIZ - 1),
        });
    }
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut r: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in r.ifr_name.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    Ok(r)
}

/// Creates (or attaches to) TUN device `name` without packet information
/// headers, and brings it up.
pub fn open_tun(name: &str) -> Result<OwnedFd, DecapError> {
    let path = CString::new("/dev/net/tun").expect("no NUL");
    // SAFETY: open(2) with a valid path; the result is checked.
    let raw = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if raw < 0 {
        return Err(err("open /dev/net/tun"));
    }
    // SAFETY: `raw` is a fresh descriptor nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let mut req = ifreq(name)?;
    req.ifr_ifru.ifru_flags = (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short;
    // SAFETY: TUNSETIFF takes a pointer to an ifreq, which lives across the call.
    if unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNSETIFF, &mut req) } < 0 {
        return Err(err(&format!("TUNSETIFF {name}")));
    }
    set_up(name)?;
    Ok(fd)
}

/// Sets an interface's IFF_UP flag.
fn set_up(name: &str) -> Result<(), DecapError> {
    // SAFETY: a plain datagram socket used only for interface ioctls.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(err("socket for ioctl"));
    }
    // SAFETY: fresh descriptor, owned here.
    let s = unsafe { OwnedFd::from_raw_fd(raw) };
    let mut req = ifreq(name)?;
    // SAFETY: SIOCGIFFLAGS/SIOCSIFFLAGS read and write the ifreq we pass,
    // which lives across each call.
    unsafe {
        if libc::ioctl(s.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) < 0 {
            return Err(err(&format!("SIOCGIFFLAGS {name}")));
        }
        req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        if libc::ioctl(s.as_raw_fd(), libc::SIOCSIFFLAGS, &req) < 0 {
            return Err(err(&format!("SIOCSIFFLAGS {name}")));
        }
    }
    Ok(())
}

fn raw_gre(family: i32) -> Result<OwnedFd, DecapError> {
    // SAFETY: socket(2); the result is checked.
    let raw = unsafe {
        libc::socket(
            family,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::IPPROTO_GRE,
        )
    };
    if raw < 0 {
        return Err(err(if family == libc::AF_INET {
            "raw IPv4 GRE socket"
        } else {
            "raw IPv6 GRE socket"
        }));
    }
    // SAFETY: fresh descriptor, owned here.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// The inner packet of a GRE payload (`g` starts at the GRE header), or why
/// not.
pub fn gre_inner(g: &[u8], stats: &mut DecapStats) -> Option<std::ops::Range<usize>> {
    if g.len() < 4 {
        stats.malformed += 1;
        return None;
    }
    let flags = u16::from_be_bytes([g[0], g[1]]);
    if flags & 0x4007 != 0 {
        stats.malformed += 1; // routing present or version != 0
        return None;
    }
    let opt = 4
        * (usize::from(flags & 0x8000 != 0)
            + usize::from(flags & 0x2000 != 0)
            + usize::from(flags & 0x1000 != 0));
    let start = 4 + opt;
    if g.len() <= start {
        stats.malformed += 1;
        return None;
    }
    let proto = u16::from_be_bytes([g[2], g[3]]);
    let version = g[start] >> 4;
    match (proto, version) {
        (0x0800, 4) => stats.inner_v4 += 1,
        (0x86dd, 6) => stats.inner_v6 += 1,
        _ => {
            stats.not_ip += 1;
            return None;
        }
    }
    Some(start..g.len())
}

/// Runs until `stop`: GRE over IPv4 and IPv6 into TUN device `tun`.
pub fn run(tun: &str, stop: &AtomicBool) -> Result<DecapStats, DecapError> {
    let t = open_tun(tun)?;
    // A packet from the client arrives on the TUN device although the route
    // back to the client is elsewhere: strict reverse-path filtering would
    // drop it.
    let _ = std::fs::write(format!("/proc/sys/net/ipv4/conf/{tun}/rp_filter"), "0");
    if std::fs::read_to_string("/proc/sys/net/ipv4/conf/all/rp_filter")
        .is_ok_and(|v| v.trim() != "0")
    {
        tracing::warn!(
            "net.ipv4.conf.all.rp_filter is on: decapsulated packets may be dropped; set it to 0"
        );
    }
    let v4 = raw_gre(libc::AF_INET)?;
    let v6 = raw_gre(libc::AF_INET6).ok();
    let mut stats = DecapStats::default();
    let mut buf = vec![0u8; 65_536];
    while !stop.load(Ordering::Relaxed) {
        let mut fds = vec![libc::pollfd {
            fd: v4.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        if let Some(s) = &v6 {
            fds.push(libc::pollfd {
                fd: s.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            });
        }
        // SAFETY: `fds` is a valid array of pollfd of the given length.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 100) };
        if r <= 0 {
            continue;
        }
        for (i, p) in fds.iter().enumerate() {
            if p.revents & libc::POLLIN == 0 {
                continue;
            }
            // SAFETY: recv into our buffer with its length; the result is checked.
            let n =
                unsafe { libc::recv(p.fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
            if n <= 0 {
                continue;
            }
            let pkt = &buf[..n as usize];
            stats.received += 1;
            // IPv4 raw sockets deliver the IP header; IPv6 ones do not.
            let gre_at = if i == 0 {
                let hl = usize::from(pkt[0] & 0x0f) * 4;
                if pkt.len() < hl || hl < 20 {
                    stats.malformed += 1;
                    continue;
                }
                hl
            } else {
                0
            };
            let g = &pkt[gre_at..];
            let Some(inner) = gre_inner(g, &mut stats) else {
                continue;
            };
            let out = &g[inner];
            // SAFETY: write(2) of a slice we own, with its length.
            let w = unsafe { libc::write(t.as_raw_fd(), out.as_ptr().cast(), out.len()) };
            if w == out.len() as isize {
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
}
