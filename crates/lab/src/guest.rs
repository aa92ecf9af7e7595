//! QEMU guests for the switch's tests, demo and benchmark: a small Debian
//! kernel and busybox initramfs (built offline by `scripts/guest-image.sh`)
//! booted under TCG, with NICs attached to a vhost-user socket (the
//! switch's VM ports), to a TAP device QEMU opens itself (its own virtio
//! backend, the kernel path), or as an emulated e1000 on such a TAP.
//!
//! The guest's `/init` prints `FASTPATH-GUEST-READY <mac>` on the serial
//! console and then runs each line it reads there as a shell command, so
//! [`Guest::run`] writes a command and reads its output back, bounded in
//! time.
//!
//! A guest never outlives its user: QEMU is started with
//! `PR_SET_PDEATHSIG` = SIGKILL (it dies with the thread that started it, so
//! start guests from a thread that lives as long as they should), killed by
//! PID when the [`Guest`] is dropped, and killed by a watchdog once its time
//! limit ([`GuestOpts::limit`]) has passed, whatever happens.
//!
//! TCG only: this machine's `/dev/kvm` cannot run a stock kernel
//! (MACHINE-NOTES), so every figure measured with these guests carries the
//! cost of emulating the CPU, not that of VM exits.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Where `scripts/guest-image.sh` puts the guest image.
pub const IMAGE_DIR: &str = "/var/cache/fastpath/guest";
/// The QEMU that runs the guests (10.0 from bookworm-backports: Debian 12's
/// 7.2 crashes when a TCG guest starts a vhost-user NIC).
pub const QEMU: &str = "qemu-system-x86_64";
/// How long a guest may take to boot: 7-8 s on a quiet machine, up to 40 s
/// on a loaded one (TCG).
pub const BOOT: Duration = Duration::from_secs(120);
/// The rings of a vhost-user NIC, entries ([`GuestOpts::vhost_ring`]):
/// QEMU's largest (a TAP backend's transmit ring stays at 256, its limit).
pub const VHOST_RING: u16 = 1024;
/// What the guest prints when its network is up.
const READY: &str = "FASTPATH-GUEST-READY ";
/// Where [`Guest::iperf3_server`] writes its report, in the guest.
const IPERF3_LOG: &str = "/tmp/iperf3-server.json";
/// What follows every command, with its exit status.
const END: &str = "__FASTPATH_END__ ";

/// Errors booting or driving a guest.
#[derive(Debug, thiserror::Error)]
pub enum GuestError {
    /// QEMU could not be started.
    #[error("starting {QEMU} (scripts/setup.sh installs QEMU 10 from bookworm-backports)")]
    Spawn(#[source] std::io::Error),
    /// The guest image is missing.
    #[error("guest image {} missing (scripts/guest-image.sh builds it)", .0.display())]
    Image(PathBuf),
    /// The network namespace for QEMU's TAP devices could not be entered.
    #[error("network namespace {name}")]
    Netns {
        /// The namespace.
        name: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A NIC model and backend that do not go together.
    #[error("NIC {index}: {why}")]
    Nic {
        /// The NIC's place in the list.
        index: usize,
        /// What is wrong.
        why: &'static str,
    },
    /// A vhost-user ring size QEMU does not take.
    #[error("vhost-user rings of {0} entries (256, 512 or 1024)")]
    Rings(u16),
    /// The guest did not say it was ready in time.
    #[error("guest not ready after {0:?}; console: {1}")]
    NotReady(Duration, String),
    /// A command did not finish in time.
    #[error("command {0:?} did not finish in {1:?}; console: {2}")]
    Timeout(String, Duration, String),
    /// A command failed.
    #[error("command {cmd:?} exited with {status}: {output}")]
    Failed {
        /// The command.
        cmd: String,
        /// Its exit status.
        status: i32,
        /// What it printed.
        output: String,
    },
    /// A command's output was not what was expected.
    #[error("command {cmd:?}: cannot read its output: {output}")]
    Output {
        /// The command.
        cmd: String,
        /// What it printed.
        output: String,
    },
    /// QEMU exited.
    #[error("qemu exited; console: {0}")]
    Exited(String),
    /// Writing to the console failed.
    #[error("writing to the guest console")]
    Write(#[source] std::io::Error),
}

/// What this module's fallible functions return.
pub type Result<T, E = GuestError> = std::result::Result<T, E>;

/// Where a NIC's frames go on the host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Backend {
    /// A vhost-user socket: the switch serves the NIC's rings from guest
    /// memory (virtio-net only).
    VhostUser(PathBuf),
    /// A TAP device of this name, which QEMU creates (in the guest's
    /// [`GuestOpts::netns`], if any) and moves frames through itself.
    Tap(String),
}

/// The NIC the guest sees.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Model {
    /// virtio-net (PCI, modern).
    VirtioNet,
    /// An emulated Intel e1000: one register write per doorbell and one
    /// interrupt per completion unless the guest driver throttles them.
    E1000,
}

/// One NIC of a guest.
#[derive(Clone, Debug)]
pub struct Nic {
    /// Its backend.
    pub backend: Backend,
    /// Its model.
    pub model: Model,
    /// Its MAC address.
    pub mac: String,
    /// Extra `-device` options (`,mrg_rxbuf=off`).
    pub opts: String,
    /// vhost-user only: QEMU connects again every this many ms after the
    /// switch's socket closed (`reconnect-ms`), so a restarted switch gets
    /// its guests back; none: a closed socket leaves the NIC dead.
    pub reconnect_ms: Option<u32>,
    /// vhost-user only: queue pairs (`-netdev ...,queues=N` and
    /// `-device ...,mq=on,vectors=2N+2`); 1: a single pair, as before.
    pub queues: u16,
}

impl Nic {
    /// virtio-net on the switch's vhost-user port at `socket`.
    pub fn vhost_user(socket: &Path, mac: &str) -> Nic {
        Nic {
            backend: Backend::VhostUser(socket.to_path_buf()),
            model: Model::VirtioNet,
            mac: mac.into(),
            opts: String::new(),
            reconnect_ms: None,
            queues: 1,
        }
    }

    /// Reconnect to the vhost-user socket every `ms` after it closed.
    pub fn reconnect(mut self, ms: u32) -> Nic {
        self.reconnect_ms = Some(ms);
        self
    }

    /// `n` queue pairs (vhost-user; the switch's port must offer at
    /// least `n`). The guest's driver turns on as many as it has vCPUs
    /// ([`GuestOpts::cpus`]); [`Guest::set_queues`] changes it.
    pub fn queues(mut self, n: u16) -> Nic {
        self.queues = n.max(1);
        self
    }

    /// virtio-net on QEMU's own TAP backend (TAP `ifname`).
    pub fn tap(ifname: &str, mac: &str) -> Nic {
        Nic {
            backend: Backend::Tap(ifname.into()),
            model: Model::VirtioNet,
            mac: mac.into(),
            opts: String::new(),
            reconnect_ms: None,
            queues: 1,
        }
    }

    /// An emulated e1000 on QEMU's TAP backend (TAP `ifname`).
    pub fn e1000(ifname: &str, mac: &str) -> Nic {
        Nic {
            backend: Backend::Tap(ifname.into()),
            model: Model::E1000,
            mac: mac.into(),
            opts: String::new(),
            reconnect_ms: None,
            queues: 1,
        }
    }
}

/// How to start a guest.
#[derive(Clone, Debug)]
pub struct GuestOpts {
    /// A name for its logs.
    pub name: String,
    /// Its NICs, in PCI order (the first is `eth0`).
    pub nics: Vec<Nic>,
    /// The first NIC's address, `10.9.0.1/24` (none: no address).
    pub ip: Option<String>,
    /// QEMU runs in this network namespace (its TAP devices are made
    /// there).
    pub netns: Option<String>,
    /// Guest memory, MiB.
    pub mem_mib: u32,
    /// vCPUs (`-smp`; TCG runs each in a host thread of its own).
    pub cpus: u32,
    /// Killed after this long whatever happens.
    pub limit: Duration,
    /// The image directory.
    pub image: PathBuf,
    /// Entries in each ring of a vhost-user NIC (QEMU's `rx_queue_size`
    /// and `tx_queue_size`, a power of two from 256 to 1024; QEMU's own
    /// default is 256). 1024 by default: a TCG guest's receive path drains
    /// its ring slowly, and a bigger ring holds a burst or a 64 KB segment's
    /// mergeable buffers that a 256-entry one drops.
    pub vhost_ring: u16,
}

impl GuestOpts {
    /// A guest named `name` with `nics`, 256 MiB, killed after 10 minutes.
    pub fn new(name: &str, nics: Vec<Nic>) -> GuestOpts {
        GuestOpts {
            name: name.into(),
            nics,
            ip: None,
            netns: None,
            mem_mib: 256,
            cpus: 1,
            limit: Duration::from_secs(600),
            image: PathBuf::from(IMAGE_DIR),
            vhost_ring: VHOST_RING,
        }
    }

    /// Rings of `entries` on the vhost-user NICs (256 is QEMU's default).
    pub fn vhost_ring(mut self, entries: u16) -> GuestOpts {
        self.vhost_ring = entries;
        self
    }

    /// The first NIC's address (`ADDR/LEN`).
    pub fn ip(mut self, ip: &str) -> GuestOpts {
        self.ip = Some(ip.into());
        self
    }

    /// Run QEMU in network namespace `ns`.
    pub fn netns(mut self, ns: &str) -> GuestOpts {
        self.netns = Some(ns.into());
        self
    }

    /// `n` vCPUs.
    pub fn cpus(mut self, n: u32) -> GuestOpts {
        self.cpus = n.max(1);
        self
    }

    /// Kill the guest after `limit`.
    pub fn limit(mut self, limit: Duration) -> GuestOpts {
        self.limit = limit;
        self
    }

    /// QEMU's command line (without the program).
    pub fn qemu_args(&self) -> Result<Vec<String>> {
        let mut a: Vec<String> = [
            "-machine",
            "q35",
            "-cpu",
            "max",
            "-nodefaults",
            "-display",
            "none",
            "-monitor",
            "none",
            "-serial",
            "stdio",
            "-no-reboot",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        // Threads named for what they run (`CPU 0/TCG`), so a benchmark
        // can say where each vCPU ran.
        a.extend(["-name".into(), "guest,debug-threads=on".into()]);
        let m = self.mem_mib;
        a.extend(["-m".into(), format!("{m}")]);
        a.extend(["-smp".into(), format!("{}", self.cpus.max(1))]);
        // vhost-user needs the guest's memory in a file the switch can map:
        // a memfd, which QEMU seals against shrinking.
        a.extend([
            "-object".into(),
            format!("memory-backend-memfd,id=mem,size={m}M,share=on"),
            "-numa".into(),
            "node,memdev=mem".into(),
        ]);
        a.extend([
            "-kernel".into(),
            self.image.join("vmlinuz").display().to_string(),
            "-initrd".into(),
            self.image.join("initrd.gz").display().to_string(),
            "-append".into(),
            format!(
                "console=ttyS0 quiet panic=-1{}",
                self.ip
                    .as_ref()
                    .map(|ip| format!(" fp.ip={ip}"))
                    .unwrap_or_default()
            ),
        ]);
        let r = self.vhost_ring;
        if !(256..=1024).contains(&r) || !r.is_power_of_two() {
            return Err(GuestError::Rings(r));
        }
        for (i, n) in self.nics.iter().enumerate() {
            let model = match n.model {
                Model::VirtioNet => "virtio-net-pci",
                Model::E1000 => "e1000",
            };
            match &n.backend {
                Backend::VhostUser(sock) => {
                    if n.model != Model::VirtioNet {
                        return Err(GuestError::Nic {
                            index: i,
                            why: "vhost-user serves virtio-net only",
                        });
                    }
                    a.extend([
                        "-chardev".into(),
                        format!(
                            "socket,id=c{i},path={}{}",
                            sock.display(),
                            n.reconnect_ms
                                .map(|ms| format!(",reconnect-ms={ms}"))
                                .unwrap_or_default()
                        ),
                        "-netdev".into(),
                        match n.queues {
                            0 | 1 => format!("vhost-user,id=n{i},chardev=c{i}"),
                            q => format!("vhost-user,id=n{i},chardev=c{i},queues={q}"),
                        },
                    ]);
                }
                Backend::Tap(ifname) => {
                    a.extend([
                        "-netdev".into(),
                        format!("tap,id=n{i},ifname={ifname},script=no,downscript=no,vhost=off"),
                    ]);
                }
            }
            let rings = match n.backend {
                Backend::VhostUser(_) => {
                    format!(",rx_queue_size={r},tx_queue_size={r}", r = self.vhost_ring)
                }
                Backend::Tap(_) => String::new(),
            };
            // QEMU takes a vhost-user NIC's link down when its backend's
            // socket closes and up when it reconnects: the guest then
            // flushes its neighbours and drops what it sends meanwhile,
            // ARP requests included, which Linux repeats only a second
            // later. A NIC that reconnects hides the backend's restart
            // from the guest instead (no link status feature): what it
            // sends waits in its ring for the new backend.
            let link = if n.reconnect_ms.is_some() {
                ",status=off"
            } else {
                ""
            };
            // Several pairs: the device says so, with an MSI-X vector
            // per queue, one for the control queue and one for config.
            let mq = match (&n.backend, n.queues) {
                (Backend::VhostUser(_), q) if q > 1 => {
                    format!(",mq=on,vectors={}", 2 * u32::from(q) + 2)
                }
                _ => String::new(),
            };
            a.extend([
                "-device".into(),
                format!(
                    "{model},netdev=n{i},mac={}{mq}{rings}{link}{}",
                    n.mac, n.opts
                ),
            ]);
        }
        Ok(a)
    }
}

/// Whether QEMU and the guest image are here (the benchmarks that boot
/// guests say so and skip without them).
pub fn available() -> bool {
    missing().is_none()
}

/// What of QEMU and the guest image is not here, said for a person
/// (`None`: a guest can boot).
pub fn missing() -> Option<String> {
    missing_in(Path::new(IMAGE_DIR))
}

/// [`missing`], for a guest image in `dir` (one `scripts/guest-image.sh
/// DIR` built elsewhere than [`IMAGE_DIR`]).
pub fn missing_in(dir: &Path) -> Option<String> {
    for file in ["vmlinuz", "initrd.gz"] {
        let p = dir.join(file);
        if !p.exists() {
            return Some(format!(
                "the guest image's {} (scripts/guest-image.sh {})",
                p.display(),
                dir.display()
            ));
        }
    }
    let runs = Command::new(QEMU)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    (!runs).then(|| format!("the program `{QEMU}` on PATH (QEMU 10, scripts/setup.sh)"))
}

/// A running guest.
pub struct Guest {
    name: String,
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
    /// Everything the console printed, for error messages.
    console: Arc<Mutex<Vec<String>>>,
    done: Arc<AtomicBool>,
    /// The MAC of `eth0`, as the guest reported it.
    pub mac: String,
}

impl Guest {
    /// Start a guest and wait until it is ready (up to [`BOOT`]).
    pub fn boot(o: &GuestOpts) -> Result<Guest> {
        let mut g = Guest::start(o)?;
        g.wait_ready(BOOT)?;
        Ok(g)
    }

    /// Start QEMU from the calling thread (QEMU dies with it), without
    /// waiting for the guest: several guests boot side by side when each is
    /// started before any is waited for.
    pub fn start(o: &GuestOpts) -> Result<Guest> {
        for f in ["vmlinuz", "initrd.gz"] {
            if !o.image.join(f).exists() {
                return Err(GuestError::Image(o.image.join(f)));
            }
        }
        let mut cmd = Command::new(QEMU);
        cmd.args(o.qemu_args()?)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let ns = match &o.netns {
            Some(name) => Some(File::open(format!("/run/netns/{name}")).map_err(|source| {
                GuestError::Netns {
                    name: name.clone(),
                    source,
                }
            })?),
            None => None,
        };
        // SAFETY: between fork and exec the closure makes only system calls
        // (prctl, setsid, setns), which are async-signal-safe; it allocates
        // nothing and takes no lock. The namespace file stays open in the
        // parent until spawn returns.
        unsafe {
            cmd.pre_exec(move || {
                rustix::process::set_parent_process_death_signal(Some(
                    rustix::process::Signal::KILL,
                ))?;
                // A session of its own, as a VM host gives each guest a
                // group of its own: with the kernel's autogroups, guests
                // in their starter's session share one CPU weight with it
                // and with each other, so a busy receiving guest took the
                // sending guest's CPU even on another core.
                rustix::process::setsid()?;
                if let Some(f) = &ns {
                    rustix::thread::move_into_link_name_space(
                        f.as_fd(),
                        Some(rustix::thread::LinkNameSpaceType::Network),
                    )?;
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().map_err(GuestError::Spawn)?;
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(GuestError::Spawn(std::io::Error::other(
                "qemu's standard streams were not piped",
            )));
        };
        let console = Arc::new(Mutex::new(Vec::new()));
        let (tx, lines) = channel();
        let con = console.clone();
        std::thread::spawn(move || {
            for l in BufReader::new(stdout).lines() {
                let Ok(l) = l else { break };
                let l = l.trim_end_matches('\r').to_string();
                push(&con, l.clone());
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let con = console.clone();
        std::thread::spawn(move || {
            for l in BufReader::new(stderr).lines() {
                let Ok(l) = l else { break };
                push(&con, format!("[qemu] {l}"));
            }
        });
        // The watchdog: QEMU dies after its limit whatever its user does.
        let done = Arc::new(AtomicBool::new(false));
        let (pid, limit, d2) = (child.id(), o.limit, done.clone());
        std::thread::spawn(move || {
            let t = Instant::now();
            while t.elapsed() < limit {
                if d2.load(Ordering::Relaxed) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            if !d2.load(Ordering::Relaxed) {
                // The child is not reaped until the Guest is dropped, which
                // sets `done` first: the PID is still QEMU's.
                if let Some(pid) = rustix::process::Pid::from_raw(pid as i32) {
                    let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
                }
            }
        });
        Ok(Guest {
            name: o.name.clone(),
            child,
            stdin,
            lines,
            console,
            done,
            mac: String::new(),
        })
    }

    /// The guest's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Wait until the guest says it is ready (up to `within`).
    pub fn wait_ready(&mut self, within: Duration) -> Result<()> {
        let t = Instant::now();
        loop {
            match self.next_line(within.saturating_sub(t.elapsed()))? {
                Some(l) => {
                    if let Some(mac) = l.split(READY).nth(1) {
                        self.mac = mac.trim().to_string();
                        // The console echoes what arrives before /init has
                        // turned echo off: a first command soaks that up.
                        let left = within
                            .saturating_sub(t.elapsed())
                            .max(Duration::from_secs(10));
                        self.run("true", left)?;
                        return Ok(());
                    }
                }
                None => return Err(GuestError::NotReady(within, self.console_tail())),
            }
        }
    }

    fn next_line(&mut self, t: Duration) -> Result<Option<String>> {
        match self.lines.recv_timeout(t) {
            Ok(l) => Ok(Some(l)),
            Err(RecvTimeoutError::Timeout) => Ok(None),
            Err(RecvTimeoutError::Disconnected) => Err(GuestError::Exited(self.console_tail())),
        }
    }

    /// The console's last lines.
    pub fn console_tail(&self) -> String {
        let c = self.console.lock().unwrap_or_else(|e| e.into_inner());
        c.iter()
            .rev()
            .take(30)
            .rev()
            .cloned()
            .collect::<Vec<_>>()
            .join(" | ")
    }

    /// Run a shell command in the guest; returns its exit status and output.
    pub fn run(&mut self, cmd: &str, within: Duration) -> Result<(i32, String)> {
        // Lines from before (kernel messages) are not this command's.
        while self.lines.try_recv().is_ok() {}
        writeln!(self.stdin, "{cmd} 2>&1; echo {END}$?").map_err(GuestError::Write)?;
        self.stdin.flush().map_err(GuestError::Write)?;
        let t = Instant::now();
        let mut out = Vec::new();
        loop {
            match self.next_line(within.saturating_sub(t.elapsed()))? {
                Some(l) => {
                    if let Some(rc) = l.strip_prefix(END) {
                        return Ok((rc.trim().parse().unwrap_or(-1), out.join("\n")));
                    }
                    out.push(l);
                }
                None => return Err(GuestError::Timeout(cmd.into(), within, self.console_tail())),
            }
        }
    }

    /// Run a command that must succeed; returns its output.
    pub fn ok(&mut self, cmd: &str, within: Duration) -> Result<String> {
        let (status, output) = self.run(cmd, within)?;
        if status != 0 {
            return Err(GuestError::Failed {
                cmd: cmd.into(),
                status,
                output,
            });
        }
        Ok(output)
    }

    /// The interface whose MAC is `mac` (`eth0`, ...).
    pub fn iface(&mut self, mac: &str) -> Result<String> {
        let cmd = "for i in /sys/class/net/*; do echo ${i##*/} $(cat $i/address); done";
        let out = self.ok(cmd, Duration::from_secs(30))?;
        let want = mac.to_ascii_lowercase();
        out.lines()
            .filter_map(|l| l.split_once(' '))
            .find(|(_, m)| m.trim() == want)
            .map(|(i, _)| i.to_string())
            .ok_or(GuestError::Output {
                cmd: cmd.into(),
                output: format!("no interface with MAC {mac}: {out}"),
            })
    }

    /// A counter of `iface` (`rx_packets`, `tx_packets`, ...).
    pub fn stat(&mut self, iface: &str, name: &str) -> Result<u64> {
        let cmd = format!("cat /sys/class/net/{iface}/statistics/{name}");
        let out = self.ok(&cmd, Duration::from_secs(30))?;
        number(&out).ok_or(GuestError::Output { cmd, output: out })
    }

    /// What `/proc/interrupts` calls `iface`'s interrupts: `virtioN-` for
    /// a virtio NIC (one line per queue vector), else the interface's name
    /// (the e1000's one line).
    pub fn irq_name(&mut self, iface: &str) -> Result<String> {
        let cmd = format!("basename $(readlink /sys/class/net/{iface}/device)");
        let out = self.ok(&cmd, Duration::from_secs(30))?;
        let dev = out.lines().last().unwrap_or_default().trim().to_string();
        Ok(if dev.starts_with("virtio") {
            format!("{dev}-")
        } else {
            iface.to_string()
        })
    }

    /// Interrupts taken on the lines whose name contains `pattern` (all
    /// CPUs), from `/proc/interrupts`.
    pub fn interrupts(&mut self, pattern: &str) -> Result<u64> {
        let out = self.ok("cat /proc/interrupts", Duration::from_secs(30))?;
        Ok(interrupts_in(&out, pattern))
    }

    /// Ping `dst` `count` times, `interval_ms` apart; what came back.
    pub fn ping(&mut self, dst: &str, count: u32, interval_ms: u32) -> Result<Ping> {
        let secs = f64::from(interval_ms) / 1000.0;
        let cmd = format!("ping -c {count} -i {secs} -W 2 {dst}");
        let within = Duration::from_millis(u64::from(count) * u64::from(interval_ms.max(200)))
            + Duration::from_secs(30);
        // A ping that lost replies exits 1: what came back is still read.
        let (_, out) = self.run(&cmd, within)?;
        Ok(parse_ping(count, &out))
    }

    /// Send `count` frames of `size` bytes from `iface` to `dst_mac` /
    /// `dst_ip` with the kernel's pktgen, `burst` frames per doorbell
    /// (xmit_more); returns pktgen's result. Bounded by `within`.
    #[allow(clippy::too_many_arguments)]
    pub fn pktgen(
        &mut self,
        iface: &str,
        count: u64,
        size: u32,
        burst: u32,
        dst_mac: &str,
        dst_ip: &str,
        within: Duration,
    ) -> Result<Pktgen> {
        let params = pktgen_params(count, size, burst, dst_mac, dst_ip);
        let mut r = self.pktgen_threads(&[PktgenThread::only(iface, params)], within)?;
        // One thread, one result: pktgen_threads returns one per thread or
        // an error.
        Ok(r.remove(0))
    }

    /// Use `n` queue pairs of `iface` (`ethtool -L IFACE combined N`: the
    /// driver tells QEMU, which enables and disables the pairs' rings in
    /// the backend); returns what `ethtool -l` reports afterwards.
    pub fn set_queues(&mut self, iface: &str, n: u16) -> Result<String> {
        let short = Duration::from_secs(30);
        self.ok(&format!("ethtool -L {iface} combined {n}"), short)?;
        self.ok(&format!("ethtool -l {iface}"), short)
    }

    /// [`Guest::pktgen`] from `threads` pktgen threads at once (one per
    /// vCPU, `kpktgend_K`), thread `K` sending `count` frames on transmit
    /// queue `K` of `iface` (`IFACE@K`, `queue_map_min/max K`) with UDP
    /// source port `9 + K` (a flow per queue); returns each thread's
    /// result, in thread order.
    #[allow(clippy::too_many_arguments)]
    pub fn pktgen_queues(
        &mut self,
        iface: &str,
        threads: u32,
        count: u64,
        size: u32,
        burst: u32,
        dst_mac: &str,
        dst_ip: &str,
        within: Duration,
    ) -> Result<Vec<Pktgen>> {
        let params = pktgen_params(count, size, burst, dst_mac, dst_ip);
        let threads: Vec<PktgenThread> = (0..threads)
            .map(|k| PktgenThread::queue(iface, k, params.clone()))
            .collect();
        self.pktgen_threads(&threads, within)
    }

    /// Runs pktgen with `threads` set up as [`pktgen_setup`] says, started
    /// together and bounded by `within`; returns each thread's result, in
    /// order, or an error naming the first thread that sent nothing (a NIC
    /// without carrier, say: pktgen starts and sends nothing).
    fn pktgen_threads(
        &mut self,
        threads: &[PktgenThread],
        within: Duration,
    ) -> Result<Vec<Pktgen>> {
        let short = Duration::from_secs(30);
        for (cmd, checked) in pktgen_setup(threads) {
            if checked {
                self.ok(&cmd, short)?;
            } else {
                self.run(&cmd, short)?;
            }
        }
        self.ok(&format!("echo start > {PKTGEN}/pgctrl"), within)?;
        let mut out = Vec::new();
        for t in threads {
            let cmd = format!("cat {PKTGEN}/{}", t.dev);
            let text = self.ok(&cmd, short)?;
            let r = parse_pktgen(&text);
            if r.sent == 0 {
                return Err(GuestError::Output { cmd, output: text });
            }
            out.push(r);
        }
        Ok(out)
    }

    /// Start an iperf3 server for one test (`-1`), in the background,
    /// writing its JSON report to a file in the guest; returns once it
    /// listens (port 5201), at most `within` later.
    pub fn iperf3_server(&mut self, within: Duration) -> Result<()> {
        let secs = within.as_secs().max(1) * 10;
        self.ok(
            &format!("rm -f {IPERF3_LOG}; iperf3 -s -1 -D -J --logfile {IPERF3_LOG}"),
            within,
        )?;
        // 5201 is 0x1451 in /proc/net/tcp*, state 0A is LISTEN (sockets of
        // an earlier test, closing, have the port too). iperf3 listens on
        // IPv6's any address, which takes IPv4 too.
        let listening = "awk '$2 ~ /:1451$/ && $4 == \"0A\"' /proc/net/tcp /proc/net/tcp6";
        let cmd = format!(
            "i=0; while [ -z \"$({listening})\" ] && [ $i -lt {secs} ]; do sleep 0.1; i=$((i+1)); done; echo listening $({listening} | wc -l)"
        );
        let out = self.run(&cmd, within + Duration::from_secs(30))?.1;
        let n = out
            .lines()
            .filter_map(|l| l.strip_prefix("listening "))
            .find_map(|n| n.trim().parse::<u32>().ok());
        if n.unwrap_or(0) == 0 {
            return Err(GuestError::Output {
                cmd,
                output: format!("iperf3 does not listen on 5201: {out}"),
            });
        }
        Ok(())
    }

    /// Run iperf3's client against `server` for `secs` seconds with
    /// `streams` parallel TCP connections; returns its summary (the
    /// client's own count of bytes sent, and the server's count of bytes
    /// received as the server reported it back). Killed in the guest
    /// after `secs` + 30 s; bounded here by `within`.
    pub fn iperf3_client(
        &mut self,
        server: &str,
        secs: u32,
        streams: u32,
        within: Duration,
    ) -> Result<Iperf> {
        let cmd = format!(
            "timeout {} iperf3 -c {server} -t {secs} -P {streams} -i 0 -J --connect-timeout 10000",
            secs + 30
        );
        let (status, out) = self.run(&cmd, within)?;
        let r = parse_iperf3(&out);
        match r {
            Some(r) if status == 0 => Ok(r),
            _ => Err(GuestError::Failed {
                cmd,
                status,
                output: out,
            }),
        }
    }

    /// The report of the one test [`Guest::iperf3_server`] served (waits
    /// up to `within` for the server to finish writing it).
    pub fn iperf3_server_result(&mut self, within: Duration) -> Result<Iperf> {
        let secs = within.as_secs().max(1) * 10;
        let cmd = format!(
            "i=0; while pidof iperf3 >/dev/null && [ $i -lt {secs} ]; do sleep 0.1; i=$((i+1)); done; cat {IPERF3_LOG}"
        );
        let out = self.ok(&cmd, within + Duration::from_secs(30))?;
        parse_iperf3(&out).ok_or(GuestError::Output { cmd, output: out })
    }

    /// The offloads the kernel turned on for `iface` (`ethtool -k`), which
    /// for virtio-net are those its backend negotiated.
    pub fn offloads(&mut self, iface: &str) -> Result<Offloads> {
        let cmd = format!("ethtool -k {iface}");
        let out = self.ok(&cmd, Duration::from_secs(30))?;
        Ok(parse_offloads(&out))
    }

    /// Reload the e1000 driver with `InterruptThrottleRate` = `itr` (0:
    /// off, an interrupt per event; 3: the driver's default, dynamic
    /// throttling; 100 to 100000: at most that many interrupts a second),
    /// then bring the NIC whose MAC is `mac` up again and wait for its
    /// carrier; returns its interface. QEMU 10's e1000 has no `mitigation`
    /// switch of its own: it honours the throttling register the driver
    /// writes.
    pub fn e1000_throttle(&mut self, itr: u32, mac: &str) -> Result<String> {
        let long = Duration::from_secs(60);
        self.ok("rmmod e1000", long)?;
        self.ok(
            &format!("insmod /lib/modules/e1000.ko InterruptThrottleRate={itr}"),
            long,
        )?;
        let iface = self.iface(mac)?;
        self.ok(&format!("ip link set {iface} up"), long)?;
        self.wait_carrier(&iface, Duration::from_secs(20))?;
        Ok(iface)
    }

    /// Wait until `iface` has a carrier (an e1000's link comes up about a
    /// second after it is set up; pktgen sends nothing before).
    pub fn wait_carrier(&mut self, iface: &str, within: Duration) -> Result<()> {
        let secs = within.as_secs().max(1) * 10;
        let cmd = format!(
            "i=0; while [ \"$(cat /sys/class/net/{iface}/carrier 2>/dev/null)\" != 1 ] && [ $i -lt {secs} ]; do sleep 0.1; i=$((i+1)); done; cat /sys/class/net/{iface}/carrier"
        );
        let out = self.ok(&cmd, within + Duration::from_secs(30))?;
        if out.trim().lines().last() != Some("1") {
            return Err(GuestError::Output {
                cmd,
                output: format!("no carrier on {iface}: {out}"),
            });
        }
        Ok(())
    }

    /// Kill QEMU now (its vhost-user port sees the frontend vanish).
    pub fn kill(&mut self) {
        self.done.store(true, Ordering::Relaxed);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// QEMU's PID.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Guest {
    fn drop(&mut self) {
        self.kill();
    }
}

fn push(console: &Mutex<Vec<String>>, l: String) {
    let mut c = console.lock().unwrap_or_else(|e| e.into_inner());
    // Bounded: a guest printing without end keeps only its last lines.
    if c.len() >= 2000 {
        c.drain(..1000);
    }
    c.push(l);
}

/// The last number on the last non-empty line.
fn number(out: &str) -> Option<u64> {
    out.lines()
        .rev()
        .find(|l| !l.trim().is_empty())?
        .split_whitespace()
        .last()?
        .parse()
        .ok()
}

/// Interrupts on the lines of `/proc/interrupts` whose name contains
/// `pattern`, summed over the CPU columns.
pub fn interrupts_in(proc_interrupts: &str, pattern: &str) -> u64 {
    let mut lines = proc_interrupts.lines();
    let cpus = lines
        .next()
        .map(|h| {
            h.split_whitespace()
                .filter(|c| c.starts_with("CPU"))
                .count()
        })
        .unwrap_or(1);
    lines
        .filter(|l| l.contains(pattern))
        .map(|l| {
            l.split_whitespace()
                .skip(1)
                .take(cpus)
                .filter_map(|n| n.parse::<u64>().ok())
                .sum::<u64>()
        })
        .sum()
}

/// What a ping got back.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Ping {
    /// Echo requests sent.
    pub sent: u32,
    /// Replies received.
    pub received: u32,
    /// Each reply's round-trip time, milliseconds.
    pub rtt_ms: Vec<f64>,
}

impl Ping {
    /// The median round-trip time, milliseconds.
    pub fn p50_ms(&self) -> Option<f64> {
        let mut v = self.rtt_ms.clone();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        Some(v[v.len() / 2])
    }
}

/// Read busybox ping's output.
pub fn parse_ping(sent: u32, out: &str) -> Ping {
    let rtt_ms: Vec<f64> = out
        .lines()
        .filter_map(|l| l.split("time=").nth(1))
        .filter_map(|t| t.split_whitespace().next()?.parse().ok())
        .collect();
    Ping {
        sent,
        received: rtt_ms.len() as u32,
        rtt_ms,
    }
}

/// pktgen's control files in the guest.
const PKTGEN: &str = "/proc/net/pktgen";

/// One pktgen thread of a run: `kpktgend_{thread}` sends on `dev` (an
/// interface, or `IFACE@K` for a device of its own on the same interface)
/// with `params` written to the device, a line each.
struct PktgenThread {
    thread: u32,
    dev: String,
    params: Vec<String>,
}

impl PktgenThread {
    /// The one thread of [`Guest::pktgen`]: `kpktgend_0` on `iface` itself.
    fn only(iface: &str, params: Vec<String>) -> PktgenThread {
        PktgenThread {
            thread: 0,
            dev: iface.to_string(),
            params,
        }
    }

    /// Thread `k` of [`Guest::pktgen_queues`]: `kpktgend_K` on `IFACE@K`,
    /// sending on transmit queue `k` from UDP port `9 + k`.
    fn queue(iface: &str, k: u32, mut params: Vec<String>) -> PktgenThread {
        params.extend([
            format!("queue_map_min {k}"),
            format!("queue_map_max {k}"),
            format!("udp_src_min {}", 9 + k),
            format!("udp_src_max {}", 9 + k),
        ]);
        PktgenThread {
            thread: k,
            dev: format!("{iface}@{k}"),
            params,
        }
    }
}

/// The device parameters every pktgen run of [`Guest`] writes: `count`
/// frames of `size` bytes, `burst` a doorbell, no delay, to `dst_mac` /
/// `dst_ip`.
fn pktgen_params(count: u64, size: u32, burst: u32, dst_mac: &str, dst_ip: &str) -> Vec<String> {
    vec![
        format!("count {count}"),
        format!("pkt_size {size}"),
        format!("burst {burst}"),
        "delay 0".to_string(),
        format!("dst_mac {dst_mac}"),
        format!("dst {dst_ip}"),
    ]
}

/// The shell commands that set `threads` up, in order, each with whether
/// its exit status is checked: every thread's devices removed first (not
/// checked: what matters is that the `add_device` after it, which is
/// checked, finds its device free), then each thread's device added and
/// its parameters written.
fn pktgen_setup(threads: &[PktgenThread]) -> Vec<(String, bool)> {
    let mut cmds: Vec<(String, bool)> = threads
        .iter()
        .map(|t| {
            let k = t.thread;
            (
                format!("echo rem_device_all > {PKTGEN}/kpktgend_{k}"),
                false,
            )
        })
        .collect();
    for t in threads {
        let (k, dev) = (t.thread, &t.dev);
        cmds.push((
            format!("echo 'add_device {dev}' > {PKTGEN}/kpktgend_{k}"),
            true,
        ));
        for c in &t.params {
            cmds.push((format!("echo '{c}' > {PKTGEN}/{dev}"), true));
        }
    }
    cmds
}

/// The result of one pktgen run in a guest.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Pktgen {
    /// Packets pktgen sent.
    pub sent: u64,
    /// Its rate (packets per second), as it reports it.
    pub pps: u64,
    /// Microseconds the run took.
    pub usec: u64,
    /// Transmit errors it counted.
    pub errors: u64,
}

/// Read pktgen's "Result:" lines.
pub fn parse_pktgen(out: &str) -> Pktgen {
    let mut r = Pktgen::default();
    let num = |s: &str| -> u64 {
        s.chars()
            .take_while(|c| c.is_ascii_digit())
            .collect::<String>()
            .parse()
            .unwrap_or(0)
    };
    let mut in_result = false;
    for l in out.lines() {
        let l = l.trim();
        if let Some(rest) = l.strip_prefix("Result: OK: ") {
            in_result = true;
            r.usec = num(rest);
            if let Some(i) = rest.find("usec, ") {
                r.sent = num(&rest[i + 6..]);
            }
        } else if in_result {
            if let Some(i) = l.find("pps") {
                r.pps = num(l[..i].trim());
            }
            if let Some(i) = l.find("errors: ") {
                r.errors = num(&l[i + 8..]);
            }
        }
    }
    r
}

/// One iperf3 test's totals, from its `-J` report.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Iperf {
    /// Bytes the sender wrote (`end.sum_sent.bytes`).
    pub sent_bytes: u64,
    /// Bytes the receiver read (`end.sum_received.bytes`).
    pub received_bytes: u64,
    /// The receiver's seconds (`end.sum_received.seconds`).
    pub seconds: f64,
    /// The receiver's rate, bits per second.
    pub received_bps: f64,
    /// TCP retransmissions the sender counted (0 in a server's report).
    pub retransmits: u64,
    /// Parallel streams.
    pub streams: u32,
}

impl Iperf {
    /// The receiver's rate, Gbit/s.
    pub fn gbps(&self) -> f64 {
        self.received_bps / 1e9
    }
}

/// Read iperf3's `-J` report (client's or server's); `None` if it is not
/// one, holds an error, or has no totals.
pub fn parse_iperf3(out: &str) -> Option<Iperf> {
    // The console may carry lines before the report (kernel messages).
    let start = out.find('{')?;
    let end = out.rfind('}')?;
    let v: serde_json::Value = serde_json::from_str(out.get(start..=end)?).ok()?;
    if v.get("error").is_some() {
        return None;
    }
    let e = v.get("end")?;
    let sent = e.get("sum_sent")?;
    let recv = e.get("sum_received")?;
    let u = |x: &serde_json::Value, k: &str| x.get(k).and_then(serde_json::Value::as_u64);
    let f = |x: &serde_json::Value, k: &str| x.get(k).and_then(serde_json::Value::as_f64);
    Some(Iperf {
        sent_bytes: u(sent, "bytes")?,
        received_bytes: u(recv, "bytes")?,
        seconds: f(recv, "seconds")?,
        received_bps: f(recv, "bits_per_second")?,
        retransmits: u(sent, "retransmits").unwrap_or(0),
        streams: v
            .pointer("/start/test_start/num_streams")
            .and_then(serde_json::Value::as_u64)
            .unwrap_or(1) as u32,
    })
}

/// What a guest NIC offloads, as `ethtool -k` shows it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Offloads {
    /// `tx-checksumming`: the guest leaves checksums to the backend.
    pub tx_csum: bool,
    /// `tcp-segmentation-offload`: the guest hands over TCP segments
    /// larger than the MTU.
    pub tso: bool,
    /// `rx-checksumming`.
    pub rx_csum: bool,
    /// `generic-receive-offload`.
    pub gro: bool,
}

/// Read `ethtool -k`'s `name: on|off` lines.
pub fn parse_offloads(out: &str) -> Offloads {
    let on = |name: &str| {
        out.lines().any(|l| {
            l.trim()
                .strip_prefix(name)
                .and_then(|r| r.strip_prefix(':'))
                .is_some_and(|r| r.trim_start().starts_with("on"))
        })
    };
    Offloads {
        tx_csum: on("tx-checksumming"),
        tso: on("tcp-segmentation-offload"),
        rx_csum: on("rx-checksumming"),
        gro: on("generic-receive-offload"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_pktgen_results() {
        let out = "Params: count 100000  min_pkt_size: 60  max_pkt_size: 60\n\
                   Current:\n     pkts-sofar: 100000  errors: 0\n\
                   Result: OK: 253941(c253676+d264) usec, 100000 (60byte,0frags)\n  \
                   393791pps 189Mb/sec (189019680bps) errors: 3\n";
        assert_eq!(
            parse_pktgen(out),
            Pktgen {
                sent: 100000,
                pps: 393791,
                usec: 253941,
                errors: 3
            }
        );
    }

    #[test]
    fn reads_ping_and_interrupts() {
        let out = "PING 10.9.0.2 (10.9.0.2): 56 data bytes\n\
                   64 bytes from 10.9.0.2: seq=0 ttl=64 time=3.101 ms\n\
                   64 bytes from 10.9.0.2: seq=2 ttl=64 time=1.250 ms\n\
                   64 bytes from 10.9.0.2: seq=3 ttl=64 time=2.000 ms\n\n\
                   --- 10.9.0.2 ping statistics ---\n\
                   4 packets transmitted, 3 packets received, 25% packet loss\n";
        let p = parse_ping(4, out);
        assert_eq!((p.sent, p.received), (4, 3));
        assert_eq!(p.p50_ms(), Some(2.0));
        let irq = "           CPU0       \n\
                   24:        120   PCI-MSI 49152-edge      virtio0-input.0\n\
                   25:         30   PCI-MSI 49153-edge      virtio0-output.0\n\
                   11:       5000   IO-APIC  11-fasteoi   eth1\n";
        assert_eq!(interrupts_in(irq, "virtio0-"), 150);
        assert_eq!(interrupts_in(irq, "eth1"), 5000);
    }

    #[test]
    fn reads_iperf3_reports_and_offloads() {
        let client = r#"noise line
{"start": {"test_start": {"num_streams": 4}},
 "intervals": [],
 "end": {"sum_sent": {"seconds": 3.0, "bytes": 120000000, "bits_per_second": 320000000.0, "retransmits": 7},
         "sum_received": {"seconds": 3.01, "bytes": 119000000, "bits_per_second": 316000000.0}}}"#;
        let r = parse_iperf3(client).unwrap();
        assert_eq!(
            (r.sent_bytes, r.received_bytes, r.retransmits, r.streams),
            (120_000_000, 119_000_000, 7, 4)
        );
        assert!((r.gbps() - 0.316).abs() < 1e-9);
        let failed = r#"{"start": {}, "intervals": [], "end": {}, "error": "unable to connect to server: Connection refused"}"#;
        assert_eq!(parse_iperf3(failed), None);
        assert_eq!(parse_iperf3("iperf3: error - unable to connect"), None);
        let k = "Features for eth0:\nrx-checksumming: on [fixed]\ntx-checksumming: off\n\ttx-checksum-ipv4: off [fixed]\ntcp-segmentation-offload: on\ngeneric-receive-offload: on\n";
        assert_eq!(
            parse_offloads(k),
            Offloads {
                tx_csum: false,
                tso: true,
                rx_csum: true,
                gro: true
            }
        );
    }

    #[test]
    fn a_vhost_user_nic_must_be_virtio() {
        let mut n = Nic::vhost_user(Path::new("/tmp/x.sock"), "52:54:00:00:00:01");
        n.model = Model::E1000;
        let o = GuestOpts::new("t", vec![n]);
        assert!(matches!(
            o.qemu_args(),
            Err(GuestError::Nic { index: 0, .. })
        ));
        let o = GuestOpts::new(
            "t",
            vec![
                Nic::vhost_user(Path::new("/tmp/x.sock"), "52:54:00:00:00:01"),
                Nic::e1000("fpe0", "52:54:00:00:00:02"),
            ],
        )
        .ip("10.9.0.1/24");
        let a = o.qemu_args().unwrap().join(" ");
        assert!(a.contains("vhost-user,id=n0,chardev=c0"), "{a}");
        assert!(a.contains("e1000,netdev=n1,mac=52:54:00:00:00:02"), "{a}");
        assert!(a.contains("fp.ip=10.9.0.1/24"), "{a}");
        assert!(a.contains("memory-backend-memfd"), "{a}");
        assert!(!a.contains("reconnect"), "{a}");
        // The vhost-user NIC gets 1024-entry rings, the e1000 no such option.
        assert!(
            a.contains("virtio-net-pci,netdev=n0,mac=52:54:00:00:00:01,rx_queue_size=1024,tx_queue_size=1024"),
            "{a}"
        );
        let small = o.clone().vhost_ring(256).qemu_args().unwrap().join(" ");
        assert!(
            small.contains("rx_queue_size=256,tx_queue_size=256"),
            "{small}"
        );
        assert!(matches!(
            o.clone().vhost_ring(2048).qemu_args(),
            Err(GuestError::Rings(2048))
        ));
        assert!(matches!(
            o.clone().vhost_ring(768).qemu_args(),
            Err(GuestError::Rings(768))
        ));
        let n = Nic::vhost_user(Path::new("/tmp/x.sock"), "52:54:00:00:00:01").reconnect(100);
        let a = GuestOpts::new("t", vec![n]).qemu_args().unwrap().join(" ");
        assert!(
            a.contains("socket,id=c0,path=/tmp/x.sock,reconnect-ms=100"),
            "{a}"
        );
        // A reconnecting NIC shows the guest no link status, so a backend
        // restart takes no link down; the others keep QEMU's default.
        assert!(a.contains("tx_queue_size=1024,status=off"), "{a}");
        let plain = o.qemu_args().unwrap().join(" ");
        assert!(!plain.contains("status=off"), "{plain}");
        // One pair and one vCPU unless asked.
        assert!(a.contains("-smp 1"), "{a}");
        assert!(!a.contains("queues=") && !a.contains("mq=on"), "{a}");
    }

    #[test]
    fn several_queue_pairs_ask_qemu_for_them_and_their_vectors() {
        let n = Nic::vhost_user(Path::new("/tmp/x.sock"), "52:54:00:00:00:01").queues(2);
        let a = GuestOpts::new(
            "t",
            vec![n, Nic::tap("fpt0", "52:54:00:00:00:02").queues(4)],
        )
        .cpus(2)
        .qemu_args()
        .unwrap()
        .join(" ");
        assert!(a.contains("-smp 2"), "{a}");
        assert!(a.contains("vhost-user,id=n0,chardev=c0,queues=2"), "{a}");
        assert!(
            a.contains("virtio-net-pci,netdev=n0,mac=52:54:00:00:00:01,mq=on,vectors=6"),
            "{a}"
        );
        // Only vhost-user NICs take queue pairs here.
        assert!(
            a.ends_with("virtio-net-pci,netdev=n1,mac=52:54:00:00:00:02"),
            "{a}"
        );
    }

    /// The set-up commands of `Guest::pktgen` (`queues` None) and of
    /// `Guest::pktgen_queues`, written out as each sent them before the
    /// two shared their code: (command, whether its status is checked).
    fn pktgen_setup_before(iface: &str, queues: Option<u32>) -> Vec<(String, bool)> {
        let p = "/proc/net/pktgen";
        let common = |cmds: &mut Vec<(String, bool)>, dev: &str| {
            for c in [
                "count 1000",
                "pkt_size 60",
                "burst 32",
                "delay 0",
                "dst_mac 52:54:00:00:00:02",
                "dst 10.0.0.2",
            ] {
                cmds.push((format!("echo '{c}' > {p}/{dev}"), true));
            }
        };
        let mut cmds = Vec::new();
        let Some(threads) = queues else {
            cmds.push((format!("echo rem_device_all > {p}/kpktgend_0"), false));
            cmds.push((format!("echo 'add_device {iface}' > {p}/kpktgend_0"), true));
            common(&mut cmds, iface);
            return cmds;
        };
        for k in 0..threads {
            cmds.push((format!("echo rem_device_all > {p}/kpktgend_{k}"), false));
        }
        for k in 0..threads {
            let dev = format!("{iface}@{k}");
            cmds.push((format!("echo 'add_device {dev}' > {p}/kpktgend_{k}"), true));
            common(&mut cmds, &dev);
            for c in [
                format!("queue_map_min {k}"),
                format!("queue_map_max {k}"),
                format!("udp_src_min {}", 9 + k),
                format!("udp_src_max {}", 9 + k),
            ] {
                cmds.push((format!("echo '{c}' > {p}/{dev}"), true));
            }
        }
        cmds
    }

    #[test]
    fn pktgen_is_set_up_with_the_commands_it_sent_before() {
        let params = || pktgen_params(1000, 60, 32, "52:54:00:00:00:02", "10.0.0.2");
        assert_eq!(
            pktgen_setup(&[PktgenThread::only("eth0", params())]),
            pktgen_setup_before("eth0", None)
        );
        for n in [1, 2, 4] {
            let threads: Vec<PktgenThread> = (0..n)
                .map(|k| PktgenThread::queue("eth0", k, params()))
                .collect();
            assert_eq!(
                pktgen_setup(&threads),
                pktgen_setup_before("eth0", Some(n)),
                "{n} threads"
            );
        }
    }
}
