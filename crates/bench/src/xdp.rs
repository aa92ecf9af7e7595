//! The veth bench's XDP harness: the traffic generators (an AF_XDP socket
//! that only transmits, [`Generator`], and an XDP program run in
//! live-frames mode, [`XdpGenerator`]), and the XDP programs of its other
//! rows (`bpf/fwd.c`): the forwarder that is the limit row
//! ([`attach_forwarder`]), the sink that counts and drops what comes back
//! ([`attach_sink`]), and netio's steering program with no VIP, which
//! passes every frame to the kernel ([`attach_pass`]). Built on netio's
//! [`XdpProgram`] and [`XskSocket`].

use std::io;
use std::sync::atomic::Ordering;

use memmap2::{MmapMut, MmapOptions};
use netio::afxdp::{RingKind, XdpMode, XdpProgram, XskRing, XskSocket};
use rustix::net::SendFlags;

#[cfg(fastpath_xdp_obj)]
// Aligned: the ELF parser reads the object in place.
static FWD_OBJ: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/fwd.o"));
#[cfg(not(fastpath_xdp_obj))]
static FWD_OBJ: &[u8] = &[];

/// Why a generator or one of the harness's XDP programs failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A socket or an XDP program could not be set up (netio's answer).
    #[error(transparent)]
    Port(#[from] netio::afxdp::Error),
    /// The interface does not exist here.
    #[error("{iface}: no such interface in this network namespace")]
    NoInterface {
        /// The interface.
        iface: String,
    },
    /// The generator's memory could not be mapped.
    #[error("the generator on {iface}: mapping its UMEM: {source}")]
    Umem {
        /// The interface.
        iface: String,
        /// The system's answer.
        #[source]
        source: io::Error,
    },
    /// The XDP generator's template is shorter than its headers.
    #[error("XDP generator on {iface}: a {len}-byte template has no Ethernet, IP and UDP headers")]
    Template {
        /// The interface.
        iface: String,
        /// The template's length.
        len: usize,
    },
    /// A live test run of the XDP generator failed.
    #[error("XDP generator on ifindex {ifindex}: BPF_PROG_TEST_RUN (live frames): {source}")]
    Send {
        /// The interface's index.
        ifindex: u32,
        /// The system's answer.
        #[source]
        source: io::Error,
    },
}

/// The index of `iface` in the calling thread's namespace.
fn ifindex(iface: &str) -> Result<u32, Error> {
    netio::afpacket::ifindex(iface).ok_or_else(|| Error::NoInterface {
        iface: iface.into(),
    })
}

/// Attaches netio's steering program with an empty VIP set, which passes
/// every frame to the kernel, in native mode: on veth, an XDP program is
/// what makes an interface accept frames its peer sends with XDP_TX or
/// redirect. Detached when the returned program drops.
pub fn attach_pass(iface: &str) -> Result<XdpProgram, Error> {
    let mut p = XdpProgram::steering(iface)?;
    p.attach_native(iface)?;
    Ok(p)
}

/// Attaches the sink (every frame dropped in the driver, after the
/// interface counted it) in native mode: the cheapest receiver, which also
/// makes a veth accept frames its peer redirects. Detached when the
/// returned program drops.
pub fn attach_sink(iface: &str) -> Result<XdpProgram, Error> {
    let mut p = XdpProgram::load(FWD_OBJ, "fastpath_sink", "XDP sink", iface)?;
    p.attach_native(iface)?;
    Ok(p)
}

/// Backends the XDP forwarder takes at most (`FWD_MAX_BACKENDS` of
/// `bpf/fwd.c`).
pub const FWD_MAX_BACKENDS: usize = 16;

/// The XDP forwarder's configuration (`struct fwd_conf` of `bpf/fwd.c`).
#[repr(C)]
#[derive(Clone, Copy)]
struct FwdConf {
    dmac: [u8; 6],
    smac: [u8; 6],
    n: u32,
    backend: [[u8; 4]; FWD_MAX_BACKENDS],
}

// SAFETY: plain old data with no padding (6 + 6 bytes, then 4-byte fields
// at offset 12), as the kernel's copy of the map value expects.
unsafe impl aya::Pod for FwdConf {}

/// Attaches the XDP forwarder (`bpf/fwd.c`) to an interface of the calling
/// thread's namespace: each IPv4 frame's destination becomes one of
/// `backends` (by source address and port), its MACs `gateway` and `ours`,
/// and it leaves through the same interface by `bpf_redirect_map`. The
/// load balancer's hop done in the driver: the limit a forwarder on this
/// interface can reach. Detached when the returned program drops.
pub fn attach_forwarder(
    iface: &str,
    gateway: [u8; 6],
    ours: [u8; 6],
    backends: &[std::net::Ipv4Addr],
) -> Result<(XdpProgram, XdpMode), Error> {
    let index = ifindex(iface)?;
    let mut p = XdpProgram::load(FWD_OBJ, "fastpath_fwd", "XDP forwarder", iface)?;
    let mut conf = FwdConf {
        dmac: gateway,
        smac: ours,
        n: backends.len().min(FWD_MAX_BACKENDS) as u32,
        backend: [[0; 4]; FWD_MAX_BACKENDS],
    };
    for (slot, b) in conf.backend.iter_mut().zip(backends) {
        *slot = b.octets();
    }
    p.set_config(iface, "fwd_conf", "forwarder configuration", conf)?;
    p.set_egress(iface, index, "fwd_out")?;
    let mode = p.attach(iface)?;
    Ok((p, mode))
}

/// Entries in the generator's TX and completion rings.
const RING: u32 = 1024;

/// Bytes of the generator's UMEM per frame.
const GEN_CHUNK: usize = 2048;

/// A transmit-only AF_XDP socket for a traffic generator: frames prepared
/// once in a UMEM of its own are sent again and again by descriptor (no
/// write per frame), as many as the TX ring has room for at a time, and the
/// kernel is woken only when the ring's need_wakeup flag asks (in copy mode
/// it takes up to [`Generator::tx_budget`] frames per wake-up: the whole
/// ring where the kernel allows, else 32). It reports what it offered:
/// frames the kernel took from the ring and completed (sent, or dropped by
/// a full receiver: offered either way).
pub struct Generator {
    /// The socket; closed first on drop, before the UMEM is unmapped.
    sock: XskSocket,
    iface: String,
    tx: XskRing,
    comp: XskRing,
    /// The frames' memory, registered as the socket's UMEM.
    _umem: MmapMut,
    /// Each frame's UMEM address and length.
    frames: Vec<(u64, u32)>,
    /// The frame sent next.
    next: usize,
    /// Descriptors queued on the TX ring.
    queued: u64,
    /// Descriptors the kernel completed.
    completed: u64,
    /// Wake-ups (`sendto` calls).
    kicks: u64,
    /// Descriptors one wake-up sends.
    tx_budget: u32,
}

impl Generator {
    /// A socket on queue `queue` of `iface` whose UMEM holds `frames`
    /// (each at most 2048 bytes), sent in turn, round and round.
    pub fn open(iface: &str, queue: u32, frames: &[Vec<u8>]) -> Result<Self, Error> {
        let index = ifindex(iface)?;
        let len = (frames.len().max(1) * GEN_CHUNK).next_multiple_of(4096);
        let mut umem = MmapOptions::new()
            .len(len)
            .populate()
            .map_anon()
            .map_err(|source| Error::Umem {
                iface: iface.into(),
                source,
            })?;
        let mut descs = Vec::with_capacity(frames.len());
        for (i, f) in frames.iter().enumerate() {
            let at = i * GEN_CHUNK;
            let n = f.len().min(GEN_CHUNK);
            umem[at..at + n].copy_from_slice(&f[..n]);
            descs.push((at as u64, n as u32));
        }
        // SAFETY: the UMEM is this generator's own mapping, dropped after
        // the socket (field order); the kernel only reads the frames the
        // TX ring names, which stay as written.
        let sock = unsafe { XskSocket::new(iface, umem.as_mut_ptr(), len, GEN_CHUNK as u32) }?;
        // A bound socket needs a fill ring; this one never receives.
        sock.ring_size(RingKind::Fill, RING)?;
        let comp = sock.ring(RingKind::Completion, RING)?;
        let tx = sock.ring(RingKind::Tx, RING)?;
        sock.bind(index, queue)?;
        let tx_budget = sock.prepare_tx(RING);
        Ok(Generator {
            sock,
            iface: iface.into(),
            tx,
            comp,
            _umem: umem,
            frames: descs,
            next: 0,
            queued: 0,
            completed: 0,
            kicks: 0,
            tx_budget,
        })
    }

    /// The interface.
    pub fn iface(&self) -> &str {
        &self.iface
    }

    /// Fills the TX ring's free entries with the next frames, wakes the
    /// kernel if the ring asks, and takes in completions; returns how many
    /// frames were queued.
    pub fn send(&mut self) -> u32 {
        self.reap();
        let prod = self.tx.prod().load(Ordering::Relaxed);
        let cons = self.tx.cons().load(Ordering::Acquire);
        let room = RING - prod.wrapping_sub(cons);
        if self.frames.is_empty() {
            return 0;
        }
        for i in 0..room {
            let (addr, len) = self.frames[self.next];
            self.next = if self.next + 1 == self.frames.len() {
                0
            } else {
                self.next + 1
            };
            self.tx.put_desc(prod.wrapping_add(i), addr, len);
        }
        if room > 0 {
            self.tx
                .prod()
                .store(prod.wrapping_add(room), Ordering::Release);
            self.queued += u64::from(room);
        }
        if self.tx.needs_wakeup() && prod.wrapping_add(room) != cons {
            self.kicks += 1;
            // A zero-length send only wakes the kernel's transmit
            // processing; a full receiver (EBUSY) or a full socket buffer
            // (EAGAIN) is retried by the next call.
            let _ = rustix::net::send(self.sock.fd(), &[], SendFlags::DONTWAIT);
        }
        room
    }

    /// Takes in completions.
    fn reap(&mut self) {
        let prod = self.comp.prod().load(Ordering::Acquire);
        let cons = self.comp.cons().load(Ordering::Relaxed);
        self.completed += u64::from(prod.wrapping_sub(cons));
        self.comp.cons().store(prod, Ordering::Release);
    }

    /// Wakes the kernel until it has taken what is queued, for at most
    /// `timeout`, and takes in the completions; returns how many are left.
    pub fn flush(&mut self, timeout: std::time::Duration) -> u64 {
        let deadline = std::time::Instant::now() + timeout;
        while self.completed < self.queued && std::time::Instant::now() < deadline {
            let _ = rustix::net::send(self.sock.fd(), &[], SendFlags::DONTWAIT);
            self.kicks += 1;
            self.reap();
            std::thread::yield_now();
        }
        self.queued - self.completed
    }

    /// Frames the kernel completed: what was offered.
    pub fn completed(&self) -> u64 {
        self.reap_peek()
    }

    /// Completions taken in plus those waiting on the ring.
    fn reap_peek(&self) -> u64 {
        let prod = self.comp.prod().load(Ordering::Acquire);
        let cons = self.comp.cons().load(Ordering::Relaxed);
        self.completed + u64::from(prod.wrapping_sub(cons))
    }

    /// Wake-ups so far (`sendto` calls).
    pub fn kicks(&self) -> u64 {
        self.kicks
    }

    /// Descriptors one wake-up sends: the whole TX ring where the kernel
    /// takes `XDP_MAX_TX_SKB_BUDGET` (Linux 6.17), else 32.
    pub fn tx_budget(&self) -> u32 {
        self.tx_budget
    }
}

// SAFETY: the rings' and the UMEM's mappings are owned by the generator,
// which is used by one thread at a time (Send, not Sync); the kernel side is
// synchronized through the ring words.
unsafe impl Send for Generator {}

/// Frames per batch of a live test run (the kernel's most, 256): the
/// redirects of a batch are flushed together.
const GEN_BATCH: u32 = 256;

/// The interface (a spare veth, made by whoever sets up the namespace) on which
/// the generator of queue `queue` keeps its program in the XDP dispatcher
/// when `lo` already holds another generator's.
pub fn pin_interface(queue: u32) -> String {
    format!("gpin{queue}")
}

/// A traffic generator in the kernel: the XDP generator program
/// (`bpf/fwd.c`) run by `BPF_PROG_TEST_RUN` in live-frames mode (as
/// `xdp-trafficgen` does), which sends a 64-byte UDP template out of an
/// interface as many flows, in batches of 256, with no system call, socket
/// buffer or `sk_buff` per frame. On a veth, the frames reach the peer as
/// XDP frames, which its XDP program (each device under test runs one)
/// takes without building an `sk_buff` first. It reports what it offered:
/// every frame its program sent (those the peer's full ring refused
/// included).
pub struct XdpGenerator {
    /// The loaded program (and its attachment to `lo`, if any).
    program: XdpProgram,
    /// Whether the program stays in the kernel's XDP dispatcher between
    /// runs (see [`XdpGenerator::pinned`]).
    pinned: bool,
    ifindex: u32,
    queue: u32,
    template: Vec<u8>,
    offered: u64,
}

impl XdpGenerator {
    /// Loads the generator for `iface` (of the calling thread's namespace)
    /// and queue `queue`, sending `template` (a 64-byte UDP over IPv4
    /// frame, or a UDP over IPv6 frame without payload, whose source
    /// address and port it varies; its headers are written
    /// over every frame before it leaves, so that a receiver that edits
    /// frames in place does not change what is sent next). The interface's
    /// peer must run an XDP program (a veth accepts XDP frames only then).
    ///
    /// It also attaches the program in generic mode to the namespace's
    /// `lo`, where it passes every frame: that keeps it in the kernel's XDP
    /// dispatcher, which a test run otherwise rebuilds twice (on entry and
    /// exit), each time waiting for an RCU grace period, so that the
    /// generator would sleep most of the time. One program per interface:
    /// a generator whose `lo` is taken is attached to the namespace's
    /// [`pin_interface`] for its queue instead, if there is one. The
    /// dispatcher is shared by every XDP program of the machine, so one
    /// unpinned generator slows every other and the device under test as
    /// well. Best effort; see [`XdpGenerator::pinned`].
    pub fn open(iface: &str, queue: u32, template: &[u8]) -> Result<Self, Error> {
        let ifindex = ifindex(iface)?;
        let v6 = template.get(12..14) == Some(&[0x86, 0xdd][..]);
        let len = if v6 { GEN_HEAD6 } else { GEN_HEAD };
        let mut head = [0u8; GEN_HEAD6];
        match template.get(..len) {
            Some(h) => head[..len].copy_from_slice(h),
            None => {
                return Err(Error::Template {
                    iface: iface.into(),
                    len: template.len(),
                })
            }
        }
        let mut program = XdpProgram::load(FWD_OBJ, "fastpath_gen", "XDP generator", iface)?;
        let mut tmpl = GenTmpl {
            ifindex,
            head: [0; GEN_HEAD6 / 2],
            v6: u16::from(v6),
        };
        for (w, b) in tmpl.head.iter_mut().zip(head.chunks_exact(2)) {
            *w = u16::from_ne_bytes([b[0], b[1]]);
        }
        program.set_config(iface, "gen_tmpl", "generator template", tmpl)?;
        let pinned = program.attach_generic("lo").is_ok()
            || program.attach_generic(&pin_interface(queue)).is_ok();
        Ok(XdpGenerator {
            program,
            pinned,
            ifindex,
            queue,
            template: template.to_vec(),
            offered: 0,
        })
    }

    /// Sends `frames` frames (one system call, which returns when they are
    /// sent); returns how many.
    pub fn send(&mut self, frames: u32) -> Result<u32, Error> {
        self.program
            .test_run_live(&self.template, self.ifindex, self.queue, frames, GEN_BATCH)
            .map_err(|source| Error::Send {
                ifindex: self.ifindex,
                source,
            })?;
        self.offered += u64::from(frames);
        Ok(frames)
    }

    /// Frames sent so far: what was offered.
    pub fn offered(&self) -> u64 {
        self.offered
    }

    /// Whether the program stays in the kernel's XDP dispatcher between
    /// runs (attached to `lo`); if not, every [`XdpGenerator::send`] waits
    /// out two RCU grace periods besides sending.
    pub fn pinned(&self) -> bool {
        self.pinned
    }
}

/// Ethernet, IPv4 and UDP headers of the generator's template (`GEN_HEAD`
/// of `bpf/fwd.c`).
const GEN_HEAD: usize = 42;
/// Ethernet, IPv6 and UDP headers of an IPv6 template (`GEN_HEAD6`).
const GEN_HEAD6: usize = 62;

/// The generator's template (`struct gen_tmpl` of `bpf/fwd.c`): the
/// interface its test runs name (frames seen anywhere else pass) and the
/// headers written over each frame.
#[repr(C)]
#[derive(Clone, Copy)]
struct GenTmpl {
    ifindex: u32,
    head: [u16; GEN_HEAD6 / 2],
    v6: u16,
}

// SAFETY: plain old data with no padding (4 + 62 + 2 bytes, 2-aligned
// after the u32), as the kernel's copy of the map value expects.
unsafe impl aya::Pod for GenTmpl {}
