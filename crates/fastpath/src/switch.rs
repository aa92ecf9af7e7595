//! `fastpath switch ...` and `fastpath pktgen`: argument parsing and wiring.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use bench::switch::{Backend, Options, SwitchPlacement};
use clap::{Args, Subcommand, ValueEnum};
use measure::Table;
use ring::control::AttachRequest;
use ring::Mode;
use vswitch::pktgen::{Params, Role};

use crate::Format;

pub const DEFAULT_SOCKET: &str = "/run/fastpath/switch.sock";

#[derive(Subcommand)]
pub enum SwitchCommand {
    /// Run the switch.
    ///
    /// Ports: processes attach through the control socket (`fastpath pktgen`,
    /// or any program using the `ring` crate); DPDK, VPP and libmemif
    /// programs attach over memif (--memif); --tap adds TAP devices (the
    /// kernel path). Settings may also come from a TOML file (--config; the
    /// keys are documented in crates/vswitch/src/config.rs, FileConfig).
    ///
    /// Status: `fastpath switch status`, or send SIGUSR1 and the switch
    /// prints it to stderr. SIGINT or SIGTERM stop it.
    ///
    /// Examples:
    ///   fastpath switch run
    ///   fastpath switch run --memif /run/fastpath/memif.sock --tap fptap0
    ///   dpdk-testpmd --no-huge --no-pci -l 0-1 \
    ///     --vdev=net_memif0,role=client,socket-abstract=no,socket=/run/fastpath/memif.sock \
    ///     -- --forward-mode=macswap --auto-start
    #[command(verbatim_doc_comment)]
    Run(RunArgs),
    /// Show a running switch's ports and counters.
    Status {
        #[arg(long, default_value = DEFAULT_SOCKET)]
        socket: PathBuf,
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
    /// Reproduce the structure of the paper's Figure 1 (needs root for TAP).
    ///
    /// Rows: BASE itr=0, itr=100, itr=100 SC, itr=0 CSB, itr=100 CSB.
    /// Columns: guest transmit and receive Kpps with 60-byte frames, Mbps
    /// with 1514-byte frames, notifications (kicks + interrupts) per packet
    /// while transmitting, ping-pong transactions per second. Once with the
    /// switch as backend and once with a TAP device (the kernel path); the
    /// paper's own numbers beside ours. Then the switch's forwarding rate
    /// between two ring ports, per second of the switch thread's CPU time and
    /// end to end, with each thread's CPU time; then DPDK testpmd (txonly) ->
    /// memif -> switch -> memif -> testpmd (rxonly), and one testpmd
    /// (flowgen) sending and receiving through the switch, beside the two
    /// testpmds over memif directly, with testpmd's own counters (skipped
    /// if DPDK is not installed). Where the switch thread runs decides the
    /// memif rows on a small machine: see --switch-cpu.
    ///
    /// Examples:
    ///   fastpath switch bench --quick
    ///   fastpath switch bench --part forwarding --part memif
    ///   fastpath switch bench --part memif --switch-cpu none
    ///   fastpath switch bench --quick --format json | jq .backends.switch.csb_itr0
    #[command(verbatim_doc_comment)]
    Bench(BenchArgs),
}

#[derive(Args)]
pub struct RunArgs {
    /// TOML settings file.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Control socket for attaching ports and status.
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Also serve memif (server role) on this socket.
    #[arg(long)]
    memif: Option<PathBuf>,
    /// Add a TAP port (created if absent); repeatable.
    #[arg(long)]
    tap: Vec<String>,
    /// Keep polling this long (microseconds) after the last work before sleeping.
    #[arg(long, value_parser = clap::value_parser!(u64).range(0..=vswitch::MAX_INTERVAL_US))]
    poll_us: Option<u64>,
    /// memif interrupt moderation, microseconds (0: off). Asleep, the
    /// switch masks its memif clients' interrupts and looks at their rings
    /// again after this long, so a busy client fills a batch instead of
    /// waking it per burst: for a switch sharing its core with the programs
    /// it serves (10 is a good start). Overrides the file's
    /// memif_moderation_us.
    #[arg(long, value_parser = clap::value_parser!(u64).range(0..=vswitch::MAX_INTERVAL_US))]
    memif_moderation_us: Option<u64>,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum BackendArg {
    Switch,
    Tap,
    Both,
}

#[derive(Args)]
pub struct BenchArgs {
    /// Short runs (the whole table in well under a minute).
    #[arg(long)]
    quick: bool,
    /// Seconds per measurement (default 2, or 0.3 with --quick).
    #[arg(long)]
    seconds: Option<f64>,
    #[arg(long, value_enum, default_value = "both")]
    backend: BackendArg,
    /// Frames per transmit call.
    #[arg(long, default_value_t = 64)]
    burst: usize,
    /// Parts to run (repeatable): figure1 (the paper's table), forwarding
    /// (ring to ring, per switch core), memif (DPDK testpmd through the
    /// switch beside testpmd to testpmd); default all.
    #[arg(long, value_enum)]
    part: Vec<PartArg>,
    /// Frames per transmit call of the ring-to-ring sender.
    #[arg(long, default_value_t = 256)]
    forwarding_burst: usize,
    /// The switch's poll_us (poll this long after the last frame, then
    /// sleep) in the ring-to-ring measurement.
    #[arg(long, default_value_t = 20)]
    forwarding_poll_us: u64,
    /// Leave the ring-to-ring measurement's threads where the scheduler
    /// puts them (default: the sender alone on CPU 0, the switch and the
    /// receiver on CPU 1, the layout in which the switch is preempted
    /// least on a 2-core machine).
    #[arg(long)]
    forwarding_no_pin: bool,
    /// Seconds of measurement per memif row, at least 2 (testpmd reports
    /// once a second; the window holds at least two reports): default 3, 2
    /// with --quick.
    #[arg(long)]
    memif_seconds: Option<f64>,
    /// log2 of the memif ring size (DPDK's rsize).
    #[arg(long, default_value_t = 10)]
    memif_ring_log2: u8,
    /// Where the switch thread runs in the memif rows: "auto", a CPU
    /// number (every row), or "none" (the scheduler places it). auto picks
    /// per row: with two testpmds, which busy-poll both cores, the sending
    /// testpmd's forwarding core (CPU 1), so the switch takes turns with
    /// the sender it waits for while the receiver drains on the other;
    /// with one testpmd, which busy-polls CPU 1, the free CPU 0, so each
    /// busy thread has a core, as in the direct pair.
    #[arg(long, default_value = "auto")]
    switch_cpu: String,
    /// The switch's memif interrupt moderation in the memif rows,
    /// microseconds (0: off, the switch is woken per burst once it
    /// sleeps). On a core it shares with a busy sender, moderation lets the
    /// sender fill a ring's worth before the switch takes the core back.
    #[arg(long, default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(0..=vswitch::MAX_INTERVAL_US))]
    memif_moderation_us: u64,
    #[arg(long, value_enum, default_value = "table")]
    format: Format,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PartArg {
    Figure1,
    Forwarding,
    Memif,
}

#[derive(Args)]
pub struct PktgenArgs {
    /// The switch's control socket.
    #[arg(long, default_value = DEFAULT_SOCKET)]
    socket: PathBuf,
    /// Port name on the switch.
    #[arg(long, default_value = "pktgen")]
    name: String,
    /// tx, rx, ping-pong, or pong (answer ping-pong).
    #[arg(long, default_value = "tx")]
    mode: Role,
    /// How the port notifies: base, sc (Send Combining) or csb.
    #[arg(long, default_value = "csb")]
    port_mode: Mode,
    /// Interrupt moderation, in 250 ns units (100 = 25 us).
    #[arg(long, default_value_t = 0)]
    itr: u32,
    /// Frame size in bytes, without FCS (60..=2048).
    #[arg(long, default_value_t = 60)]
    size: usize,
    /// Frames per transmit call.
    #[arg(long, default_value_t = 64)]
    burst: usize,
    /// Packets per second (default: as fast as possible).
    #[arg(long)]
    rate: Option<f64>,
    /// Stop after this many packets.
    #[arg(long)]
    count: Option<u64>,
    /// Stop after this many seconds.
    #[arg(long, default_value_t = 5.0)]
    duration: f64,
    /// Ring slots (a power of two).
    #[arg(long, default_value_t = 1024)]
    slots: u32,
    /// Source MAC.
    #[arg(long, default_value = "02:fa:00:00:00:01")]
    src_mac: String,
    /// Destination MAC (unknown or broadcast destinations are flooded).
    #[arg(long, default_value = "02:fa:00:00:00:02")]
    dst_mac: String,
    #[arg(long, value_enum, default_value = "table")]
    format: Format,
}

fn parse_mac(s: &str) -> anyhow::Result<[u8; 6]> {
    let parts: Vec<&str> = s.split(':').collect();
    if parts.len() != 6 {
        bail!("MAC address {s:?} must be six hex bytes separated by ':'");
    }
    let mut m = [0u8; 6];
    for (d, p) in m.iter_mut().zip(parts) {
        *d = u8::from_str_radix(p, 16).with_context(|| format!("MAC address {s:?}"))?;
    }
    Ok(m)
}

pub fn run(a: RunArgs, stop: Arc<AtomicBool>) -> anyhow::Result<()> {
    let file = match &a.config {
        Some(p) => vswitch::FileConfig::load(p)?,
        None => vswitch::FileConfig::default(),
    };
    let mut cfg = file.config();
    cfg.socket = a
        .socket
        .or(cfg.socket)
        .or_else(|| Some(PathBuf::from(DEFAULT_SOCKET)));
    cfg.memif_socket = a.memif.or(cfg.memif_socket);
    if let Some(p) = a.poll_us {
        cfg.poll_us = p;
    }
    if let Some(m) = a.memif_moderation_us {
        cfg.memif_moderation = std::time::Duration::from_micros(m);
    }
    for p in [&cfg.socket, &cfg.memif_socket].into_iter().flatten() {
        if let Some(dir) = p.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
    }
    let mut sw = vswitch::Switch::new(cfg.clone()).context("starting the switch")?;
    for t in file.taps.iter().chain(a.tap.iter()) {
        let tap = netio::tap::Tap::open(t).with_context(|| format!("TAP port {t} (needs root)"))?;
        sw.add_port(Box::new(vswitch::TapPort::new(tap)))?;
    }
    let usr1 = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGUSR1, usr1.clone())?;
    eprintln!(
        "switch: control socket {}{}; SIGUSR1 prints status, Ctrl-C stops",
        cfg.socket
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_default(),
        cfg.memif_socket
            .as_ref()
            .map(|p| format!(", memif on {}", p.display()))
            .unwrap_or_default()
    );
    sw.run(&stop, Some(&usr1));
    for p in [&cfg.socket, &cfg.memif_socket].into_iter().flatten() {
        let _ = std::fs::remove_file(p);
    }
    Ok(())
}

pub fn status(socket: &std::path::Path, format: Format) -> anyhow::Result<()> {
    let s = ring::control::status(socket)
        .with_context(|| format!("asking the switch on {}", socket.display()))?;
    if matches!(format, Format::Json) {
        println!("{}", serde_json::to_string_pretty(&s)?);
        return Ok(());
    }
    let mut t = Table::new([
        "port",
        "kind",
        "from port",
        "to port",
        "dropped (full)",
        "kicks",
        "interrupts",
        "state",
    ])
    .title("switch ports");
    for p in s["ports"].as_array().into_iter().flatten() {
        let d = &p["detail"];
        let n = |v: &serde_json::Value| v.as_u64().map(|x| x.to_string()).unwrap_or("-".into());
        t.row([
            p["name"].as_str().unwrap_or("?").to_string(),
            p["kind"].as_str().unwrap_or("?").to_string(),
            n(&p["from_port"]),
            n(&p["to_port"]),
            n(&p["dropped_full"]),
            n(&d["kicks"]),
            n(&d["interrupts"]),
            d["broken"]
                .as_str()
                .map(|b| format!("broken: {b}"))
                .unwrap_or("ok".into()),
        ]);
    }
    print!("{t}");
    println!("switch: {}", s["switch"]);
    println!("learned addresses: {}", s["macs"]);
    Ok(())
}

pub fn pktgen(a: PktgenArgs, stop: Arc<AtomicBool>) -> anyhow::Result<()> {
    if !(42..=2048).contains(&a.size) {
        bail!("--size must be 42..=2048 bytes, got {}", a.size);
    }
    if a.burst == 0 || a.burst > 4096 {
        bail!("--burst must be 1..=4096, got {}", a.burst);
    }
    if a.rate.is_some_and(|r| r <= 0.0 || r.is_nan()) {
        bail!("--rate must be positive");
    }
    let req = AttachRequest {
        name: a.name.clone(),
        mode: a.port_mode,
        itr: a.itr,
        slots: a.slots,
        buf_size: 2048,
        mac: None,
    };
    let mut port = ring::control::attach(&a.socket, &req)
        .with_context(|| format!("attaching to the switch on {}", a.socket.display()))?;
    let p = Params {
        role: a.mode,
        size: a.size,
        burst: a.burst,
        rate: a.rate,
        count: a.count,
        duration: Duration::from_secs_f64(a.duration),
        src_mac: parse_mac(&a.src_mac)?,
        dst_mac: parse_mac(&a.dst_mac)?,
    };
    let r = vswitch::pktgen::run(&mut port.driver, &p, &|| stop.load(Ordering::Relaxed));
    match a.format {
        Format::Json => println!("{}", serde_json::to_string_pretty(&r)?),
        Format::Table => {
            let mut t = Table::new(["metric", "value"]).title(format!(
                "pktgen {} on port {} ({} itr={})",
                r.mode, a.name, a.port_mode, a.itr
            ));
            t.row(["packets".to_string(), r.packets.to_string()]);
            t.row(["seconds".to_string(), format!("{:.3}", r.seconds)]);
            t.row(["Kpps".to_string(), format!("{:.1}", r.pps / 1e3)]);
            t.row(["Mbps".to_string(), format!("{:.1}", r.mbps)]);
            t.row([
                "kicks/packet".to_string(),
                format!("{:.4}", r.kicks_per_packet),
            ]);
            t.row([
                "interrupts/packet".to_string(),
                format!("{:.4}", r.interrupts_per_packet),
            ]);
            if a.mode == Role::PingPong {
                t.row([
                    "transactions/s".to_string(),
                    format!("{:.0}", r.transactions_per_sec),
                ]);
                t.row(["rtt p50 us".to_string(), format!("{:.1}", r.rtt_us_p50)]);
                t.row(["rtt p90 us".to_string(), format!("{:.1}", r.rtt_us_p90)]);
                t.row(["rtt p99 us".to_string(), format!("{:.1}", r.rtt_us_p99)]);
                t.row(["rtt max us".to_string(), format!("{:.1}", r.rtt_us_max)]);
                t.row(["lost".to_string(), r.lost.to_string()]);
            }
            print!("{t}");
        }
    }
    Ok(())
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map(|x| format!("{x:.digits$}"))
        .unwrap_or_else(|| "-".into())
}

pub fn bench(a: BenchArgs) -> anyhow::Result<()> {
    let seconds = a.seconds.unwrap_or(if a.quick { 0.3 } else { 2.0 });
    if !(0.05..=60.0).contains(&seconds) {
        bail!("--seconds must be 0.05..=60");
    }
    let backends = match a.backend {
        BackendArg::Switch => vec![Backend::Switch],
        BackendArg::Tap => vec![Backend::Tap],
        BackendArg::Both => vec![Backend::Switch, Backend::Tap],
    };
    if a.forwarding_burst == 0 || a.forwarding_burst > 1024 {
        bail!("--forwarding-burst must be 1..=1024");
    }
    let switch_cpu = match a.switch_cpu.as_str() {
        "auto" => SwitchPlacement::Auto,
        "none" => SwitchPlacement::Unpinned,
        n => SwitchPlacement::Cpu(n.parse::<usize>().ok().filter(|&c| c < 1024).with_context(
            || format!("--switch-cpu must be \"auto\", a CPU number or \"none\", got {n:?}"),
        )?),
    };
    if !(1..=14).contains(&a.memif_ring_log2) {
        bail!("--memif-ring-log2 must be 1..=14 (DPDK's memif limit)");
    }
    let memif_seconds = a.memif_seconds.unwrap_or(if a.quick {
        bench::switch::MEMIF_MIN_SECONDS
    } else {
        3.0
    });
    bench::switch::check_memif_seconds(memif_seconds)?;
    let all = a.part.is_empty();
    let part = |p: PartArg| all || a.part.contains(&p);
    let backends = if part(PartArg::Figure1) {
        backends
    } else {
        Vec::new()
    };
    // The memif rows need DPDK; when every part was asked for implicitly,
    // a machine without it skips them (and says so).
    let memif_wanted = part(PartArg::Memif);
    let memif_skipped = memif_wanted && all && bench::switch::testpmd_path().is_none();
    let json = matches!(a.format, Format::Json);
    let o = Options {
        forwarding: part(PartArg::Forwarding),
        forwarding_burst: a.forwarding_burst,
        forwarding_poll_us: a.forwarding_poll_us.min(vswitch::MAX_INTERVAL_US),
        forwarding_pin: !a.forwarding_no_pin,
        memif: (memif_wanted && !memif_skipped).then_some(bench::switch::MemifOptions {
            seconds: memif_seconds,
            ring_log2: a.memif_ring_log2,
            switch_cpu,
            moderation_us: a.memif_moderation_us,
        }),
        seconds,
        backends,
        burst: a.burst,
        progress: Some(Arc::new(move |s: &str| {
            if !json {
                eprintln!("  {s}");
            }
        })),
    };
    if !json {
        eprintln!("switch bench: {seconds} s per measurement, 4 measurements per row");
    }
    let mut doc = bench::switch::run(&o)?;
    if memif_skipped {
        doc["memif"] = serde_json::json!({"skipped": "dpdk-testpmd not installed"});
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    for (b, rows) in doc["backends"].as_object().into_iter().flatten() {
        let mut t = Table::new([
            "row",
            "TX Kpps",
            "paper",
            "RX Kpps",
            "paper",
            "Mbps 1514",
            "paper",
            "notif/pkt",
            "kicks/pkt",
            "irq/pkt",
            "RR tps",
            "paper",
            "RTT p50 us",
        ])
        .title(format!(
            "backend: {b} (paper: {})",
            if b == "switch" {
                "VALE, guest-guest"
            } else {
                "TAP, guest-host, 1 VCPU"
            }
        ));
        for row in bench::switch::ROWS {
            let r = &rows[row.key];
            let f = |k: &str, d: usize| opt(r[k].as_f64(), d);
            let p = |k: &str, d: usize| opt(r["paper"][k].as_f64(), d);
            t.row([
                row.label.to_string(),
                f("tx_kpps", 0),
                p("tx_kpps", 0),
                f("rx_kpps", 0),
                p("rx_kpps", 0),
                f("mbps_1514", 0),
                p("mbps_1514", 0),
                f("notifications_per_packet", 4),
                f("kicks_per_packet", 4),
                f("interrupts_per_packet", 4),
                f("rr_tps", 0),
                opt(r["paper"]["rr_ktps"].as_f64().map(|k| k * 1e3), 0),
                f("rtt_us_p50", 1),
            ]);
        }
        println!("{t}");
    }
    print_forwarding(&doc["forwarding"]);
    print_memif(&doc["memif"]);
    if doc["ratios"].as_object().is_some_and(|r| !r.is_empty()) {
        println!("ratios: {}", doc["ratios"]);
    }
    Ok(())
}

fn print_forwarding(f: &serde_json::Value) {
    if f.is_null() {
        return;
    }
    let n = |k: &str| f[k].as_f64().unwrap_or(f64::NAN);
    let sh = |k: &str| f["share_of_cores"][k].as_f64().unwrap_or(f64::NAN) * 100.0;
    let mut t = Table::new(["thread", "CPU s", "% of the 2 cores", "Mpps per CPU second"]).title(
        format!(
            "switch forwarding, ring port to ring port (CSB, {}-byte frames, {:.2} s; sender, switch and receiver share {} cores; {})",
            f["frame_bytes"], n("seconds"), f["share_of_cores"]["cores"],
            if f["placement"] == "pinned" {
                "sender on CPU 0, switch and receiver on CPU 1"
            } else {
                "placed by the scheduler"
            }
        ),
    );
    t.row([
        "sender (pktgen tx)".to_string(),
        format!("{:.3}", n("sender_cpu_s")),
        format!("{:.0}", sh("sender")),
        format!("{:.2}", n("sender_mpps_per_core")),
    ]);
    t.row([
        "switch".to_string(),
        format!("{:.3}", n("switch_cpu_s")),
        format!("{:.0}", sh("switch")),
        format!("{:.2}", n("switch_mpps_per_core")),
    ]);
    t.row([
        "receiver (pktgen rx)".to_string(),
        format!("{:.3}", n("receiver_cpu_s")),
        format!("{:.0}", sh("receiver")),
        format!("{:.2}", n("receiver_mpps_per_core")),
    ]);
    println!("{t}");
    println!(
        "switch forwarding loop: {:.2} Mpps per second of busy passes ({:.3} s busy of {:.3} s CPU; poll_us {})",
        n("switch_mpps_per_busy_second"),
        n("switch_busy_s"),
        n("switch_cpu_s"),
        f["switch_poll_us"]
    );
    println!(
        "switch: {:.2} Mpps per core of its CPU time ({:.2}x the 30 Mpps goal; VALE in the paper: about 20); end to end {:.2} Mpps (sender {:.2} Mpps, {} not delivered); {:.0} frames per batch, {:.0}% of passes idle{}",
        n("switch_mpps_per_core"),
        n("switch_per_core_over_goal"),
        n("end_to_end_mpps"),
        n("sender_mpps"),
        f["lost"],
        n("switch_frames_per_batch"),
        n("switch_idle_pass_share") * 100.0,
        match f["limit"].as_str() {
            Some("generator") =>
                " [generator-limited: nothing dropped and the switch mostly waited for frames]".to_string(),
            Some("receiver") => format!(
                " [receiver-limited: the switch dropped {} frames at the receiver's full ring; its per-core figure is a lower bound]",
                f["switch_dropped_at_receiver"]
            ),
            Some("switch") => " [switch-limited: nothing dropped and the switch busy on most passes]".to_string(),
            Some("lossy") => " [lossy: frames lost where no counter says; the rates bound nothing]".to_string(),
            Some("invalid") => format!(" [INVALID: {}]", f["why"].as_str().unwrap_or("?")),
            _ => String::new(),
        }
    );
}

fn print_memif(m: &serde_json::Value) {
    if m.is_null() {
        return;
    }
    if let Some(why) = m["skipped"].as_str() {
        println!("memif side-by-side skipped: {why}");
        return;
    }
    let mut t = Table::new([
        "path",
        "delivered Mpps",
        "generator Mpps",
        "refused at gen",
        "gen CPU %",
        "sink CPU %",
        "switch CPU %",
        "switch Mpps/core",
        "switch on CPU",
        "limit",
    ])
    .title(format!(
        "DPDK testpmd over memif ({}-byte frames, ring 2^{}, {} s; medians of testpmd's per-second Rx-pps/Tx-pps; switch placement {}, memif moderation {} us)",
        m["frame_bytes"], m["ring_log2"], m["seconds"],
        m["switch_cpu"].as_u64().map_or_else(|| m["switch_cpu"].as_str().unwrap_or("?").to_string(), |c| c.to_string()),
        m["switch_moderation_us"]
    ));
    for (label, r) in [
        ("testpmd -> testpmd (direct)", &m["direct"]),
        ("testpmd -> switch -> testpmd", &m["switched"]),
        (
            "one testpmd (flowgen) <-> switch",
            &m["switched_one_testpmd"],
        ),
    ] {
        let f = |k: &str, d: usize| opt(r[k].as_f64(), d);
        let pc = |k: &str| opt(r["share_of_cores"][k].as_f64().map(|x| x * 100.0), 0);
        t.row([
            label.to_string(),
            if r["valid"].as_bool() == Some(false) {
                "INVALID".to_string()
            } else {
                f("delivered_mpps", 2)
            },
            f("generator_mpps", 2),
            opt(r["generator_refused_share"].as_f64().map(|x| x * 100.0), 1) + "%",
            pc("generator"),
            pc("sink"),
            pc("switch"),
            f("switch_mpps_per_core", 2),
            match (&r["switch_pinned_cpu"], &r["switch_pinned"]) {
                (serde_json::Value::Null, _) if r.get("switch_pinned").is_none() => "-".to_string(),
                (serde_json::Value::Null, _) => "any".to_string(),
                (c, serde_json::Value::Bool(false)) => format!("{c} (pin failed)"),
                (c, _) => c.to_string(),
            },
            r["limit"].as_str().unwrap_or("?").to_string(),
        ]);
    }
    println!("{t}");
    for (label, r) in [
        ("direct", &m["direct"]),
        ("switched", &m["switched"]),
        ("one testpmd", &m["switched_one_testpmd"]),
    ] {
        if let Some(why) = r["invalid_reason"].as_str() {
            println!("{label}: INVALID, measured nothing: {why}");
        }
    }
    let ratio = |k: &str| {
        m[k].as_f64()
            .map_or("none (a row is invalid)".to_string(), |x| format!("{x:.2}"))
    };
    println!(
        "switched / direct: {}; one testpmd through the switch / direct: {} (goal >= 0.5)",
        ratio("switched_over_direct"),
        ratio("switched_one_testpmd_over_direct")
    );
}
