//! `fastpath lb config ...`: the fleet's configuration in etcd (push, diff,
//! history, rollback, hold, show), and the `--config-etcd` arguments of
//! `fastpath lb run`. The work is `fleetconf`'s; here are the arguments,
//! the one-shot runtime each command runs on, and the reports.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};
use serde::Serialize;

use crate::report::{emit, Report};
use crate::Format;

/// Where the fleet's configuration lives.
#[derive(Args, Clone)]
pub struct EtcdArgs {
    /// etcd's client URLs, comma-separated (or repeated):
    /// http://10.0.0.1:2379,http://10.0.0.2:2379,http://10.0.0.3:2379.
    #[arg(
        long = "etcd",
        value_name = "ENDPOINTS",
        num_args = 1..,
        value_delimiter = ',',
        required_unless_present = "etcd_file"
    )]
    endpoints: Vec<String>,
    /// A bootstrap file instead of --etcd: endpoints, TLS (CA, client
    /// certificate and key), a user and password file, the prefix and a
    /// deadline (see README, "Fleet configuration in etcd").
    #[arg(long, value_name = "FILE", conflicts_with = "endpoints")]
    etcd_file: Option<PathBuf>,
    /// The fleet's prefix: every key lives under it (/fastpath/edge);
    /// required unless the bootstrap file gives it.
    #[arg(long, value_name = "P")]
    prefix: Option<String>,
    /// Deadline of every call to etcd, in milliseconds (with --etcd).
    #[arg(long, value_name = "MS", default_value_t = 5000)]
    timeout_ms: u64,
}

/// A cluster to reach and the prefix to work under.
struct Target {
    access: fleetconf::Access,
    prefix: String,
}

impl EtcdArgs {
    /// The access and prefix these arguments (or the bootstrap file) give.
    fn load(&self) -> anyhow::Result<Target> {
        let b = fleetconf::Bootstrap::from_args(
            self.etcd_file.as_deref(),
            self.endpoints.clone(),
            Duration::from_millis(self.timeout_ms),
        )?;
        let prefix = self.prefix.clone().or(b.prefix).context(
            "no prefix: pass --prefix (or give `prefix` in the --etcd-file bootstrap file)",
        )?;
        let access = b.access;
        Ok(Target { access, prefix })
    }
}

/// `fastpath lb config ...`.
#[derive(Args)]
pub struct ConfigArgs {
    #[command(subcommand)]
    command: ConfigCommand,
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Validate a configuration file and write it to etcd as the fleet's
    /// new revision, in one transaction.
    ///
    /// The file is the fleet's part of the configuration: the pools, VIPs,
    /// QUIC-LB and prefix groups every load balancer serves alike (and any
    /// section they share). Each load balancer keeps its own sections
    /// ([api], [encap], [bgp], [fleet], ...) in its local file
    /// (`lb run --config-etcd ... --config LOCAL`); a top-level name is
    /// either the fleet's or the machine's, never both. With --local, the
    /// file is validated merged with that machine file, as a load balancer
    /// will merge it.
    ///
    /// The file is checked first (the same validation as check-config and
    /// the daemon); nothing is written if it is invalid. Then the keys that
    /// changed are written, the keys gone deleted and the guard key
    /// (PREFIX/meta/pushed: who, when, a hash of the text) updated, in ONE
    /// transaction that succeeds only if nothing was pushed, and no
    /// configuration key written, since this command read the prefix: two
    /// operators cannot interleave; the second is told to read again.
    ///
    /// Layout (keys under PREFIX): config/section/NAME, config/pool/NAME,
    /// config/vip/NAME, config/quic_lb/CODEPOINT, config/ARRAY/NAME,
    /// config/order (the file's order). A push changes only what differs.
    /// One that does not fit one transaction (etcd's --max-txn-ops, 128 by
    /// default, and --max-request-bytes, 1.5 MiB; pass the cluster's own
    /// if they were changed), such as the first push of a large fleet, is
    /// staged: a guarded transaction writes the marker PREFIX/meta/pushing,
    /// transactions under the marker write the keys, and the last one
    /// writes the guard key and deletes the marker. Load balancers keep
    /// running the last complete configuration while the marker is there,
    /// and apply the whole push at its last transaction. A push that
    /// stopped part-way leaves the marker (every other push is refused,
    /// saying by whom): push again with --take-over.
    ///
    /// JSON keys: prefix, revision, put[], deleted[], transactions.
    ///
    /// Examples:
    ///   fastpath lb config push fleet.toml --etcd http://10.0.0.1:2379 --prefix /fastpath/edge
    ///   fastpath lb config push fleet.toml --etcd http://10.0.0.1:2379 --prefix /fastpath/edge --local /etc/fastpath/lb.toml
    #[command(verbatim_doc_comment)]
    Push {
        /// The fleet's configuration (TOML).
        #[arg(value_name = "FILE")]
        file: PathBuf,
        #[command(flatten)]
        etcd: EtcdArgs,
        /// A machine's own file to validate the push with (merged).
        #[arg(long, value_name = "FILE")]
        local: Option<PathBuf>,
        /// Who pushes, recorded in the guard key (default: user@host).
        #[arg(long)]
        who: Option<String>,
        /// The cluster's --max-txn-ops.
        #[arg(long, default_value_t = fleetconf::ETCD_DEFAULT_MAX_TXN_OPS)]
        max_txn_ops: usize,
        /// The cluster's --max-request-bytes.
        #[arg(long, default_value_t = fleetconf::ETCD_DEFAULT_MAX_REQUEST_BYTES)]
        max_request_bytes: usize,
        /// Replace a staged push that stopped part-way (its marker,
        /// PREFIX/meta/pushing, names who started it and when).
        #[arg(long)]
        take_over: bool,
        /// Output format.
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
    /// What a push of FILE would change, key by key (nothing is written).
    ///
    /// JSON keys: prefix, revision, added[], changed[], removed[].
    /// Exits 0 whatever differs.
    ///
    /// Examples:
    ///   fastpath lb config diff fleet.toml --etcd http://10.0.0.1:2379 --prefix /fastpath/edge
    #[command(verbatim_doc_comment)]
    Diff {
        /// The fleet's configuration (TOML).
        #[arg(value_name = "FILE")]
        file: PathBuf,
        #[command(flatten)]
        etcd: EtcdArgs,
        /// Output format.
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
    /// The pushes etcd still remembers, newest first: revision, who,
    /// when, the text's hash, and which revision a rollback restored.
    ///
    /// etcd forgets old revisions when it compacts: the history ends there.
    ///
    /// JSON keys: prefix, pushes[]{revision, who, when_unix_s, hash,
    /// read_revision, rollback_of}.
    ///
    /// Examples:
    ///   fastpath lb config history --etcd http://10.0.0.1:2379 --prefix /fastpath/edge
    #[command(verbatim_doc_comment)]
    History {
        #[command(flatten)]
        etcd: EtcdArgs,
        /// At most this many pushes.
        #[arg(long, default_value_t = 20)]
        limit: usize,
        /// Output format.
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
    /// Push the configuration as it was at revision REV as a new revision.
    ///
    /// Validated and guarded like any push (a rollback to a revision that
    /// no longer validates is refused). etcd must still have REV (not
    /// compacted): `config history` lists what it has.
    ///
    /// Examples:
    ///   fastpath lb config rollback 42 --etcd http://10.0.0.1:2379 --prefix /fastpath/edge
    #[command(verbatim_doc_comment)]
    Rollback {
        /// The revision to restore (a push's revision from `config history`).
        #[arg(value_name = "REV")]
        revision: i64,
        #[command(flatten)]
        etcd: EtcdArgs,
        /// A machine's own file to validate with (merged).
        #[arg(long, value_name = "FILE")]
        local: Option<PathBuf>,
        /// Who rolls back (default: user@host).
        #[arg(long)]
        who: Option<String>,
        /// Output format.
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
    /// Hold the fleet for one load balancer (a canary), or release it.
    ///
    /// While PREFIX/meta/hold names a load balancer (its `lb run --name`),
    /// only that one applies new revisions; the others keep what they run
    /// and report that they wait (`lb status`). Release, and they apply the
    /// newest revision.
    ///
    /// Examples:
    ///   fastpath lb config hold lb1 --etcd http://10.0.0.1:2379 --prefix /fastpath/edge
    ///   fastpath lb config hold --release --etcd http://10.0.0.1:2379 --prefix /fastpath/edge
    #[command(verbatim_doc_comment)]
    Hold {
        /// The one load balancer allowed to apply.
        #[arg(
            value_name = "NAME",
            required_unless_present = "release",
            conflicts_with = "release"
        )]
        name: Option<String>,
        /// Let every load balancer apply again.
        #[arg(long)]
        release: bool,
        #[command(flatten)]
        etcd: EtcdArgs,
        /// Output format.
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
    /// Print the fleet's configuration as stored (the TOML every load
    /// balancer merges with its own file), now or at --revision.
    ///
    /// JSON keys: prefix, revision, pushed{...}, hold, keys, text.
    ///
    /// Examples:
    ///   fastpath lb config show --etcd http://10.0.0.1:2379 --prefix /fastpath/edge
    ///   fastpath lb config show --revision 42 --etcd http://10.0.0.1:2379 --prefix /fastpath/edge --format json | jq -r .text
    #[command(verbatim_doc_comment)]
    Show {
        #[command(flatten)]
        etcd: EtcdArgs,
        /// The revision to read (default: the current one).
        #[arg(long, value_name = "R")]
        revision: Option<i64>,
        /// Output format.
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
}

/// Runs `f` on a one-shot runtime, bounded by ten deadlines at most.
fn block_on<T>(f: impl std::future::Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?
        .block_on(f)
}

async fn connect(t: &Target) -> anyhow::Result<fleetconf::Store> {
    Ok(fleetconf::Store::connect_with(&t.access).await?)
}

fn read_file(path: &Path) -> anyhow::Result<String> {
    let meta = std::fs::metadata(path).with_context(|| format!("reading {}", path.display()))?;
    anyhow::ensure!(
        meta.len() <= lb::config::MAX_CONFIG_BYTES,
        "{}: {} bytes, more than a configuration may hold ({})",
        path.display(),
        meta.len(),
        lb::config::MAX_CONFIG_BYTES
    );
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

fn default_who() -> String {
    let user = std::env::var("USER").unwrap_or_else(|_| "unknown".into());
    let host = rustix::system::uname()
        .nodename()
        .to_string_lossy()
        .into_owned();
    format!("{user}@{host}")
}

/// How many keys a push's table lists.
const MAX_LISTED: usize = 40;

#[derive(Serialize)]
struct Pushed {
    prefix: String,
    #[serde(flatten)]
    outcome: fleetconf::PushOutcome,
}

impl Report for Pushed {
    fn to_text(&self) -> String {
        let o = &self.outcome;
        if o.put.is_empty() && o.deleted.is_empty() {
            return format!(
                "{}: nothing changed (revision {} already holds this configuration)",
                self.prefix, o.revision
            );
        }
        let mut s = format!(
            "{}: revision {} ({} keys written, {} deleted{})\n",
            self.prefix,
            o.revision,
            o.put.len(),
            o.deleted.len(),
            if o.transactions > 1 {
                format!(
                    "; staged in {} transactions behind {}/{}",
                    o.transactions,
                    self.prefix.trim_end_matches('/'),
                    fleetconf::PENDING_KEY
                )
            } else {
                String::new()
            }
        );
        // A first push of a large fleet writes thousands of keys: the
        // first ones are listed, the JSON has them all.
        let all = o.put.iter().map(|k| ("put    ", k));
        let all = all.chain(o.deleted.iter().map(|k| ("deleted", k)));
        for (what, k) in all.clone().take(MAX_LISTED) {
            s.push_str(&format!("  {what} {k}\n"));
        }
        let more = all.count().saturating_sub(MAX_LISTED);
        if more > 0 {
            s.push_str(&format!(
                "  ... and {more} more (--format json lists them all)\n"
            ));
        }
        s
    }
}

#[derive(Serialize)]
struct Diffed {
    prefix: String,
    revision: i64,
    #[serde(flatten)]
    diff: fleetconf::Diff,
}

impl Report for Diffed {
    fn to_text(&self) -> String {
        if self.diff.is_empty() {
            return format!("{} at revision {}: the same\n", self.prefix, self.revision);
        }
        let mut s = format!("{} at revision {}:\n", self.prefix, self.revision);
        for (mark, keys) in [
            ("+", &self.diff.added),
            ("~", &self.diff.changed),
            ("-", &self.diff.removed),
        ] {
            for k in keys {
                s.push_str(&format!("  {mark} {k}\n"));
            }
        }
        s
    }
}

#[derive(Serialize)]
struct History {
    prefix: String,
    pushes: Vec<fleetconf::PushRecord>,
}

/// A push record as etcd gives it back, revision included.
#[derive(Serialize)]
struct RecordOut<'a> {
    revision: i64,
    #[serde(flatten)]
    record: &'a fleetconf::PushRecord,
}

impl Serialize for HistoryOut<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let pushes: Vec<RecordOut<'_>> = self
            .0
            .pushes
            .iter()
            .map(|r| RecordOut {
                revision: r.revision,
                record: r,
            })
            .collect();
        serde_json::json!({ "prefix": self.0.prefix, "pushes": pushes }).serialize(s)
    }
}

struct HistoryOut<'a>(&'a History);

impl Report for HistoryOut<'_> {
    fn to_text(&self) -> String {
        if self.0.pushes.is_empty() {
            return format!(
                "{}: nothing pushed (or etcd no longer has it)\n",
                self.0.prefix
            );
        }
        let mut s = format!(
            "{:>10}  {:<16}  {:>12}  who\n",
            "revision", "hash", "when (unix)"
        );
        for r in &self.0.pushes {
            let rb = r
                .rollback_of
                .map_or(String::new(), |v| format!("  (rollback to {v})"));
            s.push_str(&format!(
                "{:>10}  {:<16}  {:>12}  {}{rb}\n",
                r.revision, r.hash, r.when_unix_s, r.who
            ));
        }
        s
    }
}

#[derive(Serialize)]
struct Held {
    prefix: String,
    hold: Option<String>,
    revision: i64,
}

impl Report for Held {
    fn to_text(&self) -> String {
        match &self.hold {
            Some(n) => format!(
                "{}: held for {n} (revision {}): only {n} applies new revisions\n",
                self.prefix, self.revision
            ),
            None => format!(
                "{}: released (revision {}): every load balancer applies\n",
                self.prefix, self.revision
            ),
        }
    }
}

#[derive(Serialize)]
struct Shown {
    prefix: String,
    revision: i64,
    pushed: Option<RecordShown>,
    hold: Option<String>,
    /// A staged push part-way: who, and its marker's revision.
    pending: Option<RecordShown>,
    keys: Vec<String>,
    text: String,
}

#[derive(Serialize)]
struct RecordShown {
    revision: i64,
    #[serde(flatten)]
    record: fleetconf::PushRecord,
}

impl Report for Shown {
    fn to_text(&self) -> String {
        let mut s = format!("# {} at revision {}", self.prefix, self.revision);
        if let Some(p) = &self.pushed {
            s.push_str(&format!(
                ", pushed at revision {} by {} (hash {})",
                p.revision, p.record.who, p.record.hash
            ));
        }
        if let Some(h) = &self.hold {
            s.push_str(&format!(", held for {h}"));
        }
        if let Some(p) = &self.pending {
            s.push_str(&format!(
                "\n# A PUSH IS BEING STAGED by {} since revision {}: its keys are part-way; load balancers run the configuration of revision {} (`config show --revision {}`); an abandoned push is replaced by `config push --take-over`",
                p.record.who,
                p.revision,
                p.revision - 1,
                p.revision - 1
            ));
        }
        s.push('\n');
        s.push_str(&self.text);
        s
    }
}

/// Runs `fastpath lb config ...`.
pub fn run(a: ConfigArgs) -> anyhow::Result<()> {
    match a.command {
        ConfigCommand::Push {
            file,
            etcd,
            local,
            who,
            max_txn_ops,
            max_request_bytes,
            take_over,
            format,
        } => {
            let t = etcd.load()?;
            let text = read_file(&file)?;
            let local = local.as_deref().map(read_file).transpose()?;
            let who = who.unwrap_or_else(default_who);
            let outcome = block_on(async {
                let store = connect(&t).await?.with_limits(fleetconf::TxnLimits {
                    max_ops: max_txn_ops,
                    max_bytes: max_request_bytes,
                });
                let name = file.display().to_string();
                Ok(store
                    .push_current(
                        &t.prefix,
                        &fleetconf::Push {
                            local: local.as_deref(),
                            take_over,
                            ..fleetconf::Push::new(&text, &name, &who)
                        },
                    )
                    .await?)
            })?;
            emit(
                format,
                &Pushed {
                    prefix: t.prefix,
                    outcome,
                },
            )
        }
        ConfigCommand::Diff { file, etcd, format } => {
            let t = etcd.load()?;
            let text = read_file(&file)?;
            let new = fleetconf::split(&text).with_context(|| file.display().to_string())?;
            let snap = block_on(async { Ok(connect(&t).await?.snapshot(&t.prefix, None).await?) })?;
            emit(
                format,
                &Diffed {
                    prefix: t.prefix,
                    revision: snap.revision,
                    diff: fleetconf::diff(&snap.keys, &new),
                },
            )
        }
        ConfigCommand::History {
            etcd,
            limit,
            format,
        } => {
            let t = etcd.load()?;
            let pushes =
                block_on(async { Ok(connect(&t).await?.history(&t.prefix, limit).await?) })?;
            emit(
                format,
                &HistoryOut(&History {
                    prefix: t.prefix,
                    pushes,
                }),
            )
        }
        ConfigCommand::Rollback {
            revision,
            etcd,
            local,
            who,
            format,
        } => {
            let t = etcd.load()?;
            let local = local.as_deref().map(read_file).transpose()?;
            let who = who.unwrap_or_else(default_who);
            let outcome = block_on(async {
                Ok(connect(&t)
                    .await?
                    .rollback(&t.prefix, revision, local.as_deref(), &who)
                    .await?)
            })?;
            emit(
                format,
                &Pushed {
                    prefix: t.prefix,
                    outcome,
                },
            )
        }
        ConfigCommand::Hold {
            name,
            release,
            etcd,
            format,
        } => {
            let t = etcd.load()?;
            let name = if release { None } else { name };
            let revision = block_on(async {
                Ok(connect(&t)
                    .await?
                    .set_hold(&t.prefix, name.as_deref())
                    .await?)
            })?;
            emit(
                format,
                &Held {
                    prefix: t.prefix,
                    hold: name,
                    revision,
                },
            )
        }
        ConfigCommand::Show {
            etcd,
            revision,
            format,
        } => {
            let t = etcd.load()?;
            let snap =
                block_on(async { Ok(connect(&t).await?.snapshot(&t.prefix, revision).await?) })?;
            emit(
                format,
                &Shown {
                    prefix: t.prefix,
                    revision: snap.revision,
                    pushed: snap.pushed.map(|r| RecordShown {
                        revision: r.revision,
                        record: r,
                    }),
                    hold: snap.hold,
                    pending: snap.pending.map(|r| RecordShown {
                        revision: r.revision,
                        record: r,
                    }),
                    keys: snap.keys.into_iter().map(|(k, _)| k).collect(),
                    text: snap.text,
                },
            )
        }
    }
}

/// `fastpath lb run`'s arguments for a configuration from etcd.
#[derive(Args)]
pub struct EtcdRunArgs {
    /// Take the fleet's configuration from etcd (client URLs,
    /// comma-separated) under --prefix, merged with --config, which then
    /// holds this machine's own sections ([api], [encap], [bgp], [fleet],
    /// ...). The prefix is read at one revision, validated and applied at
    /// start, then watched: each revision pushed (`fastpath lb config
    /// push`) is validated and applied whole, or refused whole while the
    /// running tables keep serving (`lb status` shows the revision applied,
    /// the last one refused and how long ago etcd last answered). Reloads
    /// and runtime drains/weights are refused: the fleet's configuration
    /// changes only through etcd. Forwarding and BGP never wait for etcd.
    #[arg(
        long = "config-etcd",
        value_name = "ENDPOINTS",
        num_args = 1..,
        value_delimiter = ',',
        requires = "prefix",
        conflicts_with_all = ["pcap_in", "etcd_file"]
    )]
    pub endpoints: Vec<String>,
    /// The same from a bootstrap file (endpoints, TLS, a user and password
    /// file, the prefix, this load balancer's name, a deadline; see README,
    /// "Fleet configuration in etcd"), shared with `lb config --etcd-file`.
    #[arg(
        long = "config-etcd-file",
        value_name = "FILE",
        conflicts_with = "pcap_in"
    )]
    pub etcd_file: Option<PathBuf>,
    /// The fleet's prefix in etcd (/fastpath/edge).
    #[arg(long, value_name = "P")]
    pub prefix: Option<String>,
    /// This load balancer's name, which `fastpath lb config hold NAME`
    /// names (default: the bootstrap file's, else the host name).
    #[arg(long)]
    pub name: Option<String>,
    /// Deadline of every call to etcd, in milliseconds (with --config-etcd).
    #[arg(long, value_name = "MS", default_value_t = 5000)]
    pub etcd_timeout_ms: u64,
}

impl EtcdRunArgs {
    /// The daemon's source: etcd, read once now (with `local`, the
    /// machine's own file), or the file `local` alone.
    pub fn source(&self, local: &Path) -> anyhow::Result<lbd::daemon::Source> {
        if self.etcd_file.is_none() && self.endpoints.is_empty() {
            return Ok(lbd::daemon::Source::File(local.to_path_buf()));
        }
        let b = fleetconf::Bootstrap::from_args(
            self.etcd_file.as_deref(),
            self.endpoints.clone(),
            Duration::from_millis(self.etcd_timeout_ms),
        )?;
        let (access, prefix, name) = (
            b.access,
            self.prefix.clone().or(b.prefix),
            self.name.clone().or(b.name),
        );
        let prefix = prefix.context(
            "no prefix: pass --prefix (or give `prefix` in the --config-etcd-file bootstrap file)",
        )?;
        let name = name.unwrap_or_else(|| {
            rustix::system::uname()
                .nodename()
                .to_string_lossy()
                .into_owned()
        });
        let start = lbd::EtcdStart::read(access, prefix, name, Some(local))
            .context("reading the configuration from etcd")?;
        Ok(lbd::daemon::Source::Etcd(Box::new(start)))
    }
}
