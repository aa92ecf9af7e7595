//! The hash functions the tables are built from.
//!
//! Names are hashed with SipHash-2-4 under fixed, distinct keys: one key per
//! purpose gives independent functions (the paper's `h1` and `h2`), and fixed
//! keys make every load balancer compute the same permutations. These hashes
//! run once per backend per table build, so their cost does not matter.
//! Table positions and flow hashes are mixed with the 64-bit finalizer of
//! SplitMix64, which is cheap enough to run per slot.

use std::hash::Hasher;

use siphasher::sip::SipHasher24;

/// What a name hash is for; each purpose has its own SipHash key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HashKey {
    /// `h1`: the permutation's offset.
    Offset,
    /// `h2`: the permutation's skip.
    Skip,
    /// Karger ring: positions of a backend's virtual nodes.
    Ring,
    /// Rendezvous: a backend's seed.
    Rendezvous,
}

impl HashKey {
    fn keys(self) -> (u64, u64) {
        // Arbitrary fixed constants (digits of pi and e); changing them
        // changes every table, so they are part of the wire contract between
        // load balancers.
        match self {
            HashKey::Offset => (0x243f_6a88_85a3_08d3, 0x1319_8a2e_0370_7344),
            HashKey::Skip => (0xa409_3822_299f_31d0, 0x082e_fa98_ec4e_6c89),
            HashKey::Ring => (0x4528_21e6_38d0_1377, 0xbe54_66cf_34e9_0c6c),
            HashKey::Rendezvous => (0xb7e1_5162_8aed_2a6a, 0xbf71_5880_9cf4_f3c7),
        }
    }
}

/// SipHash-2-4 of `bytes` under the key for `key`.
pub fn name_hash(key: HashKey, bytes: &[u8]) -> u64 {
    let (k0, k1) = key.keys();
    let mut h = SipHasher24::new_with_keys(k0, k1);
    h.write(bytes);
    h.finish()
}

/// SplitMix64's finalizer: a fast bijective mix of 64 bits.
#[inline]
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The table slot for a flow hash: `hash * m / 2^64`, a multiply and a shift
/// instead of a division (Lemire's fast range reduction). Uniform over
/// `0..m` when the hash is uniform over 64 bits.
#[inline]
pub fn flow_slot(hash: u64, m: u32) -> usize {
    ((u128::from(hash) * u128::from(m)) >> 64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_give_independent_hashes() {
        let a = name_hash(HashKey::Offset, b"backend-1");
        let b = name_hash(HashKey::Skip, b"backend-1");
        assert_ne!(a, b);
        assert_eq!(a, name_hash(HashKey::Offset, b"backend-1"));
        assert_ne!(a, name_hash(HashKey::Offset, b"backend-2"));
    }

    #[test]
    fn flow_slot_in_range_and_spread() {
        let m = 65_537u32;
        assert_eq!(flow_slot(0, m), 0);
        assert_eq!(flow_slot(u64::MAX, m), (m - 1) as usize);
        let mut seen = vec![0u32; 16];
        for i in 0..16_000u64 {
            seen[flow_slot(mix64(i), 16)] += 1;
        }
        assert!(seen.iter().all(|&c| (800..1200).contains(&c)), "{seen:?}");
    }
}
