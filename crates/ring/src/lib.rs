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
//!
//! # Example
//!
//! ```
//! use std::time::Instant;
//! use ring::{device::DevicePort, driver::Driver, Geometry, Mode};
//!
//! // The device creates the port; the driver adopts its three descriptors
//! // (which `control`'s attach protocol passes between processes).
//! let mut dev = DevicePort::create("doc", Geometry::default(), Mode::Csb, 0)?;
//! let [region, kick, irq] = dev.driver_fds()?;
//! let mut drv = Driver::new(region, kick, irq, Mode::Csb)?;
//! let queued = drv.send(1, |_, buf| {
//!     buf[..5].copy_from_slice(b"hello");
//!     5
//! });
//! let waiting = dev.poll(); // with a CSB the device reads the driver's counters
//! let mut frames = Vec::new();
//! let taken = dev.tx_peek(waiting, &mut frames);
//! assert_eq!((queued, taken, frames[0].len), (1, 1, 5));
//! dev.tx_complete(taken, 1, Instant::now());
//! assert_eq!(drv.tx_space(), Geometry::default().slots);
//! # Ok::<(), ring::Error>(())
//! ```
//!
//! `cargo run -p ring --example exchange` goes further: a switch thread and
//! an application attached over the control socket, frames both ways in
//! each notification mode, and the kicks and interrupts each one cost.

pub mod control;
pub mod device;
pub mod driver;
pub mod layout;
pub mod notify;
pub mod shm;
pub mod signaller;
pub mod sockpath;

pub use layout::{Geometry, Slot};
pub use notify::{EventFd, Mode};

/// Errors of ring set-up and of the attach protocol.
///
/// Each module's own failure kinds are an enum of that module
/// ([`layout::GeometryError`], [`shm::RegionError`],
/// [`control::ProtocolError`]), composed here; a failed system call keeps its
/// [`std::io::Error`] so that callers can match the errno.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A system call failed.
    #[error("{what}: {source}")]
    Sys {
        /// What was being done, e.g. "memfd_create".
        what: &'static str,
        /// The system's answer.
        #[source]
        source: std::io::Error,
    },
    /// The requested ring geometry is not one a port can have.
    #[error("invalid ring geometry: {0}")]
    Geometry(#[from] layout::GeometryError),
    /// The port name cannot name a memfd.
    #[error("port name {name:?} contains a NUL byte")]
    PortName {
        /// The name as given.
        name: String,
    },
    /// A descriptor handed over as a port region does not hold a valid port.
    #[error("shared memory does not hold a valid port: {0}")]
    BadRegion(#[from] shm::RegionError),
    /// The peer on the control socket broke the attach protocol.
    #[error("attach protocol: {0}")]
    Protocol(#[from] control::ProtocolError),
    /// The switch answered, and said no: its reason, as it gave it.
    #[error("switch refused the port: {0}")]
    Refused(String),
    /// A socket path holds something that is not ours to replace.
    #[error(transparent)]
    Path(#[from] sockpath::SocketPathError),
}

/// The result of ring operations.
pub type Result<T> = std::result::Result<T, Error>;

/// `map_err` adapter for a failed system call: `.map_err(sys("what"))`.
/// Takes rustix's `Errno` as well as `std::io::Error`; either way the errno is
/// kept in [`Error::Sys`].
pub(crate) fn sys<E: Into<std::io::Error>>(what: &'static str) -> impl FnOnce(E) -> Error {
    move |e| Error::Sys {
        what,
        source: e.into(),
    }
}
