//! `fastpath lb soak`: the load balancer under real HTTP load while faults
//! are injected, on the namespace topology of [`crate::topology`] with five
//! backends, and what it lost.
//!
//! Load for the whole run, from the client namespace through the VIP: `wrk`
//! with keep-alive and `wrk -H "Connection: close"` (a new connection per
//! request), in short segments so that every failure can be placed in time.
//! Beside it, long-lived keep-alive connections ([`HttpConn`], two per
//! backend), each asked `GET /` every half second.
//!
//! Faults, repeated once per cycle of about a minute (`--seconds 600` runs
//! ten cycles): nginx stopped on backend 1 and restarted; backend 2's
//! decapsulation agent killed (SIGKILL) and restarted; backend 3's link
//! taken down and up; reloads adding and removing backend 5 every two
//! seconds; a broken reload (rejected, nothing changes); backend 4 drained
//! (weight 0 by reload) and undrained. Health checks go through the tunnel
//! (`via = "tunnel"`, 200 ms interval, 300 ms timeout, fall 2, rise 2), so a
//! dead decapsulation agent is seen like a dead server.
//!
//! What it measures, and the goals ([`Report::goals`]):
//! - long-lived connections broken on a backend that stayed healthy: a
//!   connection failed while nothing was done to its backend (no fault, no
//!   removal from the configuration, within [`FAULT_GRACE_S`] of its end).
//!   Goal 0. The drained backend counts as healthy: draining must keep its
//!   established connections.
//! - new connections that reached the drained backend: goal 0.
//! - time from each fault until `/metrics` shows the backend unhealthy, and
//!   from its repair until healthy again; goal: every failed backend out
//!   within [`REMOVAL_BOUND_S`].
//! - backends marked down while nothing was done to them: goal 0.
//! - `wrk` requests sent and failed, per segment; goal: no failure in a
//!   segment that does not overlap a fault window, and in those that do, no
//!   more than [`Report::failure_bound`] explains.
//! - every good reload applied, the broken one rejected with the
//!   configuration generation unchanged.
//! - the load balancer's RSS and packet-pool occupancy after the warm-up and
//!   at the end, both under the same load: goal no growth beyond
//!   [`RSS_MARGIN_KIB`] and [`POOL_MARGIN`]; in runs of two cycles or more
//!   also none over the second half beyond [`RSS_SECOND_HALF_MARGIN_KIB`]
//!   (pages touched for the first time level off within the first cycles; a
//!   leak goes on growing).
//!
//! A goal missed is a finding about the load balancer, not noise to widen a
//! bound for: the first runs found established connections reset on
//! healthy backends after table changes (RELIABILITY.md).

use std::collections::BTreeMap;
use std::io::Read as _;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::topology::{HttpConn, Topology, VIP};
use crate::{Error, Result};

/// Backends in the topology: 1 to 4 in the configuration at the start, the
/// fifth added and removed by reloads.
pub const BACKENDS: usize = 5;
/// The backend whose nginx is stopped and restarted.
pub const NGINX_STOPPED: usize = 1;
/// The backend whose decapsulation agent is killed and restarted.
pub const DECAP_KILLED: usize = 2;
/// The backend whose link is taken down and up.
pub const LINK_CUT: usize = 3;
/// The backend drained (weight 0) and undrained by reloads.
pub const DRAINED: usize = 4;
/// The backend added and removed by reloads.
pub const TOGGLED: usize = 5;
/// Long-lived connections kept per backend.
pub const LONG_LIVED_PER_BACKEND: usize = 2;
/// Seconds within which a failed backend must be out of the table: fall (2)
/// x interval (200 ms) plus the timeout (300 ms) is 0.7 s; the rest is
/// slack for a loaded 2-core machine (the same bound as
/// crates/fastpath/tests/sys_lb_tunnel_health.rs).
pub const REMOVAL_BOUND_S: f64 = 2.5;
/// Seconds after a backend's repair (or re-addition) during which its own
/// connections may still fail: a request sent during the outage waits up to
/// [`HttpConn`]'s 3 s read timeout.
pub const FAULT_GRACE_S: f64 = 3.5;
/// Seconds after a backend is out of the table (or removed from the
/// configuration) during which `wrk` requests may still fail: its 2 s
/// request timeout, plus 1 s.
pub const WRK_GRACE_S: f64 = 3.0;
/// Allowed RSS growth between the start and the end, KiB. The allocator's
/// arenas settle during the first cycles (tables rebuilt by reloads and
/// health changes, API connections): +1.0 MiB in 60 s runs, +1.4 to
/// +1.6 MiB in 600 s runs, flat from the third minute on. A leak of one
/// small allocation per request (tens of millions) or per reload would
/// pass this by far; smaller leaks show in the second-half figure.
pub const RSS_MARGIN_KIB: u64 = 3072;
/// Allowed RSS growth over the second half of a run of two cycles or more,
/// KiB: the second half repeats the first half's faults and reloads, so
/// pages touched once are touched already; the 600 s runs stayed within
/// 8 KiB over their second half.
pub const RSS_SECOND_HALF_MARGIN_KIB: u64 = 512;
/// Allowed growth of the packet pool's occupancy between the start and the
/// end (buffers): one batch in flight per packet thread and per ring.
pub const POOL_MARGIN: u32 = 128;
/// Warning and error lines of the load balancer's log kept in the report.
const LOG_LINES: usize = 200;
/// `wrk`'s request timeout, seconds.
const WRK_TIMEOUT_S: u32 = 2;

/// How to run the soak.
#[derive(Debug, Clone)]
pub struct Options {
    /// Seconds of the measured run (after the warm-up); at least 30. One
    /// cycle of faults per full minute (at least one).
    pub seconds: u64,
    /// Seconds of load before the start figures are taken.
    pub warmup_s: u64,
    /// Length of a `wrk` segment, seconds.
    pub segment_s: u64,
    /// `wrk` connections with keep-alive.
    pub keepalive_connections: u32,
    /// `wrk` connections with `Connection: close` (at most one request
    /// each).
    pub close_connections: u32,
    /// Makes namespace names unique.
    pub tag: String,
}

impl Options {
    /// The defaults for a run of `seconds`.
    pub fn new(seconds: u64) -> Self {
        Options {
            seconds: seconds.max(30),
            warmup_s: 5,
            segment_s: 3,
            keepalive_connections: 8,
            close_connections: 4,
            tag: format!("s{}", std::process::id() % 100_000),
        }
    }
}

/// One `wrk` run (a segment of the load).
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Segment {
    /// `keep-alive` or `close`.
    pub mode: String,
    /// Start, seconds since the load began.
    pub start_s: f64,
    /// End, seconds since the load began.
    pub end_s: f64,
    /// Answers received (any status).
    pub completed: u64,
    /// Connections that could not be made.
    pub connect_errors: u64,
    /// Reads that failed (connection reset or closed mid-request).
    pub read_errors: u64,
    /// Writes that failed.
    pub write_errors: u64,
    /// Requests unanswered within `wrk --timeout`.
    pub timeouts: u64,
    /// Answers with a status other than 2xx or 3xx.
    pub non_2xx: u64,
    /// Why the segment's figures are missing, if they are.
    pub error: Option<String>,
    /// The fault windows it overlaps.
    pub overlaps: Vec<String>,
    /// Failures its overlapping fault windows explain at most.
    pub bound: u64,
}

impl Segment {
    /// Requests sent: answers plus requests that failed without one (a
    /// connection that could not be made stands for the request it was for).
    pub fn sent(&self) -> u64 {
        self.completed + self.connect_errors + self.read_errors + self.write_errors + self.timeouts
    }

    /// Requests that failed: socket errors, timeouts, bad statuses, and
    /// the whole segment when `wrk` itself failed.
    pub fn failed(&self) -> u64 {
        self.connect_errors
            + self.read_errors
            + self.write_errors
            + self.timeouts
            + self.non_2xx
            + u64::from(self.error.is_some())
    }
}

/// Parses `wrk`'s summary into a segment's counts.
pub fn parse_wrk(out: &str, seg: &mut Segment) -> bool {
    let num = |s: &str| s.trim().trim_end_matches(',').parse::<u64>().ok();
    let mut found = false;
    for line in out.lines().map(str::trim) {
        if let Some((n, _)) = line.split_once(" requests in ") {
            if let Some(n) = num(n) {
                seg.completed = n;
                found = true;
            }
        } else if let Some(rest) = line.strip_prefix("Socket errors:") {
            for part in rest.split(',') {
                let mut w = part.split_whitespace();
                let (Some(k), Some(v)) = (w.next(), w.next().and_then(num)) else {
                    continue;
                };
                match k {
                    "connect" => seg.connect_errors = v,
                    "read" => seg.read_errors = v,
                    "write" => seg.write_errors = v,
                    "timeout" => seg.timeouts = v,
                    _ => {}
                }
            }
        } else if let Some(n) = line.strip_prefix("Non-2xx or 3xx responses:") {
            seg.non_2xx = num(n).unwrap_or(0);
        }
    }
    found
}

/// `wrk` totals for one mode.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LoadTotals {
    /// `keep-alive` or `close`.
    pub mode: String,
    /// `wrk` connections.
    pub connections: u32,
    /// Requests sent.
    pub sent: u64,
    /// Answers received.
    pub completed: u64,
    /// Requests failed.
    pub failed: u64,
    /// Of those, in segments that overlap no fault window.
    pub failed_outside_faults: u64,
    /// Segments run.
    pub segments: usize,
}

/// A long-lived connection that failed.
#[derive(Debug, Clone, Serialize)]
pub struct ConnFailure {
    /// The backend that answered it (1-based).
    pub backend: usize,
    /// Opened, seconds since the load began.
    pub opened_s: f64,
    /// Failed, seconds since the load began.
    pub failed_s: f64,
    /// How.
    pub error: String,
    /// The fault window of its backend that explains it; none: broken on a
    /// healthy backend.
    pub explained_by: Option<String>,
}

/// The long-lived connections' outcome.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LongLived {
    /// Connections opened and kept.
    pub opened: u64,
    /// Polls (`GET /` on an open connection).
    pub polls: u64,
    /// Polls answered by the connection's own backend.
    pub polls_ok: u64,
    /// Failures explained by a fault on the connection's backend.
    pub broken_on_faulted: u64,
    /// Failures on backends that stayed healthy (goal 0).
    pub broken_on_healthy: u64,
    /// New connections that could not be opened (a fault not yet detected).
    pub new_connection_failures: u64,
    /// Every failure, for diagnosis.
    pub failures: Vec<ConnFailure>,
}

/// One fault and how long the load balancer took to see it.
#[derive(Debug, Clone, Serialize)]
pub struct FaultRecord {
    /// Cycle (from 1).
    pub cycle: u32,
    /// What was done.
    pub fault: String,
    /// The backend (1-based).
    pub backend: usize,
    /// When it took effect, seconds since the load began: the signal to
    /// nginx or the decap agent; the end of the `ip` command that took the
    /// link down.
    pub at_s: f64,
    /// Seconds the fault's own action took (nginx's shutdown, reaping the
    /// killed agent, the `ip` command).
    pub action_s: f64,
    /// Seconds from `at_s` until `/metrics` showed it unhealthy.
    pub out_after_s: Option<f64>,
    /// When it was repaired.
    pub repaired_at_s: Option<f64>,
    /// Seconds from the repair until `/metrics` showed it healthy.
    pub back_after_s: Option<f64>,
}

/// Reloads during the run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Reloads {
    /// Good reloads applied.
    pub applied: u64,
    /// Good reloads refused (goal 0), with the answers.
    pub refused: Vec<String>,
    /// Broken reloads sent.
    pub broken_sent: u64,
    /// Broken reloads rejected with the generation unchanged.
    pub broken_rejected: u64,
    /// Slowest reload answer, milliseconds.
    pub slowest_ms: f64,
    /// Each broken reload: what was wrong, and the answer.
    pub broken: Vec<String>,
}

/// A drain of backend 4 and what happened to its connections.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Drain {
    /// Cycle (from 1).
    pub cycle: u32,
    /// When drained, seconds since the load began.
    pub at_s: f64,
    /// When undrained.
    pub until_s: f64,
    /// Its long-lived connections when drained.
    pub connections: usize,
    /// Polls of them answered during the drain.
    pub polls_ok: u64,
    /// Of them, still open when undrained.
    pub still_open: usize,
    /// New long-lived connections that reached it while drained (goal 0).
    pub new_connections: usize,
}

/// A figure at the start and at the end of the run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct StartEnd {
    /// Median of the samples in the first two seconds after the warm-up.
    pub start: u64,
    /// Median of the samples in the two seconds from the run's middle: a
    /// leak grows on between the middle and the end, warm-up effects (pages
    /// of tables touched for the first time) do not.
    pub middle: u64,
    /// Median of the samples in the last two seconds.
    pub end: u64,
    /// Largest sample of the run.
    pub max: u64,
}

/// A goal and whether it was met.
#[derive(Debug, Clone, Serialize)]
pub struct Goal {
    /// What.
    pub goal: String,
    /// Met.
    pub met: bool,
    /// The figure.
    pub detail: String,
}

/// Everything the soak measured.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    /// Seconds of the measured run.
    pub seconds: u64,
    /// Warm-up seconds before it.
    pub warmup_s: u64,
    /// Cycles of faults.
    pub cycles: u32,
    /// Wall time from the load's start to its end.
    pub elapsed_s: f64,
    /// The packet I/O driver the load balancer used.
    pub driver: String,
    /// `wrk` requests sent, both modes.
    pub requests_sent: u64,
    /// `wrk` requests failed, both modes.
    pub requests_failed: u64,
    /// Per mode.
    pub load: Vec<LoadTotals>,
    /// The long-lived connections.
    pub long_lived: LongLived,
    /// Faults with their detection times.
    pub faults: Vec<FaultRecord>,
    /// Backends marked down while nothing was done to them (goal none).
    pub false_downs: Vec<String>,
    /// Reloads.
    pub reloads: Reloads,
    /// Drains.
    pub drains: Vec<Drain>,
    /// The load balancer's RSS, KiB.
    pub rss_kib: StartEnd,
    /// Packet-pool buffers in use.
    pub pool_in_use: StartEnd,
    /// Packet-pool size.
    pub pool_buffers: u32,
    /// Health checks not counted because the prober ran late.
    pub checks_inconclusive: u64,
    /// Connection-table events at the end (hit, miss, insert,
    /// insert_failure, expiry) and live entries.
    pub conntrack: BTreeMap<String, u64>,
    /// Packets the load balancer dropped, by reason, at the end.
    pub drops: BTreeMap<String, u64>,
    /// Every `wrk` segment.
    pub segments: Vec<Segment>,
    /// The load balancer's figures every 5 s: seconds since the load began,
    /// RSS in KiB, pool buffers in use.
    pub samples: Vec<(f64, u64, u64)>,
    /// The goals.
    pub goals: Vec<Goal>,
    /// The load balancer's last warnings and errors (health changes among
    /// them), for diagnosis.
    pub lb_log: Vec<String>,
}

impl Report {
    /// Whether every goal was met.
    pub fn passed(&self) -> bool {
        !self.goals.is_empty() && self.goals.iter().all(|g| g.met)
    }

    /// Failures a fault window explains in a segment whose requests went at
    /// `rate` per second: requests hashed to the failed backend before the
    /// load balancer knew (its share, 1 in 4, of the attempts during the
    /// time it took to be out plus half a second), twice over because a
    /// failing attempt (a reset) is quicker than an answered one, so
    /// attempts speed up while a quarter of them fail; plus one in-flight
    /// request per `wrk` connection (each may have been waiting on that
    /// backend). `rate` is the larger of the segment's own and the median
    /// of its mode over the run: a segment slowed down elsewhere (SYN
    /// retransmissions, a starved wrk) says little about the rate during
    /// the burst.
    pub fn failure_bound(rate: f64, out_after_s: f64, connections: u32) -> u64 {
        (2.0 * rate * (out_after_s + 0.5) / 4.0).ceil() as u64 + u64::from(connections)
    }

    /// The report for people.
    pub fn to_text(&self) -> String {
        let mut o = format!(
            "soak: {} s after a {} s warm-up, {} cycle(s) of faults, load balancer on {}\n\n",
            self.seconds, self.warmup_s, self.cycles, self.driver
        );
        let mut t = measure::Table::new([
            "wrk mode",
            "connections",
            "sent",
            "failed",
            "failed outside fault windows",
            "segments",
        ])
        .title("HTTP load through the VIP (wrk, in the client namespace):");
        for l in &self.load {
            t.row([
                l.mode.clone(),
                l.connections.to_string(),
                l.sent.to_string(),
                l.failed.to_string(),
                l.failed_outside_faults.to_string(),
                l.segments.to_string(),
            ]);
        }
        o += &format!("{t}\n");
        let ll = &self.long_lived;
        o += &format!(
            "long-lived connections: {} opened, {} polls ({} answered), broken on healthy backends {}, on faulted backends {}\n\n",
            ll.opened, ll.polls, ll.polls_ok, ll.broken_on_healthy, ll.broken_on_faulted
        );
        let secs = |v: Option<f64>| v.map_or("never".to_string(), |s| format!("{s:.2} s"));
        let mut f = measure::Table::new([
            "cycle",
            "fault",
            "backend",
            "at",
            "out after",
            "repaired at",
            "healthy after",
        ])
        .title("Faults (detection read from /metrics every 100 ms):");
        for r in &self.faults {
            f.row([
                r.cycle.to_string(),
                r.fault.clone(),
                r.backend.to_string(),
                format!("{:.1} s", r.at_s),
                secs(r.out_after_s),
                r.repaired_at_s
                    .map_or(String::new(), |s| format!("{s:.1} s")),
                secs(r.back_after_s),
            ]);
        }
        o += &format!("{f}\n");
        for d in &self.drains {
            o += &format!(
                "drain (cycle {}): backend {DRAINED} at {:.1} s until {:.1} s: {} established connections, {} answers during the drain, {} still open; new connections to it: {}\n",
                d.cycle, d.at_s, d.until_s, d.connections, d.polls_ok, d.still_open, d.new_connections
            );
        }
        o += &format!(
            "reloads: {} applied, {} refused, broken {} sent / {} rejected unchanged, slowest {:.0} ms\n",
            self.reloads.applied,
            self.reloads.refused.len(),
            self.reloads.broken_sent,
            self.reloads.broken_rejected,
            self.reloads.slowest_ms
        );
        o += &format!(
            "load balancer RSS: {} KiB at the start, {} KiB in the middle, {} KiB at the end (max {}); packet pool: {} then {} of {} buffers in use (max {}); inconclusive health checks: {}\n\n",
            self.rss_kib.start,
            self.rss_kib.middle,
            self.rss_kib.end,
            self.rss_kib.max,
            self.pool_in_use.start,
            self.pool_in_use.end,
            self.pool_buffers,
            self.pool_in_use.max,
            self.checks_inconclusive
        );
        let mut g = measure::Table::new(["goal", "met", "figure"]).title("Goals:");
        for x in &self.goals {
            g.row([
                x.goal.clone(),
                if x.met { "yes" } else { "NO" }.to_string(),
                x.detail.clone(),
            ]);
        }
        o += &g.to_string();
        o
    }
}

/// Seconds since `t0`.
fn since(t0: Instant) -> f64 {
    t0.elapsed().as_secs_f64()
}

/// The `wrk` load: one thread per mode, each running segments until the
/// end; stopped and joined on drop.
struct Load {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    segments: Arc<Mutex<Vec<Segment>>>,
}

impl Load {
    fn start(ns: &str, opts: &Options, t0: Instant, end: Instant) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let segments = Arc::new(Mutex::new(Vec::new()));
        let mut threads = Vec::new();
        for (mode, conns) in [
            ("keep-alive", opts.keepalive_connections),
            ("close", opts.close_connections),
        ] {
            let (ns, stop, segments, seg_s) = (
                ns.to_string(),
                Arc::clone(&stop),
                Arc::clone(&segments),
                opts.segment_s.max(1),
            );
            threads.push(std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let left = end.saturating_duration_since(Instant::now()).as_secs();
                    if left == 0 {
                        break;
                    }
                    let seg = run_wrk(&ns, mode, conns, left.min(seg_s), t0, &stop);
                    if let Some(seg) = seg {
                        segments.lock().unwrap_or_else(|p| p.into_inner()).push(seg);
                    }
                }
            }));
        }
        Load {
            stop,
            threads,
            segments,
        }
    }

    fn finish(mut self) -> Vec<Segment> {
        self.join();
        let mut v = std::mem::take(&mut *self.segments.lock().unwrap_or_else(|p| p.into_inner()));
        v.sort_by(|a, b| a.start_s.total_cmp(&b.start_s));
        v
    }

    fn join(&mut self) {
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.join();
    }
}

/// One `wrk` segment of `secs` in namespace `ns`; None when stopped early.
fn run_wrk(
    ns: &str,
    mode: &str,
    conns: u32,
    secs: u64,
    t0: Instant,
    stop: &AtomicBool,
) -> Option<Segment> {
    let mut seg = Segment {
        mode: mode.to_string(),
        start_s: since(t0),
        ..Segment::default()
    };
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", ns, "wrk", "-t1"])
        .arg(format!("-c{conns}"))
        .arg(format!("-d{secs}s"))
        .arg(format!("--timeout={WRK_TIMEOUT_S}s"));
    if mode == "close" {
        cmd.args(["-H", "Connection: close"]);
    }
    cmd.arg(format!("http://{VIP}/"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            seg.error = Some(format!("starting wrk: {e}"));
            // Do not spin on a missing program.
            std::thread::sleep(Duration::from_secs(secs));
            seg.end_s = since(t0);
            return Some(seg);
        }
    };
    let deadline = Instant::now() + Duration::from_secs(secs + 10);
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) if !stop.load(Ordering::Relaxed) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50));
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
        }
    };
    seg.end_s = since(t0);
    if stop.load(Ordering::Relaxed) {
        return None;
    }
    let mut out = String::new();
    let mut err = String::new();
    if let Some(mut s) = child.stdout.take() {
        let _ = s.read_to_string(&mut out);
    }
    if let Some(mut s) = child.stderr.take() {
        let _ = s.read_to_string(&mut err);
    }
    match status {
        Some(s) if s.success() && parse_wrk(&out, &mut seg) => {}
        Some(s) => seg.error = Some(format!("wrk: {s}: {}{}", out.trim(), err.trim())),
        None => seg.error = Some("wrk did not finish in time; killed".into()),
    }
    if seg.error.is_some() {
        // A wrk that fails at once is not started again at once.
        let until = seg.start_s + secs as f64;
        std::thread::sleep(Duration::from_secs_f64((until - since(t0)).max(0.0)));
    }
    Some(seg)
}

/// One long-lived connection's record.
#[derive(Debug, Clone)]
struct Tracked {
    id: u64,
    backend: usize,
    opened_s: f64,
    ok: u64,
    open: bool,
}

/// What the poller shares with the soak.
#[derive(Debug, Default)]
struct PollState {
    conns: Vec<Tracked>,
    failures: Vec<ConnFailure>,
    polls: u64,
    polls_ok: u64,
    new_connection_failures: u64,
}

impl PollState {
    fn open_on(&self, backend: usize) -> Vec<u64> {
        self.conns
            .iter()
            .filter(|c| c.open && c.backend == backend)
            .map(|c| c.id)
            .collect()
    }
}

/// Long-lived connections, polled from a thread inside the client's
/// namespace; stopped and joined on drop.
struct Poller {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<()>>>,
    state: Arc<Mutex<PollState>>,
}

fn backend_of(body: &str) -> Option<usize> {
    body.strip_prefix("backend-")?.parse().ok()
}

impl Poller {
    fn start(ns: &str, t0: Instant) -> Poller {
        let stop = Arc::new(AtomicBool::new(false));
        let state = Arc::new(Mutex::new(PollState::default()));
        let (name, stop2, st) = (ns.to_string(), Arc::clone(&stop), Arc::clone(&state));
        let thread = std::thread::spawn(move || -> Result<()> {
            crate::netns::enter(&name)?;
            let mut conns: Vec<(u64, HttpConn)> = Vec::new();
            let mut next_id = 0u64;
            while !stop2.load(Ordering::Relaxed) {
                let round = Instant::now();
                // Poll every open connection.
                let mut i = 0;
                while i < conns.len() && !stop2.load(Ordering::Relaxed) {
                    let id = conns[i].0;
                    let r = conns[i].1.get();
                    let now = since(t0);
                    let mut s = st.lock().unwrap_or_else(|p| p.into_inner());
                    s.polls += 1;
                    let Some(k) = s.conns.iter().position(|c| c.id == id) else {
                        conns.remove(i);
                        continue;
                    };
                    let want = s.conns[k].backend;
                    let error = match r {
                        Ok(body) if backend_of(&body) == Some(want) => None,
                        Ok(body) => Some(format!("answered by {body:?}: the connection moved")),
                        Err(e) => Some(e.to_string()),
                    };
                    match error {
                        None => {
                            s.polls_ok += 1;
                            s.conns[k].ok += 1;
                            i += 1;
                        }
                        Some(error) => {
                            s.conns[k].open = false;
                            let f = ConnFailure {
                                backend: want,
                                opened_s: s.conns[k].opened_s,
                                failed_s: now,
                                error,
                                explained_by: None,
                            };
                            s.failures.push(f);
                            drop(s);
                            conns.remove(i);
                        }
                    }
                }
                // Top up: up to LONG_LIVED_PER_BACKEND on every backend that
                // takes new connections.
                for _ in 0..2 * BACKENDS {
                    let counts = {
                        let s = st.lock().unwrap_or_else(|p| p.into_inner());
                        (1..=BACKENDS)
                            .map(|b| s.open_on(b).len())
                            .collect::<Vec<_>>()
                    };
                    if counts.iter().all(|&n| n >= LONG_LIVED_PER_BACKEND)
                        || stop2.load(Ordering::Relaxed)
                    {
                        break;
                    }
                    let opened = HttpConn::connect().and_then(|mut c| {
                        let body = c.get()?;
                        Ok((c, body))
                    });
                    let mut s = st.lock().unwrap_or_else(|p| p.into_inner());
                    match opened {
                        Ok((c, body)) => {
                            let Some(b) = backend_of(&body) else {
                                s.new_connection_failures += 1;
                                continue;
                            };
                            if counts.get(b - 1).copied().unwrap_or(usize::MAX)
                                < LONG_LIVED_PER_BACKEND
                            {
                                next_id += 1;
                                s.conns.push(Tracked {
                                    id: next_id,
                                    backend: b,
                                    opened_s: since(t0),
                                    ok: 1,
                                    open: true,
                                });
                                conns.push((next_id, c));
                            }
                            // Otherwise dropped: closed with a FIN.
                        }
                        Err(_) => s.new_connection_failures += 1,
                    }
                }
                let rest = Duration::from_millis(500).saturating_sub(round.elapsed());
                std::thread::sleep(rest);
            }
            Ok(())
        });
        Poller {
            stop,
            thread: Some(thread),
            state,
        }
    }

    fn with<T>(&self, f: impl FnOnce(&PollState) -> T) -> T {
        f(&self.state.lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn finish(mut self) -> Result<PollState> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().map_err(|_| {
                Error::Netns(netns::Error::ThreadPanicked(
                    "the long-lived connections' poller".into(),
                ))
            })??;
        }
        Ok(std::mem::take(
            &mut *self.state.lock().unwrap_or_else(|p| p.into_inner()),
        ))
    }
}

impl Drop for Poller {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What the soak does at a planned moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    StopNginx,
    StartNginx,
    KillDecap,
    StartDecap,
    LinkDown,
    LinkUp,
    AddToggled,
    RemoveToggled,
    BrokenReload,
    Drain,
    Undrain,
}

/// The actions of one cycle, at fractions of its length.
fn cycle_plan() -> Vec<(f64, Action)> {
    let mut v = vec![
        (0.05, Action::StopNginx),
        (0.15, Action::StartNginx),
        (0.22, Action::KillDecap),
        (0.32, Action::StartDecap),
        (0.40, Action::LinkDown),
        (0.50, Action::LinkUp),
    ];
    for k in 0..6 {
        let a = if k % 2 == 0 {
            Action::AddToggled
        } else {
            Action::RemoveToggled
        };
        v.push((0.55 + 0.035 * f64::from(k), a));
    }
    v.push((0.78, Action::BrokenReload));
    v.push((0.83, Action::Drain));
    v.push((0.97, Action::Undrain));
    v
}

/// A period during which a backend was faulted or out of the
/// configuration: its connections may fail.
#[derive(Debug, Clone)]
struct Window {
    label: String,
    backend: usize,
    from_s: f64,
    /// The repair (None: not yet).
    to_s: Option<f64>,
}

/// The configuration the soak wants: whether backend 5 is in, whether
/// backend 4 is drained.
#[derive(Debug, Clone, Copy, Default)]
struct Wanted {
    toggled_in: bool,
    drained: bool,
}

impl Wanted {
    fn backends(self) -> Vec<(usize, u32)> {
        let mut v = Vec::new();
        // First in the list: ids are by name, so its coming and going must
        // not disturb the others' connections.
        if self.toggled_in {
            v.push((TOGGLED, 1));
        }
        for b in 1..=4 {
            v.push((b, if b == DRAINED && self.drained { 0 } else { 1 }));
        }
        v
    }
}

/// Health per backend address from `/metrics`.
fn health_of(metrics: &str) -> BTreeMap<String, bool> {
    metrics
        .lines()
        .filter(|l| l.starts_with("fastpath_lb_backend_healthy{"))
        .filter_map(|l| {
            let addr = l.split("address=\"").nth(1)?.split('"').next()?;
            Some((addr.to_string(), l.trim_end().ends_with(" 1")))
        })
        .collect()
}

/// A gauge or counter without labels from `/metrics`.
fn metric(metrics: &str, name: &str) -> Option<u64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Posts a reload; Ok(generation) when applied, Err(answer) when refused.
fn reload(t: &Topology, slowest_ms: &mut f64) -> Result<std::result::Result<u64, String>> {
    let started = Instant::now();
    let answer = t.api("POST", "/reload")?;
    *slowest_ms = slowest_ms.max(started.elapsed().as_secs_f64() * 1e3);
    let v: serde_json::Value = serde_json::from_str(&answer).unwrap_or_default();
    Ok(
        match v.get("generation").and_then(serde_json::Value::as_u64) {
            Some(g) => Ok(g),
            None => Err(answer),
        },
    )
}

/// What a reload could change, from `/status`: reloads applied, reloads
/// rejected, and each VIP's backends by name.
fn applied_state(t: &Topology) -> Option<(u64, u64, Vec<Vec<String>>)> {
    let s: lbd::status::Status = serde_json::from_str(&t.api("GET", "/status").ok()?).ok()?;
    let names = s
        .vips
        .iter()
        .map(|v| v.backends.iter().map(|b| b.name.clone()).collect())
        .collect();
    Some((s.reloads, s.reload_failures, names))
}

/// A broken variant of the configuration `good`, a different kind each
/// cycle: what is wrong, and the text.
fn broken(good: &str, cycle: u32) -> (&'static str, String) {
    match cycle % 4 {
        1 => (
            "a VIP naming a pool that does not exist",
            good.replace("pool = \"web\"", "pool = \"nonexistent\""),
        ),
        2 => (
            "one backend address under two names",
            good.replacen(
                "backends = [",
                &format!(
                    "backends = [{{ address = \"{}\", name = \"again\" }}, ",
                    Topology::backend_address(1)
                ),
                1,
            ),
        ),
        3 => ("a TOML syntax error", good.replacen("[api]", "[api", 1)),
        _ => (
            "an unknown key",
            good.replacen("[forwarder]\n", "[forwarder]\nthreadz = 2\n", 1),
        ),
    }
}

/// Runs the soak with `fastpath` as the binary for `lb run` and `lb
/// decap`; `progress` gets a line for each step. Everything it creates is
/// removed at the end, also on error or when `stop` is set (SIGINT).
pub fn run(
    fastpath: &std::path::Path,
    opts: &Options,
    stop: &AtomicBool,
    progress: &mut dyn FnMut(&str),
) -> Result<Report> {
    let seconds = opts.seconds.max(30);
    let cycles = (seconds / 60).max(1) as u32;
    let cycle_s = seconds as f64 / f64::from(cycles);
    let check = || -> Result<()> {
        if stop.load(Ordering::Relaxed) {
            return Err(Error::Interrupted);
        }
        Ok(())
    };
    // The load generator, before anything is built (this runs no traffic).
    Command::new("wrk")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(|source| {
            Error::Netns(netns::Error::Spawn {
                program: "wrk, the soak's load generator (scripts/setup.sh installs it)".into(),
                source,
            })
        })?;
    progress(&format!(
        "building the topology: client, router (BIRD), load balancer, {BACKENDS} nginx backends with `fastpath lb decap`"
    ));
    let mut t = Topology::build(fastpath, BACKENDS, &opts.tag)?;
    check()?;
    let mut wanted = Wanted::default();
    t.set_backends(&wanted.backends())?;
    let conf = std::fs::read_to_string(&t.config).map_err(Error::io(t.config.display()))?;
    let health = "fall = 2 }";
    if !conf.contains(health) {
        return Err(Error::Netns(netns::Error::Failed {
            command: format!("ask for tunnel health checks in {}", t.config.display()),
            stderr: format!("no `{health}` in the pool's health line"),
        }));
    }
    std::fs::write(
        &t.config,
        conf.replace(health, "fall = 2, via = \"tunnel\" }"),
    )
    .map_err(Error::io(t.config.display()))?;
    let log = t.dir.join("lb.log");
    t.start_lb_logged(&log)?;
    t.wait_for_vip(Duration::from_secs(30))?;
    let addr = Topology::backend_address;
    // Every configured backend healthy through the tunnel before the load.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        check()?;
        let h = health_of(&t.api("GET", "/metrics").unwrap_or_default());
        if (1..=4).all(|b| h.get(&addr(b)) == Some(&true)) {
            break;
        }
        if Instant::now() > deadline {
            return Err(Error::Timeout {
                what: format!("backends 1-4 not all healthy through the tunnel within 15 s: {h:?}"),
                logs: String::new(),
            });
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let driver = t
        .api("GET", "/status")
        .ok()
        .and_then(|s| serde_json::from_str::<lbd::status::Status>(&s).ok())
        .map(|s| s.driver)
        .unwrap_or_default();
    progress(&format!("load balancer up ({driver}); VIP {VIP} answers"));

    let t0 = Instant::now();
    let run_start = opts.warmup_s as f64;
    let end_s = run_start + seconds as f64;
    let end = t0 + Duration::from_secs_f64(end_s);
    let client = t.client.name().to_string();
    let poller = Poller::start(&client, t0);
    let load = Load::start(&client, opts, t0, end);
    progress(&format!(
        "load: wrk keep-alive ({} connections) and Connection: close ({} connections) in {} s segments, {} long-lived connections per backend polled every 0.5 s; {} s warm-up",
        opts.keepalive_connections, opts.close_connections, opts.segment_s, LONG_LIVED_PER_BACKEND, opts.warmup_s
    ));

    let mut plan: Vec<(f64, u32, Action)> = Vec::new();
    for c in 0..cycles {
        for (f, a) in cycle_plan() {
            plan.push((run_start + (f64::from(c) + f) * cycle_s, c + 1, a));
        }
    }
    plan.reverse(); // popped from the back

    let mut report = Report {
        seconds,
        warmup_s: opts.warmup_s,
        cycles,
        driver,
        ..Report::default()
    };
    let mut windows: Vec<Window> = Vec::new();
    let mut samples: Vec<(f64, u64, u64)> = Vec::new(); // (s, rss KiB, pool in use)
    let mut was_healthy: BTreeMap<String, bool> = BTreeMap::new();
    let mut drain: Option<(Drain, Vec<u64>, u64)> = None; // record, conns, ok at start
    let mut last_progress = 0.0;
    loop {
        check()?;
        let now = since(t0);
        if now >= end_s {
            break;
        }
        let metrics = t.api("GET", "/metrics").unwrap_or_default();
        let health = health_of(&metrics);
        if let (Ok(rss), Some(pool)) = (t.lb_rss_kib(), metric(&metrics, "fastpath_lb_pool_in_use"))
        {
            samples.push((now, rss, pool));
        }
        if let Some(b) = metric(&metrics, "fastpath_lb_pool_buffers") {
            report.pool_buffers = b as u32;
        }
        // Detection times.
        for r in report.faults.iter_mut() {
            let h = health.get(&addr(r.backend)).copied();
            if r.out_after_s.is_none() && h == Some(false) {
                r.out_after_s = Some(now - r.at_s);
            }
            if let (Some(rep), None, Some(true)) = (r.repaired_at_s, r.back_after_s, h) {
                r.back_after_s = Some(now - rep);
            }
        }
        // A backend down while nothing was done to it.
        for (a, &h) in &health {
            let b = (1..=BACKENDS).find(|&b| addr(b) == *a).unwrap_or(0);
            let expected = report
                .faults
                .iter()
                .any(|r| r.backend == b && r.back_after_s.is_none());
            if !h && !expected && was_healthy.get(a).copied().unwrap_or(true) {
                report
                    .false_downs
                    .push(format!("backend {b} ({a}) marked down at {now:.1} s"));
            }
        }
        was_healthy = health;
        // Planned actions that are due.
        while plan.last().is_some_and(|p| p.0 <= now) {
            let Some((_, cycle, action)) = plan.pop() else {
                break;
            };
            check()?;
            let at = since(t0);
            // `took_effect`: when the fault began to act (see FaultRecord).
            let fault = |name: &str, backend: usize, took_effect: f64| FaultRecord {
                cycle,
                fault: name.to_string(),
                backend,
                at_s: took_effect,
                action_s: since(t0) - at,
                out_after_s: None,
                repaired_at_s: None,
                back_after_s: None,
            };
            let repaired = |report: &mut Report, windows: &mut Vec<Window>, backend: usize| {
                if let Some(r) = report
                    .faults
                    .iter_mut()
                    .rev()
                    .find(|r| r.backend == backend && r.repaired_at_s.is_none())
                {
                    r.repaired_at_s = Some(at);
                }
                if let Some(w) = windows
                    .iter_mut()
                    .rev()
                    .find(|w| w.backend == backend && w.to_s.is_none())
                {
                    w.to_s = Some(at);
                }
            };
            let open_window = |windows: &mut Vec<Window>, label: &str, backend: usize| {
                windows.push(Window {
                    label: format!("{label} (cycle {cycle}, {at:.1} s)"),
                    backend,
                    from_s: at,
                    to_s: None,
                });
            };
            match action {
                Action::StopNginx => {
                    t.procs.stop(&format!("nginx{NGINX_STOPPED}"));
                    report
                        .faults
                        .push(fault("nginx stopped", NGINX_STOPPED, at));
                    open_window(&mut windows, "nginx stopped", NGINX_STOPPED);
                }
                Action::StartNginx => {
                    t.start_nginx(NGINX_STOPPED)?;
                    repaired(&mut report, &mut windows, NGINX_STOPPED);
                }
                Action::KillDecap => {
                    t.procs.kill(&format!("decap{DECAP_KILLED}"));
                    report
                        .faults
                        .push(fault("decap agent killed (SIGKILL)", DECAP_KILLED, at));
                    open_window(&mut windows, "decap agent killed", DECAP_KILLED);
                }
                Action::StartDecap => {
                    t.start_decap(DECAP_KILLED)?;
                    repaired(&mut report, &mut windows, DECAP_KILLED);
                }
                Action::LinkDown => {
                    t.set_backend_link(LINK_CUT, false)?;
                    // In effect once `ip` has done it: starting `ip` on a
                    // loaded machine has taken over a second.
                    report.faults.push(fault("link down", LINK_CUT, since(t0)));
                    open_window(&mut windows, "link down", LINK_CUT);
                }
                Action::LinkUp => {
                    t.set_backend_link(LINK_CUT, true)?;
                    repaired(&mut report, &mut windows, LINK_CUT);
                }
                Action::AddToggled | Action::RemoveToggled | Action::Drain | Action::Undrain => {
                    match action {
                        Action::AddToggled => wanted.toggled_in = true,
                        Action::RemoveToggled => wanted.toggled_in = false,
                        Action::Drain => wanted.drained = true,
                        _ => wanted.drained = false,
                    }
                    t.set_backends(&wanted.backends())?;
                    match reload(&t, &mut report.reloads.slowest_ms)? {
                        Ok(_) => report.reloads.applied += 1,
                        Err(answer) => report
                            .reloads
                            .refused
                            .push(format!("{action:?} at {at:.1} s: {answer}")),
                    }
                    match action {
                        Action::AddToggled => {
                            repaired(&mut report, &mut windows, TOGGLED);
                        }
                        Action::RemoveToggled => {
                            open_window(&mut windows, "removed from the configuration", TOGGLED);
                        }
                        Action::Drain => {
                            let ids = poller.with(|s| s.open_on(DRAINED));
                            let ok = poller.with(|s| {
                                s.conns
                                    .iter()
                                    .filter(|c| ids.contains(&c.id))
                                    .map(|c| c.ok)
                                    .sum()
                            });
                            drain = Some((
                                Drain {
                                    cycle,
                                    at_s: at,
                                    connections: ids.len(),
                                    ..Drain::default()
                                },
                                ids,
                                ok,
                            ));
                        }
                        _ => {
                            if let Some((mut d, ids, ok0)) = drain.take() {
                                d.until_s = at;
                                poller.with(|s| {
                                    let mine = s.conns.iter().filter(|c| ids.contains(&c.id));
                                    d.polls_ok =
                                        mine.clone().map(|c| c.ok).sum::<u64>().saturating_sub(ok0);
                                    d.still_open = mine.filter(|c| c.open).count();
                                    // Opened while drained (the reload is
                                    // applied when its answer comes).
                                    d.new_connections = s
                                        .conns
                                        .iter()
                                        .filter(|c| {
                                            c.backend == DRAINED
                                                && c.opened_s > d.at_s
                                                && c.opened_s < at
                                        })
                                        .count();
                                });
                                report.drains.push(d);
                            }
                        }
                    }
                }
                Action::BrokenReload => {
                    let good = std::fs::read_to_string(&t.config)
                        .map_err(Error::io(t.config.display()))?;
                    let (what, bad) = broken(&good, cycle);
                    std::fs::write(&t.config, bad).map_err(Error::io(t.config.display()))?;
                    let before = applied_state(&t);
                    let answer = reload(&t, &mut report.reloads.slowest_ms);
                    let after = applied_state(&t);
                    std::fs::write(&t.config, &good).map_err(Error::io(t.config.display()))?;
                    report.reloads.broken_sent += 1;
                    let answer = match answer? {
                        Ok(g) => format!("applied (generation {g})"),
                        Err(a) => a,
                    };
                    let unchanged = matches!((&before, &after),
                        (Some(b), Some(a)) if a.0 == b.0 && a.1 == b.1 + 1 && a.2 == b.2);
                    if answer.contains("\"error\"") && unchanged {
                        report.reloads.broken_rejected += 1;
                    }
                    report
                        .reloads
                        .broken
                        .push(format!("{what}: {}", answer.trim()));
                }
            }
        }
        if now - last_progress >= 10.0 {
            last_progress = now;
            let (polls, broken) = poller.with(|s| (s.polls, s.failures.len()));
            progress(&format!(
                "{now:5.1} s of {end_s:.0}: {} faults so far, {} reloads, long-lived polls {polls} (failures {broken})",
                report.faults.len(),
                report.reloads.applied + report.reloads.broken_sent
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    progress("load finished; collecting the figures");
    let metrics = t.api("GET", "/metrics").unwrap_or_default();
    report.checks_inconclusive =
        metric(&metrics, "fastpath_lb_health_checks_inconclusive_total").unwrap_or(0);
    for l in metrics.lines() {
        let Some(rest) = l.strip_prefix("fastpath_lb_conntrack_events_total{event=\"") else {
            continue;
        };
        if let Some((k, v)) = rest.split_once("\"} ") {
            report
                .conntrack
                .insert(k.to_string(), v.trim().parse().unwrap_or(0));
        }
    }
    if let Some(n) = metric(&metrics, "fastpath_lb_conntrack_entries") {
        report.conntrack.insert("entries".into(), n);
    }
    if let Some(s) = t
        .api("GET", "/status")
        .ok()
        .and_then(|s| serde_json::from_str::<lbd::status::Status>(&s).ok())
    {
        report.drops = s.drops.into_iter().filter(|(_, v)| *v > 0).collect();
    }
    let polled = poller.finish()?;
    let segments = load.finish();
    report.elapsed_s = since(t0);

    // Start and end figures: medians over two seconds, under the same load.
    let figure = |pick: fn(&(f64, u64, u64)) -> u64| {
        let mut start: Vec<u64> = samples
            .iter()
            .filter(|s| s.0 >= run_start && s.0 < run_start + 2.0)
            .map(pick)
            .collect();
        let mid_s = run_start + seconds as f64 / 2.0;
        let mut middle: Vec<u64> = samples
            .iter()
            .filter(|s| s.0 >= mid_s && s.0 < mid_s + 2.0)
            .map(pick)
            .collect();
        let mut endv: Vec<u64> = samples
            .iter()
            .filter(|s| s.0 >= end_s - 2.0)
            .map(pick)
            .collect();
        StartEnd {
            start: measure::upper_median(&mut start).unwrap_or(0),
            middle: measure::upper_median(&mut middle).unwrap_or(0),
            end: measure::upper_median(&mut endv).unwrap_or(0),
            max: samples.iter().map(pick).max().unwrap_or(0),
        }
    };
    report.rss_kib = figure(|s| s.1);
    report.pool_in_use = figure(|s| s.2);
    let mut next = 0.0;
    for s in &samples {
        if s.0 >= next {
            report.samples.push((s.0, s.1, s.2));
            next = s.0 + 5.0;
        }
    }

    // Long-lived connections: explained by a window of their own backend,
    // or broken on a healthy one.
    let mut ll = LongLived {
        opened: polled.conns.len() as u64,
        polls: polled.polls,
        polls_ok: polled.polls_ok,
        new_connection_failures: polled.new_connection_failures,
        ..LongLived::default()
    };
    for mut f in polled.failures {
        f.explained_by = windows
            .iter()
            .find(|w| {
                w.backend == f.backend
                    && w.from_s <= f.failed_s
                    && w.to_s.is_none_or(|to| f.failed_s <= to + FAULT_GRACE_S)
            })
            .map(|w| w.label.clone());
        if f.explained_by.is_some() {
            ll.broken_on_faulted += 1;
        } else {
            ll.broken_on_healthy += 1;
        }
        ll.failures.push(f);
    }
    report.long_lived = ll;

    // wrk: the windows during which requests may fail, and how many.
    let mut disruptions: Vec<(String, f64, f64, f64)> = Vec::new(); // label, from, to, out after
    for r in &report.faults {
        let out = r
            .out_after_s
            .unwrap_or_else(|| r.repaired_at_s.unwrap_or(end_s) - r.at_s);
        disruptions.push((
            format!("{} on backend {} at {:.1} s", r.fault, r.backend, r.at_s),
            r.at_s,
            r.at_s + out + WRK_GRACE_S,
            out,
        ));
    }
    for w in windows.iter().filter(|w| w.backend == TOGGLED) {
        // A removal is applied when the reload answers: out at once.
        disruptions.push((w.label.clone(), w.from_s, w.from_s + WRK_GRACE_S, 0.0));
    }
    let mut load_totals: Vec<LoadTotals> = Vec::new();
    for (mode, conns) in [
        ("keep-alive", opts.keepalive_connections),
        ("close", opts.close_connections),
    ] {
        load_totals.push(LoadTotals {
            mode: mode.to_string(),
            connections: conns,
            ..LoadTotals::default()
        });
    }
    // Each mode's median rate over the run.
    let mut typical_rate: BTreeMap<String, f64> = BTreeMap::new();
    for mode in ["keep-alive", "close"] {
        let mut rates: Vec<f64> = segments
            .iter()
            .filter(|s| s.mode == mode && s.end_s > s.start_s)
            .map(|s| s.sent() as f64 / (s.end_s - s.start_s))
            .collect();
        rates.sort_by(f64::total_cmp);
        if let Some(&m) = rates.get(rates.len() / 2) {
            typical_rate.insert(mode.to_string(), m);
        }
    }
    for mut s in segments {
        let conns = if s.mode == "close" {
            opts.close_connections
        } else {
            opts.keepalive_connections
        };
        let rate = (s.sent() as f64 / (s.end_s - s.start_s).max(0.1))
            .max(typical_rate.get(&s.mode).copied().unwrap_or(0.0));
        for d in &disruptions {
            if d.1 < s.end_s && s.start_s < d.2 {
                s.overlaps.push(d.0.clone());
                s.bound += Report::failure_bound(rate, d.3, conns);
            }
        }
        if let Some(l) = load_totals.iter_mut().find(|l| l.mode == s.mode) {
            l.sent += s.sent();
            l.completed += s.completed;
            l.failed += s.failed();
            if s.overlaps.is_empty() {
                l.failed_outside_faults += s.failed();
            }
            l.segments += 1;
        }
        report.segments.push(s);
    }
    report.requests_sent = load_totals.iter().map(|l| l.sent).sum();
    report.requests_failed = load_totals.iter().map(|l| l.failed).sum();
    report.load = load_totals;
    report.goals = goals(&report);
    // The topology (namespaces, processes, files) goes when `t` drops.
    t.procs.stop("lb");
    // Its warnings and errors, for diagnosis (health changes among them).
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let noted: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("WARN") || l.contains("ERROR"))
        .collect();
    report.lb_log = noted[noted.len().saturating_sub(LOG_LINES)..]
        .iter()
        .map(|l| l.to_string())
        .collect();
    Ok(report)
}

/// Judges the report against the goals.
fn goals(r: &Report) -> Vec<Goal> {
    let mut g = Vec::new();
    let mut goal = |goal: &str, met: bool, detail: String| {
        g.push(Goal {
            goal: goal.to_string(),
            met,
            detail,
        })
    };
    let ll = &r.long_lived;
    goal(
        "0 established connections broken on backends that stayed healthy",
        ll.broken_on_healthy == 0 && ll.polls_ok > 0,
        format!(
            "{} broken of {} opened ({} polls answered); {} broken on faulted backends",
            ll.broken_on_healthy, ll.opened, ll.polls_ok, ll.broken_on_faulted
        ),
    );
    let drained_conns: usize = r.drains.iter().map(|d| d.connections).sum();
    let drained_kept: usize = r.drains.iter().map(|d| d.still_open).sum();
    let drained_new: usize = r.drains.iter().map(|d| d.new_connections).sum();
    goal(
        "a drained backend keeps its established connections and takes no new ones",
        !r.drains.is_empty()
            && drained_conns > 0
            && drained_kept == drained_conns
            && drained_new == 0
            && r.drains.iter().all(|d| d.connections == 0 || d.polls_ok > 0),
        format!(
            "{} drain(s): {drained_kept} of {drained_conns} connections kept, {} answers during drains, {drained_new} new connections reached it",
            r.drains.len(),
            r.drains.iter().map(|d| d.polls_ok).sum::<u64>()
        ),
    );
    let slowest = r
        .faults
        .iter()
        .map(|f| f.out_after_s.unwrap_or(f64::INFINITY))
        .fold(0.0, f64::max);
    goal(
        &format!("every failed backend out within {REMOVAL_BOUND_S} s"),
        !r.faults.is_empty() && slowest <= REMOVAL_BOUND_S,
        format!(
            "{} faults, slowest out after {slowest:.2} s",
            r.faults.len()
        ),
    );
    let not_back = r.faults.iter().filter(|f| f.back_after_s.is_none()).count();
    goal(
        "every repaired backend healthy again",
        not_back == 0,
        format!("{not_back} not back"),
    );
    goal(
        "no backend marked down while nothing was done to it",
        r.false_downs.is_empty(),
        if r.false_downs.is_empty() {
            "none".to_string()
        } else {
            r.false_downs.join("; ")
        },
    );
    let outside: u64 = r.load.iter().map(|l| l.failed_outside_faults).sum();
    let over: Vec<String> = r
        .segments
        .iter()
        .filter(|s| !s.overlaps.is_empty() && s.failed() > s.bound)
        .map(|s| {
            format!(
                "{} {:.1}-{:.1} s: {} failed, bound {}",
                s.mode,
                s.start_s,
                s.end_s,
                s.failed(),
                s.bound
            )
        })
        .collect();
    goal(
        "requests fail only around faults, within the bound",
        outside == 0 && over.is_empty() && r.requests_sent > 0,
        format!(
            "{} of {} failed; {outside} outside fault windows; segments over their bound: {}",
            r.requests_failed,
            r.requests_sent,
            if over.is_empty() {
                "none".to_string()
            } else {
                over.join("; ")
            }
        ),
    );
    goal(
        "good reloads applied, broken ones rejected with nothing changed",
        r.reloads.refused.is_empty()
            && r.reloads.applied > 0
            && r.reloads.broken_sent > 0
            && r.reloads.broken_rejected == r.reloads.broken_sent,
        format!(
            "{} applied, {} refused, broken {} of {} rejected unchanged",
            r.reloads.applied,
            r.reloads.refused.len(),
            r.reloads.broken_rejected,
            r.reloads.broken_sent
        ),
    );
    goal(
        &format!("no RSS growth (margin {RSS_MARGIN_KIB} KiB)"),
        r.rss_kib.start > 0 && r.rss_kib.end <= r.rss_kib.start + RSS_MARGIN_KIB,
        format!(
            "{} KiB -> {} KiB ({:+} KiB)",
            r.rss_kib.start,
            r.rss_kib.end,
            r.rss_kib.end as i64 - r.rss_kib.start as i64
        ),
    );
    let judged = r.cycles >= 2;
    goal(
        &format!("no RSS growth over the second half (margin {RSS_SECOND_HALF_MARGIN_KIB} KiB; runs of 2 cycles or more)"),
        !judged || r.rss_kib.end <= r.rss_kib.middle + RSS_SECOND_HALF_MARGIN_KIB,
        if judged {
            format!(
                "{} KiB -> {} KiB ({:+} KiB)",
                r.rss_kib.middle,
                r.rss_kib.end,
                r.rss_kib.end as i64 - r.rss_kib.middle as i64
            )
        } else {
            "not judged: one cycle".to_string()
        },
    );
    goal(
        &format!("no packet-pool growth (margin {POOL_MARGIN} buffers)"),
        r.pool_buffers > 0 && r.pool_in_use.end <= r.pool_in_use.start + u64::from(POOL_MARGIN),
        format!(
            "{} -> {} of {} buffers in use",
            r.pool_in_use.start, r.pool_in_use.end, r.pool_buffers
        ),
    );
    g
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrk_summaries_parse() {
        let out = "Running 3s test @ http://192.0.2.80/\n  1 threads and 8 connections\n  Thread Stats   Avg      Stdev     Max   +/- Stdev\n    Latency   631.66us  337.43us   9.33ms   84.06%\n    Req/Sec    12.7k     1.0k   14.3k    72.00%\n  63171 requests in 3.00s, 9.70MB read\n  Socket errors: connect 2, read 3, write 1, timeout 4\n  Non-2xx or 3xx responses: 5\nRequests/sec:  12633.70\nTransfer/sec:      1.94MB\n";
        let mut s = Segment::default();
        assert!(parse_wrk(out, &mut s));
        assert_eq!(
            (
                s.completed,
                s.connect_errors,
                s.read_errors,
                s.write_errors,
                s.timeouts,
                s.non_2xx
            ),
            (63171, 2, 3, 1, 4, 5)
        );
        assert_eq!(s.sent(), 63171 + 10);
        assert_eq!(s.failed(), 15);
        let mut clean = Segment::default();
        assert!(parse_wrk(
            "  10 requests in 1.00s, 1KB read\nRequests/sec: 10\n",
            &mut clean
        ));
        assert_eq!((clean.completed, clean.failed()), (10, 0));
        assert!(!parse_wrk("unable to connect", &mut Segment::default()));
    }

    #[test]
    fn health_and_metrics_parse() {
        let m = "# HELP x\nfastpath_lb_backend_healthy{backend=\"10.10.3.2\",address=\"10.10.3.2\"} 1\n\
                 fastpath_lb_backend_healthy{backend=\"10.10.4.2\",address=\"10.10.4.2\"} 0\n\
                 fastpath_lb_pool_in_use 300\nfastpath_lb_pool_in_use_other 1\n";
        let h = health_of(m);
        assert_eq!(h.get("10.10.3.2"), Some(&true));
        assert_eq!(h.get("10.10.4.2"), Some(&false));
        assert_eq!(metric(m, "fastpath_lb_pool_in_use"), Some(300));
        assert_eq!(metric(m, "fastpath_lb_pool"), None);
    }

    #[test]
    fn the_plan_keeps_its_order_and_backend_5_ends_out() {
        let p = cycle_plan();
        assert!(p.windows(2).all(|w| w[0].0 < w[1].0));
        assert!(p.iter().all(|(f, _)| *f > 0.0 && *f < 1.0));
        let adds = p.iter().filter(|x| x.1 == Action::AddToggled).count();
        let removes = p.iter().filter(|x| x.1 == Action::RemoveToggled).count();
        assert_eq!(
            adds, removes,
            "each cycle starts and ends without backend 5"
        );
        let w = Wanted {
            toggled_in: true,
            drained: true,
        };
        assert_eq!(w.backends(), vec![(5, 1), (1, 1), (2, 1), (3, 1), (4, 0)]);
    }
}
