//! A packet thread's work on a batch (paper section 3.1): match the VIP,
//! find the backend in the connection table or by Maglev hashing, and
//! encapsulate in GRE in place. Nothing here is shared with other packet
//! threads; the tables snapshot is read-only.

use std::sync::Arc;

use maio::{Handle, Pool};
use netio::Packet;
use packet::checksum::{complete_partial, Partial};
use packet::gre::{
    encapsulate, encapsulate_keyed, encapsulate_spread, encapsulate_templated,
    FRAGMENT_REDIRECT_KEY,
};
use packet::parse::Parsed;
use packet::tcp::flags::{ACK as TCP_ACK, FIN as TCP_FIN, RST as TCP_RST, SYN as TCP_SYN};
use packet::{parse_frame, FlowKey};

use crate::conntrack::{Conntrack, Entry};
use crate::counters::{Counters, DropReason, Traffic};
use crate::frag::{Decision, FragKey, FragTable, Frags};
use crate::tables::Tables;
use crate::tracer::{self, Lookup, Marker, Offer, Record, Redirect, Tracer};

/// Whether TCP `flags` open a connection (SYN without ACK).
#[inline]
fn opens(flags: u8) -> bool {
    flags & (TCP_SYN | TCP_ACK) == TCP_SYN
}

/// How long a TCP flow's entry outlives its FIN or RST, so that the rest of
/// the close (the other side's FIN, the last ACKs, retransmissions) still
/// reaches the same backend.
pub const CLOSE_LINGER_MS: u64 = 5_000;

/// Seed of the 5-tuple hash used by connection tracking and Maglev: the
/// one the XDP program (`bpf/lb.c`) hashes with too ([`crate::xdp::abi`]).
pub const FLOW_SEED: u64 = crate::xdp::abi::FLOW_SEED;
/// Seed of the steering hash (independent of the flow hash, as the paper
/// recomputes it in the packet thread rather than sharing it).
pub const STEER_SEED: u64 = 0x0073_7465_6572;

/// Refusals (a TCP RST or an ICMP port unreachable for a VIP's address on
/// a port no VIP serves) one packet thread sends per second at most, and
/// [`REFUSAL_BURST`] the most at once: Linux's defaults for its ICMP
/// errors (`net.ipv4.icmp_msgs_per_sec` = 1000, `icmp_msgs_burst` = 50), so
/// that a spoofed flood to unserved ports cannot make the load balancer a
/// reflector toward the forged sources, beyond what any host would send.
pub const REFUSALS_PER_S: u64 = 1_000;
/// The refusals a packet thread may send at once after a quiet spell
/// ([`REFUSALS_PER_S`]).
pub const REFUSAL_BURST: u64 = 50;

/// A token bucket of refusals, refilled by the batch clock (milliseconds),
/// in thousandths of a token so that the rate needs no division.
#[derive(Debug)]
struct RefusalBucket {
    /// Thousandths of a token.
    milli: u64,
    last_ms: u64,
}

impl RefusalBucket {
    fn new() -> Self {
        RefusalBucket {
            milli: REFUSAL_BURST * 1000,
            last_ms: 0,
        }
    }

    /// Takes a token at `now_ms`, if one is left.
    fn take(&mut self, now_ms: u64) -> bool {
        // REFUSALS_PER_S tokens a second: as many thousandths a millisecond.
        let gained = now_ms
            .saturating_sub(self.last_ms)
            .saturating_mul(REFUSALS_PER_S);
        self.last_ms = self.last_ms.max(now_ms);
        self.milli = self.milli.saturating_add(gained).min(REFUSAL_BURST * 1000);
        if self.milli >= 1000 {
            self.milli -= 1000;
            true
        } else {
            false
        }
    }
}

/// The hash Maglev tables are looked up with for a flow.
#[inline]
pub fn flow_hash(k: &FlowKey) -> u64 {
    k.hash(FLOW_SEED)
}

/// What a packet thread does with packets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The load balancer.
    Maglev,
    /// Parse, swap addresses, send back: the pipeline's own limit, for
    /// benchmarks.
    Null,
}

/// Where a packet goes.
enum Action {
    Forward {
        vip: u32,
        backend: u32,
        hash: u64,
    },
    Hold(FragKey),
    /// A fragment for the `[fleet]` peer of this index.
    Redirect(u32),
}

/// A GRE packet to this load balancer's own address, looked at.
enum Taken {
    /// A fragment a peer redirected here: the packet rewritten to a plain
    /// frame of the inner fragment, parsed.
    In(Packet, Parsed),
    /// Not marked as a redirect: handled as any packet.
    Not(Packet),
    /// Marked, but holding no fragment: dropped and counted.
    Dropped,
}

/// One packet thread's state.
pub struct Worker {
    pool: Pool,
    handle: Handle,
    ct: Conntrack,
    frags: Frags,
    /// Counters.
    pub counters: Counters,
    mode: Mode,
    released: Vec<Packet>,
    expired: Vec<Packet>,
    /// Per-batch parse results and flow hashes (0: no plain flow).
    staged: Vec<(packet::Result<Parsed>, u64)>,
    /// Packet-tracer probes are reported through this, as this thread.
    trace: Option<(Arc<Tracer>, u16)>,
    /// Refusals left to send ([`REFUSALS_PER_S`]).
    refusals: RefusalBucket,
    /// Where a refusal is built before it replaces the frame it answers.
    reply: Vec<u8>,
    /// The traffic forwarded for one VIP since it was last added to
    /// [`Counters`]: added when another VIP's packet is sent and when the
    /// batch ends, so a batch for one VIP (the common case) adds to the
    /// VIP's counter and to `tx` once, not per packet.
    run: VipRun,
}

/// Forwarded traffic for one VIP not yet in the counters.
#[derive(Default)]
struct VipRun {
    vip: u32,
    traffic: Traffic,
}

impl Worker {
    /// A worker over `pool` with its own connection and fragment tables.
    pub fn new(pool: &Pool, mode: Mode, ct: Conntrack, frags: FragTable) -> Self {
        Worker {
            pool: pool.clone(),
            handle: pool.handle(),
            ct,
            frags: Frags::Own(frags),
            counters: Counters::new(),
            mode,
            released: Vec::new(),
            expired: Vec::new(),
            staged: Vec::new(),
            trace: None,
            refusals: RefusalBucket::new(),
            reply: Vec::new(),
            run: VipRun::default(),
        }
    }

    /// Uses `table` for fragments instead of its own: the workers that each
    /// serve one receive queue of an interface share one, since the NIC
    /// may bring a datagram's fragments to several of them.
    pub fn with_shared_frags(mut self, table: Arc<std::sync::Mutex<FragTable>>) -> Self {
        self.frags = Frags::shared(table);
        self
    }

    /// Reports packet-tracer probes through `tracer` as packet thread
    /// `thread` ([`crate::tracer`]); without a tracer, probes are forwarded
    /// like any packet and not looked for.
    pub fn with_tracer(mut self, tracer: Arc<Tracer>, thread: usize) -> Self {
        self.trace = Some((tracer, thread.min(usize::from(u16::MAX)) as u16));
        self
    }

    /// Packets finished so far: forwarded or dropped (held fragments are
    /// finished when released or expired).
    pub fn finished(&self) -> u64 {
        self.counters.tx + self.counters.dropped()
    }

    /// Fragments held now, waiting for their first fragment.
    pub fn holding(&self) -> u64 {
        let c = &self.counters;
        c.frag_held - c.frag_released - c.drops_for(DropReason::FragExpired)
    }

    /// Packets accounted for: finished, or held as fragments. When every
    /// packet handed to the worker is accounted for and no more will come,
    /// only held fragments remain, and [`Worker::drain`] ends them.
    pub fn accounted(&self) -> u64 {
        self.finished() + self.holding()
    }

    /// Processes `batch` (emptied), appending packets to send to `out`.
    ///
    /// In stages, so that cache misses overlap instead of queueing: first
    /// every packet's first bytes are prefetched (another core wrote them),
    /// then every packet is parsed and its flow's connection-table bucket
    /// prefetched, then each packet is decided and encapsulated.
    pub fn process(
        &mut self,
        t: &Tables,
        batch: &mut Vec<Packet>,
        out: &mut Vec<Packet>,
        now_ms: u64,
    ) {
        self.counters.rx += batch.len() as u64;
        if self.mode == Mode::Null {
            for pkt in batch.drain(..) {
                self.null(pkt, out);
            }
            return;
        }
        for p in batch.iter() {
            self.pool.prefetch(&p.buf, usize::from(p.off));
        }
        let mut staged = std::mem::take(&mut self.staged);
        for p in batch.iter() {
            let s = usize::from(p.off);
            let r = parse_frame(&self.pool.data(&p.buf)[s..s + usize::from(p.len)]);
            let h = match &r {
                Ok(pp) if pp.fragment.is_none() && pp.icmp_quote.is_none() => {
                    let h = flow_hash(&pp.flow);
                    self.ct.prefetch(h, !opens(pp.tcp_flags));
                    h
                }
                _ => 0,
            };
            staged.push((r, h));
        }
        // The parsed headers stay where they were staged: moving them (a
        // hundred bytes each) into `one` copied them with wide loads over
        // the narrow stores that had just written them, which stalls.
        for (pkt, (r, h)) in batch.drain(..).zip(staged.iter()) {
            self.one(t, pkt, r, *h, out, now_ms);
        }
        staged.clear();
        self.staged = staged;
        self.end_run();
        self.frags.sweep_batch(now_ms, &mut self.expired);
        self.drop_expired();
        self.counters.conntrack = self.ct.stats();
    }

    /// Housekeeping without traffic: expires held fragments whose first
    /// fragment did not come in time (a few table entries per call), so
    /// they end on a quiet port too, not only when the next packet comes.
    pub fn tick(&mut self, now_ms: u64) {
        let expired = &mut self.expired;
        self.frags.with(|f| f.sweep(64, now_ms, expired));
        self.drop_expired();
    }

    /// Drops every held fragment (shutting down). A shared table is left
    /// alone: it holds the other queues' fragments too, and whoever shares
    /// it drains it once every worker is done ([`Worker::drain_shared`]).
    pub fn drain(&mut self) {
        if let Frags::Own(f) = &mut self.frags {
            f.drain(&mut self.expired);
        }
        self.drop_expired();
    }

    /// Drops every fragment held in a shared table `table` (every worker
    /// sharing it done), counting them in this worker's counters.
    pub fn drain_shared(&mut self, table: &std::sync::Mutex<FragTable>) {
        table
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(&mut self.expired);
        self.drop_expired();
    }

    /// Returns a packet's buffer to the pool without counting it.
    pub fn free(&mut self, p: Packet) {
        let _ = self.handle.free(p.buf);
    }

    /// Adds the traffic of the VIP run to the counters (before anyone
    /// can read them: [`Worker::process`] ends with this).
    fn end_run(&mut self) {
        let r = std::mem::take(&mut self.run.traffic);
        if r.packets > 0 {
            self.counters.vip_traffic(self.run.vip, r);
            self.counters.tx += r.packets;
        }
    }

    fn drop_expired(&mut self) {
        for p in self.expired.drain(..) {
            self.counters.drop(DropReason::FragExpired);
            let _ = self.handle.free(p.buf);
        }
    }

    fn discard(&mut self, p: Packet, why: DropReason) {
        self.counters.drop(why);
        // The buffer came through a queue as owned; freeing cannot fail
        // unless the pool is misused, which the pool reports and we count.
        let _ = self.handle.free(p.buf);
    }

    fn null(&mut self, mut pkt: Packet, out: &mut Vec<Packet>) {
        // (rx is counted by `process`.)
        let data = self.pool.data_mut(&mut pkt.buf);
        let (s, e) = (
            usize::from(pkt.off),
            usize::from(pkt.off) + usize::from(pkt.len),
        );
        match parse_frame(&data[s..e]) {
            Err(err) => self.discard(pkt, DropReason::Malformed(err.0)),
            Ok(p) => {
                let f = &mut data[s..e];
                for i in 0..6 {
                    f.swap(i, i + 6);
                }
                let ip = p.l3_offset;
                let (a, n) = if p.l3 == packet::parse::L3::V4 {
                    (ip + 12, 4)
                } else {
                    (ip + 8, 16)
                };
                for i in 0..n {
                    f.swap(a + i, a + n + i);
                }
                self.counters.tx += 1;
                out.push(pkt);
            }
        }
    }

    fn one(
        &mut self,
        t: &Tables,
        pkt: Packet,
        parsed: &packet::Result<Parsed>,
        hash: u64,
        out: &mut Vec<Packet>,
        now: u64,
    ) {
        let p = match parsed {
            Ok(p) => p,
            Err(e) => return self.discard(pkt, DropReason::Malformed(e.0)),
        };
        // A fragment redirected here by a `[fleet]` peer: handled as if it
        // had arrived itself, and never redirected again (one compare for
        // every other packet).
        let inner;
        let (pkt, p, from_peer) = if p.flow.proto == packet::proto::GRE && t.is_own(&p.flow.dst) {
            match self.take_redirect(t, pkt, p) {
                Taken::In(pkt, i) => {
                    inner = i;
                    (pkt, &inner, Some(p.flow.src))
                }
                Taken::Not(pkt) => (pkt, p, None),
                Taken::Dropped => return self.drop_expired(),
            }
        } else {
            (pkt, p, None)
        };
        // A `quic` VIP's datagram names its backend by connection ID: read
        // here, where the frame is at hand (no cost without a `quic` VIP).
        // Before the probe: a probe's marker may follow the QUIC header.
        let (quic, quic_step) = if t.any_quic
            && p.flow.proto == packet::proto::UDP
            && p.fragment.is_none()
            && p.icmp_quote.is_none()
        {
            self.quic_pick(t, &pkt, p)
        } else {
            (None, None)
        };
        let probe = self.probe(&pkt, p, quic_step.and_then(|(_, at)| at));
        let quic_step = quic_step.map(|(s, _)| s);
        match self.decide(t, p, hash, now, from_peer.is_some(), quic) {
            Err(DropReason::VipPortNotServed) if from_peer.is_none() => {
                self.refuse(t, pkt, p, out, now)
            }
            Err(why) => self.discard(pkt, why),
            Ok(Action::Redirect(peer)) => {
                if let (Some(probe), Some(f)) = (probe, &t.fleet) {
                    let to = packet::flow::from_ip(f.peers.addrs()[peer as usize]);
                    self.report(t, p, probe, None, Redirect::To(to), now, None);
                }
                self.redirect(t, pkt, p, peer, out);
            }
            Ok(Action::Hold(key)) => {
                let expired = &mut self.expired;
                let held = self.frags.with(|f| f.hold(&key, pkt, now, expired));
                match held {
                    Ok(()) => self.counters.frag_held += 1,
                    Err(pkt) => self.discard(pkt, DropReason::FragTableFull),
                }
            }
            Ok(Action::Forward { vip, backend, hash }) => {
                if let Some(probe) = probe {
                    let r = from_peer.map_or(Redirect::No, |a| Redirect::Arrived(Some(a)));
                    self.report(t, p, probe, Some((vip, backend)), r, now, quic_step);
                }
                self.send(t, pkt, p, vip, backend, hash, out);
                if p.fragment.is_some_and(|f| f.is_first()) && !self.released.is_empty() {
                    self.release(t, vip, backend, out);
                }
            }
        }
        self.drop_expired();
    }

    /// A packet-tracer probe's marker, and the connection table's hits
    /// before deciding (to tell a hit from a miss after). Looks only at the
    /// first payload bytes of TCP and UDP (and, in a datagram to a `quic`
    /// VIP, those after its QUIC header's connection IDs, `quic_at`), and
    /// only with a tracer.
    #[inline]
    fn probe(&mut self, pkt: &Packet, p: &Parsed, quic_at: Option<usize>) -> Option<(Marker, u64)> {
        self.trace.as_ref()?;
        let s = usize::from(pkt.off);
        let frame = &self.pool.data(&pkt.buf)[s..s + usize::from(pkt.len)];
        let found =
            tracer::find(frame, p).or_else(|| quic_at.and_then(|at| tracer::find_at(frame, p, at)));
        match found? {
            Ok(m) => Some((m, self.ct.stats().hits)),
            Err(_) => {
                self.counters.trace_invalid += 1;
                None
            }
        }
    }

    /// Queues the report on a probe (rate-limited; never blocks): `chosen`
    /// is its VIP index and backend id when this thread decided them,
    /// `quic` what its connection ID said (a `quic` VIP's datagram).
    #[cold]
    #[allow(clippy::too_many_arguments)]
    fn report(
        &mut self,
        t: &Tables,
        p: &Parsed,
        (marker, hits): (Marker, u64),
        chosen: Option<(u32, u32)>,
        redirect: Redirect,
        now: u64,
        quic: Option<tracer::QuicStep>,
    ) {
        let Some((tracer, thread)) = &self.trace else {
            return;
        };
        let hit = self.ct.stats().hits > hits;
        // Routed by connection ID: the connection table was not asked.
        let by_cid = quic.is_some_and(|q| q.outcome == tracer::QuicOutcome::Routed);
        let record = Record {
            marker,
            thread: *thread,
            flow: p.flow,
            fragment: p.fragment.is_some(),
            conntrack: chosen
                .filter(|_| !by_cid)
                .map(|_| if hit { Lookup::Hit } else { Lookup::Miss }),
            generation: t.generation,
            // A fragment sent on to a peer has no backend here, but its VIP.
            vip: chosen
                .map(|(v, _)| v)
                .or_else(|| t.matcher.lookup(&p.flow.dst, p.flow.dst_port, p.flow.proto))
                .and_then(|v| t.vips.get(v as usize).map(|x| (v, x.fingerprint))),
            backend: chosen.map(|(_, b)| b),
            redirect,
            quic,
        };
        match tracer.offer(record, now) {
            Offer::Queued => self.counters.trace_reports += 1,
            Offer::RateLimited => self.counters.trace_rate_limited += 1,
            Offer::QueueFull => self.counters.trace_queue_full += 1,
            Offer::NotAllowed => self.counters.trace_invalid += 1,
        }
    }

    /// A frame for a VIP's address on a port or protocol no VIP serves:
    /// counted as dropped ([`DropReason::VipPortNotServed`]), and answered
    /// as a host answers a closed port ([`packet::reply`]: a TCP RST, an
    /// ICMP port unreachable), in its own buffer, back out of the port it
    /// came in on, within the thread's refusal rate ([`REFUSALS_PER_S`]).
    /// A frame [`refuse_source`] refuses (a martian or a VIP's own address
    /// as the source, TTL 0) is never answered: the answer would go to a
    /// forged or impossible address.
    #[cold]
    fn refuse(&mut self, t: &Tables, mut pkt: Packet, p: &Parsed, out: &mut Vec<Packet>, now: u64) {
        let (s, len) = (usize::from(pkt.off), usize::from(pkt.len));
        let Some(frame) = self.pool.data(&pkt.buf).get(s..s + len) else {
            return self.discard(pkt, DropReason::VipPortNotServed);
        };
        let Some(kind) = packet::reply::kind(frame, p).filter(|_| refuse_source(t, p).is_ok())
        else {
            return self.discard(pkt, DropReason::VipPortNotServed);
        };
        if !self.refusals.take(now) {
            self.counters.refusal_rate_limited += 1;
            return self.discard(pkt, DropReason::VipPortNotServed);
        }
        if packet::reply::refusal(frame, p, &mut self.reply).is_none() {
            return self.discard(pkt, DropReason::VipPortNotServed);
        }
        let data = self.pool.data_mut(&mut pkt.buf);
        let n = self.reply.len();
        // Where the frame was, or earlier in the buffer when the reply
        // (an ICMP error is longer than what it quotes) would run past it.
        let Some(at) = data.len().checked_sub(n).map(|last| s.min(last)) else {
            return self.discard(pkt, DropReason::VipPortNotServed);
        };
        data[at..at + n].copy_from_slice(&self.reply);
        pkt.off = at as u16;
        pkt.len = n as u16;
        // The frame is finished as a drop (received = forwarded + dropped);
        // the reply goes out in its buffer, counted apart.
        self.counters.drop(DropReason::VipPortNotServed);
        match kind {
            packet::reply::Refusal::TcpReset => self.counters.refused_tcp_rst += 1,
            packet::reply::Refusal::PortUnreachable => self.counters.refused_icmp_unreachable += 1,
        }
        out.push(pkt);
    }

    /// Encapsulates toward `backend` and queues for sending.
    #[allow(clippy::too_many_arguments)]
    fn send(
        &mut self,
        t: &Tables,
        mut pkt: Packet,
        p: &Parsed,
        vip: u32,
        backend: u32,
        hash: u64,
        out: &mut Vec<Packet>,
    ) {
        let b = &t.backends[backend as usize];
        let bytes = usize::from(pkt.len);
        let start = usize::from(pkt.off);
        let data = self.pool.data_mut(&mut pkt.buf);
        // A checksum a local sender left for offload (the port could not
        // say so): completed, or the backend would drop the packet.
        if let Some(frame) = data.get_mut(start..start + bytes) {
            if complete_partial(frame, p) == Partial::Completed {
                self.counters.csum_completed += 1;
            }
        }
        let r = match (&t.spread, &b.template) {
            (None, Some(tp)) => encapsulate_templated(data, start, p, tp, hash),
            (None, None) => encapsulate(data, start, p, &b.outer, hash),
            (Some(s), _) => encapsulate_spread(data, start, p, &b.outer, hash, s),
        };
        match r {
            Ok(r) => {
                pkt.off = r.start as u16;
                pkt.len = r.len() as u16;
                if vip != self.run.vip {
                    self.end_run();
                    self.run.vip = vip;
                }
                self.run.traffic.add(bytes);
                self.counters.backend(backend, bytes);
                out.push(pkt);
            }
            Err(_) => self.discard(pkt, DropReason::EncapFailed),
        }
    }

    /// Looks at GRE addressed to this load balancer: a fragment redirected
    /// by a peer (key [`FRAGMENT_REDIRECT_KEY`]) is taken out of its outer
    /// headers in place (a plain Ethernet header is written in front of the
    /// inner packet, over the outer ones), so the rest of the thread, and
    /// the fragment table that may hold it, see the fragment as it arrived
    /// at the peer.
    #[cold]
    fn take_redirect(&mut self, t: &Tables, mut pkt: Packet, outer: &Parsed) -> Taken {
        if outer.fragment.is_some() {
            // Fragmented on the way: its key cannot be seen in every piece,
            // and a redirect is never reassembled here.
            self.discard(pkt, DropReason::FragmentRedirectMalformed);
            return Taken::Dropped;
        }
        let (s, len) = (usize::from(pkt.off), usize::from(pkt.len));
        let data = self.pool.data_mut(&mut pkt.buf);
        let d = match packet::gre::decapsulate(&data[s..s + len]) {
            Ok(d) if d.key == Some(FRAGMENT_REDIRECT_KEY) => d,
            _ => return Taken::Not(pkt),
        };
        // Only a peer may redirect: anyone else's "redirect" would carry a
        // packet of its choosing to a backend past the router's filters.
        // The peer list holds this load balancer too, which never
        // redirects to itself: its own address as the source is forged.
        let from = packet::flow::to_ip(&outer.flow.src);
        if t.is_own(&outer.flow.src)
            || !t
                .fleet
                .as_ref()
                .is_some_and(|f| f.peers.addrs().contains(&from))
        {
            self.discard(pkt, DropReason::FragmentRedirectNotPeer);
            return Taken::Dropped;
        }
        let eth = packet::ethernet::HEADER_LEN;
        let inner_at = s + d.inner.start;
        // The outer Ethernet and IP headers lie before, so there is room.
        let at = inner_at - eth;
        data.copy_within(s..s + 12, at);
        data[inner_at - 2..inner_at].copy_from_slice(&d.ethertype.to_be_bytes());
        let inner_len = eth + d.inner.len();
        match parse_frame(&data[at..at + inner_len]) {
            Ok(inner) if inner.fragment.is_some() => {
                pkt.off = at as u16;
                pkt.len = inner_len as u16;
                self.counters.frag_redirect_received += 1;
                Taken::In(pkt, inner)
            }
            _ => {
                self.discard(pkt, DropReason::FragmentRedirectMalformed);
                Taken::Dropped
            }
        }
    }

    /// Sends a fragment to the `[fleet]` peer responsible for it, in GRE
    /// marked with [`FRAGMENT_REDIRECT_KEY`].
    fn redirect(
        &mut self,
        t: &Tables,
        mut pkt: Packet,
        p: &Parsed,
        peer: u32,
        out: &mut Vec<Packet>,
    ) {
        let Some(f) = &t.fleet else {
            return self.discard(pkt, DropReason::EncapFailed);
        };
        let (i, start) = (peer as usize, usize::from(pkt.off));
        let data = self.pool.data_mut(&mut pkt.buf);
        let hash = crate::frag_redirect::peer_hash(&p.flow);
        match encapsulate_keyed(
            data,
            start,
            p,
            &f.outer[i],
            hash,
            Some(FRAGMENT_REDIRECT_KEY),
        ) {
            Ok(r) => {
                pkt.off = r.start as u16;
                pkt.len = r.len() as u16;
                let slot = f.counter_slot[i] as usize;
                let c = &mut self.counters;
                if c.frag_redirected_to.len() <= slot {
                    c.frag_redirected_to.resize(slot + 1, 0);
                }
                c.frag_redirected_to[slot] += 1;
                c.frag_redirected += 1;
                c.tx += 1;
                out.push(pkt);
            }
            Err(_) => self.discard(pkt, DropReason::EncapFailed),
        }
    }

    /// Sends the fragments that waited for the first one.
    fn release(&mut self, t: &Tables, vip: u32, backend: u32, out: &mut Vec<Packet>) {
        let mut held = std::mem::take(&mut self.released);
        for pkt in held.drain(..) {
            self.counters.frag_released += 1;
            let s = usize::from(pkt.off);
            match parse_frame(&self.pool.data(&pkt.buf)[s..s + usize::from(pkt.len)]) {
                Ok(p) => {
                    let hash = flow_hash(&p.flow.three_tuple());
                    self.send(t, pkt, &p, vip, backend, hash, out);
                }
                Err(e) => self.discard(pkt, DropReason::Malformed(e.0)),
            }
        }
        self.released = held;
    }

    /// The connection table's backend for a flow if it is still healthy,
    /// else Maglev's choice, remembered. TCP is followed: a FIN or RST ends
    /// the entry after [`CLOSE_LINGER_MS`], and a SYN (a new connection on
    /// a reused 5-tuple) keeps its entry only if that backend still takes
    /// new connections (not drained, not down); otherwise it is chosen
    /// afresh, while established connections stay on a drained backend.
    /// `hash` is the flow's hash if already computed, else 0.
    #[allow(clippy::too_many_arguments)]
    fn select(
        &mut self,
        t: &Tables,
        flow: &FlowKey,
        hash: u64,
        vip: u32,
        now: u64,
        insert: bool,
        tcp_flags: u8,
    ) -> Result<(u32, u64), DropReason> {
        let hash = if hash != 0 { hash } else { flow_hash(flow) };
        let syn = opens(tcp_flags);
        if let Some(e) = self.ct.lookup(flow, hash, now) {
            let ok = t.backends.get(e.backend as usize).is_some_and(|b| {
                if syn {
                    b.accepting
                } else {
                    b.healthy
                }
            });
            if e.vip == vip && ok {
                if syn && insert {
                    // A new connection on a reused 5-tuple, kept on the
                    // same backend: a new flow, open again with the full
                    // timeout (the old one's closing entry would otherwise
                    // end under it after the linger, and a table change
                    // since would move it).
                    self.ct.insert(flow, hash, e, now);
                }
                if tcp_flags & (TCP_FIN | TCP_RST) != 0 {
                    self.ct.close(flow, hash, now, CLOSE_LINGER_MS);
                }
                return Ok((e.backend, hash));
            }
        }
        let backend = t.vips[vip as usize]
            .pick(hash)
            .ok_or(DropReason::NoHealthyBackend)?;
        if insert {
            self.ct.insert(flow, hash, Entry { vip, backend }, now);
            if tcp_flags & (TCP_FIN | TCP_RST) != 0 {
                self.ct.close(flow, hash, now, CLOSE_LINGER_MS);
            }
        }
        Ok((backend, hash))
    }

    /// The VIP and backend a datagram's QUIC connection ID routes to, when
    /// its VIP is `quic`, the ID routes and the backend is up; counted
    /// either way ([`Counters::quic_routed`], [`Counters::quic_miss`]).
    /// With it, for a `quic` VIP, what the connection ID said and where
    /// its header ends (a packet-tracer marker may follow).
    #[inline(never)]
    fn quic_pick(
        &mut self,
        t: &Tables,
        pkt: &Packet,
        p: &Parsed,
    ) -> (Option<(u32, u32)>, Option<QuicSeen>) {
        let Some(vip) = t.matcher.lookup(&p.flow.dst, p.flow.dst_port, p.flow.proto) else {
            return (None, None);
        };
        let Some(route) = t.vips.get(vip as usize).and_then(|v| v.quic.as_ref()) else {
            return (None, None);
        };
        let s = usize::from(pkt.off);
        let Some(frame) = self.pool.data(&pkt.buf).get(s..s + usize::from(pkt.len)) else {
            return (None, None);
        };
        // The UDP payload: what the UDP length covers (RFC 768; the parser
        // checked it lies inside the IP packet), not octets the IP packet
        // holds after it; `get` keeps even a lie from reading past either.
        let ip_end = p.l3_offset + p.l3_len;
        let udp_end = frame
            .get(p.l4_offset + 4..p.l4_offset + 6)
            .map_or(ip_end, |l| {
                p.l4_offset + usize::from(u16::from_be_bytes([l[0], l[1]]))
            });
        let payload = frame
            .get(p.l4_offset + packet::udp::HEADER_LEN..udp_end.min(ip_end))
            .unwrap_or(&[]);
        let read = route.read(payload);
        let (chosen, outcome) = match read.backend {
            Ok(b) if t.backends.get(b as usize).is_some_and(|x| x.healthy) => {
                self.counters.quic_routed += 1;
                (Some((vip, b)), tracer::QuicOutcome::Routed)
            }
            Ok(b) => {
                self.counters.quic_server_down += 1;
                (None, tracer::QuicOutcome::ServerDown(b))
            }
            Err(miss) => {
                self.counters.quic_miss[miss.index()] += 1;
                (None, tracer::QuicOutcome::Miss(miss))
            }
        };
        let step = tracer::QuicStep {
            outcome,
            server_id: read.server_id,
        };
        (chosen, Some((step, read.header_len)))
    }

    fn decide(
        &mut self,
        t: &Tables,
        p: &Parsed,
        hash: u64,
        now: u64,
        from_peer: bool,
        quic: Option<(u32, u32)>,
    ) -> Result<Action, DropReason> {
        // ICMP "fragmentation needed" / "packet too big" about a VIP flow:
        // to the backend of the quoted flow, without creating an entry.
        if let Some(q) = p.icmp_quote {
            let vip = t
                .matcher
                .lookup(&q.dst, q.dst_port, q.proto)
                .ok_or(DropReason::NoVip)?;
            refuse_source(t, p)?;
            let (backend, hash) = self.select(t, &q, 0, vip, now, false, 0)?;
            self.counters.icmp_to_backend += 1;
            return Ok(Action::Forward { vip, backend, hash });
        }
        if let Some(f) = p.fragment {
            // Refused before any peer sees it: every fragment carries the
            // source and TTL.
            if t.matcher.is_vip_address(&p.flow.dst) {
                refuse_source(t, p)?;
            }
            // Section 4.3: every fragment of a datagram for a VIP goes to
            // the peer its 3-tuple hashes to; one that a peer redirected
            // here stays, whatever this load balancer's list says.
            let no_vip = if from_peer {
                DropReason::FragmentRedirectNoVip
            } else {
                not_served(t, &p.flow.dst)
            };
            if let (Some(fleet), false) = (&t.fleet, from_peer) {
                if t.matcher.is_vip_address(&p.flow.dst) {
                    let peer = fleet.peers.responsible(&p.flow);
                    if peer != fleet.peers.me() {
                        return match fleet.up[peer as usize] {
                            true => Ok(Action::Redirect(peer)),
                            false => Err(DropReason::FragmentPeerDown),
                        };
                    }
                }
            }
            let key = FragKey {
                src: p.flow.src,
                dst: p.flow.dst,
                proto: p.flow.proto,
                ident: f.ident,
            };
            if !f.is_first() {
                return match self.frags.with(|f| f.lookup(&key, now)) {
                    Some(d)
                        if t.backends
                            .get(d.backend as usize)
                            .is_some_and(|b| b.healthy) =>
                    {
                        Ok(Action::Forward {
                            vip: d.vip,
                            backend: d.backend,
                            hash: flow_hash(&p.flow.three_tuple()),
                        })
                    }
                    Some(_) => Err(DropReason::NoHealthyBackend),
                    None if t.matcher.is_vip_address(&p.flow.dst) => Ok(Action::Hold(key)),
                    None => Err(no_vip),
                };
            }
            let vip = t
                .matcher
                .lookup(&p.flow.dst, p.flow.dst_port, p.flow.proto)
                .ok_or(no_vip)?;
            let (backend, hash) = self.select(t, &p.flow, 0, vip, now, true, p.tcp_flags)?;
            let (released, expired) = (&mut self.released, &mut self.expired);
            self.frags
                .with(|f| f.record(&key, Decision { vip, backend }, now, released, expired));
            return Ok(Action::Forward { vip, backend, hash });
        }
        // Routed by connection ID: `quic_pick` matched this packet's VIP in
        // these tables already (whole packets only, as here).
        if let Some((vip, backend)) = quic {
            refuse_source(t, p)?;
            let hash = if hash != 0 { hash } else { flow_hash(&p.flow) };
            return Ok(Action::Forward { vip, backend, hash });
        }
        let vip = t
            .matcher
            .lookup(&p.flow.dst, p.flow.dst_port, p.flow.proto)
            .ok_or_else(|| not_served(t, &p.flow.dst))?;
        refuse_source(t, p)?;
        let (backend, hash) = self.select(t, &p.flow, hash, vip, now, true, p.tcp_flags)?;
        Ok(Action::Forward { vip, backend, hash })
    }
}

/// What [`Worker::quic_pick`] read of a `quic` VIP's datagram for the
/// packet-tracer: the QUIC step, and where a marker may follow the header.
type QuicSeen = (tracer::QuicStep, Option<usize>);

/// Refuses a packet for a VIP that no honest sender could have sent to
/// it, in this order (the XDP program, `bpf/lb.c`, checks the same in the
/// same order): a martian source ([`packet::flow::martian_source`]), a
/// source that is a VIP's own address (this packet's destination, or any
/// configured VIP address), an IPv4 TTL or IPv6 hop limit of 0. Checked
/// only once the packet is known to be for a VIP, so that what is not for
/// the load balancer stays counted as such.
#[inline]
fn refuse_source(t: &Tables, p: &Parsed) -> Result<(), DropReason> {
    let src = &p.flow.src;
    if packet::flow::martian_source(src) {
        Err(DropReason::MartianSource)
    } else if *src == p.flow.dst || t.matcher.is_vip_source(src) {
        Err(DropReason::SourceIsVip)
    } else if p.ttl == 0 {
        Err(DropReason::TtlZero)
    } else {
        Ok(())
    }
}

/// Why a packet to `dst` that no VIP takes is dropped: a VIP's address on
/// a port or protocol none of its VIPs serves is counted as such (traffic
/// for the load balancer, lost), anything else is not for a VIP at all.
#[cold]
fn not_served(t: &Tables, dst: &[u8; 16]) -> DropReason {
    if t.matcher.is_vip_address(dst) {
        DropReason::VipPortNotServed
    } else {
        DropReason::NoVip
    }
}
