//! `fastpath disk validate`: every benchmark on every simulated preset,
//! extracted against specified.

use std::path::Path;
use std::time::Instant;

use serde::Serialize;
use serde_json::{json, Value};

use crate::bench::{self, SkippyOpts};
use crate::extract::{self, Extraction};
use crate::sim::{Disk, Spec};
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
}

/// A goal: its description and the check (specified, extracted).
type Goal<'a> = (&'static str, &'a dyn Fn(f64, f64) -> bool);

fn param(name: &'static str, spec: f64, got: Option<f64>, goal: Option<Goal<'_>>) -> Param {
    let error_pct = got.map(|g| (g - spec) / spec * 100.0);
    Param {
        name,
        specified: spec,
        extracted: got,
        error_pct,
        goal: goal.map(|g| g.0),
        ok: goal.map(|g| got.is_some_and(|x| (g.1)(spec, x))),
    }
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
    /// Whether no goal was missed.
    pub fn ok(&self) -> bool {
        self.params.iter().all(|p| p.ok != Some(false))
    }
}

/// Run SKIPPY, ZONED and SEEKER on one simulated drive.
pub fn preset(spec: &Spec, plot_dir: Option<&Path>) -> Result<PresetResult, crate::Error> {
    let mut disk = Disk::new(spec.clone());
    let t0 = disk.elapsed_ms();
    let opts = SkippyOpts {
        budget_ms: 1300.0,
        ..SkippyOpts::default()
    };
    let pts = bench::skippy(&mut disk, &opts)?;
    let mut ex = extract::skippy(&pts);
    if let Extraction::Rotational(e) = &mut ex {
        // Repeated probes around STM get whatever is left of 2 s of disk
        // time (less one slow access).
        let left = 1970.0 - (disk.elapsed_ms() - t0);
        bench::refine_mtm(
            &mut disk,
            opts.mode,
            &pts,
            e,
            left - 2.0 * spec.rotation_ms(),
        )?;
    }
    let skippy_ms = disk.elapsed_ms() - t0;
    let mut notes = Vec::new();
    let rel = |pct: f64| move |s: f64, x: f64| ((x - s) / s).abs() * 100.0 <= pct;
    let within1 = rel(1.0);
    let within2 = rel(2.0);
    let within5 = rel(5.0);
    let mtm_ok = |s: f64, x: f64| (x - s).abs() <= 0.1;
    let exact = |s: f64, x: f64| (x - s).abs() < 0.5;
    let e = match &ex {
        Extraction::Rotational(e) => Some(e.as_ref().clone()),
        Extraction::NoRotation { reason } => {
            notes.push(format!("SKIPPY: {reason}"));
            None
        }
    };
    if let Some(e) = &e {
        notes.extend(e.notes.iter().cloned());
    }
    let g = |f: fn(&extract::Skippy) -> Option<f64>| e.as_ref().and_then(f);
    let mut params = vec![
        param(
            "rotation_ms",
            spec.rotation_ms(),
            g(|e| Some(e.rotation_ms)),
            Some(("within 1%", &within1)),
        ),
        param(
            "rotation_step0_ms",
            spec.rotation_ms(),
            g(|e| Some(e.rotation_step0_ms)),
            None,
        ),
        param(
            "mtm_ms",
            spec.overhead_ms,
            g(|e| Some(e.mtm_ms)),
            Some(("within 0.1 ms", &mtm_ok)),
        ),
        param(
            "sectors_per_track",
            spec.zones[0].spt as f64,
            g(|e| Some(e.sectors_per_track)),
            Some(("within 2%", &within2)),
        ),
        param(
            "head_switch_ms",
            spec.effective_head_switch_ms(),
            g(|e| e.head_switch_ms),
            Some(("within 5%", &within5)),
        ),
        param(
            "cyl_switch_ms",
            spec.effective_cyl_switch_ms(),
            g(|e| e.cyl_switch_ms),
            Some(("within 5%", &within5)),
        ),
        param(
            "surfaces",
            spec.surfaces as f64,
            g(|e| e.surfaces.map(|s| s as f64)),
            Some(("exact", &exact)),
        ),
    ];
    // ZONED over the whole simulated disk.
    let mut quiet = |_: u64, _: u64| {};
    let mut zd = Disk::new(spec.clone());
    let zp = bench::zoned(&mut zd, 1 << 20, 100, None, &mut quiet)?;
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
    let sp = bench::seeker(&mut sd, Op::Write, 40, walk, &mut quiet)?;
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
    let _ = disk.elapsed_ms();
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
        "all_ok": results.iter().all(|r| r.ok() && r.skippy_disk_ms <= 2000.0) && wall <= 10.0,
        "wall_seconds": wall,
    });
    Ok((results, doc))
}

/// How often each goal is met over seeds `1..=seeds` of every preset (the
/// noise, outliers and starting phase change with the seed).
#[derive(Debug, Clone, Serialize)]
pub struct SeedSummary {
    /// The preset's short name.
    pub preset: &'static str,
    /// The parameter.
    pub param: &'static str,
    /// Its accuracy goal, as text.
    pub goal: &'static str,
    /// Runs that met the goal.
    pub met: u32,
    /// Runs (one per seed).
    pub runs: u32,
    /// The worst absolute difference, extracted - specified, in the
    /// parameter's unit (a run with nothing extracted is not counted here).
    pub worst_abs_error: f64,
}

/// Validate every preset under `seeds` seeds; one summary per preset and
/// goal, and the longest SKIPPY of all runs (ms of disk time).
pub fn over_seeds(specs: &[Spec], seeds: u32) -> Result<(Vec<SeedSummary>, f64), crate::Error> {
    let mut out: Vec<SeedSummary> = Vec::new();
    let mut longest: f64 = 0.0;
    for spec in specs {
        let first = out.len();
        for seed in 1..=seeds as u64 {
            let mut s = spec.clone();
            s.seed = seed;
            let r = preset(&s, None)?;
            longest = longest.max(r.skippy_disk_ms);
            for p in r.params.iter().filter(|p| p.ok.is_some()) {
                let i = match out[first..].iter().position(|x| x.param == p.name) {
                    Some(i) => first + i,
                    None => {
                        out.push(SeedSummary {
                            preset: spec.name,
                            param: p.name,
                            goal: p.goal.unwrap_or(""),
                            met: 0,
                            runs: 0,
                            worst_abs_error: 0.0,
                        });
                        out.len() - 1
                    }
                };
                let x = &mut out[i];
                x.runs += 1;
                x.met += (p.ok == Some(true)) as u32;
                if let Some(e) = p.extracted {
                    x.worst_abs_error = x.worst_abs_error.max((e - p.specified).abs());
                }
            }
        }
    }
    Ok((out, longest))
}
