//! The switch's settings ([`Config`]) and its TOML file ([`FileConfig`]).

use std::path::{Path, PathBuf};
use std::time::Duration;

/// The longest `poll_us` and `memif_moderation_us` a switch takes, from
/// its file or the command line: one second.
pub const MAX_INTERVAL_US: u64 = 1_000_000;

/// Switch settings.
#[derive(Clone, Debug)]
pub struct Config {
    /// Control socket (attach, status); none: no outside ports.
    pub socket: Option<PathBuf>,
    /// memif server socket; none: no memif.
    pub memif_socket: Option<PathBuf>,
    /// Keep polling this long after the last work before sleeping.
    pub poll_us: u64,
    /// Forget a MAC address not seen for this long.
    pub aging: Duration,
    /// Addresses learned at most (beyond: flood).
    pub max_macs: usize,
    /// Log ports as they come and go.
    pub log_ports: bool,
    /// memif interrupt moderation (zero: off). Off, a memif client
    /// signals the switch after every burst it sends once the switch has
    /// gone to sleep. On, a sleeping switch masks those interrupts and looks
    /// at its memif rings again this long after it fell asleep, so a busy
    /// client fills a batch instead of waking it per burst; after
    /// [`QUIET_WAKES`](crate::ports::memif::QUIET_WAKES) empty looks in a row it unmasks them and
    /// sleeps until one comes. For a switch that shares its core with the
    /// peers it serves: a wake-up per burst there preempts the sender it is
    /// waiting for.
    pub memif_moderation: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            socket: None,
            memif_socket: None,
            poll_us: 20,
            aging: Duration::from_secs(300),
            max_macs: 65536,
            log_ports: true,
            memif_moderation: Duration::ZERO,
        }
    }
}

/// Errors loading the switch's TOML file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("reading switch settings {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML, or has unknown keys or wrong types.
    #[error("{}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// What and where, as the TOML parser says.
        #[source]
        source: toml::de::Error,
    },
    /// `poll_us` is above one second.
    #[error("{}: poll_us and memif_moderation_us must be at most 1000000", path.display())]
    PollUs {
        /// The file.
        path: PathBuf,
    },
    /// `aging_s` is zero.
    #[error("{}: aging_s must be at least 1", path.display())]
    AgingS {
        /// The file.
        path: PathBuf,
    },
}

/// The switch's TOML file (every key optional; unknown keys are errors).
///
/// ```toml
/// socket = "/run/fastpath/switch.sock"   # control socket (attach, status)
/// memif_socket = "/run/fastpath/memif.sock"
/// taps = ["fptap0"]                      # TAP ports to create
/// poll_us = 20                           # poll this long before sleeping
/// memif_moderation_us = 0                # > 0: memif interrupt moderation
/// aging_s = 300                          # MAC aging
/// max_macs = 65536
/// ```
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// Control socket (attach, status).
    pub socket: Option<PathBuf>,
    /// memif server socket.
    pub memif_socket: Option<PathBuf>,
    /// TAP ports to create (or open).
    #[serde(default)]
    pub taps: Vec<String>,
    /// Keep polling this long (microseconds) before sleeping; at most 1 s.
    pub poll_us: Option<u64>,
    /// memif interrupt moderation in microseconds (0: off); at most 1 s.
    pub memif_moderation_us: Option<u64>,
    /// MAC aging in seconds; at least 1.
    pub aging_s: Option<u64>,
    /// Addresses learned at most.
    pub max_macs: Option<usize>,
}

impl FileConfig {
    /// Read and check a settings file.
    pub fn load(path: &Path) -> Result<FileConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let c: FileConfig = toml::from_str(&text).map_err(|source| ConfigError::Parse {
            path: path.to_path_buf(),
            source,
        })?;
        if c.poll_us.is_some_and(|p| p > MAX_INTERVAL_US)
            || c.memif_moderation_us.is_some_and(|p| p > MAX_INTERVAL_US)
        {
            return Err(ConfigError::PollUs {
                path: path.to_path_buf(),
            });
        }
        if c.aging_s == Some(0) {
            return Err(ConfigError::AgingS {
                path: path.to_path_buf(),
            });
        }
        Ok(c)
    }

    /// Overlay onto defaults.
    pub fn config(&self) -> Config {
        let d = Config::default();
        Config {
            socket: self.socket.clone(),
            memif_socket: self.memif_socket.clone(),
            poll_us: self.poll_us.unwrap_or(d.poll_us),
            aging: self.aging_s.map(Duration::from_secs).unwrap_or(d.aging),
            max_macs: self.max_macs.unwrap_or(d.max_macs),
            log_ports: true,
            memif_moderation: self
                .memif_moderation_us
                .map(Duration::from_micros)
                .unwrap_or(d.memif_moderation),
        }
    }
}
