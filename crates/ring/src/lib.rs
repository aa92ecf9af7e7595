//! Shared-memory ring ports: the paravirtual NIC of "Speeding up packet I/O in
//! virtual machines" played by processes.
//!
//! A port is one memfd holding a header, a TX and an RX ring of slots, a
//! Communication Status Block (CSB) and a buffer area. The *device* side (the
//! switch, playing the hypervisor's NIC emulation) and the *driver* side (an
//! application, playing the guest) map it. Kicks (guest to host, the paper's
//! VM exits) and interrupts (host to guest) are eventfds.
//!
//! Ring indices are free-running `u32` counters, netmap's head/cur/tail with
//! the modulo taken at the slot (`counter & (slots - 1)`): one owner per
//! counter, and "is this value possible?" is a single subtraction, which is
//! what makes a hostile peer cheap to check.
//!
//! * TX: the driver owns `tx.head` (slots handed to the device) and `tx.cur`
//!   (its wake-up point); the device owns `tx.tail` (slots it has finished
//!   with). The driver may fill while `head - tail < slots`.
//! * RX: the device owns `rx.tail` (slots it has filled); the driver owns
//!   `rx.head` (slots it has released) and `rx.cur`. The device may fill
//!   while `tail - head < slots`.
//!
//! Nothing the peer writes is trusted by the device: see [`device`].

pub mod control;
pub mod device;
pub mod driver;
pub mod layout;
pub mod notify;
pub mod shm;

pub use layout::{Geometry, Slot};
pub use notify::{EventFd, Mode};

/// Errors of ring set-up and of the attach protocol.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{what}: {source}")]
    Sys {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid ring geometry: {0}")]
    Geometry(String),
    #[error("shared memory does not hold a valid port: {0}")]
    BadRegion(String),
    #[error("attach protocol: {0}")]
    Protocol(String),
    #[error("switch refused the port: {0}")]
    Refused(String),
}

pub type Result<T> = std::result::Result<T, Error>;

pub(crate) fn sys(what: &'static str) -> Error {
    Error::Sys {
        what,
        source: std::io::Error::last_os_error(),
    }
}
