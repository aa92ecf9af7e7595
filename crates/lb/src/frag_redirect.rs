//! Fragments among the fleet (Maglev paper, section 4.3).
//!
//! Routers may spread a datagram's fragments over several load balancers
//! (some hash first fragments by 5-tuple and later ones by 3-tuple), and
//! only one machine's fragment table can put the datagram back together.
//! So every fragment of a datagram for a VIP goes to one peer, chosen by
//! the hash of its 3-tuple (source, destination, protocol: the fields all
//! fragments carry) over `[fleet] peers`:
//!
//! ```text
//!   fragment --3-tuple hash--> Maglev table over the sorted peer list
//!     responsible is this LB  -> fragment table, backend, as always
//!     responsible is a peer   -> GRE to the peer, key FRAGMENT_REDIRECT_KEY
//!     peer down               -> dropped: fragment_peer_down
//!   GRE to this LB's own address with that key
//!     -> decapsulated, handled here, never redirected again
//! ```
//!
//! Every load balancer must pick the same peer for a datagram, so the choice
//! depends only on the 3-tuple and the configured list (sorted, so its order
//! in the file does not matter; a Maglev table over it, so a list that
//! differs by one peer moves only that peer's share). It does not depend on
//! liveness: load balancers may disagree on which peers are up (each checks
//! them itself), and rehashing by local liveness would split a datagram's
//! fragments between machines exactly when they disagree. A fragment whose
//! peer is down is dropped and counted; the sender retransmits, and the
//! operator sees the count. A fragment that arrives redirected is handled
//! where it lands even if this load balancer's list names another peer, so
//! two load balancers whose lists disagree cannot pass a fragment back and
//! forth: it travels at most one hop.

use std::net::IpAddr;
use std::sync::Arc;

use maglev::Maglev;
use packet::gre::Outer;
use packet::FlowKey;

/// Seed of the 3-tuple hash that picks a fragment's peer: independent of
/// the steering and flow hashes, and the same on every load balancer.
pub const PEER_SEED: u64 = 0x6672_6167_7065_6572;
/// Size of the Maglev table over the peers (prime; the same everywhere).
pub const PEER_TABLE_SIZE: u64 = 4093;

/// Why a peer table could not be built.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    /// This load balancer's address is not in the list.
    #[error("{0} is not among the peers")]
    NotAPeer(IpAddr),
    /// The Maglev table over the peers could not be built.
    #[error("peer table: {0}")]
    Table(#[from] maglev::Error),
}

/// The hash a fragment's peer is chosen by: its 3-tuple's.
#[inline]
pub fn peer_hash(flow: &FlowKey) -> u64 {
    flow.three_tuple().hash(PEER_SEED)
}

/// The peers, sorted, with the Maglev table that maps a 3-tuple hash to
/// one of them. Built when the configuration changes, not per packet.
#[derive(Debug)]
pub struct Peers {
    addrs: Vec<IpAddr>,
    table: Maglev,
    me: u32,
}

impl Peers {
    /// The table over `peers` (any order; duplicates are the caller's to
    /// reject), for the load balancer at `me`.
    pub fn new(peers: &[IpAddr], me: IpAddr) -> Result<Self, FleetError> {
        let mut addrs = peers.to_vec();
        addrs.sort_unstable();
        addrs.dedup();
        let me = addrs
            .iter()
            .position(|a| *a == me)
            .ok_or(FleetError::NotAPeer(me))? as u32;
        let mut table = Maglev::new(PEER_TABLE_SIZE)?;
        let names: Vec<maglev::Backend> = addrs
            .iter()
            .map(|a| maglev::Backend::new(a.to_string()))
            .collect();
        table.populate(&names)?;
        Ok(Peers { addrs, table, me })
    }

    /// The peer (index into [`Peers::addrs`]) responsible for a fragment
    /// of `flow` (only its 3-tuple counts).
    #[inline]
    pub fn responsible(&self, flow: &FlowKey) -> u32 {
        // Every peer has weight 1, so every slot is filled.
        self.table.lookup(peer_hash(flow)).unwrap_or(self.me)
    }

    /// The peers' addresses, sorted.
    pub fn addrs(&self) -> &[IpAddr] {
        &self.addrs
    }

    /// This load balancer's index.
    pub fn me(&self) -> u32 {
        self.me
    }
}

/// The fleet as packet threads see it in a [`crate::tables::Tables`]
/// snapshot: the peer table, which peers are up, and how to reach each.
#[derive(Debug, Clone)]
pub struct Fleet {
    /// The peers and their table (shared between snapshots: liveness
    /// changes do not rebuild it).
    pub peers: Arc<Peers>,
    /// Whether each peer (by index in [`Peers::addrs`]) is up; this load
    /// balancer always is.
    pub up: Vec<bool>,
    /// Outer headers for fragments redirected to each peer.
    pub outer: Vec<Outer>,
    /// Each peer's counter slot (stable for the life of the process, so
    /// counts survive reloads that reorder or change the list): the index
    /// into [`crate::counters::Counters::frag_redirected_to`] and
    /// [`Fleet::counter_peers`].
    pub counter_slot: Vec<u32>,
    /// The peer address of each counter slot.
    pub counter_peers: Arc<Vec<IpAddr>>,
}

/// The peer responsible for a fragment of `flow` among `peers` (in any
/// order): what every load balancer with this list computes. For tests and
/// tools that need to know which load balancer handles a datagram.
pub fn responsible(peers: &[IpAddr], flow: &FlowKey) -> Option<IpAddr> {
    let first = *peers.first()?;
    let p = Peers::new(peers, first).ok()?;
    Some(p.addrs[p.responsible(flow) as usize])
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn peers(n: usize) -> Vec<IpAddr> {
        (0..n)
            .map(|i| IpAddr::from([10, 10, 2, 2 + i as u8]))
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Any 3-tuple, any order of the list, any load balancer of the
        /// fleet: the same peer.
        #[test]
        fn every_load_balancer_picks_the_same_peer(
            n in 1usize..8,
            perm in any::<u64>(),
            flows in proptest::collection::vec((any::<[u8; 4]>(), any::<[u8; 4]>(), any::<u8>(), any::<u16>(), any::<u16>()), 1..20),
        ) {
            let list = peers(n);
            let mut shuffled = list.clone();
            // A permutation from `perm` (Fisher-Yates with its bits).
            let mut r = perm;
            for i in (1..shuffled.len()).rev() {
                shuffled.swap(i, (r % (i as u64 + 1)) as usize);
                r = r.rotate_left(7) ^ 0x9e37_79b9_7f4a_7c15;
            }
            let views: Vec<Peers> = list
                .iter()
                .map(|&me| Peers::new(if me == list[0] { &list } else { &shuffled }, me).unwrap())
                .collect();
            for (s, d, proto, sp, dp) in flows {
                let first = FlowKey::v4(s, d, sp, dp, proto);
                let later = FlowKey::v4(s, d, 0, 0, proto);
                let want = views[0].addrs()[views[0].responsible(&first) as usize];
                for v in &views {
                    prop_assert_eq!(v.addrs()[v.responsible(&first) as usize], want);
                    // Ports (present in first fragments only) do not count.
                    prop_assert_eq!(v.addrs()[v.responsible(&later) as usize], want);
                }
                prop_assert_eq!(responsible(&shuffled, &first), Some(want));
            }
        }
    }

    #[test]
    fn spreads_over_the_peers_and_a_removed_peer_moves_only_its_share() {
        let three = Peers::new(&peers(3), peers(3)[0]).unwrap();
        let two = Peers::new(&peers(3)[..2], peers(3)[0]).unwrap();
        let mut counts = [0u32; 3];
        let mut moved = 0;
        let n = 30_000u32;
        for i in 0..n {
            let f = FlowKey::v4(i.to_be_bytes(), [198, 18, 0, 80], 0, 0, 17);
            let a = three.responsible(&f) as usize;
            counts[a] += 1;
            let b = two.responsible(&f) as usize;
            if a != 2 && two.addrs()[b] != three.addrs()[a] {
                moved += 1;
            }
        }
        for c in counts {
            assert!((8_000..12_000).contains(&c), "{counts:?}");
        }
        // Maglev's small disruption: a few percent of the others' share.
        assert!(moved < n / 20, "{moved} moved");
        assert!(matches!(
            Peers::new(&peers(2), "10.9.9.9".parse().unwrap()),
            Err(FleetError::NotAPeer(_))
        ));
    }
}
