//! Extraction against an independent simulator: SKIPPY traces that DiskSim
//! 4.0 made on its own validated drive models (spare sectors, caches, seeks
//! and settling as DiskSim models them, none of it fastpath's), at random
//! starts, 400 and 900 steps; the ground truth is each model's parameter
//! file, written down in `tests/disksim/<drive>.toml`.
//!
//! `scripts/disksim-skippy.py` regenerates the traces from a built DiskSim.
//!
//! Goals: on writes without a cache, at least 98% of traces print every
//! value within its goal (rotation 1%, sectors per track 2%, head and
//! cylinder switch 5%, surfaces exact) or flag it uncertain, and at least
//! 95% print the rotation as fact; on reads (read-ahead) and on writes
//! through a write cache, nothing impossible is printed as fact.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use disk::extract::{self, param, Extraction, Skippy};
use disk::trace::{self, skippy_lba};
use disk::validate::impossible;
use serde::Deserialize;

/// A drive model's ground truth (see the files' own header for the source).
#[derive(Debug, Deserialize)]
struct Drive {
    drive: String,
    rpm: f64,
    surfaces: u32,
    spare_sectors_per_track: u32,
    spare_sectors_per_cylinder: u32,
    zone: Vec<Zone>,
}

#[derive(Debug, Deserialize)]
struct Zone {
    sectors_per_track: u32,
    track_skew: u32,
    cylinder_skew: u32,
    first_block: u64,
    last_block: u64,
}

impl Drive {
    fn rotation_ms(&self) -> f64 {
        60_000.0 / self.rpm
    }

    fn zone_of(&self, lba: u64) -> Option<usize> {
        self.zone
            .iter()
            .position(|z| (z.first_block..=z.last_block).contains(&lba))
    }

    /// What SKIPPY sees in a zone: sectors per track, and what a stream
    /// loses at a track and at a cylinder boundary (the skew plus the
    /// spare sectors passed there).
    fn seen(&self, z: &Zone) -> [(&'static str, f64); 5] {
        let sector = self.rotation_ms() / z.sectors_per_track as f64;
        let per_track = self.spare_sectors_per_track;
        [
            (param::ROTATION, self.rotation_ms()),
            (param::SPT, z.sectors_per_track as f64),
            (param::HEAD, (z.track_skew + per_track) as f64 * sector),
            (
                param::CYL,
                (z.cylinder_skew + per_track + self.spare_sectors_per_cylinder) as f64 * sector,
            ),
            (param::SURFACES, self.surfaces as f64),
        ]
    }
}

fn within(name: &str, want: f64, got: f64) -> bool {
    let rel = ((got - want) / want).abs() * 100.0;
    match name {
        param::ROTATION => rel <= 1.0,
        param::SPT => rel <= 2.0,
        param::HEAD | param::CYL => rel <= 5.0,
        param::SURFACES => (got - want).abs() < 0.5,
        _ => true,
    }
}

fn printed(e: &Skippy, name: &str) -> Option<f64> {
    match name {
        param::ROTATION => Some(e.rotation_ms),
        param::MTM => Some(e.mtm_ms),
        param::SPT => Some(e.sectors_per_track),
        param::HEAD => e.head_switch_ms,
        param::CYL => e.cyl_switch_ms,
        param::SURFACES => e.surfaces.map(f64::from),
        _ => None,
    }
}

fn data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/disksim")
}

fn drives() -> BTreeMap<String, Drive> {
    let mut m = BTreeMap::new();
    for f in std::fs::read_dir(data()).unwrap() {
        let p = f.unwrap().path();
        if p.extension().is_some_and(|x| x == "toml") {
            let d: Drive = toml::from_str(&std::fs::read_to_string(&p).unwrap())
                .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            m.insert(d.drive.clone(), d);
        }
    }
    m
}

/// One committed trace: its drive, scenario, steps and first sector.
struct Run {
    file: PathBuf,
    drive: String,
    scenario: String,
    start: u64,
}

fn runs() -> Vec<Run> {
    let mut v = Vec::new();
    for f in std::fs::read_dir(data().join("traces")).unwrap() {
        let file = f.unwrap().path();
        let name = file.file_stem().unwrap().to_string_lossy().to_string();
        let parts: Vec<&str> = name.rsplitn(4, '-').collect();
        let [start, _steps, scenario, drive] = parts[..] else {
            panic!("{name}: not <drive>-<scenario>-<steps>-<start>")
        };
        v.push(Run {
            drive: drive.to_string(),
            scenario: scenario.to_string(),
            start: start.parse().unwrap(),
            file,
        });
    }
    v.sort_by(|a, b| a.file.cmp(&b.file));
    v
}

/// The extraction's verdict on one write trace, judged against the truth.
#[derive(Default)]
struct Verdict {
    rotation_as_fact: bool,
    /// Values printed as fact outside their goals.
    wrong: Vec<String>,
    impossible: Vec<String>,
}

fn judge(d: &Drive, run: &Run, ex: &Extraction) -> Verdict {
    let mut v = Verdict::default();
    let Extraction::Rotational(e) = ex else {
        return v;
    };
    v.rotation_as_fact = e.uncertain(param::ROTATION).is_none();
    for name in [
        param::ROTATION,
        param::MTM,
        param::SPT,
        param::HEAD,
        param::CYL,
        param::SURFACES,
    ] {
        if let Some(x) = printed(e, name) {
            if e.uncertain(name).is_none() && impossible(e, name, x) {
                v.impossible.push(format!("{name} {x:.3}"));
            }
        }
    }
    if run.scenario != "write" {
        return v;
    }
    // The zones of the steps the extraction used.
    let (first, last) = e.steps_used;
    let lba = |s: u32| run.start + 1 + skippy_lba(s);
    let zones: Vec<usize> = (first..=last).filter_map(|s| d.zone_of(lba(s))).collect();
    let (zlo, zhi) = (
        zones.iter().copied().min().unwrap_or(0),
        zones.iter().copied().max().unwrap_or(0),
    );
    for (name, want) in d.seen(&d.zone[zlo]) {
        let Some(got) = printed(e, name) else {
            continue;
        };
        if e.uncertain(name).is_some() {
            continue;
        }
        // Steps from two zones: what depends on the zone must be flagged
        // (or cut at the boundary), unless both zones agree on it.
        let other = d.seen(&d.zone[zhi]);
        let want_other = other.iter().find(|x| x.0 == name).map_or(want, |x| x.1);
        if !within(name, want, got) || !within(name, want_other, got) {
            let crossing = (first..=last).find(|&s| d.zone_of(lba(s)) != Some(zlo));
            v.wrong.push(format!(
                "{name} {got:.3} (model {want:.3}{}; steps {first}-{last} used)",
                match crossing {
                    Some(s) =>
                        format!(" in zone {zlo}, {want_other:.3} in zone {zhi} from step {s}"),
                    None => String::new(),
                }
            ));
        }
    }
    v
}

#[test]
fn extraction_meets_its_goals_on_disksim_traces() {
    let drives = drives();
    let runs = runs();
    assert!(runs.len() >= 200, "{} traces", runs.len());
    // Per drive and scenario: traces, every printed value right or
    // flagged, rotation printed as fact.
    let mut table: BTreeMap<(String, String), (u32, u32, u32)> = BTreeMap::new();
    let (mut writes, mut writes_ok, mut rotation) = (0u32, 0u32, 0u32);
    let mut misses = Vec::new();
    let mut impossible_as_fact = Vec::new();
    for run in &runs {
        let d = &drives[&run.drive];
        let tr = trace::read(&run.file, None).unwrap();
        let ex = extract::skippy(&tr.points);
        let v = judge(d, run, &ex);
        let name = run.file.file_name().unwrap().to_string_lossy().to_string();
        if !v.impossible.is_empty() {
            impossible_as_fact.push(format!("{name}: {}", v.impossible.join(", ")));
        }
        let row = table
            .entry((run.drive.clone(), run.scenario.clone()))
            .or_default();
        row.0 += 1;
        let ok = v.wrong.is_empty() && v.impossible.is_empty();
        row.1 += ok as u32;
        row.2 += v.rotation_as_fact as u32;
        if run.scenario == "write" {
            writes += 1;
            writes_ok += ok as u32;
            rotation += v.rotation_as_fact as u32;
            if !ok {
                misses.push(format!("{name}: {}", v.wrong.join(", ")));
            }
            if let Extraction::NoRotation { reason } = &ex {
                misses.push(format!("{name}: no rotation printed: {reason}"));
            }
        }
    }
    println!("drive       scenario traces  right-or-flagged  rotation-as-fact");
    for ((drive, scenario), (n, ok, rot)) in &table {
        println!("{drive:<11} {scenario:<8} {n:>6}  {ok:>16}  {rot:>16}");
    }
    for m in &misses {
        println!("miss: {m}");
    }
    for m in &impossible_as_fact {
        println!("impossible as fact: {m}");
    }
    let share = writes_ok as f64 / writes as f64;
    let rot = rotation as f64 / writes as f64;
    println!(
        "writes without cache: {writes} traces, {:.1}% every printed value within goal or flagged, rotation printed as fact in {:.1}%; impossible values printed as fact (all scenarios): {}",
        100.0 * share,
        100.0 * rot,
        impossible_as_fact.len()
    );
    assert!(impossible_as_fact.is_empty(), "{impossible_as_fact:#?}");
    assert!(share >= 0.98, "{share:.3}: {misses:#?}");
    assert!(rot >= 0.95, "{rot:.3}: {misses:#?}");
}
