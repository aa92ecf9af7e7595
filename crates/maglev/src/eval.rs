//! The measurements of the paper's section 5.3, as pure functions: how evenly
//! a table spreads over its backends (Figure 11) and how many slots change
//! when backends fail (Figure 12). Timing and reporting live with the caller.

use crate::{hash::mix64, Backend, Maglev, Permutation, Result};

/// Number of slots held by each backend `0..n`; slots naming no backend in
/// range (empty slots) are not counted.
pub fn slot_counts(entries: &[u32], n: usize) -> Vec<u32> {
    let mut counts = vec![0u32; n];
    for &e in entries {
        if let Some(c) = counts.get_mut(e as usize) {
            *c += 1;
        }
    }
    counts
}

/// How evenly a table is shared (Figure 11).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ShareStats {
    /// Largest number of slots held by one backend.
    pub max_entries: u32,
    /// Smallest number of slots held by one backend.
    pub min_entries: u32,
    /// `max_entries` as a percentage of the table.
    pub max_share_pct: f64,
    /// `min_entries` as a percentage of the table.
    pub min_share_pct: f64,
    /// How much the busiest backend must be overprovisioned relative to a
    /// perfect share `M/N`, in percent (the paper's wording).
    pub overprovision_pct: f64,
}

impl ShareStats {
    /// Statistics of per-backend slot counts in a table of `m` slots.
    pub fn from_counts(counts: &[u32], m: u32) -> Self {
        let max = counts.iter().copied().max().unwrap_or(0);
        let min = counts.iter().copied().min().unwrap_or(0);
        let m = f64::from(m);
        let fair = if counts.is_empty() {
            0.0
        } else {
            m / counts.len() as f64
        };
        ShareStats {
            max_entries: max,
            min_entries: min,
            max_share_pct: 100.0 * f64::from(max) / m,
            min_share_pct: 100.0 * f64::from(min) / m,
            overprovision_pct: if fair > 0.0 {
                100.0 * (f64::from(max) / fair - 1.0)
            } else {
                0.0
            },
        }
    }
}

/// `n` backend names in a fixed format whose lexical order is their index
/// order (so name-ordered turns and index order agree).
pub fn backend_names(n: usize) -> Vec<String> {
    let width = n.max(1).to_string().len();
    (0..n).map(|i| format!("backend-{i:0width$}")).collect()
}

/// A tiny deterministic generator (SplitMix64) so experiments are
/// reproducible from a seed without pulling a RNG crate into a pure crate.
#[derive(Debug, Clone)]
pub struct SplitMix(u64);

impl SplitMix {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Self {
        SplitMix(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix64(self.0)
    }

    /// Uniform in `0..bound` (`bound > 0`), by fast range reduction.
    pub fn below(&mut self, bound: usize) -> usize {
        ((u128::from(self.next_u64()) * bound as u128) >> 64) as usize
    }
}

/// One point of Figure 12: the mean over repetitions of the percentage of
/// slots that changed when `failed` of `backends` fail at once.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DisruptionPoint {
    /// Failed backends as a percentage of all backends.
    pub failed_pct: f64,
    /// Number of failed backends.
    pub failed: usize,
    /// Mean percentage of slots whose backend changed (including the slots of
    /// the failed backends, which must change).
    pub changed_pct: f64,
    /// Mean percentage of slots that changed although their backend stayed
    /// healthy: the disruption beyond the unavoidable.
    pub extra_changed_pct: f64,
    /// Repetitions averaged.
    pub repetitions: usize,
}

/// The Figure 12 experiment for one table size: build the table for `n`
/// equally weighted backends, then for each failure count remove that many
/// random backends `repetitions` times, rebuild and count changed slots.
/// `progress` is called once per rebuilt table.
pub fn disruption(
    n: usize,
    m: u64,
    failure_counts: &[usize],
    repetitions: usize,
    seed: u64,
    progress: &mut dyn FnMut(),
) -> Result<Vec<DisruptionPoint>> {
    let mut before = Maglev::new(m)?;
    let names = backend_names(n);
    let backends: Vec<Backend> = names.iter().map(Backend::new).collect();
    before.populate(&backends)?;
    let m32 = before.size();
    // Names sort in index order, so populate_ordered over a subset in index
    // order takes the same turns populate() would take over those names.
    let perms: Vec<Permutation> = names
        .iter()
        .map(|s| Permutation::from_name(s, m32))
        .collect();
    let mut after = Maglev::new(m)?;
    let mut rng = SplitMix::new(seed);
    let mut ids: Vec<usize> = (0..n).collect();
    let mut alive_ids = Vec::with_capacity(n);
    let mut alive = Vec::with_capacity(n);
    let mut dead = vec![false; n];
    let mut points = Vec::with_capacity(failure_counts.len());
    for &k in failure_counts {
        let k = k.min(n);
        let (mut changed_sum, mut extra_sum) = (0u64, 0u64);
        for _ in 0..repetitions {
            // Partial Fisher-Yates: the first k of `ids` are the failures.
            for i in 0..k {
                let j = i + rng.below(n - i);
                ids.swap(i, j);
            }
            dead.fill(false);
            for &d in &ids[..k] {
                dead[d] = true;
            }
            alive_ids.clear();
            alive.clear();
            for (i, p) in perms.iter().enumerate() {
                if !dead[i] {
                    alive_ids.push(i as u32);
                    alive.push((*p, 1));
                }
            }
            after.populate_ordered(&alive)?;
            for (&b, &a) in before.entries().iter().zip(after.entries()) {
                let now = alive_ids.get(a as usize).copied().unwrap_or(u32::MAX);
                if now != b {
                    changed_sum += 1;
                    if !dead[b as usize] {
                        extra_sum += 1;
                    }
                }
            }
            progress();
        }
        let denom = (repetitions.max(1) as f64) * f64::from(m32);
        points.push(DisruptionPoint {
            failed_pct: 100.0 * k as f64 / n.max(1) as f64,
            failed: k,
            changed_pct: 100.0 * changed_sum as f64 / denom,
            extra_changed_pct: 100.0 * extra_sum as f64 / denom,
            repetitions,
        });
    }
    Ok(points)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn share_stats_of_known_counts() {
        let s = ShareStats::from_counts(&[3, 2, 2], 7);
        assert_eq!((s.max_entries, s.min_entries), (3, 2));
        assert!((s.max_share_pct - 300.0 / 7.0).abs() < 1e-9);
        assert!((s.overprovision_pct - 100.0 * (3.0 / (7.0 / 3.0) - 1.0)).abs() < 1e-9);
    }

    #[test]
    fn names_sort_in_index_order() {
        let names = backend_names(1000);
        assert!(names.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn disruption_is_at_least_the_failed_share_and_grows() {
        let pts = disruption(100, 10_007, &[0, 1, 5, 10], 10, 42, &mut || {}).unwrap();
        assert_eq!(pts[0].changed_pct, 0.0);
        for p in &pts[1..] {
            // The failed backends' slots (about k/N of the table) must move.
            let unavoidable = 100.0 * p.failed as f64 / 100.0;
            assert!(p.changed_pct >= unavoidable * 0.9, "{p:?}");
            assert!(p.changed_pct > p.extra_changed_pct && p.extra_changed_pct > 0.0);
        }
        assert!(pts[3].changed_pct > pts[2].changed_pct && pts[2].changed_pct > pts[1].changed_pct);
    }

    #[test]
    fn disruption_matches_a_direct_rebuild_by_name() {
        // The subset shortcut must equal populate() on the surviving names.
        let names = backend_names(50);
        let mut t = Maglev::new(1009).unwrap();
        let alive: Vec<Backend> = names
            .iter()
            .enumerate()
            .filter(|(i, _)| i % 7 != 3)
            .map(|(_, s)| Backend::new(s))
            .collect();
        t.populate(&alive).unwrap();
        let perms: Vec<(Permutation, u32)> = alive
            .iter()
            .map(|b| (Permutation::from_name(&b.name, 1009), 1))
            .collect();
        let mut u = Maglev::new(1009).unwrap();
        u.populate_ordered(&perms).unwrap();
        assert_eq!(t.entries(), u.entries());
    }
}
