//! MAIO's limit errors, exercised for real: a child
//! process without CAP_IPC_LOCK and with RLIMIT_MEMLOCK lowered to 64 KiB
//! must get `UringError::Memlock`, naming the limit and the fix, when it
//! registers a pool larger than that, and never a crash or a bare errno.
//!
//! The child is this same test binary, re-run under `setpriv` (which drops
//! CAP_IPC_LOCK: as root it would bypass the limit) and `prlimit`.

use std::process::Command;

use maio::uring::{Config, Ring, UringError};
use maio::{Hugepages, Pool};

const CHILD: &str = "FASTPATH_MAIO_LIMIT_CHILD";

/// Runs only as the child: registers a 4 MiB pool under a 64 KiB limit.
#[test]
fn child_registers_a_pool_over_its_memlock_limit() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let pool = Pool::new(maio::Config {
        buffers: 2048,
        buf_size: 2048,
        hugepages: Hugepages::Never,
        magazine_depth: 64,
    })
    .expect("the pool itself needs no locked memory");
    let cfg = Config {
        sqpoll: false,
        ..Config::default()
    };
    match Ring::new(&pool, cfg) {
        Err(e @ UringError::Memlock { .. }) => {
            let text = e.to_string();
            assert!(text.contains("RLIMIT_MEMLOCK is 64 KiB"), "{text}");
            assert!(text.contains("ulimit -l"), "{text}");
            println!("MEMLOCK-REFUSED: {text}");
        }
        Err(e) => panic!("expected the memlock error, got: {e}"),
        Ok(_) => panic!("registered 4 MiB under a 64 KiB memlock limit"),
    }
}

#[test]
#[ignore = "system test: root, util-linux"]
fn a_lowered_memlock_limit_is_a_clear_error() {
    // Root, to drop CAP_IPC_LOCK (with it, the limit is not enforced).
    systest::require_root();
    systest::require_programs(&["setpriv", "prlimit"]);
    let exe = std::env::current_exe().unwrap();
    let out = Command::new("setpriv")
        .args([
            "--bounding-set",
            "-ipc_lock",
            "--inh-caps",
            "-ipc_lock",
            "--",
        ])
        .args(["prlimit", "--memlock=65536:65536", "--"])
        .arg(&exe)
        .args([
            "--exact",
            "child_registers_a_pool_over_its_memlock_limit",
            "--nocapture",
        ])
        .env(CHILD, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("MEMLOCK-REFUSED"),
        "child: {:?}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}
