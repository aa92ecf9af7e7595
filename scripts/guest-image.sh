#!/usr/bin/env bash
# Builds, offline from Debian's packages, the small guest that fastpath's
# virtual-machine tests boot under QEMU: Debian's kernel (vmlinuz) and an
# initramfs of busybox-static with the virtio-net, e1000 and pktgen modules
# from the same kernel package, and iperf3 and ethtool from their Debian
# packages with the shared libraries they load (and the dynamic loader),
# so guests run TCP between them and show their NIC's offloads. The guest's /init loads the drivers, gives
# eth0 the address on the kernel command line (fp.ip=ADDR/LEN), prints
# FASTPATH-GUEST-READY and its MAC on the serial console, and runs a shell
# there: the host drives it by writing commands to the console, one per
# line, read and run without a prompt or echo.
#
# Usage: scripts/guest-image.sh [DIR]   (default /var/cache/fastpath/guest)
# Idempotent and silent when DIR already holds an image of this recipe.
set -euo pipefail
DIR=${1:-/var/cache/fastpath/guest}
RECIPE=6   # bump when the initramfs's contents change
[ -f "$DIR/recipe" ] && [ "$(cat "$DIR/recipe")" = "$RECIPE" ] && [ -f "$DIR/vmlinuz" ] && [ -f "$DIR/initrd.gz" ] && exit 0
for p in busybox-static cpio; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || {
    echo "guest-image: $p is missing (scripts/setup.sh installs it)" >&2; exit 1; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
# The kernel the linux-image-amd64 metapackage points at, unpacked, not installed.
kpkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
[ -n "$kpkg" ] || { echo "guest-image: no linux-image-amd64 in apt's lists (apt-get update)" >&2; exit 1; }
apt-get download -q "$kpkg" >/dev/null 2>&1 || { echo "guest-image: apt-get download $kpkg failed" >&2; exit 1; }
dpkg-deb -x "$kpkg"_*.deb kroot
kver=$(ls kroot/lib/modules)
mods=kroot/lib/modules/$kver/kernel
# Load order: each module after the ones it depends on (modinfo's depends=).
order="virtio_ring virtio virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci failover net_failover virtio_net e1000 pktgen"
mkdir -p root/{bin,proc,sys,dev,tmp,lib/modules,lib64,lib/x86_64-linux-gnu}
cp /bin/busybox root/bin/busybox
# iperf3 (TCP between guests) and ethtool (the NIC's offloads: ethtool -k),
# unpacked from Debian's packages with their libraries, C library included,
# so the guest's userland does not depend on what this host has installed.
upkgs="iperf3 libiperf0 libsctp1 libssl3 libc6 ethtool libmnl0"
apt-get download -q $upkgs >/dev/null 2>&1 || { echo "guest-image: apt-get download $upkgs failed" >&2; exit 1; }
for d in *.deb; do case $d in linux-image-*) ;; *) dpkg-deb -x "$d" uroot;; esac; done
ulib=uroot/usr/lib/x86_64-linux-gnu:uroot/lib/x86_64-linux-gnu
for b in usr/bin/iperf3 sbin/ethtool; do
  [ -x "uroot/$b" ] || { echo "guest-image: $b not in $upkgs" >&2; exit 1; }
  cp "uroot/$b" root/bin/
  # Every library the loader resolves must come from the unpacked
  # packages: one found elsewhere (the host's) would be a different build.
  libs=$(LD_LIBRARY_PATH=$ulib ldd "uroot/$b" | awk '/=>/{print $3}')
  for l in $libs; do
    case $l in uroot/*) cp -L "$l" root/lib/x86_64-linux-gnu/;;
      *) echo "guest-image: $b needs $l, not from $upkgs" >&2; exit 1;; esac
  done
done
cp -L uroot/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 root/lib/x86_64-linux-gnu/
ln -s ../lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 root/lib64/ld-linux-x86-64.so.2
for m in $order; do
  f=$(find "$mods" -name "$m.ko" -o -name "$m.ko.xz" | head -1)
  [ -n "$f" ] || { echo "guest-image: module $m not in $kpkg" >&2; exit 1; }
  case $f in *.xz) xz -dc "$f" > "root/lib/modules/$m.ko";; *) cp "$f" root/lib/modules/;; esac
done
cat > root/init <<INIT
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
for m in $order; do insmod /lib/modules/\$m.ko 2>/dev/null; done
ip link set lo up
for a in \$(cat /proc/cmdline); do case \$a in fp.ip=*) IP=\${a#fp.ip=};; esac; done
if [ -e /sys/class/net/eth0 ]; then
  ip link set eth0 up
  [ -n "\$IP" ] && ip addr add "\$IP" dev eth0
fi
# Commands from the host, one per line, without a prompt, echo or line
# editing: echo goes off before READY, since the host starts writing
# commands when it sees READY and an echoed command could run into the
# output (and the end marker) of the one before.
stty -echo 2>/dev/null
echo "FASTPATH-GUEST-READY \$(cat /sys/class/net/eth0/address 2>/dev/null || echo none)"
while read -r cmd; do eval "\$cmd"; done
poweroff -f
INIT
chmod 755 root/init
(cd root && find . | cpio -o -H newc 2>/dev/null | gzip -1) > initrd.gz
mkdir -p "$DIR"
cp "kroot/boot/vmlinuz-$kver" "$DIR/vmlinuz.new" && mv "$DIR/vmlinuz.new" "$DIR/vmlinuz"
cp initrd.gz "$DIR/initrd.gz.new" && mv "$DIR/initrd.gz.new" "$DIR/initrd.gz"
echo "$kver" > "$DIR/kernel"
echo "$RECIPE" > "$DIR/recipe"
echo "guest-image: $DIR/vmlinuz ($kver) and initrd.gz ($(du -k "$DIR/initrd.gz" | cut -f1) KiB)"
