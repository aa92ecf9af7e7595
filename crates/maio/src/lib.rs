//! MAIO's I/O memory: a pool of fixed-size buffers in hugepage memory
//! (paper: "MAIO: a memory allocator for I/O").
//!
//! - **Memory**: one region of 2 MiB hugepages (`MAP_HUGETLB`); when none are
//!   reserved, transparent hugepages on normal memory, with a warning that
//!   says how to reserve them.
//! - **page_frag chunks**: the region is handed out 64 KiB chunk by chunk,
//!   and buffers are carved from the current chunk by bumping an offset, as
//!   the kernel's page_frag allocator does; carved buffers are then recycled
//!   through magazines and never carved again.
//! - **Magazines** (Bonwick): each thread's [`Handle`] caches two magazines of
//!   up to 64 buffer indices; it talks to the shared depot (a mutex) only when
//!   both are empty or both are full, so most allocations and frees touch no
//!   shared cache line. A thread that allocates and frees in bursts larger
//!   than that takes a deeper handle ([`Pool::handle_with_depth`]): else
//!   every burst goes through the depot, and buffers another thread freed
//!   (cache lines last written on its core) come back in its place.
//! - **Ownership**: every buffer has an atomic state ([`State`]); each
//!   transition is a compare-and-swap from the states it may come from, so a
//!   double free, a free of a buffer the kernel still owns, or an index not
//!   from this pool is reported as an [`Error`], never undefined behaviour.
//!   Exhaustion is an error the caller handles (the paper's "kernel
//!   starvation").
//!
//! Buffers are named by [`Buf`], a token that is not `Clone`: holding it is
//! owning the buffer, which is what makes [`Pool::data_mut`] sound.
//!
//! # Example
//!
//! ```
//! use maio::{Config, Pool, State};
//!
//! // Hugepages if some are reserved, else normal memory and a `tracing` warning.
//! let pool = Pool::new(Config { buffers: 256, buf_size: 2048, ..Config::default() })?;
//! let mut handle = pool.handle(); // one per thread
//! let mut buf = handle.alloc()?;
//! pool.data_mut(&mut buf)[..5].copy_from_slice(b"hello");
//! assert_eq!(pool.state(buf.index()), Some(State::User));
//! handle.free(buf)?;
//! assert_eq!(pool.stats().in_use, 0);
//! # Ok::<(), maio::Error>(())
//! ```
//!
//! Sending from the pool with [`uring`] (where the kernel has io_uring):
//!
//! ```
//! use std::net::UdpSocket;
//! use std::time::Duration;
//! use maio::uring::{self, Ring};
//!
//! let pool = maio::Pool::new(maio::Config { buffers: 256, ..Default::default() })?;
//! let cfg = uring::Config { rx_buffers: 16, ..Default::default() };
//! let Ok(mut ring) = Ring::new(&pool, cfg) else { return Ok(()) }; // no io_uring here
//! let (rx, tx) = (UdpSocket::bind("127.0.0.1:0")?, UdpSocket::bind("127.0.0.1:0")?);
//! tx.connect(rx.local_addr()?)?;
//! let s = ring.add_socket(tx.into())?;
//! ring.send_copy(s, b"hello")?; // copied into a pool buffer, sent by the kernel
//! assert!(ring.drain(Duration::from_secs(2)));
//! let mut got = [0; 16];
//! assert_eq!(rx.recv(&mut got)?, 5);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! `cargo run -p maio --example pool_send` goes further: zero-copy sends of
//! pool buffers on TCP, each handed back when the kernel is done with it,
//! and the plain path where io_uring is missing.

pub mod uring;

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use memmap2::{MmapMut, MmapOptions};

/// Hints the CPU to fetch the cache line at `p` (a no-op off x86-64).
/// Batched code issues these for a whole batch before touching any of it,
/// so the misses overlap instead of queueing up one by one.
#[inline(always)]
pub fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is only a hint: it never faults and has no effect
    // on program state for any address, valid or not; SSE is part of the
    // x86-64 baseline, so the instruction always exists.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Size of a page_frag chunk.
pub const CHUNK_SIZE: usize = 64 * 1024;
/// Size of a hugepage.
pub const HUGEPAGE_SIZE: usize = 2 * 1024 * 1024;
/// Default magazine depth.
pub const MAGAZINE_DEPTH: usize = 64;

/// Who owns a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum State {
    /// In the pool (a magazine, the depot, or not yet carved).
    Free = 0,
    /// Held by the application.
    User = 1,
    /// Handed to the kernel (or a NIC) for I/O; not to be touched or freed.
    InFlight = 2,
    /// Filled by the kernel (or a NIC) and handed to the application.
    Received = 3,
}

impl State {
    fn from_u8(v: u8) -> State {
        match v {
            1 => State::User,
            2 => State::InFlight,
            3 => State::Received,
            _ => State::Free,
        }
    }
}

/// Errors from the pool. Each says what to do.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Every buffer is in use.
    #[error("buffer pool exhausted: all {0} buffers are in use (free some, or create the pool with more buffers)")]
    Exhausted(u32),
    /// The buffer was already free.
    #[error("double free of buffer {0}")]
    DoubleFree(u32),
    /// The buffer is owned by the kernel and cannot be freed or reused yet.
    #[error("buffer {0} is in flight to the kernel; wait for its completion before freeing it")]
    InFlight(u32),
    /// A transition from a state the buffer is not in.
    #[error("buffer {idx} is {actual:?}, expected {expected}")]
    WrongState {
        /// Buffer index.
        idx: u32,
        /// Its state.
        actual: State,
        /// What the caller assumed.
        expected: &'static str,
    },
    /// An index or address that is not from this pool.
    #[error("{0} is not a buffer of this pool")]
    Foreign(String),
    /// A bad configuration.
    #[error("invalid pool configuration: {0}")]
    Config(String),
    /// Hugepages were required and none could be mapped.
    #[error("cannot map {bytes} bytes of hugepages ({source}); reserve them with `echo {pages} > /proc/sys/vm/nr_hugepages` as root")]
    NoHugepages {
        /// Bytes requested.
        bytes: usize,
        /// Hugepages to reserve.
        pages: usize,
        /// The system's answer.
        #[source]
        source: std::io::Error,
    },
    /// The region could not be mapped at all.
    #[error("cannot map {bytes} bytes for the buffer pool: {source}")]
    Map {
        /// Bytes requested.
        bytes: usize,
        /// The system's answer.
        #[source]
        source: std::io::Error,
    },
}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, Error>;

/// Whether to use hugepages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Hugepages {
    /// Hugepages if reserved, else transparent hugepages with a warning.
    #[default]
    Auto,
    /// Hugepages or an error.
    Require,
    /// Normal pages (tests, small pools).
    Never,
}

/// What kind of memory backs the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backing {
    /// Reserved 2 MiB hugepages.
    Hugetlb,
    /// Normal pages, with transparent hugepages requested.
    Transparent,
    /// Normal pages.
    Normal,
}

/// Pool parameters.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    /// Number of buffers.
    pub buffers: u32,
    /// Bytes per buffer: a power of two from 256 to 64 KiB.
    pub buf_size: usize,
    /// Hugepage policy.
    pub hugepages: Hugepages,
    /// Buffers per magazine.
    pub magazine_depth: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            buffers: 4096,
            buf_size: 2048,
            hugepages: Hugepages::Auto,
            magazine_depth: MAGAZINE_DEPTH,
        }
    }
}

/// Owning token for one buffer. Not `Clone`: whoever holds it owns the bytes.
/// Return it with [`Handle::free`]; dropping it leaks the buffer (counted in
/// [`Stats::in_use`]).
#[derive(Debug, PartialEq, Eq)]
pub struct Buf(u32);

impl Buf {
    /// The buffer's index in its pool.
    pub fn index(&self) -> u32 {
        self.0
    }

    /// Gives up the token for its index (to move it through a ring of
    /// indices); [`Pool::from_raw`] takes it back.
    pub fn into_raw(self) -> u32 {
        self.0
    }
}

/// Counters of pool activity.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Buffers in the pool.
    pub buffers: u32,
    /// Buffers not free.
    pub in_use: u32,
    /// Buffers carved from chunks so far.
    pub carved: u32,
    /// Times a handle went to the depot.
    pub depot_trips: u64,
    /// Allocations refused for exhaustion.
    pub exhausted: u64,
}

#[derive(Debug, Default)]
struct Depot {
    full: Vec<Vec<u32>>,
    empty: Vec<Vec<u32>>,
    /// page_frag state: next unused byte of the region (chunks are handed
    /// out in order, buffers carved from each by bumping this).
    frag_offset: usize,
}

#[derive(Debug)]
struct Inner {
    /// Keeps the mapping alive; `base` points into it.
    _map: MmapMut,
    base: NonNull<u8>,
    buf_size: usize,
    buffers: u32,
    depth: usize,
    backing: Backing,
    states: Box<[AtomicU8]>,
    depot: Mutex<Depot>,
    depot_trips: AtomicU64,
    exhausted: AtomicU64,
}

// SAFETY: `base` points into `_map`, which lives as long as `Inner`. The
// bytes behind it are only reached through `Pool::data`/`data_mut`, whose
// callers hold the buffer's unique `Buf` token, so no two threads ever touch
// the same buffer's bytes unsynchronized; everything else is atomics or
// behind the mutex.
unsafe impl Send for Inner {}
// SAFETY: as above.
unsafe impl Sync for Inner {}

/// A buffer pool, shared between threads (clone it freely).
#[derive(Debug, Clone)]
pub struct Pool {
    inner: Arc<Inner>,
}

fn map_region(bytes: usize, policy: Hugepages) -> Result<(MmapMut, Backing)> {
    let huge_len = bytes.div_ceil(HUGEPAGE_SIZE) * HUGEPAGE_SIZE;
    if policy != Hugepages::Never {
        match MmapOptions::new().len(huge_len).huge(Some(21)).populate().map_anon() {
            Ok(m) => return Ok((m, Backing::Hugetlb)),
            Err(e) if policy == Hugepages::Require => {
                return Err(Error::NoHugepages {
                    bytes: huge_len,
                    pages: huge_len / HUGEPAGE_SIZE,
                    source: e,
                })
            }
            Err(e) => tracing::warn!(
                "no hugepages for the {} MiB buffer pool ({e}); using normal pages with transparent hugepages. \
                 Reserve them with `echo {} > /proc/sys/vm/nr_hugepages` as root",
                huge_len >> 20,
                huge_len / HUGEPAGE_SIZE
            ),
        }
    }
    let map = MmapOptions::new()
        .len(bytes)
        .map_anon()
        .map_err(|source| Error::Map { bytes, source })?;
    if policy == Hugepages::Never {
        return Ok((map, Backing::Normal));
    }
    let backing = match map.advise(memmap2::Advice::HugePage) {
        Ok(()) => Backing::Transparent,
        Err(_) => Backing::Normal,
    };
    Ok((map, backing))
}

impl Pool {
    /// Maps the region and prepares an empty depot (buffers are carved on
    /// demand).
    pub fn new(cfg: Config) -> Result<Self> {
        if !cfg.buf_size.is_power_of_two() || !(256..=CHUNK_SIZE).contains(&cfg.buf_size) {
            return Err(Error::Config(format!(
                "buf_size {} must be a power of two from 256 to {CHUNK_SIZE}",
                cfg.buf_size
            )));
        }
        if cfg.buffers == 0 || cfg.buffers == u32::MAX {
            return Err(Error::Config(format!(
                "buffers {} must be from 1 to 2^32-2",
                cfg.buffers
            )));
        }
        if cfg.magazine_depth == 0 {
            return Err(Error::Config("magazine_depth must be at least 1".into()));
        }
        let bytes = (cfg.buffers as usize)
            .checked_mul(cfg.buf_size)
            .ok_or_else(|| Error::Config("pool size overflows".into()))?;
        let (mut map, backing) =
            map_region(bytes.div_ceil(CHUNK_SIZE) * CHUNK_SIZE, cfg.hugepages)?;
        let base = NonNull::new(map.as_mut_ptr()).ok_or_else(|| Error::Map {
            bytes,
            source: std::io::Error::other("the mapping is at address 0"),
        })?;
        Ok(Pool {
            inner: Arc::new(Inner {
                _map: map,
                base,
                buf_size: cfg.buf_size,
                buffers: cfg.buffers,
                depth: cfg.magazine_depth,
                backing,
                states: (0..cfg.buffers)
                    .map(|_| AtomicU8::new(State::Free as u8))
                    .collect(),
                depot: Mutex::new(Depot::default()),
                depot_trips: AtomicU64::new(0),
                exhausted: AtomicU64::new(0),
            }),
        })
    }

    /// A per-thread handle with its own magazines.
    pub fn handle(&self) -> Handle {
        self.handle_with_depth(self.inner.depth)
    }

    /// A handle whose magazines hold up to `depth` buffers each, not the
    /// pool's depth (a `depth` of 0 is taken as one): for a thread that
    /// allocates and frees in bursts of up to twice that, which then stay
    /// in its own magazines instead of passing through the depot. It
    /// keeps up to twice `depth` free buffers from the other handles.
    pub fn handle_with_depth(&self, depth: usize) -> Handle {
        let depth = depth.max(1);
        Handle {
            pool: self.clone(),
            depth,
            loaded: Vec::with_capacity(depth),
            previous: Vec::with_capacity(depth),
        }
    }

    /// Bytes per buffer.
    pub fn buf_size(&self) -> usize {
        self.inner.buf_size
    }

    /// Number of buffers.
    pub fn buffers(&self) -> u32 {
        self.inner.buffers
    }

    /// What backs the memory.
    pub fn backing(&self) -> Backing {
        self.inner.backing
    }

    /// A buffer's current state, or `None` for an index not in the pool.
    pub fn state(&self, idx: u32) -> Option<State> {
        self.inner
            .states
            .get(idx as usize)
            .map(|s| State::from_u8(s.load(Ordering::Acquire)))
    }

    /// Counters.
    pub fn stats(&self) -> Stats {
        let in_use = self
            .inner
            .states
            .iter()
            .filter(|s| s.load(Ordering::Relaxed) != State::Free as u8)
            .count() as u32;
        let carved = (self.inner.depot.lock().map(|d| d.frag_offset).unwrap_or(0)
            / self.inner.buf_size) as u32;
        Stats {
            buffers: self.inner.buffers,
            in_use,
            carved: carved.min(self.inner.buffers),
            depot_trips: self.inner.depot_trips.load(Ordering::Relaxed),
            exhausted: self.inner.exhausted.load(Ordering::Relaxed),
        }
    }

    /// The bytes of a buffer.
    pub fn data<'a>(&'a self, b: &'a Buf) -> &'a [u8] {
        let off = self.offset(b.0);
        // SAFETY: `b` is the unique token for buffer `b.0`, whose range
        // `off..off + buf_size` lies inside the mapping (checked by
        // `offset`), and the mapping outlives `self`. Shared access through
        // `&Buf` cannot overlap a `&mut` from `data_mut`, which needs `&mut Buf`.
        unsafe {
            std::slice::from_raw_parts(self.inner.base.as_ptr().add(off), self.inner.buf_size)
        }
    }

    /// The bytes of a buffer, writable.
    pub fn data_mut<'a>(&'a self, b: &'a mut Buf) -> &'a mut [u8] {
        let off = self.offset(b.0);
        // SAFETY: as in `data`; `&mut Buf` is exclusive and no other token
        // names this buffer, so this is the only reference to these bytes.
        unsafe {
            std::slice::from_raw_parts_mut(self.inner.base.as_ptr().add(off), self.inner.buf_size)
        }
    }

    /// The pool's memory: base address and length (every buffer lies
    /// inside, buffer `i` at `i * buf_size`). For registering the whole pool
    /// with the kernel (AF_XDP's UMEM, io_uring's fixed buffers); the region
    /// stays mapped while any clone of this pool lives. Touching the bytes
    /// through this pointer is the caller's business and needs the same
    /// ownership discipline as [`Pool::data_mut`].
    pub fn region(&self) -> (*mut u8, usize) {
        (
            self.inner.base.as_ptr(),
            self.inner.buffers as usize * self.inner.buf_size,
        )
    }

    /// Prefetches the cache line of a buffer at byte `off`.
    #[inline]
    pub fn prefetch(&self, b: &Buf, off: usize) {
        let at = self.offset(b.0) + off.min(self.inner.buf_size - 1);
        prefetch(self.inner.base.as_ptr().wrapping_add(at));
    }

    fn offset(&self, idx: u32) -> usize {
        assert!(
            idx < self.inner.buffers,
            "Buf tokens only name buffers of their pool"
        );
        idx as usize * self.inner.buf_size
    }

    /// Takes back a token given up with [`Buf::into_raw`], checking that the
    /// index is in the pool and not free.
    ///
    /// # Safety
    /// `idx` must come from `into_raw` of a token of this pool, and be taken
    /// back at most once: two tokens for one buffer would alias its bytes.
    pub unsafe fn from_raw(&self, idx: u32) -> Result<Buf> {
        match self.state(idx) {
            None => Err(Error::Foreign(format!("index {idx}"))),
            Some(State::Free) => Err(Error::WrongState {
                idx,
                actual: State::Free,
                expected: "owned (user, in flight or received)",
            }),
            Some(_) => Ok(Buf(idx)),
        }
    }

    /// The buffer containing `addr`, if it is the start of one (the C API's
    /// pointer check).
    pub fn index_of(&self, addr: *const u8) -> Result<u32> {
        let base = self.inner.base.as_ptr() as usize;
        let a = addr as usize;
        let len = self.inner.buffers as usize * self.inner.buf_size;
        if a < base || a >= base + len || !(a - base).is_multiple_of(self.inner.buf_size) {
            return Err(Error::Foreign(format!("address {addr:p}")));
        }
        Ok(((a - base) / self.inner.buf_size) as u32)
    }

    /// Moves a buffer between states with a compare-and-swap.
    pub fn transition(&self, b: &Buf, from: State, to: State) -> Result<()> {
        let s = &self.inner.states[b.0 as usize];
        s.compare_exchange(from as u8, to as u8, Ordering::AcqRel, Ordering::Acquire)
            .map(|_| ())
            .map_err(|actual| Error::WrongState {
                idx: b.0,
                actual: State::from_u8(actual),
                expected: match from {
                    State::Free => "free",
                    State::User => "user",
                    State::InFlight => "in flight",
                    State::Received => "received",
                },
            })
    }

    /// Frees by index (for callers that hold raw indices, like the C API):
    /// detects indices not in the pool, double frees and buffers in flight.
    pub fn free_raw(&self, h: &mut Handle, idx: u32) -> Result<()> {
        if idx >= self.inner.buffers {
            return Err(Error::Foreign(format!("index {idx}")));
        }
        h.release(idx)
    }

    /// Carves up to `n` fresh buffers from the current chunk (page_frag) into
    /// `out`; called with the depot locked.
    fn carve(&self, d: &mut Depot, n: usize, out: &mut Vec<u32>) {
        let total = self.inner.buffers as usize * self.inner.buf_size;
        while out.len() < n && d.frag_offset + self.inner.buf_size <= total {
            // Buffers never straddle a chunk: buf_size divides CHUNK_SIZE.
            out.push((d.frag_offset / self.inner.buf_size) as u32);
            d.frag_offset += self.inner.buf_size;
        }
    }
}

/// One thread's view of the pool: two magazines in front of the depot.
#[derive(Debug)]
pub struct Handle {
    pool: Pool,
    /// Buffers per magazine (the depot's magazines may be of another
    /// handle's depth: they are only vectors of indices).
    depth: usize,
    loaded: Vec<u32>,
    previous: Vec<u32>,
}

impl Handle {
    /// The pool.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// Allocates a buffer (state: user).
    pub fn alloc(&mut self) -> Result<Buf> {
        if self.loaded.is_empty() {
            if !self.previous.is_empty() {
                std::mem::swap(&mut self.loaded, &mut self.previous);
            } else {
                self.refill()?;
            }
        }
        let idx = self
            .loaded
            .pop()
            .ok_or(Error::Exhausted(self.pool.inner.buffers))?;
        let s = &self.pool.inner.states[idx as usize];
        // A buffer in a magazine is free; if a C caller freed it twice by
        // index, the state CAS in `release` already refused the second.
        s.store(State::User as u8, Ordering::Release);
        Ok(Buf(idx))
    }

    /// Allocates up to `n` buffers into `out`; returns how many.
    pub fn alloc_bulk(&mut self, n: usize, out: &mut Vec<Buf>) -> usize {
        let mut got = 0;
        while got < n {
            match self.alloc() {
                Ok(b) => out.push(b),
                Err(_) => break,
            }
            got += 1;
        }
        got
    }

    fn refill(&mut self) -> Result<()> {
        let inner = &self.pool.inner;
        inner.depot_trips.fetch_add(1, Ordering::Relaxed);
        let mut d = inner.depot.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(full) = d.full.pop() {
            let empty = std::mem::replace(&mut self.loaded, full);
            d.empty.push(empty);
            return Ok(());
        }
        let mut fresh = std::mem::take(&mut self.loaded);
        self.pool.carve(&mut d, self.depth, &mut fresh);
        self.loaded = fresh;
        if self.loaded.is_empty() {
            inner.exhausted.fetch_add(1, Ordering::Relaxed);
            return Err(Error::Exhausted(inner.buffers));
        }
        Ok(())
    }

    /// Returns a buffer (user or received) to the pool.
    pub fn free(&mut self, b: Buf) -> Result<()> {
        self.release(b.0)
    }

    fn release(&mut self, idx: u32) -> Result<()> {
        // Only user or received buffers may be freed.
        let s = &self.pool.inner.states[idx as usize];
        let mut cur = s.load(Ordering::Acquire);
        loop {
            match State::from_u8(cur) {
                State::Free => return Err(Error::DoubleFree(idx)),
                State::InFlight => return Err(Error::InFlight(idx)),
                State::User | State::Received => {}
            }
            match s.compare_exchange_weak(
                cur,
                State::Free as u8,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break,
                Err(actual) => cur = actual,
            }
        }
        let depth = self.depth;
        // `>=`: a magazine from a deeper handle may hold more.
        if self.loaded.len() >= depth {
            if self.previous.len() < depth {
                std::mem::swap(&mut self.loaded, &mut self.previous);
            } else {
                self.pool.inner.depot_trips.fetch_add(1, Ordering::Relaxed);
                let mut d = self
                    .pool
                    .inner
                    .depot
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                let empty = d.empty.pop().unwrap_or_else(|| Vec::with_capacity(depth));
                let full = std::mem::replace(
                    &mut self.previous,
                    std::mem::replace(&mut self.loaded, empty),
                );
                d.full.push(full);
            }
        }
        self.loaded.push(idx);
        Ok(())
    }
}

impl Drop for Handle {
    /// Gives the magazines back to the depot so no buffer is stranded.
    fn drop(&mut self) {
        let mut d = self
            .pool
            .inner
            .depot
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        for m in [
            std::mem::take(&mut self.loaded),
            std::mem::take(&mut self.previous),
        ] {
            if !m.is_empty() {
                d.full.push(m);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small(buffers: u32) -> Pool {
        Pool::new(Config {
            buffers,
            buf_size: 2048,
            hugepages: Hugepages::Never,
            magazine_depth: 4,
        })
        .unwrap()
    }

    #[test]
    fn alloc_write_free_and_exhaustion() {
        let p = small(10);
        let mut h = p.handle();
        let mut bufs: Vec<Buf> = (0..10).map(|_| h.alloc().unwrap()).collect();
        let idx: std::collections::HashSet<u32> = bufs.iter().map(Buf::index).collect();
        assert_eq!(idx.len(), 10, "every buffer handed out once");
        assert!(matches!(h.alloc(), Err(Error::Exhausted(10))));
        assert_eq!(p.stats().exhausted, 1);
        for (i, b) in bufs.iter_mut().enumerate() {
            p.data_mut(b).fill(i as u8);
        }
        for (i, b) in bufs.iter().enumerate() {
            assert!(
                p.data(b).iter().all(|&x| x == i as u8),
                "buffers do not overlap"
            );
        }
        assert_eq!(p.stats().in_use, 10);
        for b in bufs {
            h.free(b).unwrap();
        }
        assert_eq!(p.stats().in_use, 0);
        assert!(h.alloc().is_ok());
    }

    #[test]
    fn misuse_is_detected() {
        let p = small(8);
        let mut h = p.handle();
        let b = h.alloc().unwrap();
        let i = b.into_raw();
        p.free_raw(&mut h, i).unwrap();
        assert!(matches!(p.free_raw(&mut h, i), Err(Error::DoubleFree(j)) if j == i));
        assert!(matches!(p.free_raw(&mut h, 99), Err(Error::Foreign(_))));
        let b = h.alloc().unwrap();
        p.transition(&b, State::User, State::InFlight).unwrap();
        let i = b.index();
        assert!(matches!(h.free(b), Err(Error::InFlight(j)) if j == i));
        // SAFETY: the token above was consumed by the failed free; this is
        // the only token for `i` now.
        let b = unsafe { p.from_raw(i) }.unwrap();
        assert!(p.transition(&b, State::User, State::Free).is_err());
        p.transition(&b, State::InFlight, State::Received).unwrap();
        h.free(b).unwrap();
        // SAFETY: a free index must be refused, which is what is checked.
        assert!(unsafe { p.from_raw(i) }.is_err());
        let stranger = [0u8; 4];
        assert!(p.index_of(stranger.as_ptr()).is_err());
    }

    #[test]
    fn bad_configs_are_rejected() {
        for cfg in [
            Config {
                buf_size: 3000,
                ..Config::default()
            },
            Config {
                buf_size: 128,
                ..Config::default()
            },
            Config {
                buffers: 0,
                ..Config::default()
            },
            Config {
                magazine_depth: 0,
                ..Config::default()
            },
        ] {
            assert!(matches!(Pool::new(cfg), Err(Error::Config(_))), "{cfg:?}");
        }
    }

    #[test]
    fn dropped_handles_return_their_magazines() {
        let p = small(16);
        {
            let mut h = p.handle();
            let bufs: Vec<Buf> = (0..16).map(|_| h.alloc().unwrap()).collect();
            for b in bufs {
                h.free(b).unwrap();
            }
        }
        let mut h2 = p.handle();
        let bufs: Vec<Buf> = (0..16).map(|_| h2.alloc().unwrap()).collect();
        assert_eq!(bufs.len(), 16);
    }

    /// Bursts of 256 allocations then 256 frees: a handle of the pool's
    /// depth (4 here) goes to the depot for nearly every magazine, one of
    /// depth 128 only until its magazines are full.
    #[test]
    fn a_deep_handle_keeps_its_bursts_out_of_the_depot() {
        let trips = |depth: Option<usize>| {
            let p = small(1024);
            let mut h = depth.map_or_else(|| p.handle(), |d| p.handle_with_depth(d));
            let mut held = Vec::new();
            for _ in 0..100 {
                held.extend((0..256).map(|_| h.alloc().unwrap()));
                for b in held.drain(..) {
                    h.free(b).unwrap();
                }
            }
            drop(h);
            assert_eq!(p.stats().in_use, 0);
            p.stats().depot_trips
        };
        let shallow = trips(None);
        let deep = trips(Some(128));
        assert!(shallow >= 100 * 2 * (256 / 4 - 2), "shallow: {shallow}");
        assert!(deep <= 4, "deep: {deep}");
    }

    proptest::proptest! {
        /// Handles of different depths trading magazines through the depot
        /// lose no buffer and hand none out twice.
        #[test]
        fn handles_of_any_depths_share_a_pool(
            depths in proptest::collection::vec(1usize..40, 1..4),
            steps in proptest::collection::vec((0usize..4, 0usize..90, proptest::bool::ANY), 1..60),
        ) {
            let p = small(256);
            let mut hs: Vec<Handle> = depths.iter().map(|&d| p.handle_with_depth(d)).collect();
            let mut held: Vec<Buf> = Vec::new();
            for (who, n, alloc) in steps {
                let h = &mut hs[who % depths.len()];
                if alloc {
                    for _ in 0..n {
                        match h.alloc() {
                            Ok(b) => held.push(b),
                            Err(Error::Exhausted(_)) => break,
                            Err(e) => panic!("{e}"),
                        }
                    }
                } else {
                    for _ in 0..n.min(held.len()) {
                        let b = held.pop().unwrap();
                        h.free(b).unwrap();
                    }
                }
                let mut seen: Vec<u32> = held.iter().map(Buf::index).collect();
                seen.sort_unstable();
                seen.dedup();
                proptest::prop_assert_eq!(seen.len(), held.len());
                proptest::prop_assert_eq!(p.stats().in_use as usize, held.len());
            }
            for b in held.drain(..) {
                hs[0].free(b).unwrap();
            }
            drop(hs);
            proptest::prop_assert_eq!(p.stats().in_use, 0);
            // Everything back: the whole pool can be allocated again.
            let mut h = p.handle();
            let all: Vec<Buf> = (0..256).map(|_| h.alloc().unwrap()).collect();
            proptest::prop_assert_eq!(all.len(), 256);
        }
    }
}
