//! Parameters from the curves (the paper's section 4.1.2, automated).
//!
//! SKIPPY's latency-against-step curve is a sawtooth of parallel lines:
//! before the transition at STM every access waits an extra rotation (L1),
//! after it none does (L2); accesses that cross a track boundary sit above
//! L2 by the head switch (L3) or the cylinder switch (L4). The extraction:
//!
//! 1. the common slope by Theil-Sen (median of pairwise slopes, pairs far
//!    apart), robust to the switch spikes and to outliers;
//! 2. the transition: the largest drop of the curve, refined by classifying
//!    each point as nearer L1 or L2;
//! 3. the L1 and L2 offsets as medians of the residuals (the lowest third
//!    for L2, so spikes do not pull it); rotation = L1 - L2 (and, the paper's
//!    other way, the latency at step 0); sectors per track = rotation/slope;
//! 4. MTM from the transition step (half a step is the resolution: the
//!    estimate is the middle of the step);
//! 5. the spikes above L2: clustered by gaps; the two biggest clusters are
//!    L3 and L4 (the lower one the head switch); outliers stay in small
//!    clusters and are ignored;
//! 6. surfaces: the track boundaries are located exactly (the boundary phase
//!    that agrees best with where spikes did and did not occur), so the
//!    number of tracks between two cylinder switches is counted, not guessed.
//!
//! A curve without a big drop, or whose two sides are not parallel lines,
//! has no rotational signature (flash, or a write cache): then nothing is
//! invented.

use serde::Serialize;

use crate::bench::{Point, ZonePoint};

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

/// What SKIPPY's curve says.
#[derive(Debug, Clone, Serialize)]
pub struct Skippy {
    /// L1 - L2 (the height of the sawtooth).
    pub rotation_ms: f64,
    /// The paper's other estimate: the latency at step 0.
    pub rotation_step0_ms: f64,
    /// MTM: the shortest time from one access to the next that lets the
    /// next catch its sector without waiting a rotation (host, bus and
    /// controller overhead), ms.
    pub mtm_ms: f64,
    /// STM: the first step (sectors) whose access is in time, where the
    /// curve drops from L1 to L2.
    pub stm: u32,
    /// Rotation over the slope: how many sectors pass under the head per
    /// rotation (in the zone measured).
    pub sectors_per_track: f64,
    /// L3 - L2.
    pub head_switch_ms: Option<f64>,
    /// L4 - L2.
    pub cyl_switch_ms: Option<f64>,
    /// Surfaces (tracks per cylinder): the number of track boundaries
    /// between two cylinder switches, when both switches were seen.
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
    /// Robust noise estimate around L2 (ms).
    pub noise_ms: f64,
    /// What the extraction could not separate or did in another way, for
    /// the reader of the results.
    pub notes: Vec<String>,
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

fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Theil-Sen slope over pairs at least `gap` apart in x.
fn theil_sen(pts: &[(f64, f64)], gap: f64) -> Option<f64> {
    let mut s = Vec::new();
    for i in 0..pts.len() {
        for j in i + 1..pts.len() {
            let dx = pts[j].0 - pts[i].0;
            if dx.abs() >= gap {
                s.push((pts[j].1 - pts[i].1) / dx);
            }
        }
    }
    (!s.is_empty()).then(|| median(&mut s))
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

/// Extract the parameters from a SKIPPY run (forward write or read).
pub fn skippy(points: &[Point]) -> Extraction {
    let no = |r: String| Extraction::NoRotation { reason: r };
    if points.len() < 30 {
        return no(format!("only {} points: need at least 30", points.len()));
    }
    let xy: Vec<(f64, f64)> = points
        .iter()
        .map(|p| (p.step as f64, p.latency_ms))
        .collect();
    let lat: Vec<f64> = xy.iter().map(|p| p.1).collect();
    let lo = lat.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = lat.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if hi - lo < 0.5 {
        return no(format!(
            "latencies stay within {:.3} ms ({:.3}..{:.3}): no mechanical signature (solid-state, or a cache answers)",
            hi - lo,
            lo,
            hi
        ));
    }
    // 2. The transition: the biggest drop of a 3-point running median.
    let med3: Vec<f64> = (0..lat.len())
        .map(|i| {
            let a = i.saturating_sub(1);
            let b = (i + 1).min(lat.len() - 1);
            let mut w: Vec<f64> = lat[a..=b].to_vec();
            median(&mut w)
        })
        .collect();
    let drops: Vec<f64> = (1..med3.len()).map(|i| med3[i - 1] - med3[i]).collect();
    let drop = drops.iter().copied().fold(0.0, f64::max);
    // Once the step passes a whole track beyond STM the sawtooth repeats:
    // the first big drop is the transition, the next one ends its period.
    let big: Vec<usize> = (0..drops.len())
        .filter(|&i| drops[i] > 0.6 * drop)
        .map(|i| i + 1)
        .collect();
    // The transition is the first big drop after which the curve stays low
    // (an outlier next to an ordinary point can also make a big drop).
    let stays_low = |i: usize| {
        let after: Vec<f64> = med3[i..(i + 8).min(med3.len())].to_vec();
        let before = med3[i - 1];
        after.len() >= 4
            && after.iter().filter(|&&v| v < before - 0.5 * drop).count() * 4 >= after.len() * 3
    };
    let k = big.iter().copied().find(|&i| stays_low(i)).unwrap_or(0);
    let end = big
        .iter()
        .copied()
        .find(|&i| i > k + 10 && stays_low(i))
        .unwrap_or(lat.len());
    if drop < 0.3 * (hi - lo) || k < 3 || k + 10 > end {
        return no(format!(
            "no sawtooth: the largest drop is {drop:.3} ms of a {:.3} ms range",
            hi - lo
        ));
    }
    // 1. Slope on each side (Theil-Sen), which must agree.
    let pre: Vec<(f64, f64)> = xy[1..k.saturating_sub(1)].to_vec();
    let post: Vec<(f64, f64)> = xy[k + 1..end.saturating_sub(1)].to_vec();
    let gap = (post.len() as f64 / 6.0).max(5.0);
    let Some(slope) = theil_sen(&post, gap) else {
        return no("too few points after the transition".into());
    };
    if slope <= 0.0 {
        return no(format!(
            "latency does not grow with the step after the transition (slope {slope:.5})"
        ));
    }
    if pre.len() >= 6 {
        if let Some(s1) = theil_sen(&pre, (pre.len() as f64 / 4.0).max(2.0)) {
            if (s1 - slope).abs() > 0.5 * slope {
                return no(format!(
                    "the two sides of the drop are not parallel (slopes {s1:.5} and {slope:.5} ms/step): no rotational sawtooth"
                ));
            }
        }
    }
    // 3. Offsets.
    let r_post: Vec<f64> = post.iter().map(|p| p.1 - slope * p.0).collect();
    let mut sorted = r_post.clone();
    sorted.sort_by(|a, b| a.total_cmp(b));
    let third = (sorted.len() / 3).max(1);
    let mut low: Vec<f64> = sorted[..third].to_vec();
    let b2 = median(&mut low);
    let mut dev: Vec<f64> = sorted[..third].iter().map(|r| (r - b2).abs()).collect();
    let noise = (1.4826 * median(&mut dev)).max(0.002);
    let mut r_pre: Vec<f64> = pre.iter().map(|p| p.1 - slope * p.0).collect();
    let b1 = if r_pre.len() >= 3 {
        median(&mut r_pre)
    } else {
        med3[k - 1] - slope * xy[k - 1].0
    };
    let rotation = b1 - b2;
    if rotation <= 4.0 * noise {
        return no(format!(
            "the sawtooth is {rotation:.3} ms high, within the noise ({noise:.3} ms)"
        ));
    }
    let l1 = Line {
        slope,
        intercept: b1,
    };
    let l2 = Line {
        slope,
        intercept: b2,
    };
    // Refine the transition. With timing noise a step or two near STM may
    // land on either side; the threshold lies between the last step that
    // missed and the first that made it (from which L2 holds).
    let near_l2 = |i: usize| {
        let (x, y) = xy[i];
        (y - l2.at(x)).abs() < (y - l1.at(x)).abs()
    };
    let len = xy.len();
    let first_l2 = (1..len)
        .find(|&i| near_l2(i) && (i..(i + 5).min(len)).filter(|&j| near_l2(j)).count() >= 4)
        .unwrap_or(k);
    let look = (first_l2 + 3).min(len - 1);
    let last_l1 = (0..=look)
        .rev()
        .find(|&j| !near_l2(j))
        .unwrap_or(first_l2.saturating_sub(1));
    let stm = points[first_l2].step;
    let s_mid = (points[last_l1].step as f64 + points[first_l2].step as f64) / 2.0;
    let spt = rotation / slope;
    // 4. MTM: the rotation covered between requests, at the threshold step.
    let mtm = slope * s_mid;
    let mut notes = Vec::new();
    // 5. Every point's excess over the sawtooth, folded by the rotation:
    // zero, or the skews of the track boundaries its step crossed.
    let thr = (6.0 * noise).max(0.05);
    let rmod: Vec<f64> = xy
        .iter()
        .map(|&(x, y)| {
            let r = (y - l2.at(x)).rem_euclid(rotation);
            if r > rotation - thr {
                r - rotation
            } else {
                r
            }
        })
        .collect();
    let (hs, cs, surfaces) = switches(points, &rmod, spt, thr, noise, rotation, &mut notes);
    let rotation_step0 = points
        .iter()
        .find(|p| p.step == 0)
        .map_or(f64::NAN, |p| p.latency_ms);
    let point2 = points[first_l2.saturating_sub(1)].step;
    Extraction::Rotational(Box::new(Skippy {
        rotation_ms: rotation,
        rotation_step0_ms: rotation_step0,
        mtm_ms: mtm,
        stm,
        sectors_per_track: spt,
        head_switch_ms: hs,
        cyl_switch_ms: cs,
        surfaces,
        l1,
        l2,
        l3: hs.map(|h| Line {
            slope,
            intercept: b2 + h,
        }),
        l4: cs.map(|c| Line {
            slope,
            intercept: b2 + c,
        }),
        point1: points[0].step,
        point2,
        point3: stm,
        noise_ms: noise,
        notes,
    }))
}

/// Head and cylinder switch times and the number of surfaces.
///
/// The track boundaries are located exactly: with an integral number of
/// sectors per track, the boundary phase is the one that best agrees with
/// which steps (shorter than a track) showed an excess and which did not.
/// Then every step's crossed boundaries are known; steps that crossed one
/// give the two switch times (the two biggest clusters of their excess);
/// and the cylinder boundaries are every S-th boundary for the S (and
/// offset) that best predicts every step's excess.
fn switches(
    points: &[Point],
    rmod: &[f64],
    spt: f64,
    thr: f64,
    noise: f64,
    rotation: f64,
    notes: &mut Vec<String>,
) -> (Option<f64>, Option<f64>, Option<u32>) {
    let n = spt.round() as i64;
    if n < 2 || (spt - n as f64).abs() > 0.2 {
        notes.push(format!(
            "sectors per track {spt:.2} is not close to an integer: switch times and surfaces not separated"
        ));
        return (None, None, None);
    }
    let span = |i: usize| (points[i - 1].lba as i64 + 1, points[i].lba as i64);
    let mut votes = vec![0i64; n as usize];
    for (i, &r) in rmod.iter().enumerate().skip(1) {
        let (a, b) = span(i);
        if b < a || b - a + 1 >= n {
            continue;
        }
        let w = if r > thr { 1 } else { -1 };
        for x in a..=b {
            votes[x.rem_euclid(n) as usize] += w;
        }
    }
    let Some(phase) = (0..n as usize).max_by_key(|&p| votes[p]) else {
        return (None, None, None);
    };
    let phase = phase as i64;
    // Boundary indices crossed by each step.
    let crossed: Vec<Vec<i64>> = (0..points.len())
        .map(|i| {
            if i == 0 {
                return Vec::new();
            }
            let (a, b) = span(i);
            let first = (a - phase + n - 1).div_euclid(n);
            let last = (b - phase).div_euclid(n);
            (first..=last).collect()
        })
        .collect();
    // Switch times from steps that crossed exactly one boundary.
    let singles: Vec<(f64, usize)> = (1..points.len())
        .filter(|&i| crossed[i].len() == 1 && rmod[i] > thr && rmod[i] < 0.9 * rotation)
        .map(|i| (rmod[i], i))
        .collect();
    let mut cl = clusters(singles, (4.0 * noise).max(0.08));
    cl.sort_by_key(|c| std::cmp::Reverse(c.len()));
    let center = |c: &Vec<(f64, usize)>| {
        let mut v: Vec<f64> = c.iter().map(|x| x.0).collect();
        median(&mut v)
    };
    let big: Vec<&Vec<(f64, usize)>> = cl.iter().filter(|c| c.len() >= 3).take(2).collect();
    let (hs, cs) = match big.as_slice() {
        [a, b] => {
            let (x, y) = (center(a), center(b));
            (Some(x.min(y)), Some(x.max(y)))
        }
        [a] => {
            // Cylinder switches are rarer: look for them in steps that
            // crossed several boundaries too, taking the head switches out.
            let h = center(a);
            let multi: Vec<(f64, usize)> = (1..points.len())
                .filter(|&i| !crossed[i].is_empty() && crossed[i].len() <= 3)
                .map(|i| {
                    (
                        (rmod[i] - (crossed[i].len() as f64 - 1.0) * h).rem_euclid(rotation),
                        i,
                    )
                })
                .filter(|(v, _)| *v > h + (6.0 * noise).max(0.1) && *v < 0.9 * rotation)
                .collect();
            let mut cm = clusters(multi, (4.0 * noise).max(0.08));
            cm.sort_by_key(|c| std::cmp::Reverse(c.len()));
            // Two agreeing steps suffice here: the head switches are known
            // and taken out, and outliers rarely agree to 0.08 ms.
            match cm.first().filter(|c| c.len() >= 2) {
                Some(c) => (Some(h), Some(center(c))),
                None => {
                    notes.push("only one kind of switch seen: reported as the head switch (run more steps to see cylinder switches)".into());
                    (Some(h), None)
                }
            }
        }
        _ => {
            notes.push("no track switches seen: run more steps".into());
            (None, None)
        }
    };
    let (Some(h), Some(c)) = (hs, cs) else {
        return (hs, cs, None);
    };
    // Surfaces: the S and offset whose cylinder boundaries best explain
    // every step's excess.
    let tol = (4.0 * noise).max(0.25 * (c - h)).min(0.45 * (c - h));
    let usable: Vec<usize> = (1..points.len())
        .filter(|&i| !crossed[i].is_empty() && crossed[i].len() <= 3)
        .collect();
    let mut best = (0usize, 0u32, 0i64);
    for s in 1..=64i64 {
        for off in 0..s {
            let score = usable
                .iter()
                .filter(|&&i| {
                    let m = crossed[i]
                        .iter()
                        .filter(|&&b| (b - off).rem_euclid(s) == 0)
                        .count() as f64;
                    let k = crossed[i].len() as f64;
                    let want = ((k - m) * h + m * c).rem_euclid(rotation);
                    (rmod[i] - want).abs() < tol
                })
                .count();
            if score > best.0 {
                best = (score, s as u32, off);
            }
        }
    }
    let share = best.0 as f64 / usable.len().max(1) as f64;
    if share < 0.7 {
        notes.push(format!(
            "no surface count explains the switches well ({:.0}% of steps)",
            share * 100.0
        ));
        return (hs, cs, None);
    }
    (hs, cs, Some(best.1))
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

    #[test]
    fn theil_sen_ignores_spikes() {
        let mut pts: Vec<(f64, f64)> = (0..100).map(|i| (i as f64, 0.1 * i as f64 + 2.0)).collect();
        for i in (5..100).step_by(7) {
            pts[i].1 += 1.5;
        }
        let s = theil_sen(&pts, 10.0).unwrap();
        assert!((s - 0.1).abs() < 0.005, "{s}");
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
