//! The vhost-user protocol, backend side: the frontend (QEMU) connects to
//! the port's socket and sets the device up with messages: features, the
//! guest's memory table (one memfd per region), and for each queue its
//! size, ring addresses, starting index, kick and call eventfds.
//!
//! The `vhost` crate frames the messages ([`BackendReqHandler`]); this
//! module's [`Frontend`] is its handler ([`VhostUserBackendReqHandlerMut`])
//! and holds what the frontend said, checked; the port builds its datapath
//! from it. [`Connection`] drives one connection from the switch's event
//! loop, without ever blocking it:
//!
//! - the socket is non-blocking, and a message is handed to the crate only
//!   once all of it has arrived (`FIONREAD` against the size in its peeked
//!   header), because the crate's receive loops on a short read: a
//!   frontend that sends half a message only holds its own connection,
//!   which is closed when the rest has not come within
//!   [`PARTIAL_TIMEOUT`];
//! - replies are written to the non-blocking socket: a frontend that does
//!   not read them fills its socket and is disconnected, it cannot stall us.
//!
//! Features claimed: `VERSION_1`, `EVENT_IDX` (unless turned off),
//! `MRG_RXBUF` (a frame larger than one receive buffer is spread over
//! several), the checksum and TCP segmentation offloads both ways (`CSUM`,
//! `GUEST_CSUM`, `HOST_TSO4/6`, `GUEST_TSO4/6`; unless turned off: every
//! header a guest sends is checked, `crate::offload`), and
//! `PROTOCOL_FEATURES` with two protocol features of our own,
//! `INFLIGHT_SHMFD` (the in-flight region, [`super::inflight`]) and `MQ`
//! (`GET_QUEUE_NUM` answers the port's queue pairs, [`Offer::queue_pairs`];
//! with more than one, `VIRTIO_NET_F_MQ` is offered too). The crate
//! adds `REPLY_ACK` to every offer and answers it itself.
//!
//! Several queue pairs: queue `2k` receives and `2k + 1` transmits for pair
//! `k`. QEMU sets each pair up as a device of its own on the one
//! connection, and enables the pairs the guest's driver turned on
//! (`SET_VRING_ENABLE`; the guest changes them with `ethtool -L`). Every
//! request naming a queue beyond the pairs offered is refused and closes
//! the connection; a queue that is enabled before its ring is set up, or
//! set up but not enabled, is not served (its kicks are drained and
//! counted, nothing more); each queue has its own size.
//!
//! One ordering quirk of QEMU is absorbed here: QEMU enables the rings
//! (`SET_VRING_ENABLE`, asking for a reply) when the NIC is created, before
//! any `SET_FEATURES`. The crate refuses that message (its protocol-features
//! bit is not acknowledged yet) after reading it, without a reply; QEMU
//! would then wait for the reply forever. The connection peeks each
//! message's header first, so it knows that this refusal is that message:
//! it applies the enable itself and sends the reply QEMU waits for.
//!
//! Any other error closes the connection (the frontend may reconnect): a
//! refused value ([`Refusal`]) says why.

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rustix::event::epoll;
use rustix::net::RecvFlags;
use vhost::vhost_user::message::{
    VhostTransferStateDirection, VhostTransferStatePhase, VhostUserConfigFlags, VhostUserInflight,
    VhostUserLog, VhostUserMemoryRegion, VhostUserProtocolFeatures, VhostUserShMemConfig,
    VhostUserSharedMsg, VhostUserSingleMemoryRegion, VhostUserVirtioFeatures,
    VhostUserVringAddrFlags, VhostUserVringState, MAX_MSG_SIZE,
};
use vhost::vhost_user::{
    Backend, BackendReqHandler, Error as VuError, GpuBackend, VhostUserBackendReqHandlerMut,
};
use vhost::VhostUserMemoryRegionBase;
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_net::{
    VIRTIO_NET_F_CSUM, VIRTIO_NET_F_GUEST_CSUM, VIRTIO_NET_F_GUEST_TSO4, VIRTIO_NET_F_GUEST_TSO6,
    VIRTIO_NET_F_HOST_TSO4, VIRTIO_NET_F_HOST_TSO6, VIRTIO_NET_F_MQ, VIRTIO_NET_F_MRG_RXBUF,
};
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;

use super::datapath::{QueueSetup, RingAddrs, MAX_QUEUE_SIZE};
use super::inflight::{Region, RegionError};
use super::mem::{GuestMemory, MemError, RegionSpec};
use crate::chain;
use ::ring::notify::{EventFd, Mode};

/// Queue pairs a port offers unless its configuration says otherwise
/// (`queues=`): a guest with up to this many vCPUs spreads its flows over
/// a pair each (`VIRTIO_NET_F_MQ`); QEMU asks for what `-netdev
/// vhost-user,queues=N` says, and the guest's driver enables as many as it
/// has vCPUs (`ethtool -L eth0 combined K` changes it).
pub const DEFAULT_QUEUE_PAIRS: u16 = 4;
/// The most queue pairs a port may offer: each pair is two rings the
/// switch polls and two eventfds it watches, and the port's descriptor
/// budget is shared among them.
pub const MAX_QUEUE_PAIRS: u16 = 8;
/// The queues of a device offering `pairs` queue pairs: receive queues at
/// even indices (0, 2, ...), transmit queues at odd ones, as virtio-net
/// numbers them.
pub const fn queues(pairs: u16) -> usize {
    2 * pairs as usize
}
/// How long the rest of a message may take to arrive once its first byte
/// has.
pub const PARTIAL_TIMEOUT: Duration = Duration::from_secs(1);
/// Messages kept in the protocol log.
pub const LOG_MESSAGES: usize = 256;
/// Messages handled per readiness event: a frontend that floods its socket
/// is served a bounded amount between forwarding passes (the socket stays
/// readable, so the rest is served on the next ones).
pub const MESSAGES_PER_EVENT: usize = 64;

/// Bytes in a message header: request, flags, size.
const HDR: usize = 12;
/// Header flags: the version.
const VERSION: u32 = 0x1;
/// Header flags: a reply.
const FLAG_REPLY: u32 = 0x4;
/// Header flags: the frontend waits for a reply.
const FLAG_NEED_REPLY: u32 = 0x8;
/// `SET_VRING_ENABLE`'s request code.
const SET_VRING_ENABLE: u32 = 18;

/// The request's name, for the log.
pub fn request_name(code: u32) -> &'static str {
    const NAMES: [&str; 42] = [
        "NONE",
        "GET_FEATURES",
        "SET_FEATURES",
        "SET_OWNER",
        "RESET_OWNER",
        "SET_MEM_TABLE",
        "SET_LOG_BASE",
        "SET_LOG_FD",
        "SET_VRING_NUM",
        "SET_VRING_ADDR",
        "SET_VRING_BASE",
        "GET_VRING_BASE",
        "SET_VRING_KICK",
        "SET_VRING_CALL",
        "SET_VRING_ERR",
        "GET_PROTOCOL_FEATURES",
        "SET_PROTOCOL_FEATURES",
        "GET_QUEUE_NUM",
        "SET_VRING_ENABLE",
        "SEND_RARP",
        "NET_SET_MTU",
        "SET_BACKEND_REQ_FD",
        "IOTLB_MSG",
        "SET_VRING_ENDIAN",
        "GET_CONFIG",
        "SET_CONFIG",
        "CREATE_CRYPTO_SESSION",
        "CLOSE_CRYPTO_SESSION",
        "POSTCOPY_ADVISE",
        "POSTCOPY_LISTEN",
        "POSTCOPY_END",
        "GET_INFLIGHT_FD",
        "SET_INFLIGHT_FD",
        "GPU_SET_SOCKET",
        "RESET_DEVICE",
        "VRING_KICK",
        "GET_MAX_MEM_SLOTS",
        "ADD_MEM_REG",
        "REM_MEM_REG",
        "SET_STATUS",
        "GET_STATUS",
        "GET_SHARED_OBJECT",
    ];
    NAMES.get(code as usize).copied().unwrap_or("UNKNOWN")
}

/// Why the port refused what the frontend asked (the connection is then
/// closed, with this text in the port's status).
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// A queue index beyond the queue pairs offered.
    #[error("queue {index} does not exist ({pairs} queue pairs offered: queues 0..{})", 2 * *pairs as u32)]
    Queue {
        /// Queue asked for.
        index: u32,
        /// Queue pairs the port offers.
        pairs: u16,
    },
    /// A queue size that is not a power of two up to 32768.
    #[error("queue {index}: size {num} (a power of two up to {MAX_QUEUE_SIZE} expected)")]
    QueueSize {
        /// Queue.
        index: u32,
        /// Size asked for.
        num: u32,
    },
    /// A starting index above 65535.
    #[error("queue {index}: base {base} does not fit 16 bits")]
    Base {
        /// Queue.
        index: u32,
        /// Base asked for.
        base: u32,
    },
    /// Features acknowledged that were not offered.
    #[error("features {acked:#x} acknowledged, {offered:#x} offered")]
    Features {
        /// Acknowledged.
        acked: u64,
        /// Offered.
        offered: u64,
    },
    /// Protocol features acknowledged that were not offered.
    #[error("protocol features {acked:#x} acknowledged, {offered:#x} offered")]
    ProtocolFeatures {
        /// Acknowledged.
        acked: u64,
        /// Offered.
        offered: u64,
    },
    /// The memory table was refused.
    #[error("memory table")]
    Memory(#[from] MemError),
    /// A queue's rings are not inside the guest's memory.
    #[error("queue {index}")]
    Ring {
        /// Queue.
        index: usize,
        /// Why.
        #[source]
        source: super::datapath::RingError,
    },
    /// A kick or call descriptor that is no eventfd.
    #[error("queue {index}: the {what} descriptor is not an eventfd")]
    NotEventFd {
        /// Queue.
        index: usize,
        /// `kick` or `call`.
        what: &'static str,
    },
    /// The in-flight region could not be made or was refused.
    #[error("in-flight region")]
    Inflight(#[from] RegionError),
    /// A request the port does not serve.
    #[error("{0} is not supported")]
    Unsupported(&'static str),
}

impl From<Refusal> for VuError {
    fn from(r: Refusal) -> VuError {
        // The crate shows only the top error's text: carry the whole chain.
        VuError::ReqHandlerError(std::io::Error::other(chain(&r)))
    }
}

/// Offer and limits of one port.
#[derive(Clone, Copy, Debug)]
pub struct Offer {
    /// Offer `EVENT_IDX` (used/available event indices).
    pub event_idx: bool,
    /// Offer `MRG_RXBUF`.
    pub mergeable: bool,
    /// Offer the checksum and TCP segmentation offloads ([`OFFLOADS`]).
    pub offloads: bool,
    /// Queue pairs offered (1..=[`MAX_QUEUE_PAIRS`]; more than one offers
    /// `VIRTIO_NET_F_MQ` and `GET_QUEUE_NUM` answers it).
    pub queue_pairs: u16,
}

/// The offload features offered (with [`Offer::offloads`]): partial
/// checksums and TCP segments of up to 64 KB, both ways. UDP segmentation
/// (`HOST_USO`, `GUEST_USO4/6`) and `HOST_ECN` are not offered.
pub const OFFLOADS: u64 = 1 << VIRTIO_NET_F_CSUM
    | 1 << VIRTIO_NET_F_GUEST_CSUM
    | 1 << VIRTIO_NET_F_HOST_TSO4
    | 1 << VIRTIO_NET_F_HOST_TSO6
    | 1 << VIRTIO_NET_F_GUEST_TSO4
    | 1 << VIRTIO_NET_F_GUEST_TSO6;

impl Default for Offer {
    fn default() -> Self {
        Offer {
            event_idx: true,
            mergeable: true,
            offloads: true,
            queue_pairs: 1,
        }
    }
}

impl Offer {
    /// The virtio feature bits offered.
    pub fn features(&self) -> u64 {
        let mut f = 1u64 << VIRTIO_F_VERSION_1 | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();
        if self.event_idx {
            f |= 1 << VIRTIO_RING_F_EVENT_IDX;
        }
        if self.mergeable {
            f |= 1 << VIRTIO_NET_F_MRG_RXBUF;
        }
        if self.offloads {
            f |= OFFLOADS;
        }
        if self.pairs() > 1 {
            f |= 1 << VIRTIO_NET_F_MQ;
        }
        f
    }

    /// Queue pairs offered, within 1..=[`MAX_QUEUE_PAIRS`] whatever the
    /// caller set.
    pub fn pairs(&self) -> u16 {
        self.queue_pairs.clamp(1, MAX_QUEUE_PAIRS)
    }

    /// The protocol features offered: `INFLIGHT_SHMFD`, and `MQ` (QEMU
    /// asks `GET_QUEUE_NUM` only with it, and refuses a backend without
    /// it when given `queues=` above 1); the crate adds `REPLY_ACK`.
    pub fn protocol_features(&self) -> VhostUserProtocolFeatures {
        VhostUserProtocolFeatures::INFLIGHT_SHMFD | VhostUserProtocolFeatures::MQ
    }
}

/// An eventfd the port's epoll instance watches for as long as it lives.
pub struct Watched {
    fd: EventFd,
    epoll: Arc<OwnedFd>,
}

/// Whether `fd` is an eventfd, as `/proc/self/fd` names it (a frontend
/// could pass any descriptor: a pipe it keeps full would wake the switch
/// for ever). Without `/proc` it cannot be told, and is taken.
fn is_eventfd(fd: &File) -> bool {
    let link = format!("/proc/self/fd/{}", fd.as_raw_fd());
    match std::fs::read_link(link) {
        Ok(target) => target.as_os_str() == "anon_inode:[eventfd]",
        Err(_) => true,
    }
}

/// An eventfd from the frontend, checked.
fn eventfd(index: usize, what: &'static str, f: File) -> Result<EventFd, Refusal> {
    if !is_eventfd(&f) {
        return Err(Refusal::NotEventFd { index, what });
    }
    Ok(EventFd::from_fd(OwnedFd::from(f)))
}

impl Watched {
    fn new(fd: EventFd, epoll: Arc<OwnedFd>, token: u64) -> std::io::Result<Watched> {
        epoll::add(
            &*epoll,
            fd.as_fd(),
            epoll::EventData::new_u64(token),
            epoll::EventFlags::IN,
        )?;
        Ok(Watched { fd, epoll })
    }

    /// Consume its notifications; returns how many there were.
    pub fn drain(&self) -> u64 {
        self.fd.drain()
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        // Failure only means it was not watched any more.
        let _ = epoll::delete(&*self.epoll, self.fd.as_fd());
    }
}

/// What the frontend said about one queue.
#[derive(Default)]
pub struct VringState {
    /// Size and ring addresses (size 0: not set).
    pub addrs: RingAddrs,
    /// Whether `SET_VRING_ADDR` came.
    pub addrs_set: bool,
    /// The next available entry to consume: `SET_VRING_BASE`, then where
    /// the datapath got to (synchronised before each batch of messages).
    pub last_avail: u16,
    /// The kick eventfd, watched by the port.
    pub kick: Option<Watched>,
    /// The call eventfd.
    pub call: Option<Arc<EventFd>>,
    /// `SET_VRING_ENABLE`.
    pub enabled: bool,
    /// Started by `SET_VRING_KICK`, stopped by `GET_VRING_BASE`.
    pub started: bool,
}

/// The device as the frontend has set it up: the handler of its requests.
pub struct Frontend {
    offer: Offer,
    epoll: Arc<OwnedFd>,
    /// The token of queue 0's kick eventfd in the port's epoll instance;
    /// queue `i`'s is this plus `i`.
    kick_token: u64,
    /// Whether `GET_FEATURES` was answered (the crate's condition for
    /// `REPLY_ACK`, with the acknowledgement).
    features_read: bool,
    /// `SET_FEATURES`, once it came.
    acked: Option<u64>,
    acked_protocol: u64,
    mem: Option<Arc<GuestMemory>>,
    /// The in-flight region (`GET_INFLIGHT_FD` made it, or
    /// `SET_INFLIGHT_FD` handed it back).
    inflight: Option<Arc<Region>>,
    /// The queues: [`queues`] of the pairs offered, receive at even
    /// indices, transmit at odd ones.
    pub vrings: Vec<VringState>,
    /// Bumped by every request that changes what the datapath uses.
    pub generation: u64,
    /// Whether `SET_OWNER` came: the frontend claimed the device, its
    /// handshake is complete (QEMU sends it as it connects, long before
    /// the guest's driver sets up memory and queues).
    pub owned: bool,
}

impl Frontend {
    /// A device nobody has set up yet; queue `i`'s kick eventfd will be
    /// watched in `epoll` with the token `kick_token + i`.
    pub fn new(offer: Offer, epoll: Arc<OwnedFd>, kick_token: u64) -> Frontend {
        let n = queues(offer.pairs());
        Frontend {
            offer,
            epoll,
            kick_token,
            features_read: false,
            acked: None,
            acked_protocol: 0,
            mem: None,
            inflight: None,
            vrings: (0..n).map(|_| VringState::default()).collect(),
            generation: 0,
            owned: false,
        }
    }

    /// Queue `index`, if the port offers it: an index beyond the pairs
    /// offered is refused (the connection closes), whatever the frontend
    /// or its guest asked for.
    fn queue(&self, index: u32) -> Result<usize, Refusal> {
        if (index as usize) < self.vrings.len() {
            Ok(index as usize)
        } else {
            Err(Refusal::Queue {
                index,
                pairs: self.offer.pairs(),
            })
        }
    }

    /// Queue pairs offered.
    pub fn pairs(&self) -> u16 {
        self.offer.pairs()
    }

    /// The features acknowledged, once `SET_FEATURES` came.
    pub fn acked_features(&self) -> Option<u64> {
        self.acked
    }

    /// The protocol features acknowledged.
    pub fn acked_protocol_features(&self) -> u64 {
        self.acked_protocol
    }

    /// The guest's memory, once a table came.
    pub fn memory(&self) -> Option<&Arc<GuestMemory>> {
        self.mem.as_ref()
    }

    /// Whether the frontend waits for replies to requests that ask for
    /// one (the crate's rule).
    pub fn reply_ack(&self) -> bool {
        self.features_read && self.acked_protocol & VhostUserProtocolFeatures::REPLY_ACK.bits() != 0
    }

    /// Bytes of virtio-net header the acknowledged features imply.
    pub fn hdr_len(&self) -> u32 {
        let f = self.acked.unwrap_or(0);
        if f & (1 << VIRTIO_F_VERSION_1 | 1 << VIRTIO_NET_F_MRG_RXBUF) != 0 {
            12
        } else {
            10
        }
    }

    /// The offloads the acknowledged features give: what the guest may ask
    /// of the switch (`CSUM`, `HOST_TSO4/6`), what the switch may hand it
    /// unfinished (`GUEST_CSUM`, `GUEST_TSO4/6`; a segment only with the
    /// checksum offload too, as virtio requires), and `MRG_RXBUF`.
    pub fn offloads(&self) -> (crate::offload::Caps, crate::offload::Caps, bool) {
        let f = self.acked.unwrap_or(0);
        let has = |b: u32| f & (1u64 << b) != 0;
        let tx_csum = has(VIRTIO_NET_F_CSUM);
        let rx_csum = has(VIRTIO_NET_F_GUEST_CSUM);
        let tx = crate::offload::Caps {
            csum: tx_csum,
            tso4: tx_csum && has(VIRTIO_NET_F_HOST_TSO4),
            tso6: tx_csum && has(VIRTIO_NET_F_HOST_TSO6),
        };
        let rx = crate::offload::Caps {
            csum: rx_csum,
            tso4: rx_csum && has(VIRTIO_NET_F_GUEST_TSO4),
            tso6: rx_csum && has(VIRTIO_NET_F_GUEST_TSO6),
        };
        (tx, rx, has(VIRTIO_NET_F_MRG_RXBUF))
    }

    /// Whether `EVENT_IDX` was acknowledged.
    pub fn event_idx(&self) -> bool {
        self.acked.unwrap_or(0) & (1 << VIRTIO_RING_F_EVENT_IDX) != 0
    }

    /// Enable or disable a queue (also used for the enable QEMU sends
    /// before `SET_FEATURES`).
    pub fn enable(&mut self, index: u32, on: bool) -> Result<(), Refusal> {
        let i = self.queue(index)?;
        self.vrings[i].enabled = on;
        self.generation += 1;
        Ok(())
    }

    /// How queue `i` starts, if it is ready: memory, size, addresses,
    /// started, enabled (without `PROTOCOL_FEATURES`, every started queue
    /// is enabled), features set.
    pub fn queue_setup(
        &self,
        i: usize,
        mode: Mode,
        itr: u32,
    ) -> Option<(Arc<GuestMemory>, QueueSetup)> {
        let v = &self.vrings[i];
        let acked = self.acked?;
        let mem = self.mem.as_ref()?;
        let proto = acked & VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits() != 0;
        if v.addrs.num == 0 || !v.addrs_set || !v.started || (proto && !v.enabled) {
            return None;
        }
        Some((
            mem.clone(),
            QueueSetup {
                addrs: v.addrs,
                base: v.last_avail,
                event_idx: self.event_idx(),
                call: v.call.clone(),
                mode,
                itr,
                kicks: super::datapath::is_tx(i),
                share: 1,
                inflight: self.inflight.as_ref().and_then(|r| r.queue(i)),
            },
        ))
    }

    /// Forget everything the frontend set (it left, or asked for a reset).
    pub fn reset(&mut self) {
        self.features_read = false;
        self.acked = None;
        self.acked_protocol = 0;
        self.mem = None;
        self.inflight = None;
        self.vrings = (0..self.vrings.len())
            .map(|_| VringState::default())
            .collect();
        self.generation += 1;
    }

    /// The in-flight region, once the frontend asked for one or gave one.
    pub fn inflight(&self) -> Option<&Arc<Region>> {
        self.inflight.as_ref()
    }
}

fn unsupported<T>(what: &'static str) -> vhost::vhost_user::Result<T> {
    Err(Refusal::Unsupported(what).into())
}

impl VhostUserBackendReqHandlerMut for Frontend {
    fn set_owner(&mut self) -> vhost::vhost_user::Result<()> {
        self.owned = true;
        Ok(())
    }

    fn reset_owner(&mut self) -> vhost::vhost_user::Result<()> {
        self.reset();
        Ok(())
    }

    fn reset_device(&mut self) -> vhost::vhost_user::Result<()> {
        self.reset();
        Ok(())
    }

    fn get_features(&mut self) -> vhost::vhost_user::Result<u64> {
        self.features_read = true;
        Ok(self.offer.features())
    }

    fn set_features(&mut self, features: u64) -> vhost::vhost_user::Result<()> {
        let offered = self.offer.features();
        if features & !offered != 0 {
            return Err(Refusal::Features {
                acked: features,
                offered,
            }
            .into());
        }
        self.acked = Some(features);
        self.generation += 1;
        Ok(())
    }

    fn set_mem_table(
        &mut self,
        ctx: &[VhostUserMemoryRegion],
        files: Vec<File>,
        _postcopy_listening: Option<bool>,
    ) -> vhost::vhost_user::Result<Option<Vec<VhostUserMemoryRegionBase>>> {
        let specs: Vec<RegionSpec> = ctx
            .iter()
            .map(|r| RegionSpec {
                guest_phys_addr: r.guest_phys_addr,
                memory_size: r.memory_size,
                user_addr: r.user_addr,
                mmap_offset: r.mmap_offset,
            })
            .collect();
        let mem = GuestMemory::map(&specs, files).map_err(Refusal::from)?;
        self.mem = Some(Arc::new(mem));
        self.generation += 1;
        Ok(None)
    }

    fn set_vring_num(&mut self, index: u32, num: u32) -> vhost::vhost_user::Result<()> {
        let i = self.queue(index)?;
        if num == 0 || num > MAX_QUEUE_SIZE || !num.is_power_of_two() {
            return Err(Refusal::QueueSize { index, num }.into());
        }
        self.vrings[i].addrs.num = num;
        self.generation += 1;
        Ok(())
    }

    fn set_vring_addr(
        &mut self,
        index: u32,
        _flags: VhostUserVringAddrFlags,
        descriptor: u64,
        used: u64,
        available: u64,
        _log: u64,
    ) -> vhost::vhost_user::Result<()> {
        let i = self.queue(index)?;
        let v = &mut self.vrings[i];
        v.addrs.desc = descriptor;
        v.addrs.used = used;
        v.addrs.avail = available;
        v.addrs_set = true;
        self.generation += 1;
        Ok(())
    }

    fn set_vring_base(&mut self, index: u32, base: u32) -> vhost::vhost_user::Result<()> {
        let i = self.queue(index)?;
        let base16 = u16::try_from(base).map_err(|_| Refusal::Base { index, base })?;
        self.vrings[i].last_avail = base16;
        self.generation += 1;
        Ok(())
    }

    fn get_vring_base(&mut self, index: u32) -> vhost::vhost_user::Result<VhostUserVringState> {
        let i = self.queue(index)?;
        let v = &mut self.vrings[i];
        v.started = false;
        self.generation += 1;
        Ok(VhostUserVringState::new(index, u32::from(v.last_avail)))
    }

    fn set_vring_kick(&mut self, index: u8, fd: Option<File>) -> vhost::vhost_user::Result<()> {
        let i = self.queue(u32::from(index))?;
        let v = &mut self.vrings[i];
        v.kick = None; // unwatch the old one first
        if let Some(f) = fd {
            let w = Watched::new(
                eventfd(i, "kick", f)?,
                self.epoll.clone(),
                self.kick_token + i as u64,
            )
            .map_err(VuError::ReqHandlerError)?;
            v.kick = Some(w);
        }
        v.started = true;
        self.generation += 1;
        Ok(())
    }

    fn set_vring_call(&mut self, index: u8, fd: Option<File>) -> vhost::vhost_user::Result<()> {
        let i = self.queue(u32::from(index))?;
        self.vrings[i].call = match fd {
            Some(f) => Some(Arc::new(eventfd(i, "call", f)?)),
            None => None,
        };
        self.generation += 1;
        Ok(())
    }

    fn set_vring_err(&mut self, index: u8, _fd: Option<File>) -> vhost::vhost_user::Result<()> {
        // Errors are never signalled; the descriptor is closed.
        self.queue(u32::from(index))?;
        Ok(())
    }

    fn get_protocol_features(&mut self) -> vhost::vhost_user::Result<VhostUserProtocolFeatures> {
        Ok(self.offer.protocol_features())
    }

    fn set_protocol_features(&mut self, features: u64) -> vhost::vhost_user::Result<()> {
        let offered =
            (self.offer.protocol_features() | VhostUserProtocolFeatures::REPLY_ACK).bits();
        if features & !offered != 0 {
            return Err(Refusal::ProtocolFeatures {
                acked: features,
                offered,
            }
            .into());
        }
        self.acked_protocol = features;
        Ok(())
    }

    fn get_queue_num(&mut self) -> vhost::vhost_user::Result<u64> {
        Ok(u64::from(self.offer.pairs()))
    }

    fn set_vring_enable(&mut self, index: u32, enable: bool) -> vhost::vhost_user::Result<()> {
        Ok(self.enable(index, enable)?)
    }

    fn get_config(
        &mut self,
        _offset: u32,
        _size: u32,
        _flags: VhostUserConfigFlags,
    ) -> vhost::vhost_user::Result<Vec<u8>> {
        unsupported("GET_CONFIG")
    }

    fn set_config(
        &mut self,
        _offset: u32,
        _buf: &[u8],
        _flags: VhostUserConfigFlags,
    ) -> vhost::vhost_user::Result<()> {
        unsupported("SET_CONFIG")
    }

    fn set_gpu_socket(&mut self, _gpu_backend: GpuBackend) -> vhost::vhost_user::Result<()> {
        unsupported("GPU_SET_SOCKET")
    }

    fn set_backend_req_fd(&mut self, _backend: Backend) {}

    fn get_shared_object(&mut self, _uuid: VhostUserSharedMsg) -> vhost::vhost_user::Result<File> {
        unsupported("GET_SHARED_OBJECT")
    }

    fn get_inflight_fd(
        &mut self,
        msg: &VhostUserInflight,
    ) -> vhost::vhost_user::Result<(VhostUserInflight, File)> {
        let (region, file, size) =
            Region::create(msg.num_queues, msg.queue_size, self.vrings.len())
                .map_err(Refusal::from)?;
        self.inflight = Some(Arc::new(region));
        self.generation += 1;
        let reply = VhostUserInflight::new(size, 0, msg.num_queues, msg.queue_size);
        Ok((reply, file))
    }

    fn set_inflight_fd(
        &mut self,
        msg: &VhostUserInflight,
        file: File,
    ) -> vhost::vhost_user::Result<()> {
        let region = Region::map(
            file,
            msg.mmap_size,
            msg.mmap_offset,
            msg.num_queues,
            msg.queue_size,
            self.vrings.len(),
        )
        .map_err(Refusal::from)?;
        self.inflight = Some(Arc::new(region));
        self.generation += 1;
        Ok(())
    }

    fn get_max_mem_slots(&mut self) -> vhost::vhost_user::Result<u64> {
        unsupported("GET_MAX_MEM_SLOTS")
    }

    fn add_mem_region(
        &mut self,
        _region: &VhostUserSingleMemoryRegion,
        _fd: File,
        _postcopy_listening: Option<bool>,
    ) -> vhost::vhost_user::Result<Option<VhostUserMemoryRegionBase>> {
        unsupported("ADD_MEM_REG")
    }

    fn remove_mem_region(
        &mut self,
        _region: &VhostUserSingleMemoryRegion,
    ) -> vhost::vhost_user::Result<()> {
        unsupported("REM_MEM_REG")
    }

    fn set_device_state_fd(
        &mut self,
        _direction: VhostTransferStateDirection,
        _phase: VhostTransferStatePhase,
        _fd: File,
    ) -> vhost::vhost_user::Result<Option<File>> {
        unsupported("SET_DEVICE_STATE_FD")
    }

    fn check_device_state(&mut self) -> vhost::vhost_user::Result<()> {
        unsupported("CHECK_DEVICE_STATE")
    }

    fn get_shmem_config(&mut self) -> vhost::vhost_user::Result<VhostUserShMemConfig> {
        unsupported("GET_SHMEM_CONFIG")
    }

    fn set_log_base(&mut self, _log: &VhostUserLog, _file: File) -> vhost::vhost_user::Result<()> {
        unsupported("SET_LOG_BASE")
    }
}

/// Why a connection ended.
#[derive(Debug, thiserror::Error)]
pub enum Closed {
    /// The frontend closed its end.
    #[error("frontend closed the connection")]
    Eof,
    /// The socket failed.
    #[error("connection socket")]
    Socket(#[source] std::io::Error),
    /// A message header claims more than the protocol allows.
    #[error("message of {0} bytes announced (at most {MAX_MSG_SIZE})")]
    Oversized(u32),
    /// The rest of a message did not come in time.
    #[error("half a message for longer than {PARTIAL_TIMEOUT:?}")]
    Partial,
    /// The frontend did not claim the device (`SET_OWNER`) in time after
    /// connecting: a silent connection does not hold the port.
    #[error("no SET_OWNER within {:?} of connecting", crate::HANDSHAKE_TIMEOUT)]
    Handshake,
    /// Another frontend connected while this one, connected for longer
    /// than [`crate::EVICTABLE_AFTER`], had not claimed the device: the
    /// newcomer took its place.
    #[error(
        "no SET_OWNER within {:?} of connecting, and another frontend came",
        crate::EVICTABLE_AFTER
    )]
    Evicted,
    /// The request was refused, or could not be read or answered.
    #[error("{request}")]
    Request {
        /// The request's name.
        request: &'static str,
        /// Why.
        #[source]
        source: VuError,
    },
    /// The device could not be built from what the frontend set up.
    #[error(transparent)]
    Refused(#[from] Refusal),
}

/// One frontend's connection.
pub struct Connection {
    handler: BackendReqHandler<Mutex<Frontend>>,
    front: Arc<Mutex<Frontend>>,
    /// The same socket, for peeking, `FIONREAD` and our own replies.
    sock: UnixStream,
    partial_since: Option<Instant>,
    /// When it was accepted: without `SET_OWNER` by
    /// [`crate::HANDSHAKE_TIMEOUT`] after, it is closed.
    accepted: Instant,
    /// Requests handled, by code (the protocol as this frontend speaks it).
    pub requests: u64,
}

impl Connection {
    /// Serve a frontend that connected; its kick eventfds will be watched
    /// in `epoll` with the tokens given.
    pub fn new(
        stream: UnixStream,
        offer: Offer,
        epoll: Arc<OwnedFd>,
        kick_token: u64,
    ) -> std::io::Result<Connection> {
        stream.set_nonblocking(true)?;
        let sock = stream.try_clone()?;
        let front = Arc::new(Mutex::new(Frontend::new(offer, epoll, kick_token)));
        Ok(Connection {
            handler: BackendReqHandler::from_stream(stream, front.clone()),
            front,
            sock,
            partial_since: None,
            accepted: Instant::now(),
            requests: 0,
        })
    }

    /// The socket, readable when the frontend sent something.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }

    /// The device as set up so far.
    pub fn frontend(&self) -> MutexGuard<'_, Frontend> {
        // One thread uses the connection; a poisoned lock only means a
        // panic elsewhere already ended the switch.
        self.front.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a newcomer may take this connection's place: it has not
    /// claimed the device (`SET_OWNER`) after [`crate::EVICTABLE_AFTER`].
    pub fn evictable(&self, now: Instant) -> bool {
        !self.frontend().owned && now >= self.accepted + crate::EVICTABLE_AFTER
    }

    /// When the handshake is due (until the frontend sent `SET_OWNER`).
    fn handshake_deadline(&self) -> Option<Instant> {
        (!self.frontend().owned).then(|| self.accepted + crate::HANDSHAKE_TIMEOUT)
    }

    /// When the rest of a half-received message is due, or the handshake.
    pub fn deadline(&self) -> Option<Instant> {
        let partial = self.partial_since.map(|t| t + PARTIAL_TIMEOUT);
        match (partial, self.handshake_deadline()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Close if the rest of a message is overdue, or the handshake.
    pub fn check_partial(&self, now: Instant) -> Result<(), Closed> {
        if self.handshake_deadline().is_some_and(|d| now >= d) {
            return Err(Closed::Handshake);
        }
        match self.partial_since.map(|t| t + PARTIAL_TIMEOUT) {
            Some(d) if now >= d => Err(Closed::Partial),
            _ => Ok(()),
        }
    }

    fn queued(&self) -> Result<usize, Closed> {
        rustix::io::ioctl_fionread(&self.sock)
            .map(|n| n as usize)
            .map_err(|e| Closed::Socket(e.into()))
    }

    fn peek(&self, buf: &mut [u8]) -> Result<usize, Closed> {
        match rustix::net::recv(&self.sock, buf, RecvFlags::PEEK | RecvFlags::DONTWAIT) {
            Ok((n, _)) => Ok(n),
            Err(rustix::io::Errno::AGAIN) => Ok(0),
            Err(e) => Err(Closed::Socket(e.into())),
        }
    }

    /// Handle every complete message waiting; `log` gets one line per
    /// request while it has room. Never blocks.
    pub fn serve(&mut self, now: Instant, log: &mut Vec<String>) -> Result<(), Closed> {
        for _ in 0..MESSAGES_PER_EVENT {
            let queued = self.queued()?;
            if queued == 0 {
                // Readable with nothing queued: the frontend closed.
                let mut b = [0u8; 1];
                return match rustix::net::recv(
                    &self.sock,
                    &mut b,
                    RecvFlags::PEEK | RecvFlags::DONTWAIT,
                ) {
                    Ok((0, _)) => Err(Closed::Eof),
                    Ok(_) | Err(rustix::io::Errno::AGAIN) | Err(rustix::io::Errno::INTR) => {
                        self.partial_since = None;
                        Ok(())
                    }
                    Err(e) => Err(Closed::Socket(e.into())),
                };
            }
            let mut msg = [0u8; HDR + 8];
            let got = self.peek(&mut msg)?;
            if queued < HDR || got < HDR.min(queued) {
                return self.partial(now);
            }
            let word =
                |at: usize| u32::from_le_bytes([msg[at], msg[at + 1], msg[at + 2], msg[at + 3]]);
            let (code, flags, size) = (word(0), word(4), word(8));
            if size as usize > MAX_MSG_SIZE {
                return Err(Closed::Oversized(size));
            }
            if queued < HDR + size as usize {
                return self.partial(now);
            }
            self.partial_since = None;
            self.requests += 1;
            let res = self.handler.handle_request();
            let name = request_name(code);
            let mut line = format!("{name} flags={flags:#x} size={size}");
            let res = match res {
                Ok(()) => Ok(()),
                Err(VuError::InactiveFeature(f))
                    if code == SET_VRING_ENABLE
                        && f == VhostUserVirtioFeatures::PROTOCOL_FEATURES
                        && got >= HDR + 8 =>
                {
                    line.push_str(" (before SET_FEATURES: applied here)");
                    self.early_enable(code, flags, word(12), word(16))
                }
                Err(e) => Err(Closed::Request {
                    request: name,
                    source: e,
                }),
            };
            if let Err(e) = &res {
                line.push_str(&format!(" -> refused: {}", chain(e)));
            }
            tracing::debug!("vhost-user: {line}");
            if log.len() < LOG_MESSAGES {
                log.push(line);
            }
            res?;
        }
        Ok(())
    }

    /// Part of a message is here: wait for the rest, unless the frontend
    /// has closed its end (then the rest never comes).
    fn partial(&mut self, now: Instant) -> Result<(), Closed> {
        let mut fds = [rustix::event::PollFd::new(
            &self.sock,
            rustix::event::PollFlags::RDHUP,
        )];
        let zero = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        match rustix::event::poll(&mut fds, Some(&zero)) {
            Ok(_)
                if fds[0].revents().intersects(
                    rustix::event::PollFlags::RDHUP | rustix::event::PollFlags::HUP,
                ) =>
            {
                Err(Closed::Eof)
            }
            Ok(_) => {
                self.partial_since.get_or_insert(now);
                Ok(())
            }
            Err(e) => Err(Closed::Socket(e.into())),
        }
    }

    /// `SET_VRING_ENABLE` before `SET_FEATURES`: apply it, and reply if the
    /// frontend waits for a reply.
    fn early_enable(&mut self, code: u32, flags: u32, index: u32, num: u32) -> Result<(), Closed> {
        let (res, reply_ack) = {
            let mut f = self.frontend();
            let res = match num {
                0 | 1 => f.enable(index, num == 1),
                _ => Err(Refusal::Unsupported(
                    "SET_VRING_ENABLE with a value other than 0 or 1",
                )),
            };
            (res, f.reply_ack())
        };
        if reply_ack && flags & FLAG_NEED_REPLY != 0 {
            let mut r = [0u8; HDR + 8];
            r[0..4].copy_from_slice(&code.to_le_bytes());
            r[4..8].copy_from_slice(&(VERSION | FLAG_REPLY).to_le_bytes());
            r[8..12].copy_from_slice(&8u32.to_le_bytes());
            r[12..20].copy_from_slice(&u64::from(res.is_err()).to_le_bytes());
            (&self.sock).write_all(&r).map_err(Closed::Socket)?;
        }
        res.map_err(Closed::from)
    }

    /// The raw descriptor number, for logs.
    pub fn raw(&self) -> i32 {
        self.sock.as_raw_fd()
    }
}
