//! `fastpath maio ...`: MAIO's subcommands, handed to the `bench` crate.

use clap::Subcommand;

use crate::report::emit;
use crate::Format;

#[derive(Subcommand)]
pub enum MaioCommand {
    /// Reproduce the paper's Figures 2-4, every method in one run.
    ///
    /// Figure 2: 64-byte UDP datagrams per second from one application
    /// thread: sendmsg, sendmmsg (32), sendmsg with UDP_SEGMENT (32
    /// datagrams per call, cut apart by the kernel), io_uring without
    /// SQPOLL, MAIO. Batched MAIO sends the datagrams queued between batch
    /// points as one segmented message (maio_no_sqpoll); the row
    /// maio_no_sqpoll_unsegmented sends them one request each. Into the
    /// veth, segmentation happens before the device and the far end counts
    /// frames: "frames at the sink per send" must be 1.
    /// Figure 3: CPU cycles per byte of 16 KiB TCP sends to a local
    /// receiver: send, MSG_ZEROCOPY, sendfile, io_uring SEND_ZC, MAIO, with
    /// whether the kernel copied anyway; then 16 KiB UDP datagrams into a
    /// veth whose far end drops them (no local delivery, so no forced copy).
    /// Figure 4: a TCP splicing proxy: read/write, splice, io_uring, MAIO,
    /// and the client writing to the server with no proxy (no_proxy). On
    /// loopback the kernel runs a socket's protocol work on whichever thread
    /// or soft interrupt reached it, so the proxy thread's CPU is only part
    /// of what the proxy costs, and a part that varies with scheduling; the
    /// machine-wide figure (every CPU's busy time in /proc/stat, ksoftirqd
    /// included; needs a quiet machine) less no_proxy's in the same round is
    /// what the proxy added ("added_cycles_per_byte").
    /// Figure 2 runs twice: to a never-read local socket (the receive path
    /// runs on the sender) and into the dropping veth of Figure 3. Rates are
    /// per second of wall clock, per CPU second of the application thread
    /// (the paper's kernel thread has a core of its own) and per CPU second
    /// of every thread (SQPOLL included). MAIO runs with SQPOLL ("maio") and
    /// with batched io_uring_enter instead ("maio_no_sqpoll"); a short probe
    /// picks one at run time, and the output says which.
    /// Methods run in rounds (each once per round, in turn); every figure is
    /// min/median/max over the rounds, ratios taken within a round, with the
    /// load average before and after (other work on the machine distorts
    /// wall-clock rates; CPU-time figures much less). Cycles are CPU time
    /// (all threads, SQPOLL included, peers excluded) times the clock rate.
    ///
    /// Examples:
    ///   fastpath maio bench --quick
    ///   fastpath maio bench --format json | jq .figure3
    ///   fastpath maio bench --figure 2
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
        /// Rounds (default 5, or 3 with --quick).
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
    let text = format.is_text();
    let report = bench::maio::run(
        bench::maio::Options {
            seconds,
            reps,
            figures,
        },
        &|l: &str| {
            if text {
                println!("{l}");
            }
        },
    )?;
    emit(format, &report)
}
