//! Karger-style consistent hashing: a ring of virtual nodes ("views").
//!
//! Each backend is placed at `views` pseudo-random points of a 64-bit ring;
//! a key belongs to the first point at or after it, wrapping around. Used
//! here only to compare load balance with Maglev (paper, Figure 11).

use crate::hash::{mix64, name_hash, HashKey};

/// A consistent-hash ring with virtual nodes.
#[derive(Debug, Clone)]
pub struct KargerRing {
    /// (ring position, backend index), sorted by position.
    points: Vec<(u64, u32)>,
}

impl KargerRing {
    /// Places each backend at `views` points (at least one).
    pub fn new<S: AsRef<str>>(names: &[S], views: u32) -> Self {
        let views = views.max(1);
        let mut points = Vec::with_capacity(names.len() * views as usize);
        for (i, name) in names.iter().enumerate() {
            let seed = name_hash(HashKey::Ring, name.as_ref().as_bytes());
            for v in 0..views {
                points.push((mix64(seed ^ mix64(u64::from(v))), i as u32));
            }
        }
        points.sort_unstable();
        KargerRing { points }
    }

    /// The backend owning `key`, or `None` for an empty ring.
    pub fn lookup(&self, key: u64) -> Option<u32> {
        if self.points.is_empty() {
            return None;
        }
        let i = self.points.partition_point(|&(p, _)| p < key);
        Some(self.points[if i == self.points.len() { 0 } else { i }].1)
    }

    /// Fills `out` with the owner of each of `m` table slots (slot `j` is
    /// the key [`slot_key`]`(j)`).
    pub fn table(&self, m: u32, out: &mut Vec<u32>) {
        out.clear();
        out.extend((0..m).map(|j| self.lookup(slot_key(j)).unwrap_or(u32::MAX)));
    }
}

/// The hash-space key that stands for table slot `j` in the ring and
/// rendezvous tables.
#[inline]
pub fn slot_key(j: u32) -> u64 {
    mix64(u64::from(j) ^ 0x6a09_e667_f3bc_c908)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps_and_is_stable_under_removal() {
        let names: Vec<String> = (0..20).map(|i| format!("b{i}")).collect();
        let ring = KargerRing::new(&names, 50);
        // A key past the last point belongs to the first point (wrap).
        let (last, _) = *ring.points.last().unwrap();
        assert!(last < u64::MAX);
        assert_eq!(ring.lookup(last + 1), Some(ring.points[0].1));
        assert_eq!(ring.lookup(ring.points[3].0), Some(ring.points[3].1));
        let mut full = Vec::new();
        ring.table(1009, &mut full);
        assert!(full.iter().all(|&b| b < 20));
        // Removing backend 7 moves only its own slots.
        let fewer: Vec<String> = names.iter().filter(|n| *n != "b7").cloned().collect();
        let mut after = Vec::new();
        KargerRing::new(&fewer, 50).table(1009, &mut after);
        for (b, a) in full.iter().zip(&after) {
            if *b != 7 {
                assert_eq!(names[*b as usize], fewer[*a as usize]);
            }
        }
        assert_eq!(KargerRing::new::<&str>(&[], 10).lookup(5), None);
    }
}
