// The load balancer in the driver (`lb run --driver xdp`), Katran's way:
// the common case is forwarded here, before the kernel builds anything for
// the frame, and everything else goes to the AF_XDP socket (netio's
// `steer.h`), where the user-space packet threads handle it as before.
//
// The common case: TCP or UDP whose header is whole, over IPv4 without
// options, not a fragment, with a valid header checksum, or over IPv6
// whose next header is TCP or UDP itself (no extension header, so never a
// fragment), to a VIP of its family in `lb_vips` or `lb_vips6` (exact
// port, then any port) or else of a prefix group (paper section 4.2, as
// lb's VipMatcher: the longest prefix of any group in `lb_prefixes` picks
// the group, the address's host part under the group's cluster prefix
// length is the suffix, looked up in `lb_suffixes`, exact port then any
// port), not a packet-tracer probe and without a checksum
// left partial by a local sender, to a backend whose outer addresses are
// both IPv4 or both IPv6 (GRE over either, whatever the inner family). For
// it this program does what lb's worker does (crates/lb/src/worker.rs): the
// same flow hash (`flow.h`), a connection table with the same rules (a SYN
// re-chooses unless its backend accepts, a FIN or RST lingers, idle
// timeouts per protocol), the VIP's Maglev table (maglev's flow_slot) and
// the same GRE encapsulation (packet::gre: the inner packet untouched, its
// TTL or hop limit included; an outer IPv4 header with the inner TOS and
// DF, always DF over IPv6; an outer IPv6 header with the flow hash in its
// flow label), then back out of the interface (one-armed; `lb_out`). lb's
// tests run both on the same frames and compare the bytes (tests/sys_xdp.rs, as
// root), and check without root that this side's constants, map layouts
// and flow hash are the worker's (tests/xdp_abi.rs).
//
// A UDP datagram to a `quic` VIP (IETF QUIC-LB) whose configurations are
// all plaintext is routed first by its destination connection ID, as the
// worker's `quic_pick` (crates/lb/src/quic.rs) routes it: the header read
// as RFC 8999's invariants (packet::quic), the codepoint's configuration
// (`lb_conf`'s quic_*), the server ID looked up among the VIP's
// (`lb_quic_ids`), its backend if healthy; else counted by reason, and the
// connection table and Maglev decide. A VIP with an encrypted
// configuration (single-pass AES, four-pass: AES is not for this program)
// is not in these maps at all; user space routes it.
//
// A frame of the common case that no honest sender could have sent (a
// martian source, a VIP's address as its source, a TTL or hop limit of 0)
// is dropped here and counted by reason, as the worker drops it.
//
// Left to user space, where the worker reads more than a fixed header:
// IPv6 extension headers (a chain of up to 8 of them, each of its own
// length: a loop the verifier would have to bound, for packets the common
// case does not carry) and with them IPv6 fragments; IPv4 options and
// fragments; VLAN tags; ICMP; a fleet's fragment redirects.
//
// Everything the tables say lives in maps the daemon writes (lb's
// `xdp::maps`): the VIPs, the backends and the Maglev tables (these two
// memory-mapped, so a reload writes only what changed at memory speed),
// the configuration. Their keys and values and the constants both sides
// use are defined once, in Rust (crates/lb/src/xdp/abi.rs), and written
// out by the build script as `lb_abi.h`. The connection tables are this
// program's own (LRU hashes: a full table forgets its least recently used
// flows, which Maglev then sends to the same backend unless the tables
// changed), one per family: an IPv4 flow's key stays 16 bytes, which the
// kernel hashes in less than half the time of the 40 bytes an IPv6 key
// needs, so IPv4 costs what it did; and each family has the table's full
// size, as the worker's one table holds both.
#include "steer.h"
#include <linux/in.h>
#include <linux/tcp.h>
#include <linux/udp.h>
#include "lb_abi.h"
#include "flow.h"

#define TCP_FIN_ 0x01
#define TCP_SYN_ 0x02
#define TCP_RST_ 0x04
#define TCP_ACK_ 0x10

struct lb_ct_key {
	__u32 src;
	__u32 dst;
	__u16 sport;
	__u16 dport;
	__u32 proto;
};

struct lb_ct6_key {
	__u32 src[4];
	__u32 dst[4];
	__u16 sport;
	__u16 dport;
	__u32 proto;
};

struct lb_ct {
	__u32 backend;
	__u32 vip;
	__u32 expires; // ms, modulo 2^32
	__u32 open;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct lb_conf);
} lb_conf SEC(".maps");

// Sizes below are the loader's defaults; the daemon sets them at load.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LB_DEFAULT_VIPS);
	__type(key, struct lb_vip_key);
	__type(value, struct lb_vip);
} lb_vips SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LB_DEFAULT_VIPS);
	__type(key, struct lb_vip6_key);
	__type(value, struct lb_vip);
} lb_vips6 SEC(".maps");

// Addresses in key form (IPv4-mapped for IPv4), as VipMatcher matches
// them, so one trie holds both families' prefixes.
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, LB_DEFAULT_VIPS);
	__type(key, struct lb_prefix_key);
	__type(value, struct lb_prefix_group);
} lb_prefixes SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LB_DEFAULT_VIPS);
	__type(key, struct lb_suffix_key);
	__type(value, struct lb_vip);
} lb_suffixes SEC(".maps");

// The server IDs of the plaintext `quic` VIPs: key VIP index, length and
// octets, value the backend id.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LB_DEFAULT_VIPS);
	__type(key, struct lb_quic_key);
	__type(value, __u32);
} lb_quic_ids SEC(".maps");

// The addresses of the VIPs configured by address (key form): a frame for
// a VIP from one of them is dropped (`refused`).
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LB_DEFAULT_VIPS);
	__type(key, struct lb_addr_key);
	__type(value, __u32);
} lb_vip_addrs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct lb_backend);
} lb_backends SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct lb_pair);
} lb_ring SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct lb_traffic);
} lb_traffic SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(map_flags, BPF_F_NO_COMMON_LRU);
	__uint(max_entries, LB_DEFAULT_CONNS);
	__type(key, struct lb_ct_key);
	__type(value, struct lb_ct);
} lb_conns SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(map_flags, BPF_F_NO_COMMON_LRU);
	__uint(max_entries, LB_DEFAULT_CONNS);
	__type(key, struct lb_ct6_key);
	__type(value, struct lb_ct);
} lb_conns6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct lb_stats);
} lb_stats SEC(".maps");

// Entry 0: the interface the program runs on. Frames leave by a redirect
// to it rather than XDP_TX: the same wire on a NIC, and on a veth the one
// way that reaches a peer without an XDP program of its own (in NAPI mode:
// GRO on). Without the entry (a test run), XDP_TX.
struct {
	__uint(type, BPF_MAP_TYPE_DEVMAP);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} lb_out SEC(".maps");

static __always_inline __u16 fold(__u32 sum)
{
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return sum;
}

static __always_inline int alive(__u32 expires, __u32 now)
{
	return (__s32)(expires - now) > 0;
}

static __always_inline void close_flow(struct lb_ct *e, __u32 now, __u32 linger,
				       struct lb_stats *st)
{
	__u32 end = now + linger;

	if (e->open && alive(e->expires, now)) {
		e->open = 0;
		if (alive(e->expires, end))
			e->expires = end;
		st->ct_closes++;
	}
}

// The backend lb's worker would choose (`Worker::select`), remembered the
// same way in `conns` (the connection table of the flow's family, keyed by
// `k`); LB_EMPTY when the VIP has no backend to take the flow.
static __always_inline __u32 select_backend(struct lb_conf *conf, void *conns, void *k, __u8 proto,
					    struct lb_vip *vip, __u64 hash, __u8 flags,
					    struct lb_stats *st)
{
	// The tick's clock (CLOCK_MONOTONIC_COARSE): timeouts are seconds and
	// lingers 5 s, so a few milliseconds of slack are nothing, and reading
	// the clock source per frame cost 7% of the core on a VM (read_tsc).
	__u32 now = bpf_ktime_get_coarse_ns() / 1000000;
	__u32 timeout = proto == IPPROTO_TCP ? conf->tcp_timeout_ms : conf->udp_timeout_ms;
	int syn = (flags & (TCP_SYN_ | TCP_ACK_)) == TCP_SYN_;
	int ends = flags & (TCP_FIN_ | TCP_RST_);
	struct lb_ct *e = bpf_map_lookup_elem(conns, k);
	struct lb_ct fresh = {};
	struct lb_pair *pair;
	__u32 at, backend;

	if (e && alive(e->expires, now)) {
		st->ct_hits++;
		if (e->open)
			e->expires = now + timeout;
		backend = e->backend;
		struct lb_backend *b = bpf_map_lookup_elem(&lb_backends, &backend);
		int ok = b && (b->flags & (syn ? LB_ACCEPTING : LB_HEALTHY));
		if (e->vip == vip->index && ok) {
			if (syn) {
				e->open = 1;
				e->expires = now + timeout;
			}
			if (ends)
				close_flow(e, now, conf->linger_ms, st);
			return backend;
		}
	} else {
		st->ct_misses++;
	}
	if (vip->m == 0)
		return LB_EMPTY;
	at = vip->table + flow_slot(hash, vip->m);
	__u32 elem = at >> 1;
	pair = bpf_map_lookup_elem(&lb_ring, &elem);
	if (!pair)
		return LB_EMPTY;
	backend = pair->b[at & 1];
	if (backend == LB_EMPTY)
		return LB_EMPTY;
	fresh.backend = backend;
	fresh.vip = vip->index;
	fresh.expires = now + timeout;
	fresh.open = 1;
	if (ends)
		close_flow(&fresh, now, conf->linger_ms, st);
	if (bpf_map_update_elem(conns, k, &fresh, BPF_ANY) == 0)
		st->ct_inserts++;
	return backend;
}

// The prefix-group VIP of a destination (`addr`: key form, as loaded) that
// no VIP matched exactly, as VipMatcher::lookup goes on: NULL if none.
static __always_inline struct lb_vip *prefix_vip(struct lb_conf *conf, __u32 *addr, __u16 port,
						 __u8 proto)
{
	struct lb_prefix_key pk = { .prefixlen = 128 };
	struct lb_suffix_key sk = {};
	struct lb_prefix_group *g;
	struct lb_vip *vip;
	int i;

	if (!conf->groups)
		return 0;
#pragma unroll
	for (i = 0; i < 4; i++)
		pk.addr[i] = addr[i];
	g = bpf_map_lookup_elem(&lb_prefixes, &pk);
	if (!g)
		return 0;
	sk.group = g->group;
#pragma unroll
	for (i = 0; i < 4; i++)
		sk.suffix[i] = addr[i] & g->host[i];
	sk.port = port;
	sk.proto = proto;
	vip = bpf_map_lookup_elem(&lb_suffixes, &sk);
	if (!vip) {
		sk.port = LB_ANY_PORT;
		vip = bpf_map_lookup_elem(&lb_suffixes, &sk);
	}
	return vip;
}

static __always_inline void count(struct lb_conf *conf, __u32 index, __u64 bytes)
{
	__u32 key = bpf_get_smp_processor_id() * conf->stride + index;
	struct lb_traffic *t = bpf_map_lookup_elem(&lb_traffic, &key);

	if (t) {
		t->packets++;
		t->bytes += bytes;
	}
}

// The worker's QUIC counters for an outcome of `quic_pick` (nothing for
// LB_QUIC_NONE): called only where this program decides the frame's fate,
// so that one left to user space is counted there, once.
static __always_inline void quic_count(struct lb_stats *st, __u32 q)
{
	if (q == LB_QUIC_ROUTED)
		st->quic_routed++;
	else if (q == LB_QUIC_SERVER_DOWN)
		st->quic_server_down++;
	else if (q < LB_QUIC_MISSES)
		st->quic_miss[q]++;
}

// The backend the destination connection ID of a UDP payload (`p`, `plen`
// octets, the IP packet's rest, as the worker takes it) names for `vip`,
// as lb::quic::QuicRoute::backend and quic_lb's route_long and
// route_short read it, in their order: LB_QUIC_ROUTED (the backend in
// `*out`), LB_QUIC_SERVER_DOWN, or the miss reason (LB_QUIC_NOT_QUIC and
// on). Bounded: no loop but the server ID's copy (LB_QUIC_MAX_SID octets).
static __always_inline __u32 quic_pick(struct lb_conf *conf, struct lb_vip *vip, __u8 *p,
				       __u32 plen, void *end, __u32 *out)
{
	struct lb_quic_key k = {};
	struct lb_backend *b;
	__u8 *cid, *scid_len;
	__u32 cid_len, cp, sid_len, i, *id;
	int is_long;

	if (plen == 0 || (void *)(p + 1) > end)
		return LB_QUIC_NOT_QUIC;
	is_long = p[0] & 0x80;
	if (is_long) {
		// First octet, version (4), DCID length, the DCID, the SCID
		// length, the SCID: all within the payload (packet::quic::parse).
		__u32 version, dcid_len;

		if (plen < 6 || (void *)(p + 6) > end)
			return LB_QUIC_NOT_QUIC;
		version = ((__u32)p[1] << 24) | ((__u32)p[2] << 16) | ((__u32)p[3] << 8) | p[4];
		dcid_len = p[5];
		if (plen < 7 + dcid_len)
			return LB_QUIC_NOT_QUIC;
		scid_len = p + 6 + (dcid_len & 0xff);
		if ((void *)(scid_len + 1) > end)
			return LB_QUIC_NOT_QUIC;
		if (plen < 7 + dcid_len + *scid_len)
			return LB_QUIC_NOT_QUIC;
		// Versions 1 and 2 (RFC 9000 section 17.2, RFC 9369): at most
		// 20 octets each; the invariants allow other versions 255.
		if ((version == 0x00000001 || version == 0x6b3343cf) &&
		    (dcid_len > 20 || *scid_len > 20))
			return LB_QUIC_NOT_QUIC;
		cid = p + 6;
		cid_len = dcid_len;
	} else {
		// A short header: the DCID is what follows the first octet, of
		// the length its configuration gives.
		cid = p + 1;
		cid_len = plen - 1;
	}
	if (cid_len == 0 || (void *)(cid + 1) > end)
		return LB_QUIC_NOT_QUIC;
	cp = cid[0] >> 5;
	if (cp == 7)
		return LB_QUIC_RESERVED;
	sid_len = conf->quic_sid[cp & 7];
	if (sid_len == 0)
		return LB_QUIC_NO_CONFIG;
	// The draft's optional check, for a long header, whose length is on
	// the wire: the self-described length of what follows the first octet.
	if (is_long && conf->quic_self[cp & 7] && (cid[0] & 0x1f) != cid_len - 1)
		return LB_QUIC_LENGTH_MISMATCH;
	if (cid_len < conf->quic_need[cp & 7])
		return LB_QUIC_TOO_SHORT;
	k.vip = vip->index;
	k.len = sid_len;
#pragma unroll
	for (i = 0; i < LB_QUIC_MAX_SID; i++) {
		if (i >= sid_len)
			break;
		// Within the payload (its length was checked against the
		// configuration's); the check is for the verifier.
		if ((void *)(cid + 2 + i) > end)
			return LB_QUIC_NOT_QUIC;
		k.id[i] = cid[1 + i];
	}
	id = bpf_map_lookup_elem(&lb_quic_ids, &k);
	if (!id)
		return LB_QUIC_UNKNOWN_SERVER_ID;
	b = bpf_map_lookup_elem(&lb_backends, id);
	if (!b || !(b->flags & LB_HEALTHY))
		return LB_QUIC_SERVER_DOWN;
	*out = *id;
	return LB_QUIC_ROUTED;
}

static __always_inline int to_socket(struct xdp_md *ctx, struct lb_stats *st)
{
	st->to_socket++;
	return steer(ctx);
}

// Sends the frame to `backend` in GRE, as packet::gre::encapsulate_keyed
// writes it: the inner packet is the `inner_len` bytes after the Ethernet
// header (Ethernet padding goes), `tos` its TOS or traffic class, `df`
// its DF bit (always set for IPv6), `inner6` whether it is IPv6, `quic`
// the outcome of its connection ID's routing (counted once forwarded).
static __always_inline int forward(struct xdp_md *ctx, struct lb_conf *conf, struct lb_stats *st,
				   __u32 vip, __u32 backend, __u64 hash, __u32 frame_len,
				   __u32 inner_len, __u8 tos, int df, int inner6, __u32 quic)
{
	struct lb_backend *b = bpf_map_lookup_elem(&lb_backends, &backend);
	void *data, *end;
	struct ethhdr *eth;
	__u16 *gre, *w;
	__u32 sum = 0;
	int i, keyed, gre_len, out6;

	if (!b || !(b->flags & (LB_V4 | LB_V6)))
		return to_socket(ctx, st);
	out6 = !(b->flags & LB_V4);
	keyed = conf->keyed != 0;
	gre_len = keyed ? 8 : 4;
	// The outer packet's length field (IPv4: all of it; IPv6: its
	// payload) holds 16 bits; the worker drops what would not fit.
	if ((out6 ? 0 : sizeof(struct iphdr)) + gre_len + inner_len > 0xffff)
		return to_socket(ctx, st);

	count(conf, vip, frame_len);
	count(conf, conf->vip_cap + backend, frame_len);
	if (frame_len > sizeof(*eth) + inner_len) {
		if (bpf_xdp_adjust_tail(ctx, (int)(sizeof(*eth) + inner_len) - (int)frame_len))
			return to_socket(ctx, st);
	}
	if (out6) {
		if (bpf_xdp_adjust_head(ctx, -(int)(sizeof(struct ipv6hdr) + gre_len)))
			return to_socket(ctx, st);
		data = (void *)(long)ctx->data;
		end = (void *)(long)ctx->data_end;
		eth = data;
		struct ipv6hdr *ip6 = (void *)(eth + 1);
		gre = (void *)(ip6 + 1);
		if ((void *)gre + 8 > end)
			return XDP_ABORTED;
		eth->h_proto = bpf_htons(ETH_P_IPV6);
		// Version, traffic class, flow label: the flow hash's low 20
		// bits, for ECMP on the way.
		*(__u32 *)ip6 = bpf_htonl((6u << 28) | ((__u32)tos << 20) | ((__u32)hash & 0xfffff));
		ip6->payload_len = bpf_htons(gre_len + inner_len);
		ip6->nexthdr = IPPROTO_GRE_;
		ip6->hop_limit = b->ttl;
		if (conf->spread_v6) {
			// packet::gre::SourcePrefix::pick: the prefix's host bits
			// (64 at most) from the hash.
			ip6->saddr.in6_u.u6_addr32[0] = bpf_htonl(conf->spread6_net[0]);
			ip6->saddr.in6_u.u6_addr32[1] = bpf_htonl(conf->spread6_net[1]);
			ip6->saddr.in6_u.u6_addr32[2] = bpf_htonl(
				conf->spread6_net[2] | ((__u32)(hash >> 32) & conf->spread6_host[0]));
			ip6->saddr.in6_u.u6_addr32[3] =
				bpf_htonl(conf->spread6_net[3] | ((__u32)hash & conf->spread6_host[1]));
		} else {
#pragma unroll
			for (i = 0; i < 4; i++)
				ip6->saddr.in6_u.u6_addr32[i] = b->src6[i];
		}
#pragma unroll
		for (i = 0; i < 4; i++)
			ip6->daddr.in6_u.u6_addr32[i] = b->dst6[i];
	} else {
		if (bpf_xdp_adjust_head(ctx, -(int)(sizeof(struct iphdr) + gre_len)))
			return to_socket(ctx, st);
		data = (void *)(long)ctx->data;
		end = (void *)(long)ctx->data_end;
		eth = data;
		struct iphdr *ip = (void *)(eth + 1);
		gre = (void *)(ip + 1);
		if ((void *)gre + 8 > end)
			return XDP_ABORTED;
		eth->h_proto = bpf_htons(ETH_P_IP);
		ip->version = 4;
		ip->ihl = 5;
		ip->tos = tos;
		ip->tot_len = bpf_htons(sizeof(struct iphdr) + gre_len + inner_len);
		ip->id = 0;
		ip->frag_off = df ? bpf_htons(0x4000) : 0;
		ip->ttl = b->ttl;
		ip->protocol = IPPROTO_GRE_;
		ip->check = 0;
		ip->daddr = b->dst;
		ip->saddr = conf->spread_v4
				    ? bpf_htonl(conf->spread_net | ((__u32)hash & conf->spread_host))
				    : b->src;
		w = (__u16 *)ip;
#pragma unroll
		for (i = 0; i < 10; i++)
			sum += w[i];
		ip->check = ~fold(sum);
	}
	__builtin_memcpy(eth->h_dest, b->dmac, ETH_ALEN);
	__builtin_memcpy(eth->h_source, b->smac, ETH_ALEN);
	gre[0] = keyed ? bpf_htons(GRE_FLAG_KEY) : 0;
	gre[1] = inner6 ? bpf_htons(ETH_P_IPV6) : bpf_htons(ETH_P_IP);
	if (keyed) {
		__u32 key = (__u32)hash;
		if (key == FRAGMENT_REDIRECT_KEY)
			key ^= 1;
		*(__u32 *)(gre + 2) = bpf_htonl(key);
	}
	quic_count(st, quic);
	st->forwarded++;
	if (inner6)
		st->forwarded6++;
	return bpf_redirect_map(&lb_out, 0, XDP_TX);
}

// The TCP or UDP header of a packet, as the worker reads it.
struct lb_l4 {
	__u16 sport;
	__u16 dport;
	__u16 *field; // its checksum
	void *payload;
	__u8 flags; // TCP's; 0 for UDP
};

// Reads the TCP or UDP header at `l4`, `l4len` bytes of transport (the IP
// header's word for it) ending at or before `end`, into `t`, with the
// worker's checks (the whole header in the frame, a UDP length or TCP
// data offset within `l4len`): 0, or -1 for anything else.
static __always_inline int transport(void *l4, void *end, __u8 proto, __u32 l4len,
				     struct lb_l4 *t)
{
	if (proto == IPPROTO_UDP) {
		struct udphdr *udp = l4;
		if ((void *)(udp + 1) > end)
			return -1;
		__u16 ulen = bpf_ntohs(udp->len);
		if (ulen < sizeof(*udp) || ulen > l4len)
			return -1;
		t->sport = bpf_ntohs(udp->source);
		t->dport = bpf_ntohs(udp->dest);
		t->flags = 0;
		t->field = &udp->check;
		t->payload = udp + 1;
		return 0;
	}
	if (proto == IPPROTO_TCP) {
		struct tcphdr *tcp = l4;
		if ((void *)(tcp + 1) > end)
			return -1;
		__u32 doff = tcp->doff * 4;
		if (doff < sizeof(*tcp) || doff > l4len)
			return -1;
		t->sport = bpf_ntohs(tcp->source);
		t->dport = bpf_ntohs(tcp->dest);
		t->flags = ((__u8 *)tcp)[13];
		t->field = &tcp->check;
		t->payload = (void *)tcp + (doff & 0x3c);
		return 0;
	}
	return -1;
}

// Whether the first octet `a` of an IPv4 source makes it martian (RFC 1122
// section 3.2.1.3, RFC 6890): 0.0.0.0/8, 127.0.0.0/8, 224.0.0.0/4 and
// 240.0.0.0/4 (255.255.255.255 among them); packet::flow::martian_source.
static __always_inline int martian4(__u8 a)
{
	return a == 0 || a == 127 || a >= 224;
}

// A frame for a VIP that no honest sender could have sent, dropped here
// and counted as the worker drops and counts it (worker.rs's
// `refuse_source`, in the same order): `martian` (the source's family's
// rules), a source that is this frame's destination (`same`) or a VIP's
// address (`src`, key form, in `lb_vip_addrs`), a TTL or hop limit of 0.
// 0 to go on.
static __always_inline int refused(struct lb_stats *st, int martian, int same, __u32 *src,
				   __u8 ttl)
{
	struct lb_addr_key k = {};
	int i;

	if (martian) {
		st->martian_source++;
		return 1;
	}
#pragma unroll
	for (i = 0; i < 4; i++)
		k.addr[i] = src[i];
	if (same || bpf_map_lookup_elem(&lb_vip_addrs, &k)) {
		st->source_is_vip++;
		return 1;
	}
	if (ttl == 0) {
		st->ttl_zero++;
		return 1;
	}
	return 0;
}

// IPv4 (the Ethernet header is whole and says IPv4).
static __always_inline int lb_v4(struct xdp_md *ctx, struct lb_conf *conf, struct lb_stats *st)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = (void *)(eth + 1);
	__u32 sum = 0, l4len, backend, frame_len, quic = LB_QUIC_NONE, qb = LB_EMPTY;
	struct lb_vip_key vk = {};
	struct lb_ct_key ck = {};
	struct lb_vip *vip;
	__u16 tot_len, *w;
	struct lb_l4 t;
	__u64 hash;
	int i;

	if ((void *)(ip + 1) > end)
		return steer(ctx);
	if (ip->version != 4 || ip->ihl != 5 || (ip->frag_off & bpf_htons(0x3fff)))
		return steer(ctx);
	tot_len = bpf_ntohs(ip->tot_len);
	frame_len = end - data;
	if (tot_len < sizeof(*ip) + sizeof(struct udphdr) || sizeof(*eth) + tot_len > frame_len)
		return steer(ctx);
	w = (__u16 *)ip;
#pragma unroll
	for (i = 0; i < 10; i++)
		sum += w[i];
	if (fold(sum) != 0xffff)
		return steer(ctx);
	l4len = tot_len - sizeof(*ip);
	if (transport(ip + 1, end, ip->protocol, l4len, &t))
		return steer(ctx);
	vk.addr = ip->daddr;
	vk.port = t.dport;
	vk.proto = ip->protocol;
	vip = bpf_map_lookup_elem(&lb_vips, &vk);
	if (!vip) {
		vk.port = LB_ANY_PORT;
		vip = bpf_map_lookup_elem(&lb_vips, &vk);
	}
	if (!vip) {
		__u32 mapped[4] = { 0, 0, bpf_htonl(0xffff), ip->daddr };

		vip = prefix_vip(conf, mapped, t.dport, ip->protocol);
		if (!vip)
			return steer(ctx);
	}
	// Read before the source is judged, as the worker reads it.
	if (vip->quic == LB_QUIC_PLAINTEXT && ip->protocol == IPPROTO_UDP)
		quic = quic_pick(conf, vip, t.payload, l4len - sizeof(struct udphdr), end, &qb);
	{
		__u32 src[4] = { 0, 0, bpf_htonl(0xffff), ip->saddr };

		if (refused(st, martian4(((__u8 *)&ip->saddr)[0]), ip->saddr == ip->daddr, src,
			    ip->ttl)) {
			quic_count(st, quic);
			return XDP_DROP;
		}
	}
	// A packet-tracer probe (its payload begins with the magic), within
	// the packet: reported by user space.
	if (t.payload + 8 <= end && t.payload + 8 <= (void *)ip + tot_len &&
	    *(__u64 *)t.payload == LB_TRACE_MAGIC)
		return to_socket(ctx, st);
	// A checksum a local sender left for offload: the field holds the
	// pseudo-header sum (as packet::checksum::complete_partial tests).
	sum = (ip->saddr & 0xffff) + (ip->saddr >> 16) + (ip->daddr & 0xffff) +
	      (ip->daddr >> 16) + bpf_htons(ip->protocol) + bpf_htons(l4len);
	if (*t.field == fold(sum))
		return to_socket(ctx, st);

	ck.src = ip->saddr;
	ck.dst = ip->daddr;
	ck.sport = t.sport;
	ck.dport = t.dport;
	ck.proto = ip->protocol;
	hash = flow_hash4(ip->saddr, ip->daddr, t.sport, t.dport, ip->protocol);
	// Routed by connection ID: the connection table is not consulted.
	if (quic == LB_QUIC_ROUTED)
		backend = qb;
	else
		backend = select_backend(conf, &lb_conns, &ck, ip->protocol, vip, hash, t.flags, st);
	if (backend == LB_EMPTY)
		return to_socket(ctx, st);
	return forward(ctx, conf, st, vip->index, backend, hash, frame_len, tot_len, ip->tos,
		       !!(ip->frag_off & bpf_htons(0x4000)), 0, quic);
}

// IPv6 (the Ethernet header is whole and says IPv6). Its header has no
// checksum; the worker (packet::parse) checks the version and that the
// payload length fits the frame, then walks extension headers, which the
// common case has none of: next header TCP or UDP is the transport itself.
static __always_inline int lb_v6(struct xdp_md *ctx, struct lb_conf *conf, struct lb_stats *st)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct ipv6hdr *ip6 = (void *)(eth + 1);
	__u32 sum = 0, l4len, backend, frame_len, quic = LB_QUIC_NONE, qb = LB_EMPTY;
	struct lb_vip6_key vk = {};
	struct lb_ct6_key ck = {};
	struct lb_vip *vip;
	__u16 *w;
	__u8 proto, tos;
	struct lb_l4 t;
	__u64 hash;
	int i;

	if ((void *)(ip6 + 1) > end)
		return steer(ctx);
	if (ip6->version != 6)
		return steer(ctx);
	l4len = bpf_ntohs(ip6->payload_len);
	frame_len = end - data;
	if (sizeof(*eth) + sizeof(*ip6) + l4len > frame_len)
		return steer(ctx);
	proto = ip6->nexthdr;
	if (transport(ip6 + 1, end, proto, l4len, &t))
		return steer(ctx);
#pragma unroll
	for (i = 0; i < 4; i++)
		vk.addr[i] = ip6->daddr.in6_u.u6_addr32[i];
	vk.port = t.dport;
	vk.proto = proto;
	vip = bpf_map_lookup_elem(&lb_vips6, &vk);
	if (!vip) {
		vk.port = LB_ANY_PORT;
		vip = bpf_map_lookup_elem(&lb_vips6, &vk);
	}
	if (!vip) {
		// An IPv4-mapped destination is an IPv4 VIP's address to the
		// worker, which only `lb_vips` holds: user space decides.
		if (!vk.addr[0] && !vk.addr[1] && vk.addr[2] == bpf_htonl(0xffff))
			return steer(ctx);
		vip = prefix_vip(conf, vk.addr, t.dport, proto);
		if (!vip)
			return steer(ctx);
	}
	if (vip->quic == LB_QUIC_PLAINTEXT && proto == IPPROTO_UDP)
		quic = quic_pick(conf, vip, t.payload, l4len - sizeof(struct udphdr), end, &qb);
	{
		__u32 *src = ip6->saddr.in6_u.u6_addr32;
		int martian, same = 1;

		if (!src[0] && !src[1] && src[2] == bpf_htonl(0xffff))
			// IPv4-mapped: the IPv4 rules (RFC 4291 section 2.5.5.2).
			martian = martian4(((__u8 *)src)[12]);
		else
			// ::, ::1 (RFC 4291 sections 2.5.2, 2.5.3), ff00::/8 (2.7).
			martian = (!src[0] && !src[1] && !src[2] &&
				   (!src[3] || src[3] == bpf_htonl(1))) ||
				  ((__u8 *)src)[0] == 0xff;
#pragma unroll
		for (i = 0; i < 4; i++)
			same &= src[i] == vk.addr[i];
		if (refused(st, martian, same, src, ip6->hop_limit)) {
			quic_count(st, quic);
			return XDP_DROP;
		}
	}
	if (t.payload + 8 <= end && t.payload + 8 <= (void *)(ip6 + 1) + l4len &&
	    *(__u64 *)t.payload == LB_TRACE_MAGIC)
		return to_socket(ctx, st);
	// The pseudo-header sum (RFC 8200 section 8.1), folded, in the
	// checksum field: left partial by a local sender.
	w = (__u16 *)&ip6->saddr;
#pragma unroll
	for (i = 0; i < 16; i++)
		sum += w[i];
	sum += bpf_htons(proto) + bpf_htons(l4len);
	if (*t.field == fold(sum))
		return to_socket(ctx, st);

#pragma unroll
	for (i = 0; i < 4; i++) {
		ck.src[i] = ip6->saddr.in6_u.u6_addr32[i];
		ck.dst[i] = ip6->daddr.in6_u.u6_addr32[i];
	}
	ck.sport = t.sport;
	ck.dport = t.dport;
	ck.proto = proto;
	hash = flow_hash6(&ip6->saddr, &ip6->daddr, t.sport, t.dport, proto);
	if (quic == LB_QUIC_ROUTED)
		backend = qb;
	else
		backend = select_backend(conf, &lb_conns6, &ck, proto, vip, hash, t.flags, st);
	if (backend == LB_EMPTY)
		return to_socket(ctx, st);
	tos = (((__u8 *)ip6)[0] << 4) | (((__u8 *)ip6)[1] >> 4);
	return forward(ctx, conf, st, vip->index, backend, hash, frame_len,
		       sizeof(*ip6) + l4len, tos, 1, 1, quic);
}

SEC("xdp")
int fastpath_lb(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct lb_conf *conf;
	struct lb_stats *st;
	__u32 zero = 0;

	conf = bpf_map_lookup_elem(&lb_conf, &zero);
	st = bpf_map_lookup_elem(&lb_stats, &zero);
	if (!conf || !st || !conf->enabled || (void *)(eth + 1) > end)
		return steer(ctx);
	if (eth->h_proto == bpf_htons(ETH_P_IP))
		return lb_v4(ctx, conf, st);
	if (eth->h_proto == bpf_htons(ETH_P_IPV6))
		return lb_v6(ctx, conf, st);
	return steer(ctx);
}

char _license[] SEC("license") = "GPL";
