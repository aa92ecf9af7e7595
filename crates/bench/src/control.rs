//! `fastpath lb bench-control`: the control plane at scale. A configuration
//! of V VIPs, each over its own pool of B backends with Maglev tables of M
//! slots (default 1,000 x 100, M = 65537), generated as TOML text so that
//! parsing is measured too. Timed, in each of `runs` runs:
//!
//! - parse + validate the text (`Config::parse_with` and a fresh
//!   [`ParseCache`], as the daemon starts: the elements parsed in
//!   parallel);
//! - the first load: build every table and swap them in (`Control::new`);
//! - a reload that changes one backend of one pool (its address), parsed
//!   through the load's cache as the daemon's reload does (only the
//!   changed element is parsed again), beside a
//!   full rebuild of the same configuration by a fresh control plane in the
//!   same run (the peer); the two must give the same fingerprints;
//! - a health change of one backend (`Control::set_health`), down and back;
//! - a `[fleet]` peer's liveness change (`Control::set_peer_up`), down and
//!   back: only the fragment-redirect part of the snapshot is made anew.
//!
//! Memory: the snapshot's table bytes per VIP and in total
//! ([`lb::tables::Tables::memory`]), and the process's resident set before
//! and after the first load of the first run.

use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::time::Instant;

use lb::config::{ChunkStats, Config, ConfigError, ParseCache};
use lb::tables::Control;
use measure::{median, Table};
use serde::Serialize;

/// Why the benchmark could not run.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The generated configuration was rejected (for example a table size
    /// that is not prime, or more backends than 2^24).
    #[error("the generated configuration: {0}")]
    Config(#[from] ConfigError),
    /// A parameter is out of range.
    #[error("{0}")]
    Spec(String),
    /// The incremental reload and the full rebuild disagree: a bug.
    #[error("the incremental reload and the full rebuild disagree on VIP {0}'s fingerprint")]
    Mismatch(String),
}

/// What to generate and how often to measure.
#[derive(Debug, Clone, Serialize)]
pub struct Spec {
    /// VIPs, each over its own pool.
    pub vips: usize,
    /// Backends per pool.
    pub backends: usize,
    /// Maglev table size M of every pool (prime).
    pub table_size: u64,
    /// Runs (min, median and max reported).
    pub runs: usize,
}

impl Default for Spec {
    fn default() -> Self {
        Spec {
            vips: 1000,
            backends: 100,
            table_size: u64::from(maglev::DEFAULT_TABLE_SIZE),
            runs: 3,
        }
    }
}

impl Spec {
    fn check(&self) -> Result<(), Error> {
        if self.vips == 0 || self.vips > 60_000 {
            return Err(Error::Spec(format!(
                "--vips {} must be 1 to 60000 (one address each in 198.18.0.0/15)",
                self.vips
            )));
        }
        if self.backends == 0 || self.vips * self.backends >= 1 << 24 {
            return Err(Error::Spec(format!(
                "--backends {} must be at least 1 and VIPs x backends below 2^24 (10.0.0.0/8)",
                self.backends
            )));
        }
        if self.runs == 0 {
            return Err(Error::Spec("--runs must be at least 1".into()));
        }
        Ok(())
    }

    /// The address of backend `j` of pool `i`; `alt` gives it another one.
    fn backend(&self, i: usize, j: usize, alt: bool) -> Ipv4Addr {
        let k = if alt {
            // Past every generated address: unique.
            self.vips * self.backends + i
        } else {
            i * self.backends + j
        };
        Ipv4Addr::from(0x0a00_0000u32 + k as u32 + 1)
    }

    /// This load balancer's address (`[encap] source`, in `[fleet]`).
    pub const OWN: Ipv4Addr = Ipv4Addr::new(10, 255, 255, 254);
    /// The other `[fleet]` peers; the first is marked down and up.
    pub const PEERS: [Ipv4Addr; 2] = [
        Ipv4Addr::new(10, 255, 255, 253),
        Ipv4Addr::new(10, 255, 255, 252),
    ];

    /// The pool and backend changed by the one-backend reload: the middle
    /// ones.
    fn changed(&self) -> (usize, usize) {
        (self.vips / 2, self.backends / 2)
    }

    /// The configuration as TOML text: pool `i` has backends
    /// `10.0.0.0/8 + i * B + j + 1` (names default to the addresses) and a
    /// tunnel health check (which needs an address VIP over the pool: the
    /// validation walks VIPs and includes); VIP `i` serves it at a
    /// 198.18.0.0/15 address, TCP port 80. A `[fleet]` of three load
    /// balancers, this one ([`Spec::OWN`]) and [`Spec::PEERS`]. With
    /// `change`, the middle pool's middle backend has another address.
    pub fn config_text(&self, change: bool) -> String {
        let mut t = String::with_capacity(self.vips * (self.backends * 28 + 300));
        let _ = write!(
            t,
            "[encap]\nsource = \"{}\"\n\n[fleet]\npeers = [\"{}\", \"{}\", \"{}\"]\n\n",
            Self::OWN,
            Self::OWN,
            Self::PEERS[0],
            Self::PEERS[1]
        );
        let changed = change.then(|| self.changed());
        for i in 0..self.vips {
            let _ = write!(
                t,
                "[[pools]]\nname = \"pool-{i}\"\ntable_size = {}\n\
                 health = {{ kind = \"tcp\", port = 80, via = \"tunnel\" }}\nbackends = [\n",
                self.table_size
            );
            for j in 0..self.backends {
                let a = self.backend(i, j, changed == Some((i, j)));
                let _ = writeln!(t, "  {{ address = \"{a}\" }},");
            }
            t.push_str("]\n\n");
        }
        for i in 0..self.vips {
            let a = Ipv4Addr::from(0xc612_0000u32 + i as u32 + 1);
            let _ = write!(
                t,
                "[[vips]]\nname = \"vip-{i}\"\naddress = \"{a}\"\nport = 80\nprotocol = \"tcp\"\npool = \"pool-{i}\"\n\n"
            );
        }
        t
    }
}

/// Min, median and max of a figure over the runs.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Spread {
    /// Smallest.
    pub min: f64,
    /// Median.
    pub median: f64,
    /// Largest.
    pub max: f64,
}

impl Spread {
    fn of(xs: &[f64]) -> Self {
        let mut v = xs.to_vec();
        let med = median(&mut v);
        Spread {
            min: v.first().copied().unwrap_or(f64::NAN),
            median: med,
            max: v.last().copied().unwrap_or(f64::NAN),
        }
    }

    fn text(&self, digits: usize) -> [String; 3] {
        [
            format!("{:.digits$}", self.min),
            format!("{:.digits$}", self.median),
            format!("{:.digits$}", self.max),
        ]
    }
}

/// Table memory of the loaded configuration.
#[derive(Debug, Clone, Serialize)]
pub struct Memory {
    /// Bytes per VIP: its Maglev table and backend lists (min, median, max
    /// over the VIPs).
    pub per_vip_bytes: Spread,
    /// Distinct Maglev tables in the snapshot.
    pub distinct_tables: usize,
    /// Bytes of the distinct tables.
    pub tables_bytes: usize,
    /// Everything in the snapshot (tables once, lists, backend registry).
    pub total_bytes: usize,
    /// Resident set growth over the first load of the first run (parse,
    /// validate, build), KiB; includes the parsed configuration and what
    /// the allocator keeps.
    pub rss_growth_kib: u64,
    /// Resident set growth over the first run's reload: what the one
    /// changed table costs while the old snapshot is still alive, KiB.
    pub rss_growth_reload_kib: u64,
}

/// The benchmark's result. Times in milliseconds.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The parameters.
    pub spec: Spec,
    /// Bytes of generated TOML.
    pub config_bytes: usize,
    /// Time to generate the text (not part of any figure).
    pub generate_ms: f64,
    /// Threads the control plane may build tables on.
    pub threads: usize,
    /// `Config::parse`: TOML into the model, then validation.
    pub parse_validate_ms: Spread,
    /// `Control::new`: validation, every table built, the swap.
    pub build_swap_ms: Spread,
    /// Both: the first load of the configuration, from text.
    pub load_ms: Spread,
    /// The one-backend reload: parse + validate the changed text through
    /// the load's [`ParseCache`].
    pub reload_parse_ms: Spread,
    /// What that parse did (last run): elements, and how many were parsed
    /// again.
    pub reload_parse: ChunkStats,
    /// The peer: the changed text parsed whole, on one thread, no cache
    /// (`Config::parse_whole`, what every parse was before the pieces).
    pub reload_parse_uncached_ms: Spread,
    /// The one-backend reload: `Control::apply` (validation, rebuilding
    /// what changed, the swap).
    pub reload_apply_ms: Spread,
    /// Both: the one-backend reload from text.
    pub reload_ms: Spread,
    /// The peer: the changed configuration built whole by a fresh
    /// `Control::new`.
    pub full_rebuild_ms: Spread,
    /// reload_apply / full_rebuild, per run.
    pub incremental_over_full: Spread,
    /// `set_health(backend, false)` on the changed pool's first backend.
    pub health_down_ms: Spread,
    /// And back up.
    pub health_up_ms: Spread,
    /// `set_peer_up(peer, false)` on a `[fleet]` peer: the fragment-redirect
    /// part swapped, every Maglev table kept.
    pub peer_down_ms: Spread,
    /// And back up.
    pub peer_up_ms: Spread,
    /// Memory after the first load.
    pub memory: Memory,
    /// Load average (1, 5, 15 min) at the start.
    pub load_average: String,
}

fn rss_kib() -> u64 {
    // /proc/self/statm: size resident shared ... in pages.
    let page = rustix::param::page_size() as u64;
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .nth(1)
                .and_then(|r| r.parse::<u64>().ok())
        })
        .map_or(0, |pages| pages * page / 1024)
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// Runs the benchmark; `progress` hears what is being measured.
pub fn run(spec: &Spec, progress: &mut dyn FnMut(&str)) -> Result<Report, Error> {
    spec.check()?;
    let load_average = crate::proc::load_averages();
    progress("generating the configuration");
    let t = Instant::now();
    let text = spec.config_text(false);
    let changed_text = spec.config_text(true);
    let generate_ms = ms(t) / 2.0;
    let (ci, cj) = spec.changed();
    let health_name = spec
        .backend(ci, if cj == 0 { 1 } else { 0 }, false)
        .to_string();
    let mut f: [Vec<f64>; 13] = Default::default();
    let mut reload_parse = ChunkStats::default();
    let mut memory = None;
    for run in 0..spec.runs {
        progress(&format!("run {} of {}: load", run + 1, spec.runs));
        let rss0 = rss_kib();
        let t = Instant::now();
        let mut cache = ParseCache::new();
        let cfg = Config::parse_with(&text, "bench.toml", &mut cache)?;
        let parse = ms(t);
        let t = Instant::now();
        let mut control = Control::new(cfg)?;
        let build = ms(t);
        let rss1 = rss_kib();
        f[0].push(parse);
        f[1].push(build);
        f[2].push(parse + build);

        progress(&format!(
            "run {} of {}: one-backend reload",
            run + 1,
            spec.runs
        ));
        let t = Instant::now();
        let changed = Config::parse_with(&changed_text, "bench.toml", &mut cache)?;
        let reparse = ms(t);
        reload_parse = cache.last();
        let t = Instant::now();
        let uncached = Config::parse_whole(&changed_text, "bench.toml")?;
        f[12].push(ms(t));
        if uncached != changed {
            return Err(Error::Spec(
                "the changed text parsed through the cache and afresh differ".into(),
            ));
        }
        drop(uncached);
        let t = Instant::now();
        control.apply(changed.clone())?;
        let apply = ms(t);
        let rss2 = rss_kib();
        f[3].push(reparse);
        f[4].push(apply);
        f[5].push(reparse + apply);

        progress(&format!(
            "run {} of {}: full rebuild (fresh control plane)",
            run + 1,
            spec.runs
        ));
        let t = Instant::now();
        let fresh = Control::new(changed)?;
        let full = ms(t);
        f[6].push(full);
        f[7].push(apply / full);
        {
            let (a, b) = (control.tables().load_full(), fresh.tables().load_full());
            if let Some((x, _)) = a
                .vips
                .iter()
                .zip(&b.vips)
                .find(|(x, y)| x.fingerprint != y.fingerprint)
            {
                return Err(Error::Mismatch(x.name.clone()));
            }
        }
        drop(fresh);

        progress(&format!("run {} of {}: health change", run + 1, spec.runs));
        let t = Instant::now();
        let known = control.set_health(&health_name, false);
        f[8].push(ms(t));
        let t = Instant::now();
        control.set_health(&health_name, true);
        f[9].push(ms(t));
        if !known {
            return Err(Error::Spec(format!("no backend {health_name}")));
        }

        progress(&format!(
            "run {} of {}: fleet peer change",
            run + 1,
            spec.runs
        ));
        let peer = std::net::IpAddr::V4(Spec::PEERS[0]);
        let t = Instant::now();
        let known = control.set_peer_up(peer, false);
        f[10].push(ms(t));
        let t = Instant::now();
        control.set_peer_up(peer, true);
        f[11].push(ms(t));
        if !known {
            return Err(Error::Spec(format!("no [fleet] peer {peer}")));
        }

        if memory.is_none() {
            let m = control.tables().load().memory();
            let per: Vec<f64> = m.per_vip.iter().map(|&b| b as f64).collect();
            memory = Some(Memory {
                per_vip_bytes: Spread::of(&per),
                distinct_tables: m.distinct_tables,
                tables_bytes: m.tables,
                total_bytes: m.total,
                rss_growth_kib: rss1.saturating_sub(rss0),
                rss_growth_reload_kib: rss2.saturating_sub(rss1),
            });
        }
    }
    let s = |i: usize| Spread::of(&f[i]);
    Ok(Report {
        spec: spec.clone(),
        config_bytes: text.len(),
        generate_ms,
        threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        parse_validate_ms: s(0),
        build_swap_ms: s(1),
        load_ms: s(2),
        reload_parse_ms: s(3),
        reload_parse,
        reload_parse_uncached_ms: s(12),
        reload_apply_ms: s(4),
        reload_ms: s(5),
        full_rebuild_ms: s(6),
        incremental_over_full: s(7),
        health_down_ms: s(8),
        health_up_ms: s(9),
        peer_down_ms: s(10),
        peer_up_ms: s(11),
        memory: memory.ok_or_else(|| Error::Spec("no run".into()))?,
        load_average,
    })
}

impl Report {
    /// As tables for people.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let s = &self.spec;
        let _ = writeln!(
            out,
            "Control plane: {} VIPs x {} backends (own pool each), M = {}, {:.1} MB of TOML \
             (generated in {:.0} ms, outside every figure); {} runs; {} build threads; load average {}\n",
            s.vips,
            s.backends,
            s.table_size,
            self.config_bytes as f64 / 1e6,
            self.generate_ms,
            s.runs,
            self.threads,
            self.load_average
        );
        let mut t = Table::new(["step", "min ms", "median ms", "max ms"]);
        for (what, x) in [
            ("parse + validate", &self.parse_validate_ms),
            ("build + swap (Control::new)", &self.build_swap_ms),
            ("LOAD from text (goal <= 1000 ms)", &self.load_ms),
            (
                "reload: parse + validate (changed elements only)",
                &self.reload_parse_ms,
            ),
            (
                "reload: parse + validate, whole text, 1 thread (peer)",
                &self.reload_parse_uncached_ms,
            ),
            ("reload: apply (one table rebuilt)", &self.reload_apply_ms),
            (
                "RELOAD one backend from text (goal <= 100 ms)",
                &self.reload_ms,
            ),
            (
                "full rebuild of the same config (fresh Control)",
                &self.full_rebuild_ms,
            ),
            ("health: one backend down", &self.health_down_ms),
            ("health: back up", &self.health_up_ms),
            ("[fleet] peer down (no table rebuilt)", &self.peer_down_ms),
            ("[fleet] peer back up", &self.peer_up_ms),
        ] {
            let [a, b, c] = x.text(1);
            t.row([what.to_string(), a, b, c]);
        }
        let [a, b, c] = self.incremental_over_full.text(3);
        t.row(["reload apply / full rebuild (ratio)".to_string(), a, b, c]);
        let _ = writeln!(out, "{t}");
        let p = &self.reload_parse;
        let _ = writeln!(
            out,
            "The reload parsed {} of the file's {} [[pools]]/[[vips]] elements again{}.\n",
            p.parsed,
            p.chunks,
            if p.whole {
                " (the file could not be split: parsed whole)"
            } else {
                ""
            }
        );
        let m = &self.memory;
        let kib = |b: f64| format!("{:.1}", b / 1024.0);
        let mut t = Table::new(["memory", "KiB"]);
        t.row([
            "per VIP (table + lists), min".to_string(),
            kib(m.per_vip_bytes.min),
        ]);
        t.row(["per VIP, median".to_string(), kib(m.per_vip_bytes.median)]);
        t.row(["per VIP, max".to_string(), kib(m.per_vip_bytes.max)]);
        t.row([
            format!("{} distinct Maglev tables", m.distinct_tables),
            kib(m.tables_bytes as f64),
        ]);
        t.row([
            "snapshot total (tables once, lists, registry)".to_string(),
            kib(m.total_bytes as f64),
        ]);
        t.row([
            "RSS growth over the first load (run 1)".to_string(),
            m.rss_growth_kib.to_string(),
        ]);
        t.row([
            "RSS growth over the reload (run 1)".to_string(),
            m.rss_growth_reload_kib.to_string(),
        ]);
        let _ = writeln!(out, "{t}");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_generated_config_is_valid_and_the_change_touches_one_backend() {
        let spec = Spec {
            vips: 4,
            backends: 3,
            table_size: 251,
            runs: 1,
        };
        let a = Config::parse(&spec.config_text(false), "a").unwrap();
        let b = Config::parse(&spec.config_text(true), "b").unwrap();
        assert_eq!(a.vips.len(), 4);
        assert!(a.pools.iter().all(|p| p.backends.len() == 3));
        let differ: Vec<_> = a
            .pools
            .iter()
            .zip(&b.pools)
            .flat_map(|(p, q)| p.backends.iter().zip(&q.backends))
            .filter(|(x, y)| x != y)
            .collect();
        assert_eq!(differ.len(), 1);
    }

    #[test]
    fn a_small_run_reports_every_figure() {
        let spec = Spec {
            vips: 3,
            backends: 4,
            table_size: 251,
            runs: 2,
        };
        let r = run(&spec, &mut |_| {}).unwrap();
        assert_eq!(r.memory.distinct_tables, 3);
        assert!(r.memory.per_vip_bytes.min >= 251.0 * 4.0);
        assert!(r.load_ms.min > 0.0 && r.full_rebuild_ms.max > 0.0);
        assert!(r.peer_down_ms.min > 0.0 && r.peer_up_ms.min > 0.0);
        assert!(r.to_text().contains("RELOAD one backend"));
        // 3 pools + 3 VIPs; the reload parsed only the changed pool.
        assert_eq!(
            r.reload_parse,
            ChunkStats {
                chunks: 6,
                parsed: 1,
                whole: false
            }
        );
    }
}
