//! `fastpath switch bench`: the structure of the paper's Figure 1.
//!
//! A "guest" is a pktgen thread on the driver side of a ring port; the row
//! sets its notification mode and `itr`. The host side is either the switch
//! (VALE backend: frames go to a sink, come from a generator or an echo port
//! inside the switch) or the kernel (TAP backend: the switch passes frames to
//! a TAP device, a system call each, and the host end is a packet socket on
//! that TAP). Each figure is a separate short run on a fresh switch.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use measure::upper_median;
use ring::control::{attach, AttachRequest};
use ring::Mode;
use serde::{Deserialize, Serialize};

use vswitch::pktgen::{self, udp_frame, Params, Role};
use vswitch::{spawn, Config, Switch, SwitchStats, TapPort};

use crate::switch_ports::{EchoPort, GenPort, SinkPort};

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
    /// dpdk-testpmd is not installed.
    #[error("dpdk-testpmd not found (scripts/setup.sh installs dpdk-dev and librte-net-memif23)")]
    NoTestpmd,
    /// testpmd could not be started or its log written.
    #[error("testpmd: {what}")]
    Testpmd {
        /// The step that failed.
        what: &'static str,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Something did not happen in time.
    #[error("timed out after {secs} s waiting for {what}{detail}")]
    Timeout {
        /// What did not answer, and what for.
        what: String,
        /// How long we waited.
        secs: f64,
        /// What testpmd said last, if it is involved.
        detail: String,
    },
    /// A testpmd process ended before the measurement did.
    #[error("{name} exited during the measurement ({what}); its log ends:\n{tail}")]
    TestpmdExited {
        /// Which testpmd.
        name: String,
        /// What the bench was waiting for.
        what: String,
        /// The end of its log.
        tail: String,
    },
    /// The switch's status could not be read.
    #[error("asking the switch on {path} for its counters")]
    SwitchStatus {
        /// The control socket.
        path: PathBuf,
        /// Why.
        #[source]
        source: vswitch::StatusError,
    },
    /// The memif window cannot measure: shorter than testpmd's
    /// once-a-second reports need, or longer than allowed.
    #[error("--memif-seconds must be {min}..={max}, got {seconds}: testpmd reports once a second, so a shorter window may hold no report and measure nothing")]
    Window {
        /// The window asked for.
        seconds: f64,
        /// The shortest window that measures.
        min: f64,
        /// The longest allowed.
        max: f64,
    },
    /// A result could not be turned into JSON.
    #[error("encoding the results as JSON")]
    Json(#[source] serde_json::Error),
}

/// The host side of the virtual NIC.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
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
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
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
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RowResult {
    /// The row's label.
    pub label: String,
    /// The guest port's notification mode.
    pub mode: Mode,
    /// Interrupt moderation, in 250 ns units.
    pub itr: u32,
    /// Guest transmit, thousands of 60-byte packets per second.
    #[serde(deserialize_with = "crate::nan::f64")]
    pub tx_kpps: f64,
    /// Guest receive, thousands of 60-byte packets per second.
    #[serde(deserialize_with = "crate::nan::f64")]
    pub rx_kpps: f64,
    /// Guest transmit, megabits per second with 1514-byte frames.
    #[serde(deserialize_with = "crate::nan::f64")]
    pub mbps_1514: f64,
    /// (kicks + interrupts) per packet on the 60-byte transmit run.
    #[serde(deserialize_with = "crate::nan::f64")]
    pub notifications_per_packet: f64,
    /// Kicks per packet on the same run.
    #[serde(deserialize_with = "crate::nan::f64")]
    pub kicks_per_packet: f64,
    /// Interrupts per packet on the same run.
    #[serde(deserialize_with = "crate::nan::f64")]
    pub interrupts_per_packet: f64,
    /// Ping-pong transactions per second.
    #[serde(deserialize_with = "crate::nan::f64")]
    pub rr_tps: f64,
    /// Ping-pong median round-trip time (us).
    #[serde(deserialize_with = "crate::nan::f64")]
    pub rtt_us_p50: f64,
    /// Ping-pong 99th percentile round-trip time (us).
    #[serde(deserialize_with = "crate::nan::f64")]
    pub rtt_us_p99: f64,
    /// The paper's figures for this row.
    pub paper: Paper,
}

pub use crate::Progress;

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
    /// Measure the switch's ring-to-ring forwarding rate (with CPU times).
    pub forwarding: bool,
    /// Frames per transmit call in the forwarding measurement.
    pub forwarding_burst: usize,
    /// The switch's `poll_us` in the forwarding measurement.
    pub forwarding_poll_us: u64,
    /// Pin the forwarding measurement's threads ([`Placement::Pinned`]);
    /// else the scheduler places them.
    pub forwarding_pin: bool,
    /// Run the DPDK testpmd side-by-side over memif.
    pub memif: Option<MemifOptions>,
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
        if !netio::set_int_option(
            fd.as_fd(),
            libc::SOL_PACKET,
            libc::PACKET_IGNORE_OUTGOING,
            1,
        ) {
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
) -> Result<pktgen::Report, Error> {
    let n = RUN.fetch_add(1, Ordering::Relaxed);
    let pid = std::process::id();
    let sock = std::env::temp_dir().join(format!("fp-bench-{pid}-{n}.sock"));
    let mut sw = Switch::new(Config {
        socket: Some(sock.clone()),
        log_ports: false,
        // Measured as before port security was the default for ring
        // ports: the figures stay comparable with earlier runs'.
        ring_unlocked: vec!["*".into()],
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
    let (stop, h) = spawn(sw).map_err(Error::Switch)?;
    let result = (|| {
        let mut g = attach(
            &sock,
            &AttachRequest {
                name: "guest".into(),
                mode: row.mode,
                itr: row.itr,
                slots: 1024,
                buf_size: 2048,
                mac: None,
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

/// CPU seconds the calling thread has run.
fn thread_cpu() -> f64 {
    clock_secs(libc::CLOCK_THREAD_CPUTIME_ID)
}

fn clock_secs(clock: libc::clockid_t) -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a live, writable timespec.
    if unsafe { libc::clock_gettime(clock, &mut ts) } != 0 {
        return f64::NAN;
    }
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

// glibc has it; the libc crate does not declare it for Linux.
extern "C" {
    fn pthread_getcpuclockid(thread: libc::pthread_t, clock: *mut libc::clockid_t) -> libc::c_int;
}

/// The CPU clock of another thread of this process.
struct ThreadClock(libc::clockid_t);

impl ThreadClock {
    fn of<T>(h: &std::thread::JoinHandle<T>) -> Option<ThreadClock> {
        use std::os::unix::thread::JoinHandleExt;
        let mut id: libc::clockid_t = 0;
        // SAFETY: the handle's thread has not been joined (we borrow the
        // handle), so its pthread_t is valid; id is a live clockid_t.
        let r = unsafe { pthread_getcpuclockid(h.as_pthread_t(), &mut id) };
        (r == 0).then_some(ThreadClock(id))
    }

    fn secs(&self) -> f64 {
        clock_secs(self.0)
    }
}

/// What set the pace of a generator -> (switch) -> receiver run, as far as
/// the run's own counters tell.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "limit", content = "why", rename_all = "snake_case")]
pub enum Limit {
    /// The run measured nothing, or its counters contradict each other: no
    /// rate of it means anything.
    Invalid(String),
    /// The receiver did not keep up: frames were dropped at its full ring
    /// (or it dropped them itself).
    Receiver,
    /// The switch did not keep up: the generator's ring into it was full
    /// (frames refused there), or nothing was lost and the switch was busy
    /// on most of its passes.
    Switch,
    /// Frames were lost where no counter says (offered, not received, not
    /// counted as dropped): the run says nothing about who was slow.
    Lossy,
    /// The generator: nothing was dropped or refused anywhere, everything
    /// offered arrived, and the switch (if any) waited for frames on most of
    /// its passes.
    Generator,
}

impl Limit {
    /// Its name in JSON documents (`"limit"`).
    pub fn key(&self) -> &'static str {
        match self {
            Limit::Invalid(_) => "invalid",
            Limit::Receiver => "receiver",
            Limit::Switch => "switch",
            Limit::Lossy => "lossy",
            Limit::Generator => "generator",
        }
    }

    /// A short label for tables.
    pub fn label(&self) -> &'static str {
        match self {
            Limit::Invalid(_) => "INVALID",
            Limit::Receiver => "receiver-limited",
            Limit::Switch => "switch-limited",
            Limit::Lossy => "lossy (unexplained loss)",
            Limit::Generator => "generator-limited",
        }
    }
}

/// The counters of one run from a generator to a receiver, possibly through
/// the switch, that decide its [`Limit`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PathFigures {
    /// Frames the generator put on the path.
    pub offered: u64,
    /// Frames the generator could not put on the path (its ring was full).
    pub refused_at_generator: u64,
    /// Frames the switch delivered into the receiver's ring (`None`: no
    /// switch on the path).
    pub forwarded: Option<u64>,
    /// Frames the receiver counted.
    pub received: u64,
    /// Frames dropped at the receiver: its full ring, or its own drops.
    pub dropped_at_receiver: u64,
    /// Frames the switch had nowhere to send.
    pub dropped_no_destination: u64,
    /// Share of the switch's passes that found no frame (`None`: no switch).
    pub switch_idle_share: Option<f64>,
    /// Frames that may still be in flight when the counters were read (ring
    /// sizes): a loss up to this is not counted as unexplained.
    pub in_flight_allowance: u64,
}

/// The share of passes the switch must have found idle for the generator,
/// not the switch, to have set the pace.
pub const GENERATOR_IDLE_SHARE: f64 = 0.5;

/// What set the pace of a run, from its counters alone. Never
/// [`Limit::Generator`] when anything was dropped or refused, or when the
/// receiver got less than was offered beyond the in-flight allowance.
pub fn classify(f: &PathFigures) -> Limit {
    if f.offered == 0 {
        return Limit::Invalid("the generator offered nothing".into());
    }
    if f.received == 0 {
        return Limit::Invalid(format!(
            "the receiver got nothing of {} frames offered",
            f.offered
        ));
    }
    if f.received > f.offered {
        return Limit::Invalid(format!(
            "the receiver counted {} frames, more than the {} offered",
            f.received, f.offered
        ));
    }
    if let Some(fwd) = f.forwarded {
        if f.received > fwd {
            return Limit::Invalid(format!(
                "the receiver counted {} frames, more than the {fwd} the switch forwarded",
                f.received
            ));
        }
    }
    if f.switch_idle_share
        .is_some_and(|s| !(0.0..=1.0).contains(&s))
    {
        return Limit::Invalid("the switch's idle share is not a share".into());
    }
    if f.dropped_at_receiver > 0 {
        return Limit::Receiver;
    }
    if f.refused_at_generator > 0 {
        // The first hop's ring was full: with a switch, the switch did not
        // drain it; without one, the receiver did not.
        return if f.forwarded.is_some() {
            Limit::Switch
        } else {
            Limit::Receiver
        };
    }
    let lost = f.offered - f.received;
    if f.dropped_no_destination > 0 || lost > f.in_flight_allowance {
        return Limit::Lossy;
    }
    match f.switch_idle_share {
        Some(s) if s <= GENERATOR_IDLE_SHARE => Limit::Switch,
        _ => Limit::Generator,
    }
}

/// The switch's forwarding rate between two ring ports, and where the CPU
/// time went.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Forwarding {
    /// Frame size in bytes.
    pub frame_bytes: usize,
    /// Wall-clock seconds of the sender's run.
    #[serde(deserialize_with = "crate::nan::f64")]
    pub seconds: f64,
    /// What the sending pktgen queued. pktgen's report is written, not
    /// read back (it is the switch crate's): a saved document reads as its
    /// default here, and the figures the text uses are copied beside it.
    #[serde(skip_deserializing)]
    pub sender: pktgen::Report,
    /// What the receiving pktgen got (rate over the sender's interval);
    /// read back as for `sender`.
    #[serde(skip_deserializing)]
    pub receiver: pktgen::Report,
    /// Frames the switch forwarded during the run.
    pub switch_forwarded: u64,
    /// Frames the switch dropped at the receiver's full ring.
    pub switch_dropped: u64,
    /// CPU seconds of the switch thread over the run.
    #[serde(deserialize_with = "crate::nan::f64")]
    pub switch_cpu_s: f64,
    /// CPU seconds of the sending thread.
    #[serde(deserialize_with = "crate::nan::f64")]
    pub sender_cpu_s: f64,
    /// CPU seconds of the receiving thread.
    #[serde(deserialize_with = "crate::nan::f64")]
    pub receiver_cpu_s: f64,
    /// Frames forwarded per second of the switch thread's CPU time, in
    /// millions: the switch's own rate per core.
    #[serde(deserialize_with = "crate::nan::f64")]
    pub switch_mpps_per_core: f64,
    /// Frames the receiver got per wall-clock second, in millions.
    #[serde(deserialize_with = "crate::nan::f64")]
    pub end_to_end_mpps: f64,
    /// Frames per second of sender CPU, in millions.
    #[serde(deserialize_with = "crate::nan::f64")]
    pub sender_mpps_per_core: f64,
    /// Frames per second of receiver CPU, in millions.
    #[serde(deserialize_with = "crate::nan::f64")]
    pub receiver_mpps_per_core: f64,
    /// Share of the machine's CPU time (cores x seconds) each thread used.
    pub share_of_cores: ThreadShares,
    /// Share of the switch's passes that found no frame (it polled idle).
    #[serde(deserialize_with = "crate::nan::f64")]
    pub switch_idle_pass_share: f64,
    /// Seconds the switch spent in passes that found frames.
    #[serde(deserialize_with = "crate::nan::f64")]
    pub switch_busy_s: f64,
    /// Frames forwarded per second spent in those passes, in millions (the
    /// forwarding loop's own rate, without idle polling and sleeping).
    #[serde(deserialize_with = "crate::nan::f64")]
    pub switch_mpps_per_busy_second: f64,
    /// How long the switch polled after the last frame before sleeping.
    pub switch_poll_us: u64,
    /// Where the three threads ran.
    pub placement: Placement,
    /// Frames per batch the switch took from the sender's port.
    #[serde(deserialize_with = "crate::nan::f64")]
    pub switch_frames_per_batch: f64,
    /// The sender set the pace: nothing was dropped or lost and the switch
    /// waited for frames on most of its passes (`limit` is "generator").
    pub generator_limited: bool,
    /// Frames the switch dropped at the receiver's full ring (its port's
    /// `dropped_full`).
    pub switch_dropped_at_receiver: u64,
    /// What set the pace, from the counters in `figures` ([`classify`]).
    #[serde(flatten)]
    pub limit: Limit,
    /// The counters the limit was decided from.
    pub figures: PathFigures,
    /// The paper's VALE figure (Mpps per core, 60-byte frames).
    #[serde(deserialize_with = "crate::nan::f64")]
    pub paper_vale_mpps: f64,
    /// `end_to_end_mpps` under the name the first documents used.
    #[serde(deserialize_with = "crate::nan::f64")]
    pub ring_to_ring_mpps: f64,
    /// What the sender queued per wall-clock second, in millions.
    #[serde(deserialize_with = "crate::nan::f64")]
    pub sender_mpps: f64,
    /// Frames the sender queued that the receiver did not get.
    pub lost: u64,
    /// `switch_mpps_per_core` over the 30 Mpps goal.
    #[serde(deserialize_with = "crate::nan::f64")]
    pub switch_per_core_over_goal: f64,
}

/// The share of the machine's CPU time (cores x seconds) each thread of the
/// ring-to-ring run used.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct ThreadShares {
    /// CPUs the process may use.
    pub cores: f64,
    /// The sending pktgen.
    #[serde(deserialize_with = "crate::nan::f64")]
    pub sender: f64,
    /// The switch thread.
    #[serde(deserialize_with = "crate::nan::f64")]
    pub switch: f64,
    /// The receiving pktgen.
    #[serde(deserialize_with = "crate::nan::f64")]
    pub receiver: f64,
}

/// Frames dropped at the full ring of the port called `name`, by a switch's
/// status (0 if there is no status or no such port).
fn dropped_full_at(status: Option<&vswitch::Status>, name: &str) -> u64 {
    status
        .into_iter()
        .flat_map(|s| &s.ports)
        .filter(|p| p.name == name)
        .map(|p| p.dropped_full)
        .sum()
}

fn cores() -> f64 {
    std::thread::available_parallelism().map_or(1, |n| n.get()) as f64
}

/// Where the ring-to-ring measurement's three threads run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Placement {
    /// The sender alone on the first CPU, the switch and the receiver on
    /// the second (with two CPUs for three busy threads, the layout in
    /// which the switch is preempted least by the threads it serves: left
    /// to the scheduler, the switch spent a third of its CPU time in
    /// context switches and its per-core rate varied 20-30 Mpps; pinned,
    /// 33-35 in the same session). Needs two CPUs.
    Pinned,
    /// Wherever the scheduler puts them.
    Scheduler,
}

/// Two guests in CSB mode, one transmitting to the other through the switch:
/// the switch's forwarding rate between ring ports, per second of its own
/// CPU time and end to end, with each thread's CPU time, its threads placed
/// as `placement` asks (where it can: the result says where they ran).
pub fn forwarding(
    secs: f64,
    size: usize,
    burst: usize,
    poll_us: u64,
    placement: Placement,
) -> Result<Forwarding, Error> {
    let n = RUN.fetch_add(1, Ordering::Relaxed);
    let sock: PathBuf =
        std::env::temp_dir().join(format!("fp-bench-{}-{n}.sock", std::process::id()));
    let sw = Switch::new(Config {
        socket: Some(sock.clone()),
        log_ports: false,
        // Measured as before port security was the default for ring
        // ports: the figures stay comparable with earlier runs'.
        ring_unlocked: vec!["*".into()],
        poll_us,
        ..Config::default()
    })
    .map_err(Error::Switch)?;
    let (stop, h) = spawn(sw).map_err(Error::Switch)?;
    let clock = ThreadClock::of(&h);
    let req = |name: &str| AttachRequest {
        name: name.into(),
        mode: Mode::Csb,
        itr: 0,
        slots: 1024,
        buf_size: 2048,
        mac: None,
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
    let before = vswitch::status::ask(&sock).ok();
    let count = |v: &Option<vswitch::Status>, k: fn(&SwitchStats) -> u64| {
        v.as_ref().map_or(0, |v| k(&v.switch))
    };
    let done = Arc::new(AtomicBool::new(false));
    let d2 = done.clone();
    let receiver = std::thread::spawn(move || {
        let p = Params {
            role: Role::Rx,
            burst: 256,
            duration: Duration::from_secs_f64(secs + 5.0),
            ..Params::default()
        };
        let c0 = thread_cpu();
        let r = pktgen::run(&mut rx.driver, &p, &|| d2.load(Ordering::Relaxed));
        // The port stays attached (its counters in the switch) until the
        // switch has been read.
        (r, thread_cpu() - c0, rx)
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
    // Pinned only where there are two CPUs to pin to, and said so; the
    // calling thread gets its own CPU set back.
    let c = cores();
    let saved = crate::cpus::affinity();
    let placement = match (placement, &saved) {
        (Placement::Pinned, Some(_))
            if c >= 2.0
                && crate::cpus::pin_thread(&h, 1)
                && crate::cpus::pin_thread(&receiver, 1)
                && crate::cpus::pin_current(0) =>
        {
            Placement::Pinned
        }
        _ => Placement::Scheduler,
    };
    let sw0 = clock.as_ref().map_or(f64::NAN, ThreadClock::secs);
    let c0 = thread_cpu();
    let t = pktgen::run(&mut tx.driver, &p, &|| false);
    if let (Placement::Pinned, Some(set)) = (placement, &saved) {
        crate::cpus::set_affinity(set);
    }
    let sender_cpu = thread_cpu() - c0;
    std::thread::sleep(Duration::from_millis(20));
    done.store(true, Ordering::Relaxed);
    let (mut r, receiver_cpu, rx) = receiver.join().map_err(|_| Error::ReceiverPanicked)?;
    let switch_cpu = clock.as_ref().map_or(f64::NAN, ThreadClock::secs) - sw0;
    // The receiver's rate over the sender's interval.
    r.seconds = t.seconds;
    r.pps = r.packets as f64 / t.seconds;
    stop.store(true, Ordering::Relaxed);
    let mut sw = h.join().ok();
    let after = sw.as_mut().map(Switch::status);
    drop((tx, rx));
    let _ = std::fs::remove_file(&sock);
    let st = sw.map(|s| s.stats).unwrap_or_default();
    let full_at_b = |v: &Option<vswitch::Status>| dropped_full_at(v.as_ref(), "b");
    let dropped_at_receiver = full_at_b(&after).saturating_sub(full_at_b(&before));
    let fwd = st.forwarded.saturating_sub(count(&before, |s| s.forwarded));
    let dropped = st
        .no_destination
        .saturating_sub(count(&before, |s| s.no_destination));
    let batches = st.batches.saturating_sub(count(&before, |s| s.batches));
    let passes = st.passes.saturating_sub(count(&before, |s| s.passes));
    let idle = st
        .idle_passes
        .saturating_sub(count(&before, |s| s.idle_passes));
    let busy = st.busy_ns.saturating_sub(count(&before, |s| s.busy_ns)) as f64 * 1e-9;
    // Drops at the receiver's full ring are counted at its port, not the
    // switch: what the sender queued and the switch did not deliver.
    let dropped = dropped.max(t.packets.saturating_sub(fwd));
    let idle_share = idle as f64 / passes.max(1) as f64;
    let figures = PathFigures {
        offered: t.packets,
        refused_at_generator: 0,
        forwarded: Some(fwd),
        received: r.packets,
        dropped_at_receiver,
        dropped_no_destination: st
            .no_destination
            .saturating_sub(count(&before, |s| s.no_destination)),
        switch_idle_share: Some(idle_share),
        // Both rings' slots: what the switch had not yet taken from the
        // sender and the receiver had not yet read when it stopped.
        in_flight_allowance: 2 * 1024,
    };
    let limit = classify(&figures);
    let wall = t.seconds + 0.02;
    Ok(Forwarding {
        frame_bytes: size,
        seconds: t.seconds,
        switch_forwarded: fwd,
        switch_dropped: dropped,
        switch_cpu_s: switch_cpu,
        sender_cpu_s: sender_cpu,
        receiver_cpu_s: receiver_cpu,
        switch_mpps_per_core: fwd as f64 / switch_cpu / 1e6,
        end_to_end_mpps: r.pps / 1e6,
        sender_mpps_per_core: t.packets as f64 / sender_cpu / 1e6,
        receiver_mpps_per_core: r.packets as f64 / receiver_cpu / 1e6,
        share_of_cores: ThreadShares {
            cores: c,
            sender: sender_cpu / (wall * c),
            switch: switch_cpu / (wall * c),
            receiver: receiver_cpu / (wall * c),
        },
        switch_idle_pass_share: idle_share,
        switch_busy_s: busy,
        switch_mpps_per_busy_second: fwd as f64 / busy / 1e6,
        switch_poll_us: poll_us,
        placement,
        switch_frames_per_batch: fwd as f64 / batches.max(1) as f64,
        generator_limited: limit == Limit::Generator,
        switch_dropped_at_receiver: dropped_at_receiver,
        limit,
        figures,
        paper_vale_mpps: 20.0,
        ring_to_ring_mpps: r.pps / 1e6,
        sender_mpps: t.pps / 1e6,
        lost: t.packets.saturating_sub(r.packets),
        switch_per_core_over_goal: fwd as f64 / switch_cpu / 1e6 / 30.0,
        sender: t,
        receiver: r,
    })
}

/// The DPDK side-by-side: testpmd -> memif -> switch -> memif -> testpmd
/// against two testpmds over memif directly.
#[derive(Clone, Debug)]
pub struct MemifOptions {
    /// Seconds of measurement per row (after traffic is flowing).
    pub seconds: f64,
    /// log2 of the memif ring size (DPDK's `rsize`; 10 is its default).
    pub ring_log2: u8,
    /// Where the switch thread runs in each row.
    pub switch_cpu: SwitchPlacement,
    /// memif interrupt moderation of the switch, microseconds (0: off; see
    /// `vswitch::Config::memif_moderation`).
    pub moderation_us: u64,
}

/// Where the memif rows put the switch thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SwitchPlacement {
    /// Per row, the core that leaves each busy thread the most: with two
    /// testpmds (both cores busy-polling) the sending testpmd's forwarding
    /// core, where the switch takes turns with the sender it waits for;
    /// with one testpmd (one core busy-polling) the core testpmd leaves
    /// free, so that each busy thread has a core, as in the direct pair.
    Auto,
    /// This CPU in every row.
    Cpu(usize),
    /// Wherever the scheduler puts it.
    Unpinned,
}

impl SwitchPlacement {
    /// The CPU for a row whose busiest testpmd forwards on `busy`, with
    /// `free` the core no testpmd forwards on, if there is one.
    fn cpu(self, busy: usize, free: Option<usize>) -> Option<usize> {
        match self {
            SwitchPlacement::Auto => Some(free.unwrap_or(busy)),
            SwitchPlacement::Cpu(c) => Some(c),
            SwitchPlacement::Unpinned => None,
        }
    }
}

/// In documents as on the command line: "auto", "none" or the CPU's
/// number.
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum PlacementKey {
    Cpu(usize),
    Name(String),
}

impl Serialize for SwitchPlacement {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match *self {
            SwitchPlacement::Auto => PlacementKey::Name("auto".into()),
            SwitchPlacement::Cpu(c) => PlacementKey::Cpu(c),
            SwitchPlacement::Unpinned => PlacementKey::Name("none".into()),
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for SwitchPlacement {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match PlacementKey::deserialize(d)? {
            PlacementKey::Cpu(c) => Ok(SwitchPlacement::Cpu(c)),
            PlacementKey::Name(n) if n == "auto" => Ok(SwitchPlacement::Auto),
            PlacementKey::Name(n) if n == "none" => Ok(SwitchPlacement::Unpinned),
            PlacementKey::Name(n) => Err(serde::de::Error::custom(format!(
                "switch placement {n:?}: not \"auto\", \"none\" or a CPU number"
            ))),
        }
    }
}

impl std::fmt::Display for SwitchPlacement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SwitchPlacement::Auto => f.write_str("auto"),
            SwitchPlacement::Cpu(c) => write!(f, "{c}"),
            SwitchPlacement::Unpinned => f.write_str("none"),
        }
    }
}

/// The CPU testpmd forwards on when its main lcore is `main_lcore`
/// ([`Pmd::start`] gives it CPUs 0 and 1).
fn forwarding_cpu(main_lcore: u32) -> usize {
    1 - main_lcore.min(1) as usize
}

/// A testpmd process, killed if dropped.
struct Pmd {
    child: Option<std::process::Child>,
    log: PathBuf,
    prefix: String,
    /// Which testpmd, for errors ("the generator testpmd (s3gen)").
    name: String,
}

impl Drop for Pmd {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_file(&self.log);
        // DPDK's runtime directory for this --file-prefix.
        let _ = std::fs::remove_dir_all(format!("/var/run/dpdk/{}", self.prefix));
    }
}

impl Pmd {
    /// Start testpmd on CPUs 0-1 with its main lcore on `main_lcore` (the
    /// forwarding lcore is the other one), memif ports `vdevs`, forwarding
    /// mode `fwd`, printing its port statistics every second.
    fn start(
        tag: &str,
        main_lcore: u32,
        vdevs: &[String],
        fwd: &str,
        extra: &[String],
    ) -> Result<Pmd, Error> {
        let bin = crate::peers::testpmd_path().ok_or(Error::NoTestpmd)?;
        let pid = std::process::id();
        let log = std::env::temp_dir().join(format!("fp-swbench-{pid}-{tag}.log"));
        let prefix = format!("fp-sw-{pid}-{tag}");
        let out = std::fs::File::create(&log).map_err(|source| Error::Testpmd {
            what: "creating its log",
            source,
        })?;
        let err = out.try_clone().map_err(|source| Error::Testpmd {
            what: "creating its log",
            source,
        })?;
        // stdbuf: line-buffered output, so that the statistics are in the log
        // as they are printed (testpmd dies by its own signal on SIGINT).
        let child = std::process::Command::new("stdbuf")
            .arg("-oL")
            .arg(bin)
            .args(["-l", "0-1", "--main-lcore"])
            .arg(main_lcore.to_string())
            .args([
                "--no-huge",
                "-m",
                "512",
                "--no-pci",
                "--log-level=lib.eal:error",
            ])
            .arg(format!("--file-prefix={prefix}"))
            .args(vdevs.iter().map(|v| format!("--vdev={v}")))
            .arg("--")
            .arg(format!("--forward-mode={fwd}"))
            .args([
                "--auto-start",
                "--stats-period=1",
                "--total-num-mbufs=16384",
            ])
            .args(extra)
            .stdin(std::process::Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|source| Error::Testpmd {
                what: "starting dpdk-testpmd",
                source,
            })?;
        Ok(Pmd {
            child: Some(child),
            log,
            prefix,
            name: format!("testpmd {tag} ({fwd})"),
        })
    }

    /// Whether the process still runs (not exited, not a zombie).
    fn alive(&self) -> bool {
        crate::proc::alive(self.pid())
    }

    /// The last lines of its log.
    fn tail(&self) -> String {
        let t = self.text();
        let lines: Vec<&str> = t.lines().rev().take(8).collect();
        lines.into_iter().rev().collect::<Vec<_>>().join("\n")
    }

    fn pid(&self) -> i32 {
        self.child.as_ref().map_or(0, |c| c.id() as i32)
    }

    fn text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The "Rx-pps" or "Tx-pps" figures printed so far, in order.
    fn samples(&self, key: &str) -> Vec<f64> {
        samples(&self.text(), key)
    }

    /// CPU seconds the whole process has used.
    fn cpu(&self) -> f64 {
        crate::proc::cpu_seconds(self.pid())
    }

    /// SIGINT (testpmd stops forwarding and prints its totals), then wait
    /// up to 5 s; returns the log.
    fn stop(self) -> String {
        let [log] = Pmd::stop_all([self]);
        log
    }

    /// SIGINT to every one at once (each stops forwarding and prints its
    /// totals before it closes its ports, so none sees its memif peer go
    /// away first: a memif that lost its peer loses the port counters the
    /// totals come from), then wait up to 5 s for each; returns the logs.
    fn stop_all<const N: usize>(mut pmds: [Pmd; N]) -> [String; N] {
        for p in &pmds {
            if let Some(c) = &p.child {
                // SAFETY: kill(2) on our own child, which has not been reaped.
                unsafe { libc::kill(c.id() as i32, libc::SIGINT) };
            }
        }
        let end = std::time::Instant::now() + Duration::from_secs(5);
        for p in &mut pmds {
            if let Some(mut c) = p.child.take() {
                while std::time::Instant::now() < end {
                    if matches!(c.try_wait(), Ok(Some(_))) {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        pmds.map(|p| p.text())
    }
}

/// Every number after `key` (e.g. "Rx-pps:") in testpmd's output.
fn samples(text: &str, key: &str) -> Vec<f64> {
    text.match_indices(key)
        .filter_map(|(i, _)| {
            text[i + key.len()..]
                .split_whitespace()
                .next()
                .and_then(|w| w.parse().ok())
        })
        .collect()
}

/// testpmd's accumulated forward statistics (printed when it stops):
/// (RX-packets, RX-dropped, TX-packets, TX-dropped).
fn forward_totals(text: &str) -> Option<(u64, u64, u64, u64)> {
    let i = text.rfind("Accumulated forward statistics")?;
    let t = &text[i..];
    let n = |k: &str| samples(t, k).first().map(|x| *x as u64);
    Some((
        n("RX-packets:")?,
        n("RX-dropped:")?,
        n("TX-packets:")?,
        n("TX-dropped:")?,
    ))
}

/// The share of its sends a testpmd generator could not place in its ring
/// (TX-dropped over all it tried), from [`forward_totals`].
fn refused_share(totals: Option<(u64, u64, u64, u64)>) -> Option<f64> {
    totals.map(|(_, _, sent, dropped)| dropped as f64 / (sent + dropped).max(1) as f64)
}

/// testpmd's reports a memif window must hold (it prints once a second).
pub const MEMIF_MIN_REPORTS: usize = 2;
/// The shortest memif window, seconds: [`MEMIF_MIN_REPORTS`] reports.
pub const MEMIF_MIN_SECONDS: f64 = MEMIF_MIN_REPORTS as f64;
/// The longest memif window, seconds.
pub const MEMIF_MAX_SECONDS: f64 = 60.0;
/// How long the switch has to answer a status request.
const STATUS_TIMEOUT: Duration = Duration::from_secs(5);

/// Checks that a memif window can measure: at least
/// [`MEMIF_MIN_SECONDS`] (shorter ones may hold no testpmd report, and
/// would print 0 for a rate never measured), at most
/// [`MEMIF_MAX_SECONDS`].
pub fn check_memif_seconds(seconds: f64) -> Result<(), Error> {
    if (MEMIF_MIN_SECONDS..=MEMIF_MAX_SECONDS).contains(&seconds) {
        Ok(())
    } else {
        Err(Error::Window {
            seconds,
            min: MEMIF_MIN_SECONDS,
            max: MEMIF_MAX_SECONDS,
        })
    }
}

/// Waits up to `secs` for `f`, checking that every testpmd in `pmds` is
/// still running; the error names what did not happen and ends with each
/// testpmd's last lines.
fn wait_for(
    what: &str,
    secs: f64,
    pmds: &[&Pmd],
    mut f: impl FnMut() -> bool,
) -> Result<(), Error> {
    let end = std::time::Instant::now() + Duration::from_secs_f64(secs);
    loop {
        if f() {
            return Ok(());
        }
        if let Some(p) = pmds.iter().find(|p| !p.alive()) {
            return Err(Error::TestpmdExited {
                name: p.name.clone(),
                what: what.to_string(),
                tail: p.tail(),
            });
        }
        if std::time::Instant::now() >= end {
            let detail: String = pmds
                .iter()
                .map(|p| format!("\n--- {}: its log ends ---\n{}", p.name, p.tail()))
                .collect();
            return Err(Error::Timeout {
                what: what.to_string(),
                secs,
                detail,
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The switch's status on `ctl`, or an error naming the switch if it does
/// not answer within [`STATUS_TIMEOUT`] (the request runs on a thread of
/// its own, which the switch's end releases).
fn switch_status(ctl: &std::path::Path, why: &str) -> Result<vswitch::Status, Error> {
    let (tx, rx) = std::sync::mpsc::channel();
    let path = ctl.to_path_buf();
    std::thread::spawn(move || {
        let _ = tx.send(vswitch::status::ask(&path));
    });
    match rx.recv_timeout(STATUS_TIMEOUT) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(source)) => Err(Error::SwitchStatus {
            path: ctl.to_path_buf(),
            source,
        }),
        Err(_) => Err(Error::Timeout {
            what: format!(
                "the switch to answer a status request on {} ({why})",
                ctl.display()
            ),
            secs: STATUS_TIMEOUT.as_secs_f64(),
            detail: String::new(),
        }),
    }
}

const GEN_MAC: &str = "02:fa:00:00:01:01";
const SINK_MAC: &str = "02:fa:00:00:01:02";

/// A generator testpmd's totals when it stopped.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct GeneratorTotals {
    /// Frames it sent.
    pub tx_packets: u64,
    /// Frames its ring refused.
    pub tx_dropped: u64,
}

/// A sink testpmd's totals when it stopped.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct SinkTotals {
    /// Frames it received.
    pub rx_packets: u64,
    /// Frames it dropped.
    pub rx_dropped: u64,
}

/// The totals of a testpmd that both sends and receives.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct TestpmdTotals {
    /// Frames it received.
    pub rx_packets: u64,
    /// Frames it dropped on receive.
    pub rx_dropped: u64,
    /// Frames it sent.
    pub tx_packets: u64,
    /// Frames its ring refused.
    pub tx_dropped: u64,
}

/// The share of the machine's CPU time (cores x seconds) each thread of a
/// memif row used.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct MemifShares {
    /// CPUs the process may use.
    pub cores: f64,
    /// The generating testpmd (the only one, in the one-testpmd row).
    #[serde(deserialize_with = "crate::nan::f64")]
    pub generator: f64,
    /// The sink testpmd (0 in the one-testpmd row: the generator sinks).
    #[serde(deserialize_with = "crate::nan::f64")]
    pub sink: f64,
    /// The switch thread, in the rows through the switch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub switch: Option<f64>,
}

/// One memif row: testpmd to testpmd, directly or through the switch. The
/// switch's figures are there only in the rows through it.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct MemifRow {
    /// What the frames went through.
    pub path: String,
    /// Median of the sink's per-second rate, millions; `None` when the row
    /// measured nothing (never a 0 that reads as a measurement).
    pub delivered_mpps: Option<f64>,
    /// Median of the generator's per-second rate, millions.
    #[serde(deserialize_with = "crate::nan::f64")]
    pub generator_mpps: f64,
    /// The sink's per-second rates inside the window.
    #[serde(deserialize_with = "crate::nan::vec")]
    pub sink_rx_pps_samples: Vec<f64>,
    /// The generator's per-second rates inside the window.
    #[serde(deserialize_with = "crate::nan::vec")]
    pub generator_tx_pps_samples: Vec<f64>,
    /// Share of its sends the generator could not place in its ring.
    pub generator_refused_share: Option<f64>,
    /// CPU seconds of the generating testpmd (two-testpmd rows).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generator_cpu_s: Option<f64>,
    /// CPU seconds of the sink testpmd (two-testpmd rows).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sink_cpu_s: Option<f64>,
    /// CPU seconds of the one testpmd (the one-testpmd row).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub testpmd_cpu_s: Option<f64>,
    /// CPU seconds of the switch thread over the window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub switch_cpu_s: Option<f64>,
    /// Wall-clock seconds of the window.
    #[serde(deserialize_with = "crate::nan::f64")]
    pub window_s: f64,
    /// Frames the switch forwarded in the window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub switch_forwarded: Option<f64>,
    /// Frames the switch flooded in the window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub switch_flooded: Option<f64>,
    /// Frames forwarded per second of the switch's CPU time, millions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub switch_mpps_per_core: Option<f64>,
    /// Share of the switch's passes in the window that found no frame.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub switch_idle_pass_share: Option<f64>,
    /// Frames the switch dropped at full rings since it started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub switch_dropped_full_total: Option<u64>,
    /// Each thread's share of the machine's CPU time.
    pub share_of_cores: MemifShares,
    /// The generator's totals (two-testpmd rows).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub testpmd_generator_totals: Option<GeneratorTotals>,
    /// The sink's totals (two-testpmd rows).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub testpmd_sink_totals: Option<SinkTotals>,
    /// The one testpmd's totals (the one-testpmd row).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub testpmd_totals: Option<TestpmdTotals>,
    /// The CPU the switch thread was to run on (rows through the switch;
    /// none there: the scheduler placed it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub switch_pinned_cpu: Option<usize>,
    /// Whether pinning the switch thread took (when it was asked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub switch_pinned: Option<bool>,
    /// The counters the verdict was decided from.
    pub figures: Option<PathFigures>,
    /// What set the pace: a [`Limit::key`], or "unclassified" (the direct
    /// row whose totals cannot be trusted) or "testpmd" (the one-testpmd
    /// row, whose generator and receiver are one thread).
    pub limit: String,
    /// Why the limit is what it is, where that needs saying.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
    /// The generator set the pace.
    pub generator_limited: bool,
    /// The row measured something.
    pub valid: bool,
    /// What made the row measure nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invalid_reason: Option<String>,
}

/// testpmd's totals of a pair run: the generator's and the sink's.
#[derive(Clone, Copy, Debug, Default)]
struct PairTotals {
    /// (RX-packets, RX-dropped, TX-packets, TX-dropped) of the generator.
    gen: Option<(u64, u64, u64, u64)>,
    /// The same of the sink.
    sink: Option<(u64, u64, u64, u64)>,
}

/// Measure a generator and a sink already started: wait for traffic, take
/// the per-second samples printed during a window of at least `secs` and
/// [`MEMIF_MIN_REPORTS`] reports of each, the CPU each used, stop both.
/// `around` is called at the start and the end of the window. Every wait
/// is bounded and names the testpmd that did not report.
fn measure_pair(
    gen: Pmd,
    sink: Pmd,
    secs: f64,
    mut around: impl FnMut() -> Result<(), Error>,
) -> Result<(MemifRow, PairTotals), Error> {
    wait_for(
        &format!("traffic at the sink ({} printing Rx-pps > 0)", sink.name),
        30.0,
        &[&gen, &sink],
        || sink.samples("Rx-pps:").iter().any(|&x| x > 0.0),
    )?;
    // One more report, so that the window starts with traffic flowing.
    let k = sink.samples("Rx-pps:").len();
    wait_for(
        &format!("{}'s next report", sink.name),
        10.0,
        &[&gen, &sink],
        || sink.samples("Rx-pps:").len() > k,
    )?;
    let (g0, s0) = (gen.samples("Tx-pps:").len(), sink.samples("Rx-pps:").len());
    let (gc0, sc0) = (gen.cpu(), sink.cpu());
    let t0 = std::time::Instant::now();
    around()?;
    std::thread::sleep(Duration::from_secs_f64(secs));
    // The window holds at least MIN_REPORTS reports of each.
    wait_for(
        &format!(
            "{MEMIF_MIN_REPORTS} reports of {} and {} inside the window",
            gen.name, sink.name
        ),
        MEMIF_MIN_REPORTS as f64 + 10.0,
        &[&gen, &sink],
        || {
            gen.samples("Tx-pps:").len() >= g0 + MEMIF_MIN_REPORTS
                && sink.samples("Rx-pps:").len() >= s0 + MEMIF_MIN_REPORTS
        },
    )?;
    around()?;
    let wall = t0.elapsed().as_secs_f64();
    let (gc, sc) = (gen.cpu() - gc0, sink.cpu() - sc0);
    let g1 = gen.samples("Tx-pps:").len();
    let s1 = sink.samples("Rx-pps:").len();
    let [gen_log, sink_log] = Pmd::stop_all([gen, sink]);
    let tx: Vec<f64> = samples(&gen_log, "Tx-pps:")
        .into_iter()
        .skip(g0)
        .take(g1 - g0)
        .collect();
    let rx: Vec<f64> = samples(&sink_log, "Rx-pps:")
        .into_iter()
        .skip(s0)
        .take(s1 - s0)
        .collect();
    let totals = PairTotals {
        gen: forward_totals(&gen_log),
        sink: forward_totals(&sink_log),
    };
    let refused = refused_share(totals.gen);
    let c = cores();
    Ok((
        MemifRow {
            delivered_mpps: Some(upper_median(&mut rx.clone()).unwrap_or(0.0) / 1e6),
            generator_mpps: upper_median(&mut tx.clone()).unwrap_or(0.0) / 1e6,
            sink_rx_pps_samples: rx,
            generator_tx_pps_samples: tx,
            generator_refused_share: refused,
            generator_cpu_s: Some(gc),
            sink_cpu_s: Some(sc),
            window_s: wall,
            share_of_cores: MemifShares {
                cores: c,
                generator: gc / (wall * c),
                sink: sc / (wall * c),
                switch: None,
            },
            testpmd_generator_totals: totals.gen.map(|(_, _, tx_packets, tx_dropped)| {
                GeneratorTotals {
                    tx_packets,
                    tx_dropped,
                }
            }),
            testpmd_sink_totals: totals
                .sink
                .map(|(rx_packets, rx_dropped, _, _)| SinkTotals {
                    rx_packets,
                    rx_dropped,
                }),
            ..MemifRow::default()
        },
        totals,
    ))
}

/// Frames a memif path may hold when testpmd stops: both rings of each
/// memif and a burst on each side.
fn memif_in_flight(o: &MemifOptions, memifs: u64) -> u64 {
    memifs * 2 * (1u64 << o.ring_log2) + 2 * 512
}

/// Sets a memif row's verdict from `figures`: `limit` and `why`,
/// `generator_limited`, `valid`, and for a row that measured nothing
/// (no report inside its window, a zero rate, counters that contradict
/// each other) `delivered_mpps` null and `invalid_reason`: never a 0 that
/// reads as a measurement.
fn verdict(v: &mut MemifRow, figures: Option<PathFigures>) {
    let no_samples = v.sink_rx_pps_samples.is_empty();
    let limit = match figures {
        _ if no_samples => Limit::Invalid("no testpmd report fell inside the window".into()),
        None => Limit::Invalid("testpmd printed no totals when it stopped".into()),
        Some(f) => classify(&f),
    };
    let limit = match limit {
        Limit::Invalid(_) => limit,
        _ if v.delivered_mpps.is_none_or(|x| x <= 0.0) => {
            Limit::Invalid("testpmd reported 0 packets per second at the sink".into())
        }
        l => l,
    };
    v.figures = figures;
    v.limit = limit.key().to_string();
    v.generator_limited = limit == Limit::Generator;
    v.valid = !matches!(limit, Limit::Invalid(_));
    if let Limit::Invalid(why) = limit {
        v.delivered_mpps = None;
        v.invalid_reason = Some(why);
    }
}

/// testpmd txonly -> testpmd rxonly over one memif, each forwarding on its
/// own CPU.
fn memif_direct(o: &MemifOptions) -> Result<MemifRow, Error> {
    let n = RUN.fetch_add(1, Ordering::Relaxed);
    let sock = std::env::temp_dir().join(format!("fp-swbench-{}-{n}.memif", std::process::id()));
    let _ = std::fs::remove_file(&sock);
    let vdev = |role: &str, mac: &str| {
        format!(
            "net_memif0,role={role},id=0,socket-abstract=no,socket={},rsize={},mac={mac}",
            sock.display(),
            o.ring_log2
        )
    };
    let gen = Pmd::start(
        &format!("d{n}gen"),
        0,
        &[vdev("server", GEN_MAC)],
        "txonly",
        &["--txpkts=60".into(), format!("--eth-peer=0,{SINK_MAC}")],
    )?;
    wait_for(
        &format!("{} to create its memif socket", gen.name),
        30.0,
        &[&gen],
        || sock.exists(),
    )?;
    let sink = Pmd::start(
        &format!("d{n}sink"),
        1,
        &[vdev("client", SINK_MAC)],
        "rxonly",
        &[],
    )?;
    let r = measure_pair(gen, sink, o.seconds, || Ok(()));
    let _ = std::fs::remove_file(&sock);
    let (mut v, t) = r?;
    let figures = t.gen.zip(t.sink).map(|(g, s)| PathFigures {
        offered: g.2,
        refused_at_generator: g.3,
        forwarded: None,
        received: s.0,
        dropped_at_receiver: s.1,
        dropped_no_destination: 0,
        switch_idle_share: None,
        in_flight_allowance: memif_in_flight(o, 1),
    });
    // testpmd's totals of a memif pair connected to each other are not to
    // be trusted: once one side stops, the other's port counters read 0 or
    // wrap (seen: a server's TX 0, a client's RX 2^64 - 1). The per-second
    // figures, taken while both ran, are right: when both printed some,
    // the rate stands and the totals decide no limit.
    let nonzero = |a: &[f64]| a.iter().any(|&x| x > 0.0);
    let rates_ok = nonzero(&v.generator_tx_pps_samples) && nonzero(&v.sink_rx_pps_samples);
    verdict(&mut v, figures);
    if rates_ok && !v.valid {
        let why = v.invalid_reason.take();
        let mut rx: Vec<f64> = v
            .sink_rx_pps_samples
            .iter()
            .copied()
            .filter(|x| x.is_finite())
            .collect();
        v.delivered_mpps = Some(upper_median(&mut rx).unwrap_or(0.0) / 1e6);
        v.valid = true;
        v.limit = "unclassified".into();
        v.why = Some(format!(
            "testpmd's totals of a memif pair are unreliable once one side stops ({}); the per-second rates are the measurement, the totals decide no limit",
            why.as_deref().unwrap_or("?")
        ));
    }
    v.path = "testpmd txonly -> memif -> testpmd rxonly".into();
    Ok(v)
}

/// A switch with a memif listener and a control socket of its own, on a
/// thread (pinned to a CPU if given), for the memif rows.
struct MemifSwitch {
    /// This run's number (names testpmd's file prefix).
    n: u32,
    /// The memif listener testpmd connects to.
    sock: std::path::PathBuf,
    /// The switch's control socket (status).
    ctl: std::path::PathBuf,
    /// The switch thread's CPU clock.
    clock: Option<ThreadClock>,
    /// The CPU it was to be pinned to (None: not asked).
    cpu: Option<usize>,
    /// Whether pinning to `cpu` took (None: not asked).
    pinned: Option<bool>,
}

/// Starts a [`MemifSwitch`], runs `body` against it, then stops the switch
/// and removes its sockets, whatever `body` returned.
fn with_memif_switch(
    o: &MemifOptions,
    cpu: Option<usize>,
    body: impl FnOnce(&MemifSwitch) -> Result<MemifRow, Error>,
) -> Result<MemifRow, Error> {
    let n = RUN.fetch_add(1, Ordering::Relaxed);
    let pid = std::process::id();
    let sock = std::env::temp_dir().join(format!("fp-swbench-{pid}-{n}.memif"));
    let ctl = std::env::temp_dir().join(format!("fp-swbench-{pid}-{n}.sock"));
    let moderation = std::time::Duration::from_micros(o.moderation_us);
    let sw = Switch::new(Config {
        socket: Some(ctl.clone()),
        memif_socket: Some(sock.clone()),
        log_ports: false,
        memif_moderation: moderation,
        // Moderated, the switch shares its core with a sender that never
        // yields: polling an empty ring there only delays that sender.
        poll_us: if moderation.is_zero() {
            Config::default().poll_us
        } else {
            0
        },
        ..Config::default()
    })
    .map_err(Error::Switch)?;
    let (stop, h) = spawn(sw).map_err(Error::Switch)?;
    let m = MemifSwitch {
        n,
        cpu,
        pinned: cpu.map(|c| crate::cpus::pin_thread(&h, c)),
        clock: ThreadClock::of(&h),
        sock,
        ctl,
    };
    let result = body(&m);
    stop.store(true, Ordering::Relaxed);
    let _ = h.join();
    let _ = std::fs::remove_file(&m.sock);
    let _ = std::fs::remove_file(&m.ctl);
    result
}

/// The switch's frames dropped at full rings, over all its ports.
fn dropped_full_total(status: &vswitch::Status) -> u64 {
    status.ports.iter().map(|p| p.dropped_full).sum()
}

/// testpmd txonly -> memif -> switch -> memif -> testpmd rxonly.
fn memif_switched(o: &MemifOptions) -> Result<MemifRow, Error> {
    // Both cores busy-poll (a testpmd each): the switch shares the sender's.
    let cpu = o.switch_cpu.cpu(forwarding_cpu(0), None);
    with_memif_switch(o, cpu, |m| {
        let MemifSwitch {
            n,
            ref sock,
            ref ctl,
            ref clock,
            cpu: pinned_cpu,
            pinned,
        } = *m;
        let vdev = |id: u32, mac: &str| {
            format!(
                "net_memif0,role=client,id={id},socket-abstract=no,socket={},rsize={},mac={mac}",
                sock.display(),
                o.ring_log2
            )
        };
        // The sink first: its one burst (--tx-first) teaches the switch its
        // address, so the generator's frames are unicast.
        let sink = Pmd::start(
            &format!("s{n}sink"),
            1,
            &[vdev(1, SINK_MAC)],
            "rxonly",
            &["--tx-first".into(), format!("--eth-peer=0,{GEN_MAC}")],
        )?;
        wait_for(
            &format!("{}'s memif port to appear on the switch", sink.name),
            30.0,
            &[&sink],
            || {
                switch_status(ctl, "its ports")
                    .ok()
                    .map(|s| s.ports.len())
                    .unwrap_or(0)
                    >= 1
            },
        )?;
        let gen = Pmd::start(
            &format!("s{n}gen"),
            0,
            &[vdev(0, GEN_MAC)],
            "txonly",
            &["--txpkts=60".into(), format!("--eth-peer=0,{SINK_MAC}")],
        )?;
        let mut marks: Vec<(f64, vswitch::Status)> = Vec::new();
        let (mut v, t) = measure_pair(gen, sink, o.seconds, || {
            marks.push((
                clock.as_ref().map_or(f64::NAN, ThreadClock::secs),
                switch_status(ctl, "its counters at an end of the window")?,
            ));
            Ok(())
        })?;
        // The switch's own totals since it started, as testpmd's are.
        let end = switch_status(ctl, "its totals after testpmd stopped")?;
        let mut dropped_full = 0;
        if let [(c0, s0), (c1, s1)] = &marks[..] {
            let d = |k: fn(&SwitchStats) -> u64| k(&s1.switch) as f64 - k(&s0.switch) as f64;
            let cpu = c1 - c0;
            let wall = v.window_s;
            v.switch_cpu_s = Some(cpu);
            v.switch_forwarded = Some(d(|s| s.forwarded));
            v.switch_flooded = Some(d(|s| s.flooded));
            v.switch_mpps_per_core = Some(d(|s| s.forwarded) / cpu / 1e6);
            v.switch_idle_pass_share = Some(d(|s| s.idle_passes) / d(|s| s.passes).max(1.0));
            v.share_of_cores.switch = Some(cpu / (wall * cores()));
            dropped_full = dropped_full_total(s1);
            v.switch_dropped_full_total = Some(dropped_full);
        }
        let total = |k: fn(&SwitchStats) -> u64| k(&end.switch);
        let idle = total(|s| s.idle_passes) as f64 / total(|s| s.passes).max(1) as f64;
        let figures = t.gen.zip(t.sink).map(|(g, s)| PathFigures {
            offered: g.2,
            refused_at_generator: g.3,
            forwarded: Some(total(|s| s.forwarded)),
            received: s.0,
            dropped_at_receiver: s.1 + dropped_full,
            dropped_no_destination: total(|s| s.no_destination),
            switch_idle_share: Some(idle),
            in_flight_allowance: memif_in_flight(o, 2),
        });
        verdict(&mut v, figures);
        v.path = "testpmd txonly -> memif -> switch -> memif -> testpmd rxonly".into();
        v.switch_pinned_cpu = pinned_cpu;
        v.switch_pinned = pinned;
        Ok(v)
    })
}

/// Sum testpmd's per-port figures printed in one report: with `ports`
/// ports, every `ports` consecutive samples are one report.
fn per_report(v: &[f64], ports: usize) -> Vec<f64> {
    v.chunks_exact(ports).map(|c| c.iter().sum()).collect()
}

/// One testpmd process, forwarding mode flowgen (each stream receives and
/// discards on one port, generates on the other), with two memif ports on
/// the switch and one forwarding core: generator and sink in one thread, so
/// that it and the switch are the only busy threads on the 2 cores.
fn memif_switched_loop(o: &MemifOptions) -> Result<MemifRow, Error> {
    // One core busy-polls (testpmd's forwarding lcore); its main lcore's
    // core is free for the switch.
    let cpu = o.switch_cpu.cpu(forwarding_cpu(0), Some(forwarding_cpu(1)));
    with_memif_switch(o, cpu, |m| {
        let MemifSwitch {
            n,
            ref sock,
            ref ctl,
            ref clock,
            cpu: pinned_cpu,
            pinned,
        } = *m;
        let vdev = |i: u32, mac: &str| {
            format!(
                "net_memif{i},role=client,id={i},socket-abstract=no,socket={},rsize={},mac={mac}",
                sock.display(),
                o.ring_log2
            )
        };
        // Forwarding lcore on CPU 1 (main lcore 0).
        let pmd = Pmd::start(
            &format!("l{n}"),
            0,
            &[vdev(0, GEN_MAC), vdev(1, SINK_MAC)],
            "flowgen",
            &[
                "--txpkts=60".into(),
                format!("--eth-peer=0,{SINK_MAC}"),
                format!("--eth-peer=1,{GEN_MAC}"),
                "--nb-cores=1".into(),
            ],
        )?;
        let rx = |p: &Pmd| per_report(&p.samples("Rx-pps:"), 2);
        wait_for(
            &format!(
                "traffic through the switch ({} printing Rx-pps > 0)",
                pmd.name
            ),
            30.0,
            &[&pmd],
            || rx(&pmd).iter().any(|&x| x > 0.0),
        )?;
        let k = rx(&pmd).len();
        wait_for(
            &format!("{}'s next report", pmd.name),
            10.0,
            &[&pmd],
            || rx(&pmd).len() > k,
        )?;
        let r0 = rx(&pmd).len();
        let pc0 = pmd.cpu();
        let c0 = clock.as_ref().map_or(f64::NAN, ThreadClock::secs);
        let s0 = switch_status(ctl, "its counters at the start of the window")?;
        let t0 = std::time::Instant::now();
        std::thread::sleep(Duration::from_secs_f64(o.seconds));
        wait_for(
            &format!(
                "{MEMIF_MIN_REPORTS} reports of {} inside the window",
                pmd.name
            ),
            MEMIF_MIN_REPORTS as f64 + 10.0,
            &[&pmd],
            || rx(&pmd).len() >= r0 + MEMIF_MIN_REPORTS,
        )?;
        let s1 = switch_status(ctl, "its counters at the end of the window")?;
        let cpu = clock.as_ref().map_or(f64::NAN, ThreadClock::secs) - c0;
        let pc = pmd.cpu() - pc0;
        let wall = t0.elapsed().as_secs_f64();
        let r1 = rx(&pmd).len();
        let log = pmd.stop();
        let end = switch_status(ctl, "its totals after testpmd stopped")?;
        let rxs: Vec<f64> = per_report(&samples(&log, "Rx-pps:"), 2)
            .into_iter()
            .skip(r0)
            .take(r1 - r0)
            .collect();
        let txs: Vec<f64> = per_report(&samples(&log, "Tx-pps:"), 2)
            .into_iter()
            .skip(r0)
            .take(r1 - r0)
            .collect();
        let totals = forward_totals(&log);
        let refused = refused_share(totals);
        let d = |k: fn(&SwitchStats) -> u64| k(&s1.switch) as f64 - k(&s0.switch) as f64;
        let total = |k: fn(&SwitchStats) -> u64| k(&end.switch);
        let dropped_full = dropped_full_total(&s1);
        let c = cores();
        let mut v = MemifRow {
            path: "testpmd flowgen port 0 -> memif -> switch -> memif -> port 1 (and back), one testpmd forwarding core".into(),
            delivered_mpps: Some(upper_median(&mut rxs.clone()).unwrap_or(0.0) / 1e6),
            generator_mpps: upper_median(&mut txs.clone()).unwrap_or(0.0) / 1e6,
            sink_rx_pps_samples: rxs,
            generator_tx_pps_samples: txs,
            generator_refused_share: refused,
            testpmd_cpu_s: Some(pc),
            switch_cpu_s: Some(cpu),
            window_s: wall,
            switch_forwarded: Some(d(|s| s.forwarded)),
            switch_flooded: Some(d(|s| s.flooded)),
            switch_mpps_per_core: Some(d(|s| s.forwarded) / cpu / 1e6),
            switch_idle_pass_share: Some(d(|s| s.idle_passes) / d(|s| s.passes).max(1.0)),
            switch_dropped_full_total: Some(dropped_full),
            share_of_cores: MemifShares {
                cores: c,
                generator: pc / (wall * c),
                sink: 0.0,
                switch: Some(cpu / (wall * c)),
            },
            testpmd_totals: totals.map(|(rx_packets, rx_dropped, tx_packets, tx_dropped)| {
                TestpmdTotals {
                    rx_packets,
                    rx_dropped,
                    tx_packets,
                    tx_dropped,
                }
            }),
            switch_pinned_cpu: pinned_cpu,
            switch_pinned: pinned,
            ..MemifRow::default()
        };
        let figures = totals.map(|(r, rd, t, td)| PathFigures {
            offered: t,
            refused_at_generator: td,
            forwarded: Some(total(|s| s.forwarded)),
            received: r,
            dropped_at_receiver: rd + dropped_full,
            dropped_no_destination: total(|s| s.no_destination),
            switch_idle_share: Some(
                total(|s| s.idle_passes) as f64 / total(|s| s.passes).max(1) as f64,
            ),
            in_flight_allowance: memif_in_flight(o, 2),
        });
        verdict(&mut v, figures);
        // Generator and receiver are one testpmd thread here: either verdict
        // names that thread.
        if matches!(v.limit.as_str(), "receiver" | "generator") {
            v.why = Some(format!(
                "{} (testpmd's one forwarding thread both sends and receives)",
                v.limit
            ));
            v.limit = "testpmd".into();
        }
        Ok(v)
    })
}

/// `row`'s delivered rate over `base`'s, or none when either row is
/// invalid (measured nothing).
fn ratio(row: &MemifRow, base: &MemifRow) -> Option<f64> {
    match (row.delivered_mpps, base.delivered_mpps) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

/// The memif rows of one run and their ratios.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Memif {
    /// One testpmd through the switch over the direct pair.
    pub switched_one_testpmd_over_direct: Option<f64>,
    /// One testpmd (flowgen) sending and receiving through the switch.
    pub switched_one_testpmd: MemifRow,
    /// Frame size in bytes.
    pub frame_bytes: usize,
    /// log2 of the memif ring size.
    pub ring_log2: u8,
    /// Seconds of measurement per row.
    pub seconds: f64,
    /// The switch's memif interrupt moderation, microseconds.
    pub switch_moderation_us: u64,
    /// Where the switch thread was asked to run.
    pub switch_cpu: SwitchPlacement,
    /// The switched pair over the direct pair.
    pub switched_over_direct: Option<f64>,
    /// Two testpmds over one memif, no switch.
    pub direct: MemifRow,
    /// Two testpmds, each on a memif of the switch.
    pub switched: MemifRow,
    /// What `switched_over_direct` should reach.
    pub goal_switched_over_direct: f64,
}

/// The memif part of a report: measured, or skipped and why.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(untagged)]
pub enum MemifPart {
    /// Not run.
    Skipped {
        /// Why.
        skipped: String,
    },
    /// The rows.
    Measured(Box<Memif>),
}

/// Both memif rows in one run, and the ratio switched / direct (none when
/// a row measured nothing).
pub fn memif_compare(o: &MemifOptions) -> Result<Memif, Error> {
    check_memif_seconds(o.seconds)?;
    let direct = memif_direct(o)?;
    let switched = memif_switched(o)?;
    let looped = memif_switched_loop(o)?;
    Ok(Memif {
        switched_one_testpmd_over_direct: ratio(&looped, &direct),
        switched_one_testpmd: looped,
        frame_bytes: 60,
        ring_log2: o.ring_log2,
        seconds: o.seconds,
        switch_moderation_us: o.moderation_us,
        switch_cpu: o.switch_cpu,
        switched_over_direct: ratio(&switched, &direct),
        direct,
        switched,
        goal_switched_over_direct: 0.5,
    })
}

/// One backend's transmit rates with fewer notifications over BASE's.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct BackendRatios {
    /// itr=100 SC over BASE itr=0, guest transmit.
    #[serde(deserialize_with = "crate::nan::f64")]
    pub sc_over_base_tx: f64,
    /// itr=100 CSB over BASE itr=0, guest transmit.
    #[serde(deserialize_with = "crate::nan::f64")]
    pub csb_over_base_tx: f64,
}

/// The switch's itr=0 CSB row over the TAP's.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct SwitchOverTap {
    /// Guest transmit.
    #[serde(deserialize_with = "crate::nan::f64")]
    pub tx: f64,
    /// Guest receive.
    #[serde(deserialize_with = "crate::nan::f64")]
    pub rx: f64,
}

/// Ratios between Figure 1's rows, where both rows were measured.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct Ratios {
    /// The switch backend's rows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub switch: Option<BackendRatios>,
    /// The TAP backend's rows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tap: Option<BackendRatios>,
    /// Switch over TAP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub switch_over_tap: Option<SwitchOverTap>,
}

impl Ratios {
    fn is_empty(&self) -> bool {
        self.switch.is_none() && self.tap.is_none() && self.switch_over_tap.is_none()
    }
}

/// `fastpath switch bench`: the parts that ran, each absent when it did
/// not.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Report {
    /// Seconds per measurement.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seconds_per_run: Option<f64>,
    /// Frame size of the transmit and receive rows, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frame_bytes: Option<usize>,
    /// Figure 1: per backend, its rows by [`Row::key`].
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub backends: BTreeMap<Backend, BTreeMap<String, RowResult>>,
    /// The switch's ring-to-ring forwarding rate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forwarding: Option<Forwarding>,
    /// DPDK testpmd over memif, directly and through the switch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memif: Option<MemifPart>,
    /// Ratios between Figure 1's rows.
    #[serde(default, skip_serializing_if = "Ratios::is_empty")]
    pub ratios: Ratios,
    /// Figure 1 with QEMU guests ([`crate::vm`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vm: Option<crate::vm::VmPart>,
    /// The other ports' forwarding while one port attacks
    /// ([`crate::isolation`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolation: Option<crate::isolation::Report>,
}

/// Run the parts `o` asks for; the vm part is [`crate::vm::run`]'s.
pub fn run(o: &Options) -> Result<Report, Error> {
    let mut backends = BTreeMap::new();
    let mut results: Vec<(Backend, Vec<RowResult>)> = Vec::new();
    for &b in &o.backends {
        let mut rows = Vec::new();
        let mut doc = BTreeMap::new();
        for row in &ROWS {
            let tx = measure(b, row, Kind::Tx(60), o.seconds, o.burst)?;
            let rx = measure(b, row, Kind::Rx, o.seconds, o.burst)?;
            let big = measure(b, row, Kind::Tx(1514), o.seconds, o.burst)?;
            let rr = measure(b, row, Kind::Rr, o.seconds, o.burst)?;
            let r = RowResult {
                label: row.label.to_string(),
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
            doc.insert(row.key.to_string(), r.clone());
            rows.push(r);
        }
        backends.insert(b, doc);
        results.push((b, rows));
    }
    let fwd = if o.forwarding {
        let f = forwarding(
            o.seconds.max(0.5),
            60,
            o.forwarding_burst,
            o.forwarding_poll_us,
            if o.forwarding_pin {
                Placement::Pinned
            } else {
                Placement::Scheduler
            },
        )?;
        if let Some(p) = &o.progress {
            p(&format!(
                "ring to ring: {:.2} Mpps per switch core, {:.2} Mpps end to end ({})",
                f.switch_mpps_per_core,
                f.end_to_end_mpps,
                f.limit.label()
            ));
        }
        Some(f)
    } else {
        None
    };
    let memif = match &o.memif {
        Some(m) => {
            let v = memif_compare(m)?;
            if let Some(p) = &o.progress {
                let rate = |r: &MemifRow| match r.delivered_mpps {
                    Some(x) => format!("{x:.2} Mpps ({})", r.limit),
                    None => format!(
                        "INVALID ({})",
                        r.invalid_reason.as_deref().unwrap_or("measured nothing")
                    ),
                };
                p(&format!(
                    "memif: direct {}, switched {}, ratio {}",
                    rate(&v.direct),
                    rate(&v.switched),
                    v.switched_over_direct
                        .map_or("none (a row is invalid)".to_string(), |x| format!(
                            "{x:.2}x"
                        )),
                ));
            }
            Some(MemifPart::Measured(Box::new(v)))
        }
        None => None,
    };
    let get = |b: Backend, key: &str| -> Option<&RowResult> {
        let i = ROWS.iter().position(|r| r.key == key)?;
        results
            .iter()
            .find(|(x, _)| *x == b)
            .map(|(_, rows)| &rows[i])
    };
    let mut ratios = Ratios::default();
    for &b in &o.backends {
        if let (Some(base), Some(sc), Some(csb)) = (
            get(b, "base_itr0"),
            get(b, "sc_itr100"),
            get(b, "csb_itr100"),
        ) {
            let r = Some(BackendRatios {
                sc_over_base_tx: sc.tx_kpps / base.tx_kpps,
                csb_over_base_tx: csb.tx_kpps / base.tx_kpps,
            });
            match b {
                Backend::Switch => ratios.switch = r,
                Backend::Tap => ratios.tap = r,
            }
        }
    }
    if let (Some(s), Some(t)) = (
        get(Backend::Switch, "csb_itr0"),
        get(Backend::Tap, "csb_itr0"),
    ) {
        ratios.switch_over_tap = Some(SwitchOverTap {
            tx: s.tx_kpps / t.tx_kpps,
            rx: s.rx_kpps / t.rx_kpps,
        });
    }
    Ok(Report {
        seconds_per_run: Some(o.seconds),
        frame_bytes: Some(60),
        backends,
        forwarding: fwd,
        memif,
        ratios,
        vm: None,
        isolation: None,
    })
}

/// `x` with `digits` decimals, `-` when there is none.
fn opt(x: Option<f64>, digits: usize) -> String {
    crate::nan::cell(x, digits)
}

impl Report {
    /// Figure 1's tables, then each other part that ran.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        for (b, rows) in &self.backends {
            let mut t = measure::Table::new([
                "row",
                "TX Kpps",
                "paper",
                "RX Kpps",
                "paper",
                "Mbps 1514",
                "paper",
                "notif/pkt",
                "kicks/pkt",
                "irq/pkt",
                "RR tps",
                "paper",
                "RTT p50 us",
            ])
            .title(format!(
                "backend: {} (paper: {})",
                match b {
                    Backend::Switch => "switch",
                    Backend::Tap => "tap",
                },
                match b {
                    Backend::Switch => "VALE, guest-guest",
                    Backend::Tap => "TAP, guest-host, 1 VCPU",
                }
            ));
            for row in ROWS {
                let r = rows.get(row.key);
                let f = |k: fn(&RowResult) -> f64, d: usize| opt(r.map(k), d);
                let p =
                    |k: fn(&Paper) -> Option<f64>, d: usize| opt(r.and_then(|r| k(&r.paper)), d);
                t.row([
                    row.label.to_string(),
                    f(|r| r.tx_kpps, 0),
                    p(|p| p.tx_kpps, 0),
                    f(|r| r.rx_kpps, 0),
                    p(|p| p.rx_kpps, 0),
                    f(|r| r.mbps_1514, 0),
                    p(|p| p.mbps_1514, 0),
                    f(|r| r.notifications_per_packet, 4),
                    f(|r| r.kicks_per_packet, 4),
                    f(|r| r.interrupts_per_packet, 4),
                    f(|r| r.rr_tps, 0),
                    p(|p| p.rr_ktps.map(|k| k * 1e3), 0),
                    f(|r| r.rtt_us_p50, 1),
                ]);
            }
            let _ = writeln!(out, "{t}");
        }
        if let Some(f) = &self.forwarding {
            out += &f.to_text();
        }
        match &self.memif {
            Some(MemifPart::Skipped { skipped }) => {
                let _ = writeln!(out, "memif side-by-side skipped: {skipped}");
            }
            Some(MemifPart::Measured(m)) => out += &m.to_text(),
            None => {}
        }
        if let Some(v) = &self.vm {
            out += &v.to_text();
        }
        if let Some(i) = &self.isolation {
            out += &i.to_text();
        }
        if !self.ratios.is_empty() {
            let _ = writeln!(
                out,
                "ratios: {}",
                serde_json::to_string(&self.ratios).unwrap_or_default()
            );
        }
        out
    }
}

impl Forwarding {
    /// The ring-to-ring table and the switch's rates, with the verdict.
    pub fn to_text(&self) -> String {
        let sh = |x: f64| x * 100.0;
        let s = &self.share_of_cores;
        let mut t = measure::Table::new(["thread", "CPU s", "% of the 2 cores", "Mpps per CPU second"]).title(
            format!(
                "switch forwarding, ring port to ring port (CSB, {}-byte frames, {:.2} s; sender, switch and receiver share {} cores; {})",
                self.frame_bytes, self.seconds, s.cores,
                match self.placement {
                    Placement::Pinned => "sender on CPU 0, switch and receiver on CPU 1",
                    Placement::Scheduler => "placed by the scheduler",
                }
            ),
        );
        for (name, cpu, share, rate) in [
            (
                "sender (pktgen tx)",
                self.sender_cpu_s,
                s.sender,
                self.sender_mpps_per_core,
            ),
            (
                "switch",
                self.switch_cpu_s,
                s.switch,
                self.switch_mpps_per_core,
            ),
            (
                "receiver (pktgen rx)",
                self.receiver_cpu_s,
                s.receiver,
                self.receiver_mpps_per_core,
            ),
        ] {
            t.row([
                name.to_string(),
                format!("{cpu:.3}"),
                format!("{:.0}", sh(share)),
                format!("{rate:.2}"),
            ]);
        }
        let mut out = format!("{t}\n");
        let _ = writeln!(
            out,
            "switch forwarding loop: {:.2} Mpps per second of busy passes ({:.3} s busy of {:.3} s CPU; poll_us {})",
            self.switch_mpps_per_busy_second, self.switch_busy_s, self.switch_cpu_s, self.switch_poll_us
        );
        let _ = writeln!(
            out,
            "switch: {:.2} Mpps per core of its CPU time ({:.2}x the 30 Mpps goal; VALE in the paper: about 20); end to end {:.2} Mpps (sender {:.2} Mpps, {} not delivered); {:.0} frames per batch, {:.0}% of passes idle{}",
            self.switch_mpps_per_core,
            self.switch_per_core_over_goal,
            self.end_to_end_mpps,
            self.sender_mpps,
            self.lost,
            self.switch_frames_per_batch,
            self.switch_idle_pass_share * 100.0,
            match &self.limit {
                Limit::Generator =>
                    " [generator-limited: nothing dropped and the switch mostly waited for frames]".to_string(),
                Limit::Receiver => format!(
                    " [receiver-limited: the switch dropped {} frames at the receiver's full ring; its per-core figure is a lower bound]",
                    self.switch_dropped_at_receiver
                ),
                Limit::Switch => " [switch-limited: nothing dropped and the switch busy on most passes]".to_string(),
                Limit::Lossy => " [lossy: frames lost where no counter says; the rates bound nothing]".to_string(),
                Limit::Invalid(why) => format!(" [INVALID: {why}]"),
            }
        );
        out
    }
}

impl Memif {
    /// The three rows in a table, what made any invalid, the ratios.
    pub fn to_text(&self) -> String {
        let mut t = measure::Table::new([
            "path",
            "delivered Mpps",
            "generator Mpps",
            "refused at gen",
            "gen CPU %",
            "sink CPU %",
            "switch CPU %",
            "switch Mpps/core",
            "switch on CPU",
            "limit",
        ])
        .title(format!(
            "DPDK testpmd over memif ({}-byte frames, ring 2^{}, {} s; medians of testpmd's per-second Rx-pps/Tx-pps; switch placement {}, memif moderation {} us)",
            self.frame_bytes, self.ring_log2, self.seconds, self.switch_cpu, self.switch_moderation_us
        ));
        let rows = [
            ("testpmd -> testpmd (direct)", "direct", &self.direct),
            ("testpmd -> switch -> testpmd", "switched", &self.switched),
            (
                "one testpmd (flowgen) <-> switch",
                "one testpmd",
                &self.switched_one_testpmd,
            ),
        ];
        for (label, _, r) in rows {
            let pc = |x: Option<f64>| opt(x.map(|x| x * 100.0), 0);
            t.row([
                label.to_string(),
                if r.valid {
                    opt(r.delivered_mpps, 2)
                } else {
                    "INVALID".to_string()
                },
                opt(Some(r.generator_mpps), 2),
                opt(r.generator_refused_share.map(|x| x * 100.0), 1) + "%",
                pc(Some(r.share_of_cores.generator)),
                pc(Some(r.share_of_cores.sink)),
                pc(r.share_of_cores.switch),
                opt(r.switch_mpps_per_core, 2),
                // The direct row has no switch; a row through it that was
                // not pinned ran wherever the scheduler put it.
                match (r.switch_pinned_cpu, r.switch_pinned) {
                    (None, None) if r.switch_cpu_s.is_none() => "-".to_string(),
                    (None, _) => "any".to_string(),
                    (Some(c), Some(false)) => format!("{c} (pin failed)"),
                    (Some(c), _) => c.to_string(),
                },
                r.limit.clone(),
            ]);
        }
        let mut out = format!("{t}\n");
        for (_, label, r) in rows {
            if let Some(why) = &r.invalid_reason {
                let _ = writeln!(out, "{label}: INVALID, measured nothing: {why}");
            }
        }
        let ratio =
            |x: Option<f64>| x.map_or("none (a row is invalid)".to_string(), |x| format!("{x:.2}"));
        let _ = writeln!(
            out,
            "switched / direct: {}; one testpmd through the switch / direct: {} (goal >= 0.5)",
            ratio(self.switched_over_direct),
            ratio(self.switched_one_testpmd_over_direct)
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn consistent(f: &PathFigures) -> bool {
        f.offered > 0
            && f.received > 0
            && f.received <= f.offered
            && f.forwarded.is_none_or(|x| f.received <= x)
            && f.switch_idle_share.is_none_or(|s| (0.0..=1.0).contains(&s))
    }

    fn figures() -> impl Strategy<Value = PathFigures> {
        (
            (0u64..2_000_000, 0u64..2_000_000),
            prop_oneof![Just(0u64), 1u64..100_000],
            proptest::option::of(0u64..2_000_000),
            prop_oneof![Just(0u64), 1u64..1_000_000],
            prop_oneof![Just(0u64), 1u64..1_000],
            proptest::option::of(-0.5f64..1.5),
            0u64..4096,
        )
            .prop_map(
                |((offered, received), refused, forwarded, dropped, nodest, idle, slack)| {
                    PathFigures {
                        offered,
                        refused_at_generator: refused,
                        // Often a switch that forwarded at least what came out.
                        forwarded: forwarded.map(|x| x.max(received)),
                        received: received.min(offered.saturating_add(offered / 8)),
                        dropped_at_receiver: dropped,
                        dropped_no_destination: nodest,
                        switch_idle_share: idle,
                        in_flight_allowance: slack,
                    }
                },
            )
    }

    proptest! {
        #[test]
        fn never_generator_limited_when_anything_was_dropped_refused_or_lost(f in figures()) {
            if classify(&f) == Limit::Generator {
                prop_assert_eq!(f.dropped_at_receiver, 0);
                prop_assert_eq!(f.refused_at_generator, 0);
                prop_assert_eq!(f.dropped_no_destination, 0);
                prop_assert!(f.offered - f.received <= f.in_flight_allowance);
                prop_assert!(f.switch_idle_share.is_none_or(|s| s > GENERATOR_IDLE_SHARE));
            }
        }

        #[test]
        fn invalid_exactly_when_nothing_was_measured_or_the_counters_disagree(f in figures()) {
            prop_assert_eq!(matches!(classify(&f), Limit::Invalid(_)), !consistent(&f));
        }

        #[test]
        fn drops_at_the_receiver_make_it_receiver_limited(f in figures()) {
            if consistent(&f) && f.dropped_at_receiver > 0 {
                prop_assert_eq!(classify(&f), Limit::Receiver);
            }
        }

        #[test]
        fn a_full_first_ring_names_the_next_hop(f in figures()) {
            if consistent(&f) && f.dropped_at_receiver == 0 && f.refused_at_generator > 0 {
                let want = if f.forwarded.is_some() { Limit::Switch } else { Limit::Receiver };
                prop_assert_eq!(classify(&f), want);
            }
        }

        #[test]
        fn a_clean_run_with_an_idle_switch_is_generator_limited(
            offered in 1u64..10_000_000,
            lost in 0u64..1024,
            idle in 0.51f64..=1.0,
            through_switch: bool,
        ) {
            let received = offered.saturating_sub(lost).max(1);
            let f = PathFigures {
                offered,
                received,
                forwarded: through_switch.then_some(received),
                switch_idle_share: through_switch.then_some(idle),
                in_flight_allowance: 1024,
                ..PathFigures::default()
            };
            prop_assert_eq!(classify(&f), Limit::Generator);
            // The same run with the switch busy on most passes: the switch.
            if through_switch {
                let busy = PathFigures { switch_idle_share: Some(1.0 - idle), ..f };
                prop_assert_eq!(classify(&busy), Limit::Switch);
            }
        }
    }

    /// The run BENCHMARKS.md recorded as "generator-limited": 95% idle
    /// passes, but 11 M frames dropped at the receiver's full ring.
    #[test]
    fn the_recorded_contradiction_is_receiver_limited() {
        let f = PathFigures {
            offered: 30_600_000,
            forwarded: Some(19_600_000),
            received: 19_600_000,
            dropped_at_receiver: 11_000_000,
            switch_idle_share: Some(0.95),
            in_flight_allowance: 2048,
            ..PathFigures::default()
        };
        assert_eq!(classify(&f), Limit::Receiver);
        assert_eq!(classify(&f).label(), "receiver-limited");
        // The JSON document says the same as the label.
        let doc = serde_json::to_value(classify(&f)).unwrap();
        assert_eq!(doc["limit"], classify(&f).key());
        // Lost without a counter saying where: not the generator either.
        let unexplained = PathFigures {
            dropped_at_receiver: 0,
            ..f
        };
        assert_eq!(classify(&unexplained), Limit::Lossy);
    }

    #[test]
    fn a_memif_window_too_short_for_two_reports_is_refused_with_the_minimum() {
        for bad in [0.0, 1.0, 1.99, f64::NAN, 61.0] {
            let e = check_memif_seconds(bad).unwrap_err().to_string();
            assert!(e.contains("2..=60"), "{e}");
        }
        for good in [2.0, 3.0, 60.0] {
            assert!(check_memif_seconds(good).is_ok(), "{good}");
        }
    }

    #[test]
    fn a_memif_row_that_measured_nothing_is_invalid_not_zero() {
        let f = PathFigures {
            offered: 1000,
            received: 1000,
            ..PathFigures::default()
        };
        let row = |delivered: f64, samples: &[f64]| MemifRow {
            delivered_mpps: Some(delivered),
            sink_rx_pps_samples: samples.to_vec(),
            ..MemifRow::default()
        };
        // No report inside the window: the median of nothing.
        let mut v = row(0.0, &[]);
        verdict(&mut v, Some(f));
        assert!(!v.valid);
        assert!(v.delivered_mpps.is_none(), "{v:?}");
        assert!(
            v.invalid_reason.as_deref().unwrap().contains("report"),
            "{v:?}"
        );
        assert!(!v.generator_limited);
        // Reports of zero: invalid too.
        let mut v = row(0.0, &[0.0, 0.0]);
        verdict(&mut v, Some(f));
        assert!(!v.valid);
        assert!(v.delivered_mpps.is_none(), "{v:?}");
        // A measured row keeps its rate and gets its limit.
        let mut v = row(1.5, &[1.5e6, 1.5e6]);
        verdict(&mut v, Some(f));
        assert!(v.valid);
        assert_eq!(v.delivered_mpps, Some(1.5));
        assert_eq!(v.limit, "generator");
        // No totals from testpmd: nothing to decide from.
        let mut v = row(1.5, &[1.5e6]);
        verdict(&mut v, None);
        assert!(!v.valid);
        // In the document, a row that measured nothing says null, not 0.
        let mut v = row(0.0, &[]);
        verdict(&mut v, Some(f));
        let doc = serde_json::to_value(&v).unwrap();
        assert!(doc["delivered_mpps"].is_null(), "{doc}");
        assert_eq!(doc["valid"], false);
    }

    #[test]
    fn a_report_reads_back_what_it_wrote_and_prints_invalid_rows_as_such() {
        let mut direct = MemifRow {
            delivered_mpps: Some(2.0),
            sink_rx_pps_samples: vec![2e6, f64::NAN],
            ..MemifRow::default()
        };
        verdict(&mut direct, None);
        let report = Report {
            memif: Some(MemifPart::Measured(Box::new(Memif {
                switched_one_testpmd_over_direct: None,
                switched_one_testpmd: MemifRow::default(),
                frame_bytes: 60,
                ring_log2: 10,
                seconds: 2.0,
                switch_moderation_us: 0,
                switch_cpu: SwitchPlacement::Cpu(1),
                switched_over_direct: None,
                direct,
                switched: MemifRow::default(),
                goal_switched_over_direct: 0.5,
            }))),
            ..Report::default()
        };
        let doc = serde_json::to_value(&report).unwrap();
        assert!(doc["memif"]["direct"]["delivered_mpps"].is_null(), "{doc}");
        assert_eq!(doc["memif"]["switch_cpu"], 1);
        let back: Report = serde_json::from_value(doc.clone()).unwrap();
        assert_eq!(serde_json::to_value(&back).unwrap(), doc);
        let text = back.to_text();
        assert!(text.contains("INVALID"), "{text}");
        assert!(text.contains("switched / direct: none"), "{text}");
        let skipped: Report = serde_json::from_str(r#"{"memif": {"skipped": "no DPDK"}}"#).unwrap();
        assert_eq!(skipped.to_text(), "memif side-by-side skipped: no DPDK\n");
    }

    #[test]
    fn auto_placement_gives_the_switch_a_free_core_when_there_is_one() {
        // testpmd's main lcore on CPU 0 forwards on CPU 1, and back.
        assert_eq!((forwarding_cpu(0), forwarding_cpu(1)), (1, 0));
        let auto = SwitchPlacement::Auto;
        // Two testpmds: both cores busy, the switch joins the sender's.
        assert_eq!(auto.cpu(forwarding_cpu(0), None), Some(1));
        // One testpmd forwarding on CPU 1: the switch takes CPU 0.
        assert_eq!(auto.cpu(1, Some(0)), Some(0));
        // Asked for, a CPU or the scheduler holds in every row.
        assert_eq!(SwitchPlacement::Cpu(1).cpu(1, Some(0)), Some(1));
        assert_eq!(SwitchPlacement::Unpinned.cpu(1, Some(0)), None);
        let key = |p: SwitchPlacement| serde_json::to_value(p).unwrap();
        assert_eq!(key(auto), serde_json::json!("auto"));
        assert_eq!(key(SwitchPlacement::Cpu(3)), serde_json::json!(3));
        assert_eq!(key(SwitchPlacement::Unpinned), serde_json::json!("none"));
        for p in [auto, SwitchPlacement::Cpu(3), SwitchPlacement::Unpinned] {
            assert_eq!(
                serde_json::from_value::<SwitchPlacement>(key(p)).unwrap(),
                p
            );
        }
    }
}
