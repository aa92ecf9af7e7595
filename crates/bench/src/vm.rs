//! `fastpath switch bench --part vm`: the paper's Figure 1 with virtual
//! machines that boot a kernel, measured in one run.
//!
//! Two QEMU guests (TCG) and the switch in this process:
//!
//! - guest A has three NICs: virtio-net on the switch's vhost-user port
//!   `vm-a`, virtio-net on QEMU's own TAP backend (the kernel path the
//!   paper compares against), and an emulated e1000 on another TAP; both
//!   TAPs live in a namespace of their own, where nothing answers;
//! - guest B has one NIC, on the switch's vhost-user port `vm-b`;
//! - the switch also has a sink port that owns a MAC (frames for it go
//!   there alone).
//!
//! Each guest transmits with the kernel's pktgen (60-byte frames), `burst`
//! frames per doorbell (`xmit_more`: the unmodified-guest form of Send
//! Combining). Rows:
//!
//! - guest A to the sink over vhost-user in each notification scheme (BASE,
//!   moderated, SC, CSB, CSB moderated), burst 1 and 32: packets per second
//!   and, from the port's counters, kicks and interrupts per packet;
//! - the same guest over QEMU's TAP backend, burst 1 and 32;
//! - the e1000 with the guest driver's interrupt throttling off
//!   (`InterruptThrottleRate=0`: the paper's BASE) and on (2,000 interrupts
//!   a second at most: the paper's itr=100, 40,000 a second, never binds at
//!   the rates a TCG guest reaches, and neither does the driver's dynamic
//!   default), burst 1 and 32, interrupts per packet from the guest's
//!   `/proc/interrupts`;
//! - guest A to guest B through the switch beside guest A to the sink in
//!   the same repeat (the switch adds one copy), and ping round trips
//!   between the two guests.
//!
//! Every figure is the minimum, median and maximum of `repeats` runs, with
//! the load average beside it: the machine is shared and the guests'
//! CPUs are emulated. Every row says its limit; what KVM would add (a VM
//! exit per kick and per e1000 register write, an injection per
//! interrupt) is said, not measured: this machine cannot run KVM guests.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lab::guest::{Guest, GuestError, GuestOpts, Nic};
use lab::netns::Netns;
use ring::Mode;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use vswitch::ports::vhost::datapath::TXQ;
use vswitch::{Config, Switch, VhostPort, VhostUserEntry};

use crate::switch_ports::SinkPort;

use crate::Progress;

/// Guest A's vhost-user NIC, its TAP-backend NIC, its e1000; guest B's NIC;
/// the sink's address.
pub(crate) const MAC_A: &str = "52:54:00:fa:0a:01";
const MAC_A_TAP: &str = "52:54:00:fa:0a:02";
const MAC_A_E1000: &str = "52:54:00:fa:0a:03";
pub(crate) const MAC_B: &str = "52:54:00:fa:0b:01";
pub(crate) const MAC_SINK: [u8; 6] = [0x02, 0xfa, 0x5e, 0x00, 0x00, 0x01];
const MAC_SINK_TEXT: &str = "02:fa:5e:00:00:01";
/// A destination nobody owns behind QEMU's TAPs (the namespace's kernel
/// counts and drops the frames).
const MAC_NOBODY: &str = "02:fa:5e:00:00:fe";
pub(crate) const IP_A: &str = "10.78.0.1";
pub(crate) const IP_B: &str = "10.78.0.2";
const IP_SINK: &str = "10.78.0.9";
/// The guests' TAPs, in the bench's namespace.
const TAP: &str = "fpvbtap0";
const TAP_E1000: &str = "fpvbe1k0";

/// Errors running the VM rows.
#[derive(Debug, thiserror::Error)]
pub enum VmError {
    /// QEMU or the guest image is missing.
    #[error("QEMU 10 and the guest image are needed (scripts/setup.sh installs both)")]
    Unavailable,
    /// Not root: the TAP backend needs a namespace.
    #[error("the VM rows need root (QEMU's TAP backend runs in a network namespace)")]
    NotRoot,
    /// The namespace could not be built.
    #[error(transparent)]
    Lab(#[from] lab::Error),
    /// The namespace or its links could not be made.
    #[error(transparent)]
    Netns(#[from] lab::netns::Error),
    /// A guest failed.
    #[error("guest {guest}")]
    Guest {
        /// Which.
        guest: &'static str,
        /// Why.
        #[source]
        source: GuestError,
    },
    /// The switch could not start.
    #[error("starting the switch")]
    Switch(#[source] vswitch::Error),
    /// A socket directory could not be made.
    #[error("{what}")]
    Io {
        /// What was being done.
        what: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Interrupted (SIGINT or SIGTERM).
    #[error("interrupted")]
    Interrupted,
}

/// What to run.
#[derive(Clone)]
pub struct VmOptions {
    /// Short runs (fewer frames per run).
    pub quick: bool,
    /// Runs per figure (min/median/max over them).
    pub repeats: usize,
    /// The switch's poll_us.
    pub poll_us: u64,
    /// Called with one line per measurement.
    pub progress: Option<Progress>,
    /// Set to stop early.
    pub stop: Arc<AtomicBool>,
    /// Entries in each ring of the guests' vhost-user NICs
    /// ([`lab::guest::GuestOpts::vhost_ring`]).
    pub vhost_ring: u16,
}

/// One scheme row of the vhost-user table.
struct Scheme {
    key: &'static str,
    label: &'static str,
    mode: Mode,
    itr: u32,
    /// The paper's guest-to-guest UDP rate on VALE for this scheme, Kpps.
    paper_kpps: Option<f64>,
}

const SCHEMES: [Scheme; 5] = [
    Scheme {
        key: "base",
        label: "BASE",
        mode: Mode::Base,
        itr: 0,
        paper_kpps: Some(111.0),
    },
    Scheme {
        key: "moderated",
        label: "BASE itr=100 (moderated)",
        mode: Mode::Base,
        itr: 100,
        paper_kpps: Some(110.0),
    },
    Scheme {
        key: "sc",
        label: "SC (kicks off while polling)",
        mode: Mode::Sc,
        itr: 0,
        paper_kpps: Some(540.0),
    },
    Scheme {
        key: "csb",
        label: "CSB (event-index windows)",
        mode: Mode::Csb,
        itr: 0,
        paper_kpps: Some(629.0),
    },
    Scheme {
        key: "csb_itr100",
        label: "CSB itr=100",
        mode: Mode::Csb,
        itr: 100,
        paper_kpps: None,
    },
];

const LIMIT_TCG: &str = "TCG: the guest's CPU is emulated, so a kick or an interrupt costs no VM exit here and the rate is bounded by the emulated sender sharing two cores with QEMU and the switch; under KVM each kick would be a VM exit (an ioeventfd write) and each interrupt an injection, costs this machine cannot show";
const LIMIT_TAP: &str = "QEMU's own virtio backend writes each frame to the TAP with a system call from its main loop (the kernel path the paper compares against); TCG as for vhost-user";
const LIMIT_E1000: &str = "emulated e1000 on QEMU's TAP backend: each doorbell is a register write QEMU traps (a VM exit under KVM, not costed under TCG); interrupts counted in the guest's /proc/interrupts, fewer than one per frame even unthrottled because the driver polls (NAPI) while frames keep completing; QEMU 10 has no e1000 'mitigation' switch, so moderation is asked of the guest driver (InterruptThrottleRate 0: off; on: 2,000/s, low enough to bind at TCG rates where the paper's 40,000/s would not); whether QEMU's emulated e1000 honours it shows in throttled_over_unthrottled_irq_per_packet (about 1: it does not)";
const LIMIT_G2G: &str = "three CPUs' worth of work (guest A, guest B, the switch) on two cores, placed so that the receiver takes no CPU from the sender; what B receives is bounded by its emulated receive path (TCG: tens of thousands of frames a second, flat out whenever A sends faster), not by the switch's one copy or B's ring: a bigger ring only delays the first drop by a few milliseconds at these rates";
const LIMIT_RTT: &str = "busybox ping through both guests' kernels under TCG: emulation dominates, not the switch; the paper's 7.2 KTps (VALE, CSB) is about 140 us per transaction under KVM";

/// Turns a guest's error into the bench's, naming the guest.
pub(crate) fn err(guest: &'static str) -> impl FnOnce(GuestError) -> VmError {
    move |source| VmError::Guest { guest, source }
}

/// min, median and max of a figure over the repeats, and its samples.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Stats {
    /// The smallest finite sample.
    pub min: Option<f64>,
    /// The median of the finite samples.
    pub median: Option<f64>,
    /// The largest finite sample.
    pub max: Option<f64>,
    /// Every sample, in run order (a non-finite one is `null`).
    #[serde(deserialize_with = "crate::nan::vec")]
    pub samples: Vec<f64>,
}

/// min, median, max (and the samples) of a figure.
pub fn stats(samples: &[f64]) -> Stats {
    let mut v: Vec<f64> = samples.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return Stats {
            samples: samples.to_vec(),
            ..Stats::default()
        };
    }
    v.sort_by(f64::total_cmp);
    let med = measure::median(&mut v.clone());
    Stats {
        min: Some(v[0]),
        median: Some(med),
        max: Some(v[v.len() - 1]),
        samples: samples.to_vec(),
    }
}

impl Stats {
    /// `min / median / max`, scaled.
    pub(crate) fn mmm(&self, scale: f64, digits: usize) -> String {
        let f = |x: Option<f64>| crate::nan::cell(x.map(|x| x * scale), digits);
        format!("{} / {} / {}", f(self.min), f(self.median), f(self.max))
    }
}

/// Guest A over vhost-user in one notification scheme and burst.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct VhostRow {
    /// The scheme's label.
    pub label: String,
    /// The port's notification mode.
    pub mode: String,
    /// Interrupt moderation, in 250 ns units.
    pub itr: u32,
    /// Frames per doorbell.
    pub burst: u32,
    /// Guest transmit, packets per second.
    pub guest_tx_pps: Stats,
    /// Kicks per packet.
    pub kicks_per_packet: Stats,
    /// Interrupts per packet.
    pub interrupts_per_packet: Stats,
    /// Kicks and interrupts per packet.
    pub notifications_per_packet: Stats,
    /// The paper's figure for this scheme, Kpps.
    pub paper_vale_guest_guest_udp_kpps: Option<f64>,
    /// What bounds the row.
    pub limit: String,
}

/// One scheme's two bursts.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Bursts {
    /// One frame per doorbell.
    pub burst1: VhostRow,
    /// 32 frames per doorbell.
    pub burst32: VhostRow,
}

/// Guest A over QEMU's TAP backend in one burst.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TapRow {
    /// Frames per doorbell.
    pub burst: u32,
    /// Guest transmit, packets per second.
    pub guest_tx_pps: Stats,
    /// Interrupts per packet, in the guest.
    pub interrupts_per_packet: Stats,
    /// The paper's TAP figure, Kpps.
    pub paper_tap_guest_host_pktgen_kpps: f64,
    /// What bounds the row.
    pub limit: String,
}

/// Guest A over an emulated e1000 in one throttle setting and burst.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct E1000Row {
    /// The driver's InterruptThrottleRate (0: off).
    pub interrupt_throttle_rate: u32,
    /// Frames per doorbell.
    pub burst: u32,
    /// Guest transmit, packets per second.
    pub guest_tx_pps: Stats,
    /// Interrupts per packet, in the guest.
    pub interrupts_per_packet: Stats,
    /// The paper's e1000 figure, Kpps.
    pub paper_tap_e1000_udp_kpps: f64,
    /// What bounds the row.
    pub limit: String,
}

/// The e1000 rows, and whether the throttling did anything.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct E1000 {
    /// Throttling off, one frame per doorbell.
    pub moderation_off_burst1: E1000Row,
    /// Throttling off, 32 frames per doorbell.
    pub moderation_off_burst32: E1000Row,
    /// Throttling on, one frame per doorbell.
    pub moderation_on_burst1: E1000Row,
    /// Throttling on, 32 frames per doorbell.
    pub moderation_on_burst32: E1000Row,
    /// Interrupts per packet throttled over unthrottled (medians), burst 1.
    pub throttled_over_unthrottled_irq_per_packet_burst1: Option<f64>,
    /// The same, burst 32.
    pub throttled_over_unthrottled_irq_per_packet_burst32: Option<f64>,
}

/// The paper's VALE guest-to-guest pkt-gen rates, Kpps.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct TxRx {
    /// Transmit.
    pub tx: f64,
    /// Receive.
    pub rx: f64,
}

/// Guest A to the sink and to guest B, and ping between the guests.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct GuestToGuest {
    /// A to the sink, packets per second.
    pub sink: Stats,
    /// A to B through the switch, packets per second.
    pub pps: Stats,
    /// What `pps` counts.
    pub pps_is: String,
    /// What B received, packets per second.
    pub rx_pps: Stats,
    /// What `rx_pps` counts.
    pub rx_pps_is: String,
    /// Frames dropped at B's full ring per run.
    pub dropped_at_full_ring: Stats,
    /// Frames guest B's kernel counted as dropped (`rx_dropped` of its
    /// NIC) per run: drops after the ring, inside the guest.
    #[serde(default)]
    pub dropped_in_guest: Stats,
    /// Entries in each ring of the guests' vhost-user NICs.
    #[serde(default)]
    pub vhost_ring: u16,
    /// Where the guests and the switch ran.
    #[serde(default)]
    pub placement: String,
    /// `pps` over the sink's rate.
    pub ratio_over_sink: Stats,
    /// `rx_pps` over the sink's rate.
    pub rx_ratio_over_sink: Stats,
    /// Ping's median round trip, microseconds.
    pub rtt_us_p50: Stats,
    /// Pings without a reply.
    pub ping_lost: u32,
    /// The paper's figures.
    pub paper_vale_guest_guest_pktgen_kpps: TxRx,
    /// The paper's request-response rate, thousands per second.
    pub paper_vale_csb_rr_ktps: f64,
    /// What bounds the rates.
    pub limit: String,
    /// What bounds the round trips.
    pub rtt_limit: String,
}

/// The vhost-user rows and the figures taken from them.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct VhostUser {
    /// CSB, burst 32: guest transmit.
    pub guest_tx_pps: Stats,
    /// What `guest_tx_pps` measures.
    pub guest_tx_pps_is: String,
    /// CSB, burst 1: guest transmit.
    pub guest_tx_pps_burst1: Stats,
    /// CSB, burst 32: notifications per packet.
    pub notifications_per_packet: Stats,
    /// Which row `notifications_per_packet` is.
    pub notifications_row: String,
    /// Every scheme's rows, by scheme key.
    pub schemes: BTreeMap<String, Bursts>,
    /// What bounds the rows.
    pub limit: String,
}

/// The QEMU TAP rows.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct QemuTap {
    /// Burst 32: guest transmit.
    pub guest_tx_pps: Stats,
    /// What `guest_tx_pps` measures.
    pub guest_tx_pps_is: String,
    /// One frame per doorbell.
    pub burst1: TapRow,
    /// 32 frames per doorbell.
    pub burst32: TapRow,
    /// What bounds the rows.
    pub limit: String,
}

/// Guest A to the sink port.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct GuestToSink {
    /// Packets per second.
    pub pps: Stats,
    /// What bounds it.
    pub limit: String,
}

/// What the vm part set out to show.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct Goals {
    /// vhost-user over QEMU TAP.
    pub ratio_vhost_user_over_tap_at_least: f64,
    /// Notifications per packet at saturation.
    pub notifications_per_packet_at_most: f64,
    /// Guest to guest over guest to sink.
    pub guest_to_guest_over_sink_at_least: f64,
}

/// The machine and the run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Machine {
    /// QEMU's accelerator.
    pub accel: String,
    /// The guest.
    pub guest: String,
    /// Seconds until both guests were up.
    #[serde(deserialize_with = "crate::nan::f64")]
    pub boot_s: f64,
    /// The 1-minute load average at each run's start.
    pub load_avg_1min: Stats,
    /// Its largest.
    #[serde(deserialize_with = "crate::nan::f64")]
    pub load_avg_max: f64,
    /// pktgen frames per run.
    pub frames_per_run: u64,
    /// Runs per figure.
    pub repeats: usize,
    /// The switch's `poll_us`.
    pub switch_poll_us: u64,
    /// Seconds of the whole part.
    #[serde(deserialize_with = "crate::nan::f64")]
    pub seconds: f64,
}

/// Figure 1 with QEMU guests: the vm part of `fastpath switch bench`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Vm {
    /// Over the switch's vhost-user ports.
    pub vhost_user: VhostUser,
    /// Over QEMU's TAP backend.
    pub qemu_tap: QemuTap,
    /// vhost-user over QEMU TAP, burst 32, paired per repeat.
    pub ratio_vhost_user_over_tap: Stats,
    /// The same, burst 1.
    pub ratio_vhost_user_over_tap_burst1: Stats,
    /// The paper's VALE over TAP with pkt-gen.
    pub ratio_paper_vale_over_tap_pktgen: f64,
    /// Guest A to the sink port.
    pub guest_to_sink: GuestToSink,
    /// Guest A to guest B.
    pub guest_to_guest: GuestToGuest,
    /// Over an emulated e1000.
    pub e1000: E1000,
    /// The switch restarted under two pinging guests
    /// ([`crate::vm_upgrade`]).
    #[serde(default)]
    pub upgrade: Option<crate::vm_upgrade::Upgrade>,
    /// A 2-vCPU guest with two queue pairs against one
    /// ([`crate::vm_mq`]).
    #[serde(default)]
    pub multiqueue: Option<crate::vm_mq::Multiqueue>,
    /// Guest transmit beside DPDK testpmd's vhost PMD (its own guest).
    #[serde(default)]
    pub testpmd: crate::vm_testpmd::TestpmdPart,
    /// What the part set out to show.
    pub goals: Goals,
    /// The machine and the run.
    pub machine: Machine,
    /// TCP between two guests (`tcp`, `tcp4`, `tcp_run`).
    #[serde(flatten)]
    pub tcp: crate::vm_tcp::VmTcp,
}

/// The vm part of a report: measured, or skipped and why.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(untagged)]
pub enum VmPart {
    /// Not run.
    Skipped {
        /// Why.
        skipped: String,
    },
    /// The figures.
    Measured(Box<Vm>),
    /// The multiqueue row alone (`--part vm-multiqueue`).
    Multiqueue {
        /// Its figures.
        multiqueue: Box<crate::vm_mq::Multiqueue>,
    },
}

impl VmPart {
    /// The vm part's table and lines, or why it was skipped.
    pub fn to_text(&self) -> String {
        match self {
            VmPart::Skipped { skipped } => format!("vm part skipped: {skipped}\n"),
            VmPart::Measured(v) => v.to_text(),
            VmPart::Multiqueue { multiqueue } => multiqueue.to_text(),
        }
    }
}

impl Vm {
    /// Guest transmit in every path, then guest to guest, ratios, limits.
    pub fn to_text(&self) -> String {
        let opt = crate::nan::cell;
        let mut t = measure::Table::new([
            "path",
            "burst",
            "guest TX Kpps (min/med/max)",
            "kicks/pkt",
            "irq/pkt",
            "notif/pkt",
            "paper Kpps",
        ])
        .title("guest transmit, 60-byte frames (pktgen in a TCG guest)");
        for (key, rows) in &self.vhost_user.schemes {
            for r in [&rows.burst1, &rows.burst32] {
                t.row([
                    format!("vhost-user {key}"),
                    r.burst.to_string(),
                    r.guest_tx_pps.mmm(1e-3, 1),
                    opt(r.kicks_per_packet.median, 4),
                    opt(r.interrupts_per_packet.median, 4),
                    opt(r.notifications_per_packet.median, 4),
                    opt(r.paper_vale_guest_guest_udp_kpps, 0),
                ]);
            }
        }
        for r in [&self.qemu_tap.burst1, &self.qemu_tap.burst32] {
            t.row([
                "QEMU TAP backend".to_string(),
                r.burst.to_string(),
                r.guest_tx_pps.mmm(1e-3, 1),
                "-".into(),
                opt(r.interrupts_per_packet.median, 4),
                "-".into(),
                opt(Some(r.paper_tap_guest_host_pktgen_kpps), 0),
            ]);
        }
        let e = &self.e1000;
        for (key, r) in [
            ("moderation_off", &e.moderation_off_burst1),
            ("moderation_off", &e.moderation_off_burst32),
            ("moderation_on", &e.moderation_on_burst1),
            ("moderation_on", &e.moderation_on_burst32),
        ] {
            t.row([
                format!("e1000 {key}"),
                r.burst.to_string(),
                r.guest_tx_pps.mmm(1e-3, 1),
                "-".into(),
                opt(r.interrupts_per_packet.median, 4),
                "-".into(),
                opt(Some(r.paper_tap_e1000_udp_kpps), 0),
            ]);
        }
        let mut out = format!("{t}\n");
        let _ = writeln!(
            out,
            "e1000 interrupts per packet, throttled over unthrottled: {} (burst 1), {} (burst 32)",
            opt(e.throttled_over_unthrottled_irq_per_packet_burst1, 2),
            opt(e.throttled_over_unthrottled_irq_per_packet_burst32, 2),
        );
        let g = &self.guest_to_guest;
        let _ = writeln!(
            out,
            "guest to sink: {} Kpps; guest to guest: A sends {} Kpps through the switch, ratio {} (goal >= 0.5); B receives {} Kpps, ratio {}",
            self.guest_to_sink.pps.mmm(1e-3, 1),
            g.pps.mmm(1e-3, 1),
            g.ratio_over_sink.mmm(1.0, 2),
            g.rx_pps.mmm(1e-3, 1),
            g.rx_ratio_over_sink.mmm(1.0, 2),
        );
        let _ = writeln!(
            out,
            "ping A to B: p50 {} us ({} lost)",
            g.rtt_us_p50.mmm(1.0, 0),
            g.ping_lost
        );
        let _ = writeln!(
            out,
            "vhost-user / QEMU TAP: {} (burst 32), {} (burst 1); goal >= 2; the paper's VALE / TAP with pkt-gen: {:.1}",
            self.ratio_vhost_user_over_tap.mmm(1.0, 2),
            self.ratio_vhost_user_over_tap_burst1.mmm(1.0, 2),
            self.ratio_paper_vale_over_tap_pktgen
        );
        let _ = writeln!(
            out,
            "notifications per packet at saturation (CSB, burst 32): {} (goal <= 0.05)",
            self.vhost_user.notifications_per_packet.mmm(1.0, 4)
        );
        if let Some(u) = &self.upgrade {
            let _ = writeln!(out, "switch restarted under pinging guests ({}): ping gap {} ms, switch down {} ms, pings back {} ms after the new switch serves, {} reboots (goal: pings back <= 1000 ms after it serves, 0 reboots)", u.signal, u.ping_gap_ms.mmm(1.0, 0), u.switch_down_ms.mmm(1.0, 0), u.resumed_after_serving_ms.mmm(1.0, 0), u.reboots);
            for (i, b) in u.breakdown.iter().enumerate() {
                let _ = writeln!(out, "  restart {}, ms after the stop: {}", i + 1, b.line());
            }
        }
        let m = &self.machine;
        let _ = writeln!(
            out,
            "load average (1 min) over the runs: {}; guests booted in {:.0} s; {:.0} s in all",
            m.load_avg_1min.mmm(1.0, 1),
            m.boot_s,
            m.seconds
        );
        if let Some(m) = &self.multiqueue {
            out += &m.to_text();
        }
        out += &self.testpmd.to_text();
        out += "limits:\n";
        for (what, l) in [
            ("vhost-user", &self.vhost_user.limit),
            ("QEMU TAP", &self.qemu_tap.limit),
            ("guest to guest", &g.limit),
            ("ping", &g.rtt_limit),
            ("e1000", &e.moderation_off_burst1.limit),
        ] {
            let _ = writeln!(out, "  {what}: {l}");
        }
        out + &self.tcp.to_text()
    }
}

/// The switch, running on its own thread between measurements; taken back
/// to change a port's scheme or read its counters.
pub(crate) struct Running {
    sw: Option<Switch>,
    run: Option<(Arc<AtomicBool>, std::thread::JoinHandle<Switch>)>,
}

impl Running {
    /// `sw`, not yet running.
    pub(crate) fn new(sw: Switch) -> Running {
        Running {
            sw: Some(sw),
            run: None,
        }
    }

    pub(crate) fn start(&mut self) {
        if let Some(sw) = self.sw.take() {
            self.run = Some(vswitch::spawn(sw).expect("a switch that binds no socket starts"));
        }
    }

    pub(crate) fn stop(&mut self) -> &mut Switch {
        if let Some((stop, h)) = self.run.take() {
            stop.store(true, Ordering::Relaxed);
            match h.join() {
                Ok(sw) => self.sw = Some(sw),
                Err(e) => std::panic::resume_unwind(e),
            }
        }
        self.sw.as_mut().expect("the switch is here when stopped")
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some((stop, h)) = self.run.take() {
            stop.store(true, Ordering::Relaxed);
            let _ = h.join();
        }
    }
}

/// What the switch counted on one port.
#[derive(Clone, Copy, Default)]
struct PortCount {
    from_port: u64,
    to_port: u64,
    dropped: u64,
    kicks: u64,
    calls: u64,
}

fn count(sw: &mut Switch, idx: u16) -> PortCount {
    let Some(p) = sw.port_mut(idx) else {
        return PortCount::default();
    };
    let c = *p.counters();
    let mut pc = PortCount {
        from_port: c.from_port,
        to_port: c.to_port,
        dropped: c.dropped_full,
        ..PortCount::default()
    };
    if let Some(v) = sw.port_as::<VhostPort>(idx) {
        let st = v.queue_stats();
        pc.kicks = st[TXQ].kicks;
        pc.calls = st[TXQ].calls;
    }
    pc
}

pub(crate) struct Bench<'a> {
    o: &'a VmOptions,
    sw: Running,
    a: Guest,
    b: Guest,
    a_vhost: String,
    a_tap: String,
    a_e1000: String,
    b_vhost: String,
    idx_a: u16,
    idx_b: u16,
    idx_sink: u16,
    frames: u64,
    /// Loads average seen at each measurement.
    loads: Vec<f64>,
}

impl<'a> Bench<'a> {
    /// The guest-to-guest rows alone ([`crate::vm_rings`]): guest A with
    /// its vhost-user NIC `a_if` only, guest B on `b_if`; `idx` holds
    /// the ports of A, B and the sink.
    pub(crate) fn narrow(
        o: &'a VmOptions,
        sw: Running,
        a: Guest,
        b: Guest,
        a_if: String,
        b_if: String,
        idx: [u16; 3],
    ) -> Bench<'a> {
        Bench {
            o,
            sw,
            a,
            b,
            a_vhost: a_if,
            a_tap: String::new(),
            a_e1000: String::new(),
            b_vhost: b_if,
            idx_a: idx[0],
            idx_b: idx[1],
            idx_sink: idx[2],
            frames: if o.quick { 20_000 } else { 100_000 },
            loads: Vec::new(),
        }
    }

    /// Frames the switch dropped at port `idx`'s full ring so far.
    pub(crate) fn dropped_at(&mut self, idx: u16) -> u64 {
        let c = count(self.sw.stop(), idx);
        self.sw.start();
        c.dropped
    }

    /// Guests A and B.
    pub(crate) fn guests(&mut self) -> (&mut Guest, &mut Guest) {
        (&mut self.a, &mut self.b)
    }

    fn say(&self, s: &str) {
        if let Some(p) = &self.o.progress {
            p(s);
        }
    }

    fn check(&self) -> Result<(), VmError> {
        if self.o.stop.load(Ordering::Relaxed) {
            return Err(VmError::Interrupted);
        }
        Ok(())
    }

    /// Bounded time for one pktgen run of `frames` (TCG can be slow).
    fn within(&self) -> Duration {
        Duration::from_secs(60 + self.frames / 2000)
    }

    /// Guest A's pktgen over vhost-user to the sink in `s`'s scheme.
    fn vhost_row(&mut self, s: &Scheme, burst: u32) -> Result<VhostRow, VmError> {
        let mut pps = Vec::new();
        let mut kpp = Vec::new();
        let mut ipp = Vec::new();
        let mut npp = Vec::new();
        for r in 0..self.o.repeats {
            self.check()?;
            let sw = self.sw.stop();
            for i in [self.idx_a, self.idx_b] {
                if let Some(v) = sw.port_as::<VhostPort>(i) {
                    v.set_notify(s.mode, s.itr);
                }
            }
            let c0 = count(sw, self.idx_a);
            let k0 = count(sw, self.idx_sink);
            self.sw.start();
            let load = crate::proc::load_average_1min();
            let p = self
                .a
                .pktgen(
                    &self.a_vhost.clone(),
                    self.frames,
                    60,
                    burst,
                    MAC_SINK_TEXT,
                    IP_SINK,
                    self.within(),
                )
                .map_err(err("A"))?;
            std::thread::sleep(Duration::from_millis(100));
            let sw = self.sw.stop();
            let c1 = count(sw, self.idx_a);
            let k1 = count(sw, self.idx_sink);
            self.sw.start();
            let taken = (c1.from_port - c0.from_port).max(1) as f64;
            let kicks = (c1.kicks - c0.kicks) as f64 / taken;
            let irqs = (c1.calls - c0.calls) as f64 / taken;
            pps.push(p.pps as f64);
            kpp.push(kicks);
            ipp.push(irqs);
            npp.push(kicks + irqs);
            self.loads.push(load);
            self.say(&format!(
                "vhost-user {} burst {burst} [{}/{}]: {} pps, {:.3} kicks + {:.3} interrupts per packet, sink took {} of {} (load {load:.1})",
                s.key,
                r + 1,
                self.o.repeats,
                p.pps,
                kicks,
                irqs,
                k1.to_port - k0.to_port,
                p.sent
            ));
        }
        Ok(VhostRow {
            label: s.label.into(),
            mode: s.mode.to_string(),
            itr: s.itr,
            burst,
            guest_tx_pps: stats(&pps),
            kicks_per_packet: stats(&kpp),
            interrupts_per_packet: stats(&ipp),
            notifications_per_packet: stats(&npp),
            paper_vale_guest_guest_udp_kpps: s.paper_kpps,
            limit: LIMIT_TCG.into(),
        })
    }

    /// Guest A's pktgen over QEMU's TAP backend.
    fn tap_row(&mut self, burst: u32) -> Result<TapRow, VmError> {
        let irq = self.a.irq_name(&self.a_tap.clone()).map_err(err("A"))?;
        let mut pps = Vec::new();
        let mut ipp = Vec::new();
        for r in 0..self.o.repeats {
            self.check()?;
            let i0 = self.a.interrupts(&irq).map_err(err("A"))?;
            let load = crate::proc::load_average_1min();
            let p = self
                .a
                .pktgen(
                    &self.a_tap.clone(),
                    self.frames,
                    60,
                    burst,
                    MAC_NOBODY,
                    "10.79.0.9",
                    self.within(),
                )
                .map_err(err("A"))?;
            let i1 = self.a.interrupts(&irq).map_err(err("A"))?;
            let per = (i1 - i0) as f64 / p.sent.max(1) as f64;
            pps.push(p.pps as f64);
            ipp.push(per);
            self.loads.push(load);
            self.say(&format!(
                "QEMU TAP backend burst {burst} [{}/{}]: {} pps, {per:.3} interrupts per packet (load {load:.1})",
                r + 1,
                self.o.repeats,
                p.pps
            ));
        }
        Ok(TapRow {
            burst,
            guest_tx_pps: stats(&pps),
            interrupts_per_packet: stats(&ipp),
            paper_tap_guest_host_pktgen_kpps: 720.0,
            limit: LIMIT_TAP.into(),
        })
    }

    /// The e1000 with the driver's throttling off, then at 2,000 interrupts
    /// a second.
    fn e1000_rows(&mut self) -> Result<E1000, VmError> {
        let mut out = Vec::new();
        for (key, itr) in [("moderation_off", 0u32), ("moderation_on", 2000)] {
            self.check()?;
            self.a_e1000 = self.a.e1000_throttle(itr, MAC_A_E1000).map_err(err("A"))?;
            let irq = self.a_e1000.clone();
            for burst in [1u32, 32] {
                let mut pps = Vec::new();
                let mut ipp = Vec::new();
                for r in 0..self.o.repeats {
                    self.check()?;
                    let i0 = self.a.interrupts(&irq).map_err(err("A"))?;
                    let load = crate::proc::load_average_1min();
                    let p = self
                        .a
                        .pktgen(
                            &irq,
                            self.frames / 4,
                            60,
                            burst,
                            MAC_NOBODY,
                            "10.79.0.9",
                            self.within(),
                        )
                        .map_err(err("A"))?;
                    let i1 = self.a.interrupts(&irq).map_err(err("A"))?;
                    let per = (i1 - i0) as f64 / p.sent.max(1) as f64;
                    pps.push(p.pps as f64);
                    ipp.push(per);
                    self.loads.push(load);
                    self.say(&format!(
                        "e1000 {key} burst {burst} [{}/{}]: {} pps, {per:.3} interrupts per packet (load {load:.1})",
                        r + 1,
                        self.o.repeats,
                        p.pps
                    ));
                }
                out.push(E1000Row {
                    interrupt_throttle_rate: itr,
                    burst,
                    guest_tx_pps: stats(&pps),
                    interrupts_per_packet: stats(&ipp),
                    paper_tap_e1000_udp_kpps: if itr == 0 { 30.0 } else { 82.0 },
                    limit: LIMIT_E1000.into(),
                });
            }
        }
        let [off1, off32, on1, on32]: [E1000Row; 4] =
            out.try_into().expect("two settings of two bursts each");
        // Whether the throttling did anything: interrupts per packet with it
        // over without it, per burst (medians).
        let over = |on: &E1000Row, off: &E1000Row| match (
            on.interrupts_per_packet.median,
            off.interrupts_per_packet.median,
        ) {
            (Some(on), Some(off)) if off > 0.0 => Some(on / off),
            _ => None,
        };
        Ok(E1000 {
            throttled_over_unthrottled_irq_per_packet_burst1: over(&on1, &off1),
            throttled_over_unthrottled_irq_per_packet_burst32: over(&on32, &off32),
            moderation_off_burst1: off1,
            moderation_off_burst32: off32,
            moderation_on_burst1: on1,
            moderation_on_burst32: on32,
        })
    }

    /// Guest A to the sink, then to guest B, in each repeat (CSB, burst
    /// 32); then ping between the guests.
    pub(crate) fn guest_to_guest(&mut self) -> Result<GuestToGuest, VmError> {
        let sw = self.sw.stop();
        for i in [self.idx_a, self.idx_b] {
            if let Some(v) = sw.port_as::<VhostPort>(i) {
                v.set_notify(Mode::Csb, 0);
            }
        }
        // The sender on a core of its own, the receiver and the switch on
        // the other, for the sink's runs and B's alike: unpinned, guest
        // B's emulated receive path (flat out whenever A sends faster than
        // it drains) took CPU from the sender on two shared cores, and the
        // ratio measured the scheduler (0.17-0.97 in one run). The switch
        // runs on threads this one starts, which inherit its CPU.
        let pinned = crate::cpus::pin_whole_process(self.a.pid(), 0)
            && crate::cpus::pin_whole_process(self.b.pid(), 1)
            && crate::cpus::pin_tid(0, 1);
        let placement = if pinned {
            "guest A on CPU 0; guest B and the switch on CPU 1".to_string()
        } else {
            "unpinned (pinning failed)".to_string()
        };
        self.say(&format!("guest to guest: {placement}"));
        self.sw.start();
        let r = self.guest_to_guest_pinned(placement);
        self.sw.stop();
        crate::cpus::unpin_tid(0);
        for pid in [self.a.pid(), self.b.pid()] {
            for tid in crate::cpus::threads_of(pid) {
                crate::cpus::unpin_tid(tid);
            }
        }
        self.sw.start();
        r
    }

    fn guest_to_guest_pinned(&mut self, placement: String) -> Result<GuestToGuest, VmError> {
        let mut sink = Vec::new();
        let mut g2g = Vec::new();
        let mut received = Vec::new();
        let mut ratio = Vec::new();
        let mut rx_ratio = Vec::new();
        let mut dropped = Vec::new();
        let mut dropped_in_guest = Vec::new();
        for r in 0..self.o.repeats {
            self.check()?;
            // To the sink: what the switch took and copied into it.
            let s0 = count(self.sw.stop(), self.idx_sink);
            self.sw.start();
            let p = self
                .a
                .pktgen(
                    &self.a_vhost.clone(),
                    self.frames,
                    60,
                    32,
                    MAC_SINK_TEXT,
                    IP_SINK,
                    self.within(),
                )
                .map_err(err("A"))?;
            std::thread::sleep(Duration::from_millis(100));
            let s1 = count(self.sw.stop(), self.idx_sink);
            self.sw.start();
            let secs = p.usec.max(1) as f64 / 1e6;
            let to_sink = (s1.to_port - s0.to_port) as f64 / secs;
            // To guest B: the sender's rate through the switch (every frame
            // copied into B's ring, or dropped at it when full, counted), and
            // what B received.
            let rx0 = self
                .b
                .stat(&self.b_vhost.clone(), "rx_packets")
                .map_err(err("B"))?;
            let gd0 = self
                .b
                .stat(&self.b_vhost.clone(), "rx_dropped")
                .map_err(err("B"))?;
            let b0 = count(self.sw.stop(), self.idx_b);
            let a0 = count(self.sw.stop(), self.idx_a);
            self.sw.start();
            let load = crate::proc::load_average_1min();
            let p = self
                .a
                .pktgen(
                    &self.a_vhost.clone(),
                    self.frames,
                    60,
                    32,
                    MAC_B,
                    IP_B,
                    self.within(),
                )
                .map_err(err("A"))?;
            std::thread::sleep(Duration::from_millis(200));
            let b1 = count(self.sw.stop(), self.idx_b);
            let a1 = count(self.sw.stop(), self.idx_a);
            self.sw.start();
            // B drains what its ring holds.
            std::thread::sleep(Duration::from_millis(500));
            let rx1 = self
                .b
                .stat(&self.b_vhost.clone(), "rx_packets")
                .map_err(err("B"))?;
            let gd1 = self
                .b
                .stat(&self.b_vhost.clone(), "rx_dropped")
                .map_err(err("B"))?;
            let secs = p.usec.max(1) as f64 / 1e6;
            let taken = (a1.from_port - a0.from_port) as f64;
            let accounted = (b1.to_port - b0.to_port + b1.dropped - b0.dropped) as f64;
            let tx = accounted.min(taken) / secs;
            let got = (rx1 - rx0) as f64 / secs;
            sink.push(to_sink);
            g2g.push(tx);
            received.push(got);
            ratio.push(tx / to_sink.max(1.0));
            rx_ratio.push(got / to_sink.max(1.0));
            dropped.push((b1.dropped - b0.dropped) as f64);
            dropped_in_guest.push(gd1.saturating_sub(gd0) as f64);
            self.loads.push(load);
            self.say(&format!(
                "guest to guest [{}/{}]: A to the sink {to_sink:.0} pps; A to B {tx:.0} pps through the switch ({:.2} of the sink's), B received {got:.0} pps ({:.2}), {} dropped at B's full ring ({}-entry rings), {} dropped inside B (rx_dropped) (load {load:.1})",
                r + 1,
                self.o.repeats,
                tx / to_sink.max(1.0),
                got / to_sink.max(1.0),
                b1.dropped - b0.dropped,
                self.o.vhost_ring,
                gd1.saturating_sub(gd0)
            ));
        }
        // Round trips.
        let mut rtt = Vec::new();
        let mut lost = 0u32;
        for r in 0..self.o.repeats {
            self.check()?;
            let n = if self.o.quick { 10 } else { 20 };
            let ping = self.a.ping(IP_B, n, 100).map_err(err("A"))?;
            lost += ping.sent - ping.received;
            let p50 = ping.p50_ms().map(|m| m * 1000.0).unwrap_or(f64::NAN);
            rtt.push(p50);
            self.say(&format!(
                "ping A to B [{}/{}]: {}/{} replies, p50 {p50:.0} us",
                r + 1,
                self.o.repeats,
                ping.received,
                ping.sent
            ));
        }
        Ok(GuestToGuest {
            sink: stats(&sink),
            pps: stats(&g2g),
            pps_is: "guest A's pktgen to guest B through the switch (CSB, burst 32): frames the switch took from A and copied into B's ring or dropped at it when full (counted), per second of A's run; the paper's TX side".into(),
            rx_pps: stats(&received),
            rx_pps_is: "frames guest B's kernel received per second of A's run (the paper's RX side)".into(),
            dropped_at_full_ring: stats(&dropped),
            dropped_in_guest: stats(&dropped_in_guest),
            vhost_ring: self.o.vhost_ring,
            placement,
            ratio_over_sink: stats(&ratio),
            rx_ratio_over_sink: stats(&rx_ratio),
            rtt_us_p50: stats(&rtt),
            ping_lost: lost,
            paper_vale_guest_guest_pktgen_kpps: TxRx {
                tx: 6300.0,
                rx: 4700.0,
            },
            paper_vale_csb_rr_ktps: 7.2,
            limit: LIMIT_G2G.into(),
            rtt_limit: LIMIT_RTT.into(),
        })
    }
}

/// Paired ratio of two sample lists (a[i] / b[i]).
fn ratios(a: &Stats, b: &Stats) -> Stats {
    let r: Vec<f64> = a
        .samples
        .iter()
        .zip(&b.samples)
        .map(|(x, y)| if *y > 0.0 { x / y } else { f64::NAN })
        .collect();
    stats(&r)
}

/// Boot the guests, measure every row, tear everything down.
pub fn run(o: &VmOptions) -> Result<Vm, VmError> {
    if !lab::guest::available() {
        return Err(VmError::Unavailable);
    }
    if !lab::netns::available() {
        return Err(VmError::NotRoot);
    }
    let t0 = Instant::now();
    let load_before = crate::proc::load_average_1min();
    let pid = std::process::id();
    let dir = std::env::temp_dir().join(format!("fastpath-vm-bench-{pid}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|source| VmError::Io {
        what: format!("creating {}", dir.display()),
        source,
    })?;
    let _cleanup = RemoveDir(dir.clone());
    let ns = Netns::new(&format!("fpvmbench{}", pid % 100_000))?;
    let sock = |n: &str| vm_sock(&dir, "", n);
    let mut sw = vm_switch(&dir, "", o.poll_us, &[("vm-a", MAC_A), ("vm-b", MAC_B)])?;
    let idx_a = sw.find("vm-a").unwrap_or(0);
    let idx_b = sw.find("vm-b").unwrap_or(1);
    let idx_sink = sw
        .add_port(Box::new(SinkPort::with_mac("sink", MAC_SINK)))
        .map_err(VmError::Switch)?;
    let mut running = Running {
        sw: Some(sw),
        run: None,
    };
    running.start();
    let say = |s: &str| {
        if let Some(p) = &o.progress {
            p(s);
        }
    };
    say("booting two guests (TCG: 10-60 s on a loaded machine)");
    let a_opts = GuestOpts::new(
        "A",
        vec![
            Nic::vhost_user(&sock("vm-a"), MAC_A),
            Nic::tap(TAP, MAC_A_TAP),
            Nic::e1000(TAP_E1000, MAC_A_E1000),
        ],
    )
    .ip(&format!("{IP_A}/24"))
    .netns(ns.name())
    .vhost_ring(o.vhost_ring)
    .limit(Duration::from_secs(1800));
    let b_opts = GuestOpts::new("B", vec![Nic::vhost_user(&sock("vm-b"), MAC_B)])
        .ip(&format!("{IP_B}/24"))
        .vhost_ring(o.vhost_ring)
        .limit(Duration::from_secs(1800));
    // Both start before either is waited for: they boot side by side.
    let mut a = Guest::start(&a_opts).map_err(err("A"))?;
    let mut b = Guest::start(&b_opts).map_err(err("B"))?;
    a.wait_ready(lab::guest::BOOT).map_err(err("A"))?;
    b.wait_ready(lab::guest::BOOT).map_err(err("B"))?;
    let boot_s = t0.elapsed().as_secs_f64();
    say(&format!("guests up after {boot_s:.0} s"));
    for t in [TAP, TAP_E1000] {
        ns.ip(&["link", "set", "dev", t, "up"])?;
    }
    let a_vhost = a.iface(MAC_A).map_err(err("A"))?;
    let a_tap = a.iface(MAC_A_TAP).map_err(err("A"))?;
    let a_e1000 = a.iface(MAC_A_E1000).map_err(err("A"))?;
    let b_vhost = b.iface(MAC_B).map_err(err("B"))?;
    for i in [&a_tap, &a_e1000] {
        a.ok(&format!("ip link set {i} up"), Duration::from_secs(30))
            .map_err(err("A"))?;
    }
    let mut bench = Bench {
        o,
        sw: running,
        a,
        b,
        a_vhost,
        a_tap,
        a_e1000,
        b_vhost,
        idx_a,
        idx_b,
        idx_sink,
        frames: if o.quick { 20_000 } else { 100_000 },
        loads: vec![load_before],
    };
    let mut schemes = BTreeMap::new();
    for s in &SCHEMES {
        let bursts = Bursts {
            burst1: bench.vhost_row(s, 1)?,
            burst32: bench.vhost_row(s, 32)?,
        };
        schemes.insert(s.key.to_string(), bursts);
    }
    let tap1 = bench.tap_row(1)?;
    let tap32 = bench.tap_row(32)?;
    let e1000 = bench.e1000_rows()?;
    let g2g = bench.guest_to_guest()?;
    let csb = &schemes["csb"];
    let (csb1, csb32) = (csb.burst1.clone(), csb.burst32.clone());
    let ratio1 = ratios(&csb1.guest_tx_pps, &tap1.guest_tx_pps);
    let ratio32 = ratios(&csb32.guest_tx_pps, &tap32.guest_tx_pps);
    let loads = bench.loads.clone();
    drop(bench);
    drop(ns);
    let tcp = crate::vm_tcp::run(o, &dir)?;
    let upgrade = Some(crate::vm_upgrade::run(o, &dir)?);
    let multiqueue = Some(crate::vm_mq::run(o, &dir)?);
    let testpmd = crate::vm_testpmd::part(o);
    let load_max = loads.iter().copied().fold(f64::NAN, f64::max);
    Ok(Vm {
        vhost_user: VhostUser {
            guest_tx_pps: csb32.guest_tx_pps,
            guest_tx_pps_is: "CSB, pktgen with 32 frames per doorbell (xmit_more), to a sink port"
                .into(),
            guest_tx_pps_burst1: csb1.guest_tx_pps,
            notifications_per_packet: csb32.notifications_per_packet,
            notifications_row: "csb, burst 32 (saturation, event-index windows)".into(),
            schemes,
            limit: LIMIT_TCG.into(),
        },
        qemu_tap: QemuTap {
            guest_tx_pps: tap32.guest_tx_pps.clone(),
            guest_tx_pps_is:
                "the same guest's pktgen, 32 frames per doorbell, over QEMU's TAP backend".into(),
            burst1: tap1,
            burst32: tap32,
            limit: LIMIT_TAP.into(),
        },
        ratio_vhost_user_over_tap: ratio32,
        ratio_vhost_user_over_tap_burst1: ratio1,
        ratio_paper_vale_over_tap_pktgen: 7400.0 / 720.0,
        guest_to_sink: GuestToSink {
            pps: g2g.sink.clone(),
            limit: LIMIT_TCG.into(),
        },
        guest_to_guest: g2g,
        e1000,
        upgrade,
        multiqueue,
        testpmd,
        goals: Goals {
            ratio_vhost_user_over_tap_at_least: 2.0,
            notifications_per_packet_at_most: 0.05,
            guest_to_guest_over_sink_at_least: 0.5,
        },
        machine: Machine {
            accel: "tcg".into(),
            guest: "Debian 6.1 kernel, busybox initramfs, 1 vCPU, 256 MiB".into(),
            boot_s,
            load_avg_1min: stats(&loads),
            load_avg_max: load_max,
            frames_per_run: if o.quick { 20_000 } else { 100_000 },
            repeats: o.repeats,
            switch_poll_us: o.poll_us,
            seconds: t0.elapsed().as_secs_f64(),
        },
        tcp,
    })
}

struct RemoveDir(PathBuf);

impl Drop for RemoveDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The keys `--part vm --format json` promises (checked by the CLI test).
pub const KEYS: [&str; 11] = [
    "vm.vhost_user.guest_tx_pps",
    "vm.qemu_tap.guest_tx_pps",
    "vm.ratio_vhost_user_over_tap",
    "vm.vhost_user.notifications_per_packet",
    "vm.guest_to_guest.pps",
    "vm.guest_to_guest.rtt_us_p50",
    "vm.guest_to_sink.pps",
    "vm.upgrade.ping_gap_ms",
    "vm.testpmd.burst1.ratio",
    "vm.testpmd.burst32.ratio",
    "vm.multiqueue.ratio",
];

/// The value at a dotted key (`vm.guest_to_guest.pps`).
pub fn at<'a>(doc: &'a Value, key: &str) -> Option<&'a Value> {
    key.split('.').try_fold(doc, |v, k| v.get(k))
}

/// A switch for the VM benches: a vhost-user port per `(name, MAC)` of
/// `ports`, its socket at [`vm_sock`]`(dir, prefix, name)`, polling for
/// `poll_us`; not yet running.
pub(crate) fn vm_switch(
    dir: &std::path::Path,
    prefix: &str,
    poll_us: u64,
    ports: &[(&str, &str)],
) -> Result<Switch, VmError> {
    let vhost_user = ports
        .iter()
        .map(|(n, mac)| {
            VhostUserEntry::parse(&format!(
                "{},name={n},mac={mac}",
                vm_sock(dir, prefix, n).display()
            ))
            .and_then(|e| e.config())
            .expect("the bench's own vhost-user settings are valid")
        })
        .collect();
    Switch::new(Config {
        socket: None,
        poll_us,
        log_ports: false,
        vhost_user,
        ..Config::default()
    })
    .map_err(VmError::Switch)
}

/// Where [`vm_switch`] puts port `name`'s socket.
pub(crate) fn vm_sock(dir: &std::path::Path, prefix: &str, name: &str) -> std::path::PathBuf {
    dir.join(format!("{prefix}{name}.sock"))
}
