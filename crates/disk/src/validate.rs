//! `fastpath disk validate`: the benchmarks on every simulated preset,
//! extracted against specified; and over many seeds, random start
//! positions, noise levels and every simulator feature, how often each
//! printed value is within its goal, flagged uncertain, or wrong.

use std::path::Path;
use std::time::Instant;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use serde_json::{json, Value};

use crate::extract::{self, param as P, Extraction, Skippy};
use crate::sim::{Disk, Spec};
use crate::skippy::{self, Point, SkippyMode, SkippyOpts};
use crate::{seeker, zoned};
use crate::{Op, Target};

/// One compared parameter.
#[derive(Debug, Clone, Serialize)]
pub struct Param {
    /// The parameter (`rotation_ms`, `surfaces`, ...), also its JSON key.
    pub name: &'static str,
    /// The value the simulated drive was built with.
    pub specified: f64,
    /// What the benchmarks found, if they found it.
    pub extracted: Option<f64>,
    /// (extracted - specified) / specified, in per cent.
    pub error_pct: Option<f64>,
    /// The accuracy goal, as text, if the parameter has one.
    pub goal: Option<&'static str>,
    /// Whether the goal was met (`None` without a goal; `Some(false)` when
    /// nothing was extracted).
    pub ok: Option<bool>,
    /// Why the extraction flagged the value uncertain, if it did.
    pub uncertain: Option<String>,
}

/// A goal: its description and the check (specified, extracted).
type Goal = (&'static str, fn(f64, f64) -> bool);

fn rel(pct: f64, s: f64, x: f64) -> bool {
    ((x - s) / s).abs() * 100.0 <= pct
}

/// The goals: rotation 1%, sectors per track 2%, MTM 0.1 ms, switch times
/// 5%, surfaces exact.
fn goal(name: &str) -> Option<Goal> {
    Some(match name {
        P::ROTATION => ("within 1%", |s, x| rel(1.0, s, x)),
        P::SPT => ("within 2%", |s, x| rel(2.0, s, x)),
        P::MTM => ("within 0.1 ms", |s, x| (x - s).abs() <= 0.1),
        P::HEAD | P::CYL => ("within 5%", |s, x| rel(5.0, s, x)),
        P::SURFACES => ("exact", |s, x| (x - s).abs() < 0.5),
        _ => return None,
    })
}

fn param(name: &'static str, spec: f64, got: Option<f64>, e: Option<&Skippy>) -> Param {
    let g = goal(name);
    Param {
        name,
        specified: spec,
        extracted: got,
        error_pct: got.map(|x| (x - spec) / spec * 100.0),
        goal: g.map(|g| g.0),
        ok: g.map(|g| got.is_some_and(|x| (g.1)(spec, x))),
        uncertain: e.and_then(|e| e.uncertain(name)).map(str::to_string),
    }
}

/// Whether a value contradicts physics or the run's own rotation (what
/// must never be printed as fact).
pub fn impossible(e: &Skippy, name: &str, v: f64) -> bool {
    let r = e.rotation_ms;
    match name {
        P::ROTATION => !(2.0..=30.0).contains(&v),
        P::SPT => v < 4.0,
        P::MTM | P::HEAD | P::CYL => !(v > 0.0 && v < r),
        P::SURFACES => !(1.0..=64.0).contains(&v),
        _ => false,
    }
}

/// What the drive was built with, where a run at `lba` looks.
fn specified(spec: &Spec, lba: u64, op: Op) -> [(&'static str, f64); 6] {
    let z = spec.zone_at(lba);
    [
        (P::ROTATION, spec.rotation_ms()),
        (P::MTM, spec.overhead_for(op)),
        (P::SPT, z.spt as f64),
        (P::HEAD, spec.boundary_head_ms(z)),
        (P::CYL, spec.boundary_cyl_ms(z)),
        (P::SURFACES, spec.surfaces as f64),
    ]
}

fn extracted(e: &Skippy, name: &str) -> Option<f64> {
    match name {
        P::ROTATION => Some(e.rotation_ms),
        P::MTM => Some(e.mtm_ms),
        P::SPT => Some(e.sectors_per_track),
        P::HEAD => e.head_switch_ms,
        P::CYL => e.cyl_switch_ms,
        P::SURFACES => e.surfaces.map(f64::from),
        _ => None,
    }
}

/// SKIPPY on a drive from `start`, extracted, MTM refined by delayed
/// probes (forward runs); the points, the extraction and the disk time.
pub fn skippy_run(
    spec: &Spec,
    mode: SkippyMode,
    start: u64,
) -> Result<(Vec<Point>, Extraction, f64), crate::Error> {
    let mut disk = Disk::new(spec.clone());
    let t0 = disk.elapsed_ms();
    // Backwards the first wrap comes after nearly a track of steps, each
    // waiting most of a rotation: give it the whole 2 s.
    let opts = SkippyOpts {
        budget_ms: Some(if mode == SkippyMode::Backward {
            1960.0
        } else {
            1300.0
        }),
        start,
        mode,
        ..SkippyOpts::default()
    };
    let pts = skippy::run(&mut disk, &opts)?;
    let mut ex = extract::skippy(&pts);
    if let (Extraction::Rotational(e), false) = (&mut ex, mode == SkippyMode::Backward) {
        // Repeated probes around STM get whatever is left of 2 s of disk
        // time (less one slow access).
        let left = 1970.0 - (disk.elapsed_ms() - t0);
        skippy::refine_mtm(&mut disk, mode, &pts, e, left - 2.0 * spec.rotation_ms())?;
        e.check_plausible();
    }
    Ok((pts, ex, disk.elapsed_ms() - t0))
}

/// The result for one preset.
#[derive(Debug, Clone, Serialize)]
pub struct PresetResult {
    /// The preset's short name.
    pub name: &'static str,
    /// The drive's make and model.
    pub model: &'static str,
    /// Where the preset's values come from.
    pub source: &'static str,
    /// Every compared parameter.
    pub params: Vec<Param>,
    /// Simulated disk time of the SKIPPY run (ms).
    pub skippy_disk_ms: f64,
    /// The extraction's notes (and why it found nothing, if it did not).
    pub notes: Vec<String>,
}

impl PresetResult {
    /// Whether no goal was missed by a value printed as fact.
    pub fn ok(&self) -> bool {
        self.params
            .iter()
            .all(|p| p.ok != Some(false) || p.uncertain.is_some())
    }
}

/// Run SKIPPY (write, from sector 0), ZONED and SEEKER on one simulated
/// drive.
pub fn preset(spec: &Spec, plot_dir: Option<&Path>) -> Result<PresetResult, crate::Error> {
    let (pts, ex, skippy_ms) = skippy_run(spec, SkippyMode::Write, 0)?;
    let mut notes = Vec::new();
    let e = match &ex {
        Extraction::Rotational(e) => Some(e.as_ref().clone()),
        Extraction::NoRotation { reason } => {
            notes.push(format!("SKIPPY: {reason}"));
            None
        }
    };
    if let Some(e) = &e {
        notes.extend(e.notes.iter().cloned());
        notes.extend(
            e.uncertain
                .iter()
                .map(|u| format!("uncertain {}: {}", u.param, u.reason)),
        );
    }
    let mut params: Vec<Param> = specified(spec, 0, Op::Write)
        .into_iter()
        .map(|(n, v)| param(n, v, e.as_ref().and_then(|e| extracted(e, n)), e.as_ref()))
        .collect();
    params.insert(
        1,
        param(
            "rotation_step0_ms",
            spec.rotation_ms(),
            e.as_ref().map(|e| e.rotation_step0_ms),
            None,
        ),
    );
    // The mechanical switches, which the skew costs above hide.
    params.push(param(
        "mechanical_head_switch_ms",
        spec.head_switch_ms,
        None,
        None,
    ));
    params.push(param(
        "mechanical_cyl_switch_ms",
        spec.cyl_switch_ms,
        None,
        None,
    ));
    // ZONED over the whole simulated disk.
    let mut quiet = |_: u64, _: u64| {};
    let mut zd = Disk::new(spec.clone());
    let zp = zoned::run(&mut zd, 1 << 20, 100, None, &mut quiet)?;
    let fits = extract::zone_fits(&zp);
    if let Some(f) = &fits {
        params.push(param(
            "outer_mbps",
            spec.zone_mbps(&spec.zones[0]),
            Some(f.outer_mbps),
            None,
        ));
        let inner = spec.zones.last().expect("a zone");
        params.push(param(
            "inner_mbps",
            spec.zone_mbps(inner),
            Some(f.inner_mbps),
            None,
        ));
    }
    // SEEKER: walk a full rotation at each of 40 places.
    let mut sd = Disk::new(spec.clone());
    let walk = spec.zones.iter().map(|z| z.spt).max().unwrap_or(64) + 8;
    let sp = seeker::run(&mut sd, Op::Write, 40, walk, &mut quiet)?;
    let mtm = e.as_ref().map_or(spec.overhead_ms, |e| e.mtm_ms);
    let max_seek = sp
        .iter()
        .map(|p| p.min_ms)
        .fold(f64::NEG_INFINITY, f64::max)
        - mtm;
    params.push(param(
        "max_seek_ms",
        spec.seek.time(spec.cylinders() - 1),
        Some(max_seek),
        None,
    ));
    if let Some(dir) = plot_dir {
        std::fs::create_dir_all(dir).map_err(|e| crate::Error::Io {
            path: dir.display().to_string(),
            what: "create plot directory",
            err: e,
        })?;
        let t = format!("SKIPPY, {}", spec.model);
        let _ = crate::plots::skippy(
            &dir.join(format!("{}-skippy.svg", spec.name)),
            &t,
            &pts,
            &ex,
        );
        let t = format!("ZONED, {}", spec.model);
        let _ = crate::plots::zoned(
            &dir.join(format!("{}-zoned.svg", spec.name)),
            &t,
            &zp,
            fits.as_ref(),
        );
        let t = format!("SEEKER, {}", spec.model);
        let _ = crate::plots::seeker(&dir.join(format!("{}-seeker.svg", spec.name)), &t, &sp);
    }
    Ok(PresetResult {
        name: spec.name,
        model: spec.model,
        source: spec.source,
        params,
        skippy_disk_ms: skippy_ms,
        notes,
    })
}

/// Validate every preset; the JSON document of `fastpath disk validate`.
pub fn all(
    specs: &[Spec],
    plot_dir: Option<&Path>,
) -> Result<(Vec<PresetResult>, Value), crate::Error> {
    let t0 = Instant::now();
    let mut results = Vec::new();
    for s in specs {
        results.push(preset(s, plot_dir)?);
    }
    let wall = t0.elapsed().as_secs_f64();
    let mut presets = serde_json::Map::new();
    for r in &results {
        let mut params = serde_json::Map::new();
        for p in &r.params {
            params.insert(
                p.name.into(),
                json!({
                    "specified": p.specified,
                    "extracted": p.extracted,
                    "error_pct": p.error_pct,
                    "goal": p.goal,
                    "ok": p.ok,
                    "uncertain": p.uncertain,
                }),
            );
        }
        presets.insert(
            r.name.into(),
            json!({
                "model": r.model,
                "source": r.source,
                "params": params,
                "skippy_disk_ms": r.skippy_disk_ms,
                "notes": r.notes,
                "ok": r.ok(),
            }),
        );
    }
    let doc = json!({
        "presets": presets,
        "all_ok": results.iter().all(|r| r.ok() && r.skippy_disk_ms <= 2000.0),
        "wall_seconds": wall,
    });
    Ok((results, doc))
}

/// A preset and the SKIPPY variant run on it.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// The drive.
    pub spec: Spec,
    /// The variant.
    pub mode: SkippyMode,
}

/// What `--seeds` runs: every preset with write SKIPPY; the read-ahead
/// preset also with read SKIPPY (whose values must come out right or
/// flagged) and backwards reads (which read-ahead does not help).
pub fn scenarios(specs: &[Spec]) -> Vec<Scenario> {
    let mut v = Vec::new();
    for s in specs {
        v.push(Scenario {
            spec: s.clone(),
            mode: SkippyMode::Write,
        });
        if s.name == "ultrastar" {
            v.push(Scenario {
                spec: s.clone(),
                mode: SkippyMode::Backward,
            });
        }
        if s.read_ahead && s.cache.segments > 1 {
            for mode in [SkippyMode::Read, SkippyMode::Backward] {
                v.push(Scenario {
                    spec: s.clone(),
                    mode,
                });
            }
        }
    }
    v
}

/// How one parameter fared over the runs of one scenario.
#[derive(Debug, Clone, Serialize)]
pub struct SeedSummary {
    /// The preset's short name.
    pub preset: &'static str,
    /// The SKIPPY variant.
    pub mode: SkippyMode,
    /// The parameter.
    pub param: &'static str,
    /// Its accuracy goal, as text.
    pub goal: &'static str,
    /// Runs.
    pub runs: u32,
    /// Printed as fact and within the goal.
    pub within_goal: u32,
    /// Printed flagged uncertain (whether right or wrong).
    pub flagged_uncertain: u32,
    /// Not printed (nothing extracted).
    pub absent: u32,
    /// Printed as fact and outside the goal.
    pub out_of_goal_but_printed: u32,
    /// Printed as fact and physically impossible.
    pub impossible_as_fact: u32,
    /// The worst absolute difference of a value printed as fact,
    /// extracted - specified, in the parameter's unit.
    pub worst_abs_error: f64,
}

/// All runs of `--seeds`.
#[derive(Debug, Clone, Serialize)]
pub struct SeedReport {
    /// Seeds per scenario.
    pub seeds: u32,
    /// Per scenario and parameter.
    pub params: Vec<SeedSummary>,
    /// Runs over all scenarios.
    pub runs: u32,
    /// Runs in which every printed value was within its goal or flagged.
    pub runs_ok: u32,
    /// Runs that printed a physically impossible value as fact.
    pub runs_impossible_as_fact: u32,
    /// Runs whose SKIPPY found no rotational signature.
    pub runs_no_rotation: u32,
    /// The longest SKIPPY of all runs, ms of disk time.
    pub longest_skippy_disk_ms: f64,
    /// Every run that missed, for the reader: scenario, seed, start, noise,
    /// and what was wrong.
    pub misses: Vec<String>,
}

impl SeedReport {
    /// runs_ok / runs.
    pub fn share_ok(&self) -> f64 {
        self.runs_ok as f64 / self.runs.max(1) as f64
    }
}

/// The noise levels the seeds cycle through (standard deviation, ms).
pub const NOISE_LEVELS: [f64; 4] = [0.0, 0.01, 0.03, 0.05];

/// Run every scenario of `specs` (see [`scenarios`]) under seeds
/// `1..=seeds`: each seed picks a random zone and a random start inside
/// it, a noise level, and the noise itself.
pub fn over_seeds(specs: &[Spec], seeds: u32) -> Result<SeedReport, crate::Error> {
    over_scenarios(&scenarios(specs), seeds)
}

/// [`over_seeds`] over the scenarios given.
pub fn over_scenarios(scenarios: &[Scenario], seeds: u32) -> Result<SeedReport, crate::Error> {
    let mut rep = SeedReport {
        seeds,
        params: Vec::new(),
        runs: 0,
        runs_ok: 0,
        runs_impossible_as_fact: 0,
        runs_no_rotation: 0,
        longest_skippy_disk_ms: 0.0,
        misses: Vec::new(),
    };
    for sc in scenarios {
        let first = rep.params.len();
        let op = sc.mode.op();
        for seed in 1..=seeds as u64 {
            let mut spec = sc.spec.clone();
            spec.seed = seed;
            let mut rng = StdRng::seed_from_u64(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
            spec.noise_ms = NOISE_LEVELS[rng.gen_range(0..NOISE_LEVELS.len())];
            spec.timing_noise_ms = spec.noise_ms;
            let zi = rng.gen_range(0..spec.zones.len());
            let (zfirst, zlen) = spec.zone_range(zi);
            let span = 400u64 * 401 / 2 + 402 + 60_000;
            let start = zfirst + rng.gen_range(0..zlen.saturating_sub(span).max(1));
            let (_, ex, ms) = skippy_run(&spec, sc.mode, start)?;
            rep.longest_skippy_disk_ms = rep.longest_skippy_disk_ms.max(ms);
            rep.runs += 1;
            let e = match &ex {
                Extraction::Rotational(e) => Some(e.as_ref()),
                Extraction::NoRotation { .. } => {
                    rep.runs_no_rotation += 1;
                    None
                }
            };
            let mut run_ok = true;
            let mut run_impossible = false;
            let mut wrong = Vec::new();
            for (name, want) in specified(&spec, start, op) {
                let i = match rep.params[first..].iter().position(|x| x.param == name) {
                    Some(i) => first + i,
                    None => {
                        rep.params.push(SeedSummary {
                            preset: sc.spec.name,
                            mode: sc.mode,
                            param: name,
                            goal: goal(name).map_or("", |g| g.0),
                            runs: 0,
                            within_goal: 0,
                            flagged_uncertain: 0,
                            absent: 0,
                            out_of_goal_but_printed: 0,
                            impossible_as_fact: 0,
                            worst_abs_error: 0.0,
                        });
                        rep.params.len() - 1
                    }
                };
                let x = &mut rep.params[i];
                x.runs += 1;
                let got = e.and_then(|e| extracted(e, name).map(|v| (e, v)));
                match got {
                    None => x.absent += 1,
                    Some((e, _)) if e.uncertain(name).is_some() => x.flagged_uncertain += 1,
                    Some((e, v)) => {
                        x.worst_abs_error = x.worst_abs_error.max((v - want).abs());
                        if impossible(e, name, v) {
                            x.impossible_as_fact += 1;
                            run_impossible = true;
                        }
                        if goal(name).is_some_and(|g| (g.1)(want, v)) {
                            x.within_goal += 1;
                        } else {
                            x.out_of_goal_but_printed += 1;
                            run_ok = false;
                            wrong.push(format!("{name} {v:.3} (built {want:.3})"));
                        }
                    }
                }
            }
            rep.runs_ok += run_ok as u32;
            rep.runs_impossible_as_fact += run_impossible as u32;
            if !run_ok {
                rep.misses.push(format!(
                    "{} {:?} seed {seed} start {start} noise {} ms: {}",
                    sc.spec.name,
                    sc.mode,
                    spec.noise_ms,
                    wrong.join(", ")
                ));
            }
        }
    }
    Ok(rep)
}
