//! The `fastpath` command: argument parsing and dispatch only. Each
//! subcommand hands its work to a library crate (see README's Layout).

use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::Context;
use clap::{CommandFactory, Parser, Subcommand, ValueEnum};

mod bench_control;
mod check_config;
mod disk;
mod fleet_sim;
mod lb;
mod lb_config;
mod maio;
mod man;
mod quic_cid;
mod report;
mod switch;
mod tracer;

#[derive(Parser)]
#[command(
    name = "fastpath",
    version,
    about = "Fast I/O paths, built from four papers and measured",
    long_about = "fastpath builds fast I/O paths from four systems papers and measures each \
against a peer in the same run.\n\n\
  lb       the Maglev load balancer: forwarder on real interfaces (AF_XDP, AF_PACKET) or \
pcap files, daemon with HTTP API, health checks and BGP through BIRD, backend decapsulation, \
hashing evaluation, benchmarks, a demo in throwaway namespaces\n\
  switch   a VALE-style switch with paravirtual NIC ports (shared-memory rings with the \
paper's notification modes), TAP ports and memif for DPDK; Figure 1\n\
  pktgen   a generator/receiver attached to the switch as a guest's NIC\n\
  maio     MAIO's hugepage I/O memory and zero-copy socket I/O over io_uring: Figures 2-4\n\
  disk     SKIPPY, ZONED and SEEKER on a mechanical disk simulator or a real device, \
automatic extraction, plots, validation\n\
  completions, man   shell completion scripts and man pages, generated from this definition\n\n\
Every subcommand has --help with examples. Output can be piped: a reader that stops \
early (e.g. `| head`) ends fastpath quietly."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The Maglev load balancer (paper: Maglev, NSDI'16).
    #[command(subcommand)]
    Lb(lb::LbCommand),
    /// The VALE-style switch with paravirtual NIC ports (paper: Speeding up
    /// packet I/O in virtual machines).
    #[command(subcommand)]
    Switch(switch::SwitchCommand),
    /// Packet generator on a switch port: tx, rx, ping-pong, pong.
    ///
    /// Attaches to `fastpath switch run` through its control socket, as a
    /// guest's paravirtual NIC with the chosen notification mode, and
    /// reports packets per second, Mbps, kicks and interrupts per packet (the
    /// paper's VM exits) and, in ping-pong, round-trip percentiles.
    ///
    /// Examples:
    ///   fastpath pktgen --name rx1 --mode rx --duration 10 &
    ///   fastpath pktgen --name tx1 --mode tx --port-mode sc --itr 100
    ///   fastpath pktgen --name pp --mode ping-pong --port-mode csb
    #[command(verbatim_doc_comment)]
    Pktgen(switch::PktgenArgs),
    /// MAIO: hugepage I/O memory and zero-copy socket I/O over io_uring
    /// (paper: MAIO).
    #[command(subcommand)]
    Maio(maio::MaioCommand),
    /// Disk characterization: SKIPPY, ZONED, SEEKER, extraction, a simulator
    /// (paper: microbenchmark-based extraction of disk characteristics).
    #[command(subcommand)]
    Disk(disk::DiskCommand),
    /// Print a shell completion script for fastpath on standard output.
    ///
    /// Generated from the same definition as --help, so it completes every
    /// subcommand and option of this build. `make install` puts the bash
    /// script in place.
    ///
    /// Examples:
    ///   source <(fastpath completions bash)
    ///   fastpath completions bash > /usr/local/share/bash-completion/completions/fastpath
    ///   fastpath completions zsh > ~/.zfunc/_fastpath
    ///   fastpath completions fish > ~/.config/fish/completions/fastpath.fish
    #[command(verbatim_doc_comment)]
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Write the man pages into a directory: fastpath(1) and one page per
    /// subcommand (fastpath-lb(1), fastpath-lb-run(1), ...).
    ///
    /// Generated from the same definition as --help. `make install` puts
    /// them in place; to read one without installing:
    ///
    /// Examples:
    ///   fastpath man --out /tmp/man && man /tmp/man/fastpath-lb-run.1
    ///   fastpath man --out /usr/local/share/man/man1
    #[command(verbatim_doc_comment)]
    Man {
        /// The directory (created if missing; existing pages are replaced).
        #[arg(long, value_name = "DIR")]
        out: std::path::PathBuf,
    },
}

impl Cli {
    /// How log lines are written: JSON only where a command asks for it
    /// (`lb run --log-format json`).
    fn log_format(&self) -> lb::LogFormat {
        match &self.command {
            Command::Lb(lb::LbCommand::Run(a)) => a.log_format,
            _ => lb::LogFormat::Text,
        }
    }
}

/// Output format of the commands that report results.
#[derive(Clone, Copy, ValueEnum)]
pub enum Format {
    /// Tables for people (with the paper's figures beside ours where the
    /// command reproduces a figure).
    Table,
    /// One JSON document for scripts (its keys are listed in each
    /// command's help).
    Json,
}

/// A flag set by SIGINT or SIGTERM, for commands that stop cleanly.
pub fn stop_flag() -> anyhow::Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&stop))
            .context("installing a signal handler")?;
    }
    Ok(stop)
}

fn dispatch(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Lb(c) => lb::run(c),
        Command::Switch(switch::SwitchCommand::Run(a)) => {
            stop_flag().and_then(|s| switch::run(a, s))
        }
        Command::Switch(switch::SwitchCommand::Status { socket, format }) => {
            switch::status(&socket, format)
        }
        Command::Switch(switch::SwitchCommand::Bench(a)) => switch::bench(a),
        Command::Switch(switch::SwitchCommand::Vm(a)) => stop_flag().and_then(|s| switch::vm(a, s)),
        Command::Switch(switch::SwitchCommand::Demo(a)) => {
            stop_flag().and_then(|s| switch::demo(a, s))
        }
        Command::Pktgen(a) => stop_flag().and_then(|s| switch::pktgen(a, s)),
        Command::Maio(c) => maio::run(c),
        Command::Disk(c) => disk::run(c),
        Command::Completions { shell } => {
            // Through print!, so that `| head` ends quietly like the rest.
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "fastpath", &mut script);
            print!("{}", String::from_utf8_lossy(&script));
            Ok(())
        }
        Command::Man { out } => man_pages(&out),
    }
}

/// `fastpath man --out DIR`: every page, then their names on stdout.
fn man_pages(out: &std::path::Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    clap_mangen::generate_to(Cli::command(), out)
        .with_context(|| format!("writing man pages into {}", out.display()))?;
    let mut pages: Vec<String> = std::fs::read_dir(out)
        .with_context(|| format!("listing {}", out.display()))?
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("fastpath") && n.ends_with(".1"))
        .collect();
    pages.sort();
    // The sections clap cannot write: EXIT STATUS, SIGNALS, FILES.
    for p in &pages {
        let path = out.join(p);
        let page = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        std::fs::write(&path, man::with_sections(p.trim_end_matches(".1"), &page))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    println!("{} man pages in {}", pages.len(), out.display());
    for p in pages {
        println!("  {p}");
    }
    Ok(())
}

/// Whether log lines carry colour: only on a terminal, and not when the
/// NO_COLOR convention (<https://no-color.org>: set and not empty) asks
/// for none.
fn log_colour(terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    terminal && no_color.is_none_or(|v| v.is_empty())
}

/// Whether a panic is `print!` failing because stdout's reader has gone
/// (`fastpath ... | head`): Rust ignores SIGPIPE, so the write fails with
/// EPIPE and `print!` panics with this message.
fn is_closed_stdout(msg: &str) -> bool {
    msg.contains("failed printing to stdout") && msg.contains("Broken pipe")
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied())
        .unwrap_or("")
}

/// An error and its causes on one line, each cause once: libraries differ
/// in whether a message repeats its source's text, and the reader should see
/// it once either way.
fn error_chain(e: &anyhow::Error) -> String {
    let mut msg = e.to_string();
    for cause in e.chain().skip(1) {
        let c = cause.to_string();
        if !msg.contains(&c) {
            msg.push_str(": ");
            msg.push_str(&c);
        }
    }
    msg
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Logs to stderr; RUST_LOG=debug (or warn...) changes the level.
    // Colour only on a terminal: a log file or a pipe gets plain text, and
    // so does anyone who sets NO_COLOR (clap's help honours it too).
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter);
    match cli.log_format() {
        lb::LogFormat::Json => logs.json().with_thread_names(true).init(),
        lb::LogFormat::Text => logs
            .with_ansi(log_colour(
                std::io::IsTerminal::is_terminal(&std::io::stderr()),
                std::env::var_os("NO_COLOR").as_deref(),
            ))
            .init(),
    }
    // A closed output pipe ends the command quietly: the panic it causes in
    // print! is silenced here and unwinds (so namespaces, files and child
    // processes are still cleaned up by their destructors), then fastpath
    // exits 0 like other well-behaved filters. Any other panic is reported
    // as usual.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if !is_closed_stdout(panic_message(info.payload())) {
            default_hook(info);
        }
    }));
    match std::panic::catch_unwind(|| dispatch(cli)) {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(e)) => {
            eprintln!("fastpath: error: {}", error_chain(&e));
            ExitCode::FAILURE
        }
        Err(payload) if is_closed_stdout(panic_message(&*payload)) => ExitCode::SUCCESS,
        Err(payload) => std::panic::resume_unwind(payload),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colour_only_on_a_terminal_and_never_with_no_color() {
        use std::ffi::OsStr;
        assert!(log_colour(true, None));
        assert!(!log_colour(false, None));
        assert!(!log_colour(true, Some(OsStr::new("1"))));
        assert!(!log_colour(false, Some(OsStr::new("1"))));
        // Set but empty does not count (no-color.org).
        assert!(log_colour(true, Some(OsStr::new(""))));
    }

    #[test]
    fn the_cli_definition_is_consistent() {
        // clap's own checks (duplicate flags, bad defaults), which the man
        // pages and completions are generated from.
        Cli::command().debug_assert();
    }
}
