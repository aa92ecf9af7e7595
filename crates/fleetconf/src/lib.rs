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

pub mod access;
pub mod layout;
mod store;

pub use access::{Access, AccessError, Bootstrap};
pub use layout::{diff, join, merge, split, Diff, LayoutError};
pub use store::{
    text_hash, Change, Mirror, Push, PushOutcome, PushRecord, Snapshot, Store, StoreError,
    TxnLimits, Watch, ETCD_DEFAULT_MAX_REQUEST_BYTES, ETCD_DEFAULT_MAX_TXN_OPS, GUARD_KEY,
    HOLD_KEY, KEEP_ALIVE_EVERY, MAX_HISTORY, MAX_RESPONSE_BYTES, PENDING_KEY, REQUEST_MARGIN_BYTES,
};
