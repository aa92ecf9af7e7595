//! The Maglev load balancer's control plane (paper: Maglev, NSDI'16,
//! sections 2-4): the daemon that runs the `lb` forwarder on a real
//! interface, one module per concern:
//!
//! - [`daemon`]: the lifecycle only: start, serve, graceful stop.
//! - [`ports`]: the driver, the socket layout and pool size it needs, and
//!   opening the interface with the fall-back `auto` promises.
//! - [`state`]: what the lifecycle, the tasks and the API share
//!   ([`state::Shared`]), in named parts.
//! - [`reload`]: reloads and runtime changes (drain, undrain, weight),
//!   applied whole or not at all; [`runtime`] edits the file for the latter.
//! - [`status`]: the `/status` document; [`metrics`]: `/metrics`.
//! - [`http`]: the API's routes and their listener; [`access`]: who may
//!   use it (the token) and how many at once (the connection cap);
//!   [`paths`]: its paths, written once for the routes and the [`client`]
//!   the command line uses.
//! - [`tasks`]: the work beside the datapath: health checks, the BGP
//!   controller, the `[fleet]` peers' liveness, the sync of the load
//!   balancer in the driver, the packet-tracer's reporter.
//! - [`announce`]: what the BGP controller does of each poll (the VIP
//!   routes files, and BIRD made to show what is wanted, decided by a pure
//!   function); [`bird`]: the BIRD client, the only place `birdc` is run.
//! - [`health`]: what a health check is and how its verdict is reached;
//!   [`tunnel`]: checks that go through GRE as client traffic does.
//! - [`gateway`]: the next hop's MAC resolved from the kernel; [`lock`]: one
//!   load balancer per interface.
//! - [`agreement`]: the check that a fleet of load balancers agrees on its
//!   tables.
//! - [`notify`]: what the daemon tells systemd (ready, alive while the
//!   datapath beats, stopping); [`withdraw`]: the withdrawal the service
//!   unit runs once the daemon has stopped.
//!
//! This is the only crate of the load balancer that depends on tokio and
//! axum; it drives the forwarder through atomic table swaps and never sits
//! on the packet path.
//!
//! The modules import one another without a circle: the shared state
//! ([`state`]) depends only on the parts it holds (access, limits, the
//! announcement's state, the next hop, health checks and their tunnel), and
//! what acts on it (the API, reloads, `/status`, `/metrics`, the tasks)
//! sits above it.
//! `python3 scripts/modgraph.py crates/lbd/src` checks it. Modules only the
//! daemon itself uses are `pub(crate)`.

pub(crate) mod access;
pub mod agreement;
pub mod announce;
pub mod bird;
pub mod client;
pub mod daemon;
pub(crate) mod gateway;
pub mod health;
pub mod http;
pub(crate) mod limits;
pub(crate) mod lock;
pub(crate) mod metrics;
pub(crate) mod notify;
pub(crate) mod paths;
pub(crate) mod ports;
pub mod reload;
pub mod runtime;
pub(crate) mod source;
pub(crate) mod state;
pub mod status;
pub(crate) mod tasks;
pub(crate) mod tunnel;
pub mod withdraw;

/// The `/metrics` exposition of a `/status` snapshot in the format asked
/// for, as the API serves it: public so that tests outside the crate can
/// hand it to parsers we did not write (promtool, Python's).
pub use metrics::{encode_metrics_as, Format as MetricsFormat};
/// The configuration from etcd (`lb run --config-etcd`): the first read
/// and what `/status` says of the source.
pub use source::{ConfigSourceStatus, EtcdError, Start as EtcdStart};
