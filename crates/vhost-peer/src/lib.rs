//! A vhost-user frontend of our own, for tests and benchmarks: it speaks
//! the protocol to a backend (the switch's VM port) the way QEMU does,
//! shares a memfd as guest memory, and lays out and fills the virtio split
//! rings itself, so that its user can make it lie: send malformed
//! messages, put impossible values in the rings, shrink or swap its
//! memory, disconnect half-way. It is not part of the product and makes no
//! promise beyond what the tests and benchmarks that use it need.
//!
//! - [`wire`]: the connection, message by message ([`Wire`]), request
//!   codes ([`req`]) and the payloads the frontend sends.
//! - [`mem`]: guest memory ([`SharedMem`]).
//! - [`virtq`]: where a queue's rings lie ([`Layout`]) and one descriptor
//!   as the frontend writes it ([`RawDesc`]).
//! - [`guest`]: a well-behaved frontend with one queue pair ([`Guest`]),
//!   every value of which its user may change.
//! - [`mq`]: a well-behaved frontend with several queue pairs
//!   ([`MqGuest`]), set up as QEMU's `-netdev vhost-user,queues=N` sets
//!   them up.
//!
//! Two ways to run the backend beside it. A backend driven in the
//! caller's own thread (a test stepping the switch) is pumped while the
//! frontend waits for a reply: the `*_pumped` calls take the pump. A
//! backend running in a thread or process of its own is simply waited
//! for: the plain calls block in `poll(2)` up to their deadline.

pub mod guest;
pub mod mem;
pub mod mq;
pub mod virtq;
pub mod wire;

pub use guest::{eventfd, Guest, BIG_MEM, BIG_RX, BIG_TX, BUF, HDR, MEM, RX_BUFS, TX_BUFS};
pub use mem::SharedMem;
pub use mq::{mq_mem, MqGuest, MQ_BUFS, MQ_MAX_NUM};
pub use virtq::{Layout, RawDesc, F_INDIRECT, F_NEXT, F_WRITE, LARGE_BUFS, LARGE_MEM};
pub use wire::{
    inflight, mem_table, req, state, u64p, vring_addr, Wire, FEATURES, NEED_REPLY,
    OFFLOAD_FEATURES, PROTOCOL_F_INFLIGHT_SHMFD, PROTOCOL_F_MQ, REPLY_TIMEOUT, VERSION,
};

/// What can go wrong for the frontend.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A system call failed (`what` names it).
    #[error("{what}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// The backend did not answer a request that expects a reply.
    #[error("no reply to {0} within the deadline")]
    NoReply(&'static str),
    /// More descriptors than one message carries.
    #[error("{0} descriptors in one message: at most 8")]
    TooManyFds(usize),
    /// The socket took part of a message.
    #[error("short send: {sent} of {len} bytes")]
    ShortSend {
        /// Bytes sent.
        sent: usize,
        /// Bytes of the message.
        len: usize,
    },
}

impl Error {
    /// An [`Error::Io`] maker for `map_err`.
    pub(crate) fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> Error {
        move |source| Error::Io { what, source }
    }
}

/// Results of this crate.
pub type Result<T> = std::result::Result<T, Error>;
