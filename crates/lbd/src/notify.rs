//! The daemon's side of systemd's service protocol (sd_notify(3)), which
//! the shipped unit (`dist/systemd/fastpath-lb@.service`, `Type=notify`,
//! `WatchdogSec=`) relies on to take a load balancer that has died, hung or
//! whose datapath has stopped out of the router's ECMP set:
//!
//! - `READY=1` once the datapath has beaten for the first time (the API's
//!   listener is bound before the datapath starts), so that units ordered
//!   after this one, and `systemctl start`, wait for a forwarder that
//!   forwards;
//! - `WATCHDOG=1` every quarter `WatchdogSec`, but only while the datapath's
//!   heartbeat ([`lb::datapath::Datapath::heartbeat`]) advances: a control
//!   thread that is alive beside a stuck datapath must not keep the
//!   watchdog fed, or the routes would outlive forwarding;
//! - `STOPPING=1` when a stop is asked for (SIGTERM: the daemon withdraws
//!   and drains by itself, which systemd then times with `TimeoutStopSec`).
//!
//! Outside systemd (`NOTIFY_SOCKET` unset) nothing is started.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sd_notify::NotifyState;

/// How often the notifier looks at the heartbeat and the stop flag: short
/// beside any useful `WatchdogSec` (the unit's is 400 ms), and a stop is
/// announced this soon after the signal.
const TICK: Duration = Duration::from_millis(10);

/// Why a notification did not reach systemd.
#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    /// Sending the datagram to `NOTIFY_SOCKET` failed.
    #[error("telling systemd {state}: {source}")]
    Send {
        /// The notification, as sent (`READY=1`, ...).
        state: String,
        /// The system's answer.
        #[source]
        source: std::io::Error,
    },
}

/// Starts the notifier thread when the daemon runs under systemd, to end
/// when `stop` is set (the daemon sets it on every way out). Outside
/// systemd it does nothing. A notifier that cannot be started is logged:
/// systemd then times the start out and restarts the service.
pub fn spawn(heartbeat: &Arc<AtomicU64>, stop: &Arc<AtomicBool>) {
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        return;
    }
    let watchdog = sd_notify::watchdog_enabled();
    let (heartbeat, stop) = (Arc::clone(heartbeat), Arc::clone(stop));
    let started = std::thread::Builder::new()
        .name("notify".into())
        .spawn(move || {
            supervise(&heartbeat, &stop, watchdog, &mut |states| {
                if let Err(source) = sd_notify::notify(states) {
                    let e = NotifyError::Send {
                        state: states
                            .iter()
                            .map(ToString::to_string)
                            .collect::<Vec<_>>()
                            .join(" "),
                        source,
                    };
                    tracing::error!("{e}");
                }
            })
        });
    if let Err(e) = started {
        tracing::error!("starting the systemd notification thread: {e}");
    }
}

/// The notifier's loop, with the sending apart so that it can be watched:
/// waits for the first heartbeat, sends `READY=1`, then `WATCHDOG=1` every
/// quarter `watchdog` in which the heartbeat advanced, and `STOPPING=1` once
/// `stop` is set, which ends it.
pub(crate) fn supervise(
    heartbeat: &AtomicU64,
    stop: &AtomicBool,
    watchdog: Option<Duration>,
    send: &mut dyn FnMut(&[NotifyState]),
) {
    let stopping = |send: &mut dyn FnMut(&[NotifyState])| {
        send(&[
            NotifyState::Stopping,
            NotifyState::Status("stopping: VIPs withdrawn, draining"),
        ]);
    };
    // The heartbeat starts at 0 and is first stored by the running loop.
    while heartbeat.load(Ordering::Relaxed) == 0 {
        if stop.load(Ordering::Acquire) {
            return stopping(send);
        }
        std::thread::sleep(TICK);
    }
    send(&[NotifyState::Ready, NotifyState::Status("forwarding")]);
    // sd_watchdog_enabled(3) asks for a ping at least every half timeout,
    // so that one late ping is not yet a missed one; pinging every quarter
    // also bounds how long a heartbeat that stopped just after a ping is
    // still vouched for (a stuck queue is out a quarter timeout sooner).
    let period = watchdog.map(|w| (w / 4).max(Duration::from_millis(1)));
    let mut last = heartbeat.load(Ordering::Relaxed);
    let mut next = period.map(|p| Instant::now() + p);
    let mut stalled = false;
    loop {
        if stop.load(Ordering::Acquire) {
            return stopping(send);
        }
        if let (Some(p), Some(at)) = (period, next) {
            let now = Instant::now();
            if now >= at {
                next = Some(now + p);
                let beat = heartbeat.load(Ordering::Relaxed);
                if beat != last {
                    last = beat;
                    send(&[NotifyState::Watchdog]);
                    if stalled {
                        tracing::info!("the datapath beats again: feeding systemd's watchdog");
                        stalled = false;
                    }
                } else if !stalled {
                    tracing::warn!(
                        period_ms = p.as_millis() as u64,
                        "the datapath's heartbeat has stopped: no longer feeding systemd's \
                         watchdog, which stops the service (and withdraws its routes)"
                    );
                    stalled = true;
                }
            }
        }
        std::thread::sleep(period.map_or(TICK, |p| p.min(TICK)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Polls `cond` for up to 5 s (a loaded machine schedules late).
    fn eventually(cond: impl Fn() -> bool) -> bool {
        let until = Instant::now() + Duration::from_secs(5);
        while Instant::now() < until {
            if cond() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        false
    }

    #[test]
    fn ready_after_the_first_beat_watchdog_only_while_it_beats_stopping_on_stop() {
        let heartbeat = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(Mutex::new(Vec::<String>::new()));
        let t = {
            let (heartbeat, stop, sent) =
                (Arc::clone(&heartbeat), Arc::clone(&stop), Arc::clone(&sent));
            std::thread::spawn(move || {
                supervise(
                    &heartbeat,
                    &stop,
                    Some(Duration::from_millis(40)),
                    &mut |states| {
                        let mut s = sent.lock().unwrap();
                        s.extend(states.iter().map(ToString::to_string));
                    },
                )
            })
        };
        let count = |what: &str| sent.lock().unwrap().iter().filter(|s| *s == what).count();
        // No datapath yet: nothing is said.
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            sent.lock().unwrap().is_empty(),
            "{:?}",
            sent.lock().unwrap()
        );
        heartbeat.store(256, Ordering::Relaxed);
        assert!(eventually(|| count("READY=1") == 1));
        // Beating: the watchdog is fed.
        let beating = Instant::now();
        while beating.elapsed() < Duration::from_millis(300) {
            heartbeat.fetch_add(256, Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(count("WATCHDOG=1") >= 1, "{:?}", sent.lock().unwrap());
        // Stalled: after the check that still saw the last beats, no more
        // pings however long it lasts.
        std::thread::sleep(Duration::from_millis(100));
        let fed = count("WATCHDOG=1");
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(count("WATCHDOG=1"), fed, "{:?}", sent.lock().unwrap());
        // Beating again: fed again.
        let beating = Instant::now();
        while beating.elapsed() < Duration::from_millis(200) {
            heartbeat.fetch_add(256, Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(count("WATCHDOG=1") > fed);
        stop.store(true, Ordering::Release);
        t.join().unwrap();
        assert_eq!(
            sent.lock().unwrap().last().map(String::as_str),
            Some("STATUS=stopping: VIPs withdrawn, draining")
        );
        assert_eq!(count("STOPPING=1"), 1);
        assert_eq!(count("READY=1"), 1);
    }

    #[test]
    fn a_stop_before_the_first_beat_says_stopping_and_never_ready() {
        let (heartbeat, stop) = (AtomicU64::new(0), AtomicBool::new(true));
        let mut sent = Vec::new();
        supervise(&heartbeat, &stop, None, &mut |states| {
            sent.extend(states.iter().map(ToString::to_string))
        });
        assert_eq!(sent[0], "STOPPING=1");
        assert!(!sent.iter().any(|s| s == "READY=1"));
    }
}
