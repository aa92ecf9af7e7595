//! What the load balancer's XDP program (`bpf/lb.c`) and user space share,
//! defined once, here: the constants and the layout of every map key and
//! value both sides read or write. The build script includes this file and
//! writes it out as C (`OUT_DIR/lb_abi.h`, [`c_header`]), which `lb.c`
//! includes; the worker's flow hash seed is [`FLOW_SEED`] and the
//! packet-tracer's magic is [`TRACE_MAGIC`]. `tests/xdp_abi.rs` compiles the
//! header with the host's C compiler and checks that C lays out and values
//! everything as Rust does, without root.
//!
//! Plain Rust (no crate of ours, nothing beyond `core`): the build script
//! compiles it too.

use core::mem::{align_of, offset_of, size_of};

/// Seed of the 5-tuple hash used by connection tracking and Maglev, in the
/// packet threads and the XDP program alike (`LB_FLOW_SEED`).
pub const FLOW_SEED: u64 = 0x6d61_676c_6576;
/// [`VipKey::port`] of a VIP that takes every port (`LB_ANY_PORT`).
pub const ANY_PORT: u32 = 65_536;
/// A Maglev slot without a backend, every backend drained (`LB_EMPTY`).
pub const EMPTY: u32 = u32::MAX;
/// [`BackendEntry::flags`]: existing flows may go to it (`LB_HEALTHY`).
pub const HEALTHY: u8 = 1;
/// [`BackendEntry::flags`]: new connections may go to it (`LB_ACCEPTING`).
pub const ACCEPTING: u8 = 2;
/// [`BackendEntry::flags`]: its outer headers are IPv4, from
/// [`BackendEntry::src`] to [`BackendEntry::dst`] (`LB_V4`).
pub const V4: u8 = 4;
/// [`BackendEntry::flags`]: its outer headers are IPv6, from
/// [`BackendEntry::src6`] to [`BackendEntry::dst6`] (`LB_V6`). A backend
/// with neither flag (outer addresses of two families, which the worker
/// cannot encapsulate either) has its frames left to user space.
pub const V6: u8 = 8;
/// The first bytes of a packet-tracer probe's payload, "FPTRACE1"
/// (`LB_TRACE_MAGIC`: the same bytes read as the program loads them, one
/// native-endian 64-bit word).
pub const TRACE_MAGIC: [u8; 8] = *b"FPTRACE1";
/// [`VipEntry::quic`]: the VIP routes QUIC by connection ID in the
/// driver, by [`Conf`]'s plaintext QUIC-LB configurations and the server
/// IDs of `lb_quic_ids` (`LB_QUIC_PLAINTEXT`).
pub const QUIC_PLAINTEXT: u32 = 1;
/// The outcomes of reading a `quic` VIP's connection ID in the driver:
/// the first six are the worker's miss reasons at their counter index
/// (`lb::quic::Miss::index`, checked by the unit tests of `lb::xdp`).
/// Not QUIC: empty, truncated long header, a version 1 or 2 connection ID
/// over 20 octets (`LB_QUIC_NOT_QUIC`).
pub const QUIC_NOT_QUIC: u32 = 0;
/// Codepoint 0b111 (`LB_QUIC_RESERVED`).
pub const QUIC_RESERVED: u32 = 1;
/// No configuration at the codepoint (`LB_QUIC_NO_CONFIG`).
pub const QUIC_NO_CONFIG: u32 = 2;
/// Shorter than its configuration (`LB_QUIC_TOO_SHORT`).
pub const QUIC_TOO_SHORT: u32 = 3;
/// A long header's length disagrees with the self-described one
/// (`LB_QUIC_LENGTH_MISMATCH`).
pub const QUIC_LENGTH_MISMATCH: u32 = 4;
/// A server ID no backend of the VIP has (`LB_QUIC_UNKNOWN_SERVER_ID`).
pub const QUIC_UNKNOWN_SERVER_ID: u32 = 5;
/// Miss reasons, [`Stats::quic_miss`]'s length (`LB_QUIC_MISSES`).
pub const QUIC_MISSES: u32 = 6;
/// Routed to the server ID's backend, which is healthy (`LB_QUIC_ROUTED`).
pub const QUIC_ROUTED: u32 = 6;
/// The server ID's backend is down (`LB_QUIC_SERVER_DOWN`).
pub const QUIC_SERVER_DOWN: u32 = 7;
/// Not a `quic` VIP in the driver, or not UDP: nothing read (`LB_QUIC_NONE`).
pub const QUIC_NONE: u32 = 8;
/// The longest server ID (QUIC-LB: at most 19 octets of server ID and
/// nonce, the nonce at least 4), [`QuicIdKey::id`]'s length less one
/// (`LB_QUIC_MAX_SID`).
pub const QUIC_MAX_SID: u32 = 15;
/// Entries of the VIP map in the object; the loader sets the real size.
pub const DEFAULT_VIPS: u32 = 4096;
/// Entries of the connection table in the object; the loader sets the
/// real size.
pub const DEFAULT_CONNS: u32 = 65_536;

/// A C type a shared struct's field may have.
pub trait CType {
    /// Its name in C (`linux/types.h`).
    const NAME: &'static str;
    /// Elements, for an array.
    const LEN: Option<usize> = None;
}

impl CType for u8 {
    const NAME: &'static str = "__u8";
}

impl CType for u16 {
    const NAME: &'static str = "__u16";
}

impl CType for u32 {
    const NAME: &'static str = "__u32";
}

impl CType for u64 {
    const NAME: &'static str = "__u64";
}

impl<T: CType, const N: usize> CType for [T; N] {
    const NAME: &'static str = T::NAME;
    const LEN: Option<usize> = Some(N);
}

/// A field of a struct both sides share, as Rust lays it out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field {
    /// Its name, the same in C.
    pub name: &'static str,
    /// Its C type (of an element, for an array).
    pub c_type: &'static str,
    /// Elements, for an array.
    pub len: Option<usize>,
    /// Its offset in the struct.
    pub offset: usize,
    /// Its documentation, written above it in C.
    pub doc: &'static str,
}

/// A struct both sides share, as Rust lays it out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Struct {
    /// Its name in C (`struct <name>`).
    pub name: &'static str,
    /// Its name in Rust.
    pub rust: &'static str,
    /// Its size.
    pub size: usize,
    /// Its alignment.
    pub align: usize,
    /// Its fields, in order.
    pub fields: &'static [Field],
}

/// Defines a `#[repr(C)]` struct and its [`Struct`] description (`C`).
/// Fields carry documentation only (written into the C header too).
macro_rules! shared {
    (
        $(#[$meta:meta])*
        pub struct $name:ident as $c:literal {
            $(
                $(#[doc = $doc:literal])*
                $vis:vis $field:ident : $ty:ty,
            )*
        }
    ) => {
        $(#[$meta])*
        #[repr(C)]
        pub struct $name {
            $(
                $(#[doc = $doc])*
                $vis $field: $ty,
            )*
        }

        impl $name {
            /// How C lays it out: the same as Rust, field for field.
            pub const C: Struct = Struct {
                name: $c,
                rust: stringify!($name),
                size: size_of::<$name>(),
                align: align_of::<$name>(),
                fields: &[$(Field {
                    name: stringify!($field),
                    c_type: <$ty as CType>::NAME,
                    len: <$ty as CType>::LEN,
                    offset: offset_of!($name, $field),
                    doc: concat!($($doc, "\n",)*),
                }),*],
            };
        }
    };
}

shared! {
    /// The configuration (`lb_conf`, one entry).
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub struct Conf as "lb_conf" {
        /// 0: every frame goes to the socket (steering only).
        pub enabled: u32,
        /// Non-zero: the flow hash in a GRE key (`[encap] source_prefix` or
        /// `source_prefix6` set; packet::gre::Spread::key).
        pub keyed: u32,
        /// Non-zero: IPv4 outer sources are `spread_net | (hash &
        /// spread_host)` (`[encap] source_prefix` set).
        pub spread_v4: u32,
        /// The IPv4 source prefix's network, host order.
        pub spread_net: u32,
        /// Its host bits, host order.
        pub spread_host: u32,
        /// Idle timeout of TCP flows, ms.
        pub tcp_timeout_ms: u32,
        /// Idle timeout of other flows, ms.
        pub udp_timeout_ms: u32,
        /// How long a closed TCP flow's entry lingers, ms.
        pub linger_ms: u32,
        /// Traffic entries per CPU: VIPs, then backends from `vip_cap` (set
        /// by the loader's `set_conf`, whatever is given).
        pub stride: u32,
        /// The first backend's traffic entry (set by the loader's
        /// `set_conf`).
        pub vip_cap: u32,
        /// Non-zero: IPv6 outer sources are `spread6_net | (hash &
        /// spread6_host)` (`[encap] source_prefix6` set).
        pub spread_v6: u32,
        /// The IPv6 source prefix's network, four 32-bit words, each in
        /// host order (word 0 holds the address's first bytes).
        pub spread6_net: [u32; 4],
        /// Its host bits in words 2 and 3 (host order): a prefix is /64 or
        /// longer, so the flow hash (64 bits) reaches no further.
        pub spread6_host: [u32; 2],
        /// Non-zero: there are prefix groups (`lb_prefixes`,
        /// `lb_suffixes`), looked up when no VIP matches exactly.
        pub groups: u32,
        /// The plaintext QUIC-LB configuration of each config rotation
        /// codepoint (index 7, reserved, always 0): its server ID length in
        /// octets, 0 where there is none.
        pub quic_sid: [u8; 8],
        /// Its connection ID's length: the first octet, server ID and nonce.
        pub quic_need: [u8; 8],
        /// Non-zero: servers write the length into the first octet, which a
        /// long header's length is checked against.
        pub quic_self: [u8; 8],
    }
}

shared! {
    /// A key of the VIP map (`lb_vips`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct VipKey as "lb_vip_key" {
        /// The VIP's IPv4 address in network order: its octets as they lie
        /// in the packet (`u32::from_ne_bytes(octets)`).
        pub addr: u32,
        /// Its port, host order, or LB_ANY_PORT.
        pub port: u32,
        /// Its IP protocol.
        pub proto: u32,
    }
}

shared! {
    /// A key of the IPv6 VIP map (`lb_vips6`): the IPv4 map's keys stay 12
    /// bytes, so IPv4 lookups hash no more than before.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct VipKey6 as "lb_vip6_key" {
        /// The VIP's IPv6 address: its 16 bytes as they lie in the packet,
        /// as four words (`u32::from_ne_bytes` of each 4 bytes).
        pub addr: [u32; 4],
        /// Its port, host order, or LB_ANY_PORT.
        pub port: u32,
        /// Its IP protocol.
        pub proto: u32,
    }
}

shared! {
    /// A key of the prefix groups' prefixes (`lb_prefixes`, a longest
    /// prefix match trie, which wants the length first; user space writes
    /// the same bytes as aya's `lpm_trie::Key<[u32; 4]>`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct PrefixKey as "lb_prefix_key" {
        /// Bits of the address that count: the prefix's length in key
        /// form (96 more for IPv4); a lookup gives 128.
        pub prefixlen: u32,
        /// The address in key form (IPv4-mapped for IPv4), as four words
        /// of its bytes as they lie in the packet (as [`VipKey6::addr`]).
        pub addr: [u32; 4],
    }
}

shared! {
    /// A value of the prefix map (`lb_prefixes`): the group a prefix is of.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    pub struct PrefixGroup as "lb_prefix_group" {
        /// The group's index (the worker's).
        pub group: u32,
        /// The host bits under the group's cluster prefix length, as the
        /// address's words: a destination's suffix is its address and
        /// these.
        pub host: [u32; 4],
    }
}

shared! {
    /// A key of the prefix-group VIP map (`lb_suffixes`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct SuffixKey as "lb_suffix_key" {
        /// The group's index.
        pub group: u32,
        /// The VIP's suffix (host part), as [`PrefixKey::addr`].
        pub suffix: [u32; 4],
        /// Its port, host order, or LB_ANY_PORT.
        pub port: u32,
        /// Its IP protocol.
        pub proto: u32,
    }
}

shared! {
    /// A value of the VIP maps (`lb_vips`, `lb_vips6`, `lb_suffixes`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    pub struct VipEntry as "lb_vip" {
        /// Its index (the worker's VIP index, for counters and connections).
        pub index: u32,
        /// The first slot of its Maglev table in the slot array (`lb_ring`).
        pub table: u32,
        /// The table's size M (0: no table; its frames go to the socket).
        pub m: u32,
        /// LB_QUIC_PLAINTEXT: its UDP payloads are read as QUIC and routed
        /// by connection ID first; 0: not read.
        pub quic: u32,
    }
}

impl VipEntry {
    /// A VIP entry (not routing QUIC).
    pub fn new(index: u32, table: u32, m: u32) -> Self {
        VipEntry {
            index,
            table,
            m,
            quic: 0,
        }
    }
}

shared! {
    /// An entry of the backend array (`lb_backends`), by backend id.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    pub struct BackendEntry as "lb_backend" {
        /// Outer destination (the backend), network order (as
        /// [`VipKey::addr`]).
        pub dst: u32,
        /// Outer source, network order.
        pub src: u32,
        /// Destination MAC (the next hop).
        pub dmac: [u8; 6],
        /// Source MAC (ours).
        pub smac: [u8; 6],
        /// LB_HEALTHY, LB_ACCEPTING, LB_V4, LB_V6.
        pub flags: u8,
        /// Outer TTL or hop limit.
        pub ttl: u8,
        /// Padding (zero).
        pub pad: [u8; 2],
        /// Outer IPv6 destination (the backend), as four words of its
        /// bytes as they lie in the packet (as [`VipKey6::addr`]).
        pub dst6: [u32; 4],
        /// Outer IPv6 source, the same way.
        pub src6: [u32; 4],
    }
}

shared! {
    /// An element of the slot array (`lb_ring`): two Maglev slots (backend
    /// ids, or LB_EMPTY), as array elements are 8-byte aligned when
    /// mapped. User space writes the array as slots, one `u32` each.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    pub struct SlotPair as "lb_pair" {
        /// Slots `2i` and `2i + 1`.
        pub b: [u32; 2],
    }
}

shared! {
    /// An entry of the traffic counters (`lb_traffic`): per CPU, `stride`
    /// entries, VIPs then backends; also their sum over CPUs.
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub struct Traffic as "lb_traffic" {
        /// Packets.
        pub packets: u64,
        /// Bytes of the received frames.
        pub bytes: u64,
    }
}

shared! {
    /// The program's counters (`lb_stats`, per CPU), or their sum.
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub struct Stats as "lb_stats" {
        /// Frames forwarded in the driver.
        pub forwarded: u64,
        /// Connection-table lookups that found a live entry.
        pub ct_hits: u64,
        /// Lookups that found none.
        pub ct_misses: u64,
        /// Entries written.
        pub ct_inserts: u64,
        /// Flows closed by a FIN or RST.
        pub ct_closes: u64,
        /// Frames for a VIP left to user space (probes, partial checksums,
        /// no backend, a backend whose outer addresses mix families).
        pub to_socket: u64,
        /// Of the frames forwarded, those whose inner packet is IPv6.
        pub forwarded6: u64,
        /// Frames for a VIP dropped for a martian source (the worker's
        /// `DropReason::MartianSource`).
        pub martian_source: u64,
        /// Frames for a VIP dropped for a VIP's address as their source
        /// (`DropReason::SourceIsVip`).
        pub source_is_vip: u64,
        /// Frames for a VIP dropped for a TTL or hop limit of 0
        /// (`DropReason::TtlZero`).
        pub ttl_zero: u64,
        /// Datagrams to a `quic` VIP routed by connection ID (the worker's
        /// `quic_routed`); counted only for frames the driver forwarded or
        /// dropped, so that what it leaves to user space is counted there
        /// once.
        pub quic_routed: u64,
        /// Those whose connection ID did not route, by reason (LB_QUIC_*,
        /// the worker's `quic_miss`), counted the same way.
        pub quic_miss: [u64; 6],
        /// Those whose server ID's backend is down (`quic_server_down`).
        pub quic_server_down: u64,
    }
}

shared! {
    /// A key of the server ID map (`lb_quic_ids`), whose value is a backend
    /// id (`__u32`): a plaintext `quic` VIP's server IDs.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct QuicIdKey as "lb_quic_key" {
        /// The VIP's index.
        pub vip: u32,
        /// The server ID's length in octets (a configuration's length is
        /// that of every ID it reads).
        pub len: u32,
        /// Its octets, zero after `len`.
        pub id: [u8; 16],
    }
}

shared! {
    /// A key of the VIP address set (`lb_vip_addrs`): the addresses of the
    /// VIPs configured by address, which no packet for a VIP may come from
    /// (the worker's `VipMatcher::is_vip_source`). Its value is a `__u32`
    /// that says nothing.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct AddrKey as "lb_addr_key" {
        /// The address in key form (IPv4-mapped for IPv4), as four words
        /// of its bytes as they lie in the packet (as [`VipKey6::addr`]).
        pub addr: [u32; 4],
    }
}

/// Every struct both sides share.
pub const STRUCTS: &[Struct] = &[
    Conf::C,
    VipKey::C,
    VipKey6::C,
    PrefixKey::C,
    PrefixGroup::C,
    SuffixKey::C,
    VipEntry::C,
    BackendEntry::C,
    SlotPair::C,
    Traffic::C,
    Stats::C,
    AddrKey::C,
    QuicIdKey::C,
];

/// A constant both sides share: its C name, its value and its C suffix.
pub type Constant = (&'static str, u64, &'static str);

/// Every constant both sides share, as C names them.
pub const CONSTANTS: &[Constant] = &[
    ("LB_FLOW_SEED", FLOW_SEED, "ULL"),
    ("LB_ANY_PORT", ANY_PORT as u64, ""),
    ("LB_EMPTY", EMPTY as u64, "u"),
    ("LB_HEALTHY", HEALTHY as u64, ""),
    ("LB_ACCEPTING", ACCEPTING as u64, ""),
    ("LB_V4", V4 as u64, ""),
    ("LB_V6", V6 as u64, ""),
    ("LB_TRACE_MAGIC", u64::from_ne_bytes(TRACE_MAGIC), "ULL"),
    ("LB_QUIC_PLAINTEXT", QUIC_PLAINTEXT as u64, ""),
    ("LB_QUIC_NOT_QUIC", QUIC_NOT_QUIC as u64, ""),
    ("LB_QUIC_RESERVED", QUIC_RESERVED as u64, ""),
    ("LB_QUIC_NO_CONFIG", QUIC_NO_CONFIG as u64, ""),
    ("LB_QUIC_TOO_SHORT", QUIC_TOO_SHORT as u64, ""),
    ("LB_QUIC_LENGTH_MISMATCH", QUIC_LENGTH_MISMATCH as u64, ""),
    (
        "LB_QUIC_UNKNOWN_SERVER_ID",
        QUIC_UNKNOWN_SERVER_ID as u64,
        "",
    ),
    ("LB_QUIC_MISSES", QUIC_MISSES as u64, ""),
    ("LB_QUIC_ROUTED", QUIC_ROUTED as u64, ""),
    ("LB_QUIC_SERVER_DOWN", QUIC_SERVER_DOWN as u64, ""),
    ("LB_QUIC_NONE", QUIC_NONE as u64, ""),
    ("LB_QUIC_MAX_SID", QUIC_MAX_SID as u64, ""),
    ("LB_DEFAULT_VIPS", DEFAULT_VIPS as u64, ""),
    ("LB_DEFAULT_CONNS", DEFAULT_CONNS as u64, ""),
];

/// The C header `lb.c` includes (`lb_abi.h`): [`CONSTANTS`] as `#define`s
/// and [`STRUCTS`] as structs.
pub fn c_header() -> String {
    let mut h = String::from(
        "// Written by crates/lb/build.rs from crates/lb/src/xdp/abi.rs, which\n\
         // defines what the load balancer's XDP program and user space share:\n\
         // change it there.\n\
         #ifndef FASTPATH_LB_ABI_H\n\
         #define FASTPATH_LB_ABI_H\n\
         #include <linux/types.h>\n\n",
    );
    for (name, value, suffix) in CONSTANTS {
        h.push_str(&format!("#define {name} {value:#x}{suffix}\n"));
    }
    for s in STRUCTS {
        h.push_str(&format!(
            "\n// lb::xdp::abi::{}\nstruct {} {{\n",
            s.rust, s.name
        ));
        for f in s.fields {
            for line in f.doc.lines() {
                h.push_str(&format!("\t//{line}\n"));
            }
            match f.len {
                Some(n) => h.push_str(&format!("\t{} {}[{n}];\n", f.c_type, f.name)),
                None => h.push_str(&format!("\t{} {};\n", f.c_type, f.name)),
            }
        }
        h.push_str("};\n");
    }
    h.push_str("\n#endif\n");
    h
}
