//! One packet thread's connection table (paper section 3.3): fixed size,
//! set-associative (4 ways per bucket), keyed by the full 5-tuple (a hash
//! collision can never send a flow to another flow's backend), entries
//! expiring after an idle timeout that differs for TCP and the rest.
//!
//! Only expired entries are evicted. When a bucket holds four live flows a
//! new flow is not inserted (counted as an insert failure) and is still
//! forwarded by Maglev hashing, as the paper prescribes.

use packet::{proto, FlowKey};

const WAYS: usize = 4;

/// A remembered backend choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// VIP index.
    pub vip: u32,
    /// Backend id.
    pub backend: u32,
}

/// Conntrack counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Lookups that found a live entry.
    pub hits: u64,
    /// Lookups that found none.
    pub misses: u64,
    /// Entries inserted.
    pub inserts: u64,
    /// New flows not inserted because their bucket was full of live entries.
    pub insert_failures: u64,
    /// Entries found expired and removed.
    pub expiries: u64,
    /// Flows closed by a TCP FIN or RST (their entries linger briefly).
    pub closes: u64,
    /// Live entries (as of the last operation on them): open flows and
    /// closed ones lingering.
    pub entries: u64,
    /// Of `entries`, those of closed flows (a FIN or RST was seen) that
    /// linger until their entry goes.
    pub closing: u64,
}

impl Stats {
    /// Active connections: entries whose flow is not closed (`entries`
    /// less `closing`).
    pub fn active(&self) -> u64 {
        self.entries.saturating_sub(self.closing)
    }
}

/// The hot part of a bucket: one cache line with the four ways' tags,
/// expiry times, backends and VIPs. The keys live in a parallel array and
/// are read only when a tag matches, so a lookup touches one line, or two
/// on a hit.
#[derive(Debug, Clone, Copy, Default)]
#[repr(C, align(64))]
struct Head {
    /// 0: empty; otherwise the high half of the flow hash with the low bit set.
    tags: [u32; WAYS],
    /// Expiry, in milliseconds modulo 2^32 (compared with wrapping
    /// arithmetic, so timeouts must stay below 2^31 ms, about 24 days).
    expires: [u32; WAYS],
    backend: [u32; WAYS],
    vip: [u32; WAYS],
}

/// Whether `expires` is still in the future at `now` (both modulo 2^32).
/// The tag bit of an open flow (see `Conntrack::tag`).
const OPEN: u32 = 2;

#[inline]
fn alive(expires: u32, now: u32) -> bool {
    (expires.wrapping_sub(now) as i32) > 0
}

/// Longest idle timeout the table can represent.
pub const MAX_TIMEOUT_MS: u64 = (1 << 31) - 1;

/// The table.
#[derive(Debug, Clone)]
pub struct Conntrack {
    heads: Vec<Head>,
    keys: Vec<[FlowKey; WAYS]>,
    mask: usize,
    tcp_timeout_ms: u32,
    udp_timeout_ms: u32,
    stats: Stats,
}

impl Conntrack {
    /// A table of `size` entries (rounded up to a power of two, at least 4).
    /// Timeouts are capped at [`MAX_TIMEOUT_MS`].
    pub fn new(size: usize, tcp_timeout_ms: u64, udp_timeout_ms: u64) -> Self {
        let buckets = (size.max(WAYS).next_power_of_two() / WAYS).max(1);
        Conntrack {
            heads: vec![Head::default(); buckets],
            keys: vec![[FlowKey::default(); WAYS]; buckets],
            mask: buckets - 1,
            tcp_timeout_ms: tcp_timeout_ms.min(MAX_TIMEOUT_MS) as u32,
            udp_timeout_ms: udp_timeout_ms.min(MAX_TIMEOUT_MS) as u32,
            stats: Stats::default(),
        }
    }

    /// The bytes a table of `size` entries allocates, as [`Conntrack::new`]
    /// rounds it (for a configuration's memory estimate).
    pub fn bytes_for(size: usize) -> u64 {
        let buckets = (size
            .max(WAYS)
            .checked_next_power_of_two()
            .unwrap_or(usize::MAX)
            / WAYS)
            .max(1);
        (buckets as u64).saturating_mul(
            (std::mem::size_of::<Head>() + std::mem::size_of::<[FlowKey; WAYS]>()) as u64,
        )
    }

    /// Capacity in entries.
    pub fn capacity(&self) -> usize {
        self.heads.len() * WAYS
    }

    /// Counters.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// Starts fetching the bucket a flow hash falls in (batched callers do
    /// this for a whole batch before looking anything up).
    ///
    /// `hit_likely`: also fetch the bucket's keys (which way is not known
    /// yet), for a packet of an established flow, whose hit compares one:
    /// fetching it then was the slowest load in the forwarder's profile
    /// (+5% non-SYN in `lb bench`). For a SYN, which misses, the extra
    /// lines cost more than the insert gains (-13%).
    #[inline]
    pub fn prefetch(&self, hash: u64, hit_likely: bool) {
        let i = hash as usize & self.mask;
        maio::prefetch(&self.heads[i]);
        if !hit_likely {
            return;
        }
        let keys = self.keys[i].as_ptr().cast::<u8>();
        for line in (0..std::mem::size_of::<[FlowKey; WAYS]>()).step_by(64) {
            maio::prefetch(keys.wrapping_add(line));
        }
    }

    fn timeout(&self, key: &FlowKey) -> u32 {
        if key.proto == proto::TCP {
            self.tcp_timeout_ms
        } else {
            self.udp_timeout_ms
        }
    }

    #[inline]
    fn tag(hash: u64) -> u32 {
        // Bit 0: never 0 (0 marks a free way). Bit 1: the flow is open
        // (cleared by `close`; a closing entry is not refreshed by hits).
        ((hash >> 32) as u32) | 1 | OPEN
    }

    /// The live entry for `key` (whose hash is `hash`) at time `now_ms`,
    /// refreshing its expiry; an expired entry is removed and counted.
    #[inline]
    pub fn lookup(&mut self, key: &FlowKey, hash: u64, now_ms: u64) -> Option<Entry> {
        let now = now_ms as u32;
        let timeout = self.timeout(key);
        let tag = Self::tag(hash);
        let i = hash as usize & self.mask;
        let h = &mut self.heads[i];
        for w in 0..WAYS {
            if h.tags[w] | OPEN == tag && self.keys[i][w] == *key {
                if !alive(h.expires[w], now) {
                    if h.tags[w] & OPEN == 0 {
                        self.stats.closing -= 1;
                    }
                    h.tags[w] = 0;
                    self.stats.expiries += 1;
                    self.stats.entries -= 1;
                    break;
                }
                if h.tags[w] & OPEN != 0 {
                    h.expires[w] = now.wrapping_add(timeout);
                }
                self.stats.hits += 1;
                return Some(Entry {
                    vip: h.vip[w],
                    backend: h.backend[w],
                });
            }
        }
        self.stats.misses += 1;
        None
    }

    /// Ends a flow's entry `linger_ms` from `now_ms` (a TCP FIN or RST was
    /// seen): the rest of the close still reaches the same backend, then
    /// the entry goes, so a later connection on the same 5-tuple is a new
    /// flow. An entry that expires sooner keeps its earlier expiry.
    #[inline]
    pub fn close(&mut self, key: &FlowKey, hash: u64, now_ms: u64, linger_ms: u64) {
        let now = now_ms as u32;
        let end = now.wrapping_add(linger_ms.min(MAX_TIMEOUT_MS) as u32);
        let tag = Self::tag(hash);
        let i = hash as usize & self.mask;
        let h = &mut self.heads[i];
        for w in 0..WAYS {
            if h.tags[w] | OPEN == tag && self.keys[i][w] == *key {
                if h.tags[w] & OPEN != 0 && alive(h.expires[w], now) {
                    h.tags[w] &= !OPEN;
                    if alive(h.expires[w], end) {
                        h.expires[w] = end;
                    }
                    self.stats.closes += 1;
                    self.stats.closing += 1;
                }
                return;
            }
        }
    }

    /// Records `entry` for `key`: replaces the key's own entry, else takes an
    /// empty or expired way. Returns false (and counts an insert failure) if
    /// all four ways hold live flows.
    #[inline]
    pub fn insert(&mut self, key: &FlowKey, hash: u64, entry: Entry, now_ms: u64) -> bool {
        let now = now_ms as u32;
        let expires = now.wrapping_add(self.timeout(key));
        let tag = Self::tag(hash);
        let i = hash as usize & self.mask;
        let h = &mut self.heads[i];
        let mut free = None;
        for w in 0..WAYS {
            if h.tags[w] | OPEN == tag && self.keys[i][w] == *key {
                // Replaced (a new connection on the same 5-tuple): open again.
                if h.tags[w] & OPEN == 0 {
                    self.stats.closing -= 1;
                }
                h.tags[w] = tag;
                h.backend[w] = entry.backend;
                h.vip[w] = entry.vip;
                h.expires[w] = expires;
                return true;
            }
            if free.is_none() {
                if h.tags[w] == 0 {
                    free = Some(w);
                } else if !alive(h.expires[w], now) {
                    if h.tags[w] & OPEN == 0 {
                        self.stats.closing -= 1;
                    }
                    h.tags[w] = 0;
                    self.stats.expiries += 1;
                    self.stats.entries -= 1;
                    free = Some(w);
                }
            }
        }
        match free {
            Some(w) => {
                h.tags[w] = tag;
                h.backend[w] = entry.backend;
                h.vip[w] = entry.vip;
                h.expires[w] = expires;
                self.keys[i][w] = *key;
                self.stats.inserts += 1;
                self.stats.entries += 1;
                true
            }
            None => {
                self.stats.insert_failures += 1;
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_flow_lingers_then_ends_and_hits_do_not_revive_it() {
        let mut ct = Conntrack::new(64, 300_000, 30_000);
        let (k, h) = (key(7, proto::TCP), 4242u64);
        assert!(ct.insert(&k, h, Entry { vip: 0, backend: 3 }, 0));
        ct.close(&k, h, 1000, 2000);
        // The rest of the close still reaches the backend...
        assert_eq!(ct.lookup(&k, h, 2500), Some(Entry { vip: 0, backend: 3 }));
        // ...and that hit did not extend it back to 300 s.
        assert_eq!(ct.lookup(&k, h, 3001), None);
        assert_eq!(ct.stats().closes, 1);
        // A new connection on the same 5-tuple is a new flow, open again.
        assert!(ct.insert(&k, h, Entry { vip: 0, backend: 5 }, 4000));
        assert_eq!(
            ct.lookup(&k, h, 100_000),
            Some(Entry { vip: 0, backend: 5 })
        );
        // Closing twice (FIN both ways) keeps the first deadline.
        ct.close(&k, h, 100_000, 2000);
        ct.close(&k, h, 101_500, 2000);
        assert_eq!(ct.lookup(&k, h, 102_001), None);
    }

    /// Active connections are the entries whose flow is not closed:
    /// closing one moves it out of `active` but not out of `entries`, and
    /// its expiry or a new connection on its 5-tuple settles the count.
    #[test]
    fn active_counts_open_entries_only() {
        let mut ct = Conntrack::new(64, 300_000, 30_000);
        let (a, b) = (
            (key(1, proto::TCP), 1u64 << 40),
            (key(2, proto::TCP), 2u64 << 40),
        );
        assert!(ct.insert(&a.0, a.1, Entry { vip: 0, backend: 1 }, 0));
        assert!(ct.insert(&b.0, b.1, Entry { vip: 0, backend: 2 }, 0));
        let s = ct.stats();
        assert_eq!((s.entries, s.closing, s.active()), (2, 0, 2));
        ct.close(&a.0, a.1, 10, 1000);
        ct.close(&a.0, a.1, 20, 1000); // a second FIN counts once
        let s = ct.stats();
        assert_eq!((s.entries, s.closing, s.active()), (2, 1, 1));
        // Reopened by a new connection on the same 5-tuple: active again.
        assert!(ct.insert(&a.0, a.1, Entry { vip: 0, backend: 1 }, 30));
        assert_eq!(ct.stats().active(), 2);
        ct.close(&a.0, a.1, 40, 1000);
        // The closed entry expires: gone from both.
        assert_eq!(ct.lookup(&a.0, a.1, 2000), None);
        let s = ct.stats();
        assert_eq!((s.entries, s.closing, s.active()), (1, 0, 1));
    }

    fn key(port: u16, proto: u8) -> FlowKey {
        FlowKey::v4([10, 0, 0, 1], [192, 0, 2, 1], port, 80, proto)
    }

    #[test]
    fn insert_hit_expire() {
        let mut ct = Conntrack::new(64, 1000, 100);
        let (k, h) = (key(1, proto::TCP), 12345u64);
        assert_eq!(ct.lookup(&k, h, 0), None);
        assert!(ct.insert(&k, h, Entry { vip: 1, backend: 7 }, 0));
        assert_eq!(ct.lookup(&k, h, 500), Some(Entry { vip: 1, backend: 7 }));
        // The hit at 500 refreshed it to 1500.
        assert!(ct.lookup(&k, h, 1499).is_some());
        assert_eq!(ct.lookup(&k, h, 3000), None);
        let s = ct.stats();
        assert_eq!(
            (s.hits, s.misses, s.inserts, s.expiries, s.entries),
            (2, 2, 1, 1, 0)
        );
        // UDP uses its own, shorter timeout.
        let u = key(1, proto::UDP);
        ct.insert(&u, 99, Entry { vip: 0, backend: 1 }, 0);
        assert_eq!(ct.lookup(&u, 99, 150), None);
    }

    #[test]
    fn expiry_survives_the_32_bit_clock_wrapping() {
        let mut ct = Conntrack::new(16, 10_000, 10_000);
        let (k, h) = (key(3, proto::TCP), 77u64);
        let t0 = (1u64 << 32) - 5_000; // 5 s before the wrap
        ct.insert(&k, h, Entry { vip: 0, backend: 2 }, t0);
        assert!(
            ct.lookup(&k, h, t0 + 9_000).is_some(),
            "alive across the wrap"
        );
        assert!(
            ct.lookup(&k, h, t0 + 9_000 + 10_001).is_none(),
            "expired after the wrap"
        );
    }

    #[test]
    fn full_bucket_refuses_then_reuses_expired() {
        let mut ct = Conntrack::new(4, 1000, 1000); // one bucket
        for p in 0..4 {
            assert!(ct.insert(
                &key(p, proto::TCP),
                u64::from(p) << 32,
                Entry {
                    vip: 0,
                    backend: u32::from(p)
                },
                0
            ));
        }
        assert!(!ct.insert(
            &key(9, proto::TCP),
            9 << 32,
            Entry { vip: 0, backend: 9 },
            10
        ));
        assert_eq!(ct.stats().insert_failures, 1);
        // Same hash, different key: never confused.
        assert_eq!(ct.lookup(&key(9, proto::TCP), 0, 10), None);
        // After expiry the way is reused.
        assert!(ct.insert(
            &key(9, proto::TCP),
            9 << 32,
            Entry { vip: 0, backend: 9 },
            2000
        ));
        assert_eq!(
            ct.lookup(&key(9, proto::TCP), 9 << 32, 2001)
                .unwrap()
                .backend,
            9
        );
    }
}
