//! Every benchmark and paper reproduction of fastpath, depending on the
//! libraries and never the reverse. Each one measures beside a peer in the
//! same run and reports ratios: absolute numbers alone prove nothing on a
//! shared 2-core machine.
//!
//! - [`hash_eval`]: Maglev's section 5.3 (Figures 11 and 12, generation
//!   time, lookup cost) beside Karger and rendezvous hashing.
//! - [`fleet_sim`]: a fleet of Maglevs behind ECMP past this machine,
//!   broken connections per event beside three other schemes.
//! - [`forwarder`]: the forwarder's packet rate beside a null forwarder
//!   (section 5.2.2).
//! - [`scaling`]: the forwarder over many threads, per-queue run to
//!   completion beside the steering pipeline and the null forwarder.
//! - [`veth`]: the load balancer on a veth pair beside nftables and an XDP
//!   bounce.
//! - [`switch`]: the switch's Figure 1 (packet I/O in VMs) beside the TAP
//!   backend; [`switch_ports`]: the ports it puts inside the switch (a
//!   source, a sink, a reflector).
//! - [`vm`]: Figure 1 again with QEMU guests that boot a kernel: vhost-user
//!   beside QEMU's TAP backend and an emulated e1000, guest to guest.
//! - [`maio`]: MAIO's Figures 2-4 beside the kernel's own interfaces.
//! - [`xdp`]: the veth bench's traffic generators and XDP programs (the
//!   forwarder of its limit row, the sink, the pass).
//! - [`isolation`]: the switch's ports under attack (blocked interrupt
//!   line, looping and long virtio chains, a spoofing port, idle memif
//!   connections): a victim pair's rate beside its rate without the attack.
//! - [`control`]: the control plane at 1,000 VIPs x 100 backends: load,
//!   a one-backend reload beside a full rebuild, table memory.

pub mod control;
mod cpus;
pub mod fleet_sim;
pub mod forwarder;
pub mod forwarder_stages;
pub mod hash_eval;
pub mod isolation;
pub mod maio;
mod nan;
pub mod peers;
mod proc;
pub mod rollout;
pub mod scaling;
pub mod switch;
pub mod switch_ports;
pub mod veth;
pub mod vm;
pub mod vm_mq;
pub mod vm_rings;
pub mod vm_tcp;
pub mod vm_testpmd;
pub mod vm_upgrade;
pub mod xdp;

/// Called after each measurement with a one-line summary (the switch and
/// VM benches report their progress through it).
pub type Progress = std::sync::Arc<dyn Fn(&str) + Send + Sync>;
