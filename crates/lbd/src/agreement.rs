//! Whether a fleet of load balancers agrees (Maglev, NSDI'16, section 3.4):
//! behind ECMP, a flow that moves to another load balancer keeps its
//! backend only if that one's Maglev table is the same. Each load balancer
//! publishes a per-VIP table fingerprint in `/status`
//! ([`lb::tables::Vip::fingerprint`]); [`compare`] lines the fleet's
//! documents up VIP by VIP, finds the majority and names the odd one out
//! with what differs (pool, backends, weights, health, table size). Beside
//! the VIPs, the fleet must agree on what is not in a VIP's table: the
//! `[fleet]` peers (every load balancer sends a fragment to the peer its
//! own list makes responsible, so one list that differs loses fragments)
//! and the encapsulation's shared settings (families, source prefixes,
//! TTL); these are compared the same way. [`check`] fetches the documents
//! from the load balancers' APIs first (`fastpath lb status --api A --api
//! B ...`).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::SocketAddr;

use serde::Serialize;

use crate::client::fetch_status_with;
use crate::status::{BackendStatus, Status, VipStatus};

/// What differs between load balancers for one VIP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Aspect {
    /// The load balancer does not have the VIP at all.
    Vip,
    /// The VIP's pool name.
    Pool,
    /// Backends present on one side only.
    Backends,
    /// A backend's weight (including drained, weight 0).
    Weight,
    /// A backend's health.
    Health,
    /// The pool's Maglev table size M.
    TableSize,
    /// The tables differ though the documents show the same pool, backends,
    /// weights, health and table size (another version).
    Table,
    /// The `[fleet]` peers (or whether there is a `[fleet]` at all).
    Peers,
    /// The encapsulation's shared settings: the families reached, the
    /// source prefixes, the TTL.
    Encap,
    /// The load balancer's API did not answer.
    Unreachable,
}

impl Aspect {
    /// The word used in text output.
    pub fn name(self) -> &'static str {
        match self {
            Aspect::Vip => "vip",
            Aspect::Pool => "pool",
            Aspect::Backends => "backends",
            Aspect::Weight => "weight",
            Aspect::Health => "health",
            Aspect::TableSize => "table_size",
            Aspect::Table => "table",
            Aspect::Peers => "peers",
            Aspect::Encap => "encap",
            Aspect::Unreachable => "unreachable",
        }
    }
}

/// One difference found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Difference {
    /// The VIP concerned (empty for an unreachable load balancer).
    pub vip: String,
    /// The odd one out: the load balancer that differs from the majority.
    /// `None` when there is no majority (such as two of two differing):
    /// then `detail` compares each group with the first load balancer.
    pub lb: Option<String>,
    /// Whether a strict majority of the load balancers agree on this VIP.
    pub majority: bool,
    /// What differs.
    pub aspects: Vec<Aspect>,
    /// For people: what differs, with the values on each side.
    pub detail: String,
}

/// One VIP of one load balancer, as the fleet table shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VipRow {
    /// VIP name.
    pub name: String,
    /// Table fingerprint, 16 hex digits.
    pub fingerprint: String,
    /// Backends in its table.
    pub healthy_backends: usize,
    /// Backends configured.
    pub backends: usize,
    /// Whether it differs from the majority (or there is none).
    pub odd: bool,
}

/// One load balancer in the fleet.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LbRow {
    /// How it was named: its API address.
    pub api: String,
    /// Its packet I/O driver (empty if unreachable).
    pub driver: String,
    /// Its configuration generation (a local counter: it may differ
    /// between load balancers that agree).
    pub generation: u64,
    /// The next hop its encapsulated frames go to: the MAC and where it
    /// came from ("resolved", "configured"), or "UNRESOLVED"; empty if
    /// unreachable or from a version that does not say.
    pub gateway: String,
    /// Its BGP announcement as BIRD says: "announced", "withdrawn",
    /// "MISMATCH" (what BIRD does differs from what fastpath wants);
    /// empty without `[bgp]`.
    pub bgp: String,
    /// What the BGP mismatch is, in words, if there is one.
    pub bgp_mismatch: Option<String>,
    /// Its `[fleet]` peers: how many ("none" without `[fleet]`), with " *"
    /// if the list differs from the majority's.
    pub peers: String,
    /// Its VIPs.
    pub vips: Vec<VipRow>,
    /// Why its status could not be had, if it could not.
    pub error: Option<String>,
    /// Where its configuration comes from (etcd: the revision it runs,
    /// one it refused, a hold it waits on); absent from older versions.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub config_source: Option<crate::ConfigSourceStatus>,
}

/// The BGP column of the fleet table.
fn bgp_cell(s: &Status) -> String {
    match (&s.bgp, s.bgp_announced) {
        (Some(b), _) if b.mismatch.is_some() => "MISMATCH".into(),
        (_, Some(true)) => "announced".into(),
        (_, Some(false)) => "withdrawn".into(),
        (_, None) => String::new(),
    }
}

/// The gateway column of the fleet table.
fn gateway_cell(s: &Status) -> String {
    use crate::gateway::Source;
    match &s.gateway {
        None => String::new(),
        Some(g) => match (g.source, &g.mac) {
            (Source::Resolved, Some(m)) => format!("{m} (resolved)"),
            (Source::Configured, Some(m)) => format!("{m} (configured)"),
            _ => "UNRESOLVED".into(),
        },
    }
}

/// The verdict on a fleet.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Agreement {
    /// Every load balancer answered, every VIP has the same fingerprint on
    /// all of them, and they list the same peers and encapsulation
    /// settings.
    pub agree: bool,
    /// The load balancers, in the order given.
    pub lbs: Vec<LbRow>,
    /// What differs; empty when the fleet agrees.
    pub differences: Vec<Difference>,
}

/// How a VIP is identified for grouping: its fingerprint, or for documents
/// from versions without one, its contents.
fn key(v: Option<&VipStatus>) -> String {
    match v {
        None => "(absent)".into(),
        Some(v) if !v.fingerprint.is_empty() => v.fingerprint.clone(),
        Some(v) => {
            let mut s = format!("pool={};", v.pool);
            let mut b: Vec<String> = v
                .backends
                .iter()
                .map(|b| format!("{}/{}/{}/{}", b.address, b.weight, b.healthy, b.drained))
                .collect();
            b.sort();
            s.push_str(&b.join(","));
            s
        }
    }
}

fn by_address(v: &VipStatus) -> BTreeMap<&str, &BackendStatus> {
    v.backends.iter().map(|b| (b.address.as_str(), b)).collect()
}

/// What differs between two load balancers' views of one VIP (`ours` is
/// the odd one, `theirs` the reference, named `others` in the words), and
/// the words saying so.
fn describe(
    ours: Option<&VipStatus>,
    theirs: Option<&VipStatus>,
    others: &str,
) -> (Vec<Aspect>, String) {
    let (o, t) = match (ours, theirs) {
        (None, _) => return (vec![Aspect::Vip], "VIP not configured here".into()),
        (_, None) => return (vec![Aspect::Vip], "VIP configured only here".into()),
        (Some(o), Some(t)) => (o, t),
    };
    let mut aspects = BTreeSet::new();
    let mut words = Vec::new();
    if o.pool != t.pool {
        aspects.insert(Aspect::Pool);
        words.push(format!("pool {} ({others}: {})", o.pool, t.pool));
    }
    let (ob, tb) = (by_address(o), by_address(t));
    let only_ours: Vec<&str> = ob
        .keys()
        .filter(|a| !tb.contains_key(*a))
        .copied()
        .collect();
    let only_theirs: Vec<&str> = tb
        .keys()
        .filter(|a| !ob.contains_key(*a))
        .copied()
        .collect();
    if !only_ours.is_empty() {
        aspects.insert(Aspect::Backends);
        words.push(format!("extra backends {}", only_ours.join(", ")));
    }
    if !only_theirs.is_empty() {
        aspects.insert(Aspect::Backends);
        words.push(format!("missing backends {}", only_theirs.join(", ")));
    }
    for (addr, b) in &ob {
        let Some(other) = tb.get(addr) else { continue };
        if b.weight != other.weight {
            aspects.insert(Aspect::Weight);
            words.push(format!(
                "{} ({addr}) weight {} ({others}: {})",
                b.name, b.weight, other.weight
            ));
        }
        if b.drained != other.drained {
            aspects.insert(Aspect::Weight);
            let d = |x: bool| if x { "drained" } else { "not drained" };
            words.push(format!(
                "{} ({addr}) {} ({others}: {})",
                b.name,
                d(b.drained),
                d(other.drained)
            ));
        }
        if b.healthy != other.healthy {
            aspects.insert(Aspect::Health);
            let h = |x: bool| if x { "healthy" } else { "unhealthy" };
            words.push(format!(
                "{} ({addr}) {} ({others}: {})",
                b.name,
                h(b.healthy),
                h(other.healthy)
            ));
        }
    }
    if o.table_size != t.table_size && o.table_size != 0 && t.table_size != 0 {
        aspects.insert(Aspect::TableSize);
        words.push(format!(
            "table size {} ({others}: {})",
            o.table_size, t.table_size
        ));
    }
    if aspects.is_empty() {
        aspects.insert(Aspect::Table);
        words.push(format!(
            "same pool, backends, weights and health, but table {} ({others}: {}): another table size or version",
            o.fingerprint, t.fingerprint
        ));
    }
    (aspects.into_iter().collect(), words.join("; "))
}

/// One fleet-wide setting of each load balancer (`value`; none where the
/// document does not say, as older versions' do not), grouped as VIPs are:
/// with a strict majority of those that say, each other one is named with
/// `explain(its value, the majority's, "others")`; without, each group is
/// compared with the first load balancer's.
fn compare_setting(
    lbs: &[(String, Status)],
    aspect: Aspect,
    value: impl Fn(&Status) -> Option<String>,
    explain: impl Fn(&str, &str, &str) -> String,
) -> Vec<Difference> {
    let values: Vec<Option<String>> = lbs.iter().map(|(_, s)| value(s)).collect();
    let mut groups: Vec<(&str, Vec<usize>)> = Vec::new();
    for (i, v) in values.iter().enumerate() {
        let Some(v) = v else { continue };
        match groups.iter_mut().find(|(g, _)| *g == v) {
            Some((_, members)) => members.push(i),
            None => groups.push((v, vec![i])),
        }
    }
    if groups.len() <= 1 {
        return Vec::new();
    }
    let said: usize = groups.iter().map(|(_, m)| m.len()).sum();
    let mut out = Vec::new();
    match groups.iter().find(|(_, m)| m.len() * 2 > said) {
        Some((reference, winners)) => {
            for (v, members) in &groups {
                if members == winners {
                    continue;
                }
                for &i in members {
                    out.push(Difference {
                        vip: String::new(),
                        lb: Some(lbs[i].0.clone()),
                        majority: true,
                        aspects: vec![aspect],
                        detail: explain(v, reference, "others"),
                    });
                }
            }
        }
        None => {
            let (first, first_members) = &groups[0];
            let name = &lbs[first_members[0]].0;
            for (v, members) in groups.iter().skip(1) {
                let who: Vec<&str> = members.iter().map(|&m| lbs[m].0.as_str()).collect();
                out.push(Difference {
                    vip: String::new(),
                    lb: None,
                    majority: false,
                    aspects: vec![aspect],
                    detail: format!(
                        "no majority: {} against {name}: {}",
                        who.join(", "),
                        explain(v, first, name)
                    ),
                });
            }
        }
    }
    out
}

/// A load balancer's `[fleet] peers`, sorted, as the fleet compares them.
fn peers_of(s: &Status) -> String {
    match &s.fleet {
        None => "(no [fleet])".into(),
        Some(f) => {
            let mut a: Vec<&str> = f.peers.iter().map(|p| p.address.as_str()).collect();
            a.sort_unstable();
            a.join(", ")
        }
    }
}

/// What differs between two peer lists, in words.
fn explain_peers(ours: &str, theirs: &str, others: &str) -> String {
    let set = |s: &str| -> BTreeSet<String> {
        if s.starts_with('(') {
            BTreeSet::new()
        } else {
            s.split(", ").map(String::from).collect()
        }
    };
    let (o, t) = (set(ours), set(theirs));
    let missing: Vec<&str> = t.difference(&o).map(String::as_str).collect();
    let extra: Vec<&str> = o.difference(&t).map(String::as_str).collect();
    let mut words = format!("peers {ours} ({others}: {theirs})");
    if !missing.is_empty() {
        let _ = write!(words, "; missing {}", missing.join(", "));
    }
    if !extra.is_empty() {
        let _ = write!(words, "; extra {}", extra.join(", "));
    }
    words.push_str(": fragments are sent to different peers");
    words
}

/// Compares the `/status` documents of a fleet, each named (by its API
/// address, say): for every VIP found on any of them, the load balancers
/// are grouped by table fingerprint. With a strict majority, each load
/// balancer outside it is named with what differs from the majority; with
/// none (two of two differing, or three ways), the difference is reported
/// without an odd one out, each other group compared with the first load
/// balancer.
pub fn compare(lbs: &[(String, Status)]) -> Agreement {
    let mut names: Vec<&str> = Vec::new();
    for (_, s) in lbs {
        for v in &s.vips {
            if !names.contains(&v.name.as_str()) {
                names.push(&v.name);
            }
        }
    }
    let vip_of = |s: &'_ Status, name: &str| s.vips.iter().position(|v| v.name == name);
    let mut differences = Vec::new();
    // (lb index, vip name) that differ.
    let mut odd: BTreeSet<(usize, String)> = BTreeSet::new();
    for name in &names {
        let views: Vec<Option<&VipStatus>> = lbs
            .iter()
            .map(|(_, s)| vip_of(s, name).map(|i| &s.vips[i]))
            .collect();
        let mut groups: Vec<(String, Vec<usize>)> = Vec::new();
        for (i, v) in views.iter().enumerate() {
            let k = key(*v);
            match groups.iter_mut().find(|(g, _)| *g == k) {
                Some((_, members)) => members.push(i),
                None => groups.push((k, vec![i])),
            }
        }
        if groups.len() <= 1 {
            continue;
        }
        let majority = groups.iter().find(|(_, m)| m.len() * 2 > lbs.len());
        match majority {
            Some((_, winners)) => {
                let reference = views[winners[0]];
                for (i, v) in views.iter().enumerate() {
                    if winners.contains(&i) {
                        continue;
                    }
                    odd.insert((i, name.to_string()));
                    let (aspects, detail) = describe(*v, reference, "others");
                    differences.push(Difference {
                        vip: name.to_string(),
                        lb: Some(lbs[i].0.clone()),
                        majority: true,
                        aspects,
                        detail,
                    });
                }
            }
            None => {
                let first = groups[0].1[0];
                for (_, members) in &groups {
                    for &i in members {
                        odd.insert((i, name.to_string()));
                    }
                }
                for (_, members) in groups.iter().skip(1) {
                    let i = members[0];
                    let (aspects, detail) = describe(views[i], views[first], &lbs[first].0);
                    let who: Vec<&str> = members.iter().map(|&m| lbs[m].0.as_str()).collect();
                    differences.push(Difference {
                        vip: name.to_string(),
                        lb: None,
                        majority: false,
                        aspects,
                        detail: format!(
                            "no majority: {} against {}: {detail}",
                            who.join(", "),
                            lbs[first].0
                        ),
                    });
                }
            }
        }
    }
    // What is not in a VIP's table: the peers and the encapsulation.
    differences.extend(compare_setting(
        lbs,
        Aspect::Peers,
        |s| Some(peers_of(s)),
        explain_peers,
    ));
    differences.extend(compare_setting(
        lbs,
        Aspect::Encap,
        |s| s.encap.as_ref().map(|e| e.shared_settings()),
        |o, t, others| format!("encap {o} ({others}: {t})"),
    ));
    let odd_setting = |i: usize, a: Aspect| {
        differences.iter().any(|d| {
            d.vip.is_empty()
                && d.aspects.contains(&a)
                && (d.lb.as_deref() == Some(lbs[i].0.as_str()) || !d.majority)
        })
    };
    let rows = lbs
        .iter()
        .enumerate()
        .map(|(i, (api, s))| LbRow {
            api: api.clone(),
            driver: s.driver.clone(),
            generation: s.generation,
            gateway: gateway_cell(s),
            bgp: bgp_cell(s),
            bgp_mismatch: s.bgp.as_ref().and_then(|b| b.mismatch.clone()),
            peers: format!(
                "{}{}",
                s.fleet
                    .as_ref()
                    .map_or("none".to_string(), |f| f.peers.len().to_string()),
                if odd_setting(i, Aspect::Peers) {
                    " *"
                } else {
                    ""
                }
            ),
            vips: s
                .vips
                .iter()
                .map(|v| VipRow {
                    name: v.name.clone(),
                    fingerprint: v.fingerprint.clone(),
                    healthy_backends: v.healthy_backends,
                    backends: v.backends.len(),
                    odd: odd.contains(&(i, v.name.clone())),
                })
                .collect(),
            error: None,
            config_source: s.config_source.clone(),
        })
        .collect();
    Agreement {
        agree: differences.is_empty(),
        lbs: rows,
        differences,
    }
}

/// For a fleet that takes its configuration from etcd: the push each load
/// balancer runs, which ones lag behind the newest of them, refused a
/// revision or wait on a hold, and how old each one's view of etcd is.
/// Empty when none takes it from etcd.
fn etcd_revisions(lbs: &[LbRow]) -> String {
    let etcd: Vec<(&str, &crate::ConfigSourceStatus)> = lbs
        .iter()
        .filter_map(|l| {
            l.config_source
                .as_ref()
                .filter(|c| c.kind == "etcd")
                .map(|c| (l.api.as_str(), c))
        })
        .collect();
    let Some(newest) = etcd.iter().filter_map(|(_, c)| c.pushed_revision).max() else {
        return String::new();
    };
    let mut out = String::from("\netcd:\n");
    for (api, c) in etcd {
        let pushed = c.pushed_revision.unwrap_or(0);
        let _ = write!(out, "  {api}: push {pushed}");
        if pushed < newest {
            let _ = write!(out, ", LAGS (newest {newest})");
        }
        if let Some(r) = c.refused_revision {
            let _ = write!(out, ", REFUSED revision {r}");
        }
        if let Some(h) = &c.held_by {
            let _ = write!(out, ", held for {h}");
        }
        if let Some(a) = c.etcd_answered_s_ago {
            let _ = write!(out, ", etcd answered {a:.1} s ago");
        }
        out.push('\n');
    }
    out
}

/// Fetches `/status` from every API at once (with `token`, for daemons
/// whose reads need it; each bounded by the [`fetch_status_with`]
/// timeouts, so an unreachable load balancer costs seconds, never a hang)
/// and compares the answers. A load balancer that does not answer is
/// listed with its error and makes `agree` false: a fleet that cannot be
/// seen whole is not known to agree.
pub fn check(apis: &[SocketAddr], token: Option<&str>) -> Agreement {
    let answers: Vec<Result<Status, String>> = std::thread::scope(|scope| {
        let handles: Vec<_> = apis
            .iter()
            .map(|&api| {
                scope.spawn(move || fetch_status_with(api, token).map_err(|e| e.to_string()))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("status fetch panicked".into()))
            })
            .collect()
    });
    let reachable: Vec<(String, Status)> = apis
        .iter()
        .zip(&answers)
        .filter_map(|(api, a)| a.as_ref().ok().map(|s| (api.to_string(), s.clone())))
        .collect();
    let mut agreement = compare(&reachable);
    let mut rows = agreement.lbs.into_iter();
    agreement.lbs = apis
        .iter()
        .zip(answers)
        .map(|(api, a)| match a {
            Ok(_) => rows.next().expect("one row per reachable load balancer"),
            Err(e) => {
                agreement.differences.push(Difference {
                    vip: String::new(),
                    lb: Some(api.to_string()),
                    majority: false,
                    aspects: vec![Aspect::Unreachable],
                    detail: e.clone(),
                });
                LbRow {
                    api: api.to_string(),
                    driver: String::new(),
                    generation: 0,
                    gateway: String::new(),
                    bgp: String::new(),
                    bgp_mismatch: None,
                    peers: String::new(),
                    vips: Vec::new(),
                    error: Some(e),
                    config_source: None,
                }
            }
        })
        .collect();
    agreement.agree = agreement.differences.is_empty();
    agreement
}

impl Agreement {
    /// The fleet table and the verdict, for people (`fastpath lb status`
    /// with several `--api`).
    pub fn to_text(&self) -> String {
        let mut vips: Vec<&str> = Vec::new();
        for lb in &self.lbs {
            for v in &lb.vips {
                if !vips.contains(&v.name.as_str()) {
                    vips.push(&v.name);
                }
            }
        }
        let mut header = vec![
            "lb".to_string(),
            "driver".into(),
            "generation".into(),
            "gateway".into(),
            "bgp".into(),
            "peers".into(),
        ];
        for v in &vips {
            header.push(format!("{v} table"));
            header.push(format!("{v} healthy"));
        }
        let mut t = measure::Table::new(header);
        for lb in &self.lbs {
            let mut row = vec![lb.api.clone()];
            if lb.error.is_some() {
                row.push("UNREACHABLE".into());
                row.push(String::new());
                row.push(String::new());
                row.push(String::new());
                row.push(String::new());
                row.extend(vips.iter().flat_map(|_| [String::new(), String::new()]));
                t.row(row);
                continue;
            }
            row.push(lb.driver.clone());
            row.push(lb.generation.to_string());
            row.push(lb.gateway.clone());
            row.push(lb.bgp.clone());
            row.push(lb.peers.clone());
            for name in &vips {
                match lb.vips.iter().find(|v| v.name == *name) {
                    Some(v) => {
                        row.push(format!(
                            "{}{}",
                            v.fingerprint,
                            if v.odd { " *" } else { "" }
                        ));
                        row.push(format!("{}/{}", v.healthy_backends, v.backends));
                    }
                    None => {
                        row.push("(absent) *".into());
                        row.push(String::new());
                    }
                }
            }
            t.row(row);
        }
        let mut out = t.to_string();
        for lb in &self.lbs {
            if let Some(m) = &lb.bgp_mismatch {
                let _ = writeln!(out, "\n{}: BGP MISMATCH: {m}", lb.api);
            }
        }
        out.push_str(&etcd_revisions(&self.lbs));
        if self.agree {
            let _ = writeln!(
                out,
                "\nfleet agrees: {} load balancers, the same tables for every VIP, the same peers and encapsulation",
                self.lbs.len()
            );
            return out;
        }
        let _ = writeln!(out, "\nfleet DISAGREES:");
        for d in &self.differences {
            let aspects: Vec<&str> = d.aspects.iter().map(|a| a.name()).collect();
            let who = match (&d.lb, d.vip.is_empty()) {
                (Some(lb), true) => lb.clone(),
                (Some(lb), false) => format!("{lb}, vip {}", d.vip),
                (None, _) => format!("vip {}", d.vip),
            };
            let _ = writeln!(out, "  {who} [{}]: {}", aspects.join(", "), d.detail);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backend(name: &str, weight: u32, healthy: bool) -> BackendStatus {
        BackendStatus {
            name: name.into(),
            address: format!("10.1.0.{}", &name[1..]),
            healthy,
            packets: 0,
            bytes: 0,
            weight,
            drained: weight == 0,
        }
    }

    /// A document with one VIP "http" over `backends`; the fingerprint is
    /// made from the contents, as the real one is.
    fn status(backends: Vec<BackendStatus>) -> Status {
        let fp = key(Some(&VipStatus {
            name: "http".into(),
            packets: 0,
            bytes: 0,
            healthy_backends: 0,
            backends: backends.clone(),
            fingerprint: String::new(),
            pool: "web".into(),
            table_bytes: 0,
            table_size: 65_537,
        }));
        let fingerprint = format!("{:016x}", fp.bytes().map(u64::from).sum::<u64>() * 7919);
        let healthy = backends
            .iter()
            .filter(|b| b.healthy && b.weight > 0 && !b.drained)
            .count();
        // Through JSON, as the documents arrive, so that fields added later
        // with defaults need no change here.
        serde_json::from_value(serde_json::json!({
            "driver": "af_packet",
            "generation": 1,
            "uptime_s": 1.0,
            "reloads": 0,
            "reload_failures": 0,
            "last_reload_error": null,
            "forwarded": 0,
            "dropped": 0,
            "drops": {},
            "conntrack_entries": 0,
            "bgp_announced": null,
            "bgp_error": null,
            "vips": [VipStatus {
                name: "http".into(),
                packets: 0,
                bytes: 0,
                healthy_backends: healthy,
                backends,
                fingerprint,
                pool: "web".into(),
                table_bytes: 0,
                table_size: 65_537,
            }],
        }))
        .expect("a /status document")
    }

    fn good() -> Vec<BackendStatus> {
        vec![
            backend("b1", 1, true),
            backend("b2", 2, true),
            backend("b3", 1, true),
        ]
    }

    fn named(s: Vec<Status>) -> Vec<(String, Status)> {
        s.into_iter()
            .enumerate()
            .map(|(i, s)| (format!("lb{}", i + 1), s))
            .collect()
    }

    #[test]
    fn older_documents_without_the_new_fields_still_parse() {
        let mut doc = serde_json::to_value(status(good())).unwrap();
        let vip = &mut doc["vips"][0];
        let v = vip.as_object_mut().unwrap();
        v.remove("fingerprint");
        v.remove("pool");
        for b in v["backends"].as_array_mut().unwrap() {
            let b = b.as_object_mut().unwrap();
            b.remove("weight");
            b.remove("drained");
        }
        let s: Status = serde_json::from_value(doc).unwrap();
        assert_eq!(s.vips[0].fingerprint, "");
        assert_eq!(s.vips[0].backends[1].weight, 0);
    }

    #[test]
    fn an_etcd_fleet_names_who_lags_and_who_refused() {
        let source = |pushed: i64, refused: Option<i64>| crate::ConfigSourceStatus {
            kind: "etcd".into(),
            pushed_revision: Some(pushed),
            refused_revision: refused,
            etcd_answered_s_ago: Some(0.5),
            ..Default::default()
        };
        let mut lbs = named(vec![status(good()), status(good()), status(good())]);
        lbs[0].1.config_source = Some(source(12, None));
        lbs[1].1.config_source = Some(source(10, None));
        lbs[2].1.config_source = Some(source(12, Some(13)));
        let text = compare(&lbs).to_text();
        let line = |lb: &str| {
            text.lines()
                .find(|l| l.trim_start().starts_with(&format!("{lb}:")) && l.contains("push"))
                .unwrap_or_else(|| panic!("no etcd line for {lb}: {text}"))
                .to_string()
        };
        assert!(
            line(&lbs[1].0).contains("push 10, LAGS (newest 12)"),
            "{text}"
        );
        assert!(!line(&lbs[0].0).contains("LAGS"), "{text}");
        assert!(line(&lbs[2].0).contains("REFUSED revision 13"), "{text}");
        // A fleet from files says nothing of etcd.
        let files = compare(&named(vec![status(good()), status(good())])).to_text();
        assert!(!files.contains("etcd"), "{files}");
    }

    #[test]
    fn identical_documents_agree() {
        let a = compare(&named(vec![status(good()), status(good()), status(good())]));
        assert!(a.agree, "{a:?}");
        assert!(a.differences.is_empty());
        assert_eq!(a.lbs.len(), 3);
        assert!(a.lbs.iter().all(|l| !l.vips[0].odd));
        assert!(a.to_text().contains("fleet agrees"));
    }

    #[test]
    fn one_weight_differing_on_one_of_three_names_it() {
        let mut odd = good();
        odd[1].weight = 3;
        let a = compare(&named(vec![status(good()), status(odd), status(good())]));
        assert!(!a.agree);
        assert_eq!(a.differences.len(), 1, "{:?}", a.differences);
        let d = &a.differences[0];
        assert_eq!(d.lb.as_deref(), Some("lb2"));
        assert!(d.majority);
        assert_eq!(d.aspects, [Aspect::Weight]);
        assert!(d.detail.contains("weight 3 (others: 2)"), "{}", d.detail);
        assert!(a.lbs[1].vips[0].odd && !a.lbs[0].vips[0].odd);
        let text = a.to_text();
        assert!(
            text.contains("fleet DISAGREES") && text.contains("lb2, vip http [weight]"),
            "{text}"
        );
    }

    #[test]
    fn two_of_two_differing_have_no_majority() {
        let mut other = good();
        other.pop();
        other[0].healthy = false;
        let a = compare(&named(vec![status(good()), status(other)]));
        assert!(!a.agree);
        assert_eq!(a.differences.len(), 1);
        let d = &a.differences[0];
        assert_eq!(d.lb, None, "no odd one out without a majority");
        assert!(!d.majority);
        assert_eq!(d.aspects, [Aspect::Backends, Aspect::Health]);
        assert!(d.detail.starts_with("no majority"), "{}", d.detail);
        assert!(
            d.detail.contains("missing backends 10.1.0.3"),
            "{}",
            d.detail
        );
        assert!(
            d.detail.contains("unhealthy (lb1: healthy)"),
            "{}",
            d.detail
        );
        assert!(a.lbs.iter().all(|l| l.vips[0].odd));
    }

    #[test]
    fn missing_vip_and_other_pool_are_named() {
        let mut no_vip = status(good());
        no_vip.vips.clear();
        let mut other_pool = status(good());
        other_pool.vips[0].pool = "web2".into();
        other_pool.vips[0].fingerprint = "00000000000000ff".into();
        let a = compare(&named(vec![
            status(good()),
            no_vip,
            status(good()),
            other_pool,
            status(good()),
        ]));
        let got: Vec<(Option<&str>, &[Aspect])> = a
            .differences
            .iter()
            .map(|d| (d.lb.as_deref(), d.aspects.as_slice()))
            .collect();
        assert_eq!(
            got,
            [
                (Some("lb2"), &[Aspect::Vip][..]),
                (Some("lb4"), &[Aspect::Pool][..])
            ]
        );
    }

    #[test]
    fn documents_without_fingerprints_compare_by_contents() {
        let strip = |mut s: Status| {
            s.vips[0].fingerprint.clear();
            s
        };
        let mut drained = good();
        drained[2].weight = 0;
        let a = compare(&named(vec![
            strip(status(good())),
            strip(status(good())),
            strip(status(drained)),
        ]));
        assert_eq!(a.differences.len(), 1);
        assert_eq!(a.differences[0].lb.as_deref(), Some("lb3"));
        assert_eq!(a.differences[0].aspects, [Aspect::Weight]);
    }

    #[test]
    fn the_fleet_table_shows_each_gateway() {
        use crate::gateway::{GatewayStatus, Source};
        let gw = |mac: Option<&str>, source| GatewayStatus {
            mac: mac.map(String::from),
            source,
            interface: "l0".into(),
            address: Some("10.10.2.1".into()),
            toward: Some("10.10.3.2".into()),
            error: None,
            warning: None,
        };
        let mut lbs = vec![status(good()), status(good()), status(good())];
        lbs[0].gateway = Some(gw(Some("02:00:00:00:00:aa"), Source::Resolved));
        lbs[1].gateway = Some(gw(None, Source::Unresolved));
        let a = compare(&named(lbs));
        let cells: Vec<&str> = a.lbs.iter().map(|l| l.gateway.as_str()).collect();
        // The third is an older document without the field.
        assert_eq!(cells, ["02:00:00:00:00:aa (resolved)", "UNRESOLVED", ""]);
        let text = a.to_text();
        assert!(
            text.contains("gateway") && text.contains("UNRESOLVED"),
            "{text}"
        );
    }

    /// A fleet whose load balancers agree on every VIP's table but not on
    /// their peers (one lacks a peer: its fragments go elsewhere) or their
    /// encapsulation: the fleet disagrees and the odd one is named with the
    /// field; documents without the fields compare as before.
    #[test]
    fn peers_encapsulation_and_table_size_are_compared_too() {
        use crate::status::EncapStatus;
        use crate::tasks::peers::{FleetStatus, PeerStatus};
        let fleet = |addrs: &[&str]| FleetStatus {
            name: "lb".into(),
            peers: addrs
                .iter()
                .map(|a| PeerStatus {
                    address: a.to_string(),
                    this: false,
                    up: true,
                    fragments_redirected: 0,
                })
                .collect(),
            fragments_redirected: 0,
            fragments_redirect_received: 0,
            fragments_peer_down: 0,
        };
        let encap = |prefix: Option<&str>| EncapStatus {
            source: Some("10.10.2.2".into()),
            source6: None,
            source_prefix: prefix.map(String::from),
            source_prefix6: None,
            ttl: 64,
        };
        let all = ["10.10.2.2", "10.10.2.3", "10.10.2.4"];
        let mut lbs = vec![status(good()), status(good()), status(good())];
        for (i, s) in lbs.iter_mut().enumerate() {
            s.fleet = Some(fleet(&all));
            let mut e = encap(None);
            e.source = Some(all[i].into());
            s.encap = Some(e);
        }
        let a = compare(&named(lbs.clone()));
        assert!(a.agree, "each one's own source differs by design: {a:?}");
        lbs[2].fleet = Some(fleet(&["10.10.2.4", "10.10.2.2"]));
        let a = compare(&named(lbs.clone()));
        assert!(!a.agree);
        assert_eq!(a.differences.len(), 1, "{:?}", a.differences);
        let d = &a.differences[0];
        assert_eq!(
            (d.lb.as_deref(), &d.aspects[..]),
            (Some("lb3"), &[Aspect::Peers][..])
        );
        assert!(d.detail.contains("missing 10.10.2.3"), "{}", d.detail);
        assert_eq!(a.lbs[2].peers, "2 *");
        assert_eq!(a.lbs[0].peers, "3");
        let text = a.to_text();
        assert!(
            text.contains("lb3 [peers]: peers 10.10.2.2, 10.10.2.4"),
            "{text}"
        );

        lbs[2].fleet = Some(fleet(&all));
        lbs[0].encap = Some(encap(Some("10.20.0.0/24")));
        lbs[1].vips[0].table_size = 1009;
        lbs[1].vips[0].fingerprint = "00000000000000ff".into();
        let a = compare(&named(lbs.clone()));
        let got: Vec<(Option<&str>, &[Aspect])> = a
            .differences
            .iter()
            .map(|d| (d.lb.as_deref(), d.aspects.as_slice()))
            .collect();
        assert_eq!(
            got,
            [
                (Some("lb2"), &[Aspect::TableSize][..]),
                (Some("lb1"), &[Aspect::Encap][..])
            ]
        );
        assert!(a.differences[0]
            .detail
            .contains("table size 1009 (others: 65537)"));
        assert!(a.differences[1]
            .detail
            .contains("source_prefix 10.20.0.0/24"));

        // Older documents say neither: nothing to compare.
        let old = compare(&named(vec![status(good()), status(good())]));
        assert!(old.agree, "{old:?}");
    }

    #[test]
    fn an_unreachable_load_balancer_is_reported_not_waited_for() {
        // A port on loopback with nothing listening: refused at once.
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = free.local_addr().unwrap();
        drop(free);
        let t = std::time::Instant::now();
        let a = check(&[addr], None);
        assert!(t.elapsed() < std::time::Duration::from_secs(5));
        assert!(!a.agree);
        assert!(a.lbs[0].error.is_some());
        assert_eq!(a.differences[0].aspects, [Aspect::Unreachable]);
        assert!(a.to_text().contains("UNREACHABLE"));
    }
}
