//! `fastpath lb bench-control`: the arguments, handed to `bench::control`.

use clap::Args;

use crate::report::emit;
use crate::Format;

/// Measure the control plane at scale: load, one-backend reload, memory.
///
/// Generates a configuration of --vips VIPs, each over its own pool of
/// --backends backends with Maglev tables of --table-size slots (default
/// 1,000 x 100, M = 65537: 100,000 backends, about 3 MB of TOML) and, in
/// each of --runs runs, times:
///
///   load      parse + validate the text, then build every table and swap
///             them in (Control::new); goal <= 1 s
///   reload    the same text with one backend of one pool changed, parsed,
///             validated and applied to the running control plane: only
///             that pool's table is rebuilt; goal <= 100 ms
///   full      the changed configuration built whole by a fresh control
///             plane (a full rebuild), and the ratio reload / full rebuild;
///             both must give the same table fingerprints
///   health    one backend marked down, then up (Control::set_health)
///   fleet     a [fleet] peer marked down, then up (Control::set_peer_up):
///             only the fragment-redirect part is swapped, no table rebuilt
///
/// and reports the table memory per VIP and in total (tables that VIPs
/// share counted once) and the resident-set growth of the first load.
/// Each figure is min / median / max over the runs; the machine's load
/// average is printed beside them.
///
/// Examples:
///   fastpath lb bench-control
///   fastpath lb bench-control --vips 100 --backends 10 --runs 5
///   fastpath lb bench-control --format json | jq '.reload_ms, .memory'
///
/// JSON keys: spec, config_bytes, generate_ms, threads, parse_validate_ms,
/// build_swap_ms, load_ms, reload_parse_ms, reload_apply_ms, reload_ms,
/// full_rebuild_ms, incremental_over_full, health_down_ms, health_up_ms,
/// peer_down_ms, peer_up_ms (each {min, median, max}),
/// memory{per_vip_bytes, distinct_tables, tables_bytes, total_bytes,
/// rss_growth_kib, rss_growth_reload_kib}, load_average.
#[derive(Args)]
#[command(verbatim_doc_comment)]
pub struct BenchControlArgs {
    /// VIPs, each over its own pool.
    #[arg(long, default_value_t = 1000)]
    vips: usize,
    /// Backends per pool.
    #[arg(long, default_value_t = 100)]
    backends: usize,
    /// Maglev table size M of every pool (prime).
    #[arg(long, default_value_t = u64::from(maglev::DEFAULT_TABLE_SIZE))]
    table_size: u64,
    /// Runs per figure (min, median and max are printed).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    format: Format,
}

/// Runs the benchmark and prints its report.
pub fn run(a: BenchControlArgs) -> anyhow::Result<()> {
    let spec = bench::control::Spec {
        vips: a.vips,
        backends: a.backends,
        table_size: a.table_size,
        runs: a.runs,
    };
    let report = bench::control::run(&spec, &mut |what| eprintln!("measuring {what}"))?;
    emit(a.format, &report)
}
