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

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lab::guest::{Guest, GuestError, GuestOpts, Nic};
use lab::netns::Netns;
use ring::Mode;
use serde_json::{json, Value};
use vswitch::ports::vhost::datapath::TXQ;
use vswitch::{Config, SinkPort, Switch, VhostPort, VhostUserEntry};

use crate::switch::Progress;

/// Guest A's vhost-user NIC, its TAP-backend NIC, its e1000; guest B's NIC;
/// the sink's address.
const MAC_A: &str = "52:54:00:fa:0a:01";
const MAC_A_TAP: &str = "52:54:00:fa:0a:02";
const MAC_A_E1000: &str = "52:54:00:fa:0a:03";
const MAC_B: &str = "52:54:00:fa:0b:01";
const MAC_SINK: [u8; 6] = [0x02, 0xfa, 0x5e, 0x00, 0x00, 0x01];
const MAC_SINK_TEXT: &str = "02:fa:5e:00:00:01";
/// A destination nobody owns behind QEMU's TAPs (the namespace's kernel
/// counts and drops the frames).
const MAC_NOBODY: &str = "02:fa:5e:00:00:fe";
const IP_A: &str = "10.78.0.1";
const IP_B: &str = "10.78.0.2";
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
const LIMIT_G2G: &str = "three CPUs' worth of work (guest A, guest B, the switch) on two shared cores: the receiving guest's emulated receive path, not the switch's one copy, is usually the bound";
const LIMIT_RTT: &str = "busybox ping through both guests' kernels under TCG: emulation dominates, not the switch; the paper's 7.2 KTps (VALE, CSB) is about 140 us per transaction under KVM";

fn err(guest: &'static str) -> impl FnOnce(GuestError) -> VmError {
    move |source| VmError::Guest { guest, source }
}

fn loadavg() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

/// min, median, max (and the samples) of a figure.
pub fn stats(samples: &[f64]) -> Value {
    let mut v: Vec<f64> = samples.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return json!({"min": null, "median": null, "max": null, "samples": samples});
    }
    v.sort_by(f64::total_cmp);
    let med = measure::median(&mut v.clone());
    json!({"min": v[0], "median": med, "max": v[v.len() - 1], "samples": samples})
}

/// The switch, running on its own thread between measurements; taken back
/// to change a port's scheme or read its counters.
struct Running {
    sw: Option<Switch>,
    run: Option<(Arc<AtomicBool>, std::thread::JoinHandle<Switch>)>,
}

impl Running {
    fn start(&mut self) {
        if let Some(sw) = self.sw.take() {
            self.run = Some(vswitch::spawn(sw).expect("a switch that binds no socket starts"));
        }
    }

    fn stop(&mut self) -> &mut Switch {
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

struct Bench<'a> {
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

impl Bench<'_> {
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
    fn vhost_row(&mut self, s: &Scheme, burst: u32) -> Result<Value, VmError> {
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
            let load = loadavg();
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
        Ok(json!({
            "label": s.label,
            "mode": s.mode.to_string(),
            "itr": s.itr,
            "burst": burst,
            "guest_tx_pps": stats(&pps),
            "kicks_per_packet": stats(&kpp),
            "interrupts_per_packet": stats(&ipp),
            "notifications_per_packet": stats(&npp),
            "paper_vale_guest_guest_udp_kpps": s.paper_kpps,
            "limit": LIMIT_TCG,
        }))
    }

    /// Guest A's pktgen over QEMU's TAP backend.
    fn tap_row(&mut self, burst: u32) -> Result<Value, VmError> {
        let irq = self.a.irq_name(&self.a_tap.clone()).map_err(err("A"))?;
        let mut pps = Vec::new();
        let mut ipp = Vec::new();
        for r in 0..self.o.repeats {
            self.check()?;
            let i0 = self.a.interrupts(&irq).map_err(err("A"))?;
            let load = loadavg();
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
        Ok(json!({
            "burst": burst,
            "guest_tx_pps": stats(&pps),
            "interrupts_per_packet": stats(&ipp),
            "paper_tap_guest_host_pktgen_kpps": 720.0,
            "limit": LIMIT_TAP,
        }))
    }

    /// The e1000 with the driver's throttling off, then at 2,000 interrupts
    /// a second.
    fn e1000_rows(&mut self) -> Result<Value, VmError> {
        let mut out = serde_json::Map::new();
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
                    let load = loadavg();
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
                out.insert(
                    format!("{key}_burst{burst}"),
                    json!({
                        "interrupt_throttle_rate": itr,
                        "burst": burst,
                        "guest_tx_pps": stats(&pps),
                        "interrupts_per_packet": stats(&ipp),
                        "paper_tap_e1000_udp_kpps": if itr == 0 { json!(30.0) } else { json!(82.0) },
                        "limit": LIMIT_E1000,
                    }),
                );
            }
        }
        // Whether the throttling did anything: interrupts per packet with it
        // over without it, per burst (medians).
        for b in [1, 32] {
            let irq = |k: &str| out[k]["interrupts_per_packet"]["median"].as_f64();
            let on = irq(&format!("moderation_on_burst{b}"));
            let off = irq(&format!("moderation_off_burst{b}"));
            let r = match (on, off) {
                (Some(on), Some(off)) if off > 0.0 => json!(on / off),
                _ => Value::Null,
            };
            out.insert(
                format!("throttled_over_unthrottled_irq_per_packet_burst{b}"),
                r,
            );
        }
        Ok(Value::Object(out))
    }

    /// Guest A to the sink, then to guest B, in each repeat (CSB, burst
    /// 32); then ping between the guests.
    fn guest_to_guest(&mut self) -> Result<Value, VmError> {
        let sw = self.sw.stop();
        for i in [self.idx_a, self.idx_b] {
            if let Some(v) = sw.port_as::<VhostPort>(i) {
                v.set_notify(Mode::Csb, 0);
            }
        }
        self.sw.start();
        let mut sink = Vec::new();
        let mut g2g = Vec::new();
        let mut received = Vec::new();
        let mut ratio = Vec::new();
        let mut rx_ratio = Vec::new();
        let mut dropped = Vec::new();
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
            let b0 = count(self.sw.stop(), self.idx_b);
            let a0 = count(self.sw.stop(), self.idx_a);
            self.sw.start();
            let load = loadavg();
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
            self.loads.push(load);
            self.say(&format!(
                "guest to guest [{}/{}]: A to the sink {to_sink:.0} pps; A to B {tx:.0} pps through the switch ({:.2} of the sink's), B received {got:.0} pps ({:.2}), {} dropped at B's full ring (load {load:.1})",
                r + 1,
                self.o.repeats,
                tx / to_sink.max(1.0),
                got / to_sink.max(1.0),
                b1.dropped - b0.dropped
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
        Ok(json!({
            "sink": stats(&sink),
            "pps": stats(&g2g),
            "pps_is": "guest A's pktgen to guest B through the switch (CSB, burst 32): frames the switch took from A and copied into B's ring or dropped at it when full (counted), per second of A's run; the paper's TX side",
            "rx_pps": stats(&received),
            "rx_pps_is": "frames guest B's kernel received per second of A's run (the paper's RX side)",
            "dropped_at_full_ring": stats(&dropped),
            "ratio_over_sink": stats(&ratio),
            "rx_ratio_over_sink": stats(&rx_ratio),
            "rtt_us_p50": stats(&rtt),
            "ping_lost": lost,
            "paper_vale_guest_guest_pktgen_kpps": {"tx": 6300.0, "rx": 4700.0},
            "paper_vale_csb_rr_ktps": 7.2,
            "limit": LIMIT_G2G,
            "rtt_limit": LIMIT_RTT,
        }))
    }
}

/// Paired ratio of two sample lists (a[i] / b[i]).
fn ratios(a: &Value, b: &Value) -> Value {
    let xs = |v: &Value| -> Vec<f64> {
        v["samples"]
            .as_array()
            .map(|s| s.iter().map(|x| x.as_f64().unwrap_or(f64::NAN)).collect())
            .unwrap_or_default()
    };
    let (a, b) = (xs(a), xs(b));
    let r: Vec<f64> = a
        .iter()
        .zip(&b)
        .map(|(x, y)| if *y > 0.0 { x / y } else { f64::NAN })
        .collect();
    stats(&r)
}

/// Boot the guests, measure every row, tear everything down.
pub fn run(o: &VmOptions) -> Result<Value, VmError> {
    if !lab::guest::available() {
        return Err(VmError::Unavailable);
    }
    if !lab::netns::available() {
        return Err(VmError::NotRoot);
    }
    let t0 = Instant::now();
    let load_before = loadavg();
    let pid = std::process::id();
    let dir = std::env::temp_dir().join(format!("fastpath-vm-bench-{pid}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|source| VmError::Io {
        what: format!("creating {}", dir.display()),
        source,
    })?;
    let _cleanup = RemoveDir(dir.clone());
    let ns = Netns::new(&format!("fpvmbench{}", pid % 100_000))?;
    let sock = |n: &str| dir.join(format!("{n}.sock"));
    let vhost = |n: &str, mac: &str| {
        VhostUserEntry::parse(&format!("{},name={n},mac={mac}", sock(n).display()))
            .and_then(|e| e.config())
            .expect("the bench's own vhost-user settings are valid")
    };
    let mut sw = Switch::new(Config {
        socket: None,
        poll_us: o.poll_us,
        log_ports: false,
        vhost_user: vec![vhost("vm-a", MAC_A), vhost("vm-b", MAC_B)],
        ..Config::default()
    })
    .map_err(VmError::Switch)?;
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
    .limit(Duration::from_secs(1800));
    let b_opts = GuestOpts::new("B", vec![Nic::vhost_user(&sock("vm-b"), MAC_B)])
        .ip(&format!("{IP_B}/24"))
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
    let mut schemes = serde_json::Map::new();
    for s in &SCHEMES {
        let mut bursts = serde_json::Map::new();
        for burst in [1u32, 32] {
            bursts.insert(format!("burst{burst}"), bench.vhost_row(s, burst)?);
        }
        schemes.insert(s.key.to_string(), Value::Object(bursts));
    }
    let tap1 = bench.tap_row(1)?;
    let tap32 = bench.tap_row(32)?;
    let e1000 = bench.e1000_rows()?;
    let g2g = bench.guest_to_guest()?;
    let csb1 = schemes["csb"]["burst1"].clone();
    let csb32 = schemes["csb"]["burst32"].clone();
    let ratio1 = ratios(&csb1["guest_tx_pps"], &tap1["guest_tx_pps"]);
    let ratio32 = ratios(&csb32["guest_tx_pps"], &tap32["guest_tx_pps"]);
    let loads = bench.loads.clone();
    drop(bench);
    drop(ns);
    let load_max = loads.iter().copied().fold(f64::NAN, f64::max);
    Ok(json!({
        "vm": {
            "vhost_user": {
                "guest_tx_pps": csb32["guest_tx_pps"],
                "guest_tx_pps_is": "CSB, pktgen with 32 frames per doorbell (xmit_more), to a sink port",
                "guest_tx_pps_burst1": csb1["guest_tx_pps"],
                "notifications_per_packet": csb32["notifications_per_packet"],
                "notifications_row": "csb, burst 32 (saturation, event-index windows)",
                "schemes": schemes,
                "limit": LIMIT_TCG,
            },
            "qemu_tap": {
                "guest_tx_pps": tap32["guest_tx_pps"],
                "guest_tx_pps_is": "the same guest's pktgen, 32 frames per doorbell, over QEMU's TAP backend",
                "burst1": tap1,
                "burst32": tap32,
                "limit": LIMIT_TAP,
            },
            "ratio_vhost_user_over_tap": ratio32,
            "ratio_vhost_user_over_tap_burst1": ratio1,
            "ratio_paper_vale_over_tap_pktgen": 7400.0 / 720.0,
            "guest_to_sink": {
                "pps": g2g["sink"],
                "limit": LIMIT_TCG,
            },
            "guest_to_guest": g2g,
            "e1000": e1000,
            "goals": {
                "ratio_vhost_user_over_tap_at_least": 2.0,
                "notifications_per_packet_at_most": 0.05,
                "guest_to_guest_over_sink_at_least": 0.5,
            },
            "machine": {
                "accel": "tcg",
                "guest": "Debian 6.1 kernel, busybox initramfs, 1 vCPU, 256 MiB",
                "boot_s": boot_s,
                "load_avg_1min": stats(&loads),
                "load_avg_max": load_max,
                "frames_per_run": if o.quick { 20_000 } else { 100_000 },
                "repeats": o.repeats,
                "switch_poll_us": o.poll_us,
                "seconds": t0.elapsed().as_secs_f64(),
            },
        }
    }))
}

struct RemoveDir(PathBuf);

impl Drop for RemoveDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The keys `--part vm --format json` promises (checked by the CLI test).
pub const KEYS: [&str; 7] = [
    "vm.vhost_user.guest_tx_pps",
    "vm.qemu_tap.guest_tx_pps",
    "vm.ratio_vhost_user_over_tap",
    "vm.vhost_user.notifications_per_packet",
    "vm.guest_to_guest.pps",
    "vm.guest_to_guest.rtt_us_p50",
    "vm.guest_to_sink.pps",
];

/// The value at a dotted key (`vm.guest_to_guest.pps`).
pub fn at<'a>(doc: &'a Value, key: &str) -> Option<&'a Value> {
    key.split('.').try_fold(doc, |v, k| v.get(k))
}
