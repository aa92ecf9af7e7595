//! `fastpath lb bench`: forwarding rate from the in-memory generator for the
//! three traffic types of the paper's section 5.2.2, with 1 and 2 packet
//! threads, beside a null forwarder (parse, swap addresses, send back)
//! through the same pipeline in the same run: the limit of this machine.
//!
//! - SYN: every packet a new flow (backend selection and a connection-table
//!   insert per packet, as in a SYN flood).
//! - non-SYN: ACKs over 4096 established flows (connection-table hits).
//! - non-SYN over IPv6 (`non_syn_v6`): the same ACKs, 74-octet IPv6
//!   frames to an IPv6 VIP over 8 IPv6 backends (outer IPv6 and GRE),
//!   beside its own null forwarder on the same frames (`null_v6`).
//! - constant 5-tuple: one flow; steering falls back to round robin when its
//!   thread's queue is full.
//! - udp: datagrams over 4096 flows to a plain UDP VIP, the peer of:
//! - quic_plaintext, quic_single_pass, quic_four_pass: the same datagrams to
//!   a `quic = true` VIP, each a QUIC short header whose destination
//!   connection ID routes to one of the pool's 8 backends (IETF QUIC-LB, one
//!   configuration per encoding). Every one must be routed by its
//!   connection ID, or the run is refused as not measuring what it says.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::IpAddr;
use std::sync::atomic::AtomicBool;

use measure::{median, Table};
use netio::mem::{MemPort, Vary};
use packet::build::Frame;
use serde::Serialize;

use lb::config::{Config, ConfigError};
use lb::datapath::{Datapath, Params};
use lb::tables::Control;
use lb::worker::Mode;

/// Why the bench could not run.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The bench's configuration with the chosen parameters was rejected
    /// (for example too many packet threads).
    #[error("the bench's forwarder configuration: {0}")]
    Config(#[source] ConfigError),
    /// The datapath failed (packet pool, port).
    #[error("the forwarder: {0}")]
    Datapath(#[from] lb::datapath::Error),
    /// A QUIC run's datagrams were not all routed by connection ID: its
    /// rate would not be the rate of what it is named for.
    #[error("{kind}: {routed} of {packets} datagrams routed by connection ID (all must be)")]
    NotRoutedByCid {
        /// The traffic type.
        kind: String,
        /// Datagrams routed by connection ID.
        routed: u64,
        /// Datagrams sent.
        packets: u64,
    },
    /// The bench's own connection IDs could not be made.
    #[error("the bench's QUIC-LB connection IDs: {0}")]
    Cid(String),
}

/// Benchmark parameters.
#[derive(Debug, Clone, Serialize)]
pub struct BenchConfig {
    /// Packets per run.
    pub packets: u64,
    /// Packet-thread counts to measure.
    pub threads: Vec<usize>,
    /// Runs per cell (median reported).
    pub repeats: usize,
    /// Traffic types to measure (the null forwarder always runs as the peer).
    pub traffic: Vec<String>,
}

/// The traffic types, in report order.
pub const TRAFFIC: [&str; 8] = [
    "syn",
    "non_syn",
    "non_syn_v6",
    "constant",
    "udp",
    "quic_plaintext",
    "quic_single_pass",
    "quic_four_pass",
];

/// The QUIC traffic types and their configuration's codepoint in
/// [`QUIC_CONFIG`].
const QUIC_KINDS: [(&str, u8); 3] = [
    ("quic_plaintext", 0),
    ("quic_single_pass", 1),
    ("quic_four_pass", 2),
];

impl BenchConfig {
    /// The default: 4 million packets, 0 (inline), 1 and 2 packet threads,
    /// 3 runs.
    pub fn full() -> Self {
        BenchConfig {
            packets: 4_000_000,
            threads: vec![0, 1, 2],
            repeats: 3,
            traffic: TRAFFIC.map(String::from).to_vec(),
        }
    }

    /// A few seconds.
    pub fn quick() -> Self {
        BenchConfig {
            packets: 500_000,
            threads: vec![0, 1, 2],
            repeats: 1,
            traffic: TRAFFIC.map(String::from).to_vec(),
        }
    }
}

/// One measurement.
#[derive(Debug, Clone, Serialize)]
pub struct Cell {
    /// Million packets per second through the whole pipeline.
    pub mpps: f64,
    /// Wall nanoseconds per packet (1000 / mpps).
    pub ns_per_packet: f64,
    /// Rate per packet thread.
    pub mpps_per_thread: f64,
    /// This rate over the null forwarder's with the same threads (absent
    /// for the null forwarder itself).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ratio_to_null: Option<f64>,
    /// For a QUIC type: this rate over plain UDP's with the same threads
    /// (the same datagrams to a VIP without `quic`), where both ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ratio_to_udp: Option<f64>,
    /// Packets forwarded in the median run (must equal the packets sent).
    pub forwarded: u64,
    /// In the median run, the share of the run each packet thread spent
    /// on batches (the rest it waited for input); empty inline.
    pub thread_busy: Vec<f64>,
    /// In the median run, the share of the I/O (steering) thread's loop
    /// turns that found nothing to do.
    pub io_idle: f64,
}

/// What one run measured.
pub(crate) struct Run {
    /// Million packets per second.
    pub mpps: f64,
    /// Packets transmitted.
    pub forwarded: u64,
    /// Busy share per packet thread.
    pub thread_busy: Vec<f64>,
    /// Idle share of the I/O loop's turns.
    pub io_idle: f64,
}

impl Run {
    /// The figures of a run of `packets` packets.
    pub(crate) fn of(stats: &lb::datapath::RunStats, packets: u64) -> Run {
        let secs = stats.elapsed.as_secs_f64();
        Run {
            mpps: packets as f64 / secs / 1e6,
            forwarded: stats.counters.tx,
            thread_busy: stats.busy.iter().map(|b| b.as_secs_f64() / secs).collect(),
            io_idle: stats.io.idle_loops as f64 / stats.io.loops.max(1) as f64,
        }
    }
}

/// `0.91,0.88` for people.
pub(crate) fn shares(xs: &[f64]) -> String {
    if xs.is_empty() {
        return "-".into();
    }
    xs.iter()
        .map(|x| format!("{x:.2}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Parameters.
    pub config: BenchConfig,
    /// traffic type -> thread count -> cell. Traffic types: those of
    /// [`TRAFFIC`], `null` (the null forwarder) and `null_v6` (the null
    /// forwarder on the IPv6 frames).
    pub results: BTreeMap<String, BTreeMap<String, Cell>>,
    /// Each stage's nanoseconds per packet on the non-SYN traffic, timed
    /// on its own ([`crate::forwarder_stages`]), beside what the forwarder
    /// costs above null in this run.
    pub stages: Option<crate::forwarder_stages::Stages>,
    /// Non-SYN's nanoseconds per packet above null's, with the fewest
    /// packet threads measured (0: run to completion, where one core does
    /// all the work and the difference is the forwarder's own cost).
    pub above_null_ns: Option<f64>,
    /// The same stages on the IPv6 non-SYN traffic.
    pub stages_v6: Option<crate::forwarder_stages::Stages>,
    /// IPv6 non-SYN's nanoseconds per packet above `null_v6`'s, as
    /// [`Report::above_null_ns`].
    pub above_null_v6_ns: Option<f64>,
}

/// What both bench configurations share: batches, queues, the
/// connection table and the encapsulation source.
macro_rules! common_sections {
    () => {
        r#"
[forwarder]
batch = 32
queue_size = 1024
[conntrack]
size = 65536
[encap]
source = "10.0.0.1"
source6 = "fd00::1"
"#
    };
}

const CONFIG: &str = concat!(
    common_sections!(),
    r#"[[pools]]
name = "web"
backends = [
  { address = "10.1.0.1" }, { address = "10.1.0.2" }, { address = "10.1.0.3" }, { address = "10.1.0.4" },
  { address = "10.1.0.5" }, { address = "10.1.0.6" }, { address = "10.1.0.7" }, { address = "10.1.0.8" },
]
[[vips]]
name = "bench"
address = "192.0.2.80"
port = 80
protocol = "tcp"
pool = "web"
"#
);

/// The IPv6 type's load balancer: one TCP VIP over 8 IPv6 backends, as
/// [`CONFIG`] is for IPv4.
const V6_CONFIG: &str = concat!(
    common_sections!(),
    r#"[[pools]]
name = "web6"
backends = [
  { address = "fd00:1::1" }, { address = "fd00:1::2" }, { address = "fd00:1::3" }, { address = "fd00:1::4" },
  { address = "fd00:1::5" }, { address = "fd00:1::6" }, { address = "fd00:1::7" }, { address = "fd00:1::8" },
]
[[vips]]
name = "bench6"
address = "2001:db8::80"
port = 80
protocol = "tcp"
pool = "web6"
"#
);

/// The UDP and QUIC types' load balancer: a plain UDP VIP (port 53) and a
/// `quic = true` one (port 443) on the same address, over 8 backends with
/// server IDs; one QUIC-LB configuration per encoding (server ID and nonce
/// of 16 octets for the single pass).
const QUIC_CONFIG: &str = concat!(
    common_sections!(),
    r#"[[quic_lb]]
codepoint = 0
server_id_len = 2
nonce_len = 6
[[quic_lb]]
codepoint = 1
server_id_len = 2
nonce_len = 14
key = "8f95f09245765f80256934e50c66207f"
[[quic_lb]]
codepoint = 2
server_id_len = 2
nonce_len = 6
key = "fdf726a9893ec05c0632d3956680baf0"
[[pools]]
name = "h3"
backends = [
  { address = "10.1.0.1", quic_server_id = "0001" }, { address = "10.1.0.2", quic_server_id = "0002" },
  { address = "10.1.0.3", quic_server_id = "0003" }, { address = "10.1.0.4", quic_server_id = "0004" },
  { address = "10.1.0.5", quic_server_id = "0005" }, { address = "10.1.0.6", quic_server_id = "0006" },
  { address = "10.1.0.7", quic_server_id = "0007" }, { address = "10.1.0.8", quic_server_id = "0008" },
]
[[vips]]
name = "udp"
address = "192.0.2.80"
port = 53
protocol = "udp"
pool = "h3"
[[vips]]
name = "h3"
address = "192.0.2.80"
port = 443
protocol = "udp"
quic = true
pool = "h3"
"#
);

/// UDP payload octets of every UDP and QUIC datagram (a short header, a
/// connection ID of up to 17 octets, a packet number and sealed bytes).
const DATAGRAM: usize = 40;

fn ip(a: [u8; 4]) -> IpAddr {
    IpAddr::from(a)
}

/// The configuration at `codepoint` of [`QUIC_CONFIG`], as a server has it.
fn quic_lb_config(codepoint: u8) -> Result<quic_lb::Config, Error> {
    let cfg = quic_config()?;
    let q = cfg
        .quic_lb
        .iter()
        .find(|q| q.codepoint == codepoint)
        .ok_or_else(|| Error::Cid(format!("no configuration at codepoint {codepoint}")))?;
    let key = match &q.key {
        Some(k) => Some(quic_lb::parse_key(k).map_err(|e| Error::Cid(e.to_string()))?),
        None => None,
    };
    quic_lb::Config::new(
        q.codepoint,
        q.server_id_len,
        q.nonce_len,
        key,
        q.length_self_encoding,
    )
    .map_err(|e| Error::Cid(e.to_string()))
}

/// 4096 UDP datagrams of [`DATAGRAM`] octets from as many flows: to the
/// QUIC VIP, each a short header whose connection ID (configuration
/// `codepoint`) names backend `i % 8 + 1`; without a codepoint, the same
/// sizes to the plain UDP VIP.
fn udp_templates(codepoint: Option<u8>) -> Result<Vec<Vec<u8>>, Error> {
    let vip = ip([192, 0, 2, 80]);
    let config = codepoint.map(quic_lb_config).transpose()?;
    (0..4096u32)
        .map(|i| {
            let mut payload = vec![0u8; DATAGRAM];
            let dport = match &config {
                Some(c) => {
                    let sid = [0, (i % 8 + 1) as u8];
                    let mut nonce = vec![0u8; c.nonce_len()];
                    for (k, b) in nonce.iter_mut().enumerate() {
                        *b = (i >> (8 * (k % 4))) as u8 ^ k as u8;
                    }
                    let cid = c
                        .encode(&sid, &nonce, i as u8)
                        .map_err(|e| Error::Cid(e.to_string()))?;
                    // Short header: header form 0, fixed bit 1.
                    payload[0] = 0x40;
                    payload[1..1 + cid.as_bytes().len()].copy_from_slice(cid.as_bytes());
                    443
                }
                None => 53,
            };
            let mut f = Frame::udp(
                ip([198, 18, (i >> 8) as u8, i as u8]),
                vip,
                1024 + (i % 7) as u16,
                dport,
                &payload,
            )
            .to_bytes();
            f.resize(f.len().max(60), 0);
            Ok(f)
        })
        .collect()
}

/// Minimum-size (64-byte frame) TCP templates and how to vary them.
pub(crate) fn templates(kind: &str) -> (Vec<Vec<u8>>, Vary) {
    let vip = ip([192, 0, 2, 80]);
    let tcp = |src: [u8; 4], sport: u16, flags: u8| {
        let mut f = Frame::tcp(ip(src), vip, sport, 80, flags, &[0; 6]).to_bytes();
        f.resize(60, 0); // 60 bytes + 4 of FCS on the wire = 64
        f
    };
    match kind {
        // The source port is rewritten per packet: 65536 x 1024 flows.
        "syn" => (
            (0..1024u32)
                .map(|i| tcp([198, 18, (i >> 8) as u8, i as u8], 1, 0x02))
                .collect(),
            Vary::SourcePort { at: 14 + 20 },
        ),
        "constant" => (vec![tcp([198, 18, 0, 1], 5555, 0x10)], Vary::None),
        // 14 + 40 + 20 octets: longer than the minimum, no padding.
        "non_syn_v6" => (
            (0..4096u32)
                .map(|i| {
                    let mut src = [0u8; 16];
                    src[..4].copy_from_slice(&[0xfd, 0x00, 0x00, 0x18]);
                    src[12..].copy_from_slice(&i.to_be_bytes());
                    Frame::tcp(
                        IpAddr::from(src),
                        IpAddr::from([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x80]),
                        1024 + (i % 7) as u16,
                        80,
                        0x10,
                        &[0; 6],
                    )
                    .to_bytes()
                })
                .collect(),
            Vary::None,
        ),
        _ => (
            (0..4096u32)
                .map(|i| {
                    tcp(
                        [198, 18, (i >> 8) as u8, i as u8],
                        1024 + (i % 7) as u16,
                        0x10,
                    )
                })
                .collect(),
            Vary::None,
        ),
    }
}

fn measure(cfg: &Config, kind: &str, threads: usize, packets: u64) -> Result<Run, Error> {
    let quic = QUIC_KINDS.iter().find(|(k, _)| *k == kind).map(|&(_, c)| c);
    let mut cfg = if kind == "udp" || quic.is_some() {
        quic_config()?
    } else if kind.ends_with("_v6") {
        v6_config()?
    } else {
        cfg.clone()
    };
    cfg.forwarder.threads = threads;
    let control = Control::new(cfg.clone()).map_err(Error::Config)?;
    let mut params = Params::from_config(&cfg);
    if kind.starts_with("null") {
        params.mode = Mode::Null;
    }
    let dp = Datapath::new(params, control.tables())?;
    let (templates, vary) = match kind {
        "null" => templates("non_syn"),
        "null_v6" => templates("non_syn_v6"),
        "udp" => (udp_templates(None)?, Vary::None),
        _ if quic.is_some() => (udp_templates(quic)?, Vary::None),
        _ => templates(kind),
    };
    let mut port = MemPort::new(templates, vary, Some(packets));
    let stats = dp.run(&mut port, &AtomicBool::new(false))?;
    if quic.is_some() && stats.counters.quic_routed != packets {
        return Err(Error::NotRoutedByCid {
            kind: kind.to_string(),
            routed: stats.counters.quic_routed,
            packets,
        });
    }
    Ok(Run::of(&stats, packets))
}

/// The bench's load balancer: one TCP VIP over 8 backends, the pool and
/// queues sized by the thread count each run sets.
pub(crate) fn config() -> Result<Config, Error> {
    Config::parse(CONFIG, "(bench)").map_err(Error::Config)
}

/// The IPv6 type's load balancer ([`V6_CONFIG`]).
pub(crate) fn v6_config() -> Result<Config, Error> {
    Config::parse(V6_CONFIG, "(bench, IPv6)").map_err(Error::Config)
}

/// The UDP and QUIC types' load balancer ([`QUIC_CONFIG`]).
fn quic_config() -> Result<Config, Error> {
    Config::parse(QUIC_CONFIG, "(bench, QUIC)").map_err(Error::Config)
}

/// The kinds a run measures, in order: each null forwarder before the
/// traffic compared with it (`null` always, `null_v6` when an IPv6 type
/// is asked for).
fn kinds(traffic: &[String]) -> Vec<&'static str> {
    let asked = |k: &str| traffic.iter().any(|t| t == k);
    let mut out = vec!["null"];
    for k in TRAFFIC {
        if !asked(k) {
            continue;
        }
        if k.ends_with("_v6") && !out.contains(&"null_v6") {
            out.push("null_v6");
        }
        out.push(k);
    }
    out
}

/// Runs every cell; `progress` is told what runs next.
pub fn run(b: &BenchConfig, progress: &mut dyn FnMut(&str)) -> Result<Report, Error> {
    let cfg = config()?;
    let mut results: BTreeMap<String, BTreeMap<String, Cell>> = BTreeMap::new();
    for &threads in &b.threads {
        let (mut null_mpps, mut null6_mpps, mut udp_mpps) = (None, None, None);
        for kind in kinds(&b.traffic) {
            progress(&format!("{kind}, {threads} packet thread(s)"));
            let mut rates = Vec::new();
            let mut forwarded = Vec::new();
            let mut runs = Vec::new();
            for _ in 0..b.repeats.max(1) {
                let run = measure(&cfg, kind, threads, b.packets)?;
                rates.push(run.mpps);
                forwarded.push(run.forwarded);
                runs.push(run);
            }
            let mpps = median(&mut rates);
            // The busy shares of the run nearest the median.
            runs.sort_by(|a, b| a.mpps.total_cmp(&b.mpps));
            let mid = runs.swap_remove(runs.len() / 2);
            match kind {
                "null" => null_mpps = Some(mpps),
                "null_v6" => null6_mpps = Some(mpps),
                _ => {}
            }
            if kind == "udp" {
                udp_mpps = Some(mpps);
            }
            results.entry(kind.to_string()).or_default().insert(
                threads.to_string(),
                Cell {
                    mpps,
                    ns_per_packet: 1e3 / mpps,
                    mpps_per_thread: mpps / threads.max(1) as f64,
                    ratio_to_null: if kind.starts_with("null") {
                        None
                    } else if kind.ends_with("_v6") {
                        null6_mpps.map(|n| mpps / n)
                    } else {
                        null_mpps.map(|n| mpps / n)
                    },
                    ratio_to_udp: if kind.starts_with("quic") {
                        udp_mpps.map(|u| mpps / u)
                    } else {
                        None
                    },
                    forwarded: forwarded.into_iter().min().unwrap_or(0),
                    thread_busy: mid.thread_busy,
                    io_idle: mid.io_idle,
                },
            );
        }
    }
    let above = |kind: &str, null: &str| {
        let t = b.threads.iter().min()?.to_string();
        let at = |k: &str| results.get(k)?.get(&t).map(|c| c.ns_per_packet);
        Some(at(kind)? - at(null)?)
    };
    let above_null_ns = above("non_syn", "null");
    let above_null_v6_ns = above("non_syn_v6", "null_v6");
    let mut stages_of = |kind: &str| {
        if !b.traffic.iter().any(|t| t == kind) {
            return Ok(None);
        }
        progress(&format!("the {kind} packet's stages, each on its own"));
        crate::forwarder_stages::measure(kind).map(Some)
    };
    let stages = stages_of("non_syn")?;
    let stages_v6 = stages_of("non_syn_v6")?;
    Ok(Report {
        config: b.clone(),
        results,
        stages,
        above_null_ns,
        stages_v6,
        above_null_v6_ns,
    })
}

impl Report {
    /// Tables for people, with the paper's figures and the goals.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "Forwarder throughput from the in-memory generator, 64-byte TCP frames (UDP and QUIC: {}-octet datagrams), {} packets per run, median of {}\n",
            DATAGRAM + 42,
            self.config.packets,
            self.config.repeats
        );
        let mut t = Table::new([
            "traffic",
            "threads",
            "Mpps",
            "ns/packet",
            "Mpps/thread",
            "x null",
            "x udp",
            "busy/thread",
            "I/O idle",
        ]);
        for kind in kinds(&TRAFFIC.map(String::from)) {
            for (threads, c) in self.results.get(kind).into_iter().flatten() {
                t.row([
                    kind.to_string(),
                    threads.clone(),
                    format!("{:.2}", c.mpps),
                    format!("{:.1}", c.ns_per_packet),
                    format!("{:.2}", c.mpps_per_thread),
                    c.ratio_to_null.map_or("-".into(), |r| format!("{r:.2}")),
                    c.ratio_to_udp.map_or("-".into(), |r| format!("{r:.2}")),
                    shares(&c.thread_busy),
                    format!("{:.2}", c.io_idle),
                ]);
            }
        }
        let _ = writeln!(out, "{t}");
        let _ = writeln!(
            out,
            "null = the same pipeline with packet threads that only parse and swap addresses (this machine's limit).\n\
             Paper (section 3.1, 5.2): about 350 ns per packet per thread, i.e. about 2.9 Mpps per packet thread.\n\
             threads 0 = run to completion: generator, steering, packet work and muxing on one core.\n\
             busy/thread = share of the run each packet thread spent on batches; I/O idle = share of the \
             steering thread's loop turns with nothing to do (near 0: steering is the limit).\n\
             x udp = a QUIC type's rate over plain UDP's (the same datagrams to a VIP without quic): what routing by connection ID costs.\n\
             Goals: non-SYN at least 10 Mpps per packet thread and at least 0.5 of null; QUIC plaintext at least 0.8 of UDP."
        );
        for (what, st, above) in [
            ("a non-SYN", &self.stages, self.above_null_ns),
            ("an IPv6 non-SYN", &self.stages_v6, self.above_null_v6_ns),
        ] {
            let Some(st) = st else { continue };
            let mut t = Table::new(["stage", "ns/packet"]);
            for s in &st.stages {
                t.row([s.stage.clone(), format!("{:.1}", s.ns)]);
            }
            t.row([
                "sum beyond the null forwarder's".to_string(),
                format!("{:.1}", st.sum_ns),
            ]);
            if let Some(a) = above {
                t.row([
                    "above the null forwarder, this run".to_string(),
                    format!("{a:.1}"),
                ]);
                t.row([
                    "rest (batch loop, counters, queues)".to_string(),
                    format!("{:.1}", a - st.sum_ns),
                ]);
            }
            let _ = writeln!(
                out,
                "\nWhere {what} packet's time goes, each stage timed on its own over the same 4,096 flows, one thread, on {}:\n{t}",
                st.cpu
            );
        }
        if self.stages.is_some() || self.stages_v6.is_some() {
            let _ = writeln!(
                out,
                "The sum leaves out parse (the null forwarder parses too) and maglev_pick (what a connection-table \
                 miss adds; non-SYN hits). Stages timed alone miss what the pipeline overlaps (prefetches) and what \
                 it adds (the batch loop, counters): the rest is the difference, and may be negative."
            );
        }
        out
    }
}
