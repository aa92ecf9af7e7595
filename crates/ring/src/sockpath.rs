//! Socket paths: taking one only when nothing else holds it, and giving
//! back only what this process made there.
//!
//! A path given for a socket may already hold something. A regular file
//! (a typo in a path, a disk image) or another running program's live
//! socket is not ours to delete: [`claim`] refuses both, naming the path.
//! A socket file nobody listens on (left by a program that died) is stale
//! and is removed. Once bound, a [`BoundPath`] notes which file this
//! process made (device, inode, change time) and removes the path when it
//! drops only if it is still that file: a program that replaced the path
//! since keeps it.
//!
//! Looking whether a socket is live is one connect on a non-blocking
//! socket of our own: it never waits on whoever holds the path.
//!
//! This is the rule of every socket the switch listens on: its control
//! socket ([`crate::control::Listener`]), its memif socket and its
//! vhost-user ports' sockets (which the `vswitch` crate binds with it).

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use rustix::io::Errno;
use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};

/// Why a socket path cannot be taken.
#[derive(Debug, thiserror::Error)]
pub enum SocketPathError {
    /// Something other than a socket is there.
    #[error(
        "{} exists and is not a socket (a {kind}): not deleting it; give another path or remove it yourself",
        path.display()
    )]
    NotSocket {
        /// The path.
        path: PathBuf,
        /// What it is (file, directory, ...).
        kind: &'static str,
    },
    /// A program accepts connections there: another running switch.
    #[error(
        "{} is the live socket of a running program (another switch?): stop it or give another path",
        path.display()
    )]
    Live {
        /// The path.
        path: PathBuf,
    },
    /// The path could not be looked at, or a stale socket not removed.
    #[error("socket path {}", path.display())]
    Inspect {
        /// The path.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// What a path holds, in words, for [`SocketPathError::NotSocket`].
fn kind(ft: std::fs::FileType) -> &'static str {
    if ft.is_dir() {
        "directory"
    } else if ft.is_file() {
        "regular file"
    } else if ft.is_symlink() {
        "symbolic link"
    } else if ft.is_fifo() {
        "FIFO"
    } else if ft.is_block_device() || ft.is_char_device() {
        "device"
    } else {
        "file of another kind"
    }
}

/// Whether some program accepts connections on the socket at `path`:
/// `Ok(false)` for a socket nobody listens on. A listener of another
/// socket type refuses our type with `EPROTOTYPE`, so each type the
/// switch's sockets use is tried.
fn live(path: &Path) -> std::io::Result<bool> {
    let addr = SocketAddrUnix::new(path)?;
    for ty in [SocketType::STREAM, SocketType::SEQPACKET] {
        let fd = rustix::net::socket_with(
            AddressFamily::UNIX,
            ty,
            SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
            None,
        )?;
        match rustix::net::connect(&fd, &addr) {
            // Accepted, or queued behind others (a full backlog answers
            // EAGAIN on a non-blocking socket): someone listens.
            Ok(()) | Err(Errno::AGAIN) | Err(Errno::INPROGRESS) => return Ok(true),
            Err(Errno::PROTOTYPE) => continue,
            Err(Errno::CONNREFUSED) | Err(Errno::NOENT) => return Ok(false),
            Err(e) => return Err(e.into()),
        }
    }
    Ok(false)
}

/// Make `path` free for a socket: nothing there, or a stale socket
/// (removed); a live socket or anything not a socket is refused.
pub fn claim(path: &Path) -> Result<(), SocketPathError> {
    let inspect = |source: std::io::Error| SocketPathError::Inspect {
        path: path.to_path_buf(),
        source,
    };
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(inspect(e)),
    };
    if !meta.file_type().is_socket() {
        return Err(SocketPathError::NotSocket {
            path: path.to_path_buf(),
            kind: kind(meta.file_type()),
        });
    }
    if live(path).map_err(inspect)? {
        return Err(SocketPathError::Live {
            path: path.to_path_buf(),
        });
    }
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(inspect(e)),
    }
}

/// What tells one file from another made at the same path later.
#[derive(Debug, PartialEq, Eq)]
struct Identity {
    dev: u64,
    ino: u64,
    ctime: (i64, i64),
}

impl Identity {
    fn of(m: &std::fs::Metadata) -> Identity {
        Identity {
            dev: m.dev(),
            ino: m.ino(),
            ctime: (m.ctime(), m.ctime_nsec()),
        }
    }
}

/// A socket this process bound: its path, and the identity of the file it
/// made there. Dropping it removes the path only if it is still that file.
#[derive(Debug)]
pub struct BoundPath {
    path: PathBuf,
    id: Identity,
}

impl BoundPath {
    /// Note the socket just bound at `path`; None if there is no socket
    /// there (nothing will be removed then).
    pub fn note(path: &Path) -> Option<BoundPath> {
        let m = std::fs::symlink_metadata(path).ok()?;
        m.file_type().is_socket().then(|| BoundPath {
            path: path.to_path_buf(),
            id: Identity::of(&m),
        })
    }

    /// The path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for BoundPath {
    fn drop(&mut self) {
        let ours =
            std::fs::symlink_metadata(&self.path).is_ok_and(|now| Identity::of(&now) == self.id);
        if ours {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("ring-sockpath-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_stale_socket_is_replaced_and_a_live_one_or_a_file_refused() {
        let d = dir("stale");
        let p = d.join("s.sock");
        drop(std::os::unix::net::UnixListener::bind(&p).unwrap());
        assert!(p.exists(), "a dropped listener leaves its file");
        claim(&p).unwrap();
        assert!(!p.exists(), "the stale socket is removed");
        let _l = std::os::unix::net::UnixListener::bind(&p).unwrap();
        let e = claim(&p).unwrap_err();
        assert!(matches!(e, SocketPathError::Live { .. }), "{e}");
        assert!(p.exists());
        let f = d.join("disk.img");
        std::fs::write(&f, b"data").unwrap();
        let e = claim(&f).unwrap_err();
        assert!(matches!(e, SocketPathError::NotSocket { .. }), "{e}");
        assert_eq!(std::fs::read(&f).unwrap(), b"data");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn only_the_socket_this_process_made_is_removed() {
        let d = dir("ours");
        let p = d.join("vm.sock");
        drop(std::os::unix::net::UnixListener::bind(&p).unwrap());
        let made = BoundPath::note(&p).unwrap();
        // Someone else replaced it after we bound it (ours moved aside, so
        // that its inode is not free for the new one to reuse).
        std::fs::rename(&p, d.join("moved.sock")).unwrap();
        drop(std::os::unix::net::UnixListener::bind(&p).unwrap());
        drop(made);
        assert!(p.exists(), "another's socket at our path stays");
        claim(&p).unwrap();
        drop(std::os::unix::net::UnixListener::bind(&p).unwrap());
        drop(BoundPath::note(&p).unwrap());
        assert!(!p.exists(), "our own socket goes");
        let _ = std::fs::remove_dir_all(&d);
    }
}
