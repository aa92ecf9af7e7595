//! MAC learning with aging, and addresses pinned to a port (port
//! security: a locked port's address is never learned elsewhere).

use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;

/// An Ethernet address.
pub type Mac = [u8; 6];

/// An address as text, `02:00:00:00:00:01`.
pub fn mac_text(m: &Mac) -> String {
    format!(
        "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
        m[0], m[1], m[2], m[3], m[4], m[5]
    )
}

/// An address written as six hex bytes separated by ':'.
pub fn parse_mac(s: &str) -> Option<Mac> {
    let mut m = [0u8; 6];
    let mut parts = s.split(':');
    for b in m.iter_mut() {
        let p = parts.next()?;
        // Hex digits only: `from_str_radix` would take a sign ("+2").
        if p.is_empty() || p.len() > 2 || !p.bytes().all(|c| c.is_ascii_hexdigit()) {
            return None;
        }
        *b = u8::from_str_radix(p, 16).ok()?;
    }
    parts.next().is_none().then_some(m)
}

/// Where each source address was last seen, and the addresses pinned to a
/// port.
pub struct MacTable {
    map: FxHashMap<Mac, (u16, Instant)>,
    /// Addresses locked to a port: never learned behind another, never aged.
    pins: FxHashMap<Mac, u16>,
    aging: Duration,
    max: usize,
}

impl MacTable {
    /// An empty table: entries live `aging`, at most `max` of them.
    pub fn new(aging: Duration, max: usize) -> MacTable {
        MacTable {
            map: FxHashMap::default(),
            pins: FxHashMap::default(),
            aging,
            max,
        }
    }

    /// Learn that `mac` lives behind `port`. Group addresses and pinned
    /// addresses are never learned; a full table learns nothing new (it
    /// floods instead).
    #[inline]
    pub fn learn(&mut self, mac: Mac, port: u16, now: Instant) {
        if mac[0] & 1 != 0 || (!self.pins.is_empty() && self.pins.contains_key(&mac)) {
            return;
        }
        if let Some(e) = self.map.get_mut(&mac) {
            *e = (port, now);
        } else if self.map.len() < self.max {
            self.map.insert(mac, (port, now));
        }
    }

    /// The port for a unicast destination, if pinned, or known and not
    /// aged out.
    #[inline]
    pub fn lookup(&self, mac: &Mac, now: Instant) -> Option<u16> {
        if !self.pins.is_empty() {
            if let Some(&p) = self.pins.get(mac) {
                return Some(p);
            }
        }
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

    /// Forget every address behind `port` (it went away), pinned ones too.
    pub fn forget_port(&mut self, port: u16) {
        self.map.retain(|_, (p, _)| *p != port);
        self.pins.retain(|_, p| *p != port);
    }

    /// Pin `mac` to `port`: lookups find it there whatever other ports
    /// send, and it is never learned elsewhere or aged. A learned entry for
    /// it goes.
    pub fn pin(&mut self, mac: Mac, port: u16) {
        self.map.remove(&mac);
        self.pins.insert(mac, port);
    }

    /// The port `mac` is pinned to, if it is.
    #[inline]
    pub fn pinned(&self, mac: &Mac) -> Option<u16> {
        if self.pins.is_empty() {
            return None;
        }
        self.pins.get(mac).copied()
    }

    /// Whether any address is pinned.
    #[inline]
    pub fn has_pins(&self) -> bool {
        !self.pins.is_empty()
    }

    /// Addresses known, learned and pinned.
    pub fn len(&self) -> usize {
        self.map.len() + self.pins.len()
    }

    /// Whether no address is known.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty() && self.pins.is_empty()
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn mac_octets_are_hex_digits_only() {
        assert_eq!(parse_mac("2:0:0:0:0:a"), Some([2, 0, 0, 0, 0, 10]));
        assert_eq!(
            parse_mac("52:54:00:12:34:56"),
            Some([0x52, 0x54, 0, 0x12, 0x34, 0x56])
        );
        for bad in [
            "+2:0:0:0:0:1",
            "2:0:0:0:0:+1",
            "-0:0:0:0:0:1",
            "2:0:0:0:0",
            "2:0:0:0:0:0:0",
            "2:0:0:0:0:100",
            "2::0:0:0:1",
        ] {
            assert_eq!(parse_mac(bad), None, "{bad}");
        }
    }

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

    #[test]
    fn pinned_addresses_stay_with_their_port() {
        let mut t = MacTable::new(Duration::from_secs(10), 16);
        let t0 = Instant::now();
        let a = [2, 0, 0, 0, 0, 1];
        t.learn(a, 4, t0);
        t.pin(a, 1);
        assert_eq!(
            t.lookup(&a, t0),
            Some(1),
            "the pin replaces what was learned"
        );
        t.learn(a, 2, t0); // another port claims it
        assert_eq!(t.lookup(&a, t0), Some(1));
        assert_eq!(t.pinned(&a), Some(1));
        t.age(t0 + Duration::from_secs(60));
        assert_eq!(
            t.lookup(&a, t0 + Duration::from_secs(60)),
            Some(1),
            "never aged"
        );
        t.forget_port(1);
        assert_eq!(t.pinned(&a), None);
        assert!(t.is_empty());
    }
}
