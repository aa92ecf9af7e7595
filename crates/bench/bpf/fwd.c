// The XDP forwarder that is the limit row of `fastpath lb bench --topology
// veth`: the load balancer's hop done in the driver. Each IPv4 frame gets one
// header rewrite (the destination address becomes one of `fwd_conf`'s
// backends, chosen by source address and port, with both checksums updated
// incrementally; the MACs become the gateway's and ours) and leaves through
// the `fwd_out` device map's entry 0 (bpf_redirect_map). Anything else goes
// to the kernel.
//
// And the sink the generator's interface runs: every frame dropped in the
// driver, after the interface has counted it (veth accepts frames its peer
// redirects only when it runs an XDP program itself); and an XDP generator.
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/udp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

// Backends in `fwd_conf` at most (bench::xdp's FwdConf agrees).
#define FWD_MAX_BACKENDS 16

struct fwd_conf {
	__u8 dmac[ETH_ALEN];
	__u8 smac[ETH_ALEN];
	__u32 n;
	__be32 backend[FWD_MAX_BACKENDS];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct fwd_conf);
} fwd_conf SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_DEVMAP);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} fwd_out SEC(".maps");

// A 16-bit one's complement checksum with one 32-bit word replaced (RFC 1624).
static __always_inline __u16 csum_replace4(__u16 check, __be32 from, __be32 to)
{
	__u32 sum = (__u16)~check;

	sum += (__u16)~(from & 0xffff);
	sum += (__u16)~(from >> 16);
	sum += (__u16)(to & 0xffff);
	sum += (__u16)(to >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return ~sum;
}

SEC("xdp")
int fastpath_fwd(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = (void *)(eth + 1);
	struct fwd_conf *conf;
	__u32 key = 0, h, i;
	__be32 to;
	__u16 sport = 0;

	if ((void *)(ip + 1) > end || eth->h_proto != bpf_htons(ETH_P_IP) || ip->ihl != 5)
		return XDP_PASS;
	conf = bpf_map_lookup_elem(&fwd_conf, &key);
	if (!conf || conf->n == 0 || conf->n > FWD_MAX_BACKENDS)
		return XDP_PASS;
	struct udphdr *udp = (void *)(ip + 1);
	if ((void *)(udp + 1) <= end && (ip->protocol == IPPROTO_UDP || ip->protocol == IPPROTO_TCP))
		sport = udp->source;
	h = (ip->saddr ^ sport) * 0x9e3779b1u;
	i = h % conf->n;
	// i < n <= FWD_MAX_BACKENDS, a power of two. The mask is for the
	// verifier, which does not follow the modulo; the empty asm keeps the
	// compiler, which does, from dropping it.
	asm volatile("" : "+r"(i));
	i &= FWD_MAX_BACKENDS - 1;
	to = conf->backend[i];
	if ((void *)(udp + 1) <= end && ip->protocol == IPPROTO_UDP && udp->check)
		udp->check = csum_replace4(udp->check, ip->daddr, to);
	ip->check = csum_replace4(ip->check, ip->daddr, to);
	ip->daddr = to;
	__builtin_memcpy(eth->h_dest, conf->dmac, ETH_ALEN);
	__builtin_memcpy(eth->h_source, conf->smac, ETH_ALEN);
	return bpf_redirect_map(&fwd_out, 0, XDP_DROP);
}

SEC("xdp")
int fastpath_sink(struct xdp_md *ctx)
{
	return XDP_DROP;
}

// The generator (bench::xdp's XdpGenerator): run by BPF_PROG_TEST_RUN in live
// frames mode over a template frame (64-byte UDP over IPv4, or the smallest
// UDP over IPv6: 62 bytes, no payload), it makes each frame one of
// GEN_FLOWS flows in turn (IPv4 source address 10.30.(1 + n / 256).(n %
// 256), or the IPv6 template's source with those four bytes as its last;
// source port 1024 + n, as the AF_XDP generator's frames) and sends it out
// of the interface the run names (XDP_TX: the kernel redirects it there, in
// batches, as a driver would).
//
// A frame's bytes persist from one run of its page to the next, and a
// device under test that forwards the frame in the kernel (nftables) edits
// them in place (TTL, addresses, MACs) before the page comes back: so each
// run first writes the template's headers (gen_tmpl) over the frame.
//
// The program is also attached (generic mode) to the namespace's loopback,
// so that it stays in the kernel's XDP dispatcher between test runs (each
// run otherwise adds and removes it, waiting out two RCU grace periods):
// frames anywhere but the interface the runs name are passed untouched.
#define GEN_FLOWS 4096
// Ethernet, IPv4 (no options) and UDP headers.
#define GEN_HEAD 42
// Ethernet, IPv6 and UDP headers.
#define GEN_HEAD6 62

struct gen_tmpl {
	__u32 ifindex;
	// The first GEN_HEAD bytes of an IPv4 template, or GEN_HEAD6 of an
	// IPv6 one.
	__u16 head[GEN_HEAD6 / 2];
	// Non-zero: the template is IPv6.
	__u16 v6;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct gen_tmpl);
} gen_tmpl SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} gen_seq SEC(".maps");

// The IPv6 generator: the template's headers, then the flow's source
// address and port, and its UDP checksum afresh (IPv6 requires one): over
// the pseudo-header and the 8-byte header, the template carrying no
// payload.
static __always_inline int gen6(struct xdp_md *ctx, struct gen_tmpl *t)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct ipv6hdr *ip6 = (void *)(eth + 1);
	struct udphdr *udp = (void *)(ip6 + 1);
	__u16 *f = data, *w = (__u16 *)&ip6->saddr;
	__u32 key = 0, n, sum = 0, *seq;
	int i;

	if ((void *)(udp + 1) > end)
		return XDP_ABORTED;
#pragma unroll
	for (i = 0; i < GEN_HEAD6 / 2; i++)
		f[i] = t->head[i];
	if (eth->h_proto != bpf_htons(ETH_P_IPV6) || ip6->nexthdr != IPPROTO_UDP)
		return XDP_ABORTED;
	seq = bpf_map_lookup_elem(&gen_seq, &key);
	if (!seq)
		return XDP_ABORTED;
	n = *seq % GEN_FLOWS;
	*seq += 1;
	ip6->saddr.in6_u.u6_addr32[3] = bpf_htonl(0x0a1e0100 + ((n / 256) << 8) + (n % 256));
	udp->source = bpf_htons(1024 + n);
	udp->check = 0;
#pragma unroll
	for (i = 0; i < 16; i++)
		sum += w[i];
	sum += bpf_htons(IPPROTO_UDP) + udp->len + udp->source + udp->dest + udp->len;
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	udp->check = (__u16)~sum ? (__u16)~sum : 0xffff;
	return XDP_TX;
}

SEC("xdp")
int fastpath_gen(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = (void *)(eth + 1);
	struct udphdr *udp = (void *)(ip + 1);
	__u32 key = 0, n, sum = 0, *seq;
	struct gen_tmpl *t;
	__u16 *w = (__u16 *)ip, *f = data;
	int i;

	t = bpf_map_lookup_elem(&gen_tmpl, &key);
	if (!t || ctx->ingress_ifindex != t->ifindex)
		return XDP_PASS;
	if (t->v6)
		return gen6(ctx, t);
	if ((void *)(udp + 1) > end)
		return XDP_ABORTED;
#pragma unroll
	for (i = 0; i < GEN_HEAD / 2; i++)
		f[i] = t->head[i];
	if (eth->h_proto != bpf_htons(ETH_P_IP) || ip->ihl != 5)
		return XDP_ABORTED;
	seq = bpf_map_lookup_elem(&gen_seq, &key);
	if (!seq)
		return XDP_ABORTED;
	n = *seq % GEN_FLOWS;
	*seq += 1;
	ip->saddr = bpf_htonl(0x0a1e0100 + ((n / 256) << 8) + (n % 256));
	udp->source = bpf_htons(1024 + n);
	// No UDP checksum (allowed over IPv4); the IP header's afresh.
	udp->check = 0;
	ip->check = 0;
#pragma unroll
	for (i = 0; i < 10; i++)
		sum += w[i];
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	ip->check = ~sum;
	return XDP_TX;
}

char _license[] SEC("license") = "GPL";
