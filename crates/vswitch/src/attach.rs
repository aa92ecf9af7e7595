//! The interface between the event loop and the server of a kind of port
//! that outside programs attach through a socket of its own (the control
//! socket's ring ports, memif).
//!
//! A server owns its listening socket and connections and speaks its
//! kind's protocol, but never touches the switch: what a connection asks
//! of the switch (add the port it brings, read a page of the status
//! document) comes back to the event loop as [`Served`], and the event loop
//! hands the server the outcome to answer the client with. So the servers
//! sit below the switch's event loop, not beside it.
//!
//! Every attach protocol has a handshake deadline, [`crate::HANDSHAKE_TIMEOUT`]:
//! a connection that has not completed its kind's handshake by then is
//! closed ([`Attach::expire`]), so that idle connections cannot hold the
//! slots and descriptors real clients need.

use std::os::fd::{BorrowedFd, OwnedFd};
use std::time::Instant;

use crate::ports::Port;
use crate::status::Status;
use crate::Error;

/// What serving a connection asks of the event loop.
pub(crate) enum Served {
    /// Nothing: the connection stays open.
    Open,
    /// The connection ended: its descriptor, for the event loop to stop
    /// watching before it drops (closes) it; the ports it brought go.
    Closed(OwnedFd),
    /// The connection brings this port: the event loop adds it to the
    /// switch as the connection's (it goes when the connection closes) and
    /// tells the server how that went ([`Attach::added`]).
    Port(Box<dyn Port>),
    /// The connection asks for the page of the status document that starts
    /// at this port index: the event loop hands it to the server
    /// ([`Attach::status`]).
    Status(usize),
}

/// The server of a kind of port that outside programs attach through a
/// socket of its own; the event loop calls it when its sockets are
/// readable, and with the outcome of what it asked for.
pub(crate) trait Attach: Send {
    /// The listening socket, readable when a client is waiting.
    fn listen_fd(&self) -> BorrowedFd<'_>;
    /// Accept every waiting connection. `watch` starts watching a new
    /// connection's descriptor under its id (ids below 2^24) and says
    /// whether it could.
    fn accept_all(&mut self, watch: &mut dyn FnMut(u32, BorrowedFd<'_>) -> bool);
    /// Handle what arrived on connection `id`.
    fn serve_conn(&mut self, id: u32) -> Served;
    /// The port connection `id` brought ([`Served::Port`]) is in the switch
    /// at this index, or was refused for this reason.
    fn added(&mut self, id: u32, result: Result<u16, Error>) -> Served;
    /// The page of the status document connection `id` asked for
    /// ([`Served::Status`]). Servers that never ask have nothing to do.
    fn status(&mut self, id: u32, page: Status) -> Served {
        let _ = (id, page);
        Served::Open
    }
    /// Close every connection whose handshake deadline has passed by
    /// `now` (and any the server closed on its own since, to make room):
    /// their ids and descriptors, for the event loop to stop watching
    /// before it drops them, and to remove what they brought.
    fn expire(&mut self, now: Instant) -> Vec<(u32, OwnedFd)>;
}
