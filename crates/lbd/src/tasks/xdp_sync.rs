//! The load balancer in the driver (`driver = "xdp"`): a thread that keeps
//! the XDP program's maps equal to the running tables ([`lb::xdp`]) and
//! publishes what the driver forwarded beside the packet threads'
//! counters. The only place the daemon names the driver's maps.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use lb::counters::Counters;

/// The XDP program's maps, as the ports hand them over.
pub(crate) use lb::xdp::XdpLb;

/// How often the `xdp` thread looks for a new tables snapshot.
const XDP_SYNC_MS: u64 = 5;

/// Keeps the driver's maps equal to the running tables (a new snapshot is
/// written within [`XDP_SYNC_MS`]; until then the driver forwards by the
/// previous one, as a packet thread does until its next batch) and
/// publishes what it forwarded every [`lb::datapath::LIVE_INTERVAL_MS`].
/// Returns its last counters when `stop` is set.
pub(crate) fn run(
    lb: XdpLb,
    ct: &lb::config::Conntrack,
    tables: &arc_swap::ArcSwap<lb::tables::Tables>,
    live: &Mutex<Counters>,
    stop: &AtomicBool,
) -> Counters {
    let mut maps = lb::xdp::XdpTables::new(lb, ct);
    let mut generation = None;
    let mut state: Option<(bool, Option<String>)> = None;
    let mut published: Option<Instant> = None;
    loop {
        let t = tables.load();
        if generation != Some(t.generation) {
            generation = Some(t.generation);
            match maps.sync(&t) {
                Ok(s) => {
                    let now = (s.enabled, s.reason.clone());
                    if state.as_ref() != Some(&now) {
                        match &s.reason {
                            None => tracing::info!(
                                "XDP: {} VIPs forwarded in the driver, {} in user space; {} tables written",
                                s.vips,
                                s.vips_in_user_space,
                                s.tables_written
                            ),
                            Some(why) => tracing::warn!(
                                "XDP: the driver forwards nothing, every frame goes to the packet threads: {why}"
                            ),
                        }
                        state = Some(now);
                    }
                }
                Err(e) => tracing::warn!("XDP: writing the tables into the driver: {e}"),
            }
        }
        let done = stop.load(Ordering::Acquire);
        if done
            || published.is_none_or(|p| {
                p.elapsed() >= Duration::from_millis(lb::datapath::LIVE_INTERVAL_MS)
            })
        {
            match maps.counters() {
                Ok(c) => *live.lock().unwrap_or_else(|p| p.into_inner()) = c,
                Err(e) => tracing::warn!("XDP: reading the driver's counters: {e}"),
            }
            published = Some(Instant::now());
        }
        if done {
            return live.lock().unwrap_or_else(|p| p.into_inner()).clone();
        }
        std::thread::sleep(Duration::from_millis(XDP_SYNC_MS));
    }
}
