//! Builds the N = 1000 table repeatedly, for profilers:
//! `cargo run --release -p maglev --example gen_profile -- 655373 200`.
use maglev::{eval::backend_names, Backend, Maglev};

fn main() {
    let mut args = std::env::args().skip(1);
    let m: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(65_537);
    let reps: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(500);
    let backends: Vec<Backend> = backend_names(1000).iter().map(Backend::new).collect();
    let mut t = Maglev::new(m).expect("prime table size");
    let start = std::time::Instant::now();
    for _ in 0..reps {
        t.populate(&backends).expect("valid backends");
    }
    println!(
        "M = {m}: {:.3} ms per table",
        start.elapsed().as_secs_f64() * 1e3 / reps as f64
    );
}
