//! The work the daemon runs beside the datapath, each started by the
//! lifecycle ([`crate::daemon`]) and ended by its stop: the health checks'
//! tasks ([`health`]), the BGP controller ([`bgp`]), the `[fleet]` peers'
//! liveness ([`peers`]), the sync of the load balancer in the driver
//! ([`xdp_sync`]), the packet-tracer's reporter ([`tracer`]) and the
//! follower of the fleet's configuration in etcd ([`etcd`]).

pub mod bgp;
pub mod etcd;
pub mod health;
pub mod peers;
pub mod tracer;
pub mod xdp_sync;
