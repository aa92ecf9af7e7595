//! Health checks through the tunnel: a check that
//! goes the way client traffic goes, GRE-encapsulated to the backend with
//! the VIP as inner destination, so it passes through the backend's
//! decapsulation agent and reaches the service on the VIP. A backend whose
//! server answers directly but whose decapsulation is dead is then seen as
//! down, as its clients see it.
//!
//! The kernel's own TCP stack does the check, so HTTP works unchanged:
//!
//! ```text
//! check socket (SO_MARK) --policy route--> TUN fphc0 --read here-->
//!   GRE to the backend (raw socket) --> backend's decap agent --> VIP:port
//! answer: VIP:port --> straight to this machine (direct server return)
//! ```
//!
//! The check socket is bound to its local port before it connects, so the
//! packets read from the TUN device tell by their source port which backend
//! they are for. Set up needs root: a TUN device and a policy-routing rule
//! that sends marked packets to a routing table whose default route is the
//! device (made over netlink by [`netio::policy`], the rule removed again
//! on drop; the route goes with the device).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use netio::policy::{self, Family, MarkRule};
use netio::tap::Tun;
use packet::ethertype;
use packet::gre::{GreRepr, HEADER_LEN as GRE_LEN};
use packet::ipv4::Ipv4Packet;
use packet::ipv6::Ipv6Packet;
use packet::tcp;
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

/// The TUN device's name (one load balancer per network namespace).
pub const DEVICE: &str = "fphc0";
/// The socket mark and routing table of tunnel checks.
pub const MARK: u32 = 0x4650;
/// The priority of the rule that sends marked packets to table [`MARK`]:
/// before the main table's (32766), so that a check's packets leave
/// through the device whatever the main table says of the VIP.
pub const RULE_PRIORITY: u32 = 1000;

/// Why the tunnel could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TunnelError {
    /// The TUN device could not be created.
    #[error("health-check tunnel: {0}")]
    Tun(#[from] netio::tap::Error),
    /// The policy-routing rule or the table's route could not be set up.
    #[error("health-check tunnel: {0}")]
    Route(#[source] policy::Error),
    /// The TUN device vanished before its route was made.
    #[error("health-check tunnel: device {DEVICE} has no interface index")]
    NoDevice,
    /// A socket could not be created or set up.
    #[error("health-check tunnel: {what}: {source}")]
    Socket {
        /// What was being done.
        what: &'static str,
        /// The system's answer.
        #[source]
        source: std::io::Error,
    },
}

/// The rule that sends packets marked [`MARK`] to table [`MARK`].
fn rule(family: Family) -> MarkRule {
    MarkRule {
        family,
        mark: MARK,
        table: MARK,
    }
}

/// Which backend each tunnel check's local port is for.
pub type Routes = Arc<Mutex<HashMap<u16, IpAddr>>>;

/// Counters of the tunnel.
#[derive(Debug, Default)]
pub struct TunnelStats {
    /// Packets read from the TUN device and sent to a backend.
    pub sent: AtomicU64,
    /// Packets read whose source port belongs to no check (dropped).
    pub unknown: AtomicU64,
}

/// The tunnel: the device, the routing rule, and which backend each check's
/// local port is for.
pub struct Tunnel {
    families: &'static [Family],
    shared: Arc<Mutex<HashMap<u16, IpAddr>>>,
    stop: Arc<AtomicBool>,
    reader: Option<std::thread::JoinHandle<()>>,
    /// Counters. The forwarding thread counts; nothing in the daemon reads
    /// them yet (neither `/status` nor `/metrics` shows the tunnel), so the
    /// handle is kept for a reader to come rather than the counting dropped.
    #[allow(dead_code)]
    pub stats: Arc<TunnelStats>,
}

impl std::fmt::Debug for Tunnel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tunnel").finish_non_exhaustive()
    }
}

impl Tunnel {
    /// Creates the TUN device and the policy routes (for IPv6 VIPs too if
    /// `ipv6`), and starts the thread that sends what the kernel routes into
    /// the device to the backends.
    pub fn start(ipv6: bool) -> Result<Tunnel, TunnelError> {
        let tun = Tun::open(DEVICE)?;
        let ifindex = netio::afpacket::ifindex(DEVICE).ok_or(TunnelError::NoDevice)?;
        let families: &[Family] = if ipv6 {
            &[Family::Ipv4, Family::Ipv6]
        } else {
            &[Family::Ipv4]
        };
        for &family in families {
            // A stale rule from a killed predecessor would be harmless but
            // would pile up: remove it first.
            policy::delete_all_rules(&rule(family)).map_err(TunnelError::Route)?;
            policy::add_rule(&rule(family), RULE_PRIORITY).map_err(TunnelError::Route)?;
            policy::replace_default_route(family, MARK, ifindex).map_err(TunnelError::Route)?;
        }
        let raw = |domain, what| {
            Socket::new(
                domain,
                Type::RAW,
                Some(Protocol::from(i32::from(packet::proto::GRE))),
            )
            .map_err(|source| TunnelError::Socket { what, source })
        };
        let (raw4, raw6) = (
            raw(Domain::IPV4, "raw GRE socket (IPv4)")?,
            raw(Domain::IPV6, "raw GRE socket (IPv6)")?,
        );
        let shared: Arc<Mutex<HashMap<u16, IpAddr>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(TunnelStats::default());
        let reader = {
            let (shared, stop, stats) =
                (Arc::clone(&shared), Arc::clone(&stop), Arc::clone(&stats));
            std::thread::Builder::new()
                .name("health-tunnel".into())
                .spawn(move || forward(&tun, &raw4, &raw6, &shared, &stop, &stats))
                .map_err(|source| TunnelError::Socket {
                    what: "starting the tunnel thread",
                    source,
                })?
        };
        Ok(Tunnel {
            families,
            shared,
            stop,
            reader: Some(reader),
            stats,
        })
    }

    /// Whether IPv6 VIPs are routed into the tunnel too.
    pub fn ipv6(&self) -> bool {
        self.families.contains(&Family::Ipv6)
    }

    /// The routing table the reader thread consults (shared with probes).
    pub fn routes(&self) -> Routes {
        Arc::clone(&self.shared)
    }
}

impl Drop for Tunnel {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        for &family in self.families {
            // Nothing to do about a failure here: the next start removes
            // what is left before adding its own.
            let _ = policy::delete_rule(&rule(family));
        }
    }
}

/// The reader: each IP packet the kernel routed into the device goes, in
/// GRE, to the backend its source port was registered for.
fn forward(
    tun: &Tun,
    raw4: &Socket,
    raw6: &Socket,
    routes: &Mutex<HashMap<u16, IpAddr>>,
    stop: &AtomicBool,
    stats: &TunnelStats,
) {
    let mut buf = vec![0u8; GRE_LEN + 65_536];
    while !stop.load(Ordering::Relaxed) {
        let fd = tun.as_fd();
        let mut fds = [rustix::event::PollFd::new(
            &fd,
            rustix::event::PollFlags::IN,
        )];
        let timeout = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 100_000_000,
        };
        if !matches!(rustix::event::poll(&mut fds, Some(&timeout)), Ok(n) if n > 0) {
            continue;
        }
        let Some(n) = tun.recv(&mut buf[GRE_LEN..]) else {
            continue;
        };
        let packet = &buf[GRE_LEN..GRE_LEN + n];
        let Some((port, ethertype)) = source_port(packet) else {
            stats.unknown.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        let backend = routes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&port)
            .copied();
        let Some(backend) = backend else {
            stats.unknown.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        // The kernel writes the outer IP header of a raw socket's datagram;
        // the GRE header goes into the room left in front of the packet.
        GreRepr {
            protocol: ethertype,
            key: None,
        }
        .emit(&mut buf[..GRE_LEN]);
        let to = SockAddr::from(SocketAddr::new(backend, 0));
        let raw = if backend.is_ipv4() { raw4 } else { raw6 };
        if raw.send_to(&buf[..GRE_LEN + n], &to).is_ok() {
            stats.sent.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The TCP source port of an IP packet and its GRE protocol type (the
/// packet's ethertype); `None` for anything but a well-formed IPv4 or IPv6
/// packet that carries TCP.
fn source_port(p: &[u8]) -> Option<(u16, u16)> {
    let port = |transport: &[u8]| {
        let b = transport.get(tcp::field::SRC_PORT)?;
        Some(u16::from_be_bytes([b[0], b[1]]))
    };
    match p.first()? >> 4 {
        4 => {
            let ip = Ipv4Packet::new_checked(p).ok()?;
            (ip.protocol() == packet::proto::TCP).then_some(())?;
            Some((port(ip.payload())?, ethertype::IPV4))
        }
        6 => {
            let ip = Ipv6Packet::new_checked(p).ok()?;
            (ip.next_header() == packet::proto::TCP).then_some(())?;
            Some((port(ip.payload())?, ethertype::IPV6))
        }
        _ => None,
    }
}

/// A TCP connection to `vip:port` that goes through the tunnel to
/// `backend`: marked, bound to a local port registered for the backend
/// until the returned guard drops.
pub async fn connect(
    routes: &Routes,
    backend: IpAddr,
    vip: SocketAddr,
) -> std::io::Result<(tokio::net::TcpStream, PortGuard)> {
    let s = Socket::new(Domain::for_address(vip), Type::STREAM, Some(Protocol::TCP))?;
    s.set_mark(MARK)?;
    s.set_nonblocking(true)?;
    let any: SocketAddr = if vip.is_ipv4() {
        (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    s.bind(&any.into())?;
    let port = s
        .local_addr()?
        .as_socket()
        .map(|a| a.port())
        .ok_or_else(|| std::io::Error::other("bound socket has no port"))?;
    routes
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(port, backend);
    let guard = PortGuard {
        routes: Arc::clone(routes),
        port,
    };
    let sock = tokio::net::TcpSocket::from_std_stream(std::net::TcpStream::from(s));
    let stream = sock.connect(vip).await?;
    Ok((stream, guard))
}

/// Unregisters a check's local port when the check is over.
#[derive(Debug)]
pub struct PortGuard {
    routes: Arc<Mutex<HashMap<u16, IpAddr>>>,
    port: u16,
}

/// How long a check's port stays registered after it ends, so the close
/// (FIN, last ACK) still reaches the backend. The port is not reused
/// meanwhile: the closing side keeps it in TIME_WAIT.
pub const LINGER: Duration = Duration::from_millis(500);

impl Drop for PortGuard {
    fn drop(&mut self) {
        let (routes, port) = (Arc::clone(&self.routes), self.port);
        let remove = move || {
            routes
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&port);
        };
        match tokio::runtime::Handle::try_current() {
            Ok(h) => {
                h.spawn(async move {
                    tokio::time::sleep(LINGER).await;
                    remove();
                });
            }
            Err(_) => remove(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_ports_of_tcp_packets_only() {
        // Packets as the kernel writes them: the views check the lengths.
        let mut v4 = vec![0u8; 40];
        v4[0] = 0x45;
        v4[2..4].copy_from_slice(&40u16.to_be_bytes());
        v4[9] = 6;
        v4[20..22].copy_from_slice(&4242u16.to_be_bytes());
        assert_eq!(source_port(&v4), Some((4242, 0x0800)));
        v4[9] = 17;
        assert_eq!(source_port(&v4), None);
        let mut v6 = vec![0u8; 60];
        v6[0] = 0x60;
        v6[4..6].copy_from_slice(&20u16.to_be_bytes());
        v6[6] = 6;
        v6[40..42].copy_from_slice(&7u16.to_be_bytes());
        assert_eq!(source_port(&v6), Some((7, 0x86dd)));
        assert_eq!(source_port(&v6[..41]), None);
        assert_eq!(source_port(&[]), None);
        assert_eq!(source_port(&[0x45]), None);
    }
}
