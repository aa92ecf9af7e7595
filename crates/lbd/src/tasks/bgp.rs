//! The BGP controller's thread: one step of the [`Announcer`] per poll
//! while the datapath's heartbeat advances, a withdrawal when it stalls,
//! when `[bgp]` goes away, and on the way out. What a step does is
//! [`crate::announce`]'s; BIRD is asked through [`crate::bird`].
//!
//! This thread is the only one that waits for BIRD: every step publishes
//! its plan and its reading of BIRD (taken at every poll and again right
//! after it changed something), which `/status` and `/metrics` show with
//! their age. A stop gives up the step under way at once (its birdc is
//! killed) and withdraws within [`withdraw_budget`], then says what it
//! could not withdraw.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use lb::config::Bgp;

use crate::announce::{unannounced, Announcer};
use crate::bird::{Birdc, Bounded};
use crate::state::Shared;

/// The least time a stop gives the withdrawal, when `[bgp] drain_ms` is
/// shorter: enough for BIRD to disable two protocols (milliseconds when
/// it answers), short enough that a stop without drain still ends within
/// a second whatever BIRD does.
pub const MIN_WITHDRAW: Duration = Duration::from_millis(500);

/// How long a stop lets the withdrawal take: the drain time, which
/// counts from the signal with the withdrawal in it (the datapath forwards
/// meanwhile), at least [`MIN_WITHDRAW`]. A BIRD that does not answer
/// within it leaves the VIPs to `fastpath lb withdraw` (the unit's
/// `ExecStopPost`) and to the router's hold timer.
pub fn withdraw_budget(b: &Bgp) -> Duration {
    Duration::from_millis(b.drain_ms).max(MIN_WITHDRAW)
}

/// Announces the VIPs while the datapath's heartbeat advances; withdraws
/// them when it stalls, when `[bgp]` goes away, and on the way out. Every
/// poll reads BIRD and puts it back where it differs.
///
/// Returns whether the router may have been sending VIP traffic here when
/// the stop came (BIRD announced some VIP at the last step, or fastpath
/// meant it to): what the graceful stop drains for. It is decided here,
/// before the withdrawal, because the plan published afterwards says
/// "not announced", and a reader that looked after this thread withdrew
/// (the graceful stop polls for the signal too) took that for "never
/// announced" and stopped the datapath before the router had moved the
/// flows.
pub fn controller(shared: &Shared, heartbeat: &AtomicU64, stop: &AtomicBool) -> bool {
    // Without [bgp] at start nothing is announced, and adding it later
    // needs a restart (Config::restart_keys): no thread stays for it.
    if shared.control().config().bgp.is_none() {
        return false;
    }
    let mut ann = Announcer::default();
    let mut last_beat = 0u64;
    let mut stale = 0u32;
    let mut last_conf: Option<Bgp> = None;
    let mut warned = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        // Read before the configuration: the configuration is at least
        // as new as the generation published with the step.
        let generation = shared.file.generation.load(Ordering::Acquire);
        let cfg = shared.control().config().clone();
        let Some(b) = cfg.bgp.clone() else {
            if let Some(old) = last_conf.take() {
                // Logged by the withdrawal; retried at no later poll, as
                // BIRD's protocols are no longer fastpath's to manage.
                let _ = ann.withdraw(&Bounded {
                    birdc: Birdc(&old.birdc),
                    cancel: Some(stop),
                    by: None,
                });
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
        // A stop gives the step up at once (its birdc killed): the stop's
        // own withdrawal follows.
        let bird = Bounded {
            birdc: Birdc(&b.birdc),
            cancel: Some(stop),
            by: None,
        };
        let (mut plan, reading) = ann.step(&bird, &b, &cfg, alive, &|i| {
            tables.vips.get(i).is_some_and(|v| !v.slots.is_empty())
        });
        plan.generation = generation;
        if stop.load(Ordering::Relaxed) {
            // Cut short: what it read is not BIRD's state.
            last_conf = Some(b.clone());
            break;
        }
        shared.bgp.set(Some(plan), Some(reading));
        last_conf = Some(b.clone());
        // Sleep in small steps so a stop is acted on quickly.
        let until = Instant::now() + Duration::from_millis(b.poll_ms);
        while Instant::now() < until && !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let may_have_traffic = shared.bgp.plan().is_some_and(|p| p.announced || p.wanted());
    if let Some(b) = last_conf {
        let budget = withdraw_budget(&b);
        let failed = ann.withdraw(&Bounded {
            birdc: Birdc(&b.birdc),
            cancel: None,
            by: Some(Instant::now() + budget),
        });
        let could_not = (!failed.is_empty()).then(|| {
            let words = failed.join("; ");
            tracing::error!(
                "stopping: could not withdraw within {budget:?}: {words}; the router keeps \
                 these VIPs until `fastpath lb withdraw` (the unit's ExecStopPost) succeeds \
                 or its hold timer expires"
            );
            words
        });
        shared.stopping.withdrawn(could_not);
        if let Some(mut plan) = shared.bgp.plan() {
            plan.forwarding = false;
            plan.announced = false;
            shared.bgp.set(Some(plan), None);
        }
    }
    may_have_traffic
}
