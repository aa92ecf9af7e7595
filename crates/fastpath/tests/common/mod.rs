//! What the CLI tests share: running `fastpath` as a user would.

// Each test binary includes this module and uses a part of it.
#![allow(dead_code)]

use std::process::Command;

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
