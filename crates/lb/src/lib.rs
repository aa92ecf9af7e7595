//! The Maglev forwarder (paper: Maglev, NSDI'16, sections 3 and 4): the
//! configuration model ([`config`]), VIP matching ([`vip`]), Maglev tables
//! swapped atomically ([`tables`]), per-thread connection tracking
//! ([`conntrack`]), fragments ([`frag`]) and their redirection among the
//! load balancers of a fleet ([`frag_redirect`]), GRE encapsulation, steering and
//! muxing over a shared packet pool ([`datapath`]), the counters, pcap
//! replay ([`pcap_run`]), packet-tracer probes ([`tracer`]), and the load
//! balancer in the driver ([`xdp`]: its XDP program, `bpf/lb.c`, with the
//! constants and map layouts it shares with the packet threads defined once
//! in [`xdp::abi`]).
//!
//! No async runtime and no control plane live here: the daemon (`lbd`)
//! drives this crate through [`Control`] table swaps.

pub mod config;
pub mod conntrack;
pub mod counters;
pub mod datapath;
pub mod frag;
pub mod frag_redirect;
pub mod pcap_run;
pub mod queue;
pub mod quic;
pub mod tables;
pub mod tracer;
pub mod vip;
pub mod worker;
pub mod xdp;

/// The parse cache's old path, which the daemon still names.
pub use config::cache as config_chunks;
pub use config::Config;
pub use tables::Control;
pub use worker::{flow_hash, Mode};
