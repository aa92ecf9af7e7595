//! The load balancer's configuration, in TOML.
//!
//! ```toml
//! [encap]
//! source = "10.0.0.1"      # outer source address for IPv4 backends
//!
//! [[pools]]
//! name = "web"
//! backends = [{ address = "10.1.0.1" }, { address = "10.1.0.2", weight = 2 }]
//!
//! [[vips]]
//! name = "http"
//! address = "192.0.2.80"
//! port = 80                # omit for an any-port VIP
//! protocol = "tcp"
//! pool = "web"
//! ```
//!
//! [`Config::load`] rejects a file whole if anything is wrong, naming the
//! file, the key and what was expected: the one function `fastpath lb
//! check-config`, `fastpath lb run` and every reload go through ([`load`]
//! says what it checks beyond the text). Every size has an upper bound
//! (`MAX_*` here), names are bounded, addresses are of the right class, and
//! pools' includes are walked without recursion, each pool once
//! ([`includes`]).
//!
//! Each section is a file of this module with its type, its defaults, its
//! keys (documented, with an example, on the type) and its check:
//! [`Forwarder`], [`Conntrack`], [`Encap`], [`Api`], [`Bgp`],
//! [`TracerConf`], [`FleetConf`], the pools ([`PoolConf`], their includes
//! in `includes`), health checks ([`HealthConf`]), VIPs and prefix
//! groups ([`VipConf`], [`PrefixGroupConf`]); the bounds they share are in
//! `limits`; what a configuration needs of the host it runs on (BIRD's
//! socket, the routes' directory, VIPs that are not the host's own, a
//! private token) is `host`, asked by `check-config --host` alone; and
//! `examples/lb.toml` is a whole file with every section.
//! Here are the whole file ([`Config`]), its parsing, and
//! [`Config::validate`], which runs each section's check in the order of
//! the file. What the tables make of a configuration (flattened pools,
//! this load balancer among its fleet, the per-flow spread of outer
//! sources) is defined with the tables (`lb::tables`), on these types: the
//! configuration is a model and its validation, and depends on nothing of
//! the datapath.

use serde::{Deserialize, Serialize};

pub use addr::{not_a_host, not_a_station, parse_mac, parse_prefix};
pub use api::Api;
pub use bgp::{bird_protocol_name, Bgp, MAX_BGP_POLL_MS, MAX_DRAIN_MS, MIN_BGP_POLL_MS};
pub use cache::{ChunkStats, ParseCache};
pub use conntrack::{Conntrack, MAX_CONNTRACK_SIZE, MIN_CONNTRACK_TIMEOUT_S};
pub use encap::{Encap, PLACEHOLDER_GATEWAY_MAC};
pub use fleet::{FleetConf, PEER_PORT};
pub use forwarder::{
    Driver, Forwarder, DEFAULT_POOL_BUFFERS, MAX_BATCH_TIMEOUT_US, MAX_FRAG_TABLE_SIZE,
    MAX_POOL_BUFFERS, MAX_QUEUE_SIZE,
};
pub use health::{CheckKind, CheckPath, HealthConf, MAX_PATH_BYTES};
pub use host::{bird_socket, HostAddresses, LocalPrefix, BIRD_SOCKET};
pub use includes::{MAX_INCLUDE_DEPTH, MAX_RESOLVED};
pub use limits::{
    LIVE_INTERVAL_MS, MAX_BACKENDS, MAX_DURATION_MS, MAX_ELEMENTS, MAX_LIST_ENTRIES, MAX_NAME_BYTES,
};
pub use load::{
    machine_memory, read_token, Checked, MachineMemory, MemoryEstimate, MemoryPart, TokenError,
    MAX_CONFIG_BYTES, MAX_TOKEN_FILE_BYTES, MIN_TOKEN_CHARS, VIPS_FILE_HEADER,
};
pub use pools::{BackendConf, PoolConf, MAX_TABLE_SIZE, MIN_SLOTS_PER_BACKEND};
pub use quic::{QuicConfError, QuicLbConf};
pub use tracer::TracerConf;
pub(crate) use vips::{key_mask, prefix_key};
pub use vips::{PrefixGroupConf, Protocol, VipConf};

use addr::{check_prefix, overlapping, overlaps, NOT_A_SOURCE, NOT_UNICAST};
use health::check_health_conf;
use limits::check_name;
use pools::BackendKey;

mod addr;
mod api;
mod bgp;
pub mod cache;
mod conntrack;
mod encap;
mod fleet;
mod forwarder;
mod health;
mod host;
mod includes;
mod limits;
mod load;
mod pools;
mod quic;
#[cfg(test)]
mod tests;
mod tracer;
mod vips;

/// A problem found by one of [`Config::validate`]'s checks: the key and
/// what is wrong; `validate` adds the file.
struct Problem {
    key: String,
    problem: String,
}

fn problem<T>(key: String, problem: String) -> Result<T, Problem> {
    Err(Problem { key, problem })
}

/// Pools that include each other in a cycle, written `a -> b -> a`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("pools include each other in a cycle: {0}")]
pub struct IncludeCycle(pub String);

/// A configuration error: the file, the key and the problem.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}: {key}: {problem}")]
pub struct ConfigError {
    /// The file (or "<string>").
    pub file: String,
    /// The key, as a TOML path (`vips[1].pool`).
    pub key: String,
    /// What is wrong and what was expected.
    pub problem: String,
}

/// The whole file.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// `[forwarder]`.
    #[serde(default)]
    pub forwarder: Forwarder,
    /// `[conntrack]`.
    #[serde(default)]
    pub conntrack: Conntrack,
    /// `[encap]`.
    #[serde(default)]
    pub encap: Encap,
    /// `[api]`.
    #[serde(default)]
    pub api: Api,
    /// `[bgp]` (no announcements when absent).
    #[serde(default)]
    pub bgp: Option<Bgp>,
    /// `[[pools]]`.
    #[serde(default)]
    pub pools: Vec<PoolConf>,
    /// `[[vips]]`.
    #[serde(default)]
    pub vips: Vec<VipConf>,
    /// `[[prefix_groups]]`.
    #[serde(default)]
    pub prefix_groups: Vec<PrefixGroupConf>,
    /// `[fleet]`: the load balancers sharing the VIPs, for fragments
    /// (none: fragments are handled here, as by a lone load balancer).
    #[serde(default)]
    pub fleet: Option<FleetConf>,
    /// `[tracer]`: packet-tracer probes (see [`crate::tracer`]).
    #[serde(default)]
    pub tracer: TracerConf,
    /// `[[quic_lb]]`: QUIC-LB configurations by codepoint, for `quic` VIPs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub quic_lb: Vec<QuicLbConf>,
}

impl Config {
    /// Parses and validates TOML text; `file` names it in errors.
    pub fn parse(text: &str, file: &str) -> Result<Config, ConfigError> {
        Config::parse_with(text, file, &mut ParseCache::new())
    }

    /// [`Config::parse`] in pieces through `cache` ([`cache`]):
    /// a reload through the cache of the last load parses only the
    /// `[[pools]]`, `[[vips]]` and `[[prefix_groups]]` elements whose text
    /// changed. Same result and same errors as parsing the whole text.
    pub fn parse_with(
        text: &str,
        file: &str,
        cache: &mut ParseCache,
    ) -> Result<Config, ConfigError> {
        let cfg = match cache.parse(text) {
            Some(cfg) => cfg,
            None => Config::from_toml(text, file)?,
        };
        cfg.validate(file)?;
        Ok(cfg)
    }

    /// [`Config::parse`] without splitting the text: one `toml` parse of
    /// the whole of it on one thread (the reference the pieces are tested
    /// against, and the benchmark's peer).
    pub fn parse_whole(text: &str, file: &str) -> Result<Config, ConfigError> {
        let cfg = Config::from_toml(text, file)?;
        cfg.validate(file)?;
        Ok(cfg)
    }

    /// The whole text through `toml`, errors naming their line.
    pub(crate) fn from_toml(text: &str, file: &str) -> Result<Config, ConfigError> {
        toml::from_str(text).map_err(|e| {
            let mut problem = e.message().trim_end().to_string();
            let key = e
                .span()
                .map(|s| {
                    // Lines before the span, plus one: `lines().count()` would
                    // miss the line when the span starts in column 0.
                    let start = s.start.min(text.len());
                    let line = text.as_bytes()[..start]
                        .iter()
                        .filter(|&&b| b == b'\n')
                        .count()
                        + 1;
                    // The line itself (or, if long, what the span covers)
                    // names the key where the parser's message does not
                    // (`duplicate key`, a value out of range).
                    let from = text[..start].rfind('\n').map_or(0, |i| i + 1);
                    let to = text[start..].find('\n').map_or(text.len(), |i| start + i);
                    let whole = text[from..to].trim();
                    let spanned = text.get(start..s.end.min(text.len())).unwrap_or("").trim();
                    let shown = if whole.chars().count() <= 80 {
                        whole
                    } else if spanned.chars().count() <= 80 && !spanned.contains('\n') {
                        spanned
                    } else {
                        ""
                    };
                    if !shown.is_empty() && !problem.contains(shown) {
                        problem = format!("{problem} (`{shown}`)");
                    }
                    format!("line {line}")
                })
                .unwrap_or_else(|| "(syntax)".into());
            ConfigError {
                file: file.into(),
                key,
                problem,
            }
        })
    }

    /// Checks everything serde cannot: references, uniqueness, ranges. The
    /// first problem found is reported, in the order of the file's sections.
    ///
    /// Every check is bounded by the sizes it checks first and walks pools
    /// and their includes without recursion, in time linear in the file,
    /// so that any text, however built, is answered quickly on any thread.
    pub fn validate(&self, file: &str) -> Result<(), ConfigError> {
        self.check_all().map_err(|p| ConfigError {
            file: file.into(),
            key: p.key,
            problem: p.problem,
        })
    }

    /// [`Config::validate`] of `[forwarder]` alone: after the thread
    /// count changed (`--threads`), the sizes that depend on it.
    pub fn validate_forwarder(&self, file: &str) -> Result<(), ConfigError> {
        self.check_forwarder().map_err(|p| ConfigError {
            file: file.into(),
            key: p.key,
            problem: p.problem,
        })
    }

    fn check_all(&self) -> Result<(), Problem> {
        self.check_counts()?;
        self.check_forwarder()?;
        self.conntrack.check()?;
        self.encap.check()?;
        self.api.check()?;
        self.tracer.check()?;
        let resolved = self.check_pools()?;
        if let Some(b) = &self.bgp {
            b.check()?;
        }
        self.check_fleet()?;
        self.check_prefix_groups()?;
        self.check_vips(&resolved)?;
        self.check_address_collisions()?;
        self.check_quic()?;
        // After the VIPs: tunnel checks need a VIP over their pool, and a
        // VIP naming a missing pool is the error to report first.
        self.check_health()
    }

    /// The keys whose change from `self` to `new` a running load balancer
    /// cannot apply (`[forwarder]`, `[conntrack]` and `[api]`: threads,
    /// queues, pool and table sizes, the API address), as `section.key`.
    /// Everything else (pools, backends, VIPs, health checks, BGP,
    /// encapsulation, `source_prefix` included) is applied by a reload.
    pub fn restart_keys(&self, new: &Config) -> Vec<String> {
        // Only the sections compared: serialising the whole configuration
        // (100,000 backends at scale) would cost a reload tens of ms.
        let sections = |c: &Config| {
            serde_json::json!({
                "fleet": c.fleet.is_some().then_some(true),
                "bgp": c.bgp.is_some().then_some(true),
                "encap": c.encap,
                "forwarder": c.forwarder,
                "conntrack": c.conntrack,
                "api": c.api,
                "tracer": c.tracer,
            })
        };
        let (old, new) = (sections(self), sections(new));
        let mut keys = Vec::new();
        // Adding or removing [fleet] changes how the daemon opens its
        // ports (one AF_XDP socket per queue only without a fleet: a
        // peer's redirects would land on other queues than their
        // datagram's); changes inside it apply live.
        if old["fleet"].is_null() != new["fleet"].is_null() {
            keys.push("fleet".to_string());
        }
        // Without [bgp] at start the daemon runs no BGP controller, so
        // adding the section waits for a restart (removing it withdraws
        // the VIPs at once).
        if old["bgp"].is_null() && !new["bgp"].is_null() {
            keys.push("bgp".to_string());
        }
        for section in ["forwarder", "conntrack", "api", "tracer"] {
            let (a, b) = (&old[section], &new[section]);
            let names: std::collections::BTreeSet<&String> = a
                .as_object()
                .into_iter()
                .chain(b.as_object())
                .flat_map(|m| m.keys())
                .collect();
            for k in names {
                if a.get(k) != b.get(k) {
                    keys.push(format!("{section}.{k}"));
                }
            }
        }
        keys
    }
}
