//! `fastpath lb bench --topology veth`: packets per second through a device
//! under test on a veth pair, three ways in one run, all driven by the same
//! AF_XDP generator:
//!
//! - **fastpath**: `lb run --interface` (AF_XDP when it can), forwarding as
//!   GRE back out of the same interface (one-armed, as deployed); in the
//!   driver (`--driver xdp`) over IPv4 and, as **fastpath_ipv6**, the
//!   smallest UDP over IPv6 to an IPv6 VIP, GRE over IPv4 to the same
//!   backends (as the lab's topology does), with the ratio of the two; and
//!   with AF_XDP alone (**fastpath_af_xdp**);
//! - **nftables**: the kernel doing the same job: DNAT with `jhash` over the
//!   same backends, forwarded back out;
//! - **xdp_forwarder**: the limit: the same hop done in the driver by an XDP
//!   program (`bench/bpf/fwd.c`: one header rewrite, `bpf_redirect_map` back
//!   out of the interface).
//!
//! ```text
//! generator ns: g0 (AF_XDP TX ring: pre-built 64-byte UDP over many flows,
//!      |            or an XDP generator in live-frames mode; an XDP sink
//!      |            counts and drops what comes back)
//! DUT ns:       d0 (one of the three; its receive processing runs in a
//!                   threaded NAPI, not in the generator's send)
//! ```
//!
//! With two CPUs or more, the generator and the sink (g0's NAPI thread)
//! run on the first half of them and everything of the device under test
//! (the load balancer's process, d0's NAPI thread) on the rest, so that
//! each row measures what the device under test does with its own cores.
//!
//! Each row says what the generator offered, what reached the device under
//! test, what came back (delivered) and what was lost on the way; a row is
//! valid only when the generator offered at least 1.5 times what came back,
//! that is when the device under test, not the generator, was the limit.
//! Everything shares this machine's cores: the figures are ratios of one run.

use std::collections::BTreeMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use netns::Netns;
use packet::build::Frame;
use serde::Serialize;

use crate::xdp::{Generator, XdpGenerator};

const VIP: [u8; 4] = [198, 18, 0, 1];
/// The IPv6 row's VIP.
const VIP6: &str = "fd00:18::1";
const GEN_MAC: &str = "02:00:00:00:0e:01";
const DUT_MAC: &str = "02:00:00:00:0e:02";
/// Flows the generator sends (distinct source ports and addresses).
const FLOWS: usize = 4096;
/// A row is valid when the generator offered at least this many times
/// what was delivered.
pub const VALID_OFFER_RATIO: f64 = 1.5;

/// Why the veth bench could not measure.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// This machine cannot build the namespaces.
    #[error(transparent)]
    Lab(#[from] lab::Error),
    /// A namespace, the veth pair or an address could not be set up.
    #[error(transparent)]
    Netns(#[from] netns::Error),
    /// The generator's AF_XDP socket failed.
    #[error("the generator on g0: {0}")]
    Generator(#[source] crate::xdp::Error),
    /// An XDP program could not be attached.
    #[error("attaching an XDP program to {iface}: {source}")]
    Xdp {
        /// The interface.
        iface: &'static str,
        /// What the attach said.
        #[source]
        source: crate::xdp::Error,
    },
    /// The nftables rules could not be loaded.
    #[error("loading the nftables rules (is nftables installed?): {0}")]
    Nft(#[source] netns::Error),
    /// A file or process of the bench could not be made.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The system's answer.
        #[source]
        source: io::Error,
    },
    /// More generator queues offer no more than one: the rows would
    /// measure the generator.
    #[error(
        "with {queues} veth queues the generator alone offers {many:.2} Mpps, no more than with \
         one ({one:.2} Mpps): rows measured so would show the generator, not the device under \
         test. veth puts a frame redirected into it (the XDP generator's live frames, AF_XDP's \
         transmit) on the receive queue of the sending CPU (its number modulo the queues), not \
         by flow, and wakes that queue's NAPI from the sender; here the generator's {queues} \
         threads and g0's return NAPI threads share {generator_cpus} CPU(s), so more queues \
         spread no work over more CPUs. Use fewer --gen-queues, or a machine with a CPU per \
         generator queue besides the device under test's"
    )]
    MoreQueuesOfferLess {
        /// Queues asked for.
        queues: u32,
        /// The generator alone with one queue, Mpps.
        one: f64,
        /// With `queues`, Mpps.
        many: f64,
        /// CPUs the generator was given.
        generator_cpus: usize,
    },
    /// A thread of the bench panicked.
    #[error("the {0} thread panicked")]
    Panicked(&'static str),
    /// A peer forwarded nothing, so no ratio means anything.
    #[error("a peer forwarded nothing (nftables {nftables} Mpps, XDP forwarder {xdp} Mpps): the measurement is void; {note}")]
    Void {
        /// What came back through nftables, Mpps.
        nftables: f64,
        /// What came back through the XDP forwarder, Mpps.
        xdp: f64,
        /// The XDP forwarder's note (its mode and interface counters).
        note: String,
    },
}

impl Error {
    fn io(what: impl Into<String>) -> impl FnOnce(io::Error) -> Error {
        let what = what.into();
        move |source| Error::Io { what, source }
    }
}

/// One device under test's result.
#[derive(Debug, Clone, Serialize)]
pub struct Cell {
    /// Frames per second that came back to the generator's interface
    /// (delivered), millions.
    pub delivered_mpps: f64,
    /// What the generator offered (frames its socket completed), millions
    /// per second.
    pub offered_mpps: f64,
    /// Frames per second that reached the device under test's interface,
    /// millions (the rest the veth dropped at its full receive ring).
    pub reached_mpps: f64,
    /// Frames offered and not delivered, over the run.
    pub drops: u64,
    /// Of those, dropped before the device under test's interface counted
    /// them (its receive ring was full).
    pub drops_at_interface: u64,
    /// d0's own receive drop counter (a full AF_XDP ring, a failed
    /// redirect), over the run.
    pub dut_rx_dropped: u64,
    /// Frames per second d0 sent back towards g0 (its transmit counter),
    /// millions.
    pub dut_sent_mpps: f64,
    /// Frames the device under test sent back that g0 dropped before
    /// counting them as delivered (its receive ring was full: the
    /// measurement's sink, not the device under test, fell behind).
    pub dropped_on_return: u64,
    /// Offered >= 1.5 x delivered: the device under test was the limit.
    pub valid: bool,
    /// User-space copies per forwarded packet, where the device under test
    /// counts them (fastpath).
    pub copies_per_packet: Option<f64>,
    /// Frames the load balancer's socket received, for its packet threads
    /// (fastpath): in the driver rows, what the XDP program did not
    /// forward itself.
    pub frames_to_user_space: Option<u64>,
    /// Notes (driver, XDP mode).
    pub note: String,
}

/// The report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Seconds each variant was driven.
    pub seconds: f64,
    /// `fastpath`, `fastpath_quic`, `fastpath_ipv6`, `fastpath_af_xdp`,
    /// `nftables`, `xdp_forwarder`.
    pub results: BTreeMap<String, Cell>,
    /// fastpath in the driver over IPv6 over the same over IPv4
    /// (delivered; 0 when the IPv4 row delivered nothing).
    pub ratio_ipv6_to_ipv4: f64,
    /// fastpath in the driver routing QUIC by connection ID (plaintext
    /// QUIC-LB) over the same frames as plain UDP (delivered; 0 when the
    /// UDP row delivered nothing).
    pub ratio_quic_to_udp: f64,
    /// fastpath over nftables (delivered).
    pub ratio_to_nftables: f64,
    /// fastpath over the XDP forwarder (delivered).
    pub ratio_to_xdp_forwarder: f64,
    /// Every row valid.
    pub valid: bool,
    /// The generator into a sink on d0 (nothing comes back): what it can
    /// offer when the receiver costs almost nothing.
    pub generator_alone: Cell,
    /// Generator threads (veth queues).
    pub generator_queues: u32,
    /// Which generator.
    pub generator_kind: GeneratorKind,
    /// How the generator sent.
    pub generator: String,
    /// Where the generator and the device under test ran (`None`: one
    /// CPU, shared).
    pub cpus: Option<Cpus>,
}

/// An interface's (rx packets, rx dropped, tx packets).
fn link_stats(ns: &Netns, dev: &str) -> (u64, u64, u64) {
    let out = ns
        .ip(&["-s", "-j", "link", "show", "dev", dev])
        .map(|o| o.stdout)
        .unwrap_or_default();
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap_or_default();
    let s = &v[0]["stats64"];
    (
        s["rx"]["packets"].as_u64().unwrap_or(0),
        s["rx"]["dropped"].as_u64().unwrap_or(0),
        s["tx"]["packets"].as_u64().unwrap_or(0),
    )
}

/// Where the bench runs what: the generator's threads and the sink of what
/// comes back (g0's NAPI thread) on some CPUs, the device under test (the
/// load balancer's process, d0's NAPI thread, in which the kernel's
/// forwarding and the XDP programs run) on the others, so that neither
/// takes the other's core. Left to the scheduler, the busy generator at
/// nice -10 and threads of the device under test at nice 0 may share a
/// core, where the latter get about a tenth of it.
#[derive(Debug, Clone, Serialize)]
pub struct Cpus {
    /// The generator's CPUs (its threads in turn).
    pub generator: Vec<usize>,
    /// The device under test's CPUs.
    pub device_under_test: Vec<usize>,
}

impl Cpus {
    /// Half of this process's CPUs (at least one, and never more than one
    /// per generator thread) for the generator, the rest for the device
    /// under test; `None` with a single CPU (everything shares it).
    fn split(queues: u32) -> Option<Cpus> {
        let cpus = crate::cpus::allowed();
        if cpus.len() < 2 {
            return None;
        }
        let g = (cpus.len() / 2).clamp(1, queues.max(1) as usize);
        Some(Cpus {
            generator: cpus[..g].to_vec(),
            device_under_test: cpus[g..].to_vec(),
        })
    }

    /// Says where what ran, for the report.
    fn describe(c: Option<&Cpus>) -> String {
        match c {
            Some(c) => format!(
                "generator and the sink of what comes back (g0's NAPI thread) on CPU {:?}; \
                 device under test (its process, d0's NAPI thread) on CPU {:?}",
                c.generator, c.device_under_test
            ),
            None => "one CPU: generator and device under test share it".to_string(),
        }
    }
}

/// The kernel's threads whose name starts with `prefix` (NAPI threads are
/// `napi/<interface>-<id>`).
fn kernel_threads(prefix: &str) -> std::collections::BTreeSet<i32> {
    std::fs::read_dir("/proc")
        .map(|d| {
            d.filter_map(Result::ok)
                .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
                .filter(|pid| {
                    std::fs::read_to_string(format!("/proc/{pid}/comm"))
                        .is_ok_and(|c| c.starts_with(prefix))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The QUIC row's QUIC-LB configuration: plaintext, codepoint 0, a server
/// ID of 2 octets (backend `i` is `000i`, 1-based), a nonce of 6.
const QUIC_LB: &str = "[[quic_lb]]\ncodepoint = 0\nserver_id_len = 2\nnonce_len = 6\n";

/// The QUIC row's destination connection ID for flow `i`: routable to
/// backend `i % backends + 1` under [`QUIC_LB`], its nonce drawn from `i`
/// (empty if the configuration could not encode it: the row then shows
/// nothing routed).
fn quic_cid(i: usize, backends: usize) -> Vec<u8> {
    let sid = [0, (i % backends.max(1) + 1) as u8];
    let nonce = (i as u64).to_be_bytes();
    quic_lb::Config::new(0, 2, 6, None, false)
        .ok()
        .and_then(|c| c.encode(&sid, &nonce[2..], nonce[7]).ok())
        .map(|cid| cid.as_bytes().to_vec())
        .unwrap_or_default()
}

/// The generator's frames: 64-byte UDP to the VIP over [`FLOWS`] flows;
/// for the QUIC row, each a QUIC short header whose connection ID routes
/// to one of `quic_backends` backends.
fn frames(quic_backends: Option<usize>) -> Vec<Vec<u8>> {
    let dmac = lb::config::parse_mac(DUT_MAC).unwrap_or_default();
    let smac = lb::config::parse_mac(GEN_MAC).unwrap_or_default();
    (0..FLOWS)
        .map(|i| {
            let mut payload = [0u8; 18];
            if let Some(n) = quic_backends {
                let cid = quic_cid(i, n);
                // Short header: header form 0, fixed bit 1.
                payload[0] = 0x40;
                payload[1..1 + cid.len()].copy_from_slice(&cid);
            }
            let mut f = Frame::udp(
                IpAddr::from([10, 30, 1 + (i / 256) as u8, (i % 256) as u8]),
                IpAddr::from(VIP),
                1024 + i as u16,
                9,
                &payload,
            );
            f.eth.dst = dmac;
            f.eth.src = smac;
            f.to_bytes()
        })
        .collect()
}

/// The IPv6 row's frames: the smallest UDP over IPv6 (62 bytes, no
/// payload) to [`VIP6`] over [`FLOWS`] flows, the sources being
/// `fd00:30::` with the IPv4 frames' source address as their last 4 bytes.
fn frames6() -> Vec<Vec<u8>> {
    let dmac = lb::config::parse_mac(DUT_MAC).unwrap_or_default();
    let smac = lb::config::parse_mac(GEN_MAC).unwrap_or_default();
    let vip: IpAddr = VIP6.parse().unwrap_or(IpAddr::from([0u8; 16]));
    (0..FLOWS)
        .map(|i| {
            let mut src = [0u8; 16];
            src[..4].copy_from_slice(&[0xfd, 0, 0, 0x30]);
            src[12..].copy_from_slice(&[10, 30, 1 + (i / 256) as u8, (i % 256) as u8]);
            let mut f = Frame::udp(IpAddr::from(src), vip, 1024 + i as u16, 9, &[]);
            f.eth.dst = dmac;
            f.eth.src = smac;
            f.to_bytes()
        })
        .collect()
}

/// Which generator drives the pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum GeneratorKind {
    /// AF_XDP in copy mode ([`Generator`]): pre-built frames over a TX
    /// ring; the kernel builds an `sk_buff` for each and hands it to the
    /// veth, at most a ring per wake-up.
    AfXdp,
    /// The XDP generator ([`XdpGenerator`]): `BPF_PROG_TEST_RUN` in
    /// live-frames mode sends batches of XDP frames, which reach d0 without
    /// an `sk_buff`.
    Xdp,
}

/// How the pair is driven.
#[derive(Clone)]
struct Drive {
    /// Seconds per device under test.
    secs: f64,
    /// Generator threads (veth queues).
    queues: u32,
    /// Where things run.
    cpus: Option<Cpus>,
    /// Which generator.
    kind: GeneratorKind,
    /// IPv6 frames ([`frames6`]) rather than IPv4.
    v6: bool,
    /// The QUIC row: QUIC short headers routable to this many backends.
    quic_backends: Option<usize>,
}

/// d0's `gro_flush_timeout` (ns) in the fastpath row with busy polling.
const BUSY_POLL_FLUSH_NS: u32 = 200_000;

/// Sets d0 up for preferred busy polling (`napi_defer_hard_irqs`,
/// `gro_flush_timeout`), so that the load balancer, which then busy-polls,
/// runs d0's receive processing itself when it is ready for more frames,
/// and d0's NAPI thread steps in only when it has not polled for 200 us:
/// the kernel's recipe for an AF_XDP application that shares its core
/// with the interface. Returns a note for the row.
fn busy_poll(dut: &Netns) -> String {
    let set = dut.exec(&[
        "sh",
        "-c",
        &format!(
            "echo 2 > /sys/class/net/d0/napi_defer_hard_irqs && \
             echo {BUSY_POLL_FLUSH_NS} > /sys/class/net/d0/gro_flush_timeout"
        ),
    ]);
    match set {
        Ok(_) => format!(
            "d0 set for preferred busy polling (napi_defer_hard_irqs 2, gro_flush_timeout {} us)",
            BUSY_POLL_FLUSH_NS / 1000
        ),
        Err(e) => format!("no busy polling ({e})"),
    }
}

/// Frames an XDP generator sends per system call (a few milliseconds).
const XDP_GEN_CHUNK: u32 = 1 << 15;

/// Drives `g0` from inside `gen` for `d.secs`, one thread (and socket) on
/// each of its `d.queues` transmit queues (the flows split between them),
/// each pinned to one of the generator's CPUs; returns (frames offered,
/// seconds driven, how the generator sent).
fn generate(gen: &Netns, d: &Drive) -> Result<(u64, f64, String), Error> {
    let all = if d.v6 {
        frames6()
    } else {
        frames(d.quic_backends)
    };
    let queues = d.queues;
    let start = std::sync::Arc::new(std::sync::Barrier::new(queues as usize));
    let threads: Vec<_> = (0..queues)
        .map(|q| {
            let name = gen.name().to_string();
            let mine: Vec<Vec<u8>> = all
                .iter()
                .skip(q as usize)
                .step_by(queues as usize)
                .cloned()
                .collect();
            let start = std::sync::Arc::clone(&start);
            let cpu = d
                .cpus
                .as_ref()
                .map(|c| c.generator[q as usize % c.generator.len()]);
            let (secs, kind) = (d.secs, d.kind);
            std::thread::spawn(move || -> Result<(u64, f64, String), Error> {
                if let Some(cpu) = cpu {
                    crate::cpus::pin(None, &[cpu]);
                }
                // The generator must not be the limit: on shared cores it
                // runs before the rest (nice -10; skipped without the
                // privilege, and then the rows say whether it was).
                let _ = rustix::process::setpriority_process(Some(rustix::thread::gettid()), -10);
                let entered = netns::enter(&name).map_err(Error::from);
                match kind {
                    GeneratorKind::AfXdp => {
                        let opened = entered.and_then(|_| {
                            Generator::open("g0", q, &mine).map_err(Error::Generator)
                        });
                        start.wait();
                        let mut g = opened?;
                        let t = Instant::now();
                        let deadline = t + Duration::from_secs_f64(secs);
                        let mut rounds = 0u32;
                        loop {
                            g.send();
                            // The clock every few rounds: a round queues up
                            // to a ring.
                            rounds += 1;
                            if rounds.is_multiple_of(16) && Instant::now() >= deadline {
                                break;
                            }
                        }
                        let el = t.elapsed().as_secs_f64();
                        // Frames queued and not taken by the end are not
                        // offered.
                        g.flush(Duration::from_millis(50));
                        let note = format!(
                            "AF_XDP copy mode, up to {} frames per wake-up",
                            g.tx_budget()
                        );
                        Ok((g.completed(), el, note))
                    }
                    GeneratorKind::Xdp => {
                        let opened = entered.and_then(|_| {
                            XdpGenerator::open("g0", q, &mine[0]).map_err(Error::Generator)
                        });
                        start.wait();
                        let mut g = opened?;
                        let t = Instant::now();
                        let deadline = t + Duration::from_secs_f64(secs);
                        while Instant::now() < deadline {
                            g.send(XDP_GEN_CHUNK).map_err(Error::Generator)?;
                        }
                        let el = t.elapsed().as_secs_f64();
                        let note = format!(
                            "XDP live frames (BPF_PROG_TEST_RUN), batches of 256{}",
                            if g.pinned() {
                                ""
                            } else {
                                " (not pinned in the XDP dispatcher: each call waits out \
                                 two RCU grace periods)"
                            }
                        );
                        Ok((g.offered(), el, note))
                    }
                }
            })
        })
        .collect();
    let (mut offered, mut el, mut note) = (0, 0f64, String::new());
    for t in threads {
        let (n, e, how) = t.join().map_err(|_| Error::Panicked("generator"))??;
        offered += n;
        el = el.max(e);
        note = how;
    }
    Ok((offered, el, note))
}

/// Keeps an XDP program attached (from a thread inside `ns`) until the
/// returned guard drops; `attach` runs inside the namespace.
struct XdpHold {
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl XdpHold {
    fn new<T: 'static>(
        ns: &Netns,
        attach: impl FnOnce() -> Result<(T, String), Error> + Send + 'static,
    ) -> Result<(XdpHold, String), Error> {
        let name = ns.name().to_string();
        let (tx, rx) = std::sync::mpsc::channel::<Result<String, Error>>();
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            match netns::enter(&name)
                .map_err(Error::from)
                .and_then(|_| attach())
            {
                Ok((handle, note)) => {
                    let _ = tx.send(Ok(note));
                    let _ = stop_rx.recv();
                    drop(handle);
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                }
            }
        });
        let note = rx.recv().map_err(|_| Error::Panicked("XDP holder"))??;
        Ok((
            XdpHold {
                stop: Some(stop_tx),
                thread: Some(thread),
            },
            note,
        ))
    }
}

impl Drop for XdpHold {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The two namespaces and the veth pair, g0's sink attached.
fn pair(tag: &str, queues: u32, cpus: Option<&Cpus>) -> Result<(Netns, Netns, XdpHold), Error> {
    let gen = Netns::new(&format!("fpbg-{tag}"))?;
    let dut = Netns::new(&format!("fpbd-{tag}"))?;
    for ns in [&gen, &dut] {
        ns.sysctl("net.ipv6.conf.all.disable_ipv6", "1")?;
        ns.sysctl("net.ipv6.conf.default.disable_ipv6", "1")?;
        ns.sysctl("net.ipv4.conf.all.rp_filter", "0")?;
        ns.sysctl("net.ipv4.conf.default.rp_filter", "0")?;
    }
    netns::veth_multiqueue(&gen, "g0", GEN_MAC, &dut, "d0", DUT_MAC, queues)?;
    gen.ip(&["addr", "add", "10.30.0.1/24", "dev", "g0"])?;
    // Where the XDP generators past the first keep their program in the
    // kernel's XDP dispatcher (the first uses `lo`): one of them rebuilding
    // it twice per run stalled every generator and the device under test,
    // so every row lost rate as queues were added.
    for q in 1..queues {
        let dev = crate::xdp::pin_interface(q);
        let peer = format!("{dev}p");
        gen.ip(&["link", "add", &dev, "type", "veth", "peer", "name", &peer])?;
        gen.ip(&["link", "set", &dev, "up"])?;
    }
    // What comes back is counted by g0 and dropped in its driver: the
    // cheapest receiver, alike for every variant (and veth accepts frames
    // its peer redirects only when it runs an XDP program itself).
    let (hold, _) = XdpHold::new(&gen, || {
        crate::xdp::attach_sink("g0")
            .map(|b| (b, String::new()))
            .map_err(|source| Error::Xdp {
                iface: "g0",
                source,
            })
    })?;
    // The sink is the measurement's, not the device under test's: it runs
    // in a NAPI thread on the generator's CPUs, ahead of the generator
    // (nice -20), so that it keeps up and costs the device under test
    // nothing. Otherwise it runs in the softirqs of whoever sends to g0,
    // which is the device under test (and for AF_XDP, once per frame: the
    // kernel sends a socket's frames one by one, each enabling softirqs).
    if let Some(c) = cpus {
        let _ = napi_thread(&gen, "g0", Some(&c.generator), -20);
    }
    dut.ip(&["addr", "add", "10.30.0.2/24", "dev", "d0"])?;
    // The backends are reached through the generator's side: what comes
    // back there is what was forwarded.
    dut.ip(&["route", "add", "10.20.0.0/24", "via", "10.30.0.1"])?;
    dut.ip(&["neigh", "add", "10.30.0.1", "lladdr", GEN_MAC, "dev", "d0"])?;
    Ok((gen, dut, hold))
}

/// Moves `dev`'s receive processing (its XDP program, the kernel's
/// forwarding) into a NAPI thread of its own (veth has NAPI only while it
/// runs an XDP program: call after attaching one), pins that thread to
/// `cpus` and gives it the niceness `nice`. How many threads it placed
/// (0: left to the scheduler), or `None` if the kernel refused threaded
/// NAPI (the processing then stays in the sender's softirqs).
fn napi_thread(ns: &Netns, dev: &str, cpus: Option<&[usize]>, nice: i32) -> Option<usize> {
    let prefix = format!("napi/{dev}-");
    let before = kernel_threads(&prefix);
    ns.exec(&[
        "sh",
        "-c",
        &format!("echo 1 > /sys/class/net/{dev}/threaded"),
    ])
    .ok()?;
    // The threads the write started (another bench's d0 may have some).
    let placed = kernel_threads(&prefix)
        .difference(&before)
        .filter_map(|&t| rustix::process::Pid::from_raw(t))
        .filter(|&t| {
            let _ = rustix::process::setpriority_process(Some(t), nice);
            cpus.is_some_and(|c| crate::cpus::pin(Some(t), c))
        })
        .count();
    Some(placed)
}

/// Puts d0's receive processing into its NAPI thread, on the device under
/// test's CPUs, instead of inside the generator's send. Returns a note
/// for the row.
fn threaded_napi(dut: &Netns, cpus: Option<&Cpus>) -> String {
    let on = cpus.map(|c| c.device_under_test.as_slice());
    match napi_thread(dut, "d0", on, 0) {
        None => "NAPI in the sender (threaded NAPI refused)".to_string(),
        Some(n) if n > 0 && on.is_some() => format!("threaded NAPI on CPU {:?}", on.unwrap_or(&[])),
        Some(_) => "threaded NAPI".to_string(),
    }
}

/// Drives the pair for `secs` and counts.
fn measure(gen: &Netns, dut: &Netns, d: &Drive) -> Result<(Cell, String), Error> {
    let (g_rx0, g_drop0, _) = link_stats(gen, "g0");
    let (d_rx0, d_drop0, d_tx0) = link_stats(dut, "d0");
    let (offered, el, how) = generate(gen, d)?;
    std::thread::sleep(Duration::from_millis(100));
    let (g_rx1, g_drop1, _) = link_stats(gen, "g0");
    let (d_rx1, d_drop1, d_tx1) = link_stats(dut, "d0");
    let delivered = g_rx1.saturating_sub(g_rx0);
    let reached = d_rx1.saturating_sub(d_rx0);
    let el = el.max(1e-9);
    let cell = Cell {
        delivered_mpps: delivered as f64 / el / 1e6,
        offered_mpps: offered as f64 / el / 1e6,
        reached_mpps: reached as f64 / el / 1e6,
        drops: offered.saturating_sub(delivered),
        drops_at_interface: offered.saturating_sub(reached),
        dut_rx_dropped: d_drop1.saturating_sub(d_drop0),
        dut_sent_mpps: d_tx1.saturating_sub(d_tx0) as f64 / el / 1e6,
        dropped_on_return: g_drop1.saturating_sub(g_drop0),
        valid: delivered > 0 && offered as f64 >= VALID_OFFER_RATIO * delivered as f64,
        copies_per_packet: None,
        frames_to_user_space: None,
        note: String::new(),
    };
    Ok((cell, how))
}

/// Runs the three variants for `secs` each, the generator (`kind`) on
/// `queues` queues (a thread each); `fastpath` is our binary, which busy-
/// polls d0 if `prefer_busy_poll` (see [`busy_poll`]).
pub fn run(
    fastpath: &Path,
    secs: f64,
    queues: u32,
    kind: GeneratorKind,
    prefer_busy_poll: bool,
    progress: &mut dyn FnMut(&str),
) -> Result<Report, Error> {
    let queues = queues.max(1);
    if !netns::available() {
        return Err(lab::Error::Unavailable.into());
    }
    let cpus = Cpus::split(queues);
    let drive = Drive {
        secs,
        queues,
        cpus: cpus.clone(),
        kind,
        v6: false,
        quic_backends: None,
    };
    let tag = format!("{}", std::process::id() % 100_000);
    let backends = ["10.20.0.1", "10.20.0.2", "10.20.0.3", "10.20.0.4"];
    let mut results = BTreeMap::new();

    // The generator alone first: into a sink on d0, what it can offer when
    // the other end costs (almost) nothing. With several queues, beside
    // one queue: a generator that offers no more with more queues would
    // measure itself in every row.
    progress("the generator alone (XDP sink on d0)");
    let alone = generator_alone(&tag, &drive)?;
    if queues > 1 {
        progress("the generator alone on one queue");
        let one = Drive {
            queues: 1,
            cpus: Cpus::split(1),
            ..drive.clone()
        };
        let single = generator_alone(&tag, &one)?;
        if alone.offered_mpps <= single.offered_mpps {
            return Err(Error::MoreQueuesOfferLess {
                queues,
                one: single.offered_mpps,
                many: alone.offered_mpps,
                generator_cpus: cpus.as_ref().map_or(1, |c| c.generator.len()),
            });
        }
    }

    // fastpath: the load balancer in the driver (XDP), over IPv4 then
    // IPv6 (one after the other, so that the ratio compares like with
    // like), then AF_XDP alone.
    for (row, driver, v6, quic) in [
        ("fastpath", "xdp", false, false),
        ("fastpath_quic", "xdp", false, true),
        ("fastpath_ipv6", "xdp", true, false),
        ("fastpath_af_xdp", "af-xdp", false, false),
    ] {
        let family = match (v6, quic) {
            (true, _) => ", an IPv6 VIP",
            (_, true) => ", a QUIC-LB VIP (plaintext)",
            _ => "",
        };
        progress(&format!(
            "{row} (lb run --interface --driver {driver}{family})"
        ));
        let d = Drive {
            v6,
            quic_backends: quic.then_some(backends.len()),
            ..drive.clone()
        };
        let c = fastpath_row(fastpath, driver, &tag, &backends, &d, prefer_busy_poll)?;
        results.insert(row.to_string(), c);
    }

    // nftables: DNAT with jhash over the same backends, forwarded.
    progress("nftables (DNAT, jhash)");
    let (gen, dut, sink) = pair(&tag, queues, cpus.as_ref())?;
    dut.sysctl("net.ipv4.ip_forward", "1")?;
    let map: Vec<String> = backends
        .iter()
        .enumerate()
        .map(|(i, b)| format!("{i} : {b}"))
        .collect();
    let rules = format!(
        "table ip fastpath_bench {{\n  chain pre {{\n    type nat hook prerouting priority dstnat;\n    \
         ip daddr 198.18.0.1 udp dport 9 dnat to jhash ip saddr . udp sport mod {} map {{ {} }}\n  }}\n}}\n",
        backends.len(),
        map.join(", ")
    );
    dut.exec_input(&["nft", "-f", "-"], rules.as_bytes())
        .map_err(Error::Nft)?;
    // An XDP program that passes everything puts d0's receive into NAPI
    // (and so into its thread), as for the other two.
    let (pass, _) = XdpHold::new(&dut, || {
        crate::xdp::attach_pass("d0")
            .map(|b| (b, String::new()))
            .map_err(|source| Error::Xdp {
                iface: "d0",
                source,
            })
    })?;
    let napi = threaded_napi(&dut, drive.cpus.as_ref());
    let (mut c, generator) = measure(&gen, &dut, &drive)?;
    c.note = format!("kernel forwarding with DNAT, conntrack (XDP_PASS on d0); {napi}");
    results.insert("nftables".to_string(), c);
    drop((pass, sink, gen, dut));

    // The limit: the same hop in the driver.
    progress("XDP forwarder (rewrite, bpf_redirect_map)");
    let (gen, dut, sink) = pair(&tag, queues, cpus.as_ref())?;
    let gw = lb::config::parse_mac(GEN_MAC).unwrap_or_default();
    let me = lb::config::parse_mac(DUT_MAC).unwrap_or_default();
    let to: Vec<Ipv4Addr> = backends.iter().filter_map(|b| b.parse().ok()).collect();
    let (fwd, note) = XdpHold::new(&dut, move || {
        crate::xdp::attach_forwarder("d0", gw, me, &to)
            .map(|(b, mode)| (b, format!("{mode:?} XDP, rewrite + bpf_redirect_map")))
            .map_err(|source| Error::Xdp {
                iface: "d0",
                source,
            })
    })?;
    let napi = threaded_napi(&dut, drive.cpus.as_ref());
    let m = measure(&gen, &dut, &drive);
    drop(fwd);
    let (mut c, _) = m?;
    c.note = format!("{note}; {napi}");
    results.insert("xdp_forwarder".to_string(), c);
    drop((sink, gen, dut));

    let f = results["fastpath"].delivered_mpps;
    let (n, x) = (
        results["nftables"].delivered_mpps,
        results["xdp_forwarder"].delivered_mpps,
    );
    if n <= 0.0 || x <= 0.0 {
        return Err(Error::Void {
            nftables: n,
            xdp: x,
            note: results["xdp_forwarder"].note.clone(),
        });
    }
    let v4 = results["fastpath"].delivered_mpps;
    let ratio_ipv6_to_ipv4 = if v4 > 0.0 {
        results["fastpath_ipv6"].delivered_mpps / v4
    } else {
        0.0
    };
    let ratio_quic_to_udp = if v4 > 0.0 {
        results["fastpath_quic"].delivered_mpps / v4
    } else {
        0.0
    };
    Ok(Report {
        seconds: secs,
        ratio_ipv6_to_ipv4,
        ratio_quic_to_udp,
        ratio_to_nftables: f / n,
        ratio_to_xdp_forwarder: f / x,
        valid: results.values().all(|c| c.valid),
        results,
        generator_alone: alone,
        generator_queues: queues,
        generator_kind: kind,
        generator,
        cpus,
    })
}

/// The generator alone, as `d` drives it, into an XDP sink on d0.
fn generator_alone(tag: &str, d: &Drive) -> Result<Cell, Error> {
    let (gen, dut, sink) = pair(tag, d.queues, d.cpus.as_ref())?;
    let (dsink, _) = XdpHold::new(&dut, || {
        crate::xdp::attach_sink("d0")
            .map(|b| (b, String::new()))
            .map_err(|source| Error::Xdp {
                iface: "d0",
                source,
            })
    })?;
    let napi = threaded_napi(&dut, d.cpus.as_ref());
    let (mut alone, _) = measure(&gen, &dut, d)?;
    alone.valid = true;
    alone.note = format!("XDP_DROP on d0; {napi}");
    drop((dsink, sink, gen, dut));
    Ok(alone)
}

/// One fastpath row: `lb run --interface d0 --driver {driver}` as the
/// device under test.
fn fastpath_row(
    fastpath: &Path,
    driver: &str,
    tag: &str,
    backends: &[&str],
    drive: &Drive,
    prefer_busy_poll: bool,
) -> Result<Cell, Error> {
    let (gen, dut, sink) = pair(tag, drive.queues, drive.cpus.as_ref())?;
    let dir = std::env::temp_dir().join(format!("fastpath-vethbench-{tag}"));
    std::fs::create_dir_all(&dir).map_err(Error::io(format!("creating {}", dir.display())))?;
    let cfg = dir.join("lb.toml");
    let vip = if drive.v6 {
        VIP6.to_string()
    } else {
        Ipv4Addr::from(VIP).to_string()
    };
    let quic = drive.quic_backends.is_some();
    let list: Vec<String> = backends
        .iter()
        .enumerate()
        .map(|(i, b)| {
            if quic {
                format!(
                    "{{ address = \"{b}\", quic_server_id = \"{:04x}\" }}",
                    i + 1
                )
            } else {
                format!("{{ address = \"{b}\" }}")
            }
        })
        .collect();
    std::fs::write(
        &cfg,
        format!(
            "[forwarder]\nthreads = 0\nqueue_size = 1024\npool_buffers = 8192\n[conntrack]\nsize = 65536\n[api]\nlisten = \"127.0.0.1:9181\"\n\
             [encap]\nsource = \"10.30.0.2\"\ngateway_mac = \"{GEN_MAC}\"\n[[pools]]\nname = \"p\"\nbackends = [{}]\n\
             [[vips]]\nname = \"v\"\naddress = \"{vip}\"\nport = 9\nprotocol = \"udp\"\npool = \"p\"\nquic = {quic}\n{}",
            list.join(", "),
            if quic { QUIC_LB } else { "" }
        ),
    )
    .map_err(Error::io(format!("writing {}", cfg.display())))?;
    let polling = if prefer_busy_poll {
        busy_poll(&dut)
    } else {
        "no busy polling".to_string()
    };
    // The load balancer's threads start on the device under test's CPUs:
    // a child inherits the affinity of the thread that starts it.
    let mine = crate::cpus::affinity();
    if let Some(c) = &drive.cpus {
        crate::cpus::pin(None, &c.device_under_test);
    }
    // In a session of its own, as a daemon runs: with the kernel's
    // autogroups on (Debian's default), a process shares its session's
    // CPU weight with the session's other processes wherever they run. In
    // the bench's session, whose generator keeps CPU 0 busy, the load
    // balancer ran a fifth of CPU 1 and waited, runnable, the rest, while
    // d0's NAPI thread (root group, full weight) ran four fifths: the
    // AF_XDP row delivered 0.2 Mpps instead of 0.73 (session 16).
    let lb = dut
        .command("setsid")
        .args([
            &*fastpath.to_string_lossy(),
            "lb",
            "run",
            "--config",
            &cfg.to_string_lossy(),
            "--interface",
            "d0",
            "--driver",
            driver,
            "--format",
            "json",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    if let Some(set) = &mine {
        crate::cpus::set_affinity(set);
    }
    let lb = lb.map_err(Error::io("starting the load balancer"))?;
    std::thread::sleep(Duration::from_millis(1500));
    if let Some(c) = &drive.cpus {
        // Also threads it may have had before the affinity was set (none
        // expected: it is inherited).
        crate::cpus::pin_process(lb.id(), &c.device_under_test);
    }
    // From /proc, not getsid(2): see crate::proc on why.
    let own = crate::proc::session("self");
    let session = match crate::proc::session(lb.id()) {
        Some(s) if Some(s) != own => "own session",
        _ => "in the bench's session (its CPU weight shared with the generator)",
    };
    let napi = threaded_napi(&dut, drive.cpus.as_ref());
    let m = measure(&gen, &dut, drive);
    // The child is ours and not yet reaped, so its pid is still its own.
    let _ = rustix::process::kill_process(
        rustix::process::Pid::from_child(&lb),
        rustix::process::Signal::TERM,
    );
    let out = lb.wait_with_output();
    let (log, stats) = match &out {
        Ok(o) => (
            String::from_utf8_lossy(&o.stderr).into_owned(),
            serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap_or_default(),
        ),
        Err(_) => (String::new(), serde_json::Value::Null),
    };
    let driver = log
        .lines()
        .find(|l| l.contains("driver:"))
        .map(|l| l[l.find("driver:").unwrap_or(0)..].trim().to_string())
        .unwrap_or_default();
    let (mut c, _) = m?;
    c.copies_per_packet = stats["user_copies_per_forwarded"].as_f64();
    c.frames_to_user_space = stats["port"]["rx"].as_u64();
    c.note = format!("{driver}; {session}; {napi}; {polling}");
    drop((sink, gen, dut));
    let _ = std::fs::remove_dir_all(&dir);
    Ok(c)
}

impl Report {
    /// As a table.
    pub fn to_text(&self) -> String {
        let mut t = measure::Table::new([
            "device under test",
            "offered Mpps",
            "reached DUT Mpps",
            "delivered Mpps",
            "drops",
            "valid",
            "copies/pkt",
            "how",
        ])
        .title(format!(
            "64-byte UDP through a veth pair from {}, {} s each (all on this machine's cores)",
            match self.generator_kind {
                GeneratorKind::AfXdp => "an AF_XDP generator",
                GeneratorKind::Xdp => "an XDP generator",
            },
            self.seconds
        ));
        for k in [
            "fastpath",
            "fastpath_quic",
            "fastpath_ipv6",
            "fastpath_af_xdp",
            "nftables",
            "xdp_forwarder",
        ] {
            if let Some(c) = self.results.get(k) {
                t.row([
                    k.to_string(),
                    format!("{:.3}", c.offered_mpps),
                    format!("{:.3}", c.reached_mpps),
                    format!("{:.3}", c.delivered_mpps),
                    format!(
                        "{} ({} before d0, d0 counted {}; d0 sent {:.3} Mpps back, g0 dropped {})",
                        c.drops,
                        c.drops_at_interface,
                        c.dut_rx_dropped,
                        c.dut_sent_mpps,
                        c.dropped_on_return
                    ),
                    if c.valid { "yes" } else { "NO" }.to_string(),
                    c.copies_per_packet
                        .map_or("-".to_string(), |x| format!("{x:.2}")),
                    c.note.clone(),
                ]);
            }
        }
        let g = &self.generator_alone;
        format!(
            "{t}\n{}\ngenerator: {}\ngenerator alone ({} thread(s), into an XDP sink on d0): offered {:.3} Mpps, reached d0 {:.3} Mpps\n\
             fastpath / nftables = {:.2}x (goal >= 2)   fastpath / XDP forwarder = {:.2} (goal >= 0.7)\n\
             fastpath in the driver, IPv6 / IPv4 = {:.2} (goal >= 0.8; the IPv6 frames are 62 bytes, GRE over IPv4 to the same backends)\n\
             fastpath in the driver, QUIC by connection ID / UDP = {:.2} (goal >= 0.8; the same 64-byte frames, each a QUIC short header routable to a backend, plaintext QUIC-LB)\n\
             valid rows: offered >= {VALID_OFFER_RATIO} x delivered (the generator was not the limit){}\n{}",
            Cpus::describe(self.cpus.as_ref()),
            self.generator,
            self.generator_queues,
            g.offered_mpps,
            g.reached_mpps,
            self.ratio_to_nftables,
            self.ratio_to_xdp_forwarder,
            self.ratio_ipv6_to_ipv4,
            self.ratio_quic_to_udp,
            if self.valid {
                ""
            } else {
                "; a row marked NO measured the generator, not the device under test"
            },
            if self.ratio_to_xdp_forwarder > 1.0 {
                "note: fastpath delivered more than the XDP forwarder, so in this run that row is a \
                 reference, not a ceiling: both spend most of the device under test's core in veth's \
                 receive and redirect, not in their programs\n"
            } else {
                ""
            }
        )
    }
}
