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

pub use control::{Event, Refusal, Server, VERSION};
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
            let _ = watch(id, fd);
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
