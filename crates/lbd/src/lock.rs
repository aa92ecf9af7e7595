//! One load balancer per interface: a second `fastpath lb run` on the same
//! interface would fall back to AF_PACKET beside the first, run without its
//! API, and count the kernel's traffic as drops. Instead it is refused.
//!
//! The lock is an exclusive `flock` on a file named after the interface and
//! the network namespace (by the inode of `/proc/self/ns/net`), so load
//! balancers in different namespaces may use the same interface name. The
//! kernel releases it when the process ends, however it ends.
//!
//! Lock files are not left behind: the holder removes its file when it
//! lets go (while still holding the lock, so that a claim racing with the
//! removal sees that the file it locked is gone and starts again), and a
//! claim removes the files of holders that were killed before they could
//! (files nobody holds a lock on). Namespaces come and go with each test
//! or container; their files would otherwise pile up in [`LOCK_DIR`].

use std::io::{Read, Seek, Write};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use rustix::fs::{flock, FlockOperation};

/// Where the locks live.
pub const LOCK_DIR: &str = "/run/fastpath";

/// How many times a claim opens the lock file again after losing a race
/// with its removal.
const CLAIM_TRIES: usize = 16;

/// Why the interface could not be claimed.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another load balancer holds it.
    #[error("another `fastpath lb run`{} already serves {interface} in this network namespace \
             (lock {path}); stop it first, or use another interface", .pid.map(|p| format!(" (pid {p})")).unwrap_or_default())]
    Held {
        /// The interface.
        interface: String,
        /// The holder, as it wrote itself into the lock file.
        pid: Option<u32>,
        /// The lock file.
        path: PathBuf,
    },
    /// The lock file could not be created or locked.
    #[error("locking {path}: {source}")]
    Io {
        /// The lock file.
        path: PathBuf,
        /// The system's answer.
        #[source]
        source: std::io::Error,
    },
}

/// The claim on an interface, held until dropped.
#[derive(Debug)]
pub struct InterfaceLock {
    _file: std::fs::File,
    path: PathBuf,
}

impl InterfaceLock {
    /// Claims `interface` in this network namespace, in [`LOCK_DIR`].
    pub fn claim(interface: &str) -> Result<Self, LockError> {
        Self::claim_in(Path::new(LOCK_DIR), interface)
    }

    /// Claims `interface` with the lock file in `dir`.
    pub fn claim_in(dir: &Path, interface: &str) -> Result<Self, LockError> {
        let netns = std::fs::metadata("/proc/self/ns/net")
            .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
            .unwrap_or(0);
        let name: String = interface
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let path = dir.join(format!("lb-{netns}-{name}.lock"));
        let io = |source| LockError::Io {
            path: path.clone(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(io)?;
        // A few tries: each lost race means another claim or release
        // happened meanwhile, which a second try sees settled.
        let mut file = None;
        for _ in 0..CLAIM_TRIES {
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .map_err(io)?;
            match flock(f.as_fd(), FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => {}
                Err(rustix::io::Errno::WOULDBLOCK) => {
                    let mut text = String::new();
                    let _ = (&f).read_to_string(&mut text);
                    return Err(LockError::Held {
                        interface: interface.to_string(),
                        pid: text.trim().parse().ok(),
                        path,
                    });
                }
                Err(e) => return Err(io(e.into())),
            }
            // The previous holder may have removed the file between our
            // open and our lock: then the lock is on a file nobody else
            // can find, and another claim may be creating the real one.
            if is_the_file_at(&f, &path) {
                file = Some(f);
                break;
            }
        }
        let mut file = file.ok_or_else(|| {
            io(std::io::Error::other(
                "the lock file kept being replaced while claiming it",
            ))
        })?;
        // Ours: say who holds it, for the next one's message.
        file.set_len(0)
            .and_then(|()| file.rewind())
            .and_then(|()| writeln!(file, "{}", std::process::id()))
            .map_err(io)?;
        remove_stale(dir, &path);
        Ok(InterfaceLock { _file: file, path })
    }

    /// The lock file (for the tests: the daemon only holds the lock).
    #[cfg(test)]
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for InterfaceLock {
    /// Removes the file while the lock is still held (the file closes
    /// after this), so a claim that opened it meanwhile finds it gone.
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Whether `file` is the file now at `path` (same device and inode).
fn is_the_file_at(file: &std::fs::File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// Removes the lock files in `dir` that nobody holds (their holder was
/// killed), except `ours`. Each is locked before it is removed, so a live
/// holder's file is never touched, and a claim racing with the removal
/// starts again (see [`InterfaceLock::claim_in`]).
fn remove_stale(dir: &Path, ours: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.filter_map(Result::ok) {
        let path = e.path();
        let name = e.file_name();
        let name = name.to_string_lossy();
        if path == ours || !(name.starts_with("lb-") && name.ends_with(".lock")) {
            continue;
        }
        let Ok(f) = std::fs::OpenOptions::new().read(true).open(&path) else {
            continue;
        };
        if flock(f.as_fd(), FlockOperation::NonBlockingLockExclusive).is_ok()
            && is_the_file_at(&f, &path)
        {
            let _ = std::fs::remove_file(&path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_claim_is_refused_until_the_first_is_dropped() {
        let dir = std::env::temp_dir().join(format!("fastpath-lock-{}", std::process::id()));
        let first = InterfaceLock::claim_in(&dir, "eth9").unwrap();
        // flock locks belong to open file descriptions: a second open in
        // the same process conflicts as another process's would.
        match InterfaceLock::claim_in(&dir, "eth9") {
            Err(e @ LockError::Held { pid: Some(p), .. }) => {
                assert_eq!(p, std::process::id());
                assert!(e.to_string().contains("eth9") && e.to_string().contains("already"));
            }
            other => panic!("second claim: {other:?}"),
        }
        // Another interface is free.
        let other = InterfaceLock::claim_in(&dir, "eth10").unwrap();
        drop(first);
        let again = InterfaceLock::claim_in(&dir, "eth9").unwrap();
        drop((other, again));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn no_lock_file_is_left_behind() {
        let dir = std::env::temp_dir().join(format!("fastpath-lock-left-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // A holder killed before it could remove its file, in a namespace
        // that is gone.
        std::fs::write(dir.join("lb-4026532000-l0.lock"), "12345\n").unwrap();
        // Someone else's file stays.
        std::fs::write(dir.join("switch.sock"), "").unwrap();
        let claim = InterfaceLock::claim_in(&dir, "eth7").unwrap();
        let path = claim.path().to_path_buf();
        let names = || {
            let mut n: Vec<String> = std::fs::read_dir(&dir)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            n.sort();
            n
        };
        let ours = path.file_name().unwrap().to_string_lossy().into_owned();
        assert_eq!(names(), [ours.clone(), "switch.sock".to_string()]);
        // A live holder's file is not stale: a claim on another interface
        // leaves it.
        let other = InterfaceLock::claim_in(&dir, "eth8").unwrap();
        assert!(path.exists());
        drop(claim);
        assert!(!path.exists());
        drop(other);
        assert_eq!(names(), ["switch.sock"]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
