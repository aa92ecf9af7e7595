//! `fastpath lb hash-eval`: the paper's section 5.3 reproduced.
//!
//! - Figure 11: max and min share of table entries per backend for Maglev,
//!   Karger (ring with virtual nodes) and rendezvous hashing, N = 1000,
//!   M = 65537 and 655373.
//! - Figure 12: percent of changed entries against percent of concurrent
//!   backend failures, averaged over random repetitions, for both M.
//! - Table generation time, beside Pseudocode 1 written literally (our peer
//!   in the same run) and the paper's published times; lookup cost per flow.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use indicatif::{ProgressBar, ProgressStyle};
use maglev::eval::{backend_names, disruption, ShareStats};
use maglev::karger::KargerRing;
use maglev::rendezvous::Rendezvous;
use maglev::{mix64, reference, Backend, Maglev, Permutation};
use measure::plot::{bar_chart, line_chart, Labels, Series};
use measure::{time_median, Table};
use serde::Serialize;

/// What went wrong in an evaluation.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A table could not be built (bad M, too many backends...).
    #[error(transparent)]
    Maglev(#[from] maglev::Error),
    /// A plot could not be written.
    #[error(transparent)]
    Plot(#[from] measure::plot::PlotError),
    /// The plot directory could not be created.
    #[error("cannot create plot directory {path}: {source}")]
    PlotDir {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A parameter is out of range.
    #[error("{0}")]
    Config(String),
}

/// Parameters of one evaluation run.
#[derive(Debug, Clone, Serialize)]
pub struct Config {
    /// Number of backends N.
    pub backends: usize,
    /// Table sizes M (each prime).
    pub sizes: Vec<u64>,
    /// Virtual nodes per backend on the Karger ring.
    pub karger_views: u32,
    /// Failure levels for Figure 12, percent of N.
    pub failure_pcts: Vec<f64>,
    /// Random repetitions per failure level.
    pub repetitions: usize,
    /// Timed repetitions of each Maglev table generation (median reported).
    pub gen_reps: usize,
    /// Seed for the failure choices.
    pub seed: u64,
    /// Whether this is the reduced `--quick` run.
    pub quick: bool,
}

impl Config {
    /// The paper's setup: N = 1000, both sizes, 1000 views, failures of 1 to
    /// 10 percent with 200 repetitions each.
    pub fn paper() -> Self {
        Config {
            backends: 1000,
            sizes: vec![
                u64::from(maglev::DEFAULT_TABLE_SIZE),
                u64::from(maglev::LARGE_TABLE_SIZE),
            ],
            karger_views: 1000,
            failure_pcts: (1..=10).map(f64::from).collect(),
            repetitions: 200,
            gen_reps: 21,
            seed: 0x5eed,
            quick: false,
        }
    }

    /// A reduced run that finishes in a few seconds: same N, sizes and
    /// views; three failure levels with 10 repetitions each.
    pub fn quick() -> Self {
        Config {
            failure_pcts: vec![1.0, 5.0, 10.0],
            repetitions: 10,
            gen_reps: 7,
            quick: true,
            ..Config::paper()
        }
    }

    fn validate(&self) -> Result<(), Error> {
        if self.backends == 0 {
            return Err(Error::Config("--backends must be at least 1".into()));
        }
        if self.sizes.is_empty() {
            return Err(Error::Config(
                "--sizes needs at least one table size".into(),
            ));
        }
        for &m in &self.sizes {
            maglev::check_table_size(m)?;
            if (self.backends as u64) > m {
                return Err(Error::Config(format!(
                    "{} backends do not fit a table of M = {m}; the paper uses M > 100 x N",
                    self.backends
                )));
            }
        }
        if let Some(p) = self
            .failure_pcts
            .iter()
            .find(|p| !(0.0..=100.0).contains(*p))
        {
            return Err(Error::Config(format!(
                "failure level {p}% is outside 0..100"
            )));
        }
        Ok(())
    }
}

/// One point of Figure 12 as reported.
#[derive(Debug, Clone, Serialize)]
pub struct DisruptionOut {
    /// Failed backends, percent of N.
    pub failed_pct: f64,
    /// Failed backends.
    pub failed: usize,
    /// Mean percent of table entries that changed.
    pub changed_pct: f64,
    /// Mean percent of entries that changed although their backend survived.
    pub extra_changed_pct: f64,
}

/// Results for one method at one table size.
#[derive(Debug, Clone, Serialize)]
pub struct MethodResult {
    /// Largest share of the table held by one backend, percent.
    pub max_share_pct: f64,
    /// Smallest share of the table held by one backend, percent.
    pub min_share_pct: f64,
    /// Largest number of entries held by one backend.
    pub max_entries: u32,
    /// Smallest number of entries held by one backend.
    pub min_entries: u32,
    /// How far the busiest backend is above a fair share, percent.
    pub overprovision_pct: f64,
    /// The paper's overprovisioning for this method and size, where its text
    /// gives one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub paper_overprovision_pct: Option<f64>,
    /// Median time to generate the table, milliseconds.
    pub gen_ms: f64,
    /// Pseudocode 1 written literally, same input, same run (Maglev only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub literal_gen_ms: Option<f64>,
    /// The paper's generation time (Maglev only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub paper_gen_ms: Option<f64>,
    /// Figure 12 (Maglev only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disruption: Option<Vec<DisruptionOut>>,
}

/// Cost of one lookup from a flow hash, per method.
#[derive(Debug, Clone, Serialize)]
pub struct LookupResult {
    /// Method name.
    pub method: String,
    /// Nanoseconds per lookup (median of batches).
    pub ns: f64,
    /// This method's cost relative to Maglev's.
    pub ratio_to_maglev: f64,
}

/// The whole evaluation, as printed with `--format json`.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The parameters used.
    pub config: Config,
    /// method -> M -> results.
    pub results: BTreeMap<String, BTreeMap<String, MethodResult>>,
    /// Lookup cost (at the first table size).
    pub lookup: Vec<LookupResult>,
}

/// The figures the paper's text gives: (method, M) -> overprovisioning
/// percent, and Maglev's generation times. Figure 11's Maglev bars and all of
/// Figure 12 are only drawn, not stated, so they are not here.
fn paper_overprovision(method: &str, m: u64) -> Option<f64> {
    match (method, m) {
        ("karger", 65_537) => Some(29.7),
        ("rendezvous", 65_537) => Some(49.5),
        ("karger", 655_373) => Some(10.3),
        ("rendezvous", 655_373) => Some(12.3),
        _ => None,
    }
}

fn paper_gen_ms(m: u64) -> Option<f64> {
    match m {
        65_537 => Some(1.8),
        655_373 => Some(22.9),
        _ => None,
    }
}

fn bar(len: u64, msg: &str) -> ProgressBar {
    let pb = ProgressBar::new(len);
    pb.set_style(
        ProgressStyle::with_template("{msg:>28} [{bar:30}] {pos}/{len} {elapsed}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    pb.set_message(msg.to_string());
    pb
}

/// Runs the evaluation. Progress goes to stderr (hidden when it is not a
/// terminal).
pub fn run(cfg: &Config) -> Result<Report, Error> {
    cfg.validate()?;
    let names = backend_names(cfg.backends);
    let backends: Vec<Backend> = names.iter().map(Backend::new).collect();
    let mut results: BTreeMap<String, BTreeMap<String, MethodResult>> = BTreeMap::new();
    let mut lookup = Vec::new();

    for (si, &m) in cfg.sizes.iter().enumerate() {
        let m32 = maglev::check_table_size(m)?;
        // Maglev: build (timed, buffers reused), then shares.
        let mut table = Maglev::new(m)?;
        table.populate(&backends)?;
        let gen_s = time_median(cfg.gen_reps, || {
            table.populate(&backends).expect("validated input")
        });
        let perms: Vec<Permutation> = names
            .iter()
            .map(|s| Permutation::from_name(s, m32))
            .collect();
        let literal_s = time_median(cfg.gen_reps.div_ceil(4), || {
            std::hint::black_box(reference::populate(&perms, m32));
        });
        let share = ShareStats::from_counts(&table.counts(cfg.backends), m32);

        let failures: Vec<usize> = cfg
            .failure_pcts
            .iter()
            .map(|p| ((p / 100.0) * cfg.backends as f64).round() as usize)
            .collect();
        let pb = bar(
            (failures.len() * cfg.repetitions) as u64,
            &format!("Figure 12, M = {m}"),
        );
        let points = disruption(
            cfg.backends,
            m,
            &failures,
            cfg.repetitions,
            cfg.seed,
            &mut || pb.inc(1),
        )?;
        pb.finish_and_clear();
        results.entry("maglev".into()).or_default().insert(
            m.to_string(),
            method_result(
                share,
                gen_s,
                Some(literal_s),
                paper_gen_ms(m),
                None,
                Some(
                    points
                        .iter()
                        .map(|p| DisruptionOut {
                            failed_pct: p.failed_pct,
                            failed: p.failed,
                            changed_pct: p.changed_pct,
                            extra_changed_pct: p.extra_changed_pct,
                        })
                        .collect(),
                ),
            ),
        );

        // Karger: ring with virtual nodes, then one lookup per slot.
        let mut slots = Vec::new();
        let mut ring = None;
        let karger_s = time_median(if cfg.quick { 1 } else { 3 }, || {
            let r = KargerRing::new(&names, cfg.karger_views);
            r.table(m32, &mut slots);
            ring = Some(r);
        });
        let share = ShareStats::from_counts(&maglev::eval::slot_counts(&slots, cfg.backends), m32);
        results.entry("karger".into()).or_default().insert(
            m.to_string(),
            method_result(
                share,
                karger_s,
                None,
                None,
                paper_overprovision("karger", m),
                None,
            ),
        );

        // Rendezvous: N scores per slot.
        let rdv = Rendezvous::new(&names);
        let pb = bar(1, &format!("rendezvous table, M = {m}"));
        let rdv_s = time_median(1, || rdv.table(m32, &mut slots));
        pb.finish_and_clear();
        let share = ShareStats::from_counts(&maglev::eval::slot_counts(&slots, cfg.backends), m32);
        results.entry("rendezvous".into()).or_default().insert(
            m.to_string(),
            method_result(
                share,
                rdv_s,
                None,
                None,
                paper_overprovision("rendezvous", m),
                None,
            ),
        );

        if si == 0 {
            if let Some(ring) = &ring {
                lookup = measure_lookups(&table, ring, &rdv);
            }
        }
    }
    Ok(Report {
        config: cfg.clone(),
        results,
        lookup,
    })
}

fn method_result(
    s: ShareStats,
    gen_s: f64,
    literal_s: Option<f64>,
    paper_gen: Option<f64>,
    paper_over: Option<f64>,
    disruption: Option<Vec<DisruptionOut>>,
) -> MethodResult {
    MethodResult {
        max_share_pct: s.max_share_pct,
        min_share_pct: s.min_share_pct,
        max_entries: s.max_entries,
        min_entries: s.min_entries,
        overprovision_pct: s.overprovision_pct,
        paper_overprovision_pct: paper_over,
        gen_ms: gen_s * 1e3,
        literal_gen_ms: literal_s.map(|s| s * 1e3),
        paper_gen_ms: paper_gen,
        disruption,
    }
}

/// Nanoseconds per lookup over a batch of pseudo-random flow hashes.
fn measure_lookups(t: &Maglev, ring: &KargerRing, rdv: &Rendezvous) -> Vec<LookupResult> {
    const FLOWS: usize = 1 << 16;
    let hashes: Vec<u64> = (0..FLOWS as u64).map(|i| mix64(i ^ 0xfeed)).collect();
    let per = |reps: usize, n: usize, f: &dyn Fn(u64) -> Option<u32>| {
        let s = time_median(reps, || {
            let mut acc = 0u64;
            for &h in &hashes[..n] {
                acc = acc.wrapping_add(u64::from(f(h).unwrap_or(0)));
            }
            std::hint::black_box(acc);
        });
        s * 1e9 / n as f64
    };
    let maglev_ns = per(51, FLOWS, &|h| t.lookup(h));
    let karger_ns = per(11, FLOWS, &|h| ring.lookup(h));
    let rdv_ns = per(3, 1024, &|h| rdv.lookup(h));
    [
        ("maglev", maglev_ns),
        ("karger", karger_ns),
        ("rendezvous", rdv_ns),
    ]
    .into_iter()
    .map(|(m, ns)| LookupResult {
        method: m.into(),
        ns,
        ratio_to_maglev: ns / maglev_ns,
    })
    .collect()
}

fn opt(v: Option<f64>, prec: usize) -> String {
    v.map_or_else(|| "-".into(), |x| format!("{x:.prec$}"))
}

impl Report {
    /// Results in the paper's order: Maglev, Karger, rendezvous.
    fn methods(&self) -> impl Iterator<Item = (&String, &BTreeMap<String, MethodResult>)> {
        ["maglev", "karger", "rendezvous"]
            .into_iter()
            .filter_map(|k| self.results.get_key_value(k))
    }

    /// The human-readable report: tables beside the paper's figures.
    pub fn to_text(&self) -> String {
        let c = &self.config;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "Consistent hashing, paper section 5.3: N = {} backends, Karger with {} views{}\n",
            c.backends,
            c.karger_views,
            if c.quick { " (quick run)" } else { "" }
        );
        let mut t = Table::new([
            "method",
            "M",
            "max %",
            "min %",
            "max entries",
            "min entries",
            "overprov %",
            "paper overprov %",
            "gen ms",
        ])
        .title("Figure 11: share of table entries per backend (fair share = 100/N %)");
        for (method, by_m) in self.methods() {
            for m in &c.sizes {
                if let Some(r) = by_m.get(&m.to_string()) {
                    t.row([
                        method.to_string(),
                        m.to_string(),
                        format!("{:.4}", r.max_share_pct),
                        format!("{:.4}", r.min_share_pct),
                        r.max_entries.to_string(),
                        r.min_entries.to_string(),
                        format!("{:.1}", r.overprovision_pct),
                        opt(r.paper_overprovision_pct, 1),
                        format!("{:.2}", r.gen_ms),
                    ]);
                }
            }
        }
        let _ = writeln!(out, "{t}");
        let _ = writeln!(
            out,
            "  (the paper's Maglev bars are drawn, not stated: \"almost perfect\" at both sizes)\n"
        );

        let mut g = Table::new(["M", "fastpath ms", "Pseudocode 1 literal ms", "speedup", "paper ms", "paper / fastpath"])
            .title("Maglev table generation (N backends, median; the literal version is the peer in this run)");
        for m in &c.sizes {
            if let Some(r) = self
                .results
                .get("maglev")
                .and_then(|b| b.get(&m.to_string()))
            {
                g.row([
                    m.to_string(),
                    format!("{:.3}", r.gen_ms),
                    opt(r.literal_gen_ms, 3),
                    opt(r.literal_gen_ms.map(|l| l / r.gen_ms), 1) + "x",
                    opt(r.paper_gen_ms, 1),
                    opt(r.paper_gen_ms.map(|p| p / r.gen_ms), 1) + "x",
                ]);
            }
        }
        let _ = writeln!(out, "{g}");

        let mut header = vec!["failed %".to_string(), "failed".to_string()];
        for m in &c.sizes {
            header.push(format!("changed % M={m}"));
            header.push(format!("beyond failed % M={m}"));
        }
        let mut d = Table::new(header).title(format!(
            "Figure 12: changed table entries vs concurrent backend failures (mean of {} repetitions)",
            c.repetitions
        ));
        let series: Vec<&Vec<DisruptionOut>> = c
            .sizes
            .iter()
            .filter_map(|m| {
                self.results
                    .get("maglev")?
                    .get(&m.to_string())?
                    .disruption
                    .as_ref()
            })
            .collect();
        if let Some(first) = series.first() {
            for (i, p) in first.iter().enumerate() {
                let mut row = vec![format!("{:.1}", p.failed_pct), p.failed.to_string()];
                for s in &series {
                    row.push(format!("{:.2}", s[i].changed_pct));
                    row.push(format!("{:.2}", s[i].extra_changed_pct));
                }
                d.row(row);
            }
        }
        let _ = writeln!(out, "{d}");
        let _ = writeln!(out, "  (the paper draws Figure 12 without stating values: changes grow with failures and are smaller for the larger table)\n");

        let mut l = Table::new(["method", "ns per lookup", "x maglev"]).title(format!(
            "Lookup from a flow hash (M = {})",
            c.sizes.first().copied().unwrap_or(0)
        ));
        for r in &self.lookup {
            l.row([
                r.method.clone(),
                format!("{:.2}", r.ns),
                format!("{:.1}", r.ratio_to_maglev),
            ]);
        }
        let _ = write!(out, "{l}");
        out
    }

    /// Writes `figure11.svg` and `figure12.svg` into `dir` (created if
    /// missing) and returns their paths.
    pub fn plot(&self, dir: &Path) -> Result<Vec<PathBuf>, Error> {
        std::fs::create_dir_all(dir).map_err(|source| Error::PlotDir {
            path: dir.to_path_buf(),
            source,
        })?;
        let c = &self.config;
        let mut categories = Vec::new();
        let mut labels = Vec::new();
        let mut values: Vec<Vec<f64>> = vec![Vec::new(), Vec::new()];
        for (method, by_m) in self.methods() {
            for m in &c.sizes {
                if let Some(r) = by_m.get(&m.to_string()) {
                    categories.push(format!("{method} M={m}"));
                    values[0].push(r.max_share_pct);
                    values[1].push(r.min_share_pct);
                }
            }
        }
        labels.push("max share %".to_string());
        labels.push("min share %".to_string());
        let f11 = dir.join("figure11.svg");
        bar_chart(
            &f11,
            &Labels {
                title: &format!("Figure 11: entries per backend, N = {}", c.backends),
                x: "method and table size",
                y: "percent of table entries",
            },
            &categories,
            &labels,
            &values,
        )?;
        let mut series = Vec::new();
        for m in &c.sizes {
            if let Some(d) = self
                .results
                .get("maglev")
                .and_then(|b| b.get(&m.to_string()))
                .and_then(|r| r.disruption.as_ref())
            {
                series.push(Series {
                    label: format!("M = {m}"),
                    points: d.iter().map(|p| (p.failed_pct, p.changed_pct)).collect(),
                });
                series.push(Series {
                    label: format!("M = {m}, beyond the failed backends' own"),
                    points: d
                        .iter()
                        .map(|p| (p.failed_pct, p.extra_changed_pct))
                        .collect(),
                });
            }
        }
        let f12 = dir.join("figure12.svg");
        line_chart(
            &f12,
            &Labels {
                title: &format!(
                    "Figure 12: Maglev resilience, N = {}, {} repetitions",
                    c.backends, c.repetitions
                ),
                x: "concurrent backend failures (%)",
                y: "changed table entries (%)",
            },
            &series,
        )?;
        Ok(vec![f11, f12])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> Config {
        Config {
            backends: 50,
            sizes: vec![5003, 10_007],
            karger_views: 100,
            failure_pcts: vec![2.0, 10.0],
            repetitions: 3,
            gen_reps: 1,
            seed: 1,
            quick: true,
        }
    }

    #[test]
    fn report_has_every_method_and_size_and_maglev_is_fair() {
        let r = run(&small()).unwrap();
        for method in ["maglev", "karger", "rendezvous"] {
            for m in ["5003", "10007"] {
                let x = &r.results[method][m];
                assert!(
                    x.max_share_pct >= x.min_share_pct && x.gen_ms > 0.0,
                    "{method} {m}"
                );
            }
        }
        for (m, x) in &r.results["maglev"] {
            let m: u32 = m.parse().unwrap();
            assert!(x.max_entries <= m.div_ceil(50) && x.min_entries >= m / 50);
            let d = x.disruption.as_ref().unwrap();
            assert_eq!(d.len(), 2);
            assert!(d[1].changed_pct > d[0].changed_pct);
        }
        // Karger and rendezvous are visibly less even than Maglev.
        let mg = &r.results["maglev"]["5003"];
        assert!(r.results["rendezvous"]["5003"].overprovision_pct > mg.overprovision_pct);
        let json: serde_json::Value = serde_json::to_value(&r).unwrap();
        assert!(json["results"]["maglev"]["5003"]["disruption"].is_array());
        assert!(json["results"]["karger"]["5003"]
            .get("disruption")
            .is_none());
        assert_eq!(r.lookup.len(), 3);
        let text = r.to_text();
        assert!(
            text.contains("Figure 11") && text.contains("Figure 12") && text.contains("rendezvous")
        );
    }

    #[test]
    fn bad_configs_are_rejected_with_the_value() {
        let mut c = small();
        c.sizes = vec![5000];
        let e = run(&c).unwrap_err().to_string();
        assert!(e.contains("5000") && e.contains("not prime"), "{e}");
        let mut c = small();
        c.backends = 20_000;
        assert!(run(&c).unwrap_err().to_string().contains("20000 backends"));
        let mut c = small();
        c.failure_pcts = vec![120.0];
        assert!(run(&c).is_err());
    }

    #[test]
    fn plots_are_written() {
        let r = run(&small()).unwrap();
        let dir = std::env::temp_dir().join(format!("hash-eval-plots-{}", std::process::id()));
        let files = r.plot(&dir).unwrap();
        for f in &files {
            let s = std::fs::read_to_string(f).unwrap();
            assert!(
                s.contains("<svg") && s.contains("Figure"),
                "{}",
                f.display()
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
