//! What the CLI tests share: running `fastpath` as a user would.

// Each test binary includes this module and uses a part of it.
#![allow(dead_code)]

pub mod probe;

use std::process::Command;

/// Held by each of a test binary's tests that must not run beside
/// another of them (cargo runs one binary's tests in parallel): those
/// whose timings or timeouts assume the two cores are theirs.
pub fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE.lock().unwrap_or_else(|p| p.into_inner())
}

/// The `fastpath` binary under test.
pub fn fastpath() -> Command {
    Command::new(env!("CARGO_BIN_EXE_fastpath"))
}

/// Run `cmd`, which must succeed (its stderr is the failure message); its
/// standard output is one JSON document.
pub fn json_of(cmd: &mut Command) -> serde_json::Value {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{cmd:?}: not JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// `fastpath ARGS`, read as with [`json_of`].
pub fn json(args: &[&str]) -> serde_json::Value {
    json_of(fastpath().args(args))
}

/// A namespace network (`lab::topology`) around this `fastpath`: `lbs`
/// load balancers, `backends` backends, names tagged with `prefix` and this
/// process's id. None, with a line saying why, where this machine cannot
/// build one (not root, no iproute2); any other failure fails the test.
pub fn topology(lbs: usize, backends: usize, prefix: &str) -> Option<lab::topology::Topology> {
    let tag = format!("{prefix}{}", std::process::id() % 100_000);
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_fastpath"));
    match lab::topology::Topology::build_fleet(bin, lbs, backends, &tag) {
        Ok(t) => Some(t),
        Err(lab::Error::Unavailable) => {
            eprintln!("skipped: needs root and iproute2");
            None
        }
        Err(e) => panic!("{e}"),
    }
}

/// What tshark (a decoder we did not write) reads in `pcap`: one line per
/// frame, `fields` separated by `|` (a field that occurs twice, as in
/// GRE's outer and inner headers, is comma-separated), with the
/// preferences `prefs` (`-o` values such as `ip.check_checksum:TRUE`).
pub fn tshark_fields(pcap: &std::path::Path, prefs: &[&str], fields: &[&str]) -> Vec<String> {
    let mut cmd = Command::new("tshark");
    cmd.arg("-r").arg(pcap);
    for p in prefs {
        cmd.args(["-o", p]);
    }
    cmd.args(["-T", "fields", "-E", "separator=|"]);
    for f in fields {
        cmd.args(["-e", f]);
    }
    let ts = cmd
        .output()
        .expect("tshark must be installed: run scripts/setup.sh");
    assert!(
        ts.status.success(),
        "{}",
        String::from_utf8_lossy(&ts.stderr)
    );
    String::from_utf8(ts.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}
