//! A BIRD that does not behave: the daemon stays in charge of itself.
//!
//! A fake BIRD listens on the control socket `birdc -s` is pointed at and
//! speaks BIRD's control protocol as its documentation describes it (a
//! `0001 BIRD x.y ready.` greeting; replies of numbered lines, `NNNN-`
//! where more follow and `NNNN ` on the last), then misbehaves after the
//! command: it hangs, trickles one byte a second, floods 1 GiB of table
//! lines, or answers bytes that are no reply at all. The real `birdc` talks
//! to it, from the daemon's BGP task and from `fastpath lb withdraw`.
//!
//! Whatever it does: the API answers every request within 200 ms (a local
//! request answered from memory takes a few ms; 200 ms leaves the loaded
//! 2-core machine room, a birdc in the way takes seconds), `/status` says
//! what is wrong with BIRD and does not say "announced", the daemon's
//! memory stays within 100 MB of what it used at start, SIGTERM ends it
//! within its drain time plus 1 s while the API goes on answering (and
//! says it is stopping), and `fastpath lb withdraw` ends within 5 s saying
//! what it could not do.
//!
//! Every goal is checked even when an earlier one failed, and the test
//! fails listing all that did not hold. `FASTPATH_BIN` runs another build
//! of `fastpath` (an older one, to see which goals it missed).
//!
//! System tests: root (a network namespace for the daemon's interface) and
//! bird2's `birdc`.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lab::netns::{self, Netns};

/// How the fake BIRD misbehaves once it has a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Never answers (keeps the connection open).
    Hang,
    /// Answers one byte a second, never ending the reply.
    Trickle,
    /// Answers 1 GiB of table lines before the last line.
    Flood,
    /// Answers bytes that are no BIRD reply, then closes.
    Garbage,
}

/// The goal for every API request.
const API_BOUND: Duration = Duration::from_millis(200);
/// `[bgp] drain_ms` of the test's configuration.
const DRAIN: Duration = Duration::from_millis(1000);
/// SIGTERM must end the daemon within its drain time plus this.
const STOP_MARGIN: Duration = Duration::from_secs(1);
/// `fastpath lb withdraw` must end within this.
const WITHDRAW_BOUND: Duration = Duration::from_secs(5);
/// The most the daemon's memory may grow over what it used at start.
const RSS_GROWTH: u64 = 100 << 20;
/// What the flood sends at most.
const FLOOD_BYTES: u64 = 1 << 30;

/// A fake BIRD control socket, served by threads of this process until
/// dropped.
struct FakeBird {
    stop: Arc<AtomicBool>,
    path: PathBuf,
    accepted: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeBird {
    fn start(path: &Path, mode: Mode) -> FakeBird {
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path).unwrap();
        listener.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let accepted = Arc::new(AtomicU64::new(0));
        let (s, a) = (Arc::clone(&stop), Arc::clone(&accepted));
        let thread = std::thread::spawn(move || {
            let mut conns = Vec::new();
            while !s.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((c, _)) => {
                        a.fetch_add(1, Ordering::Relaxed);
                        let s = Arc::clone(&s);
                        conns.push(std::thread::spawn(move || serve(c, mode, &s)));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
            for c in conns {
                let _ = c.join();
            }
        });
        FakeBird {
            stop,
            path: path.to_path_buf(),
            accepted,
            thread: Some(thread),
        }
    }
}

impl Drop for FakeBird {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// One client of the fake BIRD: the greeting, one command line, then the
/// misbehaviour.
fn serve(mut c: UnixStream, mode: Mode, stop: &AtomicBool) {
    let _ = c.set_read_timeout(Some(Duration::from_millis(100)));
    let _ = c.set_write_timeout(Some(Duration::from_millis(100)));
    if c.write_all(b"0001 BIRD 2.0.12 ready.\n").is_err() {
        return;
    }
    // The command: up to its newline (birdc sends one line).
    let mut line = Vec::new();
    let mut b = [0u8; 256];
    while !line.contains(&b'\n') && line.len() < 4096 {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        match c.read(&mut b) {
            Ok(0) => return,
            Ok(n) => line.extend_from_slice(&b[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return,
        }
    }
    // Writes all of `data`, retrying on timeouts, until the peer goes or
    // the test ends; false then.
    let write = |c: &mut UnixStream, mut data: &[u8]| -> bool {
        while !data.is_empty() {
            if stop.load(Ordering::Relaxed) {
                return false;
            }
            match c.write(data) {
                Ok(0) => return false,
                Ok(n) => data = &data[n..],
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => return false,
            }
        }
        true
    };
    match mode {
        Mode::Hang => {
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Mode::Trickle => {
            let reply = b"1002-fastpath_vips Static     master4    up     00:00:00.000\n";
            for &byte in reply.iter().cycle() {
                if !write(&mut c, &[byte]) {
                    return;
                }
                let until = Instant::now() + Duration::from_secs(1);
                while Instant::now() < until {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
        Mode::Flood => {
            let row = b"1002-fastpath_vips Static     master4    up     00:00:00.000\n";
            let chunk: Vec<u8> = row.iter().copied().cycle().take(row.len() * 1024).collect();
            let mut sent = 0u64;
            while sent < FLOOD_BYTES {
                if !write(&mut c, &chunk) {
                    return;
                }
                sent += chunk.len() as u64;
            }
            let _ = write(&mut c, b"0000 \n");
        }
        Mode::Garbage => {
            // Bytes of no reply: no code, short codes, codes not followed
            // by '-' or ' ', binary, a line far longer than any BIRD writes.
            let mut junk = Vec::new();
            junk.extend_from_slice(b"hello\n12\n12345 x\n000\x00\xff\xfe\n\n-\n +\n");
            let mut x: u32 = 0x2545_f491;
            for _ in 0..65536 {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                junk.push(x as u8);
            }
            junk.extend(std::iter::repeat_n(b'9', 100_000));
            let _ = write(&mut c, &junk);
        }
    }
}

/// The daemon's configuration: its API on the namespace's loopback, BGP
/// through `birdc -s SOCKET`, one IPv4 VIP over a pool without health
/// checks (so it is always wanted announced).
fn config(dir: &Path, socket: &Path) -> String {
    format!(
        r#"
[forwarder]
threads = 1
queue_size = 256
pool_buffers = 4096
[api]
listen = "127.0.0.1:9180"
[bgp]
vips_file = "{dir}/vips.conf"
birdc = ["birdc", "-s", "{socket}"]
poll_ms = 200
drain_ms = {drain}
drain_quiet_ms = 200
[encap]
source = "10.0.0.1"
gateway_mac = "02:00:00:00:0f:02"
[[pools]]
name = "dns"
backends = [{{ address = "10.2.0.1" }}]
[[vips]]
name = "dns"
address = "198.18.0.53"
protocol = "udp"
pool = "dns"
"#,
        dir = dir.display(),
        socket = socket.display(),
        drain = DRAIN.as_millis()
    )
}

/// The daemon in a namespace of its own, killed if the test did not end it.
struct Daemon {
    child: Child,
    ns: Netns,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Daemon {
    /// One API request from inside the namespace: how long it took and
    /// its body, or why it failed.
    fn get(&self, path: &'static str) -> (Duration, Result<String, String>) {
        self.ns
            .inside(move || {
                let t = Instant::now();
                let r = lbd::client::api_request_with(
                    "127.0.0.1:9180".parse().unwrap(),
                    "GET",
                    path,
                    None,
                )
                .map_err(|e| e.to_string());
                (t.elapsed(), r)
            })
            .unwrap()
    }

    fn rss(&self) -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap_or_default();
        s.lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kib| kib << 10)
    }
}

/// The `fastpath` under test: this build, or `FASTPATH_BIN`.
fn fastpath_bin() -> String {
    std::env::var("FASTPATH_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_fastpath").into())
}

/// Records a goal that did not hold (the test goes on to the others).
macro_rules! check {
    ($failed:expr, $cond:expr, $($why:tt)+) => {
        if !$cond {
            let why = format!($($why)+);
            eprintln!("GOAL MISSED: {why}");
            $failed.push(why);
        }
    };
}

/// Runs the daemon against a fake BIRD in `mode` and checks every goal.
fn against(mode: Mode, tag: &str) {
    let mut failed: Vec<String> = Vec::new();
    systest::require_root();
    systest::require_netns();
    systest::require_program("birdc");
    let id = std::process::id() % 100_000;
    let dir = std::env::temp_dir().join(format!("fpbh-{tag}-{id}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("bird.ctl");
    let bird = FakeBird::start(&socket, mode);
    let cfg = dir.join("lb.toml");
    std::fs::write(&cfg, config(&dir, &socket)).unwrap();

    let ns = Netns::new(&format!("fpbh-{tag}-{id}")).unwrap();
    ns.sysctl("net.ipv6.conf.default.disable_ipv6", "1")
        .unwrap();
    netns::veth(
        &ns,
        "x0",
        "02:00:00:00:0f:01",
        &ns,
        "x1",
        "02:00:00:00:0f:02",
    )
    .unwrap();
    let log = dir.join("lb.log");
    let out = std::fs::File::create(&log).unwrap();
    let child = ns
        .command(&fastpath_bin())
        .args(["lb", "run", "--config"])
        .arg(&cfg)
        .args(["--interface", "x0", "--driver", "af-packet"])
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap();
    let d = Daemon { child, ns };
    let said = || std::fs::read_to_string(&log).unwrap_or_default();

    // Up: the API answers.
    let deadline = Instant::now() + Duration::from_secs(20);
    while d.get("/status").1.is_err() {
        assert!(Instant::now() < deadline, "no API in 20 s:\n{}", said());
        std::thread::sleep(Duration::from_millis(100));
    }
    let idle = d.rss();

    // 6 s of requests while the BGP task meets the BIRD: every one
    // answered within the bound.
    let (mut slowest, mut requests, mut rss_max) = (Duration::ZERO, 0, idle);
    let mut unanswered = Vec::new();
    let mut last_status = String::new();
    let until = Instant::now() + Duration::from_secs(6);
    while Instant::now() < until {
        for path in ["/status", "/metrics"] {
            let (took, r) = d.get(path);
            requests += 1;
            slowest = slowest.max(took);
            match r {
                Ok(body) if path == "/status" => last_status = body,
                Ok(_) => {}
                Err(e) => unanswered.push(format!("GET {path}: {e}")),
            }
        }
        rss_max = rss_max.max(d.rss());
        std::thread::sleep(Duration::from_millis(30));
    }
    eprintln!(
        "{mode:?}: {requests} requests, slowest {slowest:?}; RSS {} MiB at start, at most {} MiB; BIRD saw {} connections",
        idle >> 20,
        rss_max >> 20,
        bird.accepted.load(Ordering::Relaxed)
    );
    check!(
        failed,
        unanswered.is_empty(),
        "{mode:?}: {} of {requests} requests unanswered: {:?}",
        unanswered.len(),
        unanswered.first()
    );
    check!(
        failed,
        slowest <= API_BOUND,
        "{mode:?}: the slowest request took {slowest:?} (bound {API_BOUND:?})"
    );
    assert!(
        bird.accepted.load(Ordering::Relaxed) > 0,
        "{mode:?}: the daemon never asked BIRD:\n{}",
        said()
    );
    check!(
        failed,
        rss_max.saturating_sub(idle) < RSS_GROWTH,
        "{mode:?}: RSS grew from {idle} to {rss_max} bytes"
    );
    let s: serde_json::Value = serde_json::from_str(&last_status).unwrap_or_default();
    check!(
        failed,
        s["bgp_announced"] == false,
        "{mode:?}: not announced: {s}"
    );
    let error = s["bgp"]["error"].as_str().unwrap_or_default().to_string();
    let expected = match mode {
        Mode::Hang | Mode::Trickle => "no answer within",
        Mode::Flood => "printed more than",
        // Whatever birdc made of it: not an answer fastpath reads as one.
        Mode::Garbage => "",
    };
    check!(
        failed,
        !error.is_empty() && error.contains(expected),
        "{mode:?}: bgp.error {error:?} (wanted {expected:?})"
    );
    check!(
        failed,
        error.len() < 4096,
        "{mode:?}: bgp.error is {} bytes: BIRD's garbage is not cut",
        error.len()
    );
    check!(
        failed,
        s["bgp"]["read_ms_ago"].as_u64().is_some(),
        "{mode:?}: the status says how old its reading of BIRD is: {s}"
    );

    // SIGTERM: the API answers while the daemon stops, and says so; the
    // daemon is gone within its drain time plus the margin.
    let pid = d.child.id() as i32;
    let signalled = Instant::now();
    // SAFETY: kill(2) on our own child, not reaped yet.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let mut d = d;
    let (mut stopping_seen, mut answered, mut slowest) = (false, 0, Duration::ZERO);
    let status = loop {
        if let Some(st) = d.child.try_wait().unwrap() {
            break st;
        }
        if signalled.elapsed() > DRAIN + STOP_MARGIN + Duration::from_secs(10) {
            panic!("{mode:?}: still running 10 s after its bound:\n{}", said());
        }
        let (took, r) = d.get("/status");
        if let Ok(body) = r {
            // Answered: within the bound (a refused connection is the
            // daemon gone, checked below).
            answered += 1;
            slowest = slowest.max(took);
            let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
            stopping_seen |= !v["stopping"].is_null();
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = signalled.elapsed();
    eprintln!(
        "{mode:?}: SIGTERM to exit {took:?} ({answered} status requests answered meanwhile, stopping seen: {stopping_seen})"
    );
    check!(
        failed,
        took <= DRAIN + STOP_MARGIN,
        "{mode:?}: SIGTERM took {took:?} (bound {:?})",
        DRAIN + STOP_MARGIN
    );
    check!(failed, status.success(), "{mode:?}: exit {status}");
    check!(
        failed,
        slowest <= API_BOUND,
        "{mode:?}: GET /status while stopping took {slowest:?} (bound {API_BOUND:?})"
    );
    check!(
        failed,
        answered > 0 && stopping_seen,
        "{mode:?}: the API did not say it was stopping ({answered} answered)"
    );
    // It says what it could not do at the stop: every misbehaviour makes
    // the withdrawal fail.
    check!(
        failed,
        said().contains("could not withdraw"),
        "{mode:?}: the log does not say the withdrawal failed"
    );

    // `fastpath lb withdraw`, as the unit's ExecStopPost runs it.
    let t = Instant::now();
    let mut w = Command::new(fastpath_bin())
        .args(["lb", "withdraw", "--config"])
        .arg(&cfg)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Its output read as it comes (a full pipe would stop it).
    let readers: Vec<_> = [
        w.stdout.take().map(|o| Box::new(o) as Box<dyn Read + Send>),
        w.stderr.take().map(|e| Box::new(e) as Box<dyn Read + Send>),
    ]
    .into_iter()
    .flatten()
    .map(|mut r| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = r.read_to_end(&mut v);
            String::from_utf8_lossy(&v).into_owned()
        })
    })
    .collect();
    let ended = loop {
        if let Some(st) = w.try_wait().unwrap() {
            break Some(st);
        }
        if t.elapsed() > WITHDRAW_BOUND + Duration::from_secs(10) {
            let _ = w.kill();
            let _ = w.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = t.elapsed();
    let text: String = readers
        .into_iter()
        .map(|r| r.join().unwrap_or_default())
        .collect();
    eprintln!(
        "{mode:?}: lb withdraw took {took:?} ({} bytes said): {}",
        text.len(),
        text.chars().take(2000).collect::<String>().trim()
    );
    check!(
        failed,
        text.len() < 16 << 10,
        "{mode:?}: lb withdraw said {} bytes: BIRD's garbage is not cut",
        text.len()
    );
    check!(
        failed,
        took <= WITHDRAW_BOUND,
        "{mode:?}: lb withdraw took {took:?} (bound {WITHDRAW_BOUND:?})"
    );
    check!(
        failed,
        ended.is_some_and(|e| !e.success()),
        "{mode:?}: lb withdraw claims success or never ended ({ended:?})"
    );
    check!(
        failed,
        text.contains("fastpath_vips: not withdrawn"),
        "{mode:?}: lb withdraw does not say, per protocol, what it could not do: {text}"
    );
    let log_text = said();
    drop(d);
    drop(bird);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        failed.is_empty(),
        "{mode:?}: {} goals missed:\n{}\n--- the daemon said:\n{log_text}",
        failed.len(),
        failed.join("\n")
    );
}

#[test]
#[ignore = "system test: root, network namespaces, bird2's birdc"]
fn a_bird_that_hangs_stops_nothing() {
    against(Mode::Hang, "hang");
}

#[test]
#[ignore = "system test: root, network namespaces, bird2's birdc"]
fn a_bird_that_trickles_stops_nothing() {
    against(Mode::Trickle, "trkl");
}

#[test]
#[ignore = "system test: root, network namespaces, bird2's birdc"]
fn a_bird_that_floods_stops_nothing() {
    against(Mode::Flood, "fld");
}

#[test]
#[ignore = "system test: root, network namespaces, bird2's birdc"]
fn a_bird_that_answers_garbage_stops_nothing() {
    against(Mode::Garbage, "garb");
}
