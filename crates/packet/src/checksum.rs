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

#[cfg(test)]
mod tests {
    use super::*;

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
