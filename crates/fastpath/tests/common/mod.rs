//! What the CLI tests share: running `fastpath` as a user would.

use std::process::Command;

/// `fastpath ARGS` must succeed (its stderr is the failure message); its
/// standard output is one JSON document.
pub fn json(args: &[&str]) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_fastpath"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "fastpath {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "fastpath {}: not JSON ({e}): {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout)
        )
    })
}
