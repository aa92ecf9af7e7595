//! `fastpath lb check-config FILE`: validate a configuration without
//! running it, and show what it resolves to.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;
use serde::Serialize;

use crate::Format;

/// Check a load balancer configuration without running it.
///
/// Loads FILE through the same function as `lb run` and every reload
/// (every section, every cross-reference: pools that exist, include cycles
/// and depth, duplicate addresses, sizes and names within their bounds,
/// address classes, health checks, [api] token_file read as the daemon
/// reads it, [bgp] vips_file, [fleet], [tracer]; and the memory the
/// forwarder would allocate against what this machine has), builds the
/// Maglev tables, and prints the VIPs, the pools with their backends as
/// they resolve (includes flattened), the daemon's sections and the memory
/// estimate part by part. For `quic` VIPs: the QUIC-LB configurations they
/// route connection IDs by (codepoint, encoding, server ID and nonce
/// lengths, where the key comes from, never the key) and each backend's
/// server ID. Exit status 0 when the file is valid, 1 with the
/// file, the key and the problem when it is not: for scripts and CI before
/// a reload.
/// What is valid but likely not meant is printed as a warning (JSON:
/// `warnings`): for example health checks that go straight to backends
/// behind decap agents, which cannot see a dead agent (use `via = "tunnel"`).
///
/// The file alone is checked, wherever it is checked (CI, a laptop); with
/// --host, also what it needs of this machine, the one it is to run on:
/// BIRD's control socket ([bgp] birdc's -s, else /run/bird/bird.ctl)
/// exists, is a socket and answers, birdc is found, the routes files'
/// directories exist and take a new file, no VIP is this host's own
/// address or in a prefix it routes to itself (its loopback), and
/// [api] token_file is readable by its owner alone. Every such problem is
/// printed (JSON: `host_problems`), and any of them makes the exit status 1.
///
/// Examples:
///   fastpath lb check-config examples/lb.toml
///   fastpath lb check-config /etc/fastpath/lb.toml --host
///   fastpath lb check-config /etc/fastpath/lb.toml --format json | jq '.vips[].fingerprint'
#[derive(Args)]
#[command(verbatim_doc_comment)]
pub struct CheckConfigArgs {
    /// The configuration file.
    file: PathBuf,
    /// Also check this host: BIRD's socket, the routes' directories, VIPs
    /// that are this host's own addresses, the token file's mode.
    #[arg(long)]
    host: bool,
    /// `table`: tables for people; `json`: the summary as one document.
    #[arg(long, value_enum, default_value = "table")]
    format: Format,
}

/// A VIP as it resolves.
#[derive(Serialize)]
struct VipSummary {
    name: String,
    matches: String,
    pool: String,
    backends_in_table: usize,
    backends: usize,
    table_size: u64,
    fingerprint: String,
    /// Routes UDP by QUIC connection ID (`quic = true`), by `quic_lb`.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    quic: bool,
}

/// A `[[quic_lb]]` configuration, as `quic` VIPs route by it.
#[derive(Serialize)]
struct QuicLbSummary {
    codepoint: u8,
    /// "plaintext", "single-pass" or "four-pass".
    encoding: &'static str,
    server_id_len: usize,
    nonce_len: usize,
    /// Where the key comes from: "inline" (in the file), "file PATH", or
    /// "none" (plaintext). Never the key.
    key: String,
    /// Servers write the connection ID's length into its first octet.
    length_self_encoding: bool,
}

/// A pool's backend as it resolves.
#[derive(Serialize)]
struct BackendSummary {
    name: String,
    address: String,
    weight: u32,
    /// Its QUIC-LB server ID (hex), when it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    quic_server_id: Option<String>,
}

/// A pool as it resolves.
#[derive(Serialize)]
struct PoolSummary {
    name: String,
    table_size: u64,
    health: String,
    backends: Vec<BackendSummary>,
}

/// The whole summary.
#[derive(Serialize)]
struct Summary {
    file: String,
    valid: bool,
    vips: Vec<VipSummary>,
    /// The QUIC-LB configurations `quic` VIPs route by (every `quic` VIP
    /// shares them).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    quic_lb: Vec<QuicLbSummary>,
    pools: Vec<PoolSummary>,
    api: Option<String>,
    bgp: Option<String>,
    fleet_peers: Vec<String>,
    tracer: bool,
    table_memory_bytes: u64,
    /// What the forwarder would allocate, in all.
    memory_bytes: u64,
    /// The same, part by part.
    memory: Vec<lb::config::MemoryPart>,
    /// What this process may allocate, and which limit says so.
    machine_memory: Option<lb::config::MachineMemory>,
    /// What deserves a look but does not stop a start (VIPs that `[bgp]`
    /// will not announce among them).
    warnings: Vec<String>,
    /// With `--host`: what this host lacks for the file, each as `file:
    /// key: problem` (none: it has all it needs); absent without.
    #[serde(skip_serializing_if = "Option::is_none")]
    host_problems: Option<Vec<String>>,
}

/// Runs `lb check-config`: the summary of a valid file as a report; the
/// first problem of an invalid one as the error.
pub fn run(a: CheckConfigArgs) -> anyhow::Result<()> {
    let s = summarize(&a.file, a.host)?;
    crate::report::emit(a.format, &s)?;
    if !a.format.is_text() {
        // The document holds them; a person running a script sees them too.
        for w in &s.warnings {
            eprintln!("warning: {w}");
        }
    }
    match &s.host_problems {
        Some(problems) if !problems.is_empty() => anyhow::bail!(
            "{} problem(s) on this host (--host):\n  {}",
            problems.len(),
            problems.join("\n  ")
        ),
        _ => Ok(()),
    }
}

/// Loads and checks `file` as `lb run` does, builds its tables, and
/// summarizes what it resolves to; with `host`, also checks this host
/// for it ([`lb::config::Config::check_host`]).
fn summarize(file: &Path, host: bool) -> anyhow::Result<Summary> {
    let checked = lb::config::Config::load(file)?;
    let cfg = &checked.config;
    let host_problems = host.then(|| {
        cfg.check_host(&file.display().to_string())
            .iter()
            .map(ToString::to_string)
            .collect()
    });
    let control = lb::tables::Control::new(cfg.clone())
        .with_context(|| format!("building the tables of {}", file.display()))?;
    let tables = control.tables().load_full();
    let mut pools = Vec::new();
    for p in &cfg.pools {
        let members = cfg
            .flatten(&p.name)
            .with_context(|| format!("pool {}", p.name))?;
        pools.push(PoolSummary {
            name: p.name.clone(),
            table_size: p.table_size,
            health: match &p.health {
                None => "none (always up)".into(),
                Some(h) => format!(
                    "{:?} port {} every {} ms, timeout {} ms, rise {}, fall {}",
                    h.kind, h.port, h.interval_ms, h.timeout_ms, h.rise, h.fall
                )
                .to_lowercase(),
            },
            backends: members
                .iter()
                .map(|m| BackendSummary {
                    name: m.name.clone().unwrap_or_else(|| m.address.to_string()),
                    address: m.address.to_string(),
                    weight: m.weight,
                    quic_server_id: m.quic_server_id.clone(),
                })
                .collect(),
        });
    }
    let mut vips = Vec::new();
    let mut memory = 0u64;
    for (v, t) in cfg.vips.iter().zip(tables.vips.iter()) {
        let size = cfg
            .pools
            .iter()
            .find(|p| p.name == v.pool)
            .map_or(0, |p| p.table_size);
        // One u32 slot per entry of the lookup table.
        memory += size * 4;
        let matches = match (&v.address, &v.prefix_group, &v.suffix) {
            (Some(a), _, _) => a.to_string(),
            (None, Some(g), Some(s)) => format!("{s} in each cluster of {g}"),
            _ => "?".into(),
        };
        vips.push(VipSummary {
            name: v.name.clone(),
            matches: format!(
                "{matches}:{} {:?}",
                v.port.map_or("any".to_string(), |p| p.to_string()),
                v.protocol
            )
            .to_lowercase(),
            pool: v.pool.clone(),
            backends_in_table: t.slots.len(),
            backends: t.backends.len(),
            table_size: size,
            fingerprint: format!("{:016x}", t.fingerprint),
            quic: v.quic,
        });
    }
    // Keys as the daemon reads them (Config::load read them already).
    let quic_configs = cfg
        .quic_configs()
        .with_context(|| format!("quic_lb of {}", file.display()))?;
    let quic_lb = cfg
        .quic_lb
        .iter()
        .map(|q| QuicLbSummary {
            codepoint: q.codepoint,
            encoding: quic_configs
                .get(q.codepoint)
                .map_or("?", |c| c.encoding().name()),
            server_id_len: q.server_id_len,
            nonce_len: q.nonce_len,
            key: match (&q.key, &q.key_file) {
                (Some(_), _) => "inline".into(),
                (None, Some(f)) => format!("file {}", f.display()),
                (None, None) => "none".into(),
            },
            length_self_encoding: q.length_self_encoding,
        })
        .collect();
    Ok(Summary {
        file: file.display().to_string(),
        valid: true,
        vips,
        quic_lb,
        pools,
        api: cfg.api.listen.map(|l| {
            format!(
                "{l}{}",
                if cfg.api.token_file.is_some() {
                    " (token)"
                } else {
                    ""
                }
            )
        }),
        bgp: cfg.bgp.as_ref().map(|b| {
            let families: Vec<String> = lbd::announce::targets(b)
                .iter()
                .map(|t| {
                    format!(
                        "{} in BIRD protocol {} from {}",
                        t.family,
                        t.protocol,
                        t.routes_file.display()
                    )
                })
                .collect();
            format!("{} via {:?}", families.join(", "), b.birdc.join(" "))
        }),
        fleet_peers: cfg
            .fleet
            .as_ref()
            .map(|f| f.peers.iter().map(|p| p.to_string()).collect())
            .unwrap_or_default(),
        tracer: cfg.tracer.enabled,
        table_memory_bytes: memory,
        memory_bytes: checked.memory.total(),
        memory: checked.memory.parts.clone(),
        machine_memory: checked.machine.clone(),
        warnings: checked
            .warnings
            .iter()
            .cloned()
            .chain(lbd::health::warnings(cfg))
            .chain(lbd::announce::unannounced(cfg))
            .collect(),
        host_problems,
    })
}

impl crate::report::Report for Summary {
    fn to_text(&self) -> String {
        summary_text(self)
    }
}

/// The summary for people: the VIP table, the pools, memory, warnings.
fn summary_text(s: &Summary) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(out, "{}: valid", s.file);
    let mut t = measure::Table::new([
        "vip",
        "matches",
        "pool",
        "in table",
        "table size",
        "fingerprint",
    ]);
    for v in &s.vips {
        t.row([
            v.name.clone(),
            v.matches.clone(),
            v.pool.clone(),
            format!("{} of {}", v.backends_in_table, v.backends),
            v.table_size.to_string(),
            v.fingerprint.clone(),
        ]);
    }
    let _ = writeln!(out, "\n{t}");
    let quic_vips: Vec<&str> = s
        .vips
        .iter()
        .filter(|v| v.quic)
        .map(|v| v.name.as_str())
        .collect();
    if !quic_vips.is_empty() {
        let mut q = measure::Table::new([
            "quic vip",
            "codepoint",
            "encoding",
            "server id",
            "nonce",
            "key",
            "length in first octet",
        ]);
        for v in &quic_vips {
            for (i, c) in s.quic_lb.iter().enumerate() {
                q.row([
                    if i == 0 { v.to_string() } else { String::new() },
                    c.codepoint.to_string(),
                    c.encoding.to_string(),
                    format!("{} octets", c.server_id_len),
                    format!("{} octets", c.nonce_len),
                    c.key.clone(),
                    if c.length_self_encoding { "yes" } else { "no" }.to_string(),
                ]);
            }
        }
        let _ = writeln!(out, "{q}");
    }
    let server_ids = s
        .pools
        .iter()
        .any(|p| p.backends.iter().any(|b| b.quic_server_id.is_some()));
    let mut head = vec!["pool", "backend", "address", "weight", "health"];
    if server_ids {
        head.push("quic server id");
    }
    let mut p = measure::Table::new(head);
    for pool in &s.pools {
        for (i, b) in pool.backends.iter().enumerate() {
            p.row(
                [
                    if i == 0 {
                        pool.name.clone()
                    } else {
                        String::new()
                    },
                    b.name.clone(),
                    b.address.clone(),
                    if b.weight == 0 {
                        "0 (drained)".to_string()
                    } else {
                        b.weight.to_string()
                    },
                    if i == 0 {
                        pool.health.clone()
                    } else {
                        String::new()
                    },
                ]
                .into_iter()
                .chain(server_ids.then(|| b.quic_server_id.clone().unwrap_or_else(|| "-".into())))
                .collect::<Vec<_>>(),
            );
        }
    }
    let _ = writeln!(out, "{p}");
    let _ = writeln!(
        out,
        "api: {}\nbgp: {}\nfleet: {}\ntracer: {}\nlookup tables: {:.1} MiB",
        s.api.as_deref().unwrap_or("off"),
        s.bgp.as_deref().unwrap_or("off (no announcements)"),
        if s.fleet_peers.is_empty() {
            "off (a single load balancer)".to_string()
        } else {
            s.fleet_peers.join(", ")
        },
        if s.tracer { "on" } else { "off" },
        s.table_memory_bytes as f64 / (1 << 20) as f64
    );
    let _ = writeln!(
        out,
        "memory: about {:.1} MiB for the forwarder{}",
        s.memory_bytes as f64 / (1 << 20) as f64,
        s.machine_memory.as_ref().map_or(String::new(), |m| format!(
            ", of {:.1} MiB this process may have ({})",
            m.bytes as f64 / (1 << 20) as f64,
            m.source
        ))
    );
    let mut m = measure::Table::new(["key", "MiB", "what"]);
    for part in &s.memory {
        m.row([
            part.key.to_string(),
            format!("{:.1}", part.bytes as f64 / (1 << 20) as f64),
            part.what.clone(),
        ]);
    }
    let _ = writeln!(out, "{m}");
    for w in &s.warnings {
        let _ = writeln!(out, "warning: {w}");
    }
    match &s.host_problems {
        None => {}
        Some(p) if p.is_empty() => {
            let _ = writeln!(out, "host: has what the file needs");
        }
        Some(p) => {
            for problem in p {
                let _ = writeln!(out, "host problem: {problem}");
            }
        }
    }
    out
}
