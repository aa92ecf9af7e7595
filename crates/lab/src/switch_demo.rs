//! `fastpath switch demo`: two QEMU guests exchanging traffic through the
//! switch, shown to a person. Everything it creates (a namespace, the
//! switch process, the guests, a socket directory) is removed at the end,
//! also on Ctrl-C. Its namespace's name holds the process id, so two demos
//! on one machine do not meet; a namespace of that name that is already
//! there is someone else's, and the demo stops rather than delete it.
//!
//! 1. `fastpath switch run` starts in a throwaway namespace with two VM
//!    ports (vhost-user, each locked to its guest's MAC) and a TAP port
//!    whose far side is the namespace's kernel.
//! 2. Two guests boot (TCG), each attached to one VM port.
//! 3. They ping each other, and the namespace's kernel through the TAP
//!    port.
//! 4. Guest A sends a short pktgen blast to guest B.
//! 5. A TCP transfer: iperf3 from guest A to guest B for a few seconds,
//!    its rate printed with the offloads the guests negotiated.
//! 6. `fastpath switch status` shows the ports' counters: frames, kicks and
//!    interrupts per packet on the VM ports.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::guest::{Guest, GuestOpts, Nic};
use crate::netns::Netns;
use crate::{Error, Result};

/// The demo's namespace (its name's stem: the process id follows), TAP,
/// addresses and MACs.
const NS: &str = "fpvmdemo";
const TAP: &str = "fpvmtap0";
const HOST_IP: &str = "10.77.0.254";
const IP_A: &str = "10.77.0.1";
const IP_B: &str = "10.77.0.2";
const MAC_A: &str = "52:54:00:77:00:01";
const MAC_B: &str = "52:54:00:77:00:02";
/// Seconds of the TCP transfer between the guests.
const TCP_SECS: u32 = 3;

/// What the demo is asked to do.
#[derive(Debug, Clone)]
pub struct Options {
    /// The fastpath binary that runs the switch and asks for its status.
    pub exe: PathBuf,
    /// Frames in guest A's blast to guest B.
    pub blast: u64,
}

/// The switch process, stopped (SIGTERM, then SIGKILL) when dropped.
struct SwitchProc(Child);

impl Drop for SwitchProc {
    fn drop(&mut self) {
        if let Some(pid) = rustix::process::Pid::from_raw(self.0.id() as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(3) {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A directory removed when dropped.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn check(stop: &AtomicBool) -> Result<()> {
    if stop.load(Ordering::Relaxed) {
        return Err(Error::Interrupted);
    }
    Ok(())
}

/// Start `fastpath switch run` inside `ns`: it dies with this thread
/// (PDEATHSIG) if the demo itself is killed.
fn start_switch(ns: &Netns, exe: &Path, dir: &Path) -> Result<SwitchProc> {
    let log = std::fs::File::create(dir.join("switch.log"))
        .map_err(Error::io("creating the switch's log"))?;
    let log2 = log.try_clone().map_err(Error::io("the switch's log"))?;
    let mut cmd = ns.command(&exe.display().to_string());
    cmd.args(["switch", "run", "--socket"])
        .arg(dir.join("switch.sock"))
        .args(["--tap", TAP, "--vhost-user"])
        .arg(format!("{},mac={MAC_A}", dir.join("vm-a.sock").display()))
        .arg("--vhost-user")
        .arg(format!("{},mac={MAC_B}", dir.join("vm-b.sock").display()))
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log2);
    // SAFETY: between fork and exec the closure makes one system call
    // (prctl), which is async-signal-safe, and touches nothing else.
    unsafe {
        cmd.pre_exec(|| {
            rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))?;
            Ok(())
        });
    }
    let child = cmd.spawn().map_err(|source| {
        Error::Netns(netns::Error::Spawn {
            program: format!("{} switch run (in {})", exe.display(), ns.name()),
            source,
        })
    })?;
    Ok(SwitchProc(child))
}

/// `fastpath switch status` on the demo's switch: its output.
fn status(exe: &Path, dir: &Path) -> Result<String> {
    let out = Command::new(exe)
        .args(["switch", "status", "--socket"])
        .arg(dir.join("switch.sock"))
        .output()
        .map_err(|source| {
            Error::Netns(netns::Error::Spawn {
                program: format!("{} switch status", exe.display()),
                source,
            })
        })?;
    if !out.status.success() {
        return Err(Error::Netns(netns::Error::Failed {
            command: "fastpath switch status".into(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        }));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn ping(g: &mut Guest, to: &str, what: &str, n: u32) -> Result<()> {
    let p = g.ping(to, n, 200)?;
    println!(
        "   {} -> {what} ({to}): {}/{} replies, median {}",
        g.name(),
        p.received,
        p.sent,
        p.p50_ms()
            .map(|m| format!("{m:.2} ms"))
            .unwrap_or_else(|| "-".into())
    );
    if p.received == 0 {
        return Err(Error::Timeout {
            what: format!("{} got no reply from {what} ({to})", g.name()),
            logs: g.console_tail(),
        });
    }
    Ok(())
}

/// Run the demo.
pub fn run(o: &Options, stop: Arc<AtomicBool>) -> Result<()> {
    if !crate::netns::available() {
        return Err(Error::Unavailable);
    }
    if !crate::guest::available() {
        return Err(Error::Guest(crate::guest::GuestError::Image(
            PathBuf::from(crate::guest::IMAGE_DIR),
        )));
    }
    let t0 = Instant::now();
    let dir = std::env::temp_dir().join(format!("fastpath-switch-demo-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(Error::io(format!("creating {}", dir.display())))?;
    let _dir = TempDir(dir.clone());
    let ns_name = format!("{NS}-{}", std::process::id());
    // Netns::new replaces a namespace of its name; this one is only ours
    // if it is not there yet.
    if Path::new("/run/netns").join(&ns_name).exists() {
        return Err(Error::io(format!(
            "namespace {ns_name} exists and is not this demo's: not deleting it"
        ))(std::io::ErrorKind::AlreadyExists.into()));
    }
    println!("1. fastpath switch run in namespace {ns_name}: VM ports vm-a and vm-b (vhost-user,");
    println!(
        "   locked to their guests' MACs) and TAP port {TAP} (the namespace's kernel, {HOST_IP})"
    );
    let ns = Netns::new(&ns_name)?;
    let _switch = start_switch(&ns, &o.exe, &dir)?;
    let ready = Instant::now();
    while status(&o.exe, &dir).is_err() {
        check(&stop)?;
        if ready.elapsed() > Duration::from_secs(20) {
            let log = std::fs::read_to_string(dir.join("switch.log")).unwrap_or_default();
            return Err(Error::Timeout {
                what: "the switch did not answer on its control socket".into(),
                logs: log,
            });
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    ns.ip(&["link", "set", "dev", TAP, "up"])?;
    ns.ip(&["addr", "add", &format!("{HOST_IP}/24"), "dev", TAP])?;
    println!("2. booting two guests (QEMU, TCG: 10-60 s)");
    let sock = |n: &str| dir.join(format!("{n}.sock"));
    let a_opts = GuestOpts::new("guest A", vec![Nic::vhost_user(&sock("vm-a"), MAC_A)])
        .ip(&format!("{IP_A}/24"))
        .limit(Duration::from_secs(600));
    let b_opts = GuestOpts::new("guest B", vec![Nic::vhost_user(&sock("vm-b"), MAC_B)])
        .ip(&format!("{IP_B}/24"))
        .limit(Duration::from_secs(600));
    let mut a = Guest::start(&a_opts)?;
    let mut b = Guest::start(&b_opts)?;
    a.wait_ready(crate::guest::BOOT)?;
    check(&stop)?;
    b.wait_ready(crate::guest::BOOT)?;
    println!(
        "   both up after {:.0} s (A {IP_A}, B {IP_B})",
        t0.elapsed().as_secs_f64()
    );
    check(&stop)?;
    println!("3. ping through the switch: guest to guest, and guest to the TAP port's kernel");
    ping(&mut a, IP_B, "guest B", 5)?;
    ping(&mut b, IP_A, "guest A", 5)?;
    ping(&mut a, HOST_IP, "the TAP side", 3)?;
    ping(&mut b, HOST_IP, "the TAP side", 3)?;
    check(&stop)?;
    println!(
        "4. a short blast: pktgen in guest A, {} frames of 60 bytes to guest B, 32 per doorbell",
        o.blast
    );
    let rx0 = b.stat("eth0", "rx_packets")?;
    let p = a.pktgen(
        "eth0",
        o.blast,
        60,
        32,
        MAC_B,
        IP_B,
        Duration::from_secs(120 + o.blast / 1000),
    )?;
    std::thread::sleep(Duration::from_millis(500));
    let rx1 = b.stat("eth0", "rx_packets")?;
    println!(
        "   guest A sent {} frames at {} pps; guest B's kernel received {} (the rest were dropped at its full ring, counted below: a TCG guest receives slowly)",
        p.sent,
        p.pps,
        rx1 - rx0
    );
    check(&stop)?;
    println!("5. TCP between the guests: iperf3 from guest A to guest B for {TCP_SECS} s");
    let off = a.offloads("eth0")?;
    b.iperf3_server(Duration::from_secs(30))?;
    let c = a.iperf3_client(
        IP_B,
        TCP_SECS,
        1,
        Duration::from_secs(u64::from(TCP_SECS) + 90),
    )?;
    let s = b.iperf3_server_result(Duration::from_secs(30))?;
    println!(
        "   {:.0} Mbit/s: guest B read {} of the {} bytes guest A wrote in {:.1} s ({} retransmits); A's NIC offloads TCP segmentation: {}, checksums: {}",
        s.gbps() * 1000.0,
        s.received_bytes,
        c.sent_bytes,
        s.seconds,
        c.retransmits,
        if off.tso { "yes" } else { "no" },
        if off.tx_csum { "yes" } else { "no" },
    );
    check(&stop)?;
    println!("6. fastpath switch status");
    print!("{}", status(&o.exe, &dir)?);
    drop(a);
    drop(b);
    println!(
        "guests, switch and namespace removed; {:.0} s in all",
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}
