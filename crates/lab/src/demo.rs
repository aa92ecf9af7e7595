//! `fastpath lb demo`: the load balancer in a throwaway network, shown to a
//! person. Everything it creates is removed at the end, also on Ctrl-C.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::topology::{HttpConn, Topology, VIP};
use measure::Table;

use crate::{Error, Result};

fn share_table(title: &str, by: &BTreeMap<String, usize>, backends: usize) -> String {
    let total: usize = by.values().sum();
    let mut t = Table::new(["backend", "requests", "share"]).title(title);
    for i in 1..=backends {
        let n = by.get(&format!("backend-{i}")).copied().unwrap_or(0);
        t.row([
            format!("backend-{i} (10.10.{}.2)", 2 + i),
            n.to_string(),
            format!("{:.1}%", 100.0 * n as f64 / total.max(1) as f64),
        ]);
    }
    if let Some(&failed) = by.get("") {
        t.row([
            "failed".to_string(),
            failed.to_string(),
            format!("{:.1}%", 100.0 * failed as f64 / total.max(1) as f64),
        ]);
    }
    t.to_string()
}

fn check(stop: &AtomicBool) -> Result<()> {
    if stop.load(Ordering::Relaxed) {
        return Err(Error::Interrupted);
    }
    Ok(())
}

/// Runs the demo with `backends` nginx backends and `requests` requests per
/// round.
pub fn run(backends: usize, requests: usize, stop: Arc<AtomicBool>) -> Result<()> {
    let exe = std::env::current_exe().map_err(Error::io("finding our own binary"))?;
    println!("Building the topology: client, router (BIRD), load balancer (fastpath + BIRD), {backends} nginx backends (fastpath lb decap)...");
    let mut t = Topology::build(
        &exe,
        backends,
        &format!("demo{}", std::process::id() % 100_000),
    )?;
    println!(
        "\n  client 10.10.1.2 -> router 10.10.1.1 --BGP learns {VIP}--> load balancer 10.10.2.2 (AF_XDP, else AF_PACKET; GRE)\n  \
         -> backends 10.10.3.2 .. 10.10.{}.2 (VIP on lo, GRE decapsulated into TUN) -> straight back to the client\n",
        2 + backends
    );
    check(&stop)?;
    t.start_lb()?;
    let started = Instant::now();
    t.wait_for_vip(Duration::from_secs(30))?;
    println!(
        "The router learned the VIP over BGP and the first request went through after {:.1} s:",
        started.elapsed().as_secs_f64()
    );
    println!("  router: {}", t.router_route().trim());
    check(&stop)?;

    // Long-lived connections, one per backend, kept open across the failover.
    let mut conns: Vec<(String, HttpConn)> = Vec::new();
    for _ in 0..10 * backends {
        if conns.len() == backends {
            break;
        }
        let mut c = Topology::inside(&t.client, HttpConn::connect)??;
        let who = c.get()?;
        if !conns.iter().any(|(w, _)| *w == who) {
            conns.push((who, c));
        }
    }
    println!(
        "Opened {} long-lived connections (HTTP keep-alive), one per backend.\n",
        conns.len()
    );

    let before = t.requests(requests)?;
    println!(
        "{}",
        share_table(
            &format!("{requests} requests through {VIP}, each a new connection (Maglev hashing):"),
            &before,
            backends
        )
    );
    check(&stop)?;

    println!("Stopping nginx on backend-1; the load balancer's health check (HTTP, 200 ms, fall 2) takes it out...");
    t.procs.stop("nginx1");
    let stopped = Instant::now();
    let deadline = stopped + Duration::from_secs(10);
    let down = "fastpath_lb_backend_healthy{backend=\"10.10.3.2\",address=\"10.10.3.2\"} 0";
    while !t.api("GET", "/metrics").unwrap_or_default().contains(down) {
        if Instant::now() > deadline {
            return Err(Error::Timeout {
                what: "backend-1 was not marked down within 10 s".into(),
                logs: String::new(),
            });
        }
        check(&stop)?;
        std::thread::sleep(Duration::from_millis(100));
    }
    println!(
        "backend-1 marked down {:.1} s after its nginx stopped.\n",
        stopped.elapsed().as_secs_f64()
    );
    let after = t.requests(requests)?;
    println!(
        "{}",
        share_table(
            &format!("{requests} new requests after the failover:"),
            &after,
            backends
        )
    );

    let mut kept = Table::new(["long-lived connection to", "after the failover"]);
    for (who, c) in conns.iter_mut() {
        let verdict = match c.get() {
            Ok(now) if now == *who => format!("still answered by {now}"),
            Ok(now) => format!("MOVED to {now}"),
            Err(e) if who == "backend-1" => format!("closed ({e}): its nginx was stopped"),
            Err(e) => format!("FAILED: {e}"),
        };
        kept.row([who.clone(), verdict]);
    }
    println!("{kept}");
    println!("Load balancer status (fastpath lb status):");
    if let Ok(body) = t.api("GET", "/status") {
        if let Ok(s) = serde_json::from_str::<lbd::daemon::Status>(&body) {
            println!("{}", s.to_text());
        }
    }
    println!("Stopping the load balancer: it withdraws the VIP from BGP...");
    t.procs.stop("lb");
    let deadline = Instant::now() + Duration::from_secs(10);
    while t.router_route().contains("10.10.2.2") && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    println!(
        "  router's route to {VIP}: {}",
        if t.router_route().trim().is_empty() {
            "gone".to_string()
        } else {
            t.router_route()
        }
    );
    println!("\nRemoving the namespaces and processes.");
    Ok(())
}
