//! The load balancer on a real interface: `fastpath lb run --interface`.

use std::path::Path;
use std::sync::atomic::AtomicBool;

use netio::afpacket::{self, AfPacketPort};

use crate::datapath::{Datapath, Params, RunStats};
use crate::pcap_run::Error;
use crate::tables::{Control, Tables};
use crate::Config;

/// Packet I/O drivers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Driver {
    /// AF_PACKET with a TPACKET_V3 receive ring.
    AfPacket,
}

/// Forwards on `interface` until `stop` is set; returns the counters.
/// `encap.mac` defaults to the interface's own MAC.
pub fn run(
    config: &Path,
    interface: &str,
    driver: Driver,
    threads: Option<usize>,
    stop: &AtomicBool,
) -> Result<(RunStats, std::sync::Arc<Tables>), Error> {
    let mut cfg = Config::load(config)?;
    if let Some(t) = threads {
        cfg.forwarder.threads = t;
    }
    if cfg.encap.mac.is_none() {
        cfg.encap.mac = afpacket::mac_address(interface).map(|m| {
            m.iter()
                .map(|b| format!("{b:02x}"))
                .collect::<Vec<_>>()
                .join(":")
        });
    }
    let control = Control::new(cfg.clone())?;
    let dp = Datapath::new(Params::from_config(&cfg), control.tables())?;
    let mut port = match driver {
        Driver::AfPacket => AfPacketPort::open(afpacket::Config::new(interface))?,
    };
    tracing::info!(interface, driver = ?driver, "forwarding; stop with SIGINT or SIGTERM");
    let stats = dp.run(&mut port, stop)?;
    Ok((stats, control.tables().load_full()))
}
