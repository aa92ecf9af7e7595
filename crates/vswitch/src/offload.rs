//! Checksum and segmentation offloads: the virtio-net header a guest puts in
//! front of a frame, checked against the frame it describes; the metadata a
//! checked frame carries through the switch ([`Offload`]); and the software
//! fallbacks for a destination that cannot take a frame so described
//! (completing a partial checksum, cutting a TCP segment of up to 64 KB
//! into MSS-sized frames).
//!
//! Every check works on the switch's own copy of the frame (never on guest
//! memory, which the guest may change between two reads), and nothing the
//! header says is believed that the frame does not show: the header length
//! used to segment is the one parsed here, not the guest's `hdr_len`, and a
//! segmentation request is taken only for TCP over IPv4 or IPv6 whose
//! headers say so, with the checksum fields where TCP has them.

/// `VIRTIO_NET_HDR_F_NEEDS_CSUM`: the checksum from `csum_start` on is
/// partial (the pseudo-header's sum is in place).
pub const F_NEEDS_CSUM: u8 = 1;
/// `VIRTIO_NET_HDR_F_DATA_VALID`: device to driver only.
pub const F_DATA_VALID: u8 = 2;
/// `VIRTIO_NET_HDR_F_RSC_INFO`: device to driver only.
pub const F_RSC_INFO: u8 = 4;
/// The flag bits virtio defines; the device ignores the others.
const KNOWN_FLAGS: u8 = F_NEEDS_CSUM | F_DATA_VALID | F_RSC_INFO;
/// `VIRTIO_NET_HDR_GSO_NONE`.
pub const GSO_NONE: u8 = 0;
/// `VIRTIO_NET_HDR_GSO_TCPV4`.
pub const GSO_TCPV4: u8 = 1;
/// `VIRTIO_NET_HDR_GSO_UDP` (UFO).
pub const GSO_UDP: u8 = 3;
/// `VIRTIO_NET_HDR_GSO_TCPV6`.
pub const GSO_TCPV6: u8 = 4;
/// `VIRTIO_NET_HDR_GSO_UDP_L4` (USO).
pub const GSO_UDP_L4: u8 = 5;
/// `VIRTIO_NET_HDR_GSO_ECN`: the segment has ECN's CWR set.
pub const GSO_ECN: u8 = 0x80;

/// The longest frame a guest may hand over with a segmentation request: an
/// IP datagram's largest (65,535 bytes) behind an Ethernet header with one
/// VLAN tag.
pub const MAX_GSO_FRAME: u32 = 65_535 + 18;
/// The longest frame segmentation makes (Ethernet header included): the
/// buffers of every port kind hold 2,048 bytes, so a segment size that
/// would make longer frames is refused (a guest with an MTU of 1,500 makes
/// 1,514-byte frames).
pub const MAX_SEGMENT: u32 = 2048;

const ETH_HLEN: usize = 14;
const ETH_P_IPV4: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;
const ETH_P_VLAN: u16 = 0x8100;
const IPPROTO_TCP: u8 = 6;
const TCP_FIN: u8 = 0x01;
const TCP_PSH: u8 = 0x08;
const TCP_CWR: u8 = 0x80;
/// Where TCP keeps its checksum, from the start of its header.
const TCP_CSUM_OFFSET: u16 = 16;

/// The virtio-net header (`virtio_net_hdr`, the first 10 bytes of
/// `virtio_net_hdr_v1`; `num_buffers` is the device's), as read once from
/// the switch's copy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VnetHdr {
    /// `VIRTIO_NET_HDR_F_*`.
    pub flags: u8,
    /// `VIRTIO_NET_HDR_GSO_*`, with [`GSO_ECN`].
    pub gso_type: u8,
    /// Bytes of headers (a hint from the driver).
    pub hdr_len: u16,
    /// Payload bytes per segment.
    pub gso_size: u16,
    /// Where checksumming starts.
    pub csum_start: u16,
    /// Where the checksum goes, from `csum_start`.
    pub csum_offset: u16,
}

impl VnetHdr {
    /// The header as little-endian bytes (`num_buffers` aside).
    pub fn parse(b: &[u8; 10]) -> VnetHdr {
        let u = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        VnetHdr {
            flags: b[0],
            gso_type: b[1],
            hdr_len: u(2),
            gso_size: u(4),
            csum_start: u(6),
            csum_offset: u(8),
        }
    }

    /// The header's bytes, for a frame the switch hands a guest.
    pub fn bytes(&self) -> [u8; 10] {
        let mut b = [0u8; 10];
        b[0] = self.flags;
        b[1] = self.gso_type;
        b[2..4].copy_from_slice(&self.hdr_len.to_le_bytes());
        b[4..6].copy_from_slice(&self.gso_size.to_le_bytes());
        b[6..8].copy_from_slice(&self.csum_start.to_le_bytes());
        b[8..10].copy_from_slice(&self.csum_offset.to_le_bytes());
        b
    }

    /// Whether the header asks for nothing (the usual frame without
    /// offloads: nothing to check, nothing to carry). Flag bits virtio
    /// does not define are ignored, as the device must (virtio 1.2,
    /// 5.1.6.2.2); the two only the device may set are not.
    #[inline]
    pub fn plain(&self) -> bool {
        self.flags & KNOWN_FLAGS == 0 && self.gso_type == GSO_NONE
    }
}

/// The segmentation a frame asks for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Gso {
    /// None: one frame.
    #[default]
    None,
    /// TCP over IPv4.
    Tcp4,
    /// TCP over IPv6.
    Tcp6,
}

/// What a checked frame asks of whoever delivers it: a checksum to
/// complete, a segmentation to do. Every offset is checked against the
/// frame it came with.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Offload {
    /// The checksum from `csum_start` to the end is partial.
    pub needs_csum: bool,
    /// Where checksumming starts.
    pub csum_start: u16,
    /// Where the checksum goes, from `csum_start`.
    pub csum_offset: u16,
    /// The segmentation asked for.
    pub gso: Gso,
    /// Payload bytes per segment (with [`Gso::Tcp4`] or [`Gso::Tcp6`]).
    pub gso_size: u16,
    /// Bytes of Ethernet, IP and TCP headers, as parsed (with a
    /// segmentation).
    pub hdr_len: u16,
}

impl Offload {
    /// The virtio-net header that describes the frame to a guest that
    /// negotiated what it needs.
    pub fn vnet_hdr(&self) -> VnetHdr {
        VnetHdr {
            flags: if self.needs_csum { F_NEEDS_CSUM } else { 0 },
            gso_type: match self.gso {
                Gso::None => GSO_NONE,
                Gso::Tcp4 => GSO_TCPV4,
                Gso::Tcp6 => GSO_TCPV6,
            },
            hdr_len: self.hdr_len,
            gso_size: self.gso_size,
            csum_start: self.csum_start,
            csum_offset: self.csum_offset,
        }
    }
}

/// Which offloads one side of a port has: the guest's transmit side (the
/// `HOST_*` features: what it may ask of the switch) or its receive side
/// (the `GUEST_*` features: what the switch may hand it unfinished).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Caps {
    /// Partial checksums (`CSUM` / `GUEST_CSUM`).
    pub csum: bool,
    /// TCP over IPv4 segments (`HOST_TSO4` / `GUEST_TSO4`).
    pub tso4: bool,
    /// TCP over IPv6 segments (`HOST_TSO6` / `GUEST_TSO6`).
    pub tso6: bool,
}

impl Caps {
    /// None at all (ports without offloads).
    pub const NONE: Caps = Caps {
        csum: false,
        tso4: false,
        tso6: false,
    };

    /// Whether a frame so described can be handed over as it is.
    #[inline]
    pub fn accepts(&self, o: &Offload) -> bool {
        let gso = match o.gso {
            Gso::None => true,
            Gso::Tcp4 => self.tso4,
            Gso::Tcp6 => self.tso6,
        };
        gso && (!o.needs_csum || self.csum)
    }
}

/// Why a frame's virtio-net header was refused. The names are the status
/// document's counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HdrError {
    /// A flag only the device may set (`DATA_VALID`, `RSC_INFO`: virtio
    /// 1.2, 5.1.6.2.1; bits virtio does not define are ignored).
    #[error("flags the driver may not set")]
    Flags,
    /// A `gso_type` virtio does not define.
    #[error("unknown GSO type")]
    GsoUnknown,
    /// An offload (checksum, a GSO type) that was not negotiated.
    #[error("offload not negotiated")]
    NotNegotiated,
    /// ECN on a segment (the bit, or CWR in the TCP header) without
    /// `HOST_ECN`.
    #[error("ECN without HOST_ECN")]
    Ecn,
    /// A `gso_size` of 0, or one whose segments would not fit
    /// [`MAX_SEGMENT`].
    #[error("GSO size 0 or too large")]
    GsoSize,
    /// A `hdr_len` beyond the frame.
    #[error("header length beyond the frame")]
    HdrLen,
    /// `csum_start` / `csum_offset` outside the frame (or, with a
    /// segmentation, not TCP's checksum).
    #[error("checksum offsets outside the frame")]
    CsumRange,
    /// A segmentation request whose headers are not TCP over IPv4 or IPv6
    /// as claimed (or that are inconsistent with the frame's length).
    #[error("headers not as the GSO type claims")]
    Headers,
    /// A frame longer than [`MAX_GSO_FRAME`], or a frame without a
    /// segmentation request longer than the plain bound.
    #[error("frame too long")]
    TooLong,
}

impl HdrError {
    /// Every reason, in counter order.
    pub const ALL: [HdrError; 9] = [
        HdrError::Flags,
        HdrError::GsoUnknown,
        HdrError::NotNegotiated,
        HdrError::Ecn,
        HdrError::GsoSize,
        HdrError::HdrLen,
        HdrError::CsumRange,
        HdrError::Headers,
        HdrError::TooLong,
    ];

    /// The counter's name.
    pub fn name(self) -> &'static str {
        match self {
            HdrError::Flags => "hdr_flags",
            HdrError::GsoUnknown => "gso_unknown",
            HdrError::NotNegotiated => "offload_not_negotiated",
            HdrError::Ecn => "ecn",
            HdrError::GsoSize => "gso_size",
            HdrError::HdrLen => "hdr_len",
            HdrError::CsumRange => "csum_range",
            HdrError::Headers => "gso_headers",
            HdrError::TooLong => "gso_too_long",
        }
    }
}

/// The layers of a TCP segment, parsed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Tcp {
    /// Where the IP header starts.
    l3: usize,
    /// Where the TCP header starts.
    l4: usize,
    /// Where the payload starts.
    payload: usize,
    v6: bool,
}

fn be16(f: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([f[at], f[at + 1]])
}

/// Parse Ethernet (one VLAN tag at most), IPv4 (options allowed, no
/// fragment) or IPv6 (no extension header), and TCP; the IP length must
/// match the frame's exactly.
fn parse_tcp(f: &[u8], v6: bool) -> Option<Tcp> {
    let mut l3 = ETH_HLEN;
    let mut ty = be16(f.get(..ETH_HLEN)?, 12);
    if ty == ETH_P_VLAN {
        ty = be16(f.get(..ETH_HLEN + 4)?, 16);
        l3 += 4;
    }
    let l4 = if v6 {
        if ty != ETH_P_IPV6 {
            return None;
        }
        let ip = f.get(l3..l3 + 40)?;
        if ip[0] >> 4 != 6 || ip[6] != IPPROTO_TCP {
            return None;
        }
        if l3 + 40 + usize::from(be16(ip, 4)) != f.len() {
            return None;
        }
        l3 + 40
    } else {
        if ty != ETH_P_IPV4 {
            return None;
        }
        let ip = f.get(l3..l3 + 20)?;
        let ihl = usize::from(ip[0] & 0xf) * 4;
        if ip[0] >> 4 != 4 || ihl < 20 || ip[9] != IPPROTO_TCP {
            return None;
        }
        // More fragments, or a fragment offset: not one TCP segment.
        if be16(ip, 6) & 0x3fff != 0 {
            return None;
        }
        let tot = usize::from(be16(ip, 2));
        if tot < ihl || l3 + tot != f.len() {
            return None;
        }
        l3 + ihl
    };
    let doff = usize::from(*f.get(l4 + 12)? >> 4) * 4;
    if doff < 20 || l4 + doff > f.len() {
        return None;
    }
    Some(Tcp {
        l3,
        l4,
        payload: l4 + doff,
        v6,
    })
}

/// Check the header `h` a guest gave with `frame` (the switch's copy), for
/// a guest whose transmit side negotiated `caps`; `max_plain` is the
/// longest frame without a segmentation request. Returns what the frame
/// asks of the switch.
pub fn check(h: &VnetHdr, frame: &[u8], caps: Caps, max_plain: u32) -> Result<Offload, HdrError> {
    let len = frame.len();
    if len as u64 > u64::from(MAX_GSO_FRAME) {
        return Err(HdrError::TooLong);
    }
    if h.flags & (F_DATA_VALID | F_RSC_INFO) != 0 {
        return Err(HdrError::Flags);
    }
    let gso = match h.gso_type & !GSO_ECN {
        GSO_NONE => Gso::None,
        GSO_TCPV4 => Gso::Tcp4,
        GSO_TCPV6 => Gso::Tcp6,
        GSO_UDP | GSO_UDP_L4 => return Err(HdrError::NotNegotiated),
        _ => return Err(HdrError::GsoUnknown),
    };
    let needs_csum = h.flags & F_NEEDS_CSUM != 0;
    if needs_csum && !caps.csum {
        return Err(HdrError::NotNegotiated);
    }
    let allowed = match gso {
        Gso::None => true,
        Gso::Tcp4 => caps.tso4,
        Gso::Tcp6 => caps.tso6,
    };
    if !allowed {
        return Err(HdrError::NotNegotiated);
    }
    if h.gso_type & GSO_ECN != 0 {
        // HOST_ECN is not offered.
        return Err(HdrError::Ecn);
    }
    if gso == Gso::None && len as u64 > u64::from(max_plain) {
        return Err(HdrError::TooLong);
    }
    if usize::from(h.hdr_len) > len {
        return Err(HdrError::HdrLen);
    }
    if needs_csum {
        let start = usize::from(h.csum_start);
        if start >= len || start + usize::from(h.csum_offset) + 2 > len {
            return Err(HdrError::CsumRange);
        }
    }
    let mut o = Offload {
        needs_csum,
        csum_start: if needs_csum { h.csum_start } else { 0 },
        csum_offset: if needs_csum { h.csum_offset } else { 0 },
        gso,
        gso_size: 0,
        hdr_len: 0,
    };
    if gso == Gso::None {
        return Ok(o);
    }
    // A segmentation request: the checksum is TCP's, partial (virtio 1.2,
    // 5.1.6.2: the driver sets NEEDS_CSUM with a GSO type).
    if !needs_csum {
        return Err(HdrError::CsumRange);
    }
    let t = parse_tcp(frame, gso == Gso::Tcp6).ok_or(HdrError::Headers)?;
    if usize::from(h.csum_start) != t.l4 || h.csum_offset != TCP_CSUM_OFFSET {
        return Err(HdrError::CsumRange);
    }
    if frame[t.l4 + 13] & TCP_CWR != 0 {
        return Err(HdrError::Ecn);
    }
    if h.gso_size == 0 || t.payload as u64 + u64::from(h.gso_size) > u64::from(MAX_SEGMENT) {
        return Err(HdrError::GsoSize);
    }
    o.gso_size = h.gso_size;
    o.hdr_len = t.payload as u16; // at most 18 + 60 + 60
    let _ = t.v6;
    Ok(o)
}

/// The 16-bit one's complement sum of `data` added to `sum` (RFC 1071),
/// not folded.
#[inline]
fn add_bytes(mut sum: u64, data: &[u8]) -> u64 {
    let mut chunks = data.chunks_exact(8);
    for c in &mut chunks {
        let w = u64::from_be_bytes(c.try_into().expect("8 bytes"));
        // Four 16-bit words at once: add the two 32-bit halves.
        sum += (w >> 32) + (w & 0xffff_ffff);
    }
    let rest = chunks.remainder();
    let mut pairs = rest.chunks_exact(2);
    for p in &mut pairs {
        sum += u64::from(u16::from_be_bytes([p[0], p[1]]));
    }
    if let [b] = pairs.remainder() {
        sum += u64::from(*b) << 8;
    }
    sum
}

#[inline]
fn fold(mut sum: u64) -> u16 {
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

/// The Internet checksum of `data` (RFC 1071): the one's complement of the
/// one's complement sum.
pub fn checksum(data: &[u8]) -> u16 {
    !fold(add_bytes(0, data))
}

/// Complete a partial checksum in place: the sum of the bytes from
/// `csum_start` to the end (the field at `csum_offset` holds the
/// pseudo-header's sum, as the driver left it) goes, complemented, into the
/// field. `o` must have been checked against `frame` ([`check`]).
pub fn complete_csum(frame: &mut [u8], o: &Offload) {
    if !o.needs_csum {
        return;
    }
    let start = usize::from(o.csum_start);
    let at = start + usize::from(o.csum_offset);
    let Some(data) = frame.get(start..) else {
        return;
    };
    if at + 2 > frame.len() {
        return;
    }
    let c = !fold(add_bytes(0, data));
    frame[at..at + 2].copy_from_slice(&c.to_be_bytes());
}

/// The pseudo-header sum of a TCP segment of `tcp_len` bytes.
fn pseudo_sum(f: &[u8], t: &Tcp, tcp_len: usize) -> u64 {
    let addrs = if t.v6 {
        &f[t.l3 + 8..t.l3 + 40]
    } else {
        &f[t.l3 + 12..t.l3 + 20]
    };
    add_bytes(0, addrs) + u64::from(IPPROTO_TCP) + tcp_len as u64
}

/// Cut a checked TCP segmentation request (`o.gso` not `None`) into
/// frames of at most `gso_size` payload bytes each, appended to `out`, each
/// one's length to `lens`. Each frame has the original's headers with the
/// IP length, IPv4 identification (one more each) and checksum, and the
/// TCP sequence number fixed, FIN and PSH only on the last, CWR only on
/// the first, and every checksum whole. Returns the frames made (0 if the
/// frame is not what `o` says: it was checked, so never).
pub fn segment(frame: &[u8], o: &Offload, out: &mut Vec<u8>, lens: &mut Vec<u32>) -> usize {
    let Some(t) = parse_tcp(frame, o.gso == Gso::Tcp6) else {
        return 0;
    };
    if o.gso == Gso::None || o.gso_size == 0 {
        return 0;
    }
    let hdr = &frame[..t.payload];
    let payload = &frame[t.payload..];
    let mss = usize::from(o.gso_size);
    let seq0 = u32::from_be_bytes(frame[t.l4 + 4..t.l4 + 8].try_into().expect("4 bytes"));
    let id0 = be16(frame, t.l3 + 4);
    let flags0 = frame[t.l4 + 13];
    let n = payload.len().div_ceil(mss).max(1);
    out.reserve(n * hdr.len() + payload.len());
    for i in 0..n {
        let from = i * mss;
        let chunk = &payload[from..(from + mss).min(payload.len())];
        let at = out.len();
        out.extend_from_slice(hdr);
        out.extend_from_slice(chunk);
        let s = &mut out[at..];
        let tcp_len = t.payload - t.l4 + chunk.len();
        if t.v6 {
            s[t.l3 + 4..t.l3 + 6].copy_from_slice(&(tcp_len as u16).to_be_bytes());
        } else {
            let ihl = t.l4 - t.l3;
            s[t.l3 + 2..t.l3 + 4].copy_from_slice(&((ihl + tcp_len) as u16).to_be_bytes());
            s[t.l3 + 4..t.l3 + 6].copy_from_slice(&id0.wrapping_add(i as u16).to_be_bytes());
            s[t.l3 + 10..t.l3 + 12].fill(0);
            let c = checksum(&s[t.l3..t.l4]);
            s[t.l3 + 10..t.l3 + 12].copy_from_slice(&c.to_be_bytes());
        }
        let seq = seq0.wrapping_add(from as u32);
        s[t.l4 + 4..t.l4 + 8].copy_from_slice(&seq.to_be_bytes());
        let mut fl = flags0;
        if i + 1 < n {
            fl &= !(TCP_FIN | TCP_PSH);
        }
        if i > 0 {
            fl &= !TCP_CWR;
        }
        s[t.l4 + 13] = fl;
        s[t.l4 + 16..t.l4 + 18].fill(0);
        let sum = pseudo_sum(s, &t, tcp_len);
        let c = !fold(add_bytes(sum, &s[t.l4..]));
        s[t.l4 + 16..t.l4 + 18].copy_from_slice(&c.to_be_bytes());
        lens.push(s.len() as u32);
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// RFC 1071's checksum written plainly, byte pair by byte pair, for
    /// checking the one above.
    fn rfc1071(data: &[u8]) -> u16 {
        let mut sum: u32 = 0;
        let mut i = 0;
        while i + 1 < data.len() {
            sum += (u32::from(data[i]) << 8) | u32::from(data[i + 1]);
            i += 2;
        }
        if i < data.len() {
            sum += u32::from(data[i]) << 8;
        }
        while sum >> 16 != 0 {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        !(sum as u16)
    }

    /// Whether a TCP segment's IP (v4) and TCP checksums verify.
    fn verifies(f: &[u8], v6: bool) -> bool {
        let t = parse_tcp(f, v6).expect("parses");
        if !v6 && rfc1071(&f[t.l3..t.l4]) != 0 {
            return false;
        }
        let mut ph = Vec::new();
        if v6 {
            ph.extend_from_slice(&f[t.l3 + 8..t.l3 + 40]);
            ph.extend_from_slice(&((f.len() - t.l4) as u32).to_be_bytes());
            ph.extend_from_slice(&[0, 0, 0, IPPROTO_TCP]);
        } else {
            ph.extend_from_slice(&f[t.l3 + 12..t.l3 + 20]);
            ph.extend_from_slice(&[0, IPPROTO_TCP]);
            ph.extend_from_slice(&((f.len() - t.l4) as u16).to_be_bytes());
        }
        ph.extend_from_slice(&f[t.l4..]);
        rfc1071(&ph) == 0
    }

    /// A TCP segment as a guest hands it over with a segmentation request:
    /// IP length whole, TCP checksum holding the pseudo-header's sum.
    pub(crate) fn tso_frame(v6: bool, payload: &[u8], flags: u8) -> (Vec<u8>, VnetHdr) {
        let mut f = vec![0u8; 12];
        f[..6].copy_from_slice(&[2, 0, 0, 0, 0, 2]);
        f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
        let l4;
        if v6 {
            f.extend_from_slice(&ETH_P_IPV6.to_be_bytes());
            let mut ip = [0u8; 40];
            ip[0] = 0x60;
            ip[4..6].copy_from_slice(&((20 + payload.len()) as u16).to_be_bytes());
            ip[6] = IPPROTO_TCP;
            ip[7] = 64;
            ip[8..24].copy_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
            ip[24..40].copy_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
            f.extend_from_slice(&ip);
            l4 = 54;
        } else {
            f.extend_from_slice(&ETH_P_IPV4.to_be_bytes());
            let mut ip = [0u8; 20];
            ip[0] = 0x45;
            ip[2..4].copy_from_slice(&((40 + payload.len()) as u16).to_be_bytes());
            ip[4..6].copy_from_slice(&0x1234u16.to_be_bytes());
            ip[6] = 0x40;
            ip[8] = 64;
            ip[9] = IPPROTO_TCP;
            ip[12..16].copy_from_slice(&[198, 18, 0, 1]);
            ip[16..20].copy_from_slice(&[198, 18, 0, 2]);
            let c = checksum(&ip);
            ip[10..12].copy_from_slice(&c.to_be_bytes());
            f.extend_from_slice(&ip);
            l4 = 34;
        }
        let mut tcp = [0u8; 20];
        tcp[0..2].copy_from_slice(&40000u16.to_be_bytes());
        tcp[2..4].copy_from_slice(&5201u16.to_be_bytes());
        tcp[4..8].copy_from_slice(&0xfffff000u32.to_be_bytes());
        tcp[12] = 5 << 4;
        tcp[13] = flags;
        tcp[14..16].copy_from_slice(&64240u16.to_be_bytes());
        f.extend_from_slice(&tcp);
        f.extend_from_slice(payload);
        let t = parse_tcp(&f, v6).expect("parses");
        let ps = !fold(pseudo_sum(&f, &t, f.len() - l4));
        // The partial checksum holds the folded pseudo-header sum (not
        // complemented), as Linux leaves it.
        f[l4 + 16..l4 + 18].copy_from_slice(&(!ps).to_be_bytes());
        let h = VnetHdr {
            flags: F_NEEDS_CSUM,
            gso_type: if v6 { GSO_TCPV6 } else { GSO_TCPV4 },
            hdr_len: (l4 + 20) as u16,
            gso_size: 1448,
            csum_start: l4 as u16,
            csum_offset: 16,
        };
        (f, h)
    }

    const ALL: Caps = Caps {
        csum: true,
        tso4: true,
        tso6: true,
    };

    #[test]
    fn checksum_matches_rfc1071() {
        for n in 0..70 {
            let d: Vec<u8> = (0..n).map(|i| (i * 37 + 11) as u8).collect();
            assert_eq!(checksum(&d), rfc1071(&d), "{n} bytes");
        }
    }

    #[test]
    fn a_partial_checksum_completed_verifies() {
        let payload: Vec<u8> = (0..999).map(|i| i as u8).collect();
        for v6 in [false, true] {
            let (mut f, mut h) = tso_frame(v6, &payload, TCP_PSH);
            h.gso_type = GSO_NONE;
            h.gso_size = 0;
            let o = check(&h, &f, ALL, 2048).expect("accepted");
            assert!(!verifies(&f, v6));
            complete_csum(&mut f, &o);
            assert!(verifies(&f, v6));
        }
    }

    #[test]
    fn lies_are_refused_by_reason() {
        let payload = vec![7u8; 5000];
        let (f, h) = tso_frame(false, &payload, 0);
        assert!(check(&h, &f, ALL, 2048).is_ok());
        let refuse = |h: VnetHdr, f: &[u8], caps: Caps| check(&h, f, caps, 2048).unwrap_err();
        let no_tso = Caps { tso4: false, ..ALL };
        assert_eq!(refuse(h, &f, no_tso), HdrError::NotNegotiated);
        assert_eq!(refuse(h, &f, Caps::NONE), HdrError::NotNegotiated);
        assert_eq!(refuse(VnetHdr { flags: 3, ..h }, &f, ALL), HdrError::Flags);
        assert_eq!(refuse(VnetHdr { flags: 5, ..h }, &f, ALL), HdrError::Flags);
        // Bits virtio does not define are ignored (5.1.6.2.2).
        assert!(check(&VnetHdr { flags: 0x81, ..h }, &f, ALL, 2048).is_ok());
        let odd = VnetHdr {
            flags: 0xf0,
            ..VnetHdr::default()
        };
        assert!(odd.plain());
        assert_eq!(
            refuse(VnetHdr { gso_type: 9, ..h }, &f, ALL),
            HdrError::GsoUnknown
        );
        assert_eq!(
            refuse(
                VnetHdr {
                    gso_type: GSO_UDP_L4,
                    ..h
                },
                &f,
                ALL
            ),
            HdrError::NotNegotiated
        );
        assert_eq!(
            refuse(
                VnetHdr {
                    gso_type: GSO_TCPV4 | GSO_ECN,
                    ..h
                },
                &f,
                ALL
            ),
            HdrError::Ecn
        );
        assert_eq!(
            refuse(VnetHdr { gso_size: 0, ..h }, &f, ALL),
            HdrError::GsoSize
        );
        assert_eq!(
            refuse(
                VnetHdr {
                    gso_size: 60000,
                    ..h
                },
                &f,
                ALL
            ),
            HdrError::GsoSize
        );
        assert_eq!(
            refuse(VnetHdr { hdr_len: 6000, ..h }, &f, ALL),
            HdrError::HdrLen
        );
        assert_eq!(
            refuse(
                VnetHdr {
                    csum_start: 5040,
                    ..h
                },
                &f,
                ALL
            ),
            HdrError::CsumRange
        );
        assert_eq!(
            refuse(
                VnetHdr {
                    csum_offset: 6,
                    ..h
                },
                &f,
                ALL
            ),
            HdrError::CsumRange
        );
        // Claims IPv6, holds IPv4.
        assert_eq!(
            refuse(
                VnetHdr {
                    gso_type: GSO_TCPV6,
                    ..h
                },
                &f,
                ALL
            ),
            HdrError::Headers
        );
        // A frame cut short of what its IP header says.
        assert_eq!(refuse(h, &f[..f.len() - 1], ALL), HdrError::Headers);
        // UDP claimed as TCP.
        let mut udp = f.clone();
        udp[23] = 17;
        assert_eq!(refuse(h, &udp, ALL), HdrError::Headers);
        // CWR in the TCP header.
        let (fc, hc) = tso_frame(false, &payload, TCP_CWR);
        assert_eq!(refuse(hc, &fc, ALL), HdrError::Ecn);
        // Too long for anything.
        let big = vec![0u8; MAX_GSO_FRAME as usize + 1];
        assert_eq!(refuse(h, &big, ALL), HdrError::TooLong);
        // A plain frame over the plain bound.
        let plain = VnetHdr::default();
        assert_eq!(refuse(plain, &f, ALL), HdrError::TooLong);
    }

    #[test]
    fn caps_accept_what_they_have() {
        let o = Offload {
            needs_csum: true,
            gso: Gso::Tcp6,
            ..Offload::default()
        };
        assert!(ALL.accepts(&o));
        assert!(!Caps { tso6: false, ..ALL }.accepts(&o));
        assert!(!Caps { csum: false, ..ALL }.accepts(&o));
        assert!(Caps::NONE.accepts(&Offload::default()));
        let h = o.vnet_hdr();
        assert_eq!(VnetHdr::parse(&h.bytes()), h);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Segments reassemble to the original payload, each one's
        /// checksums verify with the plain RFC 1071 sum, sequence numbers
        /// follow the payload, FIN/PSH only on the last, and each fits.
        #[test]
        fn segments_reassemble_and_verify(
            v6 in any::<bool>(),
            len in 1usize..20000,
            mss in 1u16..1900,
            flags in prop_oneof![Just(0u8), Just(TCP_PSH), Just(TCP_PSH | TCP_FIN), Just(0x10u8)],
            seed in any::<u8>(),
        ) {
            let payload: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect();
            let (f, mut h) = tso_frame(v6, &payload, flags);
            h.gso_size = mss;
            let o = match check(&h, &f, ALL, 2048) {
                Ok(o) => o,
                Err(e) => {
                    // Only a segment size too large for MAX_SEGMENT is refused.
                    prop_assert_eq!(e, HdrError::GsoSize);
                    prop_assert!(u32::from(mss) + u32::from(h.hdr_len) > MAX_SEGMENT);
                    return Ok(());
                }
            };
            let mut out = Vec::new();
            let mut lens = Vec::new();
            let n = segment(&f, &o, &mut out, &mut lens);
            prop_assert_eq!(n, len.div_ceil(usize::from(mss)));
            let mut at = 0;
            let mut got = Vec::new();
            for (i, l) in lens.iter().enumerate() {
                let s = &out[at..at + *l as usize];
                at += *l as usize;
                prop_assert!(s.len() as u32 <= MAX_SEGMENT);
                prop_assert!(verifies(s, v6), "segment {} does not verify", i);
                let t = parse_tcp(s, v6).expect("segment parses");
                let seq = u32::from_be_bytes(s[t.l4 + 4..t.l4 + 8].try_into().unwrap());
                prop_assert_eq!(seq, 0xfffff000u32.wrapping_add(got.len() as u32));
                let fl = s[t.l4 + 13];
                if i + 1 < n {
                    prop_assert_eq!(fl & (TCP_FIN | TCP_PSH), 0);
                } else {
                    prop_assert_eq!(fl, flags);
                }
                got.extend_from_slice(&s[t.payload..]);
            }
            prop_assert_eq!(got, payload);
        }
    }
}
