//! The paper's Table 1, and properties every Maglev table must have.

use maglev::{eval, reference, weighted_share_bound, Backend, Maglev, Permutation};
use proptest::prelude::*;

fn perm(offset: u32, skip: u32) -> Permutation {
    Permutation { offset, skip }
}

#[test]
fn table_1_permutations() {
    // Left column of Table 1.
    let expect = [
        [3, 0, 4, 1, 5, 2, 6],
        [0, 2, 4, 6, 1, 3, 5],
        [3, 4, 5, 6, 0, 1, 2],
    ];
    for (p, want) in [perm(3, 4), perm(0, 2), perm(3, 1)].iter().zip(expect) {
        let got: Vec<u32> = (0..7).map(|j| p.nth(j, 7)).collect();
        assert_eq!(got, want);
    }
}

#[test]
fn table_1_before_and_after_removing_b1() {
    let mut t = Maglev::new(7).unwrap();
    // Before: B1 B0 B1 B0 B2 B2 B0.
    t.populate_ordered(&[(perm(3, 4), 1), (perm(0, 2), 1), (perm(3, 1), 1)])
        .unwrap();
    assert_eq!(t.entries(), &[1, 0, 1, 0, 2, 2, 0]);
    // After removing B1: B0 B0 B0 B0 B2 B2 B2 (indices now into [B0, B2]).
    t.populate_ordered(&[(perm(3, 4), 1), (perm(3, 1), 1)])
        .unwrap();
    assert_eq!(t.entries(), &[0, 0, 0, 0, 1, 1, 1]);
}

const PRIMES: &[u64] = &[2, 3, 7, 13, 101, 251, 1009, 4099, 10_007, 65_537];

fn names(n: usize, salt: u32) -> Vec<Backend> {
    (0..n)
        .map(|i| Backend::new(format!("10.{salt}.{}.{}:80", i / 256, i % 256)))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn optimized_equals_pseudocode_1(mi in 0..PRIMES.len(), n in 1usize..60, salt in 0u32..1000) {
        let m = PRIMES[mi];
        let n = n.min(m as usize);
        let backends = names(n, salt);
        let perms: Vec<Permutation> =
            backends.iter().map(|b| Permutation::from_name(&b.name, m as u32)).collect();
        let mut t = Maglev::new(m).unwrap();
        t.populate_ordered(&perms.iter().map(|p| (*p, 1)).collect::<Vec<_>>()).unwrap();
        let want = reference::populate(&perms, m as u32);
        prop_assert!(t.entries().iter().zip(&want).all(|(&a, &b)| i64::from(a) == b));
    }

    #[test]
    fn weighted_equals_literal_weighted_turns(
        mi in 0..PRIMES.len(),
        weights in prop::collection::vec(0u32..6, 1..80),
        salt in 0u32..1000,
    ) {
        // Weights, zeros included, through every phase (probing with and
        // without the first-step select, the ranked tail) against the
        // literal credit scheme.
        let m = PRIMES[mi];
        let weights = &weights[..weights.len().min(m as usize)];
        let input: Vec<(Permutation, u32)> = names(weights.len(), salt)
            .iter()
            .zip(weights)
            .map(|(b, &w)| (Permutation::from_name(&b.name, m as u32), w))
            .collect();
        let mut t = Maglev::new(m).unwrap();
        t.populate_ordered(&input).unwrap();
        let want = reference::populate_weighted(&input, m as u32);
        for (slot, (&a, &b)) in t.entries().iter().zip(&want).enumerate() {
            let a = if a == u32::MAX { -1 } else { i64::from(a) };
            prop_assert_eq!(a, b, "slot {} of M = {}", slot, m);
        }
    }

    #[test]
    fn every_backend_gets_floor_or_ceil(mi in 0..PRIMES.len(), n in 1usize..300, salt in 0u32..1000) {
        let m = PRIMES[mi];
        let n = n.min(m as usize);
        let mut t = Maglev::new(m).unwrap();
        t.populate(&names(n, salt)).unwrap();
        let (lo, hi) = (m / n as u64, m.div_ceil(n as u64));
        for (i, c) in t.counts(n).into_iter().enumerate() {
            prop_assert!((lo..=hi).contains(&u64::from(c)), "backend {} holds {} of {} (n={})", i, c, m, n);
        }
    }

    #[test]
    fn weighted_shares_within_documented_bound(
        mi in 5..PRIMES.len(),
        weights in prop::collection::vec(0u32..20, 1..40),
        salt in 0u32..1000,
    ) {
        let m = PRIMES[mi];
        let mut backends = names(weights.len(), salt);
        for (b, w) in backends.iter_mut().zip(&weights) {
            b.weight = *w;
        }
        let mut t = Maglev::new(m).unwrap();
        t.populate(&backends).unwrap();
        let total: u64 = weights.iter().map(|&w| u64::from(w)).sum();
        let active = weights.iter().filter(|&&w| w > 0).count();
        let counts = t.counts(weights.len());
        for (i, (&c, &w)) in counts.iter().zip(&weights).enumerate() {
            if w == 0 {
                prop_assert_eq!(c, 0, "drained backend {} holds slots", i);
                continue;
            }
            let dev = f64::from(c) - m as f64 * f64::from(w) / total as f64;
            let (lo, hi) = weighted_share_bound(w, total, active);
            prop_assert!(lo < dev && dev < hi, "backend {} w={} holds {}: deviation {} outside ({}, {})", i, w, c, dev, lo, hi);
        }
        if total == 0 {
            prop_assert!(t.entries().iter().all(|&e| e == u32::MAX));
        } else {
            prop_assert_eq!(counts.iter().map(|&c| u64::from(c)).sum::<u64>(), m);
        }
    }

    #[test]
    fn any_input_order_gives_the_same_table(
        mi in 0..PRIMES.len(), n in 1usize..100, salt in 0u32..1000, seed in any::<u64>(),
        weighted in any::<bool>(),
    ) {
        let m = PRIMES[mi];
        let n = n.min(m as usize);
        let mut a = names(n, salt);
        if weighted {
            for (i, b) in a.iter_mut().enumerate() {
                b.weight = (i as u32 * 7 + salt) % 5;
            }
        }
        let mut b = a.clone();
        let mut rng = eval::SplitMix::new(seed);
        for i in (1..b.len()).rev() {
            b.swap(i, rng.below(i + 1));
        }
        let (mut ta, mut tb) = (Maglev::new(m).unwrap(), Maglev::new(m).unwrap());
        ta.populate(&a).unwrap();
        tb.populate(&b).unwrap();
        let name = |v: &[Backend], e: u32| v.get(e as usize).map(|x| x.name.clone());
        for (&x, &y) in ta.entries().iter().zip(tb.entries()) {
            prop_assert_eq!(name(&a, x), name(&b, y));
        }
    }
}

#[test]
fn equal_weights_are_the_unweighted_algorithm() {
    let plain = names(37, 9);
    let heavy: Vec<Backend> = plain
        .iter()
        .map(|b| Backend::weighted(&b.name, 13))
        .collect();
    let (mut a, mut b) = (Maglev::new(10_007).unwrap(), Maglev::new(10_007).unwrap());
    a.populate(&plain).unwrap();
    b.populate(&heavy).unwrap();
    assert_eq!(a.entries(), b.entries());
}

#[test]
fn regeneration_reuses_buffers_and_forgets_the_old_table() {
    let mut t = Maglev::new(1009).unwrap();
    t.populate(&names(10, 1)).unwrap();
    let ptr = t.entries().as_ptr();
    t.populate(&names(3, 2)).unwrap();
    assert_eq!(t.entries().as_ptr(), ptr, "entry buffer was reallocated");
    assert!(t.entries().iter().all(|&e| e < 3));
}

#[test]
fn lookup_follows_the_table() {
    let mut t = Maglev::new(65_537).unwrap();
    let b = names(1000, 3);
    t.populate(&b).unwrap();
    let mut hits = vec![0u32; 1000];
    for i in 0..1_000_000u64 {
        hits[t.lookup(maglev::mix64(i)).unwrap() as usize] += 1;
    }
    // 1000 flows per backend on average; a uniform hash keeps every backend
    // within a few standard deviations (sqrt(1000) ~ 32).
    assert!(
        hits.iter().all(|&h| (800..1200).contains(&h)),
        "min {:?} max {:?}",
        hits.iter().min(),
        hits.iter().max()
    );
}
