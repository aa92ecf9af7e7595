#!/usr/bin/env bash
# Idempotent set-up for building and testing fastpath on Debian as root.
# Prints nothing when everything is already present.
set -euo pipefail

# Debian packages the build and the tests need (one per line, with why).
APT_PACKAGES=(
  pkg-config   # crates that probe system libraries
  tshark       # decodes the forwarder's output in the golden pcap tests (a decoder we did not write)
  iproute2     # network namespaces and veth for the interface tests
  ethtool      # the test client's NIC computes its own checksums
  nftables     # the in-kernel peer of lb bench --topology veth (DNAT with jhash)
  curl         # the HTTP client in the namespace tests
  python3      # the HTTP server on the test backends (python3 -m http.server)
  python3-scapy # an independent packet library: captures fastpath did not write (lone fragments)
  bird2        # the BGP daemon the load balancer announces VIPs through (and the test's router)
  nginx-light  # the demo's HTTP backends
  wrk          # the HTTP load generator of the soak (make soak, crates/fastpath/tests/sys_lb_soak.rs)
  clang        # compiles the XDP programs (crates/netio/bpf, crates/lb/bpf, crates/bench/bpf)
  llvm
  libbpf-dev   # its headers
  e2fsprogs          # mkfs.ext4 for the disk tool's test that a mounted device is refused
  gcc                # compiles, in the tests, the MAIO C example against maio.h and lb's XDP header and flow hash
  dpdk-dev           # testpmd, the outside program that attaches to the switch over memif
  librte-net-memif23 # testpmd's memif driver
  prometheus         # a real Prometheus server scrapes the load balancer's /metrics in the tests
  python3-prometheus-client # Python's OpenMetrics parser checks the exposition
  systemd            # systemd-analyze verify of the shipped units; the private systemd that runs them (crates/lab/src/systemd.rs)
  binutils           # readelf/objdump/strip: the package's dependencies and stripped binary (scripts/build-deb.sh)
  util-linux         # unshare, nsenter, setpriv: the private systemd's namespaces
  busybox-static     # the QEMU guests' userland (scripts/guest-image.sh)
  cpio               # packs the guests' initramfs
  etcd-server        # the fleet's configuration store: a three-member cluster in the tests (crates/lab/src/etcd.rs)
  etcd-client        # etcdctl, to look at what the tests and an operator wrote
  protobuf-compiler  # protoc: the etcd-client crate compiles etcd's .proto files at build time
  libprotobuf-dev    # the well-known .proto files (descriptor.proto) those import
  openssl            # makes the CA and certificates of the TLS etcd cluster in the tests
)

need_cmd() { command -v "$1" >/dev/null 2>&1; }

if ! need_cmd cargo; then
  echo "setup: cargo not found; install Rust (https://rustup.rs) and re-run" >&2
  exit 1
fi

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: missing Debian packages: ${missing[*]} (run as root, or install them)" >&2
    exit 1
  fi
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # tshark asks whether non-root users may capture; the answer does not matter here.
  echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections 2>/dev/null || true
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  # Packages may start their own daemons in the host namespace; the tests and
  # the demo run their own copies inside namespaces instead.
  for svc in nginx bird prometheus etcd; do
    if command -v systemctl >/dev/null 2>&1; then systemctl disable --now "$svc" >/dev/null 2>&1 || true; fi
    pkill -x "$svc" 2>/dev/null || true
  done
fi

# Hugepages for the MAIO pool and the forwarder's packet pool (2 MiB each).
HUGEPAGES_WANTED=128
if [ -w /proc/sys/vm/nr_hugepages ]; then
  have=$(cat /proc/sys/vm/nr_hugepages)
  if [ "$have" -lt "$HUGEPAGES_WANTED" ]; then
    echo "$HUGEPAGES_WANTED" > /proc/sys/vm/nr_hugepages 2>/dev/null || true
    got=$(cat /proc/sys/vm/nr_hugepages)
    [ "$got" -ge "$HUGEPAGES_WANTED" ] || echo "setup: only $got of $HUGEPAGES_WANTED hugepages could be reserved; pools fall back to normal pages" >&2
  fi
fi

# QEMU for the virtual-machine tests, demo and benchmark (guests on the
# switch's vhost-user ports): version 10 or later. Debian 12's QEMU 7.2
# crashes as soon as a TCG guest starts a vhost-user NIC, so on bookworm it
# comes from bookworm-backports (which runs on bookworm's libraries).
qemu_major() {
  qemu-system-x86_64 --version 2>/dev/null | sed -n 's/^QEMU emulator version \([0-9]*\).*/\1/p'
}
if [ "$(qemu_major || true)" = "" ] || [ "$(qemu_major)" -lt 10 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: QEMU 10 or later is missing (run as root, or install qemu-system-x86 from bookworm-backports)" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
  if [ "$codename" = bookworm ]; then
    if ! grep -rqs '^deb .*bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
      echo "deb http://deb.debian.org/debian bookworm-backports main" > /etc/apt/sources.list.d/fastpath-bookworm-backports.list
    fi
    echo "setup: installing qemu-system-x86 from bookworm-backports"
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends -t bookworm-backports qemu-system-x86 >/dev/null
  else
    echo "setup: installing qemu-system-x86"
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends qemu-system-x86 >/dev/null
  fi
  if [ "$(qemu_major || true)" = "" ] || [ "$(qemu_major)" -lt 10 ]; then
    echo "setup: qemu-system-x86_64 is still older than 10 ($(qemu-system-x86_64 --version 2>/dev/null | head -1)); the VM tests will skip" >&2
  fi
fi

# The guests' kernel and initramfs, built offline from Debian's packages
# (silent when already built).
if [ "$(id -u)" -eq 0 ]; then
  "$(dirname "$0")/guest-image.sh"
fi
