//! Table generation and lookup, each beside its peer in the same run:
//! generation against Pseudocode 1 written literally (the paper's algorithm
//! without our bitmap and incremental positions), lookup against Karger's
//! ring (binary search) on the same flow hashes.
//!
//! Run: `cargo bench -p maglev` (or `make bench`).

// criterion_group! defines an undocumented `pub fn benches`.
#![allow(missing_docs)]

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion};
use maglev::{
    eval::backend_names, karger::KargerRing, mix64, reference, Backend, Maglev, Permutation,
};

fn generation(c: &mut Criterion) {
    let names = backend_names(1000);
    let backends: Vec<Backend> = names.iter().map(Backend::new).collect();
    let mut g = c.benchmark_group("generate_n1000");
    g.sample_size(20);
    for m in [65_537u64, 655_373] {
        let mut t = Maglev::new(m).unwrap();
        g.bench_with_input(BenchmarkId::new("fastpath", m), &m, |b, _| {
            b.iter(|| t.populate(black_box(&backends)).unwrap())
        });
        let perms: Vec<Permutation> = names
            .iter()
            .map(|s| Permutation::from_name(s, m as u32))
            .collect();
        g.bench_with_input(BenchmarkId::new("pseudocode1_literal", m), &m, |b, _| {
            b.iter(|| reference::populate(black_box(&perms), m as u32))
        });
    }
    g.finish();
}

fn lookup(c: &mut Criterion) {
    let names = backend_names(1000);
    let backends: Vec<Backend> = names.iter().map(Backend::new).collect();
    let mut t = Maglev::new(65_537).unwrap();
    t.populate(&backends).unwrap();
    let ring = KargerRing::new(&names, 1000);
    let hashes: Vec<u64> = (0..4096u64).map(mix64).collect();
    let mut g = c.benchmark_group("lookup_4096_flows");
    g.bench_function("maglev", |b| {
        b.iter(|| {
            hashes
                .iter()
                .map(|&h| t.lookup(h).unwrap() as u64)
                .sum::<u64>()
        })
    });
    g.bench_function("karger_ring", |b| {
        b.iter(|| {
            hashes
                .iter()
                .map(|&h| ring.lookup(h).unwrap() as u64)
                .sum::<u64>()
        })
    });
    g.finish();
}

criterion_group!(benches, generation, lookup);
criterion_main!(benches);
