//! The BGP controller's thread: one step of the [`Announcer`] per poll
//! while the datapath's heartbeat advances, a withdrawal when it stalls,
//! when `[bgp]` goes away, and on the way out. What a step does is
//! [`crate::announce`]'s; BIRD is asked through [`crate::bird`].

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use lb::config::Bgp;

use crate::announce::{unannounced, Announcer};
use crate::bird::Birdc;
use crate::state::Shared;

/// Announces the VIPs while the datapath's heartbeat advances; withdraws
/// them when it stalls, when `[bgp]` goes away, and on the way out. Every
/// poll reads BIRD and puts it back where it differs.
pub fn controller(shared: &Shared, heartbeat: &AtomicU64, stop: &AtomicBool) {
    // Without [bgp] at start nothing is announced, and adding it later
    // needs a restart (Config::restart_keys): no thread stays for it.
    if shared.control().config().bgp.is_none() {
        return;
    }
    let mut ann = Announcer::default();
    let mut last_beat = 0u64;
    let mut stale = 0u32;
    let mut last_conf: Option<Bgp> = None;
    let mut warned = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let cfg = shared.control().config().clone();
        let Some(b) = cfg.bgp.clone() else {
            if let Some(old) = last_conf.take() {
                ann.withdraw(&Birdc(&old.birdc));
            }
            shared.bgp.set(None, None);
            std::thread::sleep(Duration::from_millis(500));
            continue;
        };
        let unannounced = unannounced(&cfg);
        if unannounced != warned {
            for w in &unannounced {
                tracing::warn!("BGP: {w}");
            }
            warned = unannounced;
        }
        // Withdraw only after three polls without progress: one quiet
        // poll is a scheduling hiccup, not a dead forwarder.
        let beat = heartbeat.load(Ordering::Relaxed);
        stale = if beat == last_beat { stale + 1 } else { 0 };
        let alive = beat != 0 && stale < 3;
        last_beat = beat;
        // Announce only VIPs that can be served: a VIP whose backends are
        // all down would attract traffic only to drop it.
        let tables = shared.control().tables().load_full();
        let (plan, reading) = ann.step(&Birdc(&b.birdc), &b, &cfg, alive, &|i| {
            tables.vips.get(i).is_some_and(|v| !v.slots.is_empty())
        });
        shared.bgp.set(Some(plan), Some(reading));
        last_conf = Some(b.clone());
        // Sleep in small steps so a stop is acted on quickly.
        let until = Instant::now() + Duration::from_millis(b.poll_ms);
        while Instant::now() < until && !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    if let Some(b) = last_conf {
        ann.withdraw(&Birdc(&b.birdc));
        if let Some(mut plan) = shared.bgp.plan() {
            plan.forwarding = false;
            plan.announced = false;
            shared.bgp.set(Some(plan), None);
        }
    }
}
