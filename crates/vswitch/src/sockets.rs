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
//!
//! The rules themselves are [`ring::sockpath`]'s (the ring crate, below
//! this one, binds the control and memif sockets with them, and the
//! vhost-user ports bind theirs with them too); this module holds a whole
//! switch's paths, claimed together before any is bound.

use std::path::PathBuf;

use ring::sockpath::BoundPath;
pub use ring::sockpath::{claim, SocketPathError};

/// The socket paths of one switch: claimed before it binds them
/// ([`Sockets::claim`]), noted once it has ([`Sockets::bound`]), and
/// removed when this drops, each only if it is still the socket this switch
/// made.
#[derive(Debug, Default)]
pub struct Sockets {
    paths: Vec<PathBuf>,
    /// Removed when they drop, each only if still ours.
    made: Vec<BoundPath>,
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
            .filter_map(|p| BoundPath::note(p))
            .collect();
    }

    /// The paths claimed.
    pub fn paths(&self) -> &[PathBuf] {
        &self.paths
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
