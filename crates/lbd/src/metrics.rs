//! `/metrics`: the load balancer's state in the OpenMetrics text format,
//! or in Prometheus' classic text format (`text/plain; version=0.0.4`) to a
//! scraper whose `Accept` header prefers it ([`Format::negotiate`]). Both
//! are written by the `prometheus-client` crate from one snapshot (the
//! `/status` document and the summed counters) per scrape, so every family
//! is grouped with its HELP and TYPE, every name is one Prometheus and the
//! OpenMetrics parsers accept, and label values (backend and VIP names are
//! the operator's text) are escaped by the encoder: a quote or a line break
//! in a name cannot end a label or start a series.
//!
//! Counters are named without `_total` here; the encoder appends it, so
//! the series are `fastpath_lb_drops_total{reason="..."}` and so on.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use lb::counters::{Counters, DropReason, DROP_REASONS, NOT_FOR_VIP};

use crate::state::Shared;
use crate::status::Status;

/// The content type of [`encode_metrics`]' output (OpenMetrics).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The content type of the classic Prometheus text format.
pub const CLASSIC_CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// The exposition formats `/metrics` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// OpenMetrics 1.0 text: counters typed as such, `# EOF` at the end.
    OpenMetrics,
    /// Prometheus' classic text format, version 0.0.4: what older
    /// scrapers and parsers that do not read OpenMetrics expect.
    Classic,
}

impl Format {
    /// The `Content-Type` of this format.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => CONTENT_TYPE,
            Format::Classic => CLASSIC_CONTENT_TYPE,
        }
    }

    /// The format an `Accept` header prefers: each media range's quality
    /// (`q`, 1 when absent) is compared, `application/openmetrics-text`
    /// against `text/plain` (the classic format; `text/*` counts for it);
    /// OpenMetrics wins ties, and is the answer when neither is named
    /// (no header, `*/*`) or the header cannot be read.
    pub fn negotiate(accept: Option<&str>) -> Format {
        let Some(accept) = accept else {
            return Format::OpenMetrics;
        };
        let (mut open, mut classic) = (None::<f32>, None::<f32>);
        for range in accept.split(',') {
            let mut parts = range.split(';');
            let media = parts.next().unwrap_or("").trim().to_ascii_lowercase();
            let q = parts
                .filter_map(|p| p.split_once('='))
                .find(|(k, _)| k.trim().eq_ignore_ascii_case("q"))
                .map_or(Some(1.0), |(_, v)| v.trim().parse::<f32>().ok())
                .filter(|q| q.is_finite())
                .unwrap_or(0.0);
            let best = |slot: &mut Option<f32>| *slot = Some(slot.map_or(q, |b: f32| b.max(q)));
            match media.as_str() {
                "application/openmetrics-text" => best(&mut open),
                "text/plain" | "text/*" => best(&mut classic),
                _ => {}
            }
        }
        match (open, classic) {
            (_, Some(c)) if c > 0.0 && c > open.unwrap_or(0.0) => Format::Classic,
            _ => Format::OpenMetrics,
        }
    }
}

type Labels = Vec<(String, String)>;

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Families registered as they are used.
struct Families<'a> {
    r: &'a mut Registry,
}

impl Families<'_> {
    fn counter(&mut self, name: &str, help: &str) -> Family<Labels, Counter> {
        let f = Family::<Labels, Counter>::default();
        self.r.register(name, help, f.clone());
        f
    }

    fn gauge(&mut self, name: &str, help: &str) -> Family<Labels, Gauge> {
        let f = Family::<Labels, Gauge>::default();
        self.r.register(name, help, f.clone());
        f
    }

    /// A counter without labels, at `v`.
    fn counter_at(&mut self, name: &str, help: &str, v: u64) {
        let c = Counter::<u64>::default();
        c.inc_by(v);
        self.r.register(name, help, c);
    }

    /// A gauge without labels in seconds (Prometheus' base unit), at `v`.
    fn seconds_at(&mut self, name: &str, help: &str, v: f64) {
        let g = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        g.set(v);
        self.r.register(name, help, g);
    }

    /// A gauge without labels, at `v`.
    fn gauge_at(&mut self, name: &str, help: &str, v: u64) {
        let g = Gauge::<i64>::default();
        g.set(i64::try_from(v).unwrap_or(i64::MAX));
        self.r.register(name, help, g);
    }
}

fn count(f: &Family<Labels, Counter>, l: &[(&str, &str)], v: u64) {
    f.get_or_create(&labels(l)).inc_by(v);
}

fn set(f: &Family<Labels, Gauge>, l: &[(&str, &str)], v: u64) {
    f.get_or_create(&labels(l))
        .set(i64::try_from(v).unwrap_or(i64::MAX));
}

/// The exposition in `format`.
pub fn metrics(shared: &Shared, format: Format) -> String {
    encode_metrics_as(
        format,
        &crate::status::status(shared),
        &shared.datapath.counters(),
        shared
            .health
            .inconclusive
            .load(std::sync::atomic::Ordering::Relaxed),
    )
}

/// The OpenMetrics exposition of one snapshot: `s` (the `/status`
/// document), `c` (the packet threads' counters summed) and the control
/// plane's count of inconclusive health checks (the tests' shorthand: the
/// API negotiates the format).
#[cfg(test)]
pub fn encode_metrics(s: &Status, c: &Counters, checks_inconclusive: u64) -> String {
    encode_metrics_as(Format::OpenMetrics, s, c, checks_inconclusive)
}

/// The exposition of one snapshot in the format asked for: `s` (the
/// `/status` document), `c` (the packet threads' counters summed) and the
/// control plane's count of inconclusive health checks.
pub fn encode_metrics_as(
    format: Format,
    s: &Status,
    c: &Counters,
    checks_inconclusive: u64,
) -> String {
    let mut r = Registry::default();
    let mut f = Families { r: &mut r };
    f.gauge_at(
        "fastpath_lb_config_generation",
        "Configuration generation: 1 at start, +1 for every configuration applied (reload or runtime change); health changes do not count",
        s.generation,
    );
    f.gauge_at(
        "fastpath_lb_tables_generation",
        "Generation of the running tables: +1 for every table swap (configuration, health, fleet peer or gateway change)",
        s.tables_generation,
    );
    f.counter_at(
        "fastpath_lb_health_changes",
        "Backend health changes applied to the tables",
        s.health_changes,
    );
    f.counter_at(
        "fastpath_lb_runtime_changes",
        "Runtime changes (drain, undrain, weight) applied and written to the configuration file",
        s.runtime_changes,
    );
    f.counter_at(
        "fastpath_lb_runtime_change_failures",
        "Runtime changes refused (unknown backend, file edited since loaded, invalid result); nothing changed",
        s.runtime_change_failures,
    );
    f.counter_at(
        "fastpath_lb_reloads",
        "Configuration reloads applied",
        s.reloads,
    );
    f.counter_at(
        "fastpath_lb_reload_failures",
        "Configuration reloads rejected (the running configuration stayed)",
        s.reload_failures,
    );
    f.counter_at(
        "fastpath_lb_checksums_completed",
        "Transport checksums a local sender left partial (checksum offload) that the load balancer completed",
        s.csum_completed,
    );
    let refusals = f.counter(
        "fastpath_lb_refusals",
        "Frames for a VIP's address on a port no VIP serves (dropped as vip_port_not_served) answered as a closed port is, by reply: tcp_rst, icmp_unreachable",
    );
    for (reply, n) in [
        ("tcp_rst", s.refusals.tcp_rst),
        ("icmp_unreachable", s.refusals.icmp_unreachable),
    ] {
        count(&refusals, &[("reply", reply)], n);
    }
    f.counter_at(
        "fastpath_lb_refusals_rate_limited",
        "Frames for a VIP's address on a port no VIP serves left unanswered: the packet thread's refusal rate was spent",
        s.refusals.rate_limited,
    );
    f.counter_at(
        "fastpath_lb_health_checks_inconclusive",
        "Health checks not counted because the prober itself ran late",
        checks_inconclusive,
    );

    let vip_packets = f.counter("fastpath_lb_vip_packets", "Packets forwarded per VIP");
    let vip_bytes = f.counter(
        "fastpath_lb_vip_bytes",
        "Bytes forwarded per VIP (received frame sizes)",
    );
    let fingerprint = f.gauge(
        "fastpath_lb_vip_table_fingerprint",
        "Always 1; the label is the VIP's table fingerprint (what it matches, its lookup table and backends): load balancers that agree show the same",
    );
    let weight = f.gauge(
        "fastpath_lb_backend_weight",
        "The backend's weight in the VIP's pool as configured (kept while drained; see fastpath_lb_backend_drained)",
    );
    let drained = f.gauge(
        "fastpath_lb_backend_drained",
        "1 if the backend is drained in the VIP's pool: no new connections, weight kept",
    );
    let be_packets = f.counter(
        "fastpath_lb_backend_packets",
        "Packets forwarded per backend",
    );
    let be_bytes = f.counter("fastpath_lb_backend_bytes", "Bytes forwarded per backend");
    let healthy = f.gauge("fastpath_lb_backend_healthy", "1 if the backend is healthy");
    let mut seen = std::collections::HashSet::new();
    for v in &s.vips {
        count(&vip_packets, &[("vip", &v.name)], v.packets);
        count(&vip_bytes, &[("vip", &v.name)], v.bytes);
        set(
            &fingerprint,
            &[
                ("vip", &v.name),
                ("pool", &v.pool),
                ("fingerprint", &v.fingerprint),
            ],
            1,
        );
        for b in &v.backends {
            let l = [
                ("vip", v.name.as_str()),
                ("backend", b.name.as_str()),
                ("address", b.address.as_str()),
            ];
            set(&weight, &l, u64::from(b.weight));
            set(&drained, &l, u64::from(b.drained));
            if seen.insert(b.name.clone()) {
                let l = [
                    ("backend", b.name.as_str()),
                    ("address", b.address.as_str()),
                ];
                count(&be_packets, &l, b.packets);
                count(&be_bytes, &l, b.bytes);
                set(&healthy, &l, u64::from(b.healthy));
            }
        }
    }
    let drops = f.counter(
        "fastpath_lb_drops",
        "Packets dropped, by reason (frames not for a VIP are in fastpath_lb_not_for_vip)",
    );
    for i in (0..DROP_REASONS).filter(|&i| !Counters::is_not_for_vip(i)) {
        count(
            &drops,
            &[("reason", DropReason::name_of(i))],
            c.drops.get(i).copied().unwrap_or(0),
        );
    }
    let not_for_vip = f.counter(
        "fastpath_lb_not_for_vip",
        "Frames that were not for a VIP, by kind: not_ip (ARP, LLDP...), no_vip (IP for no VIP; on AF_PACKET the kernel's own traffic). Not drops",
    );
    for r in NOT_FOR_VIP {
        count(
            &not_for_vip,
            &[("kind", DropReason::name_of(r.index()))],
            c.drops_for(r),
        );
    }
    if let Some(q) = &s.quic {
        f.counter_at(
            "fastpath_lb_quic_routed",
            "Datagrams to quic VIPs routed by their QUIC-LB connection ID's server ID",
            q.routed,
        );
        f.counter_at(
            "fastpath_lb_quic_server_down",
            "Datagrams whose connection ID names a backend that is down: routed by the connection table and the 5-tuple instead",
            q.server_down,
        );
        let unroutable = f.counter(
            "fastpath_lb_quic_unroutable",
            "Datagrams to quic VIPs whose connection ID did not route, by reason: routed by the connection table and the 5-tuple (a client's first packets carry its own connection ID)",
        );
        for (reason, n) in &q.unroutable {
            count(&unroutable, &[("reason", reason.as_str())], *n);
        }
    }
    if let Some(t) = &s.tracer {
        let probes = f.counter(
            "fastpath_lb_trace_probes",
            "Packet-tracer probes, by outcome: reported (queued), rate_limited, queue_full, invalid (malformed marker or report address not allowed); all are forwarded",
        );
        for (k, v) in [
            ("reported", t.reports),
            ("rate_limited", t.rate_limited),
            ("queue_full", t.queue_full),
            ("invalid", t.invalid),
        ] {
            count(&probes, &[("outcome", k)], v);
        }
        let reports = f.counter(
            "fastpath_lb_trace_reports",
            "Packet-tracer reports sent, or not (never retried)",
        );
        count(&reports, &[("result", "sent")], t.sent);
        count(&reports, &[("result", "error")], t.send_errors);
    }
    if let Some(fl) = &s.fleet {
        let up = f.gauge(
            "fastpath_lb_fleet_peer_up",
            "1 if the [fleet] peer answers its liveness check (this load balancer: always)",
        );
        let to = f.counter(
            "fastpath_lb_fragments_redirected",
            "Fragments sent on to the [fleet] peer responsible for them, per peer",
        );
        for p in &fl.peers {
            set(&up, &[("peer", &p.address)], u64::from(p.up));
            if !p.this {
                count(&to, &[("peer", &p.address)], p.fragments_redirected);
            }
        }
        f.counter_at(
            "fastpath_lb_fragments_redirect_received",
            "Fragments a [fleet] peer redirected here",
            fl.fragments_redirect_received,
        );
    }
    if let Some(a) = s.bgp_announced {
        f.gauge_at(
            "fastpath_lb_bgp_announced",
            "1 while BIRD announces VIPs to the router, as BIRD said at the BGP task's last reading (fastpath_lb_bgp_read_age_seconds ago)",
            u64::from(a),
        );
    }
    if let Some(b) = &s.bgp {
        f.gauge_at(
            "fastpath_lb_bgp_wanted",
            "1 while fastpath wants VIPs announced (its datapath beats, a VIP has a healthy backend)",
            u64::from(b.wanted),
        );
        f.seconds_at(
            "fastpath_lb_bgp_read_age_seconds",
            "How long ago the BGP task last read BIRD; what the other fastpath_lb_bgp metrics say of BIRD is that reading's (scrapes never wait for BIRD)",
            b.read_ms_ago as f64 / 1000.0,
        );
        f.gauge_at(
            "fastpath_lb_bgp_mismatch",
            "1 while what BIRD announces differs from what fastpath wants (see /status bgp.mismatch)",
            u64::from(b.mismatch.is_some()),
        );
        f.counter_at(
            "fastpath_lb_bgp_repairs",
            "Times fastpath found BIRD changed behind its back (reconfigured, restarted) and put it back",
            b.repairs,
        );
        let routes = f.gauge(
            "fastpath_lb_bgp_routes",
            "VIP routes per family: wanted by fastpath, held by BIRD's static protocol, exported by its established BGP sessions, and wanted but missing from BIRD (compared route by route)",
        );
        for fam in &b.families {
            let family = fam.family.channel();
            set(
                &routes,
                &[("family", family), ("of", "wanted")],
                fam.wanted_routes,
            );
            set(&routes, &[("family", family), ("of", "bird")], fam.routes);
            set(
                &routes,
                &[("family", family), ("of", "exported")],
                fam.exported,
            );
            set(
                &routes,
                &[("family", family), ("of", "missing")],
                fam.missing.len() as u64,
            );
        }
    }
    f.gauge_at(
        "fastpath_lb_pool_buffers",
        "Packet buffers in the forwarder's pool",
        u64::from(s.pool_buffers),
    );
    f.gauge_at(
        "fastpath_lb_pool_in_use",
        "Packet buffers not free (in rings, queues or in flight); growth under steady load is a leak",
        u64::from(s.pool_in_use),
    );
    let ct = &c.conntrack;
    f.gauge_at(
        "fastpath_lb_conntrack_entries",
        "Connection-table entries: open flows and closed ones lingering (see fastpath_lb_conntrack_active)",
        ct.entries,
    );
    f.gauge_at(
        "fastpath_lb_conntrack_active",
        "Active connections: connection-table entries whose flow is not closed (no FIN or RST seen)",
        ct.active(),
    );
    let events = f.counter(
        "fastpath_lb_conntrack_events",
        "Connection-table hits, misses, inserts, insert failures, expiries, closes (FIN or RST)",
    );
    for (k, v) in [
        ("hit", ct.hits),
        ("miss", ct.misses),
        ("insert", ct.inserts),
        ("insert_failure", ct.insert_failures),
        ("expiry", ct.expiries),
        ("close", ct.closes),
    ] {
        count(&events, &[("event", k)], v);
    }
    if let Some(a) = &s.api {
        f.gauge_at(
            "fastpath_lb_api_connections",
            "HTTP API connections open now",
            a.connections as u64,
        );
        f.gauge_at(
            "fastpath_lb_api_connections_max",
            "The most HTTP API connections open at once: what the open-files limit leaves after the datapath, health checks, peers and BIRD",
            a.max_connections as u64,
        );
        f.counter_at(
            "fastpath_lb_api_connections_refused",
            "HTTP API connections closed because the most were open: new ones closed on arrival, or idle ones (no request yet) closed to make room for a new one",
            a.refused,
        );
    }
    if let Some(g) = &s.gateway {
        let resolved = f.gauge(
            "fastpath_lb_gateway_resolved",
            "1 while encapsulated frames go to a known next hop (resolved from the kernel, or [encap] gateway_mac), 0 while unresolved (frames lost); labels: source, mac, next hop address",
        );
        let source = match g.source {
            crate::gateway::Source::Resolved => "resolved",
            crate::gateway::Source::Configured => "configured",
            crate::gateway::Source::Unresolved => "unresolved",
        };
        let known = g.source != crate::gateway::Source::Unresolved && g.mac.is_some();
        set(
            &resolved,
            &[
                ("interface", g.interface.as_str()),
                ("source", source),
                ("mac", g.mac.as_deref().unwrap_or("")),
                ("address", g.address.as_deref().unwrap_or("")),
            ],
            u64::from(known),
        );
    }
    if let Some(src) = s.config_source.as_ref().filter(|c| c.kind == "etcd") {
        f.gauge_at(
            "fastpath_lb_config_etcd_applied_revision",
            "The etcd revision whose configuration runs (the newest read that holds it)",
            src.applied_revision.unwrap_or(0).max(0) as u64,
        );
        f.gauge_at(
            "fastpath_lb_config_etcd_pushed_revision",
            "The revision of the push whose configuration runs: the same on every load balancer of a fleet that agrees",
            src.pushed_revision.unwrap_or(0).max(0) as u64,
        );
        f.gauge_at(
            "fastpath_lb_config_etcd_refused_revision",
            "The last revision refused (invalid), 0 if none: the running one stayed",
            src.refused_revision.unwrap_or(0).max(0) as u64,
        );
        f.counter_at(
            "fastpath_lb_config_etcd_applied",
            "Revisions from etcd applied since start (after the first)",
            src.applied_total,
        );
        f.counter_at(
            "fastpath_lb_config_etcd_refused",
            "Revisions from etcd refused since start (invalid, or keys that do not make a configuration)",
            src.refused_total,
        );
        f.seconds_at(
            "fastpath_lb_config_etcd_answered_seconds_ago",
            "Seconds since etcd last answered: how old this load balancer's view of the fleet's configuration may be",
            src.etcd_answered_s_ago.unwrap_or(f64::INFINITY),
        );
        f.gauge_at(
            "fastpath_lb_config_etcd_waiting",
            "1 while a newer revision waits (a hold for another load balancer, or a push being staged), else 0",
            u64::from(src.waiting_revision.is_some() || src.push_in_progress.is_some()),
        );
    }
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = match format {
        Format::OpenMetrics => prometheus_client::encoding::text::encode(&mut out, &r),
        Format::Classic => prometheus_client::encoding::prometheus_text::encode(&mut out, &r),
    };
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `/status` snapshot of two VIPs sharing a pool, one backend
    /// drained (the system tests of the exposition read the same file).
    fn status() -> Status {
        serde_json::from_str(include_str!("../tests/data/status.json")).unwrap()
    }

    /// Every sample follows its own family's TYPE line, and each family's
    /// lines are together, as the OpenMetrics format wants (not all
    /// HELP/TYPE lines first and the samples after).
    #[test]
    fn families_are_grouped_and_named_for_prometheus() {
        let mut c = Counters::new();
        c.drop(DropReason::NoVip);
        c.drop(DropReason::NoVip);
        c.drop(DropReason::NoHealthyBackend);
        c.conntrack.entries = 4;
        c.conntrack.closing = 1;
        let mut s = status();
        s.refusals.tcp_rst = 7;
        s.refusals.rate_limited = 3;
        let text = encode_metrics(&s, &c, 9);
        assert!(
            !text.contains("fastpath_lb_drops_total{reason=\"no_vip\"}"),
            "frames not for a VIP are not drops:\n{text}"
        );
        let mut current = String::new();
        let mut done = std::collections::HashSet::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let name = rest.split_whitespace().next().unwrap().to_string();
                assert!(done.insert(name.clone()), "family {name} twice:\n{text}");
                current = name;
            } else if !line.starts_with('#') {
                let sample = line.split(['{', ' ']).next().unwrap();
                assert!(
                    sample == current || sample.strip_suffix("_total") == Some(current.as_str()),
                    "{sample} outside its family ({current}):\n{text}"
                );
            }
        }
        assert!(text.ends_with("# EOF\n"), "{text}");
        for want in [
            "fastpath_lb_reloads_total 2",
            "fastpath_lb_reload_failures_total 1",
            "fastpath_lb_health_checks_inconclusive_total 9",
            "fastpath_lb_backend_healthy{backend=\"b2\",address=\"10.0.0.2\"} 0",
            "fastpath_lb_backend_weight{vip=\"http\",backend=\"b2\",address=\"10.0.0.2\"} 0",
            "fastpath_lb_drops_total{reason=\"no_healthy_backend\"} 1",
            "fastpath_lb_not_for_vip_total{kind=\"no_vip\"} 2",
            "fastpath_lb_not_for_vip_total{kind=\"not_ip\"} 0",
            "fastpath_lb_conntrack_active 3",
            "fastpath_lb_conntrack_entries 4",
            "fastpath_lb_config_generation 3",
            "fastpath_lb_health_changes_total 5",
            "fastpath_lb_backend_drained{vip=\"http\",backend=\"b2\",address=\"10.0.0.2\"} 1",
            "fastpath_lb_gateway_resolved{interface=\"eth0\",source=\"resolved\",mac=\"02:00:00:00:00:aa\",address=\"10.0.0.254\"} 1",
            "fastpath_lb_bgp_announced 1",
            "fastpath_lb_bgp_wanted 1",
            "fastpath_lb_bgp_mismatch 0",
            "fastpath_lb_bgp_repairs_total 2",
            "fastpath_lb_refusals_total{reply=\"tcp_rst\"} 7",
            "fastpath_lb_refusals_total{reply=\"icmp_unreachable\"} 0",
            "fastpath_lb_refusals_rate_limited_total 3",
            "fastpath_lb_bgp_routes{family=\"ipv4\",of=\"exported\"} 1",
        ] {
            assert!(text.contains(want), "{want} missing:\n{text}");
        }
        // A backend in two VIPs is counted once.
        assert_eq!(
            text.matches("fastpath_lb_backend_packets_total{backend=\"b1\"")
                .count(),
            1
        );
    }

    /// A backend or VIP name holding a quote, a backslash or a line break
    /// stays inside its label value in both formats: the encoder escapes
    /// it, so no series can be injected and a strict parser reads it.
    #[test]
    fn label_values_are_escaped_in_both_formats() {
        let mut s = status();
        s.vips[0].backends[0].name = "b\"1\nfastpath_lb_injected 1".into();
        s.vips[0].name = "web\\\"x".into();
        for format in [Format::OpenMetrics, Format::Classic] {
            let text = encode_metrics_as(format, &s, &Counters::new(), 0);
            assert!(
                !text.lines().any(|l| l.starts_with("fastpath_lb_injected")),
                "{format:?}: a name started a series:\n{text}"
            );
            assert!(
                text.contains(r#"backend="b\"1\nfastpath_lb_injected 1""#),
                "{format:?}:\n{text}"
            );
            assert!(text.contains(r#"vip="web\\\"x""#), "{format:?}:\n{text}");
            // Every line is a comment or `name{labels} value`.
            for line in text.lines().filter(|l| !l.starts_with('#')) {
                let name_end = line.find(['{', ' ']).unwrap();
                assert!(
                    line[..name_end].starts_with("fastpath_lb_"),
                    "{format:?}: {line:?}"
                );
                let value = line.rsplit(' ').next().unwrap();
                assert!(value.parse::<f64>().is_ok(), "{format:?}: {line:?}");
            }
        }
    }

    /// The classic format goes to scrapers that ask for it (an `Accept`
    /// header that prefers `text/plain`); OpenMetrics to everyone else,
    /// Prometheus' own header included (it prefers OpenMetrics).
    #[test]
    fn the_format_follows_the_accept_header() {
        use Format::{Classic, OpenMetrics};
        for (accept, want) in [
            (None, OpenMetrics),
            (Some("*/*"), OpenMetrics),
            (Some("text/plain;version=0.0.4"), Classic),
            (Some("text/plain; version=0.0.4; charset=utf-8"), Classic),
            (Some("TEXT/PLAIN"), Classic),
            (Some("application/openmetrics-text; version=1.0.0"), OpenMetrics),
            (
                Some("application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2"),
                OpenMetrics,
            ),
            (Some("application/openmetrics-text;q=0.2, text/plain;q=0.9"), Classic),
            (Some("text/plain;q=0, */*"), OpenMetrics),
            (Some("text/plain;q=zero"), OpenMetrics),
            (Some("application/json"), OpenMetrics),
        ] {
            assert_eq!(Format::negotiate(accept), want, "{accept:?}");
        }
        let classic = encode_metrics_as(Classic, &status(), &Counters::new(), 0);
        assert!(!classic.contains("# EOF"), "{classic}");
        assert!(
            classic
                .contains("# TYPE fastpath_lb_reloads_total counter\nfastpath_lb_reloads_total 2"),
            "{classic}"
        );
        assert!(Classic
            .content_type()
            .starts_with("text/plain; version=0.0.4"));
        assert!(OpenMetrics
            .content_type()
            .starts_with("application/openmetrics-text"));
    }

    /// A load balancer following etcd exports the revisions it runs and
    /// refused, its counts, and how old its view is; one on a file none.
    #[test]
    fn the_etcd_source_is_exported() {
        let mut s = status();
        assert!(!encode_metrics(&s, &Counters::new(), 0).contains("config_etcd"));
        s.config_source = Some(crate::ConfigSourceStatus {
            kind: "etcd".into(),
            applied_revision: Some(41),
            pushed_revision: Some(40),
            refused_revision: Some(43),
            etcd_answered_s_ago: Some(2.5),
            push_in_progress: Some("ops since revision 44".into()),
            applied_total: 3,
            refused_total: 1,
            ..crate::ConfigSourceStatus::default()
        });
        let text = encode_metrics(&s, &Counters::new(), 0);
        for line in [
            "fastpath_lb_config_etcd_applied_revision 41",
            "fastpath_lb_config_etcd_pushed_revision 40",
            "fastpath_lb_config_etcd_refused_revision 43",
            "fastpath_lb_config_etcd_applied_total 3",
            "fastpath_lb_config_etcd_refused_total 1",
            "fastpath_lb_config_etcd_answered_seconds_ago 2.5",
            "fastpath_lb_config_etcd_waiting 1",
        ] {
            assert!(text.contains(line), "{line} missing:\n{text}");
        }
    }

    /// Every metric the shipped Grafana dashboard queries is in the
    /// exposition (those of `[fleet]` and `[tracer]` by family name, as a
    /// single box exports neither).
    #[test]
    fn the_dashboard_queries_only_metrics_that_exist() {
        let dash: serde_json::Value =
            serde_json::from_str(include_str!("../../../dashboards/fastpath-lb.json")).unwrap();
        let text = encode_metrics(&status(), &Counters::new(), 0);
        let mut names = 0;
        for p in dash["panels"].as_array().unwrap() {
            for q in p["targets"].as_array().unwrap() {
                let mut rest = q["expr"].as_str().unwrap();
                while let Some(i) = rest.find("fastpath_lb_") {
                    let name: String = rest[i..]
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    let optional = [
                        "fastpath_lb_fleet_",
                        "fastpath_lb_fragments_redirected",
                        "fastpath_lb_trace_",
                    ]
                    .iter()
                    .any(|p| name.starts_with(p));
                    let found = if optional {
                        include_str!("metrics.rs")
                            .contains(&format!("\"{}\"", name.trim_end_matches("_total")))
                    } else {
                        text.lines().any(|l| {
                            l.starts_with(&format!("{name}{{"))
                                || l.starts_with(&format!("{name} "))
                        })
                    };
                    assert!(found, "the dashboard's {name} is not exported:\n{text}");
                    names += 1;
                    rest = &rest[i + name.len()..];
                }
            }
        }
        assert!(names >= 20, "{names}");
    }
}
