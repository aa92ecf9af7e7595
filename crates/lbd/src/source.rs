//! Where the configuration comes from (`lb run --config` or
//! `--config-etcd`): the first read from etcd, before anything starts,
//! and what the follower of the fleet's prefix (`tasks::etcd`) records
//! for `/status`.
//!
//! The configuration is this machine's own file (its `[api]`, `[encap]`,
//! `[bgp]`, ...) merged with the fleet's part, read from etcd at one
//! revision ([`fleetconf::merge`]): a top-level name is either the
//! machine's or the fleet's. A hold (`fastpath lb config hold NAME`)
//! naming another load balancer makes the follower wait, and say so.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// Why the configuration could not be read from etcd at start.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    /// etcd did not answer, or what it holds is not a configuration.
    #[error(transparent)]
    Store(Box<fleetconf::StoreError>),
    /// The local file and the fleet's part cannot be merged.
    #[error(transparent)]
    Layout(Box<fleetconf::LayoutError>),
    /// The local file could not be read.
    #[error("reading {path}: {source}")]
    Local {
        /// The local file.
        path: PathBuf,
        /// The system's answer.
        #[source]
        source: std::io::Error,
    },
    /// The runtime for the first read could not be made.
    #[error("starting a runtime for the first read from etcd: {0}")]
    Runtime(#[source] std::io::Error),
}

impl From<fleetconf::StoreError> for EtcdError {
    fn from(e: fleetconf::StoreError) -> Self {
        EtcdError::Store(Box::new(e))
    }
}

impl From<fleetconf::LayoutError> for EtcdError {
    fn from(e: fleetconf::LayoutError) -> Self {
        EtcdError::Layout(Box::new(e))
    }
}

/// Where the configuration comes from, read once before the daemon starts.
#[derive(Debug)]
pub struct Start {
    /// How to reach etcd (endpoints, deadline, TLS, a user).
    pub access: fleetconf::Access,
    /// The fleet's prefix.
    pub prefix: String,
    /// This load balancer's name (the hold names it).
    pub name: String,
    /// The machine's own file, if any.
    pub local: Option<PathBuf>,
    /// Its text (empty without one).
    pub local_text: String,
    /// The prefix as read at start.
    pub snapshot: fleetconf::Snapshot,
}

impl Start {
    /// Reads `local` and the prefix at one revision, on a runtime of its
    /// own, each etcd call bounded by the access's deadline.
    pub fn read(
        access: fleetconf::Access,
        prefix: String,
        name: String,
        local: Option<&Path>,
    ) -> Result<Start, EtcdError> {
        let local_text = match local {
            Some(p) => lb::Config::read(p).map_err(|e| EtcdError::Local {
                path: p.to_path_buf(),
                source: std::io::Error::other(e.to_string()),
            })?,
            None => String::new(),
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(EtcdError::Runtime)?;
        let snapshot = rt.block_on(async {
            let store = fleetconf::Store::connect_with(&access).await?;
            let snap = store.snapshot(&prefix, None).await?;
            match &snap.pending {
                // Part-way through a staged push: start with the last
                // complete configuration, the one before its marker (the
                // follower waits for the push's end).
                Some(p) => store.snapshot(&prefix, Some(p.revision - 1)).await,
                None => Ok(snap),
            }
        })?;
        Ok(Start {
            access,
            prefix,
            name,
            local: local.map(Path::to_path_buf),
            local_text,
            snapshot,
        })
    }

    /// How errors name the configuration: `etcd:PREFIX@REVISION`.
    pub fn label(&self) -> String {
        label(&self.prefix, self.snapshot.revision)
    }

    /// The local file and the fleet's part as one text.
    pub fn text(&self) -> Result<String, EtcdError> {
        Ok(fleetconf::merge(&self.local_text, &self.snapshot.text)?)
    }
}

/// How errors name the configuration at `revision`.
pub(crate) fn label(prefix: &str, revision: i64) -> String {
    format!("etcd:{prefix}@{revision}")
}

/// [`lb::Config::load_with`] of a text not read from a file: the one
/// validation of a file that runs, for the configuration from etcd.
pub fn check_text(
    text: String,
    label: &str,
    cache: &mut lb::config::ParseCache,
) -> Result<lb::config::Checked, lb::config::ConfigError> {
    let mut checked = lb::Config::check_text(text, label, cache)?;
    let warnings = checked.config.check_runnable(label)?;
    checked.warnings.extend(warnings);
    Ok(checked)
}

/// The follower's state, shared with `/status`.
#[derive(Debug)]
pub struct EtcdSource {
    access: fleetconf::Access,
    prefix: String,
    name: String,
    local: Option<PathBuf>,
    local_text: String,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    applied_revision: i64,
    pushed_revision: i64,
    applied_hash: String,
    applied_unix_s: u64,
    refused: Option<(i64, String, String)>,
    answered: Option<Instant>,
    held_by: Option<String>,
    waiting_revision: Option<i64>,
    staging: Option<(String, i64)>,
    last_error: Option<String>,
    applied_total: u64,
    refused_total: u64,
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl EtcdSource {
    /// The follower's state after the start applied `start.snapshot`.
    pub fn new(start: Start) -> EtcdSource {
        let state = State {
            applied_revision: start.snapshot.revision,
            pushed_revision: start.snapshot.guard_revision,
            applied_hash: fleetconf::text_hash(&start.snapshot.text),
            applied_unix_s: unix_now(),
            answered: Some(Instant::now()),
            ..State::default()
        };
        EtcdSource {
            access: start.access,
            prefix: start.prefix,
            name: start.name,
            local: start.local,
            local_text: start.local_text,
            state: Mutex::new(state),
        }
    }

    /// The fleet's prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How to reach etcd.
    pub(crate) fn access(&self) -> &fleetconf::Access {
        &self.access
    }

    /// The machine's own file's text (empty without one).
    pub(crate) fn local_text(&self) -> &str {
        &self.local_text
    }

    /// etcd failed: what, while it lasts.
    pub(crate) fn failed(&self, error: String) {
        self.state().last_error = Some(error);
    }

    /// What to do with `snap`, recording a hold: [`Decision::Apply`] only
    /// when this load balancer may apply it and it is neither running nor
    /// refused already.
    pub(crate) fn decide(&self, snap: &fleetconf::Snapshot) -> Decision {
        let mut s = self.state();
        if let Some(p) = &snap.pending {
            s.staging = Some((p.who.clone(), p.revision));
            s.waiting_revision = Some(snap.revision);
            return Decision::Pending(p.who.clone());
        }
        s.staging = None;
        let hash = fleetconf::text_hash(&snap.text);
        if let Some(h) = snap.hold.as_ref().filter(|h| **h != self.name) {
            s.held_by = Some(h.clone());
            s.waiting_revision = (hash != s.applied_hash).then_some(snap.revision);
            return Decision::Held(h.clone());
        }
        s.held_by = None;
        s.waiting_revision = None;
        if hash == s.applied_hash {
            s.applied_revision = snap.revision;
            s.pushed_revision = snap.guard_revision;
            return Decision::Running;
        }
        if s.refused.as_ref().is_some_and(|r| r.2 == hash) {
            return Decision::Refused;
        }
        Decision::Apply(hash)
    }

    /// `snap` (of text hash `hash`) runs now.
    pub(crate) fn applied(&self, snap: &fleetconf::Snapshot, hash: String) {
        let mut s = self.state();
        s.applied_revision = snap.revision;
        s.pushed_revision = snap.guard_revision;
        s.applied_hash = hash;
        s.applied_unix_s = unix_now();
        s.applied_total += 1;
    }

    /// The keys at `revision` do not make a configuration (`error`).
    pub(crate) fn unreadable(&self, revision: i64, error: String) {
        let mut s = self.state();
        s.staging = None;
        s.refused = Some((revision, error, String::new()));
        s.refused_total += 1;
    }

    /// `snap` (of text hash `hash`) was refused for `error`.
    pub(crate) fn refused(&self, snap: &fleetconf::Snapshot, hash: String, error: String) {
        let mut s = self.state();
        s.refused = Some((snap.revision, error, hash));
        s.refused_total += 1;
    }

    /// etcd answered.
    pub(crate) fn answered(&self) {
        let mut s = self.state();
        s.answered = Some(Instant::now());
        s.last_error = None;
    }

    /// What `/status` says of it.
    pub fn status(&self) -> ConfigSourceStatus {
        let s = self.state();
        ConfigSourceStatus {
            kind: "etcd".into(),
            path: self.local.as_ref().map(|p| p.display().to_string()),
            endpoints: self.access.endpoints.clone(),
            tls: self.access.uses_tls(),
            user: self.access.user().map(str::to_string),
            prefix: Some(self.prefix.clone()),
            name: Some(self.name.clone()),
            applied_revision: Some(s.applied_revision),
            pushed_revision: Some(s.pushed_revision),
            applied_unix_s: Some(s.applied_unix_s),
            refused_revision: s.refused.as_ref().map(|r| r.0),
            refused_error: s.refused.as_ref().map(|r| r.1.clone()),
            etcd_answered_s_ago: s.answered.map(|t| t.elapsed().as_secs_f64()),
            held_by: s.held_by.clone(),
            waiting_revision: s.waiting_revision,
            push_in_progress: s
                .staging
                .as_ref()
                .map(|(who, rev)| format!("{who} since revision {rev}")),
            last_error: s.last_error.clone(),
            applied_total: s.applied_total,
            refused_total: s.refused_total,
        }
    }
}

/// What the follower does with a revision read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Apply it (its text's hash).
    Apply(String),
    /// Another load balancer holds the fleet.
    Held(String),
    /// A push staged in several transactions is part-way (by whom).
    Pending(String),
    /// It is what runs.
    Running,
    /// It was refused already.
    Refused,
}

/// Where the running configuration comes from (`/status` `config_source`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ConfigSourceStatus {
    /// `file` or `etcd`.
    pub kind: String,
    /// The configuration file (for etcd: the machine's own file, if any).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// etcd's client URLs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub endpoints: Vec<String>,
    /// Whether the members are reached over TLS.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tls: bool,
    /// The etcd user, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// The fleet's prefix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// This load balancer's name (what a hold names).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The etcd revision whose configuration runs (the newest revision
    /// read that holds it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_revision: Option<i64>,
    /// The revision of the push whose configuration runs (the guard key's:
    /// the same on every load balancer that runs it; 0: never pushed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pushed_revision: Option<i64>,
    /// When it was applied, seconds since the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_unix_s: Option<u64>,
    /// The last revision refused (invalid): the running one stayed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused_revision: Option<i64>,
    /// Why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused_error: Option<String>,
    /// Seconds since etcd last answered: how old this view may be.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd_answered_s_ago: Option<f64>,
    /// Another load balancer holds the fleet (a canary): this one waits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_by: Option<String>,
    /// The revision this one waits to apply while held or while a push
    /// is being staged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_revision: Option<i64>,
    /// A push staged in several transactions, part-way (who, since which
    /// revision): this one runs the last complete configuration meanwhile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub push_in_progress: Option<String>,
    /// The last failure to reach etcd, while it lasts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// Revisions applied since start (after the first).
    #[serde(default)]
    pub applied_total: u64,
    /// Revisions refused since start (invalid, or keys that do not join).
    #[serde(default)]
    pub refused_total: u64,
}

impl ConfigSourceStatus {
    /// The configuration file `path`.
    pub fn file(path: &Path) -> ConfigSourceStatus {
        ConfigSourceStatus {
            kind: "file".into(),
            path: Some(path.display().to_string()),
            ..ConfigSourceStatus::default()
        }
    }

    /// One or two lines for `fastpath lb status`: where the configuration
    /// comes from, and for etcd the revision that runs, any refused or
    /// waiting one, and how old the view is.
    pub fn to_text(&self) -> String {
        if self.kind != "etcd" {
            return format!(
                "configuration: file {}\n",
                self.path.as_deref().unwrap_or("?")
            );
        }
        let mut s = format!(
            "configuration: etcd {}{} prefix {} as {}: revision {} applied (push {}), etcd answered {:.1} s ago\n",
            self.endpoints.join(","),
            match (self.tls, &self.user) {
                (false, None) => String::new(),
                (true, None) => " (TLS)".to_string(),
                (false, Some(u)) => format!(" (user {u})"),
                (true, Some(u)) => format!(" (TLS, user {u})"),
            },
            self.prefix.as_deref().unwrap_or("?"),
            self.name.as_deref().unwrap_or("?"),
            self.applied_revision.unwrap_or(0),
            self.pushed_revision.unwrap_or(0),
            self.etcd_answered_s_ago.unwrap_or(f64::NAN),
        );
        if let (Some(r), Some(e)) = (self.refused_revision, &self.refused_error) {
            s += &format!("  REFUSED revision {r}: {e}\n");
        }
        if let Some(h) = &self.held_by {
            match self.waiting_revision {
                Some(r) => s += &format!("  held for {h}: revision {r} waits for the release\n"),
                None => s += &format!("  held for {h}\n"),
            }
        }
        if let Some(p) = &self.push_in_progress {
            s += &format!(
                "  waiting for a push by {p} to finish (staged in several transactions)\n"
            );
        }
        if let Some(e) = &self.last_error {
            s += &format!("  etcd unreachable: {e}\n");
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn snap(revision: i64, text: &str, hold: Option<&str>) -> fleetconf::Snapshot {
        fleetconf::Snapshot {
            revision,
            text: text.into(),
            keys: Vec::new(),
            guard_revision: revision,
            pushed: None,
            hold: hold.map(str::to_string),
            pending: None,
        }
    }

    fn source(name: &str) -> EtcdSource {
        EtcdSource::new(Start {
            access: fleetconf::Access::plain(
                vec!["http://198.19.250.1:2379".into()],
                Duration::from_secs(1),
            ),
            prefix: "/fastpath/t".into(),
            name: name.into(),
            local: None,
            local_text: String::new(),
            snapshot: snap(5, "a", None),
        })
    }

    #[test]
    fn a_hold_for_another_load_balancer_makes_this_one_wait() {
        let s = source("lb2");
        assert_eq!(
            s.decide(&snap(6, "b", Some("lb1"))),
            Decision::Held("lb1".into())
        );
        let st = s.status();
        assert_eq!(st.held_by.as_deref(), Some("lb1"));
        assert_eq!(st.waiting_revision, Some(6));
        assert_eq!(st.applied_revision, Some(5));
        assert!(
            st.to_text().contains("held for lb1: revision 6 waits"),
            "{}",
            st.to_text()
        );
        // The canary itself applies.
        let canary = source("lb1");
        assert!(matches!(
            canary.decide(&snap(6, "b", Some("lb1"))),
            Decision::Apply(_)
        ));
        // Released: this one applies the waiting revision.
        assert!(matches!(s.decide(&snap(7, "b", None)), Decision::Apply(_)));
        assert_eq!(s.status().held_by, None);
    }

    #[test]
    fn a_push_part_way_makes_it_wait_and_say_by_whom() {
        let s = source("lb1");
        let mut part_way = snap(6, "", None);
        part_way.pending = Some(fleetconf::PushRecord {
            who: "ops@host".into(),
            when_unix_s: 1,
            hash: "0".into(),
            read_revision: 5,
            rollback_of: None,
            revision: 6,
        });
        assert_eq!(s.decide(&part_way), Decision::Pending("ops@host".into()));
        let st = s.status();
        assert_eq!(st.applied_revision, Some(5), "the running one stays");
        assert_eq!(st.waiting_revision, Some(6));
        assert!(
            st.to_text()
                .contains("waiting for a push by ops@host since revision 6"),
            "{}",
            st.to_text()
        );
        // Its last transaction: applied, and no longer waiting.
        assert!(matches!(s.decide(&snap(9, "b", None)), Decision::Apply(_)));
        assert_eq!(s.status().push_in_progress, None);
    }

    #[test]
    fn the_running_text_is_not_applied_again_nor_a_refused_one_retried() {
        let s = source("lb1");
        // Only the hold changed: the same text runs, at the newer revision.
        assert_eq!(s.decide(&snap(6, "a", None)), Decision::Running);
        assert_eq!(s.status().applied_revision, Some(6));
        let bad = snap(7, "bad", None);
        let Decision::Apply(hash) = s.decide(&bad) else {
            panic!("a new text is applied");
        };
        s.refused(&bad, hash, "vips[0].pool: no such pool".into());
        assert_eq!(s.decide(&snap(8, "bad", None)), Decision::Refused);
        let st = s.status();
        assert_eq!(st.refused_revision, Some(7));
        assert_eq!(st.applied_revision, Some(6), "the running revision stays");
        assert!(
            st.to_text().contains("REFUSED revision 7: vips[0].pool"),
            "{}",
            st.to_text()
        );
        let good = snap(9, "c", None);
        let Decision::Apply(hash) = s.decide(&good) else {
            panic!("a new text is applied");
        };
        s.applied(&good, hash);
        assert_eq!(s.status().applied_revision, Some(9));
        assert_eq!(s.decide(&snap(10, "c", None)), Decision::Running);
    }
}
