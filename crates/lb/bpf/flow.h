// The load balancer's flow hash and Maglev slot, as lb's worker computes
// them (packet::FlowKey::hash with LB_FLOW_SEED, maglev's flow_slot), for
// IPv4 and IPv6 flows. Plain C on 64-bit integers, so that it compiles for the
// host as well as for BPF: lb's tests (tests/xdp_abi.rs) compile it with the
// host's compiler and compare its hashes with the worker's, without root.
#ifndef FASTPATH_LB_FLOW_H
#define FASTPATH_LB_FLOW_H
#include <linux/types.h>
#include "lb_abi.h"

#ifndef __always_inline
#define __always_inline inline __attribute__((always_inline))
#endif

// A 64x64 -> 128-bit multiply folded to 64 bits (low ^ high), in 32-bit
// halves (BPF has no 128-bit product).
static __always_inline __u64 fold_mul(__u64 a, __u64 b)
{
	__u64 a0 = a & 0xffffffffULL, a1 = a >> 32;
	__u64 b0 = b & 0xffffffffULL, b1 = b >> 32;
	__u64 p00 = a0 * b0, p01 = a0 * b1, p10 = a1 * b0, p11 = a1 * b1;
	__u64 mid = (p00 >> 32) + (p01 & 0xffffffffULL) + (p10 & 0xffffffffULL);
	__u64 lo = (mid << 32) | (p00 & 0xffffffffULL);
	__u64 hi = p11 + (p01 >> 32) + (p10 >> 32) + (mid >> 32);

	return lo ^ hi;
}

// packet::FlowKey::hash(LB_FLOW_SEED) of a flow whose addresses (key form:
// IPv6, or IPv4-mapped) are given as their bytes 0..8 and 8..16, each read
// little-endian (as a little-endian machine, BPF's on x86 and arm64 alike,
// loads them from the packet). Ports in host order.
static __always_inline __u64 flow_hash_words(__u64 s0, __u64 s1, __u64 d0, __u64 d1, __u16 sport,
					     __u16 dport, __u8 proto)
{
	const __u64 seed = LB_FLOW_SEED;
	__u64 tail = ((__u64)sport << 24) | ((__u64)dport << 8) | proto;
	__u64 a = fold_mul(s0 ^ 0xa0761d6478bd642fULL ^ seed, s1 ^ 0xe7037ed1a0b428dbULL);
	__u64 b = fold_mul(d0 ^ 0x8ebc6af09c88c6e3ULL, d1 ^ 0x589965cc75374cc3ULL ^ seed);

	return fold_mul(a ^ tail ^ 0x1d8e4e27c47d124fULL,
			b ^ ((seed << 32) | (seed >> 32)) ^ 0x9e3779b97f4a7c15ULL);
}

// The hash of an IPv4 flow. Its addresses are IPv4-mapped: bytes 0..8
// zero, bytes 8..16 read little-endian are 0xffff0000 with the address's
// bytes (as loaded) above.
static __always_inline __u64 flow_hash4(__u32 saddr, __u32 daddr, __u16 sport, __u16 dport,
					__u8 proto)
{
	return flow_hash_words(0, ((__u64)saddr << 32) | 0xffff0000ULL, 0,
			       ((__u64)daddr << 32) | 0xffff0000ULL, sport, dport, proto);
}

// The hash of an IPv6 flow: its addresses' bytes as they lie in the
// packet (16 each).
static __always_inline __u64 flow_hash6(const void *saddr, const void *daddr, __u16 sport,
					__u16 dport, __u8 proto)
{
	const __u64 *s = saddr, *d = daddr;

	return flow_hash_words(s[0], s[1], d[0], d[1], sport, dport, proto);
}

// maglev's flow_slot: (hash * m) >> 64, in 32-bit halves.
static __always_inline __u32 flow_slot(__u64 hash, __u32 m)
{
	__u64 lo = (hash & 0xffffffffULL) * m;
	__u64 hi = (hash >> 32) * m;

	return (hi + (lo >> 32)) >> 32;
}

#endif
