//! `fastpath switch bench`: the structure of the paper's Figure 1.
//!
//! A "guest" is a pktgen thread on the driver side of a ring port; the row
//! sets its notification mode and `itr`. The host side is either the switch
//! (VALE backend: frames go to a sink, come from a generator or an echo port
//! inside the switch) or the kernel (TAP backend: the switch passes frames to
//! a TAP device, a system call each, and the host end is a packet socket on
//! that TAP). Each figure is a separate short run on a fresh switch.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ring::control::{attach, AttachRequest};
use ring::Mode;
use serde::Serialize;
use serde_json::{json, Value};

use vswitch::pktgen::{self, udp_frame, Params, Report, Role};
use vswitch::{spawn, Config, EchoPort, GenPort, SinkPort, Switch, TapPort};

/// Why a switch bench measurement could not run.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A switch could not be started.
    #[error("starting a switch")]
    Switch(#[source] vswitch::Error),
    /// The host-side port could not be added.
    #[error("adding the host port {name}")]
    HostPort {
        /// The port.
        name: String,
        /// Why.
        #[source]
        source: vswitch::Error,
    },
    /// The TAP device could not be created.
    #[error("TAP backend: cannot create {name} (needs root)")]
    Tap {
        /// The interface.
        name: String,
        /// Why.
        #[source]
        source: netio::tap::Error,
    },
    /// The packet socket on the TAP device could not be set up.
    #[error("packet socket on {name}: {what}")]
    PacketSocket {
        /// The interface.
        name: String,
        /// The step that failed.
        what: &'static str,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A guest could not attach to the switch.
    #[error("attaching guest port {name}")]
    Attach {
        /// The port.
        name: String,
        /// Why.
        #[source]
        source: ring::Error,
    },
    /// The forwarding run's receiver thread panicked.
    #[error("the receiver thread panicked")]
    ReceiverPanicked,
    /// A result could not be turned into JSON.
    #[error("encoding the results as JSON")]
    Json(#[source] serde_json::Error),
}

/// The host side of the virtual NIC.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// The switch, with the host's port inside it.
    Switch,
    /// A TAP device: the kernel's path.
    Tap,
}

/// One row of Figure 1.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Row {
    /// The row's key in the JSON document.
    pub key: &'static str,
    /// The row's label in the paper.
    pub label: &'static str,
    /// The guest port's notification mode.
    pub mode: Mode,
    /// Interrupt moderation, in 250 ns units.
    pub itr: u32,
}

/// Figure 1's rows, in order.
pub const ROWS: [Row; 5] = [
    Row {
        key: "base_itr0",
        label: "BASE itr=0",
        mode: Mode::Base,
        itr: 0,
    },
    Row {
        key: "base_itr100",
        label: "itr=100",
        mode: Mode::Base,
        itr: 100,
    },
    Row {
        key: "sc_itr100",
        label: "itr=100 SC",
        mode: Mode::Sc,
        itr: 100,
    },
    Row {
        key: "csb_itr0",
        label: "itr=0 CSB",
        mode: Mode::Csb,
        itr: 0,
    },
    Row {
        key: "csb_itr100",
        label: "itr=100 CSB",
        mode: Mode::Csb,
        itr: 100,
    },
];

/// The paper's figures for a row: TX Kpps (UDP, 8-byte payload), RX Kpps,
/// Mbps with 1460-byte payloads, TCP_RR thousands of transactions/s.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Paper {
    /// Guest transmit, thousands of packets per second.
    pub tx_kpps: Option<f64>,
    /// Guest receive, thousands of packets per second.
    pub rx_kpps: Option<f64>,
    /// Megabits per second with 1514-byte frames.
    pub mbps_1514: Option<f64>,
    /// Request-response, thousands of transactions per second.
    pub rr_ktps: Option<f64>,
}

/// Figure 1 of the paper. VALE: "FreeBSD on QEMU-KVM, VALE backend,
/// Guest-Guest" (TX = RX). TAP: "TAP backend, Guest-Host, 1 VCPU".
pub fn paper(backend: Backend, key: &str) -> Paper {
    let p = |tx, rx, mbps, rr| Paper {
        tx_kpps: tx,
        rx_kpps: rx,
        mbps_1514: mbps,
        rr_ktps: rr,
    };
    match (backend, key) {
        (Backend::Switch, "base_itr0") => p(Some(111.0), Some(111.0), Some(1077.0), None),
        (Backend::Switch, "base_itr100") => p(Some(110.0), Some(110.0), Some(1050.0), Some(1.9)),
        (Backend::Switch, "sc_itr100") => p(Some(540.0), Some(540.0), Some(3050.0), Some(1.9)),
        (Backend::Switch, "csb_itr0") => p(Some(629.0), Some(629.0), Some(5620.0), Some(7.2)),
        (Backend::Tap, "base_itr0") => p(Some(30.0), Some(260.0), Some(314.0), Some(17.0)),
        (Backend::Tap, "base_itr100") => p(Some(82.0), Some(310.0), Some(831.0), Some(4.5)),
        (Backend::Tap, "sc_itr100") => p(Some(317.0), None, Some(2366.0), Some(4.5)),
        (Backend::Tap, "csb_itr0") => p(Some(711.0), None, Some(3874.0), Some(17.2)),
        (Backend::Tap, "csb_itr100") => p(Some(717.0), None, Some(3810.0), Some(4.7)),
        _ => p(None, None, None, None),
    }
}

/// Our figures for a row.
#[derive(Clone, Debug, Serialize)]
pub struct RowResult {
    /// The row's label.
    pub label: &'static str,
    /// The guest port's notification mode.
    pub mode: Mode,
    /// Interrupt moderation, in 250 ns units.
    pub itr: u32,
    /// Guest transmit, thousands of 60-byte packets per second.
    pub tx_kpps: f64,
    /// Guest receive, thousands of 60-byte packets per second.
    pub rx_kpps: f64,
    /// Guest transmit, megabits per second with 1514-byte frames.
    pub mbps_1514: f64,
    /// (kicks + interrupts) per packet on the 60-byte transmit run.
    pub notifications_per_packet: f64,
    /// Kicks per packet on the same run.
    pub kicks_per_packet: f64,
    /// Interrupts per packet on the same run.
    pub interrupts_per_packet: f64,
    /// Ping-pong transactions per second.
    pub rr_tps: f64,
    /// Ping-pong median round-trip time (us).
    pub rtt_us_p50: f64,
    /// Ping-pong 99th percentile round-trip time (us).
    pub rtt_us_p99: f64,
    /// The paper's figures for this row.
    pub paper: Paper,
}

/// Called after each measurement with a one-line summary.
pub type Progress = Arc<dyn Fn(&str) + Send + Sync>;

/// What to run.
#[derive(Clone)]
pub struct Options {
    /// Seconds per measurement.
    pub seconds: f64,
    /// Backends to measure, in order.
    pub backends: Vec<Backend>,
    /// Frames per transmit call.
    pub burst: usize,
    /// Called after each measurement with a short description.
    pub progress: Option<Progress>,
}

const GUEST_MAC: [u8; 6] = [0x02, 0xfa, 0, 0, 0, 1];
const HOST_MAC: [u8; 6] = [0x02, 0xfa, 0, 0, 0, 2];

static RUN: AtomicU32 = AtomicU32::new(0);

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Tx(usize),
    Rx,
    Rr,
}

/// Kernel side of a TAP: a packet socket bound to it.
struct PacketSock(OwnedFd);

impl PacketSock {
    fn bind(ifname: &str) -> Result<PacketSock, Error> {
        use rustix::net::{eth, sockopt, AddressFamily, SocketFlags, SocketType};
        let fail = |what: &'static str| {
            move |e: rustix::io::Errno| Error::PacketSocket {
                name: ifname.to_string(),
                what,
                source: e.into(),
            }
        };
        let fd = rustix::net::socket_with(
            AddressFamily::PACKET,
            SocketType::RAW,
            SocketFlags::CLOEXEC,
            Some(eth::ALL),
        )
        .map_err(fail("socket(AF_PACKET)"))?;
        let ifindex =
            rustix::net::netdevice::name_to_index(&fd, ifname).map_err(fail("interface index"))?;
        // SAFETY: sockaddr_ll is plain data; all-zero is valid.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = (libc::ETH_P_ALL as u16).to_be();
        sll.sll_ifindex = ifindex as i32;
        // rustix has no sockaddr_ll.
        // SAFETY: sll is a live sockaddr_ll and the length is its size; fd
        // is an open socket we own.
        let r = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                &sll as *const libc::sockaddr_ll as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if r < 0 {
            return Err(Error::PacketSocket {
                name: ifname.to_string(),
                what: "bind",
                source: std::io::Error::last_os_error(),
            });
        }
        // Our own transmissions must not come back to us. rustix has no
        // PACKET_IGNORE_OUTGOING.
        let one: libc::c_int = 1;
        // SAFETY: the option value is a live c_int and the length its size.
        let r = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_PACKET,
                libc::PACKET_IGNORE_OUTGOING,
                &one as *const libc::c_int as *const libc::c_void,
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r < 0 {
            return Err(Error::PacketSocket {
                name: ifname.to_string(),
                what: "setsockopt(PACKET_IGNORE_OUTGOING)",
                source: std::io::Error::last_os_error(),
            });
        }
        sockopt::set_socket_timeout(&fd, sockopt::Timeout::Recv, Some(Duration::from_millis(10)))
            .map_err(fail("setsockopt(SO_RCVTIMEO)"))?;
        Ok(PacketSock(fd))
    }

    fn send(&self, f: &[u8]) -> bool {
        rustix::net::send(&self.0, f, rustix::net::SendFlags::empty()).is_ok_and(|n| n > 0)
    }

    fn recv(&self, buf: &mut [u8]) -> Option<usize> {
        match rustix::net::recv(self.0.as_fd(), buf, rustix::net::RecvFlags::empty()) {
            Ok((n, _)) if n > 0 => Some(n),
            _ => None,
        }
    }
}

/// One measurement on a fresh switch.
fn measure(
    backend: Backend,
    row: &Row,
    kind: Kind,
    secs: f64,
    burst: usize,
) -> Result<Report, Error> {
    let n = RUN.fetch_add(1, Ordering::Relaxed);
    let pid = std::process::id();
    let sock = std::env::temp_dir().join(format!("fp-bench-{pid}-{n}.sock"));
    let mut sw = Switch::new(Config {
        socket: Some(sock.clone()),
        log_ports: false,
        ..Config::default()
    })
    .map_err(Error::Switch)?;
    let stop_host = Arc::new(AtomicBool::new(false));
    let mut host_thread = None;
    match backend {
        Backend::Switch => {
            let peer: Box<dyn vswitch::Port> = match kind {
                Kind::Tx(_) => Box::new(SinkPort::new("host")),
                Kind::Rx => Box::new(GenPort::new(
                    "host",
                    udp_frame(60, HOST_MAC, GUEST_MAC),
                    None,
                )),
                Kind::Rr => Box::new(EchoPort::new("host")),
            };
            sw.add_port(peer).map_err(|source| Error::HostPort {
                name: "host".into(),
                source,
            })?;
        }
        Backend::Tap => {
            let name = format!("fp{}t{}", pid % 100_000, n % 1000);
            let tap = netio::tap::Tap::open(&name).map_err(|source| Error::Tap {
                name: name.clone(),
                source,
            })?;
            let _ = std::fs::write(format!("/proc/sys/net/ipv6/conf/{name}/disable_ipv6"), "1");
            sw.add_port(Box::new(TapPort::new(tap)))
                .map_err(|source| Error::HostPort {
                    name: name.clone(),
                    source,
                })?;
            if kind != Kind::Tx(60) && kind != Kind::Tx(1514) {
                let ps = PacketSock::bind(&name)?;
                let stop = stop_host.clone();
                host_thread = Some(std::thread::spawn(move || {
                    let frame = udp_frame(60, HOST_MAC, GUEST_MAC);
                    let mut buf = [0u8; 2048];
                    while !stop.load(Ordering::Relaxed) {
                        if kind == Kind::Rx {
                            for _ in 0..64 {
                                ps.send(&frame);
                            }
                        } else if let Some(len) = ps.recv(&mut buf) {
                            if len >= 12 {
                                let (d, s) = buf.split_at_mut(6);
                                d.swap_with_slice(&mut s[..6]);
                                ps.send(&buf[..len]);
                            }
                        }
                    }
                }));
            }
        }
    }
    let (stop, h) = spawn(sw);
    let result = (|| {
        let mut g = attach(
            &sock,
            &AttachRequest {
                name: "guest".into(),
                mode: row.mode,
                itr: row.itr,
                slots: 1024,
                buf_size: 2048,
            },
        )
        .map_err(|source| Error::Attach {
            name: "guest".into(),
            source,
        })?;
        let p = Params {
            role: match kind {
                Kind::Tx(_) => Role::Tx,
                Kind::Rx => Role::Rx,
                Kind::Rr => Role::PingPong,
            },
            size: match kind {
                Kind::Tx(s) => s,
                _ => 60,
            },
            burst,
            duration: Duration::from_secs_f64(secs),
            src_mac: GUEST_MAC,
            dst_mac: HOST_MAC,
            ..Params::default()
        };
        Ok(pktgen::run(&mut g.driver, &p, &|| false))
    })();
    stop_host.store(true, Ordering::Relaxed);
    if let Some(t) = host_thread {
        let _ = t.join();
    }
    stop.store(true, Ordering::Relaxed);
    let _ = h.join();
    let _ = std::fs::remove_file(&sock);
    result
}

/// Two guests in CSB mode, one transmitting to the other through the switch:
/// the switch's forwarding rate between ring ports.
pub fn forwarding(secs: f64, size: usize, burst: usize) -> Result<(Report, Report), Error> {
    let n = RUN.fetch_add(1, Ordering::Relaxed);
    let sock: PathBuf =
        std::env::temp_dir().join(format!("fp-bench-{}-{n}.sock", std::process::id()));
    let sw = Switch::new(Config {
        socket: Some(sock.clone()),
        log_ports: false,
        ..Config::default()
    })
    .map_err(Error::Switch)?;
    let (stop, h) = spawn(sw);
    let req = |name: &str| AttachRequest {
        name: name.into(),
        mode: Mode::Csb,
        itr: 0,
        slots: 1024,
        buf_size: 2048,
    };
    let attach_as = |name: &str| {
        attach(&sock, &req(name)).map_err(|source| Error::Attach {
            name: name.into(),
            source,
        })
    };
    let mut tx = attach_as("a")?;
    let mut rx = attach_as("b")?;
    // Let the switch learn b's address so a's frames are unicast.
    let hello = udp_frame(60, HOST_MAC, [0xff; 6]);
    rx.driver.send(1, |_, b| {
        b[..60].copy_from_slice(&hello);
        60
    });
    rx.driver.flush(Duration::from_secs(1));
    std::thread::sleep(Duration::from_millis(20));
    tx.driver.recv(16, |_| ());
    let done = Arc::new(AtomicBool::new(false));
    let d2 = done.clone();
    let receiver = std::thread::spawn(move || {
        let p = Params {
            role: Role::Rx,
            burst: 256,
            duration: Duration::from_secs_f64(secs + 5.0),
            ..Params::default()
        };
        pktgen::run(&mut rx.driver, &p, &|| d2.load(Ordering::Relaxed))
    });
    let p = Params {
        role: Role::Tx,
        size,
        burst,
        duration: Duration::from_secs_f64(secs),
        src_mac: GUEST_MAC,
        dst_mac: HOST_MAC,
        ..Params::default()
    };
    let t = pktgen::run(&mut tx.driver, &p, &|| false);
    std::thread::sleep(Duration::from_millis(20));
    done.store(true, Ordering::Relaxed);
    let mut r = receiver.join().map_err(|_| Error::ReceiverPanicked)?;
    // The receiver's rate over the sender's interval.
    r.seconds = t.seconds;
    r.pps = r.packets as f64 / t.seconds;
    stop.store(true, Ordering::Relaxed);
    let _ = h.join();
    let _ = std::fs::remove_file(&sock);
    Ok((t, r))
}

/// Run the whole table; returns the JSON document.
pub fn run(o: &Options) -> Result<Value, Error> {
    let mut backends = serde_json::Map::new();
    let mut results: Vec<(Backend, Vec<RowResult>)> = Vec::new();
    for &b in &o.backends {
        let mut rows = Vec::new();
        let mut doc = serde_json::Map::new();
        for row in &ROWS {
            let tx = measure(b, row, Kind::Tx(60), o.seconds, o.burst)?;
            let rx = measure(b, row, Kind::Rx, o.seconds, o.burst)?;
            let big = measure(b, row, Kind::Tx(1514), o.seconds, o.burst)?;
            let rr = measure(b, row, Kind::Rr, o.seconds, o.burst)?;
            let r = RowResult {
                label: row.label,
                mode: row.mode,
                itr: row.itr,
                tx_kpps: tx.pps / 1e3,
                rx_kpps: rx.pps / 1e3,
                mbps_1514: big.mbps,
                notifications_per_packet: tx.notifications_per_packet,
                kicks_per_packet: tx.kicks_per_packet,
                interrupts_per_packet: tx.interrupts_per_packet,
                rr_tps: rr.transactions_per_sec,
                rtt_us_p50: rr.rtt_us_p50,
                rtt_us_p99: rr.rtt_us_p99,
                paper: paper(b, row.key),
            };
            if let Some(p) = &o.progress {
                p(&format!(
                    "{:?} {}: tx {:.0} Kpps, rx {:.0} Kpps, {:.0} Mbps, {:.3} notif/pkt, {:.0} tps",
                    b,
                    row.label,
                    r.tx_kpps,
                    r.rx_kpps,
                    r.mbps_1514,
                    r.notifications_per_packet,
                    r.rr_tps
                ));
            }
            doc.insert(
                row.key.into(),
                serde_json::to_value(&r).map_err(Error::Json)?,
            );
            rows.push(r);
        }
        backends.insert(format!("{b:?}").to_lowercase(), Value::Object(doc));
        results.push((b, rows));
    }
    let (ftx, frx) = forwarding(o.seconds.max(0.5), 60, 256)?;
    if let Some(p) = &o.progress {
        p(&format!("ring to ring: {:.2} Mpps", frx.pps / 1e6));
    }
    let get = |b: Backend, key: &str| -> Option<&RowResult> {
        let i = ROWS.iter().position(|r| r.key == key)?;
        results
            .iter()
            .find(|(x, _)| *x == b)
            .map(|(_, rows)| &rows[i])
    };
    let mut ratios = serde_json::Map::new();
    for b in &o.backends {
        if let (Some(base), Some(sc), Some(csb)) = (
            get(*b, "base_itr0"),
            get(*b, "sc_itr100"),
            get(*b, "csb_itr100"),
        ) {
            ratios.insert(
                format!("{b:?}").to_lowercase(),
                json!({
                    "sc_over_base_tx": sc.tx_kpps / base.tx_kpps,
                    "csb_over_base_tx": csb.tx_kpps / base.tx_kpps,
                }),
            );
        }
    }
    if let (Some(s), Some(t)) = (
        get(Backend::Switch, "csb_itr0"),
        get(Backend::Tap, "csb_itr0"),
    ) {
        ratios.insert(
            "switch_over_tap".into(),
            json!({
                "tx": s.tx_kpps / t.tx_kpps,
                "rx": s.rx_kpps / t.rx_kpps,
            }),
        );
    }
    Ok(json!({
        "seconds_per_run": o.seconds,
        "frame_bytes": 60,
        "backends": backends,
        "forwarding": {
            "ring_to_ring_mpps": frx.pps / 1e6,
            "sender_mpps": ftx.pps / 1e6,
            "lost": ftx.packets.saturating_sub(frx.packets),
            "sender_notifications_per_packet": ftx.notifications_per_packet,
            "receiver_notifications_per_packet": frx.notifications_per_packet,
            "paper_vale_mpps": 20.0,
        },
        "ratios": ratios,
    }))
}
