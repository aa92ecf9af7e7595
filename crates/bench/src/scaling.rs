//! `fastpath lb bench --scaling`: how the forwarder's rate grows with its
//! threads, in the two ways it spreads work over cores, in one run.
//!
//! - `per_queue`: N receive queues, one in-memory port each, one worker per
//!   queue running to completion (receive, forward, transmit on one
//!   thread; [`Datapath::run_queues`], as AF_XDP with a socket per queue).
//!   The flows are spread over the queues as the NIC's RSS would spread
//!   them, here by the steering hash (the flow hash with
//!   [`lb::worker::STEER_SEED`], scaled to the queue count as steering
//!   scales it to its threads), so each queue sees its own flows.
//! - `steering`: one port, the steering thread and N packet threads (the
//!   paper's design).
//! - `null_per_queue` and `null_steering`: the same with the null forwarder
//!   (parse, swap addresses): the limit of the machine for each.
//!
//! With several queues a run ends when the first queue has offered its
//! share (every queue stops receiving then, and what was received is
//! forwarded): the rate is that of all queues loaded at once, as a NIC
//! keeps loading every queue, and not of the slowest queue running alone
//! at the end. `offered` says how many frames that was.
//!
//! Each port replays pre-built 64-byte non-SYN frames (4096 established
//! flows): the generator is a copy of a template into the buffer, in the
//! thread that receives, as a NIC's DMA writes it, so it needs no core of
//! its own; its rate alone (copying into buffers, no forwarding) is
//! measured and reported beside, to show it is not the limit. Per-queue
//! workers and the steering thread are pinned one to a CPU when there are
//! enough CPUs (and the CPU each ran on reported); packet threads behind
//! steering are left to the scheduler.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use measure::{median, Table};
use netio::mem::{MemPort, Vary};
use netio::{Nic, PortStats, Slot};
use serde::Serialize;

use lb::config::Config;
use lb::datapath::{Datapath, Params};
use lb::tables::Control;
use lb::worker::Mode;

use crate::forwarder::{shares, Error, Run};

/// The modes, in report order.
pub const MODES: [&str; 4] = ["per_queue", "steering", "null_per_queue", "null_steering"];

/// Parameters.
#[derive(Debug, Clone, Serialize)]
pub struct ScalingConfig {
    /// Packets per run, all queues together.
    pub packets: u64,
    /// Thread counts (per-queue workers, or packet threads behind one
    /// steering thread); 1 is always measured, as efficiency needs it.
    pub threads: Vec<usize>,
    /// Runs per cell (median reported).
    pub repeats: usize,
}

impl ScalingConfig {
    /// 1 to the CPUs less one (at least 2, at most 16) threads, 4 million
    /// packets, 3 runs.
    pub fn full() -> Self {
        let cores = cpus();
        ScalingConfig {
            packets: 4_000_000,
            threads: (1..=cores.saturating_sub(1).clamp(2, 16)).collect(),
            repeats: 3,
        }
    }

    /// A few seconds.
    pub fn quick() -> Self {
        ScalingConfig {
            packets: 500_000,
            repeats: 1,
            ..Self::full()
        }
    }
}

/// CPUs this process may run on.
fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// One mode at one thread count.
#[derive(Debug, Clone, Serialize)]
pub struct Cell {
    /// Million packets per second, all threads together.
    pub mpps: f64,
    /// `mpps` / threads.
    pub mpps_per_thread: f64,
    /// `mpps` / (threads x the same mode's one-thread rate).
    pub efficiency: f64,
    /// Frames the ports offered in the median run: `packets`, less, with
    /// several queues, what the others had left when the first ran dry.
    pub offered: u64,
    /// Packets forwarded in the median run (must equal `offered`).
    pub forwarded: u64,
    /// Trips to the buffer pool's shared depot per 1000 packets (a lock,
    /// and buffers another thread's core wrote last): near 0 when each
    /// thread's magazines absorb its bursts.
    pub depot_trips_per_kpkt: f64,
    /// The CPU each pinned thread ran on (per-queue: worker i; steering:
    /// the steering thread); empty when not pinned.
    pub placement: Vec<usize>,
    /// Steering: the share of the run each packet thread spent on
    /// batches; empty per queue (each worker does everything).
    pub thread_busy: Vec<f64>,
    /// The share of the I/O loops' turns (steering thread, or the
    /// per-queue workers together) that found nothing to do.
    pub io_idle: f64,
}

/// The generator alone.
#[derive(Debug, Clone, Serialize)]
pub struct Generator {
    /// Frames one port writes into buffers per second, in millions (no
    /// forwarding): what one queue can be offered.
    pub mpps_per_queue: f64,
}

/// The report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Parameters.
    pub config: ScalingConfig,
    /// CPUs this process may run on.
    pub cpus: usize,
    /// The 1, 5 and 15 minute load averages when the run began (the
    /// figures are only comparable on an idle machine).
    pub load_average: String,
    /// How flows are spread over the per-queue ports.
    pub queue_hash: String,
    /// mode -> thread count -> cell.
    pub scaling: BTreeMap<String, BTreeMap<String, Cell>>,
    /// The generator's own rate.
    pub generator: Generator,
}

/// A port that pins the thread that first receives from it (the worker
/// or steering thread the datapath made for it) and notes where it ran.
struct Pinned {
    port: MemPort,
    /// Set by the first of the run's ports to run dry; every port then
    /// offers nothing more.
    dry: std::sync::Arc<AtomicBool>,
    cpu: Option<usize>,
    ran_on: std::sync::Arc<std::sync::Mutex<Option<usize>>>,
    first: bool,
}

impl Nic for Pinned {
    fn receive(&mut self, pool: &maio::Pool, slots: &mut [Slot]) -> Result<usize, netio::Error> {
        if self.first {
            self.first = false;
            if let Some(cpu) = self.cpu {
                // Unpinned if refused: the placement then says where it ran.
                crate::cpus::pin_current(cpu);
            }
            if let Ok(mut r) = self.ran_on.lock() {
                *r = Some(rustix::thread::sched_getcpu());
            }
        }
        if self.dry.load(Ordering::Relaxed) {
            return Ok(0);
        }
        self.port.receive(pool, slots)
    }

    fn transmit(&mut self, pool: &maio::Pool, slots: &[Slot]) -> Result<usize, netio::Error> {
        self.port.transmit(pool, slots)
    }

    fn exhausted(&self) -> bool {
        if self.port.exhausted() {
            self.dry.store(true, Ordering::Relaxed);
            return true;
        }
        self.dry.load(Ordering::Relaxed)
    }

    fn stats(&self) -> PortStats {
        self.port.stats()
    }
}

fn templates() -> Vec<Vec<u8>> {
    crate::forwarder::templates("non_syn").0
}

/// Which of `n` queues a frame's flow goes to: the steering hash, scaled
/// as steering scales it.
fn queue_of(frame: &[u8], n: usize) -> usize {
    let h = packet::parse::steer_flow(frame).map_or(0, |f| f.hash(lb::worker::STEER_SEED));
    ((u128::from(h) * n as u128) >> 64) as usize
}

/// One run, the CPUs it ran on, the frames its ports offered and the
/// times its threads went to the pool's depot.
fn measure(
    cfg: &Config,
    mode: &str,
    threads: usize,
    packets: u64,
    cores: usize,
) -> Result<(Run, Vec<usize>, u64, u64), Error> {
    let mut cfg = cfg.clone();
    cfg.forwarder.threads = threads;
    let control = Control::new(cfg.clone()).map_err(Error::Config)?;
    let mut params = Params::from_config(&cfg);
    if mode.starts_with("null") {
        params.mode = Mode::Null;
    }
    let per_queue = mode.ends_with("per_queue");
    let dp = Datapath::new(params, control.tables())?;
    let stop = AtomicBool::new(false);
    let dry = std::sync::Arc::new(AtomicBool::new(false));
    let pinned = |port: MemPort, cpu: Option<usize>| {
        let ran_on = std::sync::Arc::new(std::sync::Mutex::new(None));
        (
            Pinned {
                port,
                dry: dry.clone(),
                cpu,
                ran_on: ran_on.clone(),
                first: true,
            },
            ran_on,
        )
    };
    let (stats, ran_on) = if per_queue {
        let mut spread = vec![Vec::new(); threads];
        for t in templates() {
            let q = queue_of(&t, threads);
            spread[q].push(t);
        }
        // One CPU per worker when there are enough; the last ones first,
        // as CPU 0 takes most interrupts.
        let pin = threads <= cores;
        let mut ports: Vec<Box<dyn Nic + Send>> = Vec::new();
        let mut places = Vec::new();
        let mut left = packets;
        for (i, t) in spread.into_iter().enumerate() {
            let share = left / (threads - i) as u64;
            left -= share;
            let (p, r) = pinned(
                MemPort::new(t, Vary::None, Some(share)),
                pin.then(|| cores - threads + i),
            );
            ports.push(Box::new(p));
            places.push(r);
        }
        (dp.run_queues(ports, &stop)?, places)
    } else {
        let (mut p, r) = pinned(
            MemPort::new(templates(), Vary::None, Some(packets)),
            (threads < cores).then_some(0),
        );
        // On a thread of its own, so that pinning the steering thread
        // leaves this one (and the next runs) free; the packet threads it
        // starts before its first receive are not pinned either.
        let stats = std::thread::scope(|s| {
            std::thread::Builder::new()
                .name("steering".into())
                .spawn_scoped(s, || dp.run(&mut p, &stop))
                .map_err(lb::datapath::Error::Spawn)?
                .join()
                .unwrap_or(Err(lb::datapath::Error::QueueThreadPanicked(0)))
        })?;
        (stats, vec![r])
    };
    let placement = ran_on
        .iter()
        .filter_map(|r| r.lock().ok().and_then(|r| *r))
        .collect();
    let offered = stats.port.rx;
    Ok((
        Run::of(&stats, offered),
        placement,
        offered,
        stats.pool.depot_trips,
    ))
}

/// The generator alone: one port writing `packets` frames into a batch of
/// buffers, over and over.
fn generator(cfg: &Config, packets: u64) -> Result<f64, Error> {
    let control = Control::new(cfg.clone()).map_err(Error::Config)?;
    let dp = Datapath::new(Params::from_config(cfg), control.tables())?;
    let mut h = dp.pool().handle();
    let mut slots: Vec<Slot> = (0..32)
        .map(|_| Slot {
            buf: h.alloc().ok(),
            off: 0,
            len: 0,
        })
        .collect();
    let mut port = MemPort::new(templates(), Vary::None, Some(packets));
    let start = Instant::now();
    let mut n = 0u64;
    loop {
        let got = port
            .receive(dp.pool(), &mut slots)
            .map_err(lb::datapath::Error::from)?;
        if got == 0 {
            break;
        }
        n += got as u64;
    }
    let secs = start.elapsed().as_secs_f64();
    for s in &mut slots {
        if let Some(b) = s.buf.take() {
            let _ = h.free(b);
        }
    }
    Ok(n as f64 / secs / 1e6)
}

/// Runs every mode at every thread count; `progress` is told what runs
/// next.
pub fn run(b: &ScalingConfig, progress: &mut dyn FnMut(&str)) -> Result<Report, Error> {
    let cfg = crate::forwarder::config()?;
    let load = crate::proc::load_averages();
    let cores = cpus();
    let mut threads: Vec<usize> = b.threads.iter().copied().filter(|&t| t > 0).collect();
    threads.push(1);
    threads.sort_unstable();
    threads.dedup();
    progress("the generator alone");
    let mut gen = Vec::new();
    for _ in 0..b.repeats.max(1) {
        gen.push(generator(&cfg, b.packets)?);
    }
    let mut scaling: BTreeMap<String, BTreeMap<String, Cell>> = BTreeMap::new();
    for mode in MODES {
        let mut one = None;
        for &t in &threads {
            progress(&format!("{mode}, {t} thread(s)"));
            let mut runs = Vec::new();
            for _ in 0..b.repeats.max(1) {
                runs.push(measure(&cfg, mode, t, b.packets, cores)?);
            }
            runs.sort_by(|a, b| a.0.mpps.total_cmp(&b.0.mpps));
            let (run, placement, offered, trips) = runs.swap_remove(runs.len() / 2);
            let mpps = run.mpps;
            let base = *one.get_or_insert(mpps);
            scaling.entry(mode.to_string()).or_default().insert(
                t.to_string(),
                Cell {
                    mpps,
                    mpps_per_thread: mpps / t as f64,
                    efficiency: mpps / (t as f64 * base),
                    offered,
                    forwarded: run.forwarded,
                    depot_trips_per_kpkt: trips as f64 * 1000.0 / offered.max(1) as f64,
                    placement,
                    thread_busy: run.thread_busy,
                    io_idle: run.io_idle,
                },
            );
        }
    }
    Ok(Report {
        config: ScalingConfig {
            threads,
            ..b.clone()
        },
        cpus: cores,
        load_average: load,
        queue_hash: "the steering hash (flow hash, lb::worker::STEER_SEED), \
                     (hash x queues) >> 64"
            .into(),
        scaling,
        generator: Generator {
            mpps_per_queue: median(&mut gen),
        },
    })
}

impl Report {
    /// A table for people.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "Forwarder scaling, 64-byte non-SYN TCP frames, {} packets per run, median of {}; \
             {} CPUs, load average {}\n",
            self.config.packets, self.config.repeats, self.cpus, self.load_average
        );
        let mut t = Table::new([
            "mode",
            "threads",
            "Mpps",
            "Mpps/thread",
            "efficiency",
            "CPUs",
            "busy/thread",
            "I/O idle",
            "depot/kpkt",
        ]);
        for mode in MODES {
            let mut cells: Vec<_> = self.scaling.get(mode).into_iter().flatten().collect();
            cells.sort_by_key(|(k, _)| k.parse::<usize>().unwrap_or(0));
            for (threads, c) in cells {
                t.row([
                    mode.to_string(),
                    threads.clone(),
                    format!("{:.2}", c.mpps),
                    format!("{:.2}", c.mpps_per_thread),
                    format!("{:.2}", c.efficiency),
                    if c.placement.is_empty() {
                        "-".into()
                    } else {
                        c.placement
                            .iter()
                            .map(usize::to_string)
                            .collect::<Vec<_>>()
                            .join(",")
                    },
                    shares(&c.thread_busy),
                    format!("{:.2}", c.io_idle),
                    format!("{:.2}", c.depot_trips_per_kpkt),
                ]);
            }
        }
        let _ = writeln!(out, "{t}");
        let _ = writeln!(
            out,
            "generator alone: {:.2} Mpps per queue (frames copied into buffers, nothing forwarded).\n\
             per_queue: one worker per receive queue, run to completion; flows spread by {}.\n\
             steering: one steering thread (pinned, CPUs column) and N packet threads.\n\
             busy/thread: share of the run each packet thread spent on batches; I/O idle: share of the \
             I/O loops' turns with nothing to do; depot/kpkt: trips to the buffer pool's shared \
             depot per 1000 packets.\n\
             efficiency = Mpps / (threads x the same mode's one-thread Mpps). \
             Goal: per_queue efficiency at least 0.8 up to the CPUs less one.",
            self.generator.mpps_per_queue, self.queue_hash
        );
        out
    }
}
