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

pub mod control;
pub mod datapath;
pub mod layout;

use std::path::PathBuf;

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
