//! The adaptive polling window: how long the switch keeps polling after a
//! port's last frame, so that a guest sending at a steady rate is never
//! asked to kick (the host half of Send Combining, at every rate), while
//! an idle switch sleeps.
//!
//! Each port learns the gaps between the passes in which it handed the
//! switch frames ([`Window`]): a histogram of gaps in powers of two of a
//! microsecond, decayed so that it remembers roughly the last thousand
//! gaps. Its window is twice the upper bound of the bucket that holds the
//! 98th percentile of those gaps (a gap in `[16, 32)` µs gives 64 µs: the
//! next frame is expected well inside it), at most `poll_max_us`. A port
//! most of whose gaps are longer than `poll_max_us` gets no window: polling
//! through its gaps would cost more than the kicks it saves, and it kicks.
//!
//! The event loop polls while the fixed floor `poll_us` since the last
//! work has not passed, or while some port's window since that port's last
//! frame is open and the [`Budget`] allows; then it asks for kicks and
//! sleeps. The budget bounds polling that finds nothing: polling past the
//! floor that ends in a sleep (the window ran out, the frame it waited for
//! never came) is charged to a token bucket refilled at `poll_budget_pct`
//! percent of a core, holding at most a tenth of a second of it; while it
//! is empty the switch sleeps at the floor, as without adaptive windows.
//! So with traffic sparser than the windows (the case where polling buys
//! nothing), polling past the floor takes at most `poll_budget_pct` % of a
//! core averaged over any second (plus the bucket's tenth of a second).
//! Polling that ends in a frame is not charged: it is what saved a kick. A
//! port whose gaps fit its window keeps the switch polling for as long as
//! it sends, up to a whole core (a DPDK poll-mode driver polls always);
//! `poll_max_us` is the lever: a port sending slower than one frame per
//! `poll_max_us` is never polled through. Polling past the floor yields
//! the CPU on every idle pass, so that on a core the switch shares (with a
//! guest's vCPU, on a small host) the polling takes what nobody else wants.
//!
//! Interrupts toward the guest adapt too, on the transmit queue only (see
//! the vhost datapath: completion calls held while the guest keeps
//! sending); receive calls follow the guest's own `used_event`.
//!
//! Only VM ports (vhost-user) learn windows: there a kick is a VM exit,
//! the cost this saves. Ring ports have their own answer (a CSB: kicks
//! off while the switch polls its shared counters), memif ports theirs
//! (interrupt moderation, for a switch sharing its core with a sender
//! that never yields, where polling an empty ring only delays the sender);
//! both keep the floor alone.
//!
//! Times are nanoseconds from an epoch of the caller's choice, so that
//! the logic is a pure function of arrival times and can be tested as one.

/// Buckets of the gap histogram: gaps under 1 µs, then `[2^(i-1), 2^i)` µs
/// for bucket `i`, the last holding every longer gap.
const BUCKETS: usize = 18;
/// Weight one gap adds to its bucket.
const WEIGHT: u32 = 16;
/// When the histogram's total passes this, every bucket is halved: it
/// remembers about the last thousand gaps.
const DECAY_AT: u32 = WEIGHT * 1024;
/// The percentile of gaps the window is made to cover, in percent.
const COVER_PCT: u64 = 98;
/// The largest `poll_max_us`: the histogram's last bounded bucket.
pub const MAX_WINDOW_US: u64 = 1 << (BUCKETS - 2);
/// The bucket's depth in time: at most this much polling the budget lets
/// through at once, as a share of the per-second rate.
const BUCKET_NS_PER_PCT: i64 = 1_000_000; // 100 % -> 100 ms

/// The polling settings the event loop runs with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    /// Always poll this long after the last work (the floor; `poll_us`).
    pub floor_ns: u64,
    /// The longest window a port may learn (`poll_max_us`); at or below
    /// the floor, windows are off and the floor is all.
    pub max_ns: u64,
    /// Polling past the floor that finds nothing, at most this percent of a
    /// core averaged over a second (`poll_budget_pct`).
    pub budget_pct: u8,
}

impl Settings {
    /// Whether ports learn windows at all.
    pub fn adaptive(&self) -> bool {
        self.max_ns > self.floor_ns && self.budget_pct > 0
    }
}

/// Whether ports of this kind ([`crate::Port::kind`]) learn windows: VM
/// ports, whose kicks are VM exits.
pub fn learns(kind: &str) -> bool {
    kind == "vhost-user"
}

/// The bucket of a gap.
fn bucket(gap_ns: u64) -> usize {
    let us = gap_ns / 1000;
    if us == 0 {
        0
    } else {
        ((64 - us.leading_zeros()) as usize).min(BUCKETS - 1)
    }
}

/// The shortest gap in bucket `i`, nanoseconds.
fn lower_ns(i: usize) -> u64 {
    if i == 0 {
        0
    } else {
        1000 << (i - 1)
    }
}

/// The longest gap in bucket `i` (exclusive), nanoseconds.
fn upper_ns(i: usize) -> u64 {
    1000 << i
}

/// One port's learned window and what its polling cost.
#[derive(Clone, Debug, Default)]
pub struct Window {
    /// When the port last handed the switch frames.
    last: Option<u64>,
    /// Its frames counter then (`from_port`), to see new ones.
    seen: u64,
    hist: [u32; BUCKETS],
    total: u32,
    /// The window learned, nanoseconds (0: none).
    window_ns: u64,
    /// Passes in which the port had frames.
    pub arrivals: u64,
    /// Time the switch polled past the floor while this port's window was
    /// open, nanoseconds.
    pub polled_ns: u64,
    /// The part of it that ended in a sleep (found nothing).
    pub wasted_ns: u64,
    /// Polled past the floor in the idle stretch under way.
    stretch_ns: u64,
    /// The share of the last full second the port's window kept the
    /// switch polling, and where that second began.
    share: f64,
    mark_at: u64,
    mark_polled: u64,
}

impl Window {
    /// The port's frame counter is `from_port` at `now` (after a pass):
    /// a new value is an arrival.
    pub fn observe(&mut self, now: u64, from_port: u64, s: &Settings) {
        if from_port == self.seen {
            return;
        }
        self.seen = from_port;
        self.arrival(now, s);
    }

    /// The port handed the switch frames in the pass at `now`.
    pub fn arrival(&mut self, now: u64, s: &Settings) {
        self.arrivals += 1;
        self.stretch_ns = 0;
        if let Some(last) = self.last.replace(now) {
            self.learn(now.saturating_sub(last), s);
        }
    }

    fn learn(&mut self, gap_ns: u64, s: &Settings) {
        self.hist[bucket(gap_ns)] += WEIGHT;
        self.total += WEIGHT;
        if self.total > DECAY_AT {
            self.total = 0;
            for h in &mut self.hist {
                *h /= 2;
                self.total += *h;
            }
        }
        self.window_ns = self.fit(s);
    }

    /// The window the histogram calls for.
    fn fit(&self, s: &Settings) -> u64 {
        if !s.adaptive() || self.total == 0 {
            return 0;
        }
        let total = u64::from(self.total);
        let coverable: u64 = (0..BUCKETS)
            .filter(|&i| lower_ns(i) < s.max_ns)
            .map(|i| u64::from(self.hist[i]))
            .sum();
        // Most gaps too long to poll through: the port kicks.
        if coverable * 2 < total {
            return 0;
        }
        let want = (total * COVER_PCT).div_ceil(100);
        let mut cum = 0u64;
        for (i, h) in self.hist.iter().enumerate() {
            cum += u64::from(*h);
            if cum >= want {
                return (2 * upper_ns(i)).min(s.max_ns);
            }
        }
        s.max_ns
    }

    /// The window learned, nanoseconds (0: none; the floor applies).
    pub fn window_ns(&self) -> u64 {
        self.window_ns
    }

    /// Whether the port expects more frames at `now`: its window since its
    /// last frame is open.
    pub fn open(&self, now: u64) -> bool {
        self.last
            .is_some_and(|l| self.window_ns > 0 && now < l.saturating_add(self.window_ns))
    }

    /// The switch polled `dt` past the floor while this window was open.
    pub fn polled(&mut self, dt: u64) {
        self.polled_ns += dt;
        self.stretch_ns += dt;
    }

    /// The idle stretch ended in work: its polling was not wasted.
    pub fn paid(&mut self) {
        self.stretch_ns = 0;
    }

    /// The switch goes to sleep: what this port's window polled in this
    /// idle stretch found nothing.
    pub fn slept(&mut self) {
        self.wasted_ns += self.stretch_ns;
        self.stretch_ns = 0;
    }

    /// Close the second under way at `now` if it is over: the share of it
    /// the port's window kept the switch polling.
    pub fn roll(&mut self, now: u64) {
        let dt = now.saturating_sub(self.mark_at);
        if dt >= 1_000_000_000 {
            self.share = (self.polled_ns - self.mark_polled) as f64 / dt as f64;
            self.mark_at = now;
            self.mark_polled = self.polled_ns;
        }
    }

    /// The share of the last full second the port's window kept the switch
    /// polling (0..=1).
    pub fn share(&self) -> f64 {
        self.share
    }

    /// The port's polling, as the status document shows it.
    pub fn status(&self) -> crate::status::PollingStatus {
        crate::status::PollingStatus {
            window_us: self.window_ns / 1000,
            polled_share: self.share,
            polled_us: self.polled_ns / 1000,
            wasted_us: self.wasted_ns / 1000,
            arrivals: self.arrivals,
        }
    }
}

/// The switch's budget for polling that finds nothing: a token bucket of
/// nanoseconds of polling, refilled at `budget_pct` % of real time, holding
/// at most `budget_pct` x 1 ms (a tenth of a second's worth).
#[derive(Clone, Debug)]
pub struct Budget {
    pct: i64,
    tokens: i64,
    cap: i64,
    last: u64,
}

impl Budget {
    /// A full bucket at `now`.
    pub fn new(s: &Settings, now: u64) -> Budget {
        let cap = i64::from(s.budget_pct) * BUCKET_NS_PER_PCT;
        Budget {
            pct: i64::from(s.budget_pct),
            tokens: cap,
            cap,
            last: now,
        }
    }

    fn refill(&mut self, now: u64) {
        let dt = now.saturating_sub(self.last).min(i64::MAX as u64 / 128) as i64;
        self.last = now;
        self.tokens = (self.tokens + dt * self.pct / 100).min(self.cap);
    }

    /// Whether polling may go on at `now`, `ext_ns` past the floor in this
    /// idle stretch: were it to end in a sleep now and one more pass later,
    /// the bucket could pay for it.
    pub fn allows(&mut self, now: u64, ext_ns: u64) -> bool {
        self.refill(now);
        self.tokens > ext_ns as i64
    }

    /// An idle stretch ended in a sleep after polling `ext_ns` past the
    /// floor: charge it.
    pub fn charge(&mut self, now: u64, ext_ns: u64) {
        self.refill(now);
        self.tokens = (self.tokens - ext_ns as i64).max(-self.cap);
    }

    /// Nanoseconds of fruitless polling the bucket holds now.
    pub fn tokens(&self) -> i64 {
        self.tokens
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: u64 = 1000;

    fn settings(max_us: u64, pct: u8) -> Settings {
        Settings {
            floor_ns: 20 * US,
            max_ns: max_us * US,
            budget_pct: pct,
        }
    }

    /// The window after arrivals at these gaps (µs), from time 0.
    fn learned(s: &Settings, gaps_us: &[u64]) -> Window {
        let mut w = Window::default();
        let mut t = 0;
        w.arrival(t, s);
        for g in gaps_us {
            t += g * US;
            w.arrival(t, s);
        }
        w
    }

    #[test]
    fn buckets_are_powers_of_two_of_a_microsecond() {
        assert_eq!(bucket(0), 0);
        assert_eq!(bucket(999), 0);
        assert_eq!(bucket(1000), 1);
        assert_eq!(bucket(1999), 1);
        assert_eq!(bucket(2000), 2);
        assert_eq!(bucket(31_999), 5);
        assert_eq!(bucket(32_000), 6);
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
        for i in 0..BUCKETS - 1 {
            assert_eq!(bucket(lower_ns(i)), i);
            assert_eq!(bucket(upper_ns(i) - 1), i);
        }
    }

    #[test]
    fn a_steady_sender_gets_a_window_of_a_few_gaps() {
        let s = settings(200, 10);
        // 30 µs gaps: bucket [16, 32) µs, window twice its top.
        let w = learned(&s, &[30; 100]);
        assert_eq!(w.window_ns(), 64 * US);
        // Open a gap later, closed after the window.
        assert!(w.open(100 * 30 * US + 30 * US));
        assert!(w.open(100 * 30 * US + 63 * US));
        assert!(!w.open(100 * 30 * US + 64 * US));
        // Faster: 3 µs gaps give 8 µs.
        assert_eq!(learned(&s, &[3; 100]).window_ns(), 8 * US);
    }

    #[test]
    fn the_window_covers_the_98th_percentile_and_ignores_rarer_stalls() {
        let s = settings(500, 10);
        // 1 in 20 gaps at 100 µs: 5 % > 2 %, so the window covers them.
        let gaps: Vec<u64> = (0..400)
            .map(|i| if i % 20 == 0 { 100 } else { 30 })
            .collect();
        assert_eq!(learned(&s, &gaps).window_ns(), 256 * US);
        // 1 in 100: the window stays at the common gap's.
        let gaps: Vec<u64> = (0..400)
            .map(|i| if i % 100 == 0 { 100 } else { 30 })
            .collect();
        assert_eq!(learned(&s, &gaps).window_ns(), 64 * US);
    }

    #[test]
    fn the_window_is_bounded_by_the_maximum() {
        let s = settings(200, 10);
        // 150 µs gaps would call for 512 µs.
        assert_eq!(learned(&s, &[150; 50]).window_ns(), 200 * US);
    }

    #[test]
    fn a_sender_sparser_than_the_maximum_gets_no_window() {
        let s = settings(200, 10);
        let w = learned(&s, &[1000; 50]);
        assert_eq!(w.window_ns(), 0);
        assert!(!w.open(50 * 1000 * US + 1));
        // Mostly sparse with a few close pairs: still none.
        let gaps: Vec<u64> = (0..100)
            .map(|i| if i % 3 == 0 { 10 } else { 5000 })
            .collect();
        assert_eq!(learned(&s, &gaps).window_ns(), 0);
    }

    #[test]
    fn windows_are_off_at_or_below_the_floor_or_without_budget() {
        for s in [settings(20, 10), settings(10, 10), settings(200, 0)] {
            assert_eq!(learned(&s, &[5; 50]).window_ns(), 0, "{s:?}");
        }
    }

    #[test]
    fn the_histogram_forgets_and_follows_a_new_rate() {
        let s = settings(200, 10);
        let mut w = learned(&s, &[150; 2000]);
        assert_eq!(w.window_ns(), 200 * US);
        // After a few thousand gaps at 3 µs, the old ones weigh nothing.
        let mut t = 10_000_000_000;
        for _ in 0..5000 {
            t += 3 * US;
            w.arrival(t, &s);
        }
        assert_eq!(w.window_ns(), 8 * US);
        assert!(w.total <= DECAY_AT);
    }

    #[test]
    fn a_port_goes_idle_after_its_window() {
        let s = settings(200, 10);
        let w = learned(&s, &[30; 10]);
        let last = 10 * 30 * US;
        assert!(w.open(last));
        assert!(!w.open(last + w.window_ns()));
        assert!(!w.open(last + 1_000_000 * US));
        assert!(!Window::default().open(0), "no frame yet: no window");
    }

    #[test]
    fn observe_sees_new_frames_only() {
        let s = settings(200, 10);
        let mut w = Window::default();
        w.observe(0, 5, &s);
        w.observe(30 * US, 5, &s);
        assert_eq!(w.arrivals, 1);
        w.observe(60 * US, 6, &s);
        assert_eq!(w.arrivals, 2);
        assert_eq!(w.window_ns(), 128 * US, "one gap of 60 µs");
    }

    #[test]
    fn the_budget_bounds_fruitless_polling_per_second() {
        // Property: whatever the pattern of stretches that end in sleeps,
        // polling past the floor charged over a span of T seconds is at
        // most the bucket's depth plus pct % of T.
        for pct in [1u8, 10, 50, 100] {
            let s = settings(200, pct);
            let mut b = Budget::new(&s, 0);
            let mut t = 0u64;
            let mut spent = 0u64;
            let mut wanted = 0u64;
            let mut seed = 0x9e37_79b9_7f4a_7c15u64;
            for _ in 0..200_000 {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                // An arrival, then an idle stretch polled past the floor in
                // 1 µs passes while the bucket allows, then a sleep.
                let mut ext = 0;
                while ext < s.max_ns && b.allows(t + ext, ext) {
                    ext += US;
                }
                t += ext;
                b.charge(t, ext);
                spent += ext;
                wanted += s.max_ns;
                // Asleep until the next frame, 0..1 ms later.
                t += (seed % 1000) * US;
            }
            let bound = (i64::from(pct) * BUCKET_NS_PER_PCT) as u64 + t * u64::from(pct) / 100;
            assert!(
                spent <= bound + US,
                "pct {pct}: {spent} ns over {t} ns (bound {bound})"
            );
            // And it is not starved: at least half of what the budget or
            // the windows allow goes through.
            let allowed = wanted.min(t * u64::from(pct) / 100);
            assert!(spent * 2 > allowed, "pct {pct}: {spent} of {allowed}");
        }
    }

    #[test]
    fn an_empty_budget_refuses_and_refills_at_its_rate() {
        let s = settings(200, 10);
        let mut b = Budget::new(&s, 0);
        assert_eq!(b.tokens(), 10 * BUCKET_NS_PER_PCT);
        b.charge(0, 10_000_000);
        assert!(!b.allows(0, 0));
        // 10 % of 1 ms later: 100 µs of polling.
        assert!(b.allows(1_000_000, 50 * US));
        assert!(!b.allows(1_000_000, 100 * US));
    }

    proptest::proptest! {
        /// Whatever the gaps: the window is 0 or between twice the
        /// shortest bucket's top and the maximum; nothing is open once the
        /// maximum has passed since the last frame (an idle port lets the
        /// switch sleep); and a port whose gaps all fit well inside the
        /// maximum has a window that covers its typical gap.
        #[test]
        fn windows_are_bounded_and_close(
            gaps in proptest::collection::vec(0u64..100_000_000, 1..400),
            max_us in 21u64..=MAX_WINDOW_US,
        ) {
            let s = settings(max_us, 10);
            let mut w = Window::default();
            let mut t = 0u64;
            w.arrival(t, &s);
            for g in &gaps {
                t += g;
                w.arrival(t, &s);
                let win = w.window_ns();
                proptest::prop_assert!(win <= s.max_ns);
                proptest::prop_assert!(win == 0 || win >= 2 * upper_ns(0));
                proptest::prop_assert!(!w.open(t + s.max_ns));
            }
            let fits = gaps.iter().all(|g| g * 4 < s.max_ns);
            if fits {
                let mut sorted = gaps.clone();
                sorted.sort_unstable();
                let median = sorted[sorted.len() / 2];
                proptest::prop_assert!(w.window_ns() > median, "{} <= {median}", w.window_ns());
            }
        }
    }

    #[test]
    fn the_share_is_per_second() {
        let mut w = Window::default();
        w.polled(250_000_000);
        w.roll(500_000_000);
        assert_eq!(w.share(), 0.0, "the second is not over");
        w.roll(1_000_000_000);
        assert!((w.share() - 0.25).abs() < 1e-9);
        w.slept();
        assert_eq!(w.wasted_ns, 250_000_000);
    }
}
