//! The switch's socket paths (control, memif, one per vhost-user port):
//! taking a path only when nothing else holds it, and giving back at exit
//! only what this switch made.
//!
//! A path given for a socket may already hold something. A regular file
//! (a typo in a path, a disk image) or another running switch's live
//! socket is not ours to delete: [`Sockets::claim`] refuses both, naming
//! the path. A socket file nobody listens on (left by a switch that died)
//! is stale and is replaced. At exit, [`Sockets`] removes a path only if it
//! is still the very socket this switch bound (same device and inode): a
//! second switch that replaced a path after ours died keeps it.
//!
//! Looking whether a socket is live is one connect on a non-blocking
//! socket of our own: it never waits on whoever holds the path.

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

/// Make `path` free for a socket of this switch: nothing there, or a stale
/// socket (removed); a live socket or anything not a socket is refused.
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

/// A socket this switch bound: its path, and the identity of the file it
/// made there.
#[derive(Debug)]
struct Made {
    path: PathBuf,
    id: Identity,
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

/// The socket paths of one switch: claimed before it binds them
/// ([`Sockets::claim`]), noted once it has ([`Sockets::bound`]), and
/// removed when this drops, each only if it is still the socket this switch
/// made.
#[derive(Debug, Default)]
pub struct Sockets {
    paths: Vec<PathBuf>,
    made: Vec<Made>,
}

impl Sockets {
    /// Claims each path ([`claim`]), before the switch binds them; a
    /// switch's configuration gives its paths through
    /// [`crate::Config::claim_sockets`], which checks it first.
    pub fn claim(paths: Vec<PathBuf>) -> Result<Sockets, SocketPathError> {
        for p in &paths {
            claim(p)?;
        }
        Ok(Sockets {
            paths,
            made: Vec::new(),
        })
    }

    /// The switch has bound its sockets: note what each path now holds, to
    /// remove it at exit only if it is still that.
    pub fn bound(&mut self) {
        self.made = self
            .paths
            .iter()
            .filter_map(|p| {
                let m = std::fs::symlink_metadata(p).ok()?;
                m.file_type().is_socket().then(|| Made {
                    path: p.clone(),
                    id: Identity::of(&m),
                })
            })
            .collect();
    }

    /// The paths claimed.
    pub fn paths(&self) -> &[PathBuf] {
        &self.paths
    }
}

impl Drop for Sockets {
    fn drop(&mut self) {
        for m in &self.made {
            let ours =
                std::fs::symlink_metadata(&m.path).is_ok_and(|now| Identity::of(&now) == m.id);
            if ours {
                let _ = std::fs::remove_file(&m.path);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("fp-sockets-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_stale_socket_is_replaced_and_a_live_one_refused() {
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
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn only_the_socket_this_switch_made_is_removed_at_exit() {
        let d = dir("ours");
        let p = d.join("vm.sock");
        let mut s = Sockets::claim(vec![p.clone()]).unwrap();
        drop(std::os::unix::net::UnixListener::bind(&p).unwrap());
        s.bound();
        // Someone else replaced it after we bound it (ours moved aside, so
        // that its inode is not free for the new one to reuse).
        std::fs::rename(&p, d.join("moved.sock")).unwrap();
        drop(std::os::unix::net::UnixListener::bind(&p).unwrap());
        drop(s);
        assert!(p.exists(), "another's socket at our path stays");
        let mut s = Sockets::claim(vec![p.clone()]).unwrap();
        drop(std::os::unix::net::UnixListener::bind(&p).unwrap());
        s.bound();
        drop(s);
        assert!(!p.exists(), "our own socket goes");
        let _ = std::fs::remove_dir_all(&d);
    }
}
