//! TCP between two virtual machines, the vm part's `tcp` and `tcp4` rows:
//! iperf3 between two QEMU guests (TCG) through the switch, beside the same
//! two guests on QEMU's TAP backend over a Linux bridge (the kernel path a
//! VM host uses without a user-space switch) and beside DPDK testpmd
//! forwarding between two vhost-user ports (`--forward-mode=io`: each
//! frame from one port is sent on the other, untouched), in one run.
//!
//! Each guest has three NICs, one per path, each on a subnet of its own,
//! so one boot serves every row and the rows alternate within each
//! repeat: the switch's VM port (in this process), a TAP QEMU opens in a
//! namespace the bench makes (and removes) with a bridge, and a vhost-user
//! port of one testpmd. testpmd runs in interactive mode and forwards
//! only during its own rows (its forwarding lcore busy-polls a CPU while
//! it forwards, and sleeps otherwise); the switch sleeps when idle.
//!
//! Offloads are whatever each backend negotiates, read from the sending
//! guest's `ethtool -k`: QEMU's TAP backend with `vnet_hdr` hands the
//! guests' 64 KB TCP segments to the bridge whole (the fair comparison:
//! what a VM host's kernel path does), testpmd's vhost PMD without its
//! `tso` option does not offer segmentation, and the switch's VM ports
//! offer what the switch offers.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lab::guest::{Guest, GuestOpts, Nic, Offloads};
use lab::netns::Netns;
use serde::{Deserialize, Serialize};
use vswitch::Switch;

use crate::vm::{err, stats, Stats, VmError, VmOptions};

/// Guest A's NICs (switch, TAP, testpmd), then guest B's.
const MACS_A: [&str; 3] = [
    "52:54:00:fc:0a:01",
    "52:54:00:fc:0a:02",
    "52:54:00:fc:0a:03",
];
const MACS_B: [&str; 3] = [
    "52:54:00:fc:0b:01",
    "52:54:00:fc:0b:02",
    "52:54:00:fc:0b:03",
];
/// One subnet per path: 10.79.P.1 is A, 10.79.P.2 is B.
const NETS: [&str; 3] = ["10.79.1", "10.79.2", "10.79.3"];
/// The guests' TAPs and their bridge, in the bench's namespace.
const TAPS: [&str; 2] = ["fpvtt0", "fpvtt1"];
const BRIDGE: &str = "fpvtbr0";
/// `IFF_VNET_HDR` in a TAP's `tun_flags`: QEMU passes a virtio-net header
/// with each frame, so segmentation and checksums are offloaded.
const IFF_VNET_HDR: u32 = 0x4000;

const LIMIT: &str = "two TCG guests' TCP stacks on two shared cores: the emulated CPUs, not the backends, bound every path; what a path saves per byte (64 KB segments through it whole when offloads are negotiated, one copy per frame otherwise) shows as rate only because the guests' per-packet cost dominates";

/// One path's TCP rate at one number of streams.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TcpPath {
    /// Gbit/s the receiving guest read (iperf3's receiver total).
    pub gbps: Stats,
    /// TCP retransmissions the sender counted per run.
    pub retransmits: Stats,
    /// The sending guest's offloads on this path (`ethtool -k`): what the
    /// backend negotiated.
    pub offloads: Offloads,
}

/// TCP between the two guests, at one number of streams.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Tcp {
    /// Parallel TCP streams (`iperf3 -P`).
    pub streams: u32,
    /// Through the switch, Gbit/s.
    pub gbps: Stats,
    /// The switch over QEMU's TAP backend on a bridge, paired per repeat.
    pub ratio_over_tap_bridge: Stats,
    /// The switch over testpmd's io forwarding, paired per repeat.
    pub ratio_over_testpmd: Stats,
    /// Through the switch.
    pub switch: TcpPath,
    /// QEMU's TAP backend, both TAPs on one Linux bridge.
    pub tap_bridge: TcpPath,
    /// testpmd forwarding between two vhost-user ports.
    pub testpmd: TcpPath,
}

/// The TCP rows and how they were run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct VmTcp {
    /// One stream.
    pub tcp: Tcp,
    /// Four streams.
    pub tcp4: Tcp,
    /// How they were run: threads, offloads, load.
    pub tcp_run: TcpRun,
}

/// How the TCP rows were run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TcpRun {
    /// Seconds of iperf3 per run.
    pub seconds_per_run: u32,
    /// Whether QEMU's TAPs carried virtio-net headers (`IFF_VNET_HDR`):
    /// the TAP path's offloads.
    pub tap_vnet_hdr: bool,
    /// Where the threads ran.
    pub threads: String,
    /// The 1-minute load average before each run.
    pub load_avg_1min: Stats,
    /// CPUs online.
    pub cpus: usize,
    /// testpmd's command line, or why its rows are empty.
    pub testpmd: String,
    /// What bounds the rows.
    pub limit: String,
    /// Seconds the TCP rows took, boot included.
    #[serde(deserialize_with = "crate::nan::f64")]
    pub seconds: f64,
}

/// The keys the TCP rows add to `--part vm --format json`.
pub const KEYS: [&str; 6] = [
    "vm.tcp.gbps",
    "vm.tcp.ratio_over_tap_bridge",
    "vm.tcp.ratio_over_testpmd",
    "vm.tcp4.gbps",
    "vm.tcp4.ratio_over_tap_bridge",
    "vm.tcp4.ratio_over_testpmd",
];

impl VmTcp {
    /// The rows as a table, then the ratios, offloads, threads and load.
    pub fn to_text(&self) -> String {
        let opt = crate::nan::cell;
        let mmm = |s: &Stats, d: usize| {
            format!(
                "{} / {} / {}",
                opt(s.min, d),
                opt(s.median, d),
                opt(s.max, d)
            )
        };
        let mut t = measure::Table::new([
            "path",
            "streams",
            "Gbit/s (min/med/max)",
            "retransmits (med)",
            "TSO",
            "TX csum",
        ])
        .title("TCP between two TCG guests (iperf3)");
        for r in [&self.tcp, &self.tcp4] {
            for (name, p) in [
                ("switch (vhost-user)", &r.switch),
                ("QEMU TAP + bridge", &r.tap_bridge),
                ("testpmd io (vhost)", &r.testpmd),
            ] {
                t.row([
                    name.to_string(),
                    r.streams.to_string(),
                    mmm(&p.gbps, 3),
                    opt(p.retransmits.median, 0),
                    if p.offloads.tso { "on" } else { "off" }.into(),
                    if p.offloads.tx_csum { "on" } else { "off" }.into(),
                ]);
            }
        }
        let mut out = format!("{t}\n");
        for r in [&self.tcp, &self.tcp4] {
            let _ = writeln!(
                out,
                "TCP, {} stream(s): switch / TAP bridge {} (goal >= 3); switch / testpmd {} (goal >= 1)",
                r.streams,
                mmm(&r.ratio_over_tap_bridge, 2),
                mmm(&r.ratio_over_testpmd, 2),
            );
        }
        let m = &self.tcp_run;
        let _ = writeln!(
            out,
            "TCP rows: {} s per run; QEMU's TAPs with virtio-net headers (vnet_hdr): {}; {} CPUs, load average (1 min) {}; {:.0} s in all",
            m.seconds_per_run,
            if m.tap_vnet_hdr { "yes" } else { "no" },
            m.cpus,
            mmm(&m.load_avg_1min, 1),
            m.seconds
        );
        let _ = writeln!(out, "  threads: {}", m.threads);
        let _ = writeln!(out, "  testpmd: {}", m.testpmd);
        let _ = writeln!(out, "  limit: {}", m.limit);
        out
    }
}

fn io(what: String) -> impl FnOnce(std::io::Error) -> VmError {
    move |source| VmError::Io { what, source }
}

/// testpmd in interactive mode, forwarding only between `start` and
/// `stop`; killed by PID when dropped, its runtime directory removed.
struct Testpmd {
    child: Child,
    stdin: ChildStdin,
    log: PathBuf,
    prefix: String,
}

impl Testpmd {
    /// testpmd with vhost-user server ports at `socks`, io forwarding,
    /// main lcore on CPU 0 and its forwarding lcore on CPU 1; returns once
    /// both sockets exist (at most 30 s).
    fn start(socks: [&Path; 2], dir: &Path) -> Result<(Testpmd, String), VmError> {
        let bin = crate::peers::testpmd_path().ok_or_else(|| VmError::Io {
            what: "dpdk-testpmd not found (scripts/setup.sh installs dpdk-dev)".into(),
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        })?;
        let pid = std::process::id();
        let prefix = format!("fp-vmtcp-{pid}");
        let log = dir.join("testpmd.log");
        let out = std::fs::File::create(&log).map_err(io(format!("creating {}", log.display())))?;
        let err2 = out
            .try_clone()
            .map_err(io(format!("creating {}", log.display())))?;
        let mut args: Vec<String> = [
            "-l",
            "0-1",
            "--main-lcore",
            "0",
            "--no-huge",
            "-m",
            "512",
            "--no-pci",
            "--log-level=lib.eal:error",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.push(format!("--file-prefix={prefix}"));
        for (i, s) in socks.iter().enumerate() {
            args.push(format!("--vdev=net_vhost{i},iface={}", s.display()));
        }
        args.extend(
            ["--", "-i", "--forward-mode=io", "--total-num-mbufs=16384"]
                .iter()
                .map(|s| s.to_string()),
        );
        let line = format!("{} {}", bin.display(), args.join(" "));
        let mut cmd = Command::new(&bin);
        cmd.args(&args)
            .stdin(Stdio::piped())
            .stdout(out)
            .stderr(err2);
        // SAFETY: one async-signal-safe system call between fork and exec;
        // testpmd dies with this thread, whatever ends the bench.
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().map_err(io("starting dpdk-testpmd".into()))?;
        let Some(stdin) = child.stdin.take() else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(VmError::Io {
                what: "testpmd's stdin was not piped".into(),
                source: std::io::Error::other("no stdin"),
            });
        };
        let p = Testpmd {
            child,
            stdin,
            log,
            prefix,
        };
        let t = Instant::now();
        while !socks.iter().all(|s| s.exists()) {
            if t.elapsed() > Duration::from_secs(30) || !crate::proc::alive(p.child.id() as i32) {
                return Err(VmError::Io {
                    what: format!("testpmd made no vhost-user sockets: {}", p.tail()),
                    source: std::io::Error::from(std::io::ErrorKind::TimedOut),
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok((p, line))
    }

    /// A command at testpmd's prompt (`start`, `stop`).
    fn send(&mut self, cmd: &str) -> Result<(), VmError> {
        writeln!(self.stdin, "{cmd}")
            .and_then(|()| self.stdin.flush())
            .map_err(io(format!("testpmd `{cmd}`: {}", self.tail())))
    }

    fn tail(&self) -> String {
        let t = std::fs::read_to_string(&self.log).unwrap_or_default();
        let l: Vec<&str> = t.lines().rev().take(8).collect();
        l.into_iter().rev().collect::<Vec<_>>().join(" | ")
    }
}

impl Drop for Testpmd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(format!("/var/run/dpdk/{}", self.prefix));
    }
}

/// The switch on its own thread, stopped when dropped.
struct Running(Option<(Arc<AtomicBool>, std::thread::JoinHandle<Switch>)>);

impl Drop for Running {
    fn drop(&mut self) {
        if let Some((stop, h)) = self.0.take() {
            stop.store(true, Ordering::Relaxed);
            let _ = h.join();
        }
    }
}

/// One iperf3 run from A to B over path `p`; B's report (Gbit/s,
/// retransmits from A's).
fn once(
    a: &mut Guest,
    b: &mut Guest,
    p: usize,
    streams: u32,
    secs: u32,
) -> Result<(f64, f64), VmError> {
    b.iperf3_server(Duration::from_secs(30)).map_err(err("B"))?;
    let c = a
        .iperf3_client(
            &format!("{}.2", NETS[p]),
            secs,
            streams,
            Duration::from_secs(u64::from(secs) + 90),
        )
        .map_err(err("A"))?;
    let s = b
        .iperf3_server_result(Duration::from_secs(30))
        .map_err(err("B"))?;
    Ok((s.gbps(), c.retransmits as f64))
}

fn ratio(a: &[f64], b: &[f64]) -> Stats {
    let r: Vec<f64> = a
        .iter()
        .zip(b)
        .map(|(x, y)| if *y > 0.0 { x / y } else { f64::NAN })
        .collect();
    stats(&r)
}

/// Boot two guests with a NIC on each path, run iperf3 over each path in
/// turn `o.repeats` times (1 and 4 streams), tear everything down.
pub fn run(o: &VmOptions, dir: &Path) -> Result<VmTcp, VmError> {
    let t0 = Instant::now();
    let say = |s: &str| {
        if let Some(p) = &o.progress {
            p(s);
        }
    };
    let secs: u32 = if o.quick { 2 } else { 5 };
    let pid = std::process::id();
    let ns = Netns::new(&format!("fpvtcp{}", pid % 100_000))?;
    ns.ip(&["link", "add", "name", BRIDGE, "type", "bridge"])?;
    ns.ip(&["link", "set", "dev", BRIDGE, "up"])?;
    let sock = |n: &str| crate::vm::vm_sock(dir, "tcp-", n);
    let (pmd_a, pmd_b) = (sock("pmd-a"), sock("pmd-b"));
    // testpmd first: QEMU waits at start for its vhost-user server.
    let (mut pmd, pmd_line) = match Testpmd::start([&pmd_a, &pmd_b], dir) {
        Ok((p, l)) => (Some(p), l),
        Err(e) => (None, format!("not run: {e}")),
    };
    let sw = crate::vm::vm_switch(
        dir,
        "tcp-",
        o.poll_us,
        &[("tcp-a", MACS_A[0]), ("tcp-b", MACS_B[0])],
    )?;
    let _sw = Running(Some(vswitch::spawn(sw).map_err(VmError::Switch)?));
    let opts = |name: &str, macs: [&str; 3], sw: &str, tap: &str, pmd: &Path| {
        let mut nics = vec![Nic::vhost_user(&sock(sw), macs[0]), Nic::tap(tap, macs[1])];
        if crate::peers::testpmd_path().is_some() && pmd.exists() {
            nics.push(Nic::vhost_user(pmd, macs[2]));
        }
        GuestOpts::new(name, nics)
            .netns(ns.name())
            .vhost_ring(o.vhost_ring)
            .limit(Duration::from_secs(1800))
    };
    say("TCP rows: booting two guests with a NIC on the switch, a TAP and testpmd");
    let mut a = Guest::start(&opts("TCP A", MACS_A, "tcp-a", TAPS[0], &pmd_a)).map_err(err("A"))?;
    let mut b = Guest::start(&opts("TCP B", MACS_B, "tcp-b", TAPS[1], &pmd_b)).map_err(err("B"))?;
    a.wait_ready(lab::guest::BOOT).map_err(err("A"))?;
    b.wait_ready(lab::guest::BOOT).map_err(err("B"))?;
    for t in TAPS {
        ns.ip(&["link", "set", "dev", t, "master", BRIDGE])?;
        ns.ip(&["link", "set", "dev", t, "up"])?;
    }
    let vnet_hdr = ns
        .exec(&["cat", &format!("/sys/class/net/{}/tun_flags", TAPS[0])])
        .ok()
        .and_then(|o| {
            let s = String::from_utf8_lossy(&o.stdout).trim().to_string();
            u32::from_str_radix(s.trim_start_matches("0x"), 16).ok()
        })
        .is_some_and(|f| f & IFF_VNET_HDR != 0);
    let paths = if pmd.is_some() { 3 } else { 2 };
    let mut ifaces_a = Vec::new();
    for (g, name, macs, host) in [(&mut a, "A", MACS_A, 1), (&mut b, "B", MACS_B, 2)] {
        for (p, mac) in macs.iter().enumerate().take(paths) {
            let i = g.iface(mac).map_err(err(name))?;
            g.ok(
                &format!(
                    "ip addr add {}.{host}/24 dev {i}; ip link set {i} up",
                    NETS[p]
                ),
                Duration::from_secs(30),
            )
            .map_err(err(name))?;
            if host == 1 {
                ifaces_a.push(i);
            }
        }
    }
    let mut offloads = [Offloads::default(); 3];
    for (p, i) in ifaces_a.iter().enumerate() {
        offloads[p] = a.offloads(i).map_err(err("A"))?;
    }
    // Neighbours learned and carriers up before the first timed run.
    for net in NETS.iter().take(paths) {
        let _ = a.ping(&format!("{net}.2"), 2, 200);
    }
    if let Some(pmd) = &mut pmd {
        pmd.send("start")?;
        let _ = a.ping(&format!("{}.2", NETS[2]), 2, 200);
        pmd.send("stop")?;
    }
    // [streams][path] -> samples of (Gbit/s, retransmits).
    let mut gbps = [[vec![], vec![], vec![]], [vec![], vec![], vec![]]];
    let mut retr = gbps.clone();
    let mut loads = Vec::new();
    for r in 0..o.repeats {
        for (si, streams) in [1u32, 4].into_iter().enumerate() {
            for p in 0..3 {
                if o.stop.load(Ordering::Relaxed) {
                    return Err(VmError::Interrupted);
                }
                if p == 2 && pmd.is_none() {
                    gbps[si][p].push(f64::NAN);
                    retr[si][p].push(f64::NAN);
                    continue;
                }
                loads.push(crate::proc::load_average_1min());
                if p == 2 {
                    if let Some(pmd) = &mut pmd {
                        pmd.send("start")?;
                    }
                }
                let res = once(&mut a, &mut b, p, streams, secs);
                if p == 2 {
                    if let Some(pmd) = &mut pmd {
                        pmd.send("stop")?;
                    }
                }
                let (g, rt) = res?;
                say(&format!(
                    "TCP run {}: path {}, {streams} stream(s): {g:.3} Gbit/s",
                    r + 1,
                    ["switch", "TAP bridge", "testpmd"][p]
                ));
                gbps[si][p].push(g);
                retr[si][p].push(rt);
            }
        }
    }
    drop(a);
    drop(b);
    drop(pmd);
    drop(ns);
    let row = |si: usize, streams: u32| {
        let path = |p: usize| TcpPath {
            gbps: stats(&gbps[si][p]),
            retransmits: stats(&retr[si][p]),
            offloads: offloads[p],
        };
        Tcp {
            streams,
            gbps: stats(&gbps[si][0]),
            ratio_over_tap_bridge: ratio(&gbps[si][0], &gbps[si][1]),
            ratio_over_testpmd: ratio(&gbps[si][0], &gbps[si][2]),
            switch: path(0),
            tap_bridge: path(1),
            testpmd: path(2),
        }
    };
    Ok(VmTcp {
        tcp: row(0, 1),
        tcp4: row(1, 4),
        tcp_run: TcpRun {
            seconds_per_run: secs,
            tap_vnet_hdr: vnet_hdr,
            threads: "the switch: one unpinned thread of this process, polling for poll_us after traffic and sleeping otherwise; testpmd: main lcore on CPU 0, forwarding lcore pinned to CPU 1, busy-polling during its rows only; QEMU: one unpinned TCG vCPU thread per guest (1 vCPU, 256 MiB); the TAP path's bridge forwards in the guests' QEMU threads' system calls and in softirq".into(),
            load_avg_1min: stats(&loads),
            cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
            testpmd: pmd_line,
            limit: LIMIT.into(),
            seconds: t0.elapsed().as_secs_f64(),
        },
    })
}
