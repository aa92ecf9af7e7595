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
    /// Live entries (as of the last operation on them).
    pub entries: u64,
}

#[derive(Debug, Clone)]
struct Bucket {
    /// 0: empty; otherwise the high half of the flow hash with the low bit set.
    tags: [u32; WAYS],
    expires: [u64; WAYS],
    entries: [Entry; WAYS],
    keys: [FlowKey; WAYS],
}

impl Default for Bucket {
    fn default() -> Self {
        Bucket {
            tags: [0; WAYS],
            expires: [0; WAYS],
            entries: [Entry { vip: 0, backend: 0 }; WAYS],
            keys: [FlowKey::default(); WAYS],
        }
    }
}

/// The table.
#[derive(Debug, Clone)]
pub struct Conntrack {
    buckets: Vec<Bucket>,
    mask: usize,
    tcp_timeout_ms: u64,
    udp_timeout_ms: u64,
    stats: Stats,
}

impl Conntrack {
    /// A table of `size` entries (rounded up to a power of two, at least 4).
    pub fn new(size: usize, tcp_timeout_ms: u64, udp_timeout_ms: u64) -> Self {
        let buckets = (size.max(WAYS).next_power_of_two() / WAYS).max(1);
        Conntrack {
            buckets: vec![Bucket::default(); buckets],
            mask: buckets - 1,
            tcp_timeout_ms,
            udp_timeout_ms,
            stats: Stats::default(),
        }
    }

    /// Capacity in entries.
    pub fn capacity(&self) -> usize {
        self.buckets.len() * WAYS
    }

    /// Counters.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    fn timeout(&self, key: &FlowKey) -> u64 {
        if key.proto == proto::TCP {
            self.tcp_timeout_ms
        } else {
            self.udp_timeout_ms
        }
    }

    #[inline]
    fn tag(hash: u64) -> u32 {
        ((hash >> 32) as u32) | 1
    }

    /// The live entry for `key` (whose hash is `hash`) at time `now_ms`,
    /// refreshing its expiry; an expired entry is removed and counted.
    #[inline]
    pub fn lookup(&mut self, key: &FlowKey, hash: u64, now_ms: u64) -> Option<Entry> {
        let timeout = self.timeout(key);
        let tag = Self::tag(hash);
        let b = &mut self.buckets[hash as usize & self.mask];
        for w in 0..WAYS {
            if b.tags[w] == tag && b.keys[w] == *key {
                if b.expires[w] <= now_ms {
                    b.tags[w] = 0;
                    self.stats.expiries += 1;
                    self.stats.entries -= 1;
                    break;
                }
                b.expires[w] = now_ms + timeout;
                self.stats.hits += 1;
                return Some(b.entries[w]);
            }
        }
        self.stats.misses += 1;
        None
    }

    /// Records `entry` for `key`: replaces the key's own entry, else takes an
    /// empty or expired way. Returns false (and counts an insert failure) if
    /// all four ways hold live flows.
    #[inline]
    pub fn insert(&mut self, key: &FlowKey, hash: u64, entry: Entry, now_ms: u64) -> bool {
        let timeout = self.timeout(key);
        let tag = Self::tag(hash);
        let b = &mut self.buckets[hash as usize & self.mask];
        let mut free = None;
        for w in 0..WAYS {
            if b.tags[w] == tag && b.keys[w] == *key {
                b.entries[w] = entry;
                b.expires[w] = now_ms + timeout;
                return true;
            }
            if free.is_none() {
                if b.tags[w] == 0 {
                    free = Some(w);
                } else if b.expires[w] <= now_ms {
                    b.tags[w] = 0;
                    self.stats.expiries += 1;
                    self.stats.entries -= 1;
                    free = Some(w);
                }
            }
        }
        match free {
            Some(w) => {
                b.tags[w] = tag;
                b.keys[w] = *key;
                b.entries[w] = entry;
                b.expires[w] = now_ms + timeout;
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
