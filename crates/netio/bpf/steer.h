// fastpath's AF_XDP steering, shared by `xsk.c` (steering alone) and
// lb's `bpf/lb.c` (the load balancer in the driver, which steers what it
// does not forward itself; lb's build finds this header through netio's
// build script): frames for a VIP (destination address in the `vips` map
// with value VIP_ALL, IPv4 stored IPv4-mapped, or else within a prefix of
// the `vip_prefixes` trie: the prefix groups' address space, whose VIPs
// are not known as addresses) go to the AF_XDP socket bound to the queue; so do fragments a fleet peer redirected to this load
// balancer's own address (value VIP_REDIRECTS: only GRE with the key
// FRAGMENT_REDIRECT_KEY); everything else (ARP, BGP, health-check replies,
// management) goes to the kernel as usual.
#ifndef FASTPATH_STEER_H
#define FASTPATH_STEER_H
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__uint(max_entries, 64);
	__type(key, __u32);
	__type(value, __u32);
} xsks SEC(".maps");

// Values of the `vips` map.
#define VIP_ALL 1
#define VIP_REDIRECTS 2
// packet::gre::FRAGMENT_REDIRECT_KEY ("FPFR"; netio's tests check they agree).
#define FRAGMENT_REDIRECT_KEY 0x46504652
#define IPPROTO_GRE_ 47
#define GRE_FLAG_KEY 0x2000

struct vip_key {
	__u8 addr[16];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct vip_key);
	__type(value, __u8);
} vips SEC(".maps");

// Prefixes in the same IPv4-mapped form (an IPv4 /n is a /96+n), value
// VIP_ALL.
struct vip_prefix_key {
	__u32 prefixlen;
	__u8 addr[16];
};

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 4096);
	__type(key, struct vip_prefix_key);
	__type(value, __u8);
} vip_prefixes SEC(".maps");

// Where a frame goes when nothing else takes it: a VIP's frames (and
// redirected fragments to our own addresses) to the AF_XDP socket of its
// queue, the rest to the kernel.
static __always_inline int steer(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct vip_key key = {};
	__u16 proto;
	void *l3;
	__u8 l4proto;
	void *l4;
	__u8 *kind;

	if ((void *)(eth + 1) > end)
		return XDP_PASS;
	proto = eth->h_proto;
	l3 = eth + 1;
	if (proto == bpf_htons(0x8100)) {
		if (l3 + 4 > end)
			return XDP_PASS;
		proto = *(__u16 *)(l3 + 2);
		l3 += 4;
	}
	if (proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = l3;
		if ((void *)(ip + 1) > end)
			return XDP_PASS;
		key.addr[10] = 0xff;
		key.addr[11] = 0xff;
		__builtin_memcpy(&key.addr[12], &ip->daddr, 4);
		l4proto = ip->protocol;
		// Redirects are never IP fragments, and carry no IP options.
		l4 = (ip->ihl == 5 && !(ip->frag_off & bpf_htons(0x3fff))) ? (void *)(ip + 1) : 0;
	} else if (proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = l3;
		if ((void *)(ip6 + 1) > end)
			return XDP_PASS;
		__builtin_memcpy(key.addr, &ip6->daddr, 16);
		l4proto = ip6->nexthdr;
		l4 = ip6 + 1;
	} else {
		return XDP_PASS;
	}
	kind = bpf_map_lookup_elem(&vips, &key);
	if (!kind) {
		struct vip_prefix_key pk = { .prefixlen = 128 };

		__builtin_memcpy(pk.addr, key.addr, 16);
		kind = bpf_map_lookup_elem(&vip_prefixes, &pk);
		if (!kind)
			return XDP_PASS;
	}
	if (*kind == VIP_REDIRECTS) {
		// GRE version 0 with a key and nothing else, and our key.
		__u16 *gre = l4;
		if (!l4 || l4proto != IPPROTO_GRE_ || (void *)(gre + 4) > end)
			return XDP_PASS;
		if (gre[0] != bpf_htons(GRE_FLAG_KEY) ||
		    *(__u32 *)(gre + 2) != bpf_htonl(FRAGMENT_REDIRECT_KEY))
			return XDP_PASS;
	}
	return bpf_redirect_map(&xsks, ctx->rx_queue_index, XDP_PASS);
}

#endif
