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
//! This file plugs the [`Server`] into the switch as the server of a port
//! kind that outside programs attach (registered in `ports::servers`).

pub mod control;
pub mod datapath;
pub mod layout;

use std::os::fd::BorrowedFd;
use std::path::PathBuf;

use crate::ports::{Attach, Owner, Served};
use crate::{chain, Switch};

pub use control::{Event, Refusal, Server, MAX_CONNECTIONS, VERSION};
pub use datapath::{MemifPort, RingError, QUIET_WAKES};
pub use layout::COOKIE;

/// Errors setting up the memif server.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The memif socket could not be bound.
    #[error("memif socket {}", path.display())]
    Bind {
        /// The socket path.
        path: PathBuf,
        /// Why.
        #[source]
        source: ring::Error,
    },
}

impl Attach for Server {
    fn listen_fd(&self) -> BorrowedFd<'_> {
        Server::listen_fd(self)
    }

    fn accept_all(&mut self, watch: &mut dyn FnMut(u32, BorrowedFd<'_>) -> bool) {
        while let Some((id, fd)) = self.accept() {
            // A connection epoll cannot watch would never be served, yet
            // hold its descriptors for ever: close it.
            if !watch(id, fd) {
                tracing::warn!("memif: cannot watch connection {id}; closed");
                self.close(id);
            }
        }
    }

    fn serve_conn(&mut self, id: u32, owner: Owner, sw: &mut Switch) -> Served {
        match self.serve(id) {
            Event::None => Served::Open,
            Event::Connected(mut port) => {
                port.set_moderation(sw.cfg.memif_moderation);
                if let Err(e) = sw.add_owned(port, Some(owner)) {
                    tracing::warn!("memif port refused: {}", chain(&e));
                    if let Some(fd) = self.close(id) {
                        return Served::Closed(fd);
                    }
                }
                Served::Open
            }
            Event::Closed(fd) => Served::Closed(fd),
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
        let mut server = Server::bind(&path).unwrap();
        let client = ring::control::Conn::connect(&path).unwrap();
        server.accept_all(&mut |_, _| false);
        assert_eq!(server.connections(), 0);
        // The client sees the greeting, then the end of the connection.
        let hello = ring::control::recv_msg(client.fd()).unwrap();
        assert!(hello.is_some());
        assert!(ring::control::recv_msg(client.fd()).unwrap().is_none());
        let _ = std::fs::remove_file(&path);
    }
}
