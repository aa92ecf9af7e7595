//! memif, server side: the shared-memory packet interface of VPP and DPDK
//! (protocol version 2.0), so that outside programs (DPDK's testpmd with
//! `net_memif`, VPP, libmemif applications) can attach to the switch.
//!
//! The client owns the memory: it sends its regions (memfds) and rings,
//! each ring with an interrupt eventfd; the server maps them. Regions must be
//! sealed against shrinking, so the client cannot turn our reads into SIGBUS.
//!
//! - [`layout`]: the shared structures (ring header, descriptor), typed,
//!   with which side writes each field.
//! - [`control`]: the socket protocol (hello, init, add region, add ring,
//!   connect, disconnect) and the [`Server`] that speaks it.
//! - [`datapath`]: the mapped regions, the checked rings, and the
//!   [`MemifPort`] that copies frames in and out.
//!
//! This file plugs the [`Server`] into the switch's event loop as the
//! server of a port kind that outside programs attach (`Attached`,
//! registered in the event loop's `servers`).

pub mod control;
pub mod datapath;
pub mod layout;

use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, Instant};

use crate::attach::{Attach, Served};
use crate::chain;

pub use control::{Error, Event, Refusal, Server, EVICTABLE_AFTER, MAX_CONNECTIONS, VERSION};
pub use datapath::{MemifPort, RingError, QUIET_WAKES};
pub use layout::COOKIE;

/// The memif [`Server`] as the event loop drives it, with the interrupt
/// moderation its ports get.
pub(crate) struct Attached {
    server: Server,
    moderation: Duration,
}

impl Attached {
    /// Listen on `path`; the ports clients attach moderate their
    /// interrupts to one per `moderation` (zero: none).
    pub(crate) fn bind(path: &Path, moderation: Duration) -> Result<Attached, Error> {
        Ok(Attached {
            server: Server::bind(path)?,
            moderation,
        })
    }
}

impl Attach for Attached {
    fn listen_fd(&self) -> BorrowedFd<'_> {
        self.server.listen_fd()
    }

    fn accept_all(&mut self, watch: &mut dyn FnMut(u32, BorrowedFd<'_>) -> bool) {
        while let Some((id, fd)) = self.server.accept() {
            // A connection epoll cannot watch would never be served, yet
            // hold its descriptors for ever: close it.
            if !watch(id, fd) {
                tracing::warn!("memif: cannot watch connection {id}; closed");
                self.server.close(id);
            }
        }
    }

    fn serve_conn(&mut self, id: u32) -> Served {
        match self.server.serve(id) {
            Event::None => Served::Open,
            Event::Connected(mut port) => {
                port.set_moderation(self.moderation);
                Served::Port(port)
            }
            Event::Closed(fd) => Served::Closed(fd),
        }
    }

    fn expire(&mut self, now: Instant) -> Vec<(u32, OwnedFd)> {
        self.server.expire(now)
    }

    fn added(&mut self, id: u32, result: Result<u16, crate::Error>) -> Served {
        match result {
            Ok(_) => Served::Open,
            Err(e) => {
                tracing::warn!("memif port refused: {}", chain(&e));
                match self.server.close(id) {
                    Some(fd) => Served::Closed(fd),
                    None => Served::Open,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection the event loop could not watch is closed, not kept
    /// (it would never be served, and would hold its descriptors).
    #[test]
    fn a_connection_epoll_cannot_watch_is_closed() {
        let path =
            std::env::temp_dir().join(format!("fp-memif-unwatched-{}.sock", std::process::id()));
        let mut server = Attached::bind(&path, Duration::ZERO).unwrap();
        let client = ring::control::Conn::connect(&path).unwrap();
        server.accept_all(&mut |_, _| false);
        assert_eq!(server.server.connections(), 0);
        // The client sees the greeting, then the end of the connection.
        let hello = ring::control::recv_msg(client.fd()).unwrap();
        assert!(hello.is_some());
        assert!(ring::control::recv_msg(client.fd()).unwrap().is_none());
        let _ = std::fs::remove_file(&path);
    }
}
