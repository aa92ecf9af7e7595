//! The fragment table of the paper's section 4.3, for one packet thread.
//!
//! All fragments of a datagram share (source, destination, protocol,
//! identification). The first fragment carries the ports, so its backend is
//! chosen like any packet's; the table remembers that choice for the
//! datagram, and later fragments follow it. A fragment that arrives before
//! the first is held (its buffer, not a copy) until the first arrives or the
//! entry expires. Fixed size, bounded holding, nothing allocated per packet.
//!
//! Steering sends every fragment of a datagram to the same thread by hashing
//! the 3-tuple. The paper's first hop, which brings every fragment of a
//! datagram to the same load balancer of a fleet, is [`crate::frag_redirect`]:
//! fragments redirected by a peer are steered by their inner 3-tuple too.
//!
//! Without steering (one worker per receive queue, run to completion), the
//! NIC picks the worker, and it does not keep a datagram's fragments
//! together: a peer's redirected fragments arrive in GRE, hashed on the
//! outer header, on another queue than the fragments the router sent
//! directly. Those workers share one table ([`Frags::Shared`]) behind a
//! lock; fragments are rare, so the lock is taken per fragment, and the
//! per-batch expiry sweep skips a table another worker holds.

use std::sync::{Arc, Mutex};

use netio::Packet;

/// A worker's fragment table: its own, or one shared by the workers that
/// each serve one receive queue of the same interface.
#[derive(Debug)]
pub enum Frags {
    /// This worker's alone (steering keeps a datagram on one thread).
    Own(FragTable),
    /// Shared with the other queues' workers, and the batches left before
    /// this worker sweeps it again.
    Shared(Arc<Mutex<FragTable>>, u32),
}

/// Entries a worker's own table is swept per batch.
const SWEEP_PER_BATCH: usize = 8;
/// Batches between a worker's sweeps of a shared table: the sweep takes the
/// table's lock, and a lock every batch would move its cache line between
/// the queues' cores even without fragments.
const SHARED_SWEEP_EVERY: u32 = 64;

impl Frags {
    /// Runs `f` on the table (waiting for a shared one).
    #[inline]
    pub fn with<R>(&mut self, f: impl FnOnce(&mut FragTable) -> R) -> R {
        match self {
            Frags::Own(t) => f(t),
            // A worker that panicked holding the lock left the table
            // consistent between calls (no call unwinds half way through
            // an update), so its contents are still usable.
            Frags::Shared(t, _) => f(&mut t.lock().unwrap_or_else(|p| p.into_inner())),
        }
    }

    /// The per-batch share of expiry: a few entries of an own table every
    /// batch; as many of a shared one every [`SHARED_SWEEP_EVERY`] batches,
    /// skipped (until the next batch) while another worker holds it.
    #[inline]
    pub fn sweep_batch(&mut self, now: u64, expired: &mut Vec<Packet>) {
        match self {
            Frags::Own(t) => t.sweep(SWEEP_PER_BATCH, now, expired),
            Frags::Shared(t, left) => {
                *left = left.saturating_sub(1);
                if *left > 0 {
                    return;
                }
                let swept = match t.try_lock() {
                    Ok(g) => Some(g),
                    Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
                    Err(std::sync::TryLockError::WouldBlock) => None,
                };
                if let Some(mut g) = swept {
                    g.sweep(SWEEP_PER_BATCH * SHARED_SWEEP_EVERY as usize, now, expired);
                    *left = SHARED_SWEEP_EVERY;
                }
            }
        }
    }

    /// A shared table, swept by this worker every [`SHARED_SWEEP_EVERY`]
    /// batches.
    pub fn shared(table: Arc<Mutex<FragTable>>) -> Self {
        Frags::Shared(table, SHARED_SWEEP_EVERY)
    }
}

/// Fragments held per datagram at most.
pub const MAX_HELD: usize = 8;

/// What identifies a datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FragKey {
    /// Source address.
    pub src: [u8; 16],
    /// Destination address.
    pub dst: [u8; 16],
    /// Protocol.
    pub proto: u8,
    /// Identification.
    pub ident: u32,
}

impl FragKey {
    fn hash(&self) -> u64 {
        packet::FlowKey {
            src: self.src,
            dst: self.dst,
            src_port: (self.ident >> 16) as u16,
            dst_port: self.ident as u16,
            proto: self.proto,
        }
        .hash(0xf7a9)
    }
}

/// A datagram's forwarding decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// VIP index.
    pub vip: u32,
    /// Backend id.
    pub backend: u32,
}

#[derive(Debug, Default)]
struct Entry {
    used: bool,
    key: FragKey,
    decision: Option<Decision>,
    expires: u64,
    held: Vec<Packet>,
}

/// The table.
#[derive(Debug)]
pub struct FragTable {
    entries: Vec<Entry>,
    timeout_ms: u64,
    sweep: usize,
    /// Entries in use: with none, a sweep has nothing to look at, and
    /// every batch of unfragmented traffic skips it (it touched a few cold
    /// entries per batch).
    live: usize,
}

/// Slots probed per key.
const PROBE: usize = 4;

impl FragTable {
    /// A table of `size` entries.
    pub fn new(size: usize, timeout_ms: u64) -> Self {
        FragTable {
            entries: (0..size.max(PROBE)).map(|_| Entry::default()).collect(),
            timeout_ms,
            sweep: 0,
            live: 0,
        }
    }

    /// The bytes a table of `size` entries allocates, held fragments apart
    /// (they are pool buffers), for a configuration's memory estimate.
    pub fn bytes_for(size: usize) -> u64 {
        (size.max(PROBE) as u64).saturating_mul(std::mem::size_of::<Entry>() as u64)
    }

    fn find(&self, key: &FragKey) -> Option<usize> {
        let n = self.entries.len();
        let h = key.hash() as usize;
        (0..PROBE)
            .map(|i| (h + i) % n)
            .find(|&i| self.entries[i].used && self.entries[i].key == *key)
    }

    /// A slot for `key`: its own, a free one, or an expired one (whose held
    /// fragments are moved to `expired`).
    fn slot(&mut self, key: &FragKey, now: u64, expired: &mut Vec<Packet>) -> Option<usize> {
        if let Some(i) = self.find(key) {
            return Some(i);
        }
        let n = self.entries.len();
        let h = key.hash() as usize;
        let i = (0..PROBE)
            .map(|i| (h + i) % n)
            .find(|&i| !self.entries[i].used || self.entries[i].expires <= now)?;
        let e = &mut self.entries[i];
        if !e.used {
            self.live += 1;
        }
        expired.append(&mut e.held);
        *e = Entry {
            used: true,
            key: *key,
            decision: None,
            expires: now + self.timeout_ms,
            held: std::mem::take(&mut e.held),
        };
        Some(i)
    }

    /// Records the first fragment's decision; returns the fragments that
    /// were waiting for it in `released`. Returns false if the table had no
    /// room (the first fragment is still forwarded; later ones may not be).
    pub fn record(
        &mut self,
        key: &FragKey,
        d: Decision,
        now: u64,
        released: &mut Vec<Packet>,
        expired: &mut Vec<Packet>,
    ) -> bool {
        let Some(i) = self.slot(key, now, expired) else {
            return false;
        };
        let e = &mut self.entries[i];
        e.decision = Some(d);
        e.expires = now + self.timeout_ms;
        released.append(&mut e.held);
        true
    }

    /// The decision for a datagram, if its first fragment was seen.
    pub fn lookup(&self, key: &FragKey, now: u64) -> Option<Decision> {
        let e = &self.entries[self.find(key)?];
        if e.expires <= now {
            return None;
        }
        e.decision
    }

    /// Holds a fragment until its first fragment arrives; gives it back if
    /// there is no room.
    pub fn hold(
        &mut self,
        key: &FragKey,
        p: Packet,
        now: u64,
        expired: &mut Vec<Packet>,
    ) -> Result<(), Packet> {
        let Some(i) = self.slot(key, now, expired) else {
            return Err(p);
        };
        let e = &mut self.entries[i];
        if e.held.len() >= MAX_HELD {
            return Err(p);
        }
        e.held.push(p);
        Ok(())
    }

    /// Checks `n` entries (round robin) and moves the fragments of expired
    /// ones to `expired`.
    pub fn sweep(&mut self, n: usize, now: u64, expired: &mut Vec<Packet>) {
        if self.live == 0 {
            return;
        }
        for _ in 0..n.min(self.entries.len()) {
            self.sweep += 1;
            if self.sweep >= self.entries.len() {
                self.sweep = 0;
            }
            let e = &mut self.entries[self.sweep];
            if e.used && e.expires <= now {
                expired.append(&mut e.held);
                e.used = false;
                e.decision = None;
                self.live -= 1;
            }
        }
    }

    /// Entries in use (datagrams with a decision or held fragments, until
    /// they expire and are swept).
    pub fn live(&self) -> usize {
        self.live
    }

    /// Moves every held fragment to `out` (shutting down).
    pub fn drain(&mut self, out: &mut Vec<Packet>) {
        for e in &mut self.entries {
            out.append(&mut e.held);
            e.used = false;
        }
        self.live = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn used(t: &FragTable) -> usize {
        t.entries.iter().filter(|e| e.used).count()
    }

    proptest! {
        /// The count of entries in use, by which a sweep is skipped, is
        /// the number of entries in use after any sequence of decisions
        /// recorded, sweeps and drains: a sweep it skips had nothing to
        /// expire.
        #[test]
        fn live_counts_the_entries_in_use(
            size in 1usize..40,
            ops in proptest::collection::vec((0u8..10, 0u32..24, 0u64..50, 0usize..20), 1..200),
        ) {
            let mut t = FragTable::new(size, 10);
            let (mut released, mut expired) = (Vec::new(), Vec::new());
            let mut now = 0;
            for (op, ident, dt, n) in ops {
                now += dt;
                match op {
                    0..=5 => {
                        let key = FragKey { ident, proto: 17, ..FragKey::default() };
                        let d = Decision { vip: 0, backend: ident };
                        t.record(&key, d, now, &mut released, &mut expired);
                    }
                    6..=8 => {
                        let before = used(&t);
                        t.sweep(n, now, &mut expired);
                        // What a skipped sweep would have found: nothing.
                        if before == 0 {
                            prop_assert_eq!(used(&t), 0);
                        }
                    }
                    _ => t.drain(&mut expired),
                }
                prop_assert_eq!(t.live(), used(&t));
            }
            // Everything recorded expires and is swept in the end.
            t.sweep(t.entries.len(), now + 11, &mut expired);
            prop_assert_eq!(t.live(), 0);
            prop_assert_eq!(used(&t), 0);
        }
    }
}
