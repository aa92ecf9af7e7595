//! `fastpath lb fleet-sim`: the arguments, handed to `bench::fleet_sim`.

use std::path::PathBuf;

use clap::Args;

use crate::report::emit;
use crate::Format;

/// Simulate a Maglev fleet behind ECMP: broken connections per event, 4 schemes.
///
/// Past this machine: L load balancers sit behind a router; C long-lived connections go to B
/// backends. The fleet goes through events (failures, restarts, additions of
/// load balancers; removals and additions of backends; load balancers that
/// apply a change late) and for each event and scheme the simulation counts
/// broken connections.
///
/// The four schemes (all with per-LB connection tracking: a packet that
/// finds an entry on its LB follows it, otherwise the LB looks it up):
///   maglev      Maglev's lookup table, M >= 100 x B (the paper)
///   mod_n       hash mod N over the backend list: no consistent hashing
///   karger      Karger's ring with virtual nodes
///   rendezvous  highest random weight
///
/// Broken: the connection is sent to a backend other than the one it started
/// on (remapped: an LB without its entry picked another), or its backend was
/// removed (backend gone). A broken connection is replaced at once by a new
/// one, so every event starts with C connections.
///
/// ECMP is modelled as the Linux kernel does it (hash-threshold multipath):
/// the live LBs, in address order, split the 31-bit flow-hash space into
/// equal ranges. Removing a LB therefore moves its own flows and shifts the
/// others' ranges too (with 3 LBs, removing the first or last moves 25% of
/// the survivors' flows between them). Conntrack entries live only on the LB
/// that saw the flow; a failed or restarted LB comes back empty.
///
/// What to expect: LB churn alone breaks nothing under any scheme (all four
/// are deterministic functions of the backend list and every LB holds the
/// same list); a backend change leaves flows whose lookup changed alive only
/// where their entry is, and they break when ECMP moves them to a LB without
/// it. Karger and rendezvous change the fewest lookups (only flows of
/// removed backends, or flows taken by added ones), Maglev a few more (its
/// table is not minimally disruptive: the paper's Figure 12), hash mod N
/// almost all.
///
/// Default scenario (internet scale: 100 LBs, 10,000 backends, 10 M
/// connections, about 10 s and 0.7 GB on two cores), events run in sequence
/// on one population: lb_failed, lb_returned, rolling_restart (every LB,
/// one by one, no sampling), backend_removed (1%),
/// backend_added (1%), lb_added, config_skew (1% added, applied late by 10%
/// of the LBs while 10% of connections are new and a LB fails),
/// backend_removed_lb_down. --quick runs the namespace fleet's case instead
/// (3 LBs, 3 backends, 10,000 connections): lb_killed (LB 2 of 3),
/// lb_restored, rolling_restart, lb_and_backend_change (backend 1 of 3
/// removed while LB 2 is down).
///
/// Examples:
///   fastpath lb fleet-sim
///   fastpath lb fleet-sim --quick
///   fastpath lb fleet-sim --lbs 20 --backends 1000 --connections 1000000 --plot-dir out/plots
///   fastpath lb fleet-sim --quick --format json | jq '.events[] | {name, maglev: .schemes.maglev.broken}'
///
/// JSON keys: config, table_size, rendezvous_table_size, events[] (name,
/// description, steps, connections, moves, moves_pct, schemes.<scheme>
/// {broken, broken_pct, backend_gone, remapped, lookups}), forgotten_entries,
/// elapsed_s.
///
/// --rollout models something else: one configuration push through etcd
/// to N load balancers (default 1,000 LBs, 1,000 VIPs x 100 backends, a
/// one-backend push, 3 etcd members) and states what the etcd cluster must
/// sustain: bytes etcd sends per push (each watcher gets every changed key),
/// time until p50/p99/all load balancers applied, the busiest member's
/// egress and watchers at --push-rate, the flags a first push needs in one
/// transaction (it is staged at etcd's defaults), the tables' memory per
/// load balancer, and the re-list storm after a leader loss with the
/// daemon's backoff (100 ms doubling to 2 s) with and without jitter. The
/// key sizes come from the real layout (fleetconf::split of a generated
/// configuration); the apply time is measured in this process (merge,
/// check, Control::apply: 3 runs, about 5 s at 1,000 x 100; --no-measure
/// uses bench-control's figures); etcd's fan-out and re-list rates are
/// this project's measurements (BENCHMARKS.md). Each input is printed with
/// where it came from. The model is in crates/bench/src/rollout.rs.
///
///   fastpath lb fleet-sim --rollout
///   fastpath lb fleet-sim --rollout --push first --lbs 3000 --watchers-on-first-member
///   fastpath lb fleet-sim --rollout --no-measure --format json | jq .sustain
///
/// JSON keys (--rollout): inputs (each figure {value, from}), sizes
/// {keys, prefix_bytes, deltas[]}, delta, bytes_per_push,
/// reread_bytes_per_push, events_per_push, relist_storm_bytes, timing
/// {committed_ms, p50_ms, p99_ms, all_ms}, timing_by_kind,
/// table_bytes_per_lb, peak_swap_bytes_per_lb, sustain, storms[].
#[derive(Args)]
#[command(verbatim_doc_comment)]
pub struct FleetSimArgs {
    /// The namespace fleet's case: 3 LBs, 3 backends, 10,000 connections
    /// (each overridable), its four events.
    #[arg(long)]
    quick: bool,
    /// Load balancers L (default 100, or 3 with --quick).
    #[arg(long)]
    lbs: Option<usize>,
    /// Backends B (default 10000, or 3 with --quick).
    #[arg(long)]
    backends: Option<usize>,
    /// Long-lived connections C (default 10000000, or 10000 with --quick).
    #[arg(long)]
    connections: Option<usize>,
    /// Seed for the hashes and the random choices.
    #[arg(long, default_value_t = 0x5eed)]
    seed: u64,
    /// Maglev and Karger table size M, prime (default: the smallest prime
    /// >= max(65537, 100 x B)).
    #[arg(long)]
    table_size: Option<u64>,
    /// Rendezvous table size, prime (default: M, or 65537 when B x M >
    /// 2^28, as rendezvous costs B scores per slot).
    #[arg(long)]
    rendezvous_table_size: Option<u64>,
    /// Virtual nodes per backend on the Karger ring.
    #[arg(long, default_value_t = 100)]
    karger_views: u32,
    /// Worker threads (default: the CPUs, at most 8).
    #[arg(long)]
    threads: Option<usize>,
    /// Write fleet-sim.svg and fleet-sim-consistent.svg (grouped bars of
    /// broken % per event per scheme) into this directory.
    #[arg(long, value_name = "DIR")]
    plot_dir: Option<PathBuf>,
    /// Model a configuration push through etcd instead (see above).
    #[arg(long, conflicts_with = "quick")]
    rollout: bool,
    /// --rollout: VIPs of the configuration, each over its own pool.
    #[arg(long, default_value_t = 1000, requires = "rollout")]
    vips: usize,
    /// --rollout: what the push changes.
    #[arg(long, value_enum, default_value = "one-backend", requires = "rollout")]
    push: Push,
    /// --rollout: etcd members.
    #[arg(long, default_value_t = 3, requires = "rollout")]
    etcd_members: usize,
    /// --rollout: pushes per second the cluster must sustain.
    #[arg(long, value_name = "R", default_value_t = 1.0, requires = "rollout")]
    push_rate: f64,
    /// --rollout: every load balancer watches the first member of its
    /// endpoint list (the daemon before 2026-11-29; it now starts at a
    /// member drawn at random, which spreads the watchers).
    #[arg(long, requires = "rollout")]
    watchers_on_first_member: bool,
    /// --rollout: etcd's --max-txn-ops.
    #[arg(long, default_value_t = bench::rollout::ETCD_MAX_TXN_OPS, requires = "rollout")]
    max_txn_ops: usize,
    /// --rollout: etcd's --max-request-bytes.
    #[arg(long, default_value_t = bench::rollout::ETCD_MAX_REQUEST_BYTES, requires = "rollout")]
    max_request_bytes: usize,
    /// --rollout: how long the cluster does not answer after a leader loss.
    #[arg(long, value_name = "MS", requires = "rollout")]
    outage_ms: Option<f64>,
    /// --rollout: each member's egress bandwidth, MB/s (default 1250: 10 Gb/s).
    #[arg(long, value_name = "MB_S", requires = "rollout")]
    bandwidth_mb_s: Option<f64>,
    /// --rollout: runs of the apply-time measurement (median taken).
    #[arg(long, default_value_t = 3, requires = "rollout")]
    apply_runs: usize,
    /// --rollout: do not measure the apply time; use bench-control's
    /// figures scaled to the configuration.
    #[arg(long, requires = "rollout")]
    no_measure: bool,
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    format: Format,
}

/// What a modelled push changes.
#[derive(Clone, Copy, clap::ValueEnum)]
enum Push {
    /// One backend's address in one pool.
    OneBackend,
    /// A new pool with its VIP.
    NewPool,
    /// Everything, into an empty prefix.
    First,
}

/// The rollout model's report, printed through `emit`.
#[derive(serde::Serialize)]
#[serde(transparent)]
struct Rollout(bench::rollout::Report);

impl crate::report::Report for Rollout {
    fn to_text(&self) -> String {
        self.0.to_text()
    }
}

fn rollout(a: FleetSimArgs) -> anyhow::Result<()> {
    let shape = bench::rollout::Shape {
        vips: a.vips,
        backends: a.backends.unwrap_or(100),
        table_size: a
            .table_size
            .unwrap_or(u64::from(maglev::DEFAULT_TABLE_SIZE)),
    };
    let apply = if a.no_measure {
        bench::rollout::ApplyTimes::estimated(&shape)
    } else {
        let text = a.format.is_text();
        bench::rollout::measure_apply(&shape, a.apply_runs, &mut |m| {
            if text {
                eprintln!("{m}");
            }
        })?
    };
    let mut inputs = bench::rollout::Inputs::new(apply);
    inputs.lbs = a.lbs.unwrap_or(1000);
    inputs.shape = shape;
    inputs.push = match a.push {
        Push::OneBackend => bench::rollout::PushKind::OneBackend,
        Push::NewPool => bench::rollout::PushKind::NewPool,
        Push::First => bench::rollout::PushKind::First,
    };
    inputs.members = a.etcd_members;
    inputs.spread = !a.watchers_on_first_member;
    inputs.push_rate = a.push_rate;
    inputs.max_txn_ops = a.max_txn_ops;
    inputs.max_request_bytes = a.max_request_bytes;
    inputs.seed = a.seed;
    if let Some(ms) = a.outage_ms {
        inputs.outage_ms = bench::rollout::Figure::new(ms, "--outage-ms");
    }
    if let Some(b) = a.bandwidth_mb_s {
        inputs.bandwidth_mb_s = bench::rollout::Figure::new(b, "--bandwidth-mb-s");
    }
    let report = bench::rollout::run(&inputs)?;
    if let Some(dir) = &a.plot_dir {
        for f in report.plot(dir)? {
            eprintln!("wrote {}", f.display());
        }
    }
    emit(a.format, &Rollout(report))
}

/// Runs the simulation and prints the report.
pub fn run(a: FleetSimArgs) -> anyhow::Result<()> {
    if a.rollout {
        return rollout(a);
    }
    let mut cfg = if a.quick {
        bench::fleet_sim::Config::namespace_fleet(10_000)
    } else {
        bench::fleet_sim::Config::internet()
    };
    if let Some(n) = a.lbs {
        cfg.lbs = n;
    }
    if let Some(n) = a.backends {
        cfg.backends = n;
    }
    if let Some(n) = a.connections {
        cfg.connections = n;
    }
    if let Some(n) = a.threads {
        cfg.threads = n;
    }
    cfg.seed = a.seed;
    cfg.table_size = a.table_size;
    cfg.rendezvous_table_size = a.rendezvous_table_size;
    cfg.karger_views = a.karger_views;
    let report = bench::fleet_sim::run(&cfg)?;
    emit(a.format, &report)?;
    if let Some(dir) = a.plot_dir {
        for f in report.plot(&dir)? {
            eprintln!("wrote {}", f.display());
        }
    }
    Ok(())
}
