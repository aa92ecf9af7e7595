//! Parameters from the curves (the paper's section 4.1.2, automated).
//!
//! SKIPPY's latency-against-step curve is a sawtooth: each step moves the
//! target `step` sectors on, so the latency grows by one sector's time per
//! step and falls by a whole rotation where the wait wraps round. Before the
//! transition at STM every access waits an extra rotation (L1), after it
//! none does (L2); accesses that cross a track boundary sit above the
//! sawtooth by what the boundary's skew costs them (L3 for a track, L4 for a
//! cylinder). The extraction:
//!
//! 1. requests a cache answers (a dense flat band of latencies: read-ahead on
//!    reads, a write-back cache on writes) are named and set aside;
//! 2. rotation and slope are fitted *jointly*: every point that crossed no
//!    boundary satisfies `latency = slope * step + c + k * rotation` for an
//!    integer `k` (L1, L2 and every later tooth alike), so the pair
//!    (slope, rotation) is the one that folds the most points onto one
//!    phase; a coarse-to-fine grid finds it, then least squares over the
//!    folded points with their tooth numbers refines it. Sectors per track
//!    is rotation over slope: the sawtooth's period in steps;
//! 3. the rotation is cross-checked against the paper's other estimate,
//!    the latency at step 0 (less one sector's transfer; made robust as the
//!    median over the first five steps, each less its own sectors); a
//!    disagreement over 1% is reported as uncertain, never averaged;
//! 4. MTM from the transition (half a step is the resolution);
//! 5. switches: every point's excess over the sawtooth, folded by the
//!    rotation. Steps shorter than a track cross at most one boundary: their
//!    excesses cluster at the head-switch skew cost and the cylinder-switch
//!    skew cost. Every step is then decoded into the number of head and
//!    cylinder boundaries it crossed, and the surfaces are *counted* as the
//!    head boundaries between two cylinder boundaries. Nothing assumes
//!    every track holds the same number of sectors, so spare sectors (per
//!    track, per cylinder, every few cylinders) and the slipping they cause
//!    do not mislead it;
//! 6. nothing impossible is printed as fact: a rotation outside 2-30 ms, MTM
//!    above the rotation, a cache signature, surfaces no boundary pattern
//!    supports are each flagged [`Uncertain`] with the reason;
//! 7. the part of the run that follows the sawtooth: every point lies on
//!    it, or above it (modulo the rotation) by the skews of the head and
//!    cylinder boundaries a step of its length crosses, however long the
//!    step. A long run stops following it somewhere (steps that seek
//!    further than the skews cover, remapped sectors, a zone with another
//!    number of sectors per track): where most points of a window lie
//!    nowhere the model puts them, or where the points drift off it as
//!    another slope makes them (past a zone boundary they can still lie
//!    within the tolerance of a wrong count of boundaries for dozens of
//!    steps), the run is cut, and the extraction runs again on the part
//!    before the cut. A zone boundary is told from the rest by the period
//!    the points after it fold with. The notes say which steps were used
//!    and why the rest was not; a run that leaves the sawtooth among the
//!    steps the values rest on has them flagged.
//!
//! The switch times are what SKIPPY can see: the *skew cost*, the time a
//! stream loses at a boundary (the track skew in sectors times a sector's
//! time), not the mechanical head or cylinder switch, which the skew hides.
//!
//! Backwards reads (the paper's proposed variant that read-ahead does not
//! help) make a mirrored sawtooth: the latency falls by a sector per step
//! and jumps up by a rotation; the same fit runs on the negated curve, and
//! MTM follows from where the first jump is.
//!
//! A curve without a big drop, or that no sawtooth folds, has no
//! rotational signature (flash, or a cache): then nothing is invented.

use measure::stats::median;
use serde::Serialize;

use crate::skippy::Point;
use crate::zoned::ZonePoint;

/// Parameter names, as [`Uncertain::param`] and the validation use them.
pub mod param {
    /// Rotation time.
    pub const ROTATION: &str = "rotation_ms";
    /// Minimal time to media.
    pub const MTM: &str = "mtm_ms";
    /// Sectors per track.
    pub const SPT: &str = "sectors_per_track";
    /// Head switch skew cost.
    pub const HEAD: &str = "head_switch_ms";
    /// Cylinder switch skew cost.
    pub const CYL: &str = "cyl_switch_ms";
    /// Surfaces.
    pub const SURFACES: &str = "surfaces";
}

/// A line `y = slope * x + intercept`.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Line {
    /// Rise per unit of x (for SKIPPY: ms per step).
    pub slope: f64,
    /// The value at x = 0.
    pub intercept: f64,
}

impl Line {
    /// The value at `x`.
    pub fn at(&self, x: f64) -> f64 {
        self.slope * x + self.intercept
    }
}

/// Which way a SKIPPY run walked (from its positions).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// Each access after the previous one (write or read SKIPPY).
    Forward,
    /// Each access before the previous one (backwards reads).
    Backward,
}

/// A printed value that may be wrong, and why.
#[derive(Debug, Clone, Serialize)]
pub struct Uncertain {
    /// The parameter ([`param`]).
    pub param: &'static str,
    /// Why it is doubtful, for the user.
    pub reason: String,
}

/// Requests answered without any mechanical delay.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct CacheSignature {
    /// How many requests.
    pub answered: usize,
    /// Of how many.
    pub of: usize,
    /// Their (median) latency, ms.
    pub latency_ms: f64,
}

/// What SKIPPY's curve says.
#[derive(Debug, Clone, Serialize)]
pub struct Skippy {
    /// Which way the run walked.
    pub direction: Direction,
    /// The sawtooth's height, fitted jointly with its slope.
    pub rotation_ms: f64,
    /// The paper's other estimate: the latency at step 0 (one sector's
    /// transfer more than a rotation forwards, less backwards).
    pub rotation_step0_ms: f64,
    /// MTM: the shortest time from one access to the next that lets the
    /// next catch its sector without waiting a rotation (host, bus and
    /// controller overhead), ms.
    pub mtm_ms: f64,
    /// STM: the first step (sectors) whose access is in time, where the
    /// curve drops from L1 to L2 (backwards: the first that is late).
    pub stm: u32,
    /// Rotation over the slope: how many sectors pass under the head per
    /// rotation (in the zone measured): the sawtooth's period in steps.
    pub sectors_per_track: f64,
    /// The head switch *as SKIPPY sees it*: the skew cost (L3 - L2), what a
    /// stream loses at a track boundary. The mechanical switch is shorter:
    /// the skew is chosen to cover it.
    pub head_switch_ms: Option<f64>,
    /// The cylinder switch as SKIPPY sees it: the cylinder skew cost
    /// (L4 - L2).
    pub cyl_switch_ms: Option<f64>,
    /// Surfaces (tracks per cylinder): head boundaries counted between two
    /// cylinder boundaries.
    pub surfaces: Option<u32>,
    /// L1: accesses that missed their sector and waited an extra rotation
    /// (steps before STM).
    pub l1: Line,
    /// L2: accesses in time (from STM on), parallel to L1.
    pub l2: Line,
    /// L3: accesses that crossed a track boundary (L2 plus the head switch).
    pub l3: Option<Line>,
    /// L4: accesses that crossed a cylinder boundary (L2 plus the
    /// cylinder switch).
    pub l4: Option<Line>,
    /// The paper's point (1): the first step of the run.
    pub point1: u32,
    /// The paper's point (2): the last step before the drop to L2.
    pub point2: u32,
    /// The paper's point (3): the first step on L2 (STM).
    pub point3: u32,
    /// Robust noise estimate around the sawtooth (ms).
    pub noise_ms: f64,
    /// Requests a cache answered, if some were.
    pub cache: Option<CacheSignature>,
    /// The first and last step of the run the values come from: the part
    /// that follows the sawtooth (the notes say why the rest does not).
    pub steps_used: (u32, u32),
    /// Values printed that may be wrong, with the reason.
    pub uncertain: Vec<Uncertain>,
    /// What the extraction could not separate or did in another way, for
    /// the reader of the results.
    pub notes: Vec<String>,
}

impl Skippy {
    /// Why `param` is uncertain, if it is.
    pub fn uncertain(&self, param: &str) -> Option<&str> {
        self.uncertain
            .iter()
            .find(|u| u.param == param)
            .map(|u| u.reason.as_str())
    }

    /// Mark `param` uncertain (the first reason given stays first).
    pub fn flag(&mut self, param: &'static str, reason: impl Into<String>) {
        let reason = reason.into();
        match self.uncertain.iter_mut().find(|u| u.param == param) {
            Some(u) if !u.reason.contains(&reason) => {
                u.reason.push_str("; ");
                u.reason.push_str(&reason);
            }
            Some(_) => {}
            None => self.uncertain.push(Uncertain { param, reason }),
        }
    }

    /// Flag whatever contradicts physics or another value (see the
    /// module's rule 6). Idempotent; call it again after changing a value.
    pub fn check_plausible(&mut self) {
        let r = self.rotation_ms;
        if !(2.0..=30.0).contains(&r) {
            let why = format!("a rotation of {r:.3} ms is outside 2-30 ms (no disk turns at that speed): check the trace's unit");
            self.flag(param::ROTATION, why.clone());
            self.flag(param::SPT, why);
        }
        if !(self.mtm_ms > 0.0 && self.mtm_ms < r) {
            self.flag(
                param::MTM,
                format!(
                    "MTM {:.3} ms is not between 0 and the rotation ({r:.3} ms): physically impossible (a cache or read-ahead answers the early requests: use write SKIPPY with the write cache off, or backwards reads)",
                    self.mtm_ms
                ),
            );
        }
        if self.sectors_per_track < 4.0 {
            self.flag(param::SPT, "fewer than 4 sectors per track");
        }
        for (p, v) in [
            (param::HEAD, self.head_switch_ms),
            (param::CYL, self.cyl_switch_ms),
        ] {
            if let Some(v) = v {
                if !(v > 0.0 && v < r) {
                    self.flag(
                        p,
                        format!("{v:.3} ms is not between 0 and the rotation ({r:.3} ms)"),
                    );
                }
            }
        }
        if let Some(s) = self.surfaces {
            if !(1..=64).contains(&s) {
                self.flag(
                    param::SURFACES,
                    format!("{s} surfaces: no drive has that many"),
                );
            }
        }
    }
}

/// The result of an extraction.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Extraction {
    /// The curve is a rotational sawtooth: what it says.
    Rotational(Box<Skippy>),
    /// No sawtooth: the device is not a rotating disk, or a cache answers.
    NoRotation {
        /// What in the curve showed it, for the user.
        reason: String,
    },
}

/// Group sorted values into clusters separated by gaps larger than `gap`.
fn clusters(mut v: Vec<(f64, usize)>, gap: f64) -> Vec<Vec<(f64, usize)>> {
    v.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut out: Vec<Vec<(f64, usize)>> = Vec::new();
    for x in v {
        match out.last_mut() {
            Some(c) if x.0 - c.last().expect("non-empty").0 <= gap => c.push(x),
            _ => out.push(vec![x]),
        }
    }
    out
}

fn center(c: &[(f64, usize)]) -> f64 {
    let mut v: Vec<f64> = c.iter().map(|x| x.0).collect();
    median(&mut v)
}

/// The standard error of a cluster's median, from its own spread (the
/// median absolute deviation, scaled to a standard deviation).
fn center_se(c: &[(f64, usize)]) -> f64 {
    let m = center(c);
    let mut d: Vec<f64> = c.iter().map(|x| (x.0 - m).abs()).collect();
    1.2533 * 1.4826 * median(&mut d) / (c.len() as f64).sqrt()
}

/// Distance of `x` from `y` on a circle of circumference `r`.
fn circ(x: f64, y: f64, r: f64) -> f64 {
    let d = (x - y).rem_euclid(r);
    d.min(r - d)
}

/// A dense flat band of the fastest latencies: at least 6% of the requests
/// (and eight) within 0.15 ms of each other, at the bottom of the curve. A
/// mechanism spreads its latencies over the rotation; only a cache answers
/// that many in the same (short) time.
fn cache_band(lat: &[f64]) -> Option<(Vec<bool>, f64)> {
    let mut v: Vec<f64> = lat.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let w = 0.15;
    let (mut best, mut at) = (0usize, 0usize);
    let mut j = 0;
    for i in 0..v.len() {
        while j < v.len() && v[j] <= v[i] + w {
            j += 1;
        }
        if j - i > best {
            (best, at) = (j - i, i);
        }
    }
    if best < 8 || best * 100 < 6 * lat.len() || v[at] > v[0] + 0.2 {
        return None;
    }
    let mut band: Vec<f64> = v[at..at + best].to_vec();
    let m = median(&mut band);
    let member = lat.iter().map(|&x| (x - m).abs() <= 0.6 * w).collect();
    Some((member, m))
}

/// The coarse look: the transition (first big drop that stays down, a drop
/// split over two steps counted whole), a slope and a rotation to start the
/// fit from. `Err` says why there is no sawtooth.
fn coarse(s: &[f64], y: &[f64]) -> Result<(usize, f64, f64), String> {
    let n = y.len();
    let lo = y.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = y.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let med3: Vec<f64> = (0..n)
        .map(|i| {
            let a = i.saturating_sub(1);
            let b = (i + 1).min(n - 1);
            let mut w: Vec<f64> = y[a..=b].to_vec();
            median(&mut w)
        })
        .collect();
    // A drop split over up to three steps (timing noise, or the points
    // that crossed a boundary between them, which a long skew puts half a
    // rotation up) is counted whole: the highest of the three before
    // against the lowest of the three from here.
    let before = |i: usize| {
        med3[i.saturating_sub(3)..i]
            .iter()
            .copied()
            .fold(f64::NEG_INFINITY, f64::max)
    };
    let from = |i: usize| {
        med3[i..(i + 3).min(n)]
            .iter()
            .copied()
            .fold(f64::INFINITY, f64::min)
    };
    let drops: Vec<f64> = (1..n).map(|i| before(i) - from(i)).collect();
    let drop = drops.iter().copied().fold(0.0, f64::max);
    let stays_low = |i: usize| {
        let after = &med3[i..(i + 8).min(n)];
        after.len() >= 4
            && after
                .iter()
                .filter(|&&v| v < before(i) - 0.5 * drop)
                .count()
                * 4
                >= after.len() * 3
    };
    let k = (1..n)
        .filter(|&i| drops[i - 1] > 0.6 * drop)
        .find(|&i| stays_low(i))
        .unwrap_or(0);
    if drop < 0.3 * (hi - lo) || k < 3 {
        return Err(format!(
            "no sawtooth: the largest drop is {drop:.3} ms of a {:.3} ms range",
            hi - lo
        ));
    }
    // Slope: the median of short-range slopes that do not span a drop.
    let mut sl = Vec::new();
    for lag in [2usize, 3, 5, 8] {
        for i in 0..n.saturating_sub(lag) {
            let (dy, ds) = (y[i + lag] - y[i], s[i + lag] - s[i]);
            if ds > 0.0 && dy.abs() < 0.25 * drop {
                sl.push(dy / ds);
            }
        }
    }
    let a0 = median(&mut sl);
    if a0.is_nan() || a0 <= 0.0 {
        return Err(format!(
            "latency does not grow with the step (slope {a0:.5} ms/step): no rotational sawtooth"
        ));
    }
    // Rotation: L1 before the drop against L2 just after it, in the part of
    // the tooth that cannot have wrapped yet.
    let res = |i: usize| y[i] - a0 * s[i];
    let mut pre: Vec<f64> = (0..k.saturating_sub(1)).map(res).collect();
    let reach = s[k] + 0.6 * drop / a0;
    let mut post: Vec<f64> = (k..n).filter(|&i| s[i] <= reach).map(res).collect();
    if pre.is_empty() || post.len() < 3 {
        return Err("too few points on one side of the transition".into());
    }
    post.sort_by(|a, b| a.total_cmp(b));
    let half = post.len().div_ceil(2);
    let r0 = median(&mut pre) - median(&mut post[..half]);
    if r0.is_nan() || r0 <= 0.0 {
        return Err("the curve does not fall by a rotation at its largest drop".into());
    }
    // The sawtooth's period in steps is the sectors per track: a curve
    // that climbs a whole drop in a few steps is not a sector at a time.
    if r0 / a0 < 8.0 {
        return Err(format!(
            "the curve climbs {a0:.3} ms per step and falls {r0:.3} ms: a period of {:.1} steps, not a track's sectors",
            r0 / a0
        ));
    }
    Ok((k, a0, r0))
}

/// The joint fit of slope and rotation (see the module's step 2).
struct Fold {
    a: f64,
    r: f64,
    /// Intercept of the tooth numbered 0.
    c: f64,
    /// Each point's tooth number, if it lies on the sawtooth.
    tooth: Vec<Option<i64>>,
    sigma: f64,
    /// Teeth with at least three points on them.
    teeth: usize,
}

/// How many points fold onto the best phase at (a, r), with bins `w` wide,
/// less those folding just below it; and that phase. A boundary only ever
/// adds to a latency, so below the sawtooth's clean line (by up to 30% of
/// a rotation) there is nothing but noise; a rotation short by a skew folds
/// the points that gained the skew onto the clean ones of another tooth,
/// and leaves the clean ones of its own tooth just below: the penalty
/// tells the two apart.
fn fold_score(s: &[f64], y: &[f64], a: f64, r: f64, w: f64) -> (i64, f64) {
    let nb = ((r / w).ceil() as usize).max(8);
    let bw = r / nb as f64;
    let mut cnt = vec![0i64; nb];
    for (&x, &v) in s.iter().zip(y) {
        let ph = (v - a * x).rem_euclid(r);
        cnt[((ph / bw) as usize).min(nb - 1)] += 1;
    }
    // Circular prefix sums over two turns.
    let mut pre = vec![0i64; 2 * nb + 1];
    for i in 0..2 * nb {
        pre[i + 1] = pre[i] + cnt[i % nb];
    }
    let below = ((0.3 * r / bw) as usize).clamp(2, nb / 2);
    let (mut best, mut at) = (i64::MIN, 0);
    for b in 0..nb {
        let on = cnt[b] + cnt[(b + 1) % nb];
        // Bins b - below ..= b - 2, shifted by a turn to stay positive.
        let (lo, hi) = (b + nb - below, b + nb - 1);
        let under = pre[hi] - pre[lo];
        let sc = on - under;
        if sc > best {
            (best, at) = (sc, b);
        }
    }
    (best, (at + 1) as f64 * bw)
}

fn fit_fold(s: &[f64], y: &[f64], a0: f64, r_lo: f64, r_hi: f64) -> Option<Fold> {
    let smin = s.iter().copied().fold(f64::INFINITY, f64::min);
    let smax = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let span = (smax - smin).max(1.0);
    let r_mid = 0.5 * (r_lo + r_hi);
    let wraps = a0 * span / r_mid + 2.0;
    let (mut alo, mut ahi) = (0.7 * a0, 1.3 * a0);
    let (mut rlo, mut rhi) = (r_lo, r_hi);
    let mut w = r_mid / 40.0;
    let w_final = 0.05;
    let (mut ba, mut br, mut bc);
    loop {
        let da = w / (2.0 * span);
        let dr = w / (2.0 * wraps);
        let na = (((ahi - alo) / da).ceil() as usize).clamp(1, 600);
        let nr = (((rhi - rlo) / dr).ceil() as usize).clamp(1, 600);
        let mut best = (i64::MIN, 0.0, 0.0, 0.0);
        for ia in 0..=na {
            let a = alo + (ahi - alo) * ia as f64 / na as f64;
            for ir in 0..=nr {
                let r = rlo + (rhi - rlo) * ir as f64 / nr as f64;
                let (sc, ph) = fold_score(s, y, a, r, w);
                if sc > best.0 {
                    best = (sc, a, r, ph);
                }
            }
        }
        (ba, br, bc) = (best.1, best.2, best.3);
        if w <= w_final {
            break;
        }
        let (sa, sr) = ((ahi - alo) / na as f64, (rhi - rlo) / nr as f64);
        // Anywhere the folded points drift by less than two bins is as
        // good at this width: the next level searches all of it.
        (alo, ahi) = (ba - 5.0 * sa, ba + 5.0 * sa);
        (rlo, rhi) = (br - 5.0 * sr, br + 5.0 * sr);
        w = (w / 2.0).max(w_final);
    }
    // Least squares over the folded points, each with its tooth number:
    // y = a s + c + k r.
    let (mut a, mut r, mut c) = (ba, br, bc);
    let mut tol = w_final;
    let mut tooth: Vec<Option<i64>> = vec![None; s.len()];
    let mut sigma = 0.01;
    for _ in 0..4 {
        for i in 0..s.len() {
            let k = ((y[i] - a * s[i] - c) / r).round();
            let e = y[i] - a * s[i] - c - k * r;
            tooth[i] = (e.abs() < tol).then_some(k as i64);
        }
        // Normal equations for (a, c, r).
        let mut m = [[0.0f64; 3]; 3];
        let mut v = [0.0f64; 3];
        for i in 0..s.len() {
            if let Some(k) = tooth[i] {
                let row = [s[i], 1.0, k as f64];
                for p in 0..3 {
                    for q in 0..3 {
                        m[p][q] += row[p] * row[q];
                    }
                    v[p] += row[p] * y[i];
                }
            }
        }
        let Some(sol) = solve3(m, v) else { break };
        (a, c, r) = (sol[0], sol[1], sol[2]);
        let mut res: Vec<f64> = (0..s.len())
            .filter_map(|i| tooth[i].map(|k| (y[i] - a * s[i] - c - k as f64 * r).abs()))
            .collect();
        sigma = (1.4826 * median(&mut res)).max(0.002);
        tol = (4.0 * sigma).clamp(0.02, 0.1);
    }
    let mut per: std::collections::BTreeMap<i64, usize> = Default::default();
    for k in tooth.iter().flatten() {
        *per.entry(*k).or_default() += 1;
    }
    let teeth = per.values().filter(|&&n| n >= 3).count();
    (a > 0.0 && r > 0.0).then_some(Fold {
        a,
        r,
        c,
        tooth,
        sigma,
        teeth,
    })
}

/// Solve a 3x3 system (Gaussian elimination with pivoting); `None` when it
/// is singular (all points on one tooth: the rotation is not determined).
fn solve3(mut m: [[f64; 3]; 3], mut v: [f64; 3]) -> Option<[f64; 3]> {
    for col in 0..3 {
        let p = (col..3).max_by(|&i, &j| m[i][col].abs().total_cmp(&m[j][col].abs()))?;
        if m[p][col].abs() < 1e-9 * (1.0 + m[col][col].abs()) {
            return None;
        }
        m.swap(col, p);
        v.swap(col, p);
        let pivot = m[col];
        for row in col + 1..3 {
            let f = m[row][col] / pivot[col];
            for (x, p) in m[row].iter_mut().zip(pivot).skip(col) {
                *x -= f * p;
            }
            v[row] -= f * v[col];
        }
    }
    let mut x = [0.0; 3];
    for row in (0..3).rev() {
        let mut acc = v[row];
        for q in row + 1..3 {
            acc -= m[row][q] * x[q];
        }
        x[row] = acc / m[row][row];
    }
    Some(x)
}

/// Extract the parameters from a SKIPPY run: forward (write or read) or
/// backwards reads, told apart by the positions.
///
/// The values come from the longest part of the run, from its start, that
/// follows the sawtooth: a point lies on it, or above it by the switch
/// costs of the boundaries a step of its length crosses. Past a point a
/// long run stops following it (steps span several tracks and cylinders
/// and seek further than the skews cover, the run crosses into a zone with
/// another number of sectors per track, remapped sectors); the steps from
/// there on are left out, and the notes say which steps were used and why
/// the rest was not ([`Skippy::steps_used`]).
pub fn skippy(points: &[Point]) -> Extraction {
    let whole = match fit(points) {
        Ok(f) => f,
        Err(reason) => return Extraction::NoRotation { reason },
    };
    let Some(cut) = whole.cut else {
        return Extraction::Rotational(Box::new(whole.e));
    };
    let last = points.last().map_or(0, |p| p.step);
    let (from, to) = (points[cut.at].step, last);
    match fit(&points[..cut.at]) {
        Ok(part) => {
            let mut e = part.e;
            e.notes.insert(
                0,
                format!(
                    "steps {}-{} used; steps {from}-{to} not: {}",
                    e.steps_used.0, e.steps_used.1, cut.why
                ),
            );
            Extraction::Rotational(Box::new(e))
        }
        Err(why) => {
            // The part that follows the sawtooth does not extract on its
            // own: the whole run's values stand, none of them as fact
            // where the rest of the run may have moved it.
            let mut e = whole.e;
            let why = format!(
                "from step {from} on the run leaves the sawtooth ({}), and the steps before it alone give none ({why})",
                cut.why
            );
            for p in [
                param::ROTATION,
                param::SPT,
                param::MTM,
                param::HEAD,
                param::CYL,
                param::SURFACES,
            ] {
                e.flag(p, why.clone());
            }
            Extraction::Rotational(Box::new(e))
        }
    }
}

/// Where a run stops following the sawtooth, and why.
struct Cut {
    /// The index (into the run's points) of the first point left out.
    at: usize,
    /// For the user.
    why: String,
}

/// One extraction over all of `points`.
struct Fitted {
    e: Skippy,
    /// Where the run stops following the sawtooth, if it does.
    cut: Option<Cut>,
}

/// The extraction proper (the module's steps 1 to 6) over every point,
/// and where the run stops following the sawtooth; `Err` says why it has
/// no rotational signature.
fn fit(points: &[Point]) -> Result<Fitted, String> {
    let no = |r: String| -> Result<Fitted, String> { Err(r) };
    if points.len() < 30 {
        return no(format!("only {} points: need at least 30", points.len()));
    }
    let lat_all: Vec<f64> = points.iter().map(|p| p.latency_ms).collect();
    let lo = lat_all.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = lat_all.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if hi - lo < 0.5 {
        return no(format!(
            "latencies stay within {:.3} ms ({:.3}..{:.3}): no mechanical signature (solid-state, or a cache answers)",
            hi - lo,
            lo,
            hi
        ));
    }
    let backward = points.windows(2).filter(|w| w[1].lba < w[0].lba).count() * 2 > points.len();
    let dir = if backward {
        Direction::Backward
    } else {
        Direction::Forward
    };
    // 1. A cache's flat band.
    let band = cache_band(&lat_all);
    let cache = band.as_ref().map(|(m, l)| CacheSignature {
        answered: m.iter().filter(|&&x| x).count(),
        of: points.len(),
        latency_ms: *l,
    });
    let keep: Vec<usize> = (0..points.len())
        .filter(|&i| band.as_ref().is_none_or(|(m, _)| !m[i]))
        .collect();
    let cache_text = |c: &CacheSignature| {
        format!(
            "{} of {} requests were answered in {:.3} ms with no mechanical delay: a cache answers them (on reads, read-ahead: use write SKIPPY or backwards reads; on writes, a write-back cache: turn it off, e.g. hdparm -W0 or sdparm --clear WCE)",
            c.answered, c.of, c.latency_ms
        )
    };
    if keep.len() < 30 {
        return no(match &cache {
            Some(c) => format!(
                "{}; too few mechanical requests left ({})",
                cache_text(c),
                keep.len()
            ),
            None => format!("only {} points", keep.len()),
        });
    }
    let pts: Vec<Point> = keep.iter().map(|&i| points[i]).collect();
    let s: Vec<f64> = pts.iter().map(|p| p.step as f64).collect();
    // Backwards, the sawtooth is mirrored: fit the negated curve.
    let sign = if backward { -1.0 } else { 1.0 };
    let y: Vec<f64> = pts.iter().map(|p| sign * p.latency_ms).collect();
    // The transition and the first estimates come from the first steps: a
    // long run's later steps, several tracks long, seek and may take longer
    // than a rotation, which no drop of the sawtooth does.
    let head = s.len().min(300);
    let (k, a0, r0) = match coarse(&s[..head], &y[..head]) {
        Ok(x) => x,
        Err(why) => {
            return no(match &cache {
                Some(c) => format!("{why} ({})", cache_text(c)),
                None => why,
            })
        }
    };
    // 2. The joint fit, over a range that holds both coarse estimates.
    // The paper's step-0 estimate, made robust: each of the first steps
    // (up to five, all before the transition) less its own sectors, the
    // median; one that crossed a boundary or met an outlier is outvoted.
    let early: Vec<usize> = (0..pts.len().min(5).min(k))
        .take_while(|&i| keep[i] == i && pts[i].step as usize == i)
        .collect();
    let step0_at = |a: f64| -> Option<f64> {
        let mut v: Vec<f64> = early
            .iter()
            .map(|&i| pts[i].latency_ms - sign * (pts[i].step as f64 + 1.0) * a)
            .collect();
        (v.len() >= 3).then(|| median(&mut v))
    };
    let r_step0 = step0_at(a0);
    let (mut rlo, mut rhi) = (0.85 * r0, 1.15 * r0);
    match r_step0.filter(|r1| (r1 / r0 - 1.0).abs() < 0.3) {
        // Backwards, the teeth after the first jump hold few points that
        // crossed no boundary (every step is most of a track): a rotation
        // short by a skew could fold more. Step 0 (a rotation less a
        // sector, whatever MTM is) bounds the search.
        Some(r1) if backward => (rlo, rhi) = (0.985 * r1, 1.015 * r1),
        Some(r1) => {
            rlo = rlo.min(0.95 * r1);
            rhi = rhi.max(1.05 * r1);
        }
        None => {}
    }
    // The fit uses the steps shorter than ~60% of a track: there most
    // points cross no boundary, so the clean points of L1 and L2 outnumber
    // those that gained a skew (which a rotation short by the skew would
    // fold together). Everything else is judged against the fit.
    let p0 = 0.5 * (rlo + rhi) / a0;
    let reach = (0.6 * p0).max(s[k] + 0.3 * p0);
    // (Never more than the first 400 points: a run whose first estimates
    // put a track further is not a sawtooth the fit can fold, and the
    // search grows with the points.)
    let near_idx: Vec<usize> = (0..s.len()).filter(|&i| s[i] <= reach).collect();
    let (sf, yf): (Vec<f64>, Vec<f64>) = if near_idx.len() >= 20 {
        near_idx.iter().take(400).map(|&i| (s[i], y[i])).unzip()
    } else {
        s.iter().zip(&y).take(400).map(|(&a, &b)| (a, b)).unzip()
    };
    let Some(mut f) = fit_fold(&sf, &yf, a0, rlo, rhi) else {
        return no("no slope and rotation fold the curve onto a sawtooth".into());
    };
    // Every point's tooth, by the fit.
    f.tooth = (0..s.len())
        .map(|i| {
            let t = ((y[i] - f.a * s[i] - f.c) / f.r).round();
            let e = y[i] - f.a * s[i] - f.c - t * f.r;
            (e.abs() < (4.0 * f.sigma).clamp(0.02, 0.1)).then_some(t as i64)
        })
        .collect();
    // Judged over the steps shorter than a track, which cross one boundary
    // at most: about half of them cross none and lie on the sawtooth. (A
    // longer step crosses one or more, and lies above it by their skews.)
    let track = f.r / f.a;
    let short: Vec<usize> = (0..s.len()).filter(|&i| s[i] + 1.0 < track).collect();
    let on = short.iter().filter(|&&i| f.tooth[i].is_some()).count();
    // Half as many points fold by chance on a random phase of width 4 sigma.
    let chance = short.len() as f64 * (8.0 * f.sigma).max(0.1) / f.r;
    if (on as f64) < (0.12 * short.len() as f64).max(10.0).max(4.0 * chance) {
        return no(format!(
            "only {on} of the {} steps shorter than a track ({track:.0} steps) lie on any sawtooth: no rotational signature",
            short.len()
        ));
    }
    let (a, r) = (f.a, f.r);
    let noise = f.sigma;
    // L2: the tooth most points just after the transition lie on.
    let mut near: Vec<i64> = (k..(k + 12).min(s.len()))
        .filter_map(|i| f.tooth[i])
        .collect();
    near.sort_unstable();
    let t2 = mode(&near).unwrap_or(0);
    let b2 = f.c + t2 as f64 * r;
    let l1y = Line {
        slope: a,
        intercept: b2 + r,
    };
    let l2y = Line {
        slope: a,
        intercept: b2,
    };
    // 4. The transition: the last step on L1, the first on L2 from which
    // L2 holds (with timing noise a step or two near it may land either side).
    let near_l2 = |i: usize| {
        let (x, v) = (s[i], y[i]);
        (v - l2y.at(x)).abs() < (v - l1y.at(x)).abs()
    };
    let len = s.len();
    let first_l2 = (1..len)
        .find(|&i| near_l2(i) && (i..(i + 5).min(len)).filter(|&j| near_l2(j)).count() >= 4)
        .unwrap_or(k);
    let look = (first_l2 + 3).min(len - 1);
    let last_l1 = (0..=look)
        .rev()
        .find(|&j| !near_l2(j))
        .unwrap_or(first_l2.saturating_sub(1));
    let stm = pts[first_l2].step;
    let s_mid = (pts[last_l1].step as f64 + pts[first_l2].step as f64) / 2.0;
    let spt = r / a;
    let mtm = if backward {
        // In time while (step + 2) sectors behind the head leave MTM of the
        // rotation: MTM = rotation - (threshold + 2) sectors.
        r - a * (s_mid + 2.0)
    } else {
        a * s_mid
    };
    // 5. Every point's excess over the sawtooth, folded by the rotation.
    let thr = (6.0 * noise).max(0.05);
    let rmod: Vec<f64> = (0..len)
        .map(|i| {
            let e = (y[i] - l2y.at(s[i])).rem_euclid(r);
            if e > r - thr {
                e - r
            } else {
                e
            }
        })
        .collect();
    // Steps are consecutive unless a cached request was set aside.
    let contiguous: Vec<bool> = (0..len)
        .map(|i| i > 0 && keep[i] == keep[i - 1] + 1)
        .collect();
    let mut e = Skippy {
        direction: dir,
        rotation_ms: r,
        rotation_step0_ms: points
            .iter()
            .find(|p| p.step == 0)
            .map_or(f64::NAN, |p| p.latency_ms),
        mtm_ms: mtm,
        stm,
        sectors_per_track: spt,
        head_switch_ms: None,
        cyl_switch_ms: None,
        surfaces: None,
        l1: l1y,
        l2: l2y,
        l3: None,
        l4: None,
        point1: pts[0].step,
        point2: pts[first_l2.saturating_sub(1)].step,
        point3: stm,
        noise_ms: noise,
        cache,
        steps_used: (pts[0].step, pts[len - 1].step),
        uncertain: Vec::new(),
        notes: Vec::new(),
    };
    let (hs, cs, surfaces) = switches(&pts, &rmod, &contiguous, spt, noise, r, &mut e);
    let cut = match cut(&pts, &s, &y, &rmod, spt, hs, cs, (a, r, noise), first_l2) {
        Some(Leaves::At(i, why)) => Some(Cut { at: keep[i], why }),
        Some(Leaves::Early(i, why)) => {
            let why = format!(
                "from step {} on the run leaves the sawtooth, among the steps these values rest on ({why})",
                pts[i].step
            );
            for p in [
                param::ROTATION,
                param::SPT,
                param::MTM,
                param::HEAD,
                param::CYL,
                param::SURFACES,
            ] {
                e.flag(p, why.clone());
            }
            None
        }
        None => None,
    };
    e.head_switch_ms = hs;
    e.cyl_switch_ms = cs;
    e.surfaces = surfaces;
    e.l3 = hs.map(|h| Line {
        slope: a,
        intercept: b2 + h,
    });
    e.l4 = cs.map(|c| Line {
        slope: a,
        intercept: b2 + c,
    });
    if backward {
        // Back to latencies: the mirrored lines.
        let m = |l: Line| Line {
            slope: -l.slope,
            intercept: -l.intercept,
        };
        e.l1 = m(e.l1);
        e.l2 = m(e.l2);
        e.l3 = e.l3.map(|l| Line {
            slope: -a,
            intercept: -b2 - r + (l.intercept - b2),
        });
        e.l4 = e.l4.map(|l| Line {
            slope: -a,
            intercept: -b2 - r + (l.intercept - b2),
        });
    }
    // 3. The cross-check against step 0.
    match step0_at(a) {
        Some(r1) if r1.is_finite() => {
            let d = (r1 / r - 1.0) * 100.0;
            if d.abs() > 1.0 {
                let why = format!(
                    "the sawtooth's height ({r:.3} ms) and the first steps' latencies less their sectors ({r1:.3} ms) disagree by {d:+.1}%"
                );
                e.flag(param::ROTATION, why.clone());
                e.flag(param::SPT, why);
            }
        }
        _ if e.cache.is_some() || backward => {
            let why = if backward {
                "no first steps to cross-check against: a backwards rotation rests on them"
            } else {
                "a cache answered the first requests: nothing to cross-check the rotation against, and the sawtooth may be the cache's write-back or read-ahead timing"
            };
            e.flag(param::ROTATION, why);
            e.flag(param::SPT, why);
        }
        _ => e
            .notes
            .push("no first steps to cross-check the rotation against".into()),
    }
    if f.teeth < 2 {
        let why = "one tooth of the sawtooth only: its height rests on the grid search";
        e.flag(param::ROTATION, why);
        e.flag(param::SPT, why);
    }
    // MTM is the slope times the transition's step, the switch times are
    // excesses over the sawtooth, and the surfaces are counted from the
    // boundaries those excesses place: a slope in doubt puts them all in
    // doubt.
    if let Some(why) = e.uncertain(param::SPT).map(str::to_string) {
        let why = format!("measured against a sawtooth whose slope is uncertain ({why})");
        e.flag(param::MTM, why.clone());
        if e.head_switch_ms.is_some() {
            e.flag(param::HEAD, why.clone());
        }
        if e.cyl_switch_ms.is_some() {
            e.flag(param::CYL, why.clone());
        }
        if e.surfaces.is_some() {
            e.flag(param::SURFACES, why);
        }
    }
    if !backward && s_mid < 3.0 {
        e.flag(
            param::MTM,
            format!(
                "no request before step {} missed its sector: MTM is under {:.3} ms, or read-ahead or a write cache served the first requests",
                pts[first_l2].step,
                a * (s_mid + 1.0)
            ),
        );
    }
    if let Some(c) = &e.cache {
        let why = format!("{} (these values may be the cache's)", cache_text(c));
        e.notes.push(cache_text(c));
        for p in [param::MTM, param::HEAD, param::CYL, param::SURFACES] {
            e.flag(p, why.clone());
        }
    }
    if !backward && a * stm as f64 > 0.9 * r {
        e.flag(
            param::MTM,
            "no early request missed its sector: read-ahead or a write cache served them (use write SKIPPY with the write cache off, or backwards reads)",
        );
    }
    if backward {
        e.notes.push("backwards reads: the rotation was searched within 1.5% of the first steps' latencies plus their sectors".into());
        e.flag(
            param::MTM,
            "backwards, the time between requests includes whatever the drive does in it (stopping a read-ahead, moving back to the track)",
        );
        for p in [param::HEAD, param::CYL, param::SURFACES] {
            e.flag(
                p,
                "backwards, a boundary costs what the skew leaves of a revolution, or a missed one, not the skew: use write SKIPPY for the switch times",
            );
        }
    }
    e.check_plausible();
    Ok(Fitted { e, cut })
}

/// Points a window of the run holds; where fewer than half of a window's
/// points follow the sawtooth, the run has stopped following it.
const WINDOW: usize = 20;

/// How far each point lies from where the sawtooth and the switch costs
/// put it (signed, ms), if it lies within `tol` of it: on the sawtooth, or
/// above it (modulo the rotation) by the skews of the head and cylinder
/// boundaries that a step of its length can cross; `None` for a point that
/// lies nowhere the model puts it.
fn follows(
    pts: &[Point],
    rmod: &[f64],
    spt: f64,
    h: Option<f64>,
    c: Option<f64>,
    r: f64,
    tol: f64,
) -> Vec<Option<f64>> {
    let off = |x: f64, want: f64| {
        let d = (x - want).rem_euclid(r);
        if d > r / 2.0 {
            d - r
        } else {
            d
        }
    };
    (0..pts.len())
        .map(|i| {
            if rmod[i].abs() < tol {
                return Some(rmod[i]);
            }
            let h = h?;
            let span = pts[i].step as f64 + 1.0;
            let n_lo = (span / spt).floor() as u32;
            let n_hi = (span / (0.85 * spt)).floor() as u32 + 1;
            (n_lo.max(1)..=n_hi)
                .flat_map(|n| {
                    let cyls = if c.is_some() { n.min(2) } else { 0 };
                    (0..=cyls).map(move |m| (n - m) as f64 * h + m as f64 * c.unwrap_or(0.0))
                })
                .map(|want| off(rmod[i], want))
                .filter(|d| d.abs() < tol)
                .min_by(|x, y| x.abs().total_cmp(&y.abs()))
        })
        .collect()
}

/// Whether the points of `s[i0..i1]` that follow the model drift away
/// from it: the slope of their offsets against the step, when it is over
/// 0.4% of the sawtooth's slope `a` and four times its own standard error
/// (a slope the model's is short of: another zone's).
fn drifts(s: &[f64], off: &[Option<f64>], a: f64, (i0, i1): (usize, usize)) -> bool {
    let p: Vec<(f64, f64)> = (i0..i1).filter_map(|i| off[i].map(|o| (s[i], o))).collect();
    if p.len() < WINDOW {
        return false;
    }
    let n = p.len() as f64;
    let mx = p.iter().map(|q| q.0).sum::<f64>() / n;
    let my = p.iter().map(|q| q.1).sum::<f64>() / n;
    let sxx: f64 = p.iter().map(|q| (q.0 - mx).powi(2)).sum();
    let sxy: f64 = p.iter().map(|q| (q.0 - mx) * (q.1 - my)).sum();
    if sxx <= 0.0 {
        return false;
    }
    let slope = sxy / sxx;
    let rss: f64 = p
        .iter()
        .map(|q| (q.1 - my - slope * (q.0 - mx)).powi(2))
        .sum();
    let se = (rss / (n - 2.0) / sxx).sqrt();
    slope.abs() > (0.004 * a).max(4.0 * se)
}

/// Where a run stops following the sawtooth.
enum Leaves {
    /// At this point (an index into the points fitted), past the steps the
    /// values rest on: the points from there on are left out.
    At(usize, String),
    /// At this point, among the steps the values rest on: they are in
    /// doubt.
    Early(usize, String),
}

/// Where the run stops following the sawtooth, if it does before its end,
/// and why: where most of a window's points stop lying where the sawtooth
/// and the switch costs put them, or where the sawtooth's period changes
/// (a zone boundary).
#[allow(clippy::too_many_arguments)]
fn cut(
    pts: &[Point],
    s: &[f64],
    y: &[f64],
    rmod: &[f64],
    spt: f64,
    h: Option<f64>,
    c: Option<f64>,
    (a, r, noise): (f64, f64, f64),
    first_l2: usize,
) -> Option<Leaves> {
    let tol = (4.0 * noise).max(0.06);
    let off = follows(pts, rmod, spt, h, c, r, tol);
    let ok: Vec<bool> = off.iter().map(Option::is_some).collect();
    let n = ok.len();
    if n < WINDOW {
        return None;
    }
    // The values rest on the transition and a window or two past it.
    let floor = first_l2 + 2 * WINDOW;
    // Where most of a window's points stop lying where the model puts
    // them; the window may be cut short by the run's end. The last point
    // that still did may be the one that met what changed, landing there
    // by chance: it is left out too.
    let leaves = (0..n.saturating_sub(WINDOW / 2))
        .find(|&i| {
            let w = &ok[i..(i + WINDOW).min(n)];
            w.iter().filter(|&&x| x).count() * 2 < w.len()
        })
        .and_then(|bad| (bad..(bad + WINDOW).min(n)).find(|&i| !ok[i]))
        .map(|at| at.saturating_sub(1));
    // Past a zone boundary points can go on lying where the model puts
    // them for dozens of steps, by a wrong count of head and cylinder
    // boundaries (their skews differ by what the new slope adds over that
    // many steps), but drifting from it by the difference of the slopes:
    // the run is cut at the first window whose points drift. (A run that
    // starts in one zone and goes on in the next before the values' steps
    // end drifts in its first window: the fit took the next zone's slope.)
    let drift = (0..n.saturating_sub(DRIFT_WINDOW - 1))
        .step_by(DRIFT_WINDOW / 3)
        .chain(std::iter::once(n.saturating_sub(DRIFT_WINDOW)))
        .find(|&i| drifts(s, &off, a, (i, (i + DRIFT_WINDOW).min(n))))
        .filter(|&i| leaves.is_none_or(|l| i < l));
    if let Some(i) = drift {
        let why = "from there on the points drift off the sawtooth, as another zone's slope makes them: the run crossed a zone boundary, whose other side's values are not mixed in".to_string();
        return Some(if i == 0 {
            Leaves::Early(
                0,
                "its first steps drift off the sawtooth that the rest fits: the run starts near a zone boundary".into(),
            )
        } else if i.saturating_sub(1) < floor {
            Leaves::Early(i - 1, why)
        } else {
            Leaves::At(i - 1, why)
        });
    }
    let at = leaves?;
    let to = (at + ZONE_WINDOW).min(n);
    let (at, why) = match period(&s[at..to], &y[at..to], a, r, noise)
        .filter(|other| ((other - spt) / spt).abs() > 0.01)
    {
        Some(other) => (
            zone_start(s, y, at, r / other, r, tol),
            format!(
                "from there on the sawtooth's period is {other:.1} sectors, not {spt:.1}: the run crossed into another zone, whose values are not mixed in"
            ),
        ),
        None => (
            at,
            "from there on fewer than half of the points lie where the sawtooth and the switch costs put them (steps that long cross several tracks and cylinders and seek further than the skews cover; a zone boundary or remapped sectors do the same)".to_string(),
        ),
    };
    Some(if at < floor {
        Leaves::Early(at, why)
    } else {
        Leaves::At(at, why)
    })
}

/// Where the zone that the points from `at` on are in begins (the index
/// of the last point left out of the zone before it). Past a boundary,
/// points can go on lying where the old zone's model puts them for dozens
/// of steps, by a wrong count of head and cylinder boundaries (their
/// skews differ by what the new slope adds over that many steps); with
/// the new slope `a2` they fold onto the phases that the points just
/// after `at` share. Walking back from `at`, the zone begins after the
/// first two points in a row that do not; the point before that, which
/// went from a sector of one zone to a sector of the other, is left out
/// with it.
fn zone_start(s: &[f64], y: &[f64], at: usize, a2: f64, r: f64, tol: f64) -> usize {
    let phase = |i: usize| (y[i] - a2 * s[i]).rem_euclid(r);
    let to = (at + WINDOW).min(s.len());
    let shared: Vec<f64> = (at..to).map(phase).collect();
    let fits = |i: usize| {
        let p = phase(i);
        shared.iter().filter(|&&q| circ(p, q, r) < tol).count() >= 2
    };
    let mut b = at;
    while b >= 2 && (fits(b - 1) || fits(b - 2)) {
        b -= 1;
    }
    b.saturating_sub(1)
}

/// Points over which [`cut`] measures the sawtooth's period.
const ZONE_WINDOW: usize = 120;

/// Points over which [`cut`] watches for a drift off the sawtooth.
const DRIFT_WINDOW: usize = 60;

/// The sawtooth's period (sectors per track) over the points given, with
/// the rotation `r` held: the slope that folds most of them onto a few
/// phases (steps of a similar length cross the same number of boundaries,
/// so they share a phase), searched within 20% of `a`. `None` when no
/// slope folds an eighth of them, or none folds clearly more than `a`
/// does.
fn period(s: &[f64], y: &[f64], a: f64, r: f64, noise: f64) -> Option<f64> {
    if s.len() < WINDOW {
        return None;
    }
    let w = (4.0 * noise).max(0.04);
    let span = (s[s.len() - 1] - s[0]).max(1.0);
    let da = w / (4.0 * span);
    let steps = ((0.4 * a / da).ceil() as usize).clamp(1, 4000);
    let (mut best, mut at) = (i64::MIN, a);
    for i in 0..=steps {
        let x = 0.8 * a + 0.4 * a * i as f64 / steps as f64;
        let (sc, _) = fold_score(s, y, x, r, w);
        if sc > best {
            (best, at) = (sc, x);
        }
    }
    let (here, _) = fold_score(s, y, a, r, w);
    // Steps of a window cross a few different numbers of boundaries, so
    // even the right slope folds only a share of them onto one phase;
    // a wrong one spreads them all.
    let strong = best as f64 >= (s.len() as f64 / 8.0).max(10.0);
    let clearly = best as f64 >= 2.5 * here.max(2) as f64;
    (strong && clearly).then_some(r / at)
}

/// The most common value of a sorted slice.
fn mode(v: &[i64]) -> Option<i64> {
    let mut best: Option<(usize, i64)> = None;
    let mut i = 0;
    while i < v.len() {
        let j = (i..v.len()).find(|&j| v[j] != v[i]).unwrap_or(v.len());
        if best.is_none_or(|(n, _)| j - i > n) {
            best = Some((j - i, v[i]));
        }
        i = j;
    }
    best.map(|b| b.1)
}

/// How many head and cylinder boundaries a step crossed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Crossed {
    heads: u32,
    cyls: u32,
}

/// Head and cylinder switch (skew) costs and the number of surfaces (see
/// the module's step 5).
fn switches(
    pts: &[Point],
    rmod: &[f64],
    contiguous: &[bool],
    spt: f64,
    noise: f64,
    r: f64,
    e: &mut Skippy,
) -> (Option<f64>, Option<f64>, Option<u32>) {
    let thr = (6.0 * noise).max(0.05);
    let gap = (4.0 * noise).max(0.08);
    let tol = (4.0 * noise).max(0.06);
    let span = |i: usize| pts[i].step as f64 + 1.0;
    // Steps shorter than (most of) a track cross one boundary at most.
    let singles: Vec<(f64, usize)> = (1..pts.len())
        .filter(|&i| span(i) < 0.8 * spt && rmod[i] > thr && rmod[i] < r - thr)
        .map(|i| (rmod[i], i))
        .collect();
    let mut cl = clusters(singles, gap);
    cl.sort_by_key(|c| std::cmp::Reverse(c.len()));
    let big: Vec<&Vec<(f64, usize)>> = cl.iter().filter(|c| c.len() >= 2).collect();
    // Each value with the standard error of its median.
    let (h, c) = match big.as_slice() {
        [] => {
            e.notes
                .push("no track switches seen: run more steps".into());
            return (None, None, None);
        }
        [a] if a.len() < 3 => {
            e.notes
                .push("no track switches seen: run more steps".into());
            return (None, None, None);
        }
        [a, rest @ ..] => {
            let ha = (center(a), center_se(a));
            // The other kind: the biggest other cluster; when both are
            // about as common (two surfaces), the cylinder switch is the
            // longer.
            let other = rest.iter().find(|x| (center(x) - ha.0).abs() > tol);
            match other {
                Some(b) if b.len() * 3 >= a.len() * 2 => {
                    let hb = (center(b), center_se(b));
                    if hb.0 < ha.0 {
                        (hb, Some(ha))
                    } else {
                        (ha, Some(hb))
                    }
                }
                Some(b) => (ha, Some((center(b), center_se(b)))),
                None => (ha, None),
            }
        }
    };
    // A value the timing noise leaves uncertain by more than 5% is said to
    // be: the standard error of the median of the boundaries seen,
    // combined with how well the sawtooth's line under them is placed
    // (about half the timing noise).
    let imprecise = |(v, se): (f64, f64), what: &str| {
        let se = se.hypot(0.5 * noise);
        (se > 0.05 * v).then(|| {
            format!(
                "the {what} is known to +-{se:.3} ms only (the spread of the boundaries seen, and the timing noise under them): run more steps, or on a quieter host"
            )
        })
    };
    if let Some(why) = imprecise(h, "head switch") {
        e.flag(param::HEAD, why);
    }
    let h = h.0;
    // Longer steps: a cylinder switch among head switches. A step that
    // some number of head switches explains says nothing about it.
    let c = c.or_else(|| {
        let mut v = Vec::new();
        for (i, &ex) in rmod.iter().enumerate().skip(1) {
            let (n_lo, n_hi) = if span(i) < 0.8 * spt {
                (1u32, 1u32)
            } else {
                (
                    (span(i) / spt).floor().max(1.0) as u32,
                    ((span(i) / (0.85 * spt)).floor() as u32 + 1).min(4),
                )
            };
            if ex.abs() <= thr || (0..=n_hi).any(|n| circ(ex, n as f64 * h, r) < tol) {
                continue;
            }
            for n in n_lo..=n_hi {
                v.push(((ex - (n as f64 - 1.0) * h).rem_euclid(r), i));
            }
        }
        let mut cm = clusters(v, gap);
        cm.retain(|x| {
            let m = center(x);
            circ(m, h, r) > tol && circ(m, 0.0, r) > tol
        });
        cm.sort_by_key(|x| std::cmp::Reverse(x.len()));
        cm.first()
            .filter(|x| x.len() >= 2)
            .map(|x| (center(x), center_se(x)))
    });
    let Some(c) = c else {
        e.notes.push(
            "only one kind of switch seen: reported as the head switch (run more steps to see cylinder switches)"
                .into(),
        );
        return (Some(h), None, None);
    };
    if let Some(why) = imprecise(c, "cylinder switch") {
        e.flag(param::CYL, why);
    }
    let c = c.0;
    if c < h {
        e.flag(
            param::CYL,
            format!("the cylinder switch ({c:.3} ms) is shorter than the head switch ({h:.3} ms): the two may be swapped"),
        );
    }
    // Decode every step into the boundaries it crossed.
    let decode = |i: usize| -> Option<Crossed> {
        let sp = span(i);
        let (n_lo, n_hi) = if sp < 0.8 * spt {
            (0u32, 1u32)
        } else {
            (
                (sp / spt).floor().max(1.0) as u32,
                (sp / (0.85 * spt)).floor() as u32 + 1,
            )
        };
        let mut found = None;
        for n in n_lo..=n_hi {
            for cyls in 0..=n.min(1) {
                let heads = n - cyls;
                let want = (heads as f64 * h + cyls as f64 * c).rem_euclid(r);
                if circ(rmod[i], want, r) < tol {
                    if found.is_some() {
                        return None; // ambiguous
                    }
                    found = Some(Crossed { heads, cyls });
                }
            }
        }
        found
    };
    let dec: Vec<Option<Crossed>> = (0..pts.len())
        .map(|i| if i == 0 { None } else { decode(i) })
        .collect();
    // Count head boundaries between consecutive cylinder boundaries.
    let mut ranges: Vec<(u32, u32)> = Vec::new();
    let mut last_c: Option<u32> = None; // head boundaries in that step
    let mut acc = 0u32;
    for i in 1..pts.len() {
        let Some(d) = dec[i].filter(|_| contiguous[i]) else {
            last_c = None;
            continue;
        };
        if d.cyls >= 1 {
            if let Some(hl) = last_c {
                ranges.push((acc + 1, acc + hl + d.heads + 1));
            }
            last_c = Some(d.heads);
            acc = 0;
        } else {
            acc += d.heads;
        }
    }
    let surfaces = if ranges.is_empty() {
        e.notes.push(
            "no two cylinder boundaries seen with every step between them decoded: surfaces not counted (run more steps)".into(),
        );
        None
    } else {
        let lo = ranges.iter().map(|x| x.0).max().unwrap_or(0);
        let hi = ranges.iter().map(|x| x.1).min().unwrap_or(0);
        let agreeing = ranges.iter().filter(|x| x.0 == lo && x.1 == lo).count();
        if lo == hi && lo == 1 {
            // One track per cylinder, yet head switches were seen.
            e.flag(
                param::SURFACES,
                "one surface counted, but head switches were seen: the cylinder boundaries were misread",
            );
            Some(lo)
        } else if lo == hi && agreeing < 2 {
            e.flag(
                param::SURFACES,
                format!("{lo} counted in {agreeing} cylinder only: run more steps to confirm it"),
            );
            Some(lo)
        } else if lo == hi {
            Some(lo)
        } else {
            // The most common exact count, flagged.
            let mut exact: Vec<i64> = ranges
                .iter()
                .filter(|x| x.0 == x.1)
                .map(|x| x.0 as i64)
                .collect();
            exact.sort_unstable();
            let guess = mode(&exact).map_or(lo.min(hi), |m| m as u32);
            let why = if lo > hi {
                format!(
                    "cylinders counted {} tracks: no single count fits every one",
                    ranges
                        .iter()
                        .map(|x| if x.0 == x.1 {
                            x.0.to_string()
                        } else {
                            format!("{}..{}", x.0, x.1)
                        })
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            } else {
                format!("the boundaries seen allow {lo} to {hi} tracks per cylinder")
            };
            e.flag(param::SURFACES, why);
            Some(guess)
        }
    };
    if surfaces.is_none() || e.uncertain(param::SURFACES).is_some() {
        e.flag(
            param::CYL,
            "no regular pattern of cylinder boundaries confirms it (the surfaces could not be counted)",
        );
    }
    (Some(h), Some(c), surfaces)
}

/// A fit of bandwidth against location.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Fit {
    /// y = a * x^2 + b, or y = a * x + b.
    pub a: f64,
    /// The constant term.
    pub b: f64,
    /// Root mean square error against the data (MB/s).
    pub rms: f64,
}

/// The paper's four zone models.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct ZoneFits {
    /// Least squares y = a * x + b.
    pub linear: Fit,
    /// Least squares y = a * x^2 + b.
    pub quadratic: Fit,
    /// The line through the first and last points only.
    pub linear_two_point: Fit,
    /// The parabola y = a * x^2 + b through the first and last points only.
    pub quadratic_two_point: Fit,
    /// Bandwidth of the first (outermost) region, MB/s.
    pub outer_mbps: f64,
    /// Bandwidth of the last (innermost) region, MB/s.
    pub inner_mbps: f64,
}

fn rms(p: &[(f64, f64)], f: impl Fn(f64) -> f64) -> f64 {
    (p.iter().map(|&(x, y)| (y - f(x)).powi(2)).sum::<f64>() / p.len() as f64).sqrt()
}

/// Least-squares y = a*u + b.
fn ls(p: &[(f64, f64)], u: impl Fn(f64) -> f64) -> (f64, f64) {
    let n = p.len() as f64;
    let (mut su, mut sy, mut suu, mut suy) = (0.0, 0.0, 0.0, 0.0);
    for &(x, y) in p {
        let v = u(x);
        su += v;
        sy += y;
        suu += v * v;
        suy += v * y;
    }
    let d = n * suu - su * su;
    if d.abs() < 1e-12 {
        return (0.0, sy / n);
    }
    let a = (n * suy - su * sy) / d;
    (a, (sy - a * su) / n)
}

/// Fit ZONED's profile; x is the location in GB (10^9 bytes).
pub fn zone_fits(z: &[ZonePoint]) -> Option<ZoneFits> {
    if z.len() < 3 {
        return None;
    }
    let p: Vec<(f64, f64)> = z.iter().map(|q| (q.offset as f64 / 1e9, q.mbps)).collect();
    let (la, lb) = ls(&p, |x| x);
    let (qa, qb) = ls(&p, |x| x * x);
    let (x0, y0) = p[0];
    let (x1, y1) = p[p.len() - 1];
    let l2a = (y1 - y0) / (x1 - x0);
    let l2b = y0 - l2a * x0;
    let q2a = (y1 - y0) / (x1 * x1 - x0 * x0);
    let q2b = y0 - q2a * x0 * x0;
    let linear = |a: f64, b: f64| Fit {
        a,
        b,
        rms: rms(&p, |x| a * x + b),
    };
    let quadratic = |a: f64, b: f64| Fit {
        a,
        b,
        rms: rms(&p, |x| a * x * x + b),
    };
    Some(ZoneFits {
        linear: linear(la, lb),
        quadratic: quadratic(qa, qb),
        linear_two_point: linear(l2a, l2b),
        quadratic_two_point: quadratic(q2a, q2b),
        outer_mbps: y0,
        inner_mbps: y1,
    })
}

/// Whether a probe's second request was in time (it lies on L2: `true`)
/// or missed its sector (on L1: `false`); `None` for a probe that is on
/// neither, having crossed a track boundary (it gained the skew) or met an
/// outlier: such a probe says nothing about MTM.
pub fn probe_made_it(e: &Skippy, p: &Point) -> Option<bool> {
    let tol = (4.0 * e.noise_ms).max(0.1);
    let x = p.step as f64;
    let made = (p.latency_ms - e.l2.at(x)).abs() < tol;
    let missed = (p.latency_ms - e.l1.at(x)).abs() < tol;
    (made != missed).then_some(made)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Write SKIPPY on a published drive model at a start, seed and noise.
    fn published(name: &str, seed: u64, noise: f64, start: u64) -> (crate::sim::Spec, Skippy) {
        let mut spec = crate::sim::preset_named(name).unwrap();
        spec.seed = seed;
        spec.noise_ms = noise;
        spec.timing_noise_ms = noise;
        let mut d = crate::sim::Disk::new(spec.clone());
        let o = crate::skippy::SkippyOpts {
            start,
            budget_ms: Some(1300.0),
            ..Default::default()
        };
        let pts = crate::skippy::run(&mut d, &o).unwrap();
        (spec, rotational(skippy(&pts)))
    }

    #[test]
    fn a_skew_of_half_a_rotation_does_not_hide_the_transition() {
        // The Cheetah 9LP's track skew is 97 sectors of 209: every other
        // step past the transition crossed a boundary and sits 2.8 ms up,
        // splitting the drop over three steps. Read as a later drop, it
        // gave MTM 4.77 ms.
        let start = 10_176_618;
        let (spec, e) = published("ds-st39102lw", 1, 0.03, start);
        let mtm = spec.overhead_for(crate::Op::Write);
        assert!((e.mtm_ms - mtm).abs() < 0.1, "{e:?}");
        let spt = spec.zone_at(start).spt as f64;
        assert!((e.sectors_per_track - spt).abs() < 0.02 * spt, "{e:?}");
        assert!(e.uncertain.is_empty(), "{:?}", e.uncertain);
    }

    #[test]
    fn a_skew_cost_close_to_the_timing_noise_is_flagged() {
        // The ST41601N's track skew is 2 sectors (0.36 ms here), under ten
        // times the host's timing noise: 5% of it cannot be promised.
        let (_, e) = published("ds-st41601n", 2, 0.05, 2_472_039);
        let why = e.uncertain(param::HEAD).expect("flagged");
        assert!(why.contains("known to"), "{why}");
    }

    #[test]
    fn a_flat_curve_has_no_rotation() {
        let pts: Vec<Point> = (0..200)
            .map(|i| Point {
                step: i,
                lba: i as u64,
                latency_ms: 0.08 + 0.001 * ((i * 7919) % 13) as f64,
            })
            .collect();
        assert!(matches!(skippy(&pts), Extraction::NoRotation { .. }));
    }

    /// A forward SKIPPY sawtooth without boundaries: rotation `r`, `spt`
    /// sectors per track, overhead `mtm`; `f` may change each point.
    fn sawtooth(r: f64, spt: f64, mtm: f64, n: u32, f: impl Fn(u32, f64) -> f64) -> Vec<Point> {
        let a = r / spt;
        (0..n)
            .map(|s| {
                let wait = (s as f64 * a - mtm).rem_euclid(r);
                Point {
                    step: s,
                    lba: crate::trace::skippy_lba(s),
                    latency_ms: f(s, mtm + wait + a),
                }
            })
            .collect()
    }

    fn rotational(ex: Extraction) -> Skippy {
        match ex {
            Extraction::Rotational(e) => *e,
            Extraction::NoRotation { reason } => panic!("{reason}"),
        }
    }

    #[test]
    fn a_clean_sawtooth_is_measured_exactly() {
        let e = rotational(skippy(&sawtooth(8.333, 184.0, 2.1, 300, |_, y| y)));
        assert!((e.rotation_ms - 8.333).abs() < 1e-3, "{e:?}");
        assert!((e.sectors_per_track - 184.0).abs() < 0.05, "{e:?}");
        assert!((e.mtm_ms - 2.1).abs() < 0.05, "{e:?}");
        assert!(e.uncertain.is_empty(), "{:?}", e.uncertain);
    }

    #[test]
    fn a_drop_split_over_two_steps_is_still_a_sawtooth() {
        // The first step after the transition lands half-way down (what a
        // boundary's skew or a slow request can do to it).
        let pts = sawtooth(
            8.333,
            184.0,
            2.1,
            300,
            |s, y| if s == 47 { y + 4.0 } else { y },
        );
        let e = rotational(skippy(&pts));
        assert!((e.rotation_ms - 8.333).abs() < 0.01, "{e:?}");
        // And the next tooth's drop split too.
        let pts = sawtooth(11.0, 72.0, 3.0, 200, |s, y| {
            if s == 20 || s == 92 {
                y + 5.0
            } else {
                y
            }
        });
        let e = rotational(skippy(&pts));
        assert!((e.rotation_ms - 11.0).abs() < 0.02, "{e:?}");
    }

    #[test]
    fn impossible_values_are_flagged_never_printed_as_fact() {
        let e = rotational(skippy(&sawtooth(8.333, 184.0, 2.1, 300, |_, y| y)));
        let mut m = e.clone();
        m.mtm_ms = 9.0;
        m.check_plausible();
        assert!(m.uncertain(param::MTM).unwrap().contains("impossible"));
        let mut m = e.clone();
        m.rotation_ms = 11_119.0;
        m.check_plausible();
        assert!(m.uncertain(param::ROTATION).unwrap().contains("unit"));
        assert!(m.uncertain(param::SPT).is_some());
        let mut m = e.clone();
        m.surfaces = Some(100);
        m.head_switch_ms = Some(9.0);
        m.check_plausible();
        assert!(m.uncertain(param::SURFACES).is_some() && m.uncertain(param::HEAD).is_some());
        // Flagging twice keeps one entry per parameter.
        m.check_plausible();
        assert_eq!(
            m.uncertain
                .iter()
                .filter(|u| u.param == param::HEAD)
                .count(),
            1
        );
    }

    #[test]
    fn a_curve_whose_early_requests_never_miss_flags_mtm() {
        // Read-ahead: the first requests are answered as the drive reads
        // on, so the curve starts on L2 and its first drop is a whole
        // tooth later. Whatever MTM that gives is not printed as fact.
        let pts = sawtooth(8.333, 184.0, 0.0, 300, |s, y| if s < 8 { 0.2 } else { y });
        match skippy(&pts) {
            Extraction::Rotational(e) => {
                assert!(e.uncertain(param::MTM).is_some(), "{e:?}");
            }
            Extraction::NoRotation { .. } => {}
        }
    }

    #[test]
    fn a_run_into_the_next_zone_keeps_to_the_first() {
        // The published HP C2247A model, 700 steps from 300 steps before
        // the end of its first zone (96 sectors per track; 92 after). The
        // values come from the first zone's steps, and the note says where
        // the run was cut and why.
        let mut spec = crate::sim::preset_named("ds-hp-c2247a").unwrap().quiet();
        spec.seed = 1;
        let (first, len) = spec.zone_range(0);
        let boundary = first + len;
        let start = boundary - crate::trace::skippy_lba(300) - 1;
        let mut d = crate::sim::Disk::new(spec.clone());
        let o = crate::skippy::SkippyOpts {
            start,
            steps: 700,
            budget_ms: None,
            ..Default::default()
        };
        let pts = crate::skippy::run(&mut d, &o).unwrap();
        let e = rotational(skippy(&pts));
        let crossing = pts.iter().position(|p| p.lba >= boundary).unwrap() as u32;
        assert!(
            e.steps_used.1 < crossing,
            "{:?} {crossing} {:?}",
            e.steps_used,
            e.notes
        );
        assert!(e.notes[0].contains("zone"), "{:?}", e.notes);
        let spt = spec.zones[0].spt as f64;
        assert!(
            e.uncertain(param::SPT).is_some() || (e.sectors_per_track - spt).abs() < 0.02 * spt,
            "{e:?}"
        );
    }

    #[test]
    fn a_long_run_inside_one_zone_is_used_whole() {
        // 900 steps: the last ones span five tracks and cross a cylinder
        // boundary each; they still lie where the skews put them.
        let spec = crate::sim::preset_named("ds-st32171w").unwrap().quiet();
        let mut d = crate::sim::Disk::new(spec.clone());
        let o = crate::skippy::SkippyOpts {
            start: 100_000,
            steps: 900,
            budget_ms: None,
            ..Default::default()
        };
        let pts = crate::skippy::run(&mut d, &o).unwrap();
        let e = rotational(skippy(&pts));
        assert_eq!(e.steps_used, (0, 899), "{:?}", e.notes);
        assert!((e.sectors_per_track - 186.0).abs() < 0.5, "{e:?}");
        assert!(e.uncertain(param::ROTATION).is_none(), "{e:?}");
    }

    #[test]
    fn zone_fits_prefer_the_parabola_for_a_parabola() {
        let z: Vec<ZonePoint> = (0..50)
            .map(|i| {
                let x = i as f64 * 0.1;
                ZonePoint {
                    offset: (x * 1e9) as u64,
                    mbps: 10.0 - 0.15 * x * x,
                }
            })
            .collect();
        let f = zone_fits(&z).unwrap();
        assert!(f.quadratic.rms < 1e-9);
        assert!(f.linear.rms > 0.05);
        assert!(f.quadratic_two_point.rms < f.linear_two_point.rms);
    }
}
