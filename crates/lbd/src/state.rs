//! What the control plane shares between the lifecycle, its tasks and the
//! HTTP API: [`Shared`], in parts by concern (the configuration file and
//! what was applied from it, the changes made to it, health checks, what
//! the datapath publishes, BGP and the next hop). The tables and the
//! configuration they were built from ([`Control`]) sit apart, behind one
//! lock, because every part reads them.
//!
//! What is done with the state lives beside what does it: reloads and
//! runtime changes in [`crate::reload`], the `/status` document in
//! [`crate::status`], `/metrics` in [`crate::metrics`].

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use lb::config::ParseCache;
use lb::counters::Counters;
use lb::tables::Control;
use lb::Config;

use crate::gateway::Gateway;
use crate::health::{CheckKey, Tracker};
use crate::tunnel::{self, Tunnel, TunnelError};

/// What the control plane shares with its tasks.
pub struct Shared {
    /// The tables and the configuration they were built from (health, peer
    /// and gateway state included).
    pub(crate) control: Mutex<Control>,
    /// The configuration file, and what was applied from it.
    pub(crate) file: ConfigFile,
    /// Reloads and runtime changes: how many were applied and refused.
    pub(crate) changes: ChangeCounts,
    /// Health checks: verdicts, the backends each decides for, the tunnel.
    pub(crate) health: HealthState,
    /// What the datapath runs with and publishes.
    pub(crate) datapath: DatapathState,
    /// BGP: what the controller wants of BIRD, and BIRD's last reading.
    pub(crate) bgp: crate::announce::BgpState,
    /// The next hop's MAC: resolved, configured or unresolved.
    pub(crate) gateway: Gateway,
    /// The API's bearer token (`[api] token_file`) and whether reads need
    /// it too.
    pub(crate) api: crate::access::Access,
    /// The API's open connections and their cap.
    pub(crate) api_connections: Arc<crate::access::Connections>,
    /// How the open files are shared out: the API's cap follows the
    /// configuration's health checks.
    pub(crate) budget: Mutex<crate::limits::Budget>,
    /// When the daemon started.
    pub(crate) started: Instant,
    /// The graceful stop, once begun.
    pub(crate) stopping: StopState,
    /// The fleet's configuration in etcd, when it comes from there
    /// (`lb run --config-etcd`); `None`: the file.
    pub(crate) etcd: Option<Arc<crate::source::EtcdSource>>,
}

/// How far a graceful stop has come, for `/status` (the API answers until
/// the datapath stops).
#[derive(Debug, Default)]
pub(crate) struct StopState(Mutex<Option<Stopping>>);

/// A graceful stop under way.
#[derive(Debug, Clone)]
pub(crate) struct Stopping {
    /// When the stop was seen.
    pub(crate) since: Instant,
    /// `[bgp] drain_ms` at the stop (0 without `[bgp]`).
    pub(crate) drain_ms: u64,
    /// Whether the withdrawal is done (succeeded or given up).
    pub(crate) withdrawn: bool,
    /// What the withdrawal could not do, in words.
    pub(crate) could_not: Option<String>,
}

impl StopState {
    /// The stop has begun (the first call counts).
    pub(crate) fn begin(&self, drain_ms: u64) {
        let mut s = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if s.is_none() {
            *s = Some(Stopping {
                since: Instant::now(),
                drain_ms,
                withdrawn: false,
                could_not: None,
            });
        }
    }

    /// The withdrawal is over; `could_not` says what it could not do.
    pub(crate) fn withdrawn(&self, could_not: Option<String>) {
        if let Some(s) = self.0.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
            s.withdrawn = true;
            s.could_not = could_not;
        }
    }

    /// The withdrawal is over, whatever it said (none is made without
    /// `[bgp]`).
    pub(crate) fn withdrawn_if_not_said(&self) {
        if let Some(s) = self.0.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
            s.withdrawn = true;
        }
    }

    /// The stop, if it has begun.
    pub(crate) fn get(&self) -> Option<Stopping> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Shared {
    /// The control plane (tables, configuration, health and peer state).
    pub(crate) fn control(&self) -> MutexGuard<'_, Control> {
        self.control.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The configuration file and what was applied from it.
pub(crate) struct ConfigFile {
    /// Where it is.
    pub(crate) path: PathBuf,
    /// The configuration the daemon started with (before command-line
    /// overrides): `[forwarder]`, `[conntrack]` and `[api]` keep its values
    /// until the next start.
    pub(crate) boot: Config,
    /// The file's text as last applied (at start, by a reload or a runtime
    /// change): a runtime change refuses to overwrite a file that differs
    /// from it. Its lock also keeps reloads and runtime changes one at a
    /// time, and it holds the parsed pieces of that text
    /// ([`lb::config::ParseCache`]): a reload parses only the elements that
    /// changed.
    pub(crate) applied: Mutex<Applied>,
    /// The configuration generation users see: 1 at start, +1 for every
    /// configuration applied (reload or runtime change). The tables' own
    /// generation also rises on health, peer and gateway changes.
    pub(crate) generation: AtomicU64,
    /// The interface's own MAC, the outer source when `[encap] mac` is not
    /// set (also after a reload that leaves it out).
    pub(crate) interface_mac: Option<String>,
}

/// The configuration file's text as last applied, and its parsed pieces.
#[derive(Debug)]
pub(crate) struct Applied {
    /// The text.
    pub(crate) text: String,
    /// Its parsed pieces.
    pub(crate) cache: ParseCache,
}

/// Reloads and runtime changes (drain, undrain, weight), applied and
/// refused.
#[derive(Debug, Default)]
pub(crate) struct ChangeCounts {
    /// Reloads applied.
    pub(crate) reloads: AtomicU64,
    /// Reloads rejected.
    pub(crate) reload_failures: AtomicU64,
    /// Why the last reload was rejected, if it was.
    pub(crate) last_reload_error: Mutex<Option<String>>,
    /// Runtime changes applied.
    pub(crate) runtime_changes: AtomicU64,
    /// Runtime changes refused.
    pub(crate) runtime_change_failures: AtomicU64,
}

/// The health checks' state.
pub(crate) struct HealthState {
    /// Each check's verdict so far.
    pub(crate) trackers: Mutex<HashMap<CheckKey, Tracker>>,
    /// Backend names each check decides for (refreshed on reload).
    pub(crate) check_names: Mutex<HashMap<CheckKey, Vec<String>>>,
    /// Backend health changes applied to the tables.
    pub(crate) changes: AtomicU64,
    /// Health checks whose prober ran late (not counted toward fall/rise).
    pub(crate) inconclusive: AtomicU64,
    /// The tunnel of health checks that go through GRE (made when the
    /// configuration first asks for one).
    pub(crate) tunnel: Mutex<Option<Tunnel>>,
}

impl HealthState {
    /// The state of no check run yet, for the checks `check_names` lists.
    pub(crate) fn new(check_names: HashMap<CheckKey, Vec<String>>) -> HealthState {
        HealthState {
            trackers: Mutex::new(HashMap::new()),
            check_names: Mutex::new(check_names),
            changes: AtomicU64::new(0),
            inconclusive: AtomicU64::new(0),
            tunnel: Mutex::new(None),
        }
    }

    /// Makes the health-check tunnel if `checks` need it and it is not there.
    pub(crate) fn ensure_tunnel(
        &self,
        checks: &HashMap<CheckKey, Vec<String>>,
    ) -> Result<(), TunnelError> {
        let mut t = self.tunnel.lock().unwrap_or_else(|p| p.into_inner());
        let v6 = checks.keys().any(|k| k.vip.is_some_and(|v| v.is_ipv6()));
        let any = checks.keys().any(|k| k.vip.is_some());
        let has_v6 = t.as_ref().is_some_and(Tunnel::ipv6);
        if any && (t.is_none() || (v6 && !has_v6)) {
            // Made again when IPv6 VIPs first need it.
            *t = None;
            *t = Some(Tunnel::start(v6)?);
            tracing::info!(
                "health checks through GRE: device {}, mark {:#x}",
                tunnel::DEVICE,
                tunnel::MARK
            );
        }
        Ok(())
    }

    /// The tunnel's routes, if there is a tunnel.
    pub(crate) fn tunnel_routes(&self) -> Option<tunnel::Routes> {
        self.tunnel
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(Tunnel::routes)
    }
}

/// What the datapath runs with and publishes.
pub(crate) struct DatapathState {
    /// Each packet thread's counters, as last published.
    pub(crate) live: Arc<Mutex<Vec<Counters>>>,
    /// With the load balancer in the driver: what it forwarded (published
    /// by the `xdp` thread, added to the packet threads' counters).
    pub(crate) xdp_live: Option<Arc<Mutex<Counters>>>,
    /// With AF_XDP: the XDP program's VIP set, updated on reload.
    pub(crate) xdp_vips: Option<netio::afxdp::VipFilter>,
    /// Which packet I/O driver is in use, in words.
    pub(crate) driver: String,
    /// The forwarder's packet pool, for its occupancy in `/status`.
    pub(crate) pool: maio::Pool,
    /// The packet-tracer's queue and counters (`[tracer] enabled`).
    pub(crate) tracer: Option<Arc<lb::tracer::Tracer>>,
}

impl DatapathState {
    /// Every counter summed.
    pub(crate) fn counters(&self) -> Counters {
        self.counters_and_driver().0
    }

    /// Every counter summed, and what the load balancer in the driver
    /// forwarded (when it runs), from one reading of its counters.
    pub(crate) fn counters_and_driver(&self) -> (Counters, Option<u64>) {
        let mut sum = Counters::new();
        for c in self.live.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            sum.merge(c);
        }
        let in_driver = self.xdp_live.as_ref().map(|x| {
            let x = x.lock().unwrap_or_else(|p| p.into_inner());
            sum.merge(&x);
            x.tx
        });
        (sum, in_driver)
    }
}
