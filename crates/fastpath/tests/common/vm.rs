//! What the tests that boot guests on `fastpath switch run` share.

use std::path::Path;
use std::process::Child;

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
