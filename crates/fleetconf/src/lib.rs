//! One load-balancer configuration for a whole fleet, kept in etcd.
//!
//! The configuration is the TOML of the file form ([`lb::config`]), cut
//! into keys under a fleet's prefix ([`layout`]): one per section, pool,
//! VIP and QUIC-LB codepoint, each far under etcd's request limit. A load
//! balancer reads the whole prefix at one revision ([`Store::list`]),
//! validates it with [`lb::config::Config::parse`] (the one validation of
//! `check-config` and the daemon), then keeps its copy current with the
//! watch's events ([`Store::watch`], [`Mirror`]). An operator pushes a
//! file in one transaction guarded by the revision read ([`Store::push`]),
//! so two pushes cannot interleave; a push too large for one transaction
//! is staged behind a marker ([`PENDING_KEY`]) that followers wait on.
//! [`Store::history`], [`Store::rollback`] and the canary hold
//! ([`Store::set_hold`]) complete the operations. How to reach the
//! cluster (TLS, a user) is an [`Access`], from the command line or a
//! bootstrap file ([`Bootstrap`]).

pub mod access;
pub mod layout;
mod store;

pub use access::{Access, AccessError, Bootstrap, KEEP_ALIVE_EVERY};
pub use layout::{diff, join, merge, split, Diff, LayoutError};
pub use store::{
    text_hash, Change, Mirror, Push, PushOutcome, PushRecord, Snapshot, Store, StoreError,
    TxnLimits, Watch, ETCD_DEFAULT_MAX_REQUEST_BYTES, ETCD_DEFAULT_MAX_TXN_OPS, GUARD_KEY,
    HOLD_KEY, MAX_HISTORY, MAX_RESPONSE_BYTES, PENDING_KEY, REQUEST_MARGIN_BYTES,
};
