//! From a path to a configuration the load balancer can start with: the one
//! function that `fastpath lb check-config`, the start of `fastpath lb run`
//! and every reload (SIGHUP, `POST /reload`) call, so that what one accepts
//! the others start with.
//!
//! [`Config::load`] reads the file (a regular file of at most
//! [`MAX_CONFIG_BYTES`]), parses and validates its text
//! ([`Config::parse_with`]), then checks what lies outside the text: the
//! files it names and the memory the forwarder would allocate.
//!
//! - `[api] token_file` must be a regular file of at most
//!   [`MAX_TOKEN_FILE_BYTES`] whose first line, trimmed, holds at least
//!   [`MIN_TOKEN_CHARS`] characters ([`read_token`], what the daemon reads).
//! - `[bgp] vips_file` is replaced whole by the daemon, so a path that
//!   names someone else's file must not be accepted: it may be missing
//!   (the daemon creates it), or be a regular file that is empty or whose
//!   first line is a comment naming fastpath (what the daemon writes,
//!   [`VIPS_FILE_HEADER`], or a placeholder such as `# filled in by
//!   fastpath` written before BIRD first starts). `/etc/passwd` is refused.
//! - Every VIP can be served: its pool has a backend of weight above 0
//!   ([`Config::check_servable`]; a pool whose last backends are drained
//!   is an operator's maintenance, and a warning), and `[fleet]` peers are
//!   off loopback ([`Config::check_runnable`]).
//! - The memory the forwarder would allocate ([`Config::memory_estimate`])
//!   must fit what this process may have ([`machine_memory`]): the
//!   machine's available memory plus what the process already holds, and
//!   no more than its `RLIMIT_AS` or its cgroup's `memory.max` allow. A
//!   refusal names the largest parts.

use std::io::Read;
use std::path::Path;

use serde::Serialize;

use super::{Config, ConfigError, ParseCache};

/// The largest configuration file: 64 MiB (the largest configuration
/// measured, 1,000 VIPs over 1,000 pools of 100 backends, is 3.3 MB).
pub const MAX_CONFIG_BYTES: u64 = 64 << 20;

/// The largest `[api] token_file`: 4 KiB (a token is one line).
pub const MAX_TOKEN_FILE_BYTES: u64 = 4096;

/// The shortest bearer token, in characters.
pub const MIN_TOKEN_CHARS: usize = 16;

/// The first line of the routes file the daemon writes (`[bgp] vips_file`).
pub const VIPS_FILE_HEADER: &str = "# Written by fastpath: the VIPs it announces. Do not edit.\n";

/// Bytes of one packet buffer in the forwarder's pool, and its state byte.
const BUFFER_BYTES: u64 = 2048 + 1;

/// A configuration ready to start with: validated, the files it names
/// checked, its memory estimated and found to fit.
#[derive(Debug, Clone)]
pub struct Checked {
    /// The configuration.
    pub config: Config,
    /// The file's text, as read.
    pub text: String,
    /// What the forwarder would allocate for it.
    pub memory: MemoryEstimate,
    /// What this process may have, when the system says.
    pub machine: Option<MachineMemory>,
    /// What deserves a look but does not stop a start.
    pub warnings: Vec<String>,
}

impl Checked {
    /// The same configuration with `threads` packet threads (the command
    /// line's `--threads`), checked again as the file would be: the
    /// `[forwarder]` sizes against the new count (a pool left out of the
    /// file follows it; one written in it must fill its queues) and the
    /// memory. `file` names the configuration in errors, which say that
    /// the count came from the command line.
    pub fn with_threads(mut self, threads: usize, file: &str) -> Result<Checked, ConfigError> {
        if threads == self.config.forwarder.threads {
            return Ok(self);
        }
        self.config.forwarder.threads = threads;
        let from_command_line = |mut e: ConfigError| {
            e.problem = format!("{} (with --threads {threads})", e.problem);
            e
        };
        self.config
            .validate_forwarder(file)
            .map_err(from_command_line)?;
        let (memory, machine, warnings) =
            self.config.check_memory(file).map_err(from_command_line)?;
        self.memory = memory;
        self.machine = machine;
        self.warnings = warnings;
        Ok(self)
    }
}

/// Why a bearer token file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The file could not be opened (missing, not permitted).
    #[error("cannot open {path}: {source}")]
    Open {
        /// The file.
        path: std::path::PathBuf,
        /// The system's answer.
        #[source]
        source: std::io::Error,
    },
    /// A directory, a device (`/dev/zero`), a pipe...
    #[error("{path} is not a regular file")]
    NotAFile {
        /// The file.
        path: std::path::PathBuf,
    },
    /// Larger than a token file can be.
    #[error("{path} holds {len} bytes, more than a token file's {MAX_TOKEN_FILE_BYTES}")]
    TooLarge {
        /// The file.
        path: std::path::PathBuf,
        /// Its size.
        len: u64,
    },
    /// The file could not be read, or is not UTF-8.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: std::path::PathBuf,
        /// The system's answer.
        #[source]
        source: std::io::Error,
    },
    /// The first line, trimmed, is too short to be a secret.
    #[error("the token in {path} (its first line, trimmed) is shorter than {MIN_TOKEN_CHARS} characters")]
    TooShort {
        /// The file.
        path: std::path::PathBuf,
    },
}

/// Reads a regular file of at most `max` bytes whole. Whether it is a
/// regular file is asked before opening it (opening a FIFO waits for a
/// writer) and again of the opened file, whose size bounds the read.
fn read_bounded(path: &Path, max: u64) -> Result<Vec<u8>, ReadError> {
    let f = open_regular(path)?;
    let meta = f.metadata().map_err(ReadError::Read)?;
    if meta.len() > max {
        return Err(ReadError::TooLarge(meta.len()));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    f.take(max.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(ReadError::Read)?;
    if bytes.len() as u64 > max {
        return Err(ReadError::TooLarge(bytes.len() as u64));
    }
    Ok(bytes)
}

/// [`read_bounded`] for the sections' own small files (a QUIC-LB key):
/// the bytes, or why not in words.
pub(super) fn read_small_file(path: &Path, max: u64) -> Result<Vec<u8>, String> {
    read_bounded(path, max).map_err(|e| match e {
        ReadError::Open(e) => format!("cannot open: {e}"),
        ReadError::NotAFile => "not a regular file".into(),
        ReadError::TooLarge(len) => format!("{len} bytes, more than {max}"),
        ReadError::Read(e) => format!("cannot read: {e}"),
    })
}

/// Opens `path` if it is a regular file (following links).
fn open_regular(path: &Path) -> Result<std::fs::File, ReadError> {
    if !std::fs::metadata(path).map_err(ReadError::Open)?.is_file() {
        return Err(ReadError::NotAFile);
    }
    let f = std::fs::File::open(path).map_err(ReadError::Open)?;
    if !f.metadata().map_err(ReadError::Read)?.is_file() {
        return Err(ReadError::NotAFile);
    }
    Ok(f)
}

enum ReadError {
    Open(std::io::Error),
    NotAFile,
    TooLarge(u64),
    Read(std::io::Error),
}

/// Reads a bearer token: the first line of a regular file of at most
/// [`MAX_TOKEN_FILE_BYTES`], trimmed, at least [`MIN_TOKEN_CHARS`]
/// characters. Validation ([`Config::load`]) and the daemon both read it
/// with this.
pub fn read_token(path: &Path) -> Result<String, TokenError> {
    let p = || path.to_path_buf();
    let bytes = read_bounded(path, MAX_TOKEN_FILE_BYTES).map_err(|e| match e {
        ReadError::Open(source) => TokenError::Open { path: p(), source },
        ReadError::NotAFile => TokenError::NotAFile { path: p() },
        ReadError::TooLarge(len) => TokenError::TooLarge { path: p(), len },
        ReadError::Read(source) => TokenError::Read { path: p(), source },
    })?;
    let text = String::from_utf8(bytes).map_err(|e| TokenError::Read {
        path: p(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
    })?;
    let token = text.lines().next().unwrap_or("").trim().to_string();
    if token.chars().count() < MIN_TOKEN_CHARS {
        return Err(TokenError::TooShort { path: p() });
    }
    Ok(token)
}

/// Whether the daemon may replace `path` with its routes (see the module
/// documentation); why not otherwise.
fn check_vips_file(path: &Path) -> Result<(), String> {
    let shown = path.display();
    let f = match open_regular(path) {
        Ok(f) => f,
        Err(ReadError::Open(e)) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(ReadError::NotAFile) => {
            return Err(format!(
                "{shown} is not a regular file; fastpath writes its routes there"
            ))
        }
        Err(ReadError::Open(e) | ReadError::Read(e)) => {
            return Err(format!("cannot read {shown}: {e}"))
        }
        Err(ReadError::TooLarge(_)) => return Err(format!("cannot read {shown}")),
    };
    // Only the first line matters.
    let mut first = Vec::new();
    f.take(4096)
        .read_to_end(&mut first)
        .map_err(|e| format!("cannot read {shown}: {e}"))?;
    let line = first.split(|&b| b == b'\n').next().unwrap_or(&[]);
    let line = String::from_utf8_lossy(line);
    if first.is_empty() || (line.starts_with('#') && line.contains("fastpath")) {
        return Ok(());
    }
    Err(format!(
        "{shown} exists and was not written by fastpath (its first line is not a comment \
         naming fastpath, like {:?}): fastpath replaces this file whole, so name a file \
         of its own (e.g. /run/fastpath/vips.conf)",
        VIPS_FILE_HEADER.trim_end()
    ))
}

/// One part of what the forwarder allocates.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MemoryPart {
    /// The key that sizes it (`conntrack.size`).
    pub key: &'static str,
    /// What it is, with the figures that size it.
    pub what: String,
    /// Bytes.
    pub bytes: u64,
}

/// What the forwarder allocates for a configuration, part by part: the
/// packet pool, the queues and AF_XDP buffers, the connection and fragment
/// tables of every packet thread, and the Maglev tables of the pools VIPs
/// serve (twice: a reload builds the new ones beside the running ones).
/// An estimate of the large allocations, not of every byte.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Default)]
pub struct MemoryEstimate {
    /// The parts, in the order of the file's sections.
    pub parts: Vec<MemoryPart>,
}

impl MemoryEstimate {
    /// All parts together.
    pub fn total(&self) -> u64 {
        self.parts
            .iter()
            .fold(0u64, |t, p| t.saturating_add(p.bytes))
    }

    /// The parts, largest first.
    pub fn largest(&self) -> Vec<&MemoryPart> {
        let mut v: Vec<&MemoryPart> = self.parts.iter().collect();
        v.sort_by_key(|p| std::cmp::Reverse(p.bytes));
        v
    }

    /// Whether it fits `machine`; an error naming the largest parts if not.
    pub fn fits(&self, machine: &MachineMemory) -> Result<(), (&'static str, String)> {
        let total = self.total();
        if total <= machine.bytes {
            return Ok(());
        }
        let largest = self.largest();
        let parts: Vec<String> = largest
            .iter()
            .take(3)
            .filter(|p| p.bytes > 0)
            .map(|p| format!("{} {} ({})", p.key, human(p.bytes), p.what))
            .collect();
        Err((
            largest.first().map_or("forwarder", |p| p.key),
            format!(
                "the forwarder would allocate about {}, more than the {} this process may have \
                 ({}); the largest parts: {}",
                human(total),
                human(machine.bytes),
                machine.source,
                parts.join("; ")
            ),
        ))
    }
}

/// Bytes for people: `1.5 GiB`.
pub(crate) fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// What this process may allocate, and which limit says so.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MachineMemory {
    /// Bytes.
    pub bytes: u64,
    /// The limit: `MemAvailable`, `RLIMIT_AS`, a cgroup's `memory.max`.
    pub source: String,
}

/// A `/proc` status field in kB (`VmRSS:  1234 kB`), as bytes.
fn kb_field(text: &str, field: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|r| r.trim_start_matches(':').split_whitespace().next())
        .and_then(|v| v.parse::<u64>().ok())
        .map(|kb| kb.saturating_mul(1024))
}

/// What this process may allocate, the smallest of: the machine's
/// available memory (`MemAvailable`) plus what the process already holds
/// (a reload reuses the running forwarder's allocations), the soft
/// `RLIMIT_AS`, and the room under every cgroup v2 `memory.max` above it
/// (plus what the process holds). `None` when the system says nothing.
pub fn machine_memory() -> Option<MachineMemory> {
    let read = |p: &str| std::fs::read_to_string(p).ok();
    let own = read("/proc/self/status")
        .and_then(|s| kb_field(&s, "VmRSS"))
        .unwrap_or(0);
    let mut best: Option<MachineMemory> = None;
    let mut offer = |bytes: u64, source: String| {
        if best.as_ref().is_none_or(|b| bytes < b.bytes) {
            best = Some(MachineMemory { bytes, source });
        }
    };
    if let Some(avail) = read("/proc/meminfo").and_then(|m| kb_field(&m, "MemAvailable")) {
        offer(
            avail.saturating_add(own),
            format!(
                "MemAvailable {}, with the {} this process holds",
                human(avail),
                human(own)
            ),
        );
    }
    if let Some(limit) = read("/proc/self/limits").and_then(|l| {
        l.lines()
            .find_map(|l| l.strip_prefix("Max address space"))
            .and_then(|r| r.split_whitespace().next())
            .and_then(|soft| soft.parse::<u64>().ok())
    }) {
        offer(limit, "RLIMIT_AS".into());
    }
    if let Some(path) = read("/proc/self/cgroup").and_then(|c| {
        c.lines()
            .find_map(|l| l.strip_prefix("0::"))
            .map(|p| p.trim().to_string())
    }) {
        let mut dir = std::path::PathBuf::from("/sys/fs/cgroup");
        dir.push(path.trim_start_matches('/'));
        for d in dir
            .ancestors()
            .take_while(|d| d.starts_with("/sys/fs/cgroup"))
        {
            let file = |f: &str| read(&d.join(f).display().to_string());
            let Some(max) = file("memory.max").and_then(|m| m.trim().parse::<u64>().ok()) else {
                continue;
            };
            let current = file("memory.current")
                .and_then(|c| c.trim().parse::<u64>().ok())
                .unwrap_or(0);
            offer(
                max.saturating_sub(current).saturating_add(own),
                format!("memory.max of cgroup {}", d.display()),
            );
        }
    }
    best
}

impl Config {
    /// Reads, validates and checks a configuration file: the one way from
    /// a path to a configuration to start with (see the module
    /// documentation). `fastpath lb check-config` prints what it returns.
    pub fn load(path: &Path) -> Result<Checked, ConfigError> {
        Config::load_with(path, &mut ParseCache::new())
    }

    /// [`Config::load`] parsing through `cache`: the daemon's start and
    /// reloads keep one, so that a reload parses only what changed.
    pub fn load_with(path: &Path, cache: &mut ParseCache) -> Result<Checked, ConfigError> {
        let text = Config::read(path)?;
        let file = path.display().to_string();
        let mut checked = Config::check_text(text, &file, cache)?;
        let warnings = checked.config.check_runnable(&file)?;
        checked.warnings.extend(warnings);
        Ok(checked)
    }

    /// What a file loaded to run needs beyond [`Config::validate`]: VIPs
    /// that can be served ([`Config::check_servable`]) and `[fleet]` peers
    /// off loopback. Validation alone also accepts models (of a fleet on
    /// one machine, of a pool drained at runtime) that a file to run with
    /// may not be.
    /// Returns what deserves a look but does not stop a start.
    pub fn check_runnable(&self, file: &str) -> Result<Vec<String>, ConfigError> {
        let warnings = self.check_servable(file)?;
        self.check_peers_reachable().map_err(|p| ConfigError {
            file: file.into(),
            key: p.key,
            problem: p.problem,
        })?;
        // The QUIC-LB keys a file names are read where it is checked, so
        // that check-config, the start and a reload refuse one that cannot
        // be read alike.
        self.quic_configs().map_err(|e| ConfigError {
            file: file.into(),
            key: "quic_lb".into(),
            problem: e.to_string(),
        })?;
        Ok(warnings)
    }

    /// Whether every VIP's pool has a backend that takes new connections
    /// (a weight above 0 and not drained, as the tables flatten it). A
    /// pool whose every backend has weight 0, none drained, can never
    /// serve its VIP: refused where a file is loaded (check-config, the
    /// start, a reload). A pool whose last backends are drained is an
    /// operator's act (`fastpath lb drain`, written to the file by the
    /// daemon, for maintenance), undone by an undrain: it is a warning,
    /// so that a reload or a restart during the maintenance still works.
    pub fn check_servable(&self, file: &str) -> Result<Vec<String>, ConfigError> {
        let mut warnings = Vec::new();
        let index = self.pool_index();
        let mut seen = std::collections::HashSet::new();
        for (i, v) in self.vips.iter().enumerate() {
            if !seen.insert(v.pool.as_str()) {
                continue;
            }
            // Validated: the pool exists and its includes resolve.
            let Ok(members) = self.members_as_written(&index, &v.pool) else {
                continue;
            };
            if members.is_empty() || members.iter().any(|(b, drained)| b.weight > 0 && !drained) {
                continue;
            }
            let drained = members.iter().filter(|(_, d)| *d).count();
            let weightless = members.len() - drained;
            if drained > 0 {
                warnings.push(format!(
                    "VIP {:?} is served by no backend: pool {:?}'s {} backends are drained or of \
                     weight 0 ({drained} drained); `fastpath lb undrain BACKEND` ends the \
                     maintenance",
                    v.name,
                    v.pool,
                    members.len()
                ));
                continue;
            }
            return Err(ConfigError {
                file: file.into(),
                key: format!("vips[{i}].pool"),
                problem: format!(
                    "VIP {:?} can never be served: none of pool {:?}'s {} backends takes new \
                     connections ({weightless} of weight 0, includes counted); give one a \
                     weight above 0",
                    v.name,
                    v.pool,
                    members.len()
                ),
            });
        }
        Ok(warnings)
    }

    /// [`Config::load_with`] of a text already read (a runtime change's
    /// edit of the file); `file` names it in errors. It does not ask
    /// [`Config::check_servable`]: a runtime drain may empty a pool.
    pub fn check_text(
        text: String,
        file: &str,
        cache: &mut ParseCache,
    ) -> Result<Checked, ConfigError> {
        let config = Config::parse_with(&text, file, cache)?;
        let err = |key: &str, problem: String| ConfigError {
            file: file.into(),
            key: key.into(),
            problem,
        };
        if let Some(t) = &config.api.token_file {
            read_token(t).map_err(|e| err("api.token_file", e.to_string()))?;
        }
        if let Some(b) = &config.bgp {
            check_vips_file(&b.vips_file).map_err(|e| err("bgp.vips_file", e))?;
            // The IPv6 routes file is replaced whole too.
            check_vips_file(&b.routes_file6()).map_err(|e| err("bgp.vips_file6", e))?;
        }
        let (memory, machine, warnings) = config.check_memory(file)?;
        Ok(Checked {
            config,
            text,
            memory,
            machine,
            warnings,
        })
    }

    /// What the forwarder would allocate, and whether it fits what this
    /// process may have (see the module documentation), with a warning
    /// when it takes more than half.
    fn check_memory(
        &self,
        file: &str,
    ) -> Result<(MemoryEstimate, Option<MachineMemory>, Vec<String>), ConfigError> {
        let memory = self.memory_estimate();
        let machine = machine_memory();
        let mut warnings = Vec::new();
        if let Some(m) = &machine {
            memory.fits(m).map_err(|(key, problem)| ConfigError {
                file: file.into(),
                key: key.into(),
                problem,
            })?;
            if memory.total() > m.bytes / 2 {
                warnings.push(format!(
                    "the forwarder would take {} of the {} this process may have ({})",
                    human(memory.total()),
                    human(m.bytes),
                    m.source
                ));
            }
        }
        Ok((memory, machine, warnings))
    }

    /// A configuration file's text, or an error naming the file: a regular
    /// file (not a directory, not `/dev/zero`) of at most
    /// [`MAX_CONFIG_BYTES`], in UTF-8.
    pub fn read(path: &Path) -> Result<String, ConfigError> {
        let err = |problem: String| ConfigError {
            file: path.display().to_string(),
            key: "(file)".into(),
            problem,
        };
        let bytes = read_bounded(path, MAX_CONFIG_BYTES).map_err(|e| match e {
            ReadError::Open(e) | ReadError::Read(e) => err(format!("cannot read: {e}")),
            ReadError::NotAFile => err("cannot read: not a regular file".into()),
            ReadError::TooLarge(len) => err(format!(
                "cannot read: {len} bytes, more than a configuration's {MAX_CONFIG_BYTES}"
            )),
        })?;
        String::from_utf8(bytes).map_err(|e| err(format!("cannot read: not UTF-8 ({e})")))
    }

    /// What the forwarder would allocate for this configuration
    /// ([`MemoryEstimate`]), from its sizes alone.
    pub fn memory_estimate(&self) -> MemoryEstimate {
        let f = &self.forwarder;
        let threads = f.threads as u64;
        let workers = threads.max(1);
        let queue = f.queue_size as u64;
        let mul = |a: u64, b: u64| a.saturating_mul(b);
        let mut parts = vec![
            MemoryPart {
                key: "forwarder.pool_buffers",
                what: format!("{} packet buffers of 2 KiB", f.pool_buffers()),
                bytes: mul(u64::from(f.pool_buffers()), BUFFER_BYTES),
            },
            MemoryPart {
                key: "forwarder.queue_size",
                what: format!("queues of {queue} and AF_XDP buffers for {workers} packet threads"),
                bytes: mul(threads, mul(2 * queue.max(2), 8)).saturating_add(mul(
                    workers,
                    mul(
                        u64::from(netio::afxdp::BUFFERS_NEEDED).saturating_add(mul(4, queue)),
                        BUFFER_BYTES,
                    ),
                )),
            },
            MemoryPart {
                key: "conntrack.size",
                what: format!(
                    "connection tables of {} entries for {workers} packet threads",
                    self.conntrack.size
                ),
                bytes: mul(
                    workers,
                    crate::conntrack::Conntrack::bytes_for(self.conntrack.size),
                ),
            },
            MemoryPart {
                key: "forwarder.frag_table_size",
                what: format!(
                    "fragment tables of {} entries for {workers} packet threads",
                    f.frag_table_size
                ),
                bytes: mul(
                    workers,
                    crate::frag::FragTable::bytes_for(f.frag_table_size),
                ),
            },
        ];
        // One table per pool that VIPs serve, however many VIPs share it.
        let index = self.pool_index();
        let mut served = std::collections::HashSet::new();
        let mut slots = 0u64;
        for v in &self.vips {
            if let Some(p) = index.get(v.pool.as_str()) {
                if served.insert(p.name.as_str()) {
                    slots = slots.saturating_add(p.table_size);
                }
            }
        }
        // Four bytes an entry and a bit a slot; twice, during a reload.
        parts.push(MemoryPart {
            key: "pools.table_size",
            what: format!(
                "Maglev tables of {} pools served by VIPs, {slots} slots, twice during a reload",
                served.len()
            ),
            bytes: mul(2, mul(slots, 4).saturating_add(slots.div_ceil(8))),
        });
        MemoryEstimate { parts }
    }
}
