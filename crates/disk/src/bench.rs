//! The three microbenchmarks, over any [`Target`].

use serde::Serialize;

use crate::{Error, Op, Target};

/// SKIPPY's variants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SkippyMode {
    /// The paper's: write one sector, skip `step` sectors, write again.
    Write,
    /// The same with reads (read-ahead may hide the pattern).
    Read,
    /// Reads walking backwards, which defeats read-ahead.
    Backward,
}

impl SkippyMode {
    /// The access each step makes.
    pub fn op(self) -> Op {
        if self == SkippyMode::Write {
            Op::Write
        } else {
            Op::Read
        }
    }
}

impl std::str::FromStr for SkippyMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "write" => Ok(SkippyMode::Write),
            "read" => Ok(SkippyMode::Read),
            "backward" | "backwards" => Ok(SkippyMode::Backward),
            _ => Err(format!(
                "unknown SKIPPY mode {s:?}: write, read or backward"
            )),
        }
    }
}

/// One SKIPPY measurement.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Point {
    pub step: u32,
    pub lba: u64,
    pub latency_ms: f64,
}

/// SKIPPY settings.
#[derive(Debug, Clone, Copy)]
pub struct SkippyOpts {
    pub mode: SkippyMode,
    /// Largest step (in sectors).
    pub steps: u32,
    /// Where to start (sectors).
    pub start: u64,
    /// Stop early after this much device time (ms).
    pub budget_ms: f64,
}

impl Default for SkippyOpts {
    fn default() -> Self {
        SkippyOpts {
            mode: SkippyMode::Write,
            steps: 400,
            start: 0,
            budget_ms: 2000.0,
        }
    }
}

/// SKIPPY (the paper's Figure 1): after each one-sector access the position
/// moves on by `step` more sectors, `step` growing by one each time.
pub fn skippy(t: &mut dyn Target, o: &SkippyOpts) -> Result<Vec<Point>, Error> {
    let n = o.steps as u64;
    let span = n * (n + 1) / 2 + n + 2;
    if span + o.start > t.sectors() {
        return Err(Error::Invalid(format!(
            "SKIPPY with {} steps needs {span} sectors from {}, the target has {} (use fewer --steps or a larger target)",
            o.steps,
            o.start,
            t.sectors()
        )));
    }
    let op = o.mode.op();
    let t0 = t.elapsed_ms();
    let mut out = Vec::with_capacity(o.steps as usize);
    match o.mode {
        SkippyMode::Write | SkippyMode::Read => {
            // Prime: the first timed access then follows one at a known place.
            t.access(op, o.start, 1)?;
            let mut pos = o.start + 1;
            for step in 0..o.steps {
                let lba = pos + step as u64;
                let l = t.access(op, lba, 1)?;
                out.push(Point {
                    step,
                    lba,
                    latency_ms: l,
                });
                pos = lba + 1;
                if t.elapsed_ms() - t0 > o.budget_ms {
                    break;
                }
            }
        }
        SkippyMode::Backward => {
            let top = o.start + span - 1;
            t.access(op, top, 1)?;
            let mut pos = top;
            for step in 0..o.steps {
                let lba = pos - 1 - step as u64;
                let l = t.access(op, lba, 1)?;
                out.push(Point {
                    step,
                    lba,
                    latency_ms: l,
                });
                pos = lba;
                if t.elapsed_ms() - t0 > o.budget_ms {
                    break;
                }
            }
        }
    }
    Ok(out)
}

/// One ZONED report: bandwidth over a region.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct ZonePoint {
    /// Start of the region, bytes.
    pub offset: u64,
    /// MB/s (10^6 bytes per second) over the region.
    pub mbps: f64,
}

/// ZONED (the paper's Figure 9): read everything in large blocks, report the
/// bandwidth of each region. `progress(done, total)` is called per region.
pub fn zoned(
    t: &mut dyn Target,
    block_bytes: u64,
    regions: u32,
    limit_bytes: Option<u64>,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Vec<ZonePoint>, Error> {
    let ss = t.sector_size();
    let block = (block_bytes / ss).max(1);
    let total = limit_bytes.map_or(t.sectors(), |l| (l / ss).min(t.sectors()));
    let regions = regions.max(2) as u64;
    let per_region = (total / regions / block).max(1) * block;
    let mut out = Vec::new();
    let mut lba = 0;
    while lba + per_region <= total {
        let mut ms = 0.0;
        let mut done = 0;
        while done < per_region {
            let n = block.min(per_region - done);
            ms += t.access(Op::Read, lba + done, n as u32)?;
            done += n;
        }
        out.push(ZonePoint {
            offset: lba * ss,
            mbps: (per_region * ss) as f64 / ms / 1000.0,
        });
        lba += per_region;
        progress(lba * ss, total * ss);
    }
    Ok(out)
}

/// One SEEKER result: the shortest time seen to reach a location from the
/// start of the disk.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct SeekPoint {
    pub lba: u64,
    pub min_ms: f64,
}

/// SEEKER (the paper's Figure 11): for each of `bases` locations, alternate
/// a one-sector access at sector 0 with one at the location (plus 0, 1, 2
/// ... sectors, to walk the rotation), keeping the shortest timed access.
pub fn seeker(
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

/// Repeat single SKIPPY steps near the transition: each probe is a priming
/// one-sector access followed by the timed one `step` sectors on, at a fresh
/// place each time (from `start` onward). Several samples per step let the
/// extraction place MTM between steps (see `extract::refine_mtm`).
pub fn skippy_probe(
    t: &mut dyn Target,
    mode: SkippyMode,
    start: u64,
    steps: &[u32],
    reps: u32,
    budget_ms: f64,
) -> Result<Vec<Point>, Error> {
    let op = mode.op();
    let mut out = Vec::new();
    let mut pos = start;
    let t0 = t.elapsed_ms();
    for _ in 0..reps {
        for &s in steps {
            if pos + s as u64 + 2 > t.sectors() || t.elapsed_ms() - t0 > budget_ms {
                return Ok(out);
            }
            t.access(op, pos, 1)?;
            let lba = pos + 1 + s as u64;
            let l = t.access(op, lba, 1)?;
            out.push(Point {
                step: s,
                lba,
                latency_ms: l,
            });
            // Move on by an odd amount so that successive probes of a step
            // fall at different places on their tracks (a probe that crosses
            // a track boundary is not usable).
            pos = lba + 1 + 13;
        }
    }
    Ok(out)
}

/// Probe the steps around a run's STM (eight samples each, within
/// `budget_ms` of device time, past the run's last sector) and place MTM
/// between steps from them ([`crate::extract::refine_mtm`]).
pub fn refine_mtm(
    t: &mut dyn Target,
    mode: SkippyMode,
    run: &[Point],
    e: &mut crate::extract::Skippy,
    budget_ms: f64,
) -> Result<(), Error> {
    let steps: Vec<u32> = (e.stm.saturating_sub(6)..=e.stm + 1).collect();
    let start = run.last().map_or(0, |p| p.lba + 2);
    let probes = skippy_probe(t, mode, start, &steps, 8, budget_ms)?;
    crate::extract::refine_mtm(e, &probes);
    Ok(())
}
