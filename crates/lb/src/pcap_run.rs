//! `fastpath lb run --pcap-in`: forward a capture through the datapath into
//! another capture, then report what happened.

use std::path::Path;
use std::sync::atomic::AtomicBool;

use measure::Table;
use netio::pcap::PcapPort;

use crate::datapath::{Datapath, Params, RunStats};
use crate::tables::{Control, Tables};
use crate::Config;

/// Errors of a pcap run.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bad configuration.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// The datapath failed.
    #[error(transparent)]
    Datapath(#[from] crate::datapath::Error),
    /// A pcap file failed.
    #[error(transparent)]
    Port(#[from] netio::Error),
}

/// Runs `input` through the forwarder configured by `config` into `output`.
pub fn run(
    config: &Path,
    input: &Path,
    output: &Path,
    threads: Option<usize>,
) -> Result<(RunStats, std::sync::Arc<Tables>), Error> {
    let mut checked = Config::load(config)?;
    if let Some(t) = threads {
        checked = checked.with_threads(t, &config.display().to_string())?;
    }
    let cfg = checked.config;
    let control = Control::new(cfg.clone())?;
    let dp = Datapath::new(Params::from_config(&cfg), control.tables())?;
    let mut port = PcapPort::open(input, Some(output))?;
    let stats = dp.run(&mut port, &AtomicBool::new(false))?;
    port.finish()?;
    Ok((stats, control.tables().load_full()))
}

/// The counters as tables for people.
pub fn report(s: &RunStats, t: &Tables) -> String {
    let c = &s.counters;
    let mut out = String::new();
    let mut sum = Table::new(["", "packets"]).title("Forwarder");
    sum.row(["received from the port".to_string(), s.port.rx.to_string()]);
    sum.row([
        "too big for a buffer".to_string(),
        s.port.rx_too_big.to_string(),
    ]);
    sum.row(["processed by packet threads".to_string(), c.rx.to_string()]);
    sum.row(["forwarded (GRE)".to_string(), c.tx.to_string()]);
    sum.row([
        "dropped".to_string(),
        c.dropped_excluding_not_for_vip().to_string(),
    ]);
    sum.row([
        "not for a VIP (not IP, or no VIP matches)".to_string(),
        c.not_for_vip().to_string(),
    ]);
    sum.row(["written to the port".to_string(), s.port.tx.to_string()]);
    sum.row([
        "user-space copies (per forwarded packet)".to_string(),
        format!("{} ({:.2})", c.user_copies, c.copies_per_forwarded()),
    ]);
    out.push_str(&format!("{sum}\n"));
    for (title, rows) in [
        ("drop reason", c.drop_table_excluding_not_for_vip()),
        ("not for a VIP", c.not_for_vip_table()),
    ] {
        if !rows.is_empty() {
            let mut d = Table::new([title, "packets"]);
            for (n, v) in rows {
                d.row([n.to_string(), v.to_string()]);
            }
            out.push_str(&format!("{d}\n"));
        }
    }
    let ct = &c.conntrack;
    let mut k = Table::new(["conntrack", "count"]);
    for (n, v) in [
        ("hits", ct.hits),
        ("misses", ct.misses),
        ("inserts", ct.inserts),
        ("insert failures (table full)", ct.insert_failures),
        ("expiries", ct.expiries),
        ("fragments held", c.frag_held),
        ("fragments released", c.frag_released),
        (
            "ICMP errors to the quoted flow's backend",
            c.icmp_to_backend,
        ),
        ("unserved ports refused: TCP RST", c.refused_tcp_rst),
        (
            "unserved ports refused: ICMP port unreachable",
            c.refused_icmp_unreachable,
        ),
        (
            "unserved ports left unanswered (refusal rate)",
            c.refusal_rate_limited,
        ),
    ] {
        k.row([n.to_string(), v.to_string()]);
    }
    out.push_str(&format!("{k}\n"));
    let mut v = Table::new(["vip", "packets", "bytes"]);
    for (i, vip) in t.vips.iter().enumerate() {
        let tr = c.per_vip.get(i).copied().unwrap_or_default();
        v.row([
            vip.name.clone(),
            tr.packets.to_string(),
            tr.bytes.to_string(),
        ]);
    }
    out.push_str(&format!("{v}\n"));
    let mut b = Table::new(["backend", "healthy", "packets", "bytes"]);
    for (i, be) in t.backends.iter().enumerate().filter(|(_, b)| b.configured) {
        let tr = c.per_backend.get(i).copied().unwrap_or_default();
        b.row([
            be.name.clone(),
            be.healthy.to_string(),
            tr.packets.to_string(),
            tr.bytes.to_string(),
        ]);
    }
    out.push_str(&format!("{b}\n"));
    out.push_str(&format!(
        "{} packet thread(s), {:.1} ms, steering fallbacks {}, packet pool {} buffers\n",
        s.per_thread.len(),
        s.elapsed.as_secs_f64() * 1e3,
        s.io.fallback,
        s.pool.buffers
    ));
    out
}

/// The counters as one JSON document.
pub fn json(s: &RunStats, t: &Tables) -> serde_json::Value {
    let c = &s.counters;
    let by_name = |rows: Vec<(&str, u64)>| -> serde_json::Map<String, serde_json::Value> {
        rows.into_iter()
            .map(|(n, v)| (n.to_string(), v.into()))
            .collect()
    };
    let drops = by_name(c.drop_table_excluding_not_for_vip());
    let vips: Vec<serde_json::Value> = t
        .vips
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let tr = c.per_vip.get(i).copied().unwrap_or_default();
            serde_json::json!({"name": v.name, "packets": tr.packets, "bytes": tr.bytes})
        })
        .collect();
    let backends: Vec<serde_json::Value> = t
        .backends
        .iter()
        .enumerate()
        .filter(|(_, b)| b.configured)
        .map(|(i, b)| {
            let tr = c.per_backend.get(i).copied().unwrap_or_default();
            serde_json::json!({"name": b.name, "healthy": b.healthy, "packets": tr.packets, "bytes": tr.bytes})
        })
        .collect();
    serde_json::json!({
        "port": {"rx": s.port.rx, "tx": s.port.tx, "rx_too_big": s.port.rx_too_big},
        "processed": c.rx,
        "forwarded": c.tx,
        // As in the daemon's /status: frames that were not for a VIP are
        // not drops.
        "dropped": c.dropped_excluding_not_for_vip(),
        "drops": drops,
        "not_for_vip": c.not_for_vip(),
        "not_for_vip_by_kind": by_name(c.not_for_vip_table()),
        "conntrack": {
            "hits": c.conntrack.hits, "misses": c.conntrack.misses, "inserts": c.conntrack.inserts,
            "insert_failures": c.conntrack.insert_failures, "expiries": c.conntrack.expiries,
        },
        "fragments": {"held": c.frag_held, "released": c.frag_released},
        "icmp_to_backend": c.icmp_to_backend,
        "refusals": {
            "tcp_rst": c.refused_tcp_rst,
            "icmp_unreachable": c.refused_icmp_unreachable,
            "rate_limited": c.refusal_rate_limited,
        },
        "user_copies": c.user_copies,
        "user_copies_per_forwarded": c.copies_per_forwarded(),
        "vips": vips,
        "backends": backends,
        "threads": s.per_thread.len(),
        "steering_fallbacks": s.io.fallback,
    })
}
