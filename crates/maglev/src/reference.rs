//! Pseudocode 1 written literally: a signed `entry` array, `next[i]` counters
//! and `permutation[i][next[i]]` computed with a multiply and a modulo. It is
//! the oracle the optimized [`crate::Maglev`] is tested against, and the
//! baseline the benchmark compares it with.

use crate::Permutation;

/// Populates a table of `m` slots from `perms` (unweighted), returning the
/// backend index per slot, or -1 everywhere if `perms` is empty.
pub fn populate(perms: &[Permutation], m: u32) -> Vec<i64> {
    let mut entry = vec![-1i64; m as usize];
    if perms.is_empty() {
        return entry;
    }
    let mut next = vec![0u64; perms.len()];
    let mut n = 0u32;
    loop {
        for (i, p) in perms.iter().enumerate() {
            let mut c = p.nth(next[i], m);
            while entry[c as usize] >= 0 {
                next[i] += 1;
                c = p.nth(next[i], m);
            }
            entry[c as usize] = i as i64;
            next[i] += 1;
            n += 1;
            if n == m {
                return entry;
            }
        }
    }
}
