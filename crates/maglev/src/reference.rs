//! Pseudocode 1 written literally: a signed `entry` array, `next[i]` counters
//! and `permutation[i][next[i]]` computed with a multiply and a modulo. It is
//! the oracle the optimized [`crate::Maglev`] is tested against, and the
//! baseline the benchmark compares it with. [`populate_weighted`] adds the
//! turn credits of the crate documentation the same literal way.

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
            take_turn(&mut entry, p, &mut next[i], i, m);
            n += 1;
            if n == m {
                return entry;
            }
        }
    }
}

/// Backend `i` claims the next free slot of its permutation `p`, where
/// `next` counts the slots it has tried.
fn take_turn(entry: &mut [i64], p: &Permutation, next: &mut u64, i: usize, m: u32) {
    let mut c = p.nth(*next, m);
    while entry[c as usize] >= 0 {
        *next += 1;
        c = p.nth(*next, m);
    }
    entry[c as usize] = i as i64;
    *next += 1;
}

/// Pseudocode 1 with the crate's weighted turns, literally: every round each
/// backend adds its weight to a credit and takes a turn when the credit
/// reaches the largest weight. Returns -1 everywhere if every weight is 0.
pub fn populate_weighted(backends: &[(Permutation, u32)], m: u32) -> Vec<i64> {
    let mut entry = vec![-1i64; m as usize];
    let w_max = backends
        .iter()
        .map(|&(_, w)| u64::from(w))
        .max()
        .unwrap_or(0);
    if w_max == 0 {
        return entry;
    }
    let mut next = vec![0u64; backends.len()];
    let mut credit = vec![0u64; backends.len()];
    let mut n = 0u32;
    loop {
        for (i, &(p, w)) in backends.iter().enumerate() {
            credit[i] += u64::from(w);
            if credit[i] < w_max {
                continue;
            }
            credit[i] -= w_max;
            take_turn(&mut entry, &p, &mut next[i], i, m);
            n += 1;
            if n == m {
                return entry;
            }
        }
    }
}
