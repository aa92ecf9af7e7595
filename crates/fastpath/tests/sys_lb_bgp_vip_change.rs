//! A change to the VIP set touches only the VIPs that changed.
//!
//! Two load balancers announce the IPv4 VIP and the IPv6 VIP to a BIRD
//! router (the dual-stack namespace fleet). While a thread polls the
//! router's kernel route to the IPv4 VIP every 5 ms, each load balancer is
//! reloaded with a configuration that (1) moves the IPv6 VIP to another
//! address, (2) adds a second IPv4 VIP, (3) removes it again. Every change
//! makes fastpath rewrite a routes file and run `birdc configure`; the
//! unchanged IPv4 VIP must keep both load balancers in its ECMP route at
//! every sample (0 ms out), and the router's kernel must report no change
//! to that route at all (`ip monitor route`, which sees what a poll
//! between two samples would miss).

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use lab::topology::{Topology, VIP, VIP6};

/// The IPv6 VIP's new address, and the IPv4 VIP added and removed.
const VIP6_MOVED: &str = "fd00:18::81";
const VIP_ADDED: &str = "198.18.0.81";

/// The load balancers the router's route to `prefix` leads to now.
fn ecmp_of(t: &Topology, v6: bool, prefix: &str) -> Vec<usize> {
    let fam = if v6 { "-6" } else { "-4" };
    let route = t
        .router
        .ip(&[fam, "route", "show", prefix])
        .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
        .unwrap_or_default();
    (1..=t.lb_count())
        .filter(|&k| {
            let via = if v6 {
                Topology::lb_address6(k)
            } else {
                Topology::lb_address(k)
            };
            route.contains(&format!("via {via} "))
        })
        .collect()
}

fn wait_route(t: &Topology, v6: bool, prefix: &str, want: &[usize], what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while ecmp_of(t, v6, prefix) != want {
        assert!(
            Instant::now() < deadline,
            "{what}: the router's route to {prefix} leads to {:?}, not {want:?}; lb1: {}",
            ecmp_of(t, v6, prefix),
            t.api_on(1, "GET", "/status").unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Rewrites every load balancer's configuration with `edit` and reloads it.
fn reload_all(t: &Topology, edit: &dyn Fn(&str) -> String) {
    for k in 1..=t.lb_count() {
        let path = &t.configs[k - 1];
        let text = std::fs::read_to_string(path).unwrap();
        let new = edit(&text);
        assert_ne!(text, new, "the edit changed nothing");
        std::fs::write(path, new).unwrap();
        let answer = t.api_on(k, "POST", "/reload").unwrap();
        assert!(
            answer.contains("generation") && !answer.contains("error"),
            "lb{k} reload: {answer}"
        );
    }
}

/// One sample of the poller: when, and which load balancers the route to
/// the IPv4 VIP led to.
type Sample = (Instant, Vec<usize>);

/// Each load balancer's longest stretch out of the IPv4 VIP's route
/// (from the first sample without it to the next sample with it, or the
/// end), and how many stretches.
fn outages(samples: &[Sample], lbs: usize) -> Vec<(Duration, usize)> {
    (1..=lbs)
        .map(|k| {
            let (mut longest, mut count, mut out_since) = (Duration::ZERO, 0, None);
            for (at, set) in samples {
                match (set.contains(&k), out_since) {
                    (false, None) => {
                        out_since = Some(*at);
                        count += 1;
                    }
                    (true, Some(since)) => {
                        longest = longest.max(at.duration_since(since));
                        out_since = None;
                    }
                    _ => {}
                }
            }
            if let (Some(since), Some((end, _))) = (out_since, samples.last()) {
                longest = longest.max(end.duration_since(since).max(Duration::from_millis(1)));
            }
            (longest, count)
        })
        .collect()
}

#[test]
fn outages_are_measured_between_samples() {
    let t0 = Instant::now();
    let at = |ms| t0 + Duration::from_millis(ms);
    let s = vec![
        (at(0), vec![1, 2]),
        (at(5), vec![2]),
        (at(10), vec![2]),
        (at(15), vec![1, 2]),
        (at(20), vec![1]),
    ];
    assert_eq!(
        outages(&s, 2),
        [
            (Duration::from_millis(10), 1),
            (Duration::from_millis(1), 1)
        ]
    );
    assert_eq!(outages(&s[..1], 2), [(Duration::ZERO, 0); 2]);
}

#[test]
#[ignore = "system test: root, namespaces, BIRD, nginx"]
fn a_vip_set_change_leaves_an_unchanged_vip_in_ecmp() {
    systest::require_netns();
    systest::require_programs(&["bird", "birdc", "nginx"]);
    let tag = format!("x{}", std::process::id() % 100_000);
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_fastpath"));
    let mut t = match Topology::build_dual_stack(bin, 2, 2, &tag) {
        Ok(t) => t,
        Err(lab::Error::Unavailable) => systest::missing("root and iproute2 (network namespaces)"),
        Err(e) => panic!("{e}"),
    };
    t.start_lbs().unwrap();
    t.wait_for_ecmp(&[1, 2], Duration::from_secs(40)).unwrap();
    wait_route(&t, true, &format!("{VIP6}/128"), &[1, 2], "start");
    // Settled: both say announced, as BIRD does.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !(1..=2).all(|k| {
        t.status_of(k)
            .ok()
            .and_then(|s| s.bgp)
            .is_some_and(|b| b.announced && b.mismatch.is_none())
    }) {
        assert!(Instant::now() < deadline, "not settled");
        std::thread::sleep(Duration::from_millis(50));
    }
    let repairs_before: Vec<u64> = (1..=2)
        .map(|k| t.status_of(k).unwrap().bgp.unwrap().repairs)
        .collect();

    // Every change to the router's routes, as its kernel reports them.
    let mut monitor = std::process::Command::new("ip")
        .args(["-n", t.router.name(), "monitor", "route"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stop = AtomicBool::new(false);
    let v4 = format!("{VIP}/32");
    let samples = std::thread::scope(|scope| {
        let poller = scope.spawn(|| {
            let mut samples: Vec<Sample> = Vec::new();
            let mut next = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                let set = ecmp_of(&t, false, &v4);
                samples.push((Instant::now(), set));
                next += Duration::from_millis(5);
                let now = Instant::now();
                if next > now {
                    std::thread::sleep(next - now);
                } else {
                    next = now;
                }
            }
            samples
        });
        // Let the poller see the settled route first.
        std::thread::sleep(Duration::from_millis(300));
        // 1. Only the IPv6 VIP changes.
        reload_all(&t, &|c| {
            c.replace(
                &format!("address = \"{VIP6}\""),
                &format!("address = \"{VIP6_MOVED}\""),
            )
        });
        wait_route(
            &t,
            true,
            &format!("{VIP6_MOVED}/128"),
            &[1, 2],
            "IPv6 VIP moved",
        );
        wait_route(&t, true, &format!("{VIP6}/128"), &[], "old IPv6 VIP");
        // 2. Another IPv4 VIP is added.
        let added = format!(
            "\n[[vips]]\nname = \"http-b\"\naddress = \"{VIP_ADDED}\"\nport = 80\nprotocol = \"tcp\"\npool = \"web\"\n"
        );
        reload_all(&t, &|c| format!("{c}{added}"));
        wait_route(
            &t,
            false,
            &format!("{VIP_ADDED}/32"),
            &[1, 2],
            "IPv4 VIP added",
        );
        // 3. And removed.
        reload_all(&t, &|c| c.replace(&added, ""));
        wait_route(
            &t,
            false,
            &format!("{VIP_ADDED}/32"),
            &[],
            "IPv4 VIP removed",
        );
        // A restart a poll late would still be seen.
        std::thread::sleep(Duration::from_millis(1000));
        stop.store(true, Ordering::Relaxed);
        poller.join().unwrap()
    });

    let _ = monitor.kill();
    let events = String::from_utf8_lossy(&monitor.wait_with_output().unwrap().stdout).to_string();
    // The route's first line: `198.18.0.80 proto bird ...`, or `Deleted
    // 198.18.0.80 ...`.
    let touched: Vec<&str> = events
        .lines()
        .filter(|l| {
            l.trim_start_matches("Deleted ")
                .strip_prefix(VIP)
                .is_some_and(|r| r.starts_with(' '))
        })
        .collect();
    let span = samples
        .last()
        .unwrap()
        .0
        .duration_since(samples.first().unwrap().0);
    let widest = samples
        .windows(2)
        .map(|w| w[1].0.duration_since(w[0].0))
        .max()
        .unwrap_or_default();
    let out = outages(&samples, 2);
    eprintln!(
        "{} samples over {span:?} (every {:?} on average, widest gap {widest:?}); per load balancer (longest out of the IPv4 VIP's route, times out): {out:?}",
        samples.len(),
        span / samples.len().max(1) as u32
    );
    // The poll was fine enough to see a restart of tens of milliseconds.
    assert!(
        span / samples.len().max(1) as u32 <= Duration::from_millis(20),
        "polled too coarsely: {} samples over {span:?}",
        samples.len()
    );
    eprintln!(
        "the router's kernel changed the IPv4 VIP's route {} times: {touched:?}",
        touched.len()
    );
    // The monitor saw the other changes (it ran): the moved IPv6 VIP.
    assert!(
        events.contains(VIP6_MOVED),
        "ip monitor route saw: {events}"
    );
    for (i, (longest, count)) in out.iter().enumerate() {
        assert_eq!(
            *count,
            0,
            "lb{} left the unchanged IPv4 VIP's route {count} times (longest {longest:?}) on VIP-set changes",
            i + 1
        );
    }
    assert!(
        touched.is_empty(),
        "the router changed the unchanged IPv4 VIP's route: {touched:?}"
    );
    // What fastpath says agrees, and it did not have to put BIRD back.
    for k in 1..=2 {
        // Read in the background: wait for a reading after the last change.
        let b = t
            .wait_status(k, Duration::from_secs(10), |s| {
                s.bgp
                    .as_ref()
                    .is_some_and(|b| b.announced && b.mismatch.is_none())
            })
            .unwrap_or_else(|e| panic!("lb{k}: {e}"))
            .bgp
            .unwrap();
        assert_eq!(b.repairs, repairs_before[k - 1], "lb{k}: {b:?}");
    }
    t.procs.stop_all();
}
