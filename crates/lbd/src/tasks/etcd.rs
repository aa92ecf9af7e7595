//! The follower of the fleet's configuration in etcd (`lb run
//! --config-etcd`; what it records is [`crate::source`]'s).
//!
//! It watches the prefix from the revision applied; on each change it
//! reads the whole prefix again at the change's revision and applies it
//! through the reload's path ([`crate::reload::reload_from_text`]):
//! validated whole, swapped in one step, or refused whole with the
//! running tables serving on, the revision and the error recorded for
//! `/status`. It runs on the control plane's runtime: forwarding and BGP
//! never wait for it. When etcd does not answer, it reconnects with a
//! backoff bounded by [`MAX_BACKOFF`] and reads the current revision first
//! (which also covers a compacted watch); while the watch is quiet it asks
//! etcd every [`PING_EVERY`], so that `/status` says how old its view is.
//! A hold naming another load balancer makes it wait, and say so.

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
                    "etcd: {e}; the running configuration stays, trying again in {backoff:?}"
                );
                src.failed(e.to_string());
            }
        }
        let until = Instant::now() + backoff;
        while Instant::now() < until && !stop.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// One connection: catch up with the current revision, then watch from
/// it. Returns `Ok` only at `stop`.
async fn follow_once(
    shared: &Shared,
    src: &EtcdSource,
    stop: &AtomicBool,
    backoff: &mut Duration,
) -> Result<(), fleetconf::StoreError> {
    let store = fleetconf::Store::connect(src.endpoints(), src.deadline()).await?;
    let snap = store.snapshot(src.prefix(), None).await?;
    src.answered();
    *backoff = MIN_BACKOFF;
    let from = snap.revision;
    consider(shared, src, snap);
    let mut watch = store.watch(src.prefix(), from).await?;
    let mut ping = tokio::time::interval(PING_EVERY);
    let mut check_stop = tokio::time::interval(Duration::from_millis(100));
    loop {
        tokio::select! {
            r = watch.next() => {
                let rev = r?;
                src.answered();
                let snap = store.snapshot(src.prefix(), Some(rev)).await?;
                consider(shared, src, snap);
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

/// Applies `snap` unless held for another load balancer, already running,
/// or already refused; records what happened.
fn consider(shared: &Shared, src: &EtcdSource, snap: fleetconf::Snapshot) {
    let hash = match src.decide(&snap) {
        Decision::Apply(hash) => hash,
        Decision::Held(by) => {
            tracing::info!(
                revision = snap.revision,
                "etcd: held for {by}; this load balancer waits for the release"
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
