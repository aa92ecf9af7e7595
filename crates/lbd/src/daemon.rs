//! The daemon's lifecycle: [`run`] starts it (reads the configuration,
//! claims the interface, opens its ports through [`crate::ports`], makes
//! the datapath and the shared state), serves until a signal (the
//! datapath on the packet threads; beside it the control plane's threads:
//! the HTTP API, reloads on SIGHUP, the tasks of [`crate::tasks`]) and
//! stops gracefully: the VIPs are withdrawn and the datapath forwards
//! until the router has moved the traffic away.
//!
//! A reload or a runtime change ([`crate::reload`]) is applied whole or
//! not at all while the daemon runs. Settings of `[forwarder]` and
//! `[conntrack]` (threads, queue and table sizes) take effect at the next
//! start; a reload that changes them says so.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lb::config::Driver;
use lb::counters::Counters;
use lb::datapath::{Datapath, Params, RunStats};
use lb::tables::Control;
use lb::Config;

use crate::health;
use crate::http;
use crate::ports::{Opened, Plan, Ports};
use crate::state::{Applied, ChangeCounts, ConfigFile, DatapathState, HealthState, Shared};
use crate::tasks;

/// Why the daemon stopped or could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration was rejected.
    #[error(transparent)]
    Config(#[from] lb::config::ConfigError),
    /// The datapath failed.
    #[error(transparent)]
    Datapath(#[from] lb::datapath::Error),
    /// The interface's ports could not be opened.
    #[error(transparent)]
    Ports(#[from] crate::ports::OpenError),
    /// The XDP program's set of addresses that peers redirect fragments to
    /// could not be written.
    #[error(transparent)]
    XdpRedirects(netio::Error),
    /// The HTTP API could not be set up.
    #[error(transparent)]
    Api(#[from] crate::http::ApiSetupError),
    /// Tunnel health checks were asked for and the tunnel cannot be made.
    #[error(transparent)]
    Tunnel(#[from] crate::tunnel::TunnelError),
    /// Another load balancer serves the interface.
    #[error(transparent)]
    Lock(#[from] crate::lock::LockError),
    /// The configuration could not be read from etcd, or merged.
    #[error(transparent)]
    Etcd(#[from] crate::source::EtcdError),
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

/// Where the daemon's configuration comes from.
pub enum Source {
    /// A file (`lb run --config`).
    File(PathBuf),
    /// The fleet's configuration in etcd, read once already, merged with
    /// the machine's own file (`lb run --config-etcd`).
    Etcd(Box<crate::source::Start>),
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
    run_from(
        Source::File(config.to_path_buf()),
        interface,
        driver,
        threads,
        stop,
    )
}

/// [`run`] with the configuration from `source`.
pub fn run_from(
    source: Source,
    interface: &str,
    driver: Option<Driver>,
    threads: Option<usize>,
    stop: Arc<AtomicBool>,
) -> Result<(RunStats, Arc<lb::tables::Tables>), Error> {
    // Before anything is opened: the soft open-files limit to the hard one.
    match crate::limits::raise_nofile() {
        Ok(n) if n.before != n.now => tracing::info!(
            "open files: soft limit raised from {} to {} (the hard limit)",
            n.before.map_or("unlimited".into(), |l| l.to_string()),
            n.now.map_or("unlimited".into(), |l| l.to_string())
        ),
        Ok(_) => {}
        Err(e) => tracing::warn!("{e}; the API's share of open files is smaller"),
    }
    // The text too: a runtime change refuses to overwrite a file that
    // differs from what runs.
    let mut parse_cache = lb::config::ParseCache::new();
    let (mut checked, label, config, etcd) = match source {
        Source::File(path) => (
            Config::load_with(&path, &mut parse_cache)?,
            path.display().to_string(),
            path,
            None,
        ),
        Source::Etcd(start) => {
            let label = start.label();
            let checked = crate::source::check_text(start.text()?, &label, &mut parse_cache)?;
            let path = start.local.clone().unwrap_or_else(|| PathBuf::from(&label));
            (checked, label, path, Some(start))
        }
    };
    // What a reload compares against to name keys that wait for a restart:
    // the file's values, not --threads (else every reload would report
    // forwarder.threads as changed).
    let file_config = checked.config.clone();
    if let Some(t) = threads {
        // The pool and queues follow the count, and explicit sizes are
        // checked against it, as if the file said it.
        checked = checked.with_threads(t, &label)?;
    }
    let lb::config::Checked {
        config: mut cfg,
        text: config_text,
        ..
    } = checked;
    // Held until this function returns: the process serves the interface.
    let _claim = crate::lock::InterfaceLock::claim(interface)?;
    // The command line's choice, else the file's.
    let driver = driver.unwrap_or(cfg.forwarder.driver);
    let interface_mac =
        netio::afpacket::mac_address(interface).map(|m| netio::neigh::format_mac(&m));
    if cfg.encap.mac.is_none() {
        cfg.encap.mac.clone_from(&interface_mac);
    }
    // The next hop's MAC, unless configured: from the kernel, waiting a
    // little for resolution so that the first frames already carry it.
    let (gateway, resolved) = crate::gateway::Gateway::start(&cfg, interface);
    let control = Control::with_gateway(cfg.clone(), resolved)?;
    let tables = control.tables();
    let plan = Plan::new(driver, interface, &cfg);
    let mut params = Params::from_config(&cfg);
    plan.size_pool(&mut params, &cfg);
    let dp = Datapath::new(params, Arc::clone(&tables))?;
    let opened = plan.open(interface, dp.pool(), &cfg, &tables.load())?;
    let boot = Boot {
        etcd,
        config_path: config,
        interface: interface.to_string(),
        driver,
        cfg,
        file_config,
        config_text,
        parse_cache,
        gateway,
        interface_mac,
    };
    serve(boot, control, dp, opened, stop)
}

/// What the daemon starts from: the configuration file as loaded, and what
/// it learned about its interface.
struct Boot {
    /// The fleet's configuration in etcd, when it comes from there.
    etcd: Option<Box<crate::source::Start>>,
    /// The configuration file.
    config_path: PathBuf,
    /// The interface served.
    interface: String,
    /// The driver asked for.
    driver: Driver,
    /// The configuration, with command-line overrides.
    cfg: Config,
    /// The file's configuration before command-line overrides.
    file_config: Config,
    /// The configuration file's text as loaded.
    config_text: String,
    /// Its parsed pieces, for the first reload.
    parse_cache: lb::config::ParseCache,
    /// The next hop's MAC, as found at start.
    gateway: crate::gateway::Gateway,
    /// The interface's own MAC.
    interface_mac: Option<String>,
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
fn serve(
    boot: Boot,
    control: Control,
    dp: Datapath,
    opened: Opened,
    stop: Arc<AtomicBool>,
) -> Result<(RunStats, Arc<lb::tables::Tables>), Error> {
    let Boot {
        etcd,
        config_path,
        interface,
        driver,
        cfg,
        file_config,
        config_text,
        parse_cache,
        gateway,
        interface_mac,
    } = boot;
    let tables = control.tables();
    tracing::info!("driver: {}", opened.description);
    // The API's listener and token before anything runs: a port in use or a
    // missing token stops the start instead of leaving a daemon without API.
    let api_listener = cfg.api.listen.map(http::bind).transpose()?;
    let api = crate::access::Access {
        token: cfg
            .api
            .token_file
            .as_deref()
            .map(http::read_token)
            .transpose()?,
        reads_need_token: cfg.api.reads_need_token(),
    };
    let shared = Arc::new(Shared {
        control: Mutex::new(control),
        file: ConfigFile {
            path: config_path,
            boot: file_config,
            applied: Mutex::new(Applied {
                text: config_text,
                cache: parse_cache,
            }),
            generation: AtomicU64::new(1),
            interface_mac,
        },
        changes: ChangeCounts::default(),
        health: HealthState::new(health::checks(&cfg)),
        datapath: DatapathState {
            live: Arc::clone(&dp.live),
            xdp_live: opened
                .xdp_lb
                .as_ref()
                .map(|_| Arc::new(Mutex::new(Counters::new()))),
            xdp_vips: opened.xdp_vips,
            driver: opened.description.clone(),
            pool: dp.pool().clone(),
            tracer: dp.tracer().cloned(),
        },
        bgp: Default::default(),
        gateway,
        api,
        api_connections: crate::access::Connections::new(crate::limits::MIN_API_CONNECTIONS),
        budget: Mutex::new(crate::limits::Budget {
            limit: crate::limits::nofile().limit(),
            at_start: 0,
            reserved: 0,
        }),
        started: Instant::now(),
        stopping: Default::default(),
        etcd: etcd.map(|s| Arc::new(crate::source::EtcdSource::new(*s))),
    });
    for w in health::warnings(&cfg) {
        tracing::warn!("{w}");
    }
    // Tunnel health checks asked for and impossible: stop now, say why.
    let checks = health::checks(&cfg);
    shared.health.ensure_tunnel(&checks)?;
    if let Some(f) = &shared.datapath.xdp_vips {
        tasks::peers::set_xdp_redirects(f, &cfg).map_err(Error::XdpRedirects)?;
    }
    // Everything the datapath and the tunnel need is open: what is left,
    // less what health checks, peers and BIRD need, is the API's.
    crate::limits::share_open_files(
        &shared.budget,
        &shared.api_connections,
        &cfg,
        Some(crate::limits::open_descriptors().unwrap_or(0)),
    );
    // `stop` (the signal) starts a graceful stop: the BGP controller
    // withdraws the VIPs, then the drainer keeps the datapath, the API and
    // health checks running until the router has moved the traffic away,
    // and only then sets `dp_stop`, which ends them.
    let dp_stop = Arc::new(AtomicBool::new(false));
    // The load balancer in the driver: its maps follow the tables.
    let xdp = match (opened.xdp_lb, &shared.datapath.xdp_live) {
        (Some(lb), Some(live)) => {
            let (tables, live, stop, ct) = (
                Arc::clone(&tables),
                Arc::clone(live),
                Arc::clone(&dp_stop),
                cfg.conntrack.clone(),
            );
            Some(spawn("xdp", "XDP table sync", move || {
                tasks::xdp_sync::run(lb, &ct, &tables, &live, &stop)
            })?)
        }
        _ => None,
    };
    let cp = {
        let (shared, stop, listen, heartbeat) = (
            Arc::clone(&shared),
            Arc::clone(&dp_stop),
            api_listener,
            Arc::clone(&dp.heartbeat),
        );
        spawn("control", "control-plane", move || {
            prefer_this_thread();
            match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt.block_on(control_plane(shared, listen, heartbeat, stop)),
                Err(e) => tracing::error!("control plane: {e}"),
            }
        })?
    };
    let bgp = {
        let (shared, stop, heartbeat) = (
            Arc::clone(&shared),
            Arc::clone(&stop),
            Arc::clone(&dp.heartbeat),
        );
        spawn("bgp", "BGP controller", move || {
            tasks::bgp::controller(&shared, &heartbeat, &stop)
        })?
    };
    // The next hop, checked again until the datapath stops.
    let gateway = {
        let (shared, dp_stop) = (Arc::clone(&shared), Arc::clone(&dp_stop));
        spawn("gateway", "gateway", move || {
            crate::gateway::watch(&shared.gateway, &shared.control, &dp_stop)
        })?
    };
    let drainer = {
        let (shared, stop, dp_stop) =
            (Arc::clone(&shared), Arc::clone(&stop), Arc::clone(&dp_stop));
        spawn("drain", "graceful-stop", move || {
            graceful_stop(&shared, bgp, &stop, &dp_stop)
        })?
    };
    // Packet-tracer reports, until the datapath stops.
    let reporter = dp
        .tracer()
        .map(|t| {
            let name = tasks::tracer::machine_name(&cfg);
            tasks::tracer::spawn(
                Arc::clone(t),
                name,
                Arc::clone(&tables),
                Arc::clone(&dp_stop),
            )
        })
        .transpose()
        .map_err(|tasks::tracer::ReporterError::Spawn(source)| Error::Spawn {
            what: "packet-tracer reporter",
            source,
        })?;
    crate::notify::spawn(&dp.heartbeat, &stop);
    tracing::info!(
        interface,
        ?driver,
        "forwarding; stop with SIGINT or SIGTERM, reload with SIGHUP"
    );
    let res = match opened.ports {
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

/// Starts a thread of the daemon named `name`; an error says `what` it is.
fn spawn<T: Send + 'static>(
    name: &str,
    what: &'static str,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<std::thread::JoinHandle<T>, Error> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .map_err(|source| Error::Spawn { what, source })
}

/// The control plane's tasks on the `control` thread's runtime, until
/// `stop`: the health checks, the `[fleet]` peers (checking them, and
/// answering their probes while the datapath's `heartbeat` advances),
/// reloads on SIGHUP and the HTTP API.
async fn control_plane(
    shared: Arc<Shared>,
    listener: Option<std::net::TcpListener>,
    heartbeat: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
) {
    tokio::spawn(tasks::health::manager(
        Arc::clone(&shared),
        Arc::clone(&stop),
    ));
    tokio::spawn(tasks::peers::manager(
        Arc::clone(&shared),
        Arc::clone(&stop),
    ));
    tokio::spawn(tasks::peers::responder(
        Arc::clone(&shared),
        heartbeat,
        Arc::clone(&stop),
    ));
    if shared.etcd.is_some() {
        tokio::spawn(tasks::etcd::follow(Arc::clone(&shared), Arc::clone(&stop)));
    }
    if let Ok(mut hup) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        let s = Arc::clone(&shared);
        tokio::spawn(async move {
            while hup.recv().await.is_some() {
                let _ = crate::reload::reload(&s);
            }
        });
    }
    if let Some(listener) = listener {
        let addr = listener
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_default();
        tracing::info!(%addr, "HTTP API: {}", http::summary());
        tokio::spawn(http::serve(
            listener,
            http::router(Arc::clone(&shared)),
            Arc::clone(&stop),
            Arc::clone(&shared.api_connections),
        ));
    }
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Packets forwarded for VIPs so far (the traffic a drain waits out; the
/// kernel's own traffic, such as BGP and BFD, does not count).
fn vip_packets(shared: &Shared) -> u64 {
    shared
        .datapath
        .counters()
        .per_vip
        .iter()
        .map(|t| t.packets)
        .sum()
}

/// The graceful stop (Maglev section 3.4: "draining traffic from each one
/// a few moments beforehand"): once `stop` is set, waits for the BGP
/// controller to withdraw the VIPs, then lets the datapath forward until
/// no VIP packet has come for `[bgp] drain_quiet_ms` (the router has moved
/// the flows to the other load balancers), at most `[bgp] drain_ms`, and
/// sets `dp_stop`. Without `[bgp]` (nothing to withdraw) it stops at once.
fn graceful_stop(
    shared: &Shared,
    bgp: std::thread::JoinHandle<bool>,
    stop: &AtomicBool,
    dp_stop: &AtomicBool,
) {
    while !stop.load(Ordering::Acquire) && !dp_stop.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(20));
    }
    // The drain's time counts from the signal, withdrawal included.
    let start = Instant::now();
    let cfg = shared
        .control
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .config()
        .bgp
        .clone();
    // `/status` says so from now on (the API answers until the end).
    shared
        .stopping
        .begin(cfg.as_ref().map_or(0, |b| b.drain_ms));
    // The controller withdraws on its way out, within a bounded time
    // whatever BIRD does (tasks::bgp::withdraw_budget), and says whether
    // the router may have been sending traffic here (BIRD announced at
    // its last step, or fastpath meant it to): then the datapath drains.
    // A controller that panicked is taken to have announced.
    let was_announced = bgp.join().unwrap_or(true);
    shared.stopping.withdrawn_if_not_said();
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
