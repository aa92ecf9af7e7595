//! One load-balancer configuration for a whole fleet, kept in etcd.
//!
//! The configuration is the TOML of the file form ([`lb::config`]), cut
//! into keys under a fleet's prefix ([`layout`]): one per section, pool,
//! VIP and QUIC-LB codepoint, each far under etcd's request limit. A load
//! balancer reads the whole prefix at one revision ([`Store::snapshot`]),
//! validates it with [`lb::config::Config::parse`] (the one validation of
//! `check-config` and the daemon) and watches from that revision
//! ([`Store::watch`]). An operator pushes a file in one transaction
//! guarded by the revision read ([`Store::push`]), so two pushes cannot
//! interleave; [`Store::history`], [`Store::rollback`] and the canary hold
//! ([`Store::set_hold`]) complete the operations.

pub mod layout;
mod store;

pub use layout::{join, split, LayoutError};
pub use store::{
    text_hash, Push, PushOutcome, PushRecord, Snapshot, Store, StoreError, TxnLimits, Watch,
    ETCD_DEFAULT_MAX_REQUEST_BYTES, ETCD_DEFAULT_MAX_TXN_OPS, GUARD_KEY, HOLD_KEY, MAX_HISTORY,
    MAX_RESPONSE_BYTES,
};

/// A machine's own part (`local`: its `[api]`, `[encap]`, `[bgp]`,
/// `[fleet]`, ... as a file) and the fleet's part (from etcd) as one
/// configuration text. A top-level name is either the machine's or the
/// fleet's, never both: a local `[[pools]]` beside the fleet's would make
/// this machine's tables differ from the fleet's, and a section in both
/// would leave it unclear which one runs. Refused with the names.
pub fn merge(local: &str, fleet: &str) -> Result<String, LayoutError> {
    let names = |text: &str| -> Result<Vec<String>, LayoutError> {
        let doc: toml_edit::DocumentMut = text.parse()?;
        Ok(doc.as_table().iter().map(|(k, _)| k.to_string()).collect())
    };
    let fleet_names = names(fleet)?;
    let both: Vec<String> = names(local)?
        .into_iter()
        .filter(|n| fleet_names.contains(n))
        .collect();
    if !both.is_empty() {
        return Err(LayoutError::Overlap(both));
    }
    let mut text = String::with_capacity(local.len() + fleet.len() + 1);
    text.push_str(local);
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(fleet);
    Ok(text)
}

/// How a file differs from what is stored, key by key (keys relative to
/// the prefix).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Diff {
    /// Keys the file adds.
    pub added: Vec<String>,
    /// Keys whose value the file changes.
    pub changed: Vec<String>,
    /// Keys the file no longer has.
    pub removed: Vec<String>,
}

impl Diff {
    /// Nothing differs.
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.changed.is_empty() && self.removed.is_empty()
    }
}

/// The key-by-key difference from `old` (stored) to `new` (a file split).
pub fn diff(old: &[(String, String)], new: &[(String, String)]) -> Diff {
    let old_map: std::collections::HashMap<&str, &str> =
        old.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let new_keys: std::collections::HashSet<&str> = new.iter().map(|(k, _)| k.as_str()).collect();
    let mut d = Diff::default();
    for (k, v) in new {
        match old_map.get(k.as_str()) {
            None => d.added.push(k.clone()),
            Some(o) if o != v => d.changed.push(k.clone()),
            Some(_) => {}
        }
    }
    for (k, _) in old {
        if !new_keys.contains(k.as_str()) {
            d.removed.push(k.clone());
        }
    }
    d
}
