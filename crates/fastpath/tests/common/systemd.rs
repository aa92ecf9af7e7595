//! A private systemd, to run the shipped service units for real on a
//! machine whose PID 1 is not systemd (or is, and must not be touched).
//!
//! [`Systemd::boot`] starts systemd as PID 1 of new PID, mount, UTS and
//! IPC namespaces, inside a given network namespace, over an overlay of /
//! whose writes land in a tmpfs, with the units that touch kernel-wide
//! state masked (`tests/scripts/systemd-boot.sh`, run as it is: a systemd booted
//! without the overlay and the masks ran systemd-tmpfiles and wiped the
//! host's /tmp, applied sysctls and triggered udev). Only what is started
//! in it runs (journald, and the units a test starts); its /tmp and /run
//! are its own; packages installed in it (`dpkg -i`) land in its tmpfs.
//!
//! Dropping the handle kills its PID 1 with SIGKILL, which takes every
//! process of its PID namespace and, with the last of them, its mounts. It
//! is also killed when the thread that booted it ends (the parent-death
//! signal of the `unshare` that holds it), so a test that panics leaves
//! nothing running. Every wait here is bounded.
//!
//! Left behind on the host, by the design of systemd on cgroup v1 without
//! a cgroup namespace: the empty cgroups it creates (`init.scope`,
//! `system.slice`), which the next private systemd uses again.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use lab::netns::{self, Netns};
use lab::{Error, Result};

/// The boot script: the recipe, run as the first process of the new
/// namespaces (kept as a file so that it can be read and run by hand).
const BOOT_SCRIPT: &str = include_str!("../scripts/systemd-boot.sh");

/// How long the private systemd may take to boot.
const BOOT_TIMEOUT: Duration = Duration::from_secs(60);

/// A running private systemd; killed when dropped.
pub struct Systemd {
    /// `unshare`, whose child is the private PID 1.
    holder: Child,
    /// The private PID 1, as this machine numbers it.
    pid1: i32,
    /// Scratch directory: the boot script, the tmpfs mount point, the
    /// console log.
    dir: PathBuf,
}

impl Systemd {
    /// Boots a private systemd in `netns`, with the host directories
    /// `binds` visible in it at the same paths (everything else it sees
    /// is the overlay of / and its own /tmp and /run). `tag` makes its
    /// scratch directory's name unique. Returns once systemd says the
    /// system is running.
    pub fn boot(netns: &Netns, binds: &[&Path], tag: &str) -> Result<Systemd> {
        let dir = std::env::temp_dir().join(format!("fastpath-systemd-{tag}"));
        let _ = std::fs::remove_dir_all(&dir);
        let state = dir.join("state");
        std::fs::create_dir_all(&state).map_err(Error::io(state.display()))?;
        let script = dir.join("systemd-boot.sh");
        std::fs::write(&script, BOOT_SCRIPT).map_err(Error::io(script.display()))?;
        let console = dir.join("console.log");
        let log = std::fs::File::create(&console).map_err(Error::io(console.display()))?;
        let err = log.try_clone().map_err(Error::io(console.display()))?;
        let mut c = netns.command("setpriv");
        // setpriv: unshare is killed when the thread that booted it ends;
        // unshare: its child, the private PID 1, is killed when it dies.
        c.args(["--pdeathsig", "KILL", "unshare"])
            .args(["--pid", "--mount", "--uts", "--ipc", "--kill-child=SIGKILL"])
            .arg("bash")
            .arg(&script)
            .arg(&state)
            .args(binds)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err);
        let holder = c.spawn().map_err(|source| {
            Error::Netns(netns::Error::Spawn {
                program: format!("a private systemd in {}", netns.name()),
                source,
            })
        })?;
        let mut s = Systemd {
            pid1: 0,
            holder,
            dir,
        };
        s.pid1 = s.wait_for_pid1()?;
        s.wait_running()?;
        // The recipe boots it logging to the console (/dev/console, the
        // host's): from here on its own messages (state changes, watchdog
        // timeouts, restarts) go to its journal, beside its units' logs.
        s.systemctl(&["log-target", "journal"])?;
        Ok(s)
    }

    /// The private PID 1: `unshare`'s only child, once it runs systemd.
    fn wait_for_pid1(&mut self) -> Result<i32> {
        let holder = self.holder.id();
        let deadline = Instant::now() + BOOT_TIMEOUT;
        loop {
            let children =
                std::fs::read_to_string(format!("/proc/{holder}/task/{holder}/children"))
                    .unwrap_or_default();
            if let Some(pid) = children
                .split_whitespace()
                .next()
                .and_then(|p| p.parse::<i32>().ok())
            {
                let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
                if exe.ends_with("systemd") {
                    return Ok(pid);
                }
            }
            if let Ok(Some(status)) = self.holder.try_wait() {
                return Err(self.failed(&format!("the boot script ended ({status})")));
            }
            if Instant::now() > deadline {
                return Err(self.failed("systemd did not start"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until `systemctl is-system-running` says running (or
    /// degraded: a unit failed, which the caller will see in its own).
    fn wait_running(&self) -> Result<()> {
        let deadline = Instant::now() + BOOT_TIMEOUT;
        loop {
            let state = self
                .exec(&["systemctl", "is-system-running"])
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
                .unwrap_or_default();
            if state == "running" || state == "degraded" {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(self.failed(&format!("still {state:?} after {BOOT_TIMEOUT:?}")));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// An error that says what the private systemd printed.
    fn failed(&self, what: &str) -> Error {
        Error::Netns(netns::Error::Failed {
            command: format!("boot a private systemd: {what}"),
            stderr: self.console(),
        })
    }

    /// The private PID 1, as this machine numbers it.
    pub fn pid1(&self) -> i32 {
        self.pid1
    }

    /// The private root as this machine sees it (`/proc/PID/root`): write
    /// files into the private system through it.
    pub fn root(&self) -> PathBuf {
        PathBuf::from(format!("/proc/{}/root", self.pid1))
    }

    /// Writes `contents` to `path` inside the private system (directories
    /// made as needed).
    pub fn write(&self, path: &str, contents: &str) -> Result<()> {
        let p = self.root().join(path.trim_start_matches('/'));
        if let Some(d) = p.parent() {
            std::fs::create_dir_all(d).map_err(Error::io(d.display()))?;
        }
        std::fs::write(&p, contents).map_err(Error::io(p.display()))
    }

    /// Runs a command inside the private system (all its namespaces), up
    /// to 60 s; its output, whatever its exit status.
    pub fn exec(&self, args: &[&str]) -> Result<Output> {
        let pid = self.pid1.to_string();
        let mut c = Command::new("timeout");
        c.args(["60", "nsenter", "-t", &pid, "-m", "-u", "-i", "-n", "-p"])
            .args(args)
            .stdin(Stdio::null());
        c.output().map_err(|source| {
            Error::Netns(netns::Error::Spawn {
                program: format!("{args:?} in the private systemd"),
                source,
            })
        })
    }

    /// Runs a command inside; its stdout, or an error with its stderr if
    /// it failed.
    pub fn run(&self, args: &[&str]) -> Result<String> {
        let out = self.exec(args)?;
        if !out.status.success() {
            return Err(Error::Netns(netns::Error::Failed {
                command: args.join(" "),
                stderr: format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ),
            }));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `systemctl ARGS` inside; its output, or an error if it failed.
    pub fn systemctl(&self, args: &[&str]) -> Result<String> {
        let mut all = vec!["systemctl", "--no-pager"];
        all.extend_from_slice(args);
        self.run(&all)
    }

    /// A unit's main process as this machine numbers it (for signals from
    /// here), or `None` when it has none.
    pub fn main_pid(&self, unit: &str) -> Result<Option<i32>> {
        let inner: i32 = self
            .systemctl(&["show", "-p", "MainPID", "--value", unit])?
            .trim()
            .parse()
            .unwrap_or(0);
        if inner == 0 {
            return Ok(None);
        }
        Ok(self.host_pid(inner))
    }

    /// The host's number of the private namespace's process `inner`: the
    /// process of this PID namespace whose NSpid ends with it.
    fn host_pid(&self, inner: i32) -> Option<i32> {
        let ns = std::fs::read_link(format!("/proc/{}/ns/pid", self.pid1)).ok()?;
        std::fs::read_dir("/proc")
            .ok()?
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
            .find(|pid| {
                std::fs::read_link(format!("/proc/{pid}/ns/pid"))
                    .ok()
                    .as_ref()
                    == Some(&ns)
                    && std::fs::read_to_string(format!("/proc/{pid}/status"))
                        .ok()
                        .and_then(|s| {
                            s.lines()
                                .find(|l| l.starts_with("NSpid:"))
                                .and_then(|l| l.split_whitespace().last())
                                .and_then(|p| p.parse::<i32>().ok())
                        })
                        == Some(inner)
            })
    }

    /// What the boot script printed (errors before systemd ran).
    pub fn console(&self) -> String {
        std::fs::read_to_string(self.dir.join("console.log")).unwrap_or_default()
    }

    /// What a unit and systemd about it have logged (`journalctl -u
    /// UNIT`), or why it could not be read.
    pub fn journal(&self, unit: &str) -> String {
        match self.exec(&[
            "journalctl",
            "--no-pager",
            "-o",
            "short-precise",
            "-u",
            unit,
        ]) {
            Ok(o) => String::from_utf8_lossy(&o.stdout).into_owned(),
            Err(e) => format!("(journal of {unit}: {e})"),
        }
    }
}

impl Drop for Systemd {
    /// Kills the private PID 1 (the kernel then kills every process of its
    /// PID namespace, and its mounts go with the last one) and waits for
    /// `unshare` to see it, at most 10 s.
    fn drop(&mut self) {
        if self.pid1 > 0 {
            if let Some(pid) = rustix::process::Pid::from_raw(self.pid1) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.holder.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.holder.kill();
        let _ = self.holder.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
