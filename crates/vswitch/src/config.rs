//! The switch's settings ([`Config`]) and its TOML file ([`FileConfig`]),
//! with the vhost-user ports either may list ([`VhostUserEntry`]).

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::bridge::parse_mac;
pub use crate::polling::MAX_WINDOW_US;
use crate::ports::vhost;

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
    /// Keep polling at least this long after the last work before
    /// sleeping (the floor; all there is with adaptive windows off).
    pub poll_us: u64,
    /// The longest adaptive polling window a port may learn, microseconds:
    /// the switch keeps polling after a port's last frame for as long as
    /// the gaps between its frames say more is coming (twice their 98th
    /// percentile), at most this long ([`crate::polling`]). At or below
    /// `poll_us`: windows off, the switch polls `poll_us` after any work.
    pub poll_max_us: u64,
    /// Polling past `poll_us` that finds nothing (the window ran out and
    /// the switch slept) uses at most this percent of a core averaged over
    /// a second; 0: windows off.
    pub poll_budget_pct: u8,
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
    /// vhost-user ports: one socket each, where QEMU connects for one
    /// virtual machine's NIC.
    pub vhost_user: Vec<vhost::Config>,
    /// Ring ports (by name; `*`: every one) that may attach without being
    /// locked to a MAC address, for a port that bridges other stations.
    /// Every other ring port must name its MAC when it attaches, and is
    /// locked to it (port security), as VM ports are: a port that could
    /// send from any address could take any other port's traffic.
    pub ring_unlocked: Vec<String>,
}

impl Config {
    /// The polling settings the event loop runs with.
    pub fn polling(&self) -> crate::polling::Settings {
        crate::polling::Settings {
            floor_ns: self.poll_us.saturating_mul(1000),
            max_ns: self.poll_max_us.saturating_mul(1000),
            budget_pct: self.poll_budget_pct,
        }
    }

    /// Checks the configuration ([`Config::check`]: no path given twice)
    /// and claims each of its socket paths ([`crate::sockets::claim`]),
    /// before the switch binds them.
    pub fn claim_sockets(&self) -> Result<crate::Sockets, ConfigError> {
        self.check()?;
        let paths = self
            .socket_paths()
            .into_iter()
            .map(|(_, p)| p.to_path_buf())
            .collect();
        Ok(crate::Sockets::claim(paths)?)
    }

    /// Every socket path the switch binds, with what it is for (the
    /// control socket, the memif socket, each vhost-user port's).
    pub fn socket_paths(&self) -> Vec<(String, &Path)> {
        let mut v: Vec<(String, &Path)> = Vec::new();
        if let Some(p) = &self.socket {
            v.push(("control socket".into(), p));
        }
        if let Some(p) = &self.memif_socket {
            v.push(("memif socket".into(), p));
        }
        for c in &self.vhost_user {
            v.push((format!("socket of vhost-user port {:?}", c.name), &c.path));
        }
        v
    }

    /// Check what the settings say together, however they were put
    /// together (the file, the command line, both): no socket path given
    /// twice. The file's own checks ([`FileConfig::load`]) end here too.
    pub fn check(&self) -> Result<(), ConfigError> {
        if self.poll_us > MAX_INTERVAL_US {
            return Err(ConfigError::Polling(format!(
                "poll_us {} is above {MAX_INTERVAL_US}",
                self.poll_us
            )));
        }
        if self.poll_max_us > MAX_WINDOW_US {
            return Err(ConfigError::Polling(format!(
                "poll_max_us {} is above {MAX_WINDOW_US} (the longest window a port can learn)",
                self.poll_max_us
            )));
        }
        if self.poll_budget_pct > 100 {
            return Err(ConfigError::Polling(format!(
                "poll_budget_pct {} is above 100 (a whole core)",
                self.poll_budget_pct
            )));
        }
        let paths = self.socket_paths();
        for (i, (second, p)) in paths.iter().enumerate() {
            if let Some((first, _)) = paths[..i].iter().find(|(_, q)| same_path(q, p)) {
                return Err(ConfigError::SamePath {
                    socket: p.to_path_buf(),
                    first: first.clone(),
                    second: second.clone(),
                });
            }
        }
        Ok(())
    }
}

/// Whether two socket paths name one file: equal as given, or once the
/// directories that exist are resolved (`/run/x.sock` and `/run/./x.sock`);
/// the file itself need not exist yet.
fn same_path(a: &Path, b: &Path) -> bool {
    fn resolved(p: &Path) -> Option<PathBuf> {
        let dir = match p.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        Some(dir.canonicalize().ok()?.join(p.file_name()?))
    }
    a == b || matches!((resolved(a), resolved(b)), (Some(x), Some(y)) if x == y)
}

impl Default for Config {
    fn default() -> Self {
        Config {
            socket: None,
            memif_socket: None,
            poll_us: 20,
            poll_max_us: 200,
            poll_budget_pct: 10,
            aging: Duration::from_secs(300),
            max_macs: 65536,
            log_ports: true,
            memif_moderation: Duration::ZERO,
            vhost_user: Vec::new(),
            ring_unlocked: Vec::new(),
        }
    }
}

/// Errors loading the switch's TOML file, or in the settings themselves
/// ([`Config::check`]) and the socket paths they name
/// ([`Config::claim_sockets`]).
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
    /// A polling setting out of range.
    #[error("{0}")]
    Polling(String),
    /// `aging_s` is zero.
    #[error("{}: aging_s must be at least 1", path.display())]
    AgingS {
        /// The file.
        path: PathBuf,
    },
    /// A `[[vhost_user]]` entry is wrong.
    #[error("{}: vhost_user entry {index} (path {})", path.display(), port.display())]
    VhostUser {
        /// The file.
        path: PathBuf,
        /// The entry's place in the file, from 0.
        index: usize,
        /// Its socket path.
        port: PathBuf,
        /// What is wrong.
        #[source]
        source: VhostUserError,
    },
    /// Two sockets of the switch at one path: binding the second would
    /// unbind the first.
    #[error("{} is given twice, as the {first} and as the {second}: each socket needs a path of its own", socket.display())]
    SamePath {
        /// The path.
        socket: PathBuf,
        /// What it was given for first.
        first: String,
        /// What it was given for again.
        second: String,
    },
    /// A socket path holds something that is not ours to replace.
    #[error(transparent)]
    Socket(#[from] crate::sockets::SocketPathError),
}

/// What is wrong with a vhost-user port's settings (a `[[vhost_user]]`
/// entry, or `--vhost-user PATH,key=value,...`).
#[derive(Debug, thiserror::Error)]
pub enum VhostUserError {
    /// No name given and none can be made from the socket's file name.
    #[error("name must be 1..=64 bytes (default: the socket file's name without its extension)")]
    Name,
    /// Not a MAC address.
    #[error("mac {0:?} is not six hex bytes separated by ':' (52:54:00:12:34:56)")]
    Mac(String),
    /// A group address cannot be a NIC's.
    #[error("mac {0:?} is a group address (its first byte is odd): a NIC's address is unicast")]
    GroupMac(String),
    /// `itr` out of range.
    #[error("itr {0} is out of range 0..=65535 (units of 250 ns)")]
    Itr(u64),
    /// Not a mode.
    #[error("mode {0:?}: expected base, sc or csb")]
    Mode(String),
    /// Queue pairs out of range.
    #[error("queues {0} is out of range 1..={max} (queue pairs)", max = vhost::MAX_QUEUE_PAIRS)]
    Queues(u64),
    /// A key the spec does not have.
    #[error("unknown key {0:?} (keys: name, mode, itr, mac, port_security, event_idx, offloads, queues)")]
    Key(String),
    /// A value that does not parse.
    #[error("{key}={value:?}: expected {expected}")]
    Value {
        /// The key.
        key: String,
        /// The value as given.
        value: String,
        /// What was expected.
        expected: &'static str,
    },
    /// The socket path is empty.
    #[error("the socket path is empty")]
    Path,
}

/// A vhost-user port as the TOML file (`[[vhost_user]]`) or the command
/// line (`--vhost-user PATH,key=value,...`) gives it.
///
/// ```toml
/// [[vhost_user]]
/// path = "/run/fastpath/vm1.sock"   # QEMU: -chardev socket,path=...
/// name = "vm1"                      # default: the socket file's stem
/// mode = "csb"                      # base | sc | csb (default csb)
/// itr = 0                           # interrupt moderation, 250 ns units
/// mac = "52:54:00:00:00:01"         # the guest NIC's MAC: locks the port to it
/// port_security = true              # default true (needs mac)
/// event_idx = true                  # offer VIRTIO_RING_F_EVENT_IDX
/// offloads = true                   # offer checksum and TSO offloads
/// queues = 4                        # queue pairs offered (1..=8; QEMU's queues= at most this)
/// ```
#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VhostUserEntry {
    /// The socket QEMU connects to.
    pub path: PathBuf,
    /// The port's name.
    pub name: Option<String>,
    /// `base`, `sc` or `csb`.
    pub mode: Option<String>,
    /// Interrupt moderation in 250 ns units.
    pub itr: Option<u64>,
    /// The guest NIC's MAC.
    pub mac: Option<String>,
    /// Lock the port to its MAC (default: on).
    pub port_security: Option<bool>,
    /// Offer `EVENT_IDX` (default: on).
    pub event_idx: Option<bool>,
    /// Offer checksum and TCP segmentation offloads (default: on).
    pub offloads: Option<bool>,
    /// Queue pairs offered (default
    /// [`vhost::DEFAULT_QUEUE_PAIRS`], at most [`vhost::MAX_QUEUE_PAIRS`]).
    pub queues: Option<u64>,
}

impl VhostUserEntry {
    /// Read `PATH[,key=value]...`: the keys are those of the TOML entry.
    pub fn parse(spec: &str) -> Result<VhostUserEntry, VhostUserError> {
        let mut parts = spec.split(',');
        let path = parts.next().unwrap_or_default();
        if path.is_empty() {
            return Err(VhostUserError::Path);
        }
        let mut e = VhostUserEntry {
            path: PathBuf::from(path),
            ..VhostUserEntry::default()
        };
        let flag = |key: &str, v: &str| match v {
            "on" | "true" | "yes" | "1" => Ok(true),
            "off" | "false" | "no" | "0" => Ok(false),
            _ => Err(VhostUserError::Value {
                key: key.into(),
                value: v.into(),
                expected: "on or off",
            }),
        };
        for kv in parts {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            match k {
                "name" => e.name = Some(v.into()),
                "mode" => e.mode = Some(v.into()),
                "itr" => {
                    e.itr = Some(v.parse().map_err(|_| VhostUserError::Value {
                        key: k.into(),
                        value: v.into(),
                        expected: "a number of 250 ns units",
                    })?)
                }
                "mac" => e.mac = Some(v.into()),
                "port_security" => e.port_security = Some(flag(k, v)?),
                "event_idx" => e.event_idx = Some(flag(k, v)?),
                "offloads" => e.offloads = Some(flag(k, v)?),
                "queues" => {
                    e.queues = Some(v.parse().map_err(|_| VhostUserError::Value {
                        key: k.into(),
                        value: v.into(),
                        expected: "a number of queue pairs",
                    })?)
                }
                _ => return Err(VhostUserError::Key(k.into())),
            }
        }
        Ok(e)
    }

    /// The port's settings, checked.
    pub fn config(&self) -> Result<vhost::Config, VhostUserError> {
        if self.path.as_os_str().is_empty() {
            return Err(VhostUserError::Path);
        }
        let name = match &self.name {
            Some(n) => n.clone(),
            None => self
                .path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default(),
        };
        if name.is_empty() || name.len() > 64 {
            return Err(VhostUserError::Name);
        }
        let mut c = vhost::Config::new(&name, &self.path);
        if let Some(m) = &self.mode {
            c.mode = m.parse().map_err(|_| VhostUserError::Mode(m.clone()))?;
        }
        if let Some(i) = self.itr {
            c.itr = u32::try_from(i)
                .ok()
                .filter(|&i| i <= 65535)
                .ok_or(VhostUserError::Itr(i))?;
        }
        if let Some(m) = &self.mac {
            let mac = parse_mac(m).ok_or_else(|| VhostUserError::Mac(m.clone()))?;
            if mac[0] & 1 != 0 {
                return Err(VhostUserError::GroupMac(m.clone()));
            }
            c.mac = Some(mac);
        }
        c.port_security = self.port_security.unwrap_or(true);
        c.event_idx = self.event_idx.unwrap_or(true);
        c.offloads = self.offloads.unwrap_or(true);
        if let Some(q) = self.queues {
            c.queue_pairs = u16::try_from(q)
                .ok()
                .filter(|q| (1..=vhost::MAX_QUEUE_PAIRS).contains(q))
                .ok_or(VhostUserError::Queues(q))?;
        }
        Ok(c)
    }
}

/// The switch's TOML file (every key optional; unknown keys are errors).
///
/// ```toml
/// socket = "/run/fastpath/switch.sock"   # control socket (attach, status)
/// memif_socket = "/run/fastpath/memif.sock"
/// taps = ["fptap0"]                      # TAP ports to create
/// # vhost-user ports (QEMU guests), one table each: see VhostUserEntry
/// [[vhost_user]]
/// path = "/run/fastpath/vm1.sock"
/// mac = "52:54:00:00:00:01"
/// poll_us = 20                           # poll at least this long before sleeping
/// poll_max_us = 200                      # longest adaptive window (<= poll_us: off)
/// poll_budget_pct = 10                   # fruitless polling past poll_us, % of a core
/// memif_moderation_us = 0                # > 0: memif interrupt moderation
/// ring_unlocked = ["uplink"]             # ring ports that may bridge (not locked to a MAC)
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
    /// Keep polling at least this long (microseconds) before sleeping; at
    /// most 1 s.
    pub poll_us: Option<u64>,
    /// The longest adaptive polling window, microseconds; at most
    /// [`MAX_WINDOW_US`].
    pub poll_max_us: Option<u64>,
    /// Fruitless polling past `poll_us`, percent of a core; at most 100.
    pub poll_budget_pct: Option<u8>,
    /// memif interrupt moderation in microseconds (0: off); at most 1 s.
    pub memif_moderation_us: Option<u64>,
    /// MAC aging in seconds; at least 1.
    pub aging_s: Option<u64>,
    /// Addresses learned at most.
    pub max_macs: Option<usize>,
    /// vhost-user ports.
    #[serde(default)]
    pub vhost_user: Vec<VhostUserEntry>,
    /// Ring ports that may attach unlocked ([`Config::ring_unlocked`]).
    #[serde(default)]
    pub ring_unlocked: Vec<String>,
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
        for (index, v) in c.vhost_user.iter().enumerate() {
            v.config().map_err(|source| ConfigError::VhostUser {
                path: path.to_path_buf(),
                index,
                port: v.path.clone(),
                source,
            })?;
        }
        c.config().check()?;
        Ok(c)
    }

    /// Overlay onto defaults (the vhost-user entries were checked by
    /// [`FileConfig::load`]; one that is wrong all the same is left out).
    pub fn config(&self) -> Config {
        let d = Config::default();
        Config {
            socket: self.socket.clone(),
            memif_socket: self.memif_socket.clone(),
            poll_us: self.poll_us.unwrap_or(d.poll_us),
            poll_max_us: self.poll_max_us.unwrap_or(d.poll_max_us),
            poll_budget_pct: self.poll_budget_pct.unwrap_or(d.poll_budget_pct),
            aging: self.aging_s.map(Duration::from_secs).unwrap_or(d.aging),
            max_macs: self.max_macs.unwrap_or(d.max_macs),
            log_ports: true,
            memif_moderation: self
                .memif_moderation_us
                .map(Duration::from_micros)
                .unwrap_or(d.memif_moderation),
            vhost_user: self
                .vhost_user
                .iter()
                .filter_map(|v| v.config().ok())
                .collect(),
            ring_unlocked: self.ring_unlocked.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_annotated_example_loads() {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/switch.toml");
        let f = FileConfig::load(&p).unwrap();
        let c = f.config();
        assert_eq!(c.vhost_user.len(), 2);
        let vm1 = &c.vhost_user[0];
        assert_eq!(vm1.name, "vm1");
        assert_eq!(vm1.mac, Some([0x52, 0x54, 0, 0, 0, 1]));
        assert!(vm1.port_security);
        let vm2 = &c.vhost_user[1];
        assert_eq!(
            (vm2.name.as_str(), vm2.mode, vm2.itr),
            ("vm2", ring::Mode::Sc, 100)
        );
        assert_eq!(vm2.mac, None);
    }

    #[test]
    fn vhost_user_specs_name_what_is_wrong() {
        let c = VhostUserEntry::parse(
            "/tmp/a.sock,mode=sc,itr=100,mac=52:54:00:00:00:09,port_security=off",
        )
        .unwrap()
        .config()
        .unwrap();
        assert_eq!((c.name.as_str(), c.mode, c.itr), ("a", ring::Mode::Sc, 100));
        assert!(!c.port_security);
        assert!(c.offloads, "offloads are on by default");
        let off = VhostUserEntry::parse("/tmp/a.sock,offloads=off")
            .unwrap()
            .config()
            .unwrap();
        assert!(!off.offloads);
        let e = |s: &str| match VhostUserEntry::parse(s).and_then(|e| e.config()) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("{s} accepted"),
        };
        assert!(e("/tmp/a.sock,mode=fast").contains("base, sc or csb"));
        assert!(e("/tmp/a.sock,itr=70000").contains("0..=65535"));
        assert!(e("/tmp/a.sock,mac=01:00:00:00:00:01").contains("group address"));
        assert!(e("/tmp/a.sock,mac=52:54").contains("six hex bytes"));
        assert!(e("/tmp/a.sock,colour=red").contains("unknown key"));
        assert!(e(",mode=sc").contains("empty"));
        assert!(e("/tmp/a.sock,event_idx=maybe").contains("on or off"));
        assert!(e("/tmp/a.sock,offloads=some").contains("on or off"));
        // Queue pairs: a default, a knob, a hard cap.
        assert_eq!(off.queue_pairs, vhost::DEFAULT_QUEUE_PAIRS);
        let two = VhostUserEntry::parse("/tmp/a.sock,queues=2")
            .unwrap()
            .config()
            .unwrap();
        assert_eq!(two.queue_pairs, 2);
        assert!(e("/tmp/a.sock,queues=0").contains("queues 0 is out of range 1..=8"));
        assert!(e("/tmp/a.sock,queues=9").contains("out of range"));
        assert!(e("/tmp/a.sock,queues=70000").contains("out of range"));
        assert!(e("/tmp/a.sock,queues=two").contains("number of queue pairs"));
    }

    #[test]
    fn polling_settings_out_of_range_are_refused_naming_the_key() {
        let p = std::env::temp_dir().join(format!("fp-switch-poll-{}.toml", std::process::id()));
        let load = |text: &str| {
            std::fs::write(&p, text).unwrap();
            FileConfig::load(&p).map(|f| f.config())
        };
        let c = load("poll_us = 10\npoll_max_us = 500\npoll_budget_pct = 25\n").unwrap();
        assert_eq!((c.poll_us, c.poll_max_us, c.poll_budget_pct), (10, 500, 25));
        let s = c.polling();
        assert_eq!((s.floor_ns, s.max_ns, s.budget_pct), (10_000, 500_000, 25));
        assert!(s.adaptive());
        let d = load("").unwrap();
        assert_eq!((d.poll_max_us, d.poll_budget_pct), (200, 10));
        let e = |text: &str| crate::chain(&load(text).unwrap_err());
        assert!(e("poll_max_us = 70000\n").contains("poll_max_us 70000"));
        assert!(e("poll_budget_pct = 101\n").contains("poll_budget_pct 101"));
        assert!(e("poll_budget_pct = 300\n").contains("poll_budget_pct"));
        let _ = std::fs::remove_file(&p);
        // The same check for settings made on the command line.
        let c = Config {
            poll_max_us: 1 << 20,
            ..Config::default()
        };
        assert!(c.check().unwrap_err().to_string().contains("poll_max_us"));
        // Windows off: the fixed poll_us.
        let off = Config {
            poll_max_us: 20,
            ..Config::default()
        };
        assert!(!off.polling().adaptive());
    }

    #[test]
    fn a_wrong_vhost_user_table_names_the_file_and_entry() {
        let p = std::env::temp_dir().join(format!("fp-switch-conf-{}.toml", std::process::id()));
        std::fs::write(&p, "[[vhost_user]]\npath = \"/tmp/x.sock\"\nmac = \"zz\"\n").unwrap();
        let e = FileConfig::load(&p).unwrap_err();
        let text = crate::chain(&e);
        let _ = std::fs::remove_file(&p);
        assert!(
            text.contains("vhost_user entry 0") && text.contains("zz"),
            "{text}"
        );
    }
}
