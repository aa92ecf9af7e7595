//! The follower of the fleet's configuration in etcd (`lb run
//! --config-etcd`; what it records is [`crate::source`]'s).
//!
//! It reads the prefix once ([`fleetconf::Store::list`]) and keeps that
//! copy current with the watch's events ([`fleetconf::Mirror`]), so a push
//! costs it the bytes that changed; at each change it applies the prefix
//! as it is at that revision through the reload's path ([`crate::reload::reload_from_text`]):
//! validated whole, swapped in one step, or refused whole with the
//! running tables serving on, the revision and the error recorded for
//! `/status`. It runs on the control plane's runtime: forwarding and BGP
//! never wait for it. When etcd does not answer, it reconnects with a
//! backoff bounded by [`MAX_BACKOFF`] and reads the current revision first
//! (which also covers a compacted watch); while the watch is quiet it asks
//! etcd every [`PING_EVERY`], so that `/status` says how old its view is.
//! A hold naming another load balancer makes it wait, and say so; so does
//! a push staged in several transactions, until its last one.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::source::{Decision, EtcdSource};
use crate::state::Shared;

/// The first wait before reconnecting to etcd; doubled per failure.
pub const MIN_BACKOFF: Duration = Duration::from_millis(100);
/// The longest wait before reconnecting to etcd.
pub const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// How often a quiet watch is backed by a small read.
pub const PING_EVERY: Duration = Duration::from_secs(1);

/// Follows the prefix until `stop` (nothing to do for a file).
pub async fn follow(shared: Arc<Shared>, stop: Arc<AtomicBool>) {
    let Some(src) = shared.etcd.clone() else {
        return;
    };
    let mut backoff = MIN_BACKOFF;
    while !stop.load(Ordering::Relaxed) {
        match follow_once(&shared, &src, &stop, &mut backoff).await {
            Ok(()) => return,
            Err(e) => {
                tracing::warn!(
                    prefix = %src.prefix(),
                    "etcd: {e}; the running configuration stays, trying again in at most {backoff:?}"
                );
                src.failed(e.to_string());
            }
        }
        let until = Instant::now() + jittered(backoff, rand::random::<f64>());
        while Instant::now() < until && !stop.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// The wait before reconnecting: between half of `backoff` and all of it,
/// at `unit` (in [0, 1)) of the way. A whole fleet that lost etcd at
/// once (a leader lost, a network event) would otherwise reconnect, and
/// read the whole prefix, in the same instant at every step.
pub fn jittered(backoff: Duration, unit: f64) -> Duration {
    let half = backoff / 2;
    half + half.mul_f64(unit.clamp(0.0, 1.0))
}

/// One connection: catch up with the current revision, then watch from
/// it. Returns `Ok` only at `stop`.
async fn follow_once(
    shared: &Arc<Shared>,
    src: &Arc<EtcdSource>,
    stop: &AtomicBool,
    backoff: &mut Duration,
) -> Result<(), fleetconf::StoreError> {
    let store = fleetconf::Store::connect_with(src.access()).await?;
    let mut mirror = store.list(src.prefix(), None).await?;
    src.answered();
    *backoff = MIN_BACKOFF;
    settle(shared, src, &mirror).await;
    let mut watch = store.watch(src.prefix(), mirror.revision()).await?;
    let mut ping = tokio::time::interval(PING_EVERY);
    let mut check_stop = tokio::time::interval(Duration::from_millis(100));
    loop {
        tokio::select! {
            r = watch.next() => {
                let change = r?;
                src.answered();
                mirror.apply(&change);
                settle(shared, src, &mirror).await;
            }
            _ = ping.tick() => {
                store.ping(src.prefix()).await?;
                src.answered();
            }
            _ = check_stop.tick() => {
                if stop.load(Ordering::Relaxed) {
                    return Ok(());
                }
            }
        }
    }
}

/// [`consider`]s the mirror as it is now, on a blocking thread: joining,
/// validating and building a large fleet's tables takes long enough to
/// starve the control plane's other tasks (the API, health checks, the
/// fleet peers' probes) if it ran on their runtime.
async fn settle(shared: &Arc<Shared>, src: &Arc<EtcdSource>, mirror: &fleetconf::Mirror) {
    let (shared, src, mirror) = (Arc::clone(shared), Arc::clone(src), mirror.clone());
    let done = tokio::task::spawn_blocking(move || {
        consider(&shared, &src, mirror.revision(), mirror.snapshot())
    })
    .await;
    if let Err(e) = done {
        tracing::error!("etcd: applying a revision failed: {e}");
    }
}

/// Applies the prefix as it is at `revision` unless held for another load
/// balancer, part-way through a staged push, already running, or already
/// refused; records what happened. Keys that do not make a configuration
/// are that revision's refusal, not a reason to read again.
fn consider(
    shared: &Shared,
    src: &EtcdSource,
    revision: i64,
    snap: Result<fleetconf::Snapshot, fleetconf::StoreError>,
) {
    let snap = match snap {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(
                revision,
                "etcd: revision {revision} refused, the running configuration stays: {e}"
            );
            src.unreadable(revision, e.to_string());
            return;
        }
    };
    let hash = match src.decide(&snap) {
        Decision::Apply(hash) => hash,
        Decision::Held(by) => {
            tracing::info!(
                revision = snap.revision,
                "etcd: held for {by}; this load balancer waits for the release"
            );
            return;
        }
        Decision::Pending(by) => {
            tracing::info!(
                revision = snap.revision,
                "etcd: a push by {by} is being staged; this load balancer waits for its last transaction"
            );
            return;
        }
        Decision::Running | Decision::Refused => return,
    };
    let label = crate::source::label(src.prefix(), snap.revision);
    let result = fleetconf::merge(src.local_text(), &snap.text)
        .map_err(|e| e.to_string())
        .and_then(|text| {
            crate::reload::reload_from_text(shared, text, &label).map_err(|e| e.to_string())
        });
    match result {
        Ok(r) => {
            tracing::info!(
                revision = snap.revision,
                pushed = snap.guard_revision,
                generation = r.generation,
                "etcd: configuration applied"
            );
            src.applied(&snap, hash);
        }
        Err(e) => {
            tracing::error!(
                revision = snap.revision,
                "etcd: revision {} refused, the running configuration stays: {e}",
                snap.revision
            );
            src.refused(&snap, hash, e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconnections_are_spread_over_half_the_backoff() {
        let b = Duration::from_secs(2);
        assert_eq!(jittered(b, 0.0), Duration::from_secs(1));
        assert_eq!(jittered(b, 1.0), b);
        assert_eq!(jittered(b, 7.0), b, "bounded whatever the draw");
        // A thousand load balancers' draws spread over the second.
        let waits: Vec<Duration> = (0..1000).map(|_| jittered(b, rand::random())).collect();
        let early = waits
            .iter()
            .filter(|w| **w < Duration::from_millis(1500))
            .count();
        assert!(
            (350..650).contains(&early),
            "{early} of 1000 in the first half"
        );
    }
}
