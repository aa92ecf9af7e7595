//! MAC learning with aging.

use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;

/// An Ethernet address.
pub type Mac = [u8; 6];

/// Where each source address was last seen.
pub struct MacTable {
    map: FxHashMap<Mac, (u16, Instant)>,
    aging: Duration,
    max: usize,
}

impl MacTable {
    /// An empty table: entries live `aging`, at most `max` of them.
    pub fn new(aging: Duration, max: usize) -> MacTable {
        MacTable {
            map: FxHashMap::default(),
            aging,
            max,
        }
    }

    /// Learn that `mac` lives behind `port`. Group addresses are never
    /// learned; a full table learns nothing new (it floods instead).
    #[inline]
    pub fn learn(&mut self, mac: Mac, port: u16, now: Instant) {
        if mac[0] & 1 != 0 {
            return;
        }
        if let Some(e) = self.map.get_mut(&mac) {
            *e = (port, now);
        } else if self.map.len() < self.max {
            self.map.insert(mac, (port, now));
        }
    }

    /// The port for a unicast destination, if known and not aged out.
    #[inline]
    pub fn lookup(&self, mac: &Mac, now: Instant) -> Option<u16> {
        match self.map.get(mac) {
            Some(&(p, t)) if now.saturating_duration_since(t) < self.aging => Some(p),
            _ => None,
        }
    }

    /// Drop entries older than the aging time.
    pub fn age(&mut self, now: Instant) {
        let aging = self.aging;
        self.map
            .retain(|_, (_, t)| now.saturating_duration_since(*t) < aging);
    }

    /// Forget every address behind `port` (it went away).
    pub fn forget_port(&mut self, port: u16) {
        self.map.retain(|_, (p, _)| *p != port);
    }

    /// Addresses known.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether no address is known.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn learns_moves_ages_and_forgets() {
        let mut t = MacTable::new(Duration::from_secs(10), 2);
        let t0 = Instant::now();
        let a = [2, 0, 0, 0, 0, 1];
        let b = [2, 0, 0, 0, 0, 2];
        t.learn(a, 1, t0);
        assert_eq!(t.lookup(&a, t0), Some(1));
        t.learn(a, 3, t0); // moved
        assert_eq!(t.lookup(&a, t0), Some(3));
        t.learn([1, 0, 0, 0, 0, 9], 1, t0); // multicast source: not learned
        assert_eq!(t.len(), 1);
        t.learn(b, 2, t0);
        t.learn([2, 0, 0, 0, 0, 3], 2, t0); // table full
        assert_eq!(t.len(), 2);
        assert_eq!(t.lookup(&a, t0 + Duration::from_secs(11)), None, "aged");
        t.forget_port(2);
        assert_eq!(t.lookup(&b, t0), None);
        t.age(t0 + Duration::from_secs(11));
        assert!(t.is_empty());
    }
}
