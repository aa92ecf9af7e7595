//! The fleet's configuration in etcd: read at one revision, pushed in one
//! guarded transaction, its history, rollbacks, the canary hold, and a
//! watch. Every call to etcd has a deadline ([`Store::deadline`]).

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use etcd_client::{Client, Compare, CompareOp, GetOptions, Txn, TxnOp, WatchOptions, WatchStream};
use serde::{Deserialize, Serialize};

use crate::access::Access;
use crate::layout::{self, LayoutError, CONFIG_DIR};

/// The guard key, relative to the prefix: written by every push with who,
/// when and what; its modification revision is what a push compares.
pub const GUARD_KEY: &str = "meta/pushed";
/// The hold key, relative to the prefix: the name of the one load
/// balancer allowed to apply (a canary); the others wait.
pub const HOLD_KEY: &str = "meta/hold";
/// The marker of a push too large for one transaction, relative to the
/// prefix: while it exists the configuration keys are being written in
/// several transactions, and load balancers wait for the one that
/// finishes the push (and deletes it).
pub const PENDING_KEY: &str = "meta/pushing";
/// What a staged push leaves of etcd's bound on request bytes for the
/// request's own framing (keys and values are counted, the rest is not).
pub const REQUEST_MARGIN_BYTES: usize = 64 * 1024;
/// etcd's default bound on a transaction's operations (`--max-txn-ops`).
pub const ETCD_DEFAULT_MAX_TXN_OPS: usize = 128;
/// etcd's default bound on a request's bytes (`--max-request-bytes`, 1.5 MiB).
pub const ETCD_DEFAULT_MAX_REQUEST_BYTES: usize = 1536 * 1024;
/// The largest response this client decodes (a whole prefix in one range
/// response); tonic's default, 4 MiB, is less than a 1,000-VIP fleet.
pub const MAX_RESPONSE_BYTES: usize = 256 * 1024 * 1024;
/// How many pushes [`Store::history`] walks back at most.
pub const MAX_HISTORY: usize = 1000;

/// What went wrong talking to etcd or with what it holds.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// No answer within the deadline.
    #[error("etcd at {endpoints} did not answer {what} within {deadline:?}")]
    Deadline {
        /// The endpoints, comma-separated.
        endpoints: String,
        /// The call.
        what: &'static str,
        /// The deadline.
        deadline: Duration,
    },
    /// The client's error.
    #[error("etcd at {endpoints}: {what} (deadline {deadline:?}): {source}")]
    Etcd {
        /// The endpoints, comma-separated.
        endpoints: String,
        /// The call.
        what: &'static str,
        /// The call's deadline.
        deadline: Duration,
        /// The client's error.
        #[source]
        source: etcd_client::Error,
    },
    /// The stored keys do not make a configuration.
    #[error("the configuration under {prefix} at revision {revision}: {source}")]
    Layout {
        /// The prefix.
        prefix: String,
        /// The revision read.
        revision: i64,
        /// What is wrong.
        #[source]
        source: Box<LayoutError>,
    },
    /// The text to push does not split into keys.
    #[error("{0}")]
    Split(#[source] LayoutError),
    /// The text to push is not a valid configuration.
    #[error("not pushed: {0}")]
    Invalid(#[source] lb::config::ConfigError),
    /// The configuration changed since it was read (another operator).
    #[error("not pushed: the configuration under {prefix} changed since revision {read_revision} was read (another push?); read it again and retry")]
    Conflict {
        /// The prefix.
        prefix: String,
        /// The revision this push was based on.
        read_revision: i64,
    },
    /// The transaction would exceed what etcd takes in one request.
    #[error("not pushed: the transaction has {ops} operations and {bytes} bytes; etcd takes at most {max_ops} operations (--max-txn-ops) and {max_bytes} bytes (--max-request-bytes) a request: raise them on every member and pass the same bounds here")]
    TooLarge {
        /// Operations in the transaction.
        ops: usize,
        /// Bytes of keys and values.
        bytes: usize,
        /// The bound on operations.
        max_ops: usize,
        /// The bound on bytes.
        max_bytes: usize,
    },
    /// A guard or hold value that is not what a push writes.
    #[error("{key} at revision {revision} is not a push record: {source}")]
    Record {
        /// The key.
        key: String,
        /// Its revision.
        revision: i64,
        /// The JSON error.
        #[source]
        source: serde_json::Error,
    },
    /// A revision etcd no longer has (compacted) or never had.
    #[error("revision {revision} is not available: {reason}")]
    Revision {
        /// The revision asked for.
        revision: i64,
        /// etcd's words.
        reason: String,
    },
    /// The watch was cancelled because its start revision was compacted:
    /// read the current snapshot and watch again from it.
    #[error("the watch from revision {from} was cancelled: etcd compacted up to {compacted}")]
    Compacted {
        /// The revision the watch started after.
        from: i64,
        /// etcd's compaction revision.
        compacted: i64,
    },
    /// No endpoint was given.
    #[error("no etcd endpoint given")]
    NoEndpoints,
    /// The watch ended (the server closed it or cancelled it).
    #[error("the watch ended: {0}")]
    WatchEnded(String),
    /// A push too large for one transaction is being written by someone
    /// else (or was left unfinished): nothing is written over it.
    #[error("not pushed: a push by {who} is in progress under {prefix} since revision {revision} (staged in several transactions; load balancers keep running the last complete one until it finishes); if it was abandoned, push again with --take-over")]
    InProgress {
        /// The prefix.
        prefix: String,
        /// Who started it.
        who: String,
        /// The revision of its marker.
        revision: i64,
    },
    /// A staged push stopped part-way: what it wrote stays behind its
    /// marker, which load balancers wait on, until a push takes it over.
    #[error("push interrupted after {done} of {total} transactions (the marker {marker} at revision {revision} stays, so load balancers keep running the last complete configuration): push again with --take-over: {source}")]
    Interrupted {
        /// Transactions done (the marker's included).
        done: usize,
        /// Transactions the push needed.
        total: usize,
        /// The marker key.
        marker: String,
        /// The marker's revision.
        revision: i64,
        /// Why it stopped.
        #[source]
        source: Box<StoreError>,
    },
    /// The validation's thread was stopped (the runtime shutting down).
    #[error("not pushed: the validation was stopped: {0}")]
    Stopped(String),
    /// Another push took over this staged push's marker.
    #[error("not finished: another push took over the marker {marker} (this push's was revision {revision}); nothing more was written")]
    TakenOver {
        /// The marker key.
        marker: String,
        /// This push's marker revision.
        revision: i64,
    },
}

/// What a push writes into the guard key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PushRecord {
    /// Who pushed (user@host, or what the operator passed).
    pub who: String,
    /// When, seconds since the Unix epoch.
    pub when_unix_s: u64,
    /// A hash of the text pushed ([`text_hash`]), to compare revisions.
    pub hash: String,
    /// The revision the push was based on.
    pub read_revision: i64,
    /// The revision whose configuration this push restored, for a rollback.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback_of: Option<i64>,
    /// The revision the push made (filled from etcd when read back, not stored).
    #[serde(default, skip_serializing)]
    pub revision: i64,
}

/// The fingerprint of a configuration's text: SipHash-2-4 with zero keys,
/// 16 hex digits; for telling revisions apart, not against an attacker.
pub fn text_hash(text: &str) -> String {
    use std::hash::Hasher;
    let mut h = siphasher::sip::SipHasher24::new_with_keys(0, 0);
    h.write(text.as_bytes());
    format!("{:016x}", h.finish())
}

/// The whole prefix read at one revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// The revision the read saw (etcd's store revision at the read, or
    /// the revision asked for).
    pub revision: i64,
    /// The configuration's text ([`layout::join`]).
    pub text: String,
    /// The configuration keys (relative to the prefix) and values.
    pub keys: Vec<(String, String)>,
    /// The guard key's modification revision (0: never pushed).
    pub guard_revision: i64,
    /// The last push, if any.
    pub pushed: Option<PushRecord>,
    /// The name in the hold key, if held.
    pub hold: Option<String>,
    /// A staged push in progress (or abandoned): what its marker holds,
    /// with the marker's revision. While it is there, `text` is empty (the
    /// keys are part-way; the revision before the marker's holds the last
    /// complete configuration).
    pub pending: Option<PushRecord>,
}

impl Snapshot {
    /// Builds the snapshot of the keys under `prefix` (relative, with
    /// value and modification revision) as they are at `revision`.
    fn assemble(
        prefix: &str,
        revision: i64,
        kvs: impl IntoIterator<Item = (String, String, i64)>,
    ) -> Result<Snapshot, StoreError> {
        let mut keys = Vec::new();
        let mut guard_revision = 0;
        let mut pushed = None;
        let mut hold = None;
        let mut pending = None;
        let record = |rel: &str, value: &str, rev: i64| -> Result<PushRecord, StoreError> {
            let mut r: PushRecord =
                serde_json::from_str(value).map_err(|source| StoreError::Record {
                    key: full_key(prefix, rel),
                    revision: rev,
                    source,
                })?;
            r.revision = rev;
            Ok(r)
        };
        for (rel, value, rev) in kvs {
            if rel == GUARD_KEY {
                guard_revision = rev;
                pushed = Some(record(&rel, &value, rev)?);
            } else if rel == PENDING_KEY {
                pending = Some(record(&rel, &value, rev)?);
            } else if rel == HOLD_KEY {
                hold = Some(value);
            } else if rel.starts_with(CONFIG_DIR) {
                keys.push((rel, value));
            }
        }
        // Part-way through a staged push the keys need not join, and a
        // follower has nothing to apply: not joined.
        let text = if pending.is_some() {
            String::new()
        } else {
            layout::join(keys.iter().map(|(k, v)| (k.as_str(), v.as_str()))).map_err(|source| {
                StoreError::Layout {
                    prefix: prefix.to_string(),
                    revision,
                    source: Box::new(source),
                }
            })?
        };
        Ok(Snapshot {
            revision,
            text,
            keys,
            guard_revision,
            pushed,
            hold,
            pending,
        })
    }
}

/// One change a watch delivered: every event of one or more revisions
/// (etcd never splits a revision's events across responses), the newest
/// revision among them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// The newest revision the events carry.
    pub revision: i64,
    /// Keys (relative to the prefix) put with their value and revision,
    /// or deleted (`None`), in etcd's order.
    pub events: Vec<(String, Option<(String, i64)>)>,
}

/// The prefix as a follower sees it: read once ([`Store::list`]), then
/// kept current by the watch's events ([`Mirror::apply`]), so that each
/// push costs a follower the bytes that changed, not a whole read. At
/// every revision it is what a read at that revision would return.
#[derive(Debug, Clone, Default)]
pub struct Mirror {
    prefix: String,
    revision: i64,
    keys: std::collections::BTreeMap<String, (String, i64)>,
}

impl Mirror {
    /// The revision it shows.
    pub fn revision(&self) -> i64 {
        self.revision
    }

    /// How many keys it holds.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether it holds no key.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Brings it to `change.revision`.
    pub fn apply(&mut self, change: &Change) {
        for (key, put) in &change.events {
            match put {
                Some(v) => {
                    self.keys.insert(key.clone(), v.clone());
                }
                None => {
                    self.keys.remove(key);
                }
            }
        }
        self.revision = self.revision.max(change.revision);
    }

    /// What it shows, as a snapshot at its revision.
    pub fn snapshot(&self) -> Result<Snapshot, StoreError> {
        Snapshot::assemble(
            &self.prefix,
            self.revision,
            self.keys
                .iter()
                .map(|(k, (v, r))| (k.clone(), v.clone(), *r)),
        )
    }
}

/// What to push ([`Store::push`]).
#[derive(Debug, Clone, Copy)]
pub struct Push<'a> {
    /// The fleet's configuration (TOML).
    pub text: &'a str,
    /// What names it in errors (the file).
    pub file: &'a str,
    /// A machine's own part to validate it with, merged ([`layout::merge`]).
    pub local: Option<&'a str>,
    /// Who pushes (recorded in the guard key).
    pub who: &'a str,
    /// The revision a rollback restores.
    pub rollback_of: Option<i64>,
    /// Replace a staged push in progress (one abandoned part-way).
    pub take_over: bool,
}

impl<'a> Push<'a> {
    /// `text`, named `file`, by `who`.
    pub fn new(text: &'a str, file: &'a str, who: &'a str) -> Push<'a> {
        Push {
            text,
            file,
            local: None,
            who,
            rollback_of: None,
            take_over: false,
        }
    }
}

/// What a push did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PushOutcome {
    /// The revision the transaction made (unchanged: the one read, when
    /// nothing changed and nothing was written).
    pub revision: i64,
    /// Keys written (new or changed).
    pub put: Vec<String>,
    /// Keys deleted.
    pub deleted: Vec<String>,
    /// Transactions it took: 1, or more for a push staged behind the
    /// marker ([`PENDING_KEY`]) because one would exceed etcd's bounds
    /// (0 when nothing changed).
    pub transactions: usize,
}

/// Bounds on one transaction (etcd's server flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxnLimits {
    /// `--max-txn-ops`.
    pub max_ops: usize,
    /// `--max-request-bytes`.
    pub max_bytes: usize,
}

impl Default for TxnLimits {
    fn default() -> Self {
        TxnLimits {
            max_ops: ETCD_DEFAULT_MAX_TXN_OPS,
            max_bytes: ETCD_DEFAULT_MAX_REQUEST_BYTES,
        }
    }
}

/// `prefix` without a trailing slash, and the key `rel` under it.
fn full_key(prefix: &str, rel: &str) -> String {
    format!("{}/{rel}", prefix.trim_end_matches('/'))
}

/// A connection to the etcd cluster holding fleets' configurations: one
/// client per member, so that a call that cannot reach one member goes to
/// the next (a client balancing over all of them sends a call to a dead
/// member and fails it), starting from the member that answered last (at
/// first, a member drawn at random).
#[derive(Clone)]
pub struct Store {
    clients: Vec<(String, Client)>,
    next: Arc<AtomicUsize>,
    endpoints: String,
    deadline: Duration,
    limits: TxnLimits,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("endpoints", &self.endpoints)
            .field("deadline", &self.deadline)
            .finish()
    }
}

/// Which failures of a call send it to the next member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Retry {
    /// Any failure to reach the member (reads, watches, idempotent writes).
    Unreachable,
    /// Only a failure to connect, before the request left: a transaction
    /// whose request may have been applied is not sent twice.
    NotSent,
}

fn fails_over(e: &etcd_client::Error, retry: Retry) -> bool {
    match e {
        etcd_client::Error::TransportError(_) => true,
        etcd_client::Error::GRpcStatus(s) => {
            let unavailable = s.code() == tonic::Code::Unavailable;
            match retry {
                Retry::Unreachable => unavailable,
                Retry::NotSent => unavailable && s.message().contains("connect"),
            }
        }
        _ => false,
    }
}

impl Store {
    /// Connects to `endpoints` (`http://host:port`, or `host:port`); every
    /// later call gives up after `deadline`, trying the members in turn
    /// (each connection attempt bounded by a share of the deadline).
    pub async fn connect(endpoints: &[String], deadline: Duration) -> Result<Store, StoreError> {
        Store::connect_with(&Access::plain(endpoints.to_vec(), deadline)).await
    }

    /// Connects as `access` says (TLS, a user: [`crate::Bootstrap`]).
    pub async fn connect_with(access: &Access) -> Result<Store, StoreError> {
        let (endpoints, deadline) = (&access.endpoints, access.deadline);
        let joined = endpoints.join(",");
        let share =
            (deadline / (endpoints.len().max(1) as u32 + 1)).max(Duration::from_millis(100));
        let mut clients = Vec::with_capacity(endpoints.len());
        for ep in endpoints {
            let options = access.options(share);
            let client = bounded(ep, "connect", deadline, async {
                Client::connect([ep.as_str()], Some(options)).await
            })
            .await?;
            clients.push((ep.clone(), client));
        }
        if clients.is_empty() {
            return Err(StoreError::NoEndpoints);
        }
        // Each client starts at a member of its own: a fleet given one
        // list of endpoints would otherwise put every watch and every
        // re-read on the first member.
        let first = {
            use std::hash::{BuildHasher, Hasher};
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u32(std::process::id());
            (h.finish() % clients.len() as u64) as usize
        };
        Ok(Store {
            clients,
            next: Arc::new(AtomicUsize::new(first)),
            endpoints: joined,
            deadline,
            limits: TxnLimits::default(),
        })
    }

    /// Runs `f` against one member after another, from the one that
    /// answered last, until one answers, a failure is not one of reaching
    /// the member, or the deadline passes.
    async fn call<T, Fut>(
        &self,
        what: &'static str,
        retry: Retry,
        f: impl Fn(Client) -> Fut,
    ) -> Result<T, StoreError>
    where
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let until = tokio::time::Instant::now() + self.deadline;
        let n = self.clients.len();
        let first = self.next.load(Ordering::Relaxed);
        let mut last = None;
        for i in 0..n {
            let at = (first + i) % n;
            let (ep, client) = &self.clients[at];
            match tokio::time::timeout_at(until, f(client.clone())).await {
                Err(_) => break,
                Ok(Ok(v)) => {
                    self.next.store(at, Ordering::Relaxed);
                    return Ok(v);
                }
                Ok(Err(source)) => {
                    let go_on = fails_over(&source, retry);
                    let e = StoreError::Etcd {
                        endpoints: ep.clone(),
                        what,
                        deadline: self.deadline,
                        source,
                    };
                    if !go_on {
                        return Err(e);
                    }
                    last = Some(e);
                }
            }
        }
        Err(last.unwrap_or_else(|| StoreError::Deadline {
            endpoints: self.endpoints.clone(),
            what,
            deadline: self.deadline,
        }))
    }

    /// The same store with other transaction bounds.
    pub fn with_limits(mut self, limits: TxnLimits) -> Store {
        self.limits = limits;
        self
    }

    /// The deadline of every call.
    pub fn deadline(&self) -> Duration {
        self.deadline
    }

    /// The endpoints, comma-separated.
    pub fn endpoints(&self) -> &str {
        &self.endpoints
    }

    /// Reads the whole prefix in one range request (one revision: the
    /// current one, or `at`): every key with its value and revision.
    pub async fn list(&self, prefix: &str, at: Option<i64>) -> Result<Mirror, StoreError> {
        let dir = full_key(prefix, "");
        let mut opts = GetOptions::new().with_prefix();
        if let Some(rev) = at {
            opts = opts.with_revision(rev);
        }
        let resp = self
            .call("range", Retry::Unreachable, |c| {
                let (dir, opts) = (dir.clone(), opts.clone());
                async move {
                    c.kv_client()
                        .max_decoding_message_size(MAX_RESPONSE_BYTES)
                        .get(dir, Some(opts))
                        .await
                }
            })
            .await
            .map_err(|e| revision_error(e, at))?;
        let revision = at.unwrap_or_else(|| resp.header().map(|h| h.revision()).unwrap_or(0));
        let keys = resp
            .kvs()
            .iter()
            .filter_map(|kv| {
                let rel = kv.key().strip_prefix(dir.as_bytes())?;
                Some((
                    String::from_utf8_lossy(rel).into_owned(),
                    (
                        String::from_utf8_lossy(kv.value()).into_owned(),
                        kv.mod_revision(),
                    ),
                ))
            })
            .collect();
        Ok(Mirror {
            prefix: prefix.to_string(),
            revision,
            keys,
        })
    }

    /// Reads the whole prefix in one range request (one revision: the
    /// current one, or `at`), and joins the configuration.
    pub async fn snapshot(&self, prefix: &str, at: Option<i64>) -> Result<Snapshot, StoreError> {
        self.list(prefix, at).await?.snapshot()
    }

    /// Validates `text` ([`lb::config::Config::parse`], named `file` in
    /// errors; with `local`, a machine's own part, merged as a load balancer
    /// merges it: [`layout::merge`]), then writes it in one transaction that succeeds only if
    /// nothing was pushed since `read` (the guard key's revision) and no
    /// configuration key changed since (any key under `config/` newer
    /// than `read.revision`): keys that changed are put, keys gone are
    /// deleted, the guard records `who`. Nothing changed: nothing written.
    pub async fn push(
        &self,
        prefix: &str,
        push: &Push<'_>,
        read: &Snapshot,
    ) -> Result<PushOutcome, StoreError> {
        let new = prepare(push)?;
        self.push_prepared(prefix, push, new, read).await
    }

    /// [`Store::push`] against the prefix as it is now: the read and the
    /// validation (with the cutting into keys) go side by side, each
    /// taking a good part of a second for a large fleet.
    pub async fn push_current(
        &self,
        prefix: &str,
        push: &Push<'_>,
    ) -> Result<PushOutcome, StoreError> {
        let (text, file, local) = (
            push.text.to_string(),
            push.file.to_string(),
            push.local.map(str::to_string),
        );
        let prepared = tokio::task::spawn_blocking(move || {
            prepare(&Push {
                local: local.as_deref(),
                ..Push::new(&text, &file, "")
            })
        });
        let (read, prepared) = tokio::join!(self.snapshot(prefix, None), prepared);
        let new = match prepared {
            Ok(r) => r?,
            Err(e) => match e.try_into_panic() {
                Ok(panic) => std::panic::resume_unwind(panic),
                Err(e) => return Err(StoreError::Stopped(e.to_string())),
            },
        };
        self.push_prepared(prefix, push, new, &read?).await
    }

    /// The write of a push already validated and cut into `new`.
    async fn push_prepared(
        &self,
        prefix: &str,
        push: &Push<'_>,
        new: Vec<(String, String)>,
        read: &Snapshot,
    ) -> Result<PushOutcome, StoreError> {
        let Push {
            text,
            who,
            rollback_of,
            take_over,
            ..
        } = *push;
        if let Some(p) = read.pending.as_ref().filter(|_| !take_over) {
            return Err(StoreError::InProgress {
                prefix: prefix.to_string(),
                who: p.who.clone(),
                revision: p.revision,
            });
        }
        let old: std::collections::HashMap<&str, &str> = read
            .keys
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        // Each operation with the bytes it sends.
        let mut ops: Vec<(TxnOp, usize)> = Vec::new();
        let mut outcome = PushOutcome {
            revision: read.revision,
            put: Vec::new(),
            deleted: Vec::new(),
            transactions: 0,
        };
        for (k, v) in &new {
            if old.get(k.as_str()) != Some(&v.as_str()) {
                let key = full_key(prefix, k);
                ops.push((
                    TxnOp::put(key.clone(), v.clone(), None),
                    key.len() + v.len(),
                ));
                outcome.put.push(key);
            }
        }
        let kept: std::collections::HashSet<&str> = new.iter().map(|(k, _)| k.as_str()).collect();
        for (k, _) in &read.keys {
            if !kept.contains(k.as_str()) {
                let key = full_key(prefix, k);
                ops.push((TxnOp::delete(key.clone(), None), key.len()));
                outcome.deleted.push(key);
            }
        }
        if ops.is_empty() && rollback_of.is_none() && read.pending.is_none() {
            return Ok(outcome);
        }
        let record = PushRecord {
            who: who.to_string(),
            when_unix_s: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            hash: text_hash(text),
            read_revision: read.revision,
            rollback_of,
            revision: 0,
        };
        let guard = full_key(prefix, GUARD_KEY);
        let marker = full_key(prefix, PENDING_KEY);
        let record = serde_json::to_string(&record).map_err(|source| StoreError::Record {
            key: guard.clone(),
            revision: 0,
            source,
        })?;
        // The guard: nothing pushed, no configuration key written and no
        // staged push begun or taken over since the read.
        let guarded = [
            Compare::mod_revision(guard.clone(), CompareOp::Equal, read.guard_revision),
            Compare::mod_revision(
                full_key(prefix, CONFIG_DIR),
                CompareOp::Less,
                read.revision + 1,
            )
            .with_prefix(),
            Compare::mod_revision(
                marker.clone(),
                CompareOp::Equal,
                read.pending.as_ref().map_or(0, |p| p.revision),
            ),
        ];
        let finish = [
            TxnOp::put(guard.clone(), record.clone(), None),
            TxnOp::delete(marker.clone(), None),
        ];
        let finish_bytes = guard.len() + record.len() + marker.len();
        let bytes: usize = ops.iter().map(|(_, b)| b).sum::<usize>() + finish_bytes;
        let limits = self.limits;
        if ops.len() + finish.len() <= limits.max_ops && bytes <= limits.max_bytes {
            let txn = Txn::new().when(guarded).and_then(
                ops.into_iter()
                    .map(|(op, _)| op)
                    .chain(finish)
                    .collect::<Vec<_>>(),
            );
            let resp = self.txn(txn).await?;
            if !resp.succeeded() {
                return Err(StoreError::Conflict {
                    prefix: prefix.to_string(),
                    read_revision: read.revision,
                });
            }
            outcome.revision = resp.header().map(|h| h.revision()).unwrap_or(0);
            outcome.transactions = 1;
            return Ok(outcome);
        }
        // Too large for one transaction: staged behind the marker.
        let room = limits.max_bytes.saturating_sub(REQUEST_MARGIN_BYTES);
        if let Some((_, big)) = ops.iter().find(|(_, b)| *b > room) {
            return Err(StoreError::TooLarge {
                ops: 1,
                bytes: *big,
                max_ops: limits.max_ops,
                max_bytes: limits.max_bytes,
            });
        }
        let mut batches: Vec<Vec<TxnOp>> = Vec::new();
        let mut size = 0;
        for (op, b) in ops {
            match batches.last_mut() {
                Some(last) if last.len() < limits.max_ops && size + b <= room => {
                    size += b;
                    last.push(op);
                }
                _ => {
                    size = b;
                    batches.push(vec![op]);
                }
            }
        }
        let total = batches.len() + 2;
        let begin = Txn::new()
            .when(guarded)
            .and_then([TxnOp::put(marker.clone(), record, None)]);
        let resp = self.txn(begin).await?;
        if !resp.succeeded() {
            return Err(StoreError::Conflict {
                prefix: prefix.to_string(),
                read_revision: read.revision,
            });
        }
        let at = resp.header().map(|h| h.revision()).unwrap_or(0);
        let ours = || [Compare::mod_revision(marker.clone(), CompareOp::Equal, at)];
        let interrupted = |done: usize, e: StoreError| StoreError::Interrupted {
            done,
            total,
            marker: marker.clone(),
            revision: at,
            source: Box::new(e),
        };
        for (i, batch) in batches.into_iter().enumerate() {
            let resp = self
                .txn(Txn::new().when(ours()).and_then(batch))
                .await
                .map_err(|e| interrupted(i + 1, e))?;
            if !resp.succeeded() {
                return Err(StoreError::TakenOver {
                    marker: marker.clone(),
                    revision: at,
                });
            }
        }
        let resp = self
            .txn(Txn::new().when(ours()).and_then(finish))
            .await
            .map_err(|e| interrupted(total - 1, e))?;
        if !resp.succeeded() {
            return Err(StoreError::TakenOver {
                marker: marker.clone(),
                revision: at,
            });
        }
        outcome.revision = resp.header().map(|h| h.revision()).unwrap_or(0);
        outcome.transactions = total;
        Ok(outcome)
    }

    /// One transaction, sent to another member only when it could not be
    /// sent (a transaction that may have been applied is not sent twice).
    async fn txn(&self, txn: Txn) -> Result<etcd_client::TxnResponse, StoreError> {
        self.call("txn", Retry::NotSent, |c| {
            let txn = txn.clone();
            async move { c.kv_client().txn(txn).await }
        })
        .await
    }

    /// The pushes etcd still remembers, newest first (at most `max`,
    /// bounded by [`MAX_HISTORY`]): the guard key's past values, walked back
    /// revision by revision until one is compacted or there is none.
    pub async fn history(&self, prefix: &str, max: usize) -> Result<Vec<PushRecord>, StoreError> {
        let guard = full_key(prefix, GUARD_KEY);
        let mut out = Vec::new();
        let mut at = None;
        while out.len() < max.min(MAX_HISTORY) {
            let mut opts = GetOptions::new();
            if let Some(rev) = at {
                opts = opts.with_revision(rev);
            }
            let resp = match self
                .call("range", Retry::Unreachable, |c| {
                    let (guard, opts) = (guard.clone(), opts.clone());
                    async move { c.kv_client().get(guard, Some(opts)).await }
                })
                .await
            {
                Ok(r) => r,
                // Walked back to a compacted revision: that is where
                // etcd's memory ends.
                Err(e) if at.is_some() && is_compacted(&e) => break,
                Err(e) => return Err(e),
            };
            let Some(kv) = resp.kvs().first() else { break };
            let mut record: PushRecord =
                serde_json::from_slice(kv.value()).map_err(|source| StoreError::Record {
                    key: guard.clone(),
                    revision: kv.mod_revision(),
                    source,
                })?;
            record.revision = kv.mod_revision();
            let prev = kv.mod_revision() - 1;
            out.push(record);
            if prev < 1 {
                break;
            }
            at = Some(prev);
        }
        Ok(out)
    }

    /// Pushes the configuration as it was at `revision` as a new revision
    /// (guarded like any push, against the current snapshot).
    pub async fn rollback(
        &self,
        prefix: &str,
        revision: i64,
        local: Option<&str>,
        who: &str,
    ) -> Result<PushOutcome, StoreError> {
        let old = self.snapshot(prefix, Some(revision)).await?;
        let current = self.snapshot(prefix, None).await?;
        let file = format!("{prefix} at revision {revision}");
        let push = Push {
            text: &old.text,
            file: &file,
            local,
            who,
            rollback_of: Some(revision),
            take_over: false,
        };
        self.push(prefix, &push, &current).await
    }

    /// Holds the fleet for the one load balancer `name` (a canary), or
    /// releases it (`None`). Returns the revision written.
    pub async fn set_hold(&self, prefix: &str, name: Option<&str>) -> Result<i64, StoreError> {
        let key = full_key(prefix, HOLD_KEY);
        // Both are idempotent: sent twice, the same hold.
        let header = match name {
            Some(name) => self
                .call("put", Retry::Unreachable, |c| {
                    let (key, name) = (key.clone(), name.to_string());
                    async move { c.kv_client().put(key, name, None).await }
                })
                .await?
                .header()
                .map(|h| h.revision()),
            None => self
                .call("delete", Retry::Unreachable, |c| {
                    let key = key.clone();
                    async move { c.kv_client().delete(key, None).await }
                })
                .await?
                .header()
                .map(|h| h.revision()),
        };
        Ok(header.unwrap_or(0))
    }

    /// The store's current revision, from a small read (the guard key's
    /// name only): whether etcd answers, for a watcher whose watch is quiet.
    pub async fn ping(&self, prefix: &str) -> Result<i64, StoreError> {
        let key = full_key(prefix, GUARD_KEY);
        let resp = self
            .call("range", Retry::Unreachable, |c| {
                let key = key.clone();
                async move {
                    c.kv_client()
                        .get(key, Some(GetOptions::new().with_keys_only()))
                        .await
                }
            })
            .await?;
        Ok(resp.header().map(|h| h.revision()).unwrap_or(0))
    }

    /// Watches everything under the prefix after `from_revision`.
    pub async fn watch(&self, prefix: &str, from_revision: i64) -> Result<Watch, StoreError> {
        let dir = full_key(prefix, "");
        let opts = WatchOptions::new()
            .with_prefix()
            .with_start_revision(from_revision + 1);
        let stream = self
            .call("watch", Retry::Unreachable, |c| {
                let (dir, opts) = (dir.clone(), opts.clone());
                async move {
                    c.watch_client()
                        .max_decoding_message_size(MAX_RESPONSE_BYTES)
                        .watch(dir, Some(opts))
                        .await
                }
            })
            .await?;
        Ok(Watch {
            stream,
            dir,
            from: from_revision,
            endpoints: self.endpoints.clone(),
            deadline: self.deadline,
        })
    }
}

/// A watch on a prefix.
pub struct Watch {
    stream: WatchStream,
    dir: String,
    from: i64,
    endpoints: String,
    deadline: Duration,
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch").field("from", &self.from).finish()
    }
}

impl Watch {
    /// Waits for the next change: the events of one response (whole
    /// revisions), keys relative to the prefix. No deadline: a watch waits
    /// for as long as nothing changes; the caller bounds it (and the
    /// client's keep-alive ends a dead stream).
    pub async fn next(&mut self) -> Result<Change, StoreError> {
        loop {
            let msg = self
                .stream
                .message()
                .await
                .map_err(|source| StoreError::Etcd {
                    endpoints: self.endpoints.clone(),
                    what: "watch",
                    deadline: self.deadline,
                    source,
                })?;
            let Some(resp) = msg else {
                return Err(StoreError::WatchEnded(
                    "the server closed the stream".into(),
                ));
            };
            if resp.compact_revision() > 0 {
                return Err(StoreError::Compacted {
                    from: self.from,
                    compacted: resp.compact_revision(),
                });
            }
            if resp.canceled() {
                return Err(StoreError::WatchEnded(resp.cancel_reason().to_string()));
            }
            let mut change = Change {
                revision: self.from,
                events: Vec::with_capacity(resp.events().len()),
            };
            for e in resp.events() {
                let Some(kv) = e.kv() else { continue };
                let Some(rel) = kv.key().strip_prefix(self.dir.as_bytes()) else {
                    continue;
                };
                let rel = String::from_utf8_lossy(rel).into_owned();
                change.revision = change.revision.max(kv.mod_revision());
                let put = match e.event_type() {
                    etcd_client::EventType::Put => Some((
                        String::from_utf8_lossy(kv.value()).into_owned(),
                        kv.mod_revision(),
                    )),
                    etcd_client::EventType::Delete => None,
                };
                change.events.push((rel, put));
            }
            if !change.events.is_empty() {
                self.from = change.revision;
                return Ok(change);
            }
        }
    }
}

fn is_compacted(e: &StoreError) -> bool {
    matches!(e, StoreError::Etcd { source, .. } if source.to_string().contains("compacted"))
}

fn revision_error(e: StoreError, at: Option<i64>) -> StoreError {
    match (at, &e) {
        (Some(revision), StoreError::Etcd { source, .. })
            if source.to_string().contains("compacted")
                || source.to_string().contains("future rev") =>
        {
            StoreError::Revision {
                revision,
                reason: source.to_string(),
            }
        }
        _ => e,
    }
}

/// Validates a push's text ([`lb::config::Config::parse`], merged with
/// its machine's part if given) and cuts it into keys.
fn prepare(push: &Push<'_>) -> Result<Vec<(String, String)>, StoreError> {
    let Push {
        text, file, local, ..
    } = *push;
    // Validating and cutting into keys each parse the whole text: for a
    // large fleet they take a good part of a second each, so they run
    // side by side.
    let validate = || -> Result<(), StoreError> {
        match local {
            Some(local) => {
                let merged = layout::merge(local, text).map_err(StoreError::Split)?;
                lb::config::Config::parse(&merged, file).map_err(StoreError::Invalid)?;
            }
            None => {
                lb::config::Config::parse(text, file).map_err(StoreError::Invalid)?;
            }
        }
        Ok(())
    };
    let (valid, new) = std::thread::scope(|scope| {
        let cut = scope.spawn(|| layout::split(text));
        let valid = validate();
        (valid, cut.join())
    });
    valid?;
    match new {
        Ok(r) => r.map_err(StoreError::Split),
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

/// Runs one etcd call with the deadline.
async fn bounded<T>(
    endpoints: &str,
    what: &'static str,
    deadline: Duration,
    call: impl Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(deadline, call).await {
        Err(_) => Err(StoreError::Deadline {
            endpoints: endpoints.to_string(),
            what,
            deadline,
        }),
        Ok(Err(source)) => Err(StoreError::Etcd {
            endpoints: endpoints.to_string(),
            what,
            deadline,
            source,
        }),
        Ok(Ok(v)) => Ok(v),
    }
}
