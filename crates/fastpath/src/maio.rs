//! `fastpath maio ...`: MAIO's subcommands, handed to the `bench` crate.

use clap::Subcommand;

use crate::Format;

#[derive(Subcommand)]
pub enum MaioCommand {
    /// Reproduce the paper's Figures 2-4, every method in one run.
    ///
    /// Figure 2: 64-byte UDP datagrams per second from one application
    /// thread: sendmsg, sendmmsg (32), io_uring without SQPOLL, MAIO.
    /// Figure 3: CPU cycles per byte of 16 KiB TCP sends to a local
    /// receiver: send, MSG_ZEROCOPY, sendfile, io_uring SEND_ZC, MAIO, with
    /// whether the kernel copied anyway; then 16 KiB UDP datagrams into a
    /// veth whose far end drops them (no local delivery, so no forced copy).
    /// Figure 4: a TCP splicing proxy: read/write, splice, io_uring, MAIO.
    /// Each method is repeated; medians are reported. Cycles are CPU time
    /// (all threads, SQPOLL included, peers excluded) times the clock rate.
    ///
    /// Examples:
    ///   fastpath maio bench --quick
    ///   fastpath maio bench --format json | jq .figure3
    ///   fastpath maio bench --figure 4 --seconds 2
    #[command(verbatim_doc_comment)]
    Bench {
        /// Run only these figures (2, 3 or 4; repeat or comma-separate).
        /// Figure 3 includes its no-local-delivery UDP variant.
        #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u8).range(2..=4))]
        figure: Vec<u8>,
        /// Short runs (0.2 s each, 3 repetitions).
        #[arg(long)]
        quick: bool,
        /// Seconds per run (default 1).
        #[arg(long)]
        seconds: Option<f64>,
        /// Repetitions per method (default 5, or 3 with --quick).
        #[arg(long)]
        reps: Option<usize>,
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
}

/// Runs one `fastpath maio` subcommand.
pub fn run(c: MaioCommand) -> anyhow::Result<()> {
    match c {
        MaioCommand::Bench {
            quick,
            seconds,
            reps,
            figure,
            format,
        } => maio_bench(quick, seconds, reps, figure, format),
    }
}

fn maio_bench(
    quick: bool,
    seconds: Option<f64>,
    reps: Option<usize>,
    figures: Vec<u8>,
    format: Format,
) -> anyhow::Result<()> {
    let seconds = seconds.unwrap_or(if quick { 0.2 } else { 1.0 });
    let reps = reps.unwrap_or(if quick { 3 } else { 5 });
    if !(0.05..=60.0).contains(&seconds) || reps == 0 || reps > 100 {
        anyhow::bail!("--seconds must be 0.05..=60 and --reps 1..=100");
    }
    let json = matches!(format, Format::Json);
    let doc = bench::maio::run(
        bench::maio::Options {
            seconds,
            reps,
            figures,
        },
        &|l: &str| {
            if !json {
                println!("{l}");
            }
        },
    )?;
    if json {
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    let r = |f: &str, a: &str, b: &str, k: &str| -> Option<f64> {
        Some(doc[f][a][k].as_f64()? / doc[f][b][k].as_f64()?)
    };
    println!();
    if let Some(x) = r("figure2", "maio", "sendmsg", "pps") {
        println!("Figure 2: MAIO / sendmsg = {x:.2}x (goal >= 1.2; the paper: 1.2-1.25)");
    }
    for f in ["figure3", "figure3_udp_veth", "figure4"] {
        if let Some(m) = doc[f].as_object() {
            let best = m
                .iter()
                .filter_map(|(k, v)| Some((k, v["cycles_per_byte"].as_f64()?)))
                .min_by(|a, b| a.1.total_cmp(&b.1));
            if let Some((k, v)) = best {
                println!("{f}: lowest cycles/byte: {k} ({v:.3})");
            }
        }
    }
    Ok(())
}
