//! One load balancer per interface: a second `fastpath lb run` on the same
//! interface would fall back to AF_PACKET beside the first, run without its
//! API, and count the kernel's traffic as drops. Instead it is refused.
//!
//! The lock is an exclusive `flock` on a file named after the interface and
//! the network namespace (by the inode of `/proc/self/ns/net`), so load
//! balancers in different namespaces may use the same interface name. The
//! kernel releases it when the process ends, however it ends.

use std::io::{Read, Seek, Write};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use rustix::fs::{flock, FlockOperation};

/// Where the locks live.
pub const LOCK_DIR: &str = "/run/fastpath";

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
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io)?;
        match flock(file.as_fd(), FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(rustix::io::Errno::WOULDBLOCK) => {
                let mut text = String::new();
                let _ = file.read_to_string(&mut text);
                return Err(LockError::Held {
                    interface: interface.to_string(),
                    pid: text.trim().parse().ok(),
                    path,
                });
            }
            Err(e) => return Err(io(e.into())),
        }
        // Ours: say who holds it, for the next one's message.
        file.set_len(0)
            .and_then(|()| file.rewind())
            .and_then(|()| writeln!(file, "{}", std::process::id()))
            .map_err(io)?;
        Ok(InterfaceLock { _file: file, path })
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
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
}
