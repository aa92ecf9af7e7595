//! The second tier of fastpath's tests: system tests.
//!
//! fastpath's tests come in two tiers. *Hermetic* tests need nothing but
//! the build: no root, no namespace, no outside program; `make check` runs
//! them (`cargo test --workspace`) in minutes on any contributor's machine.
//! *System* tests need the machine: root, network namespaces, QEMU, BIRD,
//! nginx, systemd, tshark, DPDK, loop devices. They are marked
//!
//! ```ignore
//! #[test]
//! #[ignore = "system test: root, namespaces, BIRD"]
//! fn a_vip_is_announced() {
//!     systest::require_netns();
//!     systest::require_program("bird");
//!     // ...
//! }
//! ```
//!
//! so that plain `cargo test` lists them as ignored *with their reason*,
//! and `make test` runs them (`cargo test -- --include-ignored`) after
//! `scripts/setup.sh` has installed what they need. Once a system test
//! runs, a missing prerequisite **fails** it, naming what is missing: it is
//! never a silent pass, so a run without QEMU cannot be green while
//! claiming to have booted a guest.
//!
//! [`exclusive`] is the one place where system tests that assume the
//! machine's cores (timing, supervision, guests under TCG) are kept apart,
//! within a test binary (cargo runs its tests in parallel) and across
//! binaries and processes alike: a `flock` on one file.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use rustix::fs::{flock, FlockOperation};

/// The file whose `flock` [`exclusive`] takes. Not the
/// `/tmp/fastpath-ns.lock` that people wrap whole `cargo test` runs in by
/// hand: a test taking that one inside such a run would wait for itself.
pub const LOCK_PATH: &str = "/tmp/fastpath-systest.lock";

/// Fails the calling test, naming the prerequisite that is missing and
/// how to get it. Every `require_*` ends here.
#[track_caller]
pub fn missing(what: &str) -> ! {
    panic!(
        "system test prerequisite missing: {what}. System tests run under `make test`, \
         which runs scripts/setup.sh first (as root); `make check` runs the hermetic tests only"
    )
}

/// Whether this process runs as root.
pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// Requires root (loop devices, dpkg, mounts, BPF).
#[track_caller]
pub fn require_root() {
    if !is_root() {
        missing("root (euid 0)");
    }
}

/// Where `program` is on `PATH` (an executable regular file), if anywhere.
/// A name with a slash is taken as a path.
pub fn find_program(program: &str) -> Option<PathBuf> {
    let executable = |p: &Path| {
        p.metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.contains('/') {
        let p = PathBuf::from(program);
        return executable(&p).then_some(p);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| executable(p))
}

/// Requires `program` on `PATH`; its name is the failure message.
#[track_caller]
pub fn require_program(program: &str) {
    if find_program(program).is_none() {
        missing(&format!("the program `{program}` on PATH"));
    }
}

/// Requires each of `programs` on `PATH`, naming every one that is missing.
#[track_caller]
pub fn require_programs(programs: &[&str]) {
    let absent: Vec<&str> = programs
        .iter()
        .copied()
        .filter(|p| find_program(p).is_none())
        .collect();
    if !absent.is_empty() {
        missing(&format!("the programs {absent:?} on PATH"));
    }
}

/// Requires that this process may lock `bytes` of memory (io_uring's
/// registered buffers): root, whose CAP_IPC_LOCK passes any limit, or a
/// soft RLIMIT_MEMLOCK of at least `bytes` (Debian's default is 8 MiB).
#[track_caller]
pub fn require_memlock(bytes: u64) {
    if is_root() {
        return;
    }
    let limit = rustix::process::getrlimit(rustix::process::Resource::Memlock).current;
    if let Some(l) = limit.filter(|&l| l < bytes) {
        missing(&format!(
            "locked memory of {} KiB (RLIMIT_MEMLOCK is {} KiB: run as root or raise `ulimit -l`)",
            bytes >> 10,
            l >> 10
        ));
    }
}

/// Requires what a test that builds network namespaces and veth pairs
/// needs: root and iproute2's `ip`.
#[track_caller]
pub fn require_netns() {
    require_root();
    require_program("ip");
}

/// Requires a Python module (e.g. `scapy` from python3-scapy) in the
/// interpreter `python` that the test runs (a path: `python3` on PATH may
/// be another installation than Debian's, which has Debian's modules).
#[track_caller]
pub fn require_python_module(python: &str, module: &str) {
    require_program(python);
    let ok = Command::new(python)
        .args(["-c", &format!("import {module}")])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        missing(&format!("the Python module `{module}` in {python}"));
    }
}

/// Held by a system test that must have the machine to itself: while any
/// `Exclusive` is alive, every other [`exclusive`] call, in this process
/// or another, waits. Released when dropped.
#[must_use = "the machine is the test's only while the guard lives"]
pub struct Exclusive {
    _file: File,
}

/// Waits until no other test holds the machine, then holds it.
///
/// A `flock` on [`LOCK_PATH`]: locks belong to open file descriptions, so
/// two tests of one binary (separate opens) exclude each other as two
/// processes do, and a test that panics releases the lock as its file
/// closes. A lock that cannot be taken at all fails the test.
#[track_caller]
pub fn exclusive() -> Exclusive {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(LOCK_PATH)
        .unwrap_or_else(|e| panic!("cannot open the system tests' lock {LOCK_PATH}: {e}"));
    // A file left by another user may refuse the write open above; that is
    // reported. The lock itself waits: the holder is another test, bounded
    // by its own deadlines.
    flock(&file, FlockOperation::LockExclusive)
        .unwrap_or_else(|e| panic!("cannot lock {LOCK_PATH}: {e}"));
    Exclusive { _file: file }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programs_are_found_on_path_and_absent_ones_are_not() {
        assert!(find_program("sh").is_some(), "every Debian has sh");
        assert!(find_program("fastpath-no-such-program-here").is_none());
        assert!(find_program("/bin/sh").is_some());
        assert!(find_program("/nonexistent/sh").is_none());
    }

    #[test]
    #[should_panic(expected = "system test prerequisite missing: the program `fastpath-absent`")]
    fn a_missing_program_fails_the_test_and_names_it() {
        require_program("fastpath-absent");
    }

    #[test]
    #[should_panic(expected = "[\"fastpath-absent-b\"]")]
    fn only_the_missing_programs_are_named() {
        require_programs(&["sh", "fastpath-absent-b"]);
    }

    #[test]
    fn exclusive_holders_do_not_overlap() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::Arc;
        let inside = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (inside, most) = (inside.clone(), most.clone());
                std::thread::spawn(move || {
                    for _ in 0..5 {
                        let _g = exclusive();
                        let n = inside.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(n, Ordering::SeqCst);
                        std::thread::sleep(std::time::Duration::from_millis(2));
                        inside.fetch_sub(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(most.load(Ordering::SeqCst), 1, "two holders at once");
    }
}
