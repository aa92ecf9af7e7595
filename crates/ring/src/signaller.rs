//! Raising an eventfd that a peer shares, without ever blocking.
//!
//! An interrupt line (vhost-user's call fd, a ring port's irq fd, memif's
//! interrupt fd) is an open file description shared with the peer through
//! SCM_RIGHTS, so its `O_NONBLOCK` flag is the peer's to clear. A peer that
//! clears it and fills the counter to 2^64-2 would make a plain `write(2)`
//! of 1 sleep until somebody reads the counter: the whole switch would stop
//! behind one port. `pwritev2(RWF_NOWAIT)` would decide per call, but the
//! eventfd has no `write_iter` (the kernel answers `EOPNOTSUPP`).
//!
//! So the write goes through an io_uring. The kernel tries it inline,
//! without sleeping (`IOCB_NOWAIT`): with the flag set, as it is unless the
//! peer changed it, it completes during the submission, as a `write(2)`
//! would. If it would sleep, io_uring hands it to one of its own kernel
//! workers, and the caller goes on; the line is *busy* until that write
//! completes (the guest read its counter) and further signals on it are
//! counted as held, not queued: a line never has more than one write in
//! flight, so one hostile peer holds at most one kernel worker. Dropping
//! the line cancels its pending write.
//!
//! Reads need no ring: `preadv2(RWF_NOWAIT)` is honoured by the eventfd's
//! `read_iter`, whatever the shared flags say (see [`crate::notify`]).
//!
//! Cost, measured on this project's 2-core development machine with a
//! release build (200,000 signals on a non-blocking eventfd): 325 ns per
//! `write(2)`, 607 ns per io_uring submission with its completion reaped.
//! Signals are moderated (one per batch, not per packet), so this is paid
//! per interrupt, not per frame.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use io_uring::{opcode, types, IoUring};

/// What one signal writes: the eventfd counter's increment. Static, so the
/// buffer outlives any write that a kernel worker completes later.
static ONE: u64 = 1;

/// Submission entries of the ring (signals are submitted one at a time, so
/// this only bounds cancellations queued behind a full submission queue).
const ENTRIES: u32 = 64;

/// Completion entries: room for every line that can have a write in flight.
const COMPLETIONS: u32 = 4096;

/// The most lines with a write in flight at once. Each holds a kernel
/// worker while its peer keeps the counter full; beyond this many, a signal
/// on a further line is counted as failed instead of submitted.
pub const MAX_IN_FLIGHT: usize = COMPLETIONS as usize / 2;

/// The counters and state of one interrupt line.
#[derive(Debug, Default)]
pub struct Line {
    /// A write is in flight (submitted, not yet completed).
    busy: AtomicBool,
    /// The `user_data` of the write in flight, valid while `busy`.
    ticket: AtomicU64,
    /// Signals whose write completed.
    raised: AtomicU64,
    /// Signals not written because the line's previous write was still in
    /// flight (the peer had not read its counter).
    held: AtomicU64,
    /// Signals that could not be written: the write failed (e.g. a full
    /// counter on a non-blocking line) or was cancelled with its line, or
    /// could not be submitted.
    failed: AtomicU64,
    /// Writes that had to wait for the peer (handed to a kernel worker).
    deferred: AtomicU64,
}

/// A snapshot of a line's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct LineStats {
    /// Signals written.
    pub raised: u64,
    /// Signals whose write is in flight (0 or 1): each signal is in exactly
    /// one of `raised`, `in_flight`, `held` and `failed`.
    pub in_flight: u64,
    /// Signals held back because the previous one was still in flight.
    pub held: u64,
    /// Signals that could not be written.
    pub failed: u64,
    /// Writes that could not complete at once (the peer's counter was full
    /// or its line had been made blocking) and waited in a kernel worker.
    pub deferred: u64,
}

impl LineStats {
    /// Signals that did not reach the line: held behind a write in flight,
    /// or failed.
    pub fn blocked(&self) -> u64 {
        self.held + self.failed
    }
}

impl Line {
    /// The counters now.
    pub fn stats(&self) -> LineStats {
        LineStats {
            raised: self.raised.load(Ordering::Relaxed),
            in_flight: u64::from(self.busy.load(Ordering::Acquire)),
            held: self.held.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            deferred: self.deferred.load(Ordering::Relaxed),
        }
    }

    /// Counts a signal that could not be written.
    pub(crate) fn failed_one(&self) {
        self.failed.fetch_add(1, Ordering::Relaxed);
    }

    /// True while a write on this line waits for its peer.
    pub fn busy(&self) -> bool {
        self.busy.load(Ordering::Acquire)
    }
}

/// Why the ring that raises signals could not be made.
#[derive(Debug, thiserror::Error)]
#[error("io_uring for raising interrupts without blocking: {0}")]
pub struct Unavailable(String);

struct Signaller {
    ring: IoUring,
    /// The line of each write in flight, by `user_data` (index + 1; 0 is
    /// the `user_data` of cancellations, whose completions carry nothing).
    slots: Vec<Option<Arc<Line>>>,
    free: Vec<usize>,
    in_flight: usize,
}

static SIGNALLER: OnceLock<Result<Mutex<Signaller>, String>> = OnceLock::new();

fn signaller() -> Result<&'static Mutex<Signaller>, Unavailable> {
    SIGNALLER
        .get_or_init(|| {
            IoUring::builder()
                .setup_cqsize(COMPLETIONS)
                .build(ENTRIES)
                .map(|ring| {
                    Mutex::new(Signaller {
                        ring,
                        slots: Vec::new(),
                        free: Vec::new(),
                        in_flight: 0,
                    })
                })
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| Unavailable(e.clone()))
}

/// Makes the ring now, so that a daemon can refuse to start where signals
/// could not be raised without blocking (io_uring disabled by
/// `kernel.io_uring_disabled`, or by a seccomp filter).
pub fn ready() -> Result<(), Unavailable> {
    signaller().map(|_| ())
}

impl Signaller {
    /// Takes in the completions there are (no system call: they are read
    /// from the ring's shared memory).
    fn reap(&mut self) {
        // Fields apart, so that the completions are taken in place (no
        // allocation: this runs on every signal).
        let Signaller {
            ring,
            slots,
            free,
            in_flight,
        } = self;
        for cqe in ring.completion() {
            let Some(i) = (cqe.user_data() as usize).checked_sub(1) else {
                continue; // a cancellation's own completion
            };
            if let Some(line) = slots.get_mut(i).and_then(Option::take) {
                if cqe.result() < 0 {
                    line.failed.fetch_add(1, Ordering::Relaxed);
                } else {
                    line.raised.fetch_add(1, Ordering::Relaxed);
                }
                line.busy.store(false, Ordering::Release);
                free.push(i);
                *in_flight -= 1;
            }
        }
    }

    fn submit(&mut self, fd: types::Fd, line: &Arc<Line>) {
        self.reap();
        if line.busy.load(Ordering::Acquire) {
            line.held.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if self.in_flight >= MAX_IN_FLIGHT {
            line.failed.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let i = self.free.pop().unwrap_or_else(|| {
            self.slots.push(None);
            self.slots.len() - 1
        });
        let ud = i as u64 + 1;
        let entry = opcode::Write::new(fd, std::ptr::addr_of!(ONE).cast::<u8>(), 8)
            // -1: the file's own position (an eventfd has none to seek).
            .offset(u64::MAX)
            .build()
            .user_data(ud);
        // SAFETY: the buffer is the static `ONE`, valid for ever; the
        // descriptor is resolved to its file by the kernel during the
        // `submit` below (no SQPOLL, no IOSQE_ASYNC), while the caller still
        // borrows the `EventFd`, so a descriptor closed or reused later is
        // never written through.
        let pushed = unsafe { self.ring.submission().push(&entry) }.is_ok();
        if !pushed || self.ring.submit().is_err() {
            self.free.push(i);
            line.failed.fetch_add(1, Ordering::Relaxed);
            return;
        }
        line.ticket.store(ud, Ordering::Relaxed);
        line.busy.store(true, Ordering::Release);
        self.slots[i] = Some(Arc::clone(line));
        self.in_flight += 1;
        // A write that completed inline is seen at once; one that did not
        // was handed to a kernel worker and waits for the peer.
        self.reap();
        if line.busy.load(Ordering::Acquire) {
            line.deferred.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn cancel(&mut self, line: &Line) {
        self.reap();
        if !line.busy.load(Ordering::Acquire) {
            return;
        }
        let entry = opcode::AsyncCancel::new(line.ticket.load(Ordering::Relaxed))
            .build()
            .user_data(0);
        // SAFETY: a cancellation refers to no buffer; its target is named by
        // `user_data`, not by a pointer.
        if unsafe { self.ring.submission().push(&entry) }.is_ok() {
            let _ = self.ring.submit();
        }
    }
}

/// Raises `fd` through the ring; returns false if no ring could be made
/// (the caller then falls back to a plain non-blocking write).
pub(crate) fn signal(fd: std::os::fd::BorrowedFd<'_>, line: &Arc<Line>) -> bool {
    use std::os::fd::AsRawFd;
    let Ok(s) = signaller() else {
        return false;
    };
    // A poisoned lock only means another thread panicked between two
    // statements that leave the slot table consistent either way.
    let mut s = s.lock().unwrap_or_else(|p| p.into_inner());
    s.submit(types::Fd(fd.as_raw_fd()), line);
    true
}

/// Cancels the line's write in flight, if it has one (its descriptor is
/// being closed).
pub(crate) fn cancel(line: &Line) {
    if !line.busy.load(Ordering::Acquire) {
        return;
    }
    if let Ok(s) = signaller() {
        let mut s = s.lock().unwrap_or_else(|p| p.into_inner());
        s.cancel(line);
    }
}
