//! `fastpath lb demo`: a Maglev fleet in a throwaway network, shown to a
//! person (or, with `--format json`, measured for a script). Everything it
//! creates is removed at the end, also on Ctrl-C.
//!
//! Three load balancers (fastpath + BIRD each) announce the VIP to a
//! router (BIRD, one ECMP route hashed on the 5-tuple) in front of nginx
//! backends that decapsulate GRE and answer the client directly. The demo
//! shows what Maglev's consistent hashing is for (paper section 3.4): the
//! set of load balancers changes under load and connections keep their
//! backend, because every load balancer computes the same table.
//!
//! 1. Requests spread over load balancers and backends (a table).
//! 2. Long-lived connections are opened; which load balancer carries each
//!    is asked of the router's kernel (`ip route get` with the 5-tuple).
//! 3. A load balancer's machine dies under load (fastpath and its BIRD
//!    frozen, then killed: nothing is withdrawn): BFD takes it out of the
//!    route; its flows, and flows the kernel's hash-threshold multipath
//!    moves between the survivors, arrive where no connection-tracking
//!    entry knows them and must find the same backend by hashing.
//! 4. It comes back: flows move back to an empty connection table.
//! 5. Every load balancer is restarted in turn under HTTP load, gracefully
//!    (SIGTERM: withdraw, drain, stop) — no request may fail.
//! 6. A backend is removed while a load balancer is down: the connections
//!    that break are counted beside what Maglev's table disruption
//!    predicts (connections whose table entry changed).
//! 7. The fleet's tables are compared (fingerprints).
//! 8. QUIC downloads that move mid-download (new address and port) through
//!    the fleet: all complete with the VIP routed by connection ID
//!    (QUIC-LB), most break with it routed by the 5-tuple.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::topology::{HttpConn, Topology, VIP};
use measure::Table;

use crate::{Error, Result};

/// What the demo is asked to do.
#[derive(Debug, Clone)]
pub struct Options {
    /// Load balancers in the fleet (2 to 8).
    pub lbs: usize,
    /// nginx backends (2 to 8).
    pub backends: usize,
    /// Requests (each a new connection) for the spread table.
    pub requests: usize,
    /// Long-lived connections kept open through the fleet's changes.
    pub connections: usize,
    /// Print the JSON report instead of tables (progress goes to stderr).
    pub json: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            lbs: 3,
            backends: 3,
            requests: 300,
            connections: 60,
            json: false,
        }
    }
}

/// A change of the fleet and what it did to long-lived connections.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Churn {
    /// Long-lived connections checked.
    pub connections: usize,
    /// Of them, carried by another load balancer after the change than
    /// before it (no connection-tracking entry where they arrived).
    pub moved_lb: usize,
    /// Of them, answered by another backend or not at all (goal 0).
    pub broken_connections: usize,
    /// Milliseconds until the router's route showed the change.
    pub route_change_ms: f64,
    /// Requests on new connections sent by the background load meanwhile.
    pub requests: u64,
    /// Of them, failed.
    pub failed_requests: u64,
}

/// The rolling restart of every load balancer.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Rolling {
    /// Requests on new connections during the restarts.
    pub requests: u64,
    /// Of them, failed (goal 0).
    pub failed_requests: u64,
    /// Long-lived connections checked afterwards.
    pub connections: usize,
    /// Of them, broken (goal 0).
    pub broken_connections: usize,
    /// Per load balancer: milliseconds from SIGTERM until the router had
    /// withdrawn it, until the process had drained and exited, and from
    /// the restart until it was back in the route.
    pub per_lb: Vec<RestartTimes>,
    /// The first failures, for diagnosis.
    pub failures: Vec<String>,
}

/// One load balancer's graceful restart.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RestartTimes {
    /// Which (1-based).
    pub lb: usize,
    /// SIGTERM until the router's route no longer led to it, ms.
    pub withdrawn_ms: f64,
    /// SIGTERM until the process exited (withdraw, drain, stop), ms.
    pub exited_ms: f64,
    /// Restart until the route led to it again, ms.
    pub back_ms: f64,
}

/// A backend removed while a load balancer is down.
#[derive(Debug, Clone, Default, Serialize)]
pub struct BackendChange {
    /// The load balancer that was down (1-based).
    pub lb_down: usize,
    /// The backend removed.
    pub removed_backend: String,
    /// Long-lived connections checked.
    pub connections: usize,
    /// Of them, on the removed backend (they must break).
    pub on_removed_backend: usize,
    /// What Maglev's table disruption predicts: connections whose entry in
    /// the lookup table changed (any of them breaks if it reaches a load
    /// balancer without its connection-tracking entry).
    pub predicted: usize,
    /// Broken right after the removal (the load balancer still down).
    pub broken_while_down: usize,
    /// Broken in all, after the load balancer came back with the new
    /// configuration (flows moved back to an empty connection table).
    pub broken_connections: usize,
}

/// The demo's figures (`fastpath lb demo --format json` prints
/// `{"fleet": ...}`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct FleetReport {
    /// Load balancers.
    pub lbs: usize,
    /// Backends.
    pub backends: usize,
    /// Requests by load balancer, then backend (new connections).
    pub spread: BTreeMap<String, BTreeMap<String, usize>>,
    /// Requests of the spread that failed.
    pub spread_failed: usize,
    /// Load balancer 1 killed (SIGKILL) under load.
    pub lb_killed: Churn,
    /// Load balancer 1 restarted.
    pub lb_restored: Churn,
    /// Every load balancer restarted gracefully in turn, under load.
    pub rolling_restart: Rolling,
    /// A backend removed while a load balancer was down.
    pub lb_and_backend_change: BackendChange,
    /// Migrating QUIC downloads with QUIC-LB on, then off (none where
    /// `fastpath-quic-peer` is not installed beside `fastpath`).
    pub quic: Option<QuicMigration>,
    /// Whether every load balancer's tables have the same fingerprint.
    pub agree: bool,
    /// The fleet comparison, as `fastpath lb status --api ...` prints it.
    pub agreement: String,
    /// Seconds the demo took.
    pub seconds: f64,
}

/// QUIC downloads that move mid-download (rebinding to another address
/// and port), through the fleet with the VIP routed by connection ID and
/// then by the 5-tuple.
#[derive(Debug, Clone, Default, Serialize)]
pub struct QuicMigration {
    /// With `quic = true` (QUIC-LB).
    pub routed_by_cid: crate::quic::Downloads,
    /// The same with `quic = false`.
    pub routed_by_5tuple: crate::quic::Downloads,
}

fn check(stop: &AtomicBool) -> Result<()> {
    if stop.load(Ordering::Relaxed) {
        return Err(Error::Interrupted);
    }
    Ok(())
}

/// New-connection HTTP requests in a loop from the client's namespace,
/// counted, until stopped.
struct Load {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    failures: Arc<Mutex<Vec<String>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Load {
    fn start(t: &Topology) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU64::new(0));
        let failed = Arc::new(AtomicU64::new(0));
        let failures = Arc::new(Mutex::new(Vec::new()));
        let ns = t.client.name().to_string();
        let started = Instant::now();
        let thread = {
            let (stop, sent, failed, failures) = (
                Arc::clone(&stop),
                Arc::clone(&sent),
                Arc::clone(&failed),
                Arc::clone(&failures),
            );
            std::thread::spawn(move || {
                if crate::netns::enter(&ns).is_err() {
                    failed.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                while !stop.load(Ordering::Relaxed) {
                    sent.fetch_add(1, Ordering::Relaxed);
                    let r = HttpConn::connect().and_then(|mut c| c.get());
                    match r {
                        Ok(body) if body.starts_with("backend-") => {}
                        other => {
                            failed.fetch_add(1, Ordering::Relaxed);
                            let mut f = failures.lock().unwrap_or_else(|p| p.into_inner());
                            if f.len() < 5 {
                                f.push(format!(
                                    "{:.2} s: {}",
                                    started.elapsed().as_secs_f64(),
                                    match other {
                                        Ok(b) => format!("answer {b:?}"),
                                        Err(e) => e.to_string(),
                                    }
                                ));
                            }
                        }
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
            })
        };
        Load {
            stop,
            sent,
            failed,
            failures,
            thread: Some(thread),
        }
    }

    /// Stops the load: (requests, failed, first failures).
    fn finish(mut self) -> (u64, u64, Vec<String>) {
        self.end();
        let f = self
            .failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        (
            self.sent.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
            f,
        )
    }
}

impl Load {
    /// Stops the client thread and waits for it (once).
    fn end(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.end();
    }
}

/// A long-lived connection: who answered it first and through which load
/// balancer it went.
struct Conn {
    c: HttpConn,
    backend: String,
    lb: Option<usize>,
    broken: bool,
}

/// Asks every live connection again; counts those newly broken (an error,
/// or another backend) and those whose load balancer changed.
fn recheck(t: &Topology, conns: &mut [Conn]) -> Result<(usize, usize, usize)> {
    let ports: Vec<u16> = conns.iter().map(|c| c.c.local_port()).collect();
    let lbs = t.lbs_of(&ports)?;
    let (mut checked, mut broken, mut moved) = (0, 0, 0);
    for (c, lb) in conns.iter_mut().zip(lbs) {
        if c.broken {
            continue;
        }
        checked += 1;
        if lb != c.lb {
            moved += 1;
            c.lb = lb;
        }
        match c.c.get() {
            Ok(b) if b == c.backend => {}
            _ => {
                c.broken = true;
                broken += 1;
            }
        }
    }
    Ok((checked, broken, moved))
}

/// The Maglev backend of the client's TCP flow from `port` to the VIP's
/// port 80 under the configuration in `file` (pool `web`).
fn predicted_backend(file: &std::path::Path, port: u16) -> Option<IpAddr> {
    let cfg = lb::config::Config::load(file).ok()?.config;
    let flow = packet::FlowKey {
        src: packet::flow::mapped([10, 10, 1, 2]),
        dst: VIP
            .parse::<std::net::Ipv4Addr>()
            .ok()
            .map(|a| packet::flow::mapped(a.octets()))?,
        src_port: port,
        dst_port: 80,
        proto: 6,
    };
    crate::sample::expected_backend(&cfg, "web", &flow)
}

/// Runs the demo; the report. Tables go to stdout, or with
/// [`Options::json`] progress goes to stderr and the caller prints JSON.
pub fn run(opts: &Options, stop: Arc<AtomicBool>) -> Result<FleetReport> {
    let json = opts.json;
    let say = |s: &str| {
        if json {
            eprintln!("{s}");
        } else {
            println!("{s}");
        }
    };
    let begun = Instant::now();
    let lbs = opts.lbs.clamp(2, 8);
    let nb = opts.backends.clamp(2, 8);
    let exe = std::env::current_exe().map_err(Error::io("finding our own binary"))?;
    say(&format!(
        "Building the fleet: client, router (BIRD, ECMP), {lbs} load balancers (fastpath + BIRD each), {nb} nginx backends (fastpath lb decap)..."
    ));
    let mut t = Topology::build_fleet(
        &exe,
        lbs,
        nb,
        &format!("demo{}", std::process::id() % 100_000),
    )?;
    say(&format!(
        "\n  client 10.10.1.2 -> router 10.10.1.1 (one route to {VIP}, {lbs} next hops, 5-tuple hash)\n  \
         -> load balancers 10.10.2.2 .. 10.10.2.{} (AF_XDP, Maglev, GRE) -> backends 10.10.3.2 .. 10.10.{}.2 -> straight back to the client\n",
        lbs + 1,
        nb + 2
    ));
    check(&stop)?;
    t.start_lbs()?;
    let all: Vec<usize> = (1..=lbs).collect();
    let up = t.wait_for_ecmp(&all, Duration::from_secs(40))?;
    t.wait_for_vip(Duration::from_secs(20))?;
    say(&format!(
        "The router learned the VIP from all {lbs} load balancers over BGP after {:.1} s:\n{}",
        up.as_secs_f64(),
        t.router_route().trim_end()
    ));
    check(&stop)?;
    let mut report = FleetReport {
        lbs,
        backends: nb,
        ..FleetReport::default()
    };

    // 1. The spread.
    let n = opts.requests;
    let answers = Topology::inside(&t.client, move || {
        (0..n)
            .map(|_| match HttpConn::connect() {
                Ok(mut c) => (c.local_port(), c.get().unwrap_or_default()),
                Err(_) => (0, String::new()),
            })
            .collect::<Vec<_>>()
    })?;
    let ports: Vec<u16> = answers.iter().map(|a| a.0).collect();
    let by_lb = t.lbs_of(&ports)?;
    for ((_, body), lb) in answers.iter().zip(&by_lb) {
        if body.is_empty() {
            report.spread_failed += 1;
            continue;
        }
        let lb = lb.map(|k| format!("lb{k}")).unwrap_or_else(|| "?".into());
        *report
            .spread
            .entry(lb)
            .or_default()
            .entry(body.clone())
            .or_insert(0) += 1;
    }
    let mut head = vec!["load balancer".to_string()];
    head.extend((1..=nb).map(|i| format!("backend-{i}")));
    head.push("all".into());
    let mut table = Table::new(head).title(format!(
        "{n} requests, each a new connection: load balancer (ECMP) x backend (Maglev)"
    ));
    for k in 1..=lbs {
        let row = report.spread.get(&format!("lb{k}"));
        let mut cells = vec![format!("lb{k} ({})", Topology::lb_address(k))];
        let mut sum = 0;
        for i in 1..=nb {
            let v = row
                .and_then(|r| r.get(&format!("backend-{i}")))
                .copied()
                .unwrap_or(0);
            sum += v;
            cells.push(v.to_string());
        }
        cells.push(sum.to_string());
        table.row(cells);
    }
    say(&format!("\n{table}"));
    if report.spread_failed > 0 {
        say(&format!("  {} requests failed", report.spread_failed));
    }
    check(&stop)?;

    // 2. Long-lived connections.
    let mut conns: Vec<Conn> = Vec::new();
    for _ in 0..opts.connections {
        let mut c = Topology::inside(&t.client, HttpConn::connect)??;
        let backend = c.get()?;
        conns.push(Conn {
            c,
            backend,
            lb: None,
            broken: false,
        });
    }
    let ports: Vec<u16> = conns.iter().map(|c| c.c.local_port()).collect();
    for (c, lb) in conns.iter_mut().zip(t.lbs_of(&ports)?) {
        c.lb = lb;
    }
    let mut per: BTreeMap<(usize, String), usize> = BTreeMap::new();
    for c in &conns {
        *per.entry((c.lb.unwrap_or(0), c.backend.clone()))
            .or_insert(0) += 1;
    }
    say(&format!(
        "Opened {} long-lived connections (HTTP keep-alive); each is asked GET / again after every change.",
        conns.len()
    ));
    check(&stop)?;

    // 3. A load balancer dies.
    say("\nLoad balancer 1's machine dies under HTTP load (fastpath and its BIRD frozen, then killed: nothing withdrawn, no session closed)...");
    let load = Load::start(&t);
    std::thread::sleep(Duration::from_millis(300));
    t.freeze_lb_machine(1)?;
    let survivors: Vec<usize> = (2..=lbs).collect();
    let out = t.wait_for_ecmp(&survivors, Duration::from_secs(10))?;
    t.kill_lb_machine(1)?;
    std::thread::sleep(Duration::from_millis(500));
    let (sent, failed, _) = load.finish();
    let (checked, broken, moved) = recheck(&t, &mut conns)?;
    report.lb_killed = Churn {
        connections: checked,
        moved_lb: moved,
        broken_connections: broken,
        route_change_ms: out.as_secs_f64() * 1e3,
        requests: sent,
        failed_requests: failed,
    };
    say(&format!(
        "  the router dropped it after {:.0} ms (BFD, 3 x 100 ms); {moved} of {checked} long-lived connections now go through another load balancer, {broken} broken; {failed} of {sent} new requests failed meanwhile",
        out.as_secs_f64() * 1e3,
    ));
    check(&stop)?;

    // 4. It comes back.
    say("Booting load balancer 1 again (BIRD, then fastpath)...");
    let back = Instant::now();
    let load = Load::start(&t);
    t.boot_lb_machine(1)?;
    t.wait_for_ecmp(&all, Duration::from_secs(30))?;
    let back_ms = back.elapsed().as_secs_f64() * 1e3;
    std::thread::sleep(Duration::from_millis(300));
    let (sent, failed, _) = load.finish();
    let (checked, broken, moved) = recheck(&t, &mut conns)?;
    report.lb_restored = Churn {
        connections: checked,
        moved_lb: moved,
        broken_connections: broken,
        route_change_ms: back_ms,
        requests: sent,
        failed_requests: failed,
    };
    say(&format!(
        "  back in the route after {back_ms:.0} ms; {moved} of {checked} connections moved back to an empty connection table, {broken} broken; {failed} of {sent} new requests failed"
    ));
    check(&stop)?;

    // 5. Rolling restart.
    say("\nRolling restart of every load balancer under HTTP load (SIGTERM: withdraw, drain, stop; then start)...");
    let load = Load::start(&t);
    let mut per_lb = Vec::new();
    for k in 1..=lbs {
        check(&stop)?;
        std::thread::sleep(Duration::from_millis(300));
        let term = Instant::now();
        let name = Topology::lb_proc(k);
        let pid = t.procs.pid(&name);
        if let Some(pid) = pid {
            let _ = rustix::process::kill_process(
                rustix::process::Pid::from_raw(pid as i32).ok_or(Error::Http("pid 0".into()))?,
                rustix::process::Signal::TERM,
            );
        }
        let others: Vec<usize> = (1..=lbs).filter(|&j| j != k).collect();
        let withdrawn = t.wait_for_ecmp(&others, Duration::from_secs(10))?;
        // The process drains and exits by itself; `stop` only reaps it.
        let deadline = Instant::now() + Duration::from_secs(8);
        while t.procs.running(&name) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let exited = term.elapsed();
        t.procs.stop(&name);
        let restart = Instant::now();
        t.start_lb_k(k)?;
        let back = t.wait_for_ecmp(&all, Duration::from_secs(30))?;
        per_lb.push(RestartTimes {
            lb: k,
            withdrawn_ms: withdrawn.as_secs_f64() * 1e3,
            exited_ms: exited.as_secs_f64() * 1e3,
            back_ms: back.as_secs_f64() * 1e3,
        });
        say(&format!(
            "  lb{k}: withdrawn after {:.0} ms, drained and exited after {:.0} ms, back after {:.0} ms",
            withdrawn.as_secs_f64() * 1e3,
            exited.as_secs_f64() * 1e3,
            restart.elapsed().as_secs_f64() * 1e3
        ));
    }
    std::thread::sleep(Duration::from_millis(300));
    let (sent, failed, failures) = load.finish();
    let (checked, broken, _) = recheck(&t, &mut conns)?;
    report.rolling_restart = Rolling {
        requests: sent,
        failed_requests: failed,
        connections: checked,
        broken_connections: broken,
        per_lb,
        failures,
    };
    say(&format!(
        "  {failed} of {sent} requests failed; {broken} of {checked} long-lived connections broken"
    ));
    check(&stop)?;

    // 6. A backend removed while a load balancer is down.
    let down = 2;
    say(&format!(
        "\nKilling load balancer {down}, then removing backend-1 from the configuration of the others (reload)..."
    ));
    t.freeze_lb_machine(down)?;
    let others: Vec<usize> = (1..=lbs).filter(|&j| j != down).collect();
    t.wait_for_ecmp(&others, Duration::from_secs(10))?;
    t.kill_lb_machine(down)?;
    // The same file before and after the rewrite: the old and the new
    // configuration.
    let cfg_file = t.config.clone();
    let before: Vec<Option<IpAddr>> = conns
        .iter()
        .map(|c| predicted_backend(&cfg_file, c.c.local_port()))
        .collect();
    let keep: Vec<(usize, u32)> = (2..=nb).map(|i| (i, 1)).collect();
    t.set_backends(&keep)?;
    let after: Vec<Option<IpAddr>> = conns
        .iter()
        .map(|c| predicted_backend(&cfg_file, c.c.local_port()))
        .collect();
    let live: Vec<usize> = (0..conns.len()).filter(|&i| !conns[i].broken).collect();
    let predicted = live.iter().filter(|&&i| before[i] != after[i]).count();
    let on_removed = live
        .iter()
        .filter(|&&i| conns[i].backend == "backend-1")
        .count();
    for &k in &others {
        t.api_on(k, "POST", "/reload")?;
    }
    let (checked, broken_down, _) = recheck(&t, &mut conns)?;
    t.boot_lb_machine(down)?;
    t.wait_for_ecmp(&all, Duration::from_secs(30))?;
    std::thread::sleep(Duration::from_millis(300));
    let (_, broken_back, _) = recheck(&t, &mut conns)?;
    report.lb_and_backend_change = BackendChange {
        lb_down: down,
        removed_backend: Topology::backend_address(1),
        connections: checked,
        on_removed_backend: on_removed,
        predicted,
        broken_while_down: broken_down,
        broken_connections: broken_down + broken_back,
    };
    say(&format!(
        "  {} of {checked} connections broken ({on_removed} were on backend-1; {} more when load balancer {down} came back); Maglev's table disruption predicts at most {predicted}",
        broken_down + broken_back,
        broken_back
    ));
    check(&stop)?;

    // 7. Does the fleet agree?
    let mut statuses = Vec::new();
    for k in 1..=lbs {
        statuses.push(t.status_of(k)?);
    }
    let named: Vec<(String, lbd::status::Status)> =
        (1..=lbs).map(|k| format!("lb{k}")).zip(statuses).collect();
    let agreement = lbd::agreement::compare(&named);
    report.agree = agreement.agree;
    report.agreement = agreement.to_text();
    say(&format!("\n{}", report.agreement));

    // 8. QUIC that moves.
    if crate::quic::QuicLab::peer_beside(&exe).is_some() {
        report.quic = Some(quic_migration(&mut t, &exe, &say)?);
    } else {
        say(&format!(
            "\nQUIC migration: skipped, {} is not installed beside fastpath (cargo build --release -p quic-peer; `make demo` builds it).",
            exe.with_file_name("fastpath-quic-peer").display()
        ));
    }
    check(&stop)?;

    let mut summary = Table::new(["fleet change", "connections", "moved LB", "broken", "goal"])
        .title("Long-lived connections through the fleet's changes:");
    let rows = [
        ("lb1 killed", &report.lb_killed),
        ("lb1 restored", &report.lb_restored),
    ];
    for (what, c) in rows {
        summary.row([
            what.to_string(),
            c.connections.to_string(),
            c.moved_lb.to_string(),
            c.broken_connections.to_string(),
            "0".into(),
        ]);
    }
    summary.row([
        "rolling restart".to_string(),
        report.rolling_restart.connections.to_string(),
        "-".into(),
        report.rolling_restart.broken_connections.to_string(),
        "0".into(),
    ]);
    let c = &report.lb_and_backend_change;
    summary.row([
        format!("backend-1 removed, lb{down} down"),
        c.connections.to_string(),
        "-".into(),
        c.broken_connections.to_string(),
        format!("<= {} predicted", c.predicted),
    ]);
    say(&format!(
        "\n{summary}Rolling restart: {} of {} requests failed (goal 0).",
        report.rolling_restart.failed_requests, report.rolling_restart.requests
    ));
    say("\nRemoving the namespaces and processes.");
    report.seconds = begun.elapsed().as_secs_f64();
    Ok(report)
}

/// Section 8 of the demo: migrating QUIC downloads with the VIP routed by
/// connection ID, then by the 5-tuple.
fn quic_migration(
    t: &mut Topology,
    exe: &std::path::Path,
    say: &dyn Fn(&str),
) -> Result<QuicMigration> {
    say("\nQUIC (HTTP/3's transport) that moves: each backend runs a QUIC server that puts its QUIC-LB server ID in the connection IDs it issues; the client rebinds every connection twice mid-download to a new address and port (a NAT rebinding, Wi-Fi to cellular)...");
    let q = crate::quic::QuicLab::new(t, exe)?;
    q.reload(t, true)?;
    q.start_servers(t, Duration::from_secs(120))?;
    let mut binds = vec!["10.10.1.2".to_string()];
    binds.extend(t.add_client_addresses(3)?);
    // The servers' sockets are bound once their process has started.
    std::thread::sleep(Duration::from_millis(300));
    let routed_by_cid = q.downloads(t, &binds, 30, 200_000, 2, Duration::from_secs(20))?;
    q.reload(t, false)?;
    let routed_by_5tuple = q.downloads(t, &binds, 30, 200_000, 2, Duration::from_secs(5))?;
    let mut qt = Table::new([
        "VIP routes QUIC by",
        "downloads",
        "moves",
        "completed",
        "broken",
    ])
    .title("30 QUIC downloads of 200 kB, each moved twice mid-download, through the fleet:");
    for (what, d) in [
        ("connection ID (quic = true)", &routed_by_cid),
        ("5-tuple (quic = false)", &routed_by_5tuple),
    ] {
        qt.row([
            what.to_string(),
            d.connections.to_string(),
            d.migrations.to_string(),
            d.ok.to_string(),
            d.broken.to_string(),
        ]);
    }
    say(&format!(
        "\n{qt}  By connection ID every datagram after a move reaches the backend that holds the connection, whichever load balancer the router picks; by the 5-tuple a moved connection lands on another backend, which does not know it."
    ));
    Ok(QuicMigration {
        routed_by_cid,
        routed_by_5tuple,
    })
}
