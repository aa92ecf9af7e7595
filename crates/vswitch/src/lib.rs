//! A VALE-style software switch.
//!
//! One thread forwards for every port. For each port with frames waiting it
//! takes a batch straight from the port's memory, does one lookup pass (learn
//! the source address, find the destination, or flood), then one pass per
//! destination that copies the frames for it into that port, and publishes
//! and notifies each destination once per batch. A destination that cannot
//! take a frame (its ring is full) loses that frame, counted; nobody waits
//! for a slow port.
//!
//! When no port has work for `poll_us`, the switch tells its CSB ports it is
//! going to sleep and waits in epoll for kicks, control connections and
//! moderation timers.
//!
//! Port security: a port may be locked to one source address
//! ([`Port::locked_mac`]; VM ports whose guest's MAC is configured are, by
//! default, and every ring port: one attaches naming its MAC, unless the
//! switch lets it bridge other stations, [`Config::ring_unlocked`]). The switch drops that
//! port's frames from any other address and pins the address to it, so no
//! other port can take its traffic by sending from it; both count as
//! `spoofed`.
//!
//! # Where things are
//!
//! From the top down (each file imports only files below it):
//!
//! - `event_loop.rs`: [`EventLoop`], which owns the [`Switch`], the epoll
//!   instance and the attach servers: passes, polling then sleeping in
//!   epoll, moderation timers, the dispatch of epoll events (epoll tokens
//!   are made there), the registration of the attach servers, and adding
//!   (and removing) the ports their connections bring.
//! - `control.rs`: the control server: ring ports attach over the control
//!   socket, and anyone may ask for the status document.
//! - `attach.rs`: `Attach`, what the event loop asks of a server of
//!   attached ports, and `Served`, what a server asks of the switch.
//! - `switch.rs`: the core: [`Switch`]'s port slots, the MAC table, the
//!   forwarding pass, the status document; no descriptor, no socket.
//! - `config.rs`: [`Config`], and the TOML file, [`FileConfig`].
//! - `sockets.rs`: the socket paths: taken only when free or stale
//!   ([`Sockets::claim`]), removed at exit only if still ours.
//! - [`ports`]: the [`Port`] trait and every kind of port (`ring`, `tap`,
//!   `memif/`, `vhost/` for virtual machines; the benchmarks' ports inside
//!   the switch, a source, a sink and a reflector, live in the `bench`
//!   crate).
//! - [`bridge`]: MAC learning; [`pktgen`]: the generator on the driver side
//!   of a ring port; [`status`]: the status document's types (leaf data,
//!   that port kinds may import).
//!
//! # Adding a kind of port
//!
//! 1. A module under `ports/` whose type implements [`Port`]; a kind with a
//!    protocol of its own is a directory shaped like `ports/memif/` (shared
//!    structures, protocol and datapath apart).
//! 2. Ports made by the program itself (as TAP ports are) go to
//!    [`Switch::add_port`] (or [`EventLoop::add_port`] once a loop drives
//!    the switch); nothing more is needed. A kind that is one
//!    device on a socket of its own, listening for its one peer across
//!    reconnects (vhost-user: QEMU), is such a port too: it brings its own
//!    epoll descriptor as [`Port::fd`], and [`Config`] lists the ones to
//!    make (`vhost_user`).
//! 3. Ports that outside programs attach through a socket of their own
//!    need a server implementing `attach::Attach` (listening socket,
//!    accept, serve a connection and hand back the ports it brings, as
//!    `ports/memif/mod.rs` does for memif), the socket's path in [`Config`]
//!    (and [`FileConfig`]), and one line in `event_loop::servers` that
//!    binds it: the registration. The event loop then watches its sockets
//!    under tokens of their own, adds the ports a connection brings, and
//!    removes them when it closes.

mod attach;
pub mod bridge;
mod budgets;
mod chain;
mod config;
mod control;
mod deadlines;
mod event_loop;
pub mod offload;
pub mod pktgen;
pub mod polling;
pub mod ports;
mod sockets;
pub mod status;
mod switch;

pub use config::{
    Config, ConfigError, FileConfig, VhostUserEntry, VhostUserError, MAX_INTERVAL_US, MAX_WINDOW_US,
};
pub use deadlines::{EVICTABLE_AFTER, HANDSHAKE_TIMEOUT};
pub use event_loop::{spawn, EventLoop};
pub use ports::vhost::VhostPort;
pub use sockets::{claim, SocketPathError, Sockets};
// The kinds are re-exported from their own modules, not through `ports`,
// so that `ports` (the trait every kind implements) does not import them.
pub use ports::ring::RingPort;
pub use ports::tap::TapPort;
pub use ports::{Counters, Port};
pub use status::{PortDetail, PortStatus, Status, StatusError};
// Leaf modules name it `crate::chain`.
use chain::chain;
pub use switch::{
    Error, Switch, SwitchStats, BATCH, MAX_PORTS, SPOOF_HOLD_MAX, SPOOF_HOLD_PER_FRAME,
    STATUS_PAGE_BYTES,
};
