//! `fastpath disk ...`: argument parsing, and one small function per
//! subcommand that calls the `disk` crate and prints what it returns.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::bail;
use clap::{Args, Subcommand};
use disk::extract::{Extraction, ZoneFits};
use disk::seeker::SeekPoint;
use disk::skippy::{SkippyMode, SkippyOpts};
use disk::validate::{PresetResult, SeedReport};
use disk::zoned::ZonePoint;
use disk::{Op, Target};
use indicatif::{ProgressBar, ProgressStyle};
use measure::Table;
use serde::Serialize;

use crate::report::{emit, Report};
use crate::Format;

#[derive(Args, Clone)]
pub struct TargetArgs {
    /// A block device or a file to measure. Writing a block device needs
    /// --allow-destructive; anything in use is refused whatever the flag
    /// (a mounted device or one with a mounted partition, swap, a file
    /// backing a loop device in use, a file with a bind mount), and the
    /// refusal names the holder. A plain file is scratch space: no flag.
    #[arg(long, conflicts_with = "sim")]
    device: Option<PathBuf>,
    /// A simulated drive instead: a preset name (`fastpath disk presets`).
    #[arg(long)]
    sim: Option<String>,
    /// Let a benchmark write to a block device (destroys its data).
    #[arg(long)]
    allow_destructive: bool,
    /// Simulator: no timing noise.
    #[arg(long)]
    quiet_sim: bool,
}

impl TargetArgs {
    fn open(&self, write: bool) -> anyhow::Result<Box<dyn Target>> {
        match (&self.device, &self.sim) {
            (Some(p), None) => Ok(Box::new(disk::device::Device::open(
                p,
                write,
                self.allow_destructive,
            )?)),
            (None, Some(n)) => {
                let mut s = disk::sim::preset_named(n)?;
                if self.quiet_sim {
                    s = s.quiet();
                }
                Ok(Box::new(disk::sim::Disk::new(s)))
            }
            _ => bail!("name what to measure: --device PATH or --sim PRESET"),
        }
    }
}

#[derive(Subcommand)]
pub enum DiskCommand {
    /// SKIPPY: one-sector accesses with a linearly growing step; extracts
    /// rotation time, MTM, sectors per track, head and cylinder switch
    /// times and the number of surfaces (the paper's section 4.1).
    ///
    /// Examples:
    ///   fastpath disk skippy --sim ultrastar --plot skippy.svg
    ///   fastpath disk skippy --device /dev/sdb --allow-destructive --csv trace.csv
    ///   fastpath disk skippy --device scratch.img --mode read
    #[command(verbatim_doc_comment)]
    Skippy {
        #[command(flatten)]
        target: TargetArgs,
        /// write (the paper's), read, or backward (reads walking backwards).
        #[arg(long, default_value = "write")]
        mode: SkippyMode,
        /// How many steps (step 0 to N-1 sectors skipped). All are run,
        /// unless --budget-ms stops the run first, which is then said.
        #[arg(long, default_value_t = 400)]
        steps: u32,
        /// First sector.
        #[arg(long, default_value_t = 0)]
        start: u64,
        /// Stop after this many milliseconds of device time (default: no
        /// limit).
        #[arg(long)]
        budget_ms: Option<f64>,
        /// Write the trace (step, latency) as CSV.
        #[arg(long)]
        csv: Option<PathBuf>,
        /// Draw the sawtooth with the fitted lines (SVG).
        #[arg(long)]
        plot: Option<PathBuf>,
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
    /// ZONED: bandwidth against location, with linear and quadratic fits.
    ///
    /// Example:
    ///   fastpath disk zoned --sim barracuda --plot zoned.svg
    #[command(verbatim_doc_comment)]
    Zoned {
        #[command(flatten)]
        target: TargetArgs,
        /// Bytes per read.
        #[arg(long, default_value_t = 1 << 20)]
        block: u64,
        /// Number of regions reported.
        #[arg(long, default_value_t = 100)]
        regions: u32,
        /// Read at most this many bytes (default: everything).
        #[arg(long)]
        limit: Option<u64>,
        #[arg(long)]
        plot: Option<PathBuf>,
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
    /// SEEKER: the shortest access time from sector 0 to places across the
    /// disk (writes, as the paper; --read to read instead).
    Seeker {
        #[command(flatten)]
        target: TargetArgs,
        #[arg(long, default_value_t = 40)]
        bases: u32,
        /// Accesses per place (walk at least one rotation).
        #[arg(long, default_value_t = 120)]
        measurements: u32,
        #[arg(long)]
        read: bool,
        #[arg(long)]
        plot: Option<PathBuf>,
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
    /// Extract parameters from a recorded SKIPPY trace: one point a line,
    /// `step latency [lba]`, separated by commas, semicolons or whitespace;
    /// a header line names the unit (`step,latency_us,lba`), or --unit
    /// does; neither means milliseconds. A trace with no point, or whose
    /// rotation is outside 2-30 ms (a unit mistake, as a rule), is an error
    /// that says what to change.
    ///
    /// Examples:
    ///   fastpath disk analyze trace.csv --plot skippy.svg
    ///   fastpath disk analyze blktrace-skippy.txt --unit us
    ///   fastpath disk analyze trace.csv --format json | jq .uncertain
    #[command(verbatim_doc_comment)]
    Analyze {
        trace: PathBuf,
        /// The latencies' unit, if the header does not name it.
        #[arg(long)]
        unit: Option<disk::trace::Unit>,
        #[arg(long)]
        plot: Option<PathBuf>,
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
    /// Run SKIPPY, ZONED and SEEKER on every simulated preset and compare
    /// what was extracted with what was specified.
    ///
    /// The goals: rotation within 1%, sectors per track 2%, MTM 0.1 ms,
    /// switch times (the skew costs SKIPPY sees) 5%, surfaces exact; a
    /// value flagged uncertain is not held to its goal, and nothing
    /// physically impossible may be printed as fact.
    ///
    /// Examples:
    ///   fastpath disk validate --plot-dir out/disk
    ///   fastpath disk validate --format json | jq '.presets.hp97560.params'
    ///   fastpath disk validate --seeds 50    # random starts, noise, every preset
    #[command(verbatim_doc_comment)]
    Validate {
        #[arg(long)]
        plot_dir: Option<PathBuf>,
        /// Run every preset (and the read and backwards variants where a
        /// preset has read-ahead) under seeds 1..=N: each seed picks a
        /// zone, a start inside it, a noise level (0, 0.01, 0.03 or 0.05
        /// ms) and the noise. Reports, per preset and parameter, runs
        /// within the goal, flagged uncertain, not printed, and printed
        /// out of the goal.
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1000), conflicts_with = "plot_dir")]
        seeds: Option<u32>,
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
    /// List the simulated drives and where their values come from.
    Presets,
}

/// What SKIPPY extracted, from a run or a recorded trace; its document is
/// the extraction itself.
#[derive(Serialize)]
#[serde(transparent)]
struct ExtractionReport<'a>(&'a Extraction);

impl Report for ExtractionReport<'_> {
    fn to_text(&self) -> String {
        use disk::extract::param as P;
        let mut out = String::new();
        match self.0 {
            Extraction::NoRotation { reason } => {
                let _ = writeln!(out, "no rotational signature: {reason}");
            }
            Extraction::Rotational(e) => {
                let mut t = Table::new(["parameter", "value", ""])
                    .title(format!("SKIPPY extraction ({:?} run)", e.direction));
                let flag = |p: &str| {
                    e.uncertain(p)
                        .map_or(String::new(), |_| "UNCERTAIN (see below)".to_string())
                };
                let o =
                    |v: Option<f64>, d: usize| v.map(|x| format!("{x:.d$}")).unwrap_or("-".into());
                t.row([
                    "rotation (sawtooth height), ms".to_string(),
                    format!("{:.3}", e.rotation_ms),
                    flag(P::ROTATION),
                ]);
                t.row([
                    "latency at step 0, ms".to_string(),
                    format!("{:.3}", e.rotation_step0_ms),
                    "the paper's other rotation estimate".to_string(),
                ]);
                t.row([
                    "MTM, ms".to_string(),
                    format!("{:.3}", e.mtm_ms),
                    flag(P::MTM),
                ]);
                t.row(["STM, sectors".to_string(), e.stm.to_string(), String::new()]);
                t.row([
                    "steps used".to_string(),
                    format!("{}-{}", e.steps_used.0, e.steps_used.1),
                    "the part that follows the sawtooth (see the notes)".to_string(),
                ]);
                t.row([
                    "sectors per track".to_string(),
                    format!("{:.2}", e.sectors_per_track),
                    flag(P::SPT),
                ]);
                t.row([
                    "head switch as SKIPPY sees it (skew cost), ms".to_string(),
                    o(e.head_switch_ms, 3),
                    flag(P::HEAD),
                ]);
                t.row([
                    "cylinder switch as SKIPPY sees it (skew cost), ms".to_string(),
                    o(e.cyl_switch_ms, 3),
                    flag(P::CYL),
                ]);
                t.row([
                    "surfaces".to_string(),
                    e.surfaces.map(|s| s.to_string()).unwrap_or("-".into()),
                    flag(P::SURFACES),
                ]);
                t.row([
                    "noise (robust sigma), ms".to_string(),
                    format!("{:.3}", e.noise_ms),
                    String::new(),
                ]);
                let _ = write!(out, "{t}");
                let _ = writeln!(out, "note: the switch times are what a stream loses at a boundary (the skew, plus any spare sectors there); the mechanical switch is shorter, hidden by the skew");
                for u in &e.uncertain {
                    let _ = writeln!(out, "UNCERTAIN {}: {}", u.param, u.reason);
                }
                for n in &e.notes {
                    let _ = writeln!(out, "note: {n}");
                }
            }
        }
        out
    }
}

/// Run one `fastpath disk` subcommand.
pub fn run(cmd: DiskCommand) -> anyhow::Result<()> {
    match cmd {
        DiskCommand::Skippy {
            target,
            mode,
            steps,
            start,
            budget_ms,
            csv,
            plot,
            format,
        } => {
            let opts = SkippyOpts {
                mode,
                steps,
                start,
                budget_ms,
            };
            skippy(&target, &opts, csv.as_deref(), plot.as_deref(), format)
        }
        DiskCommand::Analyze {
            trace,
            unit,
            plot,
            format,
        } => analyze(&trace, unit, plot.as_deref(), format),
        DiskCommand::Zoned {
            target,
            block,
            regions,
            limit,
            plot,
            format,
        } => zoned(&target, block, regions, limit, plot.as_deref(), format),
        DiskCommand::Seeker {
            target,
            bases,
            measurements,
            read,
            plot,
            format,
        } => {
            let op = if read { Op::Read } else { Op::Write };
            seeker(&target, op, bases, measurements, plot.as_deref(), format)
        }
        DiskCommand::Validate {
            seeds: Some(n),
            format,
            ..
        } => validate_over_seeds(n, format),
        DiskCommand::Validate {
            plot_dir, format, ..
        } => validate(plot_dir.as_deref(), format),
        DiskCommand::Presets => {
            presets();
            Ok(())
        }
    }
}

/// `disk skippy`: run it, keep the trace, extract, refine MTM, plot, print.
fn skippy(
    target: &TargetArgs,
    opts: &SkippyOpts,
    csv: Option<&Path>,
    plot: Option<&Path>,
    format: Format,
) -> anyhow::Result<()> {
    let mode = opts.mode;
    let mut t = target.open(mode == SkippyMode::Write)?;
    eprintln!("SKIPPY ({mode:?}) on {}", t.describe());
    let pts = disk::skippy::run(t.as_mut(), opts)?;
    if let Some(why) = disk::skippy::stopped_early(opts, &pts) {
        eprintln!("{why}");
    }
    if let Some(p) = csv {
        disk::trace::write(p, &pts)?;
    }
    let mut ex = disk::extract::skippy(&pts);
    if let (Extraction::Rotational(e), false) = (&mut ex, mode == SkippyMode::Backward) {
        // Repeated probes around STM place MTM between steps; if the
        // device cannot take them, the run's own estimate stands.
        let _ = disk::skippy::refine_mtm(t.as_mut(), mode, &pts, e, 600.0);
        e.check_plausible();
    }
    if let Some(p) = plot {
        disk::plots::skippy(p, &format!("SKIPPY, {}", t.describe()), &pts, &ex)?;
    }
    emit(format, &ExtractionReport(&ex))
}

/// `disk analyze`: a recorded SKIPPY trace, extracted and plotted like a
/// run; refused when its rotation is no disk's (a unit mistake).
fn analyze(
    trace: &Path,
    unit: Option<disk::trace::Unit>,
    plot: Option<&Path>,
    format: Format,
) -> anyhow::Result<()> {
    let tr = disk::trace::read(trace, unit)?;
    let ex = disk::extract::skippy(&tr.points);
    if let Some(why) = disk::trace::implausible_units(&tr, &ex) {
        bail!("{}: {why}", trace.display());
    }
    if !tr.unit_stated {
        eprintln!(
            "{}: no unit named (header latency_ms/latency_us/latency_s, or --unit): read as milliseconds",
            trace.display()
        );
    }
    if let Some(p) = plot {
        disk::plots::skippy(
            p,
            &format!("SKIPPY trace {}", trace.display()),
            &tr.points,
            &ex,
        )?;
    }
    emit(format, &ExtractionReport(&ex))
}

/// `disk zoned`: bandwidth per region with a progress bar, the fits.
fn zoned(
    target: &TargetArgs,
    block: u64,
    regions: u32,
    limit: Option<u64>,
    plot: Option<&Path>,
    format: Format,
) -> anyhow::Result<()> {
    let mut t = target.open(false)?;
    eprintln!("ZONED on {}", t.describe());
    let bar = ProgressBar::new(100);
    bar.set_style(ProgressStyle::with_template("{bar:40} {percent}% {msg}").expect("template"));
    let z = disk::zoned::run(t.as_mut(), block, regions, limit, &mut |d, tot| {
        bar.set_position(d * 100 / tot.max(1));
    })?;
    bar.finish_and_clear();
    let f = disk::extract::zone_fits(&z);
    if let Some(p) = plot {
        disk::plots::zoned(p, &format!("ZONED, {}", t.describe()), &z, f.as_ref())?;
    }
    emit(
        format,
        &ZonedReport {
            points: &z,
            fits: f,
        },
    )
}

/// ZONED's bandwidth per region and the fits, when there were enough
/// regions to fit.
#[derive(Serialize)]
struct ZonedReport<'a> {
    points: &'a [ZonePoint],
    fits: Option<ZoneFits>,
}

impl Report for ZonedReport<'_> {
    fn to_text(&self) -> String {
        // Without fits a person has nothing to read; the points are in the
        // document and the plot.
        self.fits
            .as_ref()
            .map_or(String::new(), |f| zone_fits_table(f).to_string())
    }
}

fn zone_fits_table(f: &ZoneFits) -> Table {
    let mut t = Table::new(["model", "a", "b", "RMS error (MB/s)"]).title(format!(
        "ZONED: outer {:.2} MB/s, inner {:.2} MB/s",
        f.outer_mbps, f.inner_mbps
    ));
    for (n, x) in [
        ("linear a*x+b", f.linear),
        ("quadratic a*x^2+b", f.quadratic),
        ("linear, two points", f.linear_two_point),
        ("quadratic, two points", f.quadratic_two_point),
    ] {
        t.row([
            n.to_string(),
            format!("{:.4}", x.a),
            format!("{:.3}", x.b),
            format!("{:.4}", x.rms),
        ]);
    }
    t
}

/// `disk seeker`: the shortest access to places across the disk.
fn seeker(
    target: &TargetArgs,
    op: Op,
    bases: u32,
    measurements: u32,
    plot: Option<&Path>,
    format: Format,
) -> anyhow::Result<()> {
    let mut t = target.open(op == Op::Write)?;
    eprintln!("SEEKER on {}", t.describe());
    let bar = ProgressBar::new(bases as u64);
    let s = disk::seeker::run(t.as_mut(), op, bases, measurements, &mut |d, _| {
        bar.set_position(d)
    })?;
    bar.finish_and_clear();
    if let Some(p) = plot {
        disk::plots::seeker(p, &format!("SEEKER, {}", t.describe()), &s)?;
    }
    emit(format, &SeekerReport(&s))
}

/// SEEKER's shortest access per place; its document is the list itself.
#[derive(Serialize)]
#[serde(transparent)]
struct SeekerReport<'a>(&'a [SeekPoint]);

impl Report for SeekerReport<'_> {
    fn to_text(&self) -> String {
        let mut t = Table::new(["sector", "shortest access (ms)"]).title("SEEKER");
        for p in self.0 {
            t.row([p.lba.to_string(), format!("{:.3}", p.min_ms)]);
        }
        t.to_string()
    }
}

/// `disk validate --seeds N`: per preset and parameter, how the printed
/// values fared over random starts, noise levels and seeds.
fn validate_over_seeds(n: u32, format: Format) -> anyhow::Result<()> {
    let t0 = std::time::Instant::now();
    let rep = disk::validate::over_seeds(&disk::sim::presets(), n)?;
    let goal_met = rep.share_ok() >= 0.98
        && rep.runs_impossible_as_fact == 0
        && rep.longest_skippy_disk_ms <= 2000.0;
    emit(
        format,
        &SeedsReport {
            share_ok: rep.share_ok(),
            rep: &rep,
            goal_met,
            wall_seconds: t0.elapsed().as_secs_f64(),
        },
    )
}

/// `disk validate --seeds N`: the library's counts, with the verdict and
/// the wall time beside them.
#[derive(Serialize)]
struct SeedsReport<'a> {
    #[serde(flatten)]
    rep: &'a SeedReport,
    share_ok: f64,
    goal_met: bool,
    wall_seconds: f64,
}

impl Report for SeedsReport<'_> {
    fn to_text(&self) -> String {
        let rep = self.rep;
        let mut t = Table::new([
            "preset",
            "SKIPPY",
            "parameter",
            "goal",
            "runs",
            "within goal",
            "flagged uncertain",
            "not printed",
            "out of goal, printed",
            "impossible as fact",
            "worst |error| printed",
        ])
        .title(format!(
            "every preset under seeds 1..={}: random zone, start and noise",
            rep.seeds
        ));
        for x in &rep.params {
            t.row([
                x.preset.to_string(),
                format!("{:?}", x.mode).to_lowercase(),
                x.param.to_string(),
                x.goal.to_string(),
                x.runs.to_string(),
                x.within_goal.to_string(),
                x.flagged_uncertain.to_string(),
                x.absent.to_string(),
                x.out_of_goal_but_printed.to_string(),
                x.impossible_as_fact.to_string(),
                format!("{:.4}", x.worst_abs_error),
            ]);
        }
        let mut out = format!("{t}\n");
        for m in &rep.misses {
            let _ = writeln!(out, "  miss: {m}");
        }
        let _ = writeln!(
            out,
            "{} runs: {} ({:.1}%) printed every value within its goal or flagged it uncertain; {} printed an impossible value as fact; {} found no rotational signature; longest SKIPPY {:.0} ms of disk time; goal (>= 98%, 0 impossible) met: {}; wall time {:.1} s",
            rep.runs,
            rep.runs_ok,
            100.0 * self.share_ok,
            rep.runs_impossible_as_fact,
            rep.runs_no_rotation,
            rep.longest_skippy_disk_ms,
            self.goal_met,
            self.wall_seconds
        );
        out
    }
}

/// `disk validate`: every preset, extracted against specified.
fn validate(plot_dir: Option<&Path>, format: Format) -> anyhow::Result<()> {
    let (results, doc) = disk::validate::all(&disk::sim::presets(), plot_dir)?;
    emit(format, &ValidateReport { results, doc })
}

/// `disk validate`: its document is the library's; the tables come from
/// the per-preset results behind it.
#[derive(Serialize)]
#[serde(transparent)]
struct ValidateReport {
    #[serde(skip)]
    results: Vec<PresetResult>,
    doc: serde_json::Value,
}

impl Report for ValidateReport {
    fn to_text(&self) -> String {
        let mut out = String::new();
        for r in &self.results {
            let _ = writeln!(out, "{}", preset_result_table(r));
            for n in &r.notes {
                let _ = writeln!(out, "  note: {n}");
            }
        }
        let _ = writeln!(
            out,
            "all goals met: {}; wall time {:.2} s",
            self.doc["all_ok"],
            self.doc["wall_seconds"].as_f64().unwrap_or(0.0)
        );
        out
    }
}

fn preset_result_table(r: &PresetResult) -> Table {
    let mut t = Table::new([
        "parameter",
        "specified",
        "extracted",
        "error %",
        "goal",
        "ok",
        "uncertain",
    ])
    .title(format!(
        "{} ({}); SKIPPY took {:.0} ms of disk time",
        r.name, r.model, r.skippy_disk_ms
    ));
    for p in &r.params {
        t.row([
            p.name.to_string(),
            format!("{:.3}", p.specified),
            p.extracted.map(|x| format!("{x:.3}")).unwrap_or("-".into()),
            p.error_pct
                .map(|x| format!("{x:+.2}"))
                .unwrap_or("-".into()),
            p.goal.unwrap_or("").to_string(),
            match p.ok {
                Some(true) => "yes".into(),
                Some(false) => "NO".into(),
                None => "".into(),
            },
            if p.uncertain.is_some() {
                "flagged".into()
            } else {
                String::new()
            },
        ]);
    }
    t
}

/// `disk presets`: the simulated drives and their sources.
fn presets() {
    let mut t = Table::new([
        "preset",
        "model",
        "RPM",
        "surfaces",
        "zones",
        "sectors/track",
        "source",
    ]);
    for p in disk::sim::presets() {
        t.row([
            p.name.to_string(),
            p.model.to_string(),
            format!("{:.0}", p.rpm),
            p.surfaces.to_string(),
            p.zones.len().to_string(),
            format!(
                "{}..{}",
                p.zones[0].spt,
                p.zones.last().map_or(0, |z| z.spt)
            ),
            p.source.to_string(),
        ]);
    }
    print!("{t}");
}
