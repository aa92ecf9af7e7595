//! `vm.multiqueue`: one guest with two vCPUs transmitting through a VM
//! port with two queue pairs, against the same guest with one.
//!
//! The switch runs in this process with one vhost-user port offering two
//! pairs (`queues=2`) and a sink port; the guest boots with `-smp 2` and
//! `-netdev vhost-user,...,queues=2` (`mq=on`). Each run measures both
//! settings, in alternating order: the guest's driver set to two pairs
//! (`ethtool -L eth0 combined 2`) with one pktgen thread per transmit
//! queue (`eth0@0` on vCPU 0's thread, `eth0@1` on vCPU 1's), and set to
//! one pair with one pktgen thread, each sending 60-byte frames, 32 per
//! doorbell, to the sink. The rate is the frames all threads sent over the
//! longest thread's time; the ratio is the two-pair rate over the one-pair
//! rate of the same run. Beside them: the switch thread's CPU over each
//! measurement, each transmit queue's share of what the switch took, and
//! where QEMU's and the switch's threads ran (their CPU and the core they
//! last ran on).
//!
//! What limits it here: TCG runs each vCPU in a host thread, and the
//! machine has two cores, so two busy vCPUs and the switch's thread
//! share two cores: two pairs can only help as far as a second vCPU gets
//! a core of its own.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use lab::guest::{Guest, GuestOpts, Nic};
use serde::{Deserialize, Serialize};
use vswitch::{Config, Switch, VhostPort, VhostUserEntry};

use crate::switch_ports::SinkPort;
use crate::vm::{stats, Running, Stats, VmError, VmOptions};

const MAC_A: &str = "52:54:00:fa:3a:01";
const MAC_SINK: [u8; 6] = [0x02, 0xfa, 0x5e, 0x00, 0x03, 0x01];
const MAC_SINK_TEXT: &str = "02:fa:5e:00:03:01";
const IP_A: &str = "10.80.0.1";
const IP_SINK: &str = "10.80.0.9";
/// The goal: two pairs over one.
pub const GOAL_RATIO: f64 = 1.6;

const LIMIT: &str = "TCG runs each vCPU in a host thread and this machine has two cores: the guest's two vCPUs and the switch's polling thread share them, so the second pair adds at most what a second vCPU gets of a core the switch also needs";

/// A thread and where it ran during one measurement.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Placement {
    /// Its name (`CPU 0/TCG`, `switch`).
    pub thread: String,
    /// Its CPU over the measurement, percent of one core: the measurement
    /// holds pktgen's setup over the guest's serial console as well as its
    /// run, so a busy thread shows less than it took while frames flowed.
    pub cpu_pct: f64,
    /// The core it last ran on.
    pub last_core: i32,
}

/// The multiqueue row.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Multiqueue {
    /// Two pairs over one pair, per run.
    pub ratio: Stats,
    /// Guest transmit with two pairs, frames a second.
    pub two_pairs_pps: Stats,
    /// Guest transmit with one pair, frames a second.
    pub one_pair_pps: Stats,
    /// The switch thread's CPU with two pairs, percent of one core.
    pub switch_cpu_pct_two_pairs: Stats,
    /// The same with one pair.
    pub switch_cpu_pct_one_pair: Stats,
    /// The 1-minute load average at each run's start (the machine is
    /// shared).
    pub load_avg_1min: Stats,
    /// With two pairs, the share of frames the switch took from the
    /// second transmit queue (0.5: even).
    pub second_queue_share: Stats,
    /// Where the guest's vCPU threads were pinned (vCPU K on core K), or
    /// why they were not.
    #[serde(default)]
    pub vcpu_placement: String,
    /// QEMU's threads over 5% of a core (its vCPUs are `CPU K/TCG`), and
    /// the switch's, in the last two-pair measurement.
    pub threads_two_pairs: Vec<Placement>,
    /// The same for the last one-pair measurement.
    pub threads_one_pair: Vec<Placement>,
    /// The goal for the ratio.
    pub goal_ratio_at_least: f64,
    /// What the figures are.
    pub is: String,
    /// What limits them.
    pub limit: String,
}

/// The threads of `pid` (its `/proc/PID/task`): (thread id, name, CPU
/// ticks, the core it last ran on).
fn threads(pid: u32) -> Vec<(u32, String, u64, i32)> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for e in rd.flatten() {
        let p = e.path();
        let Some(tid) = e.file_name().to_str().and_then(|t| t.parse::<u32>().ok()) else {
            continue;
        };
        let name = std::fs::read_to_string(p.join("comm"))
            .unwrap_or_default()
            .trim()
            .to_string();
        let Ok(stat) = std::fs::read_to_string(p.join("stat")) else {
            continue;
        };
        // Fields after the command (which may hold spaces), from field 3.
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        let num = |i: usize| f.get(i).and_then(|x| x.parse::<i64>().ok()).unwrap_or(0);
        // utime and stime are fields 14 and 15, processor 39 (1-based);
        // `f[0]` is field 3.
        let ticks = (num(11) + num(12)).max(0) as u64;
        out.push((tid, name, ticks, num(36) as i32));
    }
    out
}

/// Clock ticks a second (`USER_HZ`).
fn hz() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// Where the threads ran between two samples `secs` apart: those `keep`
/// names, over `min_pct` of a core.
fn placement(
    before: &[(u32, String, u64, i32)],
    after: &[(u32, String, u64, i32)],
    secs: f64,
    min_pct: f64,
    keep: impl Fn(&str) -> bool,
) -> Vec<Placement> {
    let hz = hz();
    let mut v = Vec::new();
    for (tid, name, t1, core) in after {
        if !keep(name) {
            continue;
        }
        // A thread that started after the first sample ran from zero.
        let t0 = before
            .iter()
            .find(|(t, _, _, _)| t == tid)
            .map_or(0, |(_, _, t, _)| *t);
        let pct = (t1.saturating_sub(t0)) as f64 / hz / secs.max(1e-3) * 100.0;
        if pct >= min_pct {
            v.push(Placement {
                thread: name.clone(),
                cpu_pct: (pct * 10.0).round() / 10.0,
                last_core: *core,
            });
        }
    }
    v
}

/// Transmit chains per queue pair of the port at `idx`.
fn tx_chains(sw: &mut Switch, idx: u16) -> Vec<u64> {
    sw.port_as::<VhostPort>(idx)
        .map(|v| {
            v.all_queue_stats()
                .iter()
                .skip(1)
                .step_by(2)
                .map(|q| q.chains)
                .collect()
        })
        .unwrap_or_default()
}

/// Pins each of QEMU's vCPU threads (`CPU K/TCG`) to core `K` (modulo
/// the cores there are); says where they went, or why they were not
/// pinned. With the longer runs but unpinned, the lowest of 9 ratios was
/// 1.597; pinned, the lowest of 27 was 1.76: two busy vCPUs left to the
/// scheduler can share a core now and then, which pinning rules out (a VM
/// host pins vCPUs for the same reason).
fn pin_vcpus(qemu: u32) -> String {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut placed = Vec::new();
    for (tid, name, _, _) in threads(qemu) {
        let Some(k) = name
            .strip_prefix("CPU ")
            .and_then(|r| r.strip_suffix("/TCG"))
            .and_then(|k| k.parse::<usize>().ok())
        else {
            continue;
        };
        let core = k % cores;
        if !crate::cpus::pin_tid(tid as i32, core) {
            return format!("unpinned (pinning {name} failed)");
        }
        placed.push((k, core));
    }
    if placed.is_empty() {
        return "unpinned (no vCPU thread named CPU K/TCG)".into();
    }
    placed.sort_unstable();
    placed
        .iter()
        .map(|(k, c)| format!("vCPU {k} on core {c}"))
        .collect::<Vec<_>>()
        .join(", ")
        + "; QEMU's other threads and the switch unpinned"
}

/// One measurement's results.
struct One {
    pps: f64,
    switch_pct: f64,
    chains: Vec<u64>,
    threads: Vec<Placement>,
}

/// [`run`] on its own (`--part vm-multiqueue`): checks what it needs and
/// makes its own socket directory.
pub fn run_alone(o: &VmOptions) -> Result<Multiqueue, VmError> {
    if !lab::guest::available() {
        return Err(VmError::Unavailable);
    }
    if !lab::netns::available() {
        return Err(VmError::NotRoot);
    }
    let dir = std::env::temp_dir().join(format!("fastpath-vm-mq-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|source| VmError::Io {
        what: format!("creating {}", dir.display()),
        source,
    })?;
    let r = run(o, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    r
}

/// Boot the guest, measure two pairs against one `o.repeats` times.
pub fn run(o: &VmOptions, dir: &Path) -> Result<Multiqueue, VmError> {
    let say = |s: &str| {
        if let Some(p) = &o.progress {
            p(s);
        }
    };
    let sock = dir.join("vm-mq.sock");
    let entry = VhostUserEntry::parse(&format!(
        "{},name=vm-mq,mac={MAC_A},queues=2",
        sock.display()
    ))
    .and_then(|e| e.config())
    .expect("the bench's own vhost-user settings are valid");
    let mut sw = Switch::new(Config {
        socket: None,
        poll_us: o.poll_us,
        log_ports: false,
        vhost_user: vec![entry],
        ..Config::default()
    })
    .map_err(VmError::Switch)?;
    let idx = sw.find("vm-mq").unwrap_or(0);
    sw.add_port(Box::new(SinkPort::with_mac("sink", MAC_SINK)))
        .map_err(VmError::Switch)?;
    let mut running = Running::new(sw);
    running.start();
    say("multiqueue: booting a guest with 2 vCPUs and 2 queue pairs");
    let opts = GuestOpts::new("MQ", vec![Nic::vhost_user(&sock, MAC_A).queues(2)])
        .cpus(2)
        .vhost_ring(o.vhost_ring)
        .ip(&format!("{IP_A}/24"))
        .limit(Duration::from_secs(1800));
    let gerr = |source| VmError::Guest {
        guest: "MQ",
        source,
    };
    let mut g = Guest::start(&opts).map_err(gerr)?;
    g.wait_ready(lab::guest::BOOT).map_err(gerr)?;
    let iface = g.iface(MAC_A).map_err(gerr)?;
    // A second or more of sending per measurement: at 100,000 frames a
    // two-pair run lasted 0.1-0.2 s, and one late timeslice moved it.
    let frames: u64 = if o.quick { 20_000 } else { 1_000_000 };
    let within = Duration::from_secs(120 + frames / 1000);
    let me = std::process::id();
    let qemu = g.pid();
    let vcpu_placement = pin_vcpus(qemu);
    say(&format!("multiqueue: {vcpu_placement}"));
    let measure = |g: &mut Guest, running: &mut Running, pairs: u16| -> Result<One, VmError> {
        g.set_queues(&iface, pairs).map_err(gerr)?;
        let c0 = tx_chains(running.stop(), idx);
        running.start();
        // The driver's change reaches the switch through QEMU: let it.
        std::thread::sleep(Duration::from_millis(300));
        let (s0, q0, t0) = (threads(me), threads(qemu), Instant::now());
        let per = frames / u64::from(pairs);
        let r = g
            .pktgen_queues(
                &iface,
                u32::from(pairs),
                per,
                60,
                32,
                MAC_SINK_TEXT,
                IP_SINK,
                within,
            )
            .map_err(gerr)?;
        let secs = t0.elapsed().as_secs_f64();
        let (s1, q1) = (threads(me), threads(qemu));
        std::thread::sleep(Duration::from_millis(100));
        let c1 = tx_chains(running.stop(), idx);
        running.start();
        let sent: u64 = r.iter().map(|t| t.sent).sum();
        let usec = r.iter().map(|t| t.usec).max().unwrap_or(0).max(1);
        let mut placed = placement(&q0, &q1, secs, 5.0, |_| true);
        let sw_place = placement(&s0, &s1, secs, 0.0, |n| n == "switch");
        let switch_pct = sw_place.first().map_or(0.0, |p| p.cpu_pct);
        placed.extend(sw_place);
        Ok(One {
            pps: sent as f64 * 1e6 / usec as f64,
            switch_pct,
            chains: c1.iter().zip(&c0).map(|(a, b)| a - b).collect(),
            threads: placed,
        })
    };
    let (mut two, mut one, mut ratio) = (Vec::new(), Vec::new(), Vec::new());
    let (mut cpu2, mut cpu1, mut share) = (Vec::new(), Vec::new(), Vec::new());
    let (mut last2, mut last1) = (Vec::new(), Vec::new());
    let mut loads = Vec::new();
    for r in 0..o.repeats {
        if o.stop.load(Ordering::Relaxed) {
            return Err(VmError::Interrupted);
        }
        loads.push(crate::proc::load_average_1min());
        // Alternate the order, so that a drift of the machine's load
        // weighs on both settings alike.
        let (m2, m1) = if r % 2 == 0 {
            let m2 = measure(&mut g, &mut running, 2)?;
            (m2, measure(&mut g, &mut running, 1)?)
        } else {
            let m1 = measure(&mut g, &mut running, 1)?;
            (measure(&mut g, &mut running, 2)?, m1)
        };
        let taken: u64 = m2.chains.iter().sum();
        let s = m2.chains.get(1).copied().unwrap_or(0) as f64 / taken.max(1) as f64;
        say(&format!(
            "multiqueue [{}/{}]: 2 pairs {:.0} pps (second queue {:.2} of {taken}), 1 pair {:.0} pps, ratio {:.2}; switch {:.0}% / {:.0}% of a core",
            r + 1,
            o.repeats,
            m2.pps,
            s,
            m1.pps,
            m2.pps / m1.pps.max(1.0),
            m2.switch_pct,
            m1.switch_pct
        ));
        ratio.push(if m1.pps > 0.0 {
            m2.pps / m1.pps
        } else {
            f64::NAN
        });
        two.push(m2.pps);
        one.push(m1.pps);
        cpu2.push(m2.switch_pct);
        cpu1.push(m1.switch_pct);
        share.push(s);
        last2 = m2.threads;
        last1 = m1.threads;
    }
    drop(g);
    drop(running);
    Ok(Multiqueue {
        ratio: stats(&ratio),
        two_pairs_pps: stats(&two),
        one_pair_pps: stats(&one),
        switch_cpu_pct_two_pairs: stats(&cpu2),
        switch_cpu_pct_one_pair: stats(&cpu1),
        second_queue_share: stats(&share),
        load_avg_1min: stats(&loads),
        vcpu_placement,
        threads_two_pairs: last2,
        threads_one_pair: last1,
        goal_ratio_at_least: GOAL_RATIO,
        is: format!("one TCG guest, 2 vCPUs, vhost-user NIC with 2 queue pairs, pktgen of {frames} 60-byte frames per run (burst 32) to a sink port: one thread per transmit queue with 2 pairs (ethtool -L combined 2) against one thread with 1 pair; rate = frames over the longest thread's time"),
        limit: LIMIT.into(),
    })
}

impl Multiqueue {
    /// Its lines in the vm part's text.
    pub fn to_text(&self) -> String {
        let f = |s: &Stats, scale: f64, d: usize| s.mmm(scale, d);
        let place = |v: &[Placement]| {
            v.iter()
                .map(|p| format!("{} {:.0}% core {}", p.thread, p.cpu_pct, p.last_core))
                .collect::<Vec<_>>()
                .join(", ")
        };
        format!(
            "multiqueue (2-vCPU guest): 2 pairs {} Kpps, 1 pair {} Kpps, ratio {} (goal >= {GOAL_RATIO}); second queue's share {}; switch CPU {}% / {}% of a core (2 / 1 pairs); load {}\n  vCPUs: {}\n  threads, 2 pairs: {}\n  threads, 1 pair: {}\n  limit: {}\n",
            f(&self.two_pairs_pps, 1e-3, 1),
            f(&self.one_pair_pps, 1e-3, 1),
            f(&self.ratio, 1.0, 2),
            f(&self.second_queue_share, 1.0, 2),
            f(&self.switch_cpu_pct_two_pairs, 1.0, 0),
            f(&self.switch_cpu_pct_one_pair, 1.0, 0),
            f(&self.load_avg_1min, 1.0, 1),
            self.vcpu_placement,
            place(&self.threads_two_pairs),
            place(&self.threads_one_pair),
            self.limit
        )
    }
}
