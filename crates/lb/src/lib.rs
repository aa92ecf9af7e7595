//! The Maglev load balancer (paper: Maglev, NSDI'16): configuration, VIP
//! matching, per-thread connection tracking, Maglev tables, GRE
//! encapsulation, steering and muxing over a shared packet pool
//! ([`datapath`]), and the hashing evaluation of section 5.3
//! ([`hash_eval`]).

#![deny(missing_docs)]

pub mod bench;
pub mod bgp;
pub mod config;
pub mod conntrack;
pub mod counters;
pub mod daemon;
pub mod datapath;
pub mod decap;
pub mod frag;
pub mod hash_eval;
pub mod health;
pub mod pcap_run;
pub mod queue;
pub mod sample;
pub mod tables;
pub mod topology;
pub mod vethbench;
pub mod vip;
pub mod worker;

pub use config::Config;
pub use tables::Control;
pub use worker::{flow_hash, Mode};
