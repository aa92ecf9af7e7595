//! The Internet checksum (RFC 1071) and pseudo-header sums.

/// One's-complement sum of `data` folded into 32 bits (not yet folded to 16),
/// added to `initial`. Odd trailing bytes are padded with zero.
pub fn sum(initial: u32, data: &[u8]) -> u32 {
    let mut acc = u64::from(initial);
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        acc += u64::from(u32::from_be_bytes([c[0], c[1], c[2], c[3]]));
    }
    let rest = chunks.remainder();
    let mut i = 0;
    while i + 1 < rest.len() {
        acc += u64::from(u16::from_be_bytes([rest[i], rest[i + 1]]));
        i += 2;
    }
    if i < rest.len() {
        acc += u64::from(rest[i]) << 8;
    }
    // Fold 64 -> 32 bits twice; the carries are small.
    acc = (acc & 0xffff_ffff) + (acc >> 32);
    acc = (acc & 0xffff_ffff) + (acc >> 32);
    acc as u32
}

/// Folds a running sum to 16 bits and complements it.
pub fn finish(sum: u32) -> u16 {
    let mut s = sum;
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

/// The checksum of `data`.
pub fn checksum(data: &[u8]) -> u16 {
    finish(sum(0, data))
}

/// Pseudo-header sum for IPv4 (RFC 793/768).
pub fn pseudo_v4(src: [u8; 4], dst: [u8; 4], protocol: u8, len: u16) -> u32 {
    let s = sum(0, &src);
    let s = sum(s, &dst);
    s + u32::from(protocol) + u32::from(len)
}

/// Pseudo-header sum for IPv6 (RFC 8200 section 8.1).
pub fn pseudo_v6(src: [u8; 16], dst: [u8; 16], next_header: u8, len: u32) -> u32 {
    let s = sum(0, &src);
    let s = sum(s, &dst);
    sum(s, &len.to_be_bytes()) + u32::from(next_header)
}

/// Fills in the TCP or UDP checksum of a frame whose sender left it for
/// offload hardware to complete (Linux marks such frames on the kernel path,
/// e.g. `TP_STATUS_CSUMNOTREADY` on AF_PACKET from a veth). Recomputes it
/// from scratch over the pseudo-header and the whole segment. Returns false
/// (and changes nothing) for anything but an unfragmented TCP or UDP packet.
pub fn complete_transport(frame: &mut [u8]) -> bool {
    let Ok(p) = crate::parse_frame(frame) else {
        return false;
    };
    if p.fragment.is_some()
        || !(p.flow.proto == crate::proto::TCP || p.flow.proto == crate::proto::UDP)
    {
        return false;
    }
    let (l4s, l4e) = (p.l4_offset, p.l3_offset + p.l3_len);
    let len = l4e - l4s;
    let pseudo = match crate::flow::unmapped(&p.flow.src).zip(crate::flow::unmapped(&p.flow.dst)) {
        Some((s, d)) if p.l3 == crate::parse::L3::V4 => pseudo_v4(s, d, p.flow.proto, len as u16),
        _ => pseudo_v6(p.flow.src, p.flow.dst, p.flow.proto, len as u32),
    };
    // parse_frame checked this very header, so the views below are sure.
    let segment = &mut frame[l4s..l4e];
    if p.flow.proto == crate::proto::TCP {
        let Ok(mut t) = crate::tcp::TcpPacket::new_checked(segment) else {
            return false;
        };
        t.fill_checksum(pseudo);
    } else {
        let Ok(mut u) = crate::udp::UdpPacket::new_checked(segment) else {
            return false;
        };
        u.fill_checksum(pseudo);
    }
    true
}

/// What [`complete_partial`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Partial {
    /// Not an unfragmented TCP or UDP packet whose checksum field holds
    /// its pseudo-header sum: untouched (almost every packet).
    No,
    /// The field holds the pseudo-header sum, but the checksum verifies as
    /// it is (a coincidence, once in 65,536 packets): untouched.
    AlreadyValid,
    /// The checksum was partial and is now complete.
    Completed,
}

/// Folds a running sum to 16 bits, not complemented (the sum of at most
/// a few dozen 16-bit words: two folds suffice).
#[inline]
fn fold(sum: u32) -> u16 {
    let s = (sum & 0xffff) + (sum >> 16);
    let s = (s & 0xffff) + (s >> 16);
    s as u16
}

/// The pseudo-header sum of a parsed TCP or UDP packet over `len` bytes of
/// segment (not folded).
#[inline]
fn pseudo_of(p: &crate::Parsed, len: usize) -> u32 {
    if p.l3 == crate::parse::L3::V4 {
        // Key form: the IPv4 address is the last 4 bytes.
        let w = |a: &[u8; 16]| {
            let v = u32::from_be_bytes([a[12], a[13], a[14], a[15]]);
            (v >> 16) + (v & 0xffff)
        };
        w(&p.flow.src) + w(&p.flow.dst) + u32::from(p.flow.proto) + (len as u32 & 0xffff)
    } else {
        pseudo_v6(p.flow.src, p.flow.dst, p.flow.proto, len as u32)
    }
}

/// Completes a TCP or UDP checksum a local sender left partial, as a NIC
/// with transmit checksum offload would. A sender that offloads its
/// checksum (Linux's CHECKSUM_PARTIAL: a veth, a container, a VM) writes
/// only the folded pseudo-header sum into the field and leaves the rest to
/// the device; a frame that reaches us through XDP or AF_XDP carries no
/// mark saying so (AF_PACKET's `TP_STATUS_CSUMNOTREADY`), and a backend
/// drops it as a checksum error.
///
/// `p` is `frame` as [`crate::parse_frame`] parsed it. The test is cheap
/// (inlined): the pseudo-header sum from the parsed addresses, compared
/// with the field. Only on a match is the segment summed: a checksum that
/// verifies is left alone, and one that does not is computed. A packet
/// whose field holds anything else, valid or corrupt, is never changed.
#[inline]
pub fn complete_partial(frame: &mut [u8], p: &crate::Parsed) -> Partial {
    let field = match p.flow.proto {
        crate::proto::TCP => crate::tcp::field::CHECKSUM,
        crate::proto::UDP => crate::udp::field::CHECKSUM,
        _ => return Partial::No,
    };
    if p.fragment.is_some() || p.icmp_quote.is_some() {
        return Partial::No;
    }
    let (l4s, l4e) = (p.l4_offset, p.l3_offset + p.l3_len);
    let Some(c) = frame.get(l4s + field.start..l4s + field.end) else {
        return Partial::No;
    };
    let have = u16::from_be_bytes([c[0], c[1]]);
    let len = l4e.saturating_sub(l4s);
    let pseudo = pseudo_of(p, len);
    // Exactly what Linux writes (`~csum_tcpudp_magic`); a folded sum is
    // never 0, so UDP's "no checksum" never matches.
    if have != fold(pseudo) {
        return Partial::No;
    }
    complete_segment(frame.get_mut(l4s..l4e), p.flow.proto, pseudo)
}

/// The rare part of [`complete_partial`]: the field holds the pseudo-header
/// sum; verify the segment and complete its checksum if it does not.
#[cold]
#[inline(never)]
fn complete_segment(segment: Option<&mut [u8]>, protocol: u8, pseudo: u32) -> Partial {
    let Some(segment) = segment else {
        return Partial::No;
    };
    if finish(sum(pseudo, segment)) == 0 {
        return Partial::AlreadyValid;
    }
    if protocol == crate::proto::TCP {
        match crate::tcp::TcpPacket::new_checked(segment) {
            Ok(mut t) => t.fill_checksum(pseudo),
            Err(_) => return Partial::No,
        }
    } else {
        match crate::udp::UdpPacket::new_checked(segment) {
            Ok(mut u) => u.fill_checksum(pseudo),
            Err(_) => return Partial::No,
        }
    }
    Partial::Completed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completes_partial_checksums() {
        use crate::build::Frame;
        for (s, d) in [("10.0.0.1", "10.0.0.2"), ("2001:db8::1", "2001:db8::2")] {
            let (s, d) = (s.parse().unwrap(), d.parse().unwrap());
            for good in [
                Frame::tcp(s, d, 1, 80, 0x18, b"hello").to_bytes(),
                Frame::udp(s, d, 1, 53, b"abc").to_bytes(),
            ] {
                let p = crate::parse_frame(&good).unwrap();
                let at = p.l4_offset
                    + if p.flow.proto == crate::proto::TCP {
                        crate::tcp::field::CHECKSUM.start
                    } else {
                        crate::udp::field::CHECKSUM.start
                    };
                let mut partial = good.clone();
                partial[at] ^= 0x5a; // what offload leaves: not the final sum
                assert!(complete_transport(&mut partial));
                assert_eq!(partial, good);
            }
            // Not TCP/UDP: untouched.
            let mut icmp = Frame::icmp(s, d, 8, 0, 0, b"x").to_bytes();
            let before = icmp.clone();
            assert!(!complete_transport(&mut icmp));
            assert_eq!(icmp, before);
        }
    }

    #[test]
    fn rfc1071_example() {
        // RFC 1071 section 3: 00 01 f2 03 f4 f5 f6 f7 sums to ddf2.
        let data = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(finish(sum(0, &data)), !0xddf2);
        // Odd length pads with zero.
        assert_eq!(checksum(&[0xff]), !0xff00);
        // A buffer with its checksum in place verifies to zero.
        let mut hdr = [
            0x45u8, 0, 0, 0x1c, 0, 0, 0, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
        ];
        let c = checksum(&hdr);
        hdr[10..12].copy_from_slice(&c.to_be_bytes());
        assert_eq!(checksum(&hdr), 0);
    }
}
