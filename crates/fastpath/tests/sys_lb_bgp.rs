//! The announcement is the truth, and it follows forwarding:
//!
//! - `birdc configure` on every load balancer's BIRD under load resets
//!   nothing (the routes file fastpath writes states the protocol's
//!   wanted state, so BIRD keeps it up): the router's route keeps both
//!   load balancers at every sample, no request waits, fastpath has
//!   nothing to put back, and `/status` never says "announced" while BIRD
//!   says the protocol is down or the router has no route to that load
//!   balancer. `/status` shows the BGP task's last reading of
//!   BIRD with its age (it never waits for BIRD), so each sample waits
//!   for a status whose reading is younger than the moment BIRD and the
//!   router were looked at, and looks again after it: a status read
//!   between two looks that both saw "down" is a lie.
//! - An IPv6 VIP is announced over BIRD's ipv6 channel by two load
//!   balancers: the router's route has two IPv6 next hops, and HTTP over
//!   IPv6 from many source ports goes through both.
//! - `check-config` says which VIPs `[bgp]` will not announce.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use lab::topology::{HttpConn, Topology, VIP6};

/// Whether BIRD `which` has protocol `name` up.
fn bird_up(t: &Topology, which: &str, name: &str) -> bool {
    t.birdc(which, &["show", "protocols", name])
        .lines()
        .any(|l| {
            l.split_whitespace().next() == Some(name) && l.split_whitespace().nth(3) == Some("up")
        })
}

fn announced(t: &Topology, k: usize) -> Option<bool> {
    t.status_of(k).ok().and_then(|s| s.bgp_announced)
}

/// Load balancer `k`'s "announced" from a status whose reading of BIRD
/// began after `since` (waited for, up to 2 s: the BGP task reads BIRD at
/// every 200 ms poll); `Err` says why there was none.
fn announced_since(t: &Topology, k: usize, since: Instant) -> Result<Option<bool>, String> {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let sent = Instant::now();
        let s = t.status_of(k).map_err(|e| e.to_string())?;
        let Some(b) = &s.bgp else {
            return Err("no bgp in /status".into());
        };
        // read_ms_ago is whole milliseconds, rounded down.
        if Duration::from_millis(b.read_ms_ago + 1) <= sent.duration_since(since) {
            return Ok(s.bgp_announced);
        }
        if Instant::now() > deadline {
            return Err(format!(
                "lb{k}: no reading of BIRD younger than 2 s (the last is {} ms old)",
                b.read_ms_ago
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
#[ignore = "system test: root, namespaces, BIRD, nginx"]
fn check_config_says_which_vips_bgp_will_not_announce() {
    let dir = std::env::temp_dir().join(format!("fastpath-bgp-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = |protocol6: &str| {
        format!(
            r#"[encap]
source = "10.0.0.1"
[bgp]
vips_file = "/run/fastpath/vips.conf"
{protocol6}
[[pools]]
name = "web"
backends = [{{ address = "10.1.0.1" }}]
[[vips]]
name = "http"
address = "198.18.0.80"
port = 80
protocol = "tcp"
pool = "web"
[[vips]]
name = "http6"
address = "fd00:18::80"
port = 80
protocol = "tcp"
pool = "web"
"#
        )
    };
    let path = dir.join("lb.toml");
    std::fs::write(&path, config("")).unwrap();
    let out = common::fastpath()
        .args(["lb", "check-config"])
        .arg(&path)
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("warning"), "{stderr}");
    assert!(
        stdout.contains("ipv6 in BIRD protocol fastpath_vips6 from /run/fastpath/vips6.conf"),
        "{stdout}"
    );
    // A BIRD without IPv6: valid, and said.
    std::fs::write(&path, config("protocol6 = \"\"")).unwrap();
    let out = common::fastpath()
        .args(["lb", "check-config", "--format", "json"])
        .arg(&path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("warning: IPv6 VIPs http6 are not announced"),
        "{stderr}"
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["warnings"].as_array().unwrap().len(), 1, "{v}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// One round: `birdc configure` on both load balancers' BIRD while a
/// client opens connection after connection and the status, BIRD and the
/// router are sampled. How long until the router led to both again and
/// until a request was answered again (zero: never seen gone, no request
/// waited); lies found.
struct Round {
    route_back: Duration,
    answered_again: Duration,
    lies: Vec<String>,
    samples: usize,
    not_announced_seen: bool,
    bird_down_seen: bool,
}

fn round(t: &Topology) -> Round {
    use std::sync::atomic::{AtomicBool, Ordering};
    let stop = AtomicBool::new(false);
    let started = Instant::now();
    let mut configured_at: Option<Instant> = None;
    let mut lies = Vec::new();
    let mut samples = 0;
    let mut not_announced_seen = false;
    let mut bird_down_seen = false;
    let (mut gone, mut route_back) = (false, None);
    let answers = std::thread::scope(|scope| {
        // Requests from inside the client's namespace, each on a new
        // connection, until told to stop: when each was answered.
        let load = scope.spawn(|| {
            t.client.enter().unwrap();
            let mut ok_at = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                if HttpConn::connect().and_then(|mut c| c.get()).is_ok() {
                    ok_at.push(Instant::now());
                } else {
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
            ok_at
        });
        while started.elapsed() < Duration::from_secs(6) {
            if configured_at.is_none() && started.elapsed() > Duration::from_millis(700) {
                for k in 1..=2 {
                    let out = t.birdc(&Topology::bird_of(k), &["configure"]);
                    assert!(out.contains("Reconfigur"), "birdc configure: {out}");
                }
                configured_at = Some(Instant::now());
            }
            let up = |k: usize| bird_up(t, &Topology::bird_of(k), "fastpath_vips");
            let bird_before: Vec<bool> = (1..=2).map(up).collect();
            let route_before = t.ecmp_set();
            let looked = Instant::now();
            let status: Vec<Option<bool>> = (1..=2)
                .map(|k| {
                    announced_since(t, k, looked).unwrap_or_else(|e| {
                        lies.push(e);
                        None
                    })
                })
                .collect();
            let bird_after: Vec<bool> = (1..=2).map(up).collect();
            // The router installs what BIRD exports within milliseconds.
            std::thread::sleep(Duration::from_millis(20));
            let route_after = t.ecmp_set();
            samples += 1;
            bird_down_seen |=
                configured_at.is_some() && bird_before.iter().chain(&bird_after).any(|up| !up);
            for k in 1..=2 {
                let i = k - 1;
                not_announced_seen |= status[i] == Some(false);
                if status[i] != Some(true) {
                    continue;
                }
                if !bird_before[i] && !bird_after[i] {
                    lies.push(format!(
                        "lb{k} said announced while its BIRD had fastpath_vips down ({:?} after start)",
                        started.elapsed()
                    ));
                }
                if !route_before.contains(&k) && !route_after.contains(&k) {
                    lies.push(format!(
                        "lb{k} said announced while the router had no route to it ({:?} after start)",
                        started.elapsed()
                    ));
                }
            }
            if let Some(at) = configured_at {
                if route_after != [1, 2] {
                    gone = true;
                } else if gone && route_back.is_none() {
                    route_back = Some(at.elapsed());
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        stop.store(true, Ordering::Relaxed);
        load.join().unwrap()
    });
    let at = configured_at.unwrap();
    // The first answer after a gap of more than 100 ms that began after
    // the configure (none: no request noticed the repair).
    let mut answered_again = Duration::ZERO;
    let mut prev = at;
    for a in answers.into_iter().filter(|&a| a > at) {
        if a.duration_since(prev) > Duration::from_millis(100) {
            answered_again = a.duration_since(at);
            break;
        }
        prev = a;
    }
    Round {
        // Never seen gone: put back before a sample saw it.
        route_back: route_back.unwrap_or(if gone { Duration::MAX } else { Duration::ZERO }),
        answered_again,
        lies,
        samples,
        not_announced_seen,
        bird_down_seen,
    }
}

#[test]
#[ignore = "system test: root, namespaces, BIRD, nginx"]
fn birdc_configure_under_load_resets_nothing_and_is_never_reported_announced_falsely() {
    let mut t = common::topology(2, 2, "g");
    t.start_lbs().unwrap();
    t.wait_for_ecmp(&[1, 2], Duration::from_secs(40)).unwrap();
    t.wait_for_vip(Duration::from_secs(20)).unwrap();
    let mut figures = Vec::new();
    for r in 1..=3 {
        // Settled: both announced, as BIRD says.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !(announced(&t, 1) == Some(true)
            && announced(&t, 2) == Some(true)
            && t.ecmp_set() == [1, 2])
        {
            assert!(
                Instant::now() < deadline,
                "not announced again: {}",
                t.api_on(1, "GET", "/status").unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let x = round(&t);
        eprintln!(
            "round {r}: router led to both again after {:?}, a request answered again after {:?} ({} samples; not announced seen: {}; BIRD's protocol down seen: {})",
            x.route_back, x.answered_again, x.samples, x.not_announced_seen, x.bird_down_seen
        );
        assert!(x.lies.is_empty(), "{:#?}", x.lies);
        // Nothing was reset: the protocol stayed up and the router kept
        // both (requests may still pause on a loaded machine: bounded).
        assert!(!x.bird_down_seen, "round {r}: BIRD took fastpath_vips down");
        assert_eq!(
            x.route_back,
            Duration::ZERO,
            "round {r}: the router lost a load balancer"
        );
        assert!(
            x.answered_again <= Duration::from_secs(2),
            "answered again after {:?}",
            x.answered_again
        );
        figures.push((x.route_back, x.answered_again));
    }
    // Neither had anything to put back, and both say they announce.
    for k in 1..=2 {
        let s = t
            .wait_status(k, Duration::from_secs(10), |s| {
                s.bgp
                    .as_ref()
                    .is_some_and(|b| b.mismatch.is_none() && b.announced && b.wanted)
            })
            .unwrap_or_else(|e| panic!("lb{k}: {e}"));
        let b = s.bgp.as_ref().unwrap();
        assert_eq!(b.repairs, 0, "lb{k}: {b:?}");
        let metrics = t.api_on(k, "GET", "/metrics").unwrap();
        assert!(metrics.contains("fastpath_lb_bgp_mismatch 0"), "{metrics}");
        assert!(
            metrics.contains("fastpath_lb_bgp_routes{family=\"ipv4\",of=\"exported\"} 1"),
            "{metrics}"
        );
        // Compared route by route: none of the wanted VIPs missing.
        assert!(
            metrics.contains("fastpath_lb_bgp_routes{family=\"ipv4\",of=\"missing\"} 0"),
            "{metrics}"
        );
        assert!(
            b.families
                .iter()
                .all(|f| f.missing.is_empty() && f.unwanted.is_empty()),
            "lb{k}: {b:?}"
        );
    }
    eprintln!("restore after birdc configure (route back, answered again): {figures:?}");
}

#[test]
#[ignore = "system test: root, namespaces, BIRD, nginx"]
fn an_ipv6_vip_is_announced_and_served_by_two_load_balancers() {
    let tag = format!("v{}", std::process::id() % 100_000);
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_fastpath"));
    let mut t = match Topology::build_dual_stack(bin, 2, 2, &tag) {
        Ok(t) => t,
        Err(lab::Error::Unavailable) => systest::missing("root and iproute2 (network namespaces)"),
        Err(e) => panic!("{e}"),
    };
    t.start_lbs().unwrap();
    t.wait_for_ecmp(&[1, 2], Duration::from_secs(40)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while t.ecmp_set6() != [1, 2] {
        assert!(
            Instant::now() < deadline,
            "the router's IPv6 route: {:?}; router's BIRD: {}; lb1: {}",
            t.router_route6(),
            t.birdc("rtr", &["show", "route", "for", VIP6, "all"]),
            t.api_on(1, "GET", "/status").unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let route = t.router_route6();
    assert_eq!(route.matches("nexthop via").count(), 2, "{route}");
    // Each load balancer reads BIRD in the background: its status says
    // announced at its next reading after the router saw both (bounded).
    for k in 1..=2 {
        let settled = |s: &lbd::status::Status| {
            s.bgp.as_ref().is_some_and(|b| {
                b.mismatch.is_none()
                    && b.families.iter().any(|f| {
                        f.family.channel() == "ipv6"
                            && f.announced
                            && f.routes == 1
                            && f.exported == 1
                            && f.missing.is_empty()
                    })
            })
        };
        if let Err(e) = t.wait_status(k, Duration::from_secs(10), settled) {
            panic!("lb{k}: {e}");
        }
    }
    // HTTP over IPv6, each request a new connection from a new source
    // port: every one answered, through both load balancers.
    let addr: SocketAddr = format!("[{VIP6}]:80").parse().unwrap();
    let by = Topology::inside(&t.client, move || {
        let mut by = std::collections::BTreeMap::new();
        for _ in 0..40 {
            let body = HttpConn::connect_to(addr)
                .and_then(|mut c| c.get())
                .unwrap_or_default();
            *by.entry(body).or_insert(0) += 1;
        }
        by
    })
    .unwrap();
    assert_eq!(by.get(""), None, "every request answered: {by:?}");
    assert_eq!(by.len(), 2, "both backends: {by:?}");
    for k in 1..=2 {
        let s = t.status_of(k).unwrap();
        let v = s.vips.iter().find(|v| v.name == "http6").unwrap();
        assert!(
            v.packets > 0,
            "lb{k} forwarded none of the IPv6 flows: {v:?}"
        );
    }
    // Withdrawn with the forwarder: lb2 stops, the IPv6 route keeps lb1.
    t.procs.stop("lb2");
    let deadline = Instant::now() + Duration::from_secs(10);
    while t.ecmp_set6() != [1] {
        assert!(Instant::now() < deadline, "{}", t.router_route6());
        std::thread::sleep(Duration::from_millis(50));
    }
}
