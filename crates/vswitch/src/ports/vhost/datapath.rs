//! The virtio-net datapath over split virtqueues in guest memory.
//!
//! A virtio-net device has a receive queue (0: the switch fills buffers the
//! guest posted) and a transmit queue (1: the guest posts frames, the switch
//! takes them). Each split queue is three areas the guest placed in its
//! memory:
//!
//! ```text
//! descriptor table  num x Desc {addr u64, len u32, flags u16, next u16}   guest writes
//! available ring    flags u16, idx u16, ring[num] u16, used_event u16      guest writes
//! used ring         flags u16, idx u16, ring[num] {id u32, len u32},
//!                   avail_event u16                                        device writes
//! ```
//!
//! Nothing the guest writes is trusted. The available index is read once
//! per look and may run at most `num` entries ahead of what was consumed
//! (more breaks the queue: it stops until the frontend sets it up again);
//! every head and `next` index is checked against `num`; every descriptor's
//! address range must lie inside one guest-memory region; indirect
//! descriptors (not offered) and descriptors of the wrong direction are
//! refused. A refused chain is returned to the guest as used with length 0
//! and counted by reason; the device-written indices (`used.idx`,
//! `avail_event`) are kept here and only written, never read back.
//!
//! The work one guest can cause is bounded, so that it cannot take the
//! switch's time from the other ports:
//! - per chain: a legal chain has at most `num` descriptors (each belongs
//!   to one chain, and the table has `num`), so a chain still going after
//!   `num` is a loop. It is refused and breaks the queue, which stops until
//!   the frontend sets it up again (as for an impossible index), instead of
//!   trying the next buffer, whose chain may loop as well (`num` chains of
//!   `num` descriptors per frame);
//! - per pass: beyond the first [`FREE_READS`] descriptors of each chain
//!   (all an ordinary frame needs), a queue reads at most [`DESC_BUDGET`]
//!   descriptors per pass (the transmit queue per batch taken, the receive
//!   queue per batch delivered), give or take the one chain under way when
//!   the budget runs out, which is paid for afterwards (its queue is
//!   skipped until the debt is paid);
//! - per second: the budget is a token bucket refilled from the clock, at
//!   most [`DESC_RATE`] reads a second and at most [`DESC_BUDGET`] a pass,
//!   never above [`DESC_BUDGET`]. A pass of this switch can take 2 µs, so a
//!   budget per pass alone still let a guest with chains of 32,768
//!   descriptors take about 143 million reads a second, most of a core;
//!   per second, such a guest gets [`DESC_RATE`] reads beyond the free ones
//!   (a few percent of a core), however fast the switch's passes are, and
//!   its chains, legal ones included, are still taken, at that rate. Frames
//!   left in a transmit ring wait for the next pass; frames for a receive
//!   queue out of budget are dropped, as for a full ring. Every descriptor
//!   read is counted ([`QueueStats::desc_reads`]), and so are the passes a
//!   queue was skipped for its debt and the time it spent held back
//!   ([`QueueStats::over_budget`], [`QueueStats::held_ns`]). An ordinary
//!   guest's chains cost nothing from the budget, so its queues never read
//!   the clock for it.
//!
//! Each descriptor is read once into a [`DescRepr`], checked, then used. A
//! chain is refused for its first structural fault along the chain
//! (indirect, wrong direction, outside memory, `next` out of range, longer
//! than the ring), and only then for its length (runt, too long, receive
//! buffer too small).
//!
//! Frames carry the 12-byte `virtio_net_hdr_v1` (10 bytes for a legacy
//! driver without `VERSION_1` or `MRG_RXBUF`). A transmitted frame whose
//! header asks for nothing is handed to the switch in place when it is one
//! piece of one descriptor (the usual case for Linux, which pushes the
//! header in front of the data) and gathered into the queue's arena
//! otherwise. A frame whose header asks for an offload (a partial
//! checksum, a TCP segment of up to 64 KB) is always gathered, and its
//! header is checked on that copy against the frame and the features
//! negotiated ([`crate::offload::check`]): a lie is refused, returned to
//! the guest as used, and counted by reason ([`QueueStats::hdr_refused`]);
//! what the header asks travels with the frame through the switch. A frame
//! for the guest carries its offloads in its header when the guest
//! negotiated them (the switch finishes it otherwise); with `MRG_RXBUF` a
//! frame larger than one receive buffer is spread over several, the first
//! one's `num_buffers` saying how many.
//!
//! Notifications follow [`Mode`] and `itr`, as the ring ports':
//! - `Base`: the guest is asked to kick at its next entry after every
//!   publish (`avail_event` at the guest's current index), and the device
//!   calls after every publish, whatever the guest asked;
//! - `Sc` (the host half of Send Combining): no kicks are asked for while
//!   the switch polls, only when it is about to sleep; calls as in `Base`;
//! - `Csb` (event-index windows): kicks as in `Sc`, and a call only when the
//!   used index crosses the `used_event` the guest published (or, without
//!   `EVENT_IDX`, when it has not set `VRING_AVAIL_F_NO_INTERRUPT`);
//! - `itr` > 0: calls that survive the above are moderated, at most one per
//!   `itr` x 250 ns, a held one fired by the switch's timer.
//!
//! Calls for the transmit queue (completions) adapt to the guest: in `Sc`
//! and `Csb` without `itr`, a call the guest asked for is held while the
//! guest keeps transmitting, and fired [`TX_CALL_HOLD`] after the last
//! frame taken, or [`TX_CALL_HOLD_MAX`] after it was first held, whichever
//! comes first. A transmitting Linux guest frees completed buffers in its
//! own transmit path (`free_old_xmit_skbs` before each frame), so an
//! interrupt while it sends only interrupts its sending (measured: a TCG
//! guest's pktgen at one frame per doorbell took 0.29 transmit interrupts
//! per frame); one that stops, for a full ring or for its socket's
//! completions (TCP small queues), gets its interrupt at most
//! [`TX_CALL_HOLD`] later. Receive-queue calls are not held: the guest's
//! NAPI already holds them off while it polls (it moves `used_event`), and
//! holding them more would only add latency to every frame it receives.

use std::cell::Cell;
use std::ptr::NonNull;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release, SeqCst};
use std::sync::atomic::{fence, AtomicU16, AtomicU32, AtomicU64};
use std::sync::Arc;
use std::time::Instant;

use crate::offload::{self, Caps, HdrError, Offload, VnetHdr, MAX_GSO_FRAME};
use crate::status::QueueStatus;
use virtio_bindings::virtio_ring::{
    VRING_AVAIL_F_NO_INTERRUPT, VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE,
    VRING_USED_F_NO_NOTIFY,
};

use super::inflight::{QueueRegion, Recovered, Tracker};
use super::mem::{FrontendAddr, GuestAddr, GuestMemory, GuestSlice};
use ::ring::device::FrameRef;
use ::ring::notify::{EventFd, Mode, Moderator};

/// The first pair's receive queue's index (frames to the guest).
pub const RXQ: usize = 0;
/// The first pair's transmit queue's index (frames from the guest).
pub const TXQ: usize = 1;

/// Whether queue `i` is a transmit queue (odd indices: pair `i / 2`'s).
pub const fn is_tx(i: usize) -> bool {
    i % 2 == 1
}
pub use super::inflight::MAX_QUEUE_SIZE;
/// The longest frame (without the virtio header) taken from a guest
/// without a segmentation request: an Ethernet frame with a VLAN tag; the
/// bound leaves room. A frame with a segmentation request may be up to
/// [`MAX_GSO_FRAME`].
pub const MAX_FRAME: u32 = 2048;
/// Bytes of the transmit queue's gathering arena: every frame not taken in
/// place (a frame in pieces, or one with offloads, checked on this copy)
/// is gathered here for its batch. A batch stops taking chains once less
/// than [`MAX_GSO_FRAME`] is left, so it holds a full batch (256) of
/// ordinary frames, or eight 64 KB segments (the rest wait for the next
/// pass): about 590 KB per VM port, allocated when first needed.
pub const ARENA_BYTES: usize = 256 * (MAX_FRAME as usize + 8) + MAX_GSO_FRAME as usize;
/// The shortest frame taken from a guest: an Ethernet header.
pub const MIN_FRAME: u32 = 14;
pub use crate::budgets::{DESC_BUDGET, DESC_RATE, FREE_READS};
/// A held transmit-completion call fires this long after the last frame
/// taken (the guest paused).
pub const TX_CALL_HOLD: std::time::Duration = std::time::Duration::from_micros(100);
/// ... and at most this long after it was first held.
pub const TX_CALL_HOLD_MAX: std::time::Duration = std::time::Duration::from_micros(500);
/// Descriptor reads one chain may cost beyond the budget: the whole ring
/// (a legal chain's longest) and the two descriptors a transmit chain's
/// fast paths look at before walking it.
pub const fn chain_reads(num: u16) -> u64 {
    num as u64 + 2
}

/// One descriptor of the table, as the guest lays it out.
#[repr(C)]
pub struct Desc {
    /// Guest-physical address of the buffer.
    pub addr: AtomicU64,
    /// Bytes in the buffer.
    pub len: AtomicU32,
    /// `VRING_DESC_F_*`.
    pub flags: AtomicU16,
    /// The next descriptor of the chain, if `VRING_DESC_F_NEXT`.
    pub next: AtomicU16,
}

const _: () = assert!(std::mem::size_of::<Desc>() == 16);
const _: () = assert!(std::mem::offset_of!(Desc, len) == 8);
const _: () = assert!(std::mem::offset_of!(Desc, flags) == 12);
const _: () = assert!(std::mem::offset_of!(Desc, next) == 14);

/// A descriptor read once: what every check and every use works on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DescRepr {
    /// Guest-physical address.
    pub addr: GuestAddr,
    /// Length.
    pub len: u32,
    /// Flags.
    pub flags: u16,
    /// Next index.
    pub next: u16,
}

impl Desc {
    /// Read each field once.
    #[inline]
    pub fn read(&self) -> DescRepr {
        DescRepr {
            addr: GuestAddr(self.addr.load(Relaxed)),
            len: self.len.load(Relaxed),
            flags: self.flags.load(Relaxed),
            next: self.next.load(Relaxed),
        }
    }
}

const F_NEXT: u16 = VRING_DESC_F_NEXT as u16;
const F_WRITE: u16 = VRING_DESC_F_WRITE as u16;
const F_INDIRECT: u16 = VRING_DESC_F_INDIRECT as u16;

/// Bytes of a descriptor table of `num` entries.
pub const fn desc_bytes(num: u32) -> u64 {
    16 * num as u64
}
/// Bytes of an available ring of `num` entries (with `used_event`).
pub const fn avail_bytes(num: u32) -> u64 {
    6 + 2 * num as u64
}
/// Bytes of a used ring of `num` entries (with `avail_event`).
pub const fn used_bytes(num: u32) -> u64 {
    6 + 8 * num as u64
}

/// Why a queue's rings cannot be used where the frontend put them.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RingError {
    /// Not a power of two in 1..=32768.
    #[error("queue size {0} (a power of two up to {MAX_QUEUE_SIZE} expected)")]
    Size(u32),
    /// An area does not lie inside one region of guest memory.
    #[error("{area} ring at {addr:#x} ({len} bytes) is outside guest memory")]
    Outside {
        /// Which area.
        area: &'static str,
        /// The frontend's address for it.
        addr: u64,
        /// Its length.
        len: u64,
    },
    /// An area is not aligned as the specification requires (16, 2, 4).
    #[error("{area} ring at {addr:#x} is not {align}-byte aligned")]
    Align {
        /// Which area.
        area: &'static str,
        /// The frontend's address for it.
        addr: u64,
        /// The alignment required.
        align: usize,
    },
}

/// Why one descriptor chain was refused (returned to the guest unused). The
/// names are the status document's counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChainError {
    /// A `next` index at or past the queue size.
    NextOutOfRange,
    /// More descriptors than the ring holds: a loop.
    Loop,
    /// An indirect descriptor (not offered).
    Indirect,
    /// A device-writable descriptor in a transmit chain, or a read-only one
    /// in a receive chain.
    Direction,
    /// A buffer not wholly inside one guest-memory region.
    Outside,
    /// A transmitted frame shorter than an Ethernet header.
    Short,
    /// A transmitted frame longer than [`MAX_FRAME`].
    Long,
    /// A receive buffer too small for the frame.
    Small,
}

impl ChainError {
    /// Every reason, in counter order.
    pub const ALL: [ChainError; 8] = [
        ChainError::NextOutOfRange,
        ChainError::Loop,
        ChainError::Indirect,
        ChainError::Direction,
        ChainError::Outside,
        ChainError::Short,
        ChainError::Long,
        ChainError::Small,
    ];

    /// The counter's name.
    pub fn name(self) -> &'static str {
        match self {
            ChainError::NextOutOfRange => "next_out_of_range",
            ChainError::Loop => "loop",
            ChainError::Indirect => "indirect",
            ChainError::Direction => "wrong_direction",
            ChainError::Outside => "outside_memory",
            ChainError::Short => "runt",
            ChainError::Long => "too_long",
            ChainError::Small => "buffer_too_small",
        }
    }
}

/// What one queue did: notifications, chains, refusals.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Kicks received (the guest's doorbell writes: VM exits on real
    /// hardware).
    pub kicks: u64,
    /// Calls made (interrupts asked of the frontend).
    pub calls: u64,
    /// Calls held by moderation (fired later, coalesced).
    pub calls_held: u64,
    /// Publishes whose call the guest's window suppressed (`Csb`).
    pub calls_suppressed: u64,
    /// Chains completed (used entries written).
    pub chains: u64,
    /// Chains refused, by [`ChainError`] (in [`ChainError::ALL`] order).
    pub refused: [u64; 8],
    /// Transmitted frames refused for their virtio-net header, by
    /// [`HdrError`] (in [`HdrError::ALL`] order).
    pub hdr_refused: [u64; 9],
    /// Times the queue broke (impossible index, or a looping chain; it
    /// then stops).
    pub broke: u64,
    /// Descriptors read (each field once per read), valid or not.
    pub desc_reads: u64,
    /// Passes cut short because the queue had spent its descriptor budget
    /// ([`DESC_BUDGET`], refilled at [`DESC_RATE`]).
    pub over_budget: u64,
    /// Time the queue spent held back with its budget spent, nanoseconds
    /// (measured at the refills, so to within one pass).
    pub held_ns: u64,
    /// Heads found in flight in the in-flight region when the queue
    /// started (a backend that died with them), taken again.
    pub resubmitted: u64,
}

impl QueueStats {
    /// Chains refused, all reasons.
    pub fn refused_total(&self) -> u64 {
        self.refused.iter().sum::<u64>() + self.hdr_refused.iter().sum::<u64>()
    }

    /// The counters as the status document shows them, for a queue that
    /// is not running (the caller adds a running queue's state).
    pub fn status(&self) -> QueueStatus {
        QueueStatus {
            kicks: self.kicks,
            calls: self.calls,
            calls_held: self.calls_held,
            calls_suppressed: self.calls_suppressed,
            chains: self.chains,
            refused: ChainError::ALL
                .iter()
                .map(|e| (e.name().to_string(), self.refused[*e as usize]))
                .chain(
                    HdrError::ALL
                        .iter()
                        .map(|e| (e.name().to_string(), self.hdr_refused[*e as usize])),
                )
                .collect(),
            broke: self.broke,
            desc_reads: self.desc_reads,
            over_budget: self.over_budget,
            held_back_us: self.held_ns / 1000,
            size: None,
            broken: None,
            running: Some(false),
        }
    }
}

/// The addresses of one queue as the frontend gave them (its own virtual
/// addresses, as on the wire: [`RingAddrs::frontend`] types them), and the
/// queue's size.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RingAddrs {
    /// Entries.
    pub num: u32,
    /// Descriptor table.
    pub desc: u64,
    /// Available ring.
    pub avail: u64,
    /// Used ring.
    pub used: u64,
}

impl RingAddrs {
    /// The descriptor table, available and used rings, as the frontend
    /// addresses they are.
    pub fn frontend(&self) -> [FrontendAddr; 3] {
        [self.desc, self.avail, self.used].map(FrontendAddr)
    }
}

/// The three areas of one queue, translated and checked.
struct RingMem {
    desc: NonNull<Desc>,
    avail: NonNull<AtomicU16>,
    used: NonNull<u8>,
}

impl RingMem {
    fn new(mem: &GuestMemory, a: &RingAddrs) -> Result<RingMem, RingError> {
        if a.num == 0 || a.num > MAX_QUEUE_SIZE || !a.num.is_power_of_two() {
            return Err(RingError::Size(a.num));
        }
        let area = |area: &'static str, at: FrontendAddr, len: u64, align: usize| {
            let addr = at.0;
            let p = mem
                .user(at, len)
                .ok_or(RingError::Outside { area, addr, len })?;
            if !(p.as_ptr() as usize).is_multiple_of(align) {
                return Err(RingError::Align { area, addr, align });
            }
            Ok(p.as_non_null())
        };
        let [desc, avail, used] = a.frontend();
        Ok(RingMem {
            desc: area("descriptor", desc, desc_bytes(a.num), 16)?.cast(),
            avail: area("available", avail, avail_bytes(a.num), 2)?.cast(),
            used: area("used", used, used_bytes(a.num), 4)?,
        })
    }
}

/// One running queue.
pub struct Queue {
    /// The port and queue, for the log.
    name: String,
    /// Keeps the mapping the pointers below point into.
    mem: Arc<GuestMemory>,
    ring: RingMem,
    num: u16,
    mask: u16,
    /// The next available entry to consume.
    last_avail: u16,
    /// The next used entry to write.
    used_idx: u16,
    /// The used index the guest can see.
    published: u16,
    /// The used index at the last call decision.
    signalled_used: u16,
    signalled_valid: bool,
    /// Whether `EVENT_IDX` was negotiated.
    event_idx: bool,
    mode: Mode,
    /// Whether the guest is asked to kick (see [`Queue::ask_kicks`]).
    kicks_on: bool,
    call: Option<Arc<EventFd>>,
    moder: Moderator,
    /// Whether calls are held while the guest transmits (the transmit
    /// queue in `Sc` and `Csb` without `itr`: [`Queue::hold_calls`]).
    hold: bool,
    /// A held call: since when, and when it is due.
    held: Option<(Instant, Instant)>,
    itr: u32,
    broken: Option<String>,
    /// Descriptors read since the last [`Queue::settle_reads`].
    reads: Cell<u64>,
    /// Descriptor reads left; below zero, the debt a long chain left
    /// ([`Queue::budget`], refilled at [`Queue::rate`]).
    credit: i64,
    /// This queue's part of the port's budget per pass: [`DESC_BUDGET`]
    /// divided among the port's running queue pairs ([`QueueSetup::share`]).
    budget: u64,
    /// This queue's part of the port's [`DESC_RATE`], divided likewise.
    rate: u64,
    /// When the credit was last refilled, while it is below the full
    /// budget (none while it is full: the clock is not read then).
    refilled: Option<Instant>,
    /// In-flight tracking in the frontend's shared region, if it gave one.
    inflight: Option<Tracker>,
    /// What the queue's start found in that region.
    recovered: Recovered,
    /// The receive buffers (head, bytes) of the frame being spread over
    /// several, kept between calls so that no batch allocates.
    spread: Vec<(u16, u32)>,
}

// SAFETY: the ring pointers point into the mapping `mem` keeps alive; the
// queue is used by one thread at a time.
unsafe impl Send for Queue {}

/// vring_need_event: whether moving an index from `old` to `new` crosses
/// the `event` the other side asked to be notified at.
#[inline]
pub fn need_event(event: u16, new: u16, old: u16) -> bool {
    new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old)
}

/// How a queue starts.
pub struct QueueSetup {
    /// Where its rings are.
    pub addrs: RingAddrs,
    /// The available index to start at (`SET_VRING_BASE`, or where the
    /// queue stopped).
    pub base: u16,
    /// Whether `EVENT_IDX` was negotiated.
    pub event_idx: bool,
    /// The interrupt line, if the frontend gave one.
    pub call: Option<Arc<EventFd>>,
    /// The notification scheme.
    pub mode: Mode,
    /// Interrupt moderation, in 250 ns units (0: off).
    pub itr: u32,
    /// Whether the guest is asked to kick from the start (the transmit
    /// queue: the switch may be asleep; the receive queue only in `Base`:
    /// the switch looks for buffers when it has frames, it never waits for
    /// them).
    pub kicks: bool,
    /// The queue's part of the in-flight region, if the frontend set one
    /// up: the queue then starts at the used ring's index, checked against
    /// the region ([`super::inflight`]).
    pub inflight: Option<QueueRegion>,
    /// Among how many queue pairs the port's descriptor budget is shared
    /// (the pairs running: 1 gives the queue the whole budget): the port's
    /// total stays [`DESC_BUDGET`] a pass and [`DESC_RATE`] a second per
    /// direction, however many pairs a guest turns on.
    pub share: u16,
}

/// A queue's descriptor budget as it stood ([`Queue::credit`]).
#[derive(Debug, Clone, Copy)]
pub struct Credit {
    credit: i64,
    refilled: Option<Instant>,
}

impl Queue {
    /// Translate and check a queue's rings in `mem`; `name` says which
    /// port's queue it is, in the log.
    pub fn new(name: String, mem: Arc<GuestMemory>, s: QueueSetup) -> Result<Queue, RingError> {
        let ring = RingMem::new(&mem, &s.addrs)?;
        let num = s.addrs.num as u16; // 32768 at most, checked in RingMem::new
        let share = u64::from(s.share.max(1));
        let budget = (DESC_BUDGET / share).max(1);
        let mut q = Queue {
            name,
            mem,
            ring,
            num,
            mask: num.wrapping_sub(1),
            last_avail: s.base,
            used_idx: s.base,
            published: s.base,
            signalled_used: s.base,
            signalled_valid: false,
            event_idx: s.event_idx,
            mode: s.mode,
            kicks_on: false,
            call: s.call,
            moder: Moderator::new(s.itr),
            hold: false,
            held: None,
            itr: s.itr,
            broken: None,
            reads: Cell::new(0),
            credit: budget as i64,
            budget,
            rate: (DESC_RATE / share).max(1),
            refilled: None,
            inflight: None,
            spread: Vec::new(),
            recovered: Recovered::default(),
        };
        if let Some(r) = s.inflight {
            q.start_inflight(r);
        }
        q.ask_kicks(s.kicks || s.mode == Mode::Base);
        Ok(q)
    }

    /// Start tracking in flight heads in `r`: the queue starts at the used
    /// ring's index, if the region agrees with the rings; a region that
    /// does not stops the queue.
    fn start_inflight(&mut self, r: QueueRegion) {
        let used = self.used_u16(2).load(Acquire);
        let avail = self.avail_idx().load(Acquire);
        let entry = |k: u16| self.avail_entry(used.wrapping_add(k)).load(Relaxed);
        match Tracker::start(r, self.num, used, avail, entry) {
            Ok((t, rec)) => {
                self.inflight = Some(t);
                self.recovered = rec;
                self.last_avail = used;
                self.used_idx = used;
                self.published = used;
                self.signalled_used = used;
            }
            Err(e) => self.broken = Some(e.to_string()),
        }
    }

    /// What the queue's start found in the in-flight region.
    pub fn recovered(&self) -> Recovered {
        self.recovered
    }

    /// Hold the guest's calls while it keeps handing the queue work (the
    /// transmit queue; see the module's notes): only in `Sc` and `Csb`
    /// without `itr` moderation.
    pub fn hold_calls(&mut self) {
        self.hold = self.mode != Mode::Base && self.itr == 0;
    }

    /// The next available entry to consume (what `GET_VRING_BASE` answers).
    pub fn last_avail(&self) -> u16 {
        self.last_avail
    }

    /// What became of the signals raised on the queue's call line, if it
    /// has one.
    pub fn call_line(&self) -> Option<::ring::notify::LineStats> {
        self.call.as_ref().map(|c| c.stats())
    }

    /// Why the queue stopped, if it did.
    pub fn broken(&self) -> Option<&str> {
        self.broken.as_deref()
    }

    /// The queue's size.
    pub fn size(&self) -> u16 {
        self.num
    }

    fn mark_broken(&mut self, why: String, st: &mut QueueStats) {
        if self.broken.is_none() {
            tracing::warn!("vhost queue stopped ({}): {why}", self.name);
            st.broke += 1;
            self.broken = Some(why);
        }
    }

    #[inline]
    fn avail_field(&self, i: usize) -> &AtomicU16 {
        // SAFETY: the available ring (2 + num + 1 u16s) lies inside the
        // mapping `self.mem` keeps, 2-byte aligned (RingMem::new); callers
        // pass i <= num + 2; atomics only, so the guest writing is no race.
        unsafe { self.ring.avail.add(i).as_ref() }
    }

    #[inline]
    fn avail_idx(&self) -> &AtomicU16 {
        self.avail_field(1)
    }

    #[inline]
    fn avail_entry(&self, slot: u16) -> &AtomicU16 {
        self.avail_field(2 + (slot & self.mask) as usize)
    }

    #[inline]
    fn used_event(&self) -> &AtomicU16 {
        self.avail_field(2 + self.num as usize)
    }

    #[inline]
    fn used_u16(&self, off: usize) -> &AtomicU16 {
        // SAFETY: callers pass off in {0, 2, 4 + 8 * num}: inside the used
        // ring (RingMem::new checked 6 + 8 * num bytes), 2-byte aligned
        // (the ring is 4-aligned); atomics only.
        unsafe { self.ring.used.add(off).cast::<AtomicU16>().as_ref() }
    }

    #[inline]
    fn used_elem(&self, slot: u16) -> (&AtomicU32, &AtomicU32) {
        let off = 4 + 8 * (slot & self.mask) as usize;
        // SAFETY: slot & mask < num, so both words lie inside the used ring
        // (RingMem::new), 4-byte aligned; atomics only.
        unsafe {
            (
                self.ring.used.add(off).cast::<AtomicU32>().as_ref(),
                self.ring.used.add(off + 4).cast::<AtomicU32>().as_ref(),
            )
        }
    }

    /// Where this queue's descriptor budget stands, for the queue a
    /// rebuild makes in its place ([`Queue::carry_credit`]).
    pub fn credit(&self) -> Credit {
        Credit {
            credit: self.credit,
            refilled: self.refilled,
        }
    }

    /// Start from what the queue this one replaces had left of its budget
    /// (at most this queue's own budget, which the pairs running decide).
    /// The frontend's messages rebuild the queues (an enable, a call fd,
    /// any of them): a fresh queue's full budget would let a guest refill
    /// its budget by sending messages, past [`DESC_RATE`].
    pub fn carry_credit(&mut self, c: Credit) {
        self.credit = c.credit.min(self.budget as i64);
        self.refilled = c.refilled;
    }

    /// A new pass: the budget earns what the time since the last refill
    /// pays at the queue's rate, at most its budget in one pass, and
    /// holds at most its budget ([`DESC_RATE`] and [`DESC_BUDGET`] for a
    /// port with one queue pair running, shared among several). The clock
    /// is read only while the budget is below full (never for an ordinary
    /// guest), and a spell below full earns from its first refill on, not
    /// from before it.
    fn refill(&mut self, st: &mut QueueStats) {
        if self.credit >= self.budget as i64 {
            self.refilled = None;
            return;
        }
        let now = Instant::now();
        let Some(last) = self.refilled.replace(now) else {
            return;
        };
        let dt = now.saturating_duration_since(last).as_nanos();
        if self.credit <= 0 {
            st.held_ns += dt as u64;
        }
        let earned = (dt * u128::from(self.rate) / 1_000_000_000).min(u128::from(self.budget));
        self.credit = (self.credit + earned as i64).min(self.budget as i64);
    }

    /// Charge the reads since the last call (one chain's) to the budget,
    /// less the free ones, and to the counter.
    fn settle_reads(&mut self, st: &mut QueueStats) {
        let n = self.reads.replace(0);
        st.desc_reads += n;
        self.credit -= n.saturating_sub(FREE_READS) as i64;
    }

    /// Whether the budget allows another chain; counts a pass cut short.
    fn budget_left(&mut self, st: &mut QueueStats) -> bool {
        self.settle_reads(st);
        if self.credit > 0 {
            return true;
        }
        st.over_budget += 1;
        false
    }

    /// A chain that loops: the queue stops (see the module's bounds).
    fn looped(&mut self, head: u16, st: &mut QueueStats) {
        self.mark_broken(
            format!(
                "the chain at head {head} is longer than the ring ({}): a loop",
                self.num
            ),
            st,
        );
    }

    #[inline]
    fn desc(&self, i: u16) -> DescRepr {
        debug_assert!(i < self.num);
        self.reads.set(self.reads.get() + 1);
        // SAFETY: callers check i < num; the table lies inside the mapping,
        // 16-byte aligned (RingMem::new); atomics only.
        unsafe { self.ring.desc.add((i & self.mask) as usize).as_ref() }.read()
    }

    /// Entries the guest made available and the queue has not consumed: read
    /// once, checked (more than the ring holds breaks the queue).
    #[inline]
    pub fn avail(&mut self, st: &mut QueueStats) -> u16 {
        if self.broken.is_some() {
            return 0;
        }
        let idx = self.avail_idx().load(Acquire);
        let n = idx.wrapping_sub(self.last_avail);
        if n > self.num {
            self.mark_broken(
                format!(
                    "available index jumped to {idx} (consumed up to {}, ring of {})",
                    self.last_avail, self.num
                ),
                st,
            );
            return 0;
        }
        n
    }

    /// The head of the `k`-th unconsumed entry, checked against the ring
    /// (out of range breaks the queue: there is no chain to return).
    #[inline]
    fn head(&mut self, k: u16, st: &mut QueueStats) -> Option<u16> {
        let head = self
            .avail_entry(self.last_avail.wrapping_add(k))
            .load(Relaxed);
        if head >= self.num {
            self.mark_broken(
                format!("head {head} out of range (ring of {})", self.num),
                st,
            );
            return None;
        }
        Some(head)
    }

    /// Walk the chain at `head` (checked by the caller), calling `seg` with
    /// each buffer. `write`: the chain must be
    /// device-writable (receive) or device-readable (transmit). Returns the
    /// chain's total length.
    #[inline]
    fn walk(
        &self,
        head: u16,
        write: bool,
        mut seg: impl FnMut(GuestSlice<'_>) -> Result<(), ChainError>,
    ) -> Result<u64, ChainError> {
        let mut i = head;
        let mut total = 0u64;
        for _ in 0..self.num {
            let d = self.desc(i);
            if d.flags & F_INDIRECT != 0 {
                return Err(ChainError::Indirect);
            }
            if (d.flags & F_WRITE != 0) != write {
                return Err(ChainError::Direction);
            }
            let p = self
                .mem
                .gpa(d.addr, u64::from(d.len))
                .ok_or(ChainError::Outside)?;
            seg(p)?;
            total += u64::from(d.len);
            if d.flags & F_NEXT == 0 {
                return Ok(total);
            }
            if d.next >= self.num {
                return Err(ChainError::NextOutOfRange);
            }
            i = d.next;
        }
        Err(ChainError::Loop)
    }

    /// Take up to `max` frames the guest transmitted: each frame's place in
    /// guest memory (or in `bounce`, gathered) goes to `out`, each consumed
    /// head to `heads` (refused chains too: they are returned unused).
    /// Returns the entries consumed, the token for [`Queue::complete_tx`].
    ///
    /// A frame whose virtio-net header asks for nothing is taken as it
    /// is. Any other is gathered into the arena and its header checked
    /// against that copy for a guest that negotiated `caps`
    /// ([`offload::check`]); what it asks goes to `offloads` with its
    /// index in `out`, or it is refused and counted by reason. The arena
    /// belongs to the batch, which may take from several queues: the
    /// caller resets it once per batch.
    #[allow(clippy::too_many_arguments)]
    pub fn take_tx(
        &mut self,
        max: u32,
        hdr_len: u32,
        caps: Caps,
        out: &mut Vec<FrameRef>,
        offloads: &mut Vec<(u32, Offload)>,
        heads: &mut Vec<u16>,
        arena: &mut Arena,
        st: &mut QueueStats,
    ) -> u32 {
        self.refill(st);
        let n = u32::from(self.avail(st)).min(max) as u16;
        for k in 0..n {
            if !self.budget_left(st) {
                return k as u32;
            }
            // The next chain may be a 64 KB segment: stop the batch while
            // the arena cannot hold one (the rest wait for the next pass).
            if arena.left() < MAX_GSO_FRAME as usize {
                return k as u32;
            }
            let Some(head) = self.head(k, st) else {
                return k as u32;
            };
            heads.push(head);
            self.track_take(head);
            match self.frame_at(head, hdr_len, caps, arena) {
                Ok((f, o)) => {
                    if let Some(o) = o {
                        offloads.push((out.len() as u32, o));
                    }
                    out.push(f);
                }
                Err(Refused::Hdr(e)) => st.hdr_refused[e as usize] += 1,
                Err(Refused::Chain(e)) => {
                    st.refused[e as usize] += 1;
                    if e == ChainError::Loop {
                        self.settle_reads(st);
                        self.looped(head, st);
                        return u32::from(k) + 1;
                    }
                }
            }
        }
        self.settle_reads(st);
        n as u32
    }

    /// The frame in the transmit chain at `head`: in place if it is one
    /// piece of one descriptor, else gathered into `slot`.
    #[inline]
    fn frame_at(
        &self,
        head: u16,
        hdr_len: u32,
        caps: Caps,
        arena: &mut Arena,
    ) -> Result<(FrameRef, Option<Offload>), Refused> {
        let d = self.desc(head);
        // The header's first 10 bytes (the rest is num_buffers, the
        // device's), read once where the fast paths look at it: a header
        // that asks for nothing lets the frame be taken in place; any
        // other sends the chain to be gathered and checked on the copy.
        let plain_hdr = |p: &GuestSlice<'_>| {
            let mut h = [0u8; 10];
            p.read_into(0, &mut h) && VnetHdr::parse(&h).plain()
        };
        let plain = |d: &DescRepr| d.flags & (F_NEXT | F_WRITE | F_INDIRECT) == 0;
        // The frame in one descriptor's buffer `p`, after `skip` bytes.
        let in_place = |p: &GuestSlice<'_>, skip: u32| -> Result<FrameRef, ChainError> {
            let len = p.len() as u32 - skip;
            if len < MIN_FRAME {
                return Err(ChainError::Short);
            }
            if len > MAX_FRAME {
                return Err(ChainError::Long);
            }
            let frame = p
                .sub(skip as usize, len as usize)
                .ok_or(ChainError::Outside)?;
            Ok(FrameRef {
                ptr: frame.as_ptr(),
                len,
            })
        };
        // Header and frame in one descriptor (Linux pushes the header in
        // front of the frame when it can).
        if plain(&d) && d.len >= hdr_len {
            let p = self
                .mem
                .gpa(d.addr, u64::from(d.len))
                .ok_or(ChainError::Outside)?;
            if plain_hdr(&p) {
                return Ok((in_place(&p, hdr_len)?, None));
            }
        }
        // The header alone, then the frame in one descriptor.
        if d.flags == F_NEXT && d.len == hdr_len && d.next < self.num {
            let d1 = self.desc(d.next);
            // The header's own range must be guest memory too.
            let p = self
                .mem
                .gpa(d.addr, u64::from(d.len))
                .ok_or(ChainError::Outside)?;
            if plain(&d1) && plain_hdr(&p) {
                let p1 = self
                    .mem
                    .gpa(d1.addr, u64::from(d1.len))
                    .ok_or(ChainError::Outside)?;
                return Ok((in_place(&p1, 0)?, None));
            }
        }
        // Anything else: gather the header and the frame into the arena,
        // each byte read once. The whole chain is walked (checked) even
        // once the arena's room is full, so that a chain is refused for
        // its first structural fault before any length.
        let mut hdr = [0u8; 12];
        let hlen = hdr_len as usize;
        let slot = arena.tail(MAX_GSO_FRAME as usize);
        let mut from = 0usize;
        let total = self.walk(head, false, |p| {
            let mut off = 0usize;
            if from < hlen {
                let cut = (hlen - from).min(p.len());
                p.read_into(0, &mut hdr[from..from + cut]);
                off = cut;
                from += cut;
            }
            let len = p.len() - off;
            let at = from - hlen.min(from);
            if let Some(dst) = slot.get_mut(at..at + len) {
                p.read_into(off, dst);
            }
            from += len;
            Ok(())
        })?;
        if total < u64::from(hdr_len) + u64::from(MIN_FRAME) {
            return Err(ChainError::Short.into());
        }
        let at = from - hlen;
        if at > slot.len() {
            return Err(ChainError::Long.into());
        }
        let frame = &slot[..at];
        let h = VnetHdr::parse(hdr[..10].try_into().expect("10 bytes"));
        let o = if h.plain() {
            if at > MAX_FRAME as usize {
                return Err(ChainError::Long.into());
            }
            None
        } else {
            Some(offload::check(&h, frame, caps, MAX_FRAME).map_err(Refused::Hdr)?)
        };
        let f = FrameRef {
            ptr: frame.as_ptr(),
            len: at as u32,
        };
        arena.advance(at);
        Ok((f, o))
    }

    /// Return the transmit chains of the last [`Queue::take_tx`] (used,
    /// length 0), publish, and notify per the mode.
    pub fn complete_tx(&mut self, consumed: u32, heads: &[u16], now: Instant, st: &mut QueueStats) {
        for &h in heads {
            self.push_used(h, 0);
        }
        self.last_avail = self.last_avail.wrapping_add(consumed as u16);
        st.chains += heads.len() as u64;
        self.publish(now, st);
    }

    /// A head taken from the available ring is in flight.
    #[inline]
    fn track_take(&mut self, head: u16) {
        if let Some(t) = &mut self.inflight {
            t.take(head);
        }
    }

    #[inline]
    fn push_used(&mut self, head: u16, len: u32) {
        if let Some(t) = &mut self.inflight {
            t.used(head);
        }
        let (id, l) = self.used_elem(self.used_idx);
        id.store(u32::from(head), Relaxed);
        l.store(len, Relaxed);
        self.used_idx = self.used_idx.wrapping_add(1);
    }

    /// Copy `frames` into the guest's receive buffers, in order, until they
    /// run out; returns how many were taken and their bytes. The used
    /// entries are published by [`Queue::publish`]. `meta`, if not empty,
    /// holds each frame's offloads (the guest negotiated what they need:
    /// the caller checked), written into its virtio-net header.
    /// `mergeable`: the guest negotiated `MRG_RXBUF`, so a frame larger
    /// than one buffer is spread over several (`num_buffers` in the first
    /// one's header says how many); without it a frame must fit one chain.
    ///
    /// # Safety
    /// Every frame must be readable for its `len` bytes.
    pub unsafe fn fill_rx(
        &mut self,
        frames: &[FrameRef],
        meta: &[Offload],
        hdr_len: u32,
        mergeable: bool,
        st: &mut QueueStats,
    ) -> (u64, u64) {
        let mut left = self.avail(st);
        let mut ok = 0u64;
        let mut bytes = 0u64;
        let mut k = 0u16;
        let mut bufs = std::mem::take(&mut self.spread);
        'frames: for (i, f) in frames.iter().enumerate() {
            let mut hdr = [0u8; 12];
            if let Some(o) = meta.get(i) {
                hdr[..10].copy_from_slice(&o.vnet_hdr().bytes());
            }
            // num_buffers: one buffer per frame unless spread.
            hdr[10] = 1;
            let hdr = &hdr[..hdr_len as usize];
            let need = u64::from(hdr_len) + u64::from(f.len);
            // Where this frame started, to give back the buffers of a
            // frame spread over more than the ring had.
            let mut k0 = k;
            bufs.clear();
            let mut from = 0u64;
            // A frame whose buffer is refused tries the next one.
            loop {
                if left == 0 || !self.budget_left(st) {
                    k = k0;
                    break 'frames;
                }
                let Some(head) = self.head(k, st) else {
                    k = k0;
                    break 'frames;
                };
                k += 1;
                left -= 1;
                self.track_take(head);
                // SAFETY: forwarded from the caller's contract.
                match unsafe { self.put_frame(head, hdr, *f, from, mergeable) } {
                    Ok(n) => {
                        bufs.push((head, n as u32));
                        from += n;
                        if from < need {
                            continue;
                        }
                        if bufs.len() > 1 {
                            self.set_num_buffers(bufs[0].0, bufs.len() as u16);
                        }
                        for &(h, n) in &bufs {
                            self.push_used(h, n);
                        }
                        ok += 1;
                        bytes += u64::from(f.len);
                        break;
                    }
                    Err(e) => {
                        st.refused[e as usize] += 1;
                        self.push_used(head, 0);
                        // The buffers this frame had filled are returned
                        // empty: the frame is dropped.
                        let partial = !bufs.is_empty();
                        for &(h, _) in &bufs {
                            self.push_used(h, 0);
                        }
                        bufs.clear();
                        if e == ChainError::Loop {
                            self.settle_reads(st);
                            self.looped(head, st);
                            break 'frames;
                        }
                        // Returned entries are consumed: never given back.
                        k0 = k;
                        if partial {
                            break;
                        }
                    }
                }
            }
        }
        bufs.clear();
        self.spread = bufs;
        self.settle_reads(st);
        self.last_avail = self.last_avail.wrapping_add(k);
        st.chains += u64::from(k);
        (ok, bytes)
    }

    /// Write `n` into the `num_buffers` field of the header at the start
    /// of the receive chain at `head` (a frame spread over `n` buffers;
    /// its first buffer held the whole header, [`Queue::put_frame`]).
    fn set_num_buffers(&self, head: u16, n: u16) {
        let d = self.desc(head);
        if let Some(p) = self.mem.gpa(d.addr, u64::from(d.len)) {
            p.write_from(10, &n.to_le_bytes());
        }
    }

    /// Write bytes `from..` of the header `hdr` followed by frame `f` into
    /// the receive chain at `head`; returns the bytes written. Without
    /// `mergeable` the chain must hold all of it; with it, whatever the
    /// chain holds is written, and the first buffer of a frame must hold
    /// at least the header in its first descriptor (the switch writes
    /// `num_buffers` there afterwards).
    ///
    /// # Safety
    /// `f` must be readable for `f.len` bytes.
    #[inline]
    unsafe fn put_frame(
        &self,
        head: u16,
        hdr: &[u8],
        f: FrameRef,
        from: u64,
        mergeable: bool,
    ) -> Result<u64, ChainError> {
        let hdr_len = hdr.len() as u64;
        let need = hdr_len + u64::from(f.len);
        let d = self.desc(head);
        if from == 0 && d.flags & (F_NEXT | F_INDIRECT) == 0 && d.flags & F_WRITE != 0 {
            let p = self
                .mem
                .gpa(d.addr, u64::from(d.len))
                .ok_or(ChainError::Outside)?;
            if u64::from(d.len) >= need {
                p.write_from(0, hdr);
                // SAFETY: the caller guarantees f is readable for f.len
                // bytes; it lies in another port's mapping or a buffer of
                // the switch's, never in this port's own mapping.
                unsafe { p.write_from_raw(hdr.len(), f.ptr, f.len as usize) };
                return Ok(need);
            }
            if !mergeable || u64::from(d.len) < hdr_len {
                return Err(ChainError::Small);
            }
        }
        if from == 0 && mergeable && d.len < hdr.len() as u32 {
            return Err(ChainError::Small);
        }
        // Scatter header then frame over the chain's buffers.
        let mut at_stream = from;
        let total = self.walk(head, true, |p| {
            let len = p.len() as u64;
            let mut at = 0u64;
            while at < len && at_stream < need {
                let n = (len - at).min(need - at_stream);
                let m = if at_stream < hdr_len {
                    let m = n.min(hdr_len - at_stream);
                    let h = at_stream as usize;
                    p.write_from(at as usize, &hdr[h..h + m as usize]);
                    m
                } else {
                    // at_stream - hdr_len + n <= f.len: inside the frame.
                    let src = f.ptr.wrapping_add((at_stream - hdr_len) as usize);
                    // SAFETY: the caller guarantees f is readable for f.len
                    // bytes, and [at_stream - hdr_len, + n) lies inside it;
                    // it is not in this port's own mapping.
                    unsafe { p.write_from_raw(at as usize, src, n as usize) };
                    n
                };
                at += m;
                at_stream += m;
            }
            Ok(())
        })?;
        let wrote = at_stream - from;
        if !mergeable && total < need {
            return Err(ChainError::Small);
        }
        if wrote == 0 {
            return Err(ChainError::Small);
        }
        Ok(wrote)
    }

    /// Make the used entries written so far visible, and call the guest per
    /// the mode.
    pub fn publish(&mut self, now: Instant, st: &mut QueueStats) {
        if self.used_idx == self.published {
            return;
        }
        self.published = self.used_idx;
        self.used_u16(2).store(self.used_idx, Release);
        if let Some(t) = &mut self.inflight {
            t.published(self.used_idx);
        }
        // Kicks: Base asks for one at every publish; the others keep them
        // off while the switch polls (ask_kicks is called around sleeps).
        if self.mode == Mode::Base {
            self.ask_kicks(true);
        } else {
            self.ask_kicks(self.kicks_on);
        }
        let want = self.want_call(st);
        if self.hold {
            // The guest just transmitted: hold what it asked for until it
            // pauses (see the module's notes).
            if want || self.held.is_some() {
                let since = self.held.map_or(now, |(s, _)| s);
                let due = (now + TX_CALL_HOLD).min(since + TX_CALL_HOLD_MAX);
                self.held = Some((since, due));
                if want {
                    st.calls_held += 1;
                }
            }
            return;
        }
        if want {
            if self.moder.request(now) {
                self.fire(st);
            } else {
                st.calls_held += 1;
            }
        }
    }

    /// Whether this publish should interrupt the guest.
    #[inline]
    fn want_call(&mut self, st: &mut QueueStats) -> bool {
        if self.call.is_none() {
            return false;
        }
        if self.mode != Mode::Csb {
            self.signalled_used = self.used_idx;
            self.signalled_valid = true;
            return true;
        }
        // The guest's request is read after our used index is visible.
        fence(SeqCst);
        let want = if self.event_idx {
            let event = self.used_event().load(Relaxed);
            !self.signalled_valid || need_event(event, self.used_idx, self.signalled_used)
        } else {
            self.avail_field(0).load(Relaxed) & VRING_AVAIL_F_NO_INTERRUPT as u16 == 0
        };
        self.signalled_used = self.used_idx;
        self.signalled_valid = true;
        if !want {
            st.calls_suppressed += 1;
        }
        want
    }

    fn fire(&mut self, st: &mut QueueStats) {
        if let Some(c) = &self.call {
            c.signal();
            st.calls += 1;
        }
    }

    /// When a moderated call is due.
    pub fn deadline(&self) -> Option<Instant> {
        match (self.moder.deadline(), self.held) {
            (Some(a), Some((_, b))) => Some(a.min(b)),
            (a, b) => a.or(b.map(|(_, due)| due)),
        }
    }

    /// Fire a held call now (the queue is about to be set up again, and
    /// the guest must not lose an interrupt it was owed).
    pub fn flush_held(&mut self, st: &mut QueueStats) {
        if self.moder.deadline().is_some() || self.held.is_some() {
            self.moder.cancel();
            self.held = None;
            self.fire(st);
        }
    }

    /// Fire a held call whose moderation interval has ended.
    pub fn timer(&mut self, now: Instant, st: &mut QueueStats) {
        if self.moder.due(now) {
            self.fire(st);
        }
        if self.held.is_some_and(|(_, due)| now >= due) {
            self.held = None;
            self.fire(st);
        }
    }

    /// Ask the guest to kick at its next publish (`on`), or not to. With
    /// `EVENT_IDX` the device's `avail_event` says where the guest kicks
    /// (it kicks when a batch it publishes, from `old` to `new`, passes the
    /// event): at the guest's current index (its next entry kicks), or half
    /// the index space away from what was consumed. Not just behind it: the
    /// switch consumes entries while the guest is still adding a batch, so
    /// "consumed - 1" can fall inside the batch's `[old, new)` and draw the
    /// very kick it was meant to avoid (seen with a Linux guest refilling
    /// its receive ring). Half the index space away lies outside any batch
    /// (a ring holds at most 32768). Without `EVENT_IDX`,
    /// `VRING_USED_F_NO_NOTIFY`.
    pub fn ask_kicks(&mut self, on: bool) {
        self.kicks_on = on;
        if self.event_idx {
            // Any value is harmless to write: it only steers the guest's
            // kicks.
            let at = if on {
                self.avail_idx().load(Relaxed)
            } else {
                self.last_avail.wrapping_add(0x8000)
            };
            self.used_u16(4 + 8 * self.num as usize).store(at, Relaxed);
        } else {
            let f = if on { 0 } else { VRING_USED_F_NO_NOTIFY as u16 };
            self.used_u16(0).store(f, Relaxed);
        }
    }

    /// Before the switch sleeps: ask for kicks, then look again (a frame
    /// published before the guest saw the request would neither be seen nor
    /// kicked). False if there is work (kicks are off again).
    pub fn prepare_sleep(&mut self, st: &mut QueueStats) -> bool {
        if self.broken.is_some() {
            return true;
        }
        self.ask_kicks(true);
        fence(SeqCst);
        if self.avail(st) > 0 {
            if self.mode != Mode::Base {
                self.ask_kicks(false);
            }
            return false;
        }
        true
    }

    /// The switch polls again: no kicks wanted (except in `Base`).
    pub fn wake(&mut self) {
        if self.mode != Mode::Base && self.broken.is_none() {
            self.ask_kicks(false);
        }
    }
}

/// Why a transmitted chain was refused: its shape, or its header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Refused {
    Chain(ChainError),
    Hdr(HdrError),
}

impl From<ChainError> for Refused {
    fn from(e: ChainError) -> Refused {
        Refused::Chain(e)
    }
}

/// The transmit queue's gathering buffer ([`ARENA_BYTES`]): frames not
/// taken in place are gathered here one after another for a batch, and
/// their pointers live until the batch is forwarded. It is allocated once,
/// at its full size, the first time a frame is gathered, and never grows,
/// so no pointer into it moves.
#[derive(Default)]
pub struct Arena {
    buf: Vec<u8>,
    used: usize,
}

impl Arena {
    /// A new batch: the previous one's frames are forwarded.
    fn reset(&mut self) {
        self.used = 0;
    }

    /// Bytes left for this batch.
    fn left(&self) -> usize {
        ARENA_BYTES - self.used
    }

    /// The free room, at most `max` bytes (allocated on first use).
    fn tail(&mut self, max: usize) -> &mut [u8] {
        if self.buf.is_empty() {
            self.buf = vec![0; ARENA_BYTES];
        }
        let end = (self.used + max).min(ARENA_BYTES);
        &mut self.buf[self.used..end]
    }

    /// Keep `n` bytes of the room (a frame gathered), 8-byte aligned.
    fn advance(&mut self, n: usize) {
        self.used = (self.used + n.next_multiple_of(8)).min(ARENA_BYTES);
    }
}

/// The hash that keeps a flow on one receive queue: the 5-tuple of a
/// TCP or UDP frame over IPv4 or IPv6 ([`packet::parse::steer_flow`], the
/// flow key and hash the load balancer steers by), else the frame's two
/// MAC addresses (ARP, ICMP, fragments: one queue per pair of hosts).
pub fn flow_hash(frame: &[u8]) -> u64 {
    /// Any fixed value: the hash only has to be the same for a flow's
    /// frames.
    const SEED: u64 = 0x6d71_7565_7565_7321;
    if let Some(k) = packet::parse::steer_flow(frame) {
        return k.hash(SEED);
    }
    let mut a = [0u8; 16];
    let n = frame.len().min(12);
    a[..n].copy_from_slice(&frame[..n]);
    let mut b = [0u8; 16];
    b[0] = n as u8;
    packet::flow::FlowKey {
        src: a,
        dst: b,
        src_port: 0,
        dst_port: 0,
        proto: 0,
    }
    .hash(SEED)
}

/// The receive queue among `enabled` (queue indices, in order) that the
/// flow with hash `h` goes to; `None` without one. The same hash and the
/// same set always give the same queue, and every queue of the set gets
/// its share of hashes.
#[inline]
pub fn pick_rx(h: u64, enabled: &[usize]) -> Option<usize> {
    match enabled.len() {
        0 => None,
        1 => Some(enabled[0]),
        // Multiply-shift: the high bits of a 64-bit hash, spread over n.
        n => Some(enabled[((u128::from(h) * n as u128) >> 64) as usize]),
    }
}

/// One transmit queue's part of a batch: the queue, the entries it
/// consumed, and where its heads end in [`Device`]'s list.
#[derive(Clone, Copy, Debug)]
struct Taken {
    queue: usize,
    consumed: u32,
    heads_end: usize,
}

/// The running device: the queues that are set up, and the header length
/// the features imply.
///
/// With several queue pairs, a batch from the guest ([`Device::rx`]) takes
/// from every running transmit queue, each up to an equal share of the
/// batch, starting one queue further every batch, so that no queue's
/// traffic waits behind another's; the descriptor budget is shared the
/// same way ([`QueueSetup::share`]). Frames for the guest go to the
/// receive queue the flow's hash picks among the running ones
/// ([`flow_hash`], [`pick_rx`]): a flow stays in order on one queue, and a
/// queue the guest turned off gets nothing. Notifications, moderation and
/// the kick window are each queue's own.
pub struct Device {
    /// Queue `2k` (to the guest) and `2k + 1` (from the guest) of each
    /// pair `k`, when running.
    pub queues: Vec<Option<Queue>>,
    /// Bytes of virtio-net header in front of every frame.
    pub hdr_len: u32,
    /// What the guest may ask of the switch (`CSUM`, `HOST_TSO4/6`).
    pub tx_caps: Caps,
    /// What the switch may hand the guest unfinished (`GUEST_CSUM`,
    /// `GUEST_TSO4/6`).
    pub rx_caps: Caps,
    /// Whether `MRG_RXBUF` was negotiated.
    pub mergeable: bool,
    heads: Vec<u16>,
    arena: Arena,
    offloads: Vec<(u32, Offload)>,
    /// What each transmit queue took in the last [`Device::rx`].
    taken: Vec<Taken>,
    /// The transmit queue the next batch starts at (a pair number).
    next_tx: usize,
    /// The running receive queues, in order; refreshed per delivery batch.
    rx_on: Vec<usize>,
    /// Frames per receive queue of the batch being delivered: indices into
    /// the batch, kept between batches so that none allocates.
    steer: Vec<Vec<u32>>,
    /// Scratch for one queue's frames of a batch.
    scratch: Vec<FrameRef>,
}

impl Device {
    /// A device over the queues given (`2k`: receive, `2k + 1`: transmit).
    pub fn new(mut queues: Vec<Option<Queue>>, hdr_len: u32) -> Device {
        for (i, q) in queues.iter_mut().enumerate() {
            if let (true, Some(q)) = (is_tx(i), q) {
                q.hold_calls();
            }
        }
        let n = queues.len();
        Device {
            queues,
            hdr_len,
            tx_caps: Caps::NONE,
            rx_caps: Caps::NONE,
            mergeable: false,
            heads: Vec::new(),
            arena: Arena::default(),
            offloads: Vec::new(),
            taken: Vec::new(),
            next_tx: 0,
            rx_on: Vec::with_capacity(n / 2),
            steer: (0..n / 2).map(|_| Vec::new()).collect(),
            scratch: Vec::new(),
        }
    }

    /// The offloads the features negotiated: the guest's transmit side
    /// (`tx`), its receive side (`rx`), and `MRG_RXBUF`.
    pub fn set_offloads(&mut self, tx: Caps, rx: Caps, mergeable: bool) {
        self.tx_caps = tx;
        self.rx_caps = rx;
        self.mergeable = mergeable;
    }

    /// The offloads of the frames of the last [`Device::rx`] (index in its
    /// batch, what the frame asks).
    pub fn rx_offloads(&self) -> &[(u32, Offload)] {
        &self.offloads
    }

    /// Queue pairs of the device (running or not).
    pub fn pairs(&self) -> usize {
        self.queues.len() / 2
    }

    /// Whether the guest has transmitted frames not yet taken, on any
    /// transmit queue.
    #[inline]
    pub fn pending(&mut self, st: &mut [QueueStats]) -> bool {
        let mut any = false;
        for (i, q) in self.queues.iter_mut().enumerate() {
            if let (true, Some(q)) = (is_tx(i), q) {
                if q.avail(&mut st[i]) > 0 {
                    any = true;
                    break;
                }
            }
        }
        any
    }

    /// Take up to `max` transmitted frames, an equal share of them from
    /// each running transmit queue (the first queue asked moves on by one
    /// every batch; a share one queue leaves is not given to the next, so
    /// a busy queue never takes another's); returns the token for
    /// [`Device::rx_done`].
    pub fn rx(&mut self, max: u32, out: &mut Vec<FrameRef>, st: &mut [QueueStats]) -> u32 {
        self.heads.clear();
        self.offloads.clear();
        self.taken.clear();
        self.arena.reset();
        let pairs = self.pairs();
        let running = (0..pairs)
            .filter(|p| self.queues[2 * p + 1].is_some())
            .count() as u32;
        if running == 0 {
            return 0;
        }
        let share = max.div_ceil(running);
        let start = self.next_tx % pairs.max(1);
        self.next_tx = (start + 1) % pairs.max(1);
        let mut total = 0u32;
        for k in 0..pairs {
            let i = 2 * ((start + k) % pairs) + 1;
            let Some(q) = &mut self.queues[i] else {
                continue;
            };
            let room = share.min(max - total);
            if room == 0 {
                break;
            }
            let before = out.len() as u32;
            let consumed = q.take_tx(
                room,
                self.hdr_len,
                self.tx_caps,
                out,
                &mut self.offloads,
                &mut self.heads,
                &mut self.arena,
                &mut st[i],
            );
            total += out.len() as u32 - before;
            if consumed > 0 {
                self.taken.push(Taken {
                    queue: i,
                    consumed,
                    heads_end: self.heads.len(),
                });
            }
        }
        total
    }

    /// The frames of the last [`Device::rx`] are forwarded: return their
    /// chains to the guest, each queue its own.
    pub fn rx_done(&mut self, _token: u32, now: Instant, st: &mut [QueueStats]) {
        let mut from = 0;
        for t in &self.taken {
            if let Some(q) = &mut self.queues[t.queue] {
                q.complete_tx(
                    t.consumed,
                    &self.heads[from..t.heads_end],
                    now,
                    &mut st[t.queue],
                );
            }
            from = t.heads_end;
        }
        self.taken.clear();
        self.heads.clear();
    }

    /// The running receive queues, in order (those the guest enabled and
    /// that are not stopped).
    fn refresh_rx_on(&mut self) {
        self.rx_on.clear();
        for (i, q) in self.queues.iter().enumerate() {
            if let (false, Some(q)) = (is_tx(i), q) {
                if q.broken().is_none() {
                    self.rx_on.push(i);
                }
            }
        }
    }

    /// The receive queues running now: where [`Device::tx`] may deliver.
    pub fn rx_running(&mut self) -> &[usize] {
        self.refresh_rx_on();
        &self.rx_on
    }

    /// Copy frames into the guest's receive queues (published by
    /// [`Device::tx_flush`]), each frame into the queue its flow's hash
    /// picks; returns frames and bytes taken.
    ///
    /// # Safety
    /// Every frame must be readable for its `len` bytes.
    pub unsafe fn tx(&mut self, frames: &[FrameRef], st: &mut [QueueStats]) -> (u64, u64) {
        self.refresh_rx_on();
        match self.rx_on.len() {
            0 => (0, 0),
            1 => {
                let i = self.rx_on[0];
                match &mut self.queues[i] {
                    // SAFETY: forwarded from the caller's contract.
                    Some(q) => unsafe {
                        q.fill_rx(frames, &[], self.hdr_len, self.mergeable, &mut st[i])
                    },
                    None => (0, 0),
                }
            }
            _ => {
                for v in &mut self.steer {
                    v.clear();
                }
                for (k, f) in frames.iter().enumerate() {
                    // SAFETY: the caller's contract: f is readable for
                    // f.len bytes.
                    let b = unsafe { std::slice::from_raw_parts(f.ptr, f.len as usize) };
                    if let Some(i) = pick_rx(flow_hash(b), &self.rx_on) {
                        self.steer[i / 2].push(k as u32);
                    }
                }
                let (mut ok, mut bytes) = (0, 0);
                for p in 0..self.steer.len() {
                    if self.steer[p].is_empty() {
                        continue;
                    }
                    let i = 2 * p;
                    self.scratch.clear();
                    self.scratch
                        .extend(self.steer[p].iter().map(|&k| frames[k as usize]));
                    if let Some(q) = &mut self.queues[i] {
                        // SAFETY: the frames are the caller's, readable
                        // per its contract.
                        let (o, b) = unsafe {
                            q.fill_rx(&self.scratch, &[], self.hdr_len, self.mergeable, &mut st[i])
                        };
                        ok += o;
                        bytes += b;
                    }
                }
                (ok, bytes)
            }
        }
    }

    /// Copy one frame with offloads the guest negotiated ([`Caps::accepts`]
    /// on [`Device::rx_caps`]) into the receive queue its flow's hash
    /// picks, its virtio-net header saying what is left to do; returns
    /// frames and bytes taken.
    ///
    /// # Safety
    /// `f` must be readable for its `len` bytes.
    pub unsafe fn tx_offload(
        &mut self,
        f: FrameRef,
        o: &Offload,
        st: &mut [QueueStats],
    ) -> (u64, u64) {
        if !self.rx_caps.accepts(o) {
            return (0, 0);
        }
        self.refresh_rx_on();
        let i = if self.rx_on.len() > 1 {
            // SAFETY: the caller's contract: f is readable for f.len bytes.
            let b = unsafe { std::slice::from_raw_parts(f.ptr, f.len as usize) };
            pick_rx(flow_hash(b), &self.rx_on)
        } else {
            self.rx_on.first().copied()
        };
        match i.and_then(|i| self.queues[i].as_mut().map(|q| (i, q))) {
            // SAFETY: forwarded from the caller's contract.
            Some((i, q)) => unsafe {
                q.fill_rx(&[f], &[*o], self.hdr_len, self.mergeable, &mut st[i])
            },
            None => (0, 0),
        }
    }

    /// Publish what [`Device::tx`] wrote, and notify, queue by queue. A
    /// delivery batch ends here: the receive queues' descriptor budgets
    /// are refilled for the next.
    pub fn tx_flush(&mut self, now: Instant, st: &mut [QueueStats]) {
        for (i, q) in self.queues.iter_mut().enumerate() {
            if let (false, Some(q)) = (is_tx(i), q) {
                q.publish(now, &mut st[i]);
                q.refill(&mut st[i]);
            }
        }
    }

    /// The earliest moderated call due.
    pub fn deadline(&self) -> Option<Instant> {
        self.queues
            .iter()
            .flatten()
            .filter_map(|q| q.deadline())
            .min()
    }

    /// Fire the moderated calls that are due.
    pub fn timer(&mut self, now: Instant, st: &mut [QueueStats]) {
        for (i, q) in self.queues.iter_mut().enumerate() {
            if let Some(q) = q {
                q.timer(now, &mut st[i]);
            }
        }
    }

    /// About to sleep: ask for kicks on every transmit queue and look
    /// again; true if all are still empty.
    pub fn prepare_sleep(&mut self, st: &mut [QueueStats]) -> bool {
        let mut idle = true;
        for (i, q) in self.queues.iter_mut().enumerate() {
            if let (true, Some(q)) = (is_tx(i), q) {
                // Every queue is asked, even once one has work: each must
                // kick if it gets work while the switch sleeps.
                idle &= q.prepare_sleep(&mut st[i]);
            }
        }
        if !idle {
            // The switch stays awake: the queues that asked for kicks
            // stop asking, as the one with work already did.
            self.wake();
        }
        idle
    }

    /// Awake again: transmit kicks off (except in `Base`).
    pub fn wake(&mut self) {
        for (i, q) in self.queues.iter_mut().enumerate() {
            if let (true, Some(q)) = (is_tx(i), q) {
                q.wake();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_index_crossings() {
        // Moving from old to new notifies iff event is in [old, new).
        assert!(need_event(5, 6, 5));
        assert!(!need_event(5, 5, 4));
        assert!(need_event(4, 10, 0));
        assert!(!need_event(10, 10, 0));
        // Across the wrap.
        assert!(need_event(65535, 2, 65534));
        assert!(!need_event(2, 2, 65534));
        // Half the index space away is outside any batch a ring can hold.
        for last in [0u16, 1, 40000, 65535] {
            let event = last.wrapping_add(0x8000);
            for old_back in [0u16, 1, 100, 32767] {
                let old = last.wrapping_sub(old_back);
                for n in [1u16, 64, 32767] {
                    if n >= old_back {
                        assert!(
                            !need_event(event, old.wrapping_add(n), old),
                            "{last} {old} {n}"
                        );
                    }
                }
            }
        }
    }

    /// A UDP/IPv4 frame of flow `(sport, dport)` between two fixed hosts.
    fn udp(sport: u16, dport: u16) -> Vec<u8> {
        let mut f = vec![0u8; 60];
        f[..6].copy_from_slice(&[2, 0, 0, 0, 0, 2]);
        f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        f[14] = 0x45;
        f[23] = 17;
        f[26..30].copy_from_slice(&[198, 18, 0, 1]);
        f[30..34].copy_from_slice(&[198, 18, 0, 2]);
        f[34..36].copy_from_slice(&sport.to_be_bytes());
        f[36..38].copy_from_slice(&dport.to_be_bytes());
        f
    }

    proptest::proptest! {
        /// A flow always goes to one queue, and that queue is enabled;
        /// a queue not enabled is never chosen.
        #[test]
        fn a_flow_maps_to_one_enabled_queue(
            sport: u16,
            dport: u16,
            mask in 1u8..=255,
            seq: u32,
        ) {
            let enabled: Vec<usize> = (0..8).filter(|p| mask & (1 << p) != 0).map(|p| 2 * p).collect();
            let mut f = udp(sport, dport);
            let q = pick_rx(flow_hash(&f), &enabled).unwrap();
            proptest::prop_assert!(enabled.contains(&q));
            // Another frame of the flow (its payload differs): same queue.
            f[42..46].copy_from_slice(&seq.to_le_bytes());
            proptest::prop_assert_eq!(pick_rx(flow_hash(&f), &enabled), Some(q));
        }
    }

    #[test]
    fn many_flows_use_every_enabled_queue_and_no_other() {
        for enabled in [
            vec![0, 2],
            vec![0, 2, 4, 6],
            vec![2, 6],
            vec![0, 4, 6, 8, 14],
        ] {
            let mut per = std::collections::BTreeMap::<usize, u32>::new();
            let flows = 4000u32;
            for i in 0..flows {
                let q = pick_rx(flow_hash(&udp(1024 + i as u16, 5201)), &enabled).unwrap();
                *per.entry(q).or_default() += 1;
            }
            assert_eq!(per.keys().copied().collect::<Vec<_>>(), enabled);
            // Each queue within a third of its fair share.
            let fair = flows / enabled.len() as u32;
            for (q, n) in &per {
                assert!(
                    *n > fair * 2 / 3 && *n < fair * 4 / 3,
                    "queue {q}: {n} of {flows} flows over {enabled:?}"
                );
            }
        }
        // Frames that are not TCP or UDP (ARP here) hash by their
        // addresses: the same pair of hosts, the same queue.
        let mut arp = vec![0xffu8; 6];
        arp.extend_from_slice(&[2, 0, 0, 0, 0, 1, 0x08, 0x06]);
        arp.resize(42, 0);
        let q = pick_rx(flow_hash(&arp), &[0, 2]);
        arp[30] = 9;
        assert_eq!(pick_rx(flow_hash(&arp), &[0, 2]), q);
        assert_eq!(pick_rx(7, &[]), None);
        assert_eq!(pick_rx(u64::MAX, &[4]), Some(4));
    }

    #[test]
    fn refusal_names_are_distinct_and_in_counter_order() {
        let mut names: Vec<&str> = ChainError::ALL.iter().map(|e| e.name()).collect();
        for (i, e) in ChainError::ALL.iter().enumerate() {
            assert_eq!(*e as usize, i);
        }
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ChainError::ALL.len());
    }
}
