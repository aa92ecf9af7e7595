//! SKIPPY (the paper's section 4.1, Figure 1): one-sector accesses, each
//! a growing step past the last, over any [`Target`]; and the delayed
//! probes that place MTM between two steps.

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

/// A SKIPPY mode name that is none of `write`, `read`, `backward`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown SKIPPY mode {0:?}: write, read or backward")]
pub struct UnknownMode(pub String);

impl std::str::FromStr for SkippyMode {
    type Err = UnknownMode;
    fn from_str(s: &str) -> Result<Self, UnknownMode> {
        match s {
            "write" => Ok(SkippyMode::Write),
            "read" => Ok(SkippyMode::Read),
            "backward" | "backwards" => Ok(SkippyMode::Backward),
            _ => Err(UnknownMode(s.to_string())),
        }
    }
}

/// One SKIPPY measurement.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Point {
    /// Sectors skipped since the previous access.
    pub step: u32,
    /// The sector accessed.
    pub lba: u64,
    /// How long the access took (ms).
    pub latency_ms: f64,
}

/// SKIPPY settings.
#[derive(Debug, Clone, Copy)]
pub struct SkippyOpts {
    /// Which variant to run.
    pub mode: SkippyMode,
    /// How many steps: step 0 to `steps - 1` (sectors skipped).
    pub steps: u32,
    /// Where to start (sectors).
    pub start: u64,
    /// Stop early after this much device time (ms); `None` runs every
    /// step.
    pub budget_ms: Option<f64>,
}

impl Default for SkippyOpts {
    fn default() -> Self {
        SkippyOpts {
            mode: SkippyMode::Write,
            steps: 400,
            start: 0,
            budget_ms: Some(2000.0),
        }
    }
}

/// SKIPPY (the paper's Figure 1): after each one-sector access the position
/// moves on by `step` more sectors, `step` growing by one each time. Every
/// step is run, unless the device-time budget is spent first: then the
/// points are fewer than `steps` (see [`stopped_early`]).
pub fn run(t: &mut dyn Target, o: &SkippyOpts) -> Result<Vec<Point>, Error> {
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
                if o.budget_ms.is_some_and(|b| t.elapsed_ms() - t0 > b) {
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
                if o.budget_ms.is_some_and(|b| t.elapsed_ms() - t0 > b) {
                    break;
                }
            }
        }
    }
    Ok(out)
}

/// Why a run of `o` stopped before its last step, if it did (`points`
/// is what it returned): for the user.
pub fn stopped_early(o: &SkippyOpts, points: &[Point]) -> Option<String> {
    let done = points.len() as u32;
    (done < o.steps).then(|| {
        format!(
            "SKIPPY stopped after {done} of {} steps: the device-time budget ({} ms, --budget-ms) was spent",
            o.steps,
            o.budget_ms.map_or_else(|| "none".to_string(), |b| format!("{b:.0}"))
        )
    })
}

/// One probe at `pos`: a priming one-sector access, `delay_ms` of idle
/// time, then the timed access `step` sectors on. The latency returned has
/// the delay added back, so that it lies on L1 or L2 like a SKIPPY point.
fn probe_once(
    t: &mut dyn Target,
    op: Op,
    pos: u64,
    step: u32,
    delay_ms: f64,
) -> Result<Point, Error> {
    t.access(op, pos, 1)?;
    if delay_ms > 0.0 {
        t.idle(delay_ms);
    }
    let lba = pos + 1 + step as u64;
    let l = t.access(op, lba, 1)?;
    Ok(Point {
        step,
        lba,
        latency_ms: l + delay_ms,
    })
}

/// Where MTM probes go: one per track, at the same place on each, so that
/// once a probe stays inside its track (a probe that crosses a boundary
/// gains the skew and is not usable) the following ones do too.
struct ProbeWalk {
    op: Op,
    pos: u64,
    /// Whole tracks, more than a probe plus a gap in which the next
    /// priming access is in time.
    stride: u64,
    deadline_ms: f64,
}

impl ProbeWalk {
    fn new(e: &crate::extract::Skippy, op: Op, start: u64, deadline_ms: f64) -> ProbeWalk {
        let spt = e.sectors_per_track.round().max(1.0) as u64;
        let span = 2 * (e.stm as u64 + 2) + 40;
        ProbeWalk {
            op,
            pos: start,
            stride: span.div_ceil(spt) * spt,
            deadline_ms,
        }
    }

    /// Probes of `step` with `delay_ms` until two agree or three are
    /// usable (at most six tries): (in time, usable), or `None` when the
    /// device time is spent or the disk ends.
    fn votes(
        &mut self,
        t: &mut dyn Target,
        e: &crate::extract::Skippy,
        step: u32,
        delay_ms: f64,
    ) -> Result<Option<(u32, u32)>, Error> {
        let (mut made, mut usable) = (0u32, 0u32);
        for _ in 0..6 {
            if usable == 3 || (usable == 2 && made != 1) {
                break;
            }
            if self.pos + self.stride + step as u64 > t.sectors()
                || t.elapsed_ms() > self.deadline_ms
            {
                return Ok(None);
            }
            let p = probe_once(t, self.op, self.pos, step, delay_ms)?;
            self.pos += self.stride;
            match crate::extract::probe_made_it(e, &p) {
                Some(m) => {
                    made += m as u32;
                    usable += 1;
                }
                // Crossed a boundary (or met an outlier): move the walk
                // along its tracks, past where the boundary was.
                None => self.pos += step as u64 + 2,
            }
        }
        Ok(Some((made, usable)))
    }

    /// Whether most usable probes of `step` with `delay_ms` were in time;
    /// `None` when none was usable or the device time or disk ran out.
    fn majority(
        &mut self,
        t: &mut dyn Target,
        e: &crate::extract::Skippy,
        step: u32,
        delay_ms: f64,
    ) -> Result<Option<bool>, Error> {
        Ok(match self.votes(t, e, step, delay_ms)? {
            Some((made, usable)) if usable > 0 => Some(2 * made > usable),
            _ => None,
        })
    }
}

/// Place MTM to a fraction of the request jitter, using `budget_ms` of
/// device time past the run's last sector. The run places MTM only to a
/// step (a sector: 0.2 ms on the oldest drives), and with jitter wider than
/// a sector its STM can be off by several. So: find a step whose probes are
/// all in time (STM + 1, else further up), then hold the second request
/// back by a delay, bisected until the request starts to miss: MTM is that
/// step's rotation less the largest delay that still makes it.
pub fn refine_mtm(
    t: &mut dyn Target,
    mode: SkippyMode,
    run: &[Point],
    e: &mut crate::extract::Skippy,
    budget_ms: f64,
) -> Result<(), Error> {
    let start = run.last().map_or(0, |p| p.lba + 2);
    let mut walk = ProbeWalk::new(e, mode.op(), start, t.elapsed_ms() + budget_ms);
    let sector = e.l2.slope;
    // A step always in time: STM + 1, then 2, 4, 8, 16 steps further.
    let mut step = e.stm + 1;
    let mut up = 1;
    loop {
        match walk.votes(t, e, step, 0.0)? {
            Some((m, u)) if u >= 2 && m == u => break,
            Some(_) if up <= 16 => {
                step += up;
                up *= 2;
            }
            _ => return Ok(()),
        }
    }
    // A delay that misses: at least 2.5 sectors (below STM - 1) and 0.25
    // ms (several jitters), doubled while still in time.
    let (mut lo, mut hi) = (0.0, (2.5 * sector).max(0.25));
    loop {
        match walk.majority(t, e, step, hi)? {
            None => return Ok(()),
            Some(false) => break,
            Some(true) => {}
        }
        if hi > step as f64 * sector {
            return Ok(()); // never misses: not a rotational threshold
        }
        lo = hi;
        hi *= 2.0;
    }
    let mut rounds = 0;
    while hi - lo > 0.01 {
        let d = 0.5 * (lo + hi);
        match walk.majority(t, e, step, d)? {
            None => return Ok(()),
            Some(true) => lo = d,
            Some(false) => hi = d,
        }
        rounds += 1;
    }
    e.mtm_ms = step as f64 * sector - 0.5 * (lo + hi);
    e.notes.push(format!(
        "MTM placed within a sector by delaying the request at step {step} ({rounds} rounds)"
    ));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_by_name_and_others_are_refused() {
        assert_eq!("write".parse(), Ok(SkippyMode::Write));
        assert_eq!("read".parse(), Ok(SkippyMode::Read));
        assert_eq!("backwards".parse(), Ok(SkippyMode::Backward));
        let e = "sideways".parse::<SkippyMode>().unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown SKIPPY mode \"sideways\": write, read or backward"
        );
    }
}
