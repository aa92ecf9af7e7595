//! The health checks' tasks: one per distinct check ([`crate::health`]
//! says what a check is and how its verdict is reached), started and
//! stopped as reloads change the list, each publishing its verdict to the
//! tables for every backend it decides for.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::health::{self, CheckKey};
use crate::state::Shared;

/// Runs one check every interval and publishes each change of verdict to
/// the tables, for every backend the check decides for.
async fn check_task(shared: Arc<Shared>, key: CheckKey) {
    let mut tick = tokio::time::interval(Duration::from_millis(key.conf.interval_ms));
    loop {
        tick.tick().await;
        let routes = shared.health.tunnel_routes();
        let outcome = health::check(&key, routes.as_ref()).await;
        if outcome == health::Outcome::Inconclusive {
            shared.health.inconclusive.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(check = %key, "check inconclusive: the prober ran late");
        }
        let change = {
            let mut h = shared
                .health
                .trackers
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            h.entry(key.clone())
                .or_default()
                .record_outcome(outcome, key.conf.rise, key.conf.fall)
        };
        if let Some(healthy) = change {
            let names = shared
                .health
                .check_names
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&key)
                .cloned()
                .unwrap_or_default();
            let mut c = shared.control.lock().unwrap_or_else(|p| p.into_inner());
            for n in &names {
                if c.set_health(n, healthy) {
                    shared.health.changes.fetch_add(1, Ordering::Relaxed);
                }
            }
            tracing::warn!(check = %key, healthy, backends = ?names, "backend health changed; tables rebuilt");
        }
    }
}

/// Keeps one task per distinct check, starting new ones and stopping
/// removed ones after a reload.
pub async fn manager(shared: Arc<Shared>, stop: Arc<AtomicBool>) {
    let mut tasks: HashMap<CheckKey, tokio::task::JoinHandle<()>> = HashMap::new();
    while !stop.load(Ordering::Relaxed) {
        let wanted: Vec<CheckKey> = shared
            .health
            .check_names
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .cloned()
            .collect();
        tasks.retain(|k, t| {
            let keep = wanted.contains(k);
            if !keep {
                t.abort();
            }
            keep
        });
        for k in wanted {
            tasks
                .entry(k.clone())
                .or_insert_with(|| tokio::spawn(check_task(Arc::clone(&shared), k)));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for t in tasks.values() {
        t.abort();
    }
}
