//! The `fastpath` command: argument parsing and wiring only. Each subcommand
//! hands its work to a library crate.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Parser, Subcommand, ValueEnum};

mod disk;
mod switch;

#[derive(Parser)]
#[command(
    name = "fastpath",
    version,
    about = "Fast I/O paths, built from four papers and measured",
    long_about = "fastpath builds fast I/O paths from four systems papers and measures them \
against a peer in the same run.\n\nWorking today: `fastpath lb` (the Maglev load balancer: hashing \
evaluation, forwarder on pcap files and real interfaces, demo), `fastpath switch` and \
`fastpath pktgen` (a VALE-style switch with paravirtual NIC ports, memif and TAP). MAIO and \
the disk tools arrive with their issues."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The Maglev load balancer (paper: Maglev, NSDI'16).
    #[command(subcommand)]
    Lb(LbCommand),
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
    Maio(MaioCommand),
    /// Disk characterization: SKIPPY, ZONED, SEEKER, extraction, a simulator
    /// (paper: microbenchmark-based extraction of disk characteristics).
    #[command(subcommand)]
    Disk(disk::DiskCommand),
}

#[derive(Subcommand)]
enum MaioCommand {
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

#[derive(Subcommand)]
enum LbCommand {
    /// Reproduce the paper's consistent-hashing evaluation (section 5.3).
    ///
    /// Figure 11: the largest and smallest share of the lookup table held by
    /// one backend, for Maglev, Karger (ring with virtual nodes) and
    /// rendezvous hashing. Figure 12: the share of table entries that change
    /// when a percentage of backends fail at once. Also the time to generate
    /// each table (beside Pseudocode 1 written literally and the paper's
    /// times) and the cost of a lookup.
    ///
    /// Examples:
    ///   fastpath lb hash-eval --quick
    ///   fastpath lb hash-eval --plot-dir out/plots
    ///   fastpath lb hash-eval --quick --format json | jq '.results.maglev'
    #[command(verbatim_doc_comment)]
    HashEval(HashEvalArgs),
    /// Forward packets through the Maglev forwarder.
    ///
    /// Reads frames from a pcap file, runs them through steering, the packet
    /// threads (VIP matching, connection tracking, Maglev hashing, GRE
    /// encapsulation) and muxing, writes what is forwarded to another pcap
    /// file, and prints the counters: per VIP, per backend, drops by reason.
    ///
    /// Example:
    ///   fastpath lb run --config lb.toml --pcap-in in.pcap --pcap-out out.pcap
    ///
    /// The configuration format is documented in crates/lb/src/config.rs and
    /// examples/lb.toml.
    #[command(verbatim_doc_comment)]
    Run(RunArgs),
    /// Measure the forwarder's packet rate (paper section 5.2.2).
    ///
    /// Drives the forwarder from the in-memory generator with 64-byte TCP
    /// frames of three kinds: SYN (a new flow per packet), non-SYN (ACKs over
    /// established flows) and a constant 5-tuple, with 1 and 2 packet
    /// threads; in the same run a null forwarder (parse, swap addresses,
    /// send) over the same pipeline gives this machine's limit, and every
    /// rate is printed as a ratio to it.
    ///
    /// With --topology veth: packets per second through a veth pair in
    /// namespaces, the load balancer (lb run --interface) beside nftables
    /// doing the same job (DNAT with jhash) and an XDP program bouncing
    /// frames (the pair's limit), with the ratios.
    ///
    /// Examples:
    ///   fastpath lb bench --quick
    ///   fastpath lb bench --format json
    ///   fastpath lb bench --topology veth
    #[command(verbatim_doc_comment)]
    Bench(BenchArgs),
    /// Show a running load balancer's VIPs, backends, health and counters.
    ///
    /// Reads /status from the HTTP API of `fastpath lb run --interface`
    /// (enabled by `[api] listen = "127.0.0.1:9180"` in its configuration).
    ///
    /// Example:
    ///   fastpath lb status --api 127.0.0.1:9180
    #[command(verbatim_doc_comment)]
    Status {
        /// The API address.
        #[arg(long, default_value = "127.0.0.1:9180")]
        api: std::net::SocketAddr,
        /// Output format.
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
    /// The load balancer in a throwaway network, end to end (needs root).
    ///
    /// Builds network namespaces (client, router with BIRD, load balancer,
    /// nginx backends), starts `lb run --interface` (AF_PACKET), sends real
    /// HTTP requests through the VIP and shows how they spread, stops one
    /// nginx and shows its share move to the others while long-lived
    /// connections to the rest stay put, withdraws the VIP from BGP, and
    /// removes everything it created, also when interrupted.
    ///
    /// Example:
    ///   fastpath lb demo
    #[command(verbatim_doc_comment)]
    Demo {
        /// Number of nginx backends.
        #[arg(long, default_value_t = 3)]
        backends: usize,
        /// Requests per round.
        #[arg(long, default_value_t = 300)]
        requests: usize,
    },
    /// Decapsulate GRE for a backend (run it on each backend).
    ///
    /// This kernel has no GRE module, so backends cannot add a GRE tunnel.
    /// This helper receives GRE (IPv4 and IPv6) on raw sockets, removes the
    /// outer headers and writes the inner packet into a TUN device; with the
    /// VIP on the backend's loopback, the kernel serves it and replies go
    /// directly to the client. Runs until SIGINT or SIGTERM, then prints its
    /// counters.
    ///
    /// Example (on a backend):
    ///   ip addr add 192.0.2.80/32 dev lo
    ///   fastpath lb decap --tun fpdecap0
    #[command(verbatim_doc_comment)]
    Decap {
        /// Name of the TUN device to create and deliver into.
        #[arg(long, default_value = "fpdecap0")]
        tun: String,
    },
    /// Write mixed sample traffic for examples/lb.toml to a pcap file.
    ///
    /// TCP and UDP over IPv4, an any-port UDP VIP, IPv6, ICMP errors about VIP
    /// flows, fragments in and out of order, traffic for no VIP and garbage:
    /// everything `fastpath lb run` has to handle.
    ///
    /// Example:
    ///   fastpath lb sample-pcap --out in.pcap
    ///   fastpath lb run --config examples/lb.toml --pcap-in in.pcap --pcap-out out.pcap
    #[command(verbatim_doc_comment)]
    SamplePcap {
        /// The pcap file to write.
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
    },
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
enum Topology {
    /// The forwarder alone, driven from an in-memory generator.
    Memory,
    /// A veth pair in namespaces, beside nftables DNAT and an XDP bounce
    /// (needs root).
    Veth,
}

#[derive(Args)]
struct BenchArgs {
    /// What to drive: the forwarder in memory, or a veth pair.
    #[arg(long, value_enum, default_value = "memory")]
    topology: Topology,
    /// Seconds per device under test with --topology veth.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// A run of a few seconds (fewer packets, one repetition).
    #[arg(long)]
    quick: bool,
    /// Packets per run.
    #[arg(long)]
    packets: Option<u64>,
    /// Packet-thread counts, comma separated.
    #[arg(long, value_delimiter = ',')]
    threads: Option<Vec<usize>>,
    /// Runs per measurement (the median is reported).
    #[arg(long)]
    repeats: Option<usize>,
    /// Traffic types, comma separated: syn, non_syn, constant (the null
    /// forwarder always runs as the peer).
    #[arg(long, value_delimiter = ',', value_parser = ["syn", "non_syn", "constant"])]
    traffic: Option<Vec<String>>,
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    format: Format,
}

fn lb_bench(a: BenchArgs) -> anyhow::Result<()> {
    if a.topology == Topology::Veth {
        let exe = std::env::current_exe().context("finding our own binary")?;
        let secs = if a.quick {
            a.seconds.min(1.0)
        } else {
            a.seconds
        };
        let report = bench::veth::run(&exe, secs, &mut |what| eprintln!("measuring {what}"))
            .map_err(anyhow::Error::msg)?;
        match a.format {
            Format::Table => print!("{}", report.to_text()),
            Format::Json => println!("{}", serde_json::to_string_pretty(&report)?),
        }
        return Ok(());
    }
    let mut b = if a.quick {
        bench::forwarder::BenchConfig::quick()
    } else {
        bench::forwarder::BenchConfig::full()
    };
    if let Some(p) = a.packets {
        b.packets = p;
    }
    if let Some(t) = a.threads {
        b.threads = t;
    }
    if let Some(r) = a.repeats {
        b.repeats = r;
    }
    if let Some(t) = a.traffic {
        b.traffic = t;
    }
    let report = bench::forwarder::run(&b, &mut |what| eprintln!("measuring {what}"))?;
    match a.format {
        Format::Table => print!("{}", report.to_text()),
        Format::Json => println!("{}", serde_json::to_string_pretty(&report)?),
    }
    Ok(())
}

#[derive(Clone, Copy, ValueEnum)]
enum DriverArg {
    /// AF_XDP if it can be had (our XDP program, native or generic), else
    /// AF_PACKET; says which and why.
    Auto,
    /// AF_XDP only.
    AfXdp,
    /// AF_PACKET with a TPACKET_V3 ring.
    AfPacket,
}

#[derive(Args)]
#[command(group(clap::ArgGroup::new("input").required(true).args(["pcap_in", "interface"])))]
struct RunArgs {
    /// Configuration file (TOML).
    #[arg(long, value_name = "FILE")]
    config: PathBuf,
    /// Capture to forward (Ethernet link type); needs --pcap-out.
    #[arg(long, value_name = "FILE", requires = "pcap_out")]
    pcap_in: Option<PathBuf>,
    /// Where forwarded (GRE-encapsulated) frames are written.
    #[arg(long, value_name = "FILE")]
    pcap_out: Option<PathBuf>,
    /// Forward on this interface until SIGINT or SIGTERM (frames are
    /// received and sent back out on it).
    #[arg(long, value_name = "IFACE", conflicts_with = "pcap_in")]
    interface: Option<String>,
    /// Packet I/O driver for --interface (default: the configuration's
    /// [forwarder] driver, itself "auto" by default).
    #[arg(long, value_enum)]
    driver: Option<DriverArg>,
    /// Packet threads, overriding forwarder.threads (0: inline).
    #[arg(long)]
    threads: Option<usize>,
    /// Output format for the counters.
    #[arg(long, value_enum, default_value = "table")]
    format: Format,
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
    )
    .map_err(anyhow::Error::msg)?;
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

fn stop_flag() -> anyhow::Result<std::sync::Arc<std::sync::atomic::AtomicBool>> {
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, std::sync::Arc::clone(&stop))
            .context("installing a signal handler")?;
    }
    Ok(stop)
}

fn lb_run(a: RunArgs) -> anyhow::Result<()> {
    let (stats, tables) = match (&a.interface, &a.pcap_in, &a.pcap_out) {
        (Some(iface), _, _) => {
            let stop = stop_flag()?;
            let driver = a.driver.map(|d| match d {
                DriverArg::Auto => lbd::daemon::Driver::Auto,
                DriverArg::AfXdp => lbd::daemon::Driver::AfXdp,
                DriverArg::AfPacket => lbd::daemon::Driver::AfPacket,
            });
            eprintln!(
                "forwarding on {iface}; stop with Ctrl-C (SIGINT) or SIGTERM, reload with SIGHUP"
            );
            lbd::daemon::run(&a.config, iface, driver, a.threads, stop)?
        }
        (None, Some(inp), Some(out)) => lb::pcap_run::run(&a.config, inp, out, a.threads)?,
        _ => anyhow::bail!("give --interface, or --pcap-in with --pcap-out"),
    };
    match a.format {
        Format::Table => print!("{}", lb::pcap_run::report(&stats, &tables)),
        Format::Json => println!(
            "{}",
            serde_json::to_string_pretty(&lb::pcap_run::json(&stats, &tables))?
        ),
    }
    Ok(())
}

#[derive(Clone, Copy, ValueEnum)]
pub enum Format {
    /// Tables for people, with the paper's figures beside ours.
    Table,
    /// One JSON document: config, results[method][M], lookup.
    Json,
}

#[derive(Args)]
struct HashEvalArgs {
    /// Reduced run (3 failure levels x 10 repetitions); a few seconds.
    #[arg(long)]
    quick: bool,
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    format: Format,
    /// Write figure11.svg and figure12.svg into this directory.
    #[arg(long, value_name = "DIR")]
    plot_dir: Option<PathBuf>,
    /// Number of backends N.
    #[arg(long, default_value_t = 1000)]
    backends: usize,
    /// Table sizes M, comma separated; each must be prime.
    #[arg(long, value_delimiter = ',', default_values_t = [65_537u64, 655_373])]
    sizes: Vec<u64>,
    /// Random repetitions per failure level (default: 200, or 10 with --quick).
    #[arg(long)]
    repetitions: Option<usize>,
    /// Virtual nodes per backend on the Karger ring.
    #[arg(long, default_value_t = 1000)]
    karger_views: u32,
    /// Seed for choosing which backends fail.
    #[arg(long, default_value_t = 0x5eed)]
    seed: u64,
}

fn hash_eval(a: HashEvalArgs) -> anyhow::Result<()> {
    let mut cfg = if a.quick {
        bench::hash_eval::Config::quick()
    } else {
        bench::hash_eval::Config::paper()
    };
    cfg.backends = a.backends;
    cfg.sizes = a.sizes;
    cfg.karger_views = a.karger_views;
    cfg.seed = a.seed;
    if let Some(r) = a.repetitions {
        cfg.repetitions = r;
    }
    let report = bench::hash_eval::run(&cfg)?;
    match a.format {
        Format::Table => println!("{}", report.to_text()),
        Format::Json => println!(
            "{}",
            serde_json::to_string_pretty(&report).context("serializing the report")?
        ),
    }
    if let Some(dir) = a.plot_dir {
        for f in report.plot(&dir)? {
            eprintln!("wrote {}", f.display());
        }
    }
    Ok(())
}

fn decap(tun: &str) -> anyhow::Result<()> {
    let stop = stop_flag()?;
    eprintln!("decapsulating GRE into {tun}; stop with Ctrl-C (SIGINT) or SIGTERM");
    let s = decap::run(tun, &stop)?;
    println!(
        "GRE received {}, delivered {} (IPv4 {}, IPv6 {}), malformed {}, not IP {}, TUN errors {}",
        s.received, s.delivered, s.inner_v4, s.inner_v6, s.malformed, s.not_ip, s.tun_errors
    );
    Ok(())
}

fn sample_pcap(out: &std::path::Path) -> anyhow::Result<()> {
    let frames: Vec<Vec<u8>> = lab::sample::mixed_traffic()
        .into_iter()
        .map(|s| s.frame)
        .collect();
    netio::pcap::write_frames(out, &frames)?;
    eprintln!("wrote {} frames to {}", frames.len(), out.display());
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Logs to stderr; RUST_LOG=debug (or warn...) changes the level.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let result = match cli.command {
        Command::Switch(switch::SwitchCommand::Run(a)) => {
            stop_flag().and_then(|s| switch::run(a, s))
        }
        Command::Switch(switch::SwitchCommand::Status { socket, format }) => {
            switch::status(&socket, format)
        }
        Command::Switch(switch::SwitchCommand::Bench(a)) => switch::bench(a),
        Command::Maio(MaioCommand::Bench {
            quick,
            seconds,
            reps,
            figure,
            format,
        }) => maio_bench(quick, seconds, reps, figure, format),
        Command::Disk(c) => disk::run(c),
        Command::Pktgen(a) => stop_flag().and_then(|s| switch::pktgen(a, s)),
        Command::Lb(LbCommand::HashEval(a)) => hash_eval(a),
        Command::Lb(LbCommand::Run(a)) => lb_run(a),
        Command::Lb(LbCommand::Bench(a)) => lb_bench(a),
        Command::Lb(LbCommand::SamplePcap { out }) => sample_pcap(&out),
        Command::Lb(LbCommand::Decap { tun }) => decap(&tun),
        Command::Lb(LbCommand::Demo { backends, requests }) => {
            stop_flag().and_then(|s| Ok(lab::demo::run(backends, requests, s)?))
        }
        Command::Lb(LbCommand::Status { api, format }) => lbd::daemon::fetch_status(api)
            .map_err(anyhow::Error::msg)
            .and_then(|s| {
                match format {
                    Format::Table => print!("{}", s.to_text()),
                    Format::Json => println!("{}", serde_json::to_string_pretty(&s)?),
                }
                Ok(())
            }),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fastpath: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
