//! What the tests that boot guests on `fastpath switch run` share.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use super::fastpath;

/// Requires what booting guests on the switch needs, and holds the
/// machine while the test runs (guests under TCG take both cores).
pub fn ready() -> systest::Exclusive {
    systest::require_netns();
    if let Some(what) = lab::guest::missing() {
        systest::missing(&what);
    }
    systest::exclusive()
}

/// The switch process, killed by PID when dropped.
pub struct Proc(pub Child);
impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `fastpath switch status --format json` of the switch at `sock`, if it
/// answers.
pub fn status(sock: &Path) -> Option<serde_json::Value> {
    let out = fastpath()
        .args(["switch", "status", "--format", "json", "--socket"])
        .arg(sock)
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    serde_json::from_slice(&out.stdout).ok()
}

/// The port called `name` in a status document.
pub fn port(s: &serde_json::Value, name: &str) -> serde_json::Value {
    s["ports"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["name"] == name))
        .cloned()
        .unwrap_or_else(|| panic!("no port {name} in {s}"))
}

/// Starts `fastpath switch run --socket CTL ARGS...` in `ns` (killed with
/// this test process if it dies first) and waits, at most 20 s, until its
/// status answers.
pub fn start_switch(ns: &lab::netns::Netns, ctl: &Path, args: &[String]) -> Proc {
    let mut cmd = ns.command(env!("CARGO_BIN_EXE_fastpath"));
    cmd.args(["switch", "run", "--socket"])
        .arg(ctl)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: one async-signal-safe system call between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))?;
            Ok(())
        });
    }
    let sw = Proc(cmd.spawn().expect("fastpath switch run"));
    let t = Instant::now();
    while status(ctl).is_none() {
        assert!(t.elapsed() < Duration::from_secs(20), "no switch");
        std::thread::sleep(Duration::from_millis(100));
    }
    sw
}
