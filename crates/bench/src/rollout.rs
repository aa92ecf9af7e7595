//! `fastpath lb fleet-sim --rollout`: one configuration push through etcd
//! to a fleet of `N` load balancers, modelled; and what the etcd cluster
//! must sustain for it.
//!
//! # What the fleet does (the model's assumptions)
//!
//! Each load balancer reads the whole prefix once, in one range request,
//! at start and after any reconnect or watch compaction (a *re-list*),
//! then watches the prefix: etcd sends every watcher every event under
//! it, so a push costs each watcher the bytes of the keys it changed. A
//! push is one transaction when it fits etcd's bounds (`--max-txn-ops`,
//! 128 by default; `--max-request-bytes`, 1.5 MiB) and otherwise staged:
//! a marker transaction, the keys in transactions that each fit (keeping
//! [`REQUEST_MARGIN_BYTES`] of the request bound for framing), then one
//! finishing transaction (guard and order key written, marker deleted).
//! Load balancers apply at the finishing revision: they merge their local
//! file, parse and validate (the daemon's check), rebuild the Maglev
//! tables of the changed pools and swap. The key sizes come from
//! [`fleetconf::split`] of a generated configuration (the same generator
//! as `bench-control`), so they are the real layout's.
//!
//! # Time to applied
//!
//! `commit`: the push's transactions one after another, each
//! [`Inputs::txn_ms`]. `fan-out`: each member serves its watchers one
//! after another (uniformly over the member's work), each watcher costing
//! [`Inputs::event_us`] per revision plus its bytes at the lower of the
//! member's egress bandwidth and its measured serve rate. Every load
//! balancer then applies on its own machine ([`ApplyTimes`], measured).
//! The watchers of a member are spread over `members` only if the load
//! balancers start from different endpoints; the daemon's store starts
//! every call at the first endpoint of its list, so with one list for the
//! whole fleet every watcher sits on one member ([`Inputs::spread`]).
//!
//! # The re-list storm
//!
//! After a leader loss every watch ends at once; each load balancer
//! retries with the daemon's backoff (100 ms, doubling to 2 s) and, once
//! the cluster answers again, re-lists the whole prefix. The storm is
//! simulated event by event: a member serves re-lists one after another
//! at its serve rate; a re-list not answered within the client's deadline
//! fails and its load balancer backs off and tries again (one the member
//! had begun is finished, wasted; one still waiting is dropped). Serving
//! them one after another is the optimistic order: etcd serves them
//! concurrently, sharing the member, so that under a burst each one takes
//! about the whole burst's time. Without jitter every load balancer retries at the
//! same instants; with jitter (a wait drawn from `[b/2, b]` for backoff
//! `b`) the retries spread.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use lb::config::{Config, ConfigError, ParseCache};
use lb::tables::Control;
use maglev::eval::SplitMix;
use measure::plot::{line_chart, Labels, PlotError, Series};
use measure::{median, Table};
use serde::Serialize;

use crate::control::Spec as ConfigSpec;

/// etcd's default `--max-txn-ops`.
pub const ETCD_MAX_TXN_OPS: usize = fleetconf::ETCD_DEFAULT_MAX_TXN_OPS;
/// etcd's default `--max-request-bytes` (1.5 MiB).
pub const ETCD_MAX_REQUEST_BYTES: usize = fleetconf::ETCD_DEFAULT_MAX_REQUEST_BYTES;
/// What a staged push leaves of the request bound for the request's own
/// framing (keys and values are counted, the rest is not).
pub const REQUEST_MARGIN_BYTES: usize = 64 * 1024;
/// The bytes of the guard key's push record (JSON: who, when, hash,
/// revisions) and of the marker's: about this much.
pub const RECORD_BYTES: usize = 160;
/// The prefix the model's keys live under.
pub const PREFIX: &str = "/fastpath/fleet";
/// The daemon's first wait before reconnecting (`lbd::tasks::etcd`).
pub const MIN_BACKOFF_MS: f64 = 100.0;
/// The daemon's longest wait before reconnecting.
pub const MAX_BACKOFF_MS: f64 = 2000.0;
/// How often a quiet watch is backed by a small read, per load balancer.
pub const PING_EVERY_MS: f64 = 1000.0;
/// `lb run --etcd-timeout-ms`'s default: every etcd call's deadline.
pub const DEADLINE_MS: f64 = 5000.0;
/// The window in which storm arrivals are counted for the peak rate.
pub const WINDOW_MS: f64 = 100.0;
/// How long the storm simulation runs before calling it unconverged.
pub const STORM_HORIZON_MS: f64 = 120_000.0;

/// What went wrong in the model or its measurement.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The generated configuration does not split into keys.
    #[error("splitting the generated configuration: {0}")]
    Layout(#[from] fleetconf::LayoutError),
    /// The generated configuration was refused.
    #[error("the generated configuration: {0}")]
    Config(#[from] ConfigError),
    /// A key larger than one staged transaction may carry.
    #[error("key {key} has {bytes} bytes, more than one transaction may carry ({max} = --max-request-bytes less {REQUEST_MARGIN_BYTES} of framing)")]
    KeyTooLarge {
        /// The key.
        key: String,
        /// Its bytes.
        bytes: usize,
        /// The bound.
        max: usize,
    },
    /// A parameter is out of range.
    #[error("{0}")]
    Spec(String),
    /// A plot could not be written.
    #[error(transparent)]
    Plot(#[from] PlotError),
    /// The plot directory could not be created.
    #[error("cannot create plot directory {path}: {source}")]
    PlotDir {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// What a push changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PushKind {
    /// One backend's address in one pool: one pool key.
    OneBackend,
    /// A whole new pool with its VIP: two keys and the order key.
    NewPool,
    /// The first push of everything into an empty prefix.
    First,
}

impl PushKind {
    /// Every kind, in report order.
    pub const ALL: [PushKind; 3] = [PushKind::OneBackend, PushKind::NewPool, PushKind::First];

    /// The name on the command line and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            PushKind::OneBackend => "one-backend",
            PushKind::NewPool => "new-pool",
            PushKind::First => "first",
        }
    }
}

/// A figure the model uses, with where it came from.
#[derive(Debug, Clone, Serialize)]
pub struct Figure {
    /// The value.
    pub value: f64,
    /// Where it came from (a measurement here, a default, an assumption).
    pub from: String,
}

impl Figure {
    /// `value`, from `from`.
    pub fn new(value: f64, from: impl Into<String>) -> Figure {
        Figure {
            value,
            from: from.into(),
        }
    }
}

/// A load balancer's time to apply a push, per kind (ms): merge with the
/// local file, parse and validate, rebuild, swap.
#[derive(Debug, Clone, Serialize)]
pub struct ApplyTimes {
    /// One backend changed.
    pub one_backend: Figure,
    /// A new pool and VIP.
    pub new_pool: Figure,
    /// Everything, into a load balancer that had nothing.
    pub first: Figure,
    /// Bytes of the Maglev tables and lists of one load balancer.
    pub table_bytes: Figure,
    /// Bytes of one pool's Maglev table (what a changed pool holds twice
    /// during the swap).
    pub one_table_bytes: Figure,
    /// Where the one-backend push's time goes (ms): merging the fleet's
    /// text with the local file, checking it, applying it (rebuild, swap).
    pub one_backend_parts: [f64; 3],
}

impl ApplyTimes {
    /// The time for `kind`.
    pub fn of(&self, kind: PushKind) -> &Figure {
        match kind {
            PushKind::OneBackend => &self.one_backend,
            PushKind::NewPool => &self.new_pool,
            PushKind::First => &self.first,
        }
    }
}

/// The configuration's size: what generates it.
#[derive(Debug, Clone, Serialize)]
pub struct Shape {
    /// VIPs, each over its own pool.
    pub vips: usize,
    /// Backends per pool.
    pub backends: usize,
    /// Maglev table size M (prime).
    pub table_size: u64,
}

impl Default for Shape {
    fn default() -> Self {
        Shape {
            vips: 1000,
            backends: 100,
            table_size: u64::from(maglev::DEFAULT_TABLE_SIZE),
        }
    }
}

impl Shape {
    fn spec(&self, vips: usize) -> ConfigSpec {
        ConfigSpec {
            vips,
            backends: self.backends,
            table_size: self.table_size,
            runs: 1,
        }
    }

    /// The configuration's text before a push of `kind` and after it.
    pub fn texts(&self, kind: PushKind) -> (String, String) {
        let base = self.spec(self.vips);
        match kind {
            PushKind::OneBackend => (base.config_text(false), base.config_text(true)),
            PushKind::NewPool => (
                base.config_text(false),
                self.spec(self.vips + 1).config_text(false),
            ),
            PushKind::First => (String::new(), base.config_text(false)),
        }
    }
}

fn keys_of(text: &str) -> Result<Vec<(String, String)>, Error> {
    if text.is_empty() {
        return Ok(Vec::new());
    }
    Ok(fleetconf::split(text)?)
}

fn full(rel: &str) -> String {
    format!("{PREFIX}/{rel}")
}

/// How a push is written: one transaction or staged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Plan {
    /// Puts and deletes of configuration keys (the guard not counted).
    pub ops: usize,
    /// Their bytes (keys and values).
    pub bytes: usize,
    /// Whether it needs more than one transaction.
    pub staged: bool,
    /// Transactions (1, or marker + chunks + finishing).
    pub transactions: usize,
    /// The `--max-txn-ops` that one transaction would need.
    pub single_max_txn_ops: usize,
    /// The `--max-request-bytes` that one transaction would need
    /// (with [`REQUEST_MARGIN_BYTES`] for framing).
    pub single_max_request_bytes: usize,
}

/// Plans a push whose operations carry `ops` bytes each (key + value;
/// a delete its key), under etcd's bounds.
pub fn plan(ops: &[(String, usize)], max_ops: usize, max_bytes: usize) -> Result<Plan, Error> {
    let bytes: usize = ops.iter().map(|(_, b)| b).sum();
    let guard = full(fleetconf::GUARD_KEY).len() + RECORD_BYTES;
    let single_ops = ops.len() + 1;
    let single_bytes = bytes + guard;
    let mut p = Plan {
        ops: ops.len(),
        bytes,
        staged: false,
        transactions: 1,
        single_max_txn_ops: single_ops,
        single_max_request_bytes: single_bytes + REQUEST_MARGIN_BYTES,
    };
    if single_ops <= max_ops && single_bytes <= max_bytes {
        return Ok(p);
    }
    let room = max_bytes.saturating_sub(REQUEST_MARGIN_BYTES);
    let (mut chunks, mut n, mut b) = (0usize, 0usize, 0usize);
    for (key, size) in ops {
        if *size > room {
            return Err(Error::KeyTooLarge {
                key: key.clone(),
                bytes: *size,
                max: room,
            });
        }
        if n == 0 || n + 1 > max_ops || b + size > room {
            chunks += 1;
            n = 0;
            b = 0;
        }
        n += 1;
        b += size;
    }
    p.staged = true;
    p.transactions = 1 + chunks + 1;
    Ok(p)
}

/// What one push puts on the wire, per watcher.
#[derive(Debug, Clone, Serialize)]
pub struct Delta {
    /// The push's kind.
    pub kind: PushKind,
    /// Keys put or deleted (configuration keys, order key included).
    pub keys: usize,
    /// Bytes of those keys and values, plus the guard's (and the
    /// marker's twice, when staged): what each watcher receives.
    pub bytes: usize,
    /// Events each watcher receives.
    pub events: usize,
    /// Revisions the push makes (each a watch response).
    pub revisions: usize,
    /// How it is written.
    pub plan: Plan,
}

/// The prefix and one push of each kind, from the real layout.
#[derive(Debug, Clone, Serialize)]
pub struct Sizes {
    /// The shape.
    pub shape: Shape,
    /// Bytes of the configuration's TOML.
    pub config_bytes: usize,
    /// Keys under the prefix.
    pub keys: usize,
    /// Bytes of every key and value under the prefix: what a re-list
    /// returns (without the response's framing).
    pub prefix_bytes: usize,
    /// The largest key and value.
    pub largest_key_bytes: usize,
    /// The pushes.
    pub deltas: Vec<Delta>,
}

impl Sizes {
    /// Generates the configuration for `shape` and each push, splits them
    /// with [`fleetconf::split`] and plans the pushes under etcd's bounds.
    pub fn of(shape: &Shape, max_ops: usize, max_bytes: usize) -> Result<Sizes, Error> {
        if shape.vips == 0 || shape.backends == 0 {
            return Err(Error::Spec(
                "--vips and --backends must be at least 1".into(),
            ));
        }
        let mut deltas = Vec::new();
        let mut prefix = None;
        for kind in PushKind::ALL {
            let (old, new) = shape.texts(kind);
            let (old_keys, new_keys) = (keys_of(&old)?, keys_of(&new)?);
            if kind == PushKind::OneBackend {
                // The prefix: the configuration before the push.
                let sized: Vec<usize> = old_keys
                    .iter()
                    .map(|(k, v)| full(k).len() + v.len())
                    .collect();
                prefix = Some((
                    old.len(),
                    old_keys.len(),
                    sized.iter().sum::<usize>(),
                    sized.iter().copied().max().unwrap_or(0),
                ));
            }
            let before: std::collections::HashMap<&str, &str> = old_keys
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            let mut ops: Vec<(String, usize)> = Vec::new();
            for (k, v) in &new_keys {
                if before.get(k.as_str()) != Some(&v.as_str()) {
                    let f = full(k);
                    let n = f.len() + v.len();
                    ops.push((f, n));
                }
            }
            let kept: std::collections::HashSet<&str> =
                new_keys.iter().map(|(k, _)| k.as_str()).collect();
            for (k, _) in &old_keys {
                if !kept.contains(k.as_str()) {
                    let f = full(k);
                    let n = f.len();
                    ops.push((f, n));
                }
            }
            let p = plan(&ops, max_ops, max_bytes)?;
            let record = full(fleetconf::GUARD_KEY).len() + RECORD_BYTES;
            let (events, bytes, revisions) = if p.staged {
                // Marker put, the keys, guard put, marker delete.
                (p.ops + 3, p.bytes + 3 * record, p.transactions)
            } else {
                (p.ops + 1, p.bytes + record, 1)
            };
            deltas.push(Delta {
                kind,
                keys: p.ops,
                bytes,
                events,
                revisions,
                plan: p,
            });
        }
        let (config_bytes, keys, prefix_bytes, largest_key_bytes) =
            prefix.ok_or_else(|| Error::Spec("no configuration".into()))?;
        Ok(Sizes {
            shape: shape.clone(),
            config_bytes,
            keys,
            prefix_bytes,
            largest_key_bytes,
            deltas,
        })
    }

    /// The push of `kind`.
    pub fn delta(&self, kind: PushKind) -> &Delta {
        self.deltas
            .iter()
            .find(|d| d.kind == kind)
            .unwrap_or(&self.deltas[0])
    }
}

fn ms_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

fn med(xs: &mut [f64]) -> f64 {
    median(xs)
}

/// Measures [`ApplyTimes`] in this process: for each kind, over `runs`
/// runs, the fleet's text merged with an empty local file
/// ([`fleetconf::merge`]), checked as the daemon checks a reload
/// ([`Config::check_text`] through the running configuration's
/// [`ParseCache`]) and applied ([`Control::apply`]: the changed pools'
/// tables rebuilt, the swap); the first push is a fresh
/// [`Control::new`]. Medians are reported.
pub fn measure_apply(
    shape: &Shape,
    runs: usize,
    progress: &mut dyn FnMut(&str),
) -> Result<ApplyTimes, Error> {
    let runs = runs.max(1);
    let cpu = cpu_name();
    let (base, one) = shape.texts(PushKind::OneBackend);
    let (_, pool) = shape.texts(PushKind::NewPool);
    let (mut first, mut t_one, mut t_pool) = (Vec::new(), Vec::new(), Vec::new());
    let mut memory = (0usize, 0usize);
    let mut parts: [Vec<f64>; 3] = Default::default();
    for run in 0..runs {
        progress(&format!("apply time, run {} of {runs}", run + 1));
        let mut cache = ParseCache::new();
        let t = Instant::now();
        let text = fleetconf::merge("", &base)?;
        let checked = Config::check_text(text, "fleet", &mut cache)?;
        let mut control = Control::new(checked.config)?;
        first.push(ms_since(t));
        let m = control.tables().load().memory();
        memory = (m.total, m.tables / m.distinct_tables.max(1));
        // One backend, back to the base (not timed), then a new pool.
        for (text, out) in [(&one, Some(0)), (&base, None), (&pool, Some(1))] {
            let t = Instant::now();
            let merged = fleetconf::merge("", text)?;
            let merge = ms_since(t);
            let checked = Config::check_text(merged, "fleet", &mut cache)?;
            let check = ms_since(t) - merge;
            control.apply(checked.config)?;
            match out {
                Some(0) => {
                    t_one.push(ms_since(t));
                    parts[0].push(merge);
                    parts[1].push(check);
                    parts[2].push(ms_since(t) - merge - check);
                }
                Some(_) => t_pool.push(ms_since(t)),
                None => {}
            }
        }
    }
    let from = |what: &str| {
        format!(
            "measured here: {what}, median of {runs} runs in this process ({} VIPs x {} backends, M = {}; {cpu})",
            shape.vips, shape.backends, shape.table_size
        )
    };
    Ok(ApplyTimes {
        one_backend: Figure::new(
            med(&mut t_one),
            from("merge + check + Control::apply, one backend changed"),
        ),
        new_pool: Figure::new(
            med(&mut t_pool),
            from("merge + check + Control::apply, one pool and VIP added"),
        ),
        first: Figure::new(
            med(&mut first),
            from("merge + check + Control::new, everything"),
        ),
        table_bytes: Figure::new(
            memory.0 as f64,
            from("Tables::memory().total after the first load"),
        ),
        one_table_bytes: Figure::new(memory.1 as f64, from("one distinct Maglev table's bytes")),
        one_backend_parts: parts.map(|mut p| med(&mut p)),
    })
}

/// This machine's CPU, from /proc/cpuinfo, with the number of CPUs.
pub fn cpu_name() -> String {
    let model = crate::proc::cpu_model();
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    format!("{n} x {model}, this machine")
}

impl ApplyTimes {
    /// Apply times estimated without measuring (the unit tests' and a
    /// `--no-measure` run's): the medians of `fastpath lb bench-control`
    /// at 1,000 x 100 on the project's 2-core machine (BENCHMARKS.md),
    /// scaled by the number of elements; tables of `M` u32 slots.
    pub fn estimated(shape: &Shape) -> ApplyTimes {
        let scale = (shape.vips * shape.backends) as f64 / 100_000.0;
        let from = "estimated: bench-control's 1,000 x 100 figures (BENCHMARKS.md), scaled by VIPs x backends";
        let table = shape.table_size as f64 * 4.0;
        ApplyTimes {
            one_backend: Figure::new(60.0, from),
            new_pool: Figure::new(62.0, from),
            first: Figure::new(666.0 * scale, from),
            table_bytes: Figure::new(
                shape.vips as f64 * (table + shape.backends as f64 * 12.0),
                "estimated: M x 4 bytes per pool plus the backend lists",
            ),
            one_table_bytes: Figure::new(table, "estimated: M x 4 bytes"),
            one_backend_parts: [f64::NAN; 3],
        }
    }
}

/// Everything the model takes.
#[derive(Debug, Clone, Serialize)]
pub struct Inputs {
    /// Load balancers N (each one watcher, on its own machine).
    pub lbs: usize,
    /// The configuration.
    pub shape: Shape,
    /// The push modelled.
    pub push: PushKind,
    /// etcd members.
    pub members: usize,
    /// Whether the watchers are spread over the members (each load
    /// balancer's endpoint list starting elsewhere); otherwise all on one.
    pub spread: bool,
    /// Pushes per second the cluster must sustain.
    pub push_rate: f64,
    /// `--max-txn-ops`.
    pub max_txn_ops: usize,
    /// `--max-request-bytes`.
    pub max_request_bytes: usize,
    /// Apply times (measured or estimated).
    pub apply: ApplyTimes,
    /// One transaction's round trip, put to committed (ms).
    pub txn_ms: Figure,
    /// Put to the first watcher's receipt (ms).
    pub first_event_ms: Figure,
    /// A member's cost per watcher per revision delivered (µs), beyond
    /// the bytes.
    pub event_us: Figure,
    /// A member's serve rate of response bytes (re-lists, and the bytes
    /// of large watch responses), MB/s.
    pub serve_mb_s: Figure,
    /// A member's egress bandwidth, MB/s.
    pub bandwidth_mb_s: Figure,
    /// How long the cluster does not answer after a leader loss (ms).
    pub outage_ms: Figure,
    /// Each etcd call's deadline (ms).
    pub deadline_ms: f64,
    /// Seed of the jittered storm.
    pub seed: u64,
}

/// The etcd figures measured on this project's machine
/// (`by_hand_watch_fanout_and_relist`, BENCHMARKS.md), the model's
/// defaults.
pub mod measured {
    /// Where they come from.
    pub const FROM: &str =
        "measured here: by_hand_watch_fanout_and_relist (BENCHMARKS.md, 2026-11-29), 2-core machine, etcd 3.4, 1 member";
    /// Put round trip, ms (100 watchers; median of the p50s of 3 runs).
    pub const TXN_MS: f64 = 1.5;
    /// Put to the first watcher's receipt, ms (1,000 watchers; median of
    /// the p50s of 3 runs).
    pub const FIRST_EVENT_MS: f64 = 3.0;
    /// Per watcher per revision, µs: (last receipt - first) / watchers at
    /// 1,000 watchers, median of 3 runs; the test's one client thread
    /// decodes every watcher's event on the same 2 cores, so this is an
    /// upper bound of etcd's own cost.
    pub const EVENT_US: f64 = 20.6;
    /// Re-list serve rate, MB/s: 100 load balancers re-listing 3.43 MB
    /// at once with 1,000 watchers open, median of 3 runs.
    pub const SERVE_MB_S: f64 = 159.0;
    /// The bytes of the value each measured revision carried (one pool's
    /// key at 100 backends).
    pub const EVENT_BYTES: f64 = 3006.0;
}

impl Inputs {
    /// The defaults: 1,000 load balancers, 1,000 VIPs x 100 backends, a
    /// one-backend push, 3 members, one push a second, etcd's default
    /// bounds, the measured etcd figures ([`measured`]) and `apply`.
    pub fn new(apply: ApplyTimes) -> Inputs {
        let m = |v| Figure::new(v, measured::FROM);
        Inputs {
            lbs: 1000,
            shape: Shape::default(),
            push: PushKind::OneBackend,
            members: 3,
            spread: false,
            push_rate: 1.0,
            max_txn_ops: ETCD_MAX_TXN_OPS,
            max_request_bytes: ETCD_MAX_REQUEST_BYTES,
            apply,
            txn_ms: m(measured::TXN_MS),
            first_event_ms: m(measured::FIRST_EVENT_MS),
            event_us: m(measured::EVENT_US),
            serve_mb_s: m(measured::SERVE_MB_S),
            bandwidth_mb_s: Figure::new(1250.0, "assumed: 10 Gb/s per member"),
            outage_ms: Figure::new(
                2000.0,
                "assumed: etcd's election timeout (1 s) and an election, twice over",
            ),
            deadline_ms: DEADLINE_MS,
            seed: 0x5eed,
        }
    }

    fn check(&self) -> Result<(), Error> {
        if self.lbs == 0 || self.lbs > 1_000_000 {
            return Err(Error::Spec(format!(
                "--lbs {} must be 1 to 1000000",
                self.lbs
            )));
        }
        if self.members == 0 || self.members > 7 {
            return Err(Error::Spec(format!(
                "--etcd-members {} must be 1 to 7",
                self.members
            )));
        }
        for (what, v) in [
            ("--push-rate", self.push_rate),
            ("serve rate", self.serve_mb_s.value),
            ("bandwidth", self.bandwidth_mb_s.value),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(Error::Spec(format!("{what} must be above 0 (is {v})")));
            }
        }
        Ok(())
    }

    /// The watchers on the busiest member.
    pub fn watchers_per_member(&self) -> usize {
        if self.spread {
            self.lbs.div_ceil(self.members)
        } else {
            self.lbs
        }
    }
}

/// When the load balancers have applied a push (ms after the push starts).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Timing {
    /// The push's transactions committed.
    pub committed_ms: f64,
    /// Half the fleet applied.
    pub p50_ms: f64,
    /// 99% applied.
    pub p99_ms: f64,
    /// Every load balancer applied.
    pub all_ms: f64,
}

/// A re-list storm after a leader loss.
#[derive(Debug, Clone, Serialize)]
pub struct Storm {
    /// Jittered backoff.
    pub jitter: bool,
    /// Re-list requests that reached a member (failed ones included).
    pub relists: usize,
    /// Re-lists that waited past the deadline and were tried again.
    pub failed: usize,
    /// Bytes the members sent or computed for them (failed ones they had
    /// begun included).
    pub bytes: f64,
    /// The most re-lists that arrived in one [`WINDOW_MS`] window.
    pub peak_per_window: usize,
    /// The most re-lists waiting or being served at once, on the busiest
    /// member.
    pub peak_in_flight: usize,
    /// Their response bytes, were they all built at once (etcd builds a
    /// range response whole in memory).
    pub peak_in_flight_bytes: f64,
    /// Reconnect attempts during the outage, the most in one window.
    pub peak_attempts_per_window: usize,
    /// From the cluster answering again until every load balancer has
    /// re-listed (ms); `None`: not within the simulated horizon.
    pub converged_ms: Option<f64>,
}

/// What the etcd cluster must sustain.
#[derive(Debug, Clone, Serialize)]
pub struct Sustain {
    /// Watchers on the busiest member.
    pub watchers_per_member: usize,
    /// Egress of the busiest member at the push rate (MB/s).
    pub egress_mb_s: f64,
    /// Watch events per second the busiest member sends.
    pub events_per_s: f64,
    /// Quiet-watch pings (small reads) per second, over the cluster.
    pub pings_per_s: f64,
    /// The busiest member's time per push (ms): fan-out work at its serve
    /// rate; above 1,000 / push rate the member cannot keep up.
    pub member_busy_ms_per_push: f64,
    /// The largest push rate the busiest member keeps up with.
    pub max_push_rate: f64,
    /// What a first push needs in one transaction (flags).
    pub first_push_flags: String,
}

/// The model's answer.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The inputs, with where each came from.
    pub inputs: Inputs,
    /// The prefix and the pushes, from the real layout.
    pub sizes: Sizes,
    /// The push modelled.
    pub delta: Delta,
    /// Bytes etcd sends per push, over all watchers.
    pub bytes_per_push: f64,
    /// The same push had each load balancer re-read the whole prefix at
    /// every revision it is told of (the follower before it kept a
    /// mirror of the prefix), for comparison.
    pub reread_bytes_per_push: f64,
    /// Watch events per push, over all watchers.
    pub events_per_push: f64,
    /// Bytes of one re-list storm (every load balancer once).
    pub relist_storm_bytes: f64,
    /// When the fleet has applied.
    pub timing: Timing,
    /// Each push kind's timing, for comparison.
    pub timing_by_kind: Vec<(PushKind, Timing)>,
    /// The tables' bytes on each load balancer.
    pub table_bytes_per_lb: f64,
    /// At the swap: the old and new tables of the changed pools together.
    pub peak_swap_bytes_per_lb: f64,
    /// What the cluster must sustain.
    pub sustain: Sustain,
    /// The re-list storm without and with jitter.
    pub storms: Vec<Storm>,
}

/// A member's work per watcher for push `d` (ms): the measured cost of
/// one revision (which carried [`measured::EVENT_BYTES`]) per revision,
/// and the bytes beyond those at the member's rate.
fn per_watcher_ms(inp: &Inputs, d: &Delta) -> f64 {
    let rate = inp.serve_mb_s.value.min(inp.bandwidth_mb_s.value) * 1e6;
    let beyond = (d.bytes as f64 - d.revisions as f64 * measured::EVENT_BYTES).max(0.0);
    d.revisions as f64 * inp.event_us.value / 1e3 + beyond / rate * 1e3
}

/// The fan-out and apply timing of a push.
fn timing(inp: &Inputs, d: &Delta) -> Timing {
    // The first receipt was measured from the put's call: it includes the
    // last transaction's commit.
    let committed_ms = d.plan.transactions as f64 * inp.txn_ms.value;
    let before_last = (d.plan.transactions - 1) as f64 * inp.txn_ms.value;
    let w = inp.watchers_per_member() as f64;
    let per_watcher_ms = per_watcher_ms(inp, d);
    let apply = inp.apply.of(d.kind).value;
    let at =
        |q: f64| before_last + inp.first_event_ms.value + (q * w).ceil() * per_watcher_ms + apply;
    Timing {
        committed_ms,
        p50_ms: at(0.5),
        p99_ms: at(0.99),
        all_ms: at(1.0),
    }
}

/// Simulates the re-list storm after a leader loss: every watch ends at
/// 0, the cluster answers again at `outage_ms`.
pub fn storm(inp: &Inputs, prefix_bytes: usize, jitter: bool) -> Storm {
    let n = inp.lbs;
    let servers = if inp.spread { inp.members } else { 1 };
    let service_ms =
        prefix_bytes as f64 / (inp.serve_mb_s.value.min(inp.bandwidth_mb_s.value) * 1e6) * 1e3;
    let outage = inp.outage_ms.value;
    let mut rng = SplitMix::new(inp.seed);
    let mut wait = |b: f64| -> f64 {
        if jitter {
            let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
            b * (0.5 + 0.5 * u)
        } else {
            b
        }
    };
    // (time, lb, backoff), earliest first; times in µs for ordering.
    let mut heap: BinaryHeap<Reverse<(u64, usize)>> = BinaryHeap::new();
    let mut backoff = vec![MIN_BACKOFF_MS; n];
    let us = |t: f64| (t * 1e3).round() as u64;
    for lb in 0..n {
        // The first attempt follows the failure after one backoff wait.
        heap.push(Reverse((us(wait(MIN_BACKOFF_MS)), lb)));
    }
    let mut free_at = vec![0.0f64; servers];
    // Per server: (arrival, finish) of the re-lists, for the peaks.
    let mut spans: Vec<Vec<(f64, f64)>> = vec![Vec::new(); servers];
    let mut arrivals = Vec::new();
    let mut attempts = Vec::new();
    let (mut relists, mut failed, mut done, mut last) = (0usize, 0usize, 0usize, 0.0f64);
    let mut served = 0usize;
    while let Some(Reverse((t_us, lb))) = heap.pop() {
        let t = t_us as f64 / 1e3;
        if t > STORM_HORIZON_MS {
            break;
        }
        let next_backoff = |b: f64| (b * 2.0).min(MAX_BACKOFF_MS);
        if t < outage {
            attempts.push(t);
            let b = backoff[lb];
            backoff[lb] = next_backoff(b);
            heap.push(Reverse((us(t + wait(backoff[lb])), lb)));
            continue;
        }
        relists += 1;
        arrivals.push(t);
        let s = lb % servers;
        let start = free_at[s].max(t);
        let finish = start + service_ms;
        if start - t < inp.deadline_ms {
            // Begun before the client gave up: the member finishes it.
            free_at[s] = finish;
            spans[s].push((t, finish));
            served += 1;
        } else {
            // Still waiting at the deadline: dropped unserved.
            spans[s].push((t, t + inp.deadline_ms));
        }
        if finish - t > inp.deadline_ms {
            // The client gave up at its deadline, backs off and tries
            // again.
            failed += 1;
            let b = backoff[lb];
            backoff[lb] = next_backoff(b);
            heap.push(Reverse((us(t + inp.deadline_ms + wait(backoff[lb])), lb)));
        } else {
            done += 1;
            last = last.max(finish);
        }
    }
    let peak_window = |xs: &mut Vec<f64>| -> usize {
        xs.sort_by(f64::total_cmp);
        let (mut best, mut j) = (0, 0);
        for i in 0..xs.len() {
            while xs[i] - xs[j] >= WINDOW_MS {
                j += 1;
            }
            best = best.max(i + 1 - j);
        }
        best
    };
    let mut peak_in_flight = 0;
    for sp in &spans {
        // Sweep: +1 at arrival, -1 at finish.
        let mut ev: Vec<(f64, i64)> = sp.iter().flat_map(|&(a, f)| [(a, 1), (f, -1)]).collect();
        ev.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let mut cur = 0i64;
        for (_, d) in ev {
            cur += d;
            peak_in_flight = peak_in_flight.max(cur as usize);
        }
    }
    Storm {
        jitter,
        relists,
        failed,
        bytes: served as f64 * prefix_bytes as f64,
        peak_per_window: peak_window(&mut arrivals),
        peak_in_flight,
        peak_in_flight_bytes: peak_in_flight as f64 * prefix_bytes as f64,
        peak_attempts_per_window: peak_window(&mut attempts),
        converged_ms: (done == n).then_some(last - outage),
    }
}

/// Runs the model on `inputs` (the key sizes generated and split here).
pub fn run(inputs: &Inputs) -> Result<Report, Error> {
    inputs.check()?;
    let sizes = Sizes::of(&inputs.shape, inputs.max_txn_ops, inputs.max_request_bytes)?;
    Ok(model(inputs, sizes))
}

/// The model on sizes already computed.
pub fn model(inputs: &Inputs, sizes: Sizes) -> Report {
    let inp = inputs;
    let n = inp.lbs as f64;
    let delta = sizes.delta(inp.push).clone();
    let timing_by_kind: Vec<(PushKind, Timing)> = sizes
        .deltas
        .iter()
        .map(|d| (d.kind, timing(inp, d)))
        .collect();
    let w = inp.watchers_per_member();
    let busy_ms = w as f64 * per_watcher_ms(inp, &delta);
    let first = sizes.delta(PushKind::First);
    let first_push_flags = if first.plan.staged {
        format!(
            "staged in {} transactions at --max-txn-ops {} --max-request-bytes {}; in one transaction it needs --max-txn-ops {} --max-request-bytes {} on every member",
            first.plan.transactions,
            inp.max_txn_ops,
            inp.max_request_bytes,
            first.plan.single_max_txn_ops,
            first.plan.single_max_request_bytes
        )
    } else {
        format!(
            "one transaction within --max-txn-ops {} --max-request-bytes {}",
            inp.max_txn_ops, inp.max_request_bytes
        )
    };
    let changed_tables = match delta.kind {
        PushKind::First => 0.0,
        _ => 1.0,
    };
    let storms = vec![
        storm(inp, sizes.prefix_bytes, false),
        storm(inp, sizes.prefix_bytes, true),
    ];
    Report {
        bytes_per_push: n * delta.bytes as f64,
        reread_bytes_per_push: n * delta.revisions as f64 * sizes.prefix_bytes as f64,
        events_per_push: n * delta.events as f64,
        relist_storm_bytes: n * sizes.prefix_bytes as f64,
        timing: timing(inp, &delta),
        timing_by_kind,
        table_bytes_per_lb: inp.apply.table_bytes.value,
        peak_swap_bytes_per_lb: inp.apply.table_bytes.value
            + changed_tables * inp.apply.one_table_bytes.value,
        sustain: Sustain {
            watchers_per_member: w,
            egress_mb_s: inp.push_rate * w as f64 * delta.bytes as f64 / 1e6,
            events_per_s: inp.push_rate * w as f64 * delta.events as f64,
            pings_per_s: n * 1e3 / PING_EVERY_MS,
            member_busy_ms_per_push: busy_ms,
            max_push_rate: 1e3 / busy_ms.max(1e-9),
            first_push_flags,
        },
        storms,
        delta,
        sizes,
        inputs: inputs.clone(),
    }
}

fn mb(b: f64) -> String {
    format!("{:.2} MB", b / 1e6)
}

impl Report {
    /// The human-readable report.
    pub fn to_text(&self) -> String {
        let i = &self.inputs;
        let s = &self.sizes;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "Rollout through etcd: {} load balancers, {} VIPs x {} backends (M = {}), {} push, {} etcd members ({})\n",
            i.lbs,
            s.shape.vips,
            s.shape.backends,
            s.shape.table_size,
            i.push.name(),
            i.members,
            if i.spread {
                "watchers spread over the members"
            } else {
                "every watcher on the first member: one endpoint list for the fleet"
            }
        );
        let mut t = Table::new(["input", "value", "from"]).title("Inputs");
        let rows: Vec<(&str, String, &str)> = vec![
            (
                "apply: one backend",
                format!("{:.1} ms", i.apply.one_backend.value),
                &i.apply.one_backend.from,
            ),
            (
                "apply: new pool",
                format!("{:.1} ms", i.apply.new_pool.value),
                &i.apply.new_pool.from,
            ),
            (
                "apply: first push",
                format!("{:.1} ms", i.apply.first.value),
                &i.apply.first.from,
            ),
            (
                "tables per LB",
                mb(i.apply.table_bytes.value),
                &i.apply.table_bytes.from,
            ),
            (
                "transaction round trip",
                format!("{:.2} ms", i.txn_ms.value),
                &i.txn_ms.from,
            ),
            (
                "put to first watcher",
                format!("{:.2} ms", i.first_event_ms.value),
                &i.first_event_ms.from,
            ),
            (
                "per watcher per revision",
                format!("{:.1} us", i.event_us.value),
                &i.event_us.from,
            ),
            (
                "member serve rate",
                format!("{:.0} MB/s", i.serve_mb_s.value),
                &i.serve_mb_s.from,
            ),
            (
                "member bandwidth",
                format!("{:.0} MB/s", i.bandwidth_mb_s.value),
                &i.bandwidth_mb_s.from,
            ),
            (
                "outage after a leader loss",
                format!("{:.0} ms", i.outage_ms.value),
                &i.outage_ms.from,
            ),
        ];
        for (a, b, c) in rows {
            t.row([a.to_string(), b, c.to_string()]);
        }
        let _ = writeln!(out, "{t}");
        let [m, c, r] = i.apply.one_backend_parts;
        if m.is_finite() {
            let _ = writeln!(
                out,
                "One-backend apply: merge with the local file {m:.1} ms, check {c:.1} ms, rebuild + swap {r:.1} ms.\n"
            );
        }
        let _ = writeln!(
            out,
            "Prefix: {} keys, {} ({} of TOML), largest key {} bytes; a re-list returns it whole.\n",
            s.keys,
            mb(s.prefix_bytes as f64),
            mb(s.config_bytes as f64),
            s.largest_key_bytes
        );
        let mut p = Table::new([
            "push",
            "keys",
            "bytes per watcher",
            "transactions",
            "bytes per push (all watchers)",
            "p50 applied",
            "p99 applied",
            "all applied",
        ])
        .title("Per push (etcd's default bounds unless overridden)");
        for d in &s.deltas {
            let tm = self
                .timing_by_kind
                .iter()
                .find(|(k, _)| *k == d.kind)
                .map(|(_, t)| *t)
                .unwrap_or(self.timing);
            p.row([
                d.kind.name().to_string(),
                d.keys.to_string(),
                d.bytes.to_string(),
                format!(
                    "{}{}",
                    d.plan.transactions,
                    if d.plan.staged { " (staged)" } else { "" }
                ),
                mb(i.lbs as f64 * d.bytes as f64),
                format!("{:.0} ms", tm.p50_ms),
                format!("{:.0} ms", tm.p99_ms),
                format!("{:.0} ms", tm.all_ms),
            ]);
        }
        let _ = writeln!(out, "{p}");
        let su = &self.sustain;
        let _ = writeln!(
            out,
            "What the etcd cluster must sustain ({} push, {}/s):",
            i.push.name(),
            i.push_rate
        );
        let _ = writeln!(
            out,
            "  watchers on the busiest member: {}",
            su.watchers_per_member
        );
        let _ = writeln!(
            out,
            "  its egress: {:.1} MB/s, {:.0} watch events/s; {:.0} ms of fan-out work per push (keeps up with {:.1} pushes/s)",
            su.egress_mb_s, su.events_per_s, su.member_busy_ms_per_push, su.max_push_rate
        );
        let _ = writeln!(
            out,
            "  quiet-watch pings: {:.0} small reads/s",
            su.pings_per_s
        );
        let _ = writeln!(out, "  first push: {}", su.first_push_flags);
        let _ = writeln!(
            out,
            "  per push: {} over all watchers (re-reading the prefix at every revision instead: {})",
            mb(self.bytes_per_push),
            mb(self.reread_bytes_per_push)
        );
        let _ = writeln!(
            out,
            "  memory per load balancer: tables {}, {} at the swap",
            mb(self.table_bytes_per_lb),
            mb(self.peak_swap_bytes_per_lb)
        );
        let mut st = Table::new([
            "backoff",
            "re-lists",
            "failed (deadline)",
            "peak per 100 ms",
            "peak in flight",
            "in-flight bytes",
            "all re-listed",
        ])
        .title(format!(
            "Re-list storm after a leader loss ({} per load balancer, {}; deadline {:.0} ms)",
            mb(s.prefix_bytes as f64),
            mb(self.relist_storm_bytes),
            i.deadline_ms
        ));
        for x in &self.storms {
            st.row([
                if x.jitter {
                    "100 ms..2 s, jittered"
                } else {
                    "100 ms..2 s, no jitter"
                }
                .to_string(),
                x.relists.to_string(),
                x.failed.to_string(),
                x.peak_per_window.to_string(),
                x.peak_in_flight.to_string(),
                mb(x.peak_in_flight_bytes),
                x.converged_ms.map_or_else(
                    || format!("not within {:.0} s", STORM_HORIZON_MS / 1e3),
                    |ms| format!("{:.0} ms", ms),
                ),
            ]);
        }
        let _ = write!(out, "{st}");
        out
    }

    /// Writes `fleet-rollout.svg` (time until every load balancer applied,
    /// per push kind, over N) and `fleet-rollout-bytes.svg` (MB etcd sends
    /// per push over N) into `dir` and returns their paths.
    pub fn plot(&self, dir: &Path) -> Result<Vec<PathBuf>, Error> {
        std::fs::create_dir_all(dir).map_err(|source| Error::PlotDir {
            path: dir.to_path_buf(),
            source,
        })?;
        let ns = [10usize, 30, 100, 300, 1000, 3000, 10000];
        let mut times = Vec::new();
        let mut bytes = Vec::new();
        for d in &self.sizes.deltas {
            let mut tp = Vec::new();
            let mut bp = Vec::new();
            for &n in &ns {
                let mut inp = self.inputs.clone();
                inp.lbs = n;
                tp.push((n as f64, timing(&inp, d).all_ms / 1e3));
                bp.push((n as f64, n as f64 * d.bytes as f64 / 1e6));
            }
            times.push(Series {
                label: d.kind.name().to_string(),
                points: tp,
            });
            bytes.push(Series {
                label: d.kind.name().to_string(),
                points: bp,
            });
        }
        let title = format!(
            "{} VIPs x {} backends, {} etcd members",
            self.sizes.shape.vips, self.sizes.shape.backends, self.inputs.members
        );
        let a = dir.join("fleet-rollout.svg");
        line_chart(
            &a,
            &Labels {
                title: &format!("Time until every LB applied: {title}"),
                x: "load balancers",
                y: "seconds",
            },
            &times,
        )?;
        let b = dir.join("fleet-rollout-bytes.svg");
        line_chart(
            &b,
            &Labels {
                title: &format!("Bytes etcd sends per push: {title}"),
                x: "load balancers",
                y: "MB per push",
            },
            &bytes,
        )?;
        Ok(vec![a, b])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> Shape {
        Shape {
            vips: 100,
            backends: 10,
            table_size: 251,
        }
    }

    fn inputs(lbs: usize) -> Inputs {
        let mut i = Inputs::new(ApplyTimes::estimated(&small()));
        i.shape = small();
        i.lbs = lbs;
        i
    }

    fn ops(n: usize, each: usize) -> Vec<(String, usize)> {
        (0..n).map(|i| (format!("k{i}"), each)).collect()
    }

    #[test]
    fn one_transaction_up_to_the_default_bounds_then_staged() {
        let (o, b) = (ETCD_MAX_TXN_OPS, ETCD_MAX_REQUEST_BYTES);
        // The guard is the 128th operation.
        let p = plan(&ops(127, 100), o, b).unwrap();
        assert!(!p.staged && p.transactions == 1, "{p:?}");
        let p = plan(&ops(128, 100), o, b).unwrap();
        assert!(p.staged, "{p:?}");
        // Marker, the 128 keys in one chunk, finishing (with the guard).
        assert_eq!(p.transactions, 3, "{p:?}");
        assert_eq!(p.single_max_txn_ops, 129);
        assert_eq!(plan(&ops(129, 100), o, b).unwrap().transactions, 4);
        // Bytes: one key filling the request with the guard fits ...
        let guard = full(fleetconf::GUARD_KEY).len() + RECORD_BYTES;
        let p = plan(&ops(1, b - guard), o, b).unwrap();
        assert!(!p.staged, "{p:?}");
        // ... one byte more does not, and no staged transaction can carry it.
        match plan(&ops(1, b - guard + 1), o, b) {
            Err(Error::KeyTooLarge { max, .. }) => assert_eq!(max, b - REQUEST_MARGIN_BYTES),
            other => panic!("{other:?}"),
        }
        // Two keys of 0.8 MiB: two chunks by bytes, not by operations.
        let p = plan(&ops(2, 800 * 1024), o, b).unwrap();
        assert!(p.staged && p.transactions == 4, "{p:?}");
        assert!(p.single_max_request_bytes > b);
        // 300 small keys: ceil(300 / 128) = 3 chunks.
        assert_eq!(plan(&ops(300, 10), o, b).unwrap().transactions, 5);
    }

    #[test]
    fn the_real_layout_gives_one_pool_key_per_backend_change_and_stages_the_first_push() {
        let s = Sizes::of(&small(), ETCD_MAX_TXN_OPS, ETCD_MAX_REQUEST_BYTES).unwrap();
        // 100 pools, 100 VIPs, [encap], [fleet], the order key.
        assert_eq!(s.keys, 203, "{s:?}");
        let one = s.delta(PushKind::OneBackend);
        assert_eq!(one.keys, 1, "{one:?}");
        assert!(!one.plan.staged && one.revisions == 1);
        let pool_key = s.largest_key_bytes;
        assert!(one.bytes <= pool_key + full(fleetconf::GUARD_KEY).len() + RECORD_BYTES);
        let new = s.delta(PushKind::NewPool);
        // The pool, its VIP and the order key (which lists every key).
        assert_eq!(new.keys, 3, "{new:?}");
        let first = s.delta(PushKind::First);
        assert_eq!(first.keys, 203);
        assert!(first.plan.staged, "{first:?}");
        assert_eq!(first.revisions, first.plan.transactions);
        assert!(first.bytes >= s.prefix_bytes);
        // Raised bounds: the first push fits one transaction.
        let raised = Sizes::of(&small(), 1000, 64 << 20).unwrap();
        assert!(!raised.delta(PushKind::First).plan.staged);
    }

    #[test]
    fn bytes_per_push_are_n_times_the_delta_and_grow_with_n() {
        let sizes = Sizes::of(&small(), ETCD_MAX_TXN_OPS, ETCD_MAX_REQUEST_BYTES).unwrap();
        let mut last: Option<Report> = None;
        for n in [1, 10, 100, 1000, 5000] {
            for kind in PushKind::ALL {
                let mut i = inputs(n);
                i.push = kind;
                let r = model(&i, sizes.clone());
                assert_eq!(r.bytes_per_push, n as f64 * sizes.delta(kind).bytes as f64);
                assert_eq!(r.relist_storm_bytes, n as f64 * sizes.prefix_bytes as f64);
            }
            let r = model(&inputs(n), sizes.clone());
            if let Some(prev) = &last {
                assert!(r.timing.all_ms > prev.timing.all_ms, "{n}");
                assert!(r.timing.p99_ms >= prev.timing.p99_ms, "{n}");
                assert!(r.sustain.egress_mb_s > prev.sustain.egress_mb_s, "{n}");
                assert!(r.sustain.max_push_rate < prev.sustain.max_push_rate, "{n}");
            }
            assert!(r.timing.p50_ms <= r.timing.p99_ms && r.timing.p99_ms <= r.timing.all_ms);
            // The re-read follower moves the whole prefix per revision.
            assert!(r.reread_bytes_per_push > 10.0 * r.bytes_per_push);
            last = Some(r);
        }
    }

    #[test]
    fn spreading_watchers_over_members_divides_the_busiest_members_work() {
        let sizes = Sizes::of(&small(), ETCD_MAX_TXN_OPS, ETCD_MAX_REQUEST_BYTES).unwrap();
        let one = model(&inputs(999), sizes.clone());
        let mut i = inputs(999);
        i.spread = true;
        let spread = model(&i, sizes);
        assert_eq!(one.sustain.watchers_per_member, 999);
        assert_eq!(spread.sustain.watchers_per_member, 333);
        assert!(spread.timing.all_ms < one.timing.all_ms);
        assert!((spread.sustain.egress_mb_s * 3.0 - one.sustain.egress_mb_s).abs() < 1e-6);
    }

    #[test]
    fn without_jitter_every_load_balancer_relists_at_once_and_jitter_spreads_it() {
        let mut i = inputs(1000);
        // 3.5 MB at 100 MB/s: 35 ms a re-list, 35 s for the fleet.
        let prefix = 3_500_000;
        let plain = storm(&i, prefix, false);
        let jittered = storm(&i, prefix, true);
        assert_eq!(plain.peak_per_window, 1000, "{plain:?}");
        assert_eq!(plain.peak_attempts_per_window, 1000, "{plain:?}");
        assert!(
            jittered.peak_per_window * 3 < plain.peak_per_window,
            "{jittered:?} vs {plain:?}"
        );
        // The first retries (100 ms, jittered to 50-100 ms) stay within
        // one window: jitter spreads the later, longer waits.
        assert!(jittered.peak_attempts_per_window <= plain.peak_attempts_per_window);
        // A re-list that waits past the deadline is tried again: work grows.
        assert!(plain.failed > 0 && plain.relists > 1000, "{plain:?}");
        assert!(plain.bytes >= 1000.0 * prefix as f64);
        // A re-list still waiting at its deadline is dropped, so the fleet
        // gets through, in rounds; the jittered one with fewer retries.
        let (p, j) = (plain.converged_ms.unwrap(), jittered.converged_ms.unwrap());
        assert!(p > i.deadline_ms && j > i.deadline_ms, "{p} {j}");
        assert!(jittered.failed < plain.failed, "{jittered:?} vs {plain:?}");
        // A small prefix: both converge, every load balancer once.
        i.lbs = 100;
        for j in [false, true] {
            let s = storm(&i, 10_000, j);
            assert_eq!((s.relists, s.failed), (100, 0), "{s:?}");
            assert!(s.converged_ms.is_some());
        }
    }

    #[test]
    fn a_longer_outage_or_more_load_balancers_never_converges_sooner() {
        let mut prev = 0.0;
        for n in [10, 100, 400] {
            let s = storm(&inputs(n), 1_000_000, false);
            let c = s.converged_ms.unwrap();
            assert!(c >= prev, "{n}: {c} < {prev}");
            prev = c;
        }
    }

    #[test]
    fn the_model_reproduces_the_measured_fan_out_it_was_fitted_on() {
        // by_hand_watch_fanout_and_relist, 1,000 watchers on one member,
        // one 3,006-byte put: every watcher had it after 21.9 / 24.2 /
        // 30.0 ms (3 runs). The model, without the apply time, for a
        // one-backend push (3,520 bytes a watcher, 1,000 VIPs x 100):
        let mut i = Inputs::new(ApplyTimes::estimated(&Shape::default()));
        i.apply.one_backend.value = 0.0;
        let d = Delta {
            kind: PushKind::OneBackend,
            keys: 1,
            bytes: 3520,
            events: 2,
            revisions: 1,
            plan: plan(
                &[("k".into(), 3330)],
                ETCD_MAX_TXN_OPS,
                ETCD_MAX_REQUEST_BYTES,
            )
            .unwrap(),
        };
        let t = timing(&i, &d);
        assert!(t.all_ms > 21.9 * 0.8 && t.all_ms < 30.0 * 1.2, "{t:?}");
    }

    #[test]
    fn bad_inputs_are_refused_with_the_flag() {
        let mut i = inputs(0);
        assert!(matches!(run(&i), Err(Error::Spec(m)) if m.contains("--lbs")));
        i.lbs = 10;
        i.members = 0;
        assert!(matches!(run(&i), Err(Error::Spec(m)) if m.contains("--etcd-members")));
        i.members = 3;
        i.push_rate = 0.0;
        assert!(matches!(run(&i), Err(Error::Spec(m)) if m.contains("--push-rate")));
    }
}
