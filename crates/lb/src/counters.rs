//! Packet-thread counters: plain integers owned by one thread, merged when
//! read.

use serde::Serialize;

use crate::conntrack;

/// Why the forwarder dropped a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// The packet is malformed.
    Malformed(packet::Reason),
    /// Not for any VIP.
    NoVip,
    /// For a VIP's address, on a port or protocol no VIP serves: traffic
    /// for the load balancer that it drops (unlike [`DropReason::NoVip`],
    /// a drop an operator looks for: a client or a VIP misconfigured).
    VipPortNotServed,
    /// The VIP has no healthy backend.
    NoHealthyBackend,
    /// No room for the outer headers, or the result too big.
    EncapFailed,
    /// A fragment arrived before its first fragment and the fragment table
    /// had no room for it.
    FragTableFull,
    /// A fragment waited too long for its first fragment.
    FragExpired,
    /// A fragment's responsible `[fleet]` peer is down ([`crate::frag_redirect`]):
    /// dropped, not sent to another peer.
    FragmentPeerDown,
    /// A fragment redirected here by a peer is not for a VIP.
    FragmentRedirectNoVip,
    /// GRE marked as a redirected fragment that does not hold one: the
    /// inner packet is malformed or not a fragment, or the GRE packet was
    /// itself fragmented on the way (the link between load balancers needs
    /// room for a fragment plus 28 bytes of IPv4 and GRE headers).
    FragmentRedirectMalformed,
    /// GRE marked as a redirected fragment from a source that is not one
    /// of the `[fleet]` peers (or with no `[fleet]`), or from this load
    /// balancer's own address (it never redirects to itself): a forgery,
    /// which would reach a backend past the router's filters.
    FragmentRedirectNotPeer,
    /// For a VIP, from a source that no packet may carry
    /// ([`packet::flow::martian_source`]: "this network", loopback,
    /// multicast, reserved or broadcast; IPv6 unspecified, loopback,
    /// multicast; or such an IPv4 address mapped into IPv6): spoofed or
    /// leaked, and a backend's answer would go nowhere or somewhere it
    /// must not.
    MartianSource,
    /// For a VIP, from a VIP's own address (this packet's destination, or
    /// any VIP's address): only a forger sends from the load balancer's
    /// addresses, and a backend answering it would send to itself.
    SourceIsVip,
    /// For a VIP with an IPv4 TTL or IPv6 hop limit of 0: no router
    /// forwards one (RFC 1812 section 5.3.1, RFC 8200 section 3), so it
    /// was made here, on the link.
    TtlZero,
}

const OWN: [(&str, DropReason); 13] = [
    ("no_vip", DropReason::NoVip),
    ("no_healthy_backend", DropReason::NoHealthyBackend),
    ("encap_failed", DropReason::EncapFailed),
    ("frag_table_full", DropReason::FragTableFull),
    ("frag_expired", DropReason::FragExpired),
    ("fragment_peer_down", DropReason::FragmentPeerDown),
    (
        "fragment_redirect_no_vip",
        DropReason::FragmentRedirectNoVip,
    ),
    (
        "fragment_redirect_malformed",
        DropReason::FragmentRedirectMalformed,
    ),
    (
        "fragment_redirect_not_peer",
        DropReason::FragmentRedirectNotPeer,
    ),
    ("vip_port_not_served", DropReason::VipPortNotServed),
    ("martian_source", DropReason::MartianSource),
    ("source_is_vip", DropReason::SourceIsVip),
    ("ttl_zero", DropReason::TtlZero),
];

/// Frames that were not for the load balancer: not IP (ARP, LLDP...), or
/// IP for no VIP (on AF_PACKET the kernel's own traffic: SSH, BGP, BFD...).
/// They are counted in the drop slots like other frames the packet threads
/// finish without forwarding ([`Counters::dropped`] keeps the accounting
/// received = forwarded + dropped), but reported apart from drops
/// ([`Counters::not_for_vip`], [`Counters::dropped_excluding_not_for_vip`]):
/// they are not lost traffic.
pub const NOT_FOR_VIP: [DropReason; 2] = [
    DropReason::Malformed(packet::Reason::NotIp),
    DropReason::NoVip,
];

/// Number of drop reasons.
pub const DROP_REASONS: usize = packet::Reason::ALL.len() + OWN.len();

impl DropReason {
    /// Position in the drop counters.
    pub fn index(self) -> usize {
        match self {
            DropReason::Malformed(r) => r.index(),
            other => {
                packet::Reason::ALL.len() + OWN.iter().position(|(_, d)| *d == other).unwrap_or(0)
            }
        }
    }

    /// Stable snake_case name.
    pub fn name_of(index: usize) -> &'static str {
        match packet::Reason::ALL.get(index) {
            Some(r) => r.name(),
            None => OWN
                .get(index - packet::Reason::ALL.len())
                .map_or("unknown", |(n, _)| n),
        }
    }
}

/// Packets and bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Traffic {
    /// Packets.
    pub packets: u64,
    /// Bytes (of the received frame).
    pub bytes: u64,
}

impl Traffic {
    #[inline]
    pub(crate) fn add(&mut self, bytes: usize) {
        self.packets += 1;
        self.bytes += bytes as u64;
    }
}

/// Entry `i` of `table`, growing the table (VIPs and backends can be
/// added by a reload).
#[inline]
fn entry(table: &mut Vec<Traffic>, i: u32) -> &mut Traffic {
    let i = i as usize;
    if i >= table.len() {
        table.resize(i + 1, Traffic::default());
    }
    &mut table[i]
}

/// Counts a packet of `bytes` for entry `i`.
#[inline]
fn bump(table: &mut Vec<Traffic>, i: u32, bytes: usize) {
    entry(table, i).add(bytes);
}

/// One packet thread's counters (or the sum of several).
#[derive(Debug, Clone, Default)]
pub struct Counters {
    /// Packets handed to the thread.
    pub rx: u64,
    /// Packets forwarded.
    pub tx: u64,
    /// Drops by reason ([`DropReason::index`]).
    pub drops: Vec<u64>,
    /// Per VIP index.
    pub per_vip: Vec<Traffic>,
    /// Per backend id.
    pub per_backend: Vec<Traffic>,
    /// Connection tracking.
    pub conntrack: conntrack::Stats,
    /// Fragments held for their first fragment.
    pub frag_held: u64,
    /// Held fragments released after their first fragment arrived.
    pub frag_released: u64,
    /// ICMP errors sent to the backend of the flow they quote.
    pub icmp_to_backend: u64,
    /// Times a thread waited for room in its transmit queue.
    pub tx_stalls: u64,
    /// Fragments sent to the `[fleet]` peer responsible for them (counted
    /// in `tx` too).
    pub frag_redirected: u64,
    /// The same, per peer: by counter slot
    /// ([`crate::frag_redirect::Fleet::counter_slot`]).
    pub frag_redirected_to: Vec<u64>,
    /// Fragments that arrived redirected by a peer, taken in.
    pub frag_redirect_received: u64,
    /// Packet-tracer probes queued for a report ([`crate::tracer`]).
    pub trace_reports: u64,
    /// Probes over the tracer's rate: forwarded without a report.
    pub trace_rate_limited: u64,
    /// Probes whose report found the queue full or busy: not reported.
    pub trace_queue_full: u64,
    /// Payloads with the tracer's magic but a malformed marker, or a report
    /// address outside `[tracer] report_to`: not reported.
    pub trace_invalid: u64,
    /// Frames user space copied on their way through (the port's receive
    /// or transmit copy; packet threads rewrite in place). Over `tx`: the
    /// copies per forwarded packet, 0 on AF_XDP.
    pub user_copies: u64,
    /// TCP and UDP checksums a local sender left partial (offloaded; the
    /// port could not flag them), completed before forwarding.
    pub csum_completed: u64,
    /// Datagrams to a `quic` VIP routed by their connection ID's server ID.
    pub quic_routed: u64,
    /// Datagrams to a `quic` VIP whose connection ID did not route, by
    /// reason ([`crate::quic::Miss::index`]): they took the connection table
    /// and then the 5-tuple, as any UDP flow.
    pub quic_miss: [u64; crate::quic::Miss::ALL.len()],
    /// Datagrams whose server ID names a backend that is down: the same
    /// fallback (a drained backend keeps its connections, as in the
    /// connection table).
    pub quic_server_down: u64,
    /// TCP segments to a VIP's address on a port no VIP serves that were
    /// answered with a RST (the segment itself is counted as dropped,
    /// [`DropReason::VipPortNotServed`]; the RST is not in `tx`).
    pub refused_tcp_rst: u64,
    /// UDP datagrams to a VIP's address on a port no VIP serves that were
    /// answered with an ICMP or ICMPv6 port unreachable (likewise dropped).
    pub refused_icmp_unreachable: u64,
    /// Such segments and datagrams left unanswered because the packet
    /// thread's refusal rate was spent ([`crate::worker::REFUSALS_PER_S`]).
    pub refusal_rate_limited: u64,
}

impl Counters {
    /// Zeroed counters.
    pub fn new() -> Self {
        Counters {
            drops: vec![0; DROP_REASONS],
            ..Counters::default()
        }
    }

    /// Counts a drop.
    #[inline]
    pub fn drop(&mut self, r: DropReason) {
        self.drops[r.index()] += 1;
    }

    /// Drops for one reason.
    pub fn drops_for(&self, r: DropReason) -> u64 {
        self.drops.get(r.index()).copied().unwrap_or(0)
    }

    /// All frames finished without being forwarded, frames that were not
    /// for a VIP included (the accounting: received = forwarded + dropped +
    /// held). What users read as drops is
    /// [`Counters::dropped_excluding_not_for_vip`].
    pub fn dropped(&self) -> u64 {
        self.drops.iter().sum()
    }

    /// Frames that were not for a VIP ([`NOT_FOR_VIP`]): not drops.
    pub fn not_for_vip(&self) -> u64 {
        NOT_FOR_VIP.iter().map(|&r| self.drops_for(r)).sum()
    }

    /// Drops proper: frames for the load balancer it could not forward
    /// (malformed, no healthy backend, ...), without [`NOT_FOR_VIP`].
    pub fn dropped_excluding_not_for_vip(&self) -> u64 {
        self.dropped() - self.not_for_vip()
    }

    /// Whether a drop slot ([`DropReason::index`]) is one of [`NOT_FOR_VIP`].
    pub fn is_not_for_vip(index: usize) -> bool {
        NOT_FOR_VIP.iter().any(|r| r.index() == index)
    }

    /// Adds `t` (several packets) to VIP `vip`'s traffic.
    pub(crate) fn vip_traffic(&mut self, vip: u32, t: Traffic) {
        let e = entry(&mut self.per_vip, vip);
        e.packets += t.packets;
        e.bytes += t.bytes;
    }

    #[inline]
    pub(crate) fn backend(&mut self, id: u32, bytes: usize) {
        bump(&mut self.per_backend, id, bytes);
    }

    /// Adds another thread's counters to these.
    pub fn merge(&mut self, o: &Counters) {
        self.rx += o.rx;
        self.tx += o.tx;
        if self.drops.len() < o.drops.len() {
            self.drops.resize(o.drops.len(), 0);
        }
        for (a, b) in self.drops.iter_mut().zip(&o.drops) {
            *a += b;
        }
        for (mine, theirs) in [
            (&mut self.per_vip, &o.per_vip),
            (&mut self.per_backend, &o.per_backend),
        ] {
            if mine.len() < theirs.len() {
                mine.resize(theirs.len(), Traffic::default());
            }
            for (a, b) in mine.iter_mut().zip(theirs) {
                a.packets += b.packets;
                a.bytes += b.bytes;
            }
        }
        let (c, d) = (&mut self.conntrack, &o.conntrack);
        c.hits += d.hits;
        c.misses += d.misses;
        c.inserts += d.inserts;
        c.insert_failures += d.insert_failures;
        c.expiries += d.expiries;
        c.closes += d.closes;
        c.entries += d.entries;
        c.closing += d.closing;
        self.frag_held += o.frag_held;
        self.frag_released += o.frag_released;
        self.icmp_to_backend += o.icmp_to_backend;
        self.tx_stalls += o.tx_stalls;
        self.frag_redirected += o.frag_redirected;
        if self.frag_redirected_to.len() < o.frag_redirected_to.len() {
            self.frag_redirected_to
                .resize(o.frag_redirected_to.len(), 0);
        }
        for (a, b) in self
            .frag_redirected_to
            .iter_mut()
            .zip(&o.frag_redirected_to)
        {
            *a += b;
        }
        self.frag_redirect_received += o.frag_redirect_received;
        self.trace_reports += o.trace_reports;
        self.trace_rate_limited += o.trace_rate_limited;
        self.trace_queue_full += o.trace_queue_full;
        self.trace_invalid += o.trace_invalid;
        self.user_copies += o.user_copies;
        self.csum_completed += o.csum_completed;
        self.quic_routed += o.quic_routed;
        for (a, b) in self.quic_miss.iter_mut().zip(&o.quic_miss) {
            *a += b;
        }
        self.quic_server_down += o.quic_server_down;
        self.refused_tcp_rst += o.refused_tcp_rst;
        self.refused_icmp_unreachable += o.refused_icmp_unreachable;
        self.refusal_rate_limited += o.refusal_rate_limited;
    }

    /// User-space copies per forwarded packet (0 when none was forwarded).
    pub fn copies_per_forwarded(&self) -> f64 {
        if self.tx == 0 {
            0.0
        } else {
            self.user_copies as f64 / self.tx as f64
        }
    }

    /// Non-zero drop counters by name ([`NOT_FOR_VIP`] included).
    pub fn drop_table(&self) -> Vec<(&'static str, u64)> {
        self.table_where(|_| true)
    }

    /// Non-zero drop counters by name, without [`NOT_FOR_VIP`]: the drops
    /// a user reads as lost traffic.
    pub fn drop_table_excluding_not_for_vip(&self) -> Vec<(&'static str, u64)> {
        self.table_where(|i| !Self::is_not_for_vip(i))
    }

    /// Non-zero [`NOT_FOR_VIP`] counters by name (`not_ip`, `no_vip`).
    pub fn not_for_vip_table(&self) -> Vec<(&'static str, u64)> {
        self.table_where(Self::is_not_for_vip)
    }

    /// Non-zero drop slots that `keep` keeps, by name, in slot order.
    fn table_where(&self, keep: impl Fn(usize) -> bool) -> Vec<(&'static str, u64)> {
        self.drops
            .iter()
            .enumerate()
            .filter(|&(i, &n)| n > 0 && keep(i))
            .map(|(i, &n)| (DropReason::name_of(i), n))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_have_distinct_slots_and_names() {
        let mut seen = std::collections::HashSet::new();
        for r in packet::Reason::ALL
            .map(DropReason::Malformed)
            .into_iter()
            .chain(OWN.map(|(_, d)| d))
        {
            assert!(seen.insert(r.index()));
            assert!(r.index() < DROP_REASONS);
        }
        assert_eq!(DropReason::name_of(DropReason::NoVip.index()), "no_vip");
        let mut c = Counters::new();
        c.drop(DropReason::FragExpired);
        c.vip_traffic(
            3,
            Traffic {
                packets: 1,
                bytes: 100,
            },
        );
        (
            c.refused_tcp_rst,
            c.refused_icmp_unreachable,
            c.refusal_rate_limited,
        ) = (1, 2, 3);
        let mut d = Counters::new();
        d.merge(&c);
        d.merge(&c);
        assert_eq!(d.drops_for(DropReason::FragExpired), 2);
        assert_eq!(
            (
                d.refused_tcp_rst,
                d.refused_icmp_unreachable,
                d.refusal_rate_limited
            ),
            (2, 4, 6)
        );
        assert_eq!(
            d.per_vip[3],
            Traffic {
                packets: 2,
                bytes: 200
            }
        );
        assert_eq!(d.drop_table(), vec![("frag_expired", 2)]);
    }

    /// Frames not for a VIP are finished (in `dropped`, for the
    /// accounting) but not drops a user reads: apart, by kind.
    #[test]
    fn not_for_vip_is_apart_from_drops() {
        let mut c = Counters::new();
        c.drop(DropReason::NoVip);
        c.drop(DropReason::NoVip);
        c.drop(DropReason::Malformed(packet::Reason::NotIp));
        c.drop(DropReason::NoHealthyBackend);
        c.conntrack.entries = 5;
        c.conntrack.closing = 2;
        c.conntrack.closes = 3;
        let mut d = Counters::new();
        d.merge(&c);
        d.merge(&c);
        assert_eq!(d.dropped(), 8);
        assert_eq!(d.not_for_vip(), 6);
        assert_eq!(d.dropped_excluding_not_for_vip(), 2);
        assert_eq!(
            d.drop_table_excluding_not_for_vip(),
            vec![("no_healthy_backend", 2)]
        );
        assert_eq!(d.not_for_vip_table(), vec![("not_ip", 2), ("no_vip", 4)]);
        assert_eq!(
            (
                d.conntrack.entries,
                d.conntrack.closing,
                d.conntrack.active()
            ),
            (10, 4, 6)
        );
        assert_eq!(d.conntrack.closes, 6);
    }
}
