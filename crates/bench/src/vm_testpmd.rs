//! The vm part's rows beside DPDK: one QEMU guest (TCG) with two
//! virtio-net NICs, one on the switch's vhost-user port (frames to a sink
//! port inside the switch), one on DPDK testpmd's vhost PMD
//! (`net_vhost0,iface=SOCK`: testpmd is the vhost-user server, QEMU the
//! client; `--forward-mode=rxonly`: it counts and frees what it takes).
//! The guest's pktgen sends 60-byte frames, burst 1 and burst 32, on each
//! NIC in turn in every repeat (200,000 frames a run at burst 1,
//! 1,000,000 at burst 32: a second or more of sending; a tenth or a fifth
//! of that with `--quick`); the ratio is the switch's rate over testpmd's,
//! paired per repeat.
//!
//! Placement, the same for both: QEMU's threads on CPU 0, the backend on
//! CPU 1 (the switch's thread pinned there; testpmd's forwarding lcore is
//! CPU 1, its main lcore CPU 0, where it sleeps between its once-a-second
//! reports). testpmd polls without pause while it runs, so it is stopped
//! (SIGSTOP) during the switch's runs and resumed (SIGCONT) for its own;
//! the switch sleeps when its port is idle.
//!
//! Per row: packets per second as pktgen reports them, the guest's kicks
//! per packet on the switch's port (testpmd's vhost PMD never asks for
//! kicks, so its guest makes none), backend CPU per packet (the switch's
//! thread, testpmd's whole process: the time each spent on the CPU over
//! the frames it took), and the switch's adaptive polling window.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lab::guest::{Guest, GuestOpts, Nic};
use serde::{Deserialize, Serialize};
use vswitch::{Config, EventLoop, PortDetail, Switch, VhostUserEntry};

use crate::switch_ports::SinkPort;
use crate::vm::{stats, Stats, VmOptions};

/// Why the testpmd rows could not be measured.
#[derive(Debug, thiserror::Error)]
pub enum TestpmdError {
    /// DPDK is not installed.
    #[error("dpdk-testpmd not found (scripts/setup.sh installs dpdk-dev)")]
    NoTestpmd,
    /// QEMU or the guest image is missing.
    #[error("QEMU 10 and the guest image are needed (scripts/setup.sh installs both)")]
    NoGuest,
    /// A file or process could not be made.
    #[error("{what}")]
    Io {
        /// What was being done.
        what: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// testpmd did not come up (or went away); its log's last lines.
    #[error("testpmd {what}; its log ends:\n{tail}")]
    Testpmd {
        /// What it did not do.
        what: String,
        /// Its last lines.
        tail: String,
    },
    /// The switch could not start.
    #[error("starting the switch")]
    Switch(#[source] vswitch::Error),
    /// The switch did not answer a status request.
    #[error("the switch's status")]
    Status(#[source] vswitch::StatusError),
    /// The guest failed; testpmd's log's last lines beside it.
    #[error("the guest (testpmd's log ends:\n{tail})")]
    Guest {
        /// Why.
        #[source]
        source: lab::guest::GuestError,
        /// testpmd's last lines.
        tail: String,
    },
    /// Interrupted (SIGINT or SIGTERM).
    #[error("interrupted")]
    Interrupted,
}

const MAC_SW: &str = "52:54:00:fa:0c:01";
const MAC_PMD: &str = "52:54:00:fa:0c:02";
const MAC_SINK: [u8; 6] = [0x02, 0xfa, 0x5e, 0x00, 0x00, 0x02];
const MAC_SINK_TEXT: &str = "02:fa:5e:00:00:02";
const IP_SINK: &str = "10.78.1.9";
/// Where QEMU runs, and where each backend runs.
const GUEST_CPU: usize = 0;
const BACKEND_CPU: usize = 1;

const LIMIT: &str = "TCG: the guest's emulated CPU is the sender and usually the bound; both backends run on CPU 1 with the guest on CPU 0. testpmd polls its ring without pause (its guest never kicks); the switch polls while its port's adaptive window says frames are coming, so its guest kicks only when it sleeps";

/// One burst's row: the switch and testpmd on the same guest.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TestpmdRow {
    /// Frames per doorbell.
    pub burst: u32,
    /// The guest's pktgen into the switch, packets per second.
    pub switch_pps: Stats,
    /// The same guest's pktgen into testpmd's vhost PMD.
    pub testpmd_pps: Stats,
    /// `switch_pps` over `testpmd_pps`, paired per repeat.
    pub ratio: Stats,
    /// The guest's kicks per packet on the switch's port.
    pub kicks_per_packet: Stats,
    /// Interrupts (calls) per packet the switch raised on the transmit queue.
    pub interrupts_per_packet: Stats,
    /// The switch thread's CPU time per frame it took, nanoseconds.
    pub switch_cpu_ns_per_packet: Stats,
    /// testpmd's CPU time (the whole process) per frame it received,
    /// nanoseconds.
    pub testpmd_cpu_ns_per_packet: Stats,
    /// Interrupts the guest took on its switch NIC per packet sent
    /// (`/proc/interrupts`, every queue's line).
    pub guest_irq_per_packet_switch: Stats,
    /// The same on its testpmd NIC.
    pub guest_irq_per_packet_testpmd: Stats,
    /// Frames testpmd counted per frame pktgen sent to it.
    pub testpmd_received_share: Stats,
    /// The switch port's learned polling window at the end of each run, µs.
    pub window_us: Stats,
}

/// Where the threads ran.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Placement {
    /// QEMU's threads.
    pub guest_cpu: usize,
    /// The switch's thread.
    pub switch_cpu: usize,
    /// testpmd's forwarding lcore (its main lcore, which sleeps, is
    /// `guest_cpu`).
    pub testpmd_cpu: usize,
    /// Whether pinning succeeded for each (guest, switch).
    pub pinned: [bool; 2],
}

/// The testpmd rows.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct VmTestpmd {
    /// One frame per doorbell.
    pub burst1: TestpmdRow,
    /// 32 frames per doorbell.
    pub burst32: TestpmdRow,
    /// Where the threads ran.
    pub placement: Placement,
    /// testpmd's command line.
    pub testpmd_command: String,
    /// The switch's polling settings: poll_us, poll_max_us, poll_budget_pct.
    pub switch_polling: [u64; 3],
    /// What bounds the rows.
    pub limit: String,
}

/// The testpmd rows: measured, or why not.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TestpmdPart {
    /// The figures.
    Measured(Box<VmTestpmd>),
    /// Not measured.
    Skipped {
        /// Why.
        skipped: String,
    },
}

impl Default for TestpmdPart {
    fn default() -> Self {
        TestpmdPart::Skipped {
            skipped: "not measured".into(),
        }
    }
}

impl TestpmdPart {
    /// A few lines for the text report.
    pub fn to_text(&self) -> String {
        let t = match self {
            TestpmdPart::Skipped { skipped } => {
                return format!("testpmd rows: skipped: {skipped}\n")
            }
            TestpmdPart::Measured(t) => t,
        };
        let m = |s: &Stats, k: f64, d: usize| {
            let f = |x: Option<f64>| x.map_or("-".into(), |x| format!("{:.*}", d, x * k));
            format!("{} / {} / {}", f(s.min), f(s.median), f(s.max))
        };
        let mut out = String::from(
            "guest transmit, switch vs DPDK testpmd's vhost PMD (min / median / max):\n",
        );
        for r in [&t.burst1, &t.burst32] {
            out += &format!(
                "  burst {}: switch {} Kpps, testpmd {} Kpps, ratio {}; kicks/pkt {}; guest irq/pkt switch {} testpmd {}; CPU ns/pkt switch {} testpmd {}; window {} us\n",
                r.burst,
                m(&r.switch_pps, 1e-3, 1),
                m(&r.testpmd_pps, 1e-3, 1),
                m(&r.ratio, 1.0, 2),
                m(&r.kicks_per_packet, 1.0, 4),
                m(&r.guest_irq_per_packet_switch, 1.0, 3),
                m(&r.guest_irq_per_packet_testpmd, 1.0, 3),
                m(&r.switch_cpu_ns_per_packet, 1.0, 0),
                m(&r.testpmd_cpu_ns_per_packet, 1.0, 0),
                m(&r.window_us, 1.0, 0),
            );
        }
        out
    }
}

/// Nanoseconds on a CPU of one thread (`/proc/PID/task/TID/schedstat`).
fn thread_ns(pid: u32, tid: i32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/schedstat"))
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

/// Nanoseconds on a CPU of every thread of a process.
fn process_ns(pid: u32) -> f64 {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return f64::NAN;
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .map(|tid| thread_ns(pid, tid))
        .sum()
}

/// testpmd with one vhost port, killed (by PID) when dropped.
struct Testpmd {
    child: Child,
    log: PathBuf,
    prefix: String,
    command: String,
}

impl Testpmd {
    fn start(sock: &Path, dir: &Path) -> Result<Testpmd, TestpmdError> {
        let bin = crate::peers::testpmd_path().ok_or(TestpmdError::NoTestpmd)?;
        let pid = std::process::id();
        let log = dir.join("testpmd.log");
        let prefix = format!("fp-vmtp-{pid}");
        let io = |what: &str| {
            let what = what.to_string();
            move |source| TestpmdError::Io { what, source }
        };
        let out = std::fs::File::create(&log).map_err(io("creating testpmd's log"))?;
        let err = out.try_clone().map_err(io("creating testpmd's log"))?;
        let args: Vec<String> = vec![
            "-l".into(),
            "0-1".into(),
            "--main-lcore".into(),
            GUEST_CPU.to_string(),
            "--no-huge".into(),
            "-m".into(),
            "512".into(),
            "--no-pci".into(),
            "--log-level=lib.eal:error".into(),
            format!("--file-prefix={prefix}"),
            format!("--vdev=net_vhost0,iface={},queues=1", sock.display()),
            "--".into(),
            "--forward-mode=rxonly".into(),
            "--auto-start".into(),
            "--stats-period=1".into(),
            "--total-num-mbufs=16384".into(),
        ];
        let command = format!("{} {}", bin.display(), args.join(" "));
        let mut cmd = Command::new("stdbuf");
        cmd.arg("-oL")
            .arg(&bin)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        // Its own process group, so that stopping it stops nothing else.
        cmd.process_group(0);
        let child = cmd.spawn().map_err(io("starting dpdk-testpmd"))?;
        let t = Testpmd {
            child,
            log,
            prefix,
            command,
        };
        // The socket appears once the vhost PMD listens.
        let end = Instant::now() + Duration::from_secs(30);
        while !sock.exists() {
            if Instant::now() >= end || !crate::proc::alive(t.pid()) {
                return Err(TestpmdError::Testpmd {
                    what: format!(
                        "did not create its vhost-user socket {} within 30 s",
                        sock.display()
                    ),
                    tail: t.tail(),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(t)
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn signal(&self, sig: libc::c_int) {
        // SAFETY: kill(2) on our own child, not yet reaped.
        unsafe { libc::kill(self.pid() as i32, sig) };
    }

    fn text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn tail(&self) -> String {
        let t = self.text();
        let l: Vec<&str> = t.lines().rev().take(10).collect();
        l.into_iter().rev().collect::<Vec<_>>().join("\n")
    }

    /// The port's received total in testpmd's last report.
    fn rx_packets(&self) -> Option<u64> {
        let t = self.text();
        let i = t.rfind("RX-packets:")?;
        t[i + "RX-packets:".len()..]
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    }
}

impl Drop for Testpmd {
    fn drop(&mut self) {
        self.signal(libc::SIGCONT);
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(format!("/var/run/dpdk/{}", self.prefix));
    }
}

/// The switch on a thread of its own, pinned, its thread id known.
struct SwitchThread {
    stop: Arc<AtomicBool>,
    tid: Arc<AtomicI32>,
    pinned: Arc<AtomicBool>,
    h: Option<std::thread::JoinHandle<()>>,
}

impl SwitchThread {
    fn start(el: EventLoop) -> SwitchThread {
        let stop = Arc::new(AtomicBool::new(false));
        let tid = Arc::new(AtomicI32::new(0));
        let pinned = Arc::new(AtomicBool::new(false));
        let (s, t, p) = (stop.clone(), tid.clone(), pinned.clone());
        let h = std::thread::Builder::new()
            .name("switch".into())
            .spawn(move || {
                let mut el = el;
                // SAFETY: gettid has no memory effects.
                t.store(unsafe { libc::gettid() }, Ordering::Relaxed);
                p.store(crate::cpus::pin_tid(0, BACKEND_CPU), Ordering::Relaxed);
                el.run(&s, None);
            })
            .expect("spawn the switch thread");
        while tid.load(Ordering::Relaxed) == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        SwitchThread {
            stop,
            tid,
            pinned,
            h: Some(h),
        }
    }

    fn cpu_ns(&self) -> f64 {
        thread_ns(std::process::id(), self.tid.load(Ordering::Relaxed))
    }
}

impl Drop for SwitchThread {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.h.take() {
            let _ = h.join();
        }
    }
}

/// What the switch counted on the guest's port.
#[derive(Clone, Copy, Default)]
struct Count {
    from_port: u64,
    kicks: u64,
    calls: u64,
    window_us: u64,
}

fn count(ctl: &Path) -> Result<Count, TestpmdError> {
    let s = vswitch::status::ask(ctl).map_err(TestpmdError::Status)?;
    let mut c = Count::default();
    if let Some(p) = s.ports.iter().find(|p| p.name == "vm-t") {
        c.from_port = p.from_port;
        c.window_us = p.polling.as_ref().map_or(0, |w| w.window_us);
        if let PortDetail::Vhost(d) = &p.detail {
            c.kicks = d.queues.tx.kicks;
            c.calls = d.queues.tx.calls;
        }
    }
    Ok(c)
}

fn vswitch_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(x) = src {
        s += &format!(": {x}");
        src = x.source();
    }
    s
}

/// Boot the guest with both NICs, measure each burst on each backend in
/// every repeat, tear everything down.
pub fn run(o: &VmOptions) -> Result<VmTestpmd, TestpmdError> {
    if crate::peers::testpmd_path().is_none() {
        return Err(TestpmdError::NoTestpmd);
    }
    if !lab::guest::available() {
        return Err(TestpmdError::NoGuest);
    }
    let say = |s: &str| {
        if let Some(p) = &o.progress {
            p(s);
        }
    };
    let pid = std::process::id();
    let dir = std::env::temp_dir().join(format!("fastpath-vm-testpmd-{pid}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|source| TestpmdError::Io {
        what: format!("creating {}", dir.display()),
        source,
    })?;
    let _cleanup = RemoveDir(dir.clone());
    let sw_sock = dir.join("vm-t.sock");
    let pmd_sock = dir.join("pmd.sock");
    let ctl = dir.join("ctl.sock");
    let cfg = Config {
        socket: Some(ctl.clone()),
        poll_us: o.poll_us,
        log_ports: false,
        vhost_user: vec![VhostUserEntry::parse(&format!(
            "{},name=vm-t,mac={MAC_SW}",
            sw_sock.display()
        ))
        .and_then(|e| e.config())
        .expect("the bench's own vhost-user settings are valid")],
        ..Config::default()
    };
    let polling = [cfg.poll_us, cfg.poll_max_us, u64::from(cfg.poll_budget_pct)];
    let mut sw = Switch::new(cfg).map_err(TestpmdError::Switch)?;
    sw.add_port(Box::new(SinkPort::with_mac("sink", MAC_SINK)))
        .map_err(TestpmdError::Switch)?;
    let el = EventLoop::new(sw).map_err(TestpmdError::Switch)?;
    let swt = SwitchThread::start(el);
    let pmd = Testpmd::start(&pmd_sock, &dir)?;
    say("booting a guest with NICs on the switch and on testpmd (TCG: 10-60 s)");
    let opts = GuestOpts::new(
        "T",
        vec![
            Nic::vhost_user(&sw_sock, MAC_SW),
            Nic::vhost_user(&pmd_sock, MAC_PMD),
        ],
    )
    .ip("10.78.1.1/24")
    .vhost_ring(o.vhost_ring)
    .limit(Duration::from_secs(1800));
    let guest_err = |source| TestpmdError::Guest {
        source,
        tail: pmd.tail(),
    };
    let mut g = Guest::start(&opts).map_err(guest_err)?;
    g.wait_ready(lab::guest::BOOT).map_err(guest_err)?;
    let guest_pinned = crate::cpus::pin_whole_process(g.pid(), GUEST_CPU);
    let if_sw = g.iface(MAC_SW).map_err(guest_err)?;
    let if_pmd = g.iface(MAC_PMD).map_err(guest_err)?;
    g.ok(&format!("ip link set {if_pmd} up"), Duration::from_secs(30))
        .map_err(guest_err)?;
    g.wait_carrier(&if_pmd, Duration::from_secs(10))
        .map_err(guest_err)?;
    let irq_sw = g.irq_name(&if_sw).map_err(guest_err)?;
    let irq_pmd = g.irq_name(&if_pmd).map_err(guest_err)?;
    let mut rows = Vec::new();
    for burst in [1u32, 32] {
        // About a second of sending or more per run: at burst 32 the guest
        // sends 0.5-0.8 M frames a second, so a run of 100,000 frames lasted
        // 0.1-0.2 s and one of 20,000 (`--quick`) 30 ms, where one late
        // timeslice decides a ratio (`--quick`: 0.93-2.18 in one set).
        let frames: u64 = match (o.quick, burst) {
            (true, 1) => 20_000,
            (true, _) => 100_000,
            (false, 1) => 200_000,
            (false, _) => 1_000_000,
        };
        let within = Duration::from_secs(60 + frames / 2000);
        let mut s = Samples::default();
        for r in 0..o.repeats {
            if o.stop.load(Ordering::Relaxed) {
                return Err(TestpmdError::Interrupted);
            }
            // The switch, testpmd stopped.
            pmd.signal(libc::SIGSTOP);
            let c0 = count(&ctl)?;
            let i0 = g.interrupts(&irq_sw).map_err(guest_err)?;
            let cpu0 = swt.cpu_ns();
            let p = g
                .pktgen(&if_sw, frames, 60, burst, MAC_SINK_TEXT, IP_SINK, within)
                .map_err(guest_err)?;
            std::thread::sleep(Duration::from_millis(100));
            let cpu1 = swt.cpu_ns();
            let c1 = count(&ctl)?;
            let i1 = g.interrupts(&irq_sw).map_err(guest_err)?;
            s.sw_irq.push((i1 - i0) as f64 / p.sent.max(1) as f64);
            let taken = (c1.from_port - c0.from_port).max(1) as f64;
            s.sw.push(p.pps as f64);
            s.kpp.push((c1.kicks - c0.kicks) as f64 / taken);
            s.ipp.push((c1.calls - c0.calls) as f64 / taken);
            s.sw_cpu.push((cpu1 - cpu0) / taken);
            s.window.push(c1.window_us as f64);
            // testpmd, on the same guest.
            pmd.signal(libc::SIGCONT);
            std::thread::sleep(Duration::from_millis(1500));
            let rx0 = pmd.rx_packets();
            let j0 = g.interrupts(&irq_pmd).map_err(guest_err)?;
            let t0 = process_ns(pmd.pid());
            let q = g
                .pktgen(&if_pmd, frames, 60, burst, MAC_SINK_TEXT, IP_SINK, within)
                .map_err(guest_err)?;
            let t1 = process_ns(pmd.pid());
            let j1 = g.interrupts(&irq_pmd).map_err(guest_err)?;
            s.pmd_irq.push((j1 - j0) as f64 / q.sent.max(1) as f64);
            // Its next once-a-second report holds the run.
            std::thread::sleep(Duration::from_millis(1500));
            let rx1 = pmd.rx_packets();
            let got = match (rx0, rx1) {
                (Some(a), Some(b)) => b.saturating_sub(a) as f64,
                _ => f64::NAN,
            };
            s.pmd.push(q.pps as f64);
            s.pmd_cpu.push((t1 - t0) / got.max(1.0));
            s.pmd_share.push(got / q.sent.max(1) as f64);
            s.ratio.push(p.pps as f64 / (q.pps as f64).max(1.0));
            say(&format!(
                "testpmd rows burst {burst} [{}/{}]: switch {} pps ({:.4} kicks/pkt, guest irq/pkt {:.3} switch {:.3} testpmd, {:.0} ns CPU/pkt, window {} us), testpmd {} pps ({:.0} ns CPU/pkt, took {got:.0} of {}), ratio {:.2}",
                r + 1,
                o.repeats,
                p.pps,
                s.kpp.last().copied().unwrap_or(f64::NAN),
                s.sw_irq.last().copied().unwrap_or(f64::NAN),
                s.pmd_irq.last().copied().unwrap_or(f64::NAN),
                s.sw_cpu.last().copied().unwrap_or(f64::NAN),
                c1.window_us,
                q.pps,
                s.pmd_cpu.last().copied().unwrap_or(f64::NAN),
                q.sent,
                s.ratio.last().copied().unwrap_or(f64::NAN),
            ));
        }
        rows.push(TestpmdRow {
            burst,
            switch_pps: stats(&s.sw),
            testpmd_pps: stats(&s.pmd),
            ratio: stats(&s.ratio),
            kicks_per_packet: stats(&s.kpp),
            interrupts_per_packet: stats(&s.ipp),
            switch_cpu_ns_per_packet: stats(&s.sw_cpu),
            testpmd_cpu_ns_per_packet: stats(&s.pmd_cpu),
            testpmd_received_share: stats(&s.pmd_share),
            guest_irq_per_packet_switch: stats(&s.sw_irq),
            guest_irq_per_packet_testpmd: stats(&s.pmd_irq),
            window_us: stats(&s.window),
        });
    }
    let pinned = [guest_pinned, swt.pinned.load(Ordering::Relaxed)];
    drop(g);
    let command = pmd.command.clone();
    drop(pmd);
    drop(swt);
    let [burst1, burst32]: [TestpmdRow; 2] = rows.try_into().expect("two bursts");
    Ok(VmTestpmd {
        burst1,
        burst32,
        placement: Placement {
            guest_cpu: GUEST_CPU,
            switch_cpu: BACKEND_CPU,
            testpmd_cpu: BACKEND_CPU,
            pinned,
        },
        testpmd_command: command,
        switch_polling: polling,
        limit: LIMIT.into(),
    })
}

#[derive(Default)]
struct Samples {
    sw: Vec<f64>,
    pmd: Vec<f64>,
    ratio: Vec<f64>,
    kpp: Vec<f64>,
    ipp: Vec<f64>,
    sw_cpu: Vec<f64>,
    pmd_cpu: Vec<f64>,
    pmd_share: Vec<f64>,
    window: Vec<f64>,
    sw_irq: Vec<f64>,
    pmd_irq: Vec<f64>,
}

struct RemoveDir(PathBuf);

impl Drop for RemoveDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The part for the report: measured, or the error that stopped it.
pub fn part(o: &VmOptions) -> TestpmdPart {
    match run(o) {
        Ok(t) => TestpmdPart::Measured(Box::new(t)),
        Err(e) => TestpmdPart::Skipped {
            skipped: vswitch_chain(&e),
        },
    }
}
