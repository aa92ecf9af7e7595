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
//! 9. The fleet's configuration in etcd (a three-member cluster beside
//!    the fleet): each load balancer restarted in turn to follow it; a
//!    push that adds a backend reaches all three; a revision written
//!    behind the CLI's back naming a pool that does not exist is refused
//!    by every one of them while traffic flows.

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
    /// The fleet following its configuration in etcd (none where etcd
    /// or etcdctl is not installed).
    pub etcd: Option<EtcdScene>,
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

/// One load balancer's restart onto etcd, its steps in seconds on the
/// scene's load clock (the clock its failed requests are stamped with).
#[derive(Debug, Clone, Default, Serialize)]
pub struct EtcdRestart {
    /// Which load balancer (1-based).
    pub lb: usize,
    /// SIGTERM sent.
    pub term_s: f64,
    /// The router's route without it.
    pub withdrawn_s: f64,
    /// Its process gone.
    pub exited_s: f64,
    /// The new process started (on etcd).
    pub started_s: f64,
    /// The router's route with every load balancer again.
    pub back_s: f64,
    /// Whether every load balancer's table fingerprints agreed once it was
    /// back (the restarted one built its tables from etcd, the others from
    /// their files): a connection moved between two load balancers whose
    /// tables differ may be sent to another backend.
    pub tables_agree: bool,
    /// The fleet comparison's text when they did not agree.
    pub disagreement: String,
}

/// The fleet's configuration in etcd: a push that adds a backend, then
/// an invalid revision written behind the CLI's back, under traffic.
#[derive(Debug, Clone, Default, Serialize)]
pub struct EtcdScene {
    /// The prefix the fleet follows.
    pub prefix: String,
    /// The first push (the fleet's part as the files had it).
    pub first_revision: i64,
    /// Requests on new connections while each load balancer was
    /// restarted to follow etcd.
    pub restart_requests: u64,
    /// Of them, failed (goal 0).
    pub restart_failed_requests: u64,
    /// The first of those failures, each with its second on the load's
    /// clock, to line up with [`EtcdScene::restarts`].
    pub restart_failures: Vec<String>,
    /// Per load balancer restarted, its steps on the load's clock.
    pub restarts: Vec<EtcdRestart>,
    /// The backend the second push added.
    pub added_backend: String,
    /// The second push's revision.
    pub pushed_revision: i64,
    /// Per load balancer, the revision it applied after the second push.
    pub applied: Vec<i64>,
    /// Per load balancer, ms from the push's start until its status
    /// showed that revision.
    pub applied_ms: Vec<f64>,
    /// Whether all applied the pushed revision.
    pub agree: bool,
    /// The invalid revision (a VIP naming a pool that does not exist).
    pub invalid_revision: i64,
    /// Per load balancer, its refusal of it (empty: not refused).
    pub refused: Vec<String>,
    /// Whether every one refused it and kept the pushed revision.
    pub refused_by_all: bool,
    /// Requests on new connections from the push to the refusal.
    pub requests: u64,
    /// Of them, failed (goal 0).
    pub failed_requests: u64,
    /// The first failures, for diagnosis.
    pub failures: Vec<String>,
    /// Seconds the scene took (the cluster's start included).
    pub seconds: f64,
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
    started: Instant,
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
            started,
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
    /// Seconds since the load started: the clock its failures are stamped
    /// with, so that a scene can line them up with its own steps.
    fn at(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

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

    // 9. The fleet's configuration in etcd.
    if ["etcd", "etcdctl"].iter().all(|p| on_path(p)) {
        report.etcd = Some(etcd_scene(&mut t, &exe, &stop, &say)?);
    } else {
        say("\nThe fleet's configuration in etcd: skipped, etcd and etcdctl are not installed (scripts/setup.sh installs etcd-server and etcd-client).");
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

/// Whether `program` is an executable file in a directory of `PATH`.
fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|d| d.join(program).is_file()))
}

/// The prefix the demo's fleet follows.
const ETCD_PREFIX: &str = "/fastpath/demo";

/// Load balancer `k`'s configuration source, from its `/status`.
fn source_of(t: &Topology, k: usize) -> Result<lbd::ConfigSourceStatus> {
    t.status_of(k)?
        .config_source
        .ok_or_else(|| Error::Http(format!("lb{k}'s status names no configuration source")))
}

/// Waits until every load balancer's configuration source satisfies
/// `ok`, polling every 10 ms, at most `timeout`.
fn wait_sources(
    t: &Topology,
    what: &str,
    timeout: Duration,
    ok: impl Fn(usize, &lbd::ConfigSourceStatus) -> bool,
) -> Result<Vec<lbd::ConfigSourceStatus>> {
    let start = Instant::now();
    loop {
        let all = (1..=t.lbs.len())
            .map(|k| source_of(t, k))
            .collect::<Result<Vec<_>>>()?;
        if all.iter().enumerate().all(|(i, s)| ok(i + 1, s)) {
            return Ok(all);
        }
        if start.elapsed() > timeout {
            return Err(Error::Timeout {
                what: format!("{what}: not within {timeout:?}: {all:?}"),
                logs: (1..=t.lbs.len())
                    .map(|k| t.lb_log(k))
                    .collect::<Vec<_>>()
                    .join("\n"),
            });
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `fastpath ARGS` in the etcd members' namespace, bounded to 30 s; its
/// JSON answer.
fn fastpath_json(
    c: &crate::etcd::EtcdCluster,
    exe: &std::path::Path,
    args: &[&str],
) -> Result<serde_json::Value> {
    let o = c
        .command("timeout")
        .arg("30")
        .arg(exe)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(Error::io("running fastpath lb config"))?;
    if !o.status.success() {
        return Err(Error::Http(format!(
            "fastpath {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&o.stderr).trim()
        )));
    }
    serde_json::from_slice(&o.stdout).map_err(|e| {
        Error::Http(format!(
            "fastpath {}: not JSON ({e}): {}",
            args.join(" "),
            String::from_utf8_lossy(&o.stdout)
        ))
    })
}

/// Section 9: a three-member etcd cluster beside the fleet; the fleet's
/// part of the configuration pushed there, each load balancer restarted
/// in turn (as the rolling restart does) to follow it; then a push and an
/// invalid revision, under traffic.
fn etcd_scene(
    t: &mut Topology,
    exe: &std::path::Path,
    stop: &AtomicBool,
    say: &dyn Fn(&str),
) -> Result<EtcdScene> {
    let begun = Instant::now();
    let lbs = t.lbs.len();
    say("\nThe fleet's configuration in etcd: a three-member etcd cluster beside the fleet; the pools and VIPs move there, each load balancer keeps its own sections in a file and is restarted in turn to follow the prefix...");
    let mut c =
        crate::etcd::EtcdCluster::start(&format!("demo{}", std::process::id() % 100_000), 3)?;
    for k in 1..=lbs {
        c.connect(&t.lbs[k - 1], k)?;
    }
    let ep = c.endpoints_arg();
    // Each file cut in two: the machine's own sections (everything before
    // the first pool) and the fleet's part, which must be the same for all.
    let mut locals = Vec::new();
    let mut fleet = None;
    for k in 1..=lbs {
        let path = &t.configs[k - 1];
        let text = std::fs::read_to_string(path).map_err(Error::io(path.display()))?;
        let at = text
            .find("[[pools]]")
            .ok_or_else(|| Error::Http(format!("{}: no [[pools]] to cut at", path.display())))?;
        let (local, part) = text.split_at(at);
        match &fleet {
            None => fleet = Some(part.to_string()),
            Some(f) if f != part => {
                return Err(Error::Http(format!(
                    "{}: the fleet's part differs from load balancer 1's",
                    path.display()
                )))
            }
            Some(_) => {}
        }
        let lp = t.dir.join(format!("local{k}.toml"));
        std::fs::write(&lp, local).map_err(Error::io(lp.display()))?;
        locals.push(lp.to_string_lossy().into_owned());
    }
    let fleet = fleet.unwrap_or_default();
    let fleet_file = t.dir.join("fleet.toml");
    let ff = fleet_file.to_string_lossy().into_owned();
    let push = |text: &str| -> Result<i64> {
        std::fs::write(&fleet_file, text).map_err(Error::io(fleet_file.display()))?;
        let v = fastpath_json(
            &c,
            exe,
            &[
                "lb",
                "config",
                "push",
                &ff,
                "--etcd",
                &ep,
                "--prefix",
                ETCD_PREFIX,
                "--local",
                &locals[0],
                "--format",
                "json",
            ],
        )?;
        v["revision"]
            .as_i64()
            .ok_or_else(|| Error::Http(format!("a push answered no revision: {v}")))
    };
    let first = push(&fleet)?;
    say(&format!(
        "  pushed the fleet's part as revision {first} (fastpath lb config push --etcd ... --prefix {ETCD_PREFIX})"
    ));
    check(stop)?;

    // Each load balancer restarted on etcd, one at a time, under load.
    let all: Vec<usize> = (1..=lbs).collect();
    let load = Load::start(t);
    let mut restarts = Vec::new();
    for k in 1..=lbs {
        check(stop)?;
        let name = Topology::lb_proc(k);
        let term_s = load.at();
        if let Some(pid) = t.procs.pid(&name) {
            let _ = rustix::process::kill_process(
                rustix::process::Pid::from_raw(pid as i32).ok_or(Error::Http("pid 0".into()))?,
                rustix::process::Signal::TERM,
            );
        }
        let others: Vec<usize> = (1..=lbs).filter(|&j| j != k).collect();
        t.wait_for_ecmp(&others, Duration::from_secs(10))?;
        let withdrawn_s = load.at();
        let deadline = Instant::now() + Duration::from_secs(8);
        while t.procs.running(&name) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        t.procs.stop(&name);
        let exited_s = load.at();
        let log = t.dir.join(format!("{name}.log"));
        let fp = exe.to_string_lossy().into_owned();
        let me = format!("lb{k}");
        let mut cmd = t.lb_machine_command(
            k,
            &[
                &fp,
                "lb",
                "run",
                "--config",
                &locals[k - 1],
                "--interface",
                "l0",
                "--config-etcd",
                &ep,
                "--prefix",
                ETCD_PREFIX,
                "--name",
                &me,
                "--etcd-timeout-ms",
                "1000",
            ],
        )?;
        cmd.stdin(std::process::Stdio::null());
        crate::log_to(&mut cmd, &log)?;
        let child = cmd
            .spawn()
            .map_err(Error::io(format!("starting {me} on etcd")))?;
        t.procs.push(&name, child);
        let started_s = load.at();
        t.wait_for_ecmp(&all, Duration::from_secs(30))?;
        let back_s = load.at();
        let mut named = Vec::new();
        for j in 1..=lbs {
            named.push((format!("lb{j}"), t.status_of(j)?));
        }
        let agreement = lbd::agreement::compare(&named);
        restarts.push(EtcdRestart {
            lb: k,
            term_s,
            withdrawn_s,
            exited_s,
            started_s,
            back_s,
            tables_agree: agreement.agree,
            disagreement: if agreement.agree {
                String::new()
            } else {
                agreement.to_text()
            },
        });
    }
    wait_sources(
        t,
        "every load balancer follows the first push",
        Duration::from_secs(15),
        |_, s| s.kind == "etcd" && s.pushed_revision == Some(first),
    )?;
    std::thread::sleep(Duration::from_millis(300));
    let (restart_requests, restart_failed, restart_failures) = load.finish();
    say(&format!(
        "  all {lbs} follow {ETCD_PREFIX} at revision {first}; {restart_failed} of {restart_requests} requests failed during their restarts"
    ));
    check(stop)?;

    // A push that adds a backend to pool `web` (the one the backend change
    // removed; other pools, QUIC's, may still name it).
    let cfg = lb::config::Config::parse(
        &format!(
            "{}{fleet}",
            std::fs::read_to_string(&locals[0]).map_err(Error::io(&locals[0]))?
        ),
        "the fleet's part",
    )
    .map_err(|e| Error::Http(format!("the demo's own configuration: {e}")))?;
    let web: Vec<String> = cfg
        .pools
        .iter()
        .find(|p| p.name == "web")
        .map(|p| p.backends.iter().map(|b| b.address.to_string()).collect())
        .unwrap_or_default();
    let added = (1..=t.backends.len())
        .map(Topology::backend_address)
        .find(|a| !web.contains(a))
        .ok_or_else(|| Error::Http("every backend is in pool web already: none to add".into()))?;
    let marker = "backends = [";
    let at = fleet
        .find("name = \"web\"")
        .and_then(|w| fleet[w..].find(marker).map(|b| w + b + marker.len()))
        .ok_or_else(|| Error::Http(format!("no pool web with `{marker}` in the fleet's part")))?;
    let added_text = format!(
        "{}{{ address = \"{added}\" }}, {}",
        &fleet[..at],
        &fleet[at..]
    );
    let load = Load::start(t);
    std::thread::sleep(Duration::from_millis(200));
    let pushed_at = Instant::now();
    let pushed = push(&added_text)?;
    let mut applied_ms: Vec<Option<f64>> = vec![None; lbs];
    let timeout = Duration::from_secs(15);
    loop {
        for (i, ms) in applied_ms.iter_mut().enumerate() {
            if ms.is_none() && source_of(t, i + 1)?.pushed_revision == Some(pushed) {
                *ms = Some(pushed_at.elapsed().as_secs_f64() * 1e3);
            }
        }
        if applied_ms.iter().all(Option::is_some) {
            break;
        }
        if pushed_at.elapsed() > timeout {
            return Err(Error::Timeout {
                what: format!(
                    "revision {pushed} not applied by every load balancer within {timeout:?}: {applied_ms:?}"
                ),
                logs: (1..=lbs).map(|k| t.lb_log(k)).collect::<Vec<_>>().join("\n"),
            });
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let applied_ms: Vec<f64> = applied_ms.into_iter().flatten().collect();
    let applied: Vec<i64> = (1..=lbs)
        .map(|k| source_of(t, k).map(|s| s.pushed_revision.unwrap_or(0)))
        .collect::<Result<_>>()?;
    let agree = applied.iter().all(|&r| r == pushed);
    say(&format!(
        "  a push that adds backend {added}: revision {pushed}, applied by {} ({})",
        (1..=lbs)
            .map(|k| format!("lb{k} at {}", applied[k - 1]))
            .collect::<Vec<_>>()
            .join(", "),
        applied_ms
            .iter()
            .enumerate()
            .map(|(i, ms)| format!("lb{} after {ms:.0} ms", i + 1))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    check(stop)?;

    // An invalid revision written behind the CLI's back.
    let bad = format!(
        "[[vips]]\nname = \"http\"\naddress = \"{VIP}\"\nport = 80\nprotocol = \"tcp\"\npool = \"nowhere\"\n"
    );
    let key = format!("{ETCD_PREFIX}/config/vip/http");
    let o = c.etcdctl(&ep, &["put", &key, &bad])?;
    if !o.status.success() {
        return Err(Error::Http(format!(
            "etcdctl put {key}: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        )));
    }
    // etcdctl prints OK, not the revision: the cluster's header says it.
    let o = c.etcdctl(&ep, &["get", &key, "-w", "json"])?;
    let invalid = serde_json::from_slice::<serde_json::Value>(&o.stdout)
        .ok()
        .and_then(|v| v["header"]["revision"].as_i64())
        .unwrap_or(0);
    let sources = wait_sources(
        t,
        "every load balancer refuses the invalid revision",
        Duration::from_secs(15),
        |_, s| {
            s.refused_revision.is_some_and(|r| r > pushed)
                && s.refused_error
                    .as_deref()
                    .is_some_and(|e| e.contains("nowhere"))
        },
    )?;
    // Traffic a little longer: the running tables keep serving.
    std::thread::sleep(Duration::from_millis(500));
    let (requests, failed, failures) = load.finish();
    let refused: Vec<String> = sources
        .iter()
        .map(|s| s.refused_error.clone().unwrap_or_default())
        .collect();
    let refused_by_all = sources
        .iter()
        .all(|s| s.refused_error.is_some() && s.pushed_revision == Some(pushed));
    say(&format!(
        "  VIP http naming pool \"nowhere\" written with etcdctl (revision {invalid}): refused by {} of {lbs}, each still running revision {pushed}:\n    lb1: {}\n  {failed} of {requests} requests failed from the push to the refusal",
        refused.iter().filter(|r| !r.is_empty()).count(),
        refused.first().map(String::as_str).unwrap_or("")
    ));
    Ok(EtcdScene {
        prefix: ETCD_PREFIX.to_string(),
        first_revision: first,
        restart_requests,
        restart_failed_requests: restart_failed,
        restart_failures,
        restarts,
        added_backend: added,
        pushed_revision: pushed,
        applied,
        applied_ms,
        agree,
        invalid_revision: invalid,
        refused,
        refused_by_all,
        requests,
        failed_requests: failed,
        failures,
        seconds: begun.elapsed().as_secs_f64(),
    })
}
