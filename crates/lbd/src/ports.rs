//! The interface's packet ports: the driver (`[forwarder] driver`, or
//! `--driver`, which overrides it), how many sockets (one AF_XDP socket
//! per packet thread when the interface has a receive queue for each, else
//! one on every queue behind one I/O loop), the pool buffers those sockets
//! keep, and opening them with the fall-back `auto` promises: AF_XDP per
//! queue, then AF_XDP on all queues, then AF_PACKET, saying why.

use lb::config::Driver;
use lb::datapath::Params;
use lb::tables::Tables;
use lb::Config;
use netio::afpacket::{self, AfPacketPort};
use netio::afxdp::{AfXdpPort, AllQueues, Program, VipFilter};

use crate::tasks::xdp_sync::XdpLb;

/// Why the interface's ports could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The interface could not be opened.
    #[error(transparent)]
    Port(#[from] netio::Error),
}

/// The VIP addresses the XDP program steers (prefix-group VIPs are
/// steered by [`vip_prefixes`]: their addresses are not known in advance).
pub(crate) fn vip_addresses(cfg: &Config) -> Vec<[u8; 16]> {
    cfg.vips
        .iter()
        .filter_map(|v| v.address)
        .map(packet::flow::from_ip)
        .collect()
}

/// The prefix groups' prefixes of the tables' `matcher`, IPv4-mapped as
/// the VIP addresses are: the XDP program steers every frame within them,
/// as the worker's matcher looks every such frame up.
pub(crate) fn vip_prefixes(matcher: &lb::vip::VipMatcher) -> Vec<([u8; 16], u8)> {
    matcher
        .prefixes()
        .into_iter()
        .map(|(net, len, _, _)| (net.to_be_bytes(), len))
        .collect()
}

/// The XDP program's steering set made the configuration's: addresses
/// were given at open, prefixes follow.
fn steer_prefixes(filter: &VipFilter, tables: &Tables) -> Result<(), netio::Error> {
    filter.set_prefixes(&vip_prefixes(&tables.matcher))
}

/// The number of receive queues of an interface (from sysfs; 1 if unknown).
pub(crate) fn rx_queues(interface: &str) -> u32 {
    std::fs::read_dir(format!("/sys/class/net/{interface}/queues"))
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().starts_with("rx-"))
                .count() as u32
        })
        .unwrap_or(1)
        .max(1)
}

/// How the daemon will use its interface, decided before the datapath is
/// made (the pool's size depends on it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Plan {
    /// The driver asked for.
    pub(crate) driver: Driver,
    /// The interface's receive queues.
    queues: u32,
    /// One AF_XDP socket per packet thread, each on its own queue and run
    /// to completion.
    per_queue: bool,
}

/// The ports the datapath serves.
pub(crate) enum Ports {
    /// One port; packet threads fed by software steering (or inline).
    One(Box<dyn netio::Nic>),
    /// One port per packet thread, each run to completion.
    Queues(Vec<Box<dyn netio::Nic + Send>>),
}

/// The interface's ports, opened.
pub(crate) struct Opened {
    /// The ports.
    pub(crate) ports: Ports,
    /// With AF_XDP: the XDP program's VIP set.
    pub(crate) xdp_vips: Option<VipFilter>,
    /// With the load balancer in the driver: its maps.
    pub(crate) xdp_lb: Option<XdpLb>,
    /// The driver in use, in words (and, for a fall-back, why).
    pub(crate) description: String,
}

impl Plan {
    /// The plan for `driver` on `interface` under `cfg`.
    pub(crate) fn new(driver: Driver, interface: &str, cfg: &Config) -> Plan {
        // One AF_XDP socket per packet thread when the interface has a
        // receive queue for each (the NIC spreads flows; each thread runs to
        // completion).
        let queues = rx_queues(interface);
        let per_queue = driver != Driver::AfPacket
            && cfg.forwarder.threads >= 2
            && queues >= cfg.forwarder.threads as u32
            && cfg.vips.iter().all(|v| v.address.is_some());
        // With `[fleet]` too: the NIC brings a peer's redirected fragments
        // (hashed on their outer GRE header) to other queues than the rest
        // of their datagram, so the queues' workers share one fragment
        // table (lb's `Datapath::run_queues`).
        Plan {
            driver,
            queues,
            per_queue,
        }
    }

    /// Adds the buffers the AF_XDP sockets keep for themselves (fill ring,
    /// transmit buffers, queues) to the pool's size.
    pub(crate) fn size_pool(&self, params: &mut Params, cfg: &Config) {
        if self.driver != Driver::AfPacket {
            // Per queue: one socket per packet thread; else one socket on
            // every queue behind the one I/O loop.
            let sockets = if self.per_queue {
                cfg.forwarder.threads as u32
            } else {
                self.queues
            };
            params.pool_buffers +=
                sockets * (netio::afxdp::BUFFERS_NEEDED + 4 * cfg.forwarder.queue_size as u32);
        }
    }

    /// Opens the ports on `interface` with buffers from `pool`, falling
    /// back as `auto` allows; `tables` sizes the maps of the load balancer
    /// in the driver.
    pub(crate) fn open(
        &self,
        interface: &str,
        pool: &maio::Pool,
        cfg: &Config,
        tables: &Tables,
    ) -> Result<Opened, OpenError> {
        let driver = self.driver;
        let loader = lb::xdp::Loader::for_tables(cfg, tables);
        let program = if driver == Driver::Xdp {
            Program::Custom(&loader)
        } else {
            Program::Steer
        };
        let in_driver = |lb: &Option<XdpLb>| {
            if lb.is_some() {
                "the load balancer in the driver (XDP) for TCP/UDP, "
            } else {
                ""
            }
        };
        if self.per_queue {
            match AfXdpPort::open_queues_with(
                interface,
                pool,
                &vip_addresses(cfg),
                cfg.forwarder.threads as u32,
                program,
            )
            .and_then(|ports| match ports.first() {
                Some(p) => steer_prefixes(&p.vip_filter(), tables).map(|()| ports),
                None => Ok(ports),
            }) {
                Ok(ports) => {
                    let filter = ports[0].vip_filter();
                    let xdp_lb = loader.maps();
                    let description = format!(
                        "{}AF_XDP ({:?} XDP, copy mode), one socket per queue on {} queues",
                        in_driver(&xdp_lb),
                        ports[0].mode(),
                        ports.len()
                    );
                    let boxed: Vec<Box<dyn netio::Nic + Send>> = ports
                        .into_iter()
                        .map(|p| Box::new(p) as Box<dyn netio::Nic + Send>)
                        .collect();
                    return Ok(Opened {
                        ports: Ports::Queues(boxed),
                        xdp_vips: Some(filter),
                        xdp_lb,
                        description,
                    });
                }
                Err(e) if driver == Driver::Auto => {
                    tracing::warn!("one AF_XDP socket per queue failed ({e}); trying one socket")
                }
                Err(e) => return Err(e.into()),
            }
        }
        let open_packet = || {
            AfPacketPort::open(afpacket::Config::new(interface))
                .map(|p| Box::new(p) as Box<dyn netio::Nic>)
        };
        let description: String;
        let (port, xdp_vips, xdp_lb): (Box<dyn netio::Nic>, _, _) = match driver {
            Driver::AfPacket => {
                description = "AF_PACKET (asked for)".into();
                (open_packet()?, None, None)
            }
            Driver::AfXdp | Driver::Xdp | Driver::Auto => {
                let xdp = AllQueues::open_with(
                    interface,
                    pool,
                    &vip_addresses(cfg),
                    self.queues,
                    program,
                )
                .and_then(|p| steer_prefixes(&p.first().vip_filter(), tables).map(|()| p))
                .map_err(OpenError::from);
                match (xdp, driver) {
                    (Ok(p), _) => {
                        let xdp_lb = loader.maps();
                        description = format!(
                            "{}AF_XDP ({:?} XDP, copy mode){}",
                            in_driver(&xdp_lb),
                            p.first().mode(),
                            if p.queues() > 1 {
                                format!(", {} queues into one I/O loop", p.queues())
                            } else {
                                String::new()
                            }
                        );
                        let f = p.first().vip_filter();
                        (Box::new(p) as Box<dyn netio::Nic>, Some(f), xdp_lb)
                    }
                    (Err(e), Driver::Auto) => {
                        description = format!("AF_PACKET, because AF_XDP is unavailable: {e}");
                        (open_packet()?, None, None)
                    }
                    (Err(e), _) => return Err(e),
                }
            }
        };
        Ok(Opened {
            ports: Ports::One(port),
            xdp_vips,
            xdp_lb,
            description,
        })
    }
}
