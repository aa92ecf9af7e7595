//! The status document as types: what the switch sends (whole, or in pages
//! that fit one control message), what `fastpath switch status` reads back
//! ([`ask`]), and its table for people ([`Status::to_text`]). The JSON is
//! these types' serde form, so the switch, the client and scripts agree on
//! one set of field names without reading each other's code.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use measure::Table;
use serde::{Deserialize, Serialize};

/// Switch-wide counters.
#[derive(Debug, Default, Clone, Copy, serde::Serialize, serde::Deserialize)]
pub struct SwitchStats {
    /// Frames delivered to at least one port.
    pub forwarded: u64,
    /// Frames sent to every port (unknown or group destination).
    pub flooded: u64,
    /// Frames shorter than an Ethernet header.
    pub runts: u64,
    /// Frames whose destination is the port they came from.
    pub same_port: u64,
    /// Frames no port received (flooded with no other port, or all full).
    pub no_destination: u64,
    /// Frames dropped by port security (a locked port's frame from another
    /// source address, or any port's frame from an address locked to
    /// another port).
    pub spoofed: u64,
    /// Batches forwarded (one per port with frames, per pass).
    pub batches: u64,
    /// Times the switch slept in epoll.
    pub sleeps: u64,
    /// Passes over the ports (each looks at every port once).
    pub passes: u64,
    /// Passes that found no frames anywhere (polling while idle).
    pub idle_passes: u64,
    /// Wall-clock nanoseconds spent in passes that found frames (the
    /// forwarding itself; idle polling and sleeping excluded).
    pub busy_ns: u64,
    /// Segmentation requests cut into frames by the switch for a port
    /// that could not take them whole (once per destination).
    #[serde(default)]
    pub segmented: u64,
    /// Partial checksums completed by the switch for a port that could not
    /// take them partial (once per destination).
    #[serde(default)]
    pub checksummed: u64,
    /// Time the switch polled past its floor (`poll_us`) because a port's
    /// adaptive window was open, nanoseconds.
    #[serde(default)]
    pub polled_ns: u64,
    /// The part of it that ended in a sleep (no frame came): what the
    /// polling budget (`poll_budget_pct`) bounds.
    #[serde(default)]
    pub poll_wasted_ns: u64,
    /// Sleeps taken while a port's window was still open, because the
    /// polling budget was spent.
    #[serde(default)]
    pub budget_sleeps: u64,
}

/// Why the status could not be had from a running switch.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    /// Asking on the control socket failed: connecting, sending or
    /// receiving, a closed connection, or the switch's refusal.
    #[error("control socket {}", path.display())]
    Socket {
        /// The socket path.
        path: PathBuf,
        /// Why.
        #[source]
        source: ring::Error,
    },
    /// The reply is not a status document.
    #[error("the switch's reply is not a status document")]
    Reply(#[source] serde_json::Error),
}

/// The status document: the switch's counters and its ports.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Status {
    /// Switch-wide counters.
    pub switch: SwitchStats,
    /// Addresses in the MAC table.
    pub macs: usize,
    /// The ports (of this page, when paged).
    pub ports: Vec<PortStatus>,
    /// The port index the next page starts at; absent on the last page
    /// and in a whole document.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<usize>,
}

/// One port's entry in the status document.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PortStatus {
    /// The port's slot in the switch.
    pub index: usize,
    /// Its name, unique in the switch.
    pub name: String,
    /// Its kind (`ring`, `memif`, `vhost-user`, `tap`, ...).
    pub kind: String,
    /// Frames the port handed the switch.
    pub from_port: u64,
    /// Frames the switch gave the port.
    pub to_port: u64,
    /// Bytes of those frames.
    pub to_port_bytes: u64,
    /// Frames for this port dropped because it could not take them.
    pub dropped_full: u64,
    /// Frames from this port dropped by port security.
    pub spoofed: u64,
    /// Time the switch held the port back (did not take its frames) for
    /// frames port security refused, microseconds.
    #[serde(default)]
    pub spoof_held_us: u64,
    /// The only source address the port may use, if it is locked.
    pub locked_mac: Option<String>,
    /// The port's adaptive polling window and what it cost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub polling: Option<PollingStatus>,
    /// What only this kind of port has.
    pub detail: PortDetail,
}

/// A port's adaptive polling window (see the switch's `poll_max_us`): how
/// long the switch keeps polling after the port's last frame, and the
/// polling it caused.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PollingStatus {
    /// The window learned from the gaps between the port's frames,
    /// microseconds (0: none, the switch polls `poll_us` after any work).
    pub window_us: u64,
    /// The share of the last full second the port's window kept the
    /// switch polling past `poll_us` (1: a whole core).
    pub polled_share: f64,
    /// Time the switch polled past `poll_us` while the window was open,
    /// microseconds.
    pub polled_us: u64,
    /// The part of it that found nothing (the switch slept after it).
    pub wasted_us: u64,
    /// Passes in which the port had frames.
    pub arrivals: u64,
}

/// The part of a port's status that depends on its kind. Serialized as the
/// kind's own object (no tag: the entry's `kind` names it); each variant's
/// fields are exactly its kind's, so reading one back picks its variant.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
pub enum PortDetail {
    /// A shared-memory ring port.
    Ring(RingDetail),
    /// A memif client's port.
    Memif(MemifDetail),
    /// A virtual machine's port.
    Vhost(Box<VhostDetail>),
    /// A TAP device.
    Tap(TapDetail),
    /// The frame generator inside the switch.
    Generator(GeneratorDetail),
    /// The reflector inside the switch.
    Echo(EchoDetail),
    /// A kind with nothing of its own to say.
    None(NoDetail),
}

impl PortDetail {
    /// Notifications from the port's driver (doorbells), where it counts them.
    pub fn kicks(&self) -> Option<u64> {
        match self {
            PortDetail::Ring(d) => Some(d.kicks),
            PortDetail::Vhost(d) => Some(d.kicks),
            _ => None,
        }
    }

    /// Signals the switch raised on the port's interrupt line, where it
    /// counts them (not interrupts the driver took).
    pub fn interrupts(&self) -> Option<u64> {
        match self {
            PortDetail::Ring(d) => Some(d.interrupts),
            PortDetail::Vhost(d) => Some(d.interrupts),
            _ => None,
        }
    }

    /// Signals the port's interrupt line could not take, where it counts
    /// them.
    pub fn signals_blocked(&self) -> Option<u64> {
        match self {
            PortDetail::Ring(d) => Some(d.signals_blocked),
            PortDetail::Memif(d) => Some(d.signals_blocked),
            PortDetail::Vhost(d) => Some(d.signals_blocked),
            _ => None,
        }
    }

    /// Times a queue of the port stopped for what its peer wrote
    /// (impossible indices, looping chains), where it counts them.
    pub fn queue_stops(&self) -> Option<u64> {
        match self {
            PortDetail::Vhost(d) => Some(d.queues.rx.broke + d.queues.tx.broke),
            _ => None,
        }
    }

    /// Passes the port's queues cut short for their descriptor budget,
    /// where it counts them.
    pub fn over_budget(&self) -> Option<u64> {
        match self {
            PortDetail::Vhost(d) => Some(d.queues.rx.over_budget + d.queues.tx.over_budget),
            _ => None,
        }
    }

    /// Time the port's queues were held back with their descriptor budget
    /// spent, microseconds (both queues added), where it counts it.
    pub fn held_back_us(&self) -> Option<u64> {
        match self {
            PortDetail::Vhost(d) => Some(d.queues.rx.held_back_us + d.queues.tx.held_back_us),
            _ => None,
        }
    }

    /// Why the port is no longer served, if it is broken.
    pub fn broken(&self) -> Option<&str> {
        match self {
            PortDetail::Ring(d) => d.broken.as_deref(),
            PortDetail::Memif(d) => d.broken.as_deref(),
            PortDetail::Vhost(d) => d.broken.as_deref(),
            _ => None,
        }
    }

    /// Whether the port's peer is connected, for kinds that wait for one.
    pub fn connected(&self) -> Option<bool> {
        match self {
            PortDetail::Vhost(d) => Some(d.connected),
            _ => None,
        }
    }
}

/// A ring port's own status.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RingDetail {
    /// How the port notifies (`base`, `sc`, `csb`).
    pub mode: String,
    /// Ring slots.
    pub slots: u32,
    /// The driver's kicks.
    pub kicks: u64,
    /// Signals the switch raised on the driver's interrupt line (not
    /// interrupts the driver took: a sleeping driver takes one for many).
    pub interrupts: u64,
    /// Signals the line could not take: the driver left its counter full
    /// or its write waiting (see [`ring::signaller`]).
    #[serde(default)]
    pub signals_blocked: u64,
    /// Slots the driver filled with impossible values.
    pub bad_slots: u64,
    /// Impossible ring indexes from the driver.
    pub bad_index: u64,
    /// Why the port broke, if it did.
    pub broken: Option<String>,
}

/// A memif port's own status.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemifDetail {
    /// The client's name for itself.
    pub peer: String,
    /// Slots in each ring.
    pub ring_size: u16,
    /// Descriptors the client filled with impossible values.
    pub bad_descriptors: u64,
    /// Frames longer than a buffer.
    pub too_long: u64,
    /// Interrupt moderation, microseconds (0: off).
    pub moderation_us: u64,
    /// Sleeps during which the client's interrupts were masked.
    pub moderated_sleeps: u64,
    /// Whether the client's interrupts are masked now.
    pub interrupts_masked: bool,
    /// Signals the client's interrupt line could not take (its counter
    /// left full, or its write waiting).
    #[serde(default)]
    pub signals_blocked: u64,
    /// Why the port broke, if it did.
    pub broken: Option<String>,
}

/// A vhost-user (virtual machine) port's own status.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VhostDetail {
    /// The socket QEMU connects to.
    pub socket: String,
    /// The notification scheme.
    pub mode: String,
    /// Interrupt moderation, 250 ns units.
    pub itr: u32,
    /// The guest's address, if configured.
    pub mac: Option<String>,
    /// Whether a frontend is connected.
    pub connected: bool,
    /// Whether both queues are running.
    pub running: bool,
    /// The guest's doorbell writes, both queues.
    pub kicks: u64,
    /// Signals raised on the queues' call lines (interrupts asked of QEMU,
    /// not interrupts the guest took), both queues.
    pub interrupts: u64,
    /// Signals the call lines could not take (the frontend left a counter
    /// full or a write waiting), both queues of the current connection.
    #[serde(default)]
    pub signals_blocked: u64,
    /// Why a queue broke, if one did.
    pub broken: Option<String>,
    /// The connected frontend, if any.
    pub frontend: Option<FrontendStatus>,
    /// The first queue pair (every pair: [`VhostDetail::pairs`]).
    pub queues: Queues,
    /// Queue pairs the port offers (`VIRTIO_NET_F_MQ` above 1).
    #[serde(default)]
    pub queue_pairs: u16,
    /// Every queue pair offered: whether it runs (the guest enabled it),
    /// and its queues.
    #[serde(default)]
    pub pairs: Vec<PairStatus>,
    /// Guest kicks per frame it sent.
    pub kicks_per_packet: f64,
    /// Interrupts per frame the guest sent.
    pub tx_interrupts_per_packet: f64,
    /// Interrupts per frame the guest received.
    pub rx_interrupts_per_packet: f64,
    /// Frontends accepted.
    pub accepted: u64,
    /// Frontends turned away (one at a time).
    pub turned_away: u64,
    /// Frontend connections closed.
    pub closed: u64,
    /// Why the last connection closed.
    pub last_close: Option<String>,
}

/// What a vhost-user frontend negotiated.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FrontendStatus {
    /// Acked virtio features, hex, once set.
    pub features: Option<String>,
    /// Acked vhost-user protocol features, hex.
    pub protocol_features: String,
    /// Whether event-index notification suppression was negotiated.
    pub event_idx: bool,
    /// Guest memory mapped, bytes.
    pub memory_bytes: Option<u64>,
    /// The memory table, as text.
    pub memory_regions: Option<String>,
    /// The seals on the guest's memory files.
    pub memory_seals: Option<Vec<String>>,
    /// vhost-user requests served.
    pub requests: u64,
}

/// One queue pair of a VM port.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PairStatus {
    /// Whether both its queues run (set up and enabled by the guest).
    pub running: bool,
    /// Its receive and transmit queues.
    pub queues: Queues,
}

/// A VM port's receive and transmit queues.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Queues {
    /// The guest's receive queue.
    pub rx: QueueStatus,
    /// The guest's transmit queue.
    pub tx: QueueStatus,
}

/// One virtqueue's counters and state.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QueueStatus {
    /// Kicks from the guest.
    pub kicks: u64,
    /// Calls made.
    pub calls: u64,
    /// Calls held by moderation.
    pub calls_held: u64,
    /// Calls the guest's window suppressed.
    pub calls_suppressed: u64,
    /// Chains completed.
    pub chains: u64,
    /// Chains refused, by reason.
    pub refused: BTreeMap<String, u64>,
    /// Times the queue broke.
    pub broke: u64,
    /// Descriptors read.
    #[serde(default)]
    pub desc_reads: u64,
    /// Passes cut short by the queue's descriptor budget.
    #[serde(default)]
    pub over_budget: u64,
    /// Time the queue was held back with its descriptor budget spent,
    /// microseconds.
    #[serde(default)]
    pub held_back_us: u64,
    /// Entries, while the queue runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u16>,
    /// Why the queue broke, if it runs and did.
    #[serde(default)]
    pub broken: Option<String>,
    /// `false` while the queue is not running (absent while it is).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running: Option<bool>,
}

/// A TAP port's own status.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TapDetail {
    /// Frames the kernel refused.
    pub write_errors: u64,
}

/// The generator's own status.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GeneratorDetail {
    /// Bytes per frame.
    pub frame_len: usize,
}

/// The reflector's own status.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EchoDetail {
    /// Frames waiting to go back.
    pub queued: usize,
}

/// Nothing: `{}`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoDetail {}

impl Status {
    /// The ports as a table, then the switch's counters and the number of
    /// learned addresses.
    pub fn to_text(&self) -> String {
        let mut t = Table::new([
            "port",
            "kind",
            "from port",
            "to port",
            "dropped (full)",
            "spoofed",
            "kicks",
            "signals",
            "kicks/pkt",
            "signals/pkt",
            "line blocked",
            "queue stops",
            "over budget",
            "held back ms",
            "poll window us",
            "polled share",
            "state",
        ])
        .title("switch ports");
        let n = |v: Option<u64>| v.map_or_else(|| "-".to_string(), |x| x.to_string());
        for p in &self.ports {
            let d = &p.detail;
            let packets = p.from_port + p.to_port;
            let per = |v: Option<u64>| match v {
                Some(x) if packets > 0 => format!("{:.4}", x as f64 / packets as f64),
                _ => "-".into(),
            };
            let state = match (d.broken(), d.connected()) {
                (Some(b), _) => format!("broken: {b}"),
                (None, Some(false)) => "waiting for QEMU".to_string(),
                _ => "ok".to_string(),
            };
            t.row([
                p.name.clone(),
                p.kind.clone(),
                p.from_port.to_string(),
                p.to_port.to_string(),
                p.dropped_full.to_string(),
                p.spoofed.to_string(),
                n(d.kicks()),
                n(d.interrupts()),
                per(d.kicks()),
                per(d.interrupts()),
                n(d.signals_blocked()),
                n(d.queue_stops()),
                n(d.over_budget()),
                format!(
                    "{:.1}",
                    (d.held_back_us().unwrap_or(0) + p.spoof_held_us) as f64 / 1e3
                ),
                p.polling
                    .as_ref()
                    .map_or_else(|| "-".into(), |w| w.window_us.to_string()),
                p.polling
                    .as_ref()
                    .map_or_else(|| "-".into(), |w| format!("{:.2}", w.polled_share)),
                state,
            ]);
        }
        use crate::budgets::{DESC_BUDGET, DESC_RATE, FREE_READS};
        let spoof_us = crate::budgets::SPOOF_HOLD_PER_FRAME.as_micros();
        let spoof_max_ms = crate::budgets::SPOOF_HOLD_MAX.as_millis();
        format!(
            "{t}held back: time the switch took no frames from the port: a VM queue reads at most \
             {DESC_RATE} descriptors a second (and {DESC_BUDGET} a pass) beyond {FREE_READS} a \
             chain, and waits out a debt; a port is held {spoof_us} µs per frame port security \
             refused (at most {spoof_max_ms} ms a batch)\n\
             switch: {}\nlearned addresses: {}\n",
            serde_json::to_string(&self.switch).unwrap_or_default(),
            self.macs
        )
    }
}

/// The first part of every reply on the control socket: whether the
/// switch did what was asked, and if not, why.
#[derive(Serialize, Deserialize)]
pub(crate) struct Outcome {
    pub(crate) ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<String>,
}

/// A reply on the control socket: the outcome, and what was asked for
/// beside it in the same object.
#[derive(Serialize)]
pub(crate) struct Reply<T: Serialize> {
    #[serde(flatten)]
    pub(crate) outcome: Outcome,
    #[serde(flatten)]
    pub(crate) body: T,
}

impl<T: Serialize> Reply<T> {
    /// Done, and here is `body`.
    pub(crate) fn ok(body: T) -> Reply<T> {
        Reply {
            outcome: Outcome {
                ok: true,
                error: None,
            },
            body,
        }
    }
}

impl<T: Serialize> Reply<T> {
    /// The reply as the message that carries it. Serializing these types
    /// cannot fail (no map keys that are not strings, no failing
    /// `Serialize`), so an empty message is never sent in practice.
    pub(crate) fn bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

impl Reply<NoDetail> {
    /// Refused, because `why`.
    pub(crate) fn refused(why: String) -> Reply<NoDetail> {
        Reply {
            outcome: Outcome {
                ok: false,
                error: Some(why),
            },
            body: NoDetail {},
        }
    }
}

/// Ask the switch listening on `path` for its status document, every page
/// of it (a switch with many ports sends them in pages that each fit one
/// message).
pub fn ask(path: &Path) -> Result<Status, StatusError> {
    // ring's client gathers the pages (and refuses a switch that answers
    // the same page again); the document is then read as typed.
    let doc = ring::control::status(path).map_err(|source| StatusError::Socket {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_value(doc).map_err(StatusError::Reply)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue() -> QueueStatus {
        QueueStatus {
            kicks: 1,
            calls: 2,
            calls_held: 3,
            calls_suppressed: 4,
            chains: 5,
            refused: [("loop".to_string(), 6)].into_iter().collect(),
            broke: 0,
            desc_reads: 7,
            over_budget: 0,
            held_back_us: 0,
            size: Some(256),
            broken: None,
            running: None,
        }
    }

    /// One detail of every kind.
    fn every_kind() -> Vec<PortDetail> {
        vec![
            PortDetail::Ring(RingDetail {
                mode: "csb".into(),
                slots: 1024,
                kicks: 1,
                interrupts: 2,
                signals_blocked: 1,
                bad_slots: 0,
                bad_index: 0,
                broken: None,
            }),
            PortDetail::Memif(MemifDetail {
                peer: "testpmd".into(),
                ring_size: 1024,
                bad_descriptors: 3,
                too_long: 0,
                moderation_us: 10,
                moderated_sleeps: 7,
                interrupts_masked: true,
                signals_blocked: 0,
                broken: Some("bad ring".into()),
            }),
            PortDetail::Vhost(Box::new(VhostDetail {
                socket: "/tmp/vm.sock".into(),
                mode: "sc".into(),
                itr: 100,
                mac: Some("52:54:00:00:00:01".into()),
                connected: false,
                running: false,
                kicks: 9,
                interrupts: 8,
                signals_blocked: 0,
                broken: None,
                frontend: None,
                queues: Queues {
                    rx: queue(),
                    tx: QueueStatus {
                        size: None,
                        running: Some(false),
                        ..queue()
                    },
                },
                queue_pairs: 1,
                pairs: Vec::new(),
                kicks_per_packet: 0.5,
                tx_interrupts_per_packet: 0.25,
                rx_interrupts_per_packet: 0.0,
                accepted: 2,
                turned_away: 0,
                closed: 1,
                last_close: Some("peer closed".into()),
            })),
            PortDetail::Tap(TapDetail { write_errors: 4 }),
            PortDetail::Generator(GeneratorDetail { frame_len: 60 }),
            PortDetail::Echo(EchoDetail { queued: 2 }),
            PortDetail::None(NoDetail {}),
        ]
    }

    #[test]
    fn every_kind_of_detail_reads_back_as_itself() {
        for d in every_kind() {
            let text = serde_json::to_string(&d).unwrap();
            let back: PortDetail = serde_json::from_str(&text).unwrap();
            assert_eq!(
                std::mem::discriminant(&back),
                std::mem::discriminant(&d),
                "{text}"
            );
            assert_eq!(serde_json::to_string(&back).unwrap(), text);
        }
    }

    #[test]
    fn the_table_shows_each_port_and_the_switch() {
        let ports = every_kind()
            .into_iter()
            .enumerate()
            .map(|(i, detail)| PortStatus {
                index: i,
                name: format!("p{i}"),
                kind: "k".into(),
                from_port: 10,
                to_port: 10,
                to_port_bytes: 600,
                dropped_full: 0,
                spoofed: 0,
                spoof_held_us: 0,
                locked_mac: None,
                polling: Some(PollingStatus::default()),
                detail,
            })
            .collect();
        let s = Status {
            switch: SwitchStats::default(),
            macs: 3,
            ports,
            next: None,
        };
        let text = s.to_text();
        assert!(text.contains("broken: bad ring"), "{text}");
        assert!(text.contains("waiting for QEMU"), "{text}");
        assert!(text.contains("learned addresses: 3"), "{text}");
        let back: Status = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(back.to_text(), text);
    }
}
