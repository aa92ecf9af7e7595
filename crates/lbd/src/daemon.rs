//! The load balancer daemon: the datapath on a real interface, and beside
//! it a control plane (tokio) that serves the HTTP API, reloads the
//! configuration on SIGHUP or `POST /reload`, and runs the health checks.
//!
//! A reload reads and validates the whole file, builds the new tables aside
//! and swaps them in one step; a bad file is rejected whole, the running
//! configuration keeps serving, and the reason is logged and returned.
//! Settings of `[forwarder]` and `[conntrack]` (threads, queue and table
//! sizes) take effect at the next start; a reload that changes them says so.
//!
//! Runtime changes (`POST /backends/NAME/drain`, `/undrain`,
//! `/weight/N`: `fastpath lb drain|undrain|weight`) are applied the same
//! way, whole or not at all, and written back into the file
//! ([`crate::runtime`]) so that a restart keeps them; a file edited since
//! it was loaded is not overwritten.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use netio::afpacket::{self, AfPacketPort};
use netio::afxdp::AfXdpPort;
use serde::Serialize;

use crate::health::{self, CheckKey, Tracker};
use lb::config::Driver;
use lb::counters::Counters;
use lb::datapath::{Datapath, Params, RunStats};
use lb::tables::Control;
use lb::Config;

/// The VIP addresses the XDP program steers (prefix-group VIPs cannot be
/// listed: their addresses are not known in advance).
fn vip_addresses(cfg: &Config) -> Vec<[u8; 16]> {
    cfg.vips
        .iter()
        .filter_map(|v| v.address)
        .map(packet::flow::from_ip)
        .collect()
}

/// What the control plane shares with its tasks.
pub struct Shared {
    /// The tunnel of health checks that go through GRE (made when the
    /// configuration first asks for one).
    tunnel: Mutex<Option<crate::tunnel::Tunnel>>,
    /// The API's bearer token for mutating requests (`[api] token_file`).
    token: Option<String>,
    /// The configuration file the daemon started with (before command-line
    /// overrides): `[forwarder]`, `[conntrack]` and `[api]` keep its
    /// values until the next start.
    boot: Config,
    control: Mutex<Control>,
    config_path: PathBuf,
    live: Arc<Mutex<Vec<Counters>>>,
    health: Mutex<HashMap<CheckKey, Tracker>>,
    /// Backend names each check decides for (refreshed on reload).
    check_names: Mutex<HashMap<CheckKey, Vec<String>>>,
    reloads: AtomicU64,
    /// The configuration generation users see: 1 at start, +1 for every
    /// configuration applied (reload or runtime change). The tables' own
    /// generation also rises on health, peer and gateway changes.
    config_generation: AtomicU64,
    /// Backend health changes applied to the tables.
    health_changes: AtomicU64,
    /// Runtime changes (drain, undrain, weight) applied and rejected.
    runtime_changes: AtomicU64,
    runtime_change_failures: AtomicU64,
    /// The configuration file's text as last applied (at start, by a
    /// reload or a runtime change): a runtime change refuses to overwrite
    /// a file that differs from it. Its lock also keeps reloads and runtime
    /// changes one at a time, and it holds the parsed pieces of that text
    /// ([`lb::config::ParseCache`]): a reload parses only the elements that
    /// changed.
    applied_text: Mutex<Applied>,
    /// Health checks whose prober ran late (not counted toward fall/rise).
    checks_inconclusive: AtomicU64,
    reload_failures: AtomicU64,
    last_reload_error: Mutex<Option<String>>,
    /// BGP: whether the VIPs are announced, and the last error talking to BIRD.
    bgp: Mutex<Option<(bool, Option<String>)>>,
    /// With AF_XDP: the XDP program's VIP set, updated on reload.
    xdp_vips: Option<netio::afxdp::VipFilter>,
    /// With the load balancer in the driver: what it forwarded (published
    /// by the `xdp` thread, added to the packet threads' counters).
    xdp_live: Option<Arc<Mutex<Counters>>>,
    /// Which packet I/O driver is in use, in words.
    driver: String,
    /// The forwarder's packet pool, for its occupancy in `/status`.
    pool: maio::Pool,
    /// The packet-tracer's queue and counters (`[tracer] enabled`).
    tracer: Option<Arc<lb::trace::Tracer>>,
    /// The next hop's MAC: resolved, configured or unresolved.
    gateway: crate::gateway::Gateway,
    /// The interface's own MAC, the outer source when `[encap] mac` is
    /// not set (also after a reload that leaves it out).
    interface_mac: Option<String>,
    started: Instant,
}

/// Why the daemon stopped or could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration was rejected.
    #[error(transparent)]
    Config(#[from] lb::config::ConfigError),
    /// The datapath failed.
    #[error(transparent)]
    Datapath(#[from] lb::datapath::Error),
    /// The interface could not be opened.
    #[error(transparent)]
    Port(#[from] netio::Error),
    /// AF_XDP was asked for, but prefix-group VIPs cannot be listed in the
    /// XDP program's VIP set.
    #[error("AF_XDP: prefix-group VIPs cannot be listed in the XDP program's VIP set; use driver = \"af-packet\"")]
    PrefixVipsNeedAfPacket,
    /// The HTTP API could not be set up.
    #[error(transparent)]
    Api(#[from] crate::api::ApiSetupError),
    /// Tunnel health checks were asked for and the tunnel cannot be made.
    #[error(transparent)]
    Tunnel(#[from] crate::tunnel::TunnelError),
    /// Another load balancer serves the interface.
    #[error(transparent)]
    Lock(#[from] crate::lock::LockError),
    /// A control-plane thread could not be started.
    #[error("starting the {what} thread: {source}")]
    Spawn {
        /// Which thread.
        what: &'static str,
        /// The system's answer.
        #[source]
        source: std::io::Error,
    },
}

/// Why a reload was refused (the running configuration stays).
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// The new file is invalid.
    #[error(transparent)]
    Config(#[from] lb::config::ConfigError),
    /// The XDP program's VIP set could not be updated.
    #[error("updating the XDP VIP set: {0}")]
    XdpVips(#[source] netio::Error),
    /// Tunnel health checks were asked for and the tunnel cannot be made.
    #[error(transparent)]
    Tunnel(#[from] crate::tunnel::TunnelError),
}

/// Why a runtime change (drain, undrain, weight) was refused; nothing
/// changed.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The backend, or the file's layout (see [`crate::runtime::EditError`]).
    #[error(transparent)]
    Edit(#[from] crate::runtime::EditError),
    /// The file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The configuration file.
        path: PathBuf,
        /// The system's answer.
        #[source]
        source: std::io::Error,
    },
    /// The file on disk is not the configuration that runs.
    #[error(
        "{path} changed on disk since it was loaded; not overwriting that edit: \
         apply it first (`fastpath lb reload` or SIGHUP), or undo it, then try again"
    )]
    FileChanged {
        /// The configuration file.
        path: PathBuf,
    },
    /// The change would make the configuration invalid.
    #[error("the configuration after the change is invalid: {0}")]
    Config(#[from] lb::config::ConfigError),
    /// The change could not be applied.
    #[error(transparent)]
    Apply(#[from] ReloadError),
    /// The file could not be written (nothing was applied).
    #[error(transparent)]
    Write(#[from] crate::runtime::WriteError),
}

impl RuntimeError {
    /// The HTTP status of the API's answer.
    pub fn status(&self) -> StatusCode {
        match self {
            RuntimeError::Edit(crate::runtime::EditError::UnknownBackend(_)) => {
                StatusCode::NOT_FOUND
            }
            RuntimeError::FileChanged { .. } => StatusCode::CONFLICT,
            RuntimeError::Edit(_) | RuntimeError::Config(_) | RuntimeError::Apply(_) => {
                StatusCode::BAD_REQUEST
            }
            RuntimeError::Read { .. } | RuntimeError::Write(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

/// What a runtime change did (the API's answer).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct RuntimeChanged {
    /// The backend as asked for.
    pub backend: String,
    /// The change.
    pub change: crate::runtime::Change,
    /// The pools that list the backend: all changed.
    pub pools: Vec<String>,
    /// False when it already was as asked (nothing written or applied).
    pub changed: bool,
    /// The configuration generation after it.
    pub generation: u64,
    /// The configuration file written.
    pub file: String,
}

/// Why a request to a daemon's API failed (`fastpath lb status`).
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// Nothing answers at the address.
    #[error("cannot reach {api}: {source} (is `lb run --interface` running with [api] listen = \"{api}\"?)")]
    Connect {
        /// The API address.
        api: std::net::SocketAddr,
        /// The system's answer.
        #[source]
        source: std::io::Error,
    },
    /// The exchange broke off.
    #[error("talking to {api}: {source}")]
    Io {
        /// The API address.
        api: std::net::SocketAddr,
        /// The system's answer.
        #[source]
        source: std::io::Error,
    },
    /// The answer was not HTTP.
    #[error("{api} answered something that is not HTTP")]
    Malformed {
        /// The API address.
        api: std::net::SocketAddr,
    },
    /// The connection closed without an answer.
    #[error("{api} closed the connection without answering (is it a fastpath API? is the daemon stopping?)")]
    NoAnswer {
        /// The API address.
        api: std::net::SocketAddr,
    },
    /// The API answered with an error status.
    #[error("{api} answered {status}{}", if .body.is_empty() { String::new() } else { format!(": {}", .body) })]
    Status {
        /// The API address.
        api: std::net::SocketAddr,
        /// The status line's code and reason.
        status: String,
        /// The body, trimmed (an error message, if any).
        body: String,
    },
    /// The API answered with an empty document.
    #[error("{api} answered {path} with an empty body")]
    Empty {
        /// The API address.
        api: std::net::SocketAddr,
        /// The path asked for.
        path: String,
    },
    /// The answer was not the document expected.
    #[error("unexpected {path} document: {source}")]
    Document {
        /// The path asked for.
        path: &'static str,
        /// What did not parse.
        #[source]
        source: serde_json::Error,
    },
}

/// The configuration file's text as last applied, and its parsed pieces.
#[derive(Debug)]
struct Applied {
    text: String,
    cache: lb::config::ParseCache,
}

/// What a reload applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Reloaded {
    /// The configuration generation after it (`/status` `generation`).
    pub generation: u64,
    /// Keys that changed but take effect only at the next start (the
    /// running load balancer keeps the values it started with), as
    /// `section.key`; empty when everything was applied.
    pub not_applied: Vec<String>,
    /// Microseconds from reading the file to the new tables swapped in
    /// (0 for a runtime change, which reports its own).
    pub took_us: u64,
    /// What the parse did: the file's elements and how many were parsed
    /// again (the others were unchanged since the last load).
    pub parsed: lb::config::ChunkStats,
}

impl Shared {
    /// Re-reads the configuration file and swaps it in, or explains why not.
    /// Keys that cannot change while running are reported, not applied.
    pub fn reload(&self) -> Result<Reloaded, ReloadError> {
        let mut applied = self.applied_text.lock().unwrap_or_else(|p| p.into_inner());
        let applied = &mut *applied;
        let started = std::time::Instant::now();
        let file = self.config_path.display().to_string();
        let result = Config::read(&self.config_path)
            .and_then(|text| {
                Config::parse_with(&text, &file, &mut applied.cache).map(|c| (c, text))
            })
            .map_err(ReloadError::from)
            .and_then(|(cfg, text)| {
                let mut r = self.apply_config(cfg)?;
                applied.text = text;
                r.took_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
                r.parsed = applied.cache.last();
                Ok(r)
            });
        match &result {
            Ok(r) => {
                self.reloads.fetch_add(1, Ordering::Relaxed);
                *self
                    .last_reload_error
                    .lock()
                    .unwrap_or_else(|p| p.into_inner()) = None;
                tracing::info!(
                    generation = r.generation,
                    took_ms = r.took_us as f64 / 1e3,
                    elements_parsed = r.parsed.parsed,
                    elements = r.parsed.chunks,
                    "configuration reloaded"
                );
                if !r.not_applied.is_empty() {
                    tracing::warn!(
                        "not applied until the next start: {} (the running values stay)",
                        r.not_applied.join(", ")
                    );
                }
            }
            Err(e) => {
                self.reload_failures.fetch_add(1, Ordering::Relaxed);
                *self
                    .last_reload_error
                    .lock()
                    .unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
                tracing::error!("reload rejected, the running configuration stays: {e}");
            }
        }
        result
    }

    /// Swaps in a validated configuration (a reload's or a runtime
    /// change's) in one step, or changes nothing; counts a generation.
    fn apply_config(&self, mut cfg: Config) -> Result<Reloaded, ReloadError> {
        if cfg.encap.mac.is_none() {
            cfg.encap.mac.clone_from(&self.interface_mac);
        }
        let checks = health::checks(&cfg);
        self.ensure_tunnel(&checks)?;
        let mut c = self.control.lock().unwrap_or_else(|p| p.into_inner());
        c.apply(cfg.clone())?;
        *self.check_names.lock().unwrap_or_else(|p| p.into_inner()) = checks;
        if let Some(f) = &self.xdp_vips {
            f.set(&vip_addresses(&cfg)).map_err(ReloadError::XdpVips)?;
            crate::peers::set_xdp_redirects(f, &cfg).map_err(ReloadError::XdpVips)?;
        }
        drop(c);
        // The backends or gateway_mac may have changed.
        self.gateway.kick();
        Ok(Reloaded {
            generation: self.config_generation.fetch_add(1, Ordering::Relaxed) + 1,
            not_applied: self.boot.restart_keys(&cfg),
            took_us: 0,
            parsed: lb::config::ChunkStats::default(),
        })
    }

    /// Drains, undrains or reweighs `backend` (a name, or an address) in
    /// every pool that lists it: the file's text is edited
    /// ([`crate::runtime::edit`]), the result validated and applied whole
    /// like a reload, then written back in one step. Nothing changes on
    /// any error: an unknown backend, a file edited since it was loaded
    /// (reload it first), a configuration the change makes invalid.
    pub fn runtime_change(
        &self,
        backend: &str,
        change: crate::runtime::Change,
    ) -> Result<RuntimeChanged, RuntimeError> {
        let result = self.runtime_change_inner(backend, change);
        match &result {
            Ok(r) => {
                self.runtime_changes.fetch_add(1, Ordering::Relaxed);
                tracing::info!(
                    backend,
                    %change,
                    pools = ?r.pools,
                    generation = r.generation,
                    changed = r.changed,
                    "runtime change applied and written to the configuration file"
                );
            }
            Err(e) => {
                self.runtime_change_failures.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(backend, %change, "runtime change refused: {e}");
            }
        }
        result
    }

    fn runtime_change_inner(
        &self,
        backend: &str,
        change: crate::runtime::Change,
    ) -> Result<RuntimeChanged, RuntimeError> {
        let mut applied = self.applied_text.lock().unwrap_or_else(|p| p.into_inner());
        let path = &self.config_path;
        let file = path.display().to_string();
        let on_disk = std::fs::read_to_string(path).map_err(|source| RuntimeError::Read {
            path: path.clone(),
            source,
        })?;
        if on_disk != applied.text {
            return Err(RuntimeError::FileChanged { path: path.clone() });
        }
        // Only the pools that list the backend are parsed and edited: the
        // running configuration was parsed from exactly this text.
        let edited = {
            let c = self.control();
            crate::runtime::edit_with(&on_disk, c.config(), backend, change)?
        };
        let generation = self.config_generation.load(Ordering::Relaxed);
        let mut out = RuntimeChanged {
            backend: backend.to_string(),
            change,
            pools: edited.pools.clone(),
            changed: edited.changed,
            generation,
            file,
        };
        if !edited.changed {
            return Ok(out);
        }
        let cfg = Config::parse_with(&edited.text, &out.file, &mut applied.cache)?;
        let old = self.control().config().clone();
        crate::runtime::write_atomically(path, &edited.text)?;
        match self.apply_config(cfg) {
            Ok(r) => {
                out.generation = r.generation;
                applied.text = edited.text;
                Ok(out)
            }
            Err(e) => {
                // Not applied: the file goes back to what runs.
                let _ = crate::runtime::write_atomically(path, &on_disk);
                let _ = self.control().apply(old);
                Err(e.into())
            }
        }
    }

    /// Makes the health-check tunnel if `checks` need it and it is not there.
    fn ensure_tunnel(
        &self,
        checks: &HashMap<CheckKey, Vec<String>>,
    ) -> Result<(), crate::tunnel::TunnelError> {
        let mut t = self.tunnel.lock().unwrap_or_else(|p| p.into_inner());
        let v6 = checks.keys().any(|k| k.vip.is_some_and(|v| v.is_ipv6()));
        let any = checks.keys().any(|k| k.vip.is_some());
        let has_v6 = t.as_ref().is_some_and(crate::tunnel::Tunnel::ipv6);
        if any && (t.is_none() || (v6 && !has_v6)) {
            // Made again when IPv6 VIPs first need it.
            *t = None;
            *t = Some(crate::tunnel::Tunnel::start(v6)?);
            tracing::info!(
                "health checks through GRE: device {}, mark {:#x}",
                crate::tunnel::DEVICE,
                crate::tunnel::MARK
            );
        }
        Ok(())
    }

    /// The control plane (tables, configuration, health and peer state).
    pub(crate) fn control(&self) -> std::sync::MutexGuard<'_, Control> {
        self.control.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The tunnel's routes, if there is a tunnel.
    fn tunnel_routes(&self) -> Option<crate::tunnel::Routes> {
        self.tunnel
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(crate::tunnel::Tunnel::routes)
    }

    fn counters(&self) -> Counters {
        self.counters_and_driver().0
    }

    /// Every counter summed, and what the load balancer in the driver
    /// forwarded (when it runs), from one reading of its counters.
    fn counters_and_driver(&self) -> (Counters, Option<u64>) {
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

    /// The `/status` document.
    pub fn status(&self) -> Status {
        let (c, forwarded_in_driver) = self.counters_and_driver();
        // The tables and the configuration they were built from, together.
        let (tables, cfg) = {
            let control = self.control();
            (control.tables().load_full(), control.config().clone())
        };
        // One lock, released here: taking it twice in one expression would
        // deadlock (a guard lives to the end of its statement).
        let bgp = self.bgp.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let fleet = crate::peers::status(&tables, &c, &cfg);
        // The weight written in the configuration and the drain state, by
        // backend name, per pool (the tables hold 0 for a drained backend).
        let mut configured: HashMap<&str, HashMap<String, (u32, bool)>> = HashMap::new();
        let backend = |id: u32, weight: u32, written: Option<&(u32, bool)>| {
            let b = &tables.backends[id as usize];
            let t = c.per_backend.get(id as usize).copied().unwrap_or_default();
            let (weight, drained) = match written {
                Some(&(w, d)) => (w, d || w == 0),
                None => (weight, weight == 0),
            };
            BackendStatus {
                name: b.name.clone(),
                address: packet::flow::to_ip(&b.addr).to_string(),
                healthy: b.healthy,
                packets: t.packets,
                bytes: t.bytes,
                weight,
                drained,
            }
        };
        let pool = self.pool.stats();
        let memory = tables.memory();
        Status {
            driver: self.driver.clone(),
            pool_buffers: pool.buffers,
            pool_in_use: pool.in_use,
            generation: self.config_generation.load(Ordering::Relaxed),
            tables_generation: tables.generation,
            health_changes: self.health_changes.load(Ordering::Relaxed),
            runtime_changes: self.runtime_changes.load(Ordering::Relaxed),
            runtime_change_failures: self.runtime_change_failures.load(Ordering::Relaxed),
            tables_bytes: memory.total as u64,
            distinct_tables: memory.distinct_tables,
            uptime_s: self.started.elapsed().as_secs_f64(),
            reloads: self.reloads.load(Ordering::Relaxed),
            reload_failures: self.reload_failures.load(Ordering::Relaxed),
            last_reload_error: self
                .last_reload_error
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
            forwarded: c.tx,
            forwarded_in_driver,
            dropped: c.dropped_excluding_not_for_vip(),
            drops: c
                .drop_table_excluding_not_for_vip()
                .into_iter()
                .map(|(n, v)| (n.to_string(), v))
                .collect(),
            not_for_vip: c.not_for_vip(),
            not_for_vip_by_kind: c
                .not_for_vip_table()
                .into_iter()
                .map(|(n, v)| (n.to_string(), v))
                .collect(),
            csum_completed: c.csum_completed,
            conntrack_entries: c.conntrack.entries,
            active_connections: Some(c.conntrack.active()),
            gateway: Some(self.gateway.status()),
            bgp_announced: bgp.as_ref().map(|b| b.0),
            bgp_error: bgp.and_then(|b| b.1),
            fleet,
            tracer: self.tracer.as_ref().map(|t| TracerStatus {
                reports: c.trace_reports,
                rate_limited: c.trace_rate_limited,
                queue_full: c.trace_queue_full,
                invalid: c.trace_invalid,
                sent: t.sent.load(Ordering::Relaxed),
                send_errors: t.send_errors.load(Ordering::Relaxed),
            }),

            vips: tables
                .vips
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    let t = c.per_vip.get(i).copied().unwrap_or_default();
                    let written = configured
                        .entry(v.pool.as_str())
                        .or_insert_with(|| crate::runtime::configured(&cfg, &v.pool));
                    VipStatus {
                        name: v.name.clone(),
                        packets: t.packets,
                        bytes: t.bytes,
                        healthy_backends: v.slots.len(),
                        backends: v
                            .backends
                            .iter()
                            .zip(&v.weights)
                            .map(|(&id, &w)| {
                                backend(id, w, written.get(&tables.backends[id as usize].name))
                            })
                            .collect(),
                        fingerprint: format!("{:016x}", v.fingerprint),
                        pool: v.pool.clone(),
                        table_bytes: memory.per_vip.get(i).map_or(0, |&b| b as u64),
                    }
                })
                .collect(),
        }
    }

    /// Prometheus text exposition.
    pub fn metrics(&self) -> String {
        crate::metrics::encode_metrics(
            &self.status(),
            &self.counters(),
            self.checks_inconclusive.load(Ordering::Relaxed),
        )
    }
}

/// A backend in `/status`.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct BackendStatus {
    /// Name.
    pub name: String,
    /// Address.
    pub address: String,
    /// Health.
    pub healthy: bool,
    /// Packets forwarded to it.
    pub packets: u64,
    /// Bytes forwarded to it.
    pub bytes: u64,
    /// Its weight in the VIP's pool as configured, kept while drained
    /// (absent in older documents: 0; older versions wrote 0 when drained).
    #[serde(default)]
    pub weight: u32,
    /// Drained (listed in its pool's `drained`, or weight 0): it keeps its
    /// connections but takes no new ones; `weight` is what undrain restores.
    #[serde(default)]
    pub drained: bool,
}

impl BackendStatus {
    /// Its state in words that do not contradict each other: "drained"
    /// (no new connections; health aside), "drained, DOWN", "up" or "DOWN".
    pub fn state(&self) -> &'static str {
        match (self.drained, self.healthy) {
            (true, true) => "drained",
            (true, false) => "drained, DOWN",
            (false, true) => "up",
            (false, false) => "DOWN",
        }
    }
}

/// A VIP in `/status`.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct VipStatus {
    /// Name.
    pub name: String,
    /// Packets forwarded for it.
    pub packets: u64,
    /// Bytes.
    pub bytes: u64,
    /// Backends in its Maglev table now.
    pub healthy_backends: usize,
    /// All its backends.
    pub backends: Vec<BackendStatus>,
    /// The table fingerprint, 16 hex digits: a stable hash of its Maglev
    /// table and backends (`lb::tables::Vip::fingerprint`). Load balancers
    /// with the same fingerprint pick the same backend for every flow.
    /// Empty in documents from versions without it.
    #[serde(default)]
    pub fingerprint: String,
    /// Its pool (empty in older documents).
    #[serde(default)]
    pub pool: String,
    /// Bytes of its Maglev table and backend lists (a table it shares
    /// with other VIPs counted here too; 0 in older documents).
    #[serde(default)]
    pub table_bytes: u64,
}

/// Packet-tracer counters in `/status` (see [`lb::trace`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct TracerStatus {
    /// Probes queued for a report.
    pub reports: u64,
    /// Probes over `[tracer] rate_per_s`: forwarded, not reported.
    pub rate_limited: u64,
    /// Probes whose report found the queue full or busy.
    pub queue_full: u64,
    /// Payloads with the marker's magic but a malformed marker.
    pub invalid: u64,
    /// Reports sent.
    pub sent: u64,
    /// Reports that could not be sent (never retried).
    pub send_errors: u64,
}

/// The `/status` document.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Status {
    /// The packet I/O driver in use.
    pub driver: String,
    /// Configuration generation: 1 at start, +1 for every configuration
    /// applied (reload or runtime change); health changes do not count.
    pub generation: u64,
    /// The tables' own generation: +1 for every table swap, configuration,
    /// health, `[fleet]` peer or gateway change (packet-tracer reports carry
    /// it; 0 in older documents).
    #[serde(default)]
    pub tables_generation: u64,
    /// Backend health changes applied (0 in older documents).
    #[serde(default)]
    pub health_changes: u64,
    /// Runtime changes (drain, undrain, weight) applied.
    #[serde(default)]
    pub runtime_changes: u64,
    /// Runtime changes refused (nothing changed).
    #[serde(default)]
    pub runtime_change_failures: u64,
    /// Bytes of the running tables: the distinct Maglev tables once, every
    /// VIP's lists, the backend registry (0 in older documents).
    #[serde(default)]
    pub tables_bytes: u64,
    /// Distinct Maglev tables: VIPs over equal pools share one.
    #[serde(default)]
    pub distinct_tables: usize,
    /// Seconds since start.
    pub uptime_s: f64,
    /// Reloads applied (also read as `reloads_applied`).
    #[serde(alias = "reloads_applied")]
    pub reloads: u64,
    /// Reloads rejected, apart from `reloads` (also read as
    /// `reloads_rejected`).
    #[serde(alias = "reloads_rejected")]
    pub reload_failures: u64,
    /// Why the last reload was rejected, if it was.
    pub last_reload_error: Option<String>,
    /// Packets forwarded.
    pub forwarded: u64,
    /// Of `forwarded`, those the load balancer in the driver forwarded
    /// (absent unless `driver = "xdp"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forwarded_in_driver: Option<u64>,
    /// Packets dropped: frames for the load balancer it could not forward
    /// (frames that were not for a VIP are in `not_for_vip` instead; older
    /// versions counted them here).
    pub dropped: u64,
    /// Drops by reason.
    pub drops: std::collections::BTreeMap<String, u64>,
    /// Frames that were not for a VIP: not IP, or IP for no VIP (on
    /// AF_PACKET the kernel's own traffic). Not drops (absent in older
    /// documents).
    #[serde(default)]
    pub not_for_vip: u64,
    /// The same by kind: `not_ip`, `no_vip`.
    #[serde(default)]
    pub not_for_vip_by_kind: std::collections::BTreeMap<String, u64>,
    /// Transport checksums a local sender left partial (checksum offload
    /// on a veth peer) that the packet threads completed before
    /// encapsulating (0 in older documents).
    #[serde(default)]
    pub csum_completed: u64,
    /// Connection-table entries: open flows and closed ones lingering.
    pub conntrack_entries: u64,
    /// Active connections: entries whose flow is not closed (absent in
    /// older documents).
    #[serde(default)]
    pub active_connections: Option<u64>,
    /// The next hop encapsulated frames are sent to (absent in documents
    /// from versions without it).
    #[serde(default)]
    pub gateway: Option<crate::gateway::GatewayStatus>,
    /// Packet buffers in the forwarder's pool.
    #[serde(default)]
    pub pool_buffers: u32,
    /// Pool buffers not free now: in the receive and fill rings, queues or
    /// in flight. Steady under steady load; growth means buffers leak.
    #[serde(default)]
    pub pool_in_use: u32,
    /// BGP: whether the VIPs are announced (absent without `[bgp]`).
    pub bgp_announced: Option<bool>,
    /// BGP: the last error talking to BIRD.
    pub bgp_error: Option<String>,
    /// `[fleet]`: peers, their liveness and redirected fragments (absent
    /// without `[fleet]`, and in documents from versions without it).
    #[serde(default)]
    pub fleet: Option<crate::peers::FleetStatus>,
    /// Packet-tracer counters (absent when `[tracer]` is disabled, and in
    /// documents from versions without it).
    #[serde(default)]
    pub tracer: Option<TracerStatus>,
    /// VIPs.
    pub vips: Vec<VipStatus>,
}

impl Status {
    /// As tables for people (`fastpath lb status`).
    pub fn to_text(&self) -> String {
        let mut out = format!("driver: {}\n", self.driver);
        out += &format!(
            "configuration generation {}, up {:.0} s, reloads: {} applied, {} rejected; \
             runtime changes: {} applied, {} rejected; health changes {}\n",
            self.generation,
            self.uptime_s,
            self.reloads,
            self.reload_failures,
            self.runtime_changes,
            self.runtime_change_failures,
            self.health_changes
        );
        let not_for_vip = if self.not_for_vip_by_kind.is_empty() {
            self.not_for_vip.to_string()
        } else {
            format!(
                "{} ({})",
                self.not_for_vip,
                self.not_for_vip_by_kind
                    .iter()
                    .map(|(k, v)| format!("{k} {v}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        out += &format!(
            "forwarded {}, dropped {}, not for a VIP {not_for_vip}\n",
            self.forwarded, self.dropped
        );
        if self.csum_completed > 0 {
            out += &format!(
                "partial checksums completed: {} (a local sender offloads them; see README, deployment)\n",
                self.csum_completed
            );
        }
        out += &match self.active_connections {
            Some(a) => format!(
                "connections: {a} active, {} tracked (closed ones linger briefly)\n",
                self.conntrack_entries
            ),
            None => format!("connections: {} tracked\n", self.conntrack_entries),
        };
        out += &format!(
            "packet pool: {} of {} buffers in use\n",
            self.pool_in_use, self.pool_buffers
        );
        out += &format!(
            "tables: {} VIPs, {} distinct Maglev tables, {:.1} MiB in all\n",
            self.vips.len(),
            self.distinct_tables,
            self.tables_bytes as f64 / (1024.0 * 1024.0)
        );
        if let Some(g) = &self.gateway {
            out.push_str(&g.to_text());
        }
        if let Some(e) = &self.last_reload_error {
            out.push_str(&format!("last reload rejected: {e}\n"));
        }
        match (self.bgp_announced, &self.bgp_error) {
            (Some(a), None) => out.push_str(&format!(
                "BGP: VIPs {}\n",
                if a { "announced" } else { "withdrawn" }
            )),
            (Some(_), Some(e)) => out.push_str(&format!("BGP: error: {e}\n")),
            _ => {}
        }
        if let Some(f) = &self.fleet {
            out.push_str(&f.to_text());
        }
        if let Some(t) = &self.tracer {
            out.push_str(&format!(
                "packet tracer: {} probes reported, {} rate-limited, {} queue full, {} invalid; \
                 {} reports sent, {} not sent\n",
                t.reports, t.rate_limited, t.queue_full, t.invalid, t.sent, t.send_errors
            ));
        }
        let mut t = measure::Table::new([
            "vip", "backend", "address", "weight", "state", "packets", "bytes",
        ]);
        for v in &self.vips {
            t.row([
                v.name.clone(),
                format!("pool {}", v.pool),
                format!(
                    "table {}, {} KiB",
                    v.fingerprint,
                    v.table_bytes.div_ceil(1024)
                ),
                String::new(),
                format!("{} in table", v.healthy_backends),
                v.packets.to_string(),
                v.bytes.to_string(),
            ]);
            for b in &v.backends {
                t.row([
                    String::new(),
                    b.name.clone(),
                    b.address.clone(),
                    b.weight.to_string(),
                    b.state().to_string(),
                    b.packets.to_string(),
                    b.bytes.to_string(),
                ]);
            }
        }
        out.push_str(&t.to_string());
        if !self.drops.is_empty() {
            let mut d = measure::Table::new(["drop reason", "packets"]);
            for (k, v) in &self.drops {
                d.row([k.clone(), v.to_string()]);
            }
            out.push_str(&format!("\n{d}"));
        }
        out
    }
}

async fn health_task(shared: Arc<Shared>, key: CheckKey) {
    let mut tick = tokio::time::interval(Duration::from_millis(key.conf.interval_ms));
    loop {
        tick.tick().await;
        let routes = shared.tunnel_routes();
        let outcome = health::check(&key, routes.as_ref()).await;
        if outcome == health::Outcome::Inconclusive {
            shared.checks_inconclusive.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(check = %key, "check inconclusive: the prober ran late");
        }
        let change = {
            let mut h = shared.health.lock().unwrap_or_else(|p| p.into_inner());
            h.entry(key.clone())
                .or_default()
                .record_outcome(outcome, key.conf.rise, key.conf.fall)
        };
        if let Some(healthy) = change {
            let names = shared
                .check_names
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&key)
                .cloned()
                .unwrap_or_default();
            let mut c = shared.control.lock().unwrap_or_else(|p| p.into_inner());
            for n in &names {
                if c.set_health(n, healthy) {
                    shared.health_changes.fetch_add(1, Ordering::Relaxed);
                }
            }
            tracing::warn!(check = %key, healthy, backends = ?names, "backend health changed; tables rebuilt");
        }
    }
}

/// Keeps one task per distinct check, starting new ones and stopping
/// removed ones after a reload.
async fn health_manager(shared: Arc<Shared>, stop: Arc<AtomicBool>) {
    let mut tasks: HashMap<CheckKey, tokio::task::JoinHandle<()>> = HashMap::new();
    while !stop.load(Ordering::Relaxed) {
        let wanted: Vec<CheckKey> = shared
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
                .or_insert_with(|| tokio::spawn(health_task(Arc::clone(&shared), k)));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for t in tasks.values() {
        t.abort();
    }
}

/// A `POST` that changes the load balancer (`/reload`, the runtime
/// changes): refused without the token, run off the async threads; 200
/// with `apply`'s answer as JSON, or `status` of its error with the reason
/// as JSON.
async fn change_endpoint<T, E>(
    s: Arc<Shared>,
    headers: &axum::http::HeaderMap,
    status: fn(&E) -> StatusCode,
    apply: impl FnOnce(&Shared) -> Result<T, E> + Send + 'static,
) -> axum::response::Response
where
    T: Serialize + Send + 'static,
    E: std::fmt::Display + Send + 'static,
{
    if !crate::api::authorized(headers, s.token.as_deref()) {
        return crate::api::unauthorized().into_response();
    }
    match tokio::task::spawn_blocking(move || apply(&s)).await {
        Ok(Ok(r)) => (StatusCode::OK, Json(r)).into_response(),
        Ok(Err(e)) => (
            status(&e),
            Json(serde_json::json!({ "error": e.to_string() })),
        )
            .into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// `POST /backends/NAME/...`: a runtime change (404: no such backend,
/// 409: the file was edited since it was loaded, 400: the result would be
/// invalid).
async fn runtime_endpoint(
    s: Arc<Shared>,
    headers: &axum::http::HeaderMap,
    backend: String,
    change: crate::runtime::Change,
) -> axum::response::Response {
    change_endpoint(s, headers, RuntimeError::status, move |s| {
        s.runtime_change(&backend, change)
    })
    .await
}

async fn control_plane(
    shared: Arc<Shared>,
    listener: Option<std::net::TcpListener>,
    stop: Arc<AtomicBool>,
) {
    tokio::spawn(health_manager(Arc::clone(&shared), Arc::clone(&stop)));
    tokio::spawn(crate::peers::manager(
        Arc::clone(&shared),
        Arc::clone(&stop),
    ));
    if let Ok(mut hup) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        let s = Arc::clone(&shared);
        tokio::spawn(async move {
            while hup.recv().await.is_some() {
                let _ = s.reload();
            }
        });
    }
    if let Some(listener) = listener {
        let app = Router::new()
            .route(
                "/metrics",
                get(|State(s): State<Arc<Shared>>| async move {
                    (
                        [(
                            axum::http::header::CONTENT_TYPE,
                            crate::metrics::CONTENT_TYPE,
                        )],
                        s.metrics(),
                    )
                }),
            )
            .route(
                "/status",
                get(|State(s): State<Arc<Shared>>| async move { Json(s.status()) }),
            )
            .route(
                "/reload",
                post(
                    |State(s): State<Arc<Shared>>, headers: axum::http::HeaderMap| async move {
                        change_endpoint(s, &headers, |_| StatusCode::BAD_REQUEST, Shared::reload)
                            .await
                    },
                ),
            )
            .route(
                "/backends/{backend}/drain",
                post(
                    |State(s): State<Arc<Shared>>,
                     axum::extract::Path(b): axum::extract::Path<String>,
                     headers: axum::http::HeaderMap| async move {
                        runtime_endpoint(s, &headers, b, crate::runtime::Change::Drain).await
                    },
                ),
            )
            .route(
                "/backends/{backend}/undrain",
                post(
                    |State(s): State<Arc<Shared>>,
                     axum::extract::Path(b): axum::extract::Path<String>,
                     headers: axum::http::HeaderMap| async move {
                        runtime_endpoint(s, &headers, b, crate::runtime::Change::Undrain).await
                    },
                ),
            )
            .route(
                "/backends/{backend}/weight/{weight}",
                post(
                    |State(s): State<Arc<Shared>>,
                     axum::extract::Path((b, w)): axum::extract::Path<(String, u32)>,
                     headers: axum::http::HeaderMap| async move {
                        runtime_endpoint(s, &headers, b, crate::runtime::Change::Weight(w)).await
                    },
                ),
            )
            .with_state(Arc::clone(&shared));
        let addr = listener
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_default();
        tracing::info!(
            %addr,
            "HTTP API: /metrics, /status, POST /reload, POST /backends/NAME/drain|undrain|weight/N"
        );
        tokio::spawn(crate::api::serve(listener, app, Arc::clone(&stop)));
    }
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Announces the VIPs while the datapath's heartbeat advances; withdraws
/// them when it stalls, when `[bgp]` goes away, and on the way out.
fn bgp_controller(shared: &Shared, heartbeat: &AtomicU64, stop: &AtomicBool) {
    let mut ann = crate::bgp::Announcer::default();
    let mut last_beat = 0u64;
    let mut stale = 0u32;
    let mut last_conf = None;
    while !stop.load(Ordering::Relaxed) {
        let cfg = shared
            .control
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .config()
            .clone();
        let Some(b) = cfg.bgp.clone() else {
            if let Some(old) = last_conf.take() {
                ann.withdraw(&old);
            }
            *shared.bgp.lock().unwrap_or_else(|p| p.into_inner()) = None;
            std::thread::sleep(Duration::from_millis(500));
            continue;
        };
        // Withdraw only after three polls without progress: one quiet
        // poll is a scheduling hiccup, not a dead forwarder.
        let beat = heartbeat.load(Ordering::Relaxed);
        stale = if beat == last_beat { stale + 1 } else { 0 };
        let alive = beat != 0 && stale < 3;
        last_beat = beat;
        // Announce only VIPs that can be served: a VIP whose backends are
        // all down would attract traffic only to drop it.
        let tables = shared
            .control
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .tables()
            .load_full();
        ann.step(&b, &cfg, alive, &|i| {
            tables.vips.get(i).is_some_and(|v| !v.slots.is_empty())
        });
        *shared.bgp.lock().unwrap_or_else(|p| p.into_inner()) =
            Some((ann.announced(), ann.last_error.clone()));
        last_conf = Some(b.clone());
        // Sleep in small steps so a stop is acted on quickly.
        let until = Instant::now() + Duration::from_millis(b.poll_ms);
        while Instant::now() < until && !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    if let Some(b) = last_conf {
        ann.withdraw(&b);
    }
}

/// Packets forwarded for VIPs so far (the traffic a drain waits out; the
/// kernel's own traffic, such as BGP and BFD, does not count).
fn vip_packets(shared: &Shared) -> u64 {
    shared.counters().per_vip.iter().map(|t| t.packets).sum()
}

/// The graceful stop (Maglev section 3.4: "draining traffic from each one
/// a few moments beforehand"): once `stop` is set, waits for the BGP
/// controller to withdraw the VIPs, then lets the datapath forward until
/// no VIP packet has come for `[bgp] drain_quiet_ms` (the router has moved
/// the flows to the other load balancers), at most `[bgp] drain_ms`, and
/// sets `dp_stop`. Without `[bgp]` (nothing to withdraw) it stops at once.
fn graceful_stop(
    shared: &Shared,
    bgp: std::thread::JoinHandle<()>,
    stop: &AtomicBool,
    dp_stop: &AtomicBool,
) {
    while !stop.load(Ordering::Acquire) && !dp_stop.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(20));
    }
    // The drain's time counts from the signal, withdrawal included.
    let start = Instant::now();
    let was_announced = shared
        .bgp
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
        .is_some_and(|(announced, _)| *announced);
    // The controller withdraws on its way out.
    let _ = bgp.join();
    let cfg = shared
        .control
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .config()
        .bgp
        .clone();
    let Some(b) = cfg.filter(|b| b.drain_ms > 0 && was_announced) else {
        dp_stop.store(true, Ordering::Release);
        return;
    };
    let deadline = start + Duration::from_millis(b.drain_ms);
    let quiet = Duration::from_millis(b.drain_quiet_ms);
    let (mut last, mut last_change) = (vip_packets(shared), start);
    tracing::info!(
        drain_ms = b.drain_ms,
        "graceful stop: VIPs withdrawn, forwarding until the router has moved the traffic"
    );
    while !dp_stop.load(Ordering::Acquire) {
        let now = Instant::now();
        let n = vip_packets(shared);
        if n != last {
            (last, last_change) = (n, now);
        }
        if now.duration_since(last_change) >= quiet {
            tracing::info!(
                last_packet_ms = last_change.duration_since(start).as_millis() as u64,
                "graceful stop: drained"
            );
            break;
        }
        if now >= deadline {
            tracing::warn!(
                drain_ms = b.drain_ms,
                "graceful stop: VIP packets still arriving when the drain time ran out"
            );
            break;
        }
        // Reading the counters takes the lock packet threads publish under:
        // not more often than they publish.
        std::thread::sleep(Duration::from_millis(50));
    }
    dp_stop.store(true, Ordering::Release);
}

/// Runs the daemon on `interface` until `stop`. `driver` overrides the
/// configuration's `[forwarder] driver`.
pub fn run(
    config: &Path,
    interface: &str,
    driver: Option<Driver>,
    threads: Option<usize>,
    stop: Arc<AtomicBool>,
) -> Result<(RunStats, Arc<lb::tables::Tables>), Error> {
    // The text too: a runtime change refuses to overwrite a file that
    // differs from what runs.
    let file = config.display().to_string();
    let config_text = Config::read(config)?;
    let mut parse_cache = lb::config::ParseCache::new();
    let mut cfg = Config::parse_with(&config_text, &file, &mut parse_cache)?;
    // What a reload compares against to name keys that wait for a restart:
    // the file's values, not --threads (else every reload would report
    // forwarder.threads as changed).
    let file_config = cfg.clone();
    if let Some(t) = threads {
        cfg.forwarder.threads = t;
    }
    // Held until this function returns: the process serves the interface.
    let _claim = crate::lock::InterfaceLock::claim(interface)?;
    // The command line's choice, else the file's.
    let driver = driver.unwrap_or(cfg.forwarder.driver);
    let interface_mac = afpacket::mac_address(interface).map(|m| netio::neigh::format_mac(&m));
    if cfg.encap.mac.is_none() {
        cfg.encap.mac.clone_from(&interface_mac);
    }
    // The next hop's MAC, unless configured: from the kernel, waiting a
    // little for resolution so that the first frames already carry it.
    let (gateway, resolved) = crate::gateway::Gateway::start(&cfg, interface);
    let control = Control::with_gateway(cfg.clone(), resolved)?;
    let host = Host {
        gateway,
        interface_mac,
        config_text,
        parse_cache,
        file_config,
    };
    let tables = control.tables();
    let mut params = Params::from_config(&cfg);
    // One AF_XDP socket per packet thread when the interface has a receive
    // queue for each (the NIC spreads flows; each thread runs to completion).
    let queues = rx_queues(interface);
    let per_queue = driver != Driver::AfPacket
        && cfg.forwarder.threads >= 2
        && queues >= cfg.forwarder.threads as u32
        && cfg.vips.iter().all(|v| v.address.is_some())
        // The NIC would spread a peer's redirected fragments (hashed on the
        // outer GRE header) over other queues than their datagram's.
        && cfg.fleet.is_none();
    if driver != Driver::AfPacket {
        // Per queue: one socket per packet thread; else one socket on every
        // queue behind the one I/O loop.
        let sockets = if per_queue {
            cfg.forwarder.threads as u32
        } else {
            queues
        };
        params.pool_buffers +=
            sockets * (netio::afxdp::BUFFERS_NEEDED + 4 * cfg.forwarder.queue_size as u32);
    }
    let dp = Datapath::new(params, Arc::clone(&tables))?;
    let program = if driver == Driver::Xdp {
        netio::afxdp::Program::LoadBalancer(lb::xdp::sizes(&cfg, &tables.load()))
    } else {
        netio::afxdp::Program::Steer
    };
    let in_driver = |lb: &Option<netio::xdplb::XdpLb>| {
        if lb.is_some() {
            "the load balancer in the driver (XDP) for IPv4 TCP/UDP, "
        } else {
            ""
        }
    };
    if per_queue {
        match AfXdpPort::open_queues_with(
            interface,
            dp.pool(),
            &vip_addresses(&cfg),
            cfg.forwarder.threads as u32,
            program,
        ) {
            Ok(ports) => {
                let filter = ports[0].vip_filter();
                let xdp_lb = ports[0].xdp_lb();
                let desc = format!(
                    "{}AF_XDP ({:?} XDP, copy mode), one socket per queue on {} queues",
                    in_driver(&xdp_lb),
                    ports[0].mode(),
                    ports.len()
                );
                let boxed: Vec<Box<dyn netio::Nic + Send>> = ports
                    .into_iter()
                    .map(|p| Box::new(p) as Box<dyn netio::Nic + Send>)
                    .collect();
                return serve(
                    cfg,
                    host,
                    control,
                    tables,
                    dp,
                    Ports::Queues(boxed),
                    Some(filter),
                    xdp_lb,
                    desc,
                    config,
                    interface,
                    driver,
                    stop,
                );
            }
            Err(e) if driver == Driver::Auto => {
                tracing::warn!("one AF_XDP socket per queue failed ({e}); trying one socket")
            }
            Err(e) => return Err(e.into()),
        }
    }
    let open_packet = || {
        AfPacketPort::open(afpacket::Config::new(interface))
            .map(|p| Box::new(p) as Box<dyn netio::Nic>)
    };
    let driver_desc: String;
    let (port, xdp_vips, xdp_lb): (Box<dyn netio::Nic>, _, _) = match driver {
        Driver::AfPacket => {
            driver_desc = "AF_PACKET (asked for)".into();
            (open_packet()?, None, None)
        }
        Driver::AfXdp | Driver::Xdp | Driver::Auto => {
            let prefix_vips = cfg.vips.iter().any(|v| v.address.is_none());
            let xdp = if prefix_vips {
                Err(Error::PrefixVipsNeedAfPacket)
            } else {
                netio::afxdp::AllQueues::open_with(
                    interface,
                    dp.pool(),
                    &vip_addresses(&cfg),
                    queues,
                    program,
                )
                .map_err(Error::from)
            };
            match (xdp, driver) {
                (Ok(p), _) => {
                    let xdp_lb = p.first().xdp_lb();
                    driver_desc = format!(
                        "{}AF_XDP ({:?} XDP, copy mode){}",
                        in_driver(&xdp_lb),
                        p.first().mode(),
                        if p.queues() > 1 {
                            format!(", {} queues into one I/O loop", p.queues())
                        } else {
                            String::new()
                        }
                    );
                    let f = p.first().vip_filter();
                    (Box::new(p) as Box<dyn netio::Nic>, Some(f), xdp_lb)
                }
                (Err(e), Driver::Auto) => {
                    driver_desc = format!("AF_PACKET, because AF_XDP is unavailable: {e}");
                    (open_packet()?, None, None)
                }
                (Err(e), _) => return Err(e),
            }
        }
    };
    serve(
        cfg,
        host,
        control,
        tables,
        dp,
        Ports::One(port),
        xdp_vips,
        xdp_lb,
        driver_desc,
        config,
        interface,
        driver,
        stop,
    )
}

/// What the daemon learned about its interface before serving it.
struct Host {
    /// The next hop's MAC, as found at start.
    gateway: crate::gateway::Gateway,
    /// The interface's own MAC.
    interface_mac: Option<String>,
    /// The configuration file's text as loaded.
    config_text: String,
    /// Its parsed pieces, for the first reload.
    parse_cache: lb::config::ParseCache,
    /// The file's configuration before command-line overrides.
    file_config: Config,
}

/// The ports the datapath serves.
enum Ports {
    /// One port; packet threads fed by software steering (or inline).
    One(Box<dyn netio::Nic>),
    /// One port per packet thread, each run to completion.
    Queues(Vec<Box<dyn netio::Nic + Send>>),
}

/// The number of receive queues of an interface (from sysfs; 1 if unknown).
fn rx_queues(interface: &str) -> u32 {
    std::fs::read_dir(format!("/sys/class/net/{interface}/queues"))
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().starts_with("rx-"))
                .count() as u32
        })
        .unwrap_or(1)
        .max(1)
}

/// Raises the calling thread's priority (nice -10) so that health checks,
/// the API and BGP keep running on time while packet threads saturate the
/// cores; a check that still runs late is inconclusive, not a failure (see
/// [`health`]). Without the privilege this is logged and skipped.
fn prefer_this_thread() {
    let tid = rustix::thread::gettid();
    if let Err(e) = rustix::process::setpriority_process(Some(tid), -10) {
        tracing::info!("control thread keeps the default priority: {e}");
    }
}

/// Runs the control plane, the BGP controller and the datapath until `stop`.
#[allow(clippy::too_many_arguments)]
fn serve(
    cfg: Config,
    host: Host,
    control: Control,
    tables: Arc<arc_swap::ArcSwap<lb::tables::Tables>>,
    dp: Datapath,
    ports: Ports,
    xdp_vips: Option<netio::afxdp::VipFilter>,
    xdp_lb: Option<netio::xdplb::XdpLb>,
    driver_desc: String,
    config: &Path,
    interface: &str,
    driver: Driver,
    stop: Arc<AtomicBool>,
) -> Result<(RunStats, Arc<lb::tables::Tables>), Error> {
    tracing::info!("driver: {driver_desc}");
    // The API's listener and token before anything runs: a port in use or a
    // missing token stops the start instead of leaving a daemon without API.
    let api_listener = cfg.api.listen.map(crate::api::bind).transpose()?;
    let token = cfg
        .api
        .token_file
        .as_deref()
        .map(crate::api::read_token)
        .transpose()?;
    let shared = Arc::new(Shared {
        tunnel: Mutex::new(None),
        token,
        boot: host.file_config,
        control: Mutex::new(control),
        config_path: config.to_path_buf(),
        live: Arc::clone(&dp.live),
        health: Mutex::new(HashMap::new()),
        check_names: Mutex::new(health::checks(&cfg)),
        reloads: AtomicU64::new(0),
        config_generation: AtomicU64::new(1),
        health_changes: AtomicU64::new(0),
        runtime_changes: AtomicU64::new(0),
        runtime_change_failures: AtomicU64::new(0),
        applied_text: Mutex::new(Applied {
            text: host.config_text,
            cache: host.parse_cache,
        }),
        checks_inconclusive: AtomicU64::new(0),
        reload_failures: AtomicU64::new(0),
        last_reload_error: Mutex::new(None),
        bgp: Mutex::new(None),
        xdp_vips,
        xdp_live: xdp_lb
            .as_ref()
            .map(|_| Arc::new(Mutex::new(Counters::new()))),
        driver: driver_desc.clone(),
        pool: dp.pool().clone(),
        tracer: dp.tracer().cloned(),
        gateway: host.gateway,
        interface_mac: host.interface_mac,
        started: Instant::now(),
    });
    // Tunnel health checks asked for and impossible: stop now, say why.
    let checks = health::checks(&cfg);
    shared.ensure_tunnel(&checks)?;
    if let Some(f) = &shared.xdp_vips {
        crate::peers::set_xdp_redirects(f, &cfg)?;
    }
    // `stop` (the signal) starts a graceful stop: the BGP controller
    // withdraws the VIPs, then the drainer keeps the datapath, the API and
    // health checks running until the router has moved the traffic away,
    // and only then sets `dp_stop`, which ends them.
    let dp_stop = Arc::new(AtomicBool::new(false));
    // The load balancer in the driver: its maps follow the tables.
    let xdp = match (xdp_lb, &shared.xdp_live) {
        (Some(lb), Some(live)) => {
            let (tables, live, stop, ct) = (
                Arc::clone(&tables),
                Arc::clone(live),
                Arc::clone(&dp_stop),
                cfg.conntrack.clone(),
            );
            Some(
                std::thread::Builder::new()
                    .name("xdp".into())
                    .spawn(move || xdp_sync(lb, &ct, &tables, &live, &stop))
                    .map_err(|source| Error::Spawn {
                        what: "XDP table sync",
                        source,
                    })?,
            )
        }
        _ => None,
    };
    let cp = {
        let (shared, stop, listen) = (Arc::clone(&shared), Arc::clone(&dp_stop), api_listener);
        std::thread::Builder::new()
            .name("control".into())
            .spawn(move || {
                prefer_this_thread();
                match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt.block_on(control_plane(shared, listen, stop)),
                    Err(e) => tracing::error!("control plane: {e}"),
                }
            })
            .map_err(|source| Error::Spawn {
                what: "control-plane",
                source,
            })?
    };
    let bgp = {
        let (shared, stop, heartbeat) = (
            Arc::clone(&shared),
            Arc::clone(&stop),
            Arc::clone(&dp.heartbeat),
        );
        std::thread::Builder::new()
            .name("bgp".into())
            .spawn(move || bgp_controller(&shared, &heartbeat, &stop))
            .map_err(|source| Error::Spawn {
                what: "BGP controller",
                source,
            })?
    };
    // The next hop, checked again until the datapath stops.
    let gateway = {
        let (shared, dp_stop) = (Arc::clone(&shared), Arc::clone(&dp_stop));
        std::thread::Builder::new()
            .name("gateway".into())
            .spawn(move || crate::gateway::watch(&shared.gateway, &shared.control, &dp_stop))
            .map_err(|source| Error::Spawn {
                what: "gateway",
                source,
            })?
    };
    let drainer = {
        let (shared, stop, dp_stop) =
            (Arc::clone(&shared), Arc::clone(&stop), Arc::clone(&dp_stop));
        std::thread::Builder::new()
            .name("drain".into())
            .spawn(move || graceful_stop(&shared, bgp, &stop, &dp_stop))
            .map_err(|source| Error::Spawn {
                what: "graceful-stop",
                source,
            })?
    };
    // Packet-tracer reports, until the datapath stops.
    let reporter = dp
        .tracer()
        .map(|t| {
            let name = crate::tracer::machine_name(&cfg);
            crate::tracer::spawn(
                Arc::clone(t),
                name,
                Arc::clone(&tables),
                Arc::clone(&dp_stop),
            )
        })
        .transpose()
        .map_err(|crate::tracer::ReporterError::Spawn(source)| Error::Spawn {
            what: "packet-tracer reporter",
            source,
        })?;
    tracing::info!(
        interface,
        ?driver,
        "forwarding; stop with SIGINT or SIGTERM, reload with SIGHUP"
    );
    let res = match ports {
        Ports::One(mut port) => dp.run(&mut *port, &dp_stop),
        Ports::Queues(ports) => dp.run_queues(ports, &dp_stop),
    };
    // The datapath may also end on its own (an error): then nothing is
    // left to drain.
    dp_stop.store(true, Ordering::Release);
    stop.store(true, Ordering::Release);
    let _ = drainer.join();
    let _ = cp.join();
    let _ = gateway.join();
    if let Some(r) = reporter {
        let _ = r.join();
    }
    let in_driver = xdp.and_then(|j| j.join().ok());
    let mut stats = res?;
    if let Some(c) = in_driver {
        stats.counters.merge(&c);
    }
    let t = tables.load_full();
    Ok((stats, t))
}

/// How often the `xdp` thread looks for a new tables snapshot.
const XDP_SYNC_MS: u64 = 5;

/// Keeps the driver's maps equal to the running tables (a new snapshot is
/// written within [`XDP_SYNC_MS`]; until then the driver forwards by the
/// previous one, as a packet thread does until its next batch) and
/// publishes what it forwarded every [`lb::datapath::LIVE_INTERVAL_MS`].
/// Returns its last counters when `stop` is set.
fn xdp_sync(
    lb: netio::xdplb::XdpLb,
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

/// One request to a daemon's HTTP API; the answer's body.
pub fn api_request(
    api: std::net::SocketAddr,
    method: &str,
    path: &str,
) -> Result<String, ApiError> {
    api_request_with(api, method, path, None)
}

/// One exchange with the API, with a bearer token (`[api] token_file` of
/// the daemon, which a change such as `POST /reload` needs when the daemon
/// has one): the status (code and reason) and the body.
pub fn api_exchange(
    api: std::net::SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
) -> Result<(String, String), ApiError> {
    use std::io::{Read, Write};
    let io = |source| ApiError::Io { api, source };
    let mut s = std::net::TcpStream::connect_timeout(&api, Duration::from_secs(2))
        .map_err(|source| ApiError::Connect { api, source })?;
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(io)?;
    s.write_all(
        format!(
            "{method} {path} HTTP/1.0\r\nHost: {api}\r\n{}Content-Length: 0\r\n\r\n",
            token
                .map(|t| format!("Authorization: Bearer {t}\r\n"))
                .unwrap_or_default()
        )
        .as_bytes(),
    )
    .map_err(io)?;
    let mut answer = String::new();
    s.read_to_string(&mut answer).map_err(io)?;
    if answer.is_empty() {
        return Err(ApiError::NoAnswer { api });
    }
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .ok_or(ApiError::Malformed { api })?;
    let status = head
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("HTTP/"))
        .and_then(|l| l.split_once(' '))
        .map(|(_, code)| code.trim().to_string())
        .ok_or(ApiError::Malformed { api })?;
    Ok((status, body.to_string()))
}

/// One request to a daemon's HTTP API; the answer's body, whatever its
/// status (a rejected reload answers 400 with the reason as JSON).
pub fn api_request_with(
    api: std::net::SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
) -> Result<String, ApiError> {
    api_exchange(api, method, path, token).map(|(_, body)| body)
}

/// A document from the API: a 2xx answer with a body, else an error that
/// says which (an error status with its message, or an empty answer).
pub fn api_document(api: std::net::SocketAddr, path: &str) -> Result<String, ApiError> {
    let (status, body) = api_exchange(api, "GET", path, None)?;
    if !status.starts_with('2') {
        return Err(ApiError::Status {
            api,
            status,
            body: body.trim().chars().take(500).collect(),
        });
    }
    if body.trim().is_empty() {
        return Err(ApiError::Empty {
            api,
            path: path.to_string(),
        });
    }
    Ok(body)
}

/// Fetches `/status` from a running daemon's API (`fastpath lb status`).
pub fn fetch_status(api: std::net::SocketAddr) -> Result<Status, ApiError> {
    let json = api_document(api, "/status")?;
    serde_json::from_str(&json).map_err(|source| ApiError::Document {
        path: "/status",
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// A one-shot server answering `reply` to the first connection.
    fn answering(reply: &'static str) -> std::net::SocketAddr {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            if let Ok((mut c, _)) = l.accept() {
                let mut buf = [0u8; 1024];
                let _ = c.read(&mut buf);
                let _ = c.write_all(reply.as_bytes());
            }
        });
        addr
    }

    /// `lb status` says what its counters mean (issue 17, finding 4):
    /// reloads applied and rejected as two numbers, active connections
    /// beside tracked entries, frames not for a VIP apart from drops, the
    /// configured weight, and "drained" rather than a health word for a
    /// drained backend. Documents from older versions still parse.
    #[test]
    fn status_text_says_what_the_counters_mean() {
        let doc = serde_json::json!({
            "driver": "AF_PACKET", "generation": 4, "uptime_s": 9.0, "reloads": 10,
            "reload_failures": 10, "last_reload_error": null, "forwarded": 100, "dropped": 1,
            "drops": {"no_healthy_backend": 1}, "conntrack_entries": 50, "bgp_announced": null,
            "bgp_error": null, "health_changes": 7, "not_for_vip": 30,
            "not_for_vip_by_kind": {"no_vip": 20, "not_ip": 10}, "active_connections": 12,
            "vips": [{"name": "http", "packets": 100, "bytes": 1000, "healthy_backends": 1,
                      "pool": "web", "fingerprint": "00000000000000aa", "backends": [
                {"name": "b1", "address": "10.0.0.1", "healthy": true, "packets": 90,
                 "bytes": 900, "weight": 2, "drained": false},
                {"name": "b2", "address": "10.0.0.2", "healthy": true, "packets": 10,
                 "bytes": 100, "weight": 3, "drained": true},
                {"name": "b3", "address": "10.0.0.3", "healthy": false, "packets": 0,
                 "bytes": 0, "weight": 1, "drained": false}]}]
        });
        let s: Status = serde_json::from_value(doc).unwrap();
        let t = s.to_text();
        for want in [
            "configuration generation 4",
            "reloads: 10 applied, 10 rejected",
            "health changes 7",
            "dropped 1, not for a VIP 30 (no_vip 20, not_ip 10)",
            "connections: 12 active, 50 tracked",
        ] {
            assert!(t.contains(want), "{want:?} missing:\n{t}");
        }
        let row = |name: &str| {
            t.lines()
                .find(|l| l.split_whitespace().any(|w| w == name))
                .unwrap()
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
        };
        assert!(row("b1").contains("10.0.0.1 2 up 90"), "{t}");
        assert!(row("b2").contains("10.0.0.2 3 drained 10"), "{t}");
        assert!(
            !row("b2").contains("yes") && !row("b2").contains("up"),
            "{t}"
        );
        assert!(row("b3").contains("10.0.0.3 1 DOWN 0"), "{t}");
        // The names of other versions' documents are read too.
        let renamed: Status = serde_json::from_value(serde_json::json!({
            "driver": "x", "generation": 1, "uptime_s": 0.0, "reloads_applied": 3,
            "reloads_rejected": 2, "last_reload_error": null, "forwarded": 0, "dropped": 0,
            "drops": {}, "conntrack_entries": 0, "bgp_announced": null, "bgp_error": null,
            "vips": []
        }))
        .unwrap();
        assert_eq!((renamed.reloads, renamed.reload_failures), (3, 2));
        assert_eq!(renamed.active_connections, None);
        assert!(renamed.to_text().contains("connections: 0 tracked"));
    }

    #[test]
    fn status_errors_say_what_the_api_answered() {
        let e = fetch_status(answering("")).unwrap_err();
        assert!(matches!(e, ApiError::NoAnswer { .. }), "{e}");
        let e = fetch_status(answering("HTTP/1.1 200 OK\r\n\r\n")).unwrap_err();
        assert!(matches!(e, ApiError::Empty { .. }), "{e}");
        assert!(e.to_string().contains("empty body"), "{e}");
        let e = fetch_status(answering(
            "HTTP/1.1 401 Unauthorized\r\n\r\n{\"error\":\"token\"}",
        ))
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("401 Unauthorized: {\"error\":\"token\"}"),
            "{e}"
        );
        let e = fetch_status(answering("SSH-2.0-OpenSSH\r\n")).unwrap_err();
        assert!(matches!(e, ApiError::Malformed { .. }), "{e}");
        // A rejected reload's reason stays readable through api_request.
        let body = api_request(
            answering("HTTP/1.1 400 Bad Request\r\n\r\n{\"error\":\"vips[0].pool\"}"),
            "POST",
            "/reload",
        )
        .unwrap();
        assert!(body.contains("vips[0].pool"));
    }
}
