//! `[fleet]` peers (Maglev, NSDI'16, section 4.3): each load balancer
//! checks the others' liveness itself (a check per peer, at its address)
//! and publishes it to the datapath as a table swap
//! ([`lb::Control::set_peer_up`]), as backend health is.
//!
//! What must a peer's check prove? That the peer forwards the fragments
//! sent to it. Its BIRD listening on BGP's port proves only that its
//! machine is up (and every connect made BIRD log "Unexpected connect from
//! unknown address"); an ICMP echo, only its kernel. So by default
//! (`kind = "fastpath"`) each load balancer answers its peers itself: a UDP
//! probe to its own address ([`responder`]), the address redirected
//! fragments are sent to, answered only while its datapath's heartbeat
//! advances ([`BEAT_STALE`]). A peer whose fastpath died, hung or whose
//! datapath stopped is down within `fall` checks; the answer is no larger
//! than the question and goes only to listed peers, so it cannot be used
//! to amplify traffic. `tcp` and `http` checks remain for fleets that
//! want them.
//! Fragments a down peer is responsible for are dropped
//! (`fragment_peer_down`), never rehashed to another peer: every load
//! balancer must send a datagram's fragments to the same one, and they may
//! disagree on who is up ([`lb::frag_redirect`]). Also the fleet's part of
//! `/status` and `/metrics`: peers, liveness and redirected fragments.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lb::config::{CheckKind, Config, HealthConf};
use lb::counters::{Counters, DropReason};
use lb::tables::Tables;
use serde::{Deserialize, Serialize};

use crate::health::{self, CheckKey, Tracker};
use crate::state::Shared;

/// The peers to check: `[fleet] peers` but this load balancer.
fn others(cfg: &Config) -> Vec<IpAddr> {
    let Some(f) = &cfg.fleet else {
        return Vec::new();
    };
    let own = f.own(&cfg.encap);
    f.peers
        .iter()
        .filter(|p| Some(**p) != own)
        .copied()
        .collect()
}

/// Keeps one check task per peer, starting and stopping them as reloads
/// change the list; runs until `stop`.
pub async fn manager(shared: Arc<Shared>, stop: Arc<AtomicBool>) {
    let mut tasks: HashMap<IpAddr, tokio::task::JoinHandle<()>> = HashMap::new();
    while !stop.load(Ordering::Relaxed) {
        let wanted = others(shared.control().config());
        tasks.retain(|a, t| {
            let keep = wanted.contains(a);
            if !keep {
                t.abort();
            }
            keep
        });
        for a in wanted {
            tasks
                .entry(a)
                .or_insert_with(|| tokio::spawn(peer_task(Arc::clone(&shared), a)));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for t in tasks.values() {
        t.abort();
    }
}

/// Checks one peer with `[fleet] health` (re-read each time, so a reload
/// applies) and publishes each change of verdict to the datapath.
async fn peer_task(shared: Arc<Shared>, addr: IpAddr) {
    let conf = || {
        let control = shared.control();
        let cfg = control.config();
        cfg.fleet
            .as_ref()
            .map(|f| (f.health.clone(), f.own(&cfg.encap)))
    };
    watch(addr, conf, |up, key| {
        shared.control().set_peer_up(addr, up);
        tracing::warn!(
            peer = %addr,
            check = %key,
            up,
            "fleet peer {}: fragments it is responsible for are {}",
            if up { "up" } else { "down" },
            if up {
                "redirected to it again"
            } else {
                "dropped (fragment_peer_down)"
            }
        );
    })
    .await;
}

/// Checks the peer at `addr` every interval with the check `conf` gives,
/// from this load balancer's own address (until it gives none), and calls
/// `publish` when the verdict changes. A peer starts up, as a backend does;
/// `fall` failed checks in a row take it down, `rise` good ones bring it
/// back.
async fn watch(
    addr: IpAddr,
    conf: impl Fn() -> Option<(HealthConf, Option<IpAddr>)>,
    mut publish: impl FnMut(bool, &CheckKey),
) {
    let mut tracker = Tracker::default();
    while let Some((conf, own)) = conf() {
        let started = Instant::now();
        let interval = Duration::from_millis(conf.interval_ms);
        let key = CheckKey {
            addr,
            conf,
            vip: None,
        };
        let outcome = if key.conf.kind == CheckKind::Fastpath {
            // Judged as health checks are: a probe whose own timer fired
            // late says nothing.
            let timeout = Duration::from_millis(key.conf.timeout_ms);
            match probe(addr, key.conf.port, own, timeout).await {
                true => health::Outcome::Up,
                false if started.elapsed() > timeout + timeout / 2 => health::Outcome::Inconclusive,
                false => health::Outcome::Down,
            }
        } else {
            health::check(&key, None).await
        };
        if let Some(up) = tracker.record_outcome(outcome, key.conf.rise, key.conf.fall) {
            publish(up, &key);
        }
        tokio::time::sleep(interval.saturating_sub(started.elapsed())).await;
    }
}

/// A liveness probe: these bytes, then 8 of a nonce the answer repeats.
const ASK: &[u8; 14] = b"fastpath peer?";
/// A liveness answer: these bytes, then the probe's nonce.
const ANSWER: &[u8; 14] = b"fastpath peer!";
/// How long the datapath's heartbeat may stand still before this load
/// balancer stops answering its peers (an idle datapath beats about every
/// 20 ms, so this is a stall, not a quiet moment).
pub const BEAT_STALE: Duration = Duration::from_millis(1000);

/// Sends one liveness probe to the peer at `addr`, from `from` if this
/// machine has that address (else from whatever the route picks); whether
/// it answered within `timeout`.
pub async fn probe(addr: IpAddr, port: u16, from: Option<IpAddr>, timeout: Duration) -> bool {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let fut = async {
        let any = SocketAddr::new(
            if addr.is_ipv4() {
                IpAddr::from([0u8; 4])
            } else {
                IpAddr::from([0u16; 8])
            },
            0,
        );
        let sock = match from.filter(|f| f.is_ipv4() == addr.is_ipv4()) {
            Some(f) => match tokio::net::UdpSocket::bind(SocketAddr::new(f, 0)).await {
                Ok(s) => s,
                Err(_) => tokio::net::UdpSocket::bind(any).await.ok()?,
            },
            None => tokio::net::UdpSocket::bind(any).await.ok()?,
        };
        let to = SocketAddr::new(addr, port);
        sock.connect(to).await.ok()?;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let nonce = (nanos ^ SEQ.fetch_add(1, Ordering::Relaxed).rotate_left(32)).to_be_bytes();
        let mut ask = ASK.to_vec();
        ask.extend_from_slice(&nonce);
        sock.send(&ask).await.ok()?;
        let mut buf = [0u8; 64];
        loop {
            // A connected socket takes datagrams from `to` only.
            let n = sock.recv(&mut buf).await.ok()?;
            if n == ANSWER.len() + 8
                && buf[..ANSWER.len()] == ANSWER[..]
                && buf[ANSWER.len()..n] == nonce
            {
                return Some(());
            }
        }
    };
    matches!(tokio::time::timeout(timeout, fut).await, Ok(Some(())))
}

/// Whether the datapath beats: its heartbeat moved within [`BEAT_STALE`].
struct Beat {
    last: u64,
    moved: Instant,
}

impl Beat {
    fn new() -> Beat {
        Beat {
            last: 0,
            moved: Instant::now(),
        }
    }

    fn beating(&mut self, now: u64) -> bool {
        if now != self.last {
            self.last = now;
            self.moved = Instant::now();
        }
        now != 0 && self.moved.elapsed() < BEAT_STALE
    }
}

/// Answers one probe read from `sock` if it comes from one of `peers` and
/// `beating` says the datapath forwards; whether it answered.
async fn answer_one(
    sock: &tokio::net::UdpSocket,
    peers: &[IpAddr],
    beating: &mut (dyn FnMut() -> bool + Send),
) -> bool {
    let mut buf = [0u8; 64];
    let Ok((n, from)) = sock.recv_from(&mut buf).await else {
        return false;
    };
    let ok = n == ASK.len() + 8
        && buf[..ASK.len()] == ASK[..]
        && peers.contains(&from.ip())
        && beating();
    if ok {
        let mut answer = ANSWER.to_vec();
        answer.extend_from_slice(&buf[ASK.len()..n]);
        return sock.send_to(&answer, from).await.is_ok();
    }
    false
}

/// Where and to whom this load balancer answers: its own `[fleet]`
/// address, the check's port, the peers (none unless the check is of kind
/// `fastpath`).
fn answering(cfg: &Config) -> Option<(SocketAddr, Vec<IpAddr>)> {
    let f = cfg.fleet.as_ref()?;
    if f.health.kind != CheckKind::Fastpath {
        return None;
    }
    let own = f.own(&cfg.encap)?;
    Some((SocketAddr::new(own, f.health.port), f.peers.clone()))
}

/// Answers the `[fleet]` peers' liveness probes at this load balancer's own
/// address while the datapath's `heartbeat` advances, following reloads,
/// until `stop`.
pub async fn responder(shared: Arc<Shared>, heartbeat: Arc<AtomicU64>, stop: Arc<AtomicBool>) {
    let mut beat = Beat::new();
    let mut bound: Option<(SocketAddr, tokio::net::UdpSocket)> = None;
    let mut failed: Option<SocketAddr> = None;
    while !stop.load(Ordering::Relaxed) {
        let want = answering(shared.control().config());
        let Some((at, peers)) = want else {
            bound = None;
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        if bound.as_ref().map(|(a, _)| *a) != Some(at) {
            bound = None;
            match tokio::net::UdpSocket::bind(at).await {
                Ok(s) => {
                    tracing::info!(%at, "fleet: answering the peers' liveness probes");
                    bound = Some((at, s));
                    failed = None;
                }
                Err(e) => {
                    if failed != Some(at) {
                        tracing::error!(%at, "fleet: cannot answer the peers' liveness probes: {e}");
                        failed = Some(at);
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
            }
        }
        let Some((_, sock)) = &bound else { continue };
        // Looked at every round (at most 100 ms apart), so a heartbeat
        // that moved once and stalled is not taken for a beating one.
        beat.beating(heartbeat.load(Ordering::Relaxed));
        let mut beating = || beat.beating(heartbeat.load(Ordering::Relaxed));
        let _ = tokio::time::timeout(
            Duration::from_millis(100),
            answer_one(sock, &peers, &mut beating),
        )
        .await;
    }
}

/// Makes the XDP program pass fragments that peers redirect to this load
/// balancer's own addresses (`[encap]` source and source6) to the socket.
/// Also without `[fleet]`: the datapath takes such fragments in whatever
/// its own list says, so a fleet whose configurations are being changed one
/// load balancer at a time loses none.
pub fn set_xdp_redirects(
    filter: &netio::afxdp::VipFilter,
    cfg: &Config,
) -> Result<(), netio::Error> {
    let own: Vec<[u8; 16]> = [cfg.encap.source, cfg.encap.source6]
        .into_iter()
        .flatten()
        .map(packet::flow::from_ip)
        .collect();
    filter.set_redirects(&own)
}

/// A peer in `/status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerStatus {
    /// Its address.
    pub address: String,
    /// Whether it is this load balancer.
    pub this: bool,
    /// Whether it is up (this load balancer always is).
    pub up: bool,
    /// Fragments this load balancer sent it.
    pub fragments_redirected: u64,
}

/// `[fleet]` in `/status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FleetStatus {
    /// This machine's name (`[fleet] name`, else the host name).
    pub name: String,
    /// The peers, sorted by address (the order the hash uses).
    pub peers: Vec<PeerStatus>,
    /// Fragments sent to the peer responsible for them.
    pub fragments_redirected: u64,
    /// Fragments that arrived redirected by a peer.
    pub fragments_redirect_received: u64,
    /// Fragments dropped because their peer was down.
    pub fragments_peer_down: u64,
}

/// The fleet's part of `/status` (none without `[fleet]`).
pub fn status(tables: &Tables, c: &Counters, cfg: &Config) -> Option<FleetStatus> {
    let f = tables.fleet.as_ref()?;
    let peers = f
        .peers
        .addrs()
        .iter()
        .enumerate()
        .map(|(i, a)| PeerStatus {
            address: a.to_string(),
            this: i as u32 == f.peers.me(),
            up: f.up[i],
            fragments_redirected: c
                .frag_redirected_to
                .get(f.counter_slot[i] as usize)
                .copied()
                .unwrap_or(0),
        })
        .collect();
    Some(FleetStatus {
        name: cfg.machine_name(),
        peers,
        fragments_redirected: c.frag_redirected,
        fragments_redirect_received: c.frag_redirect_received,
        fragments_peer_down: c.drops_for(DropReason::FragmentPeerDown),
    })
}

impl FleetStatus {
    /// For people (`fastpath lb status`).
    pub fn to_text(&self) -> String {
        let peers: Vec<String> = self
            .peers
            .iter()
            .map(|p| {
                let state = if p.this {
                    "this".to_string()
                } else if p.up {
                    format!("up, {} sent", p.fragments_redirected)
                } else {
                    format!("DOWN, {} sent", p.fragments_redirected)
                };
                format!("{} ({state})", p.address)
            })
            .collect();
        format!(
            "fleet: {} among {}; fragments redirected {}, received redirected {}, dropped for a down peer {}\n",
            self.name,
            peers.join(", "),
            self.fragments_redirected,
            self.fragments_redirect_received,
            self.fragments_peer_down
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A real peer: a TCP listener on this machine checked as `[fleet]`
    /// says. While it listens the peer stays up; closed, the datapath's
    /// tables mark it down (so its fragments are dropped by reason); back,
    /// up again.
    #[tokio::test(flavor = "current_thread")]
    async fn a_peer_that_stops_listening_goes_down_in_the_tables() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let cfg = Config::parse(
            &format!(
                "[encap]\nsource = \"10.0.0.2\"\n[fleet]\npeers = [\"127.0.0.1\", \"10.0.0.2\"]\n\
                 health = {{ kind = \"tcp\", port = {port}, interval_ms = 50, timeout_ms = 200, rise = 1, fall = 1 }}\n"
            ),
            "t",
        )
        .unwrap();
        let control = std::sync::Mutex::new(lb::Control::new(cfg.clone()).unwrap());
        let tables = control.lock().unwrap().tables();
        let peer: IpAddr = "127.0.0.1".parse().unwrap();
        let up = || {
            let t = tables.load();
            let f = t.fleet.as_ref().unwrap();
            f.up[f.peers.addrs().iter().position(|a| *a == peer).unwrap()]
        };
        let changes = std::sync::Mutex::new(Vec::new());
        let listener = std::sync::Mutex::new(Some(l));
        let check = || cfg.fleet.as_ref().map(|f| (f.health.clone(), None));
        let publish = |u: bool, _: &CheckKey| {
            control.lock().unwrap().set_peer_up(peer, u);
            changes.lock().unwrap().push(u);
        };
        let script = async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            assert!(up(), "a listening peer stays up");
            drop(listener.lock().unwrap().take());
            for _ in 0..100 {
                if !up() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            assert!(!up(), "a peer that refuses goes down");
            let again = tokio::net::TcpListener::bind(("127.0.0.1", port))
                .await
                .unwrap();
            for _ in 0..100 {
                if up() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            assert!(up(), "and comes back");
            drop(again);
        };
        tokio::select! {
            () = watch(peer, check, publish) => unreachable!("the check stays configured"),
            () = script => {}
        }
        assert_eq!(*changes.lock().unwrap(), [false, true]);
    }

    /// The default peer check: a peer's own fastpath answers while its
    /// datapath beats, and only its listed peers; it is silent when the
    /// heartbeat stands still, as a peer whose forwarder died or hung is.
    #[tokio::test(flavor = "current_thread")]
    async fn a_peer_answers_while_its_datapath_beats() {
        let sock = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let port = sock.local_addr().unwrap().port();
        let me: IpAddr = "127.0.0.1".parse().unwrap();
        let beating = Arc::new(AtomicBool::new(true));
        let answers = Arc::new(AtomicU64::new(0));
        let (b, a) = (Arc::clone(&beating), Arc::clone(&answers));
        let server = tokio::spawn(async move {
            loop {
                let mut beat = || b.load(Ordering::Relaxed);
                if answer_one(&sock, &[me], &mut beat).await {
                    a.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        let t = Duration::from_millis(300);
        assert!(probe(me, port, Some(me), t).await, "a beating peer answers");
        // From an address that is not a peer: no answer.
        let stranger: IpAddr = "127.0.0.2".parse().unwrap();
        assert!(!probe(me, port, Some(stranger), t).await);
        beating.store(false, Ordering::Relaxed);
        assert!(
            !probe(me, port, Some(me), t).await,
            "a stalled peer is silent"
        );
        beating.store(true, Ordering::Relaxed);
        assert!(probe(me, port, None, t).await);
        assert_eq!(answers.load(Ordering::Relaxed), 2);
        server.abort();
        // The heartbeat's judgement: moving is beating, standing still for
        // BEAT_STALE is not, 0 (never beat) is not.
        let mut beat = Beat::new();
        assert!(!beat.beating(0));
        assert!(beat.beating(5));
        beat.moved -= BEAT_STALE;
        assert!(!beat.beating(5));
        assert!(beat.beating(6));
        // The default [fleet] check is this one, at this load balancer's
        // own address.
        let cfg = Config::parse(CONFIG, "t").unwrap();
        let (at, peers) = answering(&cfg).unwrap();
        assert_eq!(
            at,
            SocketAddr::new("10.10.2.2".parse().unwrap(), lb::config::PEER_PORT)
        );
        assert_eq!(peers.len(), 3);
    }

    const CONFIG: &str = r#"
[encap]
source = "10.10.2.2"
[fleet]
peers = ["10.10.2.4", "10.10.2.2", "10.10.2.3"]
name = "lb1"
"#;

    #[test]
    fn status_and_metrics_show_peers_and_counts() {
        let cfg = Config::parse(CONFIG, "t").unwrap();
        assert_eq!(
            others(&cfg),
            [
                "10.10.2.4".parse::<IpAddr>().unwrap(),
                "10.10.2.3".parse().unwrap()
            ]
        );
        let mut control = lb::Control::new(cfg.clone()).unwrap();
        assert!(control.set_peer_up("10.10.2.4".parse().unwrap(), false));
        let tables = control.tables().load_full();
        let mut c = Counters::new();
        c.frag_redirected = 5;
        let slot = |a: &str| {
            let f = tables.fleet.as_ref().unwrap();
            let i = f
                .peers
                .addrs()
                .iter()
                .position(|p| p.to_string() == a)
                .unwrap();
            f.counter_slot[i] as usize
        };
        c.frag_redirected_to = vec![0; 3];
        c.frag_redirected_to[slot("10.10.2.3")] = 5;
        c.frag_redirect_received = 2;
        c.drop(DropReason::FragmentPeerDown);
        let s = status(&tables, &c, &cfg).unwrap();
        assert_eq!(s.name, "lb1");
        let addrs: Vec<&str> = s.peers.iter().map(|p| p.address.as_str()).collect();
        assert_eq!(addrs, ["10.10.2.2", "10.10.2.3", "10.10.2.4"]);
        assert!(s.peers[0].this && s.peers[0].up);
        assert!(s.peers[1].up && !s.peers[2].up);
        assert_eq!(s.peers[1].fragments_redirected, 5);
        assert_eq!(s.fragments_peer_down, 1);
        let text = s.to_text();
        assert!(text.contains("10.10.2.4 (DOWN, 0 sent)"), "{text}");
        // A document round-trips (fastpath lb status reads it back).
        let back: FleetStatus = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(back, s);
    }
}
