//! Rendezvous (highest random weight) hashing: each key goes to the backend
//! whose score `mix(seed_backend, key)` is highest. Used here only to compare
//! load balance with Maglev (paper, Figure 11). Building a table costs
//! `N * M` score computations.

use crate::hash::{mix64, name_hash, HashKey};
use crate::karger::slot_key;

/// Backend seeds for rendezvous hashing.
#[derive(Debug, Clone)]
pub struct Rendezvous {
    seeds: Vec<u64>,
}

impl Rendezvous {
    /// Seeds from backend names.
    pub fn new<S: AsRef<str>>(names: &[S]) -> Self {
        Rendezvous {
            seeds: names
                .iter()
                .map(|n| name_hash(HashKey::Rendezvous, n.as_ref().as_bytes()))
                .collect(),
        }
    }

    /// The backend with the highest score for `key`, or `None` if empty.
    #[inline]
    pub fn lookup(&self, key: u64) -> Option<u32> {
        let mut best = None;
        let mut best_score = 0u64;
        for (i, &s) in self.seeds.iter().enumerate() {
            let score = mix64(s ^ key);
            if best.is_none() || score > best_score {
                best = Some(i as u32);
                best_score = score;
            }
        }
        best
    }

    /// Fills `out` with the owner of each of `m` table slots.
    pub fn table(&self, m: u32, out: &mut Vec<u32>) {
        out.clear();
        out.extend((0..m).map(|j| self.lookup(slot_key(j)).unwrap_or(u32::MAX)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removal_moves_only_removed_backends_slots() {
        let names: Vec<String> = (0..30).map(|i| format!("b{i}")).collect();
        let mut full = Vec::new();
        Rendezvous::new(&names).table(2003, &mut full);
        let fewer: Vec<String> = names.iter().filter(|n| *n != "b3").cloned().collect();
        let mut after = Vec::new();
        Rendezvous::new(&fewer).table(2003, &mut after);
        let mut moved = 0;
        for (b, a) in full.iter().zip(&after) {
            if *b == 3 {
                moved += 1;
            } else {
                assert_eq!(names[*b as usize], fewer[*a as usize]);
            }
        }
        assert!(moved > 0);
        assert_eq!(Rendezvous::new::<&str>(&[]).lookup(1), None);
    }
}
