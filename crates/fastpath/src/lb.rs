//! `fastpath lb ...`: the Maglev load balancer's subcommands, parsed and
//! handed to the `lb` (forwarder), `lbd` (daemon), `decap` (backend agent),
//! `bench` (benchmarks) and `lab` (demo, sample traffic) crates.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};

use crate::{stop_flag, Format};

#[derive(Subcommand)]
pub enum LbCommand {
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
    /// nginx backends), starts `lb run --interface` (AF_XDP, or AF_PACKET
    /// where XDP is unavailable), sends real HTTP requests through the VIP
    /// and shows how they spread, stops one
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
    /// Soak the load balancer: real HTTP load while faults are injected
    /// (needs root, wrk, nginx, BIRD).
    ///
    /// Builds the namespace topology of `lb demo` with five nginx backends
    /// (four in the configuration, the fifth added and removed by reloads)
    /// and health checks through the tunnel, then for --seconds runs wrk
    /// with keep-alive and with `Connection: close` through the VIP, keeps
    /// two long-lived keep-alive connections per backend asking GET / every
    /// half second, and in every minute: stops and restarts nginx on
    /// backend 1, kills (SIGKILL) and restarts backend 2's decap agent,
    /// takes backend 3's link down and up, adds and removes backend 5 by
    /// reloads every two seconds, sends a broken reload, and drains then
    /// undrains backend 4.
    ///
    /// It reports requests sent and failed (and whether every failure lies
    /// in a fault window), long-lived connections broken on backends that
    /// stayed healthy (goal 0), the time from each fault until the backend
    /// is out of the table, and the load balancer's RSS and packet-pool
    /// occupancy after the warm-up and at the end (goal: no growth). Exits
    /// non-zero when a goal is missed. Progress goes to stderr; everything
    /// it creates is removed at the end, also on Ctrl-C.
    ///
    /// JSON keys: seconds, cycles, requests_sent, requests_failed, load[],
    /// long_lived{broken_on_healthy, ...}, faults[]{fault, backend,
    /// at_s, action_s, out_after_s, back_after_s}, drains[], reloads,
    /// rss_kib{start, middle, end}, pool_in_use{start, middle, end},
    /// segments[], goals[]{goal, met, detail}. RELIABILITY.md has figures.
    ///
    /// Examples:
    ///   fastpath lb soak --seconds 60
    ///   fastpath lb soak --seconds 600 --json out/soak.json     (make soak)
    ///   fastpath lb soak --seconds 60 --format json | jq '.goals'
    #[command(verbatim_doc_comment)]
    Soak(SoakArgs),
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

#[derive(Args)]
pub struct SoakArgs {
    /// Seconds of the measured run, after a 5 s warm-up (one cycle of
    /// faults per full minute, at least one).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(30..))]
    seconds: u64,
    /// Also write the report as JSON to this file.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Output format on stdout.
    #[arg(long, value_enum, default_value = "table")]
    format: Format,
}

fn soak(a: SoakArgs) -> anyhow::Result<()> {
    let stop = stop_flag()?;
    let exe = std::env::current_exe().context("finding our own binary")?;
    let opts = lab::soak::Options::new(a.seconds);
    let report = lab::soak::run(&exe, &opts, &stop, &mut |line| eprintln!("soak: {line}"))?;
    let json = serde_json::to_string_pretty(&report)?;
    if let Some(path) = &a.json {
        std::fs::write(path, &json).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("soak: wrote {}", path.display());
    }
    match a.format {
        Format::Table => print!("{}", report.to_text()),
        Format::Json => println!("{json}"),
    }
    let missed: Vec<&str> = report
        .goals
        .iter()
        .filter(|g| !g.met)
        .map(|g| g.goal.as_str())
        .collect();
    if !report.passed() {
        anyhow::bail!("soak: goals missed: {}", missed.join("; "));
    }
    Ok(())
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum Topology {
    /// The forwarder alone, driven from an in-memory generator.
    Memory,
    /// A veth pair in namespaces, beside nftables DNAT and an XDP bounce
    /// (needs root).
    Veth,
}

#[derive(Args)]
pub struct BenchArgs {
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
        let report = bench::veth::run(&exe, secs, &mut |what| eprintln!("measuring {what}"))?;
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
pub enum DriverArg {
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
pub struct RunArgs {
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

#[derive(Args)]
pub struct HashEvalArgs {
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

/// Runs one `fastpath lb` subcommand.
pub fn run(c: LbCommand) -> anyhow::Result<()> {
    match c {
        LbCommand::HashEval(a) => hash_eval(a),
        LbCommand::Run(a) => lb_run(a),
        LbCommand::Bench(a) => lb_bench(a),
        LbCommand::SamplePcap { out } => sample_pcap(&out),
        LbCommand::Decap { tun } => decap(&tun),
        LbCommand::Soak(a) => soak(a),
        LbCommand::Demo { backends, requests } => {
            let stop = stop_flag()?;
            Ok(lab::demo::run(backends, requests, stop)?)
        }
        LbCommand::Status { api, format } => status(api, format),
    }
}

fn status(api: std::net::SocketAddr, format: Format) -> anyhow::Result<()> {
    let s = lbd::daemon::fetch_status(api)?;
    match format {
        Format::Table => print!("{}", s.to_text()),
        Format::Json => println!("{}", serde_json::to_string_pretty(&s)?),
    }
    Ok(())
}
