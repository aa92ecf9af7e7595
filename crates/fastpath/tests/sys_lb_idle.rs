//! An idle load balancer sleeps: with no traffic,
//! `fastpath lb run --interface` uses almost no CPU (it used about a tenth
//! of a core with two packet threads), and a frame that arrives after an
//! idle period is still forwarded, promptly. In a namespace of its own,
//! with a veth pair that exists only there: the load balancer serves `x0`;
//! the test sends UDP frames for a VIP into `x1` and catches the GRE frames
//! the load balancer sends back out of `x0` on `x1`.
//!
//! The same code is the measurement behind the figures in the report of
//! this change; run it by hand, 10 s of idle CPU and 1000 frames one at a
//! time per mode (`FASTPATH_BIN` compares another build):
//!
//! ```text
//! cargo test --release -p fastpath --test sys_lb_idle -- --ignored by_hand_ --nocapture
//! ```

mod common;

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::probe::{now_realtime, RawSocket};
use lab::netns::{self, Netns};
use packet::build::Frame;

/// The load balancer's side of the veth pair, and its MAC.
const LB_IF: (&str, [u8; 6]) = ("x0", [0x02, 0, 0, 0, 0x0f, 0x01]);
/// The test's side.
const PEER_IF: (&str, [u8; 6]) = ("x1", [0x02, 0, 0, 0, 0x0f, 0x02]);
/// The VIP of [`CONFIG`]: UDP to any port. Only inside the test's namespace.
const VIP: [u8; 4] = [198, 18, 0, 53];
/// The test's own configuration: one UDP VIP over two backends, no health
/// checks (the backends do not exist; a checked pool would go down while
/// the load balancer idles and the frame after the idle period would be
/// dropped for that, not for sleeping), no BGP.
const CONFIG: &str = r#"
[encap]
source = "10.0.0.1"

[[pools]]
name = "dns"
backends = [{ address = "10.2.0.1" }, { address = "10.2.0.2" }]

[[vips]]
name = "dns-any-port"
address = "198.18.0.53"
protocol = "udp"
pool = "dns"
"#;
/// Most of a core an idle load balancer may use in the test: it used
/// about 9% with two packet threads before it slept when idle, and uses
/// well under 1% now.
const IDLE_CPU_LIMIT: f64 = 0.05;

fn mac(m: [u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// A load balancer on `x0` in a namespace of its own.
struct Lb {
    child: Child,
    probe: Probe,
    /// Dropped last: removes the interfaces.
    _ns: Netns,
}

impl Lb {
    /// Starts `bin lb run` with `driver` and `threads`, and waits until it
    /// forwards; why not if it exits first (AF_XDP unavailable).
    fn start(bin: &str, tag: &str, driver: &str, threads: usize) -> Result<Lb, String> {
        let ns = Netns::new(&format!("fpidle-{tag}-{}", std::process::id() % 100_000)).unwrap();
        ns.sysctl("net.ipv6.conf.default.disable_ipv6", "1")
            .unwrap();
        netns::veth(&ns, LB_IF.0, &mac(LB_IF.1), &ns, PEER_IF.0, &mac(PEER_IF.1)).unwrap();
        let probe = ns.inside(|| Probe::open(PEER_IF.0)).unwrap();
        let config = std::env::temp_dir().join(format!("fpidle-{tag}-{}.toml", std::process::id()));
        std::fs::write(&config, CONFIG).unwrap();
        let child = ns
            .command(bin)
            .args(["lb", "run", "--config"])
            .arg(&config)
            .args(["--interface", LB_IF.0])
            .args(["--driver", driver, "--threads", &threads.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lb = Lb {
            child,
            probe,
            _ns: ns,
        };
        // Forwarding once it has attached to the interface; a frame every
        // 100 ms until one comes back.
        let deadline = Instant::now() + Duration::from_secs(15);
        let mut sport = 1;
        loop {
            if let Some(status) = lb.child.try_wait().unwrap() {
                let _ = std::fs::remove_file(&config);
                let mut err = String::new();
                if let Some(mut e) = lb.child.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut e, &mut err);
                }
                return Err(format!(
                    "`lb run --driver {driver}` exited ({status}): {err}"
                ));
            }
            assert!(
                Instant::now() < deadline,
                "`lb run --driver {driver} --threads {threads}` forwarded nothing in 15 s"
            );
            if lb
                .probe
                .forward(sport, Duration::from_millis(100))
                .is_some()
            {
                break;
            }
            sport += 1;
        }
        // Read at start (the test never reloads).
        let _ = std::fs::remove_file(&config);
        Ok(lb)
    }

    /// CPU time the process used (all its threads), from
    /// `/proc/<pid>/stat`: utime + stime.
    fn cpu(&self) -> Duration {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap();
        // After the command name, which is in parentheses and may hold
        // spaces: fields 3 onwards; utime and stime are fields 14 and 15.
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
        Duration::from_millis(ticks * 1000 / hz)
    }

    /// The share of one core the process uses over `window` without
    /// traffic.
    fn idle_cpu(&self, window: Duration) -> f64 {
        let (c0, t0) = (self.cpu(), Instant::now());
        std::thread::sleep(window);
        let (c1, t1) = (self.cpu(), Instant::now());
        (c1 - c0).as_secs_f64() / (t1 - t0).as_secs_f64()
    }

    /// Sends `n` frames one at a time, each after `gap` of silence, and
    /// returns how long each took to come back (`None`: not in 1 s).
    fn latencies(&self, n: u16, gap: Duration) -> Vec<Option<Duration>> {
        (0..n)
            .map(|i| {
                std::thread::sleep(gap);
                self.probe.forward(10_000 + i, Duration::from_secs(1))
            })
            .collect()
    }

    /// Stops it with SIGTERM; it must exit cleanly.
    fn stop(mut self) {
        // SAFETY: kill(2) on our own, unreaped child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let status = self.child.wait().unwrap();
        let mut err = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut e, &mut err);
        }
        assert!(status.success(), "{status}: {err}");
    }
}

impl Drop for Lb {
    /// Leaves no load balancer behind when a test fails half-way.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The test's end of the pair: sends frames into the load balancer's
/// interface and receives what the load balancer transmits.
struct Probe(RawSocket);

impl Probe {
    /// Opens it on `iface` of the calling thread's namespace.
    fn open(iface: &str) -> Probe {
        Probe(RawSocket::open(iface))
    }

    /// Sends a UDP frame for the VIP from source port `sport` and waits up
    /// to `timeout` for the load balancer's GRE frame carrying it: the time
    /// from just before the send to the kernel's stamp on its arrival.
    fn forward(&self, sport: u16, timeout: Duration) -> Option<Duration> {
        let mut f = Frame::udp([10, 9, 0, 1].into(), VIP.into(), sport, 53, b"idle probe");
        f.eth.dst = LB_IF.1;
        f.eth.src = PEER_IF.1;
        let sent = now_realtime();
        self.0.send(&f.to_bytes());
        let (_, stamp) = self
            .0
            .receive_matching(timeout, |frame| carries(frame, sport))?;
        Some(stamp.saturating_sub(sent))
    }
}

/// Whether `frame` is IPv4 GRE carrying our UDP frame from `sport`.
fn carries(frame: &[u8], sport: u16) -> bool {
    let ip = |p: &[u8]| -> Option<(u8, usize)> {
        (p.len() >= 20 && p[0] >> 4 == 4).then(|| (p[9], usize::from(p[0] & 15) * 4))
    };
    if frame.len() < 14 || frame[12..14] != [0x08, 0x00] {
        return false;
    }
    let outer = &frame[14..];
    let Some((47, ihl)) = ip(outer) else {
        return false;
    };
    // A basic GRE header (no key, no sequence): 4 bytes.
    let Some(inner) = outer.get(ihl + 4..) else {
        return false;
    };
    match ip(inner) {
        Some((17, ihl2)) => inner.get(ihl2..ihl2 + 2) == Some(&sport.to_be_bytes()[..]),
        _ => false,
    }
}

/// The `fastpath` under test: this build, or `FASTPATH_BIN` (to run the
/// same test against another build, such as one from before this change).
fn bin() -> String {
    std::env::var("FASTPATH_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_fastpath").into())
}

/// Whether `lb run` failed because this machine cannot do AF_XDP: the XDP
/// programs were not built in, or the kernel has no AF_XDP or does not
/// attach them.
fn xdp_unavailable(why: &str) -> bool {
    ["not built", "has no AF_XDP", "attaching the"]
        .iter()
        .any(|s| why.contains(s))
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// The test: idle CPU under the limit, and frames after idle periods are
/// forwarded.
fn sleeps_when_idle(driver: &str, threads: usize) {
    systest::require_netns();
    let tag = format!("{}{threads}", &driver[3..4]);
    let lb = match Lb::start(&bin(), &tag, driver, threads) {
        Ok(lb) => lb,
        Err(why) if driver == "af-xdp" && xdp_unavailable(&why) => {
            systest::missing(&format!("AF_XDP on veth ({why})"))
        }
        Err(why) => panic!("{why}"),
    };
    // Let it settle after the first frame, then measure.
    std::thread::sleep(Duration::from_millis(300));
    let cpu = lb.idle_cpu(Duration::from_secs(4));
    let lat = lb.latencies(20, Duration::from_millis(30));
    let lost = lat.iter().filter(|l| l.is_none()).count();
    let mut ok: Vec<Duration> = lat.into_iter().flatten().collect();
    ok.sort();
    eprintln!(
        "{driver} threads={threads}: idle CPU {:.2}% of a core; after idle gaps of 30 ms, {} of 20 frames back, median {:?}",
        cpu * 100.0,
        ok.len(),
        ok.get(ok.len() / 2)
    );
    lb.stop();
    assert!(
        cpu < IDLE_CPU_LIMIT,
        "{driver} with {threads} packet threads used {:.1}% of a core while idle (limit {:.0}%)",
        cpu * 100.0,
        IDLE_CPU_LIMIT * 100.0
    );
    assert_eq!(
        lost, 0,
        "{driver}: frames sent after an idle period were not forwarded"
    );
}

#[test]
#[ignore = "system test: root, namespaces"]
fn af_packet_inline_sleeps_when_idle_and_wakes_for_a_frame() {
    sleeps_when_idle("af-packet", 0);
}

#[test]
#[ignore = "system test: root, namespaces"]
fn af_packet_threads_sleep_when_idle_and_wake_for_a_frame() {
    sleeps_when_idle("af-packet", 2);
}

#[test]
#[ignore = "system test: root, namespaces"]
fn af_xdp_inline_sleeps_when_idle_and_wakes_for_a_frame() {
    sleeps_when_idle("af-xdp", 0);
}

#[test]
#[ignore = "system test: root, namespaces"]
fn af_xdp_threads_sleep_when_idle_and_wake_for_a_frame() {
    sleeps_when_idle("af-xdp", 2);
}

/// The measurement: for each driver and thread count, idle CPU over
/// `IDLE_SECS` (10) and the time to forward each of `PROBES` (1000) frames
/// sent one at a time after `GAP_MS` (20) of silence: median, 99th
/// percentile, worst. `FASTPATH_BIN` measures another build.
#[test]
#[ignore = "a measurement of a few minutes, not a test: run by hand (make test skips by_hand_)"]
fn by_hand_measure_idle_cpu_and_wake_latency() {
    systest::require_netns();
    let env = |k: &str, d: u64| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let bin = bin();
    let (secs, probes, gap) = (env("IDLE_SECS", 10), env("PROBES", 1000), env("GAP_MS", 20));
    println!("{bin}: idle CPU over {secs} s; {probes} frames, each after {gap} ms of silence");
    println!("driver     threads  idle CPU  median     p99        max        lost");
    for driver in ["af-packet", "af-xdp"] {
        for threads in [0, 2] {
            let tag = format!("m{}{threads}", &driver[3..4]);
            let lb = match Lb::start(&bin, &tag, driver, threads) {
                Ok(lb) => lb,
                Err(why) => {
                    println!("{driver:<10} {threads:>7}  not measured: {why}");
                    continue;
                }
            };
            std::thread::sleep(Duration::from_millis(300));
            let cpu = lb.idle_cpu(Duration::from_secs(secs));
            let lat = lb.latencies(probes as u16, Duration::from_millis(gap));
            lb.stop();
            let lost = lat.iter().filter(|l| l.is_none()).count();
            let mut ok: Vec<Duration> = lat.into_iter().flatten().collect();
            ok.sort();
            if ok.is_empty() {
                println!(
                    "{driver:10} {threads:7}  {:7.2}%  (nothing forwarded)",
                    cpu * 100.0
                );
                continue;
            }
            println!(
                "{driver:10} {threads:7}  {:7.2}%  {:9.1?}  {:9.1?}  {:9.1?}  {lost}",
                cpu * 100.0,
                percentile(&ok, 0.5),
                percentile(&ok, 0.99),
                ok[ok.len() - 1],
            );
        }
    }
}
