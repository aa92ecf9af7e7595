//! The Maglev load balancer's control plane (paper: Maglev, NSDI'16,
//! sections 2-4): the daemon that runs the `lb` forwarder on a real
//! interface ([`daemon`]), its HTTP API and atomic reloads, health checks
//! ([`health`]), VIP announcements through BIRD ([`bgp`]) and the check
//! that a fleet of load balancers agrees on its tables ([`fleet`]), and
//! the liveness of the peers fragments are redirected to ([`peers`]), and
//! the next hop's MAC resolved from the kernel ([`gateway`]).
//!
//! This is the only crate of the load balancer that depends on tokio and
//! axum; it drives the forwarder through atomic table swaps and never sits
//! on the packet path.

pub mod api;
pub mod bgp;
pub mod daemon;
pub mod fleet;
pub mod gateway;
pub mod health;
pub mod lock;
pub mod metrics;
pub mod peers;
pub mod runtime;
pub mod tracer;
pub mod tunnel;
