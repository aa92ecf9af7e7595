//! QUIC's version-independent header (RFC 8999), as a load balancer reads
//! it from a UDP payload: what every QUIC version keeps, and nothing that
//! depends on one.
//!
//! ```text
//! long header:  1 | 7 bits (version-specific) | version (32) |
//!               DCID length (8) | DCID (0-255 octets) |
//!               SCID length (8) | SCID (0-255 octets) | ...
//! short header: 0 | 7 bits (version-specific) | DCID (length known only
//!               to the endpoint that chose it) | ...
//! ```
//!
//! A short header's connection ID has no length on the wire: the load
//! balancer takes it from its QUIC-LB configuration, so [`Header::Short`]
//! carries everything after the first octet.

/// The header form bit: set for long headers.
pub const LONG_FORM: u8 = 0x80;
/// QUIC version 1 (RFC 9000).
pub const VERSION_1: u32 = 0x0000_0001;
/// QUIC version 2 (RFC 9369).
pub const VERSION_2: u32 = 0x6b33_43cf;
/// The longest connection ID of versions 1 and 2 (RFC 9000 section 17.2).
pub const MAX_CID_LEN_V1: usize = 20;

/// A UDP payload read as QUIC's invariant header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Header<'a> {
    /// A long header: the version and both connection IDs, each of its
    /// stated length.
    Long {
        /// The version (0: Version Negotiation).
        version: u32,
        /// The destination connection ID.
        dcid: &'a [u8],
        /// The source connection ID.
        scid: &'a [u8],
    },
    /// A short header: the octets after the first, which begin with the
    /// destination connection ID.
    Short {
        /// Everything after the first octet.
        after_flags: &'a [u8],
    },
}

/// Why a UDP payload is not a QUIC header this reader can use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum QuicError {
    /// No octet at all.
    #[error("empty UDP payload")]
    Empty,
    /// A long header shorter than its own lengths say.
    #[error("long header truncated: {need} octets needed, {have} present")]
    Truncated {
        /// Octets the lengths need.
        need: usize,
        /// Octets present.
        have: usize,
    },
    /// Version 1 or 2 with a connection ID longer than those versions allow.
    #[error("connection ID of {len} octets in QUIC version {version:#x}, which allows at most 20")]
    CidTooLong {
        /// The version.
        version: u32,
        /// The length given.
        len: usize,
    },
}

/// Reads the invariant header of `payload` (a UDP datagram's payload).
/// Only lengths are checked; a datagram that is not QUIC at all may read as
/// a short header, which the connection ID's routing then refuses or not.
pub fn parse(payload: &[u8]) -> Result<Header<'_>, QuicError> {
    let first = *payload.first().ok_or(QuicError::Empty)?;
    if first & LONG_FORM == 0 {
        return Ok(Header::Short {
            after_flags: &payload[1..],
        });
    }
    let truncated = |need: usize| QuicError::Truncated {
        need,
        have: payload.len(),
    };
    // First octet, version, DCID length.
    let dcid_at = 6;
    let version_octets: [u8; 4] = payload
        .get(1..5)
        .and_then(|v| v.try_into().ok())
        .ok_or(truncated(dcid_at))?;
    let version = u32::from_be_bytes(version_octets);
    let dcid_len = usize::from(*payload.get(5).ok_or(truncated(dcid_at))?);
    let scid_len_at = dcid_at + dcid_len;
    let dcid = payload
        .get(dcid_at..scid_len_at)
        .ok_or(truncated(scid_len_at + 1))?;
    let scid_len = usize::from(*payload.get(scid_len_at).ok_or(truncated(scid_len_at + 1))?);
    let scid_at = scid_len_at + 1;
    let scid = payload
        .get(scid_at..scid_at + scid_len)
        .ok_or(truncated(scid_at + scid_len))?;
    if matches!(version, VERSION_1 | VERSION_2) {
        for len in [dcid_len, scid_len] {
            if len > MAX_CID_LEN_V1 {
                return Err(QuicError::CidTooLong { version, len });
            }
        }
    }
    Ok(Header::Long {
        version,
        dcid,
        scid,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_version_1_initial_reads_its_connection_ids() {
        // RFC 9001 appendix A.2's client Initial: first octet 0xc3, version
        // 1, an 8-octet DCID 8394c8f03e515708, an empty SCID.
        let mut p = vec![0xc3, 0, 0, 0, 1, 8];
        p.extend_from_slice(&[0x83, 0x94, 0xc8, 0xf0, 0x3e, 0x51, 0x57, 0x08]);
        p.extend_from_slice(&[0, 0, 0x44, 0x9e]);
        assert_eq!(
            parse(&p),
            Ok(Header::Long {
                version: VERSION_1,
                dcid: &[0x83, 0x94, 0xc8, 0xf0, 0x3e, 0x51, 0x57, 0x08],
                scid: &[],
            })
        );
    }

    #[test]
    fn lengths_past_the_end_and_over_the_version_limit_are_refused() {
        assert_eq!(parse(&[]), Err(QuicError::Empty));
        assert!(matches!(
            parse(&[0xc0, 0, 0, 0]),
            Err(QuicError::Truncated { .. })
        ));
        assert!(matches!(
            parse(&[0xc0, 0, 0, 0, 1, 9, 1, 2]),
            Err(QuicError::Truncated { .. })
        ));
        let mut p = vec![0xc0, 0, 0, 0, 1, 21];
        p.extend_from_slice(&[7; 21]);
        p.push(0);
        assert_eq!(
            parse(&p),
            Err(QuicError::CidTooLong {
                version: VERSION_1,
                len: 21
            })
        );
        // Another version may use longer connection IDs (RFC 8999 allows
        // 255 octets).
        p[1..5].copy_from_slice(&0x1a2a_3a4au32.to_be_bytes());
        assert!(matches!(parse(&p), Ok(Header::Long { dcid, .. }) if dcid.len() == 21));
    }

    #[test]
    fn a_short_header_is_the_rest_of_the_datagram() {
        assert_eq!(
            parse(&[0x40, 1, 2, 3]),
            Ok(Header::Short {
                after_flags: &[1, 2, 3]
            })
        );
    }

    proptest::proptest! {
        /// Any octets: no panic, and what reads as a long header lies
        /// inside the payload with lengths as stated.
        #[test]
        fn any_octets_read_within_bounds(p in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300)) {
            match parse(&p) {
                Ok(Header::Long { dcid, scid, .. }) => {
                    proptest::prop_assert_eq!(usize::from(p[5]), dcid.len());
                    proptest::prop_assert_eq!(usize::from(p[6 + dcid.len()]), scid.len());
                    proptest::prop_assert!(7 + dcid.len() + scid.len() <= p.len());
                }
                Ok(Header::Short { after_flags }) => {
                    proptest::prop_assert_eq!(after_flags.len() + 1, p.len());
                    proptest::prop_assert_eq!(p[0] & LONG_FORM, 0);
                }
                Err(QuicError::Empty) => proptest::prop_assert!(p.is_empty()),
                Err(_) => proptest::prop_assert!(p[0] & LONG_FORM != 0),
            }
        }
    }
}
