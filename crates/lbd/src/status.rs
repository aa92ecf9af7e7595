//! The `/status` document: what the daemon runs and has done, as JSON for
//! programs ([`Status`]) and as tables for people ([`Status::to_text`]),
//! built from one look at the shared state ([`status`]).
//!
//! Documents from older versions still parse: fields added since default,
//! renamed ones are read under their old names too.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use serde::Serialize;

use crate::state::Shared;

/// BGP as BIRD said it when the BGP task last read it, beside what the
/// controller wants (none without `[bgp]`, and before its first step),
/// with the reading's age (`read_ms_ago`). No request waits for BIRD:
/// the task reads it at every poll and right after each change it makes.
fn bgp(shared: &Shared) -> Option<crate::announce::BgpStatus> {
    let (plan, reading) = shared.bgp.last()?;
    Some(crate::announce::status(&plan, &reading))
}

/// The graceful stop in `/status`, once begun.
fn stopping(shared: &Shared) -> Option<StoppingStatus> {
    let s = shared.stopping.get()?;
    Some(StoppingStatus {
        since_s: s.since.elapsed().as_secs_f64(),
        phase: if s.withdrawn {
            "draining"
        } else {
            "withdrawing"
        }
        .into(),
        drain_ms: s.drain_ms,
        could_not: s.could_not,
    })
}

/// A graceful stop under way, in `/status`.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct StoppingStatus {
    /// Seconds since the stop began (the signal).
    pub since_s: f64,
    /// `withdrawing` (asking BIRD to withdraw the VIPs) or `draining`
    /// (forwarding until the router has moved the traffic away).
    pub phase: String,
    /// The most the stop takes from its signal, milliseconds (`[bgp]
    /// drain_ms`; a withdrawal BIRD does not answer ends within it).
    pub drain_ms: u64,
    /// What the withdrawal could not do (the VIPs it left announced).
    pub could_not: Option<String>,
}

impl StoppingStatus {
    /// The line of `fastpath lb status`.
    pub fn to_text(&self) -> String {
        let mut out = format!(
            "STOPPING for {:.1} s (at most {:.1} s): {}\n",
            self.since_s,
            self.drain_ms as f64 / 1000.0,
            match (self.phase.as_str(), &self.could_not) {
                ("withdrawing", _) => "withdrawing the VIPs",
                (_, None) => "VIPs withdrawn, draining",
                (_, Some(_)) => "draining; the withdrawal FAILED",
            }
        );
        if let Some(c) = &self.could_not {
            out += &format!("  could not withdraw: {c}\n");
        }
        out
    }
}

/// The `/status` document.
pub fn status(shared: &Shared) -> Status {
    let (c, forwarded_in_driver) = shared.datapath.counters_and_driver();
    // The tables and the configuration they were built from, together.
    let (tables, cfg) = {
        let control = shared.control();
        (control.tables().load_full(), control.config().clone())
    };
    // What BIRD says now, beside what the controller wants.
    let bgp = bgp(shared);
    let fleet = crate::tasks::peers::status(&tables, &c, &cfg);
    // The weight written in the configuration and the drain state, by
    // backend name, per pool (the tables hold 0 for a drained backend).
    let mut configured: HashMap<&str, HashMap<String, (u32, bool)>> = HashMap::new();
    let backend = |id: u32, weight: u32, written: Option<&(u32, bool)>| {
        let b = &tables.backends[id as usize];
        let t = c.per_backend.get(id as usize).copied().unwrap_or_default();
        let (weight, drained) = match written {
            Some(&(w, d)) => (w, d || w == 0),
            None => (weight, weight == 0),
        };
        BackendStatus {
            name: b.name.clone(),
            address: packet::flow::to_ip(&b.addr).to_string(),
            healthy: b.healthy,
            packets: t.packets,
            bytes: t.bytes,
            weight,
            drained,
        }
    };
    let pool = shared.datapath.pool.stats();
    let memory = tables.memory();
    Status {
        driver: shared.datapath.driver.clone(),
        pool_buffers: pool.buffers,
        pool_in_use: pool.in_use,
        generation: shared.file.generation.load(Ordering::Relaxed),
        tables_generation: tables.generation,
        health_changes: shared.health.changes.load(Ordering::Relaxed),
        runtime_changes: shared.changes.runtime_changes.load(Ordering::Relaxed),
        runtime_change_failures: shared
            .changes
            .runtime_change_failures
            .load(Ordering::Relaxed),
        tables_bytes: memory.total as u64,
        distinct_tables: memory.distinct_tables,
        uptime_s: shared.started.elapsed().as_secs_f64(),
        reloads: shared.changes.reloads.load(Ordering::Relaxed),
        reload_failures: shared.changes.reload_failures.load(Ordering::Relaxed),
        last_reload_error: shared
            .changes
            .last_reload_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone(),
        forwarded: c.tx,
        forwarded_in_driver,
        dropped: c.dropped_excluding_not_for_vip(),
        drops: c
            .drop_table_excluding_not_for_vip()
            .into_iter()
            .map(|(n, v)| (n.to_string(), v))
            .collect(),
        not_for_vip: c.not_for_vip(),
        not_for_vip_by_kind: c
            .not_for_vip_table()
            .into_iter()
            .map(|(n, v)| (n.to_string(), v))
            .collect(),
        csum_completed: c.csum_completed,
        refusals: RefusalStatus::of(&c),
        quic: cfg.vips.iter().any(|v| v.quic).then(|| QuicStatus::of(&c)),
        conntrack_entries: c.conntrack.entries,
        active_connections: Some(c.conntrack.active()),
        gateway: Some(shared.gateway.status()),
        bgp_announced: bgp.as_ref().map(|b| b.announced),
        bgp_error: bgp.as_ref().and_then(|b| b.error.clone()),
        bgp,
        stopping: stopping(shared),
        encap: Some(EncapStatus::of(&cfg.encap)),
        fleet,
        tracer: shared.datapath.tracer.as_ref().map(|t| TracerStatus {
            reports: c.trace_reports,
            rate_limited: c.trace_rate_limited,
            queue_full: c.trace_queue_full,
            invalid: c.trace_invalid,
            sent: t.sent.load(Ordering::Relaxed),
            send_errors: t.send_errors.load(Ordering::Relaxed),
        }),
        api: Some(ApiStatus {
            connections: shared.api_connections.open(),
            max_connections: shared.api_connections.cap(),
            refused: shared.api_connections.refused(),
        }),
        config_source: Some(config_source(shared)),
        vips: tables
            .vips
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let t = c.per_vip.get(i).copied().unwrap_or_default();
                let written = configured
                    .entry(v.pool.as_str())
                    .or_insert_with(|| crate::runtime::configured(&cfg, &v.pool));
                VipStatus {
                    name: v.name.clone(),
                    packets: t.packets,
                    bytes: t.bytes,
                    healthy_backends: v.slots.len(),
                    backends: v
                        .backends
                        .iter()
                        .zip(&v.weights)
                        .map(|(&id, &w)| {
                            backend(id, w, written.get(&tables.backends[id as usize].name))
                        })
                        .collect(),
                    fingerprint: format!("{:016x}", v.fingerprint),
                    pool: v.pool.clone(),
                    table_bytes: memory.per_vip.get(i).map_or(0, |&b| b as u64),
                    table_size: cfg
                        .pools
                        .iter()
                        .find(|p| p.name == v.pool)
                        .map_or(0, |p| p.table_size),
                }
            })
            .collect(),
    }
}

/// A backend in `/status`.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct BackendStatus {
    /// Name.
    pub name: String,
    /// Address.
    pub address: String,
    /// Health.
    pub healthy: bool,
    /// Packets forwarded to it, for every VIP it serves (the same under
    /// each of them: the datapath counts per backend, not per VIP and
    /// backend).
    pub packets: u64,
    /// Bytes forwarded to it, for every VIP it serves.
    pub bytes: u64,
    /// Its weight in the VIP's pool as configured, kept while drained
    /// (absent in older documents: 0; older versions wrote 0 when drained).
    #[serde(default)]
    pub weight: u32,
    /// Drained (listed in its pool's `drained`, or weight 0): it keeps its
    /// connections but takes no new ones; `weight` is what undrain restores.
    #[serde(default)]
    pub drained: bool,
}

impl BackendStatus {
    /// Its state in words that do not contradict each other: "drained"
    /// (no new connections; health aside), "drained, DOWN", "up" or "DOWN".
    pub fn state(&self) -> &'static str {
        match (self.drained, self.healthy) {
            (true, true) => "drained",
            (true, false) => "drained, DOWN",
            (false, true) => "up",
            (false, false) => "DOWN",
        }
    }
}

/// A VIP in `/status`.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct VipStatus {
    /// Name.
    pub name: String,
    /// Packets forwarded for it.
    pub packets: u64,
    /// Bytes.
    pub bytes: u64,
    /// Backends in its Maglev table now.
    pub healthy_backends: usize,
    /// All its backends.
    pub backends: Vec<BackendStatus>,
    /// The table fingerprint, 16 hex digits: a stable hash of its Maglev
    /// table and backends (`lb::tables::Vip::fingerprint`). Load balancers
    /// with the same fingerprint pick the same backend for every flow.
    /// Empty in documents from versions without it.
    #[serde(default)]
    pub fingerprint: String,
    /// Its pool (empty in older documents).
    #[serde(default)]
    pub pool: String,
    /// Bytes of its Maglev table and backend lists (a table it shares
    /// with other VIPs counted here too; 0 in older documents).
    #[serde(default)]
    pub table_bytes: u64,
    /// Its pool's Maglev table size M (0 in older documents).
    #[serde(default)]
    pub table_size: u64,
}

/// `[encap]` in `/status`: how this load balancer encapsulates, for the
/// fleet comparison (its own addresses differ from its peers' by design;
/// the families it reaches backends in, the source prefixes and the TTL
/// must not).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct EncapStatus {
    /// Outer source towards IPv4 backends.
    pub source: Option<String>,
    /// Outer source towards IPv6 backends.
    pub source6: Option<String>,
    /// The prefix IPv4 outer sources are spread over, if any.
    pub source_prefix: Option<String>,
    /// The prefix IPv6 outer sources are spread over, if any.
    pub source_prefix6: Option<String>,
    /// Outer TTL / hop limit.
    pub ttl: u8,
}

impl EncapStatus {
    /// From the configuration's `[encap]`.
    pub fn of(e: &lb::config::Encap) -> EncapStatus {
        EncapStatus {
            source: e.source.map(|a| a.to_string()),
            source6: e.source6.map(|a| a.to_string()),
            source_prefix: e.source_prefix.clone(),
            source_prefix6: e.source_prefix6.clone(),
            ttl: e.ttl,
        }
    }

    /// What the fleet must agree on, in words: the families it
    /// encapsulates towards, the source prefixes, the TTL.
    pub fn shared_settings(&self) -> String {
        let families: Vec<&str> = [
            self.source.as_ref().map(|_| "ipv4"),
            self.source6.as_ref().map(|_| "ipv6"),
        ]
        .into_iter()
        .flatten()
        .collect();
        format!(
            "families {}, source_prefix {}, source_prefix6 {}, ttl {}",
            if families.is_empty() {
                "none".to_string()
            } else {
                families.join("+")
            },
            self.source_prefix.as_deref().unwrap_or("none"),
            self.source_prefix6.as_deref().unwrap_or("none"),
            self.ttl
        )
    }
}

/// Packet-tracer counters in `/status` (see [`lb::tracer`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct TracerStatus {
    /// Probes queued for a report.
    pub reports: u64,
    /// Probes over `[tracer] rate_per_s`: forwarded, not reported.
    pub rate_limited: u64,
    /// Probes whose report found the queue full or busy.
    pub queue_full: u64,
    /// Payloads with the marker's magic but a malformed marker.
    pub invalid: u64,
    /// Reports sent.
    pub sent: u64,
    /// Reports that could not be sent (never retried).
    pub send_errors: u64,
}

/// The HTTP API's connections in `/status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct ApiStatus {
    /// Open now (this request's included).
    pub connections: usize,
    /// The most open at once: what the open-files limit leaves after the
    /// datapath, health checks, peers and BIRD ([`crate::limits`]).
    pub max_connections: usize,
    /// Connections closed because the most were open: new ones closed on
    /// arrival, or idle ones (no request yet) closed to make room.
    pub refused: u64,
}

/// The `/status` document.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Status {
    /// The packet I/O driver in use.
    pub driver: String,
    /// Configuration generation: 1 at start, +1 for every configuration
    /// applied (reload or runtime change); health changes do not count.
    pub generation: u64,
    /// The tables' own generation: +1 for every table swap, configuration,
    /// health, `[fleet]` peer or gateway change (packet-tracer reports carry
    /// it; 0 in older documents).
    #[serde(default)]
    pub tables_generation: u64,
    /// Backend health changes applied (0 in older documents).
    #[serde(default)]
    pub health_changes: u64,
    /// Runtime changes (drain, undrain, weight) applied.
    #[serde(default)]
    pub runtime_changes: u64,
    /// Runtime changes refused (nothing changed).
    #[serde(default)]
    pub runtime_change_failures: u64,
    /// Bytes of the running tables: the distinct Maglev tables once, every
    /// VIP's lists, the backend registry (0 in older documents).
    #[serde(default)]
    pub tables_bytes: u64,
    /// Distinct Maglev tables: VIPs over equal pools share one.
    #[serde(default)]
    pub distinct_tables: usize,
    /// Seconds since start.
    pub uptime_s: f64,
    /// Reloads applied (also read as `reloads_applied`).
    #[serde(alias = "reloads_applied")]
    pub reloads: u64,
    /// Reloads rejected, apart from `reloads` (also read as
    /// `reloads_rejected`).
    #[serde(alias = "reloads_rejected")]
    pub reload_failures: u64,
    /// Why the last reload was rejected, if it was.
    pub last_reload_error: Option<String>,
    /// Packets forwarded.
    pub forwarded: u64,
    /// Of `forwarded`, those the load balancer in the driver forwarded
    /// (absent unless `driver = "xdp"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forwarded_in_driver: Option<u64>,
    /// Packets dropped: frames for the load balancer it could not forward
    /// (frames that were not for a VIP are in `not_for_vip` instead; older
    /// versions counted them here).
    pub dropped: u64,
    /// Drops by reason.
    pub drops: std::collections::BTreeMap<String, u64>,
    /// Frames that were not for a VIP: not IP, or IP for no VIP (on
    /// AF_PACKET the kernel's own traffic). Not drops (absent in older
    /// documents).
    #[serde(default)]
    pub not_for_vip: u64,
    /// The same by kind: `not_ip`, `no_vip`.
    #[serde(default)]
    pub not_for_vip_by_kind: std::collections::BTreeMap<String, u64>,
    /// Transport checksums a local sender left partial (checksum offload
    /// on a veth peer) that the packet threads completed before
    /// encapsulating (0 in older documents).
    #[serde(default)]
    pub csum_completed: u64,
    /// Frames for a VIP's address on a port or protocol no VIP serves
    /// (dropped as `vip_port_not_served`) answered as a closed port is,
    /// or left unanswered by the refusal rate (zero in older documents).
    #[serde(default)]
    pub refusals: RefusalStatus,
    /// QUIC-LB routing, when a VIP is `quic` (absent otherwise and in older
    /// documents).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quic: Option<QuicStatus>,
    /// Connection-table entries: open flows and closed ones lingering.
    pub conntrack_entries: u64,
    /// Active connections: entries whose flow is not closed (absent in
    /// older documents).
    #[serde(default)]
    pub active_connections: Option<u64>,
    /// The next hop encapsulated frames are sent to (absent in documents
    /// from versions without it).
    #[serde(default)]
    pub gateway: Option<crate::gateway::GatewayStatus>,
    /// Packet buffers in the forwarder's pool.
    #[serde(default)]
    pub pool_buffers: u32,
    /// Pool buffers not free now: in the receive and fill rings, queues or
    /// in flight. Steady under steady load; growth means buffers leak.
    #[serde(default)]
    pub pool_in_use: u32,
    /// BGP: whether BIRD announces VIPs to the router, as BIRD said when
    /// the BGP task last read it (`bgp.read_ms_ago`; absent without
    /// `[bgp]`); `bgp` has the rest.
    pub bgp_announced: Option<bool>,
    /// BGP: the last error talking to BIRD.
    pub bgp_error: Option<String>,
    /// BGP: what fastpath wants beside what BIRD says, per family, and
    /// the mismatch if they differ (absent without `[bgp]` and in
    /// documents from versions without it).
    #[serde(default)]
    pub bgp: Option<crate::announce::BgpStatus>,
    /// The graceful stop, once begun (absent otherwise, and in documents
    /// from versions without it).
    #[serde(default)]
    pub stopping: Option<StoppingStatus>,
    /// `[encap]`: what the fleet must agree on (absent in documents from
    /// versions without it).
    #[serde(default)]
    pub encap: Option<EncapStatus>,
    /// `[fleet]`: peers, their liveness and redirected fragments (absent
    /// without `[fleet]`, and in documents from versions without it).
    #[serde(default)]
    pub fleet: Option<crate::tasks::peers::FleetStatus>,
    /// Packet-tracer counters (absent when `[tracer]` is disabled, and in
    /// documents from versions without it).
    #[serde(default)]
    pub tracer: Option<TracerStatus>,
    /// The HTTP API's connections (absent in documents from versions
    /// without it).
    #[serde(default)]
    pub api: Option<ApiStatus>,
    /// Where the configuration comes from: the file, or etcd with the
    /// revision applied, the last one refused and how old the view is
    /// (absent in older documents).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_source: Option<crate::ConfigSourceStatus>,
    /// VIPs.
    pub vips: Vec<VipStatus>,
}

impl Status {
    /// As tables for people (`fastpath lb status`).
    pub fn to_text(&self) -> String {
        let mut out = format!("driver: {}\n", self.driver);
        if let Some(s) = &self.stopping {
            out.push_str(&s.to_text());
        }
        out += &format!(
            "configuration generation {}, up {:.0} s, reloads: {} applied, {} rejected; \
             runtime changes: {} applied, {} rejected; health changes {}\n",
            self.generation,
            self.uptime_s,
            self.reloads,
            self.reload_failures,
            self.runtime_changes,
            self.runtime_change_failures,
            self.health_changes
        );
        if let Some(src) = &self.config_source {
            out += &src.to_text();
        }
        let not_for_vip = if self.not_for_vip_by_kind.is_empty() {
            self.not_for_vip.to_string()
        } else {
            format!(
                "{} ({})",
                self.not_for_vip,
                self.not_for_vip_by_kind
                    .iter()
                    .map(|(k, v)| format!("{k} {v}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        out += &format!(
            "forwarded {}, dropped {}, not for a VIP {not_for_vip}\n",
            self.forwarded, self.dropped
        );
        if let Some(q) = &self.quic {
            let missed: u64 = q.unroutable.values().sum();
            let why = q
                .unroutable
                .iter()
                .filter(|(_, n)| **n > 0)
                .map(|(k, n)| format!("{k} {n}"))
                .collect::<Vec<_>>()
                .join(", ");
            out += &format!(
                "QUIC: {} routed by connection ID, {missed} by the 5-tuple{}{}\n",
                q.routed,
                if why.is_empty() {
                    String::new()
                } else {
                    format!(" ({why})")
                },
                if q.server_down > 0 {
                    format!(", {} naming a backend that is down", q.server_down)
                } else {
                    String::new()
                }
            );
        }
        let r = &self.refusals;
        if r.tcp_rst + r.icmp_unreachable + r.rate_limited > 0 {
            out += &format!(
                "unserved ports refused: {} TCP RST, {} ICMP port unreachable, {} left unanswered (refusal rate)\n",
                r.tcp_rst, r.icmp_unreachable, r.rate_limited
            );
        }
        if self.csum_completed > 0 {
            out += &format!(
                "partial checksums completed: {} (a local sender offloads them; see README, deployment)\n",
                self.csum_completed
            );
        }
        out += &match self.active_connections {
            Some(a) => format!(
                "connections: {a} active, {} tracked (closed ones linger briefly)\n",
                self.conntrack_entries
            ),
            None => format!("connections: {} tracked\n", self.conntrack_entries),
        };
        out += &format!(
            "packet pool: {} of {} buffers in use\n",
            self.pool_in_use, self.pool_buffers
        );
        out += &format!(
            "tables: {} VIPs, {} distinct Maglev tables, {:.1} MiB in all\n",
            self.vips.len(),
            self.distinct_tables,
            self.tables_bytes as f64 / (1024.0 * 1024.0)
        );
        if let Some(g) = &self.gateway {
            out.push_str(&g.to_text());
        }
        if let Some(e) = &self.last_reload_error {
            out.push_str(&format!("last reload rejected: {e}\n"));
        }
        match (&self.bgp, self.bgp_announced, &self.bgp_error) {
            (Some(b), _, _) => out.push_str(&b.to_text()),
            (None, Some(a), None) => out.push_str(&format!(
                "BGP: VIPs {}\n",
                if a { "announced" } else { "withdrawn" }
            )),
            (None, Some(_), Some(e)) => out.push_str(&format!("BGP: error: {e}\n")),
            _ => {}
        }
        if let Some(f) = &self.fleet {
            out.push_str(&f.to_text());
        }
        if let Some(a) = &self.api {
            out.push_str(&format!(
                "API: {} of at most {} connections open, {} closed at the most (refused or idle ones made room)\n",
                a.connections, a.max_connections, a.refused
            ));
        }
        if let Some(t) = &self.tracer {
            out.push_str(&format!(
                "packet tracer: {} probes reported, {} rate-limited, {} queue full, {} invalid; \
                 {} reports sent, {} not sent\n",
                t.reports, t.rate_limited, t.queue_full, t.invalid, t.sent, t.send_errors
            ));
        }
        // Per VIP: its counters, and each backend's weight and state in its
        // pool. A backend's counters cover every VIP it serves, so they are
        // in a table of their own, once per backend: under each VIP they
        // would show one VIP's traffic under another.
        let mut t = measure::Table::new([
            "vip", "backend", "address", "weight", "state", "packets", "bytes",
        ]);
        let mut backends: Vec<(&BackendStatus, Vec<&str>)> = Vec::new();
        for v in &self.vips {
            t.row([
                v.name.clone(),
                format!("pool {}", v.pool),
                format!(
                    "table {}, {} KiB",
                    v.fingerprint,
                    v.table_bytes.div_ceil(1024)
                ),
                String::new(),
                format!("{} in table", v.healthy_backends),
                v.packets.to_string(),
                v.bytes.to_string(),
            ]);
            for b in &v.backends {
                t.row([
                    String::new(),
                    b.name.clone(),
                    b.address.clone(),
                    b.weight.to_string(),
                    b.state().to_string(),
                    String::new(),
                    String::new(),
                ]);
                match backends.iter_mut().find(|(x, _)| x.name == b.name) {
                    Some((_, vips)) => vips.push(&v.name),
                    None => backends.push((b, vec![&v.name])),
                }
            }
        }
        out.push_str(&t.to_string());
        if !backends.is_empty() {
            let mut bt = measure::Table::new([
                "backend",
                "address",
                "health",
                "vips",
                "packets (all its VIPs)",
                "bytes",
            ]);
            for (b, vips) in backends {
                bt.row([
                    b.name.clone(),
                    b.address.clone(),
                    if b.healthy { "up" } else { "DOWN" }.to_string(),
                    vips.join(", "),
                    b.packets.to_string(),
                    b.bytes.to_string(),
                ]);
            }
            out.push_str(&format!("\n{bt}"));
        }
        if !self.drops.is_empty() {
            let mut d = measure::Table::new(["drop reason", "packets"]);
            for (k, v) in &self.drops {
                d.row([k.clone(), v.to_string()]);
            }
            out.push_str(&format!("\n{d}"));
        }
        out
    }
}

/// Where the configuration comes from and which revision runs.
pub fn config_source(shared: &Shared) -> crate::ConfigSourceStatus {
    match &shared.etcd {
        Some(src) => src.status(),
        None => crate::ConfigSourceStatus::file(&shared.file.path),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `lb status` says what its counters mean :
    /// reloads applied and rejected as two numbers, active connections
    /// beside tracked entries, frames not for a VIP apart from drops, the
    /// configured weight, and "drained" rather than a health word for a
    /// drained backend. Documents from older versions still parse.
    #[test]
    fn status_text_says_what_the_counters_mean() {
        let doc = serde_json::json!({
            "driver": "AF_PACKET", "generation": 4, "uptime_s": 9.0, "reloads": 10,
            "reload_failures": 10, "last_reload_error": null, "forwarded": 100, "dropped": 1,
            "drops": {"no_healthy_backend": 1}, "conntrack_entries": 50, "bgp_announced": null,
            "bgp_error": null, "health_changes": 7, "not_for_vip": 30,
            "not_for_vip_by_kind": {"no_vip": 20, "not_ip": 10}, "active_connections": 12,
            "vips": [{"name": "http", "packets": 100, "bytes": 1000, "healthy_backends": 1,
                      "pool": "web", "fingerprint": "00000000000000aa", "backends": [
                {"name": "b1", "address": "10.0.0.1", "healthy": true, "packets": 90,
                 "bytes": 900, "weight": 2, "drained": false},
                {"name": "b2", "address": "10.0.0.2", "healthy": true, "packets": 10,
                 "bytes": 100, "weight": 3, "drained": true},
                {"name": "b3", "address": "10.0.0.3", "healthy": false, "packets": 0,
                 "bytes": 0, "weight": 1, "drained": false}]}]
        });
        let s: Status = serde_json::from_value(doc).unwrap();
        let t = s.to_text();
        for want in [
            "configuration generation 4",
            "reloads: 10 applied, 10 rejected",
            "health changes 7",
            "dropped 1, not for a VIP 30 (no_vip 20, not_ip 10)",
            "connections: 12 active, 50 tracked",
        ] {
            assert!(t.contains(want), "{want:?} missing:\n{t}");
        }
        // A backend's row under its VIP (weight and state), then its row
        // in the backends' table (health and counters).
        let rows = |name: &str| {
            t.lines()
                .filter(|l| l.split_whitespace().any(|w| w == name))
                .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
                .collect::<Vec<_>>()
        };
        let row = |name: &str| rows(name)[0].clone();
        let counted = |name: &str| rows(name)[1].clone();
        assert!(row("b1").ends_with("b1 10.0.0.1 2 up"), "{t}");
        assert!(counted("b1").ends_with("b1 10.0.0.1 up http 90 900"), "{t}");
        assert!(row("b2").ends_with("b2 10.0.0.2 3 drained"), "{t}");
        assert!(counted("b2").ends_with("b2 10.0.0.2 up http 10 100"), "{t}");
        assert!(
            !row("b2").contains("yes") && !row("b2").contains("up"),
            "{t}"
        );
        assert!(row("b3").ends_with("b3 10.0.0.3 1 DOWN"), "{t}");
        assert!(counted("b3").ends_with("b3 10.0.0.3 DOWN http 0 0"), "{t}");
        // The names of other versions' documents are read too.
        let renamed: Status = serde_json::from_value(serde_json::json!({
            "driver": "x", "generation": 1, "uptime_s": 0.0, "reloads_applied": 3,
            "reloads_rejected": 2, "last_reload_error": null, "forwarded": 0, "dropped": 0,
            "drops": {}, "conntrack_entries": 0, "bgp_announced": null, "bgp_error": null,
            "vips": []
        }))
        .unwrap();
        assert_eq!((renamed.reloads, renamed.reload_failures), (3, 2));
        assert!(renamed.bgp.is_none() && renamed.encap.is_none());
        assert_eq!(renamed.active_connections, None);
        assert!(renamed.to_text().contains("connections: 0 tracked"));
    }

    /// A backend in the pool of two VIPs shows its counters once, in the
    /// backends' table, not under each VIP: a UDP VIP that forwarded
    /// nothing does not show the HTTP VIP's packets under its backends.
    #[test]
    fn backend_counters_are_shown_once_not_under_every_vip() {
        let backend = serde_json::json!({"name": "b1", "address": "10.0.0.1", "healthy": true,
            "packets": 241912, "bytes": 9999999, "weight": 1, "drained": false});
        let doc = serde_json::json!({
            "driver": "AF_XDP", "generation": 1, "uptime_s": 1.0, "reloads": 0,
            "reload_failures": 0, "last_reload_error": null, "forwarded": 241912, "dropped": 0,
            "drops": {}, "conntrack_entries": 0, "bgp_announced": null, "bgp_error": null,
            "vips": [
                {"name": "http", "packets": 241912, "bytes": 9999999, "healthy_backends": 1,
                 "pool": "web", "backends": [backend.clone()]},
                {"name": "udp-echo", "packets": 0, "bytes": 0, "healthy_backends": 1,
                 "pool": "web", "backends": [backend]}]
        });
        let s: Status = serde_json::from_value(doc).unwrap();
        let t = s.to_text();
        // In "forwarded", for the HTTP VIP and for its backend: not again
        // under the UDP VIP.
        assert_eq!(t.matches("241912").count(), 3, "{t}");
        let udp = t
            .lines()
            .skip_while(|l| !l.contains("udp-echo"))
            .nth(1)
            .unwrap();
        assert!(udp.contains("b1") && !udp.contains("241912"), "{t}");
        assert!(
            t.lines()
                .any(|l| l.contains("b1") && l.contains("http, udp-echo") && l.contains("241912")),
            "{t}"
        );
    }

    /// `lb status` during a graceful stop says so (the API answers until
    /// the datapath stops), with what the withdrawal could not do.
    #[test]
    fn status_text_says_the_daemon_is_stopping() {
        let doc = serde_json::json!({
            "driver": "x", "generation": 1, "uptime_s": 0.0, "reloads": 0,
            "reload_failures": 0, "last_reload_error": null, "forwarded": 0, "dropped": 0,
            "drops": {}, "conntrack_entries": 0, "bgp_announced": false, "bgp_error": null,
            "stopping": {"since_s": 0.42, "phase": "draining", "drain_ms": 3000,
                         "could_not": "ipv4 VIPs (fastpath_vips): birdc disable fastpath_vips: no answer within 2s"},
            "vips": []
        });
        let s: Status = serde_json::from_value(doc).unwrap();
        let t = s.to_text();
        for want in [
            "STOPPING for 0.4 s (at most 3.0 s): draining; the withdrawal FAILED",
            "could not withdraw: ipv4 VIPs (fastpath_vips): birdc disable fastpath_vips: no answer",
        ] {
            assert!(t.contains(want), "{want:?} missing:\n{t}");
        }
        let withdrawing = StoppingStatus {
            since_s: 0.1,
            phase: "withdrawing".into(),
            drain_ms: 1000,
            could_not: None,
        };
        assert!(withdrawing.to_text().contains("withdrawing the VIPs"));
    }

    /// `lb status` shows the refusals of unserved ports once there are
    /// some; a document without them (older versions) reads as none.
    #[test]
    fn status_text_shows_refusals() {
        let mut doc = serde_json::json!({
            "driver": "x", "generation": 1, "uptime_s": 0.0, "reloads": 0,
            "reload_failures": 0, "last_reload_error": null, "forwarded": 0, "dropped": 2,
            "drops": {"vip_port_not_served": 2}, "conntrack_entries": 0,
            "bgp_announced": null, "bgp_error": null, "vips": []
        });
        let s: Status = serde_json::from_value(doc.clone()).unwrap();
        assert_eq!(s.refusals, RefusalStatus::default());
        assert!(!s.to_text().contains("refused"));
        doc["refusals"] =
            serde_json::json!({"tcp_rst": 1, "icmp_unreachable": 0, "rate_limited": 1});
        let t = serde_json::from_value::<Status>(doc).unwrap().to_text();
        let want = "unserved ports refused: 1 TCP RST, 0 ICMP port unreachable, 1 left unanswered";
        assert!(t.contains(want), "{want:?} missing:\n{t}");
    }

    /// `lb status` says what BIRD does, beside what fastpath wants, and
    /// names a mismatch.
    #[test]
    fn status_text_names_a_bgp_mismatch() {
        let doc = serde_json::json!({
            "driver": "x", "generation": 1, "uptime_s": 0.0, "reloads": 0,
            "reload_failures": 0, "last_reload_error": null, "forwarded": 0, "dropped": 0,
            "drops": {}, "conntrack_entries": 0, "bgp_announced": false, "bgp_error": null,
            "bgp": {"wanted": true, "announced": false, "repairs": 1, "read_ms_ago": 3,
                    "error": null,
                    "mismatch": "ipv4: announcement wanted, fastpath_vips is down in BIRD",
                    "families": [{"family": "ipv4", "protocol": "fastpath_vips",
                                  "routes_file": "/run/fastpath/vips.conf", "wanted_routes": 1,
                                  "state": "down", "routes": 0, "sessions": 1, "exported": 0,
                                  "announced": false}]},
            "vips": []
        });
        let s: Status = serde_json::from_value(doc).unwrap();
        let t = s.to_text();
        for want in [
            "BGP: VIPs not announced (fastpath announces them), as BIRD said when read 0.0 s ago: ipv4 fastpath_vips down (0 of 1 routes",
            "BGP MISMATCH: ipv4: announcement wanted, fastpath_vips is down in BIRD",
        ] {
            assert!(t.contains(want), "{want:?} missing:\n{t}");
        }
    }
}

/// Frames for a VIP's address on a port or protocol no VIP serves: the
/// replies sent (`packet::reply`), and those the packet threads' refusal
/// rate withheld.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RefusalStatus {
    /// Answered with a TCP RST.
    pub tcp_rst: u64,
    /// Answered with an ICMP or ICMPv6 port unreachable.
    pub icmp_unreachable: u64,
    /// Not answered: the refusal rate was spent.
    pub rate_limited: u64,
}

impl RefusalStatus {
    fn of(c: &lb::counters::Counters) -> RefusalStatus {
        RefusalStatus {
            tcp_rst: c.refused_tcp_rst,
            icmp_unreachable: c.refused_icmp_unreachable,
            rate_limited: c.refusal_rate_limited,
        }
    }
}

/// QUIC-LB routing of the `quic` VIPs (`[[quic_lb]]`).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct QuicStatus {
    /// Datagrams routed by their connection ID's server ID.
    pub routed: u64,
    /// Datagrams whose connection ID did not route, by reason
    /// (`lb::quic::Miss::name`): they took the connection table and the
    /// 5-tuple.
    pub unroutable: std::collections::BTreeMap<String, u64>,
    /// Datagrams whose server ID names a backend that is down.
    pub server_down: u64,
}

impl QuicStatus {
    fn of(c: &lb::counters::Counters) -> QuicStatus {
        QuicStatus {
            routed: c.quic_routed,
            unroutable: lb::quic::Miss::ALL
                .iter()
                .map(|m| (m.name().to_string(), c.quic_miss[m.index()]))
                .collect(),
            server_down: c.quic_server_down,
        }
    }
}
