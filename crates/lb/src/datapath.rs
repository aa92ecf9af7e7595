//! The forwarder's datapath (paper section 3.1, Figure 5).
//!
//! ```text
//!        NIC rx ring (slots of pool buffers)            NIC tx ring
//!   processed <= received <= reserved        recycled <= sent <= ready
//!        |  steering: 5-tuple hash              ^  muxing: gathers
//!        v  (round robin when a queue is full)  |
//!   [rx queue 0] -> packet thread 0 -> [tx queue 0]
//!   [rx queue 1] -> packet thread 1 -> [tx queue 1]
//! ```
//!
//! Receive side: the NIC fills the reserved buffers at `received` and
//! advances it; steering hands received packets to the packet threads and
//! advances `processed`; it then reserves fresh buffers from the pool into
//! the emptied slots and advances `reserved`. Transmit side: muxing places
//! packets rewritten by the packet threads at `ready`; the NIC sends from
//! `sent`; muxing returns sent buffers to the pool and advances `recycled`.
//! The pointers chase each other around the rings; a packet is never copied
//! between receive and transmit: only its descriptor moves.
//!
//! Steering, muxing and the NIC share one I/O thread. With `threads = 0`
//! the I/O thread also does the packet threads' work (inline mode).

use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use maio::Pool;
use netio::{Nic, Packet, PortStats, Slot};
use packet::parse_frame;

use crate::config::Config;
use crate::conntrack::Conntrack;
use crate::counters::Counters;
use crate::frag::FragTable;
use crate::queue::{queue, Consumer, Producer};
use crate::tables::Tables;
use crate::worker::{Mode, Worker, STEER_SEED};

/// Errors that stop the datapath.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The packet pool could not be created.
    #[error("packet pool: {0}")]
    Pool(#[from] maio::Error),
    /// The port failed.
    #[error("port: {0}")]
    Port(#[from] netio::Error),
    /// A packet or queue thread could not be started.
    #[error("starting a datapath thread: {0}")]
    Spawn(#[source] std::io::Error),
    /// A packet thread panicked (a bug: its packets are lost).
    #[error("packet thread {0} panicked")]
    PacketThreadPanicked(usize),
    /// A queue thread (one per port with `run_queues`) panicked.
    #[error("the thread serving queue {0} panicked")]
    QueueThreadPanicked(usize),
    /// `run_queues` was given no port.
    #[error("no port to run on")]
    NoPorts,
}

/// Steering and ring counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IoStats {
    /// Packets steered to packet threads.
    pub steered: u64,
    /// Packets steered round robin because their thread's queue was full.
    pub fallback: u64,
    /// Times every queue was full (packets waited in the NIC ring).
    pub all_full: u64,
    /// Times the pool had no buffer to reserve.
    pub pool_empty: u64,
    /// Batches handed to packet threads when full.
    pub batches_full: u64,
    /// Batches handed over by the timer.
    pub batches_timer: u64,
    /// Turns of the I/O loop.
    pub loops: u64,
    /// Turns of the I/O loop that found nothing to receive, steer or send
    /// (`idle_loops / loops`: how much of its core the I/O thread had
    /// spare).
    pub idle_loops: u64,
}

/// What a run did.
#[derive(Debug, Clone)]
pub struct RunStats {
    /// Packet-thread counters, summed.
    pub counters: Counters,
    /// Each packet thread's counters.
    pub per_thread: Vec<Counters>,
    /// The time each packet thread spent on batches (from the first
    /// packet taken to the output published); the rest of `elapsed` it
    /// waited for input (spinning, yielding or parked). Empty inline.
    pub busy: Vec<Duration>,
    /// The port's counters.
    pub port: PortStats,
    /// Steering and rings.
    pub io: IoStats,
    /// Wall time.
    pub elapsed: Duration,
    /// Pool counters at the end.
    pub pool: maio::Stats,
}

/// Datapath parameters (from `[forwarder]` and `[conntrack]`).
#[derive(Debug, Clone)]
pub struct Params {
    /// Packet threads (0: inline).
    pub threads: usize,
    /// Packets per batch.
    pub batch: usize,
    /// Partial batches are handed over after this long.
    pub batch_timeout: Duration,
    /// Queue and ring size.
    pub queue_size: usize,
    /// Pool buffers.
    pub pool_buffers: u32,
    /// Conntrack entries per thread.
    pub conntrack_size: usize,
    /// TCP idle timeout.
    pub tcp_timeout_ms: u64,
    /// Other idle timeout.
    pub udp_timeout_ms: u64,
    /// Fragment table size per thread.
    pub frag_table_size: usize,
    /// Fragment wait.
    pub frag_timeout_ms: u64,
    /// Hugepage policy for the pool.
    pub hugepages: maio::Hugepages,
    /// What packet threads do.
    pub mode: Mode,
    /// Packet-tracer reports go through this (`[tracer]`; none when
    /// disabled). Shared by every packet thread; the daemon drains it.
    pub tracer: Option<Arc<crate::tracer::Tracer>>,
}

impl Params {
    /// From a configuration.
    pub fn from_config(c: &Config) -> Self {
        Params {
            threads: c.forwarder.threads,
            batch: c.forwarder.batch,
            batch_timeout: Duration::from_micros(c.forwarder.batch_timeout_us),
            queue_size: c.forwarder.queue_size,
            pool_buffers: c.forwarder.pool_buffers(),
            conntrack_size: c.conntrack.size,
            tcp_timeout_ms: (c.conntrack.tcp_timeout_s * 1e3) as u64,
            udp_timeout_ms: (c.conntrack.udp_timeout_s * 1e3) as u64,
            frag_table_size: c.forwarder.frag_table_size,
            frag_timeout_ms: c.forwarder.frag_timeout_ms,
            hugepages: maio::Hugepages::Auto,
            mode: Mode::Maglev,
            tracer: crate::tracer::Tracer::from_config(&c.tracer),
        }
    }

    /// Packet thread (or queue) `thread`'s worker.
    fn worker(&self, pool: &Pool, thread: usize) -> Worker {
        let w = Worker::new(
            pool,
            self.mode,
            Conntrack::new(
                self.conntrack_size,
                self.tcp_timeout_ms,
                self.udp_timeout_ms,
            ),
            FragTable::new(self.frag_table_size, self.frag_timeout_ms),
        );
        match &self.tracer {
            Some(t) => w.with_tracer(Arc::clone(t), thread),
            None => w,
        }
    }
}

/// A ring of descriptor slots with three pointers chasing each other
/// (Figure 5). For the receive ring: `a` = processed, `b` = received,
/// `c` = reserved. For the transmit ring: `a` = recycled, `b` = sent,
/// `c` = ready. Invariant: `a <= b <= c <= a + size`.
struct Ring {
    slots: Vec<Slot>,
    mask: u64,
    a: u64,
    b: u64,
    c: u64,
}

impl Ring {
    fn new(size: usize) -> Self {
        let size = size.next_power_of_two();
        Ring {
            slots: (0..size).map(|_| Slot::default()).collect(),
            mask: size as u64 - 1,
            a: 0,
            b: 0,
            c: 0,
        }
    }

    fn size(&self) -> u64 {
        self.mask + 1
    }

    fn check(&self) {
        debug_assert!(self.a <= self.b && self.b <= self.c && self.c <= self.a + self.size());
    }

    /// The slots from `from` to `to` as at most two contiguous runs: the
    /// first run's length.
    fn run(&self, from: u64, to: u64) -> (usize, usize) {
        let start = (from & self.mask) as usize;
        let len = (to - from) as usize;
        (start, len.min(self.slots.len() - start))
    }

    /// Lets the NIC work on the slots between the middle pointer and the
    /// leading one (`b..c`: reserved buffers to fill, or frames to send), in
    /// at most two contiguous runs, and advances `b` by what it took.
    /// Returns how many slots it took.
    fn advance_middle<E>(
        &mut self,
        mut nic: impl FnMut(&mut [Slot]) -> Result<usize, E>,
    ) -> Result<u64, E> {
        let before = self.b;
        while self.b < self.c {
            let (s, n) = self.run(self.b, self.c);
            let took = nic(&mut self.slots[s..s + n])?.min(n);
            self.b += took as u64;
            if took < n {
                break;
            }
        }
        Ok(self.b - before)
    }

    fn slot(&mut self, i: u64) -> &mut Slot {
        &mut self.slots[(i & self.mask) as usize]
    }
}

struct ThreadEnd {
    rx: Producer,
    tx: Consumer,
    since: Option<Instant>,
    /// The thread's progress counters, on a cache line of their own.
    progress: Arc<Published>,
    /// Whether the thread sleeps (see [`Doze`]).
    doze: Arc<Doze>,
}

/// What a packet thread publishes after each batch, read by the I/O
/// thread. Aligned to a cache line: two small allocations made one after
/// the other share one, so thread i's counters and thread i+1's (each
/// written once per batch by its own thread) would bounce the line
/// between the two packet threads' cores.
#[repr(align(64))]
#[derive(Debug, Default)]
struct Published {
    /// The thread's packets finished: forwarded or dropped.
    finished: AtomicU64,
    /// Finished, or held as fragments waiting for their first fragment.
    accounted: AtomicU64,
}

/// Whether a packet thread sleeps, and so needs the I/O thread to wake it.
///
/// No wake-up is lost. A packet thread stores its sleeping state, then a
/// sequentially consistent fence, then looks at its queue, `draining` and
/// `quit` once more, and parks (for at most [`IDLE_TICK`]) only if none of
/// them has anything for it. After each step of its loop, the I/O thread
/// reads the threads' states (one read each while all are awake); when one
/// sleeps, it hands over that thread's partial batch, then a fence, then
/// reads the states again and unparks each sleeping thread with input
/// waiting, or with a drain to do, once per sleep (it swaps the state back
/// to awake). Each side reads the other's store after its own fence, so at
/// least one sees the other's; a thread that announces its sleep just
/// after the first read is seen at the next step, as the I/O thread does
/// not sleep in the port while any packet is with the packet threads. An
/// unpark that comes before the park is kept, and the park returns at
/// once. `quit` is followed by an unpark of every thread.
#[repr(align(64))]
#[derive(Debug, Default)]
struct Doze(AtomicU8);

impl Doze {
    /// Running (or about to look at its queue again).
    const AWAKE: u8 = 0;
    /// Asleep: wake it for input, or to drain.
    const SLEEPING: u8 = 1;
    /// Asleep, having drained: wake it for input only.
    const SLEEPING_DRAINED: u8 = 2;

    /// A packet thread announces its sleep; it must then look at its
    /// queue, `quit` and `draining` once more, and park only if none of
    /// them has anything for it. Out of line, as [`Doze::park`].
    #[cold]
    #[inline(never)]
    fn announce(&self, drained: bool) {
        let state = if drained {
            Doze::SLEEPING_DRAINED
        } else {
            Doze::SLEEPING
        };
        self.0.store(state, Ordering::Relaxed);
        fence(Ordering::SeqCst);
    }

    /// Parks the packet thread for at most [`IDLE_TICK`] if `nothing` came
    /// since [`Doze::announce`], then marks it awake. Out of line, so that
    /// the packet loop stays small.
    #[cold]
    #[inline(never)]
    fn park(&self, nothing: bool) {
        if nothing {
            std::thread::park_timeout(IDLE_TICK);
        }
        self.0.store(Doze::AWAKE, Ordering::Relaxed);
    }
}

/// Batches the inline worker (`threads = 0`) processes before the port
/// sends their packets, when that many are waiting.
const INLINE_BATCHES_PER_SEND: usize = 8;
/// Idle iterations the I/O thread spins before it yields or sleeps.
const IDLE_SPINS: u32 = 1024;
/// Further idle iterations it yields while work is in flight before it
/// polls the port every millisecond instead.
const IDLE_YIELDS: u32 = 4096;
/// How long the I/O thread sleeps in an idle port at most (milliseconds).
const IDLE_WAIT_MS: i32 = 20;
/// Idle iterations a packet thread yields before it sleeps.
const PACKET_IDLE_YIELDS: u32 = 4096;
/// Empty looks at its queue after which a packet thread publishes what it
/// counted (a quiet spell of a few microseconds).
const PACKET_IDLE_PUBLISH: u32 = 64;
/// How long a sleeping packet thread waits at most before it expires held
/// fragments by the clock.
const IDLE_TICK: Duration = Duration::from_millis(100);

/// What a packet thread publishes of its progress.
struct Progress<'a> {
    published: &'a Published,
    /// Where the thread says it is about to sleep.
    doze: &'a Doze,
}

impl Progress<'_> {
    fn publish(&self, w: &Worker) {
        self.published
            .finished
            .store(w.finished(), Ordering::Release);
        self.published
            .accounted
            .store(w.accounted(), Ordering::Release);
    }
}

/// What the workers of [`Datapath::run_queues`] share: the fragment table
/// (with more than one queue) and the clock its times are read by.
struct Shared {
    frags: Option<Arc<Mutex<FragTable>>>,
    start: Instant,
    /// The heartbeat's round each queue's loop saw last: the round
    /// advances only when all saw it, so that it stands still when any one
    /// queue's loop hangs or ends (its share of the traffic black-holed)
    /// while the others run.
    beats: Vec<AtomicU64>,
}

/// The forwarder's datapath over one port.
pub struct Datapath {
    params: Params,
    tables: Arc<ArcSwap<Tables>>,
    pool: Pool,
    /// Live counters, refreshed by packet threads every few batches.
    pub live: Arc<Mutex<Vec<Counters>>>,
    /// Advances while the I/O loop runs, with one loop per queue while
    /// every one of them runs (a liveness signal for the BGP controller,
    /// the peers and the service manager's watchdog; no clock is read to
    /// keep it).
    pub heartbeat: Arc<AtomicU64>,
}

fn steer_hash(frame: &[u8]) -> u64 {
    if let Some(f) = packet::parse::steer_flow(frame) {
        return f.hash(STEER_SEED);
    }
    match parse_frame(frame) {
        // Fragments by 3-tuple so a datagram's fragments meet on one thread.
        Ok(p) if p.fragment.is_some() => p.flow.three_tuple().hash(STEER_SEED),
        // A fragment a `[fleet]` peer redirected here: by its inner
        // 3-tuple, to the thread its datagram's other fragments go to.
        Ok(p) if p.flow.proto == packet::proto::GRE => {
            redirected_fragment_hash(frame).unwrap_or_else(|| p.flow.hash(STEER_SEED))
        }
        Ok(p) => p.icmp_quote.unwrap_or(p.flow).hash(STEER_SEED),
        Err(_) => 0, // malformed: any thread will count it
    }
}

/// The steering hash of a fragment redirected by a `[fleet]` peer (GRE
/// with [`packet::gre::FRAGMENT_REDIRECT_KEY`]): its inner 3-tuple's, as if
/// it had arrived directly.
#[cold]
fn redirected_fragment_hash(frame: &[u8]) -> Option<u64> {
    let d = packet::gre::decapsulate(frame)
        .ok()
        .filter(|d| d.key == Some(packet::gre::FRAGMENT_REDIRECT_KEY))?;
    let p = packet::parse::parse_packet(frame, d.inner.start, d.ethertype).ok()?;
    p.fragment.map(|_| p.flow.three_tuple().hash(STEER_SEED))
}

impl Datapath {
    /// Creates the packet pool (hugepages when available).
    pub fn new(params: Params, tables: Arc<ArcSwap<Tables>>) -> Result<Self, Error> {
        let pool = Pool::new(maio::Config {
            buffers: params.pool_buffers,
            buf_size: 2048,
            hugepages: params.hugepages,
            magazine_depth: maio::MAGAZINE_DEPTH,
        })?;
        Ok(Datapath {
            live: Arc::new(Mutex::new(vec![Counters::new(); params.threads.max(1)])),
            heartbeat: Arc::new(AtomicU64::new(0)),
            params,
            tables,
            pool,
        })
    }

    /// The packet pool.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// The packet-tracer's queue and counters, if `[tracer]` is enabled.
    pub fn tracer(&self) -> Option<&Arc<crate::tracer::Tracer>> {
        self.params.tracer.as_ref()
    }

    /// Runs until the port is exhausted and every packet is accounted for,
    /// or until `stop` is set.
    pub fn run(&self, nic: &mut dyn Nic, stop: &AtomicBool) -> Result<RunStats, Error> {
        self.run_on(nic, stop, self.params.threads, 0, None)
    }

    /// One port per packet thread, each served run-to-completion on its own
    /// thread (receive, process, transmit; the NIC's queues do the
    /// steering): AF_XDP with one socket per queue. Runs until `stop` or
    /// until every port is exhausted; counters are summed.
    pub fn run_queues(
        &self,
        ports: Vec<Box<dyn Nic + Send>>,
        stop: &AtomicBool,
    ) -> Result<RunStats, Error> {
        // One fragment table for every queue (the NIC may spread a
        // datagram's fragments over several), as large as theirs together,
        // and one clock, which its expiry times are read by.
        let shared = Shared {
            frags: (ports.len() > 1).then(|| {
                Arc::new(Mutex::new(FragTable::new(
                    self.params.frag_table_size.saturating_mul(ports.len()),
                    self.params.frag_timeout_ms,
                )))
            }),
            start: Instant::now(),
            // No loop has seen a round yet.
            beats: (0..ports.len()).map(|_| AtomicU64::new(u64::MAX)).collect(),
        };
        let results: Vec<Result<RunStats, Error>> = std::thread::scope(|scope| {
            let handles: Vec<_> = ports
                .into_iter()
                .enumerate()
                .map(|(slot, mut port)| {
                    let shared = &shared;
                    std::thread::Builder::new()
                        .name(format!("queue-{slot}"))
                        .spawn_scoped(scope, move || {
                            self.run_on(&mut *port, stop, 0, slot, Some(shared))
                        })
                })
                .collect();
            handles
                .into_iter()
                .enumerate()
                .map(|(slot, h)| match h {
                    Ok(h) => h.join().unwrap_or(Err(Error::QueueThreadPanicked(slot))),
                    Err(e) => Err(Error::Spawn(e)),
                })
                .collect()
        });
        let mut all: Option<RunStats> = None;
        for r in results {
            let r = r?;
            all = Some(match all {
                None => r,
                Some(mut a) => {
                    a.counters.merge(&r.counters);
                    a.per_thread.extend(r.per_thread);
                    a.busy.extend(r.busy);
                    a.port.add(&r.port);
                    a.io.steered += r.io.steered;
                    a.io.loops += r.io.loops;
                    a.io.idle_loops += r.io.idle_loops;
                    a.elapsed = a.elapsed.max(r.elapsed);
                    a.pool = r.pool;
                    a
                }
            });
        }
        let mut all = all.ok_or(Error::NoPorts)?;
        if let Some(table) = &shared.frags {
            // Fragments still held whose first fragment never came, on
            // whichever queue: dropped as expired, their buffers returned.
            let counters = {
                // A worker only to count and free them: no tables of its
                // own worth allocating (a full-size connection table would
                // cost the daemon's stop tens of megabytes for nothing).
                let mut w = Worker::new(
                    &self.pool,
                    self.params.mode,
                    Conntrack::new(0, 0, 0),
                    FragTable::new(0, 0),
                );
                w.drain_shared(table);
                // (The worker's handle gives its buffers back as it goes.)
                w.counters.clone()
            };
            all.counters.merge(&counters);
            all.pool = self.pool.stats();
        }
        Ok(all)
    }

    /// The datapath over one port with `threads` packet threads (0: inline),
    /// publishing inline counters to live slot `slot`: one [`IoLoop`] step
    /// after another until the input is over or `stop` is set.
    fn run_on(
        &self,
        nic: &mut dyn Nic,
        stop: &AtomicBool,
        threads: usize,
        slot: usize,
        shared: Option<&Shared>,
    ) -> Result<RunStats, Error> {
        let mut l = IoLoop::start(self, threads, slot, shared)?;
        let result: Result<(), Error> = loop {
            l.beat();
            l.reserve();
            // The NIC fills reserved buffers at `received`.
            if let Err(e) = l.rx.advance_middle(|slots| nic.receive(&self.pool, slots)) {
                break Err(e.into());
            }
            l.rx.check();
            let mut idle = !l.steer();
            l.process_inline();
            // Inline, a few batches go out together: one wake-up of the
            // port's transmit then sends them all (AF_XDP in copy mode
            // pays a system call per wake-up).
            for _ in 1..INLINE_BATCHES_PER_SEND {
                if l.inline.is_none() || l.rx.a == l.rx.b {
                    break;
                }
                l.steer();
                l.process_inline();
            }
            let ended = nic.exhausted() && l.rx.a == l.rx.b;
            l.hand_over_timed_batches(ended);
            l.mux();
            // The NIC sends from `sent`, taking the buffers it can send
            // without a copy (AF_XDP: the frame stays where it was
            // received); `recycle` frees the rest.
            match l
                .tx
                .advance_middle(|slots| nic.transmit_owned(&self.pool, slots))
            {
                Ok(0) => {}
                Ok(_) => idle = false,
                Err(e) => break Err(e.into()),
            }
            l.recycle();
            if l.done(ended, stop) {
                break Ok(());
            }
            l.pace(idle, nic);
        };
        l.finish(nic, result)
    }
}

/// The I/O thread's state over one port (Figure 5): the receive and
/// transmit rings, each packet thread's queues (or the inline worker), and
/// the steering counters. Each method is one step of the loop in
/// [`Datapath::run_on`].
struct IoLoop<'d> {
    dp: &'d Datapath,
    start: Instant,
    slot: usize,
    handle: maio::Handle,
    rx: Ring,
    tx: Ring,
    io: IoStats,
    draining: Arc<AtomicBool>,
    quit: Arc<AtomicBool>,
    ends: Vec<ThreadEnd>,
    joins: Vec<std::thread::JoinHandle<(Counters, Duration)>>,
    /// The inline worker (`threads = 0`) and its batch.
    inline: Option<Worker>,
    batch_buf: Vec<Packet>,
    out: Vec<Packet>,
    pending_tx: std::collections::VecDeque<Packet>,
    inline_pub: LivePublisher,
    /// With one loop per queue: what the queues share.
    shared: Option<&'d Shared>,
    rr: usize,
    idle_spins: u32,
    iterations: u64,
}

impl<'d> IoLoop<'d> {
    /// Sets up the rings and starts `threads` packet threads (none: one
    /// inline worker).
    fn start(
        dp: &'d Datapath,
        threads: usize,
        slot: usize,
        shared: Option<&'d Shared>,
    ) -> Result<Self, Error> {
        let start = shared.map_or_else(Instant::now, |s| s.start);
        let p = &dp.params;
        let mut l = IoLoop {
            dp,
            start,
            slot,
            // Running to completion, this loop allocates a receive ring's
            // worth and frees up to INLINE_BATCHES_PER_SEND batches at a
            // time: magazines that deep keep those bursts out of the
            // depot, and so keep its buffers on its own core (per queue,
            // two loops trading magazines through the depot ran 0.7-0.8
            // of twice one loop; with these, 0.86-0.95). Behind steering
            // the packet threads free what this loop allocated, not this
            // loop: it keeps the pool's depth (deeper was not measured
            // better there).
            handle: if threads == 0 {
                dp.pool.handle_with_depth(
                    (p.batch * INLINE_BATCHES_PER_SEND).max(maio::MAGAZINE_DEPTH),
                )
            } else {
                dp.pool.handle()
            },
            rx: Ring::new(p.queue_size * 2),
            tx: Ring::new(p.queue_size * 2 * threads.max(1)),
            io: IoStats::default(),
            draining: Arc::new(AtomicBool::new(false)),
            quit: Arc::new(AtomicBool::new(false)),
            ends: Vec::new(),
            joins: Vec::new(),
            inline: (threads == 0).then(|| {
                let w = p.worker(&dp.pool, slot);
                match shared.and_then(|s| s.frags.as_ref()) {
                    Some(f) => w.with_shared_frags(Arc::clone(f)),
                    None => w,
                }
            }),
            batch_buf: Vec::with_capacity(p.batch),
            out: Vec::new(),
            pending_tx: std::collections::VecDeque::new(),
            inline_pub: LivePublisher::default(),
            shared,
            rr: 0,
            idle_spins: 0,
            iterations: 0,
        };
        for i in 0..threads {
            if let Err(e) = l.spawn_packet_thread(i) {
                // Threads already started see `quit` and end.
                l.quit.store(true, Ordering::Release);
                return Err(e);
            }
        }
        Ok(l)
    }

    fn spawn_packet_thread(&mut self, i: usize) -> Result<(), Error> {
        let p = &self.dp.params;
        let (rx_p, rx_c) = queue(p.queue_size);
        let (tx_p, tx_c) = queue(p.queue_size);
        let published = Arc::new(Published::default());
        let mut w = p.worker(&self.dp.pool, i);
        let (tables, pool, batch) = (Arc::clone(&self.dp.tables), self.dp.pool.clone(), p.batch);
        let (draining, quit, live) = (
            Arc::clone(&self.draining),
            Arc::clone(&self.quit),
            Arc::clone(&self.dp.live),
        );
        let (start, shared) = (self.start, Arc::clone(&published));
        let doze = Arc::new(Doze::default());
        let dz = Arc::clone(&doze);
        let join = std::thread::Builder::new()
            .name(format!("packet-{i}"))
            .spawn(move || {
                let progress = Progress {
                    published: &shared,
                    doze: &dz,
                };
                packet_thread(
                    i, &mut w, rx_c, tx_p, &tables, &pool, batch, start, &progress, &draining,
                    &quit, &live,
                )
            })
            .map_err(Error::Spawn)?;
        self.ends.push(ThreadEnd {
            rx: rx_p,
            tx: tx_c,
            since: None,
            progress: published,
            doze,
        });
        self.joins.push(join);
        Ok(())
    }

    /// A liveness signal for the control plane, without reading a clock.
    #[inline]
    fn beat(&mut self) {
        self.iterations += 1;
        if self.iterations & 255 == 0 {
            self.publish_beat();
        }
    }

    /// Publishes the heartbeat: this loop's count; or, with one loop per
    /// queue, a round that advances only once every queue's loop has said
    /// it saw the current one, so it stands still while any one of them
    /// does. (The smallest of the loops' counts would not: a queue that
    /// stopped ahead of a slower one would keep it moving until the slower
    /// one caught up.)
    #[cold]
    fn publish_beat(&self) {
        match self.shared {
            None => self.dp.heartbeat.store(self.iterations, Ordering::Relaxed),
            Some(s) => {
                let round = self.dp.heartbeat.load(Ordering::Acquire);
                if let Some(mine) = s.beats.get(self.slot) {
                    mine.store(round, Ordering::Release);
                }
                if s.beats.iter().all(|b| b.load(Ordering::Acquire) == round) {
                    // Lost to another loop: it advanced the same round.
                    let _ = self.dp.heartbeat.compare_exchange(
                        round,
                        round.wrapping_add(1),
                        Ordering::AcqRel,
                        Ordering::Relaxed,
                    );
                }
            }
        }
    }

    /// Step 1: reserve fresh buffers into emptied receive slots.
    #[inline]
    fn reserve(&mut self) {
        while self.rx.c < self.rx.a + self.rx.size() {
            match self.handle.alloc() {
                Ok(b) => {
                    let s = self.rx.slot(self.rx.c);
                    s.buf = Some(b);
                    s.len = 0;
                    self.rx.c += 1;
                }
                Err(_) => {
                    self.io.pool_empty += 1;
                    break;
                }
            }
        }
    }

    /// Step 3: steering. Received packets go to their packet thread by
    /// flow hash (round robin when its queue is full), or into the inline
    /// batch. Returns whether there was anything to steer.
    #[inline]
    fn steer(&mut self) -> bool {
        let batch = self.dp.params.batch;
        let mut any = false;
        while self.rx.a < self.rx.b {
            any = true;
            let i = self.rx.a;
            let slot = self.rx.slot(i);
            let Some(buf) = slot.buf.take() else { break };
            let pkt = Packet {
                buf,
                off: slot.off,
                len: slot.len,
            };
            if self.inline.is_some() {
                self.batch_buf.push(pkt);
                self.rx.a += 1;
                if self.batch_buf.len() == batch {
                    break;
                }
                continue;
            }
            let h = steer_hash(pkt.frame(&self.dp.pool));
            let n = self.ends.len();
            let home = ((u128::from(h) * n as u128) >> 64) as usize;
            let word = pkt.pack();
            let mut placed = self.ends[home].rx.push(word);
            let mut q = home;
            if !placed {
                for k in 1..n {
                    q = (self.rr + k) % n;
                    if self.ends[q].rx.push(word) {
                        placed = true;
                        self.io.fallback += 1;
                        break;
                    }
                }
                self.rr = (self.rr + 1) % n;
            }
            if !placed {
                // Every queue is full: leave it in the ring.
                // SAFETY: `word` was packed just above and pushed nowhere.
                match unsafe { Packet::unpack(&self.dp.pool, word) } {
                    Ok(back) => self.rx.slot(i).buf = Some(back.buf),
                    Err(err) => tracing::error!("steering: cannot take back a packet: {err}"),
                }
                self.io.all_full += 1;
                break;
            }
            self.io.steered += 1;
            let e = &mut self.ends[q];
            // The clock is read once per batch, when a queue's first
            // unpublished packet arrives, not once per loop.
            e.since.get_or_insert_with(Instant::now);
            if e.rx.unpublished() >= batch {
                e.rx.publish();
                e.since = None;
                self.io.batches_full += 1;
            }
            self.rx.a += 1;
        }
        any
    }

    /// Inline mode: the I/O thread processes the batch itself (and, when
    /// there is none, lets held fragments expire on time).
    #[inline]
    fn process_inline(&mut self) {
        let Some(w) = self.inline.as_mut() else {
            return;
        };
        if self.batch_buf.is_empty() && self.idle_spins > 1024 {
            w.tick(self.start.elapsed().as_millis() as u64);
        }
        if !self.batch_buf.is_empty() {
            let t = self.dp.tables.load();
            w.process(
                &t,
                &mut self.batch_buf,
                &mut self.out,
                self.start.elapsed().as_millis() as u64,
            );
            self.pending_tx.extend(self.out.drain(..));
            self.inline_pub.dirty = true;
        }
        if self.batch_buf.is_empty() && self.idle_spins > 1024 && self.inline_pub.dirty {
            // Idle for a while: what the last batches counted is published now (exact
            // counters once traffic stops), not up to an interval later.
            self.inline_pub
                .publish(&self.dp.live, self.slot, &w.counters, self.start);
        } else {
            self.inline_pub
                .maybe(&self.dp.live, self.slot, &w.counters, self.start);
        }
    }

    /// Timer: hand over partial batches that waited long enough, or
    /// everything once the input has `ended`.
    #[inline]
    fn hand_over_timed_batches(&mut self, ended: bool) {
        let timeout = self.dp.params.batch_timeout;
        let now = self
            .ends
            .iter()
            .any(|e| e.since.is_some())
            .then(Instant::now);
        for e in self.ends.iter_mut() {
            if let (Some(t0), Some(now)) = (e.since, now) {
                if ended || now.duration_since(t0) >= timeout {
                    e.rx.publish();
                    e.since = None;
                    self.io.batches_timer += 1;
                }
            }
        }
    }

    /// Step 4: muxing. Gathers the inline worker's output and the packet
    /// threads' transmit queues into the tx ring at `ready`.
    #[inline]
    fn mux(&mut self) {
        let tx = &mut self.tx;
        while tx.c < tx.a + tx.size() {
            if let Some(pk) = self.pending_tx.pop_front() {
                *tx.slot(tx.c) = Slot {
                    buf: Some(pk.buf),
                    off: pk.off,
                    len: pk.len,
                };
                tx.c += 1;
                continue;
            }
            let mut got = false;
            for e in self.ends.iter_mut() {
                if let Some(word) = e.tx.pop() {
                    // SAFETY: the packet thread packed this descriptor and
                    // pushed it once; this single consumer pops it once.
                    match unsafe { Packet::unpack(&self.dp.pool, word) } {
                        Ok(pk) => {
                            *tx.slot(tx.c) = Slot {
                                buf: Some(pk.buf),
                                off: pk.off,
                                len: pk.len,
                            };
                            tx.c += 1;
                            got = true;
                        }
                        Err(err) => {
                            tracing::error!("muxing: bad descriptor from a packet thread: {err}")
                        }
                    }
                    if tx.c == tx.a + tx.size() {
                        break;
                    }
                }
            }
            if !got {
                break;
            }
        }
        for e in self.ends.iter_mut() {
            e.tx.release();
        }
    }

    /// Step 6: recycle sent buffers to the pool.
    #[inline]
    fn recycle(&mut self) {
        while self.tx.a < self.tx.b {
            if let Some(b) = self.tx.slot(self.tx.a).buf.take() {
                let _ = self.handle.free(b);
            }
            self.tx.a += 1;
        }
        self.tx.check();
    }

    /// Packets the packet threads have finished with.
    fn finished(&self) -> u64 {
        self.ends
            .iter()
            .map(|e| e.progress.finished.load(Ordering::Acquire))
            .sum()
    }

    /// Packets the packet threads have finished with or hold as fragments.
    fn accounted(&self) -> u64 {
        self.ends
            .iter()
            .map(|e| e.progress.accounted.load(Ordering::Acquire))
            .sum()
    }

    /// Done? Input over, every steered packet finished, rings empty (or
    /// told to stop). Once the input has ended and every packet is
    /// finished or held, tells the workers to drain what they hold
    /// (fragments whose first fragment never came end as expired).
    fn done(&mut self, ended: bool, stop: &AtomicBool) -> bool {
        let all_in = ended && (self.inline.is_some() || self.accounted() == self.io.steered);
        if all_in && !self.draining.load(Ordering::Relaxed) {
            self.draining.store(true, Ordering::Release);
            if let Some(w) = self.inline.as_mut() {
                w.drain();
            }
        }
        // A finished packet may still sit in its thread's transmit queue:
        // the thread publishes it before counting it finished, so once the
        // counts match, an empty queue here means none is left.
        let quiet = self
            .ends
            .iter_mut()
            .all(|e| e.rx.is_drained() && e.tx.is_empty())
            && self.pending_tx.is_empty()
            && self.tx.a == self.tx.c;
        if (all_in && quiet && self.draining.load(Ordering::Relaxed))
            || stop.load(Ordering::Relaxed)
        {
            // Held fragments are dropped by `drain`; wait until every
            // thread has reported them.
            return stop.load(Ordering::Relaxed) || self.finished() == self.io.steered;
        }
        false
    }

    /// Idle pacing, after every step of the loop. First wakes packet
    /// threads that sleep while input or a drain waits for them. Then, when
    /// this step did nothing: spins briefly; yields while work is in flight
    /// (a partial batch waiting for its timer, packets with the packet
    /// threads, frames left to send); and once nothing is, sleeps in the
    /// port until a frame arrives or [`IDLE_WAIT_MS`] passes, so an idle
    /// forwarder costs (almost) no CPU. The heartbeat, `stop` and inline
    /// fragment expiry are served at least that often.
    #[inline]
    fn pace(&mut self, idle: bool, nic: &mut dyn Nic) {
        self.wake_sleepers();
        self.io.loops += 1;
        self.io.idle_loops += u64::from(idle);
        if !idle {
            self.idle_spins = 0;
            return;
        }
        self.idle_spins = self.idle_spins.saturating_add(1);
        if self.idle_spins <= IDLE_SPINS {
            std::hint::spin_loop();
        } else {
            let settled = self.settled();
            if !settled && self.idle_spins <= IDLE_SPINS + IDLE_YIELDS {
                std::thread::yield_now();
            } else {
                // In flight for long (a stuck transmit ring): poll gently.
                nic.wait(if settled { IDLE_WAIT_MS } else { 1 });
                self.publish_beat();
            }
        }
        if nic.exhausted() {
            std::thread::yield_now();
        }
    }

    /// Nothing in flight, so only a new frame (or a timer of at least
    /// [`IDLE_WAIT_MS`]) can give the loop work: nothing received left to
    /// steer, no partial batch waiting for its timer, every steered packet
    /// finished or held by its packet thread and its output muxed, nothing
    /// left to send.
    fn settled(&mut self) -> bool {
        // `accounted` first: a packet thread publishes its output before
        // its progress, so output it counted is visible in its queue below.
        self.accounted() == self.io.steered
            && self.rx.a == self.rx.b
            && self.batch_buf.is_empty()
            && self.pending_tx.is_empty()
            && self.tx.b == self.tx.c
            && self
                .ends
                .iter_mut()
                .all(|e| e.since.is_none() && e.tx.is_empty())
    }

    /// Unparks each packet thread that sleeps while packets wait in its
    /// queue, or (once) while `draining` asks it to drain. A partial batch
    /// for a sleeping thread is handed over at once (counted with the
    /// timer's): batching amortizes hand-overs to a busy thread, and for
    /// an idle one it would only add its timeout to the latency.
    #[inline]
    fn wake_sleepers(&mut self) {
        // While every thread is awake (streaming), this is all: one read of
        // each state, a line that changes only when its thread sleeps or
        // wakes. A thread that announces its sleep after this read is seen
        // at the next step: the loop keeps stepping while any packet is
        // with the packet threads (see `settled`).
        if self
            .ends
            .iter()
            .all(|e| e.doze.0.load(Ordering::Relaxed) == Doze::AWAKE)
        {
            return;
        }
        for e in self.ends.iter_mut() {
            if e.since.is_some() && e.doze.0.load(Ordering::Relaxed) != Doze::AWAKE {
                e.rx.publish();
                e.since = None;
                self.io.batches_timer += 1;
            }
        }
        // Between this step's publications and the reads of the threads'
        // states; pairs with the fence of a thread going to sleep (`Doze`).
        fence(Ordering::SeqCst);
        let draining = self.draining.load(Ordering::Relaxed);
        for (e, j) in self.ends.iter().zip(&self.joins) {
            let state = e.doze.0.load(Ordering::Relaxed);
            if state == Doze::AWAKE {
                continue;
            }
            // Unpublished packets wake it when their batch is published.
            let input = e.rx.unpublished() == 0 && !e.rx.is_drained();
            if (input || (draining && state == Doze::SLEEPING))
                && e.doze.0.swap(Doze::AWAKE, Ordering::Relaxed) != Doze::AWAKE
            {
                j.thread().unpark();
            }
        }
    }

    /// Stops the packet threads, gives back buffers still in the rings
    /// (stopped mid-flight), and sums the counters.
    fn finish(mut self, nic: &mut dyn Nic, result: Result<(), Error>) -> Result<RunStats, Error> {
        self.quit.store(true, Ordering::Release);
        // Sleeping packet threads see `quit` at once (they look after
        // announcing their sleep, and a wake-up before `park` is kept).
        for j in &self.joins {
            j.thread().unpark();
        }
        let mut per_thread = Vec::new();
        let mut busy = Vec::new();
        let mut panicked = None;
        for (i, j) in std::mem::take(&mut self.joins).into_iter().enumerate() {
            match j.join() {
                Ok((c, b)) => {
                    per_thread.push(c);
                    busy.push(b);
                }
                Err(_) => panicked = Some(i),
            }
        }
        for i in self.rx.a..self.rx.c {
            if let Some(b) = self.rx.slot(i).buf.take() {
                let _ = self.handle.free(b);
            }
        }
        for i in self.tx.a..self.tx.c {
            if let Some(b) = self.tx.slot(i).buf.take() {
                let _ = self.handle.free(b);
            }
        }
        if let Some(w) = self.inline.take() {
            per_thread.push(w.counters.clone());
        }
        result?;
        if let Some(thread) = panicked {
            return Err(Error::PacketThreadPanicked(thread));
        }
        let mut counters = Counters::new();
        for c in &per_thread {
            counters.merge(c);
        }
        let port = nic.stats();
        // Packet threads rewrite in place; what user space copied, the port
        // did (receiving from a ring, or sending a copy).
        counters.user_copies += port.rx_copies + port.tx_copies;
        Ok(RunStats {
            counters,
            per_thread,
            busy,
            port,
            io: self.io,
            elapsed: self.start.elapsed(),
            pool: self.dp.pool.stats(),
        })
    }
}

/// Copies a thread's counters to the shared live view every
/// [`LIVE_INTERVAL_MS`] when they changed, and once more when the thread
/// goes idle (so counters read after traffic stops are exact), so the
/// control plane can read them without touching the packet thread's own.
#[derive(Default)]
struct LivePublisher {
    last_ms: u64,
    dirty: bool,
}

/// How often live counters are refreshed (defined with the configuration,
/// whose drain bounds depend on it).
pub use crate::config::LIVE_INTERVAL_MS;

impl LivePublisher {
    /// Returns the time since `start` it read.
    fn maybe(
        &mut self,
        live: &Mutex<Vec<Counters>>,
        id: usize,
        c: &Counters,
        start: Instant,
    ) -> Duration {
        let elapsed = start.elapsed();
        let now = elapsed.as_millis() as u64;
        if self.dirty && now >= self.last_ms + LIVE_INTERVAL_MS {
            self.publish(live, id, c, start);
        }
        elapsed
    }

    fn publish(&mut self, live: &Mutex<Vec<Counters>>, id: usize, c: &Counters, start: Instant) {
        if let Ok(mut l) = live.lock() {
            if let Some(slot) = l.get_mut(id) {
                *slot = c.clone();
            }
        }
        self.last_ms = start.elapsed().as_millis() as u64;
        self.dirty = false;
    }
}

#[allow(clippy::too_many_arguments)]
fn packet_thread(
    id: usize,
    w: &mut Worker,
    mut rx: Consumer,
    mut tx: Producer,
    tables: &ArcSwap<Tables>,
    pool: &Pool,
    batch: usize,
    start: Instant,
    progress: &Progress<'_>,
    draining: &AtomicBool,
    quit: &AtomicBool,
    live: &Mutex<Vec<Counters>>,
) -> (Counters, Duration) {
    let mut busy = Duration::ZERO;
    let mut in_batch = Vec::with_capacity(batch);
    let mut out = Vec::with_capacity(batch * 2);
    let mut live_pub = LivePublisher::default();
    let mut idle = 0u32;
    let mut drained = false;
    loop {
        while in_batch.len() < batch {
            match rx.pop() {
                // SAFETY: steering packed this descriptor and pushed it once;
                // this thread is the queue's only consumer.
                Some(word) => match unsafe { Packet::unpack(pool, word) } {
                    Ok(p) => in_batch.push(p),
                    Err(e) => tracing::error!("packet thread {id}: bad descriptor: {e}"),
                },
                None => break,
            }
        }
        if in_batch.is_empty() {
            // Held fragments end before the thread does, also when stopped.
            let quitting = quit.load(Ordering::Acquire);
            if (quitting || draining.load(Ordering::Acquire)) && !drained {
                w.drain();
                drained = true;
                progress.publish(w);
            }
            if quitting {
                break;
            }
            idle = idle.saturating_add(1);
            if idle > PACKET_IDLE_PUBLISH && live_pub.dirty {
                // Counters are exact soon after traffic stops: what the
                // last batches counted is published once the queue has
                // stayed empty a moment (once per quiet spell: publishing
                // clears `dirty`), not an interval or an idle tick later.
                live_pub.publish(live, id, &w.counters, start);
            }
            if idle > PACKET_IDLE_YIELDS {
                // Idle for a while (a quiet interface): sleep until the I/O
                // thread hands over a batch, asks for a drain or says quit,
                // or until the tick, when held fragments expire by the clock.
                progress.doze.announce(drained);
                let nothing = rx.is_empty()
                    && !quit.load(Ordering::Relaxed)
                    && (drained || !draining.load(Ordering::Relaxed));
                progress.doze.park(nothing);
                w.tick(start.elapsed().as_millis() as u64);
                progress.publish(w);
                live_pub.dirty = true;
                live_pub.maybe(live, id, &w.counters, start);
            } else {
                std::thread::yield_now();
            }
            continue;
        }
        idle = 0;
        rx.release();
        let t = tables.load();
        // The clock read for the batch's timestamp times it too.
        let began = start.elapsed();
        w.process(&t, &mut in_batch, &mut out, began.as_millis() as u64);
        for pkt in out.drain(..) {
            let word = pkt.pack();
            let mut pushed = tx.push(word);
            while !pushed && !quit.load(Ordering::Acquire) {
                tx.publish();
                w.counters.tx_stalls += 1;
                std::thread::yield_now();
                pushed = tx.push(word);
            }
            if !pushed {
                // Shutting down with the I/O thread gone: give it back.
                // SAFETY: `word` was packed here and never pushed.
                if let Ok(p) = unsafe { Packet::unpack(pool, word) } {
                    w.free(p);
                }
            }
        }
        tx.publish();
        progress.publish(w);
        live_pub.dirty = true;
        // The clock read that paces publishing ends the batch's time.
        let ended = live_pub.maybe(live, id, &w.counters, start);
        busy += ended.saturating_sub(began);
    }
    live_pub.dirty = true;
    live_pub.publish(live, id, &w.counters, start);
    (w.counters.clone(), busy)
}
