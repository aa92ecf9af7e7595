//! The packet-tracer's reporter (Maglev paper, section 4.4): a thread that
//! drains the records packet threads queue for probes ([`lb::tracer`]),
//! turns each into a JSON [`Report`] and sends it as one UDP datagram to
//! the address the probe named.
//!
//! Sockets are non-blocking: a report that cannot be sent now (no route, a
//! full buffer, an unreachable receiver) is counted in
//! [`Tracer::send_errors`] and dropped, never retried, so a dead report
//! address costs nothing but the count, and nothing at all on the datapath,
//! which only queues records (rate-limited, with `try_lock`).

use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use arc_swap::ArcSwap;
use lb::config::Config;
use lb::tables::Tables;
use lb::tracer::{Record, Report, Tracer};

/// How often the reporter looks at the queue.
pub const POLL: Duration = Duration::from_millis(10);

/// Why the reporter could not start.
#[derive(Debug, thiserror::Error)]
pub enum ReporterError {
    /// The thread could not be started.
    #[error("starting the packet-tracer reporter thread: {0}")]
    Spawn(#[source] std::io::Error),
}

/// This load balancer's name in reports: `[tracer] name`, else `[fleet]
/// name`, else the host name.
pub fn machine_name(cfg: &Config) -> String {
    cfg.tracer
        .name
        .clone()
        .or_else(|| cfg.fleet.as_ref().and_then(|f| f.name.clone()))
        .unwrap_or_else(|| {
            rustix::system::uname()
                .nodename()
                .to_string_lossy()
                .into_owned()
        })
}

/// The reporter's sockets, one per family, made when first needed (a
/// family the machine lacks costs one failed attempt, logged once).
#[derive(Default)]
struct Sockets {
    v4: Option<Result<UdpSocket, ()>>,
    v6: Option<Result<UdpSocket, ()>>,
}

impl Sockets {
    fn for_addr(&mut self, to: &SocketAddr) -> Option<&UdpSocket> {
        let (slot, bind) = if to.is_ipv4() {
            (&mut self.v4, "0.0.0.0:0")
        } else {
            (&mut self.v6, "[::]:0")
        };
        slot.get_or_insert_with(|| {
            UdpSocket::bind(bind)
                .and_then(|s| s.set_nonblocking(true).map(|()| s))
                .map_err(|e| {
                    tracing::warn!("packet tracer: no socket to report from ({bind}): {e}")
                })
        })
        .as_ref()
        .ok()
    }
}

/// Sends the reports for `records`, counting what was sent and what failed.
fn send_all(
    tracer: &Tracer,
    sockets: &mut Sockets,
    machine: &str,
    tables: &Tables,
    records: &mut Vec<Record>,
) {
    for r in records.drain(..) {
        let report = Report::new(&r, machine, tables);
        let to = r.marker.report_to;
        let sent = sockets
            .for_addr(&to)
            .map(|s| s.send_to(&report.to_json(), to));
        match sent {
            Some(Ok(_)) => tracer.sent.fetch_add(1, Ordering::Relaxed),
            _ => tracer.send_errors.fetch_add(1, Ordering::Relaxed),
        };
    }
}

/// Starts the reporter for `tracer` until `stop`: reports name this machine
/// `machine` and the backends and VIPs of `tables`.
pub fn spawn(
    tracer: Arc<Tracer>,
    machine: String,
    tables: Arc<ArcSwap<Tables>>,
    stop: Arc<AtomicBool>,
) -> Result<JoinHandle<()>, ReporterError> {
    std::thread::Builder::new()
        .name("tracer".into())
        .spawn(move || {
            let mut sockets = Sockets::default();
            let mut records = Vec::with_capacity(lb::tracer::QUEUE_LEN);
            loop {
                // Read before draining: records queued before the stop are
                // still reported.
                let stopping = stop.load(Ordering::Acquire);
                tracer.take(&mut records);
                if !records.is_empty() {
                    send_all(
                        &tracer,
                        &mut sockets,
                        &machine,
                        &tables.load(),
                        &mut records,
                    );
                }
                if stopping {
                    break;
                }
                std::thread::sleep(POLL);
            }
        })
        .map_err(ReporterError::Spawn)
}

#[cfg(test)]
mod tests {
    use super::*;
    use lb::tracer::{Marker, Redirect};
    use lb::Control;

    fn record(to: SocketAddr, id: u64) -> Record {
        Record {
            marker: Marker { id, report_to: to },
            thread: 1,
            flow: packet::FlowKey::v4([10, 0, 0, 9], [192, 0, 2, 80], 4000, 80, 6),
            fragment: false,
            conntrack: None,
            generation: 1,
            vip: Some((0, 0xfeed)),
            backend: Some(0),
            redirect: Redirect::No,
            quic: None,
        }
    }

    #[test]
    fn reports_reach_the_receiver_and_failures_are_counted() {
        let cfg = Config::parse(
            r#"
[encap]
source = "10.0.0.1"
[[pools]]
name = "p"
backends = [{ address = "10.1.0.1", name = "b1" }]
[[vips]]
name = "v"
address = "192.0.2.80"
port = 80
protocol = "tcp"
pool = "p"
"#,
            "test",
        )
        .unwrap();
        let control = Control::new(cfg).unwrap();
        let tables = control.tables();
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        rx.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let to = rx.local_addr().unwrap();
        let tracer = Arc::new(Tracer::new(100, 100, 16));
        let sockets = &mut Sockets::default();
        // One to the receiver, one to a port nobody could bind (port 0 is
        // refused by the kernel at send time).
        let mut recs = vec![record(to, 5), record("127.0.0.1:0".parse().unwrap(), 6)];
        send_all(&tracer, sockets, "lb-x", &tables.load(), &mut recs);
        let mut buf = [0u8; lb::tracer::MAX_REPORT];
        let n = rx.recv(&mut buf).unwrap();
        let r = Report::parse(&buf[..n]).unwrap();
        assert_eq!((r.probe, r.machine.as_str()), (5, "lb-x"));
        assert_eq!(r.backend.as_deref(), Some("b1"));
        assert_eq!(r.vip_name.as_deref(), Some("v"));
        assert_eq!(r.fingerprint.as_deref(), Some("000000000000feed"));
        assert_eq!(tracer.sent.load(Ordering::Relaxed), 1);
        assert_eq!(tracer.send_errors.load(Ordering::Relaxed), 1);
    }
}
