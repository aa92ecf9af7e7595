//! SEEKER (the paper's Figure 11): the shortest time to reach
//! places across the disk from its start, over any [`Target`].

use serde::Serialize;

use crate::{Error, Op, Target};

/// One SEEKER result: the shortest time seen to reach a location from the
/// start of the disk.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct SeekPoint {
    /// The location (sector).
    pub lba: u64,
    /// The shortest access time to it seen (ms; includes MTM).
    pub min_ms: f64,
}

/// SEEKER (the paper's Figure 11): for each of `bases` locations, alternate
/// a one-sector access at sector 0 with one at the location (plus 0, 1, 2
/// ... sectors, to walk the rotation), keeping the shortest timed access.
pub fn run(
    t: &mut dyn Target,
    op: Op,
    bases: u32,
    measurements: u32,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Vec<SeekPoint>, Error> {
    let last = t.sectors().saturating_sub(measurements as u64 + 1);
    let mut out = Vec::new();
    for b in 1..=bases as u64 {
        let base = last * b / bases as u64;
        let mut best = f64::INFINITY;
        for i in 0..measurements as u64 {
            t.access(op, 0, 1)?;
            best = best.min(t.access(op, base + i, 1)?);
        }
        out.push(SeekPoint {
            lba: base,
            min_ms: best,
        });
        progress(b, bases as u64);
    }
    Ok(out)
}
