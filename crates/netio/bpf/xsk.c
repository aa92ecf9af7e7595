// fastpath's AF_XDP steering program (`steer.h` says what goes where).
#include "steer.h"

SEC("xdp")
int fastpath_xsk(struct xdp_md *ctx)
{
	return steer(ctx);
}

char _license[] SEC("license") = "GPL";
