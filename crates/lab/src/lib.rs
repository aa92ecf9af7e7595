//! Throwaway networks: what fastpath's tests, demos and benchmarks build
//! around the libraries, and never part of them. Network namespaces and
//! veth pairs ([`netns`], a crate of its own re-exported here), the load
//! balancer's namespace topology with BIRD
//! and nginx ([`topology`]), the demo that shows it to a person ([`demo`]),
//! sample traffic for the forwarder ([`sample`]), the soak that runs
//! the load balancer under load while faults are injected ([`soak`]),
//! QEMU guests attached to the switch, to QEMU's TAP backend or as an
//! emulated e1000 ([`guest`]), and the demo of two guests talking through
//! the switch ([`switch_demo`]), and a three-member etcd cluster for the
//! fleet's configuration ([`etcd`]).
//!
//! Everything here creates what it needs and removes it again when dropped,
//! also when a test panics. Addresses live only inside the namespaces it
//! creates.

pub mod demo;
pub mod etcd;
pub mod guest;
pub mod quic;
pub mod soak;
pub mod switch_demo;
pub mod topology;

/// Sample traffic for the forwarder: a crate of its own (lb's tests use it
/// without the daemon), re-exported here.
pub use lb_sample as sample;
pub use netns;

use std::io;

/// `command`'s standard output and error, both appended to the file `log`
/// (created if need be), so that a process's story survives its restarts.
pub fn log_to(command: &mut std::process::Command, log: &std::path::Path) -> Result<()> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(Error::io(log.display()))?;
    let err = file.try_clone().map_err(Error::io(log.display()))?;
    command.stdout(file).stderr(err);
    Ok(())
}

/// Why a throwaway network could not be built, used or shown.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// This machine cannot build namespaces (not root, or no iproute2).
    #[error("needs root and iproute2 (network namespaces): run as root after scripts/setup.sh")]
    Unavailable,
    /// A namespace, a veth pair, a program or a command failed, a file or
    /// system call failed, or a thread panicked: the netns crate's error,
    /// which this crate's code uses for the same things outside namespaces.
    #[error(transparent)]
    Netns(#[from] netns::Error),
    /// An HTTP exchange through the VIP ended early or said too much.
    #[error("HTTP: {0}")]
    Http(String),
    /// An address written in this crate does not parse.
    #[error("address {addr}: {source}")]
    Address {
        /// The text.
        addr: String,
        /// Why it does not parse.
        #[source]
        source: std::net::AddrParseError,
    },
    /// The load balancer's API did not answer a request.
    #[error("API {request}: {source}")]
    Api {
        /// The request (method and path).
        request: String,
        /// The API client's answer.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The network did not do what it must within its time.
    #[error("{what}{}", if .logs.is_empty() { String::new() } else { format!("\n{}", .logs) })]
    Timeout {
        /// What did not happen in time.
        what: String,
        /// What every process printed, for diagnosis.
        logs: String,
    },
    /// The user interrupted (SIGINT or SIGTERM).
    #[error("interrupted: removing everything that was created")]
    Interrupted,
    /// A QEMU guest could not be booted or driven.
    #[error(transparent)]
    Guest(#[from] guest::GuestError),
}

/// What this crate's fallible functions return.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A file or system call's failure ([`netns::Error::Io`]) saying what
    /// was being done.
    pub fn io(what: impl std::fmt::Display) -> impl FnOnce(io::Error) -> Error {
        let what = what.to_string();
        move |source| Error::Netns(netns::Error::Io { what, source })
    }
}
