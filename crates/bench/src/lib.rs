//! Every benchmark and paper reproduction of fastpath, depending on the
//! libraries and never the reverse. Each one measures beside a peer in the
//! same run and reports ratios: absolute numbers alone prove nothing on a
//! shared 2-core machine.
//!
//! - [`hash_eval`]: Maglev's section 5.3 (Figures 11 and 12, generation
//!   time, lookup cost) beside Karger and rendezvous hashing.
//! - [`forwarder`]: the forwarder's packet rate beside a null forwarder
//!   (section 5.2.2).
//! - [`veth`]: the load balancer on a veth pair beside nftables and an XDP
//!   bounce.
//! - [`switch`]: the switch's Figure 1 (packet I/O in VMs) beside the TAP
//!   backend.
//! - [`maio`]: MAIO's Figures 2-4 beside the kernel's own interfaces.

pub mod forwarder;
pub mod hash_eval;
pub mod maio;
pub mod switch;
pub mod veth;
