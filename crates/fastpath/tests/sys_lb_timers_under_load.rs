//! A measurement, not a test of `make test` (its name starts with
//! `by_hand_`; `make soak` runs it): how often the shipped timers take a
//! load balancer out of the router's route when nothing is wrong with it,
//! on a host kept at a load of at least twice its cores.
//!
//! The demo's topology (tests/common, `lab::topology`): one load balancer
//! announcing its VIP through its BIRD to the router's BIRD with the
//! shipped BFD (100 ms x 3) and BGP timers, two nginx backends. The
//! daemon runs as its unit runs it, with systemd's watchdog asked for
//! (`NOTIFY_SOCKET`, `WATCHDOG_USEC` = the unit's 400 ms): this test is
//! the notification socket and records every `WATCHDOG=1`, so that a gap
//! over 400 ms is a kill systemd would have made. Busy loops, twice as
//! many as cores, run in the same session as the daemon and both BIRDs
//! (sharing their scheduling group, as a loaded host's processes do).
//! Every 10 ms the router's kernel route is read: each time the load
//! balancer leaves it is a false withdrawal. The poll waits for a CPU too:
//! its slowest, and the time spent between polls more than 0.5 s apart
//! (where a withdrawal, a second or more, could go unseen), are printed.
//!
//! Printed: false withdrawals (count, longest, total time out), watchdog
//! gaps (longest, over 300 ms, over 400 ms), the load reached. Written as
//! JSON to `$FASTPATH_TIMERS_JSON` when set. Runs `$SOAK_SECONDS` (600 by
//! default) with the daemon `$FASTPATH_BIN` (the test build's by default;
//! `make soak` gives the release build). It fails only if the set-up did
//! not hold: the VIP never announced, or the load below twice the cores.

mod common;

use std::os::unix::net::UnixDatagram;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The shipped unit's WatchdogSec.
const WATCHDOG: Duration = Duration::from_millis(400);

/// Busy loops, killed (by PID) when dropped.
struct Spinners(Vec<Child>);

impl Drop for Spinners {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The 1-minute load average (the benches' reader; NaN, reported as
/// null, when it cannot be read).
fn loadavg() -> f64 {
    bench::maio::loadavg()[0]
}

#[test]
#[ignore = "system test: root, namespaces, BIRD, nginx; a 10-minute measurement"]
fn by_hand_false_withdrawals_with_the_shipped_timers_under_load() {
    let _one = systest::exclusive();
    let seconds: u64 = std::env::var("SOAK_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(600);
    let bin =
        std::env::var("FASTPATH_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_fastpath").into());
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut t = common::topology(1, 2, "tl");

    // The notification socket, where the daemon's WATCHDOG=1 arrive.
    let sock_path = t.dir.join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let pings: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let done = Arc::new(AtomicBool::new(false));
    let listener = {
        let (pings, done) = (Arc::clone(&pings), Arc::clone(&done));
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while !done.load(Ordering::Relaxed) {
                if let Ok(n) = sock.recv(&mut buf) {
                    if String::from_utf8_lossy(&buf[..n])
                        .lines()
                        .any(|l| l == "WATCHDOG=1")
                    {
                        pings.lock().unwrap().push(Instant::now());
                    }
                }
            }
        })
    };

    let log = t.dir.join("lb-timers.log");
    let file = std::fs::File::create(&log).unwrap();
    let err = file.try_clone().unwrap();
    let config = t.config.to_string_lossy().into_owned();
    let child = t
        .lb_machine_command(
            1,
            &[&bin, "lb", "run", "--config", &config, "--interface", "l0"],
        )
        .unwrap()
        .env("NOTIFY_SOCKET", &sock_path)
        .env("WATCHDOG_USEC", WATCHDOG.as_micros().to_string())
        .env_remove("WATCHDOG_PID")
        .stdin(Stdio::null())
        .stdout(file)
        .stderr(err)
        .spawn()
        .unwrap();
    t.procs.push("lb", child);
    if let Err(e) = t.wait_for_vip(Duration::from_secs(60)) {
        panic!("{e}\n{}", std::fs::read_to_string(&log).unwrap_or_default());
    }
    t.wait_for_ecmp(&[1], Duration::from_secs(30)).unwrap();

    // The load: busy loops in this session, twice the cores.
    let spinners = Spinners(
        (0..2 * cores)
            .map(|_| {
                Command::new("sh")
                    .args(["-c", "while :; do :; done"])
                    .stdin(Stdio::null())
                    .spawn()
                    .unwrap()
            })
            .collect(),
    );
    let start = Instant::now();
    let first_ping = pings.lock().unwrap().len();
    let (mut withdrawals, mut out_total, mut out_longest) = (0u32, Duration::ZERO, Duration::ZERO);
    let (mut polls, mut slowest_poll) = (0u64, Duration::ZERO);
    // Time between polls more than BLIND apart: a withdrawal there, which
    // lasts a second or more (BGP comes back after its connect delay), could
    // have gone unseen.
    const BLIND: Duration = Duration::from_millis(500);
    let (mut blind, mut last_poll) = (Duration::ZERO, Instant::now());
    let mut out_since: Option<Instant> = None;
    let mut peak_load: f64 = 0.0;
    while start.elapsed() < Duration::from_secs(seconds) {
        let asked = Instant::now();
        if asked - last_poll > BLIND {
            blind += asked - last_poll;
        }
        last_poll = asked;
        let routed = t.ecmp_set() == [1];
        slowest_poll = slowest_poll.max(asked.elapsed());
        polls += 1;
        match (routed, out_since) {
            (false, None) => {
                withdrawals += 1;
                out_since = Some(asked);
            }
            (true, Some(since)) => {
                let d = asked - since;
                out_total += d;
                out_longest = out_longest.max(d);
                out_since = None;
            }
            _ => {}
        }
        peak_load = peak_load.max(loadavg());
        std::thread::sleep(Duration::from_millis(10));
    }
    if let Some(since) = out_since {
        let d = since.elapsed();
        out_total += d;
        out_longest = out_longest.max(d);
    }
    let load_at_end = loadavg();
    drop(spinners);
    done.store(true, Ordering::Relaxed);
    let _ = listener.join();

    let pings = pings.lock().unwrap();
    let during = &pings[first_ping.saturating_sub(1)..];
    let gaps: Vec<Duration> = during.windows(2).map(|w| w[1] - w[0]).collect();
    let longest_gap = gaps.iter().max().copied().unwrap_or(Duration::MAX);
    let near = gaps
        .iter()
        .filter(|g| **g > WATCHDOG - Duration::from_millis(100))
        .count();
    let missed = gaps.iter().filter(|g| **g > WATCHDOG).count();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let report = serde_json::json!({
        "seconds": seconds,
        "cores": cores,
        "spinners": 2 * cores,
        "load_1min_peak": peak_load,
        "load_1min_at_end": load_at_end,
        "timers": { "bfd": "100 ms x 3", "watchdog_ms": ms(WATCHDOG) },
        "false_withdrawals": withdrawals,
        "time_out_of_route_ms": ms(out_total),
        "longest_out_of_route_ms": ms(out_longest),
        "route_polls": polls,
        "slowest_route_poll_ms": ms(slowest_poll),
        "time_between_polls_over_500ms_ms": ms(blind),
        "watchdog_pings": gaps.len(),
        "longest_watchdog_gap_ms": ms(longest_gap),
        "watchdog_gaps_within_100ms_of_firing": near,
        "watchdog_gaps_over_the_deadline": missed,
    });
    eprintln!("shipped timers under load: {report:#}");
    if let Ok(path) = std::env::var("FASTPATH_TIMERS_JSON") {
        std::fs::write(&path, format!("{report:#}\n")).unwrap();
    }
    // The set-up held: the daemon fed the watchdog, and the load was what
    // the measurement says it was.
    assert!(!gaps.is_empty(), "no WATCHDOG=1 received");
    assert!(
        peak_load >= 2.0 * cores as f64,
        "the load reached only {peak_load:.1} on {cores} cores"
    );
}
