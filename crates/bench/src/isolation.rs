//! Isolation between the switch's ports: one port attacks the switch while
//! a victim pair of ring ports forwards beside it, and the victim's rate
//! under attack is compared with its rate in the window just before, in
//! the same run (`fastpath switch bench --part isolation`).
//!
//! The switch runs in this process, on its own thread
//! ([`vswitch::spawn`]), with a control socket, a memif socket and two
//! vhost-user ports in a temporary directory. Over the control socket two
//! ring ports attach, each locked to its MAC: the victim sender `a`, which
//! sends unicast frames to `b` as fast as its ring takes them, and the
//! victim receiver `b`, which counts the frames of that flow. A third ring
//! port sends a trickle of broadcasts all along (calm windows and attacked
//! ones alike), so that the switch delivers to every port, the attacker's
//! included. Each [`Attack`] then runs for one window:
//!
//! - `irq-blocked`: a ring port clears `O_NONBLOCK` on the interrupt
//!   eventfd its attach handed it and fills the counter to 2^64-2, so that
//!   a blocking signal from the switch would sleep for ever;
//! - `rx-loop`: a vhost-user guest (the [`vhost_peer`] frontend, on its own
//!   thread, talking to the switch over its socket) posts 32,768 receive
//!   chains that each loop on themselves, offered again whenever returned;
//! - `tx-long`: a vhost-user guest keeps transmitting chains of 32,768
//!   descriptors (one legal chain through the whole table of a 32,768-entry
//!   ring, offered over and over);
//! - `spoof`: a ring port, locked to its own address as ring ports are by
//!   default, sends as fast as it can with the victim receiver's MAC as its
//!   source, and counts the victim flow's frames it is given (stolen
//!   frames);
//! - `idle-memif`: 64 memif connections that never say a word are held
//!   open, and a well-formed memif client (written here from the memif
//!   protocol: HELLO, INIT, ADD_REGION, ADD_RING x2, CONNECT), trying
//!   again every 100 ms when turned away as libmemif does, is timed from
//!   its first try until it is attached.
//!
//! For each window the report has the victim's rate and its ratio to the
//! calm window before it, the sender's offered rate and how often it found
//! its ring full (the generator was not the limit when the ring was full),
//! the latency of the status request, asked every 100 ms on a thread of its
//! own, the process's open descriptors and resident memory before, during
//! and after the attack (the switch is in this process: the counts include
//! the benchmark's own, which are constant), and whether, once the
//! attacker has gone, a new pair of ring ports attaches and forwards.
//! Every figure is taken `repeats` times, each time on a fresh switch, and
//! shown as min/median/max.
//!
//! Where the threads ran: with three CPUs or more, the switch, the sender
//! and the receiver are pinned one to a CPU, and with four or more the
//! attacker, the trickle and the status thread share a fourth; with fewer,
//! nothing is pinned and the report says so. On a 2-core machine the
//! attacker's own CPU time (a real attacker spends its guest's) comes out
//! of the victim's: the ratio there bounds the switch's isolation from
//! below.
//!
//! The entry point is [`run`] with [`Options`]; [`Report::to_text`] prints
//! the table, and the report serializes to JSON.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ring::control::{attach, recv_msg, send_msg, status, AttachRequest, Attached, Conn};
use ring::Mode;
use rustix::fs::{fcntl_getfl, fcntl_setfl, OFlags};
use serde::{Deserialize, Serialize};
use vhost_peer::{Guest, Layout, RawDesc, F_NEXT, F_WRITE, LARGE_BUFS, LARGE_MEM};
use vswitch::pktgen::udp_frame;
use vswitch::ports::vhost::Config as VhostConfig;
use vswitch::{spawn, Config, Switch};

/// One way a port attacks the switch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Attack {
    /// A ring port blocks and fills its interrupt eventfd.
    IrqBlocked,
    /// A vhost-user guest's receive chains loop.
    RxLoop,
    /// A vhost-user guest transmits chains of 32,768 descriptors.
    TxLong,
    /// A ring port sends with the victim receiver's MAC.
    Spoof,
    /// 64 idle memif connections, then a memif client attaches.
    IdleMemif,
}

impl Attack {
    /// Every attack, in the order they run.
    pub const ALL: [Attack; 5] = [
        Attack::IrqBlocked,
        Attack::RxLoop,
        Attack::TxLong,
        Attack::Spoof,
        Attack::IdleMemif,
    ];

    /// The attack's name in the report and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Attack::IrqBlocked => "irq-blocked",
            Attack::RxLoop => "rx-loop",
            Attack::TxLong => "tx-long",
            Attack::Spoof => "spoof",
            Attack::IdleMemif => "idle-memif",
        }
    }

    /// What the attacker does, in a line.
    pub fn describe(self) -> &'static str {
        match self {
            Attack::IrqBlocked => {
                "ring port clears O_NONBLOCK on its irq eventfd and fills it to 2^64-2; broadcasts reach it"
            }
            Attack::RxLoop => {
                "vhost-user guest posts 32,768 receive chains that loop; broadcasts reach it"
            }
            Attack::TxLong => "vhost-user guest transmits chains of 32,768 descriptors, over and over",
            Attack::Spoof => "ring port (locked to its own address, as ring ports are by default) sends at full speed from the victim receiver's MAC",
            Attack::IdleMemif => "64 idle memif connections held open; a memif client (trying again every 100 ms, as libmemif does) attaches",
        }
    }
}

impl std::str::FromStr for Attack {
    type Err = Error;
    fn from_str(s: &str) -> Result<Attack, Error> {
        Attack::ALL
            .into_iter()
            .find(|a| a.name() == s)
            .ok_or_else(|| Error::UnknownAttack(s.to_string()))
    }
}

/// What to run.
#[derive(Clone, Debug)]
pub struct Options {
    /// Length of each window, calm and attacked (default 2 s).
    pub window: Duration,
    /// Runs of the whole sequence, each on a fresh switch (default 3).
    pub repeats: usize,
    /// The attacks, in order (default: [`Attack::ALL`]).
    pub attacks: Vec<Attack>,
    /// How often the status thread asks (default 100 ms).
    pub status_every: Duration,
    /// Broadcasts per second of the trickle (default 1,000).
    pub trickle_fps: u32,
    /// Where the sockets go (default: a fresh directory under the system's
    /// temporary directory, removed at the end).
    pub dir: Option<PathBuf>,
    /// Say on stderr what runs, step by step (default: off).
    pub progress: bool,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            window: Duration::from_secs(2),
            repeats: 3,
            attacks: Attack::ALL.to_vec(),
            status_every: Duration::from_millis(100),
            trickle_fps: 1000,
            dir: None,
            progress: false,
        }
    }
}

/// Why the benchmark could not run (an attack that works is a result, not
/// an error: it shows in the report).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An attack name that is not one of [`Attack::ALL`].
    #[error("unknown attack {0:?} (irq-blocked, rx-loop, tx-long, spoof, idle-memif)")]
    UnknownAttack(String),
    /// `repeats` or `window` is zero.
    #[error("repeats and window must be above zero")]
    Empty,
    /// The socket directory could not be made.
    #[error("socket directory {}", path.display())]
    Dir {
        /// The directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The switch could not be made or started.
    #[error("starting the switch")]
    Switch(#[source] vswitch::Error),
    /// A ring port of the benchmark's own could not attach.
    #[error("attaching ring port {port}")]
    Attach {
        /// The port's name.
        port: String,
        /// Why.
        #[source]
        source: ring::Error,
    },
    /// A thread could not be started.
    #[error("starting thread {name}")]
    Thread {
        /// The thread's name.
        name: &'static str,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// An attacker could not set itself up (before attacking).
    #[error("setting up attacker {attack}: {why}")]
    Attacker {
        /// The attack.
        attack: &'static str,
        /// What failed.
        why: String,
    },
}

/// Three figures of one quantity over the repeats.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Spread {
    /// The least.
    pub min: f64,
    /// The median (the mean of the middle two for an even count).
    pub median: f64,
    /// The greatest.
    pub max: f64,
}

impl Spread {
    /// The spread of `v` (NaN figures when empty; NaN values sort last).
    pub fn of(v: &[f64]) -> Spread {
        if v.is_empty() {
            return Spread {
                min: f64::NAN,
                median: f64::NAN,
                max: f64::NAN,
            };
        }
        let mut s = v.to_vec();
        s.sort_by(|a, b| a.total_cmp(b));
        let n = s.len();
        let median = if n % 2 == 1 {
            s[n / 2]
        } else {
            (s[n / 2 - 1] + s[n / 2]) / 2.0
        };
        Spread {
            min: s[0],
            median,
            max: s[n - 1],
        }
    }

    fn text(&self, digits: usize) -> String {
        format!(
            "{:.d$}/{:.d$}/{:.d$}",
            self.min,
            self.median,
            self.max,
            d = digits
        )
    }
}

/// One attack's figures over the repeats.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Row {
    /// The attack's name ([`Attack::name`]).
    pub attack: String,
    /// What the attacker does.
    pub what: String,
    /// Victim frames/s received in the calm window before the attack.
    pub calm_fps: Spread,
    /// Victim frames/s received under attack.
    pub attacked_fps: Spread,
    /// `attacked_fps / calm_fps`, per repeat (the goal: at least 0.9).
    pub ratio: Spread,
    /// Frames/s the victim's sender put into its ring, calm window.
    pub offered_calm_fps: Spread,
    /// Frames/s the victim's sender put into its ring, under attack.
    pub offered_attacked_fps: Spread,
    /// Fraction of the sender's tries under attack that found its ring
    /// full: above zero, the switch, not the generator, set the pace.
    pub sender_ring_full: Spread,
    /// Median latency of the status request under attack, ms.
    pub status_median_ms: Spread,
    /// Longest latency of the status request under attack, ms (one still
    /// unanswered at the end of the window counts with its age).
    pub status_max_ms: Spread,
    /// Status requests answered under attack, all repeats together.
    pub status_answered: u64,
    /// Status requests that failed or were still unanswered at the end of
    /// the window, all repeats together.
    pub status_failed: u64,
    /// Open descriptors of this process just before the attack.
    pub fds_before: Spread,
    /// Open descriptors at the end of the attacked window.
    pub fds_during: Spread,
    /// Open descriptors after the attacker left and the new pair was
    /// checked.
    pub fds_after: Spread,
    /// Resident memory before the attack, KiB.
    pub rss_before_kib: Spread,
    /// Resident memory at the end of the attacked window, KiB.
    pub rss_during_kib: Spread,
    /// Resident memory after the attacker left, KiB.
    pub rss_after_kib: Spread,
    /// Repeats in which, after the attacker left, a new pair of ring ports
    /// attached and forwarded.
    pub recovered: usize,
    /// Repeats run.
    pub repeats: usize,
    /// The attack's own figure, when it has one: `stolen_frames` (spoof),
    /// `memif_attach_ms` (idle-memif; NaN where the client was turned
    /// away), `chains_taken` (tx-long), `chains_returned` (rx-loop).
    pub detail: Option<(String, Spread)>,
    /// The switch's work for the attacker under attack, per second, from
    /// its status: `desc_reads_per_s` (the attacking vhost-user queue's
    /// descriptor reads: tx-long, rx-loop) or `frames_taken_per_s` (the
    /// spoofing port's frames the switch took, all refused). It tells the
    /// switch's share from the machine's: on a small machine the
    /// attacker's own thread takes CPU from the victim's too.
    pub attacker_work: Option<(String, Spread)>,
    /// Share of the attacked window the switch held the attacker back
    /// (its descriptor budget spent, or a hold for refused frames).
    pub attacker_held: Option<Spread>,
    /// What went wrong in a repeat (an attach that was refused, a status
    /// that failed), once each.
    pub notes: Vec<String>,
}

impl Row {
    /// The goals this row misses: victim below 90 % of its calm rate,
    /// status slower than 100 ms or failing, no recovery, descriptors not
    /// back to where they were (within 8).
    pub fn shortfalls(&self) -> Vec<String> {
        let mut out = Vec::new();
        if below(self.ratio.min, 0.9) {
            out.push(format!(
                "victim kept {:.0}% of its rate (goal 90%)",
                self.ratio.min * 100.0
            ));
        }
        if above(self.status_max_ms.max, 100.0) || self.status_failed > 0 {
            out.push(format!(
                "status took up to {:.1} ms, {} failed (goal 100 ms)",
                self.status_max_ms.max, self.status_failed
            ));
        }
        if self.recovered < self.repeats {
            out.push(format!(
                "a new pair forwarded after {} of {} attacks",
                self.recovered, self.repeats
            ));
        }
        if above(self.fds_after.max, self.fds_before.max + 8.0) {
            out.push(format!(
                "descriptors {} before, {} after",
                self.fds_before.max, self.fds_after.max
            ));
        }
        out
    }
}

/// `x` is under `goal`, or was not measured (NaN).
fn below(x: f64, goal: f64) -> bool {
    x.is_nan() || x < goal
}

/// `x` is over `goal`, or was not measured (NaN).
fn above(x: f64, goal: f64) -> bool {
    x.is_nan() || x > goal
}

/// The benchmark's result.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Report {
    /// Window length, seconds.
    pub window_s: f64,
    /// Repeats run.
    pub repeats: usize,
    /// CPUs this process may run on.
    pub cpus: usize,
    /// Where each thread ran: (thread, "cpu N" or "unpinned ...").
    pub placement: Vec<(String, String)>,
    /// Broadcasts per second of the trickle.
    pub trickle_fps: u32,
    /// One row per attack.
    pub rows: Vec<Row>,
}

impl Report {
    /// The table, one row per attack, and what each column is.
    pub fn to_text(&self) -> String {
        let mut s = format!(
            "switch isolation: victim ring pair a -> b (unicast, MAC-locked) beside one attacker; \
             {:.1} s windows, calm window just before each attack; {} repeat(s), min/median/max; \
             trickle {} broadcasts/s\n",
            self.window_s, self.repeats, self.trickle_fps
        );
        s += &format!("threads ({} CPUs): ", self.cpus);
        s += &self
            .placement
            .iter()
            .map(|(t, w)| format!("{t}: {w}"))
            .collect::<Vec<_>>()
            .join(", ");
        s += "\n\n";
        s += &format!(
            "{:<12} {:>10} {:>10} {:>17} {:>10} {:>10} {:>7} {:>17} {:>10} {:>13} {:>15} {:>9} {:>17}  {}\n",
            "attack",
            "calm f/s",
            "attack f/s",
            "ratio",
            "offered calm",
            "offered/s",
            "full",
            "status med/max ms",
            "status ok",
            "fds b/d/a",
            "rss MiB b/d/a",
            "recovered",
            "attacker work/held",
            "detail"
        );
        for r in &self.rows {
            let detail = match &r.detail {
                Some((name, v)) => format!("{name} {}", v.text(1)),
                None => String::new(),
            };
            let work = match (&r.attacker_work, &r.attacker_held) {
                (Some((_, w)), Some(h)) => {
                    format!("{:.2}M/{:.0}%", w.median / 1e6, h.median * 100.0)
                }
                _ => "-".into(),
            };
            s += &format!(
                "{:<12} {:>10.0} {:>10.0} {:>17} {:>10.0} {:>10.0} {:>6.0}% {:>17} {:>10} {:>13} {:>15} {:>9} {:>17}  {}\n",
                r.attack,
                r.calm_fps.median,
                r.attacked_fps.median,
                r.ratio.text(3),
                r.offered_calm_fps.median,
                r.offered_attacked_fps.median,
                r.sender_ring_full.median * 100.0,
                format!("{:.1}/{:.1}", r.status_median_ms.median, r.status_max_ms.max),
                format!("{}/{}", r.status_answered, r.status_answered + r.status_failed),
                format!(
                    "{:.0}/{:.0}/{:.0}",
                    r.fds_before.max, r.fds_during.max, r.fds_after.max
                ),
                format!(
                    "{:.0}/{:.0}/{:.0}",
                    r.rss_before_kib.max / 1024.0,
                    r.rss_during_kib.max / 1024.0,
                    r.rss_after_kib.max / 1024.0
                ),
                format!("{}/{}", r.recovered, r.repeats),
                work,
                detail
            );
        }
        s += "\nratio: victim frames/s under attack over the calm window before it (goal >= 0.9); \
              offered: frames/s the victim's sender queued under attack; full: its tries that found \
              the ring full (> 0: the switch set the pace, not the generator); status: \
              ring::control::status every 100 ms under attack (goal <= 100 ms); fds/rss: this \
              process, which holds the switch (before / end of attack / after it left); \
              recovered: a new ring pair attached and forwarded after the attacker left; \
              attacker work/held: the switch's work for the attacker under attack, from its status \
              (tx-long, rx-loop: millions of descriptor reads/s of the attacking queue, bounded by \
              vhost::datapath::DESC_RATE beyond 2 a chain; spoof: millions of the thief's frames/s \
              the switch took, all refused), and the share of the window it was held back. \
              Where offered/s falls below offered calm while the attacker's work stays bounded, the \
              attacker's own thread took the victim's CPU: the machine's share, not the switch's.\n";
        for r in &self.rows {
            s += &format!("{}: {}\n", r.attack, r.what);
            let short = r.shortfalls();
            if !short.is_empty() {
                s += &format!("  misses: {}\n", short.join("; "));
            }
            for n in &r.notes {
                s += &format!("  note: {n}\n");
            }
        }
        s
    }
}

/// Run the benchmark: for each repeat a fresh switch, the victim pair and
/// the trickle, then for each attack a calm window and an attacked one.
pub fn run(opts: &Options) -> Result<Report, Error> {
    if opts.repeats == 0 || opts.window.is_zero() {
        return Err(Error::Empty);
    }
    let cpus = crate::cpus::allowed();
    let place = Placement::new(&cpus);
    let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); opts.attacks.len()];
    for rep in 0..opts.repeats {
        let dir = match &opts.dir {
            Some(d) => d.join(format!("rep{rep}")),
            None => std::env::temp_dir().join(format!("fp-isolation-{}-{rep}", std::process::id())),
        };
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|source| Error::Dir {
            path: dir.clone(),
            source,
        })?;
        let r = one_run(opts, &place, &dir);
        let _ = std::fs::remove_dir_all(&dir);
        for (i, s) in r?.into_iter().enumerate() {
            samples[i].push(s);
        }
    }
    let rows = opts
        .attacks
        .iter()
        .zip(samples)
        .map(|(a, s)| row(*a, &s))
        .collect();
    Ok(Report {
        window_s: opts.window.as_secs_f64(),
        repeats: opts.repeats,
        cpus: cpus.len(),
        placement: place.describe(cpus.len()),
        trickle_fps: opts.trickle_fps,
        rows,
    })
}

// ---------------------------------------------------------------------
// One repeat.

const MAC_A: [u8; 6] = [2, 0x15, 0, 0, 0, 0xa];
const MAC_B: [u8; 6] = [2, 0x15, 0, 0, 0, 0xb];
const MAC_TRICKLE: [u8; 6] = [2, 0x15, 0, 0, 0, 0xc];
const MAC_EVIL: [u8; 6] = [2, 0x15, 0, 0, 0, 0xe];
const MAC_THIEF: [u8; 6] = [2, 0x15, 0, 0, 0, 0xf];
const BROADCAST: [u8; 6] = [0xff; 6];
const FRAME: usize = 60;
/// The largest split ring virtio allows: what the vhost-user attackers use.
const BIG_RING: u16 = 32768;
/// The vhost-user guests' receive and transmit queues.
const RXQ: usize = 0;
const TXQ: usize = 1;
/// How many silent memif connections the idle-memif attacker holds.
const IDLE_MEMIF: usize = 64;
/// How long a step of the benchmark's own (an attach, a recovery check, a
/// thread's exit) may take before it counts as failed.
const STEP: Duration = Duration::from_secs(3);

/// What one attack measured in one repeat.
#[derive(Clone, Debug, Default)]
struct Sample {
    calm_fps: f64,
    attacked_fps: f64,
    offered_calm_fps: f64,
    offered_attacked_fps: f64,
    sender_full: f64,
    status_ms: Vec<f64>,
    status_failed: u64,
    fds: [f64; 3],
    rss_kib: [f64; 3],
    recovered: bool,
    detail: Option<(&'static str, f64)>,
    /// (what, per second, share of the window held back).
    attacker_work: Option<(&'static str, f64, f64)>,
    notes: Vec<String>,
}

fn row(a: Attack, s: &[Sample]) -> Row {
    let col = |f: &dyn Fn(&Sample) -> f64| Spread::of(&s.iter().map(f).collect::<Vec<_>>());
    let median = |v: &[f64]| Spread::of(v).median;
    let max = |v: &[f64]| v.iter().copied().fold(f64::NAN, f64::max);
    let mut notes: Vec<String> = Vec::new();
    for n in s.iter().flat_map(|s| s.notes.iter()) {
        if !notes.contains(n) {
            notes.push(n.clone());
        }
    }
    Row {
        attack: a.name().into(),
        what: a.describe().into(),
        calm_fps: col(&|s| s.calm_fps),
        attacked_fps: col(&|s| s.attacked_fps),
        ratio: col(&|s| s.attacked_fps / s.calm_fps),
        offered_calm_fps: col(&|s| s.offered_calm_fps),
        offered_attacked_fps: col(&|s| s.offered_attacked_fps),
        sender_ring_full: col(&|s| s.sender_full),
        status_median_ms: col(&|s| median(&s.status_ms)),
        status_max_ms: col(&|s| max(&s.status_ms)),
        status_answered: s.iter().map(|s| s.status_ms.len() as u64).sum(),
        status_failed: s.iter().map(|s| s.status_failed).sum(),
        fds_before: col(&|s| s.fds[0]),
        fds_during: col(&|s| s.fds[1]),
        fds_after: col(&|s| s.fds[2]),
        rss_before_kib: col(&|s| s.rss_kib[0]),
        rss_during_kib: col(&|s| s.rss_kib[1]),
        rss_after_kib: col(&|s| s.rss_kib[2]),
        recovered: s.iter().filter(|s| s.recovered).count(),
        repeats: s.len(),
        detail: s.first().and_then(|f| f.detail).map(|(name, _)| {
            let v: Vec<f64> = s.iter().filter_map(|s| s.detail.map(|d| d.1)).collect();
            (name.to_string(), Spread::of(&v))
        }),
        attacker_work: s.first().and_then(|f| f.attacker_work).map(|(name, _, _)| {
            let v: Vec<f64> = s
                .iter()
                .filter_map(|s| s.attacker_work.map(|w| w.1))
                .collect();
            (name.to_string(), Spread::of(&v))
        }),
        attacker_held: s.first().and_then(|f| f.attacker_work).map(|_| {
            Spread::of(
                &s.iter()
                    .filter_map(|s| s.attacker_work.map(|w| w.2))
                    .collect::<Vec<_>>(),
            )
        }),
        notes,
    }
}

/// The counters the victim's threads keep.
#[derive(Default)]
struct Victim {
    stop: AtomicBool,
    /// Frames the sender queued.
    sent: AtomicU64,
    /// Times the sender tried to queue.
    tries: AtomicU64,
    /// Times it found its ring full.
    full: AtomicU64,
    /// Frames of the flow a -> b the receiver got.
    received: AtomicU64,
}

impl Victim {
    fn snapshot(&self) -> [u64; 4] {
        [
            self.sent.load(Relaxed),
            self.tries.load(Relaxed),
            self.full.load(Relaxed),
            self.received.load(Relaxed),
        ]
    }
}

/// A started switch and the benchmark's own ports and threads; stops them
/// when dropped.
struct Rig {
    ctl: PathBuf,
    memif: PathBuf,
    vhost: [PathBuf; 2],
    switch_stop: Arc<AtomicBool>,
    switch: Option<JoinHandle<Switch>>,
    victim: Arc<Victim>,
    threads: Vec<JoinHandle<()>>,
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.victim.stop.store(true, Relaxed);
        for t in self.threads.drain(..) {
            join_within(t, STEP);
        }
        self.switch_stop.store(true, Relaxed);
        if let Some(h) = self.switch.take() {
            join_within(h, STEP);
        }
    }
}

/// Join `h` if it ends within `limit`; otherwise leave it behind (a thread
/// stuck on a switch that hangs cannot be stopped from outside, and the
/// report already says the switch hung).
fn join_within<T>(h: JoinHandle<T>, limit: Duration) -> Option<T> {
    let end = Instant::now() + limit;
    while !h.is_finished() {
        if Instant::now() >= end {
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    h.join().ok()
}

fn ring_port(ctl: &Path, name: &str, mode: Mode, mac: Option<[u8; 6]>) -> Result<Attached, Error> {
    attach(
        ctl,
        &AttachRequest {
            name: name.into(),
            mode,
            itr: 0,
            slots: 256,
            buf_size: 2048,
            mac,
        },
    )
    .map_err(|source| Error::Attach {
        port: name.into(),
        source,
    })
}

fn thread(
    name: &'static str,
    cpu: Option<usize>,
    f: impl FnOnce() + Send + 'static,
) -> Result<JoinHandle<()>, Error> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            if let Some(c) = cpu {
                crate::cpus::pin_current(c);
            }
            f()
        })
        .map_err(|source| Error::Thread { name, source })
}

fn start(opts: &Options, place: &Placement, dir: &Path) -> Result<Rig, Error> {
    let ctl = dir.join("ctl.sock");
    let memif = dir.join("memif.sock");
    let vhost = [dir.join("rxloop.sock"), dir.join("txlong.sock")];
    let sw = Switch::new(Config {
        socket: Some(ctl.clone()),
        memif_socket: Some(memif.clone()),
        log_ports: false,
        vhost_user: vec![
            VhostConfig::new("rxloop", &vhost[0]),
            VhostConfig::new("txlong", &vhost[1]),
        ],
        ..Config::default()
    })
    .map_err(Error::Switch)?;
    let (switch_stop, h) = spawn(sw).map_err(Error::Switch)?;
    if let Some(c) = place.switch {
        crate::cpus::pin_thread(&h, c);
    }
    let victim = Arc::new(Victim::default());
    let mut rig = Rig {
        ctl,
        memif,
        vhost,
        switch_stop,
        switch: Some(h),
        victim: victim.clone(),
        threads: Vec::new(),
    };
    let a = ring_port(&rig.ctl, "victim-a", Mode::Csb, Some(MAC_A))?;
    let b = ring_port(&rig.ctl, "victim-b", Mode::Csb, Some(MAC_B))?;
    let t = ring_port(&rig.ctl, "trickle", Mode::Csb, Some(MAC_TRICKLE))?;

    // Each thread takes its whole port, connection included: a closure
    // that named only `.driver` would capture just that field, and the
    // control connection, dropped here, would detach the port.
    let v = victim.clone();
    rig.threads
        .push(thread("iso-sender", place.sender, move || {
            let mut a = a;
            let frame = udp_frame(FRAME, MAC_A, MAC_B);
            while !v.stop.load(Relaxed) {
                let k = a.driver.send(64, |_, buf| {
                    buf[..FRAME].copy_from_slice(&frame);
                    FRAME
                });
                v.tries.fetch_add(1, Relaxed);
                v.sent.fetch_add(k as u64, Relaxed);
                if k == 0 {
                    v.full.fetch_add(1, Relaxed);
                    a.driver.wait_tx(Duration::from_millis(1));
                }
                // Broadcasts come here too; take them so the ring stays
                // serviceable, and drop them.
                a.driver.recv(256, |_| {});
            }
        })?);
    let v = victim.clone();
    rig.threads
        .push(thread("iso-receiver", place.receiver, move || {
            let mut b = b;
            while !v.stop.load(Relaxed) {
                let mut mine = 0u64;
                let n = b.driver.recv(256, |f| {
                    if f.len() >= 12 && f[6..12] == MAC_A {
                        mine += 1;
                    }
                });
                v.received.fetch_add(mine, Relaxed);
                if n == 0 {
                    b.driver.wait_rx(Duration::from_millis(1));
                }
            }
        })?);
    let v = victim.clone();
    let every = Duration::from_secs(1) / opts.trickle_fps.max(1);
    rig.threads
        .push(thread("iso-trickle", place.attacker, move || {
            let mut t = t;
            let frame = udp_frame(FRAME, MAC_TRICKLE, BROADCAST);
            let mut next = Instant::now();
            while !v.stop.load(Relaxed) {
                t.driver.send(1, |_, buf| {
                    buf[..FRAME].copy_from_slice(&frame);
                    FRAME
                });
                t.driver.recv(256, |_| {});
                next += every;
                let now = Instant::now();
                if next > now {
                    std::thread::sleep(next - now);
                } else {
                    next = now;
                }
            }
        })?);
    Ok(rig)
}

fn one_run(opts: &Options, place: &Placement, dir: &Path) -> Result<Vec<Sample>, Error> {
    let rig = start(opts, place, dir)?;
    // The victim's rings fill and the switch learns the addresses.
    std::thread::sleep(Duration::from_millis(200));
    let mut out = Vec::new();
    let say = |what: &str| {
        if opts.progress {
            eprintln!("isolation: {what}");
        }
    };
    for (k, &attack) in opts.attacks.iter().enumerate() {
        say(&format!("{}: calm window", attack.name()));
        let mut s = Sample::default();
        let calm = window(&rig, opts, place);
        s.calm_fps = calm.fps;
        s.offered_calm_fps = calm.offered_fps;
        s.fds[0] = open_fds();
        s.rss_kib[0] = rss_kib();
        say(&format!("{}: attacking", attack.name()));
        let attacker = Attacker::start(attack, &rig, place)?;
        // Let the attack take hold before measuring.
        std::thread::sleep(Duration::from_millis(100));
        let work0 = attacker_work(&rig.ctl, attack);
        let t = Instant::now();
        let w = window(&rig, opts, place);
        let work1 = attacker_work(&rig.ctl, attack);
        let secs = t.elapsed().as_secs_f64();
        if let (Some((name, a0, h0)), Some((_, a1, h1))) = (work0, work1) {
            s.attacker_work = Some((name, (a1 - a0) / secs, (h1 - h0) / 1e6 / secs));
        }
        s.fds[1] = open_fds();
        s.rss_kib[1] = rss_kib();
        s.attacked_fps = w.fps;
        s.offered_attacked_fps = w.offered_fps;
        s.sender_full = w.full;
        s.status_ms = w.status_ms;
        s.status_failed = w.status_failed;
        s.notes.extend(w.notes);
        say(&format!("{}: attacker leaves", attack.name()));
        let (detail, notes) = attacker.stop();
        s.detail = detail;
        s.notes.extend(notes);
        std::thread::sleep(Duration::from_millis(100));
        say(&format!("{}: a new pair attaches", attack.name()));
        match recovers(&rig.ctl, k) {
            Ok(ok) => s.recovered = ok,
            Err(e) => s.notes.push(format!("recovery check: {}", chain(&e))),
        }
        // The switch closes the ports of a connection that has gone on its
        // next pass; give it that before counting what it still holds.
        std::thread::sleep(Duration::from_millis(100));
        s.fds[2] = open_fds();
        s.rss_kib[2] = rss_kib();
        out.push(s);
    }
    Ok(out)
}

/// The switch's count of its work for the attacker of `attack`, from its
/// status: (what it is, the count, microseconds the attacker was held
/// back). None for attacks without such a count, or when status fails.
fn attacker_work(ctl: &Path, attack: Attack) -> Option<(&'static str, f64, f64)> {
    let doc = status(ctl).ok()?;
    let port = |name: &str| {
        doc["ports"]
            .as_array()?
            .iter()
            .find(|p| p["name"] == name)
            .cloned()
    };
    let queue = |name: &str, q: &str| {
        let p = port(name)?;
        let q = &p["detail"]["queues"][q];
        Some((
            "desc_reads_per_s",
            q["desc_reads"].as_f64()?,
            q["held_back_us"].as_f64()?,
        ))
    };
    match attack {
        Attack::TxLong => queue("txlong", "tx"),
        Attack::RxLoop => queue("rxloop", "rx"),
        Attack::Spoof => {
            let p = port("thief")?;
            Some((
                "frames_taken_per_s",
                p["from_port"].as_f64()?,
                p["spoof_held_us"].as_f64()?,
            ))
        }
        _ => None,
    }
}

/// What one window measured.
struct Window {
    fps: f64,
    offered_fps: f64,
    full: f64,
    status_ms: Vec<f64>,
    status_failed: u64,
    notes: Vec<String>,
}

/// What the status thread saw: latencies of the answered requests (ms),
/// failures, and what failed (once each).
type Polled = (Vec<f64>, u64, Vec<String>);

/// Measure the victim over one window while a thread asks for the status
/// every `status_every`.
fn window(rig: &Rig, opts: &Options, place: &Placement) -> Window {
    let stop = Arc::new(AtomicBool::new(false));
    let lat: Arc<Mutex<Polled>> = Arc::default();
    // When the request in flight started, in µs since `t0`; 0: none.
    let t0 = Instant::now();
    let inflight = Arc::new(AtomicU64::new(0));
    let (st, l2, in2, ctl, every, cpu) = (
        stop.clone(),
        lat.clone(),
        inflight.clone(),
        rig.ctl.clone(),
        opts.status_every,
        place.attacker,
    );
    let poller = thread("iso-status", cpu, move || {
        let mut next = Instant::now();
        while !st.load(Relaxed) {
            let t = Instant::now();
            in2.store((t - t0).as_micros() as u64 + 1, Relaxed);
            let r = status(&ctl);
            let ms = t.elapsed().as_secs_f64() * 1e3;
            in2.store(0, Relaxed);
            if let Ok(mut l) = l2.lock() {
                match r {
                    Ok(_) => l.0.push(ms),
                    Err(e) => {
                        l.1 += 1;
                        let n = format!("status failed: {e}");
                        if !l.2.contains(&n) {
                            l.2.push(n);
                        }
                    }
                }
            }
            next += every;
            let now = Instant::now();
            if next > now {
                std::thread::sleep(next - now);
            } else {
                next = now;
            }
        }
    });
    let before = rig.victim.snapshot();
    let t = Instant::now();
    std::thread::sleep(opts.window);
    let after = rig.victim.snapshot();
    let secs = t.elapsed().as_secs_f64();
    stop.store(true, Relaxed);
    let mut stuck = None;
    let mut started = None;
    match poller {
        Ok(h) => {
            if join_within(h, STEP).is_none() {
                let since = inflight.load(Relaxed);
                stuck = Some(if since == 0 {
                    f64::NAN
                } else {
                    (t0.elapsed().as_micros() as u64).saturating_sub(since - 1) as f64 / 1e3
                });
            }
        }
        Err(e) => started = Some(format!("no status thread: {}", chain(&e))),
    }
    let (mut status_ms, mut failed, mut notes) = match lat.lock() {
        Ok(l) => l.clone(),
        Err(_) => (Vec::new(), 0, Vec::new()),
    };
    notes.extend(started);
    if let Some(age) = stuck {
        failed += 1;
        notes.push(format!("a status request was unanswered after {age:.0} ms"));
        if age.is_finite() {
            status_ms.push(age);
        }
    }
    let d = |i: usize| after[i].saturating_sub(before[i]) as f64;
    Window {
        fps: d(3) / secs,
        offered_fps: d(0) / secs,
        full: if d(1) > 0.0 { d(2) / d(1) } else { 0.0 },
        status_ms,
        status_failed: failed,
        notes,
    }
}

/// After the attacker left: a new pair of ring ports attaches, and one
/// forwards to the other.
fn recovers(ctl: &Path, k: usize) -> Result<bool, Error> {
    let mac_x = [2, 0x15, 1, 0, k as u8, 1];
    let mac_y = [2, 0x15, 1, 0, k as u8, 2];
    let mut x = ring_port(ctl, &format!("fresh{k}-x"), Mode::Csb, Some(mac_x))?;
    let mut y = ring_port(ctl, &format!("fresh{k}-y"), Mode::Csb, Some(mac_y))?;
    let frame = udp_frame(FRAME, mac_x, mac_y);
    let end = Instant::now() + STEP;
    while Instant::now() < end {
        x.driver.send(8, |_, buf| {
            buf[..FRAME].copy_from_slice(&frame);
            FRAME
        });
        x.driver.flush(Duration::from_millis(20));
        let mut got = 0;
        y.driver.recv(256, |f| {
            if f.len() >= 12 && f[6..12] == mac_x {
                got += 1;
            }
        });
        if got > 0 {
            return Ok(true);
        }
        y.driver.wait_rx(Duration::from_millis(5));
        x.driver.recv(256, |_| {});
    }
    Ok(false)
}

// ---------------------------------------------------------------------
// The attackers.

/// A running attacker: what it holds, and its thread, which returns the
/// attack's own figure.
struct Attacker {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Option<(&'static str, f64)>>>,
    detail: Option<(&'static str, f64)>,
    notes: Vec<String>,
}

impl Attacker {
    fn start(a: Attack, rig: &Rig, place: &Placement) -> Result<Attacker, Error> {
        let stop = Arc::new(AtomicBool::new(false));
        let mut at = Attacker {
            stop: stop.clone(),
            thread: None,
            detail: None,
            notes: Vec::new(),
        };
        let fail = |why: String| Error::Attacker {
            attack: a.name(),
            why,
        };
        let spawn_attacker = |f: Box<dyn FnOnce() -> Option<(&'static str, f64)> + Send>| {
            let cpu = place.attacker;
            std::thread::Builder::new()
                .name(format!("iso-{}", a.name()))
                .spawn(move || {
                    if let Some(c) = cpu {
                        crate::cpus::pin_current(c);
                    }
                    f()
                })
                .map_err(|source| Error::Thread {
                    name: "attacker",
                    source,
                })
        };
        match a {
            Attack::IrqBlocked => {
                let evil = ring_port(&rig.ctl, "evil", Mode::Base, Some(MAC_EVIL))?;
                let irq = evil.driver.irq_fd().as_fd();
                // Fill the counter while the descriptor is still
                // non-blocking: a write of 2^64-2 succeeds only onto an
                // empty counter, and the switch may signal between our
                // read and our write (a blocking write would then sleep
                // here for ever, as the attack means the switch's to).
                let full = 0xffff_ffff_ffff_fffeu64.to_ne_bytes();
                let end = Instant::now() + STEP;
                loop {
                    let mut b = [0u8; 8];
                    let _ = rustix::io::read(irq, &mut b);
                    match rustix::io::write(irq, &full) {
                        Ok(8) => break,
                        Ok(n) => return Err(fail(format!("filling the counter: wrote {n} bytes"))),
                        Err(rustix::io::Errno::AGAIN) if Instant::now() < end => {}
                        Err(e) => return Err(fail(format!("filling the counter: {e}"))),
                    }
                }
                let fl = fcntl_getfl(irq).map_err(|e| fail(format!("F_GETFL: {e}")))?;
                fcntl_setfl(irq, fl - OFlags::NONBLOCK)
                    .map_err(|e| fail(format!("clearing O_NONBLOCK: {e}")))?;
                // It does nothing more: the trickle's broadcasts make the
                // switch signal it. It leaves when told to.
                at.thread = Some(spawn_attacker(Box::new(move || {
                    while !stop.load(Relaxed) {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    drop(evil);
                    None
                }))?);
            }
            Attack::RxLoop | Attack::TxLong => {
                let path = rig.vhost[usize::from(a == Attack::TxLong)].clone();
                let (tx, rx) = mpsc::channel();
                at.thread = Some(spawn_attacker(Box::new(move || {
                    let q = [Layout::large(0, BIG_RING), Layout::large(1, BIG_RING)];
                    let g = Guest::attach(&path, LARGE_MEM, q, vhost_peer::REPLY_TIMEOUT);
                    let g = match g {
                        Ok(g) => {
                            let _ = tx.send(Ok(()));
                            g
                        }
                        Err(e) => {
                            let _ = tx.send(Err(chain(&e)));
                            return None;
                        }
                    };
                    if a == Attack::RxLoop {
                        Some(("chains_returned", rx_loop(g, &stop)))
                    } else {
                        Some(("chains_taken", tx_long(g, &stop)))
                    }
                }))?);
                match rx.recv_timeout(STEP) {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => return Err(fail(e)),
                    Err(_) => return Err(fail("the vhost-user attach did not finish".into())),
                }
            }
            Attack::Spoof => {
                // Ring ports are locked by default: the thief has an address of its
                // own and sends from the victim's, which port security drops.
                let thief = ring_port(&rig.ctl, "thief", Mode::Csb, Some(MAC_THIEF))?;
                at.thread = Some(spawn_attacker(Box::new(move || {
                    let mut thief = thief;
                    let forged = udp_frame(FRAME, MAC_B, MAC_A);
                    let mut stolen = 0u64;
                    while !stop.load(Relaxed) {
                        thief.driver.send(64, |_, buf| {
                            buf[..FRAME].copy_from_slice(&forged);
                            FRAME
                        });
                        thief.driver.recv(256, |f| {
                            if f.len() >= 12 && f[..6] == MAC_B && f[6..12] == MAC_A {
                                stolen += 1;
                            }
                        });
                    }
                    Some(("stolen_frames", stolen as f64))
                }))?);
            }
            Attack::IdleMemif => {
                let mut idle = Vec::with_capacity(IDLE_MEMIF);
                for _ in 0..IDLE_MEMIF {
                    match Conn::connect(&rig.memif) {
                        Ok(c) => idle.push(c),
                        Err(e) => {
                            at.notes
                                .push(format!("idle connection {} refused: {e}", idle.len()));
                            break;
                        }
                    }
                }
                // Let the switch take them all before the client comes.
                std::thread::sleep(Duration::from_millis(50));
                // A real memif client (libmemif, DPDK's net_memif) tries
                // again on a timer when it is turned away: so does this one,
                // every 100 ms until the switch's handshake deadline has
                // passed twice. The figure is the time from its first try.
                let t = Instant::now();
                let give_up = t + 2 * vswitch::HANDSHAKE_TIMEOUT;
                let attached = loop {
                    match memif::attach(&rig.memif, STEP) {
                        Ok(c) => break Ok(c),
                        Err(e) if Instant::now() >= give_up => break Err(e),
                        Err(_) => std::thread::sleep(Duration::from_millis(100)),
                    }
                };
                match attached {
                    Ok(client) => {
                        at.detail = Some(("memif_attach_ms", t.elapsed().as_secs_f64() * 1e3));
                        drop(client);
                    }
                    Err(e) => {
                        at.detail = Some(("memif_attach_ms", f64::NAN));
                        at.notes.push(format!(
                            "a memif client beside {} idle connections, trying every 100 ms, was still turned away after {:.0} ms: {e}",
                            idle.len(),
                            t.elapsed().as_secs_f64() * 1e3
                        ));
                    }
                }
                at.thread = Some(spawn_attacker(Box::new(move || {
                    while !stop.load(Relaxed) {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    drop(idle);
                    None
                }))?);
            }
        }
        Ok(at)
    }

    /// Tell the attacker to leave; its figure and notes.
    fn stop(mut self) -> (Option<(&'static str, f64)>, Vec<String>) {
        self.stop.store(true, Relaxed);
        if let Some(t) = self.thread.take() {
            match join_within(t, STEP) {
                Some(Some(d)) => self.detail = Some(d),
                Some(None) => {}
                None => self.notes.push("the attacker's thread did not end".into()),
            }
        }
        (self.detail, self.notes)
    }
}

/// The attacker's guest sleeps this long between looks at its rings: a
/// guest's vCPU is its own, not the switch's; spinning here would only
/// take the victim's CPU on a small machine.
const GUEST_NAP: Duration = Duration::from_micros(200);

/// Every receive descriptor chained to itself, all of them available, and
/// offered again whenever the switch returns them. Returns the chains the
/// switch returned.
fn rx_loop(mut g: Guest, stop: &AtomicBool) -> f64 {
    for i in 0..BIG_RING {
        g.put_desc(
            RXQ,
            i,
            RawDesc {
                addr: LARGE_BUFS + u64::from(i % 64) * vhost_peer::BUF,
                len: 64,
                flags: F_WRITE | F_NEXT,
                next: i,
            },
        );
        g.push_avail(RXQ, i, i);
    }
    g.publish(RXQ, BIG_RING);
    let (mut back, mut total) = (0usize, 0u64);
    while !stop.load(Relaxed) {
        let n = g.take_used(RXQ).len();
        back += n;
        total += n as u64;
        if back >= usize::from(BIG_RING) {
            back -= usize::from(BIG_RING);
            let idx = g.avail_idx[RXQ].wrapping_add(BIG_RING);
            g.publish(RXQ, idx);
        }
        std::thread::sleep(GUEST_NAP);
    }
    g.wire.shutdown();
    total as f64
}

/// One legal chain through the whole transmit table (32,767 empty
/// descriptors, then the frame), offered in every entry of the available
/// ring and again whenever the switch returns it. Returns the chains the
/// switch took.
fn tx_long(mut g: Guest, stop: &AtomicBool) -> f64 {
    let hdr = vhost_peer::HDR;
    g.mem.write(LARGE_BUFS, &[0u8; 12]);
    g.mem
        .write(LARGE_BUFS + hdr, &udp_frame(FRAME, MAC_EVIL, BROADCAST));
    for i in 0..BIG_RING {
        let last = i == BIG_RING - 1;
        g.put_desc(
            TXQ,
            i,
            RawDesc {
                addr: if last {
                    LARGE_BUFS
                } else {
                    LARGE_BUFS + vhost_peer::BUF
                },
                len: if last { hdr as u32 + FRAME as u32 } else { 0 },
                flags: if last { 0 } else { F_NEXT },
                next: i.wrapping_add(1) % BIG_RING,
            },
        );
    }
    for k in 0..BIG_RING {
        g.push_avail(TXQ, k, 0);
    }
    g.publish(TXQ, BIG_RING);
    let mut total = 0u64;
    while !stop.load(Relaxed) {
        let back = g.take_used(TXQ).len() as u16;
        if back > 0 {
            total += u64::from(back);
            let idx = g.avail_idx[TXQ].wrapping_add(back);
            g.publish(TXQ, idx);
        }
        std::thread::sleep(GUEST_NAP);
    }
    g.wire.shutdown();
    total as f64
}

/// A well-formed memif client (slave), written from the memif protocol:
/// the switch is the master on its memif socket.
mod memif {
    use super::*;
    use std::os::fd::{AsRawFd, FromRawFd};

    /// Message types.
    const ACK: u16 = 1;
    const HELLO: u16 = 2;
    const INIT: u16 = 3;
    const ADD_REGION: u16 = 4;
    const ADD_RING: u16 = 5;
    const CONNECT: u16 = 6;
    const CONNECTED: u16 = 7;
    const MSG: usize = 128;
    const VERSION: u16 = 0x0200;
    /// The ring header's cookie.
    const COOKIE: u32 = 0x3E31F20;
    /// log2 of the descriptors per ring.
    const LOG2_RING: u8 = 8;
    /// A ring: 128-byte header and 256 descriptors of 16 bytes.
    const RING_BYTES: usize = 128 + 16 * (1 << LOG2_RING);
    /// Two rings, then 256 buffers of 2 KiB.
    const REGION: usize = 2 * RING_BYTES + (1 << LOG2_RING) * 2048;

    /// What the client holds while connected.
    pub(super) struct Client {
        _conn: Conn,
        _region: OwnedFd,
        _irq: [OwnedFd; 2],
    }

    fn msg(ty: u16, fill: impl FnOnce(&mut [u8; MSG])) -> [u8; MSG] {
        let mut m = [0u8; MSG];
        m[..2].copy_from_slice(&ty.to_le_bytes());
        fill(&mut m);
        m
    }

    fn io(what: &str) -> impl FnOnce(std::io::Error) -> String + '_ {
        move |e| format!("{what}: {e}")
    }

    /// The type of the next message, or why there is none.
    fn next(c: &Conn) -> Result<u16, String> {
        match recv_msg(c.fd()) {
            Ok(Some((m, _))) if m.len() >= 2 => Ok(u16::from_le_bytes([m[0], m[1]])),
            Ok(Some(_)) => Err("a message too short to have a type".into()),
            Ok(None) => Err("the switch closed the connection".into()),
            Err(e) => Err(format!("no message: {e}")),
        }
    }

    fn expect(c: &Conn, want: u16, after: &str) -> Result<(), String> {
        match next(c)? {
            t if t == want => Ok(()),
            t => Err(format!("message type {t} after {after} (expected {want})")),
        }
    }

    /// Attach: every message awaited at most `limit`.
    pub(super) fn attach(path: &Path, limit: Duration) -> Result<Client, String> {
        let c = Conn::connect(path).map_err(|e| format!("connect: {e}"))?;
        rustix::net::sockopt::set_socket_timeout(
            &c,
            rustix::net::sockopt::Timeout::Recv,
            Some(limit),
        )
        .map_err(|e| format!("SO_RCVTIMEO: {e}"))?;
        expect(&c, HELLO, "connecting")?;
        let send = |m: &[u8], fds: &[i32]| send_msg(c.fd(), m, fds).map_err(|e| e.to_string());
        send(
            &msg(INIT, |m| {
                m[2..4].copy_from_slice(&VERSION.to_le_bytes());
                m[33..41].copy_from_slice(b"isolate\0");
            }),
            &[],
        )?;
        expect(&c, ACK, "INIT")?;
        let region = memfd(REGION).map_err(io("region"))?;
        send(
            &msg(ADD_REGION, |m| {
                m[4..12].copy_from_slice(&(REGION as u64).to_le_bytes())
            }),
            &[region.as_raw_fd()],
        )?;
        expect(&c, ACK, "ADD_REGION")?;
        let irq = [
            eventfd().map_err(io("eventfd"))?,
            eventfd().map_err(io("eventfd"))?,
        ];
        for (k, (flags, off)) in [(1u16, 0usize), (0u16, RING_BYTES)].into_iter().enumerate() {
            send(
                &msg(ADD_RING, |m| {
                    m[2..4].copy_from_slice(&flags.to_le_bytes());
                    m[8..12].copy_from_slice(&(off as u32).to_le_bytes());
                    m[12] = LOG2_RING;
                }),
                &[irq[k].as_raw_fd()],
            )?;
            expect(&c, ACK, "ADD_RING")?;
        }
        send(&msg(CONNECT, |_| ()), &[])?;
        expect(&c, CONNECTED, "CONNECT")?;
        Ok(Client {
            _conn: c,
            _region: region,
            _irq: irq,
        })
    }

    /// A sealed memfd of `size` bytes with both rings' cookies written.
    fn memfd(size: usize) -> std::io::Result<OwnedFd> {
        let fd = rustix::fs::memfd_create(
            "isolation-memif",
            rustix::fs::MemfdFlags::CLOEXEC | rustix::fs::MemfdFlags::ALLOW_SEALING,
        )?;
        rustix::fs::ftruncate(&fd, size as u64)?;
        for off in [0u64, RING_BYTES as u64] {
            rustix::io::pwrite(&fd, &COOKIE.to_le_bytes(), off)?;
        }
        rustix::fs::fcntl_add_seals(&fd, rustix::fs::SealFlags::SHRINK)?;
        Ok(fd)
    }

    fn eventfd() -> std::io::Result<OwnedFd> {
        // SAFETY: eventfd returns a fresh descriptor or -1, checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: fd is fresh and owned by nobody else.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }
}

// ---------------------------------------------------------------------
// This process: descriptors, memory, CPUs.

fn open_fds() -> f64 {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count() as f64)
        .unwrap_or(f64::NAN)
}

fn rss_kib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(f64::NAN)
}

/// Which CPU each thread is pinned to (none: unpinned).
struct Placement {
    switch: Option<usize>,
    sender: Option<usize>,
    receiver: Option<usize>,
    /// The attacker, the trickle and the status thread.
    attacker: Option<usize>,
}

impl Placement {
    /// The switch, the sender and the receiver one to a CPU where there
    /// are three; the rest on a fourth where there are four.
    fn new(cpus: &[usize]) -> Placement {
        if cpus.len() < 3 {
            return Placement {
                switch: None,
                sender: None,
                receiver: None,
                attacker: None,
            };
        }
        Placement {
            switch: Some(cpus[0]),
            sender: Some(cpus[1]),
            receiver: Some(cpus[2]),
            attacker: cpus.get(3).copied(),
        }
    }

    fn describe(&self, n: usize) -> Vec<(String, String)> {
        let w = |c: Option<usize>| match c {
            Some(c) => format!("cpu {c}"),
            None => format!("unpinned, {n} CPUs"),
        };
        vec![
            ("switch".into(), w(self.switch)),
            ("sender".into(), w(self.sender)),
            ("receiver".into(), w(self.receiver)),
            ("attacker, trickle, status".into(), w(self.attacker)),
        ]
    }
}

/// An error and its sources, on one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s += &format!(": {c}");
        src = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spreads_take_min_median_max() {
        let s = Spread::of(&[3.0, 1.0, 2.0]);
        assert_eq!((s.min, s.median, s.max), (1.0, 2.0, 3.0));
        assert_eq!(Spread::of(&[1.0, 2.0, 3.0, 10.0]).median, 2.5);
        assert!(Spread::of(&[]).median.is_nan());
    }

    #[test]
    fn attacks_parse_by_name() {
        for a in Attack::ALL {
            assert_eq!(a.name().parse::<Attack>().ok(), Some(a));
        }
        assert!("nope".parse::<Attack>().is_err());
    }

    #[test]
    fn threads_are_pinned_only_with_three_cpus() {
        assert!(Placement::new(&[0, 1]).switch.is_none());
        let p = Placement::new(&[0, 1, 2]);
        assert_eq!(
            (p.switch, p.sender, p.receiver, p.attacker),
            (Some(0), Some(1), Some(2), None)
        );
        assert_eq!(Placement::new(&[4, 5, 6, 7]).attacker, Some(7));
    }
}
